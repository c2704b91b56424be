"""Helpers shared by the reliability tests (issue 6): every registered kernel, its
operand layout, its compute-capability floor, the float64 oracle, and the JSON
summaries written to ``$GEMMLIB_REPORT_DIR``.

Not a test module (no ``test_`` prefix): imported by the ``test_*`` files.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import pytest

from gemmlib import backend
from gemmlib.kernels import LADDER, get
from gemmlib.verify import spec_tolerance, tolerance

EPS32 = float(np.finfo(np.float32).eps)


def kernel_names() -> list[str]:
    """Every registered rung (read at collection time, so new rungs are picked up)."""
    return list(LADDER)


def spec_or_skip(name: str):
    """The spec of ``name``; skips the test when this GPU is older than its ``min_cc``."""
    spec = get(name)
    if not backend.SIMULATOR:
        cc = tuple(backend.device_info().compute_capability)
        if cc < tuple(spec.min_cc):
            pytest.skip(f"{name} needs sm_{spec.min_cc[0]}{spec.min_cc[1]}+, "
                        f"device is sm_{cc[0]}{cc[1]}")
    return spec


def nk(spec) -> bool:
    """True when the kernel takes B as (N, K) and computes A @ B.T."""
    return spec.b_operand == "NK"


def b_shape(spec, K: int, N: int) -> tuple[int, int]:
    return (N, K) if nk(spec) else (K, N)


def input_dtype(spec) -> np.dtype:
    """The NumPy dtype of ``spec``'s inputs: float32, or float16 for FP16 tensor-core rungs.

    The tensor-core rungs are registered in FP16 (their default spec), so the
    reliability suite runs them on float16 data; tf32/3xtf32/bf16 are covered
    by tests/test_tensor_cores.py.
    """
    return np.dtype(spec.dtype)


def host_operands(spec, M, N, K, rng):
    """Random host inputs in [-1, 1) in the dtype and layout ``spec`` takes."""
    A = rng.uniform(-1, 1, (M, K)).astype(input_dtype(spec))
    B = rng.uniform(-1, 1, b_shape(spec, K, N)).astype(input_dtype(spec))
    return A, B


def run(spec, A, B, **kw):
    """gemmlib.matmul with ``spec``, passing transpose_b as the spec requires."""
    import gemmlib

    return gemmlib.matmul(A, B, kernel=spec, transpose_b=nk(spec), **kw)


def ref64(spec, A, B) -> np.ndarray:
    """The float64 oracle on the host: sum over the real k only."""
    A64 = np.asarray(backend.to_host(A), dtype=np.float64)
    B64 = np.asarray(backend.to_host(B), dtype=np.float64)
    return A64 @ (B64.T if nk(spec) else B64)


def elementwise_bound(A64, B64t, K: int) -> np.ndarray:
    """A rigorous bound on |C - ref| for a K-term float32 dot product: ~K*eps*(|A| @ |B|)."""
    return 2.0 * max(K, 1) * EPS32 * (np.abs(A64) @ np.abs(B64t)) + 1e-30


def assert_close(C, ref, K: int, spec=None, scale=None) -> None:
    """C is finite and within gemmlib's tolerance of the float64 ``ref`` (relative Frobenius
    error, ``verify.tolerance``; the precision's bound when ``spec`` is given), as in
    ``gemmlib.verify``.  ``scale``: the norm to divide by instead of ``||ref||`` -- that of
    ``|A| @ |B|`` where every element is one dot product that may cancel (a rank-1 product
    of broadcast operands), since rounding error is bounded relative to it, not to C."""
    C = np.asarray(backend.to_host(C), dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    assert C.shape == ref.shape, (C.shape, ref.shape)
    bad = int((~np.isfinite(C)).sum())
    assert bad == 0, f"{bad} non-finite element(s) in C"
    scale = float(np.linalg.norm(ref)) if scale is None else float(scale)
    err = float(np.linalg.norm(C - ref)) / (scale if scale > 0 else 1.0)
    tol = spec_tolerance(spec, K) if spec is not None else tolerance("float32", K)
    assert err <= tol, f"relative error {err:.2e} > {tol:.1e}"


def report(name: str, data) -> None:
    """Write ``data`` as JSON to $GEMMLIB_REPORT_DIR/<name>.json (when that is set)."""
    where = os.environ.get("GEMMLIB_REPORT_DIR")
    if not where:
        return
    path = Path(where)
    path.mkdir(parents=True, exist_ok=True)
    (path / f"{name}.json").write_text(json.dumps(data, indent=1, sort_keys=True, default=str))


def finite_or_none(x: float):
    return x if math.isfinite(x) else None
