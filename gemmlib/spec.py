"""What a kernel rung declares about itself, and the checks made before launch.

Every module in ``gemmlib.kernels`` builds one :class:`KernelSpec`: the numba
kernel plus everything needed to launch it safely (tile, block, shared
memory, minimum compute capability) and to teach it (chapter, one-line idea,
tile parameters).  :meth:`KernelSpec.check` runs before every launch and
names the constraint that failed, so a bad configuration never reaches the
GPU as an opaque launch failure.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping

import numpy as np

from gemmlib.backend import DeviceInfo


def cdiv(a: int, b: int) -> int:
    """Ceiling division: how many tiles of size b cover a."""
    return -(-a // b)


class ConstraintError(ValueError):
    """A kernel cannot run this problem on this device; the message says why."""


@dataclass(frozen=True)
class Constraint:
    """A named condition on (spec, M, N, K, device); ``why`` explains the rule."""

    name: str
    holds: Callable[["KernelSpec", int, int, int, DeviceInfo], bool]
    why: str


@dataclass(frozen=True)
class Launch:
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    dynamic_shared_bytes: int = 0


def _threads(spec, M, N, K, dev):
    return spec.threads <= dev.max_threads_per_block


def _shared(spec, M, N, K, dev):
    # Static shared memory above 48 KiB does not compile; dynamic needs opt-in.
    limit = dev.max_shared_per_block_optin if spec.dynamic_shared else dev.max_shared_per_block
    return spec.shared_bytes <= limit


def _cc(spec, M, N, K, dev):
    return tuple(dev.compute_capability) >= tuple(spec.min_cc)


def _grid(spec, M, N, K, dev):
    grid = spec.launch(M, N, K).grid
    return all(g <= lim for g, lim in zip(grid, dev.max_grid))


def register_tile_fits(overhead: int) -> Constraint:
    """A TM x TN accumulator plus its two fragments, and ``overhead`` registers for
    addresses and loop state, must fit a thread's 255 registers (else they spill)."""
    def holds(spec, M, N, K, dev):
        p = spec.params
        return p["TM"] * p["TN"] + p["TM"] + p["TN"] + overhead <= 255

    return Constraint("registers per thread", holds,
                      "the TM x TN accumulator plus fragments must fit in 255 registers "
                      "(otherwise it spills to local memory)")


COMMON_CONSTRAINTS = (
    Constraint("threads per block", _threads,
               "a block may hold at most the device's MAX_THREADS_PER_BLOCK threads"),
    Constraint("shared memory per block", _shared,
               "the block's shared-memory tiles must fit the device's per-block limit"),
    Constraint("compute capability", _cc,
               "the kernel uses instructions this GPU generation does not have"),
    Constraint("grid size", _grid,
               "gridDim.y and gridDim.z are limited to 65535 blocks: the problem is too "
               "large along that axis for this kernel's tile"),
)


@dataclass(frozen=True)
class KernelSpec:
    """One rung of the kernel ladder.

    ``grid`` maps (M, N, K) to the launch grid; ``tile`` is the (rows, cols)
    of C one block computes.  ``ptx_must`` / ``ptx_must_not`` are regular
    expressions the compiled PTX must (not) contain: the compile gate checks
    them for every target, so a rung's claim ("16-byte loads", "no local
    memory") is proven by the compiler's output, not asserted in prose.
    """

    name: str
    chapter: str
    idea: str
    kernel: object
    block: tuple[int, int, int]
    tile: tuple[int, int]
    grid: Callable[[int, int, int], tuple[int, int, int]]
    params: Mapping[str, int] = field(default_factory=dict)
    shared_bytes: int = 0
    dynamic_shared: bool = False
    min_cc: tuple[int, int] = (5, 0)
    #: why ``min_cc`` (added to the ConstraintError an older GPU gets; "": the generic reason)
    min_cc_why: str = ""
    dtype: str = "float32"
    #: "KN": B is (K, N) and C = A @ B.  "NK": B is given transposed, (N, K)
    #: row-major (K-major, as in CuTe/MoYe), and C = A @ B.T.
    b_operand: str = "KN"
    #: "MK": A is (M, K) row-major.  "KM": A is given as its (K, M) row-major memory -- a
    #: column-major A, ``X.T`` of a row-major X (K, M) -- and C = X.T @ B.
    a_operand: str = "MK"
    constraints: tuple[Constraint, ...] = ()
    ptx_must: tuple[str, ...] = ()
    ptx_must_not: tuple[str, ...] = (r"\bld\.local", r"\bst\.local")
    #: register spills ptxas may produce (bytes per thread); > 0 only with a reason
    max_spill_bytes: int = 0
    #: plain-Python index functions the kernel itself calls (for figures)
    index: Mapping[str, Callable] = field(default_factory=dict)
    module: str = ""
    #: Split-K specs only: when the grid has Z > 1 blocks along z, the kernel writes Z
    #: partial products into a (Z*M, N) workspace and ``reduce_kernel(W, C)`` adds them,
    #: launched with ``reduce_block`` threads (see gemmlib.kernels.split_k).
    reduce_kernel: object = None
    reduce_block: tuple[int, int, int] = (32, 8, 1)
    #: params that only change the launch (the grid), not the compiled code
    launch_only: tuple[str, ...] = ()
    #: what the kernel computes in (gemmlib.precision): "fp32" on the CUDA cores, or a
    #: tensor-core precision ("tf32", "3xtf32", "fp16", "bf16")
    precision: str = "fp32"
    #: dtypes of the kernel's arguments (A, B, C) when they differ from ``dtype``:
    #: 16-bit inputs travel as their uint16 bit patterns, C is float32
    arg_dtypes: tuple[str, str, str] = ()
    #: the kernel moves A and B in 16-byte pieces and needs K and N to be multiples
    #: of this many elements and 16-byte aligned operands; ``gemmlib.matmul`` stages
    #: other operands into zero-padded aligned copies (0: no requirement)
    operand_align: int = 0
    #: TMA rungs: the boxes (rows, cols) that the tensor maps of A and B copy, written
    #: into shared memory with a ``tma_swizzle``-byte swizzle.  The kernel then takes a
    #: fourth argument, a uint64: the device address of A's map, B's 128 bytes further
    #: (``gemmlib.runtime.maps.operand_maps``; numba kernels have no by-value map parameters)
    tma_boxes: tuple = ()
    tma_swizzle: int = 128
    #: rungs that store C by TMA (``wgmma_store``): the box (rows, cols) of C's map, the
    #: third map of the block (256 bytes past A's), 128-byte swizzle, 3-D (batch, M, N) so
    #: that a batched launch's boxes stay in their product.  Passed only when C
    #: can take it (rows a multiple of 16 bytes, 16-byte aligned: :meth:`c_map_ok`); the
    #: kernel makes the same test and otherwise stores from registers
    tma_store_box: tuple = ()
    #: rungs that keep state between the blocks of a launch (split-K with in-kernel sums):
    #: ``workspace(M, N, K)`` gives the (rows, cols, dtype) of the arrays the kernel takes
    #: after C, whose dtypes are ``workspace_dtypes``.  Integer arrays are counters that
    #: must be zero before a launch and that the kernel leaves zero; ``gemmlib.dispatch``
    #: allocates them once per plan and stream
    workspace: Callable | None = None
    workspace_dtypes: tuple[str, ...] = ()
    #: rungs whose kernel reads B K-major, (N, K), while the caller gives (K, N): a kernel
    #: ``b_prep(B, Bt)`` that writes B's transpose, launched first with ``b_prep_block``
    #: threads and ``b_prep_grid(K, N)`` blocks into a buffer ``gemmlib.dispatch`` keeps
    #: per plan and stream; the main kernel then takes Bt as its B
    b_prep: object = None
    b_prep_block: tuple[int, int, int] = (32, 8, 1)
    b_prep_grid: Callable | None = None
    #: the same for A: a rung that reads A K-major only, built for a caller's (K, M) A
    #: (``a_operand`` "KM"), transposes it first with ``a_prep(A, At)`` (``a_prep_grid(K,
    #: M)`` blocks of ``b_prep_block`` threads) and takes At, (M, K), as its A
    a_prep: object = None
    a_prep_grid: Callable | None = None
    #: FP8 rungs: the maps block carries two more 64-bit words after the maps, the device
    #: addresses of the float32 scales of A and B (``gemmlib.dispatch.run``'s ``scales``)
    scale_words: bool = False
    #: cluster rungs: blocks per thread-block cluster along x (launched with
    #: ``cuLaunchKernelEx``'s cluster attribute by ``gemmlib.dispatch``; 1: no cluster)
    cluster: int = 1
    #: rungs with a bias epilogue: the kernel takes a fourth array right after C, the bias
    #: as a (1, N) row in the inputs' element type (uint16 bits for fp16/bf16), added to
    #: each accumulator in fp32 before the single rounding into C; a (0, N) array (null
    #: pointer) means no bias.  One compiled kernel serves both
    bias_arg: bool = False
    #: rungs that run a batch of products in one launch: A, B and C hold the products'
    #: matrices one under the other (``gemmlib.dispatch.plan`` with ``batch``); the kernel
    #: counts the products from B's rows
    batched: bool = False
    #: swap-AB rungs (``wgmma_swap``): the kernel computes C^T = B^T A^T -- its A is the
    #: caller's B (as ``b_operand`` lays it), its B the caller's A (M, K), and it writes C
    #: transposed back -- so the runtime passes and maps the two operands exchanged
    swap_ab: bool = False
    #: rungs whose kernel's first step is ``ws_pipeline.early_launch`` (it waits for the
    #: stream's previous kernel before touching global memory): the runtime launches them
    #: with programmatic stream serialization, so their blocks are placed while the
    #: previous kernel drains, not after it and a launch gap
    early_launch: bool = False
    #: builds that read A and B through ``gemmlib.intrinsics.pitch.pitched`` views (a
    #: rung's ``PITCHED`` build: ``gemmlib.runtime.select.with_pitch``): an operand that is
    #: a slice of a wider matrix (rows further apart than a row) is read where it lies, its
    #: row stride taken from the strides word of its array argument (written by
    #: ``gemmlib.runtime.launch``; taken where every row stays 16-byte aligned:
    #: ``gemmlib.paths.product._takes_pitch``)
    reads_pitched: bool = False

    @property
    def b_kmajor(self) -> bool:
        """The main kernel takes B as (N, K): given so (``b_operand == "NK"``) or made so."""
        return self.b_operand == "NK" or self.b_prep is not None

    def kernel_operands(self, M: int, N: int, K: int, batch: int = 1) -> tuple:
        """((rows, cols), (rows, cols)): the memory of the kernel's A and B arguments for the
        caller's (M, N, K) -- ``batch`` products one under the other -- as laid out by
        ``a_operand``, ``b_operand`` (or ``b_prep``) and exchanged for ``swap_ab``."""
        a = (K, M) if self.a_operand == "KM" and self.a_prep is None else (M, K)
        b = (batch * N, K) if self.b_kmajor else (batch * K, N)
        return (b, a) if self.swap_ab else (a, b)

    @property
    def code_params(self) -> dict:
        """The params that determine the compiled kernel (for compile caches)."""
        return {k: v for k, v in self.params.items() if k not in self.launch_only}

    @property
    def kernel_dtypes(self) -> tuple[str, str, str]:
        """The dtypes the compiled kernel takes for (A, B, C)."""
        return tuple(self.arg_dtypes) or (self.dtype,) * 3

    @property
    def array_dtypes(self) -> tuple[str, ...]:
        """The dtypes of every array argument: A, B, C, the bias row (``bias_arg``: A's
        element type), then the workspace arrays."""
        bias = self.kernel_dtypes[:1] if self.bias_arg else ()
        return self.kernel_dtypes + bias + tuple(self.workspace_dtypes)

    def c_map_ok(self, N: int, c_ptr: int) -> bool:
        """Whether this call's C gets a TMA map (``tma_store_box``; the kernel's own test)."""
        if not self.tma_store_box:
            return False
        return (N * np.dtype(self.out_dtype).itemsize) % 16 == 0 and c_ptr % 16 == 0

    @property
    def scalar_args(self) -> tuple[str, ...]:
        """numba type names of the kernel's arguments after A, B, C."""
        return ("uint64",) if self.tma_boxes else ()

    @property
    def out_dtype(self) -> str:
        return self.kernel_dtypes[2]

    @property
    def k_tile(self) -> int:
        """How far along K one block step reaches (BK, or TILE for square tiles)."""
        for key in ("BK", "bk", "TILE"):
            if key in self.params:
                return int(self.params[key])
        return int(self.tile[1])

    @property
    def threads(self) -> int:
        x, y, z = self.block
        return x * y * z

    def launch(self, M: int, N: int, K: int) -> Launch:
        gx, gy, gz = self.grid(M, N, K)
        return Launch(grid=(max(gx, 1), max(gy, 1), max(gz, 1)), block=self.block,
                      dynamic_shared_bytes=self.shared_bytes if self.dynamic_shared else 0)

    def failed_constraints(self, M: int, N: int, K: int, dev: DeviceInfo) -> list[str]:
        """Messages for every constraint that does not hold (empty when it can run)."""
        out = []
        for c in COMMON_CONSTRAINTS + tuple(self.constraints):
            if not c.holds(self, M, N, K, dev):
                out.append(f"{c.name}: {c.why} ({self.describe_for(c.name, M, N, K, dev)})")
        return out

    def check(self, M: int, N: int, K: int, dev: DeviceInfo) -> None:
        failed = self.failed_constraints(M, N, K, dev)
        if failed:
            raise ConstraintError(
                f"kernel {self.name!r} cannot run M={M}, N={N}, K={K} on {dev.name}: "
                + "; ".join(failed))

    def describe_for(self, name, M, N, K, dev) -> str:
        """The numbers behind a constraint, for error messages."""
        if name == "threads per block":
            return f"block {self.block} = {self.threads} threads > {dev.max_threads_per_block}"
        if name == "shared memory per block":
            return f"needs {self.shared_bytes} bytes; limit {dev.max_shared_per_block}"
        if name == "compute capability":
            return (f"needs sm_{self.min_cc[0]}{self.min_cc[1]}+, device is "
                    f"sm_{dev.compute_capability[0]}{dev.compute_capability[1]}"
                    + (f": {self.min_cc_why}" if self.min_cc_why else ""))
        if name == "grid size":
            return f"grid {self.launch(M, N, K).grid} exceeds {dev.max_grid}"
        return f"M={M}, N={N}, K={K}, params={dict(self.params)}"


@dataclass(frozen=True)
class Access:
    """One shared-memory instruction of a kernel, as seen by each thread.

    ``where(tid)`` gives the (row, column) of the first element thread ``tid``
    touches in the 2-D shared array whose rows are ``row_stride`` words apart
    (padding included); ``width`` is how many consecutive words one thread moves
    (1 for a float, 4 for a float4).  ``address`` may replace the row-major
    rule (e.g. for a swizzled layout): it maps (row, col) to a word address.
    """

    array: str
    op: str  # "load" or "store"
    row_stride: int
    where: Callable[[int], tuple[int, int]]
    width: int = 1
    label: str = ""
    address: Callable[[int, int], int] | None = None
    #: how many times each warp executes this instruction per k-tile (for predict())
    count: int = 1

    def words(self, tid: int) -> list[int]:
        r, c = self.where(tid)
        base = self.address(r, c) if self.address else r * self.row_stride + c
        return [base + e for e in range(self.width)]
