"""Time kernel variants side by side against cuBLAS, on a GPU: verified first, then timed.

    NUMBA_ENABLE_CUDASIM=0 python scripts/experiments/compare_variants.py \\
        --shapes 4096 8192 4095x3073x2047 \\
        --variant 2d=blocktile_2d --variant 2d_uncapped="blocktile_2d:max_registers=None" \\
        --out results/variants.json

A variant is ``LABEL=MODULE[:KWARGS]``: MODULE is a rung of ``gemmlib.kernels``
(or any importable module with a ``build`` function), KWARGS its ``build``
arguments as Python keywords.  Each variant is checked against the float64
reference on every shape (a wrong result stops the script), then timed the
way ``gemmlib.bench`` times (CUDA events, L2 flushed before each run, median),
beside cuBLAS on the same operands in the same process (A @ B, or A @ B.T for
K-major rungs).  Registers, spills and the % of cuBLAS go to the table and
to ``--out`` with the environment (GPU, clocks, versions).

Written for the unsigned-index experiment (``results/uidx-2026-11-22/``: its ``variants-*``;
the driver script is named in ``results/MANIFEST.md``); run it from the repository root.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "0")
os.environ["CUPY_TF32"] = "0"
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root


def parse_shape(s: str):
    v = [int(x) for x in s.lower().split("x")]
    return tuple(v * 3) if len(v) == 1 else tuple(v)


def parse_variant(s: str):
    label, _, rest = s.partition("=")
    mod, _, kw = rest.partition(":")
    kwargs = {}
    if kw:
        call = ast.parse(f"f({kw})", mode="eval").body
        kwargs = {k.arg: ast.literal_eval(k.value) for k in call.keywords}
    name = mod if "." in mod else f"gemmlib.kernels.{mod}"
    return label, importlib.import_module(name).build(**kwargs), rest


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=["4096"])
    ap.add_argument("--variant", action="append", default=[], required=True)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)

    import numpy as np

    from gemmlib import backend
    from gemmlib.api import launch, matmul
    from gemmlib.autotune import compiled_resources
    from gemmlib.bench import environment, time_fn
    from gemmlib.verify import tolerance

    cp = backend.array_module()
    variants = [parse_variant(v) for v in args.variant]
    rows = []
    for shape in map(parse_shape, args.shapes):
        M, N, K = shape
        A = backend.random_matrix((M, K), np.float32, 0)
        B = backend.random_matrix((K, N), np.float32, 1)
        Bt = cp.ascontiguousarray(B.T)
        C = cp.empty((M, N), dtype=np.float32)
        ref = backend.reference(A, B)
        cub = {"KN": time_fn(lambda: cp.matmul(A, B, out=C), args.reps).median,
               "NK": time_fn(lambda: cp.matmul(A, Bt.T, out=C), args.reps).median}
        print(f"{M}x{N}x{K}: cuBLAS {cub['KN']:.3f} ms (A @ B), {cub['NK']:.3f} ms (A @ B.T)",
              flush=True)
        for label, spec, expr in variants:
            why = spec.failed_constraints(M, N, K, backend.device_info())
            if why:
                print(f"  {label:>24}: skipped ({'; '.join(why)})")
                continue
            nt = spec.b_operand == "NK"
            Bk = Bt if nt else B
            C.fill(np.nan)
            matmul(A, Bk, out=C, kernel=spec, transpose_b=nt)
            err = backend.relative_error(C, ref)
            if not err <= tolerance(spec.dtype, K):
                raise AssertionError(f"{label} is wrong at {shape}: rel. error {err:.2e}")
            a, b, c = (backend.cuda.as_cuda_array(x, sync=False) for x in (A, Bk, C))
            ms = time_fn(lambda: launch(spec, a, b, c, M, N, K), args.reps).median
            res = compiled_resources(spec)
            ref_ms = cub["NK" if nt else "KN"]
            row = dict(label=label, variant=expr, kernel=spec.name, shape=list(shape), ms=ms,
                       tflops=2e-9 * M * N * K / ms, cublas_ms=ref_ms,
                       pct_of_cublas=100 * ref_ms / ms, rel_error=float(err), **res)
            rows.append(row)
            print(f"  {label:>24}: {ms:8.3f} ms {row['tflops']:6.2f} TFLOP/s "
                  f"{row['pct_of_cublas']:5.1f}%  regs {res['registers']} "
                  f"local {res['local_bytes']} B", flush=True)
        del A, B, Bt, C, ref
        cp.get_default_memory_pool().free_all_blocks()
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"meta": environment(), "reps": args.reps, "rows": rows},
                                       indent=1))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
