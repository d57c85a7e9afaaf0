"""Training loop: AdamW (0.9, 0.95, wd 0.1), cosine schedule with warm-up, clipping at 1.0, the
family's auxiliary routing losses, per-domain validation, resumable, seeded.

Routing recipes (plain data in TrainConfig; checkpoints/experiments/gumbel-routing.md measures them):
- `freeze` + `freeze_steps`: parameters whose names match any of the fnmatch patterns (e.g.
  "parallel.*.paths.*") get no updates for the first freeze_steps steps: a router warm-up on frozen
  pre-trained paths, so routers learn which path serves a token before the paths adapt to the routes.
- `tau_start` / `tau_end`: the Gumbel-softmax temperature annealed geometrically from tau_start
  (step 0) to tau_end (last step), passed to each training call (`forward(gumbel_tau=...)`); None
  keeps the model's gumbel_tau.
- `domain_routes` + `domain_route_steps`: for the first domain_route_steps steps every token takes, in
  every parallel layer, the option its document's domain maps to (e.g. {"story": 0, "math": 1}: each
  domain through the path pre-trained on it, as the paths were trained), via
  `forward(route_targets=...)` (Gumbel: the token's route; Share-Linear: only that path's output is
  kept); afterwards the routers choose freely. With the paths frozen over the
  same steps this trains the new connections of a composed PaPaformer around the domain experts
  before routing is learned (DEMix-style domain routing as a warm-up). The routers see the labels
  as a target only if the model's route_target_lambda > 0 (a supervised router warm-up).

The data stream is the seeded corpus generator tokenised on the fly and packed into rows of
seq_len + 1 tokens. Resume state (model, optimiser moments, step, stream position) is kept in
safetensors + JSON under `<out>.train_state/`; nothing is pickled.
"""
from __future__ import annotations

import fnmatch
import json
import logging
import math
import os
import re
import shutil
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from tqdm import tqdm

from ..base import RouteScopeLM
from ..checkpoint import load_weights, read_config, save_checkpoint
from ..registry import build_model, config_from_dict, from_name
from routescope.corpora import corpus

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainConfig:
    preset: str
    overrides: dict[str, Any] = field(default_factory=dict)
    data: dict[str, float] = field(default_factory=lambda: {"story": 0.5, "math": 0.5})
    steps: int = 1000
    batch_size: int = 16
    seq_len: int = 128
    lr: float = 3e-3
    min_lr: float = 3e-4
    warmup: int = 50
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    eval_every: int = 200
    eval_docs: int = 100  # validation documents per domain
    seed: int = 0
    init_from: str | None = None  # checkpoint directory with the starting weights (compose output)
    max_minutes: float = 0.0  # > 0: stop early (at a step boundary) after this wall time
    stop_after: int = 0  # > 0: stop after this many steps of the `steps`-step schedule (a reproducible cap)
    freeze: tuple[str, ...] = ()  # fnmatch patterns of parameter names frozen for the first freeze_steps
    freeze_steps: int = 0
    tau_start: float | None = None  # Gumbel temperature annealed tau_start -> tau_end (None: the model's)
    tau_end: float | None = None
    domain_routes: dict[str, int] = field(default_factory=dict)  # domain -> routing option while warming up
    domain_route_steps: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "freeze", tuple(self.freeze))
        if self.domain_route_steps < 0 or (self.domain_route_steps > 0) != bool(self.domain_routes):
            raise ValueError(f"TrainConfig.domain_route_steps = {self.domain_route_steps} with domain_routes = "
                             f"{self.domain_routes}: give both (a mapping and a step count > 0) or neither")
        bad = {d: o for d, o in self.domain_routes.items()
               if d not in self.data or not isinstance(o, int) or isinstance(o, bool) or o < 0}
        if bad:
            raise ValueError(f"TrainConfig.domain_routes = {self.domain_routes}: {bad} are not domains of the data "
                             f"({', '.join(self.data)}) mapped to options >= 0")
        for f in ("steps", "batch_size", "seq_len", "eval_every", "eval_docs"):
            if getattr(self, f) <= 0:
                raise ValueError(f"TrainConfig.{f} = {getattr(self, f)}: must be > 0")
        if not 0 <= self.stop_after <= self.steps:
            raise ValueError(f"TrainConfig.stop_after = {self.stop_after}: must be within 0 .. steps ({self.steps})")
        if self.freeze_steps < 0 or (self.freeze_steps > 0) != bool(self.freeze):
            raise ValueError(f"TrainConfig.freeze_steps = {self.freeze_steps} with freeze = {list(self.freeze)}: "
                             "give both (patterns and a step count > 0) or neither")
        if (self.tau_start is None) != (self.tau_end is None):
            raise ValueError(f"TrainConfig.tau_start = {self.tau_start}, tau_end = {self.tau_end}: give both or neither")
        for f in ("tau_start", "tau_end"):
            v = getattr(self, f)
            if v is not None and not (math.isfinite(v) and v > 0):
                raise ValueError(f"TrainConfig.{f} = {v}: must be a finite number > 0")
        unknown = set(self.data) - set(corpus.DOMAINS)
        if unknown or not self.data:
            raise ValueError(f"TrainConfig.data = {self.data}: domains must be among {corpus.DOMAINS}")


def tau_at(step: int, c: TrainConfig) -> float | None:
    """Gumbel temperature of a training step: geometric from tau_start (step 0) to tau_end (last step)."""
    if c.tau_start is None:
        return None
    frac = min(1.0, step / max(1, c.steps - 1))
    return c.tau_start * (c.tau_end / c.tau_start) ** frac


def frozen_parameters(model: torch.nn.Module, patterns: tuple[str, ...]) -> list[str]:
    """Names of the parameters matching any fnmatch pattern; ValueError for a pattern matching none."""
    names = [n for n, _ in model.named_parameters()]
    unmatched = [p for p in patterns if not fnmatch.filter(names, p)]
    if unmatched:
        raise ValueError(f"TrainConfig.freeze: pattern(s) {', '.join(map(repr, unmatched))} match no parameter "
                         f"(names look like {names[0]!r}, {names[-1]!r})")
    return [n for n in names if any(fnmatch.fnmatchcase(n, p) for p in patterns)]


def _set_frozen(model: torch.nn.Module, names: list[str], frozen: bool) -> None:
    params = dict(model.named_parameters())
    for n in names:
        params[n].requires_grad_(not frozen)  # no grad -> AdamW skips it (no update, no decay)


def lr_at(step: int, c: TrainConfig) -> float:
    if step < c.warmup:
        return c.lr * (step + 1) / c.warmup
    progress = min(1.0, (step - c.warmup) / max(1, c.steps - c.warmup))
    return c.min_lr + 0.5 * (c.lr - c.min_lr) * (1 + math.cos(math.pi * progress))


class TokenStream:
    """Packs the tokenised document stream into (batch, seq_len + 1) rows; resumable by position.
    `domains` holds, for the last batch, the index (in corpus.DOMAINS) of each token's document."""

    def __init__(self, tokenizer, c: TrainConfig, docs_done: int = 0, leftover: list[int] | None = None,
                 leftover_domains: list[int] | None = None) -> None:
        self.tok, self.c = tokenizer, c
        self.docs = corpus.iter_labelled_text(c.data, c.seed, "train")
        for _ in range(docs_done):  # replay the generator (cheap: no tokenising)
            next(self.docs)
        self.docs_done = docs_done
        self.buffer = list(leftover or [])
        self.buffer_domains = list(leftover_domains or [])
        if len(self.buffer_domains) != len(self.buffer):  # a resume state from before domains were kept
            self.buffer_domains = [-1] * len(self.buffer)
        self.domains: torch.Tensor | None = None

    def batch(self) -> torch.Tensor:
        need = self.c.batch_size * (self.c.seq_len + 1)
        while len(self.buffer) < need:
            domain, text = next(self.docs)
            ids = self.tok.encode(text).ids
            self.buffer.extend(ids)
            self.buffer_domains.extend([corpus.DOMAINS.index(domain)] * len(ids))
            self.docs_done += 1
        rows, self.buffer = self.buffer[:need], self.buffer[need:]
        doms, self.buffer_domains = self.buffer_domains[:need], self.buffer_domains[need:]
        self.domains = torch.tensor(doms).view(self.c.batch_size, self.c.seq_len + 1)
        return torch.tensor(rows).view(self.c.batch_size, self.c.seq_len + 1)


def domain_route_targets(domains: torch.Tensor, c: TrainConfig) -> torch.Tensor:
    """(B, T) domain indices (corpus.DOMAINS, -1 unknown) -> (B, T) option of each token (-1: free)."""
    table = torch.full((len(corpus.DOMAINS) + 1,), -1, dtype=torch.long)  # last entry: unknown domain
    for d, option in c.domain_routes.items():
        table[corpus.DOMAINS.index(d)] = option
    return table[domains]


def validation_batches(tokenizer, domain: str, c: TrainConfig) -> torch.Tensor:
    rows = corpus.validation_rows(tokenizer, domain, c.eval_docs, c.seq_len)
    return torch.tensor(rows, dtype=torch.long).view(len(rows), c.seq_len + 1)


@torch.no_grad()
def evaluate(model: RouteScopeLM, val: dict[str, torch.Tensor], batch_size: int = 16) -> dict[str, float]:
    was = model.training
    model.eval()
    out = {}
    for domain, rows in val.items():
        total, count = 0.0, 0
        for i in range(0, len(rows), batch_size):
            chunk = rows[i:i + batch_size]
            logits = model(chunk[:, :-1]).logits
            total += F.cross_entropy(logits.flatten(0, 1), chunk[:, 1:].flatten(), reduction="sum").item()
            count += chunk[:, 1:].numel()
        out[domain] = total / max(1, count)
    model.train(was)
    return out


def _save_state(dir_: Path, model, opt, meta: dict) -> None:
    tmp = dir_.with_name(dir_.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    seen: set[int] = set()  # tied weights: the first name of each tensor (load_weights accepts the aliases missing)
    state = {}
    for k, v in model.state_dict().items():
        ptr = v.data_ptr() if v.numel() else None  # empty tensors share address 0 without being tied
        if (ptr is None or ptr not in seen) and not _is_alias(model, k):
            seen.add(ptr)
            state[k] = v.contiguous()
    save_file(state, str(tmp / "model.safetensors"))
    names = {id(p): n for n, p in model.named_parameters()}
    moments = {}
    for group in opt.param_groups:
        for p in group["params"]:
            for k, v in opt.state.get(p, {}).items():
                moments[f"{names[id(p)]}::{k}"] = v.detach().reshape(v.shape).contiguous()
    save_file(moments, str(tmp / "optimizer.safetensors"))
    (tmp / "state.json").write_text(json.dumps(meta))
    shutil.rmtree(dir_, ignore_errors=True)
    os.replace(tmp, dir_)


def _is_alias(model, key: str) -> bool:
    return key == "head.weight" and model.config.tie_embeddings


def _load_state(dir_: Path, model, opt) -> dict:
    load_weights(model, dir_ / "model.safetensors")
    moments = load_file(str(dir_ / "optimizer.safetensors"))
    params = dict(model.named_parameters())
    for key, v in moments.items():
        name, k = key.split("::")
        opt.state[params[name]][k] = v
    return json.loads((dir_ / "state.json").read_text())


def make_optimizer(model: RouteScopeLM, c: TrainConfig) -> torch.optim.AdamW:
    decay = [p for p in model.parameters() if p.dim() >= 2]  # matrices and embeddings
    no_decay = [p for p in model.parameters() if p.dim() < 2]  # norms, biases, scalars
    return torch.optim.AdamW([{"params": decay, "weight_decay": c.weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}], lr=c.lr, betas=(0.9, 0.95))


def train(c: TrainConfig, tokenizer, out: str | os.PathLike, *, command: str = "", resume: bool = True,
          progress: bool = True, snapshots: Sequence[int] = ()) -> dict[str, Any]:
    """Train, write the checkpoint directory `out`, and return the run's measured summary.

    With `snapshots` (steps in 1..c.steps) `out` is a run directory instead: a checkpoint (with a card
    giving its step and validation loss) at each of those steps and at the last one, `out/step-NNNN/`,
    one shared `out/tokenizer.json`, the run's summary `out/run.json` and a card `out/README.md`."""
    out = Path(out)
    snapshots = sorted(set(snapshots))
    if snapshots and not 1 <= snapshots[0] <= snapshots[-1] <= c.steps:
        raise ValueError(f"snapshots {snapshots}: steps must be within 1 .. steps ({c.steps})")
    state_dir = out.with_name(out.name + ".train_state")
    torch.manual_seed(c.seed)
    if c.init_from:  # a composed (or earlier) checkpoint brings its own config
        config = config_from_dict({**read_config(c.init_from), **c.overrides})
        model = build_model(config)
        load_weights(model, Path(c.init_from) / "model.safetensors")
    else:
        model = build_model(from_name(c.preset, vocab_size=tokenizer.get_vocab_size(), **c.overrides))
    model.train()
    opt = make_optimizer(model, c)
    meta = {"step": 0, "tokens": 0, "docs_done": 0, "leftover": [], "elapsed": 0.0, "history": []}
    if resume and (state_dir / "state.json").is_file():
        meta = _load_state(state_dir, model, opt)
        log.info("resumed from step %d", meta["step"])
    frozen = frozen_parameters(model, c.freeze) if c.freeze else []
    stream = TokenStream(tokenizer, c, meta["docs_done"], meta["leftover"], meta.get("leftover_domains"))
    val = {d: validation_batches(tokenizer, d, c) for d in corpus.DOMAINS}
    gen = torch.Generator().manual_seed(c.seed + meta["step"])
    bar = tqdm(total=c.steps, initial=meta["step"], disable=not progress, dynamic_ncols=True)
    t0, elapsed0 = time.perf_counter(), meta["elapsed"]
    step = meta["step"]
    while step < c.steps:
        rows = stream.batch()
        for g in opt.param_groups:
            g["lr"] = lr_at(step, c)
        if frozen and step in (meta["step"], c.freeze_steps):
            _set_frozen(model, frozen, step < c.freeze_steps)
        targets = domain_route_targets(stream.domains[:, :-1], c) if step < c.domain_route_steps else None
        res = model(rows[:, :-1], generator=gen, gumbel_tau=tau_at(step, c), route_targets=targets)
        loss = F.cross_entropy(res.logits.flatten(0, 1), rows[:, 1:].flatten())
        total = loss + (res.aux_loss if res.aux_loss is not None else 0.0)
        opt.zero_grad(set_to_none=True)
        total.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), c.grad_clip)
        opt.step()
        step += 1
        meta["tokens"] += rows[:, :-1].numel()
        elapsed = elapsed0 + time.perf_counter() - t0
        bar.update(1)
        bar.set_postfix(loss=f"{loss.item():.3f}", tok_s=f"{meta['tokens'] / max(elapsed, 1e-9):.0f}")
        last = step == c.steps or step == c.stop_after or (c.max_minutes and elapsed > 60 * c.max_minutes)
        if step % c.eval_every == 0 or last or step in snapshots:
            losses = evaluate(model, val)
            aux = {f"train_aux_{k}": v.item() for k, v in res.aux.items()}  # unweighted routing terms
            meta["history"].append({"step": step, "train_loss": loss.item(), **aux,
                                    **{f"val_{k}": v for k, v in losses.items()}})
            log.info("step %d val %s", step, losses)
            meta.update(step=step, docs_done=stream.docs_done, leftover=stream.buffer,
                        leftover_domains=stream.buffer_domains, elapsed=elapsed)
            _save_state(state_dir, model, opt, meta)
            if snapshots and (step in snapshots or last):
                _write_snapshot(model, out, _summary(c, model, meta, step, losses, command), step)
        if last:
            break
    bar.close()
    _set_frozen(model, frozen, False)
    final = evaluate(model, val)
    summary = _summary(c, model, meta, step, final, command)
    model.eval()
    if snapshots:  # the last snapshot is the final model: the run directory gets the shared files
        out.mkdir(parents=True, exist_ok=True)
        tokenizer.save(str(out / "tokenizer.json"))
        kept = sorted(p.name for p in out.glob("step-*") if (p / "config.json").is_file())
        (out / RUN_RECORD).write_text(json.dumps({**summary, "snapshots": kept}, indent=1) + "\n")
        (out / "README.md").write_text(_run_card(out.name, summary, asdict(model.config), kept))
    else:
        save_checkpoint(model, out, tokenizer=tokenizer,
                        card=model_card(out.name, summary, asdict(model.config), STORAGE, _machine()))
        (out / "training.json").write_text(json.dumps(summary, indent=1) + "\n")
    shutil.rmtree(state_dir, ignore_errors=True)
    return summary


SNAPSHOT_NAME = "step-{:04d}"  # a snapshot's directory in a run directory (train(snapshots=...))
RUN_RECORD = "run.json"  # a run directory's summary: not training.json, as no checkpoint sits at its top


def _summary(c: TrainConfig, model, meta: dict, step: int, losses: dict[str, float], command: str) -> dict[str, Any]:
    return {"preset": c.preset, "steps": step, "tokens": meta["tokens"], "wall_seconds": round(meta["elapsed"], 1),
            "val_loss": losses, "val_ppl": {d: math.exp(v) for d, v in losses.items()},
            "params_total": model.num_params(), "params_active": model.active_params(),
            **({"format": model.checkpoint_format} if model.checkpoint_format else {}),
            "train": asdict(c), "history": list(meta["history"]), "command": command,
            **({"init_command": init} if (init := _init_command(c.init_from)) else {})}


def _write_snapshot(model, out: Path, s: dict[str, Any], step: int) -> None:
    """out/step-NNNN: the weights at `step` (a copy in the storage dtype; the training model is not
    touched) with a card giving the step and its validation loss."""
    name = SNAPSHOT_NAME.format(step)
    s = {**s, "snapshot": True}
    save_checkpoint(model, out / name, card=model_card(f"{out.name}/{name}", s, asdict(model.config), STORAGE,
                                                       _machine()))


def _run_card(name: str, s: dict[str, Any], config: dict[str, Any], kept: list[str]) -> str:
    """The run directory's card: its snapshots with their validation losses, then the final model's card."""
    val = {h["step"]: h for h in s["history"]}
    domains = list(s["val_loss"])
    rows = "\n".join(f"| [{k}]({k}/README.md) | {int(k[5:])} | "
                     + " | ".join(f"{val[int(k[5:])].get('val_' + d, float('nan')):.4f}" for d in domains) + " |"
                     for k in kept)
    card = model_card(name, s, config, STORAGE, _machine())
    head, _, rest = card.partition("\n\n")
    return (f"{head}\n\nSnapshots of one training run, kept along the way (`--snapshots`): each `step-NNNN` is a "
            "checkpoint of its own with a card giving its step and validation loss; they share the tokenizer "
            f"`tokenizer.json` here.\n\n| snapshot | step | {' | '.join('val ' + d for d in domains)} |\n"
            f"|---|---|{'---|' * len(domains)}\n{rows}\n\nThe last snapshot is the run's final model:\n\n{rest}")


def _init_note(init_from: str | None) -> str:
    """The first paragraph of the starting checkpoint's card (compose writes how it initialised the
    combiner there), as a card line; "" when there is none."""
    card = Path(init_from) / "README.md" if init_from else None
    if card is None or not card.is_file():
        return ""
    paragraphs = [p.strip() for p in card.read_text(errors="replace").split("\n\n")]
    text = next((" ".join(p.split()) for p in paragraphs if p and not p.startswith("#")), "")
    return f"- initial weights: {text}\n" if text else ""


STORAGE = "float16"  # save_checkpoint's storage dtype for the weights (training runs in float32)
COMMAND_PREFIX = "command: "  # a line of compose's card: the command that made the starting checkpoint


def _machine() -> str:
    return f"{os.cpu_count()} CPU cores (torch {torch.__version__})"


def _init_command(init_from: str | None) -> str | None:
    """The command that made the starting checkpoint, from its card (compose writes it there)."""
    card = Path(init_from) / "README.md" if init_from else None
    if card is None or not card.is_file():
        return None
    return next((line[len(COMMAND_PREFIX):].strip("` ") for line in card.read_text(errors="replace").splitlines()
                 if line.startswith(COMMAND_PREFIX)), None)


def _model_lines(config: dict[str, Any]) -> str:
    """What in the model's configuration changes training, as card lines: dropout, token merging."""
    lines = []
    if "ffn_dropout" in config:
        p = config["ffn_dropout"]
        lines.append(f"- dropout: {p:g} on every block's FFN output (training only)\n" if p else "- dropout: none\n")
    if "atm_tau" in config:
        n = config["n_layers"]
        kind = ("causal ATM (a merged pair sits at its last token)" if config.get("atm_causal") else
                "the paper's ATM (a merged pair's attention output copied back to both tokens, eq. 32: the first "
                "reads the next token, so the model is not causal while ATM is on)")
        lines.append(f"- token merging: on in training at tau = {config['atm_tau']:g} in blocks "
                     f"{n // 3}-{2 * n // 3 - 1}, {kind}; off at evaluation and inference unless asked\n")
    return "".join(lines)


def _reproduce(s: dict[str, Any]) -> str:
    """The commands that rebuild the checkpoint: compose first for a composition; a run that stopped on
    its wall-clock cap is given with the step count it reached as the cap instead."""
    t, command = s["train"], s["command"]
    if s["steps"] < t["steps"] and "--max-minutes" in command and not s.get("snapshot"):
        command = re.sub(r"--max-minutes \S+", "--max-minutes 0", command)
        command = re.sub(r"( --max-minutes 0)(.*)\1", r"\1\2", command)  # the flag given twice: once
        command += f" --stop-after {s['steps']}"
        note = (f"It stopped on its wall-clock cap (--max-minutes {t['max_minutes']:g}) after {s['steps']} of "
                f"{t['steps']} steps; with that step count as the cap the command reproduces it:\n\n")
    else:
        note = ""
    init = f"{s['init_command']}\n" if s.get("init_command") else ""
    return f"{note}```\n{init}{command}\n```"


def _snapshot_line(s: dict[str, Any]) -> str:
    if not s.get("snapshot"):
        return ""
    return (f"- snapshot: step {s['steps']} of a {s['train']['steps']}-step run, kept along the way (`--snapshots`); "
            "the tokenizer is the run directory's `../tokenizer.json`\n")


def _recipe_lines(t: dict[str, Any], init_note: str | None = None) -> str:
    lines = [_init_note(t.get("init_from")) if init_note is None else init_note]
    if t.get("freeze"):
        lines.append(f"- router warm-up: {', '.join(t['freeze'])} frozen for the first {t['freeze_steps']} steps\n")
    if t.get("domain_route_steps"):
        routes = ", ".join(f"{d} -> option {o}" for d, o in t["domain_routes"].items())
        lines.append(f"- domain-route warm-up: for the first {t['domain_route_steps']} steps every token takes its "
                     f"document's domain route ({routes}) in every parallel layer"
                     + (f"; routers learn it by cross-entropy (route_target_lambda {lam})"
                        if (lam := t.get("overrides", {}).get("route_target_lambda")) else "") + "\n")
    if t.get("tau_start") is not None:
        lines.append(f"- Gumbel temperature annealed {t['tau_start']} -> {t['tau_end']} (geometric over the steps)\n")
    return "".join(lines)


def model_card(name: str, s: dict[str, Any], config: dict[str, Any] | None = None, storage: str = STORAGE,
               machine: str | None = None, init_note: str | None = None) -> str:
    """The card save_checkpoint writes beside the weights. `machine` and `init_note` (the starting
    checkpoint's line) default to this machine and the starting checkpoint's card."""
    t = s["train"]
    data = ", ".join(f"{d} {w:.0%}" for d, w in t["data"].items())
    rows = "\n".join(f"| {d} | {s['val_loss'][d]:.4f} | {s['val_ppl'][d]:.2f} |" for d in s["val_loss"])
    return f"""# {name}

RouteScope checkpoint, preset `{s['preset']}`{' (initialised from ' + t['init_from'] + ')' if t['init_from'] else ''}.
{chr(10) + '- format: ' + s['format'] + chr(10) if s.get('format') else ''}
- data: synthetic corpora from `routescope.corpora.corpus` ({data}), seed {t['seed']}
- steps: {s['steps']} (batch {t['batch_size']} x {t['seq_len']} tokens)
- tokens seen: {s['tokens']:,}
- wall time: {s['wall_seconds']:.0f} s on {machine or _machine()}
- parameters: {s['params_total']:,} total, {s['params_active']:,} active per token
- weights: stored in {storage} (model.safetensors); trained in float32
- optimiser: AdamW (0.9, 0.95), weight decay {t['weight_decay']}, lr {t['lr']} -> {t['min_lr']} cosine, warm-up {t['warmup']}, clip {t['grad_clip']}
{_snapshot_line(s)}{_model_lines(config or {})}{_recipe_lines(t, init_note)}
## Validation (fixed split, {t['eval_docs']} documents per domain)

| domain | loss | perplexity |
|---|---|---|
{rows}

## Reproduce

{_reproduce(s)}
"""
