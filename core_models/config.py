"""Config base: frozen dataclasses that round-trip through plain JSON and validate on creation."""
from __future__ import annotations

import dataclasses
import math
import reprlib
import typing
from typing import Any, ClassVar

FORMAT_VERSION = 1
# Position tables (RoPE/SRPE, 2 * context rows per attention layer) and the KV cache are allocated to
# the context length when a model is built or run: beyond this a corrupt config costs gigabytes. Paper
# configurations use <= 2,048 and the CPU explorer cannot attend over much more.
MAX_CONTEXT = 2**14


class ConfigError(ValueError):
    """A configuration field is missing, unknown or out of range; the message names it."""


@dataclasses.dataclass(frozen=True)
class BaseConfig:
    family: ClassVar[str] = ""
    # What every model offers, for code that handles any family (batching, attribution, training). A
    # family whose config has the field (a dataclass field of the same name) overrides the default.
    pad_id = -1  # >= 0: the id of padding tokens (masked as attention keys where the family does)
    tie_embeddings = False  # the output head shares the token embedding's weight

    @property
    def label(self) -> str:
        """The family as users see it everywhere (app, catalog, export `family` column): the family,
        or the variant where a field makes a different kind of model ("papaformer-gumbel-v2")."""
        return self.family

    @property
    def has_combined_route(self) -> bool:
        """Whether a routing layer offers the combined representation as a route besides its paths
        (PaPaformer's Gumbel combiners); families that have one say so in their config."""
        return False

    def __post_init__(self) -> None:
        self._coerce_types()
        self.validate()
        context = getattr(self, "context", None)
        if isinstance(context, int) and context > MAX_CONTEXT:
            self.fail("context", f"must be at most {MAX_CONTEXT:,} (position tables and the KV cache are allocated "
                                 "to the context length)")

    # subclasses check their fields here, raising through self.fail(field, why)
    def validate(self) -> None:
        pass

    def fail(self, field: str, why: str) -> typing.NoReturn:
        raise ConfigError(f"{type(self).__name__}.{field} = {short_repr(getattr(self, field, None))}: {why}")

    def require(self, cond: bool, field: str, why: str) -> None:
        if not cond:
            self.fail(field, why)

    def positive(self, *fields: str) -> None:
        for f in fields:
            v = getattr(self, f)
            self.require(isinstance(v, int) and v > 0, f, "must be a positive integer")

    def one_of(self, field: str, options: tuple[str, ...]) -> None:
        self.require(getattr(self, field) in options, field, f"must be one of {', '.join(options)}")

    def _coerce_types(self) -> None:
        # JSON has no tuples; lists become tuples so configs stay hashable and frozen
        hints = typing.get_type_hints(type(self))
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, list):
                object.__setattr__(self, f.name, tuple(v))
            elif hints.get(f.name) is float and isinstance(v, int) and not isinstance(v, bool):
                object.__setattr__(self, f.name, float(v))

    def to_dict(self) -> dict[str, Any]:
        d = {"family": self.family, "format_version": FORMAT_VERSION}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            d[f.name] = list(v) if isinstance(v, tuple) else v
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "BaseConfig":
        if not isinstance(d, dict):
            raise ConfigError(f"{cls.__name__}: expected an object of config fields, got {json_kind(d)}")
        d = dict(d)
        fam = d.pop("family", cls.family)
        if fam != cls.family:
            raise ConfigError(f"{cls.__name__}.family = {short_repr(fam)}: expected {cls.family!r}")
        version = d.pop("format_version", FORMAT_VERSION)
        if not _fits(version, int) or version != FORMAT_VERSION:
            raise ConfigError(f"format_version = {short_repr(version)}: this RouteScope reads version {FORMAT_VERSION}")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            more = f" and {len(unknown) - 8} more" if len(unknown) > 8 else ""
            raise ConfigError(f"{cls.__name__}: unknown field(s) {', '.join(map(short_repr, unknown[:8]))}{more}")
        missing = sorted(f.name for f in dataclasses.fields(cls)
                         if f.name not in d and f.default is dataclasses.MISSING
                         and f.default_factory is dataclasses.MISSING)
        if missing:
            raise ConfigError(f"{cls.__name__}: missing field(s) {', '.join(missing)}")
        hints = typing.get_type_hints(cls)
        for k, v in d.items():
            _check_type(cls.__name__, k, v, hints[k])
        return cls(**d)

    def replace(self, **changes: Any) -> "BaseConfig":
        return dataclasses.replace(self, **changes)


def json_kind(value: Any) -> str:
    """How a JSON value reads in an error message: 'null', 'a list', 'a string', ..."""
    kinds = {type(None): "null", bool: "a boolean", int: "a number", float: "a number", str: "a string",
             list: "a list", dict: "an object"}
    return kinds.get(type(value), type(value).__name__)


_SHORT = reprlib.Repr()
_SHORT.maxstring = _SHORT.maxother = 60


def short_repr(value: Any) -> str:
    """repr() cut to a readable length: error messages quote values from untrusted files."""
    return _SHORT.repr(value)


def _fits(value: Any, t: Any) -> bool:
    if t is type(None):
        return value is None
    if t is bool:
        return isinstance(value, bool)
    if t is int:  # JSON true/false are not numbers here, nor is 1.5 an int
        return isinstance(value, int) and not isinstance(value, bool)
    if t is float:  # NaN/Infinity are accepted by Python's json module but are never a valid setting
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if t is str:
        return isinstance(value, str)
    return True


def _check_type(owner: str, name: str, value: Any, hint: Any) -> None:
    origin = typing.get_origin(hint)
    if origin is typing.Union or origin is getattr(__import__("types"), "UnionType", None):
        ok = any(_fits(value, a) for a in typing.get_args(hint))
    elif origin is tuple:
        ok = isinstance(value, (list, tuple))
    else:
        ok = _fits(value, hint)
    if not ok:
        names = {type(None): "null", bool: "true or false", int: "an integer", float: "a finite number",
                 str: "a string"}
        want = " or ".join(names.get(a, getattr(a, "__name__", str(a))) for a in (typing.get_args(hint) or (hint,)))
        raise ConfigError(f"{owner}.{name} = {short_repr(value)}: expected {want}, got {json_kind(value)}")
