"""Split-K on Hopper: the persistent warp-specialised kernel walks (tile, slice of K) units.

``wgmma_ws`` gives each SM whole 128 x 256 output tiles.  The GEMMs a model
runs at small batch have few of them: at 16 or 128 tokens a 4096-wide
projection is one row of 16 tiles for a GPU of 132 SMs, and 1024 x 1024 x 8192
is 32 tiles.  Each tile then walks a long K while 100+ SMs idle, and the
product runs at a quarter of what the GPU can do: at M <= 128 it is bounded by
reading B once, which needs every SM's loads in flight.

This rung cuts K: a *unit* of work is one tile and one of S slices of its
k-tiles, so S slices make S times as many units, each S times shorter.  The
persistent blocks walk units instead of tiles; producer and consumers run the
same ring as in ``wgmma_ws``, only over a unit's k-tiles.  Then the slices'
partial tiles must be added, deterministically (the same bits every run):

* **Each consumer thread owns its partials.**  Every unit of a tile leaves
  the same accumulator layout in the same thread numbers, so a thread writes
  its BN/2 fp32 partials to slice z's part of a workspace (16-byte stores,
  laid out so that a warp's stores are contiguous) and takes a ticket: an
  atomic increment of a counter of its own (one per tile and consumer
  thread).  ``threadfence`` before the ticket makes its partials visible
  first.
* **The last of the S threads adds them up**, in slice order 0, 1, ..., S-1
  whichever slice finished last -- so the rounding never depends on timing --
  writes C and sets its counter back to zero for the next launch.  No block
  waits for another, no second kernel is launched, and the workspace is kept
  per plan and stream by ``gemmlib.dispatch`` (allocated once).
* **Only threads that hold rows of C take part**: at M = 16 three of the four
  warps of a 64-row consumer hold only padding rows, and skip the workspace.

S (``SPLITS``, a launch parameter: every S runs the same compiled kernel) is
chosen per shape by :func:`splits_for`: enough units to fill the SMs, slices
of at least MIN_KTILES k-tiles, and workspace traffic small next to the
operands.  S = 1 is ``wgmma_ws`` exactly, with a one-element workspace.  BM =
64 (one consumer warpgroup) halves the rows wasted on padding at decode.

``B_LAYOUT="NK"`` (B as an ``nn.Linear`` weight, (N, K)) and ``BIAS=True`` are
``wgmma_ws``'s options; the bias is added exactly once, by the thread that
finishes a tile's sum (or, at S = 1, holds it), before the rounding into C.  A
bias build takes the bias right after C, then the workspace arrays, then the maps.
``A_LAYOUT="KM"`` (A given as the (K, M) memory of a column-major A) is ``wgmma_ws``'s too.
"""

from __future__ import annotations

import math

from gemmlib import backend
from gemmlib.backend import SIMULATOR, cuda, float32, uint16, uint64
from gemmlib.intrinsics import hopper as H
from gemmlib.intrinsics.hopper import BAR_ALIGN   # a global: numba needs a literal
from gemmlib.intrinsics.index import int64, u32
from gemmlib.intrinsics.vector import load4, store4
from gemmlib.kernels.wgmma_async import (BK, SLICE_BYTES, a_dims, bias_code, bias_entry,
                                         bias_fields, bias_params, bias_suffix,
                                         layout_fields, layout_params, layout_ptx,
                                         layout_suffix, out_fields, out_params, out_ptx,
                                         out_suffix, rung_name, spec_fields, tile_order,
                                         warpgroup_code)
from gemmlib.kernels.wgmma_tma import tma_boxes, tma_loader
from gemmlib.kernels.wgmma_ws import check_build, register_roles, regs_suffix
from gemmlib.kernels.ws_pipeline import acquire_maps, early_launch, ring_parts
from gemmlib.spec import Constraint, KernelSpec, cdiv

#: a slice holds at least this many k-tiles of 64 (shorter ones are mostly fill and drain)
MIN_KTILES = 4
MAX_SPLITS = 32
#: what a unit costs beyond its k-tiles, in k-tiles: filling the ring, the epilogue, the
#: tickets.  Fitted to the H100 sweep (results/tc-shapes-*.json: 2 chose slice counts at
#: 95.7% of the best measured one's speed on average, 8 at 97.7%, 12 and 16 no better)
UNIT_OVERHEAD_KTILES = 8


def splits_for(M: int, N: int, K: int, BM: int, BN: int, dev=None) -> int:
    """The slice count for (M, N, K) in BM x BN tiles: the S with the least modelled time.

    Model (one unit of time: a k-tile of one block, at the tensor cores' rate or at the
    block's share of DRAM bandwidth, whichever is slower):

        main(S) = ceil(tiles * S / SMs) * (ceil(ktiles / S) + UNIT_OVERHEAD_KTILES)
        sums(S) = the workspace traffic, (S + 1) * M * N * 4 bytes, at DRAM bandwidth

    A slice keeps at least MIN_KTILES k-tiles.  The rate and bandwidth come from the
    device (fp16 tensor-core work of a 128 x 256 x 64 k-tile on one SM, ~0.1 us at H100
    rates; the workspace at 60% of DRAM bandwidth).
    """
    dev = dev or backend.device_info()
    ktiles = cdiv(max(K, 1), BK)
    tiles = cdiv(M, BM) * cdiv(N, BN)
    sms = max(dev.sm_count, 1)
    smax = max(1, min(MAX_SPLITS, ktiles // MIN_KTILES))
    if smax == 1 or tiles == 0 or 2 * tiles > sms:
        return 1   # measured: past half the SMs, a second wave of units costs more than idle SMs
    # one k-tile of one block: 2*BM*BN*64 flops at the SM's share of the dense fp16 rate
    tc_flops = max(getattr(dev, "fp32_peak_tflops", 60.0), 1.0) * 1e12 * 15 / sms
    step_s = 2.0 * BM * BN * BK / tc_flops
    # ...or the bytes of the k-tile at the SM's share of DRAM bandwidth, whichever is longer
    bw = max(getattr(dev, "peak_bandwidth_gbs", 1000.0), 100.0) * 1e9 * 0.6
    step_s = max(step_s, (BM * BK + BK * BN) * 2 / (bw / sms))
    rows = min(M, BM * cdiv(M, BM))

    def cost(s):
        waves = math.ceil(tiles * s / sms)
        t = waves * (cdiv(ktiles, s) + UNIT_OVERHEAD_KTILES) * step_s
        if s > 1:
            t += (s + 1) * rows * N * 4 / bw
        return t

    return min(range(1, smax + 1), key=lambda s: (cost(s), s))


def effective_splits(S: int, K: int) -> int:
    """Slices that all hold at least one k-tile under the kernel's rule (per = ceil(kt/S))."""
    ktiles = cdiv(max(K, 1), BK)
    S = max(1, min(S, ktiles))
    return cdiv(ktiles, cdiv(ktiles, S))


#: what a narrower tile costs, in its width's units: each tile streams its share of the
#: other operand once, so a tile BN wide does BN / (BN + FIT_OVERHEAD) of a wide one's work
#: per byte streamed
FIT_OVERHEAD = 32


def widest_fill(widths, busy) -> int:
    """The width of ``widths`` whose share of busy SMs (``busy(width)``), weighed by
    width / (width + FIT_OVERHEAD), is highest; ties go to the wider (the fitted tiles of
    :func:`fit_columns` and ``wgmma_swap.fit_width``)."""
    return max(widths, key=lambda w: (busy(w) * w / (w + FIT_OVERHEAD), w))


def wave_fill(M: int, N: int, BM: int, BN: int, sms: int) -> float:
    """The share of SM slots that the BM x BN tiles of an M x N output use over their
    waves on ``sms`` SMs (1.0: whole waves)."""
    tiles = cdiv(M, BM) * cdiv(N, BN)
    return tiles / (sms * cdiv(tiles, sms))


def fit_columns(M: int, N: int, K: int, BM: int, sms: int) -> int:
    """The tile width (outputs per tile: a multiple of 8 from 64 to 256, for a K-major B)
    whose BM x BN tiles fill the SMs best in whole waves (:func:`widest_fill`).  cuBLAS's
    kernels at serving sizes do this (80-, 96-, 112-wide tiles:
    results/ncu-serving-2026-11-27/): at 512 tokens on a 4608-output layer, 128 x 256 tiles
    make 72 (0.55 of a wave on 132 SMs), 128 x 144 make 128."""
    return widest_fill(range(64, 257, 8), lambda BN: wave_fill(M, N, BM, BN, sms))


#: 16-byte groups summed together: their loads of one slice are all in flight at once.
#: Measured on an H100 (results/splitk-sum-2026-11-25/h100.json): kernel time at 16x4096x4096 was
#: 44.7/32.4/29.6/29.1 us for 1/4/8/16 groups (cuBLAS 21.6 us); registers stay 232
SUM_GROUPS = 16


def sum_source(quads: int, nc: int, groups: int = SUM_GROUPS) -> str:
    """Source of ``sum_slices(W, acc, base, S)``: acc[e] = W[0][e] + W[1][e] + ... in slice
    order, written out so that every accumulator index is a constant (``acc`` stays in
    registers).

    The loop over slices is outermost within a chunk of ``groups`` 16-byte groups, and the
    chunk's loads of one slice come before their adds: a slice costs one trip to L2 per
    chunk, not one per group.  (Loads and adds per group, slice by slice, left a single
    load in flight: at S = 8 and 32 groups that was 256 round trips for the last thread
    of a tile, measured as most of the kernel at 16 tokens.)  The order of each element's
    additions, and so every bit of the result, is the same either way."""
    lines = ["def sum_slices(W, acc, base, S):"]
    for c0 in range(0, quads, groups):
        qs = range(c0, min(quads, c0 + groups))
        off = {q: f"4 * (base + {q * nc})" for q in qs}
        for q in qs:
            lines.append(f"    a{q}_0, a{q}_1, a{q}_2, a{q}_3 = load4(W, 0, {off[q]})")
        lines.append("    for s in range(1, S):")
        for q in qs:
            lines.append(f"        b{q}_0, b{q}_1, b{q}_2, b{q}_3 = load4(W, s, {off[q]})")
        for q in qs:
            lines += [f"        a{q}_{i} += b{q}_{i}" for i in range(4)]
        for q in qs:
            lines += [f"    acc[{4 * q + i}] = a{q}_{i}" for i in range(4)]
    return "\n".join(lines) + "\n"


def _sum_slices(quads: int, nc: int, groups: int = SUM_GROUPS):
    src = sum_source(quads, nc, groups)
    ns = {"load4": load4}
    exec(compile(src, "<gemmlib.wgmma_split_k sum_slices>", "exec"), ns)  # noqa: S102
    f = ns["sum_slices"] if SIMULATOR else cuda.jit(device=True)(ns["sum_slices"])
    f.__source__ = src
    return f


@cuda.jit(device=True)
def slice_walk(j, S, tiles, num_k):
    """Unit j of this block (the persistent blocks take units blockIdx.x, + gridDim.x, ...;
    unit u is slice u % S of tile u // S): (tile, k0, k1, slice, slices), tile -1 past
    the last.  Slice z holds k-tiles [z * per, (z + 1) * per), per = ceil(num_k / S)."""
    unit = cuda.blockIdx.x + j * cuda.gridDim.x
    if unit >= tiles * S:
        return -1, 0, 0, 0, S
    per = int64(u32(num_k + S - 1) // u32(S))
    z = int64(u32(unit) % u32(S))
    return int64(u32(unit) // u32(S)), z * per, min(num_k, (z + 1) * per), z, S


@cuda.jit(device=True)
def owner(i, G, T):
    """The block whose share holds k-iteration i of T (block c's: [c T / G, (c + 1) T / G))."""
    return int64(u32((i + 1) * G - 1) // u32(T))


@cuda.jit(device=True)
def stream_k_walk(j, S, tiles, num_k):
    """Stream-K: the tiles' k-tiles in a row, T = tiles * num_k iterations, block c takes
    [c T / G, (c + 1) T / G) of them, G = gridDim.x -- every block the same share to
    within one k-tile, whatever the tile count.  Its j-th unit is the part of that range
    in its j-th tile: (tile, k0, k1, piece, pieces), the piece's index among the blocks
    that share the tile (in block order) and how many there are; tile -1 past the last."""
    G = cuda.gridDim.x
    T = tiles * num_k                    # (G T < 2^32: stream_walk_fits)
    c = cuda.blockIdx.x
    start = int64(u32(c * T) // u32(G))
    end = int64(u32((c + 1) * T) // u32(G))
    tile = int64(u32(start) // u32(num_k)) + j
    first = tile * num_k
    if start >= end or first >= end:
        return -1, 0, 0, 0, 1
    k0 = max(start, first) - first
    k1 = min(end - first, num_k)
    lead = owner(first, G, T)
    return tile, k0, k1, c - lead, owner(first + num_k - 1, G, T) - lead + 1


def stream_walk_fits(work) -> Constraint:
    """The constraint of a stream-K build: :func:`stream_k_walk` divides in 32 bits
    (:mod:`gemmlib.intrinsics.index`), so ``work(M, N, K)`` -- the k-tiles of all tiles
    times the blocks sharing them -- must stay under 2^32."""
    return Constraint("32-bit stream-K walk", lambda spec, M, N, K, dev: work(M, N, K) < 2 ** 32,
                      "the blocks times all tiles' k-tiles must stay under 2^32 (the walk "
                      "divides in 32 bits); use a sliced or whole-tile build")


def stream_k_pieces(tiles: int, num_k: int, G: int) -> int:
    """The most blocks one tile's k-tiles are shared by in :func:`stream_k_walk`."""
    T = tiles * num_k
    if T == 0:
        return 1

    def own(i):
        return ((i + 1) * G - 1) // T

    return max(own(t * num_k + num_k - 1) - own(t * num_k) + 1 for t in range(tiles))


def split_kernel(BM: int, BN: int, STAGES: int, REGS, SUM: int, k_tile, store_acc,
                 add_bias, tile_origin, load_stage, A_BYTES: int, STAGE_BYTES: int, dims,
                 c_cols, jit_name: str = "wgmma_split_k_kernel", stream_k: bool = False,
                 KT: int = BK):
    """The persistent split-K kernel ``kernel(A, B, C, bias, W, L, maps)`` around its
    per-build pieces: ``k_tile``, ``load_stage`` (the ring's wgmma and TMA copies),
    ``store_acc(C, acc, t, m0, n0, M, N)`` and ``add_bias(acc, bias, t, m0, n0, M, N)``
    (the epilogue of a finished tile, in the kernel's (M, N)), ``tile_origin`` (the tile
    order), ``dims(A) -> (M, K)`` and ``c_cols(B, C) -> N`` (the kernel's N: C's columns,
    or -- ``wgmma_swap``, whose C is the kernel's product transposed -- B's rows).
    ``stream_k``: the blocks' work is the walk of :func:`stream_k_walk` (even shares of all
    tiles' k-tiles) instead of S slices per tile (:func:`slice_walk`); W's rows are then
    the most pieces a tile can be cut into.  ``KT``: the k elements one stage holds (a
    multiple of 64: ``load_stage`` copies and ``k_tile`` computes them all).
    Returns (kernel, threads, shared bytes, the workspace function of (M, N, K, S))."""
    CONSUMERS = BM // 64
    NT = 128 * (1 + CONSUMERS)
    NC = 128 * CONSUMERS                      # consumer threads: one ticket counter each
    ACC = BN // 2
    QUADS = ACC // 4                          # 16-byte groups of a thread's accumulators
    sum_slices = _sum_slices(QUADS, NC, SUM)
    SHARED = STAGES * STAGE_BYTES + 1024
    NBARS = 2 * STAGES                       # full[s] = s, empty[s] = STAGES + s
    fill, mma, drain = ring_parts(STAGES, STAGE_BYTES, A_BYTES, load_stage, k_tile, KT)
    fewer, more = register_roles(REGS)
    jit_opts = {} if SIMULATOR else {"launch_bounds": (NT, 1)}

    unit_at = stream_k_walk if stream_k else slice_walk

    @cuda.jit(device=True)
    def add_slices(W, L, acc, tile, z, tc, S):
        """Leave this thread's partials in slice z of W; True for the thread that took the
        tile's last ticket, which then holds the slices' sum (in slice order) in ``acc``."""
        base = tile * QUADS * NC + tc
        for q in range(QUADS):
            store4(W, z, 4 * (base + q * NC), acc[4 * q], acc[4 * q + 1], acc[4 * q + 2],
                   acc[4 * q + 3])
        cuda.threadfence()                   # the partials are visible before the ticket
        if cuda.atomic.add(L, (tile, tc), 1) != S - 1:
            return False
        cuda.threadfence()
        sum_slices(W, acc, base, S)
        L[tile, tc] = 0                      # ready for the next launch
        return True

    def wgmma_split_k_kernel(A, B, C, bias, W, L, maps):
        early_launch()                       # before any global memory
        sm = cuda.shared.array(0, uint16)
        bars = cuda.shared.array(NBARS, uint64, alignment=BAR_ALIGN)
        t = cuda.threadIdx.x
        wg = t // 128
        M, K = dims(A)                       # A given as (M, K) or (K, M)
        N = c_cols(B, C)
        S = W.shape[0]                       # the slices: a launch choice, not compiled in
        pad = ((1024 - H.smem_addr(sm, 0) % 1024) % 1024) // 2
        ring = H.smem_addr(sm, pad)
        tiles = ((M + BM - 1) // BM) * ((N + BN - 1) // BN)
        num_k = (K + KT - 1) // KT
        if t == 0:
            for s in range(STAGES):
                H.mbarrier_init(H.smem_addr(bars, s), 1)             # full: the producer
                H.mbarrier_init(H.smem_addr(bars, STAGES + s), NC)   # empty: the consumers
            H.fence_mbarrier_init()
        cuda.syncthreads()
        if wg == 0:                          # ---- the producer warpgroup
            fewer()
            if t == 0:
                acquire_maps(maps)
                it = 0
                j = 0
                while True:
                    tile, k0, k1, z, pieces = unit_at(j, S, tiles, num_k)
                    if tile < 0:
                        break
                    j += 1
                    m0, n0 = tile_origin(tile, M, N)
                    it = fill(ring, bars, 0, it, k0, k1, maps, m0, n0, 0)
        else:                                # ---- consumer warpgroups
            more()
            acc = cuda.local.array(ACC, float32)
            slice_ = (wg - 1) * SLICE_BYTES
            tc = t - 128
            it = 0
            j = 0
            while True:
                tile, k0, k1, z, pieces = unit_at(j, S, tiles, num_k)
                if tile < 0:
                    break
                j += 1
                m0, n0 = tile_origin(tile, M, N)
                for e in range(ACC):
                    acc[e] = float32(0.0)
                it, _ = mma(ring, bars, 0, acc, slice_, it, 0, k0, k1, t, 0)
                drain(bars, it, k0, k1, t, 0)
                rows0 = m0 + 64 * (wg - 1)
                # this thread's first row of C (H.accumulator_coords): past M it holds none
                mine = rows0 + 16 * ((t % 128) // 32) + (t % 32) // 4 < M
                if pieces > 1 and mine:
                    mine = add_slices(W, L, acc, tile, z, tc, pieces)
                if mine:                     # the tile's sum is final here: bias once
                    add_bias(acc, bias, t % 128, rows0, n0, M, N)
                    store_acc(C, acc, t % 128, rows0, n0, M, N)

    wgmma_split_k_kernel.__name__ = wgmma_split_k_kernel.__qualname__ = jit_name
    kernel = cuda.jit(**jit_opts)(wgmma_split_k_kernel)

    def workspace(M, N, K, S):
        """(rows, cols, dtype) of W (partials, one row per slice) and L (tickets)."""
        if S == 1:
            return ((1, 4, "float32"), (1, 1, "int32"))
        tiles = cdiv(M, BM) * cdiv(N, BN)
        return ((S, tiles * ACC * NC, "float32"), (tiles, NC, "int32"))

    return kernel, NT, SHARED, workspace


def column_bias(add_bias):
    """``add_bias(acc, bias, t, m0, n0, M, N)`` of a (1, N) bias from
    ``wgmma_async.bias_code``'s ``(acc, bias, t, n0, N)``."""
    @cuda.jit(device=True)
    def add_column_bias(acc, bias, t, m0, n0, M, N):
        add_bias(acc, bias, t, n0, N)

    return add_column_bias


@cuda.jit(device=True)
def c_columns(B, C):
    """The kernel's N: C's columns."""
    return C.shape[1]


def build(precision: str = "fp16", BM: int = 128, BN: int = 256, STAGES: int = 3,
          GROUP_M: int = 8, REGS: tuple | None = (40, 232), SPLITS: int = 0,
          SUM: int = SUM_GROUPS, OUT: str = "fp32", B_LAYOUT: str = "KN",
          BIAS: bool = False, A_LAYOUT: str = "MK", STREAM: bool = False,
          GRID: int = 0) -> KernelSpec:
    """``STREAM``: the blocks share all tiles' k-tiles evenly (:func:`stream_k_walk`) instead
    of taking S slices per tile; ``GRID`` (a launch choice) is then their number (0: one per
    SM) and ``SPLITS`` is not used.  ``OUT``: C as float32, or in the inputs' own 16-bit type (``"fp16"`` / ``"bf16"``):
    the last slice's thread rounds the slices' float32 sum once, in ``wgmma_ws``'s 16-bit
    epilogue (``wgmma_async.out_store``).  ``B_LAYOUT``, ``BIAS``: as ``wgmma_ws``'s; the
    bias is added once, by the thread that finishes the slices' sum, before that rounding.
    ``A_LAYOUT``: as ``wgmma_ws``'s ("KM": A given as (K, M), a column-major A)."""
    check_build(precision, BM, BN, STAGES, REGS, OUT, B_LAYOUT, A_LAYOUT)
    k_tile, store_acc = warpgroup_code(precision, BN, 1, OUT, B_LAYOUT, A_LAYOUT)
    load_stage, A_BYTES, STAGE_BYTES = tma_loader(BM, BN, B_LAYOUT, A_LAYOUT)
    jit_opts = {} if SIMULATOR else {"launch_bounds": (128 * (1 + BM // 64), 1)}
    kernel, NT, SHARED, work = split_kernel(
        BM, BN, STAGES, REGS, SUM, k_tile, store_acc,
        column_bias(bias_code(precision, BN, 1, BIAS)), tile_order(BM, BN, GROUP_M),
        load_stage, A_BYTES, STAGE_BYTES, a_dims(A_LAYOUT), c_columns, stream_k=STREAM)
    wgmma_split_k_kernel = bias_entry(kernel, BIAS, jit_opts)

    def slices(M, N, K):
        S = SPLITS or splits_for(M, N, K, BM, BN)
        return effective_splits(S, K)

    def blocks(M, N, K):   # STREAM: the blocks sharing the k-tiles
        iters = cdiv(M, BM) * cdiv(N, BN) * cdiv(max(K, 1), BK)
        return max(1, min(GRID or backend.device_info().sm_count, iters))

    def grid(M, N, K):
        if STREAM:
            return (blocks(M, N, K), 1, 1)
        units = cdiv(M, BM) * cdiv(N, BN) * slices(M, N, K)
        return (min(units, backend.device_info().sm_count), 1, 1)

    def workspace(M, N, K):
        if STREAM:
            return work(M, N, K, stream_k_pieces(cdiv(M, BM) * cdiv(N, BN),
                                                 cdiv(max(K, 1), BK), blocks(M, N, K)))
        return work(M, N, K, slices(M, N, K))

    fields = {**spec_fields(precision, __name__), **out_fields(precision, OUT),
              **layout_fields(B_LAYOUT, A_LAYOUT), **bias_fields(BIAS),
              "chapter": "18d-wgmma-split-k"}
    if STREAM:
        fields["constraints"] += (stream_walk_fits(
            lambda M, N, K: cdiv(M, BM) * cdiv(N, BN) * cdiv(max(K, 1), BK) * blocks(M, N, K)),)
    default = (BM, BN, STAGES, GROUP_M, REGS) == (128, 256, 3, 8, (40, 232))
    name = rung_name("wgmma_split_k", precision, default, BM, BN, STAGES, GROUP_M)
    name += regs_suffix(REGS)
    if SPLITS:
        name += f"_k{SPLITS}"
    if SUM != SUM_GROUPS:
        name += f"_g{SUM}"
    if STREAM:
        name += "_stream" + (f"{GRID}" if GRID else "")
    name += out_suffix(OUT) + layout_suffix(B_LAYOUT, A_LAYOUT) + bias_suffix(BIAS)
    return KernelSpec(
        early_launch=True,
        name=name,
        idea="wgmma_ws's persistent blocks walk (tile, slice of K) units; each consumer "
             "thread leaves its partials in a workspace and the last of a tile's slices "
             "adds them in slice order (deterministic, no second kernel)",
        kernel=wgmma_split_k_kernel,
        block=(NT, 1, 1),
        tile=(BM, BN),
        grid=grid,
        params=dict(precision=precision, BM=BM, BN=BN, BK=BK, STAGES=STAGES, GROUP_M=GROUP_M,
                    REGS=REGS, SPLITS=SPLITS, SUM=SUM, **out_params(OUT),
                    **layout_params(B_LAYOUT, A_LAYOUT), **bias_params(BIAS),
                    **({"STREAM": True, "GRID": GRID} if STREAM else {})),
        shared_bytes=SHARED,
        tma_boxes=tma_boxes(BM, BN, B_LAYOUT, A_LAYOUT),
        tma_swizzle=128,
        launch_only=("SPLITS", "GRID"),
        workspace=workspace,
        workspace_dtypes=("float32", "int32"),
        ptx_must=(r"wgmma\.mma_async\.sync\.aligned\.m64n\d+k16",
                  r"cp\.async\.bulk\.tensor\.2d", r"atom\.global\.add",
                  r"membar\.gl|fence\.sc\.gpu|fence\.acq_rel\.gpu") + (
            (r"setmaxnreg\.inc",) if REGS else ()) + out_ptx(OUT)
            + layout_ptx(B_LAYOUT, A_LAYOUT),
        **fields,
    )


SPEC = build()
