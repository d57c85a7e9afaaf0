"""Run every benchmark and write benchmarks/RESULTS.md from the numbers they measured.

    python -m benchmarks.run_all [--quick] [--threads N] [--browser] [--only trace,peers,...]

Each benchmark runs in its own process (so one peer's import side effects cannot slow another
benchmark) and hands its report back as JSON; every goal's status is computed from the measured
value by benchmarks/common.py, never typed. Exit status 1 if a benchmark crashed.
"""
from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks import common as C

BENCHMARKS = ("trace", "floor", "peers", "generate", "ablation", "export", "scale", "memory", "routes", "hf")
RESULTS = Path(__file__).resolve().parent / "RESULTS.md"


def git_version() -> str:
    try:
        return subprocess.run(["git", "describe", "--always", "--dirty"], cwd=C.ROOT, capture_output=True,
                              text=True, timeout=10).stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def run_one(name: str, args) -> C.Report | str:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "report.json"
        cmd = [sys.executable, "-m", f"benchmarks.bench_{name}", "--threads", str(args.threads), "--json", str(out)]
        cmd += ["--quick"] if args.quick else []
        cmd += ["--browser"] if args.browser and name == "ablation" else []
        proc = subprocess.run(cmd, cwd=C.ROOT)
        if proc.returncode != 0 or not out.is_file():
            return f"bench_{name} failed (exit status {proc.returncode}); see its output above"
        return C.Report.from_dict(json.loads(out.read_text()))


def results_md(reports: dict[str, C.Report | str], args, machine: dict, load_end: float, seconds: float) -> str:
    mode = "QUICK (a smoke test with few repetitions: NOT a measurement)" if args.quick else "full"
    lines = ["# RouteScope benchmark results", "",
             f"Written by `python -m benchmarks.run_all{' --quick' if args.quick else ''}` on "
             f"{dt.datetime.now().isoformat(timespec='seconds')} at `{git_version()}`; mode: {mode}; "
             f"{seconds / 60:.1f} minutes. Every number below was measured in that run; every status was computed "
             "from it. Compared variants were timed alternately in one loop of one process; tables show medians.", ""]
    m = C.Table("Machine", ["", "value"])
    for k, v in machine.items():
        m.add(k, str(v))
    m.add("load average (1 min) at the end", f"{load_end:.2f}")
    peers = C.peers_available()
    m.add("peers", ", ".join(f"{k} {v or 'not installed'}" for k, v in peers.items()))
    lines.append(m.render())
    goals = [g for r in reports.values() if isinstance(r, C.Report) for g in r.goals]
    summary = C.Table("Goals", ["goal", "what", "target", "measured", "status", "note"], [g.row() for g in goals])
    counts = {s: sum(g.status == s for g in goals) for s in ("met", "not met", "not measured")}
    summary.notes.append(", ".join(f"{n} {s}" for s, n in counts.items()))
    lines.append(summary.render())
    for name, r in reports.items():
        lines.append(r.render() if isinstance(r, C.Report) else f"## bench_{name}\n\n{r}\n")
    return "\n".join(lines)


def main() -> int:
    p = C.parser(__doc__)
    p.add_argument("--only", help=f"comma-separated subset of {','.join(BENCHMARKS)}")
    p.add_argument("--out", default=str(RESULTS), help="where to write the results (default benchmarks/RESULTS.md)")
    args = p.parse_args()
    C.setup(args)
    names = args.only.split(",") if args.only else list(BENCHMARKS)
    unknown = sorted(set(names) - set(BENCHMARKS))
    if unknown:
        p.error(f"unknown benchmark(s) {', '.join(unknown)}; known: {', '.join(BENCHMARKS)}")
    machine = C.machine()
    t0 = dt.datetime.now()
    reports = {name: run_one(name, args) for name in names}
    seconds = (dt.datetime.now() - t0).total_seconds()
    text = results_md(reports, args, machine, os.getloadavg()[0], seconds)
    Path(args.out).write_text(text, encoding="utf-8")
    print(f"wrote {args.out}")
    return 1 if any(isinstance(r, str) for r in reports.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
