"""Figures for the course, computed from the kernels' own index functions.

Nothing here re-derives a mapping by hand: every picture of "which thread
computes which element of C" calls ``spec.index["c_element"]``, the same
plain-Python function the kernel calls on the GPU.  Change the kernel's
mapping and the figures change with it.

All functions return a matplotlib ``Figure`` (or plain data, for the
``*_data`` / counting helpers, which the exercises use as answer keys).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

FLOAT_BYTES = 4
SECTOR_BYTES = 32     # the unit DRAM/L2 traffic is counted in
LINE_BYTES = 128      # one fully used warp-wide float32 access

_BLOCK_COLOURS = ["#cfe2f3", "#fce5cd", "#d9ead3", "#ead1dc", "#fff2cc", "#d0e0e3",
                  "#f4cccc", "#d9d2e9"]
_HIGHLIGHT = "#c0392b"


def _plt():
    import matplotlib.pyplot as plt

    return plt


# --------------------------------------------------------------------------
# Legibility: how the book shows a figure

#: The book's text column, in pixels: a wider figure is scaled down to fit it.
BOOK_WIDTH_PX = 750
#: The book's figures are drawn at this many pixels per inch (gemmcourse.notebook.setup).
BOOK_DPI = 100
#: The smallest text a reader should have to read, in points, at the size the page shows it.
MIN_FONT_PT = 9.0


#: Jupyter's inline backend saves a figure cropped to what it draws (``bbox_inches="tight"``)
#: plus this margin on each side, in inches: a legend or label outside the figure widens it.
SAVE_PAD_IN = 0.1


def saved_width_px(fig, dpi: float = BOOK_DPI) -> float:
    """The width of the PNG a notebook stores for ``fig`` (cropped to its drawn extent;
    measured from the artists' extents, without drawing the figure)."""
    box = fig.get_tightbbox(fig.canvas.get_renderer())
    return (box.width + 2 * SAVE_PAD_IN) * dpi


def shown_scale(fig, dpi: float = BOOK_DPI) -> float:
    """How much the book scales ``fig`` down: its column is BOOK_WIDTH_PX wide, and the
    notebook stores the figure cropped to what it draws (:func:`saved_width_px`)."""
    fig.canvas.draw()
    return min(1.0, BOOK_WIDTH_PX / saved_width_px(fig, dpi))


def legible(fig):
    """Fit ``fig`` to the book's column and raise any smaller text to MIN_FONT_PT.

    A figure wider than the column is shrunk to it rather than left for the browser to
    shrink (which would shrink its text with it); the layout is then redone around the
    larger text.  Every figure helper of the course ends with this.
    """
    from matplotlib.text import Text

    width = BOOK_WIDTH_PX / BOOK_DPI
    if fig.get_figwidth() > width:
        w, h = fig.get_size_inches()
        fig.set_size_inches(width, h * width / w)
    fig.canvas.draw()   # tick labels exist only once drawn
    for t in fig.findobj(Text):
        if t.get_visible() and t.get_text() and t.get_fontsize() < MIN_FONT_PT:
            t.set_fontsize(MIN_FONT_PT)
    _wrap_titles(fig)
    _relayout(fig)
    # Text placed outside the axes (a legend beside them, a label past the edge) widens the
    # stored PNG past the figure: narrow the figure by the excess until the PNG fits.
    for _ in range(4):
        over = saved_width_px(fig) - BOOK_WIDTH_PX
        if over <= 0:
            break
        w, h = fig.get_size_inches()
        narrower = w - (over + 1) / BOOK_DPI
        if narrower < 0.5 * width:
            break
        fig.set_size_inches(narrower, h)
        _relayout(fig)
    return fig


def _wrap_titles(fig):
    """Break a title wider than its axes (or a figure title wider than the figure) into
    lines that fit, so it neither runs off the page nor widens the stored PNG."""
    import textwrap

    renderer = fig.canvas.get_renderer()
    titles = [(ax.title, ax.get_window_extent(renderer).width) for ax in fig.axes]
    if getattr(fig, "_suptitle", None) is not None:
        titles.append((fig._suptitle, fig.bbox.width))
    for text, room in titles:
        words = text.get_text()
        wide = text.get_window_extent(renderer).width
        if not words or wide <= room or "$" in words:
            continue
        chars = max(20, int(len(words) * room / wide))
        text.set_text("\n".join(textwrap.fill(line, chars) for line in words.split("\n")))


def _relayout(fig):
    import warnings

    if not fig.get_constrained_layout():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fig.tight_layout()


def series_style(i: int) -> dict:
    """Colour and marker of the i-th data series: no two of the first 20 look alike."""
    import matplotlib.pyplot as plt

    colours = plt.get_cmap("tab20").colors
    colours = colours[0::2] + colours[1::2]          # the ten strong shades first
    markers = "osD^v<>ph*"
    return dict(color=colours[i % 20], marker=markers[i % len(markers)])


def legend_below(ax, ncol: int = 3, **kw):
    """A legend under the axes, where it cannot hide a line or a point."""
    return ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=ncol,
                     frameon=False, **kw)


def _index_fn(spec_or_fn, name="c_element"):
    """Accept a KernelSpec (use its index function) or the function itself."""
    if callable(spec_or_fn) and not hasattr(spec_or_fn, "index"):
        return spec_or_fn
    return spec_or_fn.index[name]


def _block_of(spec_or_fn, block):
    if block is not None:
        return tuple(block)[:2]
    return tuple(spec_or_fn.block)[:2]


# --------------------------------------------------------------------------
# Who computes what


@dataclass
class Ownership:
    """For every element of C: the block, thread and warp that computes it.

    Arrays have shape (M, N); -1 marks an element nobody computes (a bug).
    ``idle`` counts launched threads whose (row, col) falls outside C.
    """

    block_x: np.ndarray
    block_y: np.ndarray
    thread_x: np.ndarray
    thread_y: np.ndarray
    warp: np.ndarray          # warp number inside its block
    block_id: np.ndarray      # linear block number, x fastest
    idle: int
    duplicates: int


def ownership(spec_or_fn, M: int, N: int, *, block=None, grid=None) -> Ownership:
    """Run the index function for every thread of the launch and record the owners.

    ``grid`` defaults to ``spec.grid(M, N, K)``; for a bare function pass both
    ``block`` and ``grid``.  Threads are numbered inside a block as CUDA does,
    ``x + y * blockDim.x``, and warps are consecutive runs of 32 of them.
    """
    fn = _index_fn(spec_or_fn)
    bdx, bdy = _block_of(spec_or_fn, block)
    if grid is None:
        grid = spec_or_fn.grid(M, N, 1)
    gdx, gdy = grid[0], grid[1]
    arrays = {k: np.full((M, N), -1, dtype=np.int64) for k in
              ("bx", "by", "tx", "ty", "warp", "bid")}
    idle = dup = 0
    for by in range(gdy):
        for bx in range(gdx):
            for ty in range(bdy):
                for tx in range(bdx):
                    r, c = fn(bx, by, tx, ty)
                    if not (0 <= r < M and 0 <= c < N):
                        idle += 1
                        continue
                    if arrays["bx"][r, c] >= 0:
                        dup += 1
                    arrays["bx"][r, c], arrays["by"][r, c] = bx, by
                    arrays["tx"][r, c], arrays["ty"][r, c] = tx, ty
                    arrays["warp"][r, c] = (tx + ty * bdx) // 32
                    arrays["bid"][r, c] = bx + by * gdx
    return Ownership(arrays["bx"], arrays["by"], arrays["tx"], arrays["ty"], arrays["warp"],
                     arrays["bid"], idle, dup)


def warp_elements(spec_or_fn, warp: int = 0, block_xy=(0, 0), *, block=None):
    """The (row, col) of C computed by each of the 32 threads of one warp, in lane order."""
    fn = _index_fn(spec_or_fn)
    bdx, bdy = _block_of(spec_or_fn, block)
    out = []
    for lane in range(32):
        t = warp * 32 + lane
        if t >= bdx * bdy:
            break
        out.append(fn(block_xy[0], block_xy[1], t % bdx, t // bdx))
    return out


def plot_thread_map(spec_or_fn, M: int, N: int, *, block=None, grid=None, color_by="warp",
                    highlight_warp=0, window=None, annotate=None, title=None, ax=None):
    """C as a grid of cells, coloured by the block (or warp) that computes each one.

    ``color_by="warp"`` shades the warps of each block in turn, so you see the
    shape a warp covers: a column of C or a row of C.  The warp
    ``highlight_warp`` of block (0, 0) is outlined in red, with an arrow in the
    direction its lane number grows.  ``window=(rows, cols)`` zooms into the
    top-left corner; ``annotate`` writes each cell's (threadIdx.x, threadIdx.y)
    (default: when the window is at most 16 x 16).
    """
    plt = _plt()
    own = ownership(spec_or_fn, M, N, block=block, grid=grid)
    rows, cols = window if window else (M, N)
    rows, cols = min(rows, M), min(cols, N)
    if annotate is None:
        annotate = rows <= 16 and cols <= 16
    if ax is None:
        size = 5.5 if rows * cols > 256 else 4.5
        fig, ax = plt.subplots(figsize=(size * max(cols / rows, 0.6) ** 0.5 + 1,
                                        size * max(rows / cols, 0.6) ** 0.5))
    else:
        fig = ax.figure
    from matplotlib.colors import to_rgb

    img = np.ones((rows, cols, 3))
    for r in range(rows):
        for c in range(cols):
            b = own.block_id[r, c]
            if b < 0:
                img[r, c] = to_rgb("#000000")
                continue
            base = np.array(to_rgb(_BLOCK_COLOURS[b % len(_BLOCK_COLOURS)]))
            if color_by == "warp":
                shade = 0.70 + 0.30 * ((own.warp[r, c] % 4) / 3.0)
                base = base * shade
            img[r, c] = base
    ax.imshow(img, interpolation="nearest", extent=(-0.5, cols - 0.5, rows - 0.5, -0.5))
    # block boundaries
    for r in range(rows):
        for c in range(cols):
            if c + 1 < cols and own.block_id[r, c] != own.block_id[r, c + 1]:
                ax.plot([c + 0.5, c + 0.5], [r - 0.5, r + 0.5], color="k", lw=1.2)
            if r + 1 < rows and own.block_id[r, c] != own.block_id[r + 1, c]:
                ax.plot([c - 0.5, c + 0.5], [r + 0.5, r + 0.5], color="k", lw=1.2)
    lanes = []
    if highlight_warp is not None:
        lanes = [(r, c) for r, c in warp_elements(spec_or_fn, highlight_warp, block=block)
                 if 0 <= r < rows and 0 <= c < cols]
        for r, c in lanes:
            ax.add_patch(plt.Rectangle((c - 0.5, r - 0.5), 1, 1, fill=False,
                                       edgecolor=_HIGHLIGHT, lw=1.6 if rows <= 40 else 1.0))
        if len(lanes) >= 2:
            (r0, c0), (r1, c1) = lanes[0], lanes[-1]
            ax.annotate("", xy=(c1, r1), xytext=(c0, r0),
                        arrowprops=dict(arrowstyle="->", color=_HIGHLIGHT, lw=2))
    if annotate:
        for r in range(rows):
            for c in range(cols):
                if own.thread_x[r, c] >= 0:
                    ax.text(c, r, f"{own.thread_x[r, c]},{own.thread_y[r, c]}", ha="center", va="center",
                            fontsize=6.5 if cols > 10 else 8)
    ax.set_xlabel("column of C (j)")
    ax.set_ylabel("row of C (i)")
    name = getattr(spec_or_fn, "name", getattr(spec_or_fn, "__name__", "kernel"))
    if title is None:
        title = f"{name}: who computes C ({M}x{N})"
        if highlight_warp is not None:
            title += f"\nred: the 32 lanes of warp {highlight_warp} in block (0, 0)"
    ax.set_title(title, fontsize=10)
    ax.set_xticks(range(0, cols, max(1, cols // 8)))
    ax.set_yticks(range(0, rows, max(1, rows // 8)))
    fig.tight_layout()
    return legible(fig)


# --------------------------------------------------------------------------
# What one warp touches in memory


@dataclass
class WarpAccess:
    """Addresses one warp-wide load touches, and how many memory segments they span."""

    operand: str
    elements: list          # (row, col) per lane
    addresses: list         # byte offsets from the start of the matrix
    distinct: int           # distinct addresses (a broadcast counts once)
    sectors: int            # distinct 32-byte sectors
    lines: int              # distinct 128-byte segments

    @property
    def useful_fraction(self) -> float:
        """Bytes the warp needs / bytes of the sectors that must be fetched."""
        return self.distinct * FLOAT_BYTES / (self.sectors * SECTOR_BYTES)


def _access(operand, elements, leading_dim):
    addrs = [(r * leading_dim + c) * FLOAT_BYTES for r, c in elements]
    return WarpAccess(operand, elements, addrs, len(set(addrs)),
                      len({a // SECTOR_BYTES for a in addrs}),
                      len({a // LINE_BYTES for a in addrs}))


def warp_access(spec_or_fn, M: int, N: int, K: int, *, warp: int = 0, k: int = 0,
                block=None) -> dict:
    """What warp ``warp`` of block (0, 0) reads at step ``k`` of ``acc += A[row, k] * B[k, col]``.

    Returns {"A": WarpAccess, "B": WarpAccess}; matrices are row-major, so
    A[r, c] lives at byte (r * K + c) * 4 and B[r, c] at (r * N + c) * 4.
    Lanes whose element lies outside C are left out (they do not load).
    """
    cells = [(r, c) for r, c in warp_elements(spec_or_fn, warp, block=block)
             if 0 <= r < M and 0 <= c < N]
    a = _access("A", [(r, k) for r, _ in cells], K)
    b = _access("B", [(k, c) for _, c in cells], N)
    return {"A": a, "B": b}


def plot_warp_access(spec_or_fn, M: int, N: int, K: int, *, warp: int = 0, k: int = 0,
                     block=None, title=None):
    """Top: the cells of A and of B one warp reads at step k (red).  Bottom: the
    128-byte segments of memory those reads fall in, one box per segment the
    hardware must fetch, filled in proportion to the bytes the warp uses."""
    plt = _plt()
    acc = warp_access(spec_or_fn, M, N, K, warp=warp, k=k, block=block)
    fig = plt.figure(figsize=(10, 6.2))
    gs = fig.add_gridspec(2, 2, height_ratios=[3, 1.3])
    for col, (name, shape) in enumerate((("A", (M, K)), ("B", (K, N)))):
        ax = fig.add_subplot(gs[0, col])
        grid = np.zeros(shape)
        for r, c in acc[name].elements:
            grid[r, c] = 1
        ax.imshow(grid, cmap="Reds", vmin=0, vmax=1.2, interpolation="nearest")
        ax.set_xticks(np.arange(-0.5, shape[1], 8), minor=False, labels=[])
        ax.set_yticks(np.arange(-0.5, shape[0], 8), minor=False, labels=[])
        ax.grid(True, color="#ddd", lw=0.5)
        ax.tick_params(length=0)
        ax.set_title(f"{name} ({shape[0]}x{shape[1]}): cells the warp reads at k={k}")
        ax.set_xlabel("column (grid lines every 8)")
        ax.set_ylabel("row")
    axS = fig.add_subplot(gs[1, :])
    axS.set_axis_off()
    y = 1.0
    for name in ("A", "B"):
        a = acc[name]
        segs = sorted({x // LINE_BYTES for x in a.addresses})
        used = {s: len({x for x in a.addresses if x // LINE_BYTES == s}) for s in segs}
        axS.text(-0.6, y, f"{name}: {a.distinct} float(s) needed,\n{a.lines} segment(s) fetched",
                 ha="right", va="center", fontsize=10)
        for i, s in enumerate(segs[:32]):
            axS.add_patch(plt.Rectangle((i, y - 0.35), 0.85, 0.7, fill=False, lw=1))
            axS.add_patch(plt.Rectangle((i, y - 0.35), 0.85 * used[s] / 32, 0.7,
                                        color=_HIGHLIGHT))
        y -= 1.1
    axS.text(32, -0.75, "each box: one 128-byte segment fetched; red: the part the warp uses",
             ha="right", va="center", fontsize=9, color="#444")
    axS.set_xlim(-9, 32.5), axS.set_ylim(-1.0, 1.5)
    name = getattr(spec_or_fn, "name", "kernel")
    fig.suptitle(title or f"{name}: what warp {warp} of block (0, 0) loads at one step of k",
                 fontsize=12)
    fig.tight_layout()
    return legible(fig)


# --------------------------------------------------------------------------
# Shared-memory tiling: phases and zero-filled edges


def tile_phases(spec, M: int, N: int, K: int, block_xy=(0, 0)):
    """For one block: the rows of A / columns of B it needs and its K-phases.

    Returns (rows, cols, phases) where phases is a list of (k_start, k_stop):
    the slab of K staged in shared memory in that phase (k_stop may pass K:
    that part of the tile is filled with zeros).
    """
    fn = spec.index["c_element"]
    bdx, bdy = spec.block[:2]
    cells = [fn(block_xy[0], block_xy[1], tx, ty) for ty in range(bdy) for tx in range(bdx)]
    rows = sorted({r for r, _ in cells})
    cols = sorted({c for _, c in cells})
    tile = spec.params.get("TILE", spec.tile[0])
    bk = spec.params.get("BK", tile)
    phases = [(k0, k0 + bk) for k0 in range(0, max(K, 1), bk)]
    return rows, cols, phases


def plot_tile_phases(spec, M: int, N: int, K: int, block_xy=(0, 0), title=None):
    """A and B with the tiles block ``block_xy`` stages, one colour per phase.

    Hatched cells lie outside the matrix: the kernel writes zeros there in
    shared memory, so they add nothing to the sum.
    """
    plt = _plt()
    rows, cols, phases = tile_phases(spec, M, N, K, block_xy)
    Kp = phases[-1][1]
    cmap = plt.get_cmap("tab10")
    # A (the widest) across the top, B and C side by side below: each panel stays wide
    # enough for its labels at the book's width
    fig = plt.figure(figsize=(7.5, 8.4))
    gs = fig.add_gridspec(2, 2, height_ratios=[1, 1.25])
    axA, axB, axC = fig.add_subplot(gs[0, :]), fig.add_subplot(gs[1, 0]), fig.add_subplot(gs[1, 1])

    def frame(ax, h, w, title):
        ax.add_patch(plt.Rectangle((0, 0), w, h, fill=False, lw=1.5))
        ax.set_title(title, fontsize=10)
        ax.invert_yaxis()
        ax.set_aspect("equal")

    r0, r1 = rows[0], rows[-1] + 1
    c0, c1 = cols[0], cols[-1] + 1
    for p, (k0, k1) in enumerate(phases):
        col = cmap(p % 10)
        # A tile: rows r0..r1, columns k0..k1
        axA.add_patch(plt.Rectangle((k0, r0), k1 - k0, r1 - r0, color=col, alpha=0.45))
        axA.text((k0 + k1) / 2, (r0 + r1) / 2, f"phase {p}", ha="center", va="center",
                 fontsize=10)
        axB.add_patch(plt.Rectangle((c0, k0), c1 - c0, k1 - k0, color=col, alpha=0.45))
        axB.text((c0 + c1) / 2, (k0 + k1) / 2, f"phase {p}", ha="center", va="center",
                 fontsize=10)
    # zero-filled overhang
    for ax, (h, w), over in ((axA, (M, K), [(K, r0, Kp - K, r1 - r0), (0, M, Kp, r1 - M)]),
                             (axB, (K, N), [(c0, K, c1 - c0, Kp - K), (N, 0, c1 - N, Kp)])):
        for x, y, wd, ht in over:
            if wd > 0 and ht > 0:
                ax.add_patch(plt.Rectangle((x, y), wd, ht, fill=False, hatch="///",
                                           edgecolor="grey", lw=0))
    frame(axA, M, K, f"A ({M}x{K}): the block's row band")
    frame(axB, K, N, f"B ({K}x{N}):\nthe block's column band")
    axA.set_xlim(-1, max(Kp, K) + 1), axA.set_ylim(max(M, r1) + 1, -1)
    axB.set_xlim(-1, max(N, c1) + 1), axB.set_ylim(max(Kp, K) + 1, -1)
    axC.add_patch(plt.Rectangle((c0, r0), c1 - c0, r1 - r0, color="#888", alpha=0.5))
    frame(axC, M, N, f"C ({M}x{N}):\nthe block's tile")
    axC.set_xlim(-1, max(N, c1) + 1), axC.set_ylim(max(M, r1) + 1, -1)
    for ax in (axA, axB, axC):
        ax.tick_params(labelsize=9)
    fig.suptitle(title or f"{spec.name}: block {tuple(block_xy)} walks K in {len(phases)} phases\n"
                 f"(hatched: outside the matrix, zero-filled)", fontsize=11)
    fig.tight_layout()
    return legible(fig)


def global_loads(spec, M: int, N: int, K: int) -> dict:
    """Global-memory element loads of the whole launch, counted from the index function.

    Without tiling every thread reads K elements of A and K of B.  With
    TILE x TILE shared tiles each block loads its row band of A and column band
    of B once per phase, i.e. each element a thread reads from global memory is
    reused TILE times from shared memory.
    """
    own = ownership(spec, M, N)
    threads = int((own.block_id >= 0).sum())
    untiled = 2 * K * threads
    gdx, gdy, _ = spec.grid(M, N, K)
    bdx, bdy = spec.block[:2]
    tile = spec.params.get("TILE", 0)
    if tile:
        phases = -(-K // tile)
        tiled = gdx * gdy * phases * 2 * bdx * bdy
    else:
        tiled = untiled
    return {"untiled": untiled, "this_kernel": tiled}


# --------------------------------------------------------------------------
# Performance pictures


def gemm_intensity(M: int, N: int, K: int, bytes_per_el: int = 4) -> float:
    """FLOPs per byte if A and B are read once and C written once (the best case)."""
    return 2 * M * N * K / (bytes_per_el * (M * K + K * N + M * N))


def plot_roofline(peak_tflops: float, bandwidth_gbs: float, points=(), title=None,
                  note=None):
    """The roofline: attainable TFLOP/s = min(peak, intensity x bandwidth).

    ``points`` is a list of (label, flops_per_byte, measured_tflops or None);
    points without a measurement are drawn on the roof as vertical markers.
    """
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    ridge = peak_tflops * 1e12 / (bandwidth_gbs * 1e9)
    x = np.logspace(-2, 4, 300)
    roof = np.minimum(peak_tflops, x * bandwidth_gbs / 1e3)
    ax.loglog(x, roof, color="k", lw=2, label="roof: min(peak, intensity x bandwidth)")
    ax.axvline(ridge, color="grey", ls=":", lw=1)
    ax.text(ridge * 1.1, peak_tflops * 0.02, f"ridge point\n{ridge:.0f} FLOP/byte",
            fontsize=8, color="grey")
    for i, (label, ai, measured) in enumerate(points):
        c = plt.get_cmap("tab10")(i % 10)
        bound = min(peak_tflops, ai * bandwidth_gbs / 1e3)
        if measured is None:
            ax.plot([ai], [bound], "o", color=c, ms=7, label=f"{label} (bound {bound:.2g} TFLOP/s)")
        else:
            ax.plot([ai], [measured], "s", color=c, ms=7, label=f"{label}: {measured:.2g} TFLOP/s")
    ax.set_xlabel("arithmetic intensity (FLOP per byte of DRAM traffic)")
    ax.set_ylabel("TFLOP/s")
    ax.set_ylim(peak_tflops * 1e-3, peak_tflops * 2)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    ax.set_title(title or f"roofline: {peak_tflops:.1f} TFLOP/s fp32, {bandwidth_gbs:.0f} GB/s",
                 fontsize=10)
    if note:
        ax.text(0.01, 0.98, note, transform=ax.transAxes, va="top", fontsize=8, color="#a00")
    fig.tight_layout()
    return legible(fig)


def plot_cpu_timings(timings, title=None):
    """GFLOP/s against size, one line per CPU method (from gemmlib.cpu.benchmark)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    methods = list(dict.fromkeys(t.method for t in timings))
    for m in methods:
        pts = sorted((t.size, t.gflops) for t in timings if t.method == m)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=m)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("n (square matrices n x n)")
    ax.set_ylabel("GFLOP/s (higher is better)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title or "matrix multiplication on this CPU", fontsize=10)
    fig.tight_layout()
    return legible(fig)


def plot_results(records, kernels=None, title=None, reference="cublas"):
    """TFLOP/s against size for the given kernels (and the reference), from results.

    ``records`` are dicts with at least kernel, M, N, K, tflops (see
    gemmcourse.notebook.load_results).
    """
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7.5, 4.4))
    names = list(dict.fromkeys(r["kernel"] for r in records))
    if kernels is not None:
        names = [n for n in names if n in kernels or n == reference]
    for i, n in enumerate(n for n in names if n != reference):
        pts = sorted({(r["M"], r["tflops"]) for r in records if r["kernel"] == n})
        ax.plot([p[0] for p in pts], [p[1] for p in pts], label=n, **series_style(i))
    if reference in names:
        pts = sorted({(r["M"], r["tflops"]) for r in records if r["kernel"] == reference})
        ax.plot([p[0] for p in pts], [p[1] for p in pts], color="k", ls="--", marker="o",
                label=reference)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("M (= N = K for square problems)")
    ax.set_ylabel("TFLOP/s (higher is better)")
    ax.grid(True, which="both", alpha=0.3)
    legend_below(ax, ncol=4)
    if title:
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return legible(fig)


def plot_ladder(rows, title=None):
    """Horizontal bars: % of cuBLAS per kernel (rows: (kernel, tflops, pct))."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7.5, 0.45 * len(rows) + 1.2))
    names = [r[0] for r in rows][::-1]
    pct = [r[2] for r in rows][::-1]
    bars = ax.barh(names, pct, color="#4a7fb5")
    for b, r in zip(bars, rows[::-1]):
        ax.text(b.get_width() + 1, b.get_y() + b.get_height() / 2,
                f"{r[2]:.1f}%  ({r[1]:.2f} TFLOP/s)", va="center", fontsize=8)
    ax.axvline(100, color="k", ls="--", lw=1)
    ax.set_xlim(0, max(110, max(pct) * 1.25))
    ax.set_xlabel("% of cuBLAS SGEMM (same size, fp32, TF32 off)")
    if title:
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return legible(fig)


# --------------------------------------------------------------------------
# Inside a block tile: which thread owns (or copies) which element


def owner_grid(shape, cells_of_thread, threads: int) -> np.ndarray:
    """An int array of ``shape`` holding, for each element, the thread that owns it (-1: none).

    ``cells_of_thread(tid)`` returns the (row, col) pairs thread ``tid`` owns,
    computed from a kernel's index functions by the caller.
    """
    owner = np.full(shape, -1, dtype=np.int64)
    for tid in range(threads):
        for r, c in cells_of_thread(tid):
            if 0 <= r < shape[0] and 0 <= c < shape[1]:
                owner[r, c] = tid
    return owner


def plot_owner_grid(owner: np.ndarray, *, title: str, highlight=(0,), xlabel="column",
                    ylabel="row", annotate=None, ax=None, figsize=None):
    """Colour each element by the warp of the thread that owns it; outline the elements
    of the threads in ``highlight`` (red, then blue...).  ``annotate`` writes thread
    numbers in the cells (default: when the grid has at most 24 x 24 cells)."""
    plt = _plt()
    from matplotlib.colors import to_rgb

    rows, cols = owner.shape
    if ax is None:
        w = 7.5 if cols >= rows else 7.5 * cols / rows + 1.5
        h = 7.5 * rows / cols if cols >= rows else 7.5
        fig, ax = plt.subplots(figsize=figsize or (max(w, 3.5), max(min(h, 8), 2.2)))
    else:
        fig = ax.figure
    # light tab20 shades first, then the dark ones, then tab20b: 40 distinct warp colours
    t20 = plt.get_cmap("tab20").colors
    palette = list(t20[1::2]) + list(t20[0::2]) + list(plt.get_cmap("tab20b").colors)
    img = np.ones((rows, cols, 3))
    for r in range(rows):
        for c in range(cols):
            t = owner[r, c]
            if t >= 0:
                img[r, c] = np.array(to_rgb(palette[(t // 32) % len(palette)]))
    ax.imshow(img, interpolation="nearest", aspect="auto" if max(rows, cols) > 4 * min(rows, cols)
              else "equal")
    edge = [_HIGHLIGHT, "#1f4e9e", "#2a7d2a", "#7d2a7d"]
    for i, t in enumerate(highlight):
        rr, cc = np.nonzero(owner == t)
        big = max(rows, cols) > 32  # small cells: fill them, an outline would vanish
        for r, c in zip(rr, cc):
            ax.add_patch(plt.Rectangle((c - 0.5, r - 0.5), 1, 1, fill=big,
                                       facecolor=edge[i % len(edge)],
                                       edgecolor=edge[i % len(edge)], lw=1.5))
    if annotate is None:
        annotate = rows <= 24 and cols <= 24
    if annotate:
        for r in range(rows):
            for c in range(cols):
                if owner[r, c] >= 0:
                    ax.text(c, r, str(owner[r, c]), ha="center", va="center", fontsize=6)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    hl = ", ".join(f"thread {t}" for t in highlight)
    how = "filled" if max(rows, cols) > 32 else "outlined"
    ax.set_title(f"{title}\ncolour: warp of the owning thread; {how}: {hl}", fontsize=10)
    fig.tight_layout()
    return legible(fig)


def plot_bank_access(access, warp: int = 0, title=None):
    """One warp-wide shared-memory instruction, bank by bank (a gemmlib.banks.Access).

    The warp is served in phases of 128 bytes (32 lanes for 4-byte accesses,
    8 lanes for float4).  In each phase's row of boxes, column b is bank b; a
    bank that must deliver n different words stacks n boxes (n-way conflict,
    red beyond the first).  Numbers are the lanes asking for that word; lanes
    asking for the same word share it (a broadcast)."""
    plt = _plt()
    banks, warp_size = 32, 32
    lanes_per_phase = warp_size // access.width
    phases = []
    for start in range(0, warp_size, lanes_per_phase):
        words = {}
        for lane in range(start, start + lanes_per_phase):
            for w in access.words(warp * warp_size + lane):
                words.setdefault(w, []).append(lane)
        per_bank = {}
        for w in sorted(words):
            per_bank.setdefault(w % banks, []).append((w, words[w]))
        phases.append(per_bank)
    depth = [max((len(v) for v in ph.values()), default=1) for ph in phases]
    fig, axes = plt.subplots(len(phases), 1, figsize=(11, 0.5 + 0.55 * sum(depth) + 0.5 * len(phases)),
                             gridspec_kw={"height_ratios": depth}, squeeze=False)
    total = 0
    for i, (ph, ax) in enumerate(zip(phases, axes[:, 0])):
        for b, entries in ph.items():
            for level, (w, lanes) in enumerate(entries):
                colour = "#f4b6b0" if level else "#cfe2f3"
                ax.add_patch(plt.Rectangle((b, level), 0.95, 0.9, color=colour))
                label = ",".join(str(x) for x in lanes[:2]) + ("+" if len(lanes) > 2 else "")
                ax.text(b + 0.47, level + 0.45, label, ha="center", va="center", fontsize=6.5)
        total += depth[i]
        ax.set_xlim(0, banks), ax.set_ylim(depth[i], 0)
        ax.set_yticks([]), ax.set_xticks(range(0, banks, 4))
        ax.tick_params(labelsize=7)
        first = i * lanes_per_phase
        ax.set_ylabel(f"lanes {first}-{first + lanes_per_phase - 1}\n{depth[i]} pass(es)",
                      fontsize=8, rotation=0, ha="right", va="center")
    axes[-1, 0].set_xlabel("shared-memory bank")
    label = f" ({access.label})" if getattr(access, "label", "") else ""
    fig.suptitle(title or f"{access.array} {access.op}{label}: warp {warp}, "
                 f"{access.width * 4} bytes per lane -> {total} passes over the banks", fontsize=10)
    fig.tight_layout()
    return legible(fig)


def plot_timeline(rows, title=None, unit="time"):
    """A schematic schedule: ``rows`` maps a row label to a list of
    (start, duration, text, colour) bars.  Used to compare how copies and
    arithmetic overlap under different pipelining schemes."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(10, 0.75 * len(rows) + 1.2))
    labels = list(rows)
    end = 0
    for y, label in enumerate(labels):
        for start, dur, text, colour in rows[label]:
            ax.barh(y, dur, left=start, color=colour, edgecolor="k", height=0.6)
            if text:
                ax.text(start + dur / 2, y, text, ha="center", va="center", fontsize=8)
            end = max(end, start + dur)
    ax.set_yticks(range(len(labels)), labels)
    ax.invert_yaxis()
    ax.set_xlim(0, end * 1.02)
    ax.set_xlabel(unit)
    if title:
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return legible(fig)


# --------------------------------------------------------------------------
# Split-K (chapter 13): which block sums which k-tiles, and where its partial goes


def split_k_slices(K: int, BK: int, S: int) -> list[tuple[int, int]]:
    """The k-tiles each block z of a split-K launch sums: :func:`gemmlib.kernels.split_k.k_slices`
    (``S`` is the grid's z, i.e. the slice count after ``effective_splits``)."""
    from gemmlib.kernels.split_k import k_slices

    return k_slices(K, BK, S)


def plot_split_k(M: int, N: int, K: int, BM: int, BN: int, BK: int, S: int,
                 block_xy=(0, 0), title=None):
    """Split-K for one output tile: A's row band and B's column band cut into k-tiles,
    coloured by the block z that sums them (:func:`split_k_slices`); the S partial tiles
    in the (S*M x N) workspace; and their sum, in slice order, into C."""
    plt = _plt()
    bx, by = block_xy
    m0, n0 = by * BM, bx * BN
    m1, n1 = min(M, m0 + BM), min(N, n0 + BN)
    slices = split_k_slices(K, BK, S)
    cmap = plt.get_cmap("tab10")
    colour = {z: cmap(z % 10) for z in range(S)}
    # two by two: four panels in a row leave too little width per title at the book's width
    fig, axes = plt.subplots(2, 2, figsize=(7.4, 7.4))
    (axA, axB), (axW, axC) = axes

    def frame(ax, h, w, name):
        ax.add_patch(plt.Rectangle((0, 0), w, h, fill=False, lw=1.5))
        ax.set_xlim(-0.02 * w, 1.02 * w)
        ax.set_ylim(1.02 * h, -0.02 * h)
        ax.set_title(name, fontsize=9)
        ax.tick_params(labelsize=9)

    for z, (t0, t1) in enumerate(slices):
        for t in range(t0, t1):
            k0, k1 = t * BK, min(K, (t + 1) * BK)
            axA.add_patch(plt.Rectangle((k0, m0), k1 - k0, m1 - m0, facecolor=colour[z],
                                        edgecolor="white", lw=0.8, alpha=0.8))
            axB.add_patch(plt.Rectangle((n0, k0), n1 - n0, k1 - k0, facecolor=colour[z],
                                        edgecolor="white", lw=0.8, alpha=0.8))
        if t1 > t0:
            mid = (t0 * BK + min(K, t1 * BK)) / 2
            axA.text(mid, (m0 + m1) / 2, f"z={z}", ha="center", va="center", fontsize=9)
            axB.text((n0 + n1) / 2, mid, f"z={z}", ha="center", va="center", fontsize=9)
        # the partial tile of slice z: rows z*M + m0 .. of the workspace
        axW.add_patch(plt.Rectangle((n0, z * M + m0), n1 - n0, m1 - m0, facecolor=colour[z],
                                    edgecolor="k", lw=0.8, alpha=0.8))
        axW.text((n0 + n1) / 2, z * M + (m0 + m1) / 2, f"partial {z}", ha="center",
                 va="center", fontsize=9)
        if z:
            axW.axhline(z * M, color="grey", lw=0.8, ls="--")
    frame(axA, M, K, f"A ({M}x{K}):\nrows {m0}..{m1 - 1}")
    frame(axB, K, N, f"B ({K}x{N}):\ncolumns {n0}..{n1 - 1}")
    frame(axW, S * M, N, f"workspace W\n({S}*{M} x {N})")
    axC.add_patch(plt.Rectangle((n0, m0), n1 - n0, m1 - m0, facecolor="#888", edgecolor="k",
                                lw=0.8, alpha=0.6))
    axC.text((n0 + n1) / 2, (m0 + m1) / 2, " + ".join(f"W{z}" for z in range(min(S, 4)))
             + (" + ..." if S > 4 else ""), ha="center", va="center", fontsize=9)
    frame(axC, M, N, f"C ({M}x{N}) = sum\nin order z = 0..{S - 1}")
    ktiles = -(-K // BK)
    fig.suptitle(title or f"split-K, block ({bx}, {by}): {ktiles} k-tiles of {BK} in {S} "
                 f"slices\nof at most {-(-ktiles // max(S, 1))} (one colour per block z)",
                 fontsize=10)
    fig.tight_layout()
    return legible(fig)


# --------------------------------------------------------------------------
# The host cost of a call (chapter 13)


def plot_host_costs(data: dict, title=None):
    """Host microseconds per call, from a ``results/host-cost-*.json`` record.

    Top: whole calls (``data["rows"]``: name, host_us), one bar each.  Below it: the steps
    of one ``gemmlib.matmul(A, B, out=C)`` (``data["steps"]``: step, host_us), one bar each
    in the order the call runs them, and the whole call as a dashed line.  Stacked, not
    side by side, so both panels have the page's width and their labels room.
    """
    plt = _plt()
    rows = list(data.get("rows", []))
    steps = list(data.get("steps", []))
    n_rows, n_steps = max(len(rows), 1), max(len(steps), 1)
    fig, (ax, axs) = plt.subplots(
        2, 1, figsize=(BOOK_WIDTH_PX / BOOK_DPI, 0.34 * (n_rows + n_steps) + 2.6),
        gridspec_kw={"height_ratios": [n_rows, n_steps]})
    names = [r["name"] for r in rows][::-1]
    us = [float(r["host_us"]) for r in rows][::-1]
    colours = ["#4a7fb5" if n.startswith("gemmlib") or n.startswith("dispatch")
               else "#999999" for n in names]
    whole = next((float(r["host_us"]) for r in rows
                  if r["name"] == "gemmlib.matmul(A, B, out=C)"), None)
    step_us = [float(s["host_us"]) for s in steps][::-1]
    top = max(us + step_us + [whole or 0.0], default=1.0) or 1.0

    def label_bars(axis, bars, values):
        for b, v in zip(bars, values):
            axis.text(b.get_width() + top * 0.01, b.get_y() + b.get_height() / 2,
                      f"{v:.1f} us", va="center")

    label_bars(ax, ax.barh(names, us, color=colours), us)
    ax.set_title("whole calls (median host microseconds, back-to-back calls)")
    cmap = plt.get_cmap("Set2")
    bars = axs.barh([s["step"] for s in steps][::-1], step_us,
                    color=[cmap(i % 8) for i in range(len(steps))][::-1])
    label_bars(axs, bars, step_us)
    if whole is not None:
        axs.axvline(whole, color="k", ls="--", lw=1)
    axs.set_title("one gemmlib.matmul(A, B, out=C), step by step"
                  + (f" (dashed: the whole call, {whole:.1f} us)" if whole is not None else ""))
    for axis in (ax, axs):
        axis.set_xlim(0, top * 1.22)
    axs.set_xlabel("host microseconds")
    meta = data.get("meta", {})
    shape = "x".join(str(v) for v in data.get("shape", []))
    fig.suptitle(title or f"host time per call on {meta.get('gpu', '?')}"
                 + (f", {shape}" if shape else ""))
    fig.tight_layout()
    return legible(fig)


def plot_call_level(records, title=None):
    """% of cuBLAS per shape: call timing, kernel timing (where known) and the target.

    ``records``: dicts with ``label``, ``call`` (% of cuBLAS, call timing) and optionally
    ``kernel`` (% of cuBLAS, kernel timing) and ``target`` (%), any of them None.
    """
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 0.55 * max(len(records), 2) + 1.7))
    ys = np.arange(len(records))[::-1]
    h = 0.38
    call = [r.get("call") for r in records]
    kern = [r.get("kernel") for r in records]
    ax.barh(ys + h / 2, [v if v is not None else 0 for v in call], height=h, color="#4a7fb5",
            label="call: gemmlib.matmul(A, B, out=C)")
    if any(v is not None for v in kern):
        ax.barh(ys - h / 2, [v if v is not None else 0 for v in kern], height=h,
                color="#a9c4e0", label="kernel alone")
    for y, v in zip(ys, call):
        if v is not None:
            ax.text(v + 1, y + h / 2, f"{v:.0f}%", va="center", fontsize=7)
    first = True
    for y, r in zip(ys, records):
        t = r.get("target")
        if t is not None:
            ax.plot([t, t], [y - h, y + h], color="k", lw=2,
                    label="target" if first else None)
            first = False
    ax.axvline(100, color="k", ls="--", lw=1)
    ax.set_yticks(ys, [r["label"] for r in records])
    vals = [v for v in call + kern if v is not None] + [100]
    ax.set_xlim(0, max(vals) * 1.15)
    ax.set_xlabel("% of cuBLAS SGEMM (time of cuBLAS / time of gemmlib)")
    ax.tick_params(labelsize=8)
    ax.legend(fontsize=8, loc="lower left", bbox_to_anchor=(0, 1.0), ncol=3, frameon=False)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return legible(fig)
