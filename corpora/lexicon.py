"""Word lists for the synthetic children's stories.

The lists are plain data: each entry carries just enough grammar (verb forms, which verbs fit an
object, which activities fit a place) for the story templates to stay grammatical whatever the dice
pick. Words are kept simple, as in TinyStories.
"""

from __future__ import annotations

from dataclasses import dataclass

# --- verbs --------------------------------------------------------------------------------------

# base, simple past, -ing form; written out because English spelling rules have too many exceptions.
_VERB_TABLE = """
play played playing|run ran running|jump jumped jumping|hop hopped hopping|skip skipped skipping
dance danced dancing|sing sang singing|swim swam swimming|climb climbed climbing|swing swung swinging
slide slid sliding|race raced racing|roll rolled rolling|spin spun spinning|twirl twirled twirling
splash splashed splashing|dig dug digging|build built building|paint painted painting|draw drew drawing
read read reading|write wrote writing|count counted counting|color colored coloring|bake baked baking
cook cooked cooking|explore explored exploring|hike hiked hiking|walk walked walking|march marched marching
crawl crawled crawling|fly flew flying|float floated floating|sail sailed sailing|ride rode riding
kick kicked kicking|throw threw throwing|catch caught catching|bounce bounced bouncing|push pushed pushing
pull pulled pulling|hug hugged hugging|cuddle cuddled cuddling|carry carried carrying|hold held holding
dress dressed dressing|blow blew blowing|bang banged banging|shake shook shaking|fill filled filling
look looked looking|see saw seeing|watch watched watching|find found finding|lose lost losing
search searched searching|hide hid hiding|chase chased chasing|follow followed following|eat ate eating
drink drank drinking|taste tasted tasting|smell smelled smelling|share shared sharing|give gave giving
take took taking|bring brought bringing|pick picked picking|plant planted planting|water watered watering
grow grew growing|wait waited waiting|help helped helping|fix fixed fixing|break broke breaking
clean cleaned cleaning|wash washed washing|sweep swept sweeping|tidy tidied tidying|open opened opening
close closed closing|drop dropped dropping|fall fell falling|trip tripped tripping|cry cried crying
laugh laughed laughing|giggle giggled giggling|smile smiled smiling|shout shouted shouting
whisper whispered whispering|say said saying|ask asked asking|tell told telling|answer answered answering
call called calling|yell yelled yelling|cheer cheered cheering|clap clapped clapping|wave waved waving
nod nodded nodding|think thought thinking|know knew knowing|learn learned learning
remember remembered remembering|forget forgot forgetting|wonder wondered wondering|wish wished wishing
hope hoped hoping|dream dreamed dreaming|sleep slept sleeping|nap napped napping|rest rested resting
wake woke waking|sit sat sitting|stand stood standing|feed fed feeding|pet petted petting
visit visited visiting|thank thanked thanking|listen listened listening|hear heard hearing|feel felt feeling
love loved loving|like liked liking|want wanted wanting|need needed needing|try tried trying
practice practiced practicing|make made making|mix mixed mixing|stir stirred stirring|pour poured pouring
cut cut cutting|glue glued gluing|sew sewed sewing|knit knitted knitting|wrap wrapped wrapping
paddle paddled paddling|skate skated skating|slip slipped slipping|peek peeked peeking
point pointed pointing|reach reached reaching|shine shone shining|sparkle sparkled sparkling
buzz buzzed buzzing|bark barked barking|chirp chirped chirping|quack quacked quacking|meow meowed meowing
roar roared roaring|hum hummed humming|whistle whistled whistling|stomp stomped stomping
tiptoe tiptoed tiptoeing|wiggle wiggled wiggling|waddle waddled waddling|gallop galloped galloping
flutter fluttered fluttering|squeak squeaked squeaking|growl growled growling|hoot hooted hooting
croak croaked croaking|moo mooed mooing|oink oinked oinking|neigh neighed neighing|cluck clucked clucking
collect collected collecting|gather gathered gathering|decorate decorated decorating|pack packed packing
buy bought buying|sniff sniffed sniffing|lick licked licking|squeeze squeezed squeezing
tickle tickled tickling|rock rocked rocking|wind wound winding|hurry hurried hurrying|rush rushed rushing
worry worried worrying|promise promised promising|forgive forgave forgiving|stay stayed staying
hurt hurt hurting|pretend pretended pretending|imagine imagined imagining|celebrate celebrated celebrating
invite invited inviting|join joined joining|save saved saving|rescue rescued rescuing|lift lifted lifting
toss tossed tossing|fetch fetched fetching|snuggle snuggled snuggling|yawn yawned yawning
sneeze sneezed sneezing|shiver shivered shivering|blink blinked blinking|glow glowed glowing
melt melted melting|bloom bloomed blooming|sprout sprouted sprouting
finish finished finishing|wobble wobbled wobbling|slurp slurped slurping|munch munched munching
nibble nibbled nibbling|scribble scribbled scribbling|stack stacked stacking|sort sorted sorting
toot tooted tooting|squawk squawked squawking|bray brayed braying|bleat bleated bleating|honk honked honking
sniffle sniffled sniffling
go went going|come came coming|get got getting|put put putting|turn turned turning
"""


@dataclass(frozen=True)
class Verb:
    base: str
    past: str
    ing: str


VERBS: dict[str, Verb] = {
    v.base: v
    for v in (Verb(*entry.split()) for entry in _VERB_TABLE.replace("\n", "|").split("|") if entry.strip())
}


@dataclass(frozen=True)
class Phrase:
    """A verb plus a fixed tail: "play with", "climb trees", "look at the stars"."""

    verb: str
    tail: str = ""

    def _join(self, form: str) -> str:
        return f"{form} {self.tail}" if self.tail else form

    @property
    def base(self) -> str:
        return self._join(VERBS[self.verb].base)

    @property
    def past(self) -> str:
        return self._join(VERBS[self.verb].past)

    @property
    def ing(self) -> str:
        return self._join(VERBS[self.verb].ing)


def phrases(spec: str) -> tuple[Phrase, ...]:
    """"play with, kick" -> (Phrase("play", "with"), Phrase("kick"))."""
    out = []
    for item in spec.split(","):
        verb, _, tail = item.strip().partition(" ")
        out.append(Phrase(verb, tail))
    return tuple(out)


# --- names --------------------------------------------------------------------------------------

# Only names that read clearly as one gender, so the pronouns in a story never look wrong.
GIRL_NAMES: tuple[str, ...] = tuple("""
Lily Mia Emma Sue Anna Lucy Sara Amy Zoe Ella Kate Molly Rosie Daisy Ruby Grace Chloe Sophie Lola Maya
Nina Jane Ivy Hannah Julia Olivia Ava Bella Clara Alice Eva Emily Nora Leah Hazel Poppy Millie Isla
Layla Stella Luna Jasmine Abby Sally Jenny Betty Katie Megan Tina Rita Wendy Polly Holly Penny Dora
Fiona Gina Heidi Iris Jill Kara Laura Lena Maria Nadia Paula Rosa Sofia Tara Vera Willow Zara Amelia
Aria Bonnie Cora Elsie Gemma Ida Kelly Lizzy Mabel Nell Olive Pearl Rose Sadie Tess Violet Amara
Priya Aisha Mei Yuki Leila Fatima Elena Naomi Ruth Lottie Freya Matilda Martha Phoebe Greta Hattie
June Beth Ellie Evie Fern Annie Susie
""".split())

BOY_NAMES: tuple[str, ...] = tuple("""
Tim Tom Ben Max Sam Jack Leo Jake Finn Noah Liam Owen Luke Ryan Adam Bob Billy Danny Eddie Frank
George Harry Henry Ian James Joe Kevin Larry Mark Mike Ned Oliver Paul Pete Rex Ricky Roy Sid Ted
Toby Victor Will Zack Timmy Tommy Bobby Jimmy Johnny Andy Arthur Oscar Hugo Felix Jasper Milo Otto
Rufus Ollie Alfie Archie Dylan Ethan Evan Gabe Hank Isaac Jonah Kai Lucas Mason Nate Omar Ravi Raj
Kenji Hiro Carlos Diego Mateo Ali Yusuf David Daniel Peter Simon Jacob Caleb Eli Aaron Ross Seth
Theo Walter Louis Ray Dan Carl Gus Hal Jay Kurt Lenny Neil Phil Stan Tyler Wes Bruno Chester Duke
Freddie Benny Spike Rocky
""".split())

NAME_GENDER: dict[str, str] = {**{n: "f" for n in GIRL_NAMES}, **{n: "m" for n in BOY_NAMES}}
NAMES: tuple[str, ...] = GIRL_NAMES + BOY_NAMES

# Grown-ups are named by their role, as children name them.
ADULTS: dict[str, str] = {
    "Mom": "f", "Dad": "m", "Grandma": "f", "Grandpa": "m", "Aunt May": "f", "Uncle Joe": "m",
    "Miss Rose": "f", "Mr. Brown": "m", "Mrs. Green": "f", "Mr. Lee": "m", "Dr. Anna": "f", "Dr. Peter": "m",
    "Mr. Gray": "m", "Mrs. Plum": "f", "Mr. Stone": "m", "Mrs. Bell": "f",
}
PARENTS = ("Mom", "Dad")
GRANDPARENTS = ("Grandma", "Grandpa")
TEACHERS = ("Miss Rose", "Mr. Brown", "Mrs. Green", "Mr. Lee")
DOCTORS = ("Dr. Anna", "Dr. Peter")
NEIGHBORS = ("Mr. Gray", "Mrs. Plum", "Mr. Stone", "Mrs. Bell")
# Pets get names too; none of these is also a child's name.
PET_NAMES = ("Snowball", "Whiskers", "Mittens", "Socks", "Pumpkin", "Buddy", "Spot", "Coco", "Pip", "Sunny",
             "Kiwi", "Biscuit", "Peanut", "Fluffy", "Patch", "Pepper", "Bubbles", "Button")

# --- nouns --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Noun:
    word: str
    uses: tuple[Phrase, ...] = ()
    adjs: tuple[str, ...] = ()


def _nouns(spec: str) -> tuple[Noun, ...]:
    """One noun a line: "word | use, use | adj adj"."""
    out = []
    for line in spec.strip().splitlines():
        word, uses, adjs = (part.strip() for part in line.split("|"))
        out.append(Noun(word, phrases(uses) if uses else (), tuple(adjs.split())))
    return tuple(out)


# Toys: small enough to carry, lose and share.
TOYS = _nouns("""
ball | kick, throw, bounce, roll | red blue yellow big bouncy
kite | fly | red yellow colorful big
doll | hug, dress, play with | pretty pink little soft
teddy bear | hug, cuddle, carry | soft brown fluffy old
toy car | push, race, play with | red fast shiny little
toy train | push, play with | blue long wooden shiny
toy boat | sail, float | little red wooden
toy plane | fly, throw | shiny silver little
robot | play with, wind up | shiny silver little
book | read, look at | big new old
drum | bang, play | loud red little
whistle | blow | shiny little loud
jump rope | skip with, jump with | long pink
hula hoop | spin, twirl | purple big
yo-yo | spin, play with | blue shiny
spinning top | spin | red little
crayon | draw with, color with, scribble with | green purple orange
paintbrush | paint with | little soft
rocking horse | ride, rock on | wooden old
balloon | hold, play with | red big shiny
bubble wand | blow bubbles with | pink little
puppet | play with | funny silly
marble | roll, toss | shiny blue
toy truck | push, play with | big yellow
stuffed bunny | hug, cuddle, snuggle with | soft white
wagon | pull | red little
toy dinosaur | play with, stomp around with | green big
xylophone | play | colorful little
trumpet | play, toot | shiny little
pinwheel | spin, blow on | colorful bright
snow globe | shake | pretty little
music box | wind, listen to | old pretty
tea set | play with | little pink
toy shovel | dig with | little red
harmonica | play | little shiny
magnifying glass | look through | big round
""")

# Rides: things a child rides rather than carries.
RIDES = _nouns("""
bike | ride | blue new shiny red
scooter | ride | pink new green
sled | ride, pull | wooden red
skateboard | ride | green cool
tricycle | ride | red little
""")



@dataclass(frozen=True)
class Food:
    word: str
    countable: bool  # "a cookie" or "some soup"


FOODS: tuple[Food, ...] = tuple(
    Food(word.replace("_", " "), countable=flag == "c")
    for word, flag in (item.split(":") for item in """
apple:c banana:c orange:c pear:c peach:c plum:c cherry:c strawberry:c carrot:c cookie:c cupcake:c
cake:c pie:c muffin:c sandwich:c pancake:c waffle:c cracker:c pretzel:c donut:c lollipop:c candy:u
ice_cream:u soup:u bread:u cheese:u honey:u milk:u juice:u lemonade:u pizza:u popcorn:u jam:u rice:u
pasta:u egg:c tomato:c potato:c watermelon:c melon:c blueberry:c nut:c chocolate:u cereal:u oatmeal:u
salad:u noodle:c grape:c cucumber:c corn:u pumpkin:c biscuit:c
""".split())
)

# Little things found outdoors and collected.
FINDS = tuple("""
flower leaf rock stone pebble shell stick feather acorn pinecone mushroom seed twig snowflake
berry clover daisy dandelion nest
""".split())

HOUSEHOLD = tuple("""
cup mug bowl plate spoon fork box basket blanket pillow lamp chair table bed door window clock vase
mirror broom bucket rug jar key bag bottle brush comb towel soap tub sink shelf drawer candle pot pan
kettle teapot radio map pencil paper glue tape sticker picture letter card gift present ribbon string
rope button coin ticket umbrella flashlight lantern tent ladder hammer nail wheel trunk glasses
""".split())

# Animals by where a story meets them.
ZOO_ANIMALS = ("lion", "tiger", "elephant", "monkey", "giraffe", "zebra", "kangaroo", "koala", "panda",
               "penguin", "seal", "bear", "parrot")
FARM_ANIMALS = ("cow", "pig", "sheep", "goat", "chicken", "hen", "horse", "donkey", "duck", "goose", "pony",
                "lamb")
BUGS = {  # a small creature and what it was doing when found
    "snail": "a snail crawling slowly across a leaf", "worm": "a long worm wiggling in the dirt",
    "ladybug": "a red ladybug sitting on a twig", "ant": "a line of ants marching to their home",
    "spider": "a spider spinning a web between two sticks", "bee": "a bee buzzing from flower to flower",
    "butterfly": "a butterfly fluttering over the daisies", "frog": "a little frog hopping into the grass",
}
SEA_SIGHTS = {
    "whale": "A big whale blew water high into the air.",
    "dolphin": "Two dolphins jumped out of the water and splashed back in.",
    "seal": "A fat seal was resting on a rock in the sun.",
    "crab": "On the rocks, a little crab walked sideways.",
    "fish": "Silver fish swam right under the boat.",
    "turtle": "A sea turtle swam slowly next to the boat.",
}
# Spots in a house where something can hide.
HIDING_SPOTS = ("under the rug", "in the drawer", "behind the clock", "on the shelf", "in the basket",
                "next to the teapot", "under the pillow", "behind the mirror", "in the kettle", "by the lamp",
                "in the bucket", "under the blanket", "in the tub", "by the sink", "in the mug", "under the chair")

# Things one wears singly ("a crown") and in pairs ("boots"); both count as nouns.
WEARABLES = tuple("""
hat cap scarf coat jacket sweater dress shirt skirt raincoat crown cape necklace bracelet ring bow belt
apron helmet tutu vest
""".split())
PAIRS = ("boot", "mitten", "glove", "sock", "shoe")
CLOTHES = WEARABLES + PAIRS + ("backpack", "swimsuit")


@dataclass(frozen=True)
class Animal:
    word: str
    sound: str  # verb key, or "" for quiet animals
    move: str  # verb key
    hero: bool  # suits a story told about the animal itself


ANIMALS: tuple[Animal, ...] = tuple(
    Animal(w, "" if s == "-" else s, m, h == "y")
    for w, s, m, h in (line.split() for line in """
cat meow run y|dog bark run y|puppy bark run y|kitten meow run y|bird chirp fly y|duck quack waddle y
frog croak hop y|fish - swim y|bunny - hop y|rabbit - hop y|mouse squeak run y|bear growl walk y
fox - run y|owl hoot fly y|squirrel - climb y|deer - run n|horse neigh gallop n|cow moo walk n
pig oink run y|sheep bleat walk n|goat bleat climb n|chicken cluck run n|hen cluck walk n|lion roar run y
tiger roar run n|elephant - walk y|monkey - climb y|giraffe - walk n|turtle - crawl y|snail - crawl n
bee buzz fly y|butterfly - flutter n|ladybug - crawl n|ant - march n|worm - wiggle n|spider - crawl n
whale - swim n|dolphin - swim n|crab - crawl n|penguin - waddle y|zebra - run n|bat - fly n
goose honk waddle n|swan - swim n|parrot squawk fly n|hamster squeak run y|pony neigh gallop y|lamb bleat skip y
donkey bray walk n|kangaroo - hop n|koala - climb n|panda - roll y|seal - swim n|hedgehog - run y
""".replace("|", "\n").strip().splitlines())
)
# How animal sounds are written, by sound verb.
ANIMAL_CRIES = {
    "meow": "Meow!", "bark": "Woof, woof!", "chirp": "Tweet, tweet!", "quack": "Quack, quack!", "croak": "Ribbit!",
    "squeak": "Squeak!", "growl": "Grrr!", "hoot": "Hoo, hoo!", "neigh": "Neigh!", "moo": "Moo!", "oink": "Oink, oink!",
    "cluck": "Cluck, cluck!", "roar": "Roar!", "buzz": "Buzz, buzz!", "squawk": "Squawk!", "bray": "Hee-haw!",
    "bleat": "Baa!", "honk": "Honk, honk!",
}
HERO_ANIMALS = tuple(a for a in ANIMALS if a.hero)
PETS = tuple(a for a in ANIMALS if a.word in {"cat", "dog", "puppy", "kitten", "bird", "fish", "bunny",
                                               "hamster", "turtle", "parrot", "mouse"})

# Things baked at home: the phrase and whether it is plural ("the cookies were ready").
BAKES: tuple[tuple[str, bool], ...] = (
    ("cake", False), ("cookies", True), ("pie", False), ("muffins", True), ("cupcakes", True),
    ("loaf of bread", False), ("biscuits", True), ("apple pie", False), ("pancakes", True),
    ("banana bread", False),
)
FRUITS = ("apples", "bananas", "strawberries", "grapes", "cherries", "peaches", "plums", "oranges", "pears",
          "blueberries")
MARKET_FOODS = ("apple", "banana", "orange", "pear", "peach", "plum", "cherry", "strawberry", "carrot", "tomato",
                "potato", "cucumber", "pumpkin", "corn", "egg", "bread", "cheese", "milk", "honey", "jam", "rice",
                "pasta", "grape", "melon", "blueberry", "nut", "noodle")
SNACKS = ("sandwich", "apple", "cookie", "muffin", "banana", "cracker", "pretzel", "biscuit")
OUTDOORS = ("park", "meadow", "field", "hill", "beach", "backyard", "playground", "garden", "forest")
BREAKABLES = ("vase", "cup", "plate", "bowl", "teapot", "jar", "mug")


@dataclass(frozen=True)
class Place:
    word: str
    prep: str  # "in the park", "on the beach"
    acts: tuple[Phrase, ...]  # things to do there, without an object pronoun
    finds: tuple[str, ...]  # small things lying around there


def _places(spec: str) -> tuple[Place, ...]:
    out = []
    for line in spec.strip().splitlines():
        word, prep, acts, finds = (part.strip() for part in line.split("|"))
        out.append(Place(word, prep, phrases(acts), tuple(finds.split())))
    return tuple(out)


PLACES = _places("""
park | in | run, play, swing on the swings, go down the slide, play tag, skip | flower leaf stick rock feather
garden | in | dig, plant seeds, water the flowers, pick flowers | flower leaf seed pebble
forest | in | explore, walk, climb trees, collect pinecones | pinecone acorn mushroom stick leaf feather berry
woods | in | explore, walk, hide behind the trees | pinecone acorn stick leaf
beach | on | swim, splash, build sandcastles, dig in the sand, collect shells | shell pebble stone feather
lake | at | swim, splash, skip stones | pebble stone feather
pond | by | splash, watch the ducks, look for frogs | pebble stone stick
river | by | splash, throw stones, watch the boats | pebble stone stick
farm | on | feed the animals, run, help in the barn | feather egg
playground | at | swing on the swings, go down the slide, climb, run, play tag | stick leaf
meadow | in | run, pick flowers, chase butterflies, roll in the grass | flower clover daisy dandelion
field | in | run, fly kites, play ball, roll in the grass | flower clover daisy rock
hill | on | roll down the grass, climb, run | rock flower
backyard | in | play, dig, run, jump | stick rock leaf
library | at | read, look at books | pencil
kitchen | in | cook, bake, help | spoon cup
bedroom | in | play, read, build towers | sock crayon
living room | in | play, dance, read, build forts | pillow blanket
classroom | in | read, draw, paint, sing songs, learn | pencil crayon
zoo | at | look at the animals, walk | feather
orchard | in | pick apples, climb trees | leaf apple
pool | at | swim, splash, float | coin
jungle | in | explore, climb trees, swing on vines | leaf feather
mountain | on | climb, hike | rock stone
cave | in | explore, look for treasure | rock stone
""")

# Where a story's hero lives, for openings like "in a small town, there lived ...".
SETTINGS = ("small town", "little village", "big city", "cozy house", "quiet town", "house by the sea",
            "little house on a hill", "sunny town", "busy town", "small house near the woods")
ANIMAL_HOMES = ("big forest", "green meadow", "little hole under a tree", "warm barn", "tall tree",
                "quiet pond", "sunny field", "cozy nest", "deep forest", "garden full of flowers")

SKY = tuple("sun moon star cloud rain rainbow snow wind sky storm thunder puddle".split())

# Everyday nouns the plots use directly (kept here so the vocabulary count reflects real use).
STORY_NOUNS = tuple("""
friend family home house school door window tree bush rock hole nest sky ground grass sand water mud
hand foot nose face eyes tears smile hug song game race picnic party birthday present card picture
morning afternoon evening night bedtime dinner lunch breakfast day week summer winter spring fall
light dark noise sound voice idea plan problem secret surprise treasure map castle fort tower
snowman sandcastle wave shell boat bridge road path fence gate hill top bottom corner room bed
""".split())

# --- adjectives ---------------------------------------------------------------------------------

HAPPY_FEELINGS = ("happy", "glad", "excited", "proud", "cheerful", "thankful", "joyful")
SAD_FEELINGS = ("sad", "upset", "unhappy", "sad")
SCARED_FEELINGS = ("scared", "afraid", "worried", "nervous")
TRAITS = ("kind", "curious", "brave", "shy", "playful", "gentle", "friendly", "clever", "cheerful",
          "helpful", "funny", "polite", "busy", "sweet", "happy", "silly", "smart")
COLORS = ("red", "blue", "green", "yellow", "pink", "purple", "orange", "brown", "white", "shiny")


def all_nouns() -> frozenset[str]:
    """Every distinct noun the story generator can emit."""
    words = {t.word for t in TOYS + RIDES} | {f.word for f in FOODS} | {a.word for a in ANIMALS}
    words |= {p.word for p in PLACES} | set(FINDS) | set(HOUSEHOLD) | set(CLOTHES) | set(SKY)
    return frozenset(words | set(STORY_NOUNS))
