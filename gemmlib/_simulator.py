"""numba's CUDA simulator, with its thread-block scheduler waiting instead of spinning.

The simulator runs each CUDA thread of a block as a Python thread.  Its
``BlockManager.run`` (numba-cuda 0.30) then polls those threads in a loop that
never sleeps -- "is each one blocked in ``syncthreads`` or finished?" -- until
they all are, releases them, and polls again.  Under the GIL that loop competes
with the very threads it waits for: each time it gets the interpreter it keeps
it for a whole switch interval (5 ms), so a block of 256 threads can spend a
second per ``syncthreads`` doing nothing, and how often that happens depends on
how the OS schedules the threads.  The same verification of one rung measured
7 s, 124 s and 168 s of CPU time in three runs in one process.

:func:`install` swaps in a scheduler with the same rules -- a block's threads are
released from ``syncthreads`` when every live thread of the block waits there;
an exception in one thread aborts the others and is raised -- where the manager
sleeps on a condition that a thread notifies when it blocks in ``syncthreads``
or finishes.  Kernels, their results and their error messages are unchanged; only
the waiting is.  Set ``GEMMLIB_SIM_SCHEDULER=numba`` to keep numba's own.

It also lengthens the interpreter's switch interval to :data:`SWITCH_INTERVAL_S`
(unless it was set longer): a block's threads hand the GIL to one another where
they wait (``syncthreads``, a warp's exchange, an mbarrier), so the 5 ms default
only adds forced switches between threads that are all runnable -- about a sixth
of the simulator's CPU time in the test suite.

gemmlib.backend installs it when the simulator is on.  Remove once numba-cuda's
simulator stops polling.
"""

from __future__ import annotations

import os
import sys
import threading

import numpy as np

_installed = False

#: the switch interval (seconds) the simulator runs with; Python's default is 0.005
SWITCH_INTERVAL_S = 0.05


def install() -> bool:
    """Replace the simulator's block scheduler (once); False when left as numba's."""
    global _installed
    if _installed:
        return True
    if os.environ.get("GEMMLIB_SIM_SCHEDULER", "").lower() == "numba":
        return False
    try:
        from numba.cuda.simulator import kernel as K
    except ImportError:  # pragma: no cover - no simulator in this numba-cuda
        return False
    BlockManager, BlockThread = getattr(K, "BlockManager", None), getattr(K, "BlockThread", None)
    if BlockManager is None or BlockThread is None or not hasattr(BlockThread, "syncthreads"):
        return False  # pragma: no cover - a simulator this module does not know

    thread_run = BlockThread.run  # numba's: runs the kernel, keeps its exception in .exception

    def run_thread(self):
        try:
            thread_run(self)
        finally:
            m = self._manager
            with m._gemmlib_cv:
                m._gemmlib_live -= 1
                if self.exception is not None and m._gemmlib_failed is None:
                    m._gemmlib_failed = self
                m._gemmlib_cv.notify()

    def syncthreads(self):
        if self.abort:
            raise RuntimeError("abort flag set on syncthreads call")
        m = self._manager
        with m._gemmlib_cv:
            self.syncthreads_blocked = True
            m._gemmlib_blocked += 1
            if m._gemmlib_blocked >= m._gemmlib_live:
                m._gemmlib_cv.notify()
        self.syncthreads_event.wait()
        self.syncthreads_event.clear()
        if self.abort:
            raise RuntimeError("abort flag set on syncthreads clear")

    def run_block(self, grid_point, *args):
        cv = self._gemmlib_cv = threading.Condition()
        self._gemmlib_blocked = 0
        self._gemmlib_failed = None
        threads = []
        for block_point in np.ndindex(*self._block_dim):

            def target():
                self._f(*args)

            threads.append(BlockThread(target, self, grid_point, block_point, self._debug))
        self._gemmlib_live = len(threads)
        for t in threads:
            t.start()

        def settled():
            return (self._gemmlib_failed is not None or self._gemmlib_live == 0
                    or self._gemmlib_blocked == self._gemmlib_live)

        with cv:
            while True:
                cv.wait_for(settled)
                failed = self._gemmlib_failed
                if failed is not None:
                    # as numba does: abort the other threads, do not join them, raise
                    for t in threads:
                        t.abort = True
                        t.syncthreads_blocked = False
                        t.syncthreads_event.set()
                    raise failed.exception[0].with_traceback(failed.exception[1])
                if self._gemmlib_live == 0:
                    break
                # every live thread waits in syncthreads: release them all
                self._gemmlib_blocked = 0
                for t in threads:
                    if t.syncthreads_blocked:
                        t.syncthreads_blocked = False
                        t.syncthreads_event.set()
        for t in threads:
            t.join()
            if t.exception:
                raise t.exception[0].with_traceback(t.exception[1])

    BlockThread.run = run_thread
    BlockThread.syncthreads = syncthreads
    BlockManager.run = run_block
    _hold_module_swaps(K)
    if sys.getswitchinterval() < SWITCH_INTERVAL_S:
        sys.setswitchinterval(SWITCH_INTERVAL_S)
    _installed = True
    return True


def _hold_module_swaps(K) -> None:
    """A device function's module keeps the simulated ``cuda`` until the launch ends.

    numba calls each device function inside ``swapped_cuda_module``: the module's globals
    that name ``cuda`` are pointed at the kernel's fake module on entry and restored when
    the last thread leaves, so a module of helpers (the intrinsics' twins) is scanned and
    swapped again on nearly every call, under two locks.  Here the first call in a launch
    enters the same context and the launch leaves it; what each call sees is unchanged.
    """
    from numba.cuda.simulator import kernelapi

    FakeCUDAKernel = K.FakeCUDAKernel
    numba_call = FakeCUDAKernel.__call__
    held: dict = {}   # id(module globals) -> the swap entered for this launch
    lock = threading.Lock()

    def release():
        with lock:
            swaps = list(held.values())
            held.clear()
        for swap in swaps:
            swap.__exit__(None, None, None)

    def call(self, *args):
        ctx = K._kernel_context
        if ctx is None:
            if self._device:   # called from the host: numba's way
                return numba_call(self, *args)
            try:               # a launch
                return numba_call(self, *args)
            finally:
                release()
        fn = self.fn
        key = id(fn.__globals__)
        if key not in held:
            with lock:
                if key not in held:
                    swap = kernelapi.swapped_cuda_module(fn, ctx)
                    swap.__enter__()
                    held[key] = swap
        return fn(*args)

    FakeCUDAKernel.__call__ = call

