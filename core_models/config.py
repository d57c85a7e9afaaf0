"""Config base: frozen dataclasses that round-trip through plain JSON and validate on creation."""
from __future__ import annotations

import dataclasses
import typing
from typing import Any, ClassVar

FORMAT_VERSION = 1


class ConfigError(ValueError):
    """A configuration field is missing, unknown or out of range; the message names it."""


@dataclasses.dataclass(frozen=True)
class BaseConfig:
    family: ClassVar[str] = ""

    def __post_init__(self) -> None:
        self._coerce_types()
        self.validate()

    # subclasses check their fields here, raising through self.fail(field, why)
    def validate(self) -> None:
        pass

    def fail(self, field: str, why: str) -> typing.NoReturn:
        raise ConfigError(f"{type(self).__name__}.{field} = {getattr(self, field, None)!r}: {why}")

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
        d = dict(d)
        fam = d.pop("family", cls.family)
        if fam != cls.family:
            raise ConfigError(f"{cls.__name__}.family = {fam!r}: expected {cls.family!r}")
        version = d.pop("format_version", FORMAT_VERSION)
        if version != FORMAT_VERSION:
            raise ConfigError(f"format_version = {version!r}: this RouteScope reads version {FORMAT_VERSION}")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ConfigError(f"{cls.__name__}: unknown field(s) {', '.join(unknown)}")
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


def _check_type(owner: str, name: str, value: Any, hint: Any) -> None:
    base = {int: int, float: (int, float), str: str, bool: bool}
    origin = typing.get_origin(hint)
    if hint in base:
        ok = isinstance(value, base[hint]) and not (hint is not bool and isinstance(value, bool))
    elif origin is typing.Union or origin is getattr(__import__("types"), "UnionType", None):
        args = typing.get_args(hint)
        ok = any(value is None if a is type(None) else isinstance(value, base.get(a, object)) for a in args)
    elif origin is tuple:
        ok = isinstance(value, (list, tuple))
    else:
        ok = True
    if not ok:
        raise ConfigError(f"{owner}.{name} = {value!r}: expected {getattr(hint, '__name__', hint)}")
