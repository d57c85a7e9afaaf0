import pytest

from tiny_models import TINY, tiny_model


@pytest.fixture(params=sorted(TINY))
def family_model(request):
    return request.param, tiny_model(request.param)
