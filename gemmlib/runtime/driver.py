"""The CUDA driver entry points the runtime calls, through ctypes.

Launching through the driver (``cuLaunchKernel`` with a packed parameter block) is
what keeps a call's host cost near the floor, and asking the driver for the device,
a stream's capture state or a memset keeps the call path free of any array
framework: a torch caller's process never needs CuPy.
"""

from __future__ import annotations

import ctypes
import sys
from functools import lru_cache

from gemmlib.backend import cuda


class CudaError(RuntimeError):
    """A CUDA driver call failed (the message names the call and the error)."""


class _ClusterDim(ctypes.Structure):
    _fields_ = [("x", ctypes.c_uint), ("y", ctypes.c_uint), ("z", ctypes.c_uint)]


class _AttrValue(ctypes.Union):
    _fields_ = [("pad", ctypes.c_char * 64), ("cluster", _ClusterDim), ("flag", ctypes.c_int)]


class _LaunchAttr(ctypes.Structure):
    """CUlaunchAttribute: an id, padding to 8 bytes, a 64-byte value."""
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", _AttrValue)]


class _LaunchConfig(ctypes.Structure):
    """CUlaunchConfig (cuda.h): grid, block, dynamic shared bytes, stream, attributes."""
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3),
                ("shared", ctypes.c_uint), ("stream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(_LaunchAttr)), ("num_attrs", ctypes.c_uint)]


#: CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION, CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
_CLUSTER_ATTR, _EARLY_ATTR = 4, 6


def launch_config(grid, block, shared: int, stream: int, cluster: int = 1,
                  early: bool = False) -> _LaunchConfig:
    """A cuLaunchKernelEx configuration: blocks in clusters of ``cluster`` along x (> 1);
    ``early``: programmatic stream serialization -- the kernel may be placed before the
    stream's previous kernel has finished, for it waits for that kernel itself
    (``griddepcontrol.wait``).  The attribute array is kept alive by the returned object."""
    attrs = (_LaunchAttr * 2)()
    n = 0
    if cluster > 1:
        attrs[n].id = _CLUSTER_ATTR
        attrs[n].value.cluster = _ClusterDim(cluster, 1, 1)
        n += 1
    if early:
        attrs[n].id = _EARLY_ATTR
        attrs[n].value.flag = 1
        n += 1
    cfg = _LaunchConfig(grid=(ctypes.c_uint * 3)(*grid), block=(ctypes.c_uint * 3)(*block),
                        shared=shared, stream=stream or None, attrs=attrs, num_attrs=n)
    cfg._attrs = attrs
    return cfg


class _Driver:
    """The few driver entry points the launch path needs, called through ctypes."""

    FUNC_ATTR = {"max_threads": 0, "shared_bytes": 1, "const_bytes": 2, "local_bytes": 3,
                 "registers": 4}
    MAX_DYNAMIC_SHARED = 8

    def __init__(self):
        name = "nvcuda.dll" if sys.platform == "win32" else "libcuda.so.1"
        lib = ctypes.CDLL(name)
        P, vp, ci, cu = ctypes.POINTER, ctypes.c_void_p, ctypes.c_int, ctypes.c_uint

        def fn(symbol, *argtypes):
            f = getattr(lib, symbol)
            f.argtypes, f.restype = list(argtypes), ci
            return f

        self.ctx_get_current = fn("cuCtxGetCurrent", P(vp))
        self.module_load_data = fn("cuModuleLoadData", P(vp), ctypes.c_char_p)
        self.module_get_function = fn("cuModuleGetFunction", P(vp), vp, ctypes.c_char_p)
        self.func_get_attribute = fn("cuFuncGetAttribute", P(ci), ci, vp)
        self.func_set_attribute = fn("cuFuncSetAttribute", vp, ci, ci)
        self.launch_kernel = fn("cuLaunchKernel", vp, cu, cu, cu, cu, cu, cu, cu, vp, vp, vp)
        self.launch_kernel_ex = fn("cuLaunchKernelEx", P(_LaunchConfig), vp, vp, vp)
        self.max_active_clusters = fn("cuOccupancyMaxActiveClusters", P(ci), vp,
                                      P(_LaunchConfig))
        self._error_name = fn("cuGetErrorName", ci, P(ctypes.c_char_p))
        self.ctx_get_device = fn("cuCtxGetDevice", P(ci))
        self.ctx_synchronize = fn("cuCtxSynchronize")
        self.memset_d8_async = fn("cuMemsetD8Async_v2" if hasattr(lib, "cuMemsetD8Async_v2")
                                  else "cuMemsetD8Async", ctypes.c_uint64, ctypes.c_ubyte,
                                  ctypes.c_size_t, vp)
        self.stream_is_capturing = fn("cuStreamIsCapturing", vp, P(ci))
        self.memcpy_dtod_async = fn("cuMemcpyDtoDAsync_v2" if hasattr(lib, "cuMemcpyDtoDAsync_v2")
                                    else "cuMemcpyDtoDAsync", ctypes.c_uint64, ctypes.c_uint64,
                                    ctypes.c_size_t, vp)
        self._mem_alloc = fn("cuMemAlloc_v2", P(ctypes.c_uint64), ctypes.c_size_t)
        self._mem_free = fn("cuMemFree_v2", ctypes.c_uint64)
        self._tensor_map_replace_address = (fn("cuTensorMapReplaceAddress", vp, ctypes.c_uint64)
                                            if hasattr(lib, "cuTensorMapReplaceAddress")
                                            else None)

    def check(self, rc: int, what: str) -> None:
        if rc:
            name = ctypes.c_char_p()
            self._error_name(rc, ctypes.byref(name))
            raise CudaError(f"{what} failed: {(name.value or b'?').decode()} ({rc})")

    def current_context(self) -> int:
        ctx = ctypes.c_void_p()
        self.check(self.ctx_get_current(ctypes.byref(ctx)), "cuCtxGetCurrent")
        if not ctx.value:  # a thread that has not touched CUDA yet: use the primary context
            cuda.current_context()
            self.check(self.ctx_get_current(ctypes.byref(ctx)), "cuCtxGetCurrent")
        return ctx.value

    def current_device(self) -> int:
        """The current context's device ordinal (cuCtxGetDevice: no framework asked)."""
        dev = ctypes.c_int()
        rc = self.ctx_get_device(ctypes.byref(dev))
        if rc:   # no context on this thread yet: make the primary one current
            self.current_context()
            self.check(self.ctx_get_device(ctypes.byref(dev)), "cuCtxGetDevice")
        return dev.value

    def capturing(self, stream: int) -> bool:
        """Whether ``stream`` is being captured into a CUDA graph (cuStreamIsCapturing)."""
        status = ctypes.c_int()
        self.check(self.stream_is_capturing(stream or None, ctypes.byref(status)),
                   "cuStreamIsCapturing")
        return status.value == 1   # CU_STREAM_CAPTURE_STATUS_ACTIVE

    def memset_async(self, ptr: int, nbytes: int, stream: int) -> None:
        """Zero ``nbytes`` at ``ptr`` in order on ``stream`` (a graph captures it)."""
        if nbytes:
            self.check(self.memset_d8_async(ptr, 0, nbytes, stream or None),
                       "cuMemsetD8Async")

    def copy_async(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        """Copy ``nbytes`` of device memory from ``src`` to ``dst`` in order on ``stream``."""
        if nbytes:
            self.check(self.memcpy_dtod_async(dst, src, nbytes, stream or None),
                       "cuMemcpyDtoDAsync")

    def mem_alloc(self, nbytes: int) -> int:
        """``nbytes`` of device memory on the current device (cuMemAlloc), usable on every
        stream: memory no framework's allocator hands out or accounts for."""
        ptr = ctypes.c_uint64()
        self.check(self._mem_alloc(ctypes.byref(ptr), nbytes), "cuMemAlloc")
        return ptr.value

    def mem_free(self, ptr: int) -> None:
        """Give back a :meth:`mem_alloc` buffer (cuMemFree names no stream, so none has to
        outlive the buffer; the caller makes sure no kernel still reads it)."""
        self.check(self._mem_free(ptr), "cuMemFree")

    def tensor_map_replace_address(self, tmap: int, ptr: int) -> bool:
        """Put device address ``ptr`` into the encoded tensor map at host address ``tmap``
        (cuTensorMapReplaceAddress); False where this driver lacks it."""
        if self._tensor_map_replace_address is None:
            return False
        self.check(self._tensor_map_replace_address(tmap, ptr), "cuTensorMapReplaceAddress")
        return True

    def synchronize(self) -> None:
        self.check(self.ctx_synchronize(), "cuCtxSynchronize")


@lru_cache(maxsize=None)
def driver() -> _Driver:
    return _Driver()
