"""Host side of TMA: a CUtensorMap for a row-major 2-D CuPy array, kept in device memory."""
import numpy as np


class TensorMap:
    def __init__(self, dev_bytes, array):
        self.buf, self.array = dev_bytes, array     # keep both alive while kernels use them

    @property
    def ptr(self):
        return self.buf.data.ptr


def tensor_map_2d(x, box, swizzle=0):
    """``box`` = (rows, cols) of one copy; ``swizzle`` in 0, 32, 64, 128 (bytes)."""
    import os
    if os.environ.get("I13_PTX") == "1":      # offline compile check: no map, no GPU
        return type("Fake", (), {"ptr": np.uint64(0)})()
    import cupy as cp
    from cuda.bindings import driver as cu

    dt = {np.dtype(np.float16): cu.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
          np.dtype(np.uint16): cu.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_UINT16,
          np.dtype(np.float32): cu.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT32}[x.dtype]
    sw = {0: cu.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_NONE,
          32: cu.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_32B,
          64: cu.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_64B,
          128: cu.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B}[swizzle]
    rows, cols = x.shape
    err, m = cu.cuTensorMapEncodeTiled(
        dt, 2, x.data.ptr, [cu.cuuint64_t(cols), cu.cuuint64_t(rows)],
        [cu.cuuint64_t(x.strides[0])], [cu.cuuint32_t(box[1]), cu.cuuint32_t(box[0])],
        [cu.cuuint32_t(1), cu.cuuint32_t(1)],
        cu.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE, sw,
        cu.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
        cu.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
    if err != cu.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cuTensorMapEncodeTiled: {err}")
    raw = np.array([int(v) for v in m.opaque], dtype=np.uint64)
    return TensorMap(cp.asarray(raw), x)
