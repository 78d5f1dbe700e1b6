import numpy as np
import pytest
import torch

from eqvit.groups import get_group

PLANAR = ["C1", "C2", "C3", "C4", "C5", "C6", "C8", "D1", "D2", "D3", "D4", "D5", "D6", "D8"]
PLATONIC = ["T", "O", "I"]
ALL_GROUPS = PLANAR + PLATONIC


@pytest.fixture(autouse=True)
def _deterministic():
    torch.manual_seed(0)
    np.random.seed(0)


@pytest.fixture(params=ALL_GROUPS)
def group(request):
    return get_group(request.param)


@pytest.fixture(autouse=True, scope="session")
def _single_thread():
    """One intra-op thread: tiny models on 2 shared cores run ~10x faster without thread contention."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
