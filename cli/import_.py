"""`routescope import`: convert a checkpoint trained with the papers' own code (safetensors only)."""
from __future__ import annotations

import argparse
import sys

from . import options as O


def add(sub: argparse._SubParsersAction) -> None:
    im = sub.add_parser("import", help="convert a checkpoint trained with the papers' own code")
    im.add_argument("--from", dest="source", required=True, choices=O.ChoicesOf("routescope.core_models.importers", "SOURCES"),
                    metavar="SOURCE", help="the reference code's model, one of %(choices)s")
    im.add_argument("--weights", required=True, help="reference state dict as .safetensors (pickle files are refused)")
    im.add_argument("--config", required=True, help="JSON with the reference's own argument names")
    im.add_argument("--out", required=True)
    im.add_argument("--tokenizer", default=None)
    im.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from routescope.core_models.importers import import_checkpoint

    out = import_checkpoint(args.source, args.weights, args.config, args.out, tokenizer=args.tokenizer)
    sys.stdout.write(f"wrote {out}\n")
    return 0
