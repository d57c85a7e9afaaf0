"""Ablation controls: drop options everywhere or per layer, keep one option everywhere, force routes,
and the family's named ablation modes (`model.ablation_modes()`, e.g. pgpt's authors' pgpt-1).

Labels come from the model's routing layers (`RoutingLayer.option_labels`, numbered from 0 like the
ablation specs and the export's `option` column). The widgets' values belong to one checkpoint:
their keys carry the checkpoint's path (the browser keeps a widget's value per key) and `reset_for`
forgets the previous checkpoint's values, so a ticked "drop path 1" never turns into a ticked
"drop expert 1 / block 1" of the next model.

Layers of up to FEW_OPTIONS options (the seed families' 2 to 4 paths) get one Drop box per option;
layers with more (a 64- to 256-expert MoE) get controls whose height does not grow with the model: a
searchable "Drop everywhere" list, one layer's controls at a time behind a searchable layer picker,
and, for every model, the spec box (the grammar of the CLI's --drop: ranges, globs, "all but", the N
most used), so that 128 experts x 48 layers fit in about one screen."""
from __future__ import annotations

import re
from dataclasses import replace

import streamlit as st

from routescope.analysis.runs.routing import option_names
from routescope.core_models.ablation import Ablation, applicable
from routescope.core_models.base import RouteScopeLM
from routescope.core_models.specs import ALL_LAYERS, SPEC_HELP, Usage

from routescope.app import state as K

AUTO = "auto"
ALL = "all options"  # "Keep only" not set (shown as a dash)
FEW_OPTIONS = 8  # layers with at most this many options get one checkbox per option
SPEC_BOX_HELP = ("One spec a line (or separated by ';'), as the command line's --drop takes them: " + SPEC_HELP
                 + ". 'force LAYER:OPTION' forces a route; 'mode NAME' a named ablation. Examples: "
                 "'*:0-3', 'model.layers.3.mlp.gate:0-15', 'model.layers.*.mlp.gate:!0' (keep only 0), "
                 "'*:top8' (the 8 experts each layer picks most for this prompt), '*:top8@corpus' (over the "
                 "dataset the Corpus view last ran without an ablation). A spec that cannot apply is left out, saying "
                 "why in one line; the others apply.")


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


def controls(model: RouteScopeLM, scope: str, usage: Usage | None = None) -> Ablation:
    """The ablation the widgets describe; `scope`: the checkpoint's path (part of every key);
    `usage(source)`: the counts "top N" specs rank by (None: such specs are refused). Its `specs`
    record every choice: the widgets' as specs ("*:1"), then the typed specs that apply."""
    layers = model.routing_layers()
    modes = tuple(m for m, what in model.ablation_modes().items()
                  if st.checkbox(f"Mode: {m}", key=K.mode_key(scope, m), help=what))
    if not layers:
        st.info("This model has no paths, blocks or experts to switch off.")
        return Ablation(modes=modes, specs=tuple(f"mode {m}" for m in modes))
    labels = model.option_labels()
    few = max(layers.values()) <= FEW_OPTIONS
    if not few:
        typed, notes = _spec_box(scope), st.container()
    drop, force = (_checkboxes if few else _searchable)(model, scope, layers, labels)
    if few:
        with st.expander("Specs (ranges, all but, most used)"):
            typed, notes = _spec_box(scope), st.container()
    widgets = Ablation(drop=tuple(drop), force=tuple(force), modes=modes)  # one force per layer: no clash
    widgets = replace(widgets, specs=tuple(p.removeprefix("drop ") for p in widgets.parts()))
    ab, left_out = applicable(*typed, layers=layers, known_modes=model.ablation_modes(), top_k=model.routing_top_k(),
                              usage=usage, base=widgets)
    for spec, why in left_out:  # the others apply
        notes.warning(f"Left out `{spec}`: {why}")
    return ab


def spec_lines(text: str) -> tuple[list[str], list[str], list[str]]:
    """The spec box's text -> (drop specs, force specs, modes): one a line or ';'-separated, "drop " /
    "force " / "mode " in front where wanted (so `Ablation.parts()` reads back), '#' starts a comment."""
    drop, force, modes = [], [], []
    for raw in re.split(r"[;\n]", text or ""):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        head, _, rest = line.partition(" ")
        target = {"drop": drop, "force": force, "mode": modes}.get(head.lower()) if rest.strip() else None
        (target if target is not None else drop).append(rest.strip() if target is not None else line)
    return drop, force, modes


def _spec_box(scope: str) -> tuple[list[str], list[str], list[str]]:
    """The specs typed in the box: (drop specs, force specs, modes); `controls` applies each one that
    can be applied and says why any other is left out."""
    text = st.text_area("Specs", key=K.specs_key(scope), height=68, help=SPEC_BOX_HELP,
                        placeholder="*:0-3\nmodel.layers.*.mlp.gate:top8")
    return spec_lines(text)


def _checkboxes(model: RouteScopeLM, scope: str, layers: dict[str, int], labels) -> tuple[list, list]:
    """A Drop box per option everywhere, "Keep only", and per layer a multiselect and a forced route."""
    n_global = min(layers.values())
    names = option_names(labels, n=n_global)
    drop, force = [], []
    # one source of truth: the Drop boxes; "Keep only" sets them and shows what they leave
    k = max((k for k, _ in model.routing_top_k().values()), default=1)
    if k <= 1:
        st.selectbox("Keep only", [ALL] + list(range(n_global)), key=K.keep_only_key(scope),
                     format_func=lambda j: "—" if j == ALL else names[j], on_change=_keep_changed,
                     args=(scope, n_global),
                     help="Keep one option and drop every other one everywhere (the Drop boxes below show it): "
                          "with two paths, pgpt-1 of the paper")
    else:  # one option left could never fill a top-k > 1: the ablation would be refused (README, Ablation)
        st.caption(f"Keep only: not offered here, top-{k} routing needs {k} options left in a layer")
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
    return drop, force


def follow_layer(scope: str, source: str) -> None:
    """on_change of either layer picker (these controls', the Routing view's): the other shows the
    same layer (`K.view_layer_key`)."""
    pick, view = K.layer_pick_key(scope), K.view_layer_key(scope)
    st.session_state[view if source == pick else pick] = st.session_state.get(source)


def _searchable(model: RouteScopeLM, scope: str, layers: dict[str, int], labels) -> tuple[list, list]:
    """Many options: searchable lists, and one layer's controls at a time (its choices kept per layer)."""
    n_global = min(layers.values())
    names = option_names(labels, n=n_global)
    everywhere = st.multiselect("Drop everywhere", list(range(n_global)), format_func=lambda j: names[j],
                                key=K.drop_everywhere_key(scope), placeholder="Type to search options",
                                help="Options dropped in every layer; for many at once use a spec (*:0-15, *:!3)")
    drop: list = [(ALL_LAYERS, j) for j in everywhere]
    force: list = []
    choices: dict[str, tuple[tuple[int, ...], int | None]] = st.session_state.setdefault(K.layer_choices_key(scope), {})
    with st.expander(f"Per layer ({len(layers)} layers)", expanded=False):
        order = {l: i for i, l in enumerate(layers)}  # its position first: a narrow box cuts a long name's end
        layer = st.selectbox("Layer", list(layers), key=K.layer_pick_key(scope),
                             on_change=follow_layer, args=(scope, K.layer_pick_key(scope)),
                             format_func=lambda l: ("• " if choices.get(l, ((), None)) != ((), None) else "")
                             + f"{order[l]} · {l}",
                             help="Routing layers in model order; type to search; a dot marks layers with choices "
                                  "of their own")
        n, (dropped, forced) = layers[layer], choices.get(layer, ((), None))
        chosen = st.multiselect("Drop in this layer", list(range(n)), default=[o for o in dropped if o < n],
                                format_func=lambda j: labels[layer][j], key=K.drop_key(scope, layer),
                                placeholder="Type to search options")
        route = AUTO
        if model.routing_modules[layer].can_force:
            options = [AUTO] + list(range(n))
            route = st.selectbox("Force route in this layer", options, index=0 if forced is None else forced + 1,
                                 key=K.force_key(scope, layer),
                                 format_func=lambda j: j if j == AUTO else labels[layer][j])
        choices[layer] = (tuple(chosen), None if route == AUTO else int(route))
        own = Ablation(drop=tuple((l, o) for l, (d, _) in choices.items() for o in d),
                       force=tuple((l, f) for l, (_, f) in choices.items() if f is not None))
        if not own.is_empty:
            st.caption(f"Per-layer choices: {own.summary(3)}")
    return drop + list(own.drop), force + list(own.force)


def describe(ablation: Ablation, model: RouteScopeLM) -> str:
    """The ablation as its spec ("drop *:1") and in the layers' own words ("drop path 1")."""
    if ablation.is_empty:
        return "`none`"
    if len(ablation.drop) + len(ablation.force) > 4:  # a long list: the summary, not one word per expert
        return f"`{ablation.summary()}`"
    labels = model.option_labels()

    def word(layer: str, o: int) -> str:
        if layer == ALL_LAYERS:
            return f"{option_names(labels, n=o + 1)[o]} everywhere"
        return f"{labels[layer][o]} of {layer}"

    words = ([f"drop {word(l, o)}" for l, o in ablation.drop] + [f"force {word(l, o)}" for l, o in ablation.force]
             + [model.ablation_modes().get(m, m) for m in ablation.modes])
    return f"`{ablation.describe()}` ({', '.join(words)})"
