"""wgmma_cluster: clusters of blocks along M share B through TMA multicast (issue 19 item
1(c)).  The simulator runs one block at a time, so it checks the kernel built for clusters of
one block (the same multicast, barriers and per-warpgroup arrivals, every peer being the block
itself) over several tiles per block; the GPU runs clusters of two on odd and large shapes,
including an odd number of tile rows (the last cluster's second block computes rows past M)."""

import numpy as np
import pytest

from _reliability import HOPPER, check_product, check_sampled_rows, on_blocks
from gemmlib import backend, dispatch
from gemmlib.kernels import wgmma_cluster as CL


def test_default_build_and_names():
    s = CL.SPEC
    assert s.cluster == CL.DEFAULT_CM == (1 if backend.SIMULATOR else 2)
    assert s.name == "wgmma_cluster" and s.tile == (128, 256) and s.threads == 384
    assert s.params["STAGES"] == 4 and s.tma_boxes == ((128, 64), (64, 64))
    other = 1 if CL.DEFAULT_CM == 2 else 2
    assert CL.build(CM=other).name == f"wgmma_cluster_128x256_s4_c{other}"
    assert CL.build("bf16").name == "wgmma_cluster_bf16"
    assert dispatch.get_spec("wgmma_cluster", "bf16").precision == "bf16"
    g = CL.cluster_grid(128, 256, 2)(1000, 1000, 64)   # 4 super-tiles of 256 x 256
    assert g[0] % 2 == 0 and g[0] <= 8


@pytest.mark.parametrize("params, match", [(dict(CM=3), "CM"), (dict(BN=64, CM=2), "CM"),
                                           (dict(CM=2, MULTICAST=False), "CM=1")])
def test_builds_that_cannot_work_are_refused(params, match):
    with pytest.raises(ValueError, match=match):
        CL.build(**params)


#: (precision, BM, BN, STAGES, (M, N, K), blocks): 64 x 128 tiles keep the simulator fast;
#: three tile rows on two blocks (the walk interleaves), K = 200: four k-tiles, the last short,
#: through a ring of 2; N = 260 is two tiles, the second 4 wide.
SIM_CASES = [("fp16", 64, 128, 2, (150, 260, 200), 2),
             ("bf16", 64, 128, 3, (70, 136, 72), 1)]


@pytest.mark.skipif(not backend.SIMULATOR, reason="the simulator's twins (GPU: below)")
@pytest.mark.parametrize("precision, BM, BN, stages, shape, blocks", SIM_CASES)
def test_cluster_of_one_in_the_simulator(precision, BM, BN, stages, shape, blocks):
    spec = CL.build(precision, BM=BM, BN=BN, STAGES=stages, CM=1)
    check_product(on_blocks(spec, blocks), precision, *shape, seed=sum(shape))


@pytest.mark.skipif(not backend.SIMULATOR, reason="the simulator's refusal")
def test_a_cluster_of_two_traps_in_the_simulator():
    """Built for two blocks, launched where each block is its own cluster (the simulator, or
    a launch without the cluster attribute): the kernel stops instead of waiting forever."""
    with pytest.raises(Exception, match="trap"):
        check_product(CL.build(BM=64, BN=128, STAGES=2, CM=2), "fp16", 64, 128, 64, seed=0)


def _gpu_specs(precision):
    return [CL.build(precision), CL.build(precision, STAGES=3), CL.build(precision, CM=1)]


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_cluster_on_odd_shapes_gpu(precision):
    if not HOPPER:
        pytest.skip("clusters with TMA multicast need an H100/H200")
    shapes = [(1, 1, 1), (37, 29, 53), (129, 127, 3), (257, 255, 65), (385, 600, 130),
              (1000, 1000, 1000), (8191, 3, 517), (3, 8191, 5), (1025, 513, 4097),
              (4095, 3073, 2047)]
    for spec in _gpu_specs(precision):
        for i, (M, N, K) in enumerate(shapes):
            check_product(spec, precision, M, N, K, seed=i)


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_cluster_on_large_shapes_gpu(precision):
    """Hundreds of super-tiles per cluster walk; 4224 rows are 33 tile rows (an odd count)."""
    if not HOPPER:
        pytest.skip("clusters with TMA multicast need an H100/H200")
    rng = np.random.default_rng(12)
    for spec in _gpu_specs(precision):
        for M, N, K in ((4096, 4096, 4096), (4224, 4104, 4096), (8192, 8192, 1024)):
            check_sampled_rows(spec, precision, M, N, K, rng)
