"""``gemmlib.matmul`` and ``gemmlib.linear``: the route of a call, top to bottom.

1. torch tensors as they come: a repeat of a call already checked launches at once
   (:func:`gemmlib.paths.repeat.torch_repeat`: no description, a few checks);
2. the operands described by their front end (:mod:`gemmlib.frontends`: CuPy, torch,
   NumPy, numba, DLPack, bfloat16 carriers), once per call;
3. the path: FP8 (:mod:`gemmlib.paths.fp8`); stacks (flattened, one batched launch --
   :mod:`gemmlib.paths.batched` -- or one product per entry); a repeat of a checked
   description (:mod:`gemmlib.paths.repeat`); else every check, the spec chosen (fp32
   on the CUDA cores, or a tensor-core precision) and the product run on the operands
   where they lie (:mod:`gemmlib.paths.product`), host operands staged through the GPU;
4. each path prepares its call and runs it (:mod:`gemmlib.runtime.calls`), on the
   framework's own current stream (torch's for torch tensors).
"""

from __future__ import annotations

import numpy as np

from gemmlib import backend
from gemmlib.fp8 import fp8_format
from gemmlib.frontends.allocate import (bits_of, empty_stack, host16, is_bf16array, like_input,
                                        to_device)
from gemmlib.frontends.arrays import staging_stream
from gemmlib.frontends.checks import FP8, check_stream, describe_bias, out_type
from gemmlib.frontends.describe import describe
from gemmlib.frontends.operand import Operand, transposed
from gemmlib.frontends.torch_tensors import TENSOR, current_stream, tensor_types
from gemmlib.kernels import SCALED
from gemmlib.paths.batched import one_launch
from gemmlib.paths.fp8 import matmul_fp8
from gemmlib.paths.product import product
from gemmlib.paths.repeat import (RECORD, call_key, remember_torch, run_known, still_holds,
                                  torch_repeat)
from gemmlib.runtime.calls import CALLS
from gemmlib.runtime.launch import launch as launch_arrays
from gemmlib.runtime.select import DEFAULT_KERNEL  # noqa: F401  (gemmlib's, as before)
from gemmlib.spec import KernelSpec


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
        ``auto`` choices everywhere), a column-major A by the Hopper fp16/bf16 rungs' and
        the fp32 CUDA-core rungs' ``A_LAYOUT="KM"`` builds (Hopper's tf32 rung transposes
        it with its own pass first, as it does a row-major B); anything else -- another
        rung, views with no unit stride (``A[:, ::2]``, a gap between rows) -- is copied
        into row-major order first, on the call's stream (the result is the same; the copy
        costs time).
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
        GPU (see ``gemmlib.select``).  Each configuration is compiled once per
        process and its machine code cached on disk (``gemmlib.dispatch``).
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
    tensor = TENSOR or tensor_types()
    if type(A) in tensor and type(B) in tensor:   # torch's own calls: the lean path first
        plain = (kernel is None and stream is None and precision is None and scale_a is None
                 and scale_b is None)
        if plain:
            C = torch_repeat(A, B, out, bias, transpose_b, out_dtype)
            if C is not None:
                return C
            RECORD.known = None
        C = _matmul_checked(A, B, out, kernel, stream, transpose_b, precision, scale_a,
                            scale_b, out_dtype, bias)
        if plain and RECORD.known is not None:
            remember_torch(A, B, out, bias, transpose_b, out_dtype, C)
        return C
    return _matmul_checked(A, B, out, kernel, stream, transpose_b, precision, scale_a,
                           scale_b, out_dtype, bias)


def _matmul_checked(A, B, out, kernel, stream, transpose_b, precision, scale_a, scale_b,
                    out_dtype, bias):
    """matmul with every check (a repeat of a checked description skips most of them)."""
    if stream is not None:
        check_stream(stream)
    a, b = describe(A, "A"), describe(B, "B")
    if (precision in FP8 or a.dname.startswith("float8") or kernel in SCALED
            or getattr(kernel, "precision", None) in FP8):
        if bias is not None:
            raise ValueError("bias is not supported with FP8 inputs")
        fmt = fp8_format(a.dname, precision) or (
            kernel.precision if isinstance(kernel, KernelSpec) else "e4m3")
        if a.kind == "torch" and stream is None:
            stream = current_stream(a.device)
        return matmul_fp8(A, B, a, b, fmt, scale_a=scale_a, scale_b=scale_b,
                          out_dtype=out_dtype, out=out, kernel=kernel, stream=stream,
                          transpose_b=transpose_b)
    if scale_a is not None or scale_b is not None:
        raise ValueError("scale_a and scale_b apply to FP8 inputs only")
    if transpose_b:
        if len(b.shape) != 2:
            raise ValueError(f"transpose_b=True takes a 2-D B of shape (N, K); got {b.shape}")
        B, b = transposed(B, b)
    if len(a.shape) != 2 or len(b.shape) != 2:
        return _stacked(A, B, a, b, out, bias, kernel=kernel, stream=stream,
                        precision=precision, out_dtype=out_dtype)
    c = describe(out, "out") if out is not None else None
    o16 = out_type(out_dtype, a, c)
    if a.kind == "torch" and stream is None:
        stream = current_stream(a.device)
    z = describe_bias(bias, a, b.shape[1]) if bias is not None else None
    key = call_key(a, b, c, kernel, precision, o16, z)
    if key is not None:
        known = CALLS.get(key)
        if known is not None and still_holds(known, a, b, c):
            RECORD.known = known   # (a torch caller's lean path may remember it)
            return run_known(known, a, b, c, out, stream, z)
    RECORD.known = None
    C = product(a, b, c, out, kernel, stream, precision, o16, z, _staged)
    if key is not None and RECORD.known is not None:
        RECORD.known.kernel = kernel
        CALLS.put(key, RECORD.known)
    if out is None and a.kind in ("numpy", "dlpack") and not isinstance(A, np.ndarray):
        C = like_input(C, A)
    return C


def linear(x, weight, bias=None, **kwargs):
    """``torch.nn.functional.linear``: ``x @ weight.T + bias`` with ``weight`` of shape
    (out_features, in_features) as ``nn.Linear`` keeps it (read in place, no copy), ``x``
    of shape (..., in_features), ``bias`` of shape (out_features,) or None.  The bias is
    added in fp32 before the single rounding into the result's type.  ``kwargs``: as
    :func:`matmul` (``out``, ``kernel``, ``stream``, ``precision``, ``out_dtype``)."""
    return matmul(x, weight, transpose_b=True, bias=bias, **kwargs)


def _stacked(A, B, a: Operand, b: Operand, out, bias, **kw):
    """Products of stacks, as ``torch.matmul``: ``(..., M, K) @ (K, N)`` as one product of
    the flattened rows; batch dimensions (broadcast) as one product per entry."""
    if len(a.shape) < 2 or len(b.shape) < 2:
        raise ValueError(f"matmul takes matrices or stacks of matrices: A has shape "
                         f"{a.shape}, B has shape {b.shape} (reshape a vector to (1, K) "
                         f"or (K, 1))")
    if is_bf16array(A) or is_bf16array(B):
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
    C = one_launch(A, B, a, b, batch, out, bias, kw)
    if C is not None:
        return C
    C = out
    for idx in np.ndindex(*batch):
        Ai, Bi = A[_entry(idx, a.shape)], B[_entry(idx, b.shape)]
        if C is None:   # the first product tells the result's type and dtype
            first = matmul(Ai, Bi, bias=bias, **kw)
            C = empty_stack(first, batch)
            C[idx] = first
            continue
        matmul(Ai, Bi, C[idx], bias=bias, **kw)
    if C is None:   # an empty batch: the type a product of these inputs would have
        first = matmul(A.reshape(-1, a.shape[-1])[:0, :0], B.reshape(-1, N)[:0], **kw)
        C = empty_stack(first, batch, (M, N))
    return C


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


def _staged(a, b, c, out, z, stream, **kw):
    """Host operands (NumPy, torch CPU tensors): copied to the GPU, the product there, the
    result copied back -- all on ``stream``, in order with the kernel."""
    xp = backend.array_module()
    o16 = kw.get("out_dtype")
    o16 = None if o16 in (None, "float32") else o16
    with staging_stream(stream):
        dev = [to_device(op, xp) for op in (a, b)]
        bias = None if z is None else to_device(z, xp)
        C = matmul(*dev, stream=stream, bias=bias, **kw)
        result = xp.asnumpy(C if o16 is None else bits_of(C, False, xp))  # waits
    if out is None:
        return result if o16 is None else host16(result, o16, a)
    (c.obj if o16 is None else bits_of(c.obj, True, np))[...] = result
    return out


def launch(spec: KernelSpec, A, B, C, M: int, N: int, K: int, stream=None) -> None:
    """Launch ``spec`` on arrays the kernel can take as they are (no operand checks)."""
    launch_arrays(spec, A, B, C, M, N, K, stream=stream)
