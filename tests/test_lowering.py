"""gemmlib's one-pass ``_find_singly_assigned_variable`` (gemmlib/_lowering.py) gives
numba-cuda's own answer on every function a tensor-core rung compiles.

Runs the real compiler in a subprocess (this session uses the simulator, which
does not lower anything): each lowered function is answered by both versions,
and the sets must be equal.
"""

from _reliability import run_offline

CODE = """
import json, os
os.environ.pop("GEMMLIB_NUMBA_LOWERING", None)   # (the switch that keeps numba's own)
from gemmlib import _lowering, ptx
from gemmlib.kernels import get
from numba.cuda import lowering as mod

fast = mod.Lower._find_singly_assigned_variable
original = _lowering.original()
seen = []

def both(self):
    original(self)
    want = set(self._singly_assigned_vars)
    fast(self)
    seen.append((self.fndesc.qualname, want == self._singly_assigned_vars, len(want)))

mod.Lower._find_singly_assigned_variable = both
for name in ("mma_swizzle", "skinny"):
    ptx.compile_ptx(get(name), (8, 0))
print(json.dumps(seen))
"""


def test_one_pass_step_agrees_with_numba_cuda():
    seen = run_offline(CODE, timeout=600)
    assert len(seen) >= 10, seen                     # the kernels and their device functions
    assert sum(n for _, _, n in seen) > 100          # ... with many singly assigned names
    assert [q for q, same, _ in seen if not same] == []
