"""`routescope corpus`: how a checkpoint routes over a whole dataset, as tables (CSV and Parquet)
and the corpus view's offline HTML page, optionally beside a second checkpoint on the same rows.

    routescope corpus CHECKPOINT (--data FILE | --shipped NAME) [--compare CHECKPOINT]
                      [--drop SPEC] [--force LAYER:OPTION] [--mode NAME] --out DIR

Writes into DIR (replaced whole: it may hold only an earlier run's files): `<table>.csv` and
`<table>.parquet` for each table of `analysis.corpus.reductions` (summary, utilisation, label_shares, accuracy,
specialisation, co_routing; call_values for families without per-token routes), with --compare
`compare_<table>.*` (both side by side with their differences), `corpus.html` (the page) and
`corpus.json` (provenance). The files are built in a hidden directory beside DIR and swapped in
whole at the end (`corpus_page.OutputSet`): an interrupted or failed run leaves the earlier set
as it was, a finished one leaves no stale table. DIR, the dataset, the intended options (given, or
the dataset's own expected_path / expected_option) and the two checkpoints' routing layers are all
checked before any model runs: a problem stops the command with one line naming it (exit 2), and
nothing is written. The file is streamed in bounded memory: the command has no size limit (the
app's limits are `analysis.inputs.datasets.APP_LIMITS`).

--drop / --force / --mode run every forward under an ablation, as `routescope export` does (the same
spec grammar); it is resolved against the first checkpoint ("top8": the 8 options each layer of the
unablated model picks most over this dataset, one extra pass) and the second runs under the same
options. Every table's summary, corpus.json and the page record it, with both checkpoints' weights
digests.
"""
from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path

from tqdm import tqdm

from routescope.core_models.ablation import NO_ABLATION

from routescope.analysis.corpus import compare as CMP
from routescope.analysis.corpus import page as P
from routescope.analysis.corpus import reductions as RD
from routescope.analysis.corpus import run as R
from routescope.analysis.corpus import shipped as SH
from routescope.analysis.corpus.columns import named_compared
from routescope.analysis.corpus.page import FORMATS
from routescope.analysis.export.run_table import TokenText
from routescope.analysis.inputs import datasets as D
from routescope.analysis.runs.usage import ablation_for, corpus_usage
from routescope.rendering.corpus_report import page  # the drawer table (plotly only, no Streamlit)

from . import options as O
from .common import load_with_tokenizer


def _formats(spec: str) -> list[str]:
    out = [f.strip().lower() for f in spec.split(",") if f.strip()]
    bad = [f for f in out if f not in FORMATS]
    if bad or not out:
        raise ValueError(f"--format {spec!r}: use {', '.join(FORMATS)} (comma-separated)")
    return list(dict.fromkeys(out))


def run(args: argparse.Namespace) -> int:
    formats = _formats(args.format)
    intended = RD.parse_intended(args.intended)
    out = P.check_out_dir(args.out)
    labels = [c.strip() for c in args.labels.split(",") if c.strip()] if args.labels is not None else None
    data = SH.shipped(args.shipped) if args.shipped else \
        D.load_corpus(args.data, text_column=args.text_column, label_columns=labels)
    settings = R.CorpusSettings(max_tokens=args.max_tokens, batch_size=args.batch_size)
    names = [Path(args.checkpoint).resolve().name]
    loaded = [load_with_tokenizer(args.checkpoint, **O.device_kwargs(args))]
    if args.compare:
        names.append(Path(args.compare).resolve().name)
        if names[1] == names[0]:
            names = [f"{names[0]} (A)", f"{names[0]} (B)"]
        loaded.append(load_with_tokenizer(args.compare, **O.device_kwargs(args)))
    layouts = [R.layout_of(m, data.label_columns) for m, _ in loaded]
    why = CMP.comparable(*layouts, names=tuple(names)) if len(layouts) == 2 else None
    if why:
        raise ValueError(f"cannot compare {names[0]} with {names[1]}: {why}")
    own = RD.default_intended(data.label_columns, {c: list(v) for c, v in (data.label_values or {}).items()})
    for lay in layouts:
        if lay.routes:
            RD.check_intended(intended, lay)
            RD.check_intended(own, lay)  # the dataset's expected_path / expected_option, before the run
    paths = [args.checkpoint, *([args.compare] if args.compare else [])]

    def run_one(k: int, ablation, desc: str):
        (model, tok), text = loaded[k], TokenText(loaded[k][1])
        with tqdm(total=data.n_rows, desc=desc, unit="row", disable=True if args.quiet else None) as bar:
            return R.run_corpus(model, tok, data, name=names[k], settings=settings, ablation=ablation,
                                checkpoint=paths[k], progress=lambda n, b=bar: b.update(n - b.n),
                                decode=lambda i, t=text: t([i])[0])

    # top N ranks by the unablated first checkpoint over this dataset (one pass, asked only for such a spec)
    usage = functools.cache(lambda: corpus_usage(run_one(0, NO_ABLATION, f"{names[0]} (unablated, for top N)")))
    ablation = ablation_for(loaded[0][0], args.drop, args.force, args.mode, run_counts=usage, corpus=usage)
    if len(loaded) == 2:  # the same options switched off in both
        try:
            ablation.validate(loaded[1][0].routing_layers(), loaded[1][0].ablation_modes())
        except ValueError as e:
            raise ValueError(f"--compare {names[1]}: the ablation does not apply to it: {e}") from None
    results = [run_one(k, ablation, names[k]) for k in range(len(loaded))]
    tables = [r.tables(top=args.top, min_count=args.min_count, intended=intended) for r in results]
    compared = CMP.compare_tables(*tables) if len(tables) == 2 else None
    meta = {"a": R.provenance(results[0]), **({"b": R.provenance(results[1])} if len(results) == 2 else {})}

    html = page(results[0], tables[0], loaded[0][0].option_labels(), other=results[1] if len(results) == 2 else None,
                compared=compared).encode("utf-8")
    with P.OutputSet(out) as built:
        for stale in built.removed_stale:
            sys.stderr.write(f"note: removed {stale}, left by a run that was killed\n")
        named = named_compared(compared or {}, (names[0], names[-1]))  # columns say which checkpoint
        written = P.write_tables({**tables[0], **{f"compare_{k}": v for k, v in named.items()}},
                                 built.dir, formats, provenance=meta)  # in each Parquet file's metadata
        P.write_file(built.dir / P.PAGE, html)
        doc = {**meta, "tables": sorted({p.stem for p in written}), "formats": formats, "notes": list(results[0].notes)}
        P.write_file(built.dir / P.PROVENANCE, json.dumps(doc, indent=1, ensure_ascii=False).encode("utf-8"))
    sys.stderr.write(f"wrote {len(written) + 2} files to {out} ({data.n_rows:,} rows, "
                     f"{results[0].stats.n_tokens:,} tokens{', 2 checkpoints' if len(results) == 2 else ''}"
                     f"{f'; replaced an earlier set of {built.replaced} files' if built.replaced else ''})\n")
    return 0
