"""The register-tiling rungs (1D/2D block tiling, vectorised, bank-conflict-free, warp
tiling) are right for any M, N, K: small-tile configurations on many odd shapes in the
simulator (cheap: few threads), plus every path a rung can take -- float4 or scalar
copies of A, B and C -- and the structural constraints checked before launch."""

import numpy as np
import pytest

import gemmlib
from gemmlib import backend
from gemmlib.kernels import bank_free, blocktile_1d, blocktile_2d, get, vectorized, warptile
from gemmlib.spec import ConstraintError

# K and N multiples of 4 (float4 paths) and not (scalar paths); below, at and past a tile;
# K shorter than one k-tile; a single row / column.
ODD = [(1, 1, 1), (37, 29, 53), (17, 33, 9), (20, 24, 12), (5, 7, 40), (33, 16, 8),
       (1, 45, 7), (46, 1, 5), (70, 36, 3)]

SMALL = {
    "blocktile_1d": [blocktile_1d.build(BM=16, BN=16, BK=4, TM=4),
                     blocktile_1d.build(BM=8, BN=32, BK=8, TM=4)],
    "blocktile_2d": [blocktile_2d.build(BM=16, BN=16, BK=4, TM=4, TN=4),
                     blocktile_2d.build(BM=16, BN=32, BK=8, TM=4, TN=8, CONTIGUOUS=True)],
    "vectorized": [vectorized.build(BM=16, BN=16, BK=4, TM=4, TN=4),
                   vectorized.build(BM=16, BN=32, BK=8, TM=8, TN=4)],
    "bank_free": [bank_free.build(BM=16, BN=32, BK=8, TM=8, TN=8),
                  bank_free.build(BM=16, BN=16, BK=4, TM=4, TN=4, PAD=8)],
    "warptile": [warptile.build(BM=16, BN=32, BK=8, WM=16, WN=32, WNITER=1, TM=4, TN=4),
                 # WMITER = 2: each thread owns two row pieces, WSUBM rows apart
                 warptile.build(BM=32, BN=32, BK=8, WM=32, WN=32, WNITER=1, TM=4, TN=4),
                 warptile.build(BM=64, BN=32, BK=4, WM=64, WN=32, WNITER=2, TM=8, TN=4)],
}
SMALL_SPECS = [s for specs in SMALL.values() for s in specs]


@pytest.mark.parametrize("spec", SMALL_SPECS, ids=lambda s: s.name)
def test_small_configuration_correct_on_odd_shapes(spec):
    assert spec.threads <= 64  # keeps the simulator fast
    report = gemmlib.verify(spec, ODD, seed=7)
    assert report.ok, str(report)


@pytest.mark.parametrize("name", list(SMALL))
def test_default_configuration_on_an_off_tile_shape(name):
    spec = get(name)
    tm, tn = spec.tile
    report = gemmlib.verify(spec, [(tm + 3, 2 * tn - 1 if tn < 100 else tn + 5, 13)], seed=3)
    assert report.ok, str(report)


@pytest.mark.parametrize("name", list(SMALL))
def test_registered_in_ladder_and_describes_itself(name):
    spec = get(name)
    assert name in gemmlib.list_kernels()
    assert spec.name == name and spec.chapter and spec.idea
    assert spec.shared_bytes > 0 and spec.index
    assert not spec.failed_constraints(4096, 4096, 4096, backend.device_info())


@pytest.mark.parametrize("name", ["vectorized", "bank_free", "warptile"])
def test_vector_rungs_claim_16_byte_accesses_in_their_ptx(name):
    must = " ".join(get(name).ptx_must)
    for instr in ("ld.global.v4", "ld.shared.v4", "st.shared.v4", "st.global.v4"):
        assert instr.replace(".", r"\.") in must


# ---------------------------------------------------------------- float4 vs scalar paths


def _count_global_float4(monkeypatch, module):
    """Wrap load4/store4 (simulator twins) where the kernel calls them -- its module, and
    gemmlib.intrinsics.vector for the tile copies (load4_or_zero) -- and count the calls
    that touch global matrices (simulator kernel arguments; shared arrays are NumPy)."""
    from gemmlib.intrinsics import vector

    calls = {"load4": 0, "store4": 0}
    for target, fname in ((module, "load4"), (vector, "load4"), (module, "store4")):
        real = getattr(target, fname)

        def wrapped(arr, *args, _real=real, _name=fname):
            if not isinstance(arr, np.ndarray):
                calls[_name] += 1
            return _real(arr, *args)

        monkeypatch.setattr(target, fname, wrapped)
    return calls


@pytest.mark.parametrize("module,spec", [
    (vectorized, vectorized.build(BM=16, BN=16, BK=4, TM=4, TN=4)),
    (warptile, warptile.build(BM=16, BN=32, BK=8, WM=16, WN=32, WNITER=1, TM=4, TN=4)),
], ids=["vectorized", "warptile"])
@pytest.mark.parametrize("shape,loads,stores", [
    ((20, 24, 12), True, True),    # K, N multiples of 4: A, B, C all in float4s
    ((20, 23, 12), True, False),   # N % 4 != 0: only A (rows of K floats) in float4s
    ((20, 23, 13), False, False),  # neither: every global access is scalar
])
def test_float4_used_exactly_when_rows_are_aligned(monkeypatch, module, spec, shape, loads,
                                                   stores):
    calls = _count_global_float4(monkeypatch, module)
    assert gemmlib.verify(spec, [shape], seed=1).ok
    assert (calls["load4"] > 0) == loads
    assert (calls["store4"] > 0) == stores


def test_misaligned_base_pointer_takes_the_scalar_path(monkeypatch):
    """A contiguous matrix 4 bytes past a 16-byte boundary must not be read with float4."""
    from gemmlib.intrinsics import vector

    spec = warptile.build(BM=16, BN=32, BK=8, WM=16, WN=32, WNITER=1, TM=4, TN=4)
    M, N, K = 19, 24, 16
    rng = np.random.default_rng(0)
    buf = rng.uniform(-1, 1, M * K + 1).astype(np.float32)
    A = buf[1:].reshape(M, K)  # C-contiguous, misaligned
    assert A.ctypes.data % 16 != 0
    B = rng.uniform(-1, 1, (K, N)).astype(np.float32)
    # the simulator copies arguments to fresh (aligned) arrays, so make the kernel see
    # what a GPU would: report A as misaligned, and let the twin check every access
    seen = []

    def aligned16(arr):
        a = vector._ndarray(arr)
        ok = a is not None and a.shape == (M, K)
        seen.append(ok)
        return not ok

    monkeypatch.setattr(warptile, "aligned16", aligned16)
    C = gemmlib.matmul(A, B, kernel=spec)
    np.testing.assert_allclose(C, A.astype(np.float64) @ B, rtol=1e-4, atol=1e-5)
    assert any(seen)


# ---------------------------------------------------------------- constraints


def test_bad_tiling_is_refused_before_launch_with_the_reason():
    spec = warptile.build(BM=16, BN=32, BK=8, WM=16, WN=16, WNITER=1, TM=4, TN=4)
    why = spec.failed_constraints(64, 64, 64, backend.device_info())
    assert any(w.startswith("warp tiling") for w in why)
    with pytest.raises(ConstraintError, match="warp tiling"):
        gemmlib.matmul(np.ones((4, 4), np.float32), np.ones((4, 4), np.float32), kernel=spec)


def test_shared_memory_over_the_static_limit_is_refused():
    spec = warptile.build(BM=128, BN=128, BK=32, WM=64, WN=32, WNITER=2, TM=4, TN=4)
    why = spec.failed_constraints(4096, 4096, 4096, backend.device_info())
    assert any(w.startswith("shared memory per block") for w in why)


def test_register_cap_below_the_estimate_is_refused():
    spec = warptile.build(BM=128, BN=128, BK=16, WM=64, WN=64, WNITER=4, TM=8, TN=4,
                          max_registers=128)
    why = spec.failed_constraints(4096, 4096, 4096, backend.device_info())
    assert any(w.startswith("registers per thread") for w in why)


@pytest.mark.parametrize("bad", [dict(TM=6), dict(BK=6)])
def test_vectorized_needs_multiples_of_four(bad):
    spec = vectorized.build(**{**dict(BM=16, BN=16, BK=4, TM=4, TN=4), **bad})
    why = spec.failed_constraints(64, 64, 64, backend.device_info())
    assert any(w.startswith("tile divisibility") for w in why)


# ---------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(SMALL))
def test_gpu_odd_and_large_shapes(name):
    shapes = [(1, 1, 1), (37, 29, 53), (129, 127, 3), (1000, 1001, 999), (4095, 3073, 2047)]
    assert gemmlib.verify(name, shapes, seed=5).ok


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(SMALL))
def test_gpu_no_spills(name):
    from gemmlib.autotune import compiled_resources

    spec = get(name)
    A = backend.random_matrix((64, 64))
    gemmlib.matmul(A, A, kernel=spec)
    res = compiled_resources(spec)
    assert res["local_bytes"] <= spec.max_spill_bytes, res
    assert res["registers"] <= min(255, spec.params.get("max_registers") or 255)
