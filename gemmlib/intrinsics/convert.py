"""16-bit inputs on the CUDA cores: raw 16-byte loads, and fp16/bf16 -> fp32 in registers.

The tensor-core rungs hand fp16 and bf16 values to ``mma`` as packed pairs
and never look at them one by one.  A CUDA-core kernel (the decode rung,
:mod:`gemmlib.kernels.skinny`) multiplies them with fp32 FMAs, so each value
must become a float32 first.  Both conversions are exact (every fp16 and
bf16 value is a float32 value):

* **bf16** is the top half of a float32: ``as_float(bits << 16)``, one shift
  (or one AND for the upper value of a packed pair) -- no intrinsic needed;
* **fp16** has its own exponent width: ``cvt.f32.f16`` (an ``@intrinsic``
  here, :func:`half_to_float`), which keeps NaN, Inf and subnormals.

16-bit data moves best in 16-byte pieces, eight values at once.  numba has
no 16-byte load of a ``uint16`` array, so :func:`load16` reads the 16 bytes
at ``arr[i, j]`` as four ``uint32`` words (``ld.global.v4.u32``); element
``j + 2e`` is the low half of word ``e``, ``j + 2e + 1`` its high half
(little-endian).  The same intrinsic reads four float32 values as their bits
(``as_float`` turns a word back into a float, for free).  The contract is
:func:`gemmlib.intrinsics.vector.load4`'s: a C-contiguous 2-D array (or its
``pitched`` view), the 16 bytes inside one row, the address a multiple of 16 (the
simulator twin checks both and raises :class:`~gemmlib.intrinsics.vector.MisalignedAccess`).

:func:`load16_stream` is the same load through the read-only (non-coherent)
path with no L1 allocation, ``ld.global.nc.L1::no_allocate.v4.u32``: data
read exactly once (the weights of a decode product) need not displace
anything in L1.  Only for arrays the kernel never writes.

Functions (inside ``@cuda.jit`` kernels; every one has a ``_py`` twin):

``load16(arr, i, j) -> (w0, w1, w2, w3)``
    the 16 bytes at ``arr[i, j]`` as four uint32 words
``load16_stream(arr, i, j) -> (w0, w1, w2, w3)``
    the same, read-only path, no L1 allocation
``half_to_float(h) -> float32``
    the fp16 value whose bits are the low 16 bits of the integer ``h``
``bf16_to_float(h) -> float32``
    the bf16 value whose bits are the low 16 bits of ``h`` (a device function)
``bf16_hi_to_float(w) -> float32``
    the bf16 value in the high 16 bits of the word ``w`` (a device function)

The other way, for epilogues that write a 16-bit C (``wgmma_ws`` and its kin with
``OUT="fp16"`` / ``"bf16"``), float32 -> 16-bit bits, rounded to nearest even:

``float_to_half(x) -> uint16``
    the fp16 bits of ``x`` (``cvt.rn.f16.f32``: overflow to Inf, fp16 subnormals kept)
``float_to_bf16(x) -> uint16``
    the bf16 bits of ``x`` (``cvt.rn.bf16.f32``, sm_80+; a NaN stays a NaN)
"""

from __future__ import annotations

import numpy as np

from gemmlib.backend import SIMULATOR, cuda, uint32
from gemmlib.intrinsics.mma import as_float
from gemmlib.intrinsics.vector import MisalignedAccess, _ndarray

# --------------------------------------------------------------------------
# Plain-Python twins (simulator)


def _words(arr, i, j, what):
    """The four uint32 words of the 16 bytes at arr[i, j], after checking the contract."""
    a = _ndarray(arr)
    item = (a if a is not None else np.asarray(arr)).dtype.itemsize
    per = 16 // item
    if j < 0 or j + per > arr.shape[1]:
        raise MisalignedAccess(f"{what}: columns {j}..{j + per - 1} leave a row of "
                               f"{arr.shape[1]}")
    if a is not None:
        addr = a.ctypes.data + int(i) * a.strides[0] + int(j) * a.strides[1]
        if addr % 16:
            raise MisalignedAccess(
                f"{what}: element [{i}, {j}] is at an address that is not a multiple of 16 "
                f"(row stride {a.strides[0]} bytes): the GPU would fault on this 16-byte load")
    vals = np.array([arr[i, j + e] for e in range(per)], dtype=(a if a is not None else
                                                                 np.asarray(arr)).dtype)
    w = vals.view(np.uint32)
    return np.uint32(w[0]), np.uint32(w[1]), np.uint32(w[2]), np.uint32(w[3])


def load16_py(arr, i, j):
    return _words(arr, i, j, "load16")


def load16_stream_py(arr, i, j):
    return _words(arr, i, j, "load16_stream")


def half_to_float_py(h):
    return np.float32(np.array([int(h) & 0xFFFF], np.uint16).view(np.float16)[0])


def float_to_half_py(x):
    """NumPy's float32 -> float16 rounds to nearest even, as ``cvt.rn.f16.f32`` does."""
    with np.errstate(over="ignore"):
        return np.array([x], np.float32).astype(np.float16).view(np.uint16)[0]


def float_to_bf16_py(x):
    """Round to nearest even on the top 16 bits (``cvt.rn.bf16.f32``); a NaN stays a quiet
    NaN (its payload may differ from the GPU's: both are NaN)."""
    u = int(np.array([x], np.float32).view(np.uint32)[0])
    if (u & 0x7FFFFFFF) > 0x7F800000:
        return np.uint16((u >> 16) | 0x40)
    return np.uint16((u + 0x7FFF + ((u >> 16) & 1)) >> 16)


# --------------------------------------------------------------------------
# The intrinsics (GPU)


def _make_intrinsics():
    from llvmlite import ir
    from numba import types
    from numba.cuda.core.errors import NumbaTypeError
    from numba.cuda.extending import intrinsic

    from gemmlib.intrinsics._lower import item_pointer

    i16, i32, i64, f32 = ir.IntType(16), ir.IntType(32), ir.IntType(64), ir.FloatType()
    v4 = ir.VectorType(i32, 4)

    def _check(arr, i, j, name):
        if not (isinstance(arr, types.Array) and arr.ndim == 2 and arr.layout in "CA"
                and arr.dtype.bitwidth in (16, 32)):   # "A": a pitched view (intrinsics.pitch)
            raise NumbaTypeError(f"{name} needs a C-contiguous or pitched 2-D array of 2- or "
                                 f"4-byte elements, got {arr}")
        if not (isinstance(i, types.Integer) and isinstance(j, types.Integer)):
            raise NumbaTypeError(f"{name} needs integer indices, got {i}, {j}")

    def _pointer(context, builder, sig, args):
        aryty, ity, jty = sig.args[:3]
        ary = context.make_array(aryty)(context, builder, args[0])
        inds = [context.cast(builder, args[1], ity, types.intp),
                context.cast(builder, args[2], jty, types.intp)]
        return item_pointer(context, builder, aryty, ary, inds)

    def _tuple(context, builder, sig, vals):
        return context.make_tuple(builder, sig.return_type, vals)

    @intrinsic
    def load16(typingctx, arr, i, j):
        _check(arr, i, j, "load16")
        sig = types.UniTuple(types.uint32, 4)(arr, i, j)

        def codegen(context, builder, sig, args):
            ptr = _pointer(context, builder, sig, args)
            vp = builder.bitcast(ptr, ir.PointerType(v4, addrspace=ptr.type.addrspace))
            vec = builder.load(vp, align=16)
            return _tuple(context, builder, sig,
                          [builder.extract_element(vec, ir.Constant(i32, e)) for e in range(4)])

        return sig, codegen

    @intrinsic
    def load16_stream(typingctx, arr, i, j):
        _check(arr, i, j, "load16_stream")
        sig = types.UniTuple(types.uint32, 4)(arr, i, j)
        ptx = ("{ .reg .u64 g; cvta.to.global.u64 g, $4; "
               "ld.global.nc.L1::no_allocate.v4.u32 {$0, $1, $2, $3}, [g]; }")

        def codegen(context, builder, sig, args):
            ptr = _pointer(context, builder, sig, args)
            addr = builder.ptrtoint(ptr, i64)
            ret = ir.LiteralStructType([i32] * 4)
            asm = ir.InlineAsm(ir.FunctionType(ret, [i64]), ptx, "=r,=r,=r,=r,l")
            out = builder.call(asm, [addr])
            return _tuple(context, builder, sig, [builder.extract_value(out, e)
                                                  for e in range(4)])

        return sig, codegen

    @intrinsic
    def half_to_float(typingctx, h):
        if not isinstance(h, types.Integer):
            raise NumbaTypeError(f"half_to_float takes the bits as an integer, got {h}")
        sig = types.float32(h)

        def codegen(context, builder, sig, args):
            v = context.cast(builder, args[0], sig.args[0], types.uint32)
            asm = ir.InlineAsm(ir.FunctionType(f32, [i16]), "cvt.f32.f16 $0, $1;", "=f,h")
            return builder.call(asm, [builder.trunc(v, i16)])

        return sig, codegen

    def _narrow(name, op):
        """An intrinsic ``name(x) -> uint16``: float32 ``x`` converted by ``op`` (one
        ``cvt`` to a 16-bit register)."""
        def typer(typingctx, x):
            if not isinstance(x, (types.Float, types.Integer)):
                raise NumbaTypeError(f"{name} takes a float32, got {x}")
            sig = types.uint16(x)

            def codegen(context, builder, sig, args):
                v = context.cast(builder, args[0], sig.args[0], types.float32)
                asm = ir.InlineAsm(ir.FunctionType(i16, [f32]), f"{op} $0, $1;", "=h,f")
                return builder.call(asm, [v])

            return sig, codegen
        typer.__name__ = name
        return intrinsic(typer)

    return (load16, load16_stream, half_to_float,
            _narrow("float_to_half", "cvt.rn.f16.f32"),
            _narrow("float_to_bf16", "cvt.rn.bf16.f32"))


if SIMULATOR:
    load16, load16_stream, half_to_float = load16_py, load16_stream_py, half_to_float_py
    float_to_half, float_to_bf16 = float_to_half_py, float_to_bf16_py
else:
    load16, load16_stream, half_to_float, float_to_half, float_to_bf16 = _make_intrinsics()


# --------------------------------------------------------------------------
# bf16: integer operations only (the same code in both modes)


def _bf16_to_float(h):
    """bf16 bits in the low half of ``h`` -> float32: they become the float's top half."""
    return as_float((uint32(h) & uint32(0xFFFF)) << uint32(16))


def _bf16_hi_to_float(w):
    """The bf16 value in the high half of the word ``w``: clear the low half."""
    return as_float(uint32(w) & uint32(0xFFFF0000))


bf16_to_float = cuda.jit(device=True)(_bf16_to_float)
bf16_hi_to_float = cuda.jit(device=True)(_bf16_hi_to_float)

__all__ = ["load16", "load16_stream", "half_to_float", "bf16_to_float", "bf16_hi_to_float",
           "float_to_half", "float_to_bf16", "load16_py", "load16_stream_py",
           "half_to_float_py", "float_to_half_py", "float_to_bf16_py"]
