"""The decode rung's streaming, kernel alone: ``python3 skinny_sweep_gpu.py OUT.json``.

Per decode shape (M = 1 and 4, fp16, 16-bit C) and skinny configuration -- auto's
(params_for), PIPE = 1 (two register buffers: the next round's loads before this round's
FMAs, a chunk's first round before A is staged), U, NT, NC variants -- at auto's slice
count and at fixed ones (SPLITS is a launch parameter: no recompile), beside
wgmma_split_k (auto's choice at M = 2..64) and torch.matmul's whole call.  Each: CUDA events
around 200 back-to-back launches on 6 rotated operand sets (past L2), median of 5 loops.
Every configuration's C is checked against torch's float32 product first."""
import json
import statistics
import sys
import time

import torch

from gemmlib import backend, bench, dispatch
from gemmlib.kernels import skinny, wgmma_split_k

T0 = time.time()
SHAPES = [(1, 4096, 4096), (1, 6144, 4096), (1, 4096, 14336), (1, 28672, 4096),
          (4, 4096, 4096), (4, 6144, 4096), (16, 4096, 4096)]
CONFIGS = {"auto": {}, "pipe": dict(PIPE=1), "pipe_u4": dict(PIPE=1, U=4),
           "pipe_nc": dict(PIPE=1, NC=1), "u16": dict(U=16), "pipe_t512": dict(PIPE=1, NT=512),
           "pipe_t128": dict(PIPE=1, NT=128), "pipe_c16": dict(PIPE=1, CT=16)}
SPLITS = (0, 4, 6, 8, 11, 16, 22, 33)
dev = backend.device_info()
res = {"meta": bench.environment(), "sm_count": dev.sm_count, "rows": []}
prec, dt = "fp16", torch.float16
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


for M, N, K in SHAPES:
    sets = [((torch.rand(M, K, device="cuda") - 0.5).to(dt),
             (torch.rand(K, N, device="cuda") - 0.5).to(dt)) for _ in range(6)]
    ref = sets[0][0].float() @ sets[0][1].float()
    C16 = torch.empty(M, N, device="cuda", dtype=dt)
    ptrs = [(a.data_ptr(), b.data_ptr()) for a, b in sets]
    t_torch = timeit(lambda a, b: torch.matmul(a, b), sets)
    sk = wgmma_split_k.build(prec, BM=64, OUT=prec)
    p = dispatch.plan(sk, M, N, K)
    t_sk = timeit(lambda a, b: dispatch.run(p, a, b, C16.data_ptr(), s), ptrs)
    print(f"{M}x{N}x{K}: torch {t_torch:.2f} us, wgmma_split_k {t_sk:.2f} us", flush=True)
    res["rows"].append(dict(shape=[M, N, K], config="torch", us=t_torch))
    res["rows"].append(dict(shape=[M, N, K], config="wgmma_split_k", kernel=sk.name,
                            grid=list(p.grid), us=t_sk))
    for label, kw in CONFIGS.items():
        params = {**skinny.params_for(prec, M), "OUT": prec, **kw}
        line = []
        for S in SPLITS:
            try:
                spec = skinny.build(**{**params, "SPLITS": S})
                pl = dispatch.plan(spec, M, N, K)
                C16.fill_(float("nan"))
                dispatch.run(pl, *ptrs[0], C16.data_ptr(), s)
                err = ((C16.float() - ref).abs().max() / ref.abs().max()).item()
                t = timeit(lambda a, b: dispatch.run(pl, a, b, C16.data_ptr(), s), ptrs)
                res["rows"].append(dict(shape=[M, N, K], config=label, params=params,
                                        splits=S, grid=list(pl.grid), kernel=spec.name,
                                        us=t, err=err))
                line.append(f"S{S if S else 'a'}={pl.grid[2]}:{t:.2f}" +
                            ("" if err < 1e-2 else f"(ERR {err:.1e})"))
            except Exception as e:  # a failing configuration is reported, the run goes on
                res["rows"].append(dict(shape=[M, N, K], config=label, splits=S,
                                        error=repr(e)[:300]))
                line.append(f"S{S}: {type(e).__name__}")
        print(f"  {label:<10} " + " ".join(line), flush=True)
    json.dump(res, open(sys.argv[1], "w"), indent=1, default=str)
print(f"{time.time() - T0:.0f} s")
