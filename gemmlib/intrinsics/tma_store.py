"""The copy engine's way out: shared-memory stores by address, and TMA stores.

``gemmlib.intrinsics.hopper`` brings tiles *in* (``tma_load_2d``, completing on an mbarrier).
These functions take a finished tile *out* (``gemmlib.kernels.wgmma_store``):

``st_shared_v2_f32(addr, a, b)``  two float32 to shared address ``addr`` (8 bytes, one
                                  ``st.shared.v2.f32``)
``st_shared_u32(addr, v)``        one 32-bit word (two 16-bit results packed) to ``addr``
``tma_store_2d(tmap, x, y, src)`` ``cp.async.bulk.tensor.2d.global.shared::cta.bulk_group``:
                                  the box of the map at column ``x``, row ``y`` of the
                                  matrix, read from shared address ``src`` in the map's
                                  swizzle.  Elements outside the matrix are not written,
                                  so a partial tile needs no predicates
``tma_store_3d(tmap, x, y, z, src)`` the same into matrix ``z`` of a stack's 3-D map
                                  (``gemmlib.tma.encode_2d`` with a batch): a box that
                                  hangs over the matrix's last row is cut there
``bulk_commit()``                 close the group of bulk copies this thread has started
``bulk_wait_read()``              wait until every committed group has *read* its shared
                                  memory (the tile may then be overwritten; the writes
                                  to global memory may still be under way)
``bulk_wait_all()``               wait until every committed group has finished (its
                                  writes done): before the thread exits

A TMA store is issued by one thread and completes on no mbarrier: the thread itself
tracks it in *bulk groups*.  The shared memory it reads was written by ordinary
stores, which the copy engine (the "async proxy") does not see by default: each
writing thread runs ``fence_proxy_async`` (``fence.proxy.async.shared::cta``) after
its stores and before the barrier the issuing thread waits on.

The simulator's twins act at once: a store writes its bytes into the block's shared
memory (``hopper``'s simulated address space), a TMA store copies the box out of it
into the map's NumPy array, and the group calls are no-ops.
"""
from __future__ import annotations

import numpy as np

from gemmlib.backend import SIMULATOR


def _make():
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    from gemmlib.intrinsics._lower import asm_call, bare

    i32, i64, f32 = ir.IntType(32), ir.IntType(64), ir.FloatType()

    def _asm(builder, args_ir, arg_types, ptx, cons):   # no result
        asm_call(builder, ir.VoidType(), args_ir, arg_types, ptx, cons)

    def _u(context, builder, v, t, to):
        return context.cast(builder, v, t, to)

    @intrinsic
    def st_shared_v2_f32(typingctx, addr, a, b):
        def codegen(context, builder, sig, args):
            p = _u(context, builder, args[0], sig.args[0], types.uint32)
            x = _u(context, builder, args[1], sig.args[1], types.float32)
            y = _u(context, builder, args[2], sig.args[2], types.float32)
            _asm(builder, [p, x, y], [i32, f32, f32], "st.shared.v2.f32 [$0], {$1, $2};",
                 "r,f,f,~{memory}")
            return context.get_dummy_value()
        return types.void(addr, a, b), codegen

    @intrinsic
    def st_shared_u32(typingctx, addr, v):
        def codegen(context, builder, sig, args):
            p = _u(context, builder, args[0], sig.args[0], types.uint32)
            x = _u(context, builder, args[1], sig.args[1], types.uint32)
            _asm(builder, [p, x], [i32, i32], "st.shared.b32 [$0], $1;", "r,r,~{memory}")
            return context.get_dummy_value()
        return types.void(addr, v), codegen

    @intrinsic
    def tma_store_2d(typingctx, tmap, x, y, src):
        def codegen(context, builder, sig, args):
            t = _u(context, builder, args[0], sig.args[0], types.uint64)
            xx = _u(context, builder, args[1], sig.args[1], types.int32)
            yy = _u(context, builder, args[2], sig.args[2], types.int32)
            s = _u(context, builder, args[3], sig.args[3], types.uint32)
            _asm(builder, [t, xx, yy, s], [i64, i32, i32, i32],
                 "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [$0, {$1, $2}], [$3];",
                 "l,r,r,r,~{memory}")
            return context.get_dummy_value()
        return types.void(tmap, x, y, src), codegen

    @intrinsic
    def tma_store_3d(typingctx, tmap, x, y, z, src):
        def codegen(context, builder, sig, args):
            t = _u(context, builder, args[0], sig.args[0], types.uint64)
            xx, yy, zz = (_u(context, builder, args[i], sig.args[i], types.int32)
                          for i in (1, 2, 3))
            s = _u(context, builder, args[4], sig.args[4], types.uint32)
            _asm(builder, [t, xx, yy, zz, s], [i64, i32, i32, i32, i32],
                 "cp.async.bulk.tensor.3d.global.shared::cta.bulk_group "
                 "[$0, {$1, $2, $3}], [$4];", "l,r,r,r,r,~{memory}")
            return context.get_dummy_value()
        return types.void(tmap, x, y, z, src), codegen

    return dict(st_shared_v2_f32=st_shared_v2_f32, st_shared_u32=st_shared_u32,
                tma_store_2d=tma_store_2d, tma_store_3d=tma_store_3d,
                bulk_commit=bare("bulk_commit", "cp.async.bulk.commit_group;"),
                bulk_wait_read=bare("bulk_wait_read", "cp.async.bulk.wait_group.read 0;"),
                bulk_wait_all=bare("bulk_wait_all", "cp.async.bulk.wait_group 0;"))


# --------------------------------------------------------------------------
# Simulator twins


def _put(addr, values: np.ndarray):
    from gemmlib.intrinsics.hopper import _SIM_LOCK, _bytes_at

    raw = values.view(np.uint8)
    buf, off = _bytes_at(int(addr), raw.size)
    with _SIM_LOCK:
        buf[off:off + raw.size] = raw


def st_shared_v2_f32_py(addr, a, b):
    _put(addr, np.array([a, b], dtype=np.float32))


def st_shared_u32_py(addr, v):
    _put(addr, np.array([v], dtype=np.uint32))


def tma_store_2d_py(tmap, x, y, src):
    tma_store_3d_py(tmap, x, y, 0, src)


def tma_store_3d_py(tmap, x, y, z, src):
    from gemmlib import tma
    from gemmlib.intrinsics.hopper import _SIM_LOCK, _bytes_at

    m = tma.simulated_map(int(tmap))
    (brows, bcols), dst = m.box, m.array
    if dst.ndim == 3:                             # a stack's map: matrix z
        if not 0 <= int(z) < dst.shape[0]:
            return
        dst = dst[int(z)]
    eb = dst.itemsize
    buf, off = _bytes_at(int(src), brows * bcols * eb)
    with _SIM_LOCK:
        flat = buf[off:off + brows * bcols * eb].copy().view(dst.dtype)
    x, y = int(x), int(y)
    for r in range(brows):
        if not 0 <= y + r < dst.shape[0]:
            continue
        for c in range(bcols):
            if 0 <= x + c < dst.shape[1]:   # the copy engine drops what leaves the matrix
                dst[y + r, x + c] = flat[tma.swizzled_offset(r, c, bcols, eb, m.swizzle)]


def _nothing(*args):
    return None


_NAMES = ("st_shared_v2_f32", "st_shared_u32", "tma_store_2d", "tma_store_3d", "bulk_commit",
          "bulk_wait_read", "bulk_wait_all")

if SIMULATOR:
    _impl = dict(st_shared_v2_f32=st_shared_v2_f32_py, st_shared_u32=st_shared_u32_py,
                 tma_store_2d=tma_store_2d_py, tma_store_3d=tma_store_3d_py,
                 bulk_commit=_nothing, bulk_wait_read=_nothing,
                 bulk_wait_all=_nothing)
else:
    _impl = _make()

(st_shared_v2_f32, st_shared_u32, tma_store_2d, tma_store_3d, bulk_commit, bulk_wait_read,
 bulk_wait_all) = (_impl[n] for n in _NAMES)
