"""Every session-state and widget key in one place (each browser session has its own values)."""

CHECKPOINT = "checkpoint"
UPLOAD = "upload"
UPLOADED_PATH = "uploaded_path"
PROMPT = "prompt"
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
DROP_GLOBAL = "drop_global"
PGPT_ONE = "pgpt_one"
ATTR_POSITION = "attr_position"
ATTR_TOKEN = "attr_token"
ATTR_METHOD = "attr_method"
ATTR_RUN = "attr_run"
PROBES_UPLOAD = "probes_upload"
TABLE6_MAJORITY = "table6_majority"
TABLE6_RUN = "table6_run"


def drop_key(layer: str) -> str:
    return f"drop::{layer}"


def force_key(layer: str) -> str:
    return f"force::{layer}"
