"""Rung 7, no shared-memory bank conflicts: pad the transposed tile, interleave the fragments.

The vectorised kernel has two bank conflicts, which ``gemmlib.banks``
computes from its index functions (and Nsight Compute confirms):

1. *The transposing store.*  With 256 threads and an 8-wide A tile, a warp
   copies 16 rows of A, two float4s per row, and writes ``sAT[kq + e, r]``.
   The two threads of one row (kq = 0 and kq = 4) write words
   ``4 * 128`` floats apart -- the same bank, different words: 2-way.
   Fix: pad each row of ``sAT`` by PAD = 4 floats.  Rows are then
   ``BM + 4`` floats apart, so row kq = 4 starts 16 banks further on and the
   two halves of the warp use disjoint banks.  (4, not 1: rows must stay
   16-byte aligned for the float4 fragment loads.)

2. *The fragment loads.*  A float4 load is served a quarter-warp (8 threads,
   128 bytes) at a time.  When thread ``tc`` owns columns ``8*tc .. 8*tc+7``,
   threads 0..7 of a quarter read float4s at columns 0, 8, ..., 56: 256 bytes
   spread over the 32 banks twice, a 2-way conflict on every ``sB`` load of
   the inner loop.  Fix (SPLIT): give each thread two 4-wide pieces, at
   ``4*tc`` and ``BN/2 + 4*tc``.  A quarter-warp then reads 8 consecutive
   float4s -- 128 contiguous bytes, every bank once.  Rows of A are split
   the same way.  The thread still computes 8 x 8 results, just not
   adjacent ones, and its float4 stores to C become contiguous across
   threads too (better coalesced).

Everything else -- vector paths, ragged edges -- is the vectorised rung's
code (:func:`gemmlib.kernels.vectorized.build` with ``PAD`` and ``SPLIT``).
"""

from gemmlib.kernels import vectorized
from gemmlib.spec import KernelSpec


def build(BM: int = 128, BN: int = 128, BK: int = 8, TM: int = 8, TN: int = 8,
          PAD: int = 4, SPLIT: bool = True, max_registers: int | None = None) -> KernelSpec:
    default = (BM, BN, BK, TM, TN, PAD, SPLIT) == (128, 128, 8, 8, 8, 4, True)
    name = "bank_free" if default else (
        f"bank_free_{BM}x{BN}x{BK}_t{TM}x{TN}_p{PAD}_s{int(bool(SPLIT))}")
    if max_registers:
        name += f"_r{max_registers}"
    return vectorized.build(
        BM=BM, BN=BN, BK=BK, TM=TM, TN=TN, PAD=PAD, SPLIT=SPLIT, name=name,
        chapter="08-bank-conflicts",
        idea="pad the transposed A tile and interleave each thread's float4 fragments so "
             "no shared-memory access has a bank conflict",
        module=__name__, max_registers=max_registers)


def accesses(spec):
    return vectorized.accesses(spec)


SPEC = build()
