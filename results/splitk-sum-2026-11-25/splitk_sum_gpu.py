"""wgmma_split_k: how many 16-byte groups the last thread of a tile sums per trip to L2.

SUM = 1 is the kernel before 2026-11-25 (one load in flight, S * 32 round trips at
BN = 256); larger SUM keeps SUM loads of one slice in flight at once.  Kernel timing
(CUDA events, L2 flushed, median of 20) against cuBLAS in the same run, registers and
local memory (spills) as the driver reports them:

    python3 results/splitk-sum-2026-11-25/splitk_sum_gpu.py OUT.json
"""
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))   # the repository

from gemmlib import backend, bench, dispatch
from gemmlib.autotune import compiled_resources
from gemmlib.kernels import wgmma_split_k

SHAPES = [(16, 4096, 4096), (128, 4096, 4096), (16, 6144, 4096), (128, 6144, 4096),
          (16, 4096, 14336), (1024, 1024, 8192)]


def main(path):
    import cupy as cp

    out = dict(meta=bench.environment(), rows=[])
    specs = {}
    for M, N, K in SHAPES:
        BM = 64 if M <= 128 else 128
        A, B = bench.precision_operands("fp16", M, N, K, 0)
        C = cp.empty((M, N), dtype=np.float32)
        cub = bench.time_fn(lambda: backend.cublas_gemm(A, B, C, "fp16"), 20, 3)
        ref = C.copy()
        for g in (1, 4, 8, 16):
            spec = specs.setdefault((BM, g), wgmma_split_k.build("fp16", BM=BM, SUM=g))
            try:
                p = dispatch.warm(spec, M, N, K)
                C.fill(np.nan)
                run = lambda: dispatch.run(p, A.data.ptr, B.data.ptr, C.data.ptr,
                                           cp.cuda.get_current_stream().ptr)
                run()
                cp.cuda.runtime.deviceSynchronize()
                err = float(cp.linalg.norm(C - ref) / cp.linalg.norm(ref))
                t = bench.time_fn(run, 20, 3)
                S = wgmma_split_k.splits_for(M, N, K, BM, 256)
                res = compiled_resources(spec)
                row = dict(kernel=spec.name, SUM=g, M=M, N=N, K=K,
                           splits=wgmma_split_k.effective_splits(S, K), median_ms=t.median,
                           cublas_ms=cub.median,
                           pct_of_cublas=100 * cub.median / t.median, err_vs_cublas=err,
                           registers=res["registers"], local_bytes=res["local_bytes"])
            except Exception as e:
                row = dict(kernel=spec.name, SUM=g, M=M, N=N, K=K,
                           error=f"{type(e).__name__}: {str(e)[:300]}")
            out["rows"].append(row)
            print(json.dumps(row), flush=True)
    json.dump(out, open(path, "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
