"""Every family at its paper's configuration (core_models/paper_configs.py) counts what the paper
states, within the paper's rounding; the table in docs/papers.md is what scripts/paper_counts.py writes."""
import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from routescope.core_models import param_count
from routescope.core_models.paper_configs import PAPER_CONFIGS, PaperConfig, PaperCount

from tiny_models import tiny_model

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("paper_counts", ROOT / "scripts" / "paper_counts.py")
paper_counts = sys.modules["paper_counts"] = importlib.util.module_from_spec(_spec)  # dataclasses look it up
_spec.loader.exec_module(paper_counts)

ROWS = [(entry, pc) for entry in PAPER_CONFIGS for pc in entry.counts if pc.stated is not None and pc.asserted]


@pytest.mark.parametrize("entry,pc", ROWS, ids=[f"{e.name}: {pc.what}" for e, pc in ROWS])
def test_count_within_the_papers_rounding(entry, pc):
    model = paper_counts.build_on_meta(entry)
    assert all(p.is_meta for p in model.parameters())  # nothing allocated
    ours = paper_counts.count(model, pc)
    assert abs(ours - pc.stated) <= pc.rel_tol * pc.stated, (
        f"{entry.name} {pc.what}: ours {ours:,} vs paper {pc.stated:,.0f} ({pc.source}), "
        f"rel. diff {(ours - pc.stated) / pc.stated:+.3%} > {pc.rel_tol:.3%}")
    if not pc.params:  # a total is also the family's closed-form count
        assert ours == param_count(model.config)


def test_every_entry_states_something():
    for entry in PAPER_CONFIGS:
        assert entry.counts, f"{entry.name}: no stated count, so nothing is checked (a placeholder entry)"
        for pc in entry.counts:
            assert pc.source and 0 < pc.rel_tol < 0.1, entry.name
            assert pc.stated is None or pc.stated > 0, entry.name
            if pc.stated is None or not pc.asserted:  # shown, not asserted: the table must say why
                assert pc.why, f"{entry.name} {pc.what}: a row that is not asserted needs its reason"


def test_unasserted_rows_say_so_in_the_table():
    shown = paper_counts.Row("m", "total", 317_523_983, 361e6, "T", 0.5e6 / 361e6, asserted=False, why="r")
    missing = paper_counts.Row("m", "total", 29_354_752, None, "T", 0.005, why="no table")
    assert shown.verdict == "NO (not asserted: r)" and missing.verdict == "not checked: no table"
    table = paper_counts.render([shown, missing])
    assert "| 361M | T | -12.043% | NO (not asserted: r) |" in table and "| n/a | T | - | not checked: no table |" in table


def test_component_patterns_count_the_matching_parameters():
    model = tiny_model("pgpt")
    total = paper_counts.count(model, PaperCount("total", 1.0, "-"))
    path0 = paper_counts.count(model, PaperCount("path 0", 1.0, "-", params=("paths.0.*",)))
    blocks = paper_counts.count(model, PaperCount("blocks", 1.0, "-", params=("paths.*.blocks.*", "ln_f.*")))
    assert total == sum(p.numel() for p in model.parameters())  # tied head counted once
    assert path0 == sum(p.numel() for p in model.paths[0].parameters())
    assert blocks == sum(p.numel() for path in model.paths for p in path.blocks.parameters()) + model.ln_f.weight.numel()
    with pytest.raises(paper_counts.PaperCountError, match="paths.7"):
        paper_counts.count(model, PaperCount("none", 1.0, "-", params=("paths.7.*",)))


def test_a_wrong_entry_is_named():
    bad = PaperConfig(name="lgpt (typo)", preset="lgpt", overrides=dict(wingspan=3), counts=(PaperCount("total", 1e6, "-"),))
    with pytest.raises(paper_counts.PaperCountError, match=r"lgpt \(typo\).*wingspan"):
        paper_counts.entry_rows(bad)


def test_rows_report_the_relative_difference_and_the_verdict():
    row = paper_counts.Row("m", "total", 36_423_936, 36.4e6, "-", 0.05e6 / 36.4e6)
    assert row.rel_diff == pytest.approx(23_936 / 36.4e6, rel=1e-12) and row.within
    assert not paper_counts.Row("m", "total", 36_460_000, 36.4e6, "-", 0.05e6 / 36.4e6).within


def test_readme_table_is_up_to_date():
    """The paper-scale table (docs/papers.md; the README links to it) is what the counts give now."""
    page = paper_counts.PAGE.read_text()
    expected = paper_counts.splice(page, paper_counts.render(paper_counts.all_rows()))
    assert page == expected, "docs/papers.md paper-scale table is out of date: run python scripts/paper_counts.py"


def test_splice_needs_both_markers():
    with pytest.raises(paper_counts.PaperCountError, match="paper-counts:start"):
        paper_counts.splice("# no markers\n", "table")
    text = f"a\n{paper_counts.START}\nold\n{paper_counts.END}\nb\n"
    assert paper_counts.splice(text, "new\n") == f"a\n{paper_counts.START}\nnew\n{paper_counts.END}\nb\n"


def test_meta_build_matches_a_real_build():
    entry = PaperConfig("lgpt (small)", "lgpt", dict(d_model=64, n_layers=4, n_heads=2, vocab_size=50, context=8),
                        (PaperCount("total", 1.0, "-"),))
    meta = paper_counts.build_on_meta(entry)
    assert [(n, p.shape) for n, p in meta.named_parameters()] == \
        [(n, p.shape) for n, p in paper_counts.build_model(meta.config).named_parameters()]
    assert not any(p.is_meta for p in paper_counts.build_model(meta.config).parameters())
    assert torch.device("meta") == next(meta.parameters()).device


# --- PaPaformer Table 2: what its totals show ------------------------------------------------

def _papa_entries():
    names = ("LLaMA_256 (PaPaformer base, paper)", "LLaMA_192 (PaPaformer base, paper)",
             "path (PaPaformer Path 1 & 2, paper)", "papaformer-share-linear (paper)")
    by_name = {e.name: e for e in PAPER_CONFIGS}
    return [by_name[n] for n in names]


def test_papaformer_table_2_rows_are_present_with_the_papers_totals():
    stated = {e.name: next(pc.stated for pc in e.counts if pc.what == "total") for e in _papa_entries()}
    assert list(stated.values()) == [32e6, 22.5e6, 13.5e6, 28.5e6]
    for e in PAPER_CONFIGS:
        if e.preset.startswith("papaformer"):
            assert any(pc.what == "total" and pc.stated == 28.5e6 for pc in e.counts), e.name
    rendered = paper_counts.render(paper_counts.all_rows())
    assert "could not be read" not in rendered and "| 13.5M |" in rendered and "| 22.5M |" in rendered


def test_parallel_minus_two_paths_has_no_vocabulary_term():
    path_e, par_e = _papa_entries()[2:]
    diff_row = next(pc for pc in par_e.counts if pc.what.startswith("Parallel - 2 x Path"))
    counts = {}
    for V in (50278, 1000):  # the difference is the same at any vocabulary
        path = paper_counts.build_on_meta(PaperConfig(path_e.name, path_e.preset, {**path_e.overrides, "vocab_size": V}))
        par_over = {**par_e.overrides, "vocab_size": V, "pad_id": V - 1}
        par = paper_counts.build_on_meta(PaperConfig(par_e.name, par_e.preset, par_over))
        total = lambda m: sum(p.numel() for p in m.parameters())
        counts[V] = total(par) - 2 * total(path)
        assert paper_counts.count(par, diff_row) == counts[V]  # the row's patterns count exactly the difference
    assert counts[50278] == counts[1000]
    assert diff_row.stated == 28.5e6 - 2 * 13.5e6 and not diff_row.asserted
    # Table 2's two d = 256 blocks alone exceed the paper's difference, whatever the block variant
    big = paper_counts.build_on_meta(_papa_entries()[0])  # LLaMA_256: blocks of the same kind
    two_blocks = sum(p.numel() for n, p in big.named_parameters() if n.startswith(("blocks.0.", "blocks.1.")))
    assert two_blocks > diff_row.stated and counts[1000] > two_blocks


def test_table_2_totals_imply_different_vocabularies():
    """Each total minus its model's vocabulary-free part, over the parameters per vocabulary entry,
    gives the vocabulary that total implies (within the paper's rounding); no one vocabulary fits."""
    intervals = []
    for e in _papa_entries():
        m = paper_counts.build_on_meta(e)
        per_entry = sum(p.numel() for n, p in m.named_parameters() if n.startswith(("embed", "head"))) / e.overrides["vocab_size"]
        rest = sum(p.numel() for n, p in m.named_parameters() if not n.startswith(("embed", "head")))
        pc = next(pc for pc in e.counts if pc.what == "total")
        lo, hi = ((pc.stated + s * pc.rel_tol * pc.stated - rest) / per_entry for s in (-1, 1))
        assert 45_000 < lo < hi < 51_000, e.name  # "~50K"
        intervals.append((lo, hi))
    common_lo, common_hi = max(lo for lo, _ in intervals), min(hi for _, hi in intervals)
    assert common_lo > common_hi  # the intervals share no vocabulary


@pytest.mark.parametrize("entry", PAPER_CONFIGS, ids=[e.name for e in PAPER_CONFIGS])
def test_every_entry_builds_what_its_closed_form_counts(entry):
    model = paper_counts.build_on_meta(entry)
    assert sum(p.numel() for p in model.parameters()) == param_count(model.config)


def test_deviations_table_rows_cite_the_papers():
    """Every row of the deviations table (docs/papers.md) names where in the paper (or its code) it departs,
    and the places the second fidelity pass found each have their row."""
    import re

    page = paper_counts.PAGE.read_text()
    section = page[page.index("## Deviations from the papers"):page.index("## Paper-scale parameter counts")]
    rows = [line.split(" | ") for line in section.splitlines() if line.startswith("| ") and not line.startswith("| family")
            and not line.startswith("|---")]
    assert len(rows) >= 25
    cite = re.compile(r"eqs?\. \d|Table [0-9IVX]|§\d|Listing \d|Fig\. \d|Algorithm \d|code")
    for cells in rows:
        assert len(cells) == 5, cells[:2]
        assert cite.search(cells[1]), f"row without a citation: {cells[1][:80]}"
    text = "\n".join(" | ".join(c) for c in rows)
    for needle in ("eq. 8 as printed", "eq. 9 as printed", "k + 1 options", "routing=\"sampled\"", "eq. 20", "eq. 22",
                   "Listing 1", "pgpt1-reference", "initialized at 0.5", "38,218,944", "head dim 64"):
        assert needle in text, needle
    assert "Table III depths" not in text  # Table III and the presets agree: no such deviation
