"""What one tensor-map write costs a CUDA-graph replay.

Under a capture every TMA call records a one-thread kernel that writes its tensor maps
into device memory before the GEMM (``gemmlib.runtime.maps``).  This times, as CUDA
graphs (``band_rule_ab.graph_rounds``: device time only), a loop of ``matmul(x, W.t(),
out=C)`` calls, the same loop with one more such write per call, and ``torch.matmul``:
the difference per call is what the write adds, so what passing the maps another way
could save.

    python scripts/experiments/store_node_cost.py
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from band_rule_ab import graph_rounds  # noqa: E402

SHAPES = [(1, 4096, 4096), (16, 4096, 4096), (64, 14336, 4096), (128, 2048, 2048),
          (512, 4096, 4096), (16, 2048, 2048)]


def main():
    import numpy as np
    import torch

    import gemmlib
    from gemmlib.runtime import maps

    dt = torch.bfloat16
    slot = torch.empty(512, dtype=torch.uint8, device="cuda")
    words = np.zeros(maps.SLOT_BYTES // 8, dtype=np.uint64)
    for M, N, K in SHAPES:
        x = torch.randn(M, K, device="cuda", dtype=dt)
        W = torch.randn(N, K, device="cuda", dtype=dt)
        C = torch.empty(M, N, device="cuda", dtype=dt)

        def extra():
            gemmlib.matmul(x, W.t(), out=C)
            maps._store(slot.data_ptr(), words, torch.cuda.current_stream().cuda_stream)

        t = graph_rounds(torch, {"torch": [lambda: torch.matmul(x, W.t(), out=C)],
                                 "gemmlib": [lambda: gemmlib.matmul(x, W.t(), out=C)],
                                 "plus_write": [extra]}, rounds=9)
        us = {k: statistics.median(v) * 1e3 for k, v in t.items()}
        print(f"{M:4d}x{N:5d}x{K:5d}  torch {us['torch']:6.2f} us  gemmlib {us['gemmlib']:6.2f}"
              f"  +write {us['plus_write']:6.2f}  write adds {us['plus_write'] - us['gemmlib']:5.2f}"
              f" us/call", flush=True)


if __name__ == "__main__":
    main()
