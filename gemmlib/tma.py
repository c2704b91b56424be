"""Tensor maps for Hopper's copy engine (TMA), encoded on the host.

A ``cp.async.bulk.tensor`` copy does not take addresses: it takes a *tensor
map*, a 128-byte descriptor of a global matrix (base, sizes, row stride,
element type), the box one copy moves, the swizzle it writes into shared
memory, and what to put where the box hangs over the matrix (zeros).  The
driver encodes it (``cuTensorMapEncodeTiled``, reached through
``cuda.bindings``); the kernel only needs its address.

CUDA C++ passes the map by value as a ``__grid_constant__`` kernel parameter.
numba has no such parameter, so :func:`tensor_map_2d` copies the map into
device memory and kernels take its 64-bit address; a thread acquires it with
``fence.proxy.tensormap::generic.acquire`` (``gemmlib.intrinsics.hopper.
tensormap_acquire``) before its first copy, as PTX requires for a map that
reached global memory through ordinary writes.
"""
from __future__ import annotations

import numpy as np

#: swizzle modes of TMA (bytes of the swizzled span) and the box's inner-row limit
SWIZZLES = (0, 32, 64, 128)
_DTYPES = {"float16": "FLOAT16", "uint16": "UINT16", "float32": "FLOAT32", "bfloat16": "BFLOAT16",
           "uint8": "UINT8"}


class TensorMap:
    """A tensor map in device memory; keeps the matrix it describes alive.  ``ptr`` is
    the map's device address, what kernels take (in the simulator: a key that the
    TMA twin looks the map up by, :func:`simulated_map`)."""

    def __init__(self, device_bytes, array, box, swizzle, ptr=None):
        self.buf, self.array, self.box, self.swizzle = device_bytes, array, box, swizzle
        self.ptr = int(device_bytes.data.ptr) if ptr is None else ptr


_SIMULATED: dict = {}


def simulated_map(ptr: int) -> TensorMap:
    """The simulator's map behind ``ptr`` (the TMA twin's lookup)."""
    try:
        return _SIMULATED[int(ptr)]
    except KeyError:
        raise ValueError(f"{int(ptr):#x} is not a tensor map made by tensor_map_2d") from None


def check_box(shape, strides, itemsize: int, box, swizzle: int, ptr: int) -> None:
    """The driver's rules for a 2-D tiled map -- or a stack's, ``shape`` (batch, rows,
    cols) with a 2-D ``box`` per matrix -- as clear errors before encoding."""
    if len(shape) == 3:
        if strides[0] % 16:
            raise ValueError(f"TMA needs a matrix stride that is a multiple of 16 bytes, "
                             f"got {strides[0]}")
        if shape[0] < 1:
            raise ValueError(f"the stack is empty: {shape}")
        shape, strides = shape[1:], strides[1:]
    rows, cols = shape
    brows, bcols = box
    if swizzle not in SWIZZLES:
        raise ValueError(f"swizzle must be one of {SWIZZLES} (bytes), got {swizzle}")
    if ptr % 16:
        raise ValueError(f"TMA needs a 16-byte aligned matrix; its address is {ptr % 16} "
                         "bytes past a 16-byte boundary")
    if strides[1] != itemsize:
        raise ValueError("TMA needs rows of contiguous elements (a C-contiguous matrix)")
    if strides[0] % 16:
        raise ValueError(f"TMA needs a row stride that is a multiple of 16 bytes, got "
                         f"{strides[0]} (pad the rows)")
    if not (1 <= brows <= 256 and 1 <= bcols <= 256):
        raise ValueError(f"a TMA box is 1..256 elements per side, got {box}")
    if (bcols * itemsize) % 16:
        raise ValueError(f"a box row must be a multiple of 16 bytes, got {bcols * itemsize}")
    if swizzle and bcols * itemsize > swizzle:
        raise ValueError(f"with a {swizzle}-byte swizzle a box row holds at most {swizzle} "
                         f"bytes, got {bcols * itemsize}")
    if rows < 1 or cols < 1:
        raise ValueError(f"the matrix is empty: {shape}")


def encode_2d(ptr: int, shape, row_bytes: int, dtype_name: str, box, swizzle: int) -> np.ndarray:
    """The 128 bytes of a tensor map (16 uint64) of the row-major matrix at device address
    ``ptr``: ``shape = (rows, cols)``, rows ``row_bytes`` apart, ``box = (rows, cols)``
    per copy, ``swizzle`` in bytes (0, 32, 64, 128), out-of-bounds elements read as zeros.

    ``shape = (batch, rows, cols)``: a 3-D map of a stack of such matrices, each right after
    the previous one (``rows * row_bytes`` apart), the box one matrix's ``(rows, cols)``:
    a box that hangs over a matrix's last row stops there (what falls outside is not
    written, or reads as zeros) instead of reaching into the next matrix."""
    from cuda.bindings import driver as cu

    itemsize = np.dtype("uint16" if dtype_name == "bfloat16" else dtype_name).itemsize
    rows, cols = shape[-2:]
    stack = len(shape) == 3
    strides = ((rows * row_bytes,) if stack else ()) + (row_bytes, itemsize)
    check_box(shape, strides, itemsize, box, swizzle, ptr)
    dt = getattr(cu.CUtensorMapDataType, f"CU_TENSOR_MAP_DATA_TYPE_{_DTYPES[dtype_name]}")
    sw = getattr(cu.CUtensorMapSwizzle,
                 "CU_TENSOR_MAP_SWIZZLE_NONE" if not swizzle else
                 f"CU_TENSOR_MAP_SWIZZLE_{swizzle}B")
    dims = [cols, rows] + ([shape[0]] if stack else [])     # innermost first
    err, tmap = cu.cuTensorMapEncodeTiled(
        dt, len(dims), int(ptr), [cu.cuuint64_t(d) for d in dims],
        [cu.cuuint64_t(s) for s in strides[-2::-1]],
        [cu.cuuint32_t(box[1]), cu.cuuint32_t(box[0])] + [cu.cuuint32_t(1)] * stack,
        [cu.cuuint32_t(1)] * len(dims),
        cu.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE, sw,
        cu.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
        cu.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
    if err != cu.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cuTensorMapEncodeTiled failed: {err}")
    return np.array([int(v) for v in tmap.opaque], dtype=np.uint64)


def tensor_map_2d(x, box, swizzle: int = 0) -> TensorMap:
    """A tensor map of the row-major 2-D CuPy array ``x`` (float16, bfloat16 bits as
    uint16, or float32): ``box = (rows, cols)`` per copy, ``swizzle`` in bytes (0, 32,
    64, 128), out-of-bounds elements read as zeros."""
    from gemmlib.backend import SIMULATOR

    name = np.dtype(x.dtype).name
    if name not in _DTYPES:
        raise TypeError(f"tensor_map_2d takes {', '.join(_DTYPES)}; got {name}")
    if SIMULATOR:   # NumPy arrays; the map is a key into a table the TMA twin reads
        check_box(x.shape, x.strides, x.dtype.itemsize, box, swizzle, 0)
        ptr = _next_simulated()
        _SIMULATED[ptr] = TensorMap(None, x, tuple(box), swizzle, ptr=ptr)
        return _SIMULATED[ptr]
    import cupy as cp

    if x.strides[1] != x.dtype.itemsize:
        raise ValueError("TMA needs rows of contiguous elements (a C-contiguous matrix)")
    raw = encode_2d(int(x.data.ptr), x.shape, x.strides[0], name, box, swizzle)
    return TensorMap(cp.asarray(raw), x, tuple(box), swizzle)


_COUNT = __import__("itertools").count()


def _next_simulated() -> int:
    """A fresh simulated map address (256 bytes apart); simulated kernels run at once, so
    maps older than the newest few thousand are dropped."""
    n = next(_COUNT)
    _SIMULATED.pop(0x7E000000 + 256 * (n - 4096), None)
    _SIMULATED.pop(0x7E000000 + 256 * (n - 4096) + 128, None)
    for w in range(4):   # the words after a pair of maps (FP8 scales' addresses)
        _WORDS.pop(0x7E000000 + 256 * (n - 4096) + 256 + 8 * w, None)
    return 0x7E000000 + 256 * n


def simulated_maps(arrays, boxes, swizzle: int, words: tuple = ()) -> int:
    """The simulator's :func:`operand_maps`: maps of NumPy ``arrays`` 128 bytes apart, then
    ``words`` (read back by the ``ld_global`` twins through :func:`simulated_word`)."""
    base = _next_simulated()
    for i, (x, box) in enumerate(zip(arrays, boxes)):
        check_box(x.shape, x.strides, x.dtype.itemsize, box, swizzle, 0)
        _SIMULATED[base + 128 * i] = TensorMap(None, x, tuple(box), swizzle, ptr=base + 128 * i)
    for i, w in enumerate(words):
        _WORDS[base + 128 * len(arrays) + 8 * i] = w
    return base


_WORDS: dict = {}


def simulated_scalar(value) -> int:
    """A simulated device address holding ``value`` (the simulator's FP8 scale tensors)."""
    addr = 0x7D000000 + 8 * next(_COUNT)
    _WORDS[addr] = value
    return addr


def simulated_word(addr: int):
    """What a simulated global load at ``addr`` reads (a maps block's words, a scale)."""
    try:
        return _WORDS[int(addr)]
    except KeyError:
        raise ValueError(f"{int(addr):#x} holds no simulated word") from None


def swizzled_offset(r: int, c: int, row_elems: int, elem_bytes: int, swizzle: int) -> int:
    """Where TMA puts box element (r, c) in shared memory (element offset from a tile
    aligned to 1024 bytes), rows of ``row_elems``.  With a swizzle of S bytes, address
    bits 4.. (the 16-byte chunk) are XOR-ed with address bits 7.. (which 128-byte line),
    over log2(S / 16) bits: for 128-byte rows and S = 128 the chunk is XOR-ed with
    ``row % 8``, what ``gemmlib.layout.chunk_swizzle`` builds (measured on an H100:
    ``results/hopper-2026-11-23/``; 32 and 64 follow the same rule, not yet measured)."""
    byte = (r * row_elems + c) * elem_bytes
    if swizzle:
        byte ^= ((byte >> 7) & (swizzle // 16 - 1)) << 4
    return byte // elem_bytes
