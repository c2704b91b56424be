"""The FP8 path: ``gemmlib.matmul`` on float8 inputs, with per-tensor scales.

``C = (scale_a * scale_b) * (A @ B)`` for A (M, K) and B (K, N) in one FP8
format (``e4m3`` or ``e5m2``), accumulated in fp32 and written as bfloat16
(default) or float32 -- what ``torch._scaled_mm`` computes with per-tensor
scales.  Inputs:

* **torch** ``float8_e4m3fn`` / ``float8_e5m2`` CUDA tensors.  A row-major.
  B either column-major -- ``w.t()`` of a row-major (N, K) weight, what
  ``torch._scaled_mm`` requires -- read as it is, or row-major (K, N),
  transposed by a pre-pass first (one read and write of B).  Scales are
  float32 CUDA tensors of one element (or Python floats).  The result is a
  torch tensor on A's device, on torch's current stream.
* **CuPy / NumPy** ``uint8`` arrays holding the FP8 bit patterns (neither has
  an FP8 dtype), with ``precision="e4m3"`` or ``"e5m2"``; ``transpose_b=True``
  when B is given as (N, K).  Scales are floats (or one-element float32 GPU
  arrays).  A bf16 result comes back as a :class:`gemmlib.precision.BF16Array`.

K is padded to a multiple of 16 with zeros when needed (TMA moves 16-byte
rows); that costs a copy of A and B.  Needs an H100/H200 (sm_90a).  The formats, the
rung and the numerics: :mod:`gemmlib.fp8`.
"""

from __future__ import annotations

import numpy as np

from gemmlib import backend
from gemmlib.fp8 import RUNG, spec_for
from gemmlib.frontends.operand import Operand
from gemmlib.runtime import calls
from gemmlib.runtime.memory import stream_handle
from gemmlib.spec import KernelSpec


def _out_kind(out_dtype) -> str:
    name = str(out_dtype).replace("torch.", "") if out_dtype is not None else "bfloat16"
    kind = {"bfloat16": "bf16", "bf16": "bf16", "float32": "fp32", "fp32": "fp32"}.get(name)
    if kind is None:
        raise ValueError(f"FP8 products are written as bfloat16 or float32; got out_dtype="
                         f"{out_dtype!r}")
    return kind


def _dtype_name_of(x) -> str:
    """"bfloat16" or "float32" (or what else) for an ``out`` array: torch, BF16Array, CuPy."""
    from gemmlib.precision import BF16Array

    if isinstance(x, BF16Array):
        return "bfloat16"
    return str(x.dtype).replace("torch.", "")


def matmul_fp8(A, B, a: Operand, b: Operand, fmt: str, *, scale_a, scale_b, out_dtype, out,
               kernel, stream, transpose_b: bool):
    """``gemmlib.matmul`` for FP8 operands (described as ``a``, ``b`` by the front ends)."""
    torch = a.kind == "torch"
    want = {"e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2"}[fmt]
    for op, name in ((a, "A"), (b, "B")):
        if len(op.shape) != 2:
            raise ValueError(f"{name} must be a 2-D matrix; got shape {op.shape}")
        ok = op.dname == want if op.kind == "torch" else op.dtype == np.uint8
        if not ok:
            raise TypeError(f"{name} has dtype {op.dname}: an {fmt} product takes torch "
                            f"{want} tensors or uint8 arrays of {fmt} bit patterns")
    if a.on_host != b.on_host or (torch and b.kind != "torch"):
        raise TypeError("A and B must both be torch CUDA tensors, both GPU arrays or both "
                        "NumPy arrays")
    M, K = a.shape
    # B's layout: K-major (N, K) memory is read as it is; row-major (K, N) is transposed first
    if torch:
        Bt = B.t()
        if transpose_b:
            raise ValueError("pass a torch B as (K, N) (a column-major view such as w.t() "
                             "is read without a copy); transpose_b is for uint8 arrays")
        if Bt.is_contiguous():
            layout, b_mem = "NK", Bt
        elif B.is_contiguous():
            layout, b_mem = "KN", B
        else:
            raise ValueError("B must be row-major or column-major (e.g. w.t() of a "
                             "contiguous weight); pass B.contiguous()")
        if not A.is_contiguous():
            raise ValueError("A must be row-major (C-contiguous): pass A.contiguous()")
    else:
        if transpose_b:
            layout, b_mem = "NK", B
        else:
            layout, b_mem = "KN", B
        for op, name in ((a, "A"), (b, "B")):
            if not op.c_contiguous:
                raise ValueError(f"{name} is not C-contiguous: pass a row-major array "
                                 f"(transpose_b=True for B given as (N, K))")
    N, K2 = (b.shape[0], b.shape[1]) if layout == "NK" and not torch else (
        (b.shape[1], b.shape[0]))
    if K != K2:
        raise ValueError(f"inner dimensions differ: A is {M}x{K}, B gives K = {K2}")
    if isinstance(kernel, KernelSpec):   # its own output type and B layout
        spec = kernel
        okind = spec.params["OUT"]
        if out_dtype is not None and _out_kind(out_dtype) != okind:
            raise ValueError(f"kernel {spec.name!r} writes {okind}, not {out_dtype}")
        if spec.b_operand != layout:
            raise ValueError(f"kernel {spec.name!r} takes B as {spec.b_operand}; this B is "
                             f"{layout} (pass kernel=None to choose)")
    else:
        okind = _out_kind(out_dtype if out is None or out_dtype is not None
                          else _dtype_name_of(out))
        spec = spec_for(fmt, okind, layout)
    if out is not None and _dtype_name_of(out) != {"bf16": "bfloat16", "fp32": "float32"}[okind]:
        raise TypeError(f"out holds {_dtype_name_of(out)}; this product writes "
                        f"{'bfloat16' if okind == 'bf16' else 'float32'} (out_dtype=)")
    if isinstance(kernel, str) and kernel not in ("auto", RUNG):
        raise ValueError(f"FP8 products run on {RUNG!r}; got kernel={kernel!r}")
    if spec.precision != fmt:
        raise ValueError(f"kernel {spec.name!r} computes in {spec.precision}, not {fmt}")
    backend.require_device()
    if a.on_host:
        return _simulated(spec, A, b_mem, M, N, K, scale_a, scale_b, okind, out)
    return _on_gpu(spec, A, b_mem, a, M, N, K, scale_a, scale_b, okind, out, stream, torch)


def _padded_k(x, rows: int, k: int, kp: int, torch_mod):
    """The uint8 bits of ``x`` (rows, k) in a zero (rows, kp) array."""
    if torch_mod is not None:
        p = torch_mod.zeros((rows, kp), dtype=torch_mod.uint8, device=x.device)
        p[:, :k] = x.view(torch_mod.uint8)
        return p
    xp = backend.array_module() if not isinstance(x, np.ndarray) else np
    p = xp.zeros((rows, kp), dtype=np.uint8)
    p[:, :k] = x
    return p


def _k_aligned(spec, okind: str, A, Bk, M: int, N: int, K: int, tmod):
    """(spec, A, B, Kp): the operands as TMA copies them, rows of a multiple of 16 bytes.
    When K is not a multiple of 16, zero-padded copies (zeros add nothing to the product);
    B's copy is made K-major, so a row-major B needs no transpose pass after it."""
    Kp = -(-K // 16) * 16
    if Kp == K:
        return spec, A, Bk, K
    if spec.b_operand == "NK":
        return spec, _padded_k(A, M, K, Kp, tmod), _padded_k(Bk, N, K, Kp, tmod), Kp
    return (spec_for(spec.precision, okind, "NK"), _padded_k(A, M, K, Kp, tmod),
            _padded_k(Bk.t() if tmod else Bk.T, N, K, Kp, tmod), Kp)


def _on_gpu(spec, A, Bk, a, M, N, K, scale_a, scale_b, okind, out, stream, torch):
    import sys

    tmod = sys.modules["torch"] if torch else None
    dev = a.device if a.device is not None else backend.array_module().cuda.runtime.getDevice()
    # scales: device addresses of float32 values
    keep = []

    def address(s, name):
        if s is None:   # unscaled: a 1.0 kept on the device
            return _one(dev, tmod)
        if tmod is not None and isinstance(s, tmod.Tensor):
            if s.dtype != tmod.float32 or s.numel() != 1 or not s.is_cuda:
                raise TypeError(f"{name} must be a float32 CUDA tensor of one element")
            return s.data_ptr()
        if hasattr(s, "__cuda_array_interface__"):
            if np.dtype(s.__cuda_array_interface__["typestr"]) != np.float32 or s.size != 1:
                raise TypeError(f"{name} must be a float32 GPU array of one element")
            return s.__cuda_array_interface__["data"][0]
        v = np.float32(s)
        t = (tmod.tensor([float(v)], dtype=tmod.float32, device=f"cuda:{dev}") if tmod else
             backend.array_module().asarray([v], dtype=np.float32))
        keep.append(t)
        return t.data_ptr() if tmod else t.data.ptr

    scales = (address(scale_a, "scale_a"), address(scale_b, "scale_b"))
    odt = "bfloat16" if okind == "bf16" else "float32"
    if out is not None:
        C = out
        raw = getattr(C, "bits", C)
        cptr = C.data_ptr() if tmod else raw.__cuda_array_interface__["data"][0]
        shape = tuple(C.shape)
        if shape != (M, N):
            raise ValueError(f"out has shape {shape}, but the product has shape {(M, N)}")
    elif tmod is not None:
        C = tmod.empty((M, N), dtype=getattr(tmod, odt), device=A.device)
        cptr = C.data_ptr()
    else:
        xp = backend.array_module()
        raw = xp.empty((M, N), dtype=np.uint16 if okind == "bf16" else np.float32)
        from gemmlib.precision import BF16Array

        C = BF16Array(raw) if okind == "bf16" else raw
        cptr = raw.data.ptr
    if M == 0 or N == 0:
        return C
    spec, a_mem, b_mem, Kp = _k_aligned(spec, okind, A, Bk, M, N, K, tmod)
    ptr = (lambda x: x.data_ptr()) if tmod else (lambda x: x.data.ptr)
    # ``stream``: gemmlib.matmul passes torch's current stream for torch tensors
    call = calls.prepare(spec, M, N, Kp)
    calls.run(call, ptr(a_mem), ptr(b_mem), cptr, stream_handle(stream), scales=scales)
    # The temporaries (padded copies, scales made from floats) were allocated on the
    # current stream, whose pool hands their memory out again only after this kernel; a
    # caller's other stream gets no such order, so wait for the kernel there.
    if (keep or Kp != K) and tmod is None and stream is not None:
        backend.array_module().cuda.runtime.streamSynchronize(stream_handle(stream))
    return C


_ONES: dict = {}


def _one(dev: int, tmod) -> int:
    """The address of a float32 1.0 on GPU ``dev`` (the scale of an unscaled operand)."""
    key = (dev, tmod is not None)
    if key not in _ONES:
        _ONES[key] = (tmod.ones(1, dtype=tmod.float32, device=f"cuda:{dev}") if tmod else
                      backend.array_module().ones(1, dtype=np.float32))
    t = _ONES[key]
    return t.data_ptr() if tmod else t.data.ptr


def _simulated(spec, A, Bk, M, N, K, scale_a, scale_b, okind, out):
    from gemmlib import tma
    from gemmlib.precision import BF16Array

    raw = np.empty((M, N), dtype=np.uint16 if okind == "bf16" else np.float32)
    if M and N:
        spec, a_mem, b_mem, Kp = _k_aligned(spec, okind, A, Bk, M, N, K, None)
        scales = tuple(tma.simulated_scalar(np.float32(1.0 if s is None else s))
                       for s in (scale_a, scale_b))
        calls.run_arrays(calls.prepare(spec, M, N, Kp), np.ascontiguousarray(a_mem),
                         np.ascontiguousarray(b_mem), raw, scales=scales)
    if out is not None:
        target = getattr(out, "bits", out)
        target[...] = raw
        return out
    return BF16Array(raw) if okind == "bf16" else raw
