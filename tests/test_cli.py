"""The command line: list, verify, bench (simulator: runs, records no timing), plot."""

import json

import pytest

from gemmlib import backend
from gemmlib.bench import Result, Row, load
from gemmlib.cli import main, parse_shape


def test_parse_shape():
    assert parse_shape("4096") == (4096, 4096, 4096)
    assert parse_shape("4095x3073x2047") == (4095, 3073, 2047)
    with pytest.raises(Exception):
        parse_shape("1x2")


def test_list(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "naive" in out and "shared" in out


def test_verify_one_kernel(capsys):
    assert main(["verify", "coalesced", "--shape", "5x7x3"]) == 0
    assert "all ok" in capsys.readouterr().out


@pytest.mark.skipif(not backend.SIMULATOR, reason="checks simulator behaviour")
def test_bench_in_simulator_says_timings_mean_nothing(capsys, tmp_path):
    assert main(["bench", "--kernels", "naive", "--shape", "5x6x7", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "timings there mean nothing" in out
    assert not list(tmp_path.iterdir())  # nothing written: no fake numbers


def test_bench_has_an_auto_row_by_default(monkeypatch):
    # "auto" is what matmul runs when no kernel is named: the bench reports it beside the rungs.
    # The simulated bench checks each kernel once (gemmlib.verify.check_once); that check of
    # every rung is test_kernels.py's, so here it only records which specs it was given.
    import importlib
    from types import SimpleNamespace

    from gemmlib.bench import benchmark
    from gemmlib.kernels import LADDER, SCALED

    checked = []
    verify = importlib.import_module("gemmlib.verify")   # (gemmlib.verify is also a function)
    monkeypatch.setattr(verify, "check_once", lambda spec, M, N, K: (
        checked.append(spec), SimpleNamespace(rel_error=0.0))[1])
    rows = benchmark(shapes=[(5, 6, 7)], reps=2, budget_s=1, progress=False).rows
    kernels = [r.kernel for r in rows]
    assert "auto" in kernels and all(k in kernels for k in LADDER if k not in SCALED)
    assert len(checked) == len(rows) and all(hasattr(s, "kernel") for s in checked)


def test_help_mentions_every_command(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    for cmd in ("list", "verify", "bench"):
        assert cmd in out


def test_result_roundtrip_and_plot(tmp_path):
    """Figures are made from a result file (a synthetic one here, never committed)."""
    meta = {"gpu": "Test GPU", "gpu_slug": "test-gpu", "date": "2026-01-01T00:00:00",
            "compute_capability": "9.0", "fp32_peak_tflops": 60.0}
    rows = [Row(k, n, n, n, 1.0, 0.9, 1.1, 0.8, 1.2, 0.2, 10, t, 1.0, 50.0, p, 1e-7)
            for k, t, p in (("naive", 0.5, 1.0), ("cublas", 50.0, 100.0))
            for n in (128, 256)]
    pj, pc = Result(meta, rows).save(tmp_path)
    assert load(pj).rows == rows
    assert pc.read_text().splitlines()[0].startswith("kernel,M,N,K")
    from gemmcourse.__main__ import main as course_main

    assert course_main(["plot", str(pj), "--out", str(tmp_path / "fig")]) == 0
    assert sorted(p.name for p in (tmp_path / "fig").iterdir()) == [
        "test-gpu-2026-01-01-ladder.png", "test-gpu-2026-01-01-pct-cublas.png",
        "test-gpu-2026-01-01-tflops.png"]
    json.loads(pj.read_text())
