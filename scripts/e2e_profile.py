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
        with torch.inference_mode():
            cache = model(input_ids=prompt, use_cache=True).past_key_values
        tok = prompt[:, -1:]

        def run():
            with torch.inference_mode():
                model(input_ids=tok, past_key_values=cache, use_cache=True)
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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--phases", nargs="*", default=["train", "decode1", "decode16"])
    ap.add_argument("--host", type=int, nargs="*", default=[],
                    help="batches whose patched eager decode steps cProfile times")
    a = ap.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    model = bench_e2e.build_model(torch, bench_e2e.plan(layers=a.layers))
    rows = []
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
