"""The `routescope` command line: the parsers in `cli.parsers`, one module per command, wired together
by `cli.main`.

`cli.parsers` builds every command's parser from argparse, `cli.options` and stdlib-only modules, so
`routescope --help` imports no torch; each parser records the module that runs its command (`command_module`),
imported only when that command runs. A command module (`cli/<name>.py`) imports what it needs at
its top and defines `run(args) -> int`. To add a command, write its parser function in `cli.parsers`
(listed in `PARSERS` under its module's name) and `cli/<name>.py` with `run`.

Errors: a handler raises ValueError (or FileNotFoundError) whose message names the problem (file,
field, option); `cli.main.main` prints it as one line `routescope <command>: <message>` and exits
with 2. Option values are checked while parsing (`cli.options`), with the same one-line style.
"""

from routescope.layout import only_as  # noqa: E402

only_as("routescope.cli", __name__)
