"""One GPU session for the register-tiling rungs: verify, inspect, tune, time.

Run on a GPU machine from the repository root (the simulator must be off):

    NUMBA_ENABLE_CUDASIM=0 python results/tuning/ladder_gpu.py [--steps verify,resources,bench,tune,sweep]
        [--out DIR] [--tune-budget SECONDS] [--tune-limit N]

* verify: every rung on odd shapes (1x1x1 .. 4095x3073x2047), on K and N not
  multiples of 4, and on a matrix whose base pointer is not 16-byte aligned
  (the scalar fallback paths);
* resources: registers/thread, local (spill) bytes/thread and shared bytes/
  block of each compiled rung;
* bench: each rung vs cuBLAS (TF32 off) at 4096^3, CUDA events, median;
* tune: gemmlib.autotune on the warptile rung at 4096^3 (and smaller classes
  with the top few), tuning file written to DIR/tuning/<gpu-slug>.json;
* sweep: default and tuned warptile vs cuBLAS over 1024..8192 and 4095x3073x2047.

Everything printed is also written to DIR/ladder-gpu.log and DIR/ladder-gpu.json.
The first session's runs are nvidia-h200-ladder-run2.log and -run3.log, beside this script.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "0")

import numpy as np  # noqa: E402

import gemmlib  # noqa: E402
from gemmlib import autotune, backend, banks  # noqa: E402
from gemmlib import get_kernel as get  # noqa: E402  (a rung name or "auto")

RUNGS = ["blocktile_1d", "blocktile_2d", "vectorized", "bank_free", "warptile"]
ODD = [(1, 1, 1), (37, 29, 53), (129, 127, 3), (131, 257, 67), (64, 64, 64), (1000, 1001, 999),
       (4095, 3073, 2047), (2048, 2048, 2048), (17, 4100, 33)]
SWEEP = [(1024, 1024, 1024), (2048, 2048, 2048), (4096, 4096, 4096), (8192, 8192, 8192),
         (4095, 3073, 2047)]

LOG: list[str] = []
DATA: dict = {}


def say(*a):
    line = " ".join(str(x) for x in a)
    print(line, flush=True)
    LOG.append(line)


def misaligned(shape, rng):
    """A C-contiguous float32 matrix whose data pointer is 4 bytes past a 16-byte boundary."""
    cp = backend.array_module()
    n = shape[0] * shape[1]
    buf = cp.asarray(rng.uniform(-1, 1, n + 1).astype(np.float32))
    return buf[1:].reshape(shape)


def step_verify():
    rng = np.random.default_rng(0)
    cp = backend.array_module()
    res = {}
    for name in RUNGS:
        t0 = time.perf_counter()
        rep = gemmlib.verify(name, ODD, seed=1, raise_on_failure=False)
        bad = [str(c) for c in rep.failures]
        # scalar fallbacks: misaligned A, B and C pointers
        M, N, K = 67, 45, 36
        A, B = misaligned((M, K), rng), misaligned((K, N), rng)
        C = misaligned((M, N), rng)
        C.fill(cp.nan)
        gemmlib.matmul(A, B, out=C, kernel=name)
        err = backend.relative_error(C, backend.reference(A, B))
        ok_mis = bool(err <= 1e-5)
        res[name] = {"ok": rep.ok and ok_mis, "failures": bad, "misaligned_rel_err": err,
                     "max_rel_err": max(c.rel_error for c in rep.checks)}
        say(f"verify {name:>14}: {'ok' if rep.ok else 'FAIL'} on {len(ODD)} shapes "
            f"(max rel.err {res[name]['max_rel_err']:.1e}); misaligned pointers "
            f"{'ok' if ok_mis else 'FAIL'} ({err:.1e}); {time.perf_counter() - t0:.1f}s")
        for b in bad:
            say("   ", b)
    DATA["verify"] = res


def step_resources():
    res = {}
    for name in RUNGS + ["auto"]:
        spec = get(name)
        A = backend.random_matrix((64, 64))
        gemmlib.matmul(A, A, kernel=spec)  # compile
        r = autotune.compiled_resources(spec)
        r.update(threads=spec.threads, tile=list(spec.tile), params=dict(spec.params),
                 declared_shared=spec.shared_bytes)
        res[name] = r
        say(f"resources {name:>14} ({spec.name}): {r['registers']} regs/thread, "
            f"{r['local_bytes']} B local/thread, {r['shared_bytes']} B shared/block, "
            f"{spec.threads} threads")
    DATA["resources"] = res


def _time(spec, M, N, K, reps=15):
    cp = backend.array_module()
    A = backend.random_matrix((M, K), rng=3)
    B = backend.random_matrix((K, N), rng=4)
    C = cp.empty((M, N), dtype=np.float32)
    cub = autotune.time_spec_cublas(A, B, C, reps)
    C.fill(cp.nan)
    gemmlib.matmul(A, B, out=C, kernel=spec)
    err = backend.relative_error(C, backend.reference(A, B))
    ms = autotune.time_spec(spec, A, B, C, reps)
    return ms, cub, err


def step_bench(shapes=((4096, 4096, 4096),), names=None):
    out = DATA.setdefault("bench", [])
    for (M, N, K) in shapes:
        for name in names or RUNGS + ["auto"]:
            spec = get(name) if isinstance(name, str) else name
            ms, cub, err = _time(spec, M, N, K)
            row = dict(kernel=name if isinstance(name, str) else spec.name, spec=spec.name,
                       M=M, N=N, K=K, ms=ms, tflops=2e-9 * M * N * K / ms,
                       cublas_ms=cub, cublas_tflops=2e-9 * M * N * K / cub,
                       pct=100 * cub / ms, rel_err=err)
            out.append(row)
            say(f"bench {row['kernel']:>14} {M}x{N}x{K}: {ms:8.3f} ms {row['tflops']:6.2f} TFLOP/s"
                f"  cuBLAS {row['cublas_tflops']:6.2f}  -> {row['pct']:5.1f}%  err {err:.1e}")


VARIANTS = [  # the bank-conflict fixes one at a time (all BK=16, 128 registers)
    ("vectorized", {"SPLIT": True}), ("vectorized", {"SWIZZLE": True}),
    ("vectorized", {"BK": 8}), ("bank_free", {"BK": 8, "PAD": 4, "SWIZZLE": False}),
    ("blocktile_2d", {"CONTIGUOUS": True}), ("blocktile_2d", {"max_registers": None}),
]


def step_variants():
    """Rung parameter variants at 4096^3 (to choose each rung's default)."""
    for mod, params in VARIANTS:
        spec = autotune.build(mod, params)
        A = backend.random_matrix((64, 64))
        gemmlib.matmul(A, A, kernel=spec)
        r = autotune.compiled_resources(spec)
        say(f"variant {spec.name}: {r['registers']} regs, {r['local_bytes']} B local")
        step_bench([(4096, 4096, 4096)], [spec])


SMALL_TILES = [
    dict(BM=64, BN=64, BK=16, WM=32, WN=32, WNITER=1, TM=4, TN=8, PAD=4),
    dict(BM=64, BN=64, BK=16, WM=32, WN=32, WNITER=1, TM=4, TN=8, PAD=4, max_registers=128),
    dict(BM=64, BN=128, BK=16, WM=32, WN=64, WNITER=2, TM=8, TN=4, PAD=4, max_registers=168),
    dict(BM=128, BN=64, BK=16, WM=64, WN=32, WNITER=1, TM=8, TN=8, PAD=4),
]


def step_tune(out_dir: Path, budget: float, limit: int):
    path = out_dir / "tuning" / f"{autotune.gpu_slug()}.json"
    say(f"tune warptile at 4096^3 (limit {limit}, budget {budget:.0f}s) -> {path}")
    cands = autotune.default_candidates(limit=limit, register_caps=True)
    r = autotune.tune((4096, 4096, 4096), candidates=cands, limit=len(cands),
                      time_budget_s=budget, path=path, log=say)
    say(r.table())
    DATA.setdefault("tune", []).append(autotune.trials_json(r))
    best = sorted((t for t in r.trials if t.status == "timed"), key=lambda t: t.ms)[:5]
    for shape in ((8192, 8192, 8192), (4095, 3073, 2047), (2048, 2048, 2048),
                  (1024, 1024, 1024)):
        cands = [t.params for t in best] + [p for p in SMALL_TILES if shape[0] < 8192]
        say(f"tune warptile at {shape} ({len(cands)} candidates: top {len(best)} of 4096^3 "
            f"and smaller tiles)")
        r2 = autotune.tune(shape, candidates=cands, limit=len(cands), path=path, log=say)
        DATA["tune"].append(autotune.trials_json(r2))
    # use the file just written for kernel="auto" in the later steps
    os.environ["GEMMLIB_CACHE"] = str(out_dir)
    say(json.dumps(json.loads(path.read_text()), indent=1))


def step_retune(out_dir: Path):
    """Re-tune each shape class on a short list: the committed choices plus the classics."""
    path = out_dir / "tuning" / f"{autotune.gpu_slug()}.json"
    committed = json.loads((autotune.REPO_TUNING_DIR / f"{autotune.gpu_slug()}.json")
                           .read_text())["kernels"]["warptile"]
    base = [e["params"] for e in committed.values()]
    base += [p for p in autotune.CLASSICS["warptile"][:3] if p not in base]
    base = [dict(p) for i, p in enumerate(base) if p not in base[:i]]
    for shape in ((4096, 4096, 4096), (8192, 8192, 8192), (4095, 3073, 2047),
                  (2048, 2048, 2048), (1024, 1024, 1024)):
        say(f"retune warptile at {shape}: {len(base)} candidates")
        r = autotune.tune(shape, candidates=base, limit=len(base), path=path, log=say)
        DATA.setdefault("tune", []).append(autotune.trials_json(r))
    os.environ["GEMMLIB_CACHE"] = str(out_dir)
    say(json.dumps(json.loads(path.read_text()), indent=1))


def step_sweep():
    specs = [get("warptile"), autotune.select(4096, 4096, 4096)]
    for (M, N, K) in SWEEP:
        tuned = autotune.select(M, N, K)
        names = [get("warptile")] + ([tuned] if tuned.name != "warptile" else [])
        step_bench([(M, N, K)], names)
    del specs


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", default="verify,resources,bench,tune,sweep")
    p.add_argument("--out", default=os.environ.get("OUT", "gpu-out"))
    p.add_argument("--tune-budget", type=float, default=90)
    p.add_argument("--tune-limit", type=int, default=12)
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dev = backend.device_info()
    from importlib.metadata import version

    say(f"GPU {dev.name} sm_{dev.compute_capability[0]}{dev.compute_capability[1]} "
        f"{dev.sm_count} SMs; numba-cuda {version('numba-cuda')}")
    DATA["gpu"] = dev.name
    for name in ["vectorized", "bank_free", "warptile"]:
        say(banks.report(get(name)))
    t0 = time.perf_counter()
    try:
        for step in args.steps.split(","):
            say(f"=== {step} (t={time.perf_counter() - t0:.0f}s)")
            if step == "verify":
                step_verify()
            elif step == "resources":
                step_resources()
            elif step == "bench":
                step_bench()
            elif step == "tune":
                step_tune(out, args.tune_budget, args.tune_limit)
            elif step == "sweep":
                step_sweep()
            elif step == "variants":
                step_variants()
            elif step == "retune":
                step_retune(out)
    finally:
        (out / "ladder-gpu.log").write_text("\n".join(LOG) + "\n")
        (out / "ladder-gpu.json").write_text(json.dumps(DATA, indent=1, default=str) + "\n")
        say(f"done in {time.perf_counter() - t0:.0f}s")


if __name__ == "__main__":
    main()
