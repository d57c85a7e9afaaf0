"""`routescope`: the top-level parser, the command modules it wires in, and the one error style."""
from __future__ import annotations

import importlib
import logging
import sys

from . import options as O

# one module per command, in the order `routescope --help` lists them; each has add(sub) and run(args)
COMMANDS = ("generate", "tokenizer", "train", "compose", "app", "import_", "export", "routes", "attribute",
            "report")


def build_parser() -> O.Parser:
    p = O.Parser(prog="routescope", description="Routing analysis for parallel-path LMs")
    p.add_argument("--threads", type=O.threads, default=0,
                   help=f"torch CPU threads, 1..{O.max_threads()} (default 0: torch's choice; 1 is best when "
                        f"the cores are busy)")
    sub = p.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        importlib.import_module(f"{__package__}.{name}").add(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    if args.threads:
        import torch
        torch.set_num_threads(args.threads)
    try:
        return args.func(args)
    except BrokenPipeError:  # output piped into head & co.
        sys.stderr.close()
        return 0
    except (ValueError, FileNotFoundError) as e:  # our errors name the problem; no traceback
        sys.stderr.write(f"routescope {args.command}: {e}\n")
        return 2


if __name__ == "__main__":
    sys.exit(main())
