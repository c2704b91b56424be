"""Ping-pong: two consumer warpgroups on alternating tiles, one storing while the other computes.

In ``wgmma_ws`` the consumer warpgroups *cooperate* on each tile (64 rows of
it each), so they finish it together and write their accumulators to C
together: while they store, nobody issues wgmma and the tensor cores idle,
once per tile.  The producer has the next tile's k-tiles ready; only the
consumers are busy elsewhere.  This rung changes who owns a tile:

* **A whole tile per consumer, alternating.**  The block's j-th tile (in its
  persistent walk) belongs to consumer ``j % 2``, which holds all of it:
  128 x 128 by default, two m64n128 slices, the same 128 fp32 accumulators
  per thread as a 64 x 256 share of ``wgmma_ws``'s tile.  Tiles half the
  size copy a third more bytes per flop; the bet is that a hidden epilogue
  is worth more.
* **One ring, in tile order.**  The producer is ``wgmma_ws``'s: it copies the
  k-tiles of the block's tiles one after the other.  Consumer c reads the
  k-tiles of its own tiles: its ring position starts at ``c * num_k`` and
  skips the other's ``num_k`` after each tile.  A stage is emptied by one
  warpgroup now, so its *empty* barrier expects 128 arrivals.
* **A full barrier per stage per consumer.**  A consumer that skipped the
  other's k-tiles does not know how far a shared *full* barrier has got: it
  may still be one phase behind (the other's copy landing), and a parity wait
  cannot tell "one phase behind" from "done".  So the producer signals the
  owner's barrier, ``full[c][s]``, and each consumer keeps the parity of its
  next use of each stage in a bit of ``phases``, flipped at each use.  (The
  producer waits on every *empty* phase in order, so one barrier is enough
  there.)
* **The math barrier** (``ORDERED``, CUTLASS's name).  Both consumers may
  have k-tiles ready at once -- the next tile's first ones land while the
  current tile's last are being computed -- and then they would issue
  wgmma in turn and share the tensor cores: both tiles would finish late
  and together, and so would the stores.  A pair of mbarriers makes them
  take turns: consumer c waits on ``turn[c]`` before its first wgmma of a
  tile and arrives on ``turn[1 - c]`` after issuing its last, so the tensor
  cores work on one tile at a time and each store runs under the other
  consumer's wgmma::

                    time -->
      producer      TMA T0     TMA T1     TMA T2     TMA T3      (STAGES k-tiles ahead)
      consumer 0    wgmma T0   store T0   wgmma T2   store T2
      consumer 1    (waits)    wgmma T1   store T1   wgmma T3
      tensor cores  T0         T1         T2         T3

      wgmma_ws:
      consumers     wgmma T0   store T0   wgmma T1   store T1    (tensor cores idle)

  Consumer 0's first wait is for the phase before a fresh barrier's first
  (parity 1): it goes at once, as the producer's first fills do.
  ``ORDERED=False`` leaves the turns out, to measure what they are worth.
* **Registers and stages.**  ``setmaxnreg`` 40 / 232 as in ``wgmma_ws``
  (three warpgroups: 64512 of the SM's 65536); a stage is (BM + BN) x 64
  halves, 32 KiB for 128 x 128, and the ring is by default the deepest that
  fits the 227 KiB a block may have (7 stages): copies run further ahead of
  the consumer that is computing (fewer stages are a build away, to compare).

``B_LAYOUT="NK"`` (B as an ``nn.Linear`` weight) and ``BIAS=True`` are ``wgmma_ws``'s
options; a consumer adds the bias to both 64-row slices of its tile before its store.  So is
a batched launch (products stacked one under the other), walked by ``wgmma_ws``'s
``batched_walk``: a consumer's store stops at its product's last row.
"""

from gemmlib.backend import SIMULATOR, cuda, float32, uint16, uint64
from gemmlib.intrinsics import hopper as H
from gemmlib.intrinsics.hopper import BAR_ALIGN   # a global: numba needs a literal
from gemmlib.kernels.wgmma_async import (BK, bias_code, bias_entry, bias_fields, bias_params,
                                         bias_suffix, check_layout, check_out, layout_fields,
                                         layout_params, layout_ptx, layout_suffix, no_bias,
                                         out_fields, out_params, out_ptx, out_suffix, rung_name,
                                         spec_fields, tile_order, warpgroup_code)
from gemmlib.kernels.wgmma_tma import tma_boxes, tma_loader, wait
from gemmlib.kernels.wgmma_ws import (batched_walk, check_tile, persistent_grid, register_roles,
                                      regs_suffix)
from gemmlib.kernels.ws_pipeline import acquire_maps, early_launch, ring_parts
from gemmlib.spec import KernelSpec

#: dynamic shared memory one block may opt in to on an H100 / H200
SMEM_MAX = 227 * 1024


def deepest_ring(BM: int, BN: int) -> int:
    """The most stages of (BM + BN) x 64 halves (at most 8) that fit SMEM_MAX, with the
    1024 bytes the ring's alignment may take."""
    return min(8, (SMEM_MAX - 1024) // ((BM + BN) * BK * 2))


@cuda.jit(device=True)
def take_own(bars, full, s, it, phases):
    """Wait on my own full barrier of stage ``s`` for the parity of my next use of it (bit s
    of ``phases``, then flipped): the ring's ``take`` for a consumer that skips the other's
    k-tiles."""
    wait(H.smem_addr(bars, full + s), (phases >> s) & 1)
    return phases ^ (1 << s)


def pingpong_kernel(BM: int, BN: int, STAGES: int, REGS, ORDERED: bool, k_tile, store_acc,
                    tile_origin, load_stage, A_BYTES: int, STAGE_BYTES: int, add_bias=None,
                    b_kmajor: bool = False):
    """The persistent kernel: a producer warpgroup and two consumers on alternating tiles
    (``k_tile`` covers a consumer's whole BM x BN tile, ``store_acc`` writes it;
    ``add_bias``, ``b_kmajor`` as ``wgmma_ws.ws_kernel``'s)."""
    walk, place = batched_walk(BM, BN, b_kmajor, tile_origin)
    BIAS = add_bias is not None
    add_bias = add_bias or no_bias
    NT = 128 * 3
    ACC = BM // 64 * BN // 2                 # fp32 accumulators per consumer thread
    EMPTY, TURN = 2 * STAGES, 3 * STAGES     # full[c][s] = c * STAGES + s, empty[s], turn[c]
    NBARS = 3 * STAGES + 2
    fill, mma, drain = ring_parts(STAGES, STAGE_BYTES, A_BYTES, load_stage, k_tile,
                                  EMPTY=EMPTY, take=take_own)
    fewer, more = register_roles(REGS)
    jit_opts = {} if SIMULATOR else {"launch_bounds": (NT, 1)}

    @cuda.jit(**jit_opts)
    def wgmma_pingpong_kernel(A, B, C, bias, maps):
        early_launch()                       # before any global memory
        sm = cuda.shared.array(0, uint16)
        bars = cuda.shared.array(NBARS, uint64, alignment=BAR_ALIGN)
        t = cuda.threadIdx.x
        wg = t // 128
        a_m, K = A.shape
        N = C.shape[1]
        b_rows, M, per, tiles = walk(a_m, K, N, B.shape[0])   # a batch: products stacked
        pad = ((1024 - H.smem_addr(sm, 0) % 1024) % 1024) // 2
        ring = H.smem_addr(sm, pad)
        num_k = (K + BK - 1) // BK
        if t == 0:
            for s in range(STAGES):
                H.mbarrier_init(H.smem_addr(bars, s), 1)             # full[0][s]: the producer
                H.mbarrier_init(H.smem_addr(bars, STAGES + s), 1)    # full[1][s]
                H.mbarrier_init(H.smem_addr(bars, EMPTY + s), 128)   # empty: one consumer
            for c in range(2):
                H.mbarrier_init(H.smem_addr(bars, TURN + c), 128)    # turn[c]: the other one
            H.fence_mbarrier_init()
        cuda.syncthreads()                   # the last block-wide barrier
        if wg == 0:                          # ---- the producer warpgroup
            fewer()
            if t == 0:
                acquire_maps(maps)
                it = 0
                owner = 0                    # the consumer of this tile
                tile = cuda.blockIdx.x
                while tile < tiles:   # (range()'s trip count: a 64-bit division)
                    product, m0, n0 = place(tile, per, M, N)
                    it = fill(ring, bars, owner * STAGES, it, 0, num_k, maps, product * M + m0,
                              n0, product * b_rows)
                    owner ^= 1
                    tile += cuda.gridDim.x
        else:                                # ---- consumers 0 and 1, a tile each in turn
            more()
            c = wg - 1
            acc = cuda.local.array(ACC, float32)
            it = c * num_k                   # my first k-tile's place in the ring
            phases = 0                       # bit s: the parity of my next use of stage s
            j = 0                            # my tiles so far
            tile = cuda.blockIdx.x + c * cuda.gridDim.x
            while tile < tiles:   # (range()'s trip count: a 64-bit division)
                product, m0, n0 = place(tile, per, M, N)
                a_row = product * M
                for e in range(ACC):
                    acc[e] = float32(0.0)
                if ORDERED:                  # my turn: the other has issued its tile
                    wait(H.smem_addr(bars, TURN + c), (j % 2) ^ (1 - c))
                it, phases = mma(ring, bars, c * STAGES, acc, 0, it, phases, 0, num_k, t, 0)
                if ORDERED:                  # the other's turn, while my wgmma finish
                    H.mbarrier_arrive(H.smem_addr(bars, TURN + 1 - c))
                drain(bars, it, 0, num_k, t, 0)
                add_bias(acc, bias, t % 128, n0, N)
                store_acc(C, acc, t % 128, a_row + m0, n0, a_row + M, N)
                it += num_k                  # the other consumer's tile
                j += 1
                tile += 2 * cuda.gridDim.x

    return bias_entry(wgmma_pingpong_kernel, BIAS, jit_opts), NT, STAGES * STAGE_BYTES + 1024


def build(precision: str = "fp16", BM: int = 128, BN: int = 128, STAGES: int | None = None,
          GROUP_M: int = 8, REGS: tuple | None = (40, 232), ORDERED: bool = True,
          OUT: str = "fp32", B_LAYOUT: str = "KN", BIAS: bool = False) -> KernelSpec:
    """``STAGES=None``: the deepest ring that fits (:func:`deepest_ring`).  ``OUT``: C as
    float32, or in the inputs' own 16-bit type; ``B_LAYOUT``, ``BIAS``: as ``wgmma_ws``'s."""
    check_out(precision, OUT)
    check_layout(B_LAYOUT)
    STAGES = STAGES or deepest_ring(BM, BN)
    check_tile(BM, BN, STAGES)
    check_tile(128, BN, STAGES, REGS)        # the registers of two consumer warpgroups
    if BM not in (64, 128) or BM * BN > 128 * 128:
        raise ValueError(f"a consumer's tile is 64 or 128 rows of at most 128 accumulators "
                         f"per thread (64 x 256, 128 x 128), got {BM} x {BN}")
    if STAGES * (BM + BN) * BK * 2 + 1024 > SMEM_MAX:
        raise ValueError(f"{STAGES} stages of {BM + BN} x {BK} halves need more than "
                         f"{SMEM_MAX // 1024} KiB of shared memory")
    k_tile, store_acc = warpgroup_code(precision, BN, BM // 64, OUT, B_LAYOUT)
    load_stage, A_BYTES, STAGE_BYTES = tma_loader(BM, BN, B_LAYOUT)
    add_bias = bias_code(precision, BN, BM // 64, True) if BIAS else None
    kernel, NT, SHARED = pingpong_kernel(BM, BN, STAGES, REGS, bool(ORDERED), k_tile, store_acc,
                                         tile_order(BM, BN, GROUP_M), load_stage, A_BYTES,
                                         STAGE_BYTES, add_bias, B_LAYOUT == "NK")

    default = (BM, BN, STAGES, GROUP_M) == (128, 128, deepest_ring(128, 128), 8)
    name = rung_name("wgmma_pingpong", precision, default, BM, BN, STAGES, GROUP_M)
    name += regs_suffix(REGS)
    if not ORDERED:
        name += "_unordered"
    name += out_suffix(OUT) + layout_suffix(B_LAYOUT) + bias_suffix(BIAS)
    return KernelSpec(
        early_launch=True,
        name=name,
        idea="wgmma_ws with two consumer warpgroups on alternating whole tiles, taking turns "
             "at the tensor cores (ordered by an mbarrier pair): one stores while the other "
             "computes",
        kernel=kernel,
        block=(NT, 1, 1),
        tile=(BM, BN),
        grid=persistent_grid(BM, BN),
        params=dict(precision=precision, BM=BM, BN=BN, BK=BK, STAGES=STAGES, GROUP_M=GROUP_M,
                    REGS=REGS, ORDERED=bool(ORDERED), **out_params(OUT),
                    **layout_params(B_LAYOUT), **bias_params(BIAS)),
        shared_bytes=SHARED,
        batched=True,                        # products one under the other
        tma_boxes=tma_boxes(BM, BN, B_LAYOUT),
        tma_swizzle=128,
        ptx_must=(r"wgmma\.mma_async\.sync\.aligned\.m64n\d+k16",
                  r"cp\.async\.bulk\.tensor\.2d", r"mbarrier\.arrive\.shared",
                  r"wgmma\.wait_group\.sync\.aligned 1") + (
            (r"setmaxnreg\.inc",) if REGS else ()) + out_ptx(OUT) + layout_ptx(B_LAYOUT),
        **{**spec_fields(precision, __name__), **out_fields(precision, OUT),
           **layout_fields(B_LAYOUT), **bias_fields(BIAS), "chapter": "17e-last-mile"},
    )


SPEC = build()
