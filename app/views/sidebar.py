"""Sidebar: checkpoint picker and upload, generation settings, and the controls the loaded model
asks for (Gumbel mode where a routing layer samples, and the run options its family's table entry
offers as controls, e.g. Wiola's ATM threshold)."""
from __future__ import annotations

import streamlit as st

from routescope.analysis.runs.catalog import CheckpointInfo, checkpoint_roots, describe, list_checkpoints
from routescope.analysis.runs.session import RunSettings
from routescope.core_models.base import RouteScopeLM, RunOption
from routescope.core_models.run_state import ROUTING_MODES

from routescope.app import links as L
from routescope.app import resources
from routescope.app import state as K
from routescope.app.messages import show_error

DEFAULT_CHECKPOINT = "papaformer-gumbel-v2"


def _listed() -> list[CheckpointInfo]:
    return [c for c in list_checkpoints(checkpoint_roots()) if c.problem is None]


def checkpoints() -> dict[str, str]:
    """{name: path} of the checkpoints this server lists (the first of a name), what a link names."""
    out: dict[str, str] = {}
    for c in _listed():
        out.setdefault(c.name, c.path)
    return out


def apply_link(link: L.LinkState, paths: dict[str, str]) -> None:
    """A link's checkpoint and generation settings into the widgets' state, before they are drawn
    (`paths`: `checkpoints()`; the link's values are checked by `links.from_params`)."""
    keys = {K.MAX_NEW: link.max_new, K.DECODING: link.decoding, K.TEMPERATURE: link.temperature, K.TOP_K: link.top_k,
            K.TOP_P: link.top_p, K.SEED: link.seed, K.GUMBEL_MODE: link.routing,
            K.CHECKPOINT: paths.get(link.checkpoint) if link.checkpoint else None}
    st.session_state.update({k: v for k, v in keys.items() if v is not None})


def _pick_checkpoint() -> CheckpointInfo | None:
    found = _listed()
    uploaded = st.session_state.get(K.UPLOADED_PATH)
    if uploaded:
        found.append(describe(uploaded))
    if not found:
        roots = ", ".join(str(r) for r in checkpoint_roots())
        st.error(f"No checkpoints found under {roots}. Add a directory or upload one below.")
        return None
    labels = {c.path: c for c in found}
    paths = list(labels)
    default = next((i for i, c in enumerate(found) if c.name == DEFAULT_CHECKPOINT), 0)
    if uploaded and st.session_state.pop("select_upload", False):
        st.session_state[K.CHECKPOINT] = uploaded
    if st.session_state.get(K.CHECKPOINT) not in labels:
        st.session_state[K.CHECKPOINT] = paths[default]
    path = st.selectbox("Checkpoint", paths, key=K.CHECKPOINT,
                        format_func=lambda p: labels[p].name + ("  (uploaded)" if p == uploaded else ""))
    info = labels[path]
    params = f"{info.params:,} parameters" if info.params else "parameters: see model card"
    active = info.params_active or _active_params(path)
    if active and active != info.params:
        params += f" ({active:,} active per token)"
    losses = ", ".join(f"{d} {v:.3f}" for d, v in info.val_loss.items()) or "not recorded"
    st.caption(f"**{info.family}** · {params}  \nvalidation loss: {losses}")
    return info


def _active_params(path: str) -> int | None:
    """Parameters a token uses, counted by the model itself where no training summary records them (an
    uploaded or newly added checkpoint); the load is the one the page makes next (cached). None when it
    cannot load: the page says why."""
    try:
        model, _ = resources.load(path, resources.stamp(path))
        return model.active_params()
    except Exception:
        return None


def _upload() -> None:
    rejected = None
    with st.expander("Upload a checkpoint"):
        files = st.file_uploader("config.json, model.safetensors and tokenizer.json", accept_multiple_files=True,
                                 key=K.UPLOAD, help="Safetensors weights only: pickle-based .pt/.bin files are refused")
        problems = resources.upload_problems(files or [])
        for problem in problems if files else ():  # said as soon as the files are picked
            st.warning(problem)
        if files and st.button("Validate and open", key="upload_go", disabled=bool(problems)):
            try:
                st.session_state[K.UPLOADED_PATH] = resources.save_upload(files)
                st.session_state["select_upload"] = True
                st.rerun()
            except Exception as e:  # every loader error names the problem
                rejected = e
    if rejected is not None:  # below the expander: the message's own details expander cannot nest in it
        show_error(rejected, "Upload rejected: ")


def settings(model: RouteScopeLM) -> RunSettings:
    """Generation settings, and the controls this model's routing layers and run options call for."""
    with st.sidebar:
        return _settings(model)


def _settings(model: RouteScopeLM) -> RunSettings:
    st.subheader("Generation")
    # defaults through the session state (a link sets the same keys first: no default to clash with)
    for key, default in ((K.MAX_NEW, L.MAX_NEW[2]), (K.DECODING, L.DECODINGS[0]), (K.TEMPERATURE, L.TEMPERATURE[2]),
                         (K.TOP_K, L.TOP_K[2]), (K.TOP_P, L.TOP_P[2]), (K.SEED, L.SEED[2])):
        st.session_state.setdefault(key, default)
    max_new = st.slider("Max new tokens", *L.MAX_NEW[:2], key=K.MAX_NEW)
    mode = st.radio("Decoding", L.DECODINGS, horizontal=True, key=K.DECODING)
    temperature, top_k, top_p = L.TEMPERATURE[2], L.TOP_K[2], L.TOP_P[2]
    if mode == "sampling":
        temperature = st.slider("Temperature", *L.TEMPERATURE[:2], step=L.TEMPERATURE[3], key=K.TEMPERATURE)
        top_k = st.number_input("Top-k (0 = off)", *L.TOP_K[:2], key=K.TOP_K)
        top_p = st.slider("Top-p", *L.TOP_P[:2], step=L.TOP_P[3], key=K.TOP_P)
    seed = st.number_input("Seed", *L.SEED[:2], key=K.SEED)
    routing, options = ROUTING_MODES[0], []
    if any(m.stochastic for m in model.routing_modules.values()):
        st.subheader("Gumbel routing")
        routing = st.radio("Mode", ROUTING_MODES, horizontal=True, key=K.GUMBEL_MODE,
                           help="deterministic: noise-free argmax of the router logits; sampled: Gumbel noise "
                                "drawn from the seed above")
    for o in offered_options(model).values():
        st.subheader(o.heading or o.name)
        # an option's default is the config field of its name (through the state: a link may have set it)
        st.session_state.setdefault(K.run_option_key(o.name), float(getattr(model.config, o.name)))
        value = st.slider(o.label or o.name, o.low, o.high, step=o.step, key=K.run_option_key(o.name), help=o.help)
        options.append((o.name, float(value)))
    return RunSettings(max_new_tokens=max_new, greedy=mode == "greedy", temperature=float(temperature),
                       top_k=int(top_k), top_p=float(top_p), seed=int(seed), routing=routing, options=tuple(options))


def offered_options(model: RouteScopeLM) -> dict[str, RunOption]:
    """The family's run options the sidebar offers a control for, as its model declares them."""
    return {name: o for name, o in model.run_options().items()
            if o.offered and not o.whole_sequence and o.kind is float}  # generation runs with a KV cache


def pick() -> CheckpointInfo | None:
    """The checkpoint picker and the upload, in the sidebar; the chosen checkpoint or None."""
    with st.sidebar:
        st.title("RouteScope")
        st.caption(f"Device: {resources.device_label()}", help="set by routescope app --device / --dtype")
        info = _pick_checkpoint()
        _upload()
        return info
