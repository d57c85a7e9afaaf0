"""Hostile checkpoints (issue 15, item 5): each is refused by load_checkpoint / import_checkpoint and
`routescope generate` / `routescope import` with one line naming the file and the field, before it
costs memory and without writing anything; good checkpoints load unchanged.

Every bad checkpoint is a good tiny one (tests/tiny_models.py) with one thing changed."""
from __future__ import annotations

import hashlib
import json
import math
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer, models, pre_tokenizers

from routescope.cli.main import main
from routescope.core_models import build_model
from routescope.core_models.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from routescope.core_models.importers import ImportError_, import_checkpoint, pgpt_rule, target_config

from tiny_models import TINY, tiny_model

ROOT = Path(__file__).resolve().parents[2]
PROMPT = "w1 w2 w3"


def word_tokenizer(n_tokens: int) -> Tokenizer:
    """A whitespace word-level tokenizer of exactly n_tokens tokens: [UNK], w0, w1, ..."""
    vocab = {"[UNK]": 0, **{f"w{i}": i + 1 for i in range(n_tokens - 1)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return tok


def good(tmp_path: Path, key: str = "llama", name: str = "ck", dtype=torch.float32, tokenizer: bool = True):
    """(model, directory) of a good tiny checkpoint with a tokenizer covering its vocabulary."""
    model = tiny_model(key)
    tok = word_tokenizer(model.vocab_size) if tokenizer else None
    return model, save_checkpoint(model, tmp_path / name, tokenizer=tok, dtype=dtype)


def snapshot(root: Path) -> dict[str, str]:
    """Every file under root with a digest of its bytes: 'nothing written' means this is unchanged."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def edit_config(ck: Path, **fields) -> None:
    cfg = json.loads((ck / "config.json").read_text())
    (ck / "config.json").write_text(json.dumps({**cfg, **fields}))


def edit_tensor(ck: Path, name: str, change) -> None:
    state = load_file(ck / "model.safetensors")
    state[name] = change(state[name])
    save_file(state, ck / "model.safetensors", metadata={"family": "edited"})


def refused(ck: Path, *needles: str) -> str:
    """load_checkpoint and `routescope generate` both refuse ck with one line holding every needle;
    nothing under ck's parent changes. Returns the message."""
    before = snapshot(ck.parent)
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(ck)
    msg = str(e.value)
    assert "\n" not in msg
    for needle in needles:
        assert needle in msg, f"{needle!r} not in {msg!r}"
    assert snapshot(ck.parent) == before
    return msg


def cli_refuses(capsys, argv: list[str], *needles: str) -> str:
    """The CLI in-process: exit code 2, nothing on stdout, one line on stderr holding every needle."""
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err.endswith("\n") and err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"routescope {argv[0]}: ")
    for needle in needles:
        assert needle in err, f"{needle!r} not in {err!r}"
    return err


# --- config.json ---------------------------------------------------------------------------------

BAD_CONFIGS = {  # config.json text -> what the message must name
    "null": ("null", "got null"),
    "list": ('[{"family": "llama"}]', "got a list"),
    "string": ('"llama"', "got a string"),
    "number": ("4096", "got a number"),
    "family list": (None, "family = ['llama']"),
    "family null": (None, "family = None"),
    "string for int": (None, "d_model = '32'"),
    "true for int": (None, "n_layers = True"),
    "float for int": (None, "n_heads = 1.5"),
    "NaN float": (None, "norm_eps = nan"),
    "Infinity float": (None, "rope_base = inf"),
    "null for int": (None, "vocab_size = None"),
    "not JSON": ('{"family": "llama",', "not valid JSON"),
}
FIELD_EDITS = {"family list": {"family": ["llama"]}, "family null": {"family": None},
               "string for int": {"d_model": "32"}, "true for int": {"n_layers": True},
               "float for int": {"n_heads": 1.5}, "NaN float": {"norm_eps": float("nan")},
               "Infinity float": {"rope_base": float("inf")}, "null for int": {"vocab_size": None}}


@pytest.mark.parametrize("case", sorted(BAD_CONFIGS))
def test_malformed_config_is_refused_naming_file_and_field(tmp_path, capsys, case):
    _, ck = good(tmp_path)
    text, needle = BAD_CONFIGS[case]
    if text is None:
        edit_config(ck, **FIELD_EDITS[case])  # json.dumps writes NaN/Infinity as Python's json reads them
    else:
        (ck / "config.json").write_text(text)
    refused(ck, str(ck / "config.json"), needle)
    cli_refuses(capsys, ["generate", ck, PROMPT], str(ck / "config.json"), needle)


def test_oversized_config_file_is_not_read(tmp_path):
    _, ck = good(tmp_path)
    cfg = json.loads((ck / "config.json").read_text())
    (ck / "config.json").write_text(json.dumps(cfg) + " " * 2**21)
    refused(ck, str(ck / "config.json"), "too large")


# --- configs that would allocate gigabytes ---------------------------------------------------------

HUGE = {"d_model": 65536, "context": 2**31, "vocab_size": 2**40, "n_layers": 10**6}


@pytest.mark.parametrize("field", sorted(HUGE))
def test_huge_config_is_refused_before_the_model_is_built(tmp_path, capsys, field):
    _, ck = good(tmp_path, tokenizer=False)  # with a tokenizer, vocab_size is refused by it (next test)
    edit_config(ck, **{field: HUGE[field]})
    msg = refused(ck, str(ck / "config.json"), f"{field} = {HUGE[field]}")
    cli_refuses(capsys, ["generate", ck, PROMPT], f"{field} = {HUGE[field]}")
    # the closed-form size check and the context bound run before any module exists
    assert "parameters but" in msg or "must be at most" in msg


def _peak_rss_mb(argv: list[str], tmp_path: Path, limit_bytes: int) -> tuple[int, str, float]:
    """Run argv with an address-space limit; return (exit code, stderr, the child's own peak RSS in MB)."""
    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))

    err_path = tmp_path / f"stderr-{len(list(tmp_path.glob('stderr-*')))}.txt"
    with open(err_path, "wb") as err:
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err, stdin=subprocess.DEVNULL,
                                preexec_fn=limit, cwd=ROOT, env=env)
        try:
            _, status, usage = os.wait4(proc.pid, 0)  # this child's own rusage
        finally:
            if proc.returncode is None and proc.poll() is None:
                proc.kill()
    return os.waitstatus_to_exitcode(status), err_path.read_text(), usage.ru_maxrss / 1024


@pytest.mark.slow
def test_huge_configs_never_allocate_under_a_2gb_address_space(tmp_path):
    """In a child limited to 2 GB of address space: a good checkpoint generates (the limit is not
    what refuses), each huge config gets the one-line message (before, torch failed to allocate 17 GB
    to 512 TB with a traceback), and its peak RSS is that of a run refused before any model code."""
    limit = 2 * 2**30
    cli = [sys.executable, "-m", "routescope.cli", "--threads", "1", "generate"]
    _, ck = good(tmp_path, name="good")
    code, err, good_rss = _peak_rss_mb(cli + [str(ck), PROMPT, "--max-new-tokens", "2"], tmp_path, limit)
    assert code == 0, err
    code, err, floor_rss = _peak_rss_mb(cli + [str(tmp_path / "absent"), PROMPT], tmp_path, limit)
    assert code == 2 and "not a checkpoint directory" in err
    for field, value in HUGE.items():
        _, ck = good(tmp_path, name=field, tokenizer=False)
        edit_config(ck, **{field: value})
        code, err, rss = _peak_rss_mb(cli + [str(ck), PROMPT], tmp_path, limit)
        assert code == 2 and err.count("\n") == 1 and f"{field} = {value}" in err, err
        # what loading the model code and reading the header costs, not a model: 64 MB of slack
        assert rss < floor_rss + 64, (field, rss, floor_rss, good_rss)


# --- model.safetensors ---------------------------------------------------------------------------

@pytest.mark.parametrize("bad", ["nan", "inf", "-inf"])
def test_non_finite_weight_is_refused_naming_the_tensor(tmp_path, capsys, bad):
    _, ck = good(tmp_path)
    name = "blocks.1.attn.qkv.weight"

    def poison(t):
        t = t.clone()
        t[3, 5] = float(bad)
        return t

    edit_tensor(ck, name, poison)
    msg = refused(ck, str(ck / "model.safetensors"), f"tensor {name}", "NaN/Inf", "[3, 5]")
    assert "holds 1 NaN/Inf" in msg
    cli_refuses(capsys, ["generate", ck, PROMPT], name, "NaN/Inf")


def test_finite_float32_weight_that_overflows_float16_is_refused_when_loaded_as_float16(tmp_path):
    _, ck = good(tmp_path)
    edit_tensor(ck, "norm.weight", lambda t: torch.full_like(t, 1e6))  # > float16's max 65504
    load_checkpoint(ck)  # float32: fine
    with pytest.raises(CheckpointError, match="tensor norm.weight overflows float16"):
        load_checkpoint(ck, dtype=torch.float16)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.float64, torch.uint8])
def test_non_float_or_unexpected_dtype_is_refused_not_cast(tmp_path, capsys, dtype):
    _, ck = good(tmp_path)
    name = "blocks.0.ffn.up.weight" if "blocks.0.ffn.up.weight" in load_file(ck / "model.safetensors") \
        else next(iter(load_file(ck / "model.safetensors")))
    edit_tensor(ck, name, lambda t: t.to(dtype))
    stored = {torch.int32: "I32", torch.int64: "I64", torch.float64: "F64", torch.uint8: "U8"}[dtype]
    refused(ck, str(ck / "model.safetensors"), f"tensor {name} is stored as {stored}", "F16 or BF16 or F32")
    cli_refuses(capsys, ["generate", ck, PROMPT], name, stored)


@pytest.mark.parametrize("storage", [torch.float16, torch.bfloat16, torch.float32])
def test_float_storage_dtypes_load_as_the_rounded_weights(tmp_path, storage):
    model, ck = good(tmp_path, dtype=storage)
    loaded, _ = load_checkpoint(ck)
    for k, v in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v.to(storage).float()), k


# --- tokenizer.json ------------------------------------------------------------------------------

@pytest.mark.parametrize("delta, why", [(-1, "would decode to nothing"), (+1, "past the embedding table")])
def test_tokenizer_must_cover_exactly_the_vocabulary(tmp_path, capsys, delta, why):
    """Fewer tokens: the model emits ids the tokenizer cannot decode; more: the tokenizer emits ids
    past the embedding. Both are refused naming tokenizer.json and vocab_size."""
    model, ck = good(tmp_path)
    word_tokenizer(model.vocab_size + delta).save(str(ck / "tokenizer.json"))
    refused(ck, str(ck / "tokenizer.json"), f"vocab_size = {model.vocab_size}", why)
    cli_refuses(capsys, ["generate", ck, PROMPT], "tokenizer.json", "vocab_size", why)


# --- good checkpoints ------------------------------------------------------------------------------

@pytest.mark.parametrize("key", sorted(TINY))
def test_good_checkpoint_loads_with_identical_logits_buffers_and_ties(tmp_path, key):
    """The load path builds with parameters on meta and skips init: the result must be the model
    saved, exactly: logits, every buffer computed at build time (RoPE/SRPE tables), tied weights."""
    model, ck = good(tmp_path, key)
    loaded, tok = load_checkpoint(ck)
    assert tok.get_vocab_size() == model.vocab_size and not loaded.training
    idx = torch.randint(0, model.vocab_size, (2, 11), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(loaded(idx).logits, model(idx).logits)
    want = dict(model.named_buffers())
    got = dict(loaded.named_buffers())
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    assert loaded.num_params() == model.num_params()  # parameters() counts a tied parameter once
    assert not any(p.is_meta for p in loaded.parameters())


def test_good_checkpoint_generates_on_the_cli(tmp_path, capsys):
    _, ck = good(tmp_path)
    assert main(["generate", str(ck), PROMPT, "--max-new-tokens", "3"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith(PROMPT) and err == ""


# --- --json never prints bare NaN/Infinity ---------------------------------------------------------

def _strict_json(text: str):
    def refuse(name):
        raise AssertionError(f"bare {name} in JSON output")
    return json.loads(text, parse_constant=refuse)


def test_generate_json_writes_null_for_non_finite_probabilities(tmp_path, capsys):
    """Finite weights can still overflow (3e38 norm gains): the softmax is NaN, written as null."""
    _, ck = good(tmp_path)
    edit_tensor(ck, "norm.weight", lambda t: torch.full_like(t, 3e38))
    assert main(["generate", str(ck), PROMPT, "--max-new-tokens", "2", "--json"]) == 0
    doc = _strict_json(capsys.readouterr().out)
    probs = [s["prob"] for s in doc["steps"]] + [c["prob"] for s in doc["steps"] for c in s["top"]]
    assert None in probs and all(p is None or math.isfinite(p) for p in probs)


def test_finite_json_replaces_every_non_finite_number():
    from routescope.cli.common import finite_json
    doc = {"a": float("nan"), "b": [1.5, float("inf"), {"c": -float("inf")}], "d": "NaN", "e": 2}
    assert finite_json(doc) == {"a": None, "b": [1.5, None, {"c": None}], "d": "NaN", "e": 2}
    json.dumps(finite_json(doc), allow_nan=False)


# --- routescope import -----------------------------------------------------------------------------

GPT = dict(block_size=48, vocab_size=97, n_layer=2, n_head=2, n_embd=32, bias=False)


def reference_files(tmp_path: Path, gpt: dict = GPT) -> tuple[Path, Path]:
    """(weights.safetensors, config.json) in the ParallelGPT reference's own names, made from a
    RouteScope model through the importer's tensor map (every pgpt rule is one tensor to one)."""
    config, _ = target_config("pgpt", {"gpt_config": gpt})
    torch.manual_seed(0)
    state = build_model(config).state_dict()
    ref = {pgpt_rule(k, tuple(v.shape), config).sources[0]: v.clone() for k, v in state.items()}
    (tmp_path / "ref").mkdir(exist_ok=True)
    save_file(ref, tmp_path / "ref" / "weights.safetensors")
    (tmp_path / "ref" / "config.json").write_text(json.dumps({"gpt_config": gpt}))
    return tmp_path / "ref" / "weights.safetensors", tmp_path / "ref" / "config.json"


def import_refused(tmp_path, capsys, weights, config, *needles, tokenizer=None) -> None:
    """import_checkpoint and `routescope import` refuse with one line holding every needle and write
    nothing (no output directory, no temporary sibling)."""
    before = snapshot(tmp_path)
    out = tmp_path / "imported"
    with pytest.raises(ImportError_) as e:
        import_checkpoint("pgpt", weights, config, out, tokenizer=tokenizer)
    assert "\n" not in str(e.value)
    for needle in needles:
        assert needle in str(e.value), f"{needle!r} not in {str(e.value)!r}"
    argv = ["import", "--from", "pgpt", "--weights", weights, "--config", config, "--out", out]
    cli_refuses(capsys, argv + (["--tokenizer", tokenizer] if tokenizer else []), *needles)
    assert snapshot(tmp_path) == before and not out.exists()


@pytest.mark.parametrize("text, needle", [("null", "got null"), ("[1, 2]", "got a list"), ('"pgpt"', "got a string"),
                                          ('{"gpt_config": null}', "gpt_config: expected a JSON object"),
                                          ('{"gpt_config": [1]}', "gpt_config: expected a JSON object")])
def test_import_config_that_is_not_an_object_is_refused(tmp_path, capsys, text, needle):
    weights, config = reference_files(tmp_path)
    config.write_text(text)
    import_refused(tmp_path, capsys, weights, config, str(config), needle)


@pytest.mark.parametrize("field, value", [("n_embd", "32"), ("n_layer", True), ("n_head", 1.5), ("vocab_size", None),
                                          ("bias", "false")])
def test_import_config_field_of_the_wrong_type_is_refused(tmp_path, capsys, field, value):
    weights, config = reference_files(tmp_path)
    config.write_text(json.dumps({"gpt_config": {**GPT, field: value}}))
    import_refused(tmp_path, capsys, weights, config, str(config), f"gpt_config.{field} = {value!r}")


@pytest.mark.parametrize("field, value, needle", [("n_embd", 65536, "d_model = 65536 (from gpt_config.n_embd)"),
                                                  ("vocab_size", 2**40, "vocab_size = 1099511627776"),
                                                  ("block_size", 2**31, "gpt_config.block_size")])
def test_import_of_huge_hyper_parameters_is_refused_before_building(tmp_path, capsys, field, value, needle):
    weights, config = reference_files(tmp_path)
    config.write_text(json.dumps({"gpt_config": {**GPT, field: value}}))
    import_refused(tmp_path, capsys, weights, config, str(config), needle)


def test_import_refuses_non_finite_and_integer_reference_tensors(tmp_path, capsys):
    weights, config = reference_files(tmp_path)
    state = load_file(weights)
    name = "transformer.ln_f.weight"
    state[name] = state[name].clone()
    state[name][0] = float("nan")
    save_file(state, weights)
    import_refused(tmp_path, capsys, weights, config, str(weights), name, "NaN/Inf")
    state[name] = torch.ones_like(state[name], dtype=torch.int32)
    save_file(state, weights)
    import_refused(tmp_path, capsys, weights, config, str(weights), f"{name} is stored as I32")


def test_import_refuses_a_tokenizer_that_does_not_cover_the_vocabulary(tmp_path, capsys):
    weights, config = reference_files(tmp_path)
    for n in (GPT["vocab_size"] - 1, GPT["vocab_size"] + 1):
        word_tokenizer(n).save(str(tmp_path / "tok.json"))
        import_refused(tmp_path, capsys, weights, config, str(tmp_path / "tok.json"), "vocab_size = 97",
                       tokenizer=tmp_path / "tok.json")


def test_good_import_loads_with_the_reference_weights(tmp_path):
    weights, config = reference_files(tmp_path)
    word_tokenizer(GPT["vocab_size"]).save(str(tmp_path / "tok.json"))
    out = import_checkpoint("pgpt", weights, config, tmp_path / "imported", tokenizer=tmp_path / "tok.json")
    model, tok = load_checkpoint(out)
    ref = load_file(weights)
    for k, v in model.state_dict().items():
        assert torch.equal(v, ref[pgpt_rule(k, tuple(v.shape), model.config).sources[0]]), k
    assert tok.get_vocab_size() == model.vocab_size


def test_loading_in_one_thread_leaves_model_building_in_another_untouched():
    """The load path's torch function modes (parameters on meta, init skipped) are thread-local: the
    app loads a checkpoint for one session while another builds or runs models."""
    import threading

    from routescope.core_models.checkpoint import _ParametersOnMeta
    from routescope.core_models.registry import _SkipParameterInit

    config = tiny_model("llama").config
    entered, release = threading.Event(), threading.Event()

    def loading():
        with _SkipParameterInit(), _ParametersOnMeta():
            entered.set()
            release.wait(60)

    t = threading.Thread(target=loading)
    t.start()
    try:
        entered.wait(60)
        torch.manual_seed(0)
        during = build_model(config)
    finally:
        release.set()
        t.join()
    torch.manual_seed(0)
    after = build_model(config)
    assert not any(p.is_meta for p in during.parameters())
    for (k, a), b in zip(during.state_dict().items(), after.state_dict().values()):
        assert torch.equal(a, b), k
