"""Every causal-LM mixture-of-experts type the installed transformers ships (enumerated by `hf_zoo`
from transformers itself) either opens with one routing layer per MoE layer and routes exactly as
transformers does, or is refused in one line that says why.

For an opened type, against the plain transformers model (no RouteScope hook on it):
- the routing layers are as many as the MoE blocks transformers runs (its `router_logits` outputs);
- the recorded indices and weights equal what the block passes its experts, the logits what
  transformers returns for `output_router_logits`;
- dropping and forcing equal an independent recomputation: the plain model with `F.linear` patched
  (by this test) to mask the dropped experts' logits inside the router, and its selection-bias
  buffers set to -1e9 for them;
- greedy generation equals transformers' `generate`.
"""
from __future__ import annotations

import copy
import inspect
from contextlib import contextmanager
from unittest import mock

import pytest
import torch
import torch.nn.functional as F

from hf_zoo import N_LAYERS, REPRESENTATIVE, causal_lm, moe_types, tiny_moe
from routescope.core_models.ablation import Ablation
from routescope.core_models.checkpoint import CheckpointError, load_checkpoint
from routescope.core_models.generate import generate
from routescope.core_models.hf import LOGIT_MASK
from routescope.core_models.specs import AblationError
from routescope.core_models.trace import tracing
from tolerances import FORWARD_EPS, assert_close_to_scale

VOCAB = 256
IDS = [[11, 57, 3, 99, 140, 7, 250, 31, 64, 8, 200, 12]]
TYPES = moe_types()
# Opened and verified on transformers 5.23.0 when this was written: 63 of the 64 types enumerated, every
# MoE type it ships (issue 42; mistral4 found by its architectures; gemma4_assistant, enumerated only
# because its default config cannot be made, is a dense assistant (its config requires enable_moe_block
# false) and is not built by this zoo). A floor, so a regression fails.
GOAL = 63


def product_key_routes(block, logits: torch.Tensor, dropped=()) -> tuple[torch.Tensor, torch.Tensor]:
    """Doge's routes by hand, from its product-key logits [2, tokens, num_keys]: the top num_keys of
    each half, their sums over every pair (expert id x * num_keys + y), the dropped experts' sums
    -inf, the top-k of those, a softmax over the chosen (renormalised where norm_topk_prob)."""
    k = block.num_keys
    (sx, sy), (ix, iy) = logits.topk(k, dim=-1)
    scores = (sx.unsqueeze(-1) + sy.unsqueeze(-2)).flatten(-2)
    ids = (ix.unsqueeze(-1) * k + iy.unsqueeze(-2)).flatten(-2)
    scores = scores.masked_fill(torch.isin(ids, torch.tensor(list(dropped), dtype=ids.dtype)), float("-inf"))
    top, pos = scores.topk(block.top_k, dim=-1)
    w = top.softmax(-1)
    return ids.gather(-1, pos), w / w.sum(-1, keepdim=True) if block.norm_topk_prob else w


def product_key_block(block, x: torch.Tensor, dropped) -> tuple[torch.Tensor, torch.Tensor]:
    """Doge's MoE block by hand without the `dropped` experts: its routed experts (rows of down_embed
    and up_embed) on the routes above, plus its shared MLP; and its product-key logits."""
    b, t, _ = x.shape
    logits = block.router_gate(x).view(2, b * t, -1)
    idx, w = product_key_routes(block, logits, dropped)
    h = block.act_fn(torch.matmul(block.down_embed(idx), x.view(b * t, -1, 1)).view(b * t, -1)) * w
    routed = torch.matmul(h.view(b * t, 1, -1), block.up_embed(idx)).view(b, t, -1)
    return block.down_proj(block.act_fn(block.gate_proj(x)) * block.up_proj(x)) + routed, logits


def experts_inputs(model, ids, dropped: dict | None = None) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(top_k_index, top_k_weights) each MoE block passes its experts, in call order, on a plain forward.
    A block whose experts do not take them routes as its `router` says: Llama-4's returns (scores,
    logits), scores 0 off the top-k (its experts take tokens pre-scaled by them); JetMoE's gatings (its
    MLP and its attention experts) return (slots sorted by expert, token of each slot, their gates,
    tokens per expert, logits), gates a softmax over the top-k logits. Either routes to the top-k of
    the router's logits, weighted by the scores there or by the gates put back in token order. Doge's
    block (its own router, experts used inline) routes as `product_key_routes` says, without the experts
    `dropped` names (routing layer -> experts; what `masked` drops)."""
    got, hs = [], []

    def product_keys(name):
        def hook(block, args, out):
            got.append(product_key_routes(block, out[1], (dropped or {}).get(name, ())))
        return hook

    def takes(m) -> int:
        return len(inspect.signature(type(m).forward).parameters) - 1

    def from_router(router, args, out):
        idx = out[-1].topk(router.top_k, dim=-1).indices
        if len(out) == 2:  # Llama-4: (scores, logits)
            w = out[0].gather(-1, idx)
        else:  # JetMoE: gates sorted by expert, at their slots
            w = torch.empty_like(out[2])
            w[out[0]] = out[2]
        got.append((idx, w.reshape(idx.shape)))

    recorded = []  # the classes transformers records for output_router_logits
    for m in model.modules():
        rec = (getattr(type(m), "_can_record_outputs", None) or {}).get("router_logits")
        recorded += [getattr(r, "target_class", r) for r in (rec if isinstance(rec, (list, tuple)) else [rec] if rec
                                                               else [])]
    recorded = tuple(c for c in recorded if isinstance(c, type))
    for name, mod in model.named_modules():
        router, experts = getattr(mod, "router", None), getattr(mod, "experts", None)
        if isinstance(getattr(mod, "down_embed", None), torch.nn.Embedding):  # Doge's product-key block
            hs.append(mod.register_forward_hook(product_keys(name)))
        elif isinstance(router, torch.nn.Module) and not (isinstance(experts, torch.nn.Module) and takes(experts) >= 3):
            hs.append(router.register_forward_hook(from_router))
        elif name.rsplit(".", 1)[-1] == "experts" and takes(mod) >= 3 and any(
                isinstance(c, recorded) for c in model.get_submodule(name.rsplit(".", 1)[0]).children()):
            # (an experts module beside no recorded router is picked by a fixed table: DeepSeek-V4's hash layers)
            hs.append(mod.register_forward_pre_hook(lambda m, a: got.append((a[1], a[2])) if len(a) >= 3 else None))
    try:
        with torch.no_grad():
            out = model(torch.tensor(ids))
    finally:
        for h in hs:
            h.remove()
    return got, out.logits.float()


@contextmanager
def masked(model, dropped: dict[str, list[int]], n_experts: dict[str, int], value: float):
    """The plain model with the dropped experts' logits -inf as the first linear inside each router
    that gives one per expert returns them (ZAYA's MLP router: its last; a router with one weight
    matrix: its linear; F.linear patched for the duration) and their selection-bias buffers at -1e9 (the router's, and
    its block's own `e_score_correction_bias` / `expert_bias`)."""
    inside: dict[str, bool] = {}
    real = F.linear
    current: list[str] = []

    def linear(x, w, b=None):
        out = real(x, w, b)
        if current and inside.get(current[-1]) and (out.shape[-1] == n_experts[current[-1]] or current[-1] in single):
            inside[current[-1]] = False
            out = out.index_fill(-1, torch.tensor(dropped[current[-1]]), value)
        return out
    def enter(name):
        def hook(module, args):
            current.append(name)
            inside[name] = True
        return hook

    def leave(module, args, output):
        current.pop()

    hs = []
    # routers with one weight matrix: its linear gives the logits, whatever its width (Inkling's also
    # covers its shared experts)
    single = {name for name in dropped if sum(p.dim() == 2 for p in model.get_submodule(name).parameters()) == 1}
    for name in dropped:
        r = model.get_submodule(name)
        hs += [r.register_forward_pre_hook(enter(name)), r.register_forward_hook(leave)]
        if isinstance(getattr(r, "down_embed", None), torch.nn.Embedding):  # Doge: its block, by hand
            hs.append(r.register_forward_hook(lambda m, a, o, d=dropped[name]: product_key_block(m, a[0], d)))
        # a selection bias: one entry per expert, the router's own or one its block passes it (HY-V3,
        # MiniMax-M2, AFMoE, LFM2-MoE keep theirs on the block, beside the router)
        parent = model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else model
        own = [b for n, b in [*parent.named_buffers(recurse=False), *parent.named_parameters(recurse=False)]
               if n in ("e_score_correction_bias", "expert_bias")]
        for bname, buf in [*r.named_buffers(), *r.named_parameters(), *(("bias", b) for b in own)]:
            if bname.endswith(("bias", "biases")) and buf.shape[-1] == n_experts[name]:  # ZAYA: balancing_biases
                with torch.no_grad():
                    buf[..., dropped[name]] = -1e9
    try:
        with mock.patch("torch.nn.functional.linear", linear):
            yield model
    finally:
        for h in hs:
            h.remove()


def coverage(model_type: str, tmp: str) -> dict:
    """What happened to `model_type`: status opened / refused / not built, with the reason or the counts."""
    from pathlib import Path

    try:
        m = tiny_moe(model_type, TYPES[model_type], VOCAB)
    except Exception as e:  # the test's shrinker could not make this type: reported, never counted as opened
        return {"status": "not built", "why": f"{type(e).__name__}: {str(e).splitlines()[0][:100]}"}
    path = Path(tmp) / model_type
    m.save_pretrained(path)
    m = causal_lm(model_type).from_pretrained(path).eval()  # the plain reference: what transformers opens
    try:
        model, _ = load_checkpoint(path)
    except CheckpointError as e:
        return {"status": "refused", "why": str(e), "plain": m}
    return {"status": "opened", "model": model, "plain": m}


class Zoo:
    """What each type's checks found. A type is built, checked (verified, then its prefix reuse) and
    dropped once per run, when a test first asks for it: its models live only while its own checks
    run (held all at once, the 63 types' models took 9.3 GB). The module's `zoo` fixture holds one."""
    CAUGHT = (Exception, pytest.skip.Exception, pytest.fail.Exception)  # a failed check or a skip; never ^C

    def __init__(self, root: str):
        self.root, self.found = root, {}

    def _outcome(self, check, *args) -> tuple[bool, object]:
        try:
            return True, check(*args)
        except self.CAUGHT as e:
            return False, e

    def check(self, model_type: str) -> dict:
        """status, why; verified and (opened types) resumed as (ok, result or exception); routing
        layers and MoE blocks run where verified."""
        if model_type not in self.found:
            row = coverage(model_type, self.root)
            found = {"status": row["status"], "why": row.get("why"),
                     "verified": self._outcome(verified, model_type, row)}
            if found["verified"] == (True, "opened"):
                found["layers"] = len(row["model"].routing_layers())
                found["blocks"] = len(experts_inputs(row["plain"], IDS)[0])
            if row["status"] == "opened":
                found["resumed"] = self._outcome(resumed, model_type, row["model"])
                found["recombined"] = self._outcome(recombined, model_type, row["model"])
            self.found[model_type] = found  # the models go with `row`
        return self.found[model_type]

    def verified(self, model_type: str) -> str:
        """`verified`'s status for the type, or its exception raised again."""
        ok, got = self.check(model_type)["verified"]
        if not ok:
            raise got
        return got


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    return Zoo(str(tmp_path_factory.mktemp("zoo")))


@pytest.mark.parametrize("model_type", [t if t in REPRESENTATIVE else pytest.param(t, marks=pytest.mark.slow)
                                        for t in sorted(TYPES)])
def test_every_moe_type_routes_as_transformers_does_or_is_refused_saying_why(model_type, zoo):
    zoo.verified(model_type)


def verified(model_type: str, row: dict) -> str:
    """Run every check on `model_type` (`row`: its coverage); its status ("opened", "refused"; skip if
    not built). Zoo.check runs it once a run."""
    if row["status"] == "not built":
        pytest.skip(f"the test could not build a tiny {model_type}: {row['why']}")
    if row["status"] == "refused":
        why = row["why"]
        assert "\n" not in why and model_type in why and ("cannot follow" in why or "refused" in why), why
        return "refused"
    model, plain = row["model"], row["plain"]
    want, ref_logits = experts_inputs(plain, IDS)
    layers = list(model.routing_layers())
    assert len(layers) == len(want) > 0  # one routing layer per MoE block that ran: no MoE opened as dense
    with torch.no_grad():
        try:
            # distinct tensors: JetMoE records each attention's router logits twice (the attention's output
            # and its experts' gating's)
            n_ref = len({t.data_ptr() for t in plain(torch.tensor(IDS), output_router_logits=True).router_logits})
        except (TypeError, AttributeError):
            n_ref = None
        except RuntimeError as e:  # Doge with no square expert count: transformers' own aux loss sums
            if "must match the size" not in str(e):  # num_experts rows against num_keys^2 routes
                raise
            n_ref = None
    if n_ref is not None:
        assert n_ref == len(layers)
    with torch.no_grad(), tracing() as tr:
        out = model(torch.tensor(IDS))
    assert torch.equal(out.logits, ref_logits)
    for layer, (idx, w) in zip(layers, want):
        assert torch.equal(tr[model.routing_modules[layer].roles["indices"]].reshape(idx.shape), idx)
        assert torch.equal(tr[model.routing_modules[layer].roles["weights"]].reshape(w.shape), w)
        if "logits" not in model.routing_modules[layer].unavailable:  # Doge: product-key logits, its record says
            assert tr[model.routing_modules[layer].roles["logits"]].shape[-1] == model.routing_modules[layer].n_experts

    # drop each end layer's most used expert; force the second most used at the first layer
    first, last = layers[0], layers[-1]
    n_first = model.routing_modules[first].n_experts

    def used(i):  # experts of routing layer i, most picked first
        n = model.routing_modules[layers[i]].n_experts
        return torch.bincount(want[i][0].flatten(), minlength=n).argsort(descending=True)
    drops = {first: [int(used(0)[0])], last: [int(used(-1)[0])]} if first != last else {first: [int(used(0)[0])]}
    for ab, dropped in (
        (Ablation.parse(drop=[f"{layer}:{e[0]}" for layer, e in drops.items()]), drops),
        (Ablation.parse(force=[f"{first}:{int(used(0)[1])}"]),
         {first: [j for j in range(n_first) if j != int(used(0)[1])]}),
    ):
        if model_type in LOGIT_MASK and n_first - len(dropped[first]) < model.routing_modules[first].top_k:
            with pytest.raises(AblationError, match="keep at least"):  # a finite mask cannot force below top-k
                model(torch.tensor(IDS), ablation=ab)
            continue
        with torch.no_grad(), tracing() as tr:
            got = model(torch.tensor(IDS), ablation=ab)
        ref = copy.deepcopy(plain)
        value = LOGIT_MASK.get(model_type, float("-inf"))  # a type whose router cannot take -inf names its value
        with masked(ref, dropped, {l: model.routing_modules[l].n_experts for l in dropped}, value):
            ref_in, ref_out = experts_inputs(ref, IDS, dropped)
        assert_close_to_scale(got.logits, ref_out, FORWARD_EPS)  # same ops, same order: equal up to rounding
        for layer, (idx, _w) in zip(layers, ref_in):
            rec = tr[model.routing_modules[layer].roles["indices"]].reshape(idx.shape)
            assert torch.equal(rec, idx), layer
            if layer in dropped:  # a dropped expert never carries weight
                w = tr[model.routing_modules[layer].roles["weights"]].reshape(idx.shape).float()
                assert not ((w != 0) & torch.isin(rec, torch.tensor(dropped[layer]))).any()

    gen = generate(model, IDS[0], max_new_tokens=8)
    with torch.no_grad():
        ref = plain.generate(torch.tensor(IDS), max_new_tokens=8, do_sample=False)[0].tolist()
    assert gen.ids[:len(ref)] == ref
    return "opened"


@pytest.mark.slow  # every type of the zoo
def test_at_least_the_goal_opens_and_routes_correctly(zoo):
    status = {}
    for t in sorted(TYPES):
        try:
            status[t] = zoo.verified(t)
        except BaseException as e:  # a failed check (reported by its own test above) or a skip: not counted
            status[t] = f"{type(e).__name__}"
    opened = [t for t, s in status.items() if s == "opened"]
    assert len(opened) >= GOAL, (len(opened), {t: s for t, s in status.items() if s != "opened"})


def test_doge_with_no_square_expert_count_routes_as_transformers_does(tmp_path, monkeypatch):
    """Doge's product keys (num_keys = floor(sqrt(num_experts)) a half) reach num_keys^2 experts: with
    num_experts = 10 that is 9, and the 10th row is never routed to. Its layer offers the 9 and every
    check above holds (it failed at the first forward, looking for a top-k over 10)."""
    import hf_zoo

    if "doge" not in TYPES:
        pytest.skip("this transformers has no doge")
    monkeypatch.setitem(hf_zoo.OVERRIDES, "doge", {"is_moe": True, "num_experts": 10})
    row = coverage("doge", str(tmp_path))
    assert verified("doge", row) == "opened"
    assert {m.n_experts for m in row["model"].routing_modules.values()} == {9}


def test_a_dense_config_with_an_expert_field_opens_as_dense(tmp_path):
    """Doge's default (is_moe false) carries num_experts but builds no MoE: it opens, without routing layers."""
    import transformers

    from hf_zoo import shrink

    if "doge" not in TYPES:
        pytest.skip("this transformers has no doge")
    d = shrink(transformers.DogeConfig().to_dict(), VOCAB)
    d["is_moe"] = False
    m = transformers.AutoModelForCausalLM.from_config(transformers.DogeConfig(**d))
    m.save_pretrained(tmp_path)
    model, _ = load_checkpoint(tmp_path)
    assert model.routing_layers() == {} and d.get("num_experts")


# --- the README's support table: rendered from these results, never typed ---------------------------

BEGIN, END = "<!-- hf-support:begin -->", "<!-- hf-support:end -->"


def support_table(zoo: Zoo | str) -> str:
    """model_type | result | routing layers / MoE blocks, or the reason: what this module verified (in
    `zoo`, or in a new Zoo in the directory `zoo` names: scripts/hf_support_table.py)."""
    zoo = zoo if isinstance(zoo, Zoo) else Zoo(zoo)
    lines = [BEGIN, "| model_type | result | routing layers vs MoE blocks run, or why not |", "|---|---|---|"]
    for t in sorted(TYPES):
        try:
            status = zoo.verified(t)
        except pytest.skip.Exception as e:
            lines.append(f"| `{t}` | not built by the test zoo | {str(e.msg).split(': ', 1)[-1][:90]} |")
            continue
        except Exception:
            lines.append(f"| `{t}` | opens, a check fails | see tests/analysis/test_hf_coverage.py |")
            continue
        row = zoo.check(t)
        if status == "opened":
            n, blocks = row["layers"], row["blocks"]
            lines.append(f"| `{t}` | opens, routes as transformers | {n} routing layers = {blocks} MoE blocks run "
                         f"(of {N_LAYERS} layers) |")
        else:
            lines.append(f"| `{t}` | refused | {row['why'].split(': ', 1)[-1].replace('|', '/')} |")
    return "\n".join(lines + [END])


@pytest.mark.slow  # every type of the zoo
def test_the_readme_support_table_is_what_this_module_verified(zoo):
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "docs" / "huggingface.md").read_text()  # the README links to it
    assert BEGIN in readme and END in readme, "README has no support table (python scripts/hf_support_table.py)"
    got = readme[readme.index(BEGIN):readme.index(END) + len(END)]
    assert got == support_table(zoo), "README's support table is stale: run python scripts/hf_support_table.py"


@pytest.mark.slow  # every type of the zoo
def test_a_forward_restarted_at_each_routing_layer_equals_the_whole_ablated_forward(zoo):
    """Prefix reuse on every opened type that can restart (`HFModel.capture` / `resume`, as the
    importance sweep uses it): where the sweep's self-check passes (`restart_reproduces`), expert 0
    dropped at each routing layer, restarted there, equals the whole forward under that ablation;
    where the layer's attention ran before its experts its captured output is reused (most types).
    A type whose check fails (beam: soft-capped logits; hy_v4: decoder layers that hand on several
    residual streams) is measured by the naive loop."""
    restarted, reused, naive = [], [], []
    for t in sorted(TYPES):
        ok, got = zoo.check(t).get("resumed", (True, None))
        if not ok:
            raise got
        if got == "naive":
            naive.append(t)
        elif got is not None:
            restarted.append(t)
            if got == "reused":
                reused.append(t)
    assert len(restarted) >= GOAL // 2 and len(reused) >= len(restarted) // 2, (restarted, reused, naive)
    assert {"beam", "hy_v4"} & set(TYPES) <= set(naive), naive


@pytest.mark.slow  # every type of the zoo
def test_the_ablated_layer_answered_from_captured_expert_outputs_equals_the_whole_forward(zoo):
    """The sweep's `reuse` on every opened type (`recombined`): where its check accepts a type, each
    recombined layer equals the whole ablated forward; most types that restart recombine."""
    got: dict[str, list] = {"recombined": [], "refused": [], None: []}
    for t in sorted(TYPES):
        ok, r = zoo.check(t).get("recombined", (True, None))
        if not ok:
            raise r
        got[r].append(t)
    restarted = [t for t in TYPES if zoo.check(t).get("resumed", (True, None))[1] in ("restarted", "reused")]
    assert len(got["recombined"]) >= len(restarted) * 3 // 4, got
    print(f"recombined {len(got['recombined'])} of {len(restarted)} restarted types; refused by the check: "
          f"{got['refused']}; none: {got[None]}")


def resumed(model_type: str, model) -> str | None:
    """The prefix-reuse check of the test above on one opened type: None where the model cannot
    restart, "naive" where the sweep's self-check fails, else "restarted" or "reused" (its attention
    output captured and reused); an AssertionError where a restarted forward differs."""
    from routescope.analysis.reports.importance import restart_reproduces

    x = torch.tensor(IDS * 2)
    if not model.can_resume:
        return None
    if not restart_reproduces(model, x):
        return "naive"
    with torch.inference_mode():
        prefix = model.capture(x)
        for layer in model.routing_layers():
            ab = Ablation(drop=((layer, 0),))
            try:
                want = model(x, ablation=ab).logits
            except AblationError:  # too few experts left for its top-k: nothing to compare
                continue
            got = model.resume(prefix, layer, [ab] * len(x))
            assert_close_to_scale(got, want, FORWARD_EPS, msg=f"{model_type} {layer}")
    return "reused" if prefix.attention else "restarted"


def recombined(model_type: str, model) -> str | None:
    """A restarted forward whose ablated layer's experts call is answered from the captured experts
    outputs (`resume(..., expert_outputs=...)`, as the sweep's `reuse` runs it), against the whole
    forward under that ablation: "recombined" where every layer that `can_recombine` agrees, "refused"
    where the sweep's own check (`reuse_reproduces`) refuses the model; None where it cannot restart
    or no layer can recombine. An AssertionError where a layer differs and the check accepted it."""
    from routescope.analysis.reports.importance import restart_reproduces, reuse_reproduces

    x = torch.tensor(IDS * 2)
    if not model.can_resume or not restart_reproduces(model, x):
        return None
    if not reuse_reproduces(model, x):
        return "refused" if any(model.can_recombine(l) for l in model.routing_layers()) else None
    with torch.inference_mode():
        prefix = model.capture(x)
        for layer in model.routing_layers():
            ab = Ablation(drop=((layer, 1),))  # the check dropped expert 0
            if not model.can_recombine(layer):
                continue
            try:
                want = model(x, ablation=ab).logits
            except AblationError:
                continue
            got = model.resume(prefix, layer, [ab] * len(x), expert_outputs=model.expert_outputs(prefix, layer))
            assert_close_to_scale(got, want, FORWARD_EPS, msg=f"{model_type} {layer} recombined")
    return "recombined"
