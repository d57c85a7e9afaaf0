"""The figures of an expert-importance sweep (`analysis.reports.importance`), plotly only, so the CLI's
offline page and the app's Experts view draw the same ones (`importance_report` puts them together).

Every effect is drawn in the house diverging scale (`style.HIGH_IS_BLUE`, white at 0, symmetric):
blue where dropping the expert raises the loss (it helps on this data), red where it lowers it. An
effect is the exact `delta_nll` where the sweep measured it, else its first-order estimate
(`delta_nll_estimate`, where the sweep made one); hover says which.

- heatmap: layer x expert, experts in id order (an id is a column);
- effects: one layer at a time (a dropdown picks it), a dot per expert with its 95% bootstrap interval
  as whiskers, over the layer's random-expert control band; sorted or in id order, the axis names
  each dot's expert;
- estimate: the first-order estimate against the exact value, one colour per layer, with each
  layer's Spearman rho;
- pruning: loss against experts removed per layer, judged on the held-out rows (the in-sample curve
  only when asked for, labelled optimistic), merging beside pruning.
Tables from an older sweep (no estimate, no `evaluated_on`, no merge curve) draw what they hold.
"""
from __future__ import annotations

import math
from typing import Mapping

import numpy as np
import pandas as pd
import plotly.colors as pc
import plotly.express as px
import plotly.graph_objects as go

from routescope.analysis.reports.importance import outside_control
from routescope.analysis.reports.importance.holdout import HELDOUT, IN_SAMPLE, IN_SAMPLE_LABEL
from routescope.analysis.reports.importance.methods import AGREEMENT_LOW as LOW_SPEARMAN
from routescope.rendering.style import HIGH_IS_BLUE, HIGHLIGHT, NEUTRAL

EFFECT_SCALE = pc.get_colorscale(HIGH_IS_BLUE)  # [[position, colour]]: red at 0 (effect -bound), blue at 1
EXACT, ESTIMATE = "delta_nll", "delta_nll_estimate"
MANY_TICKS = 64  # past it, the expert ticks get a smaller font
# one colour per ranking, the same held-out (solid) and in-sample (dashed); the merge line its own
RANKING_COLOURS = {"causal": "#636EFA", "usage": "#EF553B", "random": "#00CC96", "merge": "#AB63FA"}


def expert_id(label: str) -> str:
    """What the axis writes for an expert: its id ("expert 12" -> "12"); other options keep their label."""
    return label.removeprefix("expert ")


def flagged(tables: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """The importance table with `outside_control` (its interval outside its layer's control interval),
    `effect` (exact where measured, else the estimate) and `exact` (whether it was measured)."""
    imp = tables["importance"].copy()
    ctl = tables.get("control_summary")
    imp["outside_control"] = outside_control(imp, ctl) if ctl is not None and len(ctl) else False
    exact = imp[EXACT] if EXACT in imp else pd.Series(np.nan, index=imp.index)
    imp["exact"] = exact.notna()
    imp["effect"] = exact.where(imp["exact"], imp[ESTIMATE] if ESTIMATE in imp else np.nan)
    return imp


def bound(values) -> float:
    """Half-width of the colour scale: the largest finite |value| (1 where there is none)."""
    v = np.abs(np.asarray(values, dtype=float))
    v = v[np.isfinite(v)]
    return float(v.max()) if len(v) and v.max() > 0 else 1.0


_STOPS = np.array([float(p) for p, _ in EFFECT_SCALE])
_RGB = np.array([pc.unlabel_rgb(pc.convert_colors_to_same_type(c, "rgb")[0][0]) for _, c in EFFECT_SCALE], float)


def effect_colours(values, half_width: float) -> list[str]:
    """Each value's colour on EFFECT_SCALE over [-half_width, half_width] (NaN: the neutral grey)."""
    v = np.asarray(values, dtype=float)
    t = 0.5 + 0.5 * np.clip(v / half_width, -1.0, 1.0)
    rgb = np.stack([np.interp(t, _STOPS, _RGB[:, k]) for k in range(3)], axis=-1) if len(v) else np.zeros((0, 3))
    return [f"rgb({r:.0f},{g:.0f},{b:.0f})" if math.isfinite(x) else NEUTRAL for x, (r, g, b) in zip(v, rgb)]


def _hover(r) -> str:
    what = (f"ΔNLL {r.effect:.4g} [{r.delta_nll_low:.4g}, {r.delta_nll_high:.4g}] (exact)" if r.exact else
            f"ΔNLL ≈ {r.effect:.4g} (first-order estimate, not measured exactly)" if math.isfinite(r.effect) else
            "not measured")
    extra = f"<br>KL {r.kl:.3g} · flips {r.flip_rate:.3g}" if r.exact and hasattr(r, "kl") else ""
    use = f" · usage {r.usage:.3g}" if hasattr(r, "usage") and math.isfinite(r.usage) else ""
    return f"{r.label}<br>{what}{extra}{use}"


def heatmap(tables: Mapping[str, pd.DataFrame]) -> go.Figure:
    """Layer x expert (id order) of each effect; ★ where its interval lies outside the control's."""
    imp = flagged(tables)
    layers = list(dict.fromkeys(imp["layer"]))
    half = bound(imp["effect"])
    z = imp.pivot(index="layer", columns="option", values="effect").reindex(layers)
    text = imp.assign(t=np.where(imp["outside_control"], "★", "")).pivot(index="layer", columns="option",
                                                                         values="t").reindex(layers)
    hover = imp.assign(h=[_hover(r) for r in imp.itertuples()]).pivot(index="layer", columns="option",
                                                                       values="h").reindex(layers)
    fig = go.Figure(go.Heatmap(z=z.to_numpy(), x=list(z.columns), y=layers, text=text.fillna("").to_numpy(),
                               texttemplate="%{text}", customdata=hover.fillna("").to_numpy(),
                               hovertemplate="%{y}<br>%{customdata}<extra></extra>", colorscale=EFFECT_SCALE,
                               zmin=-half, zmax=half, zmid=0,
                               colorbar=dict(title="ΔNLL", thickness=14)))
    fig.update_layout(xaxis_title="expert", yaxis=dict(autorange="reversed"), plot_bgcolor="white",
                      height=max(260, 28 * len(layers) + 140), margin=dict(l=10, r=10, t=30, b=40))
    return fig


def layer_order(g: pd.DataFrame, sort: bool) -> pd.DataFrame:
    """One layer's rows as the effects chart puts them: by effect, largest first (ties and unmeasured
    last, by id), or by id."""
    if not sort:
        return g.sort_values("option", kind="stable")
    return g.sort_values(["effect", "option"], ascending=[False, True], na_position="last", kind="stable")


TRACES_PER_LAYER = 3  # control band, exact dots with whiskers, estimate-only dots


def effects(tables: Mapping[str, pd.DataFrame], sort: bool = False) -> go.Figure:
    """A dot per expert of one layer (a dropdown picks the layer), with its interval as whiskers, over
    the layer's random-expert control band (95% of its draws); x ticks are the experts' ids in the
    order drawn, so a sorted layer still names each dot's expert."""
    imp = flagged(tables)
    half = bound(imp["effect"])
    imp["hover"] = [_hover(r) for r in imp.itertuples()]
    imp["colour"] = effect_colours(imp["effect"], half)
    ctl = tables.get("control_summary")
    band = {r.layer: (float(r.control_low), float(r.control_high)) for r in ctl.itertuples()} \
        if ctl is not None and len(ctl) else {}
    layers = list(dict.fromkeys(imp["layer"]))
    traces, axes = [], []
    for j, (layer, g) in enumerate(imp.groupby("layer", sort=False)):
        g = layer_order(g, sort).reset_index(drop=True)
        n = len(g)
        axes.append({"xaxis.tickvals": list(range(n)), "xaxis.ticktext": [expert_id(s) for s in g["label"]],
                     "xaxis.range": [-0.5, n - 0.5], "xaxis.tickangle": -90 if n > 16 else 0,
                     "xaxis.tickfont.size": 9 if n > MANY_TICKS else 12})
        lo, hi = band.get(layer, (None, None))
        traces.append(go.Scatter(x=[-0.5, n - 0.5, n - 0.5, -0.5] if lo is not None else [],
                                 y=[lo, lo, hi, hi] if lo is not None else [], fill="toself", mode="lines",
                                 line=dict(width=0), fillcolor="rgba(120,120,120,0.18)",
                                 name="random-expert control (95% of draws)", hoverinfo="skip",
                                 legendgroup="control", showlegend=j == 0 and lo is not None, visible=j == 0))
        ex, est = g[g["exact"]], g[~g["exact"] & g["effect"].notna()]
        traces.append(go.Scatter(
            x=list(ex.index), y=ex["effect"], mode="markers", name="dropped alone (95% interval)",
            legendgroup="exact", showlegend=j == 0, visible=j == 0,
            marker=dict(color=list(ex["colour"]), size=8, line=dict(width=1, color=HIGHLIGHT)),
            error_y=dict(type="data", symmetric=False, array=(ex["delta_nll_high"] - ex["effect"]).tolist(),
                         arrayminus=(ex["effect"] - ex["delta_nll_low"]).tolist(), color=HIGHLIGHT, thickness=1,
                         width=2),
            customdata=list(ex["hover"]), hovertemplate="%{customdata}<extra></extra>"))
        traces.append(go.Scatter(
            x=list(est.index), y=est["effect"], mode="markers", name="first-order estimate (no interval)",
            legendgroup="estimate", showlegend=j == 0, visible=j == 0,
            marker=dict(color=list(est["colour"]), size=8, symbol="diamond", line=dict(width=1, color=HIGHLIGHT)),
            customdata=list(est["hover"]), hovertemplate="%{customdata}<extra></extra>"))
    fig = go.Figure(traces)
    fig.add_hline(y=0, line=dict(color="#888", width=1))
    if axes:
        fig.update_xaxes(tickvals=axes[0]["xaxis.tickvals"], ticktext=axes[0]["xaxis.ticktext"],
                         range=axes[0]["xaxis.range"], tickangle=axes[0]["xaxis.tickangle"],
                         tickfont=dict(size=axes[0]["xaxis.tickfont.size"]))
    if len(layers) > 1:
        k = TRACES_PER_LAYER * len(layers)
        buttons = [dict(label=layer, method="update",
                        args=[{"visible": [i // TRACES_PER_LAYER == j for i in range(k)]}, axes[j]])
                   for j, layer in enumerate(layers)]
        fig.update_layout(updatemenus=[dict(buttons=buttons, direction="down", x=1, xanchor="right", y=1,
                                            yanchor="bottom", showactive=True, active=0, pad=dict(t=0, b=28),
                                            bgcolor="white", font=dict(size=12, color=HIGHLIGHT))])
    fig.update_layout(xaxis_title="expert, most important first" if sort else "expert", yaxis_title="ΔNLL",
                      plot_bgcolor="white", height=420, margin=dict(l=10, r=10, t=60, b=60),
                      legend=dict(orientation="h", y=1.02, yanchor="bottom", x=0))
    return fig


def agreement(tables: Mapping[str, pd.DataFrame]) -> pd.DataFrame | None:
    """The estimate_agreement table (None where the sweep made no estimate)."""
    t = tables.get("estimate_agreement")
    return t if t is not None and len(t) else None


def low_agreement(tables: Mapping[str, pd.DataFrame], notes=()) -> list[str]:
    """One line per layer whose estimate ranks its experts at Spearman under LOW_SPEARMAN against the
    exact values, suggesting the exact sweep there: the sweep's own note on that layer (in `notes`,
    starting with the layer's name, or the table's `notes` column) where it made one."""
    t = agreement(tables)
    if t is None:
        return []
    out = []
    for r in t.itertuples():
        if not (math.isfinite(r.spearman) and r.spearman < LOW_SPEARMAN):
            continue
        own = [n for n in notes if n.startswith(f"{r.layer}:")]
        note = getattr(r, "notes", None)
        out.append(own[0] if own else note if isinstance(note, str) and note else
                   f"{r.layer}: the estimate ranks experts at Spearman ρ {r.spearman:.2f} against the exact values "
                   f"(under {LOW_SPEARMAN}): measure this layer with --method exact.")
    return out


def estimate_scatter(tables: Mapping[str, pd.DataFrame]) -> go.Figure | None:
    """Estimate (x) against exact (y) over the experts measured both ways, one colour per layer named
    with its Spearman rho; the diagonal is agreement. None where no expert was measured both ways."""
    imp = tables["importance"]
    if ESTIMATE not in imp or EXACT not in imp:
        return None
    both = imp[imp[ESTIMATE].notna() & imp[EXACT].notna()]
    if not len(both):
        return None
    t = agreement(tables)
    rho = dict(zip(t["layer"], t["spearman"])) if t is not None else {}
    colors = px.colors.qualitative.Plotly
    fig = go.Figure()
    for j, (layer, g) in enumerate(both.groupby("layer", sort=False)):
        r = rho.get(layer, float("nan"))
        r_text = f"ρ {r:.2f}" if math.isfinite(r) else "ρ n/a"
        fig.add_trace(go.Scatter(x=g[ESTIMATE], y=g[EXACT], mode="markers", name=f"{layer} ({r_text})",
                                 marker=dict(color=colors[j % len(colors)], size=7), text=g["label"],
                                 hovertemplate=f"{layer}<br>%{{text}}<br>estimate %{{x:.4g}}<br>exact %{{y:.4g}}"
                                               f"<br>Spearman {r_text}<extra></extra>"))
    lo = float(min(both[ESTIMATE].min(), both[EXACT].min()))
    hi = float(max(both[ESTIMATE].max(), both[EXACT].max()))
    fig.add_trace(go.Scatter(x=[lo, hi], y=[lo, hi], mode="lines", line=dict(color="#888", dash="dot", width=1),
                             name="estimate = exact", hoverinfo="skip"))
    fig.update_layout(xaxis_title="first-order estimate of ΔNLL", yaxis_title="exact ΔNLL", plot_bgcolor="white",
                      height=420, margin=dict(l=10, r=10, t=30, b=40))
    return fig


def curves(tables: Mapping[str, pd.DataFrame], in_sample: bool = False) -> pd.DataFrame | None:
    """The pruning curve's rows drawn: the held-out ones, and the in-sample ones when asked for (a
    table without `evaluated_on` was judged on the rows that ranked the experts: in-sample)."""
    c = tables.get("pruning_curve")
    if c is None or not len(c):
        return None
    if "evaluated_on" not in c:
        c = c.assign(evaluated_on=IN_SAMPLE)
    has_heldout = (c["evaluated_on"] == HELDOUT).any()
    keep = (c["evaluated_on"] == HELDOUT) | ((c["evaluated_on"] == IN_SAMPLE) & (in_sample or not has_heldout))
    return c[keep]


def pruning(tables: Mapping[str, pd.DataFrame], in_sample: bool = False) -> go.Figure | None:
    """Loss against experts removed per layer: one line per ranking (the random ranking with its band
    over draws), held-out solid, in-sample dashed and named optimistic; the merge line (each removed
    expert merged into its most similar kept one) beside the causal pruning line."""
    c = curves(tables, in_sample)
    merge = tables.get("merge_curve")
    merge = merge if merge is not None and len(merge) else None
    if c is None and merge is None:
        return None
    fig = go.Figure()
    for (part, ranking), g in (c.groupby(["evaluated_on", "ranking"], sort=False) if c is not None else []):
        suffix = "" if part == HELDOUT else f", {IN_SAMPLE_LABEL}"
        dash = "solid" if part == HELDOUT else "dash"
        colour = RANKING_COLOURS.get(ranking, NEUTRAL)
        if ranking == "random" and (g["draws"] > 1).any():
            fig.add_trace(go.Scatter(x=list(g["n_pruned"]) + list(g["n_pruned"])[::-1],
                                     y=list(g["loss_high"]) + list(g["loss_low"])[::-1], fill="toself",
                                     line=dict(width=0), fillcolor=colour, opacity=0.15 if suffix else 0.25,
                                     name=f"random (95% of draws){suffix}", hoverinfo="skip"))
        fig.add_trace(go.Scatter(x=g["n_pruned"], y=g["loss"], mode="lines+markers", line=dict(dash=dash, color=colour),
                                 name=f"pruned, by {ranking}{suffix}"))
    if merge is not None:
        held_causal = c is not None and ((c["evaluated_on"] == HELDOUT) & (c["ranking"] == "causal")).any()
        for strategy, g in merge.groupby("strategy", sort=False):
            if strategy == "prune" and held_causal:
                continue  # the same experts dropped on the same rows as the causal pruning line
            fig.add_trace(go.Scatter(x=g["n_removed"], y=g["loss"], mode="lines+markers",
                                     line=dict(dash="dot" if strategy == "merge" else "solid", width=3,
                                               color=RANKING_COLOURS["merge" if strategy == "merge" else "causal"]),
                                     customdata=g["merged"] if "merged" in g else None,
                                     name="merged into the most similar kept expert" if strategy == "merge" else
                                     "pruned, by causal (merge run)",
                                     hovertemplate="%{x} removed: loss %{y:.4f}<extra>%{fullData.name}</extra>"))
    heldout = c is not None and (c["evaluated_on"] == HELDOUT).any() or merge is not None
    fig.update_layout(xaxis_title="experts removed per layer",
                      yaxis_title="held-out loss (mean NLL)" if heldout else "loss on the ranking rows (mean NLL)",
                      height=380, margin=dict(l=10, r=10, t=30, b=40), plot_bgcolor="white")
    return fig


def pruning_caption(tables: Mapping[str, pd.DataFrame], in_sample: bool = False) -> str:
    """One line saying what the pruning figure was judged on (rows), or why there is none."""
    c = tables.get("pruning_curve")
    merge = tables.get("merge_curve")
    if (c is None or not len(c)) and (merge is None or not len(merge)):
        return "No pruning curve in this sweep."
    parts = []
    if c is not None and len(c):
        if "evaluated_on" not in c:
            parts.append(f"judged on the rows that ranked the experts: {IN_SAMPLE_LABEL}")
        else:
            held = c[c["evaluated_on"] == HELDOUT]
            if len(held):
                rows = f"{int(held['rows'].iloc[0]):,} " if "rows" in held else ""
                parts.append(f"judged on {rows}held-out rows that did not rank the experts")
            else:
                parts.append(f"no held-out rows: {IN_SAMPLE_LABEL}")
            if in_sample and (c["evaluated_on"] == IN_SAMPLE).any() and len(held):
                parts.append(f"dashed: {IN_SAMPLE_LABEL}, judged on the ranking rows")
    if merge is None or not len(merge):
        parts.append("no merge curve in this sweep")
    return "Pruning " + "; ".join(parts) + "."
