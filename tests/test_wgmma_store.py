"""wgmma_store: wgmma_ws with the epilogue through shared memory (consumers stage a tile,
three storer warps copy it to C in 16-byte pieces).  The simulator runs small tiles over
several tiles per block, so the stage is refilled and its two mbarriers change phase many
times; the GPU runs the default tiles on odd and large shapes, float32 and 16-bit C."""

import numpy as np
import pytest

from _reliability import HOPPER, check_product, check_sampled_rows, on_blocks
from gemmlib import backend
from gemmlib.kernels import wgmma_store as S
from gemmlib.kernels import wgmma_ws

sim_only = pytest.mark.skipif(not backend.SIMULATOR, reason="the simulator's twins")


def test_default_build_and_its_shared_memory():
    s = S.SPEC
    assert s.name == "wgmma_store" and s.tile == (128, 256) and s.threads == 384
    assert S.stage_shape(128, 256, "fp32")[:4] == (2, 128, 128, 136)   # two halves, fp32
    assert S.stage_shape(128, 256, "fp16")[:4] == (1, 128, 256, 264)   # one piece, 16-bit
    assert s.shared_bytes + S.stage_bytes(128, 256, "fp32") <= S.SMEM_MAX
    assert S.build("bf16", OUT="bf16").name == "wgmma_store_bf16_o16"
    assert S.build(STAGES=2).name == "wgmma_store_128x256_s2"
    with pytest.raises(ValueError, match="KiB of shared memory"):
        S.build(STAGES=4)
    with pytest.raises(ValueError, match="BM must be 128"):
        S.build(BM=64)


def test_staged_pieces_cover_the_accumulators_once():
    """The two float32 pieces together are wgmma_ws's store, split at column 128."""
    full = S.out_store(256, 1, "fp16", "fp32", {})
    halves = [S.out_store(256, 1, "fp16", "fp32", {}, span=(p * 16, (p + 1) * 16))
              for p in range(2)]
    assert "range(32)" in full and "range(0, 16)" in halves[0]
    assert "range(16, 32)" in halves[1] and "c = c0 + 8 * (j - 16)" in halves[1]


#: (precision, OUT, BN, STAGES, (M, N, K), blocks): 128 x 64 tiles keep the simulator fast;
#: five tiles on two blocks (3 and 2: the stage refilled, its phases wrapping); N = 69 and
#: K = 72 odd (gemmlib.matmul pads B, C keeps 69 columns); M = 300: the last tile partial
SIM_CASES = [("fp16", "fp32", 64, 2, (300, 69, 72), 2),
             ("bf16", "fp32", 64, 3, (129, 130, 136), 1)]


@sim_only
@pytest.mark.parametrize("precision, out, BN, stages, shape, blocks", SIM_CASES)
def test_staged_epilogue_in_the_simulator(precision, out, BN, stages, shape, blocks):
    spec = S.build(precision, BN=BN, STAGES=stages, OUT=out)
    check_product(on_blocks(spec, blocks), precision, *shape, seed=sum(shape))


@sim_only
def test_staged_16_bit_c_is_the_rounded_float32_product():
    """A 16-bit C through the stage: bit for bit wgmma_ws's 16-bit epilogue."""
    import gemmlib
    from gemmlib import dispatch

    rng = np.random.default_rng(5)
    M, N, K = 200, 72, 64
    A = rng.uniform(-1, 1, (M, K)).astype(np.float16)
    B = rng.uniform(-1, 1, (K, N)).astype(np.float16)
    got = gemmlib.matmul(A, B, kernel=on_blocks(S.build("fp16", BN=64, STAGES=2,
                                                        OUT="fp16"), 2))
    ref = gemmlib.matmul(A, B, kernel=on_blocks(wgmma_ws.build("fp16", BM=128, BN=64,
                                                               STAGES=2, OUT="fp16"), 2))
    assert got.dtype == np.float16 and np.array_equal(got.view(np.uint16), ref.view(np.uint16))
    assert dispatch.rung_of(S.build("fp16", OUT="fp16")) == "wgmma_store"


# --------------------------------------------------------------------------- the GPU


def _gpu_specs(precision):
    return [S.build(precision), S.build(precision, OUT=precision)]


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_store_on_odd_shapes_gpu(precision):
    if not HOPPER:
        pytest.skip("wgmma needs an H100/H200")
    shapes = [(1, 1, 1), (37, 29, 53), (129, 127, 3), (257, 255, 65), (1000, 1000, 1000),
              (8191, 3, 517), (3, 8191, 5), (1025, 513, 4097), (4095, 3073, 2047)]
    for i, (M, N, K) in enumerate(shapes):
        check_product(S.build(precision), precision, M, N, K, seed=i)


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_store_on_large_shapes_gpu(precision):
    if not HOPPER:
        pytest.skip("wgmma needs an H100/H200")
    rng = np.random.default_rng(12)
    for M, N, K in ((4096, 4096, 4096), (4224, 4104, 4096), (8192, 8192, 1024)):
        check_sampled_rows(S.build(precision), precision, M, N, K, rng)
