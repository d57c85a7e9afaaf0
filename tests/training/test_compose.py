"""Composition keeps each pre-trained path's function."""
import pytest
import torch

from routescope.core_models import Ablation, build_model, from_name, tracing
from routescope.core_models.training.compose import compose

from tolerances import FORWARD_EPS, assert_close_to_scale


def _path(seed):
    torch.manual_seed(seed)
    return build_model(from_name("path", vocab_size=97, d_model=16, n_layers=3, n_heads=2, n_kv_heads=2,
                                 ffn_hidden=64, context=32)).eval()


@pytest.mark.parametrize("combiner", ["share_linear", "gumbel_v1", "gumbel_v2"])
def test_composed_model_with_other_path_dropped_reproduces_each_path(combiner):
    paths = [_path(1), _path(2)]
    idx = torch.randint(0, 97, (2, 10))
    for j, path in enumerate(paths):
        model = compose(paths, combiner, n_large_pre=0, shrink_from=j)
        other = 1 - j
        ab = Ablation(drop=(("*", other),), force=((("*", j),) if combiner != "share_linear" else ()))
        with tracing() as tr, torch.no_grad():
            model(idx, ablation=ab)
            h = path.embed(idx)  # the path model's own hidden states, block by block
            for i, block in enumerate(path.blocks):
                h = block(h)
                assert_close_to_scale(tr[f"parallel.{i}.paths.{j}.out"], h, FORWARD_EPS, msg=f"block {i}")


def test_composition_concatenates_embeddings_and_checks_paths():
    paths = [_path(1), _path(2)]
    model = compose(paths, "gumbel_v2")
    assert torch.equal(model.embed.weight, torch.cat([p.embed.weight for p in paths], 1))
    assert model.head.weight is model.embed.weight
    assert model.config.n_parallel_layers == 3 and model.config.d_model == 32
    torch.manual_seed(0)
    wide = build_model(from_name("path", vocab_size=97, d_model=32, n_layers=3, n_heads=2, n_kv_heads=2,
                                 ffn_hidden=128, context=32))
    with pytest.raises(ValueError, match="d_model"):
        compose([paths[0], wide], "share_linear")


def test_share_linear_composition_grows_to_the_concatenation_of_the_paths():
    """The paper's grow connection: the last Share maps k*d' -> d; composed, it starts as the
    identity, so the full-width stream gets [path 0 | path 1] (aligned with the embeddings)."""
    paths = [_path(1), _path(2)]
    model = compose(paths, "share_linear", n_large_pre=0)
    c, last = model.config, model.parallel[-1]
    assert c.fused_grow and c.n_parallel_layers == 3 and last.grow is None
    assert tuple(last.combine.weight.shape) == (c.d_model, c.n_paths * c.d_par) == (32, 32)
    idx = torch.randint(0, 97, (2, 10))
    with tracing() as tr, torch.no_grad():
        model(idx)
        model(idx, ablation=Ablation(drop=(("parallel.2", 1),)))
    out, outs = tr.steps("parallel.2.out"), [tr.steps(f"parallel.2.paths.{j}.out") for j in range(2)]
    # exact: an identity matmul multiplies by 1.0 and adds 0.0
    assert torch.equal(out[0], torch.cat([outs[0][0], outs[1][0]], -1))
    assert torch.equal(out[1][..., :16], outs[0][1]) and torch.equal(out[1][..., 16:], torch.zeros(2, 10, 16))
