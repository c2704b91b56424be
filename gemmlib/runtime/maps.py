"""The tensor maps of one GEMM call, handed to its kernel by value.

A TMA rung's last parameter is a block of MAPS_BYTES: A's map, B's 128 bytes further
(then C's, and any 64-bit words such as FP8 scales' addresses).  numba declares that
parameter as a uint64; the compile step rewrites it into a 64-byte aligned block and the
one instruction that read it into the block's generic address
(:func:`gemmlib.ptx.maps_by_value`), as CUDA C++ passes a ``__grid_constant__``
CUtensorMap.  So a call's maps travel inside its launch: no device memory to write, keep
or free, no second kernel on the stream, and a CUDA-graph capture records them with the
launch, by value.

Encoding a map through the driver's Python bindings (:func:`gemmlib.tma.encode_2d`) costs
tens of microseconds, so encodings are kept: by everything (a weight's map, whatever
activation it meets next) and by everything but the address (a model's layers hand each
call a new activation: its map is a kept one with the new address written in,
``cuTensorMapReplaceAddress``, one ctypes call).
"""

from __future__ import annotations

import ctypes
import threading

import numpy as np

from gemmlib import tma
from gemmlib.runtime.driver import driver

#: encodings kept, of each kind, before they are all dropped
MAX_KEPT = 1024
#: bytes of a launch's maps block (3 maps and 2 words fit)
MAPS_BYTES = 512


def operand_maps(operands, words: tuple = ()) -> np.ndarray:
    """The maps block of ``operands``, each ``(ptr, (rows, cols), row_bytes, dtype_name,
    box, swizzle)``, 128 bytes apart, then the 64-bit ``words``: MAPS_BYTES as uint64."""
    raw = np.zeros(MAPS_BYTES // 8, np.uint64)
    for i, op in enumerate(operands):
        raw[16 * i:16 * i + 16] = _map(op)
    n = 16 * len(operands)
    if n + len(words) > raw.size:
        raise ValueError(f"{len(operands)} maps and {len(words)} words do not fit "
                         f"{MAPS_BYTES} bytes")
    raw[n:n + len(words)] = words
    return raw


#: encoded maps by everything but their address ((shape, row bytes, dtype, box, swizzle))
_ENCODED: dict = {}
#: encoded maps by everything (a weight's map, whatever activation it meets next)
_WHOLE: dict = {}


def _map(op) -> np.ndarray:
    """The 16 words of the map of ``op`` = (ptr, shape, row_bytes, dtype, box, swizzle):
    kept, else a copy of one encoded alike readdressed, else encoded (and kept for the
    next address).  The words are never written after they are kept."""
    raw = _WHOLE.get(op)
    if raw is not None:
        return raw
    ptr, rest = op[0], op[1:]
    kept = _ENCODED.get(rest)
    raw = None
    if kept is not None and ptr % 16 == 0:   # (a misaligned address: encode_2d's error)
        raw = kept.copy()
        if not _readdressed(raw, ptr):
            raw = None
    if raw is None:
        raw = tma.encode_2d(*op)
        if len(_ENCODED) >= MAX_KEPT:
            _ENCODED.clear()
        _ENCODED[rest] = raw
    if len(_WHOLE) >= MAX_KEPT:
        _WHOLE.clear()
    _WHOLE[op] = raw
    return raw


class _HostBuffers(threading.local):
    """A thread's 64-byte aligned CUtensorMap to readdress in (the driver's alignment)."""

    def __init__(self):
        self.tmap_words = (ctypes.c_uint64 * 24)()
        base = ctypes.addressof(self.tmap_words)
        self.tmap = base + (-base % 64)


def _readdressed(raw: np.ndarray, ptr: int) -> bool:
    """Write device address ``ptr`` into the encoded map ``raw`` in place (False: the
    driver cannot: encode it instead)."""
    h = _HOST
    ctypes.memmove(h.tmap, raw.ctypes.data, 128)
    if not driver().tensor_map_replace_address(h.tmap, ptr):
        return False
    ctypes.memmove(raw.ctypes.data, h.tmap, 128)
    return True


_HOST = _HostBuffers()
