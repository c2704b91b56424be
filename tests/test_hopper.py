"""Hopper pieces (issue 13's proof of the path): wgmma descriptors and accumulator maps,
TMA's swizzle and box rules, the kernels compiled and assembled for sm_90a (no GPU
needed), and on an H100/H200 the probe kernels themselves (``gemmcourse.hopper_probe``)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from gemmlib import backend, tma
from gemmcourse import hopper_probe
from gemmlib.backend import cuda   # a global: the simulator swaps it inside kernels
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


def test_wgmma_shapes_and_twins_outside_a_kernel():
    with pytest.raises(ValueError, match="multiple of 8"):
        H.wgmma_f16(12)
    with pytest.raises(ValueError, match="0..7"):
        H.wgmma_wait(8)
    if backend.SIMULATOR:
        with pytest.raises(H.HopperOnly, match="inside a"):
            H.smem_addr(np.zeros(8, np.uint16), 0)


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
    proc = subprocess.run([sys.executable, "-m", "gemmcourse.hopper_probe", "--compile"], env=env,
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


# --------------------------------------------------------------------------- the simulator twins


@pytest.mark.parametrize("case", hopper_probe.CASES)
def test_probe_on_the_twins(case):
    """The same kernels on the simulator's twins: wgmma reads shared memory through its
    descriptors, TMA writes the swizzled box and completes the mbarrier's bytes."""
    if not backend.SIMULATOR:
        pytest.skip("the GPU runs test_probe_on_hopper_gpu")
    ok, msg = hopper_probe.run(case)
    assert ok, msg


def test_twin_catches_a_descriptor_that_lies():
    """A 128-byte swizzled tile read through an unswizzled descriptor gives a wrong product
    in the simulator, as it would on the GPU."""
    if not backend.SIMULATOR:
        pytest.skip("simulator twins only")
    from numba import float32, int32, uint16

    mma8, wait0, swz128 = H.wgmma_f16(8), H.wgmma_wait(0), hopper_probe.swz128

    @cuda.jit
    def lying(A, B, D, mode):
        sA = cuda.shared.array(64 * 64, uint16)
        sB = cuda.shared.array(8 * 64, uint16)
        t = cuda.threadIdx.x
        for e in range(t, 64 * 64, 128):
            sA[swz128(e // 64, e % 64)] = A[e // 64, e % 64]
        for e in range(t, 8 * 64, 128):
            sB[swz128(e // 64, e % 64)] = B[e // 64, e % 64]
        cuda.syncthreads()
        d = mma8(H.smem_desc(H.smem_addr(sA, 0), 16, 1024, mode),
                 H.smem_desc(H.smem_addr(sB, 0), 16, 1024, mode), int32(1),
                 float32(0), float32(0), float32(0), float32(0))
        wait0()
        w, lane = t // 32, t % 32
        D[16 * w + lane // 4, 2 * (lane % 4)] = d[0]

    rng = np.random.default_rng(0)
    A = rng.uniform(-1, 1, (64, 64)).astype(np.float16)
    B = rng.uniform(-1, 1, (8, 64)).astype(np.float16)
    ref = A[:, :16].astype(np.float64) @ B[:, :16].astype(np.float64).T
    rows = [16 * w + g for w in range(4) for g in range(8)]
    for mode, right in ((1, True), (0, False)):
        D = np.zeros((64, 8), np.float32)
        lying[1, 128](A.view(np.uint16), B.view(np.uint16), D, mode)
        close = np.allclose(D[rows, 0::2], ref[rows, 0::2], atol=1e-3)
        assert close == right, (mode, D[rows[:3], 0], ref[rows[:3], 0])


# --------------------------------------------------------------------------- the rungs


def test_rungs_compute_fp16_and_bf16_only():
    from gemmlib import dispatch

    for rung in ("wgmma_async", "wgmma_tma", "wgmma_ws", "wgmma_pingpong", "wgmma_cluster",
                 "wgmma_store"):
        assert dispatch.get_spec(rung, "bf16").precision == "bf16"
        for prec in ("tf32", "3xtf32"):
            with pytest.raises(ValueError, match="fp16.*bf16.*row-major B"):
                dispatch.get_spec(rung, prec)


@pytest.mark.parametrize("cc", [(8, 0), (8, 9), (10, 0)])
def test_rungs_refuse_gpus_other_than_hopper(cc):
    import dataclasses

    from gemmlib.kernels import get
    from gemmlib.spec import ConstraintError

    dev = dataclasses.replace(backend.device_info(), compute_capability=cc, name="other")
    for rung in ("wgmma_async", "wgmma_tma", "wgmma_ws", "wgmma_pingpong", "wgmma_cluster",
                 "wgmma_store"):
        with pytest.raises(ConstraintError, match=r"Hopper \(sm_90a\)"):
            get(rung).check(256, 256, 256, dev)


def test_tma_rungs_declare_their_boxes_and_extra_argument():
    from gemmlib.kernels import get, wgmma_ws

    for rung in ("wgmma_tma", "wgmma_ws", "wgmma_pingpong", "wgmma_cluster", "wgmma_store"):
        s = get(rung)
        assert s.tma_boxes == ((s.tile[0], 64), (64, 64)) and s.scalar_args == ("uint64",)
        assert s.operand_align == 8
    assert get("wgmma_async").scalar_args == ()
    s = get("wgmma_ws")                          # three warpgroups; 48 KiB per stage
    assert s.threads == 384 and s.shared_bytes == s.params["STAGES"] * 48 * 1024 + 1024
    with pytest.raises(ValueError, match="65536 registers"):
        wgmma_ws.build(REGS=(128, 240))


def test_persistent_grid_is_one_block_per_sm_at_most():
    from gemmlib.kernels import get

    s, sms = get("wgmma_ws"), backend.device_info().sm_count
    assert s.grid(8192, 8192, 64)[0] == min(64 * 32, sms)
    assert s.grid(1, 1, 1)[0] == 1
    assert get("wgmma_tma").grid(300, 300, 8)[0] == 3 * 2


def test_launch_parameters_hold_a_fourth_word():
    from gemmlib.runtime import launch

    values, _, pointers, packer = launch._params(28)     # 3 arrays x 9 words + the maps
    assert packer.size == 28 * 8 and len(pointers) == 28


@pytest.mark.skipif(not backend.SIMULATOR, reason="the simulator's map table")
def test_simulated_maps_are_a_pair_128_bytes_apart():
    A = np.zeros((5, 16), np.uint16)
    B = np.ones((16, 8), np.uint16)
    base = tma.simulated_maps((A, B), ((128, 64), (64, 64)), 128)
    assert tma.simulated_map(base).array is A and tma.simulated_map(base + 128).array is B
    assert tma.simulated_map(base + 128).box == (64, 64)
    with pytest.raises(ValueError, match="box row holds at most 128"):
        tma.simulated_maps((A, B), ((128, 128), (64, 64)), 128)


def test_setmaxnreg_and_trans_b_factories():
    with pytest.raises(ValueError, match="multiple of 8 in 24..256"):
        H.setmaxnreg(20, True)
    if not backend.SIMULATOR:   # one intrinsic per (N, type, layout)
        assert H.wgmma_f16(64, trans_b=True) is H.wgmma_f16(64, trans_b=True)
        assert H.wgmma_f16(64, trans_b=True) is not H.wgmma_f16(64)


@pytest.mark.skipif(not backend.SIMULATOR, reason="the simulator's wgmma twin")
def test_wrong_panel_stride_gives_a_wrong_product(monkeypatch):
    """The MN-major B descriptor's LBO (bytes between 64-column panels) is checked in CI:
    a rung whose descriptor names the wrong panel stride computes a wrong product."""
    import gemmlib
    from gemmlib.kernels import wgmma_async as W

    monkeypatch.setattr(W, "PANEL_BYTES", W.PANEL_BYTES // 2)
    bad = W.build("fp16", BM=64, BN=128, STAGES=2)
    report = gemmlib.verify(bad, [(8, 100, 16)], raise_on_failure=False)
    assert not report.ok


def test_notebooks_skip_the_rungs_on_other_gpus(monkeypatch, capsys):
    """A chapter on a GPU newer than Hopper (compute capability 10.0, 12.0) says why it skips
    the wgmma rungs and moves on, instead of failing at the launch."""
    import dataclasses

    from gemmcourse import notebook as nb
    from gemmlib.kernels import get

    for cc, ok in (((9, 0), True), ((12, 0), False), ((8, 6), False)):
        dev = dataclasses.replace(backend.device_info(), compute_capability=cc, name="some GPU")
        monkeypatch.setattr(nb.backend, "device_info", lambda dev=dev: dev)
        assert nb.runnable(get("wgmma_ws")) is ok
        if not ok:
            assert "SKIPPED" in capsys.readouterr().out
