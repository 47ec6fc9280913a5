from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# Offline by contract: shipped models must load with no hub access.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).parent))

# Timeouts in tests scale with this factor instead of fixed sleeps (slow shared machines).
TIME_FACTOR = float(os.environ.get("VOXLINE_TEST_TIME_FACTOR", "1.0"))


@pytest.fixture(scope="module")
def one_torch_thread():
    """Tiny models are all dispatch overhead: a second OpenMP thread on a shared 2-core
    machine only adds barrier waits. Use with `pytest.mark.usefixtures`."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
