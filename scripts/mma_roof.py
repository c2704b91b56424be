"""Measure the ceiling of ``mma.sync`` on this GPU (see ``gemmcourse.mma_roof``).

Times a kernel of back-to-back register-only ``mma.sync`` per input type and
writes ``results/mma-roof-<gpu>.json`` with the GPU, clocks and versions,
next to cuBLAS in the same precision at 8192^3 measured in the same run (the
fraction of cuBLAS the instruction itself allows).

    python scripts/mma_roof.py [--chains 8 16] [--out results/mma-roof-<gpu>.json]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gemmlib import backend, bench, tuning  # noqa: E402
from gemmcourse import mma_roof  # noqa: E402

PRECISIONS = ("fp16", "bf16", "tf32")


def cublas_tflops(precision: str, n: int = 8192, reps: int = 10) -> float:
    """cuBLAS in ``precision`` at n^3, timed the benchmark's way (events, L2 flushed)."""
    cp = backend.array_module()
    A, B = bench.precision_operands(precision, n, n, n)
    C = cp.empty((n, n), np.float32)
    ms = bench.time_fn(lambda: backend.cublas_gemm(A, B, C, precision), reps=reps).median
    return 2.0 * n ** 3 / ms / 1e9


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chains", nargs="+", type=int, default=[8, 16])
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    rows = []
    for prec in PRECISIONS:
        cub = cublas_tflops(prec)
        for chains in args.chains:
            row = mma_roof.measure(prec, chains=chains)
            row["cublas_8192_tflops"] = round(cub, 1)
            row["roof_pct_of_cublas"] = round(100 * row["tflops"] / cub, 1)
            rows.append(row)
            print(f"{prec:5} chains={chains:2}: {row['tflops']:7.1f} TFLOP/s of mma.sync; "
                  f"cuBLAS {prec} {cub:6.1f} -> the roof is {row['roof_pct_of_cublas']}% of "
                  f"cuBLAS", flush=True)
    meta = bench.environment()
    meta["note"] = ("register-only mma.sync, CHAINS independent accumulators per warp, "
                    "4 warps per block, 8 blocks per SM; cuBLAS at 8192^3 in the same "
                    "precision, same run")
    out = Path(args.out) if args.out else ROOT / "results" / f"mma-roof-{tuning.gpu_slug()}.json"
    out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
