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
  (:func:`pytest_xdist_make_scheduler`).
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


def _groups(items) -> dict:
    """{nodeid: group} for the tests that must share a worker: each notebook's cells (they
    run in order in one kernel), and each set of a module's tests that share a module-,
    class- or package-scoped fixture (directly or through another fixture), so that
    fixture is built once; an explicit ``xdist_group`` mark is honoured too.  Every other
    test is left out: it is scheduled on its own."""
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
        path = os.path.relpath(str(getattr(item, "path", item.fspath)))
        mark = item.get_closest_marker("xdist_group")
        if path.endswith(".ipynb") or mark is not None:
            keys[item.nodeid] = (mark.args[0] if mark is not None and mark.args else
                                 mark.kwargs.get("name", "default") if mark is not None else path)
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
        keys[item.nodeid] = shared[0]
    return {nodeid: key if isinstance(key, str) else "::".join(find(key))
            for nodeid, key in keys.items()}


_GROUPS_ENV = "GEMMLIB_XDIST_GROUPS"


def pytest_configure(config):
    """With ``-n N --dist loadgroup`` (``make test``), the controller names a folder where
    each worker leaves the groups of its collection (see :func:`pytest_xdist_make_scheduler`)."""
    if hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None) \
            or config.getvalue("dist") != "loadgroup":
        return
    import tempfile

    where = tempfile.mkdtemp(prefix="gemmlib-xdist-groups-")
    os.environ[_GROUPS_ENV] = where   # the workers, started after this, inherit it
    config._gemmlib_groups = where


def pytest_unconfigure(config):
    where = getattr(config, "_gemmlib_groups", None)
    if where:
        import shutil

        shutil.rmtree(where, ignore_errors=True)
        os.environ.pop(_GROUPS_ENV, None)


def pytest_xdist_make_scheduler(config, log):
    """``--dist loadgroup`` with the groups of :func:`_groups`: each group is one unit of
    work, the largest first (the compile gate's 78 tests share one fixture), then every
    other test on its own, so the workers finish together instead of one of them running
    a long file to the end.  (xdist's own loadgroup cannot be used: it marks a group by
    appending ``@name`` to ``item._nodeid``, which pytest 9 no longer reads.)"""
    where = getattr(config, "_gemmlib_groups", None)
    if not where:
        return None
    import glob
    import json

    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        groups = None

        def _split_scope(self, nodeid):
            if self.groups is None:   # called once every worker has collected
                self.groups = {}
                for f in sorted(glob.glob(os.path.join(where, "*.json"))):
                    with open(f) as fh:
                        self.groups.update(json.load(fh))
            return self.groups.get(nodeid, nodeid)

    return GroupScheduling(config, log)


def pytest_collection_modifyitems(config, items):
    where = os.environ.get(_GROUPS_ENV)
    if where and hasattr(config, "workerinput"):
        import json

        path = os.path.join(where, f"{config.workerinput['workerid']}.json")
        with open(path + ".tmp", "w") as f:
            json.dump(_groups(items), f)
        os.replace(path + ".tmp", path)
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


@pytest.fixture
def launched(monkeypatch):
    """``launched(record)``: a list that gets ``record(plan, A, B)`` for every kernel launch
    through ``gemmlib.runtime.launch.launch`` (which still runs): what reached the kernel."""
    from gemmlib.runtime import launch

    def spy(record):
        seen = []
        real = launch.launch

        def recorded(plan, A, B, C, *args, **kw):
            seen.append(record(plan, A, B))
            return real(plan, A, B, C, *args, **kw)

        monkeypatch.setattr(launch, "launch", recorded)
        return seen

    return spy


@pytest.fixture
def no_reorder(monkeypatch):
    """An operand copied into another order (``gemmlib.paths.product.reordered``) fails."""
    from gemmlib.paths import product

    def no_copy(op, order, stream):
        raise AssertionError(f"copied an operand into {order} order")

    monkeypatch.setattr(product, "reordered", no_copy)
