"""The repository's folders install under `routescope.` (pyproject's package-dir); every folder's
`__init__` calls `only_as` so that importing it by its bare folder name fails."""
from __future__ import annotations


def only_as(full: str, name: str) -> None:
    """Called by each repository folder's `__init__`: the folders stay at the top level of the
    repository but install under `routescope.` (pyproject's package-dir). Imported by its folder name
    (the repository root on sys.path: `import analysis`), a folder would be a second copy of every
    module, with tables of its own that a registration could land in; so that import fails."""
    if name != full:
        raise ImportError(f"import {full}, not {name}: RouteScope's folders install under routescope")
