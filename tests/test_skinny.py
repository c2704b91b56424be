"""The decode rung (gemmlib.kernels.skinny): right on odd shapes in fp32, fp16 and bf16,
NaN/Inf like a plain fp32 dot product, deterministic split-K, 16-byte loads exactly when
B's rows are aligned, the dispatch's choice per M, and the compiler's view (PTX)."""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import gemmlib
from gemmlib import backend, dispatch
from gemmlib import precision as P
from gemmlib.intrinsics import convert
from gemmlib.intrinsics.vector import MisalignedAccess
from gemmlib.kernels import skinny
from gemmlib.runtime import launch, select

from _reliability import count_load16, precision_operands

PRECISIONS = ("fp32", "fp16", "bf16")
MS, NS, KS = (1, 2, 5, 16), (1, 7, 33, 130), (1, 3, 37, 260)
#: every M with every N, K rotating through its values (16 shapes a configuration)
ODD = [(M, N, KS[(a + b) % 4]) for (a, M), (b, N) in itertools.product(enumerate(MS),
                                                                          enumerate(NS))]
#: N a multiple of 8: B's rows are 16-byte aligned (the vector path) in every precision
ALIGNED = [(3, 64, 37), (16, 136, 19), (1, 8, 260)]


#: tests that watch or replace Python functions the kernel calls: the simulator only
sim_only = pytest.mark.skipif(not backend.SIMULATOR,
                              reason="replaces Python functions the simulated kernel calls")


def small(precision, **kw):
    """Few threads (the simulator runs each as a Python thread); MT=4 with M up to 16
    also runs several row blocks."""
    return skinny.build(precision, **{**dict(MT=4, CT=4, NT=8, U=2), **kw})


def _f64(x):
    return np.asarray(x.astype(np.float32) if isinstance(x, P.BF16Array) else x, np.float64)


# --------------------------------------------------------------------------- correctness


@pytest.mark.parametrize("precision", PRECISIONS)
def test_odd_shapes(precision):
    report = gemmlib.verify(small(precision), ODD, seed=11)
    assert report.ok and len(report.checks) == len(ODD), str(report)


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("kw", [dict(MT=2, CT=2, NT=6, U=3), dict(MT=16, CT=2, NT=4, U=1)],
                         ids=["mt2_kt3", "mt16"])
def test_other_configurations(precision, kw):
    """MT < 4 (scalar reads of the staged A), an odd group count, MT = 16 (one pass)."""
    shapes = [(5, 33, 37), (16, 7, 260), (1, 16, 3)]
    report = gemmlib.verify(small(precision, **kw), shapes, seed=5)
    assert report.ok, str(report)


@sim_only
@pytest.mark.parametrize("precision", PRECISIONS)
def test_aligned_rows_take_16_byte_loads(monkeypatch, precision):
    """load16 reads B exactly when its rows are 16-byte aligned (N % VEC == 0)."""
    calls = count_load16(monkeypatch)
    spec = small(precision)                     # built now: it calls the counting load16
    assert gemmlib.verify(spec, ALIGNED, seed=2).ok
    assert calls
    calls.clear()
    assert gemmlib.verify(spec, [(3, 63, 37), (2, 9, 5)], seed=2).ok
    assert not calls


@sim_only
def test_misaligned_B_takes_the_scalar_path(monkeypatch):
    """A B whose base pointer the kernel finds misaligned is read with scalar loads."""
    seen = []

    def aligned16(arr):
        seen.append(arr.shape)
        return False

    monkeypatch.setattr(skinny, "aligned16", aligned16)
    spec = small("fp16")
    rng = np.random.default_rng(3)
    A, B = precision_operands("fp16", 3, 64, 20, rng)
    C = gemmlib.matmul(A, B, kernel=spec, out_dtype=np.float32)
    np.testing.assert_allclose(C, _f64(A) @ _f64(B), rtol=1e-5, atol=1e-5)
    assert seen


def test_k_zero_and_default_spec():
    assert gemmlib.verify(small("bf16"), [(3, 5, 0)]).checks[0].rel_error == 0.0
    spec = skinny.SPEC
    assert spec.name == "skinny" and spec.precision == "fp16" and spec.chapter == "18b-decode"
    assert spec.tile == (skinny.MMAX, 32 * 8) and spec.operand_align == 0
    assert "skinny" in gemmlib.list_kernels()


# --------------------------------------------------------------------------- NaN and Inf


def _plain_dot(A, B):
    """float64 products summed one by one: IEEE semantics for NaN and Inf."""
    A, B = _f64(A), _f64(B)
    return (A[:, :, None] * B[None, :, :]).sum(axis=1)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")   # NumPy on Inf * 0 (simulator)
@pytest.mark.parametrize("precision", PRECISIONS)
def test_nan_and_inf_propagate_like_a_dot_product(precision):
    M, N, K = 3, 13, 21          # MT=4: a zero row past M; N % 8 != 0: a partial chunk
    rng = np.random.default_rng(7)
    A = rng.uniform(-1, 1, (M, K)).astype(np.float32)
    B = rng.uniform(-1, 1, (K, N)).astype(np.float32)
    A[1, 4] = np.nan             # row 1 of C: all NaN
    B[9, 12] = np.inf            # column 12 (the last, in the tail chunk): +-Inf
    B[2, 3] = -np.inf
    A[2, 2] = 0.0                # 0 * -Inf: NaN at C[2, 3]
    A[0, 17] = np.inf            # row 0: +-Inf everywhere, NaN where it meets B's Infs
    if precision == "fp16":
        A, B = A.astype(np.float16), B.astype(np.float16)
    elif precision == "bf16":
        A, B = P.to_bf16(A), P.to_bf16(B)
    ref = _plain_dot(A, B)
    C = gemmlib.matmul(A, B, kernel=small(precision), out_dtype=np.float32)
    np.testing.assert_array_equal(np.isnan(C), np.isnan(ref))
    np.testing.assert_array_equal(np.isposinf(C), np.isposinf(ref))
    np.testing.assert_array_equal(np.isneginf(C), np.isneginf(ref))
    fin = np.isfinite(ref)
    assert fin.sum() > 10 and not np.isnan(ref).all()
    np.testing.assert_allclose(C[fin], ref[fin], rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------- split-K


@pytest.mark.parametrize("precision, S", [("fp16", 3), ("bf16", 6), ("fp32", 9), ("fp16", 17)])
def test_split_k_is_right_and_bit_identical(precision, S):
    """The last block loads SB = 16 slices before adding them in order: S = 17 takes two
    such batches."""
    M, N, K = 5, 33, 260
    spec = small(precision, SPLITS=S)
    p = dispatch.plan(spec, M, N, K)
    KG = (spec.threads // spec.params["CT"]) * spec.params["U"]
    # one launch: the slices' sum is the last block's, not a second kernel's
    assert p.grid[2] == S == skinny.effective_splits(S, K, KG) and p.splits == 1
    assert p.workspace == ((S * M, N, "float32"), (p.grid[0], p.grid[1], "int32"))
    rng = np.random.default_rng(1)
    A, B = precision_operands(precision, M, N, K, rng)
    C1 = gemmlib.matmul(A, B, kernel=spec, out_dtype=np.float32)
    C2 = gemmlib.matmul(A, B, kernel=spec, out_dtype=np.float32)
    assert C1.tobytes() == C2.tobytes()
    # the kernel itself, twice on one workspace: the tickets are back at zero after each
    # launch, and the sum is the slices' in slice order (as split-K's reduction adds them)
    bits = [getattr(x, "bits", x) for x in (A, B)]
    bits = [x.view(np.uint16) if x.dtype.itemsize == 2 else x for x in bits]
    W, L = np.full((S * M, N), np.nan, np.float32), np.zeros(p.grid[:2], np.int32)
    for _ in range(2):
        C = np.full((M, N), np.nan, np.float32)
        spec.kernel[p.grid, p.block, 0](bits[0], bits[1], C, W, L)
        assert not L.any() and C.tobytes() == C1.tobytes()
    want = W[:M]
    for z in range(1, S):
        want = want + W[z * M:(z + 1) * M]   # float32 adds, slice order
    assert np.array_equal(C1, want)
    err = backend.relative_error(C1, _f64(A) @ _f64(B))
    assert err <= P.tolerance(precision, K), err
    # the unsplit kernel sums in another order: close, and also right
    C0 = gemmlib.matmul(A, B, kernel=small(precision), out_dtype=np.float32)
    assert backend.relative_error(C0, _f64(C1)) <= P.tolerance("fp32", K)


@pytest.mark.parametrize("precision", PRECISIONS)
def test_group_sums_and_pipelined_loads_keep_the_bits(monkeypatch, precision):
    """Every thread reads the same rows of B in the same order whatever the chunking of A
    (KC is a multiple of KT x U) and whether its loads are double-buffered (PIPE), and the
    groups' sums are always added in group order, however many fit in shared memory at
    once (G): so all of these give the same bits."""
    M, N, K = 6, 45, 300
    rng = np.random.default_rng(4)
    A, B = precision_operands(precision, M, N, K, rng)
    kw = dict(MT=4, CT=4, NT=16, U=2)
    base = gemmlib.matmul(A, B, kernel=skinny.build(precision, **kw), out_dtype=np.float32)
    assert backend.relative_error(base, _f64(A) @ _f64(B)) <= P.tolerance(precision, K)
    piped = gemmlib.matmul(A, B, kernel=skinny.build(precision, PIPE=1, **kw), out_dtype=np.float32)
    assert piped.tobytes() == base.tobytes()
    BN = 4 * skinny.VEC[precision]
    for groups in (2, 1):   # staging areas that hold 2 and 1 groups' MT x BN sums: G < KT = 4
        monkeypatch.setattr(skinny, "A_SHARED_BYTES", 4 * groups * 4 * BN)
        skinny._code.cache_clear()
        spec = skinny.build(precision, **kw)
        assert spec.shared_bytes == 4 * groups * 4 * BN
        assert gemmlib.matmul(A, B, kernel=spec, out_dtype=np.float32).tobytes() == base.tobytes()
    skinny._code.cache_clear()


def test_slices_cover_k_once():
    for K, S, KG in [(260, 3, 16), (1, 4, 16), (1000, 7, 32), (4096, 16, 32), (33, 5, 8)]:
        sl = skinny.k_slices(K, skinny.effective_splits(S, K, KG), KG)
        covered = [k for a, b in sl for k in range(a, b)]
        assert covered == list(range(K)) and all(b > a for a, b in sl)


def test_split_count_model():
    h100 = dataclasses.replace(backend.device_info(), sm_count=132)
    # qkv of Llama 3.1 8B at decode: 24 slabs of 256 columns for 132 SMs -> split
    s = skinny.splits_for(1, 6144, 4096, 1, 256, 256, 32, 2, h100)
    assert 4 <= s <= skinny.MAX_SPLITS
    # gate_up of Qwen2.5 72B: 231 slabs already fill the GPU
    assert skinny.splits_for(1, 59136, 8192, 1, 256, 256, 32, 2, h100) == 1
    # shallow K: no slice would be MIN_SLICE_K deep
    assert skinny.splits_for(1, 256, 300, 1, 256, 256, 32, 2, h100) == 1
    # the workspace's traffic stays below WORKSPACE_SHARE of B's bytes
    for M in (1, 8, 16):
        S = skinny.splits_for(M, 4096, 4096, skinny.rows_for(M), 256, 256, 32, 2, h100)
        assert S == 1 or 8 * S * M <= skinny.WORKSPACE_SHARE * 4096 * 2


# --------------------------------------------------------------------------- dispatch


def test_dispatch_picks_skinny_for_decode_sizes():
    dispatch.clear_memory_caches()
    try:
        for prec in ("fp16", "bf16", "tf32", "3xtf32"):
            for M in (1, 3, dispatch.skinny_limit(prec)):
                s = dispatch.select_tc(prec, M, 4096, 4096)
                assert s.module == skinny.__name__
                assert s.precision == (prec if prec in ("fp16", "bf16") else "fp32")
                assert s.params["MT"] == skinny.rows_for(M) >= M
            above = dispatch.select_tc(prec, dispatch.skinny_limit(prec) + 1, 4096, 4096)
            assert above.module != skinny.__name__ and above.precision == prec
        for M in (1, dispatch.SKINNY_FP32_MMAX):
            assert dispatch.select(M, 4096, 4096).module == skinny.__name__
        assert dispatch.select(dispatch.SKINNY_FP32_MMAX + 1, 4096, 4096).module != \
            skinny.__name__
    finally:
        dispatch.clear_memory_caches()


def test_fp32_threshold_zero_turns_the_fp32_rule_off(monkeypatch):
    dispatch.clear_memory_caches()
    monkeypatch.setattr(select, "SKINNY_FP32_MMAX", 0)
    try:
        assert dispatch.select(1, 4096, 4096).module != skinny.__name__
        assert dispatch.select_tc("fp16", 1, 4096, 4096).module == skinny.__name__
    finally:
        dispatch.clear_memory_caches()


@sim_only
@pytest.mark.parametrize("precision", ["fp16", "bf16", "tf32", "3xtf32", None])
def test_matmul_auto_runs_skinny_at_decode(monkeypatch, precision):
    ran = []
    real = launch.launch

    def spy(p, *a, **k):
        ran.append(p if isinstance(p, gemmlib.KernelSpec) else p.spec)
        return real(p, *a, **k)

    monkeypatch.setattr(launch, "launch", spy)
    rng = np.random.default_rng(4)
    dname = {"fp16": "fp16", "bf16": "bf16"}.get(precision, "fp32")
    A, B = precision_operands(dname, 3, 40, 50, rng)
    C = gemmlib.matmul(A, B, precision=precision if precision in ("tf32", "3xtf32") else None,
                       out_dtype=np.float32)
    assert ran[-1].module == skinny.__name__
    err = backend.relative_error(C, _f64(A) @ _f64(B))
    assert err <= P.tolerance("fp32" if dname == "fp32" else dname, 50), err


# --------------------------------------------------------------------------- the twins


def test_half_to_float_twin_covers_every_pattern():
    bits = np.arange(65536, dtype=np.uint32)
    want = bits.astype(np.uint16).view(np.float16).astype(np.float32)
    got = np.array([convert.half_to_float_py(int(b)) for b in bits], np.float32)
    np.testing.assert_array_equal(got.view(np.uint32)[~np.isnan(want)],
                                  want.view(np.uint32)[~np.isnan(want)])
    assert np.isnan(got[np.isnan(want)]).all()


def test_bf16_conversions_are_the_top_half_of_a_float():
    x = np.array([1.0, -2.5, np.inf, -np.inf, 3.0e38, 1e-40, 0.0, -0.0], np.float32)
    b = P.to_bf16_bits(x)
    w = b.astype(np.uint32) | (b[::-1].astype(np.uint32) << 16)   # pairs (x[i], x[-1-i])
    lo = np.array([convert.bf16_to_float(int(v)) for v in w], np.float32)
    hi = np.array([convert.bf16_hi_to_float(int(v)) for v in w], np.float32)
    want = P.bf16_bits_to_float32(b)
    np.testing.assert_array_equal(lo.view(np.uint32), want.view(np.uint32))
    np.testing.assert_array_equal(hi.view(np.uint32), want[::-1].view(np.uint32))


def test_load16_twin_packs_little_endian_and_checks_alignment():
    h = np.arange(32, dtype=np.uint16).reshape(2, 16)
    w = convert.load16_py(h, 1, 8)
    assert [int(x) for x in w] == [(24 + 2 * e) | ((25 + 2 * e) << 16) for e in range(4)]
    f = np.arange(8, dtype=np.float32).reshape(2, 4)
    assert [int(x) for x in convert.load16_py(f, 1, 0)] == \
        list(f[1].view(np.uint32).astype(int))
    with pytest.raises(MisalignedAccess):
        convert.load16_py(h, 0, 12)          # the 16 bytes leave the row
    with pytest.raises(MisalignedAccess):
        convert.load16_py(np.arange(24, dtype=np.uint16).reshape(2, 12), 1, 0)  # 24-byte rows


# --------------------------------------------------------------------------- the compiler

_GATE = r"""
import json, re, sys
from gemmlib.kernels import skinny
from gemmlib.ptx import compile_ptx, problems, resources
out = {}
for prec, kw, ccs in json.loads(sys.argv[1]):
    spec = skinny.build(prec, **kw)
    for cc in ccs:
        ptx = compile_ptx(spec, tuple(cc))
        res = resources(ptx, tuple(cc))
        out[f"{spec.name}@{cc[0]}{cc[1]}"] = dict(
            problems=problems(spec, ptx, res), registers=res["registers"],
            spills=res["spill_stores"],
            vector_loads=len(re.findall(r"ld\.global[\w.:]*\.v4\.(?:u32|b32)", ptx)),
            cvt=len(re.findall(r"cvt\.f32\.f16", ptx)), local=len(re.findall(r"\.local", ptx)))
json.dump(out, sys.stdout)
"""

#: (precision, params, targets): the fp16 default is gated with the ladder
#: (tests/test_compile_gate.py); these are the other forms the dispatch runs
GATED = [("bf16", dict(MT=8), [(8, 0), (9, 0)]),
         ("fp32", dict(MT=16), [(7, 5), (9, 0)]),
         ("fp16", dict(MT=1, NC=1), [(7, 5), (8, 0)]),
         ("fp16", dict(MT=1, U=8, OUT="fp16"), [(9, 0)]),
         ("fp16", dict(MT=1, U=4, PIPE=1, OUT="fp16"), [(9, 0)])]   # auto's decode build


@pytest.fixture(scope="module")
def gate():
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0")
    proc = subprocess.run([sys.executable, "-c", _GATE, json.dumps(GATED)], env=env,
                          capture_output=True, text=True, timeout=900)
    if proc.returncode:
        pytest.fail(f"the skinny compile gate failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout)


def test_compiled_forms_show_their_claims(gate):
    assert len(gate) == sum(len(t) for _, _, t in GATED)
    for name, rec in gate.items():
        assert not rec["problems"], (name, rec)
        assert rec["local"] == 0 and rec["spills"] == 0, (name, rec)
        assert rec["vector_loads"] >= 1, (name, rec)
        assert rec["registers"] <= 168, (name, rec)     # >= 1 block of 256 threads per SM
        if "bf16" not in name and "fp32" not in name:
            assert rec["cvt"] >= 8, (name, rec)          # fp16: cvt.f32.f16 per value


# --------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.parametrize("precision", PRECISIONS)
def test_decode_shapes_gpu(precision):
    shapes = [(1, 6144, 4096), (4, 4096, 14336), (16, 10240, 8192), (3, 1001, 999),
              (16, 127, 5), (7, 8191, 517)]
    for M, N, K in shapes:
        spec = dispatch.build("skinny", skinny.params_for(precision, M))
        assert gemmlib.verify(spec, [(M, N, K)]).ok


@pytest.mark.gpu
def test_intrinsics_match_their_twins_gpu():
    """load16 / load16_stream on uint16 and float32 rows, cvt.f32.f16 and the bf16 shifts
    on random bit patterns, against the plain-Python twins and NumPy."""
    from gemmlib.backend import cuda, uint32

    @cuda.jit
    def k(H, F, outw, outf):
        t = cuda.grid(1)
        if t < H.shape[0]:
            w0, w1, w2, w3 = convert.load16(H, t, 0)
            s0, s1, s2, s3 = convert.load16_stream(H, t, 8)
            f0, f1, f2, f3 = convert.load16(F, t, 0)
            for e, w in enumerate((w0, w1, w2, w3, s0, s1, s2, s3, f0, f1, f2, f3)):
                outw[t, e] = w
            outf[t, 0] = convert.half_to_float(uint32(H[t, 0]))
            outf[t, 1] = convert.half_to_float(w0 >> uint32(16))
            outf[t, 2] = convert.bf16_to_float(uint32(H[t, 1]))
            outf[t, 3] = convert.bf16_hi_to_float(w0)

    cp = backend.array_module()
    rng = np.random.default_rng(0)
    H = rng.integers(0, 65536, (256, 16), dtype=np.uint16)
    F = rng.uniform(-1, 1, (256, 4)).astype(np.float32)
    outw = cp.zeros((256, 12), np.uint32)
    outf = cp.zeros((256, 4), np.float32)
    k[1, 256](cp.asarray(H), cp.asarray(F), outw, outf)
    outw, outf = cp.asnumpy(outw), cp.asnumpy(outf)
    for t in range(256):
        want = [*convert.load16_py(H, t, 0), *convert.load16_py(H, t, 8),
                *convert.load16_py(F, t, 0)]
        assert [int(x) for x in outw[t]] == [int(x) for x in want]
    half = H[:, [0, 1]].view(np.float16).astype(np.float32)          # H[t,0], H[t,1]
    bf = (H[:, [1, 1]].astype(np.uint32) << 16).view(np.float32)
    want = np.stack([half[:, 0], half[:, 1], bf[:, 0], bf[:, 1]], axis=1)
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(outf), nan)
    np.testing.assert_array_equal(outf[~nan], want[~nan])
