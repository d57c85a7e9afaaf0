"""The documentation site (mkdocs.yml, docs/) builds with `mkdocs build --strict`: every page in the
nav, every link between pages, every image, every included file and every `:::` API block resolves."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import routescope

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_mkdocs_build_strict(tmp_path):
    site = tmp_path / "site"
    out = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)], cwd=ROOT,
                         capture_output=True, text=True, timeout=600, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert out.returncode == 0, f"mkdocs build --strict failed:\n{out.stdout}\n{out.stderr}"
    api = (site / "api" / "index.html").read_text()
    # every `rs` name has its entry, read from its module's docstrings (the namespace's own table)
    missing = [f"rs.{name}" for name, (module, attr) in routescope._LAZY.items() if f'id="{module}.{attr}"' not in api]
    assert not missing, f"docs/api.md documents no {', '.join(missing)}"
    for view in ("routing", "routing_128x24", "generation", "ablation_diff", "attribution", "table6", "corpus", "experts",
                 "export"):
        assert (site / "images" / f"{view}.png").is_file(), view
