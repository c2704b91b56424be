"""gemmlib: matrix-multiplication kernels for NVIDIA GPUs, written in Python.

>>> import gemmlib
>>> C = gemmlib.matmul(A, B, kernel="shared")      # CuPy / numba / NumPy arrays
>>> gemmlib.verify("shared", [(37, 29, 53)])        # against a float64 oracle
>>> gemmlib.list_kernels()                          # the ladder, in course order
>>> model = gemmlib.patch(model)                    # a torch model's nn.Linear layers
"""

from gemmlib import _compat  # noqa: F401  (before numba)
from gemmlib._version import __version__
from gemmlib.api import DEFAULT_KERNEL, linear, matmul
from gemmlib.backend import SIMULATOR, NoGPUError, device_info
from gemmlib.dispatch import get_spec as get_kernel
from gemmlib.kernels import LADDER, all_specs
from gemmlib.spec import ConstraintError, KernelSpec
from gemmlib.verify import Report, verify


def __getattr__(name: str):
    # the torch-backed parts load on first use: `import gemmlib` never imports torch
    if name in ("nn", "patch", "unpatch"):
        import importlib

        nn = importlib.import_module("gemmlib.nn")
        return nn if name == "nn" else getattr(nn, name)
    raise AttributeError(f"module 'gemmlib' has no attribute {name!r}")


def list_kernels() -> list[str]:
    """Names of every registered kernel, in course order."""
    return list(LADDER)


__all__ = [
    "matmul", "linear", "verify", "list_kernels", "get_kernel", "all_specs", "device_info",
    "ConstraintError", "NoGPUError", "KernelSpec", "Report", "SIMULATOR", "LADDER",
    "DEFAULT_KERNEL", "__version__",
]
