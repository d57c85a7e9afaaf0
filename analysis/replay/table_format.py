"""The plain long routing table, Parquet or CSV, streamed and grouped into requests.

Columns (any others are ignored): `row` (request id), `position` (0-based within the row's token
ids), `token_id`, `layer` (the routing layer's 0-based index in depth order, or its name as
RouteScope writes it: "blocks.0.moe"), `k` (0-based slot of the top-k), `expert` (the expert id).
One record per (row, position, layer, k); a row's records must be contiguous (all of one row, then
the next: any order inside a row), as `routescope export` and a group-by write them; a row id that
comes back after another row started is an error naming it.

`routescope export`'s own table (`analysis.export.columns.EXPORT_SCHEMA`) is read too, through
this mapping: row = prompt_id; its "weight" records (one per selected option, every top-k family)
of the unablated call (`ablation` "none") give layer = `layer` (a name), expert = `option`, and
k = the option's rank by weight (largest first, as routers return their picks); token_id and
position as written. Per-call records and other kinds are skipped.

Parquet is read by record batches (`pyarrow.parquet.ParquetFile.iter_batches`), CSV in chunks of
`CHUNK_ROWS` (pandas `read_csv(chunksize=...)`), so memory is bounded by one row's records plus one
batch.
"""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from routescope.analysis.export.csv_format import unescape_text
from routescope.analysis.replay.row import TraceRow

COLUMNS = ("row", "position", "token_id", "layer", "k", "expert")
EXPORT_COLUMNS = ("prompt_id", "position", "token_id", "layer", "kind", "option", "value", "ablation")
CHUNK_ROWS = 1 << 18  # records per CSV chunk / Parquet batch


def _chunks(path: Path) -> Iterator[pd.DataFrame]:
    """The file's records in order, a bounded chunk at a time, with only the columns read."""
    if path.suffix.lower() == ".csv":
        try:
            header = pd.read_csv(path, nrows=0).columns
        except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
            raise ValueError(f"{path}: not a readable CSV table ({str(e).splitlines()[0]})") from None
        cols = _columns(path, tuple(header))
        export = cols == EXPORT_COLUMNS
        text = ("prompt_id", "layer", "kind", "ablation") if export else ("row", "layer")
        try:
            for chunk in pd.read_csv(path, usecols=list(cols), dtype={c: str for c in text}, chunksize=CHUNK_ROWS,
                                     keep_default_na=False, na_values={c: [""] for c in cols if c not in text}):
                if export:  # RouteScope's CSV format (analysis.export.csv_format): "\N" is NA, cells escaped
                    for c in text:  # only cells that hold a quote prefix or an escape need decoding
                        col = chunk[c].astype("string")
                        coded = (col.str.startswith("'") | col.str.contains("\\", regex=False)).to_numpy(bool)
                        col[coded] = [pd.NA if v == "\\N" else unescape_text(v) for v in col[coded]]
                        chunk[c] = col
                yield chunk
        except (pd.errors.ParserError, ValueError) as e:
            raise ValueError(f"{path}: unreadable CSV table ({str(e).splitlines()[0]})") from None
        return
    try:
        pf = pq.ParquetFile(path)
    except (pa.ArrowInvalid, OSError) as e:
        raise ValueError(f"{path}: not a readable Parquet table ({str(e).splitlines()[0]})") from None
    cols = _columns(path, tuple(pf.schema_arrow.names))
    for batch in pf.iter_batches(batch_size=CHUNK_ROWS, columns=list(cols)):
        yield batch.to_pandas()


def _columns(path: Path, header: tuple[str, ...]) -> tuple[str, ...]:
    """Which layout the header is: the plain table's or the export table's columns."""
    if all(c in header for c in COLUMNS):
        return COLUMNS
    if all(c in header for c in EXPORT_COLUMNS):
        return EXPORT_COLUMNS
    missing = [c for c in COLUMNS if c not in header]
    raise ValueError(f"{path}: not a routing table: missing column(s) {', '.join(missing)} "
                     f"(expected {', '.join(COLUMNS)}, or a `routescope export` table)")


def _plain(df: pd.DataFrame, export: bool) -> pd.DataFrame:
    """The chunk in the plain layout (row, position, token_id, layer, k, expert); export records mapped."""
    if not export:
        return df
    keep = (df["kind"] == "weight") & (df["ablation"].fillna("none") == "none") & df["position"].notna()
    d = df.loc[keep.fillna(False).to_numpy()]
    # k = rank by weight within (row, position, layer), largest first; stable so ties keep option order
    # rows and layers keep their order of first appearance (layers: depth order as written)
    order = np.lexsort((-d["value"].to_numpy(dtype=float), pd.factorize(d["layer"])[0],
                        d["position"].to_numpy(dtype=np.int64), pd.factorize(d["prompt_id"])[0]))
    d = d.iloc[order]
    return pd.DataFrame({"row": d["prompt_id"], "position": d["position"], "token_id": d["token_id"],
                         "layer": d["layer"], "k": d.groupby(["prompt_id", "position", "layer"], sort=False).cumcount(),
                         "expert": d["option"]})


def _int(values: pd.Series, what: str, where: str) -> np.ndarray:
    if values.isna().any():
        raise ValueError(f"{where}: missing {what}")
    try:
        out = pd.to_numeric(values, errors="raise").to_numpy()
    except (ValueError, TypeError):
        raise ValueError(f"{where}: {what} must be integers") from None
    if out.dtype.kind == "f" and not np.all(np.mod(out, 1) == 0):
        raise ValueError(f"{where}: {what} must be integers")
    return out.astype(np.int64)


def assemble(rid: str, d: pd.DataFrame, where: str) -> TraceRow:
    """One request's records (plain layout) -> TraceRow; ValueError naming the row for a hole or a clash."""
    where = f"{where} (row {rid!r})"
    pos = _int(d["position"], "position", where)
    k = _int(d["k"], "k", where)
    expert = _int(d["expert"], "expert", where)
    tok = _int(d["token_id"], "token_id", where)
    if d["layer"].isna().any():
        raise ValueError(f"{where}: missing layer")
    # factorize first: a row has few distinct layers, so each is judged once (index or name)
    codes, uniq = pd.factorize(d["layer"])
    text = [str(u).strip() for u in uniq]
    if all(t.isdigit() or (t.endswith(".0") and t[:-2].isdigit()) for t in text):  # 0-based indices
        index = np.array([int(float(t)) for t in text], dtype=np.int64)
        lay, names, n_layers = index[codes], None, int(index.max()) + 1
    else:  # names label the L axis in the order the row first gives them (the replay maps them to depth order)
        lay, names, n_layers = codes.astype(np.int64), tuple(text), len(text)
    if pos.min() < 0 or k.min() < 0:
        raise ValueError(f"{where}: negative {'position' if pos.min() < 0 else 'k'}")
    T, K = int(pos.max()) + 1, int(k.max()) + 1
    if len(d) != T * n_layers * K:
        raise ValueError(f"{where}: {len(d)} records for {T} positions x {n_layers} layers x k = {K} "
                         f"({T * n_layers * K} expected): a position, layer or k is missing or repeated")
    experts = np.full((T, n_layers, K), -1, dtype=np.int64)
    seen = np.zeros((T, n_layers, K), dtype=bool)
    seen[pos, lay, k] = True
    if not seen.all():
        t, l_, j = map(int, np.argwhere(~seen)[0])
        raise ValueError(f"{where}: no record for position {t}, layer {names[l_] if names else l_}, k {j} "
                         "(or one given twice)")
    experts[pos, lay, k] = expert
    token_ids = np.full(T, -1, dtype=np.int64)
    token_ids[pos] = tok
    clash = tok != token_ids[pos]
    if clash.any():
        raise ValueError(f"{where}: position {int(pos[clash][0])} has two token ids")
    return TraceRow(rid, token_ids, experts, names)


def read_table(path: Path) -> Iterator[TraceRow]:
    """Requests of a long routing table (module docstring), in file order."""
    path = Path(path)
    export = None
    pending: list[pd.DataFrame] = []
    current: str | None = None
    done: set[str] = set()
    for chunk in _chunks(path):
        if export is None:
            export = "prompt_id" in chunk.columns
        df = _plain(chunk, export)
        if df.empty:
            continue
        if df["row"].isna().any():
            raise ValueError(f"{path}: a record has no row id")
        rows = df["row"].astype(str).to_numpy()
        # split the chunk where the row id changes
        cuts = np.flatnonzero(rows[1:] != rows[:-1]) + 1
        for seg in np.split(np.arange(len(df)), cuts):
            rid = rows[seg[0]]
            if rid != current:
                if current is not None:
                    try:
                        finished = assemble(current, pd.concat(pending, ignore_index=True), str(path))
                    except ValueError as e:  # the rest of the row may come later in the file
                        raise ValueError(f"{e}; if its records continue after row {rid!r}, sort the table by row "
                                         "(a row's records must be contiguous)") from None
                    yield finished
                    done.add(current)
                if rid in done:
                    raise ValueError(f"{path}: row {rid!r} comes back after other rows: a row's records must be "
                                     "contiguous (sort the table by row)")
                current, pending = rid, []
            pending.append(df.iloc[seg])
    if current is None:
        raise ValueError(f"{path}: no routing records" + (" (an export holds top-k picks as \"weight\" records of the "
                                                          "unablated call: is it a top-k model's?)" if export else ""))
    yield assemble(current, pd.concat(pending, ignore_index=True), str(path))
