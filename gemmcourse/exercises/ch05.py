"""Answers to chapter 5's exercises: phases of the shared-memory kernel."""

import gemmlib


def _shared():
    return gemmlib.get_kernel("shared")


def a_load(block_x, block_y, tx, ty, phase):
    """(row, col) of the element of A that thread (tx, ty) stages in phase ``phase``: its
    row of C, and column tx of the phase's slab of K."""
    spec = _shared()
    row, _ = spec.index["c_element"](block_x, block_y, tx, ty)
    return row, phase * spec.params["TILE"] + tx


def _phases(K):
    from gemmcourse import viz

    TILE = _shared().params["TILE"]
    return viz.tile_phases(_shared(), TILE, TILE, K)[2]


def phases(K=100):
    """How many TILE-wide phases a block runs over K."""
    return len(_phases(K))


def zero_columns(K=100):
    """Columns of the A tile past K, zero-filled, in the last phase."""
    return _phases(K)[-1][1] - K
