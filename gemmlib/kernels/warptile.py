"""Rung 8, warp tiling (with double buffering): block tile -> warp tile -> thread tile.

The earlier rungs split a block tile straight into thread tiles.  Here there
is a level in between, matching how the hardware schedules: the warp.

* The block (NT threads) computes BM x BN of C.  Its NT/32 warps each own a
  WM x WN *warp tile*, laid out (BM/WM) x (BN/WN).
* A warp walks its tile in WMITER x WNITER steps of WSUBM x WSUBN; in each,
  its 32 lanes form a (WSUBM/TM) x (WSUBN/TN) grid and each lane computes a
  TM x TN piece.  So a thread owns WMITER*TM x WNITER*TN results, in pieces
  WSUBM rows and WSUBN columns apart.

Why bother: at every step k a warp reads only the WM values of A and WN of B
its own tile needs, and the 32 lanes of a quarter-warp read neighbouring
float4s (no bank conflicts, see ``gemmlib.banks``); the warp-level footprint
is a knob that trades shared-memory traffic against registers independently
of the block size, which sets global-memory reuse and occupancy.

Two more things make it fast:

* **Double buffering.**  Shared memory holds two k-tiles.  While the block
  computes on one, each thread has already issued the global loads of the
  next tile into registers; it writes them into the other buffer after its
  arithmetic, and one barrier per tile suffices.  The loads' latency hides
  behind the FMAs.
* The float4 paths and the one-decision-per-launch ragged-edge handling of
  the vectorised rung: any M, N, K works, with scalar copies where a matrix's
  rows are not 16-byte aligned; and the bank-conflict-free rung's swizzled
  transposing store (``SWIZZLE``, on by default).

**B given as torch holds it** (``B_LAYOUT="NK"``: an ``nn.Linear`` weight, (N, K)
row-major, and C = A @ B.T).  The compute loop wants B's k-tile as ``sB[k][n]``, rows of
n for each k, exactly as it wants A's as ``sAT[k][m]``; and an (N, K) B is in memory what
A is, rows along K.  So B takes A's road into shared memory: float4 loads along K of its
rows (coalesced, 16 bytes a thread), then the same swizzled transposing store, and the k
loop reads ``sB[k][n ^ swizzle]`` as it reads ``sAT``.  Nothing else changes (the
``layout_nt`` and ``double_buffer`` rungs read their (N, K) B the same way).

**A given column-major** (``A_LAYOUT="KM"``: the (K, M) row-major memory of ``A.t()``, as a
weight gradient x^T dY hands it).  Then A's memory is already what ``sAT`` holds, rows of m
for each k: A takes B's road instead, float4 loads along M and float4 stores into ``sAT``
with no transpose and so no swizzle.  Also compile-time.

**A slice of a wider matrix** (``x[:, :k]``, or the transpose of one for the KM and NK
forms: rows further apart than a row) is read where it lies by the ``PITCHED`` build (name
suffix ``_ld``): it reads A and B through ``pitched`` views, which step by the row stride
of the array argument (:mod:`gemmlib.intrinsics.pitch`), and takes the float4 loads only
where that stride keeps every row 16-byte aligned.  Compile-time, as the view costs
registers the default tile has none to spare for.

All loops over the accumulator have constant trip counts and small bodies
(the k loop and the epilogue are unrolled by hand where numba would leave
them rolled), so the accumulator lives in registers: the compile gate checks
there is no local memory in the PTX even for 8 x 16 results per thread.
"""

from gemmlib.backend import SIMULATOR, cuda, float32
from gemmlib.intrinsics.index import uidx
from gemmlib.intrinsics.pitch import packed, pitched
from gemmlib.intrinsics.vector import SHARED_ALIGN, aligned16, load4, load4_or_zero, store4
from gemmlib.spec import Constraint, KernelSpec, cdiv

WARP = 32


def _derived(p):
    """The derived sizes of a parameter set (None when they are not whole numbers)."""
    BM, BN, BK, WM, WN, WNITER, TM, TN = (p[k] for k in
                                          ("BM", "BN", "BK", "WM", "WN", "WNITER", "TM", "TN"))
    if min(BM, BN, BK, WM, WN, WNITER, TM, TN) <= 0 or BM % WM or BN % WN:
        return None
    nwarps = (BM // WM) * (BN // WN)
    per_warp = WM * WN
    if per_warp % (WARP * TM * TN * WNITER):
        return None
    wmiter = per_warp // (WARP * TM * TN * WNITER)
    if wmiter == 0 or WM % wmiter or WN % WNITER:
        return None
    wsubm, wsubn = WM // wmiter, WN // WNITER
    if wsubm % TM or wsubn % TN or (wsubm // TM) * (wsubn // TN) != WARP:
        return None
    return dict(NT=nwarps * WARP, WMITER=wmiter, WSUBM=wsubm, WSUBN=wsubn,
                LANE_COLS=wsubn // TN)


def _tiling(spec, M, N, K, dev):
    p = spec.params
    d = _derived(p)
    if d is None or d["NT"] != spec.threads:
        return False
    nt = d["NT"]

    def swizzles(X):   # X ^ a swizzle < min(32, X) stays inside the tile
        return X % min(32, X) == 0 and p["BK"] <= 32 and (X & (X - 1) == 0 or X % 32 == 0)

    swizzle_ok = p.get("SWIZZLE", 1) == 0 or (swizzles(p["BM"]) and (
        p.get("B_LAYOUT", "KN") == "KN" or swizzles(p["BN"])))
    return (p["TM"] % 4 == 0 and p["TN"] % 4 == 0 and p["BK"] % 4 == 0 and p["PAD"] % 4 == 0
            and (p["BM"] * p["BK"] // 4) % nt == 0 and (p["BK"] * p["BN"] // 4) % nt == 0
            and swizzle_ok)


def _registers(spec, M, N, K, dev):
    p = spec.params
    d = _derived(p)
    if d is None:
        return False
    acc = d["WMITER"] * p["TM"] * p["WNITER"] * p["TN"]
    frags = d["WMITER"] * p["TM"] + p["WNITER"] * p["TN"]
    staged = (p["BM"] * p["BK"] + p["BK"] * p["BN"]) // d["NT"]
    return acc + frags + staged + 30 <= min(255, p.get("max_registers") or 255)


def _regs_per_sm(spec, M, N, K, dev):
    # At least one block must fit the SM's register file at the per-thread estimate.
    p = spec.params
    d = _derived(p)
    if d is None:
        return False
    acc = d["WMITER"] * p["TM"] * p["WNITER"] * p["TN"]
    return spec.threads * min(acc + 60, 255) <= dev.registers_per_block


CONSTRAINTS = (
    Constraint("warp tiling", _tiling,
               "WM | BM and WN | BN; a warp tile must split into WMITER x WNITER steps whose "
               "32 lanes form a (WSUBM/TM) x (WSUBN/TN) grid; TM, TN, BK, PAD multiples of 4; "
               "the threads must copy both tiles in whole float4 passes"),
    Constraint("registers per thread", _registers,
               "accumulators + fragments + the prefetched next tile (+ ~30 for addresses) must "
               "fit in 255 registers, or in max_registers when that cap is set"),
    Constraint("registers per block", _regs_per_sm,
               "threads x registers per thread must fit the register file of one SM"),
)


#: The rung's default, the fastest configuration measured on an H200 (84.9% of cuBLAS at
#: 4096^3, 85.4% at 8192^3; results/uidx-2026-11-22/): 256 threads, 8 warps of 64 x 64 over
#: a 256 x 128 block tile, k-tile 16; each thread 8 x 16 results in 2 x 2 pieces of 8 x 4
#: (lanes 4 x 8: the float4 loads of one quarter-warp are broadcasts or contiguous).
#: 128 x 256 x 16 is within a point of it (84.0%, 84.5%) and better on odd shapes.
DEFAULTS = {"BM": 256, "BN": 128, "BK": 16, "WM": 64, "WN": 64, "WNITER": 2, "TM": 8, "TN": 4,
            "PAD": 0}


def build(BM: int = DEFAULTS["BM"], BN: int = DEFAULTS["BN"], BK: int = DEFAULTS["BK"],
          WM: int = DEFAULTS["WM"], WN: int = DEFAULTS["WN"], WNITER: int = DEFAULTS["WNITER"],
          TM: int = DEFAULTS["TM"], TN: int = DEFAULTS["TN"], PAD: int = DEFAULTS["PAD"],
          SWIZZLE: bool = True, max_registers: int | None = None,
          SPLIT_K: bool = False, B_LAYOUT: str = "KN", A_LAYOUT: str = "MK",
          PITCHED: bool = False) -> KernelSpec:
    """A warptile spec for these tile parameters.

    ``SPLIT_K`` compiles the split-K variant used by :mod:`gemmlib.kernels.split_k`:
    block z of a grid with Z blocks along z sums only its slice of the k-tiles and
    writes its partial product to rows ``z*M .. z*M + M-1`` of C (a workspace of
    Z*M rows).  It is a compile-time switch: the plain rung's code is unchanged.

    ``B_LAYOUT="NK"``: B is (N, K) row-major and C = A @ B.T; its tile is loaded and
    stored transposed as A's is (see the module docstring).  ``A_LAYOUT="KM"``: A is given
    as its (K, M) row-major memory (a column-major A), copied into shared memory as it
    lies.  Both compile-time.

    ``PITCHED``: the build for operands that are slices of wider matrices (name suffix
    ``_ld``; see the module docstring), also compile-time: the packed build's code is
    unchanged.
    """
    if B_LAYOUT not in ("KN", "NK"):
        raise ValueError(f"B_LAYOUT must be 'KN' or 'NK', got {B_LAYOUT!r}")
    if A_LAYOUT not in ("MK", "KM"):
        raise ValueError(f"A_LAYOUT must be 'MK' or 'KM', got {A_LAYOUT!r}")
    NK_ = B_LAYOUT == "NK"
    KM_ = A_LAYOUT == "KM"
    params = {"BM": BM, "BN": BN, "BK": BK, "WM": WM, "WN": WN, "WNITER": WNITER,
              "TM": TM, "TN": TN, "PAD": PAD}
    if not SWIZZLE:
        params["SWIZZLE"] = 0
    if max_registers:
        params["max_registers"] = max_registers
    default = params == DEFAULTS
    if NK_:
        params["B_LAYOUT"] = "NK"
    if KM_:
        params["A_LAYOUT"] = "KM"
    PITCHED_ = bool(PITCHED)
    if PITCHED_:
        params["PITCHED"] = True
    view = pitched if PITCHED_ else packed   # (gemmlib.intrinsics.pitch)
    d = _derived(params) or dict(NT=WARP, WMITER=1, WSUBM=WM, WSUBN=WN, LANE_COLS=1)
    NT, WMITER, WSUBM, WSUBN, LANE_COLS = (d[k] for k in
                                           ("NT", "WMITER", "WSUBM", "WSUBN", "LANE_COLS"))
    WCOLS = max(BN // WN, 1)  # warps along a row of the block tile
    FM = WMITER * TM  # rows of C per thread
    FN = WNITER * TN  # columns of C per thread
    ACC = FM * FN
    TM4, TN4 = TM // 4, TN // 4
    BK4, BN4, BM4 = max(BK // 4, 1), max(BN // 4, 1), max(BM // 4, 1)
    A_PASSES = max(BM * BK4 // NT, 1)
    B_PASSES = max(BK * BN4 // NT, 1)
    A_REGS, B_REGS = 4 * A_PASSES, 4 * B_PASSES
    SA_COLS = BM + PAD
    SB_COLS = BN
    SROWS = 2 * BK  # two k-tiles: double buffering
    # The transposing store: row k of sAT keeps column m at m ^ swz(k) (see bank_free.py)
    SWIZZLE_ = bool(SWIZZLE)
    RPW = max(32 // BK4, 1)  # rows of A one warp copies per pass
    SWZ_MASK = min(32, BM) - 1
    SWZ_MASK_B = min(32, BN) - 1   # NK: B's tile is stored transposed and swizzled like A's
    SPLIT_K_ = bool(SPLIT_K)

    def swz(k):
        """Column XOR-ed into row k (0 <= k < BK) of a sAT buffer: constant over 4 rows
        (KM: 0, A's rows are stored as they lie, with no transposing store to spread)."""
        return ((k // 4) * RPW) & SWZ_MASK if SWIZZLE_ and not KM_ else 0

    def swz_b(k):
        """NK: the column XOR-ed into row k of an sB buffer (KN: 0, no swizzle)."""
        return ((k // 4) * RPW) & SWZ_MASK_B if SWIZZLE_ and NK_ else 0

    def thread_origin(tid):
        """(row, col) in the block tile of thread tid's first result."""
        warp, lane = tid // WARP, tid % WARP
        row = (warp // WCOLS) * WM + (lane // LANE_COLS) * TM
        col = (warp % WCOLS) * WN + (lane % LANE_COLS) * TN
        return row, col

    def a_frag(tid, wm, q):
        """First row of the q-th float4 of thread tid's A fragment in warp step wm."""
        return thread_origin(tid)[0] + wm * WSUBM + q * 4

    def b_frag(tid, wn, q):
        """First column of the q-th float4 of thread tid's B fragment in warp step wn."""
        return thread_origin(tid)[1] + wn * WSUBN + q * 4

    def a_chunk(tid, p):
        """(row, first k) of the float4 of the A tile thread tid copies in pass p
        (KM: (k, first row) -- a float4 along M of A's (K, M) memory, as B's b_chunk)."""
        idx = tid + p * NT
        if KM_:
            return idx // BM4, (idx % BM4) * 4
        return idx // BK4, (idx % BK4) * 4

    def b_chunk(tid, p):
        """(k, first column) of the float4 of the B tile thread tid copies in pass p
        (NK: (column n, first k) -- a float4 along K of B's row n, as A's a_chunk)."""
        idx = tid + p * NT
        if NK_:
            return idx // BK4, (idx % BK4) * 4
        return idx // BN4, (idx % BN4) * 4

    _thread_origin = cuda.jit(device=True)(thread_origin)
    _a_chunk = cuda.jit(device=True)(a_chunk)
    _b_chunk = cuda.jit(device=True)(b_chunk)
    _swz = cuda.jit(device=True)(swz)
    _swz_b = cuda.jit(device=True)(swz_b)

    @cuda.jit(device=True)
    def fetch_a(A, ra, tid, m0, k0, a_vec):
        """Global -> registers: this thread's float4s of the A tile at (m0, k0)."""
        for p in range(A_PASSES):
            r, kq = _a_chunk(tid, p)
            if KM_:   # A is (K, M): row k0 + r, m from m0 + kq
                v0, v1, v2, v3 = load4_or_zero(A, k0 + r, m0 + kq, a_vec)
            else:
                v0, v1, v2, v3 = load4_or_zero(A, m0 + r, k0 + kq, a_vec)
            ra[4 * p] = v0
            ra[4 * p + 1] = v1
            ra[4 * p + 2] = v2
            ra[4 * p + 3] = v3

    @cuda.jit(device=True)
    def fetch_b(B, rb, tid, k0, n0, b_vec):
        """Global -> registers: this thread's float4s of the B tile at (k0, n0)."""
        for p in range(B_PASSES):
            kr, c = _b_chunk(tid, p)
            if NK_:   # B is (N, K): row n0 + kr, k from k0 + c
                v0, v1, v2, v3 = load4_or_zero(B, n0 + kr, k0 + c, b_vec)
            else:
                v0, v1, v2, v3 = load4_or_zero(B, k0 + kr, n0 + c, b_vec)
            rb[4 * p] = v0
            rb[4 * p + 1] = v1
            rb[4 * p + 2] = v2
            rb[4 * p + 3] = v3

    @cuda.jit(device=True)
    def stage(sAT, sB, ra, rb, tid, boff):
        """Registers -> shared buffer starting at row boff (A transposed)."""
        for p in range(A_PASSES):
            r, kq = _a_chunk(tid, p)
            if KM_:   # (k, first m) = (r, kq): as it lies
                store4(sAT, boff + r, kq, ra[4 * p], ra[4 * p + 1], ra[4 * p + 2],
                       ra[4 * p + 3])
            else:
                rs = r ^ _swz(kq)
                for e in range(4):
                    sAT[uidx(boff + kq + e), uidx(rs)] = ra[4 * p + e]
        for p in range(B_PASSES):
            kr, c = _b_chunk(tid, p)
            if NK_:   # (n, first k) = (kr, c): transposed, as A
                ns = kr ^ _swz_b(c)
                for e in range(4):
                    sB[uidx(boff + c + e), uidx(ns)] = rb[4 * p + e]
            else:
                store4(sB, boff + kr, c, rb[4 * p], rb[4 * p + 1], rb[4 * p + 2],
                       rb[4 * p + 3])

    @cuda.jit(device=True)
    def k_step(sAT, sB, krow, sw, swb, row0, col0, acc, fa, fb):
        """One k: fragments of A and B from shared memory, then their outer product.

        sw is the swizzle of this row of sAT, swb of this row of sB (0 unless NK)."""
        for wm in range(WMITER):
            for q in range(TM4):
                x0, x1, x2, x3 = load4(sAT, krow, (row0 + wm * WSUBM + 4 * q) ^ sw)
                fa[wm * TM + 4 * q] = x0
                fa[wm * TM + 4 * q + 1] = x1
                fa[wm * TM + 4 * q + 2] = x2
                fa[wm * TM + 4 * q + 3] = x3
        for wn in range(WNITER):
            for q in range(TN4):
                y0, y1, y2, y3 = load4(sB, krow, (col0 + wn * WSUBN + 4 * q) ^ swb)
                fb[wn * TN + 4 * q] = y0
                fb[wn * TN + 4 * q + 1] = y1
                fb[wn * TN + 4 * q + 2] = y2
                fb[wn * TN + 4 * q + 3] = y3
        for i in range(FM):
            for j in range(FN):
                acc[i * FN + j] += fa[i] * fb[j]

    @cuda.jit(device=True)
    def store_row_vec(C, acc, ri, gr, gcol0, N):
        """Row ri of this thread's results to row gr of C, as float4s."""
        for wn in range(WNITER):
            for q in range(TN4):
                gc = gcol0 + wn * WSUBN + 4 * q
                j = ri * FN + wn * TN + 4 * q
                if gc < N:
                    store4(C, gr, gc, acc[j], acc[j + 1], acc[j + 2], acc[j + 3])

    def warptile_kernel(A, B, C):
        sAT = cuda.shared.array((SROWS, SA_COLS), float32, alignment=SHARED_ALIGN)
        sB = cuda.shared.array((SROWS, SB_COLS), float32, alignment=SHARED_ALIGN)
        acc = cuda.local.array(ACC, float32)
        fa = cuda.local.array(FM, float32)
        fb = cuda.local.array(FN, float32)
        ra = cuda.local.array(A_REGS, float32)
        rb = cuda.local.array(B_REGS, float32)
        if KM_:
            K, M = A.shape
        else:
            M, K = A.shape
        N = B.shape[0] if NK_ else B.shape[1]
        Ap, Bp = view(A), view(B)   # PITCHED: slices of wider matrices, read by their strides
        tid = cuda.threadIdx.x
        m0 = cuda.blockIdx.y * BM
        n0 = cuda.blockIdx.x * BN
        row0, col0 = _thread_origin(tid)
        a_vec = (M if KM_ else K) % 4 == 0 and aligned16(Ap)   # A's rows 16-byte aligned
        b_vec = (K if NK_ else N) % 4 == 0 and aligned16(Bp)   # B's rows 16-byte aligned
        c_vec = N % 4 == 0 and aligned16(C)
        for i in range(ACC):
            acc[i] = float32(0.0)

        ntiles = (K + BK - 1) // BK
        t0 = 0  # this block sums k-tiles t0 .. t1-1 ...
        t1 = ntiles
        crow = 0  # ... into rows crow .. crow+M-1 of C
        if SPLIT_K_:  # a compile-time constant: the plain rung has no such branch
            per = (ntiles + cuda.gridDim.z - 1) // cuda.gridDim.z
            t0 = cuda.blockIdx.z * per
            t1 = min(ntiles, t0 + per)
            crow = cuda.blockIdx.z * M
        fetch_a(Ap, ra, tid, m0, t0 * BK, a_vec)
        fetch_b(Bp, rb, tid, t0 * BK, n0, b_vec)
        stage(sAT, sB, ra, rb, tid, 0)
        cuda.syncthreads()
        for t in range(t0, t1):
            boff = ((t - t0) % 2) * BK
            more = t + 1 < t1
            if more:  # issue the next tile's global loads now; use them after the FMAs
                fetch_a(Ap, ra, tid, m0, (t + 1) * BK, a_vec)
                fetch_b(Bp, rb, tid, (t + 1) * BK, n0, b_vec)
            # Four k-steps per iteration, written out: numba leaves a loop this large
            # rolled, and unrolling by hand turns the per-step address arithmetic into
            # constant offsets of the shared-memory loads.
            for kk in range(0, BK, 4):
                krow = boff + kk
                sw = _swz(kk)
                swb = _swz_b(kk)
                k_step(sAT, sB, krow, sw, swb, row0, col0, acc, fa, fb)
                k_step(sAT, sB, krow + 1, sw, swb, row0, col0, acc, fa, fb)
                k_step(sAT, sB, krow + 2, sw, swb, row0, col0, acc, fa, fb)
                k_step(sAT, sB, krow + 3, sw, swb, row0, col0, acc, fa, fb)
            if more:
                stage(sAT, sB, ra, rb, tid, BK - boff)  # the other buffer
            cuda.syncthreads()

        # The results.  Every loop here has a constant trip count and a small body, so
        # it is unrolled and acc keeps constant indices: it stays in registers.
        gcol0 = n0 + col0
        if c_vec:
            for ri in range(FM):
                gr = m0 + row0 + (ri // TM) * WSUBM + ri % TM
                if gr < M:
                    store_row_vec(C, acc, ri, crow + gr, gcol0, N)
        else:
            for ri in range(FM):
                gr = m0 + row0 + (ri // TM) * WSUBM + ri % TM
                if gr < M:
                    for cj in range(FN):
                        gc = gcol0 + (cj // TN) * WSUBN + cj % TN
                        if gc < N:
                            C[uidx(crow + gr), uidx(gc)] = acc[ri * FN + cj]

    # max_registers caps registers per thread (like __launch_bounds__); the simulator has no
    # such option, and there it would mean nothing anyway.
    opts = {"max_registers": max_registers} if max_registers and not SIMULATOR else {}
    kernel = cuda.jit(**opts)(warptile_kernel)

    def grid(M, N, K):
        return (cdiv(N, BN), cdiv(M, BM), 1)

    name = "warptile" if default else (
        f"warptile_{BM}x{BN}x{BK}_w{WM}x{WN}n{WNITER}_t{TM}x{TN}_p{PAD}"
        + ("" if SWIZZLE_ else "_noswz") + (f"_r{max_registers}" if max_registers else ""))
    if PITCHED_:
        name += "_ld"
    if NK_:
        name += "_nk"
    if KM_:
        name += "_km"
    if SPLIT_K_:
        name += "_splitk"
    return KernelSpec(
        name=name,
        chapter="09-warp-tiling",
        idea="block tile -> warp tiles -> thread tiles, float4 everywhere, and a double-"
             "buffered shared tile fed by register prefetch"
             + ("; B given (N, K), transposed into shared memory as A is" if NK_ else "")
             + ("; A given (K, M), copied into shared memory as it lies" if KM_ else ""),
        kernel=kernel,
        block=(NT, 1, 1),
        tile=(BM, BN),
        grid=grid,
        params=params,
        shared_bytes=(SROWS * SA_COLS + SROWS * SB_COLS) * 4,
        a_operand=A_LAYOUT,
        b_operand=B_LAYOUT,
        constraints=CONSTRAINTS,
        # (NK with an MK A: both tiles go into shared memory by transposing scalar stores,
        # no st.shared.v4)
        ptx_must=(r"ld\.global\.v4\.f32", r"ld\.shared\.v4\.f32")
        + (() if NK_ and not KM_ else (r"st\.shared\.v4\.f32",)) + (r"st\.global\.v4\.f32",),
        index={"thread_origin": thread_origin, "a_frag": a_frag, "b_frag": b_frag,
               "a_chunk": a_chunk, "b_chunk": b_chunk, "swz": swz, "swz_b": swz_b},
        module=__name__,
        reads_pitched=PITCHED_,
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

    def sat_address(k, m):  # row k of a sAT buffer, column m before the swizzle
        return k * sa_cols + (m ^ swz(k))

    nt = spec.threads
    d = _derived(p)
    a_passes = max(p["BM"] * p["BK"] // 4 // nt, 1)
    if p.get("A_LAYOUT", "MK") == "KM":   # float4 stores of A's rows along M, as they lie
        a_st = Access("sAT", "store", sa_cols, lambda t: ix["a_chunk"](t, 0), width=4,
                      label="store4(sAT, k, m, ...)", count=a_passes)
    else:
        a_st = Access("sAT", "store", sa_cols, a_store,
                      label="sAT[kq + e, r] = ra[...] (transposing)", count=4 * a_passes,
                      address=sat_address)
    b_passes = max(p["BK"] * p["BN"] // 4 // nt, 1)
    if p.get("B_LAYOUT", "KN") == "NK":   # sB is stored transposed and swizzled, as sAT
        swz_b = ix["swz_b"]

        def b_store(t):
            n, kq = ix["b_chunk"](t, 0)
            return kq, n

        def sb_address(k, n):
            return k * p["BN"] + (n ^ swz_b(k))

        b_acc = [
            Access("sB", "store", p["BN"], b_store, label="sB[kq + e, n] = rb[...] (transposing)",
                   count=4 * b_passes, address=sb_address),
            Access("sB", "load", p["BN"], lambda t: (0, ix["b_frag"](t, 0, 0)), width=4,
                   label="load4(sB, k, b_frag) (inner loop)",
                   count=p["BK"] * p["WNITER"] * p["TN"] // 4, address=sb_address)]
    else:
        b_acc = [
            Access("sB", "store", p["BN"], lambda t: ix["b_chunk"](t, 0), width=4,
                   label="store4(sB, k, c, ...)", count=b_passes),
            Access("sB", "load", p["BN"], lambda t: (0, ix["b_frag"](t, 0, 0)), width=4,
                   label="load4(sB, k, b_frag) (inner loop)",
                   count=p["BK"] * p["WNITER"] * p["TN"] // 4)]
    return [
        a_st,
        b_acc[0],
        Access("sAT", "load", sa_cols, lambda t: (0, ix["a_frag"](t, 0, 0)), width=4,
               label="load4(sAT, k, a_frag) (inner loop)",
               count=p["BK"] * d["WMITER"] * p["TM"] // 4, address=sat_address),
        b_acc[1],
    ]

SPEC = build()
