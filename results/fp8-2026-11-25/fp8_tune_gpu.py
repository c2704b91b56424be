"""FP8 tile variants and the packed bf16 store, one GPU run: ``python3 fp8_tune_gpu.py OUT``.

For e4m3 -> bf16 with B = w.t() at 4096^3 and 8192^3: kernel timing of wgmma_fp8 variants
(tile, ring depth, L2 grouping) against torch._scaled_mm in the same run; then one call of
the default and of _scaled_mm for Nsight Compute (``ncu`` step, run by fp8_tune_gpu.sh).
"""
import json, sys
import torch
from gemmlib import bench, dispatch, tuning
from gemmlib.kernels import wgmma_fp8

out = sys.argv[1]
step = sys.argv[2] if len(sys.argv) > 2 else "tune"
dev = "cuda"
g = torch.Generator(device=dev).manual_seed(0)


def operands(M, N, K):
    a = (torch.randn(M, K, device=dev, generator=g) * 2).to(torch.float8_e4m3fn)
    w = (torch.randn(N, K, device=dev, generator=g) * 2).to(torch.float8_e4m3fn)
    return a, w.t(), torch.ones(1, device=dev), torch.ones(1, device=dev)


if step == "ncu":
    import gemmlib
    a, b, sa, sb = operands(4096, 4096, 4096)
    for _ in range(3):
        C = gemmlib.matmul(a, b, scale_a=sa, scale_b=sb)
        T = torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16)
    torch.cuda.synchronize()
    sys.exit(0)

VARIANTS = [dict(), dict(STAGES=3), dict(GROUP_M=16), dict(GROUP_M=4), dict(BN=128, STAGES=6),
            dict(BN=192, STAGES=4), dict(BM=64, BN=256, STAGES=4), dict(REGS=None)]
res = {"meta": bench.environment(), "torch": torch.__version__, "rows": []}
for n in (4096, 8192):
    a, b, sa, sb = operands(n, n, n)
    C = torch.empty(n, n, device=dev, dtype=torch.bfloat16)
    stream = torch.cuda.current_stream().cuda_stream
    reps = 30 if n == 4096 else 15
    ref = bench.time_fn(lambda: torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16), reps, 3)
    for v in VARIANTS:
        try:
            spec = wgmma_fp8.build(**v)
            p = dispatch.warm(spec, n, n, n)
            t = bench.time_fn(lambda: dispatch.run(p, a.data_ptr(), b.data_ptr(), C.data_ptr(),
                                                   stream, scales=(sa.data_ptr(), sb.data_ptr())),
                              reps, 3)
            row = dict(n=n, variant=v, kernel=spec.name, ms=t.median, scaled_mm_ms=ref.median,
                       pct_of_scaled_mm=100 * ref.median / t.median,
                       tflops=2 * n ** 3 / t.median / 1e9)
        except Exception as e:   # a variant that does not fit (shared memory, registers)
            row = dict(n=n, variant=v, error=f"{type(e).__name__}: {str(e)[:200]}")
        res["rows"].append(row)
        print(row, flush=True)
    del a, b, C
    torch.cuda.empty_cache()
json.dump(res, open(f"{out}/fp8-tune-{tuning.gpu_slug()}.json", "w"), indent=1, default=str)
