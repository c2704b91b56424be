"""Problems past 32-bit indexing, and problems that do not fit (GPU only).

Each matrix below holds more than 2**31 elements, so an element offset
computed in 32 bits would wrap.  The products are cheap (one small
dimension), and the check is exact or sampled:

* tall A: (2**21 + 64) x 1024, times a 1024 x 8 B -- rows sampled around
  row 2**21 (offset 2**31) and at both ends, against float64 on those rows;
* wide B: 1024 x (2**21 + 64) (or (N, K) for K-major rungs), 8 x 1024 A --
  columns sampled likewise;
* big C: 65536 x 32769 from K = 1, where every element is one float32
  product and so must equal ``A[i, 0] * B[0, j]`` bit for bit, checked
  everywhere.

A rung may instead refuse a problem with ``ConstraintError`` (gridDim.y is
at most 65535 blocks, so a rung with rows or columns on the y axis cannot
launch some of them): refusing clearly is allowed, a wrong answer is not.
Every output is NaN-poisoned first, so an element left unwritten fails.

Finally, a product whose output cannot fit in GPU memory raises
``MemoryError`` with the size in its message, and the GPU stays usable.
Set ``GEMMLIB_SKIP_BIG=1`` to skip the 8.6 GB tests.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from gemmlib import backend
from gemmlib.spec import ConstraintError
from gemmlib.verify import spec_tolerance

from _reliability import as_read, input_dtype, kernel_names, nk, report, run, spec_or_skip

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(os.environ.get("GEMMLIB_SKIP_BIG") == "1",
                                 reason="GEMMLIB_SKIP_BIG=1")]

BIG = 2**21 + 64   # BIG * 1024 = 2**31 + 65536 elements
KBIG = 1024
SMALL = 8
RESULTS: dict[str, dict] = {}


def _cp():
    return backend.array_module()


def _free():
    cp = _cp()
    cp.cuda.Device().synchronize()
    cp.get_default_memory_pool().free_all_blocks()


def _random(shape, seed):
    cp = _cp()
    X = cp.random.default_rng(seed).random(shape, dtype=np.float32)
    X -= np.float32(0.5)
    return X


def _need_bytes(n):
    free, _ = _cp().cuda.runtime.memGetInfo()
    if free < n:
        pytest.skip(f"needs {n / 2**30:.1f} GiB free on the GPU, has {free / 2**30:.1f}")


def _sample(n, seed):
    """Indices at both ends, around the 2**31-element boundary, and random."""
    edge = 2**31 // KBIG
    idx = set(range(0, 32)) | set(range(n - 32, n)) | set(range(edge - 4, edge + 4))
    idx |= set(np.random.default_rng(seed).integers(0, n, 256).tolist())
    return np.array(sorted(i for i in idx if 0 <= i < n))


def _record(test, name, outcome):
    RESULTS.setdefault(test, {})[name] = outcome
    report("big-problems", RESULTS)


@pytest.fixture(scope="module")
def tall():
    _free()
    _need_bytes(BIG * KBIG * 4 + (2 << 30))
    A = _random((BIG, KBIG), 1)
    yield A
    del A
    _free()


@pytest.mark.parametrize("name", kernel_names())
def test_tall_A_past_2_31_elements(name, tall):
    spec = spec_or_skip(name)
    cp = _cp()
    A = tall if input_dtype(spec) == np.float32 else tall.astype(input_dtype(spec))
    B = _random((SMALL, KBIG) if nk(spec) else (KBIG, SMALL), 2).astype(input_dtype(spec))
    C = backend.poisoned((BIG, SMALL))
    try:
        run(spec, A, B, out=C)
    except ConstraintError as e:
        _record("tall_A", name, f"refused: {e}")
        assert "grid size" in str(e)
        return
    cp.cuda.Device().synchronize()
    assert not bool(cp.isnan(C).any()), f"{name}: elements of C left unwritten"
    rows = cp.asarray(_sample(BIG, 3))
    B64 = B.astype(np.float64)
    ref = A[rows].astype(np.float64) @ (B64.T if nk(spec) else B64)
    err = float(cp.linalg.norm(C[rows].astype(np.float64) - ref) / cp.linalg.norm(ref))
    _record("tall_A", name, f"rel. error {err:.2e} on {len(rows)} sampled rows")
    assert err <= spec_tolerance(spec, KBIG), f"{name}: rel. error {err:.2e}"
    del A, C
    _free()


@pytest.fixture(scope="module")
def wide():
    _free()
    _need_bytes(BIG * KBIG * 4 + (2 << 30))
    B = _random((KBIG, BIG), 4)  # the (K, N) operand; K-major rungs get its transpose
    yield B
    del B
    _free()


@pytest.mark.parametrize("name", kernel_names())
def test_wide_B_past_2_31_elements(name, wide):
    spec = spec_or_skip(name)
    cp = _cp()
    Bkn = wide if input_dtype(spec) == np.float32 else wide.astype(input_dtype(spec))
    if nk(spec):
        B = cp.ascontiguousarray(Bkn.T)  # (N, K): a second 8.6 GB copy, freed below
    else:
        B = Bkn
    A = _random((SMALL, KBIG), 5).astype(input_dtype(spec))
    C = backend.poisoned((SMALL, BIG))
    try:
        run(spec, A, B, out=C)
    except ConstraintError as e:
        _record("wide_B", name, f"refused: {e}")
        assert "grid size" in str(e)
        return
    finally:
        if B is not wide:
            del B
    cp.cuda.Device().synchronize()
    assert not bool(cp.isnan(C).any()), f"{name}: elements of C left unwritten"
    cols = cp.asarray(_sample(BIG, 6))
    ref = A.astype(np.float64) @ Bkn[:, cols].astype(np.float64)
    err = float(cp.linalg.norm(C[:, cols].astype(np.float64) - ref) / cp.linalg.norm(ref))
    _record("wide_B", name, f"rel. error {err:.2e} on {len(cols)} sampled columns")
    assert err <= spec_tolerance(spec, KBIG), f"{name}: rel. error {err:.2e}"
    del Bkn, C
    _free()


@pytest.mark.parametrize("name", kernel_names())
def test_big_C_past_2_31_elements(name):
    spec = spec_or_skip(name)
    cp = _cp()
    M, N = 65536, 32769  # M * N = 2**31 + 65536
    _free()
    _need_bytes(M * N * 4 + (1 << 30))
    A = _random((M, 1), 7).astype(input_dtype(spec))
    B = _random((N, 1) if nk(spec) else (1, N), 8).astype(input_dtype(spec))
    C = backend.poisoned((M, N))
    try:
        run(spec, A, B, out=C)
    except ConstraintError as e:
        _record("big_C", name, f"refused: {e}")
        assert "grid size" in str(e)
        return
    cp.cuda.Device().synchronize()
    row = as_read(spec, B.reshape(1, N).astype(np.float32))
    A = as_read(spec, A.astype(np.float32))  # 16-bit inputs: their product is exact in float32 too
    wrong = 0
    for r0 in range(0, M, 4096):  # exact: one float32 product per element
        wrong += int((C[r0:r0 + 4096] != A[r0:r0 + 4096] * row).sum())
    _record("big_C", name, f"{wrong} elements differ from A[i,0]*B[0,j]")
    assert wrong == 0, f"{name}: {wrong} elements of the {M}x{N} C are wrong"
    del C
    _free()


def test_output_that_cannot_fit_is_a_memory_error():
    cp = _cp()
    name = "naive" if "naive" in kernel_names() else kernel_names()[0]
    spec = spec_or_skip(name)
    n = 2**20  # C would be 2**40 floats = 4 TiB
    A = cp.ones((n, 1), np.float32)
    B = cp.ones((n, 1) if nk(spec) else (1, n), np.float32)
    with pytest.raises(MemoryError, match=r"out of GPU memory allocating C \(1048576 x 1048576"):
        run(spec, A, B)
    dA = backend.cuda.to_device(np.ones((n, 1), np.float32))
    dB = backend.cuda.to_device(np.ones((n, 1) if nk(spec) else (1, n), np.float32))
    with pytest.raises(MemoryError, match=r"out of GPU memory allocating C"):
        run(spec, dA, dB)  # numba in: the output would be a numba array
    with pytest.raises(MemoryError):  # host in: staged through the GPU
        run(spec, np.ones((n, 1), np.float32), np.ones((n, 1) if nk(spec) else (1, n), np.float32))
    _free()  # the GPU is still usable
    C = run(spec, cp.ones((3, 4), np.float32), cp.ones((5, 4) if nk(spec) else (4, 5), np.float32))
    assert float(C.sum()) == 60.0
