"""Distributed GEMM on several GPUs: correctness and measurements.

Run under torchrun, one process per GPU (scripts/distributed_gpu.sh runs P = 2, 4, 8)::

    torchrun --standalone --nproc-per-node=4 scripts/distributed_gpu.py check
    torchrun --standalone --nproc-per-node=4 scripts/distributed_gpu.py bench [--quick]
    torchrun --standalone --nproc-per-node=4 scripts/distributed_gpu.py block [--quick]

``check``  every algorithm of gemmlib.distributed on CUDA tensors over NCCL, uneven
           shapes, fp32/fp16/bf16, against a float64 product; refusals on every rank.
           Prints "all checks passed" (tests/test_distributed.py runs this).
``bench``  writes results/distributed-<gpu>-x<P>-<date>.json:
           * NCCL's own all-gather bandwidth (algbw and busbw, as nccl-tests defines them);
           * one GPU: torch.matmul (cuBLAS; TF32 off for fp32) and gemmlib.matmul at the
             per-GPU size (weak scaling) and the whole size (strong scaling);
           * each algorithm, with and without overlap, for fp16, bf16 and fp32, weak and
             strong scaling: wall time (CUDA events, the slowest rank, median of reps),
             TFLOP/s, scaling efficiency against one GPU (gemmlib and cuBLAS), and from a
             recorded timeline the compute, communication and overlapped time;
           * torch doing the same split: all_gather + torch.matmul (what a torch user
             writes), and gemmlib's schedules with torch.matmul as the local product;
           * GPUs, clocks, topology, versions.

``block``  a tensor-parallel Llama-3.1-8B layer's projections (QKV and gate/up
           column-parallel with an all-gather of the token-sharded input, O and down
           row-parallel with a reduce-scatter), gemmlib's overlapped collectives against
           torch.matmul + NCCL and torch's async tensor parallel, prefill (2048 tokens) and
           decode (16): tokens/s, into the same results file's "block" rows.

``--cpu`` runs the same code on CPU processes with gloo and tiny sizes (a check of the code
paths, not a measurement; its file goes to --out, by default a temporary folder):

    NUMBA_ENABLE_CUDASIM=1 torchrun --nproc-per-node=2 scripts/distributed_gpu.py bench --cpu

NVLink multicast stays off (NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1): the
machines require it; this script sets both if they are missing.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

ARGS = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ARGS.add_argument("step", choices=("check", "bench", "block"))
ARGS.add_argument("--cpu", action="store_true", help="gloo on CPU processes, tiny sizes")
ARGS.add_argument("--quick", action="store_true", help="fewer sizes and repetitions")
ARGS.add_argument("--dtypes", default="fp16,bf16,fp32")
ARGS.add_argument("--weak", type=int, default=0, help="per-GPU size s (default by dtype)")
ARGS.add_argument("--strong", type=int, default=0, help="whole size n (default by dtype)")
ARGS.add_argument("--reps", type=int, default=0)
ARGS.add_argument("--chunks", default="1,2,4")
ARGS.add_argument("--out", default=None, help="folder for the JSON (default results/)")
OPT = ARGS.parse_args()

if OPT.cpu:
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")
else:
    os.environ["NUMBA_ENABLE_CUDASIM"] = "0"
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import gemmlib  # noqa: E402
from gemmlib import distributed as gd  # noqa: E402

DT = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
LOCAL = int(os.environ.get("LOCAL_RANK", 0))
GPU = not OPT.cpu


def init():
    if GPU:
        torch.cuda.set_device(LOCAL)
        from numba import cuda

        cuda.select_device(LOCAL)        # numba (gemmlib's device facts) on the same GPU
        try:
            import cupy

            cupy.cuda.Device(LOCAL).use()    # gemmlib's workspaces (split-K) on it too
        except ImportError:
            pass
        torch.backends.cuda.matmul.allow_tf32 = False   # fp32 is compared with fp32
        torch.backends.cudnn.allow_tf32 = False
        dist.init_process_group("nccl", device_id=torch.device("cuda", LOCAL))
    else:
        torch.set_num_threads(1)
        dist.init_process_group("gloo")
    return dist.get_rank(), dist.get_world_size()


RANK, P = init()
DEV = torch.device("cuda", LOCAL) if GPU else torch.device("cpu")


def say(*a):
    if RANK == 0:
        print(*a, flush=True)


def sync():
    if GPU:
        torch.cuda.synchronize()


def rand(shape, dtype, seed):
    g = torch.Generator(device="cpu").manual_seed(seed)
    return (torch.rand(shape, generator=g) * 2 - 1).to(dtype).to(DEV)


def rel_err(C, R) -> float:
    if R.numel() == 0:
        return 0.0
    return float((C.double() - R).abs().max() / R.abs().max().clamp_min(1e-30))


# --------------------------------------------------------------------------
# check: correctness on the GPUs


def shards_1d(A, B, r, P):
    om = gd.offsets(gd.split_sizes(A.shape[0], P))
    on = gd.offsets(gd.split_sizes(B.shape[1], P))
    return A[om[r]:om[r + 1]].contiguous(), B[:, on[r]:on[r + 1]].contiguous()


def blocks_2d(A, B, grid, r):
    pr, pc = grid
    i, j = divmod(r, pc)
    (M, K), N = A.shape, B.shape[1]
    om, on = gd.offsets(gd.split_sizes(M, pr)), gd.offsets(gd.split_sizes(N, pc))
    ka, kb = gd.offsets(gd.split_sizes(K, pc)), gd.offsets(gd.split_sizes(K, pr))
    return (A[om[i]:om[i + 1], ka[j]:ka[j + 1]].contiguous(),
            B[kb[i]:kb[i + 1], on[j]:on[j + 1]].contiguous())


#: every schedule, uneven chunk counts included (3 chunks of uneven shards failed on 4 GPUs
#: before the staging buffers were held on the comm stream)
AG_CHECKS = [dict(overlap=False)] + [dict(overlap=True, chunks=c) for c in (1, 2, 3, 4)] + [
    dict(transport="copy"), dict(transport="copy", chunks=3), dict(transport="direct")]
RS_CHECKS = [dict(overlap=False), dict(overlap=True, chunks=2), dict(overlap=True, chunks=3),
             dict(transport="copy"), dict(transport="direct")]


def check() -> int:
    shapes = [(1000, 777, 513), (13, 7, 11), (3, 5000, 1), (P - 1 or 1, 300, 200), (64, 64, 0),
              (4097, 1031, 257)]
    grids = [(pr, P // pr) for pr in range(1, P + 1) if P % pr == 0]
    pgrids = {s: gd.ProcessGrid(s) for s in grids}
    bad, n = [], 0
    for name, dtype in DT.items():
        tol = 1e-4 if name == "fp32" else 2e-3
        for k, (M, N, K) in enumerate(shapes):
            A, B = rand((M, K), dtype, 10 * k + 1), rand((K, N), dtype, 10 * k + 2)
            R = A.double() @ B.double()
            Al, Bl = shards_1d(A, B, RANK, P)
            for gather in "AB":
                rs, cs = gd.result_slices(M, N, P, RANK, gather=gather)
                for opts in AG_CHECKS:
                    C = gd.allgather_matmul(Al, Bl, gather=gather, **opts)
                    e, n = rel_err(C, R[rs, cs]), n + 1
                    if not e < tol:
                        bad.append(f"{name} {M}x{N}x{K} gather={gather} {opts}: error {e:.1e}")
            ok_ = gd.offsets(gd.split_sizes(K, P))
            Ak = A[:, ok_[RANK]:ok_[RANK + 1]].contiguous()
            Bk = B[ok_[RANK]:ok_[RANK + 1]].contiguous()
            rs = slice(*gd.offsets(gd.split_sizes(M, P))[RANK:RANK + 2])
            for opts in RS_CHECKS:
                C = gd.matmul_reduce_scatter(Ak, Bk, **opts)
                e, n = rel_err(C, R[rs]), n + 1
                if not e < tol:
                    bad.append(f"{name} {M}x{N}x{K} reduce-scatter {opts}: error {e:.1e}")
            for s in grids:
                rs, cs = gd.result_slices(M, N, P, RANK, grid=s)
                Ab, Bb = blocks_2d(A, B, s, RANK)
                for opts in (dict(pipelined=False), dict(pipelined=True),
                             dict(pipelined=True, panel=64)):
                    C = gd.summa(Ab, Bb, grid=pgrids[s], **opts)
                    e, n = rel_err(C, R[rs, cs]), n + 1
                    if not e < tol:
                        bad.append(f"{name} {M}x{N}x{K} summa {s} {opts}: error {e:.1e}")
    # calls in a row on the same workspace (its two slots alternate), each with new data
    for it in range(6):
        A, B = rand((515, 260), torch.bfloat16, 500 + it), rand((260, 333), torch.bfloat16, 600 + it)
        R = A.double() @ B.double()
        Al, Bl = shards_1d(A, B, RANK, P)
        rs, cs = gd.result_slices(515, 333, P, RANK, gather="A")
        C = gd.allgather_matmul(Al, Bl, gather="A", transport="copy", chunks=2)
        ok_ = gd.offsets(gd.split_sizes(260, P))
        C2 = gd.matmul_reduce_scatter(A[:, ok_[RANK]:ok_[RANK + 1]].contiguous(),
                                      B[ok_[RANK]:ok_[RANK + 1]].contiguous(), transport="copy")
        r2 = slice(*gd.offsets(gd.split_sizes(515, P))[RANK:RANK + 2])
        for what, e in (("allgather copy", rel_err(C, R[rs, cs])),
                        ("reduce-scatter copy", rel_err(C2, R[r2]))):
            n += 1
            if not e < 2e-3:
                bad.append(f"call {it} in a row, {what}: error {e:.1e}")
    # a refusal raised on every rank (here: one rank's dtype differs)
    A = rand((64, 32), torch.float16 if RANK == P - 1 else torch.float32, 99)
    B = rand((32, 16 * P), A.dtype, 98)
    try:
        gd.allgather_matmul(A, B, gather="A")
        bad.append("a dtype that differs across ranks was not refused")
    except TypeError as e:
        if "float16" not in str(e):
            bad.append(f"refusal message: {e}")
    # the timeline reads CUDA events
    tl = gd.Timeline(RANK)
    Al, Bl = shards_1d(rand((512, 256), torch.float16, 5), rand((256, 512), torch.float16, 6),
                       RANK, P)
    gd.allgather_matmul(Al, Bl, gather="A", overlap=True, timeline=tl)
    recs = tl.records()
    if not {r["kind"] for r in recs} >= {"call", "compute"} or any(
            r["end_ms"] < r["start_ms"] for r in recs):
        bad.append(f"timeline records: {recs[:3]}")
    every = [None] * P
    dist.all_gather_object(every, (n, bad))
    for r, (nr, br) in enumerate(every):
        for b in br:
            say(f"rank {r}: FAILED {b}")
    failed = sum(len(b) for _, b in every)
    say(f"{sum(nr for nr, _ in every)} results checked on {P} ranks: "
        + ("all checks passed" if not failed else f"{failed} FAILED"))
    return 1 if failed else 0


# --------------------------------------------------------------------------
# bench: timings


def timed(fn, reps: int, warmup: int = 2) -> dict:
    """Median (and spread) over reps of the slowest rank's time of ``fn()``, in ms."""
    for _ in range(warmup):
        fn()
    sync()
    ts = []
    for _ in range(reps):
        dist.barrier()
        sync()
        if GPU:
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            fn()
            e1.record()
            e1.synchronize()
            ts.append(e0.elapsed_time(e1))
        else:
            t0 = time.perf_counter()
            fn()
            ts.append(1e3 * (time.perf_counter() - t0))
    t = torch.tensor(ts, dtype=torch.float64, device=DEV)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    ts = t.tolist()
    return dict(median_ms=statistics.median(ts), min_ms=min(ts), max_ms=max(ts), reps=reps)


def timeline_of(fn) -> tuple[dict, list]:
    """One more run with a Timeline: the per-rank summaries' medians, and every rank's spans."""
    tl = gd.Timeline(RANK)
    dist.barrier()
    sync()
    fn(tl)
    recs = tl.gather()
    summ = gd.summarize(recs)
    med = {k: statistics.median(s[k] for s in summ) for k in
           ("wall_ms", "compute_ms", "comm_ms", "overlap_ms")}
    med["hidden"] = med["overlap_ms"] / med["comm_ms"] if med["comm_ms"] > 0 else None
    return med, recs


def torch_product(A, B, out=None):
    """torch.matmul (cuBLAS) as the local product of gemmlib's schedules."""
    C = torch.matmul(A, B)
    if out is None:
        return C
    return out.copy_(C)


def torch_allgather_matmul(Al, Bl, gather, P):
    """What a torch user writes for the same split: all-gather, then torch.matmul."""
    if gather == "A":
        full = torch.empty((P * Al.shape[0], Al.shape[1]), dtype=Al.dtype, device=Al.device)
        gd.all_gather_flat(full.view(-1), Al.reshape(-1), None)
        return torch.matmul(full, Bl)
    buf = torch.empty((P, Bl.numel()), dtype=Bl.dtype, device=Bl.device)
    gd.all_gather_flat(buf.view(-1), Bl.reshape(-1), None)
    full = torch.cat([buf[r].view(Bl.shape) for r in range(P)], dim=1)
    return torch.matmul(Al, full)


def _group_name():
    g = dist.group.WORLD
    try:
        import warnings

        import torch.distributed._symmetric_memory as symm

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            symm.enable_symm_mem_for_group(g.group_name)
    except Exception:  # noqa: BLE001 - newer torch needs no enabling
        pass
    return g.group_name


def torch_async_tp_allgather(Al, Bl):
    """torch's async tensor parallel: the fused all-gather + matmul (symmetric memory)."""
    _, outs = torch.ops.symm_mem.fused_all_gather_matmul(Al, [Bl], 0, _group_name())
    return outs[0]


def torch_async_tp_reduce_scatter(Ak, Bk):
    """torch's async tensor parallel: the fused matmul + reduce-scatter."""
    return torch.ops.symm_mem.fused_matmul_reduce_scatter(Ak, Bk, "sum", 0, _group_name())


def torch_matmul_reduce_scatter(Ak, Bk):
    """What a torch user writes: torch.matmul, then NCCL's reduce-scatter (in the dtype)."""
    part = torch.matmul(Ak, Bk)
    out = torch.empty((part.shape[0] // P, part.shape[1]), dtype=part.dtype, device=part.device)
    dist.reduce_scatter_tensor(out, part, group=None)
    return out


def allgather_bandwidth(reps: int) -> list[dict]:
    """NCCL's all-gather, as nccl-tests reports it: size = bytes gathered (the output),
    algbw = size / time, busbw = algbw * (P - 1) / P."""
    rows = []
    sizes = [1 << 20, 1 << 24, 1 << 26, 1 << 28, 1 << 30] if GPU else [1 << 12, 1 << 16]
    if OPT.quick and GPU:
        sizes = [1 << 24, 1 << 28]
    for size in sizes:
        n = size // 2 // P                      # fp16 elements per rank
        x = torch.ones(n, dtype=torch.float16, device=DEV)
        out = torch.empty(n * P, dtype=torch.float16, device=DEV)
        t = timed(lambda: gd.all_gather_flat(out, x, None), reps)
        alg = n * P * 2 / (t["median_ms"] * 1e-3) / 1e9
        rows.append(dict(bytes=n * P * 2, time_ms=t["median_ms"], algbw_gbs=alg,
                         busbw_gbs=alg * (P - 1) / P))
        say(f"  all-gather {n * P * 2 / 2**20:8.1f} MiB: {t['median_ms']:.3f} ms, "
            f"algbw {alg:.1f} GB/s, busbw {alg * (P - 1) / P:.1f} GB/s")
    return rows


def problems(name):
    """(scaling, algorithm, M, N, K, grid): per-GPU product s^3 (weak) or whole n^3 (strong)."""
    s = OPT.weak or (64 if OPT.cpu else (4096 if name == "fp32" else 8192))
    n = OPT.strong or (96 if OPT.cpu else (8192 if name == "fp32" else 16384))
    pr, pc = gd.grid_shape(P)
    out = []
    for scaling, (Mg, Ng, Kg, Ms, Ns, Ks) in (
            ("weak", (s, s * P, s, s * P, s, s)), ("strong", (n, n, n, n, n, n))):
        out.append((scaling, "gather_A", Mg, Ng, Kg, None))      # C[:, cols]: N grows
        out.append((scaling, "gather_B", Ms, Ns, Ks, None))      # C[rows, :]: M grows
        k = s * P if scaling == "weak" else n
        out.append((scaling, "reduce_scatter", Ms // P if scaling == "weak" else n,
                    Ns, k, None))                              # K split, C rows scattered
    out.append(("weak", "summa", s * pr, s * pc, s, (pr, pc)))
    out.append(("strong", "summa", n, n, n, (pr, pc)))
    return s, n, out


def bench() -> int:
    reps = OPT.reps or (5 if OPT.quick or OPT.cpu else 10)
    chunks = [int(c) for c in OPT.chunks.split(",")]
    data = dict(meta=environment(), allgather_bandwidth=[], single=[], rows=[], timelines={})
    say(f"{P} x {data['meta']['gpu']}: NCCL all-gather bandwidth")
    data["allgather_bandwidth"] = allgather_bandwidth(reps)
    for name in OPT.dtypes.split(","):
        dtype = DT[name]
        s, n, probs = problems(name)
        single = {}
        for size, what in ((s, "weak"), (n, "strong")):
            A, B = rand((size, size), dtype, 1), rand((size, size), dtype, 2)
            C32 = torch.empty((size, size), dtype=torch.float32, device=DEV)
            for engine, fn in (("cublas", lambda: torch.matmul(A, B)),
                               ("gemmlib", lambda: gd.local_product(A, B, C32))):
                t = timed(fn, reps)
                single[(what, engine)] = t["median_ms"]
                data["single"].append(dict(dtype=name, scaling=what, engine=engine, M=size,
                                           N=size, K=size, **t,
                                           tflops=2 * size**3 / t["median_ms"] / 1e9))
                say(f"{name} one GPU {engine:8} {size}^3: {t['median_ms']:.3f} ms, "
                    f"{2 * size**3 / t['median_ms'] / 1e9:.1f} TFLOP/s")
            del A, B, C32
        for scaling, alg, M, N, K, grid in probs:
            rows = bench_problem(name, dtype, scaling, alg, M, N, K, grid, reps, chunks,
                                 single, data["timelines"])
            data["rows"].extend(rows)
    data["targets"] = judge(data)
    if RANK == 0:
        out = Path(OPT.out) if OPT.out else (Path(tempfile.gettempdir()) if OPT.cpu
                                             else ROOT / "results")
        out.mkdir(parents=True, exist_ok=True)
        m = data["meta"]
        path = out / f"distributed-{m['gpu_slug']}-x{P}-{m['date'][:10]}.json"
        path.write_text(json.dumps(data, indent=1))
        print(f"wrote {path}", flush=True)
        for t in data["targets"]:
            print(("MET     " if t["met"] else "MISSED  ") + t["what"], flush=True)
    return 0


def bench_problem(name, dtype, scaling, alg, M, N, K, grid, reps, chunks, single, timelines):
    flops = 2 * M * N * K
    base = dict(dtype=name, scaling=scaling, algorithm=alg, M=M, N=N, K=K, P=P,
                grid=list(grid) if grid else None)
    if alg == "summa":
        Ab, Bb = blocks_2d_local(M, N, K, grid, dtype)
        ka = gd.split_sizes(K, grid[1])
        kb = gd.split_sizes(K, grid[0])
        sizes = (ka, kb)
        width = max(1, K // (2 * grid[1]))
        variants = [("gemmlib", dict(pipelined=False)), ("gemmlib", dict(pipelined=True)),
                    ("gemmlib", dict(pipelined=False, panel=width)),
                    ("gemmlib", dict(pipelined=True, panel=width)),
                    ("torch", dict(pipelined=False)), ("torch", dict(pipelined=True))]
        call = lambda eng, o, tl=None: gd.summa(  # noqa: E731
            Ab, Bb, grid=grid, sizes=sizes, timeline=tl,
            product=torch_product if eng == "torch" else None, **o)
    elif alg == "reduce_scatter":
        kk = K // P
        Ak, Bk = rand((M, kk), dtype, 3 + RANK), rand((kk, N), dtype, 7 + RANK)
        variants = [("gemmlib", dict(overlap=False))] + [
            ("gemmlib", dict(overlap=True, chunks=c)) for c in chunks if c > 1] + [
            ("gemmlib", dict(transport="copy")), ("gemmlib", dict(transport="direct")),
            ("torch plain", dict(overlap=False))] + (
            [("torch async-TP", dict())] if GPU else [])

        def call(eng, o, tl=None):
            if eng == "torch plain":
                return torch_matmul_reduce_scatter(Ak, Bk)
            if eng == "torch async-TP":
                return torch_async_tp_reduce_scatter(Ak, Bk)
            return gd.matmul_reduce_scatter(Ak, Bk, sizes=[M // P] * P, timeline=tl, **o)
    else:
        gather = alg[-1]
        m, nn = M // P, N // P
        Al, Bl = rand((m, K), dtype, 3 + RANK), rand((K, nn), dtype, 7 + RANK)
        sizes = [m] * P if gather == "A" else [nn] * P
        variants = [("gemmlib", dict(overlap=False))] + [
            ("gemmlib", dict(overlap=True, chunks=c)) for c in chunks] + [
            ("gemmlib", dict(transport="copy")), ("gemmlib", dict(transport="copy", chunks=2)),
            ("gemmlib", dict(transport="direct")),
            ("torch plain", dict(overlap=False)), ("torch", dict(transport="copy"))] + (
            [("torch async-TP", dict())] if GPU and gather == "A" else [])

        def call(eng, o, tl=None):
            if eng == "torch plain":
                return torch_allgather_matmul(Al, Bl, gather, P)
            if eng == "torch async-TP":
                return torch_async_tp_allgather(Al, Bl)
            return gd.allgather_matmul(Al, Bl, gather=gather, sizes=sizes, timeline=tl,
                                       product=torch_product if eng == "torch" else None, **o)
    rows = []
    for eng, o in variants:
        row = dict(base, engine=eng, options=o)
        try:
            t = timed(lambda: call(eng, o), reps)
            row.update(t, tflops=flops / t["median_ms"] / 1e9)
            # efficiency: the P-GPU run against one GPU doing the per-GPU (weak) or the whole
            # (strong) product with the same local engine, and with cuBLAS
            one = single[(scaling, "gemmlib" if eng == "gemmlib" else "cublas")]
            cub = single[(scaling, "cublas")]
            if scaling == "weak":
                row.update(efficiency=one / t["median_ms"], vs_cublas_1gpu=cub / t["median_ms"])
            else:
                row.update(efficiency=one / (P * t["median_ms"]),
                           speedup_vs_cublas_1gpu=cub / t["median_ms"])
            if eng not in ("torch plain", "torch async-TP"):
                med, recs = timeline_of(lambda tl: call(eng, o, tl))
                row.update(timeline=med)
                key = f"{name} {scaling} {alg} {eng} {json.dumps(o, sort_keys=True)}"
                if name == OPT.dtypes.split(",")[0] and eng == "gemmlib":
                    timelines[key] = recs
        except Exception as e:  # noqa: BLE001 - one configuration failing keeps the others
            row.update(error=f"{type(e).__name__}: {e}")
        rows.append(row)
        tl = row.get("timeline") or {}
        say(f"{name} {scaling:6} {alg:8} {M}x{N}x{K} {eng:11} {json.dumps(o):38} "
            + (f"{row['median_ms']:8.3f} ms {row['tflops']:7.1f} TFLOP/s eff "
               f"{100 * row['efficiency']:5.1f}%" if "median_ms" in row else row.get("error", ""))
            + (f" | compute {tl['compute_ms']:.3f} comm {tl['comm_ms']:.3f} overlap "
               f"{tl['overlap_ms']:.3f} ms" if tl else ""))
    return rows


# --------------------------------------------------------------------------
# block: a tensor-parallel Llama layer's projections

#: Llama-3.1-8B: hidden size, MLP size, query and key/value widths
LLAMA = dict(hidden=4096, mlp=14336, q=4096, kv=1024)


def block() -> int:
    """One layer's four projections, sequence-parallel over P GPUs (activations split by
    tokens): QKV and gate/up column-parallel (all-gather the tokens, multiply by this GPU's
    columns), O and down row-parallel (multiply this GPU's slice, reduce-scatter the sums by
    tokens).  Attention itself and the norms are left out: they are the same in every
    engine.  tokens/s = tokens / (the slowest rank's time of the layer)."""
    H, I, Q, KV = (LLAMA[k] for k in ("hidden", "mlp", "q", "kv"))
    if OPT.cpu:
        H, I, Q, KV = 64, 96, 64, 16
    dt = torch.bfloat16
    wqkv = rand((H, (Q + 2 * KV) // P), dt, 21 + RANK) / 30
    wo = rand((Q // P, H), dt, 22 + RANK) / 30
    wgu = rand((H, 2 * I // P), dt, 23 + RANK) / 30
    wd = rand((I // P, H), dt, 24 + RANK) / 60
    q_w, i_w = Q // P, I // P

    def gemmlib_layer(x, transport):
        kw = dict(transport=transport) if transport != "nccl" else dict(overlap=True, chunks=2)
        T = x.shape[0] * P
        qkv = gd.allgather_matmul(x, wqkv, gather="A", sizes=[x.shape[0]] * P, **kw)
        attn = qkv[:, :q_w].to(dt)                     # stands in for attention's output
        rs = dict(transport=transport) if transport != "nccl" else dict(overlap=True, chunks=2)
        h = gd.matmul_reduce_scatter(attn, wo, sizes=[T // P] * P, **rs)
        x2 = (x.float() + h).to(dt)
        gu = gd.allgather_matmul(x2, wgu, gather="A", sizes=[x.shape[0]] * P, **kw)
        act = (torch.nn.functional.silu(gu[:, :i_w]) * gu[:, i_w:]).to(dt)
        return (x2.float() + gd.matmul_reduce_scatter(act, wd, sizes=[T // P] * P, **rs)).to(dt)

    def torch_layer(x):
        T = x.shape[0] * P
        full = torch.empty((T, H), dtype=dt, device=DEV)
        dist.all_gather_into_tensor(full, x)
        attn = torch.matmul(full, wqkv)[:, :q_w]
        h = torch.empty((T // P, H), dtype=dt, device=DEV)
        dist.reduce_scatter_tensor(h, torch.matmul(attn, wo))
        x2 = x + h
        dist.all_gather_into_tensor(full, x2)
        gu = torch.matmul(full, wgu)
        act = torch.nn.functional.silu(gu[:, :i_w]) * gu[:, i_w:]
        out = torch.empty((T // P, H), dtype=dt, device=DEV)
        dist.reduce_scatter_tensor(out, torch.matmul(act, wd))
        return x2 + out

    def async_tp_layer(x):
        g = _group_name()
        _, (qkv,) = torch.ops.symm_mem.fused_all_gather_matmul(x, [wqkv], 0, g)
        h = torch.ops.symm_mem.fused_matmul_reduce_scatter(qkv[:, :q_w].contiguous(), wo, "sum",
                                                            0, g)
        x2 = x + h
        _, (gu,) = torch.ops.symm_mem.fused_all_gather_matmul(x2, [wgu], 0, g)
        act = torch.nn.functional.silu(gu[:, :i_w]) * gu[:, i_w:]
        return x2 + torch.ops.symm_mem.fused_matmul_reduce_scatter(act, wd, "sum", 0, g)

    engines = [("torch", torch_layer), ("gemmlib nccl", lambda x: gemmlib_layer(x, "nccl")),
               ("gemmlib copy", lambda x: gemmlib_layer(x, "copy"))]
    if GPU:
        engines.append(("torch async-TP", async_tp_layer))
    reps = OPT.reps or (5 if OPT.quick or OPT.cpu else 20)
    rows = []
    for phase, T in (("prefill", 2048 if GPU else 64), ("decode", 16)):
        x = rand((T // P, H), dt, 30 + RANK)
        ref = torch_layer(x).float()
        for name, fn in engines:
            row = dict(suite="tp-block", phase=phase, tokens=T, batch=T if phase == "decode"
                       else 1, engine=name, P=P, model="llama-3.1-8b layer projections")
            try:
                y = fn(x).float()
                row["rel_diff_vs_torch"] = float((y - ref).norm() / ref.norm().clamp_min(1e-30))
                t = timed(lambda: fn(x), reps)
                row.update(t, tok_s=T / (t["median_ms"] * 1e-3))
            except Exception as e:  # noqa: BLE001
                row.update(error=f"{type(e).__name__}: {e}")
            rows.append(row)
            say(f"block {phase:7} T={T:5} {name:15} " + (
                f"{row['median_ms']:8.3f} ms {row['tok_s']:12.0f} tok/s diff "
                f"{row['rel_diff_vs_torch']:.1e}" if "median_ms" in row else row["error"]))
    if GPU and os.environ.get("BLOCK_PROFILE"):
        from torch.profiler import ProfilerActivity, profile

        for phase, T in (("prefill", 2048), ("decode", 16)):
            x = rand((T // P, H), dt, 30 + RANK)
            for name, fn in engines[1:3]:
                fn(x)
                sync()
                with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                    fn(x)
                    sync()
                if RANK == 0:
                    print(f"--- profile {phase} {name}")
                    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12,
                                                    max_name_column_width=60))
                    print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=8,
                                                    max_name_column_width=60))
    base = {r["phase"]: r["tok_s"] for r in rows if r["engine"] == "torch" and "tok_s" in r}
    for r in rows:
        if "tok_s" in r and r["phase"] in base:
            r["pct_torch"] = 100 * r["tok_s"] / base[r["phase"]]
    if RANK == 0:
        out = Path(OPT.out) if OPT.out else (Path(tempfile.gettempdir()) if OPT.cpu
                                             else ROOT / "results")
        out.mkdir(parents=True, exist_ok=True)
        m = environment()
        path = out / f"distributed-block-{m['gpu_slug']}-x{P}-{m['date'][:10]}.json"
        path.write_text(json.dumps(dict(meta=m, rows=rows), indent=1))
        print(f"wrote {path}", flush=True)
    return 0


def blocks_2d_local(M, N, K, grid, dtype):
    pr, pc = grid
    i, j = divmod(RANK, pc)
    ms, ns = gd.split_sizes(M, pr), gd.split_sizes(N, pc)
    ka, kb = gd.split_sizes(K, pc), gd.split_sizes(K, pr)
    return rand((ms[i], ka[j]), dtype, 11 + RANK), rand((kb[i], ns[j]), dtype, 13 + RANK)


def judge(data) -> list[dict]:
    """The issue's targets, computed from the rows."""
    out = []
    rows = [r for r in data["rows"] if "median_ms" in r]
    for p2 in (2, 4):
        if P != p2:
            continue
        for alg in ("gather_A", "gather_B", "reduce_scatter", "summa"):
            best = [r for r in rows if r["dtype"] == "fp16" and r["scaling"] == "weak"
                    and r["algorithm"] == alg and r["engine"] == "gemmlib"
                    and _overlapped(r)]
            if best:
                b = max(best, key=lambda r: r["efficiency"])
                out.append(dict(what=f"fp16 weak scaling on {P} GPUs, {alg} with overlap: "
                                f"{100 * b['efficiency']:.1f}% >= 90% ({b['options']})",
                                met=b["efficiency"] >= 0.9))
    groups: dict = {}
    for r in rows:
        if r["engine"] != "gemmlib" or (r["algorithm"] == "summa" and "panel" in r["options"]):
            continue
        key = (r["dtype"], r["scaling"], r["algorithm"])
        groups.setdefault(key, {}).setdefault(_overlapped(r), []).append(r["median_ms"])
    for key, g in sorted(groups.items()):
        if True in g and False in g:
            on, off = min(g[True]), min(g[False])
            out.append(dict(what=f"{' '.join(key)}: overlapped {on:.3f} ms < not {off:.3f} ms",
                            met=on < off))
        if True in g:
            on = min(g[True])
            for eng in ("torch plain", "torch async-TP"):
                ts = [r["median_ms"] for r in rows if r["engine"] == eng and
                      (r["dtype"], r["scaling"], r["algorithm"]) == key]
                if ts:
                    out.append(dict(what=f"{' '.join(key)}: overlapped {on:.3f} ms < {eng} "
                                    f"{min(ts):.3f} ms", met=on < min(ts)))
    return out


def _overlapped(r) -> bool:
    o = r["options"]
    return bool(o.get("overlap") or o.get("pipelined") or o.get("transport") in ("copy",
                                                                                 "direct"))


def environment() -> dict:
    meta = dict(date=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                processes=P, device="gpu" if GPU else "cpu", backend=dist.get_backend(),
                python=platform.python_version(), torch=torch.__version__,
                numpy=np.__version__, gemmlib=gemmlib.__version__,
                env={k: os.environ.get(k) for k in ("NCCL_NVLS_ENABLE",
                                                   "TORCH_SYMM_MEM_DISABLE_MULTICAST",
                                                   "NCCL_ALGO", "NCCL_PROTO")},
                note="timings: CUDA events, the slowest rank, median of reps" if GPU else
                "CPU processes with gloo and tiny sizes: a check of the code paths, not a "
                "measurement")
    if GPU:
        v = torch.cuda.nccl.version()
        meta.update(gpu=torch.cuda.get_device_name(LOCAL), cuda=torch.version.cuda,
                    nccl=".".join(map(str, v)) if isinstance(v, tuple) else str(v),
                    gpus=torch.cuda.device_count())
        try:
            from gemmlib.bench import environment as env1

            e = env1()
            meta.update({k: e[k] for k in ("numba_cuda", "cupy", "compute_capability",
                                            "sm_count", "max_sm_clock_mhz") if k in e})
        except Exception as e:  # noqa: BLE001
            meta["environment_error"] = str(e)
        for cmd, key in ((["nvidia-smi", "--query-gpu=index,name,clocks.sm,clocks.max.sm,"
                           "clocks.mem,power.limit,temperature.gpu",
                           "--format=csv,noheader"], "smi"),
                         (["nvidia-smi", "topo", "-m"], "topology")):
            try:
                meta[key] = subprocess.run(cmd, capture_output=True, text=True,
                                           timeout=30).stdout.strip().splitlines()
            except Exception as e:  # noqa: BLE001
                meta[key] = f"unavailable: {e}"
    else:
        meta.update(gpu="cpu", gpus=0)
    meta["gpu_slug"] = re.sub(r"[^a-z0-9]+", "-", meta["gpu"].lower()).strip("-")
    return meta


if __name__ == "__main__":
    try:
        rc = {"check": check, "bench": bench, "block": block}[OPT.step]()
    finally:
        dist.destroy_process_group()
    sys.exit(rc)
