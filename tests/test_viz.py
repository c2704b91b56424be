"""gemmlib.viz: the figures' data come from the kernels' own index functions."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

import gemmlib  # noqa: E402
from gemmlib import viz  # noqa: E402

RUNGS_WITH_C_ELEMENT = ["naive", "coalesced", "shared"]


@pytest.mark.parametrize("name", RUNGS_WITH_C_ELEMENT)
@pytest.mark.parametrize("M,N", [(1, 1), (40, 70), (64, 64), (33, 95)])
def test_every_element_owned_exactly_once(name, M, N):
    own = viz.ownership(gemmlib.get_kernel(name), M, N)
    assert (own.block_id >= 0).all()
    assert own.duplicates == 0
    spec = gemmlib.get_kernel(name)
    gx, gy, _ = spec.grid(M, N, 1)
    assert own.idle == gx * gy * spec.threads - M * N


def test_warps_follow_the_mapping():
    # naive: warp 0 runs down a column of C; coalesced: along a row.
    naive = viz.warp_elements(gemmlib.get_kernel("naive"))
    coal = viz.warp_elements(gemmlib.get_kernel("coalesced"))
    assert naive == [(r, 0) for r in range(32)]
    assert coal == [(0, c) for c in range(32)]


def test_warp_access_counts_segments():
    naive = viz.warp_access(gemmlib.get_kernel("naive"), 48, 48, 40)
    coal = viz.warp_access(gemmlib.get_kernel("coalesced"), 48, 48, 40)
    assert (naive["A"].lines, naive["A"].sectors, naive["B"].distinct) == (32, 32, 1)
    assert (coal["A"].distinct, coal["B"].lines, coal["B"].sectors) == (1, 1, 4)
    assert coal["B"].useful_fraction == 1.0
    assert naive["A"].useful_fraction == pytest.approx(1 / 8)


def test_warp_access_skips_lanes_outside_c():
    acc = viz.warp_access(gemmlib.get_kernel("coalesced"), 5, 7, 3)
    assert len(acc["B"].elements) == 7


def test_bare_index_function_with_block():
    def rows_down(bx, by, tx, ty):
        return bx * 16 + tx, by * 16 + ty

    own = viz.ownership(rows_down, 20, 20, block=(16, 16), grid=(2, 2))
    assert (own.block_id >= 0).all() and own.duplicates == 0
    assert viz.warp_access(rows_down, 48, 48, 40, block=(16, 16))["A"].sectors == 16


def test_tile_phases_and_loads():
    shared = gemmlib.get_kernel("shared")
    rows, cols, phases = viz.tile_phases(shared, 40, 50, 72, block_xy=(1, 1))
    assert rows == list(range(32, 64)) and cols == list(range(32, 64))
    assert phases == [(0, 32), (32, 64), (64, 96)]
    loads = viz.global_loads(shared, 64, 64, 64)
    assert loads["untiled"] == 2 * 64 * 64 * 64
    assert loads["untiled"] / loads["this_kernel"] == 32


def test_intensity():
    assert viz.gemm_intensity(2, 2, 2) == pytest.approx(16 / 48)


def test_figures_render():
    s = gemmlib.get_kernel("shared")
    figs = [
        viz.plot_thread_map(gemmlib.get_kernel("naive"), 64, 64),
        viz.plot_thread_map(gemmlib.get_kernel("coalesced"), 40, 40, window=(10, 12)),
        viz.plot_warp_access(gemmlib.get_kernel("naive"), 48, 48, 40),
        viz.plot_tile_phases(s, 40, 50, 72, block_xy=(1, 1)),
        viz.plot_roofline(20, 500, [("a", 0.25, None), ("b", 8, 1.5)]),
        viz.plot_results([dict(kernel="naive", M=n, N=n, K=n, tflops=n / 1e3) for n in (128, 256)]
                         + [dict(kernel="cublas", M=n, N=n, K=n, tflops=n / 10) for n in (128, 256)]),
        viz.plot_ladder([("naive", 0.5, 1.0), ("shared", 5.0, 10.0)]),
    ]
    for f in figs:
        assert f.axes
        plt.close(f)
