"""FP8: the two formats, the rung their products run on, and their numerics.

``C = (scale_a * scale_b) * (A @ B)`` for A (M, K) and B (K, N) in one FP8 format
(``e4m3`` or ``e5m2``), accumulated in fp32 and written as bfloat16 (default) or
float32 -- what ``torch._scaled_mm`` computes with per-tensor scales.  The product's
path (its inputs, scales and layouts) is :mod:`gemmlib.paths.fp8`, one of
:func:`gemmlib.matmul`'s paths; here: :func:`fp8_format` (is a call FP8, and in which
format), :func:`spec_for`, and for the tests :func:`tolerance` and :func:`reference`.
"""

from __future__ import annotations

import numpy as np

from gemmlib.runtime.select import build
from gemmlib.spec import KernelSpec

#: precision name of each torch FP8 dtype name
FORMATS = {"float8_e4m3fn": "e4m3", "float8_e5m2": "e5m2"}
#: the rung FP8 products run on
RUNG = "wgmma_fp8"


def fp8_format(dname: str, precision: str | None) -> str | None:
    """The FP8 format a call computes in (None: not an FP8 call)."""
    if precision in ("e4m3", "e5m2"):
        return precision
    return FORMATS.get(dname)


def spec_for(fmt: str, out: str, b_layout: str) -> KernelSpec:
    """The FP8 rung in format ``fmt``, writing ``out`` ("bf16"/"fp32"), reading B as
    ``b_layout`` ("KN" row-major, "NK" K-major)."""
    return build(RUNG, {"precision": fmt, "OUT": out, "B_LAYOUT": b_layout})


def tolerance(K: int, out: str = "fp32") -> float:
    """Relative (Frobenius) error bound of an FP8 product against float64 of the dequantised
    inputs.  The products are exact, but Hopper's FP8 tensor cores add them into the
    accumulator with fewer than fp32's bits ("fast accumulation", as ``torch._scaled_mm``'s
    ``use_fast_accum=True``): measured on an H100 (results/fp8-2026-11-25/) the error grows
    about like sqrt(K), 3.7e-5 at K = 16 and 8.5e-4 at K = 2048.  The bound allows 2^-12
    per sqrt(K), and a bf16 output one more rounding (2^-9, doubled)."""
    import math

    return 2.0 ** -12 * math.sqrt(max(K, 1)) + (2.0 ** -8 if out == "bf16" else 0.0)


def reference(A8, B8, fmt: str, scale_a: float, scale_b: float, b_layout: str = "KN"):
    """float64 ``(s_a * s_b) * A @ B`` of the dequantised bit patterns (NumPy uint8 arrays)."""
    from gemmlib.intrinsics.hopper import fp8_values

    table = fp8_values(fmt).astype(np.float64)
    a = table[np.asarray(A8)]
    b = table[np.asarray(B8)]
    if b_layout == "NK":
        b = b.T
    return float(scale_a) * float(scale_b) * (a @ b)
