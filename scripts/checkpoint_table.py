"""Write checkpoints/README.md from what the training pipeline measured (training.json of each
checkpoint): validation loss per domain, parameters, tokens, wall time. Nothing is typed by hand."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from routescope.core_models.checkpoint import checkpoint_config
from routescope.core_models.registry import build_model

ROOT = Path(__file__).resolve().parents[1] / "checkpoints"
ORDER = ["llama-dense", "pagmlp", "path-story", "path-math", "papaformer-share-linear", "papaformer-gumbel-v1",
         "papaformer-gumbel-v2", "moep", "moep-swiglu", "pgpt", "wiola-tiny", "mixtral-tiny", "olmoe-tiny"]
BASELINE = "llama-dense"  # the dense model every parallel one is compared with
# llama-dense trained for the parallel models' 600 steps (no dropout, like them): the equal-token comparison
EQUAL = "llama-dense-600"
EQUAL_RECORD = f"experiments/{EQUAL}.training.json"
TOKEN_GAP = 0.10  # token counts further apart than this are stated next to a comparison
GOAL = 0.15  # issue 12: every parallel model within 15% of the baseline's validation loss, per domain
MOE_BASELINE = "moep"  # routed models with its active parameters per token (within 2%) are compared with it
ROUTES_BLOCK = "<!-- routes-table:start -->"  # scripts/routes_table.py owns the README from here on; kept as is


def _tokens_note(tokens: int, other: int) -> str:
    return "" if abs(tokens / other - 1) <= TOKEN_GAP else f" ({tokens / other:.2f}x its tokens)"


def _runs(root: Path) -> str:
    """The run directories (`routescope train --snapshots`: run.json, step-NNNN snapshots), each with its
    snapshots' steps and validation losses, for the Drift view (docs/drift.md)."""
    lines = []
    for d in sorted(p for p in root.iterdir() if (p / "run.json").is_file()):
        s = json.loads((d / "run.json").read_text())
        val = {h["step"]: h for h in s["history"]}
        size = sum(f.stat().st_size for f in d.rglob("*") if f.is_file()) / 2**20
        losses = {n: " / ".join(f"{val[int(n[5:])]['val_' + k]:.3f}" for k in s["val_loss"]) for n in s["snapshots"]}
        steps = ", ".join(f"{int(n[5:])} ({losses[n]})" for n in s["snapshots"])
        lines.append(f"- [{d.name}]({d.name}/README.md): `{s['preset']}` trained with {len(s['snapshots'])} snapshots "
                     f"kept along the way, {size:.1f} MB; step (validation loss {' / '.join(s['val_loss'])}): {steps}")
    if not lines:
        return ""
    return ("\nRuns with their checkpoints kept along the way (`routescope train --snapshots`; the Drift view and "
            "`routescope drift` read them, docs/drift.md):\n\n" + "\n".join(lines) + "\n")


def main(root: Path = ROOT) -> int:
    rows = []
    base = json.loads((root / BASELINE / "training.json").read_text())["val_loss"] \
        if (root / BASELINE / "training.json").is_file() else None
    base_tokens = json.loads((root / BASELINE / "training.json").read_text())["tokens"] if base else None
    equal = json.loads((root / EQUAL_RECORD).read_text()) if (root / EQUAL_RECORD).is_file() else None
    moe = json.loads((root / MOE_BASELINE / "training.json").read_text()) \
        if (root / MOE_BASELINE / "training.json").is_file() else None
    names = sorted((d.name for d in root.iterdir() if (d / "training.json").is_file()),
                   key=lambda n: (ORDER.index(n) if n in ORDER else len(ORDER), n))
    for name in names:
        s = json.loads((root / name / "training.json").read_text())
        config = checkpoint_config(root / name)
        family = config.label
        init = s["train"].get("init_from")
        parallel = bool(build_model(config, device="meta").routing_layers())  # not the dense ones
        vs = vs_equal = ""
        if parallel and base:
            gaps = [s["val_loss"][d] / base[d] - 1 for d in ("story", "math")]
            vs = (" / ".join(f"{g:+.1%}" for g in gaps) + (" ✓" if max(gaps) <= GOAL else " ✗")
                  + _tokens_note(s["tokens"], base_tokens))
        if parallel and equal:
            vs_equal = " / ".join(f"{s['val_loss'][d] / equal['val_loss'][d] - 1:+.1%}" for d in ("story", "math")) \
                + _tokens_note(s["tokens"], equal["tokens"])
        vs_moe = ""
        if parallel and moe and name != MOE_BASELINE and abs(s["params_active"] / moe["params_active"] - 1) <= 0.02:
            vs_moe = " / ".join(f"{s['val_loss'][d] / moe['val_loss'][d] - 1:+.1%}" for d in ("story", "math"))
        rows.append(f"| [{name}]({name}/README.md) | {family} | {s['val_loss']['story']:.3f} | {s['val_loss']['math']:.3f} "
                    f"| {vs} | {vs_equal} | {vs_moe} | {s['params_total']:,} | {s['params_active']:,} | {s['steps']} | {s['tokens']:,} "
                    f"| {s['wall_seconds'] / 60:.1f} | {'composed from path-story + path-math' if init else ''} "
                    f"| {f'[report]({name}/report.html)' if (root / name / 'report.html').is_file() else ''} |")
    size = sum(f.stat().st_size for f in root.rglob("*") if f.is_file()) / 2**20
    text = f"""# Shipped checkpoints

Trained on this project's synthetic corpora (`routescope.corpora.corpus`: TinyStories-like
stories and OpenMathInstruct-1-like math) with `scripts/train_all.sh` on a 2-core CPU machine.
Validation: the fixed validation split of each domain (cross-entropy in nats per token, the same
tokens for every model). Each directory's README.md has the exact command and training details.
Total size: {size:.1f} MB. This table is written by `scripts/checkpoint_table.py` from each
checkpoint's `training.json`.

"vs {BASELINE}": each parallel model's validation loss relative to {BASELINE}'s, story / math;
✓ when both are within {GOAL:.0%} (the goal of issue 12, on the same validation tokens), with how many
times {BASELINE}'s training tokens the model saw: a ✓ from more tokens is not a win at equal cost.
"vs {EQUAL}, equal tokens": the same against {BASELINE} trained for 600 steps without dropout, like the
compositions, pgpt and wiola-tiny (`{EQUAL_RECORD}`, weights not shipped); a token ratio is
given where the counts still differ. The PaPaformer compositions saw their paths' tokens before
that (path-story, path-math). More: `experiments/parallel-quality.md`. {BASELINE} and pagmlp train the
same way (300 steps, seed 0, dropout 0.1 on every block's FFN output, as PAGMLP §4 trains PAGMLP and its
SwiGLU baseline); the other models train without dropout. Weights are stored in float16.

"vs {MOE_BASELINE}": routed models with {MOE_BASELINE}'s active parameters per token (within 2%), story / math:
the standard MoE examples (`mixtral-tiny`, `olmoe-tiny`: Hugging Face transformers' own classes, with
their load-balancing loss) at the same steps and tokens as {MOE_BASELINE}.

| checkpoint | family | val loss story | val loss math | vs {BASELINE} | vs {EQUAL}, equal tokens | vs {MOE_BASELINE} | params | active/token | steps | tokens | minutes | note | routing report |
|---|---|---|---|---|---|---|---|---|---|---|---|---|---|
""" + "\n".join(rows) + "\n" + _runs(root)
    old = (root / "README.md").read_text() if (root / "README.md").is_file() else ""
    if ROUTES_BLOCK in old:
        text += "\n" + old[old.index(ROUTES_BLOCK):]
    (root / "README.md").write_text(text)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
