"""The Corpus view keeps its settings across a refused upload and a view switch (issue 41, item 1).

A widget not drawn in one run is forgotten by the browser, which draws it again from what the
script sends: `proto.value` when `proto.set_value` is on, else the widget's `proto.default` (1 for
"Tokens per row", "" for the intended options). AppTest keeps the server's value and would not see
the reset, so `shown` reads what the browser draws."""
from __future__ import annotations

from test_corpus_view import TSV, corpus_view, table, until_done, upload

from routescope.app import state as K

SETTINGS = {K.CORPUS_MAX_TOKENS: 7, K.CORPUS_TOP: 3, K.CORPUS_MIN_COUNT: 2}
INTENDED = "topic:story=0,math=1"


def shown(widget):
    """What the browser draws for a widget it did not draw in the previous run."""
    p = widget.proto
    return p.value if p.set_value else p.default


def drawn(at) -> list:
    return [w for w in at.number_input if w.key in SETTINGS]


def test_settings_survive_a_refused_upload_and_a_view_switch():
    at = corpus_view("papaformer-gumbel-v2")
    for key, value in SETTINGS.items():
        at.number_input(key=key).set_value(value).run()
    at.text_input(key=K.CORPUS_INTENDED).set_value(INTENDED).run()
    upload(at, "bad.csv", b"words,topic\nhello,story\n")  # refused: the settings are not drawn
    assert [e.value for e in at.error][0].startswith("Dataset refused: bad.csv")
    assert not drawn(at)  # the settings are gone from the page for this run
    at.segmented_control(key=K.VIEW).set_value("Routing").run()
    at.segmented_control(key=K.VIEW).set_value("Corpus").run()  # the uploader empty again: still not drawn
    assert not drawn(at)
    # a refused file is never kept as "uploaded earlier" (it was, and was refused again under that caption)
    assert not any("uploaded earlier" in c.value for c in at.caption) and not at.error
    assert any(i.value.startswith("Upload a dataset file") for i in at.info)
    at.file_uploader(key=K.CORPUS_UPLOAD).set_value(("probes.tsv", TSV, "text/plain")).run()
    for key, value in SETTINGS.items():
        box = at.number_input(key=key)
        assert (box.value, shown(box)) == (value, value), key
    intended = at.text_input(key=K.CORPUS_INTENDED)
    assert (intended.value, shown(intended)) == (INTENDED, INTENDED)
    summary = table(until_done(at), "summary").set_index("metric")["value"]
    assert summary["max_tokens"] == str(SETTINGS[K.CORPUS_MAX_TOKENS])  # the dataset is routed as set


def test_a_changed_setting_is_kept_and_drawn_after_another_view():
    at = corpus_view("papaformer-gumbel-v2")
    at.number_input(key=K.CORPUS_MAX_TOKENS).set_value(5).run()
    at.number_input(key=K.CORPUS_MAX_TOKENS).set_value(9).run()  # changed again: the later value holds
    at.segmented_control(key=K.VIEW).set_value("Export").run()
    at.segmented_control(key=K.VIEW).set_value("Corpus").run()
    box = at.number_input(key=K.CORPUS_MAX_TOKENS)
    assert (box.value, shown(box)) == (9, 9)
    at.radio(key=K.CORPUS_SOURCE).set_value("Upload a file").run()
    at.segmented_control(key=K.VIEW).set_value("Routing").run()
    at.segmented_control(key=K.VIEW).set_value("Corpus").run()
    assert at.radio(key=K.CORPUS_SOURCE).value == "Upload a file"
