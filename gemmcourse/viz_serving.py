"""Figures and tables of the serving suite: the committed ``results/serving-<gpu>-<date>.json``
files of :mod:`gemmlib.bench_serving` (``x @ W.T`` with an ``nn.Linear`` weight, the
projections of seven public models at 1-4096 tokens; gemmlib and a Triton GEMM against
``torch.matmul`` in the same run).

* :func:`serving_files`: the newest file per GPU;
* :func:`summary` (the per-M table as rows) and :func:`summary_table` (the same as a
  :class:`gemmcourse.notebook.Table`);
* :func:`plot_serving`: each implementation's speed in % of torch's by token count.

Rows with an ``error`` (torch or gemmlib failed) are counted, never plotted; a Triton column
that failed leaves its point out.  matplotlib is imported only when drawing.
"""

from __future__ import annotations

#: the width (inches) and smallest font (points) of the chapter's figures
PAGE_IN = 6.7
FONT = 9
IMPL_COLOURS = {"gemmlib": "#4a7fb5", "triton": "#e08a2c"}
IMPL_LABELS = {"gemmlib": "gemmlib.matmul", "triton": "Triton GEMM"}
PREC_STYLES = {"fp16": dict(ls="-", marker="o"), "bf16": dict(ls="--", marker="s")}
#: each row's speed in % of torch.matmul's, per implementation
PCT_FIELDS = {"gemmlib": "pct_torch", "triton": "triton_pct_torch"}
#: where the per-shape points of each (implementation, precision) sit, left or right of M
#: (in powers of two), so the four clouds do not cover each other
_OFFSETS = {("gemmlib", "fp16"): -0.21, ("gemmlib", "bf16"): -0.07,
            ("triton", "fp16"): 0.07, ("triton", "bf16"): 0.21}
#: the y axis stops here; a point above is drawn on the edge as a triangle
Y_CAP = 300.0
NOT_MEASURED = "no serving measurement is committed yet"


def _plt():
    import matplotlib.pyplot as plt

    return plt


def load(source) -> dict:
    """A serving file's data: ``source`` is the parsed dict or a path to the JSON."""
    if isinstance(source, dict):
        return source
    import json
    from pathlib import Path

    return json.loads(Path(source).read_text())


def serving_files(directory=None):
    """The newest ``serving-<gpu>-<date>.json`` per GPU: [(file name, data)], maybe empty."""
    from gemmcourse.notebook import _newest_per_gpu, committed_json

    files = [(n, d) for n, d in committed_json("serving-*.json", directory)
             if isinstance(d, dict) and isinstance(d.get("rows"), list)]
    return _newest_per_gpu(files)


def summary(data, under: float = 80.0) -> list[dict]:
    """Per precision and token count M: shapes measured, geometric mean / min / max of
    gemmlib's % of torch (and the shape of the min), geometric means of gemmlib's % of
    Triton and Triton's % of torch, the shapes under ``under``% and the failed rows
    (:func:`gemmlib.bench_serving.summary_rows`)."""
    from gemmlib.bench_serving import summary_rows

    return summary_rows(load(data), under)


def _f(v, fmt=".1f", suffix="%"):
    return "-" if v is None else format(v, fmt) + suffix


def summary_table(data, name: str = "", under: float = 80.0):
    """:func:`summary` as a :class:`gemmcourse.notebook.Table`."""
    from gemmcourse.notebook import Table

    data = load(data)
    body = [(s["precision"], s["M"], s["shapes"] + s["failed"], _f(s["gm_pct_torch"]),
             _f(s["min_pct_torch"]) + (f" ({s['min_at']})" if s["min_at"] else ""),
             s["under"], _f(s["gm_pct_triton"]), _f(s["gm_triton_pct_torch"]))
            for s in summary(data, under)]
    meta = data.get("meta", {})
    caption = (f"{meta.get('gpu', '?')}: x @ W.T, W as nn.Linear holds it; geometric means "
               f"over the shapes" + (f" ({name})" if name else ""))
    return Table(("precision", "M", "shapes", "gemmlib, % of torch", "lowest (shape)",
                  f"under {under:g}%", "gemmlib, % of Triton", "Triton, % of torch"),
                 body, caption=caption)


def _series(rows, impl: str, prec: str):
    """{M: [% of torch of each shape]} of one implementation in one precision."""
    out = {}
    key = PCT_FIELDS[impl]
    for r in rows:
        if r.get("precision") == prec and r.get(key):
            out.setdefault(r["M"], []).append(r[key])
    return out


def plot_serving(data, title=None):
    """gemmlib's and Triton's speed in % of torch.matmul's against the token count M: a
    point per shape, a line through the geometric means, one series per implementation
    (colour) and precision (line style and marker); torch at 100%."""
    import math

    plt = _plt()
    data = load(data)
    rows = [r for r in data.get("rows", []) if "error" not in r]
    failed = len(data.get("rows", [])) - len(rows)
    precs = [p for p in PREC_STYLES if any(r.get("precision") == p for r in rows)]
    Ms = sorted({r["M"] for r in rows}) or [1]
    fig, ax = plt.subplots(figsize=(PAGE_IN, 4.2))
    top = 130.0
    for impl in PCT_FIELDS:
        for prec in precs:
            series = _series(rows, impl, prec)
            if not series:
                continue
            shift = 2.0 ** _OFFSETS[(impl, prec)]
            colour, style = IMPL_COLOURS[impl], PREC_STYLES[prec]
            xs, ys, capped = [], [], []
            for M, vals in series.items():
                for v in vals:
                    (capped if v > Y_CAP else xs).append(M * shift)
                    if v <= Y_CAP:
                        ys.append(v)
            ax.scatter(xs, ys, s=9, color=colour, alpha=0.3, marker=style["marker"],
                       linewidths=0)
            if capped:
                ax.scatter(capped, [Y_CAP] * len(capped), s=16, color=colour, marker="^",
                           clip_on=False)
            top = max(top, min(Y_CAP, max(ys, default=0.0)) * 1.06)
            gm = sorted((M, math.exp(sum(math.log(v) for v in vals) / len(vals)))
                        for M, vals in series.items())
            ax.plot([M * shift for M, _ in gm], [v for _, v in gm], color=colour, lw=1.8,
                    ls=style["ls"], marker=style["marker"], ms=4.5,
                    label=f"{IMPL_LABELS[impl]}, {prec} (geometric mean)")
    ax.axhline(100.0, color="#555", lw=1.0, ls=":", label="torch.matmul (100%)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(Ms, [str(M) for M in Ms], fontsize=FONT)
    ax.minorticks_off()
    ax.set_xlim(Ms[0] / 1.5, Ms[-1] * 1.5)
    ax.set_ylim(0, top if top < Y_CAP * 1.06 else Y_CAP * 1.06)
    ax.tick_params(axis="y", labelsize=FONT)
    ax.set_xlabel("tokens M (rows of x)", fontsize=FONT)
    ax.set_ylabel("speed, % of torch.matmul's", fontsize=FONT)
    ax.grid(axis="y", color="#ddd", lw=0.6)
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        ax.legend(handles, labels, fontsize=FONT, loc="upper center",
                  bbox_to_anchor=(0.5, -0.16), ncol=2, frameon=False)
    meta = data.get("meta", {})
    shapes = len({(r["N"], r["K"]) for r in rows})
    models = len({m for r in rows for m in (r.get("models") or [r.get("model")])})
    plural = "s" if models > 1 else ""
    note = f" ({failed} row{'s' if failed > 1 else ''} failed)" if failed else ""
    ax.set_title(title or f"x @ W.T, {shapes} weight shapes of {models} model{plural}, on "
                 f"{meta.get('gpu', '?')}{note}", fontsize=FONT + 1)
    fig.tight_layout()
    from gemmcourse.viz import legible

    return legible(fig)
