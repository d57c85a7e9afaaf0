"""The Ray export's output: a partitioned Parquet dataset directory, local or any fsspec URL
(`ray_export`'s module doc, steps 2 and 3): partition names, done markers, the manifest that makes
a rerun into other settings refuse, the leftovers of crashed workers, and reading the dataset back.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import fsspec  # a dependency of torch (and of ray[data])
import pandas as pd
import pyarrow.parquet as pq
from fsspec.implementations.local import LocalFileSystem

from routescope.analysis.export.run_table import conform, empty_table

log = logging.getLogger(__name__)

PART = "part-{start:09d}-{end:09d}.parquet"
DONE_DIR, MANIFEST, SUCCESS = "_done", "_routescope.json", "_SUCCESS"


def filesystem(url: str) -> tuple[Any, str, bool]:
    """(fsspec filesystem, path inside it, whether it is the local filesystem)."""
    fs, path = fsspec.core.url_to_fs(url)
    return fs, path, isinstance(fs, LocalFileSystem)


def join(root: str, *parts: str) -> str:
    """A path inside an fsspec root ("/"-separated on every filesystem)."""
    return "/".join([root.rstrip("/"), *parts])


def partition_name(start: int, end: int) -> str:
    """The Parquet file of prompts [start, end): names sort in prompt order."""
    return PART.format(start=start, end=end)


def partitions(n: int, size: int) -> list[tuple[int, int]]:
    """[start, end) prompt index ranges of n prompts cut every `size`."""
    return [(s, min(s + size, n)) for s in range(0, n, size)]


def finished(out: str) -> dict[str, str]:
    """Partition name -> prompt digest, for the partitions of `out` whose done marker and Parquet file
    both exist."""
    fs, root, _ = filesystem(out)
    done_dir = join(root, DONE_DIR)
    if not fs.isdir(done_dir):
        return {}
    present = {Path(p).name for p in fs.ls(root, detail=False)}
    done = {}
    for p in fs.ls(done_dir, detail=False):
        name = Path(p).name.removesuffix(".json")
        if p.endswith(".json") and name in present:
            try:
                done[name] = json.loads(fs.cat_file(p))["digest"]
            except (ValueError, KeyError, OSError):  # a marker cut short: the partition is redone
                continue
    return done


def _flat(d: dict, prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}: names the setting that differs."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def prepare_out(out: str, manifest: dict) -> None:
    """Create the dataset directory (its parent must exist) or check an earlier run's manifest."""
    manifest = json.loads(json.dumps(manifest))  # as it reads back (tuples become lists)
    fs, root, local = filesystem(out)
    if fs.isfile(root):
        raise ValueError(f"{out}: is a file; --engine ray writes a directory of Parquet files (give a directory)")
    if local and not Path(root).parent.is_dir():
        raise ValueError(f"{out}: directory {Path(root).parent} does not exist")
    path = join(root, MANIFEST)
    if fs.isdir(root) and fs.exists(path):
        try:
            earlier = json.loads(fs.cat_file(path))
        except (ValueError, OSError) as e:
            raise ValueError(f"{out}: unreadable {MANIFEST} ({e}); use a new --out directory") from None
        if earlier != manifest:
            old, new = _flat(earlier), _flat(manifest)
            changed = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
            raise ValueError(f"{out}: holds an export made with other settings ({', '.join(changed)} differ); "
                             f"use a new --out directory or remove it")
        return
    if fs.isdir(root) and any(Path(p).name.startswith("part-") for p in fs.ls(root, detail=False)):
        raise ValueError(f"{out}: holds Parquet parts but no {MANIFEST}; use a new --out directory")
    try:
        fs.makedirs(join(root, DONE_DIR), exist_ok=True)
        fs.pipe_file(path, json.dumps(manifest, indent=1, sort_keys=True).encode("utf-8"))
    except OSError as e:
        raise ValueError(f"{out}: cannot write ({e.strerror or e})") from None


def clean_leftovers(out: str) -> None:
    """Before a run: remove the temporary files of partitions a crashed worker left (ExportWriter's
    hidden .tmp files) and the _SUCCESS of an earlier run (written again when this one completes)."""
    fs, root, _ = filesystem(out)
    for p in fs.ls(root, detail=False):
        name = Path(p).name
        if name == SUCCESS or (name.startswith((".part-", "part-")) and name.endswith(".tmp")):
            fs.rm(p)


def drop_stale(out: str, names: set[str]) -> None:
    """Remove partitions (and markers) that are not part of this run's plan: an earlier run over more
    prompts wrote them."""
    fs, root, _ = filesystem(out)
    for p in fs.ls(root, detail=False):
        name = Path(p).name
        if name.startswith("part-") and name.endswith(".parquet") and name not in names:
            log.warning("%s: removing %s (not a partition of these %s)", out, name, "prompts")
            marker = join(root, DONE_DIR, name + ".json")
            if fs.exists(marker):
                fs.rm(marker)
            fs.rm(p)


def read_dataset(out: str) -> pd.DataFrame:
    """The whole exported dataset in prompt order (partitions sorted by name), in the export schema."""
    fs, root, _ = filesystem(out)
    names = sorted(Path(p).name for p in fs.ls(root, detail=False)
                   if Path(p).name.startswith("part-") and Path(p).name.endswith(".parquet"))
    frames = []
    for name in names:
        with fs.open(join(root, name), "rb") as f:
            frames.append(conform(pq.read_table(f).to_pandas()))
    return pd.concat(frames, ignore_index=True) if frames else empty_table()
