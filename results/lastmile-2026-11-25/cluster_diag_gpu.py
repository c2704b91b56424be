"""Why is wgmma_cluster slower than wgmma_ws?  ``python3 cluster_diag_gpu.py OUT.json``

Kernel timing (bench.time_fn: events around dispatch.run, L2 flushed) of wgmma_ws and
wgmma_cluster builds at 4096^3 fp16 with the grid each launches (clusters that fit at once),
and host microseconds of one gemmlib.matmul call (auto, and an explicit spec) at 2048^3.
"""
import json
import sys

import cupy as cp
import numpy as np

import gemmlib
from gemmlib import bench, bench_models as BM, dispatch
from gemmlib.kernels import wgmma_cluster, wgmma_ws

out = sys.argv[1]
res = {"meta": bench.environment(), "kernel": [], "host": []}
n = 4096
A = cp.random.rand(n, n).astype(cp.float16)
B = cp.random.rand(n, n).astype(cp.float16)
C = cp.empty((n, n), cp.float32)
builds = {"ws": wgmma_ws.build(), "ws_s4": wgmma_ws.build(STAGES=4),
          "c2": wgmma_cluster.build(CM=2), "c1": wgmma_cluster.build(CM=1),
          "c2_s3": wgmma_cluster.build(CM=2, STAGES=3), "c2_g16": wgmma_cluster.build(CM=2, GROUP_M=16)}
if len(sys.argv) > 2:   # LABEL=module:key=value,...;... (what to build instead)
    from lastmile_gpu import variants   # beside this script

    builds = variants(sys.argv[2], "fp16")
ref = A.astype(cp.float32) @ B.astype(cp.float32)
for label, spec in builds.items():
    p = dispatch.warm(spec, n, n, n)
    b = dispatch.bound(p)
    s = cp.cuda.get_current_stream().ptr
    run = lambda: dispatch.run(p, A.data.ptr, B.data.ptr, C.data.ptr, s, b)  # noqa: E731
    run()
    cp.cuda.Device().synchronize()
    err = float(cp.abs(C - ref).max() / cp.abs(ref).max())
    t = bench.time_fn(run, 30, 3)
    row = dict(label=label, kernel=spec.name, grid=list(b.grid), plan_grid=list(p.grid),
               us=t.median * 1e3, max_err=err, tflops=2 * n ** 3 / (t.median * 1e-3) / 1e12,
               registers=dispatch.compiled_spec(spec).registers)
    res["kernel"].append(row)
    print(row, flush=True)
fw = BM.framework("torch")
for m in (2048, 4096) if len(sys.argv) <= 3 else ():
    a, bb = fw.operands("fp16", m, m, m, 0)
    for label, kw in (("auto", {}), ("ws-spec", {"kernel": wgmma_ws.SPEC}),
                      ("ws-name", {"kernel": "wgmma_ws"})):
        us = BM.host_us(fw, lambda: gemmlib.matmul(a, bb, **kw), 200)
        res["host"].append(dict(M=m, call=label, host_us=us))
        print("host", m, label, f"{us:.1f} us", flush=True)
    import torch
    us = BM.host_us(fw, lambda: torch.matmul(a, bb), 200)
    res["host"].append(dict(M=m, call="torch.matmul", host_us=us))
    print("host", m, "torch", f"{us:.1f} us", flush=True)
json.dump(res, open(out, "w"), indent=1, default=str)
