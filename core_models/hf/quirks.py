"""What differs, model type by model type, from the generic way RouteScope reads transformers' MoE blocks."""
from __future__ import annotations

# Model types transformers ships whose routing RouteScope cannot follow yet, each with the reason
# (plain data: the refusal names it). Every other type is opened by `moe_layout` or refused by it.
REFUSED: dict[str, str] = {
    "zaya": "its router is an MLP whose last layer gives the logits (RouteScope masks a dropped expert at the "
            "router's first linear); not supported yet",
}
# The value a dropped expert's logit takes, where -inf does not serve (plain data, one row a type).
LOGIT_MASK: dict[str, float] = {
    "phimoe": -1e9,  # its sparsemixer subtracts logits from their maximum: -inf - -inf would be NaN
}
