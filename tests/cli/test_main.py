"""The `routescope` parser: every command wired in, choices taken from the modules that define them,
and building the parser (all `--help` needs) imports no torch."""
from __future__ import annotations

import argparse
import os
import subprocess
import sys

import pytest

from routescope.cli.main import build_parser
from routescope.cli.parsers import PARSERS


def _subparsers(p: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (action,) = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def _choices(p: argparse.ArgumentParser, flag: str) -> tuple:
    (action,) = [a for a in p._actions if flag in a.option_strings]
    return tuple(action.choices)


def test_every_command_module_is_a_subcommand():
    assert sorted(_subparsers(build_parser())) == sorted(m.rstrip("_") for m in PARSERS)


def test_each_parser_names_the_module_that_runs_it():
    """The parser records its command's module (imported only when the command runs): it exists, is
    the command's own file, and has run(args)."""
    import importlib

    for name, p in _subparsers(build_parser()).items():
        module = importlib.import_module(f"routescope.cli.{p.get_default('command_module')}")
        assert module.__name__.rsplit(".", 1)[1].rstrip("_") == name and callable(module.run)


def test_choices_are_the_defining_modules_constants():
    from routescope.analysis.runs import attribution
    from routescope.core_models import importers, papaformer, run_state

    sub = _subparsers(build_parser())
    assert _choices(sub["generate"], "--routing") == run_state.ROUTING_MODES
    assert _choices(sub["export"], "--routing") == run_state.ROUTING_MODES
    assert _choices(sub["compose"], "--combiner") == papaformer.COMBINERS
    assert _choices(sub["import"], "--from") == importers.SOURCES
    assert _choices(sub["attribute"], "--method") == attribution.TOKEN_METHODS + attribution.METHODS
    assert _choices(sub["attribute"], "--baseline") == attribution.BASELINES
    assert _choices(sub["attribute"], "--scope") == attribution.SCOPES


def test_a_value_outside_the_choices_is_one_line_naming_them(capsys):
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(["compose", "--paths", "a", "--out", "b", "--combiner", "nope"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1
    assert err.startswith("routescope compose: argument --combiner: invalid choice: 'nope'") and "gumbel_v2" in err


def test_building_the_parser_imports_no_torch():
    """Nor pandas, nor any command module: those are imported when their command runs."""
    code = ("import sys; from routescope.cli.main import build_parser; build_parser().format_help(); "
            f"print(sorted(m for m in sys.modules if m in ('torch', 'pandas') or m in "
            f"{[f'routescope.cli.{m}' for m in PARSERS]!r}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "[]", (out.stdout, out.stderr[-2000:])


@pytest.mark.parametrize("argv", [["export", "ck", "--prompts", "{bad}", "--out", "o.csv"],
                                  ["routes", "ck", "--probes", "{bad}"]])
def test_a_bad_input_file_is_refused_before_torch_loads(tmp_path, argv):
    """export's prompt file and routes' probe file are checked before the command's module (and torch)
    is imported: one line naming the file, exit 2, torch never loaded."""
    fifo = tmp_path / "fifo.txt"
    os.mkfifo(fifo)
    argv = [a.format(bad=fifo) for a in argv]
    code = (f"import sys; from routescope.cli.main import main; rc = main({argv!r}); "
            f"print(rc, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.stdout.split() == ["2", "False"], (out.stdout, out.stderr[-2000:])
    assert out.stderr == f"routescope {argv[0]}: {fifo}: is a named pipe (FIFO), not a " \
                         f"{'prompt' if argv[0] == 'export' else 'probe'} file\n"
