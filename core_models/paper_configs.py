"""Every family at its paper's own configuration, beside the parameter counts the paper states.

Plain data (litgpt-style): each entry names a preset (or family) plus field overrides and the
paper's stated totals / component rows. `scripts/paper_counts.py` builds each on the meta device,
counts, and writes the README table; tests/models/test_paper_scale.py asserts every row.
Each family's owner keeps its own entries here.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class PaperCount:
    """One stated number: a whole model's total or one component row of a paper's table."""
    what: str  # "total" or a component name, e.g. "stream B per layer"
    stated: float  # the paper's number (parameters)
    source: str  # where the paper states it, e.g. "Table IV", "sec. 4.1"
    rel_tol: float = 0.005  # the paper's rounding (e.g. "38M" -> 0.5M of 38M is about 1.3%)


@dataclass(frozen=True)
class PaperConfig:
    name: str  # row label, e.g. "moep-swiglu (paper)"
    preset: str  # a registry preset name
    overrides: dict[str, Any] = field(default_factory=dict)
    counts: tuple[PaperCount, ...] = ()
    note: str = ""


PAPER_CONFIGS: list[PaperConfig] = [
    # entries are added per family (MoEP, pgpt/lgpt/cgpt, Wiola, PaPaformer, PAGMLP)
]
