"""The dispatch layer: compile once, the on-disk kernel cache, the choice per shape, split-K.

Simulator tests count spec builds and exercise the cache file format (damaged
entries, concurrent writers); GPU tests count real compilations, damage a real
cache entry, race two processes writing one, and check split-K results are
bit-identical run to run.
"""

import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import gemmlib
from gemmlib import backend, diskcache, dispatch
from gemmlib.kernels import split_k, warptile
from gemmlib.verify import tolerance

ROOT = Path(__file__).resolve().parent.parent
gpu = pytest.mark.gpu


def ref64(A, B):
    return np.asarray(A, dtype=np.float64) @ np.asarray(B, dtype=np.float64)


def rel_err(C, R):
    return float(np.linalg.norm(np.asarray(C, dtype=np.float64) - R) / np.linalg.norm(R))


# --------------------------------------------------------------------------
# Build once


SMALL = dict(BM=64, BN=64, BK=16, WM=32, WN=32, WNITER=1, TM=4, TN=8, PAD=0)


def test_build_is_memoised_per_rung_and_params():
    before = dispatch.cache_info()["builds"]
    a = dispatch.build("warptile", SMALL)
    b = dispatch.build("warptile", dict(reversed(list(SMALL.items()))))  # order does not matter
    assert a is b
    assert dispatch.cache_info()["builds"] <= before + 1
    assert dispatch.build("warptile") is gemmlib.get_kernel("warptile")
    # the default's own params give the default spec, not a second copy
    assert dispatch.build("warptile", dict(warptile.DEFAULTS)) is gemmlib.get_kernel("warptile")


def test_build_from_many_threads_gives_one_spec():
    params = dict(SMALL, BK=8)
    out = []
    threads = [threading.Thread(target=lambda: out.append(dispatch.build("warptile", params)))
               for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({id(s) for s in out}) == 1


def test_repeated_auto_calls_build_nothing_new(rng):
    A = rng.uniform(-1, 1, (19, 23)).astype(np.float32)
    B = rng.uniform(-1, 1, (23, 11)).astype(np.float32)
    gemmlib.matmul(A, B)
    before = dispatch.cache_info()
    for _ in range(3):
        C = gemmlib.matmul(A, B)
    after = dispatch.cache_info()
    assert after["builds"] == before["builds"] and after["plans"] == before["plans"]
    assert after["compiles"] == before["compiles"]
    assert rel_err(C, ref64(A, B)) < 1e-5


def test_plan_is_memoised_and_checks_constraints():
    p1 = dispatch.plan("warptile", 100, 90, 80)
    assert dispatch.plan("warptile", 100, 90, 80) is p1
    assert p1.grid == gemmlib.get_kernel("warptile").launch(100, 90, 80).grid and p1.splits == 1
    too_big = dispatch.build("warptile", dict(SMALL, BM=256, BN=256, WM=32, WN=32))
    with pytest.raises(gemmlib.ConstraintError, match="threads per block"):
        dispatch.plan(too_big, 10, 10, 10)


def test_code_params_leave_out_the_slice_count():
    s3 = dispatch.build("split_k", dict(SPLITS=3))
    s5 = dispatch.build("split_k", dict(SPLITS=5))
    assert s3 is not s5 and s3.kernel is s5.kernel  # one compiled kernel for every count
    assert "SPLITS" not in s3.code_params and s3.code_params == s5.code_params
    assert s3.params["SPLITS"] == 3


# --------------------------------------------------------------------------
# Split-K


@pytest.mark.parametrize("S,shape", [(2, (37, 29, 70)), (3, (20, 9, 33)), (4, (5, 70, 17)),
                                     (3, (1, 1, 100))])
def test_split_k_is_right_and_bit_identical(S, shape, rng):
    """On a small tile (128 threads, not the default's 256: the simulator runs each as a
    Python thread); the default tile's split path: tests/test_kernels.py."""
    M, N, K = shape
    spec = dispatch.build("split_k", dict(SMALL, SPLITS=S))
    A = rng.uniform(-1, 1, (M, K)).astype(np.float32)
    B = rng.uniform(-1, 1, (K, N)).astype(np.float32)
    C = np.full((M, N), np.nan, dtype=np.float32)
    gemmlib.matmul(A, B, out=C, kernel=spec)
    # against ||A|·|B||, the scale of float32 rounding: a 1 x 1 output is one dot product,
    # and one whose terms cancel has a large error relative to itself (~0.6% of draws)
    scale = np.linalg.norm(ref64(np.abs(A), np.abs(B)))
    assert np.linalg.norm(C - ref64(A, B)) / scale < 1e-5
    assert np.array_equal(C, gemmlib.matmul(A, B, kernel=spec))  # same bits on a repeat
    p = dispatch.plan(spec, M, N, K)
    assert p.splits == split_k.effective_splits(S, K, spec.k_tile) == p.grid[2]


def test_split_k_with_k_zero_writes_zeros():
    spec = dispatch.build("split_k", dict(SPLITS=4))
    A, B = np.zeros((7, 0), np.float32), np.zeros((0, 5), np.float32)
    C = np.full((7, 5), np.nan, dtype=np.float32)
    gemmlib.matmul(A, B, out=C, kernel=spec)
    assert np.all(C == 0)


def test_effective_splits_never_leave_a_slice_empty():
    for K in range(1, 300, 7):
        for S in range(1, 20):
            e = split_k.effective_splits(S, K, 16)
            ktiles = -(-K // 16)
            per = -(-ktiles // e)
            assert 1 <= e <= min(S, ktiles)
            assert (e - 1) * per < ktiles  # the last slice owns at least one k-tile


def _h100_like():
    from dataclasses import replace

    return replace(backend.device_info(), sm_count=132, max_sm_clock_mhz=1980.0,
                   memory_clock_khz=2619000, memory_bus_bits=5120, simulated=False)


def test_split_model_splits_deep_k_and_leaves_big_outputs_alone():
    dev = _h100_like()
    deep = split_k.splits_for(1024, 1024, 8192, 256, 128, 16, dev)
    assert deep > 1
    assert split_k.splits_for(8192, 8192, 8192, 256, 128, 16, dev) == 1
    assert split_k.splits_for(4096, 4096, 4096, 256, 128, 16, dev) == 1
    assert split_k.splits_for(1024, 1024, 32, 256, 128, 16, dev) == 1  # too shallow to cut
    # deeper K never asks for fewer slices
    ks = [split_k.splits_for(512, 512, k, 64, 128, 16, dev) for k in (1024, 4096, 16384)]
    assert ks == sorted(ks)


def test_select_uses_split_k_only_when_the_model_says_so(monkeypatch):
    dispatch.clear_memory_caches()
    dev = _h100_like()
    monkeypatch.setattr(backend, "device_info", lambda device_id=None: dev)
    try:
        deep = dispatch.select(1024, 1024, 8192)
        assert deep.module.endswith("split_k") and deep.params["SPLITS"] > 1
        big = dispatch.select(8192, 8192, 8192)
        assert big.module.endswith("warptile")
    finally:
        dispatch.clear_memory_caches()


# --------------------------------------------------------------------------
# The cache file format


def test_disk_cache_roundtrip(tmp_path):
    payload = os.urandom(5000)
    assert diskcache.store(tmp_path, "k1", payload, {"entry": "f"}) is not None
    assert diskcache.load(tmp_path, "k1") == (payload, {"entry": "f"})
    assert diskcache.load(tmp_path, "missing") is None
    assert not list(tmp_path.glob("*.tmp"))  # no temporary files left behind


@pytest.mark.parametrize("damage", ["truncate", "flip", "magic", "header", "empty", "longer"])
def test_damaged_entries_are_rejected_and_removed(tmp_path, damage):
    payload = os.urandom(3000)
    path = diskcache.store(tmp_path, "k", payload, {"entry": "f"})
    data = path.read_bytes()
    bad = {"truncate": data[:-100], "flip": data[:-10] + bytes([data[-10] ^ 1]) + data[-9:],
           "magic": b"X" + data[1:], "header": data.replace(b'"size"', b'"sise"'),
           "empty": b"", "longer": data + b"\0"}[damage]
    path.write_bytes(bad)
    assert diskcache.load(tmp_path, "k") is None
    assert not path.exists()  # removed, so the next call rebuilds and stores a good entry


def test_two_writers_and_a_reader_never_see_a_broken_entry(tmp_path):
    payloads = [bytes([i]) * 200_000 for i in range(2)]
    bad = []

    def writer(i):
        for _ in range(30):
            diskcache.store(tmp_path, "k", payloads[i], {"w": i})

    def reader():
        for _ in range(200):
            got = diskcache.load(tmp_path, "k")
            if got is not None and got[0] not in payloads:
                bad.append(got)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(2)]
    threads.append(threading.Thread(target=reader))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not bad
    final = diskcache.load(tmp_path, "k")
    assert final is not None and final[0] in payloads


def test_two_processes_write_one_key(tmp_path):
    code = ("import sys; sys.path.insert(0, {root!r}); from gemmlib import diskcache; "
            "[diskcache.store({d!r}, 'k', bytes([{i}]) * 300000, {{'w': {i}}}) for _ in range(20)]")
    procs = [subprocess.Popen([sys.executable, "-c", code.format(root=str(ROOT), d=str(tmp_path),
                                                                  i=i)]) for i in range(2)]
    assert all(p.wait(timeout=120) == 0 for p in procs)
    payload, meta = diskcache.load(tmp_path, "k")
    assert payload == bytes([meta["w"]]) * 300000


def test_cache_key_changes_with_what_the_code_depends_on():
    base = dict(module="m", kernel_name="k", params={"BM": 64}, cc=(9, 0), signature="sig")
    k = dispatch.cache_key(**base)
    assert k == dispatch.cache_key(**base)
    assert k != dispatch.cache_key(**dict(base, params={"BM": 128}))
    assert k != dispatch.cache_key(**dict(base, cc=(8, 0)))
    assert k != dispatch.cache_key(**dict(base, kernel_name="other"))
    assert len(dispatch.source_digest()) == 64


def test_cache_dir_follows_gemmlib_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("GEMMLIB_CACHE", str(tmp_path))
    assert dispatch.cache_dir() == tmp_path / "kernels"


# --------------------------------------------------------------------------
# On the GPU: real compilations, a damaged real entry, two processes


@pytest.fixture
def fresh_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("GEMMLIB_CACHE", str(tmp_path))
    dispatch.clear_memory_caches()
    yield tmp_path
    dispatch.clear_memory_caches()


def _gpu_operands(M, N, K, seed=0):
    A = backend.random_matrix((M, K), rng=seed)
    B = backend.random_matrix((K, N), rng=seed + 1)
    return A, B, backend.reference(A, B)


@gpu
def test_gpu_compiles_once_then_reads_the_disk_cache(fresh_cache):
    A, B, R = _gpu_operands(300, 200, 100)
    spec = dispatch.build("warptile", SMALL)
    c0 = dispatch.cache_info()
    C = gemmlib.matmul(A, B, kernel=spec)
    c1 = dispatch.cache_info()
    assert c1["compiles"] == c0["compiles"] + 1 and backend.relative_error(C, R) < 1e-5
    for _ in range(5):
        gemmlib.matmul(A, B, kernel=spec)
    assert dispatch.cache_info()["compiles"] == c1["compiles"]
    assert len(list((fresh_cache / "kernels").glob("*.cubin"))) == 1
    dispatch.clear_memory_caches()  # a new process, as far as the caches can tell
    spec = dispatch.build("warptile", SMALL)
    C = gemmlib.matmul(A, B, kernel=spec)
    c2 = dispatch.cache_info()
    assert c2["compiles"] == c1["compiles"] and c2["disk_hits"] == c1["disk_hits"] + 1
    assert backend.relative_error(C, R) < 1e-5


@gpu
def test_gpu_auto_never_recompiles(fresh_cache):
    for shape in ((64, 64, 64), (1000, 1000, 1000), (257, 129, 4000)):
        A, B, R = _gpu_operands(*shape)
        gemmlib.matmul(A, B)
        before = dispatch.cache_info()["compiles"]
        for _ in range(3):
            C = gemmlib.matmul(A, B)
        assert dispatch.cache_info()["compiles"] == before
        assert backend.relative_error(C, R) < 1e-5


@gpu
@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_gpu_damaged_entry_is_rebuilt(fresh_cache, damage):
    A, B, R = _gpu_operands(130, 70, 50)
    spec = dispatch.build("warptile", SMALL)
    gemmlib.matmul(A, B, kernel=spec)
    (entry,) = (fresh_cache / "kernels").glob("*.cubin")
    data = entry.read_bytes()
    entry.write_bytes(data[: len(data) // 2] if damage == "truncate"
                      else data[:-1000] + bytes([data[-1000] ^ 0xFF]) + data[-999:])
    dispatch.clear_memory_caches()
    before = dispatch.cache_info()
    C = gemmlib.matmul(A, B, kernel=dispatch.build("warptile", SMALL))
    after = dispatch.cache_info()
    assert backend.relative_error(C, R) < 1e-5
    assert after["disk_rejects"] == before["disk_rejects"] + 1
    assert after["compiles"] == before["compiles"] + 1
    assert diskcache.load(fresh_cache / "kernels", entry.stem) is not None  # rewritten whole


@gpu
def test_gpu_two_processes_fill_one_cache(tmp_path):
    code = ("import cupy as cp, gemmlib, numpy as np\n"
            "A = cp.random.rand(200, 300, dtype=cp.float32); B = cp.random.rand(300, 100, "
            "dtype=cp.float32)\n"
            "C = gemmlib.matmul(A, B, kernel='warptile')\n"
            "R = cp.asarray(A, dtype=cp.float64) @ cp.asarray(B, dtype=cp.float64)\n"
            "assert float(cp.linalg.norm(C - R) / cp.linalg.norm(R)) < 1e-5\n")
    env = dict(os.environ, GEMMLIB_CACHE=str(tmp_path), NUMBA_ENABLE_CUDASIM="0",
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env) for _ in range(2)]
    assert all(p.wait(timeout=600) == 0 for p in procs)
    entries = list((tmp_path / "kernels").glob("*.cubin"))
    assert len(entries) == 1 and diskcache.load(tmp_path / "kernels", entries[0].stem)


@gpu
@pytest.mark.parametrize("shape", [(256, 256, 8192), (777, 1999, 3001), (1024, 1024, 8192),
                                   (100, 3, 5000), (3, 100, 4097)])
def test_gpu_auto_split_k_is_right_and_bit_identical(shape):
    A, B, R = _gpu_operands(*shape, seed=7)
    C1 = gemmlib.matmul(A, B)
    C2 = gemmlib.matmul(A, B)
    assert backend.relative_error(C1, R) <= tolerance("float32", shape[2])
    cp = backend.array_module()
    assert bool(cp.all(C1 == C2))


@gpu
def test_gpu_split_k_on_a_caller_stream_is_ordered():
    cp = backend.array_module()
    A, B, R = _gpu_operands(200, 150, 6000, seed=3)
    spec = dispatch.build("split_k", dict(SPLITS=6))
    s = cp.cuda.Stream(non_blocking=True)
    C = cp.full((200, 150), cp.nan, dtype=cp.float32)
    for _ in range(3):
        gemmlib.matmul(A, B, out=C, kernel=spec, stream=s)
    s.synchronize()
    assert backend.relative_error(C, R) < 1e-5


@gpu
def test_gpu_driver_launch_matches_numba_launch():
    """gemmlib's driver launch computes what numba's own launch of the same kernel does.

    Each rung gets inputs in its own precision's dtype (fp16 rungs get float16,
    never float32).  numba can launch a kernel itself only when it needs no extra
    kernel argument (TMA maps), no second launch (split-K's reduction) and no
    opt-in dynamic shared memory; those rungs are checked against float64 instead.
    """
    from gemmlib.bench import precision_operands
    from gemmlib.precision import tolerance

    cp = backend.array_module()
    dev = backend.device_info()
    for name in gemmlib.LADDER:
        if name in gemmlib.kernels.SCALED:
            continue  # FP8: tests/test_wgmma_lowp.py
        spec = gemmlib.get_kernel(name)
        # tensor-core rungs read 16-byte pieces: keep N and K aligned so the
        # call stages no padded copy and both launches see the same operands
        M, N, K = (129, 67, 45) if spec.operand_align == 0 else (129, 72, 48)
        if spec.failed_constraints(M, N, K, dev):
            continue  # e.g. a Hopper rung on another GPU
        A, B = precision_operands(spec.precision, M, N, K, seed=0)
        Bk = cp.ascontiguousarray(B.T) if spec.b_operand == "NK" else B
        C1 = gemmlib.matmul(A, Bk, kernel=spec, transpose_b=spec.b_operand == "NK",
                            out_dtype=np.float32)   # the kernel's own C type
        direct = (spec.reduce_kernel is None and not spec.tma_boxes
                  and not spec.dynamic_shared and spec.workspace is None)
        if direct:
            C2 = cp.full_like(C1, cp.nan)
            geo = spec.launch(M, N, K)
            bits = [getattr(x, "bits", x) for x in (A, Bk)]
            bits = [x.view(cp.uint16) if x.dtype.itemsize == 2 else x for x in bits]
            spec.kernel[geo.grid, geo.block](bits[0], bits[1], C2)  # numba's own launch
            cp.cuda.runtime.deviceSynchronize()
            assert bool(cp.all(C1 == C2)), name
        else:
            R = backend.reference(A, B)
            assert backend.relative_error(C1, R) < tolerance(spec.precision, K), name
