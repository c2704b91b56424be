"""What a call may be: the checks every product makes, with errors that name the fix in
the caller's own framework (``x.to(torch.float16)`` for torch, ``x.astype(np.float16)``
otherwise), and the rules that say what type C holds (``out_dtype``, ``out``).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from gemmlib.backend import SIMULATOR
from gemmlib.frontends.describe import describe
from gemmlib.frontends.operand import SIXTEEN, Operand, np_dtype, overlap
from gemmlib.runtime.memory import current_device
from gemmlib.spec import KernelSpec


def contiguous_hint(op: Operand, name: str) -> str:
    """How the caller's framework makes ``name`` row-major."""
    return f"{name}.contiguous()" if op.kind == "torch" else f"cupy.ascontiguousarray({name})"


def astype_hint(op: Operand, name: str, want: str) -> str:
    if op.kind == "torch":
        return f"{name}.to(torch.{want})"
    return f"{name}.astype(np.{want})"


def device_hint(op: Operand, device: int) -> str:
    if op.kind == "torch":
        return (f"call matmul inside `with torch.cuda.device({device}):` "
                f"(or torch.cuda.set_device({device}))")
    return f"call matmul inside `with cupy.cuda.Device({device}):`"


def check_operands(spec: KernelSpec, a: Operand, b: Operand, c: Operand | None,
                   out_dtype: str | None = None):
    """The checks every 2-D product makes; ``b`` is described as the (K, N) matrix it is
    (a column-major B -- ``W.t()`` -- with ``b.layout == "F"``)."""
    for op, name in ((a, "A"), (b, "B")):
        if len(op.shape) != 2:
            raise ValueError(f"{name} must be a 2-D matrix; got shape {op.shape}")
    (M, K), (K2, N) = a.shape, b.shape
    if K != K2:
        raise ValueError(
            f"inner dimensions differ: A is {M}x{K} and B is {K2}x{N}; "
            f"A @ B needs B's rows ({K2}) to equal A's columns ({K})")
    ops = [(a, "A"), (b, "B")] + ([(c, "out")] if c is not None else [])
    for op, name in ops:
        want = spec.dtype if name != "out" else (out_dtype or spec.out_dtype)
        if op.dname != want or (op.dname != "bfloat16" and op.dtype != np_dtype(want)):
            what = (f"kernel {spec.name!r} computes in {want}" if name != "out" else
                    f"kernel {spec.name!r} writes {want}")
            shown = op.dname if op.dname == "bfloat16" or op.kind == "torch" else op.dtype
            raise TypeError(
                f"{name} has dtype {shown}, but "
                f"{what}: convert it first (e.g. {astype_hint(op, name, want)})"
                + ("" if spec.precision == "fp32" or name == "out" else
                   f" or pass precision= for the input's own type"))
    if a.on_host != b.on_host or (c is not None and c.on_host != a.on_host):
        where = ", ".join(f"{n} on {'host' if o.on_host else 'GPU'}" for o, n in ops)
        raise TypeError(
            f"operands must all be NumPy (host) arrays or all GPU arrays; got {where}. "
            f"Move them with cupy.asarray(...) or cupy.asnumpy(...)")
    if c is not None:
        if c.shape != (M, N):
            raise ValueError(f"out has shape {c.shape}, but A @ B has shape {(M, N)}")
        if isinstance(c.obj, np.ndarray) and not c.obj.flags.writeable:
            raise ValueError("out is read-only; pass a writeable array or None")
        if not c.c_contiguous:
            raise ValueError("out must be C-contiguous (row-major); pass a fresh array "
                             f"(e.g. {'torch.empty' if c.kind == 'torch' else 'cupy.empty'}"
                             "((M, N), ...)) or None")
        for op, name in ((a, "A"), (b, "B")):
            if overlap(c, op):
                raise ValueError(
                    f"out shares memory with {name}: the kernel would overwrite its own input "
                    f"while reading it. Pass a separate output array")
    if not a.on_host:
        current = current_device()
        for op, name in ops:
            if op.device is not None and op.device != current:
                raise ValueError(
                    f"{name} lives on GPU {op.device} but the current device is GPU {current}: "
                    + device_hint(op, op.device))
    return M, N, K


def check_stream(stream) -> None:
    """Refuse anything that is not a CuPy, numba or torch stream before it reaches a launch."""
    if stream is None or hasattr(stream, "ptr"):  # CuPy (and a RawStream)
        return
    if hasattr(stream, "synchronize") and (hasattr(stream, "handle") or SIMULATOR):  # numba
        return
    if hasattr(stream, "cuda_stream") and hasattr(stream, "synchronize"):  # torch.cuda.Stream
        return
    raise TypeError(f"stream must be a CuPy, numba or torch stream, not {type(stream).__name__}")


#: the FP8 formats (``precision=``)
FP8 = ("e4m3", "e5m2")

#: ``out_dtype`` spellings, by the element type they name
OUT_NAMES = {"float32": "float32", "fp32": "float32", "float16": "float16",
             "fp16": "float16", "half": "float16", "bfloat16": "bfloat16", "bf16": "bfloat16"}


@lru_cache(maxsize=256)
def out_name(out_dtype) -> str:
    """``out_dtype`` (a torch or NumPy dtype, a type, a name) as "float32", "float16" or
    "bfloat16"; ValueError for anything else."""
    if isinstance(out_dtype, str):
        name = out_dtype
    elif str(out_dtype).startswith("torch."):
        name = str(out_dtype)[6:]
    else:
        try:
            name = np.dtype(out_dtype).name   # numpy/cupy float16, ml_dtypes.bfloat16
        except TypeError:
            name = str(out_dtype)
    if name not in OUT_NAMES:
        raise ValueError(f"out_dtype must be float32 or the inputs' own 16-bit type "
                         f"(torch.float16, torch.bfloat16, numpy.float16, or 'float16', "
                         f"'fp16', 'bfloat16', 'bf16'); got {out_dtype!r}")
    return OUT_NAMES[name]


def out_type(out_dtype, a: Operand, c: Operand | None) -> str | None:
    """What C holds, from ``out_dtype`` and ``out`` (described as ``c``): None (float32:
    float32 inputs, or an ``out`` of float32), "float32" (asked for), "float16" or
    "bfloat16" (the inputs' own type: the default for 16-bit inputs, as torch.matmul)."""
    want = None if out_dtype is None else out_name(out_dtype)
    if want is None:
        if c is None:
            return a.dname if a.dname in SIXTEEN else None
        if c.dname in SIXTEEN and a.dname in SIXTEEN:
            if c.dname != a.dname:
                raise TypeError(f"out holds {c.dname}; a product of {a.dname} inputs is "
                                f"written as float32 or {a.dname}")
            return c.dname
        return None
    if want in SIXTEEN and a.dname != want:
        raise TypeError(f"out_dtype={want} needs {want} inputs (a product is written as "
                        f"float32 or in its inputs' own 16-bit type); A is {a.dname}")
    if c is not None and c.dname != want:
        raise TypeError(f"out holds {c.dname}, but out_dtype is {want}: pass an out of "
                        f"that dtype, or leave out_dtype None")
    return want


def describe_bias(bias, a: Operand, N: int) -> Operand:
    """The bias row, checked: N values of the inputs' type (float32 for float32 inputs),
    contiguous, where the inputs are."""
    z = describe(bias, "bias")
    if tuple(z.shape) not in ((N,), (1, N)):
        raise ValueError(f"bias has shape {tuple(z.shape)}; a product with N = {N} columns "
                         f"takes a bias of shape ({N},)")
    want = a.dname if a.dname in SIXTEEN else "float32"
    if z.dname != want:
        raise TypeError(f"bias has dtype {z.dname}, but the inputs are {a.dname}: pass it as "
                        f"{astype_hint(z, 'bias', want)}")
    if z.on_host != a.on_host:
        raise TypeError("bias must be where A and B are (all on the GPU or all on the host)")
    if not z.on_host:
        if not z.c_contiguous:
            raise ValueError(f"bias is not contiguous: pass {contiguous_hint(z, 'bias')}")
        if z.device is not None and a.device is not None and z.device != a.device:
            raise ValueError(f"bias lives on GPU {z.device} but A on GPU {a.device}")
    return z
