"""The serving suite (``python -m gemmlib bench --suite serving``) without a GPU: its shapes
come from the published configs, a row is made and checked as on the GPU (torch on the CPU,
the timer mocked), a wrong or failing column is recorded and not timed, the summary and the
figure read what the suite writes, the Triton module imports without triton, and the
command line takes the suite's options."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import matplotlib
import pytest

matplotlib.use("Agg")

from gemmlib import bench_serving as sv  # noqa: E402
from gemmlib import triton_matmul as tm  # noqa: E402
from gemmlib.cli import build_parser, main  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------
# Shapes


def test_the_models_are_five_families_and_an_moe_not_the_tuned_for_ones():
    families = {m.split("-")[0].rstrip("0123456789.") for m in sv.MODELS}
    assert {"mistral", "qwen", "gemma", "llama", "phi", "mixtral"} <= families
    assert "llama-3.1-8b" not in sv.MODELS and "qwen2.5-72b" not in sv.MODELS
    assert all(2048 <= c["hidden_size"] <= 8192 for c in sv.MODELS.values())
    assert any(c.get("expert_intermediate") for c in sv.MODELS.values())


def test_projections_follow_the_published_configs():
    # Qwen/Qwen2.5-7B: hidden 3584, intermediate 18944, 28 heads, 4 kv heads of 128
    assert sv.projections("qwen2.5-7b") == [
        ("qkv", (28 + 2 * 4) * 128, 3584), ("o", 3584, 28 * 128),
        ("gate_up", 2 * 18944, 3584), ("down", 3584, 18944)]
    # google/gemma-2-9b: head_dim 256, so the attention's width (4096) is not hidden (3584)
    assert sv.projections("gemma-2-9b")[:2] == [("qkv", (16 + 16) * 256, 3584),
                                                 ("o", 3584, 16 * 256)]
    # Qwen1.5-MoE-A2.7B: experts of 1408, a shared expert of 5632
    moe = dict((p, (N, K)) for p, N, K in sv.projections("qwen1.5-moe-a2.7b"))
    assert moe["expert_gate_up"] == (2 * 1408, 2048) and moe["expert_down"] == (2048, 1408)
    assert moe["shared_gate_up"] == (2 * 5632, 2048) and moe["shared_down"] == (2048, 5632)
    # Mixtral-8x7B's experts are FFNs of intermediate_size: Mistral-7B's MLP shapes
    mix = dict((p, (N, K)) for p, N, K in sv.projections("mixtral-8x7b"))
    assert mix["expert_gate_up"] == (28672, 4096) and mix["expert_down"] == (4096, 14336)


def test_shapes_are_deduplicated_across_models():
    shapes = sv.suite_shapes()
    pairs = [(s.N, s.K) for s in shapes]
    assert len(pairs) == len(set(pairs)) == 23
    every = [(m, p, N, K) for m in sv.MODELS for p, N, K in sv.projections(m)]
    assert {(N, K) for _, _, N, K in every} == set(pairs)
    assert sum(len(s.uses) for s in shapes) == len(every)   # each use kept once
    by = {(s.N, s.K): s for s in shapes}
    mlp = by[(28672, 4096)]
    assert mlp.uses == ("mistral-7b-v0.3 gate_up", "mixtral-8x7b expert_gate_up")
    assert mlp.model == "mistral-7b-v0.3" and mlp.proj == "gate_up"
    assert by[(3072, 8192)].models == ("llama-3.2-3b", "phi-3-mini")
    assert [(s.N, s.K) for s in sv.suite_shapes(["qwen1.5-moe-a2.7b"], ["expert_down"])] == [
        (2048, 1408)]
    with pytest.raises(ValueError, match="unknown model"):
        sv.suite_shapes(["llama-9"])


def test_plan_defaults_quick_and_options():
    p = sv.plan()
    assert p["tokens"] == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096]
    assert p["precisions"] == ["fp16", "bf16"] and p["triton"] and p["projs"] is None
    q = sv.plan(quick=True)
    assert len(sv.suite_shapes(q["models"], q["projs"])) == 5 and q["loops"] < p["loops"]
    r = sv.plan(quick=True, models=["gemma-2-9b"], tokens=[3], precisions=["bf16"],
                triton=False)
    assert len(sv.suite_shapes(r["models"], r["projs"])) == 4   # named: all projections
    assert r["tokens"] == [3] and r["precisions"] == ["bf16"] and not r["triton"]
    with pytest.raises(ValueError, match="precision"):
        sv.plan(precisions=["3xtf32"])


# --------------------------------------------------------------------------
# A row, measured on the CPU with the timer mocked


try:
    import torch
except ImportError:   # the rows need torch (on the CPU here)
    torch = None
needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")

FAKE_MS = {"torch": 0.010, "gemmlib": 0.0125, "triton": 0.020}


class FakeTimer:
    """Runs each call once (so the calls are real) and reports fixed times."""

    def __init__(self):
        self.seen = []

    def __call__(self, fw, calls, target_ms, loops):
        self.seen.append(sorted(calls))
        for cs in calls.values():
            for c in cs:
                c()
        return {n: [FAKE_MS[n] * (1 + 0.01 * i) for i in range(loops)] for n in calls}, 7


def _torch_impl():
    return sv.Impl(lambda x, W, C: lambda: torch.matmul(x, W.t(), out=C))


def _kernel(precision, M, N, K, x=None, W=None, C=None):
    return {"kernel": f"fake_{M}", "kernel_selected": f"fake_{M}"}


def _measure(impls, tokens=(1, 24), precision="fp16", shape=None, l2_bytes=1 << 14, **kw):
    timer = FakeTimer()
    shape = shape or sv.Shape("qkv", 48, 80, ("m-a qkv", "m-b qkv"))
    rows = sv.measure_shape(torch, shape, precision, tokens, impls, timer=timer,
                            device="cpu", l2_bytes=l2_bytes, gpu="CPU", copy_gbps=100.0,
                            kernel=_kernel, **kw)
    return rows, timer


ROW_KEYS = {"suite", "model", "models", "proj", "uses", "M", "N", "K", "precision", "torch_us",
            "gemmlib_us", "triton_us", "pct_torch", "pct_triton", "triton_pct_torch",
            "kernel", "gpu", "torch_ok", "gemmlib_ok", "triton_ok", "gemmlib_rel_err",
            "calls_per_loop", "operand_sets", "loops", "gemmlib_loops_us"}


@needs_torch
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_a_row_from_mocked_timing(precision):
    impls = {"torch": _torch_impl(), "gemmlib": _torch_impl(),
             "triton": sv.Impl(_torch_impl().make, info=lambda: {"triton_config": "cfg"})}
    rows, timer = _measure(impls, precision=precision)
    assert [r["M"] for r in rows] == [1, 24]
    assert timer.seen == [["gemmlib", "torch", "triton"]] * 2
    for r in rows:
        assert ROW_KEYS <= set(r) and "error" not in r
        assert r["suite"] == "serving" and r["precision"] == precision and r["gpu"] == "CPU"
        assert (r["N"], r["K"], r["proj"]) == (48, 80, "qkv")
        assert r["model"] == "m-a" and r["models"] == ["m-a", "m-b"]
        mid = 1 + 0.01 * (sv.LOOPS // 2)   # the median of the loops
        med = {n: FAKE_MS[n] * mid * 1e3 for n in FAKE_MS}
        assert r["torch_us"] == pytest.approx(med["torch"])
        assert r["pct_torch"] == pytest.approx(100 * med["torch"] / med["gemmlib"])
        assert r["pct_triton"] == pytest.approx(100 * med["triton"] / med["gemmlib"])
        assert r["triton_pct_torch"] == pytest.approx(100 * med["torch"] / med["triton"])
        assert r["torch_ok"] and r["gemmlib_ok"] and r["triton_ok"]
        assert r["gemmlib_rel_err"] < sv.tolerance(precision, 80)
        assert r["kernel"] == f"fake_{r['M']}" and r["triton_config"] == "cfg"
        assert r["calls_per_loop"] == 7 and r["operand_sets"] >= 1
    decode, prefill = rows
    nbytes = 2 * (1 * 80 + 48 * 80) + 2 * 1 * 48
    assert decode["min_bytes"] == nbytes
    assert decode["gemmlib_dram_gbps"] == pytest.approx(nbytes / (decode["gemmlib_us"] * 1e3))
    assert decode["gemmlib_dram_pct_of_copy"] == pytest.approx(
        decode["gemmlib_dram_gbps"])   # of 100 GB/s
    assert "gemmlib_dram_gbps" not in prefill and prefill["M"] > sv.DECODE_M
    json.dumps(rows)   # the file's rows are plain JSON


@needs_torch
def test_a_wrong_or_failing_column_is_recorded_and_not_timed():
    def zeros(x, W, C):
        return lambda: C.zero_()

    def boom(x, W, C):
        def call():
            raise RuntimeError("no kernel")
        return call

    impls = {"torch": _torch_impl(), "gemmlib": sv.Impl(boom), "triton": sv.Impl(zeros)}
    rows, timer = _measure(impls, tokens=(4,))
    (r,) = rows
    assert timer.seen == [["torch"]]
    assert r["triton_ok"] is False and r["triton_us"] is None and r["pct_triton"] is None
    assert "wrong result" in r["triton_error"] and r["triton_rel_err"] > 0.5
    assert r["gemmlib_us"] is None and r["gemmlib_error"] == "RuntimeError: no kernel"
    assert r["error"].startswith("gemmlib: RuntimeError") and r["pct_torch"] is None
    assert r["torch_us"] is not None


@needs_torch
def test_a_column_that_writes_nothing_fails_its_check():
    impls = {"torch": _torch_impl(), "gemmlib": sv.Impl(lambda x, W, C: lambda: None)}
    (r,), _ = _measure(impls, tokens=(2,), missing={"triton": "not requested"})
    assert r["gemmlib_ok"] is False and r["gemmlib_rel_err"] is None
    assert "NaN or Inf in C" in r["gemmlib_error"]
    assert r["triton_error"] == "not requested" and r["triton_ok"] is None
    assert "error" in r


@needs_torch
def test_the_row_with_gemmlib_itself_in_the_simulator():
    """gemmlib.matmul(x, W.t(), out=C) on CPU torch tensors (the simulator's kernels): it
    passes the check and writes C in the inputs' dtype."""
    from gemmlib.api import matmul

    seen = {}

    def ours(x, W, C):
        def call():
            seen["out"] = matmul(x, W.t(), out=C)
        return call

    impls = {"torch": _torch_impl(), "gemmlib": sv.Impl(ours)}
    shape = sv.Shape("o", 24, 40, ("m o",))
    (r,), _ = _measure(impls, tokens=(1,), shape=shape, l2_bytes=1, missing={"triton": "-"})
    assert r["gemmlib_ok"] and "error" not in r, r.get("error")
    assert seen["out"].dtype == torch.float16 and tuple(seen["out"].shape) == (1, 24)


def test_kernel_of_names_autos_choice():
    k = sv.kernel_of("fp16", 1, 4096, 4096)
    assert k["kernel"] == k["kernel_selected"] and k["kernel"] and "?" not in k["kernel"]


def test_make_row_without_gemmlib_or_torch_is_an_error():
    s = sv.Shape("o", 8, 8, ("m o",))
    r = sv.make_row(s, "fp16", 1, us={"torch": 5.0})
    assert r["error"] == "gemmlib: not measured" and r["pct_torch"] is None
    r = sv.make_row(s, "bf16", 64, us={"torch": 5.0, "gemmlib": 4.0})
    assert "error" not in r and r["pct_torch"] == pytest.approx(125.0)
    assert r["triton_us"] is None and "min_bytes" not in r


# --------------------------------------------------------------------------
# Summary, file, figure


def _rows():
    shapes = [sv.Shape("qkv", 64, 32, ("a qkv",)), sv.Shape("down", 32, 96, ("a down",))]
    rows = []
    for prec in ("fp16", "bf16"):
        for M, pcts in ((1, (50.0, 200.0)), (16, (70.0, 90.0))):
            for s, p in zip(shapes, pcts):
                rows.append(sv.make_row(s, prec, M, us={"torch": p, "gemmlib": 100.0,
                                                        "triton": 150.0}, gpu="G"))
    rows.append(sv.make_row(shapes[0], "fp16", 4096, us={"torch": 90.0, "gemmlib": 100.0},
                            errors={"triton": "triton is not importable"}))
    rows.append(sv.make_row(shapes[1], "fp16", 4096, us={"torch": 90.0},
                            errors={"gemmlib": "RuntimeError: x"}))
    return rows


def test_summary_per_precision_and_m():
    data = {"meta": {"gpu": "G"}, "rows": _rows()}
    s = {(x["precision"], x["M"]): x for x in sv.summary_rows(data)}
    assert list(s) == [("fp16", 1), ("fp16", 16), ("fp16", 4096), ("bf16", 1), ("bf16", 16)]
    one = s[("fp16", 1)]
    assert one["gm_pct_torch"] == pytest.approx(100.0) and one["min_pct_torch"] == 50.0
    assert one["min_at"] == "qkv 64x32" and one["under"] == 1 and one["shapes"] == 2
    assert one["gm_pct_triton"] == pytest.approx(150.0)
    assert one["gm_triton_pct_torch"] == pytest.approx(math.sqrt(50 * 200) / 1.5)
    assert s[("fp16", 16)]["under"] == 1 and s[("fp16", 16)]["max_pct_torch"] == 90.0
    last = s[("fp16", 4096)]
    assert last["shapes"] == 1 and last["failed"] == 1 and last["gm_pct_triton"] is None
    text = "\n".join(sv.summary_lines(data))
    assert "1 rows failed" in text and "1 rows without a Triton time" in text
    assert "qkv 64x32" in text


@needs_torch
def test_the_run_with_its_gpu_steps_mocked(monkeypatch, capsys):
    """run_suite's plumbing: every shape x precision x M of the plan, a save after each
    shape and precision, the columns and the Triton launch named in meta."""
    monkeypatch.setattr(sv, "header", lambda torch, p: dict(gpu="G", l2_bytes=None, plan=p))
    monkeypatch.setattr(sv, "copy_bandwidth", lambda torch: 1000.0)
    monkeypatch.setattr(sv, "warm_gpu", lambda torch: None)
    monkeypatch.setattr(tm, "available", lambda: None)
    seen = []

    def measure(torch, shape, prec, tokens, impls, *, on_row, missing, **kw):
        seen.append((shape.N, shape.K, prec, sorted(impls), kw["l2_bytes"], kw["loops"]))
        for M in tokens:
            on_row(sv.make_row(shape, prec, M, us={"torch": 10.0, "gemmlib": 12.5},
                               errors=dict(missing), copy_gbps=kw["copy_gbps"]))

    monkeypatch.setattr(sv, "measure_shape", measure)
    saved = []
    data = sv.run_suite(sv.plan(quick=True), progress=False,
                        on_block=lambda d: saved.append(len(d["rows"])))
    assert len(seen) == 5 * 2 and saved == [4 * (i + 1) for i in range(10)]
    assert seen[0] == (5120, 3072, "fp16", ["gemmlib", "torch", "triton"], 50 << 20,
                       sv.QUICK["loops"])
    meta = data["meta"]
    assert meta["columns"] == ["torch", "gemmlib", "triton"] and meta["shapes"] == 5
    assert "autotunes" in meta["triton_launch"] and meta["dram_copy_gbps"] == 1000.0
    assert all(r["pct_torch"] == pytest.approx(80.0) for r in data["rows"])
    assert capsys.readouterr().out == ""   # progress=False: quiet


def test_save_names_the_file_as_the_other_suites_do(tmp_path):
    data = {"meta": {"gpu_slug": "nvidia-h100-80gb-hbm3", "date": "2026-11-28T10:00:00+00:00"},
            "rows": _rows()}
    path = sv.save(data, tmp_path)
    assert Path(path).name == "serving-nvidia-h100-80gb-hbm3-2026-11-28.json"
    assert json.loads(Path(path).read_text())["rows"][0]["suite"] == "serving"


def test_the_figure_and_table_from_a_file(tmp_path):
    import matplotlib.pyplot as plt

    from gemmcourse import viz_serving as vs

    data = {"meta": {"gpu": "NVIDIA H100 80GB HBM3", "gpu_slug": "nvidia-h100-80gb-hbm3",
                     "date": "2026-11-28T10:00:00+00:00"}, "rows": _rows()}
    path = tmp_path / "serving-nvidia-h100-80gb-hbm3-2026-11-28.json"
    path.write_text(json.dumps(data))
    (name, loaded), = vs.serving_files(tmp_path)
    assert name == path.name and loaded["rows"] == json.loads(json.dumps(data["rows"]))
    assert vs.summary(path) == sv.summary_rows(data)
    table = vs.summary_table(path)
    assert len(table.rows) == 5 and table.rows[0][:4] == ["fp16", 1, 2, "100.0%"]
    fig = vs.plot_serving(path)
    ax = fig.axes[0]
    labels = [ln.get_label() for ln in ax.get_lines() if not ln.get_label().startswith("_")]
    assert labels == ["gemmlib.matmul, fp16 (geometric mean)",
                      "gemmlib.matmul, bf16 (geometric mean)",
                      "Triton GEMM, fp16 (geometric mean)", "Triton GEMM, bf16 (geometric mean)",
                      "torch.matmul (100%)"]
    colours = {ln.get_label().split(",")[0]: matplotlib.colors.to_hex(ln.get_color())
               for ln in ax.get_lines() if "mean" in ln.get_label()}
    assert colours["gemmlib.matmul"] != colours["Triton GEMM"]
    fig.canvas.draw()
    legend, box = ax.get_legend().get_window_extent(), ax.get_window_extent()
    assert legend.y1 <= box.y0, "the legend sits over the data"
    assert "1 model, on" in ax.get_title() and "1 row failed" in " ".join(ax.get_title().split())
    plt.close(fig)


# --------------------------------------------------------------------------
# The Triton module and the command line


@needs_torch
def test_the_triton_module_imports_and_lists_its_configs_without_triton():
    code = ("import sys; sys.modules['triton'] = None\n"
            "import gemmlib.triton_matmul as tm, gemmlib.bench_serving as sv, torch\n"
            "assert 'triton.language' not in sys.modules\n"
            "why = tm.available(); assert why and 'not importable' in why, why\n"
            "impls, missing = sv.implementations(torch)\n"
            "assert sorted(impls) == ['gemmlib', 'torch'] and 'triton' in missing\n"
            "print('ok')\n")
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1", PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         cwd=ROOT, timeout=300)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr[-2000:]


def test_the_triton_configs():
    assert 8 <= len(tm.CONFIGS) <= 14
    assert {16, 32} <= {c["BLOCK_M"] for c in tm.CONFIGS}
    assert any(c["BLOCK_M"] >= 128 and c["BLOCK_N"] >= 128 for c in tm.CONFIGS)
    for M in (1, 2, 16, 24, 64, 100, 128, 512, 4096):
        keep = tm.candidates(M)
        assert keep and all(c["BLOCK_M"] in tm.block_m_choices(M) for c in keep)
        assert len(keep) <= 6
    assert {c["BLOCK_M"] for c in tm.candidates(1)} == {16}
    assert tm.describe(tm.CONFIGS[0]) == "16x64x128 g1 w4 s4" and tm.describe(None) == "-"


INTERPRET = """
import torch, itertools
from gemmlib import triton_matmul as tm
ticks = itertools.count()
tm.time_candidate = lambda fn, quantiles: (fn(), [1.0 + next(ticks)] * len(quantiles))[1]
for M, N, K in ((1, 45, 70), (37, 130, 256), (17, 300, 64)):
    x = (torch.rand(M, K) * 2 - 1).half()
    w = (torch.rand(N, K) * 2 - 1).half()
    ref = x.float() @ w.float().t()
    for c in list(tm.CONFIGS) + [None, None]:   # autotuned, then the winner launched
        out = torch.full((M, N), float("nan"), dtype=torch.float16)
        y = tm.linear(x, w, out=out, config=c)
        err = float((y.float() - ref).norm() / ref.norm())
        assert y is out and err < 2e-3, (M, N, K, tm.describe(c), err)
    assert tm.last_config() == tm.CHOSEN[(M, N, K, torch.float16)]
    assert tm.last_config()["BLOCK_M"] in tm.block_m_choices(M)
print("ok")
"""


@needs_torch
def test_the_triton_kernel_in_triton_s_interpreter():
    """Every config and the autotuned kernel against float32 on odd shapes (K not a multiple
    of BLOCK_K, M and N past the tile), fp16, in Triton's CPU interpreter (where triton is
    installed; its interpreter's dot is wrong for bf16, so bf16 runs on the GPU only)."""
    import importlib.util

    import numpy

    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed")
    if tuple(int(v) for v in numpy.__version__.split(".")[:2]) >= (2, 4):
        # Triton 3.6's interpreter calls int() on one-element arrays, which NumPy 2.4 refuses
        pytest.skip("Triton's interpreter needs NumPy < 2.4")
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1", TRITON_INTERPRET="1",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-c", INTERPRET], capture_output=True, text=True,
                         env=env, cwd=ROOT, timeout=600)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr[-3000:]


def test_the_command_line_takes_the_suites_options():
    args = build_parser().parse_args(
        ["bench", "--suite", "serving", "--models", "qwen2.5-7b", "gemma-2-9b", "--tokens",
         "1", "16", "--precisions", "bf16", "--no-triton", "--quick", "--out", "results"])
    assert args.suite == "serving" and args.models == ["qwen2.5-7b", "gemma-2-9b"]
    assert args.tokens == [1, 16] and args.precisions == ["bf16"] and args.no_triton
    assert args.quick and args.out == "results"
    assert not build_parser().parse_args(["bench", "--suite", "serving"]).no_triton


def test_the_command_line_lists_the_suite_without_a_gpu(capsys):
    assert main(["bench", "--suite", "serving"]) == 0
    out = capsys.readouterr().out
    assert "23 shapes x 12 token counts" in out and "552 rows" in out
    assert "2048 x 1408   qwen1.5-moe-a2.7b expert_down" in out
    assert main(["bench", "--suite", "serving", "--tokens", "1", "--models", "phi-3-mini",
                 "--no-triton"]) == 0
    out = capsys.readouterr().out
    assert "4 shapes x 1 token counts" in out and "triton" not in out.split("\n")[0]
    assert main(["bench", "--suite", "serving", "--precisions", "fp8"]) == 2
