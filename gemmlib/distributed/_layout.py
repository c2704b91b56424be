"""Who holds what: shard sizes, offsets, process-grid shapes, SUMMA's panels."""

from __future__ import annotations

import math


def split_sizes(n: int, parts: int) -> list[int]:
    """``n`` items in ``parts`` contiguous shards: the first ``n % parts`` get one more."""
    if parts < 1 or n < 0:
        raise ValueError(f"cannot split {n} into {parts} parts")
    q, r = divmod(n, parts)
    return [q + (i < r) for i in range(parts)]


def offsets(sizes) -> list[int]:
    """Where each shard starts: ``[0, s0, s0 + s1, ...]`` (one more entry than ``sizes``)."""
    out = [0]
    for s in sizes:
        out.append(out[-1] + int(s))
    return out


def grid_shape(P: int) -> tuple[int, int]:
    """The squarest Pr x Pc = P with Pr <= Pc (a prime P gives 1 x P)."""
    if P < 1:
        raise ValueError(f"a process grid needs at least one process, not {P}")
    pr = max(d for d in range(1, math.isqrt(P) + 1) if P % d == 0)
    return pr, P // pr


def panels(ka, kb, width: int | None = None) -> list[tuple[int, int, int, int]]:
    """SUMMA's panels along K: ``(k0, k1, a_col, b_row)`` for each.

    ``ka[j]``: columns of A held by grid column j; ``kb[i]``: rows of B held by
    grid row i (both sum to K).  A panel never crosses an owner's boundary, so
    it lies in grid column ``a_col``'s A blocks and grid row ``b_row``'s B
    blocks; ``width`` cuts panels further to at most that many columns.
    """
    if sum(ka) != sum(kb):
        raise ValueError(f"A's K split {list(ka)} and B's {list(kb)} do not add up to the same K")
    if width is not None and width < 1:
        raise ValueError(f"panel width must be at least 1, not {width}")
    oa, ob = offsets(ka), offsets(kb)
    cuts = sorted(set(oa) | set(ob))
    out = []
    for k0, k1 in zip(cuts, cuts[1:]):
        step = width or (k1 - k0)
        for s in range(k0, k1, step):
            e = min(k1, s + step)
            ja = max(j for j in range(len(ka)) if oa[j] <= s and ka[j] > 0 and s < oa[j + 1])
            ib = max(i for i in range(len(kb)) if ob[i] <= s and kb[i] > 0 and s < ob[i + 1])
            out.append((s, e, ja, ib))
    return out


def result_slices(M: int, N: int, P: int, rank: int, *, gather: str | None = None,
                  grid: tuple[int, int] | None = None) -> tuple[slice, slice]:
    """The rows and columns of C that ``rank`` holds after :func:`allgather_matmul`
    (``gather=``) or :func:`summa` (``grid=``), with the standard split (:func:`split_sizes`)."""
    if gather is not None:
        if gather == "A":  # C[:, cols_r]
            o = offsets(split_sizes(N, P))
            return slice(0, M), slice(o[rank], o[rank + 1])
        o = offsets(split_sizes(M, P))
        return slice(o[rank], o[rank + 1]), slice(0, N)
    pr, pc = grid or grid_shape(P)
    i, j = divmod(rank, pc)
    om, on = offsets(split_sizes(M, pr)), offsets(split_sizes(N, pc))
    return slice(om[i], om[i + 1]), slice(on[j], on[j + 1])
