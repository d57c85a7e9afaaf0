"""RouteScope model families, routing sites, traces, ablations and generation."""

from routescope.layout import only_as  # noqa: E402

only_as("routescope.core_models", __name__)
from .ablation import Ablation
from .base import InputError, LMOutput, RouteScopeLM
from .config import BaseConfig, ConfigError
from .registry import build_model, config_from_dict, from_name, param_count, preset_names
from .run_state import KVCache
from .specs import AblationError
from .trace import Trace, tracing

__all__ = ["Ablation", "AblationError", "BaseConfig", "ConfigError", "InputError", "KVCache", "LMOutput",
           "RouteScopeLM", "Trace", "build_model", "config_from_dict", "from_name", "param_count",
           "preset_names", "tracing"]
