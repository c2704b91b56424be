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
from gemmlib import backend, bench


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
    name, rows = bench.call_steps(A, B)
    rows["reference matmul"] = ((lambda: torch.matmul(A, B)) if isinstance(A, torch.Tensor)
                                else (lambda: backend.array_module().matmul(A, B)))
    if isinstance(A, torch.Tensor):
        shape, dt, dev = (A.shape[0], B.shape[1]), A.dtype, A.device
        rows["torch.empty"] = lambda: torch.empty(shape, dtype=dt, device=dev)
        rows["A.new_empty"] = lambda: A.new_empty(shape)
        rows["torch.empty_strided"] = lambda: torch.empty_strided(shape, (shape[1], 1), dtype=dt,
                                                                  device=dev)
        rows["torch.cuda.current_device"] = torch.cuda.current_device
        rows["torch._C._cuda_getDevice"] = torch._C._cuda_getDevice
        rows["torch.is_grad_enabled"] = torch.is_grad_enabled
        rows["A.get_device"] = A.get_device
        rows["A.data_ptr"] = A.data_ptr
        rows["A.stride"] = A.stride
    res = {k: med(f) for k, f in rows.items()}
    print(f"--- {label}: {name}")
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
    if True:   # where the call's time goes, function by function
        import cProfile
        import pstats

        A = torch.rand(M, K, device="cuda", generator=g).to(torch.float16)
        B = torch.rand(K, N, device="cuda", generator=g).to(torch.float16)
        print(f"--- cProfile: torch float16 {M}x{N}x{K}, 2000 calls")
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
