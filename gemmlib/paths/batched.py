"""The path of a batch of 16-bit products as one launch: ``(b, M, K) @ (b, K, N)`` on
a batched rung (on Hopper ``select_batched``'s), where the operands allow it; else
:func:`gemmlib.matmul` loops over the batch."""

from __future__ import annotations

import numpy as np

from gemmlib.backend import SIMULATOR
from gemmlib.frontends.allocate import (allocate_stack, host16, kernel_array, like_input,
                                        pointer)
from gemmlib.frontends.checks import describe_bias, out_type
from gemmlib.frontends.operand import (KERNEL_TYPE, SIXTEEN, Operand, element_strides,
                                       is_c_contiguous)
from gemmlib.frontends.torch_tensors import current_stream
from gemmlib.paths.repeat import RECORD
from gemmlib.runtime import calls
from gemmlib.runtime.caches import LRU
from gemmlib.runtime.memory import stream_handle
from gemmlib.runtime.select import AUTO, select_batched


def one_launch(A, B, a: Operand, b: Operand, batch: tuple, out, bias, kw):
    """A batch of 16-bit products as one launch of a batched rung (on Hopper
    :func:`gemmlib.runtime.select.select_batched`'s), where the operands allow it:
    the same batch shape (no broadcast), A a contiguous stack, B a contiguous stack of
    row-major matrices or of column-major ones (``K.transpose(-1, -2)``), 16-byte rows,
    and no ``out``, kernel or precision named.  None where not: the caller loops."""
    if (out is not None or kw.get("kernel") not in (None, AUTO)
            or kw.get("precision") is not None or a.dname not in SIXTEEN
            or b.dname != a.dname or (a.on_host and not SIMULATOR) or a.kind != b.kind
            or tuple(a.shape[:-2]) != batch or tuple(b.shape[:-2]) != batch):
        return None
    key = (a.kind, a.dname, a.shape, a.c_contiguous, b.shape, element_strides(b),
           kw.get("out_dtype"), None if bias is None else tuple(bias.shape))
    known = _BATCHED.get(key)
    if known is None:
        known = _BATCHED.put(key, _batched_plan(a, b, batch, kw.get("out_dtype"),
                                                bias is not None))
    if not known:
        return None
    call, o16, b_layout = known
    (M, K), N, nb = a.shape[-2:], b.shape[-1], call.plan.batch
    z = None if bias is None else describe_bias(bias, a, N)
    stream = kw.get("stream")
    if a.on_host:   # the simulator: the stacks as the 2-D arrays the kernel takes
        A2 = np.ascontiguousarray(a.obj).view(np.uint16).reshape(nb * M, K)
        bk = b.obj if b_layout == "KN" else np.swapaxes(b.obj, -1, -2)   # (.., N, K)
        B2 = np.ascontiguousarray(bk).view(np.uint16).reshape(-1, bk.shape[-1])
        C = (host16(np.empty(batch + (M, N), np.uint16), o16, a) if o16 else
             np.empty(batch + (M, N), np.float32))
        C2 = (getattr(C, "bits", C).view(np.uint16) if o16 else C).reshape(nb * M, N)
        Z = None if z is None else kernel_array(z, np).reshape(1, N)
        calls.run_arrays(call, A2, B2, C2, stream, bias=Z, bias_type=KERNEL_TYPE[a.dname])
        # in A's own type, as a loop's products are (a torch CPU tensor, bfloat16 included)
        return C if isinstance(A, np.ndarray) else like_input(C, A)
    if a.kind == "torch" and stream is None:
        stream = current_stream(a.device)
    if a.ptr % 16 or b.ptr % 16:
        return None
    C = allocate_stack(batch + (M, N), o16 or "float32", a)
    bias_arg = () if z is None else (z.ptr, KERNEL_TYPE[z.dname])
    calls.run(call, a.ptr, b.ptr, pointer(C), stream_handle(stream), bias=bias_arg)
    RECORD.known = call   # a torch caller's lean path may remember it (remember_torch)
    return C


#: what _batched_plan concluded for operands described alike
_BATCHED = LRU(1024)


def _batched_plan(a: Operand, b: Operand, batch: tuple, out_dtype, bias: bool):
    """(the call prepared, C's 16-bit type or None, B's layout) of a batch as one launch,
    or () where the operands do not allow it (see one_launch)."""
    (M, K), N = a.shape[-2:], b.shape[-1]
    nb = int(np.prod(batch))
    sb = element_strides(b)
    if not a.c_contiguous or M * N * K * nb == 0 or K % 8:
        return ()
    if b.c_contiguous:
        b_layout = "KN"
        if N % 8 or K % 64:   # a (K, N) B: no k-tile may reach the next product's rows
            return ()
    elif is_c_contiguous(b.shape[:-2] + (N, K), sb[:-2] + (sb[-1], sb[-2]), 1):
        b_layout = "NK"
    else:
        return ()
    o16 = out_type(out_dtype, a, None)
    spec = select_batched(KERNEL_TYPE[a.dname], M, N, K,
                          KERNEL_TYPE.get(o16, "fp32"), b_layout, bias)
    if spec is None:
        return ()
    return calls.prepare(spec, M, N, K, batch=nb), o16, b_layout
