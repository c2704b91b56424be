"""Warp specialisation: a producer warpgroup copies, consumer warpgroups compute, tile after tile.

In ``wgmma_tma`` every thread does everything: after each k-tile the whole
block waits for its wgmma to finish and synchronises before thread 0 may
refill the stage, so the tensor cores idle at every k-tile boundary and
during the epilogue.  This rung splits the roles:

* **A producer warpgroup** (warpgroup 0).  One of its threads does nothing
  but start TMA copies: for each k-tile it waits until the stage is *empty*,
  announces the bytes on the stage's *full* barrier and starts the boxes.
  It never waits for the tensor cores, so it runs up to STAGES k-tiles ahead.
* **Consumer warpgroups** (BM / 64 of them, each 64 rows of the tile).  For
  each k-tile they wait for *full*, issue their wgmma and let it run: they
  wait only for the *previous* k-tile's wgmma (``wgmma.wait_group 1``) and
  then arrive on that stage's *empty* barrier, which is what the producer
  waits for.  Two barriers per stage, each with its own phase: a ring with
  no block-wide synchronisation in the loop.
* **Registers follow the work** (``setmaxnreg``): the producer gives its
  registers back (down to 40 per thread), the consumers take them (up to 232)
  for their 128 accumulators per thread.
* **Three stages of 128 x 256 x 64** by default (48 KiB each): in the H100
  tuning run three beat four by 2.5 points of cuBLAS and six of 128 x 128
  lost 20 (``results/tune-wgmma-ws-*.json``); in the benchmark runs three and
  four are within their noise, and three leaves shared memory free.
* **Persistent tiles.**  The grid is one block per SM; a block walks tiles
  ``blockIdx.x, blockIdx.x + gridDim.x, ...`` (in grouped order), so while the
  consumers write one tile's accumulators to C the producer is already
  copying the next tile's k-tiles.  The ring's position (``it``) runs on
  across tiles, in both roles alike.

**A batch of products in one launch** (``torch.bmm``'s shapes).  The products' A, B
and C lie one under the other in the same arrays, and the same tensor maps; the
persistent blocks walk all products' tiles (tile ``i`` is tile ``i % per`` of product
``i // per``), and a product's rows are offset by its index times its rows.  A box that hangs over a product's last rows
reads the next product's rows: those rows of the accumulators are never stored, and
what hangs past K meets A's zero-filled columns (``gemmlib.matmul`` batches a (K, N)
B only when K is a whole number of k-tiles, so no product reads another's B).

The producer starts with parity 1 on the empty barriers: a fresh barrier is
in phase 0, and waiting for the phase *before* it (parity 1) returns at
once, so the first STAGES fills go ahead without consumers.  The two roles'
loops over the ring are ``ws_pipeline``'s (``fill``, ``mma``, ``drain``), which
every warp-specialised rung after this one shares.

Built with ``B_LAYOUT="NK"`` the rung takes B as (N, K) -- an ``nn.Linear``
weight, C = A @ B.T -- and copies each k-tile of it as one BN x 64 box, K-major
like A's (``wgmma_tma.tma_loader``); with ``BIAS=True`` the consumers add a
(1, N) bias to their accumulators before the store (``wgmma_async.bias_code``),
so ``F.linear(x, W, b)`` is one kernel.  With ``A_LAYOUT="KM"`` it takes A as the
(K, M) memory of a column-major A (``X.t()``: a weight gradient dW = dY^T X) and copies
its k-tiles as MN-major panels of 64 k x 64 m, read with wgmma's trans-a
(``wgmma_tma.a_loader``); such a build launches one product at a time.
"""

from gemmlib import backend
from gemmlib.backend import SIMULATOR, cuda, float32, uint16, uint64
from gemmlib.intrinsics import hopper as H
from gemmlib.intrinsics.hopper import BAR_ALIGN   # a global: numba needs a literal
from gemmlib.intrinsics.index import int64, u32
from gemmlib.kernels.wgmma_async import (BK, SLICE_BYTES, a_dims, bias_code, bias_entry,
                                         bias_fields, bias_params, bias_suffix,
                                         check_a_layout, check_layout, check_out,
                                         layout_fields, layout_params, layout_ptx,
                                         layout_suffix, no_bias, out_fields, out_params,
                                         out_ptx, out_suffix, rung_name, spec_fields,
                                         tile_order, warpgroup_code)
from gemmlib.kernels.wgmma_tma import tma_boxes, tma_loader
from gemmlib.kernels.ws_pipeline import acquire_maps, early_launch, ring_parts
from gemmlib.spec import KernelSpec, cdiv


@cuda.jit(device=True)
def keep_registers():
    """``REGS=None``: the warpgroups keep the registers the launch gave them."""
    return


#: setmaxnreg (producer, consumers) of the warp-specialised rungs' default builds
DEFAULT_REGS = (40, 232)


def register_roles(REGS):
    """``(fewer, more)``: the device functions the producer and the consumer warpgroups
    call first -- ``setmaxnreg`` down to REGS[0] and up to REGS[1], or (REGS=None) nothing."""
    if not REGS:
        return keep_registers, keep_registers
    return H.setmaxnreg(REGS[0], False), H.setmaxnreg(REGS[1], True)


def regs_suffix(REGS) -> str:
    """What a rung's name gets for a register split other than DEFAULT_REGS."""
    if REGS == DEFAULT_REGS:
        return ""
    return "_r" + ("none" if not REGS else f"{REGS[0]}-{REGS[1]}")


@cuda.jit(device=True)
def as_accumulated(acc, maps):
    """``finish=None``: the accumulators are the result."""
    return


def batched_walk(BM: int, BN: int, b_kmajor: bool, tile_origin):
    """``(walk, place)``, the device functions of a batched launch's tile walk, which every
    batched rung shares.  ``walk(a_rows, K, N, b_rows_all)``: the products are stacked one
    under the other in A (``a_rows`` rows), B (``b_rows_all`` rows: (K, N) or, ``b_kmajor``,
    (N, K) per product) and C -> ``(b_rows, M, per, tiles)``: B's rows per product, one
    product's rows, its tiles, and all products' tiles.  ``place(tile, per, M, N)`` ->
    ``(product, m0, n0)``: tile ``tile`` of the walk is tile ``tile % per`` of product
    ``tile // per`` (``tile_origin``'s order inside a product); its rows of A and C start
    at ``product * M + m0``, its B at row ``product * b_rows``.  One product: the plain walk."""
    B_KMAJOR = b_kmajor

    @cuda.jit(device=True)
    def walk(a_rows, K, N, b_rows_all):
        b_rows = N if B_KMAJOR else K
        products = int64(u32(b_rows_all) // u32(b_rows))
        M = int64(u32(a_rows) // u32(products))
        per = ((M + BM - 1) // BM) * ((N + BN - 1) // BN)
        return b_rows, M, per, per * products

    @cuda.jit(device=True)
    def place(tile, per, M, N):
        product = int64(u32(tile) // u32(per))
        m0, n0 = tile_origin(tile - product * per, M, N)
        return product, m0, n0

    return walk, place


def ws_kernel(BM: int, BN: int, BK: int, STAGES: int, REGS, k_tile, store_acc, tile_origin,
              load_stage, A_BYTES: int, STAGE_BYTES: int, finish=None, add_bias=None,
              b_kmajor: bool = False, a_layout: str = "MK"):
    """The warp-specialised persistent kernel around the per-rung pieces: ``k_tile`` (one
    k-tile's wgmma on a stage), ``store_acc`` (the epilogue), ``tile_origin`` (the tile
    order), ``load_stage`` (the producer's TMA copies of one k-tile; BK elements of K),
    ``finish(acc, maps)`` (applied to a tile's accumulators before the store: FP8 scales)
    and ``add_bias(acc, bias, t, n0, N)`` (``wgmma_async.bias_code``: given, the kernel
    takes the bias right after C; else its arguments are (A, B, C, maps)).  ``b_kmajor``:
    the kernel's B is (N, K) (else (K, N)), which tells how many products a batched launch
    holds: B's rows over one product's.  ``a_layout`` "KM": the kernel's A is (K, M) (the
    memory of a column-major A; ``load_stage`` copies it so): one product per launch."""
    finish = finish or as_accumulated
    dims = a_dims(a_layout)
    BIAS = add_bias is not None
    add_bias = add_bias or no_bias
    CONSUMERS = BM // 64
    NT = 128 * (1 + CONSUMERS)
    ACC = BN // 2                            # fp32 accumulators per consumer thread
    NBARS = 2 * STAGES                       # full[s] = s, empty[s] = STAGES + s
    fill, mma, drain = ring_parts(STAGES, STAGE_BYTES, A_BYTES, load_stage, k_tile, BK)
    fewer, more = register_roles(REGS)
    walk, place = batched_walk(BM, BN, b_kmajor, tile_origin)
    jit_opts = {} if SIMULATOR else {"launch_bounds": (NT, 1)}

    @cuda.jit(**jit_opts)
    def wgmma_ws_kernel(A, B, C, bias, maps):
        early_launch()                       # before any global memory
        sm = cuda.shared.array(0, uint16)
        bars = cuda.shared.array(NBARS, uint64, alignment=BAR_ALIGN)
        t = cuda.threadIdx.x
        wg = t // 128
        a_m, K = dims(A)                     # A's (M, K), given as (M, K) or (K, M)
        N = C.shape[1]
        # A batched launch: several products' A, B and C, each under the previous one's in
        # the same arrays (and maps); the blocks walk every product's tiles in turn
        b_rows, M, per, tiles = walk(a_m, K, N, B.shape[0])
        pad = ((1024 - H.smem_addr(sm, 0) % 1024) % 1024) // 2
        ring = H.smem_addr(sm, pad)
        num_k = (K + BK - 1) // BK
        if t == 0:
            for s in range(STAGES):
                H.mbarrier_init(H.smem_addr(bars, s), 1)             # full: the producer
                H.mbarrier_init(H.smem_addr(bars, STAGES + s), 128 * CONSUMERS)   # empty
            H.fence_mbarrier_init()
        cuda.syncthreads()                   # the last block-wide barrier
        if wg == 0:                          # ---- the producer warpgroup
            fewer()
            if t == 0:
                acquire_maps(maps)
                it = 0
                tile = cuda.blockIdx.x
                while tile < tiles:   # (range()'s trip count: a 64-bit division)
                    product, m0, n0 = place(tile, per, M, N)
                    it = fill(ring, bars, 0, it, 0, num_k, maps, product * M + m0, n0,
                              product * b_rows)
                    tile += cuda.gridDim.x
        else:                                # ---- consumer warpgroups
            more()
            acc = cuda.local.array(ACC, float32)
            slice_ = (wg - 1) * SLICE_BYTES
            it = 0
            tile = cuda.blockIdx.x
            while tile < tiles:   # (range()'s trip count: a 64-bit division)
                product, m0, n0 = place(tile, per, M, N)
                a_row = product * M
                for e in range(ACC):
                    acc[e] = float32(0.0)
                it, _ = mma(ring, bars, 0, acc, slice_, it, 0, 0, num_k, t, 0)
                drain(bars, it, 0, num_k, t, 0)
                finish(acc, maps)
                add_bias(acc, bias, t % 128, n0, N)
                store_acc(C, acc, t % 128, a_row + m0 + 64 * (wg - 1), n0, a_row + M, N)
                tile += cuda.gridDim.x

    return bias_entry(wgmma_ws_kernel, BIAS, jit_opts), NT, STAGES * STAGE_BYTES + 1024


def check_tile(BM: int, BN: int, STAGES: int, REGS=None, b_layout: str = "KN") -> None:
    """The tiles, ring depths and register splits the warp-specialised rungs build.  A
    K-major B ("NK") is one box of BN rows a stage, so BN may be any multiple of 8 (wgmma's
    n): tiles of 80-112 outputs make one wave of a layer that 64 or 128 would leave short;
    a (K, N) B is copied in 64-column panels."""
    step = 8 if b_layout == "NK" else 64
    if BM % 64 or BM > 256 or BN % step or not step <= BN <= 256 or not 2 <= STAGES <= 8:
        raise ValueError(f"BM must be 64, 128, 192 or 256, BN a multiple of {step} up to 256 "
                         f"and STAGES 2..8 (BM={BM}, BN={BN}, STAGES={STAGES})")
    if REGS is not None and 128 * (REGS[0] + BM // 64 * REGS[1]) > 65536:
        raise ValueError(f"setmaxnreg {REGS}: the warpgroups would need more than the "
                         "SM's 65536 registers")


def check_build(precision: str, BM: int, BN: int, STAGES: int, REGS, OUT: str, B_LAYOUT: str,
                A_LAYOUT: str) -> None:
    """The parameter checks of a build of the wgmma_ws family (ws, split-K, TMA store)."""
    check_a_layout(A_LAYOUT, precision)
    check_tile(BM, BN, STAGES, REGS, B_LAYOUT)
    check_out(precision, OUT)
    check_layout(B_LAYOUT)


def persistent_grid(BM: int, BN: int):
    """``grid(M, N, K)``: one block per tile, at most one per SM (the blocks walk the rest)."""
    def grid(M, N, K):
        return (min(cdiv(M, BM) * cdiv(N, BN), backend.device_info().sm_count), 1, 1)

    return grid


def build(precision: str = "fp16", BM: int = 128, BN: int = 256, STAGES: int = 3,
          GROUP_M: int = 8, REGS: tuple | None = (40, 232), OUT: str = "fp32",
          B_LAYOUT: str = "KN", BIAS: bool = False, A_LAYOUT: str = "MK") -> KernelSpec:
    """``OUT``: C as float32, or in the inputs' own 16-bit type (``"fp16"`` / ``"bf16"``,
    rounded to nearest even in the epilogue: ``wgmma_async.out_store``).  ``B_LAYOUT``:
    B as (K, N), or "NK" -- (N, K), an ``nn.Linear`` weight: C = A @ B.T.  ``BIAS``: the
    kernel takes a (1, N) bias after C (a (0, N) one: none), added in fp32 before the store.
    ``A_LAYOUT``: A as (M, K), or "KM" -- its (K, M) row-major memory, a column-major A
    (``X.t()``): C = X.T @ B, A's tile MN-major (wgmma's trans-a; fp16/bf16 only).  A KM
    build has no batched launch."""
    check_build(precision, BM, BN, STAGES, REGS, OUT, B_LAYOUT, A_LAYOUT)
    k_tile, store_acc = warpgroup_code(precision, BN, 1, OUT, B_LAYOUT, A_LAYOUT)
    load_stage, A_BYTES, STAGE_BYTES = tma_loader(BM, BN, B_LAYOUT, A_LAYOUT)
    kernel, NT, SHARED = ws_kernel(BM, BN, BK, STAGES, REGS, k_tile, store_acc,
                                   tile_order(BM, BN, GROUP_M), load_stage, A_BYTES, STAGE_BYTES,
                                   add_bias=bias_code(precision, BN, 1, True) if BIAS else None,
                                   b_kmajor=B_LAYOUT == "NK", a_layout=A_LAYOUT)

    default = (BM, BN, STAGES, GROUP_M, REGS) == (128, 256, 3, 8, (40, 232))
    name = rung_name("wgmma_ws", precision, default, BM, BN, STAGES, GROUP_M)
    name += (regs_suffix(REGS) + out_suffix(OUT) + layout_suffix(B_LAYOUT, A_LAYOUT)
             + bias_suffix(BIAS))
    return KernelSpec(
        early_launch=True,
        name=name,
        idea="a producer warpgroup issues TMA, consumer warpgroups issue wgmma; full and "
             "empty mbarriers per stage; one persistent block per SM walks the tiles",
        kernel=kernel,
        block=(NT, 1, 1),
        tile=(BM, BN),
        grid=persistent_grid(BM, BN),
        params=dict(precision=precision, BM=BM, BN=BN, BK=BK, STAGES=STAGES, GROUP_M=GROUP_M,
                    REGS=REGS, **out_params(OUT), **layout_params(B_LAYOUT, A_LAYOUT),
                    **bias_params(BIAS)),
        shared_bytes=SHARED,
        batched=A_LAYOUT == "MK",            # products one under the other: (M, K) As only
        tma_boxes=tma_boxes(BM, BN, B_LAYOUT, A_LAYOUT),
        tma_swizzle=128,
        ptx_must=(r"wgmma\.mma_async\.sync\.aligned\.m64n\d+k16",
                  r"cp\.async\.bulk\.tensor\.2d", r"mbarrier\.arrive\.shared",
                  r"wgmma\.wait_group\.sync\.aligned 1") + (
            (r"setmaxnreg\.inc",) if REGS else ()) + out_ptx(OUT)
            + layout_ptx(B_LAYOUT, A_LAYOUT),
        **{**spec_fields(precision, __name__), **out_fields(precision, OUT),
           **layout_fields(B_LAYOUT, A_LAYOUT), **bias_fields(BIAS),
           "chapter": "17c-warp-specialisation"},
    )


SPEC = build()
