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
    from core_models.generate import Sampling, generate
    from core_models.runtime import Ablation

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


def _parse_data(spec: str) -> dict[str, float]:
    try:
        pairs = [part.split("=") for part in spec.split(",")]
        return {k.strip(): float(v) for k, v in pairs}
    except ValueError:
        raise ValueError(f"--data {spec!r}: expected DOMAIN=WEIGHT[,DOMAIN=WEIGHT], e.g. story=0.5,math=0.5") from None


def _parse_sets(items: list[str]) -> dict:
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


def cmd_tokenizer(args: argparse.Namespace) -> int:
    from core_models.training.tokenizer import train_tokenizer
    tok = train_tokenizer(n_docs_per_domain=args.docs, vocab_size=args.vocab_size, seed=args.seed)
    tok.save(args.out)
    sys.stdout.write(f"wrote {args.out} ({tok.get_vocab_size()} tokens)\n")
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    import shlex

    from core_models.checkpoint import load_tokenizer_file
    from core_models.training.trainer import TrainConfig, train

    c = TrainConfig(preset=args.preset, overrides=_parse_sets(args.set), data=_parse_data(args.data),
                    steps=args.steps, batch_size=args.batch_size, seq_len=args.seq_len, lr=args.lr,
                    min_lr=args.lr / 10, warmup=args.warmup, eval_every=args.eval_every, seed=args.seed,
                    init_from=args.init_from, max_minutes=args.max_minutes)
    tok = load_tokenizer_file(args.tokenizer)
    command = "routescope " + shlex.join(sys.argv[1:] if args.argv is None else args.argv)
    summary = train(c, tok, args.out, command=command, resume=not args.no_resume, progress=not args.quiet)
    sys.stdout.write(json.dumps({k: summary[k] for k in ("steps", "tokens", "wall_seconds", "val_loss")}) + "\n")
    return 0


def cmd_compose(args: argparse.Namespace) -> int:
    from core_models.checkpoint import load_checkpoint, save_checkpoint
    from core_models.training.compose import compose

    loaded = [load_checkpoint(p) for p in args.paths]
    model = compose([m for m, _ in loaded], args.combiner, n_large_pre=args.n_large_pre,
                    n_large_post=args.n_large_post, seed=args.seed)
    card = (f"# composed {args.combiner}\n\nUntrained composition of {', '.join(args.paths)} "
            f"(blocks -> parallel paths, embeddings concatenated); train it on mixed data.\n")
    save_checkpoint(model, args.out, tokenizer=loaded[0][1], card=card, dtype=__import__("torch").float32)
    sys.stdout.write(f"wrote {args.out}\n")
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    from core_models.importers import import_checkpoint
    out = import_checkpoint(args.source, args.weights, args.config, args.out, tokenizer=args.tokenizer)
    sys.stdout.write(f"wrote {out}\n")
    return 0


def run_child(cmd: list[str], grace: float = 10.0, **popen_kw) -> int:
    """Run cmd as a child and return its exit status (128 + n if signal n ended it). SIGINT,
    SIGTERM and SIGHUP sent to this process are passed on to the child, which is waited for, so
    stopping routescope stops what it started; if we leave by an exception the child is terminated
    (killed after `grace` s). On Linux the kernel also sends it SIGTERM if routescope is killed
    outright (SIGKILL)."""
    import signal
    import subprocess

    child = subprocess.Popen(cmd, preexec_fn=_term_with_parent if sys.platform == "linux" else None, **popen_kw)
    forwarded = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {s: signal.signal(s, lambda signum, _frame: child.send_signal(signum)) for s in forwarded}
    try:
        rc = child.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if child.poll() is None:
            child.terminate()
            try:
                child.wait(grace)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
    return rc if rc >= 0 else 128 - rc


def _term_with_parent() -> None:
    """In the child before exec (Linux): SIGTERM when the parent dies (prctl PR_SET_PDEATHSIG)."""
    import ctypes
    import signal

    ctypes.CDLL(None).prctl(1, signal.SIGTERM)


def cmd_app(args: argparse.Namespace) -> int:
    """Start the Streamlit explorer (app/main.py) on the shipped checkpoints and wait for it;
    stopping routescope (Ctrl-C, SIGTERM, SIGHUP) stops the Streamlit server too (run_child).

    Never waits for input: Streamlit's first-run "Email:" prompt is off (it blocked a new machine,
    terminal or not), and so are usage statistics. Without --headless Streamlit opens a browser."""
    import importlib.util
    import os

    from analysis.catalog import ENV_ROOTS

    spec = importlib.util.find_spec("app")  # locate the file only; nothing imports app/
    if spec is None or not spec.submodule_search_locations:
        raise ValueError("the app package is not installed; run pip install -e . from the repository")
    main = os.path.join(list(spec.submodule_search_locations)[0], "main.py")
    env = dict(os.environ)
    if args.checkpoints:
        env[ENV_ROOTS] = os.pathsep.join([*args.checkpoints, *filter(None, [env.get(ENV_ROOTS)])])
    cmd = [sys.executable, "-m", "streamlit", "run", main, "--server.port", str(args.port),
           "--server.headless", "true" if args.headless else "false", "--server.showEmailPrompt", "false",
           "--browser.gatherUsageStats", "false"]
    if args.address:
        cmd += ["--server.address", args.address]
    return run_child(cmd, env=env, cwd=os.path.dirname(os.path.dirname(main)))


def build_parser() -> argparse.ArgumentParser:
    from analysis import cliargs as A

    p = A.Parser(prog="routescope", description="Routing analysis for parallel-path LMs")
    p.add_argument("--threads", type=A.threads, default=0,
                   help=f"torch CPU threads, 1..{A.max_threads()} (default 0: torch's choice; 1 is best when "
                        f"the cores are busy)")
    sub = p.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="continue a prompt, with top-k next-token probabilities per step")
    g.add_argument("checkpoint")
    g.add_argument("prompt")
    g.add_argument("--max-new-tokens", type=A.nonnegative_int, default=32)
    g.add_argument("--sample", action="store_true", help="sample instead of greedy decoding")
    g.add_argument("--temperature", type=A.positive_float, default=1.0, help="> 0")
    g.add_argument("--top-k", type=A.nonnegative_int, default=0, help="0: no top-k filter")
    g.add_argument("--top-p", type=A.probability, default=1.0, help="in (0, 1]; 1: no nucleus filter")
    g.add_argument("--seed", type=A.seed, default=0)
    g.add_argument("--top-n", type=A.positive_int, default=5,
                   help="candidates shown per step (at most the vocabulary size)")
    g.add_argument("--routing", choices=("deterministic", "sampled"), default="deterministic")
    g.add_argument("--drop", action="append", default=[], help="OPTION or LAYER:OPTION, repeatable")
    g.add_argument("--force", action="append", default=[], help="LAYER:OPTION, repeatable")
    g.add_argument("--json", action="store_true")
    g.set_defaults(func=cmd_generate)

    t = sub.add_parser("tokenizer", help="train the byte-level BPE tokenizer on both corpora")
    t.add_argument("--out", required=True)
    t.add_argument("--vocab-size", type=A.positive_int, default=4096)
    t.add_argument("--docs", type=A.positive_int, default=4000, help="documents per domain")
    t.add_argument("--seed", type=A.seed, default=0)
    t.set_defaults(func=cmd_tokenizer)

    tr = sub.add_parser("train", help="train a checkpoint from a preset (or --init-from a composed one)")
    tr.add_argument("preset")
    tr.add_argument("--out", required=True)
    tr.add_argument("--tokenizer", required=True)
    tr.add_argument("--data", default="story=0.5,math=0.5")
    tr.add_argument("--steps", type=A.positive_int, default=1000)
    tr.add_argument("--batch-size", type=A.positive_int, default=16)
    tr.add_argument("--seq-len", type=A.positive_int, default=128)
    tr.add_argument("--lr", type=A.positive_float, default=3e-3)
    tr.add_argument("--warmup", type=A.nonnegative_int, default=50)
    tr.add_argument("--eval-every", type=A.positive_int, default=200)
    tr.add_argument("--seed", type=A.seed, default=0)
    tr.add_argument("--init-from", default=None)
    tr.add_argument("--set", action="append", default=[], help="config FIELD=VALUE, repeatable")
    tr.add_argument("--max-minutes", type=A.nonnegative_float, default=0.0, help="0: no time limit")
    tr.add_argument("--no-resume", action="store_true")
    tr.add_argument("--quiet", action="store_true")
    tr.set_defaults(func=cmd_train, argv=None)

    c = sub.add_parser("compose", help="build a PaPaformer from pre-trained path checkpoints")
    c.add_argument("--paths", nargs="+", required=True)
    c.add_argument("--combiner", required=True, choices=("share_linear", "gumbel_v1", "gumbel_v2"))
    c.add_argument("--out", required=True)
    c.add_argument("--n-large-pre", type=A.nonnegative_int, default=1)
    c.add_argument("--n-large-post", type=A.nonnegative_int, default=1)
    c.add_argument("--seed", type=A.seed, default=0)
    c.set_defaults(func=cmd_compose)

    a = sub.add_parser("app", help="start the browser explorer")
    a.add_argument("--port", type=A.port, default=8501)
    a.add_argument("--headless", action="store_true", help="do not open a browser")
    a.add_argument("--address", default=None, help="address to listen on (default: Streamlit's)")
    a.add_argument("--checkpoints", action="append", default=[], help="extra checkpoint root, repeatable")
    a.set_defaults(func=cmd_app)

    im = sub.add_parser("import", help="convert a checkpoint trained with the papers' own code")
    im.add_argument("--from", dest="source", required=True,
                    choices=("papaformer-share-linear", "papaformer-gumbel-v1", "papaformer-gumbel-v2", "pgpt"))
    im.add_argument("--weights", required=True, help="reference state dict as .safetensors (pickle files are refused)")
    im.add_argument("--config", required=True, help="JSON with the reference's own argument names")
    im.add_argument("--out", required=True)
    im.add_argument("--tokenizer", default=None)
    im.set_defaults(func=cmd_import)

    import importlib.util
    if importlib.util.find_spec("analysis.commands"):  # export, routes, attribute
        from analysis.commands import add_commands
        add_commands(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    if args.threads:
        import torch
        torch.set_num_threads(args.threads)
    try:
        return args.func(args)
    except BrokenPipeError:  # output piped into head & co.
        sys.stderr.close()
        return 0
    except (ValueError, FileNotFoundError) as e:  # our errors name the problem; no traceback
        sys.stderr.write(f"routescope {args.command}: {e}\n")
        return 2


if __name__ == "__main__":
    sys.exit(main())
