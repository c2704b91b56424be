"""Framework-native calls (issue 18): torch in, torch out, on torch's stream, at torch's cost.

In CI (the simulator) torch CPU tensors run and come back as CPU tensors, and
the short path's bookkeeping (which calls it may repeat, which checks it
re-runs on every call) is tested on described operands.  On a GPU the same
calls run on CUDA tensors: the result's type and device, the launch on
``torch.cuda.current_stream()`` (ordered with work queued on a side stream),
and the short path falling back to the long one whenever a per-call check
fails (an aliased ``out``, a misaligned view).
"""

from __future__ import annotations

import numpy as np
import pytest

import gemmlib
from gemmlib import backend, dispatch
from gemmlib.frontends import checks, torch_tensors
from gemmlib.frontends.operand import Operand
from gemmlib.paths import repeat
from gemmlib.paths.repeat import call_key, still_holds
from gemmlib.runtime.calls import Call
from gemmlib.runtime.memory import RawStream

torch = pytest.importorskip("torch")

gpu = pytest.mark.gpu
needs_gpu = pytest.mark.skipif(backend.SIMULATOR, reason="needs a GPU")


def _ref(A, B):
    return A.double() @ B.double()


def _rel(C, R) -> float:
    C, R = C.double().cpu(), R.double().cpu()
    return float(torch.linalg.norm(C - R) / torch.linalg.norm(R))


# --------------------------------------------------------------------------
# CPU tensors (host arrays): what CI runs


def test_cpu_tensors_come_back_as_cpu_tensors():
    g = torch.Generator().manual_seed(0)
    A, B = torch.rand(7, 5, generator=g) - 0.5, torch.rand(5, 6, generator=g) - 0.5
    C = gemmlib.matmul(A, B, kernel="blocktile_2d")
    assert isinstance(C, torch.Tensor) and C.device.type == "cpu" and C.shape == (7, 6)
    assert _rel(C, _ref(A, B)) < 1e-6


def test_cpu_fp16_tensors_run_on_the_tensor_core_rung():
    g = torch.Generator().manual_seed(1)
    A = (torch.rand(9, 10, generator=g) - 0.5).half()
    B = (torch.rand(10, 11, generator=g) - 0.5).half()
    C = gemmlib.matmul(A, B, kernel="mma_atom")   # the inputs' type, as torch.matmul
    assert isinstance(C, torch.Tensor) and C.dtype == torch.float16
    assert _rel(C, _ref(A, B)) < 1e-3
    C = gemmlib.matmul(A, B, kernel="mma_atom", out_dtype=torch.float32)
    assert isinstance(C, torch.Tensor) and C.dtype == torch.float32
    assert _rel(C, _ref(A, B)) < 1e-3


def test_cpu_out_tensor_is_written_and_returned():
    A, B = torch.rand(4, 3), torch.rand(3, 5)
    out = torch.full((4, 5), float("nan"))
    assert gemmlib.matmul(A, B, out=out, kernel="blocktile_2d") is out
    assert _rel(out, _ref(A, B)) < 1e-6


def test_bad_torch_inputs_get_the_usual_messages():
    A = torch.rand(4, 3)
    with pytest.raises(ValueError, match="inner dimensions differ"):
        gemmlib.matmul(A, torch.rand(4, 5))
    with pytest.raises(TypeError, match="float64"):
        gemmlib.matmul(A.double(), torch.rand(3, 5).double(), kernel="blocktile_2d")


def test_torch_dtypes_are_named_as_torch_names_them():
    assert torch_tensors.torch_dtype(torch.float16) == (np.dtype(np.float16), "float16")
    assert torch_tensors.torch_dtype(torch.bfloat16) == (np.dtype(np.uint16), "bfloat16")
    dt, name = torch_tensors.torch_dtype(torch.float8_e4m3fn)
    assert name == "float8_e4m3fn" and dt.itemsize == 1


class _FakeTorchStream:
    cuda_stream = 1234

    def synchronize(self):
        pass


def test_torch_streams_are_accepted_and_give_their_handle():
    checks.check_stream(_FakeTorchStream())  # no TypeError
    assert dispatch.stream_handle(_FakeTorchStream()) == 1234
    assert dispatch.stream_handle(RawStream(99)) == 99
    with pytest.raises(TypeError, match="CuPy, numba or torch stream"):
        checks.check_stream(object())


# --------------------------------------------------------------------------
# The short path's bookkeeping, on described operands (no GPU needed)


def _op(shape, ptr, dtype=np.float32, kind="cupy", device=0):
    dt = np.dtype(dtype)
    return Operand(object(), shape, dt, True, on_host=False, ptr=ptr,
                   nbytes=int(np.prod(shape)) * dt.itemsize, device=device, kind=kind)


def test_call_keys_cover_what_the_checks_read():
    a, b = _op((8, 16), 0x1000), _op((16, 24), 0x9000)
    k = call_key(a, b, None, None, False, None)
    assert k == call_key(_op((8, 16), 0x5000), _op((16, 24), 0x7000), None, None, False, None)
    assert k != call_key(_op((8, 17), 0x1000), b, None, None, False, None)      # shape
    assert k != call_key(_op((8, 16), 0x1000, np.float16), b, None, None, False, None)
    assert k != call_key(a, b, None, "warptile", False, None)                    # kernel
    assert k != call_key(a, b, None, None, False, "tf32")                        # precision
    assert k != call_key(a, b, _op((8, 24), 0x20000), None, False, None)         # out
    # numpy, numba and other arrays always take the long path
    assert call_key(_op((8, 16), 0, kind="numpy"), b, None, None, False, None) is None
    # a KernelSpec by identity: the same object gives the same key, another spec another
    spec = gemmlib.get_kernel("shared")
    ks = call_key(a, b, None, spec, False, None)
    assert ks == call_key(a, b, None, spec, False, None) and ks != k
    assert ks != call_key(a, b, None, gemmlib.get_kernel("naive"), False, None)
    assert call_key(a, b, None, object(), False, None) is None   # not a spec: long path


def test_a_known_call_still_checks_pointers_and_device(monkeypatch):
    monkeypatch.setattr(repeat, "current_device", lambda: 0)
    known = Call(plan=None, out_dtype=np.float32, align=8)
    a, b = _op((8, 16), 0x1000), _op((16, 24), 0x9000)
    assert still_holds(known, a, b, None)
    assert not still_holds(known, _op((8, 16), 0x1004), b, None)        # misaligned: pad
    assert still_holds(Call(None, np.float32, 0), _op((8, 16), 0x1004), b, None)
    assert not still_holds(known, a, b, _op((8, 24), 0x1000 + 64))     # out overlaps A
    assert not still_holds(known, a, _op((16, 24), 0x9000, device=1), None)  # other GPU
    monkeypatch.setattr(repeat, "current_device", lambda: 1)
    assert not still_holds(known, a, b, None)


# --------------------------------------------------------------------------
# CUDA tensors (GPU)


def _cuda_pair(M, N, K, dtype, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    A = (torch.rand(M, K, device="cuda", generator=g) * 2 - 1).to(dtype)
    B = (torch.rand(K, N, device="cuda", generator=g) * 2 - 1).to(dtype)
    return A, B


@gpu
@needs_gpu
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("shape", [(1, 1, 1), (37, 29, 53), (128, 256, 64), (5, 4096, 4096)])
def test_cuda_tensors_in_torch_tensors_out(dtype, shape):
    M, N, K = shape
    A, B = _cuda_pair(M, N, K, getattr(torch, dtype))
    for _ in range(3):  # the first call takes the long path, the others the short one
        C = gemmlib.matmul(A, B)
        assert isinstance(C, torch.Tensor) and C.device == A.device and C.shape == (M, N)
        tol = 1e-5 if dtype == "float32" else 1e-2
        assert _rel(C, _ref(A, B)) < tol


@gpu
@needs_gpu
def test_a_product_is_ordered_on_a_torch_side_stream():
    """The launch goes on torch's current stream: a side stream's pending writes to A are
    seen, with no synchronisation by the caller between them."""
    A, B = _cuda_pair(256, 128, 512, torch.float16, seed=3)
    R = _ref(A, B)
    side = torch.cuda.Stream()
    A_late = torch.full_like(A, float("nan"))
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)   # keep the side stream busy (~25 ms)...
        A_late.copy_(A)                 # ...so A_late is still NaN when the host gets here
        C = gemmlib.matmul(A_late, B)   # must run after the copy, on `side`
        for _ in range(3):
            C2 = gemmlib.matmul(A_late, B)   # the short path, also on `side`
    side.synchronize()
    assert _rel(C, R) < 1e-2 and _rel(C2, R) < 1e-2


@gpu
@needs_gpu
def test_the_short_path_falls_back_when_a_check_would_fail():
    A, B = _cuda_pair(64, 72, 48, torch.float16, seed=4)
    for _ in range(2):
        gemmlib.matmul(A, B)
    # a view one element in: not 16-byte aligned, so the call must stage padded copies
    big = torch.empty(64 * 48 + 1, device="cuda", dtype=torch.float16)
    Av = big[1:].view(64, 48)
    Av.copy_(A)
    C = gemmlib.matmul(Av, B)
    assert _rel(C, _ref(A, B)) < 1e-2
    # an out that aliases an input is refused even after the same description was seen
    A32, B32 = _cuda_pair(64, 72, 72, torch.float32, seed=5)
    out = torch.empty(64, 72, device="cuda", dtype=torch.float32)
    gemmlib.matmul(A32, B32, out=out)
    gemmlib.matmul(A32, B32, out=out)
    with pytest.raises(ValueError, match="shares memory"):
        gemmlib.matmul(A32, B32, out=A32)


@gpu
@needs_gpu
def test_cupy_fp16_calls_repeat_on_the_short_path():
    cp = backend.array_module()
    A = cp.random.rand(96, 40).astype(cp.float16)
    B = cp.random.rand(40, 88).astype(cp.float16)
    dispatch.CALLS.clear()
    gemmlib.matmul(A, B)
    assert len(dispatch.CALLS) == 1
    C = gemmlib.matmul(A, B)
    assert type(C) is cp.ndarray
    R = A.astype(cp.float64) @ B.astype(cp.float64)
    assert float(cp.linalg.norm(C - R) / cp.linalg.norm(R)) < 1e-3


@gpu
@needs_gpu
def test_a_named_kernel_spec_repeats_on_the_short_path():
    """A KernelSpec (``kernel=spec``) is keyed by identity; the entry keeps the spec alive."""
    cp = backend.array_module()
    A = cp.random.rand(70, 40).astype(cp.float32)
    B = cp.random.rand(40, 50).astype(cp.float32)
    spec = gemmlib.get_kernel("shared")
    dispatch.CALLS.clear()
    gemmlib.matmul(A, B, kernel=spec)
    assert len(dispatch.CALLS) == 1
    (known,) = [v for _, v in dispatch.CALLS.items()]
    assert known.kernel is spec
    C = cp.full((70, 50), cp.nan, dtype=cp.float32)
    assert gemmlib.matmul(A, B, out=C, kernel=spec) is C
    R = A.astype(cp.float64) @ B.astype(cp.float64)
    assert float(cp.linalg.norm(C - R) / cp.linalg.norm(R)) < 1e-5


def test_cpu_fp16_out_tensor_with_padding_is_written_and_returned():
    A = (torch.rand(5, 9) - 0.5).half()   # K = 9, N = 7: the call pads to multiples of 8
    B = (torch.rand(9, 7) - 0.5).half()
    out = torch.full((5, 7), float("nan"))
    assert gemmlib.matmul(A, B, out=out, kernel="mma_atom") is out
    assert _rel(out, _ref(A, B)) < 1e-3
