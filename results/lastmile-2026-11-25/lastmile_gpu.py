"""Issue 19's last-mile rungs on one GPU: ``python3 lastmile_gpu.py STEP OUT.json [VARIANTS]``.

``verify``: gemmlib.verify of each variant on odd and large shapes (fp16 and bf16).
``time``:   each variant, ``auto`` and ``auto16`` (``out_dtype`` the inputs' 16-bit type) as loops of ``gemmlib.matmul`` calls on torch
            tensors, against torch.matmul (cuBLAS, fp16/bf16 out) and cuBLAS writing float32
            as gemmlib does, in the same process (``gemmlib.bench_models``: CUDA events
            around back-to-back calls, operand sets rotated past 3x L2, median of 5 loops).

VARIANTS: ``label=module:key=value,key=value;label2=...`` (default: the rungs' defaults).
"""
import json
import statistics
import sys
import time

import numpy as np

import gemmlib
from gemmlib import backend, bench, bench_models as BM, dispatch
from gemmlib.kernels import module

DEFAULT = "ws=wgmma_ws;cluster=wgmma_cluster"
SQUARES = [(4096,) * 3, (2048,) * 3, (8192,) * 3]   # 4096 first: it warms the GPU
MODELS = [(4096, 6144, 4096), (4096, 28672, 4096), (4096, 4096, 14336), (16384, 4096, 4096)]


def variants(text, precision):
    out = {}
    for item in filter(None, text.split(";")):
        label, _, rest = item.partition("=")
        mod, _, kw = rest.partition(":")
        params = {}
        for pair in filter(None, kw.split(",")):
            k, _, v = pair.partition("=")
            params[k] = eval(v)  # noqa: S307 - our own command line
        out[label] = module(mod).build(precision, **params)
    return out


def verify(out, text):
    res = []
    shapes = [(1, 8, 8), (129, 255, 3), (300, 130, 200), (77, 1000, 33), (1025, 513, 4097),
              (4095, 3073, 2047), (2048, 2048, 2048), (3, 8191, 5), (257, 4096, 4096)]
    for prec in ("fp16", "bf16"):
        for label, spec in variants(text, prec).items():
            t = time.time()
            r = gemmlib.verify(spec, shapes, raise_on_failure=False)
            print(prec, label, spec.name, r, f"({time.time() - t:.1f} s)", flush=True)
            res += [dict(precision=prec, variant=label, kernel=spec.name, shape=c.shape,
                         rel_error=c.rel_error, tol=c.tolerance, ok=c.ok, unwritten=c.unwritten)
                    for c in r.checks]
    json.dump(dict(meta=bench.environment(), verify=res), open(out, "w"), indent=1, default=str)


def time_rows(out, text):
    fw = BM.framework("torch")
    rows = []
    for prec in ("fp16", "bf16"):
        specs = variants(text, prec)
        for M, N, K in SQUARES + MODELS:
            A, B = fw.operands(prec, M, N, K, 0)
            sets = BM._sets(2 * (M * K + K * N), backend.device_info().l2_bytes)
            pairs = [(A, B)] + [(fw.copy(A), fw.copy(B)) for _ in range(sets - 1)]
            theirs = [fw.reference_call(a, b) for a, b in pairs]
            cp = backend.array_module()
            Cf = cp.empty((M, N), dtype=np.float32)
            blas = [lambda a=fw.as_cupy(a), b=fw.as_cupy(b): backend.cublas_gemm(a, b, Cf, prec)
                    for a, b in pairs]
            calls = {"auto": [(lambda a=a, b=b: gemmlib.matmul(a, b)) for a, b in pairs],
                     # the 16-bit output torch.matmul writes (out_dtype: the inputs' own type)
                     "auto16": [(lambda a=a, b=b: gemmlib.matmul(a, b, out_dtype=a.dtype))
                                for a, b in pairs]}
            for label, spec in specs.items():
                calls[label] = [(lambda a=a, b=b, s=spec: gemmlib.matmul(a, b, kernel=s))
                                for a, b in pairs]
            errs = {}
            for label, fns in calls.items():
                C = fns[0]()
                fw.synchronize()
                errs[label] = fw.rel_error(C, A, B, 256)
                del C
            probe = BM.loop_time(fw, theirs, 2, 1)[0]
            per = int(min(200, max(3, 25.0 / max(probe, 1e-3))))
            # interleave: reference, each kernel, reference again -- drift shows
            t_ref = BM.loop_time(fw, theirs, per, 5)
            t_blas = BM.loop_time(BM._CuPy(), blas, per, 5)
            times = {label: BM.loop_time(fw, fns, per, 5) for label, fns in calls.items()}
            t_ref2 = BM.loop_time(fw, theirs, per, 5)
            ref = statistics.median(t_ref + t_ref2)
            blas_ms = statistics.median(t_blas)
            flops = 2.0 * M * N * K
            for label, ts in times.items():
                ms = statistics.median(ts)
                name = (dispatch.select_tc(prec, M, N, K).name if label == "auto"
                        else dispatch.select_tc(prec, M, N, K, out=prec).name
                        if label == "auto16" else specs[label].name)
                row = dict(precision=prec, M=M, N=N, K=K, variant=label, kernel=name,
                           median_ms=ms, loop_ms=ts, torch_ms=ref, torch_loop_ms=t_ref + t_ref2,
                           cublas_fp32_ms=blas_ms, tflops=flops / ms / 1e9,
                           pct_of_torch=100 * ref / ms, pct_of_cublas_fp32=100 * blas_ms / ms,
                           rel_error=errs[label], calls_per_loop=per, operand_sets=sets)
                rows.append(row)
                print(f"{prec} {M}x{N}x{K} {label:10s} {name:34s} {ms * 1e3:8.1f} us "
                      f"{row['tflops']:6.0f} TF/s {row['pct_of_torch']:6.1f}% torch "
                      f"{row['pct_of_cublas_fp32']:6.1f}% cublas-f32 err {errs[label]:.1e}",
                      flush=True)
            del pairs, theirs, blas, calls, Cf, A, B
            fw.synchronize()
            cp.get_default_memory_pool().free_all_blocks()
            json.dump(dict(meta=bench.environment(), rows=rows), open(out, "w"), indent=1,
                      default=str)


if __name__ == "__main__":
    step, out = sys.argv[1], sys.argv[2]
    text = sys.argv[3] if len(sys.argv) > 3 else DEFAULT
    {"verify": verify, "time": time_rows}[step](out, text)
