"""SUMMA on a 2-D process grid: panels of A broadcast along rows, of B along columns."""

from __future__ import annotations

try:  # the layout helpers need no torch; the algorithms do
    import torch
    import torch.distributed as dist
except ImportError:  # pragma: no cover - torch is an optional dependency of gemmlib
    torch = dist = None

from ._checks import (_SUMMA, _check_table, _exchange, _fields, _group_info, _local_checks,
                      _raise)
from ._layout import grid_shape, offsets, panels
from ._run import _Runner, local_product
from ._timeline import Timeline


_GRIDS: dict = {}


class ProcessGrid:
    """A Pr x Pc grid of processes with a process group per grid row and per grid column.

    ``ranks`` (default: every process) are laid out row-major in ascending
    order (the order of their ranks in the grid's group): grid position (i, j)
    is ``sorted(ranks)[i * Pc + j]``.  Creating one is collective over the
    *whole job* (torch.distributed.new_group's rule): every process calls it,
    members or not, in the same order.  Create grids once and reuse them.
    """

    def __init__(self, shape: tuple[int, int] | None = None, ranks=None):
        if torch is None or not dist.is_initialized():
            _group_info(None)
        world = dist.get_world_size()
        self.ranks = list(range(world)) if ranks is None else sorted(int(r) for r in ranks)
        P = len(self.ranks)
        if len(set(self.ranks)) != P or not all(0 <= r < world for r in self.ranks):
            raise ValueError(f"ranks {self.ranks} must be distinct ranks of the job "
                             f"(0..{world - 1})")
        self.shape = grid_shape(P) if shape is None else (int(shape[0]), int(shape[1]))
        pr, pc = self.shape
        if pr < 1 or pc < 1 or pr * pc != P:
            raise ValueError(f"a {pr} x {pc} grid has {pr * pc} places but there are {P} "
                             f"processes; choose Pr x Pc = {P} (e.g. {grid_shape(P)})")
        me = dist.get_rank()
        self.group = None if ranks is None or P == world else dist.new_group(self.ranks)
        self.member = me in self.ranks
        self.row_group = self.col_group = None
        self.row = self.col = -1
        if self.member:
            self.row, self.col = divmod(self.ranks.index(me), pc)
        for i in range(pr):                      # every process creates every group, in order
            members = self.ranks[i * pc:(i + 1) * pc]
            g = dist.new_group(members) if pc > 1 else None
            if i == self.row:
                self.row_group = g
        for j in range(pc):
            members = self.ranks[j::pc]
            g = dist.new_group(members) if pr > 1 else None
            if j == self.col:
                self.col_group = g

    def rank_at(self, i: int, j: int) -> int:
        """The global rank at grid position (i, j)."""
        return self.ranks[i * self.shape[1] + j]

    def __repr__(self):
        return f"ProcessGrid({self.shape[0]} x {self.shape[1]}, ranks={self.ranks})"


def _world_grid(shape) -> ProcessGrid:
    key = (id(dist.distributed_c10d._get_default_group()), tuple(shape))
    if key not in _GRIDS:
        _GRIDS[key] = ProcessGrid(shape)
    return _GRIDS[key]


def summa(A_block, B_block, *, grid=None, panel: int | None = None, pipelined: bool = True,
          group=None, sizes=None, timeline: Timeline | None = None, product=None):
    """SUMMA: ``C = A @ B`` on a Pr x Pc process grid, one block of each matrix per rank.

    Parameters
    ----------
    A_block, B_block : rank (i, j)'s blocks ``A[rows_i, ka_j]`` and
        ``B[kb_i, cols_j]``: A's rows split over the grid's rows and its K over
        the columns; B's K over the rows and its columns over the columns.
        Any sizes: a grid row shares its rows of A, a grid column its columns
        of B and its A-columns, a grid row its B-rows.  Same dtype and device
        rules as :func:`allgather_matmul`.
    grid : a :class:`ProcessGrid`, or ``(Pr, Pc)`` with Pr * Pc = P (for the
        default group only: a grid of other ranks must be created first, on
        every process), or None: the squarest factorisation of P.
    panel : cut K into panels of at most this width (default: one panel per
        stretch of K with the same owners, the widest: every panel adds one
        float32 ``C += T`` after its product, since gemmlib.matmul has no
        accumulating form).
    pipelined : issue the next panel's broadcasts before this panel's product.
    sizes : ``(ka, kb)``: A's K split over grid columns and B's over grid rows,
        to skip the metadata exchange (then nothing is checked across ranks).

    Returns this rank's float32 block of C, ``C[rows_i, cols_j]``.
    """
    if isinstance(grid, ProcessGrid):
        if group is not None and group != grid.group:
            raise ValueError("pass either group= or a ProcessGrid (whose group it is), not both")
        group = grid.group
    rank, P, backend = _group_info(group)
    why, shape = None, (0, 0)
    if isinstance(grid, ProcessGrid):
        shape = grid.shape
    elif grid is None:
        shape = grid_shape(P)
    elif isinstance(grid, (tuple, list)) and len(grid) == 2:
        shape = (int(grid[0]), int(grid[1]))
        if shape[0] < 1 or shape[1] < 1 or shape[0] * shape[1] != P:
            why = (f"ValueError:grid={tuple(grid)} does not fit {P} processes: choose "
                   f"Pr x Pc = {P} (e.g. {grid_shape(P)}, or 1 x {P})")
    else:
        why = f"TypeError:grid must be a ProcessGrid, (Pr, Pc) or None, not {grid!r}"
    if panel is not None and (not isinstance(panel, int) or panel < 1):
        why = why or f"ValueError:panel must be a positive integer or None, not {panel!r}"
    why = why or _local_checks(A_block, B_block, backend)
    pr, pc = shape
    call = f"summa(grid={pr}x{pc})"
    i, j = divmod(rank, pc) if pc else (0, 0)
    if sizes is None:
        opts = (pr, pc, panel if isinstance(panel, int) else -1, int(bool(pipelined)))
        table = _exchange(_fields(_SUMMA, opts, A_block, B_block, why), group, backend, P)
        _check_table(table, rank, why, ("Pr", "Pc", "panel", "pipelined"), call)
        _check_summa(table, pr, pc, call)
        ka = [table[c][7] for c in range(pc)]          # A's columns in grid column c (row 0)
        kb = [table[r * pc][8] for r in range(pr)]     # B's rows in grid row r (column 0)
    else:
        if why is not None:
            _raise(why)
        ka, kb = [int(v) for v in sizes[0]], [int(v) for v in sizes[1]]
        if (len(ka) != pc or len(kb) != pr or ka[j] != A_block.shape[1]
                or kb[i] != B_block.shape[0] or sum(ka) != sum(kb)):
            raise ValueError(f"{call}: sizes=(ka, kb) must give A's K split over the {pc} grid "
                             f"columns and B's over the {pr} grid rows, with the same sum; this "
                             f"rank's blocks are A {tuple(A_block.shape)}, "
                             f"B {tuple(B_block.shape)}")
    if isinstance(grid, ProcessGrid):
        g = grid
    elif P == 1:
        g = None
    elif group is None or P == dist.get_world_size():
        g = _world_grid(shape)
    else:
        raise ValueError("summa on a sub-group needs a ProcessGrid created beforehand on every "
                         "process: grid = ProcessGrid((Pr, Pc), ranks=...)")
    return _summa(A_block, B_block, g, shape, rank, ka, kb, panel, pipelined, timeline,
                  product or local_product)


def _check_summa(table, pr, pc, call):
    """Blocks that share a grid row or column must agree on the sizes they share."""
    P = len(table)
    for r in range(P):
        i, j = divmod(r, pc)
        # (field, the rank it must agree with, what they share)
        for f, ref, what in ((6, i * pc, f"grid row {i} must share A's rows,"),
                             (7, j, f"grid column {j} must share A's columns (its stretch of "
                                    f"K),"),
                             (8, i * pc, f"grid row {i} must share B's rows (its stretch of "
                                         f"K),"),
                             (9, j, f"grid column {j} must share B's columns,")):
            if table[r][f] != table[ref][f]:
                raise ValueError(f"{call}: {what} but rank {ref} has {table[ref][f]} and rank "
                                 f"{r} has {table[r][f]}")
    ka = [table[c][7] for c in range(pc)]
    kb = [table[r * pc][8] for r in range(pr)]
    if sum(ka) != sum(kb):
        raise ValueError(f"{call}: A's blocks cover K = {sum(ka)} ({' + '.join(map(str, ka))} over "
                         f"the grid columns) but B's cover K = {sum(kb)} "
                         f"({' + '.join(map(str, kb))} over the grid rows)")


def _summa(A, B, g, shape, rank, ka, kb, panel, pipelined, timeline, product):
    pr, pc = shape
    i, j = divmod(rank, pc)
    dev, dt = A.device, A.dtype
    Mi, Nj = A.shape[0], B.shape[1]
    oa, ob = offsets(ka), offsets(kb)
    plan = panels(ka, kb, panel)
    run = _Runner(dev, timeline, f"summa {pr}x{pc} pipelined={pipelined}"
                  + (f" panel={panel}" if panel else ""))
    C = torch.empty((Mi, Nj), dtype=torch.float32, device=dev)
    if not plan:                                    # K == 0
        C.zero_()
    row_g = g.row_group if g is not None else None
    col_g = g.col_group if g is not None else None

    def start(p):
        """Panel p's operands: broadcast A's along the row and B's along the column."""
        k0, k1, ja, ib = plan[p]
        w = k1 - k0
        if j == ja:
            a0 = k0 - oa[ja]
            Ap = A if (a0 == 0 and w == A.shape[1]) else run.run(
                f"copy A panel {p}", lambda: A[:, a0:a0 + w].contiguous(), kind="copy")
        else:
            Ap = torch.empty((Mi, w), dtype=dt, device=dev)
        if i == ib:
            b0 = k0 - ob[ib]
            Bp = B[b0:b0 + w]                       # rows of a row-major block: contiguous
        else:
            Bp = torch.empty((w, Nj), dtype=dt, device=dev)
        ops = []
        if pc > 1 and Mi > 0:
            ops.append(lambda a, src=g.rank_at(i, ja):
                       dist.broadcast(Ap, src, group=row_g, async_op=a))
        if pr > 1 and Nj > 0:
            ops.append(lambda a, src=g.rank_at(ib, j):
                       dist.broadcast(Bp, src, group=col_g, async_op=a))
        h = run.issue(f"panel {p} broadcasts", ops, keep=(Ap, Bp)) if ops else None
        return Ap, Bp, h

    tmp = None
    pending = start(0) if plan else None
    for p in range(len(plan)):
        Ap, Bp, h = pending
        if pipelined and p + 1 < len(plan):
            pending = start(p + 1)                  # the next panel travels during this product
        if h is not None:
            run.wait(h)
        if Mi and Nj:
            if p == 0:
                run.run(f"panel {p}", lambda: product(Ap, Bp, C))
            else:
                if tmp is None:
                    tmp = torch.empty_like(C)

                def acc(Ap=Ap, Bp=Bp):
                    product(Ap, Bp, tmp)
                    C.add_(tmp)
                run.run(f"panel {p}", acc)
        if not pipelined and p + 1 < len(plan):
            pending = start(p + 1)
    run.finish()
    return C
