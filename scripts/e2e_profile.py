"""Where the end-to-end model's time goes, patched against unpatched: torch.profiler over
one training step and eager decode steps of the e2e suite's model (bench_e2e.build_model),
the GPU kernels by total time and the host ops by self time.  Explains the e2e rows; the
rows themselves come from ``python -m gemmlib bench --suite e2e``.

    python scripts/e2e_profile.py OUT_DIR [--layers 2] [--phases train decode1 decode16] [--host 16]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

import gemmlib
from gemmlib import bench_e2e


def _table(prof, key: str, rows: int) -> str:
    return prof.key_averages().table(sort_by=key, row_limit=rows, max_name_column_width=70)


def _kernel_totals(prof) -> dict:
    """{kernel name: (calls, total device us)} of the profile's GPU kernels and copies."""
    out = {}
    for e in prof.key_averages():
        us = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if us and e.key and not e.key.startswith(("ProfilerStep", "aten::", "cuda")):
            out[e.key] = (e.count, us)
    return out


def profile_phase(model, phase: str, side: str, out_dir: str, steps: int = 3) -> dict:
    vocab = model.config.vocab_size
    g = torch.Generator(device="cuda").manual_seed(0)
    if phase == "train":
        ids = torch.randint(0, vocab, (2, 256), device="cuda", generator=g)
        model.train()

        def run():
            model.zero_grad(set_to_none=True)
            model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
    else:
        batch = int(phase[len("decode"):])
        prompt = torch.randint(0, vocab, (batch, 32), device="cuda", generator=g)
        model.eval()

        def run():
            # as the e2e suite's eager rows: the prompt's prefill into a new cache, then
            # greedy steps (the same cache lengths every run: attention's plans are warm)
            with torch.inference_mode():
                bench_e2e.eager_decode(model, prompt, prompt[:, -1:], 8)
    for _ in range(3):
        run()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(steps):
        run()
    e1.record()
    e1.synchronize()
    step_ms = e0.elapsed_time(e1) / steps
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(steps):
            run()
        torch.cuda.synchronize()
    model.eval()
    name = f"{phase}-{side}"
    with open(os.path.join(out_dir, f"{name}.txt"), "w") as f:
        f.write(f"{name}: {step_ms:.3f} ms a step (events, {steps} steps, before profiling)\n\n")
        f.write("GPU time\n" + _table(prof, "device_time_total", 40) + "\n\n")
        f.write("host self time\n" + _table(prof, "self_cpu_time_total", 40) + "\n")
    kt = _kernel_totals(prof)
    gpu_us = sum(us for _, us in kt.values()) / steps
    print(f"{name}: {step_ms:.3f} ms/step; profiled GPU kernels {gpu_us / 1e3:.3f} ms/step",
          flush=True)
    top = sorted(kt.items(), key=lambda kv: -kv[1][1])[:12]
    for k, (n, us) in top:
        print(f"   {us / steps:9.1f} us  {n // steps:4d}x  {k[:90]}")
    return dict(phase=phase, side=side, step_ms=step_ms, kernel_ms=gpu_us / 1e3,
                top=[(k, n // steps, us / steps) for k, (n, us) in top])


def host_profile(model, batch: int, out_dir: str, steps: int = 20) -> None:
    """cProfile of ``steps`` eager decode steps of the patched model at ``batch``: where
    the host time of a step goes (host-bound: the GPU waits on the calls)."""
    import cProfile
    import io
    import pstats

    vocab = model.config.vocab_size
    prompt = torch.randint(0, vocab, (batch, 32), device="cuda")
    model.eval()
    with torch.inference_mode():
        cache = model(input_ids=prompt, use_cache=True).past_key_values
        tok = prompt[:, -1:]
        for _ in range(3):
            model(input_ids=tok, past_key_values=cache, use_cache=True)
        torch.cuda.synchronize()
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(steps):
            model(input_ids=tok, past_key_values=cache, use_cache=True)
        torch.cuda.synchronize()
        pr.disable()
    buf = io.StringIO()
    st = pstats.Stats(pr, stream=buf)
    st.sort_stats("tottime").print_stats(35)
    st.sort_stats("cumulative").print_stats(45)
    text = buf.getvalue()
    with open(os.path.join(out_dir, f"host-decode{batch}.txt"), "w") as f:
        f.write(text)
    print(text[:6000])


def check_prefill(model, tokens: int) -> None:
    """Logits of a ``tokens`` prefill, patched against unpatched, and every patched linear
    layer's output against float64 on the same input: the relative errors printed."""
    import torch.nn.functional as F

    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (1, tokens), device="cuda")
    errs = {}

    def hook(name):
        def f(mod, args, out):
            x = args[0]
            ref = F.linear(x.double(), mod.weight.double(),
                           None if mod.bias is None else mod.bias.double())
            errs[name] = (float((out.double() - ref).norm() / ref.norm()),
                          bool(torch.isfinite(out).all()), tuple(x.shape), out.dtype)
        return f

    with torch.inference_mode():
        gemmlib.unpatch(model)
        want = model(input_ids=ids, use_cache=False).logits.float()
        gemmlib.patch(model)
        hooks = [m.register_forward_hook(hook(n)) for n, m in model.named_modules()
                 if isinstance(m, torch.nn.Linear)]
        got = model(input_ids=ids, use_cache=False).logits.float()
        for h in hooks:
            h.remove()
        gemmlib.unpatch(model)
        again = model(input_ids=ids, use_cache=False).logits.float()
    d = float((got - want).norm() / want.norm())
    print(f"prefill {tokens}: logits rel diff {d:.3e}; torch twice {float((again - want).norm() / want.norm()):.1e}; "
          f"finite {bool(torch.isfinite(got).all())}/{bool(torch.isfinite(want).all())}; "
          f"norms {float(got.norm()):.4e} {float(want.norm()):.4e}; equal {bool(torch.equal(got, want))}")
    for n, e in errs.items():
        print(f"   {n:<32} rel {e[0]:.2e} finite {e[1]} in {e[2]} {e[3]}")


def host_fresh(calls: int = 600) -> None:
    """Host microseconds per call of ``F.linear`` and ``gemmlib.linear`` at decode sizes
    (1 and 16 tokens, 4096 x 4096 bf16), on one activation buffer and rotating over 64 (as
    a model's layers hand out new ones): the time to issue the calls, GPU not waited on."""
    import time

    import torch.nn.functional as F

    W = torch.randn(4096, 4096, device="cuda").bfloat16()
    for M in (1, 16):
        xs = [torch.randn(M, 4096, device="cuda").bfloat16() for _ in range(64)]
        for name, f in (("F.linear", F.linear), ("gemmlib.linear", gemmlib.linear)):
            for rot in (1, 64):
                for i in range(64):
                    f(xs[i % rot], W)
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                for i in range(calls):
                    f(xs[i % rot], W)
                us = (time.perf_counter() - t0) / calls * 1e6
                torch.cuda.synchronize()
                print(f"host M={M:<3} {name:<15} {rot:>2} buffers: {us:6.1f} us/call", flush=True)


def decode_rounds(model, batches, rounds: int, steps: int, before=None, after=None) -> None:
    """Eager decoding of ``steps`` tokens, torch then gemmlib (the model unpatched, then
    patched), ``rounds`` times per batch of ``batches``: ``before(batch, r, side)`` just
    before a run's first step, ``after(batch, r, side, issued_ms, done_ms)`` after it (the
    steps issued, then the GPU drained)."""
    import time

    vocab = model.config.vocab_size
    for batch in batches:
        prompt = torch.randint(0, vocab, (batch, 16), device="cuda")
        with torch.inference_mode():
            for r in range(rounds):
                for side in ("torch", "gemmlib"):
                    (gemmlib.patch if side == "gemmlib" else gemmlib.unpatch)(model)
                    cache = model(input_ids=prompt, use_cache=True).past_key_values
                    torch.cuda.synchronize()
                    if before:
                        before(batch, r, side)
                    t0 = time.perf_counter()
                    bench_e2e.eager_decode(model, prompt, prompt[:, -1:], steps, cache=cache)
                    t1 = time.perf_counter()
                    torch.cuda.synchronize()
                    t2 = time.perf_counter()
                    if after:
                        after(batch, r, side, (t1 - t0) * 1e3, (t2 - t0) * 1e3)
    gemmlib.unpatch(model)


def gc_probe(model, batches=(1, 16), rounds: int = 6, steps: int = 32) -> None:
    """Python's garbage collector during eager decoding, patched and unpatched, round by
    round: each round's milliseconds, the collections per generation and the time spent in
    them (gc.callbacks), and the container objects one linear call leaves to the collector
    (gc.get_count()'s generation-0 count over 1000 calls)."""
    import gc
    import time

    import torch.nn.functional as F

    clock = {"t0": 0.0, "ms": 0.0, "n": [0, 0, 0]}

    def cb(phase, info):
        if phase == "start":
            clock["t0"] = time.perf_counter()
        else:
            clock["ms"] += (time.perf_counter() - clock["t0"]) * 1e3
            clock["n"][info["generation"]] += 1

    gc.callbacks.append(cb)
    print(f"gc thresholds {gc.get_threshold()}, tracked objects {len(gc.get_objects())}")

    def report(batch, r, side, issued_ms, done_ms):
        print(f"gc decode b={batch} round {r} {side:<8} {done_ms:8.1f} ms; "
              f"collections {clock['n']} taking {clock['ms']:.1f} ms", flush=True)

    decode_rounds(model, batches, rounds, steps,
                  before=lambda *_: clock.update(ms=0.0, n=[0, 0, 0]), after=report)
    x = torch.randn(16, 4096, device="cuda").bfloat16()
    W = torch.randn(4096, 4096, device="cuda").bfloat16()
    for name, f in (("F.linear", F.linear), ("gemmlib.linear", gemmlib.linear)):
        with torch.inference_mode():
            for _ in range(10):
                f(x, W)
            gc.disable()
            c0 = gc.get_count()[0]
            for _ in range(1000):
                f(x, W)
            c1 = gc.get_count()[0]
            gc.enable()
        torch.cuda.synchronize()
        print(f"gc {name:<15} generation-0 count +{(c1 - c0) / 1000:.2f} per call")
    gc.callbacks.remove(cb)


def linear_host(model, batches=(1, 16), rounds: int = 4, steps: int = 32) -> None:
    """Host microseconds inside every linear layer's forward during eager decoding, both
    sides round by round (the call issued, the GPU not waited on), with what gemmlib's
    calls did on the way: maps written (one-thread store kernels), device syncs, encodes."""
    import time

    from gemmlib.runtime import maps, memory

    count = {"store": 0, "sync": 0, "encode": 0}
    # the internals counted are looked up by name: instrumentation, not use
    store, sync, encode = getattr(maps, "_store"), memory.synchronize, maps.tma.encode_2d

    def counted(name, f):
        def g(*a, **k):
            count[name] += 1
            return f(*a, **k)
        return g

    setattr(maps, "_store", counted("store", store))
    memory.synchronize = counted("sync", sync)
    maps.tma.encode_2d = counted("encode", encode)
    spent = {"us": 0.0, "n": 0}
    lin_fwd, gl_fwd = torch.nn.Linear.forward, gemmlib.nn.Linear.forward

    def timed(f):
        def g(self, x):
            t = time.perf_counter()
            y = f(self, x)
            spent["us"] += (time.perf_counter() - t) * 1e6
            spent["n"] += 1
            return y
        return g

    torch.nn.Linear.forward = timed(lin_fwd)
    gemmlib.nn.Linear.forward = timed(gl_fwd)
    # inclusive host time of each step of gemmlib's call, from the outside in
    from gemmlib import api
    from gemmlib.runtime import driver as drv_mod
    from gemmlib.runtime import launch

    drv = drv_mod.driver()
    steps_us: dict = {}
    wrapped = [(api, "matmul"), (api, "torch_repeat"), (launch, "run"),
               (launch, "_launch_main"), (launch, "_maps_for_call"), (drv, "launch_kernel"),
               (torch, "empty_strided")]
    originals = [(obj, name, getattr(obj, name)) for obj, name in wrapped]

    def inclusive(name, f):
        def g(*a, **k):
            t = time.perf_counter()
            try:
                return f(*a, **k)
            finally:
                steps_us[name] = steps_us.get(name, 0.0) + (time.perf_counter() - t) * 1e6
        return g

    for obj, name, f in originals:
        setattr(obj, name, inclusive(name, f))
    def reset(*_):
        spent.update(us=0.0, n=0)
        steps_us.clear()
        count.update(store=0, sync=0, encode=0)

    def report(batch, r, side, issued_ms, done_ms):
        n = max(spent["n"], 1)
        print(f"linear-host b={batch} round {r} {side:<8} issued in {issued_ms:7.1f} ms, "
              f"done {done_ms:7.1f} ms; {spent['n']} linear calls, "
              f"{spent['us'] / n:6.1f} us each; {count}", flush=True)
        if side == "gemmlib":
            print("    per call, inclusive: " + ", ".join(
                f"{k} {v / n:.1f}" for k, v in steps_us.items()), flush=True)

    try:
        decode_rounds(model, batches, rounds, steps, before=reset, after=report)
    finally:
        setattr(maps, "_store", store)
        memory.synchronize, maps.tma.encode_2d = sync, encode
        torch.nn.Linear.forward, gemmlib.nn.Linear.forward = lin_fwd, gl_fwd
        for obj, name, f in originals:
            setattr(obj, name, f)
        gemmlib.unpatch(model)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--phases", nargs="*", default=["train", "decode1", "decode16"])
    ap.add_argument("--fresh", action="store_true",
                    help="host time per call on one buffer and on 64 (F.linear, gemmlib)")
    ap.add_argument("--check", type=int, nargs="*", default=[],
                    help="prefill token counts whose logits and layers are checked")
    ap.add_argument("--linear-host", action="store_true",
                    help="host time inside the linear layers during eager decode, both sides")
    ap.add_argument("--gc", action="store_true",
                    help="the garbage collector during eager decode rounds, both sides")
    ap.add_argument("--host", type=int, nargs="*", default=[],
                    help="batches whose patched eager decode steps cProfile times")
    a = ap.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    model = bench_e2e.build_model(torch, bench_e2e.plan(layers=a.layers))
    rows = []
    if a.fresh:
        host_fresh()
    if a.gc:
        gc_probe(model)
    if a.linear_host:
        linear_host(model)
    for tokens in a.check:
        check_prefill(model, tokens)
    if a.host:
        gemmlib.patch(model)
        for batch in a.host:
            host_profile(model, batch, a.out)
    for phase in a.phases:
        for side in ("torch", "gemmlib"):
            (gemmlib.patch if side == "gemmlib" else gemmlib.unpatch)(model)
            rows.append(profile_phase(model, phase, side, a.out))
    with open(os.path.join(a.out, "e2e-profile.json"), "w") as f:
        json.dump(dict(gpu=torch.cuda.get_device_name(), layers=a.layers, rows=rows), f,
                  indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
