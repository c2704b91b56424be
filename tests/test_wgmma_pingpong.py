"""wgmma_pingpong: two consumer warpgroups on alternating tiles, taking turns at the tensor
cores (issue 19 item 1(a)).  The simulator runs small tiles over several tiles per consumer,
so the ring wraps across tiles and each consumer's phases of a stage are irregular; the
GPU runs the default tiles on odd and large shapes."""

import numpy as np
import pytest

from _reliability import HOPPER, check_product, check_sampled_rows, on_blocks
from gemmlib import backend, dispatch
from gemmlib.kernels import wgmma_pingpong as P


# --------------------------------------------------------------------------- the build


def test_default_tiles_ring_and_names():
    s = P.SPEC
    assert s.name == "wgmma_pingpong" and s.tile == (128, 128) and s.threads == 384
    assert s.params["ORDERED"] and s.params["REGS"] == (40, 232)
    assert s.params["STAGES"] == 7 and s.shared_bytes == 7 * 32 * 1024 + 1024 <= P.SMEM_MAX
    assert P.deepest_ring(64, 256) == 5 and P.deepest_ring(64, 64) == 8
    assert P.build(BM=64, BN=256).name == "wgmma_pingpong_64x256_s5"
    assert P.build("bf16").name == "wgmma_pingpong_bf16"
    assert P.build(ORDERED=False).name == "wgmma_pingpong_unordered"
    assert dispatch.get_spec("wgmma_pingpong", "bf16").precision == "bf16"
    assert s.tma_boxes == ((128, 64), (64, 64)) and s.scalar_args == ("uint64",)


@pytest.mark.parametrize("params, match", [(dict(BN=256), "accumulators"),
                                           (dict(BM=192, BN=64), "accumulators"),
                                           (dict(STAGES=8), "KiB of shared"),
                                           (dict(REGS=(40, 256)), "65536 registers")])
def test_builds_that_do_not_fit_are_refused(params, match):
    with pytest.raises(ValueError, match=match):
        P.build(**params)


# --------------------------------------------------------------------------- the simulator


#: (precision, ORDERED, BM, BN, STAGES, (M, N, K), blocks): 64 x 64 tiles keep the simulator
#: fast.  2 x 2 tiles: two per consumer; K = 72: two k-tiles, the second short; N = 69: odd
#: (gemmlib.matmul pads B to 72 columns, C keeps 69); a ring of 3 over 2 k-tiles a tile starts
#: each tile on another stage.  Five tiles on two blocks: 3 and 2, so consumer 1 of block 1
#: has one tile and consumer 0 two.  BM = 128: both 64-row slices of A in one consumer.
SIM_CASES = [("fp16", True, 64, 64, 3, (100, 69, 72), 1),
             ("bf16", False, 64, 64, 3, (100, 69, 72), 1),
             ("bf16", True, 64, 64, 2, (300, 40, 136), 2),
             ("fp16", False, 64, 64, 2, (300, 40, 136), 2),
             ("fp16", True, 128, 64, 2, (129, 64, 64), 1)]


@pytest.mark.skipif(not backend.SIMULATOR, reason="the simulator's twins (GPU: below)")
@pytest.mark.parametrize("precision, ordered, BM, BN, stages, shape, blocks", SIM_CASES)
def test_pingpong_in_the_simulator(precision, ordered, BM, BN, stages, shape, blocks):
    spec = P.build(precision, BM=BM, BN=BN, STAGES=stages, ORDERED=ordered)
    check_product(on_blocks(spec, blocks), precision, *shape, seed=sum(shape))


# --------------------------------------------------------------------------- the GPU


def _gpu_specs(precision):
    return [P.build(precision), P.build(precision, ORDERED=False),
            P.build(precision, BM=64, BN=256), P.build(precision, STAGES=4)]


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_pingpong_on_odd_shapes_gpu(precision):
    if not HOPPER:
        pytest.skip("wgmma needs an H100/H200")
    shapes = [(1, 1, 1), (37, 29, 53), (129, 127, 3), (257, 255, 65), (1000, 1000, 1000),
              (8191, 3, 517), (3, 8191, 5), (1025, 513, 4097), (4095, 3073, 2047)]
    for spec in _gpu_specs(precision):
        for i, (M, N, K) in enumerate(shapes):
            check_product(spec, precision, M, N, K, seed=i)


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_pingpong_on_large_shapes_gpu(precision):
    """4096-ish products (hundreds of tiles per block walk) against float64 on a sample of
    rows: every block's consumers take many turns."""
    if not HOPPER:
        pytest.skip("wgmma needs an H100/H200")
    rng = np.random.default_rng(11)
    for spec in _gpu_specs(precision):
        for M, N, K in ((4096, 4096, 4096), (4224, 4104, 4096), (8192, 8192, 1024)):
            check_sampled_rows(spec, precision, M, N, K, rng)
