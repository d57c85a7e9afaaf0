"""The parsers of the `routescope` commands: argparse, `cli.options` and the stdlib-only input limits
(`analysis.inputs.files`), so building them (all `routescope --help` needs) imports no torch or pandas.

Each function adds one command's parser and returns it; `add_all` records, on each, the module that
runs the command (`cli/<module>.py`, whose `run(args) -> int` imports what it needs at its top) and
`run_command`, which imports that module only when the command runs. A command whose bad input can
be refused without torch does that first, here (`PREPARE`): `export` reads its prompt file and
`routes` checks its probe file before torch loads, so a FIFO or a 300 MB file is refused at once, in
little memory. Option choices defined by
heavy modules are `options.ChoicesOf`: read from their module when shown or checked, never retyped.
To add a command: a function here, an entry in PARSERS, and `cli/<module>.py` with `run(args)`.
"""
from __future__ import annotations

import argparse
import importlib

from routescope.analysis.inputs.files import MAX_LINE_BYTES, MAX_PROMPT_FILE_BYTES, open_regular_file  # stdlib only
from routescope.analysis.inputs.prompts import read_prompt_file  # stdlib only

from . import options as O

ENGINES = ("embedded", "ray")  # routescope export --engine


def generate(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    g = sub.add_parser("generate", help="continue a prompt, with top-k next-token probabilities per step")
    g.add_argument("checkpoint")
    g.add_argument("prompt", type=O.prompt_text, help="the text to continue (not blank; UTF-8)")
    g.add_argument("--max-new-tokens", type=O.nonnegative_int, default=32)
    g.add_argument("--sample", action="store_true", help="sample instead of greedy decoding")
    g.add_argument("--temperature", type=O.positive_float, default=1.0, help="> 0")
    g.add_argument("--top-k", type=O.nonnegative_int, default=0, help="0: no top-k filter")
    g.add_argument("--top-p", type=O.probability, default=1.0, help="in (0, 1]; 1: no nucleus filter")
    g.add_argument("--seed", type=O.seed, default=0)
    g.add_argument("--top-n", type=O.positive_int, default=5,
                   help="candidates shown per step, 1 up to the vocabulary size (a larger value is refused)")
    O.add_ablation_options(g, top_over="the prompt")
    g.add_argument("--json", action="store_true")
    O.add_device_options(g)
    return g


def tokenizer(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    t = sub.add_parser("tokenizer", help="train the byte-level BPE tokenizer on both corpora")
    t.add_argument("--out", required=True)
    t.add_argument("--vocab-size", type=O.positive_int, default=4096)
    t.add_argument("--docs", type=O.positive_int, default=4000, help="documents per domain")
    t.add_argument("--seed", type=O.seed, default=0)
    return t


def train(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    tr = sub.add_parser("train", help="train a checkpoint from a preset (or --init-from a composed one)")
    tr.add_argument("preset")
    tr.add_argument("--out", required=True)
    tr.add_argument("--tokenizer", required=True)
    tr.add_argument("--data", default="story=0.5,math=0.5")
    tr.add_argument("--steps", type=O.positive_int, default=1000)
    tr.add_argument("--batch-size", type=O.positive_int, default=16)
    tr.add_argument("--seq-len", type=O.positive_int, default=128)
    tr.add_argument("--lr", type=O.positive_float, default=3e-3)
    tr.add_argument("--warmup", type=O.nonnegative_int, default=50)
    tr.add_argument("--eval-every", type=O.positive_int, default=200)
    tr.add_argument("--seed", type=O.seed, default=0)
    tr.add_argument("--init-from", default=None)
    tr.add_argument("--set", action="append", default=[], help="config FIELD=VALUE, repeatable")
    tr.add_argument("--max-minutes", type=O.nonnegative_float, default=0.0, help="0: no time limit")
    tr.add_argument("--stop-after", type=O.nonnegative_int, default=0, metavar="K",
                    help="stop after K steps of the --steps schedule (0: all of them); unlike --max-minutes "
                         "the same on every machine")
    tr.add_argument("--freeze", action="append", default=[], metavar="PATTERN",
                    help="parameter-name pattern (fnmatch, e.g. 'parallel.*.paths.*') frozen for the first "
                         "--freeze-for steps (router warm-up), repeatable")
    tr.add_argument("--freeze-for", type=O.nonnegative_int, default=0, metavar="K")
    tr.add_argument("--tau-start", type=O.positive_float, default=None,
                    help="Gumbel temperature at step 0, annealed geometrically to --tau-end")
    tr.add_argument("--tau-end", type=O.positive_float, default=None)
    tr.add_argument("--domain-routes", default="", metavar="DOMAIN=OPTION[,...]",
                    help="e.g. story=0,math=1: for the first --domain-route-steps steps each token takes its "
                         "document's domain option in every parallel layer")
    tr.add_argument("--domain-route-steps", type=O.nonnegative_int, default=0, metavar="K")
    tr.add_argument("--snapshots", default="", metavar="STEP[,STEP...]",
                    help="e.g. 50,100,200,400,1000: keep a checkpoint at each of these steps (and the last); "
                         "--out is then a run directory of step-NNNN snapshots with one shared tokenizer")
    tr.add_argument("--no-resume", action="store_true")
    tr.add_argument("--quiet", action="store_true")
    tr.set_defaults(argv=None)  # in-process callers give theirs (the checkpoint card's command)
    return tr


def compose(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    c = sub.add_parser("compose", help="build a PaPaformer from pre-trained path checkpoints")
    c.add_argument("--paths", nargs="+", required=True)
    c.add_argument("--combiner", required=True, choices=O.ChoicesOf("routescope.core_models.papaformer", "COMBINERS"),
                   metavar="NAME", help="one of %(choices)s")
    c.add_argument("--out", required=True)
    c.add_argument("--n-large-pre", type=O.nonnegative_int, default=1)
    c.add_argument("--n-large-post", type=O.nonnegative_int, default=1)
    c.add_argument("--seed", type=O.seed, default=0)
    c.add_argument("--combiner-init", default="mean", choices=O.ChoicesOf("routescope.core_models.training.compose", "COMBINER_INITS"),
                   metavar="INIT", help="Gumbel combiner: mean of the paths, or normal (N(0, 0.02), the "
                                        "reference's); one of %(choices)s (default: mean)")
    return c


def app(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    a = sub.add_parser("app", help="start the browser explorer")
    a.add_argument("--port", type=O.port, default=8501)
    a.add_argument("--headless", action="store_true", help="do not open a browser")
    a.add_argument("--address", default=None, help="address to listen on (default: Streamlit's)")
    a.add_argument("--checkpoints", action="append", default=[], help="extra checkpoint root, repeatable")
    O.add_device_options(a)
    return a


def import_(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    im = sub.add_parser("import", help="convert a checkpoint trained with the papers' own code")
    im.add_argument("--from", dest="source", required=True, choices=O.ChoicesOf("routescope.core_models.importers", "SOURCES"),
                    metavar="SOURCE", help="the reference code's model, one of %(choices)s")
    im.add_argument("--weights", required=True, help="reference state dict as .safetensors (pickle files are refused)")
    im.add_argument("--config", required=True, help="JSON with the reference's own argument names")
    im.add_argument("--out", required=True)
    im.add_argument("--tokenizer", default=None)
    return im


def export(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    e = sub.add_parser("export", help="export routing records of prompts to CSV / Parquet",
                       description="Export routing records (analysis.export.columns.EXPORT_SCHEMA) of every prompt.")
    e.add_argument("checkpoint")
    src = e.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", action="append", metavar="TEXT", type=O.prompt_text,
                     help="a prompt (repeatable; not blank)")
    src.add_argument("--prompts", metavar="FILE",
                     help=".txt (one prompt per line) or .tsv (prompt_id, prompt); a regular file of at most "
                          f"{MAX_PROMPT_FILE_BYTES >> 20} MiB, lines of at most {MAX_LINE_BYTES >> 20} MiB")
    e.add_argument("--out", action="append", required=True, metavar="FILE",
                   help="output .csv or .parquet (repeat to write both); an existing file is replaced, only "
                        "once the export has finished (the command names each file it replaced); an "
                        "interrupted export leaves the old file and no temporary file")
    O.add_ablation_options(e)
    e.add_argument("--max-new-tokens", type=O.nonnegative_int, default=0,
                   help="greedy continuation length (0: prompt only)")
    e.add_argument("--seed", type=O.seed, default=0, help="routing seed (sampled routing)")
    e.add_argument("--batch-size", type=O.positive_int, default=8)
    e.add_argument("--shard", metavar="i/n", help="only prompts with index %% n == i (0-based)")
    O.add_run_options(e)
    e.add_argument("--quiet", action="store_true", help="no progress bar")
    O.add_device_options(e)
    r = e.add_argument_group("distributed export (--engine ray; pip install 'routescope[distributed]')")
    r.add_argument("--engine", choices=ENGINES, default="embedded", metavar="ENGINE",
                   help="one of %(choices)s (default %(default)s: this process; ray: a Ray cluster, RAY_ADDRESS "
                        "or a local one, writing a partitioned Parquet dataset to --out DIR)")
    r.add_argument("--workers", type=O.positive_int, default=2, help="Ray actors, each loading the checkpoint once "
                                                                        "(default %(default)s)")
    r.add_argument("--partition-size", type=O.positive_int, default=1000,
                   help="prompts per output file (default %(default)s); a rerun skips finished partitions")
    r.add_argument("--threads-per-worker", type=O.positive_int, default=1, help="torch threads (and Ray CPUs) "
                                                                                "per actor (default %(default)s)")
    e.set_defaults(prompt_pairs=None)  # read_export_prompts
    return e


def routes(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    r = sub.add_parser("routes", help="routes of a family's probe prompts per routing layer, beside the paper's",
                       description="Route the probe prompts that the checkpoint's family declares (prompts whose "
                                   "expected route its paper prints) and compare with the paper's routes.")
    r.add_argument("checkpoint")
    r.add_argument("--probes", metavar="FILE", help="probe TSV (default: the family's own, its paper's probes)")
    r.add_argument("--majority", action="store_true", help="majority route over the prompt's tokens "
                                                           "(default: route at the last prompt token)")
    r.add_argument("--json", action="store_true")
    r.add_argument("--batch-size", type=O.positive_int, default=32, help="probes per forward (padded batches)")
    r.add_argument("--quiet", action="store_true", help="no progress bar")
    O.add_device_options(r)
    return r


def attribute(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    a = sub.add_parser("attribute", help="attribute a next-token log-prob to tokens or routing options")
    a.add_argument("checkpoint")
    a.add_argument("--prompt", required=True, metavar="TEXT", type=O.prompt_text)
    a.add_argument("--position", type=int, default=-1, help="position whose next token is explained (default: last)")
    tok = a.add_mutually_exclusive_group()
    tok.add_argument("--token", metavar="TEXT", type=O.utf8_text, help="target token text (one token; default: the model's top-1)")
    tok.add_argument("--token-id", type=int, metavar="ID", help="target token id")
    a.add_argument("--method", choices=O.ChoicesOf("routescope.analysis.runs.attribution", "ALL_METHODS"), default="ig",
                   metavar="METHOD", help="one of %(choices)s (ig: integrated gradients over input tokens; "
                                          "ablation, shapley: routing options)")
    a.add_argument("--baseline", choices=O.ChoicesOf("routescope.analysis.runs.attribution", "BASELINES"), default="pad",
                   metavar="BASELINE", help="ig baseline embedding, one of %(choices)s")
    a.add_argument("--n-steps", type=O.positive_int, default=64, help="ig integration steps")
    a.add_argument("--n-samples", type=O.positive_int, default=25, help="shapley permutations")
    a.add_argument("--scope", choices=O.ChoicesOf("routescope.analysis.runs.attribution", "SCOPES"), default="layer",
                   metavar="SCOPE", help="one of %(choices)s: paths per (layer, option) or per option index "
                                         "across layers")
    a.add_argument("--seed", type=O.seed, default=0)
    a.add_argument("--json", action="store_true")
    O.add_device_options(a)
    return a


def report(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    r = sub.add_parser("report", help="HTML routing report of a checkpoint (the corpus view's page, offline)",
                       description="Write one self-contained HTML page: the corpus view over each domain's "
                                   "validation split (utilisation, routes by domain, token specialisation, "
                                   "co-routing), routing accuracy on the probe prompts the family declares (those its "
                                   "paper prints), "
                                   "and each domain's validation loss with each path, block or expert dropped.")
    r.add_argument("checkpoint")
    r.add_argument("--out", required=True, metavar="FILE.html",
                   help="the page to write; an existing file is replaced (the command says so), only once "
                        "the page is complete")
    r.add_argument("--docs", type=O.positive_int, default=100,
                   help="validation documents per domain (default 100: the trainer's validation text)")
    r.add_argument("--seq-len", type=O.positive_int, default=256,
                   help="tokens per validation document and row (default 256)")
    r.add_argument("--top", type=O.positive_int, default=10, help="specialised tokens per layer and option")
    r.add_argument("--min-count", type=O.positive_int, default=5,
                   help="occurrences a token needs to be ranked as specialised")
    return r


def corpus(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    c = sub.add_parser("corpus", help="routing statistics of a checkpoint over a dataset (tables, offline page)",
                       description="Utilisation (dead and overloaded options), routes by label, accuracy against "
                                   "intended options, token specialisation and co-routing of a checkpoint over a "
                                   "dataset, optionally beside a second checkpoint.")
    c.add_argument("checkpoint")
    src = c.add_mutually_exclusive_group(required=True)
    src.add_argument("--data", metavar="FILE", help=".txt (one prompt per line), or .tsv / .csv / .jsonl / .parquet "
                                                     "with a text (or prompt) column and label columns")
    src.add_argument("--shipped", metavar="NAME", help="a shipped dataset: a probe set that a family declares "
                                                        "(its name in lower case; an unknown NAME lists them), "
                                                        "validation, validation-story, validation-math")
    c.add_argument("--compare", metavar="CHECKPOINT", help="a second checkpoint, run on the same rows")
    c.add_argument("--out", required=True, metavar="DIR", help="directory for the tables and corpus.html, replaced "
                                                                "whole (made if missing; an existing one may hold "
                                                                "only an earlier run's files: the command says how "
                                                                "many it replaced)")
    c.add_argument("--text-column", metavar="NAME", help="the text column (default: text, else prompt)")
    c.add_argument("--labels", metavar="COL,COL", help="label columns (default: every other column with at most "
                                                        "50 distinct values)")
    c.add_argument("--intended", action="append", default=[], metavar="COLUMN:VALUE=OPTION,...",
                   help="intended 0-based option of label values, e.g. domain:story=0,math=1 (repeatable); "
                        "expected_path / expected_option columns need none")
    c.add_argument("--max-tokens", type=O.positive_int, default=None,
                   help="tokens kept from the start of each text (default: the model's context)")
    c.add_argument("--batch-size", type=O.positive_int, default=32, help="rows per forward (padded batches)")
    c.add_argument("--top", type=O.positive_int, default=10, help="specialised tokens per layer and option")
    c.add_argument("--min-count", type=O.positive_int, default=5, help="occurrences a token needs to be ranked")
    c.add_argument("--format", default="csv,parquet", metavar="FMT,FMT", help="table formats: csv, parquet "
                                                                               "(default both)")
    c.add_argument("--quiet", action="store_true", help="no progress bar")
    O.add_ablation_options(c, routing=False, top_over="this dataset")
    O.add_device_options(c)
    return c


def importance(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    c = sub.add_parser("importance", help="causal importance of every expert over a dataset (tables, offline page, "
                                          "pruned checkpoint)",
                       description="Drop each routing option alone over a dataset, teacher-forced: the change in "
                                   "next-token NLL (with a bootstrap interval), KL, top-1 flips and usage, beside a "
                                   "random-expert control, cheap proxies and pruning curves.")
    c.add_argument("checkpoint")
    c.add_argument("--data", required=True, metavar="FILE", help=".txt (one text per line), or .tsv / .csv / .jsonl "
                                                                  "/ .parquet with a text (or prompt) column")
    c.add_argument("--out", required=True, metavar="DIR", help="directory for the tables and importance.html (made "
                                                                "if missing)")
    c.add_argument("--text-column", metavar="NAME", help="the text column (default: text, else prompt)")
    c.add_argument("--layers", metavar="LAYER,LAYER", help="routing layers to measure (default: all)")
    c.add_argument("--options", metavar="N,N", help="options (experts) to measure, 0-based (default: all)")
    c.add_argument("--max-tokens", type=O.positive_int, default=None,
                   help="tokens taken from the dataset in row order (default: all)")
    c.add_argument("--batch-size", type=O.positive_int, default=8, help="rows per forward")
    c.add_argument("--draws", type=O.positive_int, default=8, help="random draws of the control and of the random "
                                                                   "pruning ranking")
    c.add_argument("--method", choices=("estimate", "exact", "both"), default="both",
                   help="estimate: every expert's first-order estimate from one forward and backward per batch; "
                        "exact: every expert dropped over the dataset; both (default): estimate all, then measure "
                        "exactly the --confirm largest of each layer and the random control")
    c.add_argument("--confirm", type=O.positive_int, default=8, metavar="N",
                   help="--method both: experts of each layer measured exactly, the largest by |estimate| (default 8)")
    c.add_argument("--sweep", choices=("fast", "naive"), default="fast",
                   help="the exact sweep: fast: prefix reuse and many ablations per forward where the model allows; "
                        "naive: one full forward per ablation (the same numbers)")
    c.add_argument("--engine", choices=("local", "ray"), default="local",
                   help="ray: chunks of the sweep on Ray workers (a local cluster, or the one in RAY_ADDRESS); the "
                        "same numbers as one process")
    c.add_argument("--workers", type=O.positive_int, default=2, help="Ray workers (--engine ray)")
    c.add_argument("--model-dtype", action="store_true",
                   help="measure in the dtype the model runs in (default: a float32 copy: in bfloat16 rounding alone "
                        "moves log p by about as much as a single expert's effect)")
    c.add_argument("--prune", type=O.positive_int, metavar="N",
                   help="write a checkpoint without the N least important experts of every MoE layer (--prune-out)")
    c.add_argument("--prune-out", metavar="DIR", help="the pruned checkpoint's directory (new or empty)")
    c.add_argument("--holdout", type=O.float_in(0, 1, lo_open=True, hi_open=True), default=0.5, metavar="F",
                   help="share of the rows (seeded split) that judge pruning and merging; the others rank the experts "
                        "(default 0.5; at least 20 rows)")
    c.add_argument("--in-sample-curve", action="store_true",
                   help="the pruning curve on the ranking rows too, labelled in-sample (optimistic)")
    c.add_argument("--merge", type=O.positive_int, metavar="N",
                   help="merge curve: the N least important experts of every MoE layer merged into their most similar "
                        "kept expert (usage-weighted, M-SMoE style) against pruned, for 1..N, on the held-out rows")
    c.add_argument("--merge-out", metavar="DIR", help="write the model with N experts merged (--merge N) here (new or "
                                                      "empty)")
    c.add_argument("--quiet", action="store_true", help="no progress bar")
    O.add_device_options(c)
    return c


def drift(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    c = sub.add_parser("drift", help="routing drift over one run's checkpoints (router saturation, utilisation, "
                                     "expert deaths; tables, offline page)",
                       description="Route one dataset through every checkpoint of a training run: per layer the "
                                   "top-k overlap with the last checkpoint (OLMoE's router saturation) and with the "
                                   "previous one, per-expert utilisation, dead and overloaded experts, the step at "
                                   "which each expert dies or revives, and routes by label.")
    c.add_argument("checkpoints", nargs="+", metavar="CHECKPOINT", help="two or more checkpoints of one architecture, "
                                                                         "in the run's order (or --sort step)")
    src = c.add_mutually_exclusive_group(required=True)
    src.add_argument("--data", metavar="FILE", help=".txt (one text per line), or .tsv / .csv / .jsonl / .parquet "
                                                     "with a text (or prompt) column and label columns")
    src.add_argument("--shipped", metavar="NAME", help="a shipped dataset (validation, validation-story, ...)")
    c.add_argument("--out", required=True, metavar="DIR", help="directory for the tables and drift.html (made if "
                                                                "missing)")
    c.add_argument("--sort", choices=("given", "step"), default="given",
                   help="step: order the checkpoints by the step in their config, card or name (default: as given)")
    c.add_argument("--text-column", metavar="NAME", help="the text column (default: text, else prompt)")
    c.add_argument("--max-tokens", type=O.positive_int, default=None,
                   help="tokens kept per text, from its start (default: the model's context)")
    c.add_argument("--batch-size", type=O.positive_int, default=32, help="rows per forward")
    c.add_argument("--quiet", action="store_true", help="no progress bar")
    O.add_device_options(c)
    return c


def replay(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    r = sub.add_parser("replay", help="replay a serving engine's routing trace (vLLM, SGLang, a table) against the "
                                      "model as transformers runs it (tables, offline page)",
                       description="Run each trace row's token ids through the model teacher-forced and compare the "
                                   "top-k expert sets per (row, position, layer) with the engine's: agreement per "
                                   "layer, the first divergent layer, each mismatch with the reference router's "
                                   "margin (near-tie or not), and broken-trace checks.")
    r.add_argument("checkpoint")
    r.add_argument("--trace", required=True, metavar="FILE", help="the trace: vLLM or SGLang JSON lines, an SGLang "
                                                                  "per_token dump, or a table (.parquet / .csv)")
    r.add_argument("--trace-format", choices=O.ChoicesOf("routescope.analysis.replay.trace", "FORMATS"), default=None,
                   metavar="FORMAT", help="one of %(choices)s (default: read from the file)")
    r.add_argument("--out", required=True, metavar="DIR", help="directory for the tables and replay.html, replaced "
                                                                "whole (made if missing)")
    r.add_argument("--reference-dtype", choices=("float32",), default=None, metavar="DTYPE",
                   help="float32: also run the model in float32 and say which mismatches go away there")
    r.add_argument("--trace-dtype", choices=("float32", "bfloat16", "float16"), default=None, metavar="DTYPE",
                   help="the dtype the engine routed in: a near-tie's swap gap is within --tie-ulps of its resolution "
                        "(default: the model's dtype as run, --dtype)")
    r.add_argument("--tie-ulps", type=O.nonnegative_float, default=8.0,
                   help="a swap gap of at most this many ulps of --trace-dtype (at the k-th logit's size) is a near-tie "
                        "(default %(default)s)")
    r.add_argument("--batch-tokens", type=O.positive_int, default=4096, help="tokens per forward (default %(default)s)")
    r.add_argument("--quiet", action="store_true", help="no progress bar")
    O.add_device_options(r)
    e = r.add_argument_group("distributed replay (--engine ray; pip install 'routescope[distributed]')")
    e.add_argument("--engine", choices=ENGINES, default="embedded", metavar="ENGINE",
                   help="one of %(choices)s (default %(default)s: this process; ray: the forwards on Ray actors, "
                        "RAY_ADDRESS or a local cluster)")
    e.add_argument("--workers", type=O.positive_int, default=2, help="Ray actors, each loading the checkpoint once")
    return r


# module that runs the command -> its parser, in the order `routescope --help` lists them
PARSERS = {"generate": generate, "tokenizer": tokenizer, "train": train, "compose": compose, "app": app,
           "import_": import_, "export": export, "routes": routes, "attribute": attribute, "report": report,
           "corpus": corpus, "importance": importance, "drift": drift,
           "replay": replay}


def add_all(sub: argparse._SubParsersAction) -> None:
    """Every command's parser, each recording the module that runs it (`command_module`) and `func`."""
    for module, add in PARSERS.items():
        add(sub).set_defaults(command_module=module, func=run_command)


def read_export_prompts(args: argparse.Namespace) -> None:
    """`routescope export`, before its module is imported: `args.prompt_pairs`, the (prompt_id,
    prompt) pairs of --prompt or --prompts FILE (analysis.inputs.prompts), so a bad prompt file is
    refused before torch loads. --engine ray reads its prompts on the cluster instead."""
    if args.engine != "ray":
        args.prompt_pairs = ([(str(k + 1), p) for k, p in enumerate(args.prompt)] if args.prompt
                             else read_prompt_file(args.prompts))


def check_routes_probes(args: argparse.Namespace) -> None:
    """`routescope routes`, before its module is imported: a --probes file that is not a regular file
    (a FIFO, a device) is refused at once, not after torch and the model load."""
    if args.probes:
        open_regular_file(args.probes, "probe file").close()


# what a command does before its module (and torch) is imported: refuse bad input at once
PREPARE = {"export": read_export_prompts, "routes": check_routes_probes}


def run_command(args: argparse.Namespace) -> int:
    """Run the parsed command: its PREPARE step, then import its module (by name, only now: most
    import torch) and call its `run(args)`. ValueErrors propagate (`cli.main` turns them into one line)."""
    prepare = PREPARE.get(args.command_module)
    if prepare is not None:
        prepare(args)
    return importlib.import_module(f"{__package__}.{args.command_module}").run(args)
