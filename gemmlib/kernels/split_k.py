"""Rung 12, split-K: cut K into slices when the output alone cannot fill the GPU.

A block of the warp-tiled rung computes one BM x BN tile of C, so a problem
launches ceil(M/BM) * ceil(N/BN) blocks whatever K is.  When M x N is small
and K deep -- 1024 x 1024 x 8192 makes 32 blocks of 256 x 128 for 132 SMs --
most of the GPU idles while a few blocks walk a long K.  Split-K gives the
grid a third dimension: block (x, y, z) sums only the z-th slice of the
k-tiles, so S slices make S times as many blocks, each S times shorter.

The slices' partial products must then be added.  Atomics would be fastest
to write but the order of the additions would change from run to run, and so
would the rounding of the result.  Here each slice writes its partial tile to
its own S-th of a workspace (S*M x N), and a second small kernel adds the S
partial products **in slice order**: the result is bit-identical on every
run.  The price is the workspace traffic -- S partial products written and
read back once -- which is small next to the arithmetic when K is deep.

How many slices: :func:`splits_for` (the cost model ``kernel="auto"`` also
uses; ``gemmlib.dispatch`` explains the whole choice).  The slice count is a
launch parameter, not a compile-time one: ``SPLITS`` changes only the grid's
z, so every slice count runs the same compiled kernel.

``B_LAYOUT="NK"`` (B given as (N, K), C = A @ B.T) is warptile's, as are ``A_LAYOUT="KM"``
and the reading of slices of wider matrices where they lie: the slices and their sum do not
care how A and B were laid out.
"""

from __future__ import annotations

import math
from functools import lru_cache

from gemmlib import backend
from gemmlib.backend import cuda, float32
from gemmlib.intrinsics import convert
from gemmlib.kernels import warptile
from gemmlib.spec import Constraint, KernelSpec, cdiv

#: Threads of the reduction kernel: 32 consecutive columns per row (coalesced), 8 rows.
REDUCE_BLOCK = (32, 8, 1)
#: A slice is at least this many k-tiles deep (shorter slices are mostly prologue/epilogue).
MIN_TILES_PER_SLICE = 4
MAX_SPLITS = 16
#: The second launch (the reduction) in the cost model, whatever its size.
LAUNCH_S = 5e-6


@cuda.jit(device=True)
def slice_sum(W, M, i, j):
    """W[i, j] + W[M + i, j] + ... + W[(S-1)*M + i, j], always in that order (W holds the
    S = rows / M slices' M x N partial products, one under the other)."""
    S = W.shape[0] // M
    acc = W[i, j]
    for z in range(1, S):
        acc += W[z * M + i, j]
    return acc


@cuda.jit
def reduce_slices(W, C):
    """C[i, j] = the slices' sum at (i, j), one thread an element."""
    M, N = C.shape
    i = cuda.blockIdx.y * cuda.blockDim.y + cuda.threadIdx.y
    j = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    if i < M and j < N:
        C[i, j] = slice_sum(W, M, i, j)


def _rounding_reduce(to16):
    def reduce_slices_to16(W, C):
        """C[i, j] = reduce_slices' sum rounded once, to C's 16-bit type (C holds its
        bits).  One slice (W is M x N): the rounding of a float32 result."""
        M, N = C.shape
        i = cuda.blockIdx.y * cuda.blockDim.y + cuda.threadIdx.y
        j = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        if i < M and j < N:
            C[i, j] = to16(slice_sum(W, M, i, j))

    return cuda.jit(reduce_slices_to16)


#: a 16-bit C ("fp16" / "bf16") from a float32 result or K slices of one, for the rungs
#: without a 16-bit epilogue (``gemmlib.dispatch.run_rounded``): the slices' sum and the
#: rounding (nearest even; cvt.rn.f16.f32 / cvt.rn.bf16.f32) in the one launch
REDUCE16 = {"fp16": _rounding_reduce(convert.float_to_half),
            "bf16": _rounding_reduce(convert.float_to_bf16)}


def _bias_finish(to_out, load_bias):
    def finish_with_bias(W, bias, C):
        """C[i, j] = the slices' sum at (i, j) plus bias[0, j], in fp32, rounded once to
        C's type (``to_out``).  W may be C itself (one slice, a float32 C: in place)."""
        M, N = C.shape
        i = cuda.blockIdx.y * cuda.blockDim.y + cuda.threadIdx.y
        j = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        if i < M and j < N:
            C[i, j] = to_out(slice_sum(W, M, i, j) + load_bias(bias[0, j]))

    return cuda.jit(finish_with_bias)


@cuda.jit(device=True)
def _as_float(x):
    return float32(x)


#: the bias epilogue of rungs that have none of their own (``KernelSpec.bias_arg``): the
#: rung writes float32 (or its K slices' partial products), and this kernel adds the
#: slices and the bias in fp32 and rounds once into C.  Keyed by (C's type, the bias's
#: type); a 16-bit bias or C travels as its uint16 bits.
BIAS_FINISH = {
    (out, bt): _bias_finish(
        {"fp32": _as_float, "fp16": convert.float_to_half, "bf16": convert.float_to_bf16}[out],
        {"fp32": _as_float, "fp16": convert.half_to_float, "bf16": convert.bf16_to_float}[bt])
    for out in ("fp32", "fp16", "bf16") for bt in ("fp32", "fp16", "bf16")}


def reduce_grid(M: int, N: int) -> tuple[int, int, int]:
    return (cdiv(N, REDUCE_BLOCK[0]), cdiv(M, REDUCE_BLOCK[1]), 1)


def splits_for(M: int, N: int, K: int, BM: int, BN: int, BK: int, dev=None,
               blocks_per_sm: int = 1, rate: float = 1.0,
               min_tiles: int = MIN_TILES_PER_SLICE) -> int:
    """The slice count with the least modelled time (1 = no split).

    Model, in units of one k-tile step of one wave of blocks:

        main(S)   = ceil(blocks * S / resident) * ceil(ktiles / S)
        reduce(S) = (2S + 1) * M * N * 4 bytes of workspace traffic at the DRAM
                    bandwidth, plus a fixed cost for the second launch

    ``resident`` = SMs x blocks per SM.  A slice keeps at least ``min_tiles``
    k-tiles.  The fp32 rate and the bandwidth come from the device (at 70% of
    peak, the order of what the kernels reach), so the same rule serves an H100,
    an H200 or a T4; ``rate`` prices the k-tile at that multiple of the fp32
    rate (the tensor-core rungs' ``mma_split_k.splits_for_tc``).
    """
    dev = dev or backend.device_info()
    ktiles = cdiv(max(K, 1), BK)
    blocks = cdiv(M, BM) * cdiv(N, BN)
    resident = max(dev.sm_count * max(blocks_per_sm, 1), 1)
    smax = max(1, min(MAX_SPLITS, ktiles // min_tiles))
    if smax == 1 or blocks == 0:
        return 1
    flops = max(dev.fp32_peak_tflops, 1.0) * 1e12 * rate * 0.7
    bandwidth = max(dev.peak_bandwidth_gbs, 100.0) * 1e9 * 0.7
    step_s = resident * 2.0 * BM * BN * BK / flops  # one wave, one k-tile

    def cost(s):
        main = math.ceil(blocks * s / resident) * cdiv(ktiles, s) * step_s
        if s == 1:
            return main
        return main + (2 * s + 1) * M * N * 4 / bandwidth + LAUNCH_S

    return min(range(1, smax + 1), key=lambda s: (cost(s), s))


def k_slices(K: int, BK: int, S: int) -> list[tuple[int, int]]:
    """(t0, t1) for every block z of a launch with ``S`` blocks along z: it sums k-tiles
    t0 <= t < t1.  The rule of warptile's SPLIT_K branch: ``per = ceil(ktiles / S)``,
    block z starts at ``z * per`` (a pair with ``t1 <= t0`` is an empty slice)."""
    ktiles = cdiv(K, BK)
    per = cdiv(ktiles, max(S, 1))
    return [(z * per, min(ktiles, z * per + per)) for z in range(max(S, 1))]


def effective_splits(S: int, K: int, BK: int) -> int:
    """Slices that all hold at least one k-tile (what the kernel's z-slicing yields)."""
    ktiles = cdiv(max(K, 1), BK)
    S = max(1, min(S, ktiles))
    return cdiv(ktiles, cdiv(ktiles, S))


@lru_cache(maxsize=None)
def _main_kernel(tile: tuple):
    """The split-K warptile spec for one tile configuration, built once for every SPLITS."""
    return warptile.build(**dict(tile), SPLIT_K=True)


def _slices_fit(spec, M, N, K, dev):
    return spec.grid(M, N, K)[2] <= dev.max_grid[2]


CONSTRAINTS = (
    Constraint("slices", _slices_fit,
               "gridDim.z (the number of K slices) is limited by the device"),
)

#: The rung's default tile: warptile's.  SPLITS=0 picks the slice count per shape.
DEFAULTS = dict(warptile.DEFAULTS, SPLITS=0)


def build(SPLITS: int = 0, **tile) -> KernelSpec:
    """A split-K spec: ``SPLITS`` slices (0: :func:`splits_for` per shape) of warptile ``tile``."""
    tile = {**warptile.DEFAULTS, **tile}
    main = _main_kernel(tuple(sorted(tile.items())))
    BM, BN, BK = tile["BM"], tile["BN"], tile["BK"]

    def slices(M, N, K):
        S = SPLITS or splits_for(M, N, K, BM, BN, BK)
        return effective_splits(S, K, BK)

    def grid(M, N, K):
        return (cdiv(N, BN), cdiv(M, BM), slices(M, N, K))

    params = dict(main.params, SPLITS=SPLITS)
    nk = main.b_operand == "NK"   # B_LAYOUT="NK": B given as (N, K), C = A @ B.T
    km = main.a_operand == "KM"   # A_LAYOUT="KM": A given as (K, M), a column-major A
    tile_name = (main.name.replace("warptile", "").replace("_splitk", "").replace("_nk", "")
                 .replace("_km", "").strip("_"))
    name = "_".join(x for x in ("split_k", tile_name, f"s{SPLITS}" if SPLITS else "",
                                "nk" if nk else "", "km" if km else "") if x)
    return KernelSpec(
        name=name,
        chapter="13b-split-k",
        idea="K cut into slices so that small-output, deep-K problems fill the GPU; the "
             "slices' partial products are added in a fixed order (bit-identical results)",
        kernel=main.kernel,
        block=main.block,
        tile=main.tile,
        grid=grid,
        params=params,
        shared_bytes=main.shared_bytes,
        a_operand=main.a_operand,
        b_operand=main.b_operand,
        constraints=main.constraints + CONSTRAINTS,
        ptx_must=main.ptx_must,
        index=main.index,
        module=__name__,
        reduce_kernel=reduce_slices,
        reduce_block=REDUCE_BLOCK,
        launch_only=("SPLITS",),
        reads_pitched=main.reads_pitched,
    )


def accesses(spec):
    """Shared-memory accesses: the warptile kernel's (gemmlib.banks)."""
    return warptile.accesses(spec)


SPEC = build()
