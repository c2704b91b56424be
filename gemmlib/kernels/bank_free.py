"""Rung 7, no shared-memory bank conflicts: swizzle the transposed tile, interleave fragments.

The vectorised kernel has two kinds of bank conflict, which ``gemmlib.banks``
computes from its index functions (and Nsight Compute counts exactly the
same numbers, see results/tuning/README.md):

1. *The transposing store.*  With 256 threads and a 16-wide k-tile, one warp
   copies 8 rows of A, four float4s per row (k-offsets kq = 0, 4, 8, 12),
   and writes ``sAT[kq + e, r]``.  The rows of ``sAT`` are 128 floats long, a
   multiple of 32 banks, so the four kq groups of the warp land on the *same*
   8 banks: a 4-way conflict.

   Padding each row by PAD floats shifts row kq by ``kq * PAD`` banks; with
   an 8-wide k-tile PAD = 4 separates the two groups (``build(BK=8, PAD=4,
   SWIZZLE=False)`` is conflict-free).  With four groups it cannot work: the
   rows must stay a multiple of 4 floats long (16-byte aligned for the float4
   loads), so the shifts are multiples of 16 banks and two of the four groups
   always collide.  A *swizzle* can: row k stores column m at ``m ^ swz(k)``
   with ``swz(k) = 8 * (k // 4)`` (in general ``(k // 4) * 128/BK``, mod 32).
   XOR with a multiple of 4 keeps every aligned float4 in one piece, so the
   fragment loads just XOR their column with the same ``swz(k)`` -- one
   instruction per four k-steps -- and the four groups now use four
   different sets of 8 banks.

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

Everything else -- vector paths, ragged edges, the register cap -- is the
vectorised rung's code (:func:`gemmlib.kernels.vectorized.build` with
``SWIZZLE``, ``PAD`` and ``SPLIT``).
"""

from gemmlib.kernels import vectorized
from gemmlib.spec import KernelSpec


def build(BM: int = 128, BN: int = 128, BK: int = 16, TM: int = 8, TN: int = 8,
          PAD: int = 0, SPLIT: bool = True, SWIZZLE: bool = True,
          max_registers: int | None = 128) -> KernelSpec:
    default = (BM, BN, BK, TM, TN, PAD, bool(SPLIT), bool(SWIZZLE), max_registers) == (
        128, 128, 16, 8, 8, 0, True, True, 128)
    name = "bank_free" if default else (
        f"bank_free_{BM}x{BN}x{BK}_t{TM}x{TN}_p{PAD}_s{int(bool(SPLIT))}"
        + ("_z" if SWIZZLE else "") + (f"_r{max_registers}" if max_registers else ""))
    return vectorized.build(
        BM=BM, BN=BN, BK=BK, TM=TM, TN=TN, PAD=PAD, SPLIT=SPLIT, SWIZZLE=SWIZZLE, name=name,
        chapter="08-bank-conflicts",
        idea="swizzle the transposed A tile and interleave each thread's float4 fragments "
             "so no shared-memory access has a bank conflict",
        module=__name__, max_registers=max_registers)


def accesses(spec):
    return vectorized.accesses(spec)


SPEC = build()
