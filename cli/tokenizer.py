"""`routescope tokenizer`: train the byte-level BPE tokenizer on both corpora."""
from __future__ import annotations

import argparse
import sys

from routescope.core_models.training.tokenizer import train_tokenizer


def run(args: argparse.Namespace) -> int:
    tok = train_tokenizer(n_docs_per_domain=args.docs, vocab_size=args.vocab_size, seed=args.seed)
    tok.save(args.out)
    sys.stdout.write(f"wrote {args.out} ({tok.get_vocab_size()} tokens)\n")
    return 0
