"""cp.async twins and the async_copy / double_buffer rungs (simulator; GPU tests marked gpu)."""

import dataclasses
import os
import subprocess
import sys

import numpy as np
import pytest

import gemmlib
from gemmlib import backend
from gemmlib.backend import cuda, float32
from gemmlib.intrinsics import async_copy as ac
from gemmlib.kernels import async_copy as k_async
from gemmlib.kernels import double_buffer as k_double
from gemmlib.spec import ConstraintError

SMALL = dict(BM=16, BN=16, BK=4, copy_threads=(8, 4), mma_threads=(4, 8))
ODD = [(1, 1, 1), (17, 19, 5), (33, 7, 13), (5, 40, 9), (16, 16, 8), (20, 3, 0), (3, 18, 17)]

sim_only = pytest.mark.skipif(not backend.SIMULATOR, reason="tests the simulator twins")


# -- the simulator model of cp.async ------------------------------------------

@sim_only
def test_copy_lands_only_at_wait():
    """A read before the wait sees the old value: missing waits fail in CI too."""
    cp4, commit, wait_all = ac.cp_async4, ac.cp_async_commit, ac.cp_async_wait_all

    @cuda.jit
    def kern(src, out):
        s = cuda.shared.array(8, float32)
        t = cuda.threadIdx.x
        s[t] = float32(-1.0)
        cuda.syncthreads()
        cp4(s, t, src, 0, t, 4 if t < 6 else 0)   # the last two: zero-fill
        commit()
        out[0, t] = s[t]                           # too early: stale
        wait_all()
        cuda.syncthreads()
        out[1, t] = s[t]

    src = np.arange(1, 9, dtype=np.float32).reshape(1, 8)
    out = np.zeros((2, 8), dtype=np.float32)
    kern[1, 8](src, out)
    assert (out[0] == -1).all()
    assert out[1].tolist() == [1, 2, 3, 4, 5, 6, 0, 0]


@sim_only
def test_wait_one_leaves_newest_group_in_flight_and_uncommitted_copies_wait():
    cp4, commit = ac.cp_async4, ac.cp_async_commit

    @cuda.jit
    def kern(src, out):
        s = cuda.shared.array(3, float32)
        s[0] = float32(-1.0)
        s[1] = float32(-1.0)
        s[2] = float32(-1.0)
        cp4(s, 0, src, 0, 0, 4)
        commit()
        cp4(s, 1, src, 0, 1, 4)
        commit()
        cp4(s, 2, src, 0, 2, 4)            # never committed: no wait covers it
        ac.cp_async_wait_one()
        out[0, 0] = s[0]
        out[0, 1] = s[1]
        ac.cp_async_wait_all()
        out[1, 0] = s[0]
        out[1, 1] = s[1]
        out[1, 2] = s[2]
        commit()
        ac.cp_async_wait_all()              # leave nothing behind for the next test

    src = np.array([[5.0, 6.0, 7.0]], dtype=np.float32)
    out = np.zeros((2, 3), dtype=np.float32)
    kern[1, 1](src, out)
    assert out[0, :2].tolist() == [5.0, -1.0]
    assert out[1].tolist() == [5.0, 6.0, -1.0]


@sim_only
def test_cp_async16_zero_fill_and_alignment():
    dst = np.full(8, -1.0, dtype=np.float32)
    src = np.arange(8, dtype=np.float32).reshape(1, 8)
    ac.cp_async16_py(dst, 4, src, 0, 4, 8)      # two floats copied, two zero-filled
    ac.cp_async_commit_py()
    ac.cp_async_wait_all_py()
    assert dst.tolist() == [-1, -1, -1, -1, 4, 5, 0, 0]
    with pytest.raises(ac.AsyncCopyError):
        ac.cp_async16_py(dst, 2, src, 0, 4, 16)
    with pytest.raises(ac.AsyncCopyError):
        ac.cp_async4_py(dst, 0, src, 0, 0, 3)
    ac.cp_async_commit_py()
    ac.cp_async_wait_all_py()


def test_ops_and_sync_namespace():
    assert ac.ops("sync") is ac.SYNC and ac.ops("async") is ac.ASYNC
    with pytest.raises(ValueError):
        ac.ops("tma")


# -- the kernels ----------------------------------------------------------------

@pytest.mark.parametrize("copy", ["async", "sync"])
@pytest.mark.parametrize("mod", [k_async, k_double], ids=["async_copy", "double_buffer"])
def test_small_tile_odd_shapes(mod, copy):
    gemmlib.verify(mod.build(copy=copy, **SMALL), ODD, seed=3)


def test_double_buffer_rolled_loop():
    gemmlib.verify(k_double.build(unroll=False, **SMALL), ODD[:5], seed=8)


def test_double_buffer_other_small_config():
    spec = k_double.build(BM=8, BN=24, BK=6, copy_threads=(4, 6), mma_threads=(4, 6), pad=2)
    gemmlib.verify(spec, [(9, 25, 13), (8, 24, 6), (2, 50, 19)], seed=4)


def test_double_buffer_refuses_odd_bk():
    with pytest.raises(ValueError):
        k_double.build(BK=5)


@pytest.mark.parametrize("name", ["async_copy", "double_buffer"])
def test_default_spec_one_shape(name):
    spec = gemmlib.get_kernel(name)
    assert spec.b_operand == "NK" and spec.min_cc == (8, 0) and spec.threads == 256
    assert any("cp\\.async" in p for p in spec.ptx_must)
    gemmlib.verify(name, [(37, 29, 13)], seed=5)


@pytest.mark.parametrize("name", ["async_copy", "double_buffer"])
def test_sm75_refused_with_a_reason_and_sync_build_accepted(name):
    t4 = dataclasses.replace(backend.device_info(), compute_capability=(7, 5), name="T4")
    with pytest.raises(ConstraintError, match="compute capability"):
        gemmlib.get_kernel(name).check(64, 64, 64, t4)
    sync = gemmlib.kernels.module(name).build(copy="sync")
    sync.check(64, 64, 64, t4)
    assert sync.min_cc < (7, 5) and not sync.ptx_must


def test_double_buffer_uses_two_buffers():
    a, d = gemmlib.get_kernel("async_copy"), gemmlib.get_kernel("double_buffer")
    assert d.shared_bytes == 2 * a.shared_bytes


def test_sync_fallbacks_compile_for_sm75():
    """The real compiler, in a subprocess (this session runs the simulator)."""
    code = (
        "from gemmlib.ptx import compile_ptx, problems\n"
        "from gemmlib.kernels import async_copy, double_buffer\n"
        "for m in (async_copy, double_buffer):\n"
        "    s = m.build(copy='sync')\n"
        "    ptx = compile_ptx(s, (7, 5))\n"
        "    assert not problems(s, ptx), problems(s, ptx)\n"
        "    assert 'cp.async' not in ptx\n"
        "print('ok')\n")
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-2000:]


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["layout_nt", "async_copy", "double_buffer"])
def test_gpu_odd_shapes(name):
    shapes = [(1, 1, 1), (127, 129, 7), (129, 255, 9), (1000, 999, 1001), (257, 3, 4096),
              (3, 300, 0), (128, 128, 8), (513, 1025, 17)]
    gemmlib.verify(name, shapes, seed=6)
