"""Issue 14: `routescope export` on 10,000 prompts: the embedded single process against Ray with 1
and 2 workers (the `distributed` extra): prompts/s and per-worker peak RSS.

Prompts: first sentences of training documents, story and math alternating (common.corpus_prompts),
one per line of a .txt file. Checkpoint: papaformer-gumbel-v2 (shipped, else random weights). Every
run is `python -m cli export ... --quiet --device cpu` in a fresh process, prompt rows only, default
--batch-size 8, timed end to end (process start, model load, Ray's cluster start, writing): what a
user waits for. The single process runs with --threads 1 and 2; each Ray worker is one actor with one
torch thread and one CPU (--partition-size 1000, a local cluster started by the command). Peak RSS:
the single process's own ru_maxrss (os.wait4); each Ray worker's ru_maxrss as it wrote it into its
partitions' done markers (the largest over its partitions). Rows are counted in every output and must
agree. --quick: 1,000 prompts. --results PATH writes the tables into PATH's `bench_ray` section.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import common as C

CHECKPOINT = "papaformer-gumbel-v2"
SECTION = ("<!-- bench_ray -->", "<!-- /bench_ray -->")


def prompts_file(n: int) -> Path:
    path = C.CACHE / f"export-prompts-{n}.txt"
    if not path.is_file():
        C.CACHE.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(C.corpus_prompts(n)) + "\n", encoding="utf-8")
    return path


def run_export(args: list[str]) -> tuple[float, float]:
    """(wall seconds, the child's own peak RSS MiB) of `python -m cli <args>`."""
    with tempfile.TemporaryFile("w+") as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", "routescope.cli", *args], cwd=C.ROOT, stdout=subprocess.DEVNULL,
                                stderr=err, env={k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"})
        _, status, usage = os.wait4(proc.pid, 0)  # this child's own rusage
        seconds = time.perf_counter() - t0
        if os.waitstatus_to_exitcode(status) != 0:
            err.seek(0)
            raise RuntimeError(f"export {' '.join(args)} failed: {err.read()[-3000:]}")
    return seconds, usage.ru_maxrss / 1024  # KiB on Linux


def rows_of(path: Path) -> int:
    import pyarrow.parquet as pq
    files = sorted(path.glob("part-*.parquet")) if path.is_dir() else [path]
    return sum(pq.ParquetFile(f).metadata.num_rows for f in files)


def workers_of(out: Path) -> dict[str, dict]:
    """Per Ray worker ("host:pid"): partitions, prompts, largest peak RSS, from the done markers."""
    found: dict[str, dict] = {}
    for marker in sorted((out / "_done").glob("*.json")):
        s = json.loads(marker.read_text())
        w = found.setdefault(s["worker"], {"partitions": 0, "prompts": 0, "peak_rss_mb": 0.0, "seconds": 0.0})
        w["partitions"] += 1
        w["prompts"] += s["prompts"]
        w["seconds"] += s["seconds"]
        w["peak_rss_mb"] = max(w["peak_rss_mb"], s["peak_rss_mb"])
    return found


def run(args) -> C.Report:
    import ray  # noqa: F401  (the distributed extra must be installed)

    rep = C.Report("bench_ray", "Issue 14: export of 10,000 prompts, single process vs Ray workers")
    n = 1000 if args.quick else 10_000
    ckpt, source = C.checkpoint_dir(CHECKPOINT)
    src = prompts_file(n)
    base = ["export", str(ckpt), "--prompts", str(src), "--quiet", "--device", "cpu"]
    runs = [("single process, 1 thread", ["--threads", "1"], []),
            ("single process, 2 threads", ["--threads", "2"], []),
            ("Ray, 1 worker", [], ["--engine", "ray", "--workers", "1"]),
            ("Ray, 2 workers", [], ["--engine", "ray", "--workers", "2"])]
    t = C.Table(f"`routescope export {CHECKPOINT}` ({source}), {n:,} prompts, prompt rows, fresh process per run",
                ["engine", "seconds", "prompts/s", "rows", "peak RSS MiB (per process)"])
    w = C.Table("Ray workers (from their partitions' done markers)",
                ["run", "worker", "partitions", "prompts", "export seconds", "peak RSS MiB"])
    rows, rates = set(), {}
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench-ray-") as tmp:
        for label, pre, extra in runs:
            out = Path(tmp) / (re.sub(r"\W+", "-", label) + ("" if extra else ".parquet"))
            seconds, rss = run_export([*pre, *base, "--out", str(out), *extra, *(["--partition-size", "1000"]
                                                                                 if extra else [])])
            n_rows = rows_of(out)
            rows.add(n_rows)
            rates[label] = n / seconds
            if extra:
                found = workers_of(out)
                t.add(label, seconds, n / seconds, n_rows,
                      ", ".join(f"{v['peak_rss_mb']:.0f}" for v in found.values()) + " (workers)")
                for k, (name, v) in enumerate(found.items()):
                    w.add(label, f"worker {k + 1}", v["partitions"], v["prompts"], v["seconds"], v["peak_rss_mb"])
            else:
                t.add(label, seconds, n / seconds, n_rows, rss)
            shutil.rmtree(out, ignore_errors=True) if out.is_dir() else out.unlink(missing_ok=True)
    if len(rows) != 1:
        raise RuntimeError(f"the runs wrote different row counts: {sorted(rows)}")
    rep.tables += [t, w]
    rep.notes.append(f"Ray 2 workers / Ray 1 worker: {rates['Ray, 2 workers'] / rates['Ray, 1 worker']:.2f}x; "
                     f"Ray 2 workers / single process 1 thread: "
                     f"{rates['Ray, 2 workers'] / rates['single process, 1 thread']:.2f}x; "
                     f"/ 2 threads: {rates['Ray, 2 workers'] / rates['single process, 2 threads']:.2f}x")
    rep.notes.append(f"{os.cpu_count()} cores; load average (1 min) {load_before:.2f} before the runs, "
                     f"{os.getloadavg()[0]:.2f} after")
    return rep



def main() -> None:
    """common.main, and --results: the rendered report also written into a results file's section."""
    import torch

    p = C.parser(__doc__)
    p.add_argument("--results", metavar="PATH", help="write the report into PATH's bench_ray section "
                                                     "(e.g. benchmarks/RESULTS.md); the rest of PATH is kept")
    args = p.parse_args()
    C.setup(args)
    t0, load0 = time.perf_counter(), os.getloadavg()[0]
    rep = run(args)
    rep.seconds = time.perf_counter() - t0
    rep.notes.append(f"{rep.seconds:.0f} s in all; the driver ran {torch.get_num_threads()} torch thread(s); load "
                     f"average (1 min) {load0:.2f} before, {os.getloadavg()[0]:.2f} after")
    text = rep.render() + ("\n(QUICK mode: 1,000 prompts, a smoke test, not the measurement)\n" if args.quick else "")
    print(text)
    if args.json:
        Path(args.json).write_text(json.dumps(dataclasses.asdict(rep)))
    if args.results:
        C.write_section(Path(args.results), text, SECTION)


if __name__ == "__main__":
    main()
