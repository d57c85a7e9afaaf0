"""GSM8K-style word problems with OpenMathInstruct-1-style solutions.

As in OpenMathInstruct-1, the code names every quantity, and often ends in a bare expression whose
value the notebook displays (its repr) instead of calling print. Divisions use `/`, so some outputs
are floats such as 6.0 while the boxed answer is 6; every division here comes out exact.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction

from routescope.corpora import lexicon as lx
from routescope.corpora.math_problems import MathProblem, build, py_float, tex
from routescope.corpora.stories import plural


@dataclass(frozen=True)
class Person:
    name: str
    he: str
    his: str
    him: str


def _person(rng: random.Random, avoid: str = "") -> Person:
    name = rng.choice([n for n in lx.NAMES if n != avoid])
    return Person(name, "she", "her", "her") if lx.NAME_GENDER[name] == "f" else Person(name, "he", "his", "him")


def _var(word: str) -> str:
    return word.replace(" ", "_").replace("-", "_")


def _show(rng: random.Random, code: str, var: str) -> str:
    """End the code the way OpenMathInstruct-1 does: a bare expression or a print."""
    return f"{code}\n{var}" if rng.random() < 0.5 else f"{code}\nprint({var})"


_INTRO = ("Let's solve this problem using Python code.", "Let's solve this problem using Python code.",
          "Let's compute the answer with Python.", "Let's write this down in Python step by step.")

# item, price range in dollars
_ITEMS = (("notebook", 2, 6), ("pencil", 1, 3), ("book", 5, 20), ("toy car", 3, 12), ("ticket", 4, 15),
          ("sandwich", 3, 9), ("pair of socks", 2, 8), ("plant", 4, 18), ("cupcake", 1, 4), ("comic book", 2, 7))
_EXTRAS = (("backpack", 15, 45), ("lunch box", 6, 14), ("board game", 10, 30), ("scarf", 8, 20), ("hat", 7, 25))


def shopping(rng: random.Random) -> MathProblem:
    p = _person(rng)
    item, lo, hi = rng.choice(_ITEMS)
    extra, elo, ehi = rng.choice(_EXTRAS)
    n, price, extra_price = rng.randint(2, 9), rng.randint(lo, hi), rng.randint(elo, ehi)
    value = Fraction(n * price + extra_price)
    items = "pairs of socks" if item == "pair of socks" else plural(item)
    question = (f"{p.name} buys {n} {items} for ${price} each and a {extra} for ${extra_price}. "
                f"How much money does {p.name} spend in total?")
    v = _var(items)
    code = _show(rng, f"{v}_price = {price}\nnumber_of_{v} = {n}\n{v}_cost = {v}_price * number_of_{v}\n"
                      f"{_var(extra)}_price = {extra_price}\ntotal_cost = {v}_cost + {_var(extra)}_price", "total_cost")
    return build("word_shopping", question, rng.choice(_INTRO), code, str(value), tex(value), value,
                 f"Thus {p.name} spends BOX dollars.")


def sharing(rng: random.Random) -> MathProblem:
    p = _person(rng)
    thing = rng.choice(("cookies", "stickers", "marbles", "candies", "apples", "crayons", "cards"))
    friends, each = rng.randint(2, 9), rng.randint(2, 12)
    total = friends * each
    value = Fraction(each)
    question = (f"{p.name} has {total} {thing} and shares them equally among {friends} friends. "
                f"How many {thing} does each friend get?")
    code = _show(rng, f"total_{thing} = {total}\nnumber_of_friends = {friends}\n"
                      f"{thing}_per_friend = total_{thing} / number_of_friends", f"{thing}_per_friend")
    return build("word_sharing", question, rng.choice(_INTRO), code, py_float(value), tex(value), value,
                 f"Thus each friend gets BOX {thing}.")


def saving(rng: random.Random) -> MathProblem:
    p = _person(rng)
    goal_item = rng.choice(("a bike", "a video game", "a guitar", "a new pair of shoes", "a telescope", "a skateboard"))
    weekly, weeks = rng.randint(3, 25), rng.randint(3, 20)
    goal = weekly * weeks
    value = Fraction(weeks)
    question = (f"{p.name} wants to buy {goal_item} that costs ${goal}. "
                f"{p.he.capitalize()} saves ${weekly} every week. "
                f"How many weeks will it take {p.him} to save enough money?")
    code = _show(rng, f"cost = {goal}\nsavings_per_week = {weekly}\nweeks_needed = cost / savings_per_week",
                 "weeks_needed")
    return build("word_saving", question, rng.choice(_INTRO), code, py_float(value), tex(value), value,
                 f"Thus it will take {p.name} BOX weeks.")


def pages_left(rng: random.Random) -> MathProblem:
    p = _person(rng)
    per_day, days = rng.randint(5, 40), rng.randint(2, 9)
    pages = per_day * days + rng.randint(10, 200)
    value = Fraction(pages - per_day * days)
    question = (f"{p.name} is reading a book with {pages} pages. {p.he.capitalize()} reads {per_day} pages every day. "
                f"How many pages are left after {days} days?")
    code = _show(rng, f"total_pages = {pages}\npages_per_day = {per_day}\nnumber_of_days = {days}\n"
                      f"pages_read = pages_per_day * number_of_days\npages_left = total_pages - pages_read",
                 "pages_left")
    return build("word_pages", question, rng.choice(_INTRO), code, str(value), tex(value), value,
                 "Thus BOX pages are left.")


def give_away(rng: random.Random) -> MathProblem:
    p = _person(rng)
    q = _person(rng, avoid=p.name)
    thing = rng.choice(("marbles", "stickers", "baseball cards", "seashells", "stamps"))
    part = rng.choice((2, 3, 4, 5))
    total = part * rng.randint(4, 20)
    lost = rng.randint(1, total - total // part - 1)
    value = Fraction(total - total // part - lost)
    question = (f"{p.name} had {total} {thing}. {p.he.capitalize()} gave 1/{part} of them to {q.name} "
                f"and then lost {lost}. How many {thing} does {p.name} have now?")
    v = _var(thing)
    code = _show(rng, f"{v} = {total}\n# gave away one part in {part}\ngiven_away = {v} / {part}\nlost = {lost}\n"
                      f"{v}_left = {v} - given_away - lost", f"{v}_left")
    return build("word_give_away", question, rng.choice(_INTRO), code, py_float(value), tex(value), value,
                 f"Thus {p.name} has BOX {thing} left.")


def distance(rng: random.Random) -> MathProblem:
    vehicle = rng.choice(("A train", "A car", "A bus", "A boat", "A cyclist"))
    speed, hours = rng.randint(8, 80), rng.randint(2, 9)
    value = Fraction(speed * hours)
    question = f"{vehicle} travels at {speed} miles per hour. How many miles does it travel in {hours} hours?"
    code = _show(rng, f"speed = {speed}\ntime_in_hours = {hours}\ndistance = speed * time_in_hours", "distance")
    return build("word_distance", question, rng.choice(_INTRO), code, str(value), tex(value), value,
                 "Thus it travels BOX miles.")


def ages(rng: random.Random) -> MathProblem:
    p = _person(rng)
    q = _person(rng, avoid=p.name)
    young, times, later = rng.randint(2, 12), rng.randint(2, 4), rng.randint(2, 15)
    value = Fraction(young * times + later)
    question = (f"{p.name} is {times} times as old as {q.name}. If {q.name} is {young} years old, "
                f"how old will {p.name} be in {later} years?")
    older, younger = f"{_var(p.name.lower())}_age", f"{_var(q.name.lower())}_age"
    code = _show(rng, f"{younger} = {young}\n{older} = {times} * {younger}\nage_in_{later}_years = {older} + {later}",
                 f"age_in_{later}_years")
    return build("word_ages", question, rng.choice(_INTRO), code, str(value), tex(value), value,
                 f"Thus {p.name} will be BOX years old.")


def rectangle(rng: random.Random) -> MathProblem:
    length, width = rng.randint(3, 40), rng.randint(2, 30)
    what = rng.choice(("garden", "room", "playground", "swimming pool", "field"))
    if rng.random() < 0.5:
        value = Fraction(length * width)
        question = (f"A rectangular {what} is {length} meters long and {width} meters wide. "
                    "What is its area in square meters?")
        code = _show(rng, f"length = {length}\nwidth = {width}\narea = length * width", "area")
        closing = "Thus the area is BOX square meters."
    else:
        value = Fraction(2 * (length + width))
        question = (f"A rectangular {what} is {length} meters long and {width} meters wide. "
                    f"How many meters of fence are needed to go all the way around it?")
        code = _show(rng, f"length = {length}\nwidth = {width}\nperimeter = 2 * (length + width)", "perimeter")
        closing = "Thus BOX meters of fence are needed."
    return build("word_rectangle", question, rng.choice(_INTRO), code, str(value), tex(value), value, closing)


def bake_sale(rng: random.Random) -> MathProblem:
    good = rng.choice(("cupcakes", "cookies", "muffins", "brownies", "pies"))
    monday, factor, price = rng.randint(10, 60), rng.choice((2, 3)), rng.randint(1, 6)
    value = Fraction((monday + monday * factor) * price)
    word = {2: "twice", 3: "three times"}[factor]
    question = (f"A bakery sells {good} for ${price} each. On Monday it sold {monday} {good}, and on Tuesday it sold "
                f"{word} as many. How much money did the bakery make on the two days?")
    code = _show(rng, f"price = {price}\nsold_monday = {monday}\nsold_tuesday = {factor} * sold_monday\n"
                      f"money_made = (sold_monday + sold_tuesday) * price", "money_made")
    return build("word_bake_sale", question, rng.choice(_INTRO), code, str(value), tex(value), value,
                 "Thus the bakery made BOX dollars.")


def practice_time(rng: random.Random) -> MathProblem:
    p = _person(rng)
    activity = rng.choice(("piano", "the violin", "soccer", "drawing", "reading", "swimming"))
    minutes, weeks = rng.choice((15, 20, 30, 45, 60, 90)), rng.randint(1, 8)
    while (minutes * 7 * weeks) % 60:
        weeks += 1
    value = Fraction(minutes * 7 * weeks, 60)
    question = (f"{p.name} practices {activity} for {minutes} minutes every day. "
                f"How many hours does {p.he} practice in {weeks} weeks?")
    code = _show(rng, f"minutes_per_day = {minutes}\ndays = 7 * {weeks}\ntotal_minutes = minutes_per_day * days\n"
                      f"total_hours = total_minutes / 60", "total_hours")
    return build("word_practice", question, rng.choice(_INTRO), code, py_float(value), tex(value), value,
                 f"Thus {p.name} practices for BOX hours.")


def discount(rng: random.Random) -> MathProblem:
    item = rng.choice(("jacket", "toy robot", "lamp", "pair of boots", "bicycle helmet", "tent"))
    off = rng.choice((10, 20, 25, 30, 40, 50))
    price = rng.choice([n for n in range(8, 200) if (n * off) % 100 == 0])
    value = Fraction(price * (100 - off), 100)
    question = f"A {item} costs ${price}. It is on sale for {off}% off. What is the sale price in dollars?"
    code = _show(rng, f"original_price = {price}\ndiscount_percent = {off}\n"
                      f"discount = original_price * discount_percent / 100\nsale_price = original_price - discount",
                 "sale_price")
    return build("word_discount", question, rng.choice(_INTRO), code, py_float(value), tex(value), value,
                 "Thus the sale price is BOX dollars.")


def change(rng: random.Random) -> MathProblem:
    p = _person(rng)
    a, b = rng.randint(2, 19), rng.randint(2, 19)
    bill = rng.choice([n for n in (20, 50, 100) if n > a + b])
    value = Fraction(bill - a - b)
    question = (f"{p.name} buys a book for ${a} and a game for ${b}. {p.he.capitalize()} pays with a ${bill} bill. "
                f"How much change does {p.he} get?")
    code = _show(rng, f"book_price = {a}\ngame_price = {b}\npaid = {bill}\nchange = paid - (book_price + game_price)",
                 "change")
    return build("word_change", question, rng.choice(_INTRO), code, str(value), tex(value), value,
                 f"Thus {p.name} gets BOX dollars in change.")


def egg_cartons(rng: random.Random) -> MathProblem:
    eggs, size = rng.randint(20, 300), rng.choice((6, 10, 12))
    if rng.random() < 0.5:
        value = Fraction(eggs // size)
        question = (f"A farmer collects {eggs} eggs and packs them in cartons of {size}. "
                    f"How many cartons can the farmer fill completely?")
        code = _show(rng, f"eggs = {eggs}\neggs_per_carton = {size}\nfull_cartons = eggs // eggs_per_carton",
                     "full_cartons")
        closing = "Thus the farmer can fill BOX cartons."
    else:
        value = Fraction(eggs % size)
        question = (f"A farmer collects {eggs} eggs and packs them in cartons of {size}. "
                    f"How many eggs are left over after filling as many cartons as possible?")
        code = _show(rng, f"eggs = {eggs}\neggs_per_carton = {size}\nleft_over = eggs % eggs_per_carton", "left_over")
        closing = "Thus BOX eggs are left over."
    return build("word_eggs", question, rng.choice(_INTRO), code, str(value), tex(value), value, closing)


WORD_KINDS: tuple[Callable[[random.Random], MathProblem], ...] = (
    shopping, sharing, saving, pages_left, give_away, distance, ages, rectangle, bake_sale, practice_time,
    discount, change, egg_cartons,
)
