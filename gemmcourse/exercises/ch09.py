"""Answers to chapter 9's exercises: warp tiling."""

import gemmlib
from gemmlib import backend


def results_per_thread():
    """Elements of C each thread of the default warptile computes."""
    spec = gemmlib.get_kernel("warptile")
    return spec.params["BM"] * spec.params["BN"] // spec.threads


def failed_constraints(M=1024, N=1024, K=1024):
    """What a warptile with 16 x 16 thread tiles breaks on this device."""
    from gemmlib.kernels import warptile

    return warptile.build(TM=16, TN=16, WNITER=2).failed_constraints(
        M, N, K, backend.device_info())
