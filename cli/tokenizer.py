"""`routescope tokenizer`: train the byte-level BPE tokenizer on both corpora."""
from __future__ import annotations

import argparse
import sys

from . import options as O


def add(sub: argparse._SubParsersAction) -> None:
    t = sub.add_parser("tokenizer", help="train the byte-level BPE tokenizer on both corpora")
    t.add_argument("--out", required=True)
    t.add_argument("--vocab-size", type=O.positive_int, default=4096)
    t.add_argument("--docs", type=O.positive_int, default=4000, help="documents per domain")
    t.add_argument("--seed", type=O.seed, default=0)
    t.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from routescope.core_models.training.tokenizer import train_tokenizer

    tok = train_tokenizer(n_docs_per_domain=args.docs, vocab_size=args.vocab_size, seed=args.seed)
    tok.save(args.out)
    sys.stdout.write(f"wrote {args.out} ({tok.get_vocab_size()} tokens)\n")
    return 0
