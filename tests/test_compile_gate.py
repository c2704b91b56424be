"""Every registered kernel compiles for sm_75, sm_80 and sm_90, and its PTX shows
what the rung claims.  Runs the real compiler in a subprocess (the simulator,
which this test session uses, accepts code the compiler rejects)."""

import json
import os
import subprocess
import sys

import pytest

from gemmlib.kernels import LADDER


@pytest.fixture(scope="module")
def gate_records(tmp_path_factory):
    out = tmp_path_factory.mktemp("ptx") / "gate.json"
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0")
    proc = subprocess.run([sys.executable, "-m", "gemmlib.ptx", "--json", str(out)],
                          env=env, capture_output=True, text=True, timeout=1800)
    if not out.exists():
        pytest.fail(f"the compile gate did not run:\n{proc.stdout}\n{proc.stderr}")
    return {(r["rung"], r["cc"]): r for r in json.loads(out.read_text())}


@pytest.mark.parametrize("cc", ["sm_75", "sm_80", "sm_90"])
@pytest.mark.parametrize("name", LADDER)
def test_kernel_compiles_and_ptx_shows_its_claims(gate_records, name, cc):
    rec = gate_records[(name, cc)]
    assert not rec["problems"], f"{name} for {cc}: " + "; ".join(rec["problems"])


def _claims(early_launch=False):
    """A spec's fields the gate reads, claiming nothing but ``early_launch``."""
    from types import SimpleNamespace

    return SimpleNamespace(ptx_must=(), ptx_must_not=(), max_spill_bytes=0,
                           early_launch=early_launch)


def test_an_early_launched_kernel_must_wait_before_touching_global_memory():
    """The gate's rule for ``KernelSpec.early_launch`` rungs, on PTX written here."""
    from gemmlib.ptx import problems

    spec = _claims(early_launch=True)
    head = ".visible .entry k(\n.param .u64 k_param_0\n)\n{\nld.param.u64 %rd1, [k_param_0];\n"
    waits = "griddepcontrol.wait;\n"
    assert problems(spec, head + "mbarrier.init.shared::cta.b64 [%r1], 1;\n" + waits
                    + "ld.f32 %f1, [%rd1];\n") == []
    assert problems(spec, head + "ld.f32 %f1, [%rd1];\n" + waits)     # a generic load first
    assert problems(spec, head + "cp.async.bulk.tensor.2d [%r1], [%rd1];\n" + waits)
    assert problems(spec, head + "ld.shared.f32 %f1, [%r1];\n")       # never waits
    assert problems(_claims(), head + "ld.f32 %f1, [%rd1];\n") == []


def test_serialized_wgmma_fails_the_gate():
    """ptxas's C7509 (wgmma serialized around a call: each waits for the one before) is a
    problem the gate reports; a kernel without the message passes."""
    from gemmlib.ptx import problems

    spec = _claims()
    assert problems(spec, "", {"wgmma_serialized": None}) == []
    found = problems(spec, "", {"wgmma_serialized": "the presence of Extern calls"})
    assert len(found) == 1 and "Extern calls" in found[0]


def test_tile_walks_divide_in_32_bits():
    """The walks' quotients in the simulator equal Python's (the kernels divide as u32)."""
    from gemmlib.kernels.wgmma_async import grouped_order

    origin = grouped_order(128, 64, 8)
    M, N = 128 * 19 + 5, 64 * 7 + 3
    tiles_m, tiles_n = 20, 8
    seen = {tuple(int(v) for v in origin(p, M, N)) for p in range(tiles_m * tiles_n)}
    assert seen == {(128 * i, 64 * j) for i in range(tiles_m) for j in range(tiles_n)}
