"""Issue 15 item 7: `routescope routes` at scale (streamed, batched): peak RSS and probes/s.

Probes: first sentences of training documents, story and math alternating
(routescope.corpora.corpus via common.corpus_prompts), expected_path 1 for story and 2 for
math, written to a probe TSV beforehand. Each size runs `python -m cli routes CHECKPOINT
--probes FILE --json --quiet` (the `routescope` entry point's own main) in a fresh process; its
peak RSS is that child's ru_maxrss (os.wait4), its JSON output is checked to list every probe.
Goal: peak RSS at 20,000 probes / at 1,000 <= 1.2x. --quick uses 200 and 2,000 probes.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import common as C

CHECKPOINT = "papaformer-gumbel-v2"


def probes_file(n: int) -> Path:
    path = C.CACHE / f"probes-{n}.tsv"
    if not path.is_file():
        C.CACHE.mkdir(parents=True, exist_ok=True)
        rows = [f"S{k}\t{('story', 'math')[k % 2]}\t{1 + k % 2}\t{p}" for k, p in enumerate(C.corpus_prompts(n))]
        path.write_text("prompt_id\tdomain\texpected_path\tprompt\n" + "\n".join(rows) + "\n", encoding="utf-8")
    return path


def run_routes(checkpoint: Path, probes: Path, n: int, threads: int) -> dict:
    """Run `routes` in a child process; its wall time, peak RSS (MiB) and a check of its output."""
    with tempfile.TemporaryFile("w+", encoding="utf-8") as out, tempfile.TemporaryFile("w+") as err:
        cmd = [sys.executable, "-m", "routescope.cli", "--threads", str(threads), "routes", str(checkpoint),
               "--probes", str(probes), "--json", "--quiet"]
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=C.ROOT, stdout=out, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)  # this child's own rusage (RUSAGE_CHILDREN would be a max over all)
        seconds = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            err.seek(0)
            raise RuntimeError(f"routes over {n} probes failed ({proc.returncode}): {err.read().strip()[-2000:]}")
        out.seek(0)
        listed = len(json.load(out)["prompts"])
    if listed != n:
        raise RuntimeError(f"routes listed {listed} of {n} probes")
    return {"seconds": seconds, "peak_rss_mb": usage.ru_maxrss / 1024}  # ru_maxrss: KiB on Linux


def run(args) -> C.Report:
    rep = C.Report("bench_routes", "Issue 15.7: `routescope routes` at scale (streamed, batched)")
    ckpt, source = C.checkpoint_dir(CHECKPOINT)
    sizes = (200, 2000) if args.quick else (1000, 20000)
    res = {n: run_routes(ckpt, probes_file(n), n, args.threads) for n in sizes}
    t = C.Table(f"`routes {CHECKPOINT}` ({source}) --json, default --batch-size, fresh process per size",
                ["probes", "seconds", "probes/s", "peak RSS MiB"])
    for n, r in res.items():
        t.add(f"{n:,}", r["seconds"], n / r["seconds"], r["peak_rss_mb"])
    rep.tables.append(t)
    small, big = sizes
    growth = res[big]["peak_rss_mb"] / res[small]["peak_rss_mb"]
    rep.goals.append(C.Goal("routes.memory", f"peak RSS at {big:,} probes / at {small:,}", "<=", 1.2, growth,
                            note="quick sizes, not the issue's 1,000 vs 20,000" if args.quick else ""))
    rep.notes.append(f"probes/s over {big:,} probes: {big / res[big]['seconds']:.1f} (reported; no goal number; "
                     f"the issue's report before streaming: 87,440 probes in 12 min 40 s = 115 probes/s, 7.6 GB)")
    return rep


if __name__ == "__main__":
    C.main(run, __doc__)
