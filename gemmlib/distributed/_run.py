"""Running work: the local product, streams and events on a GPU, handles on CPU processes."""

from __future__ import annotations

import time

import numpy as np

try:  # the layout helpers need no torch; the algorithms do
    import torch
    import torch.distributed as dist
except ImportError:  # pragma: no cover - torch is an optional dependency of gemmlib
    torch = dist = None

from ._timeline import Timeline, _Completion  # noqa: F401


def local_product(A, B, out=None):
    """``A @ B`` written into ``out`` (C-contiguous, float32 or the operands' 16-bit dtype)
    if given, else returned in float32.

    CUDA tensors: ``gemmlib.matmul`` on torch's current stream (fp16/bf16 on
    the tensor cores, fp32 on the CUDA cores).  CPU tensors: a NumPy product
    in float32 (fp16/bf16 converted first), for the CPU processes of tests
    and of the course.
    """
    if A.is_cuda:
        import gemmlib

        if out is None:
            out = torch.empty((A.shape[0], B.shape[1]), dtype=torch.float32, device=A.device)
        if out.numel():
            gemmlib.matmul(A, B, out=out)
        return out
    a = A.numpy() if A.dtype == torch.float32 else A.float().numpy()
    b = B.numpy() if B.dtype == torch.float32 else B.float().numpy()
    if out is None:
        return torch.from_numpy(np.matmul(a, b))
    if out.dtype == torch.float32:
        np.matmul(a, b, out=out.numpy())
    else:
        out.copy_(torch.from_numpy(np.matmul(a, b)))
    return out


_COMM_STREAMS: dict = {}


def _comm_stream(device):
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _COMM_STREAMS:
        _COMM_STREAMS[idx] = torch.cuda.Stream(device=idx)
    return _COMM_STREAMS[idx]


class _Runner:
    """Issues transfers and products, and records them, on a GPU or on CPU processes.

    On a GPU, products run on the *compute* stream (torch's current one) and
    transfers on a side *comm* stream.  Every tensor a transfer reads or writes
    is passed as ``keep`` and held until :meth:`finish`, which also makes the
    compute stream wait for everything queued on the comm stream: only then
    may the caching allocator (stream-ordered on the compute stream, where the
    buffers were made) hand their memory out again.  Without that, a staging
    buffer freed by Python right after its collective was *issued* was reused
    by the next one before NCCL had read it.  (``record_stream`` would also be
    safe, but it delays the reuse of every block, so each call got new
    addresses, and gemmlib's per-address TMA maps were rebuilt on every call.)
    """

    def __init__(self, device, timeline: Timeline | None, label: str):
        self.gpu = device.type == "cuda"
        self.tl = timeline
        self.call = timeline._new_call() if timeline is not None else 0
        self.label = label
        self._keep: list = []
        if self.gpu:
            self.compute = torch.cuda.current_stream(device)
            self.comm = _comm_stream(device)
        self.t_start = self._now(self.compute if self.gpu else None)
        if timeline is not None and timeline._origin is None:
            timeline._origin = self.t_start

    def _now(self, stream):
        if self.tl is None:
            return None
        if self.gpu:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record(stream)
            return ev
        return time.perf_counter()

    def _hold(self, keep) -> None:
        self._keep.extend(t for t in keep if t is not None)

    def _on_comm(self, label: str, body, after=None):
        """Queue ``body`` on the comm stream after the compute stream's work so far (or after
        the event ``after``); record it; return an event for :meth:`wait`."""
        if after is None:
            self.comm.wait_stream(self.compute)   # inputs (and reused memory) are ready
        else:
            self.comm.wait_event(after)
        with torch.cuda.stream(self.comm):
            t0 = self._now(self.comm)
            body()
            done = torch.cuda.Event(enable_timing=self.tl is not None)
            done.record(self.comm)
        if self.tl is not None:
            self.tl._add(self.call, "comm", label, t0, done)
        return done

    def issue(self, label: str, ops, keep=()):
        """Start the collectives ``ops`` (callables taking ``async_op``), in order, on the
        comm stream after the work queued so far; return what :meth:`wait` needs.  Nothing
        blocks the host."""
        self._hold(keep)
        if self.gpu:
            def chain():
                for op in ops:
                    op(True).wait()               # the comm stream waits for NCCL: a chain
            return self._on_comm(label, chain)
        t0 = self._now(None)
        works = [op(True) for op in ops]
        if self.tl is not None:
            end = _Completion(t0, len(works))      # set by gloo's thread as each one completes
            for w in works:
                w.get_future().add_done_callback(end.done)
            self.tl._add(self.call, "comm", label, t0, end)
        return works

    def side(self, label: str, fn, keep=(), after=None):
        """Run ``fn`` (copies, a barrier) on the comm stream, after the compute stream's work
        so far (``after=None``) or after the event ``after``; return an event for
        :meth:`wait`.  On CPU processes ``fn`` runs now, on the host."""
        self._hold(keep)
        if self.gpu:
            return self._on_comm(label, fn, after)
        t0 = self._now(None)
        fn()
        if self.tl is not None:
            self.tl._add(self.call, "comm", label, t0, self._now(None))
        return None

    def mark(self):
        """An event after the compute stream's work so far (None on CPU processes)."""
        if not self.gpu:
            return None
        ev = torch.cuda.Event()
        ev.record(self.compute)
        return ev

    def wait(self, handle) -> None:
        """Make the products that follow wait for an :meth:`issue` or :meth:`side` (on a
        GPU: the compute stream waits for its event; on CPU: the host waits for the handles)."""
        if handle is None:
            return
        if self.gpu:
            self.compute.wait_event(handle)
        else:
            for w in handle:
                w.wait()

    def run(self, label: str, fn, kind: str = "compute"):
        t0 = self._now(self.compute if self.gpu else None)
        out = fn()
        if self.tl is not None:
            self.tl._add(self.call, kind, label, t0, self._now(self.compute if self.gpu else None))
        return out

    def finish(self) -> None:
        if self.gpu:
            self.compute.wait_stream(self.comm)   # before the held buffers can be reused
        if self.tl is not None:
            self.tl._add(self.call, "call", self.label, self.t_start,
                         self._now(self.compute if self.gpu else None))
        self._keep.clear()
