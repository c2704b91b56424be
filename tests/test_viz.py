"""gemmcourse.viz: the figures' data come from the kernels' own index functions."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

import gemmlib  # noqa: E402
from gemmcourse import viz  # noqa: E402

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


# --------------------------------------------------------------------------
# Chapter 13: split-K slices, host-cost and call-level figures and tables


def test_split_k_slices_cover_every_k_tile_once():
    from gemmlib.kernels.split_k import effective_splits

    for K in (1, 15, 16, 17, 70, 200, 3001, 8192):
        for BK in (8, 16):
            ktiles = -(-K // BK)
            for S in range(1, 10):
                eff = effective_splits(S, K, BK)
                slices = viz.split_k_slices(K, BK, eff)
                assert len(slices) == eff
                assert all(t1 > t0 for t0, t1 in slices)  # the grid's z: no empty slice
                assert [t for t0, t1 in slices for t in range(t0, t1)] == list(range(ktiles))
    assert viz.split_k_slices(200, 16, 3) == [(0, 5), (5, 10), (10, 13)]
    assert viz.split_k_slices(16, 16, 3) == [(0, 1), (1, 1), (2, 1)]  # empty beyond ktiles


def test_split_k_slices_is_the_kernels_rule():
    """Each slice of the split-K workspace holds the partial product of the k-tiles
    split_k_slices gives it (a one-warp tile: quick in the simulator)."""
    import numpy as np

    from gemmlib import backend, dispatch

    small = dict(BM=32, BN=16, BK=8, WM=32, WN=16, WNITER=1, TM=4, TN=4)
    spec = dispatch.build("split_k", dict(small, SPLITS=3))
    M, N, K = 37, 29, 70
    A = backend.random_matrix((M, K), np.float32, 5)
    B = backend.random_matrix((K, N), np.float32, 6)
    p = dispatch.plan(spec, M, N, K)
    W = backend.poisoned((p.splits * M, N))
    spec.kernel[p.grid, p.block, backend.kernel_stream(), p.shared_bytes](A, B, W)
    W, A, B = (backend.to_host(x).astype(np.float64) for x in (W, A, B))
    slices = viz.split_k_slices(K, small["BK"], p.splits)
    assert p.splits == 3 and slices == [(0, 3), (3, 6), (6, 9)]
    for z, (t0, t1) in enumerate(slices):
        k0, k1 = t0 * small["BK"], min(K, t1 * small["BK"])
        part = A[:, k0:k1] @ B[k0:k1]
        assert np.allclose(W[z * M:(z + 1) * M], part, rtol=0, atol=1e-5), z


def _host_cost_record(gpu="FAKE GPU", slug="fake-gpu", date="2000-01-01"):
    return {"meta": {"gpu": gpu, "gpu_slug": slug, "date": date}, "shape": [64, 64, 64],
            "calls": 10,
            "rows": [{"name": n, "host_us": v, "what": "test"} for n, v in
                     (("cupy.matmul(A, B, out=C)", 10.0), ("gemmlib.matmul(A, B, out=C)", 8.0),
                      ("numba launch, CuPy arrays", 50.0), ("dispatch.run", 3.0))],
            "steps": [{"step": s, "host_us": v} for s, v in
                      (("describe operands", 1.0), ("check operands", 2.0),
                       ("plan (memoised)", 0.5), ("driver launch", 3.0))],
            "first_call": {"import_s": 1.0, "cold_s": 5.0, "warm_s": 0.5}}


def _call_record(slug="fake-gpu", date="2000-01-01", kernel_rows=True):
    rows = []
    for i, (M, N, K) in enumerate([(1024, 1024, 1024), (1024, 1024, 8192), (512, 512, 512)]):
        for timing in ("call", "kernel") if kernel_rows else ("call",):
            for kernel, pct in (("auto", 60.0 + 10 * i + (5 if timing == "kernel" else 0)),
                                ("cublas", 100.0)):
                rows.append(dict(kernel=kernel, M=M, N=N, K=K, median_ms=1.0, tflops=1.0,
                                 pct_of_cublas=pct, timing=timing, note="split_k_s4" if i == 1
                                 else "", host_us=9.0 if timing == "call" else float("nan")))
    return {"meta": {"gpu": "FAKE GPU", "gpu_slug": slug, "date": date}, "rows": rows}


def test_chapter13_figures_render():
    figs = [
        viz.plot_split_k(96, 80, 200, 32, 32, 16, 3, block_xy=(1, 1)),
        viz.plot_split_k(37, 29, 70, 256, 128, 16, 1),
        viz.plot_host_costs(_host_cost_record()),
        viz.plot_host_costs({"rows": [], "steps": []}),
        viz.plot_call_level([dict(label="a", call=70.0, kernel=75.0, target=80),
                             dict(label="b", call=90.0, kernel=None, target=None)], title="t"),
        viz.plot_call_level([dict(label="a", call=70.0)]),
    ]
    for f in figs:
        assert f.axes
        plt.close(f)


def test_chapter13_tables_from_files(tmp_path, capsys):
    import json

    from gemmcourse import notebook as nb

    targets = {(1024, 1024, 1024): 70, (1024, 1024, 8192): 75, (8192, 8192, 8192): 90}
    assert nb.show_host_costs(tmp_path) == 0 and nb.show_call_level(targets, tmp_path) == 0
    assert capsys.readouterr().out.count(nb.NO_CALL_DATA) == 2

    (tmp_path / "host-cost-fake-gpu-2000-01-01.json").write_text(
        json.dumps(_host_cost_record()))
    (tmp_path / "host-cost-fake-gpu-1999-01-01.json").write_text(
        json.dumps(_host_cost_record(date="1999-01-01")))
    assert [n for n, _ in nb.host_cost_files(tmp_path)] == ["host-cost-fake-gpu-2000-01-01.json"]
    calls, parts = nb.host_cost_tables(_host_cost_record())
    assert len(calls.rows) == 4 and parts.rows[-1][:2] == ["sum of the steps", "6.50"]
    assert "5.00 s" in nb.first_call_line(_host_cost_record())
    assert nb.show_host_costs(tmp_path) == 1
    plt.close("all")

    (tmp_path / "bench-fake-gpu-2000-01-01-call.json").write_text(json.dumps(_call_record()))
    table, recs = nb.call_level_table("x", _call_record(), targets)
    by = {d["shape"]: d for d in recs}
    assert [d["shape"] for d in recs][:2] == [(1024, 1024, 1024), (1024, 1024, 8192)]
    assert by[(1024, 1024, 1024)]["met"] is False and by[(1024, 1024, 8192)]["met"] is False
    assert by[(512, 512, 512)]["met"] is None and by[(512, 512, 512)]["kernel"] == 85.0
    assert by[(1024, 1024, 8192)]["config"] == "split_k_s4" and len(table.rows) == 3
    # kernel timing from the plain benchmark of the same GPU when the call file has none
    plain = {"meta": {"gpu_slug": "fake-gpu", "date": "2000-01-01"},
             "rows": [dict(r, pct_of_cublas=r["pct_of_cublas"] + 1) for r in _call_record()["rows"]
                      if r["timing"] == "kernel"]}
    for r in plain["rows"]:
        del r["timing"]
    (tmp_path / "bench-fake-gpu-2000-01-01.json").write_text(json.dumps(plain))
    table, recs = nb.call_level_table("x", _call_record(kernel_rows=False), targets, tmp_path)
    assert "bench-fake-gpu-2000-01-01.json" in table.caption
    assert {d["shape"]: d["kernel"] for d in recs}[(512, 512, 512)] == 86.0
    capsys.readouterr()
    assert nb.show_call_level(targets, tmp_path) == 1
    out = capsys.readouterr().out
    assert "0 of 2 targets met" in out and "not measured: 8192x8192x8192" in out
    plt.close("all")
