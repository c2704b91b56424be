"""The runtime's entry: a product prepared once, then run on pointers.

    call = prepare(spec, M, N, K)             # the plan: constraints checked, geometry
    run(call, a_ptr, b_ptr, c_ptr, stream)    # one launch (two for a rounded 16-bit C)

A :class:`Call` is also what the front ends remember of a call they have checked
(:data:`CALLS`, under their own description of the operands): a repeat runs it again
with none of the checks or the choice.  Below this module each one does one job:
:mod:`~gemmlib.runtime.select` (which spec), :mod:`~gemmlib.runtime.plans` (its launch
for a shape), :mod:`~gemmlib.runtime.compile` (its machine code, cached on disk),
:mod:`~gemmlib.runtime.launch` (parameters packed, the driver called),
:mod:`~gemmlib.runtime.driver` and :mod:`~gemmlib.runtime.memory`.
"""

from __future__ import annotations

from gemmlib.backend import SIMULATOR
from gemmlib.runtime import compile as compiling
from gemmlib.runtime import launch, plans, select
from gemmlib.runtime.caches import LOCK, LRU, STATS
from gemmlib.runtime.plans import Plan, plan


class Call:
    """A product prepared for operands described alike: its plan and how it launches."""

    __slots__ = ("plan", "out_dtype", "align", "bound", "devices", "kernel", "out16")

    def __init__(self, plan, out_dtype, align: int, out16: str | None = None):
        self.plan = plan            # for a column-major B, a plan of a K-major ("NK") build
        self.out16 = out16          # "fp16"/"bf16": the plan writes float32, rounded into C
        self.kernel = None          # a KernelSpec the call named (its key holds only its id)
        self.out_dtype = out_dtype  # the output's dtype, in the inputs' framework
        self.align = align          # the kernel's operand alignment (16-byte pointers)
        self.bound = {}             # device -> the plan made ready there (launch.bound)
        self.devices = {}           # device -> torch.device, for torch outputs


#: the front ends' memory of calls they have checked: what the operand checks concluded
#: (the plan, the output's dtype) for operands described alike (type, dtype, shape,
#: layout, kernel, precision, output type).  A repeated call then skips the checks whose
#: outcome only those decide (gemmlib.paths.repeat).
CALLS = LRU(4096)


def prepare(spec, M: int, N: int, K: int, out16: str | None = None, batch: int = 1) -> Call:
    """``spec`` (a KernelSpec, a rung name or "auto") planned for (M, N, K) -- or ``batch``
    products of that shape in one launch -- on this device (``ConstraintError`` naming
    the constraint that fails).  ``out16`` ("fp16"/"bf16"): a 16-bit C that the plan,
    writing float32, has rounded into it by one more kernel."""
    p = plan(spec, M, N, K, batch=batch)
    return Call(p, None, p.spec.operand_align, out16)


def run(call: Call, a_ptr: int, b_ptr: int, c_ptr: int, stream: int, bias: tuple = (),
        scales: tuple = (), device: int | None = None, lds: tuple = ()) -> None:
    """Launch ``call`` on device buffers (GPU only; no checks: the front ends made them).
    ``device``: the current device's index, where the caller knows it -- the call keeps
    its plan made ready there (kernels loaded), so a repeat asks the driver nothing.
    ``lds``: row strides of the kernel's A and B memory (``launch.run``)."""
    bound = None
    if device is not None:
        bound = call.bound.get(device)
        if bound is None:   # loaded in this device's context once; then no context query
            bound = call.bound[device] = launch.bound(call.plan)
    if call.out16 is None:
        launch.run(call.plan, a_ptr, b_ptr, c_ptr, stream, bound=bound, scales=scales,
                   bias=bias, lds=lds)
    else:
        launch.run_rounded(call.plan, a_ptr, b_ptr, c_ptr, call.out16, stream, bound=bound,
                           bias=bias, lds=lds)


def run_arrays(call: Call, A, B, C, stream=None, bias=None, bias_type: str | None = None,
               scales: tuple = ()) -> None:
    """The same launch on arrays the kernels take as they are: the simulator's NumPy
    arrays (:func:`gemmlib.runtime.launch.launch`)."""
    p = call.plan
    launch.launch(p, A, B, C, p.M, p.N, p.K, stream=stream, scales=scales, out16=call.out16,
                  bias=bias, bias_type=bias_type)


def warm(kernel, M: int, N: int, K: int) -> Plan:
    """Make the plan and load its kernels now (compiling them if the cache misses)."""
    p = plan(kernel, M, N, K)
    if not SIMULATOR:
        launch.bound(p)
    return p


def cache_info() -> dict:
    """A copy of the counters (tests and the chapter use them to count compilations)."""
    return dict(STATS)


def clear_memory_caches() -> None:
    """Forget specs, choices, plans, loaded kernels and checked calls (not the disk cache)."""
    with LOCK:
        for table in (select._SPECS, select._CHOICES, select._PITCHED, plans._PLANS,
                      compiling._COMPILED, launch._BOUND, launch._SCRATCH, CALLS):
            table.clear()
