"""Operands that are slices of a wider matrix: rows further apart than their length.

A caller's ``x[:, :k]`` or ``big[:, 5:5 + k]`` -- or the transpose of one, read as its
row-major memory -- is a 2-D view whose rows have unit stride and start ``ld`` elements
apart, ld more than its columns.  The runtime hands such an operand to the kernel as it
lies: numba's array words carry its shape, and the row pitch in bytes in its first
strides word (:mod:`gemmlib.runtime.launch`).  But the kernels are compiled for
C-contiguous arrays (:mod:`gemmlib.runtime.compile`), which numba addresses as
``(i * shape[1] + j) * itemsize``: their strides words are never read.  A rung's build
for such operands (``PITCHED=True``: ``gemmlib.runtime.select.with_pitch``) reads them
through one more view, its packed build through none (``view = pitched if PITCHED else
packed``: a compile-time choice, so a packed call's kernel is what it always was --
registers are scarce in the tiled rungs, and a view that steps by the strides word costs
some):

``pitched(arr)``
    ``arr`` addressed by its strides: the same shape, row ``i`` at ``i * strides[0]``
    bytes (for a packed array a row's length: the same elements), a row's elements
    ``itemsize`` apart.  Indexing it, ``load4``, ``load16`` and ``cp.async`` read the
    slice where it lies.  A 16-byte access needs ``strides[0]`` (as well as the base
    pointer) to keep every row 16-byte aligned, which a kernel tests once per launch
    (``gemmlib.intrinsics.vector.aligned16`` of the view checks both).
    The view is numba's "A" layout with the element step a constant: an address is
    ``data + i * strides[0] + j * itemsize``, the strides word read as a kernel
    parameter as the shape word was.

``packed(arr)``
    ``arr`` itself: the packed build's view.

``read(arr, i, j)``
    ``arr[i, j]`` addressed as the 16-byte intrinsics address it: indexing a pitched view
    directly works too, but numba computes that address as an integer, and NVVM then
    issues a generic ``ld`` where a global array's element is read by ``ld.global``.  On a
    C-contiguous array it compiles to what ``arr[i, j]`` does.

In the simulator the runtime passes such an operand as :func:`simulated_argument`, which
reads as the GPU's argument does -- indexed directly, row ``i`` starts ``i * shape[1]``
elements in, into the gap and the rows below -- while its ``strides`` are the true ones:
a kernel that forgets ``pitched`` reads the wrong data in CI too.  The twin of ``pitched``
returns the slice itself (a NumPy view: a read past its columns raises), whose true
addresses the twins of the 16-byte accesses check.
"""

from __future__ import annotations

import numpy as np

from gemmlib.backend import SIMULATOR


def pitched_py(arr):
    item = getattr(arr, "__dict__", {}).get("_item", arr)   # inside a simulated kernel
    view = getattr(item, "pitched_view", None)
    return arr if view is None else view


def packed_py(arr):
    return arr


def read_py(arr, i, j):
    return arr[i, j]


def simulated_argument(view: np.ndarray):
    """A 2-D NumPy view whose rows have unit stride and lie further apart than a row, as
    the simulator's kernel argument (:class:`PitchedArgument`), its memory not copied."""
    return PitchedArgument(view)


def _packed_reading(view: np.ndarray) -> np.ndarray:
    """The memory at ``view``'s first element read as a packed array of its shape: what a
    GPU kernel indexing a C-contiguous argument reads (inside the view's span: the rows
    are at least a row apart)."""
    cols = view.shape[1]
    return np.lib.stride_tricks.as_strided(view, view.shape, (cols * view.itemsize,
                                                              view.itemsize), writeable=False)


if SIMULATOR:
    from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

    class PitchedArgument(FakeCUDAArray):
        """A slice of a wider matrix as a simulated kernel argument, read as a GPU kernel
        reads it: indexed directly (numba's C-contiguous addressing, which ignores the
        strides) row ``i`` starts at ``i * cols``; ``strides`` are the slice's, which
        :func:`pitched` steps by, and ``pitched_view`` the slice itself."""

        def __init__(self, view: np.ndarray):
            super().__init__(_packed_reading(view))
            self.pitched_view = view

        @property
        def strides(self):
            return self.pitched_view.strides


def _make_intrinsics():
    from numba import types
    from numba.cuda import cgutils
    from numba.cuda.core.errors import NumbaTypeError
    from numba.cuda.extending import intrinsic

    from gemmlib.intrinsics._lower import item_pointer

    @intrinsic
    def pitched(typingctx, arr):
        if not (isinstance(arr, types.Array) and arr.ndim == 2 and arr.layout == "C"):
            raise NumbaTypeError(f"pitched needs a C-contiguous 2-D array, got {arr}")
        sig = arr.copy(layout="A")(arr)

        def codegen(context, builder, sig, args):
            src = context.make_array(sig.args[0])(context, builder, args[0])
            row_bytes, _ = cgutils.unpack_tuple(builder, src.strides, 2)
            item = context.get_constant(types.intp, context.get_abi_sizeof(
                context.get_data_type(sig.args[0].dtype)))
            out = context.make_array(sig.return_type)(context, builder)
            context.populate_array(out, data=src.data, shape=src.shape,
                                   strides=cgutils.pack_array(builder, [row_bytes, item]),
                                   itemsize=src.itemsize, meminfo=src.meminfo,
                                   parent=src.parent)
            return out._getvalue()

        return sig, codegen

    @intrinsic
    def packed(typingctx, arr):
        if not (isinstance(arr, types.Array) and arr.ndim == 2 and arr.layout == "C"):
            raise NumbaTypeError(f"packed needs a C-contiguous 2-D array, got {arr}")
        return arr(arr), lambda context, builder, sig, args: args[0]

    @intrinsic
    def read(typingctx, arr, i, j):
        if not (isinstance(arr, types.Array) and arr.ndim == 2 and arr.layout in "CA"
                and isinstance(i, types.Integer) and isinstance(j, types.Integer)):
            raise NumbaTypeError(f"read needs a 2-D array and two integer indices, got "
                                 f"{arr}, {i}, {j}")
        sig = arr.dtype(arr, i, j)

        def codegen(context, builder, sig, args):
            aty, ity, jty = sig.args
            ary = context.make_array(aty)(context, builder, args[0])
            inds = [context.cast(builder, args[1], ity, types.intp),
                    context.cast(builder, args[2], jty, types.intp)]
            return builder.load(item_pointer(context, builder, aty, ary, inds))

        return sig, codegen

    return pitched, packed, read


if SIMULATOR:
    pitched, packed, read = pitched_py, packed_py, read_py
else:
    pitched, packed, read = _make_intrinsics()

__all__ = ["pitched", "packed", "read", "pitched_py", "packed_py", "read_py",
           "simulated_argument"]
