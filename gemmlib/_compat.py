"""Compatibility shim, imported before numba.

numba-cuda 0.30 still calls ``np.row_stack``, which NumPy 2.5 removed
(NVIDIA/numba-cuda#907, closed as won't-fix).  gemmlib pins ``numpy<2.5``, but
GPU images and Colab may already ship 2.5; there the old name is restored as
the alias it always was, so kernels compile.  Remove once numba-cuda drops it.
"""

import numpy as np

if not hasattr(np, "row_stack"):
    np.row_stack = np.vstack
