"""The Ray export's prompts, read by Ray Data (`ray_export`'s module doc, step 1): a .txt/.tsv file
parsed by the one prompt reader (`analysis.inputs.prompts`, so ids are the single-process ids), or
.jsonl/.parquet tables with a `prompt` column, each prompt checked by the same rule
(`prompt_problem`); local or any fsspec URL.

Needs the `distributed` extra; ray is imported inside the functions, so the base install never needs it.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
from pyarrow.fs import FSSpecHandler, PyFileSystem

from routescope.analysis.export.ray_output import filesystem
from routescope.analysis.inputs.files import MAX_PROMPT_FILE_BYTES
from routescope.analysis.inputs.prompts import TEXT_SUFFIXES, parse_prompt_bytes, prompt_problem

TABLE_SUFFIXES = (".jsonl", ".parquet", ".pq")


@dataclass(frozen=True)
class PromptSource:
    """Prompts given on the command line (`texts`) or a file / directory / URL (`path`)."""

    path: str | None = None
    texts: tuple[str, ...] = ()

    def describe(self) -> str:
        return self.path if self.path is not None else f"{len(self.texts)} prompt(s) from --prompt"


def _ray_paths(url: str) -> dict[str, Any]:
    """paths= and filesystem= for a Ray Data reader: local paths as they are, other fsspec URLs
    through pyarrow's fsspec handler."""
    fs, path, local = filesystem(url)
    if local:
        return {"paths": path}
    return {"paths": path, "filesystem": PyFileSystem(FSSpecHandler(fs))}


def url_suffix(url: str) -> str:
    """The suffix of a file or directory URL, lower case."""
    return Path(url.rstrip("/")).suffix.lower()


def read_prompt_dataset(source: PromptSource):
    """A materialised Ray Dataset of (index, prompt_id, prompt, error), index 0-based in file order
    (`ray_export`'s module doc, 1). A bad file or row is a row whose `error` names it (user errors
    travel as data: Ray would only hand back their traceback text); `first_error` finds it."""
    import ray  # optional heavy dependency (the distributed extra)

    if source.path is None:
        return ray.data.from_items([{"index": k, "prompt_id": str(k + 1), "prompt": t, "error": ""}
                                    for k, t in enumerate(source.texts)]).materialize()
    url, suffix = source.path, url_suffix(source.path)
    fs, path, _ = filesystem(url)
    if not fs.exists(path):
        raise ValueError(f"{url}: no such prompt file or directory")
    if suffix in TEXT_SUFFIXES:
        if fs.isdir(path):
            raise ValueError(f"{url}: is a directory; give one .txt/.tsv file (or .jsonl/.parquet files)")
        info = fs.info(path)  # the limits of the single-process export, checked before Ray reads a byte
        if info.get("type") != "file":
            raise ValueError(f"{url}: is not a regular file (a named pipe or a device); give a regular file")
        if (info.get("size") or 0) > MAX_PROMPT_FILE_BYTES:
            raise ValueError(f"{url}: the prompt file is {info['size']:,} bytes; the limit for a .txt/.tsv file is "
                             f"{MAX_PROMPT_FILE_BYTES >> 20} MiB (split it, or give .jsonl/.parquet files)")

        def parse(row: dict) -> list[dict]:
            try:
                pairs = parse_prompt_bytes(row["bytes"], url, suffix)
            except ValueError as e:
                return [{"index": -1, "prompt_id": "", "prompt": "", "error": str(e)}]
            return [{"index": k, "prompt_id": pid, "prompt": p, "error": ""} for k, (pid, p) in enumerate(pairs)]

        return ray.data.read_binary_files(**_ray_paths(url)).flat_map(parse).materialize()  # one file, line order
    if suffix == ".jsonl":
        table = ray.data.read_json(**_ray_paths(url), lines=True)
    elif suffix in (".parquet", ".pq"):
        table = ray.data.read_parquet(**_ray_paths(url))
    else:
        raise ValueError(f"{url}: prompt files are .txt, .tsv, .jsonl or .parquet (a file or a directory of them)")
    try:
        table = table.materialize()
    except ray.exceptions.RayTaskError as e:  # the reader's own error, wrapped in Ray's traceback text
        cause = _first_line(getattr(e, "cause", None))
        raise ValueError(f"{url}: cannot read it as {suffix.lstrip('.')} ({cause})") from None
    return _indexed(table, url)


def _first_line(error: BaseException | None) -> str:
    """An error as one line: its type and the first line of its message (Ray appends retry advice)."""
    if error is None:
        return "unknown error"
    if isinstance(error, UnicodeError):  # a JSON string escaping a lone surrogate (\udce9) is no text
        return f"{type(error).__name__}: not UTF-8 text"
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__


def _indexed(table, url: str):
    """Rows of a JSONL/Parquet prompt table (materialised in file order) with their 0-based index
    and a prompt_id (default: the 1-based row number). Each block is numbered from the row count of
    the blocks before it, which the driver adds up in block order."""
    import ray  # optional heavy dependency (the distributed extra)

    columns = table.columns() or []
    if "prompt" not in columns:
        raise ValueError(f"{url}: no 'prompt' column (found: {', '.join(columns) or 'none'})")
    refs = table.select_columns([c for c in ("prompt_id", "prompt") if c in columns]).to_arrow_refs()
    sizes = ray.get([_num_rows.remote(r) for r in refs])
    offsets = [sum(sizes[:k]) for k in range(len(sizes))]
    return ray.data.from_arrow_refs([_number.remote(r, o, url) for r, o in zip(refs, offsets)]).materialize()


def _remote(fn):
    """ray.remote, applied when first called (ray is imported lazily)."""
    wrapped = None

    class Lazy:
        @staticmethod
        def remote(*args):
            nonlocal wrapped
            if wrapped is None:
                import ray  # optional heavy dependency (the distributed extra)
                wrapped = ray.remote(fn)
            return wrapped.remote(*args)

    return Lazy


@_remote
def _num_rows(table) -> int:
    return table.num_rows


@_remote
def _number(table, offset: int, url: str):
    """The block's rows with index = offset + row, prompt_id as text, and an error for a missing value
    or a prompt the one rule refuses (`prompt_problem`: blank, or not text)."""
    df = table.to_pandas()
    index = pd.Series(range(offset, offset + len(df)), dtype="int64")
    ids = df["prompt_id"] if "prompt_id" in df else index + 1
    error = pd.Series("", index=df.index, dtype=object)
    for k, (i, p) in enumerate(zip(index, df["prompt"])):
        # a non-blank ASCII string passes the rule: only the others are asked (it reads every character)
        if isinstance(p, str) and p.isascii() and p.strip():
            continue
        problem = prompt_problem(p) if isinstance(p, str) else None
        if problem:
            error.iloc[k] = f"{url}: row {i + 1}: {problem}"
    for col, values in (("prompt", df["prompt"]), ("prompt_id", ids)):
        missing = values.isna().to_numpy()
        if missing.any():
            error[missing] = [f"{url}: row {i + 1}: {col} is missing (null)" for i in index[missing]]
    out = pd.DataFrame({"index": index, "prompt_id": ids.astype(str).to_numpy(),
                        "prompt": df["prompt"].astype(str).to_numpy(), "error": error.to_numpy()})
    return pa.Table.from_pandas(out, preserve_index=False)


def first_error(ds, column: str = "error") -> str | None:
    """The first non-empty `column` value of a dataset (by index when it has one), or None."""
    errors = ds.filter(lambda row: bool(row[column])).take_all()
    if not errors:
        return None
    return str(min(errors, key=lambda r: r.get("index", r.get("start", 0)))[column])


def partition_digests(prompts, partition_size: int) -> dict[int, str]:
    """start -> sha256 of the partition's (prompt_id, prompt) pairs in order: a rerun redoes a partition
    whose prompts changed."""
    def digest(batch: pd.DataFrame) -> pd.DataFrame:
        rows = [hashlib.sha256(f"{i}\0{p}".encode("utf-8")).hexdigest()[:32]
                for i, p in zip(batch["prompt_id"], batch["prompt"])]
        return pd.DataFrame({"index": batch["index"], "digest": rows})

    table = prompts.map_batches(digest, batch_format="pandas").to_pandas().sort_values("index")
    out = {}
    for start, group in table.groupby(table["index"] // partition_size * partition_size):
        out[int(start)] = hashlib.sha256("".join(group["digest"]).encode()).hexdigest()
    return out
