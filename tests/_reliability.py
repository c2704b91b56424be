"""Helpers shared by the reliability tests (issue 6): every registered kernel, its
operand layout, its compute-capability floor, the float64 oracle, and the JSON
summaries written to ``$GEMMLIB_REPORT_DIR``.

Not a test module (no ``test_`` prefix): imported by the ``test_*`` files.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gemmlib import backend
from gemmlib.kernels import LADDER, SCALED, get
from gemmlib.verify import spec_tolerance, tolerance

EPS32 = float(np.finfo(np.float32).eps)


def kernel_names() -> list[str]:
    """Every registered rung that computes an unscaled product (read at collection time, so
    new rungs are picked up); FP8 rungs take scales and have their own checks
    (tests/test_wgmma_lowp.py)."""
    return [n for n in LADDER if n not in SCALED]


def spec_or_skip(name: str):
    """The spec of ``name``; skips the test when this GPU is older than its ``min_cc``."""
    spec = get(name)
    if not backend.SIMULATOR:
        cc = tuple(backend.device_info().compute_capability)
        if cc < tuple(spec.min_cc):
            pytest.skip(f"{name} needs sm_{spec.min_cc[0]}{spec.min_cc[1]}+, "
                        f"device is sm_{cc[0]}{cc[1]}")
    return spec


def nk(spec) -> bool:
    """True when the kernel takes B as (N, K) and computes A @ B.T."""
    return spec.b_operand == "NK"


def b_shape(spec, K: int, N: int) -> tuple[int, int]:
    return (N, K) if nk(spec) else (K, N)


def input_dtype(spec) -> np.dtype:
    """The NumPy dtype of ``spec``'s inputs: float32, or float16 for FP16 tensor-core rungs.

    The tensor-core rungs are registered in FP16 (their default spec), so the
    reliability suite runs them on float16 data; tf32/3xtf32/bf16 are covered
    by tests/test_tensor_cores.py.
    """
    return np.dtype(spec.dtype)


def host_operands(spec, M, N, K, rng):
    """Random host inputs in [-1, 1) in the dtype and layout ``spec`` takes."""
    A = rng.uniform(-1, 1, (M, K)).astype(input_dtype(spec))
    B = rng.uniform(-1, 1, b_shape(spec, K, N)).astype(input_dtype(spec))
    return A, B


def precision_operands(precision: str, M: int, N: int, K: int, rng):
    """Random (M, K) and (K, N) host inputs in [-1, 1) for a call in ``precision``:
    float16 for fp16, gemmlib's bf16 arrays for bf16, float32 otherwise."""
    from gemmlib import precision as P

    A = rng.uniform(-1, 1, (M, K)).astype(np.float32)
    B = rng.uniform(-1, 1, (K, N)).astype(np.float32)
    if precision == "fp16":
        return A.astype(np.float16), B.astype(np.float16)
    if precision == "bf16":
        return P.to_bf16(A), P.to_bf16(B)
    return A, B


def as_read(spec, X):
    """``X`` as ``spec``'s kernel reads it: wgmma_tf32 feeds float32 straight to the tensor
    cores, which ignore the low 13 mantissa bits (every other rung's default computes on the
    values as given).  NaN (NumPy's, with the top mantissa bit) and Inf stay what they are."""
    if not spec.module.endswith("wgmma_tf32"):
        return X
    xp = backend.array_module() if not isinstance(X, np.ndarray) else np
    X = xp.ascontiguousarray(X, dtype=np.float32)
    return (X.view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32)


def run(spec, A, B, **kw):
    """gemmlib.matmul with ``spec``, passing transpose_b as the spec requires, into a
    float32 C unless the spec writes 16 bits or ``out`` is given (the tolerances are the
    accumulators')."""
    import gemmlib

    if "out" not in kw and spec.out_dtype != "uint16":   # the rung's fp32 accumulators
        kw.setdefault("out_dtype", "float32")
    return gemmlib.matmul(A, B, kernel=spec, transpose_b=nk(spec), **kw)


def ref64(spec, A, B) -> np.ndarray:
    """The float64 oracle on the host: sum over the real k only."""
    A64 = np.asarray(backend.to_host(A), dtype=np.float64)
    B64 = np.asarray(backend.to_host(B), dtype=np.float64)
    return A64 @ (B64.T if nk(spec) else B64)


def elementwise_bound(A64, B64t, K: int) -> np.ndarray:
    """A rigorous bound on |C - ref| for a K-term float32 dot product: ~K*eps*(|A| @ |B|)."""
    return 2.0 * max(K, 1) * EPS32 * (np.abs(A64) @ np.abs(B64t)) + 1e-30


def assert_close(C, ref, K: int, spec=None, scale=None) -> None:
    """C is finite and within gemmlib's tolerance of the float64 ``ref`` (relative Frobenius
    error, ``verify.tolerance``; the precision's bound when ``spec`` is given), as in
    ``gemmlib.verify``.  ``scale``: the norm to divide by instead of ``||ref||`` -- that of
    ``|A| @ |B|`` where every element is one dot product that may cancel (a rank-1 product
    of broadcast operands), since rounding error is bounded relative to it, not to C."""
    C = np.asarray(backend.to_host(C), dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    assert C.shape == ref.shape, (C.shape, ref.shape)
    bad = int((~np.isfinite(C)).sum())
    assert bad == 0, f"{bad} non-finite element(s) in C"
    scale = float(np.linalg.norm(ref)) if scale is None else float(scale)
    err = float(np.linalg.norm(C - ref)) / (scale if scale > 0 else 1.0)
    tol = spec_tolerance(spec, K) if spec is not None else tolerance("float32", K)
    assert err <= tol, f"relative error {err:.2e} > {tol:.1e}"


def load_script(relpath: str):
    """A script of the repository (e.g. ``scripts/nonfinite_gpu.py``) as a module."""
    path = Path(__file__).resolve().parents[1] / relpath
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod          # (dataclasses look their module up)
    spec.loader.exec_module(mod)
    return mod


def run_offline(code: str, timeout: int = 900):
    """Run ``code`` with numba's real compiler, in a subprocess (this session runs the
    simulator, which accepts code the compiler rejects); the JSON its last line prints."""
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=timeout, cwd=Path(__file__).resolve().parents[1])
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def check_offline(code: str, timeout: int = 300) -> None:
    """Run ``code``, which prints "ok" when its checks of the real compiler's output hold,
    in a subprocess; skip where no NVVM can compile PTX."""
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=timeout)
    if proc.returncode and "NvvmSupportError" in proc.stderr + proc.stdout:
        pytest.skip("no NVVM available to compile PTX")
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-2000:]


def compile_offline(imports: str, pairs: str) -> list[dict]:
    """One record per (spec, cc) of ``pairs`` (source of that list, after ``imports``):
    the PTX assembled by ptxas -- registers, spills -- and ``gemmlib.ptx.problems``."""
    return run_offline(
        "import json\n"
        "from gemmlib import ptx\n"
        f"{imports}\n"
        "out = []\n"
        f"for spec, cc in {pairs}:\n"
        "    p = ptx.compile_ptx(spec, cc)\n"
        "    r = ptx.resources(p, cc, None, arch=ptx.arch_of(spec, cc))\n"
        "    out.append(dict(r, kernel=spec.name, cc=list(cc),\n"
        "                    problems=ptx.problems(spec, p, r)))\n"
        "print(json.dumps(out))\n")


def report(name: str, data) -> None:
    """Write ``data`` as JSON to $GEMMLIB_REPORT_DIR/<name>.json (when that is set)."""
    where = os.environ.get("GEMMLIB_REPORT_DIR")
    if not where:
        return
    path = Path(where)
    path.mkdir(parents=True, exist_ok=True)
    (path / f"{name}.json").write_text(json.dumps(data, indent=1, sort_keys=True, default=str))


def finite_or_none(x: float):
    return x if math.isfinite(x) else None


# --------------------------------------------------------------------------
# The persistent Hopper rungs (wgmma_pingpong, wgmma_cluster): one product checked whole

#: an H100/H200 is present (wgmma and TMA run)
HOPPER = (not backend.SIMULATOR and backend.gpu_present()
          and tuple(backend.device_info().compute_capability) == (9, 0))


def operands16(precision, M, N, K, rng):
    """Random A, B in ``precision``'s input type (device arrays on a GPU) and the float64
    copies of the values the kernel reads."""
    dt = "bfloat16" if precision == "bf16" else "float16"
    A = backend.random_matrix((M, K), dt, rng)
    B = backend.random_matrix((K, N), dt, rng)
    a64, b64 = (np.asarray(backend.to_host(x.astype(np.float32)), np.float64) for x in (A, B))
    return A, B, a64, b64


def run_poisoned(spec, precision, A, B):
    """C = A B into a NaN-filled C (an element no block writes stays NaN), on the host."""
    xp = backend.array_module()
    C = xp.full((A.shape[0], B.shape[1]), np.nan, np.float32)
    import gemmlib

    gemmlib.matmul(A, B, kernel=spec, precision=precision, out=C)
    return np.asarray(backend.to_host(C))


def check_product(spec, precision, M, N, K, seed):
    """``spec``'s product of fresh random operands: every element written, within the
    precision's tolerance of float64."""
    from gemmlib.precision import tolerance as precision_tolerance

    A, B, a64, b64 = operands16(precision, M, N, K, np.random.default_rng(seed))
    C = run_poisoned(spec, precision, A, B)
    ref = a64 @ b64
    err = np.abs(C - ref).max() / max(np.abs(ref).max(), 1e-30)
    assert np.isfinite(C).all(), (spec.name, M, N, K, "unwritten", int((~np.isfinite(C)).sum()))
    assert err <= precision_tolerance(precision, K), (spec.name, M, N, K, err)


def check_sampled_rows(spec, precision, M, N, K, rng, rows: int = 64):
    """A large product against float64 on a sample of rows (first, last and ``rows`` random)."""
    from gemmlib.precision import tolerance as precision_tolerance

    A, B, a64, b64 = operands16(precision, M, N, K, rng)
    C = run_poisoned(spec, precision, A, B)
    assert np.isfinite(C).all(), (spec.name, M, N, K)
    pick = np.unique(np.r_[0, M - 1, rng.integers(0, M, rows)])
    ref = a64[pick] @ b64
    err = np.abs(C[pick] - ref).max() / np.abs(ref).max()
    assert err <= precision_tolerance(precision, K), (spec.name, M, N, K, err)


def on_blocks(spec, blocks: int):
    """``spec`` launched on ``blocks`` persistent blocks whatever the GPU (the simulator
    has one SM): the blocks' tile walks interleave."""
    import dataclasses

    return dataclasses.replace(spec, name=f"{spec.name}_on{blocks}",
                               grid=lambda M, N, K: (blocks, 1, 1))


#: NaN in fp16 and in bf16: what a 16-bit C is poisoned with
POISON16 = 0xFFFF


def bits16(x) -> np.ndarray:
    """The uint16 bit patterns of a 16-bit array (a BF16Array's bits), on the host."""
    from gemmlib.precision import BF16Array

    return np.asarray(backend.to_host(x.bits if isinstance(x, BF16Array)
                                      else x.view(np.uint16)))


def launch_poisoned(spec, A, B, M, N, K, bias=None) -> np.ndarray:
    """C from ``spec`` on the kernel's own operands (uint16 bits for 16-bit inputs) into
    a poisoned C -- float32, or the bits of the spec's 16-bit ``OUT`` -- in the simulator
    on two persistent blocks, on a GPU through ``gemmlib.dispatch.launch``; on the host."""
    from gemmlib import dispatch

    out = spec.params.get("OUT", "fp32")
    C = (np.full((M, N), np.nan, np.float32) if out == "fp32"
         else np.full((M, N), POISON16, np.uint16))
    kw = {} if bias is None else {"bias": bias}
    if backend.SIMULATOR:
        dispatch.launch(on_blocks(spec, 2), A, B, C, M, N, K, **kw)
        return C
    xp = backend.array_module()
    dC = xp.asarray(C)
    kw = {k: xp.asarray(v) for k, v in kw.items()}
    dispatch.launch(spec, xp.asarray(A), xp.asarray(B), dC, M, N, K, **kw)
    return np.asarray(backend.to_host(dC))


def check_accumulated(C, out: str, a64, b64, bias64=None, what=""):
    """Every element written and within the fp32 accumulation's bound (one more rounding
    for the bias) plus the output's own rounding of the float64 A @ B (+ bias)."""
    from gemmlib import precision as P

    got = (C.astype(np.float64) if out == "fp32" else
           (C.view(np.float16) if out == "fp16" else P.bf16_bits_to_float32(C)).astype(
               np.float64))
    ref, mag = a64 @ b64, np.abs(a64) @ np.abs(b64)
    if bias64 is not None:
        ref, mag = ref + bias64, mag + np.abs(bias64)
    assert np.isfinite(got).all(), (what, "unwritten", int((~np.isfinite(got)).sum()))
    u = P.OUT16_ROUNDOFF.get(out, 0.0)
    bound = u * np.abs(ref) + (1 + u) * 2.0 * (a64.shape[1] + 1) * EPS32 * mag + 2.0 ** -25
    worst = float((np.abs(got - ref) / bound).max())
    assert worst <= 1.0, (what, worst)


def count_load16(monkeypatch) -> list:
    """Record every ``convert.load16`` call as (row, column) from now on: the kernels built
    afterwards call the counting function (the list it fills is returned)."""
    from gemmlib.intrinsics import convert

    calls = []
    real = convert.load16

    def counted(arr, i, j):
        calls.append((int(i), int(j)))
        return real(arr, i, j)

    monkeypatch.setattr(convert, "load16", counted)
    return calls
