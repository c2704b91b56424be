"""The decode rung: a skinny product C (M x N) = A (M x K) @ B (K x N), M <= 16, reads B once.

A transformer generating text multiplies a handful of token rows A (M = 1..16)
by each weight matrix B (K x N: 4096 x 6144, 8192 x 59136, ...).  The product
does 2 M K N flops on 2 K N bytes of fp16 weights: M flops per byte, where a
GPU can do a few hundred.  Nothing about it is compute: its time is the time
to read B from DRAM once, and the kernel's job is to keep the memory system
busy.  A tiled GEMM gets this wrong twice: its 128-row tiles waste 127/128 of
their arithmetic on rows that do not exist, and it makes only N / BN blocks --
24 blocks of 128 x 256 at N = 6144, for a GPU of 132 SMs.

This rung turns the problem around:

* **A block owns a slab of B's columns**, BN = CT x VEC of them (VEC = the
  values in 16 bytes: 8 fp16/bf16 or 4 fp32).  Its threads form KT groups of
  CT lanes; lane ``c`` of group ``kr`` reads columns ``c*VEC .. c*VEC+VEC-1``
  of rows ``kr, kr + KT, kr + 2 KT, ...`` of the slab, 16 bytes per load
  (``ld.global.v4``): a group's CT lanes read CT x 16 contiguous bytes of a
  row, fully coalesced.  Each thread issues U such loads before it uses any
  (U x 16 bytes in flight per thread: that is what hides DRAM's latency).
* **All M rows of A at once.**  The block stages a chunk of KC columns of its
  MT rows of A in shared memory, converted to fp32 once and stored k-major
  (the MT values of one k are contiguous: one ``ld.shared.v4`` broadcast gives
  four rows).  For every 16 bytes of B a thread then does MT x VEC fp32 FMAs
  into MT x VEC accumulators in registers.  B is read once for all rows.
  M > MT runs ceil(M / MT) row blocks along the grid's x, so the blocks that
  share a slab are launched together and B's second read mostly comes from L2
  (well past MMAX = 16 rows the tiled rungs are the right tool).
* **16-bit values become fp32 in registers**: bf16 by a shift (its bits are
  the top half of a float32), fp16 by ``cvt.f32.f16``
  (:mod:`gemmlib.intrinsics.convert`).  Products and sums are fp32 FMAs, as in
  a plain fp32 dot product: the error is an SGEMM's, NaN and Inf propagate
  exactly (no padding value ever enters a stored sum).
* **K is split** across the KT groups of a block (their partial sums are added
  through shared memory in group order, and the block writes its MT x BN
  result row by row, coalesced), and across blocks when the slabs alone are
  too few to fill the GPU: ``SPLITS`` slices along the grid's z write partial
  products into a (S*M) x N workspace, and the last block of a slab to finish
  adds them, in slice order, inside the same launch (a *ticket*: each block
  increments its slab's counter after a ``threadfence``; the one that draws
  S - 1 knows every other slice is written, as in ``wgmma_split_k``).  Every
  order is fixed, so results are bit-identical run to run.  One launch where
  a reduction kernel would be a second: at decode sizes a call's time is
  mostly launches.
* **C in float32, or in the inputs' 16-bit type** (``OUT``): each sum is
  rounded once to nearest even as it is stored.

Any shape works: a column chunk past N is predicated off, rows past M are
zero in shared memory and never stored, K past the slice is never read.  B is
read with 16-byte loads only when each row starts on a 16-byte boundary (N a
multiple of VEC and an aligned base pointer, decided once per launch, a
uniform branch); otherwise with guarded scalar loads -- never through a
padded copy, which for decode would cost as much as the product.

The ``PITCHED`` build (name suffix ``_ld``) reads A and B where they lie when they are
slices of wider matrices (rows further apart than a row, ``x[:, :k]``): through
``pitched`` views, which step by the row stride of the array argument
(:mod:`gemmlib.intrinsics.pitch`); B's 16-byte loads then also need that stride to be a
multiple of 16 bytes (``aligned16`` of the view checks it).  A column-major A (``x.t()``,
or a slice's transpose) is read as its (K, M) memory by the ``A_LAYOUT="KM"`` build
(name suffix ``_km``), which changes only how A is staged.

Parameters: ``precision`` ("fp16", "bf16" or "fp32"), ``MT`` (rows of A per
block, compiled in: the accumulators are MT x VEC registers), ``CT`` (lanes
per row of the slab), ``NT`` (threads per block), ``U`` (loads in flight per
thread), ``NC`` (1: B through the read-only path with no L1 allocation,
``ld.global.nc.L1::no_allocate``), ``PIPE`` (1: two register buffers of U loads, the
next round's loads issued before this round's FMAs, and a chunk's first round before A is
staged; 2 U x 16 bytes of registers a thread), ``SPLITS`` (slices of K across blocks; 0:
:func:`splits_for` per shape; a launch parameter only), ``OUT`` ("fp32", or the 16-bit
inputs' own type: C holds its bits).

**B as torch holds a weight** (``B_LAYOUT="NK"``, name suffix ``_nk``): ``F.linear(x, W)``
is ``x @ W.T`` with W (N, K) row-major.  Column n of C is then the dot product of A's rows
with W's row n, both contiguous along K, so the slab turns around: a block owns BN =
(NT / CT) x U rows of W; each group of CT lanes owns U of them and reads, for each, CT x 16
contiguous bytes along K per round (lane ``c`` the piece at ``k = c*VEC + r*CT*VEC``), U
16-byte loads in flight a thread as before, and one ``ld.shared.v4`` of A (staged
m-major, each piece's two float4 halves in separate runs: conflict-free) serves all U
rows.  The CT lanes' partial sums of each result are added at the end by a fixed butterfly
of warp shuffles (``shfl.sync.bfly``), so K is never split across groups; across blocks
(``SPLITS``) it is split as in the KN form, in slices that are multiples of CT x VEC.  B is
read in 16-byte pieces when K is a multiple of VEC and B is 16-byte aligned, else by
guarded scalar loads.  Parameters keep their names, three their meaning with a twist:
``CT`` is the lanes along K per row of W (a power of two <= 32), ``U`` the rows of W per
thread (its loads in flight, and the reuse of each load of A), and the block's BN follows
from them; ``NT`` must be a multiple of 32 (or below 32) and BN a multiple of 4.
"""

from __future__ import annotations

import dataclasses
from functools import lru_cache

from gemmlib import backend
from gemmlib.layout import jit as jit_source
from gemmlib.backend import SIMULATOR, cuda, float32, int32, uint32
from gemmlib.intrinsics import convert
from gemmlib.intrinsics.index import uidx
from gemmlib.intrinsics.mma import as_bits, as_float, shfl_xor_f32
from gemmlib.intrinsics.pitch import packed, pitched, read
from gemmlib.intrinsics.vector import SHARED_ALIGN, aligned16, load4, store4
from gemmlib.precision import INPUT_DTYPE
from gemmlib.spec import Constraint, KernelSpec, cdiv

PRECISIONS = ("fp16", "bf16", "fp32")
#: values per 16-byte load
VEC = {"fp16": 8, "bf16": 8, "fp32": 4}
#: the kernel's argument dtypes (A, B, C): 16-bit inputs travel as their bit patterns
ARG_DTYPES = {"fp16": ("uint16", "uint16", "float32"), "bf16": ("uint16", "uint16", "float32"),
              "fp32": ("float32", "float32", "float32")}
#: the arrays after C: the slices' partial products (float32) and the slabs' tickets
WORKSPACE_DTYPES = ("float32", "int32")

#: decode: up to this many rows of A go through B in one pass (the dispatch uses the rung
#: for M <= MMAX; larger M runs ceil(M / MT) passes and is better served by a tiled rung)
MMAX = 16
#: the row counts compiled (the dispatch picks the smallest MT >= M: no FMAs on absent rows)
MT_CHOICES = (1, 2, 4, 8, 16)
#: shared memory for the staged chunk of A (fp32): KC = A_SHARED_BYTES / (4 MT) columns
A_SHARED_BYTES = 32 * 1024

# The slice count (SPLITS = 0): see splits_for.
#: resident warps per SM the launch should reach (each has U x 512 bytes in flight)
TARGET_WARPS_PER_SM = 12
#: a slice of K is at least this many rows of B
MIN_SLICE_K = 256
MAX_SPLITS = 32
#: blocks an SM the compiler must leave room for (registers): PIPE with MT x VEC <= 32
MIN_BLOCKS = 2
#: the last block of a slab loads this many slices' partials before adding them
SB = 16
#: the workspace's traffic (S partial products written and read) stays below this share
#: of B's bytes
WORKSPACE_SHARE = 0.125

#: the default configuration (``kernel="skinny"``): fp16, all 16 decode rows in one pass
DEFAULTS = dict(precision="fp16", MT=16, CT=32, NT=256, U=4, NC=0, SPLITS=0, OUT="fp32",
                PIPE=0)


def rows_for(M: int) -> int:
    """The smallest compiled MT that holds M rows (MMAX for M > MMAX)."""
    return next((mt for mt in MT_CHOICES if mt >= M), MMAX)


def chunk_k(MT: int, KT: int, U: int) -> int:
    """KC: the columns of A staged at once, a multiple of KT * U (one round of loads)."""
    kg = KT * U
    return max(kg, (A_SHARED_BYTES // (4 * MT)) // kg * kg)


def slice_k(K: int, S: int, KG: int) -> int:
    """Rows of B per slice when K is cut into S slices (a multiple of KG)."""
    return cdiv(cdiv(max(K, 1), KG), max(S, 1)) * KG


def k_slices(K: int, S: int, KG: int) -> list[tuple[int, int]]:
    """(k0, k1) of every slice z (the kernel's own rule)."""
    per = slice_k(K, S, KG)
    return [(z * per, min(K, z * per + per)) for z in range(max(S, 1))]


def effective_splits(S: int, K: int, KG: int) -> int:
    """Slices that all hold rows of B (what the grid's z then is)."""
    return max(1, cdiv(max(K, 1), slice_k(K, S, KG)))


def splits_for(M: int, N: int, K: int, MT: int, BN: int, NT: int, KG: int, itemsize: int,
               dev=None) -> int:
    """How many slices of K for (M, N, K) (1 = none).

    A streaming kernel needs enough warps resident to keep enough bytes in
    flight: TARGET_WARPS_PER_SM on every SM.  When the column slabs (and row
    blocks) give fewer blocks, K is cut into as many slices as make up the
    difference -- each at least MIN_SLICE_K rows deep, at most MAX_SPLITS, and
    few enough that the workspace's traffic (S partial M x N products written
    and read back, fp32) stays under WORKSPACE_SHARE of B's own bytes.
    """
    dev = dev or backend.device_info()
    blocks = cdiv(M, MT) * cdiv(N, BN)
    if blocks == 0 or K < 2 * MIN_SLICE_K:
        return 1
    want = cdiv(dev.sm_count * TARGET_WARPS_PER_SM, max(NT // 32, 1))
    if blocks >= want:
        return 1
    s = min(MAX_SPLITS, cdiv(want, blocks), K // MIN_SLICE_K,
            int(WORKSPACE_SHARE * K * itemsize / (8 * max(M, 1))))
    return effective_splits(max(s, 1), K, KG)


def _slices_fit(spec, M, N, K, dev):
    return spec.grid(M, N, K)[2] <= dev.max_grid[2]


CONSTRAINTS = (
    Constraint("slices", _slices_fit, "gridDim.z (the number of K slices) is limited by the "
               "device"),
)


def workspace_for(grid):
    """``KernelSpec.workspace`` of a skinny spec with launch grid ``grid(M, N, K)``: the
    (S*M) x N partial products and one ticket counter per slab (placeholders when S = 1)."""
    def workspace(M, N, K):
        gx, gy, S = grid(M, N, K)
        if S == 1:
            return ((1, 4, "float32"), (1, 1, "int32"))
        return ((S * M, N, "float32"), (max(gx, 1), max(gy, 1), "int32"))

    return workspace


def build(precision: str = "fp16", MT: int = 16, CT: int = 32, NT: int = 256, U: int = 4,
          NC: int = 0, SPLITS: int = 0, OUT: str = "fp32", PIPE: int = 0,
          B_LAYOUT: str = "KN", A_LAYOUT: str = "MK", PITCHED: bool = False) -> KernelSpec:
    """A skinny spec.  ``SPLITS`` changes only the grid's z: every slice count shares
    the kernel compiled for the other parameters.  ``B_LAYOUT="NK"``: B is given as
    (N, K) row-major (an ``nn.Linear`` weight) and C = A @ B.T (see the module docstring).
    ``A_LAYOUT="KM"``: A is given as its (K, M) row-major memory (a column-major A).
    ``PITCHED``: the build for slices of wider matrices (name suffix ``_ld``)."""
    base = _code(precision, MT, CT, NT, U, int(bool(NC)), OUT, int(bool(PIPE)), B_LAYOUT,
                 A_LAYOUT, bool(PITCHED))
    if not SPLITS:
        return base
    p = base.params
    KG = _k_granule(precision, CT, NT, U, B_LAYOUT)

    def grid(M, N, K):
        gx, gy, _ = base.grid(M, N, K)
        return (gx, gy, effective_splits(SPLITS, K, KG))

    nk, km = B_LAYOUT == "NK", A_LAYOUT == "KM"
    name = (base.name.replace("_km", "").replace("_nk", "").replace("_o16", "")
            + f"_s{SPLITS}" + ("_o16" if OUT != "fp32" else "") + ("_nk" if nk else "")
            + ("_km" if km else ""))
    return dataclasses.replace(base, name=name, grid=grid, workspace=workspace_for(grid),
                               params=dict(p, SPLITS=SPLITS))


def _k_granule(precision: str, CT: int, NT: int, U: int, B_LAYOUT: str) -> int:
    """KG: the rows of B (values of K) one round of a block's loads covers, the unit K's
    slices are cut in -- KN: KT groups x U rows; NK: a group's CT lanes x VEC values."""
    return CT * VEC[precision] if B_LAYOUT == "NK" else (NT // CT) * U


@lru_cache(maxsize=None)
def _code(precision: str, MT: int, CT: int, NT: int, U: int, NC: int, OUT: str,
          PIPE: int, B_LAYOUT: str = "KN", A_LAYOUT: str = "MK",
          PITCHED: bool = False) -> KernelSpec:
    """The spec with SPLITS = 0 (slices per shape) of one compiled configuration."""
    if precision not in PRECISIONS:
        raise ValueError(f"the skinny rung computes {', '.join(PRECISIONS)}; got {precision!r} "
                         "(tf32 and 3xtf32 calls use its fp32 form: an fp32 product is within "
                         "their error bounds)")
    if OUT not in ("fp32", precision) or OUT not in PRECISIONS:
        raise ValueError(f"OUT must be 'fp32' or the inputs' own 16-bit type ({precision!r}); "
                         f"got {OUT!r}")
    if MT < 1 or CT < 1 or U < 1 or NT % CT or not CT <= NT <= 1024:
        raise ValueError(f"need MT, CT, U >= 1 and CT <= NT <= 1024 with CT | NT "
                         f"(MT={MT}, CT={CT}, NT={NT}, U={U})")
    if B_LAYOUT not in ("KN", "NK"):
        raise ValueError(f"B_LAYOUT must be 'KN' or 'NK', got {B_LAYOUT!r}")
    if A_LAYOUT not in ("MK", "KM"):
        raise ValueError(f"A_LAYOUT must be 'MK' or 'KM', got {A_LAYOUT!r}")
    NK = B_LAYOUT == "NK"
    KM = A_LAYOUT == "KM"   # A's memory is (K, M): only its staging reads it otherwise
    view = pitched if PITCHED else packed   # (gemmlib.intrinsics.pitch)
    if NK and (CT > 32 or CT & (CT - 1)):
        raise ValueError(f"B_LAYOUT='NK' adds a row's CT partial sums by warp shuffles: CT "
                         f"must be a power of two <= 32 (CT={CT})")
    V = VEC[precision]
    KT = NT // CT                 # groups of CT lanes: each walks its own rows of B
    BN = KT * U if NK else CT * V   # columns of C per block (NK: rows of B)
    if BN % 4:
        raise ValueError(f"B_LAYOUT='NK' stores C in float4s: (NT / CT) x U must be a multiple "
                         f"of 4 (NT={NT}, CT={CT}, U={U})")
    LOG_CT = CT.bit_length() - 1  # NK: shuffle steps that add a row's CT partial sums
    if NK and NT > 32 and NT % 32:
        raise ValueError(f"B_LAYOUT='NK' shuffles within whole warps: NT must be a multiple of "
                         f"32 (or below 32, one partial warp), got {NT}")
    MEMBERS = 0xFFFFFFFF if NT >= 32 else (1 << NT) - 1   # NK: the lanes of a shuffle
    BN4 = BN // 4
    KG = _k_granule(precision, CT, NT, U, B_LAYOUT)   # rows of B one round of loads covers
    KC = max(KG, (A_SHARED_BYTES // (4 * MT)) // KG * KG) if NK else chunk_k(MT, KT, U)
    NH = V // 4                   # NK: float4s of A per 16-byte piece of B (2 or 1)
    KCV = KC // V                 # NK: 16-byte pieces of B per row of a chunk
    ACC = MT * U if NK else MT * V
    RAW = 4 * U                   # words of B in flight per thread
    BFN = V * U                   # NK: a round's U pieces of B, as fp32
    MT4 = MT // 4                 # rows of A read as one ld.shared.v4
    SH = cdiv(max(KC * MT, MT * BN), 4)   # shared rows of 4 floats: A chunk, then the sums
    G = min(KT, SH * 4 // (MT * BN))      # groups whose partial sums fit in shared at once
    EPT = cdiv(MT * BN, NT)               # the block's sums each thread adds up
    SIXTEEN = precision != "fp32"
    FP16 = precision == "fp16"
    NC_ = bool(NC)

    def thread_cols(tid):
        """(kr, first column in the slab): thread tid's group and its 16-byte column chunk.
        NK: (first of the U rows of B the thread reads, its first k in a chunk)."""
        return ((tid // CT) * U, (tid % CT) * V) if NK else (tid // CT, (tid % CT) * V)

    def rows_of(tid, kc):
        """The rows (within a chunk of kc) thread tid reads from B, in its order.
        NK: the first k of each 16-byte piece it reads from each of its U rows."""
        if NK:
            return list(range((tid % CT) * V, kc, KG))
        return list(range(tid // CT, kc, KT))

    # The per-precision pieces, chosen here in Python: each kernel is compiled with one set.
    if FP16:
        def _to_f32(x):
            return convert.half_to_float(x)

        def _expand(raw, o, bf, b):
            for e in range(4):
                w = raw[o + e]
                bf[b + 2 * e] = convert.half_to_float(w)             # cvt.f32.f16
                bf[b + 2 * e + 1] = convert.half_to_float(w >> uint32(16))
    elif SIXTEEN:
        def _to_f32(x):
            return convert.bf16_to_float(x)

        def _expand(raw, o, bf, b):
            for e in range(4):
                w = raw[o + e]
                bf[b + 2 * e] = convert.bf16_to_float(w)             # bits << 16
                bf[b + 2 * e + 1] = convert.bf16_hi_to_float(w)      # bits & 0xFFFF0000
    else:
        def _to_f32(x):
            return x

        def _expand(raw, o, bf, b):
            for e in range(4):
                bf[b + e] = as_float(raw[o + e])                     # a reinterpretation

    if SIXTEEN:
        def _scalar_words(B, k, n, raw, o):
            """Two 16-bit values per word, each guarded by N (low half: the lower column)."""
            N = B.shape[1]
            for e in range(4):
                j = n + 2 * e
                lo = uint32(read(B, uidx(k), uidx(j))) if j < N else uint32(0)
                hi = uint32(read(B, uidx(k), uidx(j + 1))) if j + 1 < N else uint32(0)
                raw[o + e] = lo | (hi << uint32(16))
    else:
        def _scalar_words(B, k, n, raw, o):
            N = B.shape[1]
            for e in range(4):
                j = n + e
                raw[o + e] = as_bits(read(B, uidx(k), uidx(j))) if j < N else uint32(0)

    def _same(x):
        return x

    # what C holds: the float32 sum, or it rounded to nearest even (cvt.rn) as 16-bit bits
    to_out = (cuda.jit(device=True)(_same) if OUT == "fp32" else
              convert.float_to_half if OUT == "fp16" else convert.float_to_bf16)
    to_f32 = cuda.jit(device=True)(_to_f32)
    expand = cuda.jit(device=True)(_expand)
    scalar_words = cuda.jit(device=True)(_scalar_words)

    @cuda.jit(device=True)
    def fetch(B, k, n, ok, vec, raw, o):
        """Row k of B, columns n .. n+V-1, as four 32-bit words into raw[o:o+4] (zeros when
        not ok).  One 16-byte load when the rows are 16-byte aligned (vec), else scalar
        loads guarded by N."""
        if ok and vec:
            if NC_:   # read-only path, no L1 allocation: B is read exactly once
                w0, w1, w2, w3 = convert.load16_stream(B, k, n)
            else:
                w0, w1, w2, w3 = convert.load16(B, k, n)
            raw[o] = w0
            raw[o + 1] = w1
            raw[o + 2] = w2
            raw[o + 3] = w3
        elif ok:
            scalar_words(B, k, n, raw, o)
        else:
            for e in range(4):
                raw[o + e] = uint32(0)

    @cuda.jit(device=True)
    def fetch_round(B, k0, kk, kc, n, vec, raw):
        """One round: rows k0 + kk, kk + KT, ... (U of them) of the thread's columns."""
        for u in range(U):       # U independent 16-byte loads, issued before any is used
            ku = kk + u * KT
            fetch(B, k0 + ku, n, ku < kc, vec, raw, 4 * u)

    @cuda.jit(device=True)
    def fma_row(sh, kk, acc, bf):
        """acc[i, v] += A[i, k] * B[k, v] for the MT rows of A at chunk column kk."""
        base = kk * MT            # A's values for kk: flat floats base .. base+MT-1
        for q in range(MT4):
            a0, a1, a2, a3 = load4(sh, uidx(base // 4 + q), 0)
            for v in range(V):
                b = bf[v]
                acc[(4 * q) * V + v] += a0 * b
                acc[(4 * q + 1) * V + v] += a1 * b
                acc[(4 * q + 2) * V + v] += a2 * b
                acc[(4 * q + 3) * V + v] += a3 * b
        for i in range(MT4 * 4, MT):
            f = base + i
            a = sh[uidx(f // 4), uidx(f % 4)]
            for v in range(V):
                acc[i * V + v] += a * bf[v]

    @cuda.jit(device=True)
    def use_round(sh, kk, kc, raw, acc, bf):
        """The FMAs of the round fetched for rows kk, kk + KT, ... (those below kc)."""
        for u in range(U):
            ku = kk + u * KT
            if ku < kc:
                expand(raw, 4 * u, bf, 0)
                fma_row(sh, ku, acc, bf)

    # The block's result, out of shared memory: into C, or into its slice of the workspace.
    @cuda.jit(device=True)
    def store_rows(X, sh, tid, row0, m0, n0, M, N):
        """The block's MT x BN result (in ``sh``) into float32 X from row ``row0``, row by
        row (coalesced, 16 bytes a thread where X's rows are 16-byte aligned)."""
        x_vec = N % 4 == 0 and aligned16(X)
        for t in range(tid, MT * BN4, NT):
            i = t // BN4
            j = n0 + (t - i * BN4) * 4
            if m0 + i < M and j < N:
                s0, s1, s2, s3 = load4(sh, uidx(t), 0)
                if x_vec:
                    store4(X, uidx(row0 + i), uidx(j), s0, s1, s2, s3)
                else:
                    X[uidx(row0 + i), uidx(j)] = s0
                    if j + 1 < N:
                        X[uidx(row0 + i), uidx(j + 1)] = s1
                    if j + 2 < N:
                        X[uidx(row0 + i), uidx(j + 2)] = s2
                    if j + 3 < N:
                        X[uidx(row0 + i), uidx(j + 3)] = s3

    @cuda.jit(device=True)
    def store_rows16(X, sh, tid, row0, m0, n0, M, N):
        """The block's result into a 16-bit C (its bits), each value rounded once."""
        for t in range(tid, MT * BN, NT):
            i = t // BN
            j = n0 + t - i * BN
            if m0 + i < M and j < N:
                X[uidx(row0 + i), uidx(j)] = to_out(sh[uidx(t // 4), uidx(t % 4)])

    store_c = store_rows if OUT == "fp32" else store_rows16

    @cuda.jit(device=True)
    def finish(C, W, L, sh, last, ws, tid, m0, z, M, N):
        """The block's MT x BN result (in ``sh``) into C -- or, when K is split, into its
        slice of the workspace W, after which the last block of the slab to finish adds
        the slices."""
        n0 = cuda.blockIdx.y * BN
        S = cuda.gridDim.z
        if S == 1:
            store_c(C, sh, tid, m0, m0, n0, M, N)
            return
        store_rows(W, sh, tid, z * M + m0, m0, n0, M, N)
        cuda.threadfence()                   # the partials are visible before the ticket
        cuda.syncthreads()
        if tid == 0:
            last[0] = cuda.atomic.add(L, (cuda.blockIdx.x, cuda.blockIdx.y), 1) == S - 1
        cuda.syncthreads()
        if last[0] == 0:
            return
        cuda.threadfence()
        # W[i] + W[M + i] + ... + W[(S-1)M + i], always in slice order (whichever block
        # was last), so the bits never depend on timing; one element a thread, coalesced.
        for t in range(tid, MT * BN, NT):
            i = t // BN
            j = n0 + t - i * BN
            if m0 + i < M and j < N:
                r = m0 + i
                # SB slices' loads are issued before their adds: one wait on L2 per SB
                # slices, not one per slice (the additions keep their order)
                s = float32(0.0)
                z0 = 0
                while z0 < S:
                    for q in range(SB):
                        if z0 + q < S:
                            ws[q] = W[uidx(r + (z0 + q) * M), uidx(j)]
                    for q in range(SB):
                        if z0 + q < S:
                            s = ws[q] if z0 + q == 0 else s + ws[q]
                    z0 += SB
                C[uidx(r), uidx(j)] = to_out(s)
        if tid == 0:
            L[cuda.blockIdx.x, cuda.blockIdx.y] = 0   # ready for the next launch

    def skinny_kernel(A, B, C, W, L):
        sh = cuda.shared.array((SH, 4), float32, alignment=SHARED_ALIGN)
        last = cuda.shared.array(1, int32)
        acc = cuda.local.array(ACC, float32)
        raw = cuda.local.array(RAW, uint32)
        raw2 = cuda.local.array(RAW if PIPE else 1, uint32)
        tot = cuda.local.array(EPT, float32)
        ws = cuda.local.array(SB, float32)
        bf = cuda.local.array(V, float32)
        if KM:
            K, M = A.shape
        else:
            M, K = A.shape
        N = B.shape[1]
        tid = cuda.threadIdx.x
        kr = tid // CT
        n = cuda.blockIdx.y * BN + (tid % CT) * V
        m0 = cuda.blockIdx.x * MT
        z = cuda.blockIdx.z
        per = ((K + KG - 1) // KG + cuda.gridDim.z - 1) // cuda.gridDim.z * KG
        kb = z * per
        ke = min(K, kb + per)
        Ap, Bp = view(A), view(B)   # PITCHED: slices of wider matrices, read by their strides
        # Uniform decisions, once per launch: may B's rows be read in 16-byte pieces?
        b_vec = N % V == 0 and aligned16(Bp)   # (a pitched view: its row stride too)
        active = n < N
        for e in range(ACC):
            acc[e] = float32(0.0)

        for k0 in range(kb, ke, KC):
            kc = min(KC, ke - k0)
            if PIPE and active:   # the chunk's first round of B is in flight while A stages
                fetch_round(Bp, k0, kr, kc, n, b_vec, raw)
            # Stage A[m0:m0+MT, k0:k0+kc] as fp32, k-major (zeros for rows past M).
            for t in range(tid, MT * kc, NT):
                kk = t // MT
                i = t - kk * MT
                v = float32(0.0)
                if m0 + i < M:
                    if KM:   # A's (K, M) memory: consecutive threads along its rows
                        v = to_f32(read(Ap, uidx(k0 + kk), uidx(m0 + i)))
                    else:
                        v = to_f32(read(Ap, uidx(m0 + i), uidx(k0 + kk)))
                sh[uidx(t // 4), uidx(t % 4)] = v
            cuda.syncthreads()
            if active and PIPE:
                # Two register buffers: the next round's U loads are issued before this
                # round's FMAs, so B's loads never stop while a thread computes.  (The loop
                # is unrolled by two so each buffer keeps constant indices: registers.)
                kk = kr
                while kk < kc:
                    fetch_round(Bp, k0, kk + KG, kc, n, b_vec, raw2)
                    use_round(sh, kk, kc, raw, acc, bf)
                    kk += KG
                    if kk >= kc:
                        break
                    fetch_round(Bp, k0, kk + KG, kc, n, b_vec, raw)
                    use_round(sh, kk, kc, raw2, acc, bf)
                    kk += KG
            elif active:
                kk = kr
                while kk < kc:
                    fetch_round(Bp, k0, kk, kc, n, b_vec, raw)   # U 16-byte loads in flight
                    use_round(sh, kk, kc, raw, acc, bf)
                    kk += KG
            cuda.syncthreads()

        # The KT groups' partial sums, added in group order (((g0 + g1) + g2) + ...): G
        # groups at a time park theirs in shared memory (every group at once when they fit,
        # as at MT <= 4), then each thread adds, for the EPT sums it owns, the parked groups
        # in order -- one barrier pair per G groups, not one barrier per group ...
        c0 = (tid % CT) * V
        for g0 in range(0, KT, G):
            if kr >= g0 and kr < g0 + G:
                slot = (kr - g0) * (MT * BN)
                for i in range(MT):
                    for q in range(V // 4):
                        f = (slot + i * BN + c0 + 4 * q) // 4
                        store4(sh, uidx(f), 0, acc[i * V + 4 * q], acc[i * V + 4 * q + 1],
                               acc[i * V + 4 * q + 2], acc[i * V + 4 * q + 3])
            cuda.syncthreads()
            for r in range(min(G, KT - g0)):
                for e in range(EPT):   # innermost and constant: tot stays in registers
                    t = tid + e * NT
                    if t < MT * BN:
                        f = r * (MT * BN) + t
                        x = sh[uidx(f // 4), uidx(f % 4)]
                        tot[e] = x if g0 + r == 0 else tot[e] + x
            cuda.syncthreads()
        # ... and puts them back where the stores read the block's MT x BN result
        for e in range(EPT):
            t = tid + e * NT
            if t < MT * BN:
                sh[uidx(t // 4), uidx(t % 4)] = tot[e]
        cuda.syncthreads()
        # ... which the block writes to C -- or, when K is split, to its slice of the
        # workspace W, after which the last block of the slab to finish adds the slices.
        finish(C, W, L, sh, last, ws, tid, m0, z, M, N)


    # ---- B_LAYOUT="NK": B is (N, K) row-major, C = A @ B.T --------------------------
    # Column n of C is the dot product of A's rows with row n of B, both contiguous along
    # K.  Group g of the block (CT lanes) owns rows n0 + g*U .. n0 + g*U + U-1 of B; lane
    # c of the group reads, of each of those rows, the 16-byte piece at k = c*VEC, then
    # c*VEC + CT*VEC, ... (the group's CT lanes read CT x 16 contiguous bytes of a row:
    # coalesced), so its U loads are in flight together.  A's chunk is staged in shared
    # memory m-major, the two float4 halves of each 16-byte piece of B (VEC = 8) in
    # separate runs (row (m*NH + h)*KCV + j holds A[m, j*VEC + 4h .. +3]), so that the CT
    # lanes' ld.shared.v4 of one half are consecutive: conflict-free.  One such load of A
    # serves all U rows of B.  At the end the CT lanes' partial sums of each (m, row) are
    # added by warp shuffles (a fixed butterfly: bit-identical run to run).
    if SIXTEEN:
        def _scalar_words_nk(B, n, k, lim, raw, o):
            """Two 16-bit values per word along row n, each guarded by lim (<= K)."""
            for e in range(4):
                j = k + 2 * e
                lo = uint32(read(B, uidx(n), uidx(j))) if j < lim else uint32(0)
                hi = uint32(read(B, uidx(n), uidx(j + 1))) if j + 1 < lim else uint32(0)
                raw[o + e] = lo | (hi << uint32(16))
    else:
        def _scalar_words_nk(B, n, k, lim, raw, o):
            for e in range(4):
                j = k + e
                raw[o + e] = as_bits(read(B, uidx(n), uidx(j))) if j < lim else uint32(0)

    scalar_words_nk = cuda.jit(device=True)(_scalar_words_nk)

    @cuda.jit(device=True)
    def fetch_nk(B, n, k, lim, ok, vec, raw, o):
        """Row n of B, values k .. k+V-1 (those below lim), as four 32-bit words into
        raw[o:o+4] (zeros when not ok or past lim).  One 16-byte load when K is a multiple
        of V and B 16-byte aligned (vec): then k + V <= lim whenever k < lim."""
        if ok and k < lim and vec:
            if NC_:
                w0, w1, w2, w3 = convert.load16_stream(B, n, k)
            else:
                w0, w1, w2, w3 = convert.load16(B, n, k)
            raw[o] = w0
            raw[o + 1] = w1
            raw[o + 2] = w2
            raw[o + 3] = w3
        elif ok and k < lim:
            scalar_words_nk(B, n, k, lim, raw, o)
        else:
            for e in range(4):
                raw[o + e] = uint32(0)

    @cuda.jit(device=True)
    def fetch_round_nk(B, nb, N, k, lim, vec, raw):
        """One round: the 16-byte pieces at k of the thread's U rows nb .. nb+U-1."""
        for u in range(U):       # U independent 16-byte loads, issued before any is used
            fetch_nk(B, nb + u, k, lim, nb + u < N, vec, raw, 4 * u)

    # The round's FMAs and the final sums are written out as straight-line code (every
    # accumulator index a constant, so acc stays in registers): at MT = 16, U = 4 the round
    # alone is 512 FMAs, past what the compiler unrolls by itself.
    def use_round_nk_source():
        """acc[i, u] += A[i, piece j] . B[row u, piece j] for MT rows of A, U rows of B:
        each ld.shared.v4 of A serves all U rows."""
        out = ["def use_round_nk(sh, j, raw, acc, bf):"]
        out += [f"    expand(raw, {4 * u}, bf, {V * u})" for u in range(U)]
        for i in range(MT):
            for h in range(NH):
                out.append(f"    a0, a1, a2, a3 = load4(sh, uidx(j + {(i * NH + h) * KCV}), 0)")
                for u in range(U):
                    b, e = V * u + 4 * h, i * U + u
                    out.append(f"    acc[{e}] = (((acc[{e}] + a0 * bf[{b}]) + a1 * bf[{b + 1}])"
                               f" + a2 * bf[{b + 2}]) + a3 * bf[{b + 3}]")
        return "\n".join(out) + "\n"

    def sum_lanes_nk_source():
        """The group's CT lanes add their partial sums of each of the MT x U results by a
        butterfly of shuffles (every lane ends with the totals, added in the same order);
        lane e % CT then writes result e where the stores read the block's MT x BN result."""
        out = ["def sum_lanes_nk(sh, acc, g, c):"]
        for e in range(ACC):
            for r in range(LOG_CT):
                out.append(f"    acc[{e}] = acc[{e}] + shfl(acc[{e}], {CT >> (r + 1)}, {MEMBERS})")
        for e in range(ACC):
            i, u = divmod(e, U)
            out.append(f"    if c == {e % CT}:")
            out.append(f"        f = {i * BN + u} + g * {U}")
            out.append(f"        sh[uidx(f // 4), uidx(f % 4)] = acc[{e}]")
        return "\n".join(out) + "\n"

    use_round_nk = jit_source(use_round_nk_source(), device=True,
                              env=dict(expand=expand, load4=load4, uidx=uidx))
    sum_lanes_nk = jit_source(sum_lanes_nk_source(), device=True,
                              env=dict(shfl=shfl_xor_f32, uidx=uidx))

    def skinny_nk_kernel(A, B, C, W, L):
        sh = cuda.shared.array((SH, 4), float32, alignment=SHARED_ALIGN)
        last = cuda.shared.array(1, int32)
        acc = cuda.local.array(ACC, float32)
        raw = cuda.local.array(RAW, uint32)
        raw2 = cuda.local.array(RAW if PIPE else 1, uint32)
        ws = cuda.local.array(SB, float32)
        bf = cuda.local.array(BFN, float32)
        if KM:
            K, M = A.shape
        else:
            M, K = A.shape
        N = B.shape[0]
        tid = cuda.threadIdx.x
        g = tid // CT
        c = tid % CT
        nb = cuda.blockIdx.y * BN + g * U      # the group's first row of B
        m0 = cuda.blockIdx.x * MT
        z = cuda.blockIdx.z
        per = ((K + KG - 1) // KG + cuda.gridDim.z - 1) // cuda.gridDim.z * KG
        kb = z * per
        ke = min(K, kb + per)
        Ap, Bp = view(A), view(B)   # as the KN form
        # Uniform, once per launch: may B's rows be read in 16-byte pieces?
        b_vec = K % V == 0 and aligned16(Bp)
        for e in range(ACC):
            acc[e] = float32(0.0)

        for k0 in range(kb, ke, KC):
            kc = min(KC, ke - k0)
            lim = k0 + kc
            kk = c * V                           # this lane's first piece of the chunk
            if PIPE:   # the chunk's first round of B is in flight while A stages
                fetch_round_nk(Bp, nb, N, k0 + kk, lim, b_vec, raw)
            # Stage A[m0:m0+MT, k0:k0+kc] as fp32 (zeros past kc up to a whole piece, and
            # for rows past M): piece j's half h of row i at shared row (i*NH + h)*KCV + j.
            kcv = (kc + V - 1) // V * V
            for t in range(tid, MT * kcv, NT):
                if KM:   # A's (K, M) memory: consecutive threads along its rows
                    q = t // MT
                    i = t - q * MT
                else:
                    i = t // kcv
                    q = t - i * kcv
                v = float32(0.0)
                if m0 + i < M and q < kc:
                    if KM:
                        v = to_f32(read(Ap, uidx(k0 + q), uidx(m0 + i)))
                    else:
                        v = to_f32(read(Ap, uidx(m0 + i), uidx(k0 + q)))
                j = q // V
                h = (q - j * V) // 4
                sh[uidx((i * NH + h) * KCV + j), uidx(q % 4)] = v
            cuda.syncthreads()
            if PIPE:
                # Two register buffers, as in the KN form: the next round's U loads are
                # issued before this round's FMAs (unrolled by two: constant indices).
                while kk < kc:
                    fetch_round_nk(Bp, nb, N, k0 + kk + KG, lim, b_vec, raw2)
                    use_round_nk(sh, kk // V, raw, acc, bf)
                    kk += KG
                    if kk >= kc:
                        break
                    fetch_round_nk(Bp, nb, N, k0 + kk + KG, lim, b_vec, raw)
                    use_round_nk(sh, kk // V, raw2, acc, bf)
                    kk += KG
            else:
                while kk < kc:
                    fetch_round_nk(Bp, nb, N, k0 + kk, lim, b_vec, raw)   # U loads in flight
                    use_round_nk(sh, kk // V, raw, acc, bf)
                    kk += KG
            cuda.syncthreads()

        # The group's CT lanes hold partial sums of the same MT x U results: shuffles add
        # them, and the totals go where the stores read the block's result
        sum_lanes_nk(sh, acc, g, c)
        cuda.syncthreads()
        finish(C, W, L, sh, last, ws, tid, m0, z, M, N)

    # PIPE's two buffers with few accumulators (MT x VEC <= 32): two blocks an SM, so ptxas
    # keeps a thread within 65536 / (2 NT) registers (one block of 256 threads an SM has
    # too few loads in flight); every other form keeps the compiler's choice.  NK forms with
    # MT x U <= 32 accumulators take the same bound, PIPE or not: left alone, ptxas gives
    # MT = 8 some 154 registers on sm_80, one block an SM, half the KN form's loads in flight.
    jit_opts = ({"launch_bounds": (NT, MIN_BLOCKS)} if (PIPE or NK) and ACC <= 32
                and not SIMULATOR else {})
    kernel = cuda.jit(**jit_opts)(skinny_nk_kernel if NK else skinny_kernel)
    itemsize = 2 if SIXTEEN else 4

    def grid(M, N, K):
        S = splits_for(M, N, K, MT, BN, NT, KG, itemsize)
        return (cdiv(M, MT), cdiv(N, BN), effective_splits(S, K, KG))

    params = dict(precision=precision, MT=MT, CT=CT, NT=NT, U=U, NC=NC, SPLITS=0,
                  **({} if OUT == "fp32" else {"OUT": OUT}), **({"PIPE": 1} if PIPE else {}))
    name = "skinny" + ("" if precision == "fp16" else f"_{precision}")
    for key, tag in (("MT", "m"), ("CT", "c"), ("NT", "t"), ("U", "u")):
        if params[key] != DEFAULTS[key]:
            name += f"_{tag}{params[key]}"
    if NC:
        name += "_nc"
    if PIPE:
        name += "_p"
    if PITCHED:
        params["PITCHED"] = True
        name += "_ld"
    if OUT != "fp32":
        name += "_o16"
    if NK:
        params["B_LAYOUT"] = "NK"
        name += "_nk"
    if KM:
        params["A_LAYOUT"] = "KM"
        name += "_km"
    # 16-byte loads of B, fp32 FMAs, the sums through shared memory and C (or the slices'
    # partials) in 16-byte pieces, the tickets (NK: the lanes' sums by shuffles, not
    # through 16-byte shared stores)
    must = [r"ld\.global(\.nc)?(\.L1::no_allocate)?\.v4\.(u32|b32)", r"fma\.rn\.f32",
            r"shfl\.sync\.bfly\.b32" if NK else r"st\.shared\.v4\.f32",
            r"ld\.shared\.v4\.f32", r"st\.global\.v4\.f32", r"atom\.global\.add"]
    if FP16:
        must.append(r"cvt\.f32\.f16")
    if OUT != "fp32":
        must.append(rf"cvt\.rn\.{'f16' if OUT == 'fp16' else 'bf16'}\.f32")
    return KernelSpec(
        name=name,
        chapter="18b-decode",
        idea="decode (M <= 16): each block streams a slab of B's columns once in 16-byte "
             "loads, all M rows of A from shared memory, fp32 FMAs into registers; K split "
             "across warps and, when N is narrow, across blocks (fixed-order sums)"
             + ("; B given (N, K): lanes read its rows along K, sums by warp shuffles"
                if NK else "") + ("; A given (K, M)" if KM else ""),
        kernel=kernel,
        block=(NT, 1, 1),
        tile=(MT, BN),
        grid=grid,
        params=params,
        shared_bytes=SH * 16,
        min_cc=(7, 0) if NC else (5, 0),
        dtype=INPUT_DTYPE[precision],
        arg_dtypes=(ARG_DTYPES[precision][:2] + ("float32" if OUT == "fp32" else "uint16",)
                    if SIXTEEN else ()),
        precision=precision,
        b_operand=B_LAYOUT,
        a_operand=A_LAYOUT,
        operand_align=0,
        constraints=CONSTRAINTS,
        ptx_must=tuple(must),
        index={"thread_cols": thread_cols, "rows_of": rows_of,
               "k_slices": lambda K, S: k_slices(K, S, KG)},
        module=__name__,
        workspace=workspace_for(grid),
        workspace_dtypes=WORKSPACE_DTYPES,
        launch_only=("SPLITS",),
        reads_pitched=PITCHED,
    )


def params_for(precision: str, M: int, b_layout: str = "KN") -> dict:
    """The configuration ``kernel="auto"`` runs for M rows in ``precision``
    (gemmlib.dispatch.select_skinny): the defaults with MT = :func:`rows_for` (M) and
    the per-MT overrides of ``TUNED`` (set from scripts/skinny_gpu.py).  ``b_layout="NK"``
    (B given as (N, K)): the same defaults with ``B_LAYOUT="NK"`` and the overrides of
    ``TUNED_NK`` instead."""
    MT = rows_for(M)
    if b_layout == "NK":
        return {**DEFAULTS, "precision": precision, "MT": MT, "B_LAYOUT": "NK",
                **TUNED_NK.get((precision, MT), TUNED_NK.get(MT, {}))}
    if b_layout != "KN":
        raise ValueError(f"b_layout must be 'KN' or 'NK', got {b_layout!r}")
    return {**DEFAULTS, "precision": precision, "MT": MT,
            **TUNED.get((precision, MT), TUNED.get(MT, {}))}


#: overrides of DEFAULTS per row count, keyed by MT = rows_for(M) or (precision, MT) --
#: e.g. ``{16: {"MT": 8}}`` runs M = 9..16 as two row blocks of 8 -- from what
#: scripts/skinny_gpu.py measured best.  On an H100 (results/models-2026-11-24/
#: skinny-h100.json) eight 16-byte loads in flight a thread (U=8) were fastest for fp16 at
#: M = 1 on 5 of the 7 decode shapes and at M = 4 on 4 of 7; the other precisions and
#: row counts keep the defaults (not measured better).  At M = 1 (fp16 and bf16) four loads
#: double-buffered (PIPE=1, U=4) then beat U=8 on 5 of 6 layer shapes by 2.4-5.1% (0.5%
#: behind on 1 x 28672 x 4096; results/decode-2026-11-26/skinny-compare-h100.json)
TUNED: dict = {("fp16", 1): {"U": 4, "PIPE": 1}, ("bf16", 1): {"U": 4, "PIPE": 1},
               ("fp16", 4): {"U": 8}}

#: TUNED for ``B_LAYOUT="NK"``, whose U counts rows of B per thread (each load of A from
#: shared memory serves U of them) rather than rows of K in flight: not measured yet, so
#: the defaults (U = 4, no PIPE) everywhere
TUNED_NK: dict = {}


SPEC = build()
