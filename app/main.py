"""RouteScope explorer. Run with `routescope app` (or `streamlit run app/main.py`)."""
from __future__ import annotations

import time

import streamlit as st

st.set_page_config(page_title="RouteScope", page_icon="🧭", layout="wide")

from urllib.parse import quote, urlencode  # noqa: E402

from routescope.app import resources  # noqa: E402  (set_page_config must come first)
from routescope.app import links  # noqa: E402
from routescope.app import corpus_resources as CR  # noqa: E402
from routescope.app import state as K  # noqa: E402
from routescope.app import pages as family_pages  # noqa: E402
from routescope.app.views import ablation, attribution, corpus, diff, experts, export, generation, routing, sidebar  # noqa: E402,E501
from routescope.app.views import replay  # noqa: E402
from routescope.app.views import drift  # noqa: E402
from routescope.analysis.inputs.prompts import prompt_problem  # noqa: E402
from routescope.app.messages import show_error  # noqa: E402
from routescope.rendering.route_grid import CSS as STYLES  # noqa: E402
from routescope.core_models.ablation import Ablation  # noqa: E402
from routescope.core_models.checkpoint import require_tokenizer  # noqa: E402
from routescope.core_models.specs import AblationError  # noqa: E402
from routescope.analysis.runs.usage import corpus_usage  # noqa: E402

DEFAULT_PROMPT = "Once upon a time, there was a little"
VIEWS = ["Generation", "Routing", "Ablation diff", "Attribution", "Corpus", "Experts", "Replay", "Drift", "Export"]  # every family's
PAGES_AFTER = "Attribution"  # a family's own pages (its spec's) come after this view
DEFAULT_VIEW = "Routing"  # a new user sees the routing heatmap (and the text it routes) without a click


def error_box(where: str, e: Exception) -> None:
    """Every error names its problem; no traceback reaches the page."""
    st.error(f"{where}: {e}" if isinstance(e, ValueError) else f"{where}: {type(e).__name__}: {e}")


NEEDS_NO_RUN = ("Corpus", "Experts", "Replay", "Drift")  # views that read neither the prompt nor its run (family pages neither): shown when those fail


@st.cache_resource
def prompt_store() -> links.PromptStore:
    """Long prompts of links, by digest, for every session of this server (links.PromptStore)."""
    return links.PromptStore()


def read_link() -> None:
    """On a session's first run, the URL's checkpoint, prompt and settings into the widgets' state
    (one warning line per value left out); its view, layer and specs wait for the model (apply_link)."""
    if st.session_state.get(K.LINK_READ):
        return
    st.session_state[K.LINK_READ] = True
    params = st.query_params.to_dict()
    if not params:
        return
    paths = sidebar.checkpoints()
    link, notices = links.from_params(params, checkpoints=paths, prompts=prompt_store().get)
    sidebar.apply_link(link, paths)
    if link.prompt is not None:
        st.session_state[K.PROMPT] = link.prompt
    st.session_state[K.LINK_PENDING] = link
    for notice in notices:
        st.warning(notice)


def apply_link(model, path: str) -> None:
    """The link's view, layer, specs and run options, checked against the loaded model, into the widgets'
    state (after `ablation.reset_for`, which would forget the specs; before the sidebar's run options)."""
    link = st.session_state.pop(K.LINK_PENDING, None)
    if link is None:
        return
    layers = model.routing_layers()
    link, notices = links.for_model(link, views=offered_views(model), layers=layers,
                                    known_modes=model.ablation_modes(), top_k=model.routing_top_k(),
                                    layer_picker=has_layer_picker(layers),
                                    options={n: (o.low, o.high) for n, o in sidebar.offered_options(model).items()})
    for notice in notices:
        st.warning(notice)
    if link.view:
        st.session_state[K.VIEW] = link.view
    if link.specs:
        st.session_state[K.specs_key(path)] = "\n".join(link.specs)
    if link.layer:
        st.session_state[K.layer_pick_key(path)] = st.session_state[K.view_layer_key(path)] = link.layer
    for name, value in link.options:
        st.session_state[K.run_option_key(name)] = value


def has_layer_picker(layers: dict[str, int]) -> bool:
    """Whether the ablation controls show one layer at a time (views.ablation: many options a layer)."""
    return bool(layers) and max(layers.values()) > ablation.FEW_OPTIONS


def offered_views(model) -> list[str]:
    """The views this model's page offers: every family's, its family's own pages after PAGES_AFTER."""
    at = VIEWS.index(PAGES_AFTER) + 1
    return VIEWS[:at] + [p.title for p in family_pages.pages(model)] + VIEWS[at:]


def share(name: str, prompt: str, settings, ab: Ablation, view: str, model, path: str) -> None:
    """The page's state into the URL (written only when it changed: writing reruns nothing), and the
    link under "Copy link" (st.code has a copy button)."""
    if len(prompt) > links.PROMPT_INLINE:
        prompt_store().put(prompt)
    sampling = not settings.greedy
    uploaded = path == st.session_state.get(K.UPLOADED_PATH)  # never matches a listed checkpoint of its name
    state = links.LinkState(
        checkpoint=f"upload:{name}" if uploaded else name, prompt=prompt, specs=ab.specs, view=view,
        layer=st.session_state.get(K.layer_pick_key(path)) if has_layer_picker(model.routing_layers()) else None,
        max_new=settings.max_new_tokens,
        decoding=links.DECODINGS[sampling], temperature=settings.temperature if sampling else None,
        top_k=settings.top_k if sampling else None, top_p=settings.top_p if sampling else None, seed=settings.seed,
        routing=settings.routing if any(m.stochastic for m in model.routing_modules.values()) else None,
        options=settings.options)
    params = links.to_params(state)
    if st.query_params.to_dict() != params:
        st.query_params.from_dict(params)
    url = (st.context.url or "") + "?" + urlencode(params, quote_via=quote, safe="*:;,!@")  # specs stay readable
    with st.popover("Copy link", help="A link that reopens this page: checkpoint, prompt, ablation, view and "
                                      "settings"):
        st.code(url, language=None, wrap_lines=True)
        st.caption("The copy button at the code's right puts it on the clipboard. " + (
            "The prompt goes by its digest: this server keeps its text until it restarts."
            if len(prompt) > links.PROMPT_INLINE else ""))


@st.fragment
def explorer(path: str, mtime: float, prompt: str, settings, problem: str | None = None, name: str = "") -> None:
    """Everything that follows an ablation toggle; reruns alone when a toggle changes. Only the
    chosen view is built, so a toggle costs one (cached) run plus one view. `problem`: why the prompt
    cannot run (empty, say); the run's views then say so, and the views that need no run still work.
    `name`: the checkpoint's, for the link."""
    model, tok = resources.load(path, mtime)
    left, right = st.columns([1, 4], gap="medium")
    with left:
        st.subheader("Switch off")
        ab = ablation.controls(model, path, usage_of(path, mtime, tok, prompt if problem is None else ""))
        st.caption("Options count from 0, as in ablation specs (`drop *:1`) and the export's option column.")
    t0 = time.perf_counter()
    cur, failed = None, problem
    if problem is None:
        try:
            cur = resources.run(path, mtime, prompt, settings, ab)
        except Exception as e:
            reason = str(e) if isinstance(e, ValueError) else f"{type(e).__name__}: {e}"
            failed = ("Cannot run this prompt: " + reason if ab.is_empty else  # the reason first, then a summary
                      f"Cannot run this ablation: {reason} (ablation: {ab.summary()})")
    elapsed = time.perf_counter() - t0
    with right:
        if cur is not None:
            st.caption(f"Ablation: {ablation.describe(ab, model)} · updated in {elapsed * 1000:.0f} ms "
                       f"(this run's forward passes and analyses took {cur.seconds * 1000:.0f} ms when computed)",
                       help="Runs are cached per checkpoint, prompt, settings and ablation.")
        else:
            st.caption(f"Ablation: {ablation.describe(ab, model)}")
        pages = {p.title: p for p in family_pages.pages(model)}  # the family's own views
        offered = offered_views(model)
        if st.session_state.get(K.VIEW) not in (None, *offered):  # a page of the previous checkpoint's family
            st.session_state[K.VIEW] = DEFAULT_VIEW
        st.session_state.setdefault(K.VIEW, DEFAULT_VIEW)  # a link may have set it (no default to clash)
        view = st.segmented_control("View", offered, key=K.VIEW, label_visibility="collapsed")
        view = view or DEFAULT_VIEW
        share(name, prompt, settings, ab, view, model, path)
        no_run = [*pages, *NEEDS_NO_RUN]
        if cur is None and view not in no_run:
            (st.warning if problem else st.error)(failed)
            st.caption(f"{' and '.join(no_run)} need no run of the prompt: they work meanwhile.")
            return
        try:
            if view in pages:
                pages[view].show(model, path, mtime, ab, ablation.describe(ab, model))
            else:
                show_view(view, cur, model, tok, path, mtime, prompt, settings, pages, ab)
        except Exception as e:
            error_box(view, e)


def usage_of(path: str, mtime: float, tok, prompt: str):
    """What "top N" specs rank by: "run", the unablated model's picks over the prompt's tokens;
    "corpus", over the dataset this session's Corpus view last ran for this checkpoint without an ablation."""
    def usage(source: str):
        if source == "run":
            ids = tuple(tok.encode(prompt).ids) if prompt else ()
            if not ids:
                raise AblationError("top N: the prompt is empty, so no expert has been used yet")
            return resources.usage(path, mtime, ids)
        key = st.session_state.get(K.CORPUS_LAST, {}).get(path)
        job = CR.jobs().get(key) if key is not None else None
        if job is None or job.result is None:
            raise AblationError("top N@corpus: run a dataset in the Corpus view without an ablation first (its "
                                "counts are what @corpus ranks by)")
        return corpus_usage(job.result)

    return usage


def show_view(view: str, cur, model, tok, path: str, mtime: float, prompt: str, settings, pages, ab: Ablation) -> None:
    """`cur`: the prompt's run under the ablation `ab` at the left (None where it failed: only NEEDS_NO_RUN
    views come here then, and the Corpus view runs under `ab` too); `pages`: the family's own pages
    (their tables go to the Export view)."""
    if view == "Generation":
        generation.show(cur, tok)
    elif view == "Routing":
        generation.text(cur, tok)
        if grid := resources.route_grid(path, mtime, prompt, settings, cur.ablation):  # none without choice views
            st.markdown(grid, unsafe_allow_html=True)
        view_layer = K.view_layer_key(path)
        st.session_state.setdefault(view_layer, st.session_state.get(K.layer_pick_key(path)))
        routing.show(cur, resources.routing_figures(path, mtime, prompt, settings, cur.ablation), view_layer,
                     ablation.follow_layer, (path, view_layer))
    elif view == "Ablation diff":
        base = resources.run(path, mtime, prompt, settings, Ablation())
        eff = None if cur.ablation.is_empty else resources.effects(path, mtime, tuple(base.ids), cur.ablation,
                                                                   settings.routing, settings.seed)
        diff.show(base, cur, eff, tok)
    elif view == "Attribution":
        attribution.show(cur, model, tok, path, mtime)
    elif view == "Corpus":
        corpus.show(model, tok, path, mtime, ab)
    elif view == "Experts":
        experts.show(model, tok, path, mtime, ab)
    elif view == "Replay":
        replay.show(model, tok, path, mtime)
    elif view == "Drift":  # a run's checkpoints, not the sidebar's model
        drift.show()
    else:
        extra = {label: table for p in pages.values() if p.tables for label, table in
                 p.tables(model, path, mtime, cur.ablation).items()}  # the family's pages' tables
        export.show(cur, tok, routing.drawn(cur, model), extra, resources.export_bytes(path, mtime, prompt, settings,
                                                                                        cur.ablation))


def prompt_box() -> str:
    """The prompt, taken when Generate is pressed (or Ctrl+Enter in the box)."""
    with st.form(K.PROMPT_FORM, border=False):
        st.session_state.setdefault(K.PROMPT, DEFAULT_PROMPT)  # a link may have set it (no default to clash)
        prompt = st.text_area("Prompt", key=K.PROMPT, height=80)
        st.form_submit_button("Generate", type="primary", key=K.GENERATE, help="Ctrl+Enter in the box does the same")
    return prompt


def main() -> None:
    # the page's own styles first: the browser starts loading Streamlit's HTML renderer at once, which
    # the routed text and the route grid need (about half a second sooner on their first paint)
    st.markdown(STYLES, unsafe_allow_html=True)
    read_link()
    info = sidebar.pick()
    if info is None:
        st.stop()
    prompt = prompt_box()
    path, mtime = info.path, resources.stamp(info.path)
    try:
        model, tok = resources.load(path, mtime)
    except Exception as e:
        show_error(e, f"Cannot open {info.name}: ", hide=path)
        st.stop()
    ablation.reset_for(path)
    apply_link(model, path)
    settings = sidebar.settings(model)
    try:
        require_tokenizer(tok, info.name)
    except ValueError as e:
        st.warning(f"{e}.")
        st.stop()
    problem = prompt_problem(prompt)  # the CLI's rule too; said in place of the views that need the prompt
    explorer(path, mtime, prompt, settings, problem[0].upper() + problem[1:] + "." if problem else None, info.name)


main()
