"""Byte-level BPE tokenizer trained on the synthetic corpus (HF `tokenizers`).

Byte-level pre-tokenization with the full 256-symbol byte alphabet in the initial vocabulary means
every string (emoji, right-to-left scripts, control characters, NUL) maps to tokens, and decoding
gives back exactly the input. There is no normalizer, and no prefix space is added, because either
would change the text.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from itertools import islice
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from routescope.corpora.corpus import DOMAINS, EOT, PAD, iter_documents

log = logging.getLogger(__name__)

SPECIAL_TOKENS = (EOT, PAD)


def new_tokenizer() -> Tokenizer:
    """An untrained byte-level BPE tokenizer with this project's settings."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    return tok


def _training_text(n_docs_per_domain: int, seed: int) -> Iterator[str]:
    for domain in DOMAINS:
        yield from islice(iter_documents(domain, seed, "train"), n_docs_per_domain)


def train_tokenizer(n_docs_per_domain: int = 4000, vocab_size: int = 4096, seed: int = 0) -> Tokenizer:
    """Train on the first `n_docs_per_domain` training documents of every domain.

    The vocabulary holds exactly `vocab_size` tokens when the text has enough distinct merges
    (the default amount has): the two special tokens, the 256 bytes, and learned merges.
    """
    tok = new_tokenizer()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte, seen in training or not
        show_progress=False,
    )
    start = time.perf_counter()
    tok.train_from_iterator(_training_text(n_docs_per_domain, seed), trainer=trainer,
                            length=n_docs_per_domain * len(DOMAINS))
    log.info("trained BPE (vocab %d) on %d docs/domain in %.1fs", tok.get_vocab_size(), n_docs_per_domain,
             time.perf_counter() - start)
    return tok


def load_tokenizer(path: str | Path) -> Tokenizer:
    return Tokenizer.from_file(str(path))


def encode(tok: Tokenizer, text: str) -> list[int]:
    """Token ids of `text`; EOT/PAD written in the text become their single special ids."""
    return tok.encode(text, add_special_tokens=False).ids


def decode(tok: Tokenizer, ids: Sequence[int]) -> str:
    """The text of `ids`, special tokens included, so that decode(encode(s)) == s."""
    return tok.decode(list(ids), skip_special_tokens=False)
