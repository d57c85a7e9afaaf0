"""Cached resources of the Corpus view, shared by every browser session: checked datasets, the
background corpus jobs (`analysis.corpus.run.CorpusJobs`, one thread) and their tables. Keyed by
everything that changes them (checkpoint path, weights' mtime and the app's device; the dataset's
digest; the settings); read-only once made."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pandas as pd
import streamlit as st

from routescope.analysis.corpus import compare as CMP
from routescope.analysis.inputs import datasets as D
from routescope.analysis.corpus import shipped as SH
from routescope.analysis.corpus.run import CorpusJob, CorpusJobs, CorpusResult, CorpusSettings, run_corpus
from routescope.analysis.environment import device_setting
from routescope.analysis.export.run_table import TokenText
from routescope.core_models.ablation import NO_ABLATION, Ablation

from routescope.app import resources


@st.cache_resource(show_spinner=False)
def jobs() -> CorpusJobs:
    return CorpusJobs(keep=8)


@st.cache_resource(max_entries=8, show_spinner="Reading the dataset…")
def shipped(name: str) -> D.CorpusData:
    return SH.shipped(name)


@st.cache_resource(max_entries=8, show_spinner="Checking the dataset…")
def uploaded(name: str, file_id: str, _data: bytes) -> D.CorpusData:
    """An uploaded file, checked within the app's limits (the upload's id is the cache key)."""
    return D.load_corpus(_data, name, limits=D.APP_LIMITS)


def server_file(path: str) -> D.CorpusData:
    """A file on the server, checked within the app's limits (re-read when it changes)."""
    try:
        st_ = os.stat(path)
        stamp = (st_.st_size, st_.st_mtime_ns)
    except OSError:
        stamp = (0, 0)  # load_corpus names the problem
    return _server_file(path, stamp)


@st.cache_resource(max_entries=8, show_spinner="Checking the dataset…")
def _server_file(path: str, stamp: tuple[int, int]) -> D.CorpusData:
    return D.load_corpus(path, limits=D.APP_LIMITS)


def job_key(path: str, mtime: float, data: D.CorpusData, settings: CorpusSettings,
            ablation: Ablation = NO_ABLATION) -> tuple:
    return (path, mtime, device_setting(), data.digest, settings, ablation)


def job(path: str, mtime: float, data: D.CorpusData, settings: CorpusSettings,
        ablation: Ablation = NO_ABLATION) -> CorpusJob:
    """The corpus job of a checkpoint over a dataset under `ablation`: started on the jobs' thread
    when new, else the running or finished one (a failed one too: the view shows its error until
    "Run again" forgets it; starting it again on every rerun looped)."""
    key = job_key(path, mtime, data, settings, ablation)
    found = jobs().get(key)
    if found is not None:
        return found
    model, tok = resources.load(path, mtime)
    text = TokenText(tok)

    def work(progress) -> CorpusResult:
        ablation.validate(model.routing_layers(), model.ablation_modes(), model.routing_top_k())  # the left column's
        return run_corpus(model, tok, data, name=Path(path).name, settings=settings, progress=progress,
                          decode=lambda i: text([i])[0], ablation=ablation, checkpoint=path)

    return jobs().submit(key, data.n_rows, work)


@st.cache_resource(max_entries=32, show_spinner=False)
def tables(key: tuple, top: int, min_count: int, intended: tuple) -> dict[str, pd.DataFrame]:
    """The tables of a finished job (read-only once made)."""
    result = jobs().get(key).result
    return result.tables(top=top, min_count=min_count, intended={c: dict(m) for c, m in intended})


@st.cache_resource(max_entries=16, show_spinner=False)
def compared(key_a: tuple, key_b: tuple, top: int, min_count: int, intended: tuple) -> dict[str, pd.DataFrame]:
    return CMP.compare_tables(tables(key_a, top, min_count, intended), tables(key_b, top, min_count, intended))


def frozen(intended: dict[str, dict[str, int]]) -> tuple:
    """An intended-options mapping as a hashable cache key."""
    return tuple(sorted((c, tuple(sorted(m.items()))) for c, m in intended.items()))


def result(key: tuple) -> Any:
    return jobs().get(key).result
