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
from contextlib import nullcontext
from dataclasses import dataclass
from functools import lru_cache

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
    #: element type by name; "bfloat16" for BF16Array / torch / ml_dtypes data, whose
    #: ``obj`` is then the raw 16-bit patterns
    dname: str = ""

    def __post_init__(self):
        if not self.dname:
            self.dname = _dtype_name(self.dtype)


@lru_cache(maxsize=None)
def _dtype_name(dtype) -> str:
    """``np.dtype(dtype).name``, remembered: NumPy computes the name in Python on every
    access, a noticeable part of a call's host time."""
    return np.dtype(dtype).name


@lru_cache(maxsize=None)
def _np_dtype(name: str) -> np.dtype:
    return np.dtype(name)


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
        return _describe_cupy(x)
    bf16 = _bf16_bits(x)
    if bf16 is not None:  # bfloat16: describe the bit patterns, remember what they are
        op = _describe(bf16, name)
        op.dname = "bfloat16"
        return op
    return _describe_other(x, name)


def _bf16_bits(x):
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


def _describe_cupy(x) -> _Operand:
    nbytes = x.nbytes
    mem = x.data
    return _Operand(x, x.shape, x.dtype, x.flags.c_contiguous, on_host=False, ptr=mem.ptr,
                    nbytes=nbytes, device=mem.device_id if nbytes else None, kind="cupy")


def _describe_other(x, name: str) -> _Operand:
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
    ops = [(a, "A"), (b, "B")] + ([(c, "out")] if c is not None else [])
    for op, name in ops:
        want = spec.dtype if name != "out" else spec.out_dtype
        if op.dname != want or (op.dname != "bfloat16" and op.dtype != _np_dtype(want)):
            what = (f"kernel {spec.name!r} computes in {want}" if name != "out" else
                    f"kernel {spec.name!r} writes {want}")
            raise TypeError(
                f"{name} has dtype {op.dtype if op.dname != 'bfloat16' else 'bfloat16'}, but "
                f"{what}: convert it first (e.g. {name}.astype(np.{want}))"
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
    if stream is None:
        return nullcontext()  # CuPy's current stream, where the kernel goes too
    if hasattr(stream, "ptr"):
        return stream
    return backend.array_module().cuda.ExternalStream(int(stream))  # a numba stream


def matmul(A, B, out=None, *, kernel: str | KernelSpec | None = None, stream=None,
           transpose_b: bool = False, precision: str | None = None):
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

    precision : what the product is computed in (see ``gemmlib.precision``).
        ``None`` (default): the inputs' own type -- float32 exactly, in fp32
        on the CUDA cores; float16 and bfloat16 (torch bf16 tensors,
        ``ml_dtypes.bfloat16`` arrays, ``gemmlib.precision.BF16Array``) on
        the tensor cores, products exact, accumulated in fp32.  For float32
        inputs ``"tf32"`` rounds them to TF32 on the tensor cores (~1e-4
        relative error, about 8x faster), and ``"3xtf32"`` splits each into
        two TF32 parts and issues three tensor-core products: fp32-level
        accuracy at tensor-core speed.  Tensor-core products return float32
        (``out`` must be float32) and compute A @ B (``transpose_b=False``);
        they need sm_80 or newer (``ConstraintError`` otherwise).  The default
        kernel is the autotuned ``mma_pipeline``, and on an H100/H200 for fp16
        and bf16 inputs ``wgmma_ws`` (Hopper's warpgroup MMA fed by TMA, chapter
        17); ``"mma_atom"``, ``"mma_swizzle"``, ``"wgmma_async"`` and
        ``"wgmma_tma"`` are teaching rungs.

    Any M, N, K >= 0 is accepted; nothing needs padding, and indices are
    64-bit (matrices past 2**31 elements work where the grid allows).  A kernel that
    cannot run the problem on this GPU raises ``ConstraintError`` naming the
    constraint, before anything is launched.  The tensor-core pipeline moves
    16-byte pieces: when K or N is not a multiple of 8 (16-bit) or 4 (float32),
    or an operand is not 16-byte aligned, the call first copies A and B into
    zero-padded aligned buffers (the result is the same; the copy costs time).
    """
    if stream is not None:
        _check_stream(stream)
    a, b = _describe(A, "A"), _describe(B, "B")
    c = _describe(out, "out") if out is not None else None
    if precision is None and isinstance(kernel, KernelSpec):
        precision = kernel.precision
    if precision not in (None, "fp32") or _sixteen_bit_default(a, kernel):
        from gemmlib.precision import check_precision

        prec = check_precision(precision, a.dname)
        if prec != "fp32":
            return _tensor_core_call(prec, a, b, c, out, kernel, stream, transpose_b)
    kernel = kernel or _default_kernel(transpose_b)
    # The spec the operand checks read (dtype, B's layout); "auto" resolves per shape below.
    spec = dispatch.get_spec(dispatch.AUTO_RUNG if kernel == dispatch.AUTO else kernel)
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


def _sixteen_bit_default(a: _Operand, kernel) -> bool:
    """16-bit inputs with no fp32 rung named: they run in their own precision.

    Naming a CUDA-core rung with 16-bit inputs (or passing any other dtype)
    falls through to the fp32 checks, whose TypeError names ``astype``.
    """
    if a.dname not in ("float16", "bfloat16"):
        return False
    if kernel is None or (isinstance(kernel, str) and kernel == dispatch.AUTO):
        return True
    return dispatch.get_spec(kernel).precision != "fp32"


def _tensor_core_call(prec, a, b, c, out, kernel, stream, transpose_b):
    """matmul in a tensor-core precision (operands described, precision checked)."""
    if transpose_b:
        raise ValueError("the tensor-core kernels compute A @ B: pass B as (K, N) with "
                         "transpose_b=False")
    kernel = kernel or dispatch.AUTO
    auto = isinstance(kernel, str) and kernel == dispatch.AUTO
    check_spec = (kernel if isinstance(kernel, KernelSpec) else
                  dispatch.get_spec(dispatch.TC_AUTO if auto else kernel, prec))
    if check_spec.precision != prec:
        raise ValueError(f"kernel {check_spec.name!r} computes in {check_spec.precision}, "
                         f"not {prec}")
    M, N, K = _check_operands(check_spec, a, b, c, False)
    backend.require_device()
    spec = dispatch.select_tc(prec, M, N, K) if auto else check_spec
    if a.on_host and not SIMULATOR:  # host in, host out: stage through the GPU
        xp = backend.array_module()
        with _staging_stream(stream):
            C = matmul(*(_to_device(op, xp) for op in (a, b)), kernel=spec, stream=stream)
            result = xp.asnumpy(C)
        if out is None:
            return result
        c.obj[...] = result
        return out
    xp = np if a.on_host else backend.array_module()
    # Every copy below runs on the kernel's stream, in order with the caller's work.
    with _staging_stream(stream) if not a.on_host else nullcontext():
        A_, B_ = _kernel_array(a, xp), _kernel_array(b, xp)
        al = spec.operand_align
        misaligned = not a.on_host and (a.ptr % 16 or b.ptr % 16)
        Kp, Np = K, N
        if al and (K % al or N % al or misaligned):   # stage into zero-padded, aligned copies
            Kp, Np = -(-K // al) * al, -(-N // al) * al
            A_, B_ = _padded(A_, M, Kp, xp), _padded(B_, Kp, Np, xp)
        if out is not None:
            C = out
        elif a.on_host:
            C = np.empty((M, N), dtype=np.float32)
        else:
            C = _allocate_output(M, N, np.float32, numba=a.kind == "numba")
        Ck = C if Np == N else xp.empty((M, Np), dtype=np.float32)
        if M != 0 and N != 0:
            plan = dispatch.plan(spec, M, Np, Kp)  # ConstraintError here
            if a.on_host:  # simulator
                dispatch.launch(plan, A_, B_, Ck, M, Np, Kp, stream=stream)
            else:
                dispatch.run(plan, _ptr(A_), _ptr(B_), _ptr(Ck), dispatch.stream_handle(stream))
            if Ck is not C:  # drop the padded columns (in order on the same stream)
                (C if a.on_host else xp.asarray(C))[...] = Ck[:, :N]
    return C


def _kernel_array(op: _Operand, xp):
    """The operand as an array the kernel can take: raw 16-bit patterns for 16-bit inputs;
    NumPy (simulator, private copy when read-only) or a GPU array."""
    x = op.obj
    if op.on_host:
        if not (x.flags.c_contiguous and x.flags.writeable):
            x = np.array(x, order="C")
        return x.view(np.uint16) if x.dtype.itemsize == 2 else x
    return x if type(x) is _cupy_ndarray() else xp.asarray(x)


def _to_device(op: _Operand, xp):
    """A host operand copied to the GPU (bfloat16 as a BF16Array of its bits)."""
    x = np.ascontiguousarray(op.obj)
    if op.dname == "bfloat16":
        from gemmlib.precision import BF16Array

        return BF16Array(xp.asarray(x.view(np.uint16)))
    return xp.asarray(x)


def _padded(x, rows: int, cols: int, xp):
    """``x`` in the top-left corner of a zero (rows, cols) array of its dtype."""
    p = xp.zeros((rows, cols), dtype=x.dtype)
    p[:x.shape[0], :x.shape[1]] = x
    return p


def _ptr(x) -> int:
    return x.data.ptr if type(x) is _cupy_ndarray() else x.__cuda_array_interface__["data"][0]


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
