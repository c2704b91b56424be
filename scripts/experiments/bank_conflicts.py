"""Launch each shared-memory rung once, for Nsight Compute to count bank conflicts.

Run it under ncu with scripts/experiments/bank_conflicts.sh (GPU machine, repository root).
Prints, in launch order, each kernel and what gemmlib.banks predicts for the
counters, so the two can be compared line by line.
"""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "0")

import gemmlib  # noqa: E402
from gemmlib import backend, banks  # noqa: E402
from gemmlib.kernels import get  # noqa: E402

NAMES = sys.argv[2:] or ["blocktile_1d", "blocktile_2d", "vectorized", "bank_free", "warptile"]
S = int(sys.argv[1]) if len(sys.argv) > 1 else 512

A = backend.random_matrix((S, S), rng=1)
B = backend.random_matrix((S, S), rng=2)
a = backend.random_matrix((64, 64), rng=3)
for name in NAMES:  # compile first, so the profiled launches come in a known order
    gemmlib.matmul(a, a, kernel=name)
backend.synchronize()
for i, name in enumerate(NAMES):
    gemmlib.matmul(A, B, kernel=name)
    backend.synchronize()
    print(f"launch {len(NAMES) + i + 1} ({name}): model predicts {banks.predict(get(name), S, S, S)}",
          flush=True)
