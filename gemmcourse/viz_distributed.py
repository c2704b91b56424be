"""Figures, the paper model and the live demo of chapter 19 (distributed GEMM).

* The paper model: :func:`comm_bytes` (bytes each GPU receives), :func:`flops_per_gpu`,
  :func:`comm_time` / :func:`model_times` (time on one GPU's link and its arithmetic),
  :func:`pipeline_time` (the wall time of a chunked, overlapped schedule), and
  :func:`plot_ratio` / :func:`plot_model_efficiency` / :func:`winner` drawn from them.
  Rates come from committed single-GPU measurements (:func:`rates`); the link bandwidth
  is an assumption until a multi-GPU run has measured it (:func:`link_bandwidth`).
* The live demo: :func:`demo` runs on CPU processes joined by gloo
  (``gemmlib.distributed.spawn_cpu``) -- every algorithm on tiny uneven shapes checked
  against NumPy, then a recorded timeline; :func:`run_demo` starts it from a notebook.
* :func:`plot_timeline` draws recorded spans (compute and communication lanes per rank).
* :func:`distributed_files` / :func:`show_distributed_results`: the committed
  ``results/distributed-<gpu>-x<P>-<date>.json`` files (``scripts/distributed_gpu.py``),
  when there are any.

matplotlib is imported only when drawing.
"""

from __future__ import annotations

import math

import numpy as np

#: what each algorithm is called in the figures
NAMES = {"gather_A": "1-D, all-gather A", "gather_B": "1-D, all-gather B", "summa": "SUMMA"}
COLOURS = {"gather_A": "#1f77b4", "gather_B": "#ff7f0e", "summa": "#2ca02c",
           "compute": "#b6d7a8", "comm": "#9fc5e8", "copy": "#f9cb9c", "call": "#dddddd"}
#: NVLink 4 on an H200 (SXM): 450 GB/s each way per GPU by the datasheet; NCCL's all-gather
#: reaches ~80% of it. An assumption, used until a run has measured the link.
ASSUMED_BUSBW_GBS = 360.0
#: H200 rates measured in this repository (results/bench-nvidia-h200-2026-11-2*.json), used
#: when the files cannot be read: TFLOP/s at 8192^3
MEASURED_H200 = {"fp16": {"cublas": 753.1, "gemmlib": 606.2},
                 "bf16": {"cublas": 781.7, "gemmlib": 634.4},
                 "fp32": {"cublas": 51.2, "gemmlib": 51.2 * 0.9}}
BYTES = {"fp16": 2, "bf16": 2, "fp32": 4}


def _plt():
    import matplotlib.pyplot as plt

    return plt


def torch_available() -> bool:
    """True when torch (with torch.distributed and gloo) can be imported here."""
    try:
        import torch.distributed as dist

        return dist.is_available() and dist.is_gloo_available()
    except Exception:  # noqa: BLE001 - any import problem means: no live demo
        return False


# --------------------------------------------------------------------------
# The paper model


def grid_shape(P: int) -> tuple[int, int]:
    """The squarest Pr x Pc = P (the same rule as gemmlib.distributed.grid_shape)."""
    pr = max(d for d in range(1, math.isqrt(P) + 1) if P % d == 0)
    return pr, P // pr


def comm_bytes(alg: str, M: int, N: int, K: int, P: int, bytes_per: int = 2,
               grid=None) -> float:
    """Bytes one GPU receives (even shards).

    1-D gather A: all of A but its own rows, (P-1)/P * M*K elements; gather B:
    (P-1)/P * K*N.  SUMMA on Pr x Pc: its process row's strip of A (M/Pr x K)
    but the share it owns (1/Pc), and its column's strip of B (K x N/Pc) but
    its own 1/Pr.
    """
    if alg == "gather_A":
        return (P - 1) / P * M * K * bytes_per
    if alg == "gather_B":
        return (P - 1) / P * K * N * bytes_per
    pr, pc = grid or grid_shape(P)
    return (M / pr * K * (1 - 1 / pc) + K * N / pc * (1 - 1 / pr)) * bytes_per


def flops_per_gpu(M: int, N: int, K: int, P: int) -> float:
    """Every algorithm splits the 2MNK flops evenly."""
    return 2 * M * N * K / P


def bytes_per_flop(alg, M, N, K, P, bytes_per=2, grid=None) -> float:
    """The communication/computation ratio: bytes received per flop done, per GPU."""
    return comm_bytes(alg, M, N, K, P, bytes_per, grid) / flops_per_gpu(M, N, K, P)


def comm_time(alg, M, N, K, P, bytes_per=2, busbw_gbs=ASSUMED_BUSBW_GBS, grid=None) -> float:
    """Seconds on the link.  An all-gather moves its received bytes at NCCL's bus bandwidth
    (that is how busbw is defined); a broadcast takes its whole message's size / busbw
    whoever the root is, so SUMMA's time counts each strip whole."""
    if alg in ("gather_A", "gather_B"):
        return comm_bytes(alg, M, N, K, P, bytes_per) / (busbw_gbs * 1e9)
    pr, pc = grid or grid_shape(P)
    strips = (M / pr * K if pc > 1 else 0) + (K * N / pc if pr > 1 else 0)
    return strips * bytes_per / (busbw_gbs * 1e9)


def model_times(alg, M, N, K, P, dtype="fp16", tflops=None, busbw_gbs=ASSUMED_BUSBW_GBS,
                grid=None) -> dict:
    """Compute, communication and wall time (s) without and with overlap, and the
    efficiency against one GPU doing its share alone (t_compute / wall)."""
    tflops = tflops or rates()[dtype]["gemmlib"]
    tc = flops_per_gpu(M, N, K, P) / (tflops * 1e12)
    tm = comm_time(alg, M, N, K, P, BYTES[dtype], busbw_gbs, grid) if P > 1 else 0.0
    return dict(compute_s=tc, comm_s=tm, serial_s=tc + tm, overlapped_s=max(tc, tm),
                efficiency_serial=tc / (tc + tm), efficiency_overlapped=tc / max(tc, tm))


def winner(M, N, K, P, bytes_per=2) -> str:
    """The algorithm that moves the fewest bytes per GPU for this shape."""
    return min(("gather_A", "gather_B", "summa"),
               key=lambda a: comm_time(a, M, N, K, P, bytes_per))


def pipeline_time(comm, compute, needs) -> float:
    """Wall time of a schedule: the collectives run one after another (``comm[i]`` seconds
    each), product ``i`` takes ``compute[i]`` and starts once product i-1 is done and
    collective ``needs[i]`` has arrived (``None``: it needs none)."""
    done, t = [], 0.0
    for c in comm:
        t += c
        done.append(t)
    end = 0.0
    for c, n in zip(compute, needs):
        end = max(end, done[n] if n is not None else 0.0) + c
    return max([end] + done)


def rates() -> dict:
    """TFLOP/s of one H200 at 8192^3 from the committed benchmark files (cuBLAS and gemmlib),
    by dtype; the values in MEASURED_H200 where a file is missing."""
    out = {k: dict(v) for k, v in MEASURED_H200.items()}
    try:
        from gemmcourse import notebook as nb

        for _, data in nb.committed_json("bench-nvidia-h200-*-hopper.json"):
            for r in data.get("rows", []):
                if r.get("M") == 8192 and r.get("timing", "kernel") == "kernel":
                    prec = r.get("precision")
                    eng = {"cublas": "cublas", "wgmma_ws": "gemmlib"}.get(r.get("kernel"))
                    if prec in out and eng:
                        out[prec][eng] = float(r["tflops"])
    except Exception:  # noqa: BLE001 - the constants stand
        pass
    return out


def link_bandwidth() -> tuple[float, str]:
    """(busbw GB/s, where it comes from): the largest all-gather of the newest committed
    multi-GPU run, else the assumption."""
    files = distributed_files()
    best = None
    for name, data in files:
        bw = [r for r in data.get("allgather_bandwidth", []) if r.get("busbw_gbs")]
        if bw:
            r = max(bw, key=lambda r: r["bytes"])
            best = (r["busbw_gbs"], f"measured: NCCL all-gather of {r['bytes'] / 2**20:.0f} MiB "
                    f"on {data['meta'].get('processes')} x {data['meta'].get('gpu')} ({name})")
    return best or (ASSUMED_BUSBW_GBS, f"assumed: {ASSUMED_BUSBW_GBS:.0f} GB/s (no multi-GPU "
                    "run has measured the link yet)")


def ratio_table(M, N, K, Ps=(2, 4, 8), dtype="fp16"):
    """Rows of (P, algorithm, grid, MiB received, GFLOP, bytes/flop) for a table."""
    rows = []
    for P in Ps:
        for alg in ("gather_A", "gather_B", "summa"):
            g = grid_shape(P) if alg == "summa" else None
            rows.append((P, NAMES[alg], f"{g[0]} x {g[1]}" if g else "-",
                         f"{comm_bytes(alg, M, N, K, P, BYTES[dtype]) / 2**20:.0f}",
                         f"{flops_per_gpu(M, N, K, P) / 1e9:.0f}",
                         f"{bytes_per_flop(alg, M, N, K, P, BYTES[dtype]):.2e}"))
    return rows


def plot_ratio(n: int = 16384, Ps=(2, 3, 4, 6, 8, 9, 12, 16), dtype="fp16"):
    """Bytes received per flop, per GPU, against P, for a square n^3 problem."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 3.6))
    for alg in ("gather_A", "summa"):
        ax.plot(Ps, [bytes_per_flop(alg, n, n, n, P, BYTES[dtype]) for P in Ps], "o-",
                color=COLOURS[alg], label=NAMES[alg] + (" (= gather B for a square)"
                                                         if alg == "gather_A" else ""))
    for P in Ps:
        g = grid_shape(P)
        ax.annotate(f"{g[0]}x{g[1]}", (P, bytes_per_flop("summa", n, n, n, P, BYTES[dtype])),
                    textcoords="offset points", xytext=(0, -12), ha="center", fontsize=7)
    ax.set_xlabel("GPUs P")
    ax.set_ylabel("bytes received per flop")
    ax.set_title(f"Communication per flop on each GPU, {n}^3 {dtype} (on paper)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_model_efficiency(P: int = 4, dtype="fp16", busbw_gbs=None, sizes=None, note=""):
    """Modelled efficiency (one GPU's share of the time / wall time) against the per-GPU size
    s, weak scaling as scripts/distributed_gpu.py runs it, with and without overlap."""
    plt = _plt()
    bw = busbw_gbs or ASSUMED_BUSBW_GBS
    sizes = sizes or [512, 1024, 2048, 4096, 8192, 16384]
    pr, pc = grid_shape(P)
    fig, ax = plt.subplots(figsize=(7, 3.6))
    for alg in ("gather_A", "summa"):
        ser, ovl = [], []
        for s in sizes:
            M, N, K = (s, s * P, s) if alg == "gather_A" else (s * pr, s * pc, s)
            t = model_times(alg, M, N, K, P, dtype, busbw_gbs=bw)
            ser.append(100 * t["efficiency_serial"])
            ovl.append(100 * t["efficiency_overlapped"])
        ax.plot(sizes, ovl, "o-", color=COLOURS[alg], label=f"{NAMES[alg]}, overlapped")
        ax.plot(sizes, ser, "o--", color=COLOURS[alg], alpha=0.6, label=f"{NAMES[alg]}, not")
    ax.axhline(90, color="k", lw=0.6, ls=":")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("per-GPU size s (each GPU multiplies s x s by s x s)")
    ax.set_ylabel("efficiency, %")
    ax.set_ylim(0, 102)
    ax.set_title(f"Modelled weak scaling on {P} GPUs, {dtype}: {rates()[dtype]['gemmlib']:.0f} "
                 f"TFLOP/s per GPU, link {bw:.0f} GB/s {note}", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_winner_map(P: int = 8, K: int = 8192, dtype="fp16"):
    """Which algorithm moves the fewest bytes per GPU, over output shapes M x N."""
    plt = _plt()
    from matplotlib.colors import ListedColormap

    exps = np.arange(8, 17)
    algs = ("gather_A", "gather_B", "summa")
    grid = np.array([[algs.index(winner(2**m, 2**n, K, P, BYTES[dtype])) for n in exps]
                     for m in exps])
    fig, ax = plt.subplots(figsize=(5.2, 4.2))
    ax.imshow(grid, origin="lower", cmap=ListedColormap([COLOURS[a] for a in algs]),
              vmin=0, vmax=2)
    ax.set_xticks(range(len(exps)), [f"$2^{{{e}}}$" for e in exps], fontsize=8)
    ax.set_yticks(range(len(exps)), [f"$2^{{{e}}}$" for e in exps], fontsize=8)
    ax.set_xlabel("N")
    ax.set_ylabel("M")
    from matplotlib.patches import Patch

    ax.legend(handles=[Patch(color=COLOURS[a], label=NAMES[a]) for a in algs], fontsize=8,
              loc="upper left", bbox_to_anchor=(1.02, 1))
    ax.set_title(f"Fewest bytes per GPU, P = {P}, K = {K}", fontsize=10)
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------
# Timelines


def short_label(label: str) -> str:
    """A call's label as a figure names it: 'allgather_matmul gather=A overlap=True chunks=3'
    -> 'gather A, overlap, 3 chunks'."""
    words = dict(w.split("=", 1) for w in label.split() if "=" in w)
    if label.startswith("allgather_matmul"):
        out = f"gather {words.get('gather', '?')}, " + (
            f"overlap, {words.get('chunks', '?')} chunk(s)" if words.get("overlap") == "True"
            else "no overlap")
    elif label.startswith("summa"):
        out = f"SUMMA {label.split()[1]}, " + ("pipelined" if words.get("pipelined") == "True"
                                               else "not pipelined")
    else:
        out = label
    return out


def plot_timeline(records, title=None, calls=None, unit="ms"):
    """Recorded spans (gemmlib.distributed.Timeline.gather()): for each call, a compute lane
    and a communication lane per rank, drawn from the call's start (the earliest rank's), so
    that calls can be compared.  ``calls`` selects which (default all)."""
    plt = _plt()
    from matplotlib.patches import Patch

    recs = [r for r in records if calls is None or r["call"] in calls]
    chosen = sorted({r["call"] for r in recs})
    ranks = sorted({r["rank"] for r in recs})
    lanes = [(c, r, k) for c in chosen for r in ranks for k in ("compute", "comm")]
    fig, ax = plt.subplots(figsize=(10, 0.26 * len(lanes) + 1.6))
    start = {c: min(r["start_ms"] for r in recs if r["call"] == c) for c in chosen}
    end = 0.0
    for y, (c, rank, kind) in enumerate(lanes):
        for r in recs:
            if r["call"] != c or r["rank"] != rank or r["kind"] == "call":
                continue
            if ("compute" if r["kind"] in ("compute", "copy") else r["kind"]) != kind:
                continue
            s, e = r["start_ms"] - start[c], r["end_ms"] - start[c]
            ax.barh(y, max(e - s, 1e-6), left=s, height=0.7, color=COLOURS[r["kind"]],
                    edgecolor="k", lw=0.4)
            end = max(end, e)
    per_call = 2 * len(ranks)
    for n, c in enumerate(chosen):
        label = next((r["label"] for r in recs if r["call"] == c and r["kind"] == "call"), "")
        ax.text(0, n * per_call - 0.55, short_label(label), fontsize=8, weight="bold",
                va="bottom")
        if n:
            ax.axhline(n * per_call - 0.5, color="k", lw=0.8)
    ax.set_yticks(range(len(lanes)), [f"rank {r} {k}" for _, r, k in lanes], fontsize=7)
    ax.set_ylim(len(lanes) - 0.5, -1.3)
    ax.set_xlim(0, end * 1.02 if end else 1)
    ax.set_xlabel(f"time from the call's start ({unit})")
    ax.legend(handles=[Patch(color=COLOURS[k], label=k) for k in ("compute", "comm", "copy")],
              fontsize=8, loc="lower right")
    if title:
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------
# The live demo on CPU processes (gloo)

#: tiny uneven shapes for the live check: M < P, K = 1, and an odd one
DEMO_SHAPES = [(13, 7, 11), (3, 10, 1), (9, 2, 6)]


def demo(rank: int, world: int, timeline_size: int = 768):
    """Every algorithm on :data:`DEMO_SHAPES`, checked against a float64 NumPy product, then
    three calls recorded on a Timeline (larger NumPy products, so that compute shows).
    Returns (check rows, timeline records); the records are every rank's."""
    import torch

    from gemmlib import distributed as gd

    rows = []
    rng = np.random.default_rng(0)
    for M, N, K in DEMO_SHAPES:
        A = rng.uniform(-1, 1, (M, K)).astype(np.float32)
        B = rng.uniform(-1, 1, (K, N)).astype(np.float32)
        R = A.astype(np.float64) @ B
        om, on = gd.offsets(gd.split_sizes(M, world)), gd.offsets(gd.split_sizes(N, world))
        Al = torch.from_numpy(A[om[rank]:om[rank + 1]].copy())
        Bl = torch.from_numpy(B[:, on[rank]:on[rank + 1]].copy())
        for gather in "AB":
            for overlap in (False, True):
                C = gd.allgather_matmul(Al, Bl, gather=gather, overlap=overlap)
                rs, cs = gd.result_slices(M, N, world, rank, gather=gather)
                rows.append((f"{M}x{N}x{K}", f"all-gather {gather}", "overlap" if overlap
                             else "-", rank, tuple(C.shape), _err(C.numpy(), R[rs, cs])))
        pr, pc = gd.grid_shape(world)
        i, j = divmod(rank, pc)
        rs, cs = gd.result_slices(M, N, world, rank, grid=(pr, pc))
        ka, kb = gd.offsets(gd.split_sizes(K, pc)), gd.offsets(gd.split_sizes(K, pr))
        Ab = torch.from_numpy(A[rs, ka[j]:ka[j + 1]].copy())
        Bb = torch.from_numpy(B[kb[i]:kb[i + 1], cs].copy())
        for pipelined in (False, True):
            C = gd.summa(Ab, Bb, grid=(pr, pc), pipelined=pipelined, panel=2)
            rows.append((f"{M}x{N}x{K}", f"SUMMA {pr}x{pc}", "pipelined" if pipelined else "-",
                         rank, tuple(C.shape), _err(C.numpy(), R[rs, cs])))
    # the timeline: A gathered, without and with overlap; SUMMA pipelined
    s = timeline_size
    g = torch.Generator().manual_seed(1)
    Al = torch.rand(s // world, s, generator=g)
    Bl = torch.rand(s, s, generator=g)
    tl = gd.Timeline(rank)
    for _ in range(2):                           # the second round is the one drawn
        gd.allgather_matmul(Al, Bl, gather="A", overlap=False, timeline=tl)
        gd.allgather_matmul(Al, Bl, gather="A", overlap=True, chunks=3, timeline=tl)
    pr, pc = gd.grid_shape(world)
    Ab = torch.rand(s // pr, s // pc, generator=g)
    Bb = torch.rand(s // pr, s // pc, generator=g)
    gd.summa(Ab, Bb, grid=(pr, pc), panel=s // (2 * pc), timeline=tl)
    return rows, tl.gather()


def _err(C, R) -> float:
    if R.size == 0:
        return 0.0
    return float(np.abs(C - R).max() / max(np.abs(R).max(), 1e-30))


def run_demo(P: int = 4, timeout: float = 240.0):
    """:func:`demo` on ``P`` CPU processes; returns (check rows of every rank, records)."""
    from gemmlib import distributed as gd

    out = gd.spawn_cpu(demo, P, timeout=timeout)
    rows = [row for rows, _ in out for row in rows]
    return sorted(rows, key=lambda r: (r[0], r[1], r[2], r[3])), out[0][1]


# --------------------------------------------------------------------------
# Committed multi-GPU results


def distributed_files(directory=None):
    """[(file name, data)] of results/distributed-*.json measured on GPUs (CPU runs of the
    script's --cpu mode are skipped), oldest first."""
    from gemmcourse import notebook as nb

    files = nb.committed_json("distributed-*.json", directory)
    return [(n, d) for n, d in files if isinstance(d, dict)
            and d.get("meta", {}).get("device") == "gpu"]


def scaling_rows(data) -> list[tuple]:
    """Table rows of one file: dtype, scaling, algorithm, engine, options, ms, TFLOP/s,
    efficiency, compute / comm / overlap ms from the timeline."""
    out = []
    for r in data.get("rows", []):
        if "median_ms" not in r:
            continue
        tl = r.get("timeline") or {}
        f = lambda k: f"{tl[k]:.3f}" if isinstance(tl.get(k), (int, float)) else "-"  # noqa: E731
        out.append((r["dtype"], r["scaling"], r["algorithm"], r["engine"],
                    ", ".join(f"{k}={v}" for k, v in r["options"].items()),
                    f"{r['median_ms']:.3f}", f"{r['tflops']:.0f}",
                    f"{100 * r['efficiency']:.1f}%", f(("compute_ms")), f("comm_ms"),
                    f("overlap_ms")))
    return out


def show_distributed_results(directory=None) -> int:
    """Tables, targets and a measured timeline for each committed multi-GPU run; returns how
    many files there were (0: says so plainly)."""
    from IPython.display import display

    from gemmcourse import notebook as nb

    files = distributed_files(directory)
    if not files:
        print("No multi-GPU measurement is committed yet: results/distributed-<gpu>-x<P>-"
              "<date>.json appears once `bash scripts/distributed_gpu.sh` has run on a machine "
              "with several GPUs. None was lent while this chapter was written, so the numbers "
              "above are the paper model's and the timeline is from CPU processes.")
        return 0
    plt = _plt()
    for name, data in files:
        m = data["meta"]
        display(nb.Table(("all-gather MiB", "ms", "algbw GB/s", "busbw GB/s"),
                         [(f"{r['bytes'] / 2**20:.0f}", f"{r['time_ms']:.3f}",
                           f"{r['algbw_gbs']:.0f}", f"{r['busbw_gbs']:.0f}")
                          for r in data.get("allgather_bandwidth", [])],
                         caption=f"NCCL all-gather on {m.get('processes')} x {m.get('gpu')} "
                                 f"({name})"))
        display(nb.Table(("dtype", "scaling", "algorithm", "engine", "options", "ms",
                          "TFLOP/s", "efficiency", "compute ms", "comm ms", "overlap ms"),
                         scaling_rows(data), caption=f"{name}: the slowest rank, median"))
        for t in data.get("targets", []):
            print(("[met]    " if t["met"] else "[missed] ") + t["what"])
        for key, recs in list(data.get("timelines", {}).items())[:2]:
            plot_timeline(recs, title=f"measured on {m.get('gpu')}: {key}")
            plt.show()
    return len(files)
