"""Does the way PTX becomes machine code matter for the Hopper rungs?

numba-cuda links a kernel's PTX through nvJitLink, which assembles it as a
relocatable unit (``ptxas -c``).  Offline, ptxas then reports for the wgmma
rungs (C7504) 'setmaxnreg' ignored and (C7509) wgmma.mma_async serialized
"due to the presence of Extern calls"; assembled as a whole program it
reports neither.  This script times the same PTX three ways on the GPU:

  numba    the cubin numba-cuda builds (what gemmlib ships today)
  ptxas    the ptxas of the machine's CUDA toolkit, whole program
  driver   the PTX handed to cuModuleLoadData (the driver's JIT, whole program)

    python3 results/wholeprogram-2026-11-25/wholeprogram_gpu.py OUT.json
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))   # the repository

from gemmlib import backend, bench, dispatch, ptx
from gemmlib.kernels import wgmma_split_k, wgmma_ws

CASES = [  # (label, builder, shapes)
    ("wgmma_ws fp16", lambda: wgmma_ws.build("fp16"), [(4096,) * 3, (8192,) * 3, (2048,) * 3]),
    ("wgmma_ws bf16", lambda: wgmma_ws.build("bf16"), [(4096,) * 3]),
    ("wgmma_split_k 64 fp16", lambda: wgmma_split_k.build("fp16", BM=64),
     [(16, 4096, 4096), (128, 4096, 4096), (16, 4096, 14336)]),
    ("wgmma_split_k 128 fp16", lambda: wgmma_split_k.build("fp16"), [(1024, 1024, 8192)]),
]


def ptx_of(spec) -> tuple[str, str]:
    """numba's PTX of ``spec`` for sm_90a and its entry name (compiling if not yet)."""
    c = dispatch.compiled_spec(spec)
    k = spec.kernel.compile(ptx.signature(spec))     # the overload compiled_spec used, or new
    return k._codelibrary.get_asm_str(cc=(9, 0, "a")), c.entry


def ptxas_cubin(ptx: str, log: list) -> bytes | None:
    exe = shutil.which("ptxas") or "/usr/local/cuda/bin/ptxas"
    if not Path(exe).exists():
        log.append("no ptxas")
        return None
    with tempfile.TemporaryDirectory() as d:
        src, out = Path(d) / "k.ptx", Path(d) / "k.cubin"
        for attempt in range(2):
            src.write_text(ptx)
            r = subprocess.run([exe, "-arch=sm_90a", "-O3", "-v", str(src), "-o", str(out)],
                               capture_output=True, text=True)
            log.append(r.stdout[-1500:] + r.stderr[-1500:])
            m = re.search(r"current version is '(\d+\.\d+)'", r.stderr)
            if r.returncode == 0:
                return out.read_bytes()
            if m and attempt == 0:   # an older toolkit: the same PTX under its ISA version
                ptx = re.sub(r"^\.version \d+\.\d+", f".version {m.group(1)}", ptx, flags=re.M)
                continue
            return None


def driver_ptx(ptx: str) -> bytes:
    import ctypes
    ver = ctypes.c_int()
    ctypes.CDLL("libcuda.so.1").cuDriverGetVersion(ctypes.byref(ver))
    major, minor = ver.value // 1000, (ver.value % 1000) // 10
    isa = {12: f"8.{minor}", 13: f"9.{minor}"}.get(major)
    if isa:
        ptx = re.sub(r"^\.version \d+\.\d+", f".version {isa}", ptx, flags=re.M)
    return ptx.encode() + b"\0"


def main(path):
    import cupy as cp

    out = dict(meta=bench.environment(), rows=[], logs={})
    for label, build, shapes in CASES:
        base = build()
        code, entry = ptx_of(base)
        log: list = []
        variants = {"numba": dispatch.compiled_spec(base).cubin,
                    "ptxas": ptxas_cubin(code, log), "driver": driver_ptx(code)}
        out["logs"][label] = log
        print(label, "ptxas log:", " | ".join(l.strip().replace("\n", " / ")[-600:] for l in log),
              flush=True)
        for M, N, K in shapes:
            prec = base.precision
            A, B = bench.precision_operands(prec, M, N, K, 0)
            a, b = getattr(A, "bits", A), getattr(B, "bits", B)
            C = cp.empty((M, N), dtype=np.float32)
            cub = bench.time_fn(lambda: backend.cublas_gemm(A, B, C, prec), 20, 3)
            ref = C.copy()
            for name, cubin in variants.items():
                if cubin is None:
                    continue
                spec = build()                            # a fresh kernel object per variant
                comp = dispatch.Compiled(cubin, entry)
                comp.kernel = spec.kernel
                dispatch._COMPILED[id(spec.kernel)] = comp
                try:
                    p = dispatch.warm(spec, M, N, K)
                    C.fill(np.nan)
                    run = lambda: dispatch.run(p, a.data.ptr, b.data.ptr, C.data.ptr,
                                               cp.cuda.get_current_stream().ptr)
                    run()
                    cp.cuda.runtime.deviceSynchronize()
                    err = float(cp.linalg.norm(C - ref) / cp.linalg.norm(ref))
                    t = bench.time_fn(run, 20, 3)
                    row = dict(case=label, variant=name, M=M, N=N, K=K, median_ms=t.median,
                               cublas_ms=cub.median, pct_of_cublas=100 * cub.median / t.median,
                               tflops=2 * M * N * K / t.median / 1e9, err_vs_cublas=err,
                               registers=comp.registers)
                except Exception as e:
                    row = dict(case=label, variant=name, M=M, N=N, K=K,
                               error=f"{type(e).__name__}: {str(e)[:300]}")
                out["rows"].append(row)
                print(json.dumps(row), flush=True)
            del A, B, C, ref
    json.dump(out, open(path, "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
