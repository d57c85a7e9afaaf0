"""One `routescope app` server for every browser test of a run (the Chromium they drive is the
session's `browser`, tests/conftest.py).

The server reads one extra checkpoint root, empty when it starts: a module that needs a model of its
own (the 128-expert OLMoE of test_browser_experts, the 128 x 24 and x 48 Qwen3-MoE of
test_browser_scale) saves it there with `extra_checkpoint`, and the app lists it at its next rerun
(the sidebar reads the roots on every run). Checkpoints are picked by name, so an added one changes
no other test's page; the shipped default stays the default.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from procs import free_port, running, wait_for_health

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts"


@pytest.fixture(scope="session")
def extra_root(tmp_path_factory) -> Path:
    """The server's extra checkpoint root (ROUTESCOPE_CHECKPOINTS)."""
    return tmp_path_factory.mktemp("app-checkpoints")


@pytest.fixture(scope="session")
def app_server(extra_root, tmp_path_factory):
    """The app in a session of its own, stopped with everything it started (procs.running), also
    when a test fails or the run is interrupted. Yields a dict: url, and `opened`, the tests that
    asked for it so far (a timing test can tell whether it met a cold cache)."""
    port = free_port()
    # TMPDIR of its own: the Experts view resumes from rows cached there, and rows left by an earlier
    # run would finish a sweep before the test sees its progress
    env = {**os.environ, "ROUTESCOPE_THREADS": "1", "ROUTESCOPE_CHECKPOINTS": str(extra_root),
           "TMPDIR": str(tmp_path_factory.mktemp("app-tmp"))}
    ARTIFACTS.mkdir(exist_ok=True)
    url = f"http://127.0.0.1:{port}"
    # the app's output is kept (an unread pipe could fill and stall it)
    with (ARTIFACTS / "routescope.app.log").open("w") as log, \
            running([sys.executable, "-m", "routescope.cli", "app", "--port", str(port), "--headless", "--address",
                     "127.0.0.1"], cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=log,
                    stderr=subprocess.STDOUT) as proc:
        wait_for_health(url, proc)
        yield {"url": url, "opened": []}


@pytest.fixture
def app_url(app_server, request) -> str:
    app_server["opened"].append(request.node.nodeid)
    return app_server["url"]


@pytest.fixture
def app_first(app_server, app_url, request) -> bool:
    """True when the requesting test is the first of this run to use the server (its caches are cold)."""
    return app_server["opened"][0] == request.node.nodeid


@pytest.fixture(scope="session")
def extra_checkpoint(extra_root):
    """extra_checkpoint(name, build) -> the directory `name` in the server's extra root, made once per
    run by build(path) (a function that saves a checkpoint at path)."""
    def make(name: str, build) -> Path:
        path = extra_root / name
        if not path.exists():
            part = extra_root / f".{name}.partial"  # hidden until complete: the app never lists half a model
            build(part)
            part.rename(path)
        return path
    return make
