"""`routescope app`, started as the README starts it, on a machine that has never run Streamlit:
it serves without waiting for input, and stopping it stops its Streamlit server."""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

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
    port, log = free_port(), tmp_path / "app.log"
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
    """The README's `.venv/bin/routescope app`, no --headless: Streamlit is not headless, so on its
    first run (no ~/.streamlit/credentials.toml) it would wait at an "Email:" prompt. Its attempt
    to open a browser may fail (no display here): harmless."""
    with serving_app(tmp_path) as (_, _, log):
        pass
    assert "Email" not in log.read_text(errors="replace")
    assert not (tmp_path / "home" / ".streamlit" / "credentials.toml").exists()
