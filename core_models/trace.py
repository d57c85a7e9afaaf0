"""Tracing: tensors recorded at routing sites during the calls made inside `tracing(...)`, and the
host copies they are kept as (CPU, float32 for reduced-precision models; deferred on a GPU).

The active trace lives in a ContextVar, like `run_state`'s call state: concurrent calls in other
threads never record into each other's traces.
"""
from __future__ import annotations

import contextlib
from contextvars import ContextVar
from typing import Callable, Iterator

import torch

SiteEdit = Callable[[torch.Tensor], torch.Tensor]


class Trace:
    """Tensors recorded at routing sites during the calls made inside `tracing(...)`.

    Each visit stores a detached CPU copy (float32 for a bfloat16/float16 model), wherever the
    model runs. Calls made during generation append one record per
    step; `trace[name]` concatenates records of sites with a position axis along that axis.

    On a GPU a visit only clones the tensor on the device (one kernel, no wait). The clones go to
    pinned host memory together, one copy per dtype, when the trace is read, when `tracing` exits,
    or when they pass `DEVICE_BYTES`; reading waits for that copy. A visit used to allocate pinned
    memory, copy and record an event of its own: about 100 us of launch time per site on an H200,
    3.3 ms of a 16-layer forward that launches in 21 ms (session 35). A trace made `on_device`
    keeps an accelerator's records there as computed (its reader reduces them there: the corpus).
    """

    DEVICE_BYTES = 64 << 20  # clones held on the device before they are sent to the host
    deferred_copies = True  # False: each CUDA record copied to the CPU at its visit, with a wait

    def __init__(self, sites: list[str] | tuple[str, ...] | None = None,
                 edits: dict[str, SiteEdit] | None = None, *, on_device: bool = False) -> None:
        self.wanted = None if sites is None else frozenset(sites)
        self.on_device = on_device  # records of an accelerator's tensors stay there, as computed (no host copy)
        self.edits = dict(edits or {})
        self._records: dict[str, list[torch.Tensor]] = {}
        self.pos_axis: dict[str, int | None] = {}
        self.shapes: dict[str, str] = {}
        self._on_device: list[tuple[list, int, torch.Tensor]] = []  # (record list, index, device clone)
        self._device_bytes = 0
        # (pinned host buffer, [(record list, index, shape, offset)], event) per copy still in flight
        self._in_flight: list[tuple[torch.Tensor, list[tuple[list, int, torch.Size, int]], torch.cuda.Event]] = []

    @property
    def records(self) -> dict[str, list[torch.Tensor]]:
        """Site -> its records, every copy finished (reading waits for copies still in flight)."""
        self.settle()
        return self._records

    def send(self) -> None:
        """Start copying the device clones to the host, one copy per (device, dtype), without a wait."""
        groups: dict[tuple[torch.device, torch.dtype], list[tuple[list, int, torch.Tensor]]] = {}
        for rec in self._on_device:
            groups.setdefault((rec[2].device, rec[2].dtype), []).append(rec)
        self._on_device, self._device_bytes = [], 0
        for (device, dtype), group in groups.items():
            with torch.cuda.device(device):
                flat = torch.cat([t.reshape(-1) for _, _, t in group])
                host = torch.empty(flat.shape, dtype=dtype, pin_memory=True)
                host.copy_(flat, non_blocking=True)
                done = torch.cuda.Event()
                done.record()
            slots, offset = [], 0
            for recs, i, t in group:
                slots.append((recs, i, t.shape, offset))
                offset += t.numel()
            self._in_flight.append((host, slots, done))

    def settle(self) -> None:
        """Wait for the device-to-host copies of this trace's records and put each in its place (a
        no-op when none is on the device or in flight)."""
        if self._on_device:
            self.send()
        for host, slots, done in self._in_flight:
            done.synchronize()
            for recs, i, shape, offset in slots:
                v = host[offset:offset + shape.numel()].view(shape)  # a copy of its own: the pinned
                recs[i] = v.float() if v.dtype in _REDUCED else v.clone()  # buffer goes back to torch's cache
        self._in_flight = []

    def wants(self, name: str) -> bool:
        return self.wanted is None or name in self.wanted or name in self.edits

    def visit(self, name: str, x: torch.Tensor, pos_axis: int | None, shape: str) -> torch.Tensor:
        edit = self.edits.get(name)
        if edit is not None:
            x = edit(x)
        if self.wanted is None or name in self.wanted:
            recs = self._records.get(name)
            if recs is None:
                recs = self._records[name] = []
                self.pos_axis[name] = pos_axis
                self.shapes[name] = shape
            if self.on_device and not (x.is_cpu or x.is_meta):
                recs.append(x.detach().clone())
            elif x.is_cuda and self.deferred_copies:  # a device clone now, sent to the host with the others
                clone = x.detach().clone()
                self._on_device.append((recs, len(recs), clone))
                recs.append(clone)  # replaced by its host copy when the trace settles
                self._device_bytes += clone.numel() * clone.element_size()
                if self._device_bytes > self.DEVICE_BYTES:
                    self.send()
            else:
                recs.append(_record(x))
        return x

    def names(self) -> list[str]:
        return list(self._records)

    def __contains__(self, name: str) -> bool:
        return name in self._records

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self.records:
            raise KeyError(f"site {name!r} was not recorded; recorded: {', '.join(self.records) or 'none'}")
        recs = self.records[name]
        if len(recs) == 1:
            return recs[0]
        axis = self.pos_axis[name]
        if axis is None:
            return recs[-1]  # position-free sites (e.g. learned weights) repeat per step
        return torch.cat(recs, dim=axis)

    def steps(self, name: str) -> list[torch.Tensor]:
        return list(self.records[name])


_REDUCED = (torch.bfloat16, torch.float16)


def _record(x: torch.Tensor) -> torch.Tensor:
    """The copy a trace keeps: detached, on the CPU, reduced-precision floats widened to float32
    (exact), so analyses, numpy and the export read any model's trace alike. Taken when the site
    fires: the copy is needed anyway, so a GPU model pays one device-to-host copy instead of a
    device clone, and no trace holds device memory. A CPU float32 tensor is cloned (the fast path);
    a model on the meta device records shapes (meta tensors: there is no data to copy)."""
    if x.is_cpu and x.dtype not in _REDUCED:
        return x.detach().clone() if x.requires_grad else x.clone()
    dtype = torch.float32 if x.dtype in _REDUCED else x.dtype
    if x.is_meta:
        return x.detach().to(dtype=dtype)
    return x.detach().to(device="cpu", dtype=dtype, copy=True)


def _record_async(x: torch.Tensor) -> torch.Tensor:
    """`_record` of a CUDA tensor without a wait: widened on the device, copied into pinned host
    memory on the current stream (later kernels that reuse `x`'s memory run after the copy). Not to
    be read before an event recorded after it completes (`host_copy`). A synchronous copy would make
    the CPU wait for the GPU, leaving it idle while the next kernels are launched."""
    src = x.detach()
    if src.dtype in _REDUCED:
        src = src.float()
    out = torch.empty(src.shape, dtype=src.dtype, pin_memory=True)
    return out.copy_(src, non_blocking=True)


def host_copy(x: torch.Tensor) -> tuple[torch.Tensor, "torch.cuda.Event | None"]:
    """`x` on the CPU as `_record` keeps it, without waiting for a GPU: (the copy, and an event to
    synchronize before reading it, or None when the copy is already complete)."""
    if not x.is_cuda:
        return _record(x), None
    out = _record_async(x)
    done = torch.cuda.Event()
    done.record()
    return out, done


_TRACE: ContextVar[Trace | None] = ContextVar("routescope_trace", default=None)


@contextlib.contextmanager
def tracing(sites: list[str] | tuple[str, ...] | None = None,
            edits: dict[str, SiteEdit] | None = None, *, wait: bool = True, on_device: bool = False) -> Iterator[Trace]:
    """Record the named sites (None = all) of every forward in this context, in this thread.
    `wait=False`: leave without waiting for device-to-host copies still in flight (reading the trace
    waits), so a caller can launch the next forward while a GPU finishes this one. `on_device`: keep
    an accelerator's records there, in the dtype computed, for a caller that reduces them there (a
    GPU corpus counts its routes on the GPU)."""
    tr = Trace(sites, edits, on_device=on_device)
    token = _TRACE.set(tr)
    try:
        yield tr
    finally:
        _TRACE.reset(token)
        tr.settle() if wait else tr.send()


def active_trace() -> Trace | None:
    return _TRACE.get()
