"""Unsigned array indices: indexing without Python's negative-index fix-up.

numba indexes arrays the way Python does, so ``a[i, j]`` with ``i = -1``
means the last row.  For every *signed* index it therefore emits
``i = i + n if i < 0 else i`` before computing the address.  In a hot loop
that select costs more than its own instruction: the compiler can no longer
see that ``sA[r, k]``, ``sA[r, k + 1]``, ... are 4 bytes apart, so instead of
one base address plus constant offsets (``LDS R1, [R0+0x4]``) it computes
every address from scratch, and keeps the extra values alive in registers.

An *unsigned* index cannot be negative, so numba skips the fix-up.
``uidx(i)`` is ``numba.uint64(i)``: on the GPU a free reinterpretation of
the 64-bit index, in the simulator a NumPy ``uint64`` -- and there a negative
``i`` raises instead of silently wrapping, so a kernel that would index out
of bounds on the GPU fails loudly in CI.

Use it where the compiler sees it many times (the unrolled inner loop and the
tile copies); the kernel's correctness must not depend on it: every index
passed through ``uidx`` is >= 0 by construction.

Compiled for sm_90 offline (the ptxas inside nvJitLink 13.5), the 2D-tiled
rung -- 128 x 128 x 8 tiles, 8 x 8 results per thread -- went from 484
machine instructions (256 of them FMAs) to 329 per four k-steps, and from 174
registers to 128 with no cap; on an H200 from 26.9% to 53.1% of cuBLAS at 4096^3
(results/uidx-2026-11-22/, which has every rung before and after).

**32-bit quotients.**  A 64-bit integer division or remainder by a value known only at
run time is no single instruction on the GPU: ptxas calls a subroutine for it.  A kernel
with a call in it gets its wgmma instructions serialized -- each waits for the one before
to finish (ptxas's "C7509 ... serialized due to the presence of Extern calls") -- which
hides little behind a 128 x 256 tile and most behind the narrow ones of small batches.
Tile walks divide tile numbers and counts that fit 32 bits, so they divide as
``u32(a) // u32(b)`` (``div.u32``, inlined) and widen the result with ``int64``;
``gemmlib.ptx.problems`` fails any Hopper rung whose machine code is serialized.
"""

from numba import int64, uint32 as u32, uint64 as uidx

__all__ = ["int64", "u32", "uidx"]
