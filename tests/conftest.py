import os
import signal

import pytest
import torch

# Tiny test models are fastest single-threaded, and a second thread only fights whatever else the
# machine runs (a training job, the app under test).
torch.set_num_threads(int(os.environ.get("ROUTESCOPE_TEST_THREADS", "1")))

from tiny_models import TINY, tiny_model


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


@pytest.fixture(params=sorted(TINY))
def family_model(request):
    return request.param, tiny_model(request.param)
