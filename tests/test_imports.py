"""The import structure: no cycle anywhere in the `routescope.*` module graph, the layers of
pyproject's import-linter contracts (core_models <- analysis <- rendering <- app, cli <- routescope),
and project imports at module top. Each check is also run on a copy with one violating import added,
so it is shown to fail.

The graph library (grimp, under import-linter) finds a package by walking its folder, but the
repository keeps `core_models/`, `analysis/`, ... at the top level and package-dir installs them under
`routescope.`; the tests give it a copy laid out as installed."""
from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_DIRS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]

# Imports inside a function are for optional heavy dependencies only (imported when a feature that
# needs them runs), each with a comment saying so.
OPTIONAL = {"ray", "captum", "playwright", "accelerate", "transformers"}
# ...and the one place a required dependency waits: `--threads` sets torch's threads when a command
# runs, so building the parser (`routescope --help`) imports no torch (tests/cli/test_main.py)
DEFERRED = {("cli/main.py", "torch")}

# Tarjan's strongly connected components over grimp's direct imports, run where the copy is importable.
CYCLES = """
import json, sys
import grimp
graph = grimp.build_graph("routescope", cache_dir=None)
index, low, stack, on, comps = {}, {}, [], set(), []
def visit(v):
    index[v] = low[v] = len(index); stack.append(v); on.add(v)
    for w in graph.find_modules_directly_imported_by(v):
        if w not in index:
            visit(w); low[v] = min(low[v], low[w])
        elif w in on:
            low[v] = min(low[v], index[w])
    if low[v] == index[v]:
        comp = []
        while True:
            w = stack.pop(); on.discard(w); comp.append(w)
            if w == v:
                break
        if len(comp) > 1 or v in graph.find_modules_directly_imported_by(v):
            comps.append(sorted(comp))
sys.setrecursionlimit(20000)
for m in sorted(graph.modules):
    if m not in index:
        visit(m)
print(json.dumps({"modules": len(graph.modules), "cycles": comps}))
"""


def installed_layout(dest: Path) -> Path:
    """A copy of the source tree as package-dir installs it: dest/routescope/{core_models,...}."""
    top = dest / "routescope"
    shutil.copytree(ROOT / "routescope", top, ignore=shutil.ignore_patterns("__pycache__"))
    for package, folder in PACKAGE_DIRS.items():
        target = dest.joinpath(*package.split("."))
        shutil.copytree(ROOT / folder, target, ignore=shutil.ignore_patterns("__pycache__", "*.tsv", "*.js"))
    return dest


def python_on(copy: Path, code: str, *args: str) -> subprocess.CompletedProcess:
    """`code` in a fresh interpreter whose `routescope` is the copy (first on sys.path; the
    repository's editable install is found only after it)."""
    prelude = f"import sys; sys.path.insert(0, {str(copy)!r})\n"
    return subprocess.run([sys.executable, "-c", prelude + code, *args], cwd=copy, capture_output=True,
                          text=True, timeout=600)


def cycles(copy: Path) -> dict:
    out = python_on(copy, CYCLES)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)


def lint(copy: Path) -> subprocess.CompletedProcess:
    code = ("from importlinter.cli import lint_imports\n"
            f"sys.exit(lint_imports(config_filename={str(ROOT / 'pyproject.toml')!r}, no_cache=True))")
    return python_on(copy, code)


@pytest.fixture(scope="module")
def copy(tmp_path_factory) -> Path:
    return installed_layout(tmp_path_factory.mktemp("layout"))


def with_import(copy: Path, dest: Path, module: str, line: str) -> Path:
    """A second copy with `line` appended to `module` (a dotted name under routescope)."""
    shutil.copytree(copy, dest)
    path = dest.joinpath(*module.split("."))
    path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    path.write_text(path.read_text() + f"\n{line}\n")
    return dest


def test_the_module_graph_has_no_import_cycle(copy):
    found = cycles(copy)
    assert found["modules"] > 100  # the graph saw the mapped folders, not only routescope/
    assert found["cycles"] == [], "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found["cycles"])


def test_a_cycle_is_found_when_one_is_added(copy, tmp_path):
    # the export columns are imported by the routing analyses: importing back closes a cycle
    bad = with_import(copy, tmp_path / "bad", "routescope.analysis.export.columns",
                      "import routescope.analysis.runs.routing  # a cycle on purpose")
    found = cycles(bad)["cycles"]
    assert any({"routescope.analysis.export.columns", "routescope.analysis.runs.routing"} <= set(c) for c in found)


def test_the_layers_only_point_down(copy):
    out = lint(copy)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "0 broken" in out.stdout and " kept" in out.stdout


def test_an_upward_import_breaks_the_layers_contract(copy, tmp_path):
    bad = with_import(copy, tmp_path / "bad", "routescope.core_models.sites",
                      "import routescope.rendering.tokens  # upward on purpose")
    out = lint(bad)
    assert out.returncode != 0
    assert "BROKEN" in out.stdout and "routescope.core_models.sites -> routescope.rendering.tokens" in out.stdout


def source_files() -> list[Path]:
    files = sorted((ROOT / "routescope").glob("*.py"))
    for folder in set(PACKAGE_DIRS.values()):
        files += sorted((ROOT / folder).rglob("*.py"))
    return files


def imports_in_functions(path: Path) -> list[tuple[int, str, bool]]:
    """(line, imported module, commented) of each import inside a function or method: commented when
    the line or the one above says why (a `#` comment)."""
    text = path.read_text()
    lines = text.splitlines()
    out = []
    for f in ast.walk(ast.parse(text)):
        if not isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(f):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = ["." * node.level + (node.module or "")]
            else:
                continue
            commented = "#" in lines[node.lineno - 1] or lines[node.lineno - 2].strip().startswith("#")
            out += [(node.lineno, n, commented) for n in names]
    return out


def test_imports_inside_functions_are_optional_dependencies_with_a_reason():
    found = []
    for path in source_files():
        for line, name, commented in imports_in_functions(path):
            top = name.split(".")[0]
            if top not in OPTIONAL and (str(path.relative_to(ROOT)), top) not in DEFERRED:
                found.append(f"{path.relative_to(ROOT)}:{line}: {name} (import it at the module top)")
            elif not commented:
                found.append(f"{path.relative_to(ROOT)}:{line}: {name} (say why it is imported here)")
    assert not found, f"{len(found)} imports inside functions:\n" + "\n".join(found)


def test_the_scan_sees_imports_inside_functions(tmp_path):
    sample = tmp_path / "m.py"
    sample.write_text("import os\n\ndef f():\n    from routescope.core_models import sites\n"
                      "    # optional: Ray only for --engine ray\n    import ray\n    return sites, ray\n")
    assert imports_in_functions(sample) == [(4, "routescope.core_models", False), (6, "ray", True)]
