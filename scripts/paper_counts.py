"""Count every entry of core_models.paper_configs.PAPER_CONFIGS at its paper's configuration, built
on the meta device (no memory, no initialisation cost), and write the paper-scale table of
docs/papers.md between the markers below. Nothing in the table is typed by hand: `ours` is measured here, `paper`
and `source` come from the registry entry.

    python scripts/paper_counts.py           # rewrite the table in docs/papers.md
    python scripts/paper_counts.py --check   # exit 1 if docs/papers.md is out of date
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "papers.md"  # the table's page (the README links to it)
if str(ROOT) not in sys.path:  # run as a file from a checkout
    sys.path.insert(0, str(ROOT))

from routescope.core_models import build_model, from_name  # noqa: E402
from routescope.core_models.paper_configs import PAPER_CONFIGS, PaperConfig, PaperCount  # noqa: E402

START, END = "<!-- paper-counts:start -->", "<!-- paper-counts:end -->"
HEADER = ("| model | what | ours | paper | source | rel. diff | within paper rounding |\n"
          "|---|---|---|---|---|---|---|\n")


class PaperCountError(ValueError):
    """An entry cannot be built or counted, or the page lacks the markers; the message says which."""


@dataclass(frozen=True)
class Row:
    model: str
    what: str
    ours: int
    stated: float | None
    source: str
    rel_tol: float
    asserted: bool = True
    why: str = ""

    @property
    def rel_diff(self) -> float | None:
        return None if self.stated is None else (self.ours - self.stated) / self.stated

    @property
    def within(self) -> bool:
        return self.stated is not None and abs(self.rel_diff) <= self.rel_tol

    @property
    def verdict(self) -> str:
        if self.stated is None:
            return f"not checked: {self.why}"
        word = "yes" if self.within else "NO"
        return word if self.asserted else f"{word} (not asserted: {self.why})"


def build_on_meta(entry: PaperConfig) -> torch.nn.Module:
    try:
        config = from_name(entry.preset, **entry.overrides)
        with torch.device("meta"):
            return build_model(config)
    except Exception as e:  # a wrong entry (unknown field, bad value) is named, not a traceback
        raise PaperCountError(f"paper_configs entry {entry.name!r}: {e}") from e


def count(model: torch.nn.Module, pc: PaperCount) -> int:
    """All parameters (tied weights once), or those whose name matches one of `pc.params`."""
    named = dict(model.named_parameters())  # named_parameters() lists a tied tensor once
    if not pc.params:
        return sum(p.numel() for p in named.values())
    unmatched = [pat for pat in pc.params if not any(fnmatchcase(n, pat) for n in named)]
    if unmatched:
        raise PaperCountError(f"row {pc.what!r}: pattern(s) {', '.join(unmatched)} match no parameter name")
    return sum(p.numel() for n, p in named.items() if any(fnmatchcase(n, pat) for pat in pc.params))


def entry_rows(entry: PaperConfig) -> list[Row]:
    model = build_on_meta(entry)
    rows = []
    for pc in entry.counts:
        try:
            n = count(model, pc)
        except PaperCountError as e:
            raise PaperCountError(f"paper_configs entry {entry.name!r}, {e}") from e
        rows.append(Row(entry.name, pc.what, n, pc.stated, pc.source, pc.rel_tol, pc.asserted, pc.why))
    return rows


def all_rows(entries: list[PaperConfig] = PAPER_CONFIGS) -> list[Row]:
    return [row for entry in entries for row in entry_rows(entry)]


def _stated(x: float | None) -> str:
    """As the paper writes it: exact counts with digit groups, rounded ones in millions."""
    if x is None:
        return "n/a"
    return f"{int(x):,}" if x == int(x) and x % 10_000 else f"{x / 1e6:g}M"


def render(rows: list[Row]) -> str:
    lines = [f"| {r.model} | {r.what} | {r.ours:,} ({r.ours / 1e6:.2f}M) | {_stated(r.stated)} "
             f"| {r.source} | {'-' if r.rel_diff is None else f'{r.rel_diff:+.3%}'} | {r.verdict} |" for r in rows]
    return HEADER + "\n".join(lines) + ("\n" if lines else "")


def splice(text: str, table: str) -> str:
    """The page's text with the part between the markers replaced by `table`."""
    if text.count(START) != 1 or text.count(END) != 1 or text.index(START) > text.index(END):
        raise PaperCountError(f"expected one {START} line followed by one {END} line")
    head, rest = text.split(START)
    _, tail = rest.split(END)
    return f"{head}{START}\n{table}{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--page", type=Path, default=PAGE, help="the page holding the table (default: docs/papers.md)")
    ap.add_argument("--check", action="store_true", help="only report whether the page's table is up to date")
    args = ap.parse_args(argv)
    try:
        rows = all_rows()
        text = args.page.read_text()
        new = splice(text, render(rows))
    except PaperCountError as e:
        where = f"{args.page}: " if "paper-counts" in str(e) else ""
        print(f"paper_counts: {where}{e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"paper_counts: {args.page}: {e.strerror or e}", file=sys.stderr)
        return 2
    if args.check:
        if new != text:
            print(f"paper_counts: {args.page} is out of date; run python scripts/paper_counts.py", file=sys.stderr)
            return 1
        return 0
    if new != text:
        tmp = args.page.with_name(args.page.name + ".tmp")
        tmp.write_text(new)
        tmp.replace(args.page)  # all or nothing
    sys.stdout.write(render(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
