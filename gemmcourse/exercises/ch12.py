"""Answers to chapter 12's exercises: double buffering."""


def buffers(kt):
    """(buffer computed from, buffer cp.async fills) at k-tile ``kt`` with two buffers."""
    return kt % 2, (kt + 1) % 2


def async_fragment_regs(BK=8, TM=8, TN=8):
    """async_copy keeps a whole k-tile of fragments: BK values of TM rows and TN columns."""
    return BK * (TM + TN)


def double_fragment_regs(TM=8, TN=8):
    """double_buffer keeps two k-slices of TM + TN values."""
    return 2 * (TM + TN)
