"""Tune the tensor-core pipeline (``mma_pipeline``) per precision on this GPU.

Times each candidate tile (events around the launch, L2 flushed, median) at the
given shapes next to cuBLAS in the same precision, and records the fastest per
shape class in ``gemmlib/data/tuning/<gpu>.json`` under ``mma_pipeline:<precision>``,
where ``gemmlib.dispatch.select_tc`` (``kernel="auto"``) reads it.

    python scripts/tune_tc.py --precisions fp16 bf16 tf32 3xtf32 --shapes 4096 8192
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gemmlib import backend, bench, dispatch, tuning  # noqa: E402
from gemmlib.kernels import mma_pipeline  # noqa: E402

#: candidate (BM, BN, BK, WM, WN, STAGES) per precision
CANDIDATES = {
    "fp16": [(128, 128, 32, 64, 64, 4), (128, 128, 32, 64, 64, 3), (128, 128, 64, 64, 64, 3),
             (128, 256, 32, 64, 64, 3), (256, 128, 32, 64, 64, 3), (128, 256, 64, 64, 64, 3),
             (256, 128, 64, 64, 64, 3)],
    "tf32": [(128, 128, 16, 64, 64, 4), (128, 128, 16, 64, 64, 3), (128, 128, 32, 64, 64, 3),
             (256, 128, 16, 64, 64, 3), (128, 256, 16, 64, 64, 3), (256, 128, 16, 64, 64, 4)],
    # 3xtf32 promotes every k-tile into fresh registers (PROMOTE): warps of 64 x 32 leave
    # room for them; the larger block shapes lost to these three before promotion.
    "3xtf32": [(128, 128, 16, 64, 32, 3), (128, 128, 16, 64, 32, 4), (128, 128, 32, 64, 32, 3)],
}
CANDIDATES["bf16"] = CANDIDATES["fp16"]
KEYS = ("BM", "BN", "BK", "WM", "WN", "STAGES")


def tune(prec: str, shape, reps: int = 10, log=print) -> dict:
    cp = backend.array_module()
    M, N, K = shape
    A, B = bench.precision_operands(prec, M, N, K)
    a, b = getattr(A, "bits", A), getattr(B, "bits", B)
    C = cp.empty((M, N), np.float32)
    timer = bench.Timer(True)
    cprec = bench.CUBLAS_PRECISION[prec]
    cub = timer(lambda: backend.cublas_gemm(A, B, C, cprec), reps, 3).median
    flops = 2.0 * M * N * K
    log(f"--- {prec} {M}x{N}x{K}: cuBLAS {cprec} {flops / cub / 1e9:.1f} TFLOP/s")
    best = None
    for cand in CANDIDATES[prec]:
        params = dict(zip(KEYS, cand))
        t0 = time.time()
        try:
            spec = mma_pipeline.build(prec, **params)
            p = dispatch.warm(spec, M, N, K)
        except Exception as e:  # a tile this GPU cannot run (shared memory, ...)
            log(f"{cand} skipped: {type(e).__name__}: {str(e)[:160]}")
            continue
        run = lambda: dispatch.run(p, a.data.ptr, b.data.ptr, C.data.ptr,  # noqa: E731
                                   cp.cuda.get_current_stream().ptr)
        ms = timer(run, reps, 2).median
        c = dispatch.compiled_spec(spec)
        log(f"{cand} {flops / ms / 1e9:7.1f} TFLOP/s {100 * cub / ms:5.1f}% of cuBLAS "
            f"regs={c.registers} local={c.local_bytes} ({time.time() - t0:.0f} s)")
        if best is None or ms < best["ms"]:
            best = dict(params=params, ms=round(ms, 4), cublas_ms=round(cub, 4),
                        tflops=round(flops / ms / 1e9, 1),
                        pct_of_cublas=round(100 * cub / ms, 1), registers=c.registers,
                        local_bytes=c.local_bytes, shape=[M, N, K],
                        candidates_timed=len(CANDIDATES[prec]),
                        date=dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"))
    return best


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--precisions", nargs="+", default=["fp16", "bf16", "tf32", "3xtf32"])
    ap.add_argument("--shapes", nargs="+", type=int, default=[4096])
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--out", default=None, help="tuning file (default gemmlib/data/tuning/<gpu>.json)")
    args = ap.parse_args(argv)
    slug = tuning.gpu_slug()
    path = Path(args.out) if args.out else tuning.PACKAGE_TUNING_DIR / f"{slug}.json"
    data = json.loads(path.read_text()) if path.exists() else {"gpu_slug": slug, "kernels": {}}
    for prec in args.precisions:
        for n in args.shapes:
            best = tune(prec, (n, n, n), args.reps)
            if best:
                data.setdefault("kernels", {}).setdefault(
                    dispatch.tc_tuning_key(prec), {})[tuning.shape_class(n, n, n)] = best
                path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
                print(f"best {prec} {n}^3: {best['params']} {best['tflops']} TFLOP/s "
                      f"({best['pct_of_cublas']}%)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
