"""wgmma_split_k writing float32 against writing 16 bits (OUT), kernel alone:
``python3 splitk16_gpu.py OUT.json``.  Per shape and build, CUDA events around 200
back-to-back launches (dispatch.run on the plan, operands rotated over 6 sets, past L2),
median of 5 loops, builds interleaved; the float32 build also with run_rounded (its
result rounded by split_k.REDUCE16, the path a 16-bit C took before OUT)."""
import json
import statistics
import sys

import torch

from gemmlib import bench, dispatch
from gemmlib.kernels import wgmma_split_k

res = {"meta": bench.environment(), "rows": []}
for prec, dt in (("fp16", torch.float16), ("bf16", torch.bfloat16)):
    for M, N, K in ((16, 4096, 4096), (64, 4096, 4096), (128, 4096, 4096), (64, 4096, 14336)):
        sets = [((torch.rand(M, K, device="cuda") - 0.5).to(dt),
                 (torch.rand(K, N, device="cuda") - 0.5).to(dt)) for _ in range(6)]
        C32 = torch.empty(M, N, device="cuda")
        C16 = torch.empty(M, N, device="cuda", dtype=dt)
        base = dispatch.select_tc(prec, M, N, K)
        p32 = dispatch.plan(base, M, N, K)
        p16 = dispatch.plan(dispatch.select_tc(prec, M, N, K, out=prec), M, N, K)
        s = torch.cuda.current_stream().cuda_stream
        runs = {"fp32": lambda a, b: dispatch.run(p32, a, b, C32.data_ptr(), s),
                "o16": lambda a, b: dispatch.run(p16, a, b, C16.data_ptr(), s),
                "fp32+round": lambda a, b: dispatch.run_rounded(p32, a, b, C16.data_ptr(),
                                                                prec, s)}
        ptrs = [(a.data_ptr(), b.data_ptr()) for a, b in sets]
        times = {k: [] for k in runs}
        for f in runs.values():
            for a, b in ptrs * 10:
                f(a, b)
        torch.cuda.synchronize()
        for _ in range(5):
            for k, f in runs.items():
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
                for i in range(200):
                    f(*ptrs[i % 6])
                e1.record()
                e1.synchronize()
                times[k].append(e0.elapsed_time(e1) * 1e3 / 200)
        row = {"precision": prec, "shape": [M, N, K], "kernel32": p32.spec.name,
               "kernel16": p16.spec.name, "grid": list(p32.grid),
               "workspace": [list(w) for w in p32.workspace],
               **{k + "_us": statistics.median(v) for k, v in times.items()}, "all_us": times}
        res["rows"].append(row)
        print(prec, M, N, K, p16.spec.name, p32.grid, {k: round(row[k + "_us"], 2) for k in runs},
              flush=True)
json.dump(res, open(sys.argv[1], "w"), indent=1, default=str)
