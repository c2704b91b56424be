"""Rung 5, 2D block tiling: each thread computes a TM x TN tile of C by outer products.

1D tiling reused one value of B across TM rows.  Doing the same along both
axes reuses more: at each step k a thread copies TM values of A's column
(``sA[rows, k]``) and TN values of B's row (``sB[k, cols]``) from shared
memory into registers, then adds their outer product -- TM * TN
multiply-adds -- to its TM x TN accumulator.  Shared reads per multiply-add
drop from (TM + 1) / TM to (TM + TN) / (TM * TN): for 8 x 8, a quarter.

Which TM x TN results a thread owns matters for shared memory.  Here they
are *interleaved*: thread (tr, tc) owns rows ``tr + i * BM/TM`` and columns
``tc + j * BN/TN``.  The 32 threads of a warp then read 32 consecutive words
of ``sB`` (one per bank) and two words of ``sA`` in different banks, so no
shared read has a bank conflict.  (Giving each thread a *contiguous* TM x TN
block instead -- the obvious choice -- makes threads tc and tc + 4 hit the
same bank: a 4-way conflict on every read of ``sB``; ``gemmlib.banks`` shows
it for ``build(CONTIGUOUS=True)``.)

A block of (BM/TM) * (BN/TN) threads computes a BM x BN tile.  The shared
tiles hold more elements than there are threads, so the cooperative copy
runs in several passes (A_PASSES, B_PASSES), each thread copying one element
per pass, zero-filling outside the matrix.  The accumulator (TM*TN floats)
and the two fragments stay in registers because every loop over them has a
compile-time trip count and is unrolled.
"""

from gemmlib.backend import SIMULATOR, cuda, float32
from gemmlib.intrinsics.index import uidx
from gemmlib.spec import Constraint, KernelSpec, cdiv, register_tile_fits


def _divides(spec, M, N, K, dev):
    p = spec.params
    return (p["BM"] % p["TM"] == 0 and p["BN"] % p["TN"] == 0 and p["BK"] % 4 == 0
            and (p["BM"] * p["BK"]) % spec.threads == 0
            and (p["BK"] * p["BN"]) % spec.threads == 0)


CONSTRAINTS = (
    Constraint("tile divisibility", _divides,
               "TM | BM, TN | BN, BK a multiple of 4 (the k loop is unrolled by 4), and the "
               "threads must copy the BM x BK and BK x BN tiles "
               "in whole passes"),
    register_tile_fits(overhead=30),
)


#: The rung's default.  With unsigned indices the compiler fits the kernel in 128 registers
#: on its own; max_registers=128 only makes sure of it (two 256-thread blocks per SM, 16
#: warps instead of 8): 53.1% of cuBLAS at 4096^3 on an H200, against 26.9% before uidx and
#: 40.3% with the cap lifted (results/uidx-2026-11-22/).
DEFAULTS = {"BM": 128, "BN": 128, "BK": 8, "TM": 8, "TN": 8, "max_registers": 128}


def build(BM: int = 128, BN: int = 128, BK: int = 8, TM: int = 8, TN: int = 8,
          CONTIGUOUS: bool = False, max_registers: int | None = 128) -> KernelSpec:
    TCOLS = BN // TN  # threads along a row of the block tile (= column stride of a thread)
    TROWS = BM // TM  # threads along a column (= row stride of a thread)
    NT = TROWS * TCOLS
    RSTEP = 1 if CONTIGUOUS else TROWS  # distance between a thread's rows
    CSTEP = 1 if CONTIGUOUS else TCOLS  # distance between a thread's columns
    TMN = TM * TN  # accumulator size: a closure constant (an expression would not compile)
    A_PASSES = max(BM * BK // NT, 1)
    B_PASSES = max(BK * BN // NT, 1)

    def thread_tile(tid):
        """(first row, first column) of thread tid's results inside the block tile.

        Its other results are RSTEP rows and CSTEP columns apart."""
        if CONTIGUOUS:
            return (tid // TCOLS) * TM, (tid % TCOLS) * TN
        return tid // TCOLS, tid % TCOLS

    def a_load(tid, p):
        """(row, k) of the A tile that thread tid copies in pass p."""
        idx = tid + p * NT
        return idx // BK, idx % BK

    def b_load(tid, p):
        """(k, col) of the B tile that thread tid copies in pass p."""
        idx = tid + p * NT
        return idx // BN, idx % BN

    _thread_tile = cuda.jit(device=True)(thread_tile)
    _a_load = cuda.jit(device=True)(a_load)
    _b_load = cuda.jit(device=True)(b_load)

    @cuda.jit(device=True)
    def k_step(sA, sB, kk, r0, c0, acc, fa, fb):
        """One k: a column fragment of A, a row fragment of B, their outer product."""
        for i in range(TM):
            fa[i] = sA[uidx(r0 + i * RSTEP), uidx(kk)]
        for j in range(TN):
            fb[j] = sB[uidx(kk), uidx(c0 + j * CSTEP)]
        for i in range(TM):
            for j in range(TN):
                acc[i * TN + j] += fa[i] * fb[j]

    def blocktile_2d_kernel(A, B, C):
        sA = cuda.shared.array((BM, BK), float32)
        sB = cuda.shared.array((BK, BN), float32)
        acc = cuda.local.array(TMN, float32)
        fa = cuda.local.array(TM, float32)
        fb = cuda.local.array(TN, float32)
        M, K = A.shape
        N = B.shape[1]
        tid = cuda.threadIdx.x
        m0 = cuda.blockIdx.y * BM
        n0 = cuda.blockIdx.x * BN
        r0, c0 = _thread_tile(tid)
        for i in range(TMN):
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
            # Four k-steps per iteration, written out by hand: numba leaves a loop
            # this large rolled, and the loop bookkeeping and address arithmetic per
            # step would cost a good fraction of the 64 multiply-adds.
            for kk in range(0, BK, 4):
                k_step(sA, sB, kk, r0, c0, acc, fa, fb)
                k_step(sA, sB, kk + 1, r0, c0, acc, fa, fb)
                k_step(sA, sB, kk + 2, r0, c0, acc, fa, fb)
                k_step(sA, sB, kk + 3, r0, c0, acc, fa, fb)
            cuda.syncthreads()

        for i in range(TM):
            gr = m0 + r0 + i * RSTEP
            if gr < M:
                for j in range(TN):
                    gc = n0 + c0 + j * CSTEP
                    if gc < N:
                        C[uidx(gr), uidx(gc)] = acc[i * TN + j]

    # max_registers caps registers per thread (ptxas -maxrregcount): fewer registers, more
    # resident blocks per SM.  The simulator has no such option.
    opts = {"max_registers": max_registers} if max_registers and not SIMULATOR else {}
    kernel = cuda.jit(**opts)(blocktile_2d_kernel)

    def grid(M, N, K):
        return (cdiv(N, BN), cdiv(M, BM), 1)

    params = {"BM": BM, "BN": BN, "BK": BK, "TM": TM, "TN": TN}
    if CONTIGUOUS:
        params["CONTIGUOUS"] = 1
    if max_registers:
        params["max_registers"] = max_registers
    default = params == DEFAULTS
    return KernelSpec(
        name="blocktile_2d" if default else "blocktile_2d_" + "_".join(
            f"{k}{v}" for k, v in params.items()),
        chapter="06-thread-coarsening",
        idea="each thread computes a TM x TN tile of C as outer products of register "
             "fragments of A and B",
        kernel=kernel,
        block=(NT, 1, 1),
        tile=(BM, BN),
        grid=grid,
        params=params,
        shared_bytes=(BM * BK + BK * BN) * 4,
        # Capped at 128 registers some ptxas versions spill a few bytes (0-72 B seen on
        # sm_90); still much faster than 1 block per SM (results/uidx-2026-11-22/).
        max_spill_bytes=256 if max_registers else 0,
        constraints=CONSTRAINTS,
        index={"thread_tile": thread_tile, "a_load": a_load, "b_load": b_load},
        module=__name__,
    )


def accesses(spec):
    """Shared-memory access patterns of ``spec`` for gemmlib.banks (one per instruction)."""
    from gemmlib.spec import Access

    p, ix = spec.params, spec.index
    BM, BN, BK, TM, TN = p["BM"], p["BN"], p["BK"], p["TM"], p["TN"]
    nt = spec.threads
    return [
        Access("sA", "store", BK, lambda t: ix["a_load"](t, 0), label="copy A element",
               count=max(BM * BK // nt, 1)),
        Access("sB", "store", BN, lambda t: ix["b_load"](t, 0), label="copy B element",
               count=max(BK * BN // nt, 1)),
        Access("sA", "load", BK, lambda t: (ix["thread_tile"](t)[0], 0),
               label="fa[i] = sA[r0 + i * RSTEP, k]", count=BK * TM),
        Access("sB", "load", BN, lambda t: (0, ix["thread_tile"](t)[1]),
               label="fb[j] = sB[k, c0 + j * CSTEP]", count=BK * TN),
    ]

SPEC = build()
