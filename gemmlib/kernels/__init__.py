"""The kernel ladder: one module per rung, in the order the course builds them.

Each module exposes ``SPEC`` (its default configuration, a
:class:`gemmlib.spec.KernelSpec`) and ``build(**params)`` returning a spec for
other tile parameters.  Modules are imported on first use, so importing
gemmlib compiles nothing.
"""

from __future__ import annotations

import importlib

from gemmlib.spec import KernelSpec

#: Rung names in course order (each is a module of this package).
LADDER: tuple[str, ...] = (
    "naive",
    "coalesced",
    "shared",
    "blocktile_1d",
    "blocktile_2d",
    "vectorized",
    "bank_free",
    "warptile",
    "layout_nt",
    "async_copy",
    "double_buffer",
    "split_k",
    "mma_atom",
    "mma_swizzle",
    "mma_pipeline",
    "mma_split_k",
    "wgmma_async",
    "wgmma_tma",
    "wgmma_ws",
    "wgmma_split_k",
    "skinny",
    "wgmma_tf32",
    "wgmma_fp8",
    "wgmma_cluster",
    "wgmma_pingpong",
    "wgmma_store",
    "wgmma_swap",
)


#: rungs whose product takes per-tensor scales (FP8): the generic unscaled checks skip them
#: (tests/test_wgmma_lowp.py checks them against dequantised references)
SCALED: tuple[str, ...] = ("wgmma_fp8",)


def get(name: str) -> KernelSpec:
    """The default spec of the rung called ``name``.

    The registry knows rungs only: ``"auto"`` (the choice per shape) is
    resolved a layer up, by :func:`gemmlib.dispatch.get_spec`.
    """
    if isinstance(name, KernelSpec):
        return name
    if name not in LADDER:
        raise KeyError(f"unknown kernel {name!r}; known kernels: {', '.join(LADDER)}")
    return importlib.import_module(f"{__name__}.{name}").SPEC


def all_specs() -> list[KernelSpec]:
    """Every registered rung, in course order."""
    return [get(n) for n in LADDER]


def module(name: str):
    """The module that implements rung ``name`` (to show its source)."""
    get(name)
    return importlib.import_module(f"{__name__}.{name}")


def build_params(items) -> dict:
    """Build parameters from ``KEY=VALUE`` strings, as the scripts take a build on their
    command line (``wgmma_store:fp16:OUT=fp16:STAGES=4:PIECES=2``): a whole number becomes
    an int, ``a/b`` a tuple of ints (``REGS=40/232``), anything else stays a string.
    ValueError for an item without ``=``."""
    out = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not (key and eq):
            raise ValueError(f"{item!r}: a build parameter is KEY=VALUE")
        out[key] = (tuple(int(v) for v in value.split("/")) if "/" in value
                    else int(value) if value.isdigit() else value)
    return out
