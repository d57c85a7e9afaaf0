"""Goal 6: batch export through the `routescope export` code path (cli.export.run,
called in-process in a fresh subprocess per size).

Prompts: first sentences of training documents (story and math alternating,
routescope.corpora.corpus), one per line in a .txt file written beforehand. Each size runs in
its own process, which reports its wall time and its peak RSS (resource.getrusage ru_maxrss).
Goals: peak RSS at 10,000 prompts / at 1,000 <= 1.2x; prompts/s over 1,000 prompts is reported.
--quick uses 100 and 500 prompts (throughput then over 500).
"""
from __future__ import annotations

import tempfile
import time
from pathlib import Path

from benchmarks import common as C

CHECKPOINT = "papaformer-gumbel-v2"


def prompts_file(n: int) -> Path:
    path = C.CACHE / f"prompts-{n}.txt"
    if not path.is_file():
        C.CACHE.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(C.corpus_prompts(n)) + "\n", encoding="utf-8")
    return path


def child(payload: dict) -> dict:
    from routescope.cli.main import build_parser
    rss0 = C.rss_mb()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "routes.parquet"
        args = build_parser().parse_args(["export", payload["checkpoint"], "--prompts", payload["prompts"],
                                          "--out", str(out), "--quiet"])
        t0 = time.perf_counter()
        rc = args.func(args)
        seconds = time.perf_counter() - t0
        size = out.stat().st_size
    return {"rc": rc, "seconds": seconds, "rss_start_mb": rss0, "peak_rss_mb": C.peak_rss_mb(), "bytes": size}


def run(args) -> C.Report:
    rep = C.Report("bench_export", "6. Batch export (routescope export code path)")
    ckpt, source = C.checkpoint_dir(CHECKPOINT)
    sizes = (100, 500) if args.quick else (1000, 10000)
    res = {}
    for n in sizes:
        res[n] = C.run_child("benchmarks.bench_export", {"checkpoint": str(ckpt), "prompts": str(prompts_file(n))},
                             args.threads)
        assert res[n]["rc"] == 0
    t = C.Table(f"Export of {CHECKPOINT} ({source}) to Parquet, default --batch-size 8, fresh process per size",
                ["prompts", "seconds", "prompts/s", "RSS at start MiB", "peak RSS MiB", "output MiB"])
    for n, r in res.items():
        t.add(f"{n:,}", r["seconds"], n / r["seconds"], r["rss_start_mb"], r["peak_rss_mb"], r["bytes"] / 2**20)
    rep.tables.append(t)
    small, big = sizes
    growth = res[big]["peak_rss_mb"] / res[small]["peak_rss_mb"]
    rep.goals.append(C.Goal("6.memory", f"peak RSS at {big:,} prompts / at {small:,}", "<=", 1.2, growth,
                            note="quick sizes, not the issue's 1,000 vs 10,000" if args.quick else ""))
    n = 1000 if 1000 in res else big
    rep.notes.append(f"prompts/s over {n:,} prompts: {n / res[n]['seconds']:.1f} (reported; no goal number)")
    return rep


if __name__ == "__main__":
    C.main(run, __doc__, child=child)
