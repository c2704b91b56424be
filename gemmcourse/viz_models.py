"""Figures and tables for chapter 18 (the GEMMs inside a model).

Two kinds of numbers, never mixed up:

* **computed from the shapes** -- where each projection of a transformer layer sits on
  the roofline (:func:`intensity`, :func:`shape_records`, :func:`position_table`,
  :func:`ridge_tokens`), how a tiled kernel covers it (:func:`tiles`, :func:`waves`,
  :func:`wave_efficiency`, :func:`tile_table`, :func:`plot_wave_heat`), what split-K and
  stream-K do with a small output and a deep K (:func:`split_k_table`,
  :func:`streamk_segments`, :func:`plot_work_split`), and a stream-ordering model
  (:func:`stream_schedule`, :func:`plot_streams`).  The GPU these use is a committed
  file's (its SM count and measured copy bandwidth) or, without one, the datasheet
  H100 SXM of :data:`REFERENCE_GPU`, labelled as such;
* **measured** -- the committed ``results/models-<gpu>-<date>.json`` files
  (:mod:`gemmlib.bench_models`, one per GPU; rows with an ``"error"`` are counted, never
  plotted) and the host-cost files (``results/host-cost-*.json`` with a ``"frameworks"``
  list, and the early ``results/models-*/host-cost-*.json``): :func:`measured_records`,
  :func:`decode_table`, :func:`plot_models_roofline`, :func:`plot_pct_heat`,
  :func:`kernel_table` (which rung ran), :func:`suite_summary_table` (the leaderboard's
  view), :func:`plot_host_frameworks`; and the per-shape sweep of the Hopper tensor-core
  paths (``results/tc-shapes-<gpu>-<date>.json``, ``scripts/tc_shapes_gpu.py``):
  :func:`tc_shapes_files`, :func:`plot_tc_shapes`, :func:`tc_summary`,
  :func:`ws_decode_points`, with :func:`split_choice_table` putting the split-K rung's
  slice model (run on a file's GPU, :func:`file_device`) beside what the sweep ran.

matplotlib is imported only when drawing.
"""

from __future__ import annotations

import json
import math
import statistics
from functools import lru_cache
from pathlib import Path

import numpy as np

from gemmlib.bench_models import DECODE_M, MODELS, TOKENS, min_bytes, projections
from gemmcourse.viz_hopper import for_gpu  # noqa: F401  (one GPU's files: the pages use it)
from gemmcourse.viz_precision import DATASHEET_TC_TFLOPS, _num, datasheet_peaks

try:
    from gemmlib.bench_models import EXTRA_SHAPES
except ImportError:  # pragma: no cover - an older suite
    EXTRA_SHAPES = ()

#: the GPU the computed figures use when no measured file says otherwise (NVIDIA's H100 SXM
#: datasheet: dense fp16 tensor cores, HBM3 bandwidth, SMs)
REFERENCE_GPU = dict(name="H100 SXM (datasheet)", tc_tflops=DATASHEET_TC_TFLOPS["fp16"],
                     dram_gbps=3350.0, bw_source="datasheet", sm_count=132)
#: datasheet DRAM bandwidth (GB/s), used only where a file has no measured copy bandwidth
DATASHEET_DRAM_GBPS = {"H200": 4800.0, "H100": 3350.0}
#: the tile of wgmma_ws (chapter 17), what ``matmul`` ran for fp16/bf16 on Hopper before split-K
WS_TILE = (128, 256)
#: tiles a kernel could use instead (BM, BN), for wave quantisation
CANDIDATE_TILES = ((128, 256), (128, 128), (64, 256), (64, 128))
LAYERS = ("qkv", "o", "gate_up", "down")
#: one clearly different colour per token count (the figures' series)
TOKEN_COLOURS = {1: "#1f77b4", 16: "#9467bd", 128: "#2ca02c", 1024: "#ff7f0e",
                 4096: "#d62728", 16384: "#8c564b"}
MODEL_MARKERS = {"llama-3.1-8b": "o", "qwen2.5-72b": "s", "sweep": "D"}
NOT_MEASURED = "not measured yet"
#: the width (inches, at the notebooks' 100 dpi) of the book's text column at a 1280 px wide
#: window: a figure this wide is shown at its own size, so its text reads at the size it is set
PAGE_IN = 6.7
#: the smallest text a figure sets (points): at PAGE_IN wide, still 9 pt on the page
FONT = 9


#: the order precisions are listed in
PRECISION_ORDER = ("fp16", "bf16", "tf32", "3xtf32", "fp32")


def _prec_key(p):
    return (PRECISION_ORDER.index(p) if p in PRECISION_ORDER else len(PRECISION_ORDER), str(p))


def _plt():
    import matplotlib.pyplot as plt

    return plt


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


# --------------------------------------------------------------------------
# The shapes and the roofline (computed)


def intensity(M: int, N: int, K: int, in_bytes: int = 2, out_bytes: int = 4) -> float:
    """FLOP per byte: 2MNK over the fewest bytes the product moves (A and B read once,
    C written once; gemmlib writes fp32 C from 16-bit inputs)."""
    return 2.0 * M * N * K / min_bytes(M, N, K, in_bytes, out_bytes)


def phase(M: int, model: str = "") -> str:
    if model == "sweep":
        return "sweep"
    return "decode" if M <= DECODE_M else "prefill"


def shape_records(models=tuple(MODELS), tokens=TOKENS, extra: bool = True,
                  in_bytes: int = 2, out_bytes: int = 4):
    """One dict per shape of the models suite (:mod:`gemmlib.bench_models`): model, layer,
    tokens, M, N, K, flops, bytes (the fewest), intensity, weight_bytes (B: K x N), phase."""
    out = []

    def rec(model, layer, t, M, N, K):
        nbytes = min_bytes(M, N, K, in_bytes, out_bytes)
        out.append(dict(model=model, layer=layer, tokens=t, M=M, N=N, K=K,
                        flops=2.0 * M * N * K, bytes=nbytes, intensity=2.0 * M * N * K / nbytes,
                        weight_bytes=in_bytes * K * N, phase=phase(M, model)))

    for m in models:
        for t in tokens:
            for layer, N, K in projections(m):
                rec(m, layer, t, t, N, K)
    if extra:
        for M, N, K in EXTRA_SHAPES:
            rec("sweep", "", 0, M, N, K)
    return out


def gpu_roof(data: dict | None = None) -> dict:
    """The roof a file's GPU is judged against: dense fp16 tensor-core rate from the
    datasheet (H100/H200 SXM; otherwise the best torch.matmul fp16 rate in the file,
    labelled "measured"), and the copy bandwidth measured in the same run (datasheet
    bandwidth when the file has none).  Without ``data``: :data:`REFERENCE_GPU`."""
    if not isinstance(data, dict) or not data.get("meta"):
        return dict(REFERENCE_GPU)
    meta = data["meta"]
    name = str(meta.get("gpu", "?"))
    peak = datasheet_peaks(name).get("fp16")
    peak_source = "datasheet"
    if peak is None:
        best = [_num(r.get("cublas_tflops")) for r in data.get("rows", [])
                if r.get("precision") == "fp16" and "error" not in r]
        best = [b for b in best if b]
        peak, peak_source = (max(best), "best measured") if best else (None, "unknown")
    bw = _num(meta.get("dram_copy_gbps"))
    bw_source = "measured copy"
    if bw is None:
        bw = next((v for k, v in DATASHEET_DRAM_GBPS.items() if k in name.upper()), None)
        bw_source = "datasheet"
    return dict(name=name, tc_tflops=peak, tc_source=peak_source, dram_gbps=bw,
                bw_source=bw_source, sm_count=int(meta.get("sm_count") or 132))


def ridge(roof: dict) -> float:
    """The ridge point (FLOP/byte): tensor-core rate over DRAM bandwidth."""
    return roof["tc_tflops"] * 1e12 / (roof["dram_gbps"] * 1e9)


def attainable_tflops(ai: float, roof: dict) -> float:
    """min(peak, intensity x bandwidth)."""
    return min(roof["tc_tflops"], ai * roof["dram_gbps"] / 1e3)


def bound_us(M: int, N: int, K: int, roof: dict, in_bytes: int = 2, out_bytes: int = 4) -> float:
    """The roofline's lower bound on the time of one product, in microseconds."""
    t_math = 2.0 * M * N * K / (roof["tc_tflops"] * 1e12)
    t_mem = min_bytes(M, N, K, in_bytes, out_bytes) / (roof["dram_gbps"] * 1e9)
    return 1e6 * max(t_math, t_mem)


def ridge_tokens(N: int, K: int, ridge_fpb: float, in_bytes: int = 2, out_bytes: int = 4):
    """The fewest tokens T (= M) at which a T x N x K product reaches ``ridge_fpb`` FLOP per
    byte, or None if no T does (the intensity tends to 2NK / (in K + out N) as T grows)."""
    # 2TNK >= R (in (TK + KN) + out TN)  <=>  T (2NK - R in K - R out N) >= R in K N
    den = 2.0 * N * K - ridge_fpb * (in_bytes * K + out_bytes * N)
    if den <= 0:
        return None
    t = max(1, math.ceil(ridge_fpb * in_bytes * K * N / den))
    while t > 1 and intensity(t - 1, N, K, in_bytes, out_bytes) >= ridge_fpb:  # rounding
        t -= 1
    while intensity(t, N, K, in_bytes, out_bytes) < ridge_fpb:
        t += 1
    return t


def _label(d) -> str:
    return f"{d['M']}x{d['N']}x{d['K']}"


def position_table(roof: dict, records=None, tokens=None):
    """A :class:`gemmcourse.notebook.Table`: per shape its intensity, the side of the ridge
    it is on, the roofline's bound on its time and the rate that bound allows."""
    from gemmcourse.notebook import Table

    records = shape_records() if records is None else records
    R = ridge(roof)
    body = []
    for d in records:
        if tokens is not None and d["tokens"] not in tokens:
            continue
        body.append((d["model"], d["layer"], d["tokens"] or "-", _label(d),
                     f"{d['intensity']:.1f}", "memory" if d["intensity"] < R else "compute",
                     f"{bound_us(d['M'], d['N'], d['K'], roof):.1f}",
                     f"{attainable_tflops(d['intensity'], roof):.0f}"))
    # Headers of short words, so the table fits the text column
    return Table(("model", "layer", "tokens", "M x N x K", "FLOP per byte", "bound by",
                  "min time, us", "roof TFLOP/s"), body,
                 caption=f"Computed from the shapes (fp16 in, fp32 out) against {roof['name']}: "
                         f"{roof['tc_tflops']:.0f} TFLOP/s fp16 tensor cores, "
                         f"{roof['dram_gbps']:.0f} GB/s ({roof['bw_source']}); ridge "
                         f"{R:.0f} FLOP/byte. Min time: the roofline's lower bound; roof TFLOP/s: "
                         f"the rate it allows at the shape's intensity")


# --------------------------------------------------------------------------
# Tiles, waves, split-K, stream-K (computed)


def tiles(M: int, N: int, BM: int = WS_TILE[0], BN: int = WS_TILE[1]) -> int:
    """Output tiles of a BM x BN tiling of an M x N product."""
    return cdiv(M, BM) * cdiv(N, BN)


def waves(n_tiles: int, sms: int = 132, per_sm: int = 1) -> int:
    """Rounds in which ``sms`` SMs (each holding ``per_sm`` tiles at a time) finish them."""
    return cdiv(n_tiles, sms * per_sm)


def wave_efficiency(n_tiles: int, sms: int = 132, per_sm: int = 1) -> float:
    """Share of the SM-rounds that have a tile: tiles / (waves x SMs); the rest idles in
    the last wave's tail (or, with fewer tiles than SMs, for the whole kernel)."""
    if n_tiles <= 0:
        return 0.0
    return n_tiles / (waves(n_tiles, sms, per_sm) * sms * per_sm)


def row_use(M: int, BM: int = WS_TILE[0]) -> float:
    """Share of the tiles' rows that hold rows of C (M over M rounded up to BM)."""
    return M / (cdiv(M, BM) * BM) if M else 0.0


def tile_record(M: int, N: int, K: int, sms: int = 132, BM: int = WS_TILE[0],
                BN: int = WS_TILE[1]) -> dict:
    n = tiles(M, N, BM, BN)
    return dict(tiles=n, waves=waves(n, sms), efficiency=wave_efficiency(n, sms),
                busy_sms=min(n, sms), row_use=row_use(M, BM),
                useful=wave_efficiency(n, sms) * row_use(M, BM))


def tile_table(records=None, sms: int = 132, BM: int = WS_TILE[0], BN: int = WS_TILE[1],
               tokens=None, candidates=None):
    """A :class:`gemmcourse.notebook.Table`: per shape, tiles of BM x BN against ``sms``
    SMs, the waves, the share of SM-rounds with work, the share of tile rows that are real;
    with ``candidates`` the tiles and wave efficiency of each candidate tile instead of the
    share of real rows, and BM x BN's own tiles and share only in its candidate column (so
    that the table fits the book's column)."""
    from gemmcourse.notebook import Table

    records = shape_records() if records is None else records
    own = not candidates or (BM, BN) not in [tuple(c) for c in candidates]
    body = []
    for d in records:
        if tokens is not None and d["tokens"] not in tokens:
            continue
        t = tile_record(d["M"], d["N"], d["K"], sms, BM, BN)
        row = [d["model"], d["layer"], d["tokens"] or "-"]
        row += [t["tiles"], t["waves"], f"{100 * t['efficiency']:.0f}%"] if own else [t["waves"]]
        if candidates:
            effs = {c: wave_efficiency(tiles(d["M"], d["N"], *c), sms) for c in candidates}
            row += [f"{tiles(d['M'], d['N'], *c)}/{100 * e:.0f}%" for c, e in effs.items()]
        else:
            row += [_label(d), f"{100 * t['row_use']:.1f}%"]
        body.append(row)
    header = ["model", "layer", "T"]
    header += [f"{BM}x{BN} tiles", "waves", "SM-rounds used"] if own else ["waves"]
    if candidates:
        header += [f"{a}x{b}" for a, b in candidates]
        note = "; per candidate tile: tiles/SM-rounds used"
    else:
        header += ["M x N x K", "tile rows that are real"]
        note = ""
    what = f"{BM} x {BN} output tiles" if own else f"the waves of {BM} x {BN} output tiles"
    return Table(header, body, caption=f"Computed: {what}, one per SM at a time, on {sms} "
                                       f"SMs{note}")


def one_wave_splits(M: int, N: int, sms: int = 132, BM: int = WS_TILE[0],
                    BN: int = WS_TILE[1]) -> int:
    """The largest split-K factor S whose tiles x S blocks all run in one wave (>= 1)."""
    return max(1, sms // max(tiles(M, N, BM, BN), 1))


def split_k_table(M: int, N: int, K: int, sms: int = 132, BM: int = WS_TILE[0],
                  BN: int = WS_TILE[1], BK: int = 64, splits=range(1, 9)):
    """A :class:`gemmcourse.notebook.Table`: per split factor S, the blocks, waves, k-tiles
    per block, the steps (waves x k-tiles per block: the kernel's length in k-tiles of one
    SM) and the share of SM-steps doing useful k-tiles; plus stream-K's row."""
    from gemmcourse.notebook import Table

    n, kt = tiles(M, N, BM, BN), cdiv(K, BK)
    body = []
    for S in splits:
        blocks, per = n * S, cdiv(kt, S)
        w = waves(blocks, sms)
        steps = w * per
        body.append((f"split-K S={S}", blocks, w, per, steps,
                     f"{100 * n * kt / (steps * sms):.0f}%",
                     f"{4 * S * M * N / 2**20:.0f}" if S > 1 else "-"))
    sk = streamk_steps(n, kt, sms)
    body.append(("stream-K", sms, 1, f"{(n * kt) // sms}-{sk}", sk,
                 f"{100 * n * kt / (sk * sms):.0f}%",
                 f"<= {4 * sms * BM * BN / 2**20:.1f}"))
    return Table(("decomposition", "blocks", "waves", "k-tiles per block", "steps",
                  "useful SM-steps", "fp32 workspace MiB"), body,
                 caption=f"{M}x{N}x{K}: {n} tiles of {BM}x{BN}, {kt} k-tiles of {BK}, {sms} SMs "
                         "(computed)")


def streamk_segments(n_tiles: int, k_tiles: int, sms: int):
    """Stream-K's work: the n_tiles x k_tiles k-iterations, in tile-major order, dealt out
    in contiguous, even runs to ``sms`` persistent blocks (block x gets iterations
    [x T // sms, (x+1) T // sms)).  Returns (block, tile, k0, k1) segments in that order."""
    total = n_tiles * k_tiles
    out = []
    for x in range(sms):
        it, end = x * total // sms, (x + 1) * total // sms
        while it < end:
            tile, k0 = divmod(it, k_tiles)
            k1 = min(k_tiles, k0 + end - it)
            out.append((x, tile, k0, k1))
            it += k1 - k0
    return out


def streamk_steps(n_tiles: int, k_tiles: int, sms: int) -> int:
    """The most k-iterations one block does under stream-K."""
    return cdiv(n_tiles * k_tiles, sms)


def streamk_fixups(segments):
    """{tile: [(block, k0, k1), ...]} for the tiles split across blocks, in k order.  The
    block holding k0 = 0 owns the tile: it waits for the others' partial sums and adds them
    in this order -- a fixed order, so the result has the same bits on every run."""
    by = {}
    for x, tile, k0, k1 in segments:
        by.setdefault(tile, []).append((x, k0, k1))
    return {t: sorted(v, key=lambda s: s[1]) for t, v in by.items() if len(v) > 1}


def data_parallel_segments(n_tiles: int, k_tiles: int, sms: int, splits: int = 1):
    """(block, tile, k0, k1) of a data-parallel launch (``splits`` > 1: split-K) as the SMs run
    it: block b goes to SM b % sms in wave b // sms."""
    out = []
    per = cdiv(k_tiles, splits)
    b = 0
    for tile in range(n_tiles):
        for z in range(splits):
            k0, k1 = z * per, min(k_tiles, (z + 1) * per)
            if k1 > k0:
                out.append((b, tile, k0, k1))
                b += 1
    return out


def plot_work_split(n_tiles: int = 5, k_tiles: int = 8, sms: int = 4, splits: int = 2,
                    title=None):
    """Three schedules of the same n_tiles x k_tiles k-iterations on ``sms`` SMs, one row
    per SM, one colour per output tile: data-parallel (a tile per block, waves), split-K
    (``splits`` slices per tile) and stream-K (even runs that cross tiles; hatched:
    a partial sum the tile's owner adds in k order)."""
    plt = _plt()
    cmap = plt.get_cmap("tab10")
    fig, axes = plt.subplots(3, 1, figsize=(PAGE_IN, 0.42 * sms * 3 + 2.6), sharex=True)
    kinds = [("data-parallel (one block per tile)", data_parallel_segments(n_tiles, k_tiles, sms)),
             (f"split-K, S = {splits}", data_parallel_segments(n_tiles, k_tiles, sms, splits)),
             ("stream-K (even shares)", None)]
    end = 0

    def bar(ax, row, left, tile, k0, k1, part):
        ax.barh(row, k1 - k0, left=left, color=cmap(tile % 10), edgecolor="k",
                hatch="//" if part else None, height=0.75)
        ax.text(left + (k1 - k0) / 2, row, f"t{tile}" if k1 - k0 < 2 else f"t{tile}\n{k0}-{k1 - 1}",
                ha="center", va="center", fontsize=FONT, linespacing=1.0,
                bbox=dict(boxstyle="square,pad=0.05", fc="white", ec="none", alpha=0.7))

    for ax, (name, segs) in zip(axes, kinds):
        clock = [0.0] * sms
        if segs is None:
            segs = streamk_segments(n_tiles, k_tiles, sms)
            owners = {}
            for x, tile, k0, k1 in segs:
                if k0 == 0:
                    owners[tile] = x
            for x, tile, k0, k1 in segs:
                bar(ax, x, clock[x], tile, k0, k1, x != owners.get(tile, x))
                clock[x] += k1 - k0
        else:   # each block goes to the first SM that is free (equal blocks: waves)
            for b, tile, k0, k1 in segs:
                sm = min(range(sms), key=lambda i: (clock[i], i))
                bar(ax, sm, clock[sm], tile, k0, k1, k1 - k0 < k_tiles)
                clock[sm] += k1 - k0
        span = max(clock)
        end = max(end, span)
        busy = sum(k1 - k0 for _, _, k0, k1 in segs)
        ax.set_title(f"{name}: {span:g} steps, {100 * busy / (span * sms):.0f}% of SM-steps busy",
                     fontsize=FONT + 1)
        ax.set_yticks(range(sms), [f"SM {s}" for s in range(sms)], fontsize=FONT)
        ax.invert_yaxis()
    axes[-1].set_xlim(0, end * 1.02)
    axes[-1].set_xlabel("k-iterations (one k-tile of one output tile)", fontsize=FONT)
    fig.suptitle(title or f"{n_tiles} tiles x {k_tiles} k-tiles on {sms} SMs (computed)\n"
                 "label: tile t, its k-tiles; hatched: a partial sum added later",
                 fontsize=FONT + 1)
    fig.tight_layout()
    return fig


def _heat(ax, values, texts, row_labels, col_labels, vmax=100.0, cmap="RdYlGn"):
    plt = _plt()
    masked = np.ma.masked_invalid(np.asarray(values, dtype=float))
    cm = plt.get_cmap(cmap).with_extremes(bad="#dddddd")
    im = ax.imshow(masked, cmap=cm, vmin=0, vmax=vmax, aspect="auto")
    for (r, c), s in np.ndenumerate(np.asarray(texts, dtype=object)):
        ax.text(c, r, s, ha="center", va="center", fontsize=FONT, linespacing=1.0)
    ax.set_xticks(range(len(col_labels)), col_labels, fontsize=FONT)
    ax.set_yticks(range(len(row_labels)), row_labels, fontsize=FONT)
    ax.xaxis.tick_top()              # the column labels above the table, as in a table
    return im


def _row_keys(models=tuple(MODELS)):
    return [(m, layer) for m in models for layer in LAYERS]


def plot_wave_heat(sms: int = 132, BM: int = WS_TILE[0], BN: int = WS_TILE[1],
                   models=tuple(MODELS), tokens=TOKENS, title=None):
    """Computed: per projection and token count, the share of SM-rounds that hold a
    BM x BN tile (colour) with the tile count and waves (text)."""
    plt = _plt()
    keys = _row_keys(models)
    vals = np.full((len(keys), len(tokens)), np.nan)
    texts = np.full(vals.shape, "", dtype=object)
    for i, (m, layer) in enumerate(keys):
        N, K = next((n, k) for name, n, k in projections(m) if name == layer)
        for j, t in enumerate(tokens):
            n = tiles(t, N, BM, BN)
            vals[i, j] = 100 * wave_efficiency(n, sms)
            texts[i, j] = f"{n} tiles\n{waves(n, sms)} wave{'s' if waves(n, sms) > 1 else ''}"
    fig, ax = plt.subplots(figsize=(PAGE_IN - 0.3, 0.5 * len(keys) + 2.0))
    im = _heat(ax, vals, texts, [f"{m} {layer}" for m, layer in keys], [f"T={t}" for t in tokens])
    fig.colorbar(im, ax=ax, orientation="horizontal", fraction=0.05, pad=0.04,
                 label="% of SM-rounds with a tile")
    ax.set_title(title or f"{BM} x {BN} tiles on {sms} SMs (computed from the shapes)",
                 fontsize=FONT + 1)
    return fig


# --------------------------------------------------------------------------
# The skinny and split-K rungs, when they exist


def _optional_module(name: str):
    """``gemmlib.kernels.<name>``, or None where it does not exist (yet)."""
    import importlib
    import importlib.util

    full = f"gemmlib.kernels.{name}"
    try:
        if importlib.util.find_spec(full) is None:
            return None
        return importlib.import_module(full)
    except Exception as e:  # a module that does not import: say so, do not fail the page
        print(f"({full} exists but does not import: {type(e).__name__}: {e})")
        return None


def skinny_module():
    """``gemmlib.kernels.skinny``, or None where it does not exist (yet)."""
    return _optional_module("skinny")


def split_k_module():
    """``gemmlib.kernels.wgmma_split_k``, or None where it does not exist (yet)."""
    return _optional_module("wgmma_split_k")


def _show_parts(mod, name: str, parts) -> bool:
    """Show the lines of ``mod`` between each (start, stop) marker pair (the whole module if
    a marker is not found); a line instead when the module is missing.  True if shown."""
    import inspect

    from gemmcourse import notebook as nb

    if mod is None:
        print(f"gemmlib.kernels.{name} is not in this version of gemmlib: the {name} rung is "
              "not there yet, so there is no source to show.")
        return False
    src = inspect.getsource(mod)
    if all(a in src and b in src for a, b in parts):
        for a, b in parts:
            nb.show_source(mod, start=a, stop=b)
    else:
        nb.show_source(mod)
    return True


#: the parts of skinny that the chapter shows: the kernel, its rounds of loads and FMAs,
#: then its stores of the block's result (to C, or to the workspace whose slices the last
#: block adds)
SKINNY_PARTS = (("    def skinny_kernel(", "    # PIPE's two buffers"),
                ("    def fetch_round(", "    @cuda.jit(device=True)\n    def fma_row("),
                ("    def use_round(", "    # The block's result, out of shared memory"),
                ("    # The block's result, out of shared memory", "    store_c = "))


def show_skinny_source(parts=SKINNY_PARTS) -> bool:
    """Show the skinny rung's kernel and its stores (the whole module if a marker is not
    found); print a line instead when the rung is not in gemmlib.  True if shown."""
    return _show_parts(skinny_module(), "skinny", parts)


#: the parts of wgmma_split_k that the chapter shows: a block's units (slice_walk), the
#: slices' sum (add_slices), then the consumers' loop over units
SPLIT_K_PARTS = (("def slice_walk(", "@cuda.jit(device=True)"),
                 ("    def add_slices(", "    def wgmma_split_k_kernel("),
                 ("        else:                                # ---- consumer",
                  "    wgmma_split_k_kernel.__name__"))


def show_split_k_source(parts=SPLIT_K_PARTS) -> bool:
    """Show ``wgmma_split_k``'s device functions and its consumers' loop (the whole module if
    a marker is not found); print a line instead when the rung is not there.  True if shown."""
    return _show_parts(split_k_module(), "wgmma_split_k", parts)


def skinny_blocks(M: int, N: int, K: int, sms: int = 132, precision: str = "fp16"):
    """(slabs of B's columns, row blocks, K slices) of the skinny rung's launch for (M, N, K)
    on a GPU of ``sms`` SMs, by the rung's own rules (``build``, ``rows_for``,
    ``splits_for``); None when the rung, or one of those rules, is not there."""
    import dataclasses

    from gemmlib import backend

    mod = skinny_module()
    if mod is None:
        return None
    try:
        mt = mod.rows_for(M) if hasattr(mod, "rows_for") else None
        spec = mod.build(precision, **({} if mt is None else {"MT": mt}))
        p = spec.params
        MT, BN = spec.tile
        NT = spec.block[0]
        KG = (NT // p["CT"]) * p["U"]
        dev = dataclasses.replace(backend.device_info(), sm_count=sms)
        S = mod.splits_for(M, N, K, MT, BN, NT, KG, 4 if precision == "fp32" else 2, dev)
        return cdiv(N, BN), cdiv(M, MT), S
    except Exception:
        return None


def show_functions(module, names) -> list:
    """Show the source of each function ``names`` of ``module`` that exists (course
    source-showing helper); print a line for each one that does not.  Returns those shown."""
    from gemmcourse import notebook as nb

    shown = []
    for n in names:
        fn = getattr(module, n, None)
        if fn is None:
            print(f"({module.__name__}.{n} is not in this version of gemmlib)")
            continue
        nb.show_source(fn)
        shown.append(n)
    return shown


# --------------------------------------------------------------------------
# Committed measurements


def _newest_files(pattern: str, directory=None):
    from gemmcourse.notebook import _newest_per_gpu, committed_json

    files = [(n, d) for n, d in committed_json(pattern, directory)
             if isinstance(d, dict) and isinstance(d.get("rows"), list)]
    return _newest_per_gpu(files)


def models_files(directory=None):
    """The newest ``models-<gpu>-<date>.json`` per GPU: [(file name, data)] (one or more)."""
    return _newest_files("models-*.json", directory)


def error_rows(data: dict):
    return [r for r in data.get("rows", []) if isinstance(r, dict) and "error" in r]


def inputs_of(data: dict):
    """The input types a file measured, in the order met (torch first when present)."""
    seen = []
    for r in data.get("rows", []):
        if r.get("input") and r["input"] not in seen:
            seen.append(r["input"])
    return sorted(seen, key=lambda s: (s != "torch", s))


def measured_records(data: dict, precision=None, input=None):
    """The rows of a models file that were measured (no ``error``), normalised: model, layer,
    tokens, M, N, K, precision, input, kernel, ms / ref_ms, tflops / ref_tflops, pct,
    dram_gbps / ref_dram_gbps and their % of the copy bandwidth (all rows: computed from
    the time and the fewest bytes; the reference writes its own output dtype; the copy
    bandwidth is the row's own ``dram_copy_gbps`` where a merged file carries rows of an
    earlier run, else the file's), host_us /
    ref_host_us, reference."""
    copy = _num(data.get("meta", {}).get("dram_copy_gbps"))
    out = []
    for r in data.get("rows", []) if isinstance(data, dict) else []:
        if "error" in r or (precision and r.get("precision") != precision) \
                or (input and r.get("input") != input):
            continue
        M, N, K = int(r["M"]), int(r["N"]), int(r["K"])
        prec = r.get("precision", "?")
        in_b = 2 if prec in ("fp16", "bf16") else 4
        ms, ref_ms = _num(r.get("median_ms")), _num(r.get("cublas_median_ms"))
        gb = None if not ms else min_bytes(M, N, K, in_b, 4) / (ms * 1e-3) / 1e9
        ref_gb = None if not ref_ms else min_bytes(M, N, K, in_b, in_b) / (ref_ms * 1e-3) / 1e9
        bw = _num(r.get("dram_copy_gbps")) or copy   # a row carried from another run has its own
        out.append(dict(model=r.get("model", "?"), layer=r.get("layer", ""),
                        tokens=int(r.get("tokens") or 0), M=M, N=N, K=K, precision=prec,
                        input=r.get("input", "?"), kernel=str(r.get("kernel", "?")),
                        reference=r.get("reference", "framework"), ms=ms, ref_ms=ref_ms,
                        tflops=_num(r.get("tflops")), ref_tflops=_num(r.get("cublas_tflops")),
                        pct=_num(r.get("pct_of_cublas")),
                        pct_fp32=_num(r.get("pct_of_cublas_fp32")), dram_gbps=gb,
                        ref_dram_gbps=ref_gb,
                        dram_pct=None if gb is None or not bw else 100 * gb / bw,
                        ref_dram_pct=None if ref_gb is None or not bw else 100 * ref_gb / bw,
                        host_us=_num(r.get("host_us")), ref_host_us=_num(r.get("cublas_host_us")),
                        phase=phase(M, r.get("model", ""))))
    return out


def _f(v, fmt, suffix=""):
    return "-" if v is None else format(v, fmt) + suffix


def file_summary(name: str, data: dict) -> str:
    """One line per file: GPU, date, what was measured, rows failed."""
    meta = data.get("meta", {})
    rows = data.get("rows", [])
    bw = _num(meta.get("dram_copy_gbps"))
    return (f"{name}: {meta.get('gpu', '?')}, {str(meta.get('date', ''))[:10]}, "
            f"{len(rows) - len(error_rows(data))} rows measured"
            + (f", {len(error_rows(data))} failed" if error_rows(data) else "")
            + f"; inputs {', '.join(inputs_of(data)) or '-'}; precisions "
            f"{', '.join(sorted({r.get('precision', '?') for r in rows})) or '-'}; tokens "
            f"{', '.join(str(t) for t in sorted({int(r.get('tokens') or 0) for r in rows} - {0}))}"
            + (f"; copy bandwidth {bw:.0f} GB/s" if bw else ""))


def decode_table(data: dict, precision: str = "fp16", input=None, name: str = ""):
    """A :class:`gemmcourse.notebook.Table` of the decode rows (M <= DECODE_M): the weights'
    bytes, the time the fewest bytes take at the copy bandwidth, and each side's time and %
    of the copy bandwidth, with the rung ``auto`` ran (its configuration is in the file)."""
    from gemmcourse.notebook import Table

    input = input or (inputs_of(data) or [None])[0]
    copy = _num(data.get("meta", {}).get("dram_copy_gbps"))
    body = []
    for d in measured_records(data, precision, input):
        if d["phase"] != "decode":
            continue
        in_b = 2 if precision in ("fp16", "bf16") else 4
        wb = in_b * d["K"] * d["N"]
        bound = None if not copy else 1e6 * min_bytes(d["M"], d["N"], d["K"], in_b) / (copy * 1e9)
        body.append((d["model"], d["layer"], d["tokens"], f"{wb / 2**20:.0f}",
                     _f(bound, ".1f"), kernel_family(d["kernel"]),
                     _f(None if d["ms"] is None else 1e3 * d["ms"], ".1f"),
                     _f(d["dram_pct"], ".0f", "%"),
                     _f(None if d["ref_ms"] is None else 1e3 * d["ref_ms"], ".1f"),
                     _f(d["ref_dram_pct"], ".0f", "%")))
    meta = data.get("meta", {})
    ref = next((d["reference"] for d in measured_records(data, precision, input)), "reference")
    return Table(("model", "layer", "T", "B, MiB", "bound, µs", "gemmlib kernel", "µs",
                  "% of copy", f"{ref.split('.')[0]}, µs", "% of copy"), body,
                 caption=f"Decode rows, {precision}, {input} inputs, {meta.get('gpu', '?')}: "
                         f"bound = the fewest bytes at the copy bandwidth, "
                         f"{_f(copy, '.0f')} GB/s, measured in the same run"
                         + (f" ({name})" if name else ""))


def bandwidth_vs_tiles(data: dict, precision: str = "fp16", kernel: str = "wgmma_ws",
                       input=None):
    """[(tiles of 128 x 256, % of copy bandwidth)] of the decode rows that ``kernel`` ran,
    sorted by tiles; and the Spearman rank correlation of the two (None under 3 rows)."""
    input = input or (inputs_of(data) or [None])[0]
    pts = sorted((tiles(d["M"], d["N"]), d["dram_pct"])
                 for d in measured_records(data, precision, input)
                 if d["phase"] == "decode" and d["kernel"].startswith(kernel)
                 and d["dram_pct"] is not None)
    return pts, rank_correlation(pts)


def rank_correlation(pts):
    """Spearman's rank correlation of the pairs ``pts`` (ties share their mean rank); None
    under 3 pairs or when one side is constant."""
    if len(pts) < 3:
        return None

    def ranks(xs):
        order = sorted(range(len(xs)), key=lambda i: xs[i])
        r = [0.0] * len(xs)
        i = 0
        while i < len(xs):
            j = i
            while j + 1 < len(xs) and xs[order[j + 1]] == xs[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2
            i = j + 1
        return r

    a, b = ranks([p[0] for p in pts]), ranks([p[1] for p in pts])
    if len(set(a)) < 2 or len(set(b)) < 2:
        return None
    return float(np.corrcoef(a, b)[0, 1])


def pct_summary(data: dict, precision: str, input=None) -> dict:
    """{phase: (rows, geometric mean % of the reference, lowest, highest)} of one file."""
    out = {}
    for ph in ("decode", "prefill", "sweep"):
        v = [d["pct"] for d in measured_records(data, precision, input)
             if d["phase"] == ph and d["pct"]]
        if v:
            out[ph] = (len(v), math.exp(sum(map(math.log, v)) / len(v)), min(v), max(v))
    return out


def plot_models_roofline(data: dict | None = None, precision: str = "fp16", input=None,
                         title=None, ax=None):
    """The roofline of a file's GPU (:func:`gpu_roof`) with every suite shape placed on it
    (hollow: computed, where the roof is at its intensity) and, from the file, the measured
    rate of gemmlib (filled) and of the framework's matmul (x) for ``precision``. The legend
    sits under the plot, clear of the points."""
    plt = _plt()
    roof = gpu_roof(data)
    if ax is None:
        _, ax = plt.subplots(figsize=(PAGE_IN, 6.4))
    fig = ax.figure
    x = np.logspace(-0.5, 4.2, 300)
    y = np.minimum(roof["tc_tflops"], x * roof["dram_gbps"] / 1e3)
    ax.loglog(x, y, "k-", lw=2, label="the roof")
    R = ridge(roof)
    ax.axvline(R, color="grey", ls=":", lw=1)
    ax.text(R * 1.1, roof["tc_tflops"] * 0.004, f"ridge\n{R:.0f} FLOP/B", fontsize=FONT,
            color="#555")
    ax.axvspan(x[0], R, color="#deebf7", alpha=0.5, lw=0)
    for d in shape_records():
        ai = d["intensity"]
        c = TOKEN_COLOURS.get(d["tokens"], "grey")
        ax.plot([ai], [attainable_tflops(ai, roof)], MODEL_MARKERS.get(d["model"], "o"),
                mfc="none", mec=c, ms=8, mew=1.3)
    recs = measured_records(data or {}, precision, input or (inputs_of(data or {}) or [None])[0])
    for d in recs:
        ai = intensity(d["M"], d["N"], d["K"])
        c = TOKEN_COLOURS.get(d["tokens"], "grey")
        mk = MODEL_MARKERS.get(d["model"], "o")
        if d["tflops"]:
            ax.plot([ai], [d["tflops"]], mk, color=c, mec="k", mew=0.5, ms=6)
        if d["ref_tflops"]:
            ax.plot([ai], [d["ref_tflops"]], "x", color=c, ms=7, mew=1.6)
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], marker="s", ls="", color=c, label=f"T = {t}")
               for t, c in TOKEN_COLOURS.items()]
    handles += [Line2D([], [], marker=MODEL_MARKERS[m], ls="", mfc="none", mec="k",
                       label=f"{m} (computed)") for m in MODEL_MARKERS]
    if recs:
        handles += [Line2D([], [], marker="o", ls="", color="grey", mec="k",
                           label="gemmlib (measured)"),
                    Line2D([], [], marker="x", ls="", color="grey",
                           label=f"{recs[0]['reference']} (measured)")]
    fig.legend(handles=handles, fontsize=FONT, loc="lower center", ncol=3, frameon=False)
    ax.set_xlabel("FLOP per byte (fp16 A, B read once; fp32 C written once)", fontsize=FONT)
    ax.set_ylabel("TFLOP/s", fontsize=FONT)
    ax.tick_params(labelsize=FONT)
    ax.set_ylim(0.3, roof["tc_tflops"] * 2.5)
    ax.grid(True, which="both", alpha=0.25)
    meas = f"measured {precision}" if recs else "no measured points"
    ax.set_title(title or f"{roof['name']} ({meas})\nroof: {roof['tc_tflops']:.0f} TFLOP/s "
                 f"fp16 ({roof.get('tc_source', 'datasheet')}), {roof['dram_gbps']:.0f} GB/s "
                 f"({roof['bw_source']})", fontsize=FONT + 1)
    fig.tight_layout(rect=(0, 0.2 if recs else 0.16, 1, 1))
    return fig


def plot_pct_heat(data: dict, input=None, precisions=None, title=None):
    """Per precision a heat table of % of the framework's matmul (time of theirs / time of
    gemmlib) by model and layer (rows) and tokens (columns), one above the other; decode
    cells also give the % of the measured copy bandwidth.  Grey: not measured; "failed": a
    row with an error."""
    plt = _plt()
    input = input or (inputs_of(data) or [None])[0]
    rows = data.get("rows", []) if isinstance(data, dict) else []
    precisions = precisions or sorted({r.get("precision") for r in rows if r.get("precision")},
                                      key=_prec_key)
    models = [m for m in MODELS if any(r.get("model") == m for r in rows)] or list(MODELS)
    toks = sorted({int(r.get("tokens") or 0) for r in rows if r.get("model") in MODELS}
                  | set(TOKENS))
    keys = _row_keys(models)
    n = max(len(precisions), 1)
    fig, axes = plt.subplots(n, 1, figsize=(PAGE_IN - 0.3, n * (0.55 * len(keys) + 1.2) + 1.4),
                             squeeze=False, layout="constrained")
    im = None
    for ax, prec in zip(axes[:, 0], precisions or [None]):
        vals = np.full((len(keys), len(toks)), np.nan)
        texts = np.full(vals.shape, "-", dtype=object)
        for d in measured_records(data, prec, input):
            if (d["model"], d["layer"]) not in keys or d["tokens"] not in toks:
                continue
            i, j = keys.index((d["model"], d["layer"])), toks.index(d["tokens"])
            vals[i, j] = d["pct"] if d["pct"] is not None else np.nan
            texts[i, j] = _f(d["pct"], ".0f", "%") + (
                f"\nBW {d['dram_pct']:.0f}%" if d["phase"] == "decode" and d["dram_pct"] else "")
        for r in error_rows(data):
            if r.get("precision") == prec and (r.get("model"), r.get("layer")) in keys \
                    and int(r.get("tokens") or 0) in toks and r.get("input", input) == input:
                texts[keys.index((r["model"], r["layer"])), toks.index(int(r["tokens"]))] = "failed"
        im = _heat(ax, vals, texts, [f"{m} {layer}" for m, layer in keys],
                   [f"T={t}" for t in toks], vmax=100.0)
        ax.set_title(f"{prec}: % of {input}'s matmul" + (" (decode: and % of copy BW)"
                                                          if any(t <= DECODE_M for t in toks)
                                                          else ""), fontsize=FONT + 1)
    if im is not None:
        fig.colorbar(im, ax=list(axes[:, 0]), orientation="horizontal", fraction=0.04,
                     label="% of the framework's matmul (100 = as fast)")
    meta = data.get("meta", {}) if isinstance(data, dict) else {}
    fig.suptitle(title or f"gemmlib.matmul against {input}.matmul, loop timing,\non "
                 f"{meta.get('gpu', '?')}", fontsize=FONT + 1)
    return fig


def sweep_table(data: dict, input=None, name: str = ""):
    """The suite's extra shapes (earlier sweeps), per precision: the rung ``auto`` ran, the
    TFLOP/s of each side, % of the framework and the 128 x 256 tiles against the file's SMs."""
    from gemmcourse.notebook import Table

    input = input or (inputs_of(data) or [None])[0]
    sms = int(data.get("meta", {}).get("sm_count") or 132)
    body = []
    for d in measured_records(data, None, input):
        if d["phase"] != "sweep":
            continue
        t = tile_record(d["M"], d["N"], d["K"], sms)
        body.append((d["precision"], _label(d), kernel_family(d["kernel"]),
                     _f(d["tflops"], ".0f"), _f(d["ref_tflops"], ".0f"), _f(d["pct"], ".1f", "%"),
                     t["tiles"]))
    return Table(("precision", "M x N x K", "gemmlib kernel", "TFLOP/s", "framework",
                  "% of it", "tiles"), body,
                 caption=f"The suite's extra shapes on {data.get('meta', {}).get('gpu', '?')} "
                         f"(TFLOP/s; 128 x 256 tiles on {sms} SMs)"
                         + (f" ({name})" if name else ""))


# --------------------------------------------------------------------------
# Which kernel ran, and the suite's summary (measured)


@lru_cache(maxsize=None)
def _rung_modules() -> tuple:
    import pkgutil

    import gemmlib.kernels

    return tuple(sorted((m.name for m in pkgutil.iter_modules(gemmlib.kernels.__path__)),
                        key=len, reverse=True))


def kernel_family(name: str) -> str:
    """The rung a kernel name belongs to: the longest module of ``gemmlib.kernels`` that
    starts it ("wgmma_split_k_64x256_s3" -> "wgmma_split_k"); the name itself otherwise."""
    name = str(name)
    return next((m for m in _rung_modules() if name == m or name.startswith(m + "_")), name)


def kernels_by_tokens(data: dict, input=None) -> dict:
    """{precision: {tokens: {rung: rows}}} of a models file's measured rows (tokens 0: the
    suite's extra shapes), from each row's ``kernel``: which rung ``auto`` ran where."""
    out = {}
    for d in measured_records(data, None, input):
        fam = kernel_family(d["kernel"])
        by = out.setdefault(d["precision"], {}).setdefault(d["tokens"], {})
        by[fam] = by.get(fam, 0) + 1
    return out


def kernel_table(data: dict, input=None, name: str = ""):
    """A :class:`gemmcourse.notebook.Table` of :func:`kernels_by_tokens`: per token count
    (a row) and precision (a column), how many of the suite's shapes each rung ran."""
    from gemmcourse.notebook import Table

    by = kernels_by_tokens(data, input)
    toks = sorted({t for v in by.values() for t in v}, key=lambda t: (t == 0, t))
    precs = sorted(by, key=_prec_key)
    body = [[f"T={t}" if t else "extra shapes"]
            + [", ".join(f"{n} {k}" for k, n in sorted(by[prec].get(t, {}).items(),
                                                       key=lambda kv: (-kv[1], kv[0]))) or "-"
               for prec in precs]
            for t in toks]
    meta = data.get("meta", {}) if isinstance(data, dict) else {}
    return Table(["tokens"] + precs, body,
                 caption=f"The rung auto ran (the rows' kernel column), shapes per cell: "
                         f"{meta.get('gpu', '?')}" + (f" ({name})" if name else ""))


def suite_summary(data: dict, threshold: float = 60.0) -> list:
    """Per input and precision of a models file (``gemmlib.bench_models.summary``'s view):
    dicts of input, precision, reference, shapes, gmean (geometric mean % of the
    framework), lowest (its %), lowest_shape (model layer M x N x K), below (shapes under
    ``threshold`` %) and failed (rows with an error)."""
    out = []
    recs = [d for d in measured_records(data) if d["pct"]]
    errs = error_rows(data) if isinstance(data, dict) else []
    for inp in sorted({d["input"] for d in recs}):
        for prec in sorted({d["precision"] for d in recs if d["input"] == inp},
                           key=_prec_key):
            ds = [d for d in recs if d["input"] == inp and d["precision"] == prec]
            low = min(ds, key=lambda d: d["pct"])
            out.append(dict(input=inp, precision=prec, reference=ds[0]["reference"],
                            shapes=len(ds),
                            gmean=math.exp(sum(math.log(d["pct"]) for d in ds) / len(ds)),
                            lowest=low["pct"],
                            lowest_shape=f"{low['model']} {low['layer']} {_label(low)}".replace(
                                "  ", " "),
                            below=sum(d["pct"] < threshold for d in ds),
                            failed=sum(r.get("input", inp) == inp and r.get("precision") == prec
                                       for r in errs)))
    return out


def suite_summary_table(files, threshold: float = 60.0):
    """A :class:`gemmcourse.notebook.Table` of :func:`suite_summary` for every (name, data)."""
    from gemmcourse.notebook import Table

    body = []
    for name, data in files:
        meta = data.get("meta", {})
        for s in suite_summary(data, threshold):
            body.append((f"{meta.get('gpu', '?')}, {str(meta.get('date', ''))[:10]}", s["input"],
                         s["precision"], s["shapes"], f"{s['gmean']:.1f}%",
                         f"{s['lowest']:.1f}% ({s['lowest_shape']})", s["below"], s["failed"]))
    return Table(("GPU, date", "inputs", "precision", "shapes", "geometric mean % of the "
                  "framework", "lowest", f"shapes under {threshold:g}%", "rows failed"), body,
                 caption="The models suite (gemmlib.matmul against the framework's matmul, "
                         "loop timing), newest file per GPU: "
                         + (", ".join(n for n, _ in files) or "none committed"))


# --------------------------------------------------------------------------
# Split-K on Hopper: the per-shape sweep of the tensor-core paths, and the slice model

#: the candidates the sweep times (scripts/tc_shapes_gpu.py) that the figure draws
TC_CANDIDATES = {"ws": ("wgmma_ws (128x256 tiles, no split)", "#888888", "s", "-"),
                 "skinny": ("skinny", "#e6550d", "^", "--"),
                 "auto": ("auto (what gemmlib.matmul ran)", "#2171b5", "o", "-")}
#: DRAM bus width (bits) of the GPUs the committed files come from (NVIDIA's datasheets:
#: five and six 1024-bit HBM stacks); with a file's memory clock it gives the DRAM peak
MEMORY_BUS_BITS = {"H200": 6144, "H100": 5120}


def tc_shapes_files(directory=None):
    """The newest ``tc-shapes-<gpu>-<date>.json`` per GPU (``scripts/tc_shapes_gpu.py``: per
    shape, precision and candidate kernel its time as % of torch.matmul): [(name, data)]."""
    return _newest_files("tc-shapes-*.json", directory)


def tc_records(data: dict, precision=None, candidate=None):
    """The measured rows of a tc-shapes file, normalised: precision, model ("sweep" for the
    extra shapes), layer, M, N, K, candidate, kernel, pct (% of torch.matmul), us, torch_us,
    splits, grid."""
    out = []
    for r in data.get("rows", []) if isinstance(data, dict) else []:
        if not isinstance(r, dict) or "error" in r \
                or (precision and r.get("precision") != precision) \
                or (candidate and r.get("candidate") != candidate):
            continue
        model, _, layer = str(r.get("shape", "sweep")).rpartition(".")   # "llama-3.1-8b.o"
        model = model or layer
        layer = "" if model == layer else layer
        out.append(dict(precision=r.get("precision", "?"), model=model, layer=layer,
                        M=int(r["M"]), N=int(r["N"]), K=int(r["K"]),
                        candidate=r.get("candidate", "?"), kernel=str(r.get("kernel", "?")),
                        pct=_num(r.get("pct_of_torch")), us=_num(r.get("median_us")),
                        torch_us=_num(r.get("torch_us")), splits=int(r.get("splits") or 1),
                        grid=r.get("grid")))
    return out


def _gmean(v):
    return math.exp(sum(map(math.log, v)) / len(v)) if v else None


def tc_summary(data: dict) -> dict:
    """{precision: dict(shapes, ws, auto, faster, split, skinny)} of a tc-shapes file: the
    shapes timed with both ``ws`` and ``auto``, their geometric mean % of torch.matmul, the
    shapes where auto was faster than ws, and the auto rows that ran split-K with more than
    one slice or the skinny rung."""
    out = {}
    for prec in sorted({d["precision"] for d in tc_records(data)}, key=_prec_key):
        by = {}
        for d in tc_records(data, prec):
            if d["pct"]:
                by.setdefault((d["M"], d["N"], d["K"]), {})[d["candidate"]] = d
        both = [c for c in by.values() if "ws" in c and "auto" in c]
        out[prec] = dict(shapes=len(both), ws=_gmean([c["ws"]["pct"] for c in both]),
                         auto=_gmean([c["auto"]["pct"] for c in both]),
                         faster=sum(c["auto"]["pct"] > c["ws"]["pct"] for c in both),
                         split=sum(c["auto"]["splits"] > 1
                                   and kernel_family(c["auto"]["kernel"]) == "wgmma_split_k"
                                   for c in both),
                         skinny=sum(kernel_family(c["auto"]["kernel"]) == "skinny"
                                    for c in both))
    return out


def _tc_panels(data: dict, precision: str, candidates):
    """(records, the (model, layer) panels that have rows, the extra shapes) of a tc-shapes
    file for ``precision``."""
    recs = [d for d in tc_records(data, precision) if d["candidate"] in candidates and d["pct"]]
    panels = [(m, layer) for m in MODELS for layer in LAYERS
              if any(d["model"] == m and d["layer"] == layer for d in recs)]
    sweep = sorted({(d["M"], d["N"], d["K"]) for d in recs if d["model"] not in MODELS},
                   key=lambda s: (s[0] * s[1], s))
    return recs, panels, sweep


def _tc_layer_panel(ax, ds, candidates, top, fontsize=FONT):
    """One projection: % of torch.matmul against M, a line per candidate; auto's markers say
    what it ran (hollow: one slice; filled, with S: split-K; triangle: skinny)."""
    ms = sorted({d["M"] for d in ds})
    for cand in candidates:
        pts = sorted((ms.index(d["M"]), d) for d in ds if d["candidate"] == cand)
        if not pts:
            continue
        label, colour, marker, ls = TC_CANDIDATES.get(cand, (cand, "k", "o", "-"))
        ax.plot([x for x, _ in pts], [d["pct"] for _, d in pts], ls, color=colour, lw=1.4,
                label=label)
        for x, d in pts:
            fam = kernel_family(d["kernel"])
            mk = "^" if fam == "skinny" else marker
            filled = cand != "auto" or (fam == "wgmma_split_k" and d["splits"] > 1)
            ax.plot([x], [d["pct"]], mk, color=colour, mfc=colour if filled else "white", ms=6)
            if cand == "auto" and d["splits"] > 1:
                ax.annotate(f"S={d['splits']}", (x, d["pct"]), textcoords="offset points",
                            xytext=(0, 6), ha="center", fontsize=fontsize, color=colour)
    ax.set_xticks(range(len(ms)), [str(v) for v in ms], fontsize=fontsize)
    ax.set_xlabel("M (tokens)", fontsize=fontsize)
    ax.set_xlim(-0.5, len(ms) - 0.5)
    _tc_axes(ax, top, fontsize)


def _tc_axes(ax, top, fontsize):
    ax.axhline(100, color="k", ls=":", lw=0.8)
    ax.set_ylim(0, top)
    ax.tick_params(axis="y", labelsize=fontsize)
    ax.grid(True, axis="y", alpha=0.25)


def _tc_sweep_panel(ax, recs, sweep, candidates, top, fontsize=FONT):
    """The extra shapes: a group of bars per shape, one bar per candidate."""
    there = [c for c in candidates if any(d["candidate"] == c and d["model"] not in MODELS
                                          for d in recs)]
    w = 0.8 / max(len(there), 1)
    for i, cand in enumerate(there):
        label, colour, _, _ = TC_CANDIDATES.get(cand, (cand, "k", "o", "-"))
        for j, shp in enumerate(sweep):
            d = next((d for d in recs if d["candidate"] == cand
                      and (d["M"], d["N"], d["K"]) == shp and d["model"] not in MODELS), None)
            if d is None:
                continue
            x = j + (i - (len(there) - 1) / 2) * w
            ax.bar(x, d["pct"], w, color=colour, label=label if j == 0 else None)
            if cand == "auto" and d["splits"] > 1:
                ax.text(x, d["pct"] + 1, f"S={d['splits']}", ha="center", fontsize=fontsize,
                        color=colour)
    ax.set_xticks(range(len(sweep)), ["x".join(map(str, s)) for s in sweep], fontsize=fontsize,
                  rotation=20, ha="right")
    _tc_axes(ax, top, fontsize)


def plot_tc_shapes_by_model(data: dict, precision: str = "fp16",
                            candidates=tuple(TC_CANDIDATES)):
    """:func:`plot_tc_shapes` as figures a page can show at full size: one per model (a
    panel per layer, two by two) and one for the extra shapes. Returns the figures (one
    with a note when the file has no rows for ``precision``)."""
    plt = _plt()
    recs, panels, sweep = _tc_panels(data, precision, candidates)
    meta = data.get("meta", {}) if isinstance(data, dict) else {}
    if not panels and not sweep:
        fig, ax = plt.subplots(figsize=(PAGE_IN, 1.5))
        ax.axis("off")
        ax.text(0.5, 0.5, f"no {precision} rows in this file", ha="center", va="center")
        return [fig]
    top = max([d["pct"] for d in recs] + [100.0]) * 1.15
    figs = []
    for m in MODELS:
        mine = [p for p in panels if p[0] == m]
        if not mine:
            continue
        rows = cdiv(len(mine), 2)
        fig, axes = plt.subplots(rows, 2, figsize=(PAGE_IN, 2.9 * rows + 1.3), squeeze=False,
                                 sharey=True)
        for ax, (_, layer) in zip(axes.flat, mine):
            ds = [d for d in recs if d["model"] == m and d["layer"] == layer]
            _tc_layer_panel(ax, ds, candidates, top)
            ax.set_title(f"{layer}: N={ds[0]['N']}, K={ds[0]['K']}", fontsize=FONT + 1)
        for ax in list(axes.flat)[len(mine):]:
            ax.axis("off")
        for row in axes:
            row[0].set_ylabel("% of torch.matmul", fontsize=FONT)
        handles, labels = axes.flat[0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="lower center", ncol=2, fontsize=FONT, frameon=False)
        fig.suptitle(f"{m}, {precision}, {meta.get('gpu', '?')}: each kernel alone against "
                     "torch.matmul\nauto: hollow = one slice, filled = split-K with S slices, "
                     "triangle = skinny", fontsize=FONT + 1)
        fig.tight_layout(rect=(0, 0.1, 1, 1))
        figs.append(fig)
    if sweep:
        fig, ax = plt.subplots(figsize=(PAGE_IN, 3.6))
        _tc_sweep_panel(ax, recs, sweep, candidates, top)
        ax.set_ylabel("% of torch.matmul", fontsize=FONT)
        ax.set_title(f"extra shapes (M x N x K), {precision}, {meta.get('gpu', '?')}",
                     fontsize=FONT + 1)
        ax.legend(fontsize=FONT, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
        fig.tight_layout()
        figs.append(fig)
    return figs


def plot_tc_shapes(data: dict, precision: str = "fp16", candidates=tuple(TC_CANDIDATES),
                   title=None):
    """Per projection of the suite (one panel each) the % of torch.matmul against M of the
    candidates of a tc-shapes file (kernel timing); auto's points say what it ran (hollow:
    one slice; filled, with S: split-K; triangle: skinny).  A last panel: the extra shapes
    as bars.  A note on empty axes when the file has no rows for ``precision``.  One wide
    figure for a screen; the book's pages use :func:`plot_tc_shapes_by_model`."""
    plt = _plt()
    recs, panels, sweep = _tc_panels(data, precision, candidates)
    meta = data.get("meta", {}) if isinstance(data, dict) else {}
    n = len(panels) + (1 if sweep else 0)
    if not n:
        fig, ax = plt.subplots(figsize=(6, 2))
        ax.axis("off")
        ax.text(0.5, 0.5, f"no {precision} rows in this file", ha="center", va="center")
        return fig
    cols = 3
    fig, axes = plt.subplots(cdiv(n, cols), cols, figsize=(12, 3.0 * cdiv(n, cols) + 0.8),
                             squeeze=False)
    flat = list(axes.flat)
    top = max([d["pct"] for d in recs] + [100.0]) * 1.15
    for ax, (m, layer) in zip(flat, panels):
        ds = [d for d in recs if d["model"] == m and d["layer"] == layer]
        _tc_layer_panel(ax, ds, candidates, top, fontsize=7)
        ax.set_title(f"{m} {layer}: N={ds[0]['N']}, K={ds[0]['K']}", fontsize=8)
    if sweep:
        ax = flat[len(panels)]
        _tc_sweep_panel(ax, recs, sweep, candidates, top, fontsize=6)
        ax.set_title("extra shapes (M x N x K)", fontsize=8)
    for ax in flat[n:]:
        ax.axis("off")
    for row in axes:
        row[0].set_ylabel("% of torch.matmul", fontsize=7)
    handles, labels = flat[0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8,
                   frameon=False)
    fig.suptitle(title or f"{precision}: each kernel alone against torch.matmul (kernel loops), "
                 f"{meta.get('gpu', '?')}, {str(meta.get('date', ''))[:10]}\n(auto: hollow = "
                 "one slice, filled = split-K with S slices, triangle = skinny)", fontsize=9)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    return fig


def ws_decode_points(data: dict, copy_gbps: float, precision: str = "fp16",
                     candidate: str = "ws"):
    """[(tiles of 128 x 256, % of ``copy_gbps``)] of the decode rows (M <= DECODE_M) of a
    tc-shapes file's ``candidate``, sorted: its bandwidth is the fewest bytes (fp32 C)
    over its time."""
    if not copy_gbps:
        return []
    in_b = 4 if precision in ("fp32", "tf32", "3xtf32") else 2
    return sorted((tiles(d["M"], d["N"]),
                   100 * min_bytes(d["M"], d["N"], d["K"], in_b, 4) / (d["us"] * 1e3) / copy_gbps)
                  for d in tc_records(data, precision, candidate)
                  if d["M"] <= DECODE_M and d["model"] in MODELS and d["us"])


def copy_gbps_for(data: dict, files) -> float | None:
    """The copy bandwidth (``dram_copy_gbps``) that one of ``files`` (name, data) measured on
    the GPU of ``data`` (matched by gpu_slug, else by name); None when none did."""
    meta = data.get("meta", {}) if isinstance(data, dict) else {}
    for _, d in files:
        m = d.get("meta", {})
        same = (m.get("gpu_slug") and m.get("gpu_slug") == meta.get("gpu_slug")) \
            or (m.get("gpu") and m.get("gpu") == meta.get("gpu"))
        if same and _num(m.get("dram_copy_gbps")):
            return _num(m["dram_copy_gbps"])
    return None


def file_device(meta: dict):
    """A :class:`gemmlib.backend.DeviceInfo` for the GPU a committed file was measured on --
    what a kernel's cost model reads (``wgmma_split_k.splits_for``: SMs, fp32 peak, DRAM
    peak): the simulator's, with the file's name, SM count, SM clock, compute capability
    and L2, and the DRAM peak from its memory clock (``smi_clocks_mem``, MHz) and
    :data:`MEMORY_BUS_BITS` (0 when either is unknown)."""
    import dataclasses

    from gemmlib import backend

    name = str(meta.get("gpu", "?"))
    try:
        cc = tuple(int(v) for v in str(meta.get("compute_capability", "9.0")).split("."))[:2]
    except ValueError:
        cc = (9, 0)
    bits = next((v for k, v in MEMORY_BUS_BITS.items() if k in name.upper()), 0)
    mem = _num(meta.get("smi_clocks_mem")) or 0.0
    return dataclasses.replace(backend._SIM_DEVICE, name=name, compute_capability=cc,
                               sm_count=int(meta.get("sm_count") or 132),
                               max_sm_clock_mhz=float(_num(meta.get("max_sm_clock_mhz")) or 0.0),
                               l2_bytes=int(meta.get("l2_bytes") or 0), simulated=False,
                               memory_clock_khz=int(mem * 1000) if bits else 0,
                               memory_bus_bits=bits if mem else 0)


def split_shapes():
    """A few suite shapes for the slice table: two projections per model at T = 16 and 128,
    and the extra shapes with a small output and a deep K."""
    pick = {("llama-3.1-8b", "o"), ("llama-3.1-8b", "down"), ("qwen2.5-72b", "qkv"),
            ("qwen2.5-72b", "gate_up")}
    out = [(d["model"], d["layer"], d["M"], d["N"], d["K"])
           for d in shape_records(tokens=(16, 128), extra=False)
           if (d["model"], d["layer"]) in pick]
    out += [("sweep", "", M, N, K) for M, N, K in EXTRA_SHAPES if 4 * M * N <= K * K]
    return out


def split_choice_table(data: dict, precision: str = "fp16", shapes=None, name: str = ""):
    """A :class:`gemmcourse.notebook.Table`: per shape (:func:`split_shapes`) the slices
    ``wgmma_split_k.splits_for`` of this gemmlib chooses on the GPU of a tc-shapes file
    (:func:`file_device`) for 64- and 128-row tiles, beside the rung ``auto`` ran in the
    file and the slices it recorded.  None when the rung is not there."""
    from gemmcourse.notebook import Table

    W = split_k_module()
    if W is None:
        return None
    meta = data.get("meta", {}) if isinstance(data, dict) else {}
    dev = file_device(meta)
    ran = {(d["M"], d["N"], d["K"]): d for d in tc_records(data, precision, "auto")}
    body = []
    for model, layer, M, N, K in shapes or split_shapes():
        row = [f"{model} {layer}".strip(), f"{M}x{N}x{K}", cdiv(K, W.BK)]
        for BM in (64, 128):
            S = W.effective_splits(W.splits_for(M, N, K, BM, 256, dev), K)
            row += [tiles(M, N, BM, 256), S]
        d = ran.get((M, N, K))
        row += [kernel_family(d["kernel"]), d["splits"]] if d else ["-", "-"]
        body.append(row)
    return Table(("shape", "M x N x K", "k-tiles", "64-row tiles", "S", "128-row tiles", "S",
                  "auto ran", "its S"), body,
                 caption=f"Slices from this gemmlib's wgmma_split_k.splits_for on "
                         f"{dev.name} ({dev.sm_count} SMs, {dev.fp32_peak_tflops:.1f} TFLOP/s "
                         f"fp32, {dev.peak_bandwidth_gbs:.0f} GB/s DRAM peak), and what the "
                         f"sweep ran ({precision}" + (f", {name}" if name else "") + ")")


def split_k_workspace_bytes(M: int, N: int, K: int, S: int, BM: int = 64, BN: int = 256,
                            precision: str = "fp16") -> int:
    """Bytes of the workspace arrays (partials W and tickets L) that ``wgmma_split_k`` with
    BM x BN tiles and S slices takes for (M, N, K): from the rung's own ``workspace``."""
    W = split_k_module()
    spec = W.build(precision, BM=BM, BN=BN, SPLITS=S)
    return sum(r * c * np.dtype(t).itemsize for r, c, t in spec.workspace(M, N, K))


# --------------------------------------------------------------------------
# The host cost of a call


def host_cost_sources(directory=None):
    """[(label, file, data)]: the newest ``results/host-cost-<gpu>-<date>.json`` per GPU that
    has a ``frameworks`` list, then every early ``results/models-*/host-cost-*.json`` (not
    the ``*-before-*`` copies of files that a newer run replaced)."""
    from gemmcourse.notebook import _newest_per_gpu, committed_json, repo_root

    if directory is None:
        root = repo_root()
        if root is None:
            return []
        directory = root / "results"
    directory = Path(directory)
    withfw = [(n, d) for n, d in committed_json("host-cost-*.json", directory)
              if isinstance(d, dict) and d.get("frameworks")]
    out = [(f"{d.get('meta', {}).get('gpu', '?')}, {str(d.get('meta', {}).get('date', ''))[:10]}",
            n, d) for n, d in _newest_per_gpu(withfw)]
    for p in sorted(directory.glob("models-*/host-cost-*.json")):
        if "-before-" in p.name:
            continue
        try:
            d = json.loads(p.read_text())
        except (OSError, ValueError) as e:
            print(f"(skipping {p.name}: {e})")
            continue
        if isinstance(d, dict) and d.get("frameworks"):
            meta = d.get("meta", {})
            out.append((f"{meta.get('gpu', '?')}, {str(meta.get('date', ''))[:10]}, early "
                        f"measurement", f"{p.parent.name}/{p.name}", d))
    return out


def frameworks_table(data: dict, label: str = ""):
    """A :class:`gemmcourse.notebook.Table` of one host-cost file's ``frameworks`` rows."""
    from gemmcourse.notebook import Table

    body = []
    for r in data.get("frameworks", []):
        ratio = _num(r.get("torch_ratio", r.get("cupy_ratio")))
        body.append((r.get("case", "?"), _f(_num(r.get("gemmlib_us")), ".1f"),
                     r.get("reference", "?"), _f(_num(r.get("reference_us")), ".1f"),
                     _f(ratio, ".2f", "x")))
    shape = "x".join(str(v) for v in data.get("shape", [])) or "?"
    return Table(("inputs", "gemmlib.matmul(A, B), host us", "reference", "reference host us",
                  "ratio"), body,
                 caption=f"Host time of one call, back to back, {shape}: {label}")


def suite_host_summary(data: dict):
    """{(input, precision): (rows, median gemmlib host us, median reference host us)} over the
    measured rows of a models file (each row's host_us: median of back-to-back calls)."""
    out = {}
    groups = {}
    for d in measured_records(data):
        if d["host_us"] is not None and d["ref_host_us"] is not None:
            groups.setdefault((d["input"], d["precision"]), []).append(d)
    for key, ds in sorted(groups.items()):
        out[key] = (len(ds), statistics.median(d["host_us"] for d in ds),
                    statistics.median(d["ref_host_us"] for d in ds))
    return out


def host_panels(sources, models=()):
    """[(title, rows)] of :func:`plot_host_frameworks`: per host-cost source (label, file,
    data) its ``frameworks`` cases, gemmlib beside the framework's own matmul; per models
    file (name, data) the median over its rows. A row: (label, gemmlib us, reference us,
    reference name)."""
    def shape(d):
        return "x".join(str(v) for v in d.get("shape", [])) or "?"

    panels = [(f"{lab}: {shape(d)}, median of back-to-back calls",
               [(r.get("case", "?"), _num(r.get("gemmlib_us")), _num(r.get("reference_us")),
                 r.get("reference", "")) for r in d.get("frameworks", [])])
              for lab, name, d in sources]
    for name, d in models:
        meta = d.get("meta", {})
        rows = [(f"{inp} {prec}\n({n} shapes)", g, ref, f"{inp}.matmul")
                for (inp, prec), (n, g, ref) in suite_host_summary(d).items()]
        if rows:
            panels.append((f"{meta.get('gpu', '?')}: the suite's shapes, median of the rows' "
                           "host time", rows))
    return panels


def plot_host_panel(title: str, rows, ax=None):
    """One panel of host microseconds per call: a pair of bars per row, gemmlib and the
    framework's matmul, each labelled with its value (the framework's also with the ratio)."""
    import textwrap

    plt = _plt()
    if ax is None:
        _, ax = plt.subplots(figsize=(PAGE_IN, 0.62 * max(len(rows), 1) + 1.9))
    fig = ax.figure
    y = np.arange(len(rows))[::-1]
    h = 0.38
    g = [r[1] or 0.0 for r in rows]
    ref = [r[2] or 0.0 for r in rows]
    ax.barh(y + h / 2, g, h, color="#4a7fb5", label="gemmlib.matmul(A, B)")
    ax.barh(y - h / 2, ref, h, color="#bbbbbb", label="the framework's matmul")
    top = max(g + ref + [1.0])
    for yy, a, b in zip(y, g, ref):
        ax.text(a + 0.01 * top, yy + h / 2, f"{a:.1f}", va="center", fontsize=FONT)
        ax.text(b + 0.01 * top, yy - h / 2, f"{b:.1f}" + (f"  ({a / b:.2f}x)" if b else ""),
                va="center", fontsize=FONT)
    ax.set_yticks(y, [r[0] for r in rows], fontsize=FONT)
    ax.set_xlim(0, top * 1.45)
    ax.tick_params(axis="x", labelsize=FONT)
    ax.set_xlabel("host µs per call (median, back to back)", fontsize=FONT)
    ax.set_title("\n".join(textwrap.wrap(title, 70)), fontsize=FONT + 1)
    ax.legend(fontsize=FONT, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2,
              frameon=False)
    fig.tight_layout()
    return fig


def plot_host_frameworks(sources, models=(), title=None):
    """Every panel of :func:`host_panels` side by side in one figure (for a wide screen; the
    book's pages show each with :func:`plot_host_panel`). Returns the figure (a note on an
    empty axes when nothing)."""
    plt = _plt()
    panels = host_panels(sources, models)
    n = max(len(panels), 1)
    fig, axes = plt.subplots(1, n, figsize=(5.6 * n, 4.0), squeeze=False)
    if not panels:
        axes[0][0].text(0.5, 0.5, f"host cost against the frameworks {NOT_MEASURED}",
                        ha="center", transform=axes[0][0].transAxes)
        return fig
    for ax, (lab, rows) in zip(axes[0], panels):
        plot_host_panel(lab, rows, ax=ax)
    fig.suptitle(title or "what a call costs the host: gemmlib against the frameworks' matmul",
                 fontsize=10)
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------
# Streams: why the launch goes on torch's current stream (a model, no GPU)


def stream_schedule(ops, issue: float = 1.0):
    """Run a list of GPU operations through a model of CUDA streams.

    ``ops``: dicts with ``name``, ``stream``, ``dur``, and optionally ``reads`` /
    ``writes`` (buffer names).  The host issues them in list order, ``issue`` apart; an
    operation starts once it is issued and everything issued earlier *on its stream* has
    finished -- streams are ordered inside, not with each other.  Returns (schedule,
    hazards): per op its start and end; and (reader, writer, buffer) for every operation
    that read a buffer before an earlier-issued write to it had finished."""
    done, sched = {}, []
    for i, op in enumerate(ops):
        t = i * issue
        start = max([t] + [done[o["name"]] for o in ops[:i] if o["stream"] == op["stream"]])
        end = start + op["dur"]
        done[op["name"]] = end
        sched.append(dict(op, start=start, end=end))
    hazards = []
    for i, op in enumerate(sched):
        for w in sched[:i]:
            for buf in set(op.get("reads", ())) & set(w.get("writes", ())):
                if op["start"] < w["end"]:
                    hazards.append((op["name"], w["name"], buf))
    return sched, hazards


def side_stream_ops(gemm_stream: str):
    """torch code on a side stream: fill A (slow), ``C = gemmlib.matmul(A, B)`` launched on
    ``gemm_stream``, then torch reads C on the side stream."""
    side = "torch side stream s"
    return [dict(name="A.copy_(x)", stream=side, dur=3.0, writes=("A",)),
            dict(name="gemmlib.matmul(A, B)", stream=gemm_stream, dur=5.0, reads=("A", "B"),
                 writes=("C",)),
            dict(name="torch.relu(C)", stream=side, dur=1.0, reads=("C",))]


def plot_streams(title=None):
    """Two runs of :func:`side_stream_ops` through :func:`stream_schedule`: the product on
    torch's current stream (the side stream), and on another stream; hazards in red."""
    plt = _plt()
    cases = [("on torch.cuda.current_stream()", "torch side stream s"),
             ("on another stream (e.g. CuPy's default)", "another stream")]
    fig, axes = plt.subplots(2, 1, figsize=(PAGE_IN, 6.2), sharex=True)
    end = 0.0
    for ax, (lab, where) in zip(axes, cases):
        sched, hazards = stream_schedule(side_stream_ops(where))
        bad = {h[0] for h in hazards}
        streams = list(dict.fromkeys(o["stream"] for o in sched))
        for o in sched:
            y = streams.index(o["stream"])
            ax.barh(y, o["end"] - o["start"], left=o["start"], height=0.6, edgecolor="k",
                    color="#f4cccc" if o["name"] in bad else "#b6d7a8")
            short = o["end"] - o["start"] < 2
            label = o["name"].replace(".", ".\n", 1) if short else o["name"]
            ax.text((o["start"] + o["end"]) / 2, y, label, ha="center", va="center",
                    fontsize=FONT, linespacing=1.0)
            end = max(end, o["end"])
        ax.set_yticks(range(len(streams)), [s.replace(" stream", "\nstream") for s in streams],
                      fontsize=FONT)
        ax.set_ylim(len(streams) - 0.5, -0.5)
        why = "\n".join(f"{r} reads {b} before {w} has finished" for r, w, b in hazards)
        ax.set_title(f"the product {lab}:\n" + (why or "every read comes after its write"),
                     fontsize=FONT, color="#a00" if hazards else "k")
    axes[-1].set_xlim(0, end * 1.02)
    axes[-1].set_xlabel("time (arbitrary units; the host issues one operation per unit)",
                        fontsize=FONT)
    axes[-1].tick_params(labelsize=FONT)
    fig.suptitle(title or "schematic: one stream orders the work, two streams do not",
                 fontsize=FONT + 1)
    fig.tight_layout()
    return fig


__all__ = ["REFERENCE_GPU", "WS_TILE", "CANDIDATE_TILES", "intensity", "shape_records",
           "gpu_roof", "ridge", "attainable_tflops", "bound_us", "ridge_tokens",
           "position_table", "tiles", "waves", "wave_efficiency", "row_use", "tile_record",
           "tile_table", "one_wave_splits", "split_k_table", "streamk_segments",
           "streamk_steps", "streamk_fixups", "data_parallel_segments", "plot_work_split",
           "plot_wave_heat", "skinny_module", "show_skinny_source", "skinny_blocks",
           "split_k_module", "show_split_k_source", "show_functions", "kernel_family",
           "kernels_by_tokens", "kernel_table", "suite_summary", "suite_summary_table",
           "tc_shapes_files", "tc_records", "tc_summary", "plot_tc_shapes",
           "plot_tc_shapes_by_model", "ws_decode_points", "for_gpu",
           "copy_gbps_for", "file_device", "split_shapes", "split_choice_table",
           "split_k_workspace_bytes", "rank_correlation",
           "models_files", "error_rows", "inputs_of", "measured_records", "file_summary",
           "decode_table", "bandwidth_vs_tiles", "pct_summary", "plot_models_roofline",
           "plot_pct_heat", "sweep_table", "host_cost_sources", "frameworks_table",
           "suite_host_summary", "host_panels", "plot_host_panel", "plot_host_frameworks", "stream_schedule", "side_stream_ops",
           "plot_streams"]
