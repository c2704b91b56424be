"""``gemmlib.matmul``: checks the operands, then hands them to the dispatch layer.

What a call costs the caller is mostly host time for small and medium
problems, so the common case -- CuPy arrays in, CuPy array (or ``out=``) --
takes a short path: operands are described from CuPy's own attributes (no
``__cuda_array_interface__`` dict, no pointer queries), the launch plan is a
dict lookup (:func:`gemmlib.dispatch.plan`) and the launch one driver call
(:func:`gemmlib.dispatch.run`).  Every check of the long path still runs,
with the same messages.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np

from gemmlib import backend, dispatch
from gemmlib.backend import SIMULATOR, cuda
from gemmlib.spec import KernelSpec

#: The kernel ``matmul`` uses when none is named: the autotuned fastest rung
#: (gemmlib.autotune; the warptile default where no tuning data exists).
DEFAULT_KERNEL = "auto"


def _default_kernel(transpose_b: bool) -> str:
    """The kernel for a call that names none.

    A @ B: the autotuned choice.  A @ B.T (B given K-major): the fastest rung
    that takes B that way and runs on this GPU (cp.async needs sm_80).
    """
    if not transpose_b:
        return DEFAULT_KERNEL
    backend.require_device()
    return "double_buffer" if backend.device_info().compute_capability >= (8, 0) else "layout_nt"


@dataclass
class _Operand:
    """What matmul needs to know about one array, whatever library made it."""

    obj: object  # the array as the kernel will receive it
    shape: tuple
    dtype: np.dtype
    c_contiguous: bool
    on_host: bool
    ptr: int = 0
    nbytes: int = 0
    device: int | None = None
    kind: str = "numpy"  # numpy | cupy | numba | other


def _c_contiguous(shape, strides, itemsize) -> bool:
    expected = itemsize
    for n, s in zip(reversed(shape), reversed(strides)):
        if n > 1 and s != expected:
            return False
        expected *= n
    return True


#: DLPack device types whose memory the CPU reads directly (kDLCPU, kDLCUDAHost).
_DLPACK_HOST = (1, 3)


def _dlpack_on_host(x) -> bool:
    """True for a DLPack producer whose data is in host memory (e.g. a torch CPU tensor)."""
    try:
        return int(x.__dlpack_device__()[0]) in _DLPACK_HOST
    except Exception:
        return False


_CUPY_NDARRAY = None  # cupy.ndarray, once CuPy is imported (never in the simulator)


def _cupy_ndarray():
    global _CUPY_NDARRAY
    if _CUPY_NDARRAY is None and not SIMULATOR and "cupy" in sys.modules:
        _CUPY_NDARRAY = sys.modules["cupy"].ndarray
    return _CUPY_NDARRAY


def _describe(x, name: str) -> _Operand:
    if type(x) is _cupy_ndarray():  # the common case, cheaply
        nbytes = x.nbytes
        mem = x.data
        return _Operand(x, x.shape, x.dtype, x.flags.c_contiguous, on_host=False, ptr=mem.ptr,
                        nbytes=nbytes, device=mem.device_id if nbytes else None, kind="cupy")
    if (not isinstance(x, np.ndarray) and not hasattr(x, "__cuda_array_interface__")
            and not type(x).__module__.startswith("numba")  # the simulator's device arrays
            and hasattr(x, "__dlpack__") and _dlpack_on_host(x)):
        x = np.from_dlpack(x)  # e.g. a torch CPU tensor: a host array, zero-copy
    if isinstance(x, np.ndarray):
        return _Operand(x, x.shape, x.dtype, x.flags.c_contiguous, on_host=True)
    if SIMULATOR:
        raise TypeError(
            f"{name}: in the simulator gemmlib works on NumPy arrays; got {type(x).__name__}")
    if not hasattr(x, "__cuda_array_interface__") and hasattr(x, "__dlpack__"):
        x = backend.array_module().from_dlpack(x)  # e.g. a JAX array; zero-copy
    if not hasattr(x, "__cuda_array_interface__"):
        raise TypeError(
            f"{name} must be a NumPy array or a GPU array (CuPy, numba, or anything with "
            f"__cuda_array_interface__ or __dlpack__, such as a torch tensor); "
            f"got {type(x).__name__}")
    cai = x.__cuda_array_interface__
    shape = tuple(cai["shape"])
    dtype = np.dtype(cai["typestr"])
    strides = cai.get("strides") or None
    contiguous = True if strides is None else _c_contiguous(shape, strides, dtype.itemsize)
    ptr = int(cai["data"][0])
    nbytes = int(np.prod(shape)) * dtype.itemsize
    device = None
    if ptr and nbytes:
        device = backend.array_module().cuda.runtime.pointerGetAttributes(ptr).device
    kind = "numba" if cuda.is_cuda_array(x) and type(x).__module__.startswith("numba") else (
        "cupy" if type(x).__module__.startswith("cupy") else "other")
    return _Operand(x, shape, dtype, contiguous, on_host=False, ptr=ptr, nbytes=nbytes,
                    device=device, kind=kind)


def _overlap(a: _Operand, b: _Operand) -> bool:
    if a.on_host:
        return np.shares_memory(a.obj, b.obj)
    return a.nbytes > 0 and b.nbytes > 0 and a.ptr < b.ptr + b.nbytes and b.ptr < a.ptr + a.nbytes


def _check_operands(spec: KernelSpec, a: _Operand, b: _Operand, c: _Operand | None,
                    transpose_b: bool = False):
    for op, name in ((a, "A"), (b, "B")):
        if len(op.shape) != 2:
            raise ValueError(f"{name} must be a 2-D matrix; got shape {op.shape}")
    want_b = "NK" if transpose_b else "KN"
    if spec.b_operand != want_b:
        raise ValueError(
            f"kernel {spec.name!r} computes " + ("A @ B.T from B of shape (N, K); call it "
            "with transpose_b=True" if spec.b_operand == "NK" else
            "A @ B from B of shape (K, N); call it with transpose_b=False"))
    (M, K) = a.shape
    (N, K2) = b.shape if transpose_b else b.shape[::-1]
    if K != K2:
        expr = "A @ B.T needs B's columns" if transpose_b else "A @ B needs B's rows"
        raise ValueError(
            f"inner dimensions differ: A is {M}x{K} and B is {b.shape[0]}x{b.shape[1]}; "
            f"{expr} ({K2}) to equal A's columns ({K})")
    want = np.dtype(spec.dtype)
    ops = [(a, "A"), (b, "B")] + ([(c, "out")] if c is not None else [])
    for op, name in ops:
        if op.dtype != want:
            raise TypeError(
                f"{name} has dtype {op.dtype}, but kernel {spec.name!r} computes in {want}: "
                f"convert it first (e.g. {name}.astype(np.{want}))")
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
            raise ValueError("out must be C-contiguous (row-major); pass a fresh array or None")
        for op, name in ((a, "A"), (b, "B")):
            if _overlap(c, op):
                raise ValueError(
                    f"out shares memory with {name}: the kernel would overwrite its own input "
                    f"while reading it. Pass a separate output array")
    if not a.on_host:
        for op, name in ((a, "A"), (b, "B")):
            if not op.c_contiguous:
                raise ValueError(
                    f"{name} is not C-contiguous (a transposed or strided view?): the kernels "
                    f"read row-major memory directly. Pass cupy.ascontiguousarray({name})")
        current = backend.array_module().cuda.runtime.getDevice()
        for op, name in ops:
            if op.device is not None and op.device != current:
                raise ValueError(
                    f"{name} lives on GPU {op.device} but the current device is GPU {current}: "
                    f"call matmul inside `with cupy.cuda.Device({op.device}):`")
    return M, N, K


def _check_stream(stream) -> None:
    """Refuse anything that is not a CuPy or numba stream before it reaches a launch."""
    if stream is None or hasattr(stream, "ptr"):  # CuPy
        return
    if hasattr(stream, "synchronize") and (hasattr(stream, "handle") or SIMULATOR):  # numba
        return
    hint = ""
    if hasattr(stream, "cuda_stream"):  # torch.cuda.Stream
        hint = "; wrap a torch stream as cupy.cuda.ExternalStream(s.cuda_stream)"
    raise TypeError(f"stream must be a CuPy or numba stream, not {type(stream).__name__}{hint}")


def _staging_stream(stream):
    """The CuPy stream the host path copies on: the one the kernel runs on.

    Copies on another stream would not be ordered with the kernel when the
    caller's stream is non-blocking (the result could be read back before
    the kernel has written it).
    """
    from contextlib import nullcontext

    if stream is None:
        return nullcontext()  # CuPy's current stream, where the kernel goes too
    if hasattr(stream, "ptr"):
        return stream
    return backend.array_module().cuda.ExternalStream(int(stream))  # a numba stream


def matmul(A, B, out=None, *, kernel: str | KernelSpec | None = None, stream=None,
           transpose_b: bool = False):
    """C = A @ B (or A @ B.T with ``transpose_b=True``) with one of gemmlib's kernels.

    Parameters
    ----------
    A, B : 2-D arrays, (M, K) and (K, N), float32.
        GPU arrays -- CuPy, numba device arrays, or anything exposing
        ``__cuda_array_interface__`` or ``__dlpack__`` (torch, JAX) -- are
        used in place and must be C-contiguous (row-major): a transposed,
        Fortran-order, strided or broadcast view is refused with a message
        naming ``ascontiguousarray``, not silently copied.  A C-contiguous
        view with an offset (``A[3:]``, a sub-buffer not 16-byte aligned) is
        fine: kernels that move float4s check alignment and fall back.  A
        torch tensor that requires grad is refused by torch itself (detach
        it).  Arrays on a GPU other than the current one are refused, naming
        ``cupy.cuda.Device``.
        Host arrays -- NumPy arrays of any strides (transposed, sliced,
        Fortran order, negative or zero strides, read-only) and host DLPack
        producers such as torch CPU tensors -- are copied to the GPU and the
        result comes back as NumPy; the copies run on ``stream``, in order
        with the kernel.  Mixing host and GPU operands is refused.
        Any other dtype (float64, float16, byte-swapped '>f4', ...) is
        refused with a TypeError naming ``astype``.
    out : optional array of shape (M, N), same dtype and place as A and B,
        C-contiguous and writeable.  Must not share memory with A or B
        (refused: the kernel would overwrite its input while reading it).
        Written in place and returned.  Allocated when None: a numba device
        array when A is one, else CuPy (also for torch inputs; pass a torch
        ``out`` to get one back).  An output that does not fit in GPU memory
        raises ``MemoryError`` with its size.
    kernel : rung name (see ``gemmlib.list_kernels()``), a KernelSpec, or
        ``"auto"`` (the default): the configuration the autotuner measured
        fastest for this GPU and shape class, with K split into slices when
        the output alone cannot fill the GPU (see ``gemmlib.dispatch.select``).
        With ``transpose_b=True`` the default is the fastest rung that takes
        B as (N, K).  Each configuration is compiled once per process and its
        machine code cached on disk (``gemmlib.dispatch``).
    stream : CuPy or numba stream to launch on; default CuPy's current stream.
        Anything else is refused with a TypeError (wrap a torch stream as
        ``cupy.cuda.ExternalStream(s.cuda_stream)``).  The call returns
        without waiting for GPU inputs and outputs; host results are ready.
    transpose_b : if True, B is given as (N, K), row-major (K-major, the
        layout of the CuTe chapters), and C = A @ B.T.  Only kernels whose
        spec says ``b_operand="NK"`` take it.

    Any M, N, K >= 0 is accepted; nothing needs padding, and indices are
    64-bit (matrices past 2**31 elements work where the grid allows).  A kernel that
    cannot run the problem on this GPU raises ``ConstraintError`` naming the
    constraint, before anything is launched.
    """
    kernel = kernel or _default_kernel(transpose_b)
    # The spec the operand checks read (dtype, B's layout); "auto" resolves per shape below.
    spec = dispatch.get_spec(dispatch.AUTO_RUNG if kernel == dispatch.AUTO else kernel)
    if stream is not None:
        _check_stream(stream)
    a, b = _describe(A, "A"), _describe(B, "B")
    c = _describe(out, "out") if out is not None else None
    M, N, K = _check_operands(spec, a, b, c, transpose_b)
    backend.require_device()
    plan = dispatch.plan(kernel, M, N, K)  # the constraint check (ConstraintError) is here

    if a.on_host and not SIMULATOR:  # host in, host out: stage through the GPU
        xp = backend.array_module()
        with _staging_stream(stream):  # copies in, kernel, copy out: one stream, in order
            C = matmul(xp.asarray(np.ascontiguousarray(a.obj)),
                       xp.asarray(np.ascontiguousarray(b.obj)),
                       kernel=plan.spec, stream=stream, transpose_b=transpose_b)
            result = xp.asnumpy(C)  # blocking: waits for the kernel
        if out is None:
            return result
        c.obj[...] = result
        return out

    if a.on_host:  # simulator: kernels run on NumPy arrays directly
        # The simulator copies every argument back after the launch: read-only
        # inputs (np.broadcast_to, frozen arrays) need a private copy.
        A_, B_ = (x if x.flags.c_contiguous and x.flags.writeable else np.array(x, order="C")
                  for x in (a.obj, b.obj))
        C = c.obj if out is not None else np.empty((M, N), dtype=plan.spec.dtype)
        if M != 0 and N != 0:  # else nothing to compute (K == 0 launches: C must become zeros)
            dispatch.launch(plan, A_, B_, C, M, N, K, stream=stream)
        return C

    if out is not None:
        C, c_ptr = out, c.ptr
    else:
        C = _allocate_output(M, N, plan.spec.dtype, numba=a.kind == "numba")
        c_ptr = C.data.ptr if a.kind != "numba" else C.__cuda_array_interface__["data"][0]
    if M != 0 and N != 0:  # else nothing to compute (K == 0 launches: C must become zeros)
        dispatch.run(plan, a.ptr, b.ptr, c_ptr, dispatch.stream_handle(stream))
    return C


def _allocate_output(M: int, N: int, dtype, numba: bool):
    """C on the GPU (numba when A is numba, else CuPy); a clear MemoryError when it cannot fit."""
    try:
        if numba:
            return cuda.device_array((M, N), dtype=dtype)
        return backend.array_module().empty((M, N), dtype=dtype)
    except Exception as e:
        if not (isinstance(e, MemoryError) or "OUT_OF_MEMORY" in str(e).upper()
                or "out of memory" in str(e).lower()):
            raise
        size = M * N * np.dtype(dtype).itemsize
        raise MemoryError(
            f"out of GPU memory allocating C ({M} x {N} {np.dtype(dtype)}, "
            f"{size / 2**30:.2f} GiB): "
            f"{e}. Free memory (e.g. cupy.get_default_memory_pool().free_all_blocks()), "
            f"split the problem, or pass a preallocated out=") from e


def launch(spec: KernelSpec, A, B, C, M: int, N: int, K: int, stream=None) -> None:
    """Launch ``spec`` on arrays the kernel can take as they are (no operand checks)."""
    dispatch.launch(spec, A, B, C, M, N, K, stream=stream)
