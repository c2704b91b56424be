"""Answers to chapter 6's exercises: thread coarsening."""

import gemmlib


def thread_strip(tid):
    """(first row, column) in the block tile of the strip thread ``tid`` computes in
    blocktile_1d, read from the kernel's own index function."""
    return gemmlib.get_kernel("blocktile_1d").index["thread_strip"](tid)


def reads_per_fma(TM=4, TN=4):
    """Shared-memory reads per multiply-add for a TM x TN outer product: TM + TN reads feed
    TM * TN multiply-adds."""
    return (TM + TN) / (TM * TN)
