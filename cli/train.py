"""`routescope train`: train a checkpoint from a preset (or --init-from a composed one)."""
from __future__ import annotations

import argparse
import json
import shlex
import sys

from . import options as O
from .common import write_json


def add(sub: argparse._SubParsersAction) -> None:
    tr = sub.add_parser("train", help="train a checkpoint from a preset (or --init-from a composed one)")
    tr.add_argument("preset")
    tr.add_argument("--out", required=True)
    tr.add_argument("--tokenizer", required=True)
    tr.add_argument("--data", default="story=0.5,math=0.5")
    tr.add_argument("--steps", type=O.positive_int, default=1000)
    tr.add_argument("--batch-size", type=O.positive_int, default=16)
    tr.add_argument("--seq-len", type=O.positive_int, default=128)
    tr.add_argument("--lr", type=O.positive_float, default=3e-3)
    tr.add_argument("--warmup", type=O.nonnegative_int, default=50)
    tr.add_argument("--eval-every", type=O.positive_int, default=200)
    tr.add_argument("--seed", type=O.seed, default=0)
    tr.add_argument("--init-from", default=None)
    tr.add_argument("--set", action="append", default=[], help="config FIELD=VALUE, repeatable")
    tr.add_argument("--max-minutes", type=O.nonnegative_float, default=0.0, help="0: no time limit")
    tr.add_argument("--stop-after", type=O.nonnegative_int, default=0, metavar="K",
                    help="stop after K steps of the --steps schedule (0: all of them); unlike --max-minutes "
                         "the same on every machine")
    tr.add_argument("--freeze", action="append", default=[], metavar="PATTERN",
                    help="parameter-name pattern (fnmatch, e.g. 'parallel.*.paths.*') frozen for the first "
                         "--freeze-for steps (router warm-up), repeatable")
    tr.add_argument("--freeze-for", type=O.nonnegative_int, default=0, metavar="K")
    tr.add_argument("--tau-start", type=O.positive_float, default=None,
                    help="Gumbel temperature at step 0, annealed geometrically to --tau-end")
    tr.add_argument("--tau-end", type=O.positive_float, default=None)
    tr.add_argument("--domain-routes", default="", metavar="DOMAIN=OPTION[,...]",
                    help="e.g. story=0,math=1: for the first --domain-route-steps steps each token takes its "
                         "document's domain option in every parallel layer")
    tr.add_argument("--domain-route-steps", type=O.nonnegative_int, default=0, metavar="K")
    tr.add_argument("--no-resume", action="store_true")
    tr.add_argument("--quiet", action="store_true")
    tr.set_defaults(func=run, argv=None)


def parse_data(spec: str) -> dict[str, float]:
    """"story=0.5,math=0.5" -> {"story": 0.5, "math": 0.5}."""
    try:
        pairs = [part.split("=") for part in spec.split(",")]
        return {k.strip(): float(v) for k, v in pairs}
    except ValueError:
        raise ValueError(f"--data {spec!r}: expected DOMAIN=WEIGHT[,DOMAIN=WEIGHT], e.g. story=0.5,math=0.5") from None


def parse_sets(items: list[str]) -> dict:
    """["n_layers=4", "ffn=swiglu"] -> {"n_layers": 4, "ffn": "swiglu"} (values JSON where they parse)."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--set {item!r}: expected FIELD=VALUE")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def parse_domain_routes(spec: str) -> dict[str, int]:
    """"story=0,math=1" -> {"story": 0, "math": 1}; "" -> {}."""
    if not spec:
        return {}
    try:
        pairs = [part.split("=") for part in spec.split(",")]
        return {k.strip(): int(v) for k, v in pairs}
    except ValueError:
        raise ValueError(f"--domain-routes {spec!r}: expected DOMAIN=OPTION[,DOMAIN=OPTION], e.g. story=0,math=1") from None


def run(args: argparse.Namespace) -> int:
    from routescope.core_models.checkpoint import load_tokenizer_file
    from routescope.core_models.training.trainer import TrainConfig, train

    c = TrainConfig(preset=args.preset, overrides=parse_sets(args.set), data=parse_data(args.data),
                    steps=args.steps, batch_size=args.batch_size, seq_len=args.seq_len, lr=args.lr,
                    min_lr=args.lr / 10, warmup=args.warmup, eval_every=args.eval_every, seed=args.seed,
                    init_from=args.init_from, max_minutes=args.max_minutes, stop_after=args.stop_after, freeze=tuple(args.freeze),
                    freeze_steps=args.freeze_for, tau_start=args.tau_start, tau_end=args.tau_end,
                    domain_routes=parse_domain_routes(args.domain_routes), domain_route_steps=args.domain_route_steps)
    tok = load_tokenizer_file(args.tokenizer)
    command = "routescope " + shlex.join(sys.argv[1:] if args.argv is None else args.argv)
    summary = train(c, tok, args.out, command=command, resume=not args.no_resume, progress=not args.quiet)
    write_json({k: summary[k] for k in ("steps", "tokens", "wall_seconds", "val_loss")}, indent=None)
    return 0
