"""The copy engine fills the ring: TMA tile copies that signal an mbarrier, several k-tiles ahead.

In ``wgmma_async`` every thread still copies: 16 bytes per ``cp.async``,
sixteen instructions per thread per k-tile, each with its own address and
bounds test, then a ``fence.proxy.async``.  Hopper's *tensor memory
accelerator* (TMA) moves a whole tile with one instruction:

* **One thread asks for a box.**  ``cp.async.bulk.tensor.2d`` takes a
  *tensor map* (the matrix's address, shape and row pitch, the box size and
  the swizzle, encoded once on the host: ``gemmlib.tma``) and the box's
  coordinates.  The copy engine writes the box into shared memory already in
  the 128-byte swizzled order wgmma's descriptors read, and fills whatever
  hangs over the matrix edges with zeros: no bounds tests in the kernel.
  A's k-tile is one BM x 64 box; B's is BN/64 boxes of 64 k x 64 n (a
  swizzled box row holds at most 128 bytes), which land as the panels of
  ``wgmma_async``'s MN-major B tile.  A B given as (N, K) (``B_LAYOUT="NK"``
  in the rungs built on this loader) is one BN x 64 box, K-major like A's; an
  A given as (K, M) (``A_LAYOUT="KM"``, a column-major A) is BM/64 boxes of
  64 k x 64 m, MN-major panels like a (K, N) B's.
* **An mbarrier says when it has landed.**  Each stage has a barrier in
  shared memory.  The issuing thread *arrives* on it announcing the bytes
  to come (``mbarrier.arrive.expect_tx``); the copies count their bytes off
  as they land; the barrier's *phase* completes when the count reaches zero.
  Consumers poll ``mbarrier.try_wait.parity``: stage s is used for the n-th
  time in phase n, so they wait for parity ``(kt // STAGES) % 2``.
* **TMA writes through the async proxy**, the path wgmma reads: no proxy
  fence is needed between them.

The block has BM / 64 warpgroups (2 for BM = 128), each owning 64 rows of
the BM x BN tile (m64n256k16: 128 fp32 accumulators per thread).  Before
the loop thread 0 starts the copies of the first STAGES k-tiles; at k-tile
``kt`` everyone waits for its stage's barrier, the warpgroups issue their
wgmma, wait for them, synchronise (the stage is free), and thread 0 starts
the copy of k-tile ``kt + STAGES`` into it.  Every thread computes, so the
copies and the tensor cores overlap only as far as the ring lets them; the
next rung gives the copies a warp of their own.

Shapes: TMA needs a row pitch that is a multiple of 16 bytes (K and N
multiples of 8, ``gemmlib.matmul`` pads others); M, N, K tails come from the
zero fill, and the epilogue writes inside C only.
"""

from gemmlib.backend import SIMULATOR, cuda, float32, uint16, uint64
from gemmlib.intrinsics import hopper as H
from gemmlib.intrinsics.hopper import BAR_ALIGN   # a global: numba needs a literal
from gemmlib.kernels.wgmma_async import (BK, PANEL_BYTES, SLICE_BYTES, rung_name, spec_fields,
                                         tile_order, warpgroup_code)
from gemmlib.spec import KernelSpec, cdiv


@cuda.jit(device=True)
def wait(bar, parity):
    """Spin until the mbarrier at ``bar`` has completed the phase of ``parity``."""
    while H.mbarrier_try_wait(bar, parity) == 0:
        pass


def a_loader(BM: int, a_layout: str = "MK"):
    """``load_a(base, maps, k0, m0, bar)``: the copies of A's k-tile at ``k0`` for rows
    ``m0..`` into the stage at ``base``.  "MK" (A is (M, K)): one BM x 64 box, K-major.
    "KM" (A given as its (K, M) memory, a column-major A): BM/64 boxes of 64 k x 64 m, the
    panels of an MN-major tile, laid out as a (K, N) B's (panel p: rows m0 + 64p ..); a
    consumer's 64-row slice is then one panel, at the slice's offset."""
    A_PANELS = BM // 64

    if a_layout == "KM":
        @cuda.jit(device=True)
        def load_a(base, maps, k0, m0, bar):
            for p in range(A_PANELS):
                H.tma_load_2d(base + p * PANEL_BYTES, maps, m0 + 64 * p, k0, bar)   # (m, k)

        return load_a

    @cuda.jit(device=True)
    def load_a(base, maps, k0, m0, bar):
        H.tma_load_2d(base, maps, k0, m0, bar)   # (column, row) of A's box

    return load_a


def tma_loader(BM: int, BN: int, b_layout: str = "KN", a_layout: str = "MK"):
    """``load_stage(ring, s, bar, maps, k0, m0, n0, b_row)``: one thread starts the copies of
    the k-tile at ``k0`` of tile (m0, n0) into stage ``s`` and announces their bytes on
    ``bar``.  ``b_row``: the row of B's map where this product's B starts (0; a batched
    launch's products lie one under the other).
    ``b_layout`` "NK": B is (N, K), and its k-tile is one box of BN rows of 128 bytes,
    K-major as A's (the same bytes for tf32 and FP8: ``wgmma_tf32.kmajor_loader``).
    ``a_layout``: A's copies (:func:`a_loader`); the same bytes either way."""
    A_BYTES = BM * BK * 2
    STAGE_BYTES = A_BYTES + BK * BN * 2
    PANELS = BN // 64
    load_a = a_loader(BM, a_layout)

    if b_layout == "NK":
        @cuda.jit(device=True)
        def load_stage(ring, s, bar, maps, k0, m0, n0, b_row):
            base = ring + s * STAGE_BYTES
            H.mbarrier_expect_tx(bar, STAGE_BYTES)
            load_a(base, maps, k0, m0, bar)
            H.tma_load_2d(base + A_BYTES, maps + uint64(128), k0, b_row + n0, bar)   # rows n0..

        return load_stage, A_BYTES, STAGE_BYTES

    @cuda.jit(device=True)
    def load_stage(ring, s, bar, maps, k0, m0, n0, b_row):
        base = ring + s * STAGE_BYTES
        H.mbarrier_expect_tx(bar, STAGE_BYTES)   # the whole boxes count, zeros included
        load_a(base, maps, k0, m0, bar)
        for p in range(PANELS):
            H.tma_load_2d(base + A_BYTES + p * PANEL_BYTES, maps + uint64(128),
                          n0 + 64 * p, b_row + k0, bar)

    return load_stage, A_BYTES, STAGE_BYTES


def tma_boxes(BM: int, BN: int = 64, b_layout: str = "KN", a_layout: str = "MK") -> tuple:
    """The boxes the tensor maps copy: A's BM x 64 k-tile -- or, for A given as (K, M)
    (``a_layout`` "KM"), one 64 k x 64 m panel of it -- and one 64 x 64 panel of a (K, N)
    B -- or, for a (N, K) B (``b_layout`` "NK"), its whole BN x 64 k-tile."""
    return ((BK, 64) if a_layout == "KM" else (BM, BK), (BN, BK) if b_layout == "NK" else (BK, 64))


def build(precision: str = "fp16", BM: int = 128, BN: int = 256, STAGES: int = 4,
          GROUP_M: int = 8) -> KernelSpec:
    if BM % 64 or BM > 256 or BN % 64 or BN > 256 or not 2 <= STAGES <= 8:
        raise ValueError(f"BM must be 64, 128, 192 or 256, BN a multiple of 64 up to 256 "
                         f"and STAGES 2..8 (BM={BM}, BN={BN}, STAGES={STAGES})")
    k_tile, store_acc = warpgroup_code(precision, BN, 1)   # one 64-row slice per warpgroup
    tile_origin = tile_order(BM, BN, GROUP_M)
    load_stage, A_BYTES, STAGE_BYTES = tma_loader(BM, BN)
    NT = 128 * (BM // 64)
    ACC = BN // 2
    SHARED = STAGES * STAGE_BYTES + 1024
    wait0 = H.wgmma_wait(0)
    jit_opts = {} if SIMULATOR else {"launch_bounds": (NT, 1)}

    @cuda.jit(**jit_opts)
    def wgmma_tma_kernel(A, B, C, maps):
        sm = cuda.shared.array(0, uint16)                       # the ring (dynamic)
        full = cuda.shared.array(STAGES, uint64, alignment=BAR_ALIGN)   # a barrier per stage
        acc = cuda.local.array(ACC, float32)
        t = cuda.threadIdx.x
        wg = t // 128
        M, K = A.shape
        N = B.shape[1]
        pad = ((1024 - H.smem_addr(sm, 0) % 1024) % 1024) // 2
        ring = H.smem_addr(sm, pad)
        m0, n0 = tile_origin(cuda.blockIdx.x, M, N)
        num_k = (K + BK - 1) // BK
        if t == 0:
            for s in range(STAGES):
                H.mbarrier_init(H.smem_addr(full, s), 1)   # one arrival: the issuing thread
            H.fence_mbarrier_init()                         # visible to the copy engine
        cuda.syncthreads()
        if t == 0:
            H.tensormap_acquire(maps)
            H.tensormap_acquire(maps + uint64(128))
            for s in range(STAGES):                         # the first STAGES k-tiles
                if s < num_k:
                    load_stage(ring, s, H.smem_addr(full, s), maps, s * BK, m0, n0, 0)
        for e in range(ACC):
            acc[e] = float32(0.0)
        for kt in range(num_k):
            s = kt % STAGES
            wait(H.smem_addr(full, s), (kt // STAGES) % 2)   # stage s's n-th fill: phase n
            H.wgmma_fence()
            k_tile(ring + s * STAGE_BYTES + wg * SLICE_BYTES, ring + s * STAGE_BYTES + A_BYTES,
                   acc)
            H.wgmma_commit()
            wait0()
            cuda.syncthreads()                               # nobody reads stage s now
            if t == 0 and kt + STAGES < num_k:
                load_stage(ring, s, H.smem_addr(full, s), maps, (kt + STAGES) * BK, m0, n0, 0)
        store_acc(C, acc, t % 128, m0 + 64 * wg, n0, M, N)

    def grid(M, N, K):
        return (cdiv(M, BM) * cdiv(N, BN), 1, 1)

    default = (BM, BN, STAGES, GROUP_M) == (128, 256, 4, 8)
    return KernelSpec(
        name=rung_name("wgmma_tma", precision, default, BM, BN, STAGES, GROUP_M),
        idea="one thread starts TMA tile copies STAGES k-tiles ahead; an mbarrier per stage "
             "counts their bytes; BM/64 warpgroups issue wgmma",
        kernel=wgmma_tma_kernel,
        block=(NT, 1, 1),
        tile=(BM, BN),
        grid=grid,
        params=dict(precision=precision, BM=BM, BN=BN, BK=BK, STAGES=STAGES, GROUP_M=GROUP_M),
        shared_bytes=SHARED,
        tma_boxes=tma_boxes(BM),
        tma_swizzle=128,
        ptx_must=(r"wgmma\.mma_async\.sync\.aligned\.m64n\d+k16",
                  r"cp\.async\.bulk\.tensor\.2d", r"mbarrier\.try_wait\.parity"),
        **{**spec_fields(precision, __name__), "chapter": "17b-tma"},
    )


SPEC = build()
