"""Figures from committed benchmark results (never drawn by hand).

``python -m gemmcourse plot results/bench-*.json --out figures`` writes, per GPU:

* ``<gpu>-tflops.png``: TFLOP/s against square size for every kernel and cuBLAS;
* ``<gpu>-pct-cublas.png``: each kernel's % of cuBLAS at every square size;
* ``<gpu>-ladder.png``: the ladder at one size (4096^3 when measured), a bar a rung.

A call-level file (``bench-<gpu>-<date>-call.json``, from ``python -m gemmlib
bench --timing both``) gives instead ``<gpu>-<date>-call.png``: ``auto``'s
share of cuBLAS per shape timed as a call and as a kernel, beside the targets.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from gemmlib.bench import Result, load  # noqa: E402

from gemmcourse.viz import BOOK_DPI, legend_below, legible, series_style  # noqa: E402


def _order(result: Result) -> list[str]:
    from gemmlib.kernels import LADDER

    seen = [r.kernel for r in result.rows]
    known = [k for k in LADDER if k in seen]
    return known + sorted({k for k in seen if k not in known and not k.startswith("cublas")})


def _squares(result: Result, kernel: str):
    rows = sorted((r for r in result.rows if r.kernel == kernel and r.M == r.N == r.K),
                  key=lambda r: r.M)
    return rows


def _size_axis(ax, result: Result):
    """Log2 x axis labelled with the measured sizes themselves (128, 256, ...)."""
    sizes = sorted({r.M for r in result.rows if r.M == r.N == r.K})
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [str(s) for s in sizes])
    ax.minorticks_off()
    ax.set_xlabel("M = N = K")


def _title(result: Result, what: str) -> str:
    m = result.meta
    return (f"{what}: {m.get('gpu', '?')} (sm_{m.get('compute_capability', '?').replace('.', '')}), "
            f"fp32, TF32 off, {m.get('date', '')[:10]}")


# The figures are written at the book's resolution and width (gemmcourse.viz.legible), so
# the page shows them at their own size; every series has its own colour and marker, and
# the legends sit under the axes, clear of the data.


def tflops_figure(result: Result):
    fig, ax = plt.subplots(figsize=(7.5, 6), dpi=BOOK_DPI)
    for i, name in enumerate(_order(result)):
        rows = _squares(result, name)
        ax.plot([r.M for r in rows], [r.tflops for r in rows], label=name, **series_style(i))
    rows = _squares(result, "cublas")
    if rows:
        ax.plot([r.M for r in rows], [r.tflops for r in rows], color="black", linewidth=2.5,
                linestyle="--", marker="o", label="cublas")
    peak = result.meta.get("fp32_peak_tflops")
    if peak:
        ax.axhline(peak, color="grey", linewidth=1, linestyle=":")
        ax.annotate(f"fp32 FMA peak {peak:.1f}", (0.01, peak), xycoords=("axes fraction", "data"),
                    va="bottom", fontsize=9, color="grey")
    _size_axis(ax, result)
    ax.set_ylabel("TFLOP/s (median)")
    ax.set_title(_title(result, "Throughput"), fontsize=10)
    ax.grid(True, alpha=0.3)
    legend_below(ax, ncol=4)
    return legible(fig)


def pct_figure(result: Result):
    names = _order(result)
    fig, ax = plt.subplots(figsize=(7.5, 6), dpi=BOOK_DPI)
    for i, name in enumerate(names):
        rows = _squares(result, name)
        ax.plot([r.M for r in rows], [r.pct_of_cublas for r in rows], label=name,
                **series_style(i))
    ax.axhline(100, color="black", linewidth=1.5, linestyle="--", label="cuBLAS")
    _size_axis(ax, result)
    ax.set_ylabel("% of cuBLAS (same run)")
    ax.set_title(_title(result, "Share of cuBLAS"), fontsize=10)
    ax.grid(True, alpha=0.3)
    legend_below(ax, ncol=4)
    return legible(fig)


def ladder_figure(result: Result, size: int = 4096):
    sizes = {r.M for r in result.rows if r.M == r.N == r.K}
    if size not in sizes:
        size = max(sizes)
    rows = {r.kernel: r for r in result.rows if r.M == r.N == r.K == size}
    names = [n for n in _order(result) if n in rows]
    fig, ax = plt.subplots(figsize=(7.5, 0.45 * len(names) + 1.6), dpi=BOOK_DPI)
    pct = [rows[n].pct_of_cublas for n in names]
    bars = ax.barh(names, pct, color="tab:blue")
    for bar, n in zip(bars, names):
        r = rows[n]
        ax.text(bar.get_width() + 1, bar.get_y() + bar.get_height() / 2,
                f"{r.pct_of_cublas:.1f}%  ({r.tflops:.1f} TFLOP/s)", va="center", fontsize=9)
    ax.axvline(100, color="black", linestyle="--", linewidth=1.5)
    ax.invert_yaxis()
    ax.set_xlim(0, max(pct + [100]) * 1.3)
    ax.set_xlabel(f"% of cuBLAS at {size}^3 (cuBLAS: {rows['cublas'].tflops:.1f} TFLOP/s)"
                  if "cublas" in rows else f"% of cuBLAS at {size}^3")
    ax.set_title(_title(result, "The ladder"), fontsize=10)
    return legible(fig)


def plot_files(paths, out_dir="figures") -> list[Path]:
    """Write the figures for every result file; returns the paths written."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for p in paths:
        try:
            result = load(p)
        except (TypeError, KeyError) as e:   # another format (e.g. bench-*-hopper.json)
            print(f"skipping {p}: not a ladder benchmark file ({e})")
            continue
        if result.meta.get("simulated"):
            print(f"skipping {p}: simulator results carry no timings")
            continue
        stem = Path(p).stem.replace("bench-", "")
        if any(r.timing == "call" for r in result.rows):
            written.append(_call_figure(result, out / f"{stem}.png"))
            continue
        for suffix, make in (("tflops", tflops_figure), ("pct-cublas", pct_figure),
                             ("ladder", ladder_figure)):
            fig = make(result)
            path = out / f"{stem}-{suffix}.png"
            fig.savefig(path, dpi=BOOK_DPI)
            plt.close(fig)
            written.append(path)
    return written


def _call_figure(result: Result, out: Path) -> Path:
    from gemmcourse.notebook import CALL_TARGETS, call_level_records
    from gemmcourse.viz import plot_call_level

    records = call_level_records(result.to_json(), CALL_TARGETS)
    fig = plot_call_level(records, title=_title(result, "gemmlib.matmul as called, vs cuBLAS"))
    fig = getattr(fig, "figure", fig)
    fig.savefig(out, dpi=BOOK_DPI)
    plt.close(fig)
    return out
