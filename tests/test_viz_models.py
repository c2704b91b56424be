"""gemmcourse.viz_models: the chapter-18 model of the shapes (roofline positions, tiles, waves,
split-K, stream-K, streams) follows its own definitions, and the measured tables and figures read
(synthetic, in-test, and the committed) models and host-cost files without inventing anything.
No GPU, no kernel launches."""

import json
import math
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from gemmlib import bench_models as bm  # noqa: E402
from gemmcourse import viz_models as vm  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


# --------------------------------------------------------------------------
# shapes and the roofline


def test_intensity_is_flops_over_the_fewest_bytes():
    for M, N, K in [(1, 6144, 4096), (16, 59136, 8192), (4096, 4096, 4096), (3, 5, 7)]:
        nbytes = 2 * (M * K + K * N) + 4 * M * N
        assert vm.intensity(M, N, K) == pytest.approx(2 * M * N * K / nbytes)
    # decode: about M FLOP per byte (B dominates the bytes)
    for M in (1, 4, 16):
        assert vm.intensity(M, 28672, 4096) == pytest.approx(M, rel=0.01)


def test_shape_records_are_the_suite():
    recs = vm.shape_records()
    assert len(recs) == len(bm.suite_shapes())
    suite = {(s.model, s.layer, s.tokens, s.M, s.N, s.K) for s in bm.suite_shapes()}
    assert {(d["model"], d["layer"], d["tokens"], d["M"], d["N"], d["K"]) for d in recs} == suite
    for d in recs:
        assert d["weight_bytes"] == 2 * d["K"] * d["N"]
        assert d["phase"] == ("sweep" if d["model"] == "sweep" else
                              "decode" if d["M"] <= bm.DECODE_M else "prefill")
    assert all(d["tokens"] == 1 for d in vm.shape_records(tokens=(1,), extra=False))


@pytest.mark.parametrize("ridge", [1.0, 50.0, 295.0, 330.0, 800.0])
def test_ridge_tokens_is_the_first_token_count_past_the_ridge(ridge):
    for model in bm.MODELS:
        for _, N, K in bm.projections(model):
            t = vm.ridge_tokens(N, K, ridge)
            assert t is not None and t >= 1
            assert vm.intensity(t, N, K) >= ridge
            assert t == 1 or vm.intensity(t - 1, N, K) < ridge


def test_ridge_tokens_none_when_out_of_reach():
    # the intensity tends to 2NK / (2K + 4N) < min(K, N / 2)
    assert vm.ridge_tokens(64, 64, 1000.0) is None


def _meta(gpu="NVIDIA H100 80GB HBM3", date="2026-01-01T00:00:00", **kw):
    return dict(dict(gpu=gpu, gpu_slug=gpu.lower().replace(" ", "-"), date=date, sm_count=132,
                     dram_copy_gbps=3000.0, fp32_peak_tflops=66.9), **kw)


def test_gpu_roof():
    ref = vm.gpu_roof(None)
    assert ref == vm.REFERENCE_GPU
    assert vm.ridge(ref) == pytest.approx(ref["tc_tflops"] * 1e3 / ref["dram_gbps"])
    r = vm.gpu_roof(dict(meta=_meta(), rows=[]))
    assert r["tc_tflops"] == vm.DATASHEET_TC_TFLOPS["fp16"] and r["dram_gbps"] == 3000.0
    assert r["bw_source"] == "measured copy" and r["sm_count"] == 132
    r = vm.gpu_roof(dict(meta=_meta("NVIDIA H200", dram_copy_gbps=None, sm_count=132), rows=[]))
    assert r["dram_gbps"] == vm.DATASHEET_DRAM_GBPS["H200"] and r["bw_source"] == "datasheet"
    other = dict(meta=_meta("Some GPU"), rows=[
        dict(precision="fp16", cublas_tflops=100.0), dict(precision="fp16", cublas_tflops=150.0),
        dict(precision="fp16", error="x"), dict(precision="3xtf32", cublas_tflops=999.0)])
    r = vm.gpu_roof(other)
    assert r["tc_tflops"] == 150.0 and r["tc_source"] == "best measured"


def test_bounds_and_position_table():
    roof = dict(vm.REFERENCE_GPU)
    for d in vm.shape_records():
        b = vm.bound_us(d["M"], d["N"], d["K"], roof)
        assert b * 1e-6 >= d["bytes"] / (roof["dram_gbps"] * 1e9) - 1e-15
        assert b * 1e-6 >= d["flops"] / (roof["tc_tflops"] * 1e12) - 1e-15
        assert vm.attainable_tflops(d["intensity"], roof) <= roof["tc_tflops"]
    t = vm.position_table(roof, tokens=(1, 4096))
    assert len(t.rows) == 2 * len(bm.MODELS) * 4
    R = vm.ridge(roof)
    for row in t.rows:
        assert row[5] == ("memory" if float(row[4]) < R else "compute")
    assert "<table" in t._repr_html_()


# --------------------------------------------------------------------------
# tiles, waves, split-K, stream-K


def test_tiles_waves_efficiency():
    assert vm.tiles(1, 4096) == 16 and vm.tiles(1024, 1024) == 32 and vm.tiles(8192, 256) == 64
    assert vm.tiles(1024, 10240) == 320 and vm.waves(320, 132) == 3
    assert vm.wave_efficiency(320, 132) == pytest.approx(320 / 396)
    assert vm.wave_efficiency(0, 132) == 0.0 and vm.wave_efficiency(132, 132) == 1.0
    assert vm.row_use(1) == 1 / 128 and vm.row_use(128) == 1.0 and vm.row_use(129) == 129 / 256
    for n in range(1, 600):
        w = vm.waves(n, 132)
        assert (w - 1) * 132 < n <= w * 132
    rec = vm.tile_record(16, 4096, 4096)
    assert rec["tiles"] == 16 and rec["busy_sms"] == 16 and rec["useful"] == pytest.approx(
        16 / 132 * 16 / 128)


@pytest.mark.parametrize("sms", [1, 4, 108, 114, 132])
def test_one_wave_splits(sms):
    for M, N in [(1024, 1024), (8192, 256), (1, 4096), (4096, 4096), (777, 1999), (1, 1)]:
        S, n = vm.one_wave_splits(M, N, sms), vm.tiles(M, N)
        assert S >= 1
        if n <= sms:
            assert n * S <= sms < n * (S + 1)
        else:
            assert S == 1
    assert vm.one_wave_splits(1024, 1024, 132) == 4


def test_split_k_table():
    t = vm.split_k_table(1024, 1024, 8192, 132, splits=range(1, 6))
    assert [r[0] for r in t.rows] == [f"split-K S={s}" for s in range(1, 6)] + ["stream-K"]
    s4, s5 = t.rows[3], t.rows[4]
    assert (s4[1], s4[2], s4[3], s4[4]) == (128, 1, 32, 32)
    assert (s5[1], s5[2], s5[3], s5[4]) == (160, 2, 26, 52)
    assert t.rows[-1][4] == vm.streamk_steps(32, 128, 132) == 32


@pytest.mark.parametrize("n_tiles,k_tiles,sms", [(5, 8, 4), (32, 128, 132), (64, 128, 132),
                                                  (3, 7, 5), (1, 1, 4), (9, 3, 2)])
def test_streamk_covers_every_iteration_once_evenly(n_tiles, k_tiles, sms):
    segs = vm.streamk_segments(n_tiles, k_tiles, sms)
    seen = {}
    per_block = {}
    for x, tile, k0, k1 in segs:
        assert 0 <= tile < n_tiles and 0 <= k0 < k1 <= k_tiles
        for k in range(k0, k1):
            seen[(tile, k)] = seen.get((tile, k), 0) + 1
        per_block[x] = per_block.get(x, 0) + (k1 - k0)
    assert seen == {(t, k): 1 for t in range(n_tiles) for k in range(k_tiles)}
    loads = [per_block.get(x, 0) for x in range(sms)]
    assert max(loads) - min(loads) <= 1 and max(loads) == vm.streamk_steps(n_tiles, k_tiles, sms)
    # each block's iterations are contiguous in tile-major order
    for x in range(sms):
        its = [t * k_tiles + k for bx, t, k0, k1 in segs if bx == x for k in range(k0, k1)]
        assert its == list(range(its[0], its[0] + len(its))) if its else True
    for tile, parts in vm.streamk_fixups(segs).items():
        assert parts[0][1] == 0 and len(parts) > 1                  # the owner holds k-tile 0
        assert [p[1] for p in parts] == sorted(p[1] for p in parts)  # added in k order
        assert all(a[2] == b[1] for a, b in zip(parts, parts[1:]))  # contiguous pieces


def test_data_parallel_segments():
    segs = vm.data_parallel_segments(5, 8, 4, splits=3)
    assert len(segs) == 15 and [s[0] for s in segs] == list(range(15))
    for tile in range(5):
        assert [(k0, k1) for _, t, k0, k1 in segs if t == tile] == [(0, 3), (3, 6), (6, 8)]


def test_work_split_figure():
    fig = vm.plot_work_split(5, 8, 4, 2)
    titles = [ax.get_title() for ax in fig.axes]
    assert titles[0].startswith("data-parallel") and "16 steps" in titles[0]
    assert "12 steps" in titles[1] and "10 steps" in titles[2] and "100%" in titles[2]


def test_wave_heat_figure():
    fig = vm.plot_wave_heat(132)
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert "16 tiles\n1 wave" in texts and len(texts) == len(bm.MODELS) * 4 * len(bm.TOKENS)


def test_tile_table_candidates():
    t = vm.tile_table(vm.shape_records(tokens=(1024,), extra=False), 132,
                      candidates=vm.CANDIDATE_TILES)
    # the default tile (128 x 256) is a candidate: its tiles and share only in its own column
    assert len(t.rows) == len(bm.MODELS) * 4 and len(t.header) == 4 + len(vm.CANDIDATE_TILES)
    row = next(r for r in t.rows if r[0] == "qwen2.5-72b" and r[1] == "qkv")
    assert row[3] == 3 and row[4] == "320/81%" and row[5] == "640/97%"
    other = vm.tile_table(vm.shape_records(tokens=(1024,), extra=False), 132,
                          candidates=vm.CANDIDATE_TILES[1:])
    assert len(other.header) == 6 + 3 and other.header[3] == "128x256 tiles"
    plain = vm.tile_table(vm.shape_records(tokens=(1024,), extra=False), 132)
    assert len(plain.header) == 8 and plain.rows[0][-2].startswith("1024x")


# --------------------------------------------------------------------------
# streams


def test_stream_model():
    sched, hazards = vm.stream_schedule(vm.side_stream_ops("torch side stream s"))
    assert hazards == []
    for a, b in zip(sched, sched[1:]):       # one stream: each starts after the previous ends
        assert b["start"] >= a["end"]
    sched, hazards = vm.stream_schedule(vm.side_stream_ops("another stream"))
    assert ("gemmlib.matmul(A, B)", "A.copy_(x)", "A") in hazards
    assert ("torch.relu(C)", "gemmlib.matmul(A, B)", "C") in hazards
    # an op never starts before it is issued, nor before its own stream's earlier work
    for i, o in enumerate(sched):
        assert o["start"] >= i * 1.0
    fig = vm.plot_streams()
    assert "every read comes after its write" in fig.axes[0].get_title()
    assert "reads A before" in fig.axes[1].get_title()


# --------------------------------------------------------------------------
# measured files (synthetic)


def _row(model, layer, t, N, K, prec="fp16", pct=50.0, kernel="wgmma_ws", inp="torch",
         ms=0.1, **kw):
    M = t
    r = dict(suite="models", input=inp, precision=prec, timing="loop", model=model, layer=layer,
             tokens=t, M=M, N=N, K=K, kernel=kernel, median_ms=ms, cublas_median_ms=ms * pct / 100,
             tflops=2 * M * N * K / (ms * 1e-3) / 1e12,
             cublas_tflops=2 * M * N * K / (ms * pct / 100 * 1e-3) / 1e12, pct_of_cublas=pct,
             pct_of_cublas_fp32=pct, reference=f"{inp}.matmul", host_us=25.0,
             cublas_host_us=17.0)
    r.update(kw)
    return r


def _models_data(gpu="NVIDIA H100 80GB HBM3", date="2026-01-01T00:00:00", error=True):
    rows = []
    for model in bm.MODELS:
        for layer, N, K in bm.projections(model):
            for t in (1, 16, 128):
                rows.append(_row(model, layer, t, N, K, pct=40.0 + t / 4))
                rows.append(_row(model, layer, t, N, K, prec="3xtf32", pct=20.0,
                                 kernel="mma_pipeline_3xtf32"))
    rows.append(_row("sweep", "", 0, 1024, 8192, pct=31.0, M=1024))
    if error:
        rows.append(dict(suite="models", input="torch", precision="fp16", model="llama-3.1-8b",
                         layer="o", tokens=4096, M=4096, N=4096, K=4096,
                         error="ConstraintError: test"))
    return dict(meta=_meta(gpu, date), rows=rows)


def _write(tmp_path, name, data):
    (tmp_path / name).write_text(json.dumps(data))


def test_models_files_newest_per_gpu(tmp_path):
    _write(tmp_path, "models-h100-2026-01-01.json", _models_data(date="2026-01-01"))
    _write(tmp_path, "models-h100-2026-02-01.json", _models_data(date="2026-02-01"))
    _write(tmp_path, "models-h200-2026-01-01.json", _models_data("NVIDIA H200", "2026-01-01"))
    _write(tmp_path, "models-sim.json", dict(meta=dict(simulated=True), rows=[]))
    _write(tmp_path, "models-not-a-suite.json", [1, 2])
    names = [n for n, _ in vm.models_files(tmp_path)]
    assert names == ["models-h100-2026-02-01.json", "models-h200-2026-01-01.json"]
    assert vm.models_files(tmp_path / "nowhere") == []


def test_measured_records_skip_errors_and_compute_bandwidth():
    data = _models_data()
    recs = vm.measured_records(data, "fp16")
    assert len(recs) == len(bm.MODELS) * 4 * 3 + 1 and all(d["precision"] == "fp16" for d in recs)
    assert len(vm.error_rows(data)) == 1
    d = next(d for d in recs if d["tokens"] == 1 and d["layer"] == "qkv")
    nbytes = bm.min_bytes(d["M"], d["N"], d["K"], 2)
    assert d["dram_gbps"] == pytest.approx(nbytes / (d["ms"] * 1e-3) / 1e9)
    assert d["dram_pct"] == pytest.approx(100 * d["dram_gbps"] / 3000.0)
    ref_bytes = bm.min_bytes(d["M"], d["N"], d["K"], 2, 2)
    assert d["ref_dram_gbps"] == pytest.approx(ref_bytes / (d["ref_ms"] * 1e-3) / 1e9)
    assert vm.inputs_of(dict(rows=[dict(input="cupy"), dict(input="torch")])) == ["torch", "cupy"]
    assert vm.measured_records({}) == []


def test_decode_table_and_bandwidth_vs_tiles():
    data = _models_data()
    t = vm.decode_table(data, "fp16", name="f.json")
    assert len(t.rows) == len(bm.MODELS) * 4 * 2                 # T = 1 and 16
    assert all(r[2] in (1, 16) for r in t.rows) and "f.json" in t.caption
    row = t.rows[0]
    assert row[5] == "wgmma_ws" and len(row) == len(t.header) == 10
    pts, rho = vm.bandwidth_vs_tiles(data)
    assert len(pts) == len(bm.MODELS) * 4 * 2 and rho is not None and -1 <= rho <= 1
    assert vm.bandwidth_vs_tiles(data, kernel="skinny") == ([], None)


def test_pct_summary_and_sweep_table():
    data = _models_data()
    s = vm.pct_summary(data, "fp16")
    assert set(s) == {"decode", "prefill", "sweep"}
    n, gm, lo, hi = s["sweep"]
    assert n == 1 and gm == pytest.approx(31.0) and lo == hi == 31.0
    assert s["decode"][2] == pytest.approx(40.25) and s["prefill"][3] == pytest.approx(72.0)
    t = vm.sweep_table(data)
    assert [r[1] for r in t.rows] == ["1024x1024x8192"] and t.rows[0][6] == 32


def test_measured_figures():
    data = _models_data()
    fig = vm.plot_pct_heat(data)
    heat_axes = [ax for ax in fig.axes if ax.get_title()]
    assert [ax.get_title().split(":")[0] for ax in heat_axes] == ["fp16", "3xtf32"]
    texts = [t.get_text() for t in heat_axes[0].texts]
    assert "failed" in texts and any(t.startswith("40%\nBW") for t in texts)
    fig = vm.plot_models_roofline(data)          # the legend under the plot, clear of points
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "gemmlib (measured)" in labels and "torch.matmul (measured)" in labels
    fig = vm.plot_models_roofline(None)
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "gemmlib (measured)" not in labels and "no measured points" in fig.axes[0].get_title()
    assert vm.file_summary("f.json", data).startswith("f.json: NVIDIA H100 80GB HBM3")
    assert "1 failed" in vm.file_summary("f.json", data)


def test_kernel_family_and_table():
    assert vm.kernel_family("wgmma_split_k_bf16_64x256_s3") == "wgmma_split_k"
    assert vm.kernel_family("wgmma_ws_bf16") == "wgmma_ws"
    assert vm.kernel_family("mma_split_k_3xtf32_128x128x32_w64x32_s3_splits2") == "mma_split_k"
    assert vm.kernel_family("skinny_m1_u8") == "skinny" and vm.kernel_family("x") == "x"
    data = _models_data()
    by = vm.kernels_by_tokens(data)
    assert by["fp16"][1] == {"wgmma_ws": 8} and by["3xtf32"][16] == {"mma_pipeline": 8}
    assert by["fp16"][0] == {"wgmma_ws": 1}                       # the extra shape
    t = vm.kernel_table(data, name="f.json")          # a row per token count
    assert t.header == ["tokens", "fp16", "3xtf32"] and t.rows[-1][0] == "extra shapes"
    assert t.rows[0][:2] == ["T=1", "8 wgmma_ws"] and "f.json" in t.caption


def _summary_numbers(line):
    gm, low = re.search(r"geometric mean ([\d.]+)%.* lowest ([\d.]+)%", line).groups()
    return float(gm), float(low)


def test_suite_summary_is_bench_models_summary():
    files = [("m.json", _models_data())] + vm.models_files()
    for name, data in files:
        mine = vm.suite_summary(data)
        theirs = [ln for ln in bm.summary(data) if "geometric mean" in ln]
        assert len(mine) == len(theirs), name
        for s in mine:
            line = next(ln for ln in theirs if ln.startswith(f"{s['input']} {s['precision']}:"))
            assert (round(s["gmean"], 1), round(s["lowest"], 1)) == _summary_numbers(line)
            pct = [d["pct"] for d in vm.measured_records(data, s["precision"], s["input"])]
            assert s["shapes"] == len(pct) and s["below"] == sum(p < 60 for p in pct)
    s = {d["precision"]: d for d in vm.suite_summary(_models_data())}
    assert s["fp16"]["failed"] == 1 and s["3xtf32"]["failed"] == 0
    assert s["3xtf32"]["below"] == len(bm.MODELS) * 4 * 3           # all at 20%
    assert s["fp16"]["lowest_shape"] == "sweep 1024x1024x8192"      # no layer: one space
    t = vm.suite_summary_table(files)
    assert len(t.rows) == sum(len(vm.suite_summary(d)) for _, d in files)
    assert "m.json" in t.caption
    assert vm.suite_summary_table([]).rows == []


# --------------------------------------------------------------------------
# the per-shape sweep of the Hopper tensor-core paths (synthetic, then committed)


def _tc_row(shape, M, N, K, cand, pct, kernel=None, splits=1, prec="fp16"):
    us = 10.0 + M * N * K / 1e9
    return dict(precision=prec, shape=shape, M=M, N=N, K=K, candidate=cand,
                kernel=kernel or {"ws": "wgmma_ws", "skinny": "skinny_m1"}.get(cand, cand),
                torch_us=us * pct / 100, splits=splits, grid=24, registers=168, local_bytes=0,
                median_us=us, pct_of_torch=pct, rel_error=1e-6)


def _tc_data(gpu="NVIDIA H100 80GB HBM3", date="2026-01-01T00:00:00"):
    rows = []
    for M in (1, 16, 128):
        rows.append(_tc_row("llama-3.1-8b.o", M, 4096, 4096, "ws", 35.0))
        kern = "skinny_m1_u8" if M == 1 else "wgmma_split_k_64x256_s3"
        rows.append(_tc_row("llama-3.1-8b.o", M, 4096, 4096, "auto", 70.0 if M == 1 else 30.0,
                            kern, 1 if M == 1 else 8))
        if M <= 16:
            rows.append(_tc_row("llama-3.1-8b.o", M, 4096, 4096, "skinny", 70.0 - M))
        rows.append(_tc_row("qwen2.5-72b.down", M, 8192, 29568, "ws", 60.0))
        rows.append(_tc_row("qwen2.5-72b.down", M, 8192, 29568, "auto", 90.0,
                            "wgmma_split_k_64x256_s3", 4))
    rows.append(_tc_row("sweep", 1024, 1024, 8192, "ws", 38.0))
    rows.append(_tc_row("sweep", 1024, 1024, 8192, "auto", 57.0, "wgmma_split_k", 4))
    rows.append(dict(_tc_row("sweep", 1024, 1024, 8192, "ws", 38.0, prec="bf16"),
                     error="ConstraintError: test"))
    return dict(meta=_meta(gpu, date, smi_clocks_mem="2619", max_sm_clock_mhz=1980.0,
                           compute_capability="9.0"), rows=rows)


def test_tc_shapes_files_and_records(tmp_path):
    _write(tmp_path, "tc-shapes-h100-2026-01-01.json", _tc_data(date="2026-01-01"))
    _write(tmp_path, "tc-shapes-h100-2026-02-01.json", _tc_data(date="2026-02-01"))
    _write(tmp_path, "tc-shapes-h200-2026-01-01.json", _tc_data("NVIDIA H200"))
    _write(tmp_path, "tc-shapes-broken.json", {"meta": {}})
    assert [n for n, _ in vm.tc_shapes_files(tmp_path)] == ["tc-shapes-h100-2026-02-01.json",
                                                            "tc-shapes-h200-2026-01-01.json"]
    assert vm.tc_shapes_files(tmp_path / "nowhere") == []
    recs = vm.tc_records(_tc_data())
    assert len(recs) == len(_tc_data()["rows"]) - 1                  # the error row left out
    d = recs[0]
    assert (d["model"], d["layer"], d["M"], d["candidate"]) == ("llama-3.1-8b", "o", 1, "ws")
    assert {(d["model"], d["layer"]) for d in recs if d["M"] == 1024} == {("sweep", "")}
    assert all(d["candidate"] == "auto" for d in vm.tc_records(_tc_data(), "fp16", "auto"))
    assert vm.tc_records({}) == []


def test_tc_summary():
    s = vm.tc_summary(_tc_data())
    assert list(s) == ["fp16"]
    f = s["fp16"]
    assert f["shapes"] == 7 and f["skinny"] == 1 and f["split"] == 6
    assert f["faster"] == 5                          # all but llama o at M = 16 and 128
    ws = [35.0] * 3 + [60.0] * 3 + [38.0]
    assert f["ws"] == pytest.approx(math.exp(sum(map(math.log, ws)) / 7))


def test_plot_tc_shapes():
    fig = vm.plot_tc_shapes(_tc_data())
    titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
    assert titles == ["llama-3.1-8b o: N=4096, K=4096", "qwen2.5-72b down: N=8192, K=29568",
                      "extra shapes (M x N x K)"]
    assert "S=8" in [t.get_text() for t in fig.axes[0].texts]
    assert "NVIDIA H100" in fig._suptitle.get_text()
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert any(lb.startswith("wgmma_ws") for lb in labels) and "skinny" in labels
    assert len(fig.axes[2].patches) == 2                             # ws and auto bars
    empty = vm.plot_tc_shapes(_tc_data(), "tf32")
    assert "no tf32 rows" in empty.axes[0].texts[0].get_text()


def test_ws_decode_points_and_copy_bandwidth():
    data = _tc_data()
    assert vm.copy_gbps_for(data, [("m.json", _models_data())]) == 3000.0
    assert vm.copy_gbps_for(data, [("m.json", _models_data("NVIDIA H200"))]) is None
    pts = vm.ws_decode_points(data, 3000.0)
    assert len(pts) == 4                                             # M = 1 and 16, two layers
    d = next(d for d in vm.tc_records(data, "fp16", "ws") if d["M"] == 1
             and d["N"] == 4096)
    want = 100 * bm.min_bytes(1, 4096, 4096, 2, 4) / (d["us"] * 1e-6) / 1e9 / 3000.0
    assert (16, pytest.approx(want)) in pts
    assert vm.ws_decode_points(data, None) == []
    assert vm.rank_correlation([(1, 2), (2, 3), (3, 5)]) == pytest.approx(1.0)
    assert vm.rank_correlation([(1, 2), (1, 3), (1, 5)]) is None
    assert vm.rank_correlation([(1, 2)]) is None


def test_file_device_and_split_choice_table():
    W = vm.split_k_module()
    meta = _tc_data()["meta"]
    dev = vm.file_device(meta)
    assert dev.sm_count == 132 and dev.compute_capability == (9, 0) and not dev.simulated
    assert dev.peak_bandwidth_gbs == pytest.approx(2 * 2619e6 * 5120 / 8 / 1e9)
    assert dev.fp32_peak_tflops == pytest.approx(132 * 128 * 2 * 1980e6 / 1e12)
    assert vm.file_device(dict(gpu="Some GPU", sm_count=10)).peak_bandwidth_gbs == 0
    if W is None:
        assert vm.split_choice_table(_tc_data()) is None
        return
    shapes = vm.split_shapes()
    assert ("sweep", "", 1024, 1024, 8192) in shapes and ("sweep", "", 8192, 256, 8192) in shapes
    t = vm.split_choice_table(_tc_data())
    assert len(t.rows) == len(shapes) and "132 SMs" in t.caption
    for (model, layer, M, N, K), row in zip(shapes, t.rows):
        assert row[1] == f"{M}x{N}x{K}" and row[2] == -(-K // 64)
        assert row[4] == W.effective_splits(W.splits_for(M, N, K, 64, 256, dev), K)
        assert row[6] == W.effective_splits(W.splits_for(M, N, K, 128, 256, dev), K)
        assert row[3] == vm.tiles(M, N, 64, 256) and row[5] == vm.tiles(M, N, 128, 256)
    sweep = next(r for r in t.rows if r[1] == "1024x1024x8192")
    assert sweep[-2:] == ["wgmma_split_k", 4]
    assert next(r for r in t.rows if r[1] == "8192x256x8192")[-2:] == ["-", "-"]


@pytest.mark.parametrize("M,N,K,S,BM", [(16, 4096, 4096, 4, 64), (1024, 1024, 8192, 4, 128),
                                         (100, 1000, 8192, 3, 64)])
def test_split_k_workspace_bytes(M, N, K, S, BM):
    if vm.split_k_module() is None:
        pytest.skip("no wgmma_split_k in this gemmlib")
    tiles = vm.tiles(M, N, BM, 256)
    # a slice's partials: a whole BM x 256 tile per tile (BN / 2 per consumer thread); one
    # int32 ticket counter per tile and consumer thread (2 BM of them)
    assert vm.split_k_workspace_bytes(M, N, K, S, BM) == 4 * S * tiles * BM * 256 \
        + 4 * tiles * 2 * BM


def test_committed_tc_shapes_files_parse():
    files = vm.tc_shapes_files()
    for name, data in files:
        s = vm.tc_summary(data)
        assert s, name
        for prec, v in s.items():
            assert v["shapes"] > 0 and 0 < v["ws"] and 0 < v["auto"], (name, prec)
            vm.plot_tc_shapes(data, prec)
            plt.close("all")
        if vm.split_k_module() is not None:
            t = vm.split_choice_table(data)
            assert len(t.rows) == len(vm.split_shapes())
        pts = vm.ws_decode_points(data, vm.copy_gbps_for(data, vm.models_files()) or 3000.0)
        assert all(n >= 1 and p > 0 for n, p in pts)


# --------------------------------------------------------------------------
# host cost


def _host_data(gpu="NVIDIA H100 80GB HBM3", date="2026-01-01"):
    return dict(meta=_meta(gpu, date), shape=[64, 64, 64], rows=[], frameworks=[
        dict(case="torch fp16", input="torch", precision="fp16", gemmlib_us=20.0,
             reference="torch.matmul", reference_us=16.0, torch_ratio=1.25),
        dict(case="cupy fp32", input="cupy", precision="fp32", gemmlib_us=25.0,
             reference="cupy.matmul", reference_us=26.0, cupy_ratio=25 / 26)])


def test_host_cost_sources(tmp_path):
    _write(tmp_path, "host-cost-h100-2026-01-01.json", _host_data(date="2026-01-01"))
    _write(tmp_path, "host-cost-h100-2026-02-01.json", dict(_host_data(date="2026-02-01"),
                                                            frameworks=[]))   # none: skipped
    (tmp_path / "models-2026-01-01").mkdir()
    _write(tmp_path / "models-2026-01-01", "host-cost-h100-first.json", _host_data())
    _write(tmp_path / "models-2026-01-01", "host-cost-h100-before-split-k.json", _host_data())
    src = vm.host_cost_sources(tmp_path)
    assert [n for _, n, _ in src] == ["host-cost-h100-2026-01-01.json",
                                      "models-2026-01-01/host-cost-h100-first.json"]
    assert "early" in src[1][0]
    t = vm.frameworks_table(src[0][2], src[0][0])
    assert [r[-1] for r in t.rows] == ["1.25x", "0.96x"] and "64x64x64" in t.caption
    fig = vm.plot_host_frameworks(src, [("m.json", _models_data())])
    assert len(fig.axes) == 3
    assert "64x64x64" in fig.axes[0].get_title()
    s = vm.suite_host_summary(_models_data())
    assert s[("torch", "fp16")][1:] == (25.0, 17.0)
    empty = vm.plot_host_frameworks([], [])
    assert vm.NOT_MEASURED in empty.axes[0].texts[0].get_text()


# --------------------------------------------------------------------------
# the committed files


def test_committed_models_files_parse():
    files = vm.models_files()
    for name, data in files:
        recs = vm.measured_records(data)
        assert recs, name
        copy = data["meta"].get("dram_copy_gbps")
        for r, d in zip([r for r in data["rows"] if "error" not in r], recs):
            assert (r["M"], r["N"], r["K"]) == (d["M"], d["N"], d["K"])
            if copy and "dram_pct_of_copy" in r:   # the suite's own figure, same definition
                assert d["dram_pct"] == pytest.approx(r["dram_pct_of_copy"], rel=1e-9)
        vm.decode_table(data)
        vm.plot_pct_heat(data)
        vm.plot_models_roofline(data)
        plt.close("all")


def test_committed_host_cost_sources_parse():
    for label, name, data in vm.host_cost_sources():
        assert data["frameworks"], name
        t = vm.frameworks_table(data, label)
        assert all(r[-1].endswith("x") for r in t.rows)


# --------------------------------------------------------------------------
# the skinny rung, present or not


def test_skinny_helpers_without_the_rung(monkeypatch, capsys):
    monkeypatch.setattr(vm, "skinny_module", lambda: None)
    assert vm.show_skinny_source() is False
    assert "not there yet" in capsys.readouterr().out
    assert vm.skinny_blocks(1, 4096, 4096) is None


def test_skinny_helpers_with_whatever_is_there():
    g = vm.skinny_blocks(1, 6144, 4096, 132)     # the rung's own rules, or None
    assert g is None or (len(g) == 3 and all(isinstance(v, int) and v >= 1 for v in g))


def test_show_functions(capsys):
    from gemmlib.frontends import torch_tensors

    shown = vm.show_functions(torch_tensors, ["describe", "no_such_function"])
    assert shown == ["describe"]
    assert "no_such_function is not in" in capsys.readouterr().out


# --------------------------------------------------------------------------
# the chapter


def _chapter_18_cells():
    """The cells of chapter 18's pages (18-models.ipynb and the pages after it)."""
    return [c for page in sorted((ROOT / "chapters").glob("18*.ipynb"))
            for c in json.loads(page.read_text())["cells"]]


def test_chapter_18_uses_only_helpers_that_exist():
    cells = _chapter_18_cells()
    src = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    for name in set(re.findall(r"\bvm\.(\w+)", src)):
        assert hasattr(vm, name), name
    for name in set(re.findall(r"\bbm\.(\w+)", src)):
        assert hasattr(bm, name), name


def test_chapter_18_exercise_solutions_pass_their_checks(capsys):
    from gemmcourse import notebook as nb

    roof = vm.gpu_roof(vm.models_files()[0][1] if vm.models_files() else None)
    M, N, K = 1, 8192, 29568
    decode_bytes = 2 * (M * K + K * N) + 4 * M * N
    assert nb.check_value(decode_bytes, vm.shape_records(tokens=(1,), extra=False)[-1]["bytes"],
                          "bytes moved")
    assert nb.check_value(1e6 * decode_bytes / (roof["dram_gbps"] * 1e9),
                          vm.bound_us(M, N, K, roof), "microseconds", rel=1e-3)
    assert nb.check_value(8 * 40, vm.tiles(1024, 10240), "tiles")
    assert nb.check_value(3, vm.waves(320, 132), "waves")
    assert nb.check_value(320 / 396, vm.wave_efficiency(320, 132), "share", rel=1e-3)

    def my_splits(M, N, sms):
        tiles = -(-M // 128) * -(-N // 256)
        return max(1, sms // tiles)

    assert nb.check_function(my_splits, vm.one_wave_splits,
                             [(M, N, s) for M, N in [(1024, 1024), (8192, 256), (1, 4096),
                                                     (128, 28672), (4096, 4096), (777, 1999)]
                              for s in (132, 114, 108)], "my_splits")

    def my_ridge_tokens(N, K, ridge):
        T = 1
        while 2 * T * N * K / (2 * (T * K + K * N) + 4 * T * N) < ridge:
            T += 1
        return T

    cases = [(N, K, r) for m in bm.MODELS for _, N, K in bm.projections(m)
             for r in (100, 295, 330, 500)]
    assert nb.check_function(my_ridge_tokens, vm.ridge_tokens, cases, "my_ridge_tokens")
    # the closed form of the solution agrees too
    closed = lambda N, K, r: math.ceil(2 * r * K * N / (2 * N * K - 2 * r * K - 4 * r * N))  # noqa: E731
    assert all(closed(*c) == vm.ridge_tokens(*c) for c in cases)
    assert capsys.readouterr().out.count("[correct]") == 7
    if vm.split_k_module() is None:
        return

    def my_workspace_bytes(M, N, K, S, BM):
        tiles = -(-M // BM) * -(-N // 256)
        return 4 * S * tiles * BM * 256 + 4 * tiles * 2 * BM

    cells = _chapter_18_cells()
    cell = next("".join(c["source"]) for c in cells
                if "def my_workspace_bytes" in "".join(c["source"]))
    ns = {}
    exec(cell[cell.index("cases = "):cell.index("if vm.")], ns)   # the chapter's own cases
    assert nb.check_function(my_workspace_bytes, vm.split_k_workspace_bytes, ns["cases"],
                             "my_workspace_bytes")
    W = vm.split_k_module()
    assert all(W.effective_splits(S, K) == S for M, N, K, S, BM in ns["cases"])   # as given
    # the solution's example: 16 x 4096 x 4096, 8 slices: 8 MiB of partials, 8 KiB of counters
    assert vm.split_k_workspace_bytes(16, 4096, 4096, 8) == 8 * 2**20 + 8 * 2**10
    assert capsys.readouterr().out.count("[correct]") == 1


def test_the_chapters_figures_are_legible_at_the_size_the_page_shows():
    """Each figure of chapter 18's pages fits the book's text column (so the page shows it
    at its own size) and sets no text under 9 pt; the host cost is one figure per panel."""
    import matplotlib.pyplot as plt

    from gemmcourse import notebook as nb
    from test_viz_hopper import legible

    nb._style_figures()
    data = _models_data()
    figs = [vm.plot_models_roofline(data), vm.plot_models_roofline(None), vm.plot_wave_heat(132),
            vm.plot_work_split(5, 8, 4, 2), vm.plot_pct_heat(data, precisions=["fp16"]),
            vm.plot_streams()]
    figs += vm.plot_tc_shapes_by_model(_tc_data(), "fp16")
    figs += [vm.plot_host_panel(title, rows) for title, rows in
             vm.host_panels([("NVIDIA H100 80GB HBM3", "h.json", _host_data())],
                            [("m.json", _models_data())])]
    assert len(figs) >= 10
    for fig in figs:
        assert legible(fig)
        plt.close(fig)
