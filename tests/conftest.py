"""Test setup: the simulator unless a GPU run asks for the real device.

``NUMBA_ENABLE_CUDASIM`` must be set before numba is imported, so it is
decided here, first.  CI (no GPU) runs everything in the simulator; the GPU
run sets ``NUMBA_ENABLE_CUDASIM=0`` and adds ``-m gpu`` tests.

Also here:

* a race of numba-cuda 0.30's simulator in ``cuda.shared.array``, fixed for the test
  session (:func:`_mend_simulator`): it made tests fail now and then on a loaded machine;
* how ``make test`` spreads tests over its xdist workers (``--dist loadgroup``):
  each notebook, and each set of a module's tests that share a module- or
  class-scoped fixture, stays on one worker; every other test is scheduled on
  its own, so one long file no longer holds a worker to the end
  (:func:`pytest_collection_modifyitems`).
"""

import os

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

import pytest  # noqa: E402

from gemmlib import backend  # noqa: E402


def _mend_simulator():
    """A race in numba-cuda 0.30's simulator, which runs each CUDA thread of a block as a
    Python thread (remove once numba-cuda mends it; it belongs beside gemmlib._simulator's
    scheduler, which also replaces a piece of the simulator).

    ``cuda.shared.array`` looks its array up in a dict keyed by the calling line and makes
    it when missing -- a get, then a set.  Two threads of a block switched between the two
    each got an array of their own, so the block's "shared" tile was not shared: a wrong
    result now and then, more often on a loaded machine (seen as rare failures of
    test_special_values[wgmma_async-structured] and test_skinny's aligned_rows[bf16]).
    Here the array is made with ``dict.setdefault`` (atomic under the GIL): every thread
    gets the first one made.  The key is the same (file, line) numba takes, read from the
    caller's frame instead of ``traceback.extract_stack``, which reads the source line of
    every frame on the stack each time a thread asks -- a measurable share of the
    simulator's time.  (Its other race, the swap of ``cuda`` in a device function's
    globals, numba-cuda 0.30 already counts per module.)
    """
    if not backend.SIMULATOR:
        return
    import sys

    import numpy as np
    from numba.core import types
    from numba.cuda.simulator import kernelapi
    from numba.np import numpy_support

    Shared = kernelapi.FakeCUDAShared
    if getattr(Shared, "_gemmlib_mended", False):
        return

    def array(self, shape, dtype, alignment=None):
        if alignment is not None:
            raise RuntimeError("Array alignment is not supported in cudasim")
        if isinstance(dtype, types.Type):
            dtype = numpy_support.as_dtype(dtype)
        if shape == 0:   # dynamic shared memory: one buffer (as numba does)
            count = self._dynshared_size // dtype.itemsize
            return np.frombuffer(self._dynshared.data, dtype=dtype, count=count)
        f = sys._getframe(1)
        caller = (f.f_code.co_filename, f.f_lineno)
        res = self._allocations.get(caller)
        if res is None:
            res = self._allocations.setdefault(caller, np.empty(shape, dtype))
        return res

    Shared.array = array
    Shared._gemmlib_mended = True


_mend_simulator()


def _xdist_groups(items):
    """An xdist_group for each notebook and for each set of a module's tests that share a
    module-, class- or package-scoped fixture (directly or through another fixture), so
    that fixture is built once; other tests get none and are scheduled one by one."""
    parent = {}

    def find(x):
        root = x
        while parent.setdefault(root, root) != root:
            root = parent[root]
        while parent[x] != root:
            parent[x], x = root, parent[x]
        return root

    keys = {}
    for item in items:
        path = str(getattr(item, "path", item.fspath))
        if path.endswith(".ipynb"):
            keys[item] = path
            continue
        info = getattr(item, "_fixtureinfo", None)
        shared = []
        for name in getattr(info, "names_closure", ()):
            defs = info.name2fixturedefs.get(name)
            if defs and defs[-1].scope in ("module", "class", "package"):
                shared.append((path, name))
        if not shared:
            continue
        for other in shared:
            parent[find(other)] = find(shared[0])
        keys[item] = shared[0]
    for item, key in keys.items():
        if not isinstance(key, str):
            path, name = find(key)
            key = f"{path}::{name}"
        item.add_marker(pytest.mark.xdist_group(name=os.path.relpath(key)))


def pytest_collection_modifyitems(config, items):
    if getattr(config.option, "dist", "no") == "loadgroup":
        _xdist_groups(items)
    if backend.gpu_present():
        return
    why = ("simulator mode (NUMBA_ENABLE_CUDASIM=1)" if backend.SIMULATOR
           else "no CUDA GPU on this machine")
    skip = pytest.mark.skip(reason=f"needs a GPU: {why}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def rng():
    import numpy as np

    return np.random.default_rng()
