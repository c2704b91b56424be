"""The first call of a Hopper rung in a fresh process with an empty kernel cache (compile,
link, load, run): ``GEMMLIB_CACHE=$(mktemp -d) python3 cold_compile_gpu.py RUNG [PRECISION]``.
Prints one JSON line: seconds of the first call, and of the second (cached in memory)."""
import json
import sys
import time

t0 = time.perf_counter()
import cupy as cp  # noqa: E402

import gemmlib  # noqa: E402
from gemmlib import backend  # noqa: E402

rung = sys.argv[1]
prec = sys.argv[2] if len(sys.argv) > 2 else "fp16"
t_import = time.perf_counter() - t0
n = 1024
if prec in ("fp16", "bf16"):
    A = backend.random_matrix((n, n), "bfloat16" if prec == "bf16" else "float16", None)
    B = backend.random_matrix((n, n), "bfloat16" if prec == "bf16" else "float16", None)
    kw = {}
else:
    A, B = cp.random.rand(n, n, dtype=cp.float32), cp.random.rand(n, n, dtype=cp.float32)
    kw = {"precision": prec}
t = time.perf_counter()
gemmlib.matmul(A, B, kernel=rung, **kw)
cp.cuda.Device().synchronize()
first = time.perf_counter() - t
t = time.perf_counter()
gemmlib.matmul(A, B, kernel=rung, **kw)
cp.cuda.Device().synchronize()
print(json.dumps(dict(rung=rung, precision=prec, import_s=t_import, first_call_s=first,
                      second_call_s=time.perf_counter() - t)), flush=True)
