"""cp.async: copies from global to shared memory that run while the thread computes.

An ordinary copy to shared memory is two instructions, a load into a register
and a store from it, and the thread stalls at the store until the load has
come back from DRAM (hundreds of cycles).  Ampere (sm_80) added ``cp.async``:
one instruction that asks the memory system to move 4, 8 or 16 bytes from a
global address straight to a shared address, and returns at once.  The copy
lands later; the thread keeps computing meanwhile.  Three instructions make
it usable:

``cp.async.ca.shared.global [dst], [src], cp_size, src_size;``
    start a copy of ``cp_size`` bytes.  Only the first ``src_size`` bytes are
    read; the rest of the destination is filled with zeros.  ``src_size = 0``
    reads nothing and writes zeros: exactly what an edge tile that hangs over
    the matrix needs, with no branch around the instruction.  (``.ca`` caches
    in L1; the 16-byte form may use ``.cg``, which bypasses it.)
``cp.async.commit_group;``
    close the copies this thread started since the last commit into a *group*;
``cp.async.wait_group N;``
    wait until at most the ``N`` most recent groups are still in flight
    (``N = 0``: all of them have landed).

Waiting covers only *this thread's* copies.  Other threads' copies into the
same tile are covered by the ``syncthreads()`` that must follow the wait.

numba-cuda has no API for these, so each is an ``@intrinsic`` whose body is
LLVM IR holding a line of inline PTX (``llvmlite.ir.InlineAsm``).  The shared
destination is passed the way PTX wants it, as a 32-bit address in the
shared window (generic pointer -> ``addrspacecast`` to address space 3 ->
``ptrtoint i32``); the global source as a 64-bit address.  The asm is marked
as having side effects and clobbering memory, so the compiler neither drops
nor reorders it.

Three implementations of the same five functions:

* the intrinsics (GPU, sm_80 and newer);
* ``SYNC``: synchronous twins compiled as device functions -- a plain load
  and store, commit and wait doing nothing -- for GPUs without cp.async
  (sm_75, e.g. the T4 of Colab); kernels built with ``copy="sync"`` use them;
* the simulator twins, which keep the asynchronous *meaning*: a copy is only
  recorded when issued, groups are formed at commit, and the shared memory
  is written when ``wait_group`` retires the group.  A kernel that reads the
  tile before waiting therefore reads stale values in the simulator too,
  and fails verification in CI instead of only on a GPU.

Functions (usable inside ``@cuda.jit`` kernels):

``cp_async4(dst, di, src, si, sj, src_bytes)``
    copy the float ``src[si, sj]`` to ``dst[di]`` (``dst`` a 1-D shared float32
    array, ``src`` a C-contiguous 2-D float32 array, or the ``pitched`` view of one:
    :mod:`gemmlib.intrinsics.pitch`); ``src_bytes`` 4 copies, 0 writes 0.0 and reads
    nothing (``src[si, sj]`` must still be an element of ``src``: pass a clamped index).
``cp_async16(dst, di, src, si, sj, src_bytes)``
    the same for 16 bytes, ``src[si, sj:sj+4]`` -> ``dst[di:di+4]`` (float32) or
    ``src[si, sj:sj+8]`` -> ``dst[di:di+8]`` (uint16: FP16/BF16 bits); both
    addresses must be multiples of 16 bytes; ``src_bytes`` 0 to 16.
``cp_async_commit()``
``cp_async_wait_all()``  (``cp.async.wait_group 0``)
``cp_async_wait_one()``  (``cp.async.wait_group 1``: all but the newest group)
``cp_async_wait_group(n)``  returns the function ``cp.async.wait_group n`` (``n``
    is an immediate in the instruction, so one function per ``n``; multistage
    pipelines wait with ``n = stages - 2``)
"""

from __future__ import annotations

import threading

import numpy as np

from gemmlib.backend import SIMULATOR

#: compute capability cp.async needs
MIN_CC = (8, 0)


# --------------------------------------------------------------------------
# Simulator twins: deferred copies, per thread


class AsyncCopyError(RuntimeError):
    """A cp.async the GPU would reject (raised by the simulator twins only)."""


_sim = threading.local()


def _queues():
    if not hasattr(_sim, "open"):
        _sim.open = []     # issued since the last commit
        _sim.groups = []   # committed groups, oldest first
    return _sim


def _issue(dst, di, src, si, sj, src_bytes, cp_bytes):
    item = np.asarray(src).dtype.itemsize
    if np.asarray(dst).dtype != np.asarray(src).dtype:
        raise AsyncCopyError(f"dst ({np.asarray(dst).dtype}) and src ({np.asarray(src).dtype}) "
                             f"must have the same dtype")
    if src_bytes not in range(0, cp_bytes + 1, item):
        raise AsyncCopyError(f"src_bytes must be a multiple of {item} up to {cp_bytes}, "
                             f"got {src_bytes}")
    if cp_bytes == 16 and ((di * item) % 16 or (sj * item) % 16):
        raise AsyncCopyError(f"cp_async16 needs 16-byte aligned addresses: dst index {di} "
                             f"and source column {sj} must be multiples of {16 // item}")
    # a NumPy source (a pitched view: gemmlib.intrinsics.pitch) at its true address, rows
    # a pitch apart (a simulated argument is a fresh aligned copy: the column test suffices)
    if cp_bytes == 16 and isinstance(src, np.ndarray) and (
            src.ctypes.data + int(si) * src.strides[0] + int(sj) * src.strides[1]) % 16:
        raise AsyncCopyError(f"cp_async16 from [{si}, {sj}]: the source address is not a "
                             f"multiple of 16 (row stride {src.strides[0]} bytes)")
    n, total = int(src_bytes) // item, cp_bytes // item
    vals = [src[si, sj + e] for e in range(n)] + [0] * (total - n)
    _queues().open.append((dst, int(di), vals))


def cp_async4_py(dst, di, src, si, sj, src_bytes):
    _issue(dst, di, src, si, sj, src_bytes, 4)


def cp_async16_py(dst, di, src, si, sj, src_bytes):
    _issue(dst, di, src, si, sj, src_bytes, 16)


def cp_async_commit_py():
    q = _queues()
    q.groups.append(q.open)
    q.open = []


def _wait(n):
    q = _queues()
    while len(q.groups) > n:
        for dst, di, vals in q.groups.pop(0):
            for e, v in enumerate(vals):
                dst[di + e] = v


def cp_async_wait_all_py():
    _wait(0)


def cp_async_wait_one_py():
    _wait(1)


def _wait_group_py(n):
    def wait():
        _wait(n)
    return wait


# --------------------------------------------------------------------------
# Synchronous fallbacks (any GPU; device functions)


def _make_sync():
    from types import SimpleNamespace

    from gemmlib.backend import cuda, float32
    from gemmlib.intrinsics.index import uidx  # unsigned: no negative-index fix-up

    def copy4(dst, di, src, si, sj, src_bytes):
        dst[uidx(di)] = src[uidx(si), uidx(sj)] if src_bytes >= 4 else float32(0.0)

    def copy16(dst, di, src, si, sj, src_bytes):
        for e in range(4):
            v = src[uidx(si), uidx(sj + e)] if src_bytes >= 4 * (e + 1) else float32(0.0)
            dst[uidx(di + e)] = v

    def nothing():
        return

    dev = (lambda f: f) if SIMULATOR else cuda.jit(device=True)  # plain functions run in the simulator
    noop = dev(nothing)
    return SimpleNamespace(cp_async4=dev(copy4), cp_async16=dev(copy16),
                           cp_async_commit=noop, cp_async_wait_all=noop,
                           cp_async_wait_one=noop)


# --------------------------------------------------------------------------
# The intrinsics (GPU, sm_80+)


def _make_intrinsics():
    from llvmlite import ir
    from numba import types
    from numba.cuda.core.errors import NumbaTypeError
    from numba.cuda.extending import intrinsic

    from gemmlib.intrinsics._lower import bare, item_pointer, shared_address

    i32, i64 = ir.IntType(32), ir.IntType(64)

    def _check(dst, di, src, si, sj, nbytes, name):
        kinds = (types.float32,) if name == "cp_async4" else (types.float32, types.uint16)
        if not (isinstance(dst, types.Array) and dst.ndim == 1 and dst.dtype in kinds):
            raise NumbaTypeError(f"{name}: dst must be a 1-D shared array of {kinds}, got {dst}")
        if not (isinstance(src, types.Array) and src.ndim == 2 and src.dtype == dst.dtype
                and src.layout in "CA"):   # "A": a pitched view (gemmlib.intrinsics.pitch)
            raise NumbaTypeError(f"{name}: src must be a C-contiguous or pitched 2-D "
                                 f"{dst.dtype} array, got {src}")
        for v in (di, si, sj, nbytes):
            if not isinstance(v, types.Integer):
                raise NumbaTypeError(f"{name}: indices and src_bytes must be integers, got {v}")

    def _addresses(context, builder, sig, args):
        dty, dity, sty, sity, sjty, nty = sig.args
        daddr = shared_address(context, builder, dty, args[0], args[1], dity)
        sary = context.make_array(sty)(context, builder, args[2])
        sptr = item_pointer(context, builder, sty, sary,
                            [context.cast(builder, args[3], sity, types.intp),
                             context.cast(builder, args[4], sjty, types.intp)])
        saddr = builder.ptrtoint(sptr, i64)
        nbytes = context.cast(builder, args[5], nty, types.int32)
        return daddr, saddr, nbytes

    def _copy(name, ptx):
        def typer(typingctx, dst, di, src, si, sj, src_bytes):
            _check(dst, di, src, si, sj, src_bytes, name)
            sig = types.void(dst, di, src, si, sj, src_bytes)

            def codegen(context, builder, sig, args):
                daddr, saddr, nbytes = _addresses(context, builder, sig, args)
                fnty = ir.FunctionType(ir.VoidType(), [i32, i64, i32])
                asm = ir.InlineAsm(fnty, ptx, "r,l,r,~{memory}", side_effect=True)
                builder.call(asm, [daddr, saddr, nbytes])
                return context.get_dummy_value()

            return sig, codegen

        typer.__name__ = name
        return intrinsic(typer)

    cp_async4 = _copy("cp_async4", "cp.async.ca.shared.global [$0], [$1], 4, $2;")
    cp_async16 = _copy("cp_async16", "cp.async.cg.shared.global [$0], [$1], 16, $2;")

    _i_wait_groups.update({n: bare(f"cp_async_wait_group{n}", f"cp.async.wait_group {n};")
                           for n in range(8)})
    return dict(
        cp_async4=cp_async4, cp_async16=cp_async16,
        cp_async_commit=bare("cp_async_commit", "cp.async.commit_group;"),
        cp_async_wait_all=bare("cp_async_wait_all", "cp.async.wait_group 0;"),
        cp_async_wait_one=bare("cp_async_wait_one", "cp.async.wait_group 1;"),
    )


_i_wait_groups: dict = {}

if SIMULATOR:
    cp_async4, cp_async16 = cp_async4_py, cp_async16_py
    cp_async_commit, cp_async_wait_all, cp_async_wait_one = (
        cp_async_commit_py, cp_async_wait_all_py, cp_async_wait_one_py)
else:
    _i = _make_intrinsics()
    cp_async4, cp_async16 = _i["cp_async4"], _i["cp_async16"]
    cp_async_commit, cp_async_wait_all, cp_async_wait_one = (
        _i["cp_async_commit"], _i["cp_async_wait_all"], _i["cp_async_wait_one"])


def cp_async_wait_group(n: int):
    """The function that waits until at most ``n`` committed groups are in flight."""
    if not 0 <= n < 8:
        raise ValueError(f"wait_group takes 0..7 groups in flight, got {n}")
    return _wait_group_py(n) if SIMULATOR else _i_wait_groups[n]


#: The synchronous fallbacks, same names and signatures (for sm_75 builds).
SYNC = _make_sync()

#: The asynchronous set, as a namespace like SYNC (kernels pick one at build time).
ASYNC = type(SYNC)(cp_async4=cp_async4, cp_async16=cp_async16, cp_async_commit=cp_async_commit,
                   cp_async_wait_all=cp_async_wait_all, cp_async_wait_one=cp_async_wait_one)


def ops(copy: str):
    """The copy functions a kernel built with ``copy="async"`` or ``"sync"`` calls."""
    if copy == "async":
        return ASYNC
    if copy == "sync":
        return SYNC
    raise ValueError("copy must be 'async' (cp.async, sm_80+) or 'sync' (any GPU)")


__all__ = ["cp_async4", "cp_async16", "cp_async_commit", "cp_async_wait_all", "cp_async_wait_group",
           "cp_async_wait_one", "SYNC", "ASYNC", "ops", "MIN_CC", "AsyncCopyError",
           "cp_async4_py", "cp_async16_py", "cp_async_commit_py", "cp_async_wait_all_py",
           "cp_async_wait_one_py"]
