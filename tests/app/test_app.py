"""Drive the explorer with Streamlit's AppTest: every shipped checkpoint, ablation, export, bad input."""
from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path

import pytest
from streamlit.runtime.memory_media_file_storage import MemoryMediaFileStorage
from streamlit.testing.v1 import AppTest

from routescope.analysis.runs.catalog import checkpoint_roots, list_checkpoints
from routescope.analysis.export.columns import EXPORT_SCHEMA
from routescope.app import state as K
from charts import heatmap_titles

APP = str(Path(__file__).resolve().parents[2] / "app" / "main.py")
CHECKPOINTS = [c for c in list_checkpoints(checkpoint_roots()) if c.problem is None]
BY_FAMILY = {c.family: c for c in reversed(CHECKPOINTS)}  # the first of each family by name


@pytest.fixture
def downloads(monkeypatch):
    """Capture every file the app offers for download, by media id."""
    files: dict[str, bytes] = {}
    original = MemoryMediaFileStorage.load_and_get_id

    def record(self, data, mimetype, kind, filename=None):
        fid = original(self, data, mimetype, kind, filename)
        files[fid] = data if isinstance(data, bytes) else Path(data).read_bytes()
        return fid

    monkeypatch.setattr(MemoryMediaFileStorage, "load_and_get_id", record)
    return files


def fresh(timeout: float = 180) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=timeout)
    at.run()
    return at


def ok(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]


def pick(at: AppTest, name: str) -> AppTest:
    box = at.selectbox(key="checkpoint")
    path = next(p for p in box.options if Path(p).name == name)
    box.set_value(path).run()
    return at


def scope(at: AppTest) -> str:
    """The chosen checkpoint's path: part of every ablation widget's key."""
    return at.selectbox(key=K.CHECKPOINT).value


def enter_prompt(at: AppTest, text: str) -> AppTest:
    """Type a prompt and press Generate (the prompt box is a form: typing alone runs nothing)."""
    at.text_area(key=K.PROMPT).set_value(text)
    at.button(key=K.GENERATE).click().run()
    return at


def view(at: AppTest, name: str) -> AppTest:
    at.segmented_control(key="view").set_value(name).run()
    return at


def caption_with(at: AppTest, text: str) -> str:
    return next(c.value for c in at.caption if text in c.value)


def test_checkpoints_are_shipped():
    assert len(CHECKPOINTS) >= 10, [c.name for c in CHECKPOINTS]


def test_first_load_is_usable():
    at = fresh()
    ok(at)
    assert at.text_area(key="prompt").value.startswith("Once upon a time")
    assert "updated in" in caption_with(at, "Ablation:")
    assert len(at.get("plotly_chart")) == 1  # the next-token candidates chart
    view(at, "Routing")
    ok(at)
    assert heatmap_titles(at) == ["Gumbel route per token (noise-free probabilities on hover)",
                                  "Cosine dominance: the output most aligned with the combined output"]



def test_a_family_page_is_offered_only_where_its_spec_applies():
    """Table 6 is the PaPaformer spec's page: offered for its checkpoints, not for MoE ones, and a
    view left on it falls back to Routing when the checkpoint changes."""
    at = fresh()
    pick(at, "papaformer-share-linear")
    assert "Table 6" in at.segmented_control(key=K.VIEW).options
    view(at, "Table 6")
    for name in ("moep", "olmoe-tiny"):
        pick(at, name)
        ok(at)
        assert "Table 6" not in at.segmented_control(key=K.VIEW).options
        assert at.segmented_control(key=K.VIEW).value == "Routing"


@pytest.mark.parametrize("name", ["Routing", "Ablation diff", "Attribution", "Table 6", "Export"])
def test_every_view_renders(name):
    ok(view(fresh(), name))


@pytest.mark.parametrize("name", [c.name for c in CHECKPOINTS])
def test_every_checkpoint_generates_and_routes(name):
    at = pick(fresh(), name)
    ok(at)
    gen_html = next(m.value for m in at.markdown if "rs-text" in m.value)
    assert gen_html.count("rs-tok rs-gen") + gen_html.count("rs-tok rs-low") == 24  # default max new tokens


def _mean_kl(at: AppTest) -> float:
    return float(next(m.value for m in at.metric if m.label == "mean KL (nats)"))


@pytest.mark.parametrize("family,option", [("pgpt", 1), ("papaformer-gumbel-v2", 1), ("moep", 0),
                                           ("papaformer-share-linear", 0)])
def test_toggling_a_path_changes_the_output(family, option):
    at = view(pick(fresh(), BY_FAMILY[family].name), "Ablation diff")
    at.checkbox(key=K.drop_global_key(scope(at), option)).check().run()
    ok(at)
    assert f"drop *:{option}" in caption_with(at, "Ablation:")
    assert _mean_kl(at) > 0
    at.checkbox(key=K.drop_global_key(scope(at), option)).uncheck().run()
    assert "Ablation: `none`" in caption_with(at, "Ablation:")


def test_keep_only_drops_every_other_option_pgpt_1():
    at = view(pick(fresh(), BY_FAMILY["pgpt"].name), "Ablation diff")
    at.selectbox(key=K.keep_only_key(scope(at))).set_value(0).run()
    ok(at)
    assert "`drop *:1` (drop path 1 everywhere)" in caption_with(at, "Ablation:")
    assert _mean_kl(at) > 0


def test_pgpt_offers_the_authors_pgpt1_evaluation_as_a_mode():
    at = view(pick(fresh(), BY_FAMILY["pgpt"].name), "Ablation diff")
    box = at.checkbox(key=K.mode_key(scope(at), "pgpt1-reference"))
    assert box.label == "Mode: pgpt1-reference" and box.value is False
    box.check().run()
    ok(at)
    assert "`mode pgpt1-reference` (pgpt-1 as the authors evaluated it" in caption_with(at, "Ablation:")
    assert _mean_kl(at) > 0
    pick(at, BY_FAMILY["moep"].name)  # another family offers no such mode
    assert not any(K.mode_key(scope(at), "pgpt1-reference") == c.key for c in at.checkbox)


def test_export_csv_has_the_documented_header(downloads):
    at = view(fresh(), "Export")
    ok(at)
    button = next(b for b in at.get("download_button") if b.proto.label == "Routing table (CSV)")
    fid = button.proto.url.rsplit("/", 1)[-1].split(".")[0]
    rows = list(csv.reader(io.StringIO(downloads[fid].decode("utf-8"))))
    assert rows[0] == list(EXPORT_SCHEMA)
    assert len(rows) > 10 and rows[1][0] == at.selectbox(key="checkpoint").value.rsplit("/", 1)[-1]
    run_json = next(b for b in at.get("download_button") if b.proto.label == "Run settings (JSON)")
    meta = json.loads(downloads[run_json.proto.url.rsplit("/", 1)[-1].split(".")[0]])
    assert meta["prompt"] == at.text_area(key="prompt").value and meta["ablation"] == "none"


def test_figure_html_downloads_embed_plotly_and_do_not_rerun(monkeypatch):
    """The figure pages work offline (plotly.js inline, no script from a CDN), and no download
    reruns the app (a rerun revokes the deferred figure downloads still on the page)."""
    from streamlit.runtime.media_file_manager import MediaFileManager

    from routescope.analysis.export.plotly_bundle import plotly_js as get_plotlyjs

    deferred: dict[str, object] = {}
    original = MediaFileManager.add_deferred

    def record(self, data_callable, *args, **kwargs):
        fid = original(self, data_callable, *args, **kwargs)
        deferred[fid] = data_callable
        return fid

    monkeypatch.setattr(MediaFileManager, "add_deferred", record)
    at = view(fresh(), "Export")
    ok(at)
    buttons = at.get("download_button")
    assert buttons and all(b.proto.ignore_rerun for b in buttons), [b.proto.label for b in buttons]
    figs = [b for b in buttons if b.proto.label.endswith(".html")]
    assert len(figs) >= 2  # Gumbel routes and cosine dominance of the default checkpoint
    plotly_js = get_plotlyjs()
    for b in figs:
        html = deferred[b.proto.deferred_file_id]()
        assert plotly_js in html
        assert not re.search(r"<script[^>]*\bsrc\s*=", html), b.proto.label
        assert '"meta"' in html and at.text_area(key="prompt").value in html  # provenance travels with the figure


@pytest.mark.parametrize("prompt", ["", "   \n\t "])
def test_empty_prompt_gets_a_message(prompt):
    at = fresh()
    enter_prompt(at, prompt)
    assert not at.exception
    assert any("empty" in w.value for w in at.warning)


def test_long_prompt_is_truncated_with_a_notice():
    at = fresh()
    enter_prompt(at, "Once upon a time there was a girl. " * 80)
    ok(at)
    assert any("truncated" in w.value for w in at.warning)


@pytest.mark.parametrize("prompt", ["Hello 👋🏽 🦄 world", "שלום עולם مرحبا", "ctl\x00\x07\x1b[31m\u202e text",
                                    "=cmd|' /C calc'!A0", "a\r\nb\tc"])
def test_any_unicode_prompt_runs(prompt):
    at = enter_prompt(fresh(), prompt)
    ok(at)


def _upload(at: AppTest, files: list[tuple[str, bytes]]) -> AppTest:
    at.file_uploader(key="upload").set_value([(n, b, "application/octet-stream") for n, b in files]).run()
    at.button(key="upload_go").click().run()
    return at


def _ckpt_files(path: str) -> dict[str, bytes]:
    return {n: (Path(path) / n).read_bytes() for n in ("config.json", "model.safetensors", "tokenizer.json")}


def test_corrupt_upload_is_rejected_and_app_keeps_working():
    files = _ckpt_files(BY_FAMILY["pgpt"].path)
    files["model.safetensors"] = b"\x00not a safetensors file"
    at = _upload(fresh(), list(files.items()))
    assert not at.exception
    assert any("Upload rejected" in e.value and "safetensors" in e.value for e in at.error)
    assert "updated in" in caption_with(at, "Ablation:")


def test_mismatched_upload_names_the_tensors():
    files = _ckpt_files(BY_FAMILY["pgpt"].path)
    files["config.json"] = (Path(BY_FAMILY["moep"].path) / "config.json").read_bytes()
    at = _upload(fresh(), list(files.items()))
    assert any("does not match its config" in e.value and " missing (" in e.value for e in at.error)


def test_valid_upload_opens():
    at = _upload(fresh(), list(_ckpt_files(BY_FAMILY["pgpt"].path).items()))
    ok(at)
    assert "routescope-upload-" in at.selectbox(key="checkpoint").value


def test_oversized_upload_is_rejected(monkeypatch):
    import routescope.app.resources as resources
    monkeypatch.setattr(resources, "MAX_UPLOAD_BYTES", 1000)
    at = _upload(fresh(), list(_ckpt_files(BY_FAMILY["pgpt"].path).items()))
    assert any("limit" in e.value and "model.safetensors" in e.value for e in at.error)


def test_probe_file_with_wrong_columns_gets_a_message():
    at = view(pick(fresh(), BY_FAMILY["papaformer-gumbel-v1"].name), "Table 6")
    at.file_uploader(key="probes_upload").set_value(("bad.tsv", b"id\ttext\nP1\thello\n", "text/tab-separated-values"))
    at.run()
    assert not at.exception
    assert any("missing required column" in e.value for e in at.error)
    assert "updated in" in caption_with(at, "Ablation:")


def test_two_sessions_never_see_each_others_ablation():
    a, b = fresh(), fresh()
    pick(a, BY_FAMILY["pgpt"].name)
    pick(b, BY_FAMILY["pgpt"].name)
    a.selectbox(key=K.keep_only_key(scope(a))).set_value(0).run()
    b.run()
    assert "drop" in caption_with(a, "Ablation:")
    assert "Ablation: `none`" in caption_with(b, "Ablation:")
    b.checkbox(key=K.drop_global_key(scope(b), 0)).check().run()
    a.run()
    assert "drop *:0" in caption_with(b, "Ablation:") and "drop *:1" in caption_with(a, "Ablation:")


def test_imported_checkpoint_without_tokenizer_is_listed_and_explained(tmp_path, monkeypatch):
    from routescope.core_models.importers import import_checkpoint
    fixtures = Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "reference" / "papaformer_gumbel_v1"
    if not fixtures.is_dir():
        pytest.skip("parity fixtures not available")
    import_checkpoint("papaformer-gumbel-v1", fixtures / "weights.safetensors", fixtures / "config.json",
                      tmp_path / "imported-gumbel-v1")
    monkeypatch.setenv("ROUTESCOPE_CHECKPOINTS", str(tmp_path))
    at = pick(fresh(), "imported-gumbel-v1")
    assert not at.exception
    assert any("no tokenizer.json" in w.value and "tokenizer" in w.value for w in at.warning)
    assert "259,910" in next(c.value for c in at.caption if "papaformer" in c.value)  # counted from the config


# --- what a new user stumbled on (issue 13, item 4) ---------------------------------------------

def _generation_html(at: AppTest) -> str:
    return next(m.value for m in at.markdown if "rs-text" in m.value)


def _prompt_spans(html_text: str) -> list[str]:
    import html as H
    return [H.unescape(t) for t in re.findall(r'<span class="rs-tok rs-prompt"[^>]*>(.*?)</span>', html_text, re.S)]


def test_ablation_widgets_do_not_carry_over_to_another_checkpoint():
    at = pick(fresh(), BY_FAMILY["pgpt"].name)
    pgpt = scope(at)
    at.checkbox(key=K.drop_global_key(pgpt, 1)).check().run()
    assert "drop *:1" in caption_with(at, "Ablation:")
    pick(at, BY_FAMILY["moep"].name)
    ok(at)
    assert at.checkbox(key=K.drop_global_key(scope(at), 1)).value is False
    assert K.drop_global_key(pgpt, 1) not in at.session_state  # forgotten, not kept for a later visit
    assert "Ablation: `none`" in caption_with(at, "Ablation:")


def test_the_prompt_runs_when_generate_is_pressed_not_while_typing():
    at = fresh()
    before = _generation_html(at)
    at.text_area(key=K.PROMPT).set_value("Solve the equation")
    at.run()
    assert _generation_html(at) == before  # typed, not submitted
    enter_prompt(at, "Solve the equation")  # AppTest drops unsubmitted form values on a run: type again
    ok(at)
    assert "".join(_prompt_spans(_generation_html(at))) == "Solve the equation"


@pytest.mark.parametrize("prompt", ["Hello 👋🏽 🦄 world", "שלום עולם"])
def test_multi_byte_characters_show_as_their_text(prompt):
    at = enter_prompt(fresh(), prompt)
    ok(at)
    spans = _prompt_spans(_generation_html(at))
    assert "".join(spans) == prompt and not any("\ufffd" in s for s in spans)


def test_changed_tokens_counts_the_ablated_continuations_tokens():
    """"changed tokens a of n": n = tokens the ablated run generated, a = those not matched by the
    unablated continuation, recounted here from the two runs' ids with difflib's matching blocks."""
    import difflib

    from routescope.analysis.runs.session import RunSettings, run_prompt
    from routescope.core_models.ablation import Ablation
    from routescope.core_models.checkpoint import load_checkpoint

    info = BY_FAMILY["papaformer-gumbel-v2"]
    at = view(pick(fresh(), info.name), "Ablation diff")
    at.checkbox(key=K.drop_global_key(scope(at), 1)).check().run()
    ok(at)
    prompt = at.text_area(key=K.PROMPT).value
    model, tok = load_checkpoint(info.path)
    base = run_prompt(model, tok, prompt, settings=RunSettings()).generation.new_ids
    ablated = run_prompt(model, tok, prompt, settings=RunSettings(),
                         ablation=Ablation(drop=(("*", 1),))).generation.new_ids
    matched = sum(m.size for m in difflib.SequenceMatcher(a=base, b=ablated, autojunk=False).get_matching_blocks())
    metric = next(m for m in at.metric if m.label == "changed tokens")
    assert metric.value == f"{len(ablated) - matched} of {len(ablated)}"


def test_labels_count_from_zero_like_the_specs():
    at = pick(fresh(), BY_FAMILY["papaformer-gumbel-v2"].name)
    assert at.checkbox(key=K.drop_global_key(scope(at), 0)).label == "Drop path 0"
    at.checkbox(key=K.drop_global_key(scope(at), 1)).check().run()
    assert "`drop *:1` (drop path 1 everywhere)" in caption_with(at, "Ablation:")


def test_moep_options_are_experts_in_moe_layers_and_blocks_in_parallel_layers():
    at = pick(fresh(), BY_FAMILY["moep"].name)
    assert at.checkbox(key=K.drop_global_key(scope(at), 0)).label == "Drop expert 0 / block 0"
    shrink = at.multiselect(key=K.drop_key(scope(at), "moe_shrink"))
    parallel = at.multiselect(key=K.drop_key(scope(at), "parallel.0"))
    assert shrink.format_func(0) == "expert 0" and parallel.format_func(0) == "block 0"


def test_attribution_says_it_does_not_apply_the_ablation():
    at = view(fresh(), "Attribution")
    assert not any("without the ablation" in i.value for i in at.info)
    at.checkbox(key=K.drop_global_key(scope(at), 1)).check().run()
    ok(at)
    assert any("without the ablation" in i.value and "drop *:1" in i.value for i in at.info)


def test_export_offers_table6_without_visiting_the_table6_view():
    at = view(fresh(), "Export")  # the default checkpoint is a PaPaformer
    ok(at)
    labels = [b.proto.label for b in at.get("download_button")]
    assert "Table 6 report (CSV)" in labels and "Table 6 summary (CSV)" in labels


def test_the_prompt_divider_is_explained():
    at = view(fresh(), "Routing")
    ok(at)
    assert any("the prompt ends there" in c.value for c in at.caption)


def test_attribution_path_table_and_chart_share_a_unit_that_fits():
    """The exact-ablation table read ±0.0001 nats on every row (4 decimals) under a chart in micro-nats:
    both now in one unit, the largest |effect| at least 1 of it, the chart's bars the table's rows."""
    at = view(pick(fresh(), "moep"), "Attribution")
    at.radio(key=K.ATTR_METHOD).set_value("exact ablation (paths)").run()
    at.button(key="attr_go").click().run()
    ok(at)
    table = next(d.value for d in at.dataframe if "option name" in d.value.columns)
    column = table.columns[1]
    unit = re.fullmatch(r"contribution \((\S+)\)", column)[1]
    top = table[column].abs().max()
    assert 1 <= top < 1000 or (unit == "nats" and top >= 1)
    chart = next(json.loads(c.proto.spec) for c in at.get("plotly_chart")
                 if json.loads(c.proto.spec)["data"][0].get("orientation") == "h")
    assert chart["layout"]["xaxis"]["title"]["text"].startswith(f"{unit} ")
    bars = dict(zip(chart["data"][0]["y"], chart["data"][0]["x"]))
    for name, value in zip(table["option name"], table[column]):
        if name in bars:
            assert bars[name] == pytest.approx(value, rel=1e-9)


def test_attribution_ig_delta_reads_in_significant_digits_with_a_verdict():
    at = view(pick(fresh(), "llama-dense"), "Attribution")
    at.button(key="attr_go").click().run()
    ok(at)
    said = next(c.value for c in at.caption if "Convergence delta" in c.value)
    delta = float(re.search(r"Convergence delta (\S+) nats", said)[1])
    total = float(re.search(r"the difference, ([-+]\d+\.\d+) nats", said)[1])
    verdict = re.search(r"; (converged|not converged): \|delta\| = (\S+) of the attribution total", said)
    assert verdict and "0.0%" not in said
    assert float(verdict[2]) == pytest.approx(abs(delta) / abs(total), rel=0.05)
    assert (verdict[1] == "converged") == (abs(delta) <= 0.05 * abs(total))
