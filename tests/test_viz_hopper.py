"""gemmcourse.viz_hopper: the chapter-17 figures follow the simulator twin's and TMA's address
rules, the schedules follow the kernels' barrier rules, and the result tables read
(synthetic, in-test) files without inventing anything.  No GPU, no kernel launches."""

import dataclasses
import json

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from gemmlib import layout as L  # noqa: E402
from gemmlib import tma  # noqa: E402
from gemmcourse import viz_hopper as vh  # noqa: E402
from gemmlib.intrinsics import hopper as H  # noqa: E402


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


# --------------------------------------------------------------------------
# the swizzle and the descriptors


def test_swizzle_slots_are_the_layout_chapters_xor():
    slots = vh.swizzle_slots(64)
    sw = L.chunk_swizzle(64, 2)
    for r in range(64):
        assert sorted(slots[r]) == list(range(8))            # a permutation of the row
        for c in range(8):
            assert slots[r, c] == c ^ (r % 8)
            assert sw(r * 64 + 8 * c) == r * 64 + 8 * slots[r, c]


def test_decode_inverts_desc_fields():
    for addr, lbo, sbo, swz in [(1024 + 32, 16, 1024, 128), (0x4400, 8192, 1024, 128),
                                (2048, 128, 256, 0), (0x3FFF0, 0x3FFF0, 16, 64)]:
        d = vh.decode_descriptor(H.desc_fields(addr, lbo, sbo, swz))
        assert d == dict(start=addr, lbo=lbo, sbo=sbo, swizzle=swz)


def _twin_addresses(monkeypatch, desc, rows, mn_major):
    """The byte addresses the simulator twin reads: a shared buffer whose 16-bit element
    at byte address a holds a // 2, read through hopper._operand."""
    buf = np.arange(1 << 16, dtype=np.uint16).view(np.uint8)
    monkeypatch.setattr(H, "_bytes_at", lambda addr, nbytes=0: (buf, addr))
    return H._operand(desc, rows, np.uint16, mn_major=mn_major).astype(np.int64) * 2


@pytest.mark.parametrize("swz", [0, 32, 64, 128])
@pytest.mark.parametrize("mn_major", [False, True])
@pytest.mark.parametrize("rows", [8, 64, 128])
def test_operand_addresses_agree_with_the_simulator_twin(monkeypatch, swz, mn_major, rows):
    lbo = {0: 128, 32: 2048, 64: 4096, 128: 8192}[swz] if mn_major else 128
    sbo = 256 if swz == 0 else 1024
    for start in (1024, 1024 + 32, 2048 + 64):
        desc = H.desc_fields(start, lbo, sbo, swz)
        want = _twin_addresses(monkeypatch, desc, rows, mn_major)
        assert np.array_equal(vh.operand_addresses(desc, rows, mn_major), want)


def test_kernel_descriptors_are_the_kernels_constants():
    from gemmlib.kernels import wgmma_async as WA

    for BN, halves in [(64, 1), (128, 2), (256, 1)]:
        ds = vh.kernel_descriptors(BN, halves)
        assert len(ds) == (WA.BK // 16) * (1 + halves)
        for d in ds:
            assert d["swizzle"] == 128 and d["sbo"] == WA.GROUP_BYTES
            if d["operand"] == "A":
                assert d["offset"] == d["half"] * WA.SLICE_BYTES + d["kstep"] * WA.A_KSTEP
            else:
                assert d["offset"] == d["kstep"] * WA.B_KSTEP and d["lbo"] == WA.PANEL_BYTES


@pytest.mark.parametrize("BM,BN", [(64, 64), (128, 128), (128, 256)])
def test_descriptors_read_what_tma_and_cp_async_wrote(BM, BN):
    """A's k-step kk reads elements (m, 16 kk + k) and B's (16 kk + k, n) exactly where the
    128-byte swizzle (TMA's, and wgmma_async's cp.async targets) stored them."""
    for d in vh.kernel_descriptors(BN, BM // 64):
        kk = d["kstep"]
        if d["operand"] == "A":
            addr = vh.operand_addresses(vh.descriptor_of(d), 64)
            for r in range(64):
                for k in range(16):
                    want = d["half"] * 8192 + 2 * tma.swizzled_offset(r, 16 * kk + k, 64, 2, 128)
                    assert addr[r, k] == want
        else:
            addr = vh.operand_addresses(vh.descriptor_of(d), BN, mn_major=True)
            for n in range(BN):
                for k in range(16):
                    want = (n // 64) * 8192 + 2 * tma.swizzled_offset(16 * kk + k, n % 64, 64,
                                                                      2, 128)
                    assert addr[n, k] == want


def test_kstep_reads_cover_each_chunk_once():
    ks, lab = vh.kstep_reads("A", 128, 128)
    assert ks.shape == (128, 8)
    for r in range(128):
        for s in range(8):
            assert lab[r, s] == s ^ (r % 8)                  # the logical chunk stored there
            assert ks[r, s] == lab[r, s] // 2                # 8 k per chunk, 16 per k-step
    ks, lab = vh.kstep_reads("B", 128, 256)
    assert ks.shape == (256, 8)
    assert (ks == (np.arange(256) % 64 // 16)[:, None]).all()   # 16 k-lines per k-step
    with pytest.raises(ValueError):
        vh.kstep_reads("C")


def test_descriptor_table():
    t = vh.descriptor_table(128, 128)
    assert len(t.rows) == 4 * 3 and "<table" in t._repr_html_()
    assert all(r[-1].startswith("0x4") for r in t.rows)      # swizzle mode 1 in bits 62-63


# --------------------------------------------------------------------------
# the accumulators


@pytest.mark.parametrize("n", [8, 16, 64, 256])
def test_accumulator_map(n):
    thread, value = vh.accumulator_map(n)
    assert np.bincount(thread.ravel(), minlength=128).tolist() == [n // 2] * 128
    for (r, c), t in np.ndenumerate(thread):
        assert t == 32 * (r // 16) + 4 * (r % 8) + (c % 8) // 2
        assert value[r, c] == 4 * (c // 8) + 2 * ((r % 16) >= 8) + c % 2


# --------------------------------------------------------------------------
# the schedules


def _rows(events, kind):
    return [(row, s, e, lab) for row, s, e, lab, k in events if k == kind]


def _no_overlap(intervals):
    iv = sorted(intervals)
    return all(a[1] <= b[0] + 1e-12 for a, b in zip(iv, iv[1:]))


@pytest.mark.parametrize("stages", [2, 3, 4])
@pytest.mark.parametrize("copy", [0.0, 1.0, 3.0, 7.0])
@pytest.mark.parametrize("fn", [vh.tma_schedule, vh.ws_schedule])
def test_schedules_obey_the_ring(fn, stages, copy):
    tiles, k_tiles = 3, 5
    ev = fn(stages, tiles, k_tiles, copy=copy, mma=1.0, epilogue=2.0, sync=0.3)
    copies = {lab: (row, s, e) for row, s, e, lab in _rows(ev, "copy")}
    mmas = {lab: (s, e) for _, s, e, lab in _rows(ev, "mma")}
    labels = [f"{t}.{k}" for t in range(tiles) for k in range(k_tiles)]
    assert sorted(copies) == sorted(mmas) == sorted(labels)
    assert _no_overlap(list(mmas.values()))                 # one wgmma at a time
    for s in range(stages):                                 # a stage holds one k-tile at a time
        assert _no_overlap([(a, b) for row, a, b in copies.values() if row == f"stage {s}"])
    for i, lab in enumerate(labels):
        assert copies[lab][0] == f"stage {(i if fn is vh.ws_schedule else i % k_tiles) % stages}"
        assert mmas[lab][0] >= copies[lab][2] - 1e-12        # computed after it has landed
    epi = _rows(ev, "epilogue")
    assert len(epi) == tiles
    for t, (_, s, _, _) in enumerate(epi):                  # C written after the last wgmma
        assert s >= mmas[f"{t}.{k_tiles - 1}"][1] - 1e-12


@pytest.mark.parametrize("stages", [2, 3, 4])
def test_ws_refills_a_stage_only_after_its_wgmma(stages):
    tiles, k_tiles = 3, 5
    ev = vh.ws_schedule(stages, tiles, k_tiles, copy=3.0, mma=1.0, epilogue=2.0, sync=0.3)
    labels = [f"{t}.{k}" for t in range(tiles) for k in range(k_tiles)]
    copies = {lab: s for _, s, _, lab in _rows(ev, "copy")}
    mmas = {lab: e for _, _, e, lab in _rows(ev, "mma")}
    for i in range(stages, len(labels)):
        assert copies[labels[i]] >= mmas[labels[i - stages]]
    # the producer runs ahead into the next tile before the epilogue is over
    epi0 = _rows(ev, "epilogue")[0]
    assert copies["1.0"] < epi0[2]


def test_warp_specialisation_wins_in_the_schematic():
    for args in [dict(), dict(stages=3, copy=2.0), dict(tiles=4, k_tiles=3, epilogue=3.0)]:
        a, b = vh.tma_schedule(**args), vh.ws_schedule(**args)
        assert vh.makespan(b) < vh.makespan(a)
        assert vh.tensor_core_busy(b) > vh.tensor_core_busy(a)
    # nothing to hide: back-to-back wgmma, only the epilogues idle the tensor cores
    ev = vh.ws_schedule(4, 2, 6, copy=0.0, mma=1.0, epilogue=0.0, sync=0.0)
    assert vh.tensor_core_busy(ev) == pytest.approx(1.0)


def test_schedule_rejects_bad_input():
    for fn in (vh.tma_schedule, vh.ws_schedule):
        with pytest.raises(ValueError):
            fn(1)
        with pytest.raises(ValueError):
            fn(3, tiles=0)
        with pytest.raises(ValueError):
            fn(3, copy=-1.0)


def test_timeline_figure():
    fig = vh.plot_ws_timeline(stages=3, tiles=2, k_tiles=4)
    assert len(fig.axes) == 2
    assert vh.SCHEMATIC in fig._suptitle.get_text()
    labels = [t.get_text() for t in fig.axes[1].get_yticklabels()]
    assert labels[0] == "producer" and "tensor cores" in labels


# --------------------------------------------------------------------------
# the exercises' references


@pytest.mark.parametrize("stages", [2, 3, 4, 5])
def test_expected_parity_against_a_barrier_model(stages):
    """A sequential run of the ring with mbarrier phases: try_wait(parity) succeeds once
    the phase of that parity has completed, i.e. while the current phase's parity differs."""
    full, empty = [0] * stages, [0] * stages      # completed phases per barrier
    done = lambda phases, parity: phases % 2 != parity  # noqa: E731
    for it in range(6 * stages):
        s = it % stages
        p_prod = vh.expected_parity(it, stages, "producer")
        p_cons = vh.expected_parity(it, stages, "consumer")
        assert done(empty[s], p_prod)                          # the stage is free now ...
        if it >= stages:                                       # ... and was not before its
            assert not done(empty[s] - 1, p_prod)              # previous release
        assert not done(full[s], p_cons)                       # not filled yet
        full[s] += 1                                           # the copy lands
        assert done(full[s], p_cons)
        empty[s] += 1                                          # the consumers release it
    with pytest.raises(ValueError):
        vh.expected_parity(0, 2, "both")


def test_stage_bytes_and_max_stages():
    for BM, BN in [(128, 128), (128, 256), (64, 64)]:
        assert vh.stage_bytes(BM, BN) == BM * 64 * 2 + 64 * BN * 2
    for BN in (128, 192, 256):
        s = vh.max_stages(128, BN)
        assert s * vh.stage_bytes(128, BN) + 1024 <= 227 * 1024
        assert s == 8 or (s + 1) * vh.stage_bytes(128, BN) + 1024 > 227 * 1024
    assert vh.max_stages(128, 256, limit=1024) == 0


# --------------------------------------------------------------------------
# committed results


def _row(kernel, prec, n, timing, pct, note="", host_us=None):
    return dict(kernel=kernel, M=n, N=n, K=n, precision=prec, timing=timing,
                tflops=pct * 7.0, cublas_tflops=700.0, pct_of_cublas=pct, note=note,
                median_ms=100.0 / pct, host_us=host_us if timing == "call" else None)


def _file(tmp_path, name, gpu, date, rows):
    data = dict(meta=dict(gpu=gpu, gpu_slug=gpu.lower().replace(" ", "-"), date=date), rows=rows)
    (tmp_path / name).write_text(json.dumps(data))
    return data


def _rows_for(prec="fp16", n=4096):
    rows = []
    for timing, ws in (("kernel", 85.0), ("call", 79.0)):
        rows += [_row("wgmma_ws", prec, n, timing, ws, "wgmma_ws", 50.0),
                 _row("wgmma_tma", prec, n, timing, 70.0, "wgmma_tma", 50.0),
                 _row("auto", prec, n, timing, 45.0, "mma_pipeline_128x128x64_w64x64_s3", 60.0),
                 _row("cublas", prec, n, timing, 100.0)]
    return rows


def test_hopper_records_and_targets(tmp_path):
    data = _file(tmp_path, "bench-x-2026-01-01-hopper.json", "GPU X", "2026-01-01",
                 _rows_for("fp16", 4096) + [_row("wgmma_ws", "bf16", 8192, "call", 81.0)])
    recs = vh.hopper_records(data)
    by = {(d["precision"], d["size"], d["label"]): d for d in recs}
    ws = by[("fp16", "4096x4096x4096", "wgmma_ws")]
    assert ws["pct"] == {"kernel": 85.0, "call": 79.0} and ws["met"] is False
    assert by[("bf16", "8192x8192x8192", "wgmma_ws")]["met"] is True
    auto = by[("fp16", "4096x4096x4096", "mma_pipeline (auto)")]
    assert auto["rung"] == "mma_pipeline" and auto["met"] is False
    assert by[("fp16", "4096x4096x4096", "cublas")]["met"] is None
    assert vh.pct_range(recs, "mma_pipeline (auto)") == (45.0, 45.0)
    assert vh.pct_range(recs, "mma_pipeline") is None
    assert vh.pct_range(recs, "wgmma_tma", "call") == (70.0, 70.0)
    line = vh.targets_line(data)
    assert "1 of 2" in line and "fp16 4096x4096x4096 (79.0%)" in line
    t = vh.hopper_table(data, "f.json")
    assert len(t.rows) == len(recs) and "GPU X" in t.caption
    assert vh.chart_labels(recs) == ["wgmma_ws", "wgmma_tma", "mma_pipeline (auto)"]
    fig = vh.plot_hopper_bars(data)
    assert len(fig.axes) == 2
    assert [p.get_text() for p in fig.legends[0].get_texts()] == [
        "wgmma_ws", "wgmma_tma", "mma_pipeline (auto)", f"target {vh.TARGET_PCT:g}%"]
    # one column per timing, "TFLOP/s (% of cuBLAS)"; a build named only when it is not the
    # rung's default (an auto row's tuned configuration)
    assert len(t.header) == len(t.rows[0]) == 6
    row = {(r[0], r[1], r[2]): r for r in t.rows}
    assert row[("fp16", "4096x4096x4096", "wgmma_ws")][3:] == ["595 (85.0%)", "553 (79.0%)",
                                                              "missed"]
    assert ("fp16", "4096x4096x4096",
            "mma_pipeline (auto: mma_pipeline_128x128x64_w64x64_s3)") in row
    assert row[("bf16", "8192x8192x8192", "wgmma_ws")][3:] == ["-", "567 (81.0%)", "met"]
    assert vh.plot_hopper_bars({"rows": []}) is not None


def test_ladder_order_and_host_table(tmp_path):
    rows = _rows_for("fp16", 4096) + [
        _row("mma_pipeline", "fp16", 4096, t, 40.0, "mma_pipeline", 60.0)
        for t in ("kernel", "call")] + [
        _row("wgmma_ws", "bf16", 4096, "kernel", 60.0), _row("wgmma_tma", "bf16", 4096,
                                                             "kernel", 65.0),
        _row("wgmma_ws_128x256_s4", "bf16", 4096, "kernel", 99.0)]   # a variant: ignored
    data = _file(tmp_path, "bench-x-2026-01-01-hopper.json", "GPU X", "2026-01-01", rows)
    ok, n, why = vh.ladder_order(data, "kernel")
    assert (ok, n) == (1, 2) and why == ["bf16 4096x4096x4096: wgmma_ws 60.0% <= wgmma_tma 65.0%"]
    assert vh.ladder_order(data, "call")[:2] == (1, 1)
    t = vh.host_table(data, "f.json")
    assert {r[0] for r in t.rows} == {"wgmma_ws", "wgmma_tma", "mma_pipeline (auto)",
                                      "mma_pipeline"}
    ws = next(r for r in t.rows if r[0] == "wgmma_ws")
    assert ws[3] == "50" and ws[4] == f"{1e3 * 100.0 / 85.0:.0f}"
    # wgmma_ws measured both by name and as kernel="auto": judged separately
    auto = [_row("auto", "fp16", 8192, "call", 91.0, "wgmma_ws")]
    both = dict(data, rows=data["rows"] + auto)
    assert "1 of 1" in vh.targets_line(both, "wgmma_ws (auto)")
    assert "0 of 1" in vh.targets_line(both, "wgmma_ws")


def test_rung_of():
    assert vh.rung_of({"kernel": "wgmma_tma"}) == "wgmma_tma"
    assert vh.rung_of({"kernel": "wgmma_ws_bf16_128x256_s4"}) == "wgmma_ws"
    assert vh.rung_of({"kernel": "cublas"}) == "cublas"
    assert vh.rung_of({"kernel": "auto", "note": "wgmma_ws_bf16"}) == "wgmma_ws"
    assert vh.rung_of({"kernel": "auto", "note": "mma_pipeline_bf16_128x128"}) == "mma_pipeline"
    assert vh.rung_of({"kernel": "auto", "note": "something else"}) == "auto"


def test_hopper_files_newest_per_gpu(tmp_path, capsys):
    _file(tmp_path, "bench-x-2026-01-01-hopper.json", "GPU X", "2026-01-01", _rows_for())
    _file(tmp_path, "bench-x-2026-02-01-hopper.json", "GPU X", "2026-02-01", _rows_for())
    _file(tmp_path, "bench-y-2026-01-01-hopper.json", "GPU Y", "2026-01-01", _rows_for())
    _file(tmp_path, "bench-y-2026-01-01-precision.json", "GPU Y", "2026-03-01", [])
    names = [n for n, _ in vh.hopper_files(tmp_path)]
    assert names == ["bench-x-2026-02-01-hopper.json", "bench-y-2026-01-01-hopper.json"]
    assert vh.show_hopper_results(tmp_path) == 2
    empty = tmp_path / "empty"
    empty.mkdir()
    assert vh.show_hopper_results(empty) == 0
    assert vh.NOT_MEASURED in capsys.readouterr().out


def test_tune_table(tmp_path):
    n = 8192
    rows = [dict(kernel="wgmma_ws", params={"BN": 256, "STAGES": 4}, median_ms=1.0,
                 tflops=2 * n ** 3 / 1e-3 / 1e12, pct_of_cublas=90.0)]
    _file(tmp_path, "tune-wgmma-ws-x-2026-01-01.json", "GPU X", "2026-01-01", rows)
    (name, data), = vh.tune_files(tmp_path)
    assert vh.implied_cube(data["rows"][0]) == n
    t = vh.tune_table(data, name)
    assert f"{n}^3" in t.caption and t.rows[0][1] == "BN=256, STAGES=4"
    assert vh.implied_cube({"tflops": None}) is None


def test_committed_hopper_results_parse():
    for name, data in vh.hopper_files():
        recs = vh.hopper_records(data)
        assert recs, name
        assert all(d["pct"] for d in recs), name


# --------------------------------------------------------------------------
# figures and helpers


def test_figures_draw():
    assert len(vh.plot_swizzle128(16).axes) == 1
    assert len(vh.plot_kstep_reads(128, 128, "A", lines=16).axes) == 1
    assert len(vh.plot_kstep_reads(128, 128, "B").axes) == 1
    assert len(vh.plot_accumulators(16).axes) == 1


def legible(fig, column_in=6.8, smallest_pt=9.0):
    """True when ``fig``, saved as the notebooks save it (100 dpi, tight box), fits the book's
    text column, so that the page shows it at its own size, and sets no text under
    ``smallest_pt``: no text on the page is then smaller than that. Raises with the culprit."""
    from matplotlib.text import Text

    fig.canvas.draw()
    box = fig.get_tightbbox(fig.canvas.get_renderer())
    width = box.width + 0.2                      # the inline backend pads 0.1 in a side
    assert width <= column_in, f"{width:.2f} in wide: the page would shrink it"
    small = [(t.get_text(), t.get_fontsize()) for t in fig.findobj(Text)
             if t.get_visible() and t.get_text().strip() and t.get_fontsize() < smallest_pt]
    assert not small, small[:5]
    return True


def test_the_chapters_figures_are_legible_at_the_size_the_page_shows():
    import matplotlib.pyplot as plt

    from gemmcourse import notebook as nb

    nb._style_figures()
    data = vh.epilogue_files()[0][1] if vh.epilogue_files() else None
    figs = [vh.plot_swizzle128(16), vh.plot_kstep_reads(128, 128, "A"),
            vh.plot_kstep_reads(128, 128, "B"), vh.plot_accumulators(16),
            vh.plot_ws_timeline(stages=4, tiles=2, k_tiles=6),
            vh.plot_tile_order_traffic(4096, 4096, 4096)]
    files = vh.hopper_files()
    if files:
        figs.append(vh.plot_hopper_bars(files[0][1]))
    if data is not None:
        figs.append(vh.plot_epilogue_timeline(data, n=4096, out="fp16"))
    final = vh.final_files()
    if final:
        fig, axes = plt.subplots(2, 1, figsize=(vh.PAGE_IN, 6.4))
        for ax, prec in zip(axes, ("fp16", "bf16")):
            vh.plot_steady(final, prec, ax=ax, key="auto16")
        fig.tight_layout()
        figs.append(fig)
    for fig in figs:
        assert legible(fig)
        plt.close(fig)


def test_sync_lines_find_the_fences():
    from gemmlib.kernels import wgmma_async, wgmma_ws, ws_pipeline

    a = " ".join(ln for _, ln in vh.sync_lines(wgmma_async))
    assert "fence_proxy_async" in a and "wgmma_commit" in a and "ptx_must" not in a
    w = " ".join(ln for _, ln in vh.sync_lines(wgmma_ws))
    assert "mbarrier_init" in w and "fewer()" in w
    ring = " ".join(ln for _, ln in vh.sync_lines(ws_pipeline))   # the ring's loops
    assert "mbarrier_arrive" in ring and "wait1()" in ring
    assert "copies the KT" not in ring and "guarded by" not in ring   # no docstring text


def test_runs_here(monkeypatch, capsys):
    from gemmlib import backend
    from gemmlib.kernels import wgmma_async

    spec = wgmma_async.build("fp16", BM=64, BN=64, STAGES=2)
    hopper = dataclasses.replace(backend.device_info(), compute_capability=(9, 0))
    monkeypatch.setattr(backend, "device_info", lambda *a: hopper)
    assert vh.runs_here(spec) is True
    for cc in ((8, 0), (10, 0)):
        other = dataclasses.replace(hopper, compute_capability=cc, name=f"GPU {cc}")
        monkeypatch.setattr(backend, "device_info", lambda *a, d=other: d)
        assert vh.runs_here(spec) is False
    assert capsys.readouterr().out.count("SKIPPED") == 2


def test_chapter_17_exercise_solutions_pass_their_checks(capsys):
    """The solutions the chapter gives pass the chapter's own check cells."""
    from gemmcourse import notebook as nb

    want = {d["kstep"]: (d["offset"], d["lbo"], d["sbo"], d["swizzle"])
            for d in vh.kernel_descriptors(BN=128, halves=1) if d["operand"] == "B"}
    assert nb.check_function(lambda kk: (2048 * kk, 8192, 1024, 128), lambda kk: want[kk],
                             [(kk,) for kk in range(4)], "my_b_descriptor (BN = 128)")

    def my_parity(it, stages, role):
        p = (it // stages) % 2
        return p if role == "consumer" else p ^ 1

    assert nb.check_function(my_parity, vh.expected_parity,
                             [(it, s, role) for s in (2, 3, 4) for it in range(13)
                              for role in ("consumer", "producer")], "my_parity")
    assert nb.check_function(
        lambda bn, limit: min(8, (limit - 1024) // (128 * 64 * 2 + 64 * bn * 2)),
        lambda bn, limit: vh.max_stages(128, bn, limit),
        [(bn, limit) for bn in (64, 128, 192, 256) for limit in (227 * 1024, 160 * 1024)],
        "my_max_stages")
    assert capsys.readouterr().out.count("[correct]") == 3


def test_ptx_evidence_in_the_simulator(capsys):
    from gemmlib import backend
    from gemmlib.kernels import wgmma_ws

    if not backend.SIMULATOR:
        pytest.skip("simulator-only expectation")
    assert vh.ptx_evidence(wgmma_ws.build("fp16", BM=128, BN=64, STAGES=2)) is None
    assert "compiles nothing" in capsys.readouterr().out


def test_wholeprogram_table_reads_the_committed_run():
    files = vh.wholeprogram_files()
    assert files
    for name, data in files:
        t = vh.wholeprogram_table(data, name)
        assert len(t.rows) >= 4 and all(len(r) == 5 for r in t.rows)
        assert all(c.endswith("%") or c in ("-", "error") for r in t.rows for c in r[2:])


def test_lowp_tables_read_the_committed_runs():
    """Chapter 17's TF32 / FP8 tables come from the committed runs of 2026-11-25."""
    files = vh.lowp_files()
    assert any("bench" in d for _, d in files) and any("speed" in d for _, d in files)
    for name, data in files:
        t = vh.lowp_table(data, name)
        assert t.rows and all(len(r) == len(t.header) for r in t.rows)
    tf = next(d for n, d in files if "bench" in d)
    rows = {r[0]: r for r in vh.lowp_table(tf).rows}
    assert rows["4096x4096x4096"][1].endswith("%") and rows["4096x4096x4096"][2].endswith("%")


def test_l2_bytes_per_ktile_counts_a_box_and_the_panels_a_block_copies():
    t = vh.l2_bytes_per_ktile(128, 256, 1)
    assert (t["a_bytes"], t["b_bytes"]) == (16384, 32768) and t["flops"] == 2 * 128 * 256 * 64
    assert vh.l2_bytes_per_ktile(128, 256, 2)["b_bytes"] == 16384
    assert vh.l2_bytes_per_ktile(64, 192, 2)["b_bytes"] == 2 * 64 * 64 * 2   # 3 panels: 2 + 1
    rows = vh.l2_traffic_table().rows
    assert [r[0] for r in rows][:2] == ["wgmma_ws", "wgmma_cluster"]


def test_lastmile_table_reads_the_committed_run():
    files = vh.lastmile_files()
    assert files, "results/lastmile-*/diag*.json"
    name, data = files[-1]
    t = vh.lastmile_table(data, name)
    kernels = [r[0] for r in t.rows]
    assert "wgmma_cluster" in kernels and any(k.startswith("wgmma_pingpong") for k in kernels)
    base = next(r for r in t.rows if r[0] == "wgmma_ws_128x256_s4")
    assert base[3] == "100.0%" and "132 blocks" in t.caption


def test_power_table_reads_the_committed_loop_gap_runs():
    files = vh.loopgap_files()
    assert {n for n, _ in files} >= {"loopgap-h100.json", "loopgap-h200.json"}
    for name, data in files:
        t = vh.power_table(data, name)
        assert len(t.rows) == 12 and t.rows[0][1] == "torch"
        assert all(float(r[5]) > 0 for r in t.rows)   # long-loop microseconds


def test_steady_summary_takes_auto_and_the_best_rung():
    rows = [dict(precision="fp16", M=8, N=8, K=8, label=lab, torch_us=10.0, pct_of_torch=p)
            for lab, p in (("auto", 80.0), ("auto_fp32", 85.0), ("ws4", 90.0), ("c2", 70.0))]
    s = vh.steady_summary({"rows": rows})[("fp16", (8, 8, 8))]
    assert (s["auto"], s["auto16"], s["best"], s["best_label"]) == (85.0, 80.0, 90.0, "ws4")
    files = vh.steady_files()
    assert {n for n, _ in files} == {"steady-h100.json", "steady-h200.json"}
    for name, data in files:
        assert len(vh.steady_table(data, name).rows) == 14   # 7 shapes x fp16, bf16
    import matplotlib
    matplotlib.use("Agg")
    ax = vh.plot_steady(files)
    assert len(ax.patches) == 2 * 7


def test_epilogue_table_reads_the_committed_measurement():
    files = vh.epilogue_files()
    assert [n for n, _ in files][:1] == ["epilogue-h100.json"]
    t = vh.epilogue_table(files[0][1], files[0][0])
    labels = {r[3] for r in t.rows}
    assert labels == {"ws", "nostore", "store"} and all(r[6].endswith("%") for r in t.rows)


def test_epilogue_schedules_follow_the_measured_costs():
    data = vh.epilogue_files()[0][1]
    c = vh.epilogue_costs(data)
    assert c["tiles_per_block"] == 4 and 0 < c["stage"] < c["epilogue"] < c["mainloop"]
    ev = vh.epilogue_schedules(10.0, 2.0, 1.0, tiles=3)
    assert vh.busy_fraction(ev["wgmma_ws"]) == pytest.approx(30 / 34)   # ends before the last store
    assert vh.busy_fraction(ev["wgmma_store"]) == pytest.approx(30 / 32)
    assert vh.busy_fraction(ev["ping-pong"]) == pytest.approx(1.0)       # stores hide
    copies = [e for e in ev["wgmma_store"] if e[0] == "copy engine"]
    assert len(copies) == 3 and copies[0][1] == 11.0                     # after the staging
    matplotlib.use("Agg")
    fig = vh.plot_epilogue_timeline(data)
    assert len(fig.axes) == 3


def test_store_steady_table_has_every_candidate():
    files = vh.store_steady_files()
    assert [n for n, _ in files][:1] == ["steady-store-h100.json"]
    t = vh.rung_pct_table(files[0][1])
    assert len(t.rows) == 8 and all(c.endswith("%") for r in t.rows for c in r[2:])


def test_grouped_order_is_the_kernels_tile_order():
    from gemmlib.kernels.wgmma_async import grouped_order, tile_order

    for M, N, BM, BN, G in ((4096, 4096, 128, 256, 8), (1000, 3000, 128, 128, 3),
                            (300, 520, 64, 256, 8)):
        dev = tile_order(BM, BN, G)
        tiles = -(-M // BM) * -(-N // BN)
        want = [tuple(int(v) for v in dev(p, M, N)) for p in range(tiles)]
        got = [grouped_order(BM, BN, G)(p, M, N) for p in range(tiles)]
        assert got == want
        assert len(set(got)) == tiles                                     # each tile once


def test_wave_traffic_counts_each_tile_once():
    wave_of, waves = vh.wave_traffic(4096, 4096, 4096)
    assert wave_of.shape == (32, 16) and wave_of.max() == 3
    assert [w["tiles"] for w in waves] == [132, 132, 132, 116]
    a, b = 128 * 4096 * 2, 256 * 4096 * 2
    assert waves[0]["l2_bytes"] == 132 * (a + b)
    assert waves[0]["l2_bytes_cluster2"] == 132 * a + 66 * b              # pairs share B
    assert waves[0]["dram_bytes"] < waves[0]["l2_bytes_cluster2"] < waves[0]["l2_bytes"]
    matplotlib.use("Agg")
    assert len(vh.plot_tile_order_traffic().axes) == 3                    # two plots, a colorbar


def test_wave_quantisation_bounds_a_tail_split():
    q = vh.wave_quantisation(4096, 4096)
    assert (q["tiles"], q["rounds"]) == (512, 4) and q["busy"] == pytest.approx(512 / 528)
    assert vh.wave_quantisation(4096, 59136)["busy"] == 1.0        # 7392 = 56 x 132 tiles
    assert vh.wave_quantisation(8192, 256)["rounds"] == 1
    t = vh.tail_split_table()
    assert t.rows[0][0] == "2048x2048x2048" and all(int(r[0].split("x")[0]) >= 2048 for r in t.rows)


def test_target_table_marks_each_shape_against_its_target():
    rows = [dict(precision="fp16", M=4096, N=4096, K=4096, label=lab, kernel="k", us=1.0,
                 torch_us=1.0, pct_of_torch=pct)
            for lab, pct in (("auto", 96.0), ("auto_fp32", 90.0), ("ws3_o16", 89.0))]
    rows += [dict(precision="bf16", M=2048, N=2048, K=2048, label="auto", kernel="k", us=1.0,
                  torch_us=1.0, pct_of_torch=89.5)]
    t = vh.target_table({"rows": rows})
    assert [tuple(r[-2:]) for r in t.rows] == [("95%", "met"), ("90%", "missed")]
    assert tuple(t.rows[0][3:6]) == ("96.0%", "90.0%", "89.0%") and t.rows[1][5] == "-"
    files = vh.final_files()
    assert files and all(len(vh.target_table(d, n).rows) == 14 for n, d in files)
    ax = vh.plot_steady(files, "bf16", key="auto16")
    assert "16-bit out" in ax.get_title() and len(ax.patches) == 7 * len(files)


# --------------------------------------------------------------------------
# B's k-tile, K-major or MN-major (page 17g)


def test_b_boxes_are_the_loaders():
    from gemmlib.kernels import wgmma_async as WA, wgmma_tma

    assert vh.b_box("KN") == tuple(wgmma_tma.tma_boxes(128)[1]) == (WA.BK, 64)
    rows, cols = vh.b_box("NK", 256)
    assert (rows, cols) == (256, WA.BK) and cols * 2 == WA.ROW_BYTES   # one 128-byte row per n
    with pytest.raises(ValueError):
        vh.b_box("TN")


@pytest.mark.parametrize("BN", [64, 128, 256])
@pytest.mark.parametrize("layout", ["KN", "NK"])
def test_b_tile_offsets_fill_the_tile_once(BN, layout):
    """Every element of the 64-deep k-tile gets its own 2 bytes, inside BN * 128 bytes."""
    offs = {vh.b_tile_offset(n, k, layout, BN) for n in range(BN) for k in range(64)}
    assert len(offs) == BN * 64 and min(offs) == 0 and max(offs) == BN * 128 - 2
    assert all(o % 2 == 0 for o in offs)


def test_b_tile_offsets_follow_the_tma_swizzle():
    from gemmlib.kernels import wgmma_async as WA

    for n in range(0, 128, 5):
        for k in range(0, 64, 3):
            # K-major: the tile is A's layout, row n, chunk k // 8 XOR-ed with n mod 8
            nk = vh.b_tile_offset(n, k, "NK")
            assert nk == 2 * tma.swizzled_offset(n, k, 64, 2, 128)
            assert nk == n * 128 + (((k // 8) ^ (n % 8)) << 4) + 2 * (k % 8)
            # MN-major: panel n // 64 (PANEL_BYTES each), row k, chunk (n % 64) // 8 ^ k mod 8
            assert vh.b_tile_offset(n, k, "KN") == (
                (n // 64) * WA.PANEL_BYTES + k * 128 + ((((n % 64) // 8) ^ (k % 8)) << 4)
                + 2 * (n % 8))
    with pytest.raises(ValueError):
        vh.b_tile_offset(128, 0, "NK", BN=128)
    with pytest.raises(ValueError):
        vh.b_tile_offset(0, 64, "KN")


def test_b_landing_chunks_run_along_the_contiguous_dimension():
    for layout, axis in (("KN", 0), ("NK", 1)):        # 8 n of one k, or 8 k of one n
        line, chunk = vh.b_landing(layout, 16, 16)
        key = line * 8 + chunk
        for i in range(16):
            for j in range(0, 16, 8):
                run = key[j:j + 8, i] if axis == 0 else key[i, j:j + 8]
                assert len(set(run)) == 1
        assert len(np.unique(key)) == 32                # 256 elements, 32 chunks of 8


def test_plot_b_landing_is_legible():
    from gemmcourse import notebook as nb

    nb._style_figures()
    fig = vh.plot_b_landing()
    assert len(fig.axes) == 3 and legible(fig)


def test_kmajor_reader_tolerates_absence_and_old_files(tmp_path, capsys):
    assert vh.layouts_files(tmp_path) == []
    assert vh.show_kmajor_measured(tmp_path) == 0
    assert vh.NOT_MEASURED_NK in capsys.readouterr().out
    old = {"meta": {"device": "NVIDIA H200"},      # chapter 10's file: not a suite run
           "rows": [{"kernel": "layout_nt", "tflops": 13.2, "params": {"BM": 128}}]}
    (tmp_path / "layouts-h200.json").write_text(json.dumps(old))
    assert vh.layouts_files(tmp_path) == []
    assert vh.show_kmajor_measured(tmp_path) == 0


def _suite_row(layout, prec, pct, nn=None, kernel="wgmma_ws", **kw):
    row = dict(suite="layouts", shape="4096^3", layout=layout, precision=prec, M=4096, N=4096,
               K=4096, gemmlib_ms=1.0, torch_ms=pct / 100, pct_torch=pct, rel_error=1e-3,
               kernel=kernel, **kw)
    if nn is not None:
        row["pct_of_nn"] = nn
    return row


def test_kmajor_reader_reads_the_layouts_suite(tmp_path):
    """The rows ``gemmlib.bench_layouts.measure`` writes, newest run per GPU."""
    rows = [_suite_row("NN", "fp16", 95.0, 100.0), _suite_row("NT", "fp16", 96.0, 101.0,
                                                              "wgmma_ws_nk"),
            _suite_row("NT", "fp16", 80.0, 84.0, "skinny (B copied)"),
            _suite_row("TN", "fp16", 90.0, 95.0),
            dict(suite="layouts", shape="x", layout="TT", precision="fp16", M=1, N=1, K=1,
                 error="RuntimeError: boom"),
            _suite_row("NT", "fp32", 50.0, 99.0, "layout_nt")]
    newer = {"meta": {"suite": "layouts", "gpu": "NVIDIA H100 80GB HBM3",
                      "gpu_slug": "nvidia-h100-80gb-hbm3", "date": "2026-11-28T00:00:00"},
             "rows": rows}
    older = {**newer, "meta": {**newer["meta"], "date": "2026-11-27T00:00:00"}, "rows": []}
    (tmp_path / "layouts-nvidia-h100-80gb-hbm3-2026-11-28.json").write_text(json.dumps(newer))
    (tmp_path / "layouts-nvidia-h100-80gb-hbm3-2026-11-27.json").write_text(json.dumps(older))
    files = vh.layouts_files(tmp_path)
    assert [n for n, _ in files] == ["layouts-nvidia-h100-80gb-hbm3-2026-11-28.json"]
    t = vh.kmajor_table(files[0][1], files[0][0])
    by = {(r[0], r[1]): r for r in t.rows}
    assert set(by) == {("fp16", "NN"), ("fp16", "NT"), ("fp16", "TT"), ("fp32", "NT")}
    nt = by[("fp16", "NT")]
    assert nt[2] == 2 and nt[4] == "80.0-96.0%" and nt[5] == "84.0-101.0%" and nt[6] == "1 of 2"
    assert float(nt[3].rstrip("%")) == pytest.approx((96.0 * 80.0) ** 0.5, abs=0.05)
    assert by[("fp16", "NN")][5] == "-" and by[("fp16", "TT")][6] == "1 failed"
    assert "H100" in t.caption
