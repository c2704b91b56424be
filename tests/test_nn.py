"""gemmlib.nn (CPU tensors, the simulator's kernels): Linear is nn.Linear's twin (state dict,
values against float64), patch/unpatch swap a model's layers keeping its Parameters, a
training step's gradients match torch's, and `import gemmlib` still does not import torch.
Also the e2e suite's arithmetic and options, which need neither a GPU nor transformers.

Every forward here is a gemmlib product in the simulator (seconds each): the shapes are
small and the products few."""

import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import gemmlib  # noqa: E402
from gemmlib import bench_e2e  # noqa: E402
from gemmlib.nn import Linear  # noqa: E402


def _close(got, want, dtype):
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    err = (got.double() - want).abs().max().item()
    assert err <= tol * (1 + want.abs().max().item()), err


# --------------------------------------------------------------------------
# Linear


@pytest.mark.parametrize("bias", [True, False])
def test_same_parameters_and_state_dict_as_nn_linear(bias):
    torch.manual_seed(3)
    ref = nn.Linear(7, 5, bias=bias, dtype=torch.float16, device="cpu")
    torch.manual_seed(3)
    ours = Linear(7, 5, bias=bias, dtype=torch.float16, device="cpu")
    assert isinstance(ours, nn.Linear) and ours.weight.shape == (5, 7)
    assert ours.extra_repr() == ref.extra_repr()
    a, b = ref.state_dict(), ours.state_dict()
    assert list(a) == list(b) == (["weight", "bias"] if bias else ["weight"])
    assert all(torch.equal(a[k], b[k]) and a[k].dtype == b[k].dtype for k in a)


def test_load_state_dict_round_trip():
    ref, ours, back = nn.Linear(6, 4), Linear(6, 4), nn.Linear(6, 4)
    ours.load_state_dict(ref.state_dict())
    back.load_state_dict(ours.state_dict())
    for k, v in ref.state_dict().items():
        assert torch.equal(back.state_dict()[k], v)


@pytest.mark.parametrize("dtype,bias,shape", [
    (torch.float32, True, (2, 3, 9)),       # 3-D input, bias
    (torch.float16, False, (5, 9)),
    (torch.bfloat16, True, (2, 2, 9)),
], ids=["fp32-bias-3d", "fp16-2d", "bf16-bias-3d"])
def test_forward_against_float64(dtype, bias, shape):
    g = torch.Generator().manual_seed(7)
    layer = Linear(9, 6, bias=bias, dtype=dtype)
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    x = torch.randn(shape, generator=g).to(dtype)
    y = layer(x)
    assert y.shape == (*shape[:-1], 6) and y.dtype == dtype
    b = None if layer.bias is None else layer.bias.double()
    _close(y, nn.functional.linear(x.double(), layer.weight.double(), b), dtype)


def test_autocast_casts_like_f_linear():
    layer = Linear(8, 3)
    x = torch.randn(4, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = layer(x)
        want = nn.functional.linear(x, layer.weight, layer.bias)
    assert y.dtype == want.dtype == torch.bfloat16
    _close(y, want.double(), torch.bfloat16)


# --------------------------------------------------------------------------
# patch / unpatch


class Tied(nn.Module):
    """An embedding whose weight the output head shares, an MLP, a layer reachable under
    two names, and an nn.Linear subclass that must be left alone."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(11, 6)
        self.mlp = nn.Sequential(nn.Linear(6, 10), nn.Tanh(), nn.Linear(10, 6, bias=False))
        self.head = nn.Linear(6, 11, bias=False)
        self.head.weight = self.embed.weight
        self.first = self.mlp[0]
        self.other = nn.modules.linear.NonDynamicallyQuantizableLinear(6, 6)

    def forward(self, ids):
        return self.head(self.mlp(self.embed(ids)))


def test_patch_keeps_the_parameters_and_unpatch_restores_the_layers():
    model = Tied()
    params = dict(model.named_parameters(remove_duplicate=False))
    keys = list(model.state_dict())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    hook = model.head.register_forward_hook(lambda *a: None)

    assert gemmlib.patch(model) is model
    assert sorted(gemmlib.nn.patched(model)) == ["first", "head", "mlp.0", "mlp.2"]
    assert type(model.mlp[0]) is Linear and type(model.head) is Linear
    assert model.first is model.mlp[0]                      # still one module
    assert model.head.weight is model.embed.weight          # still tied
    assert type(model.other) is nn.modules.linear.NonDynamicallyQuantizableLinear
    now = dict(model.named_parameters(remove_duplicate=False))
    assert list(now) == list(params) and all(now[k] is params[k] for k in params)
    assert list(model.state_dict()) == keys
    assert opt.param_groups[0]["params"] == list(model.parameters())
    assert len(model.head._forward_hooks) == 1
    hook.remove()                                           # a handle taken before the swap
    assert not model.head._forward_hooks

    before = [id(m) for m in model.modules()]
    gemmlib.patch(model)                                    # again: nothing changes
    assert [id(m) for m in model.modules()] == before
    assert len(gemmlib.nn.patched(model)) == 4

    assert gemmlib.unpatch(model) is model
    assert not gemmlib.nn.patched(model)
    for name in ("mlp.0", "mlp.2", "head", "first"):
        assert type(model.get_submodule(name)) is nn.Linear
    assert model.first is model.mlp[0] and model.head.weight is model.embed.weight
    now = dict(model.named_parameters(remove_duplicate=False))
    assert all(now[k] is params[k] for k in params)


def test_include_and_exclude():
    model = Tied()
    gemmlib.patch(model, exclude="head")
    assert type(model.head) is nn.Linear and type(model.mlp[2]) is Linear
    gemmlib.unpatch(model)
    gemmlib.patch(model, include=["mlp.*"], exclude=lambda name, m: m.bias is None)
    assert [type(m) for m in (model.mlp[0], model.mlp[2], model.head)] == [Linear, nn.Linear,
                                                                          nn.Linear]
    assert model.first is model.mlp[0]          # swapped under both names (one selected)
    root = gemmlib.patch(nn.Linear(3, 2))       # a bare layer: use what patch returns
    assert type(root) is Linear and type(gemmlib.unpatch(root)) is nn.Linear


def test_a_training_step_matches_torch_in_float64():
    g = torch.Generator().manual_seed(5)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))
    twin = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3)).double()
    twin.load_state_dict(model.state_dict())
    opt = torch.optim.SGD(model.parameters(), lr=0.5)      # made before the swap
    gemmlib.patch(model)
    x, w = torch.randn(4, 6, generator=g), torch.randn(3, generator=g)
    for m, xx in ((model, x), (twin, x.double())):
        (m(xx) * w.to(xx.dtype)).sum().backward()
    for (name, p), q in zip(model.named_parameters(), twin.parameters()):
        assert p.grad is not None, name
        _close(p.grad, q.grad, torch.float32)
    opt.step()
    with torch.no_grad():
        for p, q in zip(model.parameters(), twin.parameters()):
            _close(p, q - 0.5 * q.grad, torch.float32)


def test_import_gemmlib_does_not_import_torch():
    code = ("import sys, gemmlib, gemmlib.bench_e2e; "
            "assert not {'torch', 'transformers'} & set(sys.modules), 'torch imported'; "
            "gemmlib.patch; assert 'torch' in sys.modules; "
            "assert gemmlib.patch is gemmlib.nn.patch and gemmlib.unpatch is gemmlib.nn.unpatch")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env={**__import__("os").environ, "NUMBA_ENABLE_CUDASIM": "1"})
    assert r.returncode == 0, r.stderr
    with pytest.raises(AttributeError):
        gemmlib.no_such_thing


# --------------------------------------------------------------------------
# The e2e suite, without a GPU


def test_e2e_rows_from_timings():
    row = bench_e2e.make_row("decode", 16, 32, "graphs", torch_ms=4.0, gemmlib_ms=5.0,
                             logits_rel_diff=3e-3, gpu="Test GPU")
    assert row["suite"] == "e2e" and row["gpu"] == "Test GPU" and "error" not in row
    assert row["torch_tok_s"] == pytest.approx(16 * 32 / 4e-3)
    assert row["gemmlib_tok_s"] == pytest.approx(16 * 32 / 5e-3)
    assert row["pct"] == pytest.approx(80.0) and "graph" in row["how"]
    for key in ("phase", "batch", "tokens", "mode", "torch_tok_s", "gemmlib_tok_s", "pct",
                "logits_rel_diff", "gpu"):
        assert key in row
    failed = bench_e2e.make_row("prefill", 1, 512, "graphs", torch_ms=10.0, gpu="G",
                                gemmlib_error="RuntimeError: capture invalidated")
    assert failed["pct"] is None and "capture invalidated" in failed["error"]
    assert "ERROR" in bench_e2e.line(failed) and "%" in bench_e2e.line(row)


def test_e2e_pct_is_the_median_of_paired_rounds():
    row = bench_e2e.make_row("decode", 1, 32, "eager", torch_ms=4.0, gemmlib_ms=5.0,
                             round_ratios=[0.5, 0.9, 1.0], gpu="G")
    assert row["pct"] == pytest.approx(90.0) and row["pct_of_medians"] == pytest.approx(80.0)
    assert row["round_ratios"] == [0.5, 0.9, 1.0]


def test_e2e_sides_alternate_round_by_round(monkeypatch):
    """Each round times both sides, the model in that side's state, the order swapped
    every round; a side that fails is recorded and left out of the ratios."""
    log, state = [], {}
    monkeypatch.setattr(bench_e2e, "_set_state", lambda model, side: state.update(side=side))
    clock = {"t": 0.0}

    class Event:
        def record(self):
            self.t = clock["t"]

        def synchronize(self):
            pass

        def elapsed_time(self, end):
            return end.t - self.t

    class Cuda:
        Event = staticmethod(lambda enable_timing=True: Event())
        synchronize = staticmethod(lambda: None)

    fake_torch = type("T", (), {"cuda": Cuda})

    def side(name, ms):
        def run(_):
            assert state["side"] == name
            log.append(name)
            clock["t"] += ms
        return bench_e2e.Prepared(run, out=None)

    prepared = {"torch": side("torch", 4.0), "gemmlib": side("gemmlib", 5.0)}
    runs, errors, ratios = bench_e2e.alternated(fake_torch, None, prepared, 4)
    assert log == ["torch", "gemmlib", "gemmlib", "torch"] * 2 and not errors
    assert runs == {"torch": [4.0] * 4, "gemmlib": [5.0] * 4}
    assert ratios == [pytest.approx(0.8)] * 4 and state["side"] == "torch"

    def broken(_):
        raise RuntimeError("capture invalidated")

    prepared["gemmlib"] = bench_e2e.Prepared(broken, out=None)
    runs, errors, ratios = bench_e2e.alternated(fake_torch, None, prepared, 3)
    assert "capture invalidated" in errors["gemmlib"] and ratios == []
    assert runs == {"torch": [4.0] * 3}


def test_e2e_plan_and_options(capsys):
    p = bench_e2e.plan()
    assert p.layers == 4 and p.dtype == "bf16" and p.batches == (1, 16, 64)
    cases = p.cases()
    assert ("prefill", 1, 2048, "graphs") in cases and ("decode", 64, 32, "eager") in cases
    assert [c for c in cases if c[0] == "train"] == [("train", 2, 256, "eager")]
    q = bench_e2e.plan(quick=True, phases=["decode"], batches=[4], layers=2)
    assert q.layers == 2 and q.cases() == [("decode", 4, 8, "eager"), ("decode", 4, 8, "graphs")]
    with pytest.raises(ValueError):
        bench_e2e.plan(phases=["serve"])

    from gemmlib.cli import build_parser, main

    args = build_parser().parse_args(["bench", "--suite", "e2e", "--phases", "prefill",
                                      "--tokens", "128", "--layers", "1", "--quick"])
    assert (args.suite, args.phases, args.tokens, args.layers, args.quick) == (
        "e2e", ["prefill"], [128], 1, True)
    assert main(["bench", "--suite", "e2e", "--batches", "2", "--phases", "decode"]) == 0
    out = capsys.readouterr().out
    assert "batch 2" in out and "nothing measured here" in out


def test_e2e_runs_phase_by_phase_fill_one_file(tmp_path):
    def run(phases, date, layers=4, ms=4.0):
        p = bench_e2e.plan(phases=phases, layers=layers)
        rows = [bench_e2e.make_row(*case, torch_ms=ms, gemmlib_ms=ms, gpu="G")
                for case in p.cases()]
        meta = {"gpu": "G", "gpu_slug": "g", "date": date, "plan": __import__(
            "dataclasses").asdict(p)}
        return {"meta": meta, "rows": rows}

    import json

    path = bench_e2e.save(run(["decode"], "2026-01-01T01:00:00"), tmp_path)
    bench_e2e.save(run(["prefill", "train"], "2026-01-01T02:00:00"), tmp_path)
    rows = json.loads(open(path).read())["rows"]
    assert [r["phase"] for r in rows] == ["prefill"] * 4 + ["decode"] * 6 + ["train"]
    assert {r.get("carried_from") for r in rows if r["phase"] == "decode"} == {
        "2026-01-01T01:00:00"}
    assert not any("carried_from" in r for r in rows if r["phase"] != "decode")
    again = run(["decode"], "2026-01-01T03:00:00", ms=2.0)     # a rerun replaces its rows
    bench_e2e.save(again, tmp_path)
    rows = json.loads(open(path).read())["rows"]
    assert len(rows) == 11 and all(r["torch_ms"] == 2.0 for r in rows if r["phase"] == "decode")
    bench_e2e.save(run(["train"], "2026-01-01T04:00:00", layers=1), tmp_path)  # another model
    assert [r["phase"] for r in json.loads(open(path).read())["rows"]] == ["train"]
