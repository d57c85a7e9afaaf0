"""Every session-state and widget key in one place (each browser session has its own values)."""

CHECKPOINT = "checkpoint"
UPLOAD = "upload"
UPLOADED_PATH = "uploaded_path"
PROMPT = "prompt"
PROMPT_FORM = "prompt_form"
GENERATE = "generate"
MAX_NEW = "max_new_tokens"
DECODING = "decoding"
TEMPERATURE = "temperature"
TOP_K = "top_k"
TOP_P = "top_p"
SEED = "seed"
GUMBEL_MODE = "gumbel_mode"
ATM_TAU = "atm_tau"
STEP = "selected_step"
VIEW = "view"
ATTR_POSITION = "attr_position"
ATTR_TOKEN = "attr_token"
ATTR_METHOD = "attr_method"
ATTR_RUN = "attr_run"
PROBES_UPLOAD = "probes_upload"
TABLE6_MAJORITY = "table6_majority"
TABLE6_SHOWN = "table6_shown"  # {(path, mtime): (probe file name, bytes, majority)} the view last showed

# ablation widgets: their values belong to the checkpoint in ABLATION_OWNER (views.ablation.reset_for)
ABLATION_OWNER = "ablation_owner"
KEEP_ONLY = "ablate::keep_only"
_ABLATION = "ablate::"


def drop_global_key(option: int) -> str:
    return f"{_ABLATION}drop_global::{option}"


def drop_key(layer: str) -> str:
    return f"{_ABLATION}drop::{layer}"


def force_key(layer: str) -> str:
    return f"{_ABLATION}force::{layer}"


def is_ablation_key(key: str) -> bool:
    return key.startswith(_ABLATION)
