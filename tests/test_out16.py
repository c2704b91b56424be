"""16-bit outputs: ``gemmlib.matmul(A16, B16, out_dtype=...)`` returns the inputs' own type.

On Hopper the epilogue of ``wgmma_ws`` (and ``wgmma_cluster``, ``wgmma_pingpong``,
``wgmma_store``, ``wgmma_split_k``) built with ``OUT="fp16"`` / ``"bf16"`` rounds each fp32
accumulator to nearest even and stores a thread's two adjacent columns as one 4-byte store;
every other kernel writes float32 into a buffer that one more kernel rounds into C
(``dispatch.run_rounded``, also where N is padded).  The simulator runs the
epilogue (the packed stores, and the element-wise fallback for a C that is not 4-byte
aligned), the rounded path, the API
(array types, ``out=``, refusals) and the choice of kernel; the GPU tests, torch tensors
against ``torch.matmul``, are run by the lead on an H100/H200.

Every check allows what the 16-bit result may differ from the float64 product by, per
element: the final rounding (2^-11 relative for fp16, 2^-8 for bf16) on top of the fp32
accumulation's bound (2 K eps32 (|A| @ |B|)).
"""

from __future__ import annotations

import numpy as np
import pytest

import gemmlib
from _reliability import EPS32, HOPPER, on_blocks, operands16
from gemmlib import backend, dispatch
from gemmlib import precision as P
from gemmlib.intrinsics import convert
from gemmlib.frontends.checks import out_name
from gemmlib.frontends.operand import Operand
from gemmlib.kernels import wgmma_async, wgmma_cluster, wgmma_pingpong, wgmma_ws
from gemmlib.paths.repeat import call_key
from gemmlib.runtime import select

sim_only = pytest.mark.skipif(not backend.SIMULATOR, reason="the simulator's twins")
#: unit roundoff of the final rounding to each 16-bit type
U16 = P.OUT16_ROUNDOFF
NAME = {"fp16": "float16", "bf16": "bfloat16"}
POISON = 0xFFFF   # NaN in fp16 and in bf16: an element nobody writes shows


def _bits(C) -> np.ndarray:
    """The uint16 bit patterns of a 16-bit result (NumPy/CuPy float16, BF16Array, torch)."""
    if isinstance(C, P.BF16Array):
        C = C.bits
    if type(C).__module__.startswith("torch"):
        import torch

        return C.detach().cpu().view(torch.int16).numpy().view(np.uint16)
    return np.asarray(backend.to_host(C)).view(np.uint16)


def _values(C, prec: str) -> np.ndarray:
    b = _bits(C)
    return (b.view(np.float16) if prec == "fp16" else P.bf16_bits_to_float32(b)).astype(
        np.float64)


def _round16(C32, prec: str) -> np.ndarray:
    """float32 values rounded to nearest even, as bits: what the epilogue must write."""
    C32 = np.asarray(backend.to_host(C32), np.float32)
    return C32.astype(np.float16).view(np.uint16) if prec == "fp16" else P.to_bf16_bits(C32)


def check16(C, prec: str, a64, b64, what=""):
    """Every element written, within the final rounding plus the fp32 accumulation's bound
    of the float64 product."""
    got, ref = _values(C, prec), a64 @ b64
    assert got.shape == ref.shape, (what, got.shape, ref.shape)
    assert np.isfinite(got).all(), (what, "unwritten", int((~np.isfinite(got)).sum()))
    K = a64.shape[1]
    acc = 2.0 * max(K, 1) * EPS32 * (np.abs(a64) @ np.abs(b64))
    bound = U16[prec] * np.abs(ref) + (1 + U16[prec]) * acc + 2.0 ** -25
    worst = float((np.abs(got - ref) / bound).max())
    assert worst <= 1.0, (what, prec, worst)


# --------------------------------------------------------------------------- conversions


#: float32 values at the edges of both formats: ties to even, overflow, subnormals,
#: signed zeros, Inf and NaN
SPECIAL = np.array([0.0, -0.0, 1.0, -1.0, 1 + 2 ** -11, 1 + 3 * 2 ** -11, 1 + 2 ** -8,
                    1 + 3 * 2 ** -8, 1 + 2 ** -8 + 2 ** -20, 65504.0, 65519.0, 65520.0, 1e5,
                    -1e5, 2 ** -24, 2 ** -25, 3 * 2 ** -26, 2 ** -14 - 2 ** -25, 1e-30, 3e38,
                    3.4e38, np.inf, -np.inf, np.nan, 0.1, -0.3, 1 / 3], np.float32)


def test_conversion_twins_round_to_nearest_even_as_torch_does():
    torch = pytest.importorskip("torch")
    x = np.concatenate([SPECIAL, np.random.default_rng(0).standard_normal(2000).astype(
        np.float32) * np.float32(2.0) ** np.arange(-30, 20, 0.025, np.float32)[:2000]])
    t = torch.from_numpy(x)
    for twin, dt in ((convert.float_to_half_py, torch.float16),
                     (convert.float_to_bf16_py, torch.bfloat16)):
        got = np.array([twin(v) for v in x], np.uint16)
        want = t.to(dt).view(torch.int16).numpy().view(np.uint16)
        nan = np.isnan(x)
        assert (got[~nan] == want[~nan]).all(), (twin.__name__, x[~nan][got[~nan] != want[~nan]])
        assert all(type(twin(v)) is np.uint16 for v in SPECIAL)
    h = np.array([convert.float_to_half_py(v) for v in x[np.isnan(x)]], np.uint16)
    b = np.array([convert.float_to_bf16_py(v) for v in x[np.isnan(x)]], np.uint16)
    assert np.isnan(h.view(np.float16)).all() and np.isnan(P.bf16_bits_to_float32(b)).all()


if not backend.SIMULATOR:
    from gemmlib.backend import cuda

    @cuda.jit
    def _k_narrow(x, h, b):
        i = cuda.grid(1)
        if i < x.shape[0]:
            h[i] = convert.float_to_half(x[i])
            b[i] = convert.float_to_bf16(x[i])


@pytest.mark.gpu
def test_conversion_intrinsics_match_their_twins_gpu():
    x = np.concatenate([SPECIAL, np.random.default_rng(1).standard_normal(4096).astype(
        np.float32) * np.float32(1e3)])
    h, b = cuda.device_array(x.size, np.uint16), cuda.device_array(x.size, np.uint16)
    _k_narrow[(x.size + 127) // 128, 128](cuda.to_device(x), h, b)
    h, b = h.copy_to_host(), b.copy_to_host()
    nan = np.isnan(x)
    for got, twin in ((h, convert.float_to_half_py), (b, convert.float_to_bf16_py)):
        want = np.array([twin(v) for v in x], np.uint16)
        assert (got[~nan] == want[~nan]).all(), twin.__name__
    assert np.isnan(h[nan].view(np.float16)).all()
    assert np.isnan(P.bf16_bits_to_float32(b[nan])).all()


# --------------------------------------------------------------------------- the builds


def test_builds_names_and_argument_types():
    for prec, base in (("fp16", "wgmma_ws"), ("bf16", "wgmma_ws_bf16")):
        s = dispatch.with_out(dispatch.get_spec("wgmma_ws", prec), prec)
        assert s.name == base + "_o16" and s.params["OUT"] == prec
        assert s.arg_dtypes == ("uint16", "uint16", "uint16") and s.out_dtype == "uint16"
        assert s.dtype == NAME[prec] and s.precision == prec
        assert any("cvt" in p for p in s.ptx_must) and r"st\.global\.v2\.u16" in s.ptx_must
    assert wgmma_ws.SPEC.name == "wgmma_ws" and "OUT" not in wgmma_ws.SPEC.params
    assert wgmma_ws.SPEC.out_dtype == "float32"
    assert wgmma_ws.build(BM=64, OUT="fp16").name == "wgmma_ws_64x256_s3_o16"
    assert wgmma_pingpong.build("bf16", OUT="bf16").name == "wgmma_pingpong_bf16_o16"
    assert wgmma_cluster.build(OUT="fp16").name == "wgmma_cluster_o16"
    for bad in (dict(precision="fp16", OUT="bf16"), dict(precision="bf16", OUT="fp16"),
                dict(precision="fp16", OUT="fp64")):
        with pytest.raises(ValueError, match="OUT must be"):
            wgmma_ws.build(**bad)
    # a rung without a 16-bit epilogue keeps its float32 spec (matmul rounds its result)
    mp = dispatch.get_spec("mma_pipeline", "fp16")
    assert dispatch.with_out(mp, "fp16") is mp
    # the float32 epilogue's source is the one store_source writes by default
    k_tile, store = wgmma_async.warpgroup_code("fp16", 64, 1)
    assert store.__source__ == wgmma_async.store_source(64, 1)
    _, store16 = wgmma_async.warpgroup_code("bf16", 64, 1, "bf16")
    assert "to16(acc[4 * j])" in store16.__source__ and "store2_u16(" in store16.__source__


# --------------------------------------------------------------------------- the epilogue


def _raw16(prec, M, N, K, seed):
    A, B, a64, b64 = operands16(prec, M, N, K, np.random.default_rng(seed))
    bits = [x.bits if isinstance(x, P.BF16Array) else x.view(np.uint16) for x in (A, B)]
    return A, B, bits[0], bits[1], a64, b64


@sim_only
@pytest.mark.parametrize("prec, shape, misaligned", [
    ("fp16", (67, 72, 72), False),    # packed 4-byte stores; M odd, two k-tiles
    ("bf16", (45, 64, 72), True),     # C 2 bytes off 4-byte alignment: element-wise stores
])
def test_epilogue_rounds_the_fp32_result(prec, shape, misaligned):
    """The 16-bit C is exactly the float32 build's C rounded to nearest even, every element
    written (on 2 persistent blocks, so the tile walks interleave)."""
    M, N, K = shape
    _, _, Ab, Bb, a64, b64 = _raw16(prec, M, N, K, seed=M)
    spec16 = on_blocks(wgmma_ws.build(prec, BM=64, BN=64, STAGES=2, OUT=prec), 2)
    spec32 = on_blocks(wgmma_ws.build(prec, BM=64, BN=64, STAGES=2), 2)
    buf = np.full(M * N + 2, POISON, np.uint16)
    C16 = buf[1:M * N + 1].reshape(M, N) if misaligned else buf[:M * N].reshape(M, N)
    assert (C16.ctypes.data % 4 != 0) == misaligned
    dispatch.launch(spec16, Ab, Bb, C16, M, N, K)
    C32 = np.full((M, N), np.nan, np.float32)
    dispatch.launch(spec32, Ab, Bb, C32, M, N, K)
    assert np.array_equal(C16, _round16(C32, prec))
    assert buf[-1] == POISON and (misaligned or buf[-2] == POISON)   # nothing past C
    check16(C16, prec, a64, b64)


@sim_only
@pytest.mark.parametrize("build, prec", [
    (lambda p: wgmma_pingpong.build(p, BM=64, BN=64, STAGES=2, OUT=p), "bf16"),
    (lambda p: wgmma_cluster.build(p, BM=64, BN=64, STAGES=2, CM=1, OUT=p), "fp16")])
def test_pingpong_and_cluster_write_16_bits(build, prec):
    M, N, K = 100, 29, 72          # gemmlib.matmul pads N to 32 and drops the padding
    A, B, _, _, a64, b64 = _raw16(prec, M, N, K, seed=3)
    C = gemmlib.matmul(A, B, kernel=on_blocks(build(prec), 2), out_dtype=prec)
    assert dispatch.rung_of(build(prec)) in dispatch.OUT16_RUNGS
    check16(C, prec, a64, b64)


# --------------------------------------------------------------------------- gemmlib.matmul


@sim_only
def test_named_wgmma_ws_writes_the_inputs_type_through_matmul():
    """Odd N: the padded kernel C is 16-bit too and its valid columns are copied."""
    M, N, K = 37, 29, 53
    A, B, _, _, a64, b64 = _raw16("fp16", M, N, K, seed=5)
    spec = on_blocks(wgmma_ws.build("fp16", BM=64, BN=64, STAGES=2, OUT="fp16"), 2)
    C = gemmlib.matmul(A, B, kernel=spec)   # a spec built with OUT: its type by default
    assert isinstance(C, np.ndarray) and C.dtype == np.float16 and C.shape == (M, N)
    check16(C, "fp16", a64, b64)
    with pytest.raises(ValueError, match="writes float16, not float32"):
        gemmlib.matmul(A, B, kernel=spec, out_dtype="float32")


@sim_only
@pytest.mark.parametrize("prec, out_dtype, M", [("fp16", "fp16", 19), ("fp16", np.float16, 8),
                                                ("bf16", "bfloat16", 8)])
def test_auto_casts_where_no_epilogue_writes_16_bits(prec, out_dtype, M):
    """The simulator's "auto" is mma_pipeline (no 16-bit epilogue: float32, then one
    rounding kernel) or skinny at M <= 8 (its own 16-bit store): either way the float32
    call's result rounded, bit for bit."""
    N, K = 24, 40
    A, B, _, _, a64, b64 = _raw16(prec, M, N, K, seed=7)
    C = gemmlib.matmul(A, B, out_dtype=out_dtype)
    assert isinstance(C, P.BF16Array if prec == "bf16" else np.ndarray)
    assert np.array_equal(_bits(C), _round16(gemmlib.matmul(A, B, out_dtype=np.float32), prec))
    check16(C, prec, a64, b64)


@sim_only
def test_out_arrays_of_16_bits_are_written_in_place():
    M, N, K = 8, 16, 24
    A, B, _, _, a64, b64 = _raw16("fp16", M, N, K, seed=11)
    out = np.full((M, N), np.nan, np.float16)
    assert gemmlib.matmul(A, B, out=out) is out
    check16(out, "fp16", a64, b64)
    out[...] = np.nan
    assert gemmlib.matmul(A, B, out=out, out_dtype="half") is out
    check16(out, "fp16", a64, b64)
    Ab, Bb, _, _, a64, b64 = _raw16("bf16", M, N, K, seed=12)
    outb = P.BF16Array(np.full((M, N), POISON, np.uint16))
    assert gemmlib.matmul(Ab, Bb, out=outb) is outb
    check16(outb, "bf16", a64, b64)


@sim_only
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_torch_cpu_tensors_come_back_in_their_own_type(dtype):
    torch = pytest.importorskip("torch")
    prec = "fp16" if dtype == "float16" else "bf16"
    g = torch.Generator().manual_seed(2)
    A = (torch.rand(8, 20, generator=g) * 2 - 1).to(getattr(torch, dtype))
    B = (torch.rand(20, 11, generator=g) * 2 - 1).to(getattr(torch, dtype))
    a64, b64 = A.double().numpy(), B.double().numpy()
    C = gemmlib.matmul(A, B, out_dtype=getattr(torch, dtype))
    assert isinstance(C, torch.Tensor) and C.dtype == getattr(torch, dtype)
    check16(C, prec, a64, b64)
    out = torch.full((8, 11), float("nan"), dtype=getattr(torch, dtype))
    assert gemmlib.matmul(A, B, out=out) is out
    check16(out, prec, a64, b64)
    assert gemmlib.matmul(A, B).dtype == getattr(torch, dtype)   # the default: the inputs' type
    assert gemmlib.matmul(A, B, out_dtype=torch.float32).dtype == torch.float32


def test_refusals_name_the_rule():
    A16, B16 = np.ones((4, 8), np.float16), np.ones((8, 8), np.float16)
    Ab, Bb = P.to_bf16(np.ones((4, 8), np.float32)), P.to_bf16(np.ones((8, 8), np.float32))
    A32, B32 = np.ones((4, 8), np.float32), np.ones((8, 8), np.float32)
    for bad in ("float64", np.float64, "int8", "same", "fp8"):
        with pytest.raises(ValueError, match="out_dtype must be float32 or the inputs'"):
            gemmlib.matmul(A16, B16, out_dtype=bad)
    with pytest.raises(TypeError, match="out_dtype=float16 needs float16 inputs"):
        gemmlib.matmul(Ab, Bb, out_dtype="fp16")
    with pytest.raises(TypeError, match="out_dtype=bfloat16 needs bfloat16 inputs"):
        gemmlib.matmul(A16, B16, out_dtype="bf16")
    for prec in (None, "tf32", "3xtf32"):
        with pytest.raises(TypeError, match="needs float16 inputs"):
            gemmlib.matmul(A32, B32, precision=prec, out_dtype=np.float16)
    with pytest.raises(TypeError, match="a product of bfloat16 inputs is written as float32"):
        gemmlib.matmul(Ab, Bb, out=np.zeros((4, 8), np.float16))
    with pytest.raises(TypeError, match="out holds float32, but out_dtype is float16"):
        gemmlib.matmul(A16, B16, out=np.zeros((4, 8), np.float32), out_dtype="fp16")
    with pytest.raises(TypeError, match="out has dtype float16"):   # float32 inputs
        gemmlib.matmul(A32, B32, out=np.zeros((4, 8), np.float16))
    with pytest.raises(ValueError, match="scale_a and scale_b apply to FP8"):
        gemmlib.matmul(A16, B16, scale_a=2.0)
    assert gemmlib.matmul(A32, B32, out_dtype="float32").dtype == np.float32


def test_call_keys_and_choices_include_the_output_type():
    a = Operand(object(), (8, 16), np.dtype(np.float16), True, on_host=False, ptr=0x1000,
                nbytes=256, device=0, kind="cupy")
    b = Operand(object(), (16, 24), np.dtype(np.float16), True, on_host=False,
                ptr=0x9000, nbytes=768, device=0, kind="cupy")
    k = call_key(a, b, None, None, None)
    assert k == call_key(a, b, None, None, None, None)
    assert k != call_key(a, b, None, None, None, "float16")
    assert (call_key(a, b, None, None, None, "float16")
            != call_key(a, b, None, None, None, "float32"))
    # names of the output type, one per element type (cached, cheap per call)
    assert {out_name(x) for x in ("fp16", "float16", "half", np.float16,
                                  np.dtype(np.float16))} == {"float16"}
    assert {out_name(x) for x in ("bf16", "bfloat16")} == {"bfloat16"}


def test_hopper_auto_writes_16_bits_in_the_kernel(monkeypatch):
    """On an H100/H200 (faked here) "auto" with a 16-bit out runs wgmma_store (four stages,
    the tile staged in two halves) built with OUT where wgmma_split_k keeps one slice with a
    128-row tile, wgmma_split_k built with OUT where it cuts K (the last slice rounds the
    sum), and at up to 64 tokens the swap-AB rung built with OUT."""
    import dataclasses

    fake = dataclasses.replace(backend.device_info(), compute_capability=(9, 0), sm_count=132)
    monkeypatch.setattr(backend, "device_info", lambda *a: fake)
    monkeypatch.setattr(select, "SIMULATOR", False)
    select._CHOICES.clear()
    try:
        for prec in ("fp16", "bf16"):
            big = dispatch.select_tc(prec, 4096, 4096, 4096, out=prec)
            assert big.name == wgmma_async.rung_name("wgmma_store", prec, False, 128, 256, 4,
                                                     8) + "_o16_p2"
            assert (big.params["STAGES"], big.params["PIECES"]) == (4, 2)
            assert big.out_dtype == "uint16"
            assert dispatch.select_tc(prec, 4096, 4096, 4096).name.startswith("wgmma_split_k")
            small = dispatch.select_tc(prec, 128, 4096, 4096, out=prec)   # 32 tiles: split K
            assert small.name.startswith("wgmma_split_k") and small.name.endswith("_o16")
            assert small.out_dtype == "uint16" and small.params["OUT"] == prec
            assert small.params["BM"] == dispatch.select_tc(prec, 128, 4096, 4096).params["BM"]
            wide = dispatch.select_tc(prec, 128, 32768, 1024, out=prec)   # 256 tiles
            assert wide.out_dtype == "uint16" and dispatch.rung_of(wide) == "wgmma_store"
            for M in (1, 64):   # swap-AB, its epilogue writing the 16-bit C
                few = dispatch.select_tc(prec, M, 4096, 4096, out=prec)
                assert dispatch.rung_of(few) == "wgmma_swap" and few.out_dtype == "uint16"
                assert few.params["OUT"] == prec and "_o16" in few.name
    finally:
        select._CHOICES.clear()


@sim_only
@pytest.mark.parametrize("prec", ["fp16", "bf16"])
def test_split_k_slices_round_once(prec):
    """wgmma_split_k with OUT over 3 slices (one k-tile each, the last short): the last
    slice's thread writes the float32 build's sum rounded to nearest even, bit for bit,
    every element."""
    from gemmlib.kernels import wgmma_split_k

    M, N, K = 67, 72, 136
    A, B, _, _, a64, b64 = _raw16(prec, M, N, K, seed=9)
    spec16 = on_blocks(wgmma_split_k.build(prec, BM=64, BN=64, STAGES=2, SPLITS=3, OUT=prec), 2)
    spec32 = on_blocks(wgmma_split_k.build(prec, BM=64, BN=64, STAGES=2, SPLITS=3), 2)
    assert "_k3_o16" in spec16.name and spec16.out_dtype == "uint16"
    C16 = gemmlib.matmul(A, B, kernel=spec16)     # a spec built with OUT: its type
    C32 = gemmlib.matmul(A, B, kernel=spec32, out_dtype=np.float32)
    assert np.array_equal(_bits(C16), _round16(C32, prec))
    check16(C16, prec, a64, b64)


@sim_only
@pytest.mark.parametrize("prec, splits", [("fp16", 3), ("bf16", 1)])
def test_rounded_path_sums_the_slices_then_rounds(prec, splits):
    """A rung without a 16-bit epilogue (mma_split_k, K in ``splits`` slices): its float32
    partials, added in slice order and rounded by split_k.REDUCE16 -- the float32 call's
    result rounded, bit for bit, into a poisoned C, nothing written past it."""
    from gemmlib.kernels import mma_split_k

    M, N, K = 9, 8, 48
    A, B, _, _, a64, b64 = _raw16(prec, M, N, K, seed=13)
    spec = mma_split_k.build(prec, SPLITS=splits, BM=32, BN=32, BK=16, WM=32, WN=32, STAGES=2)
    assert dispatch.rung_of(spec) not in dispatch.OUT16_RUNGS
    assert dispatch.plan(spec, M, N, K).splits == splits
    buf = np.full(M * N + 1, POISON, np.uint16)
    out = buf[:M * N].reshape(M, N)
    out = out.view(np.float16) if prec == "fp16" else P.BF16Array(out)
    assert gemmlib.matmul(A, B, kernel=spec, out_dtype=prec, out=out) is out
    assert np.array_equal(_bits(out), _round16(gemmlib.matmul(A, B, kernel=spec, out_dtype=np.float32), prec))
    assert buf[-1] == POISON
    check16(out, prec, a64, b64)


@sim_only
@pytest.mark.parametrize("prec, splits", [("bf16", 3), ("fp16", 1)])
def test_skinny_writes_16_bits(prec, splits):
    """skinny with OUT, K in 3 slices (the last block of a slab rounds the slices' sum) and
    whole: the float32 build's result rounded, bit for bit, every element written."""
    from gemmlib.kernels import skinny

    M, N, K = 5, 40, 600
    A, B, _, _, a64, b64 = _raw16(prec, M, N, K, seed=17)
    kw = dict(MT=4, CT=4, NT=16, U=2, SPLITS=splits)
    spec16, spec32 = skinny.build(prec, OUT=prec, **kw), skinny.build(prec, **kw)
    assert spec16.out_dtype == "uint16" and spec16.name.endswith("_o16")
    assert dispatch.plan(spec16, M, N, K).grid[2] == splits
    C16 = gemmlib.matmul(A, B, kernel=spec16)
    assert np.array_equal(_bits(C16), _round16(gemmlib.matmul(A, B, kernel=spec32, out_dtype=np.float32), prec))
    check16(C16, prec, a64, b64)


# --------------------------------------------------------------------------- the GPU


def _torch_pair(M, N, K, dtype, seed=0):
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)
    A = (torch.rand(M, K, device="cuda", generator=g) * 2 - 1).to(dtype)
    B = (torch.rand(K, N, device="cuda", generator=g) * 2 - 1).to(dtype)
    return A, B


def _check_torch16(C, A, B, prec, what=""):
    """C (torch, 16-bit) against float64 on the GPU, per element as check16."""
    import torch

    ref = A.double() @ B.double()
    acc = 2.0 * max(A.shape[1], 1) * EPS32 * (A.double().abs() @ B.double().abs())
    bound = U16[prec] * ref.abs() + (1 + U16[prec]) * acc + 2.0 ** -25
    got = C.double()
    assert bool(torch.isfinite(got).all()), (what, "unwritten")
    worst = float(((got - ref).abs() / bound).max())
    assert worst <= 1.0, (what, prec, worst)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_torch_4096_cubed_matches_torch_matmul_gpu(dtype):
    """torch.matmul's convention at 4096^3: a 16-bit tensor written by the kernel itself
    (wgmma_store, 4 stages, on an H100/H200), within one rounding of torch.matmul's result."""
    torch = pytest.importorskip("torch")
    td = getattr(torch, dtype)
    prec = "fp16" if dtype == "float16" else "bf16"
    A, B = _torch_pair(4096, 4096, 4096, td, seed=1)
    C = gemmlib.matmul(A, B, out_dtype=td)
    assert C.dtype == td and C.device == A.device and C.shape == (4096, 4096)
    if HOPPER:
        assert dispatch.select_tc(prec, 4096, 4096, 4096, out=prec).out_dtype == "uint16"
    _check_torch16(C, A, B, prec, "4096^3")
    R = torch.matmul(A, B)                # cuBLAS: another summation order, same rounding
    diff = float((C.float() - R.float()).abs().max() / R.float().abs().max())
    assert diff <= 2 * U16[prec] + P.tolerance(prec, 4096), diff
    again = gemmlib.matmul(A, B, out_dtype=td)          # the short path: same plan, same bits
    torch.cuda.synchronize()
    assert again.dtype == td and torch.equal(again, C)
    out = torch.full_like(C, float("nan"))
    assert gemmlib.matmul(A, B, out=out) is out
    torch.cuda.synchronize()
    assert torch.equal(out, C)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("shape", [(4095, 3073, 2047), (129, 127, 65), (1, 4096, 4096),
                                   (64, 4096, 4096), (1000, 1000, 1000), (3, 6144, 4096),
                                   (16, 4096, 14336), (1, 4099, 4096)])
def test_torch_odd_shapes_gpu(dtype, shape):
    """Odd shapes through "auto" (on Hopper: wgmma_store or wgmma_ws with OUT, wgmma_split_k
    with OUT where K is cut, skinny rounded by run_rounded at decode; elsewhere the rounded
    path), into a poisoned out and a fresh tensor; a repeat takes the short path and
    writes the same bits."""
    torch = pytest.importorskip("torch")
    td = getattr(torch, dtype)
    prec = "fp16" if dtype == "float16" else "bf16"
    M, N, K = shape
    A, B = _torch_pair(M, N, K, td, seed=sum(shape))
    C = gemmlib.matmul(A, B, out_dtype=td)
    assert C.dtype == td and C.shape == (M, N)
    _check_torch16(C, A, B, prec, shape)
    out = torch.full((M, N), float("nan"), dtype=td, device="cuda")
    gemmlib.matmul(A, B, out=out)
    _check_torch16(out, A, B, prec, shape)
    for _ in range(2):
        again = gemmlib.matmul(A, B, out_dtype=td)
        torch.cuda.synchronize()
        assert torch.equal(again, C), shape


@pytest.mark.gpu
@pytest.mark.parametrize("rung", ["wgmma_ws", "wgmma_cluster", "wgmma_pingpong", "wgmma_store"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_named_hopper_rungs_write_16_bits_gpu(rung, dtype):
    if not HOPPER:
        pytest.skip("wgmma needs an H100/H200")
    torch = pytest.importorskip("torch")
    td = getattr(torch, dtype)
    prec = "fp16" if dtype == "float16" else "bf16"
    assert dispatch.with_out(dispatch.get_spec(rung, prec), prec).out_dtype == "uint16"
    # (200, 264, 136): no padding, so the misaligned C below reaches the element-wise stores
    for i, (M, N, K) in enumerate([(1, 1, 1), (37, 29, 53), (257, 255, 65), (200, 264, 136),
                                   (1025, 513, 4097), (4095, 3073, 2047)]):
        A, B = _torch_pair(M, N, K, td, seed=i)
        out = torch.full((M, N), float("nan"), dtype=td, device="cuda")
        gemmlib.matmul(A, B, kernel=rung, out=out)
        _check_torch16(out, A, B, prec, (rung, M, N, K))
        # a C 2 bytes off 4-byte alignment: the element-wise stores
        buf = torch.full((M * N + 1,), float("nan"), dtype=td, device="cuda")
        odd = buf[1:].view(M, N)
        gemmlib.matmul(A, B, kernel=rung, out=odd)
        _check_torch16(odd, A, B, prec, (rung, M, N, K, "misaligned"))


@pytest.mark.gpu
@pytest.mark.parametrize("rung", ["mma_pipeline", "mma_split_k", "skinny"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_named_rungs_without_or_with_own_16_bit_store_gpu(rung, dtype):
    """A named rung with a 16-bit ``out_dtype`` on any GPU: mma_pipeline and mma_split_k
    write float32 that dispatch.run_rounded's kernel rounds into C (the split one adds its
    slices there), also where N is padded (N = 29); skinny rounds in its own store
    (its slices added by the last block).  Poisoned out, fresh tensor, and the short path
    twice (the same bits)."""
    torch = pytest.importorskip("torch")
    td = getattr(torch, dtype)
    prec = "fp16" if dtype == "float16" else "bf16"
    spec = dispatch.with_out(dispatch.get_spec(rung, prec), prec)
    assert (spec.out_dtype == "uint16") == (rung == "skinny")
    shapes = ([(1, 1, 1), (3, 4096, 4096), (16, 520, 1100), (5, 29, 300)] if rung == "skinny"
              else [(1, 1, 1), (37, 64, 300), (129, 256, 4096), (200, 264, 136), (65, 29, 72)])
    for i, (M, N, K) in enumerate(shapes):
        A, B = _torch_pair(M, N, K, td, seed=40 + i)
        out = torch.full((M, N), float("nan"), dtype=td, device="cuda")
        gemmlib.matmul(A, B, kernel=rung, out=out)
        _check_torch16(out, A, B, prec, (rung, M, N, K))
        C = gemmlib.matmul(A, B, kernel=rung, out_dtype=td)
        for _ in range(2):
            again = gemmlib.matmul(A, B, kernel=rung, out_dtype=td)
            torch.cuda.synchronize()
            assert torch.equal(again, C) and torch.equal(out, C), (rung, M, N, K)


@pytest.mark.gpu
def test_cupy_float16_out_dtype_gpu():
    cp = pytest.importorskip("cupy")
    rng = np.random.default_rng(4)
    A = cp.asarray(rng.uniform(-1, 1, (300, 200)).astype(np.float16))
    B = cp.asarray(rng.uniform(-1, 1, (200, 264)).astype(np.float16))
    C = gemmlib.matmul(A, B, out_dtype=cp.float16)
    assert isinstance(C, cp.ndarray) and C.dtype == cp.float16
    check16(C, "fp16", cp.asnumpy(A).astype(np.float64), cp.asnumpy(B).astype(np.float64))
    Ab = P.to_bf16(cp.asarray(rng.uniform(-1, 1, (300, 200)), dtype=cp.float32))
    Bb = P.to_bf16(cp.asarray(rng.uniform(-1, 1, (200, 264)), dtype=cp.float32))
    Cb = gemmlib.matmul(Ab, Bb, out_dtype="bf16")
    assert isinstance(Cb, P.BF16Array)
    check16(Cb, "bf16", *(cp.asnumpy(x.astype(np.float32)).astype(np.float64)
                          for x in (Ab, Bb)))


# --------------------------------------------------------------------------- the compile gate


def test_o16_builds_compile_for_sm_90a_without_local_memory():
    """The real compiler (offline, no GPU): the 16-bit epilogue's conversions and paired
    stores are in the PTX, and the accumulators stay in registers (no local memory, no
    spills) -- what the compile gate checks of the registered rungs -- for wgmma_ws and
    wgmma_split_k; run_rounded's kernels round with cvt.rn."""
    from _reliability import run_offline

    recs = run_offline(
        "import json\n"
        "from gemmlib import ptx\n"
        "from gemmlib.kernels import wgmma_ws\n"
        "out = []\n"
        "from gemmlib.kernels import wgmma_split_k, split_k\n"
        "from numba import cuda, types\n"
        "out = []\n"
        "for p in ('fp16', 'bf16'):\n"
        "    for s in (wgmma_ws.build(p, OUT=p), wgmma_split_k.build(p, BM=64, OUT=p)):\n"
        "        code = ptx.compile_ptx(s)\n"
        "        res = ptx.resources(code, arch='sm_90a')\n"
        "        out.append(dict(name=s.name, problems=ptx.problems(s, code, res), **res))\n"
        "    with ptx.offline_device((9, 0)):\n"
        "        code, _ = cuda.compile_ptx(split_k.REDUCE16[p].py_func,\n"
        "            (types.float32[:, ::1], types.uint16[:, ::1]), cc=(9, 0))\n"
        "    out.append(dict(name='reduce16_' + p, cvt=('cvt.rn.' + ('f16' if p == 'fp16' else\n"
        "        'bf16') + '.f32') in code, problems=[], spill_stores=0, stack_bytes=0))\n"
        "print(json.dumps(out))\n")
    assert [r["name"] for r in recs] == [
        "wgmma_ws_o16", "wgmma_split_k_64x256_s3_o16", "reduce16_fp16",
        "wgmma_ws_bf16_o16", "wgmma_split_k_bf16_64x256_s3_o16", "reduce16_bf16"]
    for r in recs:
        assert not r["problems"] and not r["spill_stores"] and not r["stack_bytes"], r
        assert r.get("cvt", True), r
