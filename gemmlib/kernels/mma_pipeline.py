"""The production tensor-core rung: bigger warp tiles fed by a multistage cp.async pipeline.

``mma_swizzle`` computes from conflict-free swizzled tiles, but every k-tile
starts with the whole block waiting for plain loads from DRAM, then computes
while the memory system idles.  This rung keeps the swizzled tiles and the
warp-level code (``warp_step``, the fragment loaders and the epilogue are
``mma_swizzle``'s) and changes how the tiles arrive:

* **A ring of STAGES shared buffers** (3 or 4).  Before the main loop the
  block starts copies of the first STAGES - 1 k-tiles with ``cp.async``
  (16 bytes per instruction, straight into the swizzled place; zero-filled
  past M, N and K).  At k-tile ``kt`` it waits until tile ``kt`` has landed
  (``cp.async.wait_group STAGES - 2``: the newer tiles may still be in
  flight), synchronises, starts the copy of tile ``kt + STAGES - 1`` into the
  buffer that tile ``kt - 1`` just freed, and computes tile ``kt``.  Up to
  STAGES - 1 tiles are in flight while the tensor cores work.
* **Larger tiles** per block and per warp (default 128 x 128 x 32 halves,
  warps of 64 x 64: 4 x 8 atoms, each A fragment reused 8 times and each B
  fragment 4 times), chosen per GPU by the autotuner.
* **Grouped block order.**  Blocks are numbered so that consecutive blocks
  sweep GROUP_M block-rows together: the B tiles they share are still in L2.

One block per tile of C leaves most SMs idle when C is small and K deep; the
``SPLIT_K`` form (a compile-time switch, off here) cuts K into slices along
the grid's z, and ``mma_split_k`` launches it.

16-byte copies need each row of A and B to start on a 16-byte boundary:
K and N multiples of 8 (FP16/BF16) or 4 (fp32) and aligned base pointers
(the ``operand_align`` constraint).  ``gemmlib.matmul`` stages any other
operands into zero-padded copies first, so every shape works through the
library call; the copy is the price of a misaligned shape.  A slice of a
wider matrix -- rows further apart than a row, the distance a multiple of 16
bytes -- is copied from where it lies by the ``PITCHED`` build (name suffix
``_ld``), which reads A and B through ``pitched`` views that step by the row
stride of the array argument (:mod:`gemmlib.intrinsics.pitch`): compile-time,
as the views cost registers the packed build keeps.

``B_LAYOUT="NK"`` (name suffix ``_nk``) takes B as torch holds an ``nn.Linear`` weight,
(N, K) row-major, and computes C = A @ B.T: B's k-tile is then K-major like A's, copied
by cp.async as A's is into a BN x BK tile swizzled like A's, and its fragments come from
``ldmatrix`` without ``.trans`` (``mma_swizzle.fragment_loaders(b_nk=True)``; TF32 too,
as for A).  Only K must be a multiple of the 16-byte piece.

``precision="3xtf32"`` keeps float32 in shared memory and splits every
fragment element in registers into a TF32 "big" part and the TF32 rounding
of the remainder; three mma per atom (small*big, big*small, big*big) give
about fp32 accuracy at tensor-core speed.  To keep it, the tensor cores may
only sum one k-tile at a time (``PROMOTE``, on by default for 3xtf32): they
truncate on every add into the accumulator, an error that grows like K, so
each k-tile starts from zero in fresh registers and its partial sums are
added to the accumulators with correctly rounded fp32 adds.

Non-finite values keep fp32 semantics.  Split naively (big = tf32(x), small
= tf32(x - big)), an Inf has small = Inf - Inf = NaN, and its big part meets
the other factor's small part, exactly 0 for every value TF32 holds: every
Inf input came out NaN where SGEMM gives +-Inf.  The split
(``gemmlib.intrinsics.mma.split_tf32``) sends a NaN or Inf into the *small*
part instead -- small = x, big = +-1 -- so that small_a*big_b is a*b with
fp32's rules (Inf*b = +-Inf, Inf*0 = NaN, NaN stays NaN) while the other two
products stay finite; with both factors infinite the two cross terms are the
same +-Inf.  The NaN/+Inf/-Inf pattern of C is then SGEMM's (checked in the
simulator by tests/test_nonfinite.py; on a GPU ``scripts/nonfinite_gpu.py``
compares with cuBLAS).
Near the fp32 maximum, cvt.rna rounds every finite |x| >= 3.40199e38 up to
Inf; there the split rounds big and small toward zero (big = 3.40116e38, the
largest TF32), so such an x stays finite and |big + small| <= |x|.  Where
3xTF32 still differs from SGEMM: a product above FLT_MAX gives SGEMM's +-Inf
as long as the correction terms stay finite, i.e. below about 2^11 FLT_MAX;
beyond that a correction term overflows too, possibly with the other sign
(NaN).  Results within about 2^-21 of FLT_MAX may round to Inf where SGEMM's
single rounding does not, or the reverse (the split's own error).  And a
nonzero |x| < 2^-137, a subnormal TF32 cannot hold, splits into two zeros:
such an x times Inf is NaN, not +-Inf.
"""

from gemmlib import layout as L
from gemmlib.backend import SIMULATOR, cuda, float32, uint16
from gemmlib.intrinsics import async_copy
from gemmlib.intrinsics import mma as I
from gemmlib.intrinsics.index import uidx
from gemmlib.intrinsics.pitch import packed, pitched
from gemmlib.kernels.mma_atom import ARG_DTYPES, INPUT_DTYPE
from gemmlib.kernels.mma_swizzle import PRECISIONS, fragment_accesses, warp_code
from gemmlib.spec import Constraint, KernelSpec, cdiv

#: the defaults per precision (BM, BN, BK, WM, WN, STAGES); the autotuner picks per GPU
DEFAULTS = {"fp16": (128, 128, 32, 64, 64, 4), "bf16": (128, 128, 32, 64, 64, 4),
            "tf32": (128, 128, 16, 64, 64, 4), "3xtf32": (128, 128, 16, 64, 32, 3)}


def _periodic(lay, step: int, rows: int) -> bool:
    """True when moving ``step`` rows down moves every swizzled offset by ``step`` rows."""
    cols = lay.shape[1]
    return all(lay(r + step, c) == lay(r, c) + step * cols
               for r in range(min(rows - step, 16)) for c in range(cols))


def _aligned(spec, M, N, K, dev):
    # a (K, M) A's rows are M long, a (K, N) B's N long, an (M, K) A's and (N, K) B's K long
    a = spec.operand_align
    return (K % a == 0 and (N % a == 0 or spec.b_operand == "NK")
            and (M % a == 0 or spec.a_operand != "KM"))


def build(precision: str = "fp16", BM: int | None = None, BN: int | None = None,
          BK: int | None = None, WM: int | None = None, WN: int | None = None,
          STAGES: int | None = None, GROUP_M: int = 8, min_blocks: int = 1,
          PROMOTE: bool | None = None, SPLIT_K: bool = False,
          B_LAYOUT: str = "KN", A_LAYOUT: str = "MK", PITCHED: bool = False) -> KernelSpec:
    """A pipeline spec (None: the precision's default from DEFAULTS).

    ``SPLIT_K`` compiles the split-K form used by :mod:`gemmlib.kernels.mma_split_k`:
    block z of a grid with Z blocks along z sums only its slice of the k-tiles (the rule
    of ``split_k.k_slices``) and writes its partial tile to rows ``z*M .. z*M + M-1`` of
    C, a workspace of Z*M rows.  A compile-time switch: the plain rung's code is unchanged.

    ``B_LAYOUT="NK"``: B is given as (N, K) row-major (an ``nn.Linear`` weight) and
    C = A @ B.T.  B's rows are then K-major like A's: its k-tile is copied as A's is (16
    bytes along K, into a BN x BK tile swizzled like A's) and its fragments come from
    ``ldmatrix`` without ``.trans`` (``mma_swizzle.fragment_loaders``).  Only K need be a
    multiple of the 16-byte piece: N is free.

    ``A_LAYOUT="KM"``: A is given as its (K, M) row-major memory (a column-major A, such as
    a weight gradient's ``x.t()``).  Its k-tile is then copied as a row-major B's is (16
    bytes along M, into a BK x BM tile swizzled like B's) and its fragments come from
    ``ldmatrix.trans`` (16-bit) or four scalar loads (TF32): no copy of A is made.  M must
    be a multiple of the 16-byte piece too.

    ``PITCHED``: the build for operands that are slices of wider matrices (name suffix
    ``_ld``; see the module docstring); compile-time, the packed build's code unchanged.
    """
    if B_LAYOUT not in ("KN", "NK"):
        raise ValueError(f"B_LAYOUT must be 'KN' or 'NK', got {B_LAYOUT!r}")
    NK_ = B_LAYOUT == "NK"
    if A_LAYOUT not in ("MK", "KM"):
        raise ValueError(f"A_LAYOUT must be 'MK' or 'KM', got {A_LAYOUT!r}")
    KM_ = A_LAYOUT == "KM"
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    d = DEFAULTS[precision]
    BM, BN, BK, WM, WN, STAGES = (v if v is not None else dv for v, dv in
                                  zip((BM, BN, BK, WM, WN, STAGES), d))
    promote_default = precision == "3xtf32"   # fp32 accuracy is 3xtf32's whole point
    PROMOTE = promote_default if PROMOTE is None else bool(PROMOTE)
    sixteen = precision in ("fp16", "bf16")
    eb = 2 if sixteen else 4
    EPC = 16 // eb                       # elements per 16-byte chunk
    KA = 16 if sixteen else 8
    if BM % WM or BN % WN or WM % 16 or WN % (16 if sixteen else 8) or BK % KA:
        raise ValueError(f"tiles must nest: BM % WM, BN % WN, WM % 16, WN % "
                         f"{16 if sixteen else 8} and BK % {KA} must be 0 "
                         f"(BM={BM}, BN={BN}, BK={BK}, WM={WM}, WN={WN})")
    if not 2 <= STAGES <= 8:
        raise ValueError(f"STAGES must be 2..8, got {STAGES}")
    MI, NI = WM // 16, WN // 8
    NT = (BM // WM) * (BN // WN) * 32
    lay_a, lay_b, sw_a, sw_b, warp_step, store_tile = warp_code(precision, BM, BN, BK, WM, WN,
                                                                PROMOTE, b_nk=NK_, a_km=KM_)
    elem = uint16 if sixteen else float32
    ACC = MI * NI * 4
    SA, SB = BM * BK, BK * BN            # elements per stage
    CA, CB = BM * BK // EPC, BK * BN // EPC   # 16-byte chunks per stage
    cp16, commit = async_copy.cp_async16, async_copy.cp_async_commit
    wait_tile = async_copy.cp_async_wait_group(STAGES - 2)
    jit_opts = {} if SIMULATOR else {"launch_bounds": (NT, min_blocks)}
    SPLIT_K_ = bool(SPLIT_K)
    PITCHED_ = bool(PITCHED)
    view = pitched if PITCHED_ else packed   # (gemmlib.intrinsics.pitch)

    # Each thread copies the same column of chunks in every k-tile, on rows ROWS_A (ROWS_B)
    # apart; those steps are multiples of the swizzle's period, so a thread's destinations
    # are its first one plus constants -- computed once, not per k-tile.
    CPR_A, CPR_B = (BM if KM_ else BK) // EPC, (BK if NK_ else BN) // EPC   # chunks per row
    ROWS_A, ROWS_B = NT // CPR_A, NT // CPR_B     # rows between one thread's chunks
    IT_A, IT_B = CA // NT, CB // NT               # chunks per thread per k-tile
    if NT % CPR_A or NT % CPR_B or CA % NT or CB % NT or not (
            _periodic(lay_a, ROWS_A, BK if KM_ else BM)
            and _periodic(lay_b, ROWS_B, BN if NK_ else BK)):
        raise ValueError(f"the {NT} threads must cover whole rows of chunks and repeat the "
                         f"swizzle: BM={BM}, BN={BN}, BK={BK} with warps of {WM}x{WN} do not")

    @cuda.jit(device=True)
    def issue_tile(sA, sB, stage, A, B, k0, a_row, a_col, a_dst, b_row, b_col, b_dst, M, N, K):
        """Start the 16-byte copies of the k-tile at ``k0`` into ``stage`` (zeros outside)."""
        if KM_:   # A is (K, M): rows k0 + a_row.. of k, m from a_col -- as a (K, N) B
            m_ok = a_col < M
            for i in range(IT_A):
                r = k0 + a_row + i * ROWS_A
                ok = m_ok and r < K
                cp16(sA, uidx(stage * SA + a_dst + i * ROWS_A * BM), A, uidx(r if ok else 0),
                     uidx(a_col if ok else 0), 16 if ok else 0)
        else:
            k_ok = k0 + a_col < K
            for i in range(IT_A):
                r = a_row + i * ROWS_A
                ok = k_ok and r < M
                cp16(sA, uidx(stage * SA + a_dst + i * ROWS_A * BK), A, uidx(r if ok else 0),
                     uidx(k0 + a_col if ok else 0), 16 if ok else 0)
        if NK_:   # B is (N, K): rows b_row.. of n, k from b_col -- copied as A is
            kb_ok = k0 + b_col < K
            for i in range(IT_B):
                r = b_row + i * ROWS_B
                ok = kb_ok and r < N
                cp16(sB, uidx(stage * SB + b_dst + i * ROWS_B * BK), B, uidx(r if ok else 0),
                     uidx(k0 + b_col if ok else 0), 16 if ok else 0)
        else:
            n_ok = b_col < N
            for i in range(IT_B):
                r = k0 + b_row + i * ROWS_B
                ok = n_ok and r < K
                cp16(sB, uidx(stage * SB + b_dst + i * ROWS_B * BN), B, uidx(r if ok else 0),
                     uidx(b_col if ok else 0), 16 if ok else 0)

    @cuda.jit(**jit_opts)
    def mma_pipeline_kernel(A, B, C):
        sA = cuda.shared.array(0, elem)          # dynamic: STAGES * (SA + SB) elements
        sB = sA[STAGES * SA:]
        acc = cuda.local.array(ACC, float32)
        tid = cuda.threadIdx.x
        lane, warp = tid % 32, tid // 32
        wr = (warp // (BN // WN)) * WM
        wc = (warp % (BN // WN)) * WN
        if KM_:
            K, M = A.shape
        else:
            M, K = A.shape
        N = B.shape[0] if NK_ else B.shape[1]
        Ap, Bp = view(A), view(B)   # PITCHED: slices of wider matrices, read by their strides
        # grouped order: GROUP_M block-rows share the B tiles they read from L2
        tiles_m, tiles_n = (M + BM - 1) // BM, (N + BN - 1) // BN
        pid = cuda.blockIdx.x
        group = pid // (GROUP_M * tiles_n)
        first_m = group * GROUP_M
        rows = min(tiles_m - first_m, GROUP_M)
        bm = first_m + (pid % (GROUP_M * tiles_n)) % rows
        bn = (pid % (GROUP_M * tiles_n)) // rows
        m0, n0 = bm * BM, bn * BN
        # this thread's chunks: first row, column and swizzled destination of each operand
        if KM_:   # (k, m) of A's chunks, as a (K, N) B's (k, n)
            a_col = m0 + (tid % CPR_A) * EPC
            a_row = tid // CPR_A
            a_dst = sw_a(a_row, (tid % CPR_A) * EPC)
        else:
            a_col = (tid % CPR_A) * EPC
            a_row = m0 + tid // CPR_A
            a_dst = sw_a(tid // CPR_A, a_col)
        if NK_:   # (n, k) of B's chunks, as A's (m, k)
            b_col = (tid % CPR_B) * EPC
            b_row = n0 + tid // CPR_B
            b_dst = sw_b(tid // CPR_B, b_col)
        else:
            b_col = n0 + (tid % CPR_B) * EPC
            b_row = tid // CPR_B
            b_dst = sw_b(b_row, (tid % CPR_B) * EPC)
        for e in range(ACC):
            acc[e] = float32(0.0)
        num_k = (K + BK - 1) // BK
        if SPLIT_K_:   # a compile-time constant: the plain rung has no such branch
            # Block z sums k-tiles z*per .. (as split_k.k_slices): its copies start that
            # far along K (moving the thread's first k, not k0, keeps no new register live
            # through the loop) and num_k counts its own tiles (0: the slice writes zeros).
            per = (num_k + cuda.gridDim.z - 1) // cuda.gridDim.z
            k_first = cuda.blockIdx.z * per
            num_k = max(min(num_k - k_first, per), 0)
            if KM_:
                a_row += k_first * BK
            else:
                a_col += k_first * BK
            if NK_:
                b_col += k_first * BK
            else:
                b_row += k_first * BK
        for s in range(STAGES - 1):              # prologue: tiles 0 .. STAGES-2 in flight
            if s < num_k:
                issue_tile(sA, sB, s, Ap, Bp, s * BK, a_row, a_col, a_dst, b_row, b_col, b_dst,
                           M, N, K)
            commit()                             # (empty groups keep the count uniform)
        rd, wt = 0, STAGES - 1                   # stage read now, stage filled next
        for kt in range(num_k):
            wait_tile()                          # tile kt has landed (for this thread) ...
            cuda.syncthreads()                   # ... and for everyone; tile kt-1 is free
            if kt + STAGES - 1 < num_k:
                issue_tile(sA, sB, wt, Ap, Bp, (kt + STAGES - 1) * BK, a_row, a_col, a_dst,
                           b_row, b_col, b_dst, M, N, K)
            commit()
            warp_step(sA, sB, rd * SA, rd * SB, acc, lane, wr, wc)
            rd = rd + 1 if rd + 1 < STAGES else 0
            wt = wt + 1 if wt + 1 < STAGES else 0
        async_copy.cp_async_wait_all()
        if SPLIT_K_:   # slice z's partial tile -> rows z*M .. of the workspace (guard m < M)
            crow = cuda.blockIdx.z * M
            store_tile(C, acc, lane, crow + m0 + wr, n0 + wc, crow + M, N)
        else:
            store_tile(C, acc, lane, m0 + wr, n0 + wc, M, N)

    def grid(M, N, K):
        return (cdiv(M, BM) * cdiv(N, BN), 1, 1)

    default = ((BM, BN, BK, WM, WN, STAGES, GROUP_M, min_blocks) == d + (8, 1)
               and PROMOTE == promote_default)
    name = "mma_pipeline" if precision == "fp16" else f"mma_pipeline_{precision}"
    if not default:
        name += f"_{BM}x{BN}x{BK}_w{WM}x{WN}_s{STAGES}" + (f"_g{GROUP_M}" if GROUP_M != 8
                                                          else "") + (
            f"_mb{min_blocks}" if min_blocks != 1 else "") + (
            ("_promote" if PROMOTE else "_nopromote") if PROMOTE != promote_default else "")
    params = dict(precision=precision, BM=BM, BN=BN, BK=BK, WM=WM, WN=WN, STAGES=STAGES,
                  GROUP_M=GROUP_M, min_blocks=min_blocks, PROMOTE=PROMOTE)
    if PITCHED_:
        params["PITCHED"] = True
        name += "_ld"
    if KM_:
        params["A_LAYOUT"] = "KM"
        name += "_km"
    if NK_:
        params["B_LAYOUT"] = "NK"
        name += "_nk"
    if SPLIT_K_:   # (in params, so that no cache takes it for the plain kernel)
        name += "_splitk"
        params["SPLIT_K"] = True
    return KernelSpec(
        name=name,
        chapter="16-tensor-core-pipeline",
        idea="warp tiles of mma atoms fed by a ring of STAGES swizzled shared buffers that "
             "cp.async fills STAGES-1 k-tiles ahead",
        kernel=mma_pipeline_kernel,
        block=(NT, 1, 1),
        tile=(BM, BN),
        grid=grid,
        params=params,
        shared_bytes=STAGES * (SA + SB) * eb,
        dynamic_shared=True,
        min_cc=I.MIN_CC,
        dtype=INPUT_DTYPE[precision],
        arg_dtypes=ARG_DTYPES[precision],
        precision=precision,
        b_operand=B_LAYOUT,
        a_operand=A_LAYOUT,
        operand_align=EPC,
        constraints=(Constraint(
            "16-byte rows", _aligned,
            "cp.async moves 16 bytes: K" + ("" if NK_ else ", N") + (", M" if KM_ else "")
            + f" must be multiples of {EPC} (gemmlib.matmul pads other shapes)"),),
        # (TF32 with both tiles k-major, a (K, M) A and a (K, N) B, loads them all by scalars)
        ptx_must=(r"mma\.sync\.aligned\.m16n8k", r"cp\.async\.cg\.shared\.global")
        + (() if KM_ and not NK_ and not sixteen else (r"ldmatrix\.sync\.aligned",))
        + ((r"%nctaid\.z",) if SPLIT_K_ else ()),
        # the split's branch reads the grid's z; the plain rung must not contain it at all
        ptx_must_not=(r"\bld\.local", r"\bst\.local") + (() if SPLIT_K_ else (r"%ctaid\.z",)),
        index=dict(sw_a=L.jit(lay_a.source("sw_a")), sw_b=L.jit(lay_b.source("sw_b"))),
        module=__name__,
        reads_pitched=PITCHED_,
    )


def accesses(spec):
    """The fragment loads (``mma_swizzle``'s) for gemmlib.banks."""
    return fragment_accesses(spec, swizzled=True)


SPEC = build()
