"""Write the routes table of every shipped PaPaformer checkpoint into checkpoints/README.md, between
the markers below: route shares and routing accuracy on the paper's Table 6 probes (ours at the
last prompt token and by majority over the prompt's tokens, beside the paper's own routes) and on
the held-out probes (analysis/data/heldout_probes.tsv). Every number is measured here
(analysis.runs.domain.probe_routes / route_summary); nothing is typed by hand.

    .venv/bin/python scripts/routes_table.py            # rewrite the block, print it
    .venv/bin/python scripts/routes_table.py --check    # exit 1 if the README's block is stale
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "checkpoints"
START, END = "<!-- routes-table:start -->", "<!-- routes-table:end -->"
ORDER = ["papaformer-share-linear", "papaformer-gumbel-v1", "papaformer-gumbel-v2"]
READINGS = (("last token", False), ("majority", True))


def papaformer_checkpoints(root: Path = ROOT) -> list[Path]:
    """The checkpoints under `root` whose family reads Table 6 routes (its spec declares the probes)."""
    from routescope.analysis.runs.domain import require_table6
    from routescope.core_models.checkpoint import CONFIG, WEIGHTS, read_config
    from routescope.core_models.registry import build_model, config_from_dict

    def table6_applies(d: Path) -> bool:
        try:
            require_table6(build_model(config_from_dict(read_config(d)), device="meta"))
            return True
        except ValueError:
            return False

    found = [d for d in root.iterdir() if not d.name.startswith(".")  # not the train_all's temporary compositions
             and (d / CONFIG).is_file() and (d / WEIGHTS).is_file() and table6_applies(d)]
    return sorted(found, key=lambda d: (ORDER.index(d.name) if d.name in ORDER else len(ORDER), d.name))


def measure(path: Path) -> list[dict]:
    """One record per (probe set, reading, source) of a checkpoint: its route shares, accuracy and
    route count (metric -> value), as analysis.runs.domain.table6_summary gives them."""
    from routescope.analysis.runs import domain as D
    from routescope.core_models.checkpoint import load_checkpoint

    model, tok = load_checkpoint(path)
    cfg = model.config
    out = []
    for set_name, source in D.PROBE_SETS.items():
        probes = D.read_probes(source)
        for reading, majority in READINGS:
            routes = D.probe_routes(model, tok, probes, majority=majority)
            summ = D.table6_summary(cfg, ours=routes)
            out.append({"probes": set_name, "reading": reading, "source": "ours",
                        **dict(zip(summ["metric"], summ["value"]))})
        paper = D.paper_routes(probes, cfg.combiner)
        if paper is not None:
            summ = D.table6_summary(cfg, paper=paper)
            out.append({"probes": set_name, "reading": "paper's routes", "source": "paper",
                        **dict(zip(summ["metric"], summ["value"]))})
    return out


def _pct(v) -> str:
    return "" if v is None or v != v else f"{v:.1%}"


def render(measured: dict[str, list[dict]], root: Path = ROOT) -> str:
    lines = [START, "", "## Routes: ours vs the paper (PaPaformer Table 6)", "",
             "Routes 1-based as in the paper: route 1 = the story path (path-story), route 2 = the math path, "
             "combined = the Gumbel router's combined representation; Share-Linear's route is the path whose "
             "output has the highest cosine with the combined output (undefined, so not counted, in the last "
             "layer, whose Share grows to d). Accuracy: (prompt, layer) routes equal to the probe's expected path "
             "(story -> 1, math -> 2). Table 6: the paper's 20 probes; held-out: 40 prompts written for this "
             "project after training (analysis/data/heldout_probes.tsv). Written by `scripts/routes_table.py`.",
             "", "| checkpoint | probes | routes read at | route 1 | route 2 | combined | accuracy | routes | report |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, records in measured.items():
        report = f"[report]({name}/report.html)" if (root / name / "report.html").is_file() else ""
        for k, r in enumerate(records):
            first = k == 0
            lines.append(f"| {f'[{name}]({name}/README.md)' if first else ''} | {r['probes']} | {r['reading']} "
                         f"| {_pct(r.get('route 1'))} | {_pct(r.get('route 2'))} | {_pct(r.get('combined'))} "
                         f"| {_pct(r.get('accuracy'))} | {int(r['n_routes'])} | {report if first else ''} |")
    lines += ["", END]
    return "\n".join(lines) + "\n"


def block_of(text: str) -> str | None:
    m = re.search(re.escape(START) + r".*?" + re.escape(END) + r"\n?", text, re.S)
    return m.group(0) if m else None


def with_block(text: str, block: str) -> str:
    old = block_of(text)
    return text.replace(old, block) if old else text.rstrip("\n") + "\n\n" + block


def main(argv: list[str] | None = None, root: Path = ROOT) -> int:
    import torch

    torch.set_num_threads(1)
    argv = sys.argv[1:] if argv is None else argv
    block = render({d.name: measure(d) for d in papaformer_checkpoints(root)}, root)
    readme = root / "README.md"
    text = readme.read_text() if readme.is_file() else ""
    if "--check" in argv:
        if block_of(text) != block:
            sys.stderr.write(f"{readme}: the routes table is stale; run scripts/routes_table.py\n")
            return 1
        return 0
    readme.write_text(with_block(text, block))
    sys.stdout.write(block)
    return 0


if __name__ == "__main__":
    sys.exit(main())
