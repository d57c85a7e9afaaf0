"""The `routescope` command line: one module per command, wired together by `cli.main`.

Each command module defines `add(subparsers)`, which adds its parser and sets `func=run`, and
`run(args) -> int`. Modules import only `cli.options` / `cli.common` at the top and load models,
torch and analysis inside `run`, so `routescope --help` stays fast. To add a command, write
`cli/<name>.py` with those two functions and list it in `cli.main.COMMANDS`.

Errors: a handler raises ValueError (or FileNotFoundError) whose message names the problem (file,
field, option); `cli.main.main` prints it as one line `routescope <command>: <message>` and exits
with 2. Option values are checked while parsing (`cli.options`), with the same one-line style.
"""

from routescope.layout import only_as  # noqa: E402

only_as("routescope.cli", __name__)
