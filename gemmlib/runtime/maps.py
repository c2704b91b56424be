"""The tensor maps of one GEMM call in device memory: kept per operand description,
written on the call's stream, a CUDA-graph capture's own kept apart.

A call hands the kernel one 64-bit address: A's map there, B's 128 bytes further (then
C's, and any 64-bit words such as FP8 scales' addresses).  The maps of each (pointer,
shape, box) are kept in device memory and reused: a map depends on nothing else, so a
kept map is right for any later array with the same address and shape.  When MAX_KEPT
are kept the device is synchronised (no kernel can still be reading one) and their slots
are used again.  A model's layers hand each call a new activation, so the encoding itself
is kept too, by everything but the address: a new address is written into a copy
(``cuTensorMapReplaceAddress``, one ctypes call) instead of encoding the map again through
the driver's Python bindings (:func:`gemmlib.tma.encode_2d`).  On an H100 the host time
per call on 64 rotating activations was within the run-to-run spread either way
(results/tune-2026-11-27c/host-fresh-buffers-h100.log).

The bytes reach device memory through a one-thread kernel that takes them as its
parameter block (:func:`_store`), launched on the call's stream: in order with the GEMM,
no host memory the copy must outlive, no host synchronisation, and a CUDA-graph capture
records the write with the kernel.  Under a capture the maps get slots of the graph's
own (``graph=True``: with torch's memory the captured call's temporaries, with CuPy's
slots never used again for anything else), and each captured call records its write, so
a replay is right whatever ran before it.
"""

from __future__ import annotations

import ctypes
import threading

import numpy as np

from gemmlib import tma
from gemmlib.runtime import memory
from gemmlib.runtime.driver import driver

MAX_KEPT = 1024
_KEPT: dict = {}
_GRAPH_KEPT: dict = {}
#: how many times the kept maps were freed: an address from operand_maps stays valid
#: while GENERATION is what it was when the address was handed out
GENERATION = 0
#: bytes a call's maps and words take in device memory (3 maps and 2 words fit)
SLOT_BYTES = 512
_SLAB_SLOTS = 64


class _Slots:
    """Slots of SLOT_BYTES in device memory, carved out of slabs kept for good."""

    def __init__(self):
        self.slabs, self.free, self.used = [], [], 0

    def take(self, stream: int) -> int:
        if self.used == len(self.free):
            slab = memory.allocate(SLOT_BYTES * _SLAB_SLOTS, stream)
            self.slabs.append(slab)
            self.free.extend(slab.ptr + SLOT_BYTES * i for i in range(_SLAB_SLOTS))
        self.used += 1
        return self.free[self.used - 1]

    def reset(self) -> None:
        self.used = 0


_EAGER_SLOTS, _GRAPH_SLOTS = _Slots(), _Slots()


def operand_maps(operands, stream: int = 0, words: tuple = (), graph: bool = False) -> int:
    """Device address of the maps of ``operands``, each ``(ptr, (rows, cols), row_bytes,
    dtype_name, box, swizzle)``, 128 bytes apart, then the 64-bit ``words`` (e.g. the
    addresses of FP8 scales); written on ``stream`` the first time (``graph``: the
    stream is being captured: the graph's own slot, written in the graph)."""
    key = tuple(operands) + tuple(words)
    if graph and memory.holding():   # a slot of the captured call's own (memory.CapturedCall)
        slot = memory.keep_for_graphs(memory.allocate(SLOT_BYTES, stream))
        _store(slot.ptr, _encoded(operands, words), stream)
        return slot.ptr
    if graph:
        hit = _GRAPH_KEPT.get(key)
        if hit is None:
            hit = _GRAPH_KEPT[key] = (_encoded(operands, words), _GRAPH_SLOTS.take(stream))
        _store(hit[1], hit[0], stream)
        return hit[1]
    hit = _KEPT.get(key)
    if hit is not None:
        return hit
    raw = _encoded(operands, words)
    if len(_KEPT) >= MAX_KEPT:
        global GENERATION
        memory.synchronize()
        _KEPT.clear()
        _EAGER_SLOTS.reset()
        GENERATION += 1   # addresses handed out before are gone (dispatch's memo checks)
    addr = _EAGER_SLOTS.take(stream)
    _store(addr, raw, stream)
    _KEPT[key] = addr
    return addr


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
    """A thread's ctypes buffers for the driver calls of a map's write, made once: a
    64-byte aligned CUtensorMap to readdress in, and the store kernel's parameters."""

    def __init__(self):
        self.tmap_words = (ctypes.c_uint64 * 24)()
        base = ctypes.addressof(self.tmap_words)
        self.tmap = base + (-base % 64)   # the driver's CUtensorMap is 64-byte aligned
        self.dst = ctypes.c_uint64()
        self.block = (ctypes.c_uint64 * _STORE_WORDS)()
        self.params = (ctypes.c_void_p * 2)(ctypes.addressof(self.dst),
                                            ctypes.addressof(self.block))


def _readdressed(raw: np.ndarray, ptr: int) -> bool:
    """Write device address ``ptr`` into the encoded map ``raw`` in place (False: the
    driver cannot: encode it instead)."""
    h = _HOST
    ctypes.memmove(h.tmap, raw.ctypes.data, 128)
    if not driver().tensor_map_replace_address(h.tmap, ptr):
        return False
    ctypes.memmove(raw.ctypes.data, h.tmap, 128)
    return True


def _encoded(operands, words) -> np.ndarray:
    raw = np.concatenate([_map(op) for op in operands]
                         + [np.array(words, dtype=np.uint64)])
    if raw.nbytes > SLOT_BYTES:
        raise ValueError(f"{raw.nbytes} bytes of maps do not fit a {SLOT_BYTES}-byte slot")
    return raw


#: the store kernel's parameter block: SLOT_BYTES of words after the destination
_STORE_WORDS = SLOT_BYTES // 8


def _store_ptx() -> bytes:
    """PTX of a one-thread kernel copying its parameter block's words to ``dst``."""
    lines = [".version 6.0", ".target sm_50", ".address_size 64", "",
             ".visible .entry gemmlib_store_words(.param .u64 dst, "
             f".param .align 8 .b8 words[{SLOT_BYTES}])", "{",
             "  .reg .b64 %d, %w;", "  ld.param.u64 %d, [dst];",
             "  cvta.to.global.u64 %d, %d;"]
    for i in range(_STORE_WORDS):
        lines += [f"  ld.param.u64 %w, [words+{8 * i}];", f"  st.global.u64 [%d+{8 * i}], %w;"]
    lines += ["  ret;", "}", ""]
    return "\n".join(lines).encode() + b"\0"


_STORE_FN: dict = {}   # context -> the loaded store kernel


def _store(addr: int, raw: np.ndarray, stream: int) -> None:
    """Write ``raw``'s bytes at device address ``addr`` in order on ``stream``."""
    drv = driver()
    ctx = drv.current_context()
    fn = _STORE_FN.get(ctx)
    if fn is None:
        mod, f = ctypes.c_void_p(), ctypes.c_void_p()
        drv.check(drv.module_load_data(ctypes.byref(mod), _store_ptx()), "cuModuleLoadData")
        drv.check(drv.module_get_function(ctypes.byref(f), mod, b"gemmlib_store_words"),
                  "cuModuleGetFunction")
        fn = _STORE_FN[ctx] = f.value
    h = _HOST   # (the launch copies the parameters: the buffers are free again after it)
    h.dst.value = addr
    ctypes.memmove(h.block, raw.ctypes.data, raw.nbytes)
    drv.check(drv.launch_kernel(fn, 1, 1, 1, 1, 1, 1, 0, stream or None, h.params, None),
              "cuLaunchKernel")


_HOST = _HostBuffers()
