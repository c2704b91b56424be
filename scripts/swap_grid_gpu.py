"""How wgmma_swap's stream-K speed depends on its block count (GRID) on a few layer shapes.

    python scripts/swap_grid_gpu.py OUT.json

Kernel loops as ``swap_gpu.py`` times them; GRID 0 is one block per SM.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tc_shapes_gpu import log, queued_time  # noqa: E402


def main() -> None:
    import torch

    import gemmlib
    from gemmlib.runtime import select as S

    rows = []
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    for N, K in ((4096, 4096), (6144, 4096), (16384, 3072), (3072, 8192)):
        for M in (1, 16):
            nbytes = 2 * (M * K + N * K + M * N)
            sets = max(2, min(16, -(-3 * l2 // nbytes)))
            xs = [torch.randn(M, K, device="cuda", dtype=torch.bfloat16) for _ in range(sets)]
            ws = [torch.randn(N, K, device="cuda", dtype=torch.bfloat16) for _ in range(sets)]
            cs = [torch.empty(M, N, device="cuda", dtype=torch.bfloat16) for _ in range(sets)]
            t_torch = statistics.median(queued_time(
                torch, [lambda i=i: torch.matmul(xs[i], ws[i].t(), out=cs[i])
                        for i in range(sets)], 200, 5)) * 1e3
            line = []
            for bm in (64, 128):
                tiles = -(-N // bm)
                for grid in (0, 128, 66, tiles, 2 * tiles, tiles // 2):
                    spec = S.with_layout(S.build("wgmma_swap", {
                        "precision": "bf16", "BM": bm, "BN": 8 if M == 1 else 16,
                        "B_LAYOUT": "KN", "OUT": "bf16", "GRID": grid}), "NK")
                    us = statistics.median(queued_time(
                        torch, [lambda i=i: gemmlib.matmul(xs[i], ws[i].t(), kernel=spec,
                                                           out=cs[i])
                                for i in range(sets)], 200, 5)) * 1e3
                    rows.append(dict(M=M, N=N, K=K, BM=bm, GRID=grid, us=us, torch_us=t_torch,
                                     pct=100 * t_torch / us))
                    line.append(f"{bm}/{grid}={100 * t_torch / us:.0f}")
            log(f"M={M} N={N} K={K} torch={t_torch:.1f}us", " ".join(line))
    Path(sys.argv[1]).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
