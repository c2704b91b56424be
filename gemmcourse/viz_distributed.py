"""Figures, the paper model and the live demo of chapter 19 (distributed GEMM).

* The paper model: :func:`comm_bytes` (bytes each GPU receives), :func:`flops_per_gpu`,
  :func:`comm_time` / :func:`model_times` (time on one GPU's link and its arithmetic),
  :func:`pipeline_time` (the wall time of a chunked, overlapped schedule), and
  :func:`plot_ratio` / :func:`plot_model_efficiency` / :func:`winner` drawn from them.
  Rates come from committed single-GPU measurements (:func:`rates`); the link bandwidth
  is an assumption until a multi-GPU run has measured it (:func:`link_bandwidth`).
* The live demo: :func:`demo` runs on CPU processes joined by gloo
  (``gemmlib.distributed.spawn_cpu``) -- every algorithm and transport on tiny uneven
  shapes checked against NumPy, the buffer-lifetime experiment (:func:`lifetime_demo`),
  then a recorded timeline; :func:`run_demo` starts it from a notebook.
* :func:`plot_timeline` draws recorded spans (compute and communication lanes per rank).
* The committed multi-GPU measurements (``scripts/distributed_gpu.py``):
  :func:`distributed_files`, :func:`scaling_table` (each algorithm's best time per way of
  moving the data), :func:`findings` (what they add up to, computed),
  :func:`plot_measured_timelines` / :func:`timeline_breakdown` (the recorded spans of one
  call on every GPU), :func:`block_files` / :func:`block_table` (the tensor-parallel layer),
  :func:`show_distributed_results` (every row).

matplotlib is imported only when drawing.
"""

from __future__ import annotations

import math

import numpy as np

#: what each algorithm is called in the figures
NAMES = {"gather_A": "1-D, all-gather A", "gather_B": "1-D, all-gather B", "summa": "SUMMA",
         "reduce_scatter": "row-parallel, reduce-scatter"}
COLOURS = {"gather_A": "#1f77b4", "gather_B": "#ff7f0e", "summa": "#2ca02c",
           "reduce_scatter": "#9467bd",
           "compute": "#b6d7a8", "comm": "#9fc5e8", "copy": "#f9cb9c", "call": "#dddddd",
           "copy engine": "#e69138", "barrier": "#999999"}
#: NVLink 4 on an H200 (SXM): 450 GB/s each way per GPU by the datasheet; NCCL's all-gather
#: reaches ~80% of it. An assumption, used until a run has measured the link.
ASSUMED_BUSBW_GBS = 360.0
#: H200 rates measured in this repository (results/bench-nvidia-h200-2026-11-2*.json), used
#: when the files cannot be read: TFLOP/s at 8192^3
MEASURED_H200 = {"fp16": {"cublas": 753.1, "gemmlib": 606.2},
                 "bf16": {"cublas": 781.7, "gemmlib": 634.4},
                 "fp32": {"cublas": 51.2, "gemmlib": 51.2 * 0.9}}
BYTES = {"fp16": 2, "bf16": 2, "fp32": 4}
#: the GPU whose committed multi-GPU runs chapter 19b's prose describes; the readers of the
#: committed runs take ``gpu=`` for another (``meta.gpu``, e.g. "NVIDIA H100 80GB HBM3") or
#: ``gpu=None`` for every GPU
PAGE_GPU = "NVIDIA H200"


def _plt():
    import matplotlib.pyplot as plt

    return plt


def _legible(fig):
    """The course's rule for every figure: fit the book's column, text of 9 pt or more."""
    from gemmcourse.viz import legible

    return legible(fig)


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
    """TFLOP/s of one H200 at 8192^3, gemmlib and cuBLAS, by dtype: from the single-GPU rows of
    the newest committed multi-GPU run (measured with the same code, in the same run, as its
    multi-GPU rows), else from chapter 17's committed benchmarks, else MEASURED_H200."""
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
        for _, data in distributed_files()[-1:]:
            for r in data.get("single", []):
                if r.get("M") == 8192 and r.get("dtype") in out and r.get("engine") in (
                        "cublas", "gemmlib"):
                    out[r["dtype"]][r["engine"]] = float(r["tflops"])
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
            best = (r["busbw_gbs"], f"measured: NCCL's all-gather of {r['bytes'] / 2**20:.0f} "
                    f"MiB on {data['meta'].get('processes')} x {data['meta'].get('gpu')}")
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
    fig, ax = plt.subplots(figsize=(7.4, 3.4))
    for alg in ("gather_A", "summa"):
        ax.plot(Ps, [bytes_per_flop(alg, n, n, n, P, BYTES[dtype]) for P in Ps], "o-",
                color=COLOURS[alg], label=NAMES[alg] + (" (= gather B for a square)"
                                                         if alg == "gather_A" else ""))
    for P in Ps:
        g = grid_shape(P)
        ax.annotate(f"{g[0]}x{g[1]}", (P, bytes_per_flop("summa", n, n, n, P, BYTES[dtype])),
                    textcoords="offset points", xytext=(0, -14), ha="center", fontsize=9)
    ax.set_xlabel("GPUs P (SUMMA's grid under its points)")
    ax.set_ylabel("bytes received per flop")
    ax.set_title(f"Communication per flop on each GPU, {n}^3 {dtype} (on paper)")
    ax.legend(fontsize=9)
    fig.tight_layout()
    return _legible(fig)


def plot_model_efficiency(P: int = 4, dtype="fp16", busbw_gbs=None, sizes=None, note=""):
    """Modelled efficiency (one GPU's share of the time / wall time) against the per-GPU size
    s, weak scaling as scripts/distributed_gpu.py runs it, with and without overlap."""
    plt = _plt()
    bw = busbw_gbs or ASSUMED_BUSBW_GBS
    sizes = sizes or [512, 1024, 2048, 4096, 8192, 16384]
    pr, pc = grid_shape(P)
    fig, ax = plt.subplots(figsize=(7.4, 4.0))
    for alg in ("gather_A", "summa"):
        ser, ovl = [], []
        for s in sizes:
            M, N, K = (s, s * P, s) if alg == "gather_A" else (s * pr, s * pc, s)
            t = model_times(alg, M, N, K, P, dtype, busbw_gbs=bw)
            ser.append(100 * t["efficiency_serial"])
            ovl.append(100 * t["efficiency_overlapped"])
        ax.plot(sizes, ovl, "o-", color=COLOURS[alg], label=f"{NAMES[alg]}, overlapped")
        ax.plot(sizes, ser, "s--", color=COLOURS[alg], alpha=0.6, label=f"{NAMES[alg]}, not")
    ax.axhline(90, color="k", lw=0.6, ls=":")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("per-GPU size s (each GPU multiplies s x s by s x s)")
    ax.set_ylabel("efficiency, %")
    ax.set_ylim(0, 102)
    ax.set_title(f"Modelled weak scaling on {P} GPUs, {dtype}: {rates()[dtype]['gemmlib']:.0f} "
                 f"TFLOP/s per GPU, link {bw:.0f} GB/s {note}")
    ax.legend(fontsize=9, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2,
              frameon=False)
    fig.tight_layout()
    return _legible(fig)


def plot_winner_map(P: int = 8, K: int = 8192, dtype="fp16"):
    """Which algorithm moves the fewest bytes per GPU, over output shapes M x N."""
    plt = _plt()
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    exps = np.arange(8, 17)
    algs = ("gather_A", "gather_B", "summa")
    grid = np.array([[algs.index(winner(2**m, 2**n, K, P, BYTES[dtype])) for n in exps]
                     for m in exps])
    fig, ax = plt.subplots(figsize=(6.0, 4.1))
    ax.imshow(grid, origin="lower", cmap=ListedColormap([COLOURS[a] for a in algs]),
              vmin=0, vmax=2)
    ax.set_xticks(range(len(exps)), [f"$2^{{{e}}}$" for e in exps], fontsize=9)
    ax.set_yticks(range(len(exps)), [f"$2^{{{e}}}$" for e in exps], fontsize=9)
    ax.set_xlabel("N")
    ax.set_ylabel("M")
    ax.legend(handles=[Patch(color=COLOURS[a], label=NAMES[a]) for a in algs], fontsize=9,
              loc="upper left", bbox_to_anchor=(1.02, 1))
    ax.set_title(f"Fewest bytes per GPU, P = {P}, K = {K}")
    fig.tight_layout()
    return _legible(fig)


# --------------------------------------------------------------------------
# Timelines


def short_label(label: str) -> str:
    """A call's label as a figure names it: 'allgather_matmul gather=A overlap=True chunks=3'
    -> 'gather A, overlap, 3 chunks'."""
    words = dict(w.split("=", 1) for w in label.split() if "=" in w)
    if label.startswith("allgather_matmul"):
        if words.get("transport") in ("copy", "direct"):
            return f"gather {words.get('gather', '?')}, {words['transport']} transport"
        out = f"gather {words.get('gather', '?')}, " + (
            f"overlap, {words.get('chunks', '?')} chunk(s)" if words.get("overlap") == "True"
            else "no overlap")
    elif label.startswith("matmul_reduce_scatter"):
        out = f"reduce-scatter, {words.get('transport', 'nccl')}" + (
            ", overlap" if words.get("overlap") == "True" else "")
    elif label.startswith("summa"):
        out = f"SUMMA {label.split()[1]}, " + ("pipelined" if words.get("pipelined") == "True"
                                               else "not pipelined")
    else:
        out = label
    return out


def plot_timeline(records, title=None, calls=None, unit="ms", ranks=None):
    """Recorded spans (gemmlib.distributed.Timeline.gather()): for each call, a compute lane
    and a communication lane per rank, drawn from the call's start (the earliest rank's), so
    that calls can be compared.  ``calls`` and ``ranks`` select which (default all)."""
    plt = _plt()
    from matplotlib.patches import Patch

    recs = [r for r in records if (calls is None or r["call"] in calls)
            and (ranks is None or r["rank"] in ranks)]
    chosen = sorted({r["call"] for r in recs})
    ranks = sorted({r["rank"] for r in recs})
    lanes = [(c, r, k) for c in chosen for r in ranks for k in ("compute", "comm")]
    per_call = 2 * len(ranks)
    # a lane's row: each call's lanes below a row of its own that holds the call's name
    ys = [n * (per_call + 1) + 1 + i for n in range(len(chosen)) for i in range(per_call)]
    fig, ax = plt.subplots(figsize=(7.4, 0.24 * (len(lanes) + len(chosen)) + 1.7))
    start = {c: min(r["start_ms"] for r in recs if r["call"] == c) for c in chosen}
    end, kinds = 0.0, set()
    for y, (c, rank, kind) in zip(ys, lanes):
        for r in recs:
            if r["call"] != c or r["rank"] != rank or r["kind"] == "call":
                continue
            if ("compute" if r["kind"] in ("compute", "copy") else r["kind"]) != kind:
                continue
            s, e = r["start_ms"] - start[c], r["end_ms"] - start[c]
            ax.barh(y, max(e - s, 1e-6), left=s, height=0.7, color=COLOURS[r["kind"]],
                    edgecolor="k", lw=0.4)
            end = max(end, e)
            kinds.add(r["kind"])
    for n, c in enumerate(chosen):
        label = next((r["label"] for r in recs if r["call"] == c and r["kind"] == "call"), "")
        ax.text(0, n * (per_call + 1), short_label(label), fontsize=9, weight="bold",
                va="center")
        if n:
            ax.axhline(n * (per_call + 1) - 0.5, color="k", lw=0.8)
    ax.set_yticks(ys, [f"rank {r} {'products' if k == 'compute' else 'transfers'}"
                       for _, r, k in lanes], fontsize=9)
    ax.set_ylim(ys[-1] + 0.5 if ys else 1, -0.5)
    ax.set_xlim(0, end * 1.02 if end else 1)
    ax.set_xlabel(f"time from the call's start ({unit})")
    ax.legend(handles=[Patch(color=COLOURS[k], label=lab) for k, lab in
                       (("compute", "product"), ("comm", "collective"), ("copy", "copy"))
                       if k in kinds or k != "copy"],
              fontsize=9, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=3,
              frameon=False)
    if title:
        ax.set_title(title)
    fig.tight_layout()
    return _legible(fig)


# --------------------------------------------------------------------------
# The live demo on CPU processes (gloo)

#: tiny uneven shapes for the live check: M < P, K = 1, and an odd one
DEMO_SHAPES = [(13, 7, 11), (3, 10, 1), (9, 2, 6)]


def demo(rank: int, world: int, timeline_size: int = 768):
    """Every algorithm and transport on :data:`DEMO_SHAPES`, checked against a float64 NumPy
    product; the buffer-lifetime experiment (:func:`lifetime_demo`); then three calls
    recorded on a Timeline (larger NumPy products, so that compute shows).  Returns (check
    rows, timeline records, lifetime rows); the records are every rank's."""
    import warnings

    import torch

    from gemmlib import distributed as gd

    warnings.filterwarnings("ignore", category=FutureWarning)   # torch's renames, in gloo's calls
    rows = []
    rng = np.random.default_rng(0)
    for M, N, K in DEMO_SHAPES:
        A = rng.uniform(-1, 1, (M, K)).astype(np.float32)
        B = rng.uniform(-1, 1, (K, N)).astype(np.float32)
        R = A.astype(np.float64) @ B
        om, on = gd.offsets(gd.split_sizes(M, world)), gd.offsets(gd.split_sizes(N, world))
        ok = gd.offsets(gd.split_sizes(K, world))
        Al = torch.from_numpy(A[om[rank]:om[rank + 1]].copy())
        Bl = torch.from_numpy(B[:, on[rank]:on[rank + 1]].copy())
        for gather in "AB":
            rs, cs = gd.result_slices(M, N, world, rank, gather=gather)
            for variant, kw in (("-", dict(overlap=False)), ("overlap", dict(overlap=True)),
                                ("copy", dict(transport="copy")),
                                ("direct", dict(transport="direct"))):
                C = gd.allgather_matmul(Al, Bl, gather=gather, **kw)
                rows.append((f"{M}x{N}x{K}", f"all-gather {gather}", variant, rank,
                             tuple(C.shape), _err(C.numpy(), R[rs, cs])))
        # the row-parallel product: K split, partial sums reduce-scattered by rows of C
        Ak = torch.from_numpy(A[:, ok[rank]:ok[rank + 1]].copy())
        Bk = torch.from_numpy(B[ok[rank]:ok[rank + 1]].copy())
        for variant, kw in (("-", dict(overlap=False)), ("overlap", dict(overlap=True)),
                            ("copy", dict(transport="copy")),
                            ("direct", dict(transport="direct"))):
            C = gd.matmul_reduce_scatter(Ak, Bk, **kw)
            rows.append((f"{M}x{N}x{K}", "reduce-scatter", variant, rank, tuple(C.shape),
                         _err(C.numpy(), R[om[rank]:om[rank + 1]])))
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
    lifetime = lifetime_demo(rank, world)
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
    return rows, tl.gather(), lifetime


def lifetime_demo(rank: int, world: int, shape=(13, 7, 11), chunks: int = 3) -> list[tuple]:
    """The stream-ordering hazard, played on CPU processes: collectives that run *late* (when
    waited on, as NCCL on a busy GPU) and that hold their input only weakly, as a GPU
    collective holds nothing the caching allocator could see.  A staging buffer released
    before its collective ran is counted, and the collective reads NaN in its place (on a
    GPU: whatever the next piece wrote there).  Run with gemmlib's runner, which holds every
    buffer a transfer touches until ``finish()``, and with that hold switched off.  Returns
    rows (gather, chunks, held, buffers released early, largest error or nan)."""
    import weakref

    import torch

    from gemmlib import distributed as gd
    from gemmlib.distributed import _run, allgather

    real_gather, real_hold = allgather._all_gather_flat, _run._Runner._hold
    released = []

    class Late:
        """A handle whose all-gather runs when it is waited on."""

        def __init__(self, out, inp, group):
            self.out, self.group = out, group
            # a view's memory belongs to the caller's tensor, which outlives the call:
            # only freshly made staging buffers are held weakly
            self.view = inp if inp._base is not None else None
            self.inp = weakref.ref(inp)

        def wait(self):
            inp = self.inp()
            if inp is None:
                released.append(self.out.numel())
                inp = torch.full((self.out.numel() // world,), float("nan"),
                                 dtype=self.out.dtype)
            real_gather(self.out, inp, self.group)
            return True

    M, N, K = shape
    rng = np.random.default_rng(2)
    A = rng.uniform(-1, 1, (M, K)).astype(np.float32)
    B = rng.uniform(-1, 1, (K, N)).astype(np.float32)
    R = A.astype(np.float64) @ B
    om, on = gd.offsets(gd.split_sizes(M, world)), gd.offsets(gd.split_sizes(N, world))
    Al = torch.from_numpy(A[om[rank]:om[rank + 1]].copy())
    Bl = torch.from_numpy(B[:, on[rank]:on[rank + 1]].copy())
    out = []
    allgather._all_gather_flat = lambda o, i, group, async_op=False: (
        Late(o, i, group) if async_op else real_gather(o, i, group))
    try:
        for held in (True, False):
            _run._Runner._hold = real_hold if held else (lambda self, keep: None)
            for gather in "AB":
                released.clear()
                C = gd.allgather_matmul(Al, Bl, gather=gather, overlap=True, chunks=chunks)
                rs, cs = gd.result_slices(M, N, world, rank, gather=gather)
                out.append((gather, chunks, held, len(released), _err(C.numpy(), R[rs, cs])))
    finally:
        allgather._all_gather_flat, _run._Runner._hold = real_gather, real_hold
    return out


def _err(C, R) -> float:
    if R.size == 0:
        return 0.0
    return float(np.abs(C - R).max() / max(np.abs(R).max(), 1e-30))


def run_demo(P: int = 4, timeout: float = 240.0):
    """:func:`demo` on ``P`` CPU processes; returns (check rows of every rank, timeline
    records, lifetime rows of every rank as (rank, *row))."""
    from gemmlib import distributed as gd

    out = gd.spawn_cpu(demo, P, timeout=timeout)
    rows = [row for rows, _, _ in out for row in rows]
    lifetime = [(r, *row) for r, (_, _, life) in enumerate(out) for row in life]
    return sorted(rows, key=lambda r: (r[0], r[1], r[2], r[3])), out[0][1], lifetime


def check_summary(rows) -> list[tuple]:
    """The live check's rows folded per algorithm: its variants, blocks checked, shapes, ranks,
    largest relative error."""
    order = ("all-gather A", "all-gather B", "reduce-scatter")
    variants = ("-", "overlap", "pipelined", "copy", "direct")
    groups: dict = {}
    for shape, alg, variant, rank, _, err in rows:
        g = groups.setdefault(alg, dict(n=0, v=set(), shapes=set(), ranks=set(), err=0.0))
        g["n"] += 1
        g["v"].add(variant)
        g["shapes"].add(shape)
        g["ranks"].add(rank)
        g["err"] = max(g["err"], err)
    key = lambda a: (order.index(a) if a in order else len(order), a)  # noqa: E731
    return [(alg, ", ".join(("plain" if v == "-" else v) for v in variants if v in g["v"]),
             g["n"], len(g["shapes"]), len(g["ranks"]), f"{g['err']:.1e}")
            for alg, g in sorted(groups.items(), key=lambda kv: key(kv[0]))]


def lifetime_table(lifetime) -> list[tuple]:
    """The lifetime experiment per (held, gather): buffers released early on each rank, and
    whether every rank's block is right."""
    out = []
    for held in (True, False):
        for gather in "AB":
            rs = [r for r in lifetime if r[3] == held and r[1] == gather]
            early = ", ".join(str(r[4]) for r in sorted(rs))
            right = all(np.isfinite(r[5]) and r[5] < 1e-5 for r in rs)
            out.append(("held until finish()" if held else "released when Python drops them",
                        f"gather {gather}, {rs[0][2]} chunks", early,
                        "right" if right else "WRONG (NaN where a buffer was lost)"))
    return out


# --------------------------------------------------------------------------
# Committed multi-GPU results


def distributed_files(directory=None, gpu=PAGE_GPU):
    """[(file name, data)] of the committed multi-GPU runs, results/distributed-<gpu>-x<P>-
    <date>.json measured on GPUs (CPU runs of the script's --cpu mode and the tensor-parallel
    block's files are skipped): the newest per GPU and process count, by process count; those
    of ``gpu`` (its ``meta.gpu``; by default the page's, :data:`PAGE_GPU`), or of every GPU
    for ``gpu=None``."""
    from gemmcourse import notebook as nb

    files = nb.committed_json("distributed-*.json", directory)
    return _newest_gpu_runs(((n, d) for n, d in files if not n.startswith("distributed-block-")),
                            gpu)


def block_files(directory=None, gpu=PAGE_GPU):
    """[(file name, data)] of the tensor-parallel block's committed runs
    (results/distributed-block-<gpu>-x<P>-<date>.json), the newest per GPU and process count;
    ``gpu`` as in :func:`distributed_files`."""
    from gemmcourse import notebook as nb

    return _newest_gpu_runs(nb.committed_json("distributed-block-*.json", directory), gpu)


def _newest_gpu_runs(files, gpu=None) -> list:
    """Of (name, data) pairs, the GPU runs only (of ``gpu`` alone unless it is None), the
    newest per GPU and process count, ordered by process count."""
    best: dict = {}
    for n, d in files:
        m = d.get("meta", {}) if isinstance(d, dict) else {}
        if m.get("device") != "gpu" or (gpu is not None and m.get("gpu") != gpu):
            continue
        key = (m.get("gpu"), m.get("processes"))
        if key not in best or (str(m.get("date", "")), n) > best[key][0]:
            best[key] = ((str(m.get("date", "")), n), n, d)
    return [(n, d) for _, n, d in sorted(best.values(), key=lambda v: (
        v[2]["meta"].get("processes") or 0, str(v[2]["meta"].get("gpu"))))]


#: how a measured row moved its data, as the summary table's columns
WAYS = ("nccl", "nccl overlap", "copy", "direct", "torch", "async-TP")
WAY_NAMES = {"nccl": "NCCL", "nccl overlap": "NCCL, overlapped", "copy": "copy engines",
             "direct": "direct reads", "torch": "torch.matmul + NCCL",
             "async-TP": "torch async-TP"}
#: the same, as a table's column heads
WAY_HEADS = {"nccl": "NCCL", "nccl overlap": "NCCL overlap", "copy": "copy", "direct": "direct",
             "torch": "torch + NCCL", "async-TP": "async-TP"}
#: the algorithms as a table's rows name them
SHORT = {"gather_A": "gather A", "gather_B": "gather B", "reduce_scatter": "reduce-scatter",
         "summa": "SUMMA"}
#: the algorithms in the order the page introduces them
ALGORITHMS = ("gather_A", "gather_B", "reduce_scatter", "summa")


def way(row) -> str | None:
    """The column a measured row belongs to: gemmlib's schedules by transport and overlap
    (SUMMA's pipelined panels count as overlapped); torch.matmul + NCCL ("torch plain") and
    torch's fused async tensor parallel; None for gemmlib's schedules run with torch.matmul
    as the local product (they are in the full table only)."""
    eng, o = row.get("engine"), row.get("options") or {}
    if eng == "torch plain":
        return "torch"
    if eng == "torch async-TP":
        return "async-TP"
    if eng != "gemmlib":
        return None
    t = o.get("transport", "nccl")
    if t in ("copy", "direct"):
        return t
    return "nccl overlap" if (o.get("overlap") or o.get("pipelined")) else "nccl"


def best_rows(data, dtype: str = "fp16") -> dict:
    """{(scaling, algorithm, way): the fastest measured row of that kind}."""
    out: dict = {}
    for r in data.get("rows", []):
        w = way(r)
        if w is None or r.get("dtype") != dtype or "median_ms" not in r:
            continue
        key = (r["scaling"], r["algorithm"], w)
        if key not in out or r["median_ms"] < out[key]["median_ms"]:
            out[key] = r
    return out


def options_text(o: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(o.items())) or "defaults"


def _gpus(files) -> str:
    """The GPUs of some runs, for a caption ("NVIDIA H200", or two joined by "and")."""
    names = sorted({str(d["meta"].get("gpu", "GPU")) for _, d in files}) or ["GPU"]
    return " and ".join(names)


def scaling_table(files, scaling: str, dtype: str = "fp16"):
    """One nb.Table: for each committed run (P GPUs) and algorithm, the fastest time of each
    way of moving the data, "ms (efficiency)", the fastest of the row marked *."""
    from gemmcourse import notebook as nb

    rows = []
    for _, data in files:
        P = data["meta"].get("processes")
        best = best_rows(data, dtype)
        for alg in ALGORITHMS:
            cells = {w: best.get((scaling, alg, w)) for w in WAYS}
            have = [r for r in cells.values() if r is not None]
            if not have:
                continue
            fastest = min(r["median_ms"] for r in have)
            rows.append((P, SHORT[alg], *[
                "-" if r is None else f"{r['median_ms']:.2f} ({100 * r['efficiency']:.1f}%)"
                + (" *" if r["median_ms"] == fastest else "") for r in cells.values()]))
    gpu = _gpus(files)
    what = ("each GPU multiplies 8192^3 (weak scaling)" if scaling == "weak" else
            "P GPUs share one 16384^3 product (strong scaling)")
    return nb.Table(("GPUs", "algorithm", *[WAY_HEADS[w] for w in WAYS]), rows,
                    caption=f"{dtype} on {gpu}s, {what}: ms (scaling efficiency); "
                            "* the fastest of its row")


def findings(files, dtype: str = "fp16") -> list[str]:
    """What the committed runs add up to, as sentences computed from them (so that a new run
    changes the sentences with the numbers)."""
    out = []
    one_d = ("gather_A", "gather_B", "reduce_scatter")
    copy_vs_nccl, torch_vs_copy, atp_vs_copy, slower = [], {}, [], []
    for _, data in files:
        P = data["meta"].get("processes")
        best = best_rows(data, dtype)
        weak = [(r["efficiency"], alg, r) for (sc, alg, w), r in best.items()
                if sc == "weak" and w in ("nccl overlap", "copy", "direct")]
        if weak:
            eff, alg, r = max(weak, key=lambda t: t[0])
            opts = {k: v for k, v in r["options"].items() if k != "transport"}
            out.append(f"{P} GPUs, {dtype} weak scaling: the best overlapped schedule reached "
                       f"{100 * eff:.1f}% ({NAMES[alg]}, {WAY_NAMES[way(r)]}"
                       + (f", {options_text(opts)}" if opts else "") + "); "
                       + ("at or above" if eff >= 0.9 else "below") + " the 90% aimed for.")
        for sc in ("weak", "strong"):
            for alg in one_d:
                c, n = best.get((sc, alg, "copy")), best.get((sc, alg, "nccl overlap"))
                t, a = best.get((sc, alg, "torch")), best.get((sc, alg, "async-TP"))
                d = best.get((sc, alg, "direct"))
                if c and n:
                    copy_vs_nccl.append(c["median_ms"] < n["median_ms"])
                if c and t:
                    torch_vs_copy.setdefault(sc, []).append(t["median_ms"] < c["median_ms"])
                if c and a:
                    atp_vs_copy.append(a["median_ms"] < c["median_ms"])
                if c and d:
                    slower.append(d["median_ms"] / c["median_ms"])
    if copy_vs_nccl:
        out.append(f"Copy engines against NCCL overlapped (1-D and row-parallel, weak and "
                   f"strong, every GPU count): faster in {sum(copy_vs_nccl)} of "
                   f"{len(copy_vs_nccl)} configurations.")
    for sc, wins in torch_vs_copy.items():
        out.append(f"torch.matmul + NCCL against gemmlib's copy engines, {sc} scaling: "
                   f"torch faster in {sum(wins)} of {len(wins)}.")
    if atp_vs_copy:
        out.append(f"torch's async tensor parallel against gemmlib's copy engines: torch faster "
                   f"in {sum(atp_vs_copy)} of {len(atp_vs_copy)}.")
    if slower:
        out.append(f"Direct reads of the peers' memory: {min(slower):.1f} to {max(slower):.1f} "
                   f"times the copy engines' time.")
    return out


def timeline_key(dtype, scaling, alg, options, engine="gemmlib") -> str:
    """The key of a recorded timeline in a results file."""
    import json

    return f"{dtype} {scaling} {alg} {engine} {json.dumps(options, sort_keys=True)}"


def single_ms(data, scaling="weak", dtype="fp16", engine="gemmlib"):
    """One GPU's time for the per-GPU (weak) or whole (strong) product in the same run."""
    return next((r["median_ms"] for r in data.get("single", []) if r.get("scaling") == scaling
                 and r.get("dtype") == dtype and r.get("engine") == engine), None)


def _span_colour(r) -> str:
    if r["kind"] in ("compute", "copy"):
        return COLOURS["compute"]
    if r["label"].startswith("copy") or "+ copy" in r["label"]:
        return COLOURS["copy engine"]
    if "barrier" in r["label"]:
        return COLOURS["barrier"]
    return COLOURS["comm"]


def plot_measured_timelines(data, keys, titles=None, ranks=None, reference_ms=None):
    """Recorded spans of one call on every GPU, one panel per timeline key (same time axis):
    a row per rank, its products below and its transfers above (NCCL's collectives, the
    copy engines' copies, the staging + barrier).  Each rank's times are its own CUDA events
    from the call's start on that rank.  ``reference_ms``: one GPU's time for the same
    per-GPU product, drawn as a dashed line."""
    plt = _plt()
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    recs = {k: data["timelines"][k] for k in keys}
    all_ranks = sorted({r["rank"] for k in keys for r in recs[k]})
    ranks = list(ranks) if ranks is not None else all_ranks
    titles = titles or list(keys)
    n = len(keys)
    fig, axes = plt.subplots(n, 1, figsize=(7.4, 0.36 * len(ranks) * n + 0.7 * n + 1.1),
                             sharex=True, squeeze=False)
    end = 0.0
    for ax, key, title in zip(axes[:, 0], keys, titles):
        for y, rank in enumerate(ranks):
            for r in recs[key]:
                if r["rank"] != rank or r["kind"] == "call":
                    continue
                s, e = r["start_ms"], r["end_ms"]
                up = r["kind"] == "comm"
                ax.barh(y + (-0.2 if up else 0.2), max(e - s, 1e-4), left=s, height=0.38,
                        color=_span_colour(r), edgecolor="k", lw=0.4)
                if r["label"] == "own shard":
                    ax.text((s + e) / 2, y + 0.2, "own rows", ha="center", va="center",
                            fontsize=9)
                end = max(end, e)
            call = [r for r in recs[key] if r["rank"] == rank and r["kind"] == "call"]
            if call:
                ax.plot([call[0]["end_ms"]] * 2, [y - 0.45, y + 0.45], color="k", lw=1.6)
        if reference_ms:
            ax.axvline(reference_ms, color="#cc0000", ls="--", lw=1.2)
        ax.set_yticks(range(len(ranks)), [f"GPU {r}" for r in ranks])
        ax.set_ylim(len(ranks) - 0.5, -0.5)
        ax.set_title(title, loc="left")
    axes[-1, 0].set_xlim(0, end * 1.03 if end else 1)
    axes[-1, 0].set_xlabel("ms from the call's start on each GPU (its own CUDA events)")
    handles = [Patch(color=COLOURS["compute"], label="product"),
               Patch(color=COLOURS["comm"], label="NCCL collective"),
               Patch(color=COLOURS["copy engine"], label="copy-engine copy"),
               Patch(color=COLOURS["barrier"], label="stage + barrier"),
               Line2D([], [], color="k", lw=1.6, label="the call returns")]
    if reference_ms:
        handles.append(Line2D([], [], color="#cc0000", ls="--",
                              label=f"one GPU alone ({reference_ms:.2f} ms)"))
    axes[-1, 0].legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.36),
                       ncol=3, frameon=False)
    fig.tight_layout()
    return _legible(fig)


def timeline_breakdown(data, keys, names=None) -> list[tuple]:
    """Per recorded call (median over the GPUs): when the first product started, how long the
    product of the rank's own shard took and the median of the others, the products' and the
    transfers' busy time, and when the call returned (ms)."""
    from statistics import median

    from gemmlib.distributed import summarize

    out = []
    for key, name in zip(keys, names or keys):
        recs = data["timelines"][key]
        summ = {s["rank"]: s for s in summarize(recs)}
        per = []
        for rank in sorted(summ):
            prods = sorted((r for r in recs if r["rank"] == rank and r["kind"] == "compute"),
                           key=lambda r: r["start_ms"])
            own = [r["end_ms"] - r["start_ms"] for r in prods if r["label"] == "own shard"]
            rest = [r["end_ms"] - r["start_ms"] for r in prods if r["label"] != "own shard"]
            per.append((prods[0]["start_ms"] if prods else float("nan"),
                        own[0] if own else float("nan"),
                        median(rest) if rest and own else float("nan"),
                        summ[rank]["compute_ms"], summ[rank]["comm_ms"], summ[rank]["wall_ms"]))
        cols = list(zip(*per))
        f = lambda v: "-" if v != v else f"{v:.2f}"  # noqa: E731
        out.append((name, *[f(median(c)) for c in cols]))
    return out


def block_table(files):
    """The tensor-parallel layer: one row per run and phase, tokens/s of each engine with its
    share of torch's (torch.matmul + NCCL)."""
    from gemmcourse import notebook as nb

    engines = ("torch", "torch async-TP", "gemmlib nccl", "gemmlib copy")
    rows, diff = [], 0.0
    for _, data in files:
        got = {}
        for r in data.get("rows", []):
            if "tok_s" in r:
                got[(r["phase"], r["tokens"], r["engine"])] = r
                if r["engine"].startswith("gemmlib"):
                    diff = max(diff, r["rel_diff_vs_torch"])
        for phase, tokens in sorted({k[:2] for k in got}, key=lambda k: -k[1]):
            cells = []
            for e in engines:
                r = got.get((phase, tokens, e))
                cells.append("-" if r is None else f"{r['tok_s']:,.0f}" + (
                    "" if e == "torch" else f" ({r['pct_torch']:.1f}%)"))
            rows.append((data["meta"].get("processes"), f"{phase}, {tokens} tokens", *cells))
    gpu = _gpus(files)
    return nb.Table(("GPUs", "phase", "torch.matmul + NCCL", "torch async-TP", "gemmlib, NCCL",
                     "gemmlib, copy engines"), rows,
                    caption=f"tokens/s (share of torch.matmul + NCCL's) of one Llama-3.1-8B "
                            f"layer's four projections in bf16 on {gpu}s; gemmlib's outputs "
                            f"differ from torch's by at most {diff:.1e} (relative)")


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


def configuration_tables(data, where: str):
    """:func:`scaling_rows` as two tables (a :class:`gemmcourse.notebook.Tables`), each
    narrow enough for the text column: the time of every configuration, then the recorded
    timeline's busy times of those that have one."""
    from gemmcourse import notebook as nb

    rows = [(f"{r[0]} {r[1]}", *r[2:]) for r in scaling_rows(data)]
    key = ("run", "algorithm", "engine", "options")
    return nb.Tables((
        nb.Table(key + ("ms", "TFLOP/s", "efficiency"), [r[:7] for r in rows],
                 caption=f"{where}: every configuration (the slowest GPU, median)"),
        nb.Table(key + ("compute ms", "comm ms", "overlap ms"),
                 [r[:4] + r[7:] for r in rows if r[7:] != ("-", "-", "-")],
                 caption=f"{where}: one more call, recorded: the time spent computing, "
                         "communicating and both at once (median over the GPUs)")))


def show_distributed_results(directory=None, timelines: bool = True, gpu=PAGE_GPU) -> int:
    """Every row of each committed multi-GPU run (of ``gpu``, as in :func:`distributed_files`):
    NCCL's all-gather bandwidth, the rows, the targets, and (``timelines``) the first two
    recorded timelines; returns how many runs there were (0: says so plainly)."""
    from IPython.display import display

    from gemmcourse import notebook as nb

    files = distributed_files(directory, gpu)
    if not files:
        print("No multi-GPU measurement is committed: results/distributed-<gpu>-x<P>-"
              "<date>.json appears once `bash scripts/distributed_gpu.sh` has run on a machine "
              "with several GPUs. Until then the numbers above are the paper model's and the "
              "timeline is from CPU processes.")
        return 0
    plt = _plt()
    for name, data in files:
        m = data["meta"]
        where = f"{m.get('processes')} x {m.get('gpu')}"
        display(nb.Table(("all-gather MiB", "ms", "algbw GB/s", "busbw GB/s"),
                         [(f"{r['bytes'] / 2**20:.0f}", f"{r['time_ms']:.3f}",
                           f"{r['algbw_gbs']:.0f}", f"{r['busbw_gbs']:.0f}")
                          for r in data.get("allgather_bandwidth", [])],
                         caption=f"NCCL's all-gather on {where}"))
        display(configuration_tables(data, where))
        for t in data.get("targets", []):
            print(("[met]    " if t["met"] else "[missed] ") + t["what"])
        if timelines:
            for key, recs in list(data.get("timelines", {}).items())[:2]:
                plot_timeline(recs, title=f"measured on {m.get('gpu')}: {key}")
                plt.show()
    return len(files)
