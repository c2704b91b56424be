"""wgmma_swap's block count on the widest layers at 1-64 tokens, as device time.

On an H200 the serving suite's widest layers (gate_up projections of 14336-37888 outputs)
ran at 83-87% of ``torch.matmul`` at 16-64 tokens with ``plan_for``'s 112 blocks: the
counts that share the tiles evenly (4 tiles each of 448), on 112 of 132 SMs.  This times,
for each such layer and token count, the plan's own launch and the same build with other
block counts -- 128 (3.5 tiles each: cuts at half tiles, which the stream-K walk already
runs), one per SM (132), and the even counts -- each loop of calls captured in a CUDA graph
and replayed (device time only, as ``band_rule_ab.py``), beside ``torch.matmul``.

    python scripts/swap_wide_grid.py --out wide-grid.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from band_rule_ab import graph_rounds, linear_operands  # noqa: E402

LAYERS = [(28672, 4096), (28672, 3584), (37888, 3584), (16384, 3072), (11264, 2048),
          (9216, 3072), (14336, 4096)]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, nargs="*", default=[1, 16, 64])
    ap.add_argument("--precision", default="bf16", choices=["bf16", "fp16"])
    ap.add_argument("--out")
    args = ap.parse_args(argv)

    import torch

    import gemmlib
    from gemmlib import backend
    from gemmlib.bench_serving import warm_gpu
    from gemmlib.kernels import wgmma_swap as swap
    from gemmlib.runtime import select

    dt = {"fp16": torch.float16, "bf16": torch.bfloat16}[args.precision]
    sms = backend.device_info().sm_count
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    g = torch.Generator(device="cuda").manual_seed(0)
    warm_gpu(torch, 1.0)
    rows = []
    for N, K in LAYERS:
        for M in args.tokens:
            BM, planned = swap.plan_for(M, N, K)
            BN = swap.width_for(M)
            tiles = -(-N // BM) * -(-M // BN)
            grids = sorted({planned, sms, 128, *swap.even_counts(tiles, K, sms)} - {0},
                           reverse=True)[:6]
            ops, ref = linear_operands(torch, M, N, K, dt, g, l2)
            calls = {"torch": [lambda o=o: torch.matmul(o[0], o[1].t(), out=o[2]) for o in ops]}
            for grid in grids:
                spec = select.build("wgmma_swap", {"precision": args.precision, "BM": BM,
                                                   "BN": BN, "GRID": grid, "B_LAYOUT": "KN",
                                                   "KT": select.HOPPER_SWAP_KT})
                spec = select.select_out(select.with_layout(spec, "NK"), args.precision,
                                         M, N, K)
                C = torch.full((M, N), float("nan"), device="cuda", dtype=dt)
                gemmlib.matmul(ops[0][0], ops[0][1].t(), kernel=spec, out=C)
                err = float((C.float() - ref).norm() / ref.norm())
                assert err < 2e-2, (M, N, K, grid, err)
                calls[grid] = [lambda o=o, s=spec: gemmlib.matmul(o[0], o[1].t(), kernel=s,
                                                                   out=o[2]) for o in ops]
            times = graph_rounds(torch, calls)
            t = times.pop("torch")
            row = dict(M=M, N=N, K=K, BM=BM, planned=planned, precision=args.precision,
                       gpu=torch.cuda.get_device_name(), torch_us=statistics.median(t) * 1e3,
                       grids={str(gr): dict(us=statistics.median(ts) * 1e3,
                                            pct=statistics.median(100 * a / b
                                                                  for a, b in zip(t, ts)))
                              for gr, ts in times.items()})
            rows.append(row)
            print(f"{M:3d} {N:6d} {K:5d} BM {BM} planned {planned:3d}  torch "
                  f"{row['torch_us']:6.1f} us  " + "  ".join(
                      f"{gr}: {v['pct']:5.1f}%" for gr, v in row["grids"].items()), flush=True)
            del ops, calls
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"meta": {"what": __doc__.splitlines()[0]}, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
