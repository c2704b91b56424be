"""NaN, +Inf and -Inf through every tensor-core precision, against cuBLAS (issue 18, item 2).

For fp16, bf16, tf32 and 3xtf32, and a few shapes and placements of NaN/+Inf/-Inf
in A and B, compares where ``gemmlib.matmul`` puts NaN, +Inf and -Inf in C with
where cuBLAS puts them in the same precision (``gemmlib.backend.cublas_gemm``:
fp16/bf16 inputs, tf32 = CUBLAS_COMPUTE_32F_FAST_TF32, and for 3xtf32 the fp32
SGEMM it replaces, TF32 off), element by element; finite elements must agree
within the precision's bound, relative to ``|A| @ |B|``.  Prints a table, writes
JSON, exits 1 when a gated case differs.

    python scripts/nonfinite_gpu.py OUT.json [--kernels auto,mma_pipeline] [--bench]

``--kernels``: ``auto`` is what ``gemmlib.matmul`` runs (on an H100/H200 fp16 and
bf16 go to ``wgmma_ws``); ``all`` adds every tensor-core rung that runs here.
``--bench``: 3xtf32 against SGEMM at 4096^3 and 8192^3 afterwards (kernel timing):
the non-finite handling adds ALU work to the split, so the README's "faster than
SGEMM" should be re-measured with it.

Cases (``CASES``; ``gate=False`` ones are printed but cannot fail the run: they
probe what the hardware does where gemmlib documents a limit):

* ``issue``      130x140x160: one NaN row of A, one +Inf column of B, one +Inf entry
  of A, one -Inf entry of B (the report of issue 18: 3xtf32 gave 536 NaN, 0 Inf).
* ``random``     NaN/+Inf/-Inf at random places in A and B, 10% zeros (Inf * 0),
  a third of the values exact in TF32/FP16 (small parts exactly 0), three seeds.
* ``edges``      odd K and N (gemmlib pads them with zeros): non-finite values in the
  last real row/column of A and B, next to the padding.
* ``decode``     M = 8: what ``auto`` runs there is the skinny rung.
* float32 precisions only: ``near-max`` (|x| in [3.40199e38, FLT_MAX], where
  cvt.rna.tf32 rounds to Inf, times |b| <= 1/4: finite products), ``overflow``
  (products above FLT_MAX by < 2^11: +-Inf in SGEMM), and ungated
  ``overflow-2^11`` (above by more: 3xtf32's correction terms overflow too, and
  may give NaN), ``subnormal`` (x = 2^-130 and 2^-140 times Inf: TF32 rounds
  |x| < 2^-137 to 0, and 0 * Inf = NaN) and ``payload-nan`` (a NaN whose payload
  lies in the 13 bits TF32 drops: cvt.rna.tf32 makes it Inf).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent

PRECISIONS = ("fp16", "bf16", "tf32", "3xtf32")
#: the cuBLAS each precision is compared with (as gemmlib.bench.CUBLAS_PRECISION)
CUBLAS = {"fp16": "fp16", "bf16": "bf16", "tf32": "tf32", "3xtf32": "fp32"}
EPS32 = float(np.finfo(np.float32).eps)
FLT_MAX = float(np.finfo(np.float32).max)


# --------------------------------------------------------------------------- inputs

def _exact(x, rng, frac=1 / 3):
    """A fraction of the entries replaced by multiples of 1/64: exact in TF32, FP16 and
    BF16, so their 3xTF32 small parts are exactly 0 (the case that made Inf * 0)."""
    m = rng.random(x.shape) < frac
    x[m] = np.round(x[m] * 64) / 64
    return x


def issue(M, N, K, rng):
    A = _exact(rng.uniform(-1, 1, (M, K)), rng)
    B = _exact(rng.uniform(-1, 1, (K, N)), rng)
    A[M // 17, :] = np.nan                        # one NaN row of A
    B[:, N // 13] = np.inf                        # one +Inf column of B
    A[(M * 2) // 5, K // 5] = np.inf              # one +Inf entry of A
    B[(K * 9) // 16, (N * 5) // 7] = -np.inf      # one -Inf entry of B
    return A, B


def random_places(M, N, K, rng):
    A = _exact(rng.uniform(-1, 1, (M, K)), rng)
    B = _exact(rng.uniform(-1, 1, (K, N)), rng)
    A[rng.random((M, K)) < 0.1] = 0.0
    B[rng.random((K, N)) < 0.1] = 0.0
    for X, n in ((A, max(2, M // 20)), (B, max(2, N // 20))):
        for _ in range(n):
            X[rng.integers(X.shape[0]), rng.integers(X.shape[1])] = rng.choice(
                [np.nan, np.inf, -np.inf])
    return A, B


def edges(M, N, K, rng):
    A = _exact(rng.uniform(-1, 1, (M, K)), rng)
    B = _exact(rng.uniform(-1, 1, (K, N)), rng)
    A[0, K - 1] = np.inf                          # last real k: next to A's padded columns
    A[M - 1, K - 1] = -np.inf
    A[M // 2, 0] = np.nan                         # = A[M//2 - 1, K] in memory
    B[K - 1, N - 1] = np.inf                      # last real row and column of B
    B[K - 1, 0] = 0.0                             # Inf * 0 at C[0, 0]
    B[0, N - 1] = -np.inf
    B[K - 1, N // 2] = np.nan
    return A, B


def near_max(M, N, K, rng):
    """Finite products of |a| in [3.40199e38, FLT_MAX] and |b| <= 1/4, one per dot product."""
    A = rng.uniform(-1, 1, (M, K))
    B = rng.uniform(-0.25, 0.25, (K, N))
    top = np.uint32(0x7F7FF000) + rng.integers(0, 0x1000, M).astype(np.uint32)
    big = top.view(np.float32).astype(np.float64) * rng.choice([-1.0, 1.0], M)
    big[:3] = [FLT_MAX, -FLT_MAX, float(np.uint32(0x7F7FE000).view(np.float32))]
    A[np.arange(M), rng.integers(0, K, M)] = big
    B[:, 0] = 1.0                                  # C[:, 0] = a itself
    return A, B


def overflow(M, N, K, rng, scale=1e30, bscale=1e10):
    """Products of one sign that overflow fp32 (SGEMM: +-Inf), beside finite rows."""
    A = rng.uniform(-1, 1, (M, K))
    B = rng.uniform(-1, 1, (K, N))
    A[M // 3, :] = scale * rng.uniform(0.5, 1, K)          # positive row
    B[:, N // 4] = bscale * rng.uniform(0.5, 1, K)         # positive column
    B[:, N // 2] = -bscale * rng.uniform(0.5, 1, K)        # negative column
    return A, B


def overflow_huge(M, N, K, rng):
    return overflow(M, N, K, rng, scale=1e22, bscale=1e22)


def subnormal(M, N, K, rng):
    A = rng.uniform(-1, 1, (M, K))
    B = rng.uniform(-1, 1, (K, N))
    A[1, :] = 0.0
    A[1, K // 2] = 2.0 ** -130                     # a TF32 subnormal: exact
    A[2, :] = 0.0
    A[2, K // 2] = -(2.0 ** -140)                  # below 2^-137: rounds to 0 in TF32
    B[K // 2, 3] = np.inf
    B[K // 2, 4] = -np.inf
    return A, B


def payload_nan(M, N, K, rng):
    A = rng.uniform(-1, 1, (M, K)).astype(np.float32)
    B = rng.uniform(-1, 1, (K, N))
    A[5, 7] = np.uint32(0x7F800001).view(np.float32)    # NaN, payload in the low 13 bits
    A[6, 7] = np.uint32(0xFF800FFF).view(np.float32)
    return A, B


@dataclass(frozen=True)
class Case:
    name: str
    build: object
    shape: tuple
    seed: int = 0
    gate: bool = True
    precisions: tuple = PRECISIONS


F32 = ("tf32", "3xtf32")
CASES = (
    Case("issue", issue, (130, 140, 160)),
    *(Case(f"random-s{s}", random_places, shp, seed=s)
      for s, shp in enumerate([(257, 129, 96), (131, 67, 45), (64, 256, 512)])),
    Case("edges", edges, (129, 131, 67)),
    Case("edges", edges, (33, 9, 7), seed=1),
    Case("near-max", near_max, (96, 72, 40), precisions=("3xtf32",)),
    Case("near-max", near_max, (96, 72, 40), gate=False, precisions=("tf32",)),
    Case("overflow", overflow, (64, 48, 32), precisions=F32),
    Case("overflow-2^11", overflow_huge, (64, 48, 32), gate=False, precisions=F32),
    Case("decode", random_places, (8, 256, 512), seed=3),     # auto: the skinny rung (M <= 16)
    Case("subnormal", subnormal, (24, 8, 16), gate=False, precisions=F32),
    Case("payload-nan", payload_nan, (24, 16, 16), gate=False, precisions=F32),
)


def tf32_bits(x32):
    """float32 -> the TF32 the kernels compute with: cvt.rna.tf32.f32 as ptxas emits it
    (``|x| < Inf ? u + 0x1000 : u``, then the low 13 bits cleared)."""
    u = np.ascontiguousarray(x32, np.float32).view(np.uint32)
    fin = np.isfinite(x32)
    return np.where(fin, u + np.uint32(0x1000), u) & np.uint32(0xFFFFE000)


def host_inputs(precision, A64, B64):
    """(A, B) in the precision's input type (host) and the float64 values the reference
    multiplies: fp16/bf16 as stored, tf32 rounded to TF32, 3xtf32 the float32 values."""
    from gemmlib import precision as P

    with np.errstate(over="ignore", invalid="ignore"):
        if precision == "fp16":
            A, B = A64.astype(np.float16), B64.astype(np.float16)
            return A, B, A.astype(np.float64), B.astype(np.float64)
        A32 = A64 if A64.dtype == np.float32 else A64.astype(np.float32)
        B32 = B64 if B64.dtype == np.float32 else B64.astype(np.float32)
        if precision == "bf16":
            A, B = P.to_bf16(A32), P.to_bf16(B32)
            return A, B, A.astype(np.float32).astype(np.float64), B.astype(np.float32).astype(
                np.float64)
        if precision == "tf32":
            return (A32, B32, tf32_bits(A32).view(np.float32).astype(np.float64),
                    tf32_bits(B32).view(np.float32).astype(np.float64))
        return A32, B32, A32.astype(np.float64), B32.astype(np.float64)


def reference(A64, B64):
    """The float64 product rounded once to float32 (C's type: beyond FLT_MAX it is
    +-Inf, as in a correctly rounded fp32 GEMM), and |A| @ |B| over the finite entries
    (the error scale)."""
    with np.errstate(over="ignore", invalid="ignore"):
        ref = (A64 @ B64).astype(np.float32).astype(np.float64)
        scale = (np.abs(np.where(np.isfinite(A64), A64, 0.0))
                 @ np.abs(np.where(np.isfinite(B64), B64, 0.0)))
    return ref, scale


def bound(precision, K):
    """Allowed |C - C'| / (|A| @ |B|) between two products in ``precision``."""
    extra = {"tf32": 2.0 ** -10, "3xtf32": 2.0 ** -19}.get(precision, 0.0)
    return 4.0 * max(K, 1) * EPS32 + extra


def compare(C, R, scale, tol):
    """NaN/+Inf/-Inf counts of C and R, positions that differ, worst finite error."""
    C = np.asarray(C, np.float64)
    R = np.asarray(R, np.float64)
    out = {"counts": {}, "ref_counts": {}, "mismatch": {}, "examples": []}
    for what, f in (("nan", np.isnan), ("+inf", np.isposinf), ("-inf", np.isneginf)):
        a, b = f(C), f(R)
        out["counts"][what] = int(a.sum())
        out["ref_counts"][what] = int(b.sum())
        bad = np.argwhere(a != b)
        out["mismatch"][what] = int(len(bad))
        out["examples"] += [[int(i), int(j), repr(float(C[i, j])), repr(float(R[i, j]))]
                            for i, j in bad[:3]]
    fin = np.isfinite(C) & np.isfinite(R)
    with np.errstate(invalid="ignore", divide="ignore"):
        err = np.where(fin, np.abs(C - R) / np.maximum(scale, 1e-30), 0.0)
    out["finite_err"] = float(err.max()) if err.size else 0.0
    out["tol"] = tol
    out["ok"] = not any(out["mismatch"].values()) and out["finite_err"] <= tol
    return out


# --------------------------------------------------------------------------- GPU run

def kernels_for(precision, which):
    """Kernel names to run in ``precision``: 'auto' and/or rungs that exist in it here."""
    from gemmlib import backend, dispatch

    names = []
    for name in which:
        if name == "all":
            names += ["auto", "mma_atom", "mma_swizzle", "mma_pipeline", "wgmma_async",
                      "wgmma_tma", "wgmma_ws"]
        else:
            names.append(name)
    out = []
    for name in dict.fromkeys(names):
        if name == "auto":
            out.append(name)
            continue
        try:
            spec = dispatch.get_spec(name, precision)
        except ValueError:                     # e.g. wgmma in tf32
            continue
        if tuple(backend.device_info().compute_capability) < tuple(spec.min_cc):
            continue
        if name.startswith("wgmma") and tuple(backend.device_info().compute_capability) != (9, 0):
            continue
        out.append(name)
    return out


def run_case(case, precision, kernel, xp):
    import gemmlib
    from gemmlib import backend

    M, N, K = case.shape
    rng = np.random.default_rng(1000 + case.seed)
    A64, B64 = case.build(M, N, K, rng)
    A, B, Ar, Br = host_inputs(precision, A64, B64)
    ref, scale = reference(Ar, Br)
    dev = (lambda x: type(x)(xp.asarray(x.bits))) if precision == "bf16" else xp.asarray
    Ad, Bd = dev(A), dev(B)
    Cb = xp.full((M, N), np.nan, np.float32)
    backend.cublas_gemm(Ad, Bd, Cb, CUBLAS[precision])
    C = gemmlib.matmul(Ad, Bd, precision=precision, out_dtype=np.float32,  # cuBLAS's C type
                       kernel=None if kernel == "auto" else kernel)
    C, Cb = backend.to_host(C), backend.to_host(Cb)
    tol = bound(precision, K)
    row = {"precision": precision, "kernel": kernel, "case": case.name, "shape": [M, N, K],
           "gate": case.gate, "vs_cublas": compare(C, Cb, scale, tol),
           "vs_fp64": compare(C, ref, scale, tol),
           "cublas_vs_fp64": compare(Cb, ref, scale, tol)}
    row["ok"] = row["vs_cublas"]["ok"]
    return row


def run_checks(precisions=PRECISIONS, kernels=("auto", "mma_pipeline"), cases=CASES,
               progress=True):
    from gemmlib import backend

    xp = backend.array_module()
    rows = []
    for precision in precisions:
        for kernel in kernels_for(precision, kernels):
            for case in cases:
                if precision not in case.precisions:
                    continue
                try:
                    row = run_case(case, precision, kernel, xp)
                except Exception as e:  # noqa: BLE001  (a crash is a finding, not the end)
                    row = {"precision": precision, "kernel": kernel, "case": case.name,
                           "shape": list(case.shape), "gate": case.gate, "ok": False,
                           "error": f"{type(e).__name__}: {e}"[:500]}
                rows.append(row)
                if progress:
                    print(format_row(row), flush=True)
    return rows


def _cnt(c):
    return f"{c['nan']:>4}/{c['+inf']:>4}/{c['-inf']:>4}"


def format_row(r):
    head = (f"{r['precision']:>6} {r['kernel']:<13} {r['case']:<14} "
            f"{'x'.join(map(str, r['shape'])):<12}")
    if "error" in r:
        return f"{head} ERROR {r['error']}"
    v = r["vs_cublas"]
    status = "ok" if r["ok"] else ("MISMATCH" if r["gate"] else "differs (ungated)")
    return (f"{head} {_cnt(v['counts'])}  {_cnt(v['ref_counts'])}  "
            f"{sum(v['mismatch'].values()):>5}  {v['finite_err']:.1e}  "
            f"{'=' if r['vs_fp64']['ok'] else '!'}{'=' if r['cublas_vs_fp64']['ok'] else '!'}"
            f"  {status}")


HEADER = (f"{'prec':>6} {'kernel':<13} {'case':<14} {'shape':<12} "
          f"{'gemmlib NaN/+Inf/-Inf':<15}  {'cuBLAS':<14}  {'diff':>5}  {'fin.err':<7}  "
          f"fp64  status\n"
          "(diff: positions whose class differs from cuBLAS; fp64: '=' when gemmlib, then "
          "cuBLAS, match the float64 product of the same rounded inputs)")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", help="JSON file to write")
    p.add_argument("--precisions", default=",".join(PRECISIONS))
    p.add_argument("--kernels", default="auto,mma_pipeline",
                   help="comma-separated: auto, rung names, or all")
    p.add_argument("--bench", action="store_true",
                   help="afterwards, 3xtf32 vs SGEMM at 4096^3 and 8192^3 (kernel timing)")
    args = p.parse_args(argv)
    from gemmlib import backend

    if backend.SIMULATOR:
        print("needs a GPU: run with NUMBA_ENABLE_CUDASIM=0", file=sys.stderr)
        return 2
    info = backend.device_info()
    print(f"{info.name} (sm_{info.compute_capability[0]}{info.compute_capability[1]})")
    print(HEADER)
    t0 = time.time()
    rows = run_checks(args.precisions.split(","), args.kernels.split(","))
    bad = [r for r in rows if r["gate"] and not r["ok"]]
    result = {"gpu": info.name, "cc": list(info.compute_capability),
              "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "seconds": round(time.time() - t0, 1), "ok": not bad, "rows": rows}
    if args.bench:
        from gemmlib import bench

        res = bench.benchmark_precisions(("3xtf32",), [(4096,) * 3, (8192,) * 3],
                                         timing="kernel", reps=20)
        result["bench"] = res.to_json()["rows"]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"{len(rows)} checks, {len(bad)} gated mismatch(es); wrote {args.out}")
    return 1 if bad else 0


if __name__ == "__main__":
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "0")
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
