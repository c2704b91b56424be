"""gemmlib.layout: the algebra, the partitions the GEMM kernels use, generated code,
bank arithmetic, plots, and the layout-built kernel (simulator, small tiles)."""

import itertools

import numpy as np
import pytest

from gemmlib import layout as L
from gemmlib.layout import Layout, Partition, Tiling, composition, padded


# -- layouts ------------------------------------------------------------------

def test_default_is_column_major_and_row_major_is_its_transpose():
    cm = Layout((4, 3))
    assert cm.stride == (1, 4)
    assert cm(1, 0) == 1 and cm(0, 1) == 4
    rm = L.row_major((4, 3))
    assert rm.stride == (3, 1)
    assert (rm.offsets() == np.arange(12).reshape(4, 3)).all()
    assert (cm.offsets() == np.arange(12).reshape(3, 4).T).all()


def test_integer_coordinate_walks_column_major():
    lay = Layout((4, 3), (3, 1))
    assert [lay(k) for k in range(4)] == [0, 3, 6, 9]
    assert lay.get_coord(7) == (2, 1)


def test_size_cosize_and_padding():
    p = padded((128, 8), 4)
    assert p.stride == (1, 132)
    assert p.size == 128 * 8
    assert p.cosize == 132 * 7 + 128
    assert padded((4, 5), 2, major="row").stride == (7, 1)
    assert not p.is_compact() and p.is_injective()
    assert L.row_major((8, 4)).is_compact()


def test_out_of_shape_coordinate_raises():
    with pytest.raises(IndexError):
        Layout((4, 3))(4, 0)


def test_nested_shape_and_coalesce():
    lay = Layout(((2, 2), 3), ((1, 4), 2))
    assert lay((1, 1), 2) == 1 + 4 + 4
    assert lay(3, 2) == lay((1, 1), 2)  # an integer splits column-major inside a mode
    assert Layout(((2, 2), 3)).coalesce() == Layout(12, 1)
    assert Layout((4, 1, 3), (1, 7, 4)).coalesce() == Layout(12, 1)


def _brute_ok(a, b):
    r = composition(a, b)
    assert r.size == b.size
    for k in range(b.size):
        assert r(k) == a(b(k)), (a, b, r, k)
    return r


@pytest.mark.parametrize("a,b", [
    (L.row_major((4, 3)), Layout((2, 3), (2, 4))),       # every other row
    (Layout((4, 6)), Layout((2, 3), (1, 4))),
    (Layout((8, 4)), Layout(16, 2)),
    (Layout((6, 2), (8, 2)), Layout((4, 3), (3, 1))),
    (padded((8, 4), 1), Layout((4, 8), (8, 1))),          # read a padded tile transposed
    (Layout(24, 3), Layout((4, 6))),
    (Layout((4, 3)), Layout(5, 0)),                       # broadcast
])
def test_composition_matches_function_composition(a, b):
    _brute_ok(a, b)


def test_composition_random():
    rng = np.random.default_rng(0)
    done = 0
    for _ in range(300):
        ash = tuple(int(x) for x in rng.choice([1, 2, 4, 8], size=rng.integers(1, 4)))
        a = Layout(ash, tuple(int(x) for x in rng.choice([1, 2, 3, 5, 16], size=len(ash))))
        d = int(rng.choice([1, 2, 4]))
        s = int(rng.choice([1, 2, 4]))
        try:
            r = composition(a, Layout(s, d))
        except ValueError:
            continue
        done += 1
        for k in range(s):
            if k * d < a.size:
                assert r(k) == a(k * d)
    assert done > 50


def test_composition_refuses_what_is_not_a_layout():
    with pytest.raises(ValueError):
        composition(Layout((3, 4)), Layout(2, 2))


# -- generated code -----------------------------------------------------------

@pytest.mark.parametrize("lay", [padded((16, 8), 4), L.row_major((5, 7)),
                                 Layout(((2, 2), 3), ((1, 4), 2)), Layout(6, 3)])
def test_generated_source_is_the_layout(lay):
    fn = L.jit(lay.source("f"))
    shape = lay.shape if isinstance(lay.shape, tuple) else (lay.shape,)
    dims = [L.product(s) for s in shape]
    for c in itertools.product(*[range(n) for n in dims]):
        assert fn(*c) == lay(*c)
    assert "def f(" in fn.__source__


def test_generated_source_has_only_literals():
    src = padded((128, 8), 4).source("smem")
    assert src.strip().endswith("return c0 + c1 * 132")


# -- tiling and partitions ----------------------------------------------------

def test_tiling_covers_odd_matrix():
    t = Tiling((37, 29), (8, 8))
    assert t.count == (5, 4)
    own = t.owner()
    assert own[0, 0] == 0 and own[8, 0] == 1 and own[0, 8] == 5 and own[36, 28] == 19
    assert t.coord((4, 3), (4, 4)) == (36, 28) and t.inside((36, 28))
    assert not t.inside(t.coord((4, 3), (5, 0)))


def test_copy_partition_covers_tile_once_and_is_k_fastest():
    tA = Layout((32, 8), (8, 1))  # thread t -> (t // 8, t % 8): K varies fastest
    p = Partition((128, 8), tA)
    assert p.shape == (4, 1) and p.step == (32, 8)
    own = p.owners()
    assert (own >= 0).all()
    counts = np.bincount(own.ravel(), minlength=256)
    assert (counts == 4).all()
    assert [p.origin(t) for t in range(9)][-1] == (1, 0)
    assert p.coord(9, 2, 0) == (1 + 64, 1)


def test_projected_compute_partition():
    tC = Layout((16, 16), (16, 1))
    pa = Partition((128, 8), tC, proj=(True, False))  # rows of A, every k
    pb = Partition((128, 8), tC, proj=(False, True))  # rows of B (columns of C), every k
    pc = Partition((128, 128), tC)
    for t in (0, 17, 255):
        m0, n0 = pc.origin(t)
        assert pa.origin(t) == (m0, 0) and pb.origin(t) == (n0, 0)
        rows = {c[0] for c in pc.elements(t)}
        cols = {c[1] for c in pc.elements(t)}
        assert rows == {c[0] for c in pa.elements(t)}
        assert cols == {c[0] for c in pb.elements(t)}
        assert {c[1] for c in pa.elements(t)} == set(range(8))


def test_partition_refuses_non_dividing_thread_layout():
    with pytest.raises(ValueError):
        Partition((100, 8), Layout((32, 8), (8, 1)))


def test_partition_view_matches_layout():
    lay = padded((128, 8), 4)
    p = Partition((128, 8), Layout((32, 8), (8, 1)))
    base, sub = p.view(lay, 13)
    for i in range(4):
        assert base + sub(i, 0) == lay(*p.coord(13, i, 0))


@pytest.mark.parametrize("proj", [None, (True, False), (False, True)])
def test_partition_source_matches(proj):
    lay = padded((32, 8), 4)
    p = Partition((32, 8) if proj else (32, 32), Layout((8, 4), (4, 1)), proj)
    fc = L.jit(p.source("c"))
    fo = L.jit(p.source("o", lay)) if proj else None
    for t in range(32):
        for idx in np.ndindex(*p.shape):
            c = fc(t, *idx)
            assert tuple(c if isinstance(c, tuple) else (c,)) == p.coord(t, *idx)
            if fo:
                assert fo(t, *idx) == lay(*p.coord(t, *idx))


# -- banks --------------------------------------------------------------------

def test_padding_removes_bank_conflicts_of_the_copy():
    p = Partition((128, 8), Layout((32, 8), (8, 1)))
    ways = {pad: L.bank_conflicts(L.warp_access(p, padded((128, 8), pad), (0, 0)))
            for pad in (0, 1, 4)}
    assert ways == {0: 8, 1: 4, 4: 1}


def test_compute_reads_are_conflict_free():
    tC = Layout((16, 16), (16, 1))
    lay = padded((128, 8), 4)
    for proj in ((True, False), (False, True)):
        p = Partition((128, 8), tC, proj)
        for w in range(8):
            assert L.bank_conflicts(L.warp_access(p, lay, (3, 5), warp=w)) == 1


def test_banks_array():
    b = L.banks(padded((8, 4), 1))
    assert b[0, 1] == 9 and b.shape == (8, 4)


# -- plots --------------------------------------------------------------------

def test_plots_return_figures():
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    p = Partition((32, 8), Layout((16, 8), (8, 1)))
    figs = [L.plot_layout(padded((8, 4), 1)), L.plot_partition(p),
            L.plot_banks(padded((32, 8), 4), part=p),
            L.plot_banks(padded((8, 4), 0)), L.plot_tiling(Tiling((37, 29), (8, 8)))]
    for f in figs:
        assert isinstance(f, matplotlib.figure.Figure)
        plt.close(f)


# -- the layout-built kernel --------------------------------------------------

SMALL = dict(BM=16, BN=16, BK=4, copy_threads=(8, 4), mma_threads=(4, 8))


@pytest.mark.parametrize("indexing", ["layout", "hand"])
def test_layout_nt_small_tile_many_odd_shapes(indexing):
    import gemmlib
    from gemmlib.kernels import layout_nt

    spec = layout_nt.build(indexing=indexing, **SMALL)
    shapes = [(1, 1, 1), (17, 19, 5), (33, 7, 13), (5, 40, 9), (16, 16, 4), (20, 3, 0)]
    gemmlib.verify(spec, shapes, seed=1)


def test_layout_nt_default_spec_one_shape():
    import gemmlib

    spec = gemmlib.get_kernel("layout_nt")
    assert spec.b_operand == "NK" and spec.tile == (128, 128) and spec.threads == 256
    gemmlib.verify("layout_nt", [(37, 29, 13)], seed=2)
