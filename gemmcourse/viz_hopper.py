"""Figures and tables for chapter 17 (Hopper: wgmma, TMA, warp specialisation).

Everything here is computed from gemmlib's own code or from committed results:

* :func:`swizzle_slots` / :func:`plot_swizzle128`: where TMA's 128-byte swizzle puts
  each 16-byte chunk of a tile (:func:`gemmlib.tma.swizzled_offset`).
* :func:`kernel_descriptors`: the wgmma matrix descriptors the rungs issue, parsed out
  of the source that :func:`gemmlib.kernels.wgmma_async.mma_source` generates for them;
  :func:`decode_descriptor` / :func:`operand_addresses`: which shared-memory bytes a
  descriptor makes one ``m64nNk16`` read (the address rule of the simulator twin,
  ``gemmlib.intrinsics.hopper._operand``, re-derived here and tested against it);
  :func:`kstep_reads` / :func:`plot_kstep_reads`: a stage's tiles coloured by the
  k-step that reads each chunk; :func:`descriptor_table`: their bit fields.
* :func:`accumulator_map` / :func:`plot_accumulators`: which thread of the warpgroup
  holds which fp32 accumulator (:func:`gemmlib.intrinsics.hopper.accumulator_coords`).
* :func:`tma_schedule` / :func:`ws_schedule` / :func:`plot_ws_timeline`: schematic
  timelines of the ``wgmma_tma`` ring (everyone waits, then synchronises) and of the
  warp-specialised ``wgmma_ws`` (a producer and consumers, full and empty barriers),
  with made-up durations that the figure labels as such.
* :func:`hopper_files` / :func:`hopper_records` / :func:`hopper_table` /
  :func:`plot_hopper_bars` / :func:`show_hopper_results`: the committed
  ``results/bench-<gpu>-<date>-hopper.json`` files, per GPU, with the target judged
  in code; :func:`tune_files` / :func:`tune_table`: the ``wgmma_ws`` tuning runs.
* :func:`expected_parity`, :func:`stage_bytes`, :func:`max_stages`: the references
  the chapter's exercises check answers against.
* :func:`b_box` / :func:`b_tile_offset` / :func:`b_landing` / :func:`plot_b_landing`: where
  the copy engine puts each element of B's k-tile, given MN-major (a row-major (K, N) B) or
  K-major (an ``nn.Linear`` weight, (N, K)); :func:`layouts_files` / :func:`kmajor_table` /
  :func:`show_kmajor_measured`: the committed runs of the layouts suite, if any.

matplotlib is imported only when drawing.
"""

from __future__ import annotations

import re
import textwrap

import numpy as np

from gemmlib.intrinsics import hopper as H
from gemmcourse.viz_precision import _committed, _num   # newest file per GPU; a number or None

#: the rungs of the chapter, fastest first, and the mma.sync rung they replace
RUNGS = ("wgmma_ws", "wgmma_tma", "wgmma_async", "mma_pipeline")
RUNG_COLOURS = {"wgmma_ws": "#d62728", "wgmma_tma": "#ff7f0e", "wgmma_async": "#1f77b4",
                "mma_pipeline": "#7f7f7f", "cublas": "white"}
#: the chapter's target: % of cuBLAS in the same precision, both timed as calls
TARGET_PCT = 80.0
#: a swizzle mode of a descriptor (bits 62-63) -> bytes of the swizzled row
SWIZZLE_BYTES = {mode: nbytes for nbytes, mode in H.SWIZZLE_MODE.items()}
#: what a schedule figure says about its durations
SCHEMATIC = "schematic: made-up durations, not measurements"
NOT_MEASURED = "not measured yet"
#: the width (inches, at the notebooks' 100 dpi) of the book's text column at a 1280 px wide
#: window: a figure this wide is shown at its own size, so its text reads at the size it is set
PAGE_IN = 6.7
#: the smallest text a figure sets (points): at PAGE_IN wide, still 9 pt on the page
FONT = 9


def _plt():
    import matplotlib.pyplot as plt

    return plt


# --------------------------------------------------------------------------
# The 128-byte swizzle


def swizzle_slots(rows: int = 64, row_bytes: int = 128, swizzle: int = 128,
                  elem_bytes: int = 2) -> np.ndarray:
    """(rows, row_bytes // 16) array: ``out[r, c]`` is the 16-byte slot of row ``r`` in
    which TMA stores the row's logical chunk ``c`` (bytes 16c .. 16c + 15 of the row in
    the matrix), for a tile aligned to 1024 bytes, from :func:`gemmlib.tma.swizzled_offset`."""
    from gemmlib import tma

    per = 16 // elem_bytes
    row_elems = row_bytes // elem_bytes
    chunks = row_bytes // 16
    out = np.empty((rows, chunks), dtype=int)
    for r in range(rows):
        for c in range(chunks):
            off = tma.swizzled_offset(r, c * per, row_elems, elem_bytes, swizzle) - r * row_elems
            if not 0 <= off < row_elems or off % per:
                raise AssertionError(f"chunk {c} of row {r} left its row: offset {off}")
            out[r, c] = off // per
    return out


def _grid(ax, values, labels, cmap, vmax, fontsize=FONT):
    ax.imshow(np.ma.masked_less(values, 0), cmap=cmap, vmin=0, vmax=vmax, aspect="auto",
              interpolation="nearest")
    for (r, c), s in np.ndenumerate(labels):
        if s != "":
            ax.text(c, r, s, ha="center", va="center", fontsize=fontsize, linespacing=1.0)
    rows, cols = values.shape
    ax.set_xticks(np.arange(-0.5, cols), minor=True)
    ax.set_yticks(np.arange(-0.5, rows), minor=True)
    ax.grid(which="minor", color="white", linewidth=0.8)
    ax.tick_params(which="minor", length=0)
    ax.tick_params(labelsize=fontsize)


def plot_swizzle128(rows: int = 16, *, ax=None):
    """The 128-byte swizzle of the first ``rows`` rows of a tile of halves: a row per tile
    row, a cell per logical 16-byte chunk, labelled and coloured with the slot it is stored
    in (the pattern repeats every 8 rows, so 16 rows show it twice)."""
    plt = _plt()
    slots = swizzle_slots(rows)
    if ax is None:
        _, ax = plt.subplots(figsize=(PAGE_IN, 0.3 * rows + 1.9))
    _grid(ax, slots, slots.astype(str), plt.get_cmap("Set3"), 11.0)   # light: dark text reads
    ax.set_xticks(range(slots.shape[1]), [f"{c}\nk {8 * c}-{8 * c + 7}"
                                          for c in range(slots.shape[1])])
    ax.xaxis.tick_top()
    ax.set_yticks(range(rows), [f"row {r}" for r in range(rows)])
    for y in range(8, rows, 8):
        ax.axhline(y - 0.5, color="k", lw=2)
    ax.set_xlabel("logical chunk c of the row (its 8 halves: k)", fontsize=FONT)
    ax.xaxis.set_label_position("top")
    ax.set_title("128-byte swizzle: chunk c of row r is stored in slot c XOR (r mod 8);\n"
                 "label and colour = the slot; a thick line every 8 rows (1024 bytes)",
                 fontsize=FONT + 1)
    ax.figure.tight_layout()
    return ax.figure


# --------------------------------------------------------------------------
# Descriptors


_BASE = re.compile(r"(da|db) = desc\((a|b), (\d+), (\d+), (\d+)\)")
_MMA = re.compile(r"mma\(da(?: \+ u64\((\d+)\))?, db(?: \+ u64\((\d+)\))?, one, acc, (\d+)\)")


def kernel_descriptors(BN: int = 128, halves: int = 2, precision: str = "fp16"):
    """The descriptors one k-tile of the wgmma rungs issues, read from the source that
    ``gemmlib.kernels.wgmma_async.mma_source`` generates (the very code the kernels run):
    dicts ``operand`` ("A"/"B"), ``kstep``, ``half`` (A's 64-row slice; None for B),
    ``offset`` (bytes from the tile's start), ``lbo``, ``sbo`` (bytes), ``swizzle`` (bytes).
    The source builds each operand's descriptor once (``da = desc(a, LBO, SBO, mode)``) and
    moves it per wgmma by an offset >> 4 (``da + u64(offset // 16)``); each wgmma's last
    argument is where its slice's accumulators start (``half * BN / 2``).  ``wgmma_async``
    uses ``halves = BM / 64`` slices per warpgroup, the TMA rungs one."""
    from gemmlib.kernels import wgmma_async

    src = wgmma_async.mma_source(BN, halves, precision)
    base = {m.group(2): tuple(map(int, m.groups()[2:])) for m in _BASE.finditer(src)}
    out, kstep = [], -1
    for m in _MMA.finditer(src):
        a_step, b_step, acc = (int(g or 0) for g in m.groups())
        half = acc // (BN // 2)
        if half == 0:
            kstep += 1
            out.append(_descriptor("B", kstep, None, 16 * b_step, base["b"]))
        out.append(_descriptor("A", kstep, half, 16 * a_step, base["a"]))
    if not out or set(base) != {"a", "b"}:
        raise ValueError("no descriptors found in wgmma_async.mma_source's output: has its "
                         "format changed?")
    return out


def _descriptor(operand, kstep, half, offset, fields):
    lbo, sbo, mode = fields
    return dict(operand=operand, kstep=kstep, half=half, offset=offset, lbo=lbo, sbo=sbo,
                swizzle=SWIZZLE_BYTES[mode])


def decode_descriptor(desc: int) -> dict:
    """The fields of a 64-bit wgmma descriptor: start address, LBO and SBO in bytes
    (each stored >> 4 in 14 bits) and the swizzle in bytes (bits 62-63)."""
    desc = int(desc)
    return dict(start=(desc & 0x3FFF) << 4, lbo=((desc >> 16) & 0x3FFF) << 4,
                sbo=((desc >> 32) & 0x3FFF) << 4, swizzle=SWIZZLE_BYTES[desc >> 62])


def operand_addresses(desc: int, rows: int, mn_major: bool = False) -> np.ndarray:
    """(rows, 16) byte addresses of the 16-bit operand a wgmma descriptor describes: row
    ``r`` (of M for A, of N for B), element ``k`` of the k-step's 16.

    K-major (A, and B stored as (N, K)): 8-row groups SBO apart; inside one, rows of S
    bytes (S = the swizzle span) with the 16 k contiguous.  MN-major (``mn_major``, B
    of a row-major (K, N)): each k owns an S-byte row of S/2 consecutive n; the next
    S/2 n are LBO further, the next 8 k SBO further.  With no swizzle the unit is the
    8 x 16-byte core matrix (LBO along K, SBO along M/N).  A swizzle then XORs the
    16-byte chunk number (address bits 4..) with address bits 7.. (so the descriptor's
    start must be an offset into a 1024-byte aligned tile).  This is the rule of the
    simulator twin (``gemmlib.intrinsics.hopper._operand``), which the tests check."""
    d = decode_descriptor(desc)
    start, lbo, sbo, swz = d["start"], d["lbo"], d["sbo"], d["swizzle"]
    r = np.arange(rows)[:, None]
    k = np.arange(16)[None, :]
    if swz == 0:
        core = (k % 8) * 16 + (r % 8) * 2 if mn_major else (r % 8) * 16 + (k % 8) * 2
        addr = start + (r // 8) * sbo + (k // 8) * lbo + core
    elif not mn_major:
        addr = start + (r // 8) * sbo + (r % 8) * swz + k * 2
    else:
        per = swz // 2                     # elements of M/N in one swizzled row
        addr = start + (r // per) * lbo + (k // 8) * sbo + (k % 8) * swz + (r % per) * 2
    if swz:
        addr = addr ^ (((addr >> 7) & (swz // 16 - 1)) << 4)
    return addr


def descriptor_of(d: dict, base: int = 0) -> int:
    """The 64-bit descriptor of one :func:`kernel_descriptors` entry, for a tile at
    shared address ``base``."""
    return H.desc_fields(base + d["offset"], d["lbo"], d["sbo"], d["swizzle"])


def descriptor_table(BM: int = 128, BN: int = 128, base: int = 1024):
    """A :class:`gemmcourse.notebook.Table` of the descriptors of one k-tile of
    ``wgmma_async`` (BM / 64 slices of A, B's tile of BN columns), for a stage whose A
    tile starts at shared address ``base`` (1024-aligned) and B tile right after it."""
    from gemmlib.kernels.wgmma_async import BK
    from gemmcourse.notebook import Table

    b_base = base + BM * BK * 2
    rows = []
    for d in kernel_descriptors(BN, BM // 64):
        tile = base if d["operand"] == "A" else b_base
        desc = descriptor_of(d, tile)
        f = decode_descriptor(desc)
        what = (f"A rows {64 * d['half']}-{64 * d['half'] + 63}" if d["operand"] == "A"
                else f"B, {BN} columns")
        rows.append((d["kstep"], what, f"{tile:#06x} + {d['offset']}", f["start"] >> 4,
                     f"{f['lbo']} ({f['lbo'] >> 4})", f"{f['sbo']} ({f['sbo'] >> 4})",
                     f"{desc >> 62} ({f['swizzle']} B)", f"{desc:#018x}"))
    return Table(("k-step", "operand", "start (bytes)", "bits 0-13: start >> 4",
                  "bits 16-29: LBO (>> 4)", "bits 32-45: SBO (>> 4)", "bits 62-63: swizzle",
                  "descriptor"), rows,
                 caption=f"wgmma descriptors of one k-tile, BM x BN = {BM} x {BN} "
                         "(gemmlib.intrinsics.hopper.desc_fields of the kernel's arguments)")


def kstep_reads(operand: str = "A", BM: int = 128, BN: int = 128):
    """Which k-step reads each 16-byte chunk of one stage's ``operand`` tile.

    Returns ``(kstep, label)``: (lines, 8) arrays over the tile's 128-byte lines
    (A: BM lines; B: BN / 64 panels of 64 lines), ``kstep`` the k-step (0-3) that reads
    the chunk, ``label`` which logical 8 elements it holds (A: the chunk of the row's 64
    k; B: the chunk of the panel row's 64 n).  Computed from :func:`kernel_descriptors`
    and :func:`operand_addresses`; raises if a chunk is read twice or never."""
    if operand not in ("A", "B"):
        raise ValueError(f"operand must be 'A' or 'B', got {operand!r}")
    lines = BM if operand == "A" else BN
    kstep = np.full(lines * 8, -1, dtype=int)
    label = np.full(lines * 8, -1, dtype=int)
    for d in kernel_descriptors(BN, BM // 64):
        if d["operand"] != operand:
            continue
        rows = 64 if operand == "A" else BN
        addr = operand_addresses(descriptor_of(d), rows, mn_major=operand == "B")
        for (r, k), a in np.ndenumerate(addr):
            slot = int(a) // 16
            if kstep[slot] not in (-1, d["kstep"]):
                raise AssertionError(f"chunk {slot} is read by k-steps {kstep[slot]} and "
                                     f"{d['kstep']}")
            kstep[slot] = d["kstep"]
            label[slot] = (16 * d["kstep"] + k) // 8 if operand == "A" else (r % 64) // 8
    if (kstep < 0).any():
        raise AssertionError(f"{int((kstep < 0).sum())} chunks of {operand}'s tile are never read")
    return kstep.reshape(lines, 8), label.reshape(lines, 8)


def plot_kstep_reads(BM: int = 128, BN: int = 128, operand: str = "A", lines=None):
    """The first ``lines`` 128-byte lines of one stage's ``operand`` tile, each 16-byte chunk
    coloured by the k-step that reads it. A (16 lines by default): a line per row, each chunk
    labelled with the logical chunk of the row it holds. B (64 lines: one panel): a column
    per line, colours only, since a k-step of B takes whole lines."""
    plt = _plt()
    cmap = plt.get_cmap("Set2")
    d = next(d for d in kernel_descriptors(BN, BM // 64)
             if d["operand"] == operand and d["kstep"] == 1 and d["half"] in (0, None))
    ks, lab = kstep_reads(operand, BM, BN)
    if operand == "A":
        lines = lines or 16
        fig, ax = plt.subplots(figsize=(PAGE_IN, 0.3 * lines + 2.3))
        _grid(ax, ks[:lines], lab[:lines].astype(str), cmap, 7.0)
        ax.set_xticks(range(8), [f"slot {s}" for s in range(8)])
        ax.set_yticks(range(lines), [f"row {r}" for r in range(lines)])
        for y in range(8, lines, 8):
            ax.axhline(y - 0.5, color="k", lw=2)
        ax.set_title(f"A, K-major: a line per row m; label = which 8 k of the row it holds.\n"
                     f"8-row groups SBO = {d['sbo']} B apart; LBO unused ({d['lbo']}); "
                     f"k-step 1 starts +{d['offset']} B", fontsize=FONT + 1)
    else:
        lines = lines or 64
        fig, ax = plt.subplots(figsize=(PAGE_IN, 3.3))
        _grid(ax, ks[:lines].T, np.full((8, lines), ""), cmap, 7.0)
        ax.set_yticks(range(8), [f"slot {s}" for s in range(8)])
        ax.set_xticks(range(0, lines, 8))
        for x in range(8, lines, 8):
            ax.axvline(x - 0.5, color="k", lw=1.5)
        ax.set_xlabel("128-byte line of the tile (k; panel 0: n 0-63)", fontsize=FONT)
        ax.set_title(f"B, MN-major: a k-step reads 16 whole lines. Groups of 8 k\n"
                     f"SBO = {d['sbo']} B apart, 64-column panels LBO = {d['lbo']} B apart, "
                     f"k-step 1 starts +{d['offset']} B", fontsize=FONT + 1)
    handles = [plt.Rectangle((0, 0), 1, 1, color=cmap(k / 7.0)) for k in range(4)]
    fig.legend(handles, [f"k-step {k} (k {16 * k}-{16 * k + 15})" for k in range(4)],
               loc="lower center", ncol=2, fontsize=FONT, frameon=False)
    fig.tight_layout(rect=(0, 0.09 if operand == "A" else 0.2, 1, 1))
    return fig


# --------------------------------------------------------------------------
# The accumulators


def accumulator_map(n: int = 16):
    """(thread, value): two (64, n) integer grids giving, for each element of the
    m64nNk16 accumulator, the warpgroup thread (0-127) that holds it and which of that
    thread's n/2 registers it is (:func:`gemmlib.intrinsics.hopper.accumulator_coords`)."""
    thread = np.full((64, n), -1, dtype=int)
    value = np.full((64, n), -1, dtype=int)
    for t in range(128):
        for v, (r, c) in enumerate(H.accumulator_coords(t, n)):
            if thread[r, c] >= 0:
                raise AssertionError(f"accumulator ({r}, {c}) held twice")
            thread[r, c], value[r, c] = t, v
    if (thread < 0).any():
        raise AssertionError("an accumulator is held by no thread")
    return thread, value


def plot_accumulators(n: int = 16):
    """Warp 0's 16 rows of the 64 x n accumulator of m64nNk16, each element labelled with
    the thread and register that hold it (``T5`` over ``d2``), coloured by lane // 4; warps
    1-3 hold rows 16-63 the same way."""
    plt = _plt()
    thread, value = accumulator_map(n)
    fig, ax = plt.subplots(figsize=(PAGE_IN, 6.3))
    lab = np.array([[f"T{thread[r, c]}\nd{value[r, c]}" for c in range(n)] for r in range(16)])
    _grid(ax, thread[:16] // 4, lab, plt.get_cmap("Set3"), 11.0)   # light: dark text reads
    ax.set_xticks(range(0, n, 2))
    ax.set_yticks(range(16))
    ax.xaxis.tick_top()
    ax.set_xlabel("column n", fontsize=FONT)
    ax.set_ylabel("row m", fontsize=FONT)
    ax.set_title(f"m64n{n}k16, warp 0 (rows 0-15): thread T holds d0..d{n // 2 - 1};\n"
                 "the pattern repeats every 8 columns, and warp w holds rows 16w..16w+15",
                 fontsize=FONT + 1)
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------
# Where the rungs synchronise


def sync_lines(module, words=("fence", "wgmma_commit", "wait0", "wait1", "syncthreads",
                              "mbarrier", "wait(", "load_stage(", "setmaxnreg", "more()",
                              "fewer()")):
    """[(line number, stripped line)] of ``module``'s source lines (a kernel module, from its
    kernel to its ``grid``; a module of device functions, such as ``ws_pipeline``, whole)
    that contain one of ``words`` outside docstrings: where a rung fences, commits, waits
    and synchronises."""
    import inspect

    src = inspect.getsource(module).splitlines()
    start = next((i for i, ln in enumerate(src) if ln.lstrip().startswith("@cuda.jit(**")), 0)
    stop = next((i for i, ln in enumerate(src) if i > start
                 and ln.lstrip().startswith("def grid(")), len(src))
    out = []
    in_doc = False
    for i, ln in enumerate(src[start:stop], start + 1):
        body = ln.split("#")[0]
        quotes = body.count('"""')
        if in_doc or quotes:
            in_doc = in_doc != (quotes % 2 == 1)
            continue
        if body.lstrip().startswith("def "):
            continue
        if any(w in body for w in words):
            out.append((i, ln.strip()))
    return out


# --------------------------------------------------------------------------
# Schedules (schematic)


def _check_schedule_args(stages, tiles, k_tiles, durations):
    if stages < 2:
        raise ValueError(f"a ring needs at least 2 stages, got {stages}")
    if tiles < 1 or k_tiles < 1:
        raise ValueError(f"tiles and k_tiles must be >= 1, got {tiles}, {k_tiles}")
    if any(v < 0 for v in durations):
        raise ValueError("durations must be >= 0")


def tma_schedule(stages: int = 4, tiles: int = 2, k_tiles: int = 6, copy: float = 3.0,
                 mma: float = 1.0, epilogue: float = 2.0, sync: float = 0.3):
    """The ``wgmma_tma`` ring on one SM, ``tiles`` output tiles one after another (one
    block at a time: the ring fills the SM's shared memory).

    Rules (the kernel's): a block starts the copies of k-tiles ``0 .. stages-1``; at
    k-tile ``kt`` everyone waits for its stage to be full, issues the wgmma and waits for
    it (``wait_group 0``); then the block synchronises (``sync`` long) and thread 0
    starts the copy of k-tile ``kt + stages`` into the stage just read.  After the last
    k-tile the accumulators are written (``epilogue``), then the next block starts.
    Copies are in flight for ``copy`` each, any number at once.

    Returns events ``(row, start, end, label, kind)``: kind "copy" (row ``stage s``),
    "mma" (row ``tensor cores``), "epilogue" (row ``epilogue``)."""
    _check_schedule_args(stages, tiles, k_tiles, (copy, mma, epilogue, sync))
    ev, t = [], 0.0
    for tile in range(tiles):
        issued = {kt: t for kt in range(min(stages, k_tiles))}
        ready = t
        for kt in range(k_tiles):
            full = issued[kt] + copy
            ev.append((f"stage {kt % stages}", issued[kt], full, f"{tile}.{kt}", "copy"))
            start = max(full, ready)
            ev.append(("tensor cores", start, start + mma, f"{tile}.{kt}", "mma"))
            ready = start + mma + sync
            if kt + stages < k_tiles:
                issued[kt + stages] = ready
        ev.append(("epilogue", ready, ready + epilogue, f"C {tile}", "epilogue"))
        t = ready + epilogue
    return ev


def ws_schedule(stages: int = 4, tiles: int = 2, k_tiles: int = 6, copy: float = 3.0,
                mma: float = 1.0, epilogue: float = 2.0, sync: float = 0.3):
    """The ``wgmma_ws`` ring on one SM: one persistent block walks ``tiles`` tiles.

    Rules (the kernel's; ``it`` counts k-tiles across tiles, stage ``it % stages``):

    * the producer starts copy ``it`` as soon as the stage is *empty* (at once for the
      first ``stages``: the initial-parity trick), never waiting for the tensor cores;
    * the consumer waits until stage ``it`` is *full*, issues its wgmma (queued behind
      the previous one: the tensor cores run them back to back), then waits until only
      that one is in flight (``wait_group 1``: the previous wgmma has finished) and
      arrives on the previous stage's *empty* barrier; ``sync`` is the cost of that
      round trip before it can issue the next one;
    * after a tile's last k-tile it waits for everything (``wait_group 0``), releases the
      last stage and writes C (``epilogue``), while the producer already copies the
      next tile's k-tiles.

    Returns events like :func:`tma_schedule`, plus kind "issue" (row ``producer``:
    the moments the producer starts a copy, zero long)."""
    _check_schedule_args(stages, tiles, k_tiles, (copy, mma, epilogue, sync))
    n = tiles * k_tiles
    issue, release = [0.0] * n, [0.0] * n
    ev = []
    producer = 0.0              # when the producer thread is free to issue the next copy
    consumer = 0.0              # when the consumer can issue its next wgmma
    mma_end_prev = 0.0
    for it in range(n):
        tile, kt = divmod(it, k_tiles)
        issue[it] = max(producer, release[it - stages] if it >= stages else 0.0)
        producer = issue[it]
        full = issue[it] + copy
        ev.append(("producer", issue[it], issue[it], "", "issue"))
        ev.append((f"stage {it % stages}", issue[it], full, f"{tile}.{kt}", "copy"))
        go = max(full, consumer)                      # wgmma issued
        start = max(go, mma_end_prev)                 # the tensor cores take it
        end = start + mma
        ev.append(("tensor cores", start, end, f"{tile}.{kt}", "mma"))
        if kt > 0:                                    # wait_group 1: wgmma it-1 is done
            release[it - 1] = max(go, mma_end_prev) + sync
            consumer = release[it - 1]
        else:
            consumer = go + sync
        mma_end_prev = end
        if kt == k_tiles - 1:                         # wait_group 0, release, write C
            release[it] = end
            ev.append(("epilogue", end, end + epilogue, f"C {tile}", "epilogue"))
            consumer = end + epilogue
    return ev


def makespan(events) -> float:
    return max(e for _, _, e, _, _ in events) if events else 0.0


def tensor_core_busy(events) -> float:
    """Fraction of the whole schedule (from 0 to its end) with the tensor cores busy."""
    span = makespan(events)
    busy = sum(e - s for row, s, e, _, k in events if k == "mma")
    return busy / span if span else 0.0


def _draw_schedule(ax, events, stages, title):
    order = (["producer"] if any(k == "issue" for *_, k in events) else []) + \
        [f"stage {s}" for s in range(stages)] + ["tensor cores", "epilogue"]
    y = {r: i for i, r in enumerate(order)}
    tile_colour = ("#9fc5e8", "#f9cb9c", "#b6d7a8", "#d5a6bd")
    for row, s, e, label, kind in events:
        tile = int(label.split(".")[0].replace("C ", "")) if label else 0
        if kind == "issue":
            ax.plot([s, s], [y[row] - 0.3, y[row] + 0.3], color="k", lw=1.2)
            continue
        colour = "#cccccc" if kind == "epilogue" else tile_colour[tile % len(tile_colour)]
        ax.barh(y[row], e - s, left=s, color=colour, edgecolor="k", height=0.6)
        ax.text((s + e) / 2, y[row], label.split(".")[-1] if kind != "epilogue" else label,
                ha="center", va="center", fontsize=FONT)
    ax.set_yticks(range(len(order)), order, fontsize=FONT)
    ax.set_ylim(len(order) - 0.5, -0.5)
    ax.set_xlim(left=-0.4)
    busy = tensor_core_busy(events)
    ax.set_title(f"{title}:\ndone at {makespan(events):.1f}, tensor cores busy "
                 f"{100 * busy:.0f}% of the time", fontsize=FONT + 1)
    ax.tick_params(labelsize=FONT)
    ax.grid(True, axis="x", alpha=0.3)


def plot_ws_timeline(stages: int = 4, tiles: int = 2, k_tiles: int = 6, copy: float = 3.0,
                     mma: float = 1.0, epilogue: float = 2.0, sync: float = 0.3):
    """:func:`tma_schedule` above :func:`ws_schedule`, on one time axis.  Bars are
    labelled with the k-tile, coloured by output tile; the producer's row marks when it
    starts each copy."""
    plt = _plt()
    a = tma_schedule(stages, tiles, k_tiles, copy, mma, epilogue, sync)
    b = ws_schedule(stages, tiles, k_tiles, copy, mma, epilogue, sync)
    fig, (ax0, ax1) = plt.subplots(2, 1, figsize=(PAGE_IN, 8.2), sharex=True,
                                   gridspec_kw={"height_ratios": [stages + 2, stages + 3]})
    _draw_schedule(ax0, a, stages, "wgmma_tma (everyone copies, waits, computes, syncs)")
    _draw_schedule(ax1, b, stages, "wgmma_ws (a producer warpgroup and consumers)")
    ax1.set_xlabel("time (arbitrary units); bars: the k-tile, coloured by output tile",
                   fontsize=FONT)
    fig.suptitle(f"{SCHEMATIC}\nSTAGES={stages}, {tiles} tiles of {k_tiles} k-tiles; copy "
                 f"{copy:g}, wgmma {mma:g}, epilogue {epilogue:g}, sync {sync:g}",
                 fontsize=FONT + 1)
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------
# Exercise references


def expected_parity(it: int, stages: int, role: str) -> int:
    """The parity a thread waits for at the ``it``-th use of the ring (stage
    ``it % stages``): the consumer waits on *full* for the completion of the stage's
    ``it // stages``-th phase; the producer waits on *empty* for the phase before that
    one, which for the first round (a fresh barrier, nothing completed) is the phase
    "before phase 0", parity 1, that ``try_wait`` reports complete at once."""
    if role == "consumer":
        return (it // stages) % 2
    if role == "producer":
        return ((it // stages) % 2) ^ 1
    raise ValueError(f"role must be 'consumer' or 'producer', got {role!r}")


def stage_bytes(BM: int = 128, BN: int = 256) -> int:
    """Bytes of one stage of the TMA rungs' ring (A's BM x 64 box and B's 64 x BN),
    from ``gemmlib.kernels.wgmma_tma.tma_loader``."""
    from gemmlib.kernels.wgmma_tma import tma_loader

    return tma_loader(BM, BN)[2]


def max_stages(BM: int = 128, BN: int = 256, limit: int = 227 * 1024) -> int:
    """The deepest ring (2..8 stages) of ``wgmma_ws`` whose dynamic shared memory (the
    spec's ``shared_bytes``: stages plus the 1 KiB alignment slack) fits in ``limit``;
    0 if none does."""
    from gemmlib.kernels import wgmma_ws

    fits = [s for s in range(2, 9)
            if wgmma_ws.build("fp16", BM=BM, BN=BN, STAGES=s, REGS=None).shared_bytes <= limit]
    return max(fits, default=0)


# --------------------------------------------------------------------------
# Committed results


def for_gpu(files, gpu: str | None):
    """The (file name, data) of ``files`` measured on a GPU whose name contains ``gpu``
    (case-insensitive, e.g. "H100"); all of them when ``gpu`` is None. A page shows one
    GPU's measurements and keeps the other's a click away."""
    if gpu is None:
        return list(files)
    return [(n, d) for n, d in files
            if gpu.lower() in str(d.get("meta", {}).get("gpu", n)).lower()]


def hopper_files(directory=None):
    """The newest ``bench-<gpu>-<date>-hopper.json`` per GPU: [(file name, data)]."""
    return _committed("bench-*-hopper.json", directory)


def tune_files(directory=None):
    """The newest ``tune-wgmma-ws-<gpu>-<date>.json`` per GPU: [(file name, data)]."""
    return _committed("tune-wgmma-ws-*.json", directory)


def wholeprogram_files(directory=None):
    """The committed runs of the assembly experiment (``wholeprogram-*/<gpu>.json``)."""
    from gemmcourse.notebook import committed_json

    return committed_json("wholeprogram-*/*.json", directory)


def wholeprogram_table(data: dict, name: str = ""):
    """Per kernel and shape: the same PTX assembled by numba-cuda's link, by ``ptxas`` as
    a whole program, and by the driver's JIT, each as % of cuBLAS (kernel timing)."""
    from gemmcourse.notebook import Table

    variants = ("numba", "ptxas", "driver")
    cells = {}
    for r in data.get("rows", []):
        key = (r["case"], f"{r['M']}x{r['N']}x{r['K']}")
        pct = r.get("pct_of_cublas")
        cells.setdefault(key, {})[r["variant"]] = "error" if pct is None else f"{pct:.1f}%"
    body = [(case, shape, *(v.get(x, "-") for x in variants)) for (case, shape), v in cells.items()]
    meta = data.get("meta", {})
    return Table(("kernel", "M x N x K", *(f"{x}: % of cuBLAS" for x in variants)), body,
                 caption=f"One PTX, three assemblers: {meta.get('gpu', '?')}"
                         + (f" ({name})" if name else ""))


def lowp_files(directory=None):
    """The committed TF32 and FP8 wgmma runs (``tf32-*/<gpu>.json``, ``fp8-*/<gpu>.json``)."""
    from gemmcourse.notebook import committed_json

    files = (committed_json("tf32-*/*.json", directory)
             + committed_json("fp8-*/*.json", directory))
    return [(n, d) for n, d in files if "bench" in d or "speed" in d]   # not the tuning runs


def lowp_table(data: dict, name: str = ""):
    """Call timing in a loop against the same-precision library call, from one committed
    run: TF32 (``wgmma_tf32`` and ``mma_pipeline``'s tf32 against cuBLAS TF32) or FP8
    (``wgmma_fp8`` e4m3 -> bf16 against ``torch._scaled_mm``, plain and fast accumulation)."""
    from gemmcourse.notebook import Table

    gpu = data.get("meta", {}).get("gpu", "?")
    if "bench" in data:   # TF32
        best = {}
        for r in data["bench"].get("rows", []):
            if r.get("timing") != "call" or r.get("kernel") == "cublas":
                continue
            rung = r["kernel"] if r["kernel"] in ("wgmma_tf32", "mma_pipeline") else None
            if rung is None:   # the "auto" rows time one of the two again: not shown here
                continue
            best[(f"{r['M']}x{r['N']}x{r['K']}", rung)] = float(r["pct_of_cublas"])
        shapes = list(dict.fromkeys(k[0] for k in best))
        body = [(sh, *(f"{best[(sh, x)]:.1f}%" if (sh, x) in best else "-"
                       for x in ("wgmma_tf32", "mma_pipeline"))) for sh in shapes]
        return Table(("M x N x K", "wgmma_tf32: % of cuBLAS TF32", "mma_pipeline tf32"), body,
                     caption=f"TF32, call timing, the rungs by name: {gpu}"
                             + (f" ({name})" if name else ""))
    body = [(f"{r['M']}x{r['N']}x{r['K']}", "w.t()" if r["b"] == "colmajor" else "row-major",
             f"{r['ours_tflops']:.0f}", f"{r['pct_of_scaled_mm']:.1f}%",
             f"{r['pct_of_scaled_mm_fast']:.1f}%") for r in data.get("speed", [])]
    return Table(("M x N x K", "B", "wgmma_fp8 TFLOP/s", "% of _scaled_mm",
                  "% of _scaled_mm (fast accum)"), body,
                 caption=f"FP8 e4m3 -> bf16, call timing: {gpu}" + (f" ({name})" if name else ""))


_RUNG_NAMES = sorted(RUNGS + ("mma_swizzle", "mma_atom"), key=len, reverse=True)


def rung_of(row: dict) -> str:
    """The rung a result row measured: its ``kernel`` when that is a rung (or cuBLAS);
    for ``kernel="auto"`` the rung whose name starts the configuration that ran (the
    row's ``note``); for a variant such as ``wgmma_ws_128x256_s4`` the rung it builds."""
    kernel = str(row.get("kernel", "?"))
    if kernel in RUNGS or kernel == "cublas":
        return kernel
    name = str(row.get("note") or "") if kernel == "auto" else kernel
    return next((r for r in _RUNG_NAMES if name.startswith(r)), kernel)


def hopper_records(data: dict):
    """One dict per (precision, shape, kernel) of a Hopper benchmark file, kernel- and
    call-timed numbers side by side: ``rung``, ``label`` (``"mma_pipeline (auto)"`` for an
    auto row), ``tflops`` / ``pct`` by timing ({"kernel": .., "call": ..}), the
    configuration, and ``met``: call-timed % of cuBLAS >= :data:`TARGET_PCT` (None
    without a call-timed row; cuBLAS rows are not judged)."""
    recs = {}
    for r in data.get("rows", []) if isinstance(data, dict) else []:
        prec = r.get("precision", "?")
        shape = (int(r["M"]), int(r["N"]), int(r["K"]))
        rung = "cublas" if r.get("kernel") == "cublas" else rung_of(r)
        label = f"{rung} (auto)" if r.get("kernel") == "auto" else str(r.get("kernel", rung))
        d = recs.setdefault((prec, shape, label), dict(
            precision=prec, shape=shape, size="x".join(map(str, shape)), rung=rung, label=label,
            config=r.get("note") or "", tflops={}, pct={}, cublas_tflops={}, host_us={},
            median_ms={}))
        timing = r.get("timing", "kernel")
        d["tflops"][timing] = _num(r.get("tflops"))
        d["pct"][timing] = _num(r.get("pct_of_cublas"))
        d["cublas_tflops"][timing] = _num(r.get("cublas_tflops"))
        d["host_us"][timing] = _num(r.get("host_us"))
        d["median_ms"][timing] = _num(r.get("median_ms"))
    order = {r: i for i, r in enumerate(RUNGS + ("cublas",))}
    out = sorted(recs.values(), key=lambda d: (d["precision"], d["shape"][0] * d["shape"][1]
                                               * d["shape"][2], order.get(d["rung"], 99),
                                               d["label"]))
    for d in out:
        call = d["pct"].get("call")
        d["met"] = None if d["rung"] == "cublas" or call is None else bool(call >= TARGET_PCT)
    return out


def hopper_table(data: dict, name: str = ""):
    """A :class:`gemmcourse.notebook.Table` of :func:`hopper_records`: per timing, TFLOP/s
    and % of cuBLAS in one column (``455 (75.2%)``), so the table fits the text column.  The
    build that ran is named only where it is not the rung's default build in that precision
    (``wgmma_ws``, ``wgmma_ws_bf16``), e.g. ``wgmma_ws (auto: wgmma_ws_64x256)``."""
    from gemmcourse.notebook import Table

    def f(d, timing):   # "455 (75.2%)": TFLOP/s and % of cuBLAS in one column per timing
        tf, pct = d["tflops"].get(timing), d["pct"].get(timing)
        if tf is None:
            return "-"
        return f"{tf:.0f}" + (f" ({pct:.1f}%)" if pct is not None else "")

    body = []
    for d in hopper_records(data):
        verdict = "-" if d["met"] is None else ("met" if d["met"] else "missed")
        label = d["label"]
        default = (d["rung"], f"{d['rung']}_{d['precision']}", label)
        if d["rung"] != "cublas" and d["config"] and d["config"] not in default:
            label = (f"{d['rung']} (auto: {d['config']})" if label.endswith(" (auto)")
                     else f"{label} ({d['config']})")
        body.append((d["precision"], d["size"], label, f(d, "kernel"), f(d, "call"), verdict))
    meta = data.get("meta", {}) if isinstance(data, dict) else {}
    cap = (f"Hopper rungs against cuBLAS in the same precision: {meta.get('gpu', '?')}, "
           f"{str(meta.get('date', ''))[:10]}, SM clock {meta.get('smi_clocks_sm', '?')} MHz, "
           f"numba-cuda {meta.get('numba_cuda', '?')}, CUDA runtime "
           f"{meta.get('cuda_runtime', '?')}" + (f" ({name})" if name else ""))
    header = ("precision", "M x N x K", "kernel", "kernel timing: TFLOP/s (% of cuBLAS)",
              "call timing: TFLOP/s (% of cuBLAS)", f"call >= {TARGET_PCT:g}%")
    return Table(header, body, caption=cap)


def pct_range(records, label: str, timing: str = "kernel"):
    """(lowest, highest) % of cuBLAS of the rows labelled ``label`` (a rung measured by
    name; ``"<rung> (auto)"`` for kernel="auto") with ``timing``; None if none."""
    vals = [d["pct"].get(timing) for d in records if d["label"] == label]
    vals = [v for v in vals if v is not None]
    return (min(vals), max(vals)) if vals else None


def targets_line(data: dict, label: str = "wgmma_ws") -> str:
    """'<gpu>: <label> met the target at n of m call-timed shapes (missed: ...)' for the rows
    labelled ``label`` (see :func:`hopper_records`)."""
    recs = [d for d in hopper_records(data) if d["label"] == label and d["met"] is not None]
    gpu = data.get("meta", {}).get("gpu", "?") if isinstance(data, dict) else "?"
    if not recs:
        return f"{gpu}: no call-timed {label} rows to judge"
    missed = [f"{d['precision']} {d['size']} ({d['pct']['call']:.1f}%)" for d in recs
              if not d["met"]]
    return (f"{gpu}: {label} reached >= {TARGET_PCT:g}% of cuBLAS (call timing) at "
            f"{sum(d['met'] for d in recs)} of {len(recs)} measured shapes"
            + (f"; missed: {', '.join(missed)}" if missed else ""))


def ladder_order(data: dict, timing: str = "kernel", ladder=RUNGS[::-1]):
    """Does each rung of ``ladder`` (slowest first) beat the one before it?  Over the
    (precision, size) pairs where the rungs were measured by name with ``timing``:
    ``(pairs in order, pairs, [why not, ...])``."""
    recs = [d for d in hopper_records(data) if d["label"] == d["rung"] and d["rung"] in ladder]
    groups = sorted({(d["precision"], d["size"]) for d in recs
                     if d["pct"].get(timing) is not None})
    broken, bad = [], set()
    for prec, size in groups:
        pct = {d["rung"]: d["pct"].get(timing) for d in recs
               if (d["precision"], d["size"]) == (prec, size)}
        have = [r for r in ladder if pct.get(r) is not None]
        for a, b in zip(have, have[1:]):
            if pct[b] <= pct[a]:
                broken.append(f"{prec} {size}: {b} {pct[b]:.1f}% <= {a} {pct[a]:.1f}%")
                bad.add((prec, size))
    return len(groups) - len(bad), len(groups), broken


def host_table(data: dict, name: str = ""):
    """A :class:`gemmcourse.notebook.Table`: per call-timed row, the host microseconds of one
    call (``host_us``) beside the same rung's kernel-alone time, when measured."""
    from gemmcourse.notebook import Table

    f = lambda v, fmt: "-" if v is None else format(v, fmt)  # noqa: E731
    body = [(d["label"], d["precision"], d["size"], f(d["host_us"].get("call"), ".0f"),
             f(None if d["median_ms"].get("kernel") is None else 1e3 * d["median_ms"]["kernel"],
               ".0f"))
            for d in hopper_records(data) if d["host_us"].get("call") is not None]
    meta = data.get("meta", {}) if isinstance(data, dict) else {}
    return Table(("kernel", "precision", "M x N x K", "host us per call", "kernel alone, us"),
                 body, caption=f"Host time of a call: {meta.get('gpu', '?')}"
                               + (f" ({name})" if name else ""))


def chart_labels(records):
    """The labels a chart shows: each rung of :data:`RUNGS` measured by name, or, when a
    file has no such rows for it, its ``kernel="auto"`` rows (variants stay in the table)."""
    have = {d["label"] for d in records}
    out = []
    for rung in RUNGS:
        if rung in have:
            out.append(rung)
        elif f"{rung} (auto)" in have:
            out.append(f"{rung} (auto)")
    return out


def plot_hopper_bars(data: dict, title=None):
    """% of cuBLAS per precision and size, one bar per rung (:func:`chart_labels`), kernel
    timing above and call timing below, the target as a dashed line; the legend under the
    plots."""
    plt = _plt()
    recs = [d for d in hopper_records(data) if d["rung"] != "cublas"]
    labels = chart_labels(recs)
    fig, axes = plt.subplots(2, 1, figsize=(PAGE_IN, 7.6), sharey=True)
    if not labels:
        for ax in axes:
            ax.text(0.5, 0.5, NOT_MEASURED, ha="center", transform=ax.transAxes)
        return fig
    by = {(d["label"], d["precision"], d["shape"]): d for d in recs}
    w = 0.8 / len(labels)
    top = TARGET_PCT
    handles = {}
    for ax, timing in zip(axes, ("kernel", "call")):
        groups = sorted({(d["precision"], d["shape"]) for d in recs
                         if d["label"] in labels and d["pct"].get(timing) is not None},
                        key=lambda g: (g[0], g[1][0] * g[1][1] * g[1][2]))
        for i, lab in enumerate(labels):
            pts = [(g, by[(lab, *grp)]["pct"][timing]) for g, grp in enumerate(groups)
                   if by.get((lab, *grp)) and by[(lab, *grp)]["pct"].get(timing) is not None]
            if not pts:
                continue
            xs = [g - 0.4 + w * (i + 0.5) for g, _ in pts]
            ys = [v for _, v in pts]
            rung = by[next(k for k in by if k[0] == lab)]["rung"]
            handles[lab] = ax.bar(xs, ys, w, color=RUNG_COLOURS.get(rung, "C0"),
                                  edgecolor="k", hatch="//" if lab != rung else None)
            top = max(top, *ys)
        ax.axhline(TARGET_PCT, color="k", ls="--", lw=1)
        ax.set_xticks(range(len(groups)), [f"{p}\n{s[0]}^3" if s[0] == s[1] == s[2]
                                           else f"{p}\n{'x'.join(map(str, s))}"
                                           for p, s in groups], fontsize=FONT)
        ax.set_xlim(-0.5, max(len(groups), 1) - 0.5)
        ax.set_title(f"{timing} timing" + (" (the target is judged here)" if timing == "call"
                                           else ""), fontsize=FONT + 1)
        ax.set_ylabel("% of cuBLAS", fontsize=FONT)
        ax.tick_params(axis="y", labelsize=FONT)
        ax.grid(True, axis="y", alpha=0.3)
    axes[0].set_ylim(0, 1.05 * top + 5)
    handles["target"] = axes[0].get_lines()[0]
    fig.legend(list(handles.values()),
               [f"target {TARGET_PCT:g}%" if k == "target" else k for k in handles],
               loc="lower center", ncol=3, fontsize=FONT, frameon=False)
    gpu = data.get("meta", {}).get("gpu", "?") if isinstance(data, dict) else "?"
    fig.suptitle(title or f"Hopper rungs against cuBLAS, same precision, on {gpu}",
                 fontsize=FONT + 1)
    fig.tight_layout(rect=(0, 0.09, 1, 1))
    return fig


def show_hopper_results(directory=None, gpu: str | None = None, table: bool = True) -> int:
    """Table (unless ``table`` is False), verdict line and chart for every GPU's newest
    Hopper benchmark (only those whose name contains ``gpu``, if given); returns how many.
    Prints a note when there is none."""
    from IPython.display import display

    files = for_gpu(hopper_files(directory), gpu)
    if not files:
        print(f"(Hopper rungs {NOT_MEASURED}: results/bench-<gpu>-<date>-hopper.json appears "
              "once they have been benchmarked on an H100 or H200 and the file is committed)")
        return 0
    plt = _plt()
    for name, data in files:
        if table:
            display(hopper_table(data, name))
        labels = dict.fromkeys(d["label"] for d in hopper_records(data)
                               if d["rung"] == "wgmma_ws" and d["met"] is not None)
        for label in labels or ("wgmma_ws",):
            print(textwrap.fill(targets_line(data, label), 78, subsequent_indent="  "))
        plot_hopper_bars(data)
        plt.show()
    return len(files)


def implied_cube(row: dict):
    """The n of an n x n x n product that ``row``'s TFLOP/s and milliseconds imply
    (2 n^3 = TFLOP/s x time), rounded; None when either is missing."""
    t, ms = _num(row.get("tflops")), _num(row.get("median_ms"))
    if not t or not ms:
        return None
    return int(round((t * 1e12 * ms * 1e-3 / 2) ** (1 / 3)))


def tune_table(data: dict, name: str = ""):
    """A :class:`gemmcourse.notebook.Table` of one ``wgmma_ws`` tuning file."""
    from gemmcourse.notebook import Table

    rows = data.get("rows", []) if isinstance(data, dict) else []
    body = [(r.get("kernel", "?"), ", ".join(f"{k}={v}" for k, v in r.get("params", {}).items()),
             f"{_num(r.get('tflops')) or float('nan'):.0f}",
             f"{_num(r.get('pct_of_cublas')) or float('nan'):.1f}%") for r in rows]
    sizes = {implied_cube(r) for r in rows} - {None}
    meta = data.get("meta", {}) if isinstance(data, dict) else {}
    size = (f"{sizes.pop()}^3 (from TFLOP/s x time)" if len(sizes) == 1 else "size not recorded")
    cap = (f"wgmma_ws variants, fp16, kernel timing, {size}: {meta.get('gpu', '?')}, "
           f"{str(meta.get('date', ''))[:10]}" + (f" ({name})" if name else ""))
    return Table(("kernel", "changed parameters", "TFLOP/s", "% of cuBLAS"), body, caption=cap)


def runs_here(spec) -> bool:
    """True if ``spec`` can run on this device: ``gemmcourse.notebook.runnable`` (compute
    capability) and the spec's own constraints (the Hopper rungs need exactly 9.0);
    otherwise prints why and returns False."""
    from gemmlib import backend
    from gemmcourse import notebook as nb

    if not nb.runnable(spec):
        return False
    dev = backend.device_info()
    failed = spec.failed_constraints(64, 64, 64, dev)
    if failed:
        print(f"SKIPPED: kernel {spec.name!r} cannot run on {dev.name}: {'; '.join(failed)}. "
              "The rest of the chapter still runs.")
        return False
    return True


def check_rung(build, precision: str, small: dict, small_shapes) -> None:
    """Verify a Hopper rung on this device and print the report with its time: on a GPU
    the default build (``build(precision)``) on the usual odd shapes; in the simulator, where
    every thread is a Python thread, the small build ``build(precision, **small)`` on
    ``small_shapes``. Prints why and returns when the device cannot run it."""
    import time

    import gemmlib
    from gemmcourse import notebook as nb

    spec = build(precision) if nb.on_gpu() else build(precision, **small)
    if not runs_here(spec):
        return
    shapes = nb.verify_shapes(spec) if nb.on_gpu() else small_shapes
    t0 = time.perf_counter()
    report = gemmlib.verify(spec, shapes)
    print(f"{report}\n  [{time.perf_counter() - t0:.1f} s]")


def ptx_evidence(spec, examples: int = 2):
    """A :class:`gemmcourse.notebook.Table`: how often each of ``spec.ptx_must``'s patterns
    occurs in the kernel's PTX for sm_90a (:func:`gemmlib.ptx.compile_ptx`, the compile
    gate's own compiler call, which needs no launch and no kernel cache), with examples.
    In the simulator (which compiles nothing) or without the compiler: a note, None."""
    from gemmlib.backend import SIMULATOR
    from gemmcourse.notebook import Table

    if SIMULATOR:
        print("The simulator compiles nothing, so there is no PTX here. On a machine with "
              "numba-cuda's compiler this cell counts the instructions the rung must contain; "
              "`python -m gemmlib.ptx` (the compile gate) checks them offline.")
        return None
    from gemmlib import ptx as P

    try:
        text = P.compile_ptx(spec)
    except Exception as e:   # no compiler here: say so, keep the chapter running
        print(f"PTX not available ({type(e).__name__}: {e})")
        return None
    rows = []
    for pat in spec.ptx_must:
        hits = [ln.strip() for ln in text.splitlines() if re.search(pat, ln)]
        short = [h if len(h) <= 90 else h[:87] + "..." for h in hits[:examples]]
        rows.append((pat, len(hits), " | ".join(short)))
    return Table(("pattern", "count in PTX", "examples"), rows,
                 caption=f"PTX of {spec.name} for {P.arch_of(spec, (9, 0))}")


__all__ = ["swizzle_slots", "plot_swizzle128", "kernel_descriptors", "decode_descriptor",
           "operand_addresses", "descriptor_of", "descriptor_table", "kstep_reads",
           "plot_kstep_reads", "accumulator_map", "plot_accumulators", "sync_lines",
           "tma_schedule", "ws_schedule", "makespan", "tensor_core_busy", "plot_ws_timeline",
           "expected_parity", "stage_bytes", "max_stages", "hopper_files", "tune_files",
           "rung_of", "hopper_records", "hopper_table", "pct_range", "targets_line",
           "ladder_order", "host_table", "chart_labels", "plot_hopper_bars", "show_hopper_results",
           "implied_cube", "tune_table", "runs_here", "ptx_evidence", "RUNGS", "TARGET_PCT"]


# --------------------------------------------------------------------------
# The last mile: clusters sharing B, ping-pong consumers


def l2_bytes_per_ktile(BM: int = 128, BN: int = 256, CM: int = 1, elem_bytes: int = 2,
                       BK: int = 64) -> dict:
    """What one block copies from L2 for one k-tile of its BM x BN tile when CM blocks of a
    cluster (stacked along M) share B by multicast: its A box, and 1/CM of B's panels (each
    panel 64 columns; a block copies whole panels).  Returns bytes, the FLOPs they feed and
    FLOPs per byte."""
    panels = BN // 64
    mine = -(-panels // CM)                      # the block that copies the most panels
    a, b = BM * BK * elem_bytes, mine * 64 * BK * elem_bytes
    flops = 2 * BM * BN * BK
    return dict(a_bytes=a, b_bytes=b, bytes=a + b, flops=flops, flops_per_byte=flops / (a + b))


def l2_traffic_table(configs=(("wgmma_ws", 128, 256, 1), ("wgmma_cluster", 128, 256, 2),
                              ("wgmma_cluster (CM=4)", 128, 256, 4),
                              ("wgmma_pingpong", 128, 128, 1))):
    """Bytes from L2 per k-tile and per block, and the L2 bandwidth the whole GPU would draw
    at 700 TFLOP/s, for the tile shapes of the Hopper rungs (computed, not measured)."""
    from gemmcourse.notebook import Table

    body = []
    for name, BM, BN, CM in configs:
        t = l2_bytes_per_ktile(BM, BN, CM)
        body.append((name, f"{BM} x {BN}", CM, f"{t['a_bytes'] // 1024} + {t['b_bytes'] // 1024}",
                     f"{t['flops_per_byte']:.0f}", f"{700e12 / t['flops_per_byte'] / 1e12:.1f}"))
    return Table(("rung", "tile per block", "blocks sharing B", "KiB of A + B per k-tile",
                  "FLOP per byte", "L2 TB/s at 700 TFLOP/s"), body,
                 caption="Operand traffic from L2, computed from the tile shapes")


def lastmile_files(directory=None):
    """The committed last-mile runs: kernel timing of the rung variants at 4096^3
    (``lastmile-*/diag*-<gpu>.json``, newest per folder last)."""
    from gemmcourse.notebook import committed_json

    return [(n, d) for n, d in committed_json("lastmile-*/diag*.json", directory)
            if any("max_err" in r for r in d.get("kernel", []))]


def lastmile_table(data: dict, name: str = "", base: str = "wgmma_ws_128x256_s4"):
    """Kernel time of each variant (events around the launch, L2 flushed, median of 30) and
    its speed against ``base`` measured in the same run (every variant ran one block per SM:
    the caption says how many)."""
    from gemmcourse.notebook import Table

    rows = data.get("kernel", [])
    ref = next((r["us"] for r in rows if r["kernel"] == base), None)
    body = [(r["kernel"], f"{r['us']:.1f}", f"{r['tflops']:.0f}",
             "-" if ref is None else f"{100 * ref / r['us']:.1f}%", f"{r['max_err']:.1e}")
            for r in rows]
    blocks = sorted({r["grid"][0] for r in rows})
    return Table(("kernel", "µs", "TFLOP/s", f"speed vs {base}", "max error vs fp32"), body,
                 caption=f"4096^3 fp16, kernel timing, {'/'.join(map(str, blocks))} blocks: "
                         f"{_gpu_named(data, name)}")


# --------------------------------------------------------------------------
# A loop of calls at the power cap (results/loopgap-*/)

def _with_rows(pattern: str, directory=None):
    """The committed JSON files matching ``pattern`` under results/ that hold ``rows``."""
    from gemmcourse.notebook import committed_json

    return [(n, d) for n, d in committed_json(pattern, directory) if d.get("rows")]


def _gpu_named(data: dict, name: str = "") -> str:
    """The end of a table's caption: the file's GPU, then its name in brackets if given."""
    return data.get("meta", {}).get("gpu", "?") + (f" ({name})" if name else "")


def _pct_by_shape(data: dict) -> dict:
    """{(precision, (M, N, K)): {label: % of torch.matmul}} of a steady-state file."""
    cells = {}
    for r in data.get("rows", []):
        key = (r["precision"], (r["M"], r["N"], r["K"]))
        cells.setdefault(key, {})[r["label"]] = r["pct_of_torch"]
    return cells


def loopgap_files(directory=None):
    """The committed loop-gap runs (``loopgap-*/loopgap-<gpu>.json``): each call timed alone,
    in a short loop, in a long loop and call by call, with the SM clock and power seen."""
    return _with_rows("loopgap-*/loopgap-h*.json", directory)


def power_table(data: dict, name: str = "", precision: str = "fp16"):
    """One row per (size, call): microseconds alone (L2 flushed before the launch), in the
    benchmark's short loops (~25 ms) and in one long loop (~1.5 s), and the median SM clock
    and power nvidia-smi sampled during the long loop."""
    from gemmcourse.notebook import Table

    body = []
    for r in data.get("rows", []):
        if r["precision"] != precision:
            continue
        smi = r.get("smi_long") or {}
        body.append((f"{r['n']}^3", r["label"], r["kernel"], f"{r['single_us']:.1f}",
                     f"{r['loop_us']:.1f}", f"{r['long_us']:.1f}",
                     f"{smi['sm_mhz']:.0f}" if smi.get("sm_mhz") else "-",
                     f"{smi['power_w']:.0f}" if smi.get("power_w") else "-"))
    return Table(("size", "call", "kernel", "alone us", "short loop us", "long loop us",
                  "SM MHz (long)", "W (long)"), body,
                 caption=f"{precision}, {_gpu_named(data, name)}")


def steady_files(directory=None):
    """The committed steady-state runs (``loopgap-*/steady-h100.json``, ``-h200.json``):
    candidates alternating with torch.matmul in ~0.25 s blocks, the GPU at its power cap."""
    return _with_rows("loopgap-*/steady-h[0-9]*.json", directory)


def steady_summary(data: dict):
    """{(precision, (M, N, K)): {"torch_us", "auto", "auto16", "best", "best_label"}}: % of
    torch.matmul of ``auto`` (float32 out), ``auto`` with a 16-bit out, and the best rung."""
    out = {}
    for r in data.get("rows", []):
        key = (r["precision"], (r["M"], r["N"], r["K"]))
        s = out.setdefault(key, {"torch_us": r["torch_us"], "best": 0.0, "best_label": ""})
        if r["label"] == "auto":
            s["auto16"] = r["pct_of_torch"]
        elif r["label"] == "auto_fp32":
            s["auto"] = r["pct_of_torch"]
        if r["pct_of_torch"] > s["best"]:
            s["best"], s["best_label"] = r["pct_of_torch"], r["label"]
    return out


def steady_table(data: dict, name: str = ""):
    from gemmcourse.notebook import Table

    body = [(prec, "x".join(map(str, shape)), f"{s['torch_us']:.1f}",
             f"{s.get('auto', float('nan')):.1f}%", f"{s.get('auto16', float('nan')):.1f}%",
             f"{s['best']:.1f}% ({s['best_label']})")
            for (prec, shape), s in steady_summary(data).items()]
    return Table(("precision", "M x N x K", "torch.matmul us", "auto", "auto, 16-bit out",
                  "best rung"), body,
                 caption="% of torch.matmul (cuBLAS, same precision), blocks alternating at "
                         f"the power cap: {_gpu_named(data, name)}")


def plot_steady(files, precision: str = "fp16", ax=None, key: str = "auto",
                legend: bool = True):
    """Bars: ``auto``'s % of torch.matmul per shape, one bar per file (``key="auto16"``:
    ``auto`` with C in the inputs' 16-bit type, torch.matmul's own convention). Each file
    is named by its GPU, and by the file too where several come from one GPU; the legend
    sits to the right of the bars (``legend=False``: none, for a figure that has one)."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(PAGE_IN, 3.2))
    sums = [(name, data.get("meta", {}).get("gpu", name), steady_summary(data))
            for name, data in files]
    gpus = [g for _, g, _ in sums]
    shapes = []
    for _, _, s in sums:
        shapes += [sh for (p, sh) in s if p == precision and sh not in shapes]
    width = 0.8 / max(1, len(sums))
    for i, (name, gpu, s) in enumerate(sums):
        ys = [s.get((precision, sh), {}).get(key, 0.0) for sh in shapes]
        label = gpu if gpus.count(gpu) == 1 else name.rsplit(".", 1)[0]
        ax.bar([x + i * width for x in range(len(shapes))], ys, width, label=label,
               color=f"C{i}")
    ax.axhline(100, color="k", lw=0.8)
    ax.axhline(95, color="k", lw=0.6, ls="--")
    ax.set_xticks([x + width * (len(sums) - 1) / 2 for x in range(len(shapes))])
    ax.set_xticklabels(["x".join(map(str, sh)) for sh in shapes], rotation=25, ha="right",
                       fontsize=FONT)
    ax.tick_params(axis="y", labelsize=FONT)
    ax.set_ylim(50, 105)
    ax.set_ylabel("% of torch.matmul", fontsize=FONT)
    ax.set_title(f"{precision}: gemmlib.matmul (auto"
                 + (", 16-bit out" if key == "auto16" else "") + ") at the power cap",
                 fontsize=FONT + 1)
    if legend:
        ax.legend(fontsize=FONT, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    return ax


def plot_steady_pair(files, key: str = "auto"):
    """:func:`plot_steady` for fp16 above bf16, at the page's width, with one legend for
    both above the panels (the files' colours are the same in both)."""
    from gemmcourse.viz import BOOK_DPI, BOOK_WIDTH_PX, legible

    plt = _plt()
    fig, axes = plt.subplots(2, 1, figsize=(BOOK_WIDTH_PX / BOOK_DPI, 5.8))
    for ax, prec in zip(axes, ("fp16", "bf16")):
        plot_steady(files, prec, ax=ax, key=key, legend=False)
    # above the first panel's title: part of its axes, so the layout keeps room for it
    axes[0].legend(loc="lower center", bbox_to_anchor=(0.5, 1.1), ncol=3, fontsize=FONT,
                   frameon=False)
    fig.tight_layout()
    return legible(fig)


def final_files(directory=None):
    """The call-timing runs behind issue 19's table (``epilogue-*/steady-final-<gpu>.json``):
    ``auto`` with a 16-bit C (``wgmma_store``, 4 stages, two pieces) and with a float32 C,
    and the former 16-bit choice ``wgmma_ws_o16``, each alternating with torch.matmul at the
    power cap (the probe fixed, one unrecorded block per candidate, 9 blocks)."""
    return _with_rows("epilogue-*/steady-final-h*.json", directory)


def target_of(M: int, N: int, K: int) -> float:
    """The last mile's fp16/bf16 target, % of same-precision cuBLAS in a loop of calls: 95%
    at 4096^3 and 8192^3, 90% at 2048^3 and on the model shapes with M >= 4096."""
    return 95.0 if (M, N, K) in ((4096, 4096, 4096), (8192, 8192, 8192)) else 90.0


def target_table(data: dict, name: str = ""):
    """Per (precision, shape): torch.matmul's microseconds, % of it for ``auto`` with C in
    the inputs' type (torch.matmul's convention), with a float32 C, and for the former 16-bit
    choice ``wgmma_ws_o16``; the target and whether the 16-bit ``auto`` meets it."""
    from gemmcourse.notebook import Table

    body = []
    pcts = _pct_by_shape(data)
    for (prec, shape), s in steady_summary(data).items():
        pct = pcts[(prec, shape)]
        goal = target_of(*shape)
        a16 = s.get("auto16", float("nan"))
        body.append((prec, "x".join(map(str, shape)), f"{s['torch_us']:.1f}", f"{a16:.1f}%",
                     f"{s.get('auto', float('nan')):.1f}%",
                     f"{pct['ws3_o16']:.1f}%" if "ws3_o16" in pct else "-",
                     f"{goal:.0f}%", "met" if a16 >= goal else "missed"))
    return Table(("precision", "M x N x K", "torch.matmul us", "auto, 16-bit out",
                  "auto, float32 out", "wgmma_ws_o16", "target", ""), body,
                 caption="% of torch.matmul (cuBLAS, same precision and output type), blocks "
                         f"alternating at the power cap: {_gpu_named(data, name)}")


def epilogue_files(directory=None):
    """The committed epilogue measurements (``epilogue-*/epilogue-<gpu>.json``): wgmma_ws, the
    same kernel with its store taken out, and wgmma_store, each beside cuBLAS."""
    return _with_rows("epilogue-*/epilogue-h*.json", directory)


def epilogue_table(data: dict, name: str = ""):
    """Kernel microseconds (one launch, L2 flushed, median of 30) and % of cuBLAS at each size:
    ``ws`` (wgmma_ws), ``nostore`` (its tiles computed, never written: the mainloop alone) and
    ``store`` (wgmma_store, the epilogue through shared memory and a TMA store)."""
    from gemmcourse.notebook import Table

    rows = data.get("rows", [])
    blas = {r["n"]: r["us"] for r in rows if r["label"] == "cublas"}
    body = [(f"{r['n']}^3", r["out"], r["stages"], r["label"], r["kernel"], f"{r['us']:.1f}",
             f"{100 * blas[r['n']] / r['us']:.1f}%" if r["n"] in blas else "-")
            for r in rows if r["label"] != "cublas"]
    return Table(("size", "C", "stages", "variant", "kernel", "us", "% of cuBLAS"), body,
                 caption="fp16 kernel timing, cuBLAS (torch.matmul) in the same run: "
                         f"{_gpu_named(data, name)}")


def epilogue_costs(data: dict, n: int = 4096, out: str = "fp16", stages: int = 3,
                   BM: int = 128, BN: int = 256) -> dict:
    """Per tile of one persistent block, from a measured epilogue file at n^3: ``mainloop``
    (the store-less kernel's time over the tiles a block walks), ``epilogue`` (what storing
    from registers adds: wgmma_ws minus the store-less kernel) and ``stage`` (what
    wgmma_store's staging adds), in microseconds."""
    rows = {r["label"]: r["us"] for r in data.get("rows", [])
            if r["n"] == n and r.get("out") == out and r.get("stages") == stages}
    sms = int(data.get("meta", {}).get("sm_count") or 132)
    per_block = wave_quantisation(n, n, BM, BN, sms)["rounds"]
    main = rows["nostore"] / per_block
    return {"mainloop": main, "epilogue": rows["ws"] / per_block - main,
            "stage": rows["store"] / per_block - main, "tiles_per_block": per_block}


def epilogue_schedules(mainloop: float, epilogue: float, stage: float, tiles: int = 3) -> dict:
    """One SM's tensor cores and epilogues over ``tiles`` tiles of 128 x 256, three ways:
    {variant: [(row, start, end, label)]}.

    * ``wgmma_ws``: both consumers run a tile's mainloop, then store it from registers
      (``epilogue``); the next tile's wgmma waits for the store.
    * ``wgmma_store``: the consumers put the tile into shared memory (``stage``) and go on; the
      copy engine writes it to C (taking ``epilogue``, say) under the next mainloop.
    * ping-pong: each consumer owns whole tiles of 128 x 128 (half the work: ``mainloop / 2``,
      ``epilogue / 2``), and the two take the tensor cores in turn, so one's epilogue runs
      under the other's mainloop (the model assumes the tensor cores keep their rate on the
      smaller tiles: measured, wgmma_pingpong did not, chapter text)."""
    ev = {"wgmma_ws": [], "wgmma_store": [], "ping-pong": []}
    t = 0.0
    for i in range(tiles):
        ev["wgmma_ws"] += [("tensor cores", t, t + mainloop, f"tile {i}"),
                           ("consumers", t + mainloop, t + mainloop + epilogue, f"store {i}")]
        t += mainloop + epilogue
    t = 0.0
    for i in range(tiles):
        ev["wgmma_store"] += [("tensor cores", t, t + mainloop, f"tile {i}"),
                              ("consumers", t + mainloop, t + mainloop + stage, f"stage {i}"),
                              ("copy engine", t + mainloop + stage,
                               t + mainloop + stage + epilogue, f"C {i}")]
        t += mainloop + stage
    tc, free = 0.0, [0.0, 0.0]
    for i in range(2 * tiles):
        c = i % 2
        start = max(tc, free[c])
        end = start + mainloop / 2
        ev["ping-pong"] += [("tensor cores", start, end, f"{i} (c{c})"),
                            (f"consumer {c}", end, end + epilogue / 2, f"store {i}")]
        tc, free[c] = end, end + epilogue / 2
    return ev


def busy_fraction(events) -> float:
    """The tensor cores' share of the time until the last tensor-core work ends."""
    mma = [(s, e) for row, s, e, _ in events if row == "tensor cores"]
    return sum(e - s for s, e in mma) / max(e for _, e in mma)


def plot_epilogue_timeline(data: dict, n: int = 4096, out: str = "fp16", tiles: int = 3):
    """:func:`epilogue_schedules` drawn with the per-tile costs measured in ``data``."""
    plt = _plt()
    c = epilogue_costs(data, n, out)
    ev = epilogue_schedules(c["mainloop"], c["epilogue"], c["stage"], tiles)
    fig, axes = plt.subplots(3, 1, figsize=(PAGE_IN, 7.0), sharex=True)
    colours = {"tensor cores": "#9fc5e8", "consumers": "#cccccc", "copy engine": "#b6d7a8",
               "consumer 0": "#cccccc", "consumer 1": "#f9cb9c"}
    for ax, (variant, events) in zip(axes, ev.items()):
        rows = list(dict.fromkeys(r for r, *_ in events))
        for row, s, e, label in events:
            ax.barh(rows.index(row), e - s, left=s, color=colours[row], edgecolor="k",
                    height=0.6)
            if e - s > 12:     # room for the label at this width
                ax.text((s + e) / 2, rows.index(row), label, ha="center", va="center",
                        fontsize=FONT)
        ax.set_yticks(range(len(rows)), [r.replace(" ", "\n", 1) for r in rows], fontsize=FONT)
        ax.set_ylim(len(rows) - 0.5, -0.5)
        ax.set_title(f"{variant}: tensor cores busy {100 * busy_fraction(events):.0f}% of the "
                     "time", fontsize=FONT + 1)
        ax.grid(True, axis="x", alpha=0.3)
    axes[-1].set_xlabel("microseconds on one SM", fontsize=FONT)
    axes[-1].tick_params(labelsize=FONT)
    fig.suptitle(f"{tiles} tiles per SM at {n}^3, {out} C, per tile: mainloop "
                 f"{c['mainloop']:.1f} µs,\nstore from registers {c['epilogue']:.1f} µs, "
                 f"staging {c['stage']:.1f} µs (measured on the "
                 f"{data.get('meta', {}).get('gpu', '?')})", fontsize=FONT + 1)
    fig.tight_layout()
    return fig


def store_steady_files(directory=None):
    """The committed call-timing runs of wgmma_store beside wgmma_ws at the power cap
    (``epilogue-*/steady-store-<gpu>.json``)."""
    return _with_rows("epilogue-*/steady-store-h*.json", directory)


def rung_pct_table(data: dict, labels=("ws3", "st", "ws3_o16", "st_o16"), name: str = ""):
    """% of torch.matmul per shape for the candidates ``labels`` of a steady-state file."""
    from gemmcourse.notebook import Table

    body = [(p, "x".join(map(str, shape))) + tuple(f"{v[l]:.1f}%" if l in v else "-"
                                                   for l in labels)
            for (p, shape), v in _pct_by_shape(data).items()]
    return Table(("precision", "M x N x K") + tuple(labels), body,
                 caption="% of torch.matmul, each candidate alternating with it at the power "
                         f"cap: {_gpu_named(data, name)}")


# --------------------------------------------------------------------------
# The tile order and what it costs in L2 and DRAM traffic (computed, not measured)


def wave_traffic(M: int, N: int, K: int, BM: int = 128, BN: int = 256, GROUP_M: int = 8,
                 sms: int = 132, elem_bytes: int = 2):
    """Per wave of ``sms`` persistent blocks (block b takes tiles b, b + sms, ... in the
    kernels' grouped order, ``wgmma_async.grouped_order``): the wave
    index of every tile (a tiles_m x tiles_n array), and per wave the bytes the SMs read from
    L2 without clusters and with clusters of 2 along M (B multicast: tiles 2i, 2i + 1 share
    it), and the bytes of the distinct A row panels and B column panels the wave touches
    (what DRAM must deliver at least, if L2 keeps each panel for the wave)."""
    from gemmlib.kernels.wgmma_async import grouped_order

    origin = grouped_order(BM, BN, GROUP_M)   # the kernels' tile order, as plain Python
    tiles_m, tiles_n = -(-M // BM), -(-N // BN)
    tiles = tiles_m * tiles_n
    wave_of = np.zeros((tiles_m, tiles_n), dtype=int)
    waves = []
    for w0 in range(0, tiles, sms):
        ids = range(w0, min(w0 + sms, tiles))
        origins = [origin(p, M, N) for p in ids]
        for m0, n0 in origins:
            wave_of[m0 // BM, n0 // BN] = w0 // sms
        a, b = BM * K * elem_bytes, BN * K * elem_bytes
        clusters = {}
        for p, (_, n0) in zip(ids, origins):
            clusters.setdefault(p // 2, []).append(n0)
        b_copies = sum(1 if len(set(ns)) == 1 else len(ns) for ns in clusters.values())
        waves.append({"tiles": len(origins),
                      "l2_bytes": len(origins) * (a + b),
                      "l2_bytes_cluster2": len(origins) * a + b_copies * b,
                      "dram_bytes": len({m for m, _ in origins}) * a
                      + len({n for _, n in origins}) * b})
    return wave_of, waves


def plot_tile_order_traffic(M: int = 4096, N: int = 4096, K: int = 4096, sms: int = 132,
                            GROUP_M: int = 8):
    """Top: the wave in which each 128 x 256 tile of C is computed (grouped order, one
    persistent block per SM). Bottom: per wave, GB read from L2 by the SMs without and with
    2-block clusters, and the distinct A and B panels the wave needs from DRAM."""
    plt = _plt()
    wave_of, waves = wave_traffic(M, N, K, GROUP_M=GROUP_M, sms=sms)
    fig, (ax0, ax1) = plt.subplots(2, 1, figsize=(PAGE_IN, 8.0),
                                   gridspec_kw={"height_ratios": [1.3, 1]})
    im = ax0.imshow(wave_of, cmap=plt.get_cmap("viridis", len(waves)), aspect="auto",
                    vmin=-0.5, vmax=len(waves) - 0.5)      # one colour per wave
    ax0.set_xlabel("tile column (256 wide)", fontsize=FONT)
    ax0.set_ylabel("tile row (128 high)", fontsize=FONT)
    ax0.tick_params(labelsize=FONT)
    ax0.set_title(f"wave of each tile, GROUP_M = {GROUP_M}, {sms} SMs", fontsize=FONT + 1)
    fig.colorbar(im, ax=ax0, label="wave", ticks=range(len(waves)))
    x = np.arange(len(waves))
    for i, (key, label) in enumerate((("l2_bytes", "L2 to the SMs, no cluster"),
                                      ("l2_bytes_cluster2", "L2 to the SMs, clusters of 2"),
                                      ("dram_bytes", "distinct panels (DRAM at least)"))):
        ax1.bar(x + (i - 1) * 0.27, [w[key] / 1e9 for w in waves], 0.27, label=label,
                color=("#1f77b4", "#ff7f0e", "#2ca02c")[i])
    ax1.set_xticks(x, [f"wave {i}\n{w['tiles']} tiles" for i, w in enumerate(waves)],
                   fontsize=FONT)
    ax1.tick_params(axis="y", labelsize=FONT)
    ax1.set_ylabel("GB per wave", fontsize=FONT)
    ax1.set_ylim(0, max(w["l2_bytes"] for w in waves) / 1e9 * 1.6)   # room for the legend
    ax1.set_title(f"operand traffic per wave at {M}x{N}x{K} (computed from the tile order)",
                  fontsize=FONT + 1)
    ax1.legend(fontsize=FONT, loc="upper center", ncol=2, frameon=False)
    fig.tight_layout()
    return fig


def wave_quantisation(M: int, N: int, BM: int = 128, BN: int = 256, sms: int = 132) -> dict:
    """The persistent grid's last-wave loss: ``tiles``, ``rounds`` (tiles an SM walks at
    most) and ``busy`` = tiles / (rounds x sms), the share of SM-rounds doing a tile. A perfect
    tail split (stream-K) could save at most ``1 - busy`` of the mainloop (computed)."""
    tiles = -(-M // BM) * -(-N // BN)
    rounds = -(-tiles // sms)
    return {"tiles": tiles, "rounds": rounds, "busy": tiles / (rounds * sms)}


def tail_split_table(sms: int = 132, min_m: int = 4096):
    """:func:`wave_quantisation` of ``wgmma_ws``'s 128 x 256 tiles on the target shapes: the
    squares of the issue and the models suite's shapes with M >= ``min_m``."""
    from gemmlib.bench_models import suite_shapes
    from gemmcourse.notebook import Table

    shapes = [(2048, 2048, 2048), (4096, 4096, 4096), (8192, 8192, 8192)]
    for s in suite_shapes():
        if s.M >= min_m and (s.M, s.N, s.K) not in shapes:
            shapes.append((s.M, s.N, s.K))
    body = []
    for M, N, K in shapes:
        q = wave_quantisation(M, N, sms=sms)
        body.append((f"{M}x{N}x{K}", q["tiles"], f"{q['tiles'] / sms:.2f}", q["rounds"],
                     f"{100 * q['busy']:.1f}%", f"{100 * (1 - q['busy']):.1f}%"))
    return Table(("M x N x K", "tiles", "waves", "rounds", "SM-rounds busy",
                  "at most saved by a tail split"), body,
                 caption=f"128 x 256 tiles on {sms} SMs (computed from the tile counts)")


# --------------------------------------------------------------------------
# B given K-major (an nn.Linear weight) or MN-major: where the copy engine puts its k-tile
# (page 17g)

#: how B is given: "KN" a row-major (K, N) B (MN-major: consecutive n of one k are
#: adjacent), "NK" its (N, K) transpose, as nn.Linear keeps a weight (K-major)
B_LAYOUTS = ("KN", "NK")


def b_box(b_layout: str = "NK", BN: int = 128) -> tuple[int, int]:
    """(rows, columns) of the box one TMA copy moves of B's k-tile, from the loaders'
    ``wgmma_tma.tma_boxes``: 64 k x 64 n panels for a (K, N) B, one box of BN n x 64 k for
    an (N, K) B (``tma_loader(BM, BN, "NK")``, which ``wgmma_tf32.kmajor_loader`` is too)."""
    from gemmlib.kernels import wgmma_tma as T

    if b_layout not in B_LAYOUTS:
        raise ValueError(f"b_layout is one of {B_LAYOUTS}, got {b_layout!r}")
    return tuple(T.tma_boxes(128, BN, b_layout)[1])


def b_tile_offset(n: int, k: int, b_layout: str = "NK", BN: int = 128,
                  elem_bytes: int = 2, swizzle: int = 128) -> int:
    """Byte offset, from the start of B's k-tile in a stage (aligned to 1024 bytes), at
    which the copy engine puts element (n, k) of the k-tile (n < BN, k < 64), for 16-bit
    elements: each box lands with :func:`gemmlib.tma.swizzled_offset`, the boxes one after
    another."""
    from gemmlib import tma

    rows, cols = b_box(b_layout, BN)
    if b_layout == "NK":                  # box rows are n, its columns k
        if not (0 <= n < rows and 0 <= k < cols):
            raise ValueError(f"(n, k) = ({n}, {k}) is outside the {rows} x {cols} box")
        box, r, c = 0, n, k
    else:                                 # box rows are k, its columns 64 n: one per panel
        if not (0 <= k < rows and 0 <= n < BN):
            raise ValueError(f"(n, k) = ({n}, {k}) is outside the {BN} x {rows} k-tile")
        box, r, c = n // cols, k, n % cols
    return (box * rows * cols + tma.swizzled_offset(r, c, cols, elem_bytes, swizzle)) * elem_bytes


def b_landing(b_layout: str = "NK", n: int = 16, k: int = 16, BN: int = 128):
    """(line, chunk): two (n, k) arrays, the 128-byte line of B's k-tile and the 16-byte chunk
    in that line where element (n, k) lands (:func:`b_tile_offset`)."""
    off = np.array([[b_tile_offset(i, j, b_layout, BN) for j in range(k)] for i in range(n)])
    return off // 128, off % 128 // 16


def plot_b_landing(n: int = 16, k: int = 16, BN: int = 128):
    """The top-left n x k corner of B's k-tile, loaded MN-major (left) and K-major (right):
    shade = the 128-byte line of shared memory each element lands in, number = the 16-byte
    chunk of that line; a box around the 8 elements that share one chunk."""
    plt = _plt()
    from matplotlib.patches import Rectangle

    fig, axes = plt.subplots(1, 2, figsize=(PAGE_IN, 4.9), sharey=True)
    (kr, kc), (nr, nc) = b_box("KN", BN), b_box("NK", BN)
    titles = {"KN": f"B row-major (K, N): MN-major\n{BN // kc} boxes of {kr} k x {kc} n",
              "NK": f"B = W.t(), W is (N, K): K-major\none box of {nr} n x {nc} k"}
    top = max(n, k)
    cmap, lo, hi = plt.get_cmap("Blues"), -0.45 * top, 1.5 * top
    for ax, layout in zip(axes, ("KN", "NK")):
        line, chunk = b_landing(layout, n, k, BN)
        im = ax.imshow(line, cmap=cmap, vmin=lo, vmax=hi, aspect="equal",
                       interpolation="nearest")
        for (i, j), c in np.ndenumerate(chunk):
            ax.text(j, i, str(c), ha="center", va="center", fontsize=FONT)
        for key in {(a, b) for a, b in zip(line.ravel(), chunk.ravel())}:
            ii, jj = np.nonzero((line == key[0]) & (chunk == key[1]))
            ax.add_patch(Rectangle((jj.min() - 0.5, ii.min() - 0.5), np.ptp(jj) + 1,
                                   np.ptp(ii) + 1, fill=False, lw=1.4, ec="k"))
        ax.set_title(titles[layout], fontsize=FONT + 1)
        ax.set_xticks(range(0, k, 4))
        ax.set_yticks(range(0, n, 4))
        ax.tick_params(labelsize=FONT)
        ax.set_xlabel("k", fontsize=FONT + 1)
    axes[0].set_ylabel("n", fontsize=FONT + 1)
    fig.suptitle("Where element (n, k) of B's k-tile lands in shared memory\n"
                 "number = 16-byte chunk of its line; a box = one chunk (8 elements)",
                 fontsize=FONT + 1)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    bar = fig.add_axes((0.2, 0.06, 0.6, 0.025))
    cb = fig.colorbar(im, cax=bar, orientation="horizontal", boundaries=np.arange(top + 1) - 0.5,
                      ticks=range(0, top, 2))
    cb.set_label("shade = 128-byte line of the k-tile", fontsize=FONT)
    cb.ax.tick_params(labelsize=FONT)
    return fig


# --------------------------------------------------------------------------
# The K-major builds, measured (page 17g): the layouts suite's files

NOT_MEASURED_NK = "The K-major builds have not been measured yet."
#: the layouts of (A, B) the page shows: row-major B (the reference), and B = W.t()
KMAJOR_LAYOUTS = ("NN", "NT", "TT")


def layouts_files(directory=None):
    """The newest committed run of the layouts suite per GPU (``layouts-<gpu>-<date>.json``
    from ``python -m gemmlib bench --suite layouts``): [(file name, data)]; empty when there
    is none.  Other files under the same pattern (chapter 10's ``layouts-h200.json``, of the
    layout-built kernels) are not runs of the suite and are skipped."""
    from gemmcourse.notebook import _newest_per_gpu, committed_json

    def of_suite(data):
        if not isinstance(data, dict):
            return False
        rows = data.get("rows") or []
        return (data.get("meta", {}).get("suite") == "layouts"
                or any(isinstance(r, dict) and r.get("suite") == "layouts" for r in rows))

    return _newest_per_gpu([(n, d) for n, d in committed_json("layouts-*.json", directory)
                            if of_suite(d)])


def _geomean(xs):
    import math

    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def kmajor_table(data: dict, name: str = "", layouts=KMAJOR_LAYOUTS):
    """Per precision and layout (A, B as BLAS names them: N row-major, T column-major, so NT
    is ``x @ W.t()``): how many products, gemmlib's speed against ``torch.matmul`` on the same
    views (geometric mean and range), against its own row-major (NN) time for the shape, and
    in how many products B had to be copied (no K-major build of the rung ``auto`` ran)."""
    from gemmcourse.notebook import Table

    rows = [r for r in data.get("rows", []) if isinstance(r, dict) and r.get("layout") in layouts]
    body = []
    precisions = sorted({r.get("precision", "?") for r in rows},
                        key=lambda p: (["fp16", "bf16", "tf32", "fp32"] + [p]).index(p))
    for prec in precisions:
        for layout in layouts:
            rs = [r for r in rows if r.get("precision") == prec and r["layout"] == layout]
            if not rs:
                continue
            ok = [r for r in rs if "error" not in r and r.get("pct_torch")]
            if not ok:
                body.append((prec, layout, len(rs), "-", "-", "-", f"{len(rs)} failed"))
                continue
            pct = [r["pct_torch"] for r in ok]
            nn = [r["pct_of_nn"] for r in ok if r.get("pct_of_nn")]
            copied = sum("copied" in str(r.get("kernel", "")) for r in ok)
            failed = len(rs) - len(ok)
            body.append((prec, layout, len(ok), f"{_geomean(pct):.1f}%",
                         f"{min(pct):.1f}-{max(pct):.1f}%",
                         "-" if layout == "NN" or not nn else f"{min(nn):.1f}-{max(nn):.1f}%",
                         f"{copied} of {len(ok)}" + (f" ({failed} failed)" if failed else "")))
    meta = data.get("meta", {})
    return Table(("precision", "A, B", "products", "% of torch (mean)", "% of torch (range)",
                  "% of own NN", "B copied"), body,
                 caption="gemmlib.matmul against torch.matmul on the same views, a loop of "
                         f"calls: {meta.get('gpu', '?')}" + (f" ({name})" if name else ""))


def show_kmajor_measured(directory=None) -> int:
    """Display :func:`kmajor_table` for the newest committed run per GPU, or say that there
    is none yet; returns how many runs were shown."""
    files = layouts_files(directory)
    if not files:
        print(NOT_MEASURED_NK)
        return 0
    from IPython.display import display

    for name, data in files:
        display(kmajor_table(data, name))
    return len(files)
