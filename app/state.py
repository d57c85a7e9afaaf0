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
STEP = "selected_step"
VIEW = "view"
ATTR_POSITION = "attr_position"
ATTR_TOKEN = "attr_token"
ATTR_METHOD = "attr_method"
ATTR_RUN = "attr_run"
ATTR_STEPS = "attr_steps"
ATTR_DELTAS = "attr_deltas"  # per target: {n_steps: convergence delta} measured in this session
PROBES_UPLOAD = "probes_upload"
# links (app/links.py): the URL is read once per session, on its first run; what needs the model waits
LINK_READ = "link_read"
LINK_PENDING = "link_pending"

# ablation widgets: keyed by the checkpoint they belong to (its path), so a box ticked for one model
# is a different widget from the next model's (the browser keeps a widget's value per key);
# views.ablation.reset_for also forgets the previous checkpoint's values
ABLATION_OWNER = "ablation_owner"
_ABLATION = "ablate::"


def run_option_key(option: str) -> str:
    """The widget of a family run option the sidebar offers (`RouteScopeLM.run_options()`)."""
    return f"run_option_{option}"


def keep_only_key(scope: str) -> str:
    return f"{_ABLATION}{scope}::keep_only"


def drop_global_key(scope: str, option: int) -> str:
    return f"{_ABLATION}{scope}::drop_global::{option}"


def drop_key(scope: str, layer: str) -> str:
    return f"{_ABLATION}{scope}::drop::{layer}"


def force_key(scope: str, layer: str) -> str:
    return f"{_ABLATION}{scope}::force::{layer}"


def specs_key(scope: str) -> str:
    """The ablation spec box (one spec a line: "*:0-3", "force LAYER:OPTION")."""
    return f"{_ABLATION}{scope}::specs"


def drop_everywhere_key(scope: str) -> str:
    """The searchable "drop everywhere" multiselect of models with many options per layer."""
    return f"{_ABLATION}{scope}::drop_everywhere"


def layer_pick_key(scope: str) -> str:
    """Which layer the per-layer controls of a many-layer model show."""
    return f"{_ABLATION}{scope}::layer_pick"


def view_layer_key(scope: str) -> str:
    """Which layer the Routing view's per-layer figures show; it follows `layer_pick_key` both ways
    (`follow_layer`), so a link's layer opens both."""
    return f"{_ABLATION}{scope}::view_layer"


def layer_choices_key(scope: str) -> str:
    """{layer: (dropped options, forced option or None)} of the per-layer controls: kept here, not in
    the widgets, because only the picked layer's widgets are drawn (an undrawn widget forgets)."""
    return f"{_ABLATION}{scope}::layer_choices"


def mode_key(scope: str, mode: str) -> str:
    return f"{_ABLATION}{scope}::mode::{mode}"


def is_ablation_key(key: str) -> bool:
    return key.startswith(_ABLATION)

# Corpus view (app/views/corpus.py)
CORPUS_SOURCE = "corpus_source"
CORPUS_SHIPPED = "corpus_shipped"
CORPUS_UPLOAD = "corpus_upload"
CORPUS_PATH = "corpus_path"
CORPUS_MAX_TOKENS = "corpus_max_tokens"
CORPUS_INTENDED = "corpus_intended"
CORPUS_COMPARE = "corpus_compare"
CORPUS_TOP = "corpus_top"
CORPUS_MIN_COUNT = "corpus_min_count"
CORPUS_AGAIN = "corpus_again"
# the view's inputs kept across view switches (an undrawn widget's value is dropped by Streamlit)
CORPUS_KEPT = (CORPUS_SOURCE, CORPUS_SHIPPED, CORPUS_PATH, CORPUS_MAX_TOKENS, CORPUS_INTENDED, CORPUS_COMPARE,
               CORPUS_TOP, CORPUS_MIN_COUNT)
CORPUS_UPLOADED = "corpus_uploaded::kept"  # (name, file id, bytes) of the last uploaded dataset
CORPUS_LAST = "corpus_last"  # {checkpoint path: job key} of the last finished corpus run ("top N@corpus")


def kept_key(key: str) -> str:
    """Where a view's input is kept while the view is not drawn."""
    return f"{key}::kept"

# Experts view (causal expert importance)
EXPERTS_SOURCE = "experts_source"
EXPERTS_SHIPPED = "experts_shipped"
EXPERTS_UPLOAD = "experts_upload"
EXPERTS_PATH = "experts_path"
EXPERTS_LAYERS = "experts_layers"
EXPERTS_MAX_TOKENS = "experts_max_tokens"
EXPERTS_DRAWS = "experts_draws"
EXPERTS_RUN = "experts_run"
EXPERTS_CANCEL = "experts_cancel"
EXPERTS_SORT = "experts_sort"
EXPERTS_METHOD = "experts_method"
EXPERTS_CONFIRM = "experts_confirm"
EXPERTS_MERGE = "experts_merge"
EXPERTS_IN_SAMPLE = "experts_in_sample"
# the view's inputs kept across view switches (as the Corpus view's: CORPUS_KEPT)
EXPERTS_KEPT = (EXPERTS_SOURCE, EXPERTS_SHIPPED, EXPERTS_PATH, EXPERTS_LAYERS, EXPERTS_MAX_TOKENS, EXPERTS_DRAWS,
                EXPERTS_SORT, EXPERTS_METHOD, EXPERTS_CONFIRM, EXPERTS_MERGE, EXPERTS_IN_SAMPLE)
EXPERTS_UPLOADED = "experts_uploaded::kept"  # (name, file id, bytes) of the last uploaded dataset
