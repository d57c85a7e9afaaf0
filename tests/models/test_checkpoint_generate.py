"""Checkpoint directories and KV-cache generation."""
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from routescope.core_models import Ablation, InputError
from routescope.core_models.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from routescope.core_models.generate import Sampling, filter_logits, generate

from tiny_models import tiny_model
from tolerances import FORWARD_EPS, assert_close_to_scale


@pytest.mark.parametrize("key", ["llama", "gumbel_v1", "pgpt"])
def test_checkpoint_round_trip(tmp_path, key):
    model = tiny_model(key)
    save_checkpoint(model, tmp_path / "ck", dtype=torch.float32, card="# card\n")
    loaded, tok = load_checkpoint(tmp_path / "ck")
    assert tok is None
    idx = torch.randint(0, 97, (1, 9))
    assert torch.equal(loaded(idx).logits, model(idx).logits)  # exact: float32 weights, same modules
    assert json.loads((tmp_path / "ck" / "config.json").read_text())["family"] == model.config.family


def test_float16_checkpoint_is_the_float16_model(tmp_path):
    model = tiny_model("share_linear")
    save_checkpoint(model, tmp_path / "ck")
    loaded, _ = load_checkpoint(tmp_path / "ck")
    for k, v in model.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[k], v.half().float(), atol=0, rtol=0)


def test_missing_and_misshaped_tensors_are_named(tmp_path):
    model = tiny_model("pgpt")
    save_checkpoint(model, tmp_path / "ck", dtype=torch.float32)
    weights = tmp_path / "ck" / "model.safetensors"
    state = load_file(weights)
    del state["paths.1.pre.bias"]
    state["ln_f.weight"] = torch.ones(31)
    state["extra.weight"] = torch.ones(2)
    save_file(state, weights)
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(tmp_path / "ck")
    msg = str(e.value)
    assert "missing tensor paths.1.pre.bias" in msg
    assert "ln_f.weight has shape [31], expected [32]" in msg
    assert "unexpected tensor extra.weight" in msg


def test_corrupt_files_are_named(tmp_path):
    model = tiny_model("llama")
    save_checkpoint(model, tmp_path / "ck")
    (tmp_path / "ck" / "model.safetensors").write_bytes(b"\x00garbage")
    with pytest.raises(CheckpointError, match="safetensors"):
        load_checkpoint(tmp_path / "ck")
    (tmp_path / "ck" / "config.json").write_text('{"family": "llama", "d_model": -4}')
    with pytest.raises(CheckpointError, match="d_model"):
        load_checkpoint(tmp_path / "ck")
    with pytest.raises(CheckpointError, match="not a checkpoint directory"):
        load_checkpoint(tmp_path / "nothing")


def test_failed_save_leaves_nothing_behind(tmp_path):
    model = tiny_model("llama")

    class BadTokenizer:
        def save(self, path):
            raise OSError("disk full")

    with pytest.raises(OSError):
        save_checkpoint(model, tmp_path / "ck", tokenizer=BadTokenizer())
    assert list(tmp_path.iterdir()) == []


def test_greedy_generation_matches_full_recompute_and_reports_top_k():
    model = tiny_model("gumbel_v2")
    prompt = torch.randint(0, 97, (6,)).tolist()
    gen = generate(model, prompt, max_new_tokens=12, top_n=4)
    seq = list(prompt)
    for step in gen.steps:
        probs = model(torch.tensor([seq])).logits[0, -1].softmax(-1)
        assert step.token_id == int(probs.argmax())
        top = probs.topk(4)
        assert step.top_ids == top.indices.tolist()
        assert_close_to_scale(torch.tensor(step.top_probs), top.values, FORWARD_EPS, msg="cached top-k probabilities")
        seq.append(step.token_id)
    assert gen.ids == seq


def test_the_prompt_pass_logits_are_kept_only_when_asked_for():
    """A run kept in the app's cache holds no (prompt, vocabulary) logits unless asked; asked, they
    are the model's own logits of the prompt."""
    model = tiny_model("moep")
    prompt = torch.randint(0, 97, (7,)).tolist()
    assert generate(model, prompt, max_new_tokens=2).prompt_logits is None
    kept = generate(model, prompt, max_new_tokens=2, keep_prompt_logits=True).prompt_logits
    assert_close_to_scale(kept, model(torch.tensor([prompt])).logits[0], FORWARD_EPS, msg="prompt logits")


def test_generation_applies_ablation_and_records_routing_per_step():
    model = tiny_model("gumbel_v1")
    prompt = [1, 2, 3, 4]
    ab = Ablation.parse(force=["*:1"])
    gen = generate(model, prompt, max_new_tokens=5, ablation=ab, trace_sites=["parallel.0.router.choice"])
    choice = gen.trace["parallel.0.router.choice"]
    assert choice.shape == (1, 4 + 5)  # prompt positions, then one record per generated token
    assert (choice == 1).all()
    full = model(torch.tensor([gen.ids]), ablation=ab).logits[0, len(prompt) - 1:-1].argmax(-1)
    assert gen.new_ids == full.tolist()


def test_sampling_is_seeded_and_filters_apply():
    model = tiny_model("pgpt")
    s = Sampling(greedy=False, temperature=0.8, top_k=5, top_p=0.9, seed=7)
    a = generate(model, [5, 6], max_new_tokens=10, sampling=s)
    b = generate(model, [5, 6], max_new_tokens=10, sampling=s)
    assert a.new_ids == b.new_ids
    logits = torch.tensor([3.0, 2.0, 1.0, 0.0, -1.0])
    kept = filter_logits(logits, Sampling(greedy=False, top_k=2)).isfinite()
    assert kept.tolist() == [True, True, False, False, False]
    p = logits.softmax(-1)  # top-p keeps the smallest prefix whose mass reaches p
    kept = filter_logits(logits, Sampling(greedy=False, top_p=float(p[0] + 0.01))).isfinite()
    assert kept.tolist() == [True, True, False, False, False]


def test_long_prompt_keeps_its_last_tokens_and_says_so():
    model = tiny_model("llama")  # context 48
    prompt = list(range(60))
    gen = generate(model, prompt, max_new_tokens=8)
    assert gen.truncated == 60 - 40 and gen.prompt_ids == prompt[-40:]
    assert "truncated" in gen.notes[0]
    with pytest.raises(InputError, match="empty"):
        generate(model, [], max_new_tokens=4)
    with pytest.raises(InputError, match="max_new_tokens"):
        generate(model, [1], max_new_tokens=48)


def test_every_family_generates_with_cache(family_model):
    _, model = family_model
    gen = generate(model, [1, 2, 3], max_new_tokens=6)
    full = model(torch.tensor([gen.ids])).logits[0, 2:-1].argmax(-1)
    assert gen.new_ids == full.tolist()
