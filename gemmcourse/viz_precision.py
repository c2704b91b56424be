"""Figures and tables for chapter 16: the multistage tensor-core pipeline and its precisions.

* :func:`pipeline_schedule` / :func:`plot_pipeline`: a STAGES-deep ``cp.async`` ring,
  computed from the kernel's own rules (tile ``kt + STAGES - 1`` is issued when tile
  ``kt`` starts, tile ``kt`` waits for its copy, ``kt % STAGES`` is its buffer).
* :func:`precision_records` / :func:`precision_table` / :func:`plot_precision_bars`:
  the committed ``results/bench-<gpu>-<date>-precision.json`` against cuBLAS in the
  same precision (3xtf32 against cuBLAS fp32), with the course's targets judged from
  the data.
* :func:`plot_accuracy`: ``results/accuracy-<gpu>-<date>.json``, relative error against K.
* :func:`plot_roofline_tc`: the roofline with the SIMT fp32 roof, the datasheet
  tensor-core roofs and the measured ``mma.sync`` ceilings.
* :func:`roof_table` / :func:`show_mma_roof`: ``results/mma-roof-<gpu>.json``
  (:mod:`gemmcourse.mma_roof`), the ceiling of ``mma.sync`` against cuBLAS and the
  production rung.

Nothing here invents a measurement: every plotted number comes from a results file
(or, for the schedule, from made-up durations that the figure says are schematic).
"""

from __future__ import annotations

import math

from gemmcourse.viz import legible

PRECISION_ORDER = ("fp16", "bf16", "tf32", "3xtf32")
ACCURACY_ORDER = ("fp32", "tf32", "3xtf32", "fp16", "bf16")
COLOURS = {"fp32": "#444444", "tf32": "#1f77b4", "3xtf32": "#2ca02c", "fp16": "#d62728",
           "bf16": "#9467bd"}

#: Dense tensor-core peaks from NVIDIA's H100 / H200 SXM datasheets (TFLOP/s, no sparsity).
#: Not measured here: plots label them "datasheet".
DATASHEET_TC_TFLOPS = {"fp16": 989.4, "bf16": 989.4, "tf32": 494.7}

#: The course's targets: % of cuBLAS in the same precision (3xtf32: see :func:`judge`).
PCT_TARGETS = {"fp16": 60.0, "bf16": 60.0, "tf32": 60.0}
#: 3xtf32 must beat cuBLAS fp32 SGEMM with an error at most this factor above cuBLAS fp32's.
ERROR_FACTOR_3XTF32 = 2.0

NOT_MEASURED = "not measured yet"


def _plt():
    import matplotlib.pyplot as plt

    return plt


# --------------------------------------------------------------------------
# The pipeline


def pipeline_schedule(stages: int = 4, tiles: int = 8, latency: float = 3.0,
                      compute: float = 1.0):
    """The schedule of a ``stages``-deep cp.async ring over ``tiles`` k-tiles.

    Returns ``(tile, start, end, kind)`` tuples, ``kind`` "copy" (the cp.async of
    that k-tile, ``latency`` long, into buffer ``tile % stages``) or "compute" (the
    tensor-core work on it, ``compute`` long), copies first.  The rules are the
    kernel's: the prologue issues tiles ``0 .. stages-2`` at time 0; iteration ``kt``
    waits until tile ``kt`` has landed (``cp.async.wait_group(stages - 2)``) and the
    previous tile is computed, then issues tile ``kt + stages - 1`` (into the buffer
    tile ``kt - 1`` just freed) and computes tile ``kt``.
    """
    if stages < 2:
        raise ValueError(f"a ring needs at least 2 stages, got {stages}")
    if tiles < 0:
        raise ValueError(f"tiles must be >= 0, got {tiles}")
    copy_start = {t: 0.0 for t in range(min(stages - 1, tiles))}
    comp = {}
    prev_end = 0.0
    for kt in range(tiles):
        start = max(copy_start[kt] + latency, prev_end)
        nxt = kt + stages - 1
        if nxt < tiles:
            copy_start[nxt] = start
        comp[kt] = (start, start + compute)
        prev_end = start + compute
    out = [(t, s, s + latency, "copy") for t, s in sorted(copy_start.items())]
    out += [(t, s, e, "compute") for t, (s, e) in sorted(comp.items())]
    return out


def tensor_core_idle(schedule) -> float:
    """Fraction of the time from the first compute to the last with the tensor cores idle
    (the prologue, which no pipeline can hide, is left out)."""
    comp = [(s, e) for _, s, e, k in schedule if k == "compute"]
    if not comp:
        return 0.0
    span = max(e for _, e in comp) - min(s for s, _ in comp)
    busy = sum(e - s for s, e in comp)
    return max(0.0, 1.0 - busy / span) if span else 0.0


def plot_pipeline(stages: int = 4, tiles: int = 8, latency: float = 3.0,
                  compute: float = 1.0, title=None):
    """Timeline of :func:`pipeline_schedule`: one row per shared buffer (the copies
    landing in it), one row for the tensor cores."""
    from gemmcourse.viz import plot_timeline

    sched = pipeline_schedule(stages, tiles, latency, compute)
    copy_c, math_c = "#9fc5e8", "#b6d7a8"
    rows = {f"cp.async -> buffer {b}": [] for b in range(stages)}
    rows["tensor cores (mma.sync)"] = []
    for t, s, e, kind in sched:
        if kind == "copy":
            rows[f"cp.async -> buffer {t % stages}"].append((s, e - s, f"tile {t}", copy_c))
        else:
            rows["tensor cores (mma.sync)"].append((s, e - s, str(t), math_c))
    idle = tensor_core_idle(sched)
    fig = plot_timeline(rows, title=title or (
        f"STAGES={stages}: copy latency {latency:g}, compute {compute:g} per tile (schematic); "
        f"tensor cores idle {100 * idle:.0f}% after the prologue"), unit="time (arbitrary units)")
    return legible(fig)


# --------------------------------------------------------------------------
# Committed files


def _committed(pattern: str, directory=None):
    """The newest committed file matching ``pattern`` per GPU (notebook's own helpers)."""
    from gemmcourse.notebook import _newest_per_gpu, committed_json

    return _newest_per_gpu(committed_json(pattern, directory))


def precision_files(directory=None):
    """The newest ``bench-<gpu>-<date>-precision.json`` per GPU: [(file name, data)]."""
    return _committed("bench-*-precision.json", directory)


def accuracy_files(directory=None):
    """The newest ``accuracy-<gpu>-<date>.json`` per GPU: [(file name, data)]."""
    return _committed("accuracy-*.json", directory)


def roof_files(directory=None):
    """The newest ``mma-roof-<gpu>.json`` per GPU: [(file name, data)]."""
    return _committed("mma-roof-*.json", directory)


def roof_ceilings(data: dict) -> dict:
    """{precision: best measured mma.sync TFLOP/s (over the chain counts tried)}."""
    best = {}
    for r in data.get("rows", []) if isinstance(data, dict) else []:
        t = _num(r.get("tflops"))
        if t is not None:
            best[r["precision"]] = max(best.get(r["precision"], 0.0), t)
    return best


# --------------------------------------------------------------------------
# Measured throughput and error against cuBLAS


def _num(v):
    try:
        v = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(v) else v


def judge(precision: str, tflops, cublas_tflops, pct, err, cublas_err):
    """(target text, met: True/False/None) for one measurement."""
    if precision == "3xtf32":
        text = f"> cuBLAS fp32, error <= {ERROR_FACTOR_3XTF32:g}x its"
        if None in (tflops, cublas_tflops, err, cublas_err):
            return text, None
        return text, bool(tflops > cublas_tflops and err <= ERROR_FACTOR_3XTF32 * cublas_err)
    target = PCT_TARGETS.get(precision)
    if target is None:
        return "-", None
    return f">= {target:g}% of cuBLAS", None if pct is None else bool(pct >= target)


def precision_records(data: dict):
    """One dict per gemmlib row (not cuBLAS) of a precision benchmark file, in the order
    precision, shape, timing: TFLOP/s of both, % of cuBLAS, both errors, target, met."""
    out = []
    order = {p: i for i, p in enumerate(PRECISION_ORDER)}
    for r in data.get("rows", []) if isinstance(data, dict) else []:
        if r.get("kernel") == "cublas":
            continue
        prec = r.get("precision", "fp32")
        shape = (int(r["M"]), int(r["N"]), int(r["K"]))
        t, ct, pct = _num(r.get("tflops")), _num(r.get("cublas_tflops")), _num(r.get("pct_of_cublas"))
        err, cerr = _num(r.get("rel_error_vs_fp64")), _num(r.get("cublas_rel_error"))
        target, met = judge(prec, t, ct, pct, err, cerr)
        out.append(dict(precision=prec, shape=shape, label="x".join(map(str, shape)),
                        timing=r.get("timing", "kernel"), kernel=r.get("kernel", "?"),
                        config=r.get("note", ""), tflops=t, cublas_tflops=ct, pct=pct,
                        rel_error=err, cublas_rel_error=cerr,
                        cublas_precision=r.get("cublas_precision", prec),
                        target=target, met=met))
    out.sort(key=lambda d: (order.get(d["precision"], len(order)), d["shape"][0] * d["shape"][1]
                            * d["shape"][2], d["shape"], d["timing"] != "kernel"))
    return out


def _short(shape) -> str:
    M, N, K = shape
    return f"{M}^3" if M == N == K else f"{M}x{N}x{K}"


def precision_table(data: dict, name: str = "", timing=None):
    """:func:`precision_records` as two HTML tables (a :class:`gemmcourse.notebook.Tables`),
    each narrow enough for the text column: the speed against cuBLAS with the verdict (the
    targets in its caption), and the errors against float64 with the configuration that ran
    (one row for the timings that share them).  ``timing``: "kernel" or "call" to keep one
    timing mode."""
    from gemmcourse.notebook import Table, Tables

    recs = [d for d in precision_records(data) if timing in (None, d["timing"])]
    f = lambda v, fmt: "-" if v is None else format(v, fmt)  # noqa: E731
    speed = [(d["precision"], d["label"], d["timing"], f(d["tflops"], ".1f"),
              f(d["cublas_tflops"], ".1f") + ("" if d["cublas_precision"] == d["precision"]
                                              else f" ({d['cublas_precision']})"),
              "-" if d["pct"] is None else f"{d['pct']:.1f}%",
              "-" if d["met"] is None else ("met" if d["met"] else "missed"))
             for d in recs]
    errors = {}
    for d in recs:
        key = (d["precision"], d["label"], f(d["rel_error"], ".2e"),
               f(d["cublas_rel_error"], ".2e"), d["config"])
        errors.setdefault(key, []).append(d["timing"])
    targets = {}
    for d in recs:
        targets.setdefault(d["target"], []).append(d["precision"])
    meta = data.get("meta", {}) if isinstance(data, dict) else {}
    where = (f"{meta.get('gpu', '?')}, {str(meta.get('date', ''))[:10]}"
             + (f" ({name})" if name else ""))
    aims = "; ".join(f"{', '.join(dict.fromkeys(p))} {t}" for t, p in targets.items() if t != "-")
    return Tables((
        Table(("precision", "M x N x K", "timing", "TFLOP/s", "cuBLAS TFLOP/s", "% of cuBLAS",
               "target"), speed,
              caption=f"gemmlib (kernel='auto': the tuned mma_pipeline) against cuBLAS in the "
                      f"same precision (3xtf32: cuBLAS fp32 SGEMM): {where}"
                      + (f"; targets: {aims}" if aims else "")),
        Table(("precision", "M x N x K", "timing", "error", "cuBLAS error", "configuration"),
              [(p, label, ", ".join(t), e, ce, config)
               for (p, label, e, ce, config), t in errors.items()],
              caption=f"Relative errors against float64 (Frobenius) and the configuration "
                      f"that ran: {where}")))


def targets_line(data: dict, timing: str = "kernel") -> str:
    """'<gpu>: n of m targets met (kernel timing)', judged from the data."""
    recs = [d for d in precision_records(data) if d["timing"] == timing and d["met"] is not None]
    gpu = data.get("meta", {}).get("gpu", "?") if isinstance(data, dict) else "?"
    if not recs:
        return f"{gpu}: no {timing}-timed rows to judge"
    missed = [f"{d['precision']} {d['label']}" for d in recs if not d["met"]]
    return (f"{gpu}: {sum(d['met'] for d in recs)} of {len(recs)} targets met ({timing} timing)"
            + (f"; missed: {', '.join(missed)}" if missed else ""))


def plot_precision_bars(data: dict, timing: str = "kernel", title=None):
    """Left: TFLOP/s of gemmlib and cuBLAS per precision and shape (% of cuBLAS and the
    verdict above each pair).  Right: both relative errors against float64 (log scale)."""
    import numpy as np

    plt = _plt()
    recs = [d for d in precision_records(data) if d["timing"] == timing]
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4.4),
                                  gridspec_kw={"width_ratios": [3, 2]})
    if not recs:
        for a in (ax, ax2):
            a.text(0.5, 0.5, f"{NOT_MEASURED} ({timing} timing)", ha="center",
                   transform=a.transAxes)
        return legible(fig)
    x = np.arange(len(recs))
    w = 0.38
    g = [d["tflops"] or 0.0 for d in recs]
    c = [d["cublas_tflops"] or 0.0 for d in recs]
    ax.bar(x - w / 2, g, w, color=[COLOURS.get(d["precision"], "C0") for d in recs],
           edgecolor="k", label="gemmlib (auto)")
    ax.bar(x + w / 2, c, w, color="white", edgecolor="k", hatch="//", label="cuBLAS")
    top = max(g + c) or 1.0
    for i, d in enumerate(recs):
        verdict = "" if d["met"] is None else (" met" if d["met"] else " missed")
        pct = "-" if d["pct"] is None else f"{d['pct']:.0f}%"
        ax.text(i, max(g[i], c[i]) + 0.02 * top, pct + verdict, ha="center", fontsize=7,
                color="k" if d["met"] is not False else "#a00")
    labels = [f"{d['precision']}\n{_short(d['shape'])}" + ("\nvs fp32" if d["cublas_precision"]
                                                    != d["precision"] else "") for d in recs]
    ax.set_xticks(x, labels, fontsize=7)
    ax.set_ylabel("TFLOP/s")
    ax.set_ylim(0, top * 1.15)
    ax.legend(fontsize=8, loc="upper right")
    ax.grid(True, axis="y", alpha=0.3)
    e = [d["rel_error"] or float("nan") for d in recs]
    ce = [d["cublas_rel_error"] or float("nan") for d in recs]
    ax2.bar(x - w / 2, e, w, color=[COLOURS.get(d["precision"], "C0") for d in recs],
            edgecolor="k", label="gemmlib")
    ax2.bar(x + w / 2, ce, w, color="white", edgecolor="k", hatch="//", label="cuBLAS")
    ax2.set_yscale("log")
    ax2.set_xticks(x, labels, fontsize=7)
    ax2.set_ylabel("relative error vs float64 (Frobenius)")
    ax2.legend(fontsize=8)
    ax2.grid(True, axis="y", which="both", alpha=0.3)
    gpu = data.get("meta", {}).get("gpu", "?")
    fig.suptitle(title or f"tensor-core precisions on {gpu} ({timing} timing)", fontsize=10)
    fig.tight_layout()
    return legible(fig)


# --------------------------------------------------------------------------
# Accuracy against K


def accuracy_series(data: dict):
    """{(precision, source): [(K, rel_error), ...] sorted by K} from an accuracy file."""
    out = {}
    for r in data.get("rows", []) if isinstance(data, dict) else []:
        err = _num(r.get("rel_error"))
        if err is None:
            continue
        out.setdefault((r.get("precision", "?"), r.get("source", "?")), []).append(
            (int(r["K"]), err))
    return {k: sorted(v) for k, v in out.items()}


def plot_accuracy(data: dict, title=None, tolerances: bool = False):
    """Relative error against K, log-log: gemmlib solid, cuBLAS dashed, one colour per
    precision (``tolerances=True`` adds gemmlib.precision.tolerance as dotted lines)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    series = accuracy_series(data)
    if not series:
        ax.text(0.5, 0.5, NOT_MEASURED, ha="center", transform=ax.transAxes)
        return legible(fig)
    order = {p: i for i, p in enumerate(ACCURACY_ORDER)}
    for (prec, src), pts in sorted(series.items(), key=lambda kv: (order.get(kv[0][0], 99),
                                                                   kv[0][1] != "gemmlib")):
        ks, es = zip(*pts)
        ax.loglog(ks, es, "-o" if src == "gemmlib" else "--s", color=COLOURS.get(prec, "C0"),
                  ms=4, lw=1.5 if src == "gemmlib" else 1.2, label=f"{prec}, {src}")
    if tolerances:
        from gemmlib.precision import tolerance

        ks = sorted({k for pts in series.values() for k, _ in pts})
        for prec in sorted({p for p, _ in series}, key=lambda p: order.get(p, 99)):
            ax.loglog(ks, [tolerance(prec, k) for k in ks], ":", color=COLOURS.get(prec, "C0"),
                      lw=1)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("K (length of each dot product)")
    ax.set_ylabel("relative error vs float64 (Frobenius)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    meta = data.get("meta", {})
    ax.set_title(title or f"error against K on {meta.get('gpu', '?')}: gemmlib solid, "
                 "cuBLAS dashed", fontsize=10)
    fig.tight_layout()
    return legible(fig)


# --------------------------------------------------------------------------
# Roofline with tensor-core roofs


def input_bytes(precision: str) -> int:
    return 2 if precision in ("fp16", "bf16") else 4


def intensity(M: int, N: int, K: int, precision: str) -> float:
    """FLOP per byte when A and B are read once and the fp32 C written once."""
    b = input_bytes(precision)
    return 2.0 * M * N * K / (b * (M * K + K * N) + 4 * M * N)


def datasheet_peaks(gpu_name: str) -> dict:
    """The datasheet dense tensor-core peaks for H100 / H200 SXM; {} for other GPUs."""
    n = (gpu_name or "").upper()
    if "H200" in n or ("H100" in n and "PCIE" not in n and "NVL" not in n):
        return dict(DATASHEET_TC_TFLOPS)
    return {}


def plot_roofline_tc(dev, data=None, title=None, roof=None):
    """The roofline of ``dev`` (a :class:`gemmlib.backend.DeviceInfo`): SIMT fp32 peak
    (``dev.fp32_peak_tflops``), datasheet tensor-core peaks (H100/H200 SXM), memory roof
    (``dev.peak_bandwidth_gbs``), the measured ``mma.sync`` ceilings of ``roof`` (an
    ``mma-roof`` file, dashed) and the gemmlib points of a precision benchmark file
    (kernel timing).  Without a device to read (simulator) only the points are drawn."""
    import numpy as np

    plt = _plt()
    fig, ax = plt.subplots(figsize=(7.5, 7.4))
    bw = getattr(dev, "peak_bandwidth_gbs", 0.0) or 0.0
    fp32 = getattr(dev, "fp32_peak_tflops", 0.0) or 0.0
    simulated = getattr(dev, "simulated", True)
    x = np.logspace(0, 4, 300)
    roofs = []
    if fp32 and not simulated:
        roofs.append(("fp32 FMA (CUDA cores, from the driver's clock)", fp32, "k", "-"))
    peaks = datasheet_peaks(getattr(dev, "name", "")) if not simulated else {}
    if peaks:
        roofs.append(("FP16/BF16 tensor cores (datasheet)", peaks["fp16"], COLOURS["fp16"], "-"))
        roofs.append(("TF32 tensor cores (datasheet)", peaks["tf32"], COLOURS["tf32"], "-"))
        roofs.append(("3xTF32 = TF32 / 3 (datasheet / 3)", peaks["tf32"] / 3,
                      COLOURS["3xtf32"], ":"))
    for prec, peak in sorted(roof_ceilings(roof or {}).items()):
        if not simulated:
            roofs.append((f"mma.sync {prec.upper()} (measured, register-only)", peak,
                          COLOURS.get(prec, "C0"), "--"))
    for label, peak, col, ls in roofs:
        y = np.minimum(peak, x * bw / 1e3) if bw else np.full_like(x, peak)
        ax.loglog(x, y, ls, color=col, lw=1.8, label=f"{label}: {peak:.1f} TFLOP/s")
    if bw and not simulated:
        ax.loglog(x, x * bw / 1e3, color="grey", lw=0.8, alpha=0.6,
                  label=f"memory roof: {bw:.0f} GB/s (driver)")
    recs = [d for d in precision_records(data or {}) if d["timing"] == "kernel"
            and d["tflops"]]
    # One legend entry per precision's points (fp16 and bf16 land on top of each other, so
    # labels beside the points would overlap); the legend sits under the axes, off the lines.
    for prec in dict.fromkeys(d["precision"] for d in recs):
        mine = [d for d in recs if d["precision"] == prec]
        ax.loglog([intensity(*d["shape"], prec) for d in mine], [d["tflops"] for d in mine],
                  "o", color=COLOURS.get(prec, "C0"), ms=6, ls="none",
                  label=f"gemmlib {prec}: " + ", ".join(_short(d["shape"]) for d in mine))
    ax.set_xlabel("arithmetic intensity (FLOP per byte: A, B read once, fp32 C written once)")
    ax.set_ylabel("TFLOP/s")
    ax.grid(True, which="both", alpha=0.3)
    if roofs or recs:
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=1, frameon=False)
    ys = [p for _, p, _, _ in roofs] + [d["tflops"] for d in recs]
    if ys:
        ax.set_ylim(min(ys) / 20, max(ys) * 2)
    else:
        ax.text(0.5, 0.5, f"no device to read and no measured points ({NOT_MEASURED})",
                ha="center", transform=ax.transAxes, fontsize=9)
    name = getattr(dev, "name", "?")
    ax.set_title(title or (f"roofline of {name} with tensor-core roofs" if not simulated
                           else "measured points (the simulator has no roofs to read)"),
                 fontsize=10)
    fig.tight_layout()
    return legible(fig)


def _mma_shape(instruction: str) -> str:
    """``m16n8k16`` from ``mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32``."""
    import re

    m = re.search(r"m\d+n\d+k\d+", instruction)
    return m.group(0) if m else instruction


def roof_table(roof: dict, bench: dict | None = None, n: int = 8192):
    """The ``mma.sync`` ceiling per precision (a :class:`gemmcourse.notebook.Table`): the best
    register-only rate, cuBLAS at n^3 in that run, and -- from the precision benchmark of
    the same GPU -- the production rung at n^3 (kernel timing) as a share of the ceiling."""
    from gemmcourse.notebook import Table

    ours = {d["precision"]: d for d in precision_records(bench or {})
            if d["timing"] == "kernel" and d["shape"] == (n, n, n)}
    best = roof_ceilings(roof)
    body = []
    for prec in PRECISION_ORDER:
        rows = [r for r in roof.get("rows", []) if r.get("precision") == prec]
        if not rows:
            continue
        top = max(rows, key=lambda r: r["tflops"])
        cub = _num(top.get("cublas_8192_tflops"))
        mine = ours.get(prec)
        body.append((prec, _mma_shape(top.get("instruction", "?")), f"{best[prec]:.1f}",
                     "-" if cub is None else f"{cub:.1f}",
                     "-" if cub is None else f"{100 * best[prec] / cub:.1f}%",
                     "-" if mine is None else f"{mine['tflops']:.1f}",
                     "-" if mine is None else f"{100 * mine['tflops'] / best[prec]:.1f}%"))
    meta = roof.get("meta", {}) if isinstance(roof, dict) else {}
    # Short headers and the instruction's shape only, so the table fits the text column
    return Table(("precision", "mma shape", "ceiling TFLOP/s", "cuBLAS TFLOP/s",
                  "ceiling / cuBLAS", "mma_pipeline TFLOP/s", "mma_pipeline / ceiling"), body,
                 caption=f"{meta.get('gpu', '?')}: register-only mma.sync (gemmcourse.mma_roof); "
                         f"cuBLAS and mma_pipeline at {n}^3 (mma_pipeline from the precision "
                         f"benchmark of the same GPU)")


def show_mma_roof(directory=None) -> int:
    """:func:`roof_table` per GPU with a measured ceiling; returns how many."""
    from IPython.display import display

    roofs = roof_files(directory)
    if not roofs:
        print(f"(the mma.sync ceiling {NOT_MEASURED}: python scripts/mma_roof.py on a GPU "
              "writes results/mma-roof-<gpu>.json)")
        return 0
    benches = {d.get("meta", {}).get("gpu"): d for _, d in precision_files(directory)}
    for _, data in roofs:
        display(roof_table(data, benches.get(data.get("meta", {}).get("gpu"))))
    return len(roofs)


def show_precisions(directory=None, *, charts: bool = True) -> int:
    """Table (and chart) per GPU of the newest precision benchmark; returns how many.
    Prints a "not measured yet" line when there is none."""
    from IPython.display import display

    files = precision_files(directory)
    if not files:
        print(f"(tensor-core precisions {NOT_MEASURED}: results/bench-<gpu>-<date>-precision.json "
              "appears once gemmlib.bench.benchmark_precisions has run on a GPU and its file "
              "is committed)")
        return 0
    plt = _plt()
    for name, data in files:
        display(precision_table(data, name))
        print(targets_line(data, "kernel"))
        if charts:
            plot_precision_bars(data)
            plt.show()
    return len(files)


def show_accuracy(directory=None) -> int:
    """The accuracy figure per GPU of the newest accuracy file; returns how many."""
    files = accuracy_files(directory)
    if not files:
        print(f"(accuracy against K {NOT_MEASURED}: results/accuracy-<gpu>-<date>.json appears "
              "once it has been measured on a GPU and committed)")
        return 0
    plt = _plt()
    for name, data in files:
        plot_accuracy(data, title=f"error against K on {data.get('meta', {}).get('gpu', '?')} "
                      f"({name}): gemmlib solid, cuBLAS dashed")
        plt.show()
    return len(files)


__all__ = ["pipeline_schedule", "tensor_core_idle", "plot_pipeline", "precision_files",
           "accuracy_files", "precision_records", "precision_table", "targets_line",
           "plot_precision_bars", "accuracy_series", "plot_accuracy", "intensity",
           "datasheet_peaks", "plot_roofline_tc", "show_precisions", "show_accuracy",
           "roof_files", "roof_ceilings", "roof_table", "show_mma_roof",
           "DATASHEET_TC_TFLOPS", "PCT_TARGETS", "judge"]
