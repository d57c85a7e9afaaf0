"""The shape of the code base: family knowledge lives in one table, everything installs and imports
under `routescope.`, and the README's Python example runs as written."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("core_models", "analysis", "rendering", "app", "cli", "corpora")  # the repository's top-level packages

# Where a family may be named in a comparison or its module imported: the family table of
# core_models (registry), the family modules themselves (hf.py: transformers models), analysis'
# family table and each family's analysis module (analysis/families: Wiola's reads its model's option
# names). importers.py (a paper's weights into one family) and training/compose.py (PaPaformer
# built from trained paths) import their family's module by purpose, but compare nothing either.
# A transformers directory is a checkpoint format of its own: the loader (checkpoint.py) and the
# catalog that lists directories (catalog.py) import core_models.hf to recognise and check one.
ALLOWED = {"core_models/registry.py", "core_models/plugins.py", "core_models/papaformer.py", "core_models/moep.py", "core_models/pgpt.py",
           "core_models/wiola.py", "core_models/wiola_parts.py", "core_models/llama.py", "core_models/hf.py",
           "analysis/runs/family_table.py", "routescope/families.py",
           *(f"analysis/families/{f}.py" for f in ("papaformer", "topk", "pgpt", "wiola", "llama"))}
IMPORTS_FAMILY_BY_PURPOSE = {"core_models/importers.py", "core_models/training/compose.py", "analysis/runs/domain.py",
                             "core_models/checkpoint.py", "analysis/runs/catalog.py"}
FAMILY_MODULES = r"(papaformer|moep|pgpt|wiola|wiola_parts|llama|hf)"
# a family or combiner compared with a name written out: `== "moep"`, `"moep" ==`, `in ("pgpt", ...)`
COMPARISON = re.compile(r"""\b(family|combiner)\s*(==|!=)\s*["']|["'][\w-]*["']\s*(==|!=)\s*[\w.]*\b(family|combiner)\b|"""
                        r"""\b(family|combiner)\s+(not\s+)?in\s*[(\[{]""")
FAMILY_IMPORT = re.compile(rf"^\s*from\s+(routescope\.core_models|\.+)\.?{FAMILY_MODULES}\s+import|"
                           rf"^\s*import\s+routescope\.core_models\.{FAMILY_MODULES}\b", re.M)
# tests and benchmarks are exempt: a test builds the family it checks; each benchmark peer mirrors one family
SCANNED = ("app", "analysis", "cli", "core_models", "corpora", "routescope", "scripts")


def source_files() -> list[str]:
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "--", *SCANNED],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    return [f for f in out if f.endswith(".py") and (ROOT / f).is_file()]


def test_no_family_names_compared_or_family_modules_imported_outside_the_family_tables():
    found = []
    for f in source_files():
        if f in ALLOWED:
            continue
        text = (ROOT / f).read_text()
        for n, line in enumerate(text.splitlines(), start=1):
            if COMPARISON.search(line.split("#")[0]):
                found.append(f"{f}:{n}: {line.strip()}")
        if f not in IMPORTS_FAMILY_BY_PURPOSE:
            found += [f"{f}: imports a family module: {m.group(0).strip()}" for m in FAMILY_IMPORT.finditer(text)]
    assert not found, "family knowledge outside the family tables:\n" + "\n".join(found)


def test_the_scan_finds_what_it_forbids(tmp_path):
    """The patterns above catch the forms the code base used before (so the test above can fail)."""
    for line in ['if cfg.family == "papaformer":', 'combined = c.combiner != "share_linear"',
                 'if "moep" == model.config.family:', 'if config.family in ("pgpt", "lgpt"):',
                 'parallel = family != "llama" or config.get("ffn") == "pagmlp"']:
        assert COMPARISON.search(line), line
    assert FAMILY_IMPORT.search("from routescope.core_models.wiola import ATM_TAU")
    assert FAMILY_IMPORT.search("    from ..papaformer import Papaformer")
    assert not COMPARISON.search("has_combined_route = True") and not FAMILY_IMPORT.search("from .registry import x")
    assert not COMPARISON.search("if fam != cls.family:")  # a config checking its own field names no family


# Table 6 (the PaPaformer paper's routing probes) is the PaPaformer spec's (its page, probe table and
# routes command); only it and the PaPaformer modules it points at name it: the family module, its
# probe routes (analysis/runs/domain.py), its page and its `routescope routes` table, and the scripts
# that write the shipped PaPaformer checkpoints' routes and findings tables.
TABLE6 = re.compile(r"table[\s_-]?6", re.I)
TABLE6_ALLOWED = {"app/pages.py", "analysis/runs/family_table.py", "core_models/papaformer.py", "analysis/runs/domain.py",
                  "app/views/table6.py",
                  "cli/papaformer_routes.py", "scripts/routes_table.py", "scripts/findings_table.py",
                  "scripts/shots_issue31.py"}  # screenshots of issue 31, whose item 6 is the Table 6 page


def test_only_the_papaformer_spec_and_its_modules_name_table_6():
    found = [f"{f}:{n}: {line.strip()}" for f in source_files() if f not in TABLE6_ALLOWED
             for n, line in enumerate((ROOT / f).read_text().splitlines(), start=1) if TABLE6.search(line)]
    assert not found, "Table 6 named outside the PaPaformer spec and its modules:\n" + "\n".join(found)
    page = (ROOT / "app" / "pages.py").read_text()  # the scan can fail: the family's page table names it
    assert TABLE6.search(page) and all(TABLE6.search(x) for x in ("Table 6", "table6_probes", "TABLE6_SHOWN"))


def test_every_package_folder_is_installed_under_routescope():
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    dirs = tool["package-dir"]
    want = {"routescope"}
    for top in FOLDERS:
        assert dirs[f"routescope.{top}"] == top
        want |= {"routescope." + ".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / top).rglob("__init__.py")}
    assert set(tool["packages"]) == want
    assert tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"] == \
        {"routescope": "routescope.cli.main:main"}


def test_no_module_is_imported_under_a_second_name():
    """Every import in the code base names `routescope.`; importing every module of the installed
    package from outside the repository puts nothing at the top level under the folders' names."""
    bare = re.compile(rf"^\s*(from|import)\s+({'|'.join(FOLDERS)})(\.|\s|$)", re.M)
    files = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    offenders = [f for f in files if (ROOT / f).is_file() and bare.search((ROOT / f).read_text())]
    assert not offenders, offenders
    code = ("import importlib, pkgutil, sys, routescope\n"
            "for top in ('core_models', 'analysis', 'cli', 'corpora', 'rendering'):\n"
            "    pkg = importlib.import_module('routescope.' + top)\n"
            "    for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + '.'):\n"
            "        if not m.name.endswith('__main__'): importlib.import_module(m.name)\n"
            f"print(sorted(k for k in sys.modules if k.split('.')[0] in {FOLDERS!r}))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd="/", capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"


def test_a_folder_imported_by_its_own_name_is_refused():
    """From the repository root (its folders on sys.path) `import analysis.runs.views` would load a
    second module with a second FAMILIES table; each folder refuses that import in one line, and
    the installed name still gives one module."""
    for folder in (*FOLDERS, "core_models.training"):
        code = f"import {folder}"
        out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
        top = folder.split(".")[0]  # a subpackage: its parent refuses first
        assert out.returncode == 1 and f"ImportError: import routescope.{top}, not {top}:" in out.stderr, out.stderr
    code = ("import sys, importlib\n"
            "a = importlib.import_module('routescope.analysis.runs.views')\n"
            "try:\n    importlib.import_module('analysis.runs.views')\nexcept ImportError:\n    pass\n"
            "print(sorted(k for k in sys.modules if k.endswith('runs.views')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.stdout.split() == ["['routescope.analysis.runs.views']"], out.stderr[-2000:]


def test_models_load_and_run_without_the_training_code():
    """Training (core_models.training) and the synthetic corpora stay out of the model package's
    import path: loading a checkpoint, running and analysing a prompt import neither."""
    code = ("import sys, routescope as rs\n"
            "m, t = rs.load('checkpoints/pgpt')\n"
            "rs.run(m, t, 'Once upon a time', max_new_tokens=2)\n"
            "print(sorted(k for k in sys.modules if k.startswith(('routescope.corpora', 'routescope.core_models.training'))))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "[]", (out.stdout, out.stderr[-2000:])


def readme_example() -> str:
    text = (ROOT / "README.md").read_text()
    m = re.search(r"```python\n(import routescope as rs\n.*?)```", text, re.S)
    assert m, "README.md has no ```python block starting with `import routescope as rs`"
    return m.group(1)


def test_the_readme_namespace_example_runs():
    code = readme_example()
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip(), "the example prints what it found"


@pytest.mark.slow
def test_pip_install_puts_only_routescope_at_the_top_level(tmp_path):
    """Build the wheel `pip install .` would install and install it (no dependencies) into a clean
    virtual environment: its site-packages gains `routescope` and its metadata, nothing else."""
    # built from a copy of the packaged sources: an in-tree build would leave build/ in the repository,
    # whose stale copies of removed modules a later wheel would pick up again
    src = tmp_path / "src"
    for name in (*FOLDERS, "routescope"):
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels),
                    str(src)], check=True, capture_output=True, timeout=600)
    (wheel,) = wheels.glob("routescope-*.whl")
    tops = {name.split("/")[0] for name in zipfile.ZipFile(wheel).namelist()}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"routescope"}, tops
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    before = set(_site_packages(venv).iterdir())
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "--no-deps", "--no-index", str(wheel)], check=True,
                   capture_output=True, timeout=600)
    added = {p.name for p in set(_site_packages(venv).iterdir()) - before}
    assert {a for a in added if not a.endswith(".dist-info")} == {"routescope"}, added
    for top in FOLDERS:
        assert not (_site_packages(venv) / top).exists()
        assert (_site_packages(venv) / "routescope" / top / "__init__.py").is_file()
    assert (_site_packages(venv) / "routescope" / "analysis" / "data" / "table6_probes.tsv").is_file()
    # the corpus generators need only the standard library: import one from the clean install
    out = subprocess.run([str(venv / "bin" / "python"), "-c",
                          "import routescope.corpora.corpus as c, sys; print(c.__file__); "
                          "print(sorted(k for k in sys.modules if k.split('.')[0] in ('app', 'cli', 'analysis', "
                          "'core_models', 'corpora')))"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    where, leaked = out.stdout.splitlines()
    assert Path(where).is_relative_to(_site_packages(venv)) and leaked == "[]"


def _site_packages(venv: Path) -> Path:
    (sp,) = (venv / "lib").glob("python3*/site-packages")
    return sp
