"""gemmcourse.viz_precision: the pipeline schedule follows the kernel's rules, and the
tables and figures read (synthetic, in-test) result files without inventing anything."""

import json

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from gemmcourse import viz_precision as vp  # noqa: E402
from gemmlib.backend import DeviceInfo  # noqa: E402


# --------------------------------------------------------------------------
# the schedule


@pytest.mark.parametrize("stages", [2, 3, 4, 6])
@pytest.mark.parametrize("tiles", [0, 1, 3, 8, 13])
def test_schedule_follows_the_ring(stages, tiles):
    sched = vp.pipeline_schedule(stages, tiles, latency=3.0, compute=1.0)
    copy = {t: (s, e) for t, s, e, k in sched if k == "copy"}
    comp = {t: (s, e) for t, s, e, k in sched if k == "compute"}
    assert sorted(copy) == sorted(comp) == list(range(tiles))
    for t in range(tiles):
        assert comp[t][0] >= copy[t][1]                      # wait_group: the tile has landed
        if t:
            assert comp[t][0] >= comp[t - 1][1]              # one tile at a time
        if t < stages - 1:
            assert copy[t][0] == 0.0                         # the prologue
        else:
            assert copy[t][0] == comp[t - stages + 1][0]     # issued as tile t-(S-1) starts
        if t >= stages:                                      # buffer t % S was freed first
            assert copy[t][0] >= comp[t - stages][1]
    # at most STAGES-1 copies in flight at any issue time
    for t, (s, _) in copy.items():
        assert sum(1 for a, b in copy.values() if a <= s < b) <= stages - 1 or s == 0.0


def test_deeper_rings_hide_the_latency():
    idle = [vp.tensor_core_idle(vp.pipeline_schedule(s, 12, latency=3.0, compute=1.0))
            for s in (2, 3, 4, 5)]
    assert idle[0] > idle[1] > idle[2] == idle[3] == 0.0


def test_schedule_rejects_bad_input():
    with pytest.raises(ValueError):
        vp.pipeline_schedule(1, 4)
    with pytest.raises(ValueError):
        vp.pipeline_schedule(3, -1)


def test_plot_pipeline():
    fig = vp.plot_pipeline(stages=4, tiles=6)
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert labels[:4] == [f"cp.async -> buffer {b}" for b in range(4)]
    assert "tensor cores" in labels[-1]
    plt.close(fig)


# --------------------------------------------------------------------------
# synthetic result files (made up here, for the test only)


def _row(kernel, prec, M, tflops, cublas, err, cerr, timing="kernel", cprec=None):
    return dict(kernel=kernel, M=M, N=M, K=M, median_ms=1.0, tflops=tflops,
                cublas_tflops=cublas, pct_of_cublas=100.0 * tflops / cublas,
                rel_error_vs_fp64=err, note="mma_pipeline_test" if kernel != "cublas" else "",
                timing=timing, precision=prec, cublas_precision=cprec or prec,
                cublas_rel_error=cerr)


def _bench(gpu="NVIDIA H100 80GB HBM3", date="2030-01-01T00:00:00+00:00"):
    rows = [
        _row("auto", "fp16", 4096, 70.0, 100.0, 1e-6, 1e-6),       # 70%: met
        _row("auto", "bf16", 4096, 50.0, 100.0, 2e-6, 2e-6),       # 50%: missed
        _row("auto", "tf32", 4096, 30.0, 40.0, 3e-4, 3e-4),        # 75%: met
        _row("auto", "3xtf32", 4096, 20.0, 10.0, 1e-6, 1e-6, cprec="fp32"),   # met
        _row("auto", "3xtf32", 8192, 20.0, 10.0, 5e-6, 1e-6, cprec="fp32"),   # error: missed
        _row("auto", "fp16", 4096, 60.0, 90.0, 1e-6, 1e-6, timing="call"),
        _row("cublas", "fp16", 4096, 100.0, 100.0, 1e-6, 1e-6),
        _row("cublas", "fp32", 4096, 10.0, 10.0, 1e-6, 1e-6),
    ]
    slug = gpu.lower().replace(" ", "-")
    return {"meta": {"gpu": gpu, "gpu_slug": slug, "date": date}, "rows": rows}


def _accuracy():
    rows = []
    for p, e0 in (("fp32", 1e-7), ("tf32", 3e-4), ("3xtf32", 2e-7), ("fp16", 1e-7),
                  ("bf16", 1e-7)):
        for src in ("gemmlib", "cublas"):
            for K in (64, 256, 1024, 4096):
                rows.append(dict(precision=p, source=src, M=64, N=64, K=K,
                                 rel_error=e0 * (K / 64) ** 0.5))
    return {"meta": {"gpu": "NVIDIA H200", "gpu_slug": "nvidia-h200", "date": "2030-01-01"},
            "rows": rows}


def test_records_and_targets():
    recs = vp.precision_records(_bench())
    assert all(r["kernel"] != "cublas" for r in recs) and len(recs) == 6
    assert [r["precision"] for r in recs] == ["fp16", "fp16", "bf16", "tf32", "3xtf32", "3xtf32"]
    k = {(r["precision"], r["shape"][0]): r for r in recs if r["timing"] == "kernel"}
    assert k[("fp16", 4096)]["met"] is True
    assert k[("bf16", 4096)]["met"] is False
    assert k[("tf32", 4096)]["met"] is True
    assert k[("3xtf32", 4096)]["met"] is True
    assert k[("3xtf32", 8192)]["met"] is False         # 5x cuBLAS fp32's error
    assert k[("3xtf32", 4096)]["cublas_precision"] == "fp32"
    line = vp.targets_line(_bench())
    assert "3 of 5 targets met" in line and "bf16 4096x4096x4096" in line


def test_judge_3xtf32_needs_speed_and_accuracy():
    assert vp.judge("3xtf32", 9.0, 10.0, 90.0, 1e-6, 1e-6)[1] is False   # slower
    assert vp.judge("3xtf32", 11.0, 10.0, 110.0, 2e-6, 1e-6)[1] is True  # 2x error: in
    assert vp.judge("3xtf32", 11.0, 10.0, 110.0, None, 1e-6)[1] is None
    assert vp.judge("fp16", 1, 1, None, 0, 0)[1] is None


def test_table_and_bars():
    table = vp.precision_table(_bench(), "x.json")
    html = table._repr_html_()
    assert "<table" in html and "missed" in html and "met" in html and "fp32" in html
    assert "x.json" in html
    fig = vp.plot_precision_bars(_bench())
    assert len(fig.axes) == 2 and fig.axes[1].get_yscale() == "log"
    plt.close(fig)
    fig = vp.plot_precision_bars({"meta": {}, "rows": []})       # nothing: no exception
    plt.close(fig)


def test_accuracy_plot():
    series = vp.accuracy_series(_accuracy())
    assert len(series) == 10 and series[("tf32", "gemmlib")][0] == (64, 3e-4)
    fig = vp.plot_accuracy(_accuracy(), tolerances=True)
    ax = fig.axes[0]
    styles = {ln.get_label(): ln.get_linestyle() for ln in ax.get_lines()}
    assert styles["tf32, gemmlib"] == "-" and styles["tf32, cublas"] == "--"
    assert ax.get_xscale() == ax.get_yscale() == "log"
    plt.close(fig)


def test_intensity_and_peaks():
    # fp16 inputs at 4096^3: 2*4096^3 / (2*2*4096^2 + 4*4096^2)
    assert vp.intensity(4096, 4096, 4096, "fp16") == pytest.approx(2 * 4096 / 8)
    assert vp.intensity(4096, 4096, 4096, "tf32") == pytest.approx(2 * 4096 / 12)
    assert vp.datasheet_peaks("NVIDIA H100 80GB HBM3")["fp16"] == 989.4
    assert vp.datasheet_peaks("NVIDIA H200")["tf32"] == 494.7
    assert vp.datasheet_peaks("NVIDIA H100 PCIe") == {}
    assert vp.datasheet_peaks("Tesla T4") == {}


def test_roofline_tc():
    dev = DeviceInfo(name="NVIDIA H100 80GB HBM3", compute_capability=(9, 0), sm_count=132,
                     max_threads_per_block=1024, max_shared_per_block=48 * 1024,
                     max_shared_per_block_optin=227 * 1024, max_shared_per_sm=228 * 1024,
                     registers_per_block=65536, registers_per_sm=65536,
                     max_threads_per_sm=2048, max_grid=(2**31 - 1, 65535, 65535),
                     l2_bytes=50 * 2**20, warp_size=32, max_sm_clock_mhz=1980.0,
                     simulated=False, memory_clock_khz=2_619_000, memory_bus_bits=5120)
    fig = vp.plot_roofline_tc(dev, _bench(), roof=_roof())
    labels = [ln.get_label() for ln in fig.axes[0].get_lines()]
    assert sum("datasheet" in s for s in labels) == 3
    assert [s for s in labels if s.startswith("mma.sync")] == [
        "mma.sync FP16 (measured, register-only): 620.0 TFLOP/s",
        "mma.sync TF32 (measured, register-only): 300.0 TFLOP/s"]
    assert any(s.startswith("fp32 FMA") for s in labels)
    assert any("memory roof" in s for s in labels)
    plt.close(fig)
    from gemmlib import backend

    fig = vp.plot_roofline_tc(backend.device_info(), None)   # simulator: no exception
    plt.close(fig)


def test_files_newest_per_gpu_and_missing(tmp_path, capsys):
    (tmp_path / "bench-nvidia-h100-80gb-hbm3-2030-01-01-precision.json").write_text(
        json.dumps(_bench(date="2030-01-01")))
    (tmp_path / "bench-nvidia-h100-80gb-hbm3-2030-02-01-precision.json").write_text(
        json.dumps(_bench(date="2030-02-01")))
    (tmp_path / "bench-nvidia-h200-2030-01-01-precision.json").write_text(
        json.dumps(_bench("NVIDIA H200")))
    (tmp_path / "bench-nvidia-h200-2030-01-01-call.json").write_text(json.dumps({"rows": []}))
    sim = _bench("sim")
    sim["meta"]["simulated"] = True
    (tmp_path / "bench-sim-2030-03-01-precision.json").write_text(json.dumps(sim))
    files = vp.precision_files(tmp_path)
    assert [n for n, _ in files] == ["bench-nvidia-h100-80gb-hbm3-2030-02-01-precision.json",
                                     "bench-nvidia-h200-2030-01-01-precision.json"]
    (tmp_path / "accuracy-nvidia-h200-2030-01-01.json").write_text(json.dumps(_accuracy()))
    assert len(vp.accuracy_files(tmp_path)) == 1
    empty = tmp_path / "empty"
    empty.mkdir()
    assert vp.show_precisions(empty) == 0 and vp.show_accuracy(empty) == 0
    assert capsys.readouterr().out.count("not measured yet") == 2
    assert vp.show_precisions(tmp_path) == 2 and vp.show_accuracy(tmp_path) == 1
    plt.close("all")


def _roof(gpu="NVIDIA H100 80GB HBM3"):
    rows = [dict(precision="fp16", instruction="mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32",
                 chains=c, tflops=t, cublas_8192_tflops=775.0) for c, t in ((8, 590.0), (16, 620.0))]
    rows.append(dict(precision="tf32", instruction="mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32",
                     chains=8, tflops=300.0, cublas_8192_tflops=400.0))
    return {"meta": {"gpu": gpu, "date": "2030-01-01T00:00:00+00:00"}, "rows": rows}


def test_roof_table_takes_the_best_chain_count_and_our_8192_row():
    assert vp.roof_ceilings(_roof()) == {"fp16": 620.0, "tf32": 300.0}
    bench = {"meta": {"gpu": "x"}, "rows": [
        _row("auto", "fp16", 8192, 310.0, 775.0, 1e-6, 1e-6),
        _row("auto", "fp16", 8192, 300.0, 775.0, 1e-6, 1e-6, timing="call")]}
    rows = vp.roof_table(_roof(), bench).rows
    assert rows[0] == ["fp16", "m16n8k16", "620.0",
                       "775.0", "80.0%", "310.0", "50.0%"]   # kernel timing, not the call's
    assert rows[1][0] == "tf32" and rows[1][-2:] == ["-", "-"]   # no tf32 row measured


def test_show_mma_roof(tmp_path, capsys):
    assert vp.show_mma_roof(tmp_path) == 0
    assert "not measured yet" in capsys.readouterr().out
    (tmp_path / "mma-roof-nvidia-h100-80gb-hbm3.json").write_text(json.dumps(_roof()))
    assert vp.show_mma_roof(tmp_path) == 1
