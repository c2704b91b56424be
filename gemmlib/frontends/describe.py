"""Which front end describes an array: CuPy first (the common case, cheaply), then torch
CUDA tensors, then bfloat16 carriers (``BF16Array``, torch, ``ml_dtypes``: described as
their bit patterns), then everything else (:mod:`gemmlib.frontends.arrays`)."""

from __future__ import annotations

import numpy as np

from gemmlib.backend import SIMULATOR
from gemmlib.frontends.arrays import cupy_ndarray, describe_cupy, describe_other
from gemmlib.frontends.operand import Operand
from gemmlib.frontends.torch_tensors import describe as describe_torch
from gemmlib.frontends.torch_tensors import torch_module


def describe(x, name: str) -> Operand:
    """``x`` described by its front end; ``name`` ("A", "B", "out", "bias") for errors."""
    if type(x) is cupy_ndarray():  # the common case, cheaply
        return describe_cupy(x)
    torch = torch_module()
    if torch is not None and isinstance(x, torch.Tensor) and x.is_cuda and not SIMULATOR:
        return describe_torch(x)
    bf16 = bf16_bits(x)
    if bf16 is not None:  # bfloat16: describe the bit patterns, remember what they are
        op = describe(bf16, name)
        op.dname = "bfloat16"
        op.bf16_from = bf16_source(x)
        return op
    return describe_other(x, name)


def bf16_bits(x):
    """The uint16/int16 bit patterns of a bfloat16 array (BF16Array, torch, ml_dtypes), or None."""
    from gemmlib.precision import BF16Array

    if isinstance(x, BF16Array):
        return x.bits
    if isinstance(x, np.ndarray) and x.dtype.name == "bfloat16":  # ml_dtypes
        return x.view(np.uint16)
    if str(getattr(x, "dtype", "")) == "torch.bfloat16":
        import torch

        return x.view(torch.int16)  # same bits; torch exports int16 through DLPack and CAI
    return None


def bf16_source(x) -> str:
    from gemmlib.precision import BF16Array

    if isinstance(x, BF16Array):
        return "bf16array"
    return "ml_dtypes" if isinstance(x, np.ndarray) else "torch"
