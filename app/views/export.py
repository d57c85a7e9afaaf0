"""Export: routing table (CSV, Parquet), generation with candidates, Table 6, figures, provenance."""
from __future__ import annotations

import json
import re

import streamlit as st

from analysis.export import frame_csv_bytes
from analysis.session import Run, candidates_table, provenance


def _stem(run: Run) -> str:
    ab = re.sub(r"[^A-Za-z0-9_.-]+", "_", run.ablation.describe())
    return f"{run.model_name}_{'base' if run.ablation.is_empty else ab}"


def show(run: Run, tokenizer, figs: dict, table6: dict | None, table: dict[str, bytes]) -> None:
    stem = _stem(run)
    st.caption("Every export carries the model, prompt, settings and ablation (columns, or the run JSON).")
    cols = st.columns(3)
    cols[0].download_button("Routing table (CSV)", table["csv"], f"{stem}_routing.csv",
                            "text/csv", key="dl_routing_csv")
    cols[1].download_button("Routing table (Parquet)", table["parquet"], f"{stem}_routing.parquet",
                            "application/octet-stream", key="dl_routing_parquet")
    cols[2].download_button("Run settings (JSON)", json.dumps(provenance(run), indent=1, ensure_ascii=False),
                            f"{stem}_run.json", "application/json", key="dl_run_json")
    cand = candidates_table(run, tokenizer)
    for k, v in provenance(run).items():
        cand[k] = v if not isinstance(v, dict) else json.dumps(v)
    cols = st.columns(3)
    cols[0].download_button("Generation with top-k (CSV)", frame_csv_bytes(cand), f"{stem}_generation.csv",
                            "text/csv", key="dl_generation_csv")
    if table6 is not None:
        report = table6["report"].assign(model=run.model_name)
        cols[1].download_button("Table 6 report (CSV)", frame_csv_bytes(report), f"{run.model_name}_table6.csv",
                                "text/csv", key="dl_table6_csv")
        cols[2].download_button("Table 6 summary (CSV)", frame_csv_bytes(table6["summary"].assign(model=run.model_name)),
                                f"{run.model_name}_table6_summary.csv", "text/csv", key="dl_table6_summary")
    if figs:
        st.markdown("**Figures** (HTML here; PNG from the camera icon on each chart)")
        cols = st.columns(3)
        for i, (name, fig) in enumerate(figs.items()):
            fig = fig.update_layout(meta=provenance(run))
            # deferred: the HTML is only rendered when the button is pressed
            cols[i % 3].download_button(f"{name}.html", lambda f=fig: f.to_html(include_plotlyjs="cdn"),
                                        f"{stem}_{name}.html", "text/html", key=f"dl_fig_{name}")
