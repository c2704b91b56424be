"""The answers of chapters 13, 17 and 18's exercises, kept in gemmcourse.exercises: each
gives the value the chapter's check cell used to compute in the open, and the pages' check
cells no longer spell the answer out."""

import json
import re
from pathlib import Path

import pytest

from gemmcourse import exercises as ex
from gemmcourse.exercises import ch13, ch17, ch18

ROOT = Path(__file__).resolve().parent.parent


def cdiv(a, b):
    return -(-a // b)


# --------------------------------------------------------------------------
# Chapter 13


def test_ch13_blocks_and_waves():
    shape = dict(M=1024, N=1024, BM=256, BN=128, sms=132)
    assert ex.expected("ch13.blocks", **shape) == cdiv(1024, 256) * cdiv(1024, 128) == 32
    assert ex.expected("ch13.busy_fraction", **shape) == pytest.approx(32 / 132)
    assert ex.expected("ch13.fill_splits", **shape) == cdiv(132, 32) == 5


def test_ch13_workspace():
    S, M, N = 4, 1024, 1024
    assert ch13.workspace_bytes(S=S, M=M, N=N) == S * M * N * 4 == 16 * 2**20
    assert ch13.workspace_traffic(S=S, M=M, N=N) == 2 * S * M * N * 4


def test_ch13_k_slice_is_the_kernels_rule():
    from gemmcourse import viz

    for K in (1, 16, 70, 200, 8192, 3001):
        for BK in (8, 16):
            for S in (1, 2, 3, 4, 7):
                for z in range(S):
                    assert ch13.k_slice(K, BK, S, z) == viz.split_k_slices(K, BK, S)[z]
                    kt = cdiv(K, BK)                    # the page's solution
                    per = cdiv(kt, S)
                    assert ch13.k_slice(K, BK, S, z) == (z * per, min(kt, z * per + per))


# --------------------------------------------------------------------------
# Chapter 17


def test_ch17_b_descriptor():
    from gemmcourse import viz_hopper as vh

    want = {d["kstep"]: (d["offset"], d["lbo"], d["sbo"], d["swizzle"])
            for d in vh.kernel_descriptors(BN=128, halves=1) if d["operand"] == "B"}
    for kk in range(4):
        assert ch17.b_descriptor(kk) == want[kk] == (2048 * kk, 8192, 1024, 128)


def test_ch17_parity():
    from gemmcourse import viz_hopper as vh

    for s in (2, 3, 4):
        for it in range(13):
            p = (it // s) % 2
            assert ch17.parity(it, s, "consumer") == vh.expected_parity(it, s, "consumer") == p
            assert ch17.parity(it, s, "producer") == vh.expected_parity(it, s, "producer") == p ^ 1


def test_ch17_max_stages():
    from gemmcourse import viz_hopper as vh

    for bn in (64, 128, 192, 256):
        for limit in (227 * 1024, 160 * 1024):
            want = vh.max_stages(128, bn, limit)
            assert ch17.max_stages(bn, limit) == want
            assert want == min(8, (limit - 1024) // (128 * 64 * 2 + 64 * bn * 2))


def test_ch17_k_per_step():
    from gemmlib.intrinsics import hopper as H

    old = {2: H.WGMMA_K["f16"], 4: H.WGMMA_K["tf32"], 1: H.WGMMA_K["e4m3"]}
    for b in (2, 4, 1):
        assert ch17.k_per_step(b) == old[b] == 32 // b


def test_ch17_l2_bytes():
    from gemmcourse import viz_hopper as vh

    for BM, BN, CM in [(128, 256, 1), (128, 256, 2), (128, 256, 4), (128, 128, 1), (64, 192, 2)]:
        want = vh.l2_bytes_per_ktile(BM, BN, CM)["bytes"]
        assert ch17.l2_bytes(BM, BN, CM) == want
        assert want == BM * 64 * 2 + -(-(BN // 64) // CM) * 64 * 64 * 2


def test_ch17_stage_offset():
    from gemmlib.kernels import wgmma_store

    kernel_rule = wgmma_store.stage_offset("fp16")
    for r in (0, 1, 7, 8, 63, 64, 127):
        for c in range(0, 256, 6):
            solution = (c // 64) * 16384 + r * 128 + (((c % 64) // 8) ^ (r % 8)) * 16 + (c % 8) * 2
            assert ch17.stage_offset(r, c) == kernel_rule(r, c) == solution


# --------------------------------------------------------------------------
# Chapter 18


def test_ch18_decode_product():
    M, N, K = 1, 8192, 29568
    want = 2 * (M * K + K * N) + 4 * M * N
    assert ch18.decode_bytes(M=M, N=N, K=K) == want
    for gbps in (2990.0, 4174.0, 3350.0):
        assert ch18.decode_us(M=M, N=N, K=K, dram_gbps=gbps) == pytest.approx(
            1e6 * want / (gbps * 1e9))


def test_ch18_tiles_and_waves():
    from gemmcourse import viz_models as vm

    shape = dict(M=1024, N=10240, sms=132)
    t = vm.tiles(1024, 10240, 128, 256)
    assert ch18.n_tiles(**shape) == t == 320
    assert ch18.n_waves(**shape) == vm.waves(t, 132) == 3
    assert ch18.filled(**shape) == pytest.approx(vm.wave_efficiency(t, 132)) == pytest.approx(320 / 396)


def test_ch18_reference_functions():
    from gemmlib import bench_models as bm
    from gemmcourse import viz_models as vm

    for M, N in [(1024, 1024), (8192, 256), (1, 4096), (128, 28672), (4096, 4096), (777, 1999)]:
        for s in (132, 114, 108):
            assert ch18.splits(M, N, s) == vm.one_wave_splits(M, N, s) == max(1, s // vm.tiles(M, N))
    for m in bm.MODELS:
        for _, N, K in bm.projections(m):
            for r in (100, 295, 330, 500):
                assert ch18.ridge_tokens(N, K, r) == vm.ridge_tokens(N, K, r)
    if vm.split_k_module() is not None:
        for case in [(16, 4096, 4096, 8, 64), (128, 6144, 4096, 5, 64), (1024, 1024, 8192, 4, 128),
                     (8192, 256, 8192, 2, 128), (100, 1000, 2048, 3, 64)]:
            assert ch18.workspace_bytes(*case) == vm.split_k_workspace_bytes(*case)


def test_ch18_step_us():
    """Chapter 18.7: eagerly a step waits for the slower of host and GPU; a graph's host
    part is one replay."""
    kw = dict(products=29, others=171, product_host_us=16.0, other_host_us=7.0,
              replay_us=15.0)
    assert ch18.step_us(gpu_us=900.0, graphs=False, **kw) == 29 * 16 + 171 * 7 == 1661
    assert ch18.step_us(gpu_us=2000.0, graphs=False, **kw) == 2000.0
    assert ex.expected("ch18.step_us", gpu_us=900.0, graphs=True, **kw) == 915.0


# --------------------------------------------------------------------------
# The pages


def test_ch18_early_step_us():
    kw = dict(products=29, gpu_us=900.0, replay_us=15.0, seam_us=2.0)
    assert ch18.early_step_us(hidden=0.0, **kw) == 915.0          # as a graph, no overlap
    assert ch18.early_step_us(hidden=0.75, **kw) == 915.0 - 29 * 1.5
    assert ex.expected("ch18.early_step_us", hidden=1.0, **kw) == 915.0 - 58.0


def _pages(*prefixes):
    return [p for p in sorted((ROOT / "chapters").glob("*.ipynb")) if p.name.startswith(prefixes)]


def _check_cells(path):
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    return [("".join(c["source"])) for c in cells if c["cell_type"] == "code"
            and re.search(r"\b(nb\.check_value|nb\.check_function|ex\.check)\(",
                          "".join(c["source"]))]


@pytest.mark.parametrize("page", _pages("13", "17", "18"), ids=lambda p: p.name)
def test_check_cells_hide_their_answers(page):
    """No check cell computes its expected value in the open: values go through ex.check,
    functions are compared with a reference from gemmcourse.exercises (or the library's
    own code), never with a lambda or an inline expression."""
    for src in _check_cells(page):
        assert "nb.check_value(" not in src, src
        assert "lambda" not in src, src


@pytest.mark.parametrize("page", _pages("13", "17", "18"), ids=lambda p: p.name)
def test_check_cells_name_exercises_that_exist(page):
    for src in _check_cells(page):
        for key in re.findall(r"ex\.check\(\s*\"(ch\d\d\.\w+)\"", src):
            module, name = key.split(".")
            assert hasattr(ex.importlib.import_module(f"gemmcourse.exercises.{module}"), name), key
        for module, name in re.findall(r"\b(ch1[378])\.(\w+)\b", src):
            assert hasattr({"ch13": ch13, "ch17": ch17, "ch18": ch18}[module], name), (module, name)


def test_ch17_b_offset():
    """The K-major tile is A's layout (BN rows of 128 bytes, chunks XOR-ed with the row); the
    MN-major one is panels of 64 k x 64 n, 8 KiB each."""
    for n in (0, 1, 7, 8, 37, 63, 64, 100, 127):
        for k in (0, 5, 8, 21, 63):
            nk = n * 128 + (((k // 8) ^ (n % 8)) * 16) + (k % 8) * 2
            kn = (n // 64) * 8192 + k * 128 + ((((n % 64) // 8) ^ (k % 8)) * 16) + (n % 8) * 2
            assert ch17.b_offset(n, k, "NK") == ex.expected("ch17.b_offset", n=n, k=k,
                                                            b_layout="NK") == nk
            assert ch17.b_offset(n, k, "KN") == kn
