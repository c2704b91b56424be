"""Layouts, cp.async and double buffering on a GPU: correct first, then timed.

On a machine with an NVIDIA GPU, from the repository root:

    NUMBA_ENABLE_CUDASIM=0 python scripts/experiments/bench_layouts.py [--size 4096] [--out results/layouts.json]

(``results/layouts-h200.json`` is one run with ``--variants`` on an H200.)

1. verifies every kernel of this part (and each comparison twin) on odd
   shapes against the float64 oracle;
2. times each one at SIZE^3 (CUDA events, L2 flushed before every run, median
   of ``--reps``) beside cuBLAS computing the same ``A @ B.T`` (CuPy, float32,
   TF32 off), and prints each step against the previous one:

   ======================  =========================================
   layout_nt_hand          hand-typed indices (the baseline)
   layout_nt               the same kernel, indices from layouts: should tie
   async_copy_sync         prefetch structure, synchronous copies
   async_copy              ... with cp.async
   double_buffer_sync      two shared + two register buffers, sync copies
   double_buffer           ... with cp.async
   ======================  =========================================

3. reports registers per thread, static shared memory, local memory (spills)
   and the theoretical occupancy of each compiled kernel.

``--also NAME ...`` adds registered rungs (e.g. bank_free warptile) for context.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "0")
os.environ["CUPY_TF32"] = "0"
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root

import numpy as np  # noqa: E402

import gemmlib  # noqa: E402
from gemmlib import backend  # noqa: E402
from gemmlib.api import launch  # noqa: E402
from gemmlib.autotune import compiled_resources  # noqa: E402
from gemmlib.bench import time_fn  # noqa: E402
from gemmlib.kernels import async_copy, double_buffer, layout_nt  # noqa: E402
from gemmcourse.notebook import blocks_per_sm  # noqa: E402
from gemmlib.verify import tolerance  # noqa: E402

ODD = [(1, 1, 1), (127, 129, 7), (129, 255, 9), (1000, 999, 1001), (257, 3, 4096),
       (3, 300, 0), (4095, 3073, 2047), (128, 128, 8)]

#: (name, how to build it, the step it is compared with)
STEPS = [
    ("layout_nt_hand", lambda: layout_nt.build(indexing="hand"), None),
    ("layout_nt", lambda: layout_nt.SPEC, "layout_nt_hand"),
    ("async_copy_sync", lambda: async_copy.build(copy="sync"), "layout_nt"),
    ("async_copy", lambda: async_copy.SPEC, "async_copy_sync"),
    ("double_buffer_sync", lambda: double_buffer.build(copy="sync"), "async_copy"),
    ("double_buffer", lambda: double_buffer.SPEC, "double_buffer_sync"),
]

#: Variants that answer "when does double buffering help?" (--variants)
VARIANTS = [
    ("double_buffer_rolled", lambda: double_buffer.build(unroll=False), "double_buffer"),
    ("layout_nt_mb2", lambda: layout_nt.build(min_blocks=2), "layout_nt"),
    ("double_buffer_mb2", lambda: double_buffer.build(min_blocks=2), "double_buffer"),
    ("double_buffer_sync_mb2", lambda: double_buffer.build(copy="sync", min_blocks=2),
     "double_buffer_mb2"),
    ("double_buffer_bk16", lambda: double_buffer.build(BK=16), "double_buffer"),
    ("double_buffer_bk16_mb2", lambda: double_buffer.build(BK=16, min_blocks=2),
     "double_buffer_bk16"),
]


def resources(spec) -> dict:
    """Registers, shared and local bytes of the compiled kernel, and how many blocks fit an SM."""
    out = compiled_resources(spec)
    fit = blocks_per_sm(spec, out["registers"])
    blocks = min(min(fit.values()), 32)  # at most 32 resident blocks per SM
    out.update(blocks_per_sm=blocks, limited_by=min((n, k) for k, n in fit.items())[1],
               occupancy=blocks * spec.threads / backend.device_info().max_threads_per_sm)
    return out


def timer(fn, reps: int) -> list[float]:
    """Per-run milliseconds, the benchmark harness's way (CUDA events, L2 flushed)."""
    return time_fn(fn, reps, warmup=3).times_ms


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=int, default=4096)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", default="results/layouts.json")
    ap.add_argument("--no-verify", action="store_true")
    ap.add_argument("--also", nargs="*", default=[], help="registered rungs to time as well")
    ap.add_argument("--variants", action="store_true",
                    help="also time register-capped / rolled / BK=16 variants")
    args = ap.parse_args(argv)
    if backend.SIMULATOR or not backend.gpu_present():
        print("needs a GPU (and NUMBA_ENABLE_CUDASIM=0)")
        return 2
    cp = backend.array_module()
    dev = backend.device_info()
    print(f"{dev.name}, sm_{dev.compute_capability[0]}{dev.compute_capability[1]}, "
          f"{dev.sm_count} SMs")

    specs = {}
    for name, make, prev in STEPS + (VARIANTS if args.variants else []):
        spec = make()
        if spec.failed_constraints(64, 64, 64, dev):
            print(f"skip {name}: {spec.failed_constraints(64, 64, 64, dev)}")
            continue
        specs[name] = (spec, prev)
    for name in args.also:
        specs[name] = (gemmlib.get_kernel(name), None)

    ok = True
    if not args.no_verify:
        print("== verify on odd shapes")
        for name, (spec, _) in specs.items():
            rep = gemmlib.verify(spec, ODD, seed=11, raise_on_failure=False)
            worst = max(c.rel_error for c in rep.checks)
            print(f"  {name:>20}: {'ok' if rep.ok else 'FAIL'} (worst rel. error {worst:.1e})")
            if not rep.ok:
                print(rep)
                ok = False

    n = args.size
    M = N = K = n
    A = backend.random_matrix((M, K), np.float32, 1)
    Bt = backend.random_matrix((N, K), np.float32, 2)
    C = cp.empty((M, N), dtype=np.float32)
    ref = backend.reference(A, Bt.T)
    flops = 2.0 * M * N * K
    t_cub = timer(lambda: cp.matmul(A, Bt.T, out=C), args.reps)
    cub_ms = statistics.median(t_cub)
    rows = [{"kernel": "cublas (A @ B.T)", "median_ms": cub_ms,
             "tflops": flops / cub_ms / 1e9, "pct_of_cublas": 100.0,
             "rel_error": backend.relative_error(C, ref)}]
    print(f"== {n}^3, median of {args.reps}, L2 flushed; cuBLAS {cub_ms:.3f} ms "
          f"= {flops / cub_ms / 1e9:.1f} TFLOP/s")
    from gemmlib.backend import cuda

    a, b, c = (cuda.as_cuda_array(x, sync=False) for x in (A, Bt, C))
    med = {}
    for name, (spec, prev) in specs.items():
        Bk = Bt if spec.b_operand == "NK" else cp.ascontiguousarray(Bt.T)
        bk = cuda.as_cuda_array(Bk, sync=False)
        C.fill(np.nan)
        launch(spec, a, bk, c, M, N, K)
        err = backend.relative_error(C, ref)
        t = timer(lambda: launch(spec, a, bk, c, M, N, K), args.reps)
        ms = statistics.median(t)
        med[name] = ms
        q1, _, q3 = statistics.quantiles(t, n=4)
        row = {"kernel": name, "median_ms": ms, "iqr_over_median": (q3 - q1) / ms,
               "tflops": flops / ms / 1e9, "pct_of_cublas": 100.0 * cub_ms / ms,
               "rel_error": err, "vs": prev,
               "speedup_vs_prev": (med[prev] / ms) if prev in med else None,
               "params": {k: (list(v) if isinstance(v, tuple) else v)
                          for k, v in spec.params.items()}}
        row.update(resources(spec))
        rows.append(row)
        sp = f"x{row['speedup_vs_prev']:.2f} vs {prev}" if row["speedup_vs_prev"] else ""
        occ = (f"{row.get('blocks_per_sm', '?')} blk/SM, occ {row.get('occupancy', 0):.0%} "
               f"({row.get('limited_by', '?')})") if "occupancy" in row else ""
        print(f"  {name:>20} {ms:8.3f} ms {row['tflops']:6.2f} TFLOP/s "
              f"{row['pct_of_cublas']:5.1f}% cuBLAS  regs {row.get('registers')} "
              f"smem {row.get('shared_bytes')} local {row.get('local_bytes')}  {occ}  {sp}"
              f"  err {err:.1e}")
        if not err <= tolerance(spec.dtype, K):
            print(f"  !!! {name} wrong at {n}^3")
            ok = False

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"device": dev.name, "cc": list(dev.compute_capability), "size": n, "reps": args.reps,
            "cublas_tf32": os.environ.get("CUPY_TF32"), "verified": ok}
    out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1, default=str))
    print(f"wrote {out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
