"""wgmma_store: wgmma_ws with the epilogue through shared memory and a TMA store.

The simulator runs small tiles over several tiles per block, so the stage is refilled and
its mbarriers change phase many times; its TMA-store twin copies each box out of the
block's simulated shared memory through the 128-byte swizzle, dropping what leaves C, so a
stage written in the wrong place, or a partial tile stored past C, fails in CI.  C that
cannot take a TMA store (rows not a multiple of 16 bytes) runs the register store.  The
GPU runs the default tiles on odd and large shapes, float32 and 16-bit C."""

import numpy as np
import pytest

from _reliability import HOPPER, check_product, check_sampled_rows, on_blocks
from gemmlib import backend, dispatch, tma
from gemmlib.kernels import wgmma_store as S
from gemmlib.kernels import wgmma_ws

sim_only = pytest.mark.skipif(not backend.SIMULATOR, reason="the simulator's twins")


def test_default_build_and_its_shared_memory():
    s = S.SPEC
    assert s.name == "wgmma_store" and s.tile == (128, 256) and s.threads == 384
    assert S.stage_shape(256, "fp32") == (2, 128, 4, 32, 4)   # two halves of 4 boxes
    assert S.stage_shape(256, "fp16") == (1, 256, 2, 64, 4)   # one piece of 4 boxes
    assert S.stage_bytes(256, "fp32") == S.stage_bytes(256, "bf16") == 64 * 1024
    assert s.shared_bytes == 3 * 48 * 1024 + 1024 + 64 * 1024 <= S.SMEM_MAX
    assert s.tma_store_box == (64, 32) and S.build(OUT="fp16").tma_store_box == (64, 64)
    assert S.build("bf16", OUT="bf16").name == "wgmma_store_bf16_o16"
    assert S.build(STAGES=2).name == "wgmma_store_128x256_s2"
    with pytest.raises(ValueError, match="KiB of shared memory"):
        S.build(STAGES=4)
    with pytest.raises(ValueError, match="BM must be 128"):
        S.build(BM=64)
    # a 16-bit C in two pieces of 32 KiB leaves room for a fourth stage
    p2 = S.build(STAGES=4, OUT="fp16", PIECES=2)
    assert p2.name == "wgmma_store_128x256_s4_o16_p2" and p2.params["PIECES"] == 2
    assert p2.shared_bytes == 4 * 48 * 1024 + 1024 + 32 * 1024 <= S.SMEM_MAX
    assert "PIECES" not in S.build(OUT="fp16", PIECES=1).params   # the default, named as such
    with pytest.raises(ValueError, match="PIECES must be 1 or 2"):
        S.build(BN=64, OUT="fp16", PIECES=2)                      # half a 64-column box


@pytest.mark.parametrize("out", ["fp32", "bf16"])
def test_stage_layout_is_what_the_copy_engine_reads(out):
    """Every staged element sits where a TMA store of its box (128-byte swizzle) reads it,
    and the tile's elements fill the stage once."""
    _, cols, es, box_cols, boxes = S.stage_shape(256, out)
    offset = S.stage_offset(out)
    seen = set()
    for r in range(128):
        for c in range(cols):
            box, cc = divmod(c, box_cols)
            want = box * 128 * 128 + es * tma.swizzled_offset(r, cc, box_cols, es, 128)
            assert offset(r, c) == want, (r, c)
            seen.add(want)
    assert seen == set(range(0, S.stage_bytes(256, out), es))


def test_c_gets_a_map_only_where_it_can_take_tma_stores():
    s32, s16 = S.SPEC, S.build(OUT="fp16")
    assert s32.c_map_ok(72, 1024) and not s32.c_map_ok(70, 1024) and not s32.c_map_ok(72, 8)
    assert s16.c_map_ok(72, 1024) and not s16.c_map_ok(68, 1024)
    assert not wgmma_ws.SPEC.c_map_ok(256, 1024)   # no store box: two maps, as before


#: (precision, OUT, BN, STAGES, (M, N, K), blocks): 128 x 64 tiles keep the simulator fast;
#: six tiles on two blocks (the stage refilled, its phases wrapping); N = 72: TMA stores, the
#: last column tile 8 wide and M = 300 partial (the copy engine drops the rest); N = 69
#: (gemmlib.matmul keeps C 69 wide): the register store; four tiles on one block, three
#: k-tiles on a three-stage ring
SIM_CASES = [("fp16", "fp32", 64, 2, (300, 72, 72), 2),
             ("fp16", "fp32", 64, 2, (130, 69, 72), 2),
             ("bf16", "fp32", 64, 3, (129, 72, 136), 1)]


@sim_only
@pytest.mark.parametrize("precision, out, BN, stages, shape, blocks", SIM_CASES)
def test_staged_epilogue_in_the_simulator(precision, out, BN, stages, shape, blocks):
    spec = S.build(precision, BN=BN, STAGES=stages, OUT=out)
    check_product(on_blocks(spec, blocks), precision, *shape, seed=sum(shape))


@sim_only
@pytest.mark.parametrize("misaligned", [False, True])
def test_staged_16_bit_c_is_wgmma_ws_bit_for_bit(misaligned):
    """A 16-bit C by TMA store, or (C 2 bytes off 16-byte alignment) from registers: bit for
    bit wgmma_ws's 16-bit epilogue, every element written, nothing past C."""
    rng = np.random.default_rng(7)
    M, N, K = 200, 72, 64
    A = rng.uniform(-1, 1, (M, K)).astype(np.float16).view(np.uint16)
    B = rng.uniform(-1, 1, (K, N)).astype(np.float16).view(np.uint16)
    buf = np.full(M * N + 16, 0xFFFF, np.uint16)
    at = (-buf.ctypes.data % 16) // 2 + misaligned
    got = buf[at:at + M * N].reshape(M, N)
    spec = on_blocks(S.build("fp16", BN=64, STAGES=2, OUT="fp16"), 2)
    assert spec.c_map_ok(N, got.ctypes.data) != misaligned
    dispatch.launch(spec, A, B, got, M, N, K)
    ref = np.full((M, N), 0xFFFF, np.uint16)
    dispatch.launch(on_blocks(wgmma_ws.build("fp16", BM=128, BN=64, STAGES=2, OUT="fp16"), 2),
                    A, B, ref, M, N, K)
    assert np.array_equal(got, ref) and (ref != 0xFFFF).all()
    assert (buf[:at] == 0xFFFF).all() and (buf[at + M * N:] == 0xFFFF).all()
    assert dispatch.rung_of(S.build("fp16", OUT="fp16")) == "wgmma_store"


@sim_only
def test_16_bit_c_in_two_pieces_is_wgmma_ws_bit_for_bit():
    """PIECES=2 with a 16-bit C: the consumers stage each half after the storer has read the
    other (the stage's barriers change phase twice a tile)."""
    rng = np.random.default_rng(11)
    M, N, K = 130, 136, 64
    A = rng.uniform(-1, 1, (M, K)).astype(np.float16).view(np.uint16)
    B = rng.uniform(-1, 1, (K, N)).astype(np.float16).view(np.uint16)
    got = np.full((M, N), 0xFFFF, np.uint16)
    ref = np.full((M, N), 0xFFFF, np.uint16)
    spec = on_blocks(S.build("fp16", BN=128, STAGES=2, OUT="fp16", PIECES=2), 2)
    dispatch.launch(spec, A, B, got, M, N, K)
    dispatch.launch(on_blocks(wgmma_ws.build("fp16", BM=128, BN=128, STAGES=2, OUT="fp16"), 2),
                    A, B, ref, M, N, K)
    assert np.array_equal(got, ref) and (ref != 0xFFFF).all()


# --------------------------------------------------------------------------- the GPU


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_store_on_odd_shapes_gpu(precision):
    if not HOPPER:
        pytest.skip("wgmma needs an H100/H200")
    shapes = [(1, 1, 1), (37, 29, 53), (129, 128, 3), (257, 255, 65), (1000, 1000, 1000),
              (8191, 4, 517), (3, 8192, 5), (1025, 516, 4097), (4095, 3072, 2047)]
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


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_16_bit_c_in_two_pieces_with_four_stages_gpu(precision):
    """PIECES=2 with a fourth stage: bit for bit the default build (one piece, three stages),
    which the tests above check against float64; every element written."""
    if not HOPPER:
        pytest.skip("wgmma needs an H100/H200")
    import gemmlib
    from _reliability import operands16
    from gemmlib.precision import BF16Array

    xp = backend.array_module()
    two = S.build(precision, STAGES=4, OUT=precision, PIECES=2)
    one = S.build(precision, OUT=precision)
    exp = 0x7C00 if precision == "fp16" else 0x7F80   # exponent bits all set: NaN or Inf

    def poisoned(M, N):   # 0xFFFF is NaN in both types: an element nobody writes shows
        bits = xp.full((M, N), 0xFFFF, np.uint16)
        return bits.view(np.float16) if precision == "fp16" else BF16Array(bits)

    for i, (M, N, K) in enumerate([(37, 24, 53), (257, 264, 65), (1025, 520, 4097),
                                   (4096, 4096, 4096)]):
        A, B, _, _ = operands16(precision, M, N, K, np.random.default_rng(i))
        got, ref = poisoned(M, N), poisoned(M, N)
        gemmlib.matmul(A, B, kernel=two, out=got)
        gemmlib.matmul(A, B, kernel=one, out=ref)
        got, ref = (np.asarray(backend.to_host(getattr(C, "bits", C))).view(np.uint16)
                    for C in (got, ref))
        assert np.array_equal(got, ref), (precision, M, N, K)
        assert ((got & exp) != exp).all(), (precision, M, N, K)   # all written, all finite
