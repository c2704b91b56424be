"""gemmlib._simulator: the simulator's block scheduler waits on a condition instead of
spinning, with numba's rules -- threads leave ``syncthreads`` together, an exception in
one thread aborts the block and is raised naming the thread."""

import os
import subprocess
import sys

import numpy as np
import pytest

from gemmlib import backend
from gemmlib.backend import cuda, float32

pytestmark = pytest.mark.skipif(not backend.SIMULATOR, reason="the simulator's scheduler")


def test_installed_in_the_simulator():
    from gemmlib import _simulator
    from numba.cuda.simulator import kernel

    assert _simulator._installed
    assert kernel.BlockManager.run.__module__ == "gemmlib._simulator"


@cuda.jit
def _reverse_in_shared(x, y, counts):
    i = cuda.threadIdx.x
    s = cuda.shared.array(128, float32)
    for r in range(3):                     # several phases: write, sync, read, sync
        s[i] = x[i] + r
        cuda.syncthreads()
        y[r, i] = s[cuda.blockDim.x - 1 - i]
        cuda.syncthreads()
    n = cuda.syncthreads_count(i % 3 == 0)
    if i == 0:
        counts[cuda.blockIdx.x] = n


def test_syncthreads_orders_every_phase():
    x = np.arange(128, dtype=np.float32)
    y = np.zeros((3, 128), np.float32)
    counts = np.zeros(2, np.int64)
    _reverse_in_shared[2, 128](x, y, counts)
    for r in range(3):
        np.testing.assert_array_equal(y[r], x[::-1] + r)
    assert list(counts) == [43, 43]


@cuda.jit
def _early_exit(y, z):
    i = cuda.threadIdx.x
    if i >= 40:
        return                              # finished threads do not hold the others back
    y[i] = i
    cuda.syncthreads()
    z[i] = y[i] + y[39 - i]


def _run_early_exit():
    y, z = np.zeros(64, np.float32), np.zeros(64, np.float32)
    _early_exit[1, 64](y, z)
    return z


def test_threads_that_finish_early_release_the_rest():
    z = _run_early_exit()
    assert list(z[:40]) == [39.0] * 40 and not z[40:].any()


@cuda.jit
def _fails_in_one_thread(y):
    i = cuda.threadIdx.x
    if i == 5:
        raise ValueError("boom")
    cuda.syncthreads()
    y[i] = 1.0


def test_an_exception_is_raised_naming_the_thread_and_nothing_hangs():
    with pytest.raises(ValueError, match=r"tid=\[5, 0, 0\] ctaid=\[0, 0, 0\]: boom"):
        _fails_in_one_thread[1, 64](np.zeros(64, np.float32))
    assert _run_early_exit()[0] == 39.0   # the simulator still launches afterwards


def test_numbas_scheduler_on_request():
    code = ("import gemmlib.backend, gemmlib._simulator as s; "
            "from numba.cuda.simulator import kernel as k; "
            "print(s._installed, k.BlockManager.run.__module__)")
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1", GEMMLIB_SIM_SCHEDULER="numba")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.stdout.split() == ["False", "numba.cuda.simulator.kernel"], out.stderr[-2000:]
