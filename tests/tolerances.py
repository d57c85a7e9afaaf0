"""Float comparisons that hold on any x86 CPU.

Two float32 evaluations of the same maths (another SIMD width or oneDNN blocking, a batch instead of
one row, a KV-cache step instead of the whole sequence) differ by rounding inside sums whose terms
are about as large as the largest value involved. So an element's difference is a few float32 eps
*of that scale*, not of the element (a logit near 0 comes out of cancelling terms), and an absolute
number measured on one CPU says nothing about another. Every bound here is a count of eps times a
scale of the values involved; callers say in a comment why their count is what it is.
"""
from __future__ import annotations

import torch

EPS32 = torch.finfo(torch.float32).eps  # 2**-23 = 1.19e-7: one unit in the last place of 1.0

# Two float32 evaluations of (part of) a tiny model's forward in another order (a KV-cache step,
# another batch split, another CPU's kernels), in eps of the largest value compared (logits, hidden
# states, probabilities). Measured on the tiny test models: at most 14 eps (moep-swiglu, cached
# decoding; 3.5 for causality). A real defect moves values by a sizeable part of their scale (1% is
# ~84,000 eps), so 128 keeps a 9x margin without hiding anything.
FORWARD_EPS = 128


def assert_close_to_scale(got, want, eps_units: float, scale=None, msg: str = "") -> None:
    """Assert |got - want| <= eps_units * EPS32 * scale element by element.

    scale defaults to max|want|; a tensor of per-element magnitudes broadcasts. Compared in float64,
    so the check itself adds no rounding."""
    got, want = torch.as_tensor(got).double(), torch.as_tensor(want).double()
    assert got.shape == want.shape, f"{msg}: shapes {tuple(got.shape)} != {tuple(want.shape)}"
    scale = want.abs().max() if scale is None else torch.as_tensor(scale, dtype=torch.float64)
    err = (got - want).abs()
    ok = err <= eps_units * EPS32 * scale
    if not bool(ok.all()):
        worst = float((err / (EPS32 * scale)).max())
        raise AssertionError(f"{msg}: {int((~ok).sum())} of {ok.numel()} elements differ by more than "
                             f"{eps_units} float32 eps of the scale (worst {worst:.1f} eps, "
                             f"max |difference| {float(err.max()):.3g})")
