"""Answers to chapter 16's exercises: the pipelined tensor-core kernel."""

import numpy as np


def stage(kt, stages=4):
    """(buffer computed from, buffer cp.async fills with tile kt + stages - 1) at k-tile kt."""
    return kt % stages, (kt + stages - 1) % stages


def min_stages(latency, compute):
    """The smallest ring for which the tensor cores never wait after the prologue, found by
    running the schedule of gemmcourse.viz_precision."""
    from gemmcourse import viz_precision as vp

    return next(s for s in range(2, 64) if vp.tensor_core_idle(
        vp.pipeline_schedule(s, 40, latency=latency, compute=compute)) == 0.0)


def split(x):
    """3xTF32's split of a float32: big = x rounded to TF32, small = the rest rounded too."""
    from gemmlib.intrinsics import mma as I

    x = np.float32(x)
    big = I.as_float_py(I.cvt_tf32_py(x))
    small = I.as_float_py(I.cvt_tf32_py(np.float32(x - big)))
    return big, small


def tolerance(precision="tf32", K=4096):
    """gemmlib's relative error bound for a product of depth K in ``precision``."""
    from gemmlib.precision import tolerance as bound

    return bound(precision, K)
