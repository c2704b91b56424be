"""Rung 6, vectorised access: 16-byte loads and stores, with A transposed in shared memory.

The 2D-tiled kernel moves every float with its own instruction.  Here four
neighbouring floats move as one 16-byte ``float4`` (``ld.global.v4.f32``,
``ld.shared.v4.f32``, ``st.global.v4.f32``), through the intrinsics of
:mod:`gemmlib.intrinsics.vector` -- a quarter of the load/store instructions
and of their address arithmetic.

* B's tile is copied row by row: four consecutive columns of a row of B are
  one float4 in global memory and one float4 in ``sB``.
* A's tile is stored *transposed*, ``sAT[k, m]``.  A thread's fragment is a
  column of the A tile (TM rows at one k); transposed, those TM values are
  contiguous and come in TM/4 float4 loads.  The price: the four k-values a
  thread loads from a row of A with one float4 go to four different rows of
  ``sAT``, as four scalar stores.
* Each thread writes its TM x TN results with TN/4 float4 stores per row.

A float4 access needs its address to be a multiple of 16 bytes.  For rows
of A (K floats long) that holds only when K % 4 == 0 and A's base pointer is
16-byte aligned; for B and C, N % 4 == 0.  The kernel decides once, for the
whole launch, whether each matrix qualifies (a uniform branch, so no warp
diverges); if not, that matrix is moved with scalar accesses.  Inside the
vector path, a float4 chunk is either wholly inside the matrix or wholly
outside (zero-filled), because chunk starts are multiples of 4 and so is the
bound: one bounds check per four elements, none in the inner loop.

``SWIZZLE``, ``PAD`` and ``SPLIT`` are the bank-conflict fixes of the next rung
(:mod:`gemmlib.kernels.bank_free`); this rung uses none of them.

The default, 128 x 128 tiles with a 16-wide k-tile and 8 x 8 results per
thread, caps registers at 128 per thread (``max_registers``, ptxas's
``-maxrregcount``): left alone the compiler takes ~167, so only one block of
256 threads fits an SM and nothing hides the latency of the next tile's
loads; capped, two blocks fit (a few bytes spill): 49.6% -> 64.4% of cuBLAS
at 4096^3 on an H200.  The scalar edge paths and the transposing store index
through ``uidx`` like the earlier rungs (62.0% without it; results/uidx-2026-11-22/).
"""

from gemmlib.backend import SIMULATOR, cuda, float32
from gemmlib.intrinsics.index import uidx
from gemmlib.intrinsics.vector import SHARED_ALIGN, aligned16, load4, load4_or_zero, store4
from gemmlib.spec import Constraint, KernelSpec, cdiv, register_tile_fits


def _divides(spec, M, N, K, dev):
    p = spec.params
    nt = spec.threads
    return (p["TM"] % 4 == 0 and p["TN"] % 4 == 0 and p["BK"] % 4 == 0
            and p["BM"] % p["TM"] == 0 and p["BN"] % p["TN"] == 0
            and (p["BM"] * p["BK"] // 4) % nt == 0 and (p["BK"] * p["BN"] // 4) % nt == 0
            and p["PAD"] % 4 == 0
            and (not p.get("SWIZZLE") or p["BM"] % min(32, p["BM"]) == 0 and p["BK"] <= 32))


CONSTRAINTS = (
    Constraint("tile divisibility", _divides,
               "TM, TN, BK and PAD must be multiples of 4 (float4 pieces); TM | BM, TN | BN; "
               "the threads must copy both tiles in whole float4 passes; SWIZZLE needs BM a "
               "multiple of 32 (or a power of two below it) and BK <= 32"),
    register_tile_fits(overhead=40),
)


def build(BM: int = 128, BN: int = 128, BK: int = 16, TM: int = 8, TN: int = 8,
          PAD: int = 0, SPLIT: bool = False, SWIZZLE: bool = False, name: str | None = None,
          chapter: str = "07-vectorised-access", idea: str | None = None,
          module: str | None = None, max_registers: int | None = 128) -> KernelSpec:
    TCOLS = BN // TN
    NT = (BM // TM) * TCOLS
    TMN = TM * TN
    TM4, TN4 = TM // 4, TN // 4  # float4 pieces per fragment
    BK4, BN4 = BK // 4, BN // 4  # float4 pieces per row of the A tile / B tile
    A_PASSES = max(BM * BK4 // NT, 1)
    B_PASSES = max(BK * BN4 // NT, 1)
    SA_COLS = BM + PAD  # row length of sAT (PAD floats of padding against bank conflicts)
    A_GROUP = BM // TM4  # SPLIT: distance between a thread's 4-row pieces
    B_GROUP = BN // TN4
    SPLIT_ = bool(SPLIT)
    SWIZZLE_ = bool(SWIZZLE)
    # SWIZZLE: the float4 chunks copied by one warp cover RPW rows of A at BK/4 k-offsets;
    # row kq of sAT is stored with its columns XOR-ed by swz(kq), a multiple of 4 below 32,
    # so the RPW-row runs of different kq land in different banks.
    RPW = max(32 // BK4, 1)
    SWZ_MASK = min(32, BM) - 1

    def thread_rc(tid):
        """(row, col) of thread tid in the (BM/TM) x (BN/TN) grid of thread tiles."""
        return tid // TCOLS, tid % TCOLS

    def a_frag(tid, q):
        """First row (in the block tile) of the q-th float4 piece of thread tid's A fragment."""
        tr = tid // TCOLS
        return q * A_GROUP + tr * 4 if SPLIT_ else tr * TM + q * 4

    def b_frag(tid, q):
        """First column of the q-th float4 piece of thread tid's B fragment."""
        tc = tid % TCOLS
        return q * B_GROUP + tc * 4 if SPLIT_ else tc * TN + q * 4

    def swz(k):
        """Column XOR-ed into row k of sAT (0 unless SWIZZLE): constant over 4 rows."""
        return ((k // 4) * RPW) & SWZ_MASK if SWIZZLE_ else 0

    def a_chunk(tid, p):
        """(row, first k) of the float4 of the A tile thread tid loads in pass p."""
        idx = tid + p * NT
        return idx // BK4, (idx % BK4) * 4

    def b_chunk(tid, p):
        """(k, first column) of the float4 of the B tile thread tid loads in pass p."""
        idx = tid + p * NT
        return idx // BN4, (idx % BN4) * 4

    _a_frag = cuda.jit(device=True)(a_frag)
    _b_frag = cuda.jit(device=True)(b_frag)
    _a_chunk = cuda.jit(device=True)(a_chunk)
    _swz = cuda.jit(device=True)(swz)
    _b_chunk = cuda.jit(device=True)(b_chunk)

    @cuda.jit(device=True)
    def k_step(sAT, sB, kk, sw, tid, acc, fa, fb):
        """One k: float4 fragments of A and B from shared memory, then their outer product.

        sw = swz(kk), the swizzle of row kk of sAT."""
        for q in range(TM4):
            x0, x1, x2, x3 = load4(sAT, kk, _a_frag(tid, q) ^ sw)
            fa[4 * q] = x0
            fa[4 * q + 1] = x1
            fa[4 * q + 2] = x2
            fa[4 * q + 3] = x3
        for q in range(TN4):
            y0, y1, y2, y3 = load4(sB, kk, _b_frag(tid, q))
            fb[4 * q] = y0
            fb[4 * q + 1] = y1
            fb[4 * q + 2] = y2
            fb[4 * q + 3] = y3
        for i in range(TM):
            for j in range(TN):
                acc[i * TN + j] += fa[i] * fb[j]

    def vectorized_kernel(A, B, C):
        sAT = cuda.shared.array((BK, SA_COLS), float32, alignment=SHARED_ALIGN)
        sB = cuda.shared.array((BK, BN), float32, alignment=SHARED_ALIGN)
        acc = cuda.local.array(TMN, float32)
        fa = cuda.local.array(TM, float32)
        fb = cuda.local.array(TN, float32)
        M, K = A.shape
        N = B.shape[1]
        tid = cuda.threadIdx.x
        m0 = cuda.blockIdx.y * BM
        n0 = cuda.blockIdx.x * BN
        # Uniform decisions, once per launch: may each matrix be moved in float4s?
        a_vec = K % 4 == 0 and aligned16(A)
        b_vec = N % 4 == 0 and aligned16(B)
        c_vec = N % 4 == 0 and aligned16(C)
        for i in range(TMN):
            acc[i] = float32(0.0)

        for k0 in range(0, K, BK):
            for p in range(A_PASSES):
                r, kq = _a_chunk(tid, p)
                gr = m0 + r
                gk = k0 + kq
                v0, v1, v2, v3 = load4_or_zero(A, gr, gk, a_vec)
                rs = r ^ _swz(kq)  # (= r unless SWIZZLE)
                sAT[uidx(kq), uidx(rs)] = v0  # transposed: the 4 k-values go to 4 rows of sAT
                sAT[uidx(kq + 1), uidx(rs)] = v1
                sAT[uidx(kq + 2), uidx(rs)] = v2
                sAT[uidx(kq + 3), uidx(rs)] = v3
            for p in range(B_PASSES):
                kr, c = _b_chunk(tid, p)
                gk = k0 + kr
                gc = n0 + c
                v0, v1, v2, v3 = load4_or_zero(B, gk, gc, b_vec)
                store4(sB, kr, c, v0, v1, v2, v3)
            cuda.syncthreads()

            # Four k-steps per iteration, written out: numba leaves a loop this large
            # rolled; unrolled by hand, the shared loads get constant address offsets.
            for kk in range(0, BK, 4):
                sw = _swz(kk)  # the same for the 4 rows
                k_step(sAT, sB, kk, sw, tid, acc, fa, fb)
                k_step(sAT, sB, kk + 1, sw, tid, acc, fa, fb)
                k_step(sAT, sB, kk + 2, sw, tid, acc, fa, fb)
                k_step(sAT, sB, kk + 3, sw, tid, acc, fa, fb)
            cuda.syncthreads()

        for qi in range(TM4):
            for ii in range(4):
                i = qi * 4 + ii
                gr = m0 + _a_frag(tid, qi) + ii
                if gr < M:
                    for qj in range(TN4):
                        gc = n0 + _b_frag(tid, qj)
                        j = qj * 4
                        if c_vec:
                            if gc < N:
                                store4(C, gr, gc, acc[i * TN + j], acc[i * TN + j + 1],
                                       acc[i * TN + j + 2], acc[i * TN + j + 3])
                        else:
                            for jj in range(4):
                                if gc + jj < N:
                                    C[uidx(gr), uidx(gc + jj)] = acc[i * TN + j + jj]

    # max_registers caps registers per thread (ptxas -maxrregcount): fewer registers, more
    # resident blocks per SM.  The simulator has no such option.
    opts = {"max_registers": max_registers} if max_registers and not SIMULATOR else {}
    kernel = cuda.jit(**opts)(vectorized_kernel)

    def grid(M, N, K):
        return (cdiv(N, BN), cdiv(M, BM), 1)

    params = {"BM": BM, "BN": BN, "BK": BK, "TM": TM, "TN": TN, "PAD": PAD, "SPLIT": int(SPLIT_),
              "SWIZZLE": int(SWIZZLE_)}
    if max_registers:
        params["max_registers"] = max_registers
    if name is None:
        default = (BM, BN, BK, TM, TN, PAD, SPLIT_, max_registers) == (
            128, 128, 16, 8, 8, 0, False, 128)
        name = "vectorized" if default else (
            f"vectorized_{BM}x{BN}x{BK}_t{TM}x{TN}_p{PAD}_s{int(SPLIT_)}"
            + ("_z" if SWIZZLE_ else "")
            + (f"_r{max_registers}" if max_registers else ""))
    return KernelSpec(
        name=name,
        chapter=chapter,
        idea=idea or "float4 (16-byte) global and shared accesses; A stored transposed in "
                     "shared memory so each fragment is contiguous",
        kernel=kernel,
        block=(NT, 1, 1),
        tile=(BM, BN),
        grid=grid,
        params=params,
        shared_bytes=(BK * SA_COLS + BK * BN) * 4,
        # Capping registers to fit two 256-thread blocks per SM spills a few bytes (32-84 B
        # seen on sm_75-sm_90); still much faster than 1 block per SM (see the docstring).
        max_spill_bytes=256 if max_registers else 0,
        constraints=CONSTRAINTS,
        ptx_must=(r"ld\.global\.v4\.f32", r"ld\.shared\.v4\.f32", r"st\.shared\.v4\.f32",
                  r"st\.global\.v4\.f32"),
        index={"thread_rc": thread_rc, "a_frag": a_frag, "b_frag": b_frag,
               "a_chunk": a_chunk, "b_chunk": b_chunk, "swz": swz},
        module=module or __name__,
    )


def accesses(spec):
    """Shared-memory access patterns of ``spec`` for gemmlib.banks (one per instruction)."""
    from gemmlib.spec import Access

    p, ix = spec.params, spec.index
    sa_cols = p["BM"] + p["PAD"]
    swz = ix["swz"]

    def a_store(t):
        r, kq = ix["a_chunk"](t, 0)
        return kq, r

    def sat_address(k, m):  # row k of sAT, column m before the swizzle
        return k * sa_cols + (m ^ swz(k))

    nt = spec.threads
    a_passes = max(p["BM"] * p["BK"] // 4 // nt, 1)
    b_passes = max(p["BK"] * p["BN"] // 4 // nt, 1)
    return [
        Access("sAT", "store", sa_cols, a_store, label="sAT[kq, r] = v0 (transposing store)",
               count=4 * a_passes, address=sat_address),
        Access("sB", "store", p["BN"], lambda t: ix["b_chunk"](t, 0), width=4,
               label="store4(sB, k, c, ...)", count=b_passes),
        Access("sAT", "load", sa_cols, lambda t: (0, ix["a_frag"](t, 0)), width=4,
               label="load4(sAT, k, a_frag) (inner loop)", count=p["BK"] * p["TM"] // 4,
               address=sat_address),
        Access("sB", "load", p["BN"], lambda t: (0, ix["b_frag"](t, 0)), width=4,
               label="load4(sB, k, b_frag) (inner loop)", count=p["BK"] * p["TN"] // 4),
    ]

SPEC = build()
