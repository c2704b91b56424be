"""TF32 and FP8 on wgmma (issue 19): K-major tiles, the transpose pre-pass, FP8 formats,
scales and bf16 output.  The simulator checks the descriptors, the TMA boxes and the
epilogue in CI; on an H100/H200 the same checks run on the GPU, and FP8 is compared with
torch._scaled_mm (cuBLASLt)."""

import numpy as np
import pytest

import gemmlib
from gemmlib import backend, fp8
from gemmlib.intrinsics import hopper as H
from gemmlib.kernels import wgmma_fp8, wgmma_tf32
from gemmlib.precision import BF16Array, bf16_bits_to_float32

HOPPER = (not backend.SIMULATOR and backend.gpu_present()
          and tuple(backend.device_info().compute_capability) == (9, 0))


def fp8_bits(rng, shape, fmt, limit=300.0):
    """Random bit patterns of finite values of ``fmt`` with |x| < limit."""
    vals = H.fp8_values(fmt)
    ok = np.flatnonzero(np.isfinite(vals) & (np.abs(vals) < limit))
    return rng.choice(ok, size=shape).astype(np.uint8)


def as_float(C):
    C = C if not isinstance(C, BF16Array) else bf16_bits_to_float32(C.bits)
    return np.asarray(backend.array_module().asnumpy(C) if not isinstance(C, np.ndarray) else C,
                      dtype=np.float64)


# --------------------------------------------------------------------------- formats


def test_fp8_value_tables():
    e4 = H.fp8_values("e4m3")
    assert e4[0x7E] == 448 and e4[0xFE] == -448 and np.isnan(e4[0x7F]) and np.isnan(e4[0xFF])
    assert e4[0x01] == 2.0 ** -9 and e4[0x38] == 1.0 and not np.isinf(e4).any()
    e5 = H.fp8_values("e5m2")
    assert e5[0x7B] == 57344 and e5[0x7C] == np.inf and e5[0xFC] == -np.inf
    assert np.isnan(e5[0x7D]) and e5[0x01] == 2.0 ** -16 and e5[0x3C] == 1.0
    try:
        import ml_dtypes   # when installed: the same tables as the OCP reference package
    except ImportError:
        return
    for fmt, dt in (("e4m3", ml_dtypes.float8_e4m3fn), ("e5m2", ml_dtypes.float8_e5m2)):
        ref = np.arange(256, dtype=np.uint8).view(dt).astype(np.float32)
        np.testing.assert_array_equal(H.fp8_values(fmt), ref)


def test_wgmma_k_per_type_is_32_bytes_of_a_row():
    for ab, k in H.WGMMA_K.items():
        assert k * {"f16": 2, "bf16": 2, "tf32": 4}.get(ab, 1) == 32
    with pytest.raises(ValueError, match="tf32, e4m3 or e5m2"):
        H.wgmma_kmajor(64, "f16")


def test_specs_declare_k_major_tiles():
    s = wgmma_tf32.SPEC
    assert s.b_kmajor and s.b_operand == "KN" and s.b_prep is not None
    assert s.tma_boxes == ((128, 32), (256, 32)) and s.operand_align == 4
    f = wgmma_fp8.SPEC
    assert f.b_operand == "NK" and f.b_prep is None and f.scale_words
    assert f.tma_boxes == ((128, 128), (256, 128)) and f.arg_dtypes == ("uint8", "uint8", "uint16")
    kn = wgmma_fp8.build(B_LAYOUT="KN")
    assert kn.b_prep is not None and kn.code_params == f.code_params   # one compiled kernel


# --------------------------------------------------------------------------- TF32


@pytest.mark.parametrize("shape", [(5, 7, 9), (70, 33, 40)])
def test_tf32_wgmma_is_right_on_odd_shapes(shape):
    """Padding (K, N to multiples of 4), the transpose pre-pass, two k-tiles, two consumers."""
    if not backend.SIMULATOR and not HOPPER:
        pytest.skip("wgmma needs an H100/H200")
    assert gemmlib.verify("wgmma_tf32", [shape], seed=3).ok


@pytest.mark.skipif(not backend.SIMULATOR and not HOPPER, reason="wgmma needs an H100/H200")
def test_tf32_wgmma_reads_the_top_19_bits():
    """The tensor core ignores a float32's low 13 bits (measured on an H100:
    results/tf32-2026-11-25/), and the twin does the same: 1 + 2^-11 + 2^-12 counts as 1."""
    xp = backend.array_module()
    A = np.zeros((4, 8), np.float32)
    A[:, 0] = 1 + 2.0 ** -11 + 2.0 ** -12
    B = np.zeros((8, 8), np.float32)
    B[0, :] = 1
    C = gemmlib.matmul(xp.asarray(A), xp.asarray(B), kernel="wgmma_tf32")
    assert float(as_float(C)[0, 0]) == 1.0


# --------------------------------------------------------------------------- FP8


CASES = [("e4m3", "KN", "bfloat16", (5, 7, 9)), ("e4m3", "NK", "float32", (5, 7, 9)),
         ("e5m2", "NK", "bfloat16", (70, 33, 40))]


@pytest.mark.parametrize("fmt, layout, out, shape", CASES)
def test_fp8_product_against_dequantised_float64(fmt, layout, out, shape):
    if not backend.SIMULATOR and not HOPPER:
        pytest.skip("wgmma needs an H100/H200")
    M, N, K = shape
    rng = np.random.default_rng(7)
    A = fp8_bits(rng, (M, K), fmt)
    B = fp8_bits(rng, (K, N) if layout == "KN" else (N, K), fmt)
    xp = backend.array_module()
    C = gemmlib.matmul(xp.asarray(A), xp.asarray(B), precision=fmt, scale_a=0.25, scale_b=3.0,
                       out_dtype=out, transpose_b=layout == "NK")
    assert isinstance(C, BF16Array) == (out == "bfloat16")
    ref = fp8.reference(A, B, fmt, 0.25, 3.0, layout)
    err = np.linalg.norm(as_float(C) - ref) / np.linalg.norm(ref)
    # the twin sums exactly; a bf16 output rounds once more (2^-9)
    assert err <= (2.0 ** -8 if out == "bfloat16" else 1e-6), err
    assert err <= fp8.tolerance(K, "bf16" if out == "bfloat16" else "fp32")


def test_verify_checks_fp8_rungs():
    """gemmlib.verify (what ``make`` runs for every rung) draws FP8 bit patterns for them."""
    r = gemmlib.verify(wgmma_fp8.build("e5m2", "fp32", "KN"), [(5, 7, 9), (0, 3, 2)], seed=2)
    assert r.ok and r.checks[0].rel_error < 1e-6


def test_fp8_input_errors():
    rng = np.random.default_rng(0)
    A = fp8_bits(rng, (4, 16), "e4m3")
    with pytest.raises(TypeError, match="uint8 arrays"):
        gemmlib.matmul(A.astype(np.float32), A.T.copy(), precision="e4m3")
    with pytest.raises(ValueError, match="bfloat16 or float32"):
        gemmlib.matmul(A, A.T.copy(), precision="e4m3", out_dtype="float16")
    with pytest.raises(ValueError, match="inner dimensions"):
        gemmlib.matmul(A, A, precision="e4m3")
    with pytest.raises(ValueError, match="writes fp32"):   # a spec's output type is its own
        gemmlib.matmul(A, A.T.copy(), kernel=wgmma_fp8.build(OUT="fp32", B_LAYOUT="KN"),
                       precision="e4m3", out_dtype="bfloat16")
    with pytest.raises(TypeError, match="writes bfloat16"):
        gemmlib.matmul(A, A.T.copy(), precision="e4m3", out_dtype="bfloat16",
                       out=np.zeros((4, 4), np.float32))
    with pytest.raises(ValueError, match="FP8 inputs only"):
        gemmlib.matmul(np.ones((2, 2), np.float32), np.ones((2, 2), np.float32), scale_a=2.0)


# --------------------------------------------------------------------------- on the GPU


@pytest.mark.gpu
def test_tf32_wgmma_on_the_gpu():
    if not HOPPER:
        pytest.skip("wgmma needs an H100/H200")
    shapes = [(1, 1, 1), (129, 255, 3), (300, 130, 200), (1025, 513, 1029), (77, 1000, 33)]
    assert gemmlib.verify("wgmma_tf32", shapes).ok


@pytest.mark.gpu
def test_fp8_matches_scaled_mm():
    """Odd shapes, both formats, column- and row-major B: error against float64 of the
    dequantised inputs within the bound, and no larger than cuBLASLt's where it runs."""
    torch = pytest.importorskip("torch")
    if not HOPPER:
        pytest.skip("wgmma needs an H100/H200")
    g = torch.Generator(device="cuda").manual_seed(0)
    dts = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
    for fmt, (M, N, K), colmajor in (("e4m3", (129, 255, 48), True), ("e5m2", (300, 130, 200), False),
                                     ("e4m3", (1024, 1008, 1024), True)):
        a = (torch.randn(M, K, device="cuda", generator=g) * 2).to(dts[fmt])
        w = (torch.randn(N, K, device="cuda", generator=g) * 2).to(dts[fmt])
        b = w.t() if colmajor else w.t().contiguous()
        sa, sb = torch.tensor([0.5], device="cuda"), torch.tensor([1.5], device="cuda")
        C = torch.full((M, N), float("nan"), device="cuda", dtype=torch.float32)
        gemmlib.matmul(a, b, out=C, scale_a=sa, scale_b=sb, out_dtype=torch.float32)
        R = (a.double() @ b.double()) * 0.75
        err = float(torch.linalg.norm(C.double() - R) / torch.linalg.norm(R))
        assert torch.isfinite(C).all() and err <= fp8.tolerance(K), (fmt, M, N, K, err)
        if K % 16 == 0 and N % 16 == 0 and fmt == "e4m3":   # no e5m2 x e5m2 in cuBLASLt
            T = torch._scaled_mm(a, w.t(), sa, sb, out_dtype=torch.float32, use_fast_accum=True)
            terr = float(torch.linalg.norm(T.double() - R) / torch.linalg.norm(R))
            assert err <= 2 * terr, (err, terr)   # the same accumulation class
        Cb = gemmlib.matmul(a, b, scale_a=sa, scale_b=sb)   # bf16, torch, on a's device
        assert Cb.dtype == torch.bfloat16 and Cb.device == a.device
        berr = float(torch.linalg.norm(Cb.double() - R) / torch.linalg.norm(R))
        assert berr <= fp8.tolerance(K, "bf16"), berr
