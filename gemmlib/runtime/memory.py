"""Device memory for the runtime's own buffers (split-K partial sums, counters, a
transposed B, tensor maps), safe under CUDA graphs.

Where it comes from.  Once torch has initialised CUDA (a torch caller then never needs
CuPy): the buffers kept across calls straight from the driver (``cuMemAlloc``), outside
torch's allocator, whose pool of the moment may belong to torch.compile's CUDA graphs; a
captured call's buffers from torch's allocator (the graph's private pool, see below).
Otherwise CuPy's pool, stream-ordered: a buffer freed there is handed out again only in
order on its stream.  A driver buffer is not tied to a stream: the stream it served may
be destroyed before it goes (a CuPy stream, an external one), and ``cuMemFreeAsync`` on
a destroyed stream is a crash.  So it is freed with ``cuMemFree`` once the device is idle
(a synchronisation: rare, for buffers go only when the kept ones pass a budget); and since
a garbage collection may drop it at any moment, a capture's included, its free waits in
:data:`_PENDING` for the next safe point (:func:`release_pending`: an allocation or an
eviction outside any capture).

CUDA graphs.  A graph bakes in the addresses its kernels were captured with and
replays them for as long as it lives, with no way for gemmlib to learn when it dies.
So a call made while its stream is being captured (:func:`capturing`) gets buffers of
its own, allocated (and zeroed) inside the capture and never shared with eager calls.
With torch's memory they are the graph's temporaries (:class:`CapturedCall`): torch puts
what a capture asks for in the graph's private pool and keeps the pool while the graph
lives, so the buffers go back to it once the call's launches are recorded, as any torch
op's temporaries do.  With CuPy's they are kept for good.
"""

from __future__ import annotations

import sys
import threading
from contextlib import nullcontext

import numpy as np

from gemmlib.runtime.driver import driver


class DeviceBuffer:
    """``nbytes`` of device memory at ``ptr``; freed (to its allocator, in order on the
    stream it was allocated on) when the object goes."""

    __slots__ = ("ptr", "nbytes", "_owner", "_free")

    def __init__(self, ptr: int, nbytes: int, owner=None, free=None):
        self.ptr, self.nbytes, self._owner, self._free = ptr, nbytes, owner, free

    def __del__(self):
        if self._free is not None:
            try:
                self._free(self.ptr)
            except Exception:   # interpreter shutdown: the allocator may be gone
                pass


def _torch_ready():
    """torch, when it has initialised CUDA in this process (else None)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        return torch if torch.cuda.is_initialized() else None
    except Exception:
        return None


def allocate(nbytes: int, stream: int, zero: bool = False) -> DeviceBuffer:
    """``nbytes`` (rounded up to 256) on the current device, usable in order on
    ``stream``; zeroed there when ``zero``."""
    nbytes = max(256, -(-nbytes // 256) * 256)
    torch = _torch_ready()
    if torch is not None and holding():   # a captured call's: the graph's private pool
        device = driver().current_device()
        ptr = torch.cuda.caching_allocator_alloc(nbytes, device, stream)
        buf = DeviceBuffer(ptr, nbytes, None, torch.cuda.caching_allocator_delete)
    elif torch is not None:
        # kept across calls: from the driver, not torch's pool, whose pool of the moment
        # may be one that torch.compile's CUDA graphs hold (their warm-up runs allocate
        # into it) and that must hold nothing but their outputs
        release_pending()
        buf = DeviceBuffer(driver().mem_alloc(nbytes), nbytes, None, _PENDING.append)
    else:
        import cupy as cp

        current = stream == cp.cuda.get_current_stream().ptr
        with cp.cuda.ExternalStream(stream) if not current else nullcontext():
            arr = cp.empty(nbytes, dtype=np.uint8)
        buf = DeviceBuffer(int(arr.data.ptr), nbytes, arr)
    if zero:
        driver().memset_async(buf.ptr, nbytes, stream)
    return buf


#: driver buffers dropped and not yet freed (see the module's docstring)
_PENDING: list = []


def release_pending() -> None:
    """Free the driver buffers dropped since the last call, unless this thread is inside a
    captured call (``cuMemFree`` waits for the device, which a capture forbids)."""
    if not _PENDING or holding():
        return
    drv = driver()
    drv.synchronize()   # no kernel in flight still reads them (cuMemFree need not wait)
    while _PENDING:
        try:
            drv.mem_free(_PENDING.pop())
        except Exception:   # interpreter shutdown: the driver may be gone
            pass


def capturing(stream: int) -> bool:
    """Whether ``stream`` is being captured into a CUDA graph.  A stream the driver
    cannot answer for (the legacy stream while another one captures) counts as
    capturing: the graph's own buffers are right for an eager call too."""
    try:
        return driver().capturing(stream)
    except Exception:
        return True


#: buffers made for calls under capture: kept for the life of the process (see above)
GRAPH_OWNED: list = []
_CALL = threading.local()   # .held: the buffers of the captured call under way (CapturedCall)


class CapturedCall:
    """The scope of one call's launches under a capture whose memory torch gives: the
    buffers it makes (:func:`keep_for_graphs`) are held until its launches are recorded,
    then handed back to the graph's private pool.  Nested scopes share the outer one."""

    __slots__ = ("outer",)

    def __enter__(self):
        self.outer = getattr(_CALL, "held", None)
        if self.outer is None:
            _CALL.held = []
        return self

    def __exit__(self, *exc):
        if self.outer is None:
            _CALL.held = None   # the last references: torch's allocator takes them back


def graph_temporaries() -> bool:
    """Whether a captured call's buffers are the graph's temporaries (torch's memory)."""
    return _torch_ready() is not None


def holding() -> bool:
    """Whether a captured call's scope (:class:`CapturedCall`) holds its buffers."""
    return getattr(_CALL, "held", None) is not None


def keep_for_graphs(buf):
    """Keep ``buf`` (anything holding device memory a captured graph uses): for the call's
    launches inside a :class:`CapturedCall`, else for good."""
    held = getattr(_CALL, "held", None)
    (GRAPH_OWNED if held is None else held).append(buf)
    return buf


def zero_async(ptr: int, nbytes: int, stream: int) -> None:
    """Zero ``nbytes`` at ``ptr`` in order on ``stream``."""
    driver().memset_async(ptr, nbytes, stream)


def copy_async(dst: int, src: int, nbytes: int, stream: int) -> None:
    """Copy ``nbytes`` from device address ``src`` to ``dst`` in order on ``stream``."""
    driver().copy_async(dst, src, nbytes, stream)


def synchronize() -> None:
    """Wait for all work on the current device."""
    driver().synchronize()


def current_device() -> int:
    return driver().current_device()


def current_stream() -> int:
    """The stream a call with no stream named runs on: CuPy's current stream where the
    caller uses CuPy, else torch's current stream, else the legacy default stream."""
    cp = sys.modules.get("cupy")
    if cp is not None:
        return cp.cuda.get_current_stream().ptr
    torch = _torch_ready()
    if torch is not None:
        return torch.cuda.current_stream().cuda_stream
    return 0


class RawStream(int):
    """A raw CUstream handle (a framework's current stream) handed down the call path."""

    @property
    def ptr(self) -> int:
        return int(self)


def stream_handle(stream=None) -> int:
    """The raw CUstream of a CuPy, numba or torch stream, or of a :class:`RawStream` (None:
    the framework's current stream, :func:`current_stream`)."""
    if stream is None:
        return current_stream()
    if hasattr(stream, "ptr"):  # CuPy
        return int(stream.ptr)
    if hasattr(stream, "cuda_stream"):  # torch.cuda.Stream
        return int(stream.cuda_stream)
    return int(stream)  # numba streams convert to their handle
