"""Which tensor-core path for which shape on Hopper (issue 18): the data behind dispatch's rule.

    python scripts/tc_shapes_gpu.py OUT.json [--precisions fp16,bf16] [--ms 1,4,8,...]
                                             [--budget 300]

For the projections of the models suite (Llama 3.1 8B, Qwen2.5 72B) at M rows and the
sweep's deep-K shapes, times every candidate kernel on the GPU -- CUDA events around a
loop of back-to-back launches (``gemmlib.dispatch.run``) queued behind a sleeping kernel,
so the host's cost per call stays out, operands rotated past 3x L2 -- against
``torch.matmul`` timed the same way in the same run (the kernels' times: the call-level
numbers are the models suite's):

* ``ws``: ``wgmma_ws`` (128 x 256 tiles, no split: what ``auto`` ran before);
* ``sk64`` / ``sk128``: ``wgmma_split_k`` with BM = 64 / 128, slices from its cost model;
* ``sk64_kS`` / ``sk128_kS``: the same with S slices forced (S in --splits);
* ``skinny``: the decode rung (M <= 16);
* ``auto``: what ``gemmlib.matmul`` runs (``dispatch.select_hopper``).

Every candidate's output is checked against float64 on the first rows before it is timed.
Writes OUT.json: meta (GPU, versions, clocks) and one row per (shape, precision,
candidate) with ``median_us``, ``torch_us``, ``pct_of_torch``, ``splits``, ``kernel``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "0")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

T0 = time.perf_counter()


def log(*a):
    print(f"[{time.perf_counter() - T0:6.1f}s]", *a, flush=True)


def queued_time(torch, calls, per: int, loops: int) -> list[float]:
    """Milliseconds per call on the GPU: ``per`` launches cycling through ``calls``, queued
    behind a sleeping kernel (so they are all in the queue when the clock starts)."""
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    out = []
    for _ in range(loops):
        torch.cuda.synchronize()
        torch.cuda._sleep(int(per * 60e-6 * 1.98e9))   # ~60 us of host time per launch
        e0.record()
        for i in range(per):
            calls[i % len(calls)]()
        e1.record()
        e1.synchronize()
        out.append(e0.elapsed_time(e1) / per)
    return out


def main(argv=None) -> int:
    import torch

    import gemmlib
    from gemmlib import backend, dispatch
    from gemmlib import bench_models as BM
    from gemmlib.bench import environment
    from gemmlib.kernels import wgmma_split_k
    from gemmlib.precision import tolerance

    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--precisions", default="fp16,bf16")
    ap.add_argument("--ms", default="1,4,8,16,32,64,128,256,512,1024")
    ap.add_argument("--splits", default="2,4,8")
    ap.add_argument("--budget", type=float, default=400.0)
    args = ap.parse_args(argv)
    ms = [int(x) for x in args.ms.split(",")]
    splits = [int(x) for x in args.splits.split(",")]
    fw = BM.framework("torch")
    meta = environment()
    dev = backend.device_info()
    shapes = [(m, N, K, f"{model}.{layer}") for m in ms for model in BM.MODELS
              for layer, N, K in BM.projections(model)]
    shapes += [(M, N, K, "sweep") for (M, N, K) in BM.EXTRA_SHAPES]
    rows = []

    def cands(prec, M, N, K):
        out = [("ws", dispatch.build("wgmma_ws", {"precision": prec}))]
        for bm in (64, 128):
            out.append((f"sk{bm}", dispatch.build("wgmma_split_k",
                                                  {"precision": prec, "BM": bm})))
            tiles = -(-M // bm) * -(-N // 256)
            for s in splits:
                if tiles * s <= 4 * dev.sm_count and -(-K // 64) >= 2 * s:
                    out.append((f"sk{bm}_k{s}", dispatch.build(
                        "wgmma_split_k", {"precision": prec, "BM": bm, "SPLITS": s})))
        if M <= 16:
            from gemmlib.kernels.skinny import params_for

            out.append(("skinny", dispatch.build("skinny", params_for(prec, M))))
        out.append(("auto", dispatch.select_tc(prec, M, N, K)))   # what matmul runs
        return out

    for prec in args.precisions.split(","):
        for M, N, K, what in shapes:
            if time.perf_counter() - T0 > args.budget:
                log("budget spent: stopping")
                break
            A, B = fw.operands(prec, M, N, K, 0)
            nbytes = 2 * (M * K + K * N)
            sets = BM.operand_sets(nbytes, dev.l2_bytes)
            pairs = [(A, B)] + [(A.clone(), B.clone()) for _ in range(sets - 1)]
            ref = [(lambda a=a, b=b: torch.matmul(a, b)) for a, b in pairs]
            probe = BM.loop_time(fw, ref, 2, 1)[0]
            per = int(min(40, max(5, 10.0 / max(probe, 1e-3))))
            t_ref = statistics.median(queued_time(torch, ref, per, 5))
            r64 = A[:64].double() @ B.double()
            for name, spec in cands(prec, M, N, K):
                row = dict(precision=prec, shape=what, M=M, N=N, K=K, candidate=name,
                           kernel=spec.name, torch_us=t_ref * 1e3)
                try:
                    C = gemmlib.matmul(A, B, kernel=spec)
                    err = float(torch.linalg.norm(C[:64].double() - r64)
                                / torch.linalg.norm(r64))
                    if not err <= tolerance(prec, K):
                        raise AssertionError(f"error {err:.2e}")
                    p = dispatch.plan(spec, M, N, K + (-K) % 8)
                    row["splits"] = p.workspace[0][0] if p.workspace else 1
                    row["grid"] = p.grid[0]
                    bound = dispatch.bound(p)
                    c = dispatch.compiled_spec(spec)
                    row.update(registers=c.registers, local_bytes=c.local_bytes)
                    out = torch.empty((M, N), dtype=torch.float32, device="cuda")
                    stream = torch.cuda.current_stream().cuda_stream
                    ours = [(lambda a=a, b=b: dispatch.run(p, a.data_ptr(), b.data_ptr(),
                                                           out.data_ptr(), stream, bound))
                            for a, b in pairs]
                    t = statistics.median(queued_time(torch, ours, per, 5))
                    row.update(median_us=t * 1e3, pct_of_torch=100.0 * t_ref / t,
                               rel_error=err)
                except Exception as e:   # recorded, never hidden
                    row["error"] = f"{type(e).__name__}: {e}"[:300]
                rows.append(row)
            best = max((r for r in rows[-len(cands(prec, M, N, K)):] if "pct_of_torch" in r),
                       key=lambda r: r["pct_of_torch"], default=None)
            line = " ".join(f"{r['candidate']}={r.get('pct_of_torch', float('nan')):.0f}"
                            for r in rows[-len(cands(prec, M, N, K)):])
            log(f"{prec} {what:<16} {M}x{N}x{K} torch {t_ref * 1e3:7.1f} us | {line}"
                + (f" | best {best['candidate']}" if best else ""))
            del pairs, ref
            torch.cuda.empty_cache()
    Path(args.out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    log("wrote", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
