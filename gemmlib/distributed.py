"""GEMM over several GPUs (or CPU processes): 1-D tensor-parallel and SUMMA.

One process per GPU, launched the standard way::

    torchrun --nproc-per-node=4 my_script.py

and in each process::

    import os, torch, torch.distributed as dist
    from gemmlib import distributed as gd

    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))     # set by torchrun
    dist.init_process_group("nccl")
    # this rank's row block of A and column block of B (any sizes, even uneven or empty)
    C_cols = gd.allgather_matmul(A_rows, B_cols, gather="A", overlap=True)   # C[:, my columns]
    C_rows = gd.allgather_matmul(A_rows, B_cols, gather="B", overlap=True)   # C[my rows, :]
    C_blk = gd.summa(A_blk, B_blk, grid=(2, 2))                              # C[my rows, my cols]

The engine
----------
Communication goes through ``torch.distributed``: NCCL between GPUs, gloo
between CPU processes.  Not CuPy's NCCL bindings, because torch.distributed
brings what those leave to the caller:

* the launcher (``torchrun``: ranks, rendezvous, the environment) and the
  process groups, sub-groups included (SUMMA's process rows and columns are
  ``torch.distributed.new_group`` s);
* asynchronous collectives that return a work handle (``async_op=True``),
  whose ``wait()`` makes the *current CUDA stream* wait for the NCCL kernel
  without blocking the host: that is the whole overlap mechanism below;
* the same code on CPU processes through gloo, so every algorithm here runs
  and is tested in CI without a GPU (``tests/test_distributed.py``);
* the baseline the measurements compare with (``torch.matmul`` + NCCL) in
  the same framework.

Nothing here moves bytes itself: every transfer is a torch.distributed
collective (all-gather, broadcast), and every local product is
:func:`local_product`, which is ``gemmlib.matmul`` on CUDA tensors (on
torch's current stream) and a NumPy product on CPU tensors.  Results are
float32 (gemmlib accumulates fp16/bf16 products in fp32 and returns fp32).

The algorithms
--------------
* :func:`allgather_matmul`, 1-D tensor parallelism.  A is split by rows and B
  by columns over the P ranks (rank r holds ``A[rows_r, :]`` and
  ``B[:, cols_r]``).  ``gather="A"`` all-gathers A, and each rank computes
  ``C[:, cols_r] = A @ B[:, cols_r]``; ``gather="B"`` all-gathers B and each
  rank computes ``C[rows_r, :] = A[rows_r, :] @ B``.  Each GPU receives
  (P-1)/P of the gathered operand and does 1/P of the flops, so gather the
  smaller one (A when M < N).
* ``overlap=True``: the all-gather is cut into ``chunks`` pieces, all issued
  at once on a communication stream; the product of the rank's own shard
  (which needs no communication) runs while the first chunk is gathered,
  and the products of chunk i run while chunk i+1 is gathered.
* :func:`summa`, on a Pr x Pc process grid (:class:`ProcessGrid`): rank
  (i, j) holds block (i, j) of A, B and C.  K is cut into panels; for each
  panel the owner of A's panel broadcasts it along its process row and the
  owner of B's panel along its process column, and every rank adds
  ``A_panel @ B_panel`` to its block of C.  ``pipelined=True`` issues the
  next panel's broadcasts before the current panel's product.  Any P: the
  default grid is the squarest factorisation (a prime P gives 1 x P).

Uneven shards
-------------
Shards may have any sizes (M < P gives empty shards).  NCCL's all-gather
needs every rank to send the same number of elements, so each rank's piece
is flattened and padded at its *end* to the largest piece's size; the
receive buffer is ``(P, largest)``, and rank r's piece is the first
``rows_r * cols_r`` elements of row r, viewed as its own shape: contiguous,
so the local products read it in place; the padding is never read.  When
all pieces are the same size nothing is padded or copied.

Who holds which sizes is learnt in one small all-gather of a few integers
per rank (shapes, dtype, options), from which every rank checks every other
rank's operands and raises the *same* error (never a hang on one rank and an
error on another).  That exchange waits for the GPU (the sizes go to the
host); pass ``sizes=`` to skip it once the layout is known (then nothing is
checked across ranks).

Streams on a GPU
----------------
Local products run on torch's current stream (the *compute* stream).
Collectives are issued from a side stream (the *communication* stream) that
first waits for the compute stream, so that NCCL does not wait for products
queued earlier; after each collective the communication stream waits for it
(``work.wait()`` in that stream's context), and a CUDA event recorded there
is what the compute stream waits on before using the data.  Collectives on
different groups (SUMMA's rows and columns) are thereby chained in the same
order on every rank, as NCCL requires of concurrent communicators.  The host
never blocks.  On CPU processes the same code path issues gloo's
asynchronous collectives and waits on their handles.

:class:`Timeline` records when each product and each collective ran (CUDA
events on a GPU, ``time.perf_counter`` on CPU), for the overlap figures.

What it costs beyond the products and the collectives
-----------------------------------------------------
* SUMMA adds each panel's product into C through a temporary (``C += T``):
  ``gemmlib.matmul`` has no accumulating form.  Hence the default of one
  panel per stretch of K with the same owners.
* ``gather="B"`` writes column blocks of C, which are strided: their
  products go through a temporary and a copy (without overlap, B's blocks
  are concatenated once instead).
* The metadata exchange waits for the GPU (``sizes=`` skips it).
"""

from __future__ import annotations

import math
import os
import tempfile
import time
import traceback
from dataclasses import dataclass, field

import numpy as np

try:  # the layout helpers (split_sizes, panels, ...) need no torch; the algorithms do
    import torch
    import torch.distributed as dist
except ImportError:  # pragma: no cover - torch is an optional dependency of gemmlib
    torch = dist = None

__all__ = [
    "allgather_matmul", "summa", "ProcessGrid", "Timeline", "local_product", "split_sizes",
    "offsets", "grid_shape", "panels", "result_slices", "spawn_cpu", "summarize",
]

#: dtypes the local products take (gemmlib.matmul's precisions), by torch's name
DTYPES = {"torch.float32": 1, "torch.float16": 2, "torch.bfloat16": 3}
_DTYPE_NAMES = {1: "float32", 2: "float16", 3: "bfloat16"}
_MAGIC = 0x6D6D  # first field of every rank's metadata: the same call on every rank
_ALLGATHER, _SUMMA = 1, 2
_NFIELDS = 14


# --------------------------------------------------------------------------
# Layout helpers: who holds what


def split_sizes(n: int, parts: int) -> list[int]:
    """``n`` items in ``parts`` contiguous shards: the first ``n % parts`` get one more."""
    if parts < 1 or n < 0:
        raise ValueError(f"cannot split {n} into {parts} parts")
    q, r = divmod(n, parts)
    return [q + (i < r) for i in range(parts)]


def offsets(sizes) -> list[int]:
    """Where each shard starts: ``[0, s0, s0 + s1, ...]`` (one more entry than ``sizes``)."""
    out = [0]
    for s in sizes:
        out.append(out[-1] + int(s))
    return out


def grid_shape(P: int) -> tuple[int, int]:
    """The squarest Pr x Pc = P with Pr <= Pc (a prime P gives 1 x P)."""
    if P < 1:
        raise ValueError(f"a process grid needs at least one process, not {P}")
    pr = max(d for d in range(1, math.isqrt(P) + 1) if P % d == 0)
    return pr, P // pr


def panels(ka, kb, width: int | None = None) -> list[tuple[int, int, int, int]]:
    """SUMMA's panels along K: ``(k0, k1, a_col, b_row)`` for each.

    ``ka[j]``: columns of A held by grid column j; ``kb[i]``: rows of B held by
    grid row i (both sum to K).  A panel never crosses an owner's boundary, so
    it lies in grid column ``a_col``'s A blocks and grid row ``b_row``'s B
    blocks; ``width`` cuts panels further to at most that many columns.
    """
    if sum(ka) != sum(kb):
        raise ValueError(f"A's K split {list(ka)} and B's {list(kb)} do not add up to the same K")
    if width is not None and width < 1:
        raise ValueError(f"panel width must be at least 1, not {width}")
    oa, ob = offsets(ka), offsets(kb)
    cuts = sorted(set(oa) | set(ob))
    out = []
    for k0, k1 in zip(cuts, cuts[1:]):
        step = width or (k1 - k0)
        for s in range(k0, k1, step):
            e = min(k1, s + step)
            ja = max(j for j in range(len(ka)) if oa[j] <= s and ka[j] > 0 and s < oa[j + 1])
            ib = max(i for i in range(len(kb)) if ob[i] <= s and kb[i] > 0 and s < ob[i + 1])
            out.append((s, e, ja, ib))
    return out


def result_slices(M: int, N: int, P: int, rank: int, *, gather: str | None = None,
                  grid: tuple[int, int] | None = None) -> tuple[slice, slice]:
    """The rows and columns of C that ``rank`` holds after :func:`allgather_matmul`
    (``gather=``) or :func:`summa` (``grid=``), with the standard split (:func:`split_sizes`)."""
    if gather is not None:
        if gather == "A":  # C[:, cols_r]
            o = offsets(split_sizes(N, P))
            return slice(0, M), slice(o[rank], o[rank + 1])
        o = offsets(split_sizes(M, P))
        return slice(o[rank], o[rank + 1]), slice(0, N)
    pr, pc = grid or grid_shape(P)
    i, j = divmod(rank, pc)
    om, on = offsets(split_sizes(M, pr)), offsets(split_sizes(N, pc))
    return slice(om[i], om[i + 1]), slice(on[j], on[j + 1])


# --------------------------------------------------------------------------
# Local products


def local_product(A, B, out=None):
    """``A @ B`` in float32, written into ``out`` (float32, C-contiguous) if given.

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
    np.matmul(a, b, out=out.numpy())
    return out


# --------------------------------------------------------------------------
# Timeline


@dataclass
class Timeline:
    """What each call did and when, for figures of compute against communication.

    Pass one to the algorithms (``timeline=``); each records a ``call`` span
    and a ``compute`` or ``comm`` span for every product and collective.  On
    a GPU the spans are CUDA events (read once the work is done); on CPU
    processes ``time.perf_counter`` (a collective ends when gloo completes it,
    read from its future).  :meth:`records` returns them in milliseconds from
    the first span this rank recorded; :meth:`gather` collects every rank's.
    """

    rank: int = 0
    _spans: list = field(default_factory=list)   # (call, kind, label, start, end)
    _calls: int = 0
    _origin: object = None                       # the first call's start: time zero

    def _new_call(self) -> int:
        self._calls += 1
        return self._calls - 1

    def _add(self, call, kind, label, start, end):
        self._spans.append((call, kind, label, start, end))

    def records(self) -> list[dict]:
        """Every span as a dict: rank, call, kind, label, start_ms, end_ms (waits for the GPU)."""
        if not self._spans:
            return []
        gpu = not isinstance(self._origin, float)
        out = []
        if gpu:
            for s in self._spans:
                s[4].synchronize()
            t = lambda ev: self._origin.elapsed_time(ev)  # noqa: E731
        else:
            t = lambda v: 1e3 * ((v.value() if isinstance(v, _Completion) else v)  # noqa: E731
                                 - self._origin)
        for call, kind, label, start, end in self._spans:
            out.append(dict(rank=self.rank, call=call, kind=kind, label=label,
                            start_ms=t(start), end_ms=t(end),
                            clock="cuda_event" if gpu else "perf_counter"))
        return out

    def gather(self, group=None) -> list[dict]:
        """Every rank's :meth:`records` (collective: call it on every rank of ``group``).
        CPU clocks are shared by the processes of one machine, so CPU records are put on one
        time axis (from the earliest span of any rank); GPU records keep each rank's own."""
        mine = self.records()
        if mine and mine[0]["clock"] == "perf_counter":
            for r in mine:
                r["abs_start"] = self._origin
        every = [None] * dist.get_world_size(group)
        dist.all_gather_object(every, mine, group=group)
        recs = [r for part in every for r in part]
        starts = [r["abs_start"] for r in recs if "abs_start" in r]
        if starts:
            t0 = min(starts)
            for r in recs:
                shift = 1e3 * (r.pop("abs_start") - t0)
                r["start_ms"] += shift
                r["end_ms"] += shift
        return recs


def _union(intervals) -> list[tuple[float, float]]:
    out = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


def _length(intervals) -> float:
    return sum(e - s for s, e in intervals)


def _intersection(a, b) -> float:
    total, i, j = 0.0, 0, 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        total += max(0.0, hi - lo)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def summarize(records) -> list[dict]:
    """Per (rank, call): wall, compute and communication time (ms, each the length of the
    union of its spans), the time both ran at once, and the share of the communication that
    compute hid (``hidden``: overlap / comm)."""
    groups: dict = {}
    for r in records:
        groups.setdefault((r["rank"], r["call"]), []).append(r)
    out = []
    for (rank, call), rs in sorted(groups.items()):
        comp = _union([(r["start_ms"], r["end_ms"]) for r in rs if r["kind"] == "compute"])
        comm = _union([(r["start_ms"], r["end_ms"]) for r in rs if r["kind"] == "comm"])
        calls = [r for r in rs if r["kind"] == "call"]
        wall = (max(r["end_ms"] for r in calls) - min(r["start_ms"] for r in calls)) if calls \
            else float("nan")
        ov = _intersection(comp, comm)
        c = _length(comm)
        out.append(dict(rank=rank, call=call, label=calls[0]["label"] if calls else "",
                        wall_ms=wall, compute_ms=_length(comp), comm_ms=c, overlap_ms=ov,
                        hidden=ov / c if c > 0 else float("nan")))
    return out


# --------------------------------------------------------------------------
# Running work: streams and events on a GPU, handles on CPU processes

_COMM_STREAMS: dict = {}


def _comm_stream(device):
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _COMM_STREAMS:
        _COMM_STREAMS[idx] = torch.cuda.Stream(device=idx)
    return _COMM_STREAMS[idx]


class _Completion:
    """When the last of ``n`` gloo collectives completed (perf_counter), set from gloo's thread."""

    def __init__(self, t0: float, n: int):
        self.t, self.left = t0, n

    def done(self, _future) -> None:
        self.t = max(self.t, time.perf_counter())
        self.left -= 1

    def value(self) -> float:
        deadline = time.perf_counter() + 5.0       # callbacks may run just after wait() returns
        while self.left > 0 and time.perf_counter() < deadline:
            time.sleep(1e-4)
        return self.t


class _Runner:
    """Issues collectives and products, and records them, on a GPU or on CPU."""

    def __init__(self, device, timeline: Timeline | None, label: str):
        self.gpu = device.type == "cuda"
        self.tl = timeline
        self.call = timeline._new_call() if timeline is not None else 0
        self.label = label
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

    def issue(self, label: str, ops):
        """Start the collectives ``ops`` (callables taking ``async_op``), in order; return
        what :meth:`wait` needs.  Nothing blocks the host."""
        if self.gpu:
            self.comm.wait_stream(self.compute)   # inputs (and reused memory) are ready
            with torch.cuda.stream(self.comm):
                t0 = self._now(self.comm)
                for op in ops:
                    op(True).wait()               # the comm stream waits for NCCL: a chain
                done = torch.cuda.Event(enable_timing=self.tl is not None)
                done.record(self.comm)
            if self.tl is not None:
                self.tl._add(self.call, "comm", label, t0, done)
            return done
        t0 = self._now(None)
        works = [op(True) for op in ops]
        if self.tl is not None:
            end = _Completion(t0, len(works))      # set by gloo's thread as each one completes
            for w in works:
                w.get_future().add_done_callback(end.done)
            self.tl._add(self.call, "comm", label, t0, end)
        return works

    def wait(self, handle) -> None:
        """Make the products that follow wait for an :meth:`issue` (on a GPU: the compute
        stream waits for its event; on CPU: the host waits for the handles)."""
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
        if self.tl is not None:
            self.tl._add(self.call, "call", self.label, self.t_start,
                         self._now(self.compute if self.gpu else None))


# --------------------------------------------------------------------------
# Checks: local ones first, then every rank checks every rank


def _group_info(group):
    if torch is None:
        raise ImportError("gemmlib.distributed needs torch (with torch.distributed): "
                          "pip install torch")
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(
            "torch.distributed is not initialised: launch with torchrun and call "
            "torch.distributed.init_process_group('nccl') (or 'gloo' for CPU tensors) first")
    if group is not None and group == dist.GroupMember.NON_GROUP_MEMBER:
        raise ValueError("this process is not a member of the group it passed")
    try:
        rank = dist.get_rank(group)
    except Exception as e:  # pragma: no cover - torch versions word this differently
        raise ValueError(f"this process is not a member of the group it passed ({e})") from e
    if rank < 0:
        raise ValueError("this process is not a member of the group it passed")
    return rank, dist.get_world_size(group), str(dist.get_backend(group)).lower()


def _local_problem(name, x, backend) -> str | None:
    """Why ``x`` cannot be a local operand (None when it can)."""
    if not isinstance(x, torch.Tensor):
        return f"TypeError:{name} must be a torch tensor, not {type(x).__name__}"
    if x.dim() != 2:
        return f"ValueError:{name} must be a 2-D matrix; got shape {tuple(x.shape)}"
    if str(x.dtype) not in DTYPES:
        return (f"TypeError:{name} has dtype {x.dtype}; the local products take float32, "
                f"float16 or bfloat16: convert it first ({name}.float() or {name}.half())")
    if x.requires_grad:
        return (f"TypeError:{name} requires grad; gemmlib.distributed has no autograd: "
                f"pass {name}.detach()")
    if not x.is_contiguous():
        return (f"ValueError:{name} is not contiguous (a transposed or strided view?): "
                f"pass {name}.contiguous()")
    if x.is_cuda and "nccl" not in backend:
        return (f"TypeError:{name} is a CUDA tensor but the process group uses {backend}: "
                f"initialise it with init_process_group('nccl')")
    if not x.is_cuda and "gloo" not in backend:
        return (f"TypeError:{name} is a CPU tensor but the process group uses {backend}, "
                f"which moves GPU memory only: move it to the GPU (.cuda()) or use 'gloo'")
    if x.is_cuda and x.device.index != torch.cuda.current_device():
        return (f"ValueError:{name} lives on cuda:{x.device.index} but the current device is "
                f"cuda:{torch.cuda.current_device()}: call torch.cuda.set_device(local_rank) "
                f"once per process")
    return None


def _local_checks(A, B, backend) -> str | None:
    why = _local_problem("A", A, backend) or _local_problem("B", B, backend)
    if why:
        return why
    if A.dtype != B.dtype:
        return (f"TypeError:A is {A.dtype} but B is {B.dtype}: give both operands the same "
                f"dtype")
    if A.device != B.device:
        return f"TypeError:A is on {A.device} but B is on {B.device}: put both on one device"
    return None


def _raise(why: str):
    kind, _, msg = why.partition(":")
    raise (TypeError if kind == "TypeError" else ValueError)(msg)


def _meta_device(backend):
    if "nccl" in backend and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _all_gather_flat(out, inp, group, async_op=False):
    """All-gather of equal-sized flat pieces (torch 2.13 renamed all_gather_into_tensor)."""
    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return fn(out, inp, group=group, async_op=async_op)


def _exchange(fields, group, backend, P) -> list[list[int]]:
    """Every rank's metadata (one small all-gather, and a wait for it on the host)."""
    dev = _meta_device(backend)
    mine = torch.tensor(fields, dtype=torch.int64, device=dev)
    every = torch.empty(P * _NFIELDS, dtype=torch.int64, device=dev)
    _all_gather_flat(every, mine, group)
    return every.view(P, _NFIELDS).tolist()


def _fields(algo, opts, A, B, why) -> list[int]:
    """One rank's metadata: [magic, algorithm, 4 options, A's shape, B's shape, dtype,
    device (0 CPU, 1 GPU), refused (0/1), 0]."""
    ok = why is None
    a = list(A.shape) if ok else [-1, -1]
    b = list(B.shape) if ok else [-1, -1]
    dt = DTYPES.get(str(A.dtype), 0) if ok else 0
    dev = (1 if A.is_cuda else 0) if ok else -1
    opts = list(opts) + [0] * (4 - len(opts))
    return [_MAGIC, algo, *opts, *a, *b, dt, dev, 0 if ok else 1, 0]


def _check_table(table, rank, why, opt_names, call):
    """Refuse on every rank when any rank refused, or the ranks called different things."""
    if why is not None:
        _raise(why)
    bad = [r for r, t in enumerate(table) if t[12] != 0]
    if bad:
        raise ValueError(f"{call}: rank {bad[0]} refused its operands (its own error says why); "
                         f"every rank stops")
    if any(t[0] != _MAGIC or t[1] != table[0][1] for t in table):
        raise ValueError(f"the ranks called different functions: every rank must call {call}")
    for k, name in enumerate(opt_names):
        vals = [t[2 + k] for t in table]
        if any(v != vals[0] for v in vals):
            r = next(r for r, v in enumerate(vals) if v != vals[0])
            raise ValueError(f"{call}: rank {r} passed {name}={_opt(name, vals[r])} but rank 0 "
                             f"passed {name}={_opt(name, vals[0])}; every rank must pass the same")
    dts = [t[10] for t in table]
    if any(d != dts[0] for d in dts):
        r = next(r for r, d in enumerate(dts) if d != dts[0])
        raise TypeError(f"{call}: rank {r}'s operands are {_DTYPE_NAMES[dts[r]]} but rank 0's are "
                        f"{_DTYPE_NAMES[dts[0]]}; convert them to one dtype on every rank")
    devs = [t[11] for t in table]
    if any(d != devs[0] for d in devs):
        r = next(r for r, d in enumerate(devs) if d != devs[0])
        where = lambda d: "a GPU" if d else "the CPU"  # noqa: E731
        raise TypeError(f"{call}: rank {r}'s operands are on {where(devs[r])} but rank 0's are on "
                        f"{where(devs[0])}; put every rank's operands on its GPU")


def _opt(name, v):
    return {"gather": {0: "'A'", 1: "'B'"}}.get(name, {}).get(v, v)


# --------------------------------------------------------------------------
# 1-D tensor parallelism: all-gather one operand


def allgather_matmul(A_local, B_local, *, gather: str, overlap: bool = False,
                     chunks: int | None = None, group=None, sizes=None,
                     timeline: Timeline | None = None, product=None):
    """1-D tensor-parallel ``C = A @ B``: all-gather one operand, multiply by the other.

    Parameters
    ----------
    A_local : this rank's rows of A, ``A[rows_r, :]`` (M_r x K).
    B_local : this rank's columns of B, ``B[:, cols_r]`` (K x N_r).
        torch tensors, float32, float16 or bfloat16, the same dtype on every
        rank, C-contiguous; CUDA tensors on the current device with an NCCL
        group, CPU tensors with a gloo group.  Shards may have any sizes,
        zero included; every rank's K must be the same.
    gather : ``"A"`` all-gathers A and returns ``C[:, cols_r]`` (M x N_r);
        ``"B"`` all-gathers B and returns ``C[rows_r, :]`` (M_r x N).  Each
        rank receives (P-1)/P of the gathered operand: gather the smaller.
    overlap : False: gather, then multiply.  True: the gather is cut into
        ``chunks`` pieces (default 2) issued at once; the product of the rank's
        own shard runs during the first piece, and the products of piece i
        during piece i+1.
    group : the process group (default: every process).
    sizes : every rank's shard size along the gathered dimension (A's rows
        or B's columns), to skip the metadata exchange.  Default None: the
        ranks exchange their shapes, and every rank raises the same error when
        any operand is wrong.
    timeline : a :class:`Timeline` to record the products and collectives in.
    product : the local product, ``product(A, B, out)``; default
        :func:`local_product` (``gemmlib.matmul`` on a GPU).

    Returns the float32 result block described under ``gather``.
    """
    rank, P, backend = _group_info(group)
    if chunks is None:
        chunks = 2 if overlap else 1
    why = None
    if gather not in ("A", "B"):
        why = (f"ValueError:gather must be 'A' (C[:, my columns]) or 'B' (C[my rows, :]), "
               f"not {gather!r}")
    elif not isinstance(chunks, int) or chunks < 1:
        why = f"ValueError:chunks must be a positive integer, not {chunks!r}"
    elif chunks > 1 and not overlap:
        why = ("ValueError:chunks only applies with overlap=True (without overlap the gather is "
               "one collective)")
    why = why or _local_checks(A_local, B_local, backend)
    if why is None and A_local.shape[1] != B_local.shape[0]:
        why = (f"ValueError:A_local is {tuple(A_local.shape)} and B_local is "
               f"{tuple(B_local.shape)}: A's columns and B's rows are both K")
    gi = {"A": 0, "B": 1}.get(gather, -1)
    chunks_i = chunks if isinstance(chunks, int) else -1
    call = f"allgather_matmul(gather={gather!r})"
    if sizes is None:
        table = _exchange(_fields(_ALLGATHER, (gi, int(bool(overlap)), chunks_i), A_local,
                                  B_local, why), group, backend, P)
        _check_table(table, rank, why, ("gather", "overlap", "chunks"), call)
        ks = [t[7] for t in table]                 # A_local's columns
        kb = [t[8] for t in table]                 # B_local's rows
        if any(k != ks[0] for k in ks + kb):
            r = next(r for r in range(P) if ks[r] != ks[0] or kb[r] != ks[0])
            raise ValueError(
                f"{call}: every rank's shards must share K: rank 0 has A_local "
                f"{tuple(table[0][6:8])} and B_local {tuple(table[0][8:10])}, rank {r} has "
                f"A_local {tuple(table[r][6:8])} and B_local {tuple(table[r][8:10])}")
        sizes = [t[6] if gather == "A" else t[9] for t in table]
    else:
        if why is not None:
            _raise(why)
        sizes = [int(v) for v in sizes]
        own = A_local.shape[0] if gather == "A" else B_local.shape[1]
        if len(sizes) != P or sizes[rank] != own:
            raise ValueError(f"{call}: sizes={sizes} must list all {P} ranks' shard sizes, this "
                             f"rank's ({rank}) being {own}")
    return _allgather_matmul(A_local, B_local, gather, overlap, chunks, group, sizes, rank, P,
                             timeline, product or local_product)


def _allgather_matmul(A, B, gather, overlap, chunks, group, sizes, rank, P, timeline, product):
    dev, K = A.device, A.shape[1]
    X = A if gather == "A" else B                 # the gathered operand
    run = _Runner(dev, timeline, f"allgather_matmul gather={gather} overlap={overlap}"
                  + (f" chunks={chunks}" if overlap else ""))
    off = offsets(sizes)
    total = off[-1]
    if gather == "A":
        C = torch.empty((total, B.shape[1]), dtype=torch.float32, device=dev)
    else:
        C = torch.empty((A.shape[0], total), dtype=torch.float32, device=dev)
    c = chunks if overlap else 1
    # piece j of rank r: rows (gather A) or columns (gather B) [lo, hi) of r's shard
    cut = [offsets(split_sizes(s, c)) for s in sizes]

    def piece_shape(r, j):
        n = cut[r][j + 1] - cut[r][j]
        return (n, K) if gather == "A" else (K, n)

    def own_piece(j):
        lo, hi = cut[rank][j], cut[rank][j + 1]
        return A[lo:hi] if gather == "A" else B[:, lo:hi]

    def put(r, lo, hi, Xr):
        """C's block from rank r's rows/columns [lo, hi) of the gathered operand."""
        a, b = off[r] + lo, off[r] + hi
        if b == a:
            return
        if gather == "A":
            product(Xr, B, C[a:b])                # a contiguous row slab of C
        elif P == 1 and a == 0 and b == total:
            product(A, Xr, C)
        else:                                     # a column slab: through a temporary
            tmp = product(A, Xr, None)
            C[:, a:b].copy_(tmp)

    # the collectives: one per piece, padded at the end to the largest rank's piece
    recv, handles = [], []
    for j in range(c):
        counts = [math.prod(piece_shape(r, j)) for r in range(P)]
        big = max(counts)
        if P == 1 or big == 0:
            recv.append(None)
            handles.append(None)
            continue
        mine = own_piece(j)
        if mine.is_contiguous() and counts[rank] == big:
            send = mine.reshape(-1)
        else:
            send = torch.zeros(big, dtype=X.dtype, device=dev)
            send[:counts[rank]].view(piece_shape(rank, j)).copy_(mine)
        buf = torch.empty((P, big), dtype=X.dtype, device=dev)
        recv.append((buf, counts))
        if overlap or j == 0:
            handles.append(run.issue(f"all-gather {gather} piece {j}",
                                     [lambda a, buf=buf, send=send:
                                      _all_gather_flat(buf.view(-1), send, group, async_op=a)]))

    def gathered(r, j):
        if recv[j] is None:                        # nothing to move: the pieces are empty
            return torch.empty(piece_shape(r, j), dtype=X.dtype, device=dev)
        buf, counts = recv[j]
        return buf[r, :counts[r]].view(piece_shape(r, j))

    if not overlap:
        if handles[0] is not None:
            run.wait(handles[0])
        if gather == "A" and recv[0] is not None and len(set(sizes)) == 1:
            # even shards: the receive buffer is A itself, row-major: one product
            run.run("A @ B_local", lambda: product(recv[0][0].view(total, K), B, C))
        elif gather == "B" and recv[0] is not None:
            full = run.run("concatenate B", lambda: torch.cat(
                [gathered(r, 0) for r in range(P)], dim=1), kind="copy")
            run.run("A_local @ B", lambda: product(A, full, C))
        else:
            for r in range(P):
                Xr = X if r == rank else gathered(r, 0)
                run.run(f"piece of rank {r}", lambda r=r, Xr=Xr: put(r, 0, sizes[r], Xr))
    else:
        run.run("own shard", lambda: put(rank, 0, sizes[rank], X))
        for j in range(c):
            if handles[j] is not None:
                run.wait(handles[j])
            for r in range(P):
                if r != rank and cut[r][j + 1] > cut[r][j]:
                    run.run(f"piece {j} of rank {r}", lambda r=r, j=j: put(
                        r, cut[r][j], cut[r][j + 1], gathered(r, j)))
    run.finish()
    return C


# --------------------------------------------------------------------------
# SUMMA on a 2-D process grid

_GRIDS: dict = {}


class ProcessGrid:
    """A Pr x Pc grid of processes with a process group per grid row and per grid column.

    ``ranks`` (default: every process) are laid out row-major in ascending
    order (the order of their ranks in the grid's group): grid position (i, j)
    is ``sorted(ranks)[i * Pc + j]``.  Creating one is collective over the
    *whole job* (torch.distributed.new_group's rule): every process calls it,
    members or not, in the same order.  Create grids once and reuse them.
    """

    def __init__(self, shape: tuple[int, int] | None = None, ranks=None):
        if torch is None or not dist.is_initialized():
            _group_info(None)
        world = dist.get_world_size()
        self.ranks = list(range(world)) if ranks is None else sorted(int(r) for r in ranks)
        P = len(self.ranks)
        if len(set(self.ranks)) != P or not all(0 <= r < world for r in self.ranks):
            raise ValueError(f"ranks {self.ranks} must be distinct ranks of the job "
                             f"(0..{world - 1})")
        self.shape = grid_shape(P) if shape is None else (int(shape[0]), int(shape[1]))
        pr, pc = self.shape
        if pr < 1 or pc < 1 or pr * pc != P:
            raise ValueError(f"a {pr} x {pc} grid has {pr * pc} places but there are {P} "
                             f"processes; choose Pr x Pc = {P} (e.g. {grid_shape(P)})")
        me = dist.get_rank()
        self.group = None if ranks is None or P == world else dist.new_group(self.ranks)
        self.member = me in self.ranks
        self.row_group = self.col_group = None
        self.row = self.col = -1
        if self.member:
            self.row, self.col = divmod(self.ranks.index(me), pc)
        for i in range(pr):                      # every process creates every group, in order
            members = self.ranks[i * pc:(i + 1) * pc]
            g = dist.new_group(members) if pc > 1 else None
            if i == self.row:
                self.row_group = g
        for j in range(pc):
            members = self.ranks[j::pc]
            g = dist.new_group(members) if pr > 1 else None
            if j == self.col:
                self.col_group = g

    def rank_at(self, i: int, j: int) -> int:
        """The global rank at grid position (i, j)."""
        return self.ranks[i * self.shape[1] + j]

    def __repr__(self):
        return f"ProcessGrid({self.shape[0]} x {self.shape[1]}, ranks={self.ranks})"


def _world_grid(shape) -> ProcessGrid:
    key = (id(dist.distributed_c10d._get_default_group()), tuple(shape))
    if key not in _GRIDS:
        _GRIDS[key] = ProcessGrid(shape)
    return _GRIDS[key]


def summa(A_block, B_block, *, grid=None, panel: int | None = None, pipelined: bool = True,
          group=None, sizes=None, timeline: Timeline | None = None, product=None):
    """SUMMA: ``C = A @ B`` on a Pr x Pc process grid, one block of each matrix per rank.

    Parameters
    ----------
    A_block, B_block : rank (i, j)'s blocks ``A[rows_i, ka_j]`` and
        ``B[kb_i, cols_j]``: A's rows split over the grid's rows and its K over
        the columns; B's K over the rows and its columns over the columns.
        Any sizes: a grid row shares its rows of A, a grid column its columns
        of B and its A-columns, a grid row its B-rows.  Same dtype and device
        rules as :func:`allgather_matmul`.
    grid : a :class:`ProcessGrid`, or ``(Pr, Pc)`` with Pr * Pc = P (for the
        default group only: a grid of other ranks must be created first, on
        every process), or None: the squarest factorisation of P.
    panel : cut K into panels of at most this width (default: one panel per
        stretch of K with the same owners, the widest: every panel adds one
        float32 ``C += T`` after its product, since gemmlib.matmul has no
        accumulating form).
    pipelined : issue the next panel's broadcasts before this panel's product.
    sizes : ``(ka, kb)``: A's K split over grid columns and B's over grid rows,
        to skip the metadata exchange (then nothing is checked across ranks).

    Returns this rank's float32 block of C, ``C[rows_i, cols_j]``.
    """
    if isinstance(grid, ProcessGrid):
        if group is not None and group != grid.group:
            raise ValueError("pass either group= or a ProcessGrid (whose group it is), not both")
        group = grid.group
    rank, P, backend = _group_info(group)
    why, shape = None, (0, 0)
    if isinstance(grid, ProcessGrid):
        shape = grid.shape
    elif grid is None:
        shape = grid_shape(P)
    elif isinstance(grid, (tuple, list)) and len(grid) == 2:
        shape = (int(grid[0]), int(grid[1]))
        if shape[0] < 1 or shape[1] < 1 or shape[0] * shape[1] != P:
            why = (f"ValueError:grid={tuple(grid)} does not fit {P} processes: choose "
                   f"Pr x Pc = {P} (e.g. {grid_shape(P)}, or 1 x {P})")
    else:
        why = f"TypeError:grid must be a ProcessGrid, (Pr, Pc) or None, not {grid!r}"
    if panel is not None and (not isinstance(panel, int) or panel < 1):
        why = why or f"ValueError:panel must be a positive integer or None, not {panel!r}"
    why = why or _local_checks(A_block, B_block, backend)
    pr, pc = shape
    call = f"summa(grid={pr}x{pc})"
    i, j = divmod(rank, pc) if pc else (0, 0)
    if sizes is None:
        opts = (pr, pc, panel if isinstance(panel, int) else -1, int(bool(pipelined)))
        table = _exchange(_fields(_SUMMA, opts, A_block, B_block, why), group, backend, P)
        _check_table(table, rank, why, ("Pr", "Pc", "panel", "pipelined"), call)
        _check_summa(table, pr, pc, call)
        ka = [table[c][7] for c in range(pc)]          # A's columns in grid column c (row 0)
        kb = [table[r * pc][8] for r in range(pr)]     # B's rows in grid row r (column 0)
    else:
        if why is not None:
            _raise(why)
        ka, kb = [int(v) for v in sizes[0]], [int(v) for v in sizes[1]]
        if (len(ka) != pc or len(kb) != pr or ka[j] != A_block.shape[1]
                or kb[i] != B_block.shape[0] or sum(ka) != sum(kb)):
            raise ValueError(f"{call}: sizes=(ka, kb) must give A's K split over the {pc} grid "
                             f"columns and B's over the {pr} grid rows, with the same sum; this "
                             f"rank's blocks are A {tuple(A_block.shape)}, "
                             f"B {tuple(B_block.shape)}")
    if isinstance(grid, ProcessGrid):
        g = grid
    elif P == 1:
        g = None
    elif group is None or P == dist.get_world_size():
        g = _world_grid(shape)
    else:
        raise ValueError("summa on a sub-group needs a ProcessGrid created beforehand on every "
                         "process: grid = ProcessGrid((Pr, Pc), ranks=...)")
    return _summa(A_block, B_block, g, shape, rank, ka, kb, panel, pipelined, timeline,
                  product or local_product)


def _check_summa(table, pr, pc, call):
    """Blocks that share a grid row or column must agree on the sizes they share."""
    P = len(table)
    for r in range(P):
        i, j = divmod(r, pc)
        M_i, ka, kb, N_j = table[r][6], table[r][7], table[r][8], table[r][9]
        row0, col0 = table[i * pc], table[j]
        if M_i != row0[6]:
            raise ValueError(f"{call}: grid row {i} must share A's rows, but rank {i * pc} has "
                             f"{row0[6]} and rank {r} has {M_i}")
        if ka != col0[7]:
            raise ValueError(f"{call}: grid column {j} must share A's columns (its stretch of K), "
                             f"but rank {j} has {col0[7]} and rank {r} has {ka}")
        if kb != row0[8]:
            raise ValueError(f"{call}: grid row {i} must share B's rows (its stretch of K), but "
                             f"rank {i * pc} has {row0[8]} and rank {r} has {kb}")
        if N_j != col0[9]:
            raise ValueError(f"{call}: grid column {j} must share B's columns, but rank {j} has "
                             f"{col0[9]} and rank {r} has {N_j}")
    ka = [table[c][7] for c in range(pc)]
    kb = [table[r * pc][8] for r in range(pr)]
    if sum(ka) != sum(kb):
        raise ValueError(f"{call}: A's blocks cover K = {sum(ka)} ({' + '.join(map(str, ka))} over "
                         f"the grid columns) but B's cover K = {sum(kb)} "
                         f"({' + '.join(map(str, kb))} over the grid rows)")


def _summa(A, B, g, shape, rank, ka, kb, panel, pipelined, timeline, product):
    pr, pc = shape
    i, j = divmod(rank, pc)
    dev, dt = A.device, A.dtype
    Mi, Nj = A.shape[0], B.shape[1]
    oa, ob = offsets(ka), offsets(kb)
    plan = panels(ka, kb, panel)
    run = _Runner(dev, timeline, f"summa {pr}x{pc} pipelined={pipelined}"
                  + (f" panel={panel}" if panel else ""))
    C = torch.empty((Mi, Nj), dtype=torch.float32, device=dev)
    if not plan:                                    # K == 0
        C.zero_()
    row_g = g.row_group if g is not None else None
    col_g = g.col_group if g is not None else None

    def start(p):
        """Panel p's operands: broadcast A's along the row and B's along the column."""
        k0, k1, ja, ib = plan[p]
        w = k1 - k0
        if j == ja:
            a0 = k0 - oa[ja]
            Ap = A if (a0 == 0 and w == A.shape[1]) else run.run(
                f"copy A panel {p}", lambda: A[:, a0:a0 + w].contiguous(), kind="copy")
        else:
            Ap = torch.empty((Mi, w), dtype=dt, device=dev)
        if i == ib:
            b0 = k0 - ob[ib]
            Bp = B[b0:b0 + w]                       # rows of a row-major block: contiguous
        else:
            Bp = torch.empty((w, Nj), dtype=dt, device=dev)
        ops = []
        if pc > 1 and Mi > 0:
            ops.append(lambda a, src=g.rank_at(i, ja):
                       dist.broadcast(Ap, src, group=row_g, async_op=a))
        if pr > 1 and Nj > 0:
            ops.append(lambda a, src=g.rank_at(ib, j):
                       dist.broadcast(Bp, src, group=col_g, async_op=a))
        h = run.issue(f"panel {p} broadcasts", ops) if ops else None
        return Ap, Bp, h

    tmp = None
    pending = start(0) if plan else None
    for p in range(len(plan)):
        Ap, Bp, h = pending
        if pipelined and p + 1 < len(plan):
            pending = start(p + 1)                  # the next panel travels during this product
        if h is not None:
            run.wait(h)
        if Mi and Nj:
            if p == 0:
                run.run(f"panel {p}", lambda: product(Ap, Bp, C))
            else:
                if tmp is None:
                    tmp = torch.empty_like(C)

                def acc(Ap=Ap, Bp=Bp):
                    product(Ap, Bp, tmp)
                    C.add_(tmp)
                run.run(f"panel {p}", acc)
        if not pipelined and p + 1 < len(plan):
            pending = start(p + 1)
    run.finish()
    return C


# --------------------------------------------------------------------------
# CPU processes for tests and the course: torch.multiprocessing + gloo


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
