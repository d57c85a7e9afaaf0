"""`routescope app`: start the Streamlit explorer (app/main.py) and stop it when stopped."""
from __future__ import annotations

import argparse
import ctypes
import importlib.util
import os
import signal
import subprocess
import sys

from routescope.analysis.environment import app_environment
from routescope.core_models.devices import parse_max_memory, resolve_device


def run_child(cmd: list[str], grace: float = 10.0, **popen_kw) -> int:
    """Run cmd as a child and return its exit status (128 + n if signal n ended it). SIGINT,
    SIGTERM and SIGHUP sent to this process are passed on to the child, which is waited for, so
    stopping routescope stops what it started; if we leave by an exception the child is terminated
    (killed after `grace` s). On Linux the kernel also sends it SIGTERM if routescope is killed
    outright (SIGKILL)."""
    child = subprocess.Popen(cmd, preexec_fn=_term_with_parent if sys.platform == "linux" else None, **popen_kw)
    forwarded = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {s: signal.signal(s, lambda signum, _frame: child.send_signal(signum)) for s in forwarded}
    try:
        rc = child.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if child.poll() is None:
            child.terminate()
            try:
                child.wait(grace)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
    return rc if rc >= 0 else 128 - rc


def _term_with_parent() -> None:
    """In the child before exec (Linux): SIGTERM when the parent dies (prctl PR_SET_PDEATHSIG)."""
    ctypes.CDLL(None).prctl(1, signal.SIGTERM)


def streamlit_command(main: str, args: argparse.Namespace, env: dict[str, str]) -> list[str]:
    """The `streamlit run` command line: never a prompt, no usage statistics, no raw CSV export."""
    # no display (a server, CI): never try to open a browser, which could start a console one
    headless = args.headless or (sys.platform.startswith("linux")
                                 and not (env.get("DISPLAY") or env.get("WAYLAND_DISPLAY")))
    cmd = [sys.executable, "-m", "streamlit", "run", main, "--server.port", str(args.port),
           "--server.headless", "true" if headless else "false", "--server.showEmailPrompt", "false",
           "--browser.gatherUsageStats", "false",
           "--client.disableDataExport", "true",  # st.dataframe's own CSV download skips our CSV writer
           "--runner.postScriptGC", "false"]  # a full collection after each run delays its last messages
    if args.address:
        cmd += ["--server.address", args.address]
    return cmd


def run(args: argparse.Namespace) -> int:
    """Start the Streamlit explorer on the shipped checkpoints and wait for it; stopping routescope
    (Ctrl-C, SIGTERM, SIGHUP) stops the Streamlit server too (run_child).

    Never waits for input: Streamlit's first-run "Email:" prompt is off (it blocked a new machine,
    terminal or not), and so are usage statistics. Without --headless Streamlit opens a browser when
    there is a display to open it on."""
    spec = importlib.util.find_spec("routescope.app")  # locate the file only; nothing imports app/
    if spec is None or not spec.submodule_search_locations:
        raise ValueError("the app package is not installed; run pip install -e . from the repository")
    main = os.path.join(list(spec.submodule_search_locations)[0], "main.py")
    resolve_device(args.device)  # an unavailable device stops here, in one line, not in the browser
    parse_max_memory(args.max_memory)  # and a malformed --max-memory
    if args.max_memory and args.device_map == "none":
        raise ValueError("--max-memory applies with --device-map auto")
    env = app_environment(args.device, args.dtype, args.checkpoints or (),  # read by app/resources.py
                          device_map=args.device_map, max_memory=args.max_memory)
    cmd = streamlit_command(main, args, env)
    return run_child(cmd, env=env, cwd=os.path.dirname(os.path.dirname(main)))
