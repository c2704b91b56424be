"""``python -m gemmlib list | verify | bench``.

Figures from result files are the course's job: ``python -m gemmcourse plot``.
"""

from __future__ import annotations

import argparse
import sys

EPILOG = """
examples:
  python -m gemmlib list
  python -m gemmlib verify                         # every kernel, odd shapes
  python -m gemmlib verify shared --shape 4095x3073x2047
  python -m gemmlib bench --kernels shared coalesced --shape 4096
  python -m gemmlib bench --out results            # full sweep, written as JSON + CSV
  python -m gemmlib bench --suite models --out results   # model projections, torch inputs
  python -m gemmlib bench --suite e2e --out results      # a Llama model, patched vs torch
  python -m gemmlib bench --suite serving --out results  # x @ W.T of 7 models vs torch, Triton

Figures from result files: python -m gemmcourse plot results/bench-*.json --out figures

Without a GPU set NUMBA_ENABLE_CUDASIM=1 to run kernels in numba's simulator
(slow: keep shapes small; timings there mean nothing).
"""


def parse_shape(text: str) -> tuple[int, int, int]:
    """'4096' -> (4096, 4096, 4096); '4095x3073x2047' -> (M, N, K)."""
    parts = [int(p) for p in text.lower().replace("*", "x").split("x")]
    if len(parts) == 1:
        parts *= 3
    if len(parts) != 3 or min(parts) < 0:
        raise argparse.ArgumentTypeError(f"shape must be N or MxNxK, got {text!r}")
    return tuple(parts)


def default_verify_shapes(spec, simulator: bool):
    """Odd shapes that exercise every edge: 1, primes, tile +/- 1, K below one k-tile."""
    tm, tn = spec.tile
    if simulator:
        return [(1, 1, 1), (37, 29, 53), (tm + 1, tn - 1, 3), (2, 3, 1)]
    return [(1, 1, 1), (37, 29, 53), (tm + 1, tn - 1, 7), (tm - 1, tn + 1, 1),
            (1000, 1000, 1000), (4095, 3073, 2047), (127, 8191, 33), (4097, 65, 1025)]


def cmd_list(args) -> int:
    from gemmlib import backend
    from gemmlib.kernels import all_specs

    dev = backend.device_info() if (backend.SIMULATOR or backend.gpu_present()) else None
    for s in all_specs():
        runs = ""
        if dev is not None and tuple(dev.compute_capability) < tuple(s.min_cc):
            runs = f"  [needs sm_{s.min_cc[0]}{s.min_cc[1]}+]"
        params = ", ".join(f"{k}={v}" for k, v in s.params.items())
        print(f"{s.name:>14}  {s.chapter:<22} {params:<30} {s.idea}{runs}")
    return 0


def cmd_verify(args) -> int:
    from gemmlib import backend
    from gemmlib.kernels import LADDER, get
    from gemmlib.verify import verify

    failures = 0
    for name in args.kernels or LADDER:
        spec = get(name)
        if not backend.SIMULATOR:
            dev = backend.device_info()
            if tuple(dev.compute_capability) < tuple(spec.min_cc):
                print(f"{name}: skipped (needs sm_{spec.min_cc[0]}{spec.min_cc[1]}+)")
                continue
        shapes = args.shape or default_verify_shapes(spec, backend.SIMULATOR)
        report = verify(spec, shapes, raise_on_failure=False)
        print(report, flush=True)
        failures += len(report.failures)
    where = "simulator" if backend.SIMULATOR else backend.device_info().name
    print(f"verify ({where}): {'all ok' if not failures else f'{failures} FAILED'}")
    return 1 if failures else 0


def cmd_models(args) -> int:
    from gemmlib import backend, bench_models as bm

    if backend.SIMULATOR:
        shapes = bm.suite_shapes(args.models or tuple(bm.MODELS), args.tokens or bm.TOKENS)
        print(f"the models suite times GPU calls; its {len(shapes)} shapes:")
        for s in shapes:
            print(f"  {s.model:<14}{s.layer:<8}T={s.tokens:<6}{s.M}x{s.N}x{s.K}")
        return 0
    data = bm.run_suite(precisions=args.precisions or bm.PRECISIONS,
                        inputs=args.inputs or ("torch",), models=args.models or tuple(bm.MODELS),
                        tokens=args.tokens or bm.TOKENS, progress=not args.quiet)
    data["host_costs"] = bm.framework_host_costs()
    for line in bm.summary(data):
        print(line)
    for r in data["host_costs"]:
        ratio = r.get("torch_ratio", r.get("cupy_ratio"))
        print(f"  host {r['case']:<12} gemmlib {r['gemmlib_us']:6.1f} us, {r['reference']} "
              f"{r['reference_us']:6.1f} us: {ratio:.2f}x")
    if args.out:
        print(f"wrote {bm.save(data, args.out)}")
    return 1 if any("error" in r for r in data["rows"]) else 0


def cmd_layouts(args) -> int:
    from gemmlib import backend
    from gemmlib import bench_layouts as bl

    if backend.SIMULATOR:
        print(f"the layouts suite times GPU calls; its {len(bl.shapes())} shapes x "
              f"{len(bl.LAYOUTS)} layouts x {len(bl.PRECISIONS)} precisions, and "
              f"{len(bl.BATCHED)} batched products, need a GPU")
        return 0
    kw = {}
    if args.precisions:
        kw["precisions"] = tuple(args.precisions)
    if args.tokens:
        kw["tokens"] = tuple(args.tokens)
    if args.layouts:
        kw["layouts"] = tuple(args.layouts)
    if args.squares is not None:
        kw["squares"] = tuple(args.squares)
    if args.linear_tokens is not None:
        kw["linear_tokens"] = tuple(args.linear_tokens)
    if args.out:   # what is measured so far, kept if the run is cut short
        kw["on_row"] = lambda data: bl.save(data, args.out)
    data = bl.run_suite(**kw)
    for line in bl.summary(data):
        print(line)
    if args.out:
        print(f"wrote {bl.save(data, args.out)}")
    return 1 if any("error" in r for r in data["rows"]) else 0


def cmd_bench(args) -> int:
    from gemmlib.bench import benchmark

    if args.suite == "models":
        return cmd_models(args)
    if args.suite == "layouts":
        return cmd_layouts(args)
    if args.suite == "e2e":
        from gemmlib import bench_e2e

        return bench_e2e.cli(args)
    if args.suite == "serving":
        from gemmlib import bench_serving

        return bench_serving.cli(args)
    if args.host_cost:
        from gemmlib import backend
        from gemmlib.bench import first_call, host_costs, save_host_costs

        if backend.SIMULATOR:
            print("host costs need a GPU: the simulator's timings mean nothing")
            return 0
        from gemmlib.bench_models import framework_host_costs

        data = host_costs()
        data["frameworks"] = framework_host_costs()  # torch_ratio / cupy_ratio per case
        data["first_call"] = first_call()
        for r in data["rows"]:
            print(f"  {r['name']:32} {r['host_us']:8.1f} us  {r['what']}")
        for r in data["steps"]:
            print(f"    step {r['step']:24} {r['host_us']:8.1f} us")
        for r in data["frameworks"]:
            ratio = r.get("torch_ratio", r.get("cupy_ratio"))
            print(f"  {r['case']:<12} gemmlib.matmul {r['gemmlib_us']:6.1f} us, "
                  f"{r['reference']} {r['reference_us']:6.1f} us: {ratio:.2f}x")
        print(f"  first call: {data['first_call']}")
        if args.out:
            print(f"wrote {save_host_costs(data, args.out)}")
        return 0
    result = benchmark(args.kernels or None, args.shape or None, reps=args.reps,
                       warmup=args.warmup, budget_s=args.budget, flush_l2=not args.no_flush,
                       progress=not args.quiet, timing=args.timing)
    print(result.table())
    if args.out and not result.meta.get("simulated"):
        stem = args.stem or (None if args.timing == "kernel" else  # files with call rows
                             f"bench-{result.meta['gpu_slug']}-{result.meta['date'][:10]}-call")
        pj, pc = result.save(args.out, stem)
        print(f"wrote {pj} and {pc}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m gemmlib", epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                description="GEMM kernels in Python: list, verify, benchmark.")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("list", help="the registered kernels, in course order")
    s.set_defaults(func=cmd_list)

    s = sub.add_parser("verify", help="check kernels against a float64 reference",
                       description="Fresh random inputs, NaN-poisoned output, relative error "
                       "against float64. Exit status 1 if any check fails.")
    s.add_argument("kernels", nargs="*", help="kernel names (default: all)")
    s.add_argument("--shape", type=parse_shape, action="append",
                   help="N or MxNxK; repeatable (default: odd shapes per kernel)")
    s.set_defaults(func=cmd_verify)

    s = sub.add_parser("bench", help="time kernels against cuBLAS",
                       description="CUDA events, warm-up, L2 flushed before every run, median of "
                       "--reps runs (>= 10), cuBLAS (TF32 off) in the same run.")
    s.add_argument("--kernels", nargs="*", help="kernel names (default: all)")
    s.add_argument("--shape", type=parse_shape, action="append",
                   help="N or MxNxK; repeatable (default: squares 128..8192 and odd shapes)")
    s.add_argument("--reps", type=int, default=30, help="timed runs per point (default 30)")
    s.add_argument("--warmup", type=int, default=3, help="untimed runs first (default 3)")
    s.add_argument("--budget", type=float, default=20.0,
                   help="max timed seconds per point; slow kernels get fewer runs, >= 10")
    s.add_argument("--no-flush", action="store_true", help="do not flush L2 between runs")
    s.add_argument("--out", help="directory for the JSON and CSV result files")
    s.add_argument("--stem", help="file name stem (default bench-<gpu>-<date>)")
    s.add_argument("--quiet", action="store_true", help="no progress bar")
    s.add_argument("--timing", choices=("kernel", "call", "both"), default="kernel",
                   help="kernel: events around the launch alone (default); call: around "
                   "gemmlib.matmul(A, B, out=C) as users call it, with host us per call "
                   "(file stem gets -call); both")
    s.add_argument("--suite", choices=("sweep", "models", "layouts", "e2e", "serving"),
                   default="sweep",
                   help="sweep: the ladder over squares and odd shapes (default); models: the "
                   "projections of Llama 3.1 8B and Qwen2.5 72B at 1..16384 tokens, timed as a "
                   "loop of calls against torch.matmul/cupy.matmul -> models-<gpu>-<date>.json; "
                   "layouts: NN/NT/TN/TT views and batched products against torch "
                   "-> layouts-<gpu>-<date>.json; e2e: transformers' LlamaForCausalLM at "
                   "Llama 3.1 8B sizes, gemmlib.patch against torch: prefill, decode, a "
                   "training step -> e2e-<gpu>-<date>.json; serving: x @ W.T (nn.Linear's "
                   "weight) for the projections of 7 public models at 1..4096 tokens, "
                   "gemmlib.matmul against torch.matmul and a Triton GEMM -> "
                   "serving-<gpu>-<date>.json")
    s.add_argument("--precisions", nargs="*",
                   help="models suite: fp16 bf16 3xtf32 (default); serving: fp16 bf16 (default)")
    s.add_argument("--inputs", nargs="*", choices=("torch", "cupy"),
                   help="models suite: torch (default) and/or cupy operands")
    s.add_argument("--models", nargs="*",
                   help="models suite: llama-3.1-8b qwen2.5-72b; serving suite: mistral-7b-v0.3 "
                   "qwen2.5-7b gemma-2-9b llama-3.2-3b phi-3-mini mixtral-8x7b "
                   "qwen1.5-moe-a2.7b (default: all)")
    s.add_argument("--layouts", nargs="*", choices=("NN", "NT", "TN", "TT"),
                   help="layouts suite: the layouts (default all four)")
    s.add_argument("--squares", nargs="*", type=int,
                   help="layouts suite: square sizes (default 4096 8192)")
    s.add_argument("--linear-tokens", nargs="*", type=int,
                   help="layouts suite: token counts timed in NN and NT only (default 1 16 128)")
    s.add_argument("--tokens", nargs="*", type=int,
                   help="models and serving suites: token counts (M); e2e: prefill lengths "
                   "(512 2048)")
    s.add_argument("--phases", nargs="*", choices=("prefill", "decode", "train"),
                   help="e2e suite: the phases (default all three)")
    s.add_argument("--batches", nargs="*", type=int, help="e2e suite: decode batches (1 16 64)")
    s.add_argument("--layers", type=int, help="e2e suite: decoder layers (default 4)")
    s.add_argument("--dtype", choices=("bf16", "fp16"), help="e2e suite: weights (bf16)")
    s.add_argument("--new-tokens", type=int, help="e2e suite: tokens decoded per run (32)")
    s.add_argument("--quick", action="store_true",
                   help="e2e suite: a fast smoke run (1 layer, short prompts, fewer repeats); "
                   "serving suite: 5 shapes at 1 16 256 4096 tokens, 3 short loops")
    s.add_argument("--no-triton", action="store_true",
                   help="serving suite: leave out the Triton column")
    s.add_argument("--host-cost", action="store_true",
                   help="instead: where one call's host time goes (64^3, step by step) and "
                   "the first call in a fresh process -> host-cost-<gpu>-<date>.json")
    s.set_defaults(func=cmd_bench)

    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)
