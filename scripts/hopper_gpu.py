"""GPU steps for the Hopper rungs (issue 13), called by scripts/hopper_gpu.sh:

``verify [rung ...]``  gemmlib.verify of wgmma_async / wgmma_tma / wgmma_ws, fp16 and bf16
``tune [n]``           wgmma_ws candidates at n^3 fp16, kernel timing against cuBLAS
``final``              the bench file results/bench-<gpu>-2026-11-23-hopper.json
``profile``            cProfile of gemmlib.matmul calls (host cost)
``ncu``                one fp16 8192^3 call, for Nsight Compute
"""
import json, sys, time, datetime as dt
import numpy as np
import gemmlib
from gemmlib import backend, bench, tuning, dispatch
from gemmlib.kernels import wgmma_async, wgmma_tma, wgmma_ws

step = sys.argv[1]
slug = tuning.gpu_slug()
if step == "verify":
    shapes = [(1, 1, 1), (129, 255, 3), (300, 130, 200), (1000, 1000, 1000), (4095, 3073, 2047),
              (3, 8191, 5), (1025, 513, 4097), (2048, 2048, 2048)]
    bad = 0
    mods = [m for m in (wgmma_async, wgmma_tma, wgmma_ws)
            if m.__name__.split(".")[-1] in (sys.argv[2:] or ["wgmma_async", "wgmma_tma", "wgmma_ws"])]
    for mod in mods:
        for prec in ("fp16", "bf16"):
            spec = mod.build(prec)
            t = time.time()
            try:
                r = gemmlib.verify(spec, shapes if prec == "fp16" else shapes[:5],
                                   raise_on_failure=False)
                print(r, f"({time.time() - t:.1f} s)", flush=True)
                bad += not r.ok
            except Exception as e:
                bad += 1
                print(spec.name, "FAILED", type(e).__name__, str(e)[:2000], flush=True)
    sys.exit(1 if bad else 0)
elif step == "bench":
    shapes = [(4096,) * 3, (8192,) * 3]
    res = bench.benchmark_precisions(("fp16", "bf16"), shapes,
                                     kernels=("wgmma_ws", "wgmma_tma", "wgmma_async", "auto"),
                                     reps=20, timing="both", budget_s=2)
    path = f"results/bench-{slug}-2026-11-23-hopper.json"
    json.dump(res.to_json(), open(path, "w"), indent=1)
    for r in res.to_json()["rows"]:
        print(r.get("precision"), r["kernel"], r["M"], r.get("timing"), f"{r.get('tflops', 0):.1f}",
              f"{r.get('pct_of_cublas', r.get('vs_cublas', 0))}", flush=True)
elif step == "tune":
    import cupy as cp
    cands = [dict(BN=256, STAGES=4), dict(BN=256, STAGES=3), dict(BN=128, STAGES=6),
             dict(BN=256, STAGES=4, REGS=None), dict(BN=256, STAGES=4, GROUP_M=16)]
    M = N = K = int(sys.argv[2]) if len(sys.argv) > 2 else 8192
    A, B = bench.precision_operands("fp16", M, N, K, 0)
    C = cp.empty((M, N), dtype=np.float32)
    timer = bench.Timer(True)
    cub = timer(lambda: backend.cublas_gemm(A, B, C, "fp16"), 10, 3)
    out = dict(meta=bench.environment(), rows=[])
    print(f"cublas {2*M*N*K/cub.median/1e9:.1f} TFLOP/s", flush=True)
    for c in cands:
        spec = wgmma_ws.build("fp16", **c)
        try:
            p = dispatch.warm(spec, M, N, K)
            run = lambda: dispatch.run(p, A.data.ptr, B.data.ptr, C.data.ptr,
                                       cp.cuda.get_current_stream().ptr)
            t = timer(run, 10, 2)
            tf = 2*M*N*K/t.median/1e9
            print(spec.name, c, f"{tf:.1f} TFLOP/s {100*cub.median/t.median:.1f}% regs",
                  dispatch.compiled_spec(spec).registers, flush=True)
            out["rows"].append(dict(params={k: (list(v) if isinstance(v, tuple) else v)
                                            for k, v in c.items()}, kernel=spec.name,
                                    median_ms=t.median, tflops=tf,
                                    pct_of_cublas=100*cub.median/t.median,
                                    cublas_median_ms=cub.median))
        except Exception as e:
            print(spec.name, "FAILED", type(e).__name__, str(e)[:500], flush=True)
    json.dump(out, open(f"results/tune-wgmma-ws-{slug}-2026-11-23.json", "w"), indent=1)
if step == "final":
    from gemmlib.kernels import mma_pipeline
    shapes = [(4096,) * 3, (8192,) * 3, (4095, 4097, 4093)]
    s4 = {p: wgmma_ws.build(p, STAGES=4) for p in ("fp16", "bf16")}
    rows, meta = [], None
    for prec in ("fp16", "bf16"):
        res = bench.benchmark_precisions((prec,), shapes,
                                         kernels=("auto", "wgmma_ws", "wgmma_tma", "wgmma_async",
                                                  "mma_pipeline"),
                                         reps=20, timing="both", budget_s=2)
        j = res.to_json()
        rows += j["rows"]
        meta = j["meta"]
        # the four-stage variant, kernel timing, in the same process
        import cupy as cp
        for M, N, K in shapes[:2]:
            A, B = bench.precision_operands(prec, M, N, K, 0)
            C = cp.empty((M, N), dtype=np.float32)
            timer = bench.Timer(True)
            cub = timer(lambda: backend.cublas_gemm(A, B, C, prec), 20, 3)
            p = dispatch.warm(s4[prec], M, N, K)
            t = timer(lambda: dispatch.run(p, getattr(A, "bits", A).data.ptr,
                                           getattr(B, "bits", B).data.ptr, C.data.ptr,
                                           cp.cuda.get_current_stream().ptr), 20, 3)
            rows.append(dict(kernel=s4[prec].name, precision=prec, M=M, N=N, K=K, timing="kernel",
                             median_ms=t.median, tflops=2 * M * N * K / t.median / 1e9,
                             pct_of_cublas=100 * cub.median / t.median, cublas_median_ms=cub.median))
    meta["precisions"] = ["fp16", "bf16"]
    meta["note"] = ("'auto' is what gemmlib.matmul runs by default (wgmma_ws on Hopper); "
                    "'mma_pipeline' is the issue-12 mma.sync rung; rows without cublas_tflops "
                    "are the four-stage wgmma_ws, kernel-timed against cuBLAS in the same process")
    path = f"results/bench-{slug}-2026-11-23-hopper.json"
    json.dump(dict(meta=meta, rows=rows), open(path, "w"), indent=1)
    for r in rows:
        print(r.get("precision"), r["kernel"], r["M"], r["N"], r["K"], r.get("timing"),
              f"{r.get('tflops', 0):.1f}", f"{r.get('pct_of_cublas', 0):.1f}",
              r.get("host_us"), flush=True)
elif step == "profile":
    import cProfile, pstats, cupy as cp
    A, B = bench.precision_operands("fp16", 4096, 4096, 4096, 0)
    C = cp.empty((4096, 4096), dtype=np.float32)
    for _ in range(5):
        gemmlib.matmul(A, B, out=C)
    cp.cuda.runtime.deviceSynchronize()
    import time as _t
    t0 = _t.perf_counter()
    for _ in range(200):
        gemmlib.matmul(A, B, out=C)
    t1 = _t.perf_counter()
    cp.cuda.runtime.deviceSynchronize()
    print(f"enqueue per call {1e6 * (t1 - t0) / 200:.1f} us (GPU-bound loop)")
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(200):
        gemmlib.matmul(A, B, out=C)
    prof.disable()
    cp.cuda.runtime.deviceSynchronize()
    pstats.Stats(prof).sort_stats("tottime").print_stats(25)
elif step == "ncu":
    import cupy as cp
    A, B = bench.precision_operands("fp16", 8192, 8192, 8192, 0)
    gemmlib.matmul(A, B)
    cp.cuda.runtime.deviceSynchronize()
