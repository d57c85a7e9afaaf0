"""Shared by every benchmark: interleaved timing, tables, goals, the machine description, models.

Timing rule: variants that are compared run alternately in one loop of one process (the order
flips every repetition), so drift and background load hit all of them alike; a table shows the
median of each and the ratio of the medians. Goals are decided here from measured numbers only.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # peers are built from configs; never reach a hub
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CHECKPOINTS = ROOT / "checkpoints"
CACHE = Path(tempfile.gettempdir()) / "routescope-bench"
FAMILY_PRESETS = ("llama-dense", "pagmlp", "papaformer-share-linear", "papaformer-gumbel-v1",
                  "papaformer-gumbel-v2", "pgpt", "moep", "moep-swiglu", "wiola-tiny")
SHIPPED = ("llama-dense", "pagmlp", "path-story", "path-math", "papaformer-share-linear", "papaformer-gumbel-v1",
           "papaformer-gumbel-v2", "moep", "moep-swiglu", "pgpt", "wiola-tiny")
# the reference shape for the floor and peer comparisons
REF_SHAPE = dict(d_model=128, n_layers=8, n_heads=4, vocab_size=4096)


# --- results -----------------------------------------------------------------------------------

@dataclass
class Goal:
    """A target from the issue and the number measured for it; the status is computed."""

    id: str
    what: str
    op: str  # "<=", ">=", ">" or "in" (threshold is then (lo, hi))
    threshold: Any
    measured: float | None = None
    unit: str = "x"
    note: str = ""

    @property
    def status(self) -> str:
        m = self.measured
        if m is None or m != m:  # None or NaN
            return "not measured"
        if self.op == "<=":
            ok = m <= self.threshold
        elif self.op == ">=":
            ok = m >= self.threshold
        elif self.op == ">":
            ok = m > self.threshold
        elif self.op == "in":
            ok = self.threshold[0] <= m <= self.threshold[1]
        else:
            raise ValueError(f"goal {self.id}: unknown comparison {self.op!r}")
        return "met" if ok else "not met"

    def target(self) -> str:
        if self.op == "in":
            lo, hi = self.threshold
            return f"in [{fmt(lo, self.unit)}, {fmt(hi, self.unit)}]"
        return f"{self.op} {fmt(self.threshold, self.unit)}"

    def row(self) -> list[str]:
        m = "-" if self.measured is None else fmt(self.measured, self.unit)
        return [self.id, self.what, self.target(), m, self.status, self.note]


@dataclass
class Table:
    title: str
    columns: list[str]
    rows: list[list[Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, *cells: Any) -> None:
        self.rows.append([c if isinstance(c, str) else fmt(c) for c in cells])

    def render(self) -> str:
        cells = [[str(c).replace("|", "\\|") for c in r] for r in [self.columns] + self.rows]
        widths = [max(len(r[i]) for r in cells) for i in range(len(self.columns))]
        line = lambda r: "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |"  # noqa: E731
        out = [f"**{self.title}**", "", line(cells[0]), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
        out += [line(r) for r in cells[1:]]
        out += [""] + [f"- {n}" for n in self.notes] if self.notes else []
        return "\n".join(out) + "\n"


@dataclass
class Report:
    name: str
    title: str
    tables: list[Table] = field(default_factory=list)
    goals: list[Goal] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Report":
        d = dict(d)
        d["tables"] = [Table(**t) for t in d["tables"]]
        d["goals"] = [Goal(**g) for g in d["goals"]]
        return cls(**d)

    def render(self) -> str:
        parts = [f"## {self.title}\n"] + [t.render() for t in self.tables]
        if self.goals:
            g = Table("Goals", ["goal", "what", "target", "measured", "status", "note"], [x.row() for x in self.goals])
            parts.append(g.render())
        parts += [f"- {n}" for n in self.notes]
        return "\n".join(parts) + "\n"


def fmt(x: Any, unit: str = "") -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        if x != x:
            return "nan"
        if unit == "%":
            return f"{100 * x:.2f}%"
        s = f"{x:.3f}" if unit == "x" else (f"{x:.4g}" if abs(x) < 1000 else f"{x:,.0f}")
    else:
        s = str(x)
    return s + ("x" if unit == "x" else (f" {unit}" if unit else ""))


# --- timing ------------------------------------------------------------------------------------

def interleaved(variants: dict[str, Callable[[], Any]], reps: int, *, warmup: int = 2, inner: int = 1
                ) -> dict[str, list[float]]:
    """Seconds per call of each variant, the variants alternating within every repetition (order
    reversed on odd repetitions). `inner` calls are timed together and averaged per sample."""
    for _ in range(warmup):
        for f in variants.values():
            f()
    names = list(variants)
    samples: dict[str, list[float]] = {n: [] for n in names}
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()  # as timeit does: a collection landing in one variant's sample is noise
    try:
        for r in range(reps):
            for n in (names if r % 2 == 0 else names[::-1]):
                f = variants[n]
                t0 = time.perf_counter()
                for _ in range(inner):
                    f()
                samples[n].append((time.perf_counter() - t0) / inner)
    finally:
        if was_enabled:
            gc.enable()
    return samples


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def ms(xs: list[float]) -> float:
    return median(xs) * 1e3


def ratio(a: list[float], b: list[float]) -> float:
    """median(a) / median(b)."""
    return median(a) / median(b)


# --- machine -----------------------------------------------------------------------------------

def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine() -> dict[str, Any]:
    return {"cpu": cpu_model(), "cores (os.cpu_count)": os.cpu_count(), "torch": torch.__version__,
            "torch threads": torch.get_num_threads(), "python": platform.python_version(),
            "platform": platform.platform(), "load average (1 min)": round(os.getloadavg()[0], 2)}


# --- inputs and models -------------------------------------------------------------------------

def random_ids(n: int, vocab: int, seed: int = 0, batch: int = 1) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, n), generator=torch.Generator().manual_seed(seed))


def checkpoint_path(name: str) -> Path | None:
    p = CHECKPOINTS / name
    return p if (p / "config.json").is_file() and (p / "model.safetensors").is_file() else None


def tokenizer_path() -> Path:
    """checkpoints/tokenizer.json, or a small tokenizer trained once and cached."""
    shipped = CHECKPOINTS / "tokenizer.json"
    if shipped.is_file():
        return shipped
    cached = CACHE / "tokenizer.json"
    if not cached.is_file():
        from routescope.core_models.training.tokenizer import train_tokenizer
        CACHE.mkdir(parents=True, exist_ok=True)
        train_tokenizer(n_docs_per_domain=300).save(str(cached))
    return cached


def preset_for(name: str) -> str:
    return "path" if name.startswith("path-") else name


def model_for(name: str, **overrides: Any):
    """(model in eval mode, tokenizer or None, source): checkpoints/<name> if shipped (and no
    overrides), else the preset with random weights."""
    from routescope.core_models import build_model, from_name
    from routescope.core_models.checkpoint import load_checkpoint, load_tokenizer_file
    p = checkpoint_path(name)
    if p is not None and not overrides:
        model, tok = load_checkpoint(p)
        return model, tok, f"checkpoints/{name}"
    torch.manual_seed(0)
    model = build_model(from_name(preset_for(name), **overrides)).eval()
    return model, load_tokenizer_file(tokenizer_path()), "random weights"


def checkpoint_dir(name: str) -> tuple[Path, str]:
    """A checkpoint directory for code paths that load one: shipped, or a random-weight preset saved once."""
    p = checkpoint_path(name)
    if p is not None:
        return p, f"checkpoints/{name}"
    out = CACHE / "ckpt" / name
    if not (out / "model.safetensors").is_file():
        from routescope.core_models.checkpoint import load_tokenizer_file, save_checkpoint
        model, _, _ = model_for(name)
        save_checkpoint(model, out, tokenizer=load_tokenizer_file(tokenizer_path()), dtype=torch.float32)
    return out, "random weights"


def prompt_text(tok: Any, n_tokens: int, seed: int = 0) -> str:
    """A text of exactly n_tokens tokens (story then math validation text), when the cut re-encodes."""
    from routescope.corpora.corpus import validation_documents
    docs = validation_documents("story", 8) + validation_documents("math", 8)
    text = " ".join(docs[seed % len(docs):] + docs[:seed % len(docs)])
    ids = tok.encode(text).ids
    for cut in range(n_tokens, n_tokens + 8):
        s = tok.decode(ids[:cut])
        if len(tok.encode(s).ids) == n_tokens:
            return s
    return tok.decode(ids[:n_tokens])


def corpus_prompts(n: int, seed: int = 0) -> list[str]:
    """First sentences of training documents, story and math alternating (one line each)."""
    import re

    from routescope.corpora.corpus import iter_documents
    streams = [iter_documents("story", seed), iter_documents("math", seed)]
    out = []
    while len(out) < n:
        doc = next(streams[len(out) % 2])
        first = re.split(r"(?<=[.?!])\s", doc.strip(), maxsplit=1)[0]
        first = " ".join(first.split())
        if first:
            out.append(first)
    return out


# --- subprocesses and command lines ------------------------------------------------------------

def run_child(module: str, payload: dict[str, Any], threads: int, timeout: float = 1800,
              prefix: tuple[str, ...] = (), env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run `python -m module --child JSON` in a fresh process (under `prefix`, e.g. a valgrind command
    line, with `env` added); it prints one JSON line last."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", **(env or {})}
    cmd = [*prefix, sys.executable, "-m", module, "--threads", str(threads), "--child", json.dumps(payload)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{module} child failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def rss_mb() -> float:
    """Current resident set size (VmRSS) in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def peak_rss_mb() -> float:
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--quick", action="store_true", help="few repetitions: a smoke test, not a measurement")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1, as the app)")
    p.add_argument("--browser", action="store_true", help="also run the Playwright toggle-to-update test")
    p.add_argument("--json", metavar="PATH", help="also write the report as JSON (run_all reads it)")
    p.add_argument("--child", metavar="JSON", help=argparse.SUPPRESS)
    return p


def setup(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    import logging
    logging.basicConfig(level=logging.ERROR)


def main(run: Callable[[argparse.Namespace], Report], description: str,
         child: Callable[[dict[str, Any]], dict[str, Any]] | None = None) -> None:
    args = parser(description).parse_args()
    setup(args)
    if args.child is not None:
        if child is None:
            raise SystemExit("this benchmark has no child mode")
        print(json.dumps(child(json.loads(args.child))))
        return
    t0, load0 = time.perf_counter(), os.getloadavg()[0]
    rep = run(args)
    rep.seconds = time.perf_counter() - t0
    rep.notes.append(f"{rep.seconds:.0f} s; {torch.get_num_threads()} torch thread(s); load average (1 min) "
                     f"{load0:.2f} before, {os.getloadavg()[0]:.2f} after")
    print(rep.render())
    if args.json:
        Path(args.json).write_text(json.dumps(asdict(rep)))
    if args.quick:
        print("(QUICK mode: a smoke test with few repetitions, not a measurement)")


def reps(args: argparse.Namespace, full: int, quick: int = 3) -> int:
    return quick if args.quick else full


def peers_available() -> dict[str, str | None]:
    """Version of each peer package, or None when it is not installed."""
    from importlib.metadata import PackageNotFoundError, version
    out = {}
    for pkg in ("transformers", "transformer-lens", "nnsight"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = None
    return out


def write_section(path: Path, text: str, markers: tuple[str, str]) -> None:
    """Put `text` between a benchmark's `markers` in `path` (appended the first time); the rest of the
    file is left as it is."""
    body = f"{markers[0]}\n{text.rstrip()}\n{markers[1]}\n"
    old = path.read_text(encoding="utf-8") if path.is_file() else ""
    if markers[0] in old and markers[1] in old:
        head, rest = old.split(markers[0], 1)
        new = head + body + rest.split(markers[1], 1)[1].lstrip("\n")
    else:
        new = old.rstrip("\n") + "\n\n" + body
    path.write_text(new, encoding="utf-8")
