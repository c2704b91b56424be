"""Hopper (sm_90a) instructions from numba: wgmma, mbarrier, TMA, fences (inline PTX).

Functions, inside ``@cuda.jit`` kernels (addresses are 32-bit shared-window
addresses from :func:`smem_addr`; descriptors and tensor maps are 64-bit):

``smem_addr(arr, i) -> uint32``  the shared-memory address of ``arr[i]``
``fence_proxy_async()``           ordinary shared stores -> visible to wgmma / TMA
``wgmma_fence()``, ``wgmma_commit()``, ``wgmma_wait(n)`` (a factory: n in 0..7)
``wgmma_f16(n)`` / ``wgmma_bf16(n)``  factories of m64nNk16 with fp32 accumulators:
    ``f(desc_a, desc_b, scale_d, c0, ..., c{n/2-1}) -> tuple of n/2 floats``
``mbarrier_init(bar, count)``, ``fence_mbarrier_init()``,
``mbarrier_expect_tx(bar, bytes)``, ``mbarrier_try_wait(bar, parity) -> uint32 (1: done)``
``tma_load_2d(dst, tmap, x, y, bar)``  box at column x, row y -> shared ``dst``
``tensormap_acquire(tmap)``       the map was written through the generic proxy
"""
from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.cuda import cgutils
from numba.cuda.core.errors import NumbaTypeError
from numba.cuda.extending import intrinsic

i32, i64, f32 = ir.IntType(32), ir.IntType(64), ir.FloatType()


def _asm(builder, ret, args_ir, arg_types, ptx, cons):
    fnty = ir.FunctionType(ret, arg_types)
    return builder.call(ir.InlineAsm(fnty, ptx, cons, side_effect=True), args_ir)


def _u(context, builder, v, t, to):
    return context.cast(builder, v, t, to)


@intrinsic
def smem_addr(typingctx, arr, i):
    if not (isinstance(arr, types.Array) and arr.ndim == 1):
        raise NumbaTypeError(f"smem_addr: a 1-D shared array, got {arr}")
    sig = types.uint32(arr, i)

    def codegen(context, builder, sig, args):
        aty, ity = sig.args
        ary = context.make_array(aty)(context, builder, args[0])
        ptr = cgutils.get_item_pointer(context, builder, aty, ary,
                                       [context.cast(builder, args[1], ity, types.intp)],
                                       wraparound=False)
        if ptr.type.addrspace != 3:
            ptr = builder.addrspacecast(ptr, ir.PointerType(ptr.type.pointee, 3))
        return builder.ptrtoint(ptr, i32)

    return sig, codegen


def _bare(name, ptx):
    def typer(typingctx):
        def codegen(context, builder, sig, args):
            _asm(builder, ir.VoidType(), [], [], ptx, "~{memory}")
            return context.get_dummy_value()
        return types.void(), codegen
    typer.__name__ = name
    return intrinsic(typer)


fence_proxy_async = _bare("fence_proxy_async", "fence.proxy.async.shared::cta;")
fence_mbarrier_init = _bare("fence_mbarrier_init", "fence.mbarrier_init.release.cluster;")
wgmma_fence = _bare("wgmma_fence", "wgmma.fence.sync.aligned;")
wgmma_commit = _bare("wgmma_commit", "wgmma.commit_group.sync.aligned;")
_WAITS = {n: _bare(f"wgmma_wait{n}", f"wgmma.wait_group.sync.aligned {n};") for n in range(8)}


def wgmma_wait(n: int):
    return _WAITS[n]


@intrinsic
def mbarrier_init(typingctx, bar, count):
    def codegen(context, builder, sig, args):
        a = _u(context, builder, args[0], sig.args[0], types.uint32)
        c = _u(context, builder, args[1], sig.args[1], types.uint32)
        _asm(builder, ir.VoidType(), [a, c], [i32, i32],
             "mbarrier.init.shared::cta.b64 [$0], $1;", "r,r,~{memory}")
        return context.get_dummy_value()
    return types.void(bar, count), codegen


@intrinsic
def mbarrier_expect_tx(typingctx, bar, nbytes):
    def codegen(context, builder, sig, args):
        a = _u(context, builder, args[0], sig.args[0], types.uint32)
        c = _u(context, builder, args[1], sig.args[1], types.uint32)
        _asm(builder, ir.VoidType(), [a, c], [i32, i32],
             "mbarrier.arrive.expect_tx.shared::cta.b64 _, [$0], $1;", "r,r,~{memory}")
        return context.get_dummy_value()
    return types.void(bar, nbytes), codegen


@intrinsic
def mbarrier_try_wait(typingctx, bar, parity):
    def codegen(context, builder, sig, args):
        a = _u(context, builder, args[0], sig.args[0], types.uint32)
        p = _u(context, builder, args[1], sig.args[1], types.uint32)
        return _asm(builder, i32, [a, p], [i32, i32],
                    "{ .reg .pred P1; mbarrier.try_wait.parity.shared::cta.b64 P1, [$1], $2; "
                    "selp.u32 $0, 1, 0, P1; }", "=r,r,r,~{memory}")
    return types.uint32(bar, parity), codegen


@intrinsic
def tensormap_acquire(typingctx, tmap):
    def codegen(context, builder, sig, args):
        t = _u(context, builder, args[0], sig.args[0], types.uint64)
        _asm(builder, ir.VoidType(), [t], [i64],
             "fence.proxy.tensormap::generic.acquire.gpu [$0], 128;", "l,~{memory}")
        return context.get_dummy_value()
    return types.void(tmap), codegen


@intrinsic
def tma_load_2d(typingctx, dst, tmap, x, y, bar):
    def codegen(context, builder, sig, args):
        d = _u(context, builder, args[0], sig.args[0], types.uint32)
        t = _u(context, builder, args[1], sig.args[1], types.uint64)
        xx = _u(context, builder, args[2], sig.args[2], types.int32)
        yy = _u(context, builder, args[3], sig.args[3], types.int32)
        b = _u(context, builder, args[4], sig.args[4], types.uint32)
        _asm(builder, ir.VoidType(), [d, t, xx, yy, b], [i32, i64, i32, i32, i32],
             "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes "
             "[$0], [$1, {$2, $3}], [$4];", "r,l,r,r,r,~{memory}")
        return context.get_dummy_value()
    return types.void(dst, tmap, x, y, bar), codegen


_WGMMA = {}


def _wgmma(n: int, ab: str):
    key = (n, ab)
    if key in _WGMMA:
        return _WGMMA[key]
    R = n // 2
    regs = ",".join(f"${e}" for e in range(R))
    ptx = ("{ .reg .pred p; setp.ne.b32 p, $" + str(R + 2) + ", 0; "
           f"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{ab}.{ab} "
           f"{{{regs}}}, ${R}, ${R + 1}, p, 1, 1, 0, 0; }}")
    cons = ",".join(["=f"] * R + ["l", "l", "r"] + [str(e) for e in range(R)]) + ",~{memory}"

    def typer_body(da, db, scale_d, cs):
        sig = types.UniTuple(types.float32, R)(da, db, scale_d, *cs)

        def codegen(context, builder, sig, args):
            a = _u(context, builder, args[0], sig.args[0], types.uint64)
            b = _u(context, builder, args[1], sig.args[1], types.uint64)
            s = _u(context, builder, args[2], sig.args[2], types.int32)
            acc = [_u(context, builder, v, t, types.float32) for v, t in zip(args[3:], sig.args[3:])]
            ret = ir.LiteralStructType([f32] * R)
            out = _asm(builder, ret, [a, b, s] + acc, [i64, i64, i32] + [f32] * R, ptx, cons)
            vals = [builder.extract_value(out, e) for e in range(R)]
            return context.make_tuple(builder, sig.return_type, vals)

        return sig, codegen

    # numba's intrinsics take no *args: spell out the R accumulator parameters
    names = ", ".join(f"c{e}" for e in range(R))
    ns = {"body": typer_body}
    exec(f"def wgmma_m64n{n}k16_{ab}(typingctx, da, db, scale_d, {names}):\n"
         f"    return body(da, db, scale_d, ({names},))\n", ns)  # noqa: S102
    _WGMMA[key] = intrinsic(ns[f"wgmma_m64n{n}k16_{ab}"])
    return _WGMMA[key]


def wgmma_f16(n: int):
    return _wgmma(n, "f16")


def wgmma_bf16(n: int):
    return _wgmma(n, "bf16")
