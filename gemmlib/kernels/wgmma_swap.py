"""Swap-AB: at a few tokens, let the weight fill wgmma's 64-row side.

A wgmma is 64 rows by n columns, n any multiple of 8 from 8 to 256.  At decode
and in small prefill chunks, C = X @ W has M = 1-64 rows (tokens) and N in the
thousands (a layer's outputs): a 64- or 128-row tile computes mostly padding,
and its wide B tile (64 x 256 halves, 32 KiB a stage) leaves room for only a
few stages of the ring that must keep the weight streaming.

Transposed, the product is C^T = W^T X^T: the weight's N outputs become the
rows (64 per consumer warpgroup, all of them real) and the tokens become the
columns, an n as narrow as the batch (``BN`` = 8, 16, 32 or 64).  A stage is
then small -- 8 KiB of weight and 1-8 KiB of tokens for BM = 64 -- and the
ring can be 8-16 stages deep, the bytes in flight a bandwidth-bound product
needs (cuBLAS picks such kernels here: ``nvjet_sm90_hsh_128x16_64x11``, 16
columns and 11 stages).

Everything else is ``wgmma_split_k``'s kernel (:func:`~gemmlib.kernels.wgmma_split_k.split_kernel`),
with the operands exchanged:

* the kernel's A is the weight: an ``nn.Linear`` weight (N, K) is K-major, as
  wgmma reads A without transposing (``B_LAYOUT="NK"``: the caller's ``W.t()``);
  a (K, N) B is its (K, M)-memory form, read with trans-a (``"KN"``);
* the kernel's B is X (M, K): K-major, wgmma's own B layout;
* the epilogue writes accumulator (row r, column c) -- weight output r, token c
  -- to ``C[c, r]`` (:func:`swapped_store_source`), and a bias is one value per
  kernel row (:func:`row_bias_source`).

The runtime exchanges the pointers (``KernelSpec.swap_ab``): callers see an
ordinary (M, N, K) product.

**Stream-K.**  At a few tokens the product is a stream of the weight, and every
SM should read its share of it: but a 4608-output layer has 72 tiles of 64
rows, and whole tiles (or S equal slices of each) leave SMs idle or a last wave
part-empty -- in the H100 sweep, 96 tiles on 132 SMs ran at 83% of cuBLAS
whole and 69% cut in two (192 units: two waves).  So the blocks do not take
tiles: all tiles' k-tiles are laid in a row and block c of G takes the c-th
G-th of them (``wgmma_split_k.stream_k_walk``), crossing tile boundaries;
a tile shared by several blocks is finished by ``wgmma_split_k``'s tickets,
its pieces added in block order (deterministic).
"""

from __future__ import annotations

from functools import lru_cache

from gemmlib import backend
from gemmlib.backend import SIMULATOR, cuda, float32
from gemmlib.intrinsics.index import uidx
from gemmlib.kernels.wgmma_async import (BK, HOPPER_ONLY, K_SIXTEEN_BYTE_ROWS, SIXTEEN_BYTE_ROWS,
                                         a_dims, bias_entry, bias_fields, bias_params, bias_suffix,
                                         check_layout, check_out, compile_sources, out_fields,
                                         out_params, out_suffix, spec_fields, tile_order,
                                         warpgroup_code)
from gemmlib.kernels.wgmma_split_k import (SUM_GROUPS, split_kernel, stream_k_pieces,
                                           stream_walk_fits, widest_fill)
from gemmlib.kernels.wgmma_tma import tma_boxes, tma_loader
from gemmlib.kernels.wgmma_ws import regs_suffix
from gemmlib.spec import KernelSpec, cdiv

#: the token widths built (wgmma's n): a call takes the narrowest that holds its M
WIDTHS = (8, 16, 32, 64)
#: shared memory the ring may fill (the SM's 227 KiB less the alignment pad)
RING_BYTES = 200 * 1024
MAX_STAGES = 16


def width_for(M: int) -> int:
    """The narrowest token width (BN) of :data:`WIDTHS` that holds M tokens (the widest past it)."""
    for w in WIDTHS:
        if M <= w:
            return w
    return WIDTHS[-1]


def stages_for(BM: int, BN: int, KT: int = BK) -> int:
    """The deepest ring of BM x KT weight and BN x KT token stages that fits RING_BYTES."""
    return max(2, min(MAX_STAGES, RING_BYTES // (2 * KT * (BM + BN))))


def wide_stages(BM: int, BN: int, a_layout: str, k_tile):
    """(load_stage, k_tile, A_BYTES, STAGE_BYTES) of stages two k-tiles deep (KT = 128):
    each weight row's 256 bytes of a stage are copied back to back (two 64-wide boxes, the
    128-byte swizzle's widest), and the stage's wgmmas run over both halves."""
    from gemmlib.backend import uint64
    from gemmlib.intrinsics import hopper as H
    from gemmlib.kernels.wgmma_tma import a_loader

    load_a = a_loader(BM, a_layout)
    A_HALF, B_HALF = BM * BK * 2, BN * BK * 2
    A_BYTES, STAGE_BYTES = 2 * A_HALF, 2 * (A_HALF + B_HALF)

    @cuda.jit(device=True)
    def load_stage(ring, s, bar, maps, k0, m0, n0, b_row):
        base = ring + s * STAGE_BYTES
        H.mbarrier_expect_tx(bar, STAGE_BYTES)
        load_a(base, maps, k0, m0, bar)
        load_a(base + A_HALF, maps, k0 + BK, m0, bar)
        H.tma_load_2d(base + A_BYTES, maps + uint64(128), k0, b_row + n0, bar)
        H.tma_load_2d(base + A_BYTES + B_HALF, maps + uint64(128), k0 + BK, b_row + n0, bar)

    @cuda.jit(device=True)
    def k_tiles(a, b, acc):
        k_tile(a, b, acc)
        k_tile(a + A_HALF, b + B_HALF, acc)

    return load_stage, k_tiles, A_BYTES, STAGE_BYTES


#: the launch model of :func:`plan_for`: fixed cost per launch (us), the DRAM bandwidth a
#: stream of the weight reaches (of the peak), and one SM's share past which its own
#: loads limit it (of the GPU's bandwidth / SMs).  Fitted to the H100 sweep
#: (results/swap-2026-11-27/): at M = 1-16 one block per SM moved at most ~24.5 GB/s, the
#: whole GPU ~2.75 TB/s on the largest layers
LAUNCH_US = 4.0
STREAM_OF_PEAK = 0.82
SM_SHARE = 1.18
#: a block count that cuts tiles at uneven k-tiles costs more (its pieces' partial sums are
#: fenced mid-stream): this much, over (tiles per block + 1)
UNEVEN_COST = 0.5
#: 128 weight rows per tile ran 4-9% slower than 64 at the same block count (H100 sweep)
BM128_COST = 1.06


def even_counts(tiles: int, K: int, sms: int) -> set:
    """Block counts (at most ``sms``) that share ``tiles`` evenly: whole tiles per block (a
    divisor of the tile count), or each tile in S equal pieces of at least 128 k."""
    even = {tiles // d for d in range(1, tiles + 1) if tiles % d == 0 and tiles // d <= sms}
    return even | {tiles * s for s in range(2, 17) if tiles * s <= sms and K >= 128 * s}


@lru_cache(maxsize=4096)
def fit_width(M: int, N: int, K: int, BM: int, sms: int) -> int:
    """The token width (a multiple of 8 up to 256) whose BM x BN tiles keep the most SMs
    busy (``wgmma_split_k.widest_fill``): M tokens cut into t equal tiles of BN = M / t
    (rounded up to 8), the tiles shared evenly by :func:`even_counts` blocks.  At 512 tokens
    on a 4608-output layer, 128 x 128 tiles make 144 (two rounds on 132 SMs: 55% busy)
    where 128 x 176 make 108 (82%)."""
    widths = {8 * cdiv(cdiv(M, t), 8) for t in range(cdiv(M, 256), cdiv(M, 8) + 1)}
    return widest_fill(widths, lambda BN: max(even_counts(cdiv(N, BM) * cdiv(M, BN), K,
                                                          sms)) / sms)


def even_grid(M: int, N: int, K: int, BM: int, BN: int, dev=None) -> int:
    """The most blocks of :func:`even_counts` for the caller's (M, N, K) in BM x BN tiles."""
    dev = dev or backend.device_info()
    return max(even_counts(cdiv(N, BM) * cdiv(M, BN), K, max(dev.sm_count, 1)))


def plan_for(M: int, N: int, K: int, dev=None) -> tuple[int, int]:
    """(BM, GRID) for the caller's (M, N, K): the weight rows per tile and the block count
    with the least modelled time.  The counts tried share the tiles evenly -- whole tiles
    per block (a divisor of the tile count) or each tile in S equal pieces (S times the
    tile count) -- or are one block per SM, stream-K at uneven cuts; the time of a count is
    ``LAUNCH_US`` + the longer of a block's bytes at one SM's rate and all bytes at the
    stream's rate, uneven cuts dearer by ``UNEVEN_COST / (tiles per block + 1)``, 128-row
    tiles by ``BM128_COST``."""
    dev = dev or backend.device_info()
    sms = max(dev.sm_count, 1)
    bw = max(dev.peak_bandwidth_gbs, 100.0) * 1e3 * STREAM_OF_PEAK     # bytes per us
    per_sm = bw * SM_SHARE / sms
    BN = width_for(M)
    best = None
    for BM in (64, 128):
        tiles = cdiv(N, BM) * cdiv(M, BN)
        tile_bytes = 2 * K * BM                  # the weight's (the tokens stay in L2)
        total = 2 * (N * K + M * K + M * N)
        options = [(g, 0.0) for g in even_counts(tiles, K, sms)] + [(min(sms, tiles * cdiv(K, 64)), UNEVEN_COST)]
        for g, cost in options:
            per_block = tiles / g
            t = LAUNCH_US + max(tile_bytes * per_block / per_sm, total / bw) * (
                1 + cost / (per_block + 1)) * (BM128_COST if BM == 128 else 1.0)
            key = (t, BM, -g)
            if best is None or key < best[0]:
                best = (key, BM, g)
    return best[1], best[2]


def blocks_for(M: int, N: int, K: int, BM: int, BN: int, GRID: int = 0, KT: int = BK) -> int:
    """The blocks that share the caller's (M, N, K) stage by stage (stream-K): one per SM
    (``GRID``, if given), never more than there are stages of KT k elements."""
    iters = cdiv(N, BM) * cdiv(M, BN) * cdiv(max(K, 1), KT)
    return max(1, min(GRID or backend.device_info().sm_count, iters))


def swapped_store_source(BN: int, convert: str = "") -> str:
    """Source of ``store_acc(C, acc, t, m0, n0, M, N)`` for the kernel's product transposed:
    thread ``t`` of the warpgroup holds rows g, g + 8 (weight outputs) and column pairs
    c, c + 1 (tokens) of a 64 x BN slice (``H.accumulator_coords``) and writes each value
    to ``C[c, r]``.  Eight lanes write eight consecutive outputs of one token row: a
    16- or 32-byte run.  ``convert``: applied to each value first (a 16-bit C)."""
    def val(i):
        return f"{convert}(acc[{i}])" if convert else f"acc[{i}]"

    lines = ["def store_acc(C, acc, t, m0, n0, M, N):",
             "    w, lane = t // 32, t % 32",
             "    r0 = m0 + 16 * w + lane // 4",
             "    c0 = n0 + 2 * (lane % 4)"]
    for half in range(2):
        lines += [f"    r = r0 + {8 * half}", "    if r < M:"]
        for j in range(BN // 8):
            k = 4 * j + 2 * half
            lines += [f"        c = c0 + {8 * j}",
                      "        if c < N:",
                      f"            C[uidx(c), uidx(r)] = {val(k)}",
                      "        if c + 1 < N:",
                      f"            C[uidx(c + 1), uidx(r)] = {val(k + 1)}"]
    return "\n".join(lines) + "\n"


def row_bias_source(BN: int) -> str:
    """Source of ``add_bias(acc, bias, t, m0, n0, M, N)`` with one bias value per kernel
    row (a layer's output): a thread reads its two rows' values once and adds them to all
    of its accumulators; a (0, N) bias (none) leaves them."""
    lines = ["def add_bias(acc, bias, t, m0, n0, M, N):",
             "    if bias.shape[0] > 0:",
             "        r = m0 + 16 * (t // 32) + (t % 32) // 4",
             "        b0 = to32(bias[0, uidx(r)]) if r < M else float32(0.0)",
             "        b1 = to32(bias[0, uidx(r + 8)]) if r + 8 < M else float32(0.0)"]
    for j in range(BN // 8):
        lines += [f"        acc[{4 * j}] += b0", f"        acc[{4 * j + 1}] += b0",
                  f"        acc[{4 * j + 2}] += b1", f"        acc[{4 * j + 3}] += b1"]
    return "\n".join(lines) + "\n"


@cuda.jit(device=True)
def no_row_bias(acc, bias, t, m0, n0, M, N):
    return


@cuda.jit(device=True)
def token_count(B, C):
    """The kernel's N: the tokens, X's rows (the kernel's B is X, (M, K))."""
    return B.shape[0]


def epilogue(precision: str, BN: int, OUT: str, BIAS: bool):
    """(store_acc, add_bias) of a swapped build."""
    from gemmlib.intrinsics.convert import (bf16_to_float, float_to_bf16, float_to_half,
                                            half_to_float)

    env = {"uidx": uidx, "float32": float32,
           "to16": float_to_half if OUT == "fp16" else float_to_bf16,
           "to32": half_to_float if precision == "fp16" else bf16_to_float}
    sources = [swapped_store_source(BN, "" if OUT == "fp32" else "to16")]
    if BIAS:
        sources.append(row_bias_source(BN))
    made = compile_sources(sources, env)
    return made[0], (made[1] if BIAS else no_row_bias)


def build(precision: str = "fp16", BM: int = 64, BN: int = 16, STAGES: int = 0,
          GROUP_M: int = 8, REGS: tuple | None = (40, 232), GRID: int = 0,
          OUT: str = "fp32", B_LAYOUT: str = "NK", BIAS: bool = False,
          KT: int = BK) -> KernelSpec:
    """``BM``: weight outputs per tile (64: one consumer warpgroup, 128: two); ``BN``: tokens
    per tile (a multiple of 8 up to 256: wgmma's widest n; ``auto`` takes :data:`WIDTHS`); ``STAGES``: the ring's depth (0: the deepest that
    fits, :func:`stages_for`); ``GRID``: the blocks that share the k-tiles (0: one per SM;
    a launch choice).  ``B_LAYOUT``: the caller's B -- "NK", an ``nn.Linear`` weight as
    ``W.t()``, or "KN", a row-major (K, N) B.  ``OUT``, ``BIAS``: as ``wgmma_ws``'s (the
    bias is one value per output column of C).  ``KT``: k elements per stage, 64 or 128
    (:func:`wide_stages`)."""
    if BM not in (64, 128) or BN % 8 or not 8 <= BN <= 256:
        raise ValueError(f"BM must be 64 or 128 and BN a multiple of 8 up to 256 "
                         f"(BM={BM}, BN={BN})")
    if KT not in (BK, 2 * BK):
        raise ValueError(f"KT must be {BK} or {2 * BK}, got {KT}")
    STAGES = STAGES or stages_for(BM, BN, KT)
    if not 2 <= STAGES <= MAX_STAGES or STAGES * 2 * KT * (BM + BN) > 220 * 1024:
        raise ValueError(f"STAGES={STAGES}: 2..{MAX_STAGES} stages that fit shared memory")
    check_out(precision, OUT)
    check_layout(B_LAYOUT)
    a_layout = "MK" if B_LAYOUT == "NK" else "KM"        # the weight, as the kernel's A
    k_tile, _ = warpgroup_code(precision, BN, 1, "fp32", "NK", a_layout)
    store_acc, add_bias = epilogue(precision, BN, OUT, BIAS)
    if KT == BK:
        load_stage, A_BYTES, STAGE_BYTES = tma_loader(BM, BN, "NK", a_layout)
    else:
        load_stage, k_tile, A_BYTES, STAGE_BYTES = wide_stages(BM, BN, a_layout, k_tile)
    kernel, NT, SHARED, work = split_kernel(
        BM, BN, STAGES, REGS, SUM_GROUPS, k_tile, store_acc, add_bias,
        tile_order(BM, BN, GROUP_M), load_stage, A_BYTES, STAGE_BYTES, a_dims(a_layout),
        token_count, "wgmma_swap_kernel", stream_k=True, KT=KT)
    kernel = bias_entry(kernel, BIAS, {} if SIMULATOR else {"launch_bounds": (NT, 1)})

    def grid(M, N, K):   # the caller's (M, N, K): N weight outputs, M tokens
        return (blocks_for(M, N, K, BM, BN, GRID, KT), 1, 1)

    def workspace(M, N, K):   # the pieces' partial tiles and tickets (kernel's M, N)
        pieces = stream_k_pieces(cdiv(N, BM) * cdiv(M, BN), cdiv(max(K, 1), KT),
                                 blocks_for(M, N, K, BM, BN, GRID, KT))
        return work(N, M, K, pieces)

    name = f"wgmma_swap{'' if precision == 'fp16' else '_' + precision}_{BM}x{BN}_s{STAGES}"
    name += (f"_g{GROUP_M}" if GROUP_M != 8 else "") + regs_suffix(REGS)
    name += (f"_grid{GRID}" if GRID else "") + out_suffix(OUT)
    name += ("_kn" if B_LAYOUT == "KN" else "") + bias_suffix(BIAS)
    name += f"_kt{KT}" if KT != BK else ""
    fields = {**spec_fields(precision, __name__), **out_fields(precision, OUT),
              **bias_fields(BIAS), "chapter": "18h-swap-ab"}
    fields["constraints"] = (HOPPER_ONLY,
                             K_SIXTEEN_BYTE_ROWS if B_LAYOUT == "NK" else SIXTEEN_BYTE_ROWS,
                             stream_walk_fits(lambda M, N, K: cdiv(N, BM) * cdiv(M, BN)
                                              * cdiv(max(K, 1), KT) * grid(M, N, K)[0]))
    return KernelSpec(
        early_launch=True,
        name=name,
        idea="swap-AB: C^T = W^T X^T, the weight's outputs fill wgmma's 64 rows and the "
             "tokens its narrow n; small stages make a deep ring; stream-K: every block "
             "the same share of all tiles' k-tiles, shared tiles summed in block order",
        kernel=kernel,
        block=(NT, 1, 1),
        tile=(BN, BM),   # of the caller's C: BN token rows, BM output columns
        grid=grid,
        params=dict(precision=precision, BM=BM, BN=BN, BK=BK, KT=KT, STAGES=STAGES,
                    GROUP_M=GROUP_M,
                    REGS=REGS, GRID=GRID, **out_params(OUT), B_LAYOUT=B_LAYOUT,
                    **bias_params(BIAS)),
        shared_bytes=SHARED,
        # the kernel's A is the caller's B: its box is the weight's
        tma_boxes=tma_boxes(BM, BN, "NK", a_layout),
        tma_swizzle=128,
        launch_only=("GRID",),
        workspace=workspace,
        workspace_dtypes=("float32", "int32"),
        b_operand=B_LAYOUT,
        swap_ab=True,
        ptx_must=(r"wgmma\.mma_async\.sync\.aligned\.m64n\d+k16",
                  r"cp\.async\.bulk\.tensor\.2d", r"atom\.global\.add")
        + ((r"setmaxnreg\.inc",) if REGS else ())
        + ((rf"cvt\.rn\.{'f16' if OUT == 'fp16' else 'bf16'}\.f32",) if OUT != "fp32" else ()),
        **fields,
    )


SPEC = build()
