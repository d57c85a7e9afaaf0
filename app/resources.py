"""Cached resources, shared by every browser session: loaded checkpoints and analysed runs.

Both are keyed by everything that changes them (checkpoint path and modification time; prompt,
settings and ablation), and are read-only once made, so sessions never see each other's state.
"""
from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import streamlit as st
import torch

from routescope.analysis.runs.effects import ablation_effects
from routescope.analysis.environment import app_threads, device_setting, max_upload_bytes, placement_setting
from routescope.analysis.runs.session import RunSettings, run_prompt, run_table
from routescope.analysis.runs.usage import run_usage
from routescope.analysis.export.table_files import table_bytes
from routescope.core_models.ablation import Ablation
from routescope.core_models.checkpoint import CONFIG, TOKENIZER, WEIGHTS, load_checkpoint, weight_files
from routescope.core_models.devices import resolve_device

from routescope.rendering.route_grid import route_grid_html

from routescope.app.messages import without_dir
from routescope.app.views import routing

# Small models run fastest on one thread, and a second thread would fight other sessions.
torch.set_num_threads(app_threads())

MAX_UPLOAD_BYTES = max_upload_bytes()
UPLOAD_FILES = (CONFIG, WEIGHTS, TOKENIZER)


def stamp(path: str) -> float:
    """Modification time of a checkpoint's weights: a retrained checkpoint is reloaded."""
    try:
        return max((os.path.getmtime(f) for f in weight_files(path)), default=0.0)
    except OSError:
        return 0.0


def device_label() -> str:
    """What the sidebar shows: the device models run on and their dtype ("cuda · bfloat16 (auto)")."""
    device, dtype = device_setting()
    try:
        where = str(resolve_device(device))
    except ValueError as e:
        return str(e)
    spread = " · device map auto" if placement_setting()[0] == "auto" else ""
    return f"{where} · {'dtype as stored' if dtype == 'auto' else dtype}" + (" (auto)" if device == "auto" else "") \
        + spread


def load(path: str, mtime: float):
    """(model, tokenizer) of a checkpoint on the app's device, loaded once per process."""
    return _load(path, mtime, *device_setting(), *placement_setting())


@st.cache_resource(max_entries=24, show_spinner="Loading checkpoint…")
def _load(path: str, mtime: float, device: str, dtype: str, device_map: str = "none", max_memory: str | None = None):
    return load_checkpoint(path, device=device, dtype=dtype, device_map=device_map, max_memory=max_memory)


@st.cache_resource(max_entries=256, show_spinner=False)
def run(path: str, mtime: float, prompt: str, settings: RunSettings, ablation: Ablation):
    model, tok = load(path, mtime)
    return run_prompt(model, tok, prompt, settings=settings, ablation=ablation, model_name=Path(path).name,
                      table=False)  # built for the Export view only (`export_bytes`)


@st.cache_resource(max_entries=64, show_spinner=False)
def routing_figures(path: str, mtime: float, prompt: str, settings: RunSettings, ablation: Ablation):
    """The Routing view's figures of a run (choice heatmaps stacked), built once per run: switching
    an ablation back, or views, redraws them without rebuilding. Read-only once made."""
    return routing.drawn(run(path, mtime, prompt, settings, ablation), load(path, mtime)[0], stacked=True,
                         layered=True)


@st.cache_resource(max_entries=64, show_spinner=False)
def route_grid(path: str, mtime: float, prompt: str, settings: RunSettings, ablation: Ablation) -> str:
    """The run's choice heatmaps as one HTML grid (`components.route_grid`): painted with the page's
    first data, before plotly.js has loaded. Built once per run from the grids `routing_figures`
    drew (one drawing serves both); read-only."""
    cur = run(path, mtime, prompt, settings, ablation)
    grids = routing_figures(path, mtime, prompt, settings, ablation).grids
    return route_grid_html(grids, cur.display_tokens(), cur.n_prompt)


@st.cache_resource(max_entries=64, show_spinner="Preparing the export…")
def export_bytes(path: str, mtime: float, prompt: str, settings: RunSettings, ablation: Ablation) -> dict[str, bytes]:
    """The routing table of a run as CSV and Parquet bytes (built once per run)."""
    table = run_table(run(path, mtime, prompt, settings, ablation), load(path, mtime)[0])
    return {fmt: table_bytes(table, fmt) for fmt in ("csv", "parquet")}


@st.cache_resource(max_entries=256, show_spinner=False)
def effects(path: str, mtime: float, ids: tuple[int, ...], ablation: Ablation, routing: str, seed: int):
    model, _ = load(path, mtime)
    return ablation_effects(model, list(ids), ablation, routing=routing, seed=seed)


@st.cache_resource(max_entries=64, show_spinner=False)
def usage(path: str, mtime: float, ids: tuple[int, ...]):
    """Picks per option of the unablated model on these tokens: what "top N" specs rank by."""
    model, _ = load(path, mtime)
    return run_usage(model, [list(ids)])


class UploadRejected(ValueError):
    """An upload that is not a loadable checkpoint; names files as uploaded, never a server path.
    `problems`: every problem when the loader listed them (config vs weights)."""

    def __init__(self, message: str, problems: list[str] | None = None) -> None:
        super().__init__(message)
        self.problems = problems or []


PICKLE_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt", ".pkl", ".pickle")  # torch.save & co.: unpickling runs code


def upload_problems(files) -> list[str]:
    """What keeps the picked files from being one checkpoint, most fundamental first, each naming its
    files: pickle-based weights (refused unopened), a name picked twice (the picker keeps adding
    files: which of the two was meant is not ours to guess), unknown files, missing ones."""
    names = [f.name for f in files]
    problems = []
    pickles = [n for n in names if Path(n).suffix.lower() in PICKLE_SUFFIXES]
    if pickles:
        problems.append(f"{', '.join(pickles)}: pickle-based weights are refused (loading a pickle can run code): "
                        f"convert with safetensors, safetensors.torch.save_file(state_dict, '{WEIGHTS}')")
    twice = [n for n in dict.fromkeys(names) if names.count(n) > 1]
    if twice:
        problems.append(f"{', '.join(twice)} picked more than once: remove the extra one(s) from the list (x) so "
                        f"each file is there once")
    unknown = [n for n in dict.fromkeys(names) if n not in UPLOAD_FILES and n not in pickles]
    if unknown:
        problems.append(f"unexpected file(s) {', '.join(unknown)}: a checkpoint is {', '.join(UPLOAD_FILES)}")
    missing = [n for n in (CONFIG, WEIGHTS) if n not in names]
    if missing and not pickles:
        problems.append(f"upload {', '.join(missing)} too (a checkpoint is {', '.join(UPLOAD_FILES)})")
    return problems


def save_upload(files) -> str:
    """Write uploaded checkpoint files to a fresh directory and validate it by loading it.
    Raises ValueError naming the problem and the uploaded file (`upload_problems` first); nothing
    half-written is kept."""
    problems = upload_problems(files)
    if problems:
        raise ValueError("; ".join(problems))
    for f in files:
        if f.size > MAX_UPLOAD_BYTES:
            raise ValueError(f"{f.name} is {f.size / 2**20:.0f} MB; the limit is {MAX_UPLOAD_BYTES // 2**20} MB")
    root = Path(tempfile.mkdtemp(prefix="routescope-upload-"))
    try:
        for f in files:
            (root / f.name).write_bytes(f.getvalue())
        load_checkpoint(root)  # validates config, every tensor name and shape, the tokenizer
    except Exception as e:
        shutil.rmtree(root, ignore_errors=True)
        message = without_dir(str(e), root, "the upload")  # the uploaded files by their names
        problems = [without_dir(p, root, "the upload") for p in getattr(e, "problems", None) or []]
        raise UploadRejected(message if isinstance(e, ValueError) else f"{type(e).__name__}: {message}",
                             problems) from None
    atexit.register(shutil.rmtree, root, ignore_errors=True)  # an upload lives as long as the app process
    return str(root)
