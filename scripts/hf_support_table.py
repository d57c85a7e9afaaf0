"""Write the table of transformers MoE types in docs/huggingface.md (tests/analysis/test_hf_coverage.py runs every
check on each type; the table is its result, between the hf-support markers)."""
from __future__ import annotations

import sys
import tempfile
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "huggingface.md"  # the support table's page (the README links to it)
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "analysis")]


def main() -> None:
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    warnings.filterwarnings("ignore")
    from test_hf_coverage import BEGIN, END, support_table

    text = PAGE.read_text()
    with tempfile.TemporaryDirectory() as tmp:
        table = support_table(tmp)
    text = text[:text.index(BEGIN)] + table + text[text.index(END) + len(END):]
    tmp_out = PAGE.with_suffix(".md.tmp")
    tmp_out.write_text(text)
    tmp_out.replace(PAGE)
    print(f"{PAGE}: {table.count(chr(10)) - 3} model types")


if __name__ == "__main__":
    main()
