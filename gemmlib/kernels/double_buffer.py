"""Double buffering: two shared tiles and two register fragments, always one being filled.

``async_copy`` overlapped the global -> shared copy with compute, but paid with
a register fragment of a whole k-tile (128 floats per thread), because its
single shared buffer had to be emptied before the next tile could land in it.
Here the buffers are doubled instead, at both levels of the memory hierarchy:

* **shared memory**: two buffers per operand.  While the block computes from
  buffer ``kt % 2``, cp.async fills buffer ``(kt + 1) % 2`` with the next
  k-tile.  Reader and writer swap at every k-tile, and one barrier per
  k-tile (after the wait) is enough: the buffer being overwritten was last
  read before the previous barrier.
* **registers**: two fragments per operand, ``fa0``/``fa1`` (one k-slice of A:
  TM floats) and ``fb0``/``fb1``.  While the FMAs consume slice ``k`` from one,
  the loads of slice ``k + 1`` from shared memory go into the other, so the
  shared-memory latency hides behind the arithmetic.  The k loop is written
  two slices at a time ("ping" then "pong") so every register index is a
  constant; at the last slice of a tile the next load comes from the other
  shared buffer, slice 0 (after the wait and the barrier).

Layouts, tiles, partitions, zero-filled edge tiles and guarded stores are
those of ``layout_nt`` and ``async_copy``; shared memory doubles (17 KiB).
Options: ``copy="sync"`` replaces cp.async with plain copies (sm_75 and
older); ``unroll=False`` keeps the slice loop as a runtime loop (the default
unrolls it, as MoYe's ``@loopinfo unroll`` does, by generating the k-tile's
code); ``min_blocks=2`` asks the compiler to fit two blocks per SM (a register
cap, like ``__launch_bounds__``).  ``BK`` must be even.

Every array index goes through ``uidx`` (unsigned: no negative-index fix-up,
see :mod:`gemmlib.intrinsics.index`): on sm_90 the k-tile loop went from 1490
to 835 machine instructions (512 of them FMAs), 168 registers to 126.

Measured on an H200 at 4096^3 (results/uidx-2026-11-22/; cuBLAS computing
A @ B.T): layout_nt 51.1%, async_copy 59.1%, double_buffer 60.8% of cuBLAS
(before ``uidx``: 26.3%, 31.1%, 34.9%).  Before ``uidx`` the unrolling was
essential: with the slice loop left rolled the kernel reached only 27.6%,
*slower* than the single-buffered async_copy, and cp.async was worth x2.2
over the same structure with synchronous copies (``scripts/experiments/bench_layouts.py``).
"""

from gemmlib import layout as L
from gemmlib.backend import SIMULATOR, cuda, float32
from gemmlib.intrinsics import async_copy
from gemmlib.intrinsics.index import uidx
from gemmlib.kernels.async_copy import PTX_ASYNC, tile_copier
from gemmlib.kernels.layout_nt import _index_functions, accesses, plan  # noqa: F401 (accesses: gemmlib.banks)
from gemmlib.spec import KernelSpec, cdiv


def build(BM: int = 128, BN: int = 128, BK: int = 8, copy_threads=(32, 8),
          mma_threads=(16, 16), pad: int = 4, copy: str = "async",
          min_blocks: int | None = None, unroll: bool = True) -> KernelSpec:
    if BK % 2:
        raise ValueError(f"double_buffer walks k two slices at a time: BK must be even, got {BK}")
    p = plan(BM, BN, BK, copy_threads, mma_threads, pad)
    f = _index_functions(p, device=True)
    a_frag, b_frag, c_dst = f["a_frag"], f["b_frag"], f["c_dst"]
    cp = async_copy.ops(copy)
    wait_all = cp.cp_async_wait_all

    NT = p["threads_mma"].size
    # min_blocks: ask the compiler to fit that many blocks per SM (caps registers,
    # like CUDA's __launch_bounds__(NT, min_blocks)); the simulator has no such option.
    jit_opts = {} if SIMULATOR or not min_blocks else {"launch_bounds": (NT, min_blocks)}
    TM, TN = p["mmaC"].shape
    ACC = TM * TN
    SA_SIZE, SB_SIZE = p["sA"].cosize, p["sB"].cosize
    SA2, SB2 = 2 * SA_SIZE, 2 * SB_SIZE       # two buffers per operand

    issue_tile = tile_copier(p, f, cp)  # async_copy's, writing into buffer a_buf / b_buf

    @cuda.jit(device=True)
    def load_slice(sA, sB, a_buf, b_buf, fa, fb, tid, k):
        """Registers <- shared: my TM elements of A and TN of B at k-slice k."""
        for i in range(TM):
            fa[i] = sA[uidx(a_buf + a_frag(tid, i, k))]
        for j in range(TN):
            fb[j] = sB[uidx(b_buf + b_frag(tid, j, k))]

    @cuda.jit(device=True)
    def fma_slice(acc, fa, fb):
        for i in range(TM):
            for j in range(TN):
                acc[i * TN + j] += fa[i] * fb[j]

    @cuda.jit(device=True)
    def tile_rolled(sA, sB, A, B, acc, fa0, fb0, fa1, fb1, tid, kt, num_k, m0, n0, M, N, K):
        """One k-tile, k walked two slices per iteration (a loop the compiler keeps rolled)."""
        rd = kt % 2                            # buffer being read; 1 - rd is being written
        ra, rb = rd * SA_SIZE, rd * SB_SIZE
        wa, wb = (1 - rd) * SA_SIZE, (1 - rd) * SB_SIZE
        for kb in range(0, BK, 2):
            # ping: slice kb is in fa0/fb0; fetch slice kb+1 into pong
            load_slice(sA, sB, ra, rb, fa1, fb1, tid, kb + 1)
            if kb == 0 and kt + 1 < num_k:      # next k-tile -> the other buffer
                issue_tile(sA, sB, wa, wb, A, B, tid, m0, n0, (kt + 1) * BK, M, N, K)
            fma_slice(acc, fa0, fb0)
            # pong: slice kb+1 is in fa1/fb1; fetch the next slice into ping
            if kb + 2 < BK:
                load_slice(sA, sB, ra, rb, fa0, fb0, tid, kb + 2)
            else:                               # tile done: wait for the next one
                wait_all()
                cuda.syncthreads()
                if kt + 1 < num_k:
                    load_slice(sA, sB, wa, wb, fa0, fb0, tid, 0)
            fma_slice(acc, fa1, fb1)

    # The same k-tile with the slice loop unrolled (MoYe's @loopinfo unroll):
    # generated as straight-line code, so "kb == 0" and "last slice" are decided
    # when the kernel is built, not at every step.  Print tile_step.__source__.
    tile_step = tile_rolled if not unroll else L.jit(
        _tile_source(BK, SA_SIZE, SB_SIZE), device=True,
        env=dict(cuda=cuda, load_slice=load_slice, issue_tile=issue_tile, fma_slice=fma_slice,
                 wait_all=wait_all))

    @cuda.jit(**jit_opts)
    def double_buffer_kernel(A, B, C):
        sA = cuda.shared.array(SA2, float32)
        sB = cuda.shared.array(SB2, float32)
        acc = cuda.local.array(ACC, float32)
        fa0 = cuda.local.array(TM, float32)   # ping
        fb0 = cuda.local.array(TN, float32)
        fa1 = cuda.local.array(TM, float32)   # pong
        fb1 = cuda.local.array(TN, float32)
        tid = cuda.threadIdx.x
        M, K = A.shape
        N = B.shape[0]
        m0 = cuda.blockIdx.x * BM
        n0 = cuda.blockIdx.y * BN
        for e in range(ACC):
            acc[e] = float32(0.0)
        num_k = (K + BK - 1) // BK
        if num_k > 0:                          # prologue: tile 0 -> buffer 0, slice 0 -> ping
            issue_tile(sA, sB, 0, 0, A, B, tid, m0, n0, 0, M, N, K)
            wait_all()
            cuda.syncthreads()
            load_slice(sA, sB, 0, 0, fa0, fb0, tid, 0)
        for kt in range(num_k):
            tile_step(sA, sB, A, B, acc, fa0, fb0, fa1, fb1, tid, kt, num_k, m0, n0, M, N, K)
        for i in range(TM):
            for jj in range(TN):
                m, n = c_dst(tid, i, jj)
                if m0 + m < M and n0 + n < N:
                    C[uidx(m0 + m), uidx(n0 + n)] = acc[i * TN + jj]

    def grid(M, N, K):
        return (cdiv(M, BM), cdiv(N, BN), 1)

    default = (BM, BN, BK, tuple(copy_threads), tuple(mma_threads), pad) == (
        128, 128, 8, (32, 8), (16, 16), 4)
    name = "double_buffer" if default else f"double_buffer_{BM}x{BN}x{BK}_p{pad}"
    if copy == "sync":
        name += "_sync"
    if min_blocks:
        name += f"_mb{min_blocks}"
    if not unroll:
        name += "_rolled"
    return KernelSpec(
        name=name,
        chapter="12-double-buffering",
        idea="two shared buffers (fill one with cp.async while computing from the other) and "
             "two register fragments (load slice k+1 while computing slice k)",
        kernel=double_buffer_kernel,
        block=(NT, 1, 1),
        tile=(BM, BN),
        grid=grid,
        params=dict(BM=BM, BN=BN, BK=BK, TM=TM, TN=TN, pad=pad, min_blocks=min_blocks or 0, copy=copy, buffers=2, unroll=int(unroll),
                    copy_threads=tuple(copy_threads), mma_threads=tuple(mma_threads)),
        shared_bytes=4 * (SA2 + SB2),
        min_cc=async_copy.MIN_CC if copy == "async" else (5, 0),
        b_operand="NK",
        ptx_must=PTX_ASYNC if copy == "async" else (),
        ptx_must_not=(r"\bld\.local", r"\bst\.local") + (() if copy == "async" else (r"cp\.async",)),
        index=_index_functions(p, device=False),
        module=__name__,
    )


def _tile_source(BK, SA_SIZE, SB_SIZE) -> str:
    """Source of ``tile_step``: one k-tile, its BK slices unrolled two at a time."""
    args = "sA, sB, A, B, acc, fa0, fb0, fa1, fb1, tid, kt, num_k, m0, n0, M, N, K"
    out = [f"def tile_step({args}):",
           "    rd = kt % 2",
           f"    ra, rb = rd * {SA_SIZE}, rd * {SB_SIZE}",
           f"    wa, wb = (1 - rd) * {SA_SIZE}, (1 - rd) * {SB_SIZE}"]
    for kb in range(0, BK, 2):
        out.append(f"    # slices {kb} (ping) and {kb + 1} (pong)")
        out.append(f"    load_slice(sA, sB, ra, rb, fa1, fb1, tid, {kb + 1})")
        if kb == 0:
            out += ["    if kt + 1 < num_k:",
                    f"        issue_tile(sA, sB, wa, wb, A, B, tid, m0, n0, (kt + 1) * {BK}, "
                    "M, N, K)"]
        out.append("    fma_slice(acc, fa0, fb0)")
        if kb + 2 < BK:
            out.append(f"    load_slice(sA, sB, ra, rb, fa0, fb0, tid, {kb + 2})")
        else:
            out += ["    wait_all()", "    cuda.syncthreads()", "    if kt + 1 < num_k:",
                    "        load_slice(sA, sB, wa, wb, fa0, fb0, tid, 0)"]
        out.append("    fma_slice(acc, fa1, fb1)")
    return "\n".join(out) + "\n"


SPEC = build()
