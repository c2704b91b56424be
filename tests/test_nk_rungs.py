"""B given as torch holds an ``nn.Linear`` weight: (N, K) row-major, C = A @ B.T.

Every ``B_LAYOUT="NK"`` build of the rungs ``kernel="auto"`` selects -- ``skinny``
(decode), ``mma_pipeline`` / ``mma_split_k`` (tensor cores), ``warptile`` / ``split_k``
(fp32 CUDA cores) -- against a float64 reference of A @ W.T on odd shapes (1, primes,
sizes that are not multiples of 8), with fresh random non-integer data and a C poisoned
with NaN, launched through ``gemmlib.dispatch.launch`` with W as the (N, K) array.  16-bit
inputs travel as their uint16 bit patterns; the 16-byte-piece rungs get K zero-padded to
their multiple, as ``gemmlib.api`` pads (N needs no padding when B is K-major).
"""

from __future__ import annotations

import numpy as np
import pytest

from _reliability import count_load16
from gemmlib import backend, dispatch
from gemmlib import precision as P
from gemmlib.kernels import mma_pipeline, mma_split_k, skinny, split_k, warptile

sim_only = pytest.mark.skipif(not backend.SIMULATOR, reason="simulator sizes")


def operands(precision, M, N, K, seed):
    """(A, W) as the kernel takes them and their float64 values: A (M, K), W (N, K)."""
    rng = np.random.default_rng(seed)
    A = rng.uniform(-1, 1, (M, K)).astype(np.float32)
    W = rng.uniform(-1, 1, (N, K)).astype(np.float32)
    if precision == "fp16":
        A, W = A.astype(np.float16), W.astype(np.float16)
        return A.view(np.uint16), W.view(np.uint16), A.astype(np.float64), W.astype(np.float64)
    if precision == "bf16":
        a, w = P.to_bf16_bits(A), P.to_bf16_bits(W)
        return (a, w, P.bf16_bits_to_float32(a).astype(np.float64),
                P.bf16_bits_to_float32(w).astype(np.float64))
    return A, W, A.astype(np.float64), W.astype(np.float64)


def pad_k(X, align):
    """X with its K (columns) zero-padded to a multiple of ``align`` (as gemmlib.api does)."""
    K = X.shape[1]
    Kp = -(-K // align) * align
    out = np.zeros((X.shape[0], Kp), X.dtype)
    out[:, :K] = X
    return out


def out_values(C, out):
    if out == "fp16":
        return C.view(np.float16).astype(np.float64)
    if out == "bf16":
        return P.bf16_bits_to_float32(C).astype(np.float64)
    return C.astype(np.float64)


def check(spec, M, N, K, seed, out="fp32", tol=None):
    assert spec.b_operand == "NK" and spec.b_kmajor and spec.params["B_LAYOUT"] == "NK"
    assert spec.name.endswith("_nk"), spec.name
    precision = spec.precision
    data = "fp32" if precision in ("tf32", "3xtf32") else precision
    A, W, a, w = operands(data, M, N, K, seed)
    Kp = K
    if spec.operand_align:
        A, W = pad_k(A, spec.operand_align), pad_k(W, spec.operand_align)
        Kp = A.shape[1]
    if out == "fp32":
        C = np.full((M, N), np.nan, np.float32)
    else:   # a 16-bit NaN in every element
        C = np.full((M, N), 0x7E00 if out == "fp16" else 0x7FC0, np.uint16)
    dispatch.launch(spec, A, W, C, M, N, Kp)
    ref = a @ w.T
    got = out_values(C, out)
    assert np.isfinite(got).all(), f"{spec.name} {M}x{N}x{K}: elements left unwritten"
    bound = tol if tol is not None else P.tolerance(precision, K)
    if out != "fp32":   # one more rounding, to the 16-bit output
        bound += 2.0 ** (-8 if out == "bf16" else -11)
    err = backend.relative_error(got, ref)
    assert err <= bound, f"{spec.name} {M}x{N}x{K}: error {err:.3g} > {bound:.3g}"
    return C


# --------------------------------------------------------------------------- skinny

#: M = 1, primes, K past a chunk and a slice, N not a multiple of the block's rows
SKINNY_SHAPES = [(1, 7, 37), (3, 13, 131), (5, 29, 67), (2, 1, 1), (7, 31, 203), (3, 11, 136)]


@sim_only
@pytest.mark.parametrize("precision", ("fp32", "fp16", "bf16"))
@pytest.mark.parametrize("kw", [dict(MT=4, CT=4, NT=8, U=2), dict(MT=2, CT=2, NT=4, U=2, PIPE=1),
                                dict(MT=2, CT=8, NT=16, U=4, NC=1, SPLITS=3)],
                         ids=["mt4", "pipe", "nc_splits3"])
def test_skinny_nk(precision, kw):
    spec = skinny.build(precision, B_LAYOUT="NK", **kw)
    for i, (M, N, K) in enumerate(SKINNY_SHAPES):
        check(spec, M, N, K, seed=100 + i)


@sim_only
@pytest.mark.parametrize("precision,K", [("fp32", 530), ("fp16", 528)])
def test_skinny_nk_several_chunks(precision, K):
    """MT = 16 stages 512 columns of A at a time: K = 528 or 530 takes two chunks (the
    second partial), with the double-buffered loads crossing from one to the next."""
    spec = skinny.build(precision, MT=16, CT=2, NT=4, U=2, PIPE=1, B_LAYOUT="NK")
    check(spec, 11, 5, K, seed=9)


@sim_only
@pytest.mark.parametrize("precision", ("fp32", "bf16"))
def test_skinny_nk_reads_16_byte_pieces_exactly_when_k_allows(monkeypatch, precision):
    """W's rows are read with load16 when K is a multiple of VEC (16-byte aligned rows),
    else with guarded scalar loads only."""
    calls = count_load16(monkeypatch)
    spec = skinny.build(precision, MT=2, CT=4, NT=8, U=2, B_LAYOUT="NK")
    V = skinny.VEC[precision]
    check(spec, 2, 9, 5 * V, seed=2)
    assert calls and all(j % V == 0 for _, j in calls)
    calls.clear()
    check(spec, 2, 9, 5 * V + 1, seed=2)
    assert not calls


@sim_only
@pytest.mark.parametrize("precision", ("fp16", "bf16"))
def test_skinny_nk_16_bit_out(precision):
    spec = skinny.build(precision, MT=2, CT=4, NT=8, U=2, OUT=precision, B_LAYOUT="NK")
    assert spec.name.endswith("_o16_nk")
    for i, (M, N, K) in enumerate([(1, 11, 53), (3, 5, 17)]):
        check(spec, M, N, K, seed=7 + i, out=precision)
    split = skinny.build(precision, MT=2, CT=4, NT=8, U=2, OUT=precision, B_LAYOUT="NK",
                         SPLITS=2)
    assert split.name.endswith("_s2_o16_nk")
    check(split, 2, 9, 97, seed=3, out=precision)


@sim_only
def test_skinny_nk_is_deterministic_and_kn_unchanged():
    spec = skinny.build("fp32", MT=2, CT=4, NT=8, U=2, SPLITS=2, B_LAYOUT="NK")
    C1 = check(spec, 2, 9, 70, seed=1)
    C2 = check(spec, 2, 9, 70, seed=1)
    assert C1.tobytes() == C2.tobytes()
    kn = skinny.build("fp32", MT=2, CT=4, NT=8, U=2)
    assert kn.b_operand == "KN" and "B_LAYOUT" not in kn.params and not kn.name.endswith("_nk")
    p = skinny.params_for("fp16", 1, b_layout="NK")
    assert p["B_LAYOUT"] == "NK" and dispatch.build("skinny", p).name.endswith("_nk")
    assert "B_LAYOUT" not in skinny.params_for("fp16", 1)


# --------------------------------------------------------------------------- tensor cores

TC_SHAPES = [(1, 1, 1), (37, 13, 61), (17, 41, 29)]


def small_pipeline(precision):
    bk = 32 if precision in ("fp16", "bf16") else 16
    return mma_pipeline.build(precision, BM=32, BN=32, BK=bk, WM=32, WN=32, STAGES=2,
                              B_LAYOUT="NK")


@sim_only
@pytest.mark.parametrize("precision", ("fp16", "bf16", "tf32", "3xtf32"))
def test_mma_pipeline_nk(precision):
    spec = small_pipeline(precision)
    for i, (M, N, K) in enumerate(TC_SHAPES):
        check(spec, M, N, K, seed=20 + i)


@sim_only
def test_mma_pipeline_nk_two_warps():
    """Two warps along N, three stages: each thread copies several 16-byte rows of B's
    K-major tile per k-tile."""
    spec = mma_pipeline.build("bf16", BM=32, BN=64, BK=32, WM=32, WN=32, STAGES=3,
                              B_LAYOUT="NK")
    check(spec, 33, 71, 101, seed=30)


@sim_only
@pytest.mark.parametrize("precision", ("fp16", "tf32"))
def test_mma_split_k_nk(precision):
    bk = 32 if precision == "fp16" else 16
    spec = mma_split_k.build(precision, SPLITS=3, BM=32, BN=32, BK=bk, WM=32, WN=32,
                             STAGES=2, B_LAYOUT="NK")
    assert spec.name.endswith("_splits3_nk")
    M, N, K = 19, 23, 5 * bk - 3
    C1 = check(spec, M, N, K, seed=4)
    assert dispatch.plan(spec, M, N, -(-K // spec.operand_align) * spec.operand_align).splits == 3
    assert C1.tobytes() == check(spec, M, N, K, seed=4).tobytes()


# --------------------------------------------------------------------------- fp32 CUDA cores

SMALL_WARPTILE = dict(BM=16, BN=32, BK=8, WM=16, WN=32, WNITER=1, TM=4, TN=4)
FP32_SHAPES = [(1, 1, 1), (13, 7, 29), (19, 37, 11), (16, 16, 40)]


@sim_only
def test_warptile_nk():
    spec = warptile.build(**SMALL_WARPTILE, B_LAYOUT="NK")
    for i, (M, N, K) in enumerate(FP32_SHAPES):
        check(spec, M, N, K, seed=40 + i)


@sim_only
def test_split_k_nk():
    spec = split_k.build(SPLITS=3, **SMALL_WARPTILE, B_LAYOUT="NK")
    assert spec.b_operand == "NK" and spec.name.endswith("_nk")
    C1 = check(spec, 13, 21, 83, seed=5)
    assert dispatch.plan(spec, 13, 21, 83).splits == 3
    assert C1.tobytes() == check(spec, 13, 21, 83, seed=5).tobytes()


# --------------------------------------------------------------------------- a column-major A

KM_SHAPES = [(8, 13, 29), (24, 40, 70), (40, 17, 33)]


def _km_operands(precision, M, N, K, b_order, seed):
    """A as the transpose of its (K, M) memory, B row-major or column-major, in the types
    gemmlib.matmul takes; and their float64 values."""
    from gemmlib.precision import BF16Array

    rng = np.random.default_rng(seed)
    At = rng.uniform(-1, 1, (K, M)).astype(np.float32)
    Bm = rng.uniform(-1, 1, (K, N) if b_order == "C" else (N, K)).astype(np.float32)
    if precision == "fp16":
        At, Bm = At.astype(np.float16), Bm.astype(np.float16)
        a64, b64 = At.astype(np.float64), Bm.astype(np.float64)
    elif precision == "bf16":
        at, bm = P.to_bf16_bits(At), P.to_bf16_bits(Bm)
        a64 = P.bf16_bits_to_float32(at).astype(np.float64)
        b64 = P.bf16_bits_to_float32(bm).astype(np.float64)
        At, Bm = BF16Array(at), BF16Array(bm)
    else:
        a64, b64 = At.astype(np.float64), Bm.astype(np.float64)
    A = At.T
    B = Bm if b_order == "C" else Bm.T
    return A, B, a64.T, (b64 if b_order == "C" else b64.T)


@sim_only
@pytest.mark.parametrize("precision", ("fp16", "bf16", "tf32", "3xtf32"))
@pytest.mark.parametrize("b_order", ("C", "F"))
@pytest.mark.parametrize("split", (False, True))
def test_mma_pipeline_reads_a_column_major_a_in_place(precision, b_order, split, launched,
                                                       no_reorder):
    """``A.T`` (a weight gradient's x^T) reaches ``mma_pipeline`` / ``mma_split_k``'s
    ``A_LAYOUT="KM"`` build as the caller's (K, M) memory -- its tile copied as a row-major
    B's, its fragments from ``ldmatrix.trans`` (16-bit) or scalar loads (TF32) -- with B
    either way round, odd N and K, a poisoned C, against float64."""
    import gemmlib

    seen = launched(lambda plan, A, B: plan.spec)
    bk = 32 if precision in ("fp16", "bf16") else 16
    tile = dict(BM=32, BN=32, BK=bk, WM=32, WN=32, STAGES=2)
    spec = (mma_split_k.build(precision, SPLITS=2, **tile) if split
            else mma_pipeline.build(precision, **tile))
    for i, (M, N, K) in enumerate(KM_SHAPES):
        A, B, a64, b64 = _km_operands("fp32" if precision in ("tf32", "3xtf32") else precision,
                                      M, N, K, b_order, seed=60 + i)
        C = np.full((M, N), np.nan, np.float32)
        gemmlib.matmul(A, B, out=C, kernel=spec, out_dtype="float32",
                       precision=precision if precision in ("tf32", "3xtf32") else None)
        assert seen[-1].a_operand == "KM" and seen[-1].name.count("_km") == 1, seen[-1].name
        err = backend.relative_error(C.astype(np.float64), a64 @ b64)
        assert err <= P.tolerance(precision, K), (spec.name, M, N, K, err)


def test_km_builds_refuse_a_short_m_and_name_themselves():
    spec = mma_pipeline.build("fp16", A_LAYOUT="KM", B_LAYOUT="NK")
    assert spec.name.endswith("_km_nk") and spec.params["A_LAYOUT"] == "KM"
    assert spec.kernel_operands(24, 16, 40) == ((40, 24), (16, 40))
    (rule,) = spec.constraints
    assert not rule.holds(spec, 12, 16, 40, None) and rule.holds(spec, 16, 12, 40, None)
    assert ", M must" in rule.why
    split = mma_split_k.build("fp16", SPLITS=2, A_LAYOUT="KM")
    assert split.a_operand == "KM" and "_km" in split.name
    with pytest.raises(ValueError, match="A_LAYOUT"):
        mma_pipeline.build("fp16", A_LAYOUT="TN")


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ("fp16", "bf16", "tf32", "3xtf32"))
@pytest.mark.parametrize("b_order", ("C", "F"))
def test_mma_pipeline_km_on_the_gpu(precision, b_order):
    """The ``A_LAYOUT="KM"`` builds of ``mma_pipeline`` (default tile) and ``mma_split_k``
    on a GPU, A as ``x.t()`` of a torch tensor, odd and large shapes, a poisoned C."""
    torch = pytest.importorskip("torch")
    import gemmlib

    dt = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(precision, torch.float32)
    call_prec = precision if precision in ("tf32", "3xtf32") else None
    tol = {"fp16": 2e-3, "bf16": 1e-2, "tf32": 3e-3, "3xtf32": 1e-5}[precision]
    g = torch.Generator(device="cuda").manual_seed(9)
    for kernel in (mma_pipeline.build(precision), mma_split_k.build(precision, SPLITS=3)):
        for M, N, K in ((8, 13, 29), (264, 200, 1000), (1024, 520, 4104)):
            At = (torch.rand((K, M), generator=g, device="cuda") - 0.5).to(dt)
            Bm = (torch.rand((K, N) if b_order == "C" else (N, K), generator=g,
                             device="cuda") - 0.5).to(dt)
            B = Bm if b_order == "C" else Bm.t()
            C = torch.full((M, N), float("nan"), device="cuda")
            gemmlib.matmul(At.t(), B, out=C, kernel=kernel, precision=call_prec)
            ref = At.t().double() @ B.double()
            err = float((C.double() - ref).norm() / ref.norm())
            assert err < tol, (kernel.name, M, N, K, b_order, err)


@sim_only
@pytest.mark.parametrize("precision", ("fp16", "tf32"))
def test_mma_pipeline_km_default_tile(precision):
    """The KM build of the tile ``auto`` takes (128 x 128, four warps, 4 stages): several
    blocks and k-tiles, a poisoned C, against float64."""
    import gemmlib

    M, N, K = 136, 72, 200
    A, B, a64, b64 = _km_operands("fp16" if precision == "fp16" else "fp32", M, N, K, "C",
                                  seed=70)
    C = np.full((M, N), np.nan, np.float32)
    spec = mma_pipeline.build(precision)
    gemmlib.matmul(A, B, out=C, kernel=spec, out_dtype="float32",
                   precision=precision if precision == "tf32" else None)
    assert backend.relative_error(C.astype(np.float64), a64 @ b64) <= P.tolerance(precision, K)
