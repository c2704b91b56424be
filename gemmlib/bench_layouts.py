"""Every operand layout, timed as a caller receives it: ``python -m gemmlib bench --suite
layouts`` writes ``results/layouts-<gpu>-<date>.json``.

A layout names how A and B lie in memory, as BLAS does: ``N`` row-major, ``T`` the
transpose of a row-major array (column-major).  ``NT`` is ``F.linear``'s ``x @ W.t()``
with an ``nn.Linear`` weight; ``TN`` is a weight gradient's ``dY.t() @ X``.  Each row
times ``gemmlib.matmul(A, B)`` on torch views of that layout against ``torch.matmul`` on
the same views, in the same loop method as the models suite (CUDA events around a loop
of back-to-back calls cycling through operand copies that do not fit in L2), and
``pct_of_nn`` compares gemmlib's time with its own row-major (``NN``) time for the shape.
A shape's layouts are timed round by round (one loop of each layout's calls and of
torch's per round, five rounds), and both percentages are medians of the rounds' ratios:
a clock or power drift between two layouts' loops then touches both.  ``batched`` rows
time ``(b, M, K) @ (b, K, N)`` against ``torch.bmm`` the same way.
"""

from __future__ import annotations

import math
import statistics

from gemmlib import backend, bench_models, dispatch
from gemmlib.api import matmul
from gemmlib.bench_models import (MODELS, copy_bandwidth, loop_time, operand_sets,
                                  projections)

LAYOUTS = ("NN", "NT", "TN", "TT")
PRECISIONS = ("fp16", "bf16", "tf32", "fp32")
SQUARES = (4096, 8192)
#: the models suite's projections at these token counts (M >= 512), every layout
TOKENS = (1024, 4096)
#: and at these (decode and small prefill), F.linear's layout against row-major only
LINEAR_TOKENS = (1, 16, 128)
LINEAR_LAYOUTS = ("NN", "NT")
LINEAR_PRECISIONS = ("fp16", "bf16")
#: (batch, M = N, K) of attention-like batched products
BATCHED = ((32, 1024, 128), (256, 128, 64), (32, 4096, 128), (256, 1024, 64))

_TORCH_DTYPE = {"fp16": "float16", "bf16": "bfloat16", "tf32": "float32", "fp32": "float32"}
_KERNEL_TYPE = {"fp16": "fp16", "bf16": "bf16"}


def shapes(squares=SQUARES, tokens=TOKENS, models=tuple(MODELS)) -> list[tuple]:
    """(label, M, N, K) of the suite."""
    out = [(f"{n}^3", n, n, n) for n in squares]
    for model in models:
        for layer, N, K in projections(model):
            out += [(f"{model} {layer} T={t}", t, N, K) for t in tokens]
    return out


def operands(torch, layout: str, precision: str, M: int, N: int, K: int, seed: int):
    """A (M, K) and B (K, N) as views of the layout, fresh random values."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    dt = getattr(torch, _TORCH_DTYPE[precision])

    def make(rows, cols, transposed):
        shape = (cols, rows) if transposed else (rows, cols)
        x = (torch.rand(shape, generator=g, device="cuda") * 2 - 1).to(dt)
        return x.t() if transposed else x

    return make(M, K, layout[0] == "T"), make(K, N, layout[1] == "T")


def _tf32(torch, on: bool):
    torch.backends.cuda.matmul.allow_tf32 = on
    torch.backends.cudnn.allow_tf32 = on


class _Side:
    """One layout of a shape, ready to time: gemmlib's and torch's calls over operand
    copies rotated past L2, the error of gemmlib's product against float64."""

    def __init__(self, torch, fw, layout, precision, M, N, K, seed, target_ms):
        call_prec = "tf32" if precision == "tf32" else None
        A, B = operands(torch, layout, precision, M, N, K, seed)
        sets = operand_sets(A.element_size() * (M * K + K * N),
                            backend.device_info().l2_bytes)
        self.pairs = [(A, B)] + [operands(torch, layout, precision, M, N, K, seed + 1 + i)
                                 for i in range(sets - 1)]
        self.ours = [(lambda a=a, b=b: matmul(a, b, precision=call_prec))
                     for a, b in self.pairs]
        self.theirs = [(lambda a=a, b=b: torch.matmul(a, b)) for a, b in self.pairs]
        C = self.ours[0]()
        R = torch.matmul(A.double(), B.double())
        self.err = float((C.double() - R).norm() / R.norm().clamp_min(1e-30))
        del C, R
        probe = loop_time(fw, self.ours, 2, 1)[0]
        self.per_loop = int(min(200, max(3, target_ms / max(probe, 1e-3))))
        self.sets = sets
        self.ms, self.ref_ms = [], []

    def time_round(self, fw):
        self.ms += loop_time(fw, self.ours, self.per_loop, 1)
        self.ref_ms += loop_time(fw, self.theirs, self.per_loop, 1)


def measure_layouts(torch, label: str, layouts, precision: str, M: int, N: int, K: int, *,
                    loops: int = 5, target_ms: float = 20.0, seed: int = 0) -> list[dict]:
    """Rows of one shape and precision in every layout of ``layouts``, timed round by
    round: each round one loop of every layout's gemmlib calls and of its torch calls, the
    layouts' order rotating, so clock or power drift lands on all alike.  ``pct_torch``
    and ``pct_of_nn`` are medians of the rounds' ratios (gemmlib's NN loop of the same
    round as the reference); a layout that fails gets a row with its ``error``."""
    fw = bench_models.framework("torch")   # (it turns TF32 off: set it after)
    _tf32(torch, precision == "tf32")
    sides, rows = {}, {}
    for layout in layouts:
        try:
            sides[layout] = _Side(torch, fw, layout, precision, M, N, K, seed, target_ms)
        except Exception as e:   # recorded, never hidden
            rows[layout] = _failed(label, layout, precision, M, N, K, e)
    order = list(sides)
    for r in range(loops):
        for layout in order[r % len(order):] + order[:r % len(order)] if order else ():
            side = sides[layout]
            try:
                side.time_round(fw)
            except Exception as e:
                rows[layout] = _failed(label, layout, precision, M, N, K, e)
    nn = sides.get("NN") if "NN" not in rows else None
    for layout, side in sides.items():
        if layout in rows:
            continue
        ms = statistics.median(side.ms)
        row = dict(suite="layouts", shape=label, layout=layout, precision=precision, M=M,
                   N=N, K=K, gemmlib_ms=ms, torch_ms=statistics.median(side.ref_ms),
                   pct_torch=100.0 * statistics.median(t / g for t, g in
                                                       zip(side.ref_ms, side.ms)),
                   rel_error=side.err, kernel=_kernel(precision, layout, M, N, K),
                   calls_per_loop=side.per_loop, operand_sets=side.sets, rounds=len(side.ms))
        if nn is not None:
            row["pct_of_nn"] = 100.0 * statistics.median(a / b for a, b in
                                                         zip(nn.ms, side.ms))
        rows[layout] = row
    del sides
    return [rows[layout] for layout in layouts if layout in rows]


def _failed(label, layout, precision, M, N, K, e) -> dict:
    return dict(suite="layouts", shape=label, layout=layout, precision=precision, M=M, N=N,
                K=K, error=f"{type(e).__name__}: {e}")


def _kernel(precision: str, layout: str, M: int, N: int, K: int) -> str:
    """The rung ``auto`` runs (K-major build for a column-major B, where there is one)."""
    if precision == "fp32":
        spec = dispatch.select(M, N, K)
    else:
        out = {"fp16": "fp16", "bf16": "bf16"}.get(precision, "fp32")
        spec = dispatch.select_tc(precision, M, N, K, out=out,
                                  b_layout="NK" if layout[1] == "T" else "KN")
    if layout[1] == "T":
        nk = dispatch.with_layout(spec, "NK")
        return nk.name if nk is not None else spec.name + " (B copied)"
    return spec.name


def measure_batched(torch, b: int, M: int, K: int, precision: str, *, loops: int = 5,
                    target_ms: float = 20.0) -> dict:
    """``matmul(A, B)`` of (b, M, K) and (b, K, N) stacks (N = M) against ``torch.bmm``,
    a loop of each per round, ``pct_torch`` the median of the rounds' ratios."""
    N = M
    fw = bench_models.framework("torch")
    dt = getattr(torch, _TORCH_DTYPE[precision])
    g = torch.Generator(device="cuda").manual_seed(1)
    A = (torch.rand((b, M, K), generator=g, device="cuda") * 2 - 1).to(dt)
    B = (torch.rand((b, K, N), generator=g, device="cuda") * 2 - 1).to(dt)
    ours, theirs = [lambda: matmul(A, B)], [lambda: torch.bmm(A, B)]
    C = ours[0]()
    R = torch.bmm(A.double(), B.double())
    err = float((C.double() - R).norm() / R.norm())
    del C, R
    probe = loop_time(fw, ours, 1, 1)[0]
    per_loop = int(min(100, max(2, target_ms / max(probe, 1e-3))))
    ms, ref_ms = [], []
    for _ in range(loops):
        ms += loop_time(fw, ours, per_loop, 1)
        ref_ms += loop_time(fw, theirs, per_loop, 1)
    spec = dispatch.select_batched(_KERNEL_TYPE[precision], M, N, K, _KERNEL_TYPE[precision],
                                   "KN", False)
    return dict(suite="layouts", layout="batched", precision=precision, batch=b, M=M, N=N,
                K=K, gemmlib_ms=statistics.median(ms), torch_ms=statistics.median(ref_ms),
                pct_torch=100.0 * statistics.median(t / o for t, o in zip(ref_ms, ms)),
                rel_error=err, reference="torch.bmm", calls_per_loop=per_loop,
                kernel=spec.name if spec is not None else "one product per entry")


def run_suite(precisions=PRECISIONS, layouts=LAYOUTS, squares=SQUARES, tokens=TOKENS,
              batched=BATCHED, linear_tokens=LINEAR_TOKENS, loops: int = 5,
              progress: bool = True, on_row=None) -> dict:
    """Every shape x layout x precision; the models' projections at ``linear_tokens`` in
    F.linear's layout and row-major (fp16, bf16); then the batched rows (GPU only, torch).
    ``on_row(data)``: called after every row (e.g. to save what is measured so far)."""
    import torch

    from gemmlib.bench import environment

    if backend.SIMULATOR:
        raise RuntimeError("the layouts suite times GPU calls: run it on a GPU")
    meta = environment()
    meta["dram_copy_gbps"] = copy_bandwidth()
    meta.update(suite="layouts", layouts=list(layouts), precisions=list(precisions),
                tokens=list(tokens), squares=list(squares), loops=loops,
                linear_tokens=list(linear_tokens),
                timing="events around a loop of back-to-back calls, operands rotated past "
                       "L2; torch.matmul on the same views in the same run; a shape's "
                       "layouts timed round by round, ratios the medians of the rounds'")
    rows = []
    data = {"meta": meta, "rows": rows}

    def record(row):
        rows.append(row)
        torch.cuda.empty_cache()
        if progress:
            print(_line(row), flush=True)
        if on_row:
            on_row(data)

    plan = [(shape, precisions, layouts) for shape in shapes(squares, tokens)]
    plan += [(shape, LINEAR_PRECISIONS, LINEAR_LAYOUTS)
             for shape in shapes((), linear_tokens)]
    for (label, M, N, K), precs, lays in plan:
        for prec in precs:
            try:
                found = measure_layouts(torch, label, lays, prec, M, N, K, loops=loops)
            except Exception as e:   # outside every layout (e.g. out of memory)
                found = [_failed(label, layout, prec, M, N, K, e) for layout in lays]
            for row in found:
                record(row)
    for b, M, K in batched:
        for prec in ("fp16", "bf16"):
            try:
                row = measure_batched(torch, b, M, K, prec, loops=loops)
            except Exception as e:
                row = dict(suite="layouts", layout="batched", precision=prec, batch=b, M=M,
                           N=M, K=K, error=f"{type(e).__name__}: {e}")
            record(row)
    _tf32(torch, False)
    return data


def _line(r: dict) -> str:
    shape = f"{r['M']}x{r['N']}x{r['K']}" + (f" b={r['batch']}" if "batch" in r else "")
    head = f"{r['precision']:<5}{r['layout']:<8}{shape:<22}"
    if "error" in r:
        return head + " ERROR " + r["error"]
    nn = f" {r['pct_of_nn']:6.1f}% of NN" if "pct_of_nn" in r else ""
    return (head + f"{r['gemmlib_ms'] * 1e3:9.1f} us  torch {r['torch_ms'] * 1e3:9.1f} us "
            f"{r['pct_torch']:6.1f}%{nn}  err {r['rel_error']:.1e}  {r.get('kernel', '')}")


def summary(data: dict) -> list[str]:
    """Geometric means of pct_torch and pct_of_nn per precision and layout."""
    out = []
    rows = [r for r in data["rows"] if "error" not in r]
    for prec in sorted({r["precision"] for r in rows}):
        for layout in LAYOUTS + ("batched",):
            rs = [r for r in rows if r["precision"] == prec and r["layout"] == layout]
            if not rs:
                continue
            gm = math.exp(sum(math.log(r["pct_torch"]) for r in rs) / len(rs))
            line = f"{prec} {layout}: {gm:.1f}% of torch (geometric mean of {len(rs)})"
            nn = [r["pct_of_nn"] for r in rs if "pct_of_nn" in r]
            if nn and layout != "NN":
                line += f", {min(nn):.1f}-{max(nn):.1f}% of NN"
            out.append(line)
    errs = [r for r in data["rows"] if "error" in r]
    if errs:
        out.append(f"{len(errs)} rows failed (see their 'error')")
    return out


def save(data: dict, directory="results") -> str:
    for r in data["rows"]:
        r["gpu"] = data["meta"].get("gpu")
    return bench_models.save(data, directory, "layouts")
