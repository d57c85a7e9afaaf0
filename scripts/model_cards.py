"""Rewrite each shipped checkpoint's card (checkpoints/*/README.md) from its records, as the trainer
writes it after training (core_models.training.trainer.model_card): training.json, config.json and the
storage dtype of model.safetensors. The machine line (cores, torch) is kept from the card it replaces:
it says where the run was made, not where the card is rewritten; so is the starting checkpoint's line
of a composition (its card is gone with it).

    .venv/bin/python scripts/model_cards.py
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from routescope.core_models.checkpoint import DTYPE_NAMES
from routescope.core_models.weights import read_header
from routescope.core_models.training.trainer import model_card

ROOT = Path(__file__).resolve().parents[1] / "checkpoints"
STORAGE = {name: str(dtype).removeprefix("torch.") for dtype, name in DTYPE_NAMES.items()}


def card(ck: Path) -> str:
    s = json.loads((ck / "training.json").read_text())
    config = json.loads((ck / "config.json").read_text())
    dtypes = {STORAGE[d] for _, d in read_header(ck / "model.safetensors").values() if STORAGE[d].startswith(("float", "bfloat"))}
    old = (ck / "README.md").read_text() if (ck / "README.md").is_file() else ""
    machine = re.search(r"^- wall time: \d+ s on (.+)$", old, re.M)
    init = re.search(r"^- initial weights: .+$", old, re.M)  # from the starting checkpoint's card, gone since
    return model_card(ck.name, s, config, " and ".join(sorted(dtypes)), machine.group(1) if machine else None,
                      init.group(0) + "\n" if init else None)


def main(root: Path = ROOT) -> int:
    for ck in sorted(d for d in root.iterdir() if (d / "training.json").is_file() and (d / "model.safetensors").is_file()):
        (ck / "README.md").write_text(card(ck))
        sys.stdout.write(f"wrote {ck / 'README.md'}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
