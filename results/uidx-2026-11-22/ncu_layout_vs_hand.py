"""Launch layout_nt built from layouts and by hand at 2048^3, for Nsight Compute:

    ncu --clock-control none -k regex:layout_nt --launch-skip 2 --launch-count 2 \\
        --section SpeedOfLight --section WarpStateStats --section SchedulerStats \\
        --section LaunchStats --section Occupancy --section InstructionStats \\
        --section MemoryWorkloadAnalysis python results/uidx-2026-11-22/ncu_layout_vs_hand.py

From the repository root, on a GPU machine; the output is
results/uidx-2026-11-22/ncu-layout-vs-hand-2048.txt.
"""
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
os.environ["NUMBA_ENABLE_CUDASIM"] = "0"
os.environ["CUPY_TF32"] = "0"

import cupy as cp  # noqa: E402

import gemmlib  # noqa: E402
from gemmlib.kernels import layout_nt  # noqa: E402

specs = [layout_nt.build(indexing="layout"), layout_nt.build(indexing="hand")]
a = cp.random.rand(64, 64, dtype=cp.float32)
for s in specs:                       # launches 1-2: compile
    gemmlib.matmul(a, a, kernel=s, transpose_b=True)
A = cp.random.rand(2048, 2048, dtype=cp.float32); B = cp.random.rand(2048, 2048, dtype=cp.float32)
for s in specs:                       # launches 3-4: profiled
    gemmlib.matmul(A, B, kernel=s, transpose_b=True)
cp.cuda.runtime.deviceSynchronize()
print("done")
