"""Analysis reads a trace only through the roles the model's layers declare: every family's views,
export rows and per-token routes, run on a trace that records what is read, read no site outside
the layers' declared role sites, and never list the trace's names to search them."""
from __future__ import annotations

import pytest
import torch

from routescope.analysis.export.run_table import ExportMeta, RowMeta, routing_table
from routescope.analysis.runs.family_table import family_analysis, routing_views
from routescope.core_models.ablation import Ablation
from routescope.core_models.trace import tracing
from tiny_models import TINY, tiny_model

B, T = 2, 6


class Reads:
    """A trace that remembers every site read from it (`trace[name]`); asking whether a site was
    recorded (`name in trace`) is no read, listing the names is refused."""

    def __init__(self, trace) -> None:
        self.trace, self.read = trace, set()

    def __getitem__(self, name: str):
        self.read.add(name)
        return self.trace[name]

    def __contains__(self, name: object) -> bool:
        return name in self.trace

    def names(self):
        raise AssertionError("analysis listed the trace's site names instead of asking the layers for a role")

    def __getattr__(self, attr: str):
        return getattr(self.trace, attr)


def declared(model) -> set[str]:
    """Every site some layer of the model declares for a role."""
    out = set()
    for m in model.role_layers().values():
        out |= set(m.roles.values())
        for sites in m.option_roles.values():
            out |= set(sites)
    return out


@pytest.mark.parametrize("key", sorted(TINY))
def test_views_export_and_routes_read_only_declared_roles(key):
    model = tiny_model(key)
    options = {"atm_tau": 0.3} if key == "wiola" else {}  # Wiola's merge pass merges at this threshold
    x = torch.randint(0, model.vocab_size, (B, T), generator=torch.Generator().manual_seed(2))
    with torch.no_grad(), tracing() as tr:
        model(x)
    analysis = family_analysis(model)
    second = Reads(analysis.second_pass(model, x[0].tolist(), Ablation(), options)) if analysis.second_pass else None
    reads = Reads(tr)
    views = routing_views(reads, model, second=second, options=options)
    routing_table(reads, model, meta=ExportMeta(model="m", rows=[RowMeta(str(b), x[b].tolist()) for b in range(B)]),
                  views=views)
    sites = declared(model)
    if analysis.route_reader is not None:
        reader = analysis.route_reader(model)
        assert set(reader.sites) <= sites  # what the corpus and probe passes trace
        reader.routes(reads)
    read = reads.read | (second.read if second is not None else set())
    assert read <= sites, sorted(read - sites)
    assert bool(read) == bool(model.routing_modules)  # a routed family's views read its roles
