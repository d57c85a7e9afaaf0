"""`routescope export --engine ray`: the refusals that need no Ray cluster (and no Ray install)."""
from __future__ import annotations

import sys

import pytest

from routescope.cli.main import build_parser


@pytest.fixture
def cli():
    parser = build_parser()

    def run(argv):
        args = parser.parse_args([str(a) for a in argv])
        return args.func(args)

    return run


@pytest.fixture
def prompts(tmp_path):
    f = tmp_path / "p.txt"
    f.write_text("Once upon a time\n", encoding="utf-8")
    return f


def test_shard_and_several_outputs_are_refused_with_the_ray_engine(cli, prompts, tmp_path):
    base = ["export", tmp_path / "ck", "--prompts", prompts, "--engine", "ray", "--quiet"]
    with pytest.raises(ValueError, match=r"--shard: not with --engine ray"):
        cli([*base, "--out", tmp_path / "a", "--shard", "0/2"])
    with pytest.raises(ValueError, match="writes one Parquet dataset directory, got 2"):
        cli([*base, "--out", tmp_path / "a", "--out", tmp_path / "b"])
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_without_ray_the_message_names_the_extra(cli, prompts, tmp_path, monkeypatch, capsys):
    from routescope.cli.main import main

    monkeypatch.setitem(sys.modules, "ray", None)  # as in a base install without the distributed extra
    with pytest.raises(ValueError, match=r"needs Ray: pip install 'routescope\[distributed\]'"):
        cli(["export", tmp_path / "ck", "--prompts", prompts, "--engine", "ray", "--out", tmp_path / "a"])
    assert main(["export", str(tmp_path / "ck"), "--prompts", str(prompts), "--engine", "ray",
                 "--out", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("routescope export: --engine ray needs Ray"), err
    assert not (tmp_path / "a").exists()


def test_the_export_modules_import_without_ray():
    """The base install needs no Ray: the command line and the export modules (the Ray one too) import
    with `ray` unimportable; Ray is imported only when --engine ray runs."""
    import subprocess

    code = ("import sys; sys.modules['ray'] = None\n"
            "from routescope.cli.main import build_parser\n"
            "import routescope.analysis.export.ray_export, routescope.analysis.export.batch\n"  # importable without ray: ray is imported lazily
            "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
