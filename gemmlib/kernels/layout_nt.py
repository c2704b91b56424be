"""Layout-built GEMM: C = A @ B.T with both operands K-major, every index from a layout.

The operands are stored the CuTe/MoYe way: A is (M, K) and B is (N, K), both
row-major, so K is the contiguous ("K-major") dimension of each, and the kernel
computes ``C = A @ B.T`` (call it with ``gemmlib.matmul(A, Bt, transpose_b=True)``).

Every address in the kernel comes from :mod:`gemmlib.layout`:

* **tiling** (``@tile``): block ``(blockIdx.x, blockIdx.y)`` owns the
  ``BM x BN`` tile of C at that position and walks the matching row blocks
  of A and B one ``BK``-wide k-tile at a time;
* **shared-memory layouts**: the k-tile of A is kept as a ``(BM, BK)``
  column-major layout padded by ``pad`` elements per column,
  ``(BM, BK):(1, BM + pad)``, likewise B.  M (or N) runs fastest because the
  compute loop reads along M; the padding moves the copy's stores onto
  different banks (with ``pad = 0`` a warp's store is an 8-way bank
  conflict, with 1 it is 4-way, with 4 none: ``gemmlib.layout.plot_banks``);
* **copy thread layout** ``(32, 8)``: the 256 threads laid over the
  ``(BM, BK)`` tile, K fastest (row-major thread layout), so the 8 threads
  of a row read 8 consecutive floats of a K-major row, and each thread copies
  ``BM/32 = 4`` elements of A and 4 of B per k-tile (the source, being
  column-major Julia with M-major operands, lays its threads M fastest
  instead: the rule is "threads follow the contiguous dimension");
* **compute thread layout** ``(16, 16)``: the same 256 threads over the
  ``BM x BN`` tile of C; each thread owns ``8 x 8`` elements spread 16 apart
  (rows ``tm + 16 i``, columns ``tn + 16 j``) and accumulates them in
  registers.  To do so it needs its rows of the A tile for every k and its
  rows of the B tile for every k: the *projections* of the thread layout on
  its M mode and its N mode.

The layouts generate small index functions with their integers written in
(print ``SPEC.index["a_frag"].__source__``), compiled as device functions;
``build(indexing="hand")`` is the same kernel with those expressions typed by
hand, to check (by the PTX and by the clock) what layouts cost.

Every array index goes through ``uidx`` (unsigned: no negative-index fix-up,
see :mod:`gemmlib.intrinsics.index`).  On sm_90 that took the k loop from 189
to 94 machine instructions per k (64 of them FMAs), and 139 registers to 117,
and doubled the speed (26% -> 51% of cuBLAS at 4096^3 on an H200).

Both versions compile to nearly the same k loop: per k, 16 ``ld.shared.f32``
and 64 ``fma`` in the PTX; in the H200 driver's machine code 94 and 91
instructions (64 FFMA, 16 LDS each).  Outside it the PTX differs by a few
signed shifts from the layouts' general floor divisions.  Before ``uidx``
their speeds were the same (26.1% vs 26.4% of cuBLAS); after it the hand
version ran faster: 58.5% vs 51.1% at 4096^3, with 125 and 117 registers
(results/uidx-2026-11-22/).  Nsight Compute at 2048^3 sees both halves of
the gap: the layout version executes 3.4% more instructions (468.0 M vs
452.8 M) and each warp issues one every 5.31 cycles instead of 4.81.  Which
instructions and which stalls is not pinned down yet; until it is, count it
as a measured cost of this layout-built kernel here.

Any M, N, K works: loads outside the matrix give 0 (which adds nothing to
the sums) and stores outside it are skipped.
"""

from gemmlib import layout as L
from gemmlib.backend import SIMULATOR, cuda, float32
from gemmlib.intrinsics.index import uidx
from gemmlib.spec import KernelSpec, cdiv


def plan(BM=128, BN=128, BK=8, copy_threads=(32, 8), mma_threads=(16, 16), pad=4):
    """The layouts and partitions of one configuration (pure Python, for kernels and figures)."""
    tA = L.row_major(copy_threads)   # thread t -> (t // 8, t % 8): K fastest
    tC = L.row_major(mma_threads)    # thread t -> (t // 16, t % 16): N fastest
    if tA.size != tC.size:
        raise ValueError(f"copy threads {copy_threads} and compute threads {mma_threads} "
                         "must be the same block")
    p = dict(
        threads_copy=tA, threads_mma=tC,
        sA=L.padded((BM, BK), pad), sB=L.padded((BN, BK), pad),
        copyA=L.Partition((BM, BK), tA), copyB=L.Partition((BN, BK), tA),
        mmaA=L.Partition((BM, BK), tC, proj=(True, False)),   # MoYe (1, :)
        mmaB=L.Partition((BN, BK), tC, proj=(False, True)),   # MoYe (:, 1)
        mmaC=L.Partition((BM, BN), tC),
    )
    return p


def _index_functions(p, device):
    """Generated index functions: (tid, i, j) -> tile coordinate or shared offset."""
    j = lambda part, name, lay=None: L.jit(part.source(name, lay), device=device)  # noqa: E731
    return dict(
        a_src=j(p["copyA"], "a_src"), a_dst=j(p["copyA"], "a_dst", p["sA"]),
        b_src=j(p["copyB"], "b_src"), b_dst=j(p["copyB"], "b_dst", p["sB"]),
        a_frag=j(p["mmaA"], "a_frag", p["sA"]), b_frag=j(p["mmaB"], "b_frag", p["sB"]),
        c_dst=j(p["mmaC"], "c_dst"),
    )


def build(BM: int = 128, BN: int = 128, BK: int = 8, copy_threads=(32, 8),
          mma_threads=(16, 16), pad: int = 4, indexing: str = "layout",
          min_blocks: int | None = None) -> KernelSpec:
    p = plan(BM, BN, BK, copy_threads, mma_threads, pad)
    NT = p["threads_mma"].size
    # min_blocks: ask the compiler to fit that many blocks per SM (caps registers,
    # like CUDA's __launch_bounds__(NT, min_blocks)); the simulator has no such option.
    jit_opts = {} if SIMULATOR or not min_blocks else {"launch_bounds": (NT, min_blocks)}
    CA_M, CA_K = p["copyA"].shape           # elements of A each thread copies per k-tile
    CB_N, CB_K = p["copyB"].shape
    TM, TN = p["mmaC"].shape                # C elements per thread: TM x TN
    ACC = TM * TN
    SA_SIZE, SB_SIZE = p["sA"].cosize, p["sB"].cosize

    if indexing == "layout":
        f = _index_functions(p, device=True)
        a_src, a_dst, b_src, b_dst = f["a_src"], f["a_dst"], f["b_src"], f["b_dst"]
        a_frag, b_frag, c_dst = f["a_frag"], f["b_frag"], f["c_dst"]

        @cuda.jit(**jit_opts)
        def layout_nt(A, B, C):
            sA = cuda.shared.array(SA_SIZE, float32)
            sB = cuda.shared.array(SB_SIZE, float32)
            acc = cuda.local.array(ACC, float32)
            ra = cuda.local.array(TM, float32)
            rb = cuda.local.array(TN, float32)
            tid = cuda.threadIdx.x
            M, K = A.shape
            N = B.shape[0]
            m0 = cuda.blockIdx.x * BM            # @tile: this block's tile of C
            n0 = cuda.blockIdx.y * BN
            for e in range(ACC):
                acc[e] = float32(0.0)
            for k0 in range(0, K, BK):          # the k-tiles of gA and gB
                for i in range(CA_M):           # copy: global -> shared, zero outside
                    for j in range(CA_K):
                        m, k = a_src(tid, i, j)
                        gm, gk = m0 + m, k0 + k
                        v = A[uidx(gm), uidx(gk)] if gm < M and gk < K else float32(0.0)
                        sA[uidx(a_dst(tid, i, j))] = v
                for i in range(CB_N):
                    for j in range(CB_K):
                        n, k = b_src(tid, i, j)
                        gn, gk = n0 + n, k0 + k
                        v = B[uidx(gn), uidx(gk)] if gn < N and gk < K else float32(0.0)
                        sB[uidx(b_dst(tid, i, j))] = v
                cuda.syncthreads()
                for k in range(BK):             # compute: my rows of A x my rows of B
                    for i in range(TM):
                        ra[i] = sA[uidx(a_frag(tid, i, k))]
                    for jj in range(TN):
                        rb[jj] = sB[uidx(b_frag(tid, jj, k))]
                    for i in range(TM):
                        for jj in range(TN):
                            acc[i * TN + jj] += ra[i] * rb[jj]
                cuda.syncthreads()
            for i in range(TM):                 # guarded store of the register tile
                for jj in range(TN):
                    m, n = c_dst(tid, i, jj)
                    if m0 + m < M and n0 + n < N:
                        C[uidx(m0 + m), uidx(n0 + n)] = acc[i * TN + jj]

        kernel = layout_nt
    elif indexing == "hand":
        CT_M, CT_K = copy_threads
        MT_M, MT_N = mma_threads
        LDA, LDB = BM + pad, BN + pad           # padded column stride of the shared tiles

        @cuda.jit(**jit_opts)
        def layout_nt_hand(A, B, C):
            sA = cuda.shared.array(SA_SIZE, float32)
            sB = cuda.shared.array(SB_SIZE, float32)
            acc = cuda.local.array(ACC, float32)
            ra = cuda.local.array(TM, float32)
            rb = cuda.local.array(TN, float32)
            tid = cuda.threadIdx.x
            M, K = A.shape
            N = B.shape[0]
            m0 = cuda.blockIdx.x * BM
            n0 = cuda.blockIdx.y * BN
            cm = tid // CT_K                    # copy coordinates
            ck = tid % CT_K
            tm = tid // MT_N                    # compute coordinates
            tn = tid % MT_N
            for e in range(ACC):
                acc[e] = float32(0.0)
            for k0 in range(0, K, BK):
                for i in range(CA_M):
                    for j in range(CA_K):
                        m = cm + i * CT_M
                        k = ck + j * CT_K
                        gm, gk = m0 + m, k0 + k
                        v = A[uidx(gm), uidx(gk)] if gm < M and gk < K else float32(0.0)
                        sA[uidx(m + k * LDA)] = v
                for i in range(CB_N):
                    for j in range(CB_K):
                        n = cm + i * CT_M
                        k = ck + j * CT_K
                        gn, gk = n0 + n, k0 + k
                        v = B[uidx(gn), uidx(gk)] if gn < N and gk < K else float32(0.0)
                        sB[uidx(n + k * LDB)] = v
                cuda.syncthreads()
                for k in range(BK):
                    for i in range(TM):
                        ra[i] = sA[uidx(tm + i * MT_M + k * LDA)]
                    for jj in range(TN):
                        rb[jj] = sB[uidx(tn + jj * MT_N + k * LDB)]
                    for i in range(TM):
                        for jj in range(TN):
                            acc[i * TN + jj] += ra[i] * rb[jj]
                cuda.syncthreads()
            for i in range(TM):
                for jj in range(TN):
                    m = m0 + tm + i * MT_M
                    n = n0 + tn + jj * MT_N
                    if m < M and n < N:
                        C[uidx(m), uidx(n)] = acc[i * TN + jj]

        kernel = layout_nt_hand
    else:
        raise ValueError("indexing must be 'layout' or 'hand'")

    def grid(M, N, K):
        return (cdiv(M, BM), cdiv(N, BN), 1)

    default = (BM, BN, BK, tuple(copy_threads), tuple(mma_threads), pad) == (
        128, 128, 8, (32, 8), (16, 16), 4)
    name = "layout_nt" if default else f"layout_nt_{BM}x{BN}x{BK}_p{pad}"
    if indexing == "hand":
        name += "_hand"
    if min_blocks:
        name += f"_mb{min_blocks}"
    return KernelSpec(
        name=name,
        chapter="10-layouts",
        idea="tiles, thread partitions and padded shared memory all described by layouts, "
             "compiled to constant index arithmetic",
        kernel=kernel,
        block=(NT, 1, 1),
        tile=(BM, BN),
        grid=grid,
        params=dict(BM=BM, BN=BN, BK=BK, TM=TM, TN=TN, pad=pad, min_blocks=min_blocks or 0,
                    copy_threads=tuple(copy_threads), mma_threads=tuple(mma_threads)),
        shared_bytes=4 * (SA_SIZE + SB_SIZE),
        b_operand="NK",
        index=_index_functions(p, device=False),
        module=__name__,
    )


SPEC = build()


def accesses(spec):
    """Shared-memory access patterns of ``spec`` for gemmlib.banks, from the layouts'
    own index functions (shared arrays are 1-D: each word address is a layout offset).
    Also used by ``async_copy`` and ``double_buffer``, whose layouts are these."""
    from gemmlib.spec import Access

    ix, p, nt = spec.index, spec.params, spec.threads
    at = lambda name: (lambda t: (ix[name](t, 0, 0), 0))  # noqa: E731
    store = "cp.async into" if p.get("copy") == "async" else "store to"
    return [
        Access("sA", "store", 1, at("a_dst"), label=f"copy: {store} sA[a_dst(tid, i, j)]",
               count=max(p["BM"] * p["BK"] // nt, 1)),
        Access("sB", "store", 1, at("b_dst"), label=f"copy: {store} sB[b_dst(tid, i, j)]",
               count=max(p["BN"] * p["BK"] // nt, 1)),
        Access("sA", "load", 1, at("a_frag"), label="compute: sA[a_frag(tid, i, k)]",
               count=p["BK"] * p["TM"]),
        Access("sB", "load", 1, at("b_frag"), label="compute: sB[b_frag(tid, j, k)]",
               count=p["BK"] * p["TN"]),
    ]
