"""Device intrinsics numba-cuda lacks, each with a plain-Python twin for the simulator.

Submodules: ``vector`` (16-byte loads and stores), ``async_copy`` (cp.async,
commit and wait).  Kernels import them from here.
"""
