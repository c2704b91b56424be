"""What runs on the GPU for one call of each layout: the kernels (and their mean time per
call) of ``gemmlib.matmul`` and ``torch.matmul`` on the same views, from torch.profiler.

    python scripts/layout_kernels.py --precision tf32 --layouts NN TN TT --shape 1024 6144 4096

A layout that runs slower than its row-major (NN) twin shows here whether the time went
to a copy or a pre-pass, or to the product's kernel itself.  Prints a table; with
``--json F`` also writes the rows.
"""

from __future__ import annotations

import argparse
import json


def kernels(torch, fn, calls: int) -> list[tuple[str, float]]:
    """(kernel name, mean device microseconds per call) of ``fn``'s launches."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    out = []
    for e in prof.key_averages():
        dev = getattr(e, "device_time_total", None)
        if dev is None:
            dev = e.cuda_time_total
        if dev > 0 and e.count >= calls:
            out.append((e.key, dev / calls))
    return sorted(out, key=lambda x: -x[1])


def main(argv=None) -> int:
    import torch

    import gemmlib
    from gemmlib.bench_layouts import operands

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--precision", default="tf32", choices=("fp16", "bf16", "tf32", "fp32"))
    ap.add_argument("--layouts", nargs="*", default=["NN", "NT", "TN", "TT"])
    ap.add_argument("--shape", nargs=3, type=int, action="append",
                    help="M N K (repeat the option for several)")
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    shapes = args.shape or [[1024, 6144, 4096], [4096, 4096, 4096]]
    torch.backends.cuda.matmul.allow_tf32 = args.precision == "tf32"
    prec = "tf32" if args.precision == "tf32" else None
    rows = []
    for M, N, K in shapes:
        for layout in args.layouts:
            A, B = operands(torch, layout, args.precision, M, N, K, 0)
            for who, fn in (("gemmlib", lambda A=A, B=B: gemmlib.matmul(A, B, precision=prec)),
                            ("torch", lambda A=A, B=B: torch.matmul(A, B))):
                ks = kernels(torch, fn, args.calls)
                total = sum(t for _, t in ks)
                print(f"{args.precision} {layout} {M}x{N}x{K} {who:<8} {total:9.1f} us")
                for name, t in ks:
                    print(f"    {t:9.1f} us  {name[:110]}")
                rows.append(dict(precision=args.precision, layout=layout, M=M, N=N, K=K,
                                 who=who, total_us=total, kernels=ks))
            del A, B
            torch.cuda.empty_cache()
    torch.backends.cuda.matmul.allow_tf32 = False
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
