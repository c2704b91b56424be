"""What a call knows of one array, whatever library made it: :class:`Operand`.

The front ends (:mod:`~gemmlib.frontends.torch_tensors`, :mod:`~gemmlib.frontends.arrays`,
chosen by :func:`gemmlib.frontends.describe.describe`) describe each operand once per
call from its own attributes; everything after works on the description.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

#: the 16-bit element types (tensor-core inputs; a C in the inputs' own type)
SIXTEEN = ("float16", "bfloat16")
#: an element type as the kernels name it: their precision, ``OUT`` and bias types
KERNEL_TYPE = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}


@dataclass
class Operand:
    """What matmul needs to know about one array, whatever library made it."""

    obj: object  # the array as the kernel will receive it
    shape: tuple
    dtype: np.dtype
    c_contiguous: bool
    on_host: bool
    ptr: int = 0
    nbytes: int = 0
    device: int | None = None
    kind: str = "numpy"  # numpy | cupy | torch | numba | dlpack (e.g. JAX, as CuPy) | other
    #: element type by name; "bfloat16" for BF16Array / torch / ml_dtypes data, whose
    #: ``obj`` is then the raw 16-bit patterns
    dname: str = ""
    #: bfloat16 operands: what carried them ("bf16array", "ml_dtypes" or "torch"), the type
    #: a bfloat16 result comes back in
    bf16_from: str = ""
    #: how the elements lie: "C" (row-major: a unit stride along the last dimension, rows
    #: one after the other), "F" (a 2-D matrix whose transpose is row-major: ``W.t()``,
    #: ``x.T``, Fortran order), or "" (anything else: a step, a gap between rows, a
    #: broadcast); from ``c_contiguous`` and the strides
    layout: str = ""

    def __post_init__(self):
        if not self.dname:
            self.dname = dtype_name(self.dtype)
        if not self.layout and self.c_contiguous:
            self.layout = "C"

    def _replace_kind(self, kind: str) -> "Operand":
        self.kind = kind
        return self


@lru_cache(maxsize=None)
def dtype_name(dtype) -> str:
    """``np.dtype(dtype).name``, remembered: NumPy computes the name in Python on every
    access, a noticeable part of a call's host time."""
    return np.dtype(dtype).name


@lru_cache(maxsize=None)
def np_dtype(name: str) -> np.dtype:
    return np.dtype(name)


def is_c_contiguous(shape, strides, itemsize) -> bool:
    """Row-major with no gaps, for ``strides`` in units of ``itemsize``."""
    expected = itemsize
    for n, s in zip(reversed(shape), reversed(strides)):
        if n > 1 and s != expected:
            return False
        expected *= n
    return True


def element_strides(op: Operand) -> tuple:
    """An operand's strides in elements, from its own array (torch's ``stride()``, else
    the byte strides of NumPy, CuPy and numba arrays)."""
    x = op.obj
    if op.kind == "torch":
        return tuple(x.stride())
    return tuple(s // x.dtype.itemsize for s in x.strides)


def layout_of(shape, strides, itemsize=1) -> str:
    """"C", "F" (2-D only: the transpose is row-major) or "" for ``strides`` (in units of
    ``itemsize``)."""
    if is_c_contiguous(shape, strides, itemsize):
        return "C"
    if len(shape) == 2 and is_c_contiguous(shape[::-1], strides[::-1], itemsize):
        return "F"
    return ""


def transposed(X, op: Operand):
    """A 2-D operand's transpose, as an object (a view) and its description."""
    XT = X.T
    t = Operand(op.obj.T, op.shape[::-1], op.dtype, op.layout == "F", op.on_host, op.ptr,
                op.nbytes, op.device, op.kind, op.dname, op.bf16_from,
                {"C": "F", "F": "C"}.get(op.layout, ""))
    return XT, t


def overlap(a: Operand, b: Operand) -> bool:
    """Whether two operands share memory (``out`` may not: the kernel would read what it
    overwrites)."""
    if a.on_host:
        return np.shares_memory(a.obj, b.obj)
    return a.nbytes > 0 and b.nbytes > 0 and a.ptr < b.ptr + b.nbytes and b.ptr < a.ptr + a.nbytes
