"""The front end of every array but a torch CUDA tensor: CuPy arrays (described from
their own attributes, the common case), NumPy arrays and host DLPack producers (torch
CPU tensors: computed on the host in the simulator, else staged through the GPU),
numba device arrays and anything else with ``__cuda_array_interface__`` or
``__dlpack__`` (JAX, through CuPy); and the CuPy stream a staged call copies on.
"""

from __future__ import annotations

import sys
from contextlib import nullcontext

import numpy as np

from gemmlib import backend
from gemmlib.backend import SIMULATOR, cuda
from gemmlib.frontends.operand import Operand, is_c_contiguous, layout_of
from gemmlib.runtime.memory import RawStream, stream_handle


#: DLPack device types whose memory the CPU reads directly (kDLCPU, kDLCUDAHost).
_DLPACK_HOST = (1, 3)


def _dlpack_on_host(x) -> bool:
    """True for a DLPack producer whose data is in host memory (e.g. a torch CPU tensor)."""
    try:
        return int(x.__dlpack_device__()[0]) in _DLPACK_HOST
    except Exception:
        return False


_CUPY_NDARRAY = None  # cupy.ndarray, once CuPy is imported (never in the simulator)


def cupy_ndarray():
    global _CUPY_NDARRAY
    if _CUPY_NDARRAY is None and not SIMULATOR and "cupy" in sys.modules:
        _CUPY_NDARRAY = sys.modules["cupy"].ndarray
    return _CUPY_NDARRAY


def describe_cupy(x) -> Operand:
    nbytes = x.nbytes
    mem = x.data
    c = x.flags.c_contiguous
    return Operand(x, x.shape, x.dtype, c, on_host=False, ptr=mem.ptr,
                   nbytes=nbytes, device=mem.device_id if nbytes else None, kind="cupy",
                   layout="C" if c else layout_of(x.shape, x.strides, x.itemsize))


def describe_other(x, name: str) -> Operand:
    if (not isinstance(x, np.ndarray) and not hasattr(x, "__cuda_array_interface__")
            and not type(x).__module__.startswith("numba")  # the simulator's device arrays
            and hasattr(x, "__dlpack__") and _dlpack_on_host(x)):
        x = np.from_dlpack(x)  # e.g. a torch CPU tensor: a host array, zero-copy
    if isinstance(x, np.ndarray):
        c = x.flags.c_contiguous
        return Operand(x, x.shape, x.dtype, c, on_host=True,
                       layout="C" if c else layout_of(x.shape, x.strides, x.itemsize))
    if SIMULATOR:
        raise TypeError(
            f"{name}: in the simulator gemmlib works on NumPy arrays; got {type(x).__name__}")
    if not hasattr(x, "__cuda_array_interface__") and hasattr(x, "__dlpack__"):
        x = backend.array_module().from_dlpack(x)  # e.g. a JAX array; zero-copy
        return describe_cupy(x)._replace_kind("dlpack")
    if not hasattr(x, "__cuda_array_interface__"):
        raise TypeError(
            f"{name} must be a NumPy array or a GPU array (CuPy, numba, or anything with "
            f"__cuda_array_interface__ or __dlpack__, such as a torch tensor); "
            f"got {type(x).__name__}")
    cai = x.__cuda_array_interface__
    shape = tuple(cai["shape"])
    dtype = np.dtype(cai["typestr"])
    strides = cai.get("strides") or None
    contiguous = True if strides is None else is_c_contiguous(shape, strides, dtype.itemsize)
    layout = "C" if contiguous else layout_of(shape, strides, dtype.itemsize)
    ptr = int(cai["data"][0])
    nbytes = int(np.prod(shape)) * dtype.itemsize
    device = None
    if ptr and nbytes:
        device = backend.array_module().cuda.runtime.pointerGetAttributes(ptr).device
    kind = "numba" if cuda.is_cuda_array(x) and type(x).__module__.startswith("numba") else (
        "cupy" if type(x).__module__.startswith("cupy") else "other")
    return Operand(x, shape, dtype, contiguous, on_host=False, ptr=ptr, nbytes=nbytes,
                   device=device, kind=kind, layout=layout)


def staging_stream(stream):
    """The CuPy stream the host path copies on: the one the kernel runs on.

    Copies on another stream would not be ordered with the kernel when the
    caller's stream is non-blocking (the result could be read back before
    the kernel has written it).
    """
    if stream is None:
        return nullcontext()  # CuPy's current stream, where the kernel goes too
    if sys.modules.get("cupy") is None:   # a torch caller: copies are torch's
        return nullcontext()
    if isinstance(stream, RawStream) or hasattr(stream, "cuda_stream"):  # torch's
        return backend.array_module().cuda.ExternalStream(stream_handle(stream))
    if hasattr(stream, "ptr"):
        return stream
    return backend.array_module().cuda.ExternalStream(int(stream))  # a numba stream
