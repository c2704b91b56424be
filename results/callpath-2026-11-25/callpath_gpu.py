"""The call path after the TF32/FP8 change, torch tensors, one GPU run:
``python3 callpath_gpu.py OUT.json``.

1. Host microseconds of one call against torch.matmul at 64^3 (fp32, fp16, bf16) and CuPy
   (bench_models.framework_host_costs, as the 2026-11-24 host-cost runs).
2. Loops of calls against loops of torch.matmul (bench_models.measure: operands rotated
   past L2, events around the loop) on decode, prefill and square shapes in fp16, bf16,
   fp32 and tf32 -- to compare with the models suite of the same day (before the change).
"""
import json, sys
from gemmlib import bench, bench_models as bm

shapes = [bm.Shape("llama-3.1-8b", "qkv", 1, 1, 6144, 4096),
          bm.Shape("llama-3.1-8b", "o", 16, 16, 4096, 4096),
          bm.Shape("llama-3.1-8b", "gate_up", 4096, 4096, 28672, 4096),
          bm.Shape("sweep", "", 0, 4096, 4096, 4096)]
out = {"meta": bench.environment(), "host": bm.framework_host_costs((64, 64, 64), 2000),
       "rows": []}
for r in out["host"]:
    print({k: (round(v, 2) if isinstance(v, float) else v) for k, v in r.items()}, flush=True)
fw = bm.framework("torch")
for shape in shapes:
    for prec in ("fp16", "bf16", "fp32", "tf32"):
        if prec == "fp32" and shape.M * shape.N * shape.K > 2 ** 36:
            continue   # an SGEMM of this size is not what the check is about
        row = bm.measure(shape, prec, fw, loops=3)
        out["rows"].append(row)
        print(f"{prec:>5} {shape.M}x{shape.N}x{shape.K} {row['kernel']:<36} "
              f"{row['median_ms'] * 1e3:8.1f} us  {row['pct_of_cublas']:5.1f}% of torch.matmul, {row['pct_of_cublas_fp32']:5.1f}% of cuBLAS {prec}"
              f"  host {row['host_us']:.1f} vs {row['cublas_host_us']:.1f} us", flush=True)
json.dump(out, open(sys.argv[1], "w"), indent=1, default=str)
