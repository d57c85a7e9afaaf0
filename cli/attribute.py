"""`routescope attribute`: attribute a next-token log-prob to input tokens or routing options."""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from routescope.analysis.runs.attribution import TOKEN_METHODS, PathAttribution, TokenAttribution

from . import options as O
from .common import load_with_tokenizer, write_json


def _target_id(tok: Any, args: argparse.Namespace) -> int | None:
    if args.token_id is not None:
        return args.token_id
    if args.token is None:
        return None
    ids = tok.encode(args.token).ids
    if len(ids) != 1:
        raise ValueError(f"--token {args.token!r} encodes to {len(ids)} tokens {ids}; give one token "
                         f"(or --token-id)")
    return ids[0]


def run(args: argparse.Namespace) -> int:
    model, tok = load_with_tokenizer(args.checkpoint, **O.device_kwargs(args))
    ids = tok.encode(args.prompt).ids[-model.context:]
    if not ids:
        raise ValueError("--prompt encodes to no tokens")
    target = _target_id(tok, args)
    if args.method in TOKEN_METHODS:
        res = TokenAttribution(model).attribute(ids, args.position, target, n_steps=args.n_steps,
                                                baseline=args.baseline)
        df = res.frame(tok)
        head = {"target_position": res.target_position, "target_token": tok.decode([res.target_token]),
                "target_token_id": res.target_token, "log_prob": res.target_log_prob,
                "baseline_log_prob": res.baseline_log_prob, "convergence_delta": res.convergence_delta,
                "baseline": res.baseline, "n_steps": res.n_steps}
    else:
        df = PathAttribution(model).attribute(ids, args.position, target, method=args.method, scope=args.scope,
                                              n_samples=args.n_samples, seed=args.seed)
        t = int(df["token_id"].iloc[0])
        head = {"target_position": int(df["position"].iloc[0]), "target_token": tok.decode([t]),
                "target_token_id": t, "log_prob": float(df["full_log_prob"].iloc[0]), "method": args.method,
                "scope": args.scope}
        df = df.drop(columns=["position", "token_id"])
    if args.json:
        write_json({**head, "rows": json.loads(df.to_json(orient="records"))})
    else:
        for k, v in head.items():
            sys.stdout.write(f"{k}: {v!r}\n" if isinstance(v, str) else f"{k}: {v}\n")
        sys.stdout.write("\n" + df.to_string(index=False) + "\n")
    return 0
