"""Overlap copy and compute: prefetch the next k-tile with cp.async while computing this one.

Same layouts, tiles and partitions as ``layout_nt`` (C = A @ B.T, both operands
K-major, 128 x 128 x 8 tiles, 256 threads, 8 x 8 accumulators per thread,
padded shared memory).  One thing changes: *when* the copy happens.

In ``layout_nt`` every k-tile is: copy global -> shared, barrier, compute,
barrier.  While the block waits for DRAM, it computes nothing (other blocks on
the SM may, if registers allow them to be resident).  Here each thread

1. waits for its own cp.async copies of tile ``k`` (``cp_async_wait_all``),
   then the block barrier makes everyone's copies visible;
2. copies its whole share of tile ``k`` from shared memory into registers
   (explicit *fragments*: its 8 rows of A and 8 rows of B, for all 8 k);
3. barrier: the shared tile is no longer needed, so
4. issues cp.async for tile ``k + 1`` into the same shared buffer, and
   commits it as one group; the instructions return at once, and
5. computes tile ``k`` from registers while tile ``k + 1`` is in flight.

The price is registers: a fragment of a whole k-tile (2 x 8 x 8 floats) on
top of the 64 accumulators.  With signed indices that took 255 registers and
about 400 bytes of spills per thread, and at 4096^3 on an H200 the kernel was
still 1.18x faster than ``layout_nt`` (31% vs 26% of cuBLAS).  With every
index through ``uidx`` (unsigned: no negative-index fix-up, see
:mod:`gemmlib.intrinsics.index`) it fits in 124 registers (sm_90), no spills,
and runs at 59.1% of cuBLAS against layout_nt's 51.1% (x1.16; results/uidx-2026-11-22/).
``double_buffer`` shrinks the fragments to two k-slices.

Edge tiles use cp.async's zero-fill form: an element outside the matrix is
copied with ``src_size = 0`` (from a clamped, valid address), so shared
memory gets 0.0 without a branch around the copy.

cp.async exists from sm_80 (Ampere) on: the default build (``copy="async"``)
has ``min_cc = (8, 0)`` and its PTX must show the three instructions.
``build(copy="sync")`` is the same kernel with synchronous copies (load +
store; commit and wait do nothing): it runs on sm_75 (T4) and shows what the
asynchrony itself is worth.
"""

from gemmlib import layout as L
from gemmlib.backend import SIMULATOR, cuda, float32
from gemmlib.intrinsics import async_copy
from gemmlib.intrinsics.index import uidx
from gemmlib.kernels.layout_nt import _index_functions, accesses, plan  # noqa: F401 (accesses: gemmlib.banks)
from gemmlib.spec import KernelSpec, cdiv

PTX_ASYNC = (r"cp\.async\.ca\.shared\.global", r"cp\.async\.commit_group",
             r"cp\.async\.wait_group 0")


def tile_copier(p, f, cp):
    """The device function that starts one thread's copies of a k-tile into shared memory.

    ``issue_tile(sA, sB, a_buf, b_buf, A, B, tid, m0, n0, k0, M, N, K)`` copies
    this thread's share of the A and B k-tiles at ``k0`` (layouts of plan ``p``,
    index functions ``f``) to ``sA[a_buf + ...]`` and ``sB[b_buf + ...]`` with
    ``cp``'s ``cp_async4`` (zero-fill outside the matrix), then commits them as
    one group.  This rung has one buffer (offsets 0); double_buffer passes the
    offset of the buffer being filled.
    """
    a_src, a_dst, b_src, b_dst = f["a_src"], f["a_dst"], f["b_src"], f["b_dst"]
    cp_async4, commit = cp.cp_async4, cp.cp_async_commit
    CA_M, CA_K = p["copyA"].shape
    CB_N, CB_K = p["copyB"].shape

    @cuda.jit(device=True)
    def issue_tile(sA, sB, a_buf, b_buf, A, B, tid, m0, n0, k0, M, N, K):
        for i in range(CA_M):
            for j in range(CA_K):
                m, k = a_src(tid, i, j)
                gm, gk = m0 + m, k0 + k
                ok = gm < M and gk < K
                cp_async4(sA, a_buf + a_dst(tid, i, j), A, gm if ok else 0, gk if ok else 0,
                          4 if ok else 0)
        for i in range(CB_N):
            for j in range(CB_K):
                n, k = b_src(tid, i, j)
                gn, gk = n0 + n, k0 + k
                ok = gn < N and gk < K
                cp_async4(sB, b_buf + b_dst(tid, i, j), B, gn if ok else 0, gk if ok else 0,
                          4 if ok else 0)
        commit()

    return issue_tile


def build(BM: int = 128, BN: int = 128, BK: int = 8, copy_threads=(32, 8),
          mma_threads=(16, 16), pad: int = 4, copy: str = "async",
          min_blocks: int | None = None) -> KernelSpec:
    p = plan(BM, BN, BK, copy_threads, mma_threads, pad)
    f = _index_functions(p, device=True)
    a_frag, b_frag, c_dst = f["a_frag"], f["b_frag"], f["c_dst"]
    cp = async_copy.ops(copy)
    wait_all = cp.cp_async_wait_all

    NT = p["threads_mma"].size
    # min_blocks: ask the compiler to fit that many blocks per SM (caps registers,
    # like CUDA's __launch_bounds__(NT, min_blocks)); the simulator has no such option.
    jit_opts = {} if SIMULATOR or not min_blocks else {"launch_bounds": (NT, min_blocks)}
    TM, TN = p["mmaC"].shape
    ACC = TM * TN
    FA, FB = BK * TM, BK * TN                 # register fragments of one whole k-tile
    SA_SIZE, SB_SIZE = p["sA"].cosize, p["sB"].cosize

    issue_tile = tile_copier(p, f, cp)

    # numba has no "#pragma unroll", and a 512-FMA loop nest is more than the
    # compiler unrolls by itself; rolled, the k loop would index the fragment
    # arrays with a variable and push them to local memory.  So the two
    # steps that touch the fragments are generated as straight-line code.
    load_fragments = L.jit(_fragment_source(BK, TM, TN), device=True,
                           env=dict(a_frag=a_frag, b_frag=b_frag, uidx=uidx))
    mma_tile = L.jit(_mma_source(BK, TM, TN), device=True)

    @cuda.jit(**jit_opts)
    def async_copy_kernel(A, B, C):
        sA = cuda.shared.array(SA_SIZE, float32)
        sB = cuda.shared.array(SB_SIZE, float32)
        acc = cuda.local.array(ACC, float32)
        fa = cuda.local.array(FA, float32)    # my rows of A, all BK k of the tile
        fb = cuda.local.array(FB, float32)
        tid = cuda.threadIdx.x
        M, K = A.shape
        N = B.shape[0]
        m0 = cuda.blockIdx.x * BM
        n0 = cuda.blockIdx.y * BN
        for e in range(ACC):
            acc[e] = float32(0.0)
        num_k = (K + BK - 1) // BK
        if num_k > 0:
            issue_tile(sA, sB, 0, 0, A, B, tid, m0, n0, 0, M, N, K)  # prologue: tile 0
        for kt in range(num_k):
            wait_all()                        # my copies of tile kt have landed
            cuda.syncthreads()                # ... and everyone else's
            load_fragments(sA, sB, fa, fb, tid)   # shared -> registers: the whole tile
            cuda.syncthreads()                # nobody reads the buffer any more
            if kt + 1 < num_k:                # prefetch tile kt+1 into it ...
                issue_tile(sA, sB, 0, 0, A, B, tid, m0, n0, (kt + 1) * BK, M, N, K)
            mma_tile(acc, fa, fb)             # ... while computing tile kt
        for i in range(TM):
            for jj in range(TN):
                m, n = c_dst(tid, i, jj)
                if m0 + m < M and n0 + n < N:
                    C[uidx(m0 + m), uidx(n0 + n)] = acc[i * TN + jj]

    def grid(M, N, K):
        return (cdiv(M, BM), cdiv(N, BN), 1)

    default = (BM, BN, BK, tuple(copy_threads), tuple(mma_threads), pad) == (
        128, 128, 8, (32, 8), (16, 16), 4)
    name = "async_copy" if default else f"async_copy_{BM}x{BN}x{BK}_p{pad}"
    if copy == "sync":
        name += "_sync"
    if min_blocks:
        name += f"_mb{min_blocks}"
    return KernelSpec(
        name=name,
        chapter="11-async-copy",
        idea="prefetch the next k-tile global->shared with cp.async while computing the "
             "current one from register fragments",
        kernel=async_copy_kernel,
        block=(NT, 1, 1),
        tile=(BM, BN),
        grid=grid,
        params=dict(BM=BM, BN=BN, BK=BK, TM=TM, TN=TN, pad=pad, min_blocks=min_blocks or 0, copy=copy,
                    copy_threads=tuple(copy_threads), mma_threads=tuple(mma_threads)),
        shared_bytes=4 * (SA_SIZE + SB_SIZE),
        min_cc=async_copy.MIN_CC if copy == "async" else (5, 0),
        b_operand="NK",
        ptx_must=PTX_ASYNC if copy == "async" else (),
        ptx_must_not=(r"\bld\.local", r"\bst\.local") + (() if copy == "async" else (r"cp\.async",)),
        index=_index_functions(p, device=False),
        module=__name__,
    )


def _fragment_source(BK, TM, TN) -> str:
    """``load_fragments(sA, sB, fa, fb, tid)``: fa[k*TM+i] = my A element (i, k), likewise B."""
    lines = ["def load_fragments(sA, sB, fa, fb, tid):"]
    for k in range(BK):
        lines += [f"    fa[{k * TM + i}] = sA[uidx(a_frag(tid, {i}, {k}))]" for i in range(TM)]
        lines += [f"    fb[{k * TN + j}] = sB[uidx(b_frag(tid, {j}, {k}))]" for j in range(TN)]
    return "\n".join(lines) + "\n"


def _mma_source(BK, TM, TN) -> str:
    """``mma_tile(acc, fa, fb)``: acc[i*TN+j] += fa[k*TM+i] * fb[k*TN+j], k outermost."""
    lines = ["def mma_tile(acc, fa, fb):"]
    for k in range(BK):
        lines += [f"    acc[{i * TN + j}] += fa[{k * TM + i}] * fb[{k * TN + j}]"
                  for i in range(TM) for j in range(TN)]
    return "\n".join(lines) + "\n"


SPEC = build()
