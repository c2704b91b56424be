"""sm_75 (Turing, the T4 of Colab): the FP16 forms of ``mma_atom`` and ``mma_swizzle``.

sm_75 has mma.sync for FP16 only as m16n8k8 (and ldmatrix); m16n8k16, BF16, TF32
and cp.async need sm_80.  The ``arch="sm75"`` forms keep the m16n8k16 fragments
and issue two m16n8k8 per m16n8k16.  Checked here: the m16n8k8 layouts against
the PTX ISA tables, the twin, both rungs on odd shapes in the simulator, the
choice of form on a (faked) cc 7.5 device, the refusals that say why, and --
with the real compiler, in a subprocess -- the sm_75 PTX.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import gemmlib
from gemmlib import backend, dispatch
from gemmlib.backend import cuda, uint32
from gemmlib.intrinsics import mma as I
from gemmlib.kernels import mma_atom, mma_swizzle
from gemmlib.runtime import compile as runtime_compile
from gemmlib.runtime import launch as runtime_launch
from gemmlib.spec import ConstraintError

sim_only = pytest.mark.skipif(not backend.SIMULATOR, reason="tests the simulator twins")

ODD_SHAPES = [(1, 1, 1), (17, 9, 13), (33, 40, 24)]


def _t4():
    return dataclasses.replace(backend.device_info(), compute_capability=(7, 5),
                               name="Tesla T4 (faked)", simulated=True)


@pytest.fixture
def on_t4(monkeypatch):
    """A cc 7.5 device for everything that asks ``backend.device_info()``; the dispatch
    layer's memory is cleared before and after (its choices depend on the device)."""
    dispatch.clear_memory_caches()
    dev = _t4()
    monkeypatch.setattr(backend, "device_info", lambda device_id=None: dev)
    yield dev
    dispatch.clear_memory_caches()


# --------------------------------------------------------------------------- 1. layouts


def test_m16n8k8_fp16_layouts_follow_the_ptx_tables():
    """PTX ISA, mma.m16n8k8 .f16: A is two .f16x2 registers, a0 a1 at (g, 2t + i), a2 a3
    at (g + 8, 2t + i); B one .f16x2 register, b0 b1 at (k = 2t + i, n = g)."""
    a = I.fragment_coords(I.A_16_K8, 16)
    b = I.fragment_coords(I.B_16_K8, 8)
    for lane in range(32):
        g, t = lane // 4, lane % 4
        assert a[lane] == [(g, 2 * t), (g, 2 * t + 1), (g + 8, 2 * t), (g + 8, 2 * t + 1)]
        assert b[lane] == [(2 * t, g), (2 * t + 1, g)]
    assert sorted(rc for lane in a for rc in lane) == [(r, c) for r in range(16) for c in range(8)]
    assert sorted(rc for lane in b for rc in lane) == [(r, c) for r in range(8) for c in range(8)]


def test_an_m16n8k16_fragment_is_two_m16n8k8_fragments_along_k():
    """What the sm_75 forms rely on: registers a0, a1 / b0 of m16n8k16 hold k 0-7 exactly
    as the m16n8k8 fragment does, a2, a3 / b1 the same 8 columns (rows of B) shifted by 8."""
    a16, a8 = I.fragment_coords(I.A_16, 16), I.fragment_coords(I.A_16_K8, 16)
    b16, b8 = I.fragment_coords(I.B_16, 16), I.fragment_coords(I.B_16_K8, 8)
    for lane in range(32):
        assert a16[lane][:4] == a8[lane]
        assert a16[lane][4:] == [(r, c + 8) for r, c in a8[lane]]
        assert b16[lane][:2] == b8[lane]
        assert b16[lane][2:] == [(k + 8, n) for k, n in b8[lane]]


# --------------------------------------------------------------------------- 2. the twin


def _halves(x) -> np.ndarray:
    return np.asarray(x, np.float16).view(np.uint16)


def test_mma_f16_k8_and_the_pair_multiply():
    """One warp: A (16 x 16), B (16 x 8) as m16n8k16 fragments; ``mma_f16_k8`` on k 0-7,
    ``mma_f16_sm75`` (two m16n8k8) on all of k.  The simulator checks the twins; on a GPU
    (sm_75 or newer) the same test checks the instruction."""
    if not backend.SIMULATOR and tuple(backend.device_info().compute_capability) < (7, 5):
        pytest.skip("m16n8k8 FP16 needs sm_75")
    rng = np.random.default_rng(75)
    A = rng.integers(-4, 5, (16, 16)).astype(np.float16)   # small integers: exact sums
    B = rng.integers(-4, 5, (16, 8)).astype(np.float16)
    C = rng.integers(-4, 5, (16, 8)).astype(np.float32)
    ca, cb, cc = (np.array(I.fragment_coords(lay, rows), np.int64)
                  for lay, rows in ((I.A_16, 16), (I.B_16, 16), (I.C_F32, 16)))
    Ah, Bh = _halves(A), _halves(B)
    out = np.zeros((2, 16, 8), np.float32)

    @cuda.jit
    def kernel(Ah, Bh, C, ca, cb, cc, out):
        lane = cuda.threadIdx.x
        a = cuda.local.array(4, uint32)
        for r in range(4):
            lo = uint32(Ah[ca[lane, 2 * r, 0], ca[lane, 2 * r, 1]])
            hi = uint32(Ah[ca[lane, 2 * r + 1, 0], ca[lane, 2 * r + 1, 1]])
            a[r] = lo | (hi << uint32(16))
        b = cuda.local.array(2, uint32)
        for r in range(2):
            lo = uint32(Bh[cb[lane, 2 * r, 0], cb[lane, 2 * r, 1]])
            hi = uint32(Bh[cb[lane, 2 * r + 1, 0], cb[lane, 2 * r + 1, 1]])
            b[r] = lo | (hi << uint32(16))
        c = cuda.local.array(4, np.float32)
        for v in range(4):
            c[v] = C[cc[lane, v, 0], cc[lane, v, 1]]
        d8 = I.mma_f16_k8(a[0], a[1], b[0], c[0], c[1], c[2], c[3])
        d75 = I.mma_f16_sm75(a[0], a[1], a[2], a[3], b[0], b[1], c[0], c[1], c[2], c[3])
        for v in range(4):
            r, col = cc[lane, v, 0], cc[lane, v, 1]
            out[0, r, col] = d8[v]
            out[1, r, col] = d75[v]

    kernel[1, 32](Ah, Bh, C, ca, cb, cc, out)
    A64, B64 = A.astype(np.float64), B.astype(np.float64)
    np.testing.assert_array_equal(out[0], A64[:, :8] @ B64[:8] + C)
    np.testing.assert_array_equal(out[1], A64 @ B64 + C)


# --------------------------------------------------------------------------- 3. the rungs


@pytest.mark.parametrize("module", [mma_atom, mma_swizzle])
def test_sm75_form_declares_itself(module):
    s = module.build("fp16", arch="sm75")
    assert s.params["arch"] == "sm75" and s.min_cc == (7, 5) and not s.min_cc_why
    assert any("m16n8k8" in p for p in s.ptx_must)
    assert any("cp" in p for p in s.ptx_must_not) and any("m16n8k16" in p for p in s.ptx_must_not)
    if module is mma_swizzle:
        assert any("ldmatrix" in p for p in s.ptx_must)
    s80 = module.build("fp16", arch="sm80")
    assert s80.min_cc == (8, 0) and s80.params["arch"] == "sm80"
    # the form is the one named: the simulator's device is sm_90, so the default is sm80
    assert module.SPEC.params["arch"] == "sm80"


@sim_only
@pytest.mark.parametrize("module", [mma_atom, mma_swizzle])
def test_sm75_form_is_right_on_odd_shapes(module):
    gemmlib.verify(module.build("fp16", arch="sm75"), ODD_SHAPES, seed=75)


@pytest.mark.parametrize("module", [mma_atom, mma_swizzle])
def test_build_without_arch_takes_the_gpus_form(module, on_t4):
    assert module.build("fp16").params["arch"] == "sm75"
    assert module.build("bf16").params["arch"] == "sm80"   # no sm_75 form: refused below


def test_other_precisions_have_no_sm75_form():
    for module, prec in ((mma_atom, "bf16"), (mma_atom, "tf32"), (mma_swizzle, "3xtf32")):
        with pytest.raises(ValueError, match="sm_80"):
            module.build(prec, arch="sm75")


@pytest.mark.parametrize("module, prec", [(mma_atom, "bf16"), (mma_atom, "tf32"),
                                          (mma_swizzle, "bf16"), (mma_swizzle, "tf32"),
                                          (mma_swizzle, "3xtf32"), (mma_atom, "fp16")])
def test_sm80_forms_refuse_sm75_and_say_why(module, prec):
    s = module.build(prec, arch="sm80")
    with pytest.raises(ConstraintError, match=r"compute capability.*needs sm_80\+, device is "
                                              r"sm_75: .*sm_80 \(Ampere\)") as e:
        s.check(64, 64, 64, _t4())
    want = "fp16 only" if prec != "fp16" else "sm_75 form"
    assert want in str(e.value)
    s.check(64, 64, 64, dataclasses.replace(_t4(), compute_capability=(8, 6)))


# --------------------------------------------------------------------------- 4. selection


@sim_only
def test_matmul_on_a_t4_runs_the_sm75_form(on_t4, monkeypatch):
    ran = []
    launch = runtime_launch.launch

    def spy(p, *args, **kw):
        ran.append(p.spec)
        return launch(p, *args, **kw)

    monkeypatch.setattr(runtime_launch, "launch", spy)
    rng = np.random.default_rng(7)
    A = rng.uniform(-1, 1, (33, 13)).astype(np.float16)   # M > 16: not a decode shape
    B = rng.uniform(-1, 1, (13, 9)).astype(np.float16)
    ref = A.astype(np.float64) @ B.astype(np.float64)

    C = gemmlib.matmul(A, B, kernel="mma_atom", out_dtype=np.float32)
    assert ran[-1].name == "mma_atom" and ran[-1].params["arch"] == "sm75"
    assert ran[-1].min_cc == (7, 5)
    np.testing.assert_allclose(C, ref, rtol=1e-5, atol=1e-5)

    C = gemmlib.matmul(A, B, out_dtype=np.float32)   # "auto": mma_swizzle's sm_75 form
    # (mma_pipeline needs cp.async)
    assert ran[-1].name == "mma_swizzle" and ran[-1].params["arch"] == "sm75"
    np.testing.assert_allclose(C, ref, rtol=1e-5, atol=1e-5)


def test_matmul_on_a_t4_refuses_bf16_and_tf32_with_the_reason(on_t4):
    from gemmlib.precision import to_bf16

    A = np.ones((16, 16), np.float32)
    with pytest.raises(ConstraintError, match=r"sm_75.*bf16 inputs from sm_80"):
        gemmlib.matmul(to_bf16(A), to_bf16(A), kernel="mma_atom")
    with pytest.raises(ConstraintError, match=r"tf32 inputs from sm_80"):
        gemmlib.matmul(A, A, kernel="mma_swizzle", precision="tf32")


def test_an_sm80_gpu_keeps_the_sm80_form(monkeypatch):
    dispatch.clear_memory_caches()
    a100 = dataclasses.replace(backend.device_info(), compute_capability=(8, 0), name="A100")
    monkeypatch.setattr(backend, "device_info", lambda device_id=None: a100)
    try:
        assert dispatch.get_spec("mma_atom", "fp16").params["arch"] == "sm80"
        assert dispatch.select_tc("fp16", 64, 64, 64).module.endswith("mma_pipeline")
    finally:
        dispatch.clear_memory_caches()


# --------------------------------------------------------------------------- 5. the compiler


_GATE = """
import json, re, sys
from gemmlib.kernels import get
from gemmlib.ptx import compile_ptx, for_target, problems, resources
out = {}
for name in ("mma_atom", "mma_swizzle"):
    for cc in ((7, 5), (8, 0)):
        s = for_target(get(name), cc)
        ptx = compile_ptx(s, cc)
        res = resources(ptx, cc)
        out[f"{name}@{cc[0]}{cc[1]}"] = dict(
            arch=s.params["arch"], problems=problems(s, ptx, res), registers=res["registers"],
            k8=len(re.findall(r"mma\\.sync\\.aligned\\.m16n8k8\\.row\\.col\\.f32\\.f16", ptx)),
            k16=ptx.count("m16n8k16"), ldmatrix=ptx.count("ldmatrix.sync.aligned"),
            cp_async=ptx.count("cp.async"), target=re.search(r"\\.target (\\S+)", ptx).group(1))
json.dump(out, sys.stdout)
"""


def test_sm75_forms_compile_for_sm75():
    """The real compiler (a subprocess: this session runs the simulator), as the compile
    gate calls it: for_target picks the sm_75 form for cc 7.5, ptxas assembles it."""
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0")
    proc = subprocess.run([sys.executable, "-c", _GATE], env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout)
    for name in ("mma_atom", "mma_swizzle"):
        t4, a100 = r[f"{name}@75"], r[f"{name}@80"]
        assert t4["arch"] == "sm75" and t4["target"] == "sm_75" and not t4["problems"], t4
        assert t4["k8"] > 0 and t4["k16"] == 0 and t4["cp_async"] == 0, t4
        assert a100["arch"] == "sm80" and a100["k16"] > 0 and a100["k8"] == 0, a100
    assert r["mma_swizzle@75"]["ldmatrix"] > 0
    # one m16n8k16 becomes two m16n8k8
    assert r["mma_swizzle@75"]["k8"] == 2 * r["mma_swizzle@80"]["k16"]


# --------------------------------------------------------------------------- 6. machine code


def test_dispatch_loads_sass_it_assembled_never_ptx(on_t4, monkeypatch, tmp_path):
    """On a T4 the dispatch layer hands the driver machine code for sm_75 that nvJitLink
    assembled where it was built (gemmlib.ptx.assemble), never PTX for the driver's JIT:
    numba's own link (which falls back to the driver when it finds no nvJitLink) is not used.
    A stand-in numba kernel stands for the compiled one (compiling needs a GPU here)."""
    from gemmlib import ptx

    asked = []

    class Library:
        _linking_files, needs_cudadevrt, _max_registers = set(), False, 96

        def get_asm_str(self, cc=None):
            asked.append(("ptx", cc))
            return ".version 8.8\n.target sm_75\n"

        def get_cubin(self, cc=None):
            raise AssertionError("numba's link may leave PTX to the driver's JIT")

    class Kernel:
        py_func = test_dispatch_loads_sass_it_assembled_never_ptx

        def compile(self, sig):
            return type("Compiled", (), {"_codelibrary": Library(), "entry_name": "k_sm75"})()

    def assemble(text, arch, max_registers=None):
        asked.append(("assemble", arch, max_registers))
        return b"\x7fELF sass for " + arch.encode()

    monkeypatch.setattr(ptx, "assemble", assemble)
    monkeypatch.setattr(runtime_compile, "cache_dir", lambda: tmp_path)
    c = runtime_compile._compile(Kernel(), "test_module", {}, "float16", 3)
    assert asked == [("ptx", (7, 5, "")), ("assemble", "sm_75", 96)]
    assert c.cubin == b"\x7fELF sass for sm_75" and c.entry == "k_sm75"


_SASS = """
import json, struct, sys
from gemmlib import ptx
from gemmlib.kernels import get
out = {}
for name in ("naive", "mma_swizzle"):
    spec = ptx.for_target(get(name), (7, 5))
    text = ptx.compile_ptx(spec, (7, 5))
    cubin = ptx.assemble(text, "sm_75", spec.kernel.targetoptions.get("max_registers"))
    out[name] = dict(magic=cubin[:4].hex(), abi_version=cubin[8],
                     machine=struct.unpack_from("<H", cubin, 18)[0],
                     flags=struct.unpack_from("<I", cubin, 48)[0],
                     ptx_inside=b".version" in cubin or b".target" in cubin)
json.dump(out, sys.stdout)
"""


def test_sm75_builds_are_sass_for_sm75():
    """With the real compiler (a subprocess: this session runs the simulator): what
    gemmlib.ptx.assemble makes of the sm_75 PTX is a CUDA ELF (cubin) of machine code for
    sm_75, with no PTX inside for a driver to JIT -- so a T4 whose driver is older than the
    compiler (CUDA minor-version compatibility) runs it."""
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0")
    proc = subprocess.run([sys.executable, "-c", _SASS], env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name, c in json.loads(proc.stdout).items():
        assert c["magic"] == "7f454c46" and c["machine"] == 190, (name, c)   # ELF, EM_CUDA
        # the SM version: bits 8-15 of e_flags from ELF ABI version 8 on, bits 0-7 before
        sm = (c["flags"] >> 8) & 0xFF if c["abi_version"] >= 8 else c["flags"] & 0xFF
        assert sm == 75 and not c["ptx_inside"], (name, c)
