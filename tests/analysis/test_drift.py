"""`routescope drift` / `analysis.drift` (issue 39): router saturation, utilisation, expert events and
label specialisation over a run's checkpoints, against plain computations from transformers' own
router logits (top-k of each token by `torch.topk`, overlap by Python sets, utilisation by counting)."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from routescope.analysis import drift as DR
from routescope.core_models.checkpoint import load_tokenizer_file
from routescope.corpora.corpus import validation_documents
from routescope.analysis.inputs.datasets import CorpusRow, rows_corpus
from routescope.cli.main import main
from hf_models import hf_model, save_hf

ROOT = Path(__file__).resolve().parents[2]
SHIPPED_RUN = ROOT / "checkpoints" / "olmoe-tiny-steps"
TEXTS = ["Once upon a time, there was a little girl named Lily.", "She loved playing with her toys in the park.",
         "Solve this problem: 1 + 1 = 2. Express your answer as a fraction.",
         "Find the largest prime. Evaluate the sum and simplify.", "One day a little boy went to the park.",
         "from sympy import sqrt; Python code to solve the problem."]


def _data(texts=TEXTS, domains=None):
    domains = domains or ["story", "story", "math", "math", "story", "math"]
    return rows_corpus("drift test rows", [CorpusRow(f"r{i}", t, (d,)) for i, (t, d) in enumerate(zip(texts, domains))],
                       ["domain"])


def _step(model, seed: int, scale: float):
    """The model with every router moved by `scale` times a seeded normal (a later "checkpoint")."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("mlp.gate.weight"):
                p.add_(scale * torch.randn(p.shape, generator=g))
    return model


@pytest.fixture(scope="module")
def run(tmp_path_factory, tokenizer):
    """A run directory of three tiny OLMoE snapshots (routers moving between them) sharing one
    tokenizer at the top, as `train --snapshots` writes it."""
    d = tmp_path_factory.mktemp("run") / "tiny-run"
    model = hf_model("olmoe", tokenizer.get_vocab_size())
    for i, step in enumerate((10, 20, 40)):
        if i:
            _step(model, i, 0.4 / i)
        save_hf(model, d / f"step-{step:04d}")
    tokenizer.save(str(d / "tokenizer.json"))
    return d


def _plain_topk(path: Path, tokenizer, texts, max_tokens: int | None = None) -> list[np.ndarray]:
    """Per layer, each token's top-k expert ids (tokens, k) from transformers' own router logits, one
    row per forward (no padding)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    k = model.config.num_experts_per_tok
    per_layer = None
    with torch.no_grad():
        for t in texts:
            ids = tokenizer.encode(t).ids[:max_tokens]
            logits = model(torch.tensor([ids]), output_router_logits=True).router_logits
            tops = [torch.topk(l.float(), k, dim=-1).indices.numpy() for l in logits]
            per_layer = tops if per_layer is None else [np.concatenate([a, b]) for a, b in zip(per_layer, tops)]
    return per_layer


def _plain_overlap(a: np.ndarray, b: np.ndarray) -> float:
    k = a.shape[1]
    return sum(len(set(x) & set(y)) / k for x, y in zip(a.tolist(), b.tolist())) / len(a)


def test_saturation_and_utilisation_equal_a_plain_computation(run, tokenizer):
    cks = sorted(run.glob("step-*"))
    result = DR.drift(cks, _data(), DR.DriftSettings(batch_size=1))  # one row per forward, as the plain loop
    sat, util = result.tables["saturation"], result.tables["utilisation"]
    plain = {p.name: _plain_topk(p, tokenizer, TEXTS) for p in cks}
    names = [p.name for p in cks]
    assert result.checkpoints == names and result.steps == [10, 20, 40]
    assert list(sat.columns) == ["checkpoint", "step", "layer", "overlap_final", "overlap_previous"]
    layers = list(dict.fromkeys(sat["layer"]))
    assert len(layers) == 3
    for i, name in enumerate(names):
        rows = sat[sat["checkpoint"] == name]
        for l, layer in enumerate(layers):
            r = rows[rows["layer"] == layer].iloc[0]
            assert r["overlap_final"] == pytest.approx(_plain_overlap(plain[name][l], plain[names[-1]][l]), abs=1e-12)
            if i == 0:
                assert np.isnan(r["overlap_previous"])
            else:
                assert r["overlap_previous"] == pytest.approx(
                    _plain_overlap(plain[name][l], plain[names[i - 1]][l]), abs=1e-12)
            slots = Counter(plain[name][l].ravel().tolist())
            total = plain[name][l].size
            u = util[(util["checkpoint"] == name) & (util["layer"] == layer)].set_index("option")["share"]
            assert {o: u[o] for o in u.index} == pytest.approx({o: slots.get(o, 0) / total for o in u.index})
    assert (sat[sat["checkpoint"] == names[-1]]["overlap_final"] == 1.0).all()
    assert sat[sat["checkpoint"] == names[0]]["overlap_final"].lt(1.0).any()  # the routers did move


def test_label_specialisation_equals_a_plain_total_variation(run, tokenizer):
    cks = sorted(run.glob("step-*"))
    data = _data()
    result = DR.drift(cks, data, DR.DriftSettings(batch_size=1))
    spec = result.tables["label_specialisation"]
    domains = [r.labels[0] for r in data]
    for p in cks:
        tops = _plain_topk(p, tokenizer, TEXTS)
        lengths = [len(tokenizer.encode(t).ids) for t in TEXTS]
        token_domain = [d for d, n in zip(domains, lengths) for _ in range(n)]
        for l, layer in enumerate(dict.fromkeys(spec["layer"])):
            first = tops[l][:, 0].tolist()
            n_all = Counter(first)
            tv_sum, n_sum = 0.0, 0
            for value in set(domains):
                mine = Counter(f for f, d in zip(first, token_domain) if d == value)
                n_v = sum(mine.values())
                experts = set(n_all) | set(mine)
                tv = 0.5 * sum(abs(mine[e] / n_v - n_all[e] / len(first)) for e in experts)
                tv_sum, n_sum = tv_sum + tv * n_v, n_sum + n_v
            got = spec[(spec["checkpoint"] == p.name) & (spec["layer"] == layer)]["specialisation"].iloc[0]
            assert got == pytest.approx(tv_sum / n_sum, abs=1e-12)


def test_events_and_changes_follow_the_dead_flags_in_order():
    rows = []
    flags = {0: [False, True, True, False], 1: [True, False, False, False], 2: [False] * 4}
    shares = {0: [0.3, 0.0, 0.0, 0.2], 1: [0.0, 0.4, 0.3, 0.3], 2: [0.7, 0.6, 0.7, 0.5]}
    for c in range(4):
        for o in range(3):
            rows.append((f"ck{c}", 10 * (c + 1), "L0", o, shares[o][c], flags[o][c], False))
    util = pd.DataFrame(rows, columns=["checkpoint", "step", "layer", "option", "share", "dead", "overloaded"])
    events = DR.expert_events(util)
    got = [(r.option, r.event, r.step) for r in events.itertuples()]
    assert got == [(0, "dies", 20), (0, "revives", 40), (1, "dead at start", 10), (1, "revives", 20)]
    changes = DR.expert_changes(util, events).set_index("option")
    for o in range(3):
        assert changes.loc[o, "total_variation"] == pytest.approx(sum(abs(b - a) for a, b in zip(shares[o], shares[o][1:])))
    assert changes.loc[0, "first_dies_step"] == 20 and changes.loc[0, "first_revives_step"] == 40
    assert changes.loc[1, "first_dies_step"] == 10 and changes.loc[1, "first_revives_step"] == 20
    assert pd.isna(changes.loc[2, "first_dies_step"])
    assert list(DR.expert_changes(util, events)["option"]) == [0, 1, 2]  # most changed first: 0.5, 0.4, 0.3


def test_topk_overlap_leaves_out_undefined_tokens():
    a = np.array([[[1, 2], [3, 4], [0, 0]]])  # (L=1, N=3, k=2); the third token undefined
    b = np.array([[[2, 5], [3, 4], [1, 2]]])
    assert DR.topk_overlap(a, b)[0] == pytest.approx((0.5 + 1.0) / 2)


def test_sort_by_step_reads_cards_configs_and_names(run, tmp_path):
    cks = sorted(run.glob("step-*"))
    paths, steps = DR.order_checkpoints(list(reversed(cks)), "step")
    assert [p.name for p in paths] == [p.name for p in cks] and steps == [10, 20, 40]
    paths, steps = DR.order_checkpoints(list(reversed(cks)), "given")
    assert [p.name for p in paths] == [p.name for p in reversed(cks)]
    card = tmp_path / "a"
    card.mkdir()
    (card / "README.md").write_text("# x\n\n- steps: 250 (batch 16 x 256 tokens)\n")
    assert DR.checkpoint_step(card) == 250
    (card / "trainer_state.json").write_text(json.dumps({"global_step": 300}))
    assert DR.checkpoint_step(card) == 300  # HF Trainer's record before the card
    assert DR.checkpoint_step(tmp_path / "checkpoint-500") == 500 and DR.checkpoint_step(tmp_path / "final") is None


def test_bad_input_is_one_line_and_exit_2(run, tokenizer, tmp_path, capsys):
    cks = sorted(run.glob("step-*"))
    other = save_hf(hf_model("mixtral", tokenizer.get_vocab_size()), tmp_path / "step-0050", tokenizer)
    data = tmp_path / "d.txt"
    data.write_text("\n".join(TEXTS) + "\n")
    final = tmp_path / "final"
    save_hf(hf_model("olmoe", tokenizer.get_vocab_size()), final, tokenizer)
    cases = [([cks[0]], "give at least two"), ([cks[0], other], "has another shape than"),
             ([cks[0], cks[0]], "given twice"), ([cks[0], tmp_path / "nothing"], "not a checkpoint directory"),
             ([cks[0], final, "--sort", "step"], "--sort step: no step")]
    capsys.readouterr()  # transformers' own progress bars while saving
    for args, message in cases:
        code = main(["drift", *map(str, args), "--data", str(data), "--out", str(tmp_path / "out"), "--quiet"])
        err = capsys.readouterr().err.strip()
        assert code == 2 and message in err and len(err.splitlines()) == 1, (args, err)
    assert not (tmp_path / "out").exists()


def test_cli_writes_the_tables_beside_parquet_and_an_offline_page(run, tmp_path, capsys):
    cks = sorted(run.glob("step-*"))
    data = tmp_path / "d.tsv"
    data.write_text("text\tdomain\n" + "".join(f"{t}\t{d}\n" for t, d in zip(TEXTS, ["s", "s", "m", "m", "s", "m"])))
    out = tmp_path / "out"
    argv = ["drift", *map(str, reversed(cks)), "--sort", "step", "--data", str(data), "--out", str(out), "--quiet",
            "--device", "cpu"]
    assert main(argv) == 0
    for name in ("saturation", "utilisation", "events", "experts", "label_shares", "label_specialisation"):
        csv, parquet = pd.read_csv(out / f"{name}.csv"), pd.read_parquet(out / f"{name}.parquet")
        assert len(csv) == len(parquet), name
    sat = pd.read_csv(out / "saturation.csv")
    assert list(sat["checkpoint"].unique()) == [p.name for p in cks] and list(sat["step"].unique()) == [10, 20, 40]
    util = pd.read_csv(out / "utilisation.csv")
    assert list(util.columns[:5]) == ["checkpoint", "step", "layer", "option", "share"]
    assert util.groupby(["checkpoint", "layer"])["share"].sum().to_numpy() == pytest.approx(1.0)
    html = (out / "drift.html").read_text()
    assert "Router saturation" in html and "Experts that changed most" in html and 'id="corpus-data"' in html
    assert "<script src=" not in html  # offline: plotly.js inlined
    assert main(argv) == 0  # an earlier run's directory is replaced whole
    (out / "mine.txt").write_text("x")
    assert main(argv) == 2 and "mine.txt" in capsys.readouterr().err


@pytest.mark.skipif(not (SHIPPED_RUN / "run.json").is_file(), reason="no shipped olmoe-tiny-steps run")
def test_the_shipped_run_saturation_equals_a_plain_computation(tmp_path):
    """`routescope drift` on checkpoints/olmoe-tiny-steps (issue 39's "must show"): its saturation table
    against transformers' own router logits of each snapshot, per token by Python sets."""
    cks = sorted(SHIPPED_RUN.glob("step-*"))
    tok = load_tokenizer_file(SHIPPED_RUN / "tokenizer.json")
    texts = [d for domain in ("story", "math") for d in validation_documents(domain, 4)]
    data = tmp_path / "d.txt"
    data.write_text("\n".join(t.replace("\n", " ") for t in texts) + "\n")
    out = tmp_path / "out"
    assert main(["drift", *map(str, cks), "--sort", "step", "--data", str(data), "--out", str(out), "--max-tokens",
                 "48", "--batch-size", "1", "--quiet", "--device", "cpu"]) == 0
    sat = pd.read_csv(out / "saturation.csv")
    lines = [t.replace("\n", " ") for t in texts]
    plain = {p.name: _plain_topk(p, tok, lines, 48) for p in cks}
    last = cks[-1].name
    for p in cks:
        rows = sat[sat["checkpoint"] == p.name]
        for l, layer in enumerate(rows["layer"]):
            assert rows[rows["layer"] == layer]["overlap_final"].iloc[0] == pytest.approx(
                _plain_overlap(plain[p.name][l], plain[last][l]), abs=1e-12), (p.name, layer)


def test_checkpoints_loaded_in_two_threads_leave_the_default_dtype(tmp_path, tokenizer, monkeypatch):
    """The Drift view loads checkpoints on a background thread while a session may load another:
    transformers builds each under `local_torch_dtype(config.dtype)`, torch's default dtype for the whole
    process. Held open (a sleep inside), two unserialised builds leave it float16 for good; the loads
    take `hf.config.DEFAULT_DTYPE_LOCK`, so it comes back float32."""
    import threading
    import time
    from contextlib import contextmanager

    import transformers.modeling_utils as MU
    from routescope.core_models.checkpoint import load_checkpoint

    inner = MU.local_torch_dtype

    @contextmanager
    def slow(dtype, *args, **kwargs):
        with inner(dtype, *args, **kwargs):
            time.sleep(0.2)  # the window another thread's build would fall into
            yield

    monkeypatch.setattr(MU, "local_torch_dtype", slow)
    path = save_hf(hf_model("olmoe", tokenizer.get_vocab_size()).half(), tmp_path / "half", tokenizer)
    assert json.loads((path / "config.json").read_text())["dtype"] == "float16"
    def loads():
        for _ in range(3):
            load_checkpoint(path, device="meta")  # shapes only: the build under float16 alone

    threads = [threading.Thread(target=loads) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    leaked = torch.get_default_dtype()
    torch.set_default_dtype(torch.float32)  # a failure here must not spill into the next tests
    assert leaked == torch.float32
