"""`routescope export --engine ray` on a local Ray cluster: the dataset equals the single-process
export row for row, reruns skip finished partitions, a dying worker is retried, every input format
reads the same prompts, and every Ray process the tests start is stopped."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from routescope.analysis.export import columns as C
from routescope.analysis.export.batch import ExportJob
from routescope.analysis.export.ray_output import read_dataset
from routescope.analysis.export.table_files import read_parquet, read_provenance
from routescope.analysis.ray_cluster import LOCAL_OBJECT_STORE
from procs import running, wait_gone

ray = pytest.importorskip("ray", reason="ray is not installed: pip install -e '.[distributed]' (the distributed extra)")
from routescope.analysis.export import ray_export as D  # noqa: E402  (after the skip: the module needs ray at run time only)

pytestmark = pytest.mark.slow

PROMPTS = ["Once upon a time, there was a little girl named Lily.", "", "She loved playing with her toys.",
           "Solve this problem: 1 + 1 = 2.", "   ", "Find the largest prime.", "One day a boy went to the park.",
           "from sympy import sqrt", "Evaluate the sum and simplify.", "=cmd|' /C calc'!A0 \u2028 line", "Lily smiled.",
           "Express your answer as a fraction.", "The dog ran home."]
N = sum(1 for p in PROMPTS if p.strip())  # 11: blank lines are not prompts
TOKEN = "ROUTESCOPE_RAY_TEST"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A local Ray cluster with room for 2 one-CPU workers (and a CPU for reading and grouping), shared
    by the module's tests. Its processes carry a token in their environment; after ray.shutdown none
    may be left. The crash hook's flag path is set for every worker."""
    token = uuid.uuid4().hex
    flag = tmp_path_factory.mktemp("crash") / "crash-once"
    os.environ[TOKEN], os.environ[D.CRASH_ONCE_ENV] = token, str(flag)
    tmp = tempfile.mkdtemp(prefix="rs-ray-test-")
    try:
        ray.init(num_cpus=3, include_dashboard=False, object_store_memory=LOCAL_OBJECT_STORE, _temp_dir=tmp,
                 logging_level="WARNING")
        yield flag
    finally:
        ray.shutdown()
        del os.environ[TOKEN], os.environ[D.CRASH_ONCE_ENV]
        # a worker exits within seconds when idle; one CI run saw it take over 30 s on the loaded 2 cores,
        # so the bound is 90 s: a process still there then was left behind, not slow
        left = wait_gone(TOKEN, token, timeout=90.0)
        for pid in left:
            os.kill(pid, 9)
        shutil.rmtree(tmp, ignore_errors=True)
        assert not left, f"Ray processes left after ray.shutdown: {left}"


@pytest.fixture(scope="module")
def prompt_file(tmp_path_factory):
    f = tmp_path_factory.mktemp("prompts") / "prompts.txt"
    f.write_text("\n".join(PROMPTS) + "\n", encoding="utf-8")
    return f


@pytest.fixture(scope="module")
def single(tmp_path_factory, checkpoint, prompt_file):
    """The single-process export (the reference) of the prompt file, batch size 2."""
    from routescope.cli.main import main

    out = tmp_path_factory.mktemp("single") / "single.parquet"
    assert main(["export", str(checkpoint("gumbel_v1")), "--prompts", str(prompt_file), "--out", str(out),
                 "--batch-size", "2", "--quiet", "--device", "cpu"]) == 0
    return out


JOB = ExportJob(batch_size=2)


def assert_rows_equal(got: pd.DataFrame, want: pd.DataFrame) -> None:
    """Row for row: the same rows in the same order, text exact, numbers within 1e-6 relative."""
    assert len(want) > 0
    pd.testing.assert_frame_equal(got.reset_index(drop=True), want.reset_index(drop=True), check_exact=False,
                                  rtol=1e-6, atol=0.0)


def parts(out) -> list[str]:
    return sorted(p.name for p in out.iterdir() if p.name.startswith("part-"))


def test_two_workers_write_the_single_process_export_row_for_row(cluster, checkpoint, prompt_file, single, tmp_path):
    out = tmp_path / "ds"
    s = D.export_ray(checkpoint("gumbel_v1"), D.PromptSource(path=str(prompt_file)), str(out), JOB, workers=2,
                     partition_size=4, device="cpu", progress=False)
    assert (s.prompts, s.partitions, s.skipped) == (N, 3, 0)
    assert parts(out) == ["part-000000000-000000004.parquet", "part-000000004-000000008.parquet",
                          "part-000000008-000000011.parquet"]
    assert (out / "_SUCCESS").is_file() and len(list((out / "_done").iterdir())) == 3
    want = read_parquet(single)
    assert_rows_equal(read_dataset(str(out)), want)
    assert s.rows == len(want)
    # a partition holds exactly its prompts: the 2nd has the 5th..8th prompts of the file
    ids = read_parquet(out / parts(out)[1])[C.PROMPT_ID].unique().tolist()
    assert ids == [str(n) for n, p in enumerate(PROMPTS, 1) if p.strip()][4:8]
    # same schema and provenance in every file as in the single-process file
    for name in parts(out):
        assert pq.read_schema(out / name).equals(pq.read_schema(single), check_metadata=True), name
        assert read_provenance(out / name) == read_provenance(single)
    # pandas reads the directory as one table (markers are skipped: they start with "_")
    whole = pd.read_parquet(out).sort_values([C.PROMPT_ID, C.POSITION, C.SITE, C.KIND, C.OPTION], ignore_index=True)
    assert len(whole) == len(want)


def test_a_rerun_skips_finished_partitions(cluster, checkpoint, prompt_file, single, tmp_path):
    out = tmp_path / "ds"
    ck, src = checkpoint("gumbel_v1"), D.PromptSource(path=str(prompt_file))
    first = D.export_ray(ck, src, str(out), JOB, workers=2, partition_size=4, device="cpu", progress=False)
    stamps = {n: (out / n).stat().st_mtime_ns for n in parts(out)}
    # a crash after the file but before its marker, and another partition lost entirely
    (out / "_done" / (parts(out)[0] + ".json")).unlink()
    (out / parts(out)[2]).unlink()
    again = D.export_ray(ck, src, str(out), JOB, workers=2, partition_size=4, device="cpu", progress=False)
    assert (again.partitions, again.skipped) == (3, 1)
    redone = {s["partition"] for s in again.partition_stats}
    assert redone == {"part-000000000-000000004.parquet", "part-000000008-000000011.parquet"}
    assert (out / "part-000000004-000000008.parquet").stat().st_mtime_ns == stamps["part-000000004-000000008.parquet"]
    assert again.rows == first.rows - sum(s["rows"] for s in first.partition_stats
                                          if s["partition"] == "part-000000004-000000008.parquet")
    assert_rows_equal(read_dataset(str(out)), read_parquet(single))
    # nothing left to do: no worker starts, nothing is rewritten
    stamps = {n: (out / n).stat().st_mtime_ns for n in parts(out)}
    done = D.export_ray(ck, src, str(out), JOB, workers=2, partition_size=4, device="cpu", progress=False)
    assert (done.skipped, done.rows, done.partition_stats) == (3, 0, [])
    assert stamps == {n: (out / n).stat().st_mtime_ns for n in parts(out)}
    # a prompt edited since: only its partition is redone (markers record each partition's prompts)
    edited = tmp_path / "edited.txt"
    edited.write_text(prompt_file.read_text(encoding="utf-8").replace("Find the largest prime.", "Find a prime."),
                      encoding="utf-8")
    redo = D.export_ray(ck, D.PromptSource(path=str(edited)), str(out), JOB, workers=2, partition_size=4,
                        device="cpu", progress=False)
    assert [s["partition"] for s in redo.partition_stats] == ["part-000000000-000000004.parquet"]
    assert {n: (out / n).stat().st_mtime_ns for n in parts(out)[1:]} == {n: stamps[n] for n in parts(out)[1:]}
    tokens = read_parquet(out / parts(out)[0]).query("prompt_id == '6'").drop_duplicates("position")["token"]
    assert "".join(tokens) == "Find a prime."


def test_a_rerun_with_other_settings_is_refused(cluster, checkpoint, prompt_file, tmp_path):
    out = tmp_path / "ds"
    ck, src = checkpoint("gumbel_v1"), D.PromptSource(path=str(prompt_file))
    D.export_ray(ck, src, str(out), JOB, workers=1, partition_size=6, device="cpu", progress=False)
    before = sorted(p.name for p in out.rglob("*"))
    with pytest.raises(ValueError, match=r"other settings \(provenance.job.seed differ\)"):
        D.export_ray(ck, src, str(out), ExportJob(batch_size=2, seed=7), workers=1, partition_size=6, device="cpu")
    with pytest.raises(ValueError, match=r"other settings \(partition_size differ\)"):
        D.export_ray(ck, src, str(out), JOB, workers=1, partition_size=5, device="cpu")
    assert sorted(p.name for p in out.rglob("*")) == before


def test_a_worker_dying_mid_partition_is_restarted_and_its_partition_redone(cluster, checkpoint, prompt_file,
                                                                            single, tmp_path):
    cluster.write_text("")  # the first worker to claim it exits after writing part of a partition
    out = tmp_path / "ds"
    s = D.export_ray(checkpoint("gumbel_v1"), D.PromptSource(path=str(prompt_file)), str(out), JOB, workers=2,
                     partition_size=4, device="cpu", progress=False)
    assert not cluster.exists() and cluster.with_name(cluster.name + ".claimed").exists()  # it did die
    assert s.skipped == 0 and len(s.partition_stats) == 3
    assert_rows_equal(read_dataset(str(out)), read_parquet(single))
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")]  # no half-written file left


def test_jsonl_and_parquet_prompts_read_as_the_single_process_reads_a_tsv(cluster, checkpoint, tmp_path):
    from routescope.cli.main import main

    texts = [p for p in PROMPTS if p.strip()]
    ids = [f"Q{k}" for k in range(len(texts))]
    tsv = tmp_path / "p.tsv"
    tsv.write_text("prompt_id\tprompt\n" + "".join(f"{i}\t{t}\n" for i, t in zip(ids, texts)), encoding="utf-8")
    want = tmp_path / "single.parquet"
    ck = checkpoint("moep")
    assert main(["export", str(ck), "--prompts", str(tsv), "--out", str(want), "--batch-size", "2", "--quiet",
                 "--device", "cpu"]) == 0
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text("".join(json.dumps({"prompt": t, "prompt_id": i}) + "\n" for i, t in zip(ids, texts)),
                     encoding="utf-8")
    pqdir = tmp_path / "prompts.parquet"  # a directory of two Parquet files, read in file-name order
    pqdir.mkdir()
    pd.DataFrame({"prompt_id": ids[:5], "prompt": texts[:5]}).to_parquet(pqdir / "a.parquet")
    pd.DataFrame({"prompt_id": ids[5:], "prompt": texts[5:]}).to_parquet(pqdir / "b.parquet")
    for src in (f"file://{jsonl}", str(pqdir)):
        out = tmp_path / f"ds-{Path(src).suffix[1:]}"
        D.export_ray(ck, D.PromptSource(path=src), str(out), JOB, workers=2, partition_size=4, device="cpu",
                     progress=False)
        assert_rows_equal(read_dataset(str(out)), read_parquet(want))


def test_parquet_prompts_without_ids_are_numbered_like_command_line_prompts(cluster, checkpoint, tmp_path):
    from routescope.cli.main import main

    texts = ["Once upon a time", "Solve this problem", "She loved her toys"]
    ck = checkpoint("gumbel_v2")
    want = tmp_path / "single.parquet"
    argv = [a for t in texts for a in ("--prompt", t)]
    assert main(["export", str(ck), *argv, "--out", str(want), "--batch-size", "2", "--quiet"]) == 0
    src = tmp_path / "p.parquet"
    pd.DataFrame({"prompt": texts, "other": [1, 2, 3]}).to_parquet(src)
    out = tmp_path / "ds"
    D.export_ray(ck, D.PromptSource(path=str(src)), str(out), JOB, workers=1, partition_size=2, progress=False)
    assert_rows_equal(read_dataset(str(out)), read_parquet(want))


@pytest.mark.parametrize("make, words", [
    (lambda d: d / "none.txt", ["none.txt", "no such prompt file"]),
    (lambda d: (d / "p.jsonl").write_text('{"text": "hi"}\n') and d / "p.jsonl", ["p.jsonl", "no 'prompt' column"]),
    (lambda d: (d / "p.txt").write_bytes(b"fine\nbad \xff byte\n") and d / "p.txt",
     ["p.txt", "line 2", "byte offset 9", "not UTF-8"]),
    (lambda d: (d / "p.tsv").write_text("prompt_id\tprompt\nA\thi\nA\tyo\n") and d / "p.tsv",
     ["p.tsv", "duplicate prompt_id(s) A"]),
    (lambda d: pd.DataFrame({"prompt_id": ["A", "A"], "prompt": ["x", "y"]}).to_parquet(d / "p.parquet")
     or d / "p.parquet", ["p.parquet", "duplicate prompt_id(s) A"]),
    (lambda d: (d / "p.csv").write_text("prompt\nhi\n") and d / "p.csv", ["p.csv", ".txt, .tsv, .jsonl or .parquet"]),
    # a table's prompts follow the one prompt rule (analysis.inputs.prompts.prompt_problem)
    (lambda d: (d / "p.jsonl").write_text('{"prompt": "hi"}\n{"prompt": " \\t "}\n') and d / "p.jsonl",
     ["p.jsonl", "row 2", "the prompt is empty"]),
    (lambda d: (d / "p.jsonl").write_text('{"prompt": "hi"}\n{"prompt": "caf\\udce9"}\n') and d / "p.jsonl",
     ["p.jsonl", "cannot read it as jsonl", "not UTF-8 text"]),  # the JSON reader refuses it first
])
def test_bad_prompt_files_are_one_line_errors_and_write_no_part(cluster, checkpoint, tmp_path, make, words):
    src = make(tmp_path)
    out = tmp_path / "ds"
    with pytest.raises(ValueError) as e:
        D.export_ray(checkpoint("gumbel_v1"), D.PromptSource(path=str(src)), str(out), JOB, workers=1,
                     progress=False)
    msg = str(e.value)
    assert "\n" not in msg and all(w in msg for w in words), msg
    assert not out.exists() or not parts(out)


def test_an_output_that_is_a_file_is_refused_before_any_work(checkpoint, prompt_file, tmp_path):
    out = tmp_path / "x.parquet"
    out.write_bytes(b"keep")
    with pytest.raises(ValueError, match="is a file; --engine ray writes a directory"):
        D.export_ray(checkpoint("gumbel_v1"), D.PromptSource(path=str(prompt_file)), str(out), JOB)
    assert out.read_bytes() == b"keep"


def test_the_command_starts_a_local_cluster_and_stops_every_process_it_started(checkpoint, prompt_file, single,
                                                                              tmp_path):
    """`routescope export --engine ray` in a fresh process (no RAY_ADDRESS): it starts its own local
    Ray, writes the dataset, and when it exits no process carrying its environment is left."""
    token = uuid.uuid4().hex
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", D.CRASH_ONCE_ENV)}
    env[TOKEN] = token
    out = tmp_path / "ds"
    cmd = [sys.executable, "-m", "routescope.cli", "export", str(checkpoint("gumbel_v1")), "--prompts", str(prompt_file),
           "--out", str(out), "--engine", "ray", "--workers", "2", "--partition-size", "4", "--batch-size", "2",
           "--quiet", "--device", "cpu"]
    with running(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    assert f"for {N} prompts in 3 partition(s) to {out}" in err
    assert_rows_equal(read_dataset(str(out)), read_parquet(single))
    assert wait_gone(TOKEN, token) == []


def test_a_hugging_face_moe_model_exports_on_ray_as_in_one_process(cluster, tokenizer, prompt_file, tmp_path):
    """A transformers Mixtral directory (sharded safetensors and all) travels to the workers and
    exports the same rows as the single-process command; its family column is the model_type."""
    from hf_models import hf_model
    from routescope.cli.main import main

    model = hf_model("mixtral", tokenizer.get_vocab_size())
    ck = tmp_path / "tiny-mixtral"
    model.save_pretrained(ck, max_shard_size="40KB")  # several shards and an index, as big models come
    tokenizer.save(str(ck / "tokenizer.json"))
    assert len(list(ck.glob("*.safetensors"))) > 1 and (ck / "model.safetensors.index.json").is_file()
    single_out = tmp_path / "single.parquet"
    assert main(["export", str(ck), "--prompts", str(prompt_file), "--out", str(single_out), "--batch-size", "2",
                 "--quiet", "--device", "cpu"]) == 0
    out = tmp_path / "ds"
    s = D.export_ray(ck, D.PromptSource(path=str(prompt_file)), str(out), JOB, workers=2, partition_size=6,
                     device="cpu", progress=False)
    want = read_parquet(single_out)
    assert s.prompts == N and set(want[C.FAMILY]) == {"mixtral"}
    assert_rows_equal(read_dataset(str(out)), want)
