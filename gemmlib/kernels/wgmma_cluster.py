"""Clusters: two blocks share one copy of B -- a TMA multicast into both -- halving B's traffic.

In ``wgmma_ws`` every block fetches its own A and B k-tiles from L2: 128 x 64
of A and 64 x 256 of B per k-tile, 48 KiB for 4.2 MFLOP.  At the rate the
tensor cores want (about 7.5 TFLOP/s per SM) that is some 85 GB/s per SM,
11 TB/s for the GPU: L2 cannot serve it, and its Nsight profile shows the L2
at two thirds of its throughput while the tensor cores wait.  But two blocks
whose tiles sit one above the other (same columns, rows m0 and m0 + BM) read
*the same* B k-tiles.  Hopper lets them share:

* **A cluster of CM blocks** (``CM = 2`` here, launched with
  ``cuLaunchKernelEx``'s cluster attribute) runs at the same time on SMs of
  one GPC, and each block can signal the others' mbarriers.  The cluster
  walks *super-tiles* of (CM * BM) x BN in grouped order (``tile_order`` of the
  taller tile): block ``rank`` computes rows ``m0 + rank * BM``.
* **Multicast.**  For each k-tile, block ``rank`` copies its own A box and
  only B panels ``rank, rank + CM, ...``, each with
  ``cp.async.bulk.tensor ... .multicast::cluster``: the panel leaves L2 once and
  lands in every block of the cluster at the same shared offset, counting its
  bytes on each block's *full* barrier at the same offset.  So each block
  still announces a whole stage (``expect_tx``: A + all of B), but copies
  only 16 + 32/CM KiB of it: 32 KiB per k-tile for CM = 2, a third less.
* **The empty barrier spans the cluster.**  My producer writes into my
  peers' stage s too, so it may refill stage s only when *every* block's
  consumers are done with it: each consumer warpgroup arrives on stage s's
  empty barrier in each block of the cluster (``mapa`` gives the peer's
  address, ``mbarrier.arrive.shared::cluster`` the arrival) -- one arrival per
  warpgroup and block, so the barrier counts ``consumers x CM``.
* **Cluster barriers at both ends.**  After the barriers are initialised, a
  cluster-wide barrier makes them visible to the peers before any copy can
  signal them; at the end, another keeps each block alive until its peers
  are done arriving on its barriers.

Everything else -- the producer warpgroup, the ring, setmaxnreg, persistent
clusters (as many as fit at once: ``cuOccupancyMaxActiveClusters``), the
epilogue from registers -- is ``wgmma_ws``'s.  When M has an odd number of tiles
the last super-tile's second block computes rows past M: its A box is all
zeros (TMA's fill) and its stores are predicated off, but it still copies
and multicasts its B panels, which its peer needs.

In numba's simulator blocks run one after another, so clusters cannot be
simulated: there the rung is built with ``CM = 1`` (a cluster of one block:
multicast to itself, the same barriers and arrivals), which CI checks; the
GPU tests run ``CM = 2``.  A kernel built for CM blocks traps if launched
without its cluster instead of waiting forever for a peer.

``B_LAYOUT="NK"`` (B as an ``nn.Linear`` weight, (N, K)) keeps the 64 x 64 panels:
panel p is then rows n0 + 64 p .. of B, 64 rows of its K-major tile, multicast as
before.  ``BIAS=True`` adds a (1, N) bias before the store, as in ``wgmma_ws``.
"""

from gemmlib import backend
from gemmlib.backend import SIMULATOR, cuda, float32, uint16, uint64
from gemmlib.intrinsics import cluster as CL
from gemmlib.intrinsics import hopper as H
from gemmlib.intrinsics.hopper import BAR_ALIGN   # a global: numba needs a literal
from gemmlib.intrinsics.index import u32
from gemmlib.kernels.wgmma_async import (BK, PANEL_BYTES, SLICE_BYTES, bias_code, bias_entry,
                                         bias_fields, bias_params, bias_suffix, check_layout,
                                         check_out, layout_fields, layout_params, layout_ptx,
                                         layout_suffix, no_bias, out_fields, out_params,
                                         out_ptx, out_suffix, rung_name, spec_fields,
                                         tile_order, warpgroup_code)
from gemmlib.kernels.wgmma_tma import tma_boxes
from gemmlib.kernels.wgmma_ws import as_accumulated, check_tile, register_roles, regs_suffix
from gemmlib.kernels.ws_pipeline import acquire_maps, early_launch, ring_parts
from gemmlib.spec import KernelSpec, cdiv

#: blocks per cluster of the default build: 2 on a GPU, 1 in the simulator (see above)
DEFAULT_CM = 1 if SIMULATOR else 2


def multicast_loader(BM: int, BN: int, CM: int, MULTICAST: bool = True, b_layout: str = "KN"):
    """``load_stage(ring, s, bar, maps, k0, m0, n0, rank)``: block ``rank``'s copies of the
    k-tile at ``k0``: its own A box, and B panels rank, rank + CM, ... multicast to the
    whole cluster.  Announces the whole stage on ``bar`` (the peers' panels count too).

    A panel is a 64 x 64 box either way: 64 k x 64 n of a (K, N) B at (n0 + 64 p, k0), or,
    ``b_layout`` "NK", rows n0 + 64 p .. of a (N, K) B at (k0, n0 + 64 p) -- 64 of the K-major
    tile's 128-byte rows, so the panels one after another are that tile."""
    A_BYTES = BM * BK * 2
    STAGE_BYTES = A_BYTES + BK * BN * 2
    PANELS = BN // 64
    MASK = (1 << CM) - 1                      # every block of the cluster
    NK = b_layout == "NK"

    @cuda.jit(device=True)
    def panel_at(n0, k0, p):
        """(column, row) of B's panel p in B's tensor map."""
        if NK:
            return k0, n0 + 64 * p
        return n0 + 64 * p, k0

    @cuda.jit(device=True)
    def load_stage(ring, s, bar, maps, k0, m0, n0, rank):
        base = ring + s * STAGE_BYTES
        H.mbarrier_expect_tx(bar, STAGE_BYTES)
        H.tma_load_2d(base, maps, k0, m0, bar)
        if MULTICAST:
            for p in range(int(rank), PANELS, CM):
                x, y = panel_at(n0, k0, p)
                CL.tma_load_2d_multicast(base + A_BYTES + p * PANEL_BYTES, maps + uint64(128),
                                         x, y, bar, MASK)
        else:
            for p in range(PANELS):
                x, y = panel_at(n0, k0, p)
                H.tma_load_2d(base + A_BYTES + p * PANEL_BYTES, maps + uint64(128), x, y, bar)

    return load_stage, A_BYTES, STAGE_BYTES


def cluster_kernel(BM: int, BN: int, BK: int, STAGES: int, REGS, CM: int, k_tile, store_acc,
                   super_origin, load_stage, A_BYTES: int, STAGE_BYTES: int, finish=None,
                   ARRIVE: str = "one", add_bias=None):
    """``wgmma_ws``'s kernel for clusters of CM blocks along M (see the module docstring):
    ``super_origin(i, M, N)`` places the cluster's (CM * BM) x BN super-tile ``i``;
    ``add_bias`` as ``wgmma_ws.ws_kernel``'s."""
    finish = finish or as_accumulated
    BIAS = add_bias is not None
    add_bias = add_bias or no_bias
    CONSUMERS = BM // 64
    NT = 128 * (1 + CONSUMERS)
    ACC = BN // 2
    NBARS = 2 * STAGES                       # full[s] = s, empty[s] = STAGES + s
    fewer, more = register_roles(REGS)
    jit_opts = {} if SIMULATOR else {"launch_bounds": (NT, 1)}

    ALL, LOCAL = ARRIVE == "all", ARRIVE == "local"
    ARRIVALS = CONSUMERS * CM * (128 if ALL else 1)

    @cuda.jit(device=True)
    def release(bars, i, t, rank):
        """Stage ``i % STAGES`` is read: thread r < CM of the warpgroup tells block r."""
        bar = H.smem_addr(bars, STAGES + u32(i) % STAGES)
        if ALL:
            for r in range(CM):
                if r == rank:
                    H.mbarrier_arrive(bar)
                else:
                    CL.mbarrier_arrive_peer(CL.peer_address(bar, r))
        else:
            r = t % 128
            if r < CM:
                if LOCAL and r == rank:
                    H.mbarrier_arrive(bar)
                else:
                    CL.mbarrier_arrive_peer(CL.peer_address(bar, r))

    fill, mma, drain = ring_parts(STAGES, STAGE_BYTES, A_BYTES, load_stage, k_tile, BK,
                                  release=release)

    @cuda.jit(**jit_opts)
    def wgmma_cluster_kernel(A, B, C, bias, maps):
        early_launch()                       # before any global memory
        sm = cuda.shared.array(0, uint16)
        bars = cuda.shared.array(NBARS, uint64, alignment=BAR_ALIGN)
        t = cuda.threadIdx.x
        wg = t // 128
        if CL.cluster_blocks() != CM:        # launched without its cluster: no peer
            CL.trap()                        # would ever fill our B panels
        rank = CL.cluster_rank()
        M, K = A.shape
        N = C.shape[1]
        pad = ((1024 - H.smem_addr(sm, 0) % 1024) % 1024) // 2
        ring = H.smem_addr(sm, pad)
        supers = ((M + CM * BM - 1) // (CM * BM)) * ((N + BN - 1) // BN)
        num_k = (K + BK - 1) // BK
        first, step = cuda.blockIdx.x // CM, cuda.gridDim.x // CM
        if t == 0:
            for s in range(STAGES):
                H.mbarrier_init(H.smem_addr(bars, s), 1)                      # full
                H.mbarrier_init(H.smem_addr(bars, STAGES + s), ARRIVALS)  # empty
            H.fence_mbarrier_init()
        CL.cluster_sync()                    # the peers' barriers exist before any copy
        if wg == 0:                          # ---- the producer warpgroup
            fewer()
            if t == 0:
                acquire_maps(maps)
                it = 0
                i = first
                while i < supers:   # (range()'s trip count: a 64-bit division)
                    m0, n0 = super_origin(i, M, N)
                    it = fill(ring, bars, 0, it, 0, num_k, maps, m0 + rank * BM, n0, rank)
                    i += step
        else:                                # ---- consumer warpgroups
            more()
            acc = cuda.local.array(ACC, float32)
            slice_ = (wg - 1) * SLICE_BYTES
            it = 0
            i = first
            while i < supers:   # (range()'s trip count: a 64-bit division)
                m0, n0 = super_origin(i, M, N)
                for e in range(ACC):
                    acc[e] = float32(0.0)
                it, _ = mma(ring, bars, 0, acc, slice_, it, 0, 0, num_k, t, rank)
                drain(bars, it, 0, num_k, t, rank)
                finish(acc, maps)
                add_bias(acc, bias, t % 128, n0, N)
                store_acc(C, acc, t % 128, m0 + rank * BM + 64 * (wg - 1), n0, M, N)
                i += step
        CL.cluster_sync()                    # no block leaves while peers may signal it

    return bias_entry(wgmma_cluster_kernel, BIAS, jit_opts), NT, STAGES * STAGE_BYTES + 1024


def cluster_grid(BM: int, BN: int, CM: int):
    """``grid(M, N, K)``: CM blocks per super-tile, at most as many clusters as SMs / CM
    (``gemmlib.dispatch`` lowers it to the clusters that fit at once on this GPU)."""
    def grid(M, N, K):
        supers = cdiv(M, CM * BM) * cdiv(N, BN)
        return (CM * min(supers, backend.device_info().sm_count // CM), 1, 1)

    return grid


def build(precision: str = "fp16", BM: int = 128, BN: int = 256, STAGES: int = 4,
          GROUP_M: int = 8, REGS: tuple | None = (40, 232), CM: int | None = None,
          MULTICAST: bool = True, ARRIVE: str = "one", OUT: str = "fp32",
          B_LAYOUT: str = "KN", BIAS: bool = False) -> KernelSpec:
    """``OUT``: C as float32, or in the inputs' own 16-bit type; ``B_LAYOUT``, ``BIAS``: as
    ``wgmma_ws``'s."""
    CM = DEFAULT_CM if CM is None else CM
    check_out(precision, OUT)
    check_layout(B_LAYOUT)
    if not MULTICAST and CM != 1:
        raise ValueError("MULTICAST=False (each block copies all of B) needs CM=1")
    check_tile(BM, BN, STAGES, REGS)
    if CM not in (1, 2, 4) or (BN // 64) < CM:
        raise ValueError(f"CM (blocks per cluster) must be 1, 2 or 4 and at most BN/64 "
                         f"(each block multicasts whole 64-column panels of B), got {CM}")
    k_tile, store_acc = warpgroup_code(precision, BN, 1, OUT, B_LAYOUT)
    load_stage, A_BYTES, STAGE_BYTES = multicast_loader(BM, BN, CM, MULTICAST, B_LAYOUT)
    kernel, NT, SHARED = cluster_kernel(BM, BN, BK, STAGES, REGS, CM, k_tile, store_acc,
                                        tile_order(CM * BM, BN, GROUP_M), load_stage,
                                        A_BYTES, STAGE_BYTES, ARRIVE=ARRIVE,
                                        add_bias=bias_code(precision, BN, 1, True) if BIAS
                                        else None)

    default = ((BM, BN, STAGES, GROUP_M, REGS, CM, MULTICAST, ARRIVE)
               == (128, 256, 4, 8, (40, 232), DEFAULT_CM, True, "one"))
    name = rung_name("wgmma_cluster", precision, default, BM, BN, STAGES, GROUP_M)
    if not default:
        name += f"_c{CM}" + regs_suffix(REGS)
        name += ("" if MULTICAST else "_unicast") + ("" if ARRIVE == "one" else f"_{ARRIVE}")
    name += out_suffix(OUT) + layout_suffix(B_LAYOUT) + bias_suffix(BIAS)
    return KernelSpec(
        early_launch=True,
        name=name,
        idea=f"clusters of {CM} blocks along M: each copies its A and 1/{CM} of B's panels, "
             "multicast by TMA into every block of the cluster; empty barriers count the "
             "whole cluster's consumers",
        kernel=kernel,
        block=(NT, 1, 1),
        tile=(BM, BN),
        grid=cluster_grid(BM, BN, CM),
        params=dict(precision=precision, BM=BM, BN=BN, BK=BK, STAGES=STAGES, GROUP_M=GROUP_M,
                    REGS=REGS, CM=CM, MULTICAST=MULTICAST, ARRIVE=ARRIVE,
                    **out_params(OUT), **layout_params(B_LAYOUT), **bias_params(BIAS)),
        shared_bytes=SHARED,
        tma_boxes=tma_boxes(BM),   # B: 64 x 64 panels in either layout (multicast_loader)
        tma_swizzle=128,
        cluster=CM,
        ptx_must=(r"wgmma\.mma_async\.sync\.aligned\.m64n\d+k16",
                  r"cp\.async\.bulk\.tensor\.2d\.shared::cluster\.global\.mbarrier::complete_tx"
                  r"::bytes\.multicast::cluster", r"mapa\.shared::cluster",
                  r"mbarrier\.arrive\.shared::cluster",
                  r"barrier\.cluster\.arrive") + out_ptx(OUT) + layout_ptx(B_LAYOUT),
        **{**spec_fields(precision, __name__), **out_fields(precision, OUT),
           **layout_fields(B_LAYOUT), **bias_fields(BIAS), "chapter": "17e-last-mile"},
    )


SPEC = build()
