"""Corpus statistics of Hugging Face MoE models: read through the family's route reader like any
other (no family branch), every top-k pick counted, equal to each prompt run alone."""
from __future__ import annotations

from collections import Counter

import numpy as np
import pandas as pd
import pytest
import torch

from routescope.analysis.corpus import stats as S
from routescope.analysis.corpus import reductions as RD
from routescope.analysis.inputs import datasets as D
from routescope.analysis.corpus.run import CorpusSettings, run_corpus
from routescope.analysis.runs.family_table import route_reader
from routescope.core_models import tracing
from routescope.core_models.checkpoint import load_checkpoint
from tolerances import EPS32, FORWARD_EPS

pytest.importorskip("transformers")
from hf_models import hf_model, save_hf  # noqa: E402

TEXTS = ["Once upon a time, there was a little girl named Lily.", "She loved playing with her toys.",
         "Solve this problem: 1 + 1 = 2.", "Find the largest prime.", "One day a little boy went to the park.",
         "from sympy import sqrt", "Evaluate the sum and simplify.", "Lily"]


@pytest.mark.parametrize("model_type", ["mixtral", "qwen2_moe"])
def test_hf_moe_corpus_counts_every_pick(model_type, tokenizer, tmp_path):
    hf = hf_model(model_type, tokenizer.get_vocab_size())
    path = save_hf(hf, tmp_path / model_type, tokenizer)
    model, tok = load_checkpoint(path)
    reader = route_reader(model)
    rows = [D.CorpusRow(str(i), t, ("story" if i % 2 else "math",)) for i, t in enumerate(TEXTS)]
    res = run_corpus(model, tok, D.rows_corpus("hf", rows, ["domain"]), name=model_type,
                     settings=CorpusSettings(batch_size=3))
    k = hf.config.num_experts_per_tok
    assert res.layout.routes and res.layout.layers == tuple(reader.layers) and res.layout.k == k
    u = RD.utilisation(res.stats)
    sums = u[u["routed"]].groupby("layer")[["token_share", "slot_share"]].sum()
    assert np.allclose(sums["token_share"], k) and np.allclose(sums["slot_share"], 1.0)
    shared = u[~u["routed"]]  # Qwen2-MoE's shared expert runs for every token: no router pick, no flag
    assert list(shared["label"]) == (["shared expert"] * 2 if model_type == "qwen2_moe" else [])
    assert not shared["dead"].any() and (shared["slots"] == 0).all()
    routed_n = u[u["routed"]].groupby("layer")["option"].count()
    assert np.allclose(u[u["routed"]]["uniform"], 1 / routed_n[u[u["routed"]]["layer"]].to_numpy())
    slots, clear = Counter(), True
    for text in TEXTS:
        with torch.inference_mode(), tracing() as tr:
            model(torch.tensor([tok.encode(text).ids]))
        picks = reader.topk(tr)  # (L, 1, T, k), the recorded router indices
        for l, layer in enumerate(reader.layers):
            slots.update((layer, int(p) - 1) for p in picks[l].ravel() if p)
            probs = next((tr[n] for n in tr.names() if n.startswith(layer + ".") and n.endswith("probs")), None)
            if probs is not None:
                top = probs.double().topk(k + 1, -1).values
                clear &= bool(((top[..., k - 1] - top[..., k]) > FORWARD_EPS * EPS32).all())
    got = {(r.layer, r.option): r.slots for r in u.itertuples()}
    if clear:
        assert got == {key: slots.get(key, 0) for key in got}
    else:  # a pick within float noise may differ between a padded batch and a prompt alone
        assert sum(got.values()) == sum(slots.values())


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device"))])
def test_pipelined_batches_equal_one_forward_per_batch_in_order(device, tokenizer, tmp_path):
    """`traced_batches` launches batch b + 1 before reading batch b: what it yields, in order, must be
    each batch's own forward read alone (routes, top-k, predicted tokens, the caller's item). On CUDA
    the copies come back without a wait, so a read before its copy finished would differ."""
    from routescope.analysis.corpus.run import traced_batches

    hf = hf_model("olmoe", tokenizer.get_vocab_size())
    model, _ = load_checkpoint(save_hf(hf, tmp_path / "olmoe", tokenizer), device=device)
    reader = route_reader(model)
    gen = torch.Generator().manual_seed(0)
    batches = [(torch.randint(0, model.vocab_size, (r, t), generator=gen), f"batch {i}")
               for i, (r, t) in enumerate([(2, 7), (3, 5), (1, 9), (2, 4)])]
    got = list(traced_batches(model, reader, iter(batches)))
    assert [b.item for b in got] == [item for _, item in batches]
    for b, (x, _) in zip(got, batches):
        with torch.inference_mode(), tracing(reader.sites) as tr:
            logits = model(x).logits
        assert torch.equal(b.ids, x) and b.vocab == logits.shape[-1]
        np.testing.assert_array_equal(_host(b.predicted), logits.argmax(-1).cpu().numpy())
        np.testing.assert_array_equal(_host(b.topk), np.asarray(reader.topk(tr)))
        np.testing.assert_array_equal(_host(b.routes), reader.routes(tr))
        assert all(isinstance(v, torch.Tensor) and v.device.type == device for v in (b.routes, b.topk, b.predicted)) \
            if device != "cpu" else True  # a GPU's routes stay there, for RouteStats to count there


def _host(x):
    return x.cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device"))])
def test_routes_counted_on_the_device_equal_the_same_routes_counted_by_numpy(device, tokenizer, tmp_path, monkeypatch):
    """`RouteStats` counts where the routes are (on a GPU: kernels, unique keys held over batches). The
    very routes each batch yields, counted there and counted from numpy copies on the CPU, give the
    same tables. On the CPU the device branches are forced (index_add_ counts, keys held and counted
    every few batches) so they are tested here too."""
    import dataclasses

    from routescope.analysis.corpus.run import layout_of, traced_batches

    monkeypatch.setattr(S, "DENSE_MAX", 0)  # the sparse path: a large vocabulary's
    monkeypatch.setattr(S.KeyCounts, "DEVICE_KEYS", 100)  # held keys counted every few batches
    hf = hf_model("olmoe", tokenizer.get_vocab_size())
    model, _ = load_checkpoint(save_hf(hf, tmp_path / "olmoe", tokenizer), device=device)
    reader = route_reader(model)
    gen = torch.Generator().manual_seed(2)
    batches = [(torch.randint(0, model.vocab_size, (r, t), generator=gen),
                ([t - i % 3 for i in range(r)], [["story" if i % 2 else "math" for i in range(r)]]))
               for r, t in [(2, 7), (3, 5), (1, 9), (2, 4), (4, 6)]]
    layout = dataclasses.replace(layout_of(model, ["domain"]), k=hf.config.num_experts_per_tok)
    here, there = S.RouteStats(layout, model.vocab_size), S.RouteStats(layout, model.vocab_size)
    got = list(traced_batches(model, reader, iter(batches)))
    with monkeypatch.context() as m:
        m.setattr(S, "_accelerated", lambda d: True)  # on a CPU too: the device branches
        for b in got:
            lengths, labels = b.item
            here.add(b.routes, lengths, input_ids=b.ids, predicted=b.predicted, topk=b.topk, labels=labels)
    for b in got:
        lengths, labels = b.item
        there.add(_host(b.routes), lengths, input_ids=b.ids.numpy(), predicted=_host(b.predicted),
                  topk=_host(b.topk), labels=labels)
    assert here.n_tokens == there.n_tokens == sum(sum(item[0]) for _, item in batches)
    for table in (RD.utilisation, RD.label_shares, RD.co_routing, lambda s: RD.specialisation(s, min_count=1)):
        pd.testing.assert_frame_equal(table(here), table(there))
    for by in S.BY_KINDS:
        assert [a.tolist() for a in here.spec[by].items()] == [a.tolist() for a in there.spec[by].items()]


def test_logits_as_computed_widen_to_the_float32_logits(tokenizer, tmp_path):
    """`float_logits=False` (the corpus ranks logits only) returns the model's own bfloat16 logits:
    widened, they are the default float32 logits bit for bit, so their argmax is the same."""
    hf = hf_model("olmoe", tokenizer.get_vocab_size()).to(torch.bfloat16)
    model, _ = load_checkpoint(save_hf(hf, tmp_path / "olmoe", tokenizer), dtype="bfloat16")
    x = torch.randint(0, model.vocab_size, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        full, raw = model(x).logits, model(x, float_logits=False).logits
    assert full.dtype == torch.float32 and raw.dtype == torch.bfloat16
    assert torch.equal(raw.float(), full) and torch.equal(raw.argmax(-1), full.argmax(-1))
