"""Story plots about trips: the zoo, a farm, camping, a bug hunt, a boat ride, the market.

Same conventions as `plots_home`: paragraphs of sentence templates over the scene's cast.
These plots meet many animals and things, which keeps the vocabulary wide.
"""

from __future__ import annotations

from routescope.corpora import lexicon as lx
from routescope.corpora.stories import Paragraphs, Plot, Scene, plot, plural


def zoo_visit(s: Scene) -> Paragraphs:
    a1, a2, a3 = s.creatures(lx.ZOO_ANIMALS, 3)
    s.set(a3=a3, wear=s.rng.choice(("hat", "cap", "scarf")))
    return [
        s.intro(s.rng.choice(("trait", "hobby"))),
        [s.one("{day}, {h}'s class went to the zoo with {t}.", "{day}, {h} went to the zoo with {h.his} {p.kind}."),
         "At the gate, they showed their tickets.",
         f"First they saw {a1.a}.", s.animal_line(a1),
         f"Then they visited the {a2.many}.", s.animal_line(a2),
         f"{{h}}'s favorite was the {a3.word}.", s.animal_line(a3)],
        ["{h} leaned over the fence to get a closer look, and {h.his} {wear} fell into the pen!",
         "The {a3.word} sniffed the {wear}.",
         s.one("{h} was {scared} that the {a3.word} would eat it.", "{h} did not know what to do."),
         "A zookeeper came with a long stick and got the {wear} back.",
         s.say("{t}" if s.rng.random() < 0.5 else "{p}", "We must always stay behind the fence, {h}."),
         "{h} nodded and said sorry."],
        [s.one("On the way home, {h} told everyone about the {a3.word}.",
               "{h} could not stop talking about the {a3.many}."),
         "That night, {h.he} drew a picture of all the animals {h.he} had seen.",
         s.moral("wild animals should be watched from a safe place", "it is important to follow the rules", p=0.4)],
    ]


def farm_visit(s: Scene) -> Paragraphs:
    a1, a2, a3 = s.creatures([a for a in lx.FARM_ANIMALS if a != "lamb"], 3)
    return [
        s.intro(s.rng.choice(("trait", "family"))),
        [s.one("{day}, {h} went to visit {g} on {g.his} farm.", "Every summer, {h} stayed with {g} on the farm."),
         "{g} showed {h.him} all the animals.",
         f"There was {a1.a}.", s.animal_line(a1), f"There was {a2.a}.", s.animal_line(a2),
         f"And there was {a3.a}.", s.animal_line(a3),
         s.one("{h} helped feed the animals and collect the eggs.", "{h} gave the animals fresh water and hay.")],
        ["In the afternoon, they found the gate open. The little lamb was gone!",
         "{h} and {g} looked in the barn, behind the haystack and under the big tree.",
         "Then {h} heard a small sound: \"Baa!\"",
         s.one("The lamb was in the garden, eating {g}'s carrots!",
               "The lamb was standing in the pond, and it could not get out!"),
         "{h} gently led the lamb back to the field."],
        ["{g} closed the gate and laughed.",
         s.say("{g}", s.one("You are a real farmer now!", "Thank you, {h}. I could not have found it without you.")),
         s.one("{h} felt very {happy}.", "{h} smiled and gave the lamb a pat."),
         s.moral("taking care of animals is a big job", "it is important to close the gate", p=0.5)],
    ]


def camping(s: Scene) -> Paragraphs:
    s.place_where(lambda p: p.word in ("forest", "woods", "lake", "mountain"))
    night = s.creatures(("bat", "fox", "deer", "bear", "owl"), 1)[0]
    return [
        s.intro(s.rng.choice(("family", "trait"))),
        ["{day}, {h} and {h.his} family went camping {place.at}.",
         "They packed a tent, a lantern, a flashlight and warm blankets.",
         "{p} set up the tent, and {h} helped hold the poles.",
         s.maybe(0.5, "In the afternoon, {h} picked berries and found a mushroom as big as {h.his} hand."),
         "At night, they sat by the campfire and ate toasted marshmallows.",
         s.one("The stars sparkled in the sky.", "Fireflies glowed in the dark like tiny lanterns.")],
        ["Later, in the tent, {h} heard a strange noise. Something hooted in the dark: \"Hoo, hoo!\"",
         "{h} shivered. {h.He} held the flashlight tight.",
         s.say("{h}", "{p}, what is that?", "whispered"),
         "{p} pointed the flashlight at a tree. There sat a big owl, blinking its yellow eyes.",
         s.say("{p}", "It is just an owl saying good night."),
         s.maybe(0.5, f"Then {night.a} {night.move} past the tent and into the trees.")],
        ["{h} giggled.",
         s.say("{h}", "Good night, owl.", "whispered"),
         "{h.He} snuggled into {h.his} blanket and fell asleep listening to the sounds of the night.",
         s.moral("the night is full of friendly sounds", "things are less scary when you take a closer look", p=0.5)],
    ]


def bug_hunt(s: Scene) -> Paragraphs:
    s.toy_of("magnifying glass")
    s.place_where(lambda p: p.word in ("park", "garden", "meadow", "backyard", "forest", "field"))
    b1, b2, b3 = (lx.BUGS[w] for w in s.rng.sample([w for w in lx.BUGS if w != "bee"], 3))
    return [
        s.intro(s.rng.choice(("hobby", "trait", "toy"))),
        ["{day}, {h} went on a bug hunt {place.at} with {h.his} magnifying glass.",
         f"First, {{h.he}} found {b1}.", f"Then {{h.he}} saw {b2}.", f"Next, {{h.he}} spotted {b3}.",
         s.one("Everything looked so big through the glass!", "{h} wrote down every bug {h.he} found.")],
        ["Suddenly, a bee buzzed over and landed on {h.his} arm!",
         "{h} wanted to run, but {h.he} remembered what {g} had told {h.him}: stay calm and stand still.",
         "{h} stood very still. The bee walked along {h.his} arm, and then it flew away to a flower.",
         s.say("{h}", "Bye, little bee!", "whispered")],
        ["{h} ran home to tell {p} about everything {h.he} had seen.",
         s.say("{h}", "The bugs are so small, but they are very busy!"),
         s.moral("even small creatures are important", "staying calm helps when you are scared")],
    ]


def boat_trip(s: Scene) -> Paragraphs:
    sights = [lx.SEA_SIGHTS[w] for w in s.rng.sample(list(lx.SEA_SIGHTS), 3)]
    return [
        s.intro(s.rng.choice(("family", "trait"))),
        [s.one("{day}, {h} and {h.his} family went on a boat trip on the sea.",
               "{day}, {g} took {h} out on a big boat."),
         "{h} wore a bright orange life jacket.",
         "The boat rocked up and down on the waves.", *sights],
        ["But after a while, {h} began to feel sick from all the rocking.",
         s.one("{h.His} tummy felt funny, and {h.he} did not want to look at the water anymore.",
               "{h.He} held on to the rail and closed {h.his} eyes."),
         s.say("{p}" if s.rng.random() < 0.5 else "{g}", "Look far away at the land and take slow, deep breaths."),
         "{h} did that. Slowly, {h.he} felt better."],
        [s.one("Then {h} saw the most beautiful thing of all: a rainbow over the water.",
               "Soon {h} was smiling and waving at the seagulls."),
         s.one("When the boat came back, {h} could not wait to tell {f} all about it.",
               "It was a trip {h} would never forget."),
         s.moral("a little calm can help you feel better", p=0.3)],
    ]


def market_trip(s: Scene) -> Paragraphs:
    foods = [f for f in lx.FOODS if f.word in lx.MARKET_FOODS]
    items = [plural(f.word) if f.countable else f.word for f in s.rng.sample(foods, 4)]
    s.set(items=", ".join(items[:3]) + " and " + items[3], missing=items[3])
    return [
        s.intro("family"),
        ["{day}, {h} went to the market with {h.his} {p.kind}.",
         "They had a list: {items}.",
         "{h} carried the basket.",
         s.one("At the market, there were so many colors and smells!",
               "The market was busy and loud and full of good things."),
         "{h} helped pick the best food, and {p} paid for it."],
        ["At home, {p} looked in the basket. They had forgotten the {missing}!",
         s.one("{h} felt {sad}. {h.He} had wanted to help.", "{h} was worried that dinner was ruined."),
         s.say("{p}", "That's okay. We can make soup with what we have."),
         "{h} washed the food, and {p} cut it up. Then {h} stirred the pot.",
         "{h.He} tasted the soup and slurped it up."],
        [s.say("{h}", "Yum! It is so good!"),
         "That night, the whole family ate the soup together.",
         s.say("{p}", "You were a great helper today."),
         s.moral("you can make something good with what you have", p=0.5)],
    ]


PLOTS: tuple[Plot, ...] = (
    plot(zoo_visit, animal_ok=False), plot(farm_visit, animal_ok=False), plot(camping), plot(bug_hunt),
    plot(boat_trip, animal_ok=False), plot(market_trip, animal_ok=False),
)
