"""Test setup: the simulator unless a GPU run asks for the real device.

``NUMBA_ENABLE_CUDASIM`` must be set before numba is imported, so it is
decided here, first.  CI (no GPU) runs everything in the simulator; the GPU
run sets ``NUMBA_ENABLE_CUDASIM=0`` and adds ``-m gpu`` tests.
"""

import os

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

import pytest  # noqa: E402

from gemmlib import backend  # noqa: E402


def pytest_collection_modifyitems(config, items):
    if backend.gpu_present():
        return
    why = ("simulator mode (NUMBA_ENABLE_CUDASIM=1)" if backend.SIMULATOR
           else "no CUDA GPU on this machine")
    skip = pytest.mark.skip(reason=f"needs a GPU: {why}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def rng():
    import numpy as np

    return np.random.default_rng()
