"""Figures and tables for chapter 18.8 (swap-AB and stream-K: ``wgmma_swap``).

* **the tiles at a few tokens** (no GPU): :func:`tile_rows` -- the useful share of a tile's
  work, its bytes per stage and the ring depth that fits, from the rung's own
  ``stages_for``;
* **the kernel's own schedule** (no GPU): :func:`stream_k_assignment` runs gemmlib's
  ``wgmma_split_k.stream_k_walk`` as every block of a launch would (its ``cuda.blockIdx``
  and ``cuda.gridDim`` set in plain Python), :func:`plot_stream_k` draws it and
  :func:`pieces_lines` says how each shared tile is cut;
* **measured**: the committed swap-AB sweep of an H100 (``results/swap-*/``):
  ``planned-*.json`` (every candidate on 12 projections at 1, 16 and 64 tokens) read by
  :func:`planned_file`, :func:`summary`, :func:`plot_planned`; ``grid-*.json`` (one kernel
  by block count) read by :func:`grid_file`, :func:`grid_points`, :func:`plot_grid`;
* **the launch model**: :func:`h100` (a DeviceInfo with an H100's SMs and memory) and
  :func:`plan_table` (``wgmma_swap.plan_for``'s choice per layer);
* **on a GPU**: :func:`kernel_loop_us`, a loop of launches timed with CUDA events.

matplotlib is imported only when drawing.
"""

from __future__ import annotations

import math
import statistics
import types
from types import SimpleNamespace

#: the width (inches) and smallest font (points) of the chapter's figures
PAGE_IN = 6.7
FONT = 9
#: the candidates of the per-layer figure: colour, marker, legend text
CANDIDATES = {
    "split64": ("#8c8c8c", "o", "wgmma_split_k, 64-row tiles (before)"),
    "swap64": ("#4a7fb5", "s", "wgmma_swap, one block per SM"),
    "auto": ("#e08a2c", "D", "wgmma_swap as plan_for launches it"),
}
MODEL_NAMES = {"mistral-7b": "Mistral-7B", "qwen2.5-7b": "Qwen2.5-7B",
               "llama-3.2-3b": "Llama-3.2-3B"}
#: how a block count cuts the tiles (plot_grid's colours)
KINDS = {"even": ("#4a7fb5", "even: whole tiles or equal pieces"),
         "uneven": ("#d9534f", "uneven cuts"),
         "waves": ("#b8c9dc", "even, more blocks than SMs")}
NOT_MEASURED = "no swap-AB measurement is committed"


def _plt():
    import matplotlib.pyplot as plt

    return plt


def _legible(fig):
    from gemmcourse.viz import legible

    return legible(fig)


# --------------------------------------------------------------------------
# The tiles at a few tokens


def tile_rows(M: int = 16):
    """For M tokens: per tile (kernel rows x columns, the side the tokens are on), the
    share of its wgmma work that is real, the bytes of one stage (weight and tokens,
    64 k deep, 16-bit), the stages that fit the ring (``wgmma_swap.stages_for``: the same
    200 KiB for every tile) and the weight bytes those stages hold.  Returns dicts."""
    from gemmlib.kernels import wgmma_swap as S

    out = []
    w = S.width_for(M)
    for name, BM, BN, tokens_on in (("wgmma_ws, 128 x 256", 128, 256, "rows"),
                                    ("wgmma_split_k, 64 x 256", 64, 256, "rows"),
                                    (f"wgmma_swap, 64 x {w} (swapped)", 64, w, "columns")):
        token_side = BM if tokens_on == "rows" else BN
        weight_side = BN if tokens_on == "rows" else BM
        stages = S.stages_for(BM, BN)
        out.append(dict(tile=name, BM=BM, BN=BN, tokens_on=tokens_on,
                        real=min(M, token_side) / token_side,
                        stage_bytes=2 * S.BK * (BM + BN),
                        weight_stage_bytes=2 * S.BK * weight_side, stages=stages,
                        weight_in_flight=stages * 2 * S.BK * weight_side))
    return out


def tile_table(M: int = 16):
    """:func:`tile_rows` as a :class:`gemmcourse.notebook.Table`."""
    from gemmcourse.notebook import Table

    body = [(r["tile"], f"{r['tokens_on']}", f"{100 * r['real']:.1f}%",
             f"{r['stage_bytes'] // 1024} KiB", f"{r['stages']}",
             f"{r['weight_in_flight'] // 1024} KiB") for r in tile_rows(M)]
    return Table(("tile (rows x columns)", "tokens on", f"real work at M = {M}",
                  "one stage", "stages in 200 KiB", "weight in those stages"), body,
                 caption=f"The tiles at {M} tokens, 16-bit operands, 64 k per stage")


def show_code(src: str):
    """Display generated source (a string), highlighted as the book shows code."""
    try:
        from IPython.display import Code, display

        display(Code(src.rstrip() + "\n", language="python"))
    except ImportError:  # pragma: no cover - outside IPython
        print(src)


# --------------------------------------------------------------------------
# Stream-K: the kernel's own walk, run in plain Python


def _python(f):
    """The Python function behind a numba (or simulator) device function."""
    for attr in ("py_func", "fn", "_func"):
        inner = getattr(f, attr, None)
        if callable(inner):
            return inner
    return f


def _walk_of_block(c: int, G: int):
    """``wgmma_split_k.stream_k_walk`` as block ``c`` of ``G`` runs it: the same code, with
    ``cuda.blockIdx.x`` = c and ``cuda.gridDim.x`` = G (and its helper ``owner`` as plain
    Python)."""
    from gemmlib.kernels import wgmma_split_k as W

    f = _python(W.stream_k_walk)
    env = dict(f.__globals__)
    env["cuda"] = SimpleNamespace(blockIdx=SimpleNamespace(x=c), gridDim=SimpleNamespace(x=G))
    env["owner"] = _python(W.owner)
    return types.FunctionType(f.__code__, env, f.__name__, f.__defaults__, f.__closure__)


def stream_k_assignment(tiles: int, num_k: int, G: int) -> dict:
    """Every block's units in a stream-K launch of ``tiles`` tiles of ``num_k`` k-tiles over
    ``G`` blocks, from the kernel's own walk.  Returns ``owner`` (owner[tile][k] = the block
    that loads and multiplies that k-tile), ``units`` ({block: [(tile, k0, k1, piece,
    pieces)]}) and ``pieces`` ({tile: [(block, k0, k1, piece, pieces)]}, in block order)."""
    owner = [[-1] * num_k for _ in range(tiles)]
    units, pieces = {}, {}
    for c in range(G):
        walk = _walk_of_block(c, G)
        units[c] = []
        j = 0
        while True:
            tile, k0, k1, z, n = walk(j, 0, tiles, num_k)
            if tile < 0:
                break
            j += 1
            units[c].append((tile, k0, k1, z, n))
            pieces.setdefault(tile, []).append((c, k0, k1, z, n))
            for k in range(k0, k1):
                owner[tile][k] = c
    return dict(owner=owner, units=units, pieces=pieces)


def _ktiles(k0: int, k1: int) -> str:
    return f"k-tile {k0}" if k1 - k0 == 1 else f"k-tiles {k0}-{k1 - 1}"


def pieces_lines(tiles: int, num_k: int, G: int) -> list[str]:
    """One line per tile that several blocks share: which block holds which k-tiles."""
    out = []
    for tile, ps in sorted(stream_k_assignment(tiles, num_k, G)["pieces"].items()):
        if len(ps) > 1:
            parts = ", ".join(f"block {c} {_ktiles(k0, k1)}" for c, k0, k1, _, _ in ps)
            out.append(f"tile {tile}: {len(ps)} pieces: {parts}")
    return out


def plot_stream_k(tiles: int, num_k: int, G: int, title=None):
    """The walk of :func:`stream_k_assignment`: a row per tile, a cell per k-tile, coloured
    and numbered by the block that takes it; the pieces of a shared tile are named at the
    right."""
    plt = _plt()
    from matplotlib.patches import Rectangle

    a = stream_k_assignment(tiles, num_k, G)
    cmap = plt.get_cmap("tab10" if G <= 10 else "tab20")
    fig, ax = plt.subplots(figsize=(PAGE_IN, 0.42 * tiles + 1.3))
    for t in range(tiles):
        for k in range(num_k):
            c = a["owner"][t][k]
            ax.add_patch(Rectangle((k, t), 1, 1, facecolor=cmap(c % cmap.N), alpha=0.45,
                                   edgecolor="white", lw=1.5))
            ax.text(k + 0.5, t + 0.5, str(c), ha="center", va="center", fontsize=FONT)
        ps = a["pieces"][t]
        note = (f"block {ps[0][0]}" if len(ps) == 1 else
                f"{len(ps)} pieces: blocks {', '.join(str(p[0]) for p in ps)}")
        ax.text(num_k + 0.25, t + 0.5, note, va="center", fontsize=FONT)
    ax.set_xlim(0, num_k)
    ax.set_ylim(tiles, 0)
    ax.set_xticks([k + 0.5 for k in range(num_k)], [str(k) for k in range(num_k)],
                  fontsize=FONT)
    ax.set_yticks([t + 0.5 for t in range(tiles)], [f"tile {t}" for t in range(tiles)],
                  fontsize=FONT)
    ax.set_xlabel("k-tile (64 k each); the number in a cell is the block that takes it",
                  fontsize=FONT)
    ax.tick_params(length=0)
    for s in ax.spines.values():
        s.set_visible(False)
    per = tiles * num_k / G
    ax.set_title(title or f"{tiles} tiles x {num_k} k-tiles over {G} blocks "
                 f"({per:g} k-tiles each)", fontsize=FONT + 1)
    fig.tight_layout()
    return _legible(fig)


# --------------------------------------------------------------------------
# The committed measurements


def _newest(kind: str, directory=None):
    from gemmcourse.notebook import committed_json

    files = committed_json(f"swap-*/{kind}-*.json", directory)
    return files[-1] if files else None


def planned_file(directory=None):
    """(name, data) of the newest ``swap-*/planned-*.json``, or None."""
    found = _newest("planned", directory)
    if found and isinstance(found[1], dict) and isinstance(found[1].get("rows"), list):
        return found
    return None


def grid_file(directory=None):
    """(name, rows) of the newest ``swap-*/grid-*.json`` (a list of rows), or None."""
    found = _newest("grid", directory)
    if found and isinstance(found[1], list):
        return found
    return None


def layers(data: dict) -> list[tuple]:
    """(model, proj, N, K) of every layer in the file, in its order."""
    return list(dict.fromkeys((r["model"], r["proj"], r["N"], r["K"]) for r in data["rows"]))


def layer_label(model: str, proj: str) -> str:
    return f"{MODEL_NAMES.get(model, model)} {proj}"


def pct_by_layer(data: dict, candidate: str, M: int) -> dict:
    """{(model, proj): % of torch} of one candidate at M tokens (failed rows left out)."""
    return {(r["model"], r["proj"]): r["pct_of_torch"] for r in data["rows"]
            if r["candidate"] == candidate and r["M"] == M and "error" not in r
            and r.get("pct_of_torch") is not None}


def geomean(values) -> float:
    values = list(values)
    return math.exp(sum(math.log(v) for v in values) / len(values))


def summary(data: dict, candidates=("split64", "swap64", "swap128", "skinny", "auto"),
            tokens=(1, 16, 64)) -> dict:
    """{(candidate, M): dict(n, gm, lo, hi)}: the geometric mean, lowest and highest % of
    torch over the layers measured, for each candidate and token count it has."""
    out = {}
    for cand in candidates:
        for M in tokens:
            v = list(pct_by_layer(data, cand, M).values())
            if v:
                out[(cand, M)] = dict(n=len(v), gm=geomean(v), lo=min(v), hi=max(v))
    return out


def summary_lines(data: dict, tokens=(1, 16, 64)) -> list[str]:
    s = summary(data, tokens=tokens)
    out = []
    for cand, text in (("auto", "wgmma_swap as planned"), ("swap64", "wgmma_swap, 132 blocks"),
                       ("split64", "wgmma_split_k, BM = 64")):
        cells = [f"{s[(cand, M)]['gm']:.1f}%" for M in tokens if (cand, M) in s]
        n = max((s[(cand, M)]["n"] for M in tokens if (cand, M) in s), default=0)
        out.append(f"{text:<24} {' / '.join(cells)}  (geometric mean over {n} layers)")
    return out


def plot_planned(data: dict, tokens=(1, 16, 64), candidates=("split64", "swap64", "auto")):
    """% of torch per layer, a panel per token count, a marker per candidate."""
    plt = _plt()
    lays = layers(data)
    fig, axes = plt.subplots(1, len(tokens), sharey=True, layout="constrained",
                             figsize=(PAGE_IN, 0.3 * len(lays) + 2.0))
    axes = list(axes) if len(tokens) > 1 else [axes]
    lo = 100.0
    for ax, M in zip(axes, tokens):
        for j, cand in enumerate(candidates):
            colour, marker, label = CANDIDATES[cand]
            got = pct_by_layer(data, cand, M)
            ys = [i for i, (m, p, _, _) in enumerate(lays) if (m, p) in got]
            xs = [got[lays[i][:2]] for i in ys]
            lo = min([lo] + xs)
            ax.scatter(xs, ys, color=colour, marker=marker, s=30, zorder=3,
                       label=label if M == tokens[0] else None)
        for i in range(len(lays)):
            ax.axhline(i, color="#eeeeee", lw=0.8, zorder=0)
        for i in range(1, len(lays)):
            if lays[i][0] != lays[i - 1][0]:
                ax.axhline(i - 0.5, color="#999999", lw=0.8)
        ax.axvline(100, color="#555555", lw=0.8)
        ax.set_title(f"M = {M}", fontsize=FONT + 1)
        ax.tick_params(labelsize=FONT)
        ax.grid(axis="x", color="#dddddd", lw=0.6)
    left = 10 * math.floor((lo - 3) / 10)
    for ax in axes:
        ax.set_xlim(left, 102)
        ax.set_xticks(range(left + (left % 20), 101, 20))
    axes[0].set_yticks(range(len(lays)), [layer_label(m, p) for m, p, _, _ in lays],
                       fontsize=FONT)
    axes[0].set_ylim(len(lays) - 0.5, -0.5)
    fig.legend(loc="outside lower center", ncol=1, fontsize=FONT, frameon=False)
    gpu = data.get("meta", {}).get("gpu", "?").replace("NVIDIA ", "")
    fig.suptitle(f"% of torch.matmul's speed per layer (bf16, x @ W.t(), {gpu})",
                 fontsize=FONT + 1)
    return _legible(fig)


# --------------------------------------------------------------------------
# The block count


def grid_kind(tiles: int, G: int, sms: int = 132) -> str:
    """How ``G`` blocks cut ``tiles`` tiles: "even" (whole tiles per block, or every tile in
    the same number of pieces), "waves" (even, but more blocks than SMs) or "uneven"."""
    if tiles % G == 0 or G % tiles == 0:
        return "waves" if G > sms else "even"
    return "uneven"


def share_text(tiles: int, G: int, num_k: int) -> str:
    """What each of ``G`` blocks gets of ``tiles`` tiles of ``num_k`` k-tiles."""
    if tiles % G == 0:
        n = tiles // G
        return f"{n} whole tile{'s' if n > 1 else ''}"
    if G % tiles == 0:
        return f"tiles in {G // tiles} pieces"
    return f"uneven: {tiles * num_k / G:.1f} k-tiles"


def grid_points(rows: list, M: int, N: int, K: int, BM: int, sms: int = 132) -> list[tuple]:
    """[(blocks, % of torch, kind)] of the block-count sweep for one shape and tile height,
    by block count; GRID 0 (one block per SM) counted as ``sms``; a count measured twice
    is averaged."""
    from gemmlib.spec import cdiv

    from gemmlib.kernels.wgmma_swap import width_for

    tiles = cdiv(N, BM) * cdiv(M, width_for(M))
    got = {}
    for r in rows:
        if (r["M"], r["N"], r["K"], r["BM"]) == (M, N, K, BM) and r.get("pct") is not None:
            got.setdefault(r["GRID"] or sms, []).append(r["pct"])
    return [(g, statistics.mean(v), grid_kind(tiles, g, sms)) for g, v in sorted(got.items())]


def grid_shapes(rows: list) -> list[tuple]:
    """(N, K) of the sweep's shapes, in its order."""
    return list(dict.fromkeys((r["N"], r["K"]) for r in rows))


def plot_grid(rows: list, M: int = 16, BM: int = 64, dev=None):
    """% of torch by block count, a panel per shape, bars coloured by how the count cuts the
    tiles; the count ``plan_for`` picks (for ``dev``, default :func:`h100`) is starred."""
    plt = _plt()
    from gemmlib.kernels import wgmma_swap as S
    from gemmlib.spec import cdiv

    dev = dev or h100()
    shapes = grid_shapes(rows)
    ncol = 2
    nrow = -(-len(shapes) // ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(PAGE_IN, 2.3 * nrow + 1.0), squeeze=False,
                             layout="constrained")
    used = set()
    for ax, (N, K) in zip(axes.flat, shapes):
        pts = grid_points(rows, M, N, K, BM, dev.sm_count)
        tiles = cdiv(N, BM) * cdiv(M, S.width_for(M))
        plan = S.plan_for(M, N, K, dev)
        for i, (g, pct, kind) in enumerate(pts):
            ax.bar(i, pct, 0.7, color=KINDS[kind][0],
                   label=KINDS[kind][1] if kind not in used else None)
            used.add(kind)
            star = " *" if plan == (BM, g) else ""
            ax.text(i, pct + 2, f"{pct:.0f}{star}", ha="center", fontsize=FONT)
        ax.set_xticks(range(len(pts)), [str(g) for g, _, _ in pts], fontsize=FONT)
        ax.set_ylim(0, 112)
        ax.set_yticks([0, 50, 100])
        ax.tick_params(labelsize=FONT)
        ax.set_title(f"{N} x {K}: {tiles} tiles", fontsize=FONT)
    for ax in list(axes.flat)[len(shapes):]:
        ax.set_visible(False)
    for ax in axes[:, 0]:
        ax.set_ylabel("% of torch", fontsize=FONT)
    for ax in axes[-1, :]:
        ax.set_xlabel("blocks", fontsize=FONT)
    order = [k for k in KINDS if k in used]
    handles = {}
    for ax in axes.flat:
        for h, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, h)
    fig.legend([handles[KINDS[k][1]] for k in order], [KINDS[k][1] for k in order],
               loc="outside lower center", ncol=len(order), fontsize=FONT, frameon=False)
    fig.suptitle(f"wgmma_swap at M = {M}, {BM}-row tiles, by block count "
                 f"(*: plan_for's choice)", fontsize=FONT + 1)
    return _legible(fig)


# --------------------------------------------------------------------------
# The launch model


def h100(dev=None):
    """``dev`` (default this machine's DeviceInfo) with an H100 SXM's SMs and memory: what
    ``plan_for`` sees on the GPU of the measurements."""
    import dataclasses

    from gemmlib import backend

    return dataclasses.replace(dev or backend.device_info(), name="NVIDIA H100 80GB HBM3",
                               sm_count=132, memory_clock_khz=2619000, memory_bus_bits=5120)


def plan_table(data: dict, M: int = 16, dev=None):
    """``plan_for``'s choice per layer of ``data`` at M tokens, for ``dev`` (default
    :func:`h100`), beside what ``auto`` measured: a :class:`gemmcourse.notebook.Table`."""
    from gemmlib.kernels import wgmma_swap as S
    from gemmlib.spec import cdiv
    from gemmcourse.notebook import Table

    dev = dev or h100()
    auto = pct_by_layer(data, "auto", M)
    before = pct_by_layer(data, "split64", M)
    body = []
    for model, proj, N, K in layers(data):
        BM, g = S.plan_for(M, N, K, dev)
        tiles = cdiv(N, BM) * cdiv(M, S.width_for(M))
        body.append((layer_label(model, proj), f"{N}×{K}", f"{BM}", f"{tiles}", f"{g}",
                     share_text(tiles, g, cdiv(K, 64)),
                     f"{auto[(model, proj)]:.0f}%" if (model, proj) in auto else "-",
                     f"{before[(model, proj)]:.0f}%" if (model, proj) in before else "-"))
    return Table(("layer", "N × K", "rows", "tiles", "blocks", "a block gets",
                  "% of torch", "before"), body,
                 caption=f"plan_for at M = {M} on {dev.sm_count} SMs and "
                         f"{dev.peak_bandwidth_gbs:.0f} GB/s; measured: as planned, and "
                         f"wgmma_split_k with 64-row tiles")


# --------------------------------------------------------------------------
# On a GPU


def kernel_loop_us(torch, calls, per: int = 200, loops: int = 5) -> float:
    """Microseconds per call on the GPU: ``per`` launches cycling through ``calls``, queued
    behind a sleeping kernel so that they are all waiting when the clock starts (the host's
    time per call is hidden); the median of ``loops`` loops."""
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    clock_hz = 1.98e9
    out = []
    for _ in range(loops):
        torch.cuda.synchronize()
        torch.cuda._sleep(int(per * 60e-6 * clock_hz))   # ~60 us of host time per launch
        e0.record()
        for i in range(per):
            calls[i % len(calls)]()
        e1.record()
        e1.synchronize()
        out.append(1e3 * e0.elapsed_time(e1) / per)
    return statistics.median(out)


def best_by_kind(rows: list, M: int = 16, BM: int = 64, sms: int = 132) -> list[dict]:
    """Per shape of the sweep: the fastest even count within one wave and the fastest
    uneven one, as dict(N, K, even=(blocks, pct), uneven=(blocks, pct)) (None if untried)."""
    out = []
    for N, K in grid_shapes(rows):
        pts = grid_points(rows, M, N, K, BM, sms)
        best = {}
        for kind in ("even", "uneven"):
            got = [(g, p) for g, p, k in pts if k == kind]
            best[kind] = max(got, key=lambda gp: gp[1]) if got else None
        out.append(dict(N=N, K=K, **best))
    return out


def faster(data: dict, a: str, b: str, M: int) -> list[tuple]:
    """The layers (model, proj) where candidate ``a`` measured faster than ``b`` at M."""
    pa, pb = pct_by_layer(data, a, M), pct_by_layer(data, b, M)
    return [k for k in pa if k in pb and pa[k] > pb[k]]


def split_k_stages(BM: int = 64) -> int:
    """The ring depth ``wgmma_split_k`` (the split-K rung) builds with BM-row tiles."""
    from gemmlib.kernels import wgmma_split_k

    return wgmma_split_k.build("bf16", BM=BM).params["STAGES"]
