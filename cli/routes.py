"""`routescope routes`: route the probe prompts a checkpoint's family declares (its
`ProbeTable`: prompts whose expected route the family's paper prints) and print them beside their
expected routes; the family's table does the printing. A family without probes is refused in one
line naming the families that have them."""
from __future__ import annotations

import argparse

from routescope.analysis.runs.family_table import probe_table, probe_tables
from routescope.analysis.inputs.files import open_regular_file

from . import options as O
from . import papaformer_routes
from .common import load_with_tokenizer

# The CLI half of a family with probe prompts: the table `routescope routes` prints (plugins bring
# theirs as their probe table's `command`)
COMMANDS = {"papaformer": papaformer_routes.run}


def add(sub: argparse._SubParsersAction) -> None:
    r = sub.add_parser("routes", help="routes of a family's probe prompts per routing layer, beside the paper's",
                       description="Route the probe prompts that the checkpoint's family declares (prompts whose "
                                   "expected route its paper prints) and compare with the paper's routes.")
    r.add_argument("checkpoint")
    r.add_argument("--probes", metavar="FILE", help="probe TSV (default: the family's own, its paper's probes)")
    r.add_argument("--majority", action="store_true", help="majority route over the prompt's tokens "
                                                           "(default: route at the last prompt token)")
    r.add_argument("--json", action="store_true")
    r.add_argument("--batch-size", type=O.positive_int, default=32, help="probes per forward (padded batches)")
    r.add_argument("--quiet", action="store_true", help="no progress bar")
    O.add_device_options(r)
    r.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.probes:  # before torch is imported: a FIFO or a device is refused at once
        open_regular_file(args.probes, "probe file").close()
    model, tok = load_with_tokenizer(args.checkpoint, **O.device_kwargs(args))
    family = model.config.family
    probes = probe_table(family)
    if probes is None:
        having = ", ".join(probe_tables())
        raise ValueError(f"{model.config.label}: its family declares no probe prompts with expected routes "
                         f"(families that do: {having})")
    command = COMMANDS.get(family) or probes.command
    return command(args, model, tok)
