"""Why a loop of gemmlib.matmul(out_dtype=bf16) at 2048^3 slowed down in its 2nd and 3rd
blocks (steady-fixed-h100.json): count the TMA-map keys (gemmlib.tma._KEPT), their
generations (a full set of MAX_KEPT forces a device sync) and the distinct output addresses
over a loop of calls on rotating operand sets, and the host microseconds per call.

``python3 mapdiag_gpu.py OUT.json``
"""
import json
import statistics
import sys
import time

import torch

import gemmlib
from gemmlib import backend, bench_models as BM, tma

fw = BM.framework("torch")
rows = []
for prec, td in (("fp16", torch.float16), ("bf16", torch.bfloat16)):
    for n in (2048, 4096):
        A, B = fw.operands(prec, n, n, n, 0)
        sets = BM._sets(2 * (2 * n * n), backend.device_info().l2_bytes)
        pairs = [(A, B)] + [(A.clone(), B.clone()) for _ in range(sets - 1)]
        for label, kw in (("auto_o16", dict(out_dtype=td)), ("auto_fp32", {})):
            gen0, kept0 = tma.GENERATION, len(tma._KEPT)
            ptrs = set()
            ts = []
            torch.cuda.synchronize()
            for i in range(6000):
                a, b = pairs[i % len(pairs)]
                t = time.perf_counter()
                C = gemmlib.matmul(a, b, **kw)
                ts.append(time.perf_counter() - t)
                ptrs.add(C.data_ptr())
                del C
            torch.cuda.synchronize()
            row = dict(precision=prec, n=n, label=label, sets=len(pairs),
                       distinct_c=len(ptrs), kept_before=kept0, kept_after=len(tma._KEPT),
                       generations=tma.GENERATION - gen0,
                       host_us_median=statistics.median(ts) * 1e6,
                       host_us_p90=sorted(ts)[int(0.9 * len(ts))] * 1e6,
                       host_us_by_thousand=[statistics.median(ts[k:k + 1000]) * 1e6
                                            for k in range(0, 6000, 1000)])
            rows.append(row)
            print(json.dumps(row), flush=True)
        del pairs, A, B
        torch.cuda.empty_cache()
json.dump(rows, open(sys.argv[1], "w"), indent=1)
