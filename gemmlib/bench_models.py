"""The GEMMs real models run, timed as a caller receives them (issue 18).

``python -m gemmlib bench --suite models --out results`` writes
``results/models-<gpu>-<date>.json`` (and ``.csv``).

The shapes are the four projections of one transformer layer of two public
model families of different size, from their published ``config.json``:

* **Llama 3.1 8B** (meta-llama/Llama-3.1-8B): hidden 4096, intermediate
  14336, 32 query heads and 8 key/value heads of 128;
* **Qwen2.5 72B** (Qwen/Qwen2.5-72B): hidden 8192, intermediate 29568, 64
  query heads and 8 key/value heads of 128.

A layer's projections, for T tokens (M = T):

* ``qkv``: the fused query/key/value projection, N = (heads + 2 kv_heads) x 128, K = hidden;
* ``o``: the attention output, N = hidden, K = heads x 128;
* ``gate_up``: the fused gate and up projections of the MLP, N = 2 x intermediate, K = hidden;
* ``down``: the MLP's output, N = hidden, K = intermediate;

at T = 1 and 16 (decode: a bandwidth problem, B is read once), 128, 1024,
4096 and 16384 (prefill), plus four shapes of the earlier sweeps (4096^3,
2048^3, 1024x1024x8192, 8192x256x8192).

How each number is made (``timing = "loop"``): CUDA events around a loop of
back-to-back calls -- ``gemmlib.matmul(A, B)`` as a caller writes it, the
result allocated by the call -- against the framework's own matmul timed the
same way in the same run (``torch.matmul`` for torch tensors, with TF32 off
for fp32; ``cupy.matmul`` for CuPy arrays).  Each loop cycles through enough
copies of the operands that they do not sit in L2 (more than 3x L2 in all),
as the layers of a model do; the per-call time is the loop's time over its
calls, and the row keeps the median of several loops.  ``host_us`` is the
host time of one call, back to back.  Decode-sized rows also carry the DRAM
bandwidth they reach (the fewest bytes the product must move over its time)
against the GPU's copy bandwidth measured in the same run.

Note the comparison's outputs: gemmlib's tensor-core products return float32
while ``torch.matmul`` of fp16/bf16 tensors returns fp16/bf16 (half the bytes
written); the row's ``cublas_fp32_ms`` is cuBLAS writing float32 as gemmlib
does (``cublasGemmEx`` through CuPy), for the like-for-like kernel.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass

import numpy as np

from gemmlib import backend, dispatch
from gemmlib.api import matmul

#: published configurations (config.json of each model on the Hugging Face hub)
MODELS = {
    "llama-3.1-8b": dict(hidden=4096, intermediate=14336, heads=32, kv_heads=8, head_dim=128),
    "qwen2.5-72b": dict(hidden=8192, intermediate=29568, heads=64, kv_heads=8, head_dim=128),
}
TOKENS = (1, 16, 128, 1024, 4096, 16384)
#: shapes of the earlier sweeps the targets also name
EXTRA_SHAPES = ((4096, 4096, 4096), (2048, 2048, 2048), (1024, 1024, 8192), (8192, 256, 8192))
PRECISIONS = ("fp16", "bf16", "3xtf32")
#: decode: rows at or below this M also report DRAM bandwidth
DECODE_M = 16


@dataclass(frozen=True)
class Shape:
    model: str
    layer: str
    tokens: int
    M: int
    N: int
    K: int


def projections(model: str) -> list[tuple[str, int, int]]:
    """(layer, N, K) of one transformer layer of ``model``."""
    c = MODELS[model]
    q = c["heads"] * c["head_dim"]
    kv = c["kv_heads"] * c["head_dim"]
    return [("qkv", q + 2 * kv, c["hidden"]), ("o", c["hidden"], q),
            ("gate_up", 2 * c["intermediate"], c["hidden"]), ("down", c["hidden"], c["intermediate"])]


def suite_shapes(models=tuple(MODELS), tokens=TOKENS, extra: bool = True) -> list[Shape]:
    out = [Shape(m, layer, t, t, N, K) for m in models for t in tokens
           for layer, N, K in projections(m)]
    if extra:
        out += [Shape("sweep", "", 0, M, N, K) for (M, N, K) in EXTRA_SHAPES]
    return out


def min_bytes(M: int, N: int, K: int, in_bytes: int, out_bytes: int = 4) -> int:
    """The fewest bytes the product moves through DRAM: each input read once, C written once."""
    return in_bytes * (M * K + K * N) + out_bytes * M * N


# --------------------------------------------------------------------------
# Frameworks: torch or CuPy, behind the few calls the suite needs


class _Torch:
    name = "torch"

    def __init__(self):
        import torch

        self.t = torch
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32 (SGEMM)
        torch.backends.cudnn.allow_tf32 = False

    def operands(self, precision, M, N, K, seed):
        t = self.t
        dt = {"fp16": t.float16, "bf16": t.bfloat16}.get(precision, t.float32)
        g = t.Generator(device="cuda").manual_seed(seed)
        A = (t.rand(M, K, device="cuda", generator=g) * 2 - 1).to(dt)
        B = (t.rand(K, N, device="cuda", generator=g) * 2 - 1).to(dt)
        return A, B

    def reference_call(self, A, B):
        return lambda: self.t.matmul(A, B)

    def copy(self, x):
        return x.clone()

    def as_cupy(self, x):
        cp = backend.array_module()
        if x.dtype == self.t.bfloat16:
            from gemmlib.precision import BF16Array

            return BF16Array(cp.asarray(x.view(self.t.int16)).view(cp.uint16))
        return cp.asarray(x)

    def event(self):
        return self.t.cuda.Event(enable_timing=True)

    def elapsed(self, e0, e1) -> float:
        return e0.elapsed_time(e1)

    def synchronize(self):
        self.t.cuda.synchronize()

    def rel_error(self, C, A, B, rows: int) -> float:
        r = min(rows, A.shape[0])
        ref = A[:r].double() @ B.double()
        d = C[:r].double() - ref
        return float(self.t.linalg.norm(d) / self.t.linalg.norm(ref))


class _CuPy:
    name = "cupy"

    def __init__(self):
        self.cp = backend.array_module()

    def operands(self, precision, M, N, K, seed):
        from gemmlib.bench import precision_operands

        return precision_operands(precision, M, N, K, seed)

    def reference_call(self, A, B):
        a, b = getattr(A, "bits", A), getattr(B, "bits", B)
        if a.dtype == np.uint16:   # bfloat16 bits: CuPy has no bf16 matmul; cuBLAS directly
            C = self.cp.empty((a.shape[0], b.shape[1]), dtype=np.float32)
            return lambda: backend.cublas_gemm(A, B, C, "bf16")
        return lambda: self.cp.matmul(a, b)

    def copy(self, x):
        if hasattr(x, "bits"):
            from gemmlib.precision import BF16Array

            return BF16Array(x.bits.copy())
        return x.copy()

    def as_cupy(self, x):
        return x

    def event(self):
        return self.cp.cuda.Event()

    def elapsed(self, e0, e1) -> float:
        return self.cp.cuda.get_elapsed_time(e0, e1)

    def synchronize(self):
        self.cp.cuda.runtime.deviceSynchronize()

    def rel_error(self, C, A, B, rows: int) -> float:
        r = min(rows, A.shape[0])
        a = backend.as_float64(A)[:r]
        ref = a @ backend.as_float64(B)
        return float(self.cp.linalg.norm(C[:r] - ref) / self.cp.linalg.norm(ref))


def torch_gpu() -> bool:
    """Whether torch is installed with a CUDA GPU it can use (the torch suites' condition)."""
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def framework(name: str):
    return {"torch": _Torch, "cupy": _CuPy}[name]()


# --------------------------------------------------------------------------
# Timing a loop of calls


def loop_time(fw, calls, per_loop: int, loops: int) -> list[float]:
    """Milliseconds per call: events around ``per_loop`` back-to-back calls that cycle
    through ``calls``, ``loops`` times."""
    e0, e1 = fw.event(), fw.event()
    out = []
    n = len(calls)
    for _ in range(loops):
        fw.synchronize()
        e0.record()
        for i in range(per_loop):
            calls[i % n]()
        e1.record()
        e1.synchronize()
        out.append(fw.elapsed(e0, e1) / per_loop)
    return out


def host_us(fw, fn, calls: int = 50, batch: int = 100) -> float:
    """Median host microseconds of one call, back to back (the GPU work only queued), in
    batches of ``batch`` calls with the GPU drained between them: a longer run fills the
    launch queue and then times the GPU instead of the host."""
    for _ in range(3):
        fn()
    fw.synchronize()
    ts = []
    while len(ts) < calls:
        for _ in range(min(batch, calls - len(ts))):
            t = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t)
        fw.synchronize()
    return statistics.median(ts) * 1e6


def copy_bandwidth(nbytes: int = 2 << 30, reps: int = 10) -> float:
    """Device-to-device copy bandwidth in GB/s, counting bytes read and written."""
    cp = backend.array_module()
    src = cp.empty(nbytes // 4, dtype=np.float32)
    src.fill(1.0)
    dst = cp.empty_like(src)
    e0, e1 = cp.cuda.Event(), cp.cuda.Event()
    ts = []
    for _ in range(reps + 2):
        e0.record()
        dst[...] = src
        e1.record()
        e1.synchronize()
        ts.append(cp.cuda.get_elapsed_time(e0, e1))
    del src, dst
    cp.get_default_memory_pool().free_all_blocks()
    return 2 * nbytes / (statistics.median(ts[2:]) * 1e-3) / 1e9


def operand_sets(nbytes: int, l2: int, cap: int = 16) -> int:
    """Operand copies a loop cycles through so that they do not sit in L2."""
    return max(1, min(cap, math.ceil(3 * l2 / max(nbytes, 1))))


def measure(shape: Shape, precision: str, fw, *, target_ms: float = 25.0, loops: int = 5,
            err_rows: int = 256, seed: int = 0) -> dict:
    """One row: gemmlib.matmul against the framework's matmul, each in a timed loop."""
    from gemmlib.precision import INPUT_DTYPE, tolerance

    M, N, K = shape.M, shape.N, shape.K
    call_prec = None if precision in ("fp16", "bf16", "fp32") else precision
    A, B = fw.operands(precision, M, N, K, seed)
    in_bytes = np.dtype(INPUT_DTYPE[precision] if precision != "bf16" else np.uint16).itemsize
    ops = in_bytes * (M * K + K * N)
    sets = operand_sets(ops, backend.device_info().l2_bytes)
    pairs = [(A, B)] + [(fw.copy(A), fw.copy(B)) for _ in range(sets - 1)]
    ours = [(lambda a=a, b=b: matmul(a, b, precision=call_prec)) for a, b in pairs]
    theirs = [fw.reference_call(a, b) for a, b in pairs]
    C = ours[0]()   # compiles and checks; then the error against float64
    fw.synchronize()
    err = fw.rel_error(C, A, B, err_rows)
    ref_C = theirs[0]()   # None where the reference writes a preallocated C (CuPy bf16)
    fw.synchronize()
    ref_err = fw.rel_error(ref_C, A, B, err_rows) if ref_C is not None else float("nan")
    tol = tolerance(precision, K)
    if not err <= tol:
        raise AssertionError(f"gemmlib is wrong at {M}x{N}x{K} {precision}: {err:.2e} > {tol:.1e}")
    probe = loop_time(fw, ours, 2, 1)[0]
    per_loop = int(min(200, max(3, target_ms / max(probe, 1e-3))))
    t_ours = loop_time(fw, ours, per_loop, loops)
    t_ref = loop_time(fw, theirs, per_loop, loops)
    # cuBLAS writing float32 as gemmlib does (kernel-for-kernel), through CuPy
    cp = backend.array_module()
    Cf = cp.empty((M, N), dtype=np.float32)
    cprec = {"3xtf32": "fp32", "tf32": "tf32"}.get(precision, precision)
    blas = [lambda a=fw.as_cupy(a), b=fw.as_cupy(b): backend.cublas_gemm(a, b, Cf, cprec)
            for a, b in pairs]
    t_blas = loop_time(_CuPy(), blas, per_loop, loops)
    ms, ref_ms, blas_ms = (statistics.median(t) for t in (t_ours, t_ref, t_blas))
    flops = 2.0 * M * N * K
    row = dict(suite="models", input=fw.name, precision=precision, timing="loop",
               model=shape.model, layer=shape.layer, tokens=shape.tokens, M=M, N=N, K=K,
               kernel=dispatch.select_tc(precision, M, N, K).name if precision != "fp32"
               else dispatch.select(M, N, K).name,
               median_ms=ms, loop_ms=t_ours, reference=f"{fw.name}.matmul",
               cublas_median_ms=ref_ms, cublas_loop_ms=t_ref, cublas_fp32_ms=blas_ms,
               tflops=flops / (ms * 1e-3) / 1e12, cublas_tflops=flops / (ref_ms * 1e-3) / 1e12,
               pct_of_cublas=100.0 * ref_ms / ms, pct_of_cublas_fp32=100.0 * blas_ms / ms,
               rel_error_vs_fp64=err, cublas_rel_error=ref_err, err_rows=min(err_rows, M),
               calls_per_loop=per_loop, operand_sets=sets,
               host_us=host_us(fw, ours[0]), cublas_host_us=host_us(fw, theirs[0]))
    row["min_bytes"] = min_bytes(M, N, K, in_bytes)
    row["dram_gbps"] = row["min_bytes"] / (ms * 1e-3) / 1e9
    del pairs, ours, theirs, blas, C, ref_C, Cf
    return row


def run_suite(precisions=PRECISIONS, inputs=("torch",), models=tuple(MODELS), tokens=TOKENS,
              extra: bool = True, progress: bool = True, loops: int = 5) -> dict:
    """Every shape of the suite in every precision and input type (GPU only)."""
    from gemmlib.bench import environment

    if backend.SIMULATOR:
        raise RuntimeError("the models suite times GPU calls: run it on a GPU")
    meta = environment()
    meta["dram_copy_gbps"] = copy_bandwidth()
    meta.update(suite="models", models={m: MODELS[m] for m in models}, tokens=list(tokens),
                precisions=list(precisions), inputs=list(inputs), loops=loops,
                timing="events around a loop of back-to-back calls, operands rotated past L2")
    rows = []
    cp = backend.array_module()
    for inp in inputs:
        fw = framework(inp)
        for shape in suite_shapes(models, tokens, extra):
            for prec in precisions:
                try:
                    row = measure(shape, prec, fw, loops=loops)
                except Exception as e:  # recorded, never hidden
                    row = dict(suite="models", input=inp, precision=prec, model=shape.model,
                               layer=shape.layer, tokens=shape.tokens, M=shape.M, N=shape.N,
                               K=shape.K, error=f"{type(e).__name__}: {e}")
                if "dram_gbps" in row:
                    row["dram_pct_of_copy"] = 100.0 * row["dram_gbps"] / meta["dram_copy_gbps"]
                rows.append(row)
                cp.get_default_memory_pool().free_all_blocks()
                if inp == "torch":
                    import torch

                    torch.cuda.empty_cache()
                if progress:
                    print(_line(row), flush=True)
    return {"meta": meta, "rows": rows}


def _line(r: dict) -> str:
    where = f"{r['model']:<13}{r['layer']:<8}T={r['tokens']:<6}"
    shape = f"{r['M']}x{r['N']}x{r['K']}"
    if "error" in r:
        return f"{r['input']:<6}{r['precision']:<7}{where}{shape:<18} ERROR {r['error']}"
    dram = f" {r['dram_gbps']:7.0f} GB/s" if r["M"] <= DECODE_M else ""
    return (f"{r['input']:<6}{r['precision']:<7}{where}{shape:<18}{r['kernel'][:28]:<29}"
            f"{r['median_ms'] * 1e3:9.1f} us {r['pct_of_cublas']:6.1f}% of {r['reference']}"
            f" ({r['pct_of_cublas_fp32']:5.1f}% fp32-out) host {r['host_us']:5.1f} us"
            f" vs {r['cublas_host_us']:5.1f}{dram}")


def summary(data: dict) -> list[str]:
    """The targets' view: geometric mean and the worst shape per input and precision."""
    out = []
    rows = [r for r in data["rows"] if "error" not in r]
    for inp in sorted({r["input"] for r in rows}):
        for prec in sorted({r["precision"] for r in rows}):
            rs = [r for r in rows if r["input"] == inp and r["precision"] == prec]
            if not rs:
                continue
            pct = [r["pct_of_cublas"] for r in rs]
            gm = math.exp(sum(math.log(p) for p in pct) / len(pct))
            worst = min(rs, key=lambda r: r["pct_of_cublas"])
            out.append(f"{inp} {prec}: geometric mean {gm:.1f}% of {rs[0]['reference']} over "
                       f"{len(rs)} shapes; lowest {worst['pct_of_cublas']:.1f}% at "
                       f"{worst['M']}x{worst['N']}x{worst['K']} ({worst['model']} "
                       f"{worst['layer']})")
    errs = [r for r in data["rows"] if "error" in r]
    if errs:
        out.append(f"{len(errs)} rows failed (see their 'error')")
    return out


def save(data: dict, directory="results", suite: str = "models") -> str:
    """``data`` as ``<directory>/<suite>-<gpu>-<date>.json``; its path."""
    import json
    from pathlib import Path

    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    m = data["meta"]
    path = d / f"{suite}-{m['gpu_slug']}-{m['date'][:10]}.json"
    path.write_text(json.dumps(data, indent=1) + "\n")
    return str(path)


# --------------------------------------------------------------------------
# Host cost against the frameworks' own matmul (64^3, back to back)


def framework_host_costs(shape=(64, 64, 64), calls: int = 2000) -> list[dict]:
    """Host microseconds of one call, torch tensors and CuPy arrays, against the framework's
    own matmul on the same operands; each case's ratio as ``torch_ratio`` / ``cupy_ratio``."""
    M, N, K = shape
    rows = []
    try:
        tw = _Torch()
    except ImportError:
        tw = None
    if tw is not None:
        for prec in ("fp32", "fp16", "bf16"):
            A, B = tw.operands(prec, M, N, K, 0)
            C = tw.t.matmul(A, B)   # the result's type, as both calls make it
            for call, ours_fn, ref_fn in (
                    ("allocating", lambda: matmul(A, B), lambda: tw.t.matmul(A, B)),
                    ("out=", lambda: matmul(A, B, out=C), lambda: tw.t.matmul(A, B, out=C))):
                # alternated, five rounds: the host's speed drifts between rounds
                pairs = [(host_us(tw, ours_fn, calls // 5), host_us(tw, ref_fn, calls // 5))
                         for _ in range(5)]
                ours = statistics.median(p[0] for p in pairs)
                ref = statistics.median(p[1] for p in pairs)
                rows.append(dict(case=f"torch {prec} {call}", input="torch", precision=prec,
                                 call=call, gemmlib_us=ours, reference="torch.matmul",
                                 reference_us=ref, torch_ratio=ours / ref))
    cw = _CuPy()
    for prec in ("fp32", "fp16"):
        A, B = cw.operands(prec, M, N, K, 0)
        ours = host_us(cw, lambda: matmul(A, B), calls)
        ref = host_us(cw, lambda: cw.cp.matmul(A, B), calls)
        rows.append(dict(case=f"cupy {prec}", input="cupy", precision=prec, gemmlib_us=ours,
                         reference="cupy.matmul", reference_us=ref, cupy_ratio=ours / ref))
    return rows
