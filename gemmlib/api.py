"""``gemmlib.matmul``: checks the operands, then hands them to the runtime.

What a call costs the caller is mostly host time for small and medium
problems, so the common cases -- CuPy arrays or torch CUDA tensors in, the
same type out (or ``out=``) -- take a short path:

* operands are described from their own attributes (CuPy's ``data.ptr``,
  torch's ``data_ptr()``, ``shape``, ``dtype``), once per call: no
  ``__cuda_array_interface__`` dict, no pointer queries;
* a call whose operands are described like an earlier call's (type, dtype,
  shape, layout, kernel, precision) reuses what the checks concluded then
  (:data:`gemmlib.CALLS`): the plan and the output type.  The checks
  that depend on the pointers themselves (aliasing of ``out``, 16-byte
  alignment, the current device) run every time; anything unusual takes the
  long path, which runs every check with the same messages;
* the launch is one driver call (:func:`gemmlib.runtime.launch.run`) on the
  framework's own current stream (torch's for torch tensors).
"""

from __future__ import annotations

import sys
import threading
from contextlib import nullcontext
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from gemmlib import backend
from gemmlib.runtime import launch as runtime_launch
from gemmlib.runtime.caches import LRU
from gemmlib.runtime.calls import CALLS, Call
from gemmlib.runtime.driver import driver
from gemmlib.runtime.memory import stream_handle
from gemmlib.runtime import plans
from gemmlib.runtime.select import (AUTO, AUTO_RUNG, TC_AUTO, get_spec, select, select_batched,
                                    select_tc, with_a_layout, with_bias, with_layout, with_out)
from gemmlib.backend import SIMULATOR, cuda
from gemmlib.kernels import SCALED
from gemmlib.spec import KernelSpec

#: The kernel ``matmul`` uses when none is named: the autotuned fastest rung
#: (gemmlib.autotune; the warptile default where no tuning data exists).
DEFAULT_KERNEL = "auto"


@dataclass
class _Operand:
    """What matmul needs to know about one array, whatever library made it."""

    obj: object  # the array as the kernel will receive it
    shape: tuple
    dtype: np.dtype
    c_contiguous: bool
    on_host: bool
    ptr: int = 0
    nbytes: int = 0
    device: int | None = None
    kind: str = "numpy"  # numpy | cupy | torch | numba | dlpack (e.g. JAX, as CuPy) | other
    #: element type by name; "bfloat16" for BF16Array / torch / ml_dtypes data, whose
    #: ``obj`` is then the raw 16-bit patterns
    dname: str = ""
    #: bfloat16 operands: what carried them ("bf16array", "ml_dtypes" or "torch"), the type
    #: a bfloat16 result comes back in
    bf16_from: str = ""
    #: how the elements lie: "C" (row-major: a unit stride along the last dimension, rows
    #: one after the other), "F" (a 2-D matrix whose transpose is row-major: ``W.t()``,
    #: ``x.T``, Fortran order), or "" (anything else: a step, a gap between rows, a
    #: broadcast); from ``c_contiguous`` and the strides
    layout: str = ""

    def __post_init__(self):
        if not self.dname:
            self.dname = _dtype_name(self.dtype)
        if not self.layout and self.c_contiguous:
            self.layout = "C"

    def _replace_kind(self, kind: str) -> "_Operand":
        self.kind = kind
        return self


@lru_cache(maxsize=None)
def _dtype_name(dtype) -> str:
    """``np.dtype(dtype).name``, remembered: NumPy computes the name in Python on every
    access, a noticeable part of a call's host time."""
    return np.dtype(dtype).name


@lru_cache(maxsize=None)
def _np_dtype(name: str) -> np.dtype:
    return np.dtype(name)


def _c_contiguous(shape, strides, itemsize) -> bool:
    expected = itemsize
    for n, s in zip(reversed(shape), reversed(strides)):
        if n > 1 and s != expected:
            return False
        expected *= n
    return True


def _layout(shape, strides, itemsize=1) -> str:
    """"C", "F" (2-D only: the transpose is row-major) or "" for ``strides`` (in units of
    ``itemsize``)."""
    if _c_contiguous(shape, strides, itemsize):
        return "C"
    if len(shape) == 2 and _c_contiguous(shape[::-1], strides[::-1], itemsize):
        return "F"
    return ""


#: DLPack device types whose memory the CPU reads directly (kDLCPU, kDLCUDAHost).
_DLPACK_HOST = (1, 3)


def _dlpack_on_host(x) -> bool:
    """True for a DLPack producer whose data is in host memory (e.g. a torch CPU tensor)."""
    try:
        return int(x.__dlpack_device__()[0]) in _DLPACK_HOST
    except Exception:
        return False


_CUPY_NDARRAY = None  # cupy.ndarray, once CuPy is imported (never in the simulator)


def _cupy_ndarray():
    global _CUPY_NDARRAY
    if _CUPY_NDARRAY is None and not SIMULATOR and "cupy" in sys.modules:
        _CUPY_NDARRAY = sys.modules["cupy"].ndarray
    return _CUPY_NDARRAY


_TORCH = None  # the torch module, once the caller has imported it (gemmlib never does)


def _torch():
    global _TORCH
    if _TORCH is None and "torch" in sys.modules:
        _TORCH = sys.modules["torch"]
        _TENSOR[:] = [_TORCH.Tensor, _TORCH.nn.Parameter]
    return _TORCH


@lru_cache(maxsize=None)
def _torch_dtype(tdtype) -> tuple[np.dtype, str]:
    """A torch dtype as (the NumPy dtype of the bits the kernel reads, its name)."""
    name = str(tdtype).replace("torch.", "")
    if name == "bfloat16":
        return np.dtype(np.uint16), "bfloat16"
    try:
        dt = np.dtype(name)
    except TypeError:  # float8_e4m3fn, complex32, ...: no NumPy twin; the name still says it
        dt = np.dtype(f"V{tdtype.itemsize}")
    return dt, name


def _describe(x, name: str) -> _Operand:
    if type(x) is _cupy_ndarray():  # the common case, cheaply
        return _describe_cupy(x)
    torch = _torch()
    if torch is not None and isinstance(x, torch.Tensor) and x.is_cuda and not SIMULATOR:
        return _describe_torch(x)
    bf16 = _bf16_bits(x)
    if bf16 is not None:  # bfloat16: describe the bit patterns, remember what they are
        op = _describe(bf16, name)
        op.dname = "bfloat16"
        op.bf16_from = _bf16_source(x)
        return op
    return _describe_other(x, name)


def _bf16_bits(x):
    """The uint16/int16 bit patterns of a bfloat16 array (BF16Array, torch, ml_dtypes), or None."""
    from gemmlib.precision import BF16Array

    if isinstance(x, BF16Array):
        return x.bits
    if isinstance(x, np.ndarray) and x.dtype.name == "bfloat16":  # ml_dtypes
        return x.view(np.uint16)
    if str(getattr(x, "dtype", "")) == "torch.bfloat16":
        import torch

        return x.view(torch.int16)  # same bits; torch exports int16 through DLPack and CAI
    return None


def _bf16_source(x) -> str:
    from gemmlib.precision import BF16Array

    if isinstance(x, BF16Array):
        return "bf16array"
    return "ml_dtypes" if isinstance(x, np.ndarray) else "torch"


def _describe_cupy(x) -> _Operand:
    nbytes = x.nbytes
    mem = x.data
    c = x.flags.c_contiguous
    return _Operand(x, x.shape, x.dtype, c, on_host=False, ptr=mem.ptr,
                    nbytes=nbytes, device=mem.device_id if nbytes else None, kind="cupy",
                    layout="C" if c else _layout(x.shape, x.strides, x.itemsize))


def _describe_torch(x) -> _Operand:
    """A torch CUDA tensor, from its own attributes (one call's worth of cheap queries)."""
    if x.requires_grad and _torch().is_grad_enabled():
        # autograd would not see the product: fine under no_grad / inference_mode only
        raise RuntimeError("a tensor that requires grad cannot be used by gemmlib.matmul "
                           "while autograd records (it does not see gemmlib's kernels): call "
                           "it under torch.no_grad() or torch.inference_mode(), or pass "
                           "tensor.detach()")
    dtype, dname = _torch_dtype(x.dtype)
    nbytes = x.numel() * dtype.itemsize
    c = x.is_contiguous()
    return _Operand(x, tuple(x.shape), dtype, c, on_host=False,
                    ptr=x.data_ptr(), nbytes=nbytes, device=x.get_device() if nbytes else None,
                    kind="torch", dname=dname,
                    layout="C" if c else _layout(tuple(x.shape), x.stride()))


def _describe_other(x, name: str) -> _Operand:
    if (not isinstance(x, np.ndarray) and not hasattr(x, "__cuda_array_interface__")
            and not type(x).__module__.startswith("numba")  # the simulator's device arrays
            and hasattr(x, "__dlpack__") and _dlpack_on_host(x)):
        x = np.from_dlpack(x)  # e.g. a torch CPU tensor: a host array, zero-copy
    if isinstance(x, np.ndarray):
        c = x.flags.c_contiguous
        return _Operand(x, x.shape, x.dtype, c, on_host=True,
                        layout="C" if c else _layout(x.shape, x.strides, x.itemsize))
    if SIMULATOR:
        raise TypeError(
            f"{name}: in the simulator gemmlib works on NumPy arrays; got {type(x).__name__}")
    if not hasattr(x, "__cuda_array_interface__") and hasattr(x, "__dlpack__"):
        x = backend.array_module().from_dlpack(x)  # e.g. a JAX array; zero-copy
        return _describe_cupy(x)._replace_kind("dlpack")
    if not hasattr(x, "__cuda_array_interface__"):
        raise TypeError(
            f"{name} must be a NumPy array or a GPU array (CuPy, numba, or anything with "
            f"__cuda_array_interface__ or __dlpack__, such as a torch tensor); "
            f"got {type(x).__name__}")
    cai = x.__cuda_array_interface__
    shape = tuple(cai["shape"])
    dtype = np.dtype(cai["typestr"])
    strides = cai.get("strides") or None
    contiguous = True if strides is None else _c_contiguous(shape, strides, dtype.itemsize)
    layout = "C" if contiguous else _layout(shape, strides, dtype.itemsize)
    ptr = int(cai["data"][0])
    nbytes = int(np.prod(shape)) * dtype.itemsize
    device = None
    if ptr and nbytes:
        device = backend.array_module().cuda.runtime.pointerGetAttributes(ptr).device
    kind = "numba" if cuda.is_cuda_array(x) and type(x).__module__.startswith("numba") else (
        "cupy" if type(x).__module__.startswith("cupy") else "other")
    return _Operand(x, shape, dtype, contiguous, on_host=False, ptr=ptr, nbytes=nbytes,
                    device=device, kind=kind, layout=layout)


def _overlap(a: _Operand, b: _Operand) -> bool:
    if a.on_host:
        return np.shares_memory(a.obj, b.obj)
    return a.nbytes > 0 and b.nbytes > 0 and a.ptr < b.ptr + b.nbytes and b.ptr < a.ptr + a.nbytes


def _contiguous_hint(op: _Operand, name: str) -> str:
    """How the caller's framework makes ``name`` row-major."""
    return f"{name}.contiguous()" if op.kind == "torch" else f"cupy.ascontiguousarray({name})"


def _astype_hint(op: _Operand, name: str, want: str) -> str:
    if op.kind == "torch":
        return f"{name}.to(torch.{want})"
    return f"{name}.astype(np.{want})"


def _device_hint(op: _Operand, device: int) -> str:
    if op.kind == "torch":
        return (f"call matmul inside `with torch.cuda.device({device}):` "
                f"(or torch.cuda.set_device({device}))")
    return f"call matmul inside `with cupy.cuda.Device({device}):`"


def _check_operands(spec: KernelSpec, a: _Operand, b: _Operand, c: _Operand | None,
                    out_dtype: str | None = None):
    """The checks every 2-D product makes; ``b`` is described as the (K, N) matrix it is
    (a column-major B -- ``W.t()`` -- with ``b.layout == "F"``)."""
    for op, name in ((a, "A"), (b, "B")):
        if len(op.shape) != 2:
            raise ValueError(f"{name} must be a 2-D matrix; got shape {op.shape}")
    (M, K), (K2, N) = a.shape, b.shape
    if K != K2:
        raise ValueError(
            f"inner dimensions differ: A is {M}x{K} and B is {K2}x{N}; "
            f"A @ B needs B's rows ({K2}) to equal A's columns ({K})")
    ops = [(a, "A"), (b, "B")] + ([(c, "out")] if c is not None else [])
    for op, name in ops:
        want = spec.dtype if name != "out" else (out_dtype or spec.out_dtype)
        if op.dname != want or (op.dname != "bfloat16" and op.dtype != _np_dtype(want)):
            what = (f"kernel {spec.name!r} computes in {want}" if name != "out" else
                    f"kernel {spec.name!r} writes {want}")
            shown = op.dname if op.dname == "bfloat16" or op.kind == "torch" else op.dtype
            raise TypeError(
                f"{name} has dtype {shown}, but "
                f"{what}: convert it first (e.g. {_astype_hint(op, name, want)})"
                + ("" if spec.precision == "fp32" or name == "out" else
                   f" or pass precision= for the input's own type"))
    if a.on_host != b.on_host or (c is not None and c.on_host != a.on_host):
        where = ", ".join(f"{n} on {'host' if o.on_host else 'GPU'}" for o, n in ops)
        raise TypeError(
            f"operands must all be NumPy (host) arrays or all GPU arrays; got {where}. "
            f"Move them with cupy.asarray(...) or cupy.asnumpy(...)")
    if c is not None:
        if c.shape != (M, N):
            raise ValueError(f"out has shape {c.shape}, but A @ B has shape {(M, N)}")
        if isinstance(c.obj, np.ndarray) and not c.obj.flags.writeable:
            raise ValueError("out is read-only; pass a writeable array or None")
        if not c.c_contiguous:
            raise ValueError("out must be C-contiguous (row-major); pass a fresh array "
                             f"(e.g. {'torch.empty' if c.kind == 'torch' else 'cupy.empty'}"
                             "((M, N), ...)) or None")
        for op, name in ((a, "A"), (b, "B")):
            if _overlap(c, op):
                raise ValueError(
                    f"out shares memory with {name}: the kernel would overwrite its own input "
                    f"while reading it. Pass a separate output array")
    if not a.on_host:
        current = _current_device()
        for op, name in ops:
            if op.device is not None and op.device != current:
                raise ValueError(
                    f"{name} lives on GPU {op.device} but the current device is GPU {current}: "
                    + _device_hint(op, op.device))
    return M, N, K


class _RawStream(int):
    """A raw CUstream handle (a framework's current stream) handed down the call path."""

    @property
    def ptr(self) -> int:
        return int(self)


def _check_stream(stream) -> None:
    """Refuse anything that is not a CuPy, numba or torch stream before it reaches a launch."""
    if stream is None or hasattr(stream, "ptr"):  # CuPy (and _RawStream)
        return
    if hasattr(stream, "synchronize") and (hasattr(stream, "handle") or SIMULATOR):  # numba
        return
    if hasattr(stream, "cuda_stream") and hasattr(stream, "synchronize"):  # torch.cuda.Stream
        return
    raise TypeError(f"stream must be a CuPy, numba or torch stream, not {type(stream).__name__}")


def _torch_current_stream(device: int | None) -> _RawStream:
    """torch's current stream on ``device``: where torch would queue a matmul of these tensors."""
    torch = _torch()
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # one C call, no Stream object
    index = torch.cuda.current_device() if device is None else device
    if raw is not None:
        return _RawStream(raw(index))
    return _RawStream(torch.cuda.current_stream(index).cuda_stream)


def _staging_stream(stream):
    """The CuPy stream the host path copies on: the one the kernel runs on.

    Copies on another stream would not be ordered with the kernel when the
    caller's stream is non-blocking (the result could be read back before
    the kernel has written it).
    """
    if stream is None:
        return nullcontext()  # CuPy's current stream, where the kernel goes too
    if sys.modules.get("cupy") is None:   # a torch caller: copies are torch's (_torch_stream)
        return nullcontext()
    if isinstance(stream, _RawStream) or hasattr(stream, "cuda_stream"):  # torch's
        return backend.array_module().cuda.ExternalStream(stream_handle(stream))
    if hasattr(stream, "ptr"):
        return stream
    return backend.array_module().cuda.ExternalStream(int(stream))  # a numba stream


def matmul(A, B, out=None, *, kernel: str | KernelSpec | None = None, stream=None,
           transpose_b: bool = False, precision: str | None = None, scale_a=None,
           scale_b=None, out_dtype=None, bias=None):
    """C = A @ B (+ bias) with one of gemmlib's kernels, as ``torch.matmul`` computes it.

    Parameters
    ----------
    A, B : matrices (M, K) and (K, N), or stacks of them: float32, float16, bfloat16
        (torch, ``ml_dtypes.bfloat16``, ``gemmlib.precision.BF16Array``) or FP8.
        GPU arrays -- CuPy, numba device arrays, or anything exposing
        ``__cuda_array_interface__`` or ``__dlpack__`` (torch, JAX) -- are read in
        place in either layout: row-major, or column-major (a transposed view such as
        ``W.t()`` of an ``nn.Linear`` weight, ``x.T``, Fortran order).  A B in
        column-major order is read as it lies by every rung with a K-major build (the
        ``auto`` choices everywhere), a column-major A by the Hopper fp16/bf16 rungs'
        ``A_LAYOUT="KM"`` builds; anything else -- another rung, views with no unit
        stride (``A[:, ::2]``, a gap between rows) -- is copied into row-major order
        first, on the call's stream (the result is the same; the copy costs time).
        Shapes follow ``torch.matmul``: ``(..., M, K) @ (K, N)`` flattens the leading
        dimensions into one product; ``(b, M, K) @ (b, K, N)`` and broadcast batch
        dimensions give ``(b, M, N)``: one launch for 16-bit stacks on Hopper
        (``select_batched``), else one product per batch entry.
        1-D operands are refused (reshape them to (1, K) or (K, 1)).  A torch tensor
        that requires grad is accepted under ``torch.no_grad()`` /
        ``torch.inference_mode()`` (autograd does not see these kernels).  Arrays on a
        GPU other than the current one are refused, naming how to switch.
        Host arrays -- NumPy arrays of any strides and host DLPack producers such as
        torch CPU tensors -- are copied to the GPU and the result comes back as NumPy
        (a torch CPU tensor for torch inputs).  Mixing host and GPU operands is refused.
        Other dtypes (float64, byte-swapped, ...) are refused with a TypeError naming
        the conversion in the caller's framework.
    out : optional array of C's shape and type, row-major and writeable, not sharing
        memory with A or B.  Written in place and returned.  Allocated when None in the
        inputs' own array type.  An output that does not fit in GPU memory raises
        ``MemoryError`` with its size.
    bias : optional row of N values (shape (N,) or (1, N)), in the inputs' dtype (as
        ``F.linear`` takes it; float32 for float32 inputs), added to every row of C in
        fp32 before C's single rounding (see :func:`linear`).
    kernel : rung name (see ``gemmlib.list_kernels()``), a KernelSpec, or
        ``"auto"`` (the default): the configuration measured fastest for this GPU and
        shape class, with K split into slices when the output alone cannot fill the
        GPU (see ``gemmlib.runtime.select``).  Each configuration is compiled once per
        process and its machine code cached on disk (``gemmlib.runtime.compile``).
    stream : CuPy, numba or torch stream to launch on.  Default: the inputs'
        framework's current stream -- ``torch.cuda.current_stream()`` for torch
        tensors, CuPy's current stream otherwise.  Anything else is refused with a
        TypeError.  The call returns without waiting for GPU inputs and outputs; host
        results are ready.
    transpose_b : kept as an alias: ``matmul(A, W, transpose_b=True)`` is
        ``matmul(A, W.T)`` (W given as (N, K), row-major), read in place.
    precision : what the product is computed in (see ``gemmlib.precision``).
        ``None`` (default): the inputs' own type -- float32 exactly, in fp32 on the
        CUDA cores; float16 and bfloat16 on the tensor cores, products exact,
        accumulated in fp32.  For float32 inputs ``"tf32"`` rounds them to TF32 on the
        tensor cores (~1e-4 relative error, about 8x faster), and ``"3xtf32"`` splits
        each into two TF32 parts and issues three tensor-core products: fp32-level
        accuracy at tensor-core speed.  Tensor-core products need sm_80 or newer
        (sm_75 for fp16; ``ConstraintError`` otherwise).  ``"e4m3"`` / ``"e5m2"``: FP8
        (torch float8 tensors need no ``precision``; CuPy/NumPy pass uint8 bit
        patterns), see ``scale_a``.
    out_dtype : the type of C.  By default the inputs' own type, as ``torch.matmul``
        and ``cupy.matmul`` return it: float16 in, float16 out (accumulated in fp32,
        each element rounded once, to nearest even, by the kernel's own 16-bit epilogue
        where it has one, else by one more kernel after a float32 result).  For 16-bit
        inputs ``out_dtype=float32`` (``torch.float32``, ``numpy.float32``, "float32",
        "fp32") asks for the fp32 accumulators themselves.  An ``out`` array's dtype asks
        the same.  Any other ``out_dtype`` raises ValueError; one that does not match
        the inputs (fp16 out of bf16 inputs, 16-bit out of float32 inputs), TypeError.
        FP8 inputs: bfloat16 (default) or float32, see below.
    scale_a, scale_b : FP8 inputs only (``gemmlib.fp8``):
        C = (scale_a * scale_b) * (A @ B) with float32 per-tensor scales (one-element
        float32 CUDA tensors as for ``torch._scaled_mm``, or floats).  A torch B may be
        column-major (``w.t()``: read without a copy) or row-major (transposed first).

    Any M, N, K >= 0 is accepted; nothing needs padding, and indices are 64-bit.  A
    kernel that cannot run the problem on this GPU raises ``ConstraintError`` naming
    the constraint, before anything is launched.  The tensor-core pipelines move
    16-byte pieces: when K or N is not a multiple of 8 (16-bit) or 4 (float32), or an
    operand is not 16-byte aligned, the call first copies A and B into zero-padded
    aligned buffers (the result is the same; the copy costs time).
    """
    if type(A) in _TENSOR and type(B) in _TENSOR:   # torch's own calls: the lean path first
        plain = (kernel is None and stream is None and precision is None and scale_a is None
                 and scale_b is None)
        if plain:
            C = _torch_repeat(A, B, out, bias, transpose_b, out_dtype)
            if C is not None:
                return C
            _RECORD.known = None
        C = _matmul_checked(A, B, out, kernel, stream, transpose_b, precision, scale_a,
                            scale_b, out_dtype, bias)
        if plain and _RECORD.known is not None:
            _remember_torch(A, B, out, bias, transpose_b, out_dtype, C)
        return C
    return _matmul_checked(A, B, out, kernel, stream, transpose_b, precision, scale_a,
                           scale_b, out_dtype, bias)


def _matmul_checked(A, B, out, kernel, stream, transpose_b, precision, scale_a, scale_b,
                    out_dtype, bias):
    """matmul with every check (a repeat of a checked description skips most of them)."""
    if stream is not None:
        _check_stream(stream)
    a, b = _describe(A, "A"), _describe(B, "B")
    if (precision in _FP8 or a.dname.startswith("float8") or kernel in SCALED
            or getattr(kernel, "precision", None) in _FP8):
        if bias is not None:
            raise ValueError("bias is not supported with FP8 inputs")
        from gemmlib import fp8

        fmt = fp8.fp8_format(a.dname, precision) or (
            kernel.precision if isinstance(kernel, KernelSpec) else "e4m3")
        if a.kind == "torch" and stream is None:
            stream = _torch_current_stream(a.device)
        return fp8.matmul_fp8(A, B, a, b, fmt,
                              scale_a=scale_a, scale_b=scale_b, out_dtype=out_dtype, out=out,
                              kernel=kernel, stream=stream, transpose_b=transpose_b)
    if scale_a is not None or scale_b is not None:
        raise ValueError("scale_a and scale_b apply to FP8 inputs only")
    if transpose_b:
        if len(b.shape) != 2:
            raise ValueError(f"transpose_b=True takes a 2-D B of shape (N, K); got {b.shape}")
        B, b = _transposed(B, b)
    if len(a.shape) != 2 or len(b.shape) != 2:
        return _stacked(A, B, a, b, out, bias, kernel=kernel, stream=stream,
                        precision=precision, out_dtype=out_dtype)
    c = _describe(out, "out") if out is not None else None
    o16 = _out_type(out_dtype, a, c)
    if a.kind == "torch" and stream is None:
        stream = _torch_current_stream(a.device)
    z = _describe_bias(bias, a, b.shape[1]) if bias is not None else None
    key = _call_key(a, b, c, kernel, precision, o16, z)
    if key is not None:
        known = CALLS.get(key)
        if known is not None and _still_holds(known, a, b, c):
            _RECORD.known = known   # (a torch caller's lean path may remember it)
            return _run_known(known, a, b, c, out, stream, z)
    _RECORD.known = None
    C = _matmul(a, b, c, out, kernel, stream, precision, o16, z)
    if key is not None and _RECORD.known is not None:
        _RECORD.known.kernel = kernel
        CALLS.put(key, _RECORD.known)
    if out is None and a.kind in ("numpy", "dlpack") and not isinstance(A, np.ndarray):
        C = _like_input(C, A)
    return C


#: torch.Tensor and nn.Parameter once torch is imported (no subclass: a DTensor or a fake
#: tensor takes the checked path)
_TENSOR = []


class _TorchCall:
    """A torch call's description whose every check an earlier call passed: what a repeat
    launches (the plan, in ``known``) and the few checks that depend on the pointers."""

    __slots__ = ("known", "shape", "strides", "dtype", "spans", "bias_type", "devices")

    def __init__(self, known, shape, dtype, spans, bias_type):
        self.known, self.shape, self.dtype = known, shape, dtype
        self.strides = tuple(int(np.prod(shape[i + 1:])) for i in range(len(shape)))
        self.spans = spans            # bytes A, B and C reach from their first element
        self.bias_type = bias_type    # "fp32"/"fp16"/"bf16", or None: no bias
        self.devices = {}             # device index -> torch.device


#: torch call descriptions -> _TorchCall
_TORCH_CALLS = LRU(4096)


def _torch_key(A, B, out, bias, transpose_b, out_dtype):
    return (A.dtype, A.shape, A.stride(), B.dtype, B.shape, B.stride(), transpose_b,
            out_dtype, None if out is None else (out.dtype, out.shape, out.stride()),
            None if bias is None else (bias.dtype, bias.shape, bias.stride()))


def _span(t) -> int:
    """Bytes from a tensor's first element to the end of its last."""
    if t.numel() == 0:
        return 0
    return (sum((n - 1) * s for n, s in zip(t.shape, t.stride())) + 1) * t.element_size()


def _remember_torch(A, B, out, bias, transpose_b, out_dtype, C) -> None:
    """The checked call just launched its plan on these tensors as they lie (``_RECORD``):
    remember the description for the lean path, when a repeat can launch the same way --
    2-D operands, or an A of (..., M, K) whose rows are one contiguous (M, K) matrix."""
    k = _RECORD.known
    _RECORD.known = None
    p = k.plan
    if not A.is_cuda or B.dim() != 2 or (A.dim() != 2 and not A.is_contiguous()):
        return
    if out is not None and not out.is_contiguous():
        return
    if (A.dim() == 2 and tuple(A.shape) != (p.M, p.K)) or p.batch != 1:
        return
    bias_type = None if bias is None else _BIAS_TYPE.get(str(bias.dtype)[6:])
    if bias is not None and (bias_type is None or not bias.is_contiguous()):
        return
    spans = (_span(A), _span(B), _span(C))
    _TORCH_CALLS.put(_torch_key(A, B, out, bias, transpose_b, out_dtype),
                     _TorchCall(k, tuple(C.shape), C.dtype, spans, bias_type))


def _torch_repeat(A, B, out, bias, transpose_b, out_dtype):
    """A repeat of a remembered torch call description (see _remember_torch): the checks
    that depend on this call's tensors, then the launch; None where any differs (the
    checked path then runs, with its message)."""
    f = _TORCH_CALLS.get(_torch_key(A, B, out, bias, transpose_b, out_dtype))
    if f is None:
        return None
    torch = _TORCH
    dev = A.get_device()
    if dev < 0 or B.get_device() != dev or dev != torch._C._cuda_getDevice():
        return None
    if (A.requires_grad or B.requires_grad) and torch.is_grad_enabled():
        return None
    k = f.known
    a_ptr, b_ptr = A.data_ptr(), B.data_ptr()
    if k.align and (a_ptr | b_ptr) & 15:
        return None
    z = ()
    if bias is not None:
        if bias.get_device() != dev or (bias.requires_grad and torch.is_grad_enabled()):
            return None
        z = (bias.data_ptr(), f.bias_type)
    if out is None:
        where = f.devices.get(dev)
        if where is None:
            where = f.devices[dev] = torch.device("cuda", dev)
        C = torch.empty_strided(f.shape, f.strides, dtype=f.dtype, device=where)
        c_ptr = C.data_ptr()
    else:
        c_ptr = out.data_ptr()
        sa, sb, sc = f.spans
        if (out.get_device() != dev or (c_ptr < a_ptr + sa and a_ptr < c_ptr + sc)
                or (c_ptr < b_ptr + sb and b_ptr < c_ptr + sc)):
            return None   # the checked path refuses an out sharing an input's memory
        C = out
    bound = k.bound.get(dev)
    if bound is None:
        bound = k.bound[dev] = runtime_launch.bound(k.plan)
    stream = _RAW_STREAM(dev)
    # torch knows whether its current stream is being captured (one C call)
    graph = ((bound.needs_buffers or k.out16 is not None)
             and torch._C._cuda_isCurrentStreamCapturing())
    if k.out16 is None:
        runtime_launch.run(k.plan, a_ptr, b_ptr, c_ptr, stream, bound=bound, bias=z, graph=graph)
    else:
        runtime_launch.run_rounded(k.plan, a_ptr, b_ptr, c_ptr, k.out16, stream, bound=bound,
                             bias=z, graph=graph)
    return C


def _RAW_STREAM(dev: int) -> int:
    torch = _TORCH
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is None:
        return torch.cuda.current_stream(dev).cuda_stream
    globals()["_RAW_STREAM"] = raw   # one C call from now on
    return raw(dev)


def linear(x, weight, bias=None, **kwargs):
    """``torch.nn.functional.linear``: ``x @ weight.T + bias`` with ``weight`` of shape
    (out_features, in_features) as ``nn.Linear`` keeps it (read in place, no copy), ``x``
    of shape (..., in_features), ``bias`` of shape (out_features,) or None.  The bias is
    added in fp32 before the single rounding into the result's type.  ``kwargs``: as
    :func:`matmul` (``out``, ``kernel``, ``stream``, ``precision``, ``out_dtype``)."""
    return matmul(x, weight, transpose_b=True, bias=bias, **kwargs)


def _transposed(X, op: _Operand):
    """A 2-D operand's transpose, as an object (a view) and its description."""
    XT = X.T
    t = _Operand(op.obj.T, op.shape[::-1], op.dtype, op.layout == "F", op.on_host, op.ptr,
                 op.nbytes, op.device, op.kind, op.dname, op.bf16_from,
                 {"C": "F", "F": "C"}.get(op.layout, ""))
    return XT, t


def _stacked(A, B, a: _Operand, b: _Operand, out, bias, **kw):
    """Products of stacks, as ``torch.matmul``: ``(..., M, K) @ (K, N)`` as one product of
    the flattened rows; batch dimensions (broadcast) as one product per entry."""
    if len(a.shape) < 2 or len(b.shape) < 2:
        raise ValueError(f"matmul takes matrices or stacks of matrices: A has shape "
                         f"{a.shape}, B has shape {b.shape} (reshape a vector to (1, K) "
                         f"or (K, 1))")
    if _is_bf16array(A) or _is_bf16array(B):
        raise ValueError("stacks of BF16Array are not supported: pass torch or ml_dtypes "
                         "bfloat16 arrays, or one matrix at a time")
    K, N = b.shape[-2], b.shape[-1]
    if a.shape[-1] != K:
        raise ValueError(f"inner dimensions differ: A has shape {a.shape} and B {b.shape}; "
                         f"A @ B needs B's rows ({K}) to equal A's columns ({a.shape[-1]})")
    if len(b.shape) == 2:   # (..., M, K) @ (K, N): the rows of every matrix, one product
        lead = tuple(a.shape[:-1])
        rows = int(np.prod(lead))
        out2 = None if out is None else _flat_out(out, (rows, N))
        C = matmul(A.reshape(rows, K), B, out2, bias=bias, **kw)
        return out if out is not None else C.reshape(*lead, N)
    try:
        batch = np.broadcast_shapes(tuple(a.shape[:-2]), tuple(b.shape[:-2]))
    except ValueError:
        raise ValueError(f"batch dimensions do not broadcast: A has shape {a.shape}, "
                         f"B has shape {b.shape}") from None
    M = a.shape[-2]
    if out is not None and tuple(out.shape) != batch + (M, N):
        raise ValueError(f"out has shape {tuple(out.shape)}, but A @ B has shape "
                         f"{batch + (M, N)}")
    C = _one_launch(A, B, a, b, batch, out, bias, kw)
    if C is not None:
        return C
    C = out
    for idx in np.ndindex(*batch):
        Ai, Bi = A[_entry(idx, a.shape)], B[_entry(idx, b.shape)]
        if C is None:   # the first product tells the result's type and dtype
            first = matmul(Ai, Bi, bias=bias, **kw)
            C = _empty_stack(first, batch)
            C[idx] = first
            continue
        matmul(Ai, Bi, C[idx], bias=bias, **kw)
    if C is None:   # an empty batch: the type a product of these inputs would have
        first = matmul(A.reshape(-1, a.shape[-1])[:0, :0], B.reshape(-1, N)[:0], **kw)
        C = _empty_stack(first, batch, (M, N))
    return C


def _strides(op: _Operand) -> tuple:
    """An operand's strides in elements."""
    x = op.obj
    if op.kind == "torch":
        return tuple(x.stride())
    return tuple(s // x.itemsize for s in x.strides)


def _one_launch(A, B, a: _Operand, b: _Operand, batch: tuple, out, bias, kw):
    """A batch of 16-bit products as one launch of a batched rung (``wgmma_ws`` on
    Hopper, ``select_batched``), where the operands allow it: the same batch
    shape (no broadcast), A a contiguous stack, B a contiguous stack of row-major
    matrices or of column-major ones (``K.transpose(-1, -2)``), 16-byte rows, and no
    ``out``, kernel or precision named.  None where not: the caller loops."""
    if (out is not None or kw.get("kernel") not in (None, AUTO)
            or kw.get("precision") is not None or a.dname not in _SIXTEEN
            or b.dname != a.dname or (a.on_host and not SIMULATOR) or a.kind != b.kind
            or tuple(a.shape[:-2]) != batch or tuple(b.shape[:-2]) != batch):
        return None
    key = (a.kind, a.dname, a.shape, a.c_contiguous, b.shape, _strides(b),
           kw.get("out_dtype"), None if bias is None else tuple(bias.shape))
    known = _BATCHED.get(key)
    if known is None:
        known = _BATCHED.put(key, _batched_plan(a, b, batch, kw.get("out_dtype"),
                                                bias is not None))
    if not known:
        return None
    p, o16, b_layout = known
    (M, K), N, nb = a.shape[-2:], b.shape[-1], p.batch
    z = None if bias is None else _describe_bias(bias, a, N)
    stream = kw.get("stream")
    if a.on_host:   # the simulator: the stacks as the 2-D arrays the kernel takes
        A2 = np.ascontiguousarray(a.obj).view(np.uint16).reshape(nb * M, K)
        bk = b.obj if b_layout == "KN" else np.swapaxes(b.obj, -1, -2)   # (.., N, K)
        B2 = np.ascontiguousarray(bk).view(np.uint16).reshape(-1, bk.shape[-1])
        C = (_host16(np.empty(batch + (M, N), np.uint16), o16, a) if o16 else
             np.empty(batch + (M, N), np.float32))
        C2 = (C.view(np.uint16) if o16 else C).reshape(nb * M, N)
        Z = None if z is None else _kernel_array(z, np).reshape(1, N)
        runtime_launch.launch(p, A2, B2, C2, nb * M, N, K, stream=stream, bias=Z,
                        bias_type=_BIAS_TYPE[a.dname])
        return C
    if a.kind == "torch" and stream is None:
        stream = _torch_current_stream(a.device)
    if a.ptr % 16 or b.ptr % 16:
        return None
    C = _allocate_stack(batch + (M, N), o16 or "float32", a)
    bias_arg = () if z is None else (z.ptr, _BIAS_TYPE[z.dname])
    runtime_launch.run(p, a.ptr, b.ptr, _out_ptr(C), stream_handle(stream), bias=bias_arg)
    return C


#: what _batched_plan concluded for operands described alike
_BATCHED = LRU(1024)


def _batched_plan(a: _Operand, b: _Operand, batch: tuple, out_dtype, bias: bool):
    """(plan, C's 16-bit type or None, B's layout) of a batch as one launch, or () where
    the operands do not allow it (see _one_launch)."""
    (M, K), N = a.shape[-2:], b.shape[-1]
    nb = int(np.prod(batch))
    sb = _strides(b)
    if not a.c_contiguous or M * N * K * nb == 0 or K % 8:
        return ()
    if b.c_contiguous:
        b_layout = "KN"
        if N % 8 or K % 64:   # a (K, N) B: no k-tile may reach the next product's rows
            return ()
    elif _c_contiguous(b.shape[:-2] + (N, K), sb[:-2] + (sb[-1], sb[-2]), 1):
        b_layout = "NK"
    else:
        return ()
    o16 = _out_type(out_dtype, a, None)
    spec = select_batched(_PRECISION_OF[a.dname], M, N, K,
                                   _OUT_KIND.get(o16, "fp32"), b_layout, bias)
    if spec is None:
        return ()
    return plans.plan(spec, M, N, K, batch=nb), o16, b_layout


#: the tensor-core precision of 16-bit inputs
_PRECISION_OF = {"float16": "fp16", "bfloat16": "bf16"}


def _allocate_stack(shape: tuple, dname: str, like: _Operand):
    """An uninitialised stack for a batched launch's C, in A's own array type."""
    if like.kind == "torch":
        return _torch().empty(shape, dtype=getattr(_torch(), dname), device=like.obj.device)
    xp = backend.array_module()
    if dname == "bfloat16":
        from gemmlib.precision import BF16Array

        return BF16Array(xp.empty(shape, np.uint16))
    return xp.empty(shape, dtype=dname)


def _entry(idx: tuple, shape: tuple) -> tuple:
    """The index of batch entry ``idx`` (of the broadcast batch shape) in an operand of
    ``shape``: its own batch dimensions are the trailing ones, size 1 broadcast."""
    own = shape[:-2]
    idx = idx[len(idx) - len(own):] if own else ()
    return tuple(0 if n == 1 else i for i, n in zip(idx, own))


def _flat_out(out, shape):
    """``out`` of a stack's shape as the one (rows, N) matrix it is in memory."""
    try:
        if hasattr(out, "data_ptr"):   # torch: view() refuses what would need a copy
            return out.view(*shape)
        if not getattr(out, "flags", {"C_CONTIGUOUS": False})["C_CONTIGUOUS"]:
            raise ValueError
        return out.reshape(shape)
    except Exception:
        raise ValueError(f"out of shape {tuple(out.shape)} cannot be viewed as one "
                         f"{shape[0]} x {shape[1]} matrix: pass a contiguous out") from None


def _empty_stack(first, batch: tuple, matrix: tuple | None = None):
    """An uninitialised stack of ``batch`` results typed like ``first`` (shaped like it,
    or ``matrix``)."""
    torch = _torch()
    shape = batch + (tuple(first.shape) if matrix is None else matrix)
    if torch is not None and isinstance(first, torch.Tensor):
        return torch.empty(shape, dtype=first.dtype, device=first.device)
    if isinstance(first, np.ndarray):
        return np.empty(shape, dtype=first.dtype)
    if type(first).__module__.startswith("numba"):
        return cuda.device_array(shape, dtype=first.dtype)
    return backend.array_module().empty(shape, dtype=first.dtype)


_FP8 = ("e4m3", "e5m2")

#: ``out_dtype`` spellings, by the element type they name
_OUT_NAMES = {"float32": "float32", "fp32": "float32", "float16": "float16",
              "fp16": "float16", "half": "float16", "bfloat16": "bfloat16", "bf16": "bfloat16"}
_SIXTEEN = ("float16", "bfloat16")
#: the wgmma rungs' OUT for each 16-bit element type
_OUT_KIND = {"float16": "fp16", "bfloat16": "bf16"}


@lru_cache(maxsize=256)
def _out_name(out_dtype) -> str:
    """``out_dtype`` (a torch or NumPy dtype, a type, a name) as "float32", "float16" or
    "bfloat16"; ValueError for anything else."""
    if isinstance(out_dtype, str):
        name = out_dtype
    elif str(out_dtype).startswith("torch."):
        name = str(out_dtype)[6:]
    else:
        try:
            name = np.dtype(out_dtype).name   # numpy/cupy float16, ml_dtypes.bfloat16
        except TypeError:
            name = str(out_dtype)
    if name not in _OUT_NAMES:
        raise ValueError(f"out_dtype must be float32 or the inputs' own 16-bit type "
                         f"(torch.float16, torch.bfloat16, numpy.float16, or 'float16', "
                         f"'fp16', 'bfloat16', 'bf16'); got {out_dtype!r}")
    return _OUT_NAMES[name]


def _out_type(out_dtype, a: _Operand, c: _Operand | None) -> str | None:
    """What C holds, from ``out_dtype`` and ``out`` (described as ``c``): None (float32:
    float32 inputs, or an ``out`` of float32), "float32" (asked for), "float16" or
    "bfloat16" (the inputs' own type: the default for 16-bit inputs, as torch.matmul)."""
    want = None if out_dtype is None else _out_name(out_dtype)
    if want is None:
        if c is None:
            return a.dname if a.dname in _SIXTEEN else None
        if c.dname in _SIXTEEN and a.dname in _SIXTEEN:
            if c.dname != a.dname:
                raise TypeError(f"out holds {c.dname}; a product of {a.dname} inputs is "
                                f"written as float32 or {a.dname}")
            return c.dname
        return None
    if want in _SIXTEEN and a.dname != want:
        raise TypeError(f"out_dtype={want} needs {want} inputs (a product is written as "
                        f"float32 or in its inputs' own 16-bit type); A is {a.dname}")
    if c is not None and c.dname != want:
        raise TypeError(f"out holds {c.dname}, but out_dtype is {want}: pass an out of "
                        f"that dtype, or leave out_dtype None")
    return want


def _like_input(C, A):
    """The result in A's own array type, for inputs that came in through NumPy or DLPack
    (a torch CPU tensor, a JAX array); anything else gets the array as computed."""
    torch = _torch()
    if torch is not None and isinstance(A, torch.Tensor):
        from gemmlib.precision import BF16Array

        if isinstance(C, BF16Array):   # bfloat16 bits (NumPy) -> a torch bfloat16 tensor
            return torch.from_numpy(C.bits.view(np.int16)).view(torch.bfloat16)
        return torch.from_numpy(C) if isinstance(C, np.ndarray) else torch.from_dlpack(C)
    mod = sys.modules.get(type(A).__module__.split(".")[0])
    if mod is not None and mod.__name__ in ("jax", "jaxlib"):
        return sys.modules["jax"].numpy.from_dlpack(C)
    return C


# --------------------------------------------------------------------------
# Calls already checked: the short path


#: what the checks of an earlier call concluded (gemmlib.runtime.calls.Call)
_Known = Call


_RECORD = threading.local()  # the long path leaves its conclusion here


def _call_key(a: _Operand, b: _Operand, c: _Operand | None, kernel, precision,
              out_type: str | None = None, z: _Operand | None = None):
    """A key for calls whose checks must conclude alike, or None (long path only)."""
    if a.kind not in ("cupy", "torch"):
        return None
    if not (kernel is None or type(kernel) is str):
        if type(kernel) is not KernelSpec:
            return None
        # A spec by identity (its params dict makes it unhashable): the entry keeps the spec
        # alive (_Known.kernel), so no other spec can take its id while the entry lives.
        kernel = ("spec", id(kernel))
    ck = None if c is None else (c.kind, c.dname, c.dtype, c.shape, c.c_contiguous)
    zk = None if z is None else (z.kind, z.dname, z.shape, z.c_contiguous)
    return (a.kind, a.dname, a.dtype, a.shape, a.layout,
            b.kind, b.dname, b.dtype, b.shape, b.layout, ck, kernel, precision, out_type, zk)


def _still_holds(k: _Known, a: _Operand, b: _Operand, c: _Operand | None) -> bool:
    # (the bias, when there is one, is read in place: any address will do)
    """The checks that depend on this call's pointers and the current device."""
    if k.align and (a.ptr % 16 or b.ptr % 16):
        return False  # the long path pads
    if c is not None and (_overlap(c, a) or _overlap(c, b)):
        return False  # the long path refuses, with its message
    current = _current_device()
    for op in (a, b) if c is None else (a, b, c):
        if op.device is not None and op.device != current:
            return False
    return True


def _current_device() -> int:
    return driver().current_device()


def _run_known(k: _Known, a, b, c, out, stream, z=None):
    p = k.plan
    device = _current_device()
    if out is None:
        C = _new_output(k, a, device)
        c_ptr = _out_ptr(C)
    else:
        C, c_ptr = out, c.ptr
    bound = k.bound.get(device)
    if bound is None:   # loaded in this device's context once; then no context query
        bound = k.bound[device] = runtime_launch.bound(p)
    bias = () if z is None else (z.ptr, _BIAS_TYPE[z.dname])
    if k.out16 is None:
        runtime_launch.run(p, a.ptr, b.ptr, c_ptr, stream_handle(stream), bound=bound,
                     bias=bias)
    else:
        runtime_launch.run_rounded(p, a.ptr, b.ptr, c_ptr, k.out16, stream_handle(stream),
                             bound=bound, bias=bias)
    return C


#: a bias's element type as the kernels name it
_BIAS_TYPE = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}


def _describe_bias(bias, a: _Operand, N: int) -> _Operand:
    """The bias row, checked: N values of the inputs' type (float32 for float32 inputs),
    contiguous, where the inputs are."""
    z = _describe(bias, "bias")
    if tuple(z.shape) not in ((N,), (1, N)):
        raise ValueError(f"bias has shape {tuple(z.shape)}; a product with N = {N} columns "
                         f"takes a bias of shape ({N},)")
    want = a.dname if a.dname in _SIXTEEN else "float32"
    if z.dname != want:
        raise TypeError(f"bias has dtype {z.dname}, but the inputs are {a.dname}: pass it as "
                        f"{_astype_hint(z, 'bias', want)}")
    if z.on_host != a.on_host:
        raise TypeError("bias must be where A and B are (all on the GPU or all on the host)")
    if not z.on_host:
        if not z.c_contiguous:
            raise ValueError(f"bias is not contiguous: pass {_contiguous_hint(z, 'bias')}")
        if z.device is not None and a.device is not None and z.device != a.device:
            raise ValueError(f"bias lives on GPU {z.device} but A on GPU {a.device}")
    return z


def _new_output(k: _Known, a: _Operand, device: int):
    p = k.plan
    if a.kind == "torch":
        dev = k.devices.get(device)
        if dev is None:
            dev = k.devices[device] = _torch().device("cuda", device)
        return _torch().empty((p.M, p.N), dtype=k.out_dtype, device=dev)
    return backend.array_module().empty((p.M, p.N), dtype=k.out_dtype)


def _out_ptr(C) -> int:
    if type(C) is _cupy_ndarray():
        return C.data.ptr
    if hasattr(C, "data_ptr"):
        return C.data_ptr()
    return C.__cuda_array_interface__["data"][0]


def _remember(plan, a: _Operand, C, align: int, out16: str | None = None) -> None:
    """The long path launched ``plan`` on these operands as they are (``out16``: through
    gemmlib.runtime.launch.run_rounded): remember it."""
    if a.kind in ("cupy", "torch"):
        _RECORD.known = _Known(plan, C.dtype, align, out16)


def _matmul(a, b, c, out, kernel, stream, precision, o16=None, z=None):
    """matmul's long path: every check, with its message.  ``o16``: see _out_type;
    ``z``: the bias, described."""
    if precision is None and isinstance(kernel, KernelSpec):
        precision = kernel.precision
    elif precision is None and isinstance(kernel, str) and kernel != AUTO:
        named = get_spec(kernel).precision   # a tf32-only rung (wgmma_tf32) by name
        precision = named if named in ("tf32", "3xtf32") else None
    if precision not in (None, "fp32") or _sixteen_bit_default(a, kernel):
        from gemmlib.precision import check_precision

        prec = check_precision(precision, a.dname)
        if prec != "fp32":
            return _tensor_core_call(prec, a, b, c, out, kernel, stream, o16, z)
    kernel = kernel or DEFAULT_KERNEL
    auto = isinstance(kernel, str) and kernel == AUTO
    # The spec the operand checks read (dtype); "auto" resolves per shape below.
    M, N, K = _check_operands(get_spec(AUTO_RUNG if auto else kernel),
                              a, b, c)
    backend.require_device()
    if a.on_host and not SIMULATOR:  # host in, host out: stage through the GPU
        return _staged(a, b, c, out, z, stream, kernel=kernel)
    spec = select(M, N, K) if auto else get_spec(kernel)
    if z is not None:
        spec = with_bias(spec)
    return _launched(a, b, c, out, z, spec, stream, M, N, K, None, None)


def _sixteen_bit_default(a: _Operand, kernel) -> bool:
    """16-bit inputs with no fp32 rung named: they run in their own precision.

    Naming a CUDA-core rung with 16-bit inputs (or passing any other dtype)
    falls through to the fp32 checks, whose TypeError names ``astype``.
    """
    if a.dname not in ("float16", "bfloat16"):
        return False
    if kernel is None or (isinstance(kernel, str) and kernel == AUTO):
        return True
    return get_spec(kernel).precision != "fp32"


def _tensor_core_call(prec, a, b, c, out, kernel, stream, o16=None, z=None):
    """matmul in a tensor-core precision (operands described, precision checked).
    ``o16`` (see _out_type): "float16" / "bfloat16" for a C in the inputs' own type."""
    kernel = kernel or AUTO
    auto = isinstance(kernel, str) and kernel == AUTO
    check_spec = (kernel if isinstance(kernel, KernelSpec) else
                  get_spec(TC_AUTO if auto else kernel, prec))
    if check_spec.precision != prec:
        raise ValueError(f"kernel {check_spec.name!r} computes in {check_spec.precision}, "
                         f"not {prec}")
    if check_spec.out_dtype == "uint16":   # a spec built with a 16-bit OUT writes that
        if o16 == "float32":
            raise ValueError(f"kernel {check_spec.name!r} writes {a.dname}, not float32")
        o16 = a.dname
    o16 = None if o16 == "float32" else o16
    M, N, K = _check_operands(check_spec, a, b, c, out_dtype=o16)
    backend.require_device()
    if a.on_host and not SIMULATOR:  # host in, host out: stage through the GPU
        return _staged(a, b, c, out, z, stream, kernel=kernel, precision=prec,
                       out_dtype=o16 or "float32")
    okind = _OUT_KIND.get(o16, "fp32")
    if auto:
        spec = select_tc(prec, M, N, K, out=okind,
                                  b_layout="NK" if b.layout == "F" else "KN")
    else:   # a rung by name: its 16-bit epilogue where it has one; a KernelSpec as given
        spec = with_out(check_spec, okind) if isinstance(kernel, str) else check_spec
    if z is not None:
        biased = with_bias(spec)
        # a 16-bit epilogue without the bias: its float32 build, then the bias and the
        # rounding in one more kernel (one rounding, as with the bias in the epilogue)
        spec = biased if biased.bias_arg else with_out(spec, "fp32")
    #: a 16-bit C the kernel does not write itself ("fp16"/"bf16", else None): it writes
    #: float32, which one more kernel rounds into C (gemmlib.runtime.launch.run_rounded)
    out16 = okind if o16 is not None and spec.out_dtype != "uint16" else None
    return _launched(a, b, c, out, z, spec, stream, M, N, K, o16, out16)


def _staged(a, b, c, out, z, stream, **kw):
    """Host operands (NumPy, torch CPU tensors): copied to the GPU, the product there, the
    result copied back -- all on ``stream``, in order with the kernel."""
    xp = backend.array_module()
    o16 = kw.get("out_dtype")
    o16 = None if o16 in (None, "float32") else o16
    with _staging_stream(stream):
        dev = [_to_device(op, xp) for op in (a, b)]
        bias = None if z is None else _to_device(z, xp)
        C = matmul(*dev, stream=stream, bias=bias, **kw)
        result = xp.asnumpy(C if o16 is None else _bits_of(C, False, xp))  # waits
    if out is None:
        return result if o16 is None else _host16(result, o16, a)
    (c.obj if o16 is None else _bits_of(c.obj, True, np))[...] = result
    return out


def _launched(a, b, c, out, z, spec, stream, M, N, K, o16, out16):
    """The product with ``spec`` on operands where they are (GPU, or NumPy in the
    simulator): A read row-major and B as the spec reads it -- in place where they lie
    so, else copied -- padded where the spec's 16-byte pieces need it; C allocated
    unless given.  Remembers what a repeat may skip (:func:`_remember`)."""
    xp = np if a.on_host else _TorchArrays(a) if a.kind == "torch" else backend.array_module()
    # Every copy below runs on the kernel's stream, in order with the caller's work.
    with (nullcontext() if a.on_host else _torch_stream(stream) if a.kind == "torch"
          else _staging_stream(stream)):
        a, b, spec, copied = _fit_layouts(a, b, spec, stream)
        nk = spec.b_operand == "NK"
        km = spec.a_operand == "KM"
        A_ = _kernel_array(_t(a) if km else a, xp)   # KM: the (K, M) row-major memory
        B_ = _kernel_array(_t(b) if nk else b, xp)   # NK: the (N, K) row-major memory
        Z_ = None if z is None else _kernel_array(z, xp).reshape(1, N)
        al = spec.operand_align
        misaligned = bool(al) and not a.on_host and (a.ptr % 16 or b.ptr % 16)
        Kp, Np = K, N
        if al and (K % al or N % al or misaligned):   # stage into zero-padded, aligned copies
            Kp, Np = -(-K // al) * al, -(-N // al) * al
            A_ = _padded(A_, Kp, M, xp) if km else _padded(A_, M, Kp, xp)
            B_ = _padded(B_, Np, Kp, xp) if nk else _padded(B_, Kp, Np, xp)
            if Z_ is not None and Np != N:
                Z_ = _padded(Z_, 1, Np, xp)
        if out is not None:
            C = c.obj if a.on_host else out  # host: the NumPy view of out (a torch CPU tensor)
        elif o16 is not None:
            C = _allocate16(M, N, o16, a)
        elif a.on_host:
            C = np.empty((M, N), dtype=np.dtype(spec.out_dtype) if spec.precision == "fp32"
                         else np.float32)
        else:
            C = _allocate_output(M, N, np.float32, like=a)
        # dst: what the kernel writes when N is not padded (16-bit C: its bits)
        dst = C if o16 is None else _bits_of(C, a.on_host, xp)
        Ck = dst if Np == N else xp.empty((M, Np), dtype=np.float32 if o16 is None else np.uint16)
        if M != 0 and N != 0:
            plan = plans.plan(spec, M, Np, Kp)  # ConstraintError here
            btype = None if z is None else _BIAS_TYPE[z.dname]
            if a.on_host:  # simulator
                runtime_launch.launch(plan, A_, B_, Ck, M, Np, Kp, stream=stream, out16=out16,
                                bias=Z_, bias_type=btype or "fp32")
            else:
                args = (plan, _ptr(A_), _ptr(B_), _ptr(Ck))
                bias = () if z is None else (_ptr(Z_), btype)
                if out16:
                    runtime_launch.run_rounded(*args, out16, stream_handle(stream),
                                         bias=bias)
                else:
                    runtime_launch.run(*args, stream_handle(stream), bias=bias)
                if (Ck is dst and Kp == K and not misaligned and not copied
                        and not _is_bf16array(C)):
                    _remember(plan, a, C, al, out16)   # no staging: a repeat can skip it all
            if Ck is not dst:   # drop the padded columns (in order on the same stream)
                (dst if a.on_host else xp.asarray(dst))[...] = Ck[:, :N]
    return C if out is None else out


def _t(op: _Operand) -> _Operand:
    """The description of a 2-D operand's transpose (a view of the same memory)."""
    return _transposed(op.obj, op)[1]


def _fit_layouts(a: _Operand, b: _Operand, spec: KernelSpec, stream):
    """(a, b, spec, copied): A row-major, B in the layout ``spec`` reads -- a column-major
    B goes to the spec's K-major ("NK") build where the rung has one -- and a copy in
    the right order of any operand that lies otherwise."""
    copied = False
    a_want = "KM" if a.layout == "F" else "MK"
    if spec.a_operand != a_want:   # the rung's build for A as it lies, where it has one
        spec = with_a_layout(spec, a_want, a.shape[0]) or spec
    if spec.a_operand == "KM" and a.shape[0] % (spec.operand_align or 1):
        spec = with_a_layout(spec, "MK", a.shape[0]) or spec   # M short of a row
    want = "F" if spec.a_operand == "KM" else "C"
    if a.layout != want:
        a, copied = _copied(a, want, stream), True
    if b.layout == "F" and spec.b_operand == "KN":
        nk = with_layout(spec, "NK")
        if nk is not None:
            spec = nk
    want = "F" if spec.b_operand == "NK" else "C"
    if b.layout != want:
        b, copied = _copied(b, want, stream), True
    return a, b, spec, copied


def _copied(op: _Operand, order: str, stream) -> _Operand:
    """``op``'s elements in a new array, row-major ("C") or column-major ("F"), made by
    the operand's own framework on ``stream`` (the caller's context for CuPy is set)."""
    x = op.obj
    if op.on_host:
        y = np.ascontiguousarray(x) if order == "C" else np.asfortranarray(x)
    elif op.kind == "torch":
        with _torch_stream(stream):
            y = x.contiguous() if order == "C" else x.t().contiguous().t()
    else:
        xp = backend.array_module()
        x = x if type(x) is _cupy_ndarray() else xp.asarray(x)
        y = xp.ascontiguousarray(x) if order == "C" else xp.asfortranarray(x)
    if op.kind == "torch":
        n = _describe_torch(y)
    elif op.on_host:
        n = _Operand(y, y.shape, y.dtype, order == "C", True, layout=order)
    else:
        n = _describe_cupy(y)
        n.kind = op.kind if op.kind != "numba" else "cupy"
    n.dname, n.bf16_from = op.dname, op.bf16_from
    return n


def _torch_stream(stream):
    """A context that makes ``stream`` torch's current stream (torch's own: nothing)."""
    torch = _torch()
    if stream is None or isinstance(stream, _RawStream):
        return nullcontext()
    if hasattr(stream, "cuda_stream"):
        return torch.cuda.stream(stream)
    return torch.cuda.stream(torch.cuda.ExternalStream(stream_handle(stream)))


def _is_bf16array(x) -> bool:
    from gemmlib.precision import BF16Array

    return isinstance(x, BF16Array)


def _bits_of(x, on_host: bool, xp):
    """A 16-bit array (float16, bfloat16 of any carrier, int16/uint16 bits) as a uint16
    view of the same memory: NumPy on the host, else CuPy (torch tensors through CAI)."""
    if _is_bf16array(x):
        x = x.bits
    if on_host:
        return x.view(np.uint16)
    torch = _torch()
    if torch is not None and isinstance(x, torch.Tensor):
        if isinstance(xp, _TorchArrays):
            return x.view(torch.int16)   # the kernel takes the bits; no CuPy needed
        x = x.view(torch.int16)   # torch exports no bfloat16 through CAI
    x = x if type(x) is _cupy_ndarray() else xp.asarray(x)
    return x.view(np.uint16)


def _host16(bits: np.ndarray, o16: str, a: _Operand):
    """16-bit result bits on the host as the caller's type: float16, or bfloat16 as the
    inputs carried it (an ml_dtypes array, else a BF16Array; matmul makes torch CPU
    results torch tensors)."""
    if o16 == "float16":
        return bits.view(np.float16)
    if a.bf16_from == "ml_dtypes":
        import ml_dtypes

        return bits.view(ml_dtypes.bfloat16)
    from gemmlib.precision import BF16Array

    return BF16Array(bits)


def _allocate16(M: int, N: int, o16: str, a: _Operand):
    """A 16-bit C for inputs described as ``a``: NumPy on the host, else in A's own type
    (a torch tensor of that dtype, CuPy / numba float16, a BF16Array of CuPy bits)."""
    if a.on_host:
        return _host16(np.empty((M, N), np.uint16), o16, a)
    if a.kind == "torch":
        return _allocate_output(M, N, o16, like=a)
    if o16 == "float16":
        return _allocate_output(M, N, np.float16, like=a)
    from gemmlib.precision import BF16Array

    return BF16Array(_allocate_output(M, N, np.uint16, like=a))


def _kernel_array(op: _Operand, xp):
    """The operand as an array the kernel can take: raw 16-bit patterns for 16-bit inputs;
    NumPy (simulator, private copy when read-only) or a GPU array."""
    x = op.obj
    if op.on_host:   # (a size-1 dimension may carry any stride: TMA maps read the strides)
        canonical = x.strides == np.empty(x.shape, x.dtype).strides
        if not (x.flags.c_contiguous and x.flags.writeable and canonical):
            x = np.array(x, order="C")
        return x.view(np.uint16) if x.dtype.itemsize == 2 else x
    if op.kind == "torch":
        x = x.detach()   # CAI refuses a tensor that requires grad (no autograd here)
        if op.dname == "bfloat16":
            x = x.view(_torch().int16)  # torch exports no bfloat16 through CAI; the bits do
        if isinstance(xp, _TorchArrays):
            return x
    return x if type(x) is _cupy_ndarray() else xp.asarray(x)


def _to_device(op: _Operand, xp):
    """A host operand copied to the GPU (bfloat16 as a BF16Array of its bits)."""
    x = np.ascontiguousarray(op.obj)
    if op.dname == "bfloat16":
        from gemmlib.precision import BF16Array

        return BF16Array(xp.asarray(x.view(np.uint16)))
    return xp.asarray(x)


class _TorchArrays:
    """The few array operations the launch path needs, for torch operands, done by torch
    on its current stream (a torch caller's process never imports CuPy)."""

    def __init__(self, like: _Operand):
        self.device = like.obj.device

    def _dtype(self, dtype):
        torch = _torch()
        if isinstance(dtype, torch.dtype):
            return dtype
        name = np.dtype(dtype).name
        return torch.int16 if name == "uint16" else getattr(torch, name)

    def empty(self, shape, dtype):
        return _torch().empty(shape, dtype=self._dtype(dtype), device=self.device)

    def zeros(self, shape, dtype):
        return _torch().zeros(shape, dtype=self._dtype(dtype), device=self.device)

    def asarray(self, x):
        return x


def _padded(x, rows: int, cols: int, xp):
    """``x`` in the top-left corner of a zero (rows, cols) array of its dtype."""
    p = xp.zeros((rows, cols), dtype=x.dtype)
    p[:x.shape[0], :x.shape[1]] = x
    return p


def _ptr(x) -> int:
    return _out_ptr(x)


def _allocate_output(M: int, N: int, dtype, like: _Operand):
    """C on the GPU in A's own type (torch, numba, else CuPy); a clear MemoryError when it
    cannot fit."""
    try:
        if like.kind == "numba":
            return cuda.device_array((M, N), dtype=dtype)
        if like.kind == "torch":   # dtype: a NumPy dtype, or a name ("bfloat16")
            torch = _torch()
            name = dtype if isinstance(dtype, str) else np.dtype(dtype).name
            return torch.empty((M, N), dtype=getattr(torch, name), device=like.obj.device)
        return backend.array_module().empty((M, N), dtype=dtype)
    except Exception as e:
        if not (isinstance(e, MemoryError) or "OUT_OF_MEMORY" in str(e).upper()
                or "out of memory" in str(e).lower()):
            raise
        size = M * N * (2 if dtype == "bfloat16" else np.dtype(dtype).itemsize)
        raise MemoryError(
            f"out of GPU memory allocating C ({M} x {N} "
            f"{dtype if isinstance(dtype, str) else np.dtype(dtype)}, "
            f"{size / 2**30:.2f} GiB): "
            f"{e}. Free memory (e.g. cupy.get_default_memory_pool().free_all_blocks()), "
            f"split the problem, or pass a preallocated out=") from e


def launch(spec: KernelSpec, A, B, C, M: int, N: int, K: int, stream=None) -> None:
    """Launch ``spec`` on arrays the kernel can take as they are (no operand checks)."""
    runtime_launch.launch(spec, A, B, C, M, N, K, stream=stream)


_torch()   # a process that imported torch first: its tensors take the lean path at once
