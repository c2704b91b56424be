"""Rung 5, 2D block tiling: each thread computes a TM x TN tile of C by outer products.

1D tiling reused one value of B across TM rows.  Doing the same along both
axes reuses more: at each step k a thread copies TM values of A's column
(``sA[rows, k]``) and TN values of B's row (``sB[k, cols]``) from shared
memory into registers, then adds their outer product -- TM * TN
multiply-adds -- to its TM x TN accumulator.  Shared reads per multiply-add
drop from (TM + 1) / TM to (TM + TN) / (TM * TN): for 8 x 8, a quarter.

A block of (BM/TM) * (BN/TN) threads computes a BM x BN tile.  The shared
tiles hold more elements than there are threads, so the cooperative copy
runs in several passes (A_PASSES, B_PASSES), each thread copying one element
per pass, zero-filling outside the matrix.  The accumulator (TM*TN floats)
and the two fragments stay in registers because every loop over them has a
compile-time trip count and is unrolled.
"""

from gemmlib.backend import cuda, float32
from gemmlib.spec import Constraint, KernelSpec, cdiv


def _divides(spec, M, N, K, dev):
    p = spec.params
    return (p["BM"] % p["TM"] == 0 and p["BN"] % p["TN"] == 0
            and (p["BM"] * p["BK"]) % spec.threads == 0
            and (p["BK"] * p["BN"]) % spec.threads == 0)


def _registers(spec, M, N, K, dev):
    # accumulators + fragments + ~30 for addresses must fit the 255-register limit
    p = spec.params
    return p["TM"] * p["TN"] + p["TM"] + p["TN"] + 30 <= 255


CONSTRAINTS = (
    Constraint("tile divisibility", _divides,
               "TM | BM, TN | BN, and the threads must copy the BM x BK and BK x BN tiles "
               "in whole passes"),
    Constraint("registers per thread", _registers,
               "the TM x TN accumulator plus fragments must fit in 255 registers "
               "(otherwise it spills to local memory)"),
)


def build(BM: int = 128, BN: int = 128, BK: int = 8, TM: int = 8, TN: int = 8) -> KernelSpec:
    TCOLS = BN // TN  # threads along a row of the block tile
    NT = (BM // TM) * TCOLS
    TMN = TM * TN  # accumulator size: a closure constant (an expression would not compile)
    A_PASSES = max(BM * BK // NT, 1)
    B_PASSES = max(BK * BN // NT, 1)

    def thread_tile(tid):
        """(first row, first column) of thread tid's TM x TN tile inside the block tile."""
        return (tid // TCOLS) * TM, (tid % TCOLS) * TN

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

    @cuda.jit
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
                sA[r, c] = A[gr, gc] if gr < M and gc < K else float32(0.0)
            for p in range(B_PASSES):
                r, c = _b_load(tid, p)
                gr = k0 + r
                gc = n0 + c
                sB[r, c] = B[gr, gc] if gr < K and gc < N else float32(0.0)
            cuda.syncthreads()
            for kk in range(BK):
                for i in range(TM):
                    fa[i] = sA[r0 + i, kk]
                for j in range(TN):
                    fb[j] = sB[kk, c0 + j]
                for i in range(TM):  # outer product of the two fragments
                    for j in range(TN):
                        acc[i * TN + j] += fa[i] * fb[j]
            cuda.syncthreads()

        for i in range(TM):
            gr = m0 + r0 + i
            if gr < M:
                for j in range(TN):
                    gc = n0 + c0 + j
                    if gc < N:
                        C[gr, gc] = acc[i * TN + j]

    def grid(M, N, K):
        return (cdiv(N, BN), cdiv(M, BM), 1)

    default = (BM, BN, BK, TM, TN) == (128, 128, 8, 8, 8)
    return KernelSpec(
        name="blocktile_2d" if default else f"blocktile_2d_{BM}x{BN}x{BK}_t{TM}x{TN}",
        chapter="06-thread-coarsening",
        idea="each thread computes a TM x TN tile of C as outer products of register "
             "fragments of A and B",
        kernel=blocktile_2d_kernel,
        block=(NT, 1, 1),
        tile=(BM, BN),
        grid=grid,
        params={"BM": BM, "BN": BN, "BK": BK, "TM": TM, "TN": TN},
        shared_bytes=(BM * BK + BK * BN) * 4,
        constraints=CONSTRAINTS,
        index={"thread_tile": thread_tile, "a_load": a_load, "b_load": b_load},
        module=__name__,
    )


def accesses(spec):
    """Shared-memory access patterns of ``spec`` for gemmlib.banks (one per instruction)."""
    from gemmlib.banks import Access

    p, ix = spec.params, spec.index
    BM, BN, BK, TM, TN = p["BM"], p["BN"], p["BK"], p["TM"], p["TN"]
    nt = spec.threads
    return [
        Access("sA", "store", BK, lambda t: ix["a_load"](t, 0), label="copy A element",
               count=max(BM * BK // nt, 1)),
        Access("sB", "store", BN, lambda t: ix["b_load"](t, 0), label="copy B element",
               count=max(BK * BN // nt, 1)),
        Access("sA", "load", BK, lambda t: (ix["thread_tile"](t)[0], 0),
               label="fa[i] = sA[r0 + i, k]", count=BK * TM),
        Access("sB", "load", BN, lambda t: (0, ix["thread_tile"](t)[1]),
               label="fb[j] = sB[k, c0 + j]", count=BK * TN),
    ]

SPEC = build()
