"""The benchmark harness: honest GPU timings of gemmlib kernels against cuBLAS.

Two timings, each row saying which (``timing``):

* ``"kernel"``: CUDA events around the launch alone (operands checked and the
  launch planned beforehand) -- what the kernel costs, to explain it;
* ``"call"``: CUDA events around the public call ``gemmlib.matmul(A, B,
  out=C)`` as a user makes it, checks, choice of kernel and launch included --
  what a caller receives.  These rows also carry ``host_us``: the host time of
  one call (median over back-to-back calls timed on the CPU clock).  cuBLAS is
  timed the same way, as the call ``cupy.matmul(A, B, out=C)``.

How each number is made:

* CUDA events, on the stream the work runs on;
* warm-up launches first (compilation, module load, cuBLAS handle creation);
* the median of ``reps`` timed runs (at least 10), with the spread
  (interquartile range / median) reported beside it;
* before every timed run the L2 cache is flushed by writing a buffer twice
  its size, so small problems are not flattered by inputs already on chip;
* cuBLAS (through CuPy, TF32 off) is timed the same way, in the same run, on
  the same inputs (as A @ B, and as A @ Bt.T for kernels that take B
  transposed, row ``cublas_nt``), and every kernel's result is checked first;
* the GPU, its clocks and the software versions are recorded with the result.

In the simulator the harness still runs end to end (useful to test it), but
simulated timings mean nothing and are marked so.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import platform
import re
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path

import numpy as np

from gemmlib import backend, dispatch
from gemmlib.api import matmul
from gemmlib.kernels import LADDER, SCALED, get as get_kernel
from gemmlib.verify import tolerance

SQUARES = (128, 256, 512, 1024, 2048, 4096, 8192)
#: Non-square and odd shapes, (M, N, K): tall, wide, short-K, and off-tile sizes.
OTHERS = ((8192, 2048, 1024), (1024, 8192, 4096), (4096, 4096, 256),
          (4095, 3073, 2047), (1999, 2001, 1997),
          # deep K against a small output (split-K territory), and all-odd
          (1024, 1024, 8192), (8192, 256, 8192), (777, 1999, 3001), (4095, 4097, 4093))
SIM_SHAPES = ((16, 16, 16), (33, 17, 9))  # the simulator is ~10^6 times slower


def default_shapes():
    if backend.SIMULATOR:
        return list(SIM_SHAPES)
    return [(n, n, n) for n in SQUARES] + list(OTHERS)


@dataclass
class Timing:
    """Per-run times in milliseconds and the statistics made from them."""

    times_ms: list[float]

    @property
    def median(self) -> float:
        return statistics.median(self.times_ms)

    def quantile(self, q: float) -> float:
        xs = sorted(self.times_ms)
        pos = q * (len(xs) - 1)
        lo, hi = math.floor(pos), math.ceil(pos)
        return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)

    @property
    def spread(self) -> float:
        """Interquartile range over median: 0.01 means the middle half lies within 1%."""
        m = self.median
        return (self.quantile(0.75) - self.quantile(0.25)) / m if m > 0 else float("nan")


@dataclass
class Row:
    kernel: str
    M: int
    N: int
    K: int
    median_ms: float
    p25_ms: float
    p75_ms: float
    min_ms: float
    max_ms: float
    spread: float
    reps: int
    tflops: float
    cublas_median_ms: float
    cublas_tflops: float
    pct_of_cublas: float
    rel_error_vs_fp64: float
    note: str = ""
    #: "kernel": events around the launch alone; "call": around gemmlib.matmul(A, B, out=C)
    timing: str = "kernel"
    #: host microseconds per call (call rows; None for kernel rows)
    host_us: float | None = None
    #: what the kernel computed in (gemmlib.precision) and the cuBLAS it was compared with
    precision: str = "fp32"
    cublas_precision: str = "fp32"
    #: cuBLAS's own error against float64 in this run (precision rows)
    cublas_rel_error: float | None = None


@dataclass
class Result:
    meta: dict
    rows: list[Row] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"meta": self.meta, "rows": [asdict(r) for r in self.rows]}

    def save(self, directory="results", stem=None) -> tuple[Path, Path]:
        """Write ``<stem>.json`` and ``<stem>.csv``; the stem names the date and GPU."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        stem = stem or f"bench-{self.meta['gpu_slug']}-{self.meta['date'][:10]}"
        pj, pc = d / f"{stem}.json", d / f"{stem}.csv"
        pj.write_text(json.dumps(self.to_json(), indent=1) + "\n")
        cols = list(Row.__dataclass_fields__)
        lines = [",".join(cols)] + [",".join(_csv(getattr(r, c)) for c in cols) for r in self.rows]
        pc.write_text("\n".join(lines) + "\n")
        return pj, pc

    def table(self) -> str:
        head = (f"{'kernel':>14} {'timing':>6} {'M':>6} {'N':>6} {'K':>6} {'ms':>9} "
                f"{'TFLOP/s':>8} {'cuBLAS':>8} {'%cuBLAS':>8} {'spread':>7} {'host us':>8}")
        out = [head]
        for r in self.rows:
            host = f"{r.host_us:8.1f}" if r.host_us is not None else f"{'':>8}"
            out.append(f"{r.kernel:>14} {r.timing:>6} {r.M:>6} {r.N:>6} {r.K:>6} "
                       f"{r.median_ms:>9.3f} {r.tflops:>8.2f} {r.cublas_tflops:>8.2f} "
                       f"{r.pct_of_cublas:>7.1f}% {100 * r.spread:>6.2f}% {host}"
                       f"{' ' + r.note if r.note else ''}")
        return "\n".join(out)


def _csv(v) -> str:
    s = f"{v:.6g}" if isinstance(v, float) else "" if v is None else str(v)
    return f'"{s}"' if "," in s else s


def load(path) -> Result:
    """A result file; rows written before ``timing`` existed are kernel timings."""
    data = json.loads(Path(path).read_text())
    return Result(meta=data["meta"], rows=[Row(**r) for r in data["rows"]])


# --------------------------------------------------------------------------
# Environment record


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def _nvidia_smi(fields: str) -> dict:
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits", "-i", "0"],
            capture_output=True, text=True, timeout=20).stdout.strip().splitlines()[0]
        return dict(zip(fields.split(","), (v.strip() for v in out.split(","))))
    except Exception:
        return {}


def environment() -> dict:
    """GPU, clocks and software versions, recorded with every result."""
    now = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    meta = {
        "date": now,
        "simulated": backend.SIMULATOR,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "numba": _version("numba"),
        "numba_cuda": _version("numba-cuda"),
        "cupy": _version("cupy-cuda13x") if _version("cupy-cuda13x") != "not installed"
        else _version("cupy-cuda12x"),
        "precision": "float32 (TF32 off: CUPY_TF32=0)",
    }
    dev = backend.device_info()
    meta.update(gpu=dev.name, compute_capability=f"{dev.compute_capability[0]}."
                f"{dev.compute_capability[1]}", sm_count=dev.sm_count,
                max_sm_clock_mhz=dev.max_sm_clock_mhz, l2_bytes=dev.l2_bytes,
                fp32_peak_tflops=round(dev.fp32_peak_tflops, 2))
    meta["gpu_slug"] = re.sub(r"[^a-z0-9]+", "-", dev.name.lower()).strip("-")
    if not backend.SIMULATOR:
        cp = backend.array_module()
        meta["cuda_driver"] = cp.cuda.runtime.driverGetVersion()
        meta["cuda_runtime"] = cp.cuda.runtime.runtimeGetVersion()
        try:
            meta["cublas"] = cp.cuda.cublas.getVersion(cp.cuda.device.get_cublas_handle())
        except Exception:
            pass
        meta.update({f"smi_{k.replace('.', '_')}": v for k, v in _nvidia_smi(
            "driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit,"
            "temperature.gpu").items()})
    return meta


# --------------------------------------------------------------------------
# Timing


class Timer:
    """Times one callable with CUDA events, flushing L2 before every run.

    ``idle_start``: wait for the flush to finish before the start event, so
    the GPU is idle when the call begins and its host work shows between the
    events (call timing).  Without it (kernel timing) the host work of the
    launch overlaps the flush and only the GPU's time is measured.
    """

    def __init__(self, flush_l2: bool = True, idle_start: bool = False, scratch=None):
        self.cp = backend.array_module()
        l2 = backend.device_info().l2_bytes
        if scratch is None and flush_l2:
            scratch = self.cp.empty(max(2 * l2, 1 << 20) // 4, dtype=np.float32)
        self.scratch = scratch if flush_l2 else None
        self.idle_start = idle_start
        self.start, self.end = self.cp.cuda.Event(), self.cp.cuda.Event()

    def __call__(self, fn, reps: int, warmup: int) -> Timing:
        for _ in range(warmup):
            fn()
        times = []
        for i in range(reps):
            if self.scratch is not None:
                self.scratch.fill(i)  # evicts A, B and C from L2
            if self.idle_start:
                self.cp.cuda.get_current_stream().synchronize()
            self.start.record()
            fn()
            self.end.record()
            self.end.synchronize()
            times.append(self.cp.cuda.get_elapsed_time(self.start, self.end))
        return Timing(times)


def time_fn(fn, reps: int = 10, warmup: int = 2, flush_l2: bool = True) -> Timing:
    """Time ``fn`` (which launches GPU work on the current stream) the harness's way."""
    return Timer(flush_l2)(fn, reps, warmup)


def _reps_for(seconds_per_run: float, reps: int, budget_s: float) -> int:
    """At least 10 runs; fewer than asked only when a run is slow (naive at 8192^3)."""
    if seconds_per_run <= 0:
        return reps
    return max(10, min(reps, int(budget_s / seconds_per_run)))


def benchmark(kernels=None, shapes=None, *, reps: int = 30, warmup: int = 3,
              budget_s: float = 20.0, flush_l2: bool = True, progress: bool = True,
              seed: int = 0, timing: str = "kernel") -> Result:
    """Time every kernel on every shape against cuBLAS; returns a :class:`Result`.

    ``timing`` is ``"kernel"`` (the launch alone), ``"call"`` (the public call
    ``gemmlib.matmul(A, B, out=C)``, with its host cost) or ``"both"``.
    ``budget_s`` caps the timed seconds per (kernel, shape): slow kernels get
    fewer repetitions, never fewer than 10.
    """
    if timing not in ("kernel", "call", "both"):
        raise ValueError(f"timing must be 'kernel', 'call' or 'both', not {timing!r}")
    modes = ("kernel", "call") if timing == "both" else (timing,)
    # By default every rung, then "auto": what matmul runs when no kernel is named (the
    # tuned configuration for each shape's class), so its row is the library's number.
    # []: cuBLAS alone.  FP8 rungs (SCALED) compare with torch._scaled_mm, not here
    names = ([n for n in LADDER if n not in SCALED] + ["auto"] if kernels is None
             else list(kernels))
    shapes = [tuple(int(v) for v in s) for s in (shapes or default_shapes())]
    if backend.SIMULATOR:
        return _simulated(names, shapes, progress)
    from tqdm import tqdm  # the text bar: tqdm.auto warns in notebooks without ipywidgets

    cp = backend.array_module()
    kernel_timer = Timer(flush_l2)
    call_timer = Timer(flush_l2, idle_start=True, scratch=kernel_timer.scratch)
    timers = {"kernel": kernel_timer, "call": call_timer}
    result = Result(meta=environment())
    result.meta.update(reps_requested=reps, warmup=warmup, flush_l2=flush_l2, budget_s=budget_s,
                       timing=timing)
    bar = tqdm(total=len(shapes) * (len(modes) * len(names) + 1), disable=not progress,
               desc="bench")
    for (M, N, K) in shapes:
        A = backend.random_matrix((M, K), np.float32, seed)
        B = backend.random_matrix((K, N), np.float32, seed + 1)
        Bt = cp.ascontiguousarray(B.T)
        C = cp.empty((M, N), dtype=np.float32)
        ref = backend.reference(A, B)
        flops = 2.0 * M * N * K

        bar.set_postfix_str(f"cuBLAS {M}x{N}x{K}")
        cublas_call = lambda: cp.matmul(A, B, out=C)  # noqa: E731
        # cuBLAS timed each way the kernels are: events around the launch, and around the call
        cubs = {mode: timers[mode](cublas_call, reps, warmup) for mode in modes}
        cub = cubs[modes[0]]
        cublas_err = backend.relative_error(C, ref)
        cub_host = host_time(cublas_call, reps) if "call" in modes else None
        # Kernels that take B transposed (C = A @ Bt.T) race cuBLAS doing the same.
        cub_nt = cublas_nt_err = None
        if any(_spec(n, M, N, K).b_operand == "NK" for n in names) or not names:
            cub_nt = kernel_timer(lambda: cp.matmul(A, Bt.T, out=C), reps, warmup)
            cublas_nt_err = backend.relative_error(C, ref)
        bar.update()
        for mode in modes:
            for name in names:
                bar.set_postfix_str(f"{name} {mode} {M}x{N}x{K}")
                row = _measure(name, mode, A, B, Bt, C, ref, M, N, K, timers[mode], reps,
                               warmup, budget_s, flops, cubs[mode], cub_nt, result,
                               note_skip=mode == modes[0])
                if row is not None:
                    result.rows.append(row)
                bar.update()
        for mode in modes:
            result.rows.append(_row("cublas", M, N, K, cubs[mode], flops, cubs[mode], cublas_err,
                                    timing=mode, host_us=cub_host if mode == "call" else None))
            if cub_nt is not None:
                result.rows.append(_row("cublas_nt", M, N, K, cub_nt, flops, cub_nt,
                                        cublas_nt_err, timing=mode))
        del A, B, Bt, C, ref
        cp.get_default_memory_pool().free_all_blocks()
    bar.close()
    result.meta.update({f"after_smi_{k.replace('.', '_')}": v
                        for k, v in _nvidia_smi("clocks.sm,temperature.gpu").items()})
    return result


def _measure(name, mode, A, B, Bt, C, ref, M, N, K, timer, reps, warmup, budget_s, flops,
             cub, cub_nt, result, note_skip=True):
    """One row: kernel ``name`` on this shape, timed as ``mode``; None when it cannot run
    (recorded in ``result.meta["skipped"]`` when ``note_skip``: once per kernel and shape)."""
    spec = _spec(name, M, N, K)
    failed = spec.failed_constraints(M, N, K, backend.device_info())
    if failed:
        if note_skip:
            result.meta.setdefault("skipped", []).append(
                {"kernel": name, "shape": [M, N, K], "why": failed})
        return None
    nt = spec.b_operand == "NK"
    Bk = Bt if nt else B
    C.fill(np.nan)
    kernel = name if name == "auto" or mode == "call" else spec
    matmul(A, Bk, out=C, kernel=kernel, transpose_b=nt)  # compiles; checks operands once
    err = backend.relative_error(C, ref)
    if not err <= tolerance(spec.dtype, K):
        raise AssertionError(f"{name} is wrong at {M}x{N}x{K}: rel. error {err:.2e}")
    if mode == "kernel":  # the launch alone: operands were checked above
        p = dispatch.warm(spec, M, N, K)
        run = lambda: dispatch.launch(p, A, Bk, C, M, N, K)  # noqa: E731
    else:  # the public call, as a user writes it
        run = lambda: matmul(A, Bk, out=C, kernel=kernel, transpose_b=nt)  # noqa: E731
    probe = timer(run, 1, 1)
    n = _reps_for(probe.median / 1e3, reps, budget_s)
    t = timer(run, n, max(0, warmup - 2))
    host = host_time(run, n) if mode == "call" else None
    row = _row(name, M, N, K, t, flops, cub_nt if nt else cub, err, timing=mode, host_us=host)
    if name == "auto" or spec.name != name:
        row.note = spec.name  # the configuration that ran
    return row


def host_time(fn, calls: int = 20, warmup: int = 3) -> float:
    """Median host microseconds of one ``fn()`` (CPU clock around each call, no sync).

    The calls run back to back, as in a loop of a user's program: the GPU work
    is queued, not waited for, so this is the time the call keeps the CPU.
    """
    cp = backend.array_module()
    for _ in range(warmup):
        fn()
    cp.cuda.runtime.deviceSynchronize()
    times = []
    for _ in range(max(calls, 1)):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    cp.cuda.runtime.deviceSynchronize()
    return statistics.median(times) * 1e6


def _spec(name: str, M: int, N: int, K: int):
    """The spec a bench row runs: a rung by name, or "auto"'s choice for this shape."""
    if name == "auto":
        return dispatch.select(M, N, K)
    return get_kernel(name)


def _row(name, M, N, K, t: Timing, flops, cub: Timing, err, timing="kernel",
         host_us=None) -> Row:
    return Row(kernel=name, M=M, N=N, K=K, median_ms=t.median, p25_ms=t.quantile(0.25),
               p75_ms=t.quantile(0.75), min_ms=min(t.times_ms), max_ms=max(t.times_ms),
               spread=t.spread, reps=len(t.times_ms), tflops=flops / (t.median * 1e-3) / 1e12,
               cublas_median_ms=cub.median, cublas_tflops=flops / (cub.median * 1e-3) / 1e12,
               pct_of_cublas=100.0 * cub.median / t.median, rel_error_vs_fp64=float(err),
               timing=timing, host_us=host_us)


def _simulated(names, shapes, progress) -> Result:
    """Runs every kernel once per shape (checking it) and records no timing."""
    print("NOTE: simulator mode (NUMBA_ENABLE_CUDASIM=1): kernels run as Python threads; "
          "timings there mean nothing, so none are recorded. Run on a GPU to benchmark.")
    from gemmlib.verify import check_once

    result = Result(meta=environment())
    for (M, N, K) in shapes:
        for name in names:
            chk = check_once(_spec(name, M, N, K), M, N, K)
            nan = float("nan")
            result.rows.append(Row(name, M, N, K, nan, nan, nan, nan, nan, nan, 0, nan, nan,
                                   nan, nan, chk.rel_error, note="simulated: not timed"))
            if progress:
                print(f"  {name:>14} {M}x{N}x{K}: ran, rel. error {chk.rel_error:.1e}")
    return result


# --------------------------------------------------------------------------
# Host cost of a call, step by step


_FIRST_CALL = """
import time
t0 = time.perf_counter()
import cupy as cp, gemmlib
t1 = time.perf_counter()
A = cp.random.rand({n}, {n}, dtype=cp.float32); B = cp.random.rand({n}, {n}, dtype=cp.float32)
cp.cuda.runtime.deviceSynchronize()
t2 = time.perf_counter()
C = gemmlib.matmul(A, B)
cp.cuda.runtime.deviceSynchronize()
t3 = time.perf_counter()
from gemmlib import dispatch
print("RESULT", t1 - t0, t3 - t2, dispatch.cache_info()["compiles"])
"""


def first_call(n: int = 512, cache_dir=None) -> dict:
    """Seconds of the first ``gemmlib.matmul`` in a fresh process: cold cache, then warm.

    Runs two child processes sharing a new, empty kernel cache (``cache_dir``,
    default a temporary directory): the first compiles, the second finds the
    kernels on disk.  Importing gemmlib (and numba, CuPy) is timed apart.
    """
    import os
    import tempfile

    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, GEMMLIB_CACHE=str(cache_dir or tmp))
        for label in ("cold", "warm"):
            r = subprocess.run([sys.executable, "-c", _FIRST_CALL.format(n=n)], env=env,
                               capture_output=True, text=True, timeout=600)
            line = next((x for x in r.stdout.splitlines() if x.startswith("RESULT")), None)
            if line is None:
                raise RuntimeError(f"first-call child failed: {r.stderr[-2000:]}")
            _, imp, call, compiles = line.split()
            out[f"{label}_s"] = float(call)
            out[f"{label}_compiles"] = int(compiles)
            out["import_s"] = float(imp)
    return out


def host_costs(shape=(64, 64, 64), calls: int = 2000) -> dict:
    """Where one call's host time goes, measured piece by piece (GPU only).

    ``rows``: whole calls -- cupy.matmul, gemmlib.matmul with and without
    ``out``, a bare numba launch (numba arrays, CuPy arrays) and the dispatch
    layer's driver launch alone.  ``steps``: the parts of one
    ``gemmlib.matmul(A, B, out=C)`` timed separately in the order the call
    runs them.  Each number is the median over ``calls`` back-to-back calls.
    """
    from gemmlib.backend import cuda
    from gemmlib.frontends.checks import check_operands
    from gemmlib.frontends.describe import describe

    cp = backend.array_module()
    M, N, K = shape
    A = backend.random_matrix((M, K), np.float32, 1)
    B = backend.random_matrix((K, N), np.float32, 2)
    C = cp.empty((M, N), dtype=np.float32)
    matmul(A, B, out=C)  # compile, plan
    p = dispatch.plan("auto", M, N, K)
    spec, geo = p.spec, p.spec.launch(M, N, K)
    na, nb_, nc = (cuda.as_cuda_array(x, sync=False) for x in (A, B, C))
    numba_launch = spec.kernel[geo.grid, geo.block]
    numba_launch(na, nb_, nc)
    ptrs = (A.data.ptr, B.data.ptr, C.data.ptr)
    rows = [
        ("cupy.matmul(A, B, out=C)", "cuBLAS through CuPy: the reference",
         lambda: cp.matmul(A, B, out=C)),
        ("cupy.matmul(A, B)", "the same, allocating C", lambda: cp.matmul(A, B)),
        ("gemmlib.matmul(A, B, out=C)", "the public call, default kernel ('auto')",
         lambda: matmul(A, B, out=C)),
        ("gemmlib.matmul(A, B)", "the same, allocating C", lambda: matmul(A, B)),
        ("numba launch, numba arrays", "kernel[grid, block](a, b, c): typing + launch",
         lambda: numba_launch(na, nb_, nc)),
        ("numba launch, CuPy arrays", "the same, each CuPy array wrapped per call",
         lambda: numba_launch(A, B, C)),
        ("dispatch.run", "pack the arguments + cuLaunchKernel (a planned call)",
         lambda: dispatch.run(p, *ptrs, 0)),
    ]
    a, b, c = describe(A, "A"), describe(B, "B"), describe(C, "out")
    base = dispatch.get_spec(dispatch.AUTO_RUNG)
    steps = [
        ("resolve kernel", lambda: dispatch.get_spec(dispatch.AUTO_RUNG)),
        ("describe operands", lambda: (describe(A, "A"), describe(B, "B"), describe(C, "out"))),
        ("check operands", lambda: check_operands(base, a, b, c, False)),
        ("plan (memoised)", lambda: dispatch.plan("auto", M, N, K)),
        ("stream handle", lambda: dispatch.stream_handle(None)),
        ("driver launch", lambda: dispatch.run(p, *ptrs, 0)),
    ]
    return {
        "meta": environment(), "shape": [M, N, K], "calls": calls,
        "rows": [{"name": n, "what": w, "host_us": host_time(f, calls)} for n, w, f in rows],
        "steps": [{"step": n, "host_us": host_time(f, calls)} for n, f in steps],
    }


def call_steps(A, B) -> tuple[str, dict]:
    """The steps of one ``gemmlib.matmul(A, B)`` on the short path, each as a callable that
    repeats it alone (GPU only; torch tensors or CuPy arrays), to time one by one:
    ``(name of the kernel that runs, {step: fn})``. The call is made twice first, so
    the steps find what a loop of calls finds (plan, output type, compiled kernel)."""
    from gemmlib.frontends.allocate import new_output, pointer
    from gemmlib.frontends.checks import out_type
    from gemmlib.frontends.describe import describe
    from gemmlib.frontends.torch_tensors import current_stream
    from gemmlib.paths.repeat import call_key, still_holds
    from gemmlib.runtime import launch, memory

    a, b = describe(A, "A"), describe(B, "B")
    o16 = out_type(None, a, None)
    key = call_key(a, b, None, None, None, o16)
    matmul(A, B)
    matmul(A, B)
    known = dispatch.CALLS.get(key)
    p = known.plan
    cptr = pointer(matmul(A, B))
    bd = dispatch.bound(p)
    torch_stream = a.kind == "torch"
    h = dispatch.stream_handle(current_stream(a.device) if torch_stream else None)
    steps = {
        "whole call": lambda: matmul(A, B),
        "describe A": lambda: describe(A, "A"),
        "call key": lambda: call_key(a, b, None, None, None, o16),
        "lookup": lambda: dispatch.CALLS.get(key),
        "still holds": lambda: still_holds(known, a, b, None),
        "current device": memory.current_device,
        "new output": lambda: new_output(known, a, 0),
        "dispatch.run": lambda: dispatch.run(p, a.ptr, b.ptr, cptr, h),
        "dispatch.run bound": lambda: dispatch.run(p, a.ptr, b.ptr, cptr, h, bound=bd),
        "_bound": lambda: launch._bound(p),
        "current context": lambda: dispatch.driver().current_context(),
    }
    if torch_stream:
        steps["torch stream"] = lambda: current_stream(a.device)
    if p.spec.tma_boxes:
        steps["tensor maps"] = lambda: launch._tensor_maps(p, a.ptr, b.ptr, h)
    return p.spec.name, steps


def save_host_costs(data: dict, directory="results") -> Path:
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"host-cost-{data['meta']['gpu_slug']}-{data['meta']['date'][:10]}.json"
    path.write_text(json.dumps(data, indent=1) + "\n")
    return path


# --------------------------------------------------------------------------
# Tensor-core precisions: each against cuBLAS in the same precision


#: the cuBLAS a precision is compared with (3xTF32 races cuBLAS's true-fp32 SGEMM)
CUBLAS_PRECISION = {"tf32": "tf32", "3xtf32": "fp32", "fp16": "fp16", "bf16": "bf16",
                    "fp32": "fp32"}


def precision_operands(precision: str, M: int, N: int, K: int, seed: int = 0):
    """Random A, B in the input type of ``precision`` (bfloat16: a BF16Array)."""
    from gemmlib.precision import INPUT_DTYPE

    dt = INPUT_DTYPE[precision]
    return (backend.random_matrix((M, K), dt, seed),
            backend.random_matrix((K, N), dt, seed + 1))


def benchmark_precisions(precisions=("fp16", "bf16", "tf32", "3xtf32"), shapes=None, *,
                         kernels=("auto",), reps: int = 20, warmup: int = 3,
                         budget_s: float = 10.0, timing: str = "both", seed: int = 0,
                         progress: bool = True) -> Result:
    """Tensor-core kernels in each precision, timed against cuBLAS in the same precision.

    Rows carry ``precision`` and ``cublas_precision`` (3xtf32 is compared with
    cuBLAS's fp32 SGEMM, TF32 off: the product it replaces), the error of both
    against float64 (``rel_error_vs_fp64``, ``cublas_rel_error``), and the
    timing mode (events around the launch, or around ``gemmlib.matmul``).
    """
    modes = ("kernel", "call") if timing == "both" else (timing,)
    shapes = [tuple(int(v) for v in s) for s in (shapes or [(4096,) * 3, (8192,) * 3])]
    if backend.SIMULATOR:
        raise RuntimeError("benchmark_precisions times GPU kernels: run it on a GPU")
    cp = backend.array_module()
    kt = Timer(True)
    timers = {"kernel": kt, "call": Timer(True, idle_start=True, scratch=kt.scratch)}
    result = Result(meta=environment())
    result.meta.update(reps_requested=reps, warmup=warmup, flush_l2=True, budget_s=budget_s,
                       timing=timing, precisions=list(precisions))
    for (M, N, K) in shapes:
        flops = 2.0 * M * N * K
        for prec in precisions:
            A, B = precision_operands(prec, M, N, K, seed)
            C = cp.empty((M, N), dtype=np.float32)
            ref = backend.reference(A, B)
            cprec = CUBLAS_PRECISION[prec]
            cub_fn = lambda: backend.cublas_gemm(A, B, C, cprec)  # noqa: E731
            cub = {m: timers[m](cub_fn, reps, warmup) for m in modes}
            cub_err = backend.relative_error(C, ref)
            for name in kernels:
                spec = (dispatch.select_tc(prec, M, N, K) if name == "auto"
                        else dispatch.get_spec(name, prec))
                C.fill(np.nan)
                matmul(A, B, out=C, kernel=spec)
                err = backend.relative_error(C, ref)
                from gemmlib.verify import spec_tolerance

                if not err <= spec_tolerance(spec, K):
                    raise AssertionError(f"{spec.name} is wrong at {M}x{N}x{K}: {err:.2e}")
                for mode in modes:
                    if mode == "kernel":
                        if spec.failed_constraints(M, N, K, backend.device_info()):
                            continue  # misaligned shapes: only the call, which pads
                        p = dispatch.warm(spec, M, N, K)
                        run = lambda: dispatch.run(  # noqa: E731
                            p, getattr(A, "bits", A).data.ptr, getattr(B, "bits", B).data.ptr,
                            C.data.ptr, cp.cuda.get_current_stream().ptr)
                    else:
                        run = lambda: matmul(A, B, out=C, kernel=name if name != "auto"  # noqa: E731
                                             else None, precision=prec)
                    probe = timers[mode](run, 1, 1)
                    n = _reps_for(probe.median / 1e3, reps, budget_s)
                    t = timers[mode](run, n, max(0, warmup - 2))
                    host = host_time(run, n) if mode == "call" else None
                    row = _row(name, M, N, K, t, flops, cub[mode], err, timing=mode,
                               host_us=host)
                    row.precision = prec
                    row.cublas_precision = cprec
                    row.cublas_rel_error = cub_err
                    row.note = spec.name
                    result.rows.append(row)
                    if progress:
                        print(f"{prec:>6} {spec.name:<44} {M}x{N}x{K} {mode:<6} "
                              f"{row.tflops:7.1f} TFLOP/s  cuBLAS {cprec} {row.cublas_tflops:7.1f}"
                              f"  {row.pct_of_cublas:5.1f}%  err {err:.2e} (cuBLAS "
                              f"{cub_err:.2e})", flush=True)
            for mode in modes:
                r = _row("cublas", M, N, K, cub[mode], flops, cub[mode], cub_err, timing=mode)
                r.precision = r.cublas_precision = cprec
                r.cublas_rel_error = cub_err
                result.rows.append(r)
            del A, B, C, ref
            cp.get_default_memory_pool().free_all_blocks()
    return result
