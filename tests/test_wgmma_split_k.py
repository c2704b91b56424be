"""wgmma_split_k: (tile, slice of K) units, partial tiles added in the kernel in slice order."""

import dataclasses

import numpy as np
import pytest

import gemmlib
from gemmlib import backend, dispatch
from gemmlib.kernels import wgmma_split_k as W
from gemmlib.precision import tolerance

H100 = dataclasses.replace(backend.device_info(), name="H100", sm_count=132,
                           compute_capability=(9, 0), max_sm_clock_mhz=1980.0,
                           memory_clock_khz=2619000, memory_bus_bits=5120, simulated=False)


def test_k_ranges_cover_k_once():
    for K in (64, 65, 300, 4096):
        kt = -(-K // W.BK)
        for S in (1, 2, 3, 7, 64):
            s = W.effective_splits(S, K)
            per = -(-kt // s)
            got = [t for z in range(s) for t in range(z * per, min(kt, z * per + per))]
            assert got == list(range(kt)) and all(z * per < kt for z in range(s))


@pytest.mark.parametrize("shape, S", [((4096, 4096, 4096), 1), ((8192, 8192, 1024), 1),
                                      ((128, 4096, 4096), None), ((16, 4096, 14336), None),
                                      ((1024, 1024, 8192), None)])
def test_slices_fill_the_gpu_only_when_the_tiles_do_not(shape, S):
    M, N, K = shape
    got = W.splits_for(M, N, K, 128, 256, H100)
    if S is not None:
        assert got == S
    else:   # one row of tiles (or 32 tiles): enough slices to reach most of the 132 SMs
        tiles = -(-M // 128) * -(-N // 256)
        assert got > 1 and tiles * got >= 66 and -(-K // 64) // got >= W.MIN_KTILES


def test_workspace_shapes_and_grid():
    s = W.build(BM=64, BN=128, SPLITS=3)
    assert s.workspace_dtypes == ("float32", "int32") and s.launch_only == ("SPLITS", "GRID")
    assert s.array_dtypes == ("uint16", "uint16", "float32", "float32", "int32")
    (w, lw), (r, c, dt) = s.workspace(100, 200, 64 * 9)[0][:2], s.workspace(100, 200, 576)[1]
    tiles = 2 * 2
    assert (w, lw) == (3, tiles * 64 * 128) and (r, c, dt) == (tiles, 128, "int32")
    assert s.workspace(100, 200, 64)[0] == (1, 4, "float32")     # one k-tile: one slice
    assert s.grid(100, 200, 576) == (min(12, backend.device_info().sm_count), 1, 1)


def operands(precision, M, N, K, rng):
    """Fresh random A, B in ``precision``'s input type (device arrays on a GPU) and their
    float64 product."""
    dt = "bfloat16" if precision == "bf16" else "float16"
    A = backend.random_matrix((M, K), dt, rng)
    B = backend.random_matrix((K, N), dt, rng)
    a64, b64 = (np.asarray(backend.to_host(x.astype(np.float32)), np.float64) for x in (A, B))
    return A, B, a64 @ b64


def check_twice(spec, precision, M, N, K, rng):
    """A NaN-poisoned C, relative error within the precision's bound, and the same bits
    on a second run (the sums' order is fixed)."""
    A, B, ref = operands(precision, M, N, K, rng)
    xp = backend.array_module()
    outs = []
    for _ in range(2):
        C = xp.full((M, N), np.nan, np.float32)
        gemmlib.matmul(A, B, kernel=spec, precision=precision, out=C)
        outs.append(np.asarray(backend.to_host(C)))
    err = np.abs(outs[0] - ref).max() / max(np.abs(ref).max(), 1e-30)
    assert np.isfinite(outs[0]).all() and err <= tolerance(precision, K), (M, N, K, err)
    assert np.array_equal(outs[0], outs[1]), (M, N, K, "not deterministic")


@pytest.mark.skipif(not backend.SIMULATOR, reason="the simulator's twins (GPU: below)")
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_slices_add_up_in_the_simulator(precision):
    """Odd M, N, K over 3 slices of 2, 2, 1 k-tiles, two tile rows and columns."""
    spec = W.build(precision, BM=64, BN=64, STAGES=2, SPLITS=3)
    assert dispatch.plan(spec, 67, 72, 304).workspace[0][0] == 3   # K padded to 8s
    check_twice(spec, precision, 67, 72, 300, np.random.default_rng(7))


@pytest.mark.skipif(not backend.SIMULATOR, reason="the simulator's twins (GPU: below)")
@pytest.mark.parametrize("precision, grid", [("fp16", 3), ("bf16", 5)])
def test_stream_k_builds_add_up_in_the_simulator(precision, grid):
    """STREAM: 2 x 2 tiles of 5 k-tiles shared by 3 or 5 blocks at uneven cuts (tiles split
    between blocks, pieces summed by tickets in block order); odd M, N, K."""
    spec = W.build(precision, BM=64, BN=64, STAGES=2, STREAM=True, GRID=grid)
    assert spec.grid(67, 72, 300) == (grid, 1, 1) and spec.name.endswith(f"_stream{grid}")
    assert dispatch.plan(spec, 67, 72, 304).workspace[0][0] == W.stream_k_pieces(4, 5, grid)
    check_twice(spec, precision, 67, 72, 300, np.random.default_rng(11))


@pytest.mark.skipif(not backend.SIMULATOR, reason="the simulator's twins")
def test_rows_past_m_take_no_ticket():
    """M = 5 in a 64-row tile: only the 20 threads of warp 0 whose first row (lane // 4)
    is below 5 write partials, and every counter is back at zero after the sum (the next
    launch starts clean)."""
    spec = W.build(BM=64, BN=64, STAGES=2, SPLITS=2)
    rng = np.random.default_rng(3)
    A = rng.uniform(-1, 1, (5, 256)).astype(np.float16)
    B = rng.uniform(-1, 1, (256, 8)).astype(np.float16)
    p = dispatch.plan(spec, 5, 8, 256)
    (ws, wd), (ls, ld) = [((r, c), dt) for r, c, dt in p.workspace]
    Wk, L = np.full(ws, np.nan, np.float32), np.zeros(ls, np.int32)
    C = np.full((5, 8), np.nan, np.float32)
    from gemmlib import tma

    maps = tma.simulated_maps((A.view(np.uint16), B.view(np.uint16)), spec.tma_boxes, 128)
    spec.kernel[p.grid, p.block, 0, p.shared_bytes](A.view(np.uint16), B.view(np.uint16), C,
                                                    Wk, L, np.uint64(maps))
    ref = A.astype(np.float64) @ B.astype(np.float64)
    assert np.abs(C - ref).max() <= tolerance("fp16", 256) * np.abs(ref).max()
    assert not L.any()
    written = ~np.isnan(Wk[0].reshape(-1, 128, 4))   # [quad, consumer thread, 4]
    assert written[:, :20].all() and not written[:, 20:].any()


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_split_k_on_hopper_gpu(precision):
    if tuple(backend.device_info().compute_capability) != (9, 0):
        pytest.skip("wgmma needs an H100/H200")
    rng = np.random.default_rng()
    shapes = [(1, 1, 1), (16, 4096, 4096), (128, 4096, 4096), (37, 1000, 3001),
              (1024, 1024, 8192), (9, 4104, 14336), (200, 264, 640), (3, 8, 5000)]
    for BM, S in ((128, 0), (64, 0), (128, 5), (64, 32), (128, "stream")):
        spec = (W.build(precision, BM=BM, STREAM=True) if S == "stream"
                else W.build(precision, BM=BM, SPLITS=S))
        for M, N, K in shapes:
            check_twice(spec, precision, M, N, K, rng)


def test_store2_twin_checks_its_contract():
    from gemmlib.intrinsics import vector as V

    C = np.zeros((2, 6), np.float32)
    V.store2_py(C, 1, 2, 1.5, 2.5)
    assert C[1, 2:4].tolist() == [1.5, 2.5]
    with pytest.raises(V.MisalignedAccess):
        V.store2_py(C, 0, 1, 1.0, 1.0)          # an odd column: 4 bytes off
    with pytest.raises(V.MisalignedAccess):
        V.store2_py(np.zeros((2, 5), np.float32)[:, :4], 0, 4, 1.0, 1.0)


@pytest.mark.skipif(not backend.SIMULATOR, reason="NumPy output buffers")
def test_epilogue_falls_back_to_element_stores_on_a_misaligned_out():
    """The wgmma epilogue's 8-byte stores need an 8-byte-aligned C; an ``out`` that starts
    4 bytes off takes the element-wise stores and is still right."""
    spec = dispatch.build("wgmma_ws", {"precision": "fp16", "BM": 64, "BN": 64, "STAGES": 2})
    rng = np.random.default_rng(5)
    A, B, ref = operands("fp16", 9, 16, 24, rng)
    raw = np.full(9 * 16 + 2, np.nan, np.float32)
    off = 1 if raw.ctypes.data % 8 == 0 else 0
    C = raw[off:off + 9 * 16].reshape(9, 16)
    assert C.ctypes.data % 8 == 4
    gemmlib.matmul(A, B, kernel=spec, precision="fp16", out=C)
    assert np.abs(C - ref).max() <= tolerance("fp16", 24) * np.abs(ref).max()


@pytest.mark.parametrize("groups", [1, 3, 16])
def test_sum_source_adds_in_slice_order_for_any_chunking(groups):
    """The generated sum, run as Python on float32 scalars, gives the bits of adding the
    slices one by one in order (0, 1, ..., S-1) for every element, whatever the chunk size:
    the loads of a chunk are issued together but each element's additions keep their order.
    Five groups with chunks of 3 also cover a short last chunk."""
    from gemmlib.intrinsics.vector import load4_py

    quads, nc, base, S = 5, 3, 2, 6
    rng = np.random.default_rng(groups)
    Wk = (rng.standard_normal((S, 4 * (base + quads * nc + 1))) * 1e3).astype(np.float32)
    ns = {"load4": load4_py}
    exec(W.sum_source(quads, nc, groups), ns)   # noqa: S102
    acc = np.full(4 * quads, np.nan, dtype=np.float32)
    ns["sum_slices"](Wk, acc, base, S)
    for q in range(quads):
        for i in range(4):
            want = Wk[0, 4 * (base + q * nc) + i]
            for s in range(1, S):
                want = np.float32(want + Wk[s, 4 * (base + q * nc) + i])
            assert acc[4 * q + i].tobytes() == np.float32(want).tobytes(), (q, i)


@pytest.mark.skipif(not backend.SIMULATOR, reason="the simulator's twins")
@pytest.mark.parametrize("rung, params, shape", [
    ("wgmma_ws", dict(BM=64, BN=80, STAGES=2), (70, 150, 72)),
    ("wgmma_ws", dict(BM=128, BN=112, STAGES=2, OUT="fp16"), (130, 120, 64)),
    ("wgmma_split_k", dict(BM=64, BN=96, STAGES=2, SPLITS=2), (33, 200, 136)),
    ("wgmma_split_k", dict(BM=128, BN=40, STAGES=3, OUT="fp16", BIAS=True), (129, 88, 72)),
])
def test_k_major_tiles_of_any_multiple_of_8_outputs(rung, params, shape):
    """A K-major B (``W.t()``) is one box of BN rows a stage, so the tile may be 40, 80, 96
    or 112 outputs wide (wgmma's n): odd shapes, a 16-bit C, a bias, K slices, a poisoned C,
    against float64."""
    from gemmlib.runtime import select
    from gemmlib.verify import spec_tolerance

    M, N, K = shape
    spec = select.build(rung, dict(params, precision="fp16", B_LAYOUT="NK"))
    rng = np.random.default_rng(M * N)
    a = rng.uniform(-1, 1, (M, K)).astype(np.float16)
    w = rng.uniform(-1, 1, (N, K)).astype(np.float16)
    z = rng.uniform(-1, 1, N).astype(np.float16)
    kw = dict(bias=z) if params.get("BIAS") else {}
    ref = a.astype(np.float64) @ w.astype(np.float64).T + (z.astype(np.float64) if kw else 0)
    C = np.full((M, N), np.nan, np.float16 if params.get("OUT") else np.float32)
    gemmlib.matmul(a, w.T, kernel=spec, out=C, **kw)
    err = np.abs(C.astype(np.float64) - ref).max() / np.abs(ref).max()
    assert np.isfinite(C).all() and err <= spec_tolerance(spec, K), (spec.name, err)
    with pytest.raises(ValueError, match="multiple of 64"):   # a (K, N) B: 64-column panels
        select.build(rung, dict(params, precision="fp16"))

