"""In Chromium (Playwright) against `routescope app`: the Experts view measures olmoe-tiny and a
128-expert OLMoE model (built from transformers' OlmoeConfig, saved with save_pretrained into the
shared app's extra checkpoint root) over a file on the server, and draws the heatmap, each
expert with its interval, the estimate against the exact effect and the proxy scatter. Screenshots to test-artifacts/experts_*.png."""
from __future__ import annotations

import shutil

import pytest

from test_browser import ARTIFACTS, ROOT, _idle, _pick, _ready

pytestmark = pytest.mark.e2e
TEXT = "\n".join(["Once upon a time, there was a little girl named Lily. She loved her toys and her dog.",
                  "Solve this problem: 3x + 5 = 20. Express your answer as a fraction.",
                  "One day a little boy went to the park with his dog and a ball.",
                  "Find the largest prime below fifty, then evaluate the sum and simplify."]) + "\n"
CHARTS_DRAWN = ("n => [...document.querySelectorAll('.js-plotly-plot')].filter(p => p.offsetParent && "
                "(p.data || []).length).length >= n")


def _olmoe_128x4(path) -> None:
    """olmoe-128x4 saved at `path`: 128 experts (top-8) in 4 layers, random routers."""
    import torch
    from transformers import AutoModelForCausalLM, OlmoeConfig  # optional heavy dependency: the hf extra

    cfg = OlmoeConfig(vocab_size=4096, hidden_size=64, intermediate_size=32, num_hidden_layers=4, num_attention_heads=4,
                      num_key_value_heads=4, num_experts=128, num_experts_per_tok=8, max_position_embeddings=256,
                      tie_word_embeddings=True, pad_token_id=1, eos_token_id=0)
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith("mlp.gate.weight"):
                p.normal_(0.0, 0.5)
    hf.save_pretrained(path)
    shutil.copyfile(ROOT / "checkpoints" / "olmoe-tiny" / "tokenizer.json", path / "tokenizer.json")


@pytest.fixture(scope="module")
def wide_root(extra_checkpoint):
    """The shared app's extra checkpoint root, holding olmoe-128x4."""
    return extra_checkpoint("olmoe-128x4", _olmoe_128x4).parent


def experts_on_file(page, app_url: str, name: str, data, tokens: str, draws: str) -> None:
    """Open checkpoint `name`'s Experts view on the server file `data`, with its Tokens and Control
    draws set (the docs' screenshot test takes the same steps)."""
    page.goto(app_url)
    _ready(page, "updated in")
    _pick(page, name)
    page.get_by_role("radio", name="Experts", exact=True).click()
    _ready(page, "Shipped dataset")
    page.get_by_text("File on the server", exact=True).click()
    _idle(page)
    path = page.get_by_role("textbox", name="Path on the server")
    path.fill(str(data))
    path.press("Enter")
    _idle(page)
    for label, value in (("Tokens", tokens), ("Control draws", draws)):
        box = page.get_by_role("spinbutton", name=label, exact=True)
        box.fill(value)
        box.press("Enter")
        _idle(page)


@pytest.mark.parametrize("name, tokens, draws", [("olmoe-tiny", "2000", "8"), ("olmoe-128x4", "200", "2")])
def test_experts_view_measures_and_draws(wide_root, app_url, browser, tmp_path, name, tokens, draws):
    data = tmp_path / "texts.txt"
    data.write_text(TEXT, encoding="utf-8")
    page = browser.new_page(viewport={"width": 1500, "height": 2600})
    experts_on_file(page, app_url, name, data, tokens, draws)
    page.get_by_role("button", name="Measure expert importance").click()
    page.get_by_text("Dropping experts one at a time").first.wait_for(timeout=60_000)
    page.screenshot(path=str(ARTIFACTS / f"experts_{name}_progress.png"))
    # heatmap, each expert with its interval, estimate against exact, proxies (4 rows: no held-out pruning)
    page.wait_for_function(CHARTS_DRAWN, arg=4, timeout=600_000, polling=500)
    _idle(page)
    assert page.get_by_text("outside their layer's control interval", exact=False).count() or \
        page.get_by_text("lie outside", exact=False).count()
    assert page.get_by_text("Each expert with its interval", exact=True).count() == 1
    page.screenshot(path=str(ARTIFACTS / f"experts_{name}.png"), full_page=True)
    page.close()
