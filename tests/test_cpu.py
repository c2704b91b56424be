"""gemmlib.cpu: every CPU loop version computes A @ B."""

import numpy as np
import pytest

from gemmlib import cpu

SHAPES = [(1, 1, 1), (3, 5, 7), (17, 9, 33), (70, 65, 130)]


def _pair(M, N, K, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.uniform(-1, 1, (M, K)).astype(np.float32),
            rng.uniform(-1, 1, (K, N)).astype(np.float32))


@pytest.mark.parametrize("name", list(cpu.LOOP_ORDERS) + ["tiled", "blas"])
@pytest.mark.parametrize("M,N,K", SHAPES)
def test_compiled_versions(name, M, N, K):
    fn = {"tiled": cpu.matmul_tiled, "blas": cpu.matmul_blas}.get(name) or cpu.LOOP_ORDERS[name]
    A, B = _pair(M, N, K)
    C = fn(A, B)
    assert C.shape == (M, N) and C.dtype == np.float32
    np.testing.assert_allclose(C, A.astype(np.float64) @ B, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("tile", [1, 4, 64])
def test_tiled_any_tile(tile):
    A, B = _pair(37, 29, 41)
    np.testing.assert_allclose(cpu.matmul_tiled(A, B, tile), A.astype(np.float64) @ B,
                               rtol=1e-4, atol=1e-4)


def test_python_loop():
    A, B = _pair(5, 4, 3)
    np.testing.assert_allclose(cpu.matmul_python(A, B), A.astype(np.float64) @ B,
                               rtol=1e-5, atol=1e-6)


def test_flops_and_benchmark():
    assert cpu.gemm_flops(2, 3, 4) == 48
    t = cpu.benchmark({"python": cpu.matmul_python, "ikj": cpu.matmul_ikj}, [8, 80],
                      repeat=1, min_time=0.001, python_max=8)
    assert [(x.method, x.size) for x in t] == [("python", 8), ("ikj", 8), ("ikj", 80)]
    assert all(x.seconds > 0 and x.gflops > 0 for x in t)
    assert isinstance(cpu.blas_name(), str)
