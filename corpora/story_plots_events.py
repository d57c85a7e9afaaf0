"""Story plots about special days at home: dressing up, a storm, a birthday, a surprise, a pet.

Same conventions as `plots_home`: paragraphs of sentence templates over the scene's cast.
"""

from __future__ import annotations

from routescope.corpora import lexicon as lx
from routescope.corpora.stories import Paragraphs, Plot, Scene, article, plot


def dress_up(s: Scene) -> Paragraphs:
    w1, w2, w3, w4 = s.rng.sample(lx.WEARABLES, 4)
    s.set(w1=w1, outfit=f"{article(w1)}, {article(w2)} and {article(w3)}", w4=w4,
          role=s.rng.choice(("a pirate", "a magician", "a superhero", "an explorer", "a chef", "a famous singer")))
    return [
        s.intro(s.rng.choice(("trait", "hobby"))),
        ["{day}, it was too cold to play outside, so {g} took {h} up to the attic.",
         "In the attic, there was a big old trunk.",
         s.one("{h} opened it. It was full of old clothes!",
               "{h} lifted the heavy lid. Inside were lots of old clothes!"),
         "{h.He} put on {outfit}.",
         "{h.He} looked in the mirror and giggled.",
         s.maybe(0.4, "{g} combed {h.his} hair with an old comb."),
         s.say("{h}", "Look at me! I am {role}!")],
        ["{g} put on an old {w4} too, and they danced around the attic.",
         "But when {h} took a big bow, {h.his} {w1} tore!",
         "{h} was {scared}. {h.He} thought it was {g}'s favorite.",
         s.say("{g}", s.one("Don't worry. I can sew it.", "Oh, that is an easy fix!")),
         "{g} got a needle and some thread and sewed it back together."],
        ["That evening, {h} and {g} put on a show for the family.",
         s.one("Everyone clapped and cheered.", "{p} laughed so hard that {p.he} cried."),
         s.moral("you can have fun with old things", "accidents can be fixed", p=0.3)],
    ]


def lost_glasses(s: Scene) -> Paragraphs:
    spots = s.rng.sample(lx.HIDING_SPOTS, 4)
    s.set(spots=f"{spots[0]}, {spots[1]}, {spots[2]} and even {spots[3]}")
    return [
        s.intro(s.rng.choice(("family", "trait"))),
        ["{day}, {g} was reading with {h}.", "Then {g} got up to make some tea.",
         "When {g.he} came back, {g.he} could not find {g.his} glasses.",
         s.say("{g}", "Where are my glasses? I can't read without them!"),
         "{h} wanted to help."],
        ["They looked {spots}.", "But the glasses were not there.",
         s.maybe(0.5, "They found an old key and an empty bottle, but no glasses."),
         s.one("{g} sighed.", "{g} sat down in {g.his} chair."),
         "Then {h} looked up at {g} and started to laugh.",
         s.say("{h}", "{g}, your glasses are on your head!"),
         "{g} touched {g.his} head. There they were!",
         "{g} laughed so hard that {g.he} had to wipe {g.his} eyes."],
        [s.say("{g}", "What would I do without you, {h}?"),
         "Then {g} put on the glasses and read {h} a story.",
         s.moral("sometimes what you look for is right in front of you", p=0.4)],
    ]


def storm_night(s: Scene) -> Paragraphs:
    return [
        s.intro(s.rng.choice(("family", "trait"))),
        ["One night, there was a big storm.",
         "The wind howled, and the rain hit the windows.",
         "Thunder boomed! Lightning flashed! Then the lights went out.",
         "{h} shivered under {h.his} blanket.",
         s.say("{h}", "{p}! I'm scared!", "cried")],
        [s.one("{p} came in with a flashlight.", "{p} came in and lit a candle."),
         "{p.He} sat down on the bed.",
         s.say("{p}", "Let's count. After the lightning, we count until the thunder comes. "
                      "A big number means the storm is far away."),
         "Flash! One, two, three, four... boom!",
         "Flash! One, two, three, four, five, six, seven... boom!",
         "The storm was moving away!",
         "Then {p} made shadow animals on the wall with {p.his} hands: a bunny, a dog and a bird.",
         "{h} laughed and forgot to be {scared}."],
        ["In the morning, the sun was shining.",
         "There were puddles everywhere, and the flowers sparkled with raindrops.",
         s.moral("every storm comes to an end", "it helps to have someone with you when you are scared")],
    ]


def birthday_party(s: Scene) -> Paragraphs:
    opening = [s.intro("friend")] if s.rng.random() < 0.5 else []
    return [
        *opening,
        ["It was {h}'s birthday! Today {h.he} was {age} years old.",
         "{h} invited {f}, {f2} and all {h.his} friends to a party.",
         "{p} decorated the house with balloons and ribbons.",
         "There was a big cake with {age} candles on top."],
        ["Everyone came with presents wrapped in colorful paper.",
         "But {f} looked {sad}.",
         s.say("{f}", "I'm sorry, {h}. I forgot to bring a present."),
         "{h} smiled and took {f}'s hand.",
         s.say("{h}", "You came to my party. That is the best present!")],
        ["They joined hands and danced and played games.",
         "Then everyone sang \"Happy Birthday,\" and {h} blew out the candles.",
         "{h} made a wish. {h.He} wished that every day could be as fun as today.",
         s.one("It was the best way to celebrate.", "It was the best birthday ever."),
         s.moral("friends are better than presents", "the best gift is being together")],
    ]


def breakfast_surprise(s: Scene) -> Paragraphs:
    return [
        s.intro(s.rng.choice(("family", "food"))),
        ["{day}, {h} woke up very early. Everyone else was still asleep.",
         "{h.He} wanted to make breakfast for {p}.",
         "{h.He} tiptoed into the kitchen.",
         s.one("{h.He} poured some cereal into a bowl.", "{h.He} spread jam on a piece of bread."),
         "{h.He} cut a banana into little pieces with a fork."],
        ["But then {h.he} spilled the milk all over the table! Drip, drip, drip.",
         "{h.He} tried to clean it up with a towel, but it made a bigger mess.",
         "{h} felt {sad}. The surprise was ruined."],
        ["{p} came into the kitchen and saw {h} and the mess.",
         s.say("{h}", "I wanted to make you breakfast."),
         "{p} smiled and gave {h} a hug.",
         s.say("{p}", "This is the sweetest surprise ever."),
         "They cleaned up together and ate breakfast at the table.",
         s.moral("it is the thought that counts", "a kind idea matters more than a perfect one")],
    ]


def dog_fetch(s: Scene) -> Paragraphs:
    s.place_where(lambda p: p.word in ("park", "field", "meadow", "backyard", "beach"))
    return [
        s.intro(s.rng.choice(("trait", "family"))),
        ["{h} had a dog named {pet_name}. It had one white foot and a waggy tail.",
         "Every day, {h} and {pet_name} played fetch {place.at}.",
         "{h} tossed a stick, and {pet_name} ran to fetch it.",
         "{pet_name} always brought it back and licked {h}'s face."],
        ["{day}, a squirrel ran by. {pet_name} barked and chased it far away.",
         "{h} called, but {pet_name} did not come back.",
         "{h} looked everywhere. {h.He} was very {scared}.",
         "Then {h.he} remembered {pet_name}'s favorite game.",
         "{h.He} picked up a stick.",
         s.say("{h}", "{pet_name}! Fetch!", "shouted"),
         "{h.He} heard a happy bark. {pet_name} came running out of the bushes, wagging its tail."],
        ["{h} hugged {pet_name} tight.",
         "{pet_name} sniffed the stick and dropped it at {h}'s feet, ready to play again.",
         s.moral("a good friend always comes back", p=0.3)],
    ]


PLOTS: tuple[Plot, ...] = (
    plot(dress_up, animal_ok=False), plot(lost_glasses), plot(storm_night), plot(birthday_party),
    plot(breakfast_surprise, animal_ok=False), plot(dog_fetch, animal_ok=False),
)
