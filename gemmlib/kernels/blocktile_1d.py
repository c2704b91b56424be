"""Rung 4, 1D block tiling (thread coarsening): each thread computes TM results.

The shared-memory rung does one multiply-add per two shared-memory reads.
Here a block computes a BM x BN tile of C with BM*BN/TM threads, and every
thread owns a vertical strip of TM elements of one column.  At each step k
the thread reads ``sB[k, col]`` *once* into a register and uses it for all TM
rows of its strip, so TM multiply-adds cost TM + 1 shared reads instead of
2 * TM.  The TM partial sums live in a ``cuda.local.array`` whose size is a
compile-time constant and whose loops are fully unrolled: the compiler keeps
it in registers (the compile gate checks that no local memory is used).

Loading the tiles is cooperative: the BM x BK tile of A and the BK x BN tile
of B hold ``A_PASSES * threads`` and ``B_PASSES * threads`` elements, so each
thread copies A_PASSES elements of A and B_PASSES of B per phase.  Elements
that hang over the matrix are stored as zeros, so the inner loop never
checks bounds and any M, N, K works.

One numba-specific detail first appears here, because this is the first
rung whose inner loop is all shared-memory reads: every index goes through
``uidx`` (:mod:`gemmlib.intrinsics.index`), an unsigned cast.  numba gives
signed indices Python's meaning (``-1`` is the last element) and so fixes up
each one with a compare-and-select; that hides from the compiler that
``sA[r0, k]``, ``sA[r0 + 1, k]``, ... are a constant distance apart, and every
address is recomputed.  Unsigned indices skip the fix-up: compiled for sm_90
the inner loop shrinks from 96 to 58 instructions per two k-steps (16 of them
multiply-adds), and on an H200 the kernel goes from 14.9% to 22.1% of cuBLAS
at 4096^3 (results/uidx-2026-11-22/).  All indices here are >= 0 by construction.
"""

from gemmlib.backend import cuda, float32
from gemmlib.intrinsics.index import uidx
from gemmlib.spec import Constraint, KernelSpec, cdiv


def _divides(spec, M, N, K, dev):
    p = spec.params
    return (p["BM"] % p["TM"] == 0 and (p["BM"] * p["BK"]) % spec.threads == 0
            and (p["BK"] * p["BN"]) % spec.threads == 0)


CONSTRAINTS = (
    Constraint("tile divisibility", _divides,
               "TM must divide BM, and the threads must cover the BM x BK and BK x BN tiles "
               "in whole passes (BM*BK and BK*BN multiples of the thread count)"),
)


def build(BM: int = 64, BN: int = 64, BK: int = 8, TM: int = 8) -> KernelSpec:
    NT = (BM // TM) * BN  # threads per block
    A_PASSES = max(BM * BK // NT, 1)
    B_PASSES = max(BK * BN // NT, 1)

    # ---- index functions: plain Python, called by the kernel and by gemmlib.banks
    def thread_strip(tid):
        """(first row, column) inside the block tile of the TM-long strip thread tid computes."""
        return (tid // BN) * TM, tid % BN

    def a_load(tid, p):
        """(row, k) of the A tile that thread tid copies in pass p."""
        idx = tid + p * NT
        return idx // BK, idx % BK

    def b_load(tid, p):
        """(k, col) of the B tile that thread tid copies in pass p."""
        idx = tid + p * NT
        return idx // BN, idx % BN

    _thread_strip = cuda.jit(device=True)(thread_strip)
    _a_load = cuda.jit(device=True)(a_load)
    _b_load = cuda.jit(device=True)(b_load)

    @cuda.jit
    def blocktile_1d_kernel(A, B, C):
        sA = cuda.shared.array((BM, BK), float32)
        sB = cuda.shared.array((BK, BN), float32)
        acc = cuda.local.array(TM, float32)
        M, K = A.shape
        N = B.shape[1]
        tid = cuda.threadIdx.x
        m0 = cuda.blockIdx.y * BM
        n0 = cuda.blockIdx.x * BN
        r0, col = _thread_strip(tid)
        for i in range(TM):
            acc[i] = float32(0.0)

        for k0 in range(0, K, BK):
            for p in range(A_PASSES):
                r, c = _a_load(tid, p)
                gr = m0 + r
                gc = k0 + c
                v = A[uidx(gr), uidx(gc)] if gr < M and gc < K else float32(0.0)
                sA[uidx(r), uidx(c)] = v
            for p in range(B_PASSES):
                r, c = _b_load(tid, p)
                gr = k0 + r
                gc = n0 + c
                v = B[uidx(gr), uidx(gc)] if gr < K and gc < N else float32(0.0)
                sB[uidx(r), uidx(c)] = v
            cuda.syncthreads()
            for kk in range(BK):
                b = sB[uidx(kk), uidx(col)]  # one shared read, reused TM times
                for i in range(TM):
                    acc[i] += sA[uidx(r0 + i), uidx(kk)] * b
            cuda.syncthreads()

        gc = n0 + col
        if gc < N:
            for i in range(TM):
                gr = m0 + r0 + i
                if gr < M:
                    C[uidx(gr), uidx(gc)] = acc[i]

    def grid(M, N, K):
        return (cdiv(N, BN), cdiv(M, BM), 1)

    default = (BM, BN, BK, TM) == (64, 64, 8, 8)
    return KernelSpec(
        name="blocktile_1d" if default else f"blocktile_1d_{BM}x{BN}x{BK}_t{TM}",
        chapter="06-thread-coarsening",
        idea="each thread computes a TM-long column strip of C, reusing one B value from "
             "shared memory for TM multiply-adds",
        kernel=blocktile_1d_kernel,
        block=(NT, 1, 1),
        tile=(BM, BN),
        grid=grid,
        params={"BM": BM, "BN": BN, "BK": BK, "TM": TM},
        shared_bytes=(BM * BK + BK * BN) * 4,
        constraints=CONSTRAINTS,
        index={"thread_strip": thread_strip, "a_load": a_load, "b_load": b_load},
        module=__name__,
    )


def accesses(spec):
    """The shared-memory access patterns of ``spec`` for gemmlib.banks (one per instruction)."""
    from gemmlib.spec import Access

    p, ix = spec.params, spec.index
    BM, BN, BK, TM = p["BM"], p["BN"], p["BK"], p["TM"]
    nt = spec.threads
    return [
        Access("sA", "store", BK, lambda t: ix["a_load"](t, 0), label="copy A element",
               count=max(BM * BK // nt, 1)),
        Access("sB", "store", BN, lambda t: ix["b_load"](t, 0), label="copy B element",
               count=max(BK * BN // nt, 1)),
        Access("sA", "load", BK, lambda t: (ix["thread_strip"](t)[0], 0),
               label="sA[r0 + i, k] (inner loop)", count=BK * TM),
        Access("sB", "load", BN, lambda t: (0, ix["thread_strip"](t)[1]),
               label="b = sB[k, col] (inner loop)", count=BK),
    ]

SPEC = build()
