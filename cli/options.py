"""Option types and the parser class of the `routescope` command line.

Every option is checked while the command line is parsed, so a bad value stops the command before
anything is loaded, with one line naming the option and the allowed range, and exit code 2:

    routescope generate: argument --top-n: must be an integer >= 1, got '-1'
"""
from __future__ import annotations

import argparse
import importlib
import math
import os
from typing import Callable, Iterator, NoReturn, Sequence

from routescope.analysis.inputs.prompts import prompt_problem, text_problem  # stdlib only: --help stays light

SEED_MAX = 2**63 - 1  # seeds are stored in the export table's Int64 `seed` column


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line (`prog: message`), without the usage block.
    Sub-command parsers inherit the class, so their errors start with `routescope <cmd>:`."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def int_in(lo: int, hi: int | None = None, what: str = "an integer") -> Callable[[str], int]:
    """argparse type: an integer in [lo, hi] (hi None: no upper bound), ASCII digits only."""
    rule = f"{what} in {lo}..{hi}" if hi is not None else f"{what} >= {lo}"

    def parse(text: str) -> int:
        t = text.strip()
        digits = t[1:] if t[:1] in "+-" else t
        if not (digits.isascii() and digits.isdigit()):
            raise argparse.ArgumentTypeError(f"must be {rule}, got {text!r}")
        v = int(t)
        if v < lo or (hi is not None and v > hi):
            raise argparse.ArgumentTypeError(f"must be {rule}, got {text!r}")
        return v

    parse.__name__ = rule
    return parse


def float_in(lo: float, hi: float, *, lo_open: bool = False, hi_open: bool = False) -> Callable[[str], float]:
    """argparse type: a finite float in the interval lo..hi, ends open or closed (math.inf: no bound)."""
    rule = f"a number in {'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"

    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {rule}, got {text!r}") from None
        inside = math.isfinite(v) and (v > lo if lo_open else v >= lo) and (v < hi if hi_open else v <= hi)
        if not inside:
            raise argparse.ArgumentTypeError(f"must be {rule}, got {text!r}")
        return v

    parse.__name__ = rule
    return parse


def max_threads() -> int:
    """The largest --threads accepted: 4 per CPU this process may use (far more only thrashes,
    and OpenMP crashes when asked for ~100,000)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return 4 * max(1, cpus)


positive_int = int_in(1)
nonnegative_int = int_in(0)
seed = int_in(0, SEED_MAX, "a seed")
threads = int_in(0, max_threads(), "a thread count (0: torch's default)")
positive_float = float_in(0.0, math.inf, lo_open=True, hi_open=True)
nonnegative_float = float_in(0.0, math.inf, hi_open=True)
probability = float_in(0.0, 1.0, lo_open=True)  # (0, 1]
port = int_in(1, 65535, "a port")


def prompt_text(text: str) -> str:
    """argparse type: a prompt, by the one rule the app follows too (`analysis.inputs.prompts.prompt_problem`:
    not blank, and UTF-8 text; an argument with bytes that are not UTF-8 arrives with surrogates)."""
    problem = prompt_problem(text)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return text


def utf8_text(text: str) -> str:
    """argparse type: any UTF-8 text (blank allowed, e.g. a token); bytes that are not UTF-8 refused."""
    problem = text_problem(text, "the token")
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return text


class ChoicesOf(Sequence[str]):
    """argparse `choices` read from the module that defines them (never retyped here), imported
    on first use: most of those modules import torch, which `routescope --help` should not wait for.
    Give a metavar (argparse formats the choices into one when an argument is added) and list the
    choices in the help text, which is formatted only when shown:

        p.add_argument("--routing", choices=ChoicesOf("routescope.core_models.run_state", "ROUTING_MODES"),
                       metavar="MODE", help="one of %(choices)s")
    """

    def __init__(self, module: str, name: str) -> None:
        self.module, self.name = module, name

    def _values(self) -> tuple[str, ...]:
        return tuple(getattr(importlib.import_module(self.module), self.name))

    def __getitem__(self, i):  # type: ignore[override]
        return self._values()[i]

    def __len__(self) -> int:
        return len(self._values())

    def __iter__(self) -> Iterator[str]:
        return iter(self._values())

    def __contains__(self, value: object) -> bool:
        return value in self._values()

    def __repr__(self) -> str:
        return f"ChoicesOf({self.module}.{self.name})"


def add_ablation_options(p: argparse.ArgumentParser, routing: bool = True, top_over: str = "the prompts") -> None:
    """--routing (unless `routing` is False), --drop, --force and --mode, as generate, export and
    corpus take them (specs: core_models.specs' grammar; `top_over`: what "topN" counts over)."""
    if routing:
        p.add_argument("--routing", choices=ChoicesOf("routescope.core_models.run_state", "ROUTING_MODES"),
                       default="deterministic", metavar="MODE",
                       help="Gumbel routing at inference, one of %(choices)s (default %(default)s)")
    p.add_argument("--drop", action="append", default=[], metavar="SPEC",
                   help="options to switch off, repeatable: OPTIONS or LAYER:OPTIONS; OPTIONS 3, 0-15, 0,4-7, !5 (all "
                        f"but 5) or top8 (the 8 most used by the unablated model over {top_over}); LAYER a routing "
                        "layer, * (every layer, the default) or a glob such as 'model.layers.*.mlp.gate' "
                        "(README: Ablation specs)")
    p.add_argument("--force", action="append", default=[], metavar="LAYER:OPTION",
                   help="route every token of a layer to one option, repeatable (LAYER may be * or a glob)")
    p.add_argument("--mode", action="append", default=[], metavar="NAME",
                   help="a named ablation of the model's family, repeatable (pgpt: pgpt1-reference, the authors' "
                        "pgpt-1 evaluation: the highest-weight path alone, without the final LayerNorm)")


def run_option(text: str) -> tuple[str, str]:
    """argparse type: NAME=VALUE, a family run option (checked against the model once it is loaded)."""
    name, eq, value = text.partition("=")
    if not eq or not name.strip() or not value.strip():
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text[:60]!r}")
    return name.strip(), value.strip()


def add_run_options(p: argparse.ArgumentParser) -> None:
    """--option NAME=VALUE: the family's own per-call options, as its model declares them
    (`RouteScopeLM.run_options()`: Wiola's atm=true, atm_tau=0.6), the same as the app's controls
    and `rs.run(options=...)`."""
    p.add_argument("--option", action="append", default=[], type=run_option, metavar="NAME=VALUE",
                   help="a run option of the model's family, repeatable (wiola: atm=true merges tokens in the "
                        "prompt pass, atm_tau=0.6 its threshold); a model that does not take it says so")


def add_device_options(p: argparse.ArgumentParser) -> None:
    """--device and --dtype, as every command that runs a model takes them."""
    p.add_argument("--device", choices=ChoicesOf("routescope.core_models.devices", "DEVICES"), default="auto", metavar="DEVICE",
                   help="where the model runs, one of %(choices)s (default auto: CUDA if available, then MPS, "
                        "else the CPU)")
    p.add_argument("--dtype", choices=ChoicesOf("routescope.core_models.devices", "DTYPES"), default="auto", metavar="DTYPE",
                   help="parameter precision, one of %(choices)s (default auto: as the checkpoint stores it, "
                        "float32 for float16 on the CPU; see the README for the tolerance of bfloat16 against float32)")
    p.add_argument("--device-map", choices=ChoicesOf("routescope.core_models.devices", "DEVICE_MAPS"), default="none",
                   metavar="MAP", help="auto: accelerate spreads a transformers model over the GPUs, then the CPU, "
                                       "then disk (for a model larger than one device); none (default): one device")
    p.add_argument("--max-memory", default=None, metavar="SPEC",
                   help="with --device-map auto, the most each device may hold, e.g. cpu=20GiB,0=70GiB")


def device_kwargs(args: argparse.Namespace) -> dict:
    """The loader's placement arguments from add_device_options' flags."""
    return dict(device=args.device, dtype=args.dtype, device_map=args.device_map, max_memory=args.max_memory)
