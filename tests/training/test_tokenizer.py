"""Tests for the byte-level BPE tokenizer."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from tokenizers import Tokenizer, pre_tokenizers

from routescope.corpora import corpus
from routescope.core_models.training.tokenizer import SPECIAL_TOKENS, decode, encode, load_tokenizer, train_tokenizer

HOSTILE = [
    "",
    " ",
    "  leading and trailing  ",
    "emoji 😀👍🏽 and a family 👨‍👩‍👧‍👦 and flags 🇫🇮🇯🇵",
    "=cmd|' /C calc'!A0",
    "NUL\x00inside\x00\x00",
    "line\r\nbreaks\ttabs\n\n\r",
    "control \x01\x07\x1b[31mred\x1b[0m \x7f \x85 \u2028 \u2029",
    "مرحبا بالعالم",
    "שָׁלוֹם עוֹלָם",
    "mixed ltr עברית and العربية \u202etext\u202c",
    "combining e\u0301 n\u0303 a\u0308\u0304 Z\u0351\u0368\u0367",
    "4-byte 𝕏 𐍈 🀄 𠜎 \U0010fffd",
    "zero\u200bwidth\u200djoin\ufeffBOM",
    "CJK 日本語のテキスト 한국어",
    "tokens <|endoftext|> and <|pad|> in text<|endoftext|>",
    "<|endoftext|",
    "\\boxed{\\frac{3}{4}} <llm-code>print(1)</llm-code>",
]


@pytest.fixture(scope="module")
def small_tok() -> Tokenizer:
    return train_tokenizer(n_docs_per_domain=300, vocab_size=1000, seed=0)


@pytest.mark.parametrize("text", HOSTILE)
def test_round_trip_hostile_strings(small_tok: Tokenizer, text: str) -> None:
    assert decode(small_tok, encode(small_tok, text)) == text


def test_round_trip_random_unicode(small_tok: Tokenizer) -> None:
    rng = random.Random(0)

    def char() -> str:
        c = rng.randrange(0x110000) if rng.random() < 0.5 else rng.randrange(128)
        return chr(0xFFFD if 0xD800 <= c <= 0xDFFF else c)  # lone surrogates are not valid text

    for _ in range(200):
        text = "".join(char() for _ in range(rng.randint(1, 40)))
        assert decode(small_tok, encode(small_tok, text)) == text


def test_round_trip_corpus(small_tok: Tokenizer) -> None:
    for domain in corpus.DOMAINS:
        for doc in corpus.validation_documents(domain, 20):
            text = doc + corpus.EOT
            assert decode(small_tok, encode(small_tok, text)) == text


def test_special_tokens_are_single_ids(small_tok: Tokenizer) -> None:
    eot, pad = (small_tok.token_to_id(t) for t in SPECIAL_TOKENS)
    assert (eot, pad) == (0, 1)
    assert encode(small_tok, corpus.EOT) == [eot]
    assert encode(small_tok, corpus.PAD) == [pad]
    ids = encode(small_tok, f"One day.{corpus.EOT}Question:")
    assert ids.count(eot) == 1 and pad not in ids
    added = small_tok.get_added_tokens_decoder()
    assert {added[i].content for i in (eot, pad)} == set(SPECIAL_TOKENS)
    assert all(added[i].special for i in (eot, pad))


def test_every_byte_is_in_the_vocabulary(small_tok: Tokenizer) -> None:
    vocab = small_tok.get_vocab()
    assert all(symbol in vocab for symbol in pre_tokenizers.ByteLevel.alphabet())


def test_no_prefix_space(small_tok: Tokenizer) -> None:
    first = small_tok.encode("Once upon a time", add_special_tokens=False).tokens[0]
    assert first == "Once"


def test_training_is_deterministic_and_saves(small_tok: Tokenizer, tmp_path: Path) -> None:
    again = train_tokenizer(n_docs_per_domain=300, vocab_size=1000, seed=0)
    assert again.get_vocab() == small_tok.get_vocab()
    path = tmp_path / "tokenizer.json"
    small_tok.save(str(path))
    loaded = load_tokenizer(path)
    text = corpus.validation_documents("story", 1)[0]
    assert encode(loaded, text) == encode(small_tok, text)
    assert decode(loaded, encode(loaded, HOSTILE[3])) == HOSTILE[3]


def test_full_size_vocabulary() -> None:
    tok = train_tokenizer()  # the shipped settings: vocab 4096; trains in a few seconds
    assert abs(tok.get_vocab_size() - 4096) <= 4
    doc = corpus.validation_documents("story", 1)[0]
    assert decode(tok, encode(tok, doc)) == doc
    # Common story words are single tokens at this size.
    assert len(encode(tok, " little girl named Lily")) == 4
