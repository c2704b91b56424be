"""Autotuning: search tile parameters, remember the fastest per GPU and shape class.

The best tile sizes depend on the GPU (SM count, registers, shared memory)
and on the problem's shape, and a few choices interact in ways no formula
predicts well (registers vs occupancy vs instruction-level parallelism).
So: try them.  :func:`tune` walks a search space of parameter sets for one
rung (by default :mod:`gemmlib.kernels.warptile`):

1. every candidate is *built* (cheap: compilation is lazy) and its
   constraints -- threads, registers, shared memory, tile divisibility --
   are checked against the device *before anything is compiled*; a
   candidate that fails is recorded with the reason and skipped;
2. the survivors are compiled, checked against cuBLAS for correctness and
   timed (CUDA events, median of ``reps`` runs after warm-up); compiled
   registers per thread, local-memory bytes (spills) and shared memory are
   recorded too;
3. the fastest is stored per *shape class* (M*N and K rounded to powers of
   two) in a JSON file per GPU.

Lookups (:func:`gemmlib.tuning.best_params`, and ``kernel="auto"`` through
:func:`gemmlib.dispatch.select`) read, in order, the user cache
(``$GEMMLIB_CACHE`` or ``$XDG_CACHE_HOME/gemmlib`` or ``~/.cache/gemmlib``,
``tuning/<gpu-slug>.json``) and the tables shipped with the package
(``gemmlib/data/tuning/<gpu-slug>.json``); with neither -- or in the simulator --
they fall back to the rung's default configuration.  Reads and writes hold a
lock, and files are replaced atomically, so threads (and processes) never
see half-written data.
"""

from __future__ import annotations

import importlib
import itertools
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from gemmlib import backend, dispatch
from gemmlib.tuning import (  # noqa: F401  (the tuning data API, re-exported here)
    _LOCK, PACKAGE_TUNING_DIR, _read, _write, best_entry, best_params, cache_paths, update,
    gpu_slug, nearest_class, shape_class, user_cache_dir)

DEFAULT_KERNEL = "warptile"

def build(kernel: str, params: dict | None):
    """KernelSpec of rung ``kernel`` with ``params`` (its default when None): built once."""
    return dispatch.build(kernel, params)


def select(M: int, N: int, K: int, kernel: str = DEFAULT_KERNEL, slug: str | None = None):
    """What ``kernel="auto"`` runs for (M, N, K): :func:`gemmlib.dispatch.select`."""
    return dispatch.select(M, N, K, slug)


AUTO_SHAPE = dispatch.AUTO_SHAPE


def auto_spec():
    """What ``get_kernel("auto")`` returns: the choice for AUTO_SHAPE on this GPU."""
    return dispatch.select(*AUTO_SHAPE)


# --------------------------------------------------------------------------
# Search spaces


def warptile_space():
    """Parameter sets for the warptile rung: a grid, trimmed to plausible shapes.

    Kept here are: 128 or 256 threads, 32 to 128 results per thread, and
    float4-friendly warp layouts.  Everything else -- divisibility, registers,
    shared memory -- is left to the constraints, which reject with a reason.
    """
    mod = importlib.import_module("gemmlib.kernels.warptile")
    out = []
    for BM, BN, BK, WM, WN, WNITER, TM, TN in itertools.product(
            (64, 128, 256), (64, 128, 256), (8, 16, 32), (32, 64, 128), (32, 64, 128),
            (1, 2, 4), (4, 8), (4, 8)):
        # no padding: the swizzled store is conflict-free without it (padding on top of
        # the swizzle can undo it, e.g. for BK=8)
        p = dict(BM=BM, BN=BN, BK=BK, WM=WM, WN=WN, WNITER=WNITER, TM=TM, TN=TN, PAD=0)
        d = mod._derived(p)
        if d is None or d["NT"] not in (128, 256):
            continue
        per_thread = d["WMITER"] * TM * WNITER * TN
        if not 32 <= per_thread <= 128:
            continue
        out.append(p)
    return out


SPACES = {"warptile": warptile_space}

#: Configurations tried first whatever the search order: the rung's default and
#: layouts known to do well on other GPUs (siboehm's A100 warptile, the 64x128
#: block with 32x64 warp tiles).
CLASSICS = {"warptile": [
    dict(BM=256, BN=128, BK=16, WM=64, WN=64, WNITER=2, TM=8, TN=4, PAD=0),  # the default
    dict(BM=128, BN=256, BK=16, WM=64, WN=64, WNITER=2, TM=8, TN=4, PAD=0),
    dict(BM=128, BN=256, BK=8, WM=64, WN=64, WNITER=2, TM=8, TN=4, PAD=0),
    dict(BM=256, BN=128, BK=8, WM=64, WN=64, WNITER=2, TM=8, TN=4, PAD=0),
    dict(BM=128, BN=128, BK=16, WM=64, WN=32, WNITER=2, TM=4, TN=4, PAD=4),
    dict(BM=128, BN=128, BK=16, WM=64, WN=64, WNITER=4, TM=8, TN=4, PAD=4),
    dict(BM=64, BN=128, BK=16, WM=32, WN=64, WNITER=2, TM=8, TN=4, PAD=4),
    dict(BM=128, BN=128, BK=8, WM=64, WN=32, WNITER=2, TM=4, TN=4, PAD=0),
    dict(BM=128, BN=128, BK=16, WM=32, WN=128, WNITER=4, TM=8, TN=4, PAD=0),
    dict(BM=128, BN=128, BK=16, WM=64, WN=64, WNITER=2, TM=8, TN=8, PAD=4),
    dict(BM=64, BN=128, BK=16, WM=64, WN=32, WNITER=1, TM=8, TN=8, PAD=4),
    dict(BM=128, BN=128, BK=8, WM=64, WN=64, WNITER=2, TM=8, TN=8, PAD=0),
    dict(BM=64, BN=64, BK=16, WM=32, WN=32, WNITER=1, TM=4, TN=8, PAD=0),
]}


def _classic(BM: int, BN: int, BK: int = 16) -> dict:
    """The first classic warptile configuration with this block tile."""
    return next(p for p in CLASSICS["warptile"] if (p["BM"], p["BN"], p["BK"]) == (BM, BN, BK))


#: The tiles the split-K tuning pairs with slice counts (``scripts/tune.py --candidates split``):
#: the default, its transpose, the square 128 x 128, the small tiles tuned for 1024^2 and
#: 4096 x 2048 outputs, and 64 x 64.
SPLIT_TILES = {"warptile": [
    _classic(256, 128), _classic(128, 256), _classic(128, 128), _classic(64, 128),
    dict(BM=128, BN=64, BK=16, WM=64, WN=32, WNITER=1, TM=8, TN=8, PAD=4), _classic(64, 64),
]}


def _conflict_free(kernel: str, p: dict) -> bool:
    """True when gemmlib.banks finds no conflict in the inner-loop shared loads."""
    from gemmlib import banks

    spec = build(kernel, p)
    return all(r.degree == 1.0 for r in banks.analyze(spec) if r.access.op == "load")


def default_candidates(kernel: str = DEFAULT_KERNEL, limit: int | None = None,
                       diverse: bool = True, register_caps: bool = False):
    """The search space of ``kernel``, ordered by a rough preference (first = tried first).

    With ``diverse`` (the default) only one warp layout is kept per (block tile,
    BK, threads, thread-tile size) -- the one whose warp tile is squarest and
    whose fragment loads are free of bank conflicts -- so a short search still
    covers different block shapes instead of 30 variants of one.
    """
    cands = SPACES[kernel]()

    def per_thread(p):
        return p["BM"] * p["BN"] // _threads(kernel, p)

    def score(p):  # prefer 128x128 tiles, BK 16, 64 results per thread
        return (abs(math.log2(p["BM"] * p["BN"]) - 14), abs(math.log2(p["BM"] / p["BN"])),
                abs(math.log2(p["BK"]) - 4), abs(math.log2(per_thread(p)) - 6))

    if diverse:
        groups: dict = {}
        for p in cands:
            key = (p["BM"], p["BN"], p["BK"], _threads(kernel, p))
            fm = p["BM"] * p["BN"] // _threads(kernel, p) // (p["WNITER"] * p["TN"])
            fn = p["WNITER"] * p["TN"]  # the thread tile is fm x fn
            rank = (not _conflict_free(kernel, p), abs(math.log2(fm / fn)),
                    abs(math.log2(p["WM"] / p["WN"])), -p["TM"] * p["TN"], p["WNITER"])
            if key not in groups or rank < groups[key][0]:
                groups[key] = (rank, p)
        cands = [p for _, p in groups.values()]
    cands.sort(key=score)
    classics = CLASSICS.get(kernel, [])
    cands = classics + [p for p in cands if p not in classics]
    cands = cands[:limit] if limit else cands
    return with_register_caps(kernel, cands) if register_caps else cands


def with_register_caps(kernel: str, cands):
    """Each candidate, then the same with ``max_registers`` capped so that one more block fits
    an SM (65536 registers): 128 for 256 threads (2 blocks), 168 and 128 for 128 threads."""
    out = []
    for p in cands:
        out.append(p)
        nt = _threads(kernel, p)
        for cap in {256: (128,), 128: (168, 128)}.get(nt, ()):
            out.append(dict(p, max_registers=cap))
    return out


def _threads(kernel: str, p: dict) -> int:
    mod = importlib.import_module(f"gemmlib.kernels.{kernel}")
    return mod._derived({k: v for k, v in p.items() if k != "max_registers"})["NT"]


# --------------------------------------------------------------------------
# Tuning


@dataclass
class Trial:
    params: dict
    status: str  # "rejected" | "failed" | "wrong" | "timed"
    reason: str = ""
    ms: float = math.nan
    tflops: float = math.nan
    registers: int | None = None
    local_bytes: int | None = None
    shared_bytes: int | None = None
    #: K slices (split-K); 1 = the plain rung
    splits: int = 1


@dataclass
class TuneResult:
    kernel: str
    shape: tuple[int, int, int]
    trials: list[Trial] = field(default_factory=list)
    cublas_ms: float = math.nan

    @property
    def best(self) -> Trial | None:
        timed = [t for t in self.trials if t.status == "timed"]
        return min(timed, key=lambda t: t.ms) if timed else None

    def table(self) -> str:
        lines = []
        for t in sorted(self.trials, key=lambda t: (t.status != "timed", t.ms)):
            p = ",".join(f"{k}={v}" for k, v in t.params.items())
            p += f" splits={t.splits}" if t.splits > 1 else ""
            if t.status == "timed":
                pct = 100 * self.cublas_ms / t.ms if self.cublas_ms == self.cublas_ms else math.nan
                lines.append(f"  {t.ms:8.3f} ms {t.tflops:6.2f} TFLOP/s {pct:5.1f}% cuBLAS "
                             f"regs {t.registers} local {t.local_bytes} smem {t.shared_bytes}  {p}")
            else:
                lines.append(f"  {t.status:>8}: {t.reason[:160]}  {p}")
        return "\n".join(lines)


def _first(v):
    """numba returns per-signature dicts from get_regs_per_thread() and friends."""
    if isinstance(v, dict):
        return next(iter(v.values()), None) if v else None
    return v


def compiled_resources(spec) -> dict:
    """Registers/thread, local (spill) bytes/thread and shared bytes/block of the compiled kernel.

    Read from the driver for the kernel the dispatch layer loaded (GPU), else from numba.
    """
    if not backend.SIMULATOR:
        try:
            c = dispatch.compiled_spec(spec)
            c.function(dispatch.driver().current_context())
            return {"registers": c.registers, "local_bytes": c.local_bytes,
                    "shared_bytes": c.static_shared_bytes}
        except Exception:
            pass
    k = spec.kernel
    out = {}
    for key, meth in (("registers", "get_regs_per_thread"), ("local_bytes", "get_local_mem_per_thread"),
                      ("shared_bytes", "get_shared_mem_per_block")):
        try:
            out[key] = int(_first(getattr(k, meth)()))
        except Exception:
            out[key] = None
    return out


def time_spec(spec, A, B, C, reps: int = 10, warmup: int = 2) -> float:
    """Median milliseconds of one launch (the benchmark harness's timing; GPU only)."""
    from gemmlib.bench import time_fn

    M, K = A.shape
    N = B.shape[1]
    p = dispatch.warm(spec, M, N, K)
    return time_fn(lambda: dispatch.launch(p, A, B, C, M, N, K), reps, warmup).median


def tune(shape=AUTO_SHAPE, kernel: str = DEFAULT_KERNEL, candidates=None, *, limit: int = 24,
         reps: int = 10, time_budget_s: float | None = None, save: bool = True,
         path: Path | None = None, log=print, splits=(1,)) -> TuneResult:
    """Search ``candidates`` (default: :func:`default_candidates`) for ``shape`` on this GPU.

    Each candidate tile is tried with every slice count in ``splits`` (1 = the
    plain rung, S > 1 = the split-K rung with S slices; the slices share one
    compiled kernel).  Rejected candidates never compile.  With ``save``, the
    best (tile and slice count) is merged into ``path`` (default: the user
    cache) under the shape's class.
    """
    M, N, K = shape
    dev = backend.device_info()
    cands = list(candidates) if candidates is not None else default_candidates(kernel)
    trials = [(p, S) for p in cands for S in splits]  # (tile, slice count)
    result = TuneResult(kernel, (M, N, K))
    if backend.SIMULATOR:  # constraints only: timings would be meaningless
        for p, S in trials:
            why = _trial_spec(kernel, p, S).failed_constraints(M, N, K, dev)
            result.trials.append(Trial(p, "rejected" if why else "not timed (simulator)",
                                       "; ".join(why), splits=S))
        return result

    from gemmlib.api import matmul
    from gemmlib.verify import tolerance

    cp = backend.array_module()
    A = backend.random_matrix((M, K), rng=1)
    B = backend.random_matrix((K, N), rng=2)
    C = cp.empty((M, N), dtype=cp.float32)
    ref = backend.reference(A, B)
    result.cublas_ms = time_spec_cublas(A, B, C, reps)
    t_start = time.perf_counter()
    timed = 0
    for p, S in trials:
        spec = _trial_spec(kernel, p, S)
        why = spec.failed_constraints(M, N, K, dev)
        if why:
            result.trials.append(Trial(p, "rejected", "; ".join(why), splits=S))
            continue
        if timed >= limit or (time_budget_s and time.perf_counter() - t_start > time_budget_s):
            result.trials.append(Trial(p, "skipped", "search budget spent", splits=S))
            continue
        timed += 1
        try:
            C.fill(cp.nan)
            matmul(A, B, out=C, kernel=spec)
            err = backend.relative_error(C, ref)
            res = compiled_resources(spec)
            if not err <= tolerance("float32", K):
                result.trials.append(Trial(p, "wrong", f"rel. error {err:.2e}", splits=S, **res))
                continue
            ms = time_spec(spec, A, B, C, reps)
            result.trials.append(Trial(p, "timed", "", ms, 2e-9 * M * N * K / ms, splits=S, **res))
            if log:
                log(f"  {ms:7.3f} ms {100 * result.cublas_ms / ms:5.1f}% regs {res['registers']} "
                    f"local {res['local_bytes']} {spec.name}")
        except Exception as e:  # a compile or launch error is a finding, not a crash
            result.trials.append(Trial(p, "failed", f"{type(e).__name__}: {e}".splitlines()[0],
                                       splits=S))
    if save and result.best is not None:
        record(result, path=path)
    return result


def _trial_spec(kernel: str, p: dict, S: int):
    """The spec a trial runs: tile ``p`` of ``kernel``, split into ``S`` K slices when S > 1."""
    return build(kernel, p) if S == 1 else build("split_k", dict(p, SPLITS=S))


def time_spec_cublas(A, B, C, reps: int = 10) -> float:
    """Median milliseconds of cuBLAS on the same operands, timed the same way."""
    from gemmlib.bench import time_fn

    return time_fn(lambda: backend.cublas_matmul(A, B, out=C), reps).median


def record(result: TuneResult, path: Path | None = None, slug: str | None = None) -> Path:
    """Merge ``result``'s best configuration into the tuning file (user cache by default)."""
    best = result.best
    if best is None:
        raise ValueError("nothing was timed: nothing to record")
    dev = backend.device_info()
    slug = slug or gpu_slug(dev.name)
    path = Path(path) if path else user_cache_dir() / f"{slug}.json"
    M, N, K = result.shape
    entry = {"params": best.params, "splits": best.splits, "shape": [M, N, K],
             "ms": round(best.ms, 4),
             "tflops": round(best.tflops, 2),
             "cublas_ms": round(result.cublas_ms, 4),
             "pct_of_cublas": round(100 * result.cublas_ms / best.ms, 1),
             "registers": best.registers, "local_bytes": best.local_bytes,
             "shared_bytes": best.shared_bytes,
             "candidates_timed": sum(t.status == "timed" for t in result.trials),
             "candidates_rejected": sum(t.status == "rejected" for t in result.trials),
             "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}

    def change(data):
        data.update(gpu=dev.name, gpu_slug=slug,
                    compute_capability=f"{dev.compute_capability[0]}.{dev.compute_capability[1]}",
                    sm_count=dev.sm_count)
        data.setdefault("kernels", {}).setdefault(result.kernel, {})[
            shape_class(M, N, K)] = entry

    update(path, change)
    return path


def trials_json(result: TuneResult) -> dict:
    """Every trial (for committing the full search log beside the best choice)."""
    return {"kernel": result.kernel, "shape": list(result.shape), "cublas_ms": result.cublas_ms,
            "trials": [asdict(t) for t in result.trials]}
