"""Ablation controls: drop options everywhere or per layer, keep one option everywhere, force routes,
and the family's named ablation modes (`model.ablation_modes()`, e.g. pgpt's authors' pgpt-1).

Labels come from the model's routing layers (`RoutingLayer.option_labels`, numbered from 0 like the
ablation specs and the export's `option` column). The widgets' values belong to one checkpoint:
their keys carry the checkpoint's path (the browser keeps a widget's value per key) and `reset_for`
forgets the previous checkpoint's values, so a ticked "drop path 1" never turns into a ticked
"drop expert 1 / block 1" of the next model."""
from __future__ import annotations

import streamlit as st

from routescope.analysis.routing import option_names
from routescope.core_models.base import RouteScopeLM
from routescope.core_models.runtime import ALL_LAYERS, Ablation

from .. import state as K

AUTO = "auto"
ALL = "all options"  # "Keep only" not set (shown as a dash)


def _keep_changed(scope: str, n: int) -> None:
    """"Keep only j" ticks every other Drop box and unticks j's ("—": unticks them all): the boxes are
    the one record of what is dropped everywhere, and always show it."""
    if st.session_state.get(K.ABLATION_OWNER) != scope:  # a widget of the previous checkpoint's last run
        return
    keep = st.session_state.get(K.keep_only_key(scope), ALL)
    for j in range(n):
        st.session_state[K.drop_global_key(scope, j)] = keep != ALL and j != keep


def _drop_changed(scope: str, n: int) -> None:
    """A Drop box changed: "Keep only" shows the one option left, if exactly one is, else "—"."""
    if st.session_state.get(K.ABLATION_OWNER) != scope:
        return
    kept = [j for j in range(n) if not st.session_state.get(K.drop_global_key(scope, j), False)]
    st.session_state[K.keep_only_key(scope)] = kept[0] if n > 1 and len(kept) == 1 else ALL


def reset_for(path: str) -> None:
    """Forget every ablation widget's value when the checkpoint changes."""
    if st.session_state.get(K.ABLATION_OWNER) != path:
        for key in [k for k in st.session_state if K.is_ablation_key(k)]:
            del st.session_state[key]
        st.session_state[K.ABLATION_OWNER] = path


def controls(model: RouteScopeLM, scope: str) -> Ablation:
    """The ablation the widgets describe; `scope`: the checkpoint's path (part of every key)."""
    layers = model.routing_layers()
    modes = tuple(m for m, what in model.ablation_modes().items()
                  if st.checkbox(f"Mode: {m}", key=K.mode_key(scope, m), help=what))
    if not layers:
        st.info("This model has no paths, blocks or experts to switch off.")
        return Ablation(modes=modes)
    labels = model.option_labels()
    n_global = min(layers.values())
    names = option_names(labels, n=n_global)
    drop, force = [], []
    # one source of truth: the Drop boxes; "Keep only" sets them and shows what they leave
    st.selectbox("Keep only", [ALL] + list(range(n_global)), key=K.keep_only_key(scope),
                 format_func=lambda j: "—" if j == ALL else names[j], on_change=_keep_changed, args=(scope, n_global),
                 help="Keep one option and drop every other one everywhere (the Drop boxes below show it): with "
                      "two paths, pgpt-1 of the paper")
    st.caption("Drop everywhere")
    for j in range(n_global):
        if st.checkbox(f"Drop {names[j]}", key=K.drop_global_key(scope, j), on_change=_drop_changed,
                       args=(scope, n_global)):
            drop.append((ALL_LAYERS, j))
    with st.expander("Per layer", expanded=False):
        for layer, n in layers.items():
            chosen = st.multiselect(f"{layer}: drop", list(range(n)), format_func=lambda j, l=layer: labels[l][j],
                                    key=K.drop_key(scope, layer))
            drop += [(layer, j) for j in chosen]
            if model.routing_modules[layer].can_force:
                route = st.selectbox(f"{layer}: force route", [AUTO] + list(range(n)), key=K.force_key(scope, layer),
                                     format_func=lambda j, l=layer: j if j == AUTO else labels[l][j])
                if route != AUTO:
                    force.append((layer, int(route)))
    return Ablation(drop=tuple(sorted(set(drop))), force=tuple(force), modes=modes)


def describe(ablation: Ablation, model: RouteScopeLM) -> str:
    """The ablation as its spec ("drop *:1") and in the layers' own words ("drop path 1")."""
    if ablation.is_empty:
        return "`none`"
    labels = model.option_labels()

    def word(layer: str, o: int) -> str:
        if layer == ALL_LAYERS:
            return f"{option_names(labels, n=o + 1)[o]} everywhere"
        return f"{labels[layer][o]} of {layer}"

    words = ([f"drop {word(l, o)}" for l, o in ablation.drop] + [f"force {word(l, o)}" for l, o in ablation.force]
             + [model.ablation_modes().get(m, m) for m in ablation.modes])
    return f"`{ablation.describe()}` ({', '.join(words)})"
