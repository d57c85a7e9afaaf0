"""`routescope import`: convert a checkpoint trained with the papers' own code (safetensors only)."""
from __future__ import annotations

import argparse
import sys

from routescope.core_models.importers import import_checkpoint


def run(args: argparse.Namespace) -> int:
    out = import_checkpoint(args.source, args.weights, args.config, args.out, tokenizer=args.tokenizer)
    sys.stdout.write(f"wrote {out}\n")
    return 0
