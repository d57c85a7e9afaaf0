"""The `routescope` command line. Subcommands import what they need lazily, so `--help` is fast."""
from __future__ import annotations

import argparse
import json
import logging
import sys


def _load(path: str):
    from core_models.checkpoint import load_checkpoint
    return load_checkpoint(path)


def cmd_generate(args: argparse.Namespace) -> int:
    import torch

    from core_models.generate import Sampling, generate
    from core_models.runtime import Ablation

    torch.set_num_threads(max(1, torch.get_num_threads()))
    model, tok = _load(args.checkpoint)
    if tok is None:
        raise SystemExit(f"{args.checkpoint}: no tokenizer.json; text prompts need a tokenizer")
    ids = tok.encode(args.prompt).ids
    sampling = Sampling(greedy=not args.sample, temperature=args.temperature, top_k=args.top_k,
                        top_p=args.top_p, seed=args.seed)
    gen = generate(model, ids, max_new_tokens=args.max_new_tokens, sampling=sampling, top_n=args.top_n,
                   ablation=Ablation.parse(args.drop, args.force), routing=args.routing, routing_seed=args.seed)
    text = tok.decode(gen.new_ids)
    if args.json:
        steps = [{"position": s.position, "token": tok.decode([s.token_id]), "token_id": s.token_id,
                  "prob": s.prob, "top": [{"token": tok.decode([i]), "token_id": i, "prob": p}
                                          for i, p in zip(s.top_ids, s.top_probs)]} for s in gen.steps]
        json.dump({"prompt": args.prompt, "continuation": text, "truncated": gen.truncated, "steps": steps},
                  sys.stdout, ensure_ascii=False, indent=1)
        sys.stdout.write("\n")
    else:
        for note in gen.notes:
            sys.stderr.write(f"note: {note}\n")
        sys.stdout.write(args.prompt + text + "\n\n")
        for s in gen.steps:
            cands = ", ".join(f"{tok.decode([i])!r} {p:.1%}" for i, p in zip(s.top_ids, s.top_probs))
            sys.stdout.write(f"{s.position:4d} {tok.decode([s.token_id])!r:>14}  {cands}\n")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="routescope", description="Routing analysis for parallel-path LMs")
    sub = p.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="continue a prompt, with top-k next-token probabilities per step")
    g.add_argument("checkpoint")
    g.add_argument("prompt")
    g.add_argument("--max-new-tokens", type=int, default=32)
    g.add_argument("--sample", action="store_true", help="sample instead of greedy decoding")
    g.add_argument("--temperature", type=float, default=1.0)
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--top-n", type=int, default=5, help="candidates shown per step")
    g.add_argument("--routing", choices=("deterministic", "sampled"), default="deterministic")
    g.add_argument("--drop", action="append", default=[], help="OPTION or LAYER:OPTION, repeatable")
    g.add_argument("--force", action="append", default=[], help="LAYER:OPTION, repeatable")
    g.add_argument("--json", action="store_true")
    g.set_defaults(func=cmd_generate)
    return p


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError) as e:  # our errors name the problem; no traceback
        sys.stderr.write(f"routescope {args.command}: {e}\n")
        return 2


if __name__ == "__main__":
    sys.exit(main())
