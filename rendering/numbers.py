"""How the attribution views write their numbers (no Streamlit here): effects in a unit that fits
their size, the same on a chart and in its table, and integrated gradients' convergence with a
verdict. A probability: `style.format_prob`."""
from __future__ import annotations

import math
from collections.abc import Iterable

from routescope.analysis.runs.attribution import DELTA_SHARE, delta_share

# (factor, unit) from the largest down: an exact ablation of one of 3,072 experts moves log p by
# micro-nats, which a table rounding to 4 decimals shows as ±0.0001 on every row
EFFECT_UNITS = ((1.0, "nats"), (1e3, "millinats"), (1e6, "µnats"), (1e9, "nanonats"))


def effect_unit(values: Iterable[float]) -> tuple[float, str]:
    """(factor, unit) for log-prob effects: the largest unit in which the largest finite |value| is
    at least 1 (nats when none is: all zero, or 1 nat and more; nanonats below a micro-nat)."""
    top = max((abs(v) for v in values if math.isfinite(v)), default=0.0)
    if top == 0 or top >= 1:
        return EFFECT_UNITS[0]
    return next(((f, u) for f, u in EFFECT_UNITS if top * f >= 1), EFFECT_UNITS[-1])


def significant(x: float, digits: int = 2) -> str:
    """x with `digits` significant digits, in scientific notation below 1e-3 (3.1e-06), never "0.0"."""
    if not math.isfinite(x):
        return "∞" if x > 0 else "-∞" if x < 0 else "n/a"
    if x == 0 or 1e-3 <= abs(x) < 1e4:
        return f"{x:.{digits}g}"
    return f"{x:.{digits - 1}e}"


def convergence_verdict(delta: float, total: float) -> str:
    """Integrated gradients' verdict on its convergence delta (sum of the attributions minus the total
    f(input) - f(baseline) they should add up to): converged where |delta| is at most DELTA_SHARE of
    |total|, with the share in significant digits ("converged: |delta| = 3.1e-06 of the attribution
    total"), "not converged" otherwise."""
    share = delta_share(delta, total)
    if total == 0 and delta != 0:
        return f"not converged: the attribution total is 0 and |delta| = {significant(abs(delta))} nats"
    word = "converged" if share <= DELTA_SHARE else "not converged"
    return f"{word}: |delta| = {significant(share)} of the attribution total ({'≤' if word == 'converged' else '>'} " \
           f"{DELTA_SHARE:g})"
