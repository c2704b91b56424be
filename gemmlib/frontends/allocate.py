"""Arrays a call makes, in the caller's own type: C (a 16-bit one, a stack of them, a
repeat's), copies of an operand in another order, zero-padded operands, the raw views
the kernels take (16-bit bits), host results of the caller's type, and their addresses.
"""

from __future__ import annotations

import dataclasses
import sys

import numpy as np

from gemmlib import backend
from gemmlib.backend import cuda
from gemmlib.frontends.arrays import cupy_ndarray, describe_cupy
from gemmlib.frontends.operand import Operand
from gemmlib.frontends.torch_tensors import TorchArrays, stream_context, torch_module
from gemmlib.frontends.torch_tensors import describe as describe_torch
from gemmlib.runtime.calls import Call


def allocate_output(M: int, N: int, dtype, like: Operand):
    """C on the GPU in A's own type (torch, numba, else CuPy); a clear MemoryError when it
    cannot fit."""
    try:
        if like.kind == "numba":
            return cuda.device_array((M, N), dtype=dtype)
        if like.kind == "torch":   # dtype: a NumPy dtype, or a name ("bfloat16")
            torch = torch_module()
            name = dtype if isinstance(dtype, str) else np.dtype(dtype).name
            return torch.empty((M, N), dtype=getattr(torch, name), device=like.obj.device)
        return backend.array_module().empty((M, N), dtype=dtype)
    except Exception as e:
        if not (isinstance(e, MemoryError) or "OUT_OF_MEMORY" in str(e).upper()
                or "out of memory" in str(e).lower()):
            raise
        size = M * N * (2 if dtype == "bfloat16" else np.dtype(dtype).itemsize)
        raise MemoryError(
            f"out of GPU memory allocating C ({M} x {N} "
            f"{dtype if isinstance(dtype, str) else np.dtype(dtype)}, "
            f"{size / 2**30:.2f} GiB): "
            f"{e}. Free memory (e.g. cupy.get_default_memory_pool().free_all_blocks()), "
            f"split the problem, or pass a preallocated out=") from e


def allocate16(M: int, N: int, o16: str, a: Operand):
    """A 16-bit C for inputs described as ``a``: NumPy on the host, else in A's own type
    (a torch tensor of that dtype, CuPy / numba float16, a BF16Array of CuPy bits)."""
    if a.on_host:
        return host16(np.empty((M, N), np.uint16), o16, a)
    if a.kind == "torch":
        return allocate_output(M, N, o16, like=a)
    if o16 == "float16":
        return allocate_output(M, N, np.float16, like=a)
    from gemmlib.precision import BF16Array

    if a.kind == "numba":   # a BF16Array holds CuPy bits, whoever brought the inputs
        a = dataclasses.replace(a, kind="cupy")
    return BF16Array(allocate_output(M, N, np.uint16, like=a))


def allocate_stack(shape: tuple, dname: str, like: Operand):
    """An uninitialised stack for a batched launch's C, in A's own array type."""
    if like.kind == "torch":
        torch = torch_module()
        return torch.empty(shape, dtype=getattr(torch, dname), device=like.obj.device)
    xp = backend.array_module()
    if dname == "bfloat16":
        from gemmlib.precision import BF16Array

        return BF16Array(xp.empty(shape, np.uint16))
    return xp.empty(shape, dtype=dname)


def empty_stack(first, batch: tuple, matrix: tuple | None = None):
    """An uninitialised stack of ``batch`` results typed like ``first`` (shaped like it,
    or ``matrix``)."""
    torch = torch_module()
    shape = batch + (tuple(first.shape) if matrix is None else matrix)
    if torch is not None and isinstance(first, torch.Tensor):
        return torch.empty(shape, dtype=first.dtype, device=first.device)
    if isinstance(first, np.ndarray):
        return np.empty(shape, dtype=first.dtype)
    if type(first).__module__.startswith("numba"):
        return cuda.device_array(shape, dtype=first.dtype)
    return backend.array_module().empty(shape, dtype=first.dtype)


def new_output(k: Call, a: Operand, device: int):
    """C for a repeat of ``k`` on ``device``, in A's own type (torch or CuPy)."""
    p = k.plan
    if a.kind == "torch":
        dev = k.devices.get(device)
        if dev is None:
            dev = k.devices[device] = torch_module().device("cuda", device)
        return torch_module().empty((p.M, p.N), dtype=k.out_dtype, device=dev)
    return backend.array_module().empty((p.M, p.N), dtype=k.out_dtype)


def host16(bits: np.ndarray, o16: str, a: Operand):
    """16-bit result bits on the host as the caller's type: float16, or bfloat16 as the
    inputs carried it (an ml_dtypes array, else a BF16Array; matmul makes torch CPU
    results torch tensors)."""
    if o16 == "float16":
        return bits.view(np.float16)
    if a.bf16_from == "ml_dtypes":
        import ml_dtypes

        return bits.view(ml_dtypes.bfloat16)
    from gemmlib.precision import BF16Array

    return BF16Array(bits)


def bits_of(x, on_host: bool, xp):
    """A 16-bit array (float16, bfloat16 of any carrier, int16/uint16 bits) as a uint16
    view of the same memory: NumPy on the host, else CuPy (torch tensors through CAI)."""
    if is_bf16array(x):
        x = x.bits
    if on_host:
        return x.view(np.uint16)
    torch = torch_module()
    if torch is not None and isinstance(x, torch.Tensor):
        if isinstance(xp, TorchArrays):
            return x.view(torch.int16)   # the kernel takes the bits; no CuPy needed
        x = x.view(torch.int16)   # torch exports no bfloat16 through CAI
    x = x if type(x) is cupy_ndarray() else xp.asarray(x)
    return x.view(np.uint16)


def is_bf16array(x) -> bool:
    from gemmlib.precision import BF16Array

    return isinstance(x, BF16Array)


def kernel_array(op: Operand, xp, pitched: bool = False):
    """The operand as an array the kernel can take: raw 16-bit patterns for 16-bit inputs;
    NumPy (simulator, private copy when read-only) or a GPU array.  ``pitched``: a slice of
    a wider matrix that the kernel reads in place, through its tensor maps or its strides
    (kept as it lies)."""
    x = op.obj
    if op.on_host:   # (a size-1 dimension may carry any stride: TMA maps read the strides)
        canonical = x.strides == np.empty(x.shape, x.dtype).strides
        keep = pitched and x.flags.writeable and x.strides[-1] == x.dtype.itemsize
        if not (x.flags.c_contiguous and x.flags.writeable and canonical) and not keep:
            x = np.array(x, order="C")
        return x.view(np.uint16) if x.dtype.itemsize == 2 else x
    if op.kind == "torch":
        x = x.detach()   # CAI refuses a tensor that requires grad (no autograd here)
        if op.dname == "bfloat16":
            x = x.view(torch_module().int16)  # torch exports no bfloat16 through CAI; the bits do
        if isinstance(xp, TorchArrays):
            return x
    return x if type(x) is cupy_ndarray() else xp.asarray(x)


def to_device(op: Operand, xp):
    """A host operand copied to the GPU (bfloat16 as a BF16Array of its bits)."""
    x = np.ascontiguousarray(op.obj)
    if op.dname == "bfloat16":
        from gemmlib.precision import BF16Array

        return BF16Array(xp.asarray(x.view(np.uint16)))
    return xp.asarray(x)


def padded(x, rows: int, cols: int, xp):
    """``x`` in the top-left corner of a zero (rows, cols) array of its dtype."""
    p = xp.zeros((rows, cols), dtype=x.dtype)
    p[:x.shape[0], :x.shape[1]] = x
    return p


def pointer(C) -> int:
    """The device address of a GPU array (CuPy, torch, or ``__cuda_array_interface__``)."""
    if type(C) is cupy_ndarray():
        return C.data.ptr
    if hasattr(C, "data_ptr"):
        return C.data_ptr()
    return C.__cuda_array_interface__["data"][0]


def reordered(op: Operand, order: str, stream) -> Operand:
    """``op``'s elements in a new array, row-major ("C") or column-major ("F"), made by
    the operand's own framework on ``stream`` (the caller's context for CuPy is set)."""
    x = op.obj
    if op.on_host:
        y = np.ascontiguousarray(x) if order == "C" else np.asfortranarray(x)
    elif op.kind == "torch":
        with stream_context(stream):
            y = x.contiguous() if order == "C" else x.t().contiguous().t()
    else:
        xp = backend.array_module()
        x = x if type(x) is cupy_ndarray() else xp.asarray(x)
        y = xp.ascontiguousarray(x) if order == "C" else xp.asfortranarray(x)
    if op.kind == "torch":
        n = describe_torch(y)
    elif op.on_host:
        n = Operand(y, y.shape, y.dtype, order == "C", True, layout=order)
    else:
        n = describe_cupy(y)
        n.kind = op.kind if op.kind != "numba" else "cupy"
    n.dname, n.bf16_from = op.dname, op.bf16_from
    return n


def like_input(C, A):
    """The result in A's own array type, for inputs that came in through NumPy or DLPack
    (a torch CPU tensor, a JAX array); anything else gets the array as computed."""
    torch = torch_module()
    if torch is not None and isinstance(A, torch.Tensor):
        from gemmlib.precision import BF16Array

        if isinstance(C, BF16Array):   # bfloat16 bits (NumPy) -> a torch bfloat16 tensor
            return torch.from_numpy(C.bits.view(np.int16)).view(torch.bfloat16)
        return torch.from_numpy(C) if isinstance(C, np.ndarray) else torch.from_dlpack(C)
    mod = sys.modules.get(type(A).__module__.split(".")[0])
    if mod is not None and mod.__name__ in ("jax", "jaxlib"):
        return sys.modules["jax"].numpy.from_dlpack(C)
    return C
