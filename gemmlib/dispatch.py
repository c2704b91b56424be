"""The dispatch layer: which kernel runs a problem, compiled once, launched cheaply.

It sits between the rung registry (:mod:`gemmlib.kernels`, which knows
rungs only) and the public call (:func:`gemmlib.matmul`), and does four
things:

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

**Compile once, across processes.**  On a GPU the kernel's machine code
(cubin) comes from an on-disk cache (:mod:`gemmlib.diskcache`, under
``$GEMMLIB_CACHE`` or ``~/.cache/gemmlib/kernels``) keyed by the kernels'
source, the parameters, the compute capability and the versions of
gemmlib, numba and numba-cuda; on a miss numba compiles it and the entry is
stored.  A damaged entry is detected (checksum) and rebuilt.  numba's own
``cache=True`` is not used: it keys closures by pickling their contents and
raises on a truncated index file.

**Launch near the floor.**  Per call, numba's dispatcher types every
argument and wraps each CuPy array in a numba device array (tens of
microseconds).  Here that work is done once per (kernel, shape): a
:class:`Plan` holds the launch geometry and the constraint check, and
:func:`run` packs the three arrays' pointers, shapes and strides into the
kernel's parameter layout (numba's array ABI: meminfo, parent, size,
itemsize, data, shape, strides -- 9 eight-byte words for a 2-D array) and
calls the driver's ``cuLaunchKernel`` once.  In the simulator kernels are
launched through numba as before.
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib
import inspect
import json
import os
import struct
import sys
import threading
from collections import OrderedDict
from dataclasses import dataclass
from functools import lru_cache
from importlib import metadata
from pathlib import Path

import numpy as np

from gemmlib import backend, diskcache, tma, tuning
from gemmlib._version import __version__
from gemmlib.backend import SIMULATOR, cuda
from gemmlib.kernels import get as get_rung
from gemmlib.runtime import memory
from gemmlib.runtime.driver import CudaError, _cluster_config, driver  # noqa: F401
from gemmlib.spec import KernelSpec, cdiv

AUTO = "auto"
#: The rung "auto" tunes and picks configurations of (split-K is a mode of it).
AUTO_RUNG = "warptile"
SPLIT_RUNG = "split_k"
#: The shape "auto" stands for when no shape is known (``get_spec("auto")``).
AUTO_SHAPE = (4096, 4096, 4096)

#: Counters: ``builds`` (kernel objects made), ``compiles`` (numba -> machine code),
#: ``disk_hits`` / ``disk_misses`` / ``disk_rejects`` (damaged entries), ``loads``
#: (modules loaded into a context), ``plans`` (launch plans made).
STATS = dict(builds=0, compiles=0, disk_hits=0, disk_misses=0, disk_rejects=0, loads=0,
             plans=0)
_LOCK = threading.RLock()


def cache_info() -> dict:
    """A copy of the counters (tests and the chapter use them to count compilations)."""
    return dict(STATS)


def clear_memory_caches() -> None:
    """Forget specs, choices, plans and loaded kernels (not the disk cache)."""
    with _LOCK:
        _SPECS.clear()
        _CHOICES.clear()
        _PLANS.clear()
        _COMPILED.clear()
        _BOUND.clear()
        _SCRATCH.clear()
        CALLS.clear()


# --------------------------------------------------------------------------
# 1. Specs, built once


_SPECS: dict = {}


def build(rung: str, params: dict | None = None) -> KernelSpec:
    """The spec of ``rung`` with ``params`` (its default when empty): one object per process."""
    key = (rung, tuple(sorted((params or {}).items())))
    spec = _SPECS.get(key)
    if spec is not None:
        return spec
    with _LOCK:
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


# --------------------------------------------------------------------------
# 2. The choice per shape


class _LRU(OrderedDict):
    def __init__(self, size: int):
        super().__init__()
        self.size = size

    def put(self, key, value):
        with _LOCK:
            self[key] = value
            if len(self) > self.size:
                self.popitem(last=False)
        return value


_CHOICES = _LRU(4096)


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
                            resident_blocks(tile, dev, _known_registers(tile)))
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
    or bf16 :func:`select_hopper`'s choice (``wgmma_split_k`` / ``skinny``); at decode
    sizes (M <= SKINNY_MMAX) the ``skinny`` rung -- in fp32 for tf32 and 3xtf32 calls
    (see SKINNY_MMAX); on sm_75 (a T4) in fp16 the sm_75 form of ``mma_swizzle``
    (SM75_AUTO); otherwise ``mma_pipeline`` with the tile the autotuner measured fastest
    for this GPU and the shape's class (else the default), cut into K slices by
    ``mma_split_k`` where its cost model says the tiles alone leave SMs idle.

    ``out`` ("fp16" / "bf16": a C in the inputs' own 16-bit type) changes the choice only
    where an epilogue can write it (:func:`select_out`); elsewhere the float32 choice is
    returned and ``gemmlib.matmul`` casts its result.

    ``b_layout`` "NK" (a column-major B, ``W.t()``): the choice's K-major build where the
    rung has one (else the row-major choice, and ``gemmlib.matmul`` copies B).  On Hopper
    the decode rung gives way to ``wgmma_split_k``'s 64-row tiles there: at M = 1 its
    K-major build took 56-92% of skinny's K-major time on 5 of 6 layer shapes of an H100
    (results/layouts-nvidia-h100-80gb-hbm3-2026-11-27.json, its M = 16 rows against M = 1)."""
    if b_layout != "KN":
        key = ("tc", precision, M, N, K, slug, out, b_layout)
        spec = _CHOICES.get(key)
        if spec is None:
            base = select_tc(precision, M, N, K, slug, out)
            if (rung_of(base) == SKINNY_RUNG and precision in ("fp16", "bf16") and not SIMULATOR
                    and tuple(backend.device_info().compute_capability) == (9, 0)):
                base = select_out(build(HOPPER_SPLIT, {"precision": precision, "BM": 64}),
                                  out, M, N, K)
            spec = _CHOICES.put(key, with_layout(base, b_layout) or base)
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
    if (precision in ("fp16", "bf16") and not SIMULATOR and slug is None
            and tuple(backend.device_info().compute_capability) == (9, 0)):
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


def select_hopper(precision: str, M: int, N: int, K: int) -> KernelSpec:
    """fp16/bf16 on an H100/H200, from the per-shape measurements of every candidate
    (kernel loops, ``scripts/tc_shapes_gpu.py``; ``results/tc-shapes-*.json``): the
    ``skinny`` rung at decode sizes on layers too narrow to fill the GPU with tiles;
    else ``wgmma_split_k`` -- 64-row tiles at small M, 128-row above -- with its slices
    from its cost model (one where the tiles fill the GPU: then it is ``wgmma_ws``)."""
    dev = backend.device_info()
    narrow = cdiv(N, 256) < dev.sm_count / 2
    # skinny only at M = 1: kernels alone on an H100, wgmma_split_k's 64-row tiles beat it
    # at M = 2-4 on all 11 layer shapes measured, fp16 and bf16, by 3-19%
    # (results/out16-2026-11-26/decode-kernels-m2to4-h100.json); at M = 1 skinny is 10-13%
    # ahead at 4096 x 4096 (decode-kernels-unroll-h100.json).  Not measured on an H200
    if narrow and M == 1:
        skinny = select_skinny(precision, M, N, K)
        if skinny is not None:
            return skinny
    few = cdiv(N, 256) <= dev.sm_count // 4
    BM = 64 if M <= HOPPER_BM64_MMAX or (M <= HOPPER_BM64_MMAX_NARROW and few) else 128
    return build(HOPPER_SPLIT, {"precision": precision, "BM": BM})


#: rungs whose epilogue writes C in the inputs' own 16-bit type when built with
#: ``OUT="fp16"`` / ``"bf16"`` (``gemmlib.kernels.wgmma_async.out_store``; skinny's own)
OUT16_RUNGS = ("wgmma_ws", "wgmma_cluster", "wgmma_pingpong", "wgmma_store", "wgmma_split_k",
               "skinny")


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
                      **{k: p[k] for k in ("OUT", "SPLITS", "NC") if k in p})
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


def with_bias(spec: KernelSpec) -> KernelSpec:
    """``spec`` built with its own bias epilogue where the rung has one (``BIAS``), else
    ``spec`` itself: :func:`run` then adds the bias with one more kernel."""
    if spec.bias_arg:
        return spec
    return _rebuilt(spec, BIAS=True) or spec


def select_batched(precision: str, M: int, N: int, K: int, out: str, b_layout: str,
                   bias: bool = False) -> KernelSpec | None:
    """The rung that runs a batch of (M, N, K) products in one launch (``plan``'s
    ``batch``): ``wgmma_ws`` on an H100/H200 (and in the simulator), its tile narrowed to
    128 columns when N is no wider; None elsewhere (``gemmlib.matmul`` then loops)."""
    if precision not in ("fp16", "bf16") or not (
            SIMULATOR or tuple(backend.device_info().compute_capability) == (9, 0)):
        return None
    params = {"precision": precision, "BN": 128 if N <= 128 else 256, "OUT": out,
              "B_LAYOUT": b_layout, "BIAS": bias}
    spec = build("wgmma_ws", {k: v for k, v in params.items()
                              if v != {"OUT": "fp32", "B_LAYOUT": "KN", "BIAS": False}.get(k)})
    return None if spec.failed_constraints(M, N, K, backend.device_info()) else spec


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
    (:func:`run_rounded`)."""
    if rung_of(spec) != HOPPER_SPLIT:
        return with_out(spec, out)
    from gemmlib.kernels.wgmma_split_k import effective_splits, splits_for

    p = spec.params
    if effective_splits(p["SPLITS"] or splits_for(M, N, K, p["BM"], p["BN"]), K) > 1:
        return with_out(spec, out)
    base = {k: p[k] for k in ("precision", "BM", "BN", "GROUP_M", "REGS")}
    if (p["BM"], p["BN"]) == (128, 256):
        rung, params = HOPPER_OUT16
        return build(rung, dict(base, **params, OUT=out))
    return build("wgmma_ws", dict(base, STAGES=p["STAGES"], OUT=out))


def _known_registers(spec) -> int | None:
    """Registers per thread if this kernel has been compiled in this process."""
    c = _COMPILED.get(id(spec.kernel))
    return c.registers if c is not None else None


# --------------------------------------------------------------------------
# 3. Plans: everything about a launch that depends only on (spec, M, N, K)


@dataclass(frozen=True)
class Plan:
    spec: KernelSpec
    M: int
    N: int
    K: int
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_bytes: int
    #: K slices (grid z); > 1 only for split-K specs, which then need a workspace
    splits: int = 1
    #: (rows, cols, dtype) of the workspace arrays of specs that take them (spec.workspace)
    workspace: tuple = ()
    #: a batched launch (``spec.batched``): this many products of (M / batch) x N x K,
    #: their A, B and C stacked row after row (M counts every product's rows)
    batch: int = 1

    @property
    def b_rows(self) -> int:
        """Rows of B's memory: (N, K) for a K-major build, else (K, N), per product."""
        return self.batch * (self.N if self.spec.b_kmajor else self.K)

    @property
    def reduce_grid(self) -> tuple[int, int, int]:
        bx, by, _ = self.spec.reduce_block
        return (cdiv(self.N, bx), cdiv(self.M, by), 1)


_PLANS = _LRU(4096)

#: ``gemmlib.matmul``'s memory of calls it has checked: what the operand checks
#: concluded (the plan, the output's dtype) for operands described alike
#: (type, dtype, shape, layout, kernel, precision, output type).  A repeated call then
#: skips the checks whose outcome only those decide (gemmlib.api).
CALLS = _LRU(4096)


def plan(kernel, M: int, N: int, K: int, batch: int = 1) -> Plan:
    """The launch plan of ``kernel`` (rung name, "auto" or spec) for (M, N, K), or for
    ``batch`` products of that shape in one launch (a spec with ``batched``).

    Checks the spec's constraints on this device (``ConstraintError`` naming
    the one that fails); memoised, so a repeated shape costs a dict lookup.
    """
    key = (kernel if isinstance(kernel, str) else id(kernel), M, N, K, batch)
    p = _PLANS.get(key)
    if p is not None and (isinstance(kernel, str) or p.spec is kernel):
        return p
    spec = select(M, N, K) if kernel == AUTO else get_spec(kernel)
    dev = backend.device_info()
    spec.check(M, N, K, dev)
    geo = spec.launch(M, N, K)
    splits = geo.grid[2] if spec.reduce_kernel is not None else 1
    work = tuple(spec.workspace(M, N, K)) if spec.workspace is not None else ()
    grid = geo.grid
    if batch != 1:
        if not spec.batched or splits > 1 or work or spec.b_prep is not None:
            raise ValueError(f"{spec.name} has no batched launch")
        # one persistent block per SM walks every product's tiles
        tiles = batch * cdiv(M, spec.tile[0]) * cdiv(N, spec.tile[1])
        grid = (min(tiles, dev.sm_count), 1, 1)
    STATS["plans"] += 1
    return _PLANS.put(key, Plan(spec, M * batch, N, K, grid, geo.block,
                                geo.dynamic_shared_bytes, splits, work, batch))


# --------------------------------------------------------------------------
# 4. Compiled kernels: the disk cache, the driver, the launch


def cache_dir() -> Path:
    """Where compiled kernels are kept: ``$GEMMLIB_CACHE/kernels`` or ``~/.cache/gemmlib/kernels``."""
    return tuning.cache_root() / "kernels"


_SOURCE_FILES = ("kernels/*.py", "intrinsics/*.py", "spec.py", "layout.py", "backend.py")


@lru_cache(maxsize=None)
def source_digest() -> str:
    """SHA-256 over the source every kernel is compiled from: any edit makes new keys."""
    root = Path(__file__).resolve().parent
    h = hashlib.sha256()
    for pattern in _SOURCE_FILES:
        for path in sorted(root.glob(pattern)):
            h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def _dist_version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "?"


def cache_key(module: str, kernel_name: str, params: dict, cc, signature: str) -> str:
    """The disk-cache key of one compiled kernel (hex SHA-256)."""
    fields = {"module": module, "kernel": kernel_name,
              "params": sorted((k, repr(v)) for k, v in params.items()),
              "cc": list(cc), "signature": signature, "source": source_digest(),
              "gemmlib": __version__, "numba": _dist_version("numba"),
              "numba_cuda": _dist_version("numba-cuda"), "format": 1}
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()


class Compiled:
    """One kernel's machine code and its loaded function per CUDA context."""

    def __init__(self, cubin: bytes, entry: str):
        self.cubin, self.entry = cubin, entry
        self.kernel = None  # the numba kernel this came from (keeps its id unique)
        self.registers = self.local_bytes = self.static_shared_bytes = None
        self._functions: dict[int, int] = {}
        self._modules: list = []  # keeps module handles alive with this object

    def function(self, ctx: int, dynamic_shared: int = 0) -> int:
        f = self._functions.get(ctx)
        if f is not None:
            return f
        with _LOCK:
            f = self._functions.get(ctx)
            if f is None:
                f = self._load(dynamic_shared)
                self._functions[ctx] = f
        return f

    def _load(self, dynamic_shared: int) -> int:
        drv = driver()
        mod, fn = ctypes.c_void_p(), ctypes.c_void_p()
        drv.check(drv.module_load_data(ctypes.byref(mod), self.cubin), "cuModuleLoadData")
        drv.check(drv.module_get_function(ctypes.byref(fn), mod, self.entry.encode()),
                  "cuModuleGetFunction")
        if dynamic_shared > 48 * 1024:
            drv.check(drv.func_set_attribute(fn, drv.MAX_DYNAMIC_SHARED, dynamic_shared),
                      "cuFuncSetAttribute")
        self._modules.append(mod)
        out = ctypes.c_int()
        for attr, field in (("registers", "registers"), ("local_bytes", "local_bytes"),
                            ("shared_bytes", "static_shared_bytes")):
            drv.check(drv.func_get_attribute(ctypes.byref(out), drv.FUNC_ATTR[attr], fn),
                      "cuFuncGetAttribute")
            setattr(self, field, out.value)
        STATS["loads"] += 1
        return fn.value


_COMPILED: dict[int, Compiled] = {}  # id(numba kernel) -> Compiled (which keeps the kernel)


def _signature(dtype, nargs: int, scalars: tuple = ()):
    """numba's argument types: ``nargs`` C-contiguous 2-D arrays of ``dtype``
    (one name, or one per argument), then scalars of the types named in ``scalars``."""
    from numba import types

    dtypes = (dtype,) * nargs if isinstance(dtype, str) else tuple(dtype)
    return (tuple(getattr(types, d)[:, ::1] for d in dtypes)
            + tuple(getattr(types, s) for s in scalars))


def compiled(kernel, *, module: str, params: dict, dtype: str = "float32",
             nargs: int = 3, scalars: tuple = ()) -> Compiled:
    """The machine code of numba kernel ``kernel``: memory, then disk, then numba (GPU only)."""
    c = _COMPILED.get(id(kernel))
    if c is not None:
        return c
    with _LOCK:
        c = _COMPILED.get(id(kernel))
        if c is None:
            c = _compile(kernel, module, params, dtype, nargs, scalars)
            c.kernel = kernel  # the id stays this kernel's while the entry lives
            _COMPILED[id(kernel)] = c
    return c


def _compile(kernel, module, params, dtype, nargs, scalars=()) -> Compiled:
    cc = backend.device_info().compute_capability
    sig = _signature(dtype, nargs, scalars)
    name = getattr(kernel, "py_func", kernel).__qualname__
    key = cache_key(module, name, params, cc, str(sig))
    existed = diskcache.entry_path(cache_dir(), key).exists()
    hit = diskcache.load(cache_dir(), key)  # None for a damaged entry (which it removes)
    if hit is not None and hit[1].get("key") == key and hit[1].get("entry"):
        STATS["disk_hits"] += 1
        return Compiled(hit[0], hit[1]["entry"])
    if existed:
        diskcache.discard(cache_dir(), key)
        STATS["disk_rejects"] += 1
    else:
        STATS["disk_misses"] += 1
    k = kernel.compile(sig)  # numba: Python -> PTX -> cubin, for this device
    STATS["compiles"] += 1
    lib = k._codelibrary
    if getattr(lib, "_setup_functions", None):  # e.g. numba's runtime (NRT): not ours to init
        raise CudaError(f"{name} needs numba's module set-up; gemmlib kernels must not")
    cubin = machine_code(lib, cc)
    diskcache.store(cache_dir(), key, cubin, {"key": key, "entry": k.entry_name,
                                              "kernel": name, "module": module,
                                              "params": {k_: repr(v) for k_, v in params.items()},
                                              "cc": list(cc)})
    return Compiled(cubin, k.entry_name)


def machine_code(lib, cc) -> bytes:
    """SASS for compute capability ``cc`` of numba code library ``lib``.

    From compute capability 8.0, numba's own ``get_cubin`` (on 9.0 and newer for the
    arch-specific sm_90a: wgmma, setmaxnreg, as numba-cuda's own launches use).  Below it,
    numba's link step can hand the PTX to the driver's JIT when it finds no nvJitLink, and an
    older driver cannot JIT PTX from a newer compiler (a T4 on Colab): there gemmlib
    assembles the PTX itself (:func:`gemmlib.ptx.assemble`), so the driver only loads
    machine code.
    """
    from gemmlib.ptx import assemble

    if tuple(cc) >= (8, 0):
        # numba's own link step is what every committed H100/H200 measurement ran; the
        # nvJitLink assembly below has not been timed on those GPUs (one H200 run with it
        # read slower, within this machine's run-to-run spread), so it serves the T4 class only
        suffix = "a" if tuple(cc) >= (9, 0) else ""
        code = lib.get_cubin(cc=(cc[0], cc[1], suffix))
        code = getattr(code, "code", code)  # numba-cuda 0.30 returns a cuda.core ObjectCode
        return Path(code).read_bytes() if isinstance(code, (str, os.PathLike)) else bytes(code)
    if lib._linking_files or lib.needs_cudadevrt:
        raise CudaError("gemmlib kernels link no other code; this one asks numba to link "
                        f"{sorted(map(str, lib._linking_files)) or 'cudadevrt'}")
    ptx = lib.get_asm_str(cc=(cc[0], cc[1], ""))
    return assemble(ptx, f"sm_{cc[0]}{cc[1]}", lib._max_registers)


def compiled_spec(spec: KernelSpec) -> Compiled:
    """The main kernel of ``spec``, compiled (or read from the cache) for this GPU."""
    dtypes = spec.array_dtypes
    return compiled(spec.kernel, module=spec.module, params=spec.code_params,
                    dtype=dtypes[0] if len(set(dtypes)) == 1 else dtypes, nargs=len(dtypes),
                    scalars=spec.scalar_args)


def _compiled_prep(spec: KernelSpec) -> Compiled:
    return compiled(spec.b_prep, module=spec.module, params={}, dtype=spec.kernel_dtypes[1],
                    nargs=2)


def _compiled_round16(out: str) -> Compiled:
    from gemmlib.kernels import split_k

    return compiled(split_k.REDUCE16[out], module=split_k.__name__, params={"OUT": out},
                    dtype=("float32", "uint16"), nargs=2)


def _compiled_finish(out: str, bias: str) -> Compiled:
    from gemmlib.kernels import split_k

    bits = {"fp32": "float32", "fp16": "uint16", "bf16": "uint16"}
    return compiled(split_k.BIAS_FINISH[(out, bias)], module=split_k.__name__,
                    params={"OUT": out, "BIAS": bias},
                    dtype=("float32", bits[bias], bits[out]), nargs=3)


def _compiled_reduce(spec: KernelSpec) -> Compiled:
    # the workspace and C are the kernel's output type (float32 also for 16-bit inputs)
    return compiled(spec.reduce_kernel, module=spec.module, params={}, dtype=spec.out_dtype,
                    nargs=2)


# Kernel parameters: numba passes a 2-D array as 9 eight-byte words.
_WORDS = 9
_TLS = threading.local()


def _params(n: int):
    """This thread's parameter block for ``n`` eight-byte words: (values buffer, address
    of the pointer array)."""
    bufs = getattr(_TLS, "bufs", None)
    if bufs is None:
        bufs = _TLS.bufs = {}
    b = bufs.get(n)
    if b is None:
        values = (ctypes.c_int64 * n)()
        base = ctypes.addressof(values)
        pointers = (ctypes.c_void_p * n)(*[base + 8 * i for i in range(n)])
        b = bufs[n] = (values, ctypes.addressof(pointers), pointers, struct.Struct(f"<{n}q"))
    return b


def _array_words(ptr: int, rows: int, cols: int, itemsize: int) -> list[int]:
    """One row-major 2-D array as numba passes it: meminfo, parent, size, itemsize, data,
    shape (2), strides in bytes (2)."""
    return [0, 0, rows * cols, itemsize, ptr, rows, cols, cols * itemsize, itemsize]


#: index of the data pointer of array i in the parameter words
_DATA = (4, 4 + _WORDS, 4 + 2 * _WORDS)
_A_WORD, _B_WORD, _C_WORD = _DATA


def _launch(fn: int, grid, block, shared: int, stream: int, words: list[int]) -> None:
    """cuLaunchKernel with the kernel parameters ``words`` (numba's layout, 8 bytes each)."""
    values, pointers, _keep, packer = _params(len(words))
    packer.pack_into(values, 0, *words)
    drv = driver()
    drv.check(drv.launch_kernel(fn, grid[0], grid[1], grid[2], block[0], block[1], block[2],
                                shared, stream, pointers, None), "cuLaunchKernel")


class _Bound:
    """A plan made ready for one CUDA context: functions loaded, parameter words laid out
    with zero pointers (a call fills in the three or four pointers)."""

    def __init__(self, p: Plan, ctx: int):
        spec, M, N, K = p.spec, p.M, p.N, p.K
        ia, ib, ic = (np.dtype(d).itemsize for d in spec.kernel_dtypes)
        item = ic
        b_rows, b_cols = p.b_rows, (K if spec.b_kmajor else N)
        c_rows = M * p.splits  # the workspace when K is split
        self.fn = compiled_spec(spec).function(ctx, p.shared_bytes)
        a_rows, a_cols = (K, M) if spec.a_operand == "KM" else (M, K)   # A given as (K, M)
        self.words = (_array_words(0, a_rows, a_cols, ia) + _array_words(0, b_rows, b_cols, ib)
                      + _array_words(0, c_rows, N, ic))
        #: rungs with a bias epilogue: the bias row's words right after C ((0, N): none)
        self.bias_word = len(self.words) + 4 if spec.bias_arg else None
        if spec.bias_arg:
            self.words += _array_words(0, 0, N, ia)
        #: the data words of the workspace arrays (split-K sums in the kernel: W, tickets)
        self.work_words = []
        for rows, cols, dt in p.workspace:
            self.work_words.append(len(self.words) + 4)
            self.words += _array_words(0, rows, cols, np.dtype(dt).itemsize)
        #: the word after the arrays: TMA rungs' address of the tensor maps
        self.maps_word = len(self.words)
        self.words += [0] * len(spec.scalar_args)
        self.scratch = {}  # (stream, graph) -> the workspace buffers, kept (_scratch)
        self.red = self.red_words = None
        self.maps = None  # (a_ptr, b_ptr, tma generation, address, scales, c_ptr): _maps_of
        self._local = threading.local()
        self.prep = self.prep_words = None
        #: the grid launched: a cluster rung's, cut to the clusters that fit at once
        self.grid = p.grid if spec.cluster == 1 else _cluster_grid(self.fn, p)
        if spec.b_prep is not None:   # B.T first, into a buffer kept per stream (_prepared_b)
            self.prep = _compiled_prep(spec).function(ctx)
            self.prep_words = _array_words(0, K, N, ib) + _array_words(0, N, K, ib)
        if p.splits > 1:
            self.red = _compiled_reduce(spec).function(ctx)
            self.red_words = _array_words(0, c_rows, N, item) + _array_words(0, M, N, item)
        #: run_rounded: its rounding kernels (by output type, loaded on first use), words
        self.round16 = {}
        self.round_words = _array_words(0, c_rows, N, 4) + _array_words(0, M, N, 2)
        #: the bias epilogue kernels of rungs without their own (by (C's type, bias type))
        self.finish = {}
        self.finish_words = {}
        self.reduce_grid = p.reduce_grid   # computed once, not per launch
        #: whether a launch uses buffers or maps of its own (what a CUDA-graph capture
        #: must give the graph: see run)
        self.needs_buffers = bool(p.splits > 1 or p.workspace or spec.tma_boxes
                                  or spec.b_prep is not None)


    def parameters(self, which: str = "words"):
        """This thread's kernel-parameter block, the constant words packed once: (the
        int64 values a launch overwrites the pointers in, the address of their pointer
        array for cuLaunchKernel).  ``which``: the main kernel's ("words") or the split-K
        sum's ("red_words")."""
        blks = getattr(self._local, "blks", None)
        if blks is None:
            blks = self._local.blks = {}
        blk = blks.get(which)
        if blk is None:
            words = getattr(self, which)
            n = len(words)
            values = (ctypes.c_int64 * n)(*words)
            base = ctypes.addressof(values)
            pointers = (ctypes.c_void_p * n)(*[base + 8 * i for i in range(n)])
            blk = blks[which] = (values, ctypes.addressof(pointers), pointers)
        return blk[0], blk[1]


def _cluster_grid(fn: int, p: Plan) -> tuple[int, int, int]:
    """A persistent cluster rung's grid: no more clusters than the GPU holds at once
    (``cuOccupancyMaxActiveClusters``: clusters live inside one GPC, so SMs / cluster
    may not all fit), or the late ones would run after the others as a second wave."""
    cm = p.spec.cluster
    cfg = _cluster_config(p.grid, p.block, p.shared_bytes, 0, cm)
    n = ctypes.c_int()
    drv = driver()
    drv.check(drv.max_active_clusters(ctypes.byref(n), fn, ctypes.byref(cfg)),
              "cuOccupancyMaxActiveClusters")
    if n.value < 1:
        raise CudaError(f"{p.spec.name}: no cluster of {cm} blocks fits on this GPU")
    return (cm * min(p.grid[0] // cm, n.value), p.grid[1], p.grid[2])


_BOUND: dict = {}


def bound(p: Plan) -> _Bound:
    """Plan ``p`` made ready for the current CUDA context (kernels loaded), memoised."""
    return _bound(p)


def _bound(p: Plan) -> _Bound:
    """Plan ``p`` made ready for the current CUDA context (kernels loaded), memoised."""
    ctx = driver().current_context()
    key = (id(p), ctx)
    b = _BOUND.get(key)
    if b is None or b.plan is not p:
        b = _Bound(p, ctx)
        b.plan = p  # keeps id(p) this plan's while the entry lives
        with _LOCK:
            _BOUND[key] = b
            if len(_BOUND) > 8192:
                _BOUND.pop(next(iter(_BOUND)))
    return b


def run(p: Plan, a_ptr: int, b_ptr: int, c_ptr: int, stream: int = 0, bound=None,
        scales: tuple = (), bias: tuple = (), graph: bool | None = None) -> None:
    """Launch plan ``p`` on row-major device buffers A (M x K), B, C (M x N) (GPU only).

    B is (K, N), or (N, K) for specs with ``b_operand == "NK"``.  No checks:
    :func:`gemmlib.matmul` makes them first.  ``bound``: the plan already made ready
    for the current context (:func:`bound`), when the caller keeps it.  ``bias``:
    ``(address, type)`` of a row of N values ("fp32", "fp16", "bf16") added to every row
    of C -- by the rung's own epilogue (``spec.bias_arg``), else by one more kernel
    (:func:`_run_then_bias`).  ``graph``: whether ``stream`` is being captured, when the
    caller knows (else the driver is asked, for plans that keep buffers or maps).
    """
    b = bound or _bound(p)
    # Under a CUDA-graph capture the call's buffers and maps are the graph's own
    # (gemmlib.runtime.memory); a plan that needs none launches as it would eagerly.
    if graph is None:
        graph = b.needs_buffers and memory.capturing(stream)
    if bias and not p.spec.bias_arg:
        _run_then_bias(b, p, a_ptr, b_ptr, c_ptr, stream, scales, bias, "fp32", graph)
        return
    if p.spec.tma_boxes and p.K == 0:   # no map of an empty matrix: C = 0 without the kernel
        if bias:
            _run_then_bias(b, p, a_ptr, b_ptr, c_ptr, stream, scales, bias, "fp32", graph)
            return
        isz = np.dtype(p.spec.out_dtype).itemsize   # float32, or bf16 bits (FP8 rungs)
        memory.zero_async(c_ptr, isz * p.M * p.N, stream)
        return
    if p.splits <= 1:   # the common case: one launch
        _launch_main(b, p, a_ptr, b_ptr, c_ptr, stream, scales, bias, graph)
        return
    # The slices' sums: one buffer per bound plan and stream, kept (launches on one stream
    # run in order: the next call's slices are written after this call's sum has read them).
    w_ptr = _partials(b, p, stream, graph)
    _launch_main(b, p, a_ptr, b_ptr, w_ptr, stream, scales, (), graph)
    _launch_reduce(b.red, b, p, w_ptr, c_ptr, stream, "red_words")


def run_rounded(p: Plan, a_ptr: int, b_ptr: int, c_ptr: int, out: str, stream: int = 0,
                bound=None, bias: tuple = (), graph: bool | None = None) -> None:
    """Plan ``p`` of a rung that writes float32, for a C of 16-bit ``out`` ("fp16" /
    "bf16") at ``c_ptr`` (GPU only).  The rung writes its result -- or its K slices'
    partial products -- into a float32 buffer kept per bound plan and stream, and one
    more kernel (``split_k.REDUCE16``) adds the slices in order and rounds each sum to
    nearest even: two launches, as split-K's float32 call, instead of a float32 C and a
    cast of it by the array library."""
    b = bound or _bound(p)
    if graph is None:   # (a float32 buffer: always one to keep right)
        graph = memory.capturing(stream)
    if bias:   # the sum, the bias and the rounding in one more kernel
        _run_then_bias(b, p, a_ptr, b_ptr, c_ptr, stream, (), bias, out, graph)
        return
    if p.spec.tma_boxes and p.K == 0:   # C = +0.0 (zero bits), as run's float32 C
        memory.zero_async(c_ptr, 2 * p.M * p.N, stream)
        return
    w_ptr = _partials(b, p, stream, graph)
    _launch_main(b, p, a_ptr, b_ptr, w_ptr, stream, (), (), graph)
    fn = b.round16.get(out)
    if fn is None:
        fn = b.round16[out] = _compiled_round16(out).function(driver().current_context())
    _launch_reduce(fn, b, p, w_ptr, c_ptr, stream, "round_words")


def _run_then_bias(b: "_Bound", p: Plan, a_ptr: int, b_ptr: int, c_ptr: int, stream: int,
                   scales: tuple, bias: tuple, out: str, graph: bool) -> None:
    """A rung without a bias epilogue (or a float32 build of one, for a 16-bit ``out``):
    it writes float32 -- into C itself when C is float32 and K is not sliced, else into
    this plan's float32 buffer -- and ``split_k.BIAS_FINISH`` adds the slices and the bias
    in fp32 and rounds once into C."""
    in_place = out == "fp32" and p.splits <= 1
    w_ptr = c_ptr if in_place else _partials(b, p, stream, graph)
    if p.spec.tma_boxes and p.K == 0:
        memory.zero_async(w_ptr, 4 * p.M * p.N, stream)
    else:
        _launch_main(b, p, a_ptr, b_ptr, w_ptr, stream, scales, (), graph)
    key = (out, bias[1])
    fn = b.finish.get(key)
    if fn is None:
        fn = b.finish[key] = _compiled_finish(*key).function(driver().current_context())
        item = 4 if out == "fp32" else 2
        b.finish_words[key] = (_array_words(0, p.M * p.splits, p.N, 4)
                               + _array_words(0, 1, p.N, 4 if bias[1] == "fp32" else 2)
                               + _array_words(0, p.M, p.N, item))
    words = list(b.finish_words[key])
    words[_DATA[0]], words[_DATA[1]], words[_DATA[2]] = w_ptr, bias[0], c_ptr
    _launch(fn, b.reduce_grid, p.spec.reduce_block, 0, stream, words)


def _partials(b: "_Bound", p: Plan, stream: int, graph: bool = False) -> int:
    """The address of this bound plan's float32 (splits * M) x N buffer on ``stream``
    (``graph``: the one calls captured on ``stream`` use)."""
    key = ("w", stream, graph)
    kept = b.scratch.get(key)
    if kept is None:
        W = memory.allocate(4 * p.splits * p.M * p.N, stream)
        kept = _keep(b, key, (W, W.ptr), W.nbytes, graph)
    return kept[1]


def _launch_main(b: "_Bound", p: Plan, a_ptr: int, b_ptr: int, c_ptr: int, stream: int,
                 scales: tuple, bias: tuple = (), graph: bool = False) -> None:
    """The main kernel of bound plan ``b`` writing ``c_ptr`` (C, or the slices' buffer):
    the pointers into its parameter block, packed once (then its workspace arrays and the
    address of its tensor maps where it takes them).  ``graph``: ``stream`` is being
    captured (the workspace and maps are the graph's own)."""
    if b.prep is not None:   # the kernel reads B K-major: transpose it first, same stream
        b_ptr = _prepared_b(b, p, b_ptr, stream, graph)
    values, pointers = b.parameters()
    values[_A_WORD] = a_ptr
    values[_B_WORD] = b_ptr
    values[_C_WORD] = c_ptr
    if b.bias_word is not None:   # the bias row: (1, N) at its address, or (0, N): none
        w = b.bias_word
        values[w] = bias[0] if bias else 0
        values[w + 1] = 1 if bias else 0                # shape[0]
        values[w - 2] = p.N if bias else 0              # size
    if p.workspace:   # the words after C (and the bias): this stream's workspace arrays
        ws = b.scratch.get((stream, graph)) or _scratch(b, p, stream, graph)
        if graph:   # a replay must find the counters zero whichever graph ran before
            for ptr, nbytes in ws[2]:
                memory.zero_async(ptr, nbytes, stream)
        for w, ptr in zip(b.work_words, ws[1]):
            values[w] = ptr
    if p.spec.tma_boxes:   # the last word: where the tensor maps of A and B are
        values[b.maps_word] = _maps_of(b, p, a_ptr, b_ptr, stream, scales, c_ptr, graph)
    drv = driver()
    if p.spec.cluster > 1:
        cfg = _cluster_config(b.grid, p.block, p.shared_bytes, stream, p.spec.cluster)
        rc = drv.launch_kernel_ex(ctypes.byref(cfg), b.fn, pointers, None)
    else:
        rc = drv.launch_kernel(b.fn, *p.grid, *p.block, p.shared_bytes, stream, pointers,
                               None)
    if rc:
        drv.check(rc, "cuLaunchKernel")


def _launch_reduce(fn: int, b: "_Bound", p: Plan, w_ptr: int, c_ptr: int, stream: int,
                   which: str) -> None:
    """A sum of the slices (``fn``: the spec's reduction, or a 16-bit rounding one) from
    the buffer at ``w_ptr`` into C."""
    values, pointers = b.parameters(which)
    values[_DATA[0]], values[_DATA[1]] = w_ptr, c_ptr
    drv = driver()
    rc = drv.launch_kernel(fn, *b.reduce_grid, *p.spec.reduce_block, 0, stream, pointers,
                           None)
    if rc:
        drv.check(rc, "cuLaunchKernel")


#: bytes of workspace kept for all plans and streams together; past it the oldest go
SCRATCH_BYTES = 512 * 2**20
_SCRATCH: OrderedDict = OrderedDict()   # (id(bound), key) -> (bound, bytes); key: stream, ("bt", stream)


def _scratch(b: "_Bound", p: Plan, stream: int, graph: bool = False):
    """Plan ``p``'s workspace arrays for ``stream``, allocated once (counters zeroed) and
    kept with the bound plan: (buffers, pointers, the counters' (pointer, bytes)).
    Launches on one stream run in order, so they share them; each kernel leaves its
    counters zero for the next."""
    # counters are zeroed on ``stream`` itself, so before any launch that uses them
    bufs, counters = [], []
    for rows, cols, dt in p.workspace:
        nbytes = rows * cols * np.dtype(dt).itemsize
        counter = np.dtype(dt).kind in "iu"
        bufs.append(memory.allocate(nbytes, stream, zero=counter and not graph))
        if counter:
            counters.append((bufs[-1].ptr, nbytes))
    return _keep(b, (stream, graph), (bufs, [x.ptr for x in bufs], counters),
                 sum(x.nbytes for x in bufs), graph)


def _keep(b: "_Bound", key, value, nbytes: int, graph: bool = False):
    """Keep ``value`` (scratch buffers and their addresses) as ``b.scratch[key]``, within
    SCRATCH_BYTES for all plans and streams together: past it the oldest go.  A captured
    graph's buffers (``graph``) are kept for good: the graph may replay at any time."""
    b.scratch[key] = value
    if graph:
        memory.keep_for_graphs(value)
        return value
    with _LOCK:
        _SCRATCH[(id(b), key)] = (b, nbytes)
        while sum(n for _, n in _SCRATCH.values()) > SCRATCH_BYTES and len(_SCRATCH) > 1:
            (_, old_key), (old, _) = _SCRATCH.popitem(last=False)
            old.scratch.pop(old_key, None)   # CuPy's pool reuses it on that stream only
    return value


def _prepared_b(b: "_Bound", p: Plan, b_ptr: int, stream: int, graph: bool = False) -> int:
    """Launch ``p.spec.b_prep`` on ``stream``: B (K x N at ``b_ptr``) transposed into this
    stream's (N, K) buffer, allocated once per bound plan and stream; its address."""
    key = ("bt", stream, graph)
    kept = b.scratch.get(key)
    if kept is None:
        bt = memory.allocate(p.N * p.K * np.dtype(p.spec.kernel_dtypes[1]).itemsize, stream)
        kept = _keep(b, key, (bt, bt.ptr), bt.nbytes, graph)
    words = b.prep_words.copy()
    words[_DATA[0]], words[_DATA[1]] = b_ptr, kept[1]
    _launch(b.prep, p.spec.b_prep_grid(p.K, p.N), p.spec.b_prep_block, 0, stream, words)
    return kept[1]


def _maps_of(b: "_Bound", p: Plan, a_ptr: int, b_ptr: int, stream: int,
             scales: tuple = (), c_ptr: int = 0, graph: bool = False) -> int:
    """The maps' address, remembered for the last operands of this bound plan: a loop over
    the same A and B (and C, for a rung that stores C by TMA) skips building the lookup key.
    ``graph``: maps of the capture's own, written in the captured stream (tma.operand_maps)."""
    c_key = c_ptr if p.spec.tma_store_box else 0   # C matters only to a TMA-store rung
    if graph:
        return _tensor_maps(p, a_ptr, b_ptr, stream, scales,
                            c_key if p.spec.c_map_ok(p.N, c_key) else 0, graph=True)
    last = b.maps
    if (last is not None and last[0] == a_ptr and last[1] == b_ptr and last[2] == tma.GENERATION
            and last[4] == scales and last[5] == c_key):
        return last[3]
    addr = _tensor_maps(p, a_ptr, b_ptr, stream, scales,
                        c_key if p.spec.c_map_ok(p.N, c_key) else 0)
    b.maps = (a_ptr, b_ptr, tma.GENERATION, addr, scales, c_key)
    return addr


def _tensor_maps(p: Plan, a_ptr: int, b_ptr: int, stream: int, scales: tuple = (),
                 c_ptr: int = 0, graph: bool = False) -> int:
    """Device address of the TMA maps of A (M x K) and B (K x N) for plan ``p``, then C's
    (M x N) when ``c_ptr`` is given (a spec that stores C by TMA, and a C that can take it:
    ``KernelSpec.c_map_ok``, decided by :func:`_maps_of`)."""
    from gemmlib import tma

    spec, M, N, K = p.spec, p.M, p.N, p.K
    ia, ib, ic = spec.kernel_dtypes
    name = TMA_DTYPE[spec.precision]
    (box_a, box_b), sw = spec.tma_boxes, spec.tma_swizzle
    isz = np.dtype(ia).itemsize
    b_shape = (p.b_rows, K) if spec.b_kmajor else (p.b_rows, N)
    if spec.scale_words and len(scales) != 2:
        raise ValueError(f"{spec.name} needs the device addresses of its two scales")
    a_shape = (K, M) if spec.a_operand == "KM" else (M, K)   # A given as (K, M): its memory
    ops = [(a_ptr, a_shape, a_shape[1] * isz, name, box_a, sw),
           (b_ptr, b_shape, b_shape[1] * isz, name, box_b, sw)]
    if c_ptr:
        ops.append((c_ptr, (M, N), N * np.dtype(ic).itemsize, np.dtype(ic).name,
                    spec.tma_store_box, 128))
    return tma.operand_maps(tuple(ops), stream, tuple(scales) if spec.scale_words else (),
                            graph=graph)


#: the element type a tensor map of each precision's operands names
TMA_DTYPE = {"fp16": "float16", "bf16": "bfloat16", "tf32": "float32", "3xtf32": "float32",
             "e4m3": "uint8", "e5m2": "uint8"}


# --------------------------------------------------------------------------
# Launching on arrays (the simulator, and callers that hold arrays)


def launch(spec_or_plan, A, B, C, M: int, N: int, K: int, stream=None, scales=(),
           out16: str | None = None, bias=None, bias_type: str | None = None) -> None:
    """Launch on arrays the kernel can take as they are (no checks).

    On a GPU: any arrays with ``__cuda_array_interface__`` (CuPy, numba), through
    :func:`run` (:func:`run_rounded` with ``out16``: a 16-bit C of uint16 bits from a
    rung that writes float32).  In the simulator: numba's launch, with the split-K
    workspace, the reduction and the rounding done the same way.  ``bias``: a (1, N)
    row of ``bias_type`` ("fp32", or "fp16"/"bf16" as uint16 bits; by default float32
    for a float32 row, else the spec's precision) added to C's rows.
    """
    p = spec_or_plan if isinstance(spec_or_plan, Plan) else plan(spec_or_plan, M, N, K)
    if bias is not None and bias_type is None:
        bias_type = "fp32" if np.dtype(bias.dtype).itemsize == 4 else p.spec.precision
    if not SIMULATOR:
        ptr = [x.__cuda_array_interface__["data"][0] for x in (A, B, C)]
        bias_arg = () if bias is None else (bias.__cuda_array_interface__["data"][0], bias_type)
        if out16 is not None:
            run_rounded(p, *ptr, out16, stream=stream_handle(stream), bias=bias_arg)
        else:
            run(p, *ptr, stream=stream_handle(stream), scales=tuple(scales), bias=bias_arg)
        return
    spec = p.spec
    s = backend.kernel_stream(stream)
    from gemmlib.kernels.split_k import BIAS_FINISH, REDUCE16

    if bias is not None and (not spec.bias_arg or (spec.tma_boxes and K == 0)):
        out = out16 or "fp32"   # as run's _run_then_bias
        W = C if out == "fp32" and p.splits <= 1 else np.empty((p.splits * M, N), np.float32)
        if spec.tma_boxes and K == 0:
            W[...] = 0
        elif p.splits <= 1:
            launch(p, A, B, W, M, N, K, stream, scales)
        else:   # the slices' partial products, unsummed
            spec.kernel[p.grid, p.block, s, p.shared_bytes](A, B, W)
        BIAS_FINISH[(out, bias_type)][p.reduce_grid, spec.reduce_block, s](W, bias, C)
        return
    #: the arrays a bias-epilogue rung takes right after C
    extra = [] if not spec.bias_arg else [
        bias if bias is not None else np.zeros((0, N), np.dtype(spec.kernel_dtypes[0]))]

    if out16 is not None and p.splits <= 1:   # as run_rounded: float32 first, then rounded
        W = np.empty((M, N), np.float32)
        launch(p, A, B, W, M, N, K, stream, bias=bias, bias_type=bias_type)
        REDUCE16[out16][p.reduce_grid, spec.reduce_block, s](W, C)
        return
    if spec.tma_boxes:
        from gemmlib import tma

        if K == 0:   # as on the GPU (run): C = 0 without the kernel
            C[...] = 0
            return
        if spec.b_prep is not None:   # as on the GPU (run): the kernel reads B.T
            Bt = np.empty((N, K), dtype=B.dtype)
            spec.b_prep[spec.b_prep_grid(K, N), spec.b_prep_block, s](B, Bt)
            B = Bt
        arrays, boxes, dC = (A, B), spec.tma_boxes, None
        if spec.tma_store_box:
            dC = _simulated_device_copy(C)
            if spec.c_map_ok(N, dC._ary.ctypes.data):   # the kernel's test, on its C
                arrays, boxes = (A, B, dC._ary), spec.tma_boxes + (spec.tma_store_box,)
        maps = tma.simulated_maps(arrays, boxes, spec.tma_swizzle,
                                  tuple(scales) if spec.scale_words else ())
        work = [np.zeros((r, c), dtype=dt) for r, c, dt in p.workspace]
        spec.kernel[p.grid, p.block, s, p.shared_bytes](A, B, C if dC is None else dC, *extra,
                                                        *work, np.uint64(maps))
        if dC is not None:
            C[...] = dC._ary
        return
    if p.splits <= 1:   # (a rung that sums its K slices itself takes its workspace after C)
        work = [np.zeros((r, c), dtype=dt) for r, c, dt in p.workspace]
        spec.kernel[p.grid, p.block, s, p.shared_bytes](A, B, C, *extra, *work)
        return
    W = np.empty((p.splits * M, N), dtype=np.float32)
    spec.kernel[p.grid, p.block, s, p.shared_bytes](A, B, W)
    reduce = spec.reduce_kernel if out16 is None else REDUCE16[out16]
    reduce[p.reduce_grid, spec.reduce_block, s](W, C)


def _simulated_device_copy(C):
    """C as a simulated device array at C's own offset from 16 bytes (the kernel tests it).
    The simulator copies a NumPy argument in and back, so a TMA-store twin that wrote C
    itself would be overwritten: kernel and twin must write one array."""
    from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

    raw = np.empty(C.nbytes + 16, np.uint8)
    off = (C.ctypes.data - raw.ctypes.data) % 16
    copy = raw[off:off + C.nbytes].view(C.dtype).reshape(C.shape)
    copy[...] = C
    return FakeCUDAArray(copy)


def stream_handle(stream=None) -> int:
    """The raw CUstream of a CuPy, numba or torch stream (None: the framework's current
    stream, :func:`gemmlib.runtime.memory.current_stream`)."""
    if stream is None:
        return memory.current_stream()
    if hasattr(stream, "ptr"):  # CuPy
        return int(stream.ptr)
    if hasattr(stream, "cuda_stream"):  # torch.cuda.Stream
        return int(stream.cuda_stream)
    return int(stream)  # numba streams convert to their handle


def warm(kernel, M: int, N: int, K: int) -> Plan:
    """Make the plan and load its kernels now (compiling them if the cache misses)."""
    p = plan(kernel, M, N, K)
    if not SIMULATOR:
        _bound(p)
    return p

