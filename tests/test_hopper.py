"""Hopper pieces (issue 13's proof of the path): wgmma descriptors and accumulator maps,
TMA's swizzle and box rules, the kernels compiled and assembled for sm_90a (no GPU
needed), and on an H100/H200 the probe kernels themselves (``gemmlib.hopper_probe``)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from gemmlib import backend, hopper_probe, tma
from gemmlib.intrinsics import hopper as H


def test_descriptor_fields():
    d = H.desc_fields(0x1230, lbo=128, sbo=256, swizzle_bytes=0)
    assert d & 0x3FFF == 0x1230 >> 4                 # start address >> 4, 14 bits
    assert (d >> 16) & 0x3FFF == 128 >> 4           # leading byte offset (along K)
    assert (d >> 32) & 0x3FFF == 256 >> 4           # stride byte offset (along M/N)
    assert d >> 62 == 0
    assert H.desc_fields(0, 16, 1024, 128) >> 62 == 1   # 128-byte swizzle
    assert {H.desc_fields(0, 0, 0, s) >> 62 for s in (32, 64, 128)} == {3, 2, 1}


@pytest.mark.parametrize("n", [8, 64, 256])
def test_accumulators_cover_the_tile_once(n):
    coords = [rc for t in range(128) for rc in H.accumulator_coords(t, n)]
    assert len(coords) == 64 * n and set(coords) == {(r, c) for r in range(64) for c in range(n)}
    assert H.accumulator_coords(0, 8) == [(0, 0), (0, 1), (8, 0), (8, 1)]
    assert H.accumulator_coords(37, 8)[0] == (16 + 1, 2)   # warp 1, lane 5: group 1, pair 1


def test_wgmma_shapes_and_the_simulator_refuses():
    with pytest.raises(ValueError, match="multiple of 8"):
        H.wgmma_f16(12)
    with pytest.raises(ValueError, match="0..7"):
        H.wgmma_wait(8)
    if backend.SIMULATOR:
        with pytest.raises(H.HopperOnly, match="H100 or H200"):
            H.wgmma_f16(8)(0, 0, 1, 0.0, 0.0, 0.0, 0.0)


@pytest.mark.parametrize("swizzle", [0, 32, 64, 128])
def test_tma_swizzle_is_a_permutation_of_16_byte_chunks(swizzle):
    cols = max(swizzle, 16) // 2                      # one swizzled span per row, halves
    rows = 16
    offs = [tma.swizzled_offset(r, c, cols, 2, swizzle) for r in range(rows) for c in range(cols)]
    assert sorted(offs) == list(range(rows * cols))   # a bijection
    for r in range(rows):                             # rows stay rows, chunks stay whole
        for c in range(0, cols, 8):
            o = tma.swizzled_offset(r, c, cols, 2, swizzle)
            assert o // cols == r and o % 8 == 0
            assert [tma.swizzled_offset(r, c + i, cols, 2, swizzle) for i in range(8)] == \
                list(range(o, o + 8))


def test_tma_128_byte_swizzle_is_the_layout_chapters_xor():
    from gemmlib import layout as L

    lay = L.SwizzledLayout(L.row_major((64, 64)), L.chunk_swizzle(64, 2))
    assert all(lay(r, c) == tma.swizzled_offset(r, c, 64, 2, 128)
               for r in range(64) for c in range(64))


@pytest.mark.parametrize("kw, match", [
    (dict(swizzle=16), "swizzle must be"),
    (dict(ptr=8), "16-byte aligned"),
    (dict(strides=(100, 2)), "multiple of 16 bytes"),
    (dict(strides=(144, 4)), "contiguous"),
    (dict(box=(300, 8)), "1..256"),
    (dict(box=(8, 4)), "multiple of 16 bytes"),
    (dict(box=(8, 128), swizzle=128), "at most 128 bytes"),
])
def test_tma_box_rules(kw, match):
    args = dict(shape=(100, 72), strides=(144, 2), itemsize=2, box=(64, 64), swizzle=128, ptr=0)
    args.update(kw)
    with pytest.raises(ValueError, match=match):
        tma.check_box(**args)
    tma.check_box((100, 72), (144, 2), 2, (64, 64), 128, 0)   # the probe's box is fine


@pytest.fixture(scope="module")
def compiled():
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0")
    proc = subprocess.run([sys.executable, "-m", "gemmlib.hopper_probe", "--compile"], env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return {r["case"]: r for r in json.loads(proc.stdout.strip().splitlines()[-1])}


@pytest.mark.parametrize("case", hopper_probe.CASES)
def test_probe_assembles_for_sm_90a(compiled, case):
    """numba lowers the inline PTX and ptxas accepts it for sm_90a, with no local memory."""
    r = compiled[case]
    want = {"wgmma": {"wgmma.mma_async"}, "wgmma_swizzled": {"wgmma.mma_async"},
            "tma": {"cp.async.bulk.tensor", "mbarrier.try_wait"},
            "tma_swizzled": {"cp.async.bulk.tensor", "mbarrier.try_wait"},
            "tma_wgmma": {"wgmma.mma_async", "cp.async.bulk.tensor", "mbarrier.try_wait"}}[case]
    assert want <= set(r["instructions"]), r
    assert r["registers"] and not r["spill_stores"] and not r["stack_bytes"], r


@pytest.mark.gpu
@pytest.mark.parametrize("case", hopper_probe.CASES)
def test_probe_on_hopper_gpu(case):
    cc = tuple(backend.device_info().compute_capability)
    if cc != (9, 0):
        pytest.skip(f"wgmma/TMA need compute capability 9.0 (sm_90a); this GPU is {cc}")
    ok, msg = hopper_probe.run(case)
    assert ok, msg
