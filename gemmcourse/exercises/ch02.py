"""Answers to chapter 2's exercises: loops on the CPU."""


def parallel_loops():
    """The loops of the tiled product whose iterations write disjoint parts of C (the two
    tile loops and the two element loops; the k loops accumulate into the same element)."""
    return {"i0", "j0", "i", "j"}
