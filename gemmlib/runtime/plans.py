"""Launch plans: everything about a launch that depends only on (spec, M, N, K).

A :class:`Plan` holds the launch geometry, the K slices and the workspace a spec
needs for one shape, made once after the spec's constraints are checked on this
device (:func:`plan`, memoised: a repeated shape costs a dict lookup).
"""

from __future__ import annotations

from dataclasses import dataclass

from gemmlib import backend
from gemmlib.runtime.caches import LRU, STATS
from gemmlib.runtime.select import AUTO, get_spec, select
from gemmlib.spec import KernelSpec, cdiv


@dataclass(frozen=True)
class Plan:
    spec: KernelSpec
    M: int
    N: int
    K: int
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_bytes: int
    #: K slices (grid z); > 1 only for split-K specs, which then need a workspace
    splits: int = 1
    #: (rows, cols, dtype) of the workspace arrays of specs that take them (spec.workspace)
    workspace: tuple = ()
    #: a batched launch (``spec.batched``): this many products of (M / batch) x N x K,
    #: their A, B and C stacked row after row (M counts every product's rows)
    batch: int = 1

    @property
    def b_rows(self) -> int:
        """Rows of B's memory: (N, K) for a K-major build, else (K, N), per product."""
        return self.batch * (self.N if self.spec.b_kmajor else self.K)

    @property
    def reduce_grid(self) -> tuple[int, int, int]:
        bx, by, _ = self.spec.reduce_block
        return (cdiv(self.N, bx), cdiv(self.M, by), 1)


_PLANS = LRU(4096)


def plan(kernel, M: int, N: int, K: int, batch: int = 1) -> Plan:
    """The launch plan of ``kernel`` (rung name, "auto" or spec) for (M, N, K), or for
    ``batch`` products of that shape in one launch (a spec with ``batched``).

    Checks the spec's constraints on this device (``ConstraintError`` naming
    the one that fails); memoised, so a repeated shape costs a dict lookup.
    """
    key = (kernel if isinstance(kernel, str) else id(kernel), M, N, K, batch)
    p = _PLANS.get(key)
    if p is not None and (isinstance(kernel, str) or p.spec is kernel):
        return p
    spec = select(M, N, K) if kernel == AUTO else get_spec(kernel)
    dev = backend.device_info()
    spec.check(M, N, K, dev)
    geo = spec.launch(M, N, K)
    splits = geo.grid[2] if spec.reduce_kernel is not None else 1
    work = tuple(spec.workspace(M, N, K)) if spec.workspace is not None else ()
    grid = geo.grid
    if batch != 1:
        if not spec.batched or splits > 1 or work or spec.b_prep is not None:
            raise ValueError(f"{spec.name} has no batched launch")
        # the rung's persistent grid for every product's tiles (as many as a matrix of
        # batch * cdiv(M, BM) * BM rows has): at most one block per SM, walking them all
        grid = spec.grid(batch * cdiv(M, spec.tile[0]) * spec.tile[0], N, K)
    STATS["plans"] += 1
    return _PLANS.put(key, Plan(spec, M * batch, N, K, grid, geo.block,
                                geo.dynamic_shared_bytes, splits, work, batch))

