import os

import pytest
import torch

# Tiny test models are fastest single-threaded, and a second thread only fights whatever else the
# machine runs (a training job, the app under test).
torch.set_num_threads(int(os.environ.get("ROUTESCOPE_TEST_THREADS", "1")))

from tiny_models import TINY, tiny_model


@pytest.fixture(params=sorted(TINY))
def family_model(request):
    return request.param, tiny_model(request.param)
