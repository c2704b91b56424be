"""Where one framework call's host time goes (GPU only): each step of gemmlib.matmul's short
path timed alone, median over many back-to-back repetitions, for torch fp32/fp16 and CuPy fp16
at 64^3 and a decode shape 1x6144x4096 (with a cProfile of the fp16 decode call).  Prints a table; writes JSON to the path given as the first argument (optional)."""

import json
import statistics
import sys
import time

import numpy as np
import torch

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1]))

import gemmlib
from gemmlib import api, backend, dispatch


def med(fn, n=3000):
    for _ in range(50):
        fn()
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    torch.cuda.synchronize()
    return statistics.median(ts) * 1e6


def steps(A, B, label):
    a, b = api._describe(A, "A"), api._describe(B, "B")
    key = api._call_key(a, b, None, None, False, None)
    gemmlib.matmul(A, B)
    known = dispatch.CALLS.get(key)
    p = known.plan
    out = gemmlib.matmul(A, B)
    cptr = api._out_ptr(out)
    bd = dispatch.bound(p)
    h = dispatch.stream_handle(api._torch_current_stream(a.device) if a.kind == "torch" else None)
    rows = {
        "whole call": lambda: gemmlib.matmul(A, B),
        "reference matmul": (lambda: torch.matmul(A, B)) if a.kind == "torch"
        else (lambda: backend.array_module().matmul(A, B)),
        "describe A": lambda: api._describe(A, "A"),
        "call key": lambda: api._call_key(a, b, None, None, False, None),
        "lookup": lambda: dispatch.CALLS.get(key),
        "still holds": lambda: api._still_holds(known, a, b, None),
        "current device": api._current_device,
        "new output": lambda: api._new_output(known, a, 0),
        "dispatch.run": lambda: dispatch.run(p, a.ptr, b.ptr, cptr, h),
        "dispatch.run bound": lambda: dispatch.run(p, a.ptr, b.ptr, cptr, h, bound=bd),
        "_bound": lambda: dispatch._bound(p),
        "current context": lambda: dispatch.driver().current_context(),
    }
    if a.kind == "torch":
        rows["torch stream"] = lambda: api._torch_current_stream(a.device)
        rows["torch.empty"] = lambda: torch.empty((64, 64), dtype=torch.float32, device=A.device)
    if p.spec.tma_boxes:
        rows["tensor maps"] = lambda: dispatch._tensor_maps(p, a.ptr, b.ptr, h)
    res = {k: med(f) for k, f in rows.items()}
    print(f"--- {label}: {p.spec.name}")
    for k, v in res.items():
        print(f"  {k:<18} {v:7.2f} us")
    return res


out = {}
g = torch.Generator(device="cuda").manual_seed(0)
for (M, N, K) in ((64, 64, 64), (1, 6144, 4096)):
    for dt in (torch.float32, torch.float16, torch.bfloat16):
        A = torch.rand(M, K, device="cuda", generator=g).to(dt)
        B = torch.rand(K, N, device="cuda", generator=g).to(dt)
        out[f"torch {dt} {M}x{N}x{K}"] = steps(A, B, f"torch {dt} {M}x{N}x{K}")
    if M != 64:   # where the decode call's time goes, function by function
        import cProfile
        import pstats

        A = torch.rand(M, K, device="cuda", generator=g).to(torch.float16)
        B = torch.rand(K, N, device="cuda", generator=g).to(torch.float16)
        for _ in range(50):
            gemmlib.matmul(A, B)
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(2000):
            gemmlib.matmul(A, B)
        prof.disable()
        torch.cuda.synchronize()
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)
cp = backend.array_module()
A = cp.random.rand(64, 64).astype(cp.float16)
B = cp.random.rand(64, 64).astype(cp.float16)
out["cupy float16"] = steps(A, B, "cupy float16")
if len(sys.argv) > 1:
    with open(sys.argv[1], "w") as f:
        json.dump(out, f, indent=1)
