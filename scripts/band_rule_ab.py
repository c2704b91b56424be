"""auto's choice at prefill-chunk sizes against the whole-wave tile alone, on layers it was
not tuned on.

For each projection of the serving suite's models (``bench_serving.MODELS``: held apart
from the tuner's ``tune_hopper.TRAINING``) and each token count, a loop of
``matmul(x, W.t(), out=C)`` calls with ``kernel="auto"`` and with the tuner's candidates
"split128xfit" (tiles of 128 tokens by the outputs that fill whole waves) and "rule",
beside ``torch.matmul`` on the same data.  Each implementation's loop of calls is
captured once in a CUDA graph and replayed, the graphs in turn, round by round: device
time only, so the choice of kernel is compared without the host path (whose cost the
serving suite's eager loops include).

    python scripts/band_rule_ab.py --tokens 96 128 256 384 512 --out band.json
"""

from __future__ import annotations

import argparse
import json
import statistics


def graph_rounds(torch, calls: dict, per_loop: int = 20, rounds: int = 7) -> dict:
    """Milliseconds per call of each implementation ({name: [per round]}): its calls
    (cycling through the operand sets) captured ``per_loop`` times in one CUDA graph, the
    graphs replayed in turn, ``rounds`` times."""
    graphs = {}
    side = torch.cuda.Stream()
    for name, cs in calls.items():
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):   # warm-up outside the capture
            for c in cs:
                c()
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for i in range(per_loop):
                cs[i % len(cs)]()
        graphs[name] = g
    out = {name: [] for name in calls}
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for name, g in graphs.items():
        g.replay()
    for _ in range(rounds):
        for name, g in graphs.items():
            start.record()
            g.replay()
            end.record()
            end.synchronize()
            out[name].append(start.elapsed_time(end) / per_loop)
    return out


def linear_operands(torch, M: int, N: int, K: int, dt, g, l2: int):
    """Operand sets (x (M, K), W (N, K) as ``nn.Linear`` holds it, C (M, N)) enough to rotate
    past an L2 of ``l2`` bytes, uniform in [-1, 1), and the float32 x @ W.t() of the first."""
    from gemmlib.bench_models import operand_sets

    def rand(*dims):
        return (torch.rand(dims, device="cuda", generator=g) * 2 - 1).to(dt)

    sets = operand_sets(2 * (M * K + N * K + M * N), l2)
    ops = [(rand(M, K), rand(N, K), torch.empty(M, N, device="cuda", dtype=dt))
           for _ in range(sets)]
    return ops, ops[0][0].float() @ ops[0][1].float().t()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, nargs="*", default=[128, 256, 512])
    ap.add_argument("--precision", default="bf16", choices=["bf16", "fp16"])
    ap.add_argument("--candidates", nargs="*", default=["split128xfit", "rule"])
    ap.add_argument("--out")
    args = ap.parse_args(argv)

    import torch

    import gemmlib
    from gemmlib import tune_hopper
    from gemmlib.bench_serving import MODELS, projections_of, warm_gpu

    dt = {"fp16": torch.float16, "bf16": torch.bfloat16}[args.precision]
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    g = torch.Generator(device="cuda").manual_seed(0)
    shapes = {}
    for m, cfg in MODELS.items():
        for proj, N, K in projections_of(cfg):
            shapes.setdefault((N, K), f"{m} {proj}")
    warm_gpu(torch, 1.0)
    rows = []
    for (N, K), use in shapes.items():
        for M in args.tokens:
            ops, ref = linear_operands(torch, M, N, K, dt, g, l2)
            specs = {"auto": "auto"}
            for c in args.candidates:
                s = tune_hopper.spec_of(c, args.precision, M, N, K)
                if s is not None:
                    specs[c] = s
            calls = {"torch": [lambda o=o: torch.matmul(o[0], o[1].t(), out=o[2]) for o in ops]}
            names = {}
            for c, s in specs.items():
                C = torch.full((M, N), float("nan"), device="cuda", dtype=dt)
                gemmlib.matmul(ops[0][0], ops[0][1].t(), kernel=s, out=C)
                err = float((C.float() - ref).norm() / ref.norm())
                assert err < 2e-2, (c, M, N, K, err)
                names[c] = getattr(s, "name", s)
                calls[c] = [lambda o=o, s=s: gemmlib.matmul(o[0], o[1].t(), kernel=s, out=o[2])
                            for o in ops]
            times = graph_rounds(torch, calls)
            t = times.pop("torch")
            row = dict(use=use, M=M, N=N, K=K, precision=args.precision,
                       gpu=torch.cuda.get_device_name(), torch_us=statistics.median(t) * 1e3)
            for c, ts in times.items():
                row[c + "_us"] = statistics.median(ts) * 1e3
                row[c + "_pct"] = statistics.median(100 * a / b for a, b in zip(t, ts))
                row[c + "_kernel"] = names[c]
            rows.append(row)
            print(f"{M:5d} {N:6d} {K:6d} torch {row['torch_us']:7.1f} us  " + "  ".join(
                f"{c} {row[c + '_pct']:5.1f}%" for c in times), flush=True)
            del ops, calls
    for M in args.tokens:
        sel = [r for r in rows if r["M"] == M]
        print(f"M={M}: " + "  ".join(
            f"{c} {statistics.geometric_mean(r[c + '_pct'] for r in sel if c + '_pct' in r):.1f}%"
            for c in ["auto"] + args.candidates))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"meta": {"what": __doc__.splitlines()[0]}, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
