"""Figures for the tensor-core chapters (14 and 15), computed from gemmlib's own objects.

Every picture here is drawn from data the library uses itself: the fragment
layouts of :mod:`gemmlib.intrinsics.mma`, the lane rule of its ``ldmatrix``
twin, :func:`gemmlib.layout.chunk_swizzle` and the access patterns the
``mma_swizzle`` rung declares for :mod:`gemmlib.banks`.  The ``*_map``
functions return the numbers (for tests and for readers who want to check
a figure); the ``plot_*`` functions return a matplotlib Figure.

matplotlib is imported only when drawing.
"""

from __future__ import annotations

import numpy as np

from gemmcourse.viz import legible

from gemmlib import layout as L
from gemmlib.intrinsics import mma as I

_OPERAND_ROWS = {"A": 0, "B": 2, "C": 0}   # index into (M, N, K) of the row count


def _atom(kind: str):
    if kind not in I.ATOMS:
        raise ValueError(f"kind must be one of {sorted(I.ATOMS)}, got {kind!r}")
    return I.ATOMS[kind]


def operand_shape(kind: str, operand: str) -> tuple[int, int]:
    """(rows, cols) of operand ``"A"``, ``"B"`` or ``"C"`` of one ``kind`` instruction."""
    m, n, k = _atom(kind)["shape"]
    shapes = {"A": (m, k), "B": (k, n), "C": (m, n)}
    if operand not in shapes:
        raise ValueError(f"operand must be 'A', 'B' or 'C', got {operand!r}")
    return shapes[operand]


def fragment_map(kind: str, operand: str):
    """``(lane, value)``: two integer grids of the operand's shape giving, for every
    element, the lane that holds it and which of that lane's values it is.

    Computed from ``gemmlib.intrinsics.mma.ATOMS[kind][operand]`` with
    :func:`~gemmlib.intrinsics.mma.fragment_coords`.  For 16-bit A and B,
    value ``v`` sits in register ``v // 2``, in its low half when ``v`` is even.
    """
    rows, cols = operand_shape(kind, operand)
    lane_of = np.full((rows, cols), -1, dtype=int)
    value_of = np.full((rows, cols), -1, dtype=int)
    for lane, coords in enumerate(I.fragment_coords(_atom(kind)[operand], rows)):
        for v, (r, c) in enumerate(coords):
            if lane_of[r, c] >= 0:
                raise AssertionError(f"element ({r}, {c}) held twice")  # not a bijection
            lane_of[r, c], value_of[r, c] = lane, v
    return lane_of, value_of


def _packed(kind: str, operand: str) -> bool:
    """Two values per 32-bit register (16-bit A and B)."""
    return kind != "tf32" and operand != "C"


def _cell_grid(ax, colors, labels, cmap, vmax, fontsize):
    ax.imshow(np.ma.masked_less(colors, 0), cmap=cmap, vmin=0, vmax=vmax,
              aspect="equal", interpolation="nearest")
    for (r, c), s in np.ndenumerate(labels):
        if s:
            ax.text(c, r, s, ha="center", va="center", fontsize=fontsize)
    rows, cols = colors.shape
    ax.set_xticks(range(cols))
    ax.set_yticks(range(rows))
    ax.set_xticks(np.arange(-0.5, cols), minor=True)
    ax.set_yticks(np.arange(-0.5, rows), minor=True)
    ax.grid(which="minor", color="white", linewidth=0.8)
    ax.tick_params(which="minor", length=0)


def plot_fragment(kind: str = "fp16", operand: str = "A", *, ax=None):
    """The ``operand`` tile of one ``kind`` mma (``"tf32"``, ``"fp16"``, ``"bf16"``):
    every element labelled with the lane that holds it and coloured by the register it
    sits in (``a1``; ``.lo``/``.hi`` for the halves of a 16-bit pair), named in the legend.

    One number per cell keeps the labels readable at the book's width; the register is the
    colour, not a second line of text."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    lane, value = fragment_map(kind, operand)
    rows, cols = lane.shape
    packed = _packed(kind, operand)
    name = operand.lower() if operand != "C" else "c"
    regs = sorted({int(v) for v in np.unique(value) if v >= 0})
    reg_name = {v: (f"{name}{v // 2}.{'hi' if v % 2 else 'lo'}" if packed else f"{name}{v}")
                for v in regs}
    labels = np.empty(lane.shape, dtype=object)
    for (r, c), ln in np.ndenumerate(lane):
        labels[r, c] = str(ln)
    if ax is None:
        fig, ax = plt.subplots(figsize=(min(0.45 * cols + 1.8, 7.5), 0.42 * rows + 2.4))
    else:
        fig = ax.figure
    palette = plt.get_cmap("tab20").colors
    palette = palette[1::2] + palette[0::2]        # light shades first: the numbers stay dark
    from matplotlib.colors import ListedColormap

    cmap = ListedColormap([palette[i % 20] for i in range(max(regs) + 1)])
    _cell_grid(ax, value, labels, cmap, max(regs) + 0.99, 9)
    m, n, k = _atom(kind)["shape"]
    what = {"A": f"A ({rows} x k={cols}, row-major m x k)", "B": f"B (k={rows} x {cols})",
            "C": f"C / D ({rows} x {cols}, fp32)"}[operand]
    ax.set_title(f"m{m}n{n}k{k} {kind}: {what}\nnumber: the lane holding it; colour: its register")
    ax.set_xlabel("column (k)" if operand == "A" else "column (n)")
    ax.set_ylabel("row (k)" if operand == "B" else "row (m)")
    ax.legend(handles=[Patch(color=cmap(v), label=reg_name[v]) for v in regs],
              loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=min(len(regs), 4),
              frameon=False)
    fig.tight_layout()
    return legible(fig)


# --------------------------------------------------------------------------
# ldmatrix


def ldmatrix_map(trans: bool = False):
    """For one 8 x 8 matrix of 16-bit elements read by ``ldmatrix`` (x1):

    returns ``(row_lane, lane, half)``: ``row_lane[r]`` is the lane whose address
    names row ``r``; ``lane[r, c]`` the lane that receives element ``(r, c)``,
    ``half[r, c]`` whether it lands in the low (0) or high (1) half of that lane's
    register.  Built lane by lane with the rule of the simulator twin
    (:func:`gemmlib.intrinsics.mma._ldmatrix_py`): without ``.trans`` lane ``l``
    gets row ``l // 4``, columns ``2 (l % 4)`` and ``+1``; with ``.trans`` rows
    ``2 (l % 4)`` and ``+1`` at column ``l // 4``.
    """
    row_lane = np.arange(8)          # matrix 0: lanes 0-7 give the row addresses
    lane = np.full((8, 8), -1, dtype=int)
    half = np.full((8, 8), -1, dtype=int)
    for ln in range(32):
        g, t = ln // 4, ln % 4
        if trans:
            pieces = [(2 * t, g), (2 * t + 1, g)]
        else:
            pieces = [(g, 2 * t), (g, 2 * t + 1)]
        for h, (r, c) in enumerate(pieces):
            lane[r, c], half[r, c] = ln, h
    return row_lane, lane, half


def plot_ldmatrix(trans: bool = False, *, ax=None):
    """One 8 x 8 matrix of 16-bit elements in shared memory as ``ldmatrix`` reads it:
    the lane giving each row's address (left margin) and the lane (and register
    half) receiving each element; ``trans=True`` for ``ldmatrix ... .trans``."""
    import matplotlib.pyplot as plt

    row_lane, lane, half = ldmatrix_map(trans)
    labels = np.empty(lane.shape, dtype=object)
    for (r, c), ln in np.ndenumerate(lane):
        labels[r, c] = f"T{ln}\n{'hi' if half[r, c] else 'lo'}"
    if ax is None:
        fig, ax = plt.subplots(figsize=(6.2, 5.2))
    else:
        fig = ax.figure
    _cell_grid(ax, lane, labels, "tab20", 31, 7)
    ax.set_yticklabels([f"row {r} <- addr of T{row_lane[r]}" for r in range(8)])
    ax.set_xlabel("column (16-bit element within the 16-byte row)")
    kind = "ldmatrix.x1.trans" if trans else "ldmatrix.x1"
    ax.set_title(f"{kind}: 8 lanes give row addresses,\n"
                 "all 32 lanes receive two elements each (one 32-bit register)")
    fig.tight_layout()
    return legible(fig)


# --------------------------------------------------------------------------
# Swizzles


def swizzle_map(row_elems: int, elem_bytes: int, rows: int = 8, low: int = 0,
                swizzled: bool = True, rows_xor: int = 8):
    """Where the 16-byte chunks of the first ``rows`` rows of a row-major tile
    (``row_elems`` elements of ``elem_bytes`` bytes per row) end up.

    Returns ``(chunk, group)``, integer grids ``rows x chunks_per_row`` indexed by
    (row, *logical* chunk): ``chunk`` is the chunk slot within the row where it is
    stored (after :func:`gemmlib.layout.chunk_swizzle` when ``swizzled``), ``group``
    the bank group it occupies, ``(byte address // 16) % 8`` (each group is four
    consecutive banks).  ``rows_xor`` and ``low`` are passed to ``chunk_swizzle``.
    """
    per_chunk = 16 // elem_bytes
    chunks = row_elems // per_chunk
    lay = L.row_major((rows, row_elems))
    if swizzled:
        lay = L.SwizzledLayout(lay, L.chunk_swizzle(row_elems, elem_bytes, rows_xor, low))
    chunk = np.zeros((rows, chunks), dtype=int)
    group = np.zeros((rows, chunks), dtype=int)
    for r in range(rows):
        for c in range(chunks):
            off = lay(r, c * per_chunk)      # first element of logical chunk c
            chunk[r, c] = (off % row_elems) // per_chunk
            group[r, c] = (off * elem_bytes // 16) % 8
    return chunk, group


def read_conflicts(row_elems: int, elem_bytes: int, rows: int = 8, low: int = 0,
                   swizzled: bool = True, rows_xor: int = 8) -> float:
    """Conflict degree when one access reads logical chunks ``0 .. 2**low - 1`` of
    ``rows`` consecutive rows (``low=0``, 8 rows: the eight 16-byte rows of one
    ldmatrix matrix); 1.0 is conflict-free.  Counted with
    :func:`gemmlib.layout.bank_conflicts` over the words read, divided by the
    wavefronts the data needs at best."""
    per_chunk = 16 // elem_bytes
    lay = L.row_major((rows, row_elems))
    if swizzled:
        lay = L.SwizzledLayout(lay, L.chunk_swizzle(row_elems, elem_bytes, rows_xor, low))
    offs = [lay(r, c) for r in range(rows) for c in range((2 ** low) * per_chunk)]
    words = len({o * elem_bytes // 4 for o in offs})
    return L.bank_conflicts(offs, elem_bytes) / max(1, -(-words // 32))


def plot_swizzle(row_elems: int, elem_bytes: int, rows: int = 8, low: int = 0,
                 rows_xor: int = 8):
    """Two panels, plain row-major and XOR-swizzled: for each (row, logical 16-byte
    chunk), the chunk slot it is stored in (label) and its bank group (colour).
    The chunks one access reads (logical chunk 0 of every row, or chunks 0-1 for
    ``low=1``) are outlined; the titles give the conflict degree of that read."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    per_chunk = 16 // elem_bytes
    chunks = row_elems // per_chunk
    sw = L.chunk_swizzle(row_elems, elem_bytes, rows_xor, low)
    fig, axes = plt.subplots(1, 2, figsize=(min(2 * (0.55 * chunks + 1.6), 16),
                                            0.45 * rows + 1.8))
    for ax, swizzled in zip(axes, (False, True)):
        chunk, group = swizzle_map(row_elems, elem_bytes, rows, low, swizzled, rows_xor)
        labels = np.empty(chunk.shape, dtype=object)
        for (r, c), p in np.ndenumerate(chunk):
            labels[r, c] = f"@{p}\ng{group[r, c]}"
        _cell_grid(ax, group, labels, "tab10", 9, 6.5 if chunks <= 8 else 5)
        for r in range(rows):
            for c in range(2 ** low):
                ax.add_patch(Rectangle((c - 0.5, r - 0.5), 1, 1, fill=False,
                                       edgecolor="black", linewidth=2))
        deg = read_conflicts(row_elems, elem_bytes, rows, low, swizzled, rows_xor)
        name = f"swizzled {sw!r}" if swizzled else "row-major, no swizzle"
        ax.set_title(f"{name}\nread of outlined chunks: {deg:g}-way")
        ax.set_xlabel("logical 16-byte chunk of the row")
        ax.set_ylabel("row")
    fig.suptitle(f"rows of {row_elems} x {elem_bytes} B = {row_elems * elem_bytes} B: "
                 "label @slot where the chunk is stored, g = bank group (4 banks)",
                 fontsize=9)
    fig.tight_layout()
    return legible(fig)


# --------------------------------------------------------------------------
# Bank-conflict degrees of a rung's fragment loads


def bank_degrees(spec) -> dict:
    """``{label: (unswizzled degree, swizzled degree)}`` for the fragment loads of an
    ``mma_swizzle`` spec, worst warp of the block, from
    :func:`gemmlib.kernels.mma_swizzle.fragment_accesses` and
    :func:`gemmlib.banks.analyze_access`."""
    from gemmlib import banks
    from gemmlib.kernels.mma_swizzle import fragment_accesses

    nwarps = max(spec.threads // 32, 1)
    out = {}
    for plain, swz in zip(fragment_accesses(spec, swizzled=False),
                          fragment_accesses(spec, swizzled=True)):
        worst = [max(banks.analyze_access(a, w, spec.threads).degree for w in range(nwarps))
                 for a in (plain, swz)]
        out[swz.label or swz.array] = tuple(worst)
    return out


def plot_bank_degrees(spec, *, ax=None):
    """Bar chart: conflict degree of each fragment load, without and with the swizzle."""
    import matplotlib.pyplot as plt

    deg = bank_degrees(spec)
    if ax is None:
        fig, ax = plt.subplots(figsize=(1.9 * len(deg) + 2.5, 3.2))
    else:
        fig = ax.figure
    x = np.arange(len(deg))
    plain = [d[0] for d in deg.values()]
    swz = [d[1] for d in deg.values()]
    b1 = ax.bar(x - 0.2, plain, 0.4, label="row-major (no swizzle)", color="#e06666")
    b2 = ax.bar(x + 0.2, swz, 0.4, label="XOR-swizzled (the kernel)", color="#6aa84f")
    for bars in (b1, b2):
        for b in bars:
            ax.text(b.get_x() + b.get_width() / 2, b.get_height(), f"{b.get_height():g}",
                    ha="center", va="bottom", fontsize=8)
    ax.set_xticks(x)
    ax.set_xticklabels(list(deg), fontsize=8)
    ax.set_ylabel("conflict degree (1 = none)")
    ax.set_ylim(0, max(plain + swz) * 1.2 + 0.5)
    ax.set_title(f"{spec.name}: shared-memory bank conflicts of the fragment loads "
                 "(gemmlib.banks)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return legible(fig)


__all__ = ["operand_shape", "fragment_map", "plot_fragment", "ldmatrix_map", "plot_ldmatrix",
           "swizzle_map", "read_conflicts", "plot_swizzle", "bank_degrees",
           "plot_bank_degrees"]
