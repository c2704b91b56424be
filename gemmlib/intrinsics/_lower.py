"""Lowering pieces the intrinsic modules share (cp.async, mma, Hopper, 16-byte loads).

Used only when numba compiles for a GPU: the modules call these from inside
their ``_make...`` functions, never in the simulator, so the compiler's
imports stay local.
"""

from __future__ import annotations


def shared_address(context, builder, aty, ary, index, ity):
    """The 32-bit shared-window address of element ``index`` of the 1-D array ``ary``
    (a shared array reached through a generic pointer is cast to the shared space)."""
    from llvmlite import ir
    from numba import types
    from numba.cuda import cgutils

    arr = context.make_array(aty)(context, builder, ary)
    ptr = cgutils.get_item_pointer(context, builder, aty, arr,
                                   [context.cast(builder, index, ity, types.intp)],
                                   wraparound=False)
    if ptr.type.addrspace != 3:  # generic -> shared window, as a 32-bit address
        ptr = builder.addrspacecast(ptr, ir.PointerType(ptr.type.pointee, 3))
    return builder.ptrtoint(ptr, ir.IntType(32))


def item_pointer(context, builder, aty, ary, inds):
    """The address of element ``inds`` of the array ``ary`` (no bounds check, no negative
    indices): numba's own for a C-contiguous array; for a pitched view ("A" layout,
    :mod:`gemmlib.intrinsics.pitch`) the strides' byte offset from the data pointer by a
    GEP -- numba adds it as an integer (ptrtoint, inttoptr), which hides from NVVM that
    the pointer is global: its loads would be generic ``ld``, not ``ld.global``."""
    from functools import reduce

    from llvmlite import ir
    from numba.cuda import cgutils

    if aty.layout == "C":
        return cgutils.get_item_pointer(context, builder, aty, ary, inds, wraparound=False)
    strides = cgutils.unpack_tuple(builder, ary.strides, aty.ndim)
    offset = reduce(builder.add, [builder.mul(i, s) for i, s in zip(inds, strides)])
    data = ary.data
    raw = builder.bitcast(data, ir.PointerType(ir.IntType(8), data.type.addrspace))
    return builder.bitcast(builder.gep(raw, [offset], inbounds=True), data.type)


def bare(name: str, ptx: str):
    """An intrinsic ``name()`` that is one line of PTX with no operands, ordered with
    memory (fences, commits, waits)."""
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    def typer(typingctx):
        def codegen(context, builder, sig, args):
            asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), []), ptx, "~{memory}",
                               side_effect=True)
            builder.call(asm, [])
            return context.get_dummy_value()

        return types.void(), codegen

    typer.__name__ = name
    return intrinsic(typer)


def asm_call(builder, ret, args_ir, arg_types, ptx: str, cons: str):
    """Emit ``ptx`` as inline assembly with side effects on ``args_ir`` (of LLVM types
    ``arg_types``), returning a value of LLVM type ``ret`` (``VoidType()`` for none)."""
    from llvmlite import ir

    fnty = ir.FunctionType(ret, arg_types)
    return builder.call(ir.InlineAsm(fnty, ptx, cons, side_effect=True), args_ir)
