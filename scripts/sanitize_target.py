"""Run gemmlib kernels once each, for compute-sanitizer to watch (see scripts/sanitize.py).

    python3 scripts/sanitize_target.py KERNEL[,KERNEL...|all] SHAPE[,SHAPE...]

KERNEL is a rung name, or ``rung:precision`` for a tensor-core rung in another
precision than its default (``mma_pipeline:3xtf32``).  Inputs have the
kernel's input dtype (float16 for the FP16 rungs).

SHAPE is MxNxK or ``tile+`` (one past a block tile in every dimension, with N
and K multiples of 4 so the float4 paths run).  Inputs are made on the host
and copied (no CuPy kernels run, so every report belongs to a gemmlib kernel);
each result is checked against float64 on the host.  Prints one
``@@ kernel shape ok|WRONG|REFUSED`` line per run; exits 2 if a result is wrong.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "0")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import numpy as np  # noqa: E402

import gemmlib  # noqa: E402
from gemmlib import backend  # noqa: E402
from gemmlib.kernels import LADDER, get  # noqa: E402
from gemmlib.dispatch import get_spec  # noqa: E402
from gemmlib.spec import ConstraintError  # noqa: E402
from gemmlib.verify import spec_tolerance  # noqa: E402


def shape_for(spec, text: str):
    if text == "tile+":
        tm, tn = spec.tile
        return tm + 3, tn + 4, max(2 * spec.k_tile, 16) + 4
    M, N, K = (int(v) for v in text.lower().split("x"))
    return M, N, K


def main(argv) -> int:
    names = list(LADDER) if argv[1] == "all" else argv[1].split(",")
    shapes = argv[2].split(",") if len(argv) > 2 else ["67x45x37", "tile+"]
    xp = backend.array_module()
    bad = 0
    for name in names:
        rung, _, precision = name.partition(":")
        spec = get_spec(rung, precision or None) if precision else get(rung)
        if spec.dtype not in ("float32", "float16"):
            print(f"@@ {name} - SKIPPED (no NumPy dtype for {spec.dtype})", flush=True)
            continue
        if not backend.SIMULATOR and tuple(backend.device_info().compute_capability) < spec.min_cc:
            print(f"@@ {name} - SKIPPED (needs sm_{spec.min_cc[0]}{spec.min_cc[1]})", flush=True)
            continue
        nt = spec.b_operand == "NK"
        for text in shapes:
            M, N, K = shape_for(spec, text)
            rng = np.random.default_rng(M * 7919 + N * 31 + K)
            A = rng.uniform(-1, 1, (M, K)).astype(spec.dtype)
            B = rng.uniform(-1, 1, (N, K) if nt else (K, N)).astype(spec.dtype)
            ref = A.astype(np.float64) @ (B.T if nt else B).astype(np.float64)
            try:
                C = gemmlib.matmul(xp.asarray(A), xp.asarray(B), kernel=spec, transpose_b=nt)
                backend.synchronize()
            except ConstraintError as e:
                print(f"@@ {name} {M}x{N}x{K} REFUSED {e}", flush=True)
                continue
            C = backend.to_host(C).astype(np.float64)
            err = float(np.linalg.norm(C - ref) / max(np.linalg.norm(ref), 1e-30))
            ok = np.isfinite(C).all() and err <= spec_tolerance(spec, K)
            bad += not ok
            print(f"@@ {name} {M}x{N}x{K} {'ok' if ok else 'WRONG'} rel.err {err:.2e}", flush=True)
    return 2 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
