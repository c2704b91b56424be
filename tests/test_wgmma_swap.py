"""wgmma_swap: C^T = B^T A^T in narrow token tiles, the operands exchanged by the runtime."""

import numpy as np
import pytest

import gemmlib
from gemmlib import backend
from gemmlib.kernels import wgmma_swap as S
from gemmlib.precision import tolerance


def test_widths_stages_and_names():
    assert [S.width_for(m) for m in (1, 8, 9, 16, 17, 33, 64, 65)] == [8, 8, 16, 16, 32, 64,
                                                                        64, 64]
    for bm in (64, 128):
        for bn in S.WIDTHS:
            st = S.stages_for(bm, bn)
            assert 2 <= st <= S.MAX_STAGES and st * 2 * S.BK * (bm + bn) <= S.RING_BYTES
    spec = S.build("bf16", BM=128, BN=32, OUT="bf16", B_LAYOUT="KN", BIAS=True)
    assert spec.swap_ab and spec.b_operand == "KN" and spec.bias_arg
    assert spec.name.startswith("wgmma_swap_bf16_128x32_s") and spec.name.endswith("_o16_kn_bias")
    # the kernel's A is the caller's B, as it lies; its B is the caller's A
    assert spec.kernel_operands(5, 72, 40) == ((40, 72), (5, 40))
    assert S.build(B_LAYOUT="NK").kernel_operands(5, 72, 40) == ((72, 40), (5, 40))
    with pytest.raises(ValueError, match="BN a multiple of 8"):
        S.build(BN=12)


def test_stream_k_walk_gives_every_k_tile_to_one_block_and_numbers_the_pieces(monkeypatch):
    """The walk as the kernel runs it (blockIdx, gridDim set in plain Python): every
    (tile, k-tile) once, each block's share within one k-tile of the others, and each
    shared tile's pieces numbered 0.. in block order, their count the same for all."""
    from types import SimpleNamespace

    from gemmlib.kernels import wgmma_split_k as W

    walk = W.stream_k_walk
    walk = getattr(walk, "py_func", None) or getattr(walk, "fn", None) or walk
    for tiles, num_k, G in ((1, 1, 1), (2, 5, 3), (96, 64, 132), (7, 3, 20), (448, 64, 132)):
        seen, pieces, shares = {}, {}, []
        for c in range(G):
            monkeypatch.setattr(W.cuda, "blockIdx", SimpleNamespace(x=c), raising=False)
            monkeypatch.setattr(W.cuda, "gridDim", SimpleNamespace(x=G), raising=False)
            j, share = 0, 0
            while True:
                tile, k0, k1, z, n = walk(j, 0, tiles, num_k)
                if tile < 0:
                    break
                j += 1
                assert 0 <= k0 < k1 <= num_k
                share += k1 - k0
                for k in range(k0, k1):
                    assert (tile, k) not in seen
                    seen[(tile, k)] = c
                pieces.setdefault(tile, []).append((z, n))
            shares.append(share)
        assert len(seen) == tiles * num_k and max(shares) - min(shares) <= 1
        for tile, ps in pieces.items():
            assert [z for z, _ in ps] == list(range(len(ps))) and {n for _, n in ps} == {len(ps)}
        assert W.stream_k_pieces(tiles, num_k, G) == max(len(ps) for ps in pieces.values())


@pytest.mark.skipif(not backend.SIMULATOR, reason="the simulator's twins (GPU: below)")
@pytest.mark.parametrize("precision, M, N, K, BN, layout, grid, out, bias, kt", [
    ("fp16", 3, 72, 200, 8, "NK", 1, "fp32", False, 64),
    ("bf16", 13, 130, 300, 16, "NK", 4, "bf16", True, 64),
    ("fp16", 5, 72, 136, 8, "KN", 3, "fp16", False, 64),
    ("fp16", 9, 136, 330, 16, "NK", 3, "fp32", True, 128),
    ("bf16", 2, 72, 72, 8, "KN", 1, "bf16", False, 128),
    ("fp16", 19, 72, 136, 8, "NK", 3, "fp16", True, 64),       # three token tiles
    ("bf16", 130, 72, 72, 128, "NK", 2, "bf16", False, 64),    # a prefill chunk's width
    ("fp16", 83, 72, 136, 88, "NK", 2, "fp16", True, 64),      # a fitted width (fit_width)
])
def test_swapped_products_in_the_simulator(precision, M, N, K, BN, layout, grid, out, bias, kt):
    """Odd shapes (K and N padded to 8s by matmul, M not), tiles shared by blocks or not, a
    16-bit C, a bias per output column, B as an nn.Linear weight's W.t() or as (K, N)."""
    from gemmlib import precision as P

    rng = np.random.default_rng(M * N)
    a = rng.uniform(-1, 1, (M, K)).astype(np.float32)
    w = rng.uniform(-1, 1, (N, K)).astype(np.float32)
    z = rng.uniform(-1, 1, (N,)).astype(np.float32)
    if precision == "fp16":
        a, w, z = (x.astype(np.float16) for x in (a, w, z))
        A, Wt, Z = a, w, z
        vals = np.asarray
    else:
        A, Wt, Z = P.to_bf16(a), P.to_bf16(w), P.to_bf16(z)
        a, w, z = (P.bf16_bits_to_float32(x.bits) for x in (A, Wt, Z))

        def vals(C):
            return P.bf16_bits_to_float32(C.bits) if isinstance(C, P.BF16Array) else C
    B = Wt.T if layout == "NK" else (Wt.T.astype(Wt.dtype) if precision == "fp16"
                                     else P.to_bf16(np.ascontiguousarray(w.T)))
    ref = a.astype(np.float64) @ w.astype(np.float64).T
    kw = {}
    if bias:
        ref = ref + z.astype(np.float64)
        kw["bias"] = Z
    spec = S.build(precision, BN=BN, STAGES=2, GRID=grid, OUT=out, B_LAYOUT=layout,
                   BIAS=bias, KT=kt)
    if out == "fp32":
        kw["out_dtype"] = "float32"
    C = gemmlib.matmul(A, B, kernel=spec, precision=precision, **kw)
    got = np.asarray(vals(C), np.float64)
    err = np.abs(got - ref).max() / np.abs(ref).max()
    tol = tolerance(precision, K) + (2.0 ** -8 if out != "fp32" else 0)
    assert got.shape == (M, N) and np.isfinite(got).all() and err <= tol, err


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_swap_on_hopper_gpu(precision):
    """Every token width, both weight layouts, sliced and not, against float64; a repeat
    gives the same bits."""
    if tuple(backend.device_info().compute_capability) != (9, 0):
        pytest.skip("wgmma needs an H100/H200")
    import torch

    dt = torch.float16 if precision == "fp16" else torch.bfloat16
    for M, N, K in [(1, 8, 8), (1, 4096, 4096), (7, 1000, 3001), (16, 4104, 14336),
                    (40, 264, 640), (64, 6144, 4096), (3, 8, 5000)]:
        x = torch.randn(M, K, device="cuda", dtype=dt)
        W = torch.randn(N, K, device="cuda", dtype=dt)
        b = torch.randn(N, device="cuda", dtype=dt)
        ref = x.double() @ W.double().t() + b.double()
        for BM, layout, kt in ((64, "NK", 64), (64, "KN", 64), (128, "NK", 64),
                               (64, "NK", 128)):
            Bop = W.t() if layout == "NK" else W.t().contiguous()
            for grid in (0, 1, 7):
                spec = S.build(precision, BM=BM, BN=S.width_for(M), GRID=grid,
                               B_LAYOUT=layout, BIAS=True, KT=kt)
                outs = []
                for _ in range(2):
                    C = torch.full((M, N), float("nan"), device="cuda")
                    gemmlib.matmul(x, Bop, kernel=spec, bias=b, out=C)
                    outs.append(C)
                err = ((outs[0].double() - ref).abs().max() / ref.abs().max()).item()
                assert err <= tolerance(precision, K), (spec.name, M, N, K, err)
                assert torch.equal(outs[0], outs[1]), (spec.name, "not deterministic")


def test_plan_for_shares_the_tiles_evenly_where_that_fills_the_sms():
    """The launch model's choices on an H100's 132 SMs: a 4096-wide layer's 64 tiles each
    cut in two (128 blocks), a 6144-wide layer's 96 tiles whole, and uneven stream-K over
    all SMs only where a block gets several tiles."""
    import dataclasses

    h100 = dataclasses.replace(backend.device_info(), sm_count=132, memory_clock_khz=2619000,
                               memory_bus_bits=5120)
    assert S.plan_for(1, 4096, 4096, h100) == (64, 128)
    assert S.plan_for(16, 6144, 4096, h100) == (64, 96)
    assert S.plan_for(1, 37888, 3584, h100) == (64, 132)
    for M, N, K in ((1, 8, 8), (64, 100, 9000), (7, 130000, 64)):
        BM, g = S.plan_for(M, N, K, h100)
        assert BM in (64, 128) and 1 <= g <= 132


def test_fit_width_fills_the_sms_where_powers_of_two_leave_them_idle():
    """512 tokens on a 4608-output layer: 128 x 128 tiles make 144 (two rounds on 132 SMs),
    the fitted width 108 tiles in one; a width is a multiple of 8 that holds the tokens in
    equal tiles, and a shape the round widths already fill keeps them."""
    BN = S.fit_width(512, 4608, 3584, 128, 132)
    tiles = -(-4608 // 128) * -(-512 // BN)
    assert BN % 8 == 0 and BN <= 256 and tiles <= 132 and tiles >= 100
    assert S.fit_width(512, 4096, 4096, 128, 132) == 256
    assert S.fit_width(128, 4096, 4096, 128, 132) == 128
    for M in (65, 100, 333, 1000):
        w = S.fit_width(M, 4096, 4096, 64, 132)
        t = -(-M // w)   # tiles of w tokens: equal up to the rounding to 8
        assert w % 8 == 0 and 8 <= w <= 256 and t * w - M < 8 * t

