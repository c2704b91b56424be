"""The models suite (issue 18): its shapes come from the published configs, its summary
computes the targets' view, and the command line lists it where no GPU is present."""

from __future__ import annotations

import math

from gemmlib import bench_models as bm
from gemmlib.cli import main


def test_projection_shapes_follow_the_published_configs():
    assert bm.projections("llama-3.1-8b") == [
        ("qkv", 32 * 128 + 2 * 8 * 128, 4096), ("o", 4096, 4096),
        ("gate_up", 2 * 14336, 4096), ("down", 4096, 14336)]
    assert bm.projections("qwen2.5-72b") == [
        ("qkv", 64 * 128 + 2 * 8 * 128, 8192), ("o", 8192, 8192),
        ("gate_up", 2 * 29568, 8192), ("down", 8192, 29568)]


def test_the_suite_covers_every_token_count_and_the_sweep_shapes():
    shapes = bm.suite_shapes()
    assert len(shapes) == 2 * 4 * len(bm.TOKENS) + len(bm.EXTRA_SHAPES)
    assert {s.tokens for s in shapes if s.model != "sweep"} == {1, 16, 128, 1024, 4096, 16384}
    assert all(s.M == s.tokens for s in shapes if s.model != "sweep")
    assert (1024, 1024, 8192) in {(s.M, s.N, s.K) for s in shapes}


def test_min_bytes_and_operand_sets():
    assert bm.min_bytes(1, 4096, 4096, 2) == 2 * (4096 + 4096 * 4096) + 4 * 4096
    l2 = 50 << 20
    assert bm.operand_sets(2 * 4096 * 4096, l2) * 2 * 4096 * 4096 >= 3 * l2   # decode: past L2
    assert bm.operand_sets(4 << 30, l2) == 1                                      # big: one set


def test_summary_gives_geometric_mean_and_worst_shape():
    rows = [dict(input="torch", precision="fp16", pct_of_cublas=p, reference="torch.matmul",
                 M=m, N=8, K=8, model="x", layer="o") for p, m in ((50.0, 1), (200.0, 2))]
    rows.append(dict(input="torch", precision="fp16", error="boom", M=3, N=8, K=8))
    lines = bm.summary({"rows": rows})
    assert f"geometric mean {math.sqrt(50 * 200):.1f}%" in lines[0]
    assert "lowest 50.0% at 1x8x8" in lines[0] and "1 rows failed" in lines[1]


def test_the_command_line_lists_the_suite_without_a_gpu(capsys):
    assert main(["bench", "--suite", "models", "--tokens", "1"]) == 0
    out = capsys.readouterr().out
    assert "12 shapes" in out and "1x59136x8192" in out
