"""Answers to chapter 19's exercises: bytes, panels, pipelines and the copy engines' workspace
of a GEMM split over several GPUs (gemmlib.distributed)."""


def _vd():
    from gemmcourse import viz_distributed as vd

    return vd


def bytes_received(M=8192, N=32768, K=8192, P=4, b=2, alg="gather_A"):
    """Bytes one GPU receives in a 1-D all-gather of A (even shards)."""
    return _vd().comm_bytes(alg, M, N, K, P, b)


def flops(M=8192, N=32768, K=8192, P=4):
    """Flops one GPU does: a P-th of 2MNK."""
    return _vd().flops_per_gpu(M, N, K, P)


def bytes_per_flop(M=8192, N=32768, K=8192, P=4, b=2, alg="gather_A"):
    return _vd().bytes_per_flop(alg, M, N, K, P, b)


def summa_bytes(n=16384, P=4, b=2, grid=(2, 2)):
    """Bytes one GPU of a Pr x Pc grid receives in SUMMA, square n^3."""
    return _vd().comm_bytes("summa", n, n, n, P, b, grid=tuple(grid))


def one_d_bytes(n=16384, P=4, b=2):
    """Bytes one GPU receives gathering A, square n^3."""
    return _vd().comm_bytes("gather_A", n, n, n, P, b)


def gather_which(M=2048, N=16384, K=8192, P=8, b=2):
    """The operand whose all-gather moves fewer bytes: "A" or "B"."""
    vd = _vd()
    return "A" if vd.comm_bytes("gather_A", M, N, K, P, b) <= \
        vd.comm_bytes("gather_B", M, N, K, P, b) else "B"


def split_sizes(n, P):
    """gemmlib.distributed's shard sizes."""
    from gemmlib.distributed import split_sizes as split

    return split(n, P)


def panels(ka, kb):
    """gemmlib.distributed's SUMMA panels, without a width limit."""
    from gemmlib.distributed import panels as cut

    return cut(ka, kb)


def wall_overlapped(comm=(1.5,) * 4, compute=(2.0,) + (2.5,) * 4, needs=(None, 0, 1, 2, 3)):
    """The wall time of the chunked, overlapped schedule."""
    return _vd().pipeline_time(list(comm), list(compute), list(needs))


def wall_serial(comm=(1.5,) * 4, compute=(2.0,) + (2.5,) * 4):
    """Gather everything, then multiply."""
    return sum(comm) + sum(compute)


def bytes_pulled(rows=2048, K=8192, P=4, b=2):
    """Bytes one rank's copy engine pulls in one call of the copy transport (gather A): every
    peer's rows of A, the own rows staying where they are."""
    return (P - 1) * rows * K * b


def peer_offset(call=3, piece=1, rows=2048, K=8192, chunks=2, slot=32 << 20, b=2):
    """The byte offset, in the owner's workspace, of its piece ``piece`` during call number
    ``call`` (from 0) on the group: the slot that call uses (the two alternate, as
    gemmlib.distributed's workspace hands them out), plus where the piece's rows start."""
    from gemmlib.distributed import _peer, offsets, split_sizes as split

    ws = _peer._Base(slot)
    for _ in range(call + 1):
        base = ws.begin()
    return base + K * offsets(split(rows, chunks))[piece] * b
