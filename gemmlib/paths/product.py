"""The path of one 2-D product: its precision (fp32 on the CUDA cores, or a tensor-core
precision), every check with its message, the spec chosen (:func:`product`), then the
product on the operands where they lie (:func:`launched`: GPU arrays, or NumPy in the
simulator) -- A and B in the orders the spec reads, in place where they lie so (slices of
wider matrices too, where the spec can read them: :func:`_takes_pitch`), else copied;
zero-padded where the spec's 16-byte pieces need it -- C made unless given, the
call prepared and run (:mod:`gemmlib.runtime.calls`).  Host operands off the simulator
go back to the caller to be staged through the GPU.

``o16`` is the 16-bit type of C ("float16"/"bfloat16", else None: float32); ``out16``
the kernels' name for it when the spec writes float32 that one more kernel rounds.
"""

from __future__ import annotations

from contextlib import nullcontext

import numpy as np

from gemmlib import backend
from gemmlib.backend import SIMULATOR
from gemmlib.frontends.allocate import (allocate16, allocate_output, bits_of,
                                        is_bf16array, kernel_array, padded, pointer,
                                        reordered)
from gemmlib.frontends.arrays import staging_stream
from gemmlib.frontends.checks import check_operands
from gemmlib.frontends.operand import KERNEL_TYPE, Operand, element_strides, transposed
from gemmlib.frontends.torch_tensors import TorchArrays, stream_context
from gemmlib.paths.repeat import remember
from gemmlib.runtime import calls
from gemmlib.runtime.memory import stream_handle
from gemmlib.runtime.select import (AUTO, AUTO_RUNG, DEFAULT_KERNEL, TC_AUTO, get_spec, select,
                                    select_tc, with_a_layout, with_bias, with_layout, with_out,
                                    with_pitch)
from gemmlib.spec import KernelSpec


def product(a: Operand, b: Operand, c: Operand | None, out, kernel, stream, precision,
            o16: str | None, z: Operand | None, staged):
    """matmul's long path for one 2-D product: every check, with its message, the spec
    chosen, then :func:`launched`.  ``o16``: see :func:`gemmlib.frontends.checks.out_type`;
    ``z``: the bias, described; ``staged(a, b, c, out, z, stream, **kw)``: the caller's
    way of running host operands through the GPU (it calls ``gemmlib.matmul`` again)."""
    if precision is None and isinstance(kernel, KernelSpec):
        precision = kernel.precision
    elif precision is None and isinstance(kernel, str) and kernel != AUTO:
        named = get_spec(kernel).precision   # a tf32-only rung (wgmma_tf32) by name
        precision = named if named in ("tf32", "3xtf32") else None
    if precision not in (None, "fp32") or _sixteen_bit_default(a, kernel):
        from gemmlib.precision import check_precision

        prec = check_precision(precision, a.dname)
        if prec != "fp32":
            return _tensor_core(prec, a, b, c, out, kernel, stream, o16, z, staged)
    kernel = kernel or DEFAULT_KERNEL
    auto = isinstance(kernel, str) and kernel == AUTO
    # The spec the operand checks read (dtype); "auto" resolves per shape below.
    M, N, K = check_operands(get_spec(AUTO_RUNG if auto else kernel), a, b, c)
    backend.require_device()
    if a.on_host and not SIMULATOR:  # host in, host out: stage through the GPU
        return staged(a, b, c, out, z, stream, kernel=kernel)
    spec = select(M, N, K) if auto else get_spec(kernel)
    if z is not None:
        spec = with_bias(spec)
    return launched(a, b, c, out, z, spec, stream, M, N, K, None, None)


def _sixteen_bit_default(a: Operand, kernel) -> bool:
    """16-bit inputs with no fp32 rung named: they run in their own precision.

    Naming a CUDA-core rung with 16-bit inputs (or passing any other dtype)
    falls through to the fp32 checks, whose TypeError names ``astype``.
    """
    if a.dname not in ("float16", "bfloat16"):
        return False
    if kernel is None or (isinstance(kernel, str) and kernel == AUTO):
        return True
    return get_spec(kernel).precision != "fp32"


def _tensor_core(prec, a, b, c, out, kernel, stream, o16, z, staged):
    """:func:`product` in a tensor-core precision (operands described, precision checked).
    ``o16`` (see out_type): "float16" / "bfloat16" for a C in the inputs' own type."""
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
    M, N, K = check_operands(check_spec, a, b, c, out_dtype=o16)
    backend.require_device()
    if a.on_host and not SIMULATOR:  # host in, host out: stage through the GPU
        return staged(a, b, c, out, z, stream, kernel=kernel, precision=prec,
                      out_dtype=o16 or "float32")
    okind = KERNEL_TYPE.get(o16, "fp32")
    if auto:
        spec = select_tc(prec, M, N, K, out=okind, b_layout="NK" if _order(b) == "F" else "KN")
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
    return launched(a, b, c, out, z, spec, stream, M, N, K, o16, out16)


def launched(a: Operand, b: Operand, c: Operand | None, out, z: Operand | None,
             spec: KernelSpec, stream, M: int, N: int, K: int, o16: str | None,
             out16: str | None):
    """The product with ``spec`` on operands where they are (GPU, or NumPy in the
    simulator): A read row-major and B as the spec reads it -- in place where they lie
    so, else copied -- padded where the spec's 16-byte pieces need it; C allocated
    unless given.  Remembers what a repeat may skip (:func:`gemmlib.paths.repeat.remember`)."""
    xp = np if a.on_host else TorchArrays(a) if a.kind == "torch" else backend.array_module()
    # Every copy below runs on the kernel's stream, in order with the caller's work.
    with (nullcontext() if a.on_host else stream_context(stream) if a.kind == "torch"
          else staging_stream(stream)):
        given = a   # C comes back in the caller's array type, not a staged copy's
        a, b, spec, copied, lds = _fit_layouts(a, b, spec, stream)
        nk = spec.b_operand == "NK"
        km = spec.a_operand == "KM"
        # KM: the (K, M) row-major memory; NK: the (N, K) one (rows lds apart, if given)
        A_ = kernel_array(_t(a) if km else a, xp, pitched=bool(lds[0]))
        B_ = kernel_array(_t(b) if nk else b, xp, pitched=bool(lds[1]))
        Z_ = None if z is None else kernel_array(z, xp).reshape(1, N)
        al = spec.operand_align
        misaligned = bool(al) and not a.on_host and (a.ptr % 16 or b.ptr % 16)
        Kp, Np = K, N
        if al and (K % al or N % al or misaligned):   # stage into zero-padded, aligned copies
            Kp, Np = -(-K // al) * al, -(-N // al) * al
            A_ = padded(A_, Kp, M, xp) if km else padded(A_, M, Kp, xp)
            B_ = padded(B_, Np, Kp, xp) if nk else padded(B_, Kp, Np, xp)
            lds = (0, 0)   # the padded copies' rows are packed
            if Z_ is not None and Np != N:
                Z_ = padded(Z_, 1, Np, xp)
        if out is not None:
            C = c.obj if a.on_host else out  # host: the NumPy view of out (a torch CPU tensor)
        elif o16 is not None:
            C = allocate16(M, N, o16, given)
        elif a.on_host:
            C = np.empty((M, N), dtype=np.dtype(spec.out_dtype) if spec.precision == "fp32"
                         else np.float32)
        else:
            C = allocate_output(M, N, np.float32, like=given)
        # dst: what the kernel writes when N is not padded (16-bit C: its bits)
        dst = C if o16 is None else bits_of(C, a.on_host, xp)
        Ck = dst if Np == N else xp.empty((M, Np), dtype=np.float32 if o16 is None else np.uint16)
        if M != 0 and N != 0:
            call = calls.prepare(spec, M, Np, Kp, out16)  # ConstraintError here
            btype = None if z is None else KERNEL_TYPE[z.dname]
            if a.on_host:  # simulator
                calls.run_arrays(call, A_, B_, Ck, stream, bias=Z_, bias_type=btype or "fp32")
            else:
                bias = () if z is None else (pointer(Z_), btype)
                calls.run(call, pointer(A_), pointer(B_), pointer(Ck), stream_handle(stream),
                          bias=bias, lds=lds if any(lds) else ())
                if (Ck is dst and Kp == K and not misaligned and not copied and not any(lds)
                        and not is_bf16array(C)):
                    remember(call, a, C)   # no staging: a repeat can skip it all
            if Ck is not dst:   # drop the padded columns (in order on the same stream)
                (dst if a.on_host else xp.asarray(dst))[...] = Ck[:, :N]
    return C if out is None else out


def _t(op: Operand) -> Operand:
    """The description of a 2-D operand's transpose (a view of the same memory)."""
    return transposed(op.obj, op)[1]


def _fit_layouts(a: Operand, b: Operand, spec: KernelSpec, stream):
    """(a, b, spec, copied, lds): A and B in the orders ``spec`` reads -- a column-major
    operand goes to the spec's build for it ("KM" A, "NK" B) where the rung has one --
    read in place where they lie so, else copied in the right order.  A slice of a wider
    matrix (rows further apart than a row: :func:`_pitch`), or the transpose of one, is
    read in place by a spec that can step over the gap -- through its tensor maps, or (its
    ``PITCHED`` build: :func:`~gemmlib.runtime.select.with_pitch`) its array arguments' row
    strides -- where its rows stay 16-byte aligned (:func:`_takes_pitch`); ``lds``: those
    row strides of the kernel's A and B memory, in elements (0: packed)."""
    copied = False
    pa, pb = _pitch(a), _pitch(b)
    a_want = "KM" if _order(a) == "F" else "MK"
    if spec.a_operand != a_want:   # the rung's build for A as it lies, where it has one
        spec = with_a_layout(spec, a_want, a.shape[0]) or spec
    if spec.a_operand == "KM" and a.shape[0] % (spec.operand_align or 1):
        spec = with_a_layout(spec, "MK", a.shape[0]) or spec   # M short of a row
    if _order(b) == "F" and spec.b_operand == "KN":
        nk = with_layout(spec, "NK")
        if nk is not None:
            spec = nk
    want_a = "F" if spec.a_operand == "KM" else "C"
    want_b = "F" if spec.b_operand == "NK" else "C"
    lda = pa[1] if pa and pa[0] == want_a and _takes_pitch(spec, a, pa[1]) else 0
    ldb = pb[1] if pb and pb[0] == want_b and _takes_pitch(spec, b, pb[1], True) else 0
    if (lda or ldb) and not spec.tma_boxes:   # the rung's build that reads them by pointer
        spec = with_pitch(spec)
    if a.layout != want_a and not lda:
        a, copied = reordered(a, want_a, stream), True
    if b.layout != want_b and not ldb:
        b, copied = reordered(b, want_b, stream), True
    return a, b, spec, copied, (lda, ldb)


def _order(op: Operand) -> str:
    """"C" (rows of unit stride), "F" (columns of unit stride) or "": ``op.layout``, or
    the order of a slice of a wider matrix (:func:`_pitch`)."""
    if op.layout:
        return op.layout
    p = _pitch(op)
    return p[0] if p else ""


def _pitch(op: Operand):
    """("C", ld) for a 2-D view whose rows have unit stride and start ld >= cols elements
    apart (``x[:, :k]``, ``x[:, -1, :]``), ("F", ld) for the transpose of one; None for
    anything else (a packed matrix, a step along the rows)."""
    if op.layout or len(op.shape) != 2:
        return None
    s = element_strides(op)
    rows, cols = op.shape
    if s[1] == 1 and s[0] >= cols:
        return ("C", s[0])
    if s[0] == 1 and s[1] >= rows:
        return ("F", s[1])
    return None


def _takes_pitch(spec: KernelSpec, op: Operand, ld: int, b_side: bool = False) -> bool:
    """Whether ``spec`` reads the operand where it lies, its rows ``ld`` elements apart.
    Two kinds of rung do, both moving rows in 16-byte pieces, so ``ld`` must be a multiple
    of 16 bytes: the wgmma rungs, through their tensor maps (TMA loads); and the rungs with
    a build that reads them by pointer (``PITCHED``: the fp32 CUDA-core rungs, mma.sync,
    skinny), through the row stride in the operand's array argument -- these need its
    first element 16-byte aligned too (else a packed copy keeps their 16-byte loads).  A
    rung that transposes B (A) first (``b_prep``, ``a_prep``) reads it packed."""
    if (spec.b_prep if b_side else spec.a_prep) is not None:
        return False
    if (ld * np.dtype(op.dtype).itemsize) % 16:
        return False
    if spec.tma_boxes:
        return True
    return _address(op) % 16 == 0 and with_pitch(spec) is not None


def _address(op: Operand) -> int:
    """The address of an operand's first element (a host operand's: its NumPy data)."""
    return op.obj.ctypes.data if op.on_host else op.ptr
