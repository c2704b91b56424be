"""The benchmark harness: honest GPU timings of gemmlib kernels against cuBLAS.

How each number is made:

* CUDA events around the kernel alone, on the stream it runs on;
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
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path

import numpy as np

from gemmlib import backend, dispatch
from gemmlib.api import matmul
from gemmlib.kernels import LADDER, get as get_kernel
from gemmlib.verify import tolerance

SQUARES = (128, 256, 512, 1024, 2048, 4096, 8192)
#: Non-square and odd shapes, (M, N, K): tall, wide, short-K, and off-tile sizes.
OTHERS = ((8192, 2048, 1024), (1024, 8192, 4096), (4096, 4096, 256),
          (4095, 3073, 2047), (1999, 2001, 1997))
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
        head = (f"{'kernel':>14} {'M':>6} {'N':>6} {'K':>6} {'ms':>9} {'TFLOP/s':>8} "
                f"{'cuBLAS':>8} {'%cuBLAS':>8} {'spread':>7}")
        out = [head]
        for r in self.rows:
            out.append(f"{r.kernel:>14} {r.M:>6} {r.N:>6} {r.K:>6} {r.median_ms:>9.3f} "
                       f"{r.tflops:>8.2f} {r.cublas_tflops:>8.2f} {r.pct_of_cublas:>7.1f}% "
                       f"{100 * r.spread:>6.2f}%{' ' + r.note if r.note else ''}")
        return "\n".join(out)


def _csv(v) -> str:
    s = f"{v:.6g}" if isinstance(v, float) else str(v)
    return f'"{s}"' if "," in s else s


def load(path) -> Result:
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


class _Timer:
    """Times one callable with CUDA events, flushing L2 before every run."""

    def __init__(self, flush_l2: bool = True):
        self.cp = backend.array_module()
        l2 = backend.device_info().l2_bytes
        self.scratch = self.cp.empty(max(2 * l2, 1 << 20) // 4, dtype=np.float32) if flush_l2 else None
        self.start, self.end = self.cp.cuda.Event(), self.cp.cuda.Event()

    def __call__(self, fn, reps: int, warmup: int) -> Timing:
        for _ in range(warmup):
            fn()
        times = []
        for i in range(reps):
            if self.scratch is not None:
                self.scratch.fill(i)  # evicts A, B and C from L2
            self.start.record()
            fn()
            self.end.record()
            self.end.synchronize()
            times.append(self.cp.cuda.get_elapsed_time(self.start, self.end))
        return Timing(times)


def time_fn(fn, reps: int = 10, warmup: int = 2, flush_l2: bool = True) -> Timing:
    """Time ``fn`` (which launches GPU work on the current stream) the harness's way."""
    return _Timer(flush_l2)(fn, reps, warmup)


def _reps_for(seconds_per_run: float, reps: int, budget_s: float) -> int:
    """At least 10 runs; fewer than asked only when a run is slow (naive at 8192^3)."""
    if seconds_per_run <= 0:
        return reps
    return max(10, min(reps, int(budget_s / seconds_per_run)))


def benchmark(kernels=None, shapes=None, *, reps: int = 30, warmup: int = 3,
              budget_s: float = 20.0, flush_l2: bool = True, progress: bool = True,
              seed: int = 0) -> Result:
    """Time every kernel on every shape against cuBLAS; returns a :class:`Result`.

    ``budget_s`` caps the timed seconds per (kernel, shape): slow kernels get
    fewer repetitions, never fewer than 10.
    """
    # By default every rung, then "auto": what matmul runs when no kernel is named (the
    # tuned configuration for each shape's class), so its row is the library's number.
    names = list(LADDER) + ["auto"] if kernels is None else list(kernels)  # []: cuBLAS alone
    shapes = [tuple(int(v) for v in s) for s in (shapes or default_shapes())]
    if backend.SIMULATOR:
        return _simulated(names, shapes, progress)
    from tqdm import tqdm  # the text bar: tqdm.auto warns in notebooks without ipywidgets

    cp = backend.array_module()
    timer = _Timer(flush_l2)
    result = Result(meta=environment())
    result.meta.update(reps_requested=reps, warmup=warmup, flush_l2=flush_l2, budget_s=budget_s)
    bar = tqdm(total=len(shapes) * (len(names) + 1), disable=not progress, desc="bench")
    for (M, N, K) in shapes:
        A = backend.random_matrix((M, K), np.float32, seed)
        B = backend.random_matrix((K, N), np.float32, seed + 1)
        Bt = cp.ascontiguousarray(B.T)
        C = cp.empty((M, N), dtype=np.float32)
        ref = backend.reference(A, B)
        flops = 2.0 * M * N * K

        bar.set_postfix_str(f"cuBLAS {M}x{N}x{K}")
        cub = timer(lambda: cp.matmul(A, B, out=C), reps, warmup)
        cublas_err = backend.relative_error(C, ref)
        # Kernels that take B transposed (C = A @ Bt.T) race cuBLAS doing the same.
        cub_nt = cublas_nt_err = None
        if any(_spec(n, M, N, K).b_operand == "NK" for n in names) or not names:
            cub_nt = timer(lambda: cp.matmul(A, Bt.T, out=C), reps, warmup)
            cublas_nt_err = backend.relative_error(C, ref)
        bar.update()
        for name in names:
            spec = _spec(name, M, N, K)
            bar.set_postfix_str(f"{name} {M}x{N}x{K}")
            failed = spec.failed_constraints(M, N, K, backend.device_info())
            if failed:
                result.meta.setdefault("skipped", []).append(
                    {"kernel": name, "shape": [M, N, K], "why": failed})
                bar.update()
                continue
            nt = spec.b_operand == "NK"
            Bk = Bt if nt else B
            C.fill(np.nan)
            matmul(A, Bk, out=C, kernel=spec, transpose_b=nt)  # compiles; checks operands once
            err = backend.relative_error(C, ref)
            if not err <= tolerance(spec.dtype, K):
                raise AssertionError(f"{name} is wrong at {M}x{N}x{K}: rel. error {err:.2e}")
            # Launch directly in the timed loop: operands were checked above.
            from gemmlib.backend import cuda

            a, b, c = (cuda.as_cuda_array(x, sync=False) for x in (A, Bk, C))
            run = lambda: launch(spec, a, b, c, M, N, K)  # noqa: E731
            probe = timer(run, 1, 1)
            n = _reps_for(probe.median / 1e3, reps, budget_s)
            t = timer(run, n, max(0, warmup - 2))
            row = _row(name, M, N, K, t, flops, cub_nt if nt else cub, err)
            if name == "auto":
                row.note = spec.name  # the configuration chosen for this shape
            result.rows.append(row)
            bar.update()
        result.rows.append(_row("cublas", M, N, K, cub, flops, cub, cublas_err))
        if cub_nt is not None:
            result.rows.append(_row("cublas_nt", M, N, K, cub_nt, flops, cub_nt, cublas_nt_err))
        del A, B, Bt, C, ref
        cp.get_default_memory_pool().free_all_blocks()
    bar.close()
    result.meta.update({f"after_smi_{k.replace('.', '_')}": v
                        for k, v in _nvidia_smi("clocks.sm,temperature.gpu").items()})
    return result


def _spec(name: str, M: int, N: int, K: int):
    """The spec a bench row runs: a rung by name, or "auto"'s choice for this shape."""
    if name == "auto":
        return dispatch.select(M, N, K)
    return get_kernel(name)


def _row(name, M, N, K, t: Timing, flops, cub: Timing, err) -> Row:
    return Row(kernel=name, M=M, N=N, K=K, median_ms=t.median, p25_ms=t.quantile(0.25),
               p75_ms=t.quantile(0.75), min_ms=min(t.times_ms), max_ms=max(t.times_ms),
               spread=t.spread, reps=len(t.times_ms), tflops=flops / (t.median * 1e-3) / 1e12,
               cublas_median_ms=cub.median, cublas_tflops=flops / (cub.median * 1e-3) / 1e12,
               pct_of_cublas=100.0 * cub.median / t.median, rel_error_vs_fp64=float(err))


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
