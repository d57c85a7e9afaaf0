"""OpenMathInstruct-1-like math questions with code-interpreter solutions.

Every problem is built from numbers drawn first; the answer is computed here with exact arithmetic
(`fractions.Fraction`), and the `<llm-code-output>` block is formatted from that answer the way the
emitted code would print it. The code itself is never run here, so a test that runs it checks the two
against each other. Word problems live in `math_word_problems`.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction


@dataclass(frozen=True)
class MathProblem:
    kind: str
    question: str
    solution: str  # intro sentence, code, its output, closing sentence with \boxed{answer}
    code: str
    output: str  # exactly what `code` prints (or displays, when it ends in a bare expression)
    answer: str  # the \boxed{} content, e.g. "5", "\frac{3}{4}", "12.5"
    value: Fraction  # the answer as an exact number
    uses_sympy: bool = False

    @property
    def document(self) -> str:
        return f"Question: {self.question}\nMy solution:\n{self.solution}"


# --- formatting ---------------------------------------------------------------------------------


def tex(v: Fraction) -> str:
    """LaTeX for an exact number: 5, -3, \\frac{3}{4}, -\\frac{3}{4}."""
    if v.denominator == 1:
        return str(v.numerator)
    sign = "-" if v < 0 else ""
    return f"{sign}\\frac{{{abs(v.numerator)}}}{{{v.denominator}}}"


def decimal_str(v: Fraction) -> str:
    """A terminating decimal written out exactly: 16.5, 0.375."""
    assert _terminates(v), v
    return str(Decimal(v.numerator) / Decimal(v.denominator)) if v.denominator != 1 else str(v.numerator)


def _terminates(v: Fraction) -> bool:
    d = v.denominator
    for p in (2, 5):
        while d % p == 0:
            d //= p
    return d == 1


def py_float(v: Fraction) -> str:
    """How Python prints `v` computed as a float (one correctly rounded division, so exact here)."""
    return repr(float(v))


def signed(n: int) -> str:
    """' + 5' or ' - 5', for writing `3*x + 5` without '+ -5'."""
    return f" + {n}" if n >= 0 else f" - {-n}"


def minus(x: int, y: int) -> str:
    """Python text for x - y that reads naturally: '20 - 5', '20 + 5' for y = -5."""
    return f"{x}{signed(-y)}"


def term(a: int, var: str, times: str = "") -> str:
    """The term a*var as LaTeX (times="") or Python (times="*"): 3x, -x, x."""
    return var if a == 1 else f"-{var}" if a == -1 else f"{a}{times}{var}"


def linear(a: int, b: int, var: str = "x", times: str = "") -> str:
    return term(a, var, times) + (signed(b) if b else "")


def quadratic(a: int, b: int, c: int, times: str = "") -> str:
    """a x^2 + b x + c as LaTeX (times="") or Python (times="*"), skipping zero terms."""
    square = "x**2" if times else "x^2"
    middle = f"{signed(b)[:3]}{term(abs(b), 'x', times)}" if b else ""
    return term(a, square, times) + middle + (signed(c) if c else "")


def build(kind: str, question: str, intro: str, code: str, output: str, answer: str, value: Fraction,
          closing: str, sympy: bool = False) -> MathProblem:
    box = f"\\boxed{{{answer}}}"
    solution = (f"{intro}\n<llm-code>\n{code}\n</llm-code>\n<llm-code-output>\n{output}\n</llm-code-output>\n"
                f"{closing.replace('BOX', box)}")
    return MathProblem(kind, question, solution, code, output, answer, value, sympy)


def _nonzero(rng: random.Random, lo: int, hi: int) -> int:
    return rng.choice([n for n in range(lo, hi + 1) if n != 0])


# --- problem kinds ------------------------------------------------------------------------------

# (LaTeX, Python, exact value) for small expressions over a, b, c, d.
_EXPRESSIONS: tuple[Callable[[int, int, int, int], tuple[str, str, Fraction]], ...] = (
    lambda a, b, c, d: (f"{a} + {b} \\times {c}", f"{a} + {b} * {c}", Fraction(a + b * c)),
    lambda a, b, c, d: (f"{a} \\times {b} - {c}", f"{a} * {b} - {c}", Fraction(a * b - c)),
    lambda a, b, c, d: (f"({a} + {b}) \\times {c}", f"({a} + {b}) * {c}", Fraction((a + b) * c)),
    lambda a, b, c, d: (f"{a} \\cdot ({b} - {c}) + {d}", f"{a} * ({b} - {c}) + {d}", Fraction(a * (b - c) + d)),
    lambda a, b, c, d: (f"{a}^2 + {b}^2", f"{a}**2 + {b}**2", Fraction(a * a + b * b)),
    lambda a, b, c, d: (f"({a} - {b})^2", f"({a} - {b})**2", Fraction((a - b) ** 2)),
    lambda a, b, c, d: (f"{c}^3 - {a}", f"{c}**3 - {a}", Fraction(c**3 - a)),
    lambda a, b, c, d: (f"{a} - {b} + {c} \\times {d}", f"{a} - {b} + {c} * {d}", Fraction(a - b + c * d)),
)


def arithmetic(rng: random.Random) -> MathProblem:
    a, b, c, d = rng.randint(2, 60), rng.randint(2, 30), rng.randint(2, 12), rng.randint(2, 20)
    if rng.random() < 0.3:  # a division that comes out even: Python prints a float
        q = rng.randint(2, 12)
        b = q * rng.randint(2, 15)
        latex, py, value = f"{a} - {b} \\div {q}", f"{a} - {b} / {q}", Fraction(a) - Fraction(b, q)
        output = py_float(value)
    else:
        latex, py, value = rng.choice(_EXPRESSIONS)(a, b, c, d)
        output = str(value)
    question = rng.choice((f"Evaluate ${latex}$.", f"What is ${latex}$?", f"Compute ${latex}$.",
                           f"Find the value of ${latex}$."))
    code = rng.choice((f"print({py})", f"result = {py}\nprint(result)"))
    intro = rng.choice(("Let's use Python to evaluate the expression.", "We can compute this directly in Python.",
                        "Python follows the usual order of operations, so we can just evaluate it."))
    closing = rng.choice(("So the answer is $BOX$.", "Thus the value is $BOX$.", "The expression equals $BOX$."))
    return build("arithmetic", question, intro, code, output, tex(value), value, closing)


def linear_equation(rng: random.Random) -> MathProblem:
    a, b = _nonzero(rng, -9, 12), rng.randint(-20, 20)
    if rng.random() < 0.4:  # unknown on both sides: a x + b = c x + d
        c = rng.choice([n for n in range(-6, 8) if n not in (0, a)])
        d = rng.randint(-20, 20)
        lhs, rhs, value = linear(a, b), linear(c, d), Fraction(d - b, a - c)
        py_lhs, py_rhs = linear(a, b, times="*"), linear(c, d, times="*")
        plain = f"Fraction({minus(d, b)}, {minus(a, c)})"
    else:
        c = rng.randint(-30, 60)
        lhs, rhs, value = linear(a, b), str(c), Fraction(c - b, a)
        py_lhs, py_rhs = linear(a, b, times="*"), str(c)
        plain = f"Fraction({minus(c, b)}, {a})"
    fraction_note = "" if value.denominator == 1 else " Express your answer as a common fraction."
    question = rng.choice((f"Solve for $x$: ${lhs} = {rhs}$.", f"What value of $x$ satisfies ${lhs} = {rhs}$?",
                           f"Find $x$ if ${lhs} = {rhs}$.")) + fraction_note
    closing = rng.choice(("So $x = BOX$.", "Thus the solution is $x = BOX$.", "Therefore $x = BOX$."))
    if rng.random() < 0.5:
        code = (f"from sympy import symbols, Eq, solve\n\nx = symbols('x')\nequation = Eq({py_lhs}, {py_rhs})\n"
                f"solution = solve(equation, x)\nprint(solution)")
        intro = rng.choice(("Let's use sympy to solve for $x$.", "We can solve this linear equation with sympy."))
        return build("linear_equation", question, intro, code, f"[{value}]", tex(value), value, closing, sympy=True)
    code = (f"from fractions import Fraction\n\n# {lhs} = {rhs}, so x is the constant over the coefficient\n"
            f"x = {plain}\nprint(x)")
    intro = "Moving the $x$ terms to one side and the constants to the other, we can compute $x$ exactly."
    return build("linear_equation", question, intro, code, str(value), tex(value), value, closing)


def _frac(rng: random.Random) -> Fraction:
    q = rng.randint(2, 12)
    return Fraction(rng.randint(1, 2 * q - 1), q)


def fraction_arithmetic(rng: random.Random) -> MathProblem:
    x, y = _frac(rng), _frac(rng)
    op = rng.choice("+-*/")
    value = {"+": x + y, "-": x - y, "*": x * y, "/": x / y}[op]
    latex_op = {"+": "+", "-": "-", "*": "\\cdot", "/": "\\div"}[op]
    latex = f"{tex(x)} {latex_op} {tex(y)}"
    question = rng.choice((f"What is ${latex}$?", f"Compute ${latex}$.", f"Find ${latex}$.")) + \
        rng.choice((" Express your answer as a common fraction.", " Express your answer in simplest form."))
    code = (f"from fractions import Fraction\n\nresult = Fraction({x.numerator}, {x.denominator}) {op} "
            f"Fraction({y.numerator}, {y.denominator})\nprint(result)")
    intro = rng.choice(("Python's fractions module keeps the arithmetic exact.",
                        "Let's use the Fraction class so we get an exact answer."))
    closing = rng.choice(("So the answer is $BOX$.", f"Thus ${latex} = BOX$."))
    return build("fraction_arithmetic", question, intro, code, str(value), tex(value), value, closing)


def simplify_fraction(rng: random.Random) -> MathProblem:
    base = Fraction(rng.randint(1, 20), rng.randint(2, 21))
    k = rng.randint(2, 9)
    num, den = base.numerator * k, base.denominator * k
    question = rng.choice((f"Simplify $\\frac{{{num}}}{{{den}}}$.",
                           f"Write $\\frac{{{num}}}{{{den}}}$ in lowest terms."))
    code = f"from fractions import Fraction\n\nprint(Fraction({num}, {den}))"
    intro = "Fraction divides the numerator and the denominator by their greatest common divisor."
    return build("simplify_fraction", question, intro, code, str(base), tex(base), base,
                 "So the simplified fraction is $BOX$.")


def largest_fraction(rng: random.Random) -> MathProblem:
    values: list[Fraction] = []
    while len(values) < rng.choice((3, 4)):
        f = Fraction(rng.randint(1, 11), rng.randint(2, 12))
        if f not in values and f.denominator != 1:
            values.append(f)
    want_max = rng.random() < 0.6
    value = max(values) if want_max else min(values)
    word, fn = ("largest", "max") if want_max else ("smallest", "min")
    listed = ", ".join(f"${tex(v)}$" for v in values)
    question = f"Which of the numbers {listed} is the {word}? Express your answer as a common fraction."
    listed_py = ", ".join(f"Fraction({v.numerator}, {v.denominator})" for v in values)
    code = f"from fractions import Fraction\n\nnumbers = [{listed_py}]\nprint({fn}(numbers))"
    return build("largest_fraction", question, "Let's compare the fractions exactly in Python.", code,
                 str(value), tex(value), value, f"The {word} number is $BOX$.")


def largest_prime_factor(rng: random.Random) -> MathProblem:
    n = 1
    while n < 30:
        n = rng.choice((2, 3, 5, 7, 11, 13)) * rng.choice((2, 3, 5, 7, 11, 13, 17, 19, 23)) * rng.randint(1, 12)
    factors, m, p = [], n, 2
    while m > 1:
        while m % p == 0:
            factors.append(p)
            m //= p
        p += 1
    value = Fraction(max(factors))
    question = f"What is the largest prime factor of ${n}$?"
    if rng.random() < 0.5:
        code = f"from sympy import primefactors\n\nprint(max(primefactors({n})))"
        return build("largest_prime_factor", question, "sympy can list the prime factors for us.", code,
                     str(value), tex(value), value, "The largest prime factor is $BOX$.", sympy=True)
    code = (f"n = {n}\nfactors = []\nd = 2\nwhile n > 1:\n    while n % d == 0:\n        factors.append(d)\n"
            f"        n //= d\n    d += 1\nprint(max(factors))")
    return build("largest_prime_factor", question, "Let's factor the number by trial division.", code,
                 str(value), tex(value), value, "So the largest prime factor is $BOX$.")


def largest_integer(rng: random.Random) -> MathProblem:
    a, b = rng.randint(2, 9), rng.randint(-10, 15)
    c = rng.randint(b + a + 1, b + 12 * a)
    value = Fraction(max(n for n in range(-100, 200) if a * n + b < c))
    question = f"What is the largest integer $n$ such that ${linear(a, b, 'n')} < {c}$?"
    code = f"print(max(n for n in range(-100, 200) if {linear(a, b, 'n', '*')} < {c}))"
    return build("largest_integer", question, "We can simply check the integers in a wide range.", code,
                 str(value), tex(value), value, "So the largest such integer is $BOX$.")


def gcd_lcm(rng: random.Random) -> MathProblem:
    g = rng.randint(2, 15)
    a, b = g * rng.randint(2, 12), g * rng.randint(2, 12)
    if a == b:
        b += g
    if rng.random() < 0.5:
        value, name, fn = Fraction(math.gcd(a, b)), "greatest common divisor", "gcd"
    else:
        value, name, fn = Fraction(math.lcm(a, b)), "least common multiple", "lcm"
    question = f"What is the {name} of ${a}$ and ${b}$?"
    code = f"import math\n\nprint(math.{fn}({a}, {b}))"
    return build("gcd_lcm", question, f"Python's math module has a {fn} function.", code, str(value),
                 tex(value), value, f"The {name} is $BOX$.")


def percent_of(rng: random.Random) -> MathProblem:
    p = rng.choice((5, 10, 12, 15, 20, 25, 30, 35, 40, 45, 50, 60, 75, 80, 90, 120, 150))
    n = rng.choice([k for k in range(8, 400, 4)])
    value = Fraction(n * p, 100)
    question = f"What is ${p}\\%$ of ${n}$?" + ("" if value.denominator == 1 else " Express your answer as a decimal.")
    code = f"print({n} * {p} / 100)"
    return build("percent", question, f"{p} percent of {n} is {n} times {p} divided by 100.", code,
                 py_float(value), decimal_str(value), value, "So the answer is $BOX$.")


def mean(rng: random.Random) -> MathProblem:
    count = rng.choice((2, 4, 5))
    numbers = [rng.randint(1, 99) for _ in range(count)]
    value = Fraction(sum(numbers), count)
    listed = ", ".join(map(str, numbers[:-1])) + f" and {numbers[-1]}"
    question = f"What is the arithmetic mean of {listed}?" + (
        "" if value.denominator == 1 else " Express your answer as a decimal.")
    code = f"numbers = [{', '.join(map(str, numbers))}]\nprint(sum(numbers) / len(numbers))"
    return build("mean", question, "The mean is the sum divided by how many numbers there are.", code,
                 py_float(value), decimal_str(value), value, "The mean is $BOX$.")


def evaluate_polynomial(rng: random.Random) -> MathProblem:
    a, b, c, x0 = _nonzero(rng, -4, 5), rng.randint(-9, 9), rng.randint(-12, 12), rng.randint(-5, 6)
    value = Fraction(a * x0 * x0 + b * x0 + c)
    poly_tex, poly_py = quadratic(a, b, c), quadratic(a, b, c, times="*")
    if rng.random() < 0.5:
        question = f"If $f(x) = {poly_tex}$, what is $f({x0})$?"
        code = f"def f(x):\n    return {poly_py}\n\nprint(f({x0}))"
        return build("evaluate_polynomial", question, "Let's define the function in Python and call it.", code,
                     str(value), tex(value), value, f"So $f({x0}) = BOX$.")
    question = f"Evaluate ${poly_tex}$ when $x = {x0}$."
    code = f"from sympy import symbols\n\nx = symbols('x')\nexpr = {poly_py}\nprint(expr.subs(x, {x0}))"
    return build("evaluate_polynomial", question, "Let's substitute the value with sympy.", code, str(value),
                 tex(value), value, "The expression equals $BOX$.", sympy=True)


def remainder(rng: random.Random) -> MathProblem:
    n, d = rng.randint(100, 9999), rng.randint(3, 13)
    value = Fraction(n % d)
    return build("remainder", f"What is the remainder when ${n}$ is divided by ${d}$?",
                 "The modulo operator gives the remainder.", f"print({n} % {d})", str(value), tex(value), value,
                 "The remainder is $BOX$.")


def count_multiples(rng: random.Random) -> MathProblem:
    k, limit = rng.randint(3, 15), rng.randint(40, 300)
    value = Fraction(len([n for n in range(1, limit) if n % k == 0]))
    question = rng.choice((f"How many positive multiples of ${k}$ are less than ${limit}$?",
                           f"How many positive integers less than ${limit}$ are divisible by ${k}$?"))
    code = f"count = len([n for n in range(1, {limit}) if n % {k} == 0])\nprint(count)"
    return build("count_multiples", question, "Let's count them with a list comprehension.", code, str(value),
                 tex(value), value, "There are $BOX$ such numbers.")


def sum_range(rng: random.Random) -> MathProblem:
    lo, hi = rng.randint(1, 20), rng.randint(25, 120)
    if rng.random() < 0.5:
        value = Fraction(sum(range(lo, hi + 1)))
        question = f"What is the sum of all integers from ${lo}$ to ${hi}$, inclusive?"
        code = f"print(sum(range({lo}, {hi + 1})))"
    else:
        value = Fraction(sum(range(1, 2 * hi, 2)))
        question = f"What is the sum of the first ${hi}$ positive odd integers?"
        code = f"print(sum(range(1, {2 * hi}, 2)))"
    return build("sum_range", question, "Python's range and sum make this quick.", code, str(value), tex(value),
                 value, "The sum is $BOX$.")


def count_divisors(rng: random.Random) -> MathProblem:
    n = rng.choice((12, 18, 20, 24, 28, 30, 36, 40, 42, 45, 48, 50, 54, 56, 60, 64, 72, 80, 84, 90, 96, 100,
                    108, 120, 126, 144, 150, 180, 200, 210, 240, 360))
    value = Fraction(len([d for d in range(1, n + 1) if n % d == 0]))
    question = f"How many positive divisors does ${n}$ have?"
    if rng.random() < 0.4:
        code = f"from sympy import divisor_count\n\nprint(divisor_count({n}))"
        return build("count_divisors", question, "sympy has a function that counts divisors.", code, str(value),
                     tex(value), value, f"So ${n}$ has $BOX$ positive divisors.", sympy=True)
    code = f"divisors = [d for d in range(1, {n + 1}) if {n} % d == 0]\nprint(len(divisors))"
    return build("count_divisors", question, "Let's list the divisors and count them.", code, str(value),
                 tex(value), value, f"So ${n}$ has $BOX$ positive divisors.")


def slope(rng: random.Random) -> MathProblem:
    x1, y1, y2 = rng.randint(-9, 9), rng.randint(-9, 9), rng.randint(-9, 12)
    x2 = rng.choice([n for n in range(-9, 12) if n != x1])
    value = Fraction(y2 - y1, x2 - x1)
    question = f"What is the slope of the line passing through $({x1}, {y1})$ and $({x2}, {y2})$?" + \
        ("" if value.denominator == 1 else " Express your answer as a common fraction.")
    code = (f"from fractions import Fraction\n\nx1, y1 = {x1}, {y1}\nx2, y2 = {x2}, {y2}\n"
            f"slope = Fraction(y2 - y1, x2 - x1)\nprint(slope)")
    return build("slope", question, "The slope is the change in $y$ over the change in $x$.", code, str(value),
                 tex(value), value, "The slope is $BOX$.")


def decimal_to_fraction(rng: random.Random) -> MathProblem:
    den = rng.choice((4, 5, 8, 16, 20, 25, 40, 50, 125))
    num = rng.choice([n for n in range(1, den) if Fraction(n, den).denominator > 2])
    value = Fraction(num, den)
    dec = decimal_str(value)
    question = f"Express ${dec}$ as a common fraction in lowest terms."
    code = f"from fractions import Fraction\n\nprint(Fraction('{dec}'))"
    return build("decimal_to_fraction", question, "Fraction can read the decimal exactly from a string.", code,
                 str(value), tex(value), value, f"So ${dec} = BOX$.")


def square_roots(rng: random.Random) -> MathProblem:
    a, b = rng.randint(2, 20), rng.randint(2, 20)
    op = rng.choice("+-*")
    value = Fraction({"+": a + b, "-": a - b, "*": a * b}[op])
    latex_op = {"+": "+", "-": "-", "*": "\\cdot"}[op]
    question = f"What is $\\sqrt{{{a * a}}} {latex_op} \\sqrt{{{b * b}}}$?"
    code = f"import math\n\nprint(math.sqrt({a * a}) {op} math.sqrt({b * b}))"
    return build("square_roots", question, "Let's compute the square roots with Python.", code, py_float(value),
                 tex(value), value, "So the answer is $BOX$.")


KINDS: tuple[Callable[[random.Random], MathProblem], ...] = (
    arithmetic, linear_equation, fraction_arithmetic, simplify_fraction, largest_fraction, largest_prime_factor,
    largest_integer, gcd_lcm, percent_of, mean, evaluate_polynomial, remainder, count_multiples, sum_range,
    count_divisors, slope, decimal_to_fraction, square_roots,
)
