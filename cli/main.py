"""`routescope`: the top-level parser (the commands' parsers are `cli.parsers`), running the command,
and the one error style.

Every way a command ends is one line on stderr at most, never a traceback:

- bad input (ValueError, FileNotFoundError from a handler; argparse errors): `routescope <cmd>: ...`,
  exit 2;
- Ctrl-C (SIGINT), SIGTERM or SIGHUP: `routescope <cmd>: interrupted (SIGINT)`, exit 128 + the
  signal's number (130, 143, 129). SIGTERM and SIGHUP are turned into an exception like Ctrl-C, so
  what a command was writing is cleaned up on the way out (`ExportWriter` deletes its temporary
  files); only SIGKILL skips that, and the next run into the same output removes what it left;
- anything else (an OS error such as a full disk, out of memory, or a bug): one line naming it,
  exit 1; `ROUTESCOPE_TRACEBACK=1` shows the traceback of an unexpected one.
"""
from __future__ import annotations

import logging
import os
import signal
import sys
import threading

from . import options as O
from . import parsers

STOP_SIGNALS = tuple(getattr(signal, s) for s in ("SIGTERM", "SIGHUP") if hasattr(signal, s))  # SIGINT: Python's own


class Stopped(BaseException):
    """A stop signal (SIGTERM, SIGHUP) raised where the program was, like KeyboardInterrupt for
    SIGINT, so `finally` blocks and context managers clean up. A BaseException: handlers of
    Exception do not swallow it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _raise_stopped(signum: int, _frame) -> None:
    raise Stopped(signum)


def build_parser() -> O.Parser:
    p = O.Parser(prog="routescope", description="Routing analysis for parallel-path LMs",
                 epilog="Errors are one line on stderr: bad input exits 2, an interrupt 128 + the signal "
                        "(Ctrl-C 130, SIGTERM 143), anything else 1. Outputs that exist are replaced; "
                        "each command says which.")
    p.add_argument("--threads", type=O.threads, default=0,
                   help=f"torch CPU threads, 1..{O.max_threads()} (default 0: torch's choice; 1 is best when "
                        f"the cores are busy)")
    parsers.add_all(p.add_subparsers(dest="command", required=True))
    return p


def main(argv: list[str] | None = None) -> int:
    """Run one command; the exit status (module doc). Stop signals are handled only while it runs
    (the previous handlers come back), and only in the main thread, where Python delivers them."""
    previous = {}
    if threading.current_thread() is threading.main_thread():
        previous = {s: signal.signal(s, _raise_stopped) for s in STOP_SIGNALS}
    try:
        return _main(argv)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _main(argv: list[str] | None) -> int:
    command = "routescope"
    try:
        logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
        args = build_parser().parse_args(argv)
        command = f"routescope {args.command}"
        if args.threads:
            import torch  # only when a command runs: building the parser (--help) imports no torch
            torch.set_num_threads(args.threads)
        return parsers.run_command(args)
    except BrokenPipeError:  # output piped into head & co.
        _quiet_stdout()
        return 0
    except (ValueError, FileNotFoundError) as e:  # our errors name the problem; no traceback
        return _say(command, str(e), 2)
    except KeyboardInterrupt:
        return _say(command, "interrupted (SIGINT)", 128 + signal.SIGINT)
    except Stopped as e:
        return _say(command, f"stopped ({signal.Signals(e.signum).name})", 128 + e.signum)
    except MemoryError:
        return _say(command, "out of memory", 1)
    except OSError as e:  # the system refused something (disk full, permissions): not a bug
        where = f": {e.filename}" if e.filename else ""
        return _say(command, f"{e.strerror or e}{where}", 1)
    except Exception as e:  # a bug: still one line (the variable shows the traceback)
        if os.environ.get("ROUTESCOPE_TRACEBACK"):
            raise
        return _say(command, f"unexpected error {type(e).__name__}: {e} (a bug: please report it with the "
                             f"command line; ROUTESCOPE_TRACEBACK=1 shows where it happened)", 1)


def _say(command: str, message: str, code: int) -> int:
    """One line on stderr: control characters (ESC, BEL, line breaks from a file or column name),
    lone surrogates and other unprintable ones shown as escapes, never sent to the terminal."""
    line = "".join(c if c.isprintable() or c == " " else ascii(c)[1:-1] for c in f"{command}: {message}")
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):  # stderr closed or gone: the exit status still says it
        pass
    return code


def _quiet_stdout() -> None:
    """After a broken pipe: point stdout at /dev/null, so flushing it at exit raises nothing."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


if __name__ == "__main__":
    sys.exit(main())
