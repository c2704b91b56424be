"""Thread-block clusters (sm_90): blocks that see each other's shared memory.

A *cluster* is a group of blocks (up to 8 portably) that the hardware places on
SMs of one GPC at the same time.  They can read, write and signal each other's
shared memory ("distributed shared memory"), synchronise all together, and a
TMA copy can *multicast* one box from global memory into the shared memory of
several of them at once: the box leaves L2 once and lands in every block the
mask names, at the same offset, counting its bytes on the mbarrier at the same
offset in each.

Functions, inside ``@cuda.jit`` kernels (shared addresses are 32-bit, as in
:mod:`gemmlib.intrinsics.hopper`):

``cluster_rank() -> uint32``        this block's rank in its cluster (``%cluster_ctarank``)
``cluster_blocks() -> uint32``      blocks in the cluster (``%cluster_nctarank``)
``cluster_sync()``                  every thread of every block of the cluster arrives and
                                    waits (release / acquire): shared memory written
                                    before it, mbarriers initialised before it, are seen
                                    by all the cluster's blocks after it
``peer_address(addr, rank) -> uint32``  ``mapa``: the same shared variable in block ``rank``
``mbarrier_arrive_peer(addr)``      one arrival on an mbarrier at a ``peer_address`` (the
                                    default ``.release.cta`` semantics, as CUTLASS's cluster
                                    barriers: with ``.release.cluster`` the arrival waited
                                    for the warpgroup's wgmma still in flight -- measured
                                    1.6x slower on an H100, ``results/lastmile-2026-11-25``)
``tma_load_2d_multicast(dst, tmap, x, y, bar, mask)``  ``tma_load_2d`` into every block
                                    of the cluster whose rank bit is set in ``mask``
``trap()``                          abort the kernel (a launch without the cluster it needs)

The simulator runs one block at a time, so its twins model a cluster of one
block: rank 0 of 1, ``peer_address`` is the address itself, a multicast is a
plain TMA copy, ``cluster_sync`` is the block's barrier.  Kernels are written for
any cluster size; CI runs them with clusters of one, the GPU tests with two.
"""
from __future__ import annotations

import threading

import numpy as np

from gemmlib.backend import SIMULATOR


def _make():
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    from gemmlib.intrinsics._lower import asm_call as _asm, bare

    i16, i32, i64 = ir.IntType(16), ir.IntType(32), ir.IntType(64)

    def _u(context, builder, v, t, to):
        return context.cast(builder, v, t, to)

    def _special(name, reg):
        def typer(typingctx):
            def codegen(context, builder, sig, args):
                return _asm(builder, i32, [], [], f"mov.u32 $0, {reg};", "=r")
            return types.uint32(), codegen
        typer.__name__ = name
        return intrinsic(typer)

    cluster_rank = _special("cluster_rank", "%cluster_ctarank")
    cluster_blocks = _special("cluster_blocks", "%cluster_nctarank")
    cluster_sync = bare("cluster_sync", "barrier.cluster.arrive.release; "
                                        "barrier.cluster.wait.acquire;")
    trap = bare("trap", "trap;")

    @intrinsic
    def peer_address(typingctx, addr, rank):
        def codegen(context, builder, sig, args):
            a = _u(context, builder, args[0], sig.args[0], types.uint32)
            r = _u(context, builder, args[1], sig.args[1], types.uint32)
            return _asm(builder, i32, [a, r], [i32, i32], "mapa.shared::cluster.u32 $0, $1, $2;",
                        "=r,r,r")
        return types.uint32(addr, rank), codegen

    @intrinsic
    def mbarrier_arrive_peer(typingctx, addr):
        def codegen(context, builder, sig, args):
            a = _u(context, builder, args[0], sig.args[0], types.uint32)
            _asm(builder, ir.VoidType(), [a], [i32],
                 "mbarrier.arrive.shared::cluster.b64 _, [$0];", "r,~{memory}")
            return context.get_dummy_value()
        return types.void(addr), codegen

    @intrinsic
    def tma_load_2d_multicast(typingctx, dst, tmap, x, y, bar, mask):
        def codegen(context, builder, sig, args):
            d = _u(context, builder, args[0], sig.args[0], types.uint32)
            t = _u(context, builder, args[1], sig.args[1], types.uint64)
            xx = _u(context, builder, args[2], sig.args[2], types.int32)
            yy = _u(context, builder, args[3], sig.args[3], types.int32)
            b = _u(context, builder, args[4], sig.args[4], types.uint32)
            m = _u(context, builder, args[5], sig.args[5], types.uint16)
            _asm(builder, ir.VoidType(), [d, t, xx, yy, b, m], [i32, i64, i32, i32, i32, i16],
                 "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
                 ".multicast::cluster [$0], [$1, {$2, $3}], [$4], $5;",
                 "r,l,r,r,r,h,~{memory}")
            return context.get_dummy_value()
        return types.void(dst, tmap, x, y, bar, mask), codegen

    return dict(cluster_rank=cluster_rank, cluster_blocks=cluster_blocks,
                cluster_sync=cluster_sync, peer_address=peer_address,
                mbarrier_arrive_peer=mbarrier_arrive_peer,
                tma_load_2d_multicast=tma_load_2d_multicast, trap=trap)


# --------------------------------------------------------------------------
# Simulator twins: a cluster of one block


def cluster_rank_py():
    return np.uint32(0)


def cluster_blocks_py():
    return np.uint32(1)


def cluster_sync_py():
    threading.current_thread().syncthreads()


def peer_address_py(addr, rank):
    if int(rank) != 0:
        raise RuntimeError(f"the simulator models clusters of one block: no rank {int(rank)}")
    return np.uint32(addr)


def mbarrier_arrive_peer_py(addr):
    from gemmlib.intrinsics import hopper

    hopper.mbarrier_arrive(addr)


def tma_load_2d_multicast_py(dst, tmap, x, y, bar, mask):
    from gemmlib.intrinsics import hopper

    if not int(mask) & 1:
        raise RuntimeError(f"multicast mask {int(mask):#x} leaves out the only block")
    hopper.tma_load_2d(dst, tmap, x, y, bar)


def trap_py():
    raise RuntimeError("trap: the kernel aborted")


_NAMES = ("cluster_rank", "cluster_blocks", "cluster_sync", "peer_address",
          "mbarrier_arrive_peer", "tma_load_2d_multicast", "trap")

if SIMULATOR:
    _impl = {n: globals()[n + "_py"] for n in _NAMES}
else:
    _impl = _make()

(cluster_rank, cluster_blocks, cluster_sync, peer_address, mbarrier_arrive_peer,
 tma_load_2d_multicast, trap) = (_impl[n] for n in _NAMES)
