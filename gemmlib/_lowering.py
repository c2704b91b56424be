"""A linear-time replacement for one quadratic step of numba-cuda's lowering.

Before lowering a function, numba-cuda 0.30 finds the variables assigned exactly
once (``Lower._find_singly_assigned_variable``; they skip a stack slot).  For each
such candidate it rescans every assignment of the candidate's block, so a block
with n assignments costs n^2 -- and the tensor-core rungs are long straight-line
blocks (unrolled fragment loads, mma atoms and stores): profiled on the compile
gate, this step was a third of a cold compile.  Numba itself fixed the same code
upstream (numba/numba#10387, one pass that counts assignments per block); the
copy inside numba-cuda still has the old loop.

:func:`install` swaps in the one-pass version, with the same result: the set of
variables not needing a stack slot, defined in one block only, used in no other
block, and assigned once there.  It does nothing on a numba-cuda other than the
0.30 series it was checked against (a later one may change or fix the step), or
when the lowering does not look as expected; ``GEMMLIB_NUMBA_LOWERING=original``
turns it off.  ``tests/test_lowering.py`` checks that both versions agree on every
function the rungs compile.
"""

from __future__ import annotations

import os
from collections import Counter, defaultdict

_ORIGINAL = None


def _singly_assigned(lower, compute_use_defs, must_use_alloca, assign_types) -> set:
    """The names the original step puts in ``_singly_assigned_vars``, in one pass."""
    if lower.func_ir.func_id.is_generator:
        return set()
    blocks = lower.func_ir.blocks
    use_defs = compute_use_defs(blocks)
    on_stack = must_use_alloca(blocks)
    defined_in = defaultdict(set)
    for label, names in use_defs.defmap.items():
        for name in names:
            defined_in[name].add(label)
    used_across = set().union(*use_defs.usemap.values()) if use_defs.usemap else set()
    counts: dict = {}   # block label -> how often each name is assigned there (lazily)
    out = set()
    for name, labels in defined_in.items():
        if name in on_stack or len(labels) != 1 or name in used_across:
            continue
        (label,) = labels
        if label not in counts:
            counts[label] = Counter(s.target.name for s in lower.blocks[label].find_insts(assign_types))
        if counts[label][name] == 1:
            out.add(name)
    return out


def install() -> bool:
    """Patch numba-cuda's ``Lower`` (idempotent); True when the fast step is in place."""
    global _ORIGINAL
    if os.environ.get("GEMMLIB_NUMBA_LOWERING", "") == "original":
        return False
    try:
        import numba_cuda

        if not numba_cuda.__version__.startswith("0.30."):
            return False
        from numba.cuda import lowering as mod
        Lower = mod.Lower
        parts = (mod.compute_use_defs, mod.must_use_alloca, mod.ir.assign_types)
        original = Lower._find_singly_assigned_variable
    except (ImportError, AttributeError):
        return False
    if _ORIGINAL is not None:
        return True

    def _find_singly_assigned_variable(self):
        self._singly_assigned_vars = _singly_assigned(self, *parts)
        self._blk_local_varmap = {}

    _ORIGINAL = original
    Lower._find_singly_assigned_variable = _find_singly_assigned_variable
    return True


def original():
    """numba-cuda's own method (None before :func:`install` patched it): for the tests."""
    return _ORIGINAL
