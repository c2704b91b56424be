"""ldmatrix from XOR-swizzled shared memory: whole fragments in one instruction, no conflicts.

``mma_atom`` gathered every fragment element with its own shared load.  A
warp can instead ask for whole fragments: ``ldmatrix.x4`` fetches four 8 x 8
tiles of 16-bit elements -- an entire A fragment of m16n8k16 -- in one
instruction, each lane supplying the address of one 16-byte row.  Two things
change to make that fast:

* **Warp tiles.**  A block of four warps owns a 64 x 64 tile of C; each warp
  a 32 x 32 sub-tile, i.e. 2 x 4 MMA atoms.  Per k-step a warp loads 2 A
  fragments and 4 B fragments and issues 8 mma: every fragment is reused
  (A by 4 atoms, B by 2), as the SIMT rungs reused registers.
* **Swizzled shared memory.**  ldmatrix reads eight 16-byte rows at once.
  In a row-major tile whose rows are 64 or 256 bytes long those eight rows
  start in the same few banks, an up to 8-way conflict.  Padding would
  break the 16-byte alignment that ldmatrix and 16-byte copies need; an XOR
  *swizzle* instead permutes the 16-byte chunks within each row by the low
  bits of the row number (``gemmlib.layout.chunk_swizzle``).  Each row keeps
  its elements, nothing is wasted, and the eight rows of every ldmatrix
  land in eight different chunk columns: conflict-free
  (``gemmlib.banks.analyze`` computes it from :func:`accesses`, which uses
  the same swizzled layouts the kernel does).

B is stored k-major (rows of k), so its fragments -- pairs along k -- come
from ``ldmatrix.x4.trans``, which delivers each 8 x 8 tile transposed.  TF32
has 32-bit elements, which ldmatrix cannot transpose: A still comes from
``ldmatrix.x4`` (a 16 x 8 fp32 tile is a 16 x 16 tile of 16-bit halves, and
each lane receives whole floats), B from two scalar loads per atom, which
the swizzle (chunk bits 1.. instead of 0..) also keeps conflict-free.

Given K-major, (N, K) (``mma_pipeline``'s ``B_LAYOUT="NK"``), B's tile is stored as A's
is, rows of n swizzled like A's rows of m, and its fragments are rows of that tile:
``ldmatrix`` without ``.trans`` (``fragment_loaders(b_nk=True)``), 16-bit and TF32 alike.

The copies global -> shared are still plain guarded loads (any M, N, K);
the next rung makes them asynchronous.

On sm_75 (Turing, the T4: ldmatrix yes, m16n8k16 FP16 no) the FP16 build's
``arch="sm75"`` form loads the same fragments and issues each m16n8k16 as
two m16n8k8 (``gemmlib.intrinsics.mma.mma_f16_sm75``); ``build`` makes the
form of the GPU at hand.
"""

from gemmlib import layout as L
from gemmlib.backend import cuda, float32, uint16
from gemmlib.intrinsics import mma as I
from gemmlib.intrinsics.index import uidx
from gemmlib.intrinsics.vector import SHARED_ALIGN
from gemmlib.kernels.mma_atom import ARG_DTYPES, INPUT_DTYPE
from gemmlib.precision import TENSOR_CORE as PRECISIONS  # what these rungs compute in
from gemmlib.spec import Access, KernelSpec, cdiv


def _mn_major(rows: int, cols: int, elem_bytes: int):
    """A k-major tile (rows of k, ``cols`` of m or n): 16-bit ones are read by
    ldmatrix.trans (8 rows at once); fp32 ones by scalar loads of 4 rows x 8 columns, which
    need only 4 rows spread, over chunk bits 1.. (two chunks per row)."""
    return L.SwizzledLayout(L.row_major((rows, cols)),
                            L.chunk_swizzle(cols, 2) if elem_bytes == 2 else
                            L.chunk_swizzle(cols, 4, rows_xor=4, low=1))


def tile_layouts(BM: int, BN: int, BK: int, elem_bytes: int, b_nk: bool = False,
                 a_km: bool = False):
    """The swizzled shared layouts of A (BM x BK, row-major; ``a_km``: BK x BM, rows of k
    -- a column-major A's tile as it lies, laid out like a row-major B's) and B (BK x BN,
    row-major; ``b_nk``: BN x BK, row-major -- K-major like A, and swizzled like A)."""
    a = (_mn_major(BK, BM, elem_bytes) if a_km else
         L.SwizzledLayout(L.row_major((BM, BK)), L.chunk_swizzle(BK, elem_bytes)))
    if b_nk:
        return a, L.SwizzledLayout(L.row_major((BN, BK)), L.chunk_swizzle(BK, elem_bytes))
    return a, _mn_major(BK, BN, elem_bytes)


def fragment_loaders(precision: str, sw_a, sw_b, b_nk: bool = False, a_km: bool = False):
    """Device functions that load one warp's fragments for k-step ``kk`` from a stage
    at element offset ``base`` of the shared arrays.

    ``b_nk``: B's tile is K-major (BN x BK, rows of n, as A's rows of m): its fragments --
    pairs along k of one column n -- are then rows of that tile, which ``ldmatrix``
    delivers without ``.trans``, 16-bit and TF32 alike (a TF32 8 x 4 piece is an 8 x 8
    tile of 16-bit halves, as for A).

    ``a_km``: A's tile is k-major (BK x BM, rows of k): its fragments -- pairs along k of
    one row m -- are columns of that tile, which ``ldmatrix.trans`` delivers (16-bit), as it
    does B's from a row-major B; TF32 loads the four elements one by one.

    ``load_a(sA, base, lane, row0, kk)``: the A fragment of the 16-row atom at
    ``row0``; ``load_b(sB, base, lane, col0, kk)``: B fragments of the n-atoms at
    ``col0`` (16-bit: two atoms, ``col0`` and ``col0 + 8``; TF32: one).  For
    ``3xtf32`` each returns the TF32 "big" registers followed by the "small" ones
    (``gemmlib.intrinsics.mma.split_tf32``: a NaN/Inf travels in the small part).
    """
    sixteen = precision in ("fp16", "bf16")
    split = precision == "3xtf32"
    KA = 16 if sixteen else 8
    HALF = 8 if sixteen else 4   # elements in one 16-byte ldmatrix row

    @cuda.jit(device=True)
    def big_small(r):   # x = big + small; NaN/Inf keep fp32 semantics (see split_tf32)
        return I.split_tf32(I.as_float(r))

    @cuda.jit(device=True)
    def load_a(sA, base, lane, row0, kk):
        # lanes 0-15 give rows 0-15 at k half 0, lanes 16-31 the same rows at half 1
        off = sw_a(row0 + lane % 16, kk * KA + (lane // 16) * HALF)
        a0, a1, a2, a3 = I.ldmatrix_x4(sA, uidx(base + off))
        if sixteen:
            return a0, a1, a2, a3
        if not split:
            return (I.cvt_tf32(I.as_float(a0)), I.cvt_tf32(I.as_float(a1)),
                    I.cvt_tf32(I.as_float(a2)), I.cvt_tf32(I.as_float(a3)))
        g0, s0 = big_small(a0)
        g1, s1 = big_small(a1)
        g2, s2 = big_small(a2)
        g3, s3 = big_small(a3)
        return g0, g1, g2, g3, s0, s1, s2, s3

    @cuda.jit(device=True)
    def load_a16_km(sA, base, lane, row0, kk):
        # matrices: (m row0.., k 0-7), (m row0+8.., k 0-7), (row0.., k 8-15), (row0+8.., k 8-15)
        k = kk * 16 + lane % 8 + (lane // 16) * 8
        off = sw_a(k, row0 + ((lane // 8) % 2) * 8)
        return I.ldmatrix_x4_trans(sA, uidx(base + off))

    @cuda.jit(device=True)
    def load_a32_km(sA, base, lane, row0, kk):
        # lane (g, t) = (lane // 4, lane % 4): A[m g, k t], [g + 8, t], [g, t + 4], [g + 8, t + 4]
        k = kk * 8 + lane % 4
        m = row0 + lane // 4
        x0 = sA[uidx(base + sw_a(k, m))]
        x1 = sA[uidx(base + sw_a(k, m + 8))]
        x2 = sA[uidx(base + sw_a(k + 4, m))]
        x3 = sA[uidx(base + sw_a(k + 4, m + 8))]
        if not split:
            return I.cvt_tf32(x0), I.cvt_tf32(x1), I.cvt_tf32(x2), I.cvt_tf32(x3)
        g0, s0 = big_small(I.as_bits(x0))
        g1, s1 = big_small(I.as_bits(x1))
        g2, s2 = big_small(I.as_bits(x2))
        g3, s3 = big_small(I.as_bits(x3))
        return g0, g1, g2, g3, s0, s1, s2, s3

    @cuda.jit(device=True)
    def load_b16(sB, base, lane, col0, kk):
        # matrices: (k 0-7, n col0), (k 8-15, col0), (k 0-7, col0+8), (k 8-15, col0+8)
        k = kk * 16 + lane % 8 + ((lane // 8) % 2) * 8
        off = sw_b(k, col0 + (lane // 16) * 8)
        return I.ldmatrix_x4_trans(sB, uidx(base + off))

    @cuda.jit(device=True)
    def load_b32(sB, base, lane, col0, kk):
        k = kk * 8 + lane % 4
        n = col0 + lane // 4
        x0 = sB[uidx(base + sw_b(k, n))]
        x1 = sB[uidx(base + sw_b(k + 4, n))]
        if not split:
            return I.cvt_tf32(x0), I.cvt_tf32(x1)
        g0, s0 = big_small(I.as_bits(x0))
        g1, s1 = big_small(I.as_bits(x1))
        return g0, g1, s0, s1

    @cuda.jit(device=True)
    def load_b16_nk(sB, base, lane, col0, kk):
        # the same four matrices as load_b16, each now 8 rows of n x 8 k (no transpose)
        n = col0 + lane % 8 + (lane // 16) * 8
        off = sw_b(n, kk * 16 + ((lane // 8) % 2) * 8)
        return I.ldmatrix_x4(sB, uidx(base + off))

    @cuda.jit(device=True)
    def load_b32_nk(sB, base, lane, col0, kk):
        # matrices (n col0.., k 0-3) and (n col0.., k 4-7): lane gets B[k=t, n=g], [t+4, g]
        off = sw_b(col0 + lane % 8, kk * 8 + ((lane // 8) % 2) * 4)
        r0, r1 = I.ldmatrix_x2(sB, uidx(base + off))
        if not split:
            return I.cvt_tf32(I.as_float(r0)), I.cvt_tf32(I.as_float(r1))
        g0, s0 = big_small(r0)
        g1, s1 = big_small(r1)
        return g0, g1, s0, s1

    if a_km:
        load_a = load_a16_km if sixteen else load_a32_km
    if b_nk:
        return load_a, (load_b16_nk if sixteen else load_b32_nk)
    return load_a, (load_b16 if sixteen else load_b32)


def warp_step_source(precision: str, MI: int, NI: int, ksteps: int,
                     promote: bool = False) -> str:
    """Source of ``warp_step``: one warp's MI x NI atoms over ``ksteps`` k-steps,
    straight-line, every accumulator index a constant (so they live in registers).

    ``promote``: the tensor cores truncate when they add into the fp32
    accumulator (one rounding toward zero per mma), so over a long K the
    error grows like K.  With ``promote`` the k-tile is summed into fresh
    registers ``p*`` starting from zero, and only that short partial sum is
    added to ``acc`` -- by an ordinary, correctly rounded fp32 add.
    """
    sixteen = precision in ("fp16", "bf16")
    split = precision == "3xtf32"
    out = ["def warp_step(sA, sB, abase, bbase, acc, lane, wr, wc):"]
    started = set()   # atoms whose fresh partial sum exists (promote)

    def mma(a, b, i, j):
        e = (i * NI + j) * 4
        if not promote:
            c = ", ".join(f"acc[{e + v}]" for v in range(4))
            return [f"    d = mma({a}, {b}, {c})"] + [f"    acc[{e + v}] = d[{v}]"
                                                      for v in range(4)]
        c = ", ".join(f"p{e + v}" if e in started else "ZERO" for v in range(4))
        started.add(e)
        return [f"    p{e}, p{e + 1}, p{e + 2}, p{e + 3} = mma({a}, {b}, {c})"]

    for kk in range(ksteps):
        out.append(f"    # k-step {kk}")
        for i in range(MI):
            out.append(f"    fa{i} = load_a(sA, abase, lane, wr + {16 * i}, {kk})")
        if sixteen:
            for j in range(0, NI, 2):
                out.append(f"    fb{j} = load_b(sB, bbase, lane, wc + {8 * j}, {kk})")
        else:
            for j in range(NI):
                out.append(f"    fb{j} = load_b(sB, bbase, lane, wc + {8 * j}, {kk})")
        for i in range(MI):
            A = ", ".join(f"fa{i}[{r}]" for r in range(4))
            for j in range(NI):
                if sixteen:
                    B = f"fb{j - j % 2}[{2 * (j % 2)}], fb{j - j % 2}[{2 * (j % 2) + 1}]"
                    out += mma(A, B, i, j)
                elif not split:
                    out += mma(A, f"fb{j}[0], fb{j}[1]", i, j)
                else:  # small terms first, then big * big
                    As = ", ".join(f"fa{i}[{4 + r}]" for r in range(4))
                    out += mma(As, f"fb{j}[0], fb{j}[1]", i, j)
                    out += mma(A, f"fb{j}[2], fb{j}[3]", i, j)
                    out += mma(A, f"fb{j}[0], fb{j}[1]", i, j)
    if promote:
        out.append("    # promote: the k-tile's partial sums join the accumulators (fp32 adds)")
        out += [f"    acc[{e}] = acc[{e}] + p{e}" for e in range(MI * NI * 4)]
    return "\n".join(out) + "\n"


def epilogue(MI: int, NI: int):
    """``store_tile(C, acc, lane, m0, n0, M, N)``: the accumulators -> C, guarded."""

    @cuda.jit(device=True)
    def store_tile(C, acc, lane, m0, n0, M, N):
        g, t = lane // 4, lane % 4
        for i in range(MI):
            for j in range(NI):
                for v in range(4):
                    m = m0 + i * 16 + g + (v // 2) * 8
                    n = n0 + j * 8 + 2 * t + v % 2
                    if m < M and n < N:
                        C[uidx(m), uidx(n)] = acc[(i * NI + j) * 4 + v]

    return store_tile


def warp_code(precision: str, BM: int, BN: int, BK: int, WM: int, WN: int,
              promote: bool = False, arch: str = "sm80", b_nk: bool = False,
              a_km: bool = False):
    """The warp-level pieces of a block tile: swizzled layouts, their device index
    functions, ``warp_step`` and ``store_tile`` (shared with ``mma_pipeline``;
    ``promote``: see :func:`warp_step_source`; ``arch="sm75"``: FP16 as two m16n8k8;
    ``b_nk``: B's shared tile K-major, BN x BK; ``a_km``: A's k-major, BK x BM; see
    :func:`fragment_loaders`)."""
    sixteen = precision in ("fp16", "bf16")
    KA = 16 if sixteen else 8
    MI, NI = WM // 16, WN // 8
    lay_a, lay_b = tile_layouts(BM, BN, BK, 2 if sixteen else 4, b_nk, a_km)
    sw_a = L.jit(lay_a.source("sw_a"), device=True)
    sw_b = L.jit(lay_b.source("sw_b"), device=True)
    load_a, load_b = fragment_loaders(precision, sw_a, sw_b, b_nk, a_km)
    warp_step = L.jit(warp_step_source(precision, MI, NI, BK // KA, promote), device=True,
                      env=dict(load_a=load_a, load_b=load_b, mma=I.mma_for(precision, arch),
                               ZERO=float32(0.0)))
    return lay_a, lay_b, sw_a, sw_b, warp_step, epilogue(MI, NI)


def build(precision: str = "fp16", arch: str | None = None) -> KernelSpec:
    """``arch``: ``"sm80"`` or ``"sm75"`` (FP16 only); None: this GPU's
    (``gemmlib.intrinsics.mma.device_arch``)."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    arch = arch or I.device_arch(precision)
    sm75 = arch == "sm75"
    sixteen = precision in ("fp16", "bf16")
    BM = BN = 64
    WM = WN = 32
    eb = 2 if sixteen else 4
    BK = 64 // eb                         # 64-byte rows of A: 32 halves or 16 floats
    MI, NI = WM // 16, WN // 8
    NT = (BM // WM) * (BN // WN) * 32
    lay_a, lay_b, sw_a, sw_b, warp_step, store_tile = warp_code(precision, BM, BN, BK, WM, WN,
                                                                arch=arch)
    elem = uint16 if sixteen else float32
    zero = elem(0)
    ACC = MI * NI * 4
    SA, SB = BM * BK, BK * BN

    @cuda.jit
    def mma_swizzle_kernel(A, B, C):
        sA = cuda.shared.array(SA, elem, alignment=SHARED_ALIGN)  # ldmatrix: 16 B rows
        sB = cuda.shared.array(SB, elem, alignment=SHARED_ALIGN)
        acc = cuda.local.array(ACC, float32)
        tid = cuda.threadIdx.x
        lane, warp = tid % 32, tid // 32
        wr = (warp // (BN // WN)) * WM
        wc = (warp % (BN // WN)) * WN
        M, K = A.shape
        N = B.shape[1]
        m0 = cuda.blockIdx.x * BM
        n0 = cuda.blockIdx.y * BN
        for e in range(ACC):
            acc[e] = float32(0.0)
        for k0 in range(0, K, BK):
            for e in range(tid, SA, NT):      # guarded copies into the swizzled tiles
                r, c = e // BK, e % BK
                ok = m0 + r < M and k0 + c < K
                sA[uidx(sw_a(r, c))] = A[uidx(m0 + r), uidx(k0 + c)] if ok else zero
            for e in range(tid, SB, NT):
                r, c = e // BN, e % BN
                ok = k0 + r < K and n0 + c < N
                sB[uidx(sw_b(r, c))] = B[uidx(k0 + r), uidx(n0 + c)] if ok else zero
            cuda.syncthreads()
            warp_step(sA, sB, 0, 0, acc, lane, wr, wc)
            cuda.syncthreads()
        store_tile(C, acc, lane, m0 + wr, n0 + wc, M, N)

    def grid(M, N, K):
        return (cdiv(M, BM), cdiv(N, BN), 1)

    return KernelSpec(
        name="mma_swizzle" if precision == "fp16" else f"mma_swizzle_{precision}",
        chapter="15-ldmatrix-swizzle",
        idea="four warps, each a 32x32 warp tile of mma atoms; fragments come whole from "
             "ldmatrix, out of XOR-swizzled shared tiles that no ldmatrix reads with conflicts",
        kernel=mma_swizzle_kernel,
        block=(NT, 1, 1),
        tile=(BM, BN),
        grid=grid,
        params=dict(precision=precision, BM=BM, BN=BN, BK=BK, WM=WM, WN=WN, arch=arch),
        shared_bytes=(BM * BK + BK * BN) * eb,
        min_cc=I.MIN_CC_SM75 if sm75 else I.MIN_CC,
        min_cc_why="" if sm75 else I.sm80_reason(precision),
        dtype=INPUT_DTYPE[precision],
        arg_dtypes=ARG_DTYPES[precision],
        precision=precision,
        ptx_must=(I.PTX_MUST_SM75 if sm75 else (r"mma\.sync\.aligned\.m16n8k",))
        + (r"ldmatrix\.sync\.aligned",),
        ptx_must_not=(r"\bld\.local", r"\bst\.local") + (I.PTX_MUST_NOT_SM75 if sm75 else ()),
        index=dict(sw_a=L.jit(lay_a.source("sw_a")), sw_b=L.jit(lay_b.source("sw_b"))),
        module=__name__,
    )


def accesses(spec) -> list[Access]:
    """Shared-memory accesses of the fragment loads, from the kernel's own swizzles
    (word addresses; one ldmatrix row or one float per lane), for gemmlib.banks."""
    return fragment_accesses(spec, swizzled=True)


def fragment_accesses(spec, swizzled: bool = True) -> list[Access]:
    p = spec.params
    sixteen = p["precision"] in ("fp16", "bf16")
    eb = 2 if sixteen else 4
    BK, BN, WM, WN = p["BK"], p["BN"], p["WM"], p["WN"]
    b_nk = p.get("B_LAYOUT", "KN") == "NK"
    if p.get("A_LAYOUT", "MK") == "KM":
        raise ValueError("the fragment-load analysis covers row-major A tiles (A_LAYOUT='MK')")
    lay_a, lay_b = tile_layouts(p["BM"], BN, BK, eb, b_nk)
    fa = lay_a if swizzled else lay_a.layout
    fb = lay_b if swizzled else lay_b.layout
    half = 8 if sixteen else 4
    warps_n = BN // WN

    def warp_origin(tid):
        w = tid // 32
        return (w // warps_n) * WM, (w % warps_n) * WN

    def a_row(tid):   # ldmatrix.x4 for the warp's first A atom, k-step 0
        wr, _ = warp_origin(tid)
        lane = tid % 32
        return wr + lane % 16, (lane // 16) * half

    out = [Access("sA", "load", BK, a_row, width=4, label="ldmatrix.x4 (A fragment)",
                  address=lambda r, c: fa(r, c) * eb // 4)]
    if b_nk:   # rows of n, as A's rows of m: (n, k) of the lane's 16-byte row
        def b_row_nk(tid):
            _, wc = warp_origin(tid)
            lane = tid % 32
            if sixteen:
                return wc + lane % 8 + (lane // 16) * 8, ((lane // 8) % 2) * 8
            return wc + lane % 8, ((lane // 8) % 2) * 4

        out.append(Access("sB", "load", BK, b_row_nk, width=4,
                          label=f"ldmatrix.x{4 if sixteen else 2} (B fragments, K-major)",
                          address=lambda r, c: fb(r, c) * eb // 4))
    elif sixteen:
        def b_row(tid):
            _, wc = warp_origin(tid)
            lane = tid % 32
            return lane % 8 + ((lane // 8) % 2) * 8, wc + (lane // 16) * 8

        out.append(Access("sB", "load", BN, b_row, width=4,
                          label="ldmatrix.x4.trans (B fragments)",
                          address=lambda r, c: fb(r, c) * eb // 4))
    else:
        def b_elem(tid):
            _, wc = warp_origin(tid)
            lane = tid % 32
            return lane % 4, wc + lane // 4

        out.append(Access("sB", "load", BN, b_elem, width=1, label="B fragment (scalar)",
                          address=lambda r, c: fb(r, c)))
    return out


SPEC = build()
