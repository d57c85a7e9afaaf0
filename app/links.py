"""Links that reopen a view: the state a page depends on <-> the URL's query parameters.

Pure functions (no Streamlit): `to_params(LinkState) -> {name: text}` and `from_params(params) ->
(LinkState, notices)`, then `for_model` for what only the loaded model can check (its views, layers
and specs). A value that cannot apply is left out with one notice line naming the parameter, and the
page keeps its default for it; nothing here raises on what a URL holds.

A prompt longer than PROMPT_INLINE characters travels as `prompt_sha`, the first 16 hex digits of its
SHA-256, and its text stays in the server's `PromptStore` (one per process, bounded): a link with a
digest opens the prompt only on a server that has seen it since it started.
"""
from __future__ import annotations

import hashlib
import math
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass, fields, replace
from collections.abc import Callable, Collection, Mapping

from routescope.core_models.ablation import applicable
from routescope.core_models.run_state import ROUTING_MODES
from routescope.core_models.specs import SpecError, parse_selector

# the sidebar's ranges and defaults, read by its widgets too: a link's value is checked against them
MAX_NEW = (0, 64, 24)  # (low, high, default)
TEMPERATURE = (0.05, 2.0, 1.0, 0.05)  # (low, high, default, step)
TOP_K = (0, 4096, 0)
TOP_P = (0.05, 1.0, 1.0, 0.05)
SEED = (0, 2**31 - 1, 0)
DECODINGS = ("greedy", "sampling")

PROMPT_INLINE = 200  # longer prompts go by digest (a URL of a few kB is refused by some proxies)
DIGEST_CHARS = 16
IGNORED = ("embed", "embed_options")  # Streamlit's own parameters
OPTION = "opt."  # a run option's parameter: opt.NAME

# parameter names, in the order the URL lists them
NAMES = ("checkpoint", "prompt", "prompt_sha", "ablate", "view", "layer", "max_new", "decoding", "temperature",
         "top_k", "top_p", "seed", "routing")


@dataclass(frozen=True)
class LinkState:
    """What a link records. None (or no specs): not given, the page's default applies."""

    checkpoint: str | None = None  # the checkpoint's name as the picker lists it
    prompt: str | None = None
    specs: tuple[str, ...] = ()  # ablation specs as the spec box takes them ("*:1", "force L:0", "mode m")
    view: str | None = None
    layer: str | None = None  # the layer the per-layer ablation controls show (models with many options)
    max_new: int | None = None
    decoding: str | None = None  # "greedy" or "sampling"
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    routing: str | None = None  # Gumbel routing mode (ROUTING_MODES)
    options: tuple[tuple[str, float], ...] = ()  # the family's run options the sidebar offers, as `opt.NAME`


def digest(prompt: str) -> str:
    """The key a long prompt travels under: a SHA-256 prefix of its UTF-8 bytes (16 hex digits)."""
    return hashlib.sha256(prompt.encode("utf-8", "surrogatepass")).hexdigest()[:DIGEST_CHARS]


class PromptStore:
    """Long prompts by digest, for every session of this server process (thread-safe); the least
    recently used go first beyond `max_entries` prompts or `max_chars` characters in all."""

    def __init__(self, max_entries: int = 256, max_chars: int = 8_000_000):
        self.max_entries, self.max_chars = max_entries, max_chars
        self._items: OrderedDict[str, str] = OrderedDict()
        self._chars = 0
        self._lock = threading.Lock()

    def put(self, prompt: str) -> str:
        key = digest(prompt)
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return key
            self._items[key] = prompt
            self._chars += len(prompt)
            while len(self._items) > self.max_entries or (self._chars > self.max_chars and len(self._items) > 1):
                _, old = self._items.popitem(last=False)
                self._chars -= len(old)
        return key

    def get(self, key: str) -> str | None:
        with self._lock:
            text = self._items.get(key)
            if text is not None:
                self._items.move_to_end(key)
            return text

    def __len__(self) -> int:
        return len(self._items)


def _number(x: float) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


def to_params(state: LinkState) -> dict[str, str]:
    """The URL's query parameters of `state` (fields left None are left out). A prompt over
    PROMPT_INLINE characters becomes `prompt_sha` (the caller keeps its text: `PromptStore.put`)."""
    out: dict[str, str] = {}
    for f in fields(state):
        value = getattr(state, f.name)
        if value is None or value == ():
            continue
        if f.name == "prompt":
            out.update({"prompt": value} if len(value) <= PROMPT_INLINE else {"prompt_sha": digest(value)})
        elif f.name == "specs":
            out["ablate"] = ";".join(value)
        elif f.name == "options":
            out.update({OPTION + name: _number(float(v)) for name, v in value})
        else:
            out[f.name] = _number(value)
    return {k: out[k] for k in (*NAMES, *sorted(k for k in out if k.startswith(OPTION))) if k in out}


def split_specs(text: str) -> list[tuple[str, str]]:
    """"*:1;force L:0;mode m" -> [("drop", "*:1"), ("force", "L:0"), ("mode", "m")] (the spec box's
    grammar: one a line or ';'-separated, a kind word in front where wanted)."""
    out = []
    for raw in re.split(r"[;\n]", text or ""):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        head, _, rest = line.partition(" ")
        if head.lower() in ("drop", "force", "mode") and rest.strip():
            out.append((head.lower(), rest.strip()))
        else:
            out.append(("drop", line))
    return out


def _shown(kind: str, text: str) -> str:
    return text if kind == "drop" else f"{kind} {text}"


def _syntax(kind: str, text: str) -> str | None:
    """Why the spec cannot parse, or None (which layers it names is for_model's to check)."""
    if kind == "mode":
        return None if re.fullmatch(r"[\w.-]+", text) else "not a mode name"
    try:
        sel = parse_selector(text, kind)
    except SpecError as e:
        return e.reason
    if kind == "force" and (sel.invert or sel.top or len(sel.options) != 1):
        return "force takes one option per layer (LAYER:OPTION)"
    return None


def _whole(name: str, text: str, low: int, high: int) -> tuple[int | None, str | None]:
    try:
        value = int(text.strip())
    except ValueError:
        return None, f"`{name}`: {text!r} is not a whole number"
    if not low <= value <= high:
        return None, f"`{name}`: {value} is outside {low}..{high}"
    return value, None


def _real(name: str, text: str, low: float, high: float, step: float) -> tuple[float | None, str | None]:
    try:
        value = float(text.strip())
    except ValueError:
        return None, f"`{name}`: {text!r} is not a number"
    if not math.isfinite(value) or not low <= value <= high:
        return None, f"`{name}`: {text.strip()} is outside {low:g}..{high:g}"
    return round(round(value / step) * step, 6), None  # on the slider's steps


def _one(value) -> str:
    """A query parameter's value: the last where it is given more than once."""
    if isinstance(value, (list, tuple)):
        return str(value[-1]) if value else ""
    return str(value)


def from_params(params: Mapping[str, object], *, checkpoints: Collection[str],
                prompts: Callable[[str], str | None]) -> tuple[LinkState, list[str]]:
    """A URL's query parameters -> (what applies, one notice line per value left out). `checkpoints`:
    the names this server lists; `prompts(digest)`: a long prompt's text, or None where this server
    does not hold it."""
    got = {k: _one(v) for k, v in params.items()}
    notices: list[str] = []
    values: dict[str, object] = {}

    def note(problem: str | None, default: str = "the default is used") -> None:
        if problem:
            notices.append(" ".join(f"Link: {problem}; {default}.".split()))  # one line, whatever the URL held

    options = []
    for name in got:
        if name.startswith(OPTION) and len(name) > len(OPTION):
            try:
                value = float(got[name].strip())
            except ValueError:
                value = math.nan
            if math.isfinite(value):
                options.append((name[len(OPTION):], value))
            else:
                note(f"`{name}`: {got[name]!r} is not a number")
        elif name not in NAMES and name not in IGNORED:
            note(f"`{name}` is not a parameter this page reads", "ignored")
    if options:
        values["options"] = tuple(options)
    if "checkpoint" in got:
        if got["checkpoint"] in checkpoints:
            values["checkpoint"] = got["checkpoint"]
        else:
            note(f"`checkpoint`: no checkpoint named {got['checkpoint']!r} on this server (an uploaded one "
                 "lasts only for its session)")
    if "prompt" in got:
        values["prompt"] = got["prompt"]
    elif "prompt_sha" in got:
        text = prompts(got["prompt_sha"].strip().lower())
        if text is None:
            note(f"`prompt_sha`: this server does not hold the prompt {got['prompt_sha'][:DIGEST_CHARS]!r} (a long "
                 "prompt is kept by the server that made the link, until it restarts)", "the default prompt is used")
        else:
            values["prompt"] = text
    if "ablate" in got:
        kept = []
        for kind, text in split_specs(got["ablate"]):
            why = _syntax(kind, text)
            if why:
                note(f"`ablate`: {_shown(kind, text)!r} left out: {why}", "the other specs apply")
            else:
                kept.append(_shown(kind, text))
        values["specs"] = tuple(kept)
    for name in ("view", "layer"):
        if got.get(name, "").strip():
            values[name] = got[name].strip()
    checks = {"max_new": lambda t: _whole("max_new", t, *MAX_NEW[:2]),
              "top_k": lambda t: _whole("top_k", t, *TOP_K[:2]),
              "seed": lambda t: _whole("seed", t, *SEED[:2]),
              "temperature": lambda t: _real("temperature", t, TEMPERATURE[0], TEMPERATURE[1], TEMPERATURE[3]),
              "top_p": lambda t: _real("top_p", t, TOP_P[0], TOP_P[1], TOP_P[3])}
    for name, check in checks.items():
        if name in got:
            value, problem = check(got[name])
            note(problem)
            if value is not None:
                values[name] = value
    for name, allowed in (("decoding", DECODINGS), ("routing", ROUTING_MODES)):
        if name in got:
            if got[name] in allowed:
                values[name] = got[name]
            else:
                note(f"`{name}`: {got[name]!r} is not one of {', '.join(allowed)}")
    return LinkState(**values), notices


def for_model(state: LinkState, *, views: Collection[str], layers: dict[str, int],
              known_modes: Mapping[str, str] | None = None,
              top_k: Mapping[str, tuple[int, int]] | None = None,
              layer_picker: bool = True,
              options: Mapping[str, tuple[float, float]] | None = None) -> tuple[LinkState, list[str]]:
    """What the loaded model decides: the view among those it offers, the layer among its routing
    layers (where its ablation controls show one layer at a time: `layer_picker`), each spec against
    its layers and modes (a "top N" spec is kept: the page ranks it with the prompt's counts, and the
    spec box says why where it cannot), each run option among those offered (`options`: name -> (low,
    high)) and within its range."""
    notices, changes = [], {}
    if state.options:
        kept = []
        for name, value in state.options:
            if name not in (options or {}):
                notices.append(f"Link: `{OPTION}{name}`: this model offers no run option {name!r}; ignored.")
            elif not options[name][0] <= value <= options[name][1]:
                notices.append(f"Link: `{OPTION}{name}`: {value:g} is outside {options[name][0]:g}..{options[name][1]:g}; "
                               "the default is used.")
            else:
                kept.append((name, value))
        changes["options"] = tuple(kept)
    if state.layer is not None and not layer_picker:
        notices.append("Link: `layer`: this model's ablation controls show every layer at once; ignored.")
        state = replace(state, layer=None)
    if state.view is not None and state.view not in views:
        notices.append(f"Link: `view`: {state.view!r} is not a view of this model ({', '.join(views)}); "
                       "the default view is shown.")
        changes["view"] = None
    if state.layer is not None and state.layer not in layers:
        notices.append(f"Link: `layer`: this model has no routing layer {state.layer!r}; the first is shown.")
        changes["layer"] = None
    if state.specs:
        parsed = split_specs(";".join(state.specs))
        _, left_out = applicable([t for k, t in parsed if k == "drop"], [t for k, t in parsed if k == "force"],
                                 [t for k, t in parsed if k == "mode"], layers=layers,
                                 known_modes=dict(known_modes or {}), top_k=dict(top_k or {}), usage=None)
        top_n = {_shown(k, t) for k, t in parsed if k != "mode" and parse_selector(t, k).top}
        dropped = {spec: why for spec, why in left_out if spec not in top_n}
        for spec, why in dropped.items():
            notices.append(" ".join(f"Link: `ablate`: {spec!r} left out: {why}; the other specs apply.".split()))
        changes["specs"] = tuple(_shown(k, t) for k, t in parsed if _shown(k, t) not in dropped)
    return replace(state, **changes), notices
