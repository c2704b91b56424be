"""gemmlib.autotune: search space, constraint rejection before compiling, shape classes,
the tuning-file round trip, thread-safe cache access, and kernel="auto"."""

import json
import threading

import pytest

import gemmlib
from gemmlib import autotune, backend
from gemmlib.kernels import get


def test_shape_classes():
    assert autotune.shape_class(4096, 4096, 4096) == "mn4096-k4096"
    assert autotune.shape_class(4095, 3073, 2047) == "mn4096-k2048"
    assert autotune.shape_class(1, 1, 1) == "mn1-k1"
    assert autotune.nearest_class("mn8192-k8192", ["mn4096-k4096", "mn1024-k1024"]) == \
        "mn4096-k4096"


def test_gpu_slug():
    assert autotune.gpu_slug("NVIDIA H200") == "nvidia-h200"
    assert autotune.gpu_slug("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"


def test_search_space_is_diverse_and_starts_with_the_classics():
    cands = autotune.default_candidates()
    assert cands[0] == autotune.CLASSICS["warptile"][0]
    shapes = {(p["BM"], p["BN"], p["BK"]) for p in cands}
    assert len(shapes) >= 10
    capped = autotune.default_candidates(limit=3, register_caps=True)
    assert any("max_registers" in p for p in capped) and len(capped) > 3


def test_constraints_reject_before_compiling(monkeypatch):
    """In the simulator tune() only checks constraints; rejected ones carry the reason."""
    cands = [dict(BM=128, BN=128, BK=32, WM=64, WN=32, WNITER=2, TM=4, TN=4, PAD=4),  # smem
             dict(BM=128, BN=128, BK=16, WM=48, WN=32, WNITER=2, TM=4, TN=4, PAD=4),  # tiling
             dict(BM=128, BN=128, BK=16, WM=64, WN=32, WNITER=2, TM=4, TN=4, PAD=4)]  # fine
    res = autotune.tune((4096, 4096, 4096), candidates=cands, save=False, log=None)
    status = [t.status for t in res.trials]
    assert status[0] == "rejected" and "shared memory per block" in res.trials[0].reason
    assert status[1] == "rejected" and "warp tiling" in res.trials[1].reason
    assert status[2] != "rejected"
    assert "rejected" in res.table()


def _fake_result(params, ms=1.0):
    r = autotune.TuneResult("warptile", (2048, 2048, 2048), cublas_ms=0.8)
    r.trials.append(autotune.Trial(params, "timed", ms=ms, tflops=17.2, registers=128,
                                   local_bytes=0, shared_bytes=1024))
    return r


def test_record_and_lookup_round_trip(tmp_path, monkeypatch):
    monkeypatch.setenv("GEMMLIB_CACHE", str(tmp_path))
    params = dict(BM=64, BN=128, BK=16, WM=32, WN=64, WNITER=2, TM=8, TN=4, PAD=4)
    path = autotune.record(_fake_result(params), slug="test-gpu")
    data = json.loads(path.read_text())
    entry = data["kernels"]["warptile"]["mn2048-k2048"]
    assert entry["params"] == params and entry["pct_of_cublas"] == 80.0
    monkeypatch.setattr(backend, "SIMULATOR", False)  # lookups are off in the simulator
    monkeypatch.setattr(autotune.backend, "SIMULATOR", False)
    assert autotune.best_params(2048, 2048, 2048, slug="test-gpu") == params
    # another class falls back to the nearest tuned one
    assert autotune.best_params(8192, 8192, 8192, slug="test-gpu") == params
    assert autotune.best_params(2048, 2048, 2048, slug="other-gpu") is None


def test_simulator_and_missing_data_fall_back_to_the_default():
    assert autotune.best_params(4096, 4096, 4096) is None  # simulator
    assert autotune.select(4096, 4096, 4096).name == "warptile"
    assert gemmlib.get_kernel("auto").name == "warptile"  # "auto" lives a layer up
    with pytest.raises(KeyError):
        get("auto")  # the registry knows rungs only


def test_auto_kernel_runs():
    assert gemmlib.verify("auto", [(37, 29, 53)], seed=2).ok


def test_concurrent_writers_never_corrupt_the_file(tmp_path):
    path = tmp_path / "t.json"
    errors = []

    def writer(i):
        try:
            for j in range(20):
                params = dict(BM=64, BN=64, BK=16, WM=32, WN=32, WNITER=1, TM=4, TN=8,
                              PAD=4 * (1 + (i + j) % 2))
                r = _fake_result(params)
                r.shape = (256 << i, 256 << i, 256)
                autotune.record(r, path=path, slug="test-gpu")
                json.loads(path.read_text())  # always whole JSON
        except Exception as e:  # pragma: no cover - the failure being tested for
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    data = json.loads(path.read_text())
    assert len(data["kernels"]["warptile"]) == 4  # one class per writer, none lost


def test_shipped_tuning_files_are_valid():
    files = sorted(autotune.PACKAGE_TUNING_DIR.glob("*.json"))
    assert {f.stem for f in files} >= {"nvidia-h200", "nvidia-h100-80gb-hbm3"}
    for f in files:
        data = json.loads(f.read_text())
        assert data["gpu_slug"] == f.stem
        for cls, entry in data["kernels"]["warptile"].items():
            spec = autotune.build("warptile", entry["params"])
            assert not spec.failed_constraints(*entry["shape"], backend.device_info()), cls


@pytest.mark.gpu
def test_gpu_tune_two_candidates(tmp_path):
    cands = autotune.CLASSICS["warptile"][:2]
    res = autotune.tune((512, 512, 512), candidates=cands, path=tmp_path / "t.json", log=None)
    assert res.best is not None and (tmp_path / "t.json").exists()
