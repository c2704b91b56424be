"""Every registered kernel is right on small odd shapes (simulator) and on large
and random shapes (GPU)."""

import numpy as np
import pytest

import gemmlib
from gemmlib import backend
from gemmlib.backend import cuda, float32
from gemmlib.kernels import LADDER, SCALED, get

#: the rungs the unscaled checks below take (FP8 rungs: tests/test_wgmma_lowp.py)
UNSCALED = [n for n in LADDER if n not in SCALED]


def edge_shapes(spec):
    """1x1x1; primes, K past two k-tiles with a partial third (no further: each k-tile is
    a pass of every simulated thread); one past / one short of the tile with K below one
    k-tile.  (Tiny outputs with K = 1 beyond 1x1x1: test_properties' K = 1 family.)"""
    tm, tn = spec.tile
    return [(1, 1, 1), (37, 29, min(53, 2 * spec.k_tile + 5)), (tm + 1, tn - 1, 3)]


@pytest.mark.parametrize("name", UNSCALED)
def test_kernel_correct_on_odd_shapes(name):
    spec = get(name)
    if not backend.SIMULATOR and tuple(backend.device_info().compute_capability) < spec.min_cc:
        pytest.skip(f"{name} needs sm_{spec.min_cc[0]}{spec.min_cc[1]}+")
    report = gemmlib.verify(spec, edge_shapes(spec))
    assert report.ok and len(report.checks) == 3


@pytest.mark.parametrize("name", UNSCALED)
@pytest.mark.parametrize("shape", [(0, 5, 3), (4, 0, 3), (0, 0, 0)])
def test_empty_output_is_fine(name, shape):
    spec = get(name)
    M, N, K = shape
    A = backend.random_matrix((M, K), spec.dtype)
    B = backend.random_matrix((N, K) if spec.b_operand == "NK" else (K, N), spec.dtype)
    C = gemmlib.matmul(A, B, kernel=name, transpose_b=spec.b_operand == "NK")
    assert C.shape == (M, N)


@pytest.mark.parametrize("name", UNSCALED)
def test_k_zero_gives_zeros(name):
    spec = get(name)
    report = gemmlib.verify(spec, [(3, 5, 0)])  # NaN-poisoned out must become exactly 0
    assert report.checks[0].rel_error == 0.0


def test_verify_raises_naming_kernel_shape_and_error():
    spec = get("coalesced")

    @cuda.jit  # kernels name `cuda` as a global: the simulator swaps it
    def forgets_last_column(A, B, C):  # a wrong kernel: never writes column N-1
        row, col = cuda.grid(2)
        if row < C.shape[0] and col < C.shape[1] - 1:
            acc = float32(0.0)
            for k in range(A.shape[1]):
                acc += A[row, k] * B[k, col]
            C[row, col] = acc

    import dataclasses

    bad = dataclasses.replace(spec, name="forgets_last_column", kernel=forgets_last_column,
                              grid=lambda M, N, K: (-(-M // 32), -(-N // 32), 1))
    with pytest.raises(AssertionError, match=r"forgets_last_column.*\n.*5x\s*6\s*x7.*unwritten"):
        gemmlib.verify(bad, [(5, 6, 7)])


def test_verify_report_lists_every_check():
    r = gemmlib.verify("naive", [(3, 4, 5), (1, 2, 3)])
    assert [c.shape for c in r.checks] == [(3, 4, 5), (1, 2, 3)]
    assert "naive" in str(r) and r.ok


# --------------------------------------------------------------------------- GPU


GPU_SHAPES = [(1, 1, 1), (127, 129, 1), (1000, 1000, 1000), (4095, 3073, 2047),
              (2048, 2048, 2048), (3, 8191, 5), (8191, 3, 517), (1025, 513, 4097)]


@pytest.mark.gpu
@pytest.mark.parametrize("name", UNSCALED)
def test_kernel_correct_on_large_shapes_gpu(name):
    spec = get(name)
    if tuple(backend.device_info().compute_capability) < spec.min_cc:
        pytest.skip(f"{name} needs a newer GPU")
    assert gemmlib.verify(spec, GPU_SHAPES).ok


@pytest.mark.gpu
@pytest.mark.parametrize("name", UNSCALED)
def test_kernel_correct_on_random_shapes_gpu(name):
    rng = np.random.default_rng()
    shapes = [tuple(int(x) for x in rng.integers(1, 1500, size=3)) for _ in range(12)]
    spec = get(name)
    if tuple(backend.device_info().compute_capability) < spec.min_cc:
        pytest.skip(f"{name} needs a newer GPU")
    assert gemmlib.verify(spec, shapes).ok, shapes


@pytest.mark.gpu
def test_cublas_reference_is_true_fp32_gpu():
    """If cuBLAS silently used TF32 its error would be ~1e-4, not ~1e-6."""
    from gemmlib.verify import tolerance

    A = backend.random_matrix((1024, 1024))
    B = backend.random_matrix((1024, 1024))
    err = backend.relative_error(backend.cublas_matmul(A, B), backend.reference(A, B))
    assert err < tolerance("float32", 1024), err
