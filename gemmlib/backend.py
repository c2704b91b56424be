"""Where kernels run: a real CUDA GPU, or numba's CUDA simulator.

Everything that differs between the two lives here, so kernels, tests and
notebooks run unchanged in both:

* ``SIMULATOR`` -- True when ``NUMBA_ENABLE_CUDASIM=1`` was set before numba
  was imported (``cuda.is_available()`` is True in the simulator too, so it
  cannot tell them apart).
* ``cuda`` -- the numba ``cuda`` module kernels are written against.  Kernels
  and intrinsics import it from here, never from numba directly, so another
  compiler (numba-cuda-mlir, which has no simulator yet) can be slotted in.
* the array module: CuPy on a GPU, NumPy in the simulator (CuPy imports
  without a GPU but cannot allocate);
* host/device transfer, random inputs, the float64 reference product and the
  cuBLAS product used as the speed reference (TF32 off).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache

from gemmlib import _compat  # noqa: F401  (must run before numba is imported)

import numba
import numpy as np
from numba import cuda
from numba import float32, float64, int32, uint8, uint16, uint32, uint64  # noqa: F401  (re-exported)

SIMULATOR: bool = bool(numba.config.ENABLE_CUDASIM)

if SIMULATOR:  # numba's block scheduler spins between syncthreads; gemmlib's waits
    from gemmlib import _simulator

    _simulator.install()
else:  # one quadratic step of numba-cuda's lowering, in one pass (gemmlib/_lowering.py)
    from gemmlib import _lowering

    _lowering.install()

# Small verification shapes launch few blocks on purpose; numba's
# "low occupancy" warning would only bury real messages.
numba.config.CUDA_LOW_OCCUPANCY_WARNINGS = 0

# cuBLAS must not use TF32 tensor cores for float32 products: that would make
# the reference ~10x faster and ~1000x less accurate than the fp32 kernels it
# is compared with.  CuPy reads this once per dtype, at its first matmul.
if os.environ.get("CUPY_TF32", "0") != "0":
    import warnings

    warnings.warn("CUPY_TF32 is set: gemmlib turns it off so fp32 is compared with fp32")
os.environ["CUPY_TF32"] = "0"


class NoGPUError(RuntimeError):
    """Raised when GPU work is asked for and there is neither a GPU nor the simulator."""


@lru_cache(maxsize=None)
def array_module():
    """CuPy on a GPU, NumPy in the simulator."""
    if SIMULATOR:
        return np
    try:
        import cupy
    except ImportError as e:  # pragma: no cover - depends on the install
        raise NoGPUError(
            "gemmlib needs CuPy on a GPU: pip install 'gemmlib[gpu]' "
            "(or set NUMBA_ENABLE_CUDASIM=1 before importing gemmlib to use the simulator)"
        ) from e
    return cupy


def gpu_present() -> bool:
    """True when a real CUDA GPU can be used (always False in the simulator)."""
    if SIMULATOR:
        return False
    try:
        return bool(cuda.is_available()) and len(cuda.gpus) > 0
    except Exception:  # pragma: no cover - driver problems
        return False


_DEVICE_SEEN = False


def require_device() -> None:
    global _DEVICE_SEEN
    if _DEVICE_SEEN:  # checked once: this runs on every matmul call
        return
    if not SIMULATOR and not gpu_present():
        raise NoGPUError(
            "no CUDA GPU found. Run on a machine with an NVIDIA GPU, or set "
            "NUMBA_ENABLE_CUDASIM=1 before importing gemmlib to use numba's simulator."
        )
    _DEVICE_SEEN = True


# --------------------------------------------------------------------------
# Device facts, read from the device (never typed in)


@dataclass(frozen=True)
class DeviceInfo:
    name: str
    compute_capability: tuple[int, int]
    sm_count: int
    max_threads_per_block: int
    max_shared_per_block: int  # without opt-in (48 KiB on every current GPU)
    max_shared_per_block_optin: int
    max_shared_per_sm: int
    registers_per_block: int
    registers_per_sm: int
    max_threads_per_sm: int
    max_grid: tuple[int, int, int]
    l2_bytes: int
    warp_size: int
    max_sm_clock_mhz: float
    simulated: bool
    memory_clock_khz: int = 0
    memory_bus_bits: int = 0

    @property
    def peak_bandwidth_gbs(self) -> float:
        """DRAM peak: 2 transfers per clock (double data rate) x clock x bus width."""
        return 2 * self.memory_clock_khz * 1e3 * self.memory_bus_bits / 8 / 1e9

    @property
    def fp32_peak_tflops(self) -> float:
        """FMA peak: SMs x 128 fp32 lanes x 2 flops x clock (sm_70+; 64 lanes on sm_75/sm_80)."""
        lanes = 64 if self.compute_capability in ((7, 5), (8, 0)) else 128
        return self.sm_count * lanes * 2 * self.max_sm_clock_mhz * 1e6 / 1e12


# A plausible device for the simulator, so launch-geometry checks still run.
_SIM_DEVICE = DeviceInfo(
    name="numba CUDA simulator", compute_capability=(9, 0), sm_count=1,
    max_threads_per_block=1024, max_shared_per_block=48 * 1024,
    max_shared_per_block_optin=227 * 1024, max_shared_per_sm=228 * 1024,
    registers_per_block=65536, registers_per_sm=65536, max_threads_per_sm=2048,
    max_grid=(2**31 - 1, 65535, 65535), l2_bytes=0, warp_size=32,
    max_sm_clock_mhz=0.0, simulated=True,
)


@lru_cache(maxsize=None)
def device_info(device_id: int | None = None) -> DeviceInfo:
    """Facts about the current (or given) GPU, read from the driver."""
    if SIMULATOR:
        return _SIM_DEVICE
    require_device()
    dev = cuda.get_current_device() if device_id is None else cuda.gpus[device_id]
    attr = lambda n: int(getattr(dev, n))  # noqa: E731
    name = dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name)
    return DeviceInfo(
        name=name,
        compute_capability=tuple(dev.compute_capability),
        sm_count=attr("MULTIPROCESSOR_COUNT"),
        max_threads_per_block=attr("MAX_THREADS_PER_BLOCK"),
        max_shared_per_block=attr("MAX_SHARED_MEMORY_PER_BLOCK"),
        max_shared_per_block_optin=attr("MAX_SHARED_MEMORY_PER_BLOCK_OPTIN"),
        max_shared_per_sm=attr("MAX_SHARED_MEMORY_PER_MULTIPROCESSOR"),
        registers_per_block=attr("MAX_REGISTERS_PER_BLOCK"),
        registers_per_sm=attr("MAX_REGISTERS_PER_MULTIPROCESSOR"),
        max_threads_per_sm=attr("MAX_THREADS_PER_MULTIPROCESSOR"),
        max_grid=(attr("MAX_GRID_DIM_X"), attr("MAX_GRID_DIM_Y"), attr("MAX_GRID_DIM_Z")),
        l2_bytes=attr("L2_CACHE_SIZE"),
        warp_size=attr("WARP_SIZE"),
        max_sm_clock_mhz=attr("CLOCK_RATE") / 1000.0,
        simulated=False,
        memory_clock_khz=attr("MEMORY_CLOCK_RATE"),
        memory_bus_bits=attr("GLOBAL_MEMORY_BUS_WIDTH"),
    )


# --------------------------------------------------------------------------
# Arrays


def to_device(a):
    """Copy a host array to the device (a NumPy array stays as it is in the simulator)."""
    require_device()
    xp = array_module()
    return np.ascontiguousarray(a) if xp is np else xp.asarray(a)


def to_host(a) -> np.ndarray:
    """Copy a device array (CuPy, numba, or NumPy in the simulator) to a NumPy array."""
    if isinstance(a, np.ndarray):
        return a
    if hasattr(a, "copy_to_host"):  # numba device array
        return a.copy_to_host()
    return array_module().asnumpy(a)


def empty(shape, dtype=np.float32):
    return array_module().empty(shape, dtype=dtype)


def poisoned(shape, dtype=np.float32):
    """An output buffer full of NaN, so any element a kernel forgets to write shows."""
    return array_module().full(shape, np.nan, dtype=dtype)


def random_matrix(shape, dtype=np.float32, rng=None):
    """Uniform values in [-1, 1): fresh, non-integer data (zeros hide indexing bugs).

    ``dtype="bfloat16"`` returns a :class:`gemmlib.precision.BF16Array` (the
    float32 values rounded to bfloat16).
    """
    if str(dtype) == "bfloat16":
        from gemmlib.precision import to_bf16

        return to_bf16(random_matrix(shape, np.float32, rng))
    xp = array_module()
    if xp is np:
        rng = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
        return rng.uniform(-1.0, 1.0, size=shape).astype(dtype)
    gen = xp.random.default_rng(rng if isinstance(rng, (int, type(None))) else None)
    return (gen.random(shape, dtype=np.float64) * 2.0 - 1.0).astype(dtype)


def reference(A, B):
    """The oracle: the product in float64 (cuBLAS DGEMM on a GPU, NumPy in the simulator)."""
    xp = array_module()
    return xp.matmul(as_float64(A), as_float64(B))


def as_float64(x):
    """An array's values in float64 (bfloat16 BF16Arrays included)."""
    xp = array_module()
    if hasattr(x, "bits"):  # gemmlib.precision.BF16Array
        x = x.astype(np.float32)
    return xp.asarray(x, dtype=np.float64)


def cublas_matmul(A, B, out=None):
    """cuBLAS in the inputs' own precision (TF32 off): the speed reference."""
    xp = array_module()
    return xp.matmul(A, B, out=out)


#: cudaDataType of the inputs and cublasComputeType per precision (cuBLAS's own names)
_CUDA_R_32F, _CUDA_R_16F, _CUDA_R_16BF = 0, 2, 14
_COMPUTE = {"fp32": 68, "tf32": 77, "fp16": 68, "bf16": 68}  # 32F, 32F_FAST_TF32
_INPUT_TYPE = {"fp32": _CUDA_R_32F, "tf32": _CUDA_R_32F, "fp16": _CUDA_R_16F,
               "bf16": _CUDA_R_16BF}


def cublas_gemm(A, B, C, precision: str = "fp32") -> None:
    """C (float32) = A @ B by cuBLAS in ``precision``: the same-precision reference.

    ``cublasGemmEx`` with fp32 output and fp32 accumulation: fp32 (TF32 off,
    CUBLAS_COMPUTE_32F), tf32 (CUBLAS_COMPUTE_32F_FAST_TF32), fp16 and bf16
    inputs (CUBLAS_COMPUTE_32F).  ``A`` and ``B`` are CuPy arrays (bfloat16 as a
    BF16Array of bits).  Row-major C = A @ B is column-major C^T = B^T A^T.
    """
    import cupy
    from cupy_backends.cuda.libs import cublas

    a = getattr(A, "bits", A)
    b = getattr(B, "bits", B)
    M, K = a.shape
    N = b.shape[1]
    handle = cupy.cuda.device.get_cublas_handle()
    cublas.setStream(handle, cupy.cuda.get_current_stream().ptr)
    one, zero = np.ones(1, np.float32), np.zeros(1, np.float32)
    t = _INPUT_TYPE[precision]
    cublas.gemmEx(handle, 0, 0, N, M, K, one.ctypes.data, b.data.ptr, t, N, a.data.ptr, t, K,
                  zero.ctypes.data, C.data.ptr, _CUDA_R_32F, N, _COMPUTE[precision], -1)


def relative_error(C, ref) -> float:
    """||C - ref||_F / ||ref||_F, computed in float64; NaN anywhere gives NaN.

    When the reference is all zeros (K == 0) the absolute error is returned.
    """
    xp = array_module()
    C64 = xp.asarray(C, dtype=np.float64)
    diff = float(xp.linalg.norm(C64 - ref))
    scale = float(xp.linalg.norm(ref))
    return diff / scale if scale > 0 else diff


def synchronize() -> None:
    if SIMULATOR:
        return
    cuda.synchronize()


# --------------------------------------------------------------------------
# Streams and timing


def kernel_stream(stream=None):
    """A numba stream to launch on: the caller's (CuPy or numba), else CuPy's current one.

    Launching on CuPy's current stream keeps gemmlib ordered with the CuPy
    work around it.
    """
    if SIMULATOR:
        return cuda.default_stream() if stream is None else stream
    if stream is None:
        ptr = array_module().cuda.get_current_stream().ptr
        return cuda.default_stream() if ptr == 0 else cuda.external_stream(ptr)
    if hasattr(stream, "handle") and hasattr(stream, "synchronize") and not hasattr(stream, "ptr"):
        return stream  # already a numba stream
    if hasattr(stream, "ptr"):  # CuPy stream
        return cuda.default_stream() if stream.ptr == 0 else cuda.external_stream(stream.ptr)
    raise TypeError(f"stream must be a CuPy or numba stream, not {type(stream).__name__}")
