"""NaN and Inf in the inputs reach exactly the elements of C the reference says.

The reference is the float64 product over the *real* k only:
``C[i, j] = sum_{k < K} A[i, k] * B[k, j]``.  So C[i, j] is NaN when a term is
NaN (a NaN operand, or Inf * 0) or +Inf and -Inf terms meet; +/-Inf when the
infinite terms agree in sign; finite otherwise.  These masks do not depend on
the order of summation, so every kernel must reproduce them exactly.

What this catches:

* zero padding done wrong: a kernel that multiplies an Inf by a padding zero
  (an A element read past the end of its row -- which in memory is the first
  element of the next row -- or stale shared memory from the previous
  k-tile) creates NaN where the reference has a finite value or an Inf;
* an element never written (the output is NaN-poisoned when given);
* finite elements are checked against a rigorous bound,
  ``|C - ref| <= 2 K eps (|A| @ |B|)``.

Inputs are kept in [-1, 1] so that no float32 sum overflows (a float32 sum
reaching Inf where float64 stays finite would be float32's right answer, not
a kernel bug; this test avoids that case).  On the GPU, cuBLAS (TF32 off) is
compared with the same reference.
"""

from __future__ import annotations

import numpy as np
import pytest

from gemmlib import backend
from gemmlib.backend import cuda, float32

from _reliability import (as_read, elementwise_bound, input_dtype, kernel_names, nk, report, run,
                          spec_or_skip)

PATTERNS = ("structured", "scattered")

# Kernels compute with NaN/Inf on purpose here; the simulator's NumPy scalars warn.
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def planted(spec, M, N, K, pattern, seed):
    """Host inputs A (M, K) and B in ``spec``'s layout, with NaN/Inf/0 planted; also
    the logical (K, N) B for the reference."""
    rng = np.random.default_rng(seed)
    A = rng.uniform(-1, 1, (M, K))
    Bkn = rng.uniform(-1, 1, (K, N))
    bk = spec.k_tile
    if pattern == "structured":
        A[0, K - 1] = np.inf                   # last k: the partial k-tile
        A[M // 2, 0] = -np.inf                 # = A[M//2 - 1, K] in memory: a read past the row
        A[M - 1, min(bk - 1, K - 1)] = np.nan  # end of the first k-tile: stale shared memory
        Bkn[K - 1, 0] = 0.0                    # Inf * 0 = NaN at C[0, 0]
        Bkn[0, N - 1] = np.inf                 # B (N, K) layout: B[N-1, 0] follows row N-2
        Bkn[min(bk, K - 1), N // 2] = -np.inf  # second k-tile
        Bkn[K // 2, 1 % N] = np.nan
        Bkn[K // 2, 0] = 0.0
    elif pattern == "scattered":
        for _ in range(max(1, M // 4)):
            A[rng.integers(M), rng.integers(K)] = rng.choice([np.nan, np.inf, -np.inf])
        for _ in range(max(1, N // 4)):
            Bkn[rng.integers(K), rng.integers(N)] = rng.choice([np.inf, -np.inf])
        zeros = rng.random((K, N)) < 0.1
        Bkn[zeros] = 0.0
    else:  # pragma: no cover
        raise ValueError(pattern)
    A = A.astype(input_dtype(spec))  # float16 for the FP16 tensor-core rungs
    Bkn = Bkn.astype(input_dtype(spec))
    B = np.ascontiguousarray(Bkn.T) if nk(spec) else Bkn
    return A, B, Bkn


def reference_with_bound(A, Bkn):
    A64, B64 = A.astype(np.float64), Bkn.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        ref = A64 @ B64
    K = A.shape[1]
    bound = elementwise_bound(np.where(np.isfinite(A64), A64, 0.0),
                              np.where(np.isfinite(B64), B64, 0.0), K)
    return ref, bound


def mismatches(C, ref, bound) -> list[str]:
    """Human-readable disagreements (empty when C matches the reference)."""
    C = np.asarray(C, dtype=np.float64)
    out = []
    for what, f in (("NaN", np.isnan), ("+Inf", np.isposinf), ("-Inf", np.isneginf)):
        bad = np.argwhere(f(C) != f(ref))
        if len(bad):
            pos = ", ".join(f"[{i},{j}] C={C[i, j]} ref={ref[i, j]}" for i, j in bad[:6])
            out.append(f"{what} mask differs at {len(bad)} element(s): {pos}")
    fin = np.isfinite(ref) & np.isfinite(C)
    err = np.abs(C - ref)
    over = np.argwhere(fin & (err > bound))
    if len(over):
        i, j = over[0]
        out.append(f"{len(over)} finite element(s) outside the error bound, e.g. [{i},{j}] "
                   f"C={C[i, j]} ref={ref[i, j]} bound={bound[i, j]:.2e}")
    return out


def sim_shapes(spec):
    bk = spec.k_tile
    return [(13, 11, bk + 3)]


def gpu_shapes(spec):
    tm, tn = spec.tile
    bk = spec.k_tile
    return [(tm + 1, tn + 1, bk + 3), (2 * tm + 3, 2 * tn - 1, 3 * bk + 5), (67, 45, 37),
            (tm - 1, tn + 4, 4 * bk), (257, 130, 1), (3, 2, 2), (513, 515, 129)]


def _check(spec, M, N, K, pattern, seed, cublas=False):
    A, B, Bkn = planted(spec, M, N, K, pattern, seed)
    ref, bound = reference_with_bound(as_read(spec, A), as_read(spec, Bkn))
    out = None
    if not backend.SIMULATOR:
        xp = backend.array_module()
        A_, B_ = xp.asarray(A), xp.asarray(B)
        out = backend.poisoned((M, N))
    else:
        A_, B_ = A, B
        out = np.full((M, N), np.nan, np.float32)
    # A poisoned output cannot hide unwritten elements only where ref is finite;
    # run once more on a zero-filled output so unwritten NaN-ref elements show too.
    C1 = backend.to_host(run(spec, A_, B_, out=out))
    problems = [f"(NaN-filled out) {p}" for p in mismatches(C1, ref, bound)]
    if not backend.SIMULATOR:  # (test_properties covers unwritten elements in the simulator)
        zero = backend.array_module().zeros((M, N), np.float32)
        C2 = backend.to_host(run(spec, A_, B_, out=zero))
        problems += [f"(zero-filled out) {p}" for p in mismatches(C2, ref, bound)]
    info = {"shape": [M, N, K], "pattern": pattern, "nonfinite_in_ref": int((~np.isfinite(ref)).sum()),
            "finite_in_ref": int(np.isfinite(ref).sum()), "ok": not problems}
    if cublas:
        # fp32 cuBLAS on the same values (16-bit products are exact in fp32: same masks)
        A32, B32 = A_.astype(np.float32), B_.astype(np.float32)
        Cb = backend.to_host(backend.cublas_matmul(A32, B32.T if nk(spec) else B32))
        info["cublas_matches_kernel_masks"] = not any(
            "mask" in p for p in mismatches(C1, np.asarray(Cb, np.float64), bound))
    return problems, info


@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("name", kernel_names())
def test_special_values_propagate_exactly(name, pattern):
    if not backend.SIMULATOR:
        pytest.skip("simulator sizes; the GPU runs test_special_values_propagate_exactly_gpu")
    spec = spec_or_skip(name)
    problems = []
    for i, (M, N, K) in enumerate(sim_shapes(spec)):
        p, _ = _check(spec, M, N, K, pattern, seed=17 + i)
        problems += [f"{M}x{N}x{K}: {x}" for x in p]
    assert not problems, f"{name} ({pattern}):\n" + "\n".join(problems)


@pytest.mark.gpu
@pytest.mark.parametrize("name", kernel_names())
def test_special_values_propagate_exactly_gpu(name):
    spec = spec_or_skip(name)
    problems, infos = [], []
    for pattern in PATTERNS:
        for i, (M, N, K) in enumerate(gpu_shapes(spec)):
            try:  # report every shape, not only the first that goes wrong
                p, info = _check(spec, M, N, K, pattern, seed=1000 + i, cublas=True)
            except Exception as e:  # noqa: BLE001
                p, info = [f"{type(e).__name__}: {e}"], {"shape": [M, N, K], "ok": False}
            problems += [f"{M}x{N}x{K} {pattern}: {x}" for x in p]
            infos.append(info)
    report(f"special-values-{name}", {"kernel": name, "checks": infos})
    assert not problems, f"{name}:\n" + "\n".join(problems)


@pytest.mark.gpu
@pytest.mark.parametrize("pattern", PATTERNS)
def test_cublas_agrees_with_the_reference_on_special_values_gpu(pattern):
    """The speed reference obeys the same semantics (so comparing with it is fair)."""
    xp = backend.array_module()
    from gemmlib.kernels import get

    spec = get(kernel_names()[0])
    problems = []
    for i, (M, N, K) in enumerate([(129, 131, 19), (67, 45, 37), (1000, 999, 257)]):
        A, _, Bkn = planted(spec, M, N, K, pattern, seed=2000 + i)
        ref, bound = reference_with_bound(A, Bkn)
        C = backend.to_host(backend.cublas_matmul(xp.asarray(A), xp.asarray(Bkn)))
        problems += [f"{M}x{N}x{K}: {x}" for x in mismatches(C, ref, bound)]
    assert not problems, "cuBLAS:\n" + "\n".join(problems)


def test_planting_leaves_checks_meaningful():
    """Sanity of the test itself: the structured pattern makes NaN, +Inf, -Inf and finite
    elements, and NaN from Inf * 0 exactly at C[0, 0]."""
    from gemmlib.kernels import get

    spec = get("naive") if "naive" in kernel_names() else get(kernel_names()[0])
    A, _, Bkn = planted(spec, 13, 11, 11, "structured", 17)
    ref, _ = reference_with_bound(A, Bkn)
    assert np.isnan(ref[0, 0])
    assert np.isfinite(ref).sum() > 20
    assert np.isinf(ref).any()
    # A naive "padded" product that reads one element past each row of A would differ:
    wrong = A.astype(np.float64).ravel()
    assert not np.isfinite(wrong[(13 // 2) * 11])  # the element after row 5 is -Inf


@cuda.jit
def one_k_too_far(A, B, C):
    row, col = cuda.grid(2)
    M, K = A.shape
    if row < M and col < C.shape[1]:
        acc = float32(0.0)
        for k in range(K + 1):
            if k < K:
                acc += A[row, k] * B[k, col]
            elif row + 1 < M:  # "A[row, K]" is A[row + 1, 0] in row-major memory
                acc += A[row + 1, 0] * float32(0.0)  # ... times B's zero padding
        C[row, col] = acc


def test_a_kernel_that_multiplies_padding_by_a_real_inf_is_caught():
    """The checks bite: a kernel that runs one k too far, multiplying a zero (padding of B)
    by the element after its row of A (the next row's first element, an Inf here), is
    reported, while the real kernels pass the same check."""
    import dataclasses

    from gemmlib.kernels import get

    base = get("naive") if "naive" in kernel_names() else get(kernel_names()[0])
    if base.b_operand != "KN" or base.block[0] * base.block[1] > 1024:
        pytest.skip("needs a KN rung with a 2-D block to borrow the launch from")
    bad = dataclasses.replace(base, name="one_k_too_far", kernel=one_k_too_far,
                              grid=lambda M, N, K: (-(-M // 32), -(-N // 32), 1),
                              block=(32, 32, 1))
    problems, _ = _check(bad, 13, 11, 11, "structured", seed=17)
    assert any("NaN mask differs" in p for p in problems), problems
