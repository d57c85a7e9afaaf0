"""routescope.analysis.runs.session: a run's settings and family options, and the text of multi-byte characters
split over byte-level tokens."""
from __future__ import annotations

import pytest

from routescope.analysis.runs.session import REPLACEMENT, RunSettings, run_prompt, token_spans
from tiny_models import tiny_model

TEXTS = ["Hello 👋🏽 🦄 world", "שלום עולם مرحبا", "naïve café – ok", "plain ascii only"]


@pytest.mark.parametrize("text", TEXTS)
def test_spans_cover_every_token_once_and_read_as_the_text(tokenizer, text):
    ids = tokenizer.encode(text).ids
    spans = token_spans(tokenizer, ids)
    assert [p for s in spans for p in range(s.start, s.end)] == list(range(len(ids)))
    assert "".join(s.text for s in spans) == tokenizer.decode(ids) == text
    assert not any(REPLACEMENT in s.text for s in spans)
    for s in spans:
        if s.end - s.start > 1:  # grouped only where the tokens alone do not decode
            assert all(REPLACEMENT in tokenizer.decode([i]) for i in ids[s.start:s.end])


def test_multi_byte_characters_are_split_in_this_tokenizer(tokenizer):
    """The premise of the test above: the emoji and Hebrew letters are byte tokens here."""
    for text in TEXTS[:2]:
        ids = tokenizer.encode(text).ids
        assert any(REPLACEMENT in tokenizer.decode([i]) for i in ids)
        assert any(s.end - s.start > 1 for s in token_spans(tokenizer, ids))


def test_display_tokens_show_the_span_text(tokenizer):
    model = tiny_model("pgpt", vocab_size=tokenizer.get_vocab_size())
    run = run_prompt(model, tokenizer, "🦄 ok", settings=RunSettings(max_new_tokens=0))
    shown = run.display_tokens()
    n = next(s.end - s.start for s in run.spans if s.text == "🦄")
    assert shown[:n] == [f"🦄 ({k}/{n})" for k in range(1, n + 1)]


def test_a_family_option_given_to_a_model_without_it_is_named(tokenizer):
    model = tiny_model("gumbel_v2", vocab_size=tokenizer.get_vocab_size())
    with pytest.raises(ValueError, match="atm_tau: not an option of papaformer-gumbel-v2 models"):
        run_prompt(model, tokenizer, "Once upon", settings=RunSettings(options=(("atm_tau", 0.5),)))


@pytest.mark.parametrize("key", ["moep", "gumbel_v2"])
def test_the_export_table_built_later_equals_the_one_built_with_the_run(tokenizer, key):
    """The app runs prompts without the long export table (its routing views and toggles never read
    it) and builds it for the Export view from the run: the same table, cell for cell."""
    import pandas as pd

    from routescope.analysis.runs.session import run_table
    from routescope.core_models.ablation import Ablation

    model = tiny_model(key, vocab_size=tokenizer.get_vocab_size())
    layer = next(iter(model.routing_layers()))
    settings = RunSettings(max_new_tokens=3)
    for ablation in (None, Ablation(drop=((layer, 0),))):
        whole = run_prompt(model, tokenizer, "Once upon a time", settings=settings, ablation=ablation, model_name="m")
        light = run_prompt(model, tokenizer, "Once upon a time", settings=settings, ablation=ablation, model_name="m",
                           table=False)
        assert light.table is None and len(whole.table) > 0
        pd.testing.assert_frame_equal(run_table(light, model), whole.table)
