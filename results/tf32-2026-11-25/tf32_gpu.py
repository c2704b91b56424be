"""TF32 on wgmma (issue 19, item 2), one GPU run: ``python3 tf32_gpu.py OUTDIR``.

1. gemmlib.verify of wgmma_tf32 on odd shapes (TMA zero fill, predicated stores, padding).
2. What the tensor core does with the 13 low bits of a float32: truncate or round.
3. The transpose pre-pass alone, against a device copy of the same bytes.
4. wgmma_tf32, mma_pipeline (tf32) and "auto" against cuBLAS TF32, kernel and call timing
   (bench.benchmark_precisions: events, warm-up, L2 flushed, medians).
"""
import json, sys, time
import numpy as np
import cupy as cp
import gemmlib
from gemmlib import backend, bench, dispatch, tuning
from gemmlib.kernels import wgmma_tf32

out = sys.argv[1]
slug = tuning.gpu_slug()
res = {"meta": bench.environment(), "verify": [], "rounding": {}, "transpose": [], }

# 1. odd shapes
shapes = [(1, 1, 1), (129, 255, 3), (300, 130, 200), (1000, 1000, 1000), (4095, 3073, 2047),
          (3, 8191, 5), (1025, 513, 4097), (2048, 2048, 2048), (77, 1000, 33)]
t = time.time()
r = gemmlib.verify(wgmma_tf32.SPEC, shapes, raise_on_failure=False)
print(r, f"({time.time() - t:.1f} s)", flush=True)
res["verify"] = [dict(shape=c.shape, rel_error=c.rel_error, tol=c.tolerance, ok=c.ok,
                      unwritten=c.unwritten) for c in r.checks]

# 2. rounding of the inputs: a = 1 + 2^-11 + 2^-12 is 1 truncated, 1 + 2^-10 rounded
a = np.float32(1 + 2.0 ** -11 + 2.0 ** -12)
A = cp.zeros((64, 32), np.float32); A[:, 0] = a
B = cp.zeros((32, 256), np.float32); B[0, :] = 1
C = gemmlib.matmul(A, B, kernel="wgmma_tf32", precision="tf32")
v = float(C[0, 0])
Cm = gemmlib.matmul(A, B, kernel="mma_pipeline", precision="tf32")
Cc = cp.empty((64, 256), np.float32); backend.cublas_gemm(A, B, Cc, "tf32")
res["rounding"] = dict(input=float(a), wgmma_tf32=v, mma_pipeline_tf32=float(Cm[0, 0]),
                       cublas_tf32=float(Cc[0, 0]),
                       truncates=v == 1.0, rounds=v == float(np.float32(1 + 2.0 ** -10)))
print("rounding", res["rounding"], flush=True)

# 3. the transpose pre-pass alone
for n in (2048, 4096, 8192):
    Bm = cp.random.rand(n, n, dtype=np.float32)
    Bt = cp.empty_like(Bm)
    p = dispatch.warm(wgmma_tf32.SPEC, n, n, n)
    b = dispatch.bound(p)
    stream = cp.cuda.get_current_stream().ptr
    words = b.prep_words.copy()
    words[dispatch._DATA[0]], words[dispatch._DATA[1]] = Bm.data.ptr, Bt.data.ptr
    run = lambda: dispatch._launch(b.prep, wgmma_tf32.transpose_grid(n, n),  # noqa: E731
                                   wgmma_tf32.SPEC.b_prep_block, 0, stream, words)
    run(); cp.cuda.Device().synchronize()
    assert bool((Bt == Bm.T).all()), "transpose is wrong"
    tt = bench.time_fn(run, 30, 3)
    tc = bench.time_fn(lambda: Bt.__setitem__(Ellipsis, Bm), 30, 3)
    gb = 2 * Bm.nbytes / 1e9
    row = dict(n=n, transpose_ms=tt.median, copy_ms=tc.median,
               transpose_gbps=gb / (tt.median / 1e3), copy_gbps=gb / (tc.median / 1e3))
    res["transpose"].append(row)
    print("transpose", row, flush=True)
    del Bm, Bt
cp.get_default_memory_pool().free_all_blocks()

# 4. speed against cuBLAS TF32
shapes = [(2048,) * 3, (4096,) * 3, (8192,) * 3, (4096, 14336, 4096), (4096, 4096, 14336),
          (512, 4096, 4096), (1024, 1024, 8192)]
r = bench.benchmark_precisions(("tf32",), shapes, kernels=("wgmma_tf32", "mma_pipeline", "auto"),
                               reps=20, timing="both", budget_s=2)
res["bench"] = r.to_json()
json.dump(res, open(f"{out}/tf32-{slug}.json", "w"), indent=1, default=str)
