"""The suite's shared fixtures, and which tests the fast default runs.

Two suites, one marker:
- `pytest` with no path, `-k` or `-m` runs the FAST set (unit tests, the representative HF types,
  one AppTest per view; a few minutes) and deselects every test marked `slow` (pytest prints
  "N deselected").
- `pytest --full` (what `scripts/test` and `.ci/run` pass) runs everything.
- A path, `-k` or `-m` given on the command line selects on its own: `pytest tests/e2e/test_browser.py`
  or `-k zoo` runs what it names, slow or not; `-m slow` runs only the full-only tests, `-m "not slow"`
  the fast set. `--fast` applies the fast filter to named paths too.

`slow` is set here, in one place, for whole groups (FULL_ONLY below, the `e2e` marker, Hypothesis
tests), and by `@pytest.mark.slow` on single tests in their modules.
"""
import os
import signal
from pathlib import Path

import pytest
import torch
from streamlit.testing.v1 import AppTest

# Tiny test models are fastest single-threaded, and a second thread only fights whatever else the
# machine runs (a training job, the app under test).
torch.set_num_threads(int(os.environ.get("ROUTESCOPE_TEST_THREADS", "1")))

from tiny_models import TINY, tiny_model

TESTS = Path(__file__).resolve().parent
# Full suite only, by module (paths relative to tests/) or by test function ("path::name", every
# parameter), and why: times from `--durations=0` on 2 cores at a load of about 2. With the AppTests
# below they held about 180 s of the 272 s that everything else took; the fast set then ran in 148 s.
# (Ray, the venv builds and other heavy single tests carry @pytest.mark.slow in their own modules.)
FULL_ONLY = {
    "app/test_app_command.py": "starts `routescope app` (a Streamlit server) per case: 13 s",
    "hostile/test_interrupts_and_limits.py::test_arguments_that_are_not_utf8_get_one_line":
        "a CLI process per command: 23 s",
    "hostile/test_interrupts_and_limits.py::test_a_fifo_with_no_writer_is_refused_at_once": "CLI processes: 5 s",
    "hostile/test_interrupts_and_limits.py::test_an_interrupted_export_says_so_and_leaves_no_temporary_file":
        "signals a CLI process: 5 s",
    "hostile/test_interrupts_and_limits.py::test_a_killed_exports_temporaries_are_removed_by_the_next_run":
        "kills a CLI process: 4 s",
    "hostile/test_interrupts_and_limits.py::test_a_300mb_single_line_prompt_file_is_refused_with_flat_memory":
        "writes 300 MB: 2 s",
    "hostile/test_interrupts_and_limits.py::test_a_line_over_the_line_limit_is_refused_after_reading_only_that_much":
        "a CLI process: 2 s",
    "hostile/test_interrupts_and_limits.py::test_report_replaces_its_page_and_removes_a_killed_runs_temporary":
        "kills a CLI process",
    "hostile/test_hostile_datasets.py::test_a_parquet_cell_too_large_is_refused_from_metadata": "writes 300 MB: 14 s",
    "hostile/test_hostile_datasets.py::test_sigterm_while_the_set_is_written_leaves_the_earlier_set":
        "signals a CLI process: 4 s",
    "hostile/test_cli_inputs.py::test_streamed_routes_equal_probe_by_probe_routes": "routes every probe twice: 9 s",
    "hostile/test_cli_inputs.py::test_huge_thread_count_is_refused_not_a_crash": "a CLI process: 2 s",
    "hostile/test_csv_injection.py::test_cli_export_csv_with_hostile_prompts_and_ids": "a CLI process: 4 s",
    "models/test_shipped.py::test_reported_validation_loss_is_reproduced": "every shipped checkpoint's validation: 12 s",
    "models/test_paper_scale.py::test_readme_table_is_up_to_date": "every paper-scale model on meta: 3 s",
    "models/test_paper_scale.py::test_papaformer_table_2_rows_are_present_with_the_papers_totals": "3 s",
    "test_layout.py::test_the_readme_namespace_example_runs": "a fresh interpreter imports everything: 7 s",
    "test_layout.py::test_models_load_and_run_without_the_training_code": "a fresh interpreter: 6 s",
    "test_layout.py::test_no_module_is_imported_under_a_second_name": "a fresh interpreter: 5 s",
    "test_layout.py::test_a_folder_imported_by_its_own_name_is_refused": "a fresh interpreter: 3 s",
    "training/test_tokenizer.py::test_full_size_vocabulary": "trains a full-size tokenizer: 5 s",
    "training/test_corpus.py::test_validation_split_is_fixed_and_disjoint_from_train": "generates the corpus: 3 s",
}
# Tests that drive the explorer with Streamlit's AppTest run in the full suite, except these: one per
# view (and the family page, the HF model and a plugin family's view), each a function, every parameter
APP_FAST = {
    "app/test_app.py::test_first_load_is_usable",  # Generation, then Routing
    "app/test_app.py::test_every_view_renders",  # Routing, Ablation diff, Attribution, Table 6, Export
    "app/test_corpus_view.py::test_uploaded_tsv_per_label_shares_flags_specialisation_and_comparison",
    "app/test_experts_view.py::test_sweep_from_the_view_equals_the_analysis",
    "app/test_app_replay.py::test_a_trace_replayed_from_the_view_equals_the_analysis",
    "app/test_app_drift.py::test_a_run_directory_shows_the_analysis_numbers",
    "analysis/test_hf.py::test_the_app_draws_routes_and_the_ablation_diff_of_an_hf_model",
    "analysis/test_toy_family.py::test_a_view_of_its_own_is_computed_and_drawn_by_the_app",
}


def pytest_addoption(parser):
    group = parser.getgroup("routescope")
    group.addoption("--full", action="store_true",
                    help="run the full suite: the tests marked slow too (scripts/test passes it)")
    group.addoption("--fast", action="store_true",
                    help="deselect the tests marked slow even where paths, -k or -m are given")


def _drives_app(func, module, depth: int = 0) -> bool:
    """Whether `func` (a test, a fixture or a helper of its module) starts Streamlit's AppTest, directly
    or through a function of its module or of tests/app_driver.py (read from the names its code uses)."""
    if depth > 4 or not hasattr(func, "__code__"):
        return False
    codes, names = [func.__code__], set()
    while codes:  # nested code too: lambdas, comprehensions
        c = codes.pop()
        names.update(c.co_names)
        codes += [k for k in c.co_consts if hasattr(k, "co_names")]
    for name in names:
        obj = getattr(module, name, None)
        if obj is AppTest:
            return True
        if callable(obj) and getattr(obj, "__module__", None) in (module.__name__, "app_driver") and obj is not func \
                and _drives_app(getattr(obj, "__wrapped__", obj), module, depth + 1):
            return True
    return False


def _uses_apptest(item) -> bool:
    module = getattr(item, "module", None)
    if module is None or not hasattr(item, "function"):
        return False
    funcs = [item.function]
    for defs in item._fixtureinfo.name2fixturedefs.values():  # fixtures defined in the test's module
        funcs += [d.func for d in defs if getattr(d.func, "__module__", None) == module.__name__]
    return any(_drives_app(f, module) for f in funcs)


def _rel(item) -> str:
    return Path(str(item.path)).resolve().relative_to(TESTS).as_posix() if item.path else ""


def _full_only(item) -> str | None:
    """Why `item` belongs to the full suite only, or None."""
    rel = _rel(item)
    name = f"{rel}::{getattr(item, 'originalname', item.name)}"
    for key in (rel, name):
        if key in FULL_ONLY:
            return FULL_ONLY[key]
    if item.get_closest_marker("e2e"):
        return "drives a real browser"
    if getattr(getattr(item, "obj", None), "is_hypothesis_test", False):
        return "Hypothesis: many generated examples"
    if name not in APP_FAST and _uses_apptest(item):
        return "AppTest beyond the one per view"
    return None


def fast_run(config) -> bool:
    """True where the fast filter applies: --fast, or no --full and nothing selected by hand."""
    if config.getoption("--fast"):
        return True
    if config.getoption("--full"):
        return False
    chose = config.args_source != pytest.Config.ArgsSource.TESTPATHS  # paths given on the command line
    return not (chose or config.option.keyword or config.option.markexpr)


@pytest.hookimpl(tryfirst=True)  # before `-m` reads the markers
def pytest_collection_modifyitems(config, items):
    for item in items:
        if _full_only(item) and not item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.slow)
    if config.args_source == pytest.Config.ArgsSource.TESTPATHS and not config.option.keyword:
        seen = {f"{_rel(i)}::{getattr(i, 'originalname', i.name)}" for i in items} | {_rel(i) for i in items}
        config._routescope_stale = sorted((set(FULL_ONLY) | APP_FAST) - seen)
    if not fast_run(config):
        return
    slow = [i for i in items if i.get_closest_marker("slow")]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [i for i in items if not i.get_closest_marker("slow")]
        config._routescope_deselected = len(slow)


def pytest_terminal_summary(terminalreporter, config):
    for key in getattr(config, "_routescope_stale", []):  # a test renamed or removed: say so, fail nothing
        terminalreporter.write_line(f"tests/conftest.py names {key}, which no collected test is", yellow=True)
    n = getattr(config, "_routescope_deselected", 0)
    if n:
        terminalreporter.write_line(f"fast set: {n} full-only tests (marked slow) deselected; "
                                    "`pytest --full` or `bash scripts/test` runs them")


@pytest.fixture(autouse=True, scope="session")
def _digest_cache(tmp_path_factory):
    """The export's weight-digest cache (analysis.export.batch.cached_sha256) in a temporary file, for
    this process and every command it starts: the suite leaves nothing in the user's ~/.cache."""
    os.environ["ROUTESCOPE_DIGEST_CACHE"] = str(tmp_path_factory.mktemp("digests") / "digests.json")


def _interrupt(signum, _frame):
    raise KeyboardInterrupt(f"signal {signum}")


# A run stopped with SIGTERM (a CI timeout) unwinds like Ctrl-C, so every fixture's finally (the
# app's process group, procs.running) still runs; Python's default would end at once.
signal.signal(signal.SIGTERM, _interrupt)


CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-quic",
                 "--no-first-run", "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="session")
def browser():
    """One Debian Chromium (Playwright) for every browser test of the run (tests/e2e and the page
    safety test); each test opens its own pages. Playwright's sync API allows one of these per thread."""
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: apt-get install chromium (scripts/test does)")
    from playwright.sync_api import sync_playwright  # optional heavy dependency: browser tests only
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture(params=sorted(TINY))
def family_model(request):
    return request.param, tiny_model(request.param)
