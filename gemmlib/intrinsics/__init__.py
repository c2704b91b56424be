"""Device intrinsics numba-cuda lacks, each with a plain-Python twin for the simulator.

Submodules: ``vector`` (16-byte loads and stores), ``async_copy`` (cp.async,
commit and wait), ``pitch`` (operands that are slices of a wider matrix), and more.
Kernels import them from here.
"""
