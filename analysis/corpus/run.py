"""Running a model over a dataset for corpus statistics (`analysis.corpus.stats`), and the background
jobs the app runs them in.

`run_corpus` streams a `corpus_data.CorpusData` in chunks of `chunk_size` rows: each chunk is
encoded (the first `max_tokens` tokens of each text, at most the model's context), sorted by
length, and run in right-padded batches of `batch_size` under `torch.inference_mode()` with only
the sites it reads traced. Under causal attention no real token sees the padding, and positions at
or past a row's length are masked out of every count. A family with per-token routes
(`families.route_reader`) is read through its reader (routes, and top-k picks where the reader has
`topk`) with the model's predicted next token at each position (the argmax of its logits); any
other family through the rows its family table exports (`FamilyAnalysis.export`, as
`routescope export` writes them). No family is named here. Memory holds one chunk and the counts.

`CorpusJobs` runs such work on one background thread, so the app's page stays responsive while a
job reports its progress; finished jobs are kept (the last `keep`) and shared by every session, as
read-only results.
"""
from __future__ import annotations

import dataclasses
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import pandas as pd
import torch

from routescope.core_models.ablation import NO_ABLATION, Ablation
from routescope.core_models.devices import model_device
from routescope.core_models.trace import host_copy, tracing

from routescope.analysis.corpus import stats as S
from routescope.analysis.corpus import reductions as RD
from routescope.analysis.corpus import values as V
from routescope.analysis.export.batch import weights_sha256
from routescope.analysis.inputs.datasets import CorpusData, CorpusRow
from routescope.analysis.runs.views import RunViews, views_of
from routescope.analysis.runs.family_table import family_analysis, route_reader


@dataclass(frozen=True)
class CorpusSettings:
    """What corpus statistics depend on besides the model and the dataset (hashable: a cache key).
    `max_tokens`: tokens kept per text, from its start (None: the model's context)."""

    max_tokens: int | None = None
    batch_size: int = 32
    chunk_size: int = 1024

    def __post_init__(self) -> None:
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens = {self.max_tokens}: must be >= 1")
        if self.batch_size < 1 or self.chunk_size < 1:
            raise ValueError("batch_size and chunk_size must be >= 1")


@dataclass
class CorpusResult:
    """One model's statistics over one dataset (read-only once made: the app shares it)."""

    model: str
    family: str
    dataset: str
    digest: str
    layout: S.Layout
    stats: S.RouteStats | V.ValueStats
    settings: CorpusSettings
    seconds: float
    description: str
    max_tokens: int = 0  # tokens kept per row: settings.max_tokens, at most the model's context
    decode: Callable[[int], str] | None = field(default=None, repr=False)
    notes: tuple[str, ...] = ()
    ablation: Ablation = NO_ABLATION  # what every forward ran under (the CLI's --drop, the app's left column)
    weights_sha256: str = ""  # of the checkpoint's weights (batch_export.weights_sha256), "" when not known
    dtype: str = ""

    def intended(self, given: Mapping[str, Mapping[str, int]] | None = None) -> dict[str, dict[str, int]]:
        """The dataset's own intended options (`corpus.default_intended`) updated by `given`."""
        out = RD.default_intended(self.layout.label_columns, RD.label_values(self.stats))
        for column, m in (given or {}).items():
            out.setdefault(column, {}).update(m)
        return out

    def tables(self, *, top: int = 10, min_count: int = 5,
               intended: Mapping[str, Mapping[str, int]] | None = None) -> dict[str, pd.DataFrame]:
        """Every table of the statistics by name (the CLI's file names, the view's sections)."""
        out = {"summary": self.summary()}
        if isinstance(self.stats, V.ValueStats):
            out["call_values"] = V.call_values(self.stats)
            return out
        want = self.intended(intended)
        RD.check_intended(want, self.layout)
        out["utilisation"] = RD.utilisation(self.stats)
        if self.layout.label_columns:
            out["label_shares"] = RD.label_shares(self.stats)
        if any(want.values()):
            out["accuracy"] = RD.accuracy(self.stats, want)
        out["specialisation"] = RD.specialisation(self.stats, top=top, min_count=min_count, decode=self.decode)
        if self.stats.pairs:
            out["co_routing"] = RD.co_routing(self.stats)
        return out

    def summary(self) -> pd.DataFrame:
        lay = self.layout
        rows = [("model", self.model), ("family", self.family), ("weights_sha256", self.weights_sha256 or "unknown"),
                ("dtype", self.dtype or "unknown"), ("ablation", self.ablation.describe()),
                ("ablation_specs", "; ".join(self.ablation.specs) or "none"), ("dataset", self.dataset),
                ("dataset_sha256", self.digest), ("rows", f"{self.stats.n_rows}"),
                ("tokens", f"{self.stats.n_tokens}"), ("routing_layers", ", ".join(lay.layers) or "none"),
                ("options_per_layer", ", ".join(map(str, lay.n_options))),
                ("statistics", "per-token routes" if lay.routes else "per-call values (no per-token routes)"),
                ("top_k_recorded", str(lay.k)), ("label_columns", ", ".join(lay.label_columns) or "none"),
                ("max_tokens", str(self.max_tokens)), ("batch_size", str(self.settings.batch_size)),
                ("seconds", f"{self.seconds:.2f}")]
        return pd.DataFrame(rows, columns=[C_METRIC, C_VALUE])


C_METRIC, C_VALUE = "metric", "value"

# table -> its drawer (rendering/drawers.py); the comparison tables are "compare_<table>"
DRAWERS = {"summary": "table", "utilisation": "corpus_utilisation", "label_shares": "corpus_label_shares",
           "accuracy": "corpus_accuracy", "specialisation": "corpus_specialisation", "co_routing": "corpus_co_routing",
           "call_values": "corpus_call_values"}
COMPARE_DRAWER = "corpus_compare"


def corpus_views(tables: Mapping[str, pd.DataFrame], compared: Mapping[str, pd.DataFrame] | None = None,
                 names: tuple[str, str] = ("A", "B")) -> RunViews:
    """The corpus tables as views (name -> tidy frame + drawer), in the order the page shows them;
    `compared` (`corpus.compare_tables`) adds "compare_<table>" views naming the two models."""
    named = [(name, frame, DRAWERS.get(name, "table")) for name, frame in tables.items()]
    named += [(f"compare_{name}", frame, COMPARE_DRAWER, {"table": name, "names": names})
              for name, frame in (compared or {}).items()]
    return views_of(*named)


def layout_of(model: Any, label_columns: Sequence[str]) -> S.Layout:
    """The model's corpus layout: its route reader's layers (per-token routes), else its routing
    layers (per-call values)."""
    labels = model.option_labels()
    try:
        reader = route_reader(model)
    except ValueError:
        layers = list(model.routing_layers())
        return S.Layout(tuple(layers), tuple(model.routing_layers()[l] for l in layers),
                        tuple(tuple(labels[l]) for l in layers), 1, tuple(label_columns), routes=False)
    counts = model.routing_layers()
    n = [counts.get(l, len(reader.labels)) for l in reader.layers]
    names = [tuple(labels.get(l, reader.labels[:k])) for l, k in zip(reader.layers, n)]
    return S.Layout(tuple(reader.layers), tuple(n), tuple(names), 1, tuple(label_columns), routed=reader.routed)


def encode_head(tok: Any, text: str, n: int) -> list[int]:
    """The first `n` token ids of `text`, equal to `tok.encode(text).ids[:n]`, tokenizing only as
    much of the text as they need (a row may be 1 MiB; `--max-tokens 8` needs a few words). A
    prefix is encoded (16 characters a token, growing 4x) and its tokens kept up to the start of
    the pre-tokenizer piece that holds the last `reach` characters (the longest added token's
    length): pieces before it are cut from the whole text alike, and no added token can straddle
    the cut there. A tokenizer with a normalizer, a post-processor that may add tokens, or no
    pre-tokenizer encodes the whole text."""
    pre = getattr(tok, "pre_tokenizer", None)
    post = getattr(tok, "post_processor", None)
    if pre is None or getattr(tok, "normalizer", None) is not None or \
            (post is not None and type(post).__name__ != "ByteLevel"):  # ByteLevel only trims offsets
        return tok.encode(text).ids[:n]
    reach = max((len(t.content) for t in tok.get_added_tokens_decoder().values()), default=0)
    size = 16 * n + 64 + reach
    while size < len(text):
        head = text[:size]
        edge = len(head) - reach
        safe = 0  # the start of the piece holding character `edge` (or the last piece)
        for _, (start, _) in pre.pre_tokenize_str(head):
            if start > edge:
                break
            safe = start
        enc = tok.encode(head)
        ids = []
        for i, (_, end) in zip(enc.ids, enc.offsets):
            if end > safe or len(ids) == n:
                break
            ids.append(i)
        if len(ids) == n:
            return ids
        size *= 4
    return tok.encode(text).ids[:n]


def _chunks(rows: Iterator[CorpusRow], size: int, tok: Any, limit: int) -> Iterator[list[tuple[CorpusRow, list[int]]]]:
    """Chunks of at most `size` rows, each row with its first `limit` token ids and its text dropped
    (a chunk holds ids, not texts of up to 1 MiB each)."""
    chunk: list[tuple[CorpusRow, list[int]]] = []
    for row in rows:
        chunk.append((dataclasses.replace(row, text=""), encode_head(tok, row.text, limit)))
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


@dataclass
class TracedBatch:
    """One batch's routes as the corpus statistics read them (`traced_batches`)."""

    routes: Any  # the route reader's routes (L, B, T)
    topk: Any  # its top-k (None where the reader has none)
    predicted: Any  # [rows, pos] the model's top-1 next token
    vocab: int
    ids: torch.Tensor  # [rows, pos] on the CPU
    item: Any  # the caller's own data for the batch


def traced_batches(model: Any, reader: Any, batches: Iterable[tuple[torch.Tensor, Any]],
                   ablation: Ablation = NO_ABLATION) -> Iterator[TracedBatch]:
    """Each (ids on the CPU, item) batch's routes, read one batch behind: batch b + 1's forward is
    launched before batch b's trace is read, so a GPU computes the next forward while the CPU reads
    and counts this one. On an accelerator, where the reader reads tensors (`RouteReader.tensors`),
    the routes and predictions stay there as torch tensors (`tracing(on_device=True)`) for
    `RouteStats` to count there, and nothing waits for the device; else they come back as numpy
    arrays without a wait (`tracing(wait=False)`, `host_copy`). On a CPU every forward has finished
    when it returns: the same order, nothing overlaps. The batches come out in the order they went
    in, with the very numbers of one batch at a time."""
    on_device = reader.tensors is not None and model_device(model).type != "cpu"

    def launch(x: torch.Tensor, item: Any) -> tuple:
        with tracing(reader.sites, wait=False, on_device=on_device) as tr:
            logits = model(x, ablation=ablation, float_logits=False).logits  # ranked only: widening is exact
        predicted, done = (logits.argmax(-1), None) if on_device else host_copy(logits.argmax(-1))
        return tr, predicted, done, int(logits.shape[-1]), x, item

    def read(tr, predicted, done, vocab, x, item) -> TracedBatch:
        if on_device:
            routes, topk = reader.tensors(tr)
            return TracedBatch(routes, topk, predicted, vocab, x, item)
        if done is not None:
            done.synchronize()
        return TracedBatch(reader.routes(tr), reader.topk(tr) if reader.topk is not None else None,
                           predicted.numpy(), vocab, x, item)

    pending = None
    for x, item in batches:
        launched = launch(x, item)
        if pending is not None:
            yield read(*pending)
        pending = launched
    if pending is not None:
        yield read(*pending)


def route_stats(model: Any, reader: Any, batches: Iterable[tuple[torch.Tensor, tuple[list[int], list]]],
                layout: S.Layout, ablation: Ablation = NO_ABLATION,
                progress: Callable[[int], None] | None = None) -> S.RouteStats | None:
    """Route statistics over `batches` ((ids on the CPU, (lengths, labels per label column)) each), or
    None when there are none, counted in order while the next batch's forward runs on a GPU
    (`traced_batches`; on a GPU the counting is kernels queued behind it: in session 35 counting on
    the CPU, 4-5 ms of numpy a batch, left the GPU waiting for the next launch, and a second counting
    thread was slower still, its numpy holding the interpreter lock while this one waited to launch).
    `progress(rows counted)` after each batch."""
    stats: S.RouteStats | None = None
    done = 0
    for b in traced_batches(model, reader, batches, ablation):
        lengths, labels = b.item
        if stats is None:
            k = b.topk.shape[-1] if b.topk is not None else 1
            stats = S.RouteStats(dataclasses.replace(layout, k=k), b.vocab)
        stats.add(b.routes, lengths, input_ids=b.ids, predicted=b.predicted, topk=b.topk, labels=labels)
        done += len(lengths)
        if progress is not None:
            progress(done)
    return stats


class Stopped(Exception):
    """A corpus run stopped on request (`stop()` returned True)."""


@torch.inference_mode()
def run_corpus(model: Any, tokenizer: Any, data: CorpusData, *, name: str, settings: CorpusSettings = CorpusSettings(),
               progress: Callable[[int], None] | None = None, stop: Callable[[], bool] | None = None,
               decode: Callable[[int], str] | None = None, ablation: Ablation = NO_ABLATION,
               checkpoint: str | None = None) -> CorpusResult:
    """Statistics of `model` over every row of `data` (module doc), every forward under `ablation`
    (resolved and checked: `analysis.runs.usage.ablation_for`). `progress(rows done)` after each batch;
    `stop()` True ends the run with `Stopped`; `checkpoint`: its directory, whose weights' digest the
    result records (cached: `batch_export.weights_sha256`)."""
    digest = weights_sha256(checkpoint) if checkpoint is not None else ""
    t0 = time.perf_counter()
    layout = layout_of(model, data.label_columns)
    family = family_analysis(model)
    reader = route_reader(model) if layout.routes else None
    limit = min(settings.max_tokens or model.context, model.context)
    pad = max(0, model.config.pad_id)
    stats: S.RouteStats | V.ValueStats | None = None if layout.routes else V.ValueStats(layout)
    notes: list[str] = list(data.notes)
    done = 0

    def batches() -> Iterator[tuple[torch.Tensor, tuple[list[int], list[list[Any]]]]]:
        """(ids on the CPU, (lengths, labels per label column)) of each batch, rows sorted by length."""
        for encoded in _chunks(iter(data), settings.chunk_size, tokenizer, limit):
            chunk, ids = [r for r, _ in encoded], [x for _, x in encoded]
            del encoded
            for r, x in zip(chunk, ids):
                if not x:
                    raise ValueError(f"{data.name}: row {r.row_id}: the text encodes to no tokens")
            order = sorted(range(len(chunk)), key=lambda k: len(ids[k]))
            for s in range(0, len(order), settings.batch_size):
                if stop is not None and stop():
                    raise Stopped()
                part = order[s:s + settings.batch_size]
                lengths = [len(ids[k]) for k in part]
                T = max(lengths)
                x = torch.tensor([ids[k] + [pad] * (T - len(ids[k])) for k in part])
                yield x, (lengths, [[chunk[k].labels[c] for k in part] for c in range(len(layout.label_columns))])

    if reader is not None:
        stats = route_stats(model, reader, batches(), layout, ablation, progress)
        layout = stats.layout if stats is not None else layout
    else:
        for x, (lengths, labels) in batches():
            with tracing() as tr:
                model(x, ablation=ablation)
            views = family.views(tr, model)
            parts, batch_notes = family.export(tr, model, len(lengths), views)
            notes += [n for n in batch_notes if n not in notes]
            parts = [p for p in parts if len(p)]
            stats.add(pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(), lengths, labels)
            done += len(lengths)
            if progress is not None:
                progress(done)
    description = reader.description if reader is not None else (
        f"{model.config.label} has no per-token routes: shown are the values its family exports (per call, e.g. "
        "learned mixing weights or pathway scales, and per token, e.g. contribution shares or gates), summarised "
        "over the corpus." if layout.layers else f"{model.config.label} has no routing layers: nothing to count.")
    return CorpusResult(model=name, family=model.config.label, dataset=data.name, digest=data.digest, layout=layout,
                        stats=stats, settings=settings, seconds=time.perf_counter() - t0, description=description,
                        max_tokens=limit, decode=decode, notes=tuple(notes), ablation=ablation, weights_sha256=digest,
                        dtype=str(next(model.parameters()).dtype).removeprefix("torch."))


def provenance(result: CorpusResult) -> dict[str, Any]:
    """What the CLI's and the page's outputs record about how the statistics were made."""
    return {"model": result.model, "family": result.family, "weights_sha256": result.weights_sha256,
            "dtype": result.dtype, "ablation": result.ablation.describe(), "ablation_specs": list(result.ablation.specs),
            "dataset": result.dataset,
            "dataset_sha256": result.digest, "settings": asdict(result.settings), "max_tokens": result.max_tokens,
            "rows": result.stats.n_rows,
            "tokens": result.stats.n_tokens}


# --- background jobs (the app) ------------------------------------------------------------------------

class CorpusJob:
    """One corpus run on the jobs' thread: progress (rows done of total), then a result or an error
    message. Read by any number of sessions; written by its thread only."""

    def __init__(self, total: int) -> None:
        self.total, self.done = total, 0
        self.result: Any = None
        self.error: str | None = None
        self.started = time.perf_counter()
        self.seconds: float | None = None
        self.finished = threading.Event()

    @property
    def running(self) -> bool:
        return not self.finished.is_set()

    def progress(self, done: int) -> None:
        self.done = done


class CorpusJobs:
    """Corpus runs by key (checkpoint, dataset digest, settings), on one background thread in the
    order asked for; a key asked for again gets its job, running or done (a failed one is run
    again). The last `keep` finished jobs are kept."""

    def __init__(self, keep: int = 8) -> None:
        self.keep = keep
        self._jobs: OrderedDict[Any, CorpusJob] = OrderedDict()
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="routescope-corpus")

    def get(self, key: Any) -> CorpusJob | None:
        with self._lock:
            return self._jobs.get(key)

    def submit(self, key: Any, total: int, work: Callable[[Callable[[int], None]], Any]) -> CorpusJob:
        with self._lock:
            job = self._jobs.get(key)
            if job is not None and not (job.finished.is_set() and job.error is not None):
                self._jobs.move_to_end(key)
                return job
            job = self._jobs[key] = CorpusJob(total)
            self._evict()
        self._pool.submit(self._run, job, work)
        return job

    def forget(self, key: Any) -> None:
        """Drop a finished job (a failed one, before "Run again"): the next `submit` starts it anew."""
        with self._lock:
            job = self._jobs.get(key)
            if job is not None and job.finished.is_set():
                del self._jobs[key]

    def _run(self, job: CorpusJob, work: Callable[[Callable[[int], None]], Any]) -> None:
        job.started = time.perf_counter()
        try:
            job.result = work(job.progress)
        except ValueError as e:
            job.error = str(e)
        except Exception as e:  # shown as one line; the page never gets a traceback
            job.error = f"{type(e).__name__}: {e}"
        finally:
            job.seconds = time.perf_counter() - job.started
            job.finished.set()

    def _evict(self) -> None:
        done = [k for k, j in self._jobs.items() if j.finished.is_set()]
        for k in done[:max(0, len(done) - self.keep)]:
            del self._jobs[k]
