"""Ablation controls: drop options everywhere or per layer, force routes, pgpt-1 in one click."""
from __future__ import annotations

import streamlit as st

from analysis.session import can_force, option_labels
from core_models.runtime import Ablation

from .. import state as K

AUTO = "auto"


def controls(model) -> Ablation:
    layers = model.routing_layers()
    if not layers:
        st.info("This model has no paths, blocks or experts to switch off.")
        return Ablation()
    labels = option_labels(model)
    drop, force = [], []
    n_global = min(layers.values())
    first = labels[next(iter(layers))]
    if model.config.family == "pgpt":
        if st.checkbox("pgpt-1: keep path 1 only", key=K.PGPT_ONE,
                       help="Drop every other path; the remaining weight renormalises to 1 and the dropped "
                            "paths are not computed"):
            drop += [("*", j) for j in range(1, n_global)]
    st.caption("Drop everywhere")
    for j in range(n_global):
        if st.checkbox(f"Drop {first[j]}", key=f"{K.DROP_GLOBAL}::{j}"):
            drop.append(("*", j))
    with st.expander("Per layer", expanded=False):
        for layer, n in layers.items():
            chosen = st.multiselect(f"{layer}: drop", list(range(n)), format_func=lambda j, l=layer: labels[l][j],
                                    key=K.drop_key(layer))
            drop += [(layer, j) for j in chosen]
            if can_force(model):
                route = st.selectbox(f"{layer}: force route", [AUTO] + list(range(n)), key=K.force_key(layer),
                                     format_func=lambda j, l=layer: j if j == AUTO else labels[l][j])
                if route != AUTO:
                    force.append((layer, int(route)))
    return Ablation(drop=tuple(sorted(set(drop))), force=tuple(force))
