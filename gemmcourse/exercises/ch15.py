"""Answers to chapter 15's exercises: ldmatrix and swizzling."""

from gemmlib import layout as L


def swizzle(o):
    """The FP16 B tile's swizzle (rows of 64 halves): gemmlib.layout.chunk_swizzle(64, 2)."""
    return L.chunk_swizzle(64, 2)(o)


def conflict_degree(row_halves=32, rows=range(0, 16, 2)):
    """Conflict degree of eight 16-byte reads at the start of the given rows."""
    offsets = [r * row_halves + c for r in rows for c in range(8)]
    return L.bank_conflicts(offsets, 2)


def _warp_step(precision="fp16"):
    from gemmlib.kernels import mma_swizzle

    return mma_swizzle.warp_step_source(precision, 2, 4, 1)


def ldmatrix_per_kstep():
    """ldmatrix.x4 (plain and .trans) one warp issues per k-step of its 32 x 32 tile."""
    src = _warp_step()
    return src.count("load_a(") + src.count("load_b(")


def mma_per_kstep():
    """mma one warp issues per k-step of its 32 x 32 tile."""
    return _warp_step().count("mma(")
