"""Every intrinsic agrees with its plain-Python twin (the one the simulator runs).

The simulator cannot run an ``@intrinsic``, so CI checks the kernels that
use them against the twins only.  Here each GPU intrinsic and its twin get
the same inputs -- global and shared memory, aligned and misaligned
pointers, partial ``src_bytes`` -- and must give the same results
(GPU-marked).  One simulator test makes sure no intrinsic is left without a
twin test: a new ``name`` with a ``name_py`` twin in ``gemmlib.intrinsics``
must be added to ``COVERED`` below.
"""

from __future__ import annotations

import importlib

import numpy as np
import pytest

from gemmlib import backend
from gemmlib.backend import cuda, float32

#: intrinsic -> the test below that compares it with its twin
COVERED = {
    "vector.load4": "test_vector_load4_store4_gpu",
    "vector.store4": "test_vector_load4_store4_gpu",
    "vector.aligned16": "test_vector_aligned16_gpu",
    "vector.store2": "test_vector_store2_aligned8_gpu",
    "vector.aligned8": "test_vector_store2_aligned8_gpu",
    "async_copy.cp_async4": "test_async_copy_gpu",
    "async_copy.cp_async16": "test_async_copy_gpu",
    "async_copy.cp_async_commit": "test_async_copy_gpu",
    "async_copy.cp_async_wait_all": "test_async_copy_gpu",
    "async_copy.cp_async_wait_one": "test_async_wait_one_gpu",
}
MODULES = ("vector", "async_copy")


def _module(name):
    try:
        return importlib.import_module(f"gemmlib.intrinsics.{name}")
    except ImportError:
        return None


def test_every_intrinsic_has_a_twin_test():
    found = []
    for mod_name in MODULES:
        mod = _module(mod_name)
        if mod is None:
            continue
        names = getattr(mod, "__all__", dir(mod))
        for n in names:
            if n.endswith("_py") and n[:-3] in names:
                found.append(f"{mod_name}.{n[:-3]}")
    missing = sorted(set(found) - set(COVERED))
    assert found, "no intrinsic twins found in gemmlib.intrinsics"
    assert not missing, f"intrinsics without a twin test (add them to COVERED): {missing}"


# --------------------------------------------------------------------------- vector

vector = _module("vector")
ROWS, COLS = 8, 16  # the shared tile of the vector test
SH_ALIGN = 16 if not backend.SIMULATOR else None

if vector is not None:
    load4, store4, aligned16 = vector.load4, vector.store4, vector.aligned16

    @cuda.jit
    def _k_load4_global(src, idx, out):
        t = cuda.grid(1)
        if t < idx.shape[0]:
            a, b, c, d = load4(src, idx[t, 0], idx[t, 1])
            out[t, 0] = a
            out[t, 1] = b
            out[t, 2] = c
            out[t, 3] = d

    @cuda.jit
    def _k_store4_global(dst, idx, vals):
        t = cuda.grid(1)
        if t < idx.shape[0]:
            store4(dst, idx[t, 0], idx[t, 1], vals[t, 0], vals[t, 1], vals[t, 2], vals[t, 3])

    @cuda.jit
    def _k_shared_roundtrip(src, out):
        """store4 a (ROWS, COLS) tile into shared memory, load4 it back shifted by one row."""
        sh = cuda.shared.array((ROWS, COLS), float32, alignment=SH_ALIGN)
        t = cuda.threadIdx.x  # ROWS * COLS // 4 threads, one float4 each
        r, c = t // (COLS // 4), (t % (COLS // 4)) * 4
        store4(sh, r, c, src[r, c], src[r, c + 1], src[r, c + 2], src[r, c + 3])
        cuda.syncthreads()
        a, b, cc, d = load4(sh, (r + 1) % ROWS, c)
        out[r, c] = a
        out[r, c + 1] = b
        out[r, c + 2] = cc
        out[r, c + 3] = d

    store2, aligned8 = vector.store2, vector.aligned8

    @cuda.jit
    def _k_store2_global(dst, idx, vals):
        t = cuda.grid(1)
        if t < idx.shape[0]:
            store2(dst, idx[t, 0], idx[t, 1], vals[t, 0], vals[t, 1])

    def _aligned_kernel(aligned):
        @cuda.jit
        def k(a0, a1, a2, a3, out):
            out[0] = aligned(a0)
            out[1] = aligned(a1)
            out[2] = aligned(a2)
            out[3] = aligned(a3)

        return k

    _k_aligned16, _k_aligned8 = _aligned_kernel(aligned16), _aligned_kernel(aligned8)


def _offset_view(xp, shape, offset_bytes, fill):
    n = int(np.prod(shape))
    buf = xp.zeros(n + 8, dtype=np.float32)
    ptr = buf.ctypes.data if xp is np else buf.data.ptr
    start = ((offset_bytes - ptr % 16) % 16) // 4
    v = buf[start:start + n].reshape(shape)
    v[...] = xp.asarray(fill)
    return v


@pytest.mark.gpu
def test_vector_load4_store4_gpu():
    if vector is None:
        pytest.skip("gemmlib.intrinsics.vector does not exist")
    cp = backend.array_module()
    rng = np.random.default_rng(0)
    src_h = rng.uniform(-1, 1, (9, 20)).astype(np.float32)  # 80-byte rows: every 4th col aligned
    src = cp.asarray(src_h)
    assert getattr(getattr(src, "data", None), "ptr", 0) % 16 == 0  # CuPy allocations: 256-aligned
    # int64 indices: int32 ones overflow the twin's address arithmetic (NumPy 2 casting)
    idx_h = np.array([(i, j) for i in range(9) for j in range(0, 20, 4)], np.int64)
    out = cp.zeros((len(idx_h), 4), np.float32)
    _k_load4_global[1, len(idx_h)](src, cp.asarray(idx_h), out)
    want = np.array([vector.load4_py(src_h, i, j) for i, j in idx_h], np.float32)
    np.testing.assert_array_equal(cp.asnumpy(out), want)

    vals_h = rng.uniform(-1, 1, (len(idx_h), 4)).astype(np.float32)
    dst = cp.zeros((9, 20), np.float32)
    _k_store4_global[1, len(idx_h)](dst, cp.asarray(idx_h), cp.asarray(vals_h))
    dst_h = np.zeros((9, 20), np.float32)
    for (i, j), v in zip(idx_h, vals_h):
        vector.store4_py(dst_h, i, j, *v)
    np.testing.assert_array_equal(cp.asnumpy(dst), dst_h)

    tile_h = rng.uniform(-1, 1, (ROWS, COLS)).astype(np.float32)
    out2 = cp.zeros((ROWS, COLS), np.float32)
    _k_shared_roundtrip[1, ROWS * COLS // 4](cp.asarray(tile_h), out2)
    sh = np.zeros((ROWS, COLS), np.float32)
    want2 = np.zeros((ROWS, COLS), np.float32)
    for r in range(ROWS):
        for c in range(0, COLS, 4):
            vector.store4_py(sh, r, c, *tile_h[r, c:c + 4])
    for r in range(ROWS):
        for c in range(0, COLS, 4):
            want2[r, c:c + 4] = vector.load4_py(sh, (r + 1) % ROWS, c)
    np.testing.assert_array_equal(cp.asnumpy(out2), want2)


@pytest.mark.gpu
def test_vector_aligned16_gpu():
    if vector is None:
        pytest.skip("gemmlib.intrinsics.vector does not exist")
    _check_aligned(_k_aligned16, vector.aligned16_py, [True, False, False, False])


def _check_aligned(kernel, twin, want):
    """The intrinsic (in ``kernel``) and its twin on views 0, 4, 8 and 12 bytes past a
    16-byte boundary."""
    cp = backend.array_module()
    fill = np.ones((3, 5), np.float32)
    dev = [_offset_view(cp, (3, 5), off, fill) for off in (0, 4, 8, 12)]
    host = [_offset_view(np, (3, 5), off, fill) for off in (0, 4, 8, 12)]
    out = cp.zeros(4, np.bool_)
    kernel[1, 1](*dev, out)
    assert cp.asnumpy(out).tolist() == [bool(twin(h)) for h in host] == want


@pytest.mark.gpu
def test_vector_store2_aligned8_gpu():
    if vector is None:
        pytest.skip("gemmlib.intrinsics.vector does not exist")
    cp = backend.array_module()
    rng = np.random.default_rng(1)
    # 9 x 6 floats: 24-byte rows, so every even column of every row is 8-byte aligned
    idx_h = np.array([(i, j) for i in range(9) for j in range(0, 6, 2)], np.int64)
    vals_h = rng.uniform(-1, 1, (len(idx_h), 2)).astype(np.float32)
    dst = cp.full((9, 6), -7.0, np.float32)
    _k_store2_global[1, len(idx_h)](dst, cp.asarray(idx_h), cp.asarray(vals_h))
    dst_h = np.full((9, 6), -7.0, np.float32)
    for (i, j), v in zip(idx_h, vals_h):
        vector.store2_py(dst_h, i, j, *v)
    np.testing.assert_array_equal(cp.asnumpy(dst), dst_h)
    _check_aligned(_k_aligned8, vector.aligned8_py, [True, False, True, False])


# --------------------------------------------------------------------------- cp.async

async_copy = _module("async_copy")
NTH = 32  # threads in the async tests
NTH2, NTH4 = 2 * NTH, 4 * NTH  # shared-array sizes must be plain constants on the GPU


def _async_kernels(ops):
    c4, c16 = ops.cp_async4, ops.cp_async16
    commit, wait_all, wait_one = ops.cp_async_commit, ops.cp_async_wait_all, ops.cp_async_wait_one

    @cuda.jit
    def k_copy(src, rows, cols, nbytes, out4, out16):
        sh4 = cuda.shared.array(NTH, float32)
        sh16 = cuda.shared.array(NTH4, float32, alignment=SH_ALIGN)
        t = cuda.threadIdx.x
        sh4[t] = float32(-7.0)
        for e in range(4):
            sh16[4 * t + e] = float32(-7.0)
        cuda.syncthreads()
        c4(sh4, t, src, rows[t], cols[t], 4 if nbytes[t] >= 4 else 0)
        c16(sh16, 4 * t, src, rows[t], cols[t], nbytes[t])
        commit()
        wait_all()
        cuda.syncthreads()
        out4[t] = sh4[(t + 1) % NTH]  # read another thread's copy: needs the barrier
        for e in range(4):
            out16[t, e] = sh16[4 * ((t + 1) % NTH) + e]

    @cuda.jit
    def k_wait_one(src, out_first, out_all):
        sh = cuda.shared.array(NTH2, float32)
        t = cuda.threadIdx.x
        sh[t] = float32(-7.0)
        sh[NTH + t] = float32(-7.0)
        cuda.syncthreads()
        c4(sh, t, src, 0, t, 4)
        commit()
        c4(sh, NTH + t, src, 1, t, 4)
        commit()
        wait_one()  # the first group has landed; the second may not have
        out_first[t] = sh[t]
        wait_all()
        cuda.syncthreads()
        out_all[t] = sh[NTH + ((t + 1) % NTH)]

    return k_copy, k_wait_one


def _twin_copy(src, rows, cols, nbytes):
    m = async_copy
    sh4 = np.full(NTH, -7.0, np.float32)
    sh16 = np.full(4 * NTH, -7.0, np.float32)
    for t in range(NTH):  # one thread at a time: its copies, commit, wait
        m.cp_async4_py(sh4, t, src, rows[t], cols[t], 4 if nbytes[t] >= 4 else 0)
        m.cp_async16_py(sh16, 4 * t, src, rows[t], cols[t], int(nbytes[t]))
        m.cp_async_commit_py()
        m.cp_async_wait_all_py()
    out4 = np.array([sh4[(t + 1) % NTH] for t in range(NTH)], np.float32)
    out16 = np.array([sh16[4 * ((t + 1) % NTH):4 * ((t + 1) % NTH) + 4] for t in range(NTH)],
                     np.float32)
    return out4, out16


def _async_inputs():
    rng = np.random.default_rng(1)
    src = rng.uniform(-1, 1, (6, 24)).astype(np.float32)  # 96-byte rows: columns % 4 aligned
    rows = rng.integers(0, 6, NTH).astype(np.int32)
    cols = (rng.integers(0, 6, NTH) * 4).astype(np.int32)
    nbytes = np.array([(4 * t) % 20 for t in range(NTH)], np.int32)  # 0, 4, 8, 12, 16, ...
    return src, rows, cols, nbytes


def _async_ops_or_skip():
    if async_copy is None:
        pytest.skip("gemmlib.intrinsics.async_copy does not exist")
    cc = tuple(backend.device_info().compute_capability)
    out = [("sync", async_copy.ops("sync"))]
    if cc >= tuple(async_copy.MIN_CC):
        out.append(("async", async_copy.ops("async")))
    return out


@pytest.mark.gpu
def test_async_copy_gpu():
    cp = backend.array_module()
    src, rows, cols, nbytes = _async_inputs()
    want4, want16 = _twin_copy(src, rows, cols, nbytes)
    for label, ops in _async_ops_or_skip():
        k_copy, _ = _async_kernels(ops)
        out4 = cp.zeros(NTH, np.float32)
        out16 = cp.zeros((NTH, 4), np.float32)
        k_copy[1, NTH](cp.asarray(src), cp.asarray(rows), cp.asarray(cols), cp.asarray(nbytes),
                       out4, out16)
        np.testing.assert_array_equal(cp.asnumpy(out4), want4, err_msg=label)
        np.testing.assert_array_equal(cp.asnumpy(out16), want16, err_msg=label)


@pytest.mark.gpu
def test_async_wait_one_gpu():
    cp = backend.array_module()
    src = np.random.default_rng(2).uniform(-1, 1, (2, NTH)).astype(np.float32)
    m = async_copy
    for label, ops in _async_ops_or_skip():
        _, k_wait_one = _async_kernels(ops)
        first = cp.zeros(NTH, np.float32)
        every = cp.zeros(NTH, np.float32)
        k_wait_one[1, NTH](cp.asarray(src), first, every)
        # the twin, thread by thread
        sh = np.full(2 * NTH, -7.0, np.float32)
        want_first = np.zeros(NTH, np.float32)
        for t in range(NTH):
            m.cp_async4_py(sh, t, src, 0, t, 4)
            m.cp_async_commit_py()
            m.cp_async4_py(sh, NTH + t, src, 1, t, 4)
            m.cp_async_commit_py()
            m.cp_async_wait_one_py()
            want_first[t] = sh[t]
            assert sh[NTH + t] == -7.0  # the twin keeps the newest group in flight
            m.cp_async_wait_all_py()
        want_every = np.array([sh[NTH + (t + 1) % NTH] for t in range(NTH)], np.float32)
        np.testing.assert_array_equal(cp.asnumpy(first), want_first, err_msg=label)
        np.testing.assert_array_equal(cp.asnumpy(every), want_every, err_msg=label)
