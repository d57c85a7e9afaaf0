"""Attributions as background jobs, one per browser session, that a Cancel button stops between forwards.

A `Job` runs one attribution (exact ablation, Shapley sampling or integrated gradients) on a thread of
its own, so the page stays live: it reports progress and stops, raising `Stopped` inside the analysis
loop, before the next forward (IG: the next batch of integration steps) once its `cancel` event is
set. The job lives in the session state of the session that started it, never on a shared module;
the model it runs is the shared instance, which takes its ablation per call. What a finished job
computed goes into `finished()`, shared by every session and keyed by everything that determines it;
a stopped or failed job leaves nothing there.
"""
from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import Any, Callable

import streamlit as st
from streamlit.runtime import Runtime
from streamlit.runtime.scriptrunner import get_script_run_ctx

from routescope.analysis.runs.attribution import Stopped

KEEP = 64  # finished attributions kept (every session's, newest last)
# Work: work(progress, stop) -> result; progress(done, total) as the analysis counts them, stop() -> bool
Work = Callable[[Callable[[int, int], None], Callable[[], bool]], Any]


class Job:
    """One attribution on a thread of its own. `spec`: what it computes (its key in `store`).
    Written by its thread only; read by the session's reruns."""

    def __init__(self, spec: tuple, work: Work, store: "Finished", alive: Callable[[], bool] = lambda: True) -> None:
        """`alive()`: whether the browser session that started it is still connected (`session_alive`);
        the job stops, as on Cancel, once it is not (a closed tab leaves no job running to its end)."""
        self.spec, self.store, self.alive = spec, store, alive  # store: finished(), got on the script thread
        self.done, self.total = 0, 0
        self.cancel = threading.Event()  # set by Cancel (or a changed target): the loop stops at its next check
        self.finished = threading.Event()
        self.result: Any = None
        self.error: Exception | None = None
        self.stopped = False
        self.started = time.perf_counter()
        self.seconds: float | None = None
        threading.Thread(target=self._run, args=(work,), name="routescope-attribution", daemon=True).start()

    @property
    def running(self) -> bool:
        return not self.finished.is_set()

    def progress(self, done: int, total: int) -> None:
        self.done, self.total = done, total

    def left(self) -> float | None:
        """Seconds left at the pace so far (None before the first step)."""
        if not self.done or not self.total:
            return None
        return (time.perf_counter() - self.started) / self.done * (self.total - self.done)

    def should_stop(self) -> bool:
        """Checked before each forward: Cancel was pressed, or the session is gone."""
        if not self.cancel.is_set() and not self.alive():
            self.cancel.set()
        return self.cancel.is_set()

    def _run(self, work: Work) -> None:
        try:
            self.result = work(self.progress, self.should_stop)
            self.store[self.spec] = self.result
        except Stopped:
            self.stopped = True
        except Exception as e:  # one line on the page, never a traceback
            self.error = e
        finally:
            self.seconds = time.perf_counter() - self.started
            self.finished.set()


class Finished:
    """Finished attributions by spec, the newest `keep`; thread-safe (jobs write from their threads)."""

    def __init__(self, keep: int = KEEP) -> None:
        self.keep = keep
        self._done: OrderedDict[tuple, Any] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, spec: tuple) -> Any:
        with self._lock:
            return self._done.get(spec)

    def __setitem__(self, spec: tuple, result: Any) -> None:
        with self._lock:
            self._done[spec] = result
            self._done.move_to_end(spec)
            while len(self._done) > self.keep:
                self._done.popitem(last=False)


def session_alive() -> Callable[[], bool]:
    """For a job started from this script run: whether its browser session is still connected
    (Streamlit's runtime; a disconnect, a closed tab or a reload, ends it). Always True where there is
    no runtime (AppTest, scripts)."""
    ctx = get_script_run_ctx()
    if ctx is None or not Runtime.exists():
        return lambda: True
    runtime, session = Runtime.instance(), ctx.session_id
    return lambda: runtime.is_active_session(session)


@st.cache_resource(show_spinner=False)
def finished() -> Finished:
    return Finished()
