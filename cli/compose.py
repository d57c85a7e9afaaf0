"""`routescope compose`: build an untrained PaPaformer from pre-trained path checkpoints."""
from __future__ import annotations

import argparse
import shlex
import sys

import torch

from routescope.core_models.checkpoint import load_checkpoint, save_checkpoint
from routescope.core_models.training.compose import compose


def compose_command(args: argparse.Namespace) -> str:
    """The command that rebuilds this composition (options at their defaults left out)."""
    extra = [f"--{k.replace('_', '-')} {v}" for k, v, default in
             (("n_large_pre", args.n_large_pre, 1), ("n_large_post", args.n_large_post, 1), ("seed", args.seed, 0))
             if v != default]
    return " ".join(["routescope compose --paths", shlex.join(args.paths), "--combiner", args.combiner,
                     "--combiner-init", args.combiner_init, *extra, "--out", shlex.quote(args.out)])


def run(args: argparse.Namespace) -> int:
    loaded = [load_checkpoint(p) for p in args.paths]
    model = compose([m for m, _ in loaded], args.combiner, n_large_pre=args.n_large_pre,
                    n_large_post=args.n_large_post, seed=args.seed, combiner_init=args.combiner_init)
    card = (f"# composed {args.combiner}\n\nUntrained composition of {', '.join(args.paths)} "
            f"(blocks -> parallel paths, embeddings concatenated, combiner init {args.combiner_init}); "
            f"train it on mixed data.\n\ncommand: `{compose_command(args)}`\n")
    save_checkpoint(model, args.out, tokenizer=loaded[0][1], card=card, dtype=torch.float32)
    sys.stdout.write(f"wrote {args.out}\n")
    return 0
