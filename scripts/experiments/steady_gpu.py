"""Each Hopper candidate against torch.matmul with the GPU at its power limit.

``python3 scripts/experiments/steady_gpu.py OUT.json [PRECISIONS] [SHAPES]`` (GPU only)

Loops of calls (``results/loopgap-2026-11-25/``) showed that back-to-back 16-bit GEMMs on an
H100 run into the 700 W power cap within a second (SM clock 1980 -> ~1400 MHz, throttle reason "SW power cap") for cuBLAS and
gemmlib alike, so which one runs first, and for how long, moves a short loop's ratio.  Here
each candidate alternates with torch.matmul in blocks of ~BLOCK_S = 0.25 s (torch, cand,
torch, ..., torch: BLOCKS = 7 blocks, after one unrecorded block of the candidate), all on
the same rotating
operand sets (past 3x L2); a candidate's number is the median of its blocks over the median
of torch's, both at the clock the cap leaves.  Every candidate
is a ``gemmlib.matmul`` call (the caller's whole path), output in the inputs' 16-bit type
unless the label says ``fp32``.
"""
import json
import os
import statistics
import sys
import time

import torch

import gemmlib
from gemmlib import backend, bench, bench_models as BM, dispatch
from gemmlib.kernels import module

out = sys.argv[1]
precs = (sys.argv[2] if len(sys.argv) > 2 else "fp16,bf16").split(",")
SHAPES = [tuple(int(v) for v in s.split("x")) for s in (sys.argv[3] if len(sys.argv) > 3 else
          "4096x4096x4096,2048x2048x2048,8192x8192x8192,4096x6144x4096,4096x28672x4096,"
          "4096x4096x14336,16384x4096x4096").split(",")]
BLOCK_S = float(os.environ.get("BLOCK_S", 0.25))
#: blocks per candidate, alternating and starting with torch (odd): (BLOCKS - 1) / 2 of its own
BLOCKS = int(os.environ.get("BLOCKS", 7))


def candidates(prec):
    """label -> spec: each rung in float32 out and in the inputs' 16-bit type (``_o16``)."""
    o = prec
    c = {"ws3": ("wgmma_ws", {}), "ws4": ("wgmma_ws", dict(STAGES=4)),
         "ws3_o16": ("wgmma_ws", dict(OUT=o)), "ws4_o16": ("wgmma_ws", dict(STAGES=4, OUT=o)),
         "ws4g16_o16": ("wgmma_ws", dict(STAGES=4, GROUP_M=16, OUT=o)),
         "c2": ("wgmma_cluster", {}), "c2_o16": ("wgmma_cluster", dict(OUT=o)),
         "pp4_o16": ("wgmma_pingpong", dict(STAGES=4, OUT=o)),
         "sk2": ("wgmma_split_k", dict(SPLITS=2)),
         "ws64_o16": ("wgmma_ws", dict(BM=64, STAGES=5, OUT=o)),
         "st": ("wgmma_store", {}), "st_o16": ("wgmma_store", dict(OUT=o)),
         "st4p2_o16": ("wgmma_store", dict(STAGES=4, OUT=o, PIECES=2)),
         # 128 x 128 tiles: twice the tiles, so a one-wave shape gets two per SM
         "st128s4_o16": ("wgmma_store", dict(BN=128, STAGES=4, OUT=o)),
         "st128s6_o16": ("wgmma_store", dict(BN=128, STAGES=6, OUT=o))}
    keep = os.environ.get("CANDS")
    if keep:
        c = {k: v for k, v in c.items() if k in keep.split(",")}
    return {k: module(m).build(prec, **kw) for k, (m, kw) in c.items()}


fw = BM.framework("torch")
res = {"meta": bench.environment(), "block_s": BLOCK_S, "blocks": BLOCKS, "rows": []}
for prec in precs:
    specs = candidates(prec)
    for M, N, K in SHAPES:
        A, B = fw.operands(prec, M, N, K, 0)
        sets = BM.operand_sets(2 * (M * K + K * N), backend.device_info().l2_bytes)
        pairs = [(A, B)] + [(A.clone(), B.clone()) for _ in range(sets - 1)]
        tdt = A.dtype
        calls = {"auto": [(lambda a=a, b=b: gemmlib.matmul(a, b, out_dtype=tdt))
                          for a, b in pairs],
                 "auto_fp32": [(lambda a=a, b=b: gemmlib.matmul(a, b)) for a, b in pairs]}
        for label, spec in specs.items():
            calls[label] = [(lambda a=a, b=b, s=spec: gemmlib.matmul(a, b, kernel=s))
                            for a, b in pairs]
        ref = [(lambda a=a, b=b: torch.matmul(a, b)) for a, b in pairs]
        errs = {}
        t0 = time.time()
        for label, fns in calls.items():
            C = fns[0]()
            torch.cuda.synchronize()
            errs[label] = fw.rel_error(C, A, B, 128)
        print(f"{prec} {M}x{N}x{K}: warmed {len(calls)} in {time.time() - t0:.1f} s", flush=True)
        # The first torch calls at a shape pay cuBLAS's one-off costs (heuristics,
        # workspace): probing with them gave blocks of 6-9 calls (~2 ms) at 4096^3, not
        # BLOCK_S (results/README.md, epilogue-2026-11-26).  Probe after a warm loop, median of 3.
        BM.loop_time(fw, ref, 3, 2)
        probe = statistics.median(BM.loop_time(fw, ref, 3, 3))
        per = int(max(3, BLOCK_S * 1e3 / max(probe, 1e-3)))
        BM.loop_time(fw, ref, per, 2)   # into the cap before the first block
        for label, fns in calls.items():
            # One unrecorded block of the candidate first: the first block after a switch of
            # kernel ran 10-50% slow for whichever label came first (steady-repeat-h100.json).
            BM.loop_time(fw, fns, per, 1)
            t_ref, t_c, starts, host = [], [], [], []
            for i in range(BLOCKS):   # torch, cand, torch, ..., torch
                starts.append(time.time())   # to line up with a clock log (nvidia-smi -lms)
                h0 = time.perf_counter()
                (t_ref if i % 2 == 0 else t_c).extend(BM.loop_time(fw, ref if i % 2 == 0
                                                                   else fns, per, 1))
                host.append((time.perf_counter() - h0) / per)
            r, c = statistics.median(t_ref), statistics.median(t_c)
            name = (dispatch.select_tc(prec, M, N, K, out=prec).name if label == "auto" else
                    dispatch.select_tc(prec, M, N, K).name if label == "auto_fp32"
                    else specs[label].name)
            row = dict(precision=prec, M=M, N=N, K=K, label=label, kernel=name,
                       us=c * 1e3, torch_us=r * 1e3, pct_of_torch=100 * r / c,
                       blocks_us=[x * 1e3 for x in t_c], torch_blocks_us=[x * 1e3 for x in t_ref],
                       block_starts=starts, block_wall_us=[x * 1e6 for x in host],
                       tflops=2 * M * N * K / c / 1e9, rel_error=errs[label], per=per)
            res["rows"].append(row)
            print(f"{prec} {M}x{N}x{K} {label:9s} {name:36s} {c * 1e3:9.1f} us  torch "
                  f"{r * 1e3:9.1f} us  {row['pct_of_torch']:6.1f}%  err {errs[label]:.1e}",
                  flush=True)
            json.dump(res, open(out, "w"), indent=1, default=str)
        del pairs, calls, ref, A, B, C
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
json.dump(res, open(out, "w"), indent=1, default=str)
