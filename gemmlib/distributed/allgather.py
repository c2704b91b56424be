"""1-D tensor parallelism: all-gather one operand, multiply by the other."""

from __future__ import annotations

import math

try:  # the layout helpers need no torch; the algorithms do
    import torch
    import torch.distributed as dist
except ImportError:  # pragma: no cover - torch is an optional dependency of gemmlib
    torch = dist = None

from ._checks import (_ALLGATHER, _check_table, _exchange, _fields, _group_info,
                      _local_checks, _raise, _all_gather_flat)
from . import _peer
from ._layout import offsets, split_sizes
from ._run import _Runner, local_product
from ._timeline import Timeline


#: how the shards move: NCCL collectives, or copy engines reading the peers' buffers
TRANSPORTS = ("nccl", "copy", "direct")


def allgather_matmul(A_local, B_local, *, gather: str, overlap: bool = False,
                     chunks: int | None = None, transport: str = "nccl", group=None,
                     sizes=None, timeline: Timeline | None = None, product=None):
    """1-D tensor-parallel ``C = A @ B``: all-gather one operand, multiply by the other.

    Parameters
    ----------
    A_local : this rank's rows of A, ``A[rows_r, :]`` (M_r x K).
    B_local : this rank's columns of B, ``B[:, cols_r]`` (K x N_r).
        torch tensors, float32, float16 or bfloat16, the same dtype on every
        rank, C-contiguous; CUDA tensors on the current device with an NCCL
        group, CPU tensors with a gloo group.  Shards may have any sizes,
        zero included; every rank's K must be the same.
    gather : ``"A"`` all-gathers A and returns ``C[:, cols_r]`` (M x N_r);
        ``"B"`` all-gathers B and returns ``C[rows_r, :]`` (M_r x N).  Each
        rank receives (P-1)/P of the gathered operand: gather the smaller.
    overlap : False: gather, then multiply.  True: the gather is cut into
        ``chunks`` pieces per rank (default 2 with NCCL, 1 otherwise); the
        product of the rank's own shard runs while the first pieces travel,
        and each piece's product as soon as it has arrived.
    transport : ``"nccl"``: NCCL all-gathers (their kernels take SMs while they
        run).  ``"copy"``: copy engines pull each peer's pieces from its
        symmetric-memory buffer over NVLink while every SM computes (GPUs of
        one host; implies overlap).  ``"direct"``: no copies, the products read
        the peers' pieces where they lie, over NVLink.  On CPU processes
        ``copy`` and ``direct`` run the same schedule through gloo.
    group : the process group (default: every process).
    sizes : every rank's shard size along the gathered dimension (A's rows
        or B's columns), to skip the metadata exchange.  Default None: the
        ranks exchange their shapes, and every rank raises the same error when
        any operand is wrong.
    timeline : a :class:`Timeline` to record the products and transfers in.
    product : the local product, ``product(A, B, out)``; default
        :func:`local_product` (``gemmlib.matmul`` on a GPU).

    Returns the float32 result block described under ``gather``.
    """
    rank, P, backend = _group_info(group)
    peer = transport in ("copy", "direct")
    if peer and overlap is False:
        overlap = True                            # copy engines always overlap
    if chunks is None:
        chunks = 2 if overlap and not peer else 1
    why = None
    if gather not in ("A", "B"):
        why = (f"ValueError:gather must be 'A' (C[:, my columns]) or 'B' (C[my rows, :]), "
               f"not {gather!r}")
    elif transport not in TRANSPORTS:
        why = f"ValueError:transport must be one of {TRANSPORTS}, not {transport!r}"
    elif not isinstance(chunks, int) or chunks < 1:
        why = f"ValueError:chunks must be a positive integer, not {chunks!r}"
    elif chunks > 1 and not overlap:
        why = ("ValueError:chunks only applies with overlap=True (without overlap the gather is "
               "one collective)")
    why = why or _local_checks(A_local, B_local, backend)
    if why is None and A_local.shape[1] != B_local.shape[0]:
        why = (f"ValueError:A_local is {tuple(A_local.shape)} and B_local is "
               f"{tuple(B_local.shape)}: A's columns and B's rows are both K")
    gi = {"A": 0, "B": 1}.get(gather, -1)
    chunks_i = chunks if isinstance(chunks, int) else -1
    ti = TRANSPORTS.index(transport) if transport in TRANSPORTS else -1
    call = f"allgather_matmul(gather={gather!r})"
    if sizes is None:
        table = _exchange(_fields(_ALLGATHER, (gi, int(bool(overlap)), chunks_i, ti), A_local,
                                  B_local, why), group, backend, P)
        _check_table(table, rank, why, ("gather", "overlap", "chunks", "transport"), call)
        ks = [t[7] for t in table]                 # A_local's columns
        kb = [t[8] for t in table]                 # B_local's rows
        if any(k != ks[0] for k in ks + kb):
            r = next(r for r in range(P) if ks[r] != ks[0] or kb[r] != ks[0])
            raise ValueError(
                f"{call}: every rank's shards must share K: rank 0 has A_local "
                f"{tuple(table[0][6:8])} and B_local {tuple(table[0][8:10])}, rank {r} has "
                f"A_local {tuple(table[r][6:8])} and B_local {tuple(table[r][8:10])}")
        sizes = [t[6] if gather == "A" else t[9] for t in table]
    else:
        if why is not None:
            _raise(why)
        sizes = [int(v) for v in sizes]
        own = A_local.shape[0] if gather == "A" else B_local.shape[1]
        if len(sizes) != P or sizes[rank] != own:
            raise ValueError(f"{call}: sizes={sizes} must list all {P} ranks' shard sizes, this "
                             f"rank's ({rank}) being {own}")
    return _allgather_matmul(A_local, B_local, gather, overlap, chunks, transport, group, sizes,
                             rank, P, timeline, product or local_product)


def _allgather_matmul(A, B, gather, overlap, chunks, transport, group, sizes, rank, P,
                      timeline, product):
    dev, K = A.device, A.shape[1]
    X = A if gather == "A" else B                 # the gathered operand
    run = _Runner(dev, timeline, f"allgather_matmul gather={gather} overlap={overlap}"
                  + (f" chunks={chunks}" if overlap else "")
                  + (f" transport={transport}" if transport != "nccl" else ""))
    off = offsets(sizes)
    total = off[-1]
    if gather == "A":
        C = torch.empty((total, B.shape[1]), dtype=torch.float32, device=dev)
    else:
        C = torch.empty((A.shape[0], total), dtype=torch.float32, device=dev)
    c = chunks if overlap else 1
    # piece j of rank r: rows (gather A) or columns (gather B) [lo, hi) of r's shard
    cut = [offsets(split_sizes(s, c)) for s in sizes]

    def piece_shape(r, j):
        n = cut[r][j + 1] - cut[r][j]
        return (n, K) if gather == "A" else (K, n)

    def own_piece(j):
        lo, hi = cut[rank][j], cut[rank][j + 1]
        return A[lo:hi] if gather == "A" else B[:, lo:hi]

    def put(r, lo, hi, Xr):
        """C's block from rank r's rows/columns [lo, hi) of the gathered operand."""
        a, b = off[r] + lo, off[r] + hi
        if b == a:
            return
        if gather == "A":
            product(Xr, B, C[a:b])                # a contiguous row slab of C
        elif P == 1 and a == 0 and b == total:
            product(A, Xr, C)
        else:                                     # a column slab: through a temporary
            tmp = product(A, Xr, None)
            C[:, a:b].copy_(tmp)

    if transport != "nccl" and P > 1:
        _by_copy_engines(run, X, gather, transport, group, sizes, cut, rank, P, K,
                         piece_shape, own_piece, put)
        run.finish()
        return C

    # the collectives: one per piece, padded at the end to the largest rank's piece
    recv, handles = [], []
    for j in range(c):
        counts = [math.prod(piece_shape(r, j)) for r in range(P)]
        big = max(counts)
        if P == 1 or big == 0:
            recv.append(None)
            handles.append(None)
            continue
        mine = own_piece(j)
        if mine.is_contiguous() and counts[rank] == big:
            send = mine.reshape(-1)
        else:
            send = torch.zeros(big, dtype=X.dtype, device=dev)
            send[:counts[rank]].view(piece_shape(rank, j)).copy_(mine)
        buf = torch.empty((P, big), dtype=X.dtype, device=dev)
        recv.append((buf, counts))
        if overlap or j == 0:
            # send and buf are used by the comm stream: kept (and recorded on it) until
            # the call ends, so the next piece's staging buffer cannot take send's memory
            handles.append(run.issue(f"all-gather {gather} piece {j}",
                                     [lambda a, buf=buf, send=send:
                                      _all_gather_flat(buf.view(-1), send, group, async_op=a)],
                                     keep=(send, buf)))

    def gathered(r, j):
        if recv[j] is None:                        # nothing to move: the pieces are empty
            return torch.empty(piece_shape(r, j), dtype=X.dtype, device=dev)
        buf, counts = recv[j]
        return buf[r, :counts[r]].view(piece_shape(r, j))

    if not overlap:
        if handles[0] is not None:
            run.wait(handles[0])
        if gather == "A" and recv[0] is not None and len(set(sizes)) == 1:
            # even shards: the receive buffer is A itself, row-major: one product
            run.run("A @ B_local", lambda: product(recv[0][0].view(total, K), B, C))
        elif gather == "B" and recv[0] is not None:
            full = run.run("concatenate B", lambda: torch.cat(
                [gathered(r, 0) for r in range(P)], dim=1), kind="copy")
            run.run("A_local @ B", lambda: product(A, full, C))
        else:
            for r in range(P):
                Xr = X if r == rank else gathered(r, 0)
                run.run(f"piece of rank {r}", lambda r=r, Xr=Xr: put(r, 0, sizes[r], Xr))
    else:
        run.run("own shard", lambda: put(rank, 0, sizes[rank], X))
        for j in range(c):
            if handles[j] is not None:
                run.wait(handles[j])
            for r in range(P):
                if r != rank and cut[r][j + 1] > cut[r][j]:
                    run.run(f"piece {j} of rank {r}", lambda r=r, j=j: put(
                        r, cut[r][j], cut[r][j + 1], gathered(r, j)))
    run.finish()
    return C


def _by_copy_engines(run, X, gather, transport, group, sizes, cut, rank, P, K, piece_shape,
                     own_piece, put):
    """The gather through peers' buffers: each rank stages its pieces in its workspace slot
    (piece j at element ``K * lo_j``, contiguous, so B's column pieces are stored as K x w
    blocks), one barrier, then pulls the peers' pieces in ring order (rank+1, rank+2, ...:
    no two ranks read the same peer at once) with copy engines, each piece's product
    starting when its copy has landed; ``direct`` skips the copies and multiplies the
    peers' pieces where they lie."""
    dt, es = X.dtype, X.element_size()
    c = len(cut[0]) - 1
    ws = _peer.workspace(group, X.device, P, _peer.aligned(max(sizes) * K * es))
    base = ws.begin()

    def at(r, j):
        return base + K * cut[r][j] * es

    def stage():
        for j in range(c):
            if cut[rank][j + 1] > cut[rank][j]:
                ws.local(at(rank, j), piece_shape(rank, j), dt).copy_(own_piece(j))
        ws.barrier()

    ready = run.side("stage own shard + barrier", stage, keep=(X,))
    run.run("own shard", lambda: put(rank, 0, sizes[rank], X))
    order = [((rank + s) % P, j) for s in range(1, P) for j in range(c)
             if cut[(rank + s) % P][j + 1] > cut[(rank + s) % P][j]]
    if transport == "direct":
        run.wait(ready)
        for r, j in order:
            run.run(f"piece {j} of rank {r} (read over NVLink)", lambda r=r, j=j: put(
                r, cut[r][j], cut[r][j + 1], ws.peer(r, at(r, j), piece_shape(r, j), dt)))
        return
    recv = {(r, j): torch.empty(piece_shape(r, j), dtype=dt, device=X.device) for r, j in order}
    landed = {}
    for r, j in order:                             # all copies queued at once, in ring order
        landed[(r, j)] = run.side(
            f"copy piece {j} of rank {r}",
            lambda r=r, j=j: recv[(r, j)].copy_(ws.peer(r, at(r, j), piece_shape(r, j), dt)),
            keep=(recv[(r, j)],), after=ready)
    for r, j in order:
        run.wait(landed[(r, j)])
        run.run(f"piece {j} of rank {r}", lambda r=r, j=j: put(
            r, cut[r][j], cut[r][j + 1], recv[(r, j)]))
