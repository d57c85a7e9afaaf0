"""The corpus view as one offline HTML page, drawn by the drawer table (no Streamlit here): the
app's download and `routescope corpus` / `routescope report` write the same page."""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import pandas as pd

from routescope.analysis.corpus.page import render_page
from routescope.analysis.export.html_safe import text
from routescope.analysis.corpus.run import CorpusResult, corpus_views, provenance
from routescope.analysis.runs.views import RunViews

from routescope.rendering.corpus_figures import many_options, top_transitions
from routescope.rendering.drawers import DrawContext, draw
from routescope.analysis.reports.report import report_tables
from routescope.rendering.report_sections import extra_sections

EMBED_ROWS = 10_000  # rows of one table the page embeds as JSON; the CSV / Parquet files hold every row


def embedded(tables: Mapping[str, pd.DataFrame]) -> tuple[dict[str, pd.DataFrame], list[str]]:
    """The tables a page embeds, and a note for each it shortens: with many options the co-routing
    table is its top transitions (128 x 128 options a pair of layers would be tens of MB of JSON) and
    other tables leave out their rows that count no token; any table is cut to EMBED_ROWS rows."""
    out, notes = {}, []
    for name, df in tables.items():
        if name == "co_routing" and many_options(df, "option_a"):
            short = top_transitions(df)
            notes.append(f"The page embeds the co-routing table's {len(short):,} most frequent transitions of "
                         f"{len(df):,} rows; co_routing.csv / .parquet have every one.")
            df = short
        elif "option" in df.columns and "count" in df.columns and many_options(df) and (df["count"] == 0).any():
            notes.append(f"The page embeds the {name} table's rows that count a token ({(df['count'] > 0).sum():,} of "
                         f"{len(df):,}); its CSV / Parquet file has the zeros too.")
            df = df[df["count"] > 0]
        if len(df) > EMBED_ROWS:
            notes.append(f"The page embeds the first {EMBED_ROWS:,} of the {name} table's {len(df):,} rows; its "
                         "CSV / Parquet file has every one.")
            df = df.head(EMBED_ROWS)
        out[name] = df
    return out, notes


def draw_views(views: RunViews, labels: Mapping[str, list[str]]) -> dict[str, dict[str, Any]]:
    """Each view's pieces (figures, tables) by view name, in order."""
    ctx = DrawContext([], None, labels)
    return {name: draw({name: view}, ctx) for name, view in views.items()}


def page(result: CorpusResult, tables: Mapping[str, pd.DataFrame], labels: Mapping[str, list[str]], *,
         other: CorpusResult | None = None, compared: Mapping[str, pd.DataFrame] | None = None,
         why_not: str | None = None, extra: Sequence[tuple[str, str, str]] = (), title: str | None = None,
         all_tables: Mapping[str, pd.DataFrame] | None = None) -> str:
    """The page of one model's statistics over a dataset, with the comparison to `other` (its
    tables `compared`, or `why_not` when the two cannot be compared) and `extra` sections (id,
    heading, HTML); `all_tables`: what the page embeds as JSON (default: every table it shows)."""
    names = (result.model, other.model if other is not None else "")
    views = corpus_views(tables, compared, names)
    esc = text  # model, dataset and family names come from files
    intro = (f"<p>{esc(result.description)}</p><p>Dataset <b>{esc(result.dataset)}</b>: {result.stats.n_rows:,} rows, "
             f"{result.stats.n_tokens:,} tokens (at most the first {result.max_tokens} "
             f"tokens of each row; padding never counted).</p>")
    intro += ("<p>Routed without an ablation.</p>" if result.ablation.is_empty else
              f"<p>Routed under the ablation <b>{esc(result.ablation.summary())}</b>: every row ran with these "
              "options switched off (the embedded provenance lists every one).</p>")
    if other is not None:
        intro += (f"<p>Compared with <b>{esc(other.model)}</b> on the same rows: " +
                  (esc(f"not comparable: {why_not}") if why_not else "its tables are below, beside this model's, "
                   "each column named by its model, as in the CSV and Parquet files (the embedded JSON names "
                   "them _a: " + esc(result.model) + ", _b: " + esc(other.model) + ")") + "</p>")
    meta = {"a": provenance(result), **({"b": provenance(other)} if other is not None else {})}
    if all_tables is None:
        all_tables = {**tables, **{f"compare_{k}": v for k, v in (compared or {}).items()}}
    all_tables, shortened = embedded(all_tables)
    under = "" if result.ablation.is_empty else f" under {result.ablation.summary(1)}"
    both = result.model + (f" and {other.model}" if other is not None and not why_not else "")
    return render_page(title=title or f"RouteScope corpus routing: {both} on {result.dataset}{under}", intro=intro,
                       pieces=draw_views(views, labels), tables=all_tables, notes=[*result.notes, *shortened],
                       extra=extra, meta=meta)



def report_page(data: Any) -> str:
    """The page of `routescope report` (`analysis.reports.report.ReportData`): the corpus view over the
    validation split, then the report's own sections (probe accuracy, dropped options)."""
    return page(data.corpus, data.tables, data.labels, extra=extra_sections(data),
                title=f"RouteScope routing report: {data.name}", all_tables=report_tables(data))
