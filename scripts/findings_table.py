"""The findings table of checkpoints/README.md: for each paper's headline claim that can be tested at
this scale, the claim (quoted, with its table or section), what the shipped checkpoints measure, and
whether the claim holds here, under the conditions the paper made it in (its method, its baseline,
equal tokens or not). Every number is measured here or read from the training records the other
tables render (each checkpoint's training.json, checkpoint_table.py; experiments/*.training.json;
experiments/gumbel-routing.runs.json, whose runs table and parallel-quality.md's are rendered here
too); the verdict is computed from them by the rule its row states, and a row whose verdict compares
runs of unequal training tokens (over 10% apart) must give each one's count (`unstated_token_gaps`).

    .venv/bin/python scripts/findings_table.py           # measure, write checkpoints/findings.json and the tables
    .venv/bin/python scripts/findings_table.py --check   # exit 1 if a table is stale or a row hides a token gap

Measured: validation losses on the trainer's fixed split (100 documents per domain, 256-token rows,
nats per token), Table 6 routes at the last prompt token (analysis.runs.domain, as the routes table), ATM
merge ratios over the first 50 validation documents of each domain (analysis.runs.routing.atm_summary),
the ATM leak apart (per-position losses on the first 32 validation rows per domain, split by whether
the paper's ATM pairs a position with the token it predicts), learned gates read from their sites. One timing (pgpt with one path dropped against both paths) is a
ratio of medians measured in one run on this machine; the tests re-measure everything else.
"""
from __future__ import annotations

import json
import math
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1] / "checkpoints"
FINDINGS = "findings.json"
START, END = "<!-- findings:start -->", "<!-- findings:end -->"
# the dense GPT-2-style run MoEP is compared with: an experiment, not shipped (its training.json is kept)
DENSE_RUN = "experiments/gpt2-dense-3.training.json"
# llama-dense trained like the PaPaformer compositions, pgpt and wiola-tiny (600 steps, no dropout): the
# equal-token dense baseline (an experiment, not shipped; checkpoint_table.py shows it too)
EQUAL_TOKEN_RUN_NAME = "llama-dense-600"
EQUAL_TOKEN_RUN = f"experiments/{EQUAL_TOKEN_RUN_NAME}.training.json"
GUMBEL_RUNS = "experiments/gumbel-routing.runs.json"  # the runs of experiments/gumbel-routing.md
# wiola-tiny trained with causal ATM (600 steps like the shipped one; an experiment, weights not shipped)
CAUSAL_RUN_NAME = "wiola-causal-atm"
CAUSAL_RUN = f"experiments/{CAUSAL_RUN_NAME}.training.json"
VAL_DOCS, SEQ_LEN, ATM_DOCS = 100, 256, 50
LEAK_ROWS = 32  # validation rows per domain for the ATM leak split (per-position losses)


# --- measuring ------------------------------------------------------------------------------------

def _summary(root: Path, name: str) -> dict[str, Any]:
    s = json.loads((root / name).read_text() if name.endswith(".json") else (root / name / "training.json").read_text())
    hist = {h["step"]: {"story": h["val_story"], "math": h["val_math"]} for h in s["history"] if "val_story" in h}
    return {"val": s["val_loss"], "steps": s["steps"], "tokens": s["tokens"], "params": s["params_total"],
            "active": s["params_active"], "domain_route_steps": s["train"].get("domain_route_steps", 0),
            "history": {str(k): v for k, v in sorted(hist.items())}}


def _loss(model, rows: dict, **call) -> dict[str, float]:
    import torch
    import torch.nn.functional as F

    out = {}
    with torch.inference_mode():
        for dom, r in rows.items():
            total, count = 0.0, 0
            for k in range(0, len(r), 16):
                chunk = r[k:k + 16]
                logits = model(chunk[:, :-1], **call).logits
                total += F.cross_entropy(logits.flatten(0, 1).float(), chunk[:, 1:].flatten(), reduction="sum").item()
                count += chunk[:, 1:].numel()
            out[dom] = total / count
    return out


def measure_table6(root: Path) -> dict[str, Any]:
    from routescope.analysis.runs import domain as D
    from routescope.core_models.checkpoint import load_checkpoint

    out = {}
    probes = D.read_probes(D.DEFAULT_PROBES)
    for name in ("papaformer-share-linear", "papaformer-gumbel-v1", "papaformer-gumbel-v2"):
        model, tok = load_checkpoint(root / name)
        for source, routes in (("ours", D.probe_routes(model, tok, probes)),
                               ("paper", D.paper_routes(probes, model.config.combiner))):
            summ = D.table6_summary(model.config, **{source: routes})
            out[f"{name}:{source}"] = {m: float(v) for m, v in zip(summ["metric"], summ["value"])}
    return out


def measure_pgpt(root: Path, timing: bool = True) -> dict[str, Any]:
    import torch

    from routescope.analysis.reports.report import validation_rows
    from routescope.core_models import Ablation
    from routescope.core_models.checkpoint import load_checkpoint

    model, tok = load_checkpoint(root / "pgpt")
    w = [float(x) for x in model.mixer.full().detach()]
    heavy = max(range(len(w)), key=lambda j: (w[j], -j))
    drop = Ablation(drop=tuple(("paths", j) for j in range(len(w)) if j != heavy))
    mode = Ablation(modes=("pgpt1-reference",))
    rows = validation_rows(tok, VAL_DOCS, SEQ_LEN)
    out = {"weights": w, "kept": heavy, "full": _loss(model, rows), "pgpt1": _loss(model, rows, ablation=drop),
           "pgpt1_reference": _loss(model, rows, ablation=mode),
           "params": model.num_params(),
           "params_pgpt1": model.num_params() - sum(p.numel() for j, path in enumerate(model.paths) if j != heavy
                                                    for p in path.parameters())}
    if timing:  # interleaved repeats, median per setting: one run's ratio (a measurement, never asserted)
        x = rows["story"][:8, :-1]
        times: dict[str, list[float]] = {"full": [], "pgpt1": []}
        with torch.inference_mode():
            for _ in range(2):
                model(x), model(x, ablation=drop)  # warm-up
            for _ in range(15):
                for key, ab in (("full", None), ("pgpt1", drop)):
                    t0 = time.perf_counter()
                    model(x, ablation=ab)
                    times[key].append(time.perf_counter() - t0)
        out["time_ratio"] = statistics.median(times["pgpt1"]) / statistics.median(times["full"])
    return out


def _position_nll(model, rows, sites: list[str], **call):
    """Per-position next-token NLL (N, T) of rows (N, T + 1) and, from the traced merge maps, which
    positions opened a merged pair (t merged with t + 1 in some ATM layer: they read the token they
    predict when ATM copies a pair's output back, eq. 32)."""
    import torch
    import torch.nn.functional as F

    from routescope.core_models import tracing

    nll, opens = [], []
    with torch.inference_mode():
        for k in range(0, len(rows), 16):
            chunk = rows[k:k + 16]
            with tracing(sites) as tr:
                logits = model(chunk[:, :-1], **call).logits
            nll.append(F.cross_entropy(logits.transpose(1, 2).float(), chunk[:, 1:], reduction="none"))
            o = torch.zeros(chunk[:, :-1].shape, dtype=torch.bool)
            for name in sites:
                if name in tr:
                    g = tr[name]
                    o[:, :-1] |= g[:, 1:] == g[:, :-1]
            opens.append(o)
    return torch.cat(nll), torch.cat(opens)


def _causal_key_saving(groups) -> float:
    """Attention scores causal ATM skips in one (T,) merge map, as a share of the T (T + 1) / 2 causal
    ones: query t reads the keys s <= t that are not a pair's first token, and its own."""
    import torch

    T = groups.shape[0]
    opens = torch.zeros(T, dtype=torch.bool)
    opens[:-1] = groups[1:] == groups[:-1]
    read = torch.cumsum((~opens).long(), 0) + opens.long()  # keys each query reads
    return 1.0 - float(read.sum()) / (T * (T + 1) / 2)


def measure_wiola(root: Path) -> dict[str, Any]:
    import pandas as pd
    import torch

    from routescope.analysis.export import columns as C
    from routescope.analysis.reports.report import validation_rows
    from routescope.analysis.runs.routing import atm_summary
    from routescope.core_models import tracing
    from routescope.core_models.checkpoint import load_checkpoint
    from routescope.corpora.corpus import validation_documents

    model, tok = load_checkpoint(root / "wiola-tiny")
    c = model.config
    sites = [n for n in model.site_names() if ".atm." in n]
    maps = [n for n in sites if n.endswith(".merge_map")]
    out = {"trained_tau": c.atm_tau, "trained_causal": c.atm_causal, "n_layers": c.n_layers,
           "atm_layers": len(c.atm_layers), "tau": {}}
    for tau in (0.92, c.atm_tau):
        frames, causal = [], []
        with torch.inference_mode():
            for dom in ("story", "math"):
                for doc in validation_documents(dom, ATM_DOCS):
                    x = torch.tensor([tok.encode(doc).ids[:c.context]])
                    with tracing(sites) as tr:
                        model(x, atm=True, atm_tau=tau)
                    frames.append(atm_summary(tr, model))
                    with tracing(maps) as tr:
                        model(x, atm=True, atm_tau=tau, atm_causal=True)
                    causal += [_causal_key_saving(tr[n][0]) for n in maps]
        df = pd.concat(frames, ignore_index=True)
        out["tau"][f"{tau:g}"] = {"mu": float(df[C.MU].mean()), "saving_per_layer": float(df[C.FLOP_SAVING].mean()),
                                  "causal_saving_per_layer": sum(causal) / len(causal)}
    rows = validation_rows(tok, VAL_DOCS, SEQ_LEN)
    out["loss_off"] = _loss(model, rows, atm=False)
    out["loss_on"] = _loss(model, rows, atm=True, atm_tau=c.atm_tau)
    # the leak apart: LEAK_ROWS rows per domain, positions split by whether the paper's ATM pairs them
    # with the token they predict
    out["leak_rows"], out["split"] = LEAK_ROWS, {}
    for dom, r in rows.items():
        r = r[:LEAK_ROWS]
        paper, opens = _position_nll(model, r, maps, atm=True, atm_tau=c.atm_tau)
        off, _ = _position_nll(model, r, maps, atm=False)
        causal, _ = _position_nll(model, r, maps, atm=True, atm_tau=c.atm_tau, atm_causal=True)
        out["split"][dom] = {
            "positions": int(opens.numel()), "merged": int(opens.sum()),
            **{f"{name}_{part}": float(v[sel].mean()) for name, v in (("off", off), ("paper", paper), ("causal", causal))
               for part, sel in (("merged", opens), ("rest", ~opens), ("all", torch.ones_like(opens)))}}
    return out


def measure_pagmlp(root: Path) -> dict[str, Any]:
    import torch

    from routescope.core_models import tracing
    from routescope.core_models.checkpoint import load_checkpoint

    model, tok = load_checkpoint(root / "pagmlp")
    with torch.inference_mode(), tracing() as tr:  # the gates do not depend on the input
        model(torch.tensor([tok.encode("Once upon a time").ids]))
    n = model.config.n_layers
    return {"alpha": [float(tr[f"blocks.{i}.ffn.alpha"]) for i in range(n)],
            "beta": [float(tr[f"blocks.{i}.ffn.beta"]) for i in range(n)]}


def measure(root: Path = ROOT, timing: bool = True) -> dict[str, Any]:
    import torch

    torch.set_num_threads(1)
    return {**records(root), "table6": measure_table6(root), "pgpt": measure_pgpt(root, timing),
            "wiola": measure_wiola(root), "pagmlp": measure_pagmlp(root)}


SHIPPED_RUNS = ("papaformer-share-linear", "papaformer-gumbel-v1", "papaformer-gumbel-v2", "path-story", "path-math",
                "moep", "moep-swiglu", "llama-dense", "pagmlp", "pgpt", "wiola-tiny")


def records(root: Path = ROOT) -> dict[str, Any]:
    """What the verdicts read from the training records the other tables render: each run's
    training.json (checkpoint_table.py) and the gumbel-routing runs (that note's runs table)."""
    runs = {n: _summary(root, n) for n in SHIPPED_RUNS}
    runs["gpt2-dense-3"] = _summary(root, DENSE_RUN)
    runs[EQUAL_TOKEN_RUN_NAME] = _summary(root, EQUAL_TOKEN_RUN)
    runs[CAUSAL_RUN_NAME] = _summary(root, CAUSAL_RUN)
    return {"runs": runs, "gumbel_runs": json.loads((root / GUMBEL_RUNS).read_text())["runs"]}


# --- the table: rows from the measured numbers --------------------------------------------------

@dataclass(frozen=True)
class Finding:
    """One row. `conditions`: how the paper made the claim (its method, its baseline, equal tokens or
    not); `compared`: the records (runs of findings.json) whose numbers the verdict compares: where
    their training tokens differ by more than TOKEN_GAP the row must say so (`unstated_token_gaps`)."""

    paper: str
    claim: str
    conditions: str
    ours: str
    holds: str
    rule: str
    compared: tuple[str, ...] = ()

    def cells(self) -> tuple[str, ...]:
        return (self.paper, self.claim, self.conditions, self.ours, self.holds, self.rule)


TOKEN_GAP = 0.10  # compared runs whose training tokens differ by more than this must say so in the row


def _rel(a: float, b: float) -> float:
    return a / b - 1


def _pair(v: dict[str, float]) -> str:
    return f"{v['story']:.3f} / {v['math']:.3f}"


def _gap(a: dict[str, float], b: dict[str, float]) -> str:
    return f"{_rel(a['story'], b['story']):+.1%} / {_rel(a['math'], b['math']):+.1%}"


def _yes(cond: bool) -> str:
    return "yes" if cond else "**no**"


def _pct(x: float) -> str:
    return f"{x:.0%}" if round(x * 100, 6) == round(x * 100) else f"{x:.1%}"


def tokens_of(m: dict[str, Any], name: str) -> int:
    """Training tokens of a record: a run of findings.json, or a gumbel-routing experiment run."""
    if name in m["runs"]:
        return m["runs"][name]["tokens"]
    return next(r["tokens"] for r in m["gumbel_runs"] if r["run"] == name)


def token_label(m: dict[str, Any], name: str) -> str:
    return f"{name} {tokens_of(m, name) / 1e6:.2f}M"


def token_statement(m: dict[str, Any], *names: str) -> str:
    """The training tokens of the compared records, as a row states them."""
    return "training tokens " + ", ".join(token_label(m, n) for n in names)


def unstated_token_gaps(findings: list[Finding], m: dict[str, Any]) -> list[str]:
    """Claims whose verdict compares records whose training tokens differ by more than TOKEN_GAP
    while the row does not give each one's token count."""
    bad = []
    for f in findings:
        tokens = [tokens_of(m, n) for n in f.compared]
        if tokens and max(tokens) > (1 + TOKEN_GAP) * min(tokens):
            text = " ".join(f.cells())
            if not all(token_label(m, n) in text for n in f.compared):
                bad.append(f.claim)
    return bad


def rows(m: dict[str, Any]) -> list[Finding]:
    r = m["runs"]
    out = []

    # PaPaformer
    v1, v2, sl = r["papaformer-gumbel-v1"]["val"], r["papaformer-gumbel-v2"]["val"], r["papaformer-share-linear"]["val"]
    warm = {n: r[n]["domain_route_steps"] for n in ("papaformer-share-linear", "papaformer-gumbel-v1", "papaformer-gumbel-v2")}
    out.append(Finding(
        "PaPaformer", "Gumbel MoE v2 beats v1: macro-average 58.90 vs 58.25 on TinyStories + OpenMathInstruct "
        "(Table 7); \"only Parallel_Gumb_MoE_2 was able to outperform the smaller baseline\" (§6.1)",
        "both composed from the same pre-trained paths and trained jointly on the same data (§4.1)",
        f"val loss v2 {_pair(v2)} vs v1 {_pair(v1)} ({_gap(v2, v1)})",
        _yes(v2["story"] < v1["story"] and v2["math"] < v1["math"]),
        f"lower validation loss on both domains; same recipe ({warm['papaformer-gumbel-v1']}-step supervised warm-up), "
        f"{token_statement(m, 'papaformer-gumbel-v2', 'papaformer-gumbel-v1')}",
        ("papaformer-gumbel-v2", "papaformer-gumbel-v1")))
    dense = r[EQUAL_TOKEN_RUN_NAME]["val"]
    path_tokens = r["path-story"]["tokens"] + r["path-math"]["tokens"]
    best3 = all(sl[d] < min(v1[d], v2[d]) for d in ("story", "math"))
    beats_dense = all(sl[d] < dense[d] for d in ("story", "math"))
    out.append(Finding(
        "PaPaformer", "\"the more lightweight Parallel_Share_Linear model ... achieved the highest overall results in "
        "both training phases ... and outperformed all other models during the second phase\" (§6.1); Table 7, "
        "TinyStories + OpenMathInstruct: macro-average 59.40 vs LLaMA_256 59.25, Gumb_MoE_2 58.90, Gumb_MoE_1 58.25",
        "against the Gumbel compositions and the dense LLaMA_256, trained from scratch on the full combined data; "
        "the paths saw 60% of it, the composition the other 40% (§4.1): the same data in total",
        f"val loss Share-Linear {_pair(sl)}; v1 {_pair(v1)}, v2 {_pair(v2)}; dense llama-dense at equal training "
        f"tokens (600 steps, no dropout like the compositions, not shipped) {_pair(dense)}: Share-Linear "
        f"{_gap(sl, dense)}",
        _yes(best3 and beats_dense),
        f"holds if Share-Linear's validation loss is the lowest of the three compositions and below the dense "
        f"model's on both domains ({'it is the lowest of the three' if best3 else 'it is not the lowest of the three'}"
        f"{', and beats the dense model' if beats_dense else ', but not below the dense model'}); "
        f"{token_statement(m, 'papaformer-share-linear', 'papaformer-gumbel-v1', 'papaformer-gumbel-v2', EQUAL_TOKEN_RUN_NAME)}"
        f", and the compositions' paths {path_tokens / 1e6:.2f}M more before (so not the paper's equal total data: "
        f"that needs a dense run of {(path_tokens + r['papaformer-share-linear']['tokens']) / 1e6:.2f}M tokens, not "
        f"made); Share-Linear's warm-up is {warm['papaformer-share-linear']} steps, the Gumbel ones' "
        f"{warm['papaformer-gumbel-v1']} (and only theirs supervises a router)",
        ("papaformer-share-linear", "papaformer-gumbel-v1", "papaformer-gumbel-v2", EQUAL_TOKEN_RUN_NAME)))

    t6 = m["table6"]

    def shares(name: str, src: str) -> str:
        s = t6[f"{name}:{src}"]
        comb = f" / {s['combined']:.0%}" if "combined" in s else ""
        return f"{s['route 1']:.0%} / {s['route 2']:.0%}{comb}, accuracy {s['accuracy']:.0%}"

    names = ("papaformer-gumbel-v1", "papaformer-gumbel-v2", "papaformer-share-linear")
    paper_best = max(t6[f"{n}:paper"]["accuracy"] for n in names[:2])
    n_routes = t6["papaformer-gumbel-v1:paper"]["n_routes"]
    bound = paper_best + 2 * math.sqrt(paper_best * (1 - paper_best) / n_routes)
    free = [g for g in m["gumbel_runs"] if g["combiner"].startswith("gumbel") and g["combiner_init"] == "normal"
            and not g["route_supervision"]]
    free_acc = [g["table6_last"]["accuracy"] for g in free]
    out.append(Finding(
        "PaPaformer", "routing \"often struggles to fully and consistently utilize domain-specific pretrained "
        "paths\" (§1); Table 6 path 1 / path 2 / combined: "
        + "; ".join(f"{n.split('-', 1)[1]} {shares(n, 'paper')}" for n in names),
        "Gumbel routers learn without supervision (Gumbel-softmax and the aux terms of eqs. 8-10), paths trainable, "
        "the reference's N(0, 0.02) combiner start (§3.3, §4.1); routes of the paper's 20 probes (Table 6)",
        f"trained the paper's way (experiments/gumbel-routing.md runs {', '.join(g['run'].split('-')[0] for g in free)}: "
        f"no route supervision, N(0, 0.02) start): Table 6 accuracy {_pct(min(free_acc))}-{_pct(max(free_acc))}. "
        "Shipped, after the domain-route warm-up (Gumbel routers supervised by it): " + "; ".join(f"{n.split('-', 1)[1]} {shares(n, 'ours')}" for n in names),
        _yes(max(free_acc) <= bound),
        f"holds under the paper's training; our supervised warm-up changes it. Holds if no Gumbel run trained the "
        f"paper's way routes the probes more accurately than the paper's best Gumbel model ({_pct(paper_best)}) by "
        f"over two binomial standard errors of its {n_routes:.0f} routes (up to {_pct(bound)}); routes at the last "
        f"prompt token. Those runs are shorter than the shipped ones ("
        + ", ".join(token_label(m, g["run"]) for g in free) + f"; {token_label(m, 'papaformer-gumbel-v1')}) and some "
        "add one change each (frozen paths, a stronger balance term, annealing, z-loss, forced domain routes without "
        "router supervision: G, G2, H). The shipped checkpoints route by a supervised domain-route warm-up the paper "
        "did not use (README deviations)",
        tuple(g["run"] for g in free) + ("papaformer-gumbel-v1",)))

    # MoEP
    moep, sw, gpt2 = r["moep"], r["moep-swiglu"], r["gpt2-dense-3"]
    out.append(Finding(
        "MoEP", "\"MoEP ... enables it to outperform the GPT-2 baseline\" (abstract; Table 1 macro-average "
        "49.00 vs 48.10)", "against a dense GPT-2 of the same total parameters, same data (Table 1)",
        f"moep ({moep['active']:,} active of {moep['params']:,}) {_pair(moep['val'])} vs dense GPT-2-style "
        f"({gpt2['params']:,}) {_pair(gpt2['val'])}: {_gap(moep['val'], gpt2['val'])}",
        _yes(all(moep["val"][d] < gpt2["val"][d] for d in ("story", "math"))),
        f"equal active parameters (within {abs(_rel(gpt2['params'], moep['active'])):.1%}; the paper: equal total), "
        f"{moep['steps']} steps each, {token_statement(m, 'moep', 'gpt2-dense-3')}; lower validation loss on both domains",
        ("moep", "gpt2-dense-3")))
    step = "300"
    out.append(Finding(
        "MoEP", "MoEP \"extracted useful patterns earlier during training\" (§5.1, Appendix A.3)",
        "validation curves of MoEP and the dense GPT-2 over the same training (Appendix A.3)",
        f"at step {step}: moep {_pair(moep['history'][step])} vs dense {_pair(gpt2['history'][step])}",
        _yes(all(moep["history"][step][d] < gpt2["history"][step][d] for d in ("story", "math"))),
        f"validation loss at step {step} of the same 1000-step schedule ({token_statement(m, 'moep', 'gpt2-dense-3')})",
        ("moep", "gpt2-dense-3")))
    out.append(Finding(
        "MoEP", "\"MoEP-SwiGLU did not reach the same level of performance\" as MoEP (§5.1; Table 1 47.70 vs 49.00)",
        "the two MoEP variants trained alike (Tables 2-3)",
        f"moep-swiglu {_pair(sw['val'])} vs moep {_pair(moep['val'])} ({_gap(sw['val'], moep['val'])}); "
        f"moep-swiglu has {sw['active']:,} active parameters, moep {moep['active']:,}",
        _yes(any(sw["val"][d] > moep["val"][d] for d in ("story", "math"))),
        f"holds if moep-swiglu's validation loss is higher on a domain; same steps and data "
        f"({token_statement(m, 'moep-swiglu', 'moep')})", ("moep-swiglu", "moep")))

    # ParallelGPT: pgpt's own loss from its training.json, the record the checkpoint table shows
    p, full = m["pgpt"], r["pgpt"]["val"]
    out.append(Finding(
        "ParallelGPT", "\"pgpt-1 with just four decoder blocks is able to perform as well as the pgpt model "
        "with eight decoder blocks\" (§4.3, Table 4)", "the trained pgpt with one path dropped at evaluation (§4.3)",
        f"pgpt {_pair(full)}; pgpt-1 (path {p['kept']} kept) {_pair(p['pgpt1'])} ({_gap(p['pgpt1'], full)}); "
        f"the authors' evaluation (no ln_f) {_pair(p['pgpt1_reference'])} ({_gap(p['pgpt1_reference'], full)})",
        _yes(all(_rel(p["pgpt1"][d], full[d]) <= 0.05 for d in ("story", "math"))),
        "holds if dropping the lower-weight path raises validation loss by at most 5% per domain (one model)"))
    speed = (f"; forward {p['time_ratio']:.2f}x the time of both paths (one run, CPU)" if "time_ratio" in p else "")
    out.append(Finding(
        "ParallelGPT", "dropping paths trades \"some output quality for faster performance\" (§3.1); pgpt-1 "
        "64.8M of 77.7M parameters, 247.52 of 296.53 MB (Table 2)", "one trained model, a path dropped (§3.1)",
        f"pgpt-1 keeps {p['params_pgpt1']:,} of {p['params']:,} parameters "
        f"({p['params_pgpt1'] / p['params']:.0%}){speed}",
        _yes(p.get("time_ratio", 0.0) < 1.0 and p["params_pgpt1"] < p["params"]),
        "fewer parameters and a faster forward"))
    w = p["weights"]
    out.append(Finding(
        "ParallelGPT", "learned path weights 0.5964 and 0.4036: \"the model used the signal from both the "
        "paths\" (§4.3)", "the learned weights of eq. 3 after training", f"learned weights {' / '.join(f'{x:.4f}' for x in w)}",
        _yes(min(w) >= 0.1), "holds if every path keeps a weight of at least 0.1"))

    # Wiola
    wi = m["wiola"]
    frac = wi["atm_layers"] / wi["n_layers"]
    t92, tt = wi["tau"]["0.92"], wi["tau"][f"{wi['trained_tau']:g}"]
    trained = "causal ATM" if wi["trained_causal"] else "the paper's ATM"
    out.append(Finding(
        "Wiola", "ATM \"reducing attention FLOPs by 5-9% during training\" (§I, contribution 3); \"total training "
        "FLOPs reduction is approximately 5-9%\" from mu = 0.08-0.14 at tau = 0.92, 15-26% per active layer on L/3 "
        "of the layers (§VIII-D, eq. 33); \"ATM reduces training FLOPs by 5-9%\" (§XVI)",
        "tau = 0.92 (Table I); whole-model saving = eq. 33's per-layer saving on the middle third of the layers",
        f"whole model: tau 0.92 {t92['saving_per_layer'] * frac:.2%}; tau {wi['trained_tau']:g} (shipped) "
        f"{tt['saving_per_layer'] * frac:.2%} (per ATM layer {tt['saving_per_layer']:.2%}, mu {tt['mu']:.2%}; "
        f"causal ATM's attention scores {tt['causal_saving_per_layer']:.2%} per ATM layer, "
        f"{tt['causal_saving_per_layer'] * frac:.2%} of all)",
        _yes(tt["saving_per_layer"] * frac >= 0.05),
        f"whole-model saving = per-layer saving x {wi['atm_layers']} ATM layers / {wi['n_layers']} (the basis of "
        "benchmarks' 7.atm too); holds if it reaches 5% at the shipped tau"))
    leak = wi["split"]

    def split(part: str, a: str, b: str) -> str:
        return " / ".join(f"{leak[d][f'{a}_{part}']:.4f} -> {leak[d][f'{b}_{part}']:.4f}" for d in ("story", "math"))

    no_loss = all(leak[d]["paper_rest"] <= leak[d]["off_rest"] * 1.01 for d in ("story", "math"))
    merged = " / ".join(f"{leak[d]['merged'] / leak[d]['positions']:.1%}" for d in ("story", "math"))
    out.append(Finding(
        "Wiola", "ATM reduces attention complexity \"without information loss\" (abstract)",
        "ATM on in training, off at inference (§VIII-D); a causal decoder (eq. 42). Eq. 32 copies a merged pair's "
        "output back to both tokens, so the first reads the second: the token it predicts",
        f"positions ATM does not pair with their next token, ATM off -> on (tau {wi['trained_tau']:g}), story / math: "
        f"{split('rest', 'off', 'paper')}. The leak, apart: positions paired with their next token ({merged} of them) "
        f"{split('merged', 'off', 'paper')}; so over all positions on vs off {_pair(wi['loss_on'])} vs "
        f"{_pair(wi['loss_off'])} ({_gap(wi['loss_on'], wi['loss_off'])}), the leak's gain, not a saving",
        _yes(no_loss),
        f"holds if on the positions ATM does not leak into, merging raises validation loss by at most 1% per domain "
        f"({wi['leak_rows']} validation rows per domain; all positions: 100 documents); the shipped model was "
        f"trained with {trained} at tau {wi['trained_tau']:g}, so it also learnt to use the leak"))
    causal_ok = all(leak[d]["causal_all"] <= leak[d]["off_all"] * 1.01 for d in ("story", "math"))
    out.append(Finding(
        "Wiola", "the same claim with causal ATM (ours, not the paper's: a merged pair sits at its last token, so "
        "no position reads a later one; README deviations)",
        "the paper's ATM (Algorithm 1, eqs. 31-32) on in training; causal ATM is our variant",
        f"all positions, ATM off -> causal ATM (tau {wi['trained_tau']:g}), story / math: {split('all', 'off', 'causal')}"
        f" (paper's ATM {split('all', 'off', 'paper')}); positions the paper's ATM pairs with their next token: "
        f"{split('merged', 'off', 'causal')}; attention scores saved per ATM layer {tt['causal_saving_per_layer']:.2%} "
        f"(the paper's ATM {tt['saving_per_layer']:.2%}). Trained with causal ATM instead (600 steps, not shipped): "
        f"ATM-off validation loss {_pair(r[CAUSAL_RUN_NAME]['val'])} vs the shipped {_pair(r['wiola-tiny']['val'])} "
        f"({_gap(r[CAUSAL_RUN_NAME]['val'], r['wiola-tiny']['val'])})",
        _yes(causal_ok),
        f"holds if causal ATM raises validation loss by at most 1% per domain over all positions ({wi['leak_rows']} "
        f"validation rows per domain); evaluated on the shipped model, trained with {trained}; the causally trained "
        f"run is a training record only ({token_statement(m, CAUSAL_RUN_NAME, 'wiola-tiny')}, `{CAUSAL_RUN}`)",
        (CAUSAL_RUN_NAME, "wiola-tiny")))

    # PAGMLP
    pa, base = r["pagmlp"]["val"], r["llama-dense"]["val"]
    out.append(Finding(
        "PAGMLP", "\"PAGMLP maintains comparable performance (validation loss 4.932) to the SwiGLU baseline "
        "(4.927)\" (abstract, Table 1: +0.1%)", "PAGMLP and its SwiGLU baseline trained alike, dropout 0.1 (§4)",
        f"pagmlp {_pair(pa)} vs llama-dense (SwiGLU) {_pair(base)}: {_gap(pa, base)}",
        _yes(all(abs(_rel(pa[d], base[d])) <= 0.01 for d in ("story", "math"))),
        f"same steps, seed and dropout 0.1 ({token_statement(m, 'pagmlp', 'llama-dense')}); holds if within 1% per "
        "domain (one seed, 300 steps)", ("pagmlp", "llama-dense")))
    al, be = m["pagmlp"]["alpha"], m["pagmlp"]["beta"]
    out.append(Finding(
        "PAGMLP", "\"α = 0.53 ± 0.02, β = 0.47 ± 0.02\": \"learned blending weights converge to near-equal "
        "contributions\" (§5, §6)", "the learned gates after training (§5)",
        f"alpha {min(al):.3f}-{max(al):.3f} (mean {statistics.fmean(al):.3f}), beta {min(be):.3f}-{max(be):.3f} "
        f"(mean {statistics.fmean(be):.3f}) over {len(al)} layers; both start at 0.5",
        _yes(all(0.4 <= x <= 0.6 for x in al + be)),
        "near-equal: every alpha and beta within 0.4-0.6; ours are independent gates and barely left "
        "their start in 300 steps"))
    return out


def render(m: dict[str, Any]) -> str:
    lines = [START, "", "## Findings: the papers' claims at this scale", "",
             "Each paper's headline claims that a model of this size can test, against the shipped checkpoints "
             "(validation loss: the trainer's fixed split, story / math, nats per token). \"Holds here\" follows "
             "the rule in the last column, under the paper's conditions where we could meet them (the third "
             "column; where we could not, the rule says so); a claim that holds at the papers' scale may not at "
             "ours, and the other way round. Two dense runs are experiments, not shipped (their training.json is "
             f"kept): the GPT-2-style comparison for MoEP (`{DENSE_RUN}`: `pgpt --set n_paths=1 --set n_layers=3`, "
             f"1000 steps like moep) and llama-dense at the compositions' tokens (`{EQUAL_TOKEN_RUN}`: 600 steps, "
             "no dropout). Written by `scripts/findings_table.py` (numbers in `findings.json`).", "",
             "| paper | claim (source) | the paper's conditions | ours | holds here | rule, caveats |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {' | '.join(f.cells())} |" for f in rows(m)]
    return "\n".join(lines + ["", END]) + "\n"


# --- the experiment notes' tables, rendered from the same records ---------------------------------

def _p(x: float | None) -> str:
    return "" if x is None else f"{x:.1%}"


def render_gumbel_runs(rec: dict[str, Any]) -> str:
    """The runs table of experiments/gumbel-routing.md."""
    head = ("| run | recipe | steps | tokens | route supervision | val story | val math | T6 last: r1 / r2 / comb "
            "| T6 last acc | T6 maj: comb / acc | held-out last: comb / acc | held-out maj: comb / acc | min |")
    lines = [head, "|" + "---|" * 13]
    for g in rec["gumbel_runs"]:
        t6, t6m, hl, hm = g["table6_last"], g["table6_majority"], g["heldout_last"], g["heldout_majority"]
        lines.append(f"| {g['run']} | `{g['recipe']}` | {g['steps']} | {g['tokens'] / 1e6:.2f}M "
                     f"| {'yes' if g['route_supervision'] else 'no'} | {g['val']['story']:.3f} | {g['val']['math']:.3f} "
                     f"| {_p(t6['route 1'])} / {_p(t6['route 2'])} / {_p(t6['combined'])} | {_p(t6['accuracy'])} "
                     f"| {_p(t6m['combined'])} / {_p(t6m['accuracy'])} | {_p(hl['combined'])} / {_p(hl['accuracy'])} "
                     f"| {_p(hm['combined'])} / {_p(hm['accuracy'])} | {g['minutes']:.1f} |")
    return "\n".join(lines) + "\n"


QUALITY_RUNS = ("pgpt", "moep", "moep-swiglu", "wiola-tiny", "papaformer-share-linear", "papaformer-gumbel-v1",
                "papaformer-gumbel-v2")


def render_quality(rec: dict[str, Any]) -> str:
    """The shipped parallel models against both llama-dense runs (experiments/parallel-quality.md)."""
    r = rec["runs"]
    base, equal = r["llama-dense"], r[EQUAL_TOKEN_RUN_NAME]
    lines = [f"| checkpoint | steps | tokens | story | math | vs llama-dense (shipped: {base['steps']} steps, "
             f"{base['tokens'] / 1e6:.2f}M tokens, dropout 0.1) | vs {EQUAL_TOKEN_RUN_NAME} ({equal['steps']} steps, "
             f"{equal['tokens'] / 1e6:.2f}M tokens, no dropout) |", "|---|---|---|---|---|---|---|"]
    for name in QUALITY_RUNS:
        s = r[name]
        ratio = s["tokens"] / equal["tokens"]
        note = "" if abs(ratio - 1) <= TOKEN_GAP else f" ({ratio:.2f}x its tokens)"
        lines.append(f"| {name} | {s['steps']} | {s['tokens'] / 1e6:.2f}M | {s['val']['story']:.3f} "
                     f"| {s['val']['math']:.3f} | {_gap(s['val'], base['val'])} ({s['tokens'] / base['tokens']:.2f}x its "
                     f"tokens) | {_gap(s['val'], equal['val'])}{note} |")
    return "\n".join(lines) + "\n"


NOTE_BLOCKS = {"experiments/gumbel-routing.md": ("runs", render_gumbel_runs),
               "experiments/parallel-quality.md": ("quality", render_quality)}


# --- files -----------------------------------------------------------------------------------------

def block_of(text: str, start: str = START, end: str = END) -> str | None:
    if start not in text or end not in text:
        return None
    i, j = text.index(start), text.index(end) + len(end)
    return text[i:j] + ("\n" if text[j:j + 1] == "\n" else "")


def with_block(text: str, block: str, start: str = START, end: str = END) -> str:
    old = block_of(text, start, end)
    return text.replace(old, block) if old else text.rstrip("\n") + "\n\n" + block


def note_block(tag: str, body: str) -> tuple[str, str, str]:
    start, end = f"<!-- {tag}:start -->", f"<!-- {tag}:end -->"
    return start, end, f"{start}\n\n{body}\n{end}\n"


def stale(root: Path = ROOT) -> list[str]:
    """What --check finds wrong: findings.json's records differ from the files, the README block
    is not what findings.json renders, a note's table is not what the records render, or a row
    compares runs of unequal tokens without saying so."""
    problems = []
    m, rec = json.loads((root / FINDINGS).read_text()), records(root)
    if {k: m.get(k) for k in rec} != json.loads(json.dumps(rec)):
        problems.append(f"{root / FINDINGS}: its training records differ from the files; run scripts/findings_table.py")
    readme = root / "README.md"
    if block_of(readme.read_text() if readme.is_file() else "") != render(m):
        problems.append(f"{readme}: the findings table is stale; run scripts/findings_table.py")
    for note, (tag, draw) in NOTE_BLOCKS.items():
        start, end, block = note_block(tag, draw(rec))
        if block_of((root / note).read_text(), start, end) != block:
            problems.append(f"{root / note}: the {tag} table is stale; run scripts/findings_table.py")
    problems += [f"findings row states no token counts for runs of unequal tokens: {c[:80]}"
                 for c in unstated_token_gaps(rows(m), m)]
    return problems


def main(argv: list[str] | None = None, root: Path = ROOT) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--check" in argv:
        problems = stale(root)
        sys.stderr.write("".join(p + "\n" for p in problems))
        return 1 if problems else 0
    m = measure(root)
    (root / FINDINGS).write_text(json.dumps(m, indent=1, sort_keys=True) + "\n")
    write_blocks(root, m)
    sys.stdout.write(render(m))
    return 0


def write_blocks(root: Path, m: dict[str, Any]) -> None:
    """The README block from m, the notes' tables from the records."""
    readme = root / "README.md"
    readme.write_text(with_block(readme.read_text() if readme.is_file() else "", render(m)))
    rec = records(root)
    for note, (tag, draw) in NOTE_BLOCKS.items():
        start, end, block = note_block(tag, draw(rec))
        (root / note).write_text(with_block((root / note).read_text(), block, start, end))


if __name__ == "__main__":
    sys.exit(main())
