"""Batched products in one launch on Hopper: the candidates behind ``select_batched``.

    python scripts/batched_gpu.py OUT.json [--budget 240] [--precisions fp16,bf16]
                                  [--layouts KN,NK] [--only st_s4p2,ws,...] [--smoke]

For the batched shapes of attention -- batch in {32, 256}, M = N in {128, 1024, 4096},
K in {64, 128}, a C in the inputs' 16-bit type -- times each candidate's single launch
over every product's tiles (``gemmlib.runtime.calls.run`` on the stacked operands): CUDA
events around a loop of launches queued behind a sleeping kernel
(``tc_shapes_gpu.queued_time``, so the host's cost per call stays out), operands rotated
past 3x L2 where the copies fit in memory, the median of 5 loops after a warm-up, against
``torch.bmm(A, B, out=C)`` timed the same way on the same data in the same run:

* ``ws``: ``wgmma_ws`` (BN 256, or 128 where N <= 128), registers to C: the choice before;
* ``ws128``: ``wgmma_ws`` with 128-column tiles (twice the tiles, N > 128);
* ``st_s4p2`` / ``st_s3``: ``wgmma_store`` 128 x 256, four stages and the tile staged in two
  halves / three stages and one piece: C by TMA store, asynchronous (N > 128);
* ``st128_s6`` / ``st128_s4`` / ``st64_s8``: ``wgmma_store`` with 128- / 64-column tiles;
* ``pp`` / ``pp64``: ``wgmma_pingpong`` 128 x 128 / 64 x 128 (one consumer's store under
  the other's wgmma, registers to C);
* ``auto``: ``gemmlib.matmul(A, B)`` -- the whole call, with what ``select_batched`` picks
  (HOPPER_BATCHED), its kernel queued the same way; its row also has ``call_us`` and
  ``torch_call_us``, back-to-back calls not queued (``torch.bmm(A, B)`` allocating too):
  the layouts suite's way, where the host's cost per call shows on small batches.

``--layouts NK`` gives B as the transpose of a (batch, N, K) stack (attention's Q K^T).
Each candidate first writes a NaN-poisoned C once: every element must be finite and a
sample of products (first, middle, last) within ``--tol`` relative error (Frobenius) of
torch's float32 ``bmm``, else the row has ``ok: false`` and no time.  Rows: precision,
layout, batch, M, N, K, candidate, kernel, us, torch_us, pct_torch (100 * torch_us / us),
ok, rel_err, and torch_us_after (torch again after the candidates: clock drift).  The
passes go fp16 KN, bf16 KN, fp16 NK, bf16 NK, the layouts suite's four shapes first in
each; ``--budget`` stops between candidates, and the JSON is rewritten after each shape.

``--smoke``: the same candidates on a tiny batch in numba's CUDA simulator (no GPU, no
timing: ``us`` is null), checked against float64 -- a test of the script and the builds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

T0 = time.perf_counter()

#: (batch, M = N, K): the layouts suite's four batched rows first, then the rest
SHAPES = [(32, 1024, 128), (256, 128, 64), (32, 4096, 128), (256, 1024, 64),
          (32, 128, 64), (32, 128, 128), (256, 128, 128), (32, 1024, 64),
          (256, 1024, 128), (32, 4096, 64), (256, 4096, 64), (256, 4096, 128)]
SMOKE_SHAPES = [(2, 67, 136, 64)]   # (batch, M, N, K): M not a whole tile, N three of 64

#: name -> (rung, build parameters, N range: "wide" N > 128, "narrow" N <= 128, "any")
CANDIDATES = {
    "ws": ("wgmma_ws", {}, "any"),
    "ws128": ("wgmma_ws", {"BN": 128}, "wide"),
    "st_s4p2": ("wgmma_store", {"BN": 256, "STAGES": 4, "PIECES": 2}, "wide"),
    "st_s3": ("wgmma_store", {"BN": 256, "STAGES": 3}, "wide"),
    "st128_s6": ("wgmma_store", {"BN": 128, "STAGES": 6}, "any"),
    "st128_s4": ("wgmma_store", {"BN": 128, "STAGES": 4}, "any"),
    "st64_s8": ("wgmma_store", {"BN": 64, "STAGES": 8}, "any"),
    "pp": ("wgmma_pingpong", {"BM": 128, "BN": 128}, "any"),
    "pp64": ("wgmma_pingpong", {"BM": 64, "BN": 128}, "any"),
}


def log(*a):
    print(f"[{time.perf_counter() - T0:6.1f}s]", *a, flush=True)


def candidates(precision: str, N: int, layout: str, only=None) -> dict:
    """name -> spec (or "auto") for products N wide, C in ``precision``, B as ``layout``."""
    from gemmlib.runtime import select

    out = {}
    for name, (rung, params, span) in CANDIDATES.items():
        if (span == "wide" and N <= 128) or (only and name not in only):
            continue
        p = dict(params, precision=precision, OUT=precision, B_LAYOUT=layout)
        if name == "ws":
            p["BN"] = 128 if N <= 128 else 256
        out[name] = select.build(rung, p)
    if not only or "auto" in only:
        out["auto"] = "auto"
    return out


def passes(precisions, layouts):
    return [(p, lay) for lay in layouts for p in precisions]


# --------------------------------------------------------------------------- the GPU


def gpu_main(args) -> None:
    import torch

    import gemmlib
    from gemmlib import backend
    from gemmlib.bench import environment
    from gemmlib.bench_models import framework, loop_time, operand_sets
    from gemmlib.runtime import calls, select

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from tc_shapes_gpu import queued_time

    t_end = T0 + args.budget
    dev = backend.device_info()
    meta = environment()
    meta.update(script="scripts/batched_gpu.py", budget_s=args.budget, tol=args.tol,
                hopper_batched=repr(select.HOPPER_BATCHED),
                timing="one launch per call over all products, queued behind a sleep, "
                       "median of 5 loops, operands rotated past 3x L2 where they fit; "
                       "torch.bmm(out=) the same way in the same run")
    rows: list[dict] = []
    data = {"meta": meta, "rows": rows}
    stream = torch.cuda.current_stream().cuda_stream
    fw = framework("torch")
    free_cap = int(0.35 * torch.cuda.mem_get_info()[0])   # all the copies of a shape
    out_of_time = False
    for precision, layout in passes(args.precisions, args.layouts):
        dt = torch.bfloat16 if precision == "bf16" else torch.float16
        for nb, M, K in args.shapes:
            N = M
            if time.perf_counter() > t_end:
                out_of_time = True
                break
            one = 2 * nb * (M * K + K * N + M * N)
            sets = max(1, min(operand_sets(one, dev.l2_bytes), free_cap // one))
            g = torch.Generator(device="cuda").manual_seed(nb * 7 + M + K)
            As = [torch.rand((nb, M, K), generator=g, device="cuda").sub_(0.5).to(dt)
                  for _ in range(sets)]
            mem = [torch.rand((nb, K, N) if layout == "KN" else (nb, N, K), generator=g,
                              device="cuda").sub_(0.5).to(dt) for _ in range(sets)]
            Bs = [b if layout == "KN" else b.transpose(1, 2) for b in mem]
            Cs = [torch.empty((nb, M, N), device="cuda", dtype=dt) for _ in range(sets)]
            pick = sorted({0, nb // 2, nb - 1})
            ref = torch.bmm(As[0][pick].float(), Bs[0][pick].float())
            est = max(one / 2.5e12, 3e-6)                      # seconds per call, roughly
            per = max(10, min(400, int(4e-3 / est)))
            t_torch = statistics.median(queued_time(
                torch, [lambda i=i: torch.bmm(As[i], Bs[i], out=Cs[i]) for i in range(sets)],
                per, 5)) * 1e3
            base = dict(precision=precision, layout=layout, batch=nb, M=M, N=N, K=K,
                        torch_us=t_torch, sets=sets, calls_per_loop=per)
            for name, spec in candidates(precision, N, layout, args.only).items():
                if time.perf_counter() > t_end:
                    out_of_time = True
                    break
                row = dict(base, candidate=name, us=None, pct_torch=None, ok=False)
                try:
                    if spec == "auto":
                        fns = [lambda i=i: gemmlib.matmul(As[i], Bs[i]) for i in range(sets)]
                        row["kernel"] = select.select_batched(
                            precision, M, N, K, precision, layout).name
                        C = fns[0]()
                    else:
                        call = calls.prepare(spec, M, N, K, batch=nb)
                        row["kernel"] = spec.name
                        fns = [lambda i=i, call=call: calls.run(
                            call, As[i].data_ptr(), mem[i].data_ptr(), Cs[i].data_ptr(),
                            stream) for i in range(sets)]
                        C = Cs[0]
                        C.fill_(float("nan"))
                        fns[0]()
                    torch.cuda.synchronize()
                    finite = bool(torch.isfinite(C).all())
                    err = float((C[pick].float() - ref).norm() / ref.norm())
                    row.update(rel_err=err, ok=finite and err < args.tol)
                    if not row["ok"]:
                        row["error"] = f"wrong result: finite={finite} rel_err={err:.3g}"
                    else:
                        for f in fns:          # warm-up: every set's maps, kernels loaded
                            f()
                        us = statistics.median(queued_time(torch, fns, per, 5)) * 1e3
                        row.update(us=us, pct_torch=100 * t_torch / us)
                        if spec == "auto":   # the call as a caller sees it: host cost in
                            theirs = [lambda i=i: torch.bmm(As[i], Bs[i]) for i in range(sets)]
                            row["call_us"] = statistics.median(
                                loop_time(fw, fns, per, 5)) * 1e3
                            row["torch_call_us"] = statistics.median(
                                loop_time(fw, theirs, per, 5)) * 1e3
                    del C
                except Exception as e:   # noqa: BLE001 -- a candidate that fails is data
                    row["error"] = f"{type(e).__name__}: {e}"[:300]
                rows.append(row)
            # torch again after the candidates: how much the clocks moved meanwhile
            t_after = statistics.median(queued_time(
                torch, [lambda i=i: torch.bmm(As[i], Bs[i], out=Cs[i]) for i in range(sets)],
                per, 5)) * 1e3
            for r in rows:
                if all(r[k] == base[k] for k in ("precision", "layout", "batch", "M", "K")):
                    r["torch_us_after"] = t_after
            line = " ".join(f"{r['candidate']}={r['pct_torch']:.0f}" if r["pct_torch"]
                            else f"{r['candidate']}=ERR" for r in rows
                            if all(r[k] == base[k] for k in ("precision", "layout", "batch",
                                                             "M", "K")))
            line += "".join(f" (auto's call {100 * r['torch_call_us'] / r['call_us']:.0f})"
                            for r in rows[-1:] if "call_us" in r)
            log(f"{precision} {layout} {nb}x{M}x{N}x{K} torch={t_torch:.1f}/{t_after:.1f}us "
                f"sets={sets} % of torch: {line}")
            del As, mem, Bs, Cs, ref
            torch.cuda.empty_cache()
            Path(args.out).write_text(json.dumps(data, indent=1))
        if out_of_time:
            break
    if out_of_time:
        meta["stopped"] = "budget"
        log("budget spent: stopped")
    Path(args.out).write_text(json.dumps(data, indent=1))
    log("wrote", args.out, f"({len(rows)} rows)")
    summary(rows)


def summary(rows) -> None:
    """Per candidate: the geometric mean of pct_torch over the shapes it ran, and its
    worst; then the best candidate of each shape."""
    import math

    by = {}
    for r in rows:
        if r.get("pct_torch"):
            by.setdefault((r["precision"], r["layout"], r["candidate"]), []).append(r)
    for (prec, lay, name), rs in sorted(by.items()):
        gm = math.exp(sum(math.log(r["pct_torch"]) for r in rs) / len(rs))
        worst = min(rs, key=lambda r: r["pct_torch"])
        log(f"{prec} {lay} {name:9s} geomean {gm:5.1f}% of torch over {len(rs)}, worst "
            f"{worst['pct_torch']:.1f}% at {worst['batch']}x{worst['M']}x{worst['K']}")
    shapes = {}
    for r in rows:
        if r.get("pct_torch") and r["candidate"] != "auto":
            k = (r["precision"], r["layout"], r["batch"], r["M"], r["K"])
            if k not in shapes or r["pct_torch"] > shapes[k]["pct_torch"]:
                shapes[k] = r
    for k, r in shapes.items():
        log("best", *k, r["candidate"], f"{r['pct_torch']:.1f}%")
    bad = [r for r in rows if not r["ok"]]
    if bad:
        log(f"{len(bad)} rows failed:", *sorted({r['candidate'] for r in bad}))


# --------------------------------------------------------------------------- the simulator


def smoke_main(args) -> None:
    """Every candidate once on a tiny batch in the simulator, against float64."""
    import numpy as np

    import gemmlib
    from gemmlib.runtime import calls, select

    rows = []
    for precision, layout in passes(args.precisions, args.layouts):
        for nb, M, N, K in args.shapes:
            rng = np.random.default_rng(nb + M + N + K)
            a = rng.uniform(-1, 1, (nb, M, K)).astype(np.float32)
            b = rng.uniform(-1, 1, (nb, K, N)).astype(np.float32)
            if precision == "fp16":
                a16, b16 = a.astype(np.float16), b.astype(np.float16)
                abits, bbits = a16.view(np.uint16), b16.view(np.uint16)
                a64, b64 = a16.astype(np.float64), b16.astype(np.float64)
            else:
                abits, bbits = ((x.view(np.uint32) >> 16).astype(np.uint16) for x in (a, b))
                a64, b64 = ((x.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
                            for x in (abits, bbits))
            ref = np.matmul(a64, b64)
            bmem = bbits if layout == "KN" else np.ascontiguousarray(np.swapaxes(bbits, 1, 2))

            def values(bits):
                if precision == "fp16":
                    return bits.view(np.float16).astype(np.float64)
                return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)

            for name, spec in candidates(precision, N, layout, args.only).items():
                t = time.perf_counter()
                row = dict(precision=precision, layout=layout, batch=nb, M=M, N=N, K=K,
                           candidate=name, us=None, torch_us=None, pct_torch=None, ok=False)
                try:
                    if spec == "auto":   # torch CPU tensors (bfloat16 stacks too)
                        import torch

                        dt = torch.float16 if precision == "fp16" else torch.bfloat16
                        At, Bt = (torch.from_numpy(x.view(np.int16)).view(dt)
                                  for x in (abits, bmem))
                        C = gemmlib.matmul(At, Bt if layout == "KN" else Bt.transpose(1, 2))
                        got = values(C.view(torch.int16).numpy().view(np.uint16))
                        row["kernel"] = select.select_batched(precision, M, N, K, precision,
                                                              layout).name
                    else:
                        C = np.full((nb * M, N), 0xFFFF, np.uint16)   # NaN in both types
                        call = calls.prepare(spec, M, N, K, batch=nb)
                        calls.run_arrays(call, abits.reshape(nb * M, K),
                                         bmem.reshape(-1, bmem.shape[-1]), C)
                        got = values(C).reshape(nb, M, N)
                        row["kernel"] = spec.name
                    err = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
                    row.update(rel_err=err, ok=bool(np.isfinite(got).all()) and err < args.tol)
                except Exception as e:   # noqa: BLE001
                    row["error"] = f"{type(e).__name__}: {e}"[:300]
                rows.append(row)
                log(f"smoke {precision} {layout} {nb}x{M}x{N}x{K} {name:9s} "
                    f"{row.get('kernel', '?'):38s} ok={row['ok']} "
                    f"err={row.get('rel_err', float('nan')):.2e} "
                    f"({time.perf_counter() - t:.1f}s) {row.get('error', '')}")
    Path(args.out).write_text(json.dumps({"meta": {"smoke": True}, "rows": rows}, indent=1))
    bad = [r for r in rows if not r["ok"]]
    log("wrote", args.out, f"({len(rows)} rows, {len(bad)} failed)")
    if bad:
        sys.exit(1)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--budget", type=float, default=240.0, help="seconds (stops between "
                    "candidates; compiles count)")
    ap.add_argument("--precisions", default="fp16,bf16")
    ap.add_argument("--layouts", default="KN,NK")
    ap.add_argument("--only", default="", help="candidates to run (comma-separated names)")
    ap.add_argument("--shapes", default="", help="batch:M:K,... (N = M; default: SHAPES)")
    ap.add_argument("--tol", type=float, default=1e-2,
                    help="largest relative error against float32 (C rounded to 16 bits)")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes in the simulator")
    args = ap.parse_args(argv)
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1" if args.smoke else os.environ.get(
        "NUMBA_ENABLE_CUDASIM", "0")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    args.precisions = args.precisions.split(",")
    args.layouts = args.layouts.split(",")
    args.only = set(args.only.split(",")) - {""} or None
    if args.shapes:
        shapes = [tuple(int(v) for v in s.split(":")) for s in args.shapes.split(",")]
        args.shapes = ([(b, m, m, k) for b, m, k in shapes] if args.smoke else shapes)
    else:
        args.shapes = SMOKE_SHAPES if args.smoke else SHAPES
    (smoke_main if args.smoke else gpu_main)(args)


if __name__ == "__main__":
    main()
