"""Families from outside the repository, loaded once per process from the `routescope.families` entry
point group (each entry point: a `routescope.families.FamilySpec`, or a callable returning one, named
as the entry point), or added in-process by `add` (tests, notebooks).

This module sits at the bottom so every layer can ask it for a plugin's part without importing the
layers above: core_models reads a plugin's `config`, `model`, `param_count`, `presets`; analysis its
`analysis` and `probes`; rendering its `drawers`; the app its `pages`. A plugin that fails to load is
remembered with its reason (said when its family is asked for), never a traceback."""
from __future__ import annotations

import threading
from importlib import metadata
from typing import Any

from .config import ConfigError, short_repr

GROUP = "routescope.families"
BUILTIN_NAMES = ("llama", "papaformer", "pgpt", "lgpt", "cgpt", "moep", "wiola", "hf")

_found: dict[str, Any] = {}   # family name -> its plugin object (a FamilySpec)
_broken: dict[str, str] = {}  # entry point -> why it did not load
_lock = threading.Lock()
_loaded = False


def _load() -> None:
    """Every entry point of the group, once per process; a plugin never replaces a built-in family."""
    global _loaded
    if _loaded:  # every lookup asks: no lock once loaded
        return
    with _lock:
        if _loaded:
            return
        for ep in metadata.entry_points(group=GROUP):
            if ep.name in BUILTIN_NAMES or ep.name in _found:
                continue
            try:
                obj = ep.load()
                spec = obj if _is_spec(obj) else obj()
                if not _is_spec(spec) or spec.name != ep.name:
                    raise TypeError(f"expected a FamilySpec named {ep.name!r}, got {short_repr(spec)}")
            except Exception as e:  # a broken plugin must not take the app or CLI down
                _broken[ep.name] = f"{ep.value}: {type(e).__name__}: {str(e)[:200]}"
                continue
            _found[spec.name] = spec
        _loaded = True


def _is_spec(obj: Any) -> bool:
    """A family spec by its shape (the FamilySpec class sits above this layer)."""
    return all(hasattr(obj, a) for a in ("name", "config", "model", "param_count"))


def plugins() -> dict[str, Any]:
    """Family name -> plugin spec, in the order they were found."""
    _load()
    return dict(_found)


def plugin(name: str) -> Any | None:
    """The plugin spec of family `name`, or None; ConfigError where its entry point did not load."""
    _load()
    if name in _found:
        return _found[name]
    if name in _broken:
        raise ConfigError(f"family {name!r}: its plugin did not load ({_broken[name]})")
    return None


def add(spec: Any) -> None:
    """Add a family in-process, as an entry point would; a built-in family is never replaced."""
    if spec.name in BUILTIN_NAMES:
        raise ValueError(f"family {spec.name!r} is built in")
    if not _is_spec(spec):
        raise TypeError(f"expected a FamilySpec, got {short_repr(spec)}")
    _found[spec.name] = spec


def remove(name: str) -> None:
    if name not in BUILTIN_NAMES:
        _found.pop(name, None)


def part(name: str, attr: str, default: Any = None) -> Any:
    """One layer's part (`attr`) of plugin family `name`, or `default` where it has none."""
    spec = plugin(name)
    return default if spec is None else getattr(spec, attr, default)
