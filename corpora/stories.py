"""Engine for TinyStories-like children's stories.

A story is a cast plus a plot template. Templates are `str.format` strings over the cast
("{h.He} ran to {h.his} {p.kind}."), so every pronoun comes from a character's gender: no template
can say "she" about a boy. With ``tag=True`` each pronoun is followed by ``[[f:Lily]]`` (gender and
referent) so tests can check that; the untagged text is identical apart from the tags.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from routescope.corpora import lexicon as lx

MIN_WORDS, MAX_WORDS = 80, 250
_TAG_OPEN, _TAG_CLOSE = "[[", "]]"


def article(phrase: str) -> str:
    """'a' or 'an' for `phrase` (by its first letter, which suffices for these word lists)."""
    return ("an " if phrase[0].lower() in "aeiou" else "a ") + phrase


def plural(word: str) -> str:
    irregular = {"mouse": "mice", "sheep": "sheep", "fish": "fish", "goose": "geese", "leaf": "leaves",
                 "deer": "deer", "tomato": "tomatoes", "potato": "potatoes", "candy": "candies"}
    if word in irregular:
        return irregular[word]
    if word.endswith("y") and word[-2] not in "aeiou":
        return word[:-1] + "ies"
    if word.endswith(("s", "x", "ch", "sh")):
        return word + "es"
    return word + "s"


def cap(text: str) -> str:
    return text[:1].upper() + text[1:]


# --- the cast -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Character:
    name: str
    gender: str  # "f" or "m"
    kind: str  # "girl", "bunny", "mom", "teacher", ...
    tag: bool = False

    def __str__(self) -> str:
        return self.name

    def _pronoun(self, female: str, male: str) -> str:
        word = female if self.gender == "f" else male
        return f"{word}{_TAG_OPEN}{self.gender}:{self.name}{_TAG_CLOSE}" if self.tag else word

    he = property(lambda self: self._pronoun("she", "he"))
    He = property(lambda self: self._pronoun("She", "He"))
    him = property(lambda self: self._pronoun("her", "him"))
    his = property(lambda self: self._pronoun("her", "his"))
    His = property(lambda self: self._pronoun("Her", "His"))
    himself = property(lambda self: self._pronoun("herself", "himself"))
    a_kind = property(lambda self: article(self.kind))


@dataclass(frozen=True)
class Thing:
    """A toy or ride with the adjective and the verb this story uses for it."""

    word: str
    adj: str
    use: lx.Phrase

    desc = property(lambda self: f"{self.adj} {self.word}")
    a = property(lambda self: article(self.desc))


@dataclass(frozen=True)
class Dish:
    word: str
    countable: bool

    many = property(lambda self: plural(self.word) if self.countable else self.word)


@dataclass(frozen=True)
class Bake:
    word: str
    many: bool

    a = property(lambda self: f"some {self.word}" if self.many else article(self.word))
    was = property(lambda self: "were" if self.many else "was")
    it = property(lambda self: "them" if self.many else "it")
    this_is = property(lambda self: "these are" if self.many else "this is")


@dataclass(frozen=True)
class Creature:
    """An animal met in a story (not a speaking character)."""

    word: str
    sound: str  # past tense of its sound verb, e.g. "barked"; "" for quiet animals
    move: str  # past tense of how it moves, e.g. "hopped"
    moving: str  # "hopping"
    cry: str  # what its sound looks like written down, e.g. "Woof!"; "" for quiet animals

    a = property(lambda self: article(self.word))
    many = property(lambda self: plural(self.word))
    noise = property(lambda self: self.sound or "looked up")


@dataclass(frozen=True)
class Spot:
    word: str
    at: str  # "in the park"
    act: lx.Phrase  # something to do there
    find: str  # something small lying there

    a_find = property(lambda self: article(self.find))


def _child(rng: random.Random, tag: bool, avoid: Sequence[str] = ()) -> Character:
    gender = rng.choice("fm")
    pool = lx.GIRL_NAMES if gender == "f" else lx.BOY_NAMES
    name = rng.choice([n for n in pool if n not in avoid])
    return Character(name, gender, "girl" if gender == "f" else "boy", tag)


def _animal_char(rng: random.Random, tag: bool, avoid: Sequence[str] = ()) -> Character:
    base = _child(rng, tag, avoid)
    return Character(base.name, base.gender, rng.choice(lx.HERO_ANIMALS).word, tag)


def _adult(rng: random.Random, names: Sequence[str], kind: str | None, tag: bool) -> Character:
    name = rng.choice(names)
    return Character(name, lx.ADULTS[name], kind or name.lower(), tag)


def _thing(rng: random.Random, nouns: Sequence[lx.Noun]) -> Thing:
    noun = rng.choice(nouns)
    return Thing(noun.word, rng.choice(noun.adjs), rng.choice(noun.uses))


def creature(animal: lx.Animal) -> Creature:
    sound = lx.VERBS[animal.sound].past if animal.sound else ""
    move = lx.VERBS[animal.move]
    return Creature(animal.word, sound, move.past, move.ing, lx.ANIMAL_CRIES.get(animal.sound, ""))


def _creature(rng: random.Random, animals: Sequence[lx.Animal]) -> Creature:
    return creature(rng.choice(animals))


def _dish(rng: random.Random) -> Dish:
    food = rng.choice(lx.FOODS)
    return Dish(food.word, food.countable)


def _spot(rng: random.Random, place: lx.Place) -> Spot:
    return Spot(place.word, f"{place.prep} the {place.word}", rng.choice(place.acts), rng.choice(place.finds))


# --- a scene: the cast plus helpers the plots call ----------------------------------------------


@dataclass
class Scene:
    rng: random.Random
    tag: bool = False
    animal_hero: bool = False
    v: dict[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        r = self.rng
        make = _animal_char if self.animal_hero else _child
        hero = make(r, self.tag)
        friend = make(r, self.tag, avoid=[hero.name])
        snack = r.choice(lx.SNACKS)
        color = r.choice(lx.COLORS)
        trait, trait2 = r.sample(lx.TRAITS, 2)  # two, so an opening and a description don't repeat
        self.v.update(
            h=hero, f=friend, f2=make(r, self.tag, avoid=[hero.name, friend.name]),
            p=_adult(r, lx.PARENTS, None, self.tag), g=_adult(r, lx.GRANDPARENTS, None, self.tag),
            t=_adult(r, lx.TEACHERS, "teacher", self.tag), d=_adult(r, lx.DOCTORS, "doctor", self.tag),
            n=_adult(r, lx.NEIGHBORS, "neighbor", self.tag),
            toy=_thing(r, lx.TOYS), ride=_thing(r, lx.RIDES), food=_dish(r), trait=trait, trait2=trait2,
            bake=Bake(*r.choice(lx.BAKES)), fruit=r.choice(lx.FRUITS), snack=snack, snack_a=article(snack),
            place=_spot(r, r.choice(lx.PLACES)), pet=_creature(r, lx.PETS), wild=_creature(r, lx.ANIMALS),
            pet_name=r.choice(lx.PET_NAMES), breakable=r.choice(lx.BREAKABLES),
            hobby=r.choice(HOBBIES), color=color, color_a=article(color),
            happy=r.choice(lx.HAPPY_FEELINGS), sad=r.choice(lx.SAD_FEELINGS),
            scared=r.choice(lx.SCARED_FEELINGS), day=r.choice(DAYS), later=r.choice(LATER),
            home=r.choice(lx.ANIMAL_HOMES if self.animal_hero else lx.SETTINGS),
            age=r.choice(("three", "four", "five", "six")),
        )

    def cast(self) -> tuple[Character, ...]:
        return tuple(c for c in self.v.values() if isinstance(c, Character))

    def set(self, **kw: object) -> None:
        self.v.update(kw)

    def place_where(self, pred: Callable[[lx.Place], bool]) -> Spot:
        """Re-pick the story's place among those matching `pred` (e.g. places with water)."""
        spot = _spot(self.rng, self.rng.choice([p for p in lx.PLACES if pred(p)]))
        self.v["place"] = spot
        return spot

    def toy_of(self, *words: str) -> Thing:
        """Re-pick the story's toy among the named ones (a kite story needs a kite)."""
        thing = _thing(self.rng, [t for t in lx.TOYS if t.word in words])
        self.v["toy"] = thing
        return thing

    def creatures(self, words: Sequence[str], k: int) -> list[Creature]:
        """k distinct animals among `words` (e.g. the zoo's), as met in a story."""
        pool = [a for a in lx.ANIMALS if a.word in words]
        return [creature(a) for a in self.rng.sample(pool, k)]

    def animal_line(self, c: Creature) -> str:
        """One sentence showing an animal: its sound if it makes one, else how it moves."""
        if c.sound and self.rng.random() < 0.6:
            return self.rng.choice((f"The {c.word} {c.sound} at them.", f'"{c.cry}" went the {c.word}.',
                                    f"{cap(c.a)} {c.sound} loudly."))
        return self.rng.choice((f"{cap(c.a)} {c.move} by.", f"They saw {c.a} {c.moving} around.",
                                f"The {c.word} {c.move} around."))

    def f(self, text: str) -> str:
        return cap(text.format(**self.v))

    def one(self, *options: str) -> str:
        return self.f(self.rng.choice(options))

    def maybe(self, p: float, *options: str) -> str:
        return self.one(*options) if self.rng.random() < p else ""

    def say(self, speaker: str, line: str, verb: str = "") -> str:
        """A line of dialogue, either '"Hi," said Tom.' or 'Tom said, "Hi."'."""
        who, words = self.f(speaker), self.f(line)
        verb = verb or ("asked" if words.endswith("?") else "said")
        if self.rng.random() < 0.6:
            inner = words[:-1] + "," if words.endswith(".") else words
            plain = strip_tags(who)
            # "said Tom" reads well with names, "she said" with pronouns; the check ignores tags so
            # tagged and plain stories consume the same random numbers.
            if plain.split(" ")[0] in ("She", "He", "Her", "His"):
                who = who[:1].lower() + who[1:]
                return f'"{inner}" {who} {verb}.'
            return f'"{inner}" {verb} {who}.' if self.rng.random() < 0.5 else f'"{inner}" {who} {verb}.'
        return f'{who} {verb}, "{words}"'

    def moral(self, *clauses: str, p: float = 0.6) -> str:
        """An optional closing moral, e.g. 'Lily learned that it is good to share.'."""
        if self.rng.random() >= p:
            return ""
        clause = self.rng.choice(clauses)
        return self.one(f"The moral of the story is that {clause}.", f"{{h}} learned that {clause}.",
                        f"From that day on, {{h}} knew that {clause}.")

    def intro(self, *focus: str) -> list[str]:
        openings = _ANIMAL_OPENINGS if self.animal_hero else _CHILD_OPENINGS
        return [self.one(*openings), *(self.one(*_FOCUS[f]) for f in focus)]


DAYS = ("One day", "One day", "One sunny day", "One morning", "One afternoon", "One bright morning",
        "One warm day", "One Saturday")
LATER = ("After a while", "Soon", "Then", "A little later", "After that")

HOBBIES = lx.phrases(
    "dance, sing songs, swim, climb trees, paint pictures, draw pictures, read books, write stories, "
    "count the stars, bake cookies, explore, skate, collect shells, gather acorns, watch the clouds, "
    "listen to the birds, hum songs, whistle, tell jokes, make things, build towers, play games, "
    "march around the house, tiptoe like a mouse, help others, decorate cakes, skip, hop, run fast, "
    "play outside, pick flowers, look at the stars, color pictures, sew, knit, sort buttons, "
    "stack blocks, race, ride in the wagon, chase butterflies, feed the ducks, jump in puddles, "
    "splash in the bath, play pretend, wiggle and giggle, imagine big adventures, paddle in the water, "
    "bang on pots and pans, crawl under the table, hop on one foot, watch the wheels of the trains"
)

_CHILD_OPENINGS = (
    "Once upon a time, there was a little {h.kind} named {h}.",
    "Once upon a time, there was a {trait} little {h.kind} named {h}.",
    "Once upon a time, in a {home}, there lived a little {h.kind} named {h}.",
    "There was a little {h.kind} named {h}.",
    "There was a little {h.kind}. {h.His} name was {h}.",
    "Once there was a {trait} {h.kind} named {h}.",
    "{h} was a {trait} little {h.kind}.",
    "{h} was a little {h.kind} who lived in a {home}.",
    "There was a little {h.kind} named {h}. {h.He} was {age} years old.",
    "Once upon a time, there was a {trait} {h.kind}. {h.His} name was {h}.",
)
_ANIMAL_OPENINGS = (
    "Once upon a time, there was a little {h.kind} named {h}.",
    "Once upon a time, in a {home}, there lived a little {h.kind} named {h}.",
    "There was a {trait} little {h.kind} named {h}.",
    "{h} was a little {h.kind} who lived in a {home}.",
    "Once upon a time, there was a {trait} {h.kind}. {h.His} name was {h}.",
    "Once there was a little {h.kind} named {h} who lived in a {home}.",
)
_FOCUS: dict[str, tuple[str, ...]] = {
    "toy": (
        "{h.He} had {toy.a} that {h.he} loved very much.",
        "{h.His} favorite toy was {toy.a}.",
        "{h.He} loved to {toy.use.base} {h.his} {toy.desc}.",
        "Every day, {h.he} {toy.use.past} {h.his} {toy.desc}.",
        "{h.He} loved {h.his} {toy.desc} more than anything.",
    ),
    "hobby": (
        "{h.He} loved to {hobby.base}.",
        "More than anything, {h.he} liked to {hobby.base}.",
        "Every day, {h.he} liked to {hobby.base}.",
        "{h.His} favorite thing was to {hobby.base}.",
    ),
    "place": (
        "{h.He} loved to play {place.at}.",
        "Every day, {h.he} went to the {place.word} to {place.act.base}.",
        "{h.He} liked to {place.act.base} {place.at}.",
    ),
    "friend": (
        "{h.He} had a best friend named {f}.",
        "{h.His} best friend was {f.a_kind} named {f}.",
        "{h} and {h.his} friend {f} liked to play together.",
    ),
    "trait": (
        "{h.He} was very {trait2}.",
        "Everyone said {h.he} was very {trait2}.",
        "{h.He} was {trait2} and always had a big smile.",
    ),
    "food": (
        "{h.He} loved to eat {food.many}.",
        "{h.His} favorite food was {food.many}.",
        "{h.He} liked {food.many} more than anything.",
    ),
    "family": (
        "{h.He} lived with {h.his} {p.kind} in a {home}.",
        "{h.He} loved {h.his} {p.kind} very much.",
        "{h.He} liked to help {h.his} {p.kind}.",
    ),
}

# --- plots --------------------------------------------------------------------------------------

Paragraphs = list[list[str]]


@dataclass(frozen=True)
class Plot:
    name: str
    write: Callable[[Scene], Paragraphs]
    animal_ok: bool


def plot(fn: Callable[[Scene], Paragraphs], animal_ok: bool = True) -> Plot:
    return Plot(fn.__name__, fn, animal_ok)


def render(paragraphs: Paragraphs) -> str:
    return "\n\n".join(" ".join(s for s in para if s) for para in paragraphs if any(para))


def strip_tags(text: str) -> str:
    out, i = [], 0
    while (j := text.find(_TAG_OPEN, i)) >= 0:
        out.append(text[i:j])
        i = text.index(_TAG_CLOSE, j) + len(_TAG_CLOSE)
    out.append(text[i:])
    return "".join(out)


@dataclass(frozen=True)
class Story:
    text: str
    plot: str
    cast: tuple[Character, ...]


def make_story(rng: random.Random, plots: Sequence[Plot], tag: bool = False) -> Story:
    """Draw a story of MIN_WORDS..MAX_WORDS words; redraws (from the same rng) when out of range."""
    for _ in range(50):
        chosen = rng.choice(plots)
        scene = Scene(rng, tag, animal_hero=chosen.animal_ok and rng.random() < 0.25)
        text = render([[scene.f(sentence) for sentence in para] for para in chosen.write(scene)])
        if MIN_WORDS <= len(text.split()) <= MAX_WORDS:
            return Story(text, chosen.name, scene.cast())
    raise RuntimeError("no story of acceptable length after 50 draws")  # plots are tuned to fit
