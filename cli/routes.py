"""`routescope routes`: route the probe prompts a checkpoint's family declares (its
`ProbeTable`: prompts whose expected route the family's paper prints) and print them beside their
expected routes; the family's table does the printing. A family without probes is refused in one
line naming the families that have them. A --probes file that is not a regular file was refused
before this module was imported (`cli.parsers.check_routes_probes`)."""
from __future__ import annotations

import argparse

from routescope.analysis.runs.family_table import probe_table, probe_tables

from . import options as O
from . import papaformer_routes
from .common import load_with_tokenizer

# The CLI half of a family with probe prompts: the table `routescope routes` prints (plugins bring
# theirs as their probe table's `command`)
COMMANDS = {"papaformer": papaformer_routes.run}


def run(args: argparse.Namespace) -> int:
    model, tok = load_with_tokenizer(args.checkpoint, **O.device_kwargs(args))
    family = model.config.family
    probes = probe_table(family)
    if probes is None:
        having = ", ".join(probe_tables())
        raise ValueError(f"{model.config.label}: its family declares no probe prompts with expected routes "
                         f"(families that do: {having})")
    command = COMMANDS.get(family) or probes.command
    return command(args, model, tok)
