"""gemmcourse.viz_tc: the tensor-core figures agree with the PTX ISA's rules, written out here
independently of the Layout objects they are computed from."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from gemmlib import banks
from gemmcourse import viz_tc  # noqa: E402
from gemmlib.kernels import mma_swizzle  # noqa: E402
from gemmlib.layout import chunk_swizzle  # noqa: E402


# (lane, value) of element (row, col), straight from the PTX ISA's fragment tables
def a16(r, c):   # m16n8k16 A: a0 (g, 2t..2t+1), a1 (g+8, ..), a2 (g, 2t+8..), a3 (g+8, 2t+8..)
    return 4 * (r % 8) + (c % 8) // 2, 2 * ((r >= 8) + 2 * (c >= 8)) + c % 2


def b16(k, n):   # m16n8k16 B: b0 (k = 2t..2t+1, n = g), b1 (k = 2t+8.., n = g)
    return 4 * n + (k % 8) // 2, 2 * (k >= 8) + k % 2


def c32(r, c):   # C/D: c0, c1 (g, 2t..2t+1), c2, c3 (g+8, ..)
    return 4 * (r % 8) + c // 2, c % 2 + 2 * (r >= 8)


def atf32(r, c):  # m16n8k8 TF32 A: a0 (g, t), a1 (g+8, t), a2 (g, t+4), a3 (g+8, t+4)
    return 4 * (r % 8) + c % 4, (r >= 8) + 2 * (c >= 4)


def btf32(k, n):  # m16n8k8 TF32 B: b0 (k = t, n = g), b1 (k = t+4, n = g)
    return 4 * n + k % 4, int(k >= 4)


RULES = [("fp16", "A", a16, (16, 16)), ("bf16", "B", b16, (16, 8)), ("fp16", "C", c32, (16, 8)),
         ("tf32", "A", atf32, (16, 8)), ("tf32", "B", btf32, (8, 8)), ("tf32", "C", c32, (16, 8))]


@pytest.mark.parametrize("kind,operand,rule,shape", RULES)
def test_fragment_map_follows_the_ptx_rule(kind, operand, rule, shape):
    lane, value = viz_tc.fragment_map(kind, operand)
    assert lane.shape == shape
    for (r, c), ln in np.ndenumerate(lane):
        assert (ln, value[r, c]) == rule(r, c), (kind, operand, r, c)
    # every lane holds the same number of elements
    assert np.bincount(lane.ravel(), minlength=32).tolist() == [lane.size // 32] * 32


def test_example_from_the_chapter():
    lane, value = viz_tc.fragment_map("fp16", "A")
    assert lane[9, 10] == 4 * 1 + 1 == 5
    assert value[9, 10] == 6          # register a3, low half


@pytest.mark.parametrize("trans", [False, True])
def test_ldmatrix_map(trans):
    row_lane, lane, half = viz_tc.ldmatrix_map(trans)
    assert row_lane.tolist() == list(range(8))
    for r in range(8):
        for c in range(8):
            want = (4 * c + r // 2, r % 2) if trans else (4 * r + c // 2, c % 2)
            assert (lane[r, c], half[r, c]) == want


def test_ldmatrix_x4_delivers_an_a16_fragment():
    # the four 8x8 matrices of ldmatrix.x4 (rows 0-7 / 8-15, k 0-7 / 8-15) give a0..a3
    _, lane8, half8 = viz_tc.ldmatrix_map(False)
    lane, value = viz_tc.fragment_map("fp16", "A")
    for (r, c), ln in np.ndenumerate(lane):
        assert ln == lane8[r % 8, c % 8] and value[r, c] % 2 == half8[r % 8, c % 8]


@pytest.mark.parametrize("row_elems,elem_bytes,rows,low,plain", [
    (32, 2, 8, 0, 4.0),    # fp16 A tile of mma_swizzle: 64-byte rows
    (64, 2, 8, 0, 8.0),    # fp16 B tile: 128-byte rows
    (16, 4, 8, 0, 4.0),    # tf32 A tile: 64-byte rows
    (64, 4, 4, 1, 4.0),    # tf32 B tile, scalar loads of 4 rows x 2 chunks
])
@pytest.mark.parametrize("rows_xor", [8, 4])
def test_swizzle_removes_conflicts(row_elems, elem_bytes, rows, low, plain, rows_xor):
    if rows_xor < rows:
        pytest.skip("a swizzle over fewer rows than are read cannot spread them all")
    assert viz_tc.read_conflicts(row_elems, elem_bytes, rows, low, False, rows_xor) == plain
    assert viz_tc.read_conflicts(row_elems, elem_bytes, rows, low, True, rows_xor) == 1.0
    chunk, group = viz_tc.swizzle_map(row_elems, elem_bytes, rows, low, True, rows_xor)
    sw = chunk_swizzle(row_elems, elem_bytes, rows_xor, low)
    per = 16 // elem_bytes
    for r in range(rows):          # each row keeps its chunks: a permutation of its slots
        assert sorted(chunk[r]) == list(range(row_elems // per))
        for c in range(chunk.shape[1]):
            assert chunk[r, c] == (sw(r * row_elems + c * per) % row_elems) // per
    plain_chunk, _ = viz_tc.swizzle_map(row_elems, elem_bytes, rows, low, swizzled=False)
    assert (plain_chunk == np.arange(chunk.shape[1])).all()


@pytest.mark.parametrize("precision", ["fp16", "tf32"])
def test_bank_degrees_match_gemmlib_banks(precision):
    spec = mma_swizzle.build(precision)
    deg = viz_tc.bank_degrees(spec)
    swz = {r.access.label: r.degree for r in banks.analyze(spec)}
    assert {k: v[1] for k, v in deg.items()} == swz
    assert all(v[1] == 1.0 and v[0] >= 4.0 for v in deg.values())


def test_figures_are_figures():
    figs = [viz_tc.plot_fragment(k, o) for k in ("tf32", "fp16") for o in "ABC"]
    figs += [viz_tc.plot_ldmatrix(False), viz_tc.plot_ldmatrix(True),
             viz_tc.plot_swizzle(32, 2), viz_tc.plot_swizzle(64, 4, rows=4, low=1, rows_xor=4),
             viz_tc.plot_bank_degrees(mma_swizzle.build("fp16"))]
    for f in figs:
        assert isinstance(f, matplotlib.figure.Figure)
    # fp16 A: each cell names its lane; the legend names the registers
    assert "5" in [t.get_text() for t in figs[3].axes[0].texts]
    assert "a0.lo" in [t.get_text() for t in figs[3].axes[0].get_legend().get_texts()]
    plt.close("all")


def test_tf32_b_figure_uses_the_kernels_swizzle():
    _, lay_b = mma_swizzle.tile_layouts(64, 64, 16, 4)
    assert lay_b.swizzle == chunk_swizzle(64, 4, rows_xor=4, low=1)


def test_bad_arguments():
    with pytest.raises(ValueError):
        viz_tc.fragment_map("fp8", "A")
    with pytest.raises(ValueError):
        viz_tc.operand_shape("fp16", "D")
