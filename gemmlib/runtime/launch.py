"""Launching a plan near the floor: kernel parameters packed once, one driver call.

Per call, numba's dispatcher types every argument and wraps each CuPy array in a
numba device array (tens of microseconds).  Here that work is done once per (plan,
CUDA context): a bound plan (:func:`bound`) has its kernels loaded and its parameter
words laid out -- numba's array ABI: meminfo, parent, size, itemsize, data, shape,
strides, 9 eight-byte words for a 2-D array -- and :func:`run` writes the three
arrays' pointers into them (and, for a slice of a wider matrix that the rung reads in
place, its row stride) and calls the driver's ``cuLaunchKernel`` once.  Around
the main kernel, what some plans need: the split-K sum (:func:`run`), a 16-bit C
rounded from float32 (:func:`run_rounded`), a bias added after a rung without its own
epilogue, B transposed first, the workspaces (kept per stream, a captured graph's for
good) and the tensor maps.  In the simulator kernels are launched through numba
(:func:`launch`, which also takes arrays on a GPU).
"""

from __future__ import annotations

import ctypes
import os
import struct
import threading
from collections import OrderedDict

import numpy as np

from gemmlib import backend, tma
from gemmlib.backend import SIMULATOR
from gemmlib.runtime import maps, memory
from gemmlib.runtime.caches import LOCK
from gemmlib.runtime.compile import (compiled_finish, compiled_prep, compiled_reduce,
                                     compiled_round16, compiled_spec)
from gemmlib.runtime.driver import CudaError, driver, launch_config
from gemmlib.runtime.memory import stream_handle
from gemmlib.runtime.plans import Plan, plan

#: launch the rungs that wait for the stream's previous kernel themselves
#: (``KernelSpec.early_launch``) with programmatic stream serialization: their blocks are
#: placed while that kernel drains.  ``GEMMLIB_EARLY_LAUNCH=0`` launches them as any other
EARLY_LAUNCH = os.environ.get("GEMMLIB_EARLY_LAUNCH", "1") != "0"

# Kernel parameters: numba passes a 2-D array as 9 eight-byte words.
_WORDS = 9
_TLS = threading.local()


def _params(n: int):
    """This thread's parameter block for ``n`` eight-byte words: (values buffer, address
    of the pointer array)."""
    bufs = getattr(_TLS, "bufs", None)
    if bufs is None:
        bufs = _TLS.bufs = {}
    b = bufs.get(n)
    if b is None:
        values = (ctypes.c_int64 * n)()
        base = ctypes.addressof(values)
        pointers = (ctypes.c_void_p * n)(*[base + 8 * i for i in range(n)])
        b = bufs[n] = (values, ctypes.addressof(pointers), pointers, struct.Struct(f"<{n}q"))
    return b


def _array_words(ptr: int, rows: int, cols: int, itemsize: int) -> list[int]:
    """One row-major 2-D array as numba passes it: meminfo, parent, size, itemsize, data,
    shape (2), strides in bytes (2)."""
    return [0, 0, rows * cols, itemsize, ptr, rows, cols, cols * itemsize, itemsize]


#: index of the data pointer of array i in the parameter words
_DATA = (4, 4 + _WORDS, 4 + 2 * _WORDS)
_A_WORD, _B_WORD, _C_WORD = _DATA


def _launch(fn: int, grid, block, shared: int, stream: int, words: list[int]) -> None:
    """cuLaunchKernel with the kernel parameters ``words`` (numba's layout, 8 bytes each)."""
    values, pointers, _keep, packer = _params(len(words))
    packer.pack_into(values, 0, *words)
    drv = driver()
    drv.check(drv.launch_kernel(fn, grid[0], grid[1], grid[2], block[0], block[1], block[2],
                                shared, stream, pointers, None), "cuLaunchKernel")


class _Bound:
    """A plan made ready for one CUDA context: functions loaded, parameter words laid out
    with zero pointers (a call fills in the three or four pointers)."""

    def __init__(self, p: Plan, ctx: int):
        spec, M, N, K = p.spec, p.M, p.N, p.K
        ia, ib, ic = (np.dtype(d).itemsize for d in spec.kernel_dtypes)
        item = ic
        c_rows = M * p.splits  # the workspace when K is split
        self.fn = compiled_spec(spec).function(ctx, p.shared_bytes)
        (a_rows, a_cols), (b_rows, b_cols) = _operand_shapes(p)
        self.words = (_array_words(0, a_rows, a_cols, ia) + _array_words(0, b_rows, b_cols, ib)
                      + _array_words(0, c_rows, N, ic))
        #: builds that read slices of wider matrices by pointer (``spec.reads_pitched``):
        #: the index, packed value (bytes) and itemsize of A's and B's row-stride words,
        #: which each launch writes (``run``'s ``lds``)
        self.pitch_words = None
        if spec.reads_pitched:
            self.pitch_words = ((_A_WORD + 3, a_cols * ia, ia), (_B_WORD + 3, b_cols * ib, ib))
        #: rungs with a bias epilogue: the bias row's words right after C ((0, N): none)
        self.bias_word = len(self.words) + 4 if spec.bias_arg else None
        if spec.bias_arg:
            self.words += _array_words(0, 0, N, ia)
        #: the data words of the workspace arrays (split-K sums in the kernel: W, tickets)
        self.work_words = []
        for rows, cols, dt in p.workspace:
            self.work_words.append(len(self.words) + 4)
            self.words += _array_words(0, rows, cols, np.dtype(dt).itemsize)
        #: the word after the arrays: TMA rungs' address of the tensor maps
        self.maps_word = len(self.words)
        self.words += [0] * len(spec.scalar_args)
        #: (stream, graph) -> the workspace buffers, kept (_scratch); a buffer one call writes
        #: in one launch and reads in the next (the slices' sums, a transposed operand, a
        #: staged A) is kept per calling thread too: two threads' calls on one stream
        #: interleave their launches, and would otherwise overwrite each other's
        self.scratch = {}
        self.red = self.red_words = None
        #: the maps' addresses of this plan's recent operands, and the small As met once
        #: (_maps_for_call)
        self.maps_memo, self.met_a = {}, set()
        #: bytes of a caller's A small enough to stage (_maps_for_call), else 0
        a_bytes = M * K * (ib if spec.swap_ab else ia)   # the caller's A
        self.stage_a = (a_bytes if spec.tma_boxes and spec.a_prep is None and p.batch == 1
                        and a_bytes <= STAGE_A_BYTES else 0)   # (a pre-pass reads A as it is)
        self._local = threading.local()
        self.prep = self.prep_words = None
        #: the grid launched: a cluster rung's, cut to the clusters that fit at once
        self.grid = p.grid if spec.cluster == 1 else _cluster_grid(self.fn, p)
        #: (stream, early) -> the cuLaunchKernelEx configuration of the main kernel
        self.configs = {}
        if spec.b_prep is not None:   # B.T first, into a buffer kept per stream (_prepared_b)
            self.prep = compiled_prep(spec).function(ctx)
            self.prep_words = _array_words(0, K, N, ib) + _array_words(0, N, K, ib)
        self.a_prep = self.a_prep_words = None
        if spec.a_prep is not None:   # A.T first, likewise (_prepared_a)
            self.a_prep = compiled_prep(spec, "a").function(ctx)
            self.a_prep_words = _array_words(0, K, M, ia) + _array_words(0, M, K, ia)
        if p.splits > 1:
            self.red = compiled_reduce(spec).function(ctx)
            self.red_words = _array_words(0, c_rows, N, item) + _array_words(0, M, N, item)
        #: run_rounded: its rounding kernels (by output type, loaded on first use), words
        self.round16 = {}
        self.round_words = _array_words(0, c_rows, N, 4) + _array_words(0, M, N, 2)
        #: the bias epilogue kernels of rungs without their own (by (C's type, bias type))
        self.finish = {}
        self.finish_words = {}
        self.reduce_grid = p.reduce_grid   # computed once, not per launch
        #: whether a launch uses buffers or maps of its own (what a CUDA-graph capture
        #: must give the graph: see run)
        self.needs_buffers = bool(p.splits > 1 or p.workspace or spec.tma_boxes
                                  or spec.b_prep is not None or spec.a_prep is not None)


    def parameters(self, which: str = "words"):
        """This thread's kernel-parameter block, the constant words packed once: (the
        int64 values a launch overwrites the pointers in, the address of their pointer
        array for cuLaunchKernel).  ``which``: the main kernel's ("words") or the split-K
        sum's ("red_words")."""
        blks = getattr(self._local, "blks", None)
        if blks is None:
            blks = self._local.blks = {}
        blk = blks.get(which)
        if blk is None:
            words = getattr(self, which)
            n = len(words)
            values = (ctypes.c_int64 * n)(*words)
            base = ctypes.addressof(values)
            pointers = (ctypes.c_void_p * n)(*[base + 8 * i for i in range(n)])
            blk = blks[which] = (values, ctypes.addressof(pointers), pointers)
        return blk[0], blk[1]


def _operand_shapes(p: Plan) -> tuple:
    """The (rows, cols) of the kernel's A and B memory for plan ``p`` (a batched plan's M
    counts every product's rows)."""
    return p.spec.kernel_operands(p.M, p.N, p.K, p.batch)


def _cluster_grid(fn: int, p: Plan) -> tuple[int, int, int]:
    """A persistent cluster rung's grid: no more clusters than the GPU holds at once
    (``cuOccupancyMaxActiveClusters``: clusters live inside one GPC, so SMs / cluster
    may not all fit), or the late ones would run after the others as a second wave."""
    cm = p.spec.cluster
    cfg = launch_config(p.grid, p.block, p.shared_bytes, 0, cm)
    n = ctypes.c_int()
    drv = driver()
    drv.check(drv.max_active_clusters(ctypes.byref(n), fn, ctypes.byref(cfg)),
              "cuOccupancyMaxActiveClusters")
    if n.value < 1:
        raise CudaError(f"{p.spec.name}: no cluster of {cm} blocks fits on this GPU")
    return (cm * min(p.grid[0] // cm, n.value), p.grid[1], p.grid[2])


_BOUND: dict = {}


def bound(p: Plan) -> _Bound:
    """Plan ``p`` made ready for the current CUDA context (kernels loaded), memoised."""
    return _bound(p)


def _bound(p: Plan) -> _Bound:
    """Plan ``p`` made ready for the current CUDA context (kernels loaded), memoised."""
    ctx = driver().current_context()
    key = (id(p), ctx)
    b = _BOUND.get(key)
    if b is None or b.plan is not p:
        b = _Bound(p, ctx)
        b.plan = p  # keeps id(p) this plan's while the entry lives
        with LOCK:
            _BOUND[key] = b
            if len(_BOUND) > 8192:
                _BOUND.pop(next(iter(_BOUND)))
    return b


def run(p: Plan, a_ptr: int, b_ptr: int, c_ptr: int, stream: int = 0, bound=None,
        scales: tuple = (), bias: tuple = (), graph: bool | None = None,
        lds: tuple = ()) -> None:
    """Launch plan ``p`` on row-major device buffers A (M x K), B, C (M x N) (GPU only).

    B is (K, N), or (N, K) for specs with ``b_operand == "NK"``.  No checks:
    :func:`gemmlib.matmul` makes them first.  ``bound``: the plan already made ready
    for the current context (:func:`bound`), when the caller keeps it.  ``bias``:
    ``(address, type)`` of a row of N values ("fp32", "fp16", "bf16") added to every row
    of C -- by the rung's own epilogue (``spec.bias_arg``), else by one more kernel
    (:func:`_run_then_bias`).  ``graph``: whether ``stream`` is being captured, when the
    caller knows (else the driver is asked, for plans that keep buffers or maps).
    ``lds``: elements from one row to the next of the kernel's A and B memory where that
    is more than a row (a slice of a wider matrix; 0 or () where the rows are packed):
    the tensor maps' row strides (rungs that read A and B by TMA only), or the strides
    words of the kernel's array arguments (``spec.reads_pitched``: a rung's build for
    such operands; another build ignores them).
    """
    b = bound or _bound(p)
    # Under a CUDA-graph capture the call's buffers and maps are the graph's own
    # (gemmlib.runtime.memory); a plan that needs none launches as it would eagerly.
    if graph is None:
        graph = b.needs_buffers and memory.capturing(stream)
    _scoped(graph, _run, b, p, a_ptr, b_ptr, c_ptr, stream, scales, bias, graph, lds)


def _scoped(graph: bool, fn, *args) -> None:
    """``fn(*args)``, inside a :class:`memory.CapturedCall` under a capture whose memory
    torch gives (the call's buffers: the graph's temporaries)."""
    if graph and memory.graph_temporaries():
        with memory.CapturedCall():
            fn(*args)
    else:
        fn(*args)


def _run(b: "_Bound", p: Plan, a_ptr: int, b_ptr: int, c_ptr: int, stream: int,
         scales: tuple, bias: tuple, graph: bool, lds: tuple = ()) -> None:
    if bias and not p.spec.bias_arg:
        _run_then_bias(b, p, a_ptr, b_ptr, c_ptr, stream, scales, bias, "fp32", graph, lds)
        return
    if p.spec.tma_boxes and p.K == 0:   # no map of an empty matrix: C = 0 without the kernel
        if bias:
            _run_then_bias(b, p, a_ptr, b_ptr, c_ptr, stream, scales, bias, "fp32", graph)
            return
        isz = np.dtype(p.spec.out_dtype).itemsize   # float32, or bf16 bits (FP8 rungs)
        memory.zero_async(c_ptr, isz * p.M * p.N, stream)
        return
    if p.splits <= 1:   # the common case: one launch
        _launch_main(b, p, a_ptr, b_ptr, c_ptr, stream, scales, bias, graph, lds)
        return
    # The slices' sums: one buffer per bound plan and stream, kept (launches on one stream
    # run in order: the next call's slices are written after this call's sum has read them).
    w_ptr = _partials(b, p, stream, graph)
    _launch_main(b, p, a_ptr, b_ptr, w_ptr, stream, scales, (), graph, lds)
    _launch_reduce(b.red, b, p, w_ptr, c_ptr, stream, "red_words")


def run_rounded(p: Plan, a_ptr: int, b_ptr: int, c_ptr: int, out: str, stream: int = 0,
                bound=None, bias: tuple = (), graph: bool | None = None,
                lds: tuple = ()) -> None:
    """Plan ``p`` of a rung that writes float32, for a C of 16-bit ``out`` ("fp16" /
    "bf16") at ``c_ptr`` (GPU only).  The rung writes its result -- or its K slices'
    partial products -- into a float32 buffer kept per bound plan and stream, and one
    more kernel (``split_k.REDUCE16``) adds the slices in order and rounds each sum to
    nearest even: two launches, as split-K's float32 call, instead of a float32 C and a
    cast of it by the array library.  ``lds``: as :func:`run`'s."""
    b = bound or _bound(p)
    if graph is None:   # (a float32 buffer: always one to keep right)
        graph = memory.capturing(stream)
    _scoped(graph, _run_rounded, b, p, a_ptr, b_ptr, c_ptr, out, stream, bias, graph, lds)


def _run_rounded(b: "_Bound", p: Plan, a_ptr: int, b_ptr: int, c_ptr: int, out: str,
                 stream: int, bias: tuple, graph: bool, lds: tuple = ()) -> None:
    if bias:   # the sum, the bias and the rounding in one more kernel
        _run_then_bias(b, p, a_ptr, b_ptr, c_ptr, stream, (), bias, out, graph, lds)
        return
    if p.spec.tma_boxes and p.K == 0:   # C = +0.0 (zero bits), as run's float32 C
        memory.zero_async(c_ptr, 2 * p.M * p.N, stream)
        return
    w_ptr = _partials(b, p, stream, graph)
    _launch_main(b, p, a_ptr, b_ptr, w_ptr, stream, (), (), graph, lds)
    fn = b.round16.get(out)
    if fn is None:
        fn = b.round16[out] = compiled_round16(out).function(driver().current_context())
    _launch_reduce(fn, b, p, w_ptr, c_ptr, stream, "round_words")


def _run_then_bias(b: "_Bound", p: Plan, a_ptr: int, b_ptr: int, c_ptr: int, stream: int,
                   scales: tuple, bias: tuple, out: str, graph: bool, lds: tuple = ()) -> None:
    """A rung without a bias epilogue (or a float32 build of one, for a 16-bit ``out``):
    it writes float32 -- into C itself when C is float32 and K is not sliced, else into
    this plan's float32 buffer -- and ``split_k.BIAS_FINISH`` adds the slices and the bias
    in fp32 and rounds once into C."""
    in_place = out == "fp32" and p.splits <= 1
    w_ptr = c_ptr if in_place else _partials(b, p, stream, graph)
    if p.spec.tma_boxes and p.K == 0:
        memory.zero_async(w_ptr, 4 * p.M * p.N, stream)
    else:
        _launch_main(b, p, a_ptr, b_ptr, w_ptr, stream, scales, (), graph, lds)
    key = (out, bias[1])
    fn = b.finish.get(key)
    if fn is None:
        fn = b.finish[key] = compiled_finish(*key).function(driver().current_context())
        item = 4 if out == "fp32" else 2
        b.finish_words[key] = (_array_words(0, p.M * p.splits, p.N, 4)
                               + _array_words(0, 1, p.N, 4 if bias[1] == "fp32" else 2)
                               + _array_words(0, p.M, p.N, item))
    words = list(b.finish_words[key])
    words[_DATA[0]], words[_DATA[1]], words[_DATA[2]] = w_ptr, bias[0], c_ptr
    _launch(fn, b.reduce_grid, p.spec.reduce_block, 0, stream, words)


def _partials(b: "_Bound", p: Plan, stream: int, graph: bool = False) -> int:
    """The address of this bound plan's float32 (splits * M) x N buffer on ``stream``
    (``graph``: the one calls captured on ``stream`` use)."""
    return _kept_buffer(b, "w", 4 * p.splits * p.M * p.N, stream, graph)


def _kept_buffer(b: "_Bound", name: str, nbytes: int, stream: int, graph: bool = False) -> int:
    """The address of bound plan ``b``'s buffer ``name`` of ``nbytes`` for this stream and
    calling thread, allocated once (:func:`_keep`).  For a buffer one launch fills and the
    next reads: two threads' calls on one stream interleave their launches."""
    key = (name, stream, graph, threading.get_ident())
    kept = b.scratch.get(key)
    if kept is None:
        buf = memory.allocate(nbytes, stream)
        kept = _keep(b, key, (buf, buf.ptr), buf.nbytes, graph)
    return kept[1]


def _launch_main(b: "_Bound", p: Plan, a_ptr: int, b_ptr: int, c_ptr: int, stream: int,
                 scales: tuple, bias: tuple = (), graph: bool = False,
                 lds: tuple = ()) -> None:
    """The main kernel of bound plan ``b`` writing ``c_ptr`` (C, or the slices' buffer):
    the pointers into its parameter block, packed once (then its workspace arrays and the
    address of its tensor maps where it takes them).  ``graph``: ``stream`` is being
    captured (the workspace and maps are the graph's own).  ``lds``: see :func:`run`."""
    if b.prep is not None:   # the kernel reads B K-major: transpose it first, same stream
        b_ptr = _prepared_b(b, p, b_ptr, stream, graph)
    if b.a_prep is not None:   # and A
        a_ptr = _prepared_a(b, p, a_ptr, stream, graph)
    if p.spec.tma_boxes:
        maps_addr, a_ptr = _maps_for_call(b, p, a_ptr, b_ptr, c_ptr, stream, scales, graph,
                                          lds)
    if p.spec.swap_ab:       # the kernel's A is the caller's B, its B the caller's A
        a_ptr, b_ptr = b_ptr, a_ptr
        lds = lds[::-1]
    values, pointers = b.parameters()
    values[_A_WORD] = a_ptr
    values[_B_WORD] = b_ptr
    values[_C_WORD] = c_ptr
    if b.pitch_words is not None:   # the row strides in bytes, a packed side's as packed
        (wa, packed_a, ia), (wb, packed_b, ib) = b.pitch_words
        lda, ldb = lds or (0, 0)
        values[wa] = lda * ia or packed_a
        values[wb] = ldb * ib or packed_b
    if b.bias_word is not None:   # the bias row: (1, N) at its address, or (0, N): none
        w = b.bias_word
        values[w] = bias[0] if bias else 0
        values[w + 1] = 1 if bias else 0                # shape[0]
        values[w - 2] = p.N if bias else 0              # size
    if p.workspace:   # the words after C (and the bias): this stream's workspace arrays
        ws = b.scratch.get((stream, graph)) or _scratch(b, p, stream, graph)
        if graph:   # a replay must find the counters zero whichever graph ran before
            for ptr, nbytes in ws[2]:
                memory.zero_async(ptr, nbytes, stream)
        for w, ptr in zip(b.work_words, ws[1]):
            values[w] = ptr
    if p.spec.tma_boxes:   # the last word: where the tensor maps of A and B are
        values[b.maps_word] = maps_addr
    drv = driver()
    early = EARLY_LAUNCH and p.spec.early_launch
    if early or p.spec.cluster > 1:
        cfg = b.configs.get((stream, early))
        if cfg is None:
            cfg = b.configs[(stream, early)] = launch_config(
                b.grid, p.block, p.shared_bytes, stream, p.spec.cluster, early)
        rc = drv.launch_kernel_ex(ctypes.byref(cfg), b.fn, pointers, None)
    else:
        rc = drv.launch_kernel(b.fn, *p.grid, *p.block, p.shared_bytes, stream, pointers,
                               None)
    if rc:
        drv.check(rc, "cuLaunchKernel")


def _launch_reduce(fn: int, b: "_Bound", p: Plan, w_ptr: int, c_ptr: int, stream: int,
                   which: str) -> None:
    """A sum of the slices (``fn``: the spec's reduction, or a 16-bit rounding one) from
    the buffer at ``w_ptr`` into C."""
    values, pointers = b.parameters(which)
    values[_DATA[0]], values[_DATA[1]] = w_ptr, c_ptr
    drv = driver()
    rc = drv.launch_kernel(fn, *b.reduce_grid, *p.spec.reduce_block, 0, stream, pointers,
                           None)
    if rc:
        drv.check(rc, "cuLaunchKernel")


#: bytes of workspace kept for all plans and streams together; past it the oldest go
SCRATCH_BYTES = 512 * 2**20
_SCRATCH: OrderedDict = OrderedDict()   # (id(bound), key) -> (bound, bytes); key: stream, ("bt", stream)


def _scratch(b: "_Bound", p: Plan, stream: int, graph: bool = False):
    """Plan ``p``'s workspace arrays for ``stream``, allocated once (counters zeroed) and
    kept with the bound plan: (buffers, pointers, the counters' (pointer, bytes)).
    Launches on one stream run in order, so they share them; each kernel leaves its
    counters zero for the next."""
    # counters are zeroed on ``stream`` itself, so before any launch that uses them
    bufs, counters = [], []
    for rows, cols, dt in p.workspace:
        nbytes = rows * cols * np.dtype(dt).itemsize
        counter = np.dtype(dt).kind in "iu"
        bufs.append(memory.allocate(nbytes, stream, zero=counter and not graph))
        if counter:
            counters.append((bufs[-1].ptr, nbytes))
    return _keep(b, (stream, graph), (bufs, [x.ptr for x in bufs], counters),
                 sum(x.nbytes for x in bufs), graph)


def _keep(b: "_Bound", key, value, nbytes: int, graph: bool = False):
    """Keep ``value`` (scratch buffers and their addresses) as ``b.scratch[key]``, within
    SCRATCH_BYTES for all plans and streams together: past it the oldest go.  A captured
    graph's buffers (``graph``) are the captured call's (memory.CapturedCall), else kept
    for good: the graph may replay at any time."""
    if graph:
        if not memory.holding():
            b.scratch[key] = value
        return memory.keep_for_graphs(value)
    b.scratch[key] = value
    with LOCK:
        _SCRATCH[(id(b), key)] = (b, nbytes)
        total = sum(n for _, n in _SCRATCH.values())
        # the oldest go first, but never this plan's own: the call under way may have
        # launched work on them already (a transposed B, before its A is kept)
        for entry in [e for e in _SCRATCH if e[0] != id(b)]:
            if total <= SCRATCH_BYTES:
                break
            old, n = _SCRATCH.pop(entry)
            old.scratch.pop(entry[1], None)   # CuPy's pool reuses it on that stream only
            total -= n
    memory.release_pending()
    return value


def _prepared_b(b: "_Bound", p: Plan, b_ptr: int, stream: int, graph: bool = False) -> int:
    """Launch ``p.spec.b_prep`` on ``stream``: B (K x N at ``b_ptr``) transposed into this
    stream's (N, K) buffer; its address (:func:`_transposed`)."""
    return _transposed(b, "bt", b.prep, b.prep_words, b_ptr,
                       p.N * p.K * np.dtype(p.spec.kernel_dtypes[1]).itemsize,
                       p.spec.b_prep_grid(p.K, p.N), p.spec.b_prep_block, stream, graph)


def _prepared_a(b: "_Bound", p: Plan, a_ptr: int, stream: int, graph: bool = False) -> int:
    """Launch ``p.spec.a_prep`` on ``stream``: A's (K, M) memory at ``a_ptr`` transposed
    into this stream's (M, K) buffer; its address (:func:`_transposed`)."""
    return _transposed(b, "at", b.a_prep, b.a_prep_words, a_ptr,
                       p.M * p.K * np.dtype(p.spec.kernel_dtypes[0]).itemsize,
                       p.spec.a_prep_grid(p.K, p.M), p.spec.b_prep_block, stream, graph)


def _transposed(b: "_Bound", name: str, fn: int, words: list, src: int, nbytes: int, grid,
                block, stream: int, graph: bool) -> int:
    """Launch the pre-pass ``fn`` (parameter ``words``, their two data pointers set here)
    from ``src`` into the ``nbytes`` buffer ``name`` (:func:`_kept_buffer`); its address."""
    dst = _kept_buffer(b, name, nbytes, stream, graph)
    words = words.copy()
    words[_DATA[0]], words[_DATA[1]] = src, dst
    _launch(fn, grid, block, 0, stream, words)
    return dst


#: a caller's A of at most this many bytes (a decode step's activation) whose maps are not
#: kept yet is copied into a buffer of the bound plan's, whose maps are (_maps_for_call)
STAGE_A_BYTES = 1 << 20
#: operand addresses whose maps one bound plan remembers before it forgets them all
MEMO_ENTRIES = 256


def _maps_for_call(b: "_Bound", p: Plan, a_ptr: int, b_ptr: int, c_ptr: int, stream: int,
                   scales: tuple = (), graph: bool = False, lds: tuple = (),
                   stage: bool = True) -> tuple[int, int]:
    """(the address of the call's tensor maps, the A the kernel reads), for the caller's
    A and B (a swap-AB rung's maps are its own A and B: the caller's B and A).

    The maps of recent operand addresses are remembered per bound plan.  A model's layers
    hand each call a new activation, whose maps would be written on every call (a
    readdressed map and one more launch, tens of microseconds of host time); a small A
    (``b.stage_a`` bytes, at most STAGE_A_BYTES) at an address not met before is instead
    copied, in order on ``stream``, into a buffer kept per bound plan, stream and thread,
    whose maps are remembered: one asynchronous copy per call.  An A met again (a loop over
    the same operands) gets maps of its own, and later calls on it no copy.  Under a
    CUDA-graph capture the maps are the graph's own (``graph``), written in it, and A is
    read where it is."""
    spec = p.spec
    c_key = c_ptr if spec.tma_store_box else 0   # C matters only to a TMA-store rung
    key = (a_ptr, b_ptr, c_key, scales, lds)
    if not graph:
        hit = b.maps_memo.get(key)
        if hit is not None and hit[1] == maps.GENERATION:
            return hit[0], a_ptr
        if stage and b.stage_a and not lds and a_ptr not in b.met_a:
            if len(b.met_a) >= MEMO_ENTRIES:
                b.met_a.clear()
            b.met_a.add(a_ptr)
            staged = _kept_buffer(b, "sa", b.stage_a, stream)
            memory.copy_async(staged, a_ptr, b.stage_a, stream)
            return _maps_for_call(b, p, staged, b_ptr, c_ptr, stream, scales, graph, lds,
                                  stage=False)
    ka, kb, klds = (b_ptr, a_ptr, lds[::-1]) if spec.swap_ab else (a_ptr, b_ptr, lds)
    c_map = c_key if spec.c_map_ok(p.N, c_key) else 0
    addr = _tensor_maps(p, ka, kb, stream, scales, c_map, graph=graph, lds=klds)
    if not graph:
        if len(b.maps_memo) >= MEMO_ENTRIES:
            b.maps_memo.clear()
        b.maps_memo[key] = (addr, maps.GENERATION)
    return addr, a_ptr


def _tensor_maps(p: Plan, a_ptr: int, b_ptr: int, stream: int, scales: tuple = (),
                 c_ptr: int = 0, graph: bool = False, lds: tuple = ()) -> int:
    """Device address of the TMA maps of A (M x K) and B (K x N) for plan ``p``, then C's
    when ``c_ptr`` is given (a spec that stores C by TMA, and a C that can take it:
    ``KernelSpec.c_map_ok``, decided by :func:`_maps_for_call`): 3-D, (batch, M, N), so that a
    batched launch's boxes stop at their product's last row."""
    spec, M, N = p.spec, p.M, p.N
    ia, ib, ic = spec.kernel_dtypes
    name = TMA_DTYPE[spec.precision]
    (box_a, box_b), sw = spec.tma_boxes, spec.tma_swizzle
    isz = np.dtype(ia).itemsize
    if spec.scale_words and len(scales) != 2:
        raise ValueError(f"{spec.name} needs the device addresses of its two scales")
    a_shape, b_shape = _operand_shapes(p)   # the kernel's A and B, as their memory lies
    lda, ldb = lds or (0, 0)   # a slice of a wider matrix: its rows further apart
    ops = [(a_ptr, a_shape, (lda or a_shape[1]) * isz, name, box_a, sw),
           (b_ptr, b_shape, (ldb or b_shape[1]) * isz, name, box_b, sw)]
    if c_ptr:
        ops.append((c_ptr, (p.batch, M // p.batch, N), N * np.dtype(ic).itemsize,
                    np.dtype(ic).name, spec.tma_store_box, 128))
    return maps.operand_maps(tuple(ops), stream, tuple(scales) if spec.scale_words else (),
                            graph=graph)


#: the element type a tensor map of each precision's operands names
TMA_DTYPE = {"fp16": "float16", "bf16": "bfloat16", "tf32": "float32", "3xtf32": "float32",
             "e4m3": "uint8", "e5m2": "uint8"}


# --------------------------------------------------------------------------


def launch(spec_or_plan, A, B, C, M: int, N: int, K: int, stream=None, scales=(),
           out16: str | None = None, bias=None, bias_type: str | None = None) -> None:
    """Launch on arrays the kernel can take as they are (no checks).

    On a GPU: any arrays with ``__cuda_array_interface__`` (CuPy, numba), through
    :func:`run` (:func:`run_rounded` with ``out16``: a 16-bit C of uint16 bits from a
    rung that writes float32).  In the simulator: numba's launch, with the split-K
    workspace, the reduction and the rounding done the same way, and a slice of a wider
    matrix passed as it lies to a build that reads it so (``spec.reads_pitched``; the GPU
    path's ``lds``, :func:`run`).  ``bias``: a (1, N)
    row of ``bias_type`` ("fp32", or "fp16"/"bf16" as uint16 bits; by default float32
    for a float32 row, else the spec's precision) added to C's rows.
    """
    p = spec_or_plan if isinstance(spec_or_plan, Plan) else plan(spec_or_plan, M, N, K)
    if bias is not None and bias_type is None:
        bias_type = "fp32" if np.dtype(bias.dtype).itemsize == 4 else p.spec.precision
    if not SIMULATOR:
        ptr = [x.__cuda_array_interface__["data"][0] for x in (A, B, C)]
        bias_arg = () if bias is None else (bias.__cuda_array_interface__["data"][0], bias_type)
        lds = _row_pitches(A, B) if p.spec.reads_pitched else ()
        if out16 is not None:
            run_rounded(p, *ptr, out16, stream=stream_handle(stream), bias=bias_arg, lds=lds)
        else:
            run(p, *ptr, stream=stream_handle(stream), scales=tuple(scales), bias=bias_arg,
                lds=lds)
        return
    spec = p.spec
    s = backend.kernel_stream(stream)
    from gemmlib.kernels.split_k import BIAS_FINISH, REDUCE16

    if spec.reads_pitched:   # a slice of a wider matrix is read where it lies, as on the GPU
        A, B = _as_it_lies(A), _as_it_lies(B)

    if bias is not None and (not spec.bias_arg or (spec.tma_boxes and K == 0)):
        out = out16 or "fp32"   # as run's _run_then_bias
        W = C if out == "fp32" and p.splits <= 1 else np.empty((p.splits * M, N), np.float32)
        if spec.tma_boxes and K == 0:
            W[...] = 0
        elif p.splits <= 1:
            launch(p, A, B, W, M, N, K, stream, scales)
        else:   # the slices' partial products, unsummed
            spec.kernel[p.grid, p.block, s, p.shared_bytes](A, B, W)
        BIAS_FINISH[(out, bias_type)][p.reduce_grid, spec.reduce_block, s](W, bias, C)
        return
    #: the arrays a bias-epilogue rung takes right after C
    extra = [] if not spec.bias_arg else [
        bias if bias is not None else np.zeros((0, N), np.dtype(spec.kernel_dtypes[0]))]

    if out16 is not None and p.splits <= 1:   # as run_rounded: float32 first, then rounded
        W = np.empty((M, N), np.float32)
        launch(p, A, B, W, M, N, K, stream, bias=bias, bias_type=bias_type)
        REDUCE16[out16][p.reduce_grid, spec.reduce_block, s](W, C)
        return
    if spec.tma_boxes:
        if K == 0:   # as on the GPU (run): C = 0 without the kernel
            C[...] = 0
            return
        if spec.a_prep is not None:   # as on the GPU (run): the kernel reads A.T
            At = np.empty((M, K), dtype=A.dtype)
            spec.a_prep[spec.a_prep_grid(K, M), spec.b_prep_block, s](A, At)
            A = At
        if spec.b_prep is not None:   # as on the GPU (run): the kernel reads B.T
            Bt = np.empty((N, K), dtype=B.dtype)
            spec.b_prep[spec.b_prep_grid(K, N), spec.b_prep_block, s](B, Bt)
            B = Bt
        if spec.swap_ab:   # as on the GPU (_launch_main): the kernel's A is B
            A, B = B, A
        arrays, boxes, dC = (A, B), spec.tma_boxes, None
        if spec.tma_store_box:
            dC = _simulated_device_copy(C)
            if spec.c_map_ok(N, dC._ary.ctypes.data):   # the kernel's test, on its C
                stack = dC._ary.reshape(p.batch, p.M // p.batch, N)   # as _tensor_maps: 3-D
                arrays, boxes = (A, B, stack), spec.tma_boxes + (spec.tma_store_box,)
        where = tma.simulated_maps(arrays, boxes, spec.tma_swizzle,
                                   tuple(scales) if spec.scale_words else ())
        # a slice of a wider matrix reaches the kernel through its map only; the argument
        # (its shape, for the kernel) is a packed stand-in of NaN bits, which any read by
        # pointer would carry into C
        A, B = (x if x.flags.c_contiguous else np.full(x.shape, _NAN_BITS[x.dtype.kind,
                                                                         x.dtype.itemsize],
                                                         x.dtype) for x in (A, B))
        work = [np.zeros((r, c), dtype=dt) for r, c, dt in p.workspace]
        spec.kernel[p.grid, p.block, s, p.shared_bytes](A, B, C if dC is None else dC, *extra,
                                                        *work, np.uint64(where))
        if dC is not None:
            C[...] = dC._ary
        return
    if p.splits <= 1:   # (a rung that sums its K slices itself takes its workspace after C)
        work = [np.zeros((r, c), dtype=dt) for r, c, dt in p.workspace]
        spec.kernel[p.grid, p.block, s, p.shared_bytes](A, B, C, *extra, *work)
        return
    W = np.empty((p.splits * M, N), dtype=np.float32)
    spec.kernel[p.grid, p.block, s, p.shared_bytes](A, B, W)
    reduce = spec.reduce_kernel if out16 is None else REDUCE16[out16]
    reduce[p.reduce_grid, spec.reduce_block, s](W, C)


def _row_pitches(A, B) -> tuple:
    """(lda, ldb): the elements between rows of GPU arrays A and B (0: packed), from their
    ``__cuda_array_interface__`` strides."""
    out = []
    for x in (A, B):
        cai = x.__cuda_array_interface__
        strides = cai.get("strides")
        out.append(strides[0] // int(cai["typestr"][2:]) if strides else 0)
    return tuple(out)


def _as_it_lies(x):
    """A NumPy operand whose rows lie further apart than a row, as a simulated device array
    of the same memory that reads as the GPU's argument does (numba's simulator refuses to
    copy it in): ``gemmlib.intrinsics.pitch.simulated_argument``.  Anything else as it is."""
    if (isinstance(x, np.ndarray) and x.ndim == 2 and not x.flags.c_contiguous
            and x.strides[1] == x.itemsize and x.strides[0] > x.strides[1] * x.shape[1]):
        from gemmlib.intrinsics.pitch import simulated_argument

        return simulated_argument(x)
    return x


#: a NaN of each operand type, by (dtype kind, itemsize): float32, fp16/bf16 bits, FP8 bits
_NAN_BITS = {("f", 4): np.nan, ("f", 2): np.nan, ("u", 2): 0x7FFF, ("u", 1): 0x7F}


def _simulated_device_copy(C):
    """C as a simulated device array at C's own offset from 16 bytes (the kernel tests it).
    The simulator copies a NumPy argument in and back, so a TMA-store twin that wrote C
    itself would be overwritten: kernel and twin must write one array."""
    from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

    raw = np.empty(C.nbytes + 16, np.uint8)
    off = (C.ctypes.data - raw.ctypes.data) % 16
    copy = raw[off:off + C.nbytes].view(C.dtype).reshape(C.shape)
    copy[...] = C
    return FakeCUDAArray(copy)
