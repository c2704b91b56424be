"""Nsight Compute on the models-suite shapes that missed issue 18's targets.

Each case runs ``gemmlib.matmul`` on torch tensors (as the suite does), then
``torch.matmul`` (cuBLAS, TF32 off), one call each, inside a
cudaProfilerStart/Stop region, so that ncu sees exactly what a caller's call
launches and what cuBLAS launches for the same product:

    python3 scripts/ncu_models.py warm            # compile every kernel first (no ncu)
    ncu --profile-from-start off --csv ... python3 scripts/ncu_models.py profile > ncu.csv
    python3 scripts/ncu_models.py summarize ncu.csv cases.json > table.md

``summarize`` (no GPU) groups the kernels by case -- a case's first kernels
are gemmlib's (numba names carry ``[abi:``), the rest cuBLAS's -- and prints one
line per kernel: duration, SM and DRAM throughput, achieved occupancy, waves,
and the two largest warp stall reasons.
"""
from __future__ import annotations

import csv
import json
import sys
from collections import OrderedDict

#: (precision, M, N, K): every kernel family behind a missed target of issue 18
CASES = [
    ("fp16", 1, 4096, 4096), ("fp16", 1, 6144, 4096),
    ("fp16", 16, 4096, 4096), ("fp16", 16, 6144, 4096), ("fp16", 16, 4096, 14336),
    ("fp16", 128, 4096, 4096), ("fp16", 128, 6144, 4096), ("fp16", 128, 4096, 14336),
    ("fp16", 128, 8192, 8192), ("fp16", 1024, 1024, 8192),
    ("bf16", 1, 4096, 4096), ("bf16", 1, 6144, 4096), ("bf16", 128, 4096, 4096),
    ("3xtf32", 4096, 4096, 4096), ("3xtf32", 2048, 2048, 2048), ("3xtf32", 128, 6144, 4096),
    ("3xtf32", 1024, 4096, 14336), ("3xtf32", 8192, 256, 8192),
]

#: ``NCU_CASES=hopper``: issue 19's squares and a model shape on an H100/H200, where
#: gemmlib runs wgmma_ws (float32 out, then the 16-bit out torch.matmul writes)
HOPPER_CASES = [("fp16", 2048, 2048, 2048), ("fp16", 4096, 4096, 4096),
                ("bf16", 4096, 4096, 4096), ("fp16", 8192, 8192, 8192),
                ("fp16", 4096, 28672, 4096)]
#: ``NCU_CASES=serving``: issue 34's 128-512 token rows, the weight as ``nn.Linear`` keeps
#: it (``x @ W.t()``, a bf16 C): Mistral-7B's o, qkv, gate_up and down, Qwen2.5-7B's qkv, down
SERVING_CASES = [("bf16", 256, 4096, 4096), ("bf16", 512, 4096, 4096),
                 ("bf16", 256, 6144, 4096), ("bf16", 256, 28672, 4096),
                 ("bf16", 512, 4096, 14336), ("bf16", 128, 4608, 3584),
                 ("bf16", 512, 3584, 18944)]
#: ``NCU_CASES=decode``: issue 34's slowest decode and band rows on the serving layers
#: (``wgmma_swap`` at 1-64 tokens on 9216-28672 outputs; the 2048-wide layers at 128-512)
DECODE_CASES = [("bf16", 16, 11264, 2048), ("bf16", 1, 9216, 3072), ("bf16", 64, 28672, 4096),
                ("bf16", 128, 2048, 2048), ("bf16", 512, 3072, 3072)]
_SET = __import__("os").environ.get("NCU_CASES")
if _SET == "hopper":
    CASES = HOPPER_CASES
elif _SET == "serving":
    CASES = SERVING_CASES
elif _SET == "decode":
    CASES = DECODE_CASES
#: the cases that take W as nn.Linear holds it and write the inputs' 16-bit type
LINEAR = _SET in ("serving", "decode")


def run(profile: bool) -> None:
    import torch
    import gemmlib
    from gemmlib import bench_models, dispatch

    fw = bench_models.framework("torch")   # the suite's operands (and TF32 off for fp32)
    meta = []
    for prec, M, N, K in CASES:
        A, B = fw.operands(prec, M, N, K, 0)
        if LINEAR:   # W (N, K) as nn.Linear holds it; the product reads W.t()
            B = B.t().contiguous().t()
        call_prec = prec if prec == "3xtf32" else None
        kw = dict(out_dtype=A.dtype) if LINEAR else dict(precision=call_prec)
        C = gemmlib.matmul(A, B, **kw)      # compiles; then a checked result
        err = fw.rel_error(C, A, B, M)
        name = (dispatch.select_tc(prec, M, N, K, out=prec, b_layout="NK").name
                if LINEAR else dispatch.select_tc(prec, M, N, K).name)
        meta.append(dict(precision=prec, M=M, N=N, K=K, kernel=name, rel_error=err))
        print(f"{prec:6s} {M:5d}x{N:5d}x{K:5d} {name} err {err:.1e}", flush=True)
        if profile:
            torch.cuda.profiler.start()
            gemmlib.matmul(A, B, **kw)
            if CASES is HOPPER_CASES:   # the epilogue that writes the inputs' 16-bit type
                gemmlib.matmul(A, B, out_dtype=A.dtype)
            torch.matmul(A, B)
            torch.cuda.synchronize()
            torch.cuda.profiler.stop()
        del A, B, C
    if len(sys.argv) > 2:
        json.dump(meta, open(sys.argv[2], "w"), indent=1)


# --------------------------------------------------------------------------
# summarize (no GPU)

SOL, LAUNCH = "GPU Speed Of Light Throughput", "Launch Statistics"
FIELDS = {  # column -> (section, metric) as ncu's details page names them
    "us": (SOL, "Duration"),
    "sm%": (SOL, "Compute (SM) Throughput"),
    "mem%": (SOL, "Memory Throughput"),
    "dram%": (SOL, "DRAM Throughput"),
    "occ%": ("Occupancy", "Achieved Occupancy"),
    "waves": (LAUNCH, "Waves Per SM"),
    "grid": (LAUNCH, "Grid Size"),
    "block": (LAUNCH, "Block Size"),
    "regs": (LAUNCH, "Registers Per Thread"),
}


def _kernels(path):
    """ID -> {name, metrics{(section, name): value}, raw{name: value}} in launch order."""
    ks: "OrderedDict[str, dict]" = OrderedDict()
    with open(path, newline="") as f:
        lines = [ln for ln in f if ln.startswith('"')]   # skip ==PROF== and print lines
    for row in csv.DictReader(lines):
        k = ks.setdefault(row["ID"], dict(name=row["Kernel Name"], metrics={}, raw={}))
        value = row["Metric Value"]
        if row["Metric Unit"] == "ns" and row["Metric Name"] == "Duration":
            value = f"{_num(value) / 1e3:.1f}"
        k["metrics"][(row["Section Name"], row["Metric Name"])] = value
        k["raw"][row["Metric Name"]] = value
    return ks


def _num(s):
    try:
        return float(str(s).replace(",", ""))
    except ValueError:
        return float("nan")


def _stalls(metrics, top=2):
    """The largest warp stall ratios (smsp__average_warps_issue_stalled_*), short names."""
    out = [(n.replace("smsp__average_warps_issue_stalled_", "").replace(
        "_per_issue_active.ratio", ""), _num(v)) for n, v in metrics.items()
           if n.startswith("smsp__average_warps_issue_stalled_")]
    return sorted(out, key=lambda t: -t[1])[:top]


def _tensor(metrics):
    """The busiest tensor pipe, % of peak over active cycles (mma.sync: hmma; wgmma: gmma)."""
    v = [_num(val) for n, val in metrics.items()
         if n.startswith("sm__pipe_tensor") and n.endswith("pct_of_peak_sustained_active")]
    return max(v) if v else float("nan")


def summarize(csv_path, cases_path=None):
    ks = list(_kernels(csv_path).values())
    cases = json.load(open(cases_path)) if cases_path else [
        dict(precision=p, M=M, N=N, K=K) for p, M, N, K in CASES]
    groups, cur = [], None
    for k in ks:
        ours = "[abi:" in k["name"]     # numba's names carry their ABI tag; cuBLAS's do not
        if ours and (cur is None or cur["theirs"]):
            cur = dict(ours=[], theirs=[])
            groups.append(cur)
        if cur is None:
            continue
        (cur["ours"] if ours else cur["theirs"]).append(k)
    print("| case | who | kernel | " + " | ".join(FIELDS)
          + " | DRAM MB | L2 MB | tensor% | top stalls |")
    print("|" + "---|" * (len(FIELDS) + 7))
    for case, g in zip(cases, groups):
        label = f"{case['precision']} {case['M']}x{case['N']}x{case['K']}"
        for who in ("ours", "theirs"):
            for k in g[who]:
                vals = [k["metrics"].get(m, "") for m in FIELDS.values()]
                l2 = _num(k["raw"].get("lts__t_bytes.sum", "nan")) / 1e6
                mb = (_num(k["raw"].get("dram__bytes_read.sum", "nan"))
                      + _num(k["raw"].get("dram__bytes_write.sum", "nan"))) / 1e6
                name = k["name"].split("[")[0].split("(")[0][:48]
                print(f"| {label} | {'gemmlib' if who == 'ours' else 'cuBLAS'} | {name} | "
                      + " | ".join(vals) + f" | {mb:.1f} | {l2:.1f} | {_tensor(k['raw']):.1f} | "
                      + ", ".join(f"{n} {v:.1f}" for n, v in _stalls(k["raw"])) + " |")
    if len(groups) != len(cases):
        print(f"\n(note: {len(groups)} kernel groups for {len(cases)} cases)")


if __name__ == "__main__":
    step = sys.argv[1]
    if step in ("warm", "profile"):
        run(step == "profile")
    elif step == "summarize":
        summarize(sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None)
    else:
        sys.exit(f"unknown step {step}")
