"""NaN, +Inf and -Inf in A or B through every tensor-core precision (issue 18, item 2).

tests/test_special_values.py runs every rung in its *default* precision (fp16 for
the tensor-core rungs) against the float64 product.  This file adds the other
precisions -- bf16, tf32 and 3xtf32 -- on mma_atom, mma_swizzle, mma_pipeline and
the wgmma rungs (through their simulator twins), and ``gemmlib.matmul``'s own
choice in all four, with the patterns of scripts/nonfinite_gpu.py (one NaN row,
one +Inf column, single +-Inf entries, values exact in TF32 so their 3xTF32 small
parts are 0, Inf next to the zero padding of odd K and N).

The oracle is the float64 product of the very values the kernel multiplies:
fp16/bf16 as stored, tf32 rounded to TF32, 3xtf32 the float32 inputs (what fp32
SGEMM computes).  The NaN/+Inf/-Inf masks must match exactly; finite elements
within the precision's bound relative to ``|A| @ |B|``.  On a GPU the same
patterns are compared with cuBLAS (``test_nonfinite_matches_cublas_gpu``; the full
table is ``python scripts/nonfinite_gpu.py OUT.json``).

Why the padding cannot create NaN: ``gemmlib.matmul`` pads A to (M, Kp) and B to
(Kp, Np) with zeros and the kernels zero-fill partial tiles, so a kept element
C[i, j] (i < M, j < N) adds A[i, k] * B[k, j] for k >= K only as 0 * 0; an Inf
meets padding only in the columns j >= N that are dropped.  The ``edges`` pattern
puts Inf and NaN in the last real row and column of A and B to check it.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import pytest

import gemmlib
from gemmlib import backend
from gemmlib.intrinsics import mma as I

from _reliability import compile_offline, load_script


# Kernels compute with NaN/Inf on purpose here; the simulator's NumPy scalars warn.
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


NF = load_script("scripts/nonfinite_gpu.py")

# --------------------------------------------------------------------------- the split


def _split_reference(x32: np.ndarray):
    """An independent model of split_tf32 in float64: (big, small) as floats."""
    x = x32.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        def rnd(v, away):   # to TF32 (fp32's exponent range): nearest/ties away, or toward 0
            _, e = np.frexp(v)
            q = np.ldexp(1.0, np.maximum(e, -125) - 11)           # TF32 ulp (2**-136 at least)
            return np.copysign(np.floor(np.abs(v) / q + (0.5 if away else 0.0)) * q, v)

        fin = np.isfinite(x)
        x0 = np.where(fin, x, 0.0)
        top = float(np.uint32(0x7F7FE000).view(np.float32))       # the largest TF32
        over = np.abs(rnd(x0, True)) > top                         # rna would give Inf
        big = np.where(over, rnd(x0, False), rnd(x0, True))
        rest = x0 - big
        small = np.where(over, rnd(rest, False), rnd(rest, True))
        sign_one = np.where(np.signbit(x32), -1.0, 1.0)
        return np.where(fin, big, sign_one), np.where(fin, small, x)


def _split_all(x32):
    out = np.array([I.split_tf32_py(v) for v in x32], dtype=np.uint32)
    return out.view(np.float32).astype(np.float64).T


def test_split_tf32_matches_an_independent_model():
    """Random bits of every exponent, the values near FLT_MAX, subnormals, zeros, NaN and
    Inf: big and small as the model says, bit for bit; NaN and Inf go to small."""
    rng = np.random.default_rng(3)
    bits = rng.integers(0, 2 ** 32, 3000, dtype=np.uint64).astype(np.uint32)
    special = [0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00001, 0x7F800001, 0x7F7FFFFF,
               0xFF7FFFFF, 0x7F7FFFFE, 0x7F7FF000, 0x7F7FEFFF, 0xFF7FF000, 0x7F7FE000,
               0x00000FFF, 0x80001000, 0x00001000, 0x00000001, 0x3F801000, 0xBF803000,
               0x00000000, 0x80000000]
    bits[:len(special)] = special
    x = bits.view(np.float32)
    got = _split_all(x)
    want = _split_reference(x)
    np.testing.assert_array_equal(got[0], want[0], err_msg="big")
    np.testing.assert_array_equal(got[1], want[1], err_msg="small")   # NaN == NaN here
    assert np.isfinite(got[0]).all()                     # only small carries NaN/Inf
    fin = np.isfinite(x)
    rest = x[fin].astype(np.float64) - (got[0] + got[1])[fin]
    assert (np.abs(rest) <= 2.0 ** -21 * np.abs(x[fin]) + 2.0 ** -137).all()


def test_split_tf32_near_the_fp32_maximum_truncates():
    """cvt.rna rounds every finite |x| >= 3.40199e38 to Inf; the split keeps big finite
    (the largest TF32, 3.40116e38) and the remainder, truncated too, in small: big +
    small never exceeds |x| (so x * 1 stays finite)."""
    assert float(I.RNA_TF32_OVERFLOW) == float(np.uint32(0x7F7FF000).view(np.float32))
    top = np.float32(np.uint32(0x7F7FE000).view(np.float32))
    fmax = np.finfo(np.float32).max
    below = np.uint32(0x7F7FFFFE).view(np.float32)
    for x in (fmax, below, I.RNA_TF32_OVERFLOW, -fmax, -below):
        x = np.float32(x)
        assert I.as_float_py(I.cvt_tf32_py(x)) == np.copysign(np.inf, x)   # what rna gives
        big, small = (I.as_float_py(v) for v in I.split_tf32_py(x))
        assert big == np.copysign(top, x)
        rest = np.float64(x) - (np.float64(big) + np.float64(small))
        assert abs(rest) <= 2.0 ** -21 * abs(x) and np.sign(rest) in (0, np.sign(x))
        assert np.isfinite(np.float32(np.float64(big) + np.float64(small)))
    # just below the threshold rna still rounds (up to the largest TF32), as before
    x = np.float32(np.uint32(0x7F7FEFFF).view(np.float32))
    assert I.split_tf32_py(x)[0] == 0x7F7FE000


def test_split_tf32_of_non_finite_values_and_tiny_subnormals():
    """NaN/Inf: big = +-1, small = x (a NaN with its payload in the low 13 bits stays NaN).
    Subnormals round on TF32's grid; below 2**-137 both parts are 0, so such an x times
    Inf gives 0 * Inf = NaN where SGEMM gives +-Inf (documented in mma_pipeline)."""
    for bits, cls in ((0x7F800000, np.isposinf), (0xFF800000, np.isneginf),
                      (0x7FC00000, np.isnan), (0x7F800001, np.isnan), (0xFF800FFF, np.isnan)):
        big, small = I.split_tf32_py(np.uint32(bits).view(np.float32))
        assert abs(I.as_float_py(big)) == 1.0 and cls(I.as_float_py(small)), hex(bits)
    assert I.as_float_py(I.split_tf32_py(np.float32(-np.inf))[0]) == -1.0
    assert I.as_float_py(I.split_tf32_py(np.float32(2.0 ** -130))[0]) == np.float32(2.0 ** -130)
    assert I.as_float_py(I.split_tf32_py(np.float32(2.0 ** -137))[0]) == np.float32(2.0 ** -136)
    assert I.split_tf32_py(np.float32(2.0 ** -140)) == (0, 0)


# --------------------------------------------------------------------------- the rungs

SIM_CASES = [("issue", NF.issue, (20, 24, 24)),      # aligned: no padding; partial k-tile
             ("edges", NF.edges, (21, 11, 19)),      # odd K and N: padded copies
             ("random", NF.random_places, (17, 16, 40))]


@lru_cache(maxsize=None)
def _spec(rung: str, precision: str):
    import importlib

    from gemmlib import dispatch
    from gemmlib.kernels import mma_pipeline, wgmma_async

    if rung == "pipeline-1warp":       # one warp, 3 stages (as test_tensor_cores' ring test)
        bk = 32 if precision in ("fp16", "bf16") else 16
        return mma_pipeline.build(precision, BM=32, BN=32, BK=bk, WM=32, WN=32, STAGES=3)
    if rung == "pipeline-1warp-nopromote":
        return mma_pipeline.build(precision, BM=32, BN=32, BK=16, WM=32, WN=32, STAGES=2,
                                  PROMOTE=False)
    if rung == "wgmma_async":
        return wgmma_async.build(precision, BM=64, BN=128, STAGES=2)
    if rung.startswith("wgmma_"):
        # 64-wide tiles: the cases fit one tile either way, and the twin's cost grows with
        # the tile; NaN/Inf handling (the twin's products, the epilogue) does not change
        small = dict(BM=128 if rung == "wgmma_store" else 64,   # its stage holds 128 rows
                     BN=64, STAGES=2, **({"CM": 1} if rung == "wgmma_cluster" else {}))
        return importlib.import_module(f"gemmlib.kernels.{rung}").build(precision, **small)
    return dispatch.get_spec(rung, precision)


RUNGS = [("mma_atom", "bf16"), ("mma_atom", "tf32"),
         ("mma_swizzle", "bf16"), ("mma_swizzle", "tf32"), ("mma_swizzle", "3xtf32"),
         ("pipeline-1warp", "fp16"), ("pipeline-1warp", "bf16"), ("pipeline-1warp", "tf32"),
         ("pipeline-1warp", "3xtf32"), ("pipeline-1warp-nopromote", "3xtf32"),
         ("wgmma_async", "bf16"), ("wgmma_tma", "bf16"), ("wgmma_ws", "bf16"),
         ("wgmma_pingpong", "bf16"), ("wgmma_cluster", "bf16"), ("wgmma_store", "bf16")]


def _problems(precision, build, shape, seed=0, kernel=None):
    """Run ``kernel`` (a spec; None: gemmlib.matmul's choice) on the pattern and compare
    with the float64 product of the same rounded inputs."""
    M, N, K = shape
    A64, B64 = build(M, N, K, np.random.default_rng(seed))
    A, B, Ar, Br = NF.host_inputs(precision, A64, B64)
    ref, scale = NF.reference(Ar, Br)
    assert (~np.isfinite(ref)).any() or build is NF.near_max   # the pattern bites
    C = gemmlib.matmul(A, B, precision=precision, kernel=kernel, out_dtype=np.float32)
    r = NF.compare(C, ref, scale, NF.bound(precision, K))
    if r["ok"]:
        return []
    return [f"{precision} {M}x{N}x{K}: NaN/+Inf/-Inf {r['counts']} vs {r['ref_counts']}, "
            f"differing {r['mismatch']} e.g. {r['examples'][:3]}, finite error "
            f"{r['finite_err']:.2e} (bound {r['tol']:.1e})"]


@pytest.mark.parametrize("rung,precision", RUNGS, ids=[f"{r}-{p}" for r, p in RUNGS])
def test_rung_keeps_the_nonfinite_pattern(rung, precision):
    if not backend.SIMULATOR:
        pytest.skip("simulator sizes; on a GPU test_nonfinite_matches_cublas_gpu compares "
                    "with cuBLAS")
    spec = _spec(rung, precision)
    problems = []
    for name, build, shape in SIM_CASES:
        problems += [f"{name}: {p}" for p in _problems(precision, build, shape, kernel=spec)]
    assert not problems, f"{spec.name}:\n" + "\n".join(problems)


@pytest.mark.parametrize("precision", ["fp16", "bf16", "tf32", "3xtf32"])
def test_matmul_keeps_the_nonfinite_pattern(precision):
    """What users call: gemmlib.matmul(A, B, precision=...) picks the kernel (M = 21: the
    default tensor-core pipeline; M = 8: the decode rung)."""
    if not backend.SIMULATOR:
        pytest.skip("simulator sizes")
    problems = []
    for name, build, shape in [("edges", NF.edges, (21, 11, 19)),
                               ("decode", NF.random_places, (8, 24, 40))]:
        problems += [f"{name}: {p}" for p in _problems(precision, build, shape, seed=5)]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("case", ["near-max", "overflow"])
def test_3xtf32_near_the_fp32_maximum_and_on_overflow(case):
    """Finite x near FLT_MAX stays finite and accurate (cvt.rna alone made it Inf, then
    big*big = Inf and small = -Inf: NaN); products above FLT_MAX give SGEMM's +-Inf."""
    if not backend.SIMULATOR:
        pytest.skip("simulator sizes")
    build = NF.near_max if case == "near-max" else NF.overflow
    shape = (20, 16, 24)
    problems = _problems("3xtf32", build, shape, kernel=_spec("pipeline-1warp", "3xtf32"))
    assert not problems, "\n".join(problems)


def test_the_old_split_fails_the_issue_pattern(monkeypatch):
    """The check bites: with the split as it was (small = cvt(x - cvt(x)), corrections
    with Inf parts) the issue pattern comes out NaN where the reference has +-Inf."""
    if not backend.SIMULATOR:
        pytest.skip("simulator: the split is swapped in Python")

    def old_split(x):
        big = I.cvt_tf32_py(x)
        return big, I.cvt_tf32_py(np.float32(x - I.as_float_py(big)))

    monkeypatch.setattr(I, "split_tf32", old_split)
    from gemmlib.kernels import mma_pipeline

    spec = mma_pipeline.build("3xtf32", BM=32, BN=32, BK=16, WM=32, WN=32, STAGES=2)
    problems = _problems("3xtf32", NF.issue, (20, 24, 24), kernel=spec)
    assert problems and "nan" in problems[0], problems


# --------------------------------------------------------------------------- compile + GPU


def test_3xtf32_compiles_without_spills():
    """The split's extra instructions fit: mma_pipeline's 3xtf32 tile (the default, and
    BK = 32 as tuned for the H100/H200, so for sm_90 only) and mma_swizzle's assemble with
    no spill (real compiler, offline; the compile gate itself builds the fp16 default only)."""
    recs = compile_offline(
        "from gemmlib.kernels import mma_pipeline, mma_swizzle",
        "[(spec, cc) for spec in (mma_pipeline.build('3xtf32'), mma_swizzle.build('3xtf32'))"
        " for cc in ((8, 0), (9, 0))] + [(mma_pipeline.build('3xtf32', BK=32), (9, 0))]")
    for r in recs:
        assert not r["problems"] and r["spill_stores"] == 0, r
        assert r["registers"] <= 255, r


@pytest.mark.gpu
def test_nonfinite_matches_cublas_gpu():
    """On the GPU: every precision's NaN/+Inf/-Inf positions equal cuBLAS's in the same
    precision (3xtf32: fp32 SGEMM), for the gated cases of scripts/nonfinite_gpu.py, with
    what gemmlib.matmul runs and with mma_pipeline."""
    from _reliability import report

    rows = NF.run_checks(progress=False)
    report("nonfinite-vs-cublas", rows)
    bad = [NF.format_row(r) for r in rows if r["gate"] and not r["ok"]]
    assert not bad, NF.HEADER + "\n" + "\n".join(bad)
