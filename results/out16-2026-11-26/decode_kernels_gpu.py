"""Decode and small-batch kernels alone against torch.matmul's whole call:
``python3 decode_kernels_gpu.py OUT.json [MxNxK,...]``.  Per shape: auto's kernel (16-bit C) launched by
dispatch.run on its plan, the skinny rung and wgmma_split_k where auto picks the other,
and torch.matmul, each as CUDA events around 200 back-to-back calls on 6 rotated operand
sets (past L2), median of 5 loops, interleaved.  Which side of the loop gap is the GPU's."""
import json
import statistics
import sys

import torch

from gemmlib import bench, dispatch
from gemmlib.kernels import skinny, wgmma_split_k

SHAPES = [tuple(int(v) for v in x.split("x")) for x in (sys.argv[2] if len(sys.argv) > 2 else
          "1x4096x4096,4x4096x4096,8x4096x4096,16x4096x4096,64x4096x4096,1x6144x4096").split(",")]
res = {"meta": bench.environment(), "rows": []}
for prec, dt in (("fp16", torch.float16), ("bf16", torch.bfloat16)):
    for M, N, K in SHAPES:
        sets = [((torch.rand(M, K, device="cuda") - 0.5).to(dt),
                 (torch.rand(K, N, device="cuda") - 0.5).to(dt)) for _ in range(6)]
        C16 = torch.empty(M, N, device="cuda", dtype=dt)
        s = torch.cuda.current_stream().cuda_stream
        specs = {"auto": dispatch.select_tc(prec, M, N, K, out=prec),
                 "skinny": skinny.build(**{**skinny.params_for(prec, min(M, 16)),
                                                 "OUT": prec}),
                 "split_k": wgmma_split_k.build(prec, BM=64, OUT=prec)}
        plans = {k: dispatch.plan(v, M, N, K) for k, v in specs.items()}
        ptrs = [(a.data_ptr(), b.data_ptr()) for a, b in sets]
        runs = {k: (lambda a, b, p=p: dispatch.run(p, a, b, C16.data_ptr(), s))
                for k, p in plans.items()}
        runs["torch"] = lambda a, b: None
        times = {k: [] for k in runs}
        for i in range(60):
            for k, f in runs.items():
                if k == "torch":
                    torch.matmul(*sets[i % 6])
                else:
                    f(*ptrs[i % 6])
        torch.cuda.synchronize()
        for _ in range(5):
            for k, f in runs.items():
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
                for i in range(200):
                    if k == "torch":
                        torch.matmul(*sets[i % 6])
                    else:
                        f(*ptrs[i % 6])
                e1.record()
                e1.synchronize()
                times[k].append(e0.elapsed_time(e1) * 1e3 / 200)
        row = {"precision": prec, "shape": [M, N, K],
               "kernels": {k: v.name for k, v in specs.items()},
               "grids": {k: list(p.grid) for k, p in plans.items()},
               **{k + "_us": statistics.median(v) for k, v in times.items()}, "all_us": times}
        res["rows"].append(row)
        print(prec, M, N, K, specs["auto"].name, {k: round(row[k + "_us"], 2) for k in times},
              flush=True)
json.dump(res, open(sys.argv[1], "w"), indent=1, default=str)
