"""One request of a routing trace, as every reader yields it (`trace.read_trace`)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class TraceRow:
    """A request's token ids and the experts the engine routed them to.

    row: the request id as the trace names it (echoed in every output).
    token_ids: [T] int64, the tokens the engine ran through the model, in order (prompt, then
        output); for formats whose routing covers fewer tokens than prompt + output by construction
        (vLLM, SGLang: the last sampled token is never run) the reader drops those, so a sound trace
        has T' == T - start.
    experts: [T', L, k] int64 expert ids as the engine returned them, position-major: experts[i] is
        the routing of token_ids[start + i]. T' may differ from T - start (a broken trace):
        `checks.check_row` reports it.
    layer_names: the routing layers' names when the trace names them (a plain table with names),
        else None: the L axis is the routing layers in depth order.
    start: the first position the routing covers (SGLang's `routed_experts_start_len`; 0 for every
        other format): positions before it are context only, run but not compared.
    """
    row: str
    token_ids: np.ndarray
    experts: np.ndarray
    layer_names: tuple[str, ...] | None = None
    start: int = 0
