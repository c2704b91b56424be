"""Precisions: what a tensor-core GEMM rounds, how much error that costs, and bfloat16.

=========  =============  ======================================  ===============
precision  inputs         the product is formed from              unit roundoff u
=========  =============  ======================================  ===============
fp32       float32        float32 FMAs (CUDA cores)               2**-24
tf32       float32        inputs rounded to TF32 (10-bit          2**-11
                          mantissa), products exact, fp32 sums
3xtf32     float32        each input split into a TF32 "big"      ~2**-22 per
                          part and a TF32 "small" remainder;      input, fp32 sums
                          big*big + big*small + small*big
fp16       float16        the inputs as given (exact), fp32 sums  2**-11 (storage)
bf16       bfloat16       the inputs as given (exact), fp32 sums  2**-8 (storage)
=========  =============  ======================================  ===============

Every tensor-core precision accumulates in fp32, but the tensor core's adder
does not round to nearest: measured, the error of our mma.sync kernels grows
like K (cuBLAS's like sqrt(K)), so the tolerance allows ``0.5 * eps32 * K``;
TF32 adds one rounding of each *input* (relative error u_tf32 per factor).  For FP16/BF16 the inputs
are exact: the reference is the float64 product of the very values the
kernel read, so only the fp32 accumulation shows.

bfloat16 has no NumPy or CuPy dtype.  gemmlib takes it where the array
stack carries it -- torch ``bfloat16`` tensors and ``ml_dtypes.bfloat16``
NumPy arrays -- and as :class:`BF16Array`, a thin carrier of the raw 16-bit
patterns (``uint16``) that works with plain NumPy and CuPy
(:func:`to_bf16` makes one from float32 data).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

PRECISIONS = ("fp32", "tf32", "3xtf32", "fp16", "bf16")

#: what the tensor-core kernel does with a float32 input, per precision
TENSOR_CORE = ("tf32", "3xtf32", "fp16", "bf16")

#: the input dtype (name) each precision takes
INPUT_DTYPE = {"fp32": "float32", "tf32": "float32", "3xtf32": "float32",
               "fp16": "float16", "bf16": "bfloat16"}

#: unit roundoff of the rounding each precision applies to its *inputs* (0: none)
INPUT_ROUNDOFF = {"fp32": 0.0, "tf32": 2.0 ** -11, "3xtf32": 2.0 ** -22, "fp16": 0.0,
                  "bf16": 0.0}

#: unit roundoff of the accumulation (fp32 everywhere)
ACC_ROUNDOFF = 2.0 ** -24

#: unit roundoff of the final rounding of C to the inputs' 16-bit type (``OUT="fp16"`` /
#: ``"bf16"`` builds: each element rounded once, to nearest even)
OUT16_ROUNDOFF = {"fp16": 2.0 ** -11, "bf16": 2.0 ** -8}


def tolerance(precision: str, K: int) -> float:
    """Relative (Frobenius) error bound for C = A @ B with K-long dot products.

    Random-sign errors add like a random walk: sqrt(K) fp32 roundings from the
    accumulation, plus two input roundings per product, which do not grow
    with K in relative terms (each term of the sum carries the same relative
    error, and they average).  The factors (4 and 4) leave room for any
    summation order and for the non-IEEE rounding of tensor-core adders; for
    tf32 the bound (~5e-4) stays far below what an unconverted or wrongly
    packed fragment gives (O(1)), and for fp32 it stays below TF32's error,
    so a kernel that silently used TF32 fails.
    """
    if precision not in INPUT_ROUNDOFF:
        raise ValueError(f"unknown precision {precision!r}; known: {', '.join(PRECISIONS)}")
    eps = 2 * ACC_ROUNDOFF                                  # float32 eps
    acc = 4.0 * eps * math.sqrt(max(K, 1))
    if precision != "fp32":
        # Tensor cores add into the fp32 accumulator without round-to-nearest: measured
        # on an H200 (results/accuracy-*.json) the error then grows like K, not sqrt(K)
        # (fp16 at K = 65536: 7.7e-5 against cuBLAS's 4.9e-6).
        acc = max(acc, 0.5 * eps * K)
    return acc + 4.0 * 2 * INPUT_ROUNDOFF[precision]


def check_precision(precision: str | None, dtype_name: str) -> str:
    """The precision a call runs in (``None``: the input's own), or a clear error."""
    if precision is None:
        for p in ("fp32", "fp16", "bf16"):
            if INPUT_DTYPE[p] == dtype_name:
                return p
        raise TypeError(f"gemmlib computes float32, float16 and bfloat16 inputs; got "
                        f"{dtype_name} (convert it first, e.g. A.astype(numpy.float32))")
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}; got {precision!r}")
    if INPUT_DTYPE[precision] != dtype_name:
        raise TypeError(f"precision={precision!r} takes {INPUT_DTYPE[precision]} inputs, got "
                        f"{dtype_name}" + (" (tf32 and 3xtf32 round float32 inputs inside "
                                           "the kernel)" if dtype_name != "float32" else ""))
    return precision


# --------------------------------------------------------------------------
# bfloat16 as raw bits


def to_bf16_bits(x):
    """float32 values -> bfloat16 bit patterns (uint16), round to nearest even.

    Works on NumPy and CuPy arrays (NaN stays NaN, Inf stays Inf).
    """
    xp = _xp(x)
    u = xp.ascontiguousarray(x, dtype=xp.float32).view(xp.uint32)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16   # round half to even on the top 16 bits
    return xp.where(nan, (u >> 16) | 0x40, rounded).astype(xp.uint16)


def bf16_bits_to_float32(b):
    """bfloat16 bit patterns (uint16) -> float32 (exact)."""
    xp = _xp(b)
    return (xp.asarray(b).astype(xp.uint32) << 16).view(xp.float32)


def _xp(x):
    mod = type(x).__module__
    if mod.startswith("cupy"):
        import cupy

        return cupy
    return np


@dataclass(frozen=True)
class BF16Array:
    """A bfloat16 matrix carried as its bit patterns (a uint16 NumPy or CuPy array).

    ``gemmlib.matmul`` accepts it like a float16 array; ``astype(float32)``
    gives the values back.
    """

    bits: object

    def __post_init__(self):
        if np.dtype(self.bits.dtype) != np.uint16:
            raise TypeError(f"BF16Array carries uint16 bit patterns, got {self.bits.dtype}")

    @property
    def shape(self) -> tuple:
        return tuple(self.bits.shape)

    @property
    def dtype(self) -> str:
        return "bfloat16"

    def astype(self, dtype):
        if np.dtype(dtype) != np.float32:
            return bf16_bits_to_float32(self.bits).astype(dtype)
        return bf16_bits_to_float32(self.bits)

    @property
    def T(self) -> "BF16Array":
        """The transpose, a view of the same bits."""
        return BF16Array(self.bits.T)

    def __array__(self, dtype=None, copy=None):
        """The values as a NumPy array (float32 unless ``dtype``), so that a host
        BF16Array takes part in NumPy arithmetic (``np.asarray(C)``, ``C - ref``)."""
        if not isinstance(self.bits, np.ndarray):
            raise TypeError("a BF16Array on the GPU does not convert to NumPy implicitly: "
                            "use .astype(numpy.float32) and copy it to the host")
        return self.astype(dtype or np.float32)

    def __repr__(self) -> str:
        return f"BF16Array(shape={self.shape}, on {type(self.bits).__module__.split('.')[0]})"


def to_bf16(x) -> BF16Array:
    """A float32 NumPy/CuPy array rounded to bfloat16 (nearest even), as a BF16Array."""
    return BF16Array(to_bf16_bits(x))


def dtype_name(x) -> str:
    """The element type of an array, by name: ``float32``, ``float16``, ``bfloat16``..."""
    if isinstance(x, BF16Array):
        return "bfloat16"
    d = getattr(x, "dtype", None)
    if d is None:
        return type(x).__name__
    s = str(d)
    return s.replace("torch.", "") if s.startswith("torch.") else np.dtype(d).name


__all__ = ["PRECISIONS", "TENSOR_CORE", "INPUT_DTYPE", "tolerance", "check_precision",
           "to_bf16", "to_bf16_bits", "bf16_bits_to_float32", "BF16Array", "dtype_name"]
