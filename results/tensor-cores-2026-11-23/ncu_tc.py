import cupy as cp, gemmlib, numpy as np
A = cp.random.random((1024, 1024)).astype(cp.float16); B = cp.random.random((1024, 1024)).astype(cp.float16)
for k in ("mma_swizzle", "mma_pipeline"):
    gemmlib.matmul(A, B, kernel=k); cp.cuda.runtime.deviceSynchronize()
