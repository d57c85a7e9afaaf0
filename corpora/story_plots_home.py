"""Story plots set at home, at school and among friends: a problem, an attempt, a resolution, a moral.

Each plot returns paragraphs of sentence templates over the scene's cast (see `stories.Scene`);
`s.one` picks one wording, `s.say` writes a line of dialogue, and plain strings are filled in when
the story is rendered.
"""

from __future__ import annotations

from routescope.corpora.stories import Paragraphs, Plot, Scene, plot


def broken_toy(s: Scene) -> Paragraphs:
    return [
        s.intro("toy"),
        [s.one("{day}, {h} was playing with {h.his} {toy.word} {place.at}.",
               "{day}, {h} took {h.his} {toy.desc} to the {place.word}."),
         s.one("{h.He} {toy.use.past} it again and again.", "{h.He} had so much fun."),
         s.one("But then {h.he} dropped it, and it broke!", "Suddenly, the {toy.word} fell to the ground and broke."),
         s.one("{h} was very {sad}. {h.He} began to cry.", "{h.He} felt so {sad} that tears ran down {h.his} face.")],
        [s.one("{h.His} {p.kind} heard {h.him} crying.", "{h} ran to {h.his} {p.kind} with the broken {toy.word}."),
         s.say("{p}", s.one("What is wrong, my dear?", "Why are you crying, {h}?")),
         s.say("{h}", "My {toy.word} is broken!", "cried"),
         s.say("{p}", s.one("Don't worry. We can fix it together.", "Let me see. I think we can fix it.")),
         s.one("{p} got some glue, and together they fixed the {toy.word}.",
               "{p} got a hammer and a tiny nail and fixed the {toy.word}.",
               "{p} found some tape and fixed the {toy.word} very carefully.")],
        [s.one("{h} hugged {h.his} {p.kind}.", "{h} smiled a big smile."),
         s.say("{h}", s.one("Thank you! You are the best!", "Thank you for fixing it!")),
         s.one("From then on, {h} was very careful with {h.his} {toy.word}.",
               "{h.He} {toy.use.past} {h.his} {toy.word} again, but this time {h.he} was gentle."),
         s.moral("it is good to be careful with the things you love",
                 "when something breaks, it helps to ask for help")],
    ]


def sharing_toy(s: Scene) -> Paragraphs:
    return [
        s.intro("toy"),
        [s.one("{day}, {h.his} friend {f} came over to play.", "{day}, {h} was playing {place.at} when {f} came by."),
         s.one("{f} saw the {toy.desc}.", "{f} looked at the {toy.word} with big eyes."),
         s.say("{f}", s.one("Can I play with your {toy.word}, too?", "Can I have a turn, please?")),
         "But {h} did not want to share.",
         s.say("{h}", s.one("No, it is mine!", "No! Go away!"), "shouted"),
         s.one("{f} was {sad}. {f.He} walked away and sat down all alone.",
               "{f} looked at the ground. {f.He} sat down by {f.himself}.")],
        [s.one("{h} {toy.use.past} {h.his} {toy.word}, but it was not fun anymore.",
               "{h} played with the {toy.word}, but something did not feel right."),
         s.one("{h.He} looked at {f}, who was all alone.", "{h.He} saw that {f} was {sad}."),
         "{h.He} felt bad inside. {h.He} walked over to {f}.",
         s.say("{h}", s.one("I am sorry. Do you want to play with me?", "I am sorry. We can share my {toy.word}.")),
         s.one("{f} smiled a big smile.", "{f} jumped up."),
         s.say("{f}", s.one("Yes, please!", "Thank you, {h}!"))],
        [s.one("They took turns with the {toy.word}. They laughed and played all day.",
               "They played together until it was time to go home."),
         s.one("Playing together was much more fun than playing alone.", "{h} felt warm and {happy} inside."),
         s.moral("sharing is caring", "it is more fun to play together", "a friend is better than a toy")],
    ]


def scared_of_dark(s: Scene) -> Paragraphs:
    s.set(shadow=s.rng.choice(("a big, dark shadow on the wall", "two shiny eyes in the corner",
                               "something tall next to the door")))
    s.set(thing=s.rng.choice(("coat on the chair", "{toy.word} on the shelf".format(toy=s.v["toy"]),
                              "lamp by the window", "pile of clothes on the floor")))
    return [
        s.intro(s.rng.choice(("trait", "family"))),
        [s.one("But {h} was afraid of the dark.", "But every night, {h} felt {scared} when the lights went out."),
         "One night, it was bedtime, and {h.his} {p.kind} turned off the light and said good night.",
         s.one("{h} saw {shadow}.", "Then {h} saw {shadow}."),
         s.one("{h.He} pulled the blanket over {h.his} head.", "{h.His} heart went thump, thump, thump."),
         s.say("{h}", "{p}! There is a monster in my room!", "cried")],
        [s.one("{p} came in and turned on the lamp.", "{p} hurried in and switched on the light."),
         s.one("The monster was only the {thing}!", "It was not a monster at all. It was only the {thing}."),
         s.say("{p}",
               s.one("See? There is nothing to be afraid of.",
                     "Things look different in the dark, but they are the same things.")),
         s.one("{h} giggled.", "{h} laughed a little."),
         s.one("Then {p} gave {h} a little night light shaped like a star.",
               "Then {p} opened the curtains and showed {h} the moon and the stars."),
         s.say("{p}", s.one("Now you will always have a little light.", "The moon will watch over you all night."))],
        [s.one("{h} was not {scared} anymore.", "{h} felt safe and warm."),
         s.one("{h.He} hugged {h.his} pillow and fell asleep with a smile.", "Soon {h.he} was fast asleep."),
         s.moral("the dark is not so scary", "you can be brave even when you are afraid")],
    ]


def baking(s: Scene) -> Paragraphs:
    return [
        s.intro("family"),
        [s.one("{day}, {h.his} {p.kind} said that {g} was coming to visit.", "{day}, it was {g}'s birthday."),
         s.say("{p}", "Let's bake {bake.a} for {g}!"),
         s.one("{h} clapped {h.his} hands.", "{h} jumped up and down."),
         s.one("They got out a big bowl, some flour, some eggs, some milk and some sugar.",
               "They put on their aprons and got out a big bowl and a spoon."),
         s.one("{h} poured the milk, and then {h.he} stirred and stirred.", "{h} helped {p} mix everything together.")],
        [s.one("Oh no! {h} spilled the flour all over the floor.", "Oops! {h} dropped an egg on the floor. Splat!"),
         s.one("{h.He} was afraid {h.his} {p.kind} would be mad.", "{h} felt {scared}. {h.He} did not mean to do it."),
         s.say("{p}", s.one("It's okay. Everyone makes mistakes.", "Don't worry. We can clean it up together.")),
         s.one("{p} laughed, and they cleaned it up together.", "They wiped the floor and started again.")],
        [s.one("Soon the {bake.word} {bake.was} ready. The kitchen smelled so good!",
               "When the {bake.word} came out of the oven, {bake.it} looked perfect."),
         s.one("When {g} came, {h} gave {g.him} the {bake.word}.", "{h} gave the {bake.word} to {g}."),
         s.say("{g}",
               s.one("Did you make this for me? Thank you!", "{bake.this_is} the best {bake.word} I have ever had!")),
         s.one("{h} felt very {happy}.", "{h} smiled from ear to ear."),
         s.moral("mistakes are okay if you keep trying",
                 "making something for someone you love is a wonderful gift")],
    ]


def gift_for_parent(s: Scene) -> Paragraphs:
    flowers = s.rng.random() < 0.5
    s.set(gift="flowers" if flowers else "card")
    make = (["{h.He} went to the garden and picked the prettiest flowers {h.he} could find.",
             s.one("{h.He} picked big ones, small ones and {color} ones.", "{h.He} tied them with {color_a} ribbon.")]
            if flowers else
            ["{h.He} got some paper and {h.his} crayons.",
             s.one("{h.He} drew a picture of {h.his} family {place.at}.", "{h.He} drew a big heart and {color_a} sun."),
             s.one("Then {h.he} folded the paper into a card and wrote a message inside.",
                   "Then {h.he} wrote a little letter to go with it.")])
    return [
        s.intro("family"),
        [s.one("{day}, {h} remembered that it was {p}'s birthday.", "{day}, {h} wanted to do something nice for {p}."),
         s.one("{h.He} wanted to give {p.him} a special present.", "{h.He} wanted to surprise {p.him}."),
         s.one("But {h.he} had no money to buy one.", "But {h.he} did not know what to give."),
         s.one("{h} thought and thought.", "{h} sat on the stairs and thought very hard.")],
        ["Then {h.he} had an idea!", *make],
        [s.one("When {p} saw the {gift}, {p.his} eyes filled with happy tears.",
               "{p} smiled when {p.he} saw the {gift}."),
         s.say("{p}", s.one("This is the best present ever!", "Did you make this for me? I love it!")),
         s.one("{p.He} gave {h} a big hug.", "{p.He} hugged {h} tight."),
         s.moral("the best presents come from the heart", "a gift made with love is the best gift of all")],
    ]


def messy_room(s: Scene) -> Paragraphs:
    return [
        s.intro("toy"),
        [s.one("But {h}'s room was very messy.", "{h} did not like to clean {h.his} room."),
         s.one("There were toys, books and socks everywhere.",
               "There were crayons on the floor and clothes on the bed."),
         s.say("{p}", "Please clean your room, {h}."),
         s.one("But {h} did not want to clean. {h.He} wanted to {hobby.base}.",
               "But {h} said, \"Later!\" and ran off to play.")],
        [s.one("{later}, {h} wanted to play with {h.his} {toy.word}, but {h.he} could not find it.",
               "That evening, {h} looked for {h.his} {toy.desc}, but it was gone."),
         s.one("{h.He} looked under the bed. {h.He} looked behind the door. It was not there.",
               "{h.He} looked in the closet and in the toy box. It was not there."),
         s.one("{h} felt {sad}.", "{h} sat down on the floor."),
         "So {h.he} decided to clean up.",
         s.one("{h.He} put the books on the shelf and the socks in the drawer.",
               "{h.He} picked up every toy and put it in the box.")],
        [s.one("Under a pile of clothes, {h.he} found {h.his} {toy.word}!",
               "Then, under the last sock, there was the {toy.word}!"),
         s.say("{h}", "There you are!", "shouted"),
         s.one("{p} came in and smiled.", "{p} peeked into the room."),
         s.say("{p}", s.one("Your room looks so nice, {h}! I am proud of you.", "Wow, what a clean room!")),
         s.moral("a tidy room makes it easy to find things", "it is good to clean up after you play")],
    ]


def telling_truth(s: Scene) -> Paragraphs:
    return [
        s.intro("trait", "family"),
        [s.one("{h.He} also had a pet {pet.word}.", "The family had a little pet {pet.word}."),
         "{day}, {h} was bouncing a ball in the house.",
         s.one("{h.His} {p.kind} had told {h.him} not to play ball inside.",
               "{h.He} knew {h.he} should not play ball inside."),
         "The ball bounced high and hit the {breakable}. Crash!",
         s.one("The {breakable} fell and broke into many pieces.", "The {breakable} lay on the floor in pieces.")],
        [s.one("{h} was very {scared}.", "{h} froze."),
         s.say("{p}", "What happened to my {breakable}?"),
         s.say("{h}", "The {pet.word} did it!"),
         s.one("The {pet.word} looked at {h} with big, sad eyes.", "The poor {pet.word} hid under the table.")],
        [s.one("That night, {h} could not sleep.", "At dinner, {h} did not want to eat."),
         s.one("{h.He} felt bad inside.", "{h.His} tummy felt funny and heavy."),
         s.say("{h}", "{p}, I broke the {breakable}, not the {pet.word}. I am sorry."),
         s.one("{p} gave {h.him} a hug.", "{p} sat down next to {h.him}."),
         s.say("{p}",
               s.one("Thank you for telling me the truth. I am proud of you.",
                     "I am glad you told me. The truth is always best.")),
         "The next day, they fixed the {breakable} together with glue.",
         s.moral("it is always best to tell the truth", "saying sorry makes things better")],
    ]


def sick_day(s: Scene) -> Paragraphs:
    return [
        s.intro("friend", "food") if s.rng.random() < 0.3 else s.intro("friend"),
        [s.one("{day}, {h} woke up with a runny nose.", "{day}, {h} woke up feeling hot and tired."),
         s.one("{h.He} sneezed and sneezed.", "{h.He} coughed and sniffled."),
         s.one("{h.His} {p.kind} said {h.he} had to stay in bed.", "{p} said {h.he} had to rest all day."),
         s.one("{h} was {sad}. {h.He} wanted to play with {f}.",
               "{h} looked out the window. {h.He} wanted to go outside.")],
        [s.one("{later}, there was a knock at the door.", "In the afternoon, someone knocked on the door."),
         "It was {f}! {f.He} brought some {fruit} and a card.",
         "The card said, 'Get well soon!'",
         s.say("{f}", s.one("I missed you today, so I came to see you.", "I hope you feel better soon!")),
         s.one("{h} smiled for the first time all day.", "{h} felt a little better already."),
         s.one("{f} read a book to {h}, and they laughed at the funny pictures.",
               "{f} told {h} funny jokes until they both giggled.")],
        [s.one("A few days later, {h} felt all better.", "Soon {h} was well again."),
         s.one("The first thing {h.he} did was run to {f}'s house to say thank you.",
               "{h.He} ran outside to play with {f}."),
         s.moral("a good friend cares for you when you are sick", "a little kindness can make someone feel better")],
    ]


def bedtime_story(s: Scene) -> Paragraphs:
    s.set(critter=s.rng.choice(("bunny", "bear", "fox", "mouse", "frog", "turtle", "kitten", "puppy")))
    return [
        s.intro("family"),
        [s.one("One night, {h} could not sleep.", "One night, {h} lay in bed with {h.his} eyes wide open."),
         "{h.He} rolled to the left. {h.He} rolled to the right.",
         s.one("{h.He} counted sheep, but {h.he} was still awake.",
               "{h.He} closed {h.his} eyes, but sleep did not come."),
         s.one("{g} was staying with them that week.", "{g} had come to visit."),
         s.one("{g} heard {h} and came into the room.", "{g} peeked into the room."),
         s.say("{g}", "Can't sleep, little one?"),
         s.say("{h}", "No. Will you tell me a story?")],
        ["{g} sat on the bed and told a story about a little {critter} who wanted to touch the moon.",
         s.one("The little {critter} climbed the tallest hill and reached up high, but the moon was too far away.",
               "Every night, the {critter} jumped as high as it could, but the moon was too far away."),
         "Then the {critter} looked down and saw the moon in a pond, shining right next to it.",
         s.one("{h} listened. {h.His} eyes grew heavy.", "{h} yawned a big yawn.",
               "{g} tickled {h.his} toes, and {h} giggled. Then {h.his} eyes grew heavy.")],
        [s.one("Before the story was over, {h} was fast asleep.", "Soon {h} was sound asleep."),
         "{g} smiled and tucked the blanket around {h.him}.",
         s.say("{g}", "Good night, my little {h.kind}.", "whispered"),
         s.one("That night, {h} dreamed of the moon.", "{h} dreamed of a little {critter} and a big, round moon."),
         s.moral("a good story can help you rest", p=0.3)],
    ]


def helping_chores(s: Scene) -> Paragraphs:
    job = s.rng.choice(("car", "garden", "house"))
    doing = {"car": "washing the car", "garden": "working in the garden", "house": "cleaning the house"}[job]
    if job == "car":
        task = ["{h} sprayed the water, but the hose got away from {h.him}!",
                "Water splashed everywhere, and {p} got all wet!",
                "For a moment, {h} was {scared}. But then {p} started to laugh, and soon they were both laughing."]
    elif job == "garden":
        task = ["{h} pulled weeds and watered the flowers.",
                "{h.He} found a big, wiggly worm and showed it to {p}.",
                s.one("{p} told {h.him} that worms help the flowers grow.", "They put the worm back in the dirt.")]
    else:
        task = [s.one("{h} swept the floor with a big broom.", "{h} swept the floor and folded the towels."),
                s.maybe(0.5, "{h.He} washed the sink with soap and a brush."),
                "{h.He} made {h.his} bed and put {h.his} {toy.word} on top.",
                s.one("{h.He} even helped wash the dishes.", "{h.He} sang a song while {h.he} worked.")]
    s.set(doing=doing)
    return [
        s.intro("family"),
        ["{day}, {h.his} {p.kind} was {doing}.", s.say("{h}", "Can I help?"),
         s.say("{p}", s.one("Of course! I could use a helper.", "Yes, please! Let's do it together.")), *task],
        [s.one("When they were done, everything looked clean and nice.", "At last, the work was done."),
         s.one("{p} gave {h} a big hug.", "{p} smiled at {h}."),
         s.say("{p}", s.one("Thank you for helping me. You are a great helper!", "We make a good team!")),
         s.one("{h} felt very {happy}.", "{h} felt proud of {h.himself}."),
         s.one("Later, they shared {snack_a} as a treat.", "Then they sat down to rest and have a snack."),
         s.moral("helping can make work fun", "it feels good to help the people you love")],
    ]


def first_day_school(s: Scene) -> Paragraphs:
    return [
        s.intro("trait"),
        [s.one("Tomorrow was {h}'s first day at school.", "Soon it would be {h}'s first day at a new school."),
         s.one("{h.He} felt {scared}.", "{h.He} had butterflies in {h.his} tummy."),
         s.say("{h}", s.one("What if nobody likes me?", "What if I don't have any friends?")),
         s.say("{p}",
               s.one("Just be yourself. You will make lots of friends.", "Be kind, and you will find a friend."))],
        ["The next morning, {h} put on {h.his} new backpack and went to school.",
         s.one("{h.His} teacher, {t}, smiled at {h.him}.", "At the door, the teacher, {t}, said hello."),
         s.one("{t} showed {h.him} where to sit and gave {h.him} a new pencil.",
               "{t} showed {h.him} the books and the paints."),
         "{h} sat down next to {f.a_kind} named {f}.",
         s.one("{f} was drawing a picture of {wild.a}.", "{f} was building a tall tower of blocks."),
         s.say("{h}", s.one("I like your picture.", "That is really cool!")),
         s.say("{f}", s.one("Thank you! Do you want to play with me?", "Thanks! You can help me if you want."))],
        [s.one("They drew pictures, sang songs and played outside together.", "They played together all day long."),
         s.one("When {p} came to pick {h.him} up, {h} ran to {p.him}.", "After school, {h} ran to {h.his} {p.kind}."),
         s.say("{h}", s.one("I made a new friend! Can I come back tomorrow?", "School is fun! {f} is my new friend!")),
         "{p} laughed and gave {h.him} a hug.",
         s.moral("new things can be fun, even if they seem scary at first",
                 "being kind is the best way to make a friend")],
    ]


def doctor_visit(s: Scene) -> Paragraphs:
    s.toy_of("teddy bear", "doll", "stuffed bunny", "puppet")
    return [
        s.intro("toy"),
        [s.one("{day}, {h} had to go to the doctor.", "{day}, {h.his} {p.kind} took {h.him} to see the doctor."),
         s.one("{h.He} did not want to go.", "{h} was {scared}."),
         "{h.He} thought the doctor would hurt {h.him}.",
         "{h.He} held {h.his} {toy.word} very tight."],
        [s.one("The doctor was named {d}. {d.He} had a kind smile.",
               "The doctor, {d}, had a kind face and a soft voice."),
         s.one("{d.He} looked in {h.his} ears and listened to {h.his} heart.",
               "{d.He} listened to {h.his} heart and looked at {h.his} throat."),
         s.say("{d}", s.one("Your heart sounds strong and healthy!", "You are a very healthy {h.kind}!")),
         "{d.He} even pretended to check the {toy.word}.",
         s.one("{h} giggled.", "{h} laughed out loud."),
         "At the end, {d} gave {h.him} a shiny sticker.",
         s.say("{d}", "You were very brave today.")],
        [s.one("{h} showed the sticker to {h.his} {p.kind}.",
               "On the way home, {h} looked at the sticker again and again."),
         s.say("{h}", s.one("The doctor was not scary at all!", "I was brave!")),
         s.one("{h} felt proud.", "{p} smiled and squeezed {h.his} hand."),
         s.moral("being brave is easier than you think", "doctors are there to help us")],
    ]


def bossy_game(s: Scene) -> Paragraphs:
    s.place_where(lambda p: p.word in ("park", "playground", "backyard", "field", "meadow", "beach"))
    return [
        s.intro(s.rng.choice(("trait", "friend"))),
        [s.one("{day}, {h}, {f} and {f2} played a game {place.at}.", "{day}, {h} played with {f} and {f2} {place.at}."),
         "{h} wanted to be the leader, and {h.he} told everyone what to do.",
         s.say("{h}",
               s.one("You stand there! No, not like that! Do it my way!", "I am the boss. You have to do what I say!"),
               s.rng.choice(("shouted", "yelled"))),
         s.one("{f} and {f2} did not like it.", "{f} and {f2} looked at each other."),
         s.say("{f}", s.one("This is not fun anymore.", "You never let us choose.")),
         "Then {f} and {f2} went to play somewhere else."],
        [s.one("{h} sat alone. It was no fun to play by {h.himself}.", "{h} was all alone now. {h.He} felt {sad}."),
         "{h.He} thought about what {h.he} had done.",
         "Then {h.he} walked over to {h.his} friends.",
         s.say("{h}", "I am sorry I was bossy. Can we play together? You can choose the game."),
         s.say("{f2}", s.one("Okay! Let's play tag!", "Yes! Let's play hide and seek!")),
         s.maybe(0.5, "{f} and {f2} forgave {h.him}.")],
        [s.one("They played until the sun went down.", "They played and laughed all afternoon."),
         s.one("Everyone took turns being the leader.", "This time, everyone got a turn to choose."),
         s.moral("it is more fun when everyone gets a turn", "good friends listen to each other")],
    ]


def borrowed_without_asking(s: Scene) -> Paragraphs:
    return [
        s.intro("friend"),
        [s.one("{f} had {toy.a}.", "{f} had a new {toy.word}. It was {toy.adj} and very nice."),
         s.one("{h} liked it very much.", "{h} wished it was {h.his}."),
         "{day}, {f} left the {toy.word} {place.at}, and {h} took it home without asking.",
         s.one("At home, {h} {toy.use.past} the {toy.word}, but {h.he} did not feel happy.",
               "At home, {h} played with the {toy.word}, but something felt wrong.")],
        [s.one("The next day, {f} was crying.", "The next day, {f} looked {sad}."),
         s.say("{f}",
               s.one("I lost my {toy.word}! I looked everywhere.", "Have you seen my {toy.word}? I can't find it.")),
         s.one("{h} felt a funny feeling in {h.his} tummy.", "{h} looked down at {h.his} feet."),
         "{h.He} ran home and got the {toy.word}.",
         s.say("{h}", "I took it. I am sorry, {f}. I should have asked.")],
        [s.one("{f} wiped {f.his} tears.", "{f} was quiet for a moment."),
         s.say("{f}", "Thank you for giving it back. Next time, just ask me. I will share."),
         s.one("From then on, {h} always asked first.", "{h} promised to always ask first.", "{f} forgave {h.him}."),
         "The two friends played with the {toy.word} together.",
         s.moral("you should always ask before you take something", "it is right to give back what is not yours")],
    ]


def learning_to_ride(s: Scene) -> Paragraphs:
    s.place_where(lambda p: p.word in ("park", "playground", "backyard", "field"))
    return [
        s.intro("trait"),
        [s.one("For {h.his} birthday, {h} got {ride.a}.", "{day}, {g} gave {h} {ride.a}."),
         "But {h} did not know how to ride it.",
         s.one("{h.He} tried, but {h.he} wobbled and fell down.", "{h.He} got on, wobbled to the left, and fell."),
         "{h.He} tried again and fell again.",
         s.say("{h}", s.one("I can't do it!", "This is too hard!"), "cried"),
         "{h.He} wanted to give up."],
        [s.one("{h.His} {p.kind} held the back of the {ride.word}.", "{p} came over and knelt down next to {h.him}."),
         s.say("{p}", s.one("Keep trying. Look ahead and keep going.", "Everyone falls at first. Let's try together.")),
         s.one("Every day, {h} practiced {place.at}.", "So {h} practiced every day {place.at}."),
         s.one("Little by little, {h.he} got better.", "{h.He} fell a few more times, but {h.he} always got up.")],
        [s.one("Then one day, {p} let go, and {h} did not fall!", "One morning, {h} rode all by {h.himself}!"),
         "{h.He} rode all the way to the end of the path.",
         s.say("{h}", "I did it! I really did it!", "shouted"),
         s.one("{p} clapped and cheered.", "{p} cheered so loud that the birds flew away."),
         s.moral("if you keep trying, you can do hard things", "practice helps you get better")],
    ]


def music_practice(s: Scene) -> Paragraphs:
    s.toy_of("drum", "trumpet", "xylophone", "harmonica")
    return [
        s.intro("trait"),
        [s.one("{h} had {toy.a}.", "{g} gave {h} {toy.a}."),
         s.one("{h.He} wanted to play it in the big show.",
               "{h.He} wanted to play a song for everyone at the big show."),
         s.one("{h.He} practiced, but it sounded very loud and bumpy.",
               "But when {h.he} played, the notes came out all wrong."),
         s.one("The pet {pet.word} ran and hid under the bed.", "Even the {pet.word} next door {pet.noise}."),
         "{h} felt {sad}.",
         s.say("{h}", s.one("I will never play well.", "I am no good at this."))],
        [s.one("{g} heard {h.him}.", "{g} sat down next to {h.him}."),
         s.say("{g}", "When I was little, I could not play well either. Let's practice a little every day."),
         "So every day, {h} and {g} practiced together.",
         s.one("Slowly, the music got better and better.", "Each day, the song sounded a little nicer.")],
        [s.one("On the day of the show, {h} was {scared}.", "At the big show, {h.his} hands shook."),
         "Then {h.he} saw {g} smiling at {h.him}.",
         "{h.He} played {h.his} {toy.word}, and it sounded beautiful.",
         s.one("Everyone clapped and cheered.", "When the song was over, everyone stood up and clapped."),
         s.moral("practice makes you better a little at a time", "you should not give up when something is hard")],
    ]


def rainy_day(s: Scene) -> Paragraphs:
    return [
        s.intro("place"),
        ["One morning, {h} wanted to go to the {place.word}.",
         s.one("But when {h.he} looked out the window, it was raining.",
               "But dark clouds filled the sky, and it began to rain."),
         "Big drops of rain fell from the gray sky.",
         s.say("{h}", s.one("Now I can't go out and play!", "Rain, rain, go away!")),
         "{h} felt {sad}."],
        [s.one("{h.His} {p.kind} had an idea.", "Then {p} smiled."),
         s.say("{p}", s.one("Let's build a fort right here in the living room!", "Let's have an indoor picnic!")),
         s.one("They used blankets, pillows and chairs to build the biggest fort ever.",
               "They spread a blanket on the floor and got some snacks."),
         s.one("Inside, they read books and ate {snack_a}.", "They told stories and ate some {fruit}."),
         s.one("{h} played with {h.his} {toy.word} and laughed and laughed.", "{h} forgot all about the rain.")],
        [s.one("{later}, the rain stopped.", "In the afternoon, the sun came out."),
         "{h} looked out the window and saw a big rainbow!",
         s.say("{h}", s.one("Look, a rainbow!", "{p}, come and see!"), "shouted"),
         s.one("It was a good day after all.", "It had been a wonderful day, rain and all."),
         s.moral("you can have fun even on a rainy day", "there is always something fun to do")],
    ]


def hide_and_seek(s: Scene) -> Paragraphs:
    s.set(spot=s.rng.choice(("under a big blanket", "inside an old box", "behind the big curtain", "under the stairs")))
    return [
        s.intro(s.rng.choice(("friend", "hobby"))),
        [s.one("{day}, {h}, {f} and {f2} played hide and seek.",
               "{day}, {f} and {f2} came over to play hide and seek."),
         "{f} closed {f.his} eyes and counted to ten.",
         s.say("{f}", "One, two, three... ready or not, here I come!"),
         "{f2} hid behind a chair. {h} found a special hiding spot {spot}."],
        [s.one("{f} found {f2} very fast.", "It did not take long to find {f2}."),
         "But nobody could find {h}. They looked and looked.",
         s.one("{h} waited and waited. It was warm and quiet, and soon {h.he} fell asleep!",
               "{h} waited so long that {h.he} took a little nap!",
               "{h} stayed very still. After a while, {h.his} eyes closed, and {h.he} fell asleep!")],
        [s.one("{later}, {h} woke up.", "A long time later, {h} opened {h.his} eyes."),
         "{h.He} came out and saw {h.his} friends still looking everywhere.",
         s.say("{h}", "Here I am!", "shouted"),
         s.say("{f2}", s.one("You are the best hider ever!", "We looked for you everywhere!")),
         s.one("They all laughed together.", "Everyone laughed, and then it was {h}'s turn to count."),
         s.moral("playing with friends is the best fun", p=0.3)],
    ]


PLOTS: tuple[Plot, ...] = (
    plot(broken_toy), plot(sharing_toy), plot(scared_of_dark), plot(baking, animal_ok=False),
    plot(gift_for_parent, animal_ok=False), plot(messy_room, animal_ok=False),
    plot(telling_truth, animal_ok=False), plot(sick_day), plot(bedtime_story),
    plot(helping_chores, animal_ok=False), plot(first_day_school, animal_ok=False),
    plot(doctor_visit, animal_ok=False), plot(bossy_game), plot(borrowed_without_asking),
    plot(learning_to_ride, animal_ok=False), plot(music_practice), plot(rainy_day), plot(hide_and_seek),
)
