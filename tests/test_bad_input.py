"""Bad input gets a clear error, raised before anything is launched."""

import dataclasses

import numpy as np
import pytest

import gemmlib
from gemmlib import backend
from gemmlib.kernels import get
from gemmlib.spec import ConstraintError


def f32(*shape):
    return np.random.default_rng().uniform(-1, 1, shape).astype(np.float32)


@pytest.mark.parametrize("A, B, match", [
    (f32(3, 4), f32(5, 6), r"inner dimensions differ: A is 3x4 and B is 5x6"),
    (f32(4), f32(4, 2), r"matrices or stacks of matrices: A has shape \(4,\)"),
    (f32(2, 2), f32(2, 3, 2), r"inner dimensions differ: A has shape \(2, 2\) and B "
                              r"\(2, 3, 2\)"),
])
def test_wrong_shapes(A, B, match):
    with pytest.raises(ValueError, match=match):
        gemmlib.matmul(A, B, kernel="naive")


@pytest.mark.parametrize("dtype", [np.float64, np.float16, np.int32])
def test_wrong_dtype_is_named_with_the_fix(dtype):
    A = f32(3, 4).astype(dtype)
    with pytest.raises(TypeError, match=rf"A has dtype {np.dtype(dtype)}.*computes in float32.*astype"):
        gemmlib.matmul(A, f32(4, 2), kernel="naive")


def test_not_an_array():
    with pytest.raises(TypeError, match=r"NumPy array.*got list"):
        gemmlib.matmul([[1.0]], f32(1, 1), kernel="naive")


def test_out_wrong_shape():
    with pytest.raises(ValueError, match=r"out has shape \(3, 3\), but A @ B has shape \(3, 2\)"):
        gemmlib.matmul(f32(3, 4), f32(4, 2), out=np.empty((3, 3), np.float32), kernel="naive")


def test_out_wrong_dtype():
    with pytest.raises(TypeError, match=r"out has dtype float64"):
        gemmlib.matmul(f32(3, 4), f32(4, 2), out=np.empty((3, 2)), kernel="naive")


def test_out_not_contiguous():
    out = np.empty((2, 3), np.float32).T
    with pytest.raises(ValueError, match=r"out must be C-contiguous"):
        gemmlib.matmul(f32(3, 4), f32(4, 2), out=out, kernel="naive")


def test_out_aliasing_an_input():
    A = f32(4, 4)
    with pytest.raises(ValueError, match=r"out shares memory with A"):
        gemmlib.matmul(A, f32(4, 4), out=A, kernel="naive")


def test_host_views_are_copied_not_refused():
    """Host (NumPy) operands are copied to the device anyway, so any strides work."""
    A, B = f32(6, 5), f32(7, 6)
    C = gemmlib.matmul(A.T, B.T, kernel="coalesced")  # (5x6) @ (6x7)
    np.testing.assert_allclose(C, A.T.astype(np.float64) @ B.T, rtol=1e-5, atol=1e-5)


def test_unknown_kernel():
    with pytest.raises(KeyError, match=r"unknown kernel 'fastest'.*naive"):
        gemmlib.matmul(f32(2, 2), f32(2, 2), kernel="fastest")


def test_transpose_b_is_an_alias_on_every_rung():
    """B given as (N, K): a rung that reads (K, N) gets a row-major copy."""
    A, W = f32(2, 3), f32(4, 3)
    C = gemmlib.matmul(A, W, kernel="naive", transpose_b=True)
    np.testing.assert_allclose(C, A.astype(np.float64) @ W.T, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match=r"inner dimensions differ: A is 2x3 and B is 5x4"):
        gemmlib.matmul(A, f32(4, 5), transpose_b=True)


def test_too_many_threads_is_a_constraint_error():
    from gemmlib.kernels import shared

    spec = shared.build(TILE=64)  # 64 x 64 = 4096 threads per block
    with pytest.raises(ConstraintError, match=r"threads per block.*4096 threads > 1024"):
        gemmlib.matmul(f32(8, 8), f32(8, 8), kernel=spec)


def test_too_much_shared_memory_is_a_constraint_error():
    spec = dataclasses.replace(get("shared"), shared_bytes=1 << 20)
    with pytest.raises(ConstraintError, match=r"shared memory per block.*1048576 bytes"):
        gemmlib.matmul(f32(8, 8), f32(8, 8), kernel=spec)


def test_gpu_too_old_is_a_constraint_error():
    spec = dataclasses.replace(get("naive"), min_cc=(99, 0))
    with pytest.raises(ConstraintError, match=r"compute capability.*needs sm_990\+"):
        gemmlib.matmul(f32(8, 8), f32(8, 8), kernel=spec)


def test_grid_too_large_is_a_constraint_error():
    # Zero-stride views: shape checks see 2.1 million rows, no memory is used.
    A = np.broadcast_to(np.float32(1), (2_100_000, 1))
    B = np.broadcast_to(np.float32(1), (1, 1))
    with pytest.raises(ConstraintError, match=r"grid size"):
        gemmlib.matmul(A, B, kernel="coalesced")  # grid.y = 2.1e6 / 32 > 65535


def test_constraint_error_is_a_value_error():
    assert issubclass(ConstraintError, ValueError)


# --------------------------------------------------------------------------- GPU only


@pytest.mark.gpu
def test_device_views_are_read_or_copied():
    cp = backend.array_module()
    A = cp.asarray(f32(6, 5))
    B = cp.asarray(f32(6, 3))
    C = gemmlib.matmul(A.T, B, kernel="naive")
    ref = cp.asnumpy(A).T.astype(np.float64) @ cp.asnumpy(B)
    assert np.allclose(cp.asnumpy(C), ref, rtol=1e-5, atol=1e-5)
    A2, B2 = cp.asarray(f32(3, 4)), cp.asarray(f32(8, 4))[::2]
    C = gemmlib.matmul(A2, B2.T, kernel="naive")
    ref = cp.asnumpy(A2).astype(np.float64) @ cp.asnumpy(B2).T
    assert np.allclose(cp.asnumpy(C), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
def test_mixing_host_and_device_is_refused():
    cp = backend.array_module()
    with pytest.raises(TypeError, match=r"A on host, B on GPU"):
        gemmlib.matmul(f32(3, 4), cp.asarray(f32(4, 2)), kernel="naive")


@pytest.mark.gpu
def test_device_aliasing_is_refused():
    cp = backend.array_module()
    A = cp.asarray(f32(4, 4))
    with pytest.raises(ValueError, match=r"out shares memory with B"):
        gemmlib.matmul(cp.asarray(f32(4, 4)), A, out=A, kernel="naive")


def test_transpose_b_without_naming_a_kernel_picks_one_that_takes_it():
    A, Bt = f32(5, 7), f32(6, 7)
    C = gemmlib.matmul(A, Bt, transpose_b=True)
    np.testing.assert_allclose(C, A.astype(np.float64) @ Bt.T, rtol=1e-5, atol=1e-5)
