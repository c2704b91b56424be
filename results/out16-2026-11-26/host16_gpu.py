"""Host microseconds of one 16-bit-out call (``out_dtype=A.dtype``) against torch.matmul,
torch tensors, at small shapes: ``python3 host16_gpu.py OUT.json``. The 2026-11-26 call-path
run timed only the default float32 C; this is the call the 16-bit target table times."""
import json, sys
from gemmlib import bench, matmul, bench_models as bm

tw = bm._Torch()
out = {"meta": bench.environment(), "rows": []}
for shape in ((64, 64, 64), (1, 4096, 4096), (256, 256, 256)):
    for prec in ("fp16", "bf16"):
        A, B = tw.operands(prec, *shape, 0)
        row = dict(shape=list(shape), precision=prec, calls=2000)
        row["gemmlib_out16_us"] = bm.host_us(tw, lambda: matmul(A, B, out_dtype=A.dtype), 2000)
        row["gemmlib_fp32_us"] = bm.host_us(tw, lambda: matmul(A, B), 2000)
        row["torch_us"] = bm.host_us(tw, lambda: tw.t.matmul(A, B), 2000)
        out["rows"].append(row)
        print(row, flush=True)
json.dump(out, open(sys.argv[1], "w"), indent=1, default=str)
