"""Split-K on the tensor-core pipeline (gemmlib.kernels.mma_split_k).

Simulator runs use a one-warp 32 x 32 block tile (as tests/test_tensor_cores.py's
``_small_pipeline``): the SPLIT_K branch is the same code at any tile, and K spans
several slices of a few k-tiles each.  Every check starts from a NaN-poisoned C
(gemmlib.verify), so a row of the workspace a slice forgets shows.  The cost
model is checked on a faked H100; the compiled code (registers, spills, the plain
rung free of the split's branch) offline, with the real compiler.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import gemmlib
from gemmlib import backend, dispatch
from gemmlib import precision as P
from gemmlib.kernels import mma_pipeline, mma_split_k, split_k

from _reliability import compile_offline, load_script, precision_operands

PRECISIONS = ("fp16", "bf16", "tf32", "3xtf32")
sim_only = pytest.mark.skipif(not backend.SIMULATOR, reason="simulator sizes")


def small(precision: str, SPLITS: int, stages: int = 2, BK: int | None = None):
    """A one-warp 32 x 32 tile, cut into SPLITS slices (cheap in the simulator)."""
    bk = BK or (32 if precision in ("fp16", "bf16") else 16)
    return mma_split_k.build(precision, SPLITS=SPLITS, BM=32, BN=32, BK=bk, WM=32, WN=32,
                             STAGES=stages)


# --------------------------------------------------------------------------- correctness


@sim_only
@pytest.mark.parametrize("precision", PRECISIONS)
def test_split_is_right_and_bit_identical(precision):
    """1 x 1 x 1 (one slice: C written directly), then M = 37 across the tile edge, N = 13
    (padded to 16) and 5 k-tiles minus 3 asked in 4 slices: effective_splits makes 3
    (2 + 2 + 1 k-tiles, the last partial).  Within the precision's bound of the float64
    product, nothing left unwritten, and a second run gives the same bits."""
    spec = small(precision, SPLITS=4, stages=3 if precision in ("bf16", "3xtf32") else 2)
    BK = spec.params["BK"]
    M, N, K = 37, 13, 5 * BK - 3
    assert gemmlib.verify(spec, [(1, 1, 1), (M, N, K)], seed=0).ok
    plan = dispatch.plan(spec, M, 16, 5 * BK)              # (the padded shape matmul runs)
    assert plan.splits == split_k.effective_splits(4, 5 * BK, BK) == plan.grid[2] == 3
    A, B = precision_operands(precision, M, N, K, np.random.default_rng(1))
    C1 = gemmlib.matmul(A, B, kernel=spec, out_dtype=np.float32)
    C2 = gemmlib.matmul(A, B, kernel=spec, out_dtype=np.float32)
    assert backend.relative_error(C1, backend.reference(A, B)) <= P.tolerance(precision, K)
    assert C1.tobytes() == C2.tobytes()


@sim_only
def test_split_is_the_fixed_order_sum_of_the_slices():
    """What the slicing rule promises, bit for bit: the split's C equals the fp32 sum, in
    slice order, of the plain pipeline run on each slice's k-tiles alone (3xtf32, so each
    slice also promotes its k-tiles as the plain rung does)."""
    spec = small("3xtf32", SPLITS=3, BK=8)
    BK = spec.params["BK"]
    M, N, K = 9, 8, 7 * BK                                 # 7 k-tiles: slices 3 + 3 + 1
    A, B = precision_operands("3xtf32", M, N, K, np.random.default_rng(2))
    C = gemmlib.matmul(A, B, kernel=spec)
    plain = mma_pipeline.build("3xtf32", BM=32, BN=32, BK=BK, WM=32, WN=32, STAGES=2)
    want = np.zeros((M, N), np.float32)
    for t0, t1 in split_k.k_slices(K, BK, 3):
        part = gemmlib.matmul(np.ascontiguousarray(A[:, t0 * BK:t1 * BK]),
                              np.ascontiguousarray(B[t0 * BK:t1 * BK]), kernel=plain)
        want = want + part                                 # float32 adds, z = 0, 1, 2
    assert C.tobytes() == want.tobytes()


@sim_only
def test_an_empty_slice_writes_zeros_to_its_rows():
    """The kernel itself, launched with more slices along z than k-tiles (dispatch never
    does: effective_splits): the last slice owns no k-tile and must still write its M rows
    of the workspace -- zeros, not the NaN the workspace held."""
    spec = small("fp16", SPLITS=4)
    M, N, K = 5, 8, 3 * spec.params["BK"]                  # 3 k-tiles, 4 slices of 1
    rng = np.random.default_rng(3)
    A, B = (x.view(np.uint16) for x in precision_operands("fp16", M, N, K, rng))
    W = np.full((4 * M, N), np.nan, np.float32)
    spec.kernel[(1, 1, 4), spec.block, 0, spec.shared_bytes](A, B, W)
    assert np.isfinite(W).all() and not W[3 * M:].any()
    R = A.view(np.float16).astype(np.float64) @ B.view(np.float16).astype(np.float64)
    total = W.reshape(4, M, N).sum(axis=0, dtype=np.float64)
    assert backend.relative_error(total, R) <= P.tolerance("fp16", K)


@sim_only
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_3xtf32_split_keeps_the_nonfinite_pattern():
    """NaN, +Inf and -Inf in A and B (tests/test_nonfinite.py's patterns) through 3
    slices: C's NaN/+Inf/-Inf positions are fp32 SGEMM's (the float64 product of the
    float32 inputs), finite elements within the 3xtf32 bound.  The slices' partials are
    added in fp32, where Inf + finite = Inf and Inf - Inf = NaN, as in one accumulator."""
    NF = load_script("scripts/nonfinite_gpu.py")
    spec = small("3xtf32", SPLITS=3, BK=8)
    problems = []
    for name, build, shape in [("issue", NF.issue, (20, 24, 24)),
                               ("edges", NF.edges, (21, 11, 19)),
                               ("random", NF.random_places, (17, 16, 40))]:
        M, N, K = shape
        A64, B64 = build(M, N, K, np.random.default_rng(0))
        A, B, Ar, Br = NF.host_inputs("3xtf32", A64, B64)
        ref, scale = NF.reference(Ar, Br)
        assert (~np.isfinite(ref)).any()                   # the pattern bites
        C = gemmlib.matmul(A, B, precision="3xtf32", kernel=spec)
        r = NF.compare(C, ref, scale, NF.bound("3xtf32", K))
        if not r["ok"]:
            problems.append(f"{name}: {r['counts']} vs {r['ref_counts']}, differing "
                            f"{r['mismatch']} e.g. {r['examples'][:3]}, finite error "
                            f"{r['finite_err']:.2e}")
    assert not problems, "\n".join(problems)


# --------------------------------------------------------------------------- the spec


def test_slice_count_is_a_launch_parameter():
    """Every SPLITS shares one compiled kernel; the spec round-trips through dispatch.build;
    the reduction is split_k's (fixed order)."""
    s3, s5 = small("tf32", 3), small("tf32", 5)
    assert s3.kernel is s5.kernel and s3.code_params == s5.code_params
    assert "SPLITS" not in s3.code_params and s3.params["SPLITS"] == 3
    assert s3.reduce_kernel is split_k.reduce_slices and s3.launch_only == ("SPLITS",)
    assert s3.precision == "tf32" and s3.operand_align == 4 and s3.dynamic_shared
    again = dispatch.build("mma_split_k", s3.params)
    assert again.kernel is s3.kernel and again.name == s3.name
    # the tile given in full or left to the defaults: one kernel
    full = mma_split_k.build("bf16")
    assert mma_split_k.build(**full.params).kernel is full.kernel
    names = {c.name for c in s3.constraints}
    assert {"16-byte rows", "slices"} <= names


def test_plain_rung_is_untouched_by_the_flag():
    plain, split = mma_pipeline.build("3xtf32"), mma_pipeline.build("3xtf32", SPLIT_K=True)
    assert "SPLIT_K" not in plain.params and split.params["SPLIT_K"] is True
    assert plain.name == "mma_pipeline_3xtf32" and split.name.endswith("_splitk")
    assert r"%ctaid\.z" in plain.ptx_must_not and r"%nctaid\.z" in split.ptx_must
    assert mma_split_k.build().name == "mma_split_k" and mma_split_k.SPEC.params["SPLITS"] == 0
    assert mma_split_k.SPEC.name == ("mma_split_k_32x32x32_w32x32_s3" if backend.SIMULATOR
                                     else "mma_split_k")


# --------------------------------------------------------------------------- the cost model


def _h100_like():
    return replace(backend.device_info(), name="H100 (faked)", compute_capability=(9, 0),
                   sm_count=132, max_sm_clock_mhz=1980.0, memory_clock_khz=2619000,
                   memory_bus_bits=5120, simulated=False)


@pytest.mark.parametrize("precision", PRECISIONS)
def test_model_splits_small_deep_products_and_leaves_big_ones(precision):
    dev = _h100_like()
    for shape in [(128, 4096, 4096), (1024, 1024, 8192)]:
        spec = mma_split_k.choose(precision, *shape, dev)
        assert spec is not None and spec.params["SPLITS"] > 1, shape
        assert spec.precision == precision and spec.module == mma_split_k.__name__
        assert not spec.failed_constraints(*shape, dev)
        assert mma_split_k.choose(precision, *shape, dev) is spec   # one object per choice
    for shape in [(2048, 2048, 2048), (4096, 4096, 4096), (8192, 8192, 8192),
                  (1024, 1024, 64)]:                      # too shallow to cut
        assert mma_split_k.choose(precision, *shape, dev) is None, shape
    d = mma_pipeline.DEFAULTS[precision]
    ks = [mma_split_k.splits_for_tc(precision, 512, 512, k, d[0], d[1], d[2], dev)
          for k in (1024, 4096, 16384)]
    assert ks == sorted(ks)                               # deeper K: never fewer slices


def test_model_uses_the_tensor_core_rate_and_the_given_tile():
    """3xtf32 (three mma per product) is slower per k-tile than tf32, so it pays to split
    it at least as often; a tuned tile (BK = 32) is the tile choose() splits."""
    dev = _h100_like()
    s = {p: mma_split_k.splits_for_tc(p, 1024, 1024, 2048, 128, 128, 16, dev)
         for p in ("tf32", "3xtf32")}
    assert s["3xtf32"] >= s["tf32"]
    tuned = dict(mma_pipeline.build("3xtf32", BK=32).params)
    spec = mma_split_k.choose("3xtf32", 128, 4096, 4096, dev, tile=tuned)
    assert spec.params["BK"] == 32 and spec.params["SPLITS"] > 1
    assert mma_split_k.blocks_per_sm(mma_pipeline.build("3xtf32"), dev) == 1
    assert mma_split_k.blocks_per_sm(mma_pipeline.build("fp16"), dev) == 2


def test_shallow_k_runs_one_slice():
    """Two k-tiles are too few to cut (MIN_TILES_PER_SLICE): the default spec (SPLITS=0)
    launches one slice, which writes C directly (no workspace), and choose() says no."""
    assert mma_split_k.choose("fp16", 37, 16, 64) is None
    assert dispatch.plan(mma_split_k.SPEC, 37, 16, 64).splits == 1


# --------------------------------------------------------------------------- compiled code


def test_split_compiles_without_spills():
    """The split form of 3xtf32's tiles (the default, and BK = 32 as tuned for the
    H100/H200: 254 registers) assembles for sm_80 and sm_90 without spills, shows its
    claims (it reads gridDim.z), and the plain rung has no trace of the branch."""
    recs = compile_offline(
        "from gemmlib.kernels import mma_pipeline, mma_split_k",
        "[(mma_split_k.build('3xtf32', BK=32), (8, 0)),"
        " (mma_split_k.build('3xtf32', BK=32), (9, 0)),"
        " (mma_split_k.build('3xtf32'), (9, 0)), (mma_pipeline.build('3xtf32'), (8, 0))]")
    assert len(recs) == 4
    for r in recs:
        assert not r["problems"] and r["spill_stores"] == 0, r
        assert r["registers"] <= 255, r
