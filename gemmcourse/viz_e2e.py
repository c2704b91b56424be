"""Figures and tables for chapter 18.7 (a whole model on gemmlib).

* **measured**: the committed ``results/e2e-<gpu>-<date>.json`` files of
  :mod:`gemmlib.bench_e2e` (transformers' Llama at Llama 3.1 8B sizes, patched against
  torch): :func:`e2e_files`, :func:`e2e_table`, :func:`plot_e2e`; rows with an ``error``
  are shown as failed, never plotted;
* **a model, no GPU**: how launches from the host feed the GPU, eagerly and as one graph
  replay (:func:`launch_schedule`, :func:`plot_launches`).

matplotlib is imported only when drawing.
"""

from __future__ import annotations

#: the width (inches) and smallest font (points) of the chapter's figures
PAGE_IN = 6.7
FONT = 9
#: the issue's targets: gemmlib's tokens/s in % of torch's
TARGETS = {"prefill": 100.0, "decode": 95.0}
MODE_COLOURS = {"eager": "#4a7fb5", "graphs": "#e08a2c"}
NOT_MEASURED = "no end-to-end measurement is committed yet"


def _plt():
    import matplotlib.pyplot as plt

    return plt


def e2e_files(directory=None):
    """The newest ``e2e-<gpu>-<date>.json`` per GPU: [(file name, data)], maybe empty."""
    from gemmcourse.notebook import _newest_per_gpu, committed_json

    files = [(n, d) for n, d in committed_json("e2e-*.json", directory)
             if isinstance(d, dict) and isinstance(d.get("rows"), list)]
    return _newest_per_gpu(files)


def _case(r: dict) -> str:
    if r.get("phase") == "prefill":
        return f"prefill {r.get('tokens')} tokens"
    if r.get("phase") == "decode":
        return f"decode batch {r.get('batch')}"
    return f"train {r.get('batch')} x {r.get('tokens')}"


def _f(v, fmt, suffix=""):
    return "-" if v is None else format(v, fmt) + suffix


def e2e_table(data: dict, name: str = ""):
    """A :class:`gemmcourse.notebook.Table` of one e2e file: per row the case, mode, both
    sides' tokens/s, gemmlib's % of torch and the logits' (training: also the gradients')
    relative difference; a failed side says so."""
    from gemmcourse.notebook import Table

    body = []
    for r in data.get("rows", []):
        diff = _f(r.get("logits_rel_diff"), ".1e")
        if r.get("grad_rel_diff_max") is not None:
            diff += f"; grads {r['grad_rel_diff_max']:.1e}"
        pct = _f(r.get("pct"), ".1f", "%")
        if "error" in r:
            pct = "failed: " + str(r["error"])[:80]
        body.append((_case(r), r.get("mode", "?"), _f(r.get("torch_tok_s"), ",.0f"),
                     _f(r.get("gemmlib_tok_s"), ",.0f"), pct, diff))
    meta = data.get("meta", {})
    plan = meta.get("plan", {})
    caption = (f"{meta.get('gpu', '?')}: Llama 3.1 8B sizes, {plan.get('layers', '?')} layers, "
               f"{plan.get('dtype', '?')}, gemmlib.patch against torch"
               + (f" ({name})" if name else ""))
    return Table(("case", "mode", "torch tok/s", "gemmlib tok/s", "gemmlib, % of torch",
                  "logits rel. diff"), body, caption=caption)


def plot_e2e(data: dict, title=None):
    """gemmlib's tokens/s in % of torch's per case, a bar per mode, with the targets (100%
    for prefill, 95% for decode) drawn as ticks; failed rows are named, not drawn."""
    plt = _plt()
    rows = [r for r in data.get("rows", []) if r.get("phase") in ("prefill", "decode")]
    cases = list(dict.fromkeys(_case(r) for r in rows)) or ["(no rows)"]
    modes = [m for m in MODE_COLOURS if any(r.get("mode") == m for r in rows)] or ["eager"]
    fig, ax = plt.subplots(figsize=(PAGE_IN, 0.34 * len(cases) * len(modes) + 1.5))
    h = 0.8 / len(modes)
    top = 110.0
    labelled = set()
    for j, mode in enumerate(modes):
        for i, case in enumerate(cases):
            y = len(cases) - 1 - i + 0.4 - h * (j + 0.5)
            r = next((r for r in rows if _case(r) == case and r.get("mode") == mode), None)
            if r is None:
                continue
            if r.get("pct") is None:
                ax.text(1, y, f"{mode}: failed", va="center", fontsize=FONT, color="#b00")
                continue
            ax.barh(y, r["pct"], h * 0.9, color=MODE_COLOURS[mode],
                    label=None if mode in labelled else mode)
            labelled.add(mode)
            ax.text(r["pct"] + 1, y, f"{r['pct']:.0f}%", va="center", fontsize=FONT,
                    bbox=dict(facecolor="white", edgecolor="none", pad=0.5))
            top = max(top, r["pct"] + 15)
    for i, case in enumerate(cases):
        target = TARGETS.get(case.split()[0])
        if target:
            y = len(cases) - 1 - i
            ax.plot([target, target], [y - 0.45, y + 0.45], color="k", lw=1.5, ls="--")
    ax.axvline(100, color="#888", lw=0.8)
    ax.set_yticks(range(len(cases)), cases[::-1], fontsize=FONT)
    ax.set_xlim(0, top)
    ax.tick_params(axis="x", labelsize=FONT)
    ax.set_xlabel("gemmlib's tokens/s in % of torch's (dashed: the target)", fontsize=FONT)
    if labelled:
        ax.legend(fontsize=FONT, loc="upper center", bbox_to_anchor=(0.5, -0.14),
                  ncol=len(labelled), frameon=False)
    meta = data.get("meta", {})
    plan = meta.get("plan", {})
    ax.set_title(title or f"Llama 3.1 8B sizes, {plan.get('layers', '?')} layers, "
                 f"{plan.get('dtype', '?')}, on {meta.get('gpu', '?')}", fontsize=FONT + 1)
    fig.tight_layout()
    from gemmcourse.viz import legible

    return legible(fig)


# --------------------------------------------------------------------------
# Launches from the host, eagerly and as a graph (a model: no GPU involved)


def launch_schedule(kernels, launch_us: float, replay_us: float | None = None):
    """When each kernel of a step runs on the GPU: ``kernels`` is a list of (name, GPU
    microseconds).  Eager (``replay_us`` None): the host spends ``launch_us`` per launch, in
    order, and a kernel starts once it is launched and the one before it is done.  As a
    graph: one replay of ``replay_us`` submits them all, and they run back to back.
    Returns (host bars, GPU bars, the step's end), bars as (start, length, name)."""
    host, gpu = [], []
    t_host = t_gpu = 0.0
    if replay_us is not None:
        host.append((0.0, replay_us, "replay"))
        t_gpu = replay_us
    for name, dur in kernels:
        if replay_us is None:
            host.append((t_host, launch_us, name))
            t_host += launch_us
            t_gpu = max(t_gpu, t_host)
        gpu.append((t_gpu, dur, name))
        t_gpu += dur
    return host, gpu, max(t_gpu, t_host)


def plot_launches(kernels, launch_us: float, replay_us: float):
    """:func:`launch_schedule` eagerly and as a graph, on one time axis."""
    from gemmcourse.viz import plot_timeline

    rows = {}
    longest = launch_schedule(kernels, launch_us)[2]
    for label, replay in (("eager", None), ("graph", replay_us)):
        host, gpu, end = launch_schedule(kernels, launch_us, replay)

        def bars(xs, colour):   # a name only where it fits inside its bar
            return [(s, d, n if d >= 0.07 * longest else "", colour) for s, d, n in xs]

        rows[f"{label}: host"] = bars(host, "#cccccc")
        rows[f"{label}: GPU"] = bars(gpu, MODE_COLOURS["graphs" if replay else "eager"])
    fig = plot_timeline(rows, title=f"one step: launched one by one ({launch_us:g} µs each), "
                        f"or replayed as a graph ({replay_us:g} µs)", unit="µs")
    fig.set_size_inches(PAGE_IN, fig.get_size_inches()[1])
    from gemmcourse.viz import legible

    return legible(fig)
