"""Inputs users actually pass: each is computed correctly or refused with a message
that says what to do.  The decisions are those of ``gemmlib.matmul``'s docstring:

* host (NumPy) arrays of any strides -- transposed, sliced, Fortran order,
  negative or zero strides, misaligned -- and host DLPack producers (a torch
  CPU tensor) are copied to the GPU; the result comes back as NumPy;
* GPU arrays (CuPy, numba, torch, anything with ``__cuda_array_interface__``
  or ``__dlpack__``) are used in place and must be C-contiguous: a view that
  is not is refused, naming ``ascontiguousarray``; a C-contiguous view with an
  offset (``A[1:]``, a sub-buffer that is not 16-byte aligned) is accepted;
* ``out`` must have the right shape and dtype, be C-contiguous, writeable,
  in the same place as A and B, and share no memory with them;
* operands on another GPU than the current one are refused, naming
  ``cupy.cuda.Device``; a stream that is neither CuPy's nor numba's is refused.
"""

from __future__ import annotations

import types

import numpy as np
import pytest

import gemmlib
from gemmlib import backend
from gemmlib.frontends import checks
from gemmlib.frontends.checks import check_operands
from gemmlib.frontends.operand import Operand

from _reliability import (assert_close, host_operands, input_dtype, kernel_names, nk, ref64,
                          run, spec_or_skip)

FAST = "blocktile_2d"  # a cheap rung in the simulator for the kernel-independent checks


def f32(rng, *shape):
    return rng.uniform(-1, 1, shape).astype(np.float32)


def close(C, ref, K, spec=None):
    assert_close(C, ref, K, spec)


def misaligned(xp, shape, rng, offset_bytes=4, dtype=np.float32):
    """A C-contiguous array whose data pointer is ``offset_bytes`` past 16-byte alignment."""
    n = int(np.prod(shape))
    size = np.dtype(dtype).itemsize
    buf = xp.empty(n + 16 // size, dtype=dtype)
    ptr = buf.ctypes.data if xp is np else buf.data.ptr
    start = ((offset_bytes - ptr % 16) % 16) // size
    view = buf[start:start + n].reshape(shape)
    view[...] = xp.asarray(f32(rng, *shape).astype(dtype))
    got = (view.ctypes.data if xp is np else view.data.ptr) % 16
    assert got == offset_bytes % 16 and view.flags.c_contiguous
    return view


# --------------------------------------------------------------------------- host (sim and GPU)


@pytest.mark.parametrize("name", kernel_names())
def test_misaligned_contiguous_operands_every_kernel(name, rng):
    """K and N multiples of 4 but base pointers 4 bytes off 16: the float4 paths must not be
    taken (in the simulator the intrinsic twins raise if they are)."""
    spec = spec_or_skip(name)
    M, N, K = 9, 12, 8
    dt = input_dtype(spec)
    A = misaligned(np, (M, K), rng, 4, dt)
    B = misaligned(np, (N, K) if nk(spec) else (K, N), rng, 8, dt)
    out = misaligned(np, (M, N), rng, 12)
    C = run(spec, A, B, out=out)
    assert C is out
    close(C, ref64(spec, A, B), K, spec)


def _host_views(rng):
    M, N, K = 7, 6, 5
    yield "A.T and B.T", f32(rng, K, M).T, f32(rng, N, K).T
    yield "Fortran order", np.asfortranarray(f32(rng, M, K)), np.asfortranarray(f32(rng, K, N))
    yield "step slices", f32(rng, 2 * M, 3 * K)[::2, ::3], f32(rng, K, 2 * N)[:, ::2]
    yield "negative strides", f32(rng, M, K)[::-1, ::-1], f32(rng, K, N)[::-1]
    yield "zero strides (broadcast)", np.broadcast_to(f32(rng, 1, K), (M, K)), \
        np.broadcast_to(f32(rng, K, 1), (K, N))
    yield "column block of a wider matrix", f32(rng, M, K + 9)[:, 3:3 + K], f32(rng, K, N)
    yield "read-only inputs", _readonly(f32(rng, M, K)), _readonly(f32(rng, K, N))
    yield "0-d sized 1x1", f32(rng, 1, 1), f32(rng, 1, N)


def _readonly(a):
    a.flags.writeable = False
    return a


@pytest.mark.parametrize("case", [c[0] for c in _host_views(np.random.default_rng(0))])
def test_host_views_are_copied_and_correct(case, rng):
    _, A, B = next(c for c in _host_views(rng) if c[0] == case)
    spec = spec_or_skip(FAST)
    C = run(spec, A, B)
    assert isinstance(C, np.ndarray) and C.dtype == np.float32 and C.shape == (A.shape[0], B.shape[1])
    # Broadcast operands make every element the same dot product: measure its error
    # against |A| @ |B| (the rounding bound's scale), or a cancelling sum fails by chance.
    scale = np.linalg.norm(np.abs(A.astype(np.float64)) @ np.abs(B.astype(np.float64)))
    assert_close(C, ref64(spec, A, B), A.shape[1], scale=scale)


def test_transposed_view_as_nk_operand(rng):
    """A kernel that takes B as (N, K) accepts a transposed (K, N) host matrix."""
    name = next((n for n in kernel_names() if gemmlib.kernels.get(n).b_operand == "NK"), None)
    if name is None:
        pytest.skip("no registered kernel takes B as (N, K)")
    spec = spec_or_skip(name)
    A, Bkn = f32(rng, 5, 7), f32(rng, 7, 6)
    C = gemmlib.matmul(A, Bkn.T, kernel=spec, transpose_b=True)
    close(C, A.astype(np.float64) @ Bkn, 7)


def test_host_out_is_written_in_place_and_returned(rng):
    spec = spec_or_skip(FAST)
    A, B = host_operands(spec, 5, 6, 7, rng)
    out = np.full((5, 6), np.nan, np.float32)
    C = run(spec, A, B, out=out)
    assert C is out
    close(out, ref64(spec, A, B), 7)


def test_out_in_a_separate_part_of_the_same_buffer_is_fine(rng):
    spec = spec_or_skip(FAST)
    M, N, K = 4, 5, 6
    buf = np.zeros(M * K + K * N + M * N, np.float32)
    A = buf[:M * K].reshape(M, K)
    B = buf[M * K:M * K + K * N].reshape(K, N)
    A[...], B[...] = f32(rng, M, K), f32(rng, K, N)
    out = buf[M * K + K * N:].reshape(M, N)
    C = run(spec, A, B, out=out)
    close(C, A.astype(np.float64) @ B, K)


@pytest.mark.parametrize("how, match", [
    ("out is A", r"out shares memory with A"),
    ("out is B", r"out shares memory with B"),
    ("out overlaps the end of A", r"out shares memory with A"),
    ("out is a transposed view", r"out must be C-contiguous"),
    ("out is Fortran order", r"out must be C-contiguous"),
    ("out has the wrong shape", r"out has shape \(6, 5\), but A @ B has shape \(5, 5\)"),
    ("out is read-only", r"out is read-only"),
])
def test_bad_host_out_is_refused(how, match, rng):
    M = N = K = 5  # square, so that `out is A` and `out is B` pass the shape check
    buf = f32(rng, 2 * M * K)
    A = buf[:M * K].reshape(M, K)
    B = f32(rng, K, N)
    out = {
        "out is A": lambda: A,
        "out is B": lambda: B,
        "out overlaps the end of A": lambda: buf[M * K - 3:M * K - 3 + M * N].reshape(M, N),
        "out is a transposed view": lambda: np.empty((N, M), np.float32).T,
        "out is Fortran order": lambda: np.empty((M, N), np.float32, order="F"),
        "out has the wrong shape": lambda: np.empty((N + 1, M), np.float32),
        "out is read-only": lambda: _readonly(np.empty((M, N), np.float32)),
    }[how]()
    with pytest.raises(ValueError, match=match):
        gemmlib.matmul(A, B, out=out, kernel=FAST)


@pytest.mark.parametrize("dtype", [">f4", np.float64, np.float16, np.int64, np.complex64, bool])
def test_other_dtypes_are_refused_naming_the_fix(dtype, rng):
    A = f32(rng, 3, 4).astype(dtype)
    with pytest.raises(TypeError, match=r"A has dtype .* computes in float32.*astype\(np\.float32\)"):
        gemmlib.matmul(A, f32(rng, 4, 2), kernel=FAST)


@pytest.mark.parametrize("thing", [[[1.0, 2.0]], ((1.0,),), 3.0, "A", None])
def test_non_arrays_are_refused(thing, rng):
    with pytest.raises(TypeError, match=r"must be a NumPy array or a GPU array|works on NumPy"):
        gemmlib.matmul(thing, f32(rng, 2, 2), kernel=FAST)


@pytest.mark.parametrize("stream", ["default", 0, 12345, object()])
def test_a_stream_that_is_no_stream_is_refused(stream, rng):
    with pytest.raises(TypeError, match=r"stream must be a CuPy, numba or torch stream, not"):
        gemmlib.matmul(f32(rng, 2, 3), f32(rng, 3, 2), kernel=FAST, stream=stream)


def test_numba_stream_in_the_simulator(rng):
    if not backend.SIMULATOR:
        pytest.skip("simulator only; test_streams covers real streams")
    A, B = f32(rng, 3, 4), f32(rng, 4, 5)
    C = gemmlib.matmul(A, B, kernel=FAST, stream=backend.cuda.stream())
    close(C, A.astype(np.float64) @ B, 4)


class _HostDLPack:
    """Exposes only the DLPack protocol of a host array (as a torch CPU tensor does)."""

    def __init__(self, a):
        self._a = a

    def __dlpack__(self, **kw):
        return self._a.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


def test_host_dlpack_producers_are_host_arrays(rng):
    A, B = f32(rng, 5, 3), f32(rng, 3, 4)
    C = gemmlib.matmul(_HostDLPack(A), _HostDLPack(B), kernel=FAST)
    assert isinstance(C, np.ndarray)
    close(C, A.astype(np.float64) @ B, 3)


def test_device_numba_arrays_in_the_simulator_are_refused_clearly(rng):
    if not backend.SIMULATOR:
        pytest.skip("simulator only")
    dA = backend.cuda.to_device(f32(rng, 3, 4))
    with pytest.raises(TypeError, match=r"in the simulator gemmlib works on NumPy arrays"):
        gemmlib.matmul(dA, f32(rng, 4, 2), kernel=FAST)


@pytest.mark.parametrize("who", ["A", "out"])
def test_operand_on_another_gpu_is_refused(who, monkeypatch):
    """One GPU on the test machine: fake the device an operand lives on (the current
    device, the driver's, faked as 0: no GPU needed)."""
    monkeypatch.setattr(checks, "current_device", lambda: 0)

    def op(shape, device, ptr):
        return Operand(None, shape, np.dtype(np.float32), True, on_host=False,
                       ptr=ptr, nbytes=4 * shape[0] * shape[1], device=device)

    a = op((2, 3), 1 if who == "A" else 0, 1 << 20)
    b = op((3, 4), 0, 2 << 20)
    c = op((2, 4), 1 if who == "out" else 0, 3 << 20)
    with pytest.raises(ValueError, match=rf"{who} lives on GPU 1 but the current device is GPU 0: "
                                         r"call matmul inside `with cupy.cuda.Device\(1\):`"):
        check_operands(gemmlib.kernels.get(FAST), a, b, c)


# --------------------------------------------------------------------------- GPU arrays


def _cp():
    return backend.array_module()


@pytest.mark.gpu
@pytest.mark.parametrize("name", kernel_names())
def test_misaligned_device_views_every_kernel_gpu(name, rng):
    """C-contiguous device views whose pointers are 4, 8 or 12 bytes past 16-byte alignment
    (e.g. ``buf[1:].reshape(...)``) are accepted; float4 kernels must fall back, not fault."""
    spec = spec_or_skip(name)
    cp = _cp()
    for off_a, off_b, off_c in ((4, 8, 12), (0, 4, 0), (0, 0, 8)):
        M, N, K = 131, 132, 68
        dt = input_dtype(spec)
        A = misaligned(cp, (M, K), rng, off_a, dt)
        B = misaligned(cp, (N, K) if nk(spec) else (K, N), rng, off_b, dt)
        out = misaligned(cp, (M, N), rng, off_c)
        C = run(spec, A, B, out=out)
        assert C is out
        close(C, ref64(spec, A, B), K, spec)


@pytest.mark.gpu
@pytest.mark.parametrize("view", ["A.T", "Fortran", "step slice", "column slice", "negative stride",
                                  "broadcast"])
@pytest.mark.parametrize("who", ["A", "B"])
def test_non_contiguous_device_views_are_computed_right_gpu(view, who, rng):
    """Views of every layout are read in place or copied by the caller's framework: the
    product is right either way."""
    cp = _cp()
    M = N = K = 6
    make = {
        "A.T": lambda: cp.asarray(f32(rng, K, M)).T,
        "Fortran": lambda: cp.asfortranarray(cp.asarray(f32(rng, M, K))),
        "step slice": lambda: cp.asarray(f32(rng, 2 * M, K))[::2],
        "column slice": lambda: cp.asarray(f32(rng, M, 2 * K))[:, :K],
        "negative stride": lambda: cp.asarray(f32(rng, M, K))[::-1],
        "broadcast": lambda: cp.broadcast_to(cp.asarray(f32(rng, 1, K)), (M, K)),
    }
    A = make[view]() if who == "A" else cp.asarray(f32(rng, M, K))
    B = make[view]() if who == "B" else cp.asarray(f32(rng, K, N))
    C = gemmlib.matmul(A, B, kernel=FAST)
    close(C, cp.asnumpy(A).astype(np.float64) @ cp.asnumpy(B), K)


@pytest.mark.gpu
def test_contiguous_row_slice_is_used_in_place_gpu(rng):
    cp = _cp()
    big = cp.asarray(f32(rng, 20, 7))
    A = big[3:12]  # C-contiguous, offset pointer (3*7*4 bytes: not 16-aligned)
    B = cp.asarray(f32(rng, 7, 5))
    for name in (FAST, "vectorized"):
        if name in kernel_names():
            ref = cp.asnumpy(A).astype(np.float64) @ cp.asnumpy(B)
            close(gemmlib.matmul(A, B, kernel=name), ref, 7)


@pytest.mark.gpu
@pytest.mark.parametrize("how, exc, match", [
    ("out is A", ValueError, r"out shares memory with A"),
    ("out is B", ValueError, r"out shares memory with B"),
    ("out overlaps A", ValueError, r"out shares memory with A"),
    ("out transposed", ValueError, r"out must be C-contiguous"),
    ("out wrong shape", ValueError, r"out has shape \(6, 5\), but A @ B has shape \(5, 5\)"),
    ("out float64", TypeError, r"out has dtype float64"),
    ("out on host", TypeError, r"A on GPU, B on GPU, out on host"),
])
def test_bad_device_out_is_refused_gpu(how, exc, match, rng):
    cp = _cp()
    M = N = K = 5  # square, so that `out is A` and `out is B` pass the shape check
    buf = cp.asarray(f32(rng, 2 * M * K))
    A = buf[:M * K].reshape(M, K)
    B = cp.asarray(f32(rng, K, N))
    out = {
        "out is A": lambda: A,
        "out is B": lambda: B,
        "out overlaps A": lambda: buf[M * K - 3:M * K - 3 + M * N].reshape(M, N),
        "out transposed": lambda: cp.empty((N, M), np.float32).T,
        "out wrong shape": lambda: cp.empty((N + 1, M), np.float32),
        "out float64": lambda: cp.empty((M, N), np.float64),
        "out on host": lambda: np.empty((M, N), np.float32),
    }[how]()
    with pytest.raises(exc, match=match):
        gemmlib.matmul(A, B, out=out, kernel=FAST)


@pytest.mark.gpu
def test_device_out_is_written_in_place_gpu(rng):
    cp = _cp()
    A, B = cp.asarray(f32(rng, 33, 17)), cp.asarray(f32(rng, 17, 9))
    out = cp.full((33, 9), cp.nan, np.float32)
    assert gemmlib.matmul(A, B, out=out, kernel=FAST) is out
    close(out, ref64(gemmlib.kernels.get(FAST), A, B), 17)


@pytest.mark.gpu
def test_numba_device_arrays_gpu(rng):
    cuda = backend.cuda
    A, B = f32(rng, 37, 29), f32(rng, 29, 23)
    dA, dB = cuda.to_device(A), cuda.to_device(B)
    C = gemmlib.matmul(dA, dB, kernel=FAST)
    assert cuda.is_cuda_array(C) and type(C).__module__.startswith("numba")  # numba in, numba out
    close(C.copy_to_host(), A.astype(np.float64) @ B, 29)
    # numba and CuPy mixed, numba out
    out = cuda.device_array((37, 23), np.float32)
    assert gemmlib.matmul(dA, _cp().asarray(B), out=out, kernel=FAST) is out
    close(out.copy_to_host(), A.astype(np.float64) @ B, 29)
    # numba's .T of a device array is a transposing *copy* (contiguous), so it just works
    At = f32(rng, 29, 37)
    close(gemmlib.matmul(cuda.to_device(At).T, dB, kernel=FAST).copy_to_host(),
          At.T.astype(np.float64) @ B, 29)
    wide = f32(rng, 37, 58)   # a strided numba view: copied, the product right
    close(gemmlib.matmul(cuda.to_device(wide)[:, :29], dB, kernel=FAST).copy_to_host(),
          wide[:, :29].astype(np.float64) @ B, 29)


@pytest.mark.gpu
def test_torch_tensors_gpu(rng):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    A, B = f32(rng, 37, 29), f32(rng, 29, 23)
    tA, tB = torch.from_numpy(A).cuda(), torch.from_numpy(B).cuda()
    ref = A.astype(np.float64) @ B
    torch.cuda.synchronize()
    C = gemmlib.matmul(tA, tB, kernel=FAST)  # torch in, torch out, on the inputs' device
    assert isinstance(C, torch.Tensor) and C.device == tA.device and C.dtype == torch.float32
    torch.cuda.synchronize()
    close(C.cpu().numpy(), ref, 29)
    out = torch.empty((37, 23), device="cuda", dtype=torch.float32)
    assert gemmlib.matmul(tA, tB, out=out, kernel=FAST) is out
    close(out.cpu().numpy(), ref, 29)
    # DLPack only (no __cuda_array_interface__): goes through cupy.from_dlpack, zero-copy
    C = gemmlib.matmul(_DLPackOnly(tA), _DLPackOnly(tB), kernel=FAST)
    close(C, ref, 29)
    At = torch.from_numpy(f32(rng, 29, 37)).cuda().T   # column-major: read or copied
    close(gemmlib.matmul(At, tB, kernel=FAST).cpu().numpy(),
          At.cpu().double().numpy() @ B.astype(np.float64), 29)
    with pytest.raises(TypeError, match=r"A has dtype float64"):
        gemmlib.matmul(tA.double(), tB, kernel=FAST)
    # a tensor that requires grad is refused, saying to detach (as torch's exporters do)
    with pytest.raises(RuntimeError, match=r"detach"):
        gemmlib.matmul(tA.clone().requires_grad_(True), tB, kernel=FAST)
    # CPU tensors: host arrays (DLPack, zero-copy), copied to the GPU; the result is a CPU tensor
    C = gemmlib.matmul(torch.from_numpy(A), torch.from_numpy(B), kernel=FAST)
    assert isinstance(C, torch.Tensor) and C.device.type == "cpu"
    close(C.numpy(), ref, 29)
    # a torch stream is taken as it is
    s = torch.cuda.Stream()
    C = gemmlib.matmul(tA, tB, kernel=FAST, stream=s)
    s.synchronize()
    close(C.cpu().numpy(), ref, 29)


class _DLPackOnly:
    def __init__(self, t):
        self._t = t

    def __dlpack__(self, **kw):
        return self._t.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self._t.__dlpack_device__()


@pytest.mark.gpu
def test_operand_on_another_gpu_is_refused_gpu(rng, monkeypatch):
    """Real arrays, faked device attribute (the test machine has one GPU)."""
    cp = _cp()
    if cp.cuda.runtime.getDeviceCount() > 1:
        with cp.cuda.Device(1):
            A1 = cp.asarray(f32(rng, 3, 4))
        with pytest.raises(ValueError, match=r"A lives on GPU 1 but the current device is GPU 0"):
            gemmlib.matmul(A1, cp.asarray(f32(rng, 4, 2)), kernel=FAST)
        return
    A = cp.asarray(f32(rng, 3, 4))
    B = cp.asarray(f32(rng, 4, 2))
    real = cp.cuda.runtime.pointerGetAttributes

    def fake(ptr):
        return types.SimpleNamespace(device=1 if ptr == A.data.ptr else real(ptr).device)

    try:
        monkeypatch.setattr(cp.cuda.runtime, "pointerGetAttributes", fake)
    except (AttributeError, TypeError) as e:  # an extension module that refuses setattr
        pytest.skip(f"cannot fake the device of a pointer here: {e}")
    # CuPy arrays take matmul's fast path, which asks CuPy (not the runtime) for the device;
    # an array known only by __cuda_array_interface__ takes the path that asks the runtime.
    class CAIOnly:
        def __init__(self, a):
            self.__cuda_array_interface__ = a.__cuda_array_interface__

    with pytest.raises(ValueError, match=r"A lives on GPU 1 but the current device is GPU 0: "
                                         r"call matmul inside `with cupy.cuda.Device\(1\):`"):
        gemmlib.matmul(CAIOnly(A), B, kernel=FAST)


@pytest.mark.gpu
def test_host_arrays_on_gpu_come_back_as_numpy(rng):
    A, B = f32(rng, 40, 30).T, f32(rng, 40, 20)  # a transposed host view, staged through the GPU
    C = gemmlib.matmul(A, B, kernel=FAST)
    assert isinstance(C, np.ndarray)
    close(C, A.astype(np.float64) @ B, 40)
