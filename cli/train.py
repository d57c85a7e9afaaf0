"""`routescope train`: train a checkpoint from a preset (or --init-from a composed one)."""
from __future__ import annotations

import argparse
import json
import shlex
import sys

from routescope.core_models.checkpoint import load_tokenizer_file
from routescope.core_models.training.trainer import TrainConfig, train

from .common import write_json


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


def parse_snapshots(spec: str) -> list[int]:
    """"50,100,200" -> [50, 100, 200]; "" -> []."""
    if not spec:
        return []
    try:
        steps = [int(part) for part in spec.split(",")]
    except ValueError:
        steps = []
    if not steps or min(steps) < 1:
        raise ValueError(f"--snapshots {spec!r}: expected steps > 0, e.g. 50,100,200,400,1000")
    return steps


def run(args: argparse.Namespace) -> int:
    c = TrainConfig(preset=args.preset, overrides=parse_sets(args.set), data=parse_data(args.data),
                    steps=args.steps, batch_size=args.batch_size, seq_len=args.seq_len, lr=args.lr,
                    min_lr=args.lr / 10, warmup=args.warmup, eval_every=args.eval_every, seed=args.seed,
                    init_from=args.init_from, max_minutes=args.max_minutes, stop_after=args.stop_after, freeze=tuple(args.freeze),
                    freeze_steps=args.freeze_for, tau_start=args.tau_start, tau_end=args.tau_end,
                    domain_routes=parse_domain_routes(args.domain_routes), domain_route_steps=args.domain_route_steps)
    tok = load_tokenizer_file(args.tokenizer)
    command = "routescope " + shlex.join(sys.argv[1:] if args.argv is None else args.argv)
    summary = train(c, tok, args.out, command=command, resume=not args.no_resume, progress=not args.quiet,
                    snapshots=parse_snapshots(args.snapshots))
    write_json({k: summary[k] for k in ("steps", "tokens", "wall_seconds", "val_loss")}, indent=None)
    return 0
