"""Answers to chapter 14's exercises: the MMA atom."""


def a16_lane(row, col):
    """The lane holding element (row, col) of m16n8k16's A operand (from the layout A_16)."""
    from gemmcourse import viz_tc

    lanes, _ = viz_tc.fragment_map("fp16", "A")
    return int(lanes[row, col])


def mads_per_mma(m=16, n=8, k=16):
    """Multiply-adds in one m16n8k16 mma."""
    return m * n * k


def fma_instructions_per_warp(m=16, n=8, k=16):
    """Warp-wide FMA instructions for the same work, one FMA per lane each."""
    return m * n * k // 32


def tf32_rounded_bits(u):
    """Bits of the TF32 rounding (to nearest, ties away) of the float32 with bits ``u``."""
    from gemmlib.intrinsics import mma as I

    return I.cvt_tf32_py(I.as_float_py(u))
