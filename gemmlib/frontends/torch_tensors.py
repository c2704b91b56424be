"""The torch front end: torch CUDA tensors described from their own attributes, torch's
current stream, and the few array operations a call makes, done by torch.

gemmlib never imports torch: it is taken from ``sys.modules`` once the caller has
imported it (:func:`torch_module`), and a torch caller's process never imports CuPy.
(torch CPU tensors come in through DLPack: :mod:`gemmlib.frontends.arrays`.)
"""

from __future__ import annotations

import sys
from contextlib import nullcontext
from functools import lru_cache

import numpy as np

from gemmlib.frontends.operand import Operand, layout_of
from gemmlib.runtime.memory import RawStream, stream_handle

_TORCH = None  # the torch module, once the caller has imported it (gemmlib never does)

#: torch.Tensor and nn.Parameter once torch is imported (no subclass: a DTensor or a fake
#: tensor takes the checked path)
TENSOR = []


def torch_module():
    """The torch module once the caller has imported it, else None (and :data:`TENSOR`
    filled in, for :func:`gemmlib.matmul`'s lean path)."""
    global _TORCH
    if _TORCH is None and "torch" in sys.modules:
        _TORCH = sys.modules["torch"]
        TENSOR[:] = [_TORCH.Tensor, _TORCH.nn.Parameter]
    return _TORCH


def tensor_types() -> list:
    """:data:`TENSOR`, filled in first if torch was imported since (a process's first torch
    call takes the lean path's checks and is remembered like any other)."""
    if not TENSOR:
        torch_module()
    return TENSOR


@lru_cache(maxsize=None)
def torch_dtype(tdtype) -> tuple[np.dtype, str]:
    """A torch dtype as (the NumPy dtype of the bits the kernel reads, its name)."""
    name = str(tdtype).replace("torch.", "")
    if name == "bfloat16":
        return np.dtype(np.uint16), "bfloat16"
    try:
        dt = np.dtype(name)
    except TypeError:  # float8_e4m3fn, complex32, ...: no NumPy twin; the name still says it
        dt = np.dtype(f"V{tdtype.itemsize}")
    return dt, name


def describe(x) -> Operand:
    """A torch CUDA tensor, from its own attributes (one call's worth of cheap queries)."""
    if x.requires_grad and torch_module().is_grad_enabled():
        # autograd would not see the product: fine under no_grad / inference_mode only
        raise RuntimeError("a tensor that requires grad cannot be used by gemmlib.matmul "
                           "while autograd records (it does not see gemmlib's kernels): call "
                           "it under torch.no_grad() or torch.inference_mode(), or pass "
                           "tensor.detach()")
    dtype, dname = torch_dtype(x.dtype)
    nbytes = x.numel() * dtype.itemsize
    c = x.is_contiguous()
    return Operand(x, tuple(x.shape), dtype, c, on_host=False,
                   ptr=x.data_ptr(), nbytes=nbytes, device=x.get_device() if nbytes else None,
                   kind="torch", dname=dname,
                   layout="C" if c else layout_of(tuple(x.shape), x.stride()))


def current_stream(device: int | None) -> RawStream:
    """torch's current stream on ``device``: where torch would queue a matmul of these tensors."""
    torch = torch_module()
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # one C call, no Stream object
    index = torch.cuda.current_device() if device is None else device
    if raw is not None:
        return RawStream(raw(index))
    return RawStream(torch.cuda.current_stream(index).cuda_stream)


def stream_context(stream):
    """A context that makes ``stream`` torch's current stream (torch's own: nothing)."""
    torch = torch_module()
    if stream is None or isinstance(stream, RawStream):
        return nullcontext()
    if hasattr(stream, "cuda_stream"):
        return torch.cuda.stream(stream)
    return torch.cuda.stream(torch.cuda.ExternalStream(stream_handle(stream)))


class TorchArrays:
    """The few array operations the launch path needs, for torch operands, done by torch
    on its current stream (a torch caller's process never imports CuPy)."""

    def __init__(self, like: Operand):
        self.device = like.obj.device

    def _dtype(self, dtype):
        torch = torch_module()
        if isinstance(dtype, torch.dtype):
            return dtype
        name = np.dtype(dtype).name
        return torch.int16 if name == "uint16" else getattr(torch, name)

    def empty(self, shape, dtype):
        return torch_module().empty(shape, dtype=self._dtype(dtype), device=self.device)

    def zeros(self, shape, dtype):
        return torch_module().zeros(shape, dtype=self._dtype(dtype), device=self.device)

    def asarray(self, x):
        return x


torch_module()   # a process that imported torch first: its tensors take the lean path at once
