"""``python -m gemmlib tune``: the Hopper choice at prefill-chunk sizes, measured.

Between the swap-AB range (M <= 64 tokens) and the sizes where whole 128 x 256 tiles fill
the GPU, the fastest tile, ring depth and K split change with the layer's outputs (N), its
depth (K) and the tokens (M), in ways the cost models did not predict (the H200 sweep of
``scripts/swap_gpu.py --set mid``: the best candidate per layer ran 10-30 points of torch
ahead of the rule's).  So this module times every candidate of :data:`CANDIDATES` on the
projections of :data:`TRAINING` -- public models that the serving suite and the models
suite do not contain, so those suites are held-out shapes for the table -- and stores, per
(tokens, outputs, K) class (:func:`gemmlib.tuning.token_class`), the candidate with the
best geometric mean of torch's time over its own.  ``kernel="auto"`` then takes the nearest
class's choice (:func:`gemmlib.runtime.select.tuned_hopper`).

Each timing is a loop of ``gemmlib.matmul(x, W.t(), kernel=spec, out=C)`` calls -- an
``nn.Linear`` weight, C in the inputs' type -- with operand copies rotated past 3x L2,
against ``torch.matmul`` on the same data in the same rounds (``bench_serving.time_rounds``);
every candidate is checked against float32 first.  Tuned in one precision (bf16 by default):
fp16 runs the same kernels on the same bytes, and the table serves both.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from pathlib import Path

from gemmlib import backend, tuning
from gemmlib.runtime import select

#: layer shapes from public configs (hidden, intermediate, heads, kv heads, head dim), none
#: of them in the serving suite (bench_serving.MODELS) or the models suite
TRAINING = {
    "qwen2.5-14b": dict(hidden_size=5120, intermediate_size=13824, num_attention_heads=40,
                        num_key_value_heads=8, head_dim=128),
    "llama-3.2-1b": dict(hidden_size=2048, intermediate_size=8192, num_attention_heads=32,
                         num_key_value_heads=8, head_dim=64),
    "gemma-2-2b": dict(hidden_size=2304, intermediate_size=9216, num_attention_heads=8,
                       num_key_value_heads=4, head_dim=256),
    "yi-1.5-9b": dict(hidden_size=4096, intermediate_size=11008, num_attention_heads=32,
                      num_key_value_heads=4, head_dim=128),
    "phi-3-medium": dict(hidden_size=5120, intermediate_size=17920, num_attention_heads=40,
                         num_key_value_heads=10, head_dim=128),
}
#: the token counts tuned (``select.HOPPER_TUNED_MMAX`` is the last one auto looks up)
TOKENS = (128, 256, 512)

#: the configuration space: {name: tuning entry}.  ``wgmma_split_k`` entries get their K
#: slices from its cost model and, with one slice, the 16-bit epilogue ``select_out`` gives;
#: ``wgmma_swap`` ones the most blocks that share the tiles evenly.  "rule" is what ``auto``
#: runs untuned.
CANDIDATES = {
    "rule": dict(rung="rule"),
    "split64x128s8": dict(rung="wgmma_split_k", params=dict(BM=64, BN=128, STAGES=8)),
    "split128x128s4": dict(rung="wgmma_split_k", params=dict(BM=128, BN=128, STAGES=4)),
    "split128x256s4": dict(rung="wgmma_split_k", params=dict(BM=128, BN=256, STAGES=4)),
    "swap64x128": dict(rung="wgmma_swap", params=dict(BM=64, BN=128, KT=128), grid="even"),
    "swap64x256": dict(rung="wgmma_swap", params=dict(BM=64, BN=256, KT=64), grid="even"),
    # 128 weight rows by 64 or 128 tokens, 8 and 6 stages: the tiles cuBLAS ran at 256 and
    # 512 tokens in the H100 profile (results/ncu-serving-2026-11-27/)
    "swap128x64": dict(rung="wgmma_swap", params=dict(BM=128, BN=64, KT=64), grid="even"),
    "swap128x128": dict(rung="wgmma_swap", params=dict(BM=128, BN=128, KT=64), grid="even"),
    # outputs per tile fitted to whole waves (any multiple of 8: a K-major weight only), as
    # cuBLAS's 80-, 96- and 112-wide tiles in the same profile
    "split128xfit": select.HOPPER_FIT_ENTRY,
    # the token width fitted to the shape: tiles that fill the SMs
    "swap64xfit": dict(rung="wgmma_swap", params=dict(BM=64, KT=64), width="fit", grid="even"),
    "swap128xfit": dict(rung="wgmma_swap", params=dict(BM=128, KT=64), width="fit",
                        grid="even"),
}


def applies(name: str, M: int) -> bool:
    """Whether candidate ``name`` is tried at M tokens: 64-row split tiles up to 256 tokens,
    swap-AB token tiles at most twice the tokens wide."""
    entry = CANDIDATES[name]
    p = entry.get("params", {})
    if entry["rung"] == "wgmma_split_k" and p["BM"] == 64:
        return M <= 256
    if entry["rung"] == "wgmma_swap" and "BN" in p:
        return p["BN"] <= 2 * M
    return True


def layer_shapes(models=None) -> list[tuple[str, int, int]]:
    """("model proj", N, K) of the training models' projections, each (N, K) once."""
    from gemmlib.bench_serving import projections_of

    seen = {}
    for m in models or TRAINING:
        for proj, N, K in projections_of(TRAINING[m]):
            seen.setdefault((N, K), f"{m} {proj}")
    return [(use, N, K) for (N, K), use in seen.items()]


def spec_of(name: str, precision: str, M: int, N: int, K: int):
    """The spec candidate ``name`` runs for ``x @ W.t()`` with a C in ``precision``."""
    from gemmlib.runtime import select as S

    entry = CANDIDATES[name]
    if entry["rung"] == "rule":
        spec = S.select_hopper(precision, M, N, K, tuned=False)
    else:
        spec = S.hopper_candidate(entry, precision, M, N, K, "NK")
    if spec is None:
        return None
    return S.with_layout(S.select_out(spec, precision, M, N, K), "NK")


def measure(precision: str = "bf16", tokens=TOKENS, models=None, budget: float = 0,
            loops: int = 5, target_ms: float = 3.0, progress: bool = True) -> list[dict]:
    """Rows {use, M, N, K, precision, candidate, us, torch_us, pct_torch | error}."""
    import torch
    from tqdm import tqdm

    from gemmlib.api import matmul
    from gemmlib.bench_models import framework, operand_sets
    from gemmlib.bench_serving import time_rounds, tolerance, warm_gpu

    fw = framework("torch")
    dt = {"fp16": torch.float16, "bf16": torch.bfloat16}[precision]
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    shapes = layer_shapes(models)
    end = time.perf_counter() + (budget or math.inf)
    rows = []
    bar = tqdm(total=len(shapes) * len(tokens), disable=not progress, desc="tune")
    g = torch.Generator(device="cuda").manual_seed(0)
    warm_gpu(torch, 1.0)   # the first rows at the clocks the rest run at
    for use, N, K in shapes:
        for M in tokens:
            bar.update()
            if time.perf_counter() > end:
                continue
            sets = operand_sets(2 * (M * K + N * K + M * N), l2)
            xs = [(torch.rand(M, K, device="cuda", generator=g) * 2 - 1).to(dt)
                  for _ in range(sets)]
            Ws = [(torch.rand(N, K, device="cuda", generator=g) * 2 - 1).to(dt)
                  for _ in range(sets)]
            Cs = [torch.empty(M, N, device="cuda", dtype=dt) for _ in range(sets)]
            ref = xs[0].float() @ Ws[0].float().t()
            calls = {"torch": [lambda i=i: torch.matmul(xs[i], Ws[i].t(), out=Cs[i])
                               for i in range(sets)]}
            failed = {}
            for name in CANDIDATES:
                if not applies(name, M):
                    continue
                try:
                    spec = spec_of(name, precision, M, N, K)
                    if spec is None:
                        failed[name] = "cannot run this shape"
                        continue
                    C = torch.full((M, N), float("nan"), device="cuda", dtype=dt)
                    matmul(xs[0], Ws[0].t(), kernel=spec, out=C)
                    err = float((C.float() - ref).norm() / ref.norm())
                    if not err <= tolerance(precision, K):
                        failed[name] = f"wrong result: relative error {err:.3g}"
                        continue
                    calls[name] = [lambda i=i, s=spec: matmul(xs[i], Ws[i].t(), kernel=s,
                                                              out=Cs[i])
                                   for i in range(sets)]
                except Exception as e:   # a candidate that fails is data
                    failed[name] = f"{type(e).__name__}: {e}"[:300]
                    torch.cuda.synchronize()
            times, _ = time_rounds(fw, calls, target_ms=target_ms, loops=loops)
            torch_ms = times.pop("torch")
            base = dict(use=use, M=M, N=N, K=K, precision=precision,
                        torch_us=statistics.median(torch_ms) * 1e3)
            for name, ts in times.items():
                # torch's loop and the candidate's ran in the same round: their ratio per
                # round, then the median, so a round slowed for both (clocks) cancels
                pct = statistics.median(100 * t / c for t, c in zip(torch_ms, ts))
                rows.append(dict(base, candidate=name, us=statistics.median(ts) * 1e3,
                                 pct_torch=pct))
            rows += [dict(base, candidate=n, error=why) for n, why in failed.items()]
            del xs, Ws, Cs, ref, calls
    bar.close()
    return rows


#: a candidate replaces the rule only where it leads it by this factor (noise, one layer)
RULE_MARGIN = 1.03


def table(rows: list[dict]) -> dict:
    """{class: entry}: per token class, the candidate with the best geometric mean of
    ``pct_torch`` over the class's layers (only candidates timed on all of them); the rule
    unless the best leads it by RULE_MARGIN."""
    by_class: dict[str, dict[str, list]] = {}
    layers: dict[str, set] = {}
    for r in rows:
        cls = tuning.token_class(r["M"], r["N"], r["K"])
        layers.setdefault(cls, set()).add((r["M"], r["N"], r["K"]))
        if "pct_torch" in r:
            by_class.setdefault(cls, {}).setdefault(r["candidate"], []).append(r["pct_torch"])
    out = {}
    for cls, cands in sorted(by_class.items()):
        full = {n: v for n, v in cands.items() if len(v) == len(layers[cls])}
        if not full:
            continue
        gm = {n: math.exp(statistics.fmean(math.log(x) for x in v)) for n, v in full.items()}
        best = max(gm, key=gm.get)
        if "rule" in gm and gm[best] < RULE_MARGIN * gm["rule"]:
            best = "rule"
        out[cls] = dict(CANDIDATES[best], candidate=best, gm_pct_torch=round(gm[best], 1),
                        rule_gm_pct_torch=round(gm["rule"], 1) if "rule" in gm else None,
                        layers=len(layers[cls]))
    return out


def record(classes: dict, path: Path | None = None, slug: str | None = None) -> Path:
    """Write the classes under ``HOPPER_TUNED`` in the GPU's tuning file (the user cache by
    default; ``gemmlib/data/tuning/<slug>.json`` is the shipped one)."""
    from gemmlib.runtime.select import HOPPER_TUNED

    dev = backend.device_info()
    slug = slug or tuning.gpu_slug(dev.name)
    path = Path(path) if path else tuning.user_cache_dir() / f"{slug}.json"

    def change(data):
        data.update(gpu=dev.name, gpu_slug=slug, sm_count=dev.sm_count)
        data.setdefault("kernels", {})[HOPPER_TUNED] = classes

    tuning.update(path, change)
    return path


def cli(args) -> int:
    """``python -m gemmlib tune``."""
    dev = backend.device_info()
    if backend.SIMULATOR or tuple(dev.compute_capability) != (9, 0):
        print("gemmlib tune: needs an H100 or H200 (compute capability 9.0); "
              f"this is {dev.name}")
        return 2
    import torch

    rows = measure(args.precision, tuple(args.tokens or TOKENS), args.models, args.budget,
                   progress=not args.quiet)
    classes = table(rows)
    path = record(classes, args.table)
    meta = dict(gpu=dev.name, torch=torch.__version__, precision=args.precision,
                models=list(args.models or TRAINING), candidates=CANDIDATES,
                date=time.strftime("%Y-%m-%d"))
    if args.out:
        Path(args.out).write_text(json.dumps(dict(meta=meta, rows=rows, classes=classes),
                                             indent=1))
    for cls, e in classes.items():
        print(f"{cls:24s} {e['candidate']:16s} {e['gm_pct_torch']:6.1f}% of torch "
              f"(rule {e['rule_gm_pct_torch']}%, {e['layers']} layers)")
    print(f"table: {path}" + (f"; rows: {args.out}" if args.out else ""))
    return 0
