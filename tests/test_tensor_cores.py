"""Tensor cores: fragment layouts, the mma/ldmatrix/cvt twins, bfloat16 helpers, swizzles,
the precision API of ``gemmlib.matmul`` and the tensor-core rungs in every precision.

Everything runs in the simulator in well under two minutes: shapes are tiny, and
the pipeline rung is mostly run in a one-warp 32 x 32 tile (``_small_pipeline``),
which exercises the same code as the default 128 x 128 tile at a fraction of the
simulated threads.  The default fp16 spec of every rung is verified on edge
shapes by tests/test_kernels.py and the swizzle figures by tests/test_viz_tc.py;
this file covers what those leave out.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import pytest

import gemmlib
from gemmlib import backend, banks, dispatch
from gemmlib import precision as P
from gemmlib.backend import cuda, uint16, uint32
from gemmlib.intrinsics import mma as I
from gemmlib.intrinsics.vector import SHARED_ALIGN
from gemmlib.kernels import mma_atom, mma_pipeline, mma_swizzle

sim_only = pytest.mark.skipif(not backend.SIMULATOR, reason="tests the simulator twins")

# operand name -> (layout, rows, cols) of the operand it maps onto
LAYOUTS = {
    "A_TF32": (I.A_TF32, 16, 8),
    "B_TF32": (I.B_TF32, 8, 8),
    "A_16": (I.A_16, 16, 16),
    "B_16": (I.B_16, 16, 8),
    "C_F32": (I.C_F32, 16, 8),
}


# (row, col) of value v of lane l, written out from the PTX ISA's fragment tables
# (g = l // 4, t = l % 4); independent of the Layout objects under test.
def _ptx_a_tf32(l, v):   # a0 (g, t), a1 (g+8, t), a2 (g, t+4), a3 (g+8, t+4)
    return l // 4 + 8 * (v % 2), l % 4 + 4 * (v // 2)


def _ptx_b_tf32(l, v):   # b0 (k = t, n = g), b1 (k = t+4, n = g)
    return l % 4 + 4 * v, l // 4


def _ptx_a_16(l, v):     # register r = v // 2 holds (g + 8 (r % 2), 2t + 8 (r // 2) + v % 2)
    r = v // 2
    return l // 4 + 8 * (r % 2), 2 * (l % 4) + 8 * (r // 2) + v % 2


def _ptx_b_16(l, v):     # b0 (k = 2t, 2t+1; n = g), b1 (k = 2t+8, 2t+9; n = g)
    return 2 * (l % 4) + 8 * (v // 2) + v % 2, l // 4


def _ptx_c_f32(l, v):    # c0, c1 (g, 2t, 2t+1), c2, c3 (g+8, ..)
    return l // 4 + 8 * (v // 2), 2 * (l % 4) + v % 2


PTX_RULES = {"A_TF32": _ptx_a_tf32, "B_TF32": _ptx_b_tf32, "A_16": _ptx_a_16,
             "B_16": _ptx_b_16, "C_F32": _ptx_c_f32}


# --------------------------------------------------------------------------- 1. layouts


@pytest.mark.parametrize("name", LAYOUTS)
def test_fragment_layout_is_a_bijection_onto_the_operand(name):
    """Every element of the operand is held by exactly one (lane, value): a layout that
    dropped or doubled an element would compute a wrong product on the GPU."""
    layout, rows, cols = LAYOUTS[name]
    coords = I.fragment_coords(layout, rows)
    assert len(coords) == 32 and all(len(c) == rows * cols // 32 for c in coords)
    held = sorted(rc for lane in coords for rc in lane)
    assert held == [(r, c) for r in range(rows) for c in range(cols)]


@pytest.mark.parametrize("name", LAYOUTS)
def test_fragment_coords_follow_the_ptx_tables(name):
    """fragment_coords gives, for every lane and value, the element the PTX ISA names."""
    layout, rows, _ = LAYOUTS[name]
    rule = PTX_RULES[name]
    coords = I.fragment_coords(layout, rows)
    for lane in range(32):
        for v, rc in enumerate(coords[lane]):
            assert rc == rule(lane, v), (name, lane, v)


def test_fragment_spot_checks():
    """A few entries checked by hand against the tables in mma.py's comments."""
    c = I.fragment_coords(I.C_F32, 16)
    assert c[5][0] == (1, 2) and c[5][1] == (1, 3)      # lane 5: row 5 // 4, col 2 * (5 % 4)
    assert c[5][2] == (9, 2) and c[31][3] == (15, 7)    # value 2: row + 8
    a = I.fragment_coords(I.A_16, 16)
    assert a[0][:2] == [(0, 0), (0, 1)]                 # a0: low half (g, 2t), high (g, 2t+1)
    assert a[6][2:4] == [(9, 4), (9, 5)]                # a1: row g + 8
    assert a[6][4] == (1, 12) and a[6][6] == (9, 12)    # a2: col + 8; a3: row + 8, col + 8
    b = I.fragment_coords(I.B_TF32, 8)
    assert b[13] == [(1, 3), (5, 3)]                    # b0 (k = t, n = g), b1 (k = t + 4)
    assert I.ATOMS["tf32"]["shape"] == (16, 8, 8) and I.ATOMS["bf16"]["shape"] == (16, 8, 16)
    assert I.MMA["3xtf32"] is I.mma_tf32


# --------------------------------------------------------------------------- 2. twins in kernels


def _coord_table(layout, rows) -> np.ndarray:
    """fragment_coords as an int64 array (lane, value, 2) a kernel can index."""
    return np.array(I.fragment_coords(layout, rows), dtype=np.int64)


@lru_cache(maxsize=None)
def _mma_kernel(kind: str):
    """One warp: load the A, B and C fragments where the layouts say, one mma, store D."""
    mma = {"fp16": I.mma_f16, "bf16": I.mma_bf16, "tf32": I.mma_tf32}[kind]
    sixteen = kind != "tf32"

    @cuda.jit(device=True)
    def reg(X, rc, lane, r):
        """Register r of this lane's fragment of X (16-bit bits, or float32 -> TF32)."""
        if sixteen:
            lo = uint32(X[rc[lane, 2 * r, 0], rc[lane, 2 * r, 1]])
            hi = uint32(X[rc[lane, 2 * r + 1, 0], rc[lane, 2 * r + 1, 1]])
            return lo | (hi << uint32(16))
        return I.cvt_tf32(X[rc[lane, r, 0], rc[lane, r, 1]])

    @cuda.jit
    def kernel(A, B, C, a_rc, b_rc, c_rc, D):
        lane = cuda.threadIdx.x
        a0, a1, a2, a3 = (reg(A, a_rc, lane, 0), reg(A, a_rc, lane, 1),
                          reg(A, a_rc, lane, 2), reg(A, a_rc, lane, 3))
        b0, b1 = reg(B, b_rc, lane, 0), reg(B, b_rc, lane, 1)
        c = (C[c_rc[lane, 0, 0], c_rc[lane, 0, 1]], C[c_rc[lane, 1, 0], c_rc[lane, 1, 1]],
             C[c_rc[lane, 2, 0], c_rc[lane, 2, 1]], C[c_rc[lane, 3, 0], c_rc[lane, 3, 1]])
        d = mma(a0, a1, a2, a3, b0, b1, c[0], c[1], c[2], c[3])
        for v in range(4):
            D[c_rc[lane, v, 0], c_rc[lane, v, 1]] = d[v]

    return kernel


def _operand(kind, shape, rng):
    """(what the kernel reads, the float64 values the tensor core multiplies)."""
    x = rng.uniform(-1, 1, shape).astype(np.float32)
    if kind == "fp16":
        h = x.astype(np.float16)
        return h.view(np.uint16), h.astype(np.float64)
    if kind == "bf16":
        bits = P.to_bf16_bits(x)
        return bits, P.bf16_bits_to_float32(bits).astype(np.float64)
    rounded = np.array([I.cvt_tf32_py(v) for v in x.ravel()], np.uint32).view(np.float32)
    return x, rounded.reshape(shape).astype(np.float64)


@pytest.mark.parametrize("kind", ["fp16", "bf16", "tf32"])
def test_mma_twin_in_a_kernel(kind):
    """One warp's mma of fragments gathered by the layouts equals A @ B + C of the rounded
    inputs in float64: wrong register packing, a missing cvt (TF32 truncates instead of
    rounding) or a lost accumulator would all show."""
    atom = I.ATOMS[kind]
    m, n, k = atom["shape"]
    rng = np.random.default_rng(12)
    A, A64 = _operand(kind, (m, k), rng)
    B, B64 = _operand(kind, (k, n), rng)
    C = rng.uniform(-4, 4, (m, n)).astype(np.float32)           # nonzero accumulator in
    D = np.full((m, n), np.nan, np.float32)
    _mma_kernel(kind)[1, 32](A, B, C, _coord_table(atom["A"], m), _coord_table(atom["B"], k),
                             _coord_table(atom["C"], m), D)
    np.testing.assert_allclose(D, A64 @ B64 + C, rtol=1e-6, atol=1e-6)
    if kind == "tf32":  # the same product of the *unrounded* inputs is measurably different
        exact = A.astype(np.float64) @ B.astype(np.float64) + C
        assert np.abs(D - exact).max() > 1e-5


@cuda.jit
def _ldmatrix_kernel(A, B, out_a, out_b):
    """A (16 x 16) and B (16 x 8, k-major rows) to shared memory; one warp's ldmatrix.x4
    (A fragment) and ldmatrix.x2.trans (B fragment)."""
    sA = cuda.shared.array(256, uint16, alignment=SHARED_ALIGN)
    sB = cuda.shared.array(128, uint16, alignment=SHARED_ALIGN)
    lane = cuda.threadIdx.x
    for e in range(lane, 256, 32):
        sA[e] = A[e // 16, e % 16]
    for e in range(lane, 128, 32):
        sB[e] = B[e // 8, e % 8]
    cuda.syncthreads()
    # x4: lanes 0-15 give rows 0-15 at k 0, lanes 16-31 the same rows at k 8
    a = I.ldmatrix_x4(sA, (lane % 16) * 16 + (lane // 16) * 8)
    # x2.trans: lanes 0-7 give k rows 0-7, lanes 8-15 k rows 8-15 (16-31: ignored)
    b = I.ldmatrix_x2_trans(sB, (lane % 16) * 8)
    for r in range(4):
        out_a[lane, r] = a[r]
    for r in range(2):
        out_b[lane, r] = b[r]


def _packed(bits, coords, nregs):
    """(32, nregs) registers of 16-bit values packed two per register, low value first."""
    return np.array([[int(bits[coords[l][2 * r]]) | int(bits[coords[l][2 * r + 1]]) << 16
                      for r in range(nregs)] for l in range(32)], dtype=np.uint32)


def test_ldmatrix_gives_the_fragment_registers():
    """ldmatrix.x4 and .x2.trans deliver exactly the registers that element-wise reads at
    the A_16 / B_16 coordinates would pack (the basis of mma_swizzle and mma_pipeline)."""
    rng = np.random.default_rng(3)
    A = rng.integers(0, 2 ** 16, (16, 16)).astype(np.uint16)
    B = rng.integers(0, 2 ** 16, (16, 8)).astype(np.uint16)
    out_a = np.zeros((32, 4), np.uint32)
    out_b = np.zeros((32, 2), np.uint32)
    _ldmatrix_kernel[1, 32](A, B, out_a, out_b)
    np.testing.assert_array_equal(out_a, _packed(A, I.fragment_coords(I.A_16, 16), 4))
    np.testing.assert_array_equal(out_b, _packed(B, I.fragment_coords(I.B_16, 16), 2))


def test_twins_refuse_what_the_gpu_would_reject():
    """Misaligned ldmatrix rows, 32-bit .trans and warp-wide calls outside a kernel."""
    with pytest.raises(I.FragmentError, match="16-byte aligned"):
        I.ldmatrix_x4_py(np.zeros(64, np.uint16), 3)
    with pytest.raises(I.FragmentError, match="16-bit"):
        I.ldmatrix_x2_trans_py(np.zeros(64, np.float32), 0)
    with pytest.raises(I.FragmentError, match="inside a"):
        I.mma_f16_py(0, 0, 0, 0, 0, 0, 0.0, 0.0, 0.0, 0.0)


# --------------------------------------------------------------------------- 3. cvt_tf32


def _tf32_reference(x32: np.ndarray) -> np.ndarray:
    """Round float32 to TF32 (10-bit mantissa, fp32 exponent range) in float64 arithmetic,
    to nearest with ties away from zero; NaN and Inf unchanged.  Returns the bits."""
    with np.errstate(over="ignore", invalid="ignore"):   # NaN and overflow: handled below
        x = x32.astype(np.float64)
        _, e = np.frexp(x)                               # |x| in [2**(e-1), 2**e)
        q = np.ldexp(1.0, np.maximum(e, -125) - 11)      # TF32 ulp (subnormals: 2**-136)
        r = np.copysign(np.floor(np.abs(x) / q + 0.5) * q, x)
        out = r.astype(np.float32).view(np.uint32)
    return np.where(np.isfinite(x32), out, x32.view(np.uint32))


def _cvt_all(x32):
    return np.array([I.cvt_tf32_py(v) for v in x32], dtype=np.uint32)


def test_cvt_tf32_matches_a_float64_reference_on_random_bits():
    """Every exponent (subnormals, overflow to Inf, NaN payloads) and the low 13 bits zero."""
    rng = np.random.default_rng(7)
    bits = rng.integers(0, 2 ** 32, 4000, dtype=np.uint64).astype(np.uint32)
    bits[:8] = [0x7F800000, 0xFF800000, 0x7FC00000, 0x7F800001, 0xFFFFFFFF,  # Inf, NaNs
                0x7F7FFFFF, 0x00000FFF, 0x80001000]                     # max, subnormal ties
    x = bits.view(np.float32)
    got = _cvt_all(x)
    np.testing.assert_array_equal(got, _tf32_reference(x))
    finite = np.isfinite(x)
    assert not (got[finite] & 0x1FFF).any()
    assert np.isnan(got[~np.isfinite(x) & np.isnan(x)].view(np.float32)).all()
    assert got[0] == 0x7F800000 and got[1] == 0xFF800000 and got[3] == 0x7F800001
    assert got[5] == 0x7F800000                              # rounds up past the largest


def test_cvt_tf32_ties_go_away_from_zero():
    """Halfway cases round away from zero (cvt.rna), not to even."""
    ulp = 2.0 ** -10                                          # TF32 spacing at 1.0
    cases = {1 + ulp / 2: 1 + ulp,                            # RNE would give 1.0
             -(1 + ulp / 2): -(1 + ulp),
             1 + 3 * ulp / 2: 1 + 2 * ulp,
             1 + ulp / 2 - 2.0 ** -23: 1.0,                   # just below the tie
             3 * 2.0 ** -137: 2.0 ** -135,                    # subnormal tie (ulp 2**-136)
             0.0: 0.0}
    for x, want in cases.items():
        got = I.as_float_py(I.cvt_tf32_py(np.float32(x)))
        assert got == np.float32(want), (x, got, want)
        assert np.signbit(got) == np.signbit(np.float32(x))
    assert I.cvt_tf32_py(np.float32(-0.0)) == 0x80000000


def test_as_float_and_as_bits_reinterpret():
    assert I.as_bits_py(np.float32(1.0)) == 0x3F800000
    assert I.as_float_py(0xC0000000) == np.float32(-2.0)
    assert I.as_bits_py(I.as_float_py(0x7FC01234)) == 0x7FC01234


# --------------------------------------------------------------------------- 4. bfloat16


def _bf16_reference(x32: np.ndarray) -> np.ndarray:
    """Round-to-nearest-even to bfloat16 by comparing the two neighbours in float64
    (finite inputs whose upper neighbour is finite)."""
    u = x32.view(np.uint32)
    lo = (u >> 16).astype(np.uint32)
    hi = lo + 1
    vlo = (lo << 16).view(np.float32).astype(np.float64)
    vhi = (hi << 16).view(np.float32).astype(np.float64)
    x = x32.astype(np.float64)
    dlo, dhi = np.abs(x - vlo), np.abs(vhi - x)
    pick_hi = (dhi < dlo) | ((dhi == dlo) & (lo % 2 == 1))
    return np.where(pick_hi, hi, lo).astype(np.uint16)


def test_to_bf16_bits_rounds_half_to_even():
    """Hand-made ties go to the even neighbour; just past a tie goes up; overflow gives Inf."""
    cases = [(1.0, 0x3F80),
             (1 + 2.0 ** -8, 0x3F80),               # tie between 0x3F80 (even) and 0x3F81
             (1 + 3 * 2.0 ** -8, 0x3F82),           # tie between 0x3F81 and 0x3F82 (even)
             (1 + 2.0 ** -8 + 2.0 ** -23, 0x3F81),  # just above the tie
             (-(1 + 2.0 ** -8), 0xBF80),
             (float(np.finfo(np.float32).max), 0x7F80),
             (0.0, 0x0000), (-0.0, 0x8000)]
    x = np.array([v for v, _ in cases], np.float32)
    assert P.to_bf16_bits(x).tolist() == [b for _, b in cases]


def test_to_bf16_bits_matches_a_reference_on_random_values():
    rng = np.random.default_rng(5)
    bits = rng.integers(0, 2 ** 32, 5000, dtype=np.uint64).astype(np.uint32)
    bits = bits[((bits >> 23) & 0xFF) < 0xFE]               # finite, upper neighbour finite
    bits[:500] = (bits[:500] & 0xFFFF0000) | 0x8000          # exact ties, both parities
    x = bits.view(np.float32)
    np.testing.assert_array_equal(P.to_bf16_bits(x), _bf16_reference(x))


def test_to_bf16_bits_keeps_nan_and_inf():
    """NaN stays NaN even when its payload lies only in the dropped low 16 bits."""
    x = np.array([0x7F800000, 0xFF800000, 0x7FC00000, 0x7F800001, 0xFF800001],
                 np.uint32).view(np.float32)
    b = P.to_bf16_bits(x)
    assert b[:2].tolist() == [0x7F80, 0xFF80]
    assert np.isnan(P.bf16_bits_to_float32(b[2:])).all()


def test_bf16_bits_round_trip_exactly():
    """Every non-NaN bfloat16 pattern survives bits -> float32 -> bits; the float32 is the
    pattern in the top half."""
    b = np.arange(2 ** 16, dtype=np.uint32).astype(np.uint16)
    f = P.bf16_bits_to_float32(b)
    assert f.dtype == np.float32
    np.testing.assert_array_equal(f.view(np.uint32), b.astype(np.uint32) << 16)
    keep = ~np.isnan(f)
    np.testing.assert_array_equal(P.to_bf16_bits(f)[keep], b[keep])
    assert np.isnan(P.bf16_bits_to_float32(P.to_bf16_bits(f[~keep]))).all()


def test_bf16_array_and_dtype_name():
    x = np.array([[1.0, -2.5], [3.0, 0.1]], np.float32)
    a = P.to_bf16(x)
    assert isinstance(a, P.BF16Array)
    assert a.dtype == "bfloat16" and P.dtype_name(a) == "bfloat16" and a.shape == (2, 2)
    np.testing.assert_array_equal(a.astype(np.float32), P.bf16_bits_to_float32(a.bits))
    assert a.astype(np.float64).dtype == np.float64
    assert P.dtype_name(x.astype(np.float16)) == "float16" and P.dtype_name(x) == "float32"
    with pytest.raises(TypeError, match="uint16"):
        P.BF16Array(np.zeros(3, np.float32))


# --------------------------------------------------------------------------- 5. swizzles


def _rung_tiles():
    """(label, spec) of the tile configurations the swizzled rungs build by default."""
    out = [(f"mma_swizzle-{p}", mma_swizzle.build(p)) for p in ("bf16", "3xtf32")]
    out += [(f"mma_pipeline-{p}", mma_pipeline.build(p)) for p in mma_pipeline.PRECISIONS]
    return out


TILES = _rung_tiles()


def _layouts(spec):
    p = spec.params
    eb = 2 if p["precision"] in ("fp16", "bf16") else 4
    return mma_swizzle.tile_layouts(p["BM"], p["BN"], p["BK"], eb), eb


@pytest.mark.parametrize("label,spec", TILES, ids=[t[0] for t in TILES])
def test_swizzled_tiles_are_bijections_keeping_16_byte_chunks(label, spec):
    """Each swizzled shared tile is a permutation of its elements that keeps every row's
    elements in its row and every 16-byte chunk whole and aligned (cp.async and ldmatrix
    move chunks); the kernel's generated index functions agree with the layouts."""
    (lay_a, lay_b), eb = _layouts(spec)
    per = 16 // eb
    for lay, fn in ((lay_a, spec.index["sw_a"]), (lay_b, spec.index["sw_b"])):
        rows, cols = lay.shape
        offs = np.array([[lay(r, c) for c in range(cols)] for r in range(rows)])
        assert sorted(offs.ravel().tolist()) == list(range(rows * cols))
        assert (offs // cols == np.arange(rows)[:, None]).all()
        chunks = offs.reshape(rows, cols // per, per)
        assert (chunks[..., 0] % per == 0).all()
        assert (np.diff(chunks, axis=2) == 1).all()
        assert all(fn(r, c) == offs[r, c] for r in range(rows) for c in range(cols))


def _fragment_loads(spec, swizzled=True):
    """(words per lane, width) of every fragment load one k-tile issues, for every warp:
    all k-steps and all atoms, with the kernel's addressing (mma_swizzle.fragment_loaders).
    gemmlib.banks.analyze looks at the first load only."""
    p = spec.params
    (lay_a, lay_b), eb = _layouts(spec)
    if not swizzled:
        lay_a, lay_b = lay_a.layout, lay_b.layout
    sixteen = eb == 2
    KA, HALF = (16, 8) if sixteen else (8, 4)
    BN, BK, WM, WN = p["BN"], p["BK"], p["WM"], p["WN"]
    loads = []
    for w in range(spec.threads // 32):
        wr, wc = (w // (BN // WN)) * WM, (w % (BN // WN)) * WN
        for kk in range(BK // KA):
            for i in range(WM // 16):                               # ldmatrix.x4 of A
                loads.append(([[lay_a(wr + 16 * i + l % 16, kk * KA + (l // 16) * HALF)
                                * eb // 4 + e for e in range(4)] for l in range(32)], 4))
            for j in range(0, WN // 8, 2 if sixteen else 1):
                if sixteen:                                         # ldmatrix.x4.trans of B
                    loads.append(([[lay_b(kk * 16 + l % 8 + (l // 8) % 2 * 8,
                                          wc + 8 * j + (l // 16) * 8) * eb // 4 + e
                                    for e in range(4)] for l in range(32)], 4))
                else:                                               # two scalar B loads
                    for dk in (0, 4):
                        loads.append(([[lay_b(kk * 8 + l % 4 + dk, wc + 8 * j + l // 4)]
                                       for l in range(32)], 1))
    return loads


@pytest.mark.parametrize("label,spec", TILES, ids=[t[0] for t in TILES])
def test_every_fragment_load_is_conflict_free(label, spec):
    """Not only the first: every ldmatrix (and TF32 scalar B load) of every warp, k-step
    and atom meets the ideal number of wavefronts; without the swizzle some do not."""
    for words, width in _fragment_loads(spec):
        w, ideal = banks.wavefronts(words, width)
        assert w == ideal, (label, w, ideal)
    plain = [banks.wavefronts(words, width) for words, width in _fragment_loads(spec, False)]
    assert any(w > ideal for w, ideal in plain)
    assert all(r.degree == 1.0 for r in banks.analyze(spec))


# --------------------------------------------------------------------------- 6. precision API


@lru_cache(maxsize=None)
def _small_pipeline(precision: str, stages: int = 2):
    """mma_pipeline with a one-warp 32 x 32 block tile: cheap in the simulator."""
    bk = 32 if precision in ("fp16", "bf16") else 16
    return mma_pipeline.build(precision, BM=32, BN=32, BK=bk, WM=32, WN=32, STAGES=stages)


def _rel_err(C, A, B):
    return backend.relative_error(C, backend.reference(A, B))


@pytest.mark.parametrize("shape", [(5, 7, 9), (17, 9, 33)])
def test_float16_inputs_run_in_fp16_on_tensor_cores(shape):
    """float16 host arrays, no arguments: the tuned fp16 pipeline (K and N padded to
    multiples of 8), float32 out, within the fp16 bound of the float64 product; the
    inputs are left untouched by the padding."""
    M, N, K = shape
    rng = np.random.default_rng(1)
    A = rng.uniform(-1, 1, (M, K)).astype(np.float16)
    B = rng.uniform(-1, 1, (K, N)).astype(np.float16)
    A0, B0 = A.copy(), B.copy()
    C = gemmlib.matmul(A, B, out_dtype=np.float32)
    assert C.dtype == np.float32 and C.shape == (M, N)
    assert gemmlib.matmul(A, B).dtype == np.float16   # by default: the inputs' type
    assert _rel_err(C, A, B) <= P.tolerance("fp16", K)
    np.testing.assert_array_equal(A, A0)
    np.testing.assert_array_equal(B, B0)


def test_tf32_and_3xtf32_through_matmul():
    """float32 inputs in tf32 and 3xtf32 (the tuned pipeline, K = 9 and N = 7 padded to
    multiples of 4): each within its bound, and 3xtf32 far more accurate than tf32.
    M above dispatch.skinny_limit, where decode-sized calls run the fp32 skinny rung."""
    rng = np.random.default_rng(2)
    M = dispatch.skinny_limit("tf32") + 1
    A = rng.uniform(-1, 1, (M, 9)).astype(np.float32)
    B = rng.uniform(-1, 1, (9, 7)).astype(np.float32)
    err = {}
    for prec in ("tf32", "3xtf32"):
        C = gemmlib.matmul(A, B, precision=prec)
        assert C.dtype == np.float32 and C.shape == (M, 7)
        err[prec] = _rel_err(C, A, B)
        assert err[prec] <= P.tolerance(prec, 9), (prec, err[prec])
    assert err["tf32"] > 1e-5                       # TF32 rounding really happened
    assert err["3xtf32"] < err["tf32"] / 100


def test_bf16_host_arrays_through_matmul():
    """BF16Array host data (as gemmlib.precision.to_bf16 makes it) runs in bf16."""
    rng = np.random.default_rng(4)
    A = P.to_bf16(rng.uniform(-1, 1, (6, 11)).astype(np.float32))
    B = P.to_bf16(rng.uniform(-1, 1, (11, 5)).astype(np.float32))
    C = gemmlib.matmul(A, B, kernel=_small_pipeline("bf16"), out_dtype=np.float32)
    assert C.dtype == np.float32 and C.shape == (6, 5)
    assert _rel_err(C, A, B) <= P.tolerance("bf16", 11)


@pytest.mark.parametrize("shape", [(17, 9, 21), (17, 16, 24)])
def test_out_is_written_in_place(shape):
    """``out=`` is returned and fully written, through the padded copy (N = 9) and
    directly (N, K multiples of 8): a NaN-poisoned out keeps no NaN."""
    M, N, K = shape
    rng = np.random.default_rng(6)
    A = rng.uniform(-1, 1, (M, K)).astype(np.float16)
    B = rng.uniform(-1, 1, (K, N)).astype(np.float16)
    out = np.full((M, N), np.nan, np.float32)
    C = gemmlib.matmul(A, B, out=out, kernel=_small_pipeline("fp16"))
    assert C is out
    assert np.isfinite(out).all()
    assert _rel_err(out, A, B) <= P.tolerance("fp16", K)


# --------------------------------------------------------------------------- 7. errors


def _host(dtype, shape=(4, 4)):
    return np.ones(shape, dtype=dtype)


def test_precision_errors():
    """Each misuse of precision= gets the error type and the hint the docs promise."""
    f32, f16 = _host(np.float32), _host(np.float16)
    with pytest.raises(TypeError, match=r"precision='fp16' takes float16 inputs, got float32"):
        gemmlib.matmul(f32, f32, precision="fp16")
    with pytest.raises(ValueError, match=r"precision must be one of.*'fp8'"):
        gemmlib.matmul(f32, f32, precision="fp8")
    with pytest.raises(ValueError, match=r"tensor-core rung.*mma_pipeline"):
        gemmlib.matmul(f32, f32, precision="tf32", kernel="naive")
    with pytest.raises(TypeError, match=r"A has dtype float16.*naive.*astype"):
        gemmlib.matmul(f16, f16, kernel="naive")
    with pytest.raises(TypeError, match=r"B has dtype float32.*float16"):
        gemmlib.matmul(f16, f32)
    with pytest.raises(ValueError, match=r"computes in tf32, not 3xtf32"):
        gemmlib.matmul(f32, f32, precision="3xtf32", kernel=_small_pipeline("tf32"))
    with pytest.raises(TypeError, match=r"out has dtype float16"):   # (f16 out of f16
        gemmlib.matmul(f32, f32, out=_host(np.float16))             # inputs: test_out16)
    with pytest.raises(ValueError, match=r"3xtf32"):
        mma_atom.build("3xtf32")


def test_tolerance_and_check_precision():
    assert P.tolerance("tf32", 64) > P.tolerance("3xtf32", 64) > P.tolerance("fp32", 64)
    assert P.tolerance("fp16", 4096) >= 0.5 * 2.0 ** -23 * 4096      # grows like K
    assert P.check_precision(None, "bfloat16") == "bf16"
    assert P.check_precision("3xtf32", "float32") == "3xtf32"
    with pytest.raises(ValueError):
        P.tolerance("int8", 4)
    with pytest.raises(TypeError, match="astype"):
        P.check_precision(None, "float64")


# --------------------------------------------------------------------------- 8. rungs


RUNG_CASES = [
    # mma_atom: 16 x 8 tiles, so (17, 9) crosses both edges; K ends in a partial k-step
    (mma_atom.build, "bf16", (17, 9, 20)),
    (mma_atom.build, "tf32", (17, 9, 20)),
    # mma_swizzle: one 64 x 64 block (test_kernels crosses its edges in fp16); two k-tiles,
    # the second partial (BK = 32 halves or 16 floats)
    (mma_swizzle.build, "bf16", (17, 9, 37)),
    (mma_swizzle.build, "tf32", (17, 9, 21)),
    (mma_swizzle.build, "3xtf32", (17, 9, 21)),
    # mma_pipeline's default tiles (tf32 and 3xtf32 run in test_tf32_and_3xtf32_through_matmul)
    (mma_pipeline.build, "bf16", (17, 9, 37)),
]


@pytest.mark.parametrize("build,precision,shape", RUNG_CASES,
                         ids=[f"{b.__module__.rsplit('.', 1)[1]}-{p}" for b, p, _ in RUNG_CASES])
def test_rung_in_each_precision(build, precision, shape):
    """The rungs in the precisions test_kernels.py does not run, within their bound."""
    spec = build(precision=precision)
    assert spec.precision == precision
    report = gemmlib.verify(spec, [shape], seed=0)
    assert report.ok, str(report)


@pytest.mark.parametrize("precision", ["fp16", "bf16", "tf32", "3xtf32"])
def test_pipeline_ring_wraps_and_crosses_tiles(precision):
    """A one-warp pipeline with 3 stages: M = 33 crosses the 32-row tile edge, and K spans
    more k-tiles than stages (the ring wraps) with a partial last one."""
    spec = _small_pipeline(precision, stages=3)
    K = 4 * spec.params["BK"] - 3
    report = gemmlib.verify(spec, [(33, 9, K)], seed=0)
    assert report.ok, str(report)


# --------------------------------------------------------------------------- 9. dispatch


def test_auto_in_a_tensor_core_precision_is_the_pipeline():
    hopper = (not backend.SIMULATOR
              and tuple(backend.device_info().compute_capability) == (9, 0))
    spec = dispatch.get_spec("auto", "fp16")
    assert spec.precision == "fp16"
    if hopper:                                  # fp16/bf16 on an H100/H200: wgmma
        assert spec.module == f"gemmlib.kernels.{dispatch.HOPPER_SPLIT}"
    elif backend.SIMULATOR:                     # no tuning data in the simulator: defaults
        assert spec.name == "mma_pipeline"
    else:                                       # on a GPU: the tile tuned for AUTO_SHAPE
        assert spec is dispatch.select_tc("fp16", *dispatch.AUTO_SHAPE)
        assert spec.module == mma_pipeline.__name__
    for prec in ("bf16", "tf32", "3xtf32"):
        s = dispatch.select_tc(prec, dispatch.skinny_limit(prec) + 1, 7, 9)   # above decode sizes
        assert s.precision == prec and s.dtype == P.INPUT_DTYPE[prec]
        assert s.module == (f"gemmlib.kernels.{dispatch.HOPPER_SPLIT}" if hopper and prec == "bf16"
                            else mma_pipeline.__name__)
    assert dispatch.get_spec("mma_swizzle", "bf16").precision == "bf16"
    assert dispatch.get_spec(dispatch.TC_AUTO, "tf32").name == "mma_pipeline_tf32"
    assert set(dispatch.TC_RUNGS) == {"mma_atom", "mma_swizzle", "mma_pipeline", "wgmma_async",
                                      "wgmma_tma", "wgmma_ws", "wgmma_split_k", "mma_split_k",
                                      "wgmma_tf32", "wgmma_fp8", "wgmma_pingpong",
                                      "wgmma_cluster", "wgmma_store"}


# --------------------------------------------------------------------------- the mma.sync ceiling


@pytest.mark.parametrize("precision, per_mma", [("fp16", 16 * 2.0 ** -16),   # k=16 products 2^-8*2^-8
                                                ("tf32", 8 * 2.0 ** -16)])
def test_mma_roof_kernel_keeps_every_chain(precision, per_mma):
    """gemmcourse.mma_roof's spinning kernel really issues CHAINS x iters dependent mma per warp:
    each thread's output sums its 4 accumulators of every chain (nothing folded away)."""
    from gemmcourse import mma_roof

    assert mma_roof.loop_source(3).count("= mma(") == 3
    if not backend.SIMULATOR:
        pytest.skip("the numbers below are the simulator's exact arithmetic")
    out = np.zeros(32, np.float32)
    mma_roof.build(precision, chains=2)[1, 32](3, out)
    # lane % 2 flips the lowest bit of each input: within 2^-9 relative of 2^-8
    np.testing.assert_allclose(out, 2 * 3 * 4 * per_mma, rtol=2.0 ** -8)
    with pytest.raises(ValueError, match="precision"):
        mma_roof.build("3xtf32")
