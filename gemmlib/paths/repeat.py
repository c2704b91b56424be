"""Repeats of calls already checked: the short paths.

What a call costs the caller is mostly host time for small and medium problems, so a
call whose operands are described like an earlier call's skips what the checks
concluded then (the plan and the output type: a :class:`~gemmlib.runtime.calls.Call`).
The checks that depend on the pointers themselves (aliasing of ``out``, 16-byte
alignment, the current device) run every time; anything unusual takes the long path,
which runs every check with the same messages.

* CuPy and torch operands, described (:func:`call_key`, :func:`still_holds`,
  :func:`run_known`; remembered in :data:`gemmlib.runtime.calls.CALLS`);
* torch tensors as they come, not even described (:func:`torch_repeat`, remembered by
  :func:`remember_torch`): their own attributes, torch's current stream and capture
  state (one C call each), then the launch.

The long path leaves what it ran in :data:`RECORD` for the caller to remember.
"""

from __future__ import annotations

import threading

import numpy as np

from gemmlib.frontends.allocate import new_output, pointer
from gemmlib.frontends.operand import KERNEL_TYPE, Operand, overlap
from gemmlib.frontends.torch_tensors import torch_module
from gemmlib.runtime import launch
from gemmlib.runtime.caches import LRU
from gemmlib.runtime.calls import Call
from gemmlib.runtime.memory import current_device, stream_handle
from gemmlib.spec import KernelSpec

_TORCH = None   # the torch module, once a torch call was remembered (torch_repeat's)
RECORD = threading.local()  # the long path leaves its conclusion here


def call_key(a: Operand, b: Operand, c: Operand | None, kernel, precision,
             out_type: str | None = None, z: Operand | None = None):
    """A key for calls whose checks must conclude alike, or None (long path only)."""
    if a.kind not in ("cupy", "torch"):
        return None
    if not (kernel is None or type(kernel) is str):
        if type(kernel) is not KernelSpec:
            return None
        # A spec by identity (its params dict makes it unhashable): the entry keeps the spec
        # alive (Call.kernel), so no other spec can take its id while the entry lives.
        kernel = ("spec", id(kernel))
    ck = None if c is None else (c.kind, c.dname, c.dtype, c.shape, c.c_contiguous)
    zk = None if z is None else (z.kind, z.dname, z.shape, z.c_contiguous)
    return (a.kind, a.dname, a.dtype, a.shape, a.layout,
            b.kind, b.dname, b.dtype, b.shape, b.layout, ck, kernel, precision, out_type, zk)


def still_holds(k: Call, a: Operand, b: Operand, c: Operand | None) -> bool:
    # (the bias, when there is one, is read in place: any address will do)
    """The checks that depend on this call's pointers and the current device."""
    if k.align and (a.ptr % 16 or b.ptr % 16):
        return False  # the long path pads
    if c is not None and (overlap(c, a) or overlap(c, b)):
        return False  # the long path refuses, with its message
    current = current_device()
    for op in (a, b) if c is None else (a, b, c):
        if op.device is not None and op.device != current:
            return False
    return True


def run_known(k: Call, a, b, c, out, stream, z=None):
    """``k`` run again on operands described alike (:func:`still_holds` said so): C made
    unless given, the plan launched straight through the runtime (no layer between)."""
    p = k.plan
    device = current_device()
    if out is None:
        C = new_output(k, a, device)
        c_ptr = pointer(C)
    else:
        C, c_ptr = out, c.ptr
    bound = k.bound.get(device)
    if bound is None:   # loaded in this device's context once; then no context query
        bound = k.bound[device] = launch.bound(p)
    bias = () if z is None else (z.ptr, KERNEL_TYPE[z.dname])
    if k.out16 is None:
        launch.run(p, a.ptr, b.ptr, c_ptr, stream_handle(stream), bound=bound,
                   bias=bias)
    else:
        launch.run_rounded(p, a.ptr, b.ptr, c_ptr, k.out16, stream_handle(stream),
                           bound=bound, bias=bias)
    return C


def remember(call: Call, a: Operand, C) -> None:
    """The long path ran ``call`` on these operands as they are, into ``C``: leave it in
    :data:`RECORD`, for the caller to remember."""
    if a.kind in ("cupy", "torch"):
        call.out_dtype = C.dtype
        RECORD.known = call


class TorchCall:
    """A torch call's description whose every check an earlier call passed: what a repeat
    launches (the plan, in ``known``) and the few checks that depend on the pointers."""

    __slots__ = ("known", "shape", "strides", "dtype", "spans", "bias_type", "devices",
                 "align")

    def __init__(self, known, shape, dtype, spans, bias_type):
        self.known, self.shape, self.dtype = known, shape, dtype
        # a batched launch never pads: its checked path loops over unaligned stacks
        self.align = bool(known.align) or known.plan.batch != 1
        self.strides = tuple(int(np.prod(shape[i + 1:])) for i in range(len(shape)))
        self.spans = spans            # bytes A, B and C reach from their first element
        self.bias_type = bias_type    # "fp32"/"fp16"/"bf16", or None: no bias
        self.devices = {}             # device index -> torch.device


#: torch call descriptions -> TorchCall
TORCH_CALLS = LRU(4096)


def torch_key(A, B, out, bias, transpose_b, out_dtype):
    """A torch call's description, read straight from its tensors."""
    return (A.dtype, A.shape, A.stride(), B.dtype, B.shape, B.stride(), transpose_b,
            out_dtype, None if out is None else (out.dtype, out.shape, out.stride()),
            None if bias is None else (bias.dtype, bias.shape, bias.stride()))


def span(t) -> int:
    """Bytes from a tensor's first element to the end of its last."""
    if t.numel() == 0:
        return 0
    return (sum((n - 1) * s for n, s in zip(t.shape, t.stride())) + 1) * t.element_size()


def remember_torch(A, B, out, bias, transpose_b, out_dtype, C) -> None:
    """The checked call just launched its plan on these tensors as they lie (``RECORD``):
    remember the description for the lean path, when a repeat can launch the same way --
    2-D operands, an A of (..., M, K) whose rows are one contiguous (M, K) matrix, or a
    stack launched as one batch (``paths.batched.one_launch``: C allocated)."""
    global _TORCH
    k = RECORD.known   # (left set: an outer call of a flattened stack remembers it too)
    _TORCH = torch_module()   # (the lean path's torch: a global, as cheap as it gets)
    p = k.plan
    if not A.is_cuda or (A.dim() != 2 and not A.is_contiguous()):
        return
    if B.dim() != 2 and not _one_batch(A, B, out, p):
        return
    if out is not None and not out.is_contiguous():
        return
    if (A.dim() == 2 and tuple(A.shape) != (p.M, p.K)) or (p.batch != 1 and B.dim() == 2):
        return
    bias_type = None if bias is None else KERNEL_TYPE.get(str(bias.dtype)[6:])
    if bias is not None and (bias_type is None or not bias.is_contiguous()):
        return
    spans = (span(A), span(B), span(C))
    TORCH_CALLS.put(torch_key(A, B, out, bias, transpose_b, out_dtype),
                    TorchCall(k, tuple(C.shape), C.dtype, spans, bias_type))


def _one_batch(A, B, out, p) -> bool:
    """Whether plan ``p`` ran the stacks A and B as one batched launch (not the last of a
    loop over their products): the same batch shape, as many products as the plan's."""
    return (out is None and A.dim() == B.dim() and A.shape[:-2] == B.shape[:-2]
            and p.batch != 1 and p.batch == A.numel() // max(A.shape[-2] * A.shape[-1], 1))


def torch_repeat(A, B, out, bias, transpose_b, out_dtype):
    """A repeat of a remembered torch call description (see remember_torch): the checks
    that depend on this call's tensors, then the launch; None where any differs (the
    checked path then runs, with its message).  What it ran is left in :data:`RECORD`,
    as the checked path leaves it: a checked call around this one (a flattened
    ``(..., M, K)`` input's) remembers its own description from it."""
    f = TORCH_CALLS.get(torch_key(A, B, out, bias, transpose_b, out_dtype))
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
    if f.align and (a_ptr | b_ptr) & 15:
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
        bound = k.bound[dev] = launch.bound(k.plan)
    stream = _RAW_STREAM(dev)
    # torch knows whether its current stream is being captured (one C call)
    graph = ((bound.needs_buffers or k.out16 is not None)
             and torch._C._cuda_isCurrentStreamCapturing())
    if k.out16 is None:
        launch.run(k.plan, a_ptr, b_ptr, c_ptr, stream, bound=bound, bias=z, graph=graph)
    else:
        launch.run_rounded(k.plan, a_ptr, b_ptr, c_ptr, k.out16, stream, bound=bound,
                           bias=z, graph=graph)
    RECORD.known = k
    return C


def _RAW_STREAM(dev: int) -> int:
    torch = _TORCH
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is None:
        return torch.cuda.current_stream(dev).cuda_stream
    globals()["_RAW_STREAM"] = raw   # one C call from now on
    return raw(dev)
