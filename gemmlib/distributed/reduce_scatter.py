"""Row-parallel products: multiply the local K slice, reduce-scatter the partial sums."""

from __future__ import annotations

try:
    import torch
    import torch.distributed as dist
except ImportError:  # pragma: no cover - torch is an optional dependency of gemmlib
    torch = dist = None

from . import _peer
from ._checks import (_REDUCE_SCATTER, _check_table, _exchange, _fields, _group_info,
                      _local_checks, _raise)
from ._layout import offsets, split_sizes
from ._run import _Runner, local_product
from ._timeline import Timeline

TRANSPORTS = ("nccl", "copy", "direct")


def matmul_reduce_scatter(A_local, B_local, *, overlap: bool = False, chunks: int | None = None,
                          transport: str = "nccl", group=None, sizes=None,
                          timeline: Timeline | None = None, product=None):
    """Row-parallel ``C = A @ B``: K is split over the ranks; each rank multiplies its slice
    and the partial products are summed and scattered by rows.

    Parameters
    ----------
    A_local : this rank's columns of A, ``A[:, k_r]`` (M x K_r).
    B_local : this rank's rows of B, ``B[k_r, :]`` (K_r x N).
        Same dtype and device rules as :func:`allgather_matmul`; every rank's
        M and N must be the same, K_r may differ (zero included).
    overlap : NCCL only.  False: one product, then one reduce-scatter.  True:
        C's rows are cut into ``chunks`` pieces per rank (default 2); the
        reduce-scatter of piece j runs while the products of piece j + 1 do.
    transport : ``"nccl"`` (reduce-scatter collectives), ``"copy"`` (P - 1
        steps: at step s each rank computes the partial block of rank
        ``rank + s`` in its workspace and, after a barrier, a copy engine
        pulls the block rank ``rank - s`` made for it, while the next step's
        product runs; then one kernel adds the P blocks in rank order), or
        ``"direct"`` (every partial block first, one barrier, then the sum
        reads the peers' blocks over NVLink).
    sizes : every rank's number of rows of C (default ``split_sizes(M, P)``).

    Returns this rank's float32 rows of C, ``C[rows_r, :]`` (rows from ``sizes``).
    """
    rank, P, backend = _group_info(group)
    peer = transport in ("copy", "direct")
    if chunks is None:
        chunks = 2 if overlap and not peer else 1
    why = None
    if transport not in TRANSPORTS:
        why = f"ValueError:transport must be one of {TRANSPORTS}, not {transport!r}"
    elif not isinstance(chunks, int) or chunks < 1:
        why = f"ValueError:chunks must be a positive integer, not {chunks!r}"
    elif chunks > 1 and (not overlap or peer):
        why = ("ValueError:chunks only applies with overlap=True and transport='nccl' (the copy "
               "engines move one block per peer)")
    why = why or _local_checks(A_local, B_local, backend)
    if why is None and A_local.shape[1] != B_local.shape[0]:
        why = (f"ValueError:A_local is {tuple(A_local.shape)} and B_local is "
               f"{tuple(B_local.shape)}: A_local's columns and B_local's rows are both this "
               f"rank's K")
    call = "matmul_reduce_scatter"
    ti = TRANSPORTS.index(transport) if transport in TRANSPORTS else -1
    M, N = (A_local.shape[0], B_local.shape[1]) if why is None else (-1, -1)
    if sizes is None:
        table = _exchange(_fields(_REDUCE_SCATTER, (int(bool(overlap)), chunks
                                                    if isinstance(chunks, int) else -1, ti),
                                  A_local, B_local, why), group, backend, P)
        _check_table(table, rank, why, ("overlap", "chunks", "transport"), call)
        for name, col in (("M (A_local's rows)", 6), ("N (B_local's columns)", 9)):
            vals = [t[col] for t in table]
            if any(v != vals[0] for v in vals):
                r = next(r for r, v in enumerate(vals) if v != vals[0])
                raise ValueError(f"{call}: every rank must have the same {name}: rank 0 has "
                                 f"{vals[0]}, rank {r} has {vals[r]}")
        sizes = split_sizes(M, P)
    else:
        if why is not None:
            _raise(why)
        sizes = [int(v) for v in sizes]
        if len(sizes) != P or sum(sizes) != M or min(sizes) < 0:
            raise ValueError(f"{call}: sizes={sizes} must give all {P} ranks' rows of C, "
                             f"adding up to M = {M}")
    return _matmul_reduce_scatter(A_local, B_local, overlap, chunks, transport, group, sizes,
                                  rank, P, timeline, product or local_product)


def _reduce_scatter_flat(out, inp, group, async_op):
    """Sum ``inp`` (P equal blocks) over the ranks; block ``rank`` into ``out``.  NCCL has the
    collective; on gloo it is an all-reduce of the whole buffer, then a copy on the host."""
    if dist.get_backend(group) == "nccl":
        return dist.reduce_scatter_tensor(out, inp, group=group, async_op=async_op)
    work = dist.all_reduce(inp, group=group, async_op=async_op)
    return _ThenCopy(work, out, inp.view(-1, out.numel())[dist.get_rank(group)])


class _ThenCopy:
    """A gloo all-reduce's handle that copies this rank's block out when waited on."""

    def __init__(self, work, out, block):
        self.work, self.out, self.block = work, out, block

    def wait(self):
        self.work.wait()
        self.out.copy_(self.block)
        return True

    def get_future(self):
        return self.work.get_future()


def _matmul_reduce_scatter(A, B, overlap, chunks, transport, group, sizes, rank, P, timeline,
                           product):
    dev, N = A.device, B.shape[1]
    run = _Runner(dev, timeline, f"matmul_reduce_scatter overlap={overlap} transport={transport}"
                  + (f" chunks={chunks}" if overlap and transport == "nccl" else ""))
    ro = offsets(sizes)
    C = torch.empty((sizes[rank], N), dtype=torch.float32, device=dev)
    if P == 1:
        run.run("A @ B", lambda: product(A, B, C) if C.numel() else None)
        run.finish()
        return C
    if transport != "nccl":
        _by_copy_engines(run, A, B, C, transport, group, sizes, ro, rank, P, product)
        run.finish()
        return C
    c = chunks if overlap else 1
    cut = [offsets(split_sizes(s, c)) for s in sizes]     # piece j of rank q's rows
    outs = []
    for j in range(c):
        big = max(cut[q][j + 1] - cut[q][j] for q in range(P))
        if big == 0 or N == 0:
            outs.append(None)
            continue
        part = torch.zeros((P, big, N), dtype=torch.float32, device=dev)

        def products(j=j, part=part):
            for q in range(P):
                lo, hi = ro[q] + cut[q][j], ro[q] + cut[q][j + 1]
                if hi > lo:
                    product(A[lo:hi], B, part[q, :hi - lo])
        run.run(f"partial sums, piece {j}", products)
        out = torch.empty(big * N, dtype=torch.float32, device=dev)
        h = run.issue(f"reduce-scatter piece {j}",
                      [lambda a, out=out, part=part:
                       _reduce_scatter_flat(out, part.view(-1), group, a)], keep=(out, part))
        outs.append((h, out))
    for j in range(c):
        if outs[j] is None:
            continue
        h, out = outs[j]
        run.wait(h)
        n = cut[rank][j + 1] - cut[rank][j]
        if n:
            run.run(f"rows of piece {j}", lambda j=j, out=out, n=n: C[cut[rank][j]:cut[rank][j] + n]
                    .copy_(out[:n * N].view(n, N)), kind="copy")
    run.finish()
    return C


def _by_copy_engines(run, A, B, C, transport, group, sizes, ro, rank, P, product):
    """The partial blocks through the workspace: block for rank q at ``q * big * N`` floats."""
    N, dev = B.shape[1], A.device
    big = max(sizes)
    f32 = torch.float32
    ws = _peer.workspace(group, dev, P, _peer.aligned(P * big * N * 4))
    base = ws.begin()

    def block(q):             # rows of C that rank q keeps, as this rank's partial sums
        return A[ro[q]:ro[q + 1]]

    def at(q):
        return base + q * big * N * 4

    mine = sizes[rank]
    inbox = torch.empty((P, mine, N), dtype=f32, device=dev)
    if transport == "direct":
        for s in range(1, P):
            q = (rank + s) % P
            run.run(f"partial block of rank {q}", lambda q=q: product(
                block(q), B, ws.local(at(q), (sizes[q], N), f32)) if sizes[q] * N else None)
        run.run("own partial block", lambda: product(block(rank), B, inbox[rank])
                if mine * N else None)
        done = run.side("barrier", ws.barrier)
        run.wait(done)

        def total():
            parts = [inbox[rank] if r == rank else ws.peer(r, at(rank), (mine, N), f32)
                     for r in range(P)]
            C.copy_(parts[0])
            for p in parts[1:]:
                C.add_(p)
        run.run("sum of the blocks (read over NVLink)", total)
        return
    pulled = []
    for s in range(1, P):
        q, src = (rank + s) % P, (rank - s) % P
        run.run(f"partial block of rank {q}", lambda q=q: product(
            block(q), B, ws.local(at(q), (sizes[q], N), f32)) if sizes[q] * N else None)

        def pull(src=src):
            ws.barrier()                           # src has made this rank's block too
            if mine * N:
                inbox[src].copy_(ws.peer(src, at(rank), (mine, N), f32))
        pulled.append(run.side(f"barrier + copy block from rank {src}", pull, keep=(inbox,),
                               after=run.mark()))
    run.run("own partial block", lambda: product(block(rank), B, inbox[rank])
            if mine * N else None)
    for h in pulled:
        run.wait(h)
    run.run("sum of the blocks", lambda: torch.sum(inbox, dim=0, out=C) if C.numel() else None)
