"""`routescope export --engine ray`: the export on a Ray cluster, written as a partitioned Parquet dataset.

Needs the `distributed` extra (ray[data]); ray is imported inside the functions, so the base install
never needs it. The rows are those of the single-process export: each worker runs
`analysis.export.batch` (same batching, same tables) and writes with `analysis.export.table_files.ExportWriter`
(same schema, same provenance metadata). The prompts are read by `ray_prompts`, the dataset directory
is kept by `ray_output`, and `analysis.ray_cluster` connects to (or starts) the cluster.

1. Ray Data reads the prompts: .txt / .tsv (one file; parsed by analysis.inputs.prompts, so ids are the
   single-process ids), .jsonl (one JSON object per line) or .parquet (a file or a directory of
   files) with a `prompt` column and optionally `prompt_id` (default: the 1-based row number), local
   or any fsspec URL (s3://, gs://, memory:// ...). Every prompt gets its 0-based index in file order;
   a table's prompts follow the one prompt rule (`prompt_problem`: not blank, and text).
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
import socket
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from routescope.core_models.checkpoint import load_checkpoint, require_tokenizer
from routescope.core_models.devices import resolve_device

from routescope.analysis.export import batch as B
from routescope.analysis.export.ray_output import (DONE_DIR, SUCCESS, clean_leftovers, drop_stale, filesystem, finished,
                                                   join, partition_name, partitions, prepare_out)
from routescope.analysis.export.ray_prompts import (PromptSource, first_error, partition_digests, read_prompt_dataset,
                                                    url_suffix)
from routescope.analysis.export.run_table import TokenText
from routescope.analysis.export.table_files import ExportWriter
from routescope.analysis.inputs.prompts import TEXT_SUFFIXES, check_unique_ids
from routescope.analysis.ray_cluster import checkpoint_files, connect

log = logging.getLogger(__name__)

CRASH_ONCE_ENV = "ROUTESCOPE_RAY_CRASH_ONCE"  # fault injection for tests (see _maybe_crash)


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
        import ray  # optional heavy dependency (the distributed extra): only Ray constructs this actor

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
        fs, root, _ = filesystem(self.out)
        fs.pipe_file(join(root, DONE_DIR, name + ".json"), json.dumps(stats).encode("utf-8"))  # last
        return pd.DataFrame([stats])

    def _write(self, name: str, encoded: list) -> int:
        """The partition's rows to `out`/name through a temporary file (moved into place); row count."""
        fs, root, local = filesystem(self.out)
        notes = B.NoteLog()
        with tempfile.TemporaryDirectory(prefix="routescope-part-") as tmp:
            target = Path(join(root, name)) if local else Path(tmp) / name
            with ExportWriter(target, provenance=self.provenance) as w:  # a hidden temporary file + rename
                for k, (_, frames) in enumerate(B.export_batches(self.model, encoded, self.decode, self.ablation,
                                                                 self.job, self.name)):
                    for df in frames:
                        w.write(df)
                        notes(df)
                    if k == 0:
                        _maybe_crash()
            if not local:
                fs.put_file(str(target), join(root, name) + ".tmp")
                fs.mv(join(root, name) + ".tmp", join(root, name))
        return w.n_rows


# --- the driver ---------------------------------------------------------------------------------------

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
    import ray  # optional heavy dependency (the distributed extra)

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
    if source.path is not None and url_suffix(source.path) not in TEXT_SUFFIXES:
        check_unique_ids(prompts.select_columns(["prompt_id"]).to_pandas()["prompt_id"].tolist(), source.path)
    parts = partitions(n, partition_size)
    digests = partition_digests(prompts, partition_size)
    done = finished(out)
    return ExportPlan(n, parts, digests, [(s, e) for s, e in parts if done.get(partition_name(s, e)) != digests[s]])


def run_partitions(plan: ExportPlan, prompts: Any, checkpoint: str | Path, job: B.ExportJob, out: str,
                   provenance: dict, *, workers: int, partition_size: int, threads: int, device: str, dtype: str,
                   max_retries: int) -> list[dict]:
    """Export the plan's unfinished partitions on a pool of model actors; their summaries in order."""
    import ray  # optional heavy dependency (the distributed extra)

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

    files = ray.put(checkpoint_files(checkpoint))
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
    drop_stale(out, plan.names())
    clean_leftovers(out)
    fs, root, _ = filesystem(out)
    fs.pipe_file(join(root, SUCCESS), b"")


def export_ray(checkpoint: str | Path, source: PromptSource, out: str, job: B.ExportJob, *, workers: int = 2,
               partition_size: int = 1000, threads: int = 1, device: str = "auto", dtype: str = "auto",
               progress: bool = True, max_retries: int = 3) -> RaySummary:
    """Export the routing rows of every prompt of `source` to the Parquet dataset directory `out`
    (module doc): check, plan, run, verify. Inputs are checked before any work; returns what was
    written."""
    import ray  # optional heavy dependency (the distributed extra)

    t0 = time.perf_counter()
    provenance = _check_export(checkpoint, job, workers=workers, partition_size=partition_size, threads=threads,
                               dtype=dtype)
    prepare_out(out, {"provenance": provenance, "partition_size": partition_size})
    clean_leftovers(out)
    workers = _local_workers(workers, threads)
    started, tmp = connect(workers, threads)
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
