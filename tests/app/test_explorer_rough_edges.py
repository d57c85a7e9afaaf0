"""The explorer's rough edges a new user hit (issue 23, items 6-11), driven with Streamlit's AppTest:
Table 6 under the current ablation, one source of truth for "Keep only" and the drop boxes, the
ablation diff's counts on one stated basis, and the upload's messages. Figures are checked in
tests/app/test_figures.py, the browser's view of them in tests/e2e/test_browser.py."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch
from streamlit.testing.v1 import AppTest

from routescope.analysis.runs.catalog import checkpoint_roots, list_checkpoints
from routescope.app import state as K
from routescope.core_models import tracing
from routescope.core_models.checkpoint import load_checkpoint
from app_driver import fresh, pick, view

CHECKPOINTS = {c.name: c for c in list_checkpoints(checkpoint_roots()) if c.problem is None}





def scope(at: AppTest) -> str:
    return at.selectbox(key=K.CHECKPOINT).value


def ok(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]


# --- item 6: Table 6 runs under the ablation ------------------------------------------------------

def routes_alone(model, tok, prompt: str, dropped: set[int]) -> str:
    """The probe's Table 6 routes ("2>2>1") computed by hand: the prompt run alone with no ablation,
    each Gumbel router's recorded logits at the last token with the dropped paths masked out, the
    best remaining option (1-based, combined = n_paths + 1). The router's own choice of a dropped
    option would be a bug; this never asks the ablation code."""
    c = model.config
    sites = [f"parallel.{i}.router.logits" for i in range(c.n_parallel_layers)]
    with torch.inference_mode(), tracing(sites) as tr:
        model(torch.tensor([tok.encode(prompt).ids[-model.context:]]))
    out = []
    for s in sites:
        logits = tr[s][0, -1].double().clone()
        logits[list(dropped)] = -np.inf
        out.append(str(int(logits.argmax()) + 1))
    return ">".join(out)


@pytest.mark.parametrize("name,drop", [("papaformer-gumbel-v2", 0), ("papaformer-gumbel-v1", 1)])
def test_table6_runs_under_the_ablation_and_says_so(name, drop):
    """Dropping a path before its routers run changes nothing upstream of the first parallel layer;
    after it, the hidden states differ from an unablated run, so only the first layer can be
    recomputed by masking an unablated run's logits. That layer is compared probe by probe; every
    layer must avoid the dropped path."""
    at = view(pick(fresh(), name), "Table 6")
    at.checkbox(key=K.drop_global_key(scope(at), drop)).check().run()
    ok(at)
    header = next(m.value for m in at.markdown if m.value.startswith("**Table 6 routes"))
    assert f"drop *:{drop}" in header and "under the ablation" in header
    report = at.dataframe[0].value
    assert set(report["ablation"]) == {f"drop *:{drop}"}
    routes = [r.split(">") for r in report["routes"]]
    assert all(str(drop + 1) not in r for r in routes)  # the dropped path (route drop + 1) is never taken
    model, tok = load_checkpoint(CHECKPOINTS[name].path)
    by_hand = [routes_alone(model, tok, p, {drop}).split(">")[0] for p in report["prompt"]]
    assert [r[0] for r in routes] == by_hand
    summary = at.dataframe[1].value
    assert summary.loc[f"route {drop + 1}", "ours"] == 0.0
    # switched back on: the probes route as the paper's view of the checkpoint, through both paths
    at.checkbox(key=K.drop_global_key(scope(at), drop)).uncheck().run()
    again = at.dataframe[0].value
    assert set(again["ablation"]) == {"none"}
    assert any(str(drop + 1) in r.split(">") for r in again["routes"])
    assert next(m.value for m in at.markdown if m.value.startswith("**Table 6 routes")) == \
        "**Table 6 routes, no ablation**"


def test_table6_csv_carries_the_ablation(monkeypatch):
    from streamlit.runtime.memory_media_file_storage import MemoryMediaFileStorage

    from routescope.analysis.export.csv_format import read_frame_csv

    files: dict[str, tuple[str, bytes]] = {}
    original = MemoryMediaFileStorage.load_and_get_id

    def record(self, data, mimetype, kind, filename=None):
        fid = original(self, data, mimetype, kind, filename)
        files[filename] = data if isinstance(data, bytes) else Path(data).read_bytes()
        return fid

    monkeypatch.setattr(MemoryMediaFileStorage, "load_and_get_id", record)
    at = pick(fresh(), "papaformer-gumbel-v2")
    at.checkbox(key=K.drop_global_key(scope(at), 0)).check().run()
    view(at, "Export")
    ok(at)
    report = next(v for n, v in files.items() if n.endswith("_table6.csv"))
    summary = next(v for n, v in files.items() if n.endswith("_table6_summary.csv"))
    rows = read_frame_csv(report)
    assert set(rows["ablation"]) == {"drop *:0"} and not rows["routes"].str.contains("1").any()
    s = read_frame_csv(summary)
    assert set(s[s["source"] == "ours"]["ablation"]) == {"drop *:0"}
    assert set(s[s["source"] == "paper"]["ablation"]) == {"none (the paper's routes)"}
    assert all("drop" in n for n in files if "table6" in n)  # the file names say it too


# --- item 8: the ablation diff counts on one stated basis --------------------------------------

def _of(text: str) -> tuple[int, int]:
    k, n = re.fullmatch(r"(\d+) of (\d+)", text).groups()
    return int(k), int(n)


def test_ablation_diff_counts_the_generated_tokens():
    """"top-1 flips k of n" and the mean KL are over the n steps that generated the unablated
    continuation, recomputed here from the two models' logits on that continuation."""
    from routescope.core_models.ablation import Ablation
    from routescope.core_models.generate import generate

    at = view(pick(fresh(), "pgpt"), "Ablation diff")
    at.checkbox(key=K.drop_global_key(scope(at), 1)).check().run()
    ok(at)
    metrics = {m.label: m.value for m in at.metric}
    changed, n_changed = _of(metrics["changed tokens"])
    flips, n_steps = _of(metrics["top-1 flips"])
    n_new = at.slider(key=K.MAX_NEW).value
    assert n_changed == n_steps == n_new and 0 <= changed <= n_new
    assert any(f"count the {n_new} generated tokens" in c.value for c in at.caption)
    assert any("Red:" in c.value and "Green:" in c.value for c in at.caption)  # the highlights' legend
    # by hand: the unablated continuation, fed to both models
    model, tok = load_checkpoint(CHECKPOINTS["pgpt"].path)
    prompt = tok.encode(at.text_area(key=K.PROMPT).value).ids
    ids = prompt + list(generate(model, prompt, max_new_tokens=n_new, trace_sites=None).new_ids)
    with torch.inference_mode():
        base = torch.log_softmax(model(torch.tensor([ids])).logits[0].double(), -1)
        abl = torch.log_softmax(model(torch.tensor([ids]), ablation=Ablation.parse(drop=["1"])).logits[0].double(), -1)
    steps = range(len(prompt) - 1, len(prompt) - 1 + n_new)  # position p's distribution gives token p + 1
    assert flips == sum(int(base[p].argmax() != abl[p].argmax()) for p in steps)
    kl = np.mean([float((base[p].exp() * (base[p] - abl[p])).sum()) for p in steps])
    assert float(metrics["mean KL (nats)"]) == pytest.approx(kl, rel=1e-3, abs=5e-5)  # printed with 4 decimals


# --- item 11: the upload's messages ------------------------------------------------------------

def _files(name: str) -> dict[str, bytes]:
    d = Path(CHECKPOINTS[name].path)
    return {f: (d / f).read_bytes() for f in ("config.json", "model.safetensors", "tokenizer.json")}


def _pick_files(at: AppTest, files: list[tuple[str, bytes]]) -> AppTest:
    at.file_uploader(key=K.UPLOAD).set_value([(n, b, "application/octet-stream") for n, b in files]).run()
    return at


@pytest.mark.parametrize("weights", ["model.pt", "pytorch_model.bin"])
def test_pickle_weights_are_refused_with_the_reason(weights):
    files = _files("pgpt")
    picked = [("config.json", files["config.json"]), (weights, b"\x80\x04not really a pickle"),
              ("tokenizer.json", files["tokenizer.json"])]
    at = _pick_files(fresh(), picked)
    assert not at.exception
    said = " ".join(w.value for w in at.warning)
    assert f"{weights}: pickle-based weights are refused" in said and "safetensors" in said
    assert "upload model.safetensors too" not in said
    assert at.button(key="upload_go").disabled


def test_a_file_picked_twice_is_named_not_silently_replaced():
    files = _files("pgpt")
    other = _files("moep")["config.json"]
    picked = [("config.json", files["config.json"]), ("model.safetensors", files["model.safetensors"]),
              ("tokenizer.json", files["tokenizer.json"]), ("config.json", other)]
    at = _pick_files(fresh(), picked)
    said = " ".join(w.value for w in at.warning)
    assert "config.json picked more than once" in said
    assert at.button(key="upload_go").disabled
    _pick_files(at, picked[:3])  # the extra one removed: it opens
    assert not at.warning and not at.button(key="upload_go").disabled
    at.button(key="upload_go").click().run()
    ok(at)
    assert "routescope-upload-" in scope(at)


def test_save_upload_refuses_the_same_problems_itself():
    from routescope.app import resources

    class F:
        def __init__(self, name: str) -> None:
            self.name, self.size = name, 1

        def getvalue(self) -> bytes:
            raise AssertionError("read before the names were checked")

    for names, says in ((["config.json", "model.bin"], "pickle-based weights are refused"),
                        (["config.json", "config.json", "model.safetensors"], "picked more than once"),
                        (["config.json"], "upload model.safetensors too")):
        with pytest.raises(ValueError, match=says):
            resources.save_upload([F(n) for n in names])


# --- item 9: "Keep only" and the Drop boxes show one state ------------------------------------

def _boxes(at: AppTest, n: int) -> list[bool]:
    return [at.checkbox(key=K.drop_global_key(scope(at), j)).value for j in range(n)]


def _caption(at: AppTest) -> str:
    return next(c.value for c in at.caption if "Ablation:" in c.value)


def test_keep_only_ticks_the_boxes_it_drops_and_the_boxes_set_keep_only():
    at = pick(fresh(), "pgpt")
    keep = lambda: at.selectbox(key=K.keep_only_key(scope(at)))  # noqa: E731
    keep().set_value(0).run()
    ok(at)
    assert _boxes(at, 2) == [False, True] and "`drop *:1`" in _caption(at)  # what is dropped is shown ticked
    keep().set_value(1).run()
    assert _boxes(at, 2) == [True, False] and "`drop *:0`" in _caption(at)
    keep().set_value("all options").run()  # "—": nothing kept alone, nothing dropped
    assert _boxes(at, 2) == [False, False] and "Ablation: `none`" in _caption(at)
    at.checkbox(key=K.drop_global_key(scope(at), 1)).check().run()  # the box alone: pgpt-1 again
    assert keep().value == 0 and "`drop *:1`" in _caption(at)
    assert keep().format_func(0) == "path 0"  # short enough not to be cut in the narrow column


def test_four_options_top_2_drop_boxes_without_keep_only():
    """moep: 4 blocks, top-2. Keeping one would leave a layer fewer blocks than its top-k, which is
    refused (it was offered, and every pick of it refused); two Drop boxes are as many as it allows."""
    at = pick(fresh(), "moep")
    assert not [b for b in at.selectbox if b.key == K.keep_only_key(scope(at))]
    for j in (0, 2):
        at.checkbox(key=K.drop_global_key(scope(at), j)).check().run()
    ok(at)
    assert _boxes(at, 4) == [True, False, True, False] and "drop *:0,2" in _caption(at)  # one spec, options listed


def test_keep_only_is_not_offered_where_top_k_needs_more_than_one_option():
    """mixtral-tiny routes top-2: keeping one expert would leave a layer fewer options than its top-k,
    which the app refuses (issue 41 item 7), so "Keep only" is not offered there, saying why."""
    at = pick(fresh(), "mixtral-tiny")
    ok(at)
    assert not [b for b in at.selectbox if b.key == K.keep_only_key(scope(at))]
    assert any(c.value == "Keep only: not offered here, top-2 routing needs 2 options left in a layer"
               for c in at.caption)
    at.checkbox(key=K.drop_global_key(scope(at), 1)).check().run()  # the Drop boxes still work
    assert "drop *:1" in _caption(at)
