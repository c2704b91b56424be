"""Early launch (programmatic dependent launch) on and off, in the same rounds.

For each (tokens, outputs, K) a loop of ``gemmlib.linear``-layout calls
(``matmul(x, W.t(), out=C)``, operands rotated past L2) runs with the runtime's
``EARLY_LAUNCH`` on and off, beside ``torch.matmul`` on the same data, round by round
(``bench_serving.time_rounds``).  Prints and writes (``--out``) per shape: each side's
median time and % of torch (median of the rounds' ratios), and early over late.

    python scripts/early_launch_ab.py --out results/.../early-launch.json
"""

from __future__ import annotations

import argparse
import json
import statistics

SHAPES = [  # (outputs N, K): Llama-3.1-8B's projections and a few held-out layers
    (6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336),
    (2816, 2048), (3072, 3072), (3584, 4096), (9216, 3072)]
TOKENS = (1, 16, 64, 128, 256, 512, 2048)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, nargs="*", default=TOKENS)
    ap.add_argument("--precision", default="bf16", choices=["bf16", "fp16"])
    ap.add_argument("--out")
    args = ap.parse_args(argv)

    import torch

    import gemmlib
    from gemmlib.bench_models import framework, operand_sets
    from gemmlib.bench_serving import time_rounds, warm_gpu

    from gemmlib.runtime import launch
    fw = framework("torch")
    dt = {"fp16": torch.float16, "bf16": torch.bfloat16}[args.precision]
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    g = torch.Generator(device="cuda").manual_seed(0)
    warm_gpu(torch, 1.0)
    rows = []

    def setting(on):
        def call(x, w, c):
            launch.EARLY_LAUNCH = on
            gemmlib.matmul(x, w.t(), out=c)
        return call

    early, late = setting(True), setting(False)
    for N, K in SHAPES:
        for M in args.tokens:
            sets = operand_sets(2 * (M * K + N * K + M * N), l2)
            def rand(*dims):
                return (torch.rand(dims, device="cuda", generator=g) * 2 - 1).to(dt)

            xs = [rand(M, K) for _ in range(sets)]
            Ws = [rand(N, K) for _ in range(sets)]
            Cs = [torch.empty(M, N, device="cuda", dtype=dt) for _ in range(sets)]
            ref = xs[0].float() @ Ws[0].float().t()
            for f in (early, late):
                C = torch.full((M, N), float("nan"), device="cuda", dtype=dt)
                f(xs[0], Ws[0], C)
                err = float((C.float() - ref).norm() / ref.norm())
                assert err < 2e-2, (M, N, K, err)
            ops = list(zip(xs, Ws, Cs))
            calls = {"torch": [lambda o=o: torch.matmul(o[0], o[1].t(), out=o[2]) for o in ops],
                     "early": [lambda o=o: early(*o) for o in ops],
                     "late": [lambda o=o: late(*o) for o in ops]}
            times, per = time_rounds(fw, calls, target_ms=3.0, loops=7)
            t, te, tl = times["torch"], times["early"], times["late"]

            def ratio(num, den):   # the median of the rounds' ratios
                return statistics.median(a / b for a, b in zip(num, den))

            row = dict(M=M, N=N, K=K, precision=args.precision,
                       gpu=torch.cuda.get_device_name(), calls_per_loop=per,
                       torch_us=statistics.median(t) * 1e3,
                       early_us=statistics.median(te) * 1e3, late_us=statistics.median(tl) * 1e3,
                       early_pct_torch=100 * ratio(t, te), late_pct_torch=100 * ratio(t, tl),
                       early_over_late=ratio(tl, te))
            rows.append(row)
            print(f"{M:5d} {N:6d} {K:6d}  torch {row['torch_us']:7.1f} us  "
                  f"early {row['early_us']:7.1f} ({row['early_pct_torch']:5.1f}%)  "
                  f"late {row['late_us']:7.1f} ({row['late_pct_torch']:5.1f}%)  "
                  f"speedup {row['early_over_late']:.3f}", flush=True)
            del xs, Ws, Cs, ops, calls
    launch.EARLY_LAUNCH = True
    for M in args.tokens:
        sel = [r for r in rows if r["M"] == M]
        gm = lambda k: statistics.geometric_mean(r[k] for r in sel)  # noqa: E731
        print(f"M={M}: early {gm('early_pct_torch'):.1f}% "
              f"late {gm('late_pct_torch'):.1f}% of torch")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"meta": {"what": __doc__.splitlines()[0]}, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
