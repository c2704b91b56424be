"""Layouts: a small algebra that says where every element of a tile lives and who moves it.

A *layout* is a function from a coordinate to an offset, given by two tuples of
the same length: a **shape** (how far each coordinate runs) and a **stride**
(how far the offset moves per step of that coordinate)::

    offset(c0, c1, ...) = c0 * stride0 + c1 * stride1 + ...

``Layout((4, 3))`` is a 4x3 matrix stored column-major (stride ``(1, 4)``,
the default, as in CuTe and MoYe.jl); ``Layout((4, 3), (3, 1))`` is the same
matrix row-major; ``Layout((4, 3), (1, 5))`` is column-major with one unused
padding element after each column.  Shapes may nest (``((2, 2), 3)``), so one
mode can fold several strides.  The same object describes very different things:

* how a matrix sits in memory (global or shared);
* how the threads of a block are arranged (a *thread layout*: thread
  coordinate -> thread index);
* which part of a tile one thread owns.

The pieces a GEMM kernel needs, and the MoYe.jl / CuTe names they stand for:

========================  =====================================================
:class:`Layout`           shape, stride, ``size`` (how many coordinates),
                          ``cosize`` (how much memory they span),
                          ``coalesce``, :func:`composition` (``A o B``)
:func:`padded`            a column- or row-major layout with ``pad`` unused
                          elements per line: the cure for bank conflicts
:class:`Tiling`           ``@tile``: which block of a matrix a thread block owns
                          (and, for K, the sequence of k-tiles it walks)
:class:`Partition`        ``@parallelize``: which elements of a tile one thread
                          owns under a thread layout, optionally *projected* on
                          some modes of that layout (the ``(1, :)`` / ``(:, 1)``
                          of the compute partition)
========================  =====================================================

Inside kernels, layouts must cost nothing.  Every layout can *generate the
Python source* of its index function with its integers written in as
literals (:meth:`Layout.source`, :meth:`Partition.source`); :func:`jit` turns
that source into a plain-Python function (used on the host, for figures and
tests) and, with ``device=True``, into a ``cuda.jit(device=True)`` function the
kernel calls.  The compiler sees nothing but integer constants, inlines the
call and folds it into the addressing, so a layout-built kernel compiles to
the same instructions as a hand-indexed one (``gemmlib.kernels.layout_nt``
builds both ways so this can be checked).

Plot helpers (:func:`plot_layout`, :func:`plot_partition`, :func:`plot_banks`,
:func:`plot_tiling`) draw a layout as a coloured grid and return the
matplotlib Figure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import reduce
from typing import Callable, Sequence

import numpy as np

# --------------------------------------------------------------------------
# Nested-tuple helpers (an int is a rank-0 "tuple")


def _is_tuple(x) -> bool:
    return isinstance(x, tuple)


def flatten(t) -> tuple:
    """All integers of a nested tuple, depth first: ``((2, 2), 3)`` -> ``(2, 2, 3)``."""
    if not _is_tuple(t):
        return (t,)
    return tuple(v for x in t for v in flatten(x))


def product(t) -> int:
    return reduce(lambda a, b: a * b, flatten(t), 1)


def _congruent(a, b) -> bool:
    if _is_tuple(a) != _is_tuple(b):
        return False
    if not _is_tuple(a):
        return True
    return len(a) == len(b) and all(_congruent(x, y) for x, y in zip(a, b))


def _colmajor_stride(shape, start=1):
    """Compact column-major strides for a (nested) shape: the first mode moves fastest."""
    if not _is_tuple(shape):
        return start, start * shape
    out = []
    for s in shape:
        d, start = _colmajor_stride(s, start)
        out.append(d)
    return tuple(out), start


def _rowmajor_stride(shape):
    """Compact row-major strides for a flat shape: the last mode moves fastest."""
    out, d = [], 1
    for s in reversed(shape):
        out.append(d)
        d *= s
    return tuple(reversed(out))


def idx2crd(idx: int, shape):
    """The coordinate of the ``idx``-th element when ``shape`` is walked column-major
    (first mode fastest), with the nesting of ``shape``."""
    if not _is_tuple(shape):
        return idx
    out = []
    for k, s in enumerate(shape):
        n = product(s)
        last = k == len(shape) - 1
        out.append(idx2crd(idx if last else idx % n, s))  # the last mode takes the rest
        idx //= n
    return tuple(out)


def _flat_coord(coord, shape) -> tuple:
    """A (possibly partly nested or integer) coordinate as one integer per flat mode."""
    if not _is_tuple(shape):
        if _is_tuple(coord):
            raise ValueError(f"coordinate {coord} is deeper than shape {shape}")
        return (coord,)
    if not _is_tuple(coord):  # an integer for a whole (sub)shape: split it column-major
        return flatten(idx2crd(coord, shape))
    if len(coord) != len(shape):
        raise ValueError(f"coordinate {coord} has {len(coord)} modes; shape {shape} has {len(shape)}")
    return tuple(v for c, s in zip(coord, shape) for v in _flat_coord(c, s))


# --------------------------------------------------------------------------
# Layout


@dataclass(frozen=True)
class Layout:
    """A map from coordinates to offsets: ``offset = sum(coord_i * stride_i)``.

    ``Layout((M, N))`` is column-major, ``Layout((M, N), (N, 1))`` row-major.
    Call it with a coordinate, ``L(i, j)``, or with one integer, ``L(k)``,
    which is first turned into the ``k``-th coordinate in column-major order
    (so ``[L(k) for k in range(L.size)]`` lists every offset).
    """

    shape: object
    stride: object = None

    def __post_init__(self):
        shape = tuple(self.shape) if isinstance(self.shape, list) else self.shape
        stride = self.stride
        if stride is None:
            stride = _colmajor_stride(shape)[0]
        stride = tuple(stride) if isinstance(stride, list) else stride
        if not _congruent(shape, stride):
            raise ValueError(f"shape {shape} and stride {stride} must have the same nesting")
        if any(s < 1 for s in flatten(shape)):
            raise ValueError(f"every extent must be at least 1, got shape {shape}")
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "stride", stride)

    # -- what it is ----------------------------------------------------------
    @property
    def rank(self) -> int:
        return len(self.shape) if _is_tuple(self.shape) else 1

    @property
    def size(self) -> int:
        """How many coordinates (elements) the layout has."""
        return product(self.shape)

    @property
    def cosize(self) -> int:
        """How much memory it spans: one past its largest offset (padding included)."""
        return 1 + sum((s - 1) * abs(d) for s, d in zip(flatten(self.shape), flatten(self.stride)))

    def mode(self, i: int) -> "Layout":
        """The sub-layout of mode ``i`` (a column of the matrix picture)."""
        if not _is_tuple(self.shape):
            if i != 0:
                raise IndexError(i)
            return self
        return Layout(self.shape[i], self.stride[i])

    def __call__(self, *coord) -> int:
        c = coord[0] if len(coord) == 1 else tuple(coord)
        flat = _flat_coord(c, self.shape)
        for v, s in zip(flat, flatten(self.shape)):
            if not 0 <= v < s:
                raise IndexError(f"coordinate {c} is outside shape {self.shape}")
        return sum(v * d for v, d in zip(flat, flatten(self.stride)))

    def offsets(self) -> np.ndarray:
        """Every offset, arranged as the (flattened-mode) shape: a matrix for rank 2."""
        dims = tuple(product(s) for s in (self.shape if _is_tuple(self.shape) else (self.shape,)))
        out = np.empty(dims, dtype=np.int64)
        for idx in np.ndindex(*dims):
            out[idx] = self(*idx) if len(dims) > 1 else self(idx[0])
        return out

    def get_coord(self, offset: int):
        """The coordinate whose offset is ``offset`` (the inverse of a compact layout).

        For a *thread* layout this turns ``threadIdx.x`` into the thread's
        coordinate, which is how a thread finds its place in a partition.
        """
        flat_s, flat_d = flatten(self.shape), flatten(self.stride)
        coord = [(offset // d) % s if d else 0 for s, d in zip(flat_s, flat_d)]
        if sum(c * d for c, d in zip(coord, flat_d)) != offset:
            raise ValueError(f"{offset} is not an offset of {self} (is the layout compact?)")
        return tuple(coord) if len(coord) > 1 else coord[0]

    def is_compact(self) -> bool:
        """True when the offsets are exactly 0 .. size-1 (a bijection, no holes)."""
        offs = sorted(self(k) for k in range(self.size))
        return offs == list(range(self.size))

    def is_injective(self) -> bool:
        """True when no two coordinates share an offset (safe to write through)."""
        return len({self(k) for k in range(self.size)}) == self.size

    def coalesce(self) -> "Layout":
        """The same function with as few modes as possible (rank may drop to 1).

        Mode (s0, d0) followed by (s1, d1) merge when d1 == s0 * d0; extents of
        1 vanish.  Useful to read what a composed layout really does.
        """
        out: list[list[int]] = []
        for s, d in zip(flatten(self.shape), flatten(self.stride)):
            if s == 1:
                continue
            if out and out[-1][1] * out[-1][0] == d:
                out[-1][0] *= s
            else:
                out.append([s, d])
        if not out:
            return Layout(1, 0)
        if len(out) == 1:
            return Layout(out[0][0], out[0][1])
        return Layout(tuple(s for s, _ in out), tuple(d for _, d in out))

    def compose(self, other: "Layout") -> "Layout":
        """``self o other``: first ``other``, then ``self`` (see :func:`composition`)."""
        return composition(self, other)

    def __repr__(self) -> str:
        return f"{_fmt(self.shape)}:{_fmt(self.stride)}"

    # -- code generation -----------------------------------------------------
    def source(self, name: str = "offset") -> str:
        """Python source of this layout's index function, its integers written in.

        One argument per top-level mode; an argument for a nested mode is
        split with ``//`` and ``%`` by constants.  Example::

            >>> print(padded((128, 8), 4).source("smem_a"))
            def smem_a(c0, c1):
                return c0 + c1 * 132
        """
        args = [f"c{i}" for i in range(self.rank)]
        modes = [self.mode(i) for i in range(self.rank)]
        terms = []
        for a, m in zip(args, modes):
            terms += _mode_terms(a, m.shape, m.stride)
        return f"def {name}({', '.join(args)}):\n    return {_sum(terms)}\n"


def _fmt(t) -> str:
    if not _is_tuple(t):
        return str(t)
    return "(" + ",".join(_fmt(x) for x in t) + ")"


def _mode_terms(arg: str, shape, stride) -> list[str]:
    """Expression terms for one coordinate ``arg`` of a (possibly nested) mode."""
    flat_s, flat_d = flatten(shape), flatten(stride)
    terms, below = [], 1
    for k, (s, d) in enumerate(zip(flat_s, flat_d)):
        if d == 0 or s == 1:
            below *= s
            continue
        v = arg if below == 1 else f"({arg} // {below})"
        if k < len(flat_s) - 1:  # the last sub-mode needs no wrap
            v = f"({v} % {s})"
        terms.append(_scale(v, d))
        below *= s
    return terms


def _scale(v: str, d: int) -> str:
    return v if d == 1 else f"{v} * {d}"


def _sum(terms) -> str:
    return " + ".join(terms) if terms else "0"


def make_layout(shape, stride=None) -> Layout:
    """``Layout(shape, stride)``: column-major when ``stride`` is None."""
    return Layout(shape, stride)


def col_major(shape) -> Layout:
    return Layout(tuple(shape))


def row_major(shape) -> Layout:
    shape = tuple(shape)
    return Layout(shape, _rowmajor_stride(shape))


def padded(shape, pad: int, major: str = "col") -> Layout:
    """A rank-2 layout with ``pad`` unused elements at the end of every column
    (``major="col"``: stride ``(1, rows + pad)``) or row (``"row"``: stride
    ``(cols + pad, 1)``).

    Padding changes which shared-memory *bank* (``offset % 32``) each element
    lands in, without changing the code that indexes it: see :func:`banks`.
    ``cosize`` grows by ``pad`` per line, ``size`` does not.
    """
    rows, cols = shape
    if major == "col":
        return Layout((rows, cols), (1, rows + pad))
    if major == "row":
        return Layout((rows, cols), (cols + pad, 1))
    raise ValueError("major must be 'col' or 'row'")


# --------------------------------------------------------------------------
# Swizzles: XOR the row into the column so a column of a tile spreads over the banks


@dataclass(frozen=True)
class Swizzle:
    """An XOR swizzle of offsets (CuTe's ``Swizzle<B, M, S>``).

    ``swizzle(o) = o ^ (((o >> (base + shift)) & (2**bits - 1)) << base)``: the
    ``bits`` bits of ``o`` that sit ``shift`` places above bit ``base`` are XORed
    into bits ``base .. base + bits``.  With ``base`` = log2(elements per 16-byte
    chunk) the low bits of the *row* (high bits of the offset) permute which
    16-byte chunk of the row an element lands in.  Each row keeps its elements
    (the swizzle only permutes chunks within a row), so it is a bijection: the
    tile needs no padding, and 16-byte copies and ldmatrix reads stay 16-byte
    aligned.
    """

    bits: int
    base: int
    shift: int

    def __call__(self, offset: int) -> int:
        return offset ^ (((offset >> (self.base + self.shift)) & ((1 << self.bits) - 1))
                         << self.base)

    def expr(self, o: str) -> str:
        mask = (1 << self.bits) - 1
        return f"{o} ^ ((({o} >> {self.base + self.shift}) & {mask}) << {self.base})"

    def __repr__(self) -> str:
        return f"Swizzle<{self.bits},{self.base},{self.shift}>"


@dataclass(frozen=True)
class SwizzledLayout:
    """``swizzle o layout``: the layout's offset, then the XOR swizzle."""

    layout: Layout
    swizzle: Swizzle

    @property
    def size(self) -> int:
        return self.layout.size

    @property
    def cosize(self) -> int:
        return self.layout.cosize

    @property
    def shape(self):
        return self.layout.shape

    @property
    def rank(self) -> int:
        return self.layout.rank

    def __call__(self, *coord) -> int:
        return self.swizzle(self.layout(*coord))

    def offsets(self) -> np.ndarray:
        return np.vectorize(self.swizzle)(self.layout.offsets())

    def is_injective(self) -> bool:
        return len({self(k) for k in range(self.size)}) == self.size

    def __repr__(self) -> str:
        return f"{self.swizzle!r} o {self.layout!r}"

    def source(self, name: str = "offset") -> str:
        """Python source of the swizzled index function (integers written in)."""
        body = self.layout.source("_").split("return ", 1)[1].strip()
        args = ", ".join(f"c{i}" for i in range(self.rank))
        return (f"def {name}({args}):\n    o = {body}\n"
                f"    return {self.swizzle.expr('o')}\n")


def chunk_swizzle(row_elems: int, elem_bytes: int, rows_xor: int = 8, low: int = 0) -> Swizzle:
    """The swizzle that spreads ``rows_xor`` consecutive rows of a row-major tile
    (``row_elems`` elements of ``elem_bytes`` each) over distinct 16-byte chunks.

    The chunk index within a row is XORed with the low bits of the row number
    (shifted past ``low`` chunk bits: ``low=1`` flips chunk bits 1.. for patterns
    whose 8 threads already cover two adjacent chunks).  For rows of 64 bytes
    (4 chunks) two rows share a 128-byte line, so the XOR uses ``row >> 1``.
    """
    per_chunk = 16 // elem_bytes
    chunks = row_elems // per_chunk
    if row_elems % per_chunk or chunks & (chunks - 1) or chunks < 2:
        raise ValueError(f"rows of {row_elems} x {elem_bytes}-byte elements are not a "
                         f"power-of-two number (>= 2) of 16-byte chunks")
    base = per_chunk.bit_length() - 1 + low
    row_shift = row_elems.bit_length() - 1                 # offset bit where the row starts
    line_rows = max(1, 8 // chunks)                        # rows that share a 128-byte line
    bits = min(max(rows_xor // line_rows, 1).bit_length() - 1, (chunks >> low).bit_length() - 1)
    src = row_shift + (line_rows.bit_length() - 1)         # first row bit used
    return Swizzle(bits, base, src - base)


# --------------------------------------------------------------------------
# Composition


def composition(a: Layout, b: Layout) -> Layout:
    """The layout ``R = a o b``: ``R(c) == a(b(c))`` for every coordinate ``c`` of ``b``.

    ``b`` chooses *which* elements (as indices into ``a``'s column-major
    enumeration), ``a`` says *where* they are.  E.g. taking every other row of
    a 4x3 row-major matrix: ``composition(row_major((4, 3)), Layout((2, 3), (2, 4)))``.

    The result keeps ``b``'s shape; each mode ``(s, d)`` of ``b`` becomes the
    modes of ``a`` that remain after skipping the first ``d`` elements' worth
    of ``a``'s extents and keeping ``s`` of what follows.  This needs those
    extents to divide each other ("divisibility"); otherwise ``ValueError``
    (the result would not be a layout).  Beyond ``a``'s size, ``a``'s last
    mode is treated as unbounded, as in CuTe.
    """
    if not _is_tuple(b.shape):
        shape, stride = _compose_mode(a, b.shape, b.stride)
        return Layout(shape, stride)
    shapes, strides = [], []
    for i in range(b.rank):
        sub = composition(a, b.mode(i))
        shapes.append(sub.shape)
        strides.append(sub.stride)
    return Layout(tuple(shapes), tuple(strides))


def _compose_mode(a: Layout, s: int, d: int):
    flat = [(x, y) for x, y in zip(flatten(a.shape), flatten(a.stride))]
    if d == 0 or s == 1:
        return s, 0
    # 1. skip the first d positions of a: divide a's extents by d.
    rest, rem = [], d
    for k, (x, y) in enumerate(flat):
        last = k == len(flat) - 1
        if rem == 1:
            rest.append((x, y))
        elif last:
            rest.append((None, y * rem))  # unbounded last mode
            rem = 1
        elif rem % x == 0:
            rem //= x
        elif x % rem == 0:
            rest.append((x // rem, y * rem))
            rem = 1
        else:
            raise ValueError(f"cannot compose {a} with stride {d}: {d} and extent {x} "
                             "do not divide each other")
    # 2. keep the first s positions of what is left.
    shapes, strides, need = [], [], s
    for k, (x, y) in enumerate(rest):
        last = k == len(rest) - 1
        if need == 1:
            break
        if x is None or last or need <= x:
            if x is not None and not last and x % need:
                raise ValueError(f"cannot compose {a} with extent {s}: {need} does not divide {x}")
            shapes.append(need)
            strides.append(y)
            need = 1
        elif need % x == 0:
            shapes.append(x)
            strides.append(y)
            need //= x
        else:
            raise ValueError(f"cannot compose {a} with extent {s}: {x} does not divide {need}")
    if not shapes:
        return 1, 0
    if len(shapes) == 1:
        return shapes[0], strides[0]
    return tuple(shapes), tuple(strides)


# --------------------------------------------------------------------------
# Tiling a matrix among thread blocks (@tile)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class Tiling:
    """``@tile``: cut a matrix into ``tile`` blocks; block ``(bi, bj)`` owns one.

    ``Tiling((M, K), (bM, bK))`` cuts A.  A thread block with
    ``blockIdx`` ``b`` owns row-block ``b`` of every k-tile: ``origin((b, kt))``
    gives the top-left coordinate of k-tile ``kt``, ``coord(...)`` the matrix
    coordinate of an element of it.  The last tiles hang over the matrix
    when the extents are not multiples of the tile; :meth:`inside` is the
    predicate a kernel uses to zero-fill loads and guard stores there.
    """

    shape: tuple[int, ...]
    tile: tuple[int, ...]

    @property
    def count(self) -> tuple[int, ...]:
        """Number of tiles along each mode (ceiling division)."""
        return tuple(cdiv(n, t) for n, t in zip(self.shape, self.tile))

    def origin(self, tile_coord) -> tuple[int, ...]:
        return tuple(c * t for c, t in zip(tile_coord, self.tile))

    def coord(self, tile_coord, local) -> tuple[int, ...]:
        return tuple(o + x for o, x in zip(self.origin(tile_coord), local))

    def inside(self, coord) -> bool:
        return all(0 <= c < n for c, n in zip(coord, self.shape))

    def owner(self) -> np.ndarray:
        """For each matrix element, the linear (column-major) index of the tile that owns it."""
        grids = np.meshgrid(*[np.arange(n) // t for n, t in zip(self.shape, self.tile)],
                            indexing="ij")
        out = np.zeros(self.shape, dtype=np.int64)
        scale = 1
        for g, c in zip(grids, self.count):
            out += g * scale
            scale *= c
        return out


# --------------------------------------------------------------------------
# Partitioning a tile among threads (@parallelize)


@dataclass(frozen=True)
class Partition:
    """``@parallelize``: the elements of a ``tile``-shaped block one thread owns.

    ``threads`` is a thread layout (thread coordinate -> thread index) whose
    extents divide the tile's.  Thread ``t`` sits at coordinate
    ``threads.get_coord(t)`` and owns tile coordinates

        ``(t0 + i0 * T0, t1 + i1 * T1, ...)``  for ``i_k in range(tile_k // T_k)``

    (``T_k`` = the thread layout's extent on mode ``k``): the threads are laid
    over the tile like a stamp, repeated until it is covered, so neighbouring
    threads touch neighbouring elements on every repeat.

    ``proj`` keeps only some modes of the thread layout (True = keep).  The
    kept modes are applied, in order, to the first modes of the tile; the
    other tile modes are not divided (each thread sees all of them).  With
    the 16x16 compute layout, ``proj=(True, False)`` on the (bM, bK) tile of A
    gives each thread its rows of A and every k (MoYe's ``(1, :)``), and
    ``proj=(False, True)`` on the (bN, bK) tile of B its columns of C's B
    rows (``(:, 1)``): together, what the thread needs for its part of C.
    """

    tile: tuple[int, ...]
    threads: Layout
    proj: tuple[bool, ...] | None = None

    def __post_init__(self):
        object.__setattr__(self, "tile", tuple(self.tile))
        if any(_is_tuple(m) for m in (self.threads.shape if _is_tuple(self.threads.shape)
                                      else (self.threads.shape,))):
            raise ValueError(f"thread layout {self.threads} must have flat modes")
        if not self.threads.is_compact():
            raise ValueError(f"thread layout {self.threads} must number its threads 0..n-1 "
                             "exactly once")
        ext = self.step
        for t, e in zip(self.tile, ext):
            if t % e:
                raise ValueError(f"thread layout extents {ext} must divide the tile {self.tile}")

    @property
    def _kept(self) -> tuple[int, ...]:
        rank = self.threads.rank
        proj = self.proj if self.proj is not None else (True,) * rank
        if len(proj) != rank:
            raise ValueError(f"proj {proj} needs one entry per thread-layout mode ({rank})")
        return tuple(i for i in range(rank) if proj[i])

    @property
    def step(self) -> tuple[int, ...]:
        """Distance between a thread's consecutive elements, per tile mode."""
        ext = [product(self.threads.mode(i).shape) for i in self._kept]
        if len(ext) > len(self.tile):
            raise ValueError(f"{len(ext)} thread modes cannot partition a rank-{len(self.tile)} tile")
        return tuple(ext) + (1,) * (len(self.tile) - len(ext))

    @property
    def shape(self) -> tuple[int, ...]:
        """How many elements each thread owns along each mode."""
        return tuple(t // e for t, e in zip(self.tile, self.step))

    @property
    def size(self) -> int:
        return product(self.shape)

    @property
    def nthreads(self) -> int:
        return self.threads.size

    def thread_coord(self, tid: int) -> tuple[int, ...]:
        c = self.threads.get_coord(tid)
        return c if _is_tuple(c) else (c,)

    def origin(self, tid: int) -> tuple[int, ...]:
        """Tile coordinate of thread ``tid``'s first element."""
        c = self.thread_coord(tid)
        kept = tuple(c[i] for i in self._kept)
        return kept + (0,) * (len(self.tile) - len(kept))

    def coord(self, tid: int, *idx) -> tuple[int, ...]:
        """Tile coordinate of element ``idx`` (one index per mode) of thread ``tid``."""
        return tuple(o + i * s for o, i, s in zip(self.origin(tid), idx, self.step))

    def elements(self, tid: int) -> list[tuple[int, ...]]:
        return [self.coord(tid, *idx) for idx in np.ndindex(*self.shape)]

    def view(self, layout: Layout, tid: int) -> tuple[int, Layout]:
        """Thread ``tid``'s elements as ``(base offset, per-thread layout)`` in ``layout``
        (e.g. the shared-memory layout of the tile): element ``idx`` is at
        ``base + sub(idx)``.  This is the thread's own tensor in CuTe terms."""
        base = layout(*self.origin(tid))
        strides = tuple(layout.mode(k).stride * s for k, s in enumerate(self.step))
        return base, Layout(self.shape, strides)

    def owners(self) -> np.ndarray:
        """For every tile element, the thread that owns it (-1: none; with a
        projection several threads read each element; the lowest is shown)."""
        out = np.full(self.tile, -1, dtype=np.int64)
        for t in reversed(range(self.nthreads)):
            for c in self.elements(t):
                out[c] = t
        return out

    # -- code generation -----------------------------------------------------
    def _origin_exprs(self, tid: str) -> list[str]:
        """One expression per tile mode: thread ``tid``'s origin, read off the thread layout
        (its coordinate on mode i is ``tid // stride_i % extent_i``; the outermost mode
        needs no ``%`` because ``tid`` < number of threads)."""
        out = []
        for i in self._kept:
            m = self.threads.mode(i)
            s, d = m.shape, m.stride
            v = tid if d == 1 else f"({tid} // {d})"
            if d * s != self.threads.size:
                v = f"({v} % {s})"
            out.append(v if s > 1 else "0")
        return out + ["0"] * (len(self.tile) - len(out))

    def source(self, name: str = "coord", layout: Layout | None = None) -> str:
        """Python source of ``name(tid, i0, i1, ...)``: the tile coordinate of element
        ``(i0, i1, ...)`` of thread ``tid``, or, given ``layout``, its offset there."""
        idx = [f"i{k}" for k in range(len(self.tile))]
        coords = []
        for o, i, s in zip(self._origin_exprs("tid"), idx, self.step):
            coords.append(_sum([t for t in (o if o != "0" else "", _scale(i, s)) if t]))
        body = []
        if layout is None:
            ret = ", ".join(coords) if len(coords) > 1 else coords[0]
        else:
            terms = []
            for k, c in enumerate(coords):
                m = layout.mode(k)
                if _is_tuple(m.shape):
                    raise ValueError("offset code needs a layout with flat modes")
                if m.stride:
                    terms.append(_scale(f"({c})", m.stride))
            ret = _sum(terms)
        body.append(f"    return {ret}")
        return f"def {name}(tid, {', '.join(idx)}):\n" + "\n".join(body) + "\n"


# --------------------------------------------------------------------------
# From generated source to functions (host) and device functions (kernels)


def jit(source: str, device: bool = False, env: dict | None = None) -> Callable:
    """Execute generated ``source`` (one ``def``); return the function, or, with
    ``device=True``, a ``cuda.jit(device=True)`` function made from it.

    ``env`` holds the names the source may call (other device functions).
    The function keeps its text in ``__source__`` so a notebook can print
    exactly what the kernel calls.
    """
    ns: dict = dict(env or {})
    given = set(ns)
    exec(compile(source, "<gemmlib.layout>", "exec"), ns)  # noqa: S102 - our own generated text
    fn = next(v for k, v in ns.items()
              if callable(v) and not k.startswith("__") and k not in given)
    fn.__source__ = source
    if not device:
        return fn
    from gemmlib.backend import cuda

    dfn = cuda.jit(device=True)(fn)
    try:
        dfn.__source__ = source
    except AttributeError:
        pass
    return dfn


# --------------------------------------------------------------------------
# Shared-memory banks


def banks(layout: Layout, elem_bytes: int = 4, nbanks: int = 32) -> np.ndarray:
    """The shared-memory bank (``byte address // 4 % 32``) of every element of ``layout``."""
    return (layout.offsets() * elem_bytes // 4) % nbanks


def bank_conflicts(offsets: Sequence[int], elem_bytes: int = 4, nbanks: int = 32) -> int:
    """Ways of conflict of one warp-wide access: the largest number of *distinct*
    4-byte words that fall in one bank (1 = conflict-free; equal words broadcast)."""
    words = {int(o) * elem_bytes // 4 for o in offsets}
    per_bank: dict[int, int] = {}
    for w in words:
        per_bank[w % nbanks] = per_bank.get(w % nbanks, 0) + 1
    return max(per_bank.values()) if per_bank else 0


def warp_access(part: Partition, layout: Layout, idx, warp: int = 0, warp_size: int = 32):
    """The offsets in ``layout`` that the 32 threads of ``warp`` touch at once for
    element ``idx`` of their partition (one instruction of the copy or compute loop)."""
    return [layout(*part.coord(t, *idx))
            for t in range(warp * warp_size, min((warp + 1) * warp_size, part.nthreads))]


# --------------------------------------------------------------------------
# Plots (matplotlib is imported only when drawing)


def _grid_figure(values, labels, title, cmap, *, ax=None, figsize=None, fmt=str, vmax=None):
    import matplotlib.pyplot as plt

    values = np.asarray(values)
    if values.ndim == 1:
        values = values[:, None]
        labels = None if labels is None else np.asarray(labels)[:, None]
    rows, cols = values.shape
    if ax is None:
        w = figsize or (min(0.45 * cols + 1.5, 16), min(0.35 * rows + 1.2, 14))
        fig, ax = plt.subplots(figsize=w)
    else:
        fig = ax.figure
    masked = np.ma.masked_less(values, 0)
    ax.imshow(masked, cmap=cmap, aspect="auto", interpolation="nearest",
              vmin=0, vmax=vmax if vmax is not None else max(int(values.max()), 1))
    if labels is not None and rows * cols <= 1600:
        size = 9 if rows * cols <= 256 else 6
        for (r, c), v in np.ndenumerate(np.asarray(labels)):
            ax.text(c, r, fmt(v), ha="center", va="center", fontsize=size)
    ax.set_xticks(range(cols) if cols <= 40 else [])
    ax.set_yticks(range(rows) if rows <= 40 else [])
    ax.set_xlabel("mode 1 (column)")
    ax.set_ylabel("mode 0 (row)")
    ax.set_title(title)
    fig.tight_layout()
    return fig


def plot_layout(layout: Layout, *, title=None, ax=None):
    """Each element of a rank-2 layout labelled (and coloured) by its offset."""
    offs = layout.offsets()
    return _grid_figure(offs, offs, title or f"layout {layout}", "viridis", ax=ax)


def plot_partition(part: Partition, *, layout: Layout | None = None, title=None, ax=None):
    """Which thread owns each element of the tile (colour and label = thread index)."""
    own = part.owners()
    name = title or (f"tile {part.tile} over threads {part.threads}"
                     + (f", proj {part.proj}" if part.proj else ""))
    return _grid_figure(own % 32 if part.nthreads > 32 else own, own, name, "tab20b", ax=ax,
                        vmax=min(part.nthreads, 32) - 1)


def plot_banks(layout: Layout, *, part: Partition | None = None, idx=None, warp: int = 0,
               title=None, ax=None):
    """Each element's shared-memory bank.  Given a partition and an element index,
    the elements warp ``warp`` touches in that one access are labelled with their
    bank and the title reports the conflict degree; the rest are greyed out."""
    bk = banks(layout)
    labels = bk
    name = title or f"banks of {layout}"
    if part is not None:
        idx = idx if idx is not None else (0,) * len(part.tile)
        touched = np.full(bk.shape, -1)
        for t in range(warp * 32, min((warp + 1) * 32, part.nthreads)):
            c = part.coord(t, *idx)
            touched[c] = bk[c]
        ways = bank_conflicts(warp_access(part, layout, idx, warp))
        name = title or f"{layout}: warp {warp}, element {tuple(idx)}: {ways}-way"
        labels = np.where(touched >= 0, touched, -1)
        return _grid_figure(touched, labels, name, "hsv", ax=ax, vmax=31,
                            fmt=lambda v: "" if v < 0 else str(v))
    return _grid_figure(bk, labels, name, "hsv", ax=ax, vmax=31)


def plot_tiling(tiling: Tiling, *, title=None, ax=None):
    """Which thread block owns each element of the matrix (@tile): one colour per tile,
    and each tile's number once, at its centre (a label per element would not fit)."""
    own = tiling.owner()
    fig = _grid_figure(own, None, title or f"{tiling.shape} in tiles of {tiling.tile}",
                       "tab20", ax=ax)
    ax = ax or fig.axes[0]
    ax.set_yticks(range(0, own.shape[0], tiling.tile[0]))   # where each tile starts
    ax.set_xticks(range(0, own.shape[1], tiling.tile[1]))
    for t in np.unique(own[own >= 0]):
        rows, cols = np.nonzero(own == t)
        ax.text((cols.min() + cols.max()) / 2, (rows.min() + rows.max()) / 2, str(t),
                ha="center", va="center", fontsize=11, fontweight="bold")
    return fig


__all__ = [
    "Layout", "make_layout", "col_major", "row_major", "padded", "composition", "flatten",
    "product", "idx2crd", "Tiling", "Partition", "jit", "banks", "bank_conflicts",
    "warp_access", "plot_layout", "plot_partition", "plot_banks", "plot_tiling", "cdiv",
]
