"""`routescope export --engine ray`: the export on a Ray cluster, written as a partitioned Parquet dataset.

Needs the `distributed` extra (ray[data]); ray is imported inside the functions, so the base install
never needs it. The rows are those of the single-process export: each worker runs
`analysis.export.batch` (same batching, same tables) and writes with `analysis.export.tables.ExportWriter`
(same schema, same provenance metadata).

1. Ray Data reads the prompts: .txt / .tsv (one file; parsed by analysis.runs.prompts, so ids are the
   single-process ids), .jsonl (one JSON object per line) or .parquet (a file or a directory of
   files) with a `prompt` column and optionally `prompt_id` (default: the 1-based row number), local
   or any fsspec URL (s3://, gs://, memory:// ...). Every prompt gets its 0-based index in file order.
2. Prompts are cut into partitions of `partition_size` by index; partition k holds indices
   [k * size, (k + 1) * size) and is written to `part-<start>-<end>.parquet` (9-digit, zero-padded,
   end exclusive), so names sort in prompt order and do not depend on the run.
3. An actor pool (`workers` actors, each `threads` CPUs, a GPU each when the device is one) loads the
   checkpoint once per actor (its files travel through the object store, so cluster nodes need no
   copy of it) and exports one whole partition per call. A partition is written to a temporary file
   and moved into place, then its done marker `_done/<name>.json` is written last; a rerun skips
   partitions whose marker and file exist and redoes the others (a crash mid-partition leaves no
   marker). `_routescope.json` (the export's provenance and partition size) is written first, and a
   rerun into a directory made with other settings is refused; `_SUCCESS` is written at the end.
   Files starting with "_" or "." are skipped by pyarrow, pandas, DuckDB and Spark readers.
4. Failed tasks are retried: a task lost with its worker or node (a crash, Ray's out-of-memory
   killer) is re-run (Ray Data's reading and grouping tasks by Ray Data's own policy; a dead export
   actor is restarted and its partition re-run, up to `max_retries` times). An error raised by the
   export itself (a prompt with no tokens, a bad file) is not retried and is reported as a one-line
   ValueError. Progress: Ray Data's progress bars (off with progress=False / --quiet).

`ray.init` connects to the cluster in RAY_ADDRESS when it is set (nodes need routescope and its
`distributed` extra installed, and --out must be a path or URL every node can write); otherwise it
starts a local cluster with `workers * threads + 1` logical CPUs (workers are cut to what this
machine's CPUs hold), no dashboard, a bounded object store and its session files in a temporary
directory, and stops it when the export ends.
"""
from __future__ import annotations

import json
import logging
import os
import resource
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from routescope.analysis.export import batch as B
from routescope.analysis.inputs.files import MAX_PROMPT_FILE_BYTES
from routescope.analysis.inputs.prompts import TEXT_SUFFIXES, check_unique_ids, parse_prompt_bytes

log = logging.getLogger(__name__)

PART = "part-{start:09d}-{end:09d}.parquet"
DONE_DIR, MANIFEST, SUCCESS = "_done", "_routescope.json", "_SUCCESS"
TABLE_SUFFIXES = (".jsonl", ".parquet", ".pq")
LOCAL_OBJECT_STORE = 512 * 2**20  # bytes; prompts and per-partition summaries are all that travel
CRASH_ONCE_ENV = "ROUTESCOPE_RAY_CRASH_ONCE"  # fault injection for tests (see _maybe_crash)


@dataclass(frozen=True)
class PromptSource:
    """Prompts given on the command line (`texts`) or a file / directory / URL (`path`)."""

    path: str | None = None
    texts: tuple[str, ...] = ()

    def describe(self) -> str:
        return self.path if self.path is not None else f"{len(self.texts)} prompt(s) from --prompt"


@dataclass
class RaySummary:
    out: str
    prompts: int
    partitions: int
    skipped: int  # partitions finished by an earlier run
    rows: int  # rows written by this run
    seconds: float
    partition_stats: list[dict] = field(default_factory=list)  # one per partition written by this run

    def workers(self) -> dict[str, dict[str, float]]:
        """Per worker process ("host:pid"): partitions, prompts and peak RSS (MiB)."""
        out: dict[str, dict[str, float]] = {}
        for s in self.partition_stats:
            w = out.setdefault(s["worker"], {"partitions": 0, "prompts": 0, "peak_rss_mb": 0.0})
            w["partitions"] += 1
            w["prompts"] += s["prompts"]
            w["peak_rss_mb"] = max(w["peak_rss_mb"], s["peak_rss_mb"])
        return out

    def describe(self) -> str:
        done = f"; {self.skipped} partition(s) were already done" if self.skipped else ""
        return (f"wrote {self.rows} rows for {self.prompts} prompts in {self.partitions - self.skipped} partition(s) "
                f"to {self.out} ({len(self.workers())} worker(s), {self.seconds:.1f} s){done}")


# --- output directory -----------------------------------------------------------------------------

def _filesystem(url: str) -> tuple[Any, str, bool]:
    """(fsspec filesystem, path inside it, whether it is the local filesystem)."""
    import fsspec
    from fsspec.implementations.local import LocalFileSystem

    fs, path = fsspec.core.url_to_fs(url)
    return fs, path, isinstance(fs, LocalFileSystem)


def _join(root: str, *parts: str) -> str:
    return "/".join([root.rstrip("/"), *parts])


def partition_name(start: int, end: int) -> str:
    return PART.format(start=start, end=end)


def partitions(n: int, size: int) -> list[tuple[int, int]]:
    """[start, end) prompt index ranges of n prompts cut every `size`."""
    return [(s, min(s + size, n)) for s in range(0, n, size)]


def finished(out: str) -> dict[str, str]:
    """Partition name -> prompt digest, for the partitions of `out` whose done marker and Parquet file
    both exist."""
    fs, root, _ = _filesystem(out)
    done_dir = _join(root, DONE_DIR)
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


def _prepare_out(out: str, manifest: dict) -> None:
    """Create the dataset directory (its parent must exist) or check an earlier run's manifest."""
    manifest = json.loads(json.dumps(manifest))  # as it reads back (tuples become lists)
    fs, root, local = _filesystem(out)
    if fs.isfile(root):
        raise ValueError(f"{out}: is a file; --engine ray writes a directory of Parquet files (give a directory)")
    if local and not Path(root).parent.is_dir():
        raise ValueError(f"{out}: directory {Path(root).parent} does not exist")
    path = _join(root, MANIFEST)
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
        fs.makedirs(_join(root, DONE_DIR), exist_ok=True)
        fs.pipe_file(path, json.dumps(manifest, indent=1, sort_keys=True).encode("utf-8"))
    except OSError as e:
        raise ValueError(f"{out}: cannot write ({e.strerror or e})") from None


# --- reading the prompts --------------------------------------------------------------------------

def _ray_paths(url: str) -> dict[str, Any]:
    """paths= and filesystem= for a Ray Data reader: local paths as they are, other fsspec URLs
    through pyarrow's fsspec handler."""
    fs, path, local = _filesystem(url)
    if local:
        return {"paths": path}
    from pyarrow.fs import FSSpecHandler, PyFileSystem
    return {"paths": path, "filesystem": PyFileSystem(FSSpecHandler(fs))}


def _suffix(url: str) -> str:
    return Path(url.rstrip("/")).suffix.lower()


def read_prompt_dataset(source: PromptSource):
    """A materialised Ray Dataset of (index, prompt_id, prompt, error), index 0-based in file order
    (module doc, 1). A bad file or row is a row whose `error` names it (user errors travel as data:
    Ray would only hand back their traceback text); `first_error` finds it."""
    import ray

    if source.path is None:
        return ray.data.from_items([{"index": k, "prompt_id": str(k + 1), "prompt": t, "error": ""}
                                    for k, t in enumerate(source.texts)]).materialize()
    url, suffix = source.path, _suffix(source.path)
    fs, path, _ = _filesystem(url)
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
    return _indexed(table.materialize(), url)


def _indexed(table, url: str):
    """Rows of a JSONL/Parquet prompt table (materialised in file order) with their 0-based index
    and a prompt_id (default: the 1-based row number). Each block is numbered from the row count of
    the blocks before it, which the driver adds up in block order."""
    import ray

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
                import ray
                wrapped = ray.remote(fn)
            return wrapped.remote(*args)

    return Lazy


@_remote
def _num_rows(table) -> int:
    return table.num_rows


@_remote
def _number(table, offset: int, url: str):
    """The block's rows with index = offset + row, prompt_id as text, and an error for missing values."""
    import pyarrow as pa

    df = table.to_pandas()
    index = pd.Series(range(offset, offset + len(df)), dtype="int64")
    ids = df["prompt_id"] if "prompt_id" in df else index + 1
    error = pd.Series("", index=df.index, dtype=object)
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
    import hashlib

    def digest(batch: pd.DataFrame) -> pd.DataFrame:
        rows = [hashlib.sha256(f"{i}\0{p}".encode("utf-8")).hexdigest()[:32]
                for i, p in zip(batch["prompt_id"], batch["prompt"])]
        return pd.DataFrame({"index": batch["index"], "digest": rows})

    table = prompts.map_batches(digest, batch_format="pandas").to_pandas().sort_values("index")
    out = {}
    for start, group in table.groupby(table["index"] // partition_size * partition_size):
        out[int(start)] = hashlib.sha256("".join(group["digest"]).encode()).hexdigest()
    return out


# --- the workers ----------------------------------------------------------------------------------

def _maybe_crash() -> None:
    """Fault injection for the retry test: if the file named by CRASH_ONCE_ENV exists, the first
    worker that claims it (an atomic rename) dies at once, mid-partition, as a killed node would."""
    flag = os.environ.get(CRASH_ONCE_ENV)
    if flag:
        try:
            os.rename(flag, flag + ".claimed")
        except OSError:
            return
        os._exit(1)


class PartitionExporter:
    """A Ray actor: loads the checkpoint once, then exports whole partitions (one per call)."""

    def __init__(self, files: list, name: str, job: B.ExportJob, out: str, provenance: dict,
                 device: str, dtype: str, threads: int) -> None:
        import socket

        import ray
        import torch

        from routescope.core_models.checkpoint import load_checkpoint
        from routescope.analysis.export.run_table import TokenText

        torch.set_num_threads(threads)
        files = ray.get(files[0])  # the checkpoint's files, put in the object store by the driver
        self.tmp = Path(tempfile.mkdtemp(prefix="routescope-ckpt-"))
        for fname, data in files.items():
            (self.tmp / fname).write_bytes(data)
        try:
            self.model, self.tok = load_checkpoint(self.tmp, device=device, dtype=dtype)
        finally:
            shutil.rmtree(self.tmp, ignore_errors=True)
        self.name, self.job, self.out, self.provenance = name, job, out, provenance
        self.ablation = job.ablation(self.model)
        self.decode = TokenText(self.tok)
        self.worker = f"{socket.gethostname()}:{os.getpid()}"

    def __call__(self, group: pd.DataFrame) -> pd.DataFrame:
        """Export one partition; returns its stats row (`error` set instead of raising for bad input)."""
        t0 = time.perf_counter()
        group = group.sort_values("index")
        start, end, digest = int(group["start"].iloc[0]), int(group["end"].iloc[0]), str(group["digest"].iloc[0])
        if len(group) != end - start or int(group["index"].iloc[0]) != start:
            raise RuntimeError(f"partition {start}-{end}: got {len(group)} prompts")  # a bug, never user input
        name = partition_name(start, end)
        stats = {"partition": name, "start": start, "end": end, "digest": digest, "prompts": len(group), "rows": 0,
                 "seconds": 0.0, "worker": self.worker, "peak_rss_mb": 0.0, "error": ""}
        try:
            prompts = list(zip(group["prompt_id"].astype(str), group["prompt"].astype(str)))
            encoded = B.encode_prompts(self.tok, prompts, self.model.context, self.job)
            stats["rows"] = self._write(name, encoded)
        except ValueError as e:  # a bad prompt: reported by the driver, the partition stays unfinished
            stats["error"] = str(e)
            return pd.DataFrame([stats])
        stats["seconds"] = time.perf_counter() - t0
        stats["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
        fs, root, _ = _filesystem(self.out)
        fs.pipe_file(_join(root, DONE_DIR, name + ".json"), json.dumps(stats).encode("utf-8"))  # last
        return pd.DataFrame([stats])

    def _write(self, name: str, encoded: list) -> int:
        """The partition's rows to `out`/name through a temporary file (moved into place); row count."""
        from routescope.analysis.export.tables import ExportWriter

        fs, root, local = _filesystem(self.out)
        notes = B.NoteLog()
        with tempfile.TemporaryDirectory(prefix="routescope-part-") as tmp:
            target = Path(_join(root, name)) if local else Path(tmp) / name
            with ExportWriter(target, provenance=self.provenance) as w:  # a hidden temporary file + rename
                for k, (_, frames) in enumerate(B.export_batches(self.model, encoded, self.decode, self.ablation,
                                                                 self.job, self.name)):
                    for df in frames:
                        w.write(df)
                        notes(df)
                    if k == 0:
                        _maybe_crash()
            if not local:
                fs.put_file(str(target), _join(root, name) + ".tmp")
                fs.mv(_join(root, name) + ".tmp", _join(root, name))
        return w.n_rows


# --- the driver -------------------------------------------------------------------------------------

def _checkpoint_files(checkpoint: str | Path) -> dict[str, bytes]:
    from routescope.core_models.checkpoint import checkpoint_files

    return {f.name: f.read_bytes() for f in checkpoint_files(checkpoint)}


def _connect(workers: int, threads: int) -> tuple[bool, str | None]:
    """(whether this call started Ray, the temporary session directory it made)."""
    import ray

    if ray.is_initialized():
        return False, None
    quiet = dict(logging_level=logging.WARNING, log_to_driver=True)
    if os.environ.get("RAY_ADDRESS"):
        ray.init(**quiet)  # the cluster in RAY_ADDRESS
        return True, None
    tmp = tempfile.mkdtemp(prefix="rs-ray-")  # short: Ray's socket paths live under it
    cpus = workers * threads + 1  # the actors, and one for reading and grouping the prompts
    ray.init(num_cpus=cpus, include_dashboard=False, object_store_memory=LOCAL_OBJECT_STORE, _temp_dir=tmp, **quiet)
    return True, tmp


def _clean_leftovers(out: str) -> None:
    """Before a run: remove the temporary files of partitions a crashed worker left (ExportWriter's
    hidden .tmp files) and the _SUCCESS of an earlier run (written again when this one completes)."""
    fs, root, _ = _filesystem(out)
    for p in fs.ls(root, detail=False):
        name = Path(p).name
        if name == SUCCESS or (name.startswith((".part-", "part-")) and name.endswith(".tmp")):
            fs.rm(p)


def _drop_stale(out: str, names: set[str]) -> None:
    """Remove partitions (and markers) that are not part of this run's plan: an earlier run over more
    prompts wrote them."""
    fs, root, _ = _filesystem(out)
    for p in fs.ls(root, detail=False):
        name = Path(p).name
        if name.startswith("part-") and name.endswith(".parquet") and name not in names:
            log.warning("%s: removing %s (not a partition of these %s)", out, name, "prompts")
            marker = _join(root, DONE_DIR, name + ".json")
            if fs.exists(marker):
                fs.rm(marker)
            fs.rm(p)


@dataclass(frozen=True)
class ExportPlan:
    """What a run writes: the prompts' partitions (start, end), each partition's digest (of its
    prompts and the export settings), and those that an earlier run has not already finished."""

    n: int
    parts: list[tuple[int, int]]
    digests: dict[int, str]
    todo: list[tuple[int, int]]

    def names(self) -> set[str]:
        return {partition_name(s, e) for s, e in self.parts}


def _check_export(checkpoint: str | Path, job: B.ExportJob, *, workers: int, partition_size: int, threads: int,
                  dtype: str) -> dict:
    """Every check that needs no prompts and no weights (a meta-device load); the run's provenance."""
    from routescope.core_models.checkpoint import load_checkpoint, require_tokenizer

    if workers < 1 or partition_size < 1 or threads < 1:
        raise ValueError("workers, partition_size and threads must be >= 1")
    meta, tok = load_checkpoint(checkpoint, device="meta", dtype=dtype)  # every check, no weights read
    require_tokenizer(tok, checkpoint)
    if not meta.routing_layers():
        raise ValueError(f"{checkpoint}: {meta.config.label} has no routing layers to export")
    job.ablation(meta)
    return B.provenance(checkpoint, meta, job)


def _local_workers(workers: int, threads: int) -> int:
    """Workers a local cluster can run: bounded by this machine's CPUs (a named cluster is not)."""
    import ray

    if ray.is_initialized() or os.environ.get("RAY_ADDRESS"):
        return workers
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if workers * threads > cores:
        log.warning("%d workers x %d threads exceed the %d CPUs here: running %d worker(s)", workers, threads,
                    cores, max(1, cores // threads))
        return max(1, cores // threads)
    return workers


def plan_export(prompts: Any, source: PromptSource, out: str, partition_size: int) -> ExportPlan:
    """Check the prompts (read errors, none at all, repeated ids) and plan the partitions, leaving
    out those `out` already holds for the same prompts and settings (a resumed run)."""
    if (error := first_error(prompts)) is not None:
        raise ValueError(error)
    n = prompts.count()
    if n == 0:
        raise ValueError(f"{source.describe()}: no prompts")
    if source.path is not None and _suffix(source.path) not in TEXT_SUFFIXES:
        check_unique_ids(prompts.select_columns(["prompt_id"]).to_pandas()["prompt_id"].tolist(), source.path)
    parts = partitions(n, partition_size)
    digests = partition_digests(prompts, partition_size)
    done = finished(out)
    return ExportPlan(n, parts, digests, [(s, e) for s, e in parts if done.get(partition_name(s, e)) != digests[s]])


def run_partitions(plan: ExportPlan, prompts: Any, checkpoint: str | Path, job: B.ExportJob, out: str,
                   provenance: dict, *, workers: int, partition_size: int, threads: int, device: str, dtype: str,
                   max_retries: int) -> list[dict]:
    """Export the plan's unfinished partitions on a pool of model actors; their summaries in order."""
    import ray

    from routescope.core_models.devices import resolve_device

    if not plan.todo:
        return []
    gpus = 0.0
    if device != "cpu" and ray.cluster_resources().get("GPU", 0) >= workers:
        gpus = 1.0  # one GPU per actor: `auto` then resolves to CUDA on its node
    elif device not in ("auto", "cpu"):
        resolve_device(device)  # names the missing device before any work when the cluster has none
    starts, n = {s: plan.digests[s] for s, _ in plan.todo}, plan.n

    def assign(batch: pd.DataFrame) -> pd.DataFrame:
        start = (batch["index"] // partition_size) * partition_size
        batch = batch.assign(start=start, end=(start + partition_size).clip(upper=n), digest=start.map(starts))
        return batch[batch["start"].isin(list(starts))].drop(columns="error")

    files = ray.put(_checkpoint_files(checkpoint))
    pool = ray.data.ActorPoolStrategy(size=min(workers, len(plan.todo)), max_tasks_in_flight_per_actor=1)
    out_rows = (prompts.map_batches(assign, batch_format="pandas")
                .groupby("start", num_partitions=min(len(plan.todo), 8 * workers))
                .map_groups(PartitionExporter, batch_format="pandas", compute=pool, num_cpus=threads,
                            num_gpus=gpus or None,
                            fn_constructor_args=([files], B.model_name(checkpoint), job, out, provenance,
                                                 "cuda" if gpus else device, dtype, threads),
                            max_restarts=max_retries, max_task_retries=max_retries))
    stats = sorted((dict(r) for r in out_rows.iter_rows()), key=lambda r: r["start"])
    errors = [r["error"] for r in stats if r["error"]]
    if errors:
        raise ValueError(errors[0])
    return stats


def verify_export(plan: ExportPlan, out: str) -> None:
    """Every planned partition is written with this plan's digest; then remove what is not part of
    it (stale partitions, temporary files of a worker that died) and mark the dataset complete."""
    now = finished(out)
    missing = [partition_name(s, e) for s, e in plan.parts if now.get(partition_name(s, e)) != plan.digests[s]]
    if missing:
        raise RuntimeError(f"{out}: partitions not written: {', '.join(missing[:5])}")
    _drop_stale(out, plan.names())
    _clean_leftovers(out)
    fs, root, _ = _filesystem(out)
    fs.pipe_file(_join(root, SUCCESS), b"")


def export_ray(checkpoint: str | Path, source: PromptSource, out: str, job: B.ExportJob, *, workers: int = 2,
               partition_size: int = 1000, threads: int = 1, device: str = "auto", dtype: str = "auto",
               progress: bool = True, max_retries: int = 3) -> RaySummary:
    """Export the routing rows of every prompt of `source` to the Parquet dataset directory `out`
    (module doc): check, plan, run, verify. Inputs are checked before any work; returns what was
    written."""
    import ray

    t0 = time.perf_counter()
    provenance = _check_export(checkpoint, job, workers=workers, partition_size=partition_size, threads=threads,
                               dtype=dtype)
    _prepare_out(out, {"provenance": provenance, "partition_size": partition_size})
    _clean_leftovers(out)
    workers = _local_workers(workers, threads)
    started, tmp = _connect(workers, threads)
    ctx = ray.data.DataContext.get_current()
    saved = ctx.execution_options.preserve_order, ctx.enable_progress_bars
    try:
        ctx.execution_options.preserve_order = True  # file order is the prompts' index order
        ctx.enable_progress_bars = progress
        prompts = read_prompt_dataset(source)
        plan = plan_export(prompts, source, out, partition_size)
        stats = run_partitions(plan, prompts, checkpoint, job, out, provenance, workers=workers,
                               partition_size=partition_size, threads=threads, device=device, dtype=dtype,
                               max_retries=max_retries)
        verify_export(plan, out)
    finally:
        ctx.execution_options.preserve_order, ctx.enable_progress_bars = saved
        if started:
            ray.shutdown()
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    return RaySummary(out=out, prompts=plan.n, partitions=len(plan.parts), skipped=len(plan.parts) - len(plan.todo),
                      rows=sum(int(s["rows"]) for s in stats), seconds=time.perf_counter() - t0,
                      partition_stats=stats)


def read_dataset(out: str) -> pd.DataFrame:
    """The whole exported dataset in prompt order (partitions sorted by name), in the export schema."""
    import pyarrow.parquet as pq

    from routescope.analysis.export.run_table import conform, empty_table

    fs, root, _ = _filesystem(out)
    names = sorted(Path(p).name for p in fs.ls(root, detail=False)
                   if Path(p).name.startswith("part-") and Path(p).name.endswith(".parquet"))
    frames = []
    for name in names:
        with fs.open(_join(root, name), "rb") as f:
            frames.append(conform(pq.read_table(f).to_pandas()))
    return pd.concat(frames, ignore_index=True) if frames else empty_table()
