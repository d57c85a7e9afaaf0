"""Long-running processes the tests start (the app, a server): each in a session of its own, so
stopping it stops everything it started, and always stopped, on failure and timeout too.

`running(cmd)` is the one way tests start such a process. scripts/test checks after pytest that no
process the suite started is left (they all carry ROUTESCOPE_TEST_RUN in their environment).
"""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator

GRACE = 10.0  # seconds from SIGTERM to SIGKILL


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


def stop(proc: subprocess.Popen, grace: float = GRACE) -> None:
    """SIGTERM to the child's whole process group (its id is the leader's pid); SIGKILL to
    whatever is left of it after `grace` s."""
    pgid = proc.pid
    _signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while proc.poll() is None or _group_alive(pgid):
        if time.monotonic() > deadline:
            _signal_group(pgid, signal.SIGKILL)
            proc.wait(timeout=grace)
            break
        time.sleep(0.05)


@contextlib.contextmanager
def running(cmd: list[str], grace: float = GRACE, **popen_kw) -> Iterator[subprocess.Popen]:
    """Start cmd as the leader of a new session (no controlling terminal); stop its whole process
    group when the block ends, however it ends."""
    proc = subprocess.Popen(cmd, start_new_session=True, **popen_kw)
    try:
        yield proc
    finally:
        stop(proc, grace)


def wait_for_health(url: str, proc: subprocess.Popen, timeout: float = 90.0) -> float:
    """Poll a Streamlit server's /_stcore/health until it answers "ok"; seconds it took. Fails early
    if the process ends, and after `timeout` s."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if proc.poll() is not None:
            raise AssertionError(f"{proc.args} exited with {proc.returncode} before serving {url}")
        try:
            with urllib.request.urlopen(url + "/_stcore/health", timeout=2) as r:
                if r.read().decode().strip() == "ok":
                    return time.monotonic() - start
        except OSError:
            pass
        time.sleep(0.25)
    raise AssertionError(f"{url}/_stcore/health did not answer ok within {timeout:.0f} s")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def carrying(name: str, value: str) -> list[int]:
    """Pids of the processes whose environment holds name=value (what scripts/test checks after pytest),
    this process excluded."""
    want, pids = f"{name}={value}".encode(), []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if want in f.read().split(b"\0"):
                    pids.append(int(entry))
        except OSError:  # gone, or not ours to read
            continue
    return pids


def wait_gone(name: str, value: str, timeout: float = 30.0) -> list[int]:
    """carrying(name, value) once it is empty or `timeout` s passed (processes take a moment to exit)."""
    deadline = time.monotonic() + timeout
    while (left := carrying(name, value)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left
