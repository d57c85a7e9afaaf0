"""Routing report of a checkpoint with per-token routes (PaPaformer, MoEP): one self-contained HTML
page (plotly.js embedded).

Sections, each built from the analyses it names:
1. Route shares by domain: per routing layer, the share of validation tokens of each domain that
   take each route (`RouteReader`: PaPaformer: `domain.token_routes`, the Gumbel router's choice or
   Share-Linear's highest-cosine path, tokens whose route is undefined left out; MoEP: the top-k
   router's first choice, its recorded top-k indices being best first).
2. Routing accuracy (PaPaformer): the Table 6 probes against the paper's routes and the held-out
   probes (`domain.probe_routes`, `route_summary`, `paper_routes`), at the last prompt token and by
   majority over the prompt's tokens. MoEP's paper prints no expected routes: the section says so.
3. Route-selective tokens: per layer, the token ids (seen at least `min_count` times in the
   validation text) whose route distribution is furthest, in total variation, from the layer's
   distribution over all tokens: TV = 1/2 sum_r |p_token(r) - p_layer(r)|, 0 = routed like any
   token, 1 = routes the layer never uses otherwise.
4. Dropping each option: validation loss per domain with option j dropped in every routing layer
   (`Ablation(drop=(("*", j),))`: path j not run, or the combined representation forbidden; MoEP:
   expert j of moe_shrink / moe_grow and block j of every parallel layer never selected)
   beside the unablated loss, and the mean KL(base || dropped) of the next-token distributions
   (`effects.ablation_effects`).

The validation text is the trainer's (`trainer.validation_batches`: the first `n_docs` documents
of each domain's fixed validation split, packed into rows of seq_len + 1 tokens), so with the
trainer's settings (100 documents, seq_len 256) the unablated loss is the one in training.json.
`collect` runs the model; every other function is pure.
"""
from __future__ import annotations

import html
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from routescope.core_models.runtime import Ablation, tracing

from . import columns as C
from . import domain as D
from .effects import ablation_effects
from .families import RouteReader, route_labels, route_reader  # noqa: F401  (route_labels: the report's names)

HELDOUT_PROBES = Path(__file__).parent / "data" / "heldout_probes.tsv"
PROBE_SETS = {"Table 6": D.DEFAULT_PROBES, "held-out": HELDOUT_PROBES}
ROUTE_AT = {"last": False, "majority": True}  # route_at label -> domain.probe_routes(majority=...)
PAPER_READING = "paper's routes"

# report-specific columns
LOSS, BASE_LOSS, DELTA, MEAN_KL = "loss", "base_loss", "delta", "mean_kl"
SELECTIVITY, TOP_ROUTE, TOP_SHARE = "selectivity", "top_route", "top_share"
PROBE_SET, ROUTE_AT_COL, DROPPED = "probe_set", "route_at", "dropped"


@dataclass
class ReportData:
    """Everything the page shows, as tables (the HTML also embeds them as JSON)."""

    name: str
    config: dict[str, Any]
    settings: dict[str, Any]
    shares: pd.DataFrame  # domain, layer, route, label, count, share
    accuracy: pd.DataFrame  # probe_set, route_at, source, metric, value (empty: no paper routes to compare)
    probe_tables: dict[str, pd.DataFrame] = field(default_factory=dict)  # "Table 6, last" -> domain.table6
    selective: pd.DataFrame = field(default_factory=pd.DataFrame)  # layer, token_id, token, count, ...
    drops: pd.DataFrame = field(default_factory=pd.DataFrame)  # dropped, label, domain, loss, base_loss, ...


# --- pure parts ------------------------------------------------------------------------------------

def route_shares(routes: dict[str, np.ndarray], labels: Sequence[str], layers: Sequence[str]) -> pd.DataFrame:
    """routes: domain -> (L, N, T) 1-based routes of every validation token (0 = undefined) in
    `layers`. Per domain, layer and route: tokens taking it and their share of the layer's defined
    routes (NaN when a layer has none)."""
    rows = []
    for dom, r in routes.items():
        for i in range(r.shape[0]):
            counts = np.bincount(r[i].ravel(), minlength=len(labels) + 1)[1:len(labels) + 1]
            n = counts.sum()
            rows += [(dom, layers[i], k + 1, labels[k], int(counts[k]), counts[k] / n if n else math.nan)
                     for k in range(len(labels))]
    return pd.DataFrame(rows, columns=[C.DOMAIN, C.LAYER, C.ROUTE, C.LABEL, C.COUNT, C.SHARE])


def selective_tokens(routes: np.ndarray, ids: np.ndarray, labels: Sequence[str], layers: Sequence[str], *,
                     min_count: int = 5, top: int = 10) -> pd.DataFrame:
    """routes (L, N, T) 1-based (0 = undefined), ids (N, T) token ids. Per layer, the `top` token
    ids seen at least `min_count` times (defined routes) whose route distribution is furthest in
    total variation from the layer's over all tokens; ties by count, then token id. Columns: layer,
    token_id, count, top_route (label of the token's most frequent route), top_share, selectivity."""
    n = len(labels)
    frames = []
    for i in range(routes.shape[0]):
        r, t = routes[i].ravel(), ids.ravel()
        keep = r > 0
        r, t = r[keep] - 1, t[keep]
        if not len(r):
            continue
        layer_p = np.bincount(r, minlength=n) / len(r)  # (n,)
        uniq, inv = np.unique(t, return_inverse=True)
        counts = np.zeros((len(uniq), n))
        np.add.at(counts, (inv, r), 1)
        total = counts.sum(1)
        p = counts / total[:, None]
        tv = 0.5 * np.abs(p - layer_p).sum(1)
        df = pd.DataFrame({C.LAYER: layers[i], C.TOKEN_ID: uniq.astype(np.int64), C.COUNT: total.astype(np.int64),
                           TOP_ROUTE: np.array(labels)[p.argmax(1)], TOP_SHARE: p.max(1), SELECTIVITY: tv})
        df = df[df[C.COUNT] >= min_count].sort_values([SELECTIVITY, C.COUNT, C.TOKEN_ID],
                                                      ascending=[False, False, True], kind="stable")
        frames.append(df.head(top))
    cols = [C.LAYER, C.TOKEN_ID, C.COUNT, TOP_ROUTE, TOP_SHARE, SELECTIVITY]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=cols)


def accuracy_table(config: Any, *, probe_set: str, route_at: str, ours: pd.DataFrame | None = None,
                   paper: pd.DataFrame | None = None) -> pd.DataFrame:
    """`domain.table6_summary` of our routes or the paper's, with the probe set and the reading
    (last / majority / the paper's routes) as columns."""
    df = D.table6_summary(config, ours=ours, paper=paper)
    df.insert(0, ROUTE_AT_COL, route_at)
    df.insert(0, PROBE_SET, probe_set)
    return df


# --- running the model -------------------------------------------------------------------------------

def validation_rows(tokenizer: Any, n_docs: int, seq_len: int) -> dict[str, torch.Tensor]:
    """Domain -> (rows, seq_len + 1) token ids of the trainer's validation text."""
    from routescope.corpora import corpus
    from routescope.core_models.training.trainer import TrainConfig, validation_batches

    c = TrainConfig(preset="report", seq_len=seq_len, eval_docs=n_docs)
    return {d: validation_batches(tokenizer, d, c) for d in corpus.DOMAINS}


def _device(model: Any) -> torch.device:
    return next(model.parameters()).device


@torch.inference_mode()
def token_routes_of(model: Any, rows: torch.Tensor, batch_size: int = 16,
                    reader: RouteReader | None = None) -> np.ndarray:
    """(L, N, T) 1-based routes of every input token of `rows` (N, T + 1) (deterministic routing)."""
    reader = reader or route_reader(model)
    out, rows = [], rows.to(_device(model))
    for k in range(0, len(rows), batch_size):
        with tracing(reader.sites) as tr:
            model(rows[k:k + batch_size, :-1])
        out.append(reader.routes(tr))
    return np.concatenate(out, axis=1)


@torch.inference_mode()
def mean_loss(model: Any, rows: torch.Tensor, ablation: Ablation | None = None, batch_size: int = 16) -> float:
    """Mean next-token cross-entropy (nats) of rows (N, T + 1), as the trainer's evaluate computes it."""
    total, count, rows = 0.0, 0, rows.to(_device(model))
    for k in range(0, len(rows), batch_size):
        chunk = rows[k:k + batch_size]
        logits = model(chunk[:, :-1], ablation=ablation).logits
        total += F.cross_entropy(logits.flatten(0, 1).float(), chunk[:, 1:].flatten(), reduction="sum").item()
        count += chunk[:, 1:].numel()
    return total / max(1, count)


def drop_effects(model: Any, rows: dict[str, torch.Tensor], labels: Sequence[str], batch_size: int = 16) -> pd.DataFrame:
    """Per option j (dropped in every routing layer) and domain: validation loss, the unablated
    loss, their difference and the mean KL(base || dropped) over every position."""
    base = {d: mean_loss(model, r, None, batch_size) for d, r in rows.items()}
    out = []
    for j, label in enumerate(labels):
        ab = Ablation(drop=(("*", j),))
        for d, r in rows.items():
            loss = mean_loss(model, r, ab, batch_size)
            kl = np.concatenate([ablation_effects(model, r[k:k + batch_size, :-1].to(_device(model)), ab)[C.KL].to_numpy()
                                 for k in range(0, len(r), batch_size)]).mean()
            out.append((j, label, d, loss, base[d], loss - base[d], float(kl)))
    return pd.DataFrame(out, columns=[DROPPED, C.LABEL, C.DOMAIN, LOSS, BASE_LOSS, DELTA, MEAN_KL])


def collect(model: Any, tokenizer: Any, *, name: str, n_docs: int = 100, seq_len: int = 256, min_count: int = 5,
            top: int = 10, probe_sets: dict[str, Any] | None = None, batch_size: int = 16) -> ReportData:
    """Run every analysis of the report on `model` (a PaPaformer or a MoEP: `route_reader`)."""
    cfg = model.config
    reader = route_reader(model)
    seq_len = min(seq_len, model.context)
    rows = validation_rows(tokenizer, n_docs, seq_len)
    per_domain = {d: token_routes_of(model, r, batch_size, reader) for d, r in rows.items()}
    routes_all = np.concatenate(list(per_domain.values()), axis=1)
    ids_all = np.concatenate([r[:, :-1].numpy() for r in rows.values()])
    sel = selective_tokens(routes_all, ids_all, reader.labels, reader.layers, min_count=min_count, top=top)
    sel.insert(2, C.TOKEN, [tokenizer.decode([int(t)]) for t in sel[C.TOKEN_ID]])
    acc, tables = [], {}
    for set_name, source in ((PROBE_SETS if probe_sets is None else probe_sets).items() if reader.table6 else ()):
        probes = D.read_probes(source)
        paper = D.paper_routes(probes, cfg.combiner)
        for at, majority in ROUTE_AT.items():
            ours = D.probe_routes(model, tokenizer, probes, majority=majority)
            acc.append(accuracy_table(cfg, ours=ours, probe_set=set_name, route_at=at))
            tables[f"{set_name}, {at}"] = D.table6(ours, probes, paper)
        if paper is not None:  # the paper printed one route per layer: no last / majority reading
            acc.append(accuracy_table(cfg, paper=paper, probe_set=set_name, route_at=PAPER_READING))
    accuracy = pd.concat(acc, ignore_index=True) if acc else \
        pd.DataFrame(columns=[PROBE_SET, ROUTE_AT_COL, C.SOURCE, C.METRIC, C.VALUE])
    return ReportData(name=name, config=cfg.to_dict(), settings=dict(n_docs=n_docs, seq_len=seq_len,
                      min_count=min_count, top=top, n_tokens={d: int(r[:, :-1].numel()) for d, r in rows.items()},
                      description=reader.description),
                      shares=route_shares(per_domain, reader.labels, reader.layers), accuracy=accuracy,
                      probe_tables=tables, selective=sel, drops=drop_effects(model, rows, reader.labels, batch_size))


# --- HTML ------------------------------------------------------------------------------------------

def _fmt(v: Any) -> str:
    if isinstance(v, (float, np.floating)):
        return "" if math.isnan(v) else f"{v:.3f}"
    return str(v)


def html_table(df: pd.DataFrame, pct: Sequence[str] = ()) -> str:
    """An escaped HTML table; floats with 3 decimals, `pct` columns as percentages (1 decimal)."""
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in df.columns)
    body = []
    for row in df.itertuples(index=False):
        cells = []
        for c, v in zip(df.columns, row):
            text = (f"{v:.1%}" if isinstance(v, (float, np.floating)) and not math.isnan(v) else "") if c in pct \
                else _fmt(v)
            cells.append(f"<td>{html.escape(text)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def accuracy_wide(acc: pd.DataFrame) -> pd.DataFrame:
    """One row per (probe set, reading, source): the route shares, accuracy and route count."""
    wide = acc.pivot_table(index=[PROBE_SET, ROUTE_AT_COL, C.SOURCE], columns=C.METRIC, values=C.VALUE,
                           sort=False).reset_index()
    wide.columns.name = None
    if "n_routes" in wide:
        wide["n_routes"] = wide["n_routes"].astype("int64")
    return wide


def _figures(data: ReportData) -> list[tuple[str, Any]]:
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    domains = list(dict.fromkeys(data.shares[C.DOMAIN]))
    labels = list(dict.fromkeys(data.shares[C.LABEL]))
    fig1 = make_subplots(rows=1, cols=len(domains), subplot_titles=domains, shared_yaxes=True)
    for k, label in enumerate(labels):
        for c, dom in enumerate(domains, start=1):
            s = data.shares[(data.shares[C.DOMAIN] == dom) & (data.shares[C.LABEL] == label)]
            fig1.add_trace(go.Bar(x=s[C.LAYER], y=s[C.SHARE], name=label, legendgroup=label, showlegend=c == 1,
                                  marker_color=PALETTE[k % len(PALETTE)]), row=1, col=c)
    fig1.update_layout(barmode="stack", height=360, yaxis_tickformat=".0%", title="Route shares of validation tokens")

    figs = [("shares", fig1)]
    if len(data.accuracy):
        wide = accuracy_wide(data.accuracy)
        fig2 = go.Figure()
        for src, g in wide.groupby(C.SOURCE, sort=False):
            fig2.add_trace(go.Bar(x=[f"{p}, {a}" for p, a in zip(g[PROBE_SET], g[ROUTE_AT_COL])], y=g["accuracy"],
                                  name=src))
        fig2.update_layout(barmode="group", height=320, yaxis_tickformat=".0%", yaxis_range=[0, 1],
                           title="Routing accuracy (routes equal to the probe's expected path)")
        figs.append(("accuracy", fig2))

    fig3 = go.Figure()
    for dom, g in data.drops.groupby(C.DOMAIN, sort=False):
        fig3.add_trace(go.Bar(x=[f"drop {l}" for l in g[C.LABEL]], y=g[DELTA], name=dom))
    fig3.update_layout(barmode="group", height=320, title="Validation loss change when an option is dropped (nats)")
    return figs + [("drops", fig3)]


PALETTE = ["#4C78A8", "#F58518", "#54A24B", "#E45756", "#72B7B2", "#B279A2"]
_STYLE = ("body{font-family:sans-serif;max-width:1100px;margin:auto;padding:1em}table{border-collapse:collapse;"
          "margin:.5em 0 1.5em}td,th{border:1px solid #ccc;padding:2px 6px;font-size:13px;text-align:right}"
          "th{background:#f3f3f3}")


def _frames_json(data: ReportData) -> str:
    def records(df: pd.DataFrame) -> list[dict]:
        return json.loads(df.to_json(orient="records", force_ascii=False))

    doc = {"name": data.name, "config": data.config, "settings": data.settings, "shares": records(data.shares),
           "accuracy": records(data.accuracy), "selective": records(data.selective), "drops": records(data.drops),
           "probe_tables": {k: records(v) for k, v in data.probe_tables.items()}}
    # tables go through pandas' to_json (NaN -> null); strict, so config/settings can't slip a bare NaN in
    return json.dumps(doc, ensure_ascii=False, allow_nan=False).replace("</", "<\\/")  # no "</script>" inside


def render_html(data: ReportData) -> str:
    """The report page: headings, plotly figures (plotly.js embedded once, nothing fetched), the
    tables, and the same tables as JSON in <script type="application/json" id="report-data">."""
    figs = _figures(data)
    fig_html = {key: fig.to_html(full_html=False, include_plotlyjs=(i == 0), div_id=f"fig-{key}")
                for i, (key, fig) in enumerate(figs)}
    cfg, st = data.config, data.settings
    esc = html.escape
    shares = data.shares.pivot_table(index=[C.DOMAIN, C.LAYER], columns=C.LABEL, values=C.SHARE, sort=False,
                                     dropna=False).reset_index()
    shares.columns.name = None
    if len(data.accuracy):
        wide = accuracy_wide(data.accuracy)
        pct_cols = [c for c in wide.columns if c not in (PROBE_SET, ROUTE_AT_COL, C.SOURCE, "n_routes")]
        probe_html = "".join(f"<h3>{html.escape(k)}</h3>{html_table(v)}" for k, v in data.probe_tables.items())
        accuracy_html = f"""<p>Accuracy = share of (prompt, layer) routes equal to the prompt's expected path (the
combined route never counts as correct); "paper" = the routes printed in the paper's Table 6 (its models have 2
paths).</p>
{fig_html['accuracy']}
{html_table(wide, pct=pct_cols)}
{probe_html}"""
    else:
        accuracy_html = (f"<p>Not applicable: the {esc(str(cfg.get('family')))} paper prints no expected route per "
                         "probe prompt to compare with (Table 6 routes are PaPaformer's).</p>")
    sel = data.selective.assign(**{C.TOKEN: data.selective[C.TOKEN].map(repr)}) if len(data.selective) else data.selective
    drops = data.drops
    n_tok = ", ".join(f"{d} {n:,}" for d, n in st["n_tokens"].items())
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>RouteScope routing report: {esc(data.name)}</title>
<style>{_STYLE}</style></head><body>
<h1>Routing report: {esc(data.name)}</h1>
<p>{st['description']} Validation text: the first {st['n_docs']} documents of each domain's fixed validation
split in rows of {st['seq_len']} tokens ({esc(n_tok)} tokens).</p>
<h2 id="shares">1. Route shares by domain</h2>
<p>Share of each domain's validation tokens taking each route, per routing layer.</p>
{fig_html['shares']}
{html_table(shares, pct=[c for c in shares.columns if c not in (C.DOMAIN, C.LAYER)])}
<h2 id="accuracy">2. Routing accuracy: Table 6 and held-out probes</h2>
{accuracy_html}
<h2 id="selective">3. Route-selective tokens</h2>
<p>Per layer, the tokens (seen at least {st['min_count']} times) whose routes differ most from the layer's
routes over all tokens: selectivity = total variation distance, 0 = routed like any token, 1 = disjoint.</p>
{html_table(sel, pct=[TOP_SHARE])}
<h2 id="drops">4. Dropping each option</h2>
<p>Validation loss per domain with the option dropped in every routing layer, the unablated loss, the
change, and the mean KL(base || dropped) of the next-token distributions (nats).</p>
{fig_html['drops']}
{html_table(drops)}
<script type="application/json" id="report-data">{_frames_json(data)}</script>
</body></html>
"""
