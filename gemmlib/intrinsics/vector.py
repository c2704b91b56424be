"""16-byte (float4) loads and stores, which numba-cuda has no API for.

A GPU moves memory most efficiently in 16-byte pieces: one ``ld.global.v4.f32``
brings four floats where four ``ld.global.f32`` would cost four instructions
(and four times the address arithmetic).  numba-cuda offers ``float32x4`` only
as a register value type, so this module writes the load itself, as an
``@intrinsic``: a function whose body is LLVM IR that numba pastes into the
kernel.  The IR takes the address of ``arr[i, j]``, reinterprets it as a
pointer to ``<4 x float>`` and loads (or stores) it with ``align 16``; NVVM
turns that into ``ld.global.v4.f32`` for a global array and
``ld.shared.v4.f32`` for a shared one.

The contract, which the caller must keep (the hardware does not forgive it):

* ``arr`` is a C-contiguous 2-D float32 array (or the ``pitched`` view of one:
  :mod:`gemmlib.intrinsics.pitch`), and the four elements ``arr[i, j:j+4]`` lie in
  the same row;
* the address of ``arr[i, j]`` is a multiple of 16 bytes.  For a row-major
  matrix with ``n`` columns that needs ``n % 4 == 0``, ``j % 4 == 0`` and a
  16-byte-aligned base pointer (:func:`aligned16` checks the last one at run
  time).  Shared arrays get 16-byte alignment from
  ``cuda.shared.array(..., alignment=SHARED_ALIGN)``.

An intrinsic does not run in numba's simulator, so every function here has a
plain-Python twin that the simulator uses instead.  The twins also *check*
the contract (alignment and staying inside the row), so a kernel that would
fault on a GPU fails loudly in CI.

Functions (all usable inside ``@cuda.jit`` kernels):

``load4(arr, i, j) -> (a, b, c, d)``
    the four floats ``arr[i, j:j+4]``
``store4(arr, i, j, a, b, c, d)``
    write four floats to ``arr[i, j:j+4]``
``aligned16(arr) -> bool``
    whether ``arr``'s data pointer is a multiple of 16 bytes -- and, for a ``pitched``
    view (:mod:`gemmlib.intrinsics.pitch`), its row stride too: every row starts aligned
``store2(arr, i, j, a, b)`` / ``aligned8(arr) -> bool``
    the 8-byte forms (``st.global.v2.f32``): two floats to ``arr[i, j:j+2]``, for
    ``j`` even, an even row length and an 8-byte-aligned base pointer
``load4_or_zero(arr, i, j, vec) -> (a, b, c, d)``
    ``arr[i, j:j+4]`` with zeros for the elements outside ``arr``: one float4
    load when ``vec`` (the caller has checked that ``arr``'s rows are 16-byte
    aligned), four guarded scalar loads otherwise.  This is how the tiled
    kernels copy a chunk of a tile whatever the matrix's shape.
"""

from __future__ import annotations

from gemmlib.backend import SIMULATOR, cuda, float32
from gemmlib.intrinsics.index import uidx
from gemmlib.intrinsics.pitch import read

#: Pass as ``alignment=`` to ``cuda.shared.array``: 16 on a GPU; None in the
#: simulator, which raises on any alignment (its NumPy arrays are aligned anyway).
SHARED_ALIGN = None if SIMULATOR else 16


class MisalignedAccess(RuntimeError):
    """A float4 access the GPU would reject (raised by the simulator twins only)."""


# --------------------------------------------------------------------------
# Plain-Python twins (simulator)


def _ndarray(arr):
    """The NumPy array behind a simulator kernel argument (or the array itself)."""
    seen = 0
    while not hasattr(arr, "ctypes") and seen < 4:
        inner = getattr(arr, "_item", None)
        if inner is None:
            inner = getattr(arr, "_ary", None)
        if inner is None:
            return None
        arr = inner
        seen += 1
    return arr if hasattr(arr, "ctypes") else None


def _check(arr, i, j, what):
    a = _ndarray(arr)
    if j < 0 or j + 4 > arr.shape[1]:
        raise MisalignedAccess(f"{what}: columns {j}..{j + 3} leave a row of {arr.shape[1]}")
    if a is None:
        return
    addr = a.ctypes.data + int(i) * a.strides[0] + int(j) * a.strides[1]  # no int32 wrap
    if addr % 16:
        raise MisalignedAccess(
            f"{what}: element [{i}, {j}] is at an address that is not a multiple of 16 "
            f"(row stride {a.strides[0]} bytes): the GPU would fault on this float4 access")


def load4_py(arr, i, j):
    _check(arr, i, j, "load4")
    return arr[i, j], arr[i, j + 1], arr[i, j + 2], arr[i, j + 3]


def store4_py(arr, i, j, a, b, c, d):
    _check(arr, i, j, "store4")
    arr[i, j] = a
    arr[i, j + 1] = b
    arr[i, j + 2] = c
    arr[i, j + 3] = d


def _aligned_py(nbytes: int):
    def aligned(arr):
        a = _ndarray(arr)
        if a is None:
            return True
        pitched = a.ndim == 2 and not a.flags.c_contiguous   # a pitched view's rows
        return a.ctypes.data % nbytes == 0 and not (pitched and a.strides[0] % nbytes)

    aligned.__name__ = f"aligned{nbytes}_py"
    return aligned


def _pair_store_py(name: str, itemsize: int):
    """Twin of ``_pair_store``: ``arr[i, j:j+2] = a, b``, refusing what the GPU store
    could not do (a misaligned pair, a pair that leaves the row)."""
    def store(arr, i, j, a, b):
        x = _ndarray(arr)
        if x is not None and (x.ctypes.data + (i * x.shape[1] + j) * itemsize) % (2 * itemsize):
            raise MisalignedAccess(f"{name} at [{i}, {j}] is not {2 * itemsize}-byte aligned")
        if j + 2 > arr.shape[1]:
            raise MisalignedAccess(f"{name} at [{i}, {j}] leaves the row ({arr.shape[1]} "
                                   "columns)")
        arr[i, j] = a
        arr[i, j + 1] = b

    store.__name__ = f"{name}_py"
    return store


aligned4_py, aligned8_py, aligned16_py = _aligned_py(4), _aligned_py(8), _aligned_py(16)
store2_py = _pair_store_py("store2", 4)
store2_u16_py = _pair_store_py("store2_u16", 2)


# --------------------------------------------------------------------------
# The intrinsics (GPU)


def _make_intrinsics():
    from llvmlite import ir
    from numba import types
    from numba.cuda import cgutils
    from numba.cuda.core.errors import NumbaTypeError
    from numba.cuda.extending import intrinsic

    from gemmlib.intrinsics._lower import item_pointer

    f4 = ir.VectorType(ir.FloatType(), 4)
    f2 = ir.VectorType(ir.FloatType(), 2)

    def _check_array(arr, i, j, name):
        # "A": a pitched view (gemmlib.intrinsics.pitch), rows of unit stride
        if not (isinstance(arr, types.Array) and arr.ndim == 2 and arr.dtype == types.float32
                and arr.layout in "CA"):
            raise NumbaTypeError(f"{name} needs a C-contiguous or pitched 2-D float32 array, "
                                 f"got {arr}")
        if not (isinstance(i, types.Integer) and isinstance(j, types.Integer)):
            raise NumbaTypeError(f"{name} needs integer indices, got {i}, {j}")

    def _vector_pointer(context, builder, sig, args, vec=f4):
        """Address of arr[i, j] (no bounds check), as a <4 x float>* (or ``vec``*) in its
        address space."""
        aryty, ity, jty = sig.args[:3]
        ary = context.make_array(aryty)(context, builder, args[0])
        inds = [context.cast(builder, args[1], ity, types.intp),
                context.cast(builder, args[2], jty, types.intp)]
        ptr = item_pointer(context, builder, aryty, ary, inds)
        return builder.bitcast(ptr, ir.PointerType(vec, addrspace=ptr.type.addrspace))

    @intrinsic
    def load4(typingctx, arr, i, j):
        _check_array(arr, i, j, "load4")
        sig = types.UniTuple(types.float32, 4)(arr, i, j)

        def codegen(context, builder, sig, args):
            vec = builder.load(_vector_pointer(context, builder, sig, args), align=16)
            vals = [builder.extract_element(vec, ir.Constant(ir.IntType(32), e))
                    for e in range(4)]
            return context.make_tuple(builder, sig.return_type, vals)

        return sig, codegen

    @intrinsic
    def store4(typingctx, arr, i, j, a, b, c, d):
        _check_array(arr, i, j, "store4")
        sig = types.void(arr, i, j, types.float32, types.float32, types.float32, types.float32)

        def codegen(context, builder, sig, args):
            vec = ir.Constant(f4, ir.Undefined)
            for e in range(4):
                val = context.cast(builder, args[3 + e], sig.args[3 + e], types.float32)
                vec = builder.insert_element(vec, val, ir.Constant(ir.IntType(32), e))
            builder.store(vec, _vector_pointer(context, builder, sig, args), align=16)
            return context.get_dummy_value()

        return sig, codegen

    def _pair_store(name, numba_type, vec, align):
        """An intrinsic f(arr, i, j, a, b): ``arr[i, j:j+2] = a, b`` in one ``align``-byte
        store (``arr`` a C-contiguous 2-D array of ``numba_type``)."""
        def typer(typingctx, arr, i, j, a, b):
            if not (isinstance(arr, types.Array) and arr.ndim == 2 and arr.dtype == numba_type
                    and arr.layout == "C"):
                raise NumbaTypeError(f"{name} needs a C-contiguous 2-D {numba_type} array, "
                                     f"got {arr}")
            if not (isinstance(i, types.Integer) and isinstance(j, types.Integer)):
                raise NumbaTypeError(f"{name} needs integer indices, got {i}, {j}")
            sig = types.void(arr, i, j, numba_type, numba_type)

            def codegen(context, builder, sig, args):
                v = ir.Constant(vec, ir.Undefined)
                for e in range(2):
                    val = context.cast(builder, args[3 + e], sig.args[3 + e], numba_type)
                    v = builder.insert_element(v, val, ir.Constant(ir.IntType(32), e))
                builder.store(v, _vector_pointer(context, builder, sig, args, vec), align=align)
                return context.get_dummy_value()

            return sig, codegen
        typer.__name__ = name
        return intrinsic(typer)

    store2 = _pair_store("store2", types.float32, f2, 8)
    # two bf16 bit patterns in one 4-byte store
    store2_u16 = _pair_store("store2_u16", types.uint16, ir.VectorType(ir.IntType(16), 2), 4)

    def _aligned(nbytes):
        @intrinsic
        def aligned(typingctx, arr):
            if not isinstance(arr, types.Array):
                raise NumbaTypeError(f"aligned{nbytes} needs an array, got {arr}")
            sig = types.boolean(arr)

            def codegen(context, builder, sig, args):
                aty = sig.args[0]
                ary = context.make_array(aty)(context, builder, args[0])
                addr = builder.ptrtoint(ary.data, ir.IntType(64))
                if aty.layout == "A" and aty.ndim == 2:   # a pitched view: its rows too
                    pitch = cgutils.unpack_tuple(builder, ary.strides, 2)[0]
                    addr = builder.or_(addr, builder.sext(pitch, ir.IntType(64)))
                low = builder.and_(addr, ir.Constant(ir.IntType(64), nbytes - 1))
                return builder.icmp_unsigned("==", low, ir.Constant(ir.IntType(64), 0))

            return sig, codegen

        return aligned

    return load4, store4, _aligned(16), store2, _aligned(8), store2_u16, _aligned(4)


if SIMULATOR:
    load4, store4, aligned16 = load4_py, store4_py, aligned16_py
    store2, aligned8 = store2_py, aligned8_py
    store2_u16, aligned4 = store2_u16_py, aligned4_py
else:
    load4, store4, aligned16, store2, aligned8, store2_u16, aligned4 = _make_intrinsics()


# --------------------------------------------------------------------------
# Built from the above (a device function: the same code in both modes)


def _load4_or_zero(arr, i, j, vec):
    """``arr[i, j:j+4]``, zero where outside ``arr``; one float4 load when ``vec``.

    ``vec`` is a uniform, once-per-launch decision (the row length is a
    multiple of 4 and the base pointer 16-byte aligned).  Then a chunk starting
    at a multiple of 4 is either wholly inside the matrix or wholly outside, so
    one bounds check covers it.  Otherwise each element is checked and loaded
    on its own.  Indices are >= 0 (``uidx``: see gemmlib.intrinsics.index).  ``arr``
    may be a ``pitched`` view (gemmlib.intrinsics.pitch).
    """
    rows, cols = arr.shape
    if vec:
        if i < rows and j < cols:
            return load4(arr, i, j)
        return float32(0.0), float32(0.0), float32(0.0), float32(0.0)
    inside = i < rows
    v0 = read(arr, uidx(i), uidx(j)) if inside and j < cols else float32(0.0)
    v1 = read(arr, uidx(i), uidx(j + 1)) if inside and j + 1 < cols else float32(0.0)
    v2 = read(arr, uidx(i), uidx(j + 2)) if inside and j + 2 < cols else float32(0.0)
    v3 = read(arr, uidx(i), uidx(j + 3)) if inside and j + 3 < cols else float32(0.0)
    return v0, v1, v2, v3


load4_or_zero = cuda.jit(device=True)(_load4_or_zero)

__all__ = ["load4", "store4", "aligned16", "store2", "aligned8", "load4_or_zero", "SHARED_ALIGN",
           "MisalignedAccess", "load4_py", "store4_py", "aligned16_py", "store2_py",
           "aligned8_py"]
