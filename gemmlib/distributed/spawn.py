"""CPU processes for tests and the course: torch.multiprocessing + gloo."""

from __future__ import annotations

import os
import tempfile
import time
import traceback

try:  # the layout helpers need no torch; the algorithms do
    import torch
    import torch.distributed as dist
except ImportError:  # pragma: no cover - torch is an optional dependency of gemmlib
    torch = dist = None


def _spawn_entry(rank, world, init, fn, args, queue, threads):
    try:
        torch.set_num_threads(threads)
        dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
        out = fn(rank, world, *args)
    except BaseException as e:  # noqa: BLE001 - reported before the group goes down
        queue.put(("error", rank, f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
    else:
        queue.put(("ok", rank, out))
    finally:
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:  # noqa: BLE001
                pass


def spawn_cpu(fn, nprocs: int, *args, timeout: float = 120.0, threads: int = 1) -> list:
    """Run ``fn(rank, world, *args)`` in ``nprocs`` CPU processes joined by gloo; return the
    values they return, by rank.

    The processes are started with ``torch.multiprocessing``'s spawn (``fn``
    must be importable: a module-level function of an importable module) and
    meet through a file store in a temporary folder.  A failure on any rank
    stops them all and raises RuntimeError with that rank's traceback; so does
    ``timeout`` (seconds).  ``threads``: BLAS/OpenMP threads per process.
    On GPUs, launch with ``torchrun`` instead.
    """
    import queue as _queue

    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    results: dict = {}
    saved = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                                            "MKL_NUM_THREADS")}
    with tempfile.TemporaryDirectory(prefix="gemmlib-dist-") as d:
        init = "file://" + os.path.join(d, "store")
        q = ctx.Queue()
        procs = []
        try:
            for k in saved:
                os.environ[k] = str(threads)
            for r in range(nprocs):
                p = ctx.Process(target=_spawn_entry, args=(r, nprocs, init, fn, args, q, threads),
                                daemon=True)
                p.start()
                procs.append(p)
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        deadline = time.monotonic() + timeout
        error = None
        try:
            while len(results) < nprocs and error is None:
                try:
                    status, rank, value = q.get(timeout=0.2)
                except _queue.Empty:
                    if time.monotonic() > deadline:
                        error = f"timed out after {timeout:.0f} s ({len(results)} of {nprocs} done)"
                    dead = [p for p in procs if p.exitcode not in (None, 0)]
                    if dead and error is None:
                        error = f"a process died with exit code {dead[0].exitcode}"
                    continue
                if status == "ok":
                    results[rank] = value
                else:
                    error = f"rank {rank} failed: {value}"
        finally:
            if error is not None:
                for p in procs:
                    if p.is_alive():
                        p.terminate()
            for p in procs:
                p.join(timeout=10)
        if error is not None:
            raise RuntimeError(f"spawn_cpu({getattr(fn, '__name__', fn)}, {nprocs}): {error}")
    return [results[r] for r in range(nprocs)]
