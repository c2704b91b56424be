"""Property-based shape testing: every registered kernel, many shapes, one float64 oracle.

Each shape goes through :func:`gemmlib.verify.check_once`: fresh random
inputs, a NaN-poisoned output (an element the kernel forgets stays NaN and
fails), and the relative Frobenius error against the float64 product, within
``verify.tolerance``.

* Simulator (CI): a handful of derandomised hypothesis examples per kernel,
  every dimension <= 40 (``GEMMLIB_SIM_EXAMPLES``, default 4).
* GPU (``-m gpu``): a fixed list of edge shapes built from the kernel's own
  tile -- 1, primes, tile +/- 1, tall-skinny and short-wide, K = 1, K below
  the k-tile, K or N not a multiple of 4 (rows not 16-byte aligned) and
  multiples of 4 (the float4 paths) -- then hypothesis shapes until at least
  ``GEMMLIB_GPU_SHAPES`` (default 200) distinct shapes were tried.

The count of shapes tried per kernel is written to
``$GEMMLIB_REPORT_DIR/properties-<sim|gpu>-<kernel>.json`` when that is set.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import zlib

from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

from gemmlib import backend
from gemmlib.verify import check_once

from _reliability import kernel_names, report, spec_or_skip

SIM_EXAMPLES = int(os.environ.get("GEMMLIB_SIM_EXAMPLES", "4"))
SIM_MAX_DIM = 40
GPU_SHAPES = int(os.environ.get("GEMMLIB_GPU_SHAPES", "200"))
PRIMES = (2, 3, 5, 7, 11, 13, 17, 31, 37, 61, 127, 257, 509, 1021)


def interesting_dims(spec, hi: int) -> list[int]:
    """Dimension values where tiled kernels go wrong, capped at ``hi``."""
    tm, tn = spec.tile
    bk = spec.k_tile
    vals = {1, 2, 3, 4, 5, 8, 16, 33, 63, 64, 65}
    vals.update(PRIMES)
    for t in (tm, tn, bk, 2 * tm, 2 * tn, 2 * bk):
        vals.update((t - 1, t, t + 1))
    return sorted(v for v in vals if 1 <= v <= hi)


def dims(spec, hi: int):
    return st.one_of(st.sampled_from(interesting_dims(spec, hi)), st.integers(1, hi))


def shapes(spec, hi: int, long: int):
    """General shapes plus the families that break kernels: tall-skinny, short-wide, tiny K."""
    bk = spec.k_tile
    d, small = dims(spec, hi), st.integers(1, 8)
    tiny_k = st.integers(1, max(bk - 1, 1))
    big = st.integers(max(hi // 2, 1), long)
    return st.one_of(
        st.tuples(d, d, d),
        st.tuples(big, small, d),        # tall-skinny
        st.tuples(small, big, d),        # short-wide
        st.tuples(d, d, tiny_k),         # K below one k-tile
        st.tuples(d, d, st.just(1)),     # K = 1
    )


def fixed_gpu_shapes(spec) -> list[tuple[int, int, int]]:
    """Deterministic edge shapes for one kernel (about 60-90, all distinct)."""
    tm, tn = spec.tile
    bk = spec.k_tile
    out = [(1, 1, 1), (1, 1, 1000), (1, 1000, 1), (1000, 1, 1), (2, 3, 5), (7, 11, 13),
           (31, 37, 61), (127, 257, 509), (509, 127, 1021), (1021, 1021, 3)]
    for dm in (-1, 0, 1):
        for dn in (-1, 0, 1):
            out.append((tm + dm, tn + dn, bk + dm + dn + 1))
            out.append((2 * tm + dm, 3 * tn + dn, 2 * bk + 1))
    for k in sorted({1, 2, 3, max(bk - 1, 1), bk, bk + 1, 2 * bk + 3}):
        out.append((tm + 3, tn + 5, k))          # K = 1 and K below / around the k-tile
    for m, n in ((4096, 3), (4099, 1), (3, 4096), (1, 4099), (2 * tm + 1, 2), (2, 2 * tn + 1)):
        out.append((m, n, 37))                    # tall-skinny and short-wide
        out.append((m, n, 64))
    for k, n in ((5, 64), (37, 128), (129, 256), (64, 37), (128, 129), (256, 130), (6, 6),
                 (130, 130), (1023, 1025)):
        out.append((tm + 1, n, k))                # K or N % 4 != 0: rows not 16-byte aligned
    for k, n in ((4, 4), (8, 12), (64, 64), (128, 256), (1024, 1024), (bk * 3, tn * 2)):
        out.append((2 * tm - 3, n, k))            # multiples of 4: the float4 paths
    out += [(1500, 1499, 1498), (999, 1001, 1003), (2048, 2048, 7), (300, 5000, 11)]
    seen, uniq = set(), []
    for s in out:
        s = tuple(max(int(v), 1) for v in s)
        if s not in seen:
            seen.add(s)
            uniq.append(s)
    return uniq


class _Tally:
    def __init__(self, name):
        self.name, self.tried, self.distinct, self.worst = name, 0, set(), 0.0
        self.failures: list[str] = []

    def check(self, spec, shape, seed):
        M, N, K = shape
        rng = np.random.default_rng(seed) if backend.SIMULATOR else seed
        c = check_once(spec, M, N, K, rng)
        self.tried += 1
        self.distinct.add(shape)
        if np.isfinite(c.rel_error) and c.tolerance > 0:
            self.worst = max(self.worst, c.rel_error / c.tolerance)
        if not c.ok:
            self.failures.append(str(c))
        return c

    def summary(self, mode, extra=None):
        data = {"kernel": self.name, "mode": mode, "checks": self.tried,
                "distinct_shapes": len(self.distinct), "failures": self.failures,
                "worst_error_over_tolerance": self.worst,
                "shapes": sorted(self.distinct)}
        data.update(extra or {})
        report(f"properties-{mode}-{self.name}", data)
        print(f"[properties] {mode} {self.name}: {len(self.distinct)} distinct shapes, "
              f"{self.tried} checks, {len(self.failures)} failures, "
              f"worst error/tolerance {self.worst:.3f}"
              + (f" {sorted(self.distinct)}" if mode == "sim" else ""))
        return data


def _seed(shape) -> int:
    M, N, K = shape
    return (M * 1_000_003 + N * 10_007 + K) % (2**31)


@pytest.mark.parametrize("name", kernel_names())
def test_shapes_property_sim(name):
    """A handful of small shapes per kernel in the simulator (derandomised: stable in CI)."""
    if not backend.SIMULATOR:
        pytest.skip("simulator sizes; the GPU runs test_shapes_property_gpu")
    spec = spec_or_skip(name)
    tally = _Tally(name)

    @seed(zlib.crc32(name.encode()))  # fixed per kernel: stable in CI, different per rung
    @settings(max_examples=SIM_EXAMPLES, deadline=None, database=None,
              phases=(Phase.explicit, Phase.generate),  # shrinking at ~1 s a run: too slow
              suppress_health_check=list(HealthCheck))
    @given(shape=shapes(spec, SIM_MAX_DIM, SIM_MAX_DIM))
    def prop(shape):
        if shape == (1, 1, 1):   # hypothesis's first example: test_kernels' first odd shape
            return
        c = tally.check(spec, shape, _seed(shape))
        assert c.ok, str(c)

    try:
        prop()
    finally:
        tally.summary("sim")
    assert tally.tried >= 1


@pytest.mark.gpu
@pytest.mark.parametrize("name", kernel_names())
def test_shapes_property_gpu(name):
    """At least GEMMLIB_GPU_SHAPES distinct shapes per kernel on the GPU."""
    spec = spec_or_skip(name)
    tally = _Tally(name)
    fixed = fixed_gpu_shapes(spec)
    for shape in fixed:
        tally.check(spec, shape, _seed(shape))
    assert not tally.failures, f"{name} wrong on fixed shapes:\n" + "\n".join(tally.failures)
    remaining = max(GPU_SHAPES - len(tally.distinct), 0)

    @seed(zlib.crc32(name.encode()))
    @settings(max_examples=max(remaining + 40, 1), deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(shape=shapes(spec, 1100, 4500))
    def prop(shape):
        c = tally.check(spec, shape, _seed(shape))
        assert c.ok, str(c)

    try:
        prop()
    finally:
        data = tally.summary("gpu", {"fixed_shapes": len(fixed)})
    assert data["distinct_shapes"] >= GPU_SHAPES, data
