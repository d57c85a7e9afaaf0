"""The export loop: prompts -> token ids -> batched traced forwards -> export rows.

Both engines of `routescope export` run it: the embedded single process (cli/export.py) over all
prompts, and each Ray worker (analysis/export/ray_export.py) over its partitions, so a prompt's rows do
not depend on the engine. `ExportJob` holds everything the rows depend on besides the model and the
prompt; `provenance` is what the Parquet files record about how they were made.

Batching: without generation, `job.batch_size` prompts share one forward, right-padded to the
longest (causal attention: no real position sees the padding; padded positions' rows are dropped).
Sampled routing and ATM run each prompt alone: the Gumbel noise then depends only on the seed, and
merges cannot reach into padding. With `max_new_tokens` > 0 each prompt is continued greedily with
`core_models.generate.generate` (KV cache) and its rows cover prompt and generated positions.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

import pandas as pd
import torch

from routescope.core_models.checkpoint import weight_files
from routescope.core_models.generate import Sampling, generate
from routescope.core_models.trace import tracing

from routescope.analysis.export import columns as C
from routescope.analysis.export.run_table import ExportMeta, RowMeta, routing_table
from routescope.analysis.runs.usage import ablation_for

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ExportJob:
    """What an export's rows depend on besides the model and the prompts (picklable: Ray ships it)."""

    max_new_tokens: int = 0
    routing: str = "deterministic"
    seed: int = 0
    options: tuple[tuple[str, Any], ...] = ()  # the family's run options (name, value), as `--option` gives them
    drop: tuple[str, ...] = ()
    force: tuple[str, ...] = ()
    modes: tuple[str, ...] = ()  # named ablation modes (model.ablation_modes())
    batch_size: int = 8

    def __post_init__(self) -> None:
        object.__setattr__(self, "drop", tuple(self.drop))
        object.__setattr__(self, "force", tuple(self.force))
        object.__setattr__(self, "modes", tuple(self.modes))
        object.__setattr__(self, "options", tuple(map(tuple, self.options)))
        if self.batch_size < 1:
            raise ValueError(f"batch_size = {self.batch_size}: must be >= 1")

    def model_options(self, model: Any) -> dict[str, Any]:
        """The run options as the model's family declares them (typed); ValueError for one it does
        not take, or for any with a continuation: they apply to the prompt pass (token merging changes
        earlier positions, so it cannot run with the KV cache of generation)."""
        options = model.check_options(dict(self.options))
        if options and self.max_new_tokens:
            raise ValueError(f"--option {next(iter(options))}: needs --max-new-tokens 0 (run options apply to the "
                             "prompt pass; continuations are generated with the KV cache, without them)")
        return options

    def ablation(self, model: Any, run_ids: Callable[[], Iterable[Sequence[int]]] | None = None):
        """The job's Ablation, resolved and checked against the model's routing layers and ablation
        modes (`analysis.runs.usage.ablation_for`); `run_ids()`: the token ids "top N" specs rank options
        over (the export's prompts; None: such a spec is refused)."""
        if not model.routing_layers():
            raise ValueError(f"family {model.config.family!r} has no routing layers to export")
        return ablation_for(model, self.drop, self.force, self.modes, run_ids=run_ids)


def model_name(checkpoint: str | Path) -> str:
    """The export's `model` column: the checkpoint directory's name."""
    return Path(checkpoint).resolve().name


def encode_prompt(tok: Any, pid: str, text: str, context: int, job: ExportJob) -> list[int]:
    """Token ids of one prompt; a prompt-only export keeps the last `context` tokens of a longer one."""
    ids = tok.encode(text).ids
    if not ids:
        raise ValueError(f"prompt {pid!r}: encodes to no tokens")
    if not job.max_new_tokens and len(ids) > context:
        log.warning("prompt %s: kept the last %d of %d tokens (context)", pid, context, len(ids))
        ids = ids[-context:]
    return ids


def encode_prompts(tok: Any, prompts: Iterable[tuple[str, str]], context: int, job: ExportJob
                   ) -> list[tuple[str, list[int]]]:
    return [(pid, encode_prompt(tok, pid, text, context, job)) for pid, text in prompts]


def _prompt_batch(model, batch, decode, ablation, job: ExportJob, name: str) -> Iterator[pd.DataFrame]:
    """Prompt-only rows of one batch (module doc: padding, and when prompts run alone)."""
    options = job.model_options(model)
    declared = model.run_options()
    # sampled routing draws per row; an option over the whole sequence (token merging) must not see padding
    alone = job.routing == "sampled" or any(v and declared[n].whole_sequence for n, v in options.items())
    groups = [[item] for item in batch] if alone else [list(batch)]
    pad = max(0, model.config.pad_id)
    for group in groups:
        T = max(len(ids) for _, ids in group)
        padded = [ids + [pad] * (T - len(ids)) for _, ids in group]
        gen = torch.Generator().manual_seed(job.seed)
        with torch.inference_mode(), tracing() as tr:
            model(torch.tensor(padded, device=model.device), ablation=ablation, routing=job.routing, generator=gen,
                  **options)
        meta = ExportMeta(model=name, ablation=ablation.describe(), seed=job.seed,
                          rows=[RowMeta(pid, row, decode(row)) for (pid, _), row in zip(group, padded)])
        df = routing_table(tr, model, meta=meta)
        if any(len(ids) < T for _, ids in group):
            length = df[C.PROMPT_ID].map({pid: len(ids) for pid, ids in group})
            df = df[df[C.POSITION].isna() | (df[C.POSITION] < length)].reset_index(drop=True)
        yield df


def _generation(model, pid, ids, decode, ablation, job: ExportJob, name: str) -> pd.DataFrame:
    g = generate(model, ids, max_new_tokens=job.max_new_tokens, sampling=Sampling(seed=job.seed), top_n=1,
                 ablation=ablation, routing=job.routing, routing_seed=job.seed, trace_sites=None)
    for note in g.notes:
        log.warning("prompt %s: %s", pid, note)
    meta = ExportMeta(model=name, ablation=ablation.describe(), seed=job.seed,
                      rows=[RowMeta(pid, g.ids, decode(g.ids), n_prompt=len(g.prompt_ids))])
    return routing_table(g.trace, model, meta=meta)


def export_batches(model: Any, encoded: Sequence[tuple[str, list[int]]], decode: Callable[[Sequence[int]], list[str]],
                   ablation: Any, job: ExportJob, name: str
                   ) -> Iterator[tuple[Sequence[tuple[str, list[int]]], Iterator[pd.DataFrame]]]:
    """(batch, its frames) for `encoded` (prompt_id, ids) in order, `job.batch_size` prompts per
    batch. Frames are made as they are read, so a consumer that writes each one keeps memory flat."""
    for k in range(0, len(encoded), job.batch_size):
        batch = encoded[k:k + job.batch_size]
        if job.max_new_tokens:
            yield batch, (_generation(model, pid, ids, decode, ablation, job, name) for pid, ids in batch)
        else:
            yield batch, _prompt_batch(model, batch, decode, ablation, job, name)


class NoteLog:
    """Logs each table note (`df.attrs["notes"]`, e.g. a skipped layer) once per export."""

    def __init__(self) -> None:
        self.seen: set[str] = set()

    def __call__(self, df: pd.DataFrame) -> None:
        for note in set(df.attrs.get("notes", [])) - self.seen:
            log.warning("%s", note)
            self.seen.add(note)


def file_sha256(path: str | Path, chunk: int = 2**20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


DIGEST_CACHE = "ROUTESCOPE_DIGEST_CACHE"  # the digest cache file (default: $XDG_CACHE_HOME/routescope/digests.json)
_digests: dict[tuple, str] = {}  # this process's, by file stamp


def _digest_cache_file() -> Path:
    if os.environ.get(DIGEST_CACHE):
        return Path(os.environ[DIGEST_CACHE])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "routescope" / "digests.json"


def cached_sha256(path: Path) -> str:
    """`file_sha256(path)`, computed once per file version: kept by (real path, size, mtime, inode)
    in this process and in a small JSON cache file, so an export of a 14 GB checkpoint does not
    re-read its weights to record their digest. A changed file has another stamp and is hashed
    again; an unreadable or unwritable cache only costs the hashing."""
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns, st.st_ino)
    if key in _digests:
        return _digests[key]
    cache = _digest_cache_file()
    text_key = json.dumps(key)
    try:
        known = json.loads(cache.read_text())
        known = known if isinstance(known, dict) else {}
    except (OSError, ValueError):
        known = {}
    digest = known.get(text_key)
    if not (isinstance(digest, str) and len(digest) == 64):
        digest = file_sha256(path)
        known[text_key] = digest
        try:  # whole or not at all: a temporary beside it, then replaced
            cache.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=cache.parent, prefix=".digests.")
            with os.fdopen(fd, "w") as f:
                json.dump(dict(list(known.items())[-256:]), f)  # the newest 256 file versions
            os.replace(tmp, cache)
        except OSError:
            pass
    _digests[key] = digest
    return digest


def weights_sha256(checkpoint: str | Path) -> str:
    """The sha256 of a checkpoint's weights: of its one weight file, or over a sharded model's files
    in name order (each file's name and digest)."""
    files = weight_files(checkpoint)
    if len(files) == 1:
        return cached_sha256(Path(files[0]))
    h = hashlib.sha256()
    for f in files:
        h.update(f"{f.name}\0{cached_sha256(Path(f))}\n".encode())
    return h.hexdigest()


def provenance(checkpoint: str | Path, model: Any, job: ExportJob) -> dict[str, Any]:
    """What an export file records about how it was made: the checkpoint (name, family, the
    sha256 of its weights), the parameters' dtype, the job's settings and the RouteScope version.
    The same for every engine, device and partition, so files of one export agree and a rerun can
    tell its own."""
    try:
        version = metadata.version("routescope")
    except metadata.PackageNotFoundError:
        version = "unknown"
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")  # bfloat16 rows differ from float32 ones
    return {"model": model_name(checkpoint), "family": model.config.family,
            "weights_sha256": weights_sha256(checkpoint), "dtype": dtype, "job": asdict(job),
            "routescope": version}
