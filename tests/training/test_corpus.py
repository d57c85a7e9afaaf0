"""Tests for the synthetic story / math corpus."""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import io
import math
import random
import re
import zlib
from collections import Counter
from fractions import Fraction
from itertools import islice

import pytest

from routescope.corpora import corpus, lexicon, stories
from routescope.corpora.math_problems import MathProblem

HAS_SYMPY = importlib.util.find_spec("sympy") is not None


def _stories(n: int, seed: int = 0, tag: bool = False) -> list[stories.Story]:
    rng = random.Random(seed)
    return [stories.make_story(rng, corpus.PLOT_TEMPLATES, tag=tag) for _ in range(n)]


def _problems(n: int, seed: int = 0) -> list[MathProblem]:
    rng = random.Random(seed)
    return [corpus.math_problem(rng) for _ in range(n)]


# --- determinism and splits ---------------------------------------------------------------------


@pytest.mark.parametrize("domain", corpus.DOMAINS)
def test_same_seed_same_documents_different_seed_different(domain: str) -> None:
    first = list(islice(corpus.iter_documents(domain, seed=7), 20))
    again = list(islice(corpus.iter_documents(domain, seed=7), 20))
    other = list(islice(corpus.iter_documents(domain, seed=8), 20))
    assert first == again
    assert first != other
    assert len(set(first) & set(other)) < 3  # not merely shifted streams


def test_document_functions_depend_only_on_their_rng() -> None:
    assert corpus.story_document(random.Random(3)) == corpus.story_document(random.Random(3))
    assert corpus.math_document(random.Random(3)) == corpus.math_document(random.Random(3))
    assert corpus.math_problem(random.Random(5)) == corpus.math_problem(random.Random(5))


def test_stable_seed_is_not_python_hash() -> None:
    # crc32 of the joined parts: identical in every process, unlike the salted built-in hash().
    assert corpus.stable_seed("story", "train", 0) == zlib.crc32(b"story|train|0") == 3804394675


@pytest.mark.parametrize("domain", corpus.DOMAINS)
def test_validation_split_is_fixed_and_disjoint_from_train(domain: str) -> None:
    val = corpus.validation_documents(domain, 200)
    assert len(val) == 200
    # Drawing training documents first changes nothing: the validation stream has its own rng.
    list(islice(corpus.iter_documents(domain, corpus.VALIDATION_SEED, "train"), 300))
    assert list(islice(corpus.iter_documents(domain, corpus.VALIDATION_SEED, "val"), 200)) == val
    assert corpus.validation_documents(domain, 50) == val[:50]
    assert len(set(val)) >= 190
    train = set()
    for seed in (0, 1, corpus.VALIDATION_SEED):
        train.update(islice(corpus.iter_documents(domain, seed, "train"), 1500))
    assert not train & set(val)
    assert all(corpus.is_validation(doc) for doc in val)
    assert not any(corpus.is_validation(doc) for doc in train)


def test_validation_documents_returns_a_fresh_list() -> None:
    docs = corpus.validation_documents("math", 10)
    docs.clear()
    assert len(corpus.validation_documents("math", 10)) == 10


def test_bad_arguments_raise() -> None:
    with pytest.raises(ValueError):
        next(corpus.iter_documents("poetry", 0))
    with pytest.raises(ValueError):
        next(corpus.iter_documents("story", 0, split="test"))
    with pytest.raises(ValueError):
        next(corpus.iter_text({"story": 0.0, "math": 0.0}, 0))
    with pytest.raises(ValueError):
        next(corpus.iter_text({"story": -1.0, "math": 2.0}, 0))


def test_iter_text_mixes_deterministically_with_eot() -> None:
    mixed = list(islice(corpus.iter_text({"story": 0.5, "math": 0.5}, seed=1, split="train"), 60))
    assert mixed == list(islice(corpus.iter_text({"math": 0.5, "story": 0.5}, seed=1, split="train"), 60))
    assert all(doc.endswith(corpus.EOT) and doc.count(corpus.EOT) == 1 for doc in mixed)
    kinds = Counter("math" if doc.startswith("Question: ") else "story" for doc in mixed)
    assert 15 <= kinds["math"] <= 45 and 15 <= kinds["story"] <= 45
    # Each domain keeps its own stream, in order.
    stories_only = [d[: -len(corpus.EOT)] for d in mixed if not d.startswith("Question: ")]
    assert stories_only == list(islice(corpus.iter_documents("story", 1, "train"), len(stories_only)))


def test_iter_text_single_domain_and_zero_weight() -> None:
    only = list(islice(corpus.iter_text("math", seed=2, split="val"), 10))
    assert all(doc.startswith("Question: ") for doc in only)
    weighted = list(islice(corpus.iter_text({"story": 1.0, "math": 0.0}, seed=2, split="train"), 10))
    assert not any(doc.startswith("Question: ") for doc in weighted)


# --- stories ------------------------------------------------------------------------------------


def test_vocabulary_sizes() -> None:
    assert len(lexicon.NAMES) >= 200
    assert len(set(lexicon.NAMES)) == len(lexicon.NAMES)
    assert not set(lexicon.GIRL_NAMES) & set(lexicon.BOY_NAMES)
    assert set(lexicon.NAME_GENDER.values()) == {"f", "m"}
    assert len(lexicon.all_nouns()) >= 300
    assert len(lexicon.VERBS) >= 150
    assert len(corpus.PLOT_TEMPLATES) >= 30
    assert len({p.name for p in corpus.PLOT_TEMPLATES}) == len(corpus.PLOT_TEMPLATES)


def test_vocabulary_is_actually_used() -> None:
    sample = _stories(1500, seed=11)
    words = set(re.findall(r"[a-z]+", " ".join(s.text for s in sample).lower()))

    def seen(noun: str) -> bool:
        return any(all(w in words for w in form.split()) for form in (noun, stories.plural(noun)))

    unused_verbs = [v.base for v in lexicon.VERBS.values() if not {v.base, v.past, v.ing} & words]
    unused_nouns = [n for n in lexicon.all_nouns() if not seen(n)]
    assert len(unused_verbs) <= 0.05 * len(lexicon.VERBS), unused_verbs
    assert len(unused_nouns) <= 0.05 * len(lexicon.all_nouns()), unused_nouns
    assert sum(n.lower() in words for n in lexicon.NAMES) >= 0.9 * len(lexicon.NAMES)
    assert {s.plot for s in sample} == {p.name for p in corpus.PLOT_TEMPLATES}


def test_story_shape() -> None:
    for story in _stories(300, seed=2):
        text = story.text
        assert stories.MIN_WORDS <= len(text.split()) <= stories.MAX_WORDS
        assert not re.search(r"[{}\[\]]", text), text  # no unfilled template or leftover tag
        assert text[0].isupper() and text[-1] in '.!?"', text
        assert text.count('"') % 2 == 0, text
        for sentence in re.split(r"(?<=[.!?])\s+(?=[A-Z\"])", text):
            assert sentence[0].isupper() or sentence[0] == '"', sentence
        assert "  " not in text and " ," not in text and " ." not in text


def test_openings_look_like_tinystories() -> None:
    openings = Counter(s.text.split(",")[0] for s in _stories(400, seed=4))
    assert openings["Once upon a time"] >= 80
    assert any(s.text.startswith("There was a little") for s in _stories(100, seed=5))


PRONOUN = re.compile(r"\b(she|he|her|him|his|hers|herself|himself)\b(\[\[([fm]):([^\]]+)\]\])?", re.IGNORECASE)
FEMININE = {"she", "her", "hers", "herself"}


def test_pronouns_match_the_gender_of_their_character() -> None:
    genders = {**lexicon.NAME_GENDER, **lexicon.ADULTS}
    checked = 0
    for seed in range(300):
        tagged = stories.make_story(random.Random(seed), corpus.PLOT_TEMPLATES, tag=True)
        plain = stories.make_story(random.Random(seed), corpus.PLOT_TEMPLATES, tag=False)
        assert stories.strip_tags(tagged.text) == plain.text  # tags change nothing else
        for m in PRONOUN.finditer(tagged.text):
            word, tag, gender, name = m.group(1).lower(), m.group(2), m.group(3), m.group(4)
            assert tag, f"pronoun {word!r} not tied to a character in {tagged.plot}: {tagged.text}"
            assert (word in FEMININE) == (gender == "f"), tagged.text
            assert genders[name] == gender, name
            checked += 1
    assert checked > 1500


def test_introduced_children_have_matching_names() -> None:
    for story in _stories(300, seed=6):
        for kind, name in re.findall(r"\b(girl|boy) named ([A-Z][a-z]+)", story.text):
            assert lexicon.NAME_GENDER[name] == ("f" if kind == "girl" else "m"), story.text
        for kind, pronoun, name in re.findall(r"little (girl|boy)\. (Her|His) name was ([A-Z][a-z]+)", story.text):
            assert (kind, pronoun, lexicon.NAME_GENDER[name]) in {("girl", "Her", "f"), ("boy", "His", "m")}


# --- math ---------------------------------------------------------------------------------------


def run_like_a_notebook(code: str) -> str:
    """Run `code` in a fresh namespace; like a notebook cell, show the repr of a final bare expression."""
    tree = ast.parse(code)
    namespace: dict[str, object] = {}
    out = io.StringIO()
    last = tree.body[-1]
    shows_value = isinstance(last, ast.Expr) and not (
        isinstance(last.value, ast.Call) and isinstance(last.value.func, ast.Name) and last.value.func.id == "print")
    with contextlib.redirect_stdout(out):
        if shows_value:
            exec(compile(ast.Module(tree.body[:-1], type_ignores=[]), "<solution>", "exec"), namespace)
            print(repr(eval(compile(ast.Expression(last.value), "<solution>", "eval"), namespace)))
        else:
            exec(compile(tree, "<solution>", "exec"), namespace)
    return out.getvalue().rstrip("\n")


def boxed(text: str) -> str:
    """The content of the last \\boxed{...}, with nested braces."""
    start = text.rindex("\\boxed{") + len("\\boxed{")
    depth, i = 1, start
    while depth:
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        i += 1
    return text[start : i - 1]


def tex_to_fraction(answer: str) -> Fraction:
    m = re.fullmatch(r"(-?)\\frac\{(\d+)\}\{(\d+)\}", answer)
    if m:
        return Fraction(int(m[2]), int(m[3])) * (-1 if m[1] else 1)
    return Fraction(answer)


def test_math_document_format() -> None:
    for p in _problems(100, seed=1):
        doc = p.document
        assert doc.startswith(f"Question: {p.question}\nMy solution:\n")
        assert f"<llm-code>\n{p.code}\n</llm-code>\n<llm-code-output>\n{p.output}\n</llm-code-output>\n" in p.solution
        assert p.solution.count("\\boxed{") == 1 and p.solution.rstrip().endswith(".")
        assert p.solution.index("</llm-code-output>") < p.solution.index("\\boxed{")


def test_math_code_prints_its_output_block_and_boxed_answer_is_right() -> None:
    executed = 0
    for p in _problems(200, seed=3):
        assert boxed(p.solution) == p.answer
        assert tex_to_fraction(p.answer) == p.value
        # The printed number (float, fraction or a one-element sympy list) is the answer.
        assert Fraction(p.output.strip("[]")) == p.value, (p.output, p.value)
        if p.uses_sympy and not HAS_SYMPY:
            continue
        assert run_like_a_notebook(p.code) == p.output, p.code
        executed += 1
    assert executed >= 100


def _latex_value(expr: str) -> Fraction:
    """Evaluate the small LaTeX expressions the questions use, exactly, independently of the generator."""
    py = re.sub(r"\d+", lambda m: f"Fraction({m[0]})", expr)
    py = re.sub(r"\\frac\{(.+?)\}\{(.+?)\}", r"(\1/\2)", py)
    py = re.sub(r"\\sqrt\{(.+?)\}", r"isqrt(\1)", py)
    py = py.replace("\\times", "*").replace("\\cdot", "*").replace("\\div", "/").replace("^", "**")
    return eval(py, {"Fraction": Fraction, "isqrt": lambda f: Fraction(math.isqrt(int(f)))})


def _linear(side: str) -> tuple[int, int]:
    coef = const = 0
    for term in re.findall(r"[+-]?[^+-]+", side.replace(" ", "")):
        if term.endswith("x"):
            c = term[:-1]
            coef += 1 if c in ("", "+") else -1 if c == "-" else int(c)
        else:
            const += int(term)
    return coef, const


def recompute(p: MathProblem) -> Fraction | None:
    """The answer worked out from the question text alone, for the kinds that are easy to parse."""
    q, nums = p.question, [int(n) for n in re.findall(r"-?\d+", p.question)]
    maths = re.findall(r"\$([^$]+)\$", q)
    if p.kind == "linear_equation":
        (a1, b1), (a2, b2) = (_linear(s) for s in maths[-1].split("="))
        return Fraction(b2 - b1, a1 - a2)
    if p.kind in ("arithmetic", "fraction_arithmetic", "square_roots", "simplify_fraction"):
        return _latex_value(maths[0])
    if p.kind == "largest_fraction":
        values = [_latex_value(m) for m in maths]
        return max(values) if "largest" in q else min(values)
    if p.kind == "remainder":
        return Fraction(nums[0] % nums[1])
    if p.kind == "gcd_lcm":
        return Fraction((math.gcd if "greatest" in q else math.lcm)(nums[0], nums[1]))
    if p.kind == "percent":
        return Fraction(nums[0] * nums[1], 100)
    if p.kind == "slope":
        x1, y1, x2, y2 = nums[:4]
        return Fraction(y2 - y1, x2 - x1)
    if p.kind == "word_change":
        return Fraction(nums[2] - nums[0] - nums[1])
    if p.kind == "word_sharing":
        return Fraction(nums[0], nums[1])
    return None


def test_math_answers_match_an_independent_reading_of_the_question() -> None:
    checked = Counter()
    for p in _problems(600, seed=9):
        expected = recompute(p)
        if expected is not None:
            assert expected == p.value, (p.question, p.answer)
            checked[p.kind] += 1
    assert checked["linear_equation"] >= 20 and checked["arithmetic"] >= 10 and len(checked) >= 10


def test_math_covers_many_kinds_with_and_without_sympy() -> None:
    sample = _problems(1000, seed=4)
    kinds = Counter(p.kind for p in sample)
    assert len(kinds) >= 25
    assert 0.03 < sum(p.uses_sympy for p in sample) / len(sample) < 0.5
    assert sum(k.startswith("word_") for k in kinds.elements()) >= 300
    assert any("Express your answer as a common fraction." in p.question for p in sample)
    assert any(p.question.startswith("Solve for $x$:") for p in sample)
