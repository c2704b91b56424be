"""The GEMMs of serving, as ``nn.Linear`` holds them: ``python -m gemmlib bench --suite
serving --out results`` writes ``results/serving-<gpu>-<date>.json``.

Each row is one product ``x @ W.T`` with the weight ``W`` of shape (N, K), row-major, as an
``nn.Linear`` holds it, at one token count M, in fp16 or bf16, computed three ways on the
same operands in the same run:

* ``gemmlib``: ``gemmlib.matmul(x, W.t(), out=C)`` (the column-major view read in place, a
  preallocated C of the inputs' dtype);
* ``torch``: ``torch.matmul(x, W.t(), out=C)`` (cuBLAS);
* ``triton``: :func:`gemmlib.triton_matmul.linear` (``x @ W.T``, a blocked Triton GEMM
  autotuned per shape during the warm-up; ``None`` where Triton is not installed or not
  asked for, ``--no-triton``).

The shapes are the projections of one layer of public models, from their published
``config.json`` on the Hugging Face hub (``head_dim`` where the config states it, else
hidden_size / num_attention_heads):

================================  ======  ============  =====  ========  ========
model (repository)                hidden  intermediate  heads  kv heads  head_dim
================================  ======  ============  =====  ========  ========
mistralai/Mistral-7B-v0.3          4096      14336         32       8       128
Qwen/Qwen2.5-7B                    3584      18944         28       4       128
google/gemma-2-9b                  3584      14336         16       8       256
meta-llama/Llama-3.2-3B            3072       8192         24       8       128
microsoft/Phi-3-mini-4k-instruct   3072       8192         32      32        96
mistralai/Mixtral-8x7B-v0.1        4096      14336         32       8       128
Qwen/Qwen1.5-MoE-A2.7B             2048       5632         16      16       128
================================  ======  ============  =====  ========  ========

A layer's projections (N, K), for heads H, kv heads G, head_dim D, hidden h:

* ``qkv``: the fused query/key/value projection, ((H + 2G) D, h);
* ``o``: the attention output, (h, H D);
* ``gate_up``: the fused gate and up projections of the MLP, (2 intermediate, h);
* ``down``: the MLP's output, (h, intermediate);
* MoE layers have ``expert_gate_up`` / ``expert_down`` instead of ``gate_up`` / ``down``:
  Mixtral-8x7B's experts (8, 2 per token) are FFNs of intermediate_size 14336, so its
  expert shapes, (28672, 4096) and (4096, 14336), are Mistral-7B's MLP shapes; Qwen1.5-MoE's
  60 experts (4 per token) have moe_intermediate_size 1408: (2816, 2048) and (2048, 1408),
  and its shared expert shared_expert_intermediate_size 5632: ``shared_gate_up`` (11264,
  2048) and ``shared_down`` (2048, 5632).

A (N, K) pair that several models share is measured once (the row's ``uses`` names every
model projection with that shape): 23 shapes, at the token counts M = 1, 2, 4, 8, 16, 32,
64, 128, 256, 512, 1024 and 4096.  In an MoE layer M is the tokens one expert receives.

How each number is made (``timing`` in the file's ``meta``): each implementation is first
checked on the shape -- its C filled with NaN, one call, the relative (Frobenius) error
of 64 first and 64 last rows against a float32 product of the same fp16/bf16 operands
(TF32 off), within :func:`gemmlib.precision.tolerance` plus the rounding of a 16-bit C --
and a column that fails the check, or raises, is recorded (``<impl>_error``,
``<impl>_ok: false``) and not timed.  The first call compiles gemmlib's kernel and
autotunes Triton's.  Then CUDA events around a loop of back-to-back calls cycling through
copies of the operands that together exceed 3x L2 (the weight copies made once per shape
and precision, x's once per M, the same copies for all three), the loops of the three
implementations alternating, the median of ``loops`` loops per implementation.  Rows at
M <= 16 also carry the DRAM bandwidth each reached (the fewest bytes the product moves --
x and W read once, C written once -- over its time) against the device-to-device copy
bandwidth measured in the same run (``meta.dram_copy_gbps``).

``pct_torch`` = 100 x torch_us / gemmlib_us (gemmlib's speed in % of torch's),
``pct_triton`` = 100 x triton_us / gemmlib_us, ``triton_pct_torch`` = 100 x torch_us /
triton_us.  The suite needs no CuPy: it runs in a torch process.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field

#: published configurations: config.json's field names and values (see the docstring)
MODELS = {
    "mistral-7b-v0.3": dict(repo="mistralai/Mistral-7B-v0.3", hidden_size=4096,
                            intermediate_size=14336, num_attention_heads=32,
                            num_key_value_heads=8, head_dim=128),
    "qwen2.5-7b": dict(repo="Qwen/Qwen2.5-7B", hidden_size=3584, intermediate_size=18944,
                       num_attention_heads=28, num_key_value_heads=4, head_dim=128),
    "gemma-2-9b": dict(repo="google/gemma-2-9b", hidden_size=3584, intermediate_size=14336,
                       num_attention_heads=16, num_key_value_heads=8, head_dim=256),
    "llama-3.2-3b": dict(repo="meta-llama/Llama-3.2-3B", hidden_size=3072,
                         intermediate_size=8192, num_attention_heads=24,
                         num_key_value_heads=8, head_dim=128),
    "phi-3-mini": dict(repo="microsoft/Phi-3-mini-4k-instruct", hidden_size=3072,
                       intermediate_size=8192, num_attention_heads=32, num_key_value_heads=32,
                       head_dim=96),
    # MoE: every FFN is an expert of intermediate_size
    "mixtral-8x7b": dict(repo="mistralai/Mixtral-8x7B-v0.1", hidden_size=4096,
                         intermediate_size=14336, num_attention_heads=32,
                         num_key_value_heads=8, head_dim=128, num_local_experts=8,
                         num_experts_per_tok=2, expert_intermediate="intermediate_size"),
    # MoE: experts of moe_intermediate_size and one shared expert
    "qwen1.5-moe-a2.7b": dict(repo="Qwen/Qwen1.5-MoE-A2.7B", hidden_size=2048,
                              intermediate_size=5632, moe_intermediate_size=1408,
                              shared_expert_intermediate_size=5632, num_attention_heads=16,
                              num_key_value_heads=16, head_dim=128, num_experts=60,
                              num_experts_per_tok=4, expert_intermediate="moe_intermediate_size"),
}
TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)
PRECISIONS = ("fp16", "bf16")
IMPLS = ("torch", "gemmlib", "triton")
#: rows at or below this M also report DRAM bandwidth
DECODE_M = 16
#: loops per implementation (their median is the row's time) and each loop's length
LOOPS = 7
TARGET_MS = 8.0
#: rows of C checked against float32 at each end
ERR_ROWS = 64
#: ``--quick``: a smoke run (5 shapes, 4 token counts, 3 short loops)
QUICK = dict(models=("llama-3.2-3b", "qwen1.5-moe-a2.7b"),
             projs=("qkv", "down", "expert_gate_up", "expert_down"), tokens=(1, 16, 256, 4096),
             loops=3, target_ms=2.0)
#: unit roundoff of a 16-bit C (each element rounded once)
OUT_ROUNDOFF = {"fp16": 2.0 ** -11, "bf16": 2.0 ** -8}
TIMING = ("CUDA events around a loop of back-to-back calls cycling through operand copies "
          "that exceed 3x L2 (the same copies for every implementation), the loops of the "
          "implementations alternating; median of the loops; each implementation checked "
          "against float32 first (autotuning and compiles in that warm-up, untimed)")


# --------------------------------------------------------------------------
# Shapes (no GPU, no torch)


def projections(model: str) -> list[tuple[str, int, int]]:
    """(projection, N, K) of one layer of ``model``, as nn.Linear weights (N, K)."""
    return projections_of(MODELS[model])


def projections_of(c: dict) -> list[tuple[str, int, int]]:
    """(projection, N, K) of one layer of a model of config ``c`` (MODELS' fields)."""
    h, D = c["hidden_size"], c["head_dim"]
    q, kv = c["num_attention_heads"] * D, c["num_key_value_heads"] * D
    out = [("qkv", q + 2 * kv, h), ("o", h, q)]
    expert = c.get("expert_intermediate")
    if expert is None:
        inter = c["intermediate_size"]
        return out + [("gate_up", 2 * inter, h), ("down", h, inter)]
    inter = c[expert]
    out += [("expert_gate_up", 2 * inter, h), ("expert_down", h, inter)]
    shared = c.get("shared_expert_intermediate_size")
    if shared:
        out += [("shared_gate_up", 2 * shared, h), ("shared_down", h, shared)]
    return out


@dataclass(frozen=True)
class Shape:
    """One (N, K) weight shape and every model projection that has it."""
    proj: str                 # the first model's projection name
    N: int
    K: int
    uses: tuple = field(default=())   # ("model proj", ...)

    @property
    def models(self) -> tuple:
        return tuple(dict.fromkeys(u.split()[0] for u in self.uses))

    @property
    def model(self) -> str:
        return self.models[0] if self.uses else ""


def suite_shapes(models=None, projs=None) -> list[Shape]:
    """The distinct (N, K) of the models' projections (``projs``: only those names), in
    model order; each shape lists every model projection that has it."""
    models = tuple(models or MODELS)
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        raise ValueError(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(MODELS)}")
    seen: dict[tuple, list] = {}
    for m in models:
        for proj, N, K in projections(m):
            if projs and proj not in projs:
                continue
            seen.setdefault((N, K), [proj, []])[1].append(f"{m} {proj}")
    return [Shape(proj, N, K, tuple(uses)) for (N, K), (proj, uses) in seen.items()]


def min_bytes(M: int, N: int, K: int, in_bytes: int = 2, out_bytes: int = 2) -> int:
    """The fewest bytes the product moves through DRAM (x and W read once, C written once)."""
    from gemmlib.bench_models import min_bytes as fewest

    return fewest(M, N, K, in_bytes, out_bytes)


def tolerance(precision: str, K: int) -> float:
    """The relative error a right product may have: gemmlib's bound for the sum, plus the
    rounding of a 16-bit C (a wrong kernel is off by O(1e-1) or more)."""
    from gemmlib.precision import tolerance as bound

    return bound(precision, K) + 2 * OUT_ROUNDOFF[precision]


# --------------------------------------------------------------------------
# Rows and the summary (pure arithmetic: no torch, no GPU)


def _pct(a, b):
    return None if a is None or b is None or b <= 0 else 100.0 * a / b


def make_row(shape: Shape, precision: str, M: int, *, us: dict, errors: dict | None = None,
             ok: dict | None = None, rel_err: dict | None = None, kernel=None, gpu=None,
             copy_gbps=None, **extra) -> dict:
    """One result row from each implementation's median microseconds per call (``None``:
    not measured; its reason in ``errors``).  A row whose torch or gemmlib column failed
    carries ``error``; a failed Triton column only ``triton_error``."""
    errors, ok, rel_err = errors or {}, ok or {}, rel_err or {}
    t, g, tr = (us.get(k) for k in IMPLS)
    row = dict(suite="serving", model=shape.model, models=list(shape.models), proj=shape.proj,
               uses=list(shape.uses), M=M, N=shape.N, K=shape.K, precision=precision,
               torch_us=t, gemmlib_us=g, triton_us=tr, pct_torch=_pct(t, g),
               pct_triton=_pct(tr, g), triton_pct_torch=_pct(t, tr), kernel=kernel, gpu=gpu)
    for impl in IMPLS:
        row[f"{impl}_ok"] = ok.get(impl)
        row[f"{impl}_rel_err"] = rel_err.get(impl)
        if errors.get(impl):
            row[f"{impl}_error"] = errors[impl]
    if M <= DECODE_M:
        nbytes = min_bytes(M, shape.N, shape.K)
        row["min_bytes"] = nbytes
        row["dram_copy_gbps"] = copy_gbps
        for impl, v in zip(IMPLS, (t, g, tr)):
            gbps = None if v is None or v <= 0 else nbytes / (v * 1e-6) / 1e9
            row[f"{impl}_dram_gbps"] = gbps
            row[f"{impl}_dram_pct_of_copy"] = _pct(gbps, copy_gbps)
    row.update(extra)
    failed = [f"{impl}: {errors.get(impl) or 'not measured'}" for impl, v in
              (("torch", t), ("gemmlib", g)) if v is None]
    if failed:
        row["error"] = "; ".join(failed)
    return row


def _gmean(xs):
    xs = [x for x in xs if x is not None and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def summary_rows(data: dict, under: float = 80.0) -> list[dict]:
    """Per precision and M: the shapes measured, the geometric mean and the minimum of
    ``pct_torch`` (and the shape of the minimum), the geometric mean of ``pct_triton`` and
    of ``triton_pct_torch``, the shapes under ``under``% of torch, and the failed rows."""
    rows = [r for r in data.get("rows", []) if r.get("suite", "serving") == "serving"]
    precs = [p for p in PRECISIONS if any(r.get("precision") == p for r in rows)]
    precs += sorted({r.get("precision") for r in rows} - set(precs) - {None})
    out = []
    for prec in precs:
        for M in sorted({r["M"] for r in rows if r.get("precision") == prec}):
            here = [r for r in rows if r.get("precision") == prec and r["M"] == M]
            good = [r for r in here if "error" not in r and r.get("pct_torch")]
            pct = [r["pct_torch"] for r in good]
            worst = min(good, key=lambda r: r["pct_torch"]) if good else None
            out.append(dict(
                precision=prec, M=M, shapes=len(good), failed=len(here) - len(good),
                gm_pct_torch=_gmean(pct), min_pct_torch=min(pct) if pct else None,
                min_at=f"{worst['proj']} {worst['N']}x{worst['K']}" if worst else None,
                max_pct_torch=max(pct) if pct else None,
                gm_pct_triton=_gmean(r.get("pct_triton") for r in good),
                gm_triton_pct_torch=_gmean(r.get("triton_pct_torch") for r in good),
                triton_shapes=sum(1 for r in good if r.get("pct_triton")),
                under=sum(1 for p in pct if p < under), under_pct=under))
    return out


def summary_lines(data: dict, under: float = 80.0) -> list[str]:
    """:func:`summary_rows` as a printed table, then the failed columns."""
    def f(v, fmt="6.1f"):
        return "     -" if v is None else format(v, fmt)

    out = [f"{'prec':<5}{'M':>6}{'shapes':>7}  {'gm %torch':>9}{'min %torch':>11}  "
           f"{'(at)':<26}{'gm %triton':>11}{'triton %torch':>14}{f'<{under:g}%':>6}"]
    for s in summary_rows(data, under):
        out.append(f"{s['precision']:<5}{s['M']:>6}{s['shapes']:>7}  {f(s['gm_pct_torch']):>9}"
                   f"{f(s['min_pct_torch']):>11}  {str(s['min_at'] or '-'):<26}"
                   f"{f(s['gm_pct_triton']):>11}{f(s['gm_triton_pct_torch']):>14}"
                   f"{s['under']:>6}" + (f"  ({s['failed']} failed)" if s["failed"] else ""))
    rows = data.get("rows", [])
    bad = [r for r in rows if "error" in r]
    tri = [r for r in rows if r.get("triton_error") and "error" not in r]
    if bad:
        out.append(f"{len(bad)} rows failed (torch or gemmlib: see their 'error')")
    if tri:
        kinds = sorted({str(r["triton_error"])[:60] for r in tri})
        out.append(f"{len(tri)} rows without a Triton time: " + " | ".join(kinds[:3]))
    return out


def line(r: dict) -> str:
    """The progress line of a row."""
    def f(v, fmt):
        return "-" if v is None else format(v, fmt)

    head = f"{r['precision']:<5}{r['proj']:<15}{r['M']:>5}x{r['N']}x{r['K']:<7}"
    out = (head + f" gemmlib {f(r.get('gemmlib_us'), '8.1f')} us  torch "
           f"{f(r.get('torch_us'), '8.1f')}  triton {f(r.get('triton_us'), '8.1f')}  "
           f"{f(r.get('pct_torch'), '6.1f')}% of torch {f(r.get('pct_triton'), '6.1f')}% of "
           f"triton  {str(r.get('kernel') or '')[:40]}")
    if r.get("gemmlib_dram_gbps") is not None:
        out += f"  {r['gemmlib_dram_gbps']:.0f} GB/s"
    if "error" in r:
        out += "  ERROR " + str(r["error"])[:200]
    elif r.get("triton_error"):
        out += "  triton: " + str(r["triton_error"])[:120]
    return out


# --------------------------------------------------------------------------
# The implementations, and how a row is measured (torch; a GPU, except in tests)


@dataclass
class Impl:
    """``make(x, W, C)`` returns a no-argument callable computing C = x @ W.T into C;
    ``info()`` (optional) gives fields for the row once the check has run."""
    make: object
    info: object = None


def implementations(torch, triton: bool = True) -> tuple[dict, dict]:
    """{name: Impl} of the columns that can run here, and {name: why not} of the others."""
    from gemmlib.api import matmul

    impls = {"torch": Impl(lambda x, W, C: lambda: torch.matmul(x, W.t(), out=C)),
             "gemmlib": Impl(lambda x, W, C: lambda: matmul(x, W.t(), out=C))}
    missing = {}
    if not triton:
        missing["triton"] = "not requested (--no-triton)"
    else:
        from gemmlib import triton_matmul as tm

        why = tm.available()
        if why is None:
            impls["triton"] = Impl(lambda x, W, C: lambda: tm.linear(x, W, out=C),
                                   info=lambda: {"triton_config": tm.describe(tm.last_config())})
        else:
            missing["triton"] = why
    return impls, missing


def kernel_of(precision: str, M: int, N: int, K: int, x=None, W=None, C=None) -> dict:
    """The gemmlib kernel of ``matmul(x, W.t(), out=C)``: what the call ran (the plan its
    torch fast path remembered, with its K slices), else ``auto``'s choice for a
    column-major B and a 16-bit C (:func:`gemmlib.bench_layouts._kernel`)."""
    out = {}
    try:
        from gemmlib.bench_layouts import _kernel

        out["kernel_selected"] = _kernel(precision, "NT", M, N, K)
    except Exception as e:   # recorded, never fatal
        out["kernel_selected"] = f"? ({type(e).__name__}: {e})"
    out["kernel"] = out["kernel_selected"]
    if x is not None:
        try:
            from gemmlib.paths.repeat import TORCH_CALLS, torch_key
            from gemmlib.runtime.select import rung_of

            f = TORCH_CALLS.get(torch_key(x, W.t(), C, None, False, None))
            if f is not None:
                k = f.known
                p = k.plan
                out["kernel"] = p.spec.name + (f" + rounding to {k.out16}" if k.out16 else "")
                out["kernel_grid"] = list(p.grid)
                # K slices: split-K's grid z, or wgmma_split_k's workspace rows (one a slice)
                slices = p.splits
                if slices == 1 and rung_of(p.spec) == "wgmma_split_k" and p.workspace:
                    slices = p.workspace[0][0]
                out["kernel_slices"] = slices
        except Exception:
            pass
    return out


def time_rounds(fw, calls: dict, target_ms: float = TARGET_MS, loops: int = LOOPS):
    """Milliseconds per call of each implementation ({name: [per loop]}) and the calls per
    loop: a probe of the first implementation sizes the loops (``target_ms`` each, 3 to
    200 calls), one untimed short loop each, then ``loops`` rounds in which every
    implementation runs one timed loop (``bench_models.loop_time``), in turn."""
    from gemmlib.bench_models import loop_time

    first = next(iter(calls.values()))
    probe = loop_time(fw, first, 2, 1)[0]
    per_loop = int(min(200, max(3, target_ms / max(probe, 1e-3))))
    for cs in calls.values():
        loop_time(fw, cs, min(per_loop, 10), 1)
    out = {name: [] for name in calls}
    for _ in range(loops):
        for name, cs in calls.items():
            out[name] += loop_time(fw, cs, per_loop, 1)
    return out, per_loop


def _rows_checked(torch, M: int, device: str):
    idx = sorted(set(range(min(ERR_ROWS, M))) | set(range(max(0, M - ERR_ROWS), M)))
    return torch.tensor(idx, device=device)


def measure_shape(torch, shape: Shape, precision: str, tokens, impls: dict, *, fw=None,
                  timer=time_rounds, device: str = "cuda", l2_bytes: int = 50 << 20,
                  loops: int = LOOPS, target_ms: float = TARGET_MS, gpu=None, copy_gbps=None,
                  missing: dict | None = None, kernel=kernel_of, seed: int = 0,
                  on_row=None) -> list[dict]:
    """The rows of one shape in one precision, one per token count: operands made once
    (weights for every M; x per M), each implementation checked, then timed by ``timer``
    (see the module's docstring).  ``missing``: {impl: why} of columns not run."""
    from gemmlib.bench_models import operand_sets

    dt = {"fp16": torch.float16, "bf16": torch.bfloat16}[precision]
    tokens = tuple(tokens)
    N, K = shape.N, shape.K
    g = torch.Generator(device=device).manual_seed(seed)

    def rand(*dims):
        return (torch.rand(dims, device=device, generator=g) * 2 - 1).to(dt)

    def sync():
        if device != "cpu":
            torch.cuda.synchronize()

    sets_at = {M: operand_sets(2 * (M * K + N * K), l2_bytes) for M in tokens}
    rows = []
    try:
        Ws = [rand(N, K) for _ in range(max(sets_at.values()))]
        Wf = Ws[0].float()
    except Exception as e:   # e.g. out of memory: every row says so
        for M in tokens:
            rows.append(make_row(shape, precision, M, us={}, gpu=gpu, copy_gbps=copy_gbps,
                                 errors={i: f"operands: {type(e).__name__}: {e}"
                                         for i in IMPLS}))
            if on_row:
                on_row(rows[-1])
        return rows
    tol = tolerance(precision, K)
    for M in tokens:
        us, errors, ok, rel_err, extra = {}, dict(missing or {}), {}, {}, {}
        xs = Cs = ref = checked = None
        try:
            sets = sets_at[M]
            xs = [rand(M, K) for _ in range(sets)]
            pairs = list(zip(xs, Ws[:sets]))
            checked = _rows_checked(torch, M, device)
            ref = xs[0].index_select(0, checked).float() @ Wf.t()
            ref_norm = float(ref.norm()) or 1.0
            Cs = {name: torch.empty((M, N), dtype=dt, device=device) for name in impls}
            calls = {}
            for name, impl in impls.items():
                C = Cs[name]
                try:
                    impl.make(xs[0], Ws[0], C)()   # warm-up: compiles, autotunes
                    C.fill_(float("nan"))
                    impl.make(xs[0], Ws[0], C)()
                    sync()
                    err = float((C.index_select(0, checked).float() - ref).norm()) / ref_norm
                    finite = math.isfinite(err)
                    rel_err[name] = err if finite else None
                    ok[name] = finite and err <= tol
                    if impl.info:
                        extra.update(impl.info())
                    if not ok[name]:
                        errors[name] = ("wrong result: " + (
                            f"relative error {err:.3g} against float32 > {tol:.2g}" if finite
                            else "NaN or Inf in C (elements not written?)") + "; not timed")
                        continue
                    calls[name] = [impl.make(x, W, C) for x, W in pairs]
                except Exception as e:   # recorded in the row; the other columns go on
                    ok[name] = False
                    errors[name] = f"{type(e).__name__}: {e}"
                    sync_quietly(torch, device)
            if "gemmlib" in impls:
                extra.update(kernel(precision, M, N, K, xs[0], Ws[0], Cs["gemmlib"]))
            if calls:
                times, per_loop = timer(fw, calls, target_ms=target_ms, loops=loops)
                for name, ts in times.items():
                    us[name] = statistics.median(ts) * 1e3
                    extra[f"{name}_loops_us"] = [t * 1e3 for t in ts]
                extra.update(calls_per_loop=per_loop, operand_sets=sets, loops=loops)
        except Exception as e:   # outside the columns (operands, reference, timer)
            for name in IMPLS:
                if name not in us and not errors.get(name):
                    errors[name] = f"{type(e).__name__}: {e}"
            sync_quietly(torch, device)
        rows.append(make_row(shape, precision, M, us=us, errors=errors, ok=ok,
                             rel_err=rel_err, gpu=gpu, copy_gbps=copy_gbps, **extra))
        if on_row:
            on_row(rows[-1])
        del xs, Cs, ref, checked
    del Ws, Wf
    return rows


def sync_quietly(torch, device: str):
    """Wait for the GPU, ignoring the error a failed launch left (already recorded)."""
    if device == "cpu":
        return
    try:
        torch.cuda.synchronize()
    except Exception:
        pass


# --------------------------------------------------------------------------
# The run (GPU)


def copy_bandwidth(torch, nbytes: int = 1 << 30, reps: int = 10) -> float:
    """Device-to-device copy bandwidth through torch in GB/s, counting bytes read and
    written (``bench_models.copy_bandwidth`` without CuPy)."""
    src = torch.ones(nbytes // 2, dtype=torch.float16, device="cuda")
    dst = torch.empty_like(src)
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ts = []
    for _ in range(reps + 2):
        e0.record()
        dst.copy_(src)
        e1.record()
        e1.synchronize()
        ts.append(e0.elapsed_time(e1))
    del src, dst
    torch.cuda.empty_cache()
    return 2 * nbytes / (statistics.median(ts[2:]) * 1e-3) / 1e9


def warm_gpu(torch, seconds: float = 3.0):
    """Run 4096^3 fp16 products for ``seconds``, so the first rows do not meet an idle
    GPU's clocks."""
    a = torch.ones((4096, 4096), dtype=torch.float16, device="cuda")
    c = torch.empty_like(a)
    t0 = time.time()
    while time.time() - t0 < seconds:
        for _ in range(20):
            torch.matmul(a, a, out=c)
        torch.cuda.synchronize()
    del a, c
    torch.cuda.empty_cache()


SMI = "driver_version,clocks.sm,clocks.max.sm,clocks.mem,clocks.max.mem,power.limit,temperature.gpu"


def header(torch, plan: dict) -> dict:
    """The file's ``meta``: the GPU as torch and nvidia-smi see it (name, capability, SMs,
    memory, L2, clocks, driver), the versions of torch, Triton, numba-cuda and gemmlib, the
    plan and the timing method."""
    from gemmlib.bench import _nvidia_smi
    from gemmlib.bench_e2e import _version, torch_gpu_meta

    meta = torch_gpu_meta(torch, "serving", triton=_version("triton"), plan=plan, timing=TIMING,
                          models={m: MODELS[m] for m in plan.get("models", ())})
    meta.update({f"smi_{k.replace('.', '_')}": v for k, v in _nvidia_smi(SMI).items()})
    return meta


def plan(models=None, tokens=None, precisions=None, quick: bool = False, triton: bool = True,
         loops=None, target_ms=None) -> dict:
    """What a run measures: the defaults, or ``QUICK``'s where ``quick``, then any option
    given."""
    p = dict(models=list(MODELS), projs=None, tokens=list(TOKENS), precisions=list(PRECISIONS),
             loops=LOOPS, target_ms=TARGET_MS, quick=quick, triton=triton)
    if quick:
        p.update({k: list(v) if isinstance(v, tuple) else v for k, v in QUICK.items()})
    for k, v in (("models", models), ("tokens", tokens), ("precisions", precisions)):
        if v:
            p[k] = list(v)
            if k == "models":
                p["projs"] = None   # models named: all their projections
    for k, v in (("loops", loops), ("target_ms", target_ms)):
        if v is not None:
            p[k] = v
    bad = [x for x in p["precisions"] if x not in PRECISIONS]
    if bad:
        raise ValueError(f"unknown precision(s) {', '.join(bad)}; the serving suite runs "
                         f"{', '.join(PRECISIONS)}")
    if any(int(t) < 1 for t in p["tokens"]):
        raise ValueError("token counts must be >= 1")
    suite_shapes(p["models"], p["projs"])   # unknown models raise here
    return p


def run_suite(p: dict, progress: bool = True, on_block=None) -> dict:
    """Every shape x precision x token count of plan ``p`` (GPU, torch); ``on_block(data)``
    after each shape and precision (e.g. to save what is measured so far)."""
    import torch
    from tqdm import tqdm

    from gemmlib import bench_models

    fw = bench_models.framework("torch")   # its events; TF32 off for the float32 reference
    torch.backends.cuda.matmul.allow_tf32 = False
    meta = header(torch, p)
    meta["dram_copy_gbps"] = copy_bandwidth(torch)
    cm = torch.backends.cuda.matmul   # torch.matmul's own settings, as a caller has them
    meta["torch_matmul"] = {k: getattr(cm, k, None) for k in (
        "allow_fp16_reduced_precision_reduction", "allow_bf16_reduced_precision_reduction",
        "allow_tf32")}
    impls, missing = implementations(torch, p["triton"])
    meta["columns"] = list(impls)
    meta["columns_missing"] = missing
    if "triton" in impls:
        from gemmlib import triton_matmul as tm

        meta["triton_launch"] = (
            f"gemmlib.triton_matmul.linear: the first call of an (M, N, K, dtype) autotunes "
            f"(do_bench, {tm.AUTOTUNE_REP_MS} ms per candidate) and launches the winner; "
            f"later calls launch the jit kernel with that config directly")
    try:
        warm_gpu(torch)
    except Exception as e:   # the rows can still be measured
        meta["warm_error"] = f"{type(e).__name__}: {e}"
    shapes = suite_shapes(p["models"], p["projs"])
    meta["shapes"] = len(shapes)
    data = {"meta": meta, "rows": []}
    l2 = meta["l2_bytes"] or (50 << 20)
    bar = tqdm(total=len(shapes) * len(p["precisions"]) * len(p["tokens"]), unit="row",
               disable=not progress, dynamic_ncols=True)
    t0 = time.time()

    def on_row(row):
        data["rows"].append(row)
        bar.update(1)
        if progress:
            bar.write(line(row))

    for i, shape in enumerate(shapes):
        for prec in p["precisions"]:
            bar.set_description(f"{prec} {shape.proj} {shape.N}x{shape.K}")
            measure_shape(torch, shape, prec, p["tokens"], impls, fw=fw, device="cuda",
                          l2_bytes=l2, loops=p["loops"], target_ms=p["target_ms"],
                          gpu=meta["gpu"], copy_gbps=meta["dram_copy_gbps"], missing=missing,
                          seed=1000 * i + PRECISIONS.index(prec), on_row=on_row)
            torch.cuda.empty_cache()
            meta["wall_s"] = round(time.time() - t0, 1)
            if on_block:
                on_block(data)
    bar.close()
    from gemmlib.bench import _nvidia_smi

    meta.update({f"smi_end_{k.replace('.', '_')}": v for k, v in _nvidia_smi(SMI).items()})
    meta["wall_s"] = round(time.time() - t0, 1)
    return data


def save(data: dict, directory="results") -> str:
    """``data`` as ``<directory>/serving-<gpu>-<date>.json``; its path."""
    from gemmlib.bench_models import save as save_json

    return save_json(data, directory, "serving")


def describe(p: dict) -> list[str]:
    """What plan ``p`` measures, a line per shape (no GPU needed)."""
    shapes = suite_shapes(p["models"], p["projs"])
    n = len(shapes) * len(p["tokens"]) * len(p["precisions"])
    out = [f"serving: {len(shapes)} shapes x {len(p['tokens'])} token counts "
           f"({' '.join(map(str, p['tokens']))}) x {' '.join(p['precisions'])} = {n} rows; "
           f"columns torch, gemmlib" + (", triton" if p["triton"] else "")]
    for s in shapes:
        out.append(f"  {s.N:>6} x {s.K:<6} {', '.join(s.uses)}")
    return out


def cli(args) -> int:
    """``python -m gemmlib bench --suite serving``."""
    from gemmlib import backend

    try:
        p = plan(models=args.models, tokens=args.tokens, precisions=args.precisions,
                 quick=args.quick, triton=not getattr(args, "no_triton", False))
    except ValueError as e:
        print(f"serving suite: {e}")
        return 2
    from gemmlib.bench_models import torch_gpu

    if backend.SIMULATOR or not torch_gpu():
        for s in describe(p):
            print(s)
        print("the serving suite times GPU calls (torch with CUDA): nothing measured here")
        return 0
    on_block = (lambda data: save(data, args.out)) if args.out else None
    data = run_suite(p, progress=not args.quiet, on_block=on_block)
    for s in summary_lines(data):
        print(s)
    print(f"serving: {len(data['rows'])} rows in {data['meta']['wall_s']:.0f} s")
    if args.out:
        print(f"wrote {save(data, args.out)}")
    return 1 if any("error" in r for r in data["rows"]) else 0
