"""The smallest Hopper kernels that prove each piece works from numba, one idea each.

Every case builds one kernel for one warpgroup (128 threads), runs it on an
H100/H200 and compares with NumPy:

``wgmma``          m64n8k16 from unswizzled shared tiles, laid out as 8 x 16-byte
                   "core matrices" (the descriptor's LBO: the distance between core
                   matrices adjacent along K, SBO: adjacent along M or N)
``wgmma_swizzled`` four m64n8k16 k-steps from 128-byte swizzled rows of 64 halves,
                   the descriptor's start moved 32 bytes per k-step
``tma``            one TMA box partly outside the matrix (zeros there), no swizzle
``tma_swizzled``   the same box written with the 128-byte swizzle
``tma_wgmma``      TMA -> mbarrier -> four wgmma: the path a Hopper GEMM takes

``run(case)`` returns ``(ok, message)``; ``build(case)`` returns the kernel and
example arguments (for compiling without a GPU: ``tests/test_hopper.py``).
"""
from __future__ import annotations

import numpy as np

from gemmlib import layout as L
from gemmlib.backend import cuda   # a global: numba's simulator swaps it inside kernels
from gemmlib.intrinsics import hopper as H
from gemmlib.intrinsics.hopper import BAR_ALIGN, TILE_ALIGN   # globals: numba needs literals

CASES = ("wgmma", "wgmma_swizzled", "tma", "tma_swizzled", "tma_wgmma")

#: the unswizzled layout of the wgmma case: bytes between core matrices along K, M/N
K_ADJ, MN_ADJ = 128, 256
#: the TMA cases: matrix, box and where the box starts (it hangs over two edges)
MATRIX, BOX, CORNER = (100, 72), (64, 64), (40, 60)
#: rows of 64 halves (128 bytes), each 16-byte chunk XOR-ed with row % 8: the layout the
#: 128-byte swizzle of wgmma's descriptors and of TMA expects (the layout chapter's XOR)
SWIZZLE_128B = L.SwizzledLayout(L.row_major((64, 64)), L.chunk_swizzle(64, 2))
#: its index function, for kernels: swz128(row, col) -> element offset
swz128 = L.jit(SWIZZLE_128B.source("swz128"), device=True)


def _device():
    from numba import float32, uint16

    @cuda.jit(device=True)
    def store_d(D, d0, d1, d2, d3, t):
        """Thread t's four accumulators of m64n8k16 (``H.accumulator_coords``) -> D."""
        w, lane = t // 32, t % 32
        g, q = lane // 4, lane % 4
        D[16 * w + g, 2 * q] = d0
        D[16 * w + g, 2 * q + 1] = d1
        D[16 * w + g + 8, 2 * q] = d2
        D[16 * w + g + 8, 2 * q + 1] = d3

    @cuda.jit(device=True)
    def barrier(bar, t):
        """The block's mbarrier (one arrival per phase), initialised by thread 0."""
        b = H.smem_addr(bar, 0)
        if t == 0:
            H.mbarrier_init(b, 1)
            H.fence_mbarrier_init()     # visible to the async proxy (TMA) too
        cuda.syncthreads()
        return b

    return float32, uint16, store_d, barrier


def build(case: str):
    """(kernel, example arguments as NumPy/ints, what the check needs)."""
    from numba import int32, uint64

    float32, uint16, store_d, barrier = _device()
    mma8, wait0, desc = H.wgmma_f16(8), H.wgmma_wait(0), H.smem_desc
    rng = np.random.default_rng(1)
    if case == "wgmma":
        A = rng.uniform(-1, 1, (64, 16)).astype(np.float16)
        B = rng.uniform(-1, 1, (8, 16)).astype(np.float16)
        KA, MA = K_ADJ // 2, MN_ADJ // 2     # in halves

        @cuda.jit
        def wgmma_probe(A, B, D):
            sA = cuda.shared.array(2048, uint16, alignment=TILE_ALIGN)
            sB = cuda.shared.array(512, uint16, alignment=TILE_ALIGN)
            t = cuda.threadIdx.x
            for e in range(t, 64 * 16, 128):
                m, k = e // 16, e % 16
                sA[(m // 8) * MA + (k // 8) * KA + (m % 8) * 8 + k % 8] = A[m, k]
            for e in range(t, 8 * 16, 128):
                n, k = e // 16, e % 16
                sB[(n // 8) * MA + (k // 8) * KA + (n % 8) * 8 + k % 8] = B[n, k]
            H.fence_proxy_async()        # ordinary stores -> visible to the async proxy
            cuda.syncthreads()
            da = desc(H.smem_addr(sA, 0), K_ADJ, MN_ADJ, 0)
            db = desc(H.smem_addr(sB, 0), K_ADJ, MN_ADJ, 0)
            H.wgmma_fence()
            d = mma8(da, db, int32(1), float32(0), float32(0), float32(0), float32(0))
            H.wgmma_commit()
            wait0()
            store_d(D, d[0], d[1], d[2], d[3], t)

        return wgmma_probe, (A.view(np.uint16), B.view(np.uint16),
                             np.zeros((64, 8), np.float32)), (A, B)
    if case in ("wgmma_swizzled", "tma_wgmma"):
        A = rng.uniform(-1, 1, (64, 64)).astype(np.float16)
        B = rng.uniform(-1, 1, (8, 64)).astype(np.float16)
        tma = case == "tma_wgmma"

        @cuda.jit(device=True)
        def four_ksteps(sA, sB):
            a0, b0 = H.smem_addr(sA, 0), H.smem_addr(sB, 0)
            c0 = c1 = c2 = c3 = float32(0)
            H.wgmma_fence()
            for kk in range(4):      # k-steps of 16 halves: +32 bytes inside the swizzled rows
                c0, c1, c2, c3 = mma8(desc(a0 + 32 * kk, 16, 1024, 1),
                                      desc(b0 + 32 * kk, 16, 1024, 1), int32(1),
                                      c0, c1, c2, c3)
            H.wgmma_commit()
            wait0()
            return c0, c1, c2, c3

        if not tma:
            @cuda.jit
            def wgmma_swizzled_probe(A, B, D):
                sA = cuda.shared.array(64 * 64, uint16, alignment=TILE_ALIGN)
                sB = cuda.shared.array(8 * 64, uint16, alignment=TILE_ALIGN)
                t = cuda.threadIdx.x
                for e in range(t, 64 * 64, 128):
                    sA[swz128(e // 64, e % 64)] = A[e // 64, e % 64]
                for e in range(t, 8 * 64, 128):
                    sB[swz128(e // 64, e % 64)] = B[e // 64, e % 64]
                H.fence_proxy_async()
                cuda.syncthreads()
                c = four_ksteps(sA, sB)
                store_d(D, c[0], c[1], c[2], c[3], t)

            return wgmma_swizzled_probe, (A.view(np.uint16), B.view(np.uint16),
                                          np.zeros((64, 8), np.float32)), (A, B)

        @cuda.jit
        def tma_wgmma_probe(tmap_a, tmap_b, D):
            sA = cuda.shared.array(64 * 64, uint16, alignment=TILE_ALIGN)
            sB = cuda.shared.array(8 * 64, uint16, alignment=TILE_ALIGN)
            bar = cuda.shared.array(1, uint64, alignment=BAR_ALIGN)
            t = cuda.threadIdx.x
            b = barrier(bar, t)
            if t == 0:                   # one thread starts both copies
                H.tensormap_acquire(tmap_a)
                H.tensormap_acquire(tmap_b)
                H.mbarrier_expect_tx(b, (64 * 64 + 8 * 64) * 2)
                H.tma_load_2d(H.smem_addr(sA, 0), tmap_a, 0, 0, b)
                H.tma_load_2d(H.smem_addr(sB, 0), tmap_b, 0, 0, b)
            while H.mbarrier_try_wait(b, 0) == 0:   # phase 0 completes when the bytes land
                pass
            c = four_ksteps(sA, sB)
            store_d(D, c[0], c[1], c[2], c[3], t)

        return tma_wgmma_probe, (np.uint64(0), np.uint64(0),
                                 np.zeros((64, 8), np.float32)), (A, B)
    if case in ("tma", "tma_swizzled"):
        R, C = MATRIX
        BR, BC = BOX if case == "tma_swizzled" else (BOX[0], 32)
        NB = BR * BC
        x0, y0 = CORNER
        X = rng.uniform(-1, 1, (R, C)).astype(np.float16)

        @cuda.jit
        def tma_probe(tmap, out):
            s = cuda.shared.array(64 * 64, uint16, alignment=TILE_ALIGN)
            bar = cuda.shared.array(1, uint64, alignment=BAR_ALIGN)
            t = cuda.threadIdx.x
            b = barrier(bar, t)
            if t == 0:
                H.tensormap_acquire(tmap)
                H.mbarrier_expect_tx(b, NB * 2)   # the whole box counts, zeros included
                H.tma_load_2d(H.smem_addr(s, 0), tmap, x0, y0, b)
            while H.mbarrier_try_wait(b, 0) == 0:
                pass
            for e in range(t, NB, 128):
                out[e] = s[e]

        return tma_probe, (np.uint64(0), np.zeros(NB, np.uint16)), (X, (BR, BC))
    raise ValueError(f"unknown case {case!r}; cases: {', '.join(CASES)}")


def run(case: str) -> tuple[bool, str]:
    """Run ``case`` on this (Hopper) GPU, or on the intrinsics' twins in numba's
    simulator; (ok, what was checked and the result)."""
    from gemmlib import backend
    from gemmlib import tma as T

    cp = backend.array_module()
    if cp is np:   # the simulator: NumPy stands in for CuPy
        cp = type("np_as_cupy", (), dict(asarray=staticmethod(np.asarray),
                                          zeros=staticmethod(np.zeros),
                                          asnumpy=staticmethod(np.asarray)))

    kernel, args, data = build(case)
    if case in ("tma", "tma_swizzled"):
        X, (BR, BC) = data
        swizzle = 128 if case == "tma_swizzled" else 0
        Xd = cp.asarray(X)
        tm = T.tensor_map_2d(Xd, (BR, BC), swizzle)
        out = cp.zeros(BR * BC, np.uint16)
        kernel[1, 128](tm.ptr, out)
        got = cp.asnumpy(out).view(np.float16)
        x0, y0 = CORNER
        box = np.zeros((BR, BC), np.float16)
        part = X[y0:y0 + BR, x0:x0 + BC]
        box[:part.shape[0], :part.shape[1]] = part
        want = np.zeros(BR * BC, np.float16)
        for r in range(BR):
            for c in range(BC):
                want[T.swizzled_offset(r, c, BC, 2, swizzle)] = box[r, c]
        bad = int((got != want).sum())
        return bad == 0, (f"{case}: a {BR}x{BC} box at column {x0}, row {y0} of a "
                          f"{X.shape[0]}x{X.shape[1]} matrix (zeros outside), swizzle {swizzle}: "
                          f"{bad} of {BR * BC} elements differ")
    A, B = data
    D = cp.zeros((64, 8), np.float32)
    if case == "tma_wgmma":
        Ad, Bd = cp.asarray(A), cp.asarray(B)
        ta, tb = T.tensor_map_2d(Ad, (64, 64), 128), T.tensor_map_2d(Bd, (8, 64), 128)
        kernel[1, 128](ta.ptr, tb.ptr, D)
    else:
        kernel[1, 128](cp.asarray(A.view(np.uint16)), cp.asarray(B.view(np.uint16)), D)
    ref = A.astype(np.float64) @ B.astype(np.float64).T
    err = float(np.abs(cp.asnumpy(D) - ref).max() / np.abs(ref).max())
    return err < 1e-5, f"{case}: D = A B^T (64x8, K = {A.shape[1]}), max relative error {err:.1e}"


def compile_case(case: str) -> dict:
    """PTX of ``case`` for sm_90a, assembled by ptxas (nvJitLink): no GPU needed."""
    import re

    import numba
    from numba import cuda

    from gemmlib import ptx as P

    kernel, args, _ = build(case)
    sig = tuple(numba.typeof(a) for a in args)
    with P.offline_device((9, 0)):
        text, _ = cuda.compile_ptx(kernel.py_func, sig, cc=(9, 0))
    # offline, numba targets plain sm_90; on an H100 it targets sm_90a itself
    text = re.sub(r"\.target sm_90\b", ".target sm_90a", text)
    res = P.resources(text, arch="sm_90a")
    found = [op for op in ("wgmma.mma_async", "cp.async.bulk.tensor", "mbarrier.try_wait",
                           "fence.proxy.async") if op in text]
    return dict(case=case, instructions=found, **res)


def main(argv=None) -> int:
    """``python -m gemmcourse.hopper_probe [--compile]``: run every case on this GPU, or
    (``--compile``) compile and assemble each for sm_90a and print JSON."""
    import json
    import sys

    argv = sys.argv[1:] if argv is None else argv
    if "--compile" in argv:
        print(json.dumps([compile_case(c) for c in CASES]))
        return 0
    bad = 0
    for case in CASES:
        ok, msg = run(case)
        bad += not ok
        print(("ok    " if ok else "WRONG ") + msg, flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
