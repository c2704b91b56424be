"""Split-K on the tensor-core pipeline: K cut into slices when the output cannot fill the GPU.

``mma_pipeline`` launches one block per BM x BN tile of C, whatever K is.  A
small output over a deep K leaves most SMs idle: M = 128 rows by N = 4096 is
32 blocks of 128 x 128 for the 132 SMs of an H100, 1024 x 1024 x 8192 is 64,
and each of them walks all of K alone.  The fp32 ladder met the same problem
in ``split_k`` (chapter 13), and the answer carries over unchanged: the
pipeline's ``SPLIT_K`` form gives the grid a third dimension, block
(x, 0, z) runs the same cp.async ring over the z-th slice of the k-tiles
only (the rule of ``split_k.k_slices``), and writes its partial tile to its
own M rows of an (S*M, N) float32 workspace.  ``split_k.reduce_slices`` then
adds the S partial products **in slice order**: bit-identical on every run.

Precision is the pipeline's.  Each slice's partial tile is what
``mma_pipeline`` computes over those k-tiles, in fp32 -- for 3xtf32 with
every k-tile's tensor-core sum still promoted into the accumulators by fp32
adds (``PROMOTE``) -- and the slices are added in fp32, so no tensor-core
accumulator ever sums more than one k-tile.  NaN and +-Inf pass through the
fp32 adds as through the accumulator (``x + Inf = Inf``, ``Inf - Inf = NaN``).

How many slices: :func:`splits_for_tc`, split_k's model priced at the tensor
cores' rate; :func:`choose` is what the dispatcher asks.  As in ``split_k``
the slice count changes only the grid's z: every count runs one compiled
kernel.

``B_LAYOUT="NK"`` (B given as (N, K), C = A @ B.T; name suffix ``_nk``) is the pipeline's,
as are ``A_LAYOUT="KM"`` and the reading of slices of wider matrices where they lie: the
slices do not care how A and B are laid out.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

from gemmlib import backend
from gemmlib.kernels import mma_pipeline, split_k
from gemmlib.spec import KernelSpec, cdiv

#: Tensor-core (dense mma) rate per precision as a multiple of ``DeviceInfo.fp32_peak_tflops``
#: -- the device reports no tensor-core peak.  From the datasheets: an A100 does 312 TFLOPS
#: FP16/BF16 and 156 TF32 against 19.5 fp32 (16x, 8x), an H100 SXM 989 and 495 against 67
#: (14.8x, 7.4x); 3xTF32 issues three TF32 mma per product (8/3).  GeForce parts with
#: half-rate fp32 accumulation are overrated by 2x: the model then splits less, not more.
TC_FACTOR = {"fp16": 16.0, "bf16": 16.0, "tf32": 8.0, "3xtf32": 8.0 / 3.0}
#: A slice is at least this many k-tiles deep: the ring keeps STAGES - 1 (1..7) tiles in
#: flight, and a slice much shorter than two rings spends its time filling and draining.
MIN_TILES_PER_SLICE = 8


def blocks_per_sm(spec: KernelSpec, dev) -> int:
    """Blocks of a pipeline spec one SM holds: threads, shared memory, and registers.

    Registers are estimated from the tile: the accumulators (twice for PROMOTE's fresh
    partial sums), one k-step's fragments (twice for 3xtf32's big and small parts) and
    ~72 for addresses and loop state.  ptxas gives the default tiles 236-241 registers
    (sm_80 and sm_90, plain and split alike): two 128-thread blocks per SM for fp16, bf16
    and tf32 (four 64 x 64 warps), one 256-thread block for 3xtf32 (eight 64 x 32 warps).
    ``min_blocks`` (the launch bound) caps ptxas at what that many blocks need, so it
    counts as a floor.
    """
    p = spec.params
    MI, NI = p["WM"] // 16, p["WN"] // 8
    split = 2 if p["precision"] == "3xtf32" else 1
    regs = min(255, MI * NI * 4 * (2 if p["PROMOTE"] else 1) + (MI * 4 + NI * 2) * split + 72)
    by_regs = max(dev.registers_per_sm // (cdiv(regs, 8) * 8 * spec.threads), p["min_blocks"])
    by_smem = dev.max_shared_per_sm // (spec.shared_bytes + 1024)
    by_threads = dev.max_threads_per_sm // spec.threads
    return max(1, min(by_regs, by_smem, by_threads))


def splits_for_tc(precision: str, M: int, N: int, K: int, BM: int, BN: int, BK: int,
                  dev=None, blocks_per_sm: int = 1) -> int:
    """The slice count with the least modelled time (1 = no split).

    ``split_k.splits_for``'s model, with the k-tile priced at the tensor cores' rate
    (fp32 peak x TC_FACTOR[precision]) and slices of at least MIN_TILES_PER_SLICE
    k-tiles.
    """
    return split_k.splits_for(M, N, K, BM, BN, BK, dev or backend.device_info(),
                              blocks_per_sm, rate=TC_FACTOR[precision],
                              min_tiles=MIN_TILES_PER_SLICE)


_MAINS: dict = {}   # full params -> the one SPLIT_K pipeline spec of that configuration


@lru_cache(maxsize=None)
def _main_kernel(tile: tuple) -> KernelSpec:
    """The SPLIT_K pipeline spec of one tile configuration, built once for every SPLITS
    (and once for a tile given in full or left to the defaults: one kernel to compile)."""
    spec = mma_pipeline.build(**dict(tile), SPLIT_K=True)
    return _MAINS.setdefault(tuple(sorted(spec.params.items())), spec)


def build(precision: str = "fp16", SPLITS: int = 0, **tile) -> KernelSpec:
    """A split-K spec: ``SPLITS`` slices (0: :func:`splits_for_tc` per shape) of the
    pipeline tile ``tile`` (``mma_pipeline.build``'s parameters; unset: its defaults)."""
    tile = {k: v for k, v in tile.items() if k != "SPLIT_K"}   # (params carry it back in)
    main = _main_kernel(tuple(sorted(dict(tile, precision=precision).items())))
    p = main.params
    BM, BN, BK = p["BM"], p["BN"], p["BK"]

    def slices(M, N, K):
        S = SPLITS
        if not S:
            dev = backend.device_info()
            S = splits_for_tc(precision, M, N, K, BM, BN, BK, dev, blocks_per_sm(main, dev))
        return split_k.effective_splits(S, K, BK)

    def grid(M, N, K):
        return (cdiv(M, BM) * cdiv(N, BN), 1, slices(M, N, K))

    params = {k: v for k, v in p.items() if k != "SPLIT_K"}
    params["SPLITS"] = SPLITS
    name = main.name.replace("mma_pipeline", "mma_split_k").replace("_splitk", "")
    if SPLITS:   # (a B_LAYOUT="NK" build keeps its "_nk" last)
        nk = name.endswith("_nk")
        name = name.removesuffix("_nk") + f"_splits{SPLITS}" + ("_nk" if nk else "")
    # the pipeline's spec (kernel, tile, precision, constraints, PTX claims), launched
    # with S slices along z and split_k's fixed-order reduction
    return replace(
        main,
        name=name,
        chapter="16-tensor-core-pipeline",
        idea="the tensor-core pipeline with K cut into slices, so that small-output, deep-K "
             "problems fill the GPU; the slices' fp32 partial tiles are added in a fixed "
             "order (bit-identical results)",
        grid=grid,
        params=params,
        constraints=main.constraints + split_k.CONSTRAINTS,
        module=__name__,
        reduce_kernel=split_k.reduce_slices,
        reduce_block=split_k.REDUCE_BLOCK,
        launch_only=("SPLITS",),
    )


@lru_cache(maxsize=None)
def _spec(precision: str, SPLITS: int, tile: tuple) -> KernelSpec:
    """One spec object per (precision, slices, tile) for :func:`choose`."""
    return build(precision, SPLITS, **dict(tile))


def choose(precision: str, M: int, N: int, K: int, dev=None,
           tile: dict | None = None) -> KernelSpec | None:
    """The split-K spec for (M, N, K) in ``precision`` when the model says more than one
    slice pays, else None (run ``mma_pipeline`` itself).

    ``tile``: the pipeline's parameters the dispatcher chose (tuned, or None for the
    precision's defaults); a ``precision``, ``SPLIT_K`` or ``SPLITS`` in it is ignored.
    The constraints are checked at K and N rounded up to the 16-byte multiples that
    ``gemmlib.matmul`` pads them to.
    """
    dev = dev or backend.device_info()
    skip = ("precision", "SPLIT_K", "SPLITS")
    tile = tuple(sorted((k, v) for k, v in (tile or {}).items() if k not in skip))
    main = _main_kernel(tuple(sorted(dict(tile, precision=precision).items())))
    p = main.params
    S = splits_for_tc(precision, M, N, K, p["BM"], p["BN"], p["BK"], dev,
                      blocks_per_sm(main, dev))
    S = split_k.effective_splits(S, K, p["BK"])
    if S <= 1:
        return None
    spec = _spec(precision, S, tile)
    a = spec.operand_align
    if spec.failed_constraints(M, cdiv(N, a) * a, cdiv(K, a) * a, dev):
        return None
    return spec


def accesses(spec):
    """Shared-memory accesses: the pipeline's fragment loads (gemmlib.banks)."""
    return mma_pipeline.accesses(spec)


#: The registered spec in the simulator: a one-warp 32 x 32 tile.  The tests run every
#: rung's registered spec there, and at the default 128 x 128 tile with the simulator's
#: one SM (one slice for their shapes) that would be mma_pipeline's run again, four
#: times the threads; the split's code is the same at any tile.
SIM_TILE = dict(BM=32, BN=32, BK=32, WM=32, WN=32, STAGES=3)

SPEC = build(**(SIM_TILE if backend.SIMULATOR else {}))
