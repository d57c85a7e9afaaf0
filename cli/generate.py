"""`routescope generate`: continue a prompt, with the top next-token probabilities of every step."""
from __future__ import annotations

import argparse
import sys

from routescope.analysis.runs.usage import ablation_for
from routescope.core_models.generate import Sampling, generate
from routescope.rendering.style import format_prob  # the app's: small candidates keep their digits

from . import options as O
from .common import load_with_tokenizer, write_json


def run(args: argparse.Namespace) -> int:
    model, tok = load_with_tokenizer(args.checkpoint, **O.device_kwargs(args))
    vocab = model.config.vocab_size
    if args.top_n > vocab:  # checked before any work, like every option
        raise ValueError(f"--top-n {args.top_n}: the vocabulary has {vocab:,} tokens; give 1..{vocab}")
    ids = tok.encode(args.prompt).ids
    ablation = ablation_for(model, args.drop, args.force, args.mode, run_ids=lambda: [ids])  # top N: over the prompt
    sampling = Sampling(greedy=not args.sample, temperature=args.temperature, top_k=args.top_k,
                        top_p=args.top_p, seed=args.seed)
    gen = generate(model, ids, max_new_tokens=args.max_new_tokens, sampling=sampling, top_n=args.top_n,
                   ablation=ablation, routing=args.routing, routing_seed=args.seed)
    text = tok.decode(gen.new_ids)
    if args.json:
        steps = [{"position": s.position, "token": tok.decode([s.token_id]), "token_id": s.token_id,
                  "prob": s.prob, "top": [{"token": tok.decode([i]), "token_id": i, "prob": p}
                                          for i, p in zip(s.top_ids, s.top_probs)]} for s in gen.steps]
        write_json({"prompt": args.prompt, "continuation": text, "truncated": gen.truncated, "steps": steps})
    else:
        for note in gen.notes:
            sys.stderr.write(f"note: {note}\n")
        sys.stdout.write(args.prompt + text + "\n\n")
        for s in gen.steps:
            cands = ", ".join(f"{tok.decode([i])!r} {format_prob(p)}" for i, p in zip(s.top_ids, s.top_probs))
            sys.stdout.write(f"{s.position:4d} {tok.decode([s.token_id])!r:>14}  {cands}\n")
    return 0
