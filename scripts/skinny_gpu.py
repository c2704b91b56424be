"""The decode rung on a GPU (issue 18): verify it, time it, pick its defaults.

    python scripts/skinny_gpu.py [OUT.json] [--precisions fp16,bf16,fp32] [--budget 110]
                                 [--ms 1,4,16] [--quick]

1. **Verify** the configurations ``kernel="auto"`` runs (``skinny.params_for``) in fp16,
   bf16 and fp32 on odd shapes and a split-K form, against float64 (gemmlib.verify).
2. **Copy bandwidth**: a 2 GiB device-to-device copy, bytes read + written over time.
3. **Time** decode shapes -- M in 1, 4, 16 and (K, N) the projections of Llama 3.1 8B and
   Qwen2.5 72B -- with CUDA events around a loop of 20 back-to-back launches.  B is
   rotated among enough copies that they do not sit in L2 (> 3x L2 in all), and each
   loop starts behind a ~3 ms sleeping kernel, so the 20 launches are queued before the
   clock starts (the host's launch cost stays out of the GPU time).  Against:
   ``cublas`` (cublasGemmEx, same precision, fp32 output like gemmlib's), ``cupy`` (
   cupy.matmul: 16-bit output), ``wgmma_ws`` (what gemmlib.matmul ran for fp16/bf16 on
   Hopper before the decode rule), and for fp32 ``old_auto`` (the warp-tiled / split-K
   choice of dispatch.select without the decode rule).  Skinny configurations: ``auto``
   (params_for), ``nosplit`` / ``split2x`` (SPLITS: 1 / twice the auto count; launch only),
   ``nt128`` (128 threads), ``ct16`` (16 lanes a row: 2x the column slabs), ``nc``
   (ld.global.nc.L1::no_allocate), ``u8`` (8 loads in flight a thread, M <= 8) and for
   M = 16 ``mt8`` (two row blocks of 8, B's second read from L2).  skinny.TUNED takes
   the winners (e.g. ``{16: {"MT": 8}}``); dispatch.SKINNY_FP32_MMAX the fp32 threshold.  Every timed output is checked against float64.
4. **Print** a table -- time, GB/s (the fewest bytes the product moves: A and B read once,
   C written once), % of the copy bandwidth, % of cuBLAS -- and the best configuration per
   shape, and write everything to OUT.json (default results/skinny-<gpu>-<date>.json).

Every measurement is wrapped: a failing configuration is reported and the run goes on.
``--budget`` (seconds) stops adding optional configurations once spent (the ``auto``
configuration and the references are always measured).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "0")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

T0 = time.perf_counter()

#: (layer, K, N): Llama 3.1 8B and Qwen2.5 72B, one transformer layer
SHAPES = [("llama8b.qkv", 4096, 6144), ("llama8b.o", 4096, 4096),
          ("llama8b.gate_up", 4096, 28672), ("llama8b.down", 14336, 4096),
          ("qwen72b.qkv", 8192, 10240), ("qwen72b.gate_up", 8192, 59136),
          ("qwen72b.down", 29568, 8192)]
ODD = [(1, 1, 1), (3, 7, 37), (16, 130, 260), (5, 1001, 999), (16, 4097, 1031),
       (2, 8191, 517), (17, 333, 4099), (1, 6144, 4096)]
REPS, LOOPS = 20, 3
ITEM = {"fp16": 2, "bf16": 2, "fp32": 4}


def log(*a):
    print(f"[{time.perf_counter() - T0:6.1f}s]", *a, flush=True)


def main(argv=None) -> int:
    import cupy as cp

    import gemmlib
    from gemmlib import backend, dispatch, tuning
    from gemmlib import precision as P
    from gemmlib.backend import cuda
    from gemmlib.kernels import skinny

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", nargs="?")
    ap.add_argument("--precisions", default="fp16,bf16,fp32")
    ap.add_argument("--ms", default="1,4,16")
    ap.add_argument("--budget", type=float, default=110.0)
    ap.add_argument("--quick", action="store_true", help="auto configuration and references only")
    args = ap.parse_args(argv)
    precs = args.precisions.split(",")
    Ms = [int(m) for m in args.ms.split(",")]
    dev = backend.device_info()
    hopper = tuple(dev.compute_capability) == (9, 0)
    slug = tuning.gpu_slug()
    out_path = Path(args.out or f"results/skinny-{slug}-{dt.date.today()}.json")
    res = dict(device=dev.name, cc=list(dev.compute_capability), sm_count=dev.sm_count,
               l2_bytes=dev.l2_bytes, gemmlib=gemmlib.__version__, verify=[], rows=[],
               best=[], failures=[], params=dict(DEFAULTS=skinny.DEFAULTS,
                                                 TARGET_WARPS_PER_SM=skinny.TARGET_WARPS_PER_SM,
                                                 MIN_SLICE_K=skinny.MIN_SLICE_K,
                                                 WORKSPACE_SHARE=skinny.WORKSPACE_SHARE))
    log(f"{dev.name} sm_{dev.compute_capability[0]}{dev.compute_capability[1]}, "
        f"{dev.sm_count} SMs, L2 {dev.l2_bytes >> 20} MiB")

    def fail(where, e):
        msg = f"{type(e).__name__}: {str(e)[:400]}"
        res["failures"].append(dict(where=where, error=msg,
                                    trace=traceback.format_exc()[-1500:]))
        log("FAILED", where, msg)

    def save():
        out_path.parent.mkdir(parents=True, exist_ok=True)
        res["seconds"] = round(time.perf_counter() - T0, 1)
        out_path.write_text(json.dumps(res, indent=1, default=str))

    # ------------------------------------------------------------------ 1. verify
    for prec in precs:
        for M in sorted({1, 4, 16} | set(Ms)):
            for extra in ({}, {"SPLITS": 3}):
                params = {**skinny.params_for(prec, M), **extra}
                spec = dispatch.build("skinny", params)
                shapes = [s for s in ODD if s[0] <= max(M, 17) and (M > 1 or s[0] == 1)]
                try:
                    r = gemmlib.verify(spec, shapes, raise_on_failure=False)
                    res["verify"].append(dict(kernel=spec.name, precision=prec, ok=r.ok,
                                              checks=[dict(shape=c.shape, err=c.rel_error,
                                                           tol=c.tolerance, ok=c.ok)
                                                      for c in r.checks]))
                    log("verify", spec.name, "ok" if r.ok else "FAIL\n" + str(r))
                except Exception as e:  # noqa: BLE001
                    fail(f"verify {spec.name}", e)
    save()

    # ------------------------------------------------------------------ 2. copy bandwidth
    from gemmlib.bench_models import copy_bandwidth

    bw = copy_bandwidth()   # the models suite's measurement, the same way
    res["copy_gbs"] = bw
    log(f"device-to-device copy: {bw:.0f} GB/s (read + written)")

    # ------------------------------------------------------------------ 3. timing
    @cuda.jit
    def sleeper(n):
        for _ in range(n):
            cuda.nanosleep(1000)

    scratch = []

    def hold(stream):
        """Keep the GPU busy ~3 ms so the launches that follow are queued before the clock
        starts: a sleeping kernel (sm_70+), else writes over a 4 GiB scratch buffer."""
        if not scratch:
            try:
                sleeper[1, 1, cuda.external_stream(stream.ptr) if stream.ptr else 0](3000)
                return
            except Exception as e:  # noqa: BLE001
                log("sleeping kernel unavailable, using a scratch fill:", type(e).__name__, e)
                scratch.append(cp.empty(1 << 30, dtype=np.float32))
        scratch[0].fill(0)

    def timed(fns) -> float:
        """Seconds per call: LOOPS loops of REPS calls (fns[i % len(fns)]) queued behind
        ``hold``; the median loop."""
        stream = cp.cuda.get_current_stream()
        fns[0]()                                      # compile / warm
        stream.synchronize()
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        ts = []
        for _ in range(LOOPS):
            hold(stream)
            e0.record(stream)
            for r in range(REPS):
                fns[r % len(fns)]()
            e1.record(stream)
            e1.synchronize()
            ts.append(cp.cuda.get_elapsed_time(e0, e1) * 1e-3 / REPS)
        return statistics.median(ts)

    def ptr(x):
        return getattr(x, "bits", x).data.ptr

    def variants(prec, M, auto_splits):
        base = skinny.params_for(prec, M)
        out = [("auto", base), ("nosplit", {**base, "SPLITS": 1}),
               ("split2x", {**base, "SPLITS": max(2, 2 * auto_splits)})]
        if prec == "fp16" and not args.quick:
            out += [("nt128", {**base, "NT": 128}), ("ct16", {**base, "CT": 16}),
                    ("nc", {**base, "NC": 1})]
            if base["MT"] == 16:
                out.append(("mt8", {**base, "MT": 8}))     # two row blocks, B again from L2
            else:
                out.append(("u8", {**base, "U": 8}))       # twice the loads in flight
        if args.quick:
            out = out[:1]
        return out

    def row(prec, layer, M, N, K, method, t, ref_t, err=None, spec=None, extra=None):
        moved = ITEM[prec] * (M * K + K * N) + 4 * M * N
        gbs = moved / t / 1e9
        r = dict(precision=prec, layer=layer, M=M, N=N, K=K, method=method, us=t * 1e6,
                 gbs=gbs, pct_copy=100 * gbs / bw, pct_cublas=100 * ref_t / t if ref_t else None,
                 rel_err=err, kernel=spec.name if spec is not None else None, **(extra or {}))
        res["rows"].append(r)
        pc = f"{r['pct_cublas']:6.1f}%" if r["pct_cublas"] else "      -"
        es = f"{err:.1e}" if err is not None else "-"
        log(f"{prec:>4} {layer:<16} M={M:<3} {method:<10} {t * 1e6:9.1f} us {gbs:7.0f} GB/s "
            f"{r['pct_copy']:5.1f}% copy {pc} cuBLAS  err {es}")
        return r

    for prec in precs:
        for layer, K, N in SHAPES:
            try:
                bbytes = ITEM[prec] * K * N
                sets = max(2, min(16, math.ceil(3 * dev.l2_bytes / bbytes)))
                Bf = [cp.random.uniform(-1, 1, (K, N), dtype=np.float32) for _ in range(sets)]
                if prec == "fp16":
                    Bs = [b.astype(np.float16) for b in Bf]
                elif prec == "bf16":
                    Bs = [P.to_bf16(b) for b in Bf]
                else:
                    Bs = Bf
                B64 = backend.as_float64(Bs[0])
                del Bf
            except Exception as e:  # noqa: BLE001
                fail(f"{prec} {layer} operands", e)
                continue
            for M in Ms:
                try:
                    Af = cp.random.uniform(-1, 1, (M, K), dtype=np.float32)
                    A = (Af.astype(np.float16) if prec == "fp16" else
                         P.to_bf16(Af) if prec == "bf16" else Af)
                    ref = backend.as_float64(A) @ B64
                    C = cp.empty((M, N), dtype=np.float32)
                    st = cp.cuda.get_current_stream().ptr

                    def err():
                        return backend.relative_error(C, ref)

                    def measure(method, fns, spec=None):
                        """Time fns (one per copy of B), then check one call on Bs[0]."""
                        t = timed(fns)
                        C.fill(np.nan)
                        fns[0]()
                        e = err() if method != "cupy" else None
                        return t, e

                    # references
                    cub = None
                    try:
                        cub, e = measure("cublas", [lambda b=b: backend.cublas_gemm(A, b, C, prec)
                                                    for b in Bs])
                        row(prec, layer, M, N, K, "cublas", cub, cub, e)
                    except Exception as e:  # noqa: BLE001
                        fail(f"{prec} {layer} M={M} cublas", e)
                    if prec != "bf16":
                        try:
                            t, _ = measure("cupy", [lambda b=b: cp.matmul(A, b) for b in Bs])
                            row(prec, layer, M, N, K, "cupy", t, cub)
                        except Exception as e:  # noqa: BLE001
                            fail(f"{prec} {layer} M={M} cupy", e)
                    if prec in ("fp16", "bf16") and hopper:
                        try:
                            spec = dispatch.build("wgmma_ws", {"precision": prec})
                            p = dispatch.warm(spec, M, N, K)
                            t, e = measure("wgmma_ws", [
                                lambda b=b: dispatch.run(p, ptr(A), ptr(b), C.data.ptr, st)
                                for b in Bs])
                            row(prec, layer, M, N, K, "wgmma_ws", t, cub, e, spec)
                        except Exception as e:  # noqa: BLE001
                            fail(f"{prec} {layer} M={M} wgmma_ws", e)
                    if prec == "fp32":
                        try:
                            saved = dispatch.SKINNY_FP32_MMAX
                            dispatch.SKINNY_FP32_MMAX = 0
                            dispatch.clear_memory_caches()
                            try:
                                spec = dispatch.select(M, N, K)
                            finally:
                                dispatch.SKINNY_FP32_MMAX = saved
                                dispatch.clear_memory_caches()
                            p = dispatch.warm(spec, M, N, K)
                            t, e = measure("old_auto", [
                                lambda b=b: dispatch.run(p, A.data.ptr, b.data.ptr, C.data.ptr, st)
                                for b in Bs])
                            row(prec, layer, M, N, K, "old_auto", t, cub, e, spec)
                        except Exception as e:  # noqa: BLE001
                            fail(f"{prec} {layer} M={M} old_auto", e)
                    # skinny configurations
                    auto_spec = dispatch.build("skinny", skinny.params_for(prec, M))
                    auto_s = auto_spec.launch(M, N, K).grid[2]
                    mine = []
                    for name, params in variants(prec, M, auto_s):
                        if name != "auto" and time.perf_counter() - T0 > args.budget:
                            res["failures"].append(dict(where=f"{prec} {layer} M={M} {name}",
                                                        error="skipped: time budget"))
                            continue
                        try:
                            spec = dispatch.build("skinny", params)
                            p = dispatch.warm(spec, M, N, K)
                            t, e = measure(name, [
                                lambda b=b: dispatch.run(p, ptr(A), ptr(b), C.data.ptr, st)
                                for b in Bs])
                            regs = dispatch.compiled_spec(spec).registers
                            r = row(prec, layer, M, N, K, f"skinny:{name}", t, cub, e, spec,
                                    dict(splits=p.splits, grid=list(p.grid), registers=regs,
                                         params={k: v for k, v in params.items()}))
                            tol = P.tolerance(prec, K)
                            r["ok"] = bool(e <= tol)
                            if not r["ok"]:
                                fail(f"{prec} {layer} M={M} {name}",
                                     AssertionError(f"rel. error {e:.2e} > {tol:.1e}"))
                            else:
                                mine.append(r)
                        except Exception as e:  # noqa: BLE001
                            fail(f"{prec} {layer} M={M} skinny:{name}", e)
                    if mine:
                        b = max(mine, key=lambda r: r["gbs"])
                        auto = next((r for r in mine if r["method"] == "skinny:auto"), None)
                        res["best"].append(dict(
                            precision=prec, layer=layer, M=M, N=N, K=K, best=b["method"],
                            params=b["params"], splits=b["splits"], gbs=b["gbs"],
                            pct_copy=b["pct_copy"], pct_cublas=b["pct_cublas"],
                            auto_gbs=auto["gbs"] if auto else None,
                            auto_pct_cublas=auto["pct_cublas"] if auto else None))
                    del A, C, ref
                except Exception as e:  # noqa: BLE001
                    fail(f"{prec} {layer} M={M}", e)
                save()
            del Bs, B64
            cp.get_default_memory_pool().free_all_blocks()

    # ------------------------------------------------------------------ 4. summary
    print("\nbest skinny configuration per shape "
          "(GB/s, % of copy bandwidth, % of cuBLAS; auto's % of cuBLAS):")
    wins: dict = {}
    for b in res["best"]:
        pc = f"{b['pct_cublas']:6.1f}%" if b["pct_cublas"] else "      -"
        ac = f"{b['auto_pct_cublas']:6.1f}%" if b["auto_pct_cublas"] else "      -"
        print(f"  {b['precision']:>4} {b['layer']:<16} M={b['M']:<3} {b['best']:<16} "
              f"S={b['splits']:<3} {b['gbs']:7.0f} GB/s {b['pct_copy']:5.1f}% copy "
              f"{pc} cuBLAS (auto {ac})")
        wins.setdefault((b["precision"], b["M"]), []).append(b["best"])
    print("\nwins per (precision, M):")
    for k, v in sorted(wins.items()):
        print(f"  {k}: " + ", ".join(f"{m} x{v.count(m)}" for m in sorted(set(v))))
    ok = all(v["ok"] for v in res["verify"]) and not [
        f for f in res["failures"] if not f["error"].startswith("skipped")]
    res["ok"] = ok
    save()
    log(f"wrote {out_path}; {'all checks passed' if ok else 'FAILURES: see above'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
