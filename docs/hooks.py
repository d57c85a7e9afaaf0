"""MkDocs hook (mkdocs.yml `hooks:`): mkdocstrings reads the sources statically, by package path, but
the repository's folders install under `routescope.` through pyproject's package-dir (core_models/ is
`routescope.core_models`). This lays the tree out as installed, in a temporary directory of symbolic
links (routescope/'s own files, then each mapped folder), and points the Python handler at it."""
from __future__ import annotations

import atexit
import shutil
import tempfile
import tomllib
from pathlib import Path

from mkdocs.plugins import event_priority

ROOT = Path(__file__).resolve().parents[1]


def installed_layout(root: Path = ROOT) -> Path:
    """A directory holding `routescope/` laid out as `pip install .` would install it (links, not copies)."""
    where = Path(tempfile.mkdtemp(prefix="routescope-docs-"))
    atexit.register(shutil.rmtree, where, ignore_errors=True)  # the links only: rmtree never follows one
    pkg = where / "routescope"
    pkg.mkdir()
    for f in (root / "routescope").iterdir():
        if f.name != "__pycache__":
            (pkg / f.name).symlink_to(f)
    mapped = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    for name, folder in mapped.items():  # "routescope.core_models" = "core_models"
        (pkg / name.split(".", 1)[1]).symlink_to(root / folder, target_is_directory=True)
    return where


@event_priority(100)  # before mkdocstrings' own on_config, which starts the handler with these paths
def on_config(config):
    python = config.plugins["mkdocstrings"].config.handlers.setdefault("python", {})
    python["paths"] = [str(installed_layout())]
    return config
