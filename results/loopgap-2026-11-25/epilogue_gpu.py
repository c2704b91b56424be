"""How much of wgmma_ws's time is its epilogue?  ``python3 epilogue_gpu.py OUT.json``

A diagnostic, not a rung: wgmma_ws rebuilt (``ws_kernel`` with the same pieces) whose
consumers add up their accumulators and store the tile only if the sum equals a value it
never takes, so every wgmma result is used (a first version tested ``M < 0``: the compiler
dropped the wgmma work whose results were dead, and the "kernel" ran past the tensor cores'
peak) but nothing is written.  Kernel timing
(bench.time_fn: one launch, L2 flushed, median of 30) of the real kernel and of that one,
float32 and 16-bit out, with cuBLAS (torch.matmul) in the same run, at 2048^3, 4096^3, 8192^3.
Run it with its own GEMMLIB_CACHE: the experiment's params differ (``EXPERIMENT``), but a
separate cache keeps it out of the library's.
"""
import dataclasses
import json
import sys

import cupy as cp
import torch

from gemmlib import bench, dispatch
from gemmlib.backend import cuda, float32
from gemmlib.kernels import wgmma_async as WA, wgmma_store, wgmma_tma as WT, wgmma_ws as W


def nostore_spec(out, STAGES):
    spec = W.build("fp16", STAGES=STAGES, OUT=out)
    p = spec.params
    k_tile, store_acc = WA.warpgroup_code("fp16", p["BN"], 1, out)

    ACC = p["BN"] // 2

    @cuda.jit(device=True)
    def never_store(C, acc, t, m0, n0, M, N):
        tot = float32(0.0)
        for e in range(ACC):   # every accumulator feeds the test: no wgmma is dead code
            tot += acc[e]
        if tot == float32(-1.2345e-30):   # (practically) never: nothing is written
            store_acc(C, acc, t, m0, n0, M, N)

    load_stage, A_BYTES, STAGE_BYTES = WT.tma_loader(p["BM"], p["BN"])
    kernel, _, _ = W.ws_kernel(p["BM"], p["BN"], p["BK"], STAGES, p["REGS"], k_tile,
                               never_store, WA.tile_order(p["BM"], p["BN"], p["GROUP_M"]),
                               load_stage, A_BYTES, STAGE_BYTES)
    return dataclasses.replace(spec, kernel=kernel, name=spec.name + "_nostore",
                               params=dict(p, EXPERIMENT="nostore"), ptx_must=())


out_path = sys.argv[1]
res = {"meta": bench.environment(), "rows": []}
for n in (2048, 4096, 8192):
    g = torch.Generator(device="cuda").manual_seed(0)
    A = (torch.rand(n, n, device="cuda", generator=g) * 2 - 1).half()
    B = (torch.rand(n, n, device="cuda", generator=g) * 2 - 1).half()
    t = bench.time_fn(lambda: torch.matmul(A, B), 30, 3)
    res["rows"].append(dict(n=n, label="cublas", us=t.median * 1e3))
    print(n, "cublas", f"{t.median * 1e3:.1f} us", flush=True)
    s = cp.cuda.get_current_stream().ptr
    for out in ("fp32", "fp16"):
        C = torch.empty((n, n), dtype=torch.float32 if out == "fp32" else torch.int16,
                        device="cuda")
        for STAGES in (3, 4):
            cands = [("ws", W.build("fp16", STAGES=STAGES, OUT=out)),
                     ("nostore", nostore_spec(out, STAGES))]
            if STAGES == 3:   # the epilogue through shared memory (3 stages: its maximum)
                cands.append(("store", wgmma_store.build("fp16", OUT=out)))
            elif out == "fp16":   # a 16-bit C staged in two halves leaves room for 4 stages
                cands.append(("store", wgmma_store.build("fp16", STAGES=4, OUT=out, PIECES=2)))
            for label, spec in cands:
                p = dispatch.warm(spec, n, n, n)
                bd = dispatch.bound(p)
                run = (lambda: dispatch.run(p, A.data_ptr(), B.data_ptr(), C.data_ptr(), s, bd))
                t = bench.time_fn(run, 30, 3)
                row = dict(n=n, label=label, out=out, stages=STAGES, kernel=spec.name,
                           us=t.median * 1e3)
                res["rows"].append(row)
                print(n, out, STAGES, label, spec.name, f"{t.median * 1e3:.1f} us", flush=True)
        del C
    json.dump(res, open(out_path, "w"), indent=1, default=str)
