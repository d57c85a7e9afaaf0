"""The app's messages for bad probe files and bad uploads: the file named as the user named it, no
server path or Python object on the page, a long list of problems summarised (counts, first names)
with the whole list in an expander; the Table 6 probes named by file name."""
from __future__ import annotations

import fnmatch
import re
import shutil
import tempfile
import tomllib
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from routescope.analysis.runs.domain import DEFAULT_PROBES
from routescope.core_models.checkpoint import CheckpointError, load_checkpoint

ROOT = Path(__file__).resolve().parents[2]
APP = str(ROOT / "app" / "main.py")
CHECKPOINTS = ROOT / "checkpoints"
HEADER = "prompt_id\tdomain\texpected_path\tprompt\n"
LEAKS = ("/tmp/", tempfile.gettempdir() + "/", "routescope-upload-", "StringIO", "BytesIO", "object at 0x",
         str(ROOT), "/shared/")


def page_text(at: AppTest) -> list[str]:
    """Every text the page shows: errors, warnings, captions, markdown, code, expander labels."""
    out = [e.value for kind in ("error", "warning", "caption", "markdown", "code", "info") for e in at.get(kind)]
    return out + [x.label for x in at.get("expander")]


def no_leaks(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]
    for text in page_text(at):
        assert not any(leak in text for leak in LEAKS), text


def table6_with(upload: tuple[str, bytes] | None) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=180)
    at.run()
    box = at.selectbox(key="checkpoint")
    box.set_value(next(p for p in box.options if Path(p).name == "papaformer-gumbel-v1")).run()
    at.segmented_control(key="view").set_value("Table 6").run()
    if upload is not None:
        at.file_uploader(key="probes_upload").set_value((*upload, "text/tab-separated-values")).run()
    return at


@pytest.mark.parametrize("name,data,says", [
    ("bad.tsv", b"id\ttext\nP1\thello\n", "bad.tsv: missing required column(s) prompt_id, domain, expected_path, prompt"),
    ("latin1.tsv", (HEADER + "P1\tstory\t1\tcaf\xe9\n").encode("latin-1"), "latin1.tsv: line 2 (byte offset"),
    ("nine.tsv", (HEADER + "P1\tstory\t9\tOnce upon a time\n").encode(), "nine.tsv: probe P1: expected_path 9 is out of range 1..2"),
    ("extra.tsv", (HEADER + "P1\tstory\t1\tOnce\tupon\n").encode(), "extra.tsv: line 2 has 5 tab-separated fields"),
])
def test_probe_file_errors_name_the_uploaded_file(name, data, says):
    at = table6_with((name, data))
    no_leaks(at)
    errors = [e.value for e in at.error]
    assert len(errors) == 1 and errors[0].startswith("Probe file " + says), errors
    assert "updated in" in next(c.value for c in at.caption if "Ablation:" in c.value)  # the app keeps working


def test_table6_caption_names_the_shipped_probes_by_file_name():
    at = table6_with(None)
    no_leaks(at)
    caption = next(c.value for c in at.caption if c.value.startswith("Probes:"))
    assert caption.startswith(f"Probes: {DEFAULT_PROBES.name} (the paper's probes, shipped with RouteScope).")
    # shipped as package data of `routescope.analysis`: the file sits in the package and pyproject includes it
    package = ROOT / "analysis"
    assert DEFAULT_PROBES.resolve().parent.parent == package.resolve()
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["routescope.analysis"]
    assert any(fnmatch.fnmatch(DEFAULT_PROBES.relative_to(package).as_posix(), g) for g in globs)


def test_uploaded_probe_file_is_named_in_the_caption():
    at = table6_with(("mine.tsv", (HEADER + "P1\tstory\t1\tOnce upon a time\n").encode()))
    no_leaks(at)
    assert any(c.value.startswith("Probes: mine.tsv. Routes are numbered") for c in at.caption)


# --- checkpoint uploads ------------------------------------------------------------------------

def files_of(name: str) -> dict[str, bytes]:
    return {n: (CHECKPOINTS / name / n).read_bytes() for n in ("config.json", "model.safetensors", "tokenizer.json")}


def upload(files: dict[str, bytes]) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=180)
    at.run()
    at.file_uploader(key="upload").set_value([(n, b, "application/octet-stream") for n, b in files.items()]).run()
    at.button(key="upload_go").click().run()
    return at


def loader_problems(files: dict[str, bytes]) -> list[str]:
    """What the loader itself says about these files, loaded from a directory of our own."""
    d = Path(tempfile.mkdtemp())
    try:
        for n, b in files.items():
            (d / n).write_bytes(b)
        with pytest.raises(CheckpointError) as e:
            load_checkpoint(d)
        return [p.replace(str(d) + "/", "") for p in e.value.problems]
    finally:
        shutil.rmtree(d)


def test_corrupt_weights_are_named_as_uploaded():
    files = files_of("pgpt")
    files["model.safetensors"] = b"\x00not a safetensors file"
    at = upload(files)
    no_leaks(at)
    assert [e.value.split(" (")[0] for e in at.error] == ["Upload rejected: model.safetensors: not a readable safetensors file"]


def test_bad_config_is_named_as_uploaded():
    files = files_of("pgpt")
    files["config.json"] = b'{"family": ["pgpt"]}'
    at = upload(files)
    no_leaks(at)
    assert len(at.error) == 1 and at.error[0].value.startswith("Upload rejected: config.json: "), at.error[0].value


def test_mismatched_upload_is_summarised_with_every_problem_in_an_expander():
    files = files_of("pgpt")
    files["config.json"] = (CHECKPOINTS / "moep" / "config.json").read_bytes()
    problems = loader_problems(files)
    assert len(problems) > 20  # the case: a list that used to fill the sidebar (5,895 characters)
    at = upload(files)
    no_leaks(at)
    [line] = [e.value for e in at.error]
    assert line.startswith("Upload rejected: model.safetensors does not match its config: ")
    assert len(line) < 400, len(line)
    for kind, prefix in (("missing", "missing tensor "), ("unexpected", "unexpected tensor ")):
        names = [p[len(prefix):].split(" ")[0] for p in problems if p.startswith(prefix)]
        if names:
            assert f"{len(names)} {kind} ({', '.join(names[:3])}" in line
    [box] = [x for x in at.get("expander") if x.label.startswith("All ")]
    assert box.label == f"All {len(problems)} problems"
    assert [c.value for c in box.get("code")] == ["\n".join(problems)]
    assert re.search(r"\b(missing|unexpected) tensor\b", "\n".join(problems))


def test_a_checkpoint_that_cannot_open_is_named_without_its_server_path(tmp_path, monkeypatch):
    broken = tmp_path / "broken"
    broken.mkdir()
    files = files_of("pgpt")
    files["config.json"] = (CHECKPOINTS / "moep" / "config.json").read_bytes()
    for n, b in files.items():
        (broken / n).write_bytes(b)
    monkeypatch.setenv("ROUTESCOPE_CHECKPOINTS", str(tmp_path))
    at = AppTest.from_file(APP, default_timeout=180)
    at.run()
    box = at.selectbox(key="checkpoint")
    box.set_value(next(p for p in box.options if Path(p).name == "broken")).run()
    assert not at.exception
    for text in page_text(at):
        assert str(tmp_path) not in text, text
    [line] = [e.value for e in at.error]
    assert line.startswith("Cannot open broken: model.safetensors does not match its config: ") and len(line) < 400
    assert [x.label for x in at.get("expander") if x.label.startswith("All ")] == [f"All {len(loader_problems(files))} problems"]
