"""Hostile command lines and input files (issue 15, items 6 and 7), run through `routescope`'s own
`main()`: each bad input gets one line `routescope <cmd>: ...` naming the problem, exit code 2, no
traceback and nothing written; good input still works. `routes` streamed over a few hundred
probes equals a plain probe-by-probe computation."""
from __future__ import annotations

import json
import os
import random
import stat
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from routescope.analysis.runs import domain as D
from routescope.cli.main import main
from routescope.core_models import tracing
from routescope.core_models.checkpoint import load_checkpoint
from tolerances import EPS32, FORWARD_EPS

ROOT = Path(__file__).resolve().parents[2]
CK = ROOT / "checkpoints" / "papaformer-gumbel-v2"  # 2 paths, 3 parallel layers
PAPAFORMERS = ("papaformer-gumbel-v2", "papaformer-gumbel-v1", "papaformer-share-linear")
HEADER = "prompt_id\tdomain\texpected_path\tprompt\n"


def run(argv, capsys) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `routescope argv` run in this process."""
    try:
        code = main([str(a) for a in argv])
    except SystemExit as e:  # argparse errors
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def listing(root: Path) -> dict[str, tuple[int, bytes]]:
    return {str(p.relative_to(root)): (p.stat().st_mode, p.read_bytes() if p.is_file() else b"")
            for p in sorted(root.rglob("*"))}


def assert_refused(argv, capsys, tmp_path, command: str, *fragments: str) -> str:
    before = listing(tmp_path)
    code, out, err = run(argv, capsys)
    assert code == 2, (code, err)
    assert "Traceback" not in err and err.endswith("\n") and err.count("\n") == 1, err
    assert err.startswith(f"routescope {command}: " if command else "routescope: "), err
    for f in fragments:
        assert f in err, (f, err)
    assert out == ""
    assert listing(tmp_path) == before, "a refused command wrote or changed files"
    return err


# --- option values, checked at parsing --------------------------------------------------------

@pytest.mark.parametrize("argv,command,fragments", [
    (["--threads", "-1", "routes", CK], "", ["--threads", "'-1'", "0.."]),
    (["--threads", "1e3", "routes", CK], "", ["--threads"]),
    (["export", CK, "--prompt", "hi", "--out", "{tmp}/o.csv", "--seed", str(2**64 - 1)], "export",
     ["--seed", str(2**64 - 1), str(2**63 - 1)]),
    (["export", CK, "--prompt", "hi", "--out", "{tmp}/o.csv", "--seed", "-1"], "export", ["--seed"]),
    (["generate", CK, "hi", "--seed", str(2**63)], "generate", ["--seed"]),
    (["attribute", CK, "--prompt", "hi", "--seed", "-5"], "attribute", ["--seed"]),
    (["generate", CK, "hi", "--top-n", "-1"], "generate", ["--top-n", ">= 1"]),
    (["generate", CK, "hi", "--top-n", "0"], "generate", ["--top-n"]),
    (["generate", CK, "hi", "--max-new-tokens", "-3"], "generate", ["--max-new-tokens", ">= 0"]),
    (["generate", CK, "hi", "--top-k", "-1"], "generate", ["--top-k"]),
    (["generate", CK, "hi", "--top-p", "0"], "generate", ["--top-p", "(0, 1]"]),
    (["generate", CK, "hi", "--top-p", "1.5"], "generate", ["--top-p"]),
    (["generate", CK, "hi", "--temperature", "0"], "generate", ["--temperature"]),
    (["generate", CK, "hi", "--temperature", "nan"], "generate", ["--temperature", "nan"]),
    (["generate", CK, "hi", "--top-n", "\uff13"], "generate", ["--top-n"]),  # full-width 3
    (["export", CK, "--prompt", "hi", "--out", "{tmp}/o.csv", "--batch-size", "0"], "export", ["--batch-size"]),
    (["routes", CK, "--batch-size", "-2"], "routes", ["--batch-size"]),
    (["attribute", CK, "--prompt", "hi", "--n-steps", "0"], "attribute", ["--n-steps"]),
])
def test_bad_option_values(capsys, tmp_path, argv, command, fragments):
    argv = [str(a).replace("{tmp}", str(tmp_path)) for a in argv]
    assert_refused(argv, capsys, tmp_path, command, *fragments)


def test_huge_thread_count_is_refused_not_a_crash(tmp_path):
    """--threads 100000 used to reach torch.set_num_threads and segfault (so: a subprocess)."""
    proc = subprocess.run([sys.executable, "-m", "routescope.cli", "--threads", "100000", "routes", str(CK)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("routescope: argument --threads:"), proc.stderr
    assert "100000" in proc.stderr and proc.stdout == "" and not any(tmp_path.iterdir())


def test_drop_specs_take_ascii_digits_only(capsys, tmp_path):
    assert_refused(["generate", CK, "hi", "--drop", "\uff11"], capsys, tmp_path, "generate",
                   "invalid ablation spec: cannot read the options: drop '\uff11'")
    assert_refused(["export", CK, "--prompt", "hi", "--out", tmp_path / "o.csv", "--force", "parallel.0:\u0661"],
                   capsys, tmp_path, "export", "cannot read the options: force 'parallel.0:\u0661'")


# --- export outputs and prompt files ------------------------------------------------------------

def test_export_outputs_are_checked_before_the_work(capsys, tmp_path):
    (tmp_path / "taken.csv").mkdir()
    (tmp_path / "file").write_text("x")
    base = ["export", CK, "--prompt", "hi"]
    assert_refused(base + ["--out", tmp_path / "taken.csv"], capsys, tmp_path, "export",
                   f"{tmp_path / 'taken.csv'}: is a directory")
    assert_refused(base + ["--out", tmp_path], capsys, tmp_path, "export", "is a directory")
    assert_refused(base + ["--out", tmp_path / "ok.csv", "--out", tmp_path / "taken.csv"], capsys, tmp_path,
                   "export", "is a directory")  # one bad output of two: neither is written
    assert_refused(base + ["--out", tmp_path / "missing" / "o.csv"], capsys, tmp_path, "export",
                   f"directory {tmp_path / 'missing'} does not exist")
    assert_refused(base + ["--out", tmp_path / "file" / "o.csv"], capsys, tmp_path, "export", "is not a directory")
    assert_refused(base + ["--out", tmp_path / "o.csv", "--out", tmp_path / "o.csv"], capsys, tmp_path, "export",
                   "given twice")


def test_unwritable_output_names_the_users_path(capsys, tmp_path):
    """/sys refuses new files even to root (os.access then says yes): the error comes from creating
    the temporary file and must still name the path the user gave."""
    target = Path("/sys/routescope-export-test.csv")
    if not Path("/sys").is_dir():
        pytest.skip("no /sys on this system")
    err = assert_refused(["export", CK, "--prompt", "hi", "--out", target], capsys, tmp_path, "export", str(target))
    assert ".tmp" not in err
    assert not target.exists()


@pytest.mark.parametrize("umask,mode", [(0o022, 0o644), (0o002, 0o664), (0o077, 0o600)])
def test_export_files_get_the_umask_mode(capsys, tmp_path, umask, mode):
    old = os.umask(umask)
    try:
        code, _, err = run(["export", CK, "--prompt", "Once upon a time", "--out", tmp_path / "a.csv",
                            "--out", tmp_path / "a.parquet", "--quiet"], capsys)
    finally:
        os.umask(old)
    assert code == 0, err
    assert {p.name: stat.S_IMODE(p.stat().st_mode) for p in tmp_path.iterdir()} == {"a.csv": mode, "a.parquet": mode}


def test_prompt_files(capsys, tmp_path):
    bad = tmp_path / "p.txt"
    bad.write_bytes(b"fine line\nbroken \xff line\n")
    assert_refused(["export", CK, "--prompts", bad, "--out", tmp_path / "o.csv"], capsys, tmp_path, "export",
                   str(bad), "line 2", "byte offset 17", "UTF-8")
    assert_refused(["export", CK, "--prompts", tmp_path, "--out", tmp_path / "o.csv"], capsys, tmp_path, "export",
                   "is a directory")
    assert_refused(["export", CK, "--prompts", tmp_path / "none.txt", "--out", tmp_path / "o.csv"], capsys,
                   tmp_path, "export", "no such prompt file")
    tsv = tmp_path / "p.tsv"
    tsv.write_text("prompt_id\tprompt\n1\thello\n2\tx\textra\n")
    assert_refused(["export", CK, "--prompts", tsv, "--out", tmp_path / "o.csv"], capsys, tmp_path, "export",
                   str(tsv), "line 3 has 3 fields")


def test_good_export_still_writes_every_prompt(capsys, tmp_path):
    from routescope.analysis.export import columns as C
    from routescope.analysis.export.table_files import read_csv

    prompts = tmp_path / "p.txt"
    prompts.write_text("\ufeffOnce upon a time\n\nSolve this\u2028now\n", encoding="utf-8")  # BOM, U+2028 inside
    code, _, err = run(["export", CK, "--prompts", prompts, "--out", tmp_path / "o.csv", "--quiet"], capsys)
    assert code == 0, err
    df = read_csv(tmp_path / "o.csv")
    assert sorted(df[C.PROMPT_ID].unique()) == ["1", "3"]  # line numbers; U+2028 does not split a line
    assert df[df[C.PROMPT_ID] == "1"][C.TOKEN].iloc[0] == "Once"  # no byte order mark in the first prompt


# --- probe files ---------------------------------------------------------------------------------

PROBE_CASES = {
    "extra field": (HEADER + "P1\tstory\t1\thello\nP2\textra\tstory\t1\thi\n", ["line 3 has 5", "header has 4"]),
    "missing field": (HEADER + "P1\tstory\thello\n", ["line 2 has 3"]),
    "not utf-8": (HEADER.encode() + b"P1\tstory\t1\tcaf\xe9\n",  # 0xe9 is Latin-1 for e-acute
                  ["line 2", f"byte offset {len(HEADER) + len('P1 story 1 caf')}", "UTF-8"]),
    "full-width expected_path": (HEADER + "P1\tstory\t\uff11\thello\n", ["line 2", "expected_path '\uff11'"]),
    "expected_path beyond the paths": (HEADER + "P1\tstory\t1\thi\nP2\tmath\t9\tyo\n",
                                       ["line 3", "expected_path 9", "1..2"]),
    "expected_path 0": (HEADER + "P1\tstory\t0\thi\n", ["line 2", "expected_path '0'"]),
    "duplicate id": (HEADER + "P1\tstory\t1\thi\nP1\tmath\t2\tyo\n", ["line 3", "duplicate prompt_id 'P1'", "line 2"]),
    "empty prompt": (HEADER + "P1\tstory\t1\t\n", ["line 2", "empty prompt"]),
    "unknown column": ("prompt_id\tdomain\texpected_path\tprompt\tnote\nP1\tstory\t1\thi\tx\n", ["unknown column(s) note"]),
    "no rows": (HEADER, ["no probes"]),
    "empty file": ("", ["empty probe file"]),
    "bad paper route": ("prompt_id\tdomain\texpected_path\tprompt\tpaper_gumbel_v2\nP1\tstory\t1\thi\t2>x\n",
                        ["line 2", "paper_gumbel_v2 = '2>x'"]),
}


@pytest.mark.parametrize("case", sorted(PROBE_CASES))
def test_bad_probe_files(capsys, tmp_path, case):
    text, fragments = PROBE_CASES[case]
    f = tmp_path / "probes.tsv"
    f.write_bytes(text if isinstance(text, bytes) else text.encode())
    assert_refused(["routes", CK, "--probes", f], capsys, tmp_path, "routes", f"{f}: ", *fragments)


def test_probe_path_that_is_no_file(capsys, tmp_path):
    assert_refused(["routes", CK, "--probes", tmp_path], capsys, tmp_path, "routes", f"{tmp_path}: is a directory")
    assert_refused(["routes", CK, "--probes", tmp_path / "no.tsv"], capsys, tmp_path, "routes", "no such probe file")


# --- routes: streamed == probe by probe --------------------------------------------------------

def corpus_probes(n: int, seed: int = 3) -> list[tuple[str, str, int, str]]:
    """(prompt_id, domain, expected_path, prompt): story/math training documents cut to 1..60 words,
    every 50th the whole document four times over (longer than the context: its tail is kept)."""
    from routescope.corpora.corpus import iter_documents

    rng, docs, out = random.Random(seed), [iter_documents(d, seed) for d in ("story", "math")], []
    for i in range(n):
        words = next(docs[i % 2]).split()
        prompt = " ".join(words * 4) if i % 50 == 7 else " ".join(words[: rng.randint(1, 60)])
        out.append((f"Q{i}", ("story", "math")[i % 2], 1 + i % 2, prompt))
    return out


def routes_one_by_one(model, tok, prompt: str) -> tuple[list[int], list[int], bool, bool]:
    """(route at the last token, majority route) per parallel layer from one probe run alone, read
    from the raw router logits (Gumbel) or path/combined cosines (Share-Linear; 0 = undefined where
    the layer's Share grows to d), and whether each kind is decided by more than float noise (top-2 margin > FORWARD_EPS eps of the scale)."""
    c = model.config
    with torch.inference_mode(), tracing() as tr:
        model(torch.tensor([tok.encode(prompt).ids[-model.context:]]))
    last, major, last_clear, major_clear = [], [], True, True
    for i in range(c.n_parallel_layers):
        if c.combiner == "share_linear":
            comb = tr[f"parallel.{i}.combined"][0].double()
            if comb.shape[-1] != tr[f"parallel.{i}.paths.0.out"].shape[-1]:  # fused grow to d: no cosine
                last.append(0)
                major.append(0)
                continue
            score = torch.stack([F.cosine_similarity(tr[f"parallel.{i}.paths.{j}.out"][0].double(), comb, dim=-1)
                                 for j in range(c.n_paths)], dim=-1)  # (T, paths)
        else:
            score = tr[f"parallel.{i}.router.logits"][0].double()  # (T, options)
        per_token = [1 + int(s.argmax()) for s in score]
        top2 = score.topk(2, dim=-1).values
        clear = (top2[:, 0] - top2[:, 1]) > FORWARD_EPS * EPS32 * score.abs().max()
        last.append(per_token[-1])
        counts = Counter(per_token)
        major.append(min(r for r in counts if counts[r] == max(counts.values())))
        last_clear &= bool(clear[-1])
        major_clear &= bool(clear.all())
    return last, major, last_clear, major_clear


@pytest.fixture(scope="module")
def probe_file(tmp_path_factory):
    probes = corpus_probes(300)
    f = tmp_path_factory.mktemp("probes") / "corpus.tsv"
    f.write_text(HEADER + "".join(f"{p}\t{d}\t{e}\t{t}\n" for p, d, e, t in probes), encoding="utf-8")
    return f, probes


@pytest.mark.parametrize("name", PAPAFORMERS)
def test_streamed_routes_equal_probe_by_probe_routes(capsys, probe_file, name):
    f, probes = probe_file
    model, tok = load_checkpoint(ROOT / "checkpoints" / name)
    alone = [routes_one_by_one(model, tok, p) for _, _, _, p in probes]
    for majority in (False, True):
        want = [a[1] if majority else a[0] for a in alone]
        clear = [a[3] if majority else a[2] for a in alone]
        assert sum(clear) >= 0.9 * len(probes), "too few decisions clear of float noise to compare"
        # the library, in small chunks and odd batches (padding, several chunks)
        got = [r.tolist() for _, rs in D.stream_routes(model, tok, D.iter_probes(f), majority=majority,
                                                         batch_size=7, chunk_size=64) for r in rs]
        assert [g for g, c in zip(got, clear) if c] == [w for w, c in zip(want, clear) if c]
        # the command: JSON in file order, and the summary over those routes
        argv = ["routes", ROOT / "checkpoints" / name, "--probes", f, "--json", "--quiet", "--batch-size", "5"]
        code, out, err = run(argv + (["--majority"] if majority else []), capsys)
        assert code == 0, err
        doc = json.loads(out)
        assert [p["prompt_id"] for p in doc["prompts"]] == [p[0] for p in probes]
        assert [p["routes"] for p in doc["prompts"]] == [[r or None for r in g] for g in got]  # undefined: null
        flat = [(r, e) for g, (_, _, e, _) in zip(got, probes) for r in g if r]  # 0: undefined, not counted
        assert doc["ours"]["n_routes"] == len(flat)
        assert doc["ours"]["route 1"] == pytest.approx(sum(r == 1 for r, _ in flat) / len(flat), rel=1e-12)
        assert doc["ours"]["accuracy"] == pytest.approx(sum(r == e for r, e in flat) / len(flat), rel=1e-12)


def test_routes_text_table_lists_every_probe_in_order(capsys, probe_file):
    f, probes = probe_file
    model, tok = load_checkpoint(CK)
    code, out, err = run(["routes", CK, "--probes", f, "--quiet"], capsys)
    assert code == 0 and err == ""
    lines = out.splitlines()
    head = next(k for k, line in enumerate(lines) if line.split()[:4] == ["prompt_id", "domain", "expected", "ours"])
    rows = [line.split(maxsplit=4) for line in lines[head + 1: head + 1 + len(probes)]]
    assert [r[0] for r in rows] == [p[0] for p in probes]
    for (pid, _, _, prompt), row in zip(probes[:40], rows):
        last, _, clear, _ = routes_one_by_one(model, tok, prompt)
        if clear:
            assert row[3] == ">".join(map(str, last)), pid
    assert len({len(line) for line in lines[head: head + 1 + len(probes)]}) == 1  # one aligned table


def test_table6_routes_still_match_the_paper_table_shape(capsys):
    code, out, err = run(["routes", CK, "--json", "--quiet"], capsys)
    assert code == 0, err
    doc = json.loads(out)
    probes = D.read_probes()
    assert [p["prompt_id"] for p in doc["prompts"]] == probes["prompt_id"].tolist()
    assert [p["paper"] for p in doc["prompts"]] == probes["paper_gumbel_v2"].tolist()
    assert doc["paper"]["accuracy"] == pytest.approx(28 / 60, rel=1e-12)  # the paper's own routes
