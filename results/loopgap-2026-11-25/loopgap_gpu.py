"""Where does a loop of gemmlib.matmul calls lose time against the kernel alone?

``python3 loopgap_gpu.py OUT.json [SIZES]`` (GPU only; SIZES like ``4096,8192,2048``).

For fp16 (then bf16) squares, each of these timed four ways over the same rotating operand
sets (past 3x L2):

* ``torch``   torch.matmul (cuBLAS, fp16 out)
* ``auto16``  gemmlib.matmul(a, b, out_dtype=a.dtype)
* ``auto``    gemmlib.matmul(a, b) (float32 out)
* ``raw16``   dispatch.run of auto16's plan on preallocated outputs (no Python call path)

Timings: ``single`` (bench.time_fn: one launch between events, L2 flushed before each),
``loop`` (events around back-to-back calls, ~25 ms, median of 5: the benchmark's method),
``long`` (one 1.5 s loop), ``gaps`` (an event after every call of a loop: per-call spans).
During every loop, nvidia-smi samples the SM clock, power and throttle reasons every 20 ms;
each row gets the samples that fall inside its loops.
"""
import datetime
import json
import os
import statistics
import subprocess
import sys
import time

import cupy as cp
import numpy as np
import torch

import gemmlib
from gemmlib import backend, bench, bench_models as BM, dispatch

out = sys.argv[1]
sizes = [int(s) for s in (sys.argv[2] if len(sys.argv) > 2 else "4096,8192,2048").split(",")]
smi_log = os.path.splitext(out)[0] + "-smi.csv"
smi = subprocess.Popen(
    ["nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,"
     "clocks_event_reasons.active", "--format=csv,noheader,nounits", "-lms", "20"],
    stdout=open(smi_log, "w"), stderr=subprocess.STDOUT)
time.sleep(1.0)


def samples(t0, t1):
    rows = []
    for line in open(smi_log):
        f = [x.strip() for x in line.split(",")]
        try:
            ts = datetime.datetime.strptime(f[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
            if t0 <= ts <= t1:
                rows.append((float(f[1]), float(f[2]), float(f[3]), f[4]))
        except (ValueError, IndexError):
            continue
    return rows


def summary(rows):
    if not rows:
        return {}
    return dict(n=len(rows), sm_mhz=statistics.median(r[0] for r in rows),
                sm_mhz_min=min(r[0] for r in rows), power_w=statistics.median(r[1] for r in rows),
                power_w_max=max(r[1] for r in rows), temp_c=max(r[2] for r in rows),
                reasons=sorted({r[3] for r in rows}))


def loop(fns, per, loops):
    t0 = time.time()
    ts = BM.loop_time(fw, fns, per, loops)
    t1 = time.time()
    return ts, (t0, t1)


def gaps(fns, per):
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(per + 1)]
    torch.cuda.synchronize()
    ev[0].record()
    for i in range(per):
        fns[i % len(fns)]()
        ev[i + 1].record()
    ev[-1].synchronize()
    return [ev[i].elapsed_time(ev[i + 1]) for i in range(per)]


fw = BM.framework("torch")
res = {"meta": bench.environment(), "rows": []}
time.sleep(1.5)   # let the smi log start
for prec in ("fp16", "bf16"):
    for n in sizes:
        A, B = fw.operands(prec, n, n, n, 0)
        sets = BM._sets(2 * 2 * n * n, backend.device_info().l2_bytes)
        pairs = [(A, B)] + [(A.clone(), B.clone()) for _ in range(sets - 1)]
        tdt = A.dtype
        spec16 = dispatch.select_tc(prec, n, n, n, out=prec)
        p16 = dispatch.warm(spec16, n, n, n)
        bd = dispatch.bound(p16)
        outs = [torch.empty((n, n), dtype=tdt, device="cuda") for _ in pairs]
        h = torch.cuda.current_stream().cuda_stream
        calls = {
            "torch": [(lambda a=a, b=b: torch.matmul(a, b)) for a, b in pairs],
            "auto16": [(lambda a=a, b=b: gemmlib.matmul(a, b, out_dtype=tdt)) for a, b in pairs],
            "auto": [(lambda a=a, b=b: gemmlib.matmul(a, b)) for a, b in pairs],
            "raw16": [(lambda a=a, b=b, c=c: dispatch.run(p16, a.data_ptr(), b.data_ptr(),
                                                          c.data_ptr(), h, bd))
                      for (a, b), c in zip(pairs, outs)],
        }
        for fns in calls.values():
            fns[0]()
        torch.cuda.synchronize()
        probe = BM.loop_time(fw, calls["torch"], 3, 1)[0]
        per = int(min(400, max(5, 25.0 / max(probe, 1e-3))))
        per_long = int(min(20000, max(20, 1500.0 / max(probe, 1e-3))))
        for label, fns in calls.items():
            single = bench.time_fn(fns[0], 30, 3)
            t_loop, w_loop = loop(fns, per, 5)
            t_long, w_long = loop(fns, per_long, 1)
            g = gaps(fns, min(per, 200))
            time.sleep(0.1)
            row = dict(precision=prec, n=n, label=label,
                       kernel=(spec16.name if label in ("auto16", "raw16") else
                               dispatch.select_tc(prec, n, n, n).name if label == "auto"
                               else "cublas"),
                       single_us=single.median * 1e3, loop_us=statistics.median(t_loop) * 1e3,
                       loop_runs_us=[t * 1e3 for t in t_loop], long_us=t_long[0] * 1e3,
                       gaps_median_us=statistics.median(g) * 1e3, gaps_min_us=min(g) * 1e3,
                       gaps_p90_us=float(np.percentile(g, 90)) * 1e3, per=per, per_long=per_long,
                       smi_loop=summary(samples(*w_loop)), smi_long=summary(samples(*w_long)))
            res["rows"].append(row)
            print(f"{prec} {n} {label:7s} {row['kernel']:28s} single {row['single_us']:8.1f} "
                  f"loop {row['loop_us']:8.1f} long {row['long_us']:8.1f} gaps "
                  f"{row['gaps_median_us']:8.1f}/{row['gaps_min_us']:8.1f} us | loop "
                  f"{row['smi_loop'].get('sm_mhz')} MHz {row['smi_loop'].get('power_w')} W | "
                  f"long {row['smi_long'].get('sm_mhz')} MHz {row['smi_long'].get('power_w')} W "
                  f"{row['smi_long'].get('reasons')}", flush=True)
            json.dump(res, open(out, "w"), indent=1, default=str)
        del pairs, calls, outs, A, B
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
smi.terminate()
json.dump(res, open(out, "w"), indent=1, default=str)
