"""Swap-AB tiles against the other small-M candidates on Hopper (the data behind
``select_hopper``'s rule for M <= HOPPER_SWAP_MMAX).

    python scripts/swap_gpu.py OUT.json [--precisions bf16] [--ms 1,4,8,16,32,64,128]

For the projections of three model families the tuned-for models are not (Mistral-7B,
Qwen2.5-7B, Llama-3.2-3B; ``nn.Linear`` weights, the call ``x @ W.t()`` with a C in the
inputs' type), times each candidate's kernels -- CUDA events around a loop of launches
queued behind a sleeping kernel (``tc_shapes_gpu.queued_time``), operands rotated past
3x L2 -- against ``torch.matmul`` timed the same way in the same run:

* ``split64``: ``wgmma_split_k`` with 64-row tiles (the choice before swap-AB);
* ``skinny``: the decode rung (M = 1);
* ``swap64`` / ``swap128``: ``wgmma_swap`` with 64 / 128 weight rows per tile (stream-K
  over one block per SM);
* ``auto_kt128``: ``auto``'s swap build with stages two k-tiles deep (``KT=128``);
* ``auto``: what ``gemmlib.matmul`` runs now.

Every candidate's result is checked against torch's float32 product before it is timed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tc_shapes_gpu import log, queued_time  # noqa: E402

#: (model, projection, N, K) from the models' config.json
SHAPES = [("mistral-7b", "qkv", 6144, 4096), ("mistral-7b", "o", 4096, 4096),
          ("mistral-7b", "gate_up", 28672, 4096), ("mistral-7b", "down", 4096, 14336),
          ("qwen2.5-7b", "qkv", 4608, 3584), ("qwen2.5-7b", "o", 3584, 3584),
          ("qwen2.5-7b", "gate_up", 37888, 3584), ("qwen2.5-7b", "down", 3584, 18944),
          ("llama-3.2-3b", "qkv", 5120, 3072), ("llama-3.2-3b", "o", 3072, 3072),
          ("llama-3.2-3b", "gate_up", 16384, 3072), ("llama-3.2-3b", "down", 3072, 8192)]


#: the tiles tried above HOPPER_SWAP_MMAX tokens (``--set mid``): wgmma_split_k builds
MID = {"sk128x128s4": dict(BM=128, BN=128, STAGES=4), "sk128x256s4": dict(BM=128, BN=256, STAGES=4),
       "sk64x128s8": dict(BM=64, BN=128, STAGES=8)}

#: ... and swap-AB builds with 128 or 256 tokens per tile: (BM, BN, KT)
MID_SWAP = [(128, 128, 128), (64, 128, 128), (128, 256, 64), (64, 256, 64)]


def mid_candidates(precision: str, M: int, N: int, K: int) -> dict:
    from gemmlib.kernels.wgmma_swap import even_grid
    from gemmlib.runtime import select as S

    c = {name: S.with_layout(S.select_out(S.build("wgmma_split_k", dict(p, precision=precision)),
                                          precision, M, N, K), "NK")
         for name, p in MID.items() if not (p["BM"] == 64 and M > 128)}
    for BM, BN, KT in MID_SWAP:
        if BN > 2 * M:
            continue
        for grid in (even_grid(M, N, K, BM, BN), 0):
            if grid == 0 and (BM, BN) != (128, 128):
                continue
            c[f"swap{BM}x{BN}kt{KT}g{grid}"] = S.build("wgmma_swap", dict(
                precision=precision, BM=BM, BN=BN, KT=KT, OUT=precision, B_LAYOUT="NK",
                GRID=grid))
    c["auto"] = "auto"
    return c


def candidates(precision: str, M: int, N: int, K: int) -> dict:
    from gemmlib.runtime import select as S

    out = precision

    def nk(spec):
        return S.with_layout(S.select_out(spec, out, M, N, K), "NK")

    c = {"split64": nk(S.build("wgmma_split_k", {"precision": precision, "BM": 64}))}
    if M == 1:
        c["skinny"] = S.with_layout(S.with_out(S.select_skinny(precision, M, N, K), out), "NK")
    from gemmlib.kernels.wgmma_swap import width_for

    w = width_for(M)
    for bm in (64, 128):
        c[f"swap{bm}"] = nk(S.build("wgmma_swap", {"precision": precision, "BM": bm, "BN": w,
                                                   "B_LAYOUT": "KN"}))
    auto = S.select_swap(precision, M, N, K) if M <= S.HOPPER_SWAP_MMAX else None
    if auto is not None:
        params = {k: v for k, v in auto.params.items() if k != "BK"}
        c["auto_kt128"] = nk(S.build("wgmma_swap", dict(params, KT=128, STAGES=0)))
    c["auto"] = "auto"
    return {k: v for k, v in c.items() if v is not None}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--precisions", default="bf16")
    ap.add_argument("--ms", default="1,4,8,16,32,64,128")
    ap.add_argument("--shapes", type=int, default=len(SHAPES))
    ap.add_argument("--set", choices=("small", "mid"), default="small",
                    help="mid: wgmma_split_k tiles for M above the swap-AB range, narrow layers")
    ap.add_argument("--budget", type=float, default=0, help="stop after this many seconds")
    args = ap.parse_args()
    import time

    t_end = time.perf_counter() + (args.budget or 1e9)
    pick = mid_candidates if args.set == "mid" else candidates
    shapes = SHAPES[:args.shapes] if args.set == "small" else [s for s in SHAPES if s[2] <= 6144]
    import torch

    import gemmlib
    from gemmlib import backend

    dev = backend.device_info()
    rows = []
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    for precision in args.precisions.split(","):
        dt = torch.bfloat16 if precision == "bf16" else torch.float16
        for model, proj, N, K in shapes:
            for M in (int(m) for m in args.ms.split(",")):
                if time.perf_counter() > t_end:
                    break
                nbytes = 2 * (M * K + N * K + M * N)
                sets = max(2, min(16, -(-3 * l2 // nbytes)))
                g = torch.Generator(device="cuda").manual_seed(M * 7 + N)
                xs = [torch.randn(M, K, device="cuda", dtype=dt, generator=g) for _ in range(sets)]
                ws = [torch.randn(N, K, device="cuda", dtype=dt, generator=g) / K ** 0.5
                      for _ in range(sets)]
                cs = [torch.empty(M, N, device="cuda", dtype=dt) for _ in range(sets)]
                ref = (xs[0].float() @ ws[0].float().t())
                per = max(20, min(400, int(4e-3 / max(nbytes / 2.5e12, 2e-6))))
                t_torch = statistics.median(queued_time(
                    torch, [lambda i=i: torch.matmul(xs[i], ws[i].t(), out=cs[i])
                            for i in range(sets)], per, 5)) * 1e3
                for name, spec in pick(precision, M, N, K).items():
                    row = dict(model=model, proj=proj, M=M, N=N, K=K, precision=precision,
                               candidate=name, torch_us=t_torch)
                    try:
                        C = torch.full((M, N), float("nan"), device="cuda", dtype=dt)
                        gemmlib.matmul(xs[0], ws[0].t(), kernel=spec, out=C)
                        err = ((C.float() - ref).norm() / ref.norm()).item()
                        row["rel_err"] = err
                        row["kernel"] = (spec if isinstance(spec, str) else spec.name)
                        if not err < 2e-2:
                            row["error"] = f"wrong result: {err}"
                            log("WRONG", row)
                            rows.append(row)
                            continue
                        us = statistics.median(queued_time(
                            torch, [lambda i=i: gemmlib.matmul(xs[i], ws[i].t(), kernel=spec,
                                                               out=cs[i])
                                    for i in range(sets)], per, 5)) * 1e3
                        row.update(median_us=us, pct_of_torch=100 * t_torch / us)
                    except Exception as e:   # noqa: BLE001 -- a candidate that fails is data
                        row["error"] = f"{type(e).__name__}: {e}"[:300]
                    rows.append(row)
                best = min((r for r in rows[-16:] if "median_us" in r and r["M"] == M
                            and r["N"] == N and r["K"] == K and r["precision"] == precision),
                           key=lambda r: r["median_us"], default=None)
                line = " ".join(f"{r['candidate']}={r.get('pct_of_torch', float('nan')):.0f}"
                                for r in rows if (r["M"], r["N"], r["K"], r["precision"])
                                == (M, N, K, precision))
                log(f"{precision} {model}.{proj} M={M} N={N} K={K} torch={t_torch:.1f}us "
                    f"{line} best={best and best['candidate']}")
                del xs, ws, cs
                Path(args.out).write_text(json.dumps({"rows": rows}, indent=1))
    meta = dict(gpu=dev.name, torch=torch.__version__, timing="kernel loops queued "
                "behind a sleep, median of 5, operands rotated past 3x L2")
    Path(args.out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    log("wrote", args.out)


if __name__ == "__main__":
    main()
