"""``gemmlib.verify``: prove a kernel right on given shapes against a float64 oracle.

Each check draws fresh random non-integer inputs, fills the output with NaN
before the launch (an element the kernel forgets to write stays NaN and
fails the check), and compares with the float64 product by the relative
Frobenius error ||C - ref|| / ||ref||.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from gemmlib import backend
from gemmlib.api import matmul
from gemmlib.dispatch import get_spec as get_kernel

#: Unit roundoff of each precision: the tolerance scales with it.
EPS = {"float32": float(np.finfo(np.float32).eps), "float64": float(np.finfo(np.float64).eps)}


def tolerance(dtype: str, K: int) -> float:
    """Relative-error bound for a K-long dot product in ``dtype``.

    Rounding errors of a sum of K random terms grow like sqrt(K) * eps; the
    factor 4 leaves room for any summation order.  For float32 this stays far
    below TF32's ~2e-4, so a kernel (or reference) that silently used TF32
    fails.
    """
    return 4.0 * EPS[dtype] * math.sqrt(max(K, 1))


@dataclass
class Check:
    kernel: str
    shape: tuple[int, int, int]
    rel_error: float
    tolerance: float
    unwritten: int  # elements still NaN (never written) or non-finite

    @property
    def ok(self) -> bool:
        return self.unwritten == 0 and self.rel_error <= self.tolerance

    def __str__(self) -> str:
        M, N, K = self.shape
        status = "ok" if self.ok else "FAIL"
        extra = f", {self.unwritten} unwritten" if self.unwritten else ""
        return (f"{self.kernel:>14} {M:>6}x{N:<6}x{K:<6} rel.err {self.rel_error:9.2e} "
                f"(tol {self.tolerance:.1e}{extra}) {status}")


@dataclass
class Report:
    checks: list[Check] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]

    def __str__(self) -> str:
        return "\n".join(str(c) for c in self.checks)


def check_once(spec, M: int, N: int, K: int, rng=None) -> Check:
    """One verification of ``spec`` at (M, N, K); never raises on a wrong result."""
    if spec.precision in ("e4m3", "e5m2"):
        return _check_fp8(spec, M, N, K, rng)
    nt, tn = spec.b_operand == "NK", spec.a_operand == "KM"
    A = backend.random_matrix((K, M) if tn else (M, K), spec.dtype, rng)
    B = backend.random_matrix((N, K) if nt else (K, N), spec.dtype, rng)
    A, B = (A.T if tn else A), (B.T if nt else B)   # the layouts the spec reads, as views
    C = backend.poisoned((M, N), spec.out_dtype)
    matmul(A, B, out=C, kernel=spec)
    ref = backend.reference(A, B)  # of the very values the kernel reads
    xp = backend.array_module()
    unwritten = int((~xp.isfinite(C)).sum()) if M * N else 0
    err = backend.relative_error(C, ref) if M * N else 0.0
    if unwritten:
        err = math.inf if math.isnan(err) else err
    return Check(spec.name, (M, N, K), err, spec_tolerance(spec, K), unwritten)


def _check_fp8(spec, M: int, N: int, K: int, rng=None) -> Check:
    """An FP8 rung: random finite values of its format (bit patterns), scales 0.5 and 2.0,
    against float64 of the dequantised inputs (``gemmlib.fp8.reference``)."""
    from gemmlib import fp8
    from gemmlib.intrinsics.hopper import fp8_values
    from gemmlib.precision import BF16Array, bf16_bits_to_float32

    fmt, nt = spec.precision, spec.b_operand == "NK"
    gen = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
    vals = fp8_values(fmt)
    finite = np.flatnonzero(np.isfinite(vals) & (np.abs(vals) <= 16))
    A8 = gen.choice(finite, size=(M, K)).astype(np.uint8)
    B8 = gen.choice(finite, size=(N, K) if nt else (K, N)).astype(np.uint8)
    xp = backend.array_module()
    bf16 = spec.out_dtype == "uint16"
    raw = (xp.full((M, N), 0x7FC0, dtype=np.uint16) if bf16     # NaN in bfloat16
           else backend.poisoned((M, N), np.float32))
    A, B = (x if xp is np else xp.asarray(x) for x in (A8, B8))
    matmul(A, B, out=BF16Array(raw) if bf16 else raw, kernel=spec, precision=fmt,
           scale_a=0.5, scale_b=2.0, transpose_b=nt)
    C = bf16_bits_to_float32(raw) if bf16 else raw
    C = np.asarray(backend.to_host(C), dtype=np.float64)
    ref = fp8.reference(A8, B8, fmt, 0.5, 2.0, "NK" if nt else "KN")
    unwritten = int((~np.isfinite(C)).sum()) if M * N else 0
    den = float(np.linalg.norm(ref))
    err = (float(np.linalg.norm(C - ref)) / den if den else float(np.abs(C).max(initial=0.0))
           ) if M * N else 0.0
    if unwritten:
        err = math.inf
    return Check(spec.name, (M, N, K), err, fp8.tolerance(K, "bf16" if bf16 else "fp32"),
                 unwritten)


def spec_tolerance(spec, K: int) -> float:
    """The error bound of ``spec``'s precision (:func:`gemmlib.precision.tolerance`; for
    fp32 kernels it equals :func:`tolerance` of float32), plus the final rounding for a
    spec that writes C in the inputs' 16-bit type (``OUT``: half an ulp of that type)."""
    from gemmlib.precision import OUT16_ROUNDOFF, tolerance as precision_tolerance

    return (precision_tolerance(spec.precision, K)
            + OUT16_ROUNDOFF.get(spec.params.get("OUT", "fp32"), 0.0))


def verify(kernel, shapes, *, seed=None, raise_on_failure: bool = True) -> Report:
    """Verify ``kernel`` (name or spec) on every (M, N, K) in ``shapes``.

    Returns a :class:`Report`; raises ``AssertionError`` naming the kernel,
    the shapes and the errors if any check fails (after running them all).
    """
    spec = get_kernel(kernel)
    rng = np.random.default_rng(seed) if backend.SIMULATOR else seed
    report = Report()
    for shape in shapes:
        M, N, K = (int(s) for s in shape)
        report.checks.append(check_once(spec, M, N, K, rng))
        if not backend.SIMULATOR and isinstance(rng, int):
            rng += 1  # fresh inputs for every shape
    if raise_on_failure and not report.ok:
        lines = "\n".join(str(c) for c in report.failures)
        raise AssertionError(f"kernel {spec.name!r} is wrong on {len(report.failures)} "
                             f"shape(s):\n{lines}")
    return report
