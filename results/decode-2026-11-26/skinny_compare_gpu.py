"""The decode rung before and after a change, kernel alone:
``python3 skinny_compare_gpu.py OUT.json OLD_MODULE.py``
(OLD_MODULE.py: e.g. ``git show fb61aef:gemmlib/kernels/skinny.py > /tmp/skinny_fb61aef.py``).

OLD_MODULE.py is gemmlib/kernels/skinny.py as it was (loaded under another name); each
shape times its configurations, then the current module's, then torch.matmul's whole call
again -- CUDA events around 200 back-to-back launches on 6 rotated operand sets (past L2),
median of 5 loops -- fp16 and a 16-bit C, auto's slice count and fixed ones."""
import importlib.util
import json
import statistics
import sys

import torch

from gemmlib import bench, dispatch
from gemmlib.kernels import skinny as new

spec_ = importlib.util.spec_from_file_location("skinny_old", sys.argv[2])
old = importlib.util.module_from_spec(spec_)
spec_.loader.exec_module(old)
SHAPES = [(1, 4096, 4096), (1, 6144, 4096), (1, 4096, 14336), (1, 28672, 4096),
          (1, 4096, 11008), (4, 4096, 4096), (4, 6144, 4096), (16, 4096, 4096)]
CONFIGS = [("old", old, {}), ("new", new, {}), ("new_u8", new, dict(U=8, PIPE=0))]
SPLITS = (0, 8, 16)
res = {"meta": bench.environment(), "rows": []}
s = torch.cuda.current_stream().cuda_stream


def timeit(f, sets, n=200, reps=5):
    for i in range(30):
        f(*sets[i % len(sets)])
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for i in range(n):
            f(*sets[i % len(sets)])
        e1.record()
        e1.synchronize()
        ts.append(e0.elapsed_time(e1) * 1e3 / n)
    return statistics.median(ts)


for prec, dt in (("fp16", torch.float16), ("bf16", torch.bfloat16)):
    for M, N, K in SHAPES if prec == "fp16" else SHAPES[:1] + SHAPES[5:6]:
        sets = [((torch.rand(M, K, device="cuda") - 0.5).to(dt),
                 (torch.rand(K, N, device="cuda") - 0.5).to(dt)) for _ in range(6)]
        ref = sets[0][0].float() @ sets[0][1].float()
        C16 = torch.empty(M, N, device="cuda", dtype=dt)
        ptrs = [(a.data_ptr(), b.data_ptr()) for a, b in sets]
        t0 = timeit(lambda a, b: torch.matmul(a, b), sets)
        line = []
        for label, mod, kw in CONFIGS:
            params = {**mod.params_for(prec, M), "OUT": prec, **kw}   # each its own auto
            for S in SPLITS:
                try:
                    spec = mod.build(**{**params, "SPLITS": S})
                    pl = dispatch.plan(spec, M, N, K)
                    C16.fill_(float("nan"))
                    dispatch.run(pl, *ptrs[0], C16.data_ptr(), s)
                    err = ((C16.float() - ref).abs().max() / ref.abs().max()).item()
                    t = timeit(lambda a, b: dispatch.run(pl, a, b, C16.data_ptr(), s), ptrs)
                    res["rows"].append(dict(precision=prec, shape=[M, N, K], config=label,
                                            params=params, splits=S, grid=list(pl.grid),
                                            kernel=spec.name, us=t, err=err))
                    line.append(f"{label}/{pl.grid[2]}:{t:.2f}" + ("" if err < 1e-2 else "ERR"))
                except Exception as e:   # reported, the run goes on
                    res["rows"].append(dict(precision=prec, shape=[M, N, K], config=label,
                                            splits=S, error=repr(e)[:300]))
                    line.append(f"{label}/S{S}:{type(e).__name__}")
        t1 = timeit(lambda a, b: torch.matmul(a, b), sets)
        res["rows"].append(dict(precision=prec, shape=[M, N, K], config="torch", us=[t0, t1]))
        print(f"{prec} {M}x{N}x{K} torch {t0:.2f}/{t1:.2f} | " + " ".join(line), flush=True)
        json.dump(res, open(sys.argv[1], "w"), indent=1, default=str)
