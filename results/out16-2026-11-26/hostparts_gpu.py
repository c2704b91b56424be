"""Where one call's host time goes: ``python3 hostparts_gpu.py OUT.json``.

The short path of ``gemmlib.matmul`` (a call whose checks an earlier call made) on torch
tensors, piece by piece -- each piece alone in a loop of CALLS calls, median microseconds
(time.perf_counter_ns) -- beside the whole call and torch.matmul, at 64^3 (fp32 and fp16,
float32 C) and at decode (1x4096x4096 fp16, 16-bit C: skinny and run_rounded).  The GPU
work of each shape is a few microseconds, so launches queue and the host is what is timed.
"""
import json
import statistics
import sys
import time

import torch

import gemmlib
from gemmlib import api, bench, dispatch

CALLS = 3000


def us(fn, n=CALLS):
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    ts = []
    for i in range(n):
        t = time.perf_counter_ns()
        fn()
        ts.append(time.perf_counter_ns() - t)
        if i % 500 == 499:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    return statistics.median(ts) / 1e3


out = {"meta": bench.environment(), "calls": CALLS, "rows": []}
cases = [("fp32 64^3", torch.float32, (64, 64, 64), None),
         ("fp16 64^3", torch.float16, (64, 64, 64), None),
         ("fp16 1x4096x4096 out16", torch.float16, (1, 4096, 4096), torch.float16),
         ("bf16 16x4096x4096 out16", torch.bfloat16, (16, 4096, 4096), torch.bfloat16)]
for label, dt, (M, N, K), o in cases:
    A = torch.rand(M, K, device="cuda").to(dt)
    B = torch.rand(K, N, device="cuda").to(dt)
    call = (lambda: gemmlib.matmul(A, B, out_dtype=o)) if o is not None else (
        lambda: gemmlib.matmul(A, B))
    call()
    a, b = api._describe(A, "A"), api._describe(B, "B")
    o16 = None if o is None else api._out_type(o, a, None)
    key = api._call_key(a, b, None, None, False, None, o16)
    k = dispatch.CALLS.get(key)
    row = {"case": label, "kernel": k.plan.spec.name, "rounded": k.out16,
           "splits": k.plan.splits}
    row["whole_call"] = us(call)
    row["torch_matmul"] = us(lambda: torch.matmul(A, B))
    row["describe_x2"] = us(lambda: (api._describe(A, "A"), api._describe(B, "B")))
    row["out_type"] = us(lambda: api._out_type(o, a, None)) if o is not None else 0.0
    row["current_stream"] = us(lambda: api._torch_current_stream(a.device))
    row["call_key"] = us(lambda: api._call_key(a, b, None, None, False, None, o16))
    row["calls_get"] = us(lambda: dispatch.CALLS.get(key))
    row["still_holds"] = us(lambda: api._still_holds(k, a, b, None))
    row["new_output"] = us(lambda: api._new_output(k, a, 0))
    row["torch_empty"] = us(lambda: torch.empty((M, N), dtype=k.out_dtype, device="cuda"))
    C = api._new_output(k, a, 0)
    cp = C.data_ptr()
    bound = dispatch.bound(k.plan)
    s = api._torch_current_stream(a.device)
    h = dispatch.stream_handle(s)
    row["stream_handle"] = us(lambda: dispatch.stream_handle(s))
    if k.out16 is None:
        row["dispatch_run"] = us(lambda: dispatch.run(k.plan, a.ptr, b.ptr, cp, h, bound=bound))
    else:
        row["dispatch_run"] = us(lambda: dispatch.run_rounded(k.plan, a.ptr, b.ptr, cp, k.out16,
                                                              h, bound=bound))
    row["run_known"] = us(lambda: api._run_known(k, a, b, None, None, s))
    out["rows"].append(row)
    print({kk: (round(v, 2) if isinstance(v, float) else v) for kk, v in row.items()}, flush=True)
json.dump(out, open(sys.argv[1], "w"), indent=1, default=str)
