"""`routescope app`, started as the README starts it, on a machine that has never run Streamlit:
it serves without waiting for input, and stopping it stops its Streamlit server."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from procs import free_port, running, wait_for_health

ROOT = Path(__file__).resolve().parents[2]
ROUTESCOPE = Path(sys.executable).with_name("routescope")  # the console script pip put beside python


def new_machine_env(home: Path, **extra: str) -> dict[str, str]:
    """A first run: an empty HOME (no ~/.streamlit), no STREAMLIT_* settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMLIT_")}
    return {**env, "HOME": str(home), **extra}


@contextlib.contextmanager
def serving_app(tmp_path: Path, *flags: str, **env: str) -> Iterator[tuple[subprocess.Popen, str, Path]]:
    """`.venv/bin/routescope app --port P [flags]` with stdin closed and no terminal (a session of
    its own), once /_stcore/health answers ok: (process, url, its output file). Stopped on exit."""
    home = tmp_path / "home"
    home.mkdir()
    port, log = free_port(), tmp_path / "routescope.app.log"
    url = f"http://127.0.0.1:{port}"
    with log.open("wb") as out, running([str(ROUTESCOPE), "app", "--port", str(port), *flags],
                                        stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
                                        env=new_machine_env(home, **env)) as proc:
        try:
            wait_for_health(url, proc)
        except AssertionError as e:
            raise AssertionError(f"{e}; its output:\n{log.read_text(errors='replace')[-3000:]}") from None
        yield proc, url, log


def test_readme_command_serves_with_stdin_closed_and_no_streamlit_config(tmp_path):
    """The README's `.venv/bin/routescope app`, no --headless, on a first run (no
    ~/.streamlit/credentials.toml), stdin closed: it serves. Where there is a display Streamlit is
    not headless and would wait at an "Email:" prompt without --server.showEmailPrompt false (the
    command-line test below checks that flag for every display case)."""
    with serving_app(tmp_path) as (_, _, log):
        pass
    assert "Email" not in log.read_text(errors="replace")
    assert not (tmp_path / "home" / ".streamlit" / "credentials.toml").exists()


@pytest.mark.parametrize("display,flag,headless", [
    ({"DISPLAY": ":0"}, [], "false"), ({"WAYLAND_DISPLAY": "wayland-0"}, [], "false"),
    ({"DISPLAY": ":0"}, ["--headless"], "true"), ({}, [], "true" if sys.platform.startswith("linux") else "false")])
def test_streamlit_command_never_prompts_and_opens_a_browser_only_on_a_display(display, flag, headless):
    """With a display Streamlit is not headless, which is when it would ask for an email on a first
    run: the prompt must be off whatever the display (the served test above runs without one)."""
    from routescope.cli.app import streamlit_command
    from routescope.cli.main import build_parser

    args = build_parser().parse_args(["app", "--port", "8599", *flag])
    cmd = streamlit_command("app/main.py", args, display)
    options = dict(zip(cmd[5::2], cmd[6::2]))
    assert cmd[1:5] == ["-m", "streamlit", "run", "app/main.py"]
    assert options["--server.showEmailPrompt"] == "false" and options["--browser.gatherUsageStats"] == "false"
    assert options["--server.headless"] == headless and options["--server.port"] == "8599"
    assert options["--client.disableDataExport"] == "true"
    assert options["--runner.postScriptGC"] == "false"  # a full gc.collect(2) per run delayed its figures ~120 ms


def _children(pid: int) -> list[int]:
    """Processes whose parent is pid, read from /proc."""
    kids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])  # the name may hold spaces and ")"
        except (OSError, IndexError, ValueError):
            continue
        if ppid == pid:
            kids.append(int(stat.parent.name))
    return kids


def _running(pid: int) -> bool:
    """pid exists and is not a zombie (a zombie runs nothing; its parent has not reaped it yet)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds the Streamlit child in /proc")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGKILL], ids=lambda s: s.name)
def test_stopping_routescope_app_stops_its_streamlit_server(tmp_path, sig):
    """A signal to the routescope process alone (not its group) ends the Streamlit server too:
    passed on, or for SIGKILL, which routescope cannot catch, sent by the kernel (PDEATHSIG)."""
    with serving_app(tmp_path, "--headless") as (proc, url, _):
        servers = [pid for pid in _children(proc.pid)
                   if b"streamlit" in Path(f"/proc/{pid}/cmdline").read_bytes()]
        assert len(servers) == 1, _children(proc.pid)
        os.kill(proc.pid, sig)
        proc.wait(timeout=30)
        deadline = time.monotonic() + 10
        while _running(servers[0]) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _running(servers[0]), f"streamlit {servers[0]} outlived routescope"
        with pytest.raises(OSError):
            urllib.request.urlopen(url + "/_stcore/health", timeout=2)


def test_streamlit_run_from_the_repository_skips_the_collection_after_each_run():
    """`streamlit run app/main.py` from the repository reads .streamlit/config.toml: the same choice
    as `routescope app` (Python's own collector still runs)."""
    import tomllib

    config = tomllib.loads((Path(__file__).resolve().parents[2] / ".streamlit" / "config.toml").read_text("utf-8"))
    assert config["runner"]["postScriptGC"] is False
