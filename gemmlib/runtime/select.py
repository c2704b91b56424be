"""Which kernel runs a problem: every spec built once, and the choice per shape.

**Build once.**  :func:`build` returns one :class:`~gemmlib.spec.KernelSpec`
per (rung, parameters) for the life of the process.  A rung's ``build()``
makes fresh closures and a fresh ``cuda.jit`` kernel, and numba compiles per
kernel object, so handing out the same spec is what makes a kernel compile
once (thread-safe: a lock guards the table).

**Choose per shape** (``kernel="auto"``).  :func:`select` is the one place
the choice is made:

1. the tile: the warptile configuration tuned for the shape's class on this
   GPU (:mod:`gemmlib.tuning`; the nearest tuned class when the shape's own
   was not tuned; the rung's default without data, in the simulator, or when
   the tuned tile breaks a constraint).  Tuning data is how small problems get
   small tiles: a 1024^2 output in 256 x 128 tiles is 32 blocks for 132 SMs;
2. the slices of K: the count tuned for the shape's own class if there is
   one, else :func:`gemmlib.kernels.split_k.splits_for`'s cost model (waves of
   blocks x k-tiles per slice, plus the workspace traffic of the reduction);
3. one slice: the warptile spec; several: the split-K spec with that count.

The tensor-core precisions choose in :func:`select_tc` (Hopper: :func:`select_hopper`;
decode sizes: :func:`select_skinny`; a 16-bit C: :func:`select_out`), a batch in one
launch in :func:`select_batched`; the ``with_*`` functions give a choice's build for
another output type, operand layout (a slice of a wider matrix too) or a bias epilogue.
"""

from __future__ import annotations

import importlib
import inspect

from gemmlib import backend, tuning
from gemmlib.backend import SIMULATOR
from gemmlib.kernels import get as get_rung
from gemmlib.runtime.caches import LOCK, LRU, STATS
from gemmlib.runtime.compile import known_registers
from gemmlib.spec import KernelSpec, cdiv

AUTO = "auto"
#: The kernel ``matmul`` uses when none is named: the autotuned fastest rung
#: (gemmlib.autotune; the warptile default where no tuning data exists).
DEFAULT_KERNEL = AUTO
#: The rung "auto" tunes and picks configurations of (split-K is a mode of it).
AUTO_RUNG = "warptile"
SPLIT_RUNG = "split_k"
#: The shape "auto" stands for when no shape is known (``get_spec("auto")``).
AUTO_SHAPE = (4096, 4096, 4096)


_SPECS: dict = {}


def build(rung: str, params: dict | None = None) -> KernelSpec:
    """The spec of ``rung`` with ``params`` (its default when empty): one object per process."""
    key = (rung, tuple(sorted((params or {}).items())))
    spec = _SPECS.get(key)
    if spec is not None:
        return spec
    with LOCK:
        spec = _SPECS.get(key)
        if spec is None:
            default = get_rung(rung)
            if not params or dict(params) == dict(default.params):
                spec = default
            else:
                spec = importlib.import_module(f"gemmlib.kernels.{rung}").build(**params)
                STATS["builds"] += 1
            _SPECS[key] = spec
    return spec


def get_spec(kernel, precision: str | None = None) -> KernelSpec:
    """A rung name, ``"auto"`` (its choice for AUTO_SHAPE) or a KernelSpec, as a spec.

    ``precision`` (a tensor-core precision, see gemmlib.precision) builds a
    tensor-core rung in that precision; ``"auto"`` then means the tuned
    ``mma_pipeline`` (:func:`select_tc`).
    """
    if isinstance(kernel, KernelSpec):
        return kernel
    if precision not in (None, "fp32"):
        if kernel == AUTO:
            return select_tc(precision, *AUTO_SHAPE)
        rung = get_rung(kernel)
        if rung.precision == "fp32":
            raise ValueError(f"kernel {kernel!r} computes on the CUDA cores in fp32; "
                             f"precision={precision!r} needs a tensor-core rung "
                             f"({', '.join(TC_RUNGS)} or 'auto')")
        params = {"precision": precision}
        if "arch" in rung.params:   # a rung with an sm_75 form: the form this GPU runs
            params["arch"] = _tc_arch(precision)
        return build(kernel, params)
    if kernel == AUTO:
        return select(*AUTO_SHAPE)
    return get_rung(kernel)


_CHOICES = LRU(4096)


def resident_blocks(spec: KernelSpec, dev, registers: int | None = None) -> int:
    """Blocks of ``spec`` one SM holds at once (registers, shared memory, threads)."""
    if registers is None:  # a rough estimate: the results per thread, their fragments, ~60 more
        p = spec.params
        per = (p.get("BM", 64) * p.get("BN", 64)) // max(spec.threads, 1)
        registers = min(255, per + 2 * int(per ** 0.5) + 60)
    regs = -(-registers // 8) * 8 * spec.threads
    by_regs = dev.registers_per_sm // max(regs, 1)
    by_smem = dev.max_shared_per_sm // max(spec.shared_bytes + 1024, 1)
    by_threads = dev.max_threads_per_sm // max(spec.threads, 1)
    return max(1, min(by_regs, by_smem, by_threads, 32))


def select(M: int, N: int, K: int, slug: str | None = None) -> KernelSpec:
    """What ``kernel="auto"`` runs for (M, N, K) on this GPU (see the module docstring)."""
    key = (M, N, K, slug)
    spec = _CHOICES.get(key)
    if spec is not None:
        return spec
    skinny = select_skinny("fp32", M, N, K)     # decode: B read once
    if skinny is not None:
        return _CHOICES.put(key, skinny)
    dev = backend.device_info()
    entry = tuning.best_entry(M, N, K, AUTO_RUNG, slug)
    tile = build(AUTO_RUNG, entry["params"] if entry else None)
    if tile.failed_constraints(M, N, K, dev):
        tile, entry = build(AUTO_RUNG), None
    if entry and entry.get("exact") and "splits" in entry:
        splits = int(entry["splits"])
    else:
        from gemmlib.kernels.split_k import splits_for

        p = tile.params
        splits = splits_for(M, N, K, p["BM"], p["BN"], p["BK"], dev,
                            resident_blocks(tile, dev, known_registers(tile)))
    spec = tile
    if splits > 1:
        spec = build(SPLIT_RUNG, dict(tile.params, SPLITS=splits))
        if spec.failed_constraints(M, N, K, dev):
            spec = tile
    return _CHOICES.put(key, spec)


#: the tensor-core rungs (gemmlib.intrinsics.mma); "auto" picks the last, tuned
TC_RUNGS = ("mma_atom", "mma_swizzle", "mma_pipeline", "mma_split_k", "wgmma_async", "wgmma_tma",
            "wgmma_ws", "wgmma_split_k", "wgmma_tf32", "wgmma_fp8", "wgmma_cluster",
            "wgmma_pingpong", "wgmma_store")
TC_AUTO = "mma_pipeline"


def tc_tuning_key(precision: str) -> str:
    """The name tuning data for the tensor-core pipeline in ``precision`` is kept under."""
    return f"{TC_AUTO}:{precision}"


#: fp16/bf16 on Hopper (compute capability 9.0 exactly: wgmma is sm_90a): the
#: warp-specialised wgmma rung, measured faster than mma_pipeline at every size tried
#: (results/bench-*-hopper.json)
HOPPER_AUTO = "wgmma_ws"

#: fp16 on sm_75 (Turing: the T4): mma_pipeline needs cp.async (sm_80), so "auto" runs
#: mma_swizzle's sm_75 form (each m16n8k16 as two m16n8k8; gemmlib.intrinsics.mma)
SM75_AUTO = "mma_swizzle"


def _tc_arch(precision: str) -> str:
    """The form ("sm80" or "sm75") of the tensor-core rungs this GPU runs ``precision`` in."""
    from gemmlib.intrinsics.mma import device_arch

    return device_arch(precision)


#: Decode (issue 18): a product with at most this many rows of A is a bandwidth problem
#: (B is read once, 2 bytes of fp16 weights per M flops) and runs the ``skinny`` rung
#: (gemmlib.kernels.skinny, configuration per M from its ``params_for``) -- in fp16 and
#: bf16 on any GPU, and for tf32 / 3xtf32 calls in its fp32 form: exact fp32 FMAs, an
#: SGEMM's error, inside both precisions' bounds, and free at decode, where the product
#: waits on memory, not on arithmetic.
SKINNY_RUNG = "skinny"
#: fp16/bf16 calls run the skinny rung up to this M.  Measured on an H100
#: (results/models-2026-11-24/): at M <= 4 it reads B at 75-100% of the copy bandwidth and
#: beats wgmma_ws (whose 128-row tiles do the work of M = 128); at M = 16 its fp32 FMAs
#: (8 per byte of B) cap it near 40% of the copy bandwidth and wgmma_ws is faster on
#: most shapes, so the cut is between: 8
SKINNY_MMAX = 8
#: fp32 calls (``select``) run the skinny rung up to this M (0: never).  The lead sets it
#: from scripts/skinny_gpu.py, which times the rung against the warp-tiled / split-K choice.
SKINNY_FP32_MMAX = 16


def skinny_limit(precision: str) -> int:
    """The largest M that ``auto`` runs on the skinny rung in ``precision`` (tf32 and
    3xtf32 calls run its fp32 form, so they take the fp32 limit)."""
    return SKINNY_MMAX if precision in ("fp16", "bf16") else SKINNY_FP32_MMAX


def select_skinny(precision: str, M: int, N: int, K: int) -> KernelSpec | None:
    """The decode rung for (M, N, K) computed in ``precision`` ("fp16", "bf16" or "fp32"),
    or None when M is above the threshold (or the rung cannot run the shape here)."""
    if M > skinny_limit(precision):
        return None
    from gemmlib.kernels.skinny import params_for

    spec = build(SKINNY_RUNG, params_for(precision, M))
    if spec.failed_constraints(M, N, K, backend.device_info()):
        return None
    return spec


def select_tc(precision: str, M: int, N: int, K: int, slug: str | None = None,
              out: str = "fp32", b_layout: str = "KN") -> KernelSpec:
    """What ``kernel="auto"`` runs in a tensor-core ``precision``: on an H100/H200 in fp16
    or bf16 :func:`select_hopper`'s choice (``wgmma_swap`` / ``wgmma_split_k``); at decode
    sizes (M <= SKINNY_MMAX) the ``skinny`` rung -- in fp32 for tf32 and 3xtf32 calls
    (see SKINNY_MMAX); on sm_75 (a T4) in fp16 the sm_75 form of ``mma_swizzle``
    (SM75_AUTO); otherwise ``mma_pipeline`` with the tile the autotuner measured fastest
    for this GPU and the shape's class (else the default), cut into K slices by
    ``mma_split_k`` where its cost model says the tiles alone leave SMs idle.

    ``out`` ("fp16" / "bf16": a C in the inputs' own 16-bit type) changes the choice only
    where an epilogue can write it (:func:`select_out`); elsewhere the float32 choice is
    returned and ``gemmlib.matmul`` casts its result.

    ``b_layout`` "NK" (a column-major B, ``W.t()``): the choice's K-major build where the
    rung has one (else the row-major choice, and ``gemmlib.matmul`` copies B)."""
    if b_layout != "KN":
        key = ("tc", precision, M, N, K, slug, out, b_layout)
        spec = _CHOICES.get(key)
        if spec is None:
            spec = _tuned_kmajor(precision, M, N, K, slug, out) if b_layout == "NK" else None
            if spec is None:
                base = select_tc(precision, M, N, K, slug, out)
                spec = with_layout(base, b_layout) or base
            spec = _CHOICES.put(key, spec)
        return spec
    if out != "fp32":
        key = ("tc", precision, M, N, K, slug, out)
        spec = _CHOICES.get(key)
        if spec is None:
            spec = _CHOICES.put(key, select_out(select_tc(precision, M, N, K, slug), out,
                                                M, N, K))
        return spec
    key = ("tc", precision, M, N, K, slug)
    spec = _CHOICES.get(key)
    if spec is not None:
        return spec
    if _hopper16(precision, slug):
        return _CHOICES.put(key, select_hopper(precision, M, N, K))
    skinny = select_skinny(precision if precision in ("fp16", "bf16") else "fp32", M, N, K)
    if skinny is not None:
        return _CHOICES.put(key, skinny)
    if (precision == "tf32" and not SIMULATOR and slug is None
            and tuple(backend.device_info().compute_capability) == (9, 0)
            and cdiv(M, 128) * cdiv(N, 256) >= backend.device_info().sm_count * HOPPER_TF32_FILL):
        return _CHOICES.put(key, build(HOPPER_TF32, {}))
    if _tc_arch(precision) == "sm75":   # e.g. a T4: no cp.async for mma_pipeline's ring
        return _CHOICES.put(key, build(SM75_AUTO, {"precision": precision, "arch": "sm75"}))
    entry = tuning.best_entry(M, N, K, tc_tuning_key(precision), slug)
    params = dict(entry["params"]) if entry else {}
    params["precision"] = precision
    spec = build(TC_AUTO, params)
    if entry and spec.failed_constraints(M, N, K, backend.device_info()):
        spec = build(TC_AUTO, {"precision": precision})
    from gemmlib.kernels import mma_split_k   # small output, deep K: cut K into slices

    split = mma_split_k.choose(precision, M, N, K, backend.device_info(), tile=spec.params)
    return _CHOICES.put(key, split if split is not None else spec)


#: tf32 on Hopper: wgmma on K-major tiles (B transposed by a pre-pass), where its
#: 128 x 256 tiles cover at least this fraction of the SMs (else mma_pipeline / split-K).
#: Measured on an H100 (results/tf32-2026-11-25/): 64 tiles (512x4096x4096) 55% of cuBLAS
#: against mma_pipeline's 44%; 32 tiles at K = 8192 61% against mma_split_k's 68%
HOPPER_TF32 = "wgmma_tf32"
HOPPER_TF32_FILL = 0.25

#: Hopper, fp16/bf16: the split-K form of wgmma_ws (gemmlib.kernels.wgmma_split_k), which
#: is wgmma_ws itself when its cost model keeps one slice
HOPPER_SPLIT = "wgmma_split_k"
#: Hopper, fp16/bf16: 64-row tiles (one consumer warpgroup) up to this M, and up to
#: HOPPER_BM64_MMAX_NARROW rows on layers whose 128 x 256 tiles would number at most a
#: quarter of the SMs: fewer rows computed for nothing, more tiles to spread
HOPPER_BM64_MMAX = 64
HOPPER_BM64_MMAX_NARROW = 128


#: Hopper, fp16/bf16: swap-AB tiles (gemmlib.kernels.wgmma_swap) up to this many tokens
HOPPER_SWAP_MMAX = 64
HOPPER_SWAP = "wgmma_swap"
#: its stages two k-tiles deep: 0.3-5.1 points of torch ahead of one k-tile on all 24
#: (layer, M) cases of the H100 sweep (results/swap-2026-11-27/kt-h100.json)
HOPPER_SWAP_KT = 128


def select_swap(precision: str, M: int, N: int, K: int) -> KernelSpec:
    """``wgmma_swap`` for M tokens: the narrowest token width that holds them, the weight
    rows per tile and the block count from its launch model (``plan_for``), stages of
    HOPPER_SWAP_KT k elements, the deepest ring that fits; B as (K, N) (``with_layout``
    gives the ``nn.Linear`` build)."""
    from gemmlib.kernels.wgmma_swap import plan_for, width_for

    BM, grid = plan_for(M, N, K, backend.device_info())
    return build(HOPPER_SWAP, {"precision": precision, "BM": BM, "BN": width_for(M),
                               "GRID": grid, "B_LAYOUT": "KN", "KT": HOPPER_SWAP_KT})


#: Hopper, fp16/bf16, HOPPER_SWAP_MMAX < M <= HOPPER_TUNED_MMAX: the choice measured fastest
#: for the nearest (tokens, outputs, K) class (``python -m gemmlib tune``, gemmlib.tune_hopper;
#: tables in gemmlib/data/tuning), where this GPU has one.  Not above 512 tokens: at 1024 the
#: table's choices ran up to 21 points of torch behind the rule on held-out layers (its
#: classes mix layers whose 128 x 256 tiles fill one wave with ones that need two;
#: results/tune-2026-11-27/)
HOPPER_TUNED = "wgmma-serving"
HOPPER_TUNED_MMAX = 512


def _hopper16(precision: str, slug) -> bool:
    """fp16/bf16 on an H100/H200, with this GPU's own tables: where :func:`select_hopper`
    chooses."""
    return (precision in ("fp16", "bf16") and not SIMULATOR and slug is None
            and tuple(backend.device_info().compute_capability) == (9, 0))


def _tuned_entry(M: int, N: int, K: int, slug):
    """The tuning table's entry for the (tokens, outputs, K) class nearest (M, N, K)."""
    return tuning.best_entry(M, N, K, HOPPER_TUNED, slug, classify=tuning.token_class)


#: Hopper, fp16/bf16, a K-major B (``W.t()``), HOPPER_TUNED_MMAX < M <= HOPPER_FIT_MMAX --
#: and below it where the table's class keeps the rule, for a class mixes layers whose
#: 128 x 256 tiles fill one wave with ones that leave a second nearly empty (9216 outputs
#: at 512 tokens: 56% of torch under the rule, 77% fitted, CUDA graphs on an H200,
#: scripts/band_rule_ab.py) -- where the rule's 128 x 256 tiles fill less than
#: HOPPER_FIT_FILL of their last wave, the tile width fitted to whole waves instead
#: (HOPPER_FIT_ENTRY: the tuner's split128xfit, which won most classes it was tried on at
#: 128-512 tokens on both GPUs, results/tune-2026-11-27c/); a 1024-token prefill chunk on
#: a 4608-output layer makes 144 such tiles, 1.09 waves of 132 SMs
HOPPER_FIT_ENTRY = dict(rung=HOPPER_SPLIT, params=dict(BM=128, STAGES=8), width="fit_n")
HOPPER_FIT_MMAX = 2048
HOPPER_FIT_FILL = 0.8


def _tuned_kmajor(precision: str, M: int, N: int, K: int, slug, out: str):
    """On an H100/H200, the choice that only a K-major B can take (``width`` "fit_n":
    tiles of any multiple of 8 outputs): the tuned one up to HOPPER_TUNED_MMAX tokens,
    HOPPER_FIT_ENTRY where whole-wave tiles pay and the table (if any) keeps the rule
    (see HOPPER_FIT_MMAX); built for the C ``out``; else None (the choice for a row-major
    B, rebuilt K-major, serves)."""
    if not (_hopper16(precision, slug) and HOPPER_SWAP_MMAX < M <= HOPPER_FIT_MMAX):
        return None
    from gemmlib.kernels.wgmma_split_k import wave_fill

    sms = backend.device_info().sm_count
    entry = _tuned_entry(M, N, K, slug) if M <= HOPPER_TUNED_MMAX else None
    if entry and entry.get("rung") not in (None, "rule"):
        if entry.get("width") != "fit_n":
            if not _tail_wave(hopper_candidate(entry, precision, M, N, K), M, N, K, sms):
                return None
            entry = HOPPER_FIT_ENTRY
    else:   # the rule's tiles, unless their last wave would run mostly empty
        if wave_fill(M, N, 128, 256, sms) >= HOPPER_FIT_FILL:
            return None
        entry = HOPPER_FIT_ENTRY
    spec = hopper_candidate(entry, precision, M, N, K, "NK")
    return spec if spec is None or out == "fp32" else select_out(spec, out, M, N, K)


def _tail_wave(spec, M: int, N: int, K: int, sms: int) -> bool:
    """Whether a tuned build of a class's fixed tile runs whole K per tile (``wgmma_ws``, or
    ``wgmma_split_k`` where its cost model keeps one slice) and spills into a wave it fills
    less than HOPPER_FIT_FILL.  A class's tile was chosen on its training layers' widths; at
    another width it can make a few tiles more than the SMs (9216 outputs at 128 tokens: 144
    tiles of 64 x 128 on 132 SMs ran at 60% of torch on an H200; the whole-wave 128 x 72
    tiles at 97% on an H100, results/tune-2026-11-28/)."""
    from gemmlib.kernels.wgmma_split_k import wave_fill

    if spec is None or rung_of(spec) not in ("wgmma_ws", HOPPER_SPLIT):
        return False
    if rung_of(spec) == HOPPER_SPLIT and (spec.params.get("STREAM") or _cuts_k(spec, M, N, K)):
        return False
    BM, BN = spec.params["BM"], spec.params["BN"]
    return cdiv(M, BM) * cdiv(N, BN) > sms and wave_fill(M, N, BM, BN, sms) < HOPPER_FIT_FILL


def _cuts_k(spec: KernelSpec, M: int, N: int, K: int) -> bool:
    """Whether a ``wgmma_split_k`` build cuts K into slices for (M, N, K): its ``SPLITS``,
    or its cost model's count where that is 0 (one slice: it runs as ``wgmma_ws``)."""
    from gemmlib.kernels.wgmma_split_k import effective_splits, splits_for

    p = spec.params
    return effective_splits(p["SPLITS"] or splits_for(M, N, K, p["BM"], p["BN"]), K) > 1


def tuned_hopper(precision: str, M: int, N: int, K: int, slug: str | None = None):
    """The tuned choice for (M, N, K) (B as (K, N), C float32: the caller's ``select_out``
    and ``with_layout`` adapt it), or None: no table, the rule won, or the choice cannot
    run this shape (a "fit_n" entry, which only a K-major B takes: :func:`_tuned_kmajor`)."""
    entry = _tuned_entry(M, N, K, slug)
    if not entry or entry.get("rung") in (None, "rule"):
        return None
    return hopper_candidate(entry, precision, M, N, K)


def hopper_candidate(entry: dict, precision: str, M: int, N: int, K: int,
                     b_layout: str = "KN"):
    """The spec of a tuning entry ({"rung", "params", "grid"}) for (M, N, K), or None where
    it cannot run the shape.  ``width`` "fit": the token width that keeps the most SMs busy
    (``wgmma_swap.fit_width``); "fit_n": the outputs per tile that fill the SMs in whole
    waves (``wgmma_split_k.fit_columns``: any multiple of 8, so a K-major B only --
    ``b_layout`` "NK" -- with the ring as deep as fits); ``grid`` "even": the most blocks
    that share the tiles evenly (``wgmma_swap.even_grid``)."""
    params = dict(entry.get("params", {}), precision=precision)
    if entry.get("width") == "fit_n":
        if b_layout != "NK":
            return None
        from gemmlib.kernels.wgmma_split_k import fit_columns
        from gemmlib.kernels.wgmma_swap import stages_for   # the deepest ring that fits

        params["BN"] = fit_columns(M, N, K, params["BM"], backend.device_info().sm_count)
        params["STAGES"] = min(params.get("STAGES", 8), stages_for(params["BM"], params["BN"]))
        params["B_LAYOUT"] = "NK"
    if entry.get("width") == "fit":
        from gemmlib.kernels.wgmma_swap import fit_width

        params["BN"] = fit_width(M, N, K, params["BM"], backend.device_info().sm_count)
    if entry.get("grid") == "even":
        from gemmlib.kernels.wgmma_swap import even_grid

        params["GRID"] = even_grid(M, N, K, params["BM"], params["BN"])
    if entry["rung"] == HOPPER_SWAP:
        params["B_LAYOUT"] = "KN"
    try:
        spec = build(entry["rung"], params)
    except (TypeError, ValueError):
        return None
    return None if spec.failed_constraints(M, N, K, backend.device_info()) else spec


def select_hopper(precision: str, M: int, N: int, K: int, tuned: bool = True) -> KernelSpec:
    """fp16/bf16 on an H100/H200, from the per-shape measurements of every candidate
    (kernel loops: ``scripts/tc_shapes_gpu.py``, ``scripts/swap_gpu.py``): up to
    HOPPER_SWAP_MMAX tokens ``wgmma_swap`` (:func:`select_swap`; it beat the decode rung
    ``skinny`` at M = 1 on every layer of results/swap-2026-11-27/); up to HOPPER_TUNED_MMAX
    the tuned choice (:func:`tuned_hopper`) where there is one; else ``wgmma_split_k`` --
    64-row tiles on narrow layers up to HOPPER_BM64_MMAX_NARROW rows, 128-row otherwise --
    with its slices from its cost model (one where the tiles fill the GPU: then it is
    ``wgmma_ws``).  ``tuned=False``: the rule alone (what the tuner compares against)."""
    if M <= HOPPER_SWAP_MMAX:
        return select_swap(precision, M, N, K)
    if tuned and M <= HOPPER_TUNED_MMAX:
        spec = tuned_hopper(precision, M, N, K)
        if spec is not None:
            return spec
    few = cdiv(N, 256) <= backend.device_info().sm_count // 4
    BM = 64 if M <= HOPPER_BM64_MMAX or (M <= HOPPER_BM64_MMAX_NARROW and few) else 128
    return build(HOPPER_SPLIT, {"precision": precision, "BM": BM})


#: rungs whose epilogue writes C in the inputs' own 16-bit type when built with
#: ``OUT="fp16"`` / ``"bf16"`` (``gemmlib.kernels.wgmma_async.out_store``; skinny's own)
OUT16_RUNGS = ("wgmma_ws", "wgmma_cluster", "wgmma_pingpong", "wgmma_store", "wgmma_split_k",
               "wgmma_swap", "skinny")


def rung_of(spec: KernelSpec) -> str:
    """The rung (module) name a spec was built by."""
    return spec.module.rsplit(".", 1)[-1]


def with_out(spec: KernelSpec, out: str) -> KernelSpec:
    """``spec``'s rung and parameters built to write C as ``out`` ("fp32", "fp16",
    "bf16") where the rung has that epilogue (OUT16_RUNGS); else ``spec`` itself, which
    writes float32 (``gemmlib.matmul`` then rounds it into the 16-bit C: run_rounded)."""
    if spec.params.get("OUT", "fp32") == out or rung_of(spec) not in OUT16_RUNGS:
        return spec
    params = {k: v for k, v in spec.params.items() if k not in ("BK", "OUT")}
    if out != "fp32":
        params["OUT"] = out
    return build(rung_of(spec), params)


def _rebuilt(spec: KernelSpec, **changes) -> KernelSpec | None:
    """``spec``'s rung built with its parameters and ``changes``, or None where the rung's
    ``build`` takes no such parameter (or refuses the value)."""
    rung = rung_of(spec)
    builder = getattr(importlib.import_module(f"gemmlib.kernels.{rung}"), "build", None)
    if builder is None:   # a rung with one build
        return None
    takes = inspect.signature(builder).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in takes.values()):
        params = dict(spec.params)   # a rung around another's tile (split_k, mma_split_k)
    elif any(k not in takes for k in changes):
        return None
    else:
        params = {k: v for k, v in spec.params.items() if k in takes}
    params.update(changes)
    try:
        return build(rung, params)
    except (TypeError, ValueError):
        return None


def with_layout(spec: KernelSpec, b_layout: str) -> KernelSpec | None:
    """``spec`` built to read B as ``b_layout``: "KN" (a row-major (K, N) B) or "NK" (B's
    memory is (N, K) row-major: a column-major B, ``W.t()`` of an ``nn.Linear`` weight).
    None where the rung has no such build: the caller then copies B."""
    if spec.b_operand == b_layout:
        return spec
    if rung_of(spec) == SKINNY_RUNG and b_layout == "NK":   # its own tuning per layout
        from gemmlib.kernels.skinny import params_for

        p = spec.params
        params = dict(params_for(p["precision"], p["MT"], "NK"),
                      **{k: p[k] for k in ("OUT", "SPLITS", "NC", "A_LAYOUT", "PITCHED")
                         if k in p})
        try:
            return build(SKINNY_RUNG, params)
        except (TypeError, ValueError):
            return None
    return _rebuilt(spec, B_LAYOUT=b_layout)


def with_a_layout(spec: KernelSpec, a_layout: str, M: int) -> KernelSpec | None:
    """``spec`` built to read A as ``a_layout``: "KM" (A's memory is (K, M) row-major: a
    column-major A) where the rung has such a build and M fills its 16-byte rows; else
    None (the caller copies A)."""
    if spec.a_operand == a_layout:
        return spec
    align = spec.operand_align or 1
    if a_layout == "KM" and M % align:
        return None
    return _rebuilt(spec, A_LAYOUT=a_layout)


_PITCHED: dict = {}   # id(spec) -> (spec, its PITCHED build or None)


def with_pitch(spec: KernelSpec) -> KernelSpec | None:
    """``spec``'s build that reads operands lying in wider matrices where they lie
    (``PITCHED``: :mod:`gemmlib.intrinsics.pitch`), or None where the rung has none (the
    caller copies them).  Remembered per spec: a call with such an operand asks each time."""
    if spec.reads_pitched:
        return spec
    if spec.tma_boxes:   # (TMA rungs read slices through their maps, with no such build)
        return None
    hit = _PITCHED.get(id(spec))
    if hit is None or hit[0] is not spec:
        hit = _PITCHED[id(spec)] = (spec, _rebuilt(spec, PITCHED=True))
    return hit[1]


def with_bias(spec: KernelSpec) -> KernelSpec:
    """``spec`` built with its own bias epilogue where the rung has one (``BIAS``), else
    ``spec`` itself: :func:`gemmlib.runtime.launch.run` then adds the bias with one more
    kernel."""
    if spec.bias_arg:
        return spec
    return _rebuilt(spec, BIAS=True) or spec


#: What runs a batch of (M, N, K) products in one launch on Hopper: the first row whose
#: widest N and deepest K (None: any) hold the products', as (widest N, deepest K, rung,
#: build parameters); ``precision``, ``OUT``, ``B_LAYOUT`` and ``BIAS`` are added.  At the
#: batched shapes of attention (K = 64, 128: a tile is one or two k-tiles) writing C is most
#: of the work, so the rung is ``wgmma_store``, whose copy engine writes C whole 128-byte
#: lines at a time while the consumers compute the next tile; ``wgmma_ws`` (BATCHED_FALLBACK)
#: wrote it from registers, 16 bytes per row per store, and ran 32-44% of torch.bmm.  On the
#: H200 (results/batched-2026-11-27/): 128 x 256 tiles with four stages staged in halves
#: 86-102% at K = 64, three whole stages 84-94% at K = 128 (the halves 80-89%); 128-column
#: tiles with four stages 53-76% at N = 128 (3.5-10 us products).
HOPPER_BATCHED = ((64, None, "wgmma_store", {"BN": 64, "STAGES": 8}),
                  (128, None, "wgmma_store", {"BN": 128, "STAGES": 4}),
                  (None, 64, "wgmma_store", {"BN": 256, "STAGES": 4, "PIECES": 2}),
                  (None, None, "wgmma_store", {"BN": 256, "STAGES": 3}))
#: where a row's build cannot be made for a call (a float32 C's stage and four stages of
#: 128 x 256 do not fit: then the row's rung with its default ring) or cannot run its
#: shape: ``wgmma_ws``, BN 128 up to N = 128
BATCHED_FALLBACK = "wgmma_ws"


def batched_row(N: int, K: int) -> tuple:
    """The row of HOPPER_BATCHED for products of width N and depth K: (rung, params)."""
    for widest, deepest, rung, params in HOPPER_BATCHED:
        if (widest is None or N <= widest) and (deepest is None or K <= deepest):
            return rung, params
    return BATCHED_FALLBACK, {}


def select_batched(precision: str, M: int, N: int, K: int, out: str, b_layout: str,
                   bias: bool = False) -> KernelSpec | None:
    """The rung that runs a batch of (M, N, K) products in one launch (``plan``'s
    ``batch``) on an H100/H200 (and in the simulator): HOPPER_BATCHED's row for N and K, or
    BATCHED_FALLBACK where that build cannot be made or run; None elsewhere
    (``gemmlib.matmul`` then loops)."""
    if precision not in ("fp16", "bf16") or not (
            SIMULATOR or tuple(backend.device_info().compute_capability) == (9, 0)):
        return None
    call = {"precision": precision, "OUT": out, "B_LAYOUT": b_layout, "BIAS": bias}
    defaults = {"OUT": "fp32", "B_LAYOUT": "KN", "BIAS": False}
    rung, params = batched_row(N, K)
    tries = [(rung, params), (rung, {k: v for k, v in params.items() if k == "BN"}),
             (BATCHED_FALLBACK, {"BN": 128 if N <= 128 else 256})]
    dev = backend.device_info()
    for rung, params in tries:
        full = {k: v for k, v in dict(params, **call).items() if v != defaults.get(k)}
        try:
            spec = build(rung, full)
        except (TypeError, ValueError):   # e.g. a float32 C's stage does not fit
            continue
        if spec.batched and not spec.failed_constraints(M, N, K, dev):
            return spec
    return None


#: a C in the inputs' 16-bit type from one K slice of a 128 x 256 tile on Hopper: wgmma_store
#: (the epilogue through shared memory and a TMA store) with four stages, the tile staged in
#: two 32 KiB halves to make room for the fourth.  In a loop of calls at the power cap it ran
#: 90-103% of torch.matmul where wgmma_ws_o16 ran 74-95%, at every shape measured
#: (results/epilogue-2026-11-26/steady-store-*.json).
HOPPER_OUT16 = ("wgmma_store", {"STAGES": 4, "PIECES": 2})


def select_out(spec: KernelSpec, out: str, M: int, N: int, K: int) -> KernelSpec:
    """The ``auto`` choice ``spec`` (float32 C) for a C of 16-bit ``out``.  On Hopper the
    choice is ``wgmma_split_k``: when its cost model keeps one slice it is
    :data:`HOPPER_OUT16` for its 128 x 256 tile (``wgmma_ws`` for a 64-row tile), built with
    ``OUT``; when it cuts K, ``wgmma_split_k`` itself built with ``OUT`` (the last slice
    rounds the float32 sum).  ``skinny`` is built with ``OUT`` too; any other choice
    (``mma_pipeline``, ...) stays float32 and ``gemmlib.matmul`` rounds its result into C
    (:func:`gemmlib.runtime.launch.run_rounded`)."""
    if rung_of(spec) != HOPPER_SPLIT or _cuts_k(spec, M, N, K):
        return with_out(spec, out)
    p = spec.params
    base = {k: p[k] for k in ("precision", "BM", "BN", "GROUP_M", "REGS", "B_LAYOUT")
            if k in p}
    if (p["BM"], p["BN"]) == (128, 256):
        rung, params = HOPPER_OUT16
        return build(rung, dict(base, **params, OUT=out))
    return build("wgmma_ws", dict(base, STAGES=p["STAGES"], OUT=out))
