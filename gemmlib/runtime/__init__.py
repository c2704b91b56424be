"""gemmlib's runtime: what a call needs below the framework front ends.

``driver``  the CUDA driver entry points (ctypes): launches, device, capture state.
``memory``  device memory, streams and CUDA-graph capture rules for workspaces.
"""
