"""Answers to chapter 7's exercises: 16-byte accesses."""

import gemmlib


def _vec():
    return gemmlib.get_kernel("vectorized")


def b_chunk(tid, p):
    """(k, first column) of the float4 chunk of B thread ``tid`` copies in pass ``p``."""
    return _vec().index["b_chunk"](tid, p)


def _floats_per_thread():
    spec = _vec()
    q = spec.params
    return (q["BM"] * q["BK"] + q["BK"] * q["BN"]) // spec.threads


def vector_loads():
    """float4 loads one thread issues per phase for its share of both tiles."""
    return _floats_per_thread() // 4


def scalar_loads():
    """The same share, copied one float at a time."""
    return _floats_per_thread()
