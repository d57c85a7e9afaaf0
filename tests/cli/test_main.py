"""The `routescope` parser: every command wired in, choices taken from the modules that define them,
and building the parser (all `--help` needs) imports no torch."""
from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from routescope.cli.main import COMMANDS, build_parser


def _subparsers(p: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (action,) = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def _choices(p: argparse.ArgumentParser, flag: str) -> tuple:
    (action,) = [a for a in p._actions if flag in a.option_strings]
    return tuple(action.choices)


def test_every_command_module_is_a_subcommand():
    assert sorted(_subparsers(build_parser())) == sorted(m.rstrip("_") for m in COMMANDS)


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
    code = ("import sys; from routescope.cli.main import build_parser; build_parser().format_help(); "
            "sys.exit('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
