"""Compiled kernels: machine code made once, across processes, and loaded per context.

On a GPU a kernel's machine code (cubin) comes from an on-disk cache
(:mod:`gemmlib.diskcache`, under ``$GEMMLIB_CACHE`` or ``~/.cache/gemmlib/kernels``)
keyed by the kernels' source, the parameters, the compute capability and the versions
of gemmlib, numba and numba-cuda (:func:`cache_key`); on a miss numba compiles it and
the entry is stored.  A damaged entry is detected (checksum) and rebuilt.  numba's own
``cache=True`` is not used: it keys closures by pickling their contents and raises on
a truncated index file.  :class:`Compiled` loads the code into each CUDA context once
and hands out the function's handle.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
from functools import lru_cache
from importlib import metadata
from pathlib import Path

from gemmlib import backend, diskcache, tuning
from gemmlib._version import __version__
from gemmlib.runtime.caches import LOCK, STATS
from gemmlib.runtime.driver import CudaError, driver
from gemmlib.spec import KernelSpec


def cache_dir() -> Path:
    """Where compiled kernels are kept: ``$GEMMLIB_CACHE/kernels`` or ``~/.cache/gemmlib/kernels``."""
    return tuning.cache_root() / "kernels"


_SOURCE_FILES = ("kernels/*.py", "intrinsics/*.py", "spec.py", "layout.py", "backend.py")


@lru_cache(maxsize=None)
def source_digest() -> str:
    """SHA-256 over the source every kernel is compiled from: any edit makes new keys."""
    root = Path(__file__).resolve().parent.parent   # gemmlib/
    h = hashlib.sha256()
    for pattern in _SOURCE_FILES:
        for path in sorted(root.glob(pattern)):
            h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def _dist_version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "?"


def cache_key(module: str, kernel_name: str, params: dict, cc, signature: str) -> str:
    """The disk-cache key of one compiled kernel (hex SHA-256)."""
    fields = {"module": module, "kernel": kernel_name,
              "params": sorted((k, repr(v)) for k, v in params.items()),
              "cc": list(cc), "signature": signature, "source": source_digest(),
              "gemmlib": __version__, "numba": _dist_version("numba"),
              "numba_cuda": _dist_version("numba-cuda"), "format": 1}
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()


class Compiled:
    """One kernel's machine code and its loaded function per CUDA context."""

    def __init__(self, cubin: bytes, entry: str):
        self.cubin, self.entry = cubin, entry
        self.kernel = None  # the numba kernel this came from (keeps its id unique)
        self.registers = self.local_bytes = self.static_shared_bytes = None
        self._functions: dict[int, int] = {}
        self._modules: list = []  # keeps module handles alive with this object

    def function(self, ctx: int, dynamic_shared: int = 0) -> int:
        f = self._functions.get(ctx)
        if f is not None:
            return f
        with LOCK:
            f = self._functions.get(ctx)
            if f is None:
                f = self._load(dynamic_shared)
                self._functions[ctx] = f
        return f

    def _load(self, dynamic_shared: int) -> int:
        drv = driver()
        mod, fn = ctypes.c_void_p(), ctypes.c_void_p()
        drv.check(drv.module_load_data(ctypes.byref(mod), self.cubin), "cuModuleLoadData")
        drv.check(drv.module_get_function(ctypes.byref(fn), mod, self.entry.encode()),
                  "cuModuleGetFunction")
        if dynamic_shared > 48 * 1024:
            drv.check(drv.func_set_attribute(fn, drv.MAX_DYNAMIC_SHARED, dynamic_shared),
                      "cuFuncSetAttribute")
        self._modules.append(mod)
        out = ctypes.c_int()
        for attr, field in (("registers", "registers"), ("local_bytes", "local_bytes"),
                            ("shared_bytes", "static_shared_bytes")):
            drv.check(drv.func_get_attribute(ctypes.byref(out), drv.FUNC_ATTR[attr], fn),
                      "cuFuncGetAttribute")
            setattr(self, field, out.value)
        STATS["loads"] += 1
        return fn.value


_COMPILED: dict[int, Compiled] = {}  # id(numba kernel) -> Compiled (which keeps the kernel)


def _signature(dtype, nargs: int, scalars: tuple = ()):
    """numba's argument types: ``nargs`` C-contiguous 2-D arrays of ``dtype``
    (one name, or one per argument), then scalars of the types named in ``scalars``."""
    from numba import types

    dtypes = (dtype,) * nargs if isinstance(dtype, str) else tuple(dtype)
    return (tuple(getattr(types, d)[:, ::1] for d in dtypes)
            + tuple(getattr(types, s) for s in scalars))


def compiled(kernel, *, module: str, params: dict, dtype: str = "float32",
             nargs: int = 3, scalars: tuple = ()) -> Compiled:
    """The machine code of numba kernel ``kernel``: memory, then disk, then numba (GPU only)."""
    c = _COMPILED.get(id(kernel))
    if c is not None:
        return c
    with LOCK:
        c = _COMPILED.get(id(kernel))
        if c is None:
            c = _compile(kernel, module, params, dtype, nargs, scalars)
            c.kernel = kernel  # the id stays this kernel's while the entry lives
            _COMPILED[id(kernel)] = c
    return c


def _compile(kernel, module, params, dtype, nargs, scalars=()) -> Compiled:
    cc = backend.device_info().compute_capability
    sig = _signature(dtype, nargs, scalars)
    name = getattr(kernel, "py_func", kernel).__qualname__
    key = cache_key(module, name, params, cc, str(sig))
    existed = diskcache.entry_path(cache_dir(), key).exists()
    hit = diskcache.load(cache_dir(), key)  # None for a damaged entry (which it removes)
    if hit is not None and hit[1].get("key") == key and hit[1].get("entry"):
        STATS["disk_hits"] += 1
        return Compiled(hit[0], hit[1]["entry"])
    if existed:
        diskcache.discard(cache_dir(), key)
        STATS["disk_rejects"] += 1
    else:
        STATS["disk_misses"] += 1
    k = kernel.compile(sig)  # numba: Python -> PTX -> cubin, for this device
    STATS["compiles"] += 1
    lib = k._codelibrary
    if getattr(lib, "_setup_functions", None):  # e.g. numba's runtime (NRT): not ours to init
        raise CudaError(f"{name} needs numba's module set-up; gemmlib kernels must not")
    cubin = machine_code(lib, cc)
    diskcache.store(cache_dir(), key, cubin, {"key": key, "entry": k.entry_name,
                                              "kernel": name, "module": module,
                                              "params": {k_: repr(v) for k_, v in params.items()},
                                              "cc": list(cc)})
    return Compiled(cubin, k.entry_name)


def machine_code(lib, cc) -> bytes:
    """SASS for compute capability ``cc`` of numba code library ``lib``.

    From compute capability 8.0, numba's own ``get_cubin`` (on 9.0 and newer for the
    arch-specific sm_90a: wgmma, setmaxnreg, as numba-cuda's own launches use).  Below it,
    numba's link step can hand the PTX to the driver's JIT when it finds no nvJitLink, and an
    older driver cannot JIT PTX from a newer compiler (a T4 on Colab): there gemmlib
    assembles the PTX itself (:func:`gemmlib.ptx.assemble`), so the driver only loads
    machine code.
    """
    from gemmlib.ptx import assemble

    if tuple(cc) >= (8, 0):
        # numba's own link step is what every committed H100/H200 measurement ran; the
        # nvJitLink assembly below has not been timed on those GPUs (one H200 run with it
        # read slower, within this machine's run-to-run spread), so it serves the T4 class only
        suffix = "a" if tuple(cc) >= (9, 0) else ""
        code = lib.get_cubin(cc=(cc[0], cc[1], suffix))
        code = getattr(code, "code", code)  # numba-cuda 0.30 returns a cuda.core ObjectCode
        return Path(code).read_bytes() if isinstance(code, (str, os.PathLike)) else bytes(code)
    if lib._linking_files or lib.needs_cudadevrt:
        raise CudaError("gemmlib kernels link no other code; this one asks numba to link "
                        f"{sorted(map(str, lib._linking_files)) or 'cudadevrt'}")
    ptx = lib.get_asm_str(cc=(cc[0], cc[1], ""))
    return assemble(ptx, f"sm_{cc[0]}{cc[1]}", lib._max_registers)


def compiled_spec(spec: KernelSpec) -> Compiled:
    """The main kernel of ``spec``, compiled (or read from the cache) for this GPU."""
    dtypes = spec.array_dtypes
    return compiled(spec.kernel, module=spec.module, params=spec.code_params,
                    dtype=dtypes[0] if len(set(dtypes)) == 1 else dtypes, nargs=len(dtypes),
                    scalars=spec.scalar_args)


def compiled_prep(spec: KernelSpec, operand: str = "b") -> Compiled:
    """The compiled pre-pass of ``spec``'s B (``b_prep``) or, ``operand="a"``, A's."""
    if operand == "a":
        return compiled(spec.a_prep, module=spec.module, params={},
                        dtype=spec.kernel_dtypes[0], nargs=2)
    return compiled(spec.b_prep, module=spec.module, params={}, dtype=spec.kernel_dtypes[1],
                    nargs=2)


def compiled_round16(out: str) -> Compiled:
    from gemmlib.kernels import split_k

    return compiled(split_k.REDUCE16[out], module=split_k.__name__, params={"OUT": out},
                    dtype=("float32", "uint16"), nargs=2)


def compiled_finish(out: str, bias: str) -> Compiled:
    from gemmlib.kernels import split_k

    bits = {"fp32": "float32", "fp16": "uint16", "bf16": "uint16"}
    return compiled(split_k.BIAS_FINISH[(out, bias)], module=split_k.__name__,
                    params={"OUT": out, "BIAS": bias},
                    dtype=("float32", bits[bias], bits[out]), nargs=3)


def compiled_reduce(spec: KernelSpec) -> Compiled:
    # the workspace and C are the kernel's output type (float32 also for 16-bit inputs)
    return compiled(spec.reduce_kernel, module=spec.module, params={}, dtype=spec.out_dtype,
                    nargs=2)


def known_registers(spec: KernelSpec) -> int | None:
    """Registers per thread if this kernel has been compiled in this process."""
    c = _COMPILED.get(id(spec.kernel))
    return c.registers if c is not None else None
