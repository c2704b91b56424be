"""Hopper (sm_90a) from Python: warpgroup MMA, the tensor memory accelerator, mbarriers.

Hopper adds three things the ``mma.sync`` rungs cannot use:

* ``wgmma.mma_async``: a *warpgroup* (four consecutive warps, 128 threads)
  issues one 64 x N x 16 product whose A and B come straight from shared
  memory, described by 64-bit *matrix descriptors* (:func:`smem_desc`); the
  fp32 accumulators stay in registers (N/2 per thread).  It is asynchronous:
  ``wgmma.fence`` before, ``commit_group`` after, ``wait_group n`` before the
  accumulators are read.
* ``cp.async.bulk.tensor`` (TMA): one thread asks the copy engine for a
  whole tile, described by a *tensor map* encoded on the host
  (:mod:`gemmlib.tma`), out-of-bounds elements filled with zeros, optionally
  written in a swizzled order that wgmma's descriptors understand.
* ``mbarrier``: a barrier in shared memory that counts arrivals *and bytes*;
  the TMA copy signals its bytes on it, and waiting threads poll its phase.

numba-cuda compiles for the arch-specific target ``sm_90a`` on a compute
capability 9.0 device, so these instructions are reachable through inline
PTX (``@intrinsic``), as the other intrinsics are.  In numba's simulator
each has a plain-Python twin (below) that reads shared memory through the
same descriptors and swizzles, so CI checks a kernel's descriptor math;
on a GPU other than Hopper, kernels that use them refuse with a
``ConstraintError``.

Functions, inside ``@cuda.jit`` kernels (shared addresses are 32-bit
shared-window addresses from :func:`smem_addr`; descriptors and tensor-map
pointers are 64-bit):

``smem_addr(arr, i) -> uint32``     the shared-memory address of ``arr[i]``
``fence_proxy_async()``             make ordinary shared stores visible to wgmma / TMA
``wgmma_fence()``, ``wgmma_commit()``, ``wgmma_wait(n)`` (a factory, n in 0..7)
``wgmma_f16(n)``, ``wgmma_bf16(n)`` factories of ``m64nNk16`` with fp32 accumulators:
    ``f(desc_a, desc_b, scale_d, c0, ..., c{n/2 - 1}) -> n/2 floats``
    (``scale_d = 0`` ignores the c's: D = A B; 1: D = A B + C); with ``in_place=True``
    ``f(desc_a, desc_b, scale_d, acc, offset)`` updates ``acc[offset:offset + n/2]``
``mbarrier_init(bar, count)``, ``fence_mbarrier_init()``,
``mbarrier_expect_tx(bar, nbytes)`` (arrive, expecting ``nbytes`` from copies),
``mbarrier_try_wait(bar, parity) -> uint32`` (1 once phase ``parity`` completed)
``mbarrier_arrive(bar)``             one plain arrival (a consumer releasing a buffer)
``setmaxnreg(n, increase)``          (a factory) move registers between warpgroups
``tma_load_2d(dst, tmap, x, y, bar)`` the box at column ``x``, row ``y`` -> ``dst``
``tensormap_acquire(tmap)``          the map was written through the generic proxy
``grid_dependency_wait()``           wait for the grids this one may overlap (see below)
``launch_dependents()``              let the next grid on the stream start launching

Programmatic dependent launch (``griddepcontrol``).  A kernel launched with the
programmatic-serialization attribute may start while the stream's previous kernel is still
running; ``grid_dependency_wait`` holds the thread until that kernel has finished and its
writes are visible, so a kernel that calls it before touching global memory may be so
launched (:func:`gemmlib.kernels.ws_pipeline.early_launch`).  ``launch_dependents`` lets
the next such kernel launch once every block of this one has called it (else as they exit).

Measured on an H100 (``results/hopper-2026-11-23/``, kept as
``tests/test_hopper.py``): wgmma m64n8k16 from unswizzled and 128-byte
swizzled descriptors, TMA boxes with zero fill and the 128-byte swizzle, and
TMA + mbarrier feeding wgmma all give the right products.
"""
from __future__ import annotations

import functools

import numpy as np

from gemmlib.backend import SIMULATOR

#: wgmma, TMA and mbarrier expect_tx need compute capability 9.0 (sm_90a for wgmma)
MIN_CC = (9, 0)

#: ``alignment=`` for shared tiles that wgmma reads swizzled or TMA writes: 1024 bytes
#: (the swizzle XORs address bits 4-9); None in the simulator, which refuses alignment and
#: places every shared array at a 1024-byte aligned simulated address anyway
TILE_ALIGN = None if SIMULATOR else 1024
#: ``alignment=`` for an mbarrier (a 64-bit word)
BAR_ALIGN = None if SIMULATOR else 8

#: swizzle modes of a wgmma matrix descriptor (bits 62-63), by bytes per swizzled row
SWIZZLE_MODE = {0: 0, 128: 1, 64: 2, 32: 3}


class HopperOnly(RuntimeError):
    """A Hopper instruction called where it cannot run (numba's simulator)."""


def desc_fields(addr: int, lbo: int, sbo: int, swizzle_bytes: int = 0) -> int:
    """The 64-bit wgmma shared-memory matrix descriptor, on the host (the device
    version is :func:`smem_desc`): start address, leading-dimension byte offset
    (between core matrices adjacent along K), stride byte offset (adjacent along
    M or N), each stored >> 4 in 14 bits, and the swizzle mode."""
    return (((addr & 0x3FFFF) >> 4) | (((lbo & 0x3FFFF) >> 4) << 16)
            | (((sbo & 0x3FFFF) >> 4) << 32) | (SWIZZLE_MODE[swizzle_bytes] << 62))


def _make():
    from llvmlite import ir
    from numba import types
    from numba.cuda.core.errors import NumbaTypeError
    from numba.cuda.extending import intrinsic

    from gemmlib.intrinsics._lower import asm_call as _asm, bare, shared_address

    i32, i64, f32 = ir.IntType(32), ir.IntType(64), ir.FloatType()

    def _u(context, builder, v, t, to):
        return context.cast(builder, v, t, to)

    @intrinsic
    def smem_addr(typingctx, arr, i):
        if not (isinstance(arr, types.Array) and arr.ndim == 1):
            raise NumbaTypeError(f"smem_addr: a 1-D shared array, got {arr}")

        def codegen(context, builder, sig, args):
            return shared_address(context, builder, sig.args[0], args[0], args[1], sig.args[1])

        return types.uint32(arr, i), codegen

    fence_proxy_async = bare("fence_proxy_async", "fence.proxy.async.shared::cta;")
    fence_mbarrier_init = bare("fence_mbarrier_init", "fence.mbarrier_init.release.cluster;")
    wgmma_fence = bare("wgmma_fence", "wgmma.fence.sync.aligned;")
    wgmma_commit = bare("wgmma_commit", "wgmma.commit_group.sync.aligned;")
    _WAITS = {n: bare(f"wgmma_wait{n}", f"wgmma.wait_group.sync.aligned {n};") for n in range(8)}
    grid_dependency_wait = bare("grid_dependency_wait", "griddepcontrol.wait;")
    launch_dependents = bare("launch_dependents", "griddepcontrol.launch_dependents;")

    def _bar_u32(name, ptx):
        """An intrinsic f(bar, value): a barrier address and one 32-bit operand."""
        def typer(typingctx, bar, value):
            def codegen(context, builder, sig, args):
                a = _u(context, builder, args[0], sig.args[0], types.uint32)
                c = _u(context, builder, args[1], sig.args[1], types.uint32)
                _asm(builder, ir.VoidType(), [a, c], [i32, i32], ptx, "r,r,~{memory}")
                return context.get_dummy_value()
            return types.void(bar, value), codegen
        typer.__name__ = name
        return intrinsic(typer)

    mbarrier_init = _bar_u32("mbarrier_init", "mbarrier.init.shared::cta.b64 [$0], $1;")

    def _one_operand(name, ptx, numba_type, ir_type, constraint):
        """An intrinsic f(x) issuing ``ptx`` with one operand (a shared or global address)."""
        def typer(typingctx, x):
            def codegen(context, builder, sig, args):
                v = _u(context, builder, args[0], sig.args[0], numba_type)
                _asm(builder, ir.VoidType(), [v], [ir_type], ptx, constraint + ",~{memory}")
                return context.get_dummy_value()
            return types.void(x), codegen
        typer.__name__ = name
        return intrinsic(typer)

    mbarrier_arrive = _one_operand("mbarrier_arrive", "mbarrier.arrive.shared::cta.b64 _, [$0];",
                                   types.uint32, i32, "r")
    tensormap_acquire = _one_operand("tensormap_acquire",
                                     "fence.proxy.tensormap::generic.acquire.gpu [$0], 128;",
                                     types.uint64, i64, "l")

    _REGS = {}

    def _setmaxnreg(n: int, inc: bool):
        key = (n, inc)
        if key not in _REGS:
            d = "inc" if inc else "dec"
            _REGS[key] = bare(f"setmaxnreg_{d}{n}", f"setmaxnreg.{d}.sync.aligned.u32 {n};")
        return _REGS[key]

    mbarrier_expect_tx = _bar_u32("mbarrier_expect_tx",
                                  "mbarrier.arrive.expect_tx.shared::cta.b64 _, [$0], $1;")

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

    def _ld_global(name, ptx_type, numba_type, ir_type, constraint):
        """An intrinsic f(addr) -> value: one ``ld.global`` from a 64-bit address."""
        def typer(typingctx, addr):
            def codegen(context, builder, sig, args):
                a = _u(context, builder, args[0], sig.args[0], types.uint64)
                return _asm(builder, ir_type, [a], [i64], f"ld.global.{ptx_type} $0, [$1];",
                            f"={constraint},l,~{{memory}}")
            return numba_type(addr), codegen
        typer.__name__ = name
        return intrinsic(typer)

    ld_global_u64 = _ld_global("ld_global_u64", "u64", types.uint64, i64, "l")
    ld_global_f32 = _ld_global("ld_global_f32", "f32", types.float32, f32, "f")

    _WGMMA = {}

    def _wgmma(n: int, ab: str, trans_b: bool = False, in_place: bool = False,
               trans_a: bool = False):
        key = (n, ab, trans_b, in_place, trans_a)
        if key in _WGMMA:
            return _WGMMA[key]
        R = n // 2
        regs = ",".join(f"${e}" for e in range(R))
        kk = WGMMA_K[ab]
        # immediates: scale-a, scale-b (1: no negation); 16-bit types add trans-a (0: K-major
        # A; 1: A is MN-major, rows of M contiguous, as a row-major (K, M) matrix) and
        # trans-b (1: B is MN-major, rows of N contiguous, as a row-major (K, N) matrix);
        # tf32 and the 8-bit types have no trans immediates: both K-major
        imm = (f", 1, 1, {int(trans_a)}, {int(trans_b)}" if ab in ("f16", "bf16")
               else ", 1, 1")
        ptx = ("{ .reg .pred p; setp.ne.b32 p, $" + str(R + 2) + ", 0; "
               f"wgmma.mma_async.sync.aligned.m64n{n}k{kk}.f32.{ab}.{ab} "
               f"{{{regs}}}, ${R}, ${R + 1}, p{imm}; }}")
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

        fname = f"wgmma_m64n{n}k{kk}_{ab}" + ("_ta" if trans_a else "") + (
            "_tb" if trans_b else "")
        if in_place:
            def in_place_typer(typingctx, da, db, scale_d, acc, offset):
                """One typed call for the whole instruction: the R accumulators are read
                from ``acc[offset:offset + R]`` and the results written back (numba would
                otherwise type R getitems, R setitems and an R-tuple at every call)."""
                if not (isinstance(acc, types.Array) and acc.ndim == 1
                        and acc.dtype == types.float32):
                    raise NumbaTypeError(f"{fname}: acc must be a 1-D float32 array, got {acc}")
                if not isinstance(offset, types.IntegerLiteral):   # numba retries with the
                    raise NumbaTypeError(f"{fname}: offset must be a constant")   # literal

                def codegen(context, builder, sig, args):
                    a = _u(context, builder, args[0], sig.args[0], types.uint64)
                    b = _u(context, builder, args[1], sig.args[1], types.uint64)
                    s = _u(context, builder, args[2], sig.args[2], types.int32)
                    data = context.make_array(sig.args[3])(context, builder, args[3]).data
                    # constant indices: once inlined, SROA keeps a local acc in registers
                    ptrs = [builder.gep(data, [ir.Constant(i64, offset.literal_value + e)],
                                        inbounds=True) for e in range(R)]
                    ret = ir.LiteralStructType([f32] * R)
                    out = _asm(builder, ret, [a, b, s] + [builder.load(p) for p in ptrs],
                               [i64, i64, i32] + [f32] * R, ptx, cons)
                    for e, p in enumerate(ptrs):
                        builder.store(builder.extract_value(out, e), p)
                    return context.get_dummy_value()

                return types.void(da, db, scale_d, acc, offset), codegen

            in_place_typer.__name__ = fname + "_acc"
            _WGMMA[key] = intrinsic(in_place_typer)
            return _WGMMA[key]

        # numba's intrinsics take no *args: spell out the R accumulator parameters
        names = ", ".join(f"c{e}" for e in range(R))
        ns = {"body": typer_body}
        exec(f"def {fname}(typingctx, da, db, scale_d, {names}):\n"
             f"    return body(da, db, scale_d, ({names},))\n", ns)  # noqa: S102
        _WGMMA[key] = intrinsic(ns[fname])
        return _WGMMA[key]

    return dict(smem_addr=smem_addr, fence_proxy_async=fence_proxy_async,
                fence_mbarrier_init=fence_mbarrier_init, wgmma_fence=wgmma_fence,
                wgmma_commit=wgmma_commit, waits=_WAITS, mbarrier_init=mbarrier_init,
                mbarrier_expect_tx=mbarrier_expect_tx, mbarrier_try_wait=mbarrier_try_wait,
                mbarrier_arrive=mbarrier_arrive, tensormap_acquire=tensormap_acquire,
                tma_load_2d=tma_load_2d, wgmma=_wgmma, setmaxnreg=_setmaxnreg,
                ld_global_u64=ld_global_u64, ld_global_f32=ld_global_f32,
                grid_dependency_wait=grid_dependency_wait, launch_dependents=launch_dependents)


# --------------------------------------------------------------------------
# Simulator twins
#
# Shared memory gets a simulated 18-bit address space per block: each shared
# array (the buffer a view belongs to) is placed at its own 1024-byte aligned
# base the first time ``smem_addr`` sees it, so descriptors, swizzles (which
# XOR address bits) and mbarrier addresses mean what they mean on the GPU.
# wgmma and TMA complete at once (their wait and barrier steps are then
# bookkeeping); wgmma reads its operands through the descriptors, so a wrong
# start, LBO, SBO or swizzle gives a wrong product in CI, not only on a GPU.


def _block_state():
    import threading

    t = threading.current_thread()
    st = getattr(t, "_gemmlib_hopper", None)   # a simulated thread keeps its block's
    if st is not None:
        return st
    mgr = getattr(t, "_manager", None)
    if mgr is None:
        raise HopperOnly("Hopper intrinsics run only inside a (simulated) kernel")
    with _SIM_LOCK:
        blocks = mgr.__dict__.setdefault("_gemmlib_hopper", {})
        st = blocks.get(tuple(t.blockIdx))
        if st is None:
            st = blocks[tuple(t.blockIdx)] = {"bases": [], "next": 1024, "bars": {}}
    t._gemmlib_hopper = st
    return st


def _root(arr):
    while isinstance(getattr(arr, "base", None), np.ndarray):
        arr = arr.base
    return arr


def smem_addr_py(arr, i):
    st = _block_state()
    root = _root(arr)
    key = (root.__array_interface__["data"][0], root.nbytes)   # the dynamic shared array is
    with _SIM_LOCK:                                             # a new view in every thread
        for base, r in st["bases"]:
            if (r.__array_interface__["data"][0], r.nbytes) == key:
                break
        else:
            base = st["next"]
            st["bases"].append((base, root))
            st["next"] = base + -(-root.nbytes // 1024) * 1024
    off = arr.__array_interface__["data"][0] - root.__array_interface__["data"][0]
    return np.uint32(base + off + int(i) * arr.itemsize)


def _bytes_at(addr: int, nbytes: int = 0):
    """(uint8 view of the shared buffer holding ``addr``, byte offset in it)."""
    st = _block_state()
    for base, root in st["bases"]:
        if base <= addr and addr + nbytes <= base + root.nbytes:
            return root.reshape(-1).view(np.uint8), addr - base
    raise HopperOnly(f"shared address {addr:#x} is in no shared array this block has "
                     "passed to smem_addr")


def _operand(desc: int, rows: int, dtype, mn_major: bool = False) -> np.ndarray:
    """The operand of one k-step a wgmma descriptor points at: (rows, 32 bytes of k) --
    16 halves, 8 tf32 or 32 fp8 per row, as ``dtype`` says.  K-major (each row's k
    contiguous), or ``mn_major`` (16-bit only: each k's rows contiguous, B of a row-major
    (K, N))."""
    eb = np.dtype(dtype).itemsize
    start = (desc & 0x3FFF) << 4
    lbo = ((desc >> 16) & 0x3FFF) << 4
    sbo = ((desc >> 32) & 0x3FFF) << 4
    mode = desc >> 62
    r = np.arange(rows)[:, None]
    kb = np.arange(0, 32, eb)[None, :]      # the byte of each k in the step's 32 bytes
    k = kb // 2                             # (MN-major: 16-bit k)
    span = {0: 16, 1: 128, 2: 64, 3: 32}[mode]
    if mode == 0 and not mn_major:   # 8 x 16-byte core matrices: LBO along K, SBO along M/N
        addr = start + (r // 8) * sbo + (kb // 16) * lbo + (r % 8) * 16 + kb % 16
    elif mode == 0:   # core matrices of 8 k x 8 rows: SBO along M/N, LBO along K
        addr = start + (r // 8) * sbo + (k // 8) * lbo + (k % 8) * 16 + (r % 8) * 2
    elif not mn_major:   # rows of S bytes (S = 128, 64, 32) along K; SBO: 8 rows further
        addr = start + (r // 8) * sbo + (r % 8) * span + kb
    else:   # S-byte rows along M/N, one per k; LBO: the next S bytes of M/N, SBO: 8 k further
        per = span // 2
        addr = start + (r // per) * lbo + (k // 8) * sbo + (k % 8) * span + (r % per) * 2
    if mode:   # the swizzle: chunk bits (4..) XOR-ed with address bits 7..
        addr = addr ^ (((addr >> 7) & (span // 16 - 1)) << 4)
    buf, off0 = _bytes_at(int(addr.min()), eb)
    return buf[(addr - addr.min() + off0)[..., None] + np.arange(eb)].copy().view(dtype)[..., 0]


#: the low 13 mantissa bits of a float32, which a TF32 tensor-core input leaves out
TF32_DROPPED = np.uint32(0x1FFF)


def fp8_values(fmt: str) -> np.ndarray:
    """The 256 float32 values of an 8-bit format by bit pattern: ``"e4m3"`` (OCP E4M3FN:
    bias 7, no Inf, NaN = S.1111.111, max 448) or ``"e5m2"`` (bias 15, IEEE-like)."""
    ebits, mbits = {"e4m3": (4, 3), "e5m2": (5, 2)}[fmt]
    bias = 2 ** (ebits - 1) - 1
    u = np.arange(256)
    sign = np.where(u >> 7, -1.0, 1.0)
    e = (u >> mbits) & (2 ** ebits - 1)
    m = u & (2 ** mbits - 1)
    val = np.where(e == 0, m / 2 ** mbits * 2.0 ** (1 - bias),
                   (1 + m / 2 ** mbits) * 2.0 ** (e - bias))
    val = sign * val
    if fmt == "e4m3":
        val[(u & 0x7F) == 0x7F] = np.nan
    else:
        top = e == 2 ** ebits - 1
        val[top & (m == 0)] = sign[top & (m == 0)] * np.inf
        val[top & (m != 0)] = np.nan
    return val.astype(np.float32)


def _wgmma_py(n: int, ab: str, trans_b: bool = False, in_place: bool = False,
              trans_a: bool = False):
    from gemmlib.intrinsics.mma import _exchange

    dtype = {"f16": np.float16, "bf16": np.uint16, "tf32": np.uint32}.get(ab, np.uint8)

    def value(x):
        if ab == "bf16":   # bit patterns -> float32
            return (x.astype(np.uint32) << 16).view(np.float32)
        if ab == "tf32":   # what the tensor core reads of a float32: its top 19 bits
            return (x & ~TF32_DROPPED).view(np.float32)
        if ab in ("e4m3", "e5m2"):
            return fp8_values(ab)[x]
        return x

    def product(vals):   # the warpgroup's, once: its operands read as the last thread arrives
        if any(v != vals[0] for v in vals):
            raise HopperOnly("the 128 threads of a warpgroup passed different descriptors")
        A = value(_operand(vals[0][0], 64, dtype, mn_major=trans_a))
        B = value(_operand(vals[0][1], n, dtype, mn_major=trans_b))
        # einsum, not @: simulated threads at once in OpenBLAS overrun its buffer slots
        return np.einsum("mk,nk->mn", A.astype(np.float64), B.astype(np.float64))

    def wgmma(da, db, scale_d, *acc):
        (_, D), t = _exchange((int(da), int(db)), width=128, once=product)
        base = np.array([float(c) for c in acc]) if int(scale_d) else 0.0
        return tuple((base + D[_accumulator_index(t, n)]).astype(np.float32))

    wgmma.__name__ = f"wgmma_m64n{n}k{WGMMA_K[ab]}_{ab}" + ("_ta" if trans_a else "") + "_py"
    if not in_place:
        return wgmma

    def wgmma_acc(da, db, scale_d, acc, offset):   # the array form: acc updated in place
        o = int(offset)
        acc[o:o + n // 2] = wgmma(da, db, scale_d, *acc[o:o + n // 2])

    wgmma_acc.__name__ = wgmma.__name__[:-3] + "_acc_py"
    return wgmma_acc


def _bar(addr):
    st = _block_state()
    bars = st["bars"]
    if int(addr) not in bars:
        raise HopperOnly(f"mbarrier at {int(addr):#x} was not initialised")
    return bars[int(addr)]


def _bar_step(b, arrive: int, tx: int):
    b["arrived"] += arrive
    b["tx"] += tx
    if b["arrived"] >= b["count"] and b["tx"] == 0:   # the phase completes
        b["phase"] += 1
        b["arrived"] = 0
        _PHASE_DONE.notify_all()   # (every caller holds _SIM_LOCK)


def mbarrier_init_py(bar, count):
    st = _block_state()
    with _SIM_LOCK:
        st["bars"][int(bar)] = {"count": int(count), "arrived": 0, "tx": 0, "phase": 0}


def mbarrier_expect_tx_py(bar, nbytes):
    with _SIM_LOCK:
        _bar_step(_bar(bar), 1, int(nbytes))


def mbarrier_arrive_py(bar):
    with _SIM_LOCK:
        _bar_step(_bar(bar), 1, 0)


def mbarrier_try_wait_py(bar, parity):
    with _SIM_LOCK:
        b = _bar(bar)
        done = b["phase"] % 2 != int(parity)   # phase ``parity`` has completed
        if not done:
            # suspend until some phase completes (try_wait too suspends for a while), instead
            # of spinning: a spinning simulated thread takes the GIL from the one it waits for
            _PHASE_DONE.wait(timeout=0.05)
            done = b["phase"] % 2 != int(parity)
    return np.uint32(done)


def tma_load_2d_py(dst, tmap, x, y, bar):
    from gemmlib import tma

    m = tma.simulated_map(int(tmap))
    (brows, bcols), src = m.box, m.array
    eb = src.itemsize
    box = np.zeros((brows, bcols), src.dtype)
    part = src[max(int(y), 0):int(y) + brows, max(int(x), 0):int(x) + bcols]
    box[max(-int(y), 0):max(-int(y), 0) + part.shape[0],
        max(-int(x), 0):max(-int(x), 0) + part.shape[1]] = part
    buf, off = _bytes_at(int(dst), brows * bcols * eb)
    flat = np.zeros(brows * bcols, src.dtype)
    for r in range(brows):
        for c in range(bcols):
            flat[tma.swizzled_offset(r, c, bcols, eb, m.swizzle)] = box[r, c]
    with _SIM_LOCK:
        buf[off:off + flat.nbytes] = flat.view(np.uint8)
        _bar_step(_bar(bar), 0, -flat.nbytes)


def ld_global_u64_py(addr):
    from gemmlib import tma

    return np.uint64(tma.simulated_word(int(addr)))


def ld_global_f32_py(addr):
    from gemmlib import tma

    return np.float32(tma.simulated_word(int(addr)))


def _nothing(*args):
    return None


def wgmma_wait_py():
    """``wgmma.wait_group``: where the warpgroup meets, as on the GPU -- past it the
    operands have been read (the twin's wgmma reads them once, when the warpgroup's last
    thread calls it), so a single thread may then release the stage."""
    from gemmlib.intrinsics.mma import _exchange

    _exchange(None, width=128)


_SIM_LOCK = __import__("threading").RLock()
_PHASE_DONE = __import__("threading").Condition(_SIM_LOCK)   # an mbarrier phase completed

_NAMES = ("smem_addr", "fence_proxy_async", "fence_mbarrier_init", "wgmma_fence", "wgmma_commit",
          "mbarrier_init", "mbarrier_expect_tx", "mbarrier_try_wait", "mbarrier_arrive",
          "tensormap_acquire", "tma_load_2d", "ld_global_u64", "ld_global_f32",
          "grid_dependency_wait", "launch_dependents")

if SIMULATOR:
    _impl = dict(smem_addr=smem_addr_py, fence_proxy_async=_nothing,
                 fence_mbarrier_init=_nothing, wgmma_fence=_nothing, wgmma_commit=_nothing,
                 mbarrier_init=mbarrier_init_py, mbarrier_expect_tx=mbarrier_expect_tx_py,
                 mbarrier_try_wait=mbarrier_try_wait_py, mbarrier_arrive=mbarrier_arrive_py,
                 tensormap_acquire=_nothing, tma_load_2d=tma_load_2d_py,
                 waits={n: wgmma_wait_py for n in range(8)}, wgmma=_wgmma_py,
                 setmaxnreg=lambda n, inc: _nothing, ld_global_u64=ld_global_u64_py,
                 ld_global_f32=ld_global_f32_py, grid_dependency_wait=_nothing,
                 launch_dependents=_nothing)
else:
    _impl = _make()

(smem_addr, fence_proxy_async, fence_mbarrier_init, wgmma_fence, wgmma_commit, mbarrier_init,
 mbarrier_expect_tx, mbarrier_try_wait, mbarrier_arrive, tensormap_acquire,
 tma_load_2d, ld_global_u64, ld_global_f32, grid_dependency_wait,
 launch_dependents) = (_impl[n] for n in _NAMES)

#: N of the m64nNk16 shapes wgmma offers with fp32 accumulators
WGMMA_N = tuple(range(8, 257, 8))
#: K of one wgmma per input type: always 32 bytes of each row of A and B
WGMMA_K = {"f16": 16, "bf16": 16, "tf32": 8, "e4m3": 32, "e5m2": 32}


def wgmma_wait(n: int):
    """``wgmma.wait_group n``: at most ``n`` committed wgmma groups still in flight."""
    if not 0 <= n < 8:
        raise ValueError(f"wgmma_wait takes 0..7 groups in flight, got {n}")
    return _impl["waits"][n]


def wgmma_f16(n: int, trans_b: bool = False, in_place: bool = False, trans_a: bool = False):
    """``wgmma.mma_async m64n{n}k16.f32.f16.f16`` (both operands from descriptors; with
    ``trans_b`` B's descriptor describes an MN-major tile, with ``trans_a`` A's: see
    :func:`wgmma_bf16`).
    ``in_place``: the array form ``f(desc_a, desc_b, scale_d, acc, offset)``, which reads
    its n/2 accumulators from ``acc[offset:offset + n/2]`` (a float32 local array,
    ``offset`` a constant) and writes the results back there: one typed call per
    instruction instead of n/2 arguments, a tuple and n/2 stores (the kernels' form)."""
    if n not in WGMMA_N:
        raise ValueError(f"wgmma N must be a multiple of 8 in 8..256, got {n}")
    return _impl["wgmma"](n, "f16", bool(trans_b), bool(in_place), bool(trans_a))


def wgmma_bf16(n: int, trans_b: bool = False, in_place: bool = False, trans_a: bool = False):
    """``wgmma.mma_async m64n{n}k16.f32.bf16.bf16``.  ``trans_b``: B's tile is MN-major
    (the N elements of one k contiguous, as TMA copies them out of a row-major (K, N)
    matrix); its descriptor's LBO is then the distance between swizzle-row blocks along
    N and SBO between groups of 8 k (the PTX ISA's MN-major canonical layouts).
    ``trans_a``: A's tile is MN-major in the same way (the M elements of one k contiguous,
    as TMA copies them out of a row-major (K, M) matrix: a column-major A); its descriptor
    reads as B's.  ``in_place``: the array form, as for :func:`wgmma_f16`."""
    if n not in WGMMA_N:
        raise ValueError(f"wgmma N must be a multiple of 8 in 8..256, got {n}")
    return _impl["wgmma"](n, "bf16", bool(trans_b), bool(in_place), bool(trans_a))


def wgmma_kmajor(n: int, ab: str, in_place: bool = False):
    """``wgmma.mma_async m64n{n}k{K}.f32.{ab}.{ab}`` for ``ab`` in tf32 (K = 8), e4m3 and
    e5m2 (K = 32): types whose A and B must *both* be K-major in shared memory (no trans
    immediates).  A k-step is 32 bytes of each row, as for 16-bit types; a tf32 input is a
    float32 of which the tensor core reads the top 19 bits.  ``in_place``: the array
    form, as for :func:`wgmma_f16`."""
    if n not in WGMMA_N:
        raise ValueError(f"wgmma N must be a multiple of 8 in 8..256, got {n}")
    if ab not in ("tf32", "e4m3", "e5m2"):
        raise ValueError(f"wgmma_kmajor takes tf32, e4m3 or e5m2, got {ab!r}")
    return _impl["wgmma"](n, ab, False, bool(in_place))


def setmaxnreg(n: int, increase: bool):
    """``setmaxnreg.{inc,dec}.sync.aligned.u32 n``: a warpgroup gives registers back to
    the SM (``increase=False``) or takes them (True); n a multiple of 8 in 24..256."""
    if n % 8 or not 24 <= n <= 256:
        raise ValueError(f"setmaxnreg takes a multiple of 8 in 24..256, got {n}")
    return _impl["setmaxnreg"](n, bool(increase))


def _device_desc():
    from numba import uint64

    from gemmlib.backend import cuda

    @cuda.jit(device=True)
    def smem_desc(addr, lbo, sbo, swizzle_mode):
        """The wgmma matrix descriptor of the tile at shared address ``addr`` (see
        :func:`desc_fields`; ``swizzle_mode`` is a value of ``SWIZZLE_MODE``)."""
        return (uint64((addr & 0x3FFFF) >> 4) | (uint64((lbo & 0x3FFFF) >> 4) << uint64(16))
                | (uint64((sbo & 0x3FFFF) >> 4) << uint64(32))
                | (uint64(swizzle_mode) << uint64(62)))

    return smem_desc


smem_desc = _device_desc()


@functools.lru_cache(maxsize=None)
def _accumulator_index(t: int, n: int):
    """(rows, cols) arrays of :func:`accumulator_coords`, to index the product with."""
    rows, cols = zip(*accumulator_coords(t, n))
    return np.array(rows), np.array(cols)


def accumulator_coords(t: int, n: int):
    """[(row, col)] of thread ``t``'s n/2 fp32 accumulators of an m64nNk16 wgmma: warp
    ``t // 32`` owns rows 16w..16w+15 and, per 8 columns, holds them like mma.sync's C."""
    w, lane = divmod(t, 32)
    g, q = divmod(lane, 4)
    out = []
    for j in range(n // 8):
        for v in range(4):
            out.append((16 * w + g + 8 * (v // 2), 8 * j + 2 * q + v % 2))
    return out
