"""What every family's model shares: the per-call entry point, site naming, cache set-up and
parameter counts. Families implement `_forward(idx) -> logits`; where they route, their routing
modules subclass `sites.RoutingLayer` and `routing_layers()` finds them; family-specific per-call
options are declared by `run_options()` and checked on every call."""
from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch
from torch import nn

from .ablation import NO_ABLATION, Ablation
from .config import BaseConfig
from .layers import Attention
from .run_state import ROUTING_MODES, KVCache, RunState, running
from .sites import RoleLayer, RoutingLayer, Site, name_sites
from .sites import role_layers as find_role_layers
from .sites import routing_layers as find_routing_layers


class InputError(ValueError):
    """The token ids given to a model cannot be run (empty, out of vocabulary, too long)."""


@dataclass(frozen=True)
class RunOption:
    """A family's per-call option (`model(idx, name=value)`), declared once by the family's model:
    forward checks it, the app offers it as a control, the CLI as `--option name=value` and
    `rs.run(options={name: value})`. `kind`: bool, float (in [low, high]) or object (passed as given:
    a tensor). `whole_sequence`: it changes earlier positions, so it cannot run with generation's KV
    cache (prompt passes only, each row alone); the app does not offer it for generation.
    `offered`: False for options only training sets (the app and the CLI leave them out)."""

    name: str
    help: str
    kind: type = float
    low: float | None = None
    high: float | None = None
    step: float | None = None
    label: str = ""  # the control's label and its section heading in the app
    heading: str = ""
    whole_sequence: bool = False
    offered: bool = True

    def value(self, v: object) -> object:
        """`v` (a Python value or the CLI's text) as this option's kind; ValueError naming the option."""
        if self.kind is object:
            return v
        if self.kind is bool:
            if isinstance(v, bool):
                return v
            if isinstance(v, str) and v.lower() in ("true", "false", "1", "0", "on", "off"):
                return v.lower() in ("true", "1", "on")
            raise ValueError(f"option {self.name} = {str(v)[:40]!r}: expected true or false")
        try:
            x = float(v)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            raise ValueError(f"option {self.name} = {str(v)[:40]!r}: expected a number") from None
        if isinstance(v, bool) or not (self.low is None or self.low <= x) or not (self.high is None or x <= self.high):
            raise ValueError(f"option {self.name} = {str(v)[:40]!r}: expected a number in [{self.low}, {self.high}]")
        return x


@dataclass
class LMOutput:
    logits: torch.Tensor  # (B, T, V)
    aux_loss: torch.Tensor | None = None  # weighted sum of auxiliary routing losses (training)
    aux: dict[str, torch.Tensor] = field(default_factory=dict)  # each auxiliary term, unweighted


class RouteScopeLM(nn.Module):
    config: BaseConfig
    context: int
    vocab_size: int

    def _finalize(self) -> None:
        """Call at the end of a family's __init__: names sites and routing layers by their module
        paths, numbers attention layers."""
        self.sites: dict[str, Site] = name_sites(self)
        self.routing_modules: dict[str, RoutingLayer] = find_routing_layers(self)
        self.role_modules: dict[str, RoleLayer] = find_role_layers(self)
        self.attn_layers = [m for m in self.modules() if isinstance(m, Attention)]
        for i, m in enumerate(self.attn_layers):
            m.layer_id = i

    # --- family hooks ---------------------------------------------------------------------
    def _forward(self, idx: torch.Tensor) -> torch.Tensor:  # (B, T) -> logits (B, T, V)
        raise NotImplementedError

    def aux_weights(self) -> dict[str, float]:
        """Weight of each auxiliary loss term in `aux_loss` (training), keyed by the constants the
        family's modules record their terms under; a recorded term without a weight is an error."""
        return {}

    def ablation_modes(self) -> dict[str, str]:
        """Named ablations this model offers beyond dropping and forcing options (name -> what it
        does); a call selects them with `Ablation(modes=...)` (CLI `--mode`)."""
        return {}

    run_option_list: tuple[RunOption, ...] = ()  # the family's per-call options

    def run_options(self) -> dict[str, RunOption]:
        """Family-specific per-call options this model accepts, by name; forward rejects any other
        option given a value (None always means the model's default)."""
        return {o.name: o for o in self.run_option_list}

    # --- routing layers -----------------------------------------------------------------------
    def routing_layers(self) -> dict[str, int]:
        """Routing layer name -> number of options it chooses among, in module order."""
        return {name: m.n_options for name, m in self.routing_modules.items()}

    def option_labels(self) -> dict[str, list[str]]:
        """Routing layer name -> the label of each option (0-based, as ablation specs count)."""
        return {name: m.option_labels() for name, m in self.routing_modules.items()}

    def routing_top_k(self) -> dict[str, tuple[int, int]]:
        """Routing layer name -> (k, n): its router picks k options for each token among its first n
        (`RoutingLayer.top_k`, `n_routed`), for the layers whose router picks a fixed number."""
        return {name: (m.top_k, m.n_routed) for name, m in self.routing_modules.items() if m.top_k}

    # --- roles: which site records what (`sites.ROLES`, `sites.OPTION_ROLES`) --------------------
    role_modules: dict[str, RoleLayer] | None = None  # set by _finalize; None: the routing layers are all (HF)

    def role_layers(self) -> dict[str, RoleLayer]:
        """Every layer that declares role sites (the routing layers and the others, e.g. Wiola's
        token mergers), by name in module order."""
        return self.routing_modules if self.role_modules is None else self.role_modules

    def sites_of(self, role: str) -> dict[str, str]:
        """Layer name -> the full name of the site playing `role` there, for every layer declaring it,
        in module order: `model.sites_of(GATE)` -> {"blocks.0.dsff": "blocks.0.dsff.gate", ...}."""
        return {name: m.roles[role] for name, m in self.role_layers().items() if role in m.roles}

    def option_sites_of(self, role: str) -> dict[str, tuple[str, ...]]:
        """Layer name -> the site of each option for the per-option `role` (`sites.OPTION_ROLES`):
        `model.option_sites_of(PATHS)` -> {"parallel.0": ("parallel.0.paths.0.out", ...), ...}."""
        return {name: m.option_roles[role] for name, m in self.role_layers().items() if role in m.option_roles}

    # --- public API -------------------------------------------------------------------------
    def forward(self, idx: torch.Tensor, *, ablation: Ablation | None = None, routing: str = "deterministic",
                seed: int | None = None, generator: torch.Generator | None = None,
                cache: KVCache | None = None, pad_mask: torch.Tensor | None = None,
                row_ablations: tuple[Ablation, ...] | list[Ablation] | None = None, float_logits: bool = True,
                **options) -> LMOutput:
        """Logits of `idx` (B, T). `options`: the family's own per-call options (`run_options()`,
        e.g. Wiola's atm / atm_tau); None means the model's default. `row_ablations`: one ablation per
        row (B of them), where the family supports it (`row_ablations_supported`), instead of `ablation`.
        `float_logits=False`: the logits as the model computes them (bfloat16 for a bfloat16 HF model)
        for callers that only rank them, without a float32 copy of [B, T, vocab] beside them."""
        self.check_input(idx, cache)
        if row_ablations is not None:
            row_ablations = self.check_row_ablations(row_ablations, idx.shape[0], ablation, cache)
        device = self.device
        if idx.device != device:  # ids built on the CPU (checked there without a device sync) go over
            pinned = idx.pin_memory() if device.type == "cuda" and idx.is_cpu else idx  # without a wait
            idx = pinned.to(device, non_blocking=pinned.is_pinned())
        if pad_mask is not None and pad_mask.device != device:
            pad_mask = pad_mask.to(device)
        ablation = ablation or NO_ABLATION
        if not ablation.is_empty:
            ablation.validate(self.routing_layers(), self.ablation_modes(), self.routing_top_k())
        if routing not in ROUTING_MODES:
            raise ValueError(f"routing = {routing!r}: expected one of {ROUTING_MODES}")
        options = self.check_options(options)
        if generator is None and (routing == "sampled" or self.training):
            generator = torch.Generator().manual_seed(0 if seed is None else seed)
        state = RunState(ablation=ablation, routing=routing, generator=generator, cache=cache,
                         training=self.training, pad_mask=pad_mask, options=options, row_ablations=row_ablations,
                         float_logits=float_logits)
        with running(state):
            logits = self._forward(idx)
        if cache is not None:
            cache.pos += idx.shape[1]
        out = LMOutput(logits=logits, aux=state.aux)
        if state.aux:
            w = self.aux_weights()
            unweighted = sorted(set(state.aux) - set(w))
            if unweighted:
                raise KeyError(f"{self.config.label}: auxiliary loss term(s) {', '.join(unweighted)} have no weight "
                               f"in aux_weights() (weighted: {', '.join(w) or 'none'})")
            out.aux_loss = sum(w[k] * v for k, v in state.aux.items())
        return out

    row_ablations_supported: bool = False  # rows of one call may carry different ablations
    can_resume: bool = False  # capture() / resume(): a forward restarted at a routing layer (HF models)

    def float32_copy(self) -> "RouteScopeLM":
        """This model when it is float32, else a float32 copy (the shared model is not touched)."""
        if all(p.dtype == torch.float32 for p in self.parameters()):
            return self
        return copy.deepcopy(self).float().eval()

    def check_row_ablations(self, rows, batch: int, ablation: Ablation | None,
                            cache: KVCache | None) -> tuple[Ablation, ...]:
        """`rows` as a tuple of valid ablations, one per row; ValueError where this family cannot take
        them, their count is not the batch's, or an ablation for the whole call is given too."""
        if not self.row_ablations_supported:
            raise ValueError(f"{self.config.label} models take one ablation per call, not one per row")
        rows = tuple(rows)
        if len(rows) != batch or not all(isinstance(a, Ablation) for a in rows):
            raise ValueError(f"row_ablations: expected {batch} Ablations (one per row), got {len(rows)}")
        if ablation is not None and not ablation.is_empty:
            raise ValueError("give an ablation for the call or one per row, not both")
        if cache is not None:
            raise ValueError("row_ablations and a KV cache together are not supported")
        for a in set(rows):
            if a.modes or a.force:
                raise ValueError(f"row_ablations drop options only; got {a.describe()}")
            a.validate(self.routing_layers(), self.ablation_modes(), self.routing_top_k())
        return rows

    def check_options(self, options: dict) -> dict:
        """The options given a value (not None), each as its declared kind; ValueError naming any this
        family does not take or a value out of its range."""
        given = {k: v for k, v in options.items() if v is not None}
        known = self.run_options()
        bad = sorted(set(given) - set(known))
        if bad:
            takes = f"it takes {', '.join(known)}" if known else "it takes none"
            raise ValueError(f"{', '.join(bad)}: not an option of {self.config.label} models ({takes})")
        return {k: known[k].value(v) for k, v in given.items()}

    def check_input(self, idx: torch.Tensor, cache: KVCache | None = None) -> None:
        if not isinstance(idx, torch.Tensor) or idx.dtype not in (torch.int64, torch.int32) or idx.dim() != 2:
            raise InputError("input ids must be an integer tensor of shape [batch, pos]")
        if idx.numel() == 0:
            raise InputError("empty input: the prompt has no tokens")
        lo, hi = map(int, torch.aminmax(idx))
        if lo < 0 or hi >= self.vocab_size:
            bad = lo if lo < 0 else hi
            raise InputError(f"token id {bad} is out of the vocabulary (0..{self.vocab_size - 1})")
        total = idx.shape[1] + (cache.pos if cache is not None else 0)
        if total > self.context:
            raise InputError(f"{total} tokens exceed the context length {self.context}")

    @property
    def device(self) -> torch.device:
        """Where the parameters live; inputs built for this model go there (traces come back on the CPU)."""
        return next(self.parameters()).device

    def new_cache(self) -> KVCache:
        return KVCache(len(self.attn_layers))

    # --- capabilities (a family with its own way overrides them) ---------------------------------
    checkpoint_format: str | None = None  # how a saved copy is laid out, where not RouteScope's own
    token_embedding_path: str | None = None  # where a family knows it (GPT-2 style: "embed.wte")

    def token_embedding(self) -> str:
        """Module path of the token embedding (attribution reads and blends it): the family's
        `token_embedding_path`, else the one nn.Embedding with vocab_size rows."""
        if self.token_embedding_path is not None:
            return self.token_embedding_path
        found = [n for n, m in self.named_modules() if isinstance(m, nn.Embedding) and m.num_embeddings == self.vocab_size]
        if len(found) != 1:
            raise ValueError(f"cannot tell the token embedding of {self.config.label}: {len(found)} embeddings with "
                             f"{self.vocab_size} rows ({', '.join(found) or 'none'})")
        return found[0]

    def site_names(self) -> list[str]:
        return list(self.sites)

    def site_shapes(self) -> dict[str, str]:
        return {n: s.shape for n, s in self.sites.items()}

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())  # parameters() dedups tied weights

    def active_params(self) -> int:
        """Parameters used per token (differs from the total for top-k routing)."""
        return self.num_params()
