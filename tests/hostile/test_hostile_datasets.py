"""Hostile datasets and output directories for `routescope corpus` (issue 29, items 2-4): every
malformed input is one line, exit 2, naming the file and the row or column, before the model runs
and with nothing written; control characters in echoed names are escaped; an output set is
replaced whole and never through a symbolic link; memory stays bounded in every format (peak RSS
measured and printed, `pytest -s`)."""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from routescope.analysis.inputs import datasets as D
from routescope.analysis.corpus import page as P
from routescope.analysis.corpus import run as corpus_run
from routescope.analysis.inputs.files import MAX_LINE_BYTES
from routescope.cli.main import Stopped, main
from test_interrupts_and_limits import run_measured

ROOT = Path(__file__).resolve().parents[2]
CK = ROOT / "checkpoints" / "papaformer-gumbel-v2"  # 3 options per routing layer
GiB = 1 << 30


def refuse_before_the_model(monkeypatch):
    """run_corpus raises if reached: a refusal (exit 2) then shows the model never ran."""
    def ran(*a, **k):
        raise AssertionError("the model ran")
    monkeypatch.setattr(corpus_run, "run_corpus", ran)


def snapshot(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(root.rglob("*"))}


def one_line(err: str) -> None:
    assert "Traceback" not in err and err.count("\n") == 1 and err.startswith("routescope corpus: "), err


def parquet_bytes(table: pa.Table, **kw) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, **kw)
    return sink.getvalue().to_pybytes()


def _corrupt_parquet() -> bytes:
    b = bytearray(parquet_bytes(pa.table({"text": ["hello world"] * 100}), compression="none"))
    b[4:40] = b"\xff" * 36  # the first page header
    return bytes(b)


def _bad_utf8_parquet() -> bytes:
    b = bytearray(parquet_bytes(pa.table({"text": ["hello Z world"]}), compression="none", use_dictionary=False,
                                write_statistics=False))
    b[b.index(b"hello Z") + 6] = 0xFF
    return bytes(b)


TSV_OK = "text\tdomain\nOnce upon a time\tstory\nSolve 3x = 9\tmath\n"
CASES = [  # (file name, bytes, extra arguments, what the line must hold)
    ("s.jsonl", b'{"text": "a\\ud800b"}\n', [], "line 1: text holds a lone surrogate U+D800"),
    ("s.jsonl", b'{"text": "ab", "lab": "x\\udc00"}\n', [], "line 1: label column 'lab' holds a lone surrogate"),
    ("s.jsonl", b'{"text": "ab", "\\udc00": 1}\n', [], "header: column name"),
    ("d.jsonl", b'{"text": "ab", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n", [], "line 1: JSON nested too deeply"),
    ("n.jsonl", b'{"text": "ab", "x": ' + b"9" * 5000 + b"}\n", [], "line 1: a JSON value Python refuses"),
    ("k.jsonl", b'{"text": "ab", "text": "cd"}\n', [], "line 1: key 'text' appears twice"),
    ("a.jsonl", b'{"text": "ab"}\n[1]\n', [], "line 2 is a JSON list, not an object"),
    ("u.csv", b"text,lab\nab\xff,x\n", [], "line 2 (byte offset 11) is not UTF-8"),
    ("q.csv", b'text\n"abc\ndef\n', [], "line 3: unexpected end of data (CSV quoting)"),
    ("q.csv", b'text,lab\n"ab"c,1\n', [], "line 2: ',' expected after '\"' (CSV quoting)"),
    ("r.csv", b'text\n"' + b"abc\n" * (MAX_LINE_BYTES // 4 + 10), [], "the record ending at line"),
    ("f.csv", b'text\n"' + b"a" * (MAX_LINE_BYTES + 5) + b'"\n', [], "line 2 is longer than 1 MiB"),
    ("h.csv", b"text,lab,lab\nab,x,y\n", [], "header: column 'lab' appears twice"),
    ("h.tsv", b"text\tlab\tlab\nab\tx\ty\n", [], "header: column 'lab' appears twice"),
    ("h.parquet", parquet_bytes(pa.Table.from_arrays([pa.array(["ab"]), pa.array(["x"]), pa.array(["y"])],
                                                     names=["text", "lab", "lab"])), [], "column 'lab' appears twice"),
    ("c.parquet", _corrupt_parquet(), [], "c.parquet: rows 1..: not readable Parquet"),
    ("b.parquet", _bad_utf8_parquet(), [], "b.parquet: rows 1..1: not readable"),
    ("big.parquet", parquet_bytes(pa.table({"text": ["a" * (16 << 20)]}), compression="zstd"), [],
     "row group 1 (rows 1..): column 'text' holds a cell larger than 1 MiB"),
    ("row.parquet", parquet_bytes(pa.table({"text": ["ab"] * 40 + ["a" * (MAX_LINE_BYTES + 1)]})), [],
     "row 41 is 1,048,577 bytes, longer than 1 MiB"),
    ("w.csv", ("text," + ",".join(f"c{i}" for i in range(300)) + "\nab," + ",".join("x" * 300) + "\n").encode(), [],
     "300 label columns; at most 256"),
    ("e.tsv", b"text\texpected_path\nab\t9\n", [], "expected_path 9 -> option 8 is out of range"),
    ("t.tsv", TSV_OK.encode(), ["--labels", "domain", "--intended", "domain:story=3"], "option 3 is out of range"),
    ("l.tsv", b"text\tlab\nab\t" + b"x" * 300 + b"\n", ["--labels", "lab"],
     "line 2: label column 'lab' holds a value of 300 characters"),
]


@pytest.mark.parametrize("name,data,extra,fragment", CASES, ids=[f"{i}-{c[0]}" for i, c in enumerate(CASES)])
def test_malformed_input_is_one_line_before_the_model(tmp_path, capsys, monkeypatch, name, data, extra, fragment):
    refuse_before_the_model(monkeypatch)
    f = tmp_path / name
    f.write_bytes(data)
    before = snapshot(tmp_path)
    code = main(["corpus", str(CK), "--data", str(f), "--out", str(tmp_path / "out"), "--quiet", *extra])
    err = capsys.readouterr().err
    assert code == 2, err
    one_line(err)
    assert fragment in err, err
    assert name in err or "intended" in err, err  # the file, or the option given on the command line
    assert snapshot(tmp_path) == before


def test_control_characters_in_echoed_names_are_escaped(tmp_path, capsys, monkeypatch):
    refuse_before_the_model(monkeypatch)
    f = tmp_path / "a\nb\x1b[31m.csv"
    f.write_bytes(b"words,\x1b]0;owned\x07\x1b[2J\nab,x\n")  # no text column: the header is echoed
    code = main(["corpus", str(CK), "--data", str(f), "--out", str(tmp_path / "out"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2
    one_line(err)
    assert not re.search(r"[\x00-\x1f\x7f]", err[:-1]), repr(err)
    assert "\\x1b]0;owned\\x07\\x1b[2J" in err and "a\\nb\\x1b[31m.csv" in err


def test_a_label_value_longer_than_a_label_is_text_not_a_label(tmp_path):
    data = D.load_corpus(b"text\tnote\tlab\nab\t" + b"y" * 300 + b"\tx\ncd\tz\tx\n", "n.tsv")
    assert data.label_columns == ("lab",) and data.label_values == {"lab": ("x",)}
    assert data.notes == (f"column note has values longer than {D.MAX_LABEL_CHARS} characters: not used as a label",)
    # the CSV field limit no longer contradicts the 1 MiB a row: a 200 KB field is read
    assert [len(r.text) for r in D.load_corpus(b'text\n"' + b"a" * 200_000 + b'"\n', "f.csv")] == [200_000]


# --- the output set -------------------------------------------------------------------------------

TSV = ("text\tdomain\n" + "".join(f"{t}\t{d}\n" for t, d in [
    ("Once upon a time, there was a little girl named Lily.", "story"),
    ("Solve for x: 3x + 5 = 20.", "math")]))


def corpus(capsys, *argv) -> tuple[int, str]:
    code = main(["corpus", str(CK), "--quiet", "--max-tokens", "16", "--min-count", "1", *map(str, argv)])
    return code, capsys.readouterr().err


@pytest.fixture
def earlier_set(tmp_path, capsys) -> Path:
    data = tmp_path / "d.tsv"
    data.write_text(TSV, encoding="utf-8")
    out = tmp_path / "out"
    code, err = corpus(capsys, "--data", data, "--out", out)
    assert code == 0, err
    assert (out / "label_shares.csv").is_file()
    return out


def test_a_finished_run_replaces_the_set_whole(earlier_set, tmp_path, capsys):
    txt = tmp_path / "p.txt"
    txt.write_text("Once upon a time\n", encoding="utf-8")
    n_before = len(list(earlier_set.iterdir()))
    code, err = corpus(capsys, "--data", txt, "--out", earlier_set)
    assert code == 0, err
    assert f"replaced an earlier set of {n_before} files" in err
    names = sorted(p.name for p in earlier_set.iterdir())
    doc = json.loads((earlier_set / "corpus.json").read_text())
    assert names == sorted([*(f"{t}.{f}" for t in doc["tables"] for f in ("csv", "parquet")), "corpus.html",
                            "corpus.json"])
    assert not any(n.startswith("label_shares") for n in names)  # no stale table of the labelled run
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.tsv", "out", "p.txt"]  # no hidden directory left


def test_an_interrupted_run_leaves_the_earlier_set(earlier_set, tmp_path, capsys, monkeypatch):
    before = snapshot(tmp_path)
    calls = []
    real = P.frame_bytes

    def stop_on_third(df, fmt, *rest):
        calls.append(fmt)
        if len(calls) == 3:
            raise Stopped(15)  # SIGTERM while the tables are being written
        return real(df, fmt, *rest)

    monkeypatch.setattr(P, "frame_bytes", stop_on_third)
    txt = tmp_path / "p.txt"
    txt.write_text("Once upon a time\n", encoding="utf-8")
    before["p.txt"] = hashlib.sha256(txt.read_bytes()).hexdigest()
    code, err = corpus(capsys, "--data", txt, "--out", earlier_set)
    assert code == 143 and err == "routescope corpus: stopped (SIGTERM)\n"
    assert snapshot(tmp_path) == before  # the earlier set as it was, nothing hidden left beside it


def test_a_killed_runs_directory_is_removed_next_time(earlier_set, tmp_path, capsys):
    stale = tmp_path / ".out.0123456789ab.part"  # as a SIGKILLed run leaves it: nobody holds its lock
    stale.mkdir()
    (stale / "summary.csv").write_text("half")
    code, err = corpus(capsys, "--data", tmp_path / "d.tsv", "--out", earlier_set)
    assert code == 0 and f"removed {stale}" in err and not stale.exists()


@pytest.mark.parametrize("make,fragment", [
    (lambda out, outside: out.symlink_to(outside / "nothing"), "is a symbolic link to nothing"),
    (lambda out, outside: out.symlink_to(outside, target_is_directory=True), "is a symbolic link"),
    (lambda out, outside: out.write_text("x"), "exists and is not a directory"),
    (lambda out, outside: (out.mkdir(), (out / "notes.txt").write_text("mine")), "holds 1 entry that no output set"),
    (lambda out, outside: (out.mkdir(), (out / "summary.csv").symlink_to(outside / "victim")),
     "holds 1 entry that no output set"),
])
def test_out_problems_are_refused_before_the_model(tmp_path, capsys, monkeypatch, make, fragment):
    refuse_before_the_model(monkeypatch)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim").write_text("keep me")
    data = tmp_path / "d.tsv"
    data.write_text(TSV, encoding="utf-8")
    out = tmp_path / "out"
    make(out, outside)
    before = snapshot(tmp_path)
    code, err = corpus(capsys, "--data", data, "--out", out)
    assert code == 2, err
    one_line(err)
    assert fragment in err, err
    assert snapshot(tmp_path) == before and os.path.islink(out) == (fragment.startswith("is a symbolic"))


def test_a_planted_link_at_a_target_is_replaced_not_followed(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    target = tmp_path / "corpus.html"
    target.symlink_to(victim)
    P.write_file(target, b"page")
    assert victim.read_text() == "keep me" and not target.is_symlink() and target.read_bytes() == b"page"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus.html", "victim"]


def test_out_in_an_unwritable_directory_is_refused_first(tmp_path, capsys, monkeypatch):
    if os.geteuid() == 0:
        pytest.skip("root writes anywhere")
    refuse_before_the_model(monkeypatch)
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    try:
        code, err = corpus(capsys, "--shipped", "table6", "--out", locked / "out")
        assert code == 2 and "permission denied" in err
    finally:
        locked.chmod(0o700)


# --- bounded memory ---------------------------------------------------------------------------------

ROW = ("hello world, this is a long row of text " * 30000)[:MAX_LINE_BYTES - 64]


def _write_big(path: Path, n_rows: int) -> None:
    suffix = path.suffix
    if suffix == ".parquet":
        pq.write_table(pa.table({"text": [ROW] * n_rows}), path, row_group_size=32)
        return
    with path.open("w", encoding="utf-8") as f:
        if suffix == ".csv":
            f.write("text,lab\n")
        elif suffix == ".tsv":
            f.write("text\tlab\n")
        for i in range(n_rows):
            if suffix == ".txt":
                f.write(ROW + "\n")
            elif suffix == ".csv":
                f.write(f'"{ROW}",{i % 3}\n')
            elif suffix == ".tsv":
                f.write(f"{ROW}\t{i % 3}\n")
            else:
                f.write(json.dumps({"text": ROW, "lab": i % 3}) + "\n")


@pytest.mark.slow
@pytest.mark.parametrize("suffix", [".txt", ".csv", ".tsv", ".jsonl", ".parquet"])
def test_peak_memory_of_a_64_mib_file_of_1_mib_rows(tmp_path, suffix):
    f = tmp_path / f"big{suffix}"
    _write_big(f, 60)
    code, out, err, seconds, peak = run_measured(["corpus", CK, "--data", f, "--max-tokens", "8", "--out", "o",
                                                  "--quiet"], tmp_path)
    print(f"\n{suffix}: {f.stat().st_size / 2**20:.0f} MiB file, {60 * len(ROW) / 2**20:.0f} MiB of text in 1 MiB "
          f"rows, --max-tokens 8: exit {code}, peak RSS {peak / 2**20:.0f} MiB, {seconds:.1f} s")
    assert code == 0, err
    assert peak < GiB
    assert json.loads((tmp_path / "o" / "corpus.json").read_text())["a"]["tokens"] == 60 * 8


@pytest.mark.parametrize("cell_mib", [16, 300])
def test_a_parquet_cell_too_large_is_refused_from_metadata(tmp_path, cell_mib):
    f = tmp_path / "c.parquet"
    pq.write_table(pa.table({"text": ["a" * (cell_mib << 20)]}), f, compression="zstd")
    code, out, err, seconds, peak = run_measured(["corpus", CK, "--data", f, "--out", "o", "--quiet"], tmp_path)
    print(f"\n{f.stat().st_size:,} byte Parquet file with a {cell_mib} MiB cell: exit {code}, peak RSS "
          f"{peak / 2**20:.0f} MiB, {seconds:.1f} s")
    assert code == 2 and "holds a cell larger than 1 MiB" in err
    assert peak < GiB
    shutil.rmtree(tmp_path / "o", ignore_errors=True)


def test_sigterm_while_the_set_is_written_leaves_the_earlier_set(earlier_set, tmp_path):
    """A real process, stopped with SIGTERM the moment its hidden output directory appears (the
    tables are being written): exit 143, the earlier set byte for byte, nothing hidden left."""
    import signal
    import subprocess
    import sys
    import time

    from procs import running

    txt = tmp_path / "p.txt"
    txt.write_text("".join(f"Once upon a time there was a girl number {i}.\n" for i in range(200)), encoding="utf-8")
    shutil.copytree(earlier_set, tmp_path / "keep")  # to put the earlier set back if a run finishes first
    before = snapshot(tmp_path)
    cmd = [sys.executable, "-m", "routescope.cli", "corpus", str(CK), "--data", str(txt), "--out", str(earlier_set),
           "--quiet", "--max-tokens", "16"]
    for _ in range(3):  # the write takes a fraction of a second; a run that finished first is tried again
        with running(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
            while proc.poll() is None and not any(p.name.endswith(".part") for p in tmp_path.iterdir()):
                time.sleep(0.001)
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
            err = proc.stderr.read().decode()
        if proc.returncode == 143:
            break
        assert proc.returncode == 0, err
        shutil.rmtree(earlier_set)
        shutil.copytree(tmp_path / "keep", earlier_set)
    else:
        pytest.skip("the run finished before SIGTERM three times")
    assert err == "routescope corpus: stopped (SIGTERM)\n", err
    assert snapshot(tmp_path) == before
