"""Story plots set outdoors: parks, beaches, snow, animals and small adventures.

Same conventions as `plots_home`: paragraphs of sentence templates over the scene's cast.
"""

from __future__ import annotations

from routescope.corpora import lexicon as lx
from routescope.corpora.stories import Paragraphs, Plot, Scene, plot


def _outdoors(s: Scene, *words: str) -> None:
    allowed = words or lx.OUTDOORS
    s.place_where(lambda p: p.word in allowed)


def lost_toy(s: Scene) -> Paragraphs:
    _outdoors(s)
    return [
        s.intro("toy"),
        [s.one("{day}, {h} took {h.his} {toy.desc} to the {place.word}.",
               "{day}, {h} and {h.his} {toy.word} went to the {place.word}."),
         s.one("{h.He} {toy.use.past} it for a long time.", "{h.He} played with it all morning."),
         s.one("Then {h.he} stopped to {place.act.base}.", "Then {h.he} saw {wild.a} and ran to look at it."),
         s.one("When {h.he} came back, the {toy.word} was gone!",
               "Later, {h.he} looked around. Where was {h.his} {toy.word}?"),
         s.one("{h} looked high and low, but {h.he} could not find it.",
               "{h.He} looked everywhere, but it was not there."),
         s.one("{h.He} felt {sad} and began to cry.", "{h} sat down and cried.")],
        [s.one("{f} saw {h} crying.", "Just then, {h.his} friend {f} came by."),
         s.say("{f}", s.one("What's wrong?", "Why are you sad, {h}?")),
         s.say("{h}", "I lost my {toy.word}!"),
         s.say("{f}",
               s.one("Don't worry. I will help you look.",
                     "Let's look together. Two pairs of eyes are better than one.")),
         s.one("They looked together.", "They searched and searched."),
         s.one("Then {f} pointed. There, next to {place.a_find}, was the {toy.word}!",
               "At last, {f} found the {toy.word} under a pile of leaves.")],
        [s.say("{h}", "You found it! Thank you, {f}!", "shouted"),
         s.one("{h} gave {f} a big hug.", "{h} was so {happy}."),
         s.one("They played with the {toy.word} together until it was time to go home.",
               "Then they {place.act.past} together until dinner time."),
         s.moral("friends help each other", "it is easier to find things with a friend")],
    ]


def new_friend(s: Scene) -> Paragraphs:
    _outdoors(s, "park", "playground", "beach", "library", "zoo", "meadow", "field", "pool", "lake")
    return [
        s.intro(s.rng.choice(("place", "hobby", "trait"))),
        [s.one("{day}, {h} went to the {place.word}.", "{day}, {h} was {place.act.ing} {place.at}."),
         s.one("There {h.he} saw {f.a_kind} sitting all alone.", "{h.He} saw {f.a_kind} {h.he} had never seen before."),
         s.one("The {f.kind} looked {sad}.", "The {f.kind} was looking at the ground."),
         "{h} wanted to say hello, but {h.he} felt shy.",
         "Then {h.he} remembered what {h.his} {p.kind} always said: a smile is the best way to start."],
        ["{h} walked over and smiled.",
         s.say("{h}", "Hi! My name is {h}. What is your name?"),
         s.say("{f}",
               s.one("I am {f}. I just moved here, and I don't have any friends.",
                     "My name is {f}. I don't know anyone here."),
               s.rng.choice(("said", "answered"))),
         s.say("{h}", "You can be my friend! Do you want to {place.act.base} with me?"),
         s.one("{f} smiled a big smile.", "{f} jumped up."),
         s.say("{f}", s.one("Yes! I would like that.", "Okay!"))],
        [s.one("The two new friends {place.act.past} together all afternoon.",
               "They {place.act.past} and laughed all afternoon."),
         s.one("When it was time to go home, they promised to meet again the next day.",
               "From that day on, {h} and {f} were best friends."),
         s.moral("a friendly hello can make a new friend", "it is good to be kind to someone who is alone")],
    ]


def stuck_kitten(s: Scene) -> Paragraphs:
    return [
        s.intro(s.rng.choice(("trait", "hobby"))),
        ["{day}, {h} heard a little sound: meow, meow!",
         "{h.He} looked up and saw a small kitten at the top of a tall tree.",
         s.one("The kitten was stuck and could not get down.",
               "The poor kitten was shaking. It was too scared to climb down."),
         "{h} wanted to help, but the tree was too tall.",
         s.say("{h}", "Don't be scared, little kitten. I will get help!")],
        [s.one("{h} ran to get {h.his} {p.kind}.", "{h} ran home as fast as {h.he} could and told {p}."),
         "{p} brought a long ladder.",
         "{p.He} climbed up slowly, step by step, while {h} held the ladder.",
         "At the top, {p.he} reached out and gently picked up the kitten.",
         s.one("They had rescued the kitten!", "They had saved the kitten!")],
        [s.one("When they came down, the kitten licked {h}'s hand.", "The kitten purred in {h}'s arms."),
         "Just then, {f2} came running down the street.",
         s.say("{f2}", "{pet_name}! You found my kitten!", "shouted"),
         s.one("{f2} thanked {h} again and again.", "{f2} hugged the kitten and thanked {h} and {p}."),
         s.one("{h} felt warm and {happy} inside.", "{h} smiled all the way home."),
         s.moral("helping others is the right thing to do", "you can always ask a grown-up for help")],
    ]


def garden_seed(s: Scene) -> Paragraphs:
    s.set(bloom=s.rng.choice(("red", "yellow", "pink", "purple", "orange", "white", "blue")))
    return [
        s.intro("hobby"),
        [s.one("{day}, {g} gave {h} a tiny seed.", "{day}, {h} found a tiny seed in {g}'s garden."),
         s.say("{g}", "If you plant this and take care of it, something special will grow."),
         s.one("{h} planted the seed in a little pot and gave it some water.",
               "{h} dug a hole, put in the seed and covered it with dirt.")],
        [s.one("The next morning, {h} ran to look. Nothing had grown.",
               "The next day, {h} looked. There was only dirt."),
         s.say("{h}", s.one("Why is it not growing?", "When will it grow?")),
         s.say("{g}",
               s.one("Be patient. Good things take time.", "Seeds grow slowly. You must wait and take care of it.")),
         "Every day, {h} watered the seed. Every day, {h.he} waited.",
         s.one("Some days were sunny, and some days it rained.", "Days went by, and then weeks."),
         "Then one morning, {h} saw a tiny green sprout!"],
        [s.one("The sprout grew taller and taller.", "The little plant grew bigger every day."),
         s.one("Soon there was a big {bloom} flower, taller than {h}!",
               "Soon a beautiful {bloom} flower bloomed in the sun."),
         s.maybe(0.3, "Once, a little bunny nibbled at the leaves, but {h} gently sent it away."),
         s.one("{h} was so {happy}. {h.He} ran to show {g}.", "{h} clapped {h.his} hands."),
         s.say("{g}", "You see? Your care and patience made it grow."),
         s.moral("good things come to those who wait", "being patient is worth it")],
    ]


def race(s: Scene) -> Paragraphs:
    _outdoors(s, "park", "field", "meadow", "beach", "playground", "hill")
    return [
        s.intro(s.rng.choice(("friend", "trait"))),
        [s.one("{day}, {h} and {f} had a race {place.at}.", "{day}, {f} said, \"Let's race to the big tree!\""),
         s.one("{h} wanted to win very much.", "{h} was sure {h.he} would win."),
         s.say("{f}", "Ready, set, go!"),
         "They ran as fast as they could.",
         "{h} was in front. But then {h.he} tripped on a rock and fell down.",
         s.one("{h.His} knee hurt, and {h.he} began to cry.", "{h.He} scraped {h.his} hand and {h.his} knee.")],
        [s.one("{f} could have won the race. But {f.he} stopped and ran back.",
               "{f} saw {h} fall. {f.He} stopped running right away."),
         s.say("{f}", "Are you okay? Let me help you up."),
         "{f} held out {f.his} hand and helped {h} stand up.",
         "They walked to the finish line together, side by side."],
        [s.say("{h}", "Thank you, {f}. You could have won!"),
         s.say("{f}",
               s.one("Being your friend is more important than winning.", "Winning is not fun if my friend is hurt.")),
         s.one("{h} smiled.", "{h} gave {f} a hug."),
         s.moral("friendship is more important than winning", "a good friend helps you when you fall")],
    ]


def slippery_rocks(s: Scene) -> Paragraphs:
    s.place_where(lambda p: p.word in ("pond", "lake", "river", "beach"))
    return [
        s.intro("place"),
        [s.one("{day}, {h} went to the {place.word} with {h.his} {p.kind}.",
               "{day}, {h} and {p} went for a walk by the {place.word}."),
         s.say("{p}",
               s.one("Don't go too close to the water. The rocks are slippery.",
                     "Stay away from the wet rocks, please.")),
         s.one("{h} nodded.", "{h} said {h.he} would be careful."),
         "But then {h.he} saw a big green frog croaking on a rock near the water.",
         "{h} wanted to get a closer look.",
         "{h.He} stepped onto the slippery rocks. One step, two steps, three steps...",
         "Splash! {h.He} slipped and fell into the water!"],
        [s.one("The water was not deep, but it was very cold.",
               "The water only came up to {h.his} knees, but it was cold."),
         "{h} was wet from head to toe.",
         s.one("{p} ran over and pulled {h.him} out.", "{p} hurried over and lifted {h.him} out."),
         s.say("{h}", "I'm sorry. I should have listened to you."),
         "{p} wrapped {h.him} in a warm towel.",
         s.say("{p}", "I'm just glad you are okay.")],
        [s.one("When they got home, {h} had a warm bath and a cup of hot cocoa.",
               "At home, {h} put on dry clothes and sat by the fire."),
         "The next time they went to the {place.word}, {h} stayed away from the slippery rocks.",
         s.moral("it is important to listen to your parents", "rules are there to keep us safe")],
    ]


def hurt_bird(s: Scene) -> Paragraphs:
    _outdoors(s)
    return [
        s.intro(s.rng.choice(("trait", "place"))),
        ["{day}, {h} was walking {place.at} when {h.he} heard a soft little sound.",
         "Under a bush, {h.he} found a little bird. Its wing was hurt, and it could not fly.",
         s.one("{h} felt sorry for the bird.", "The bird looked {scared}.")],
        ["{h} carefully picked up the bird and carried it home.",
         "{h.His} {p.kind} helped {h.him} make a soft bed in a box.",
         s.one("Every day, {h} gave the bird water and seeds.", "Every day, {h} fed the bird and sang it a song."),
         "{h.He} named the bird {pet_name}.",
         "Slowly, {pet_name} got better."],
        [s.one("One morning, {pet_name} flapped its wings and flew around the room!",
               "One day, {pet_name} hopped out of the box and flew to the window."),
         s.say("{p}", "{pet_name} is all better now. It is time to let it go."),
         "{h} felt a little {sad}, but {h.he} knew the bird belonged in the sky.",
         "{h.He} opened the window, and {pet_name} flew up into the blue sky.",
         s.maybe(0.7, "The next morning, {pet_name} came back and sang a song at {h.his} window.",
                 "Every spring after that, a little bird sang in the tree outside {h}'s window."),
         s.moral("being kind to animals is important", "sometimes loving something means letting it go")],
    ]


def sandcastle(s: Scene) -> Paragraphs:
    s.place_where(lambda p: p.word == "beach")
    return [
        s.intro(s.rng.choice(("hobby", "trait", "family"))),
        [s.one("{day}, {h} went to the beach with {h.his} {p.kind}.",
               "{day}, {h}'s family spent the day at the beach."),
         s.maybe(0.5, "{h.He} wore {h.his} new swimsuit."),
         "{h.He} built a big sandcastle with tall towers and a deep moat.",
         s.one("{h.He} put shells on the walls and a stick on top like a flag.",
               "{h.He} decorated it with shells and pebbles."),
         "It was the best sandcastle {h.he} had ever made."],
        ["Then a big wave came rolling in. Whoosh! The wave knocked the sandcastle down.",
         s.one("{h} was {sad}. {h.He} wanted to give up.", "{h} looked at the flat, wet sand and began to cry."),
         s.say("{p}", "Let's build it again, a little farther from the water."),
         "So {h} and {p} built a new sandcastle, higher up on the beach.",
         s.maybe(0.6, "{f}, {f.a_kind} from down the beach, came to help too."),
         "The new castle was even bigger than the first one!"],
        ["The waves came again, but they could not reach it.",
         s.say("{h}", "Our castle is safe!", "shouted"),
         s.one("{h} was very proud.", "{h} danced around the castle."),
         s.moral("you should try again when things go wrong", "we can learn from our mistakes")],
    ]


def hungry_dog(s: Scene) -> Paragraphs:
    _outdoors(s, "park", "playground", "field", "meadow")
    return [
        s.intro(s.rng.choice(("trait", "food"))),
        ["{day}, {h} was eating {snack_a} {place.at}.",
         "{h.He} saw a little dog sitting near a tree.",
         s.one("The dog was very thin, and it looked hungry.",
               "The dog had no collar, and it looked hungry and tired."),
         "{h} was hungry too. But {h.he} gave half of {h.his} {snack} to the dog.",
         s.one("The dog ate it all up and wagged its tail.", "The dog munched it up and wagged its tail.")],
        ["When {h} walked home, the dog followed {h.him}.",
         s.say("{h}", "{p}, can we keep the dog? It has no home."),
         "{p} looked at the dog. The dog looked at {p} with big brown eyes.",
         s.say("{p}", "Well... if nobody is looking for it, it can stay with us.")],
        ["They put up signs, but nobody came for the dog. So the dog stayed.",
         "{h} named the dog {pet_name}.",
         s.one("{pet_name} and {h} became best friends.", "From then on, {pet_name} went everywhere with {h}."),
         s.moral("a little kindness can change everything", "it is good to share with those who have less")],
    ]


def kite_stuck(s: Scene) -> Paragraphs:
    s.toy_of("kite")
    _outdoors(s, "park", "field", "meadow", "hill", "beach")
    return [
        s.intro("toy"),
        ["{day}, the wind was strong, so {h} took {h.his} kite to the {place.word}.",
         "{h.He} ran, and the kite went up, up, up into the sky.",
         s.say("{h}", "Look at my kite! It is flying so high!", "shouted"),
         "But then a big gust of wind pulled the kite into a tall tree.",
         "The string got stuck in the branches."],
        ["{h} pulled and pulled, but the kite would not come down.",
         "{h.He} felt {sad}.",
         s.one("{f} saw what happened.", "Just then, {h.his} friend {f} came by."),
         s.say("{f}", "I have an idea! Let's find a long stick."),
         "They found a long stick and reached up together.",
         s.one("{f} held {h} up, and {h} gave the kite a little push.",
               "They poked and wiggled the branches, and the kite wiggled free!")],
        ["The kite floated down into {h}'s arms.",
         s.say("{h}", "Thank you, {f}! We did it together!"),
         "{h} and {f} took turns flying the kite for the rest of the day.",
         s.moral("working together makes problems easier", "two friends can do more than one")],
    ]


def snow_day(s: Scene) -> Paragraphs:
    return [
        s.intro(s.rng.choice(("trait", "friend"))),
        ["One winter morning, {h} woke up and looked out the window. Everything was white!",
         "It had snowed all night.",
         s.say("{h}", "Snow! Can I go outside?", "shouted"),
         s.one("{h} put on {h.his} warm coat, {h.his} boots and {h.his} mittens.",
               "{h} put on {h.his} warm coat, {h.his} hat and {h.his} gloves."),
         s.one("{h.He} ran outside and caught snowflakes on {h.his} tongue.",
               "{h.He} ran outside and fell back into the soft snow.")],
        [s.one("{h} and {h.his} friend {f} decided to build a snowman.",
               "Soon {f} came over, and they decided to build a snowman."),
         "They rolled a big ball for the bottom, a middle ball, and a small ball for the head.",
         "They gave the snowman a carrot nose, two rocks for eyes and two sticks for arms.",
         "But the snowman looked cold.",
         "{h} ran inside and got an old hat and {color_a} scarf for the snowman."],
        [s.one("Now the snowman looked very happy.", "The snowman looked perfect."),
         "Then they went inside and drank hot cocoa.",
         "Their noses were cold, but they were very {happy}.",
         s.maybe(0.5, "A few days later, the sun came out and the snowman began to melt. "
                      "{h} was a little {sad}, but {p} said it would come back next winter."),
         s.moral("friends make every day more fun", p=0.3)],
    ]


def lost_child(s: Scene) -> Paragraphs:
    s.set(shop=s.rng.choice(("the big store", "the busy market", "the town fair", "the toy store")))
    return [
        s.intro(s.rng.choice(("toy", "family"))),
        ["{day}, {h} went to {shop} with {h.his} {p.kind}.",
         s.say("{p}", "Stay close to me, {h}."),
         "But then {h} saw a shiny {toy.word} and stopped to look.",
         "When {h.he} turned around, {p} was gone!",
         s.one("{h} was very {scared}. {h.His} eyes filled with tears.", "{h.His} heart beat fast. Where was {p}?")],
        ["Then {h.he} remembered what {p} had told {h.him}: if you get lost, stay where you are and ask a helper.",
         "{h.He} saw a lady in a green vest who worked there.",
         s.say("{h}",
               s.one("Excuse me. I can't find my {p.kind}.", "Excuse me. I need help. I can't find my {p.kind}.")),
         "The lady smiled kindly and held {h}'s hand.",
         s.one("Together they waited by the door.", "The lady spoke into a little radio."),
         "Soon {p} came running."],
        ["{p} hugged {h} tight.",
         s.say("{p}", "I was so worried! You did the right thing."),
         s.say("{h}", "I will stay close next time."),
         "And {h.he} did.",
         s.moral("it is smart to ask for help when you are lost", "it is important to stay close to your family")],
    ]


def balloon_away(s: Scene) -> Paragraphs:
    _outdoors(s, "park", "field", "meadow", "playground")
    return [
        s.intro(s.rng.choice(("trait", "friend"))),
        ["{day}, {h} went to the {place.word} with {g}.",
         "{g} bought {h} a big {color} balloon.",
         "{h} held the string tight. The balloon bobbed in the wind.",
         "But then {h.he} waved to {f} and let go of the string!",
         "The balloon floated up, up, up, over the trees and into the sky.",
         s.one("{h} began to cry.", "{h} was so {sad}.")],
        ["{f} ran over. {f.He} had a balloon, too.",
         "{f} thought for a moment.",
         s.say("{f}", "Don't cry. We can share mine!"),
         "They held the string together.",
         s.say("{g}", "Maybe your balloon is going on an adventure. Maybe it will fly all the way to the moon.")],
        ["{h} looked up at the sky and smiled.",
         s.say("{h}", "Goodbye, balloon! Say hello to the moon!", "shouted"),
         "Then {h} and {f} played together, holding the one balloon between them.",
         s.moral("sharing can turn a sad day into a happy one", "a good friend can cheer you up")],
    ]


def picnic(s: Scene) -> Paragraphs:
    _outdoors(s, "park", "meadow", "field", "garden", "beach", "hill")
    twist = (
        ["But when they sat down to eat, {h} saw a long line of ants marching to the food!",
         s.say("{h}", "The ants want our picnic too!"),
         "{p} laughed. {p.He} put a little piece of bread on a rock, far away from the blanket.",
         "The ants carried it away, one crumb at a time.",
         "{h} watched them work together."]
        if s.rng.random() < 0.5 else
        ["Suddenly, a big wind came and blew {h}'s hat away!",
         "{h} ran after it, across the grass and around a tree.",
         "The hat landed right next to a duck, who quacked very loudly.",
         "{h} laughed so hard that {h.he} fell down in the grass.",
         "{h.He} picked up the hat and ran back to the blanket."]
    )
    return [
        s.intro(s.rng.choice(("family", "hobby", "food"))),
        ["{day}, {h} and {h.his} family went on a picnic {place.at}.",
         "They brought sandwiches, {fruit} and a big jug of lemonade.",
         "{h} helped spread the blanket on the grass."],
        twist,
        ["They ate and laughed and played until the sun went down.",
         s.one("It was the best picnic ever.", "{h} wished every day could be a picnic day."),
         s.moral("there is always enough to share", "the best days are spent with your family", p=0.4)],
    ]


def wish_on_star(s: Scene) -> Paragraphs:
    s.set(wishpet=s.rng.choice(("kitten", "puppy", "bunny", "hamster")))
    return [
        s.intro(s.rng.choice(("trait", "family"))),
        ["One night, {h} looked out the window and saw a bright star.",
         "{g} had told {h.him} that if you wish on the first star, your wish might come true.",
         "{h} closed {h.his} eyes and made a wish.",
         "{h.He} wished for a little {wishpet} of {h.his} very own."],
        ["The next morning, nothing had changed. {h} felt a little {sad}.",
         "But that afternoon, there was a knock at the door. It was {g}, holding a basket!",
         "Inside the basket was a little {wishpet}!",
         s.say("{g}", "This little {wishpet} needs a home. Will you take care of it?")],
        [s.say("{h}", "Yes! My wish came true!", "shouted"),
         "{h} named the {wishpet} {pet_name} and loved it very much.",
         "Every night after that, {h} looked at the star and said thank you.",
         s.moral("wishes sometimes come true in surprising ways", p=0.4)],
    ]


def grumpy_neighbor(s: Scene) -> Paragraphs:
    return [
        s.intro("trait"),
        ["Next door to {h} lived {n}.",
         "{n} never smiled, and {n.he} never said hello.",
         "When {h}'s ball rolled into {n.his} yard, {n.he} grumbled and threw it back.",
         "All the children thought {n} was grumpy."],
        ["{day}, {h} saw {n} sitting alone on {n.his} porch. {n.He} looked {sad}.",
         "{h} asked {h.his} {p.kind} why {n} was always alone.",
         s.say("{p}", "{n.He} lives all alone. Maybe {n.he} is lonely."),
         "{h} had a plan. {h.He} and {p} baked {bake.a}.",
         "{h} knocked on {n}'s door and gave {n.him} the {bake.word}."],
        ["{n} looked surprised. Then, slowly, {n.he} smiled.",
         s.say("{n}", "Nobody has brought me anything in a long time. Thank you, {h}."),
         "From that day on, {n} waved to {h} every morning.",
         "Sometimes {n.he} told {h.him} stories about when {n.he} was little.",
         s.moral("a little kindness can melt a grumpy heart", "everyone needs a friend")],
    ]


def small_helper(s: Scene) -> Paragraphs:
    return [
        s.intro("trait"),
        ["{h} was the smallest {h.kind} of all {h.his} friends.",
         s.one("{f} and {f2} were big and strong.", "The others could run faster and jump higher."),
         s.one("Sometimes they said {h.he} was too little to play.", "{h} wished {h.he} was bigger."),
         "{day}, {f} kicked a ball, and it rolled into a narrow hole under the fence.",
         "{f} tried to reach it, but {f.his} arm was too big. {f2} tried too, but {f2.he} could not reach it either."],
        ["{h} stepped forward.",
         s.say("{h}", "Let me try!"),
         "{h.He} reached into the small hole, all the way in, and got the ball!",
         "{f} and {f2} cheered."],
        [s.say("{f2}", s.one("You are small, but you are a big help!", "We could not have done it without you!")),
         s.one("{h} felt ten feet tall.", "{h} smiled from ear to ear."),
         "From that day on, nobody said {h} was too little to play.",
         s.moral("everyone can help in their own way", "being small can be a good thing")],
    ]


def pretend_adventure(s: Scene) -> Paragraphs:
    kind = s.rng.choice(("rocket", "pirate ship", "castle"))
    s.set(craft=kind)
    journey = {
        "rocket": ["They counted down: five, four, three, two, one, blast off!",
                   "They flew past the stars and landed on the moon.",
                   "On the moon, they jumped very high and met a friendly moon bunny."],
        "pirate ship": ["They sailed across the wide blue sea, which was really the living room rug.",
                        "They saw a big whale and a little island with one tree.",
                        "On the island, they found a treasure chest full of shiny gold."],
        "castle": ["{h} was the king of the castle, and {f} was the brave knight.",
                   "A friendly dragon came to visit, and they shared their lunch with it.",
                   "Then the dragon gave them a ride over the clouds."],
    }[kind]
    return [
        s.intro(s.rng.choice(("hobby", "friend"))),
        ["{day}, {h.his} {p.kind} got a new chair, and it came in a big cardboard box.",
         "{h} looked at the box and had an idea.",
         s.say("{h}", "This is not a box. It is a {craft}!"),
         "{h} and {f} painted the box {color} and drew windows on the sides."],
        ["They climbed inside.", *journey],
        ["When it was time for dinner, {p} called them.",
         s.say("{h}", "We can't come now! We are on an adventure!", "shouted"),
         "{p} laughed.",
         "That night, {h} fell asleep dreaming of the {craft}.",
         s.moral("a little imagination can turn anything into an adventure", p=0.4)],
    ]


def treasure_hunt(s: Scene) -> Paragraphs:
    s.set(treasure=s.rng.choice(("shiny coins made of chocolate", "two {color} marbles and a whistle".format(**s.v),
                                 "a little book of stories", "two bags of sweet candy")))
    return [
        s.intro(s.rng.choice(("friend", "trait"))),
        ["{day}, {g} gave {h} an old map. It had a big red X on it.",
         s.say("{g}", "Follow the map, and you will find a treasure."),
         "{h} and {f} followed the map.",
         "First, they walked past the big tree. Then they went over the little bridge.",
         "Then they counted ten steps to the left."],
        ["At the X, they began to dig.",
         "They dug and dug. At last, they found a small wooden box!",
         s.maybe(0.5, "{h} wondered what was inside."),
         "Inside was a secret note and {treasure}.",
         "The note said: the best treasure is a good friend."],
        [s.one("{h} and {f} looked at each other and smiled.", "{h} laughed and hugged {f}."),
         "They shared the treasure and ran back to thank {g}.",
         s.moral("friends are the greatest treasure", "sharing makes everything better")],
    ]


def puddle_jumping(s: Scene) -> Paragraphs:
    return [
        s.intro(s.rng.choice(("trait", "hobby"))),
        ["One spring day, it rained all morning. When the rain stopped, there were puddles everywhere.",
         s.one("{h} put on {h.his} {color} boots.", "{h} put on {h.his} {color} boots and took {h.his} umbrella."),
         s.say("{p}", "You may play outside, but try to stay clean."),
         "{h} went outside and saw a big puddle.",
         "{h.He} jumped in with both feet. Splash! {h.He} jumped again. Splash, splash!",
         "Soon {h} was covered in mud, from {h.his} boots to {h.his} nose."],
        ["{h} looked down at {h.his} clothes. There was even mud in {h.his} shoes. Uh-oh.",
         "{h.He} walked slowly back to the house.",
         "{p} opened the door and saw {h.him}.",
         s.say("{h}", "I'm sorry. The puddles were too much fun."),
         "For a moment, {p} did not say anything. Then {p.he} laughed.",
         s.say("{p}", "I loved jumping in puddles when I was little, too!")],
        ["{p} gave {h} a warm bath with lots of bubbles.",
         s.maybe(0.5, "Then they went back out and jumped in the puddles together."),
         s.moral("getting dirty can be part of the fun", p=0.3)],
    ]


def careless_run(s: Scene) -> Paragraphs:
    _outdoors(s)
    return [
        s.intro("trait"),
        [s.one("{h} always ran everywhere. {h.He} ran to breakfast, ran to the door and ran to bed.",
               "{h} was always in a hurry. {h.He} rushed to breakfast, rushed to the door and rushed to bed."),
         s.say("{p}", "Slow down, {h}! You will fall."),
         "But {h} did not listen."],
        ["{day}, {h} was running {place.at} as fast as {h.he} could.",
         s.one("{h.He} did not see the big rock in the path.", "{h.He} did not see the big rock by the road."),
         "{h.He} tripped and fell down hard.",
         s.one("{h.His} knee was scraped, and it hurt a lot.", "{h.His} hands and knees stung."),
         "{h} cried and cried."],
        ["{p} cleaned the scrape and put a bandage on it.",
         s.say("{p}", "Running is fun, but you must watch where you go."),
         "{h} nodded.",
         "From then on, {h} still ran, but {h.he} always looked where {h.he} was going.",
         s.moral("it is good to be careful", "you should listen when someone tries to keep you safe")],
    ]


PLOTS: tuple[Plot, ...] = (
    plot(lost_toy), plot(new_friend), plot(stuck_kitten, animal_ok=False), plot(garden_seed), plot(race),
    plot(slippery_rocks), plot(hurt_bird), plot(sandcastle), plot(hungry_dog, animal_ok=False),
    plot(kite_stuck), plot(snow_day), plot(lost_child, animal_ok=False), plot(balloon_away), plot(picnic),
    plot(wish_on_star), plot(grumpy_neighbor, animal_ok=False), plot(small_helper),
    plot(pretend_adventure, animal_ok=False), plot(treasure_hunt), plot(puddle_jumping), plot(careless_run),
)
