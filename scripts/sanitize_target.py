"""Run gemmlib kernels once each, for compute-sanitizer to watch (see scripts/sanitize.py).

    python3 scripts/sanitize_target.py KERNEL[,KERNEL...|all|hopper] SHAPE[,SHAPE...]

KERNEL is a rung name, or ``rung:precision`` for a tensor-core rung in another
precision than its default (``mma_pipeline:3xtf32``, ``wgmma_ws:bf16``).  Inputs
have the kernel's input dtype: float32 (fp32, tf32, 3xtf32), float16, bfloat16
(a :class:`gemmlib.precision.BF16Array` of the bit patterns, what
``gemmlib.matmul`` takes from NumPy/CuPy), or for ``wgmma_fp8:e4m3`` /
``wgmma_fp8:e5m2`` uint8 arrays of FP8 bit patterns with per-tensor scales.
The FP8 rung's output and B layout can follow: ``wgmma_fp8:e4m3:fp32:KN``
(default ``bf16`` and ``NK``, B given (N, K) as ``torch._scaled_mm`` takes it).
Another build of a rung follows its precision as ``KEY=VALUE`` items:
``wgmma_store:fp16:OUT=fp16:STAGES=4:PIECES=2`` (what ``auto`` runs for a 16-bit C on
Hopper; a 16-bit C's tolerance adds half an ulp of its type).
``hopper`` is :func:`hopper`: every Hopper rung in each of its precisions.

SHAPE is MxNxK or ``tile+`` (one past a block tile in every dimension, with N
and K multiples of 4 so the float4 paths run), optionally followed by

* ``@G``: persistent rungs (whose blocks walk tiles ``blockIdx.x, + gridDim.x,
  ...``) are launched with at most G blocks, so each block walks several tiles
  and its mbarrier ring wraps across tiles, without a problem big enough to
  fill every SM (which would be far too slow under the sanitizers).  Other
  rungs ignore it.
* ``/S``: split-K rungs with K cut into S slices (``SPLITS=S``, a launch
  parameter: the compiled kernel is the same); other rungs ignore it.

Reference and tolerance: float64 of the values the kernel reads (the
bf16-rounded values for bf16; :func:`gemmlib.fp8.reference` of the
dequantised bit patterns and :func:`gemmlib.fp8.tolerance` for FP8) against
:func:`gemmlib.verify.spec_tolerance`.

Inputs are made on the host and copied (the product itself runs only gemmlib
kernels, plus the small CuPy copies that stage padded operands), and CuPy's
memory pool is switched off on the GPU: every array is its own cudaMalloc, so
memcheck knows each allocation's bounds (``--padding`` then catches overruns
into a neighbour) and initcheck sees fresh memory, not a pool block another
array initialised before.  Prints one ``@@ kernel shape ok|WRONG|REFUSED``
line per run; exits 2 if a result is wrong.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import os
import re
import sys

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "0")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import numpy as np  # noqa: E402

import gemmlib  # noqa: E402
from gemmlib import backend, dispatch  # noqa: E402
from gemmlib.kernels import LADDER, SCALED, build_params, get  # noqa: E402
from gemmlib.spec import ConstraintError  # noqa: E402
from gemmlib.verify import spec_tolerance  # noqa: E402

#: the FP8 rung's forms: both formats as torch._scaled_mm takes them (bf16 out, B given
#: (N, K)), and the fp32 output with B given (K, N) (its transpose pre-pass)
FP8_FORMS = ("e4m3", "e5m2", "e4m3:fp32:KN")

#: the default shapes: odd edges (scalar paths, padded staging), one past a tile
DEFAULT_SHAPES = "67x45x37,tile+"
#: for the Hopper rungs also several k-tiles (more than STAGES: the ring refills), K a
#: multiple of 16 (no staging copy; the FP8 KN form reads B as given), 3 x 3 tiles of
#: 128 x 256 (3 x 5 of 128 x 128) walked by at most 4 persistent blocks, split-K in 3 slices
HOPPER_SHAPES = DEFAULT_SHAPES + ",300x520x528@4/3"

SHAPE = re.compile(r"^(tile\+|\d+x\d+x\d+)(?:@(\d+))?(?:/(\d+))?$")
#: a kernel whose blocks walk the tiles (or units) with a grid stride, or by a walk of
#: ``wgmma_split_k.split_kernel`` (``unit_at``: slices or stream-K, for any gridDim.x): any
#: grid is right
GRID_STRIDE = re.compile(r"range\(\s*cuda\.blockIdx\.x\s*,\s*\w+\s*,\s*cuda\.gridDim\.x\s*\)"
                         r"|\+=\s*cuda\.gridDim\.x|\bunit_at\(")


@functools.lru_cache(maxsize=None)
def hopper() -> tuple[str, ...]:
    """Every Hopper rung (``min_cc`` 9.0: wgmma_async, wgmma_tma, wgmma_ws, wgmma_split_k,
    wgmma_tf32, wgmma_fp8 and any later one) in each precision it computes in: fp16 and
    bf16 where it takes them, the FP8 rung in :data:`FP8_FORMS`, else its own (tf32); then
    the builds ``auto`` runs for a 16-bit C (:data:`gemmlib.dispatch.HOPPER_OUT16`) and at
    a few tokens (``wgmma_swap``, ``KT=HOPPER_SWAP_KT``)."""
    out = []
    for rung in LADDER:
        if tuple(get(rung).min_cc) < (9, 0):
            continue
        if rung in SCALED:
            out += [f"{rung}:{form}" for form in FP8_FORMS]
            continue
        precisions = []
        for p in ("fp16", "bf16"):
            try:
                dispatch.get_spec(rung, p)
                precisions.append(p)
            except ValueError:   # a rung of one other precision (wgmma_tf32)
                pass
        out += [f"{rung}:{p}" for p in precisions] or [rung]
    # and the build "auto" runs for a C in the inputs' 16-bit type (dispatch.HOPPER_OUT16)
    rung, params = dispatch.HOPPER_OUT16
    kv = "".join(f":{k}={v}" for k, v in params.items())
    out += [f"{rung}:{p}:OUT={p}{kv}" for p in ("fp16", "bf16")]
    # and swap-AB as auto builds it at a few tokens: stages two k-tiles deep, B as (K, N)
    out += [f"{dispatch.HOPPER_SWAP}:{p}:KT={dispatch.HOPPER_SWAP_KT}:STAGES=0:B_LAYOUT=KN"
            for p in ("fp16", "bf16")]
    return tuple(out)


def expand(names: str) -> list[str]:
    """``all`` (the ladder in its default precisions), ``hopper`` (:func:`hopper`) and
    rung names, comma-separated, in order and without repeats."""
    out: list[str] = []
    for tok in (t.strip() for t in names.split(",")):
        for name in (LADDER if tok == "all" else hopper() if tok == "hopper" else (tok,)):
            if name and name not in out:
                out.append(name)
    return out


def parse_shape(text: str):
    """(base, blocks, splits): ``"300x520x528@4/3"`` -> ("300x520x528", 4, 3)."""
    m = SHAPE.match(text.strip().lower())
    if not m:
        raise ValueError(f"shape {text!r}: want MxNxK or tile+, then optionally @BLOCKS "
                         f"and /SLICES (e.g. 300x520x528@4/3)")
    return m.group(1), int(m.group(2)) if m.group(2) else None, (
        int(m.group(3)) if m.group(3) else None)


def shape_for(spec, text: str):
    if text == "tile+":
        tm, tn = spec.tile
        return tm + 3, tn + 4, max(2 * spec.k_tile, 16) + 4
    M, N, K = (int(v) for v in text.lower().split("x"))
    return M, N, K


def kernel_spec(name: str):
    """The spec a KERNEL argument names (see the module docstring)."""
    rung, *rest = name.split(":")
    if rung in SCALED:   # wgmma_fp8:FMT[:OUT[:LAYOUT]]
        from gemmlib import fp8

        fmt = rest[0] if rest else "e4m3"
        out = rest[1] if len(rest) > 1 else "bf16"
        layout = rest[2].upper() if len(rest) > 2 else "NK"
        return fp8.spec_for(fmt, out, layout)
    spec = dispatch.get_spec(rung, rest[0]) if rest else get(rung)
    if len(rest) > 1:   # rung:PRECISION:KEY=VALUE...: another build of the rung
        params = {k: v for k, v in spec.params.items() if k != "BK"}
        spec = dispatch.build(rung, dict(params, **build_params(rest[1:])))
    return spec


def grid_strided(spec) -> bool:
    """True when the kernel's blocks loop over the tiles with stride gridDim.x (a
    persistent kernel: any number of blocks computes every tile)."""
    fn = getattr(spec.kernel, "py_func", None) or getattr(spec.kernel, "fn", None)
    body = getattr(fn, "__globals__", {}).get("body")   # a kernel that calls its body
    if body is not None:                                 # (wgmma_async.bias_entry)
        fn = getattr(body, "py_func", None) or body
    try:
        return bool(GRID_STRIDE.search(inspect.getsource(fn)))
    except (TypeError, OSError):
        return False


def with_blocks(spec, blocks: int):
    """``spec`` launched with at most ``blocks`` blocks along x (a persistent kernel
    walks the rest).  The compiled kernel is the same object (and cache entry)."""
    grid = spec.grid

    def capped(M, N, K):
        gx, gy, gz = grid(M, N, K)
        return (min(gx, blocks), gy, gz)

    return dataclasses.replace(spec, grid=capped)


def with_splits(spec, splits: int):
    """A split-K rung's spec with K in ``splits`` slices (None when it has no SPLITS)."""
    if "SPLITS" not in spec.params or "SPLITS" not in spec.launch_only:
        return None
    takes = inspect.signature(importlib.import_module(spec.module).build).parameters
    anything = any(p.kind is p.VAR_KEYWORD for p in takes.values())
    params = {k: v for k, v in spec.params.items() if anything or k in takes}
    params["SPLITS"] = splits
    try:
        split = dispatch.build(spec.module.rsplit(".", 1)[-1], params)
    except (TypeError, ValueError):
        return None
    # the same compiled kernel, only launched differently; else leave the shape unsplit
    return split if split.code_params == spec.code_params else None


def inputs_16_32(spec, M, N, K, rng, nt):
    """(A, B as the GPU takes them, float64 A, float64 B) for the fp32/tf32/fp16/bf16 rungs."""
    from gemmlib.precision import BF16Array, bf16_bits_to_float32, to_bf16_bits

    xp = backend.array_module()
    A = rng.uniform(-1, 1, (M, K)).astype(np.float32)
    B = rng.uniform(-1, 1, (N, K) if nt else (K, N)).astype(np.float32)
    if spec.dtype == "bfloat16":
        bits = [to_bf16_bits(x) for x in (A, B)]
        dev = [BF16Array(xp.asarray(b)) for b in bits]
        ref = [bf16_bits_to_float32(b).astype(np.float64) for b in bits]
        return dev[0], dev[1], ref[0], ref[1]
    A, B = A.astype(spec.dtype), B.astype(spec.dtype)
    return xp.asarray(A), xp.asarray(B), A.astype(np.float64), B.astype(np.float64)


def run_16_32(spec, M, N, K, rng):
    from gemmlib.precision import BF16Array, bf16_bits_to_float32

    nt = spec.b_operand == "NK"
    A, B, a, b = inputs_16_32(spec, M, N, K, rng, nt)
    ref = a @ (b.T if nt else b)
    own = {} if spec.out_dtype == "uint16" else {"out_dtype": np.float32}   # as it writes
    C = gemmlib.matmul(A, B, kernel=spec, transpose_b=nt, **own)
    backend.synchronize()
    tol = spec_tolerance(spec, K)   # with a 16-bit C's own rounding
    if isinstance(C, BF16Array):
        return bf16_bits_to_float32(backend.to_host(C.bits)).astype(np.float64), ref, tol
    return backend.to_host(C).astype(np.float64), ref, tol


def run_fp8(spec, M, N, K, rng):
    """Random finite values of the format (|v| <= 16) as bit patterns, per-tensor scales."""
    from gemmlib import fp8
    from gemmlib.intrinsics.hopper import fp8_values
    from gemmlib.precision import bf16_bits_to_float32

    xp = backend.array_module()
    fmt, nt = spec.precision, spec.b_operand == "NK"
    vals = fp8_values(fmt)
    finite = np.flatnonzero(np.isfinite(vals) & (np.abs(vals) <= 16))
    A8 = rng.choice(finite, size=(M, K)).astype(np.uint8)
    B8 = rng.choice(finite, size=(N, K) if nt else (K, N)).astype(np.uint8)
    sa, sb = 0.375, 1.25                       # exact in float32, product not a power of 2
    C = gemmlib.matmul(xp.asarray(A8), xp.asarray(B8), kernel=spec, precision=fmt,
                       scale_a=sa, scale_b=sb, transpose_b=nt)
    backend.synchronize()
    raw = backend.to_host(getattr(C, "bits", C))   # a bf16 result is a BF16Array
    out = spec.params["OUT"]
    C = bf16_bits_to_float32(raw) if out == "bf16" else raw
    ref = fp8.reference(A8, B8, fmt, sa, sb, "NK" if nt else "KN")
    return np.asarray(C, dtype=np.float64), ref, fp8.tolerance(K, out)


def main(argv) -> int:
    names = expand(argv[1])
    shapes = (argv[2] if len(argv) > 2 else DEFAULT_SHAPES).split(",")
    if not backend.SIMULATOR:
        import cupy

        cupy.cuda.set_allocator(None)   # one cudaMalloc per array (see the docstring)
    bad = 0
    for name in names:
        spec = kernel_spec(name)
        scaled = spec.module.rsplit(".", 1)[-1] in SCALED
        if not scaled and spec.dtype not in ("float32", "float16", "bfloat16"):
            print(f"@@ {name} - SKIPPED (no input for {spec.dtype})", flush=True)
            continue
        if not backend.SIMULATOR and tuple(backend.device_info().compute_capability) < spec.min_cc:
            print(f"@@ {name} - SKIPPED (needs sm_{spec.min_cc[0]}{spec.min_cc[1]})", flush=True)
            continue
        for text in shapes:
            base, blocks, splits = parse_shape(text)
            run = spec
            label = ""
            if splits and (s := with_splits(spec, splits)) is not None:
                run, label = s, f"/{splits}"
            if blocks and grid_strided(run):
                run, label = with_blocks(run, blocks), f"@{blocks}" + label
            M, N, K = shape_for(spec, base)
            rng = np.random.default_rng(M * 7919 + N * 31 + K)
            try:
                C, ref, tol = (run_fp8 if scaled else run_16_32)(run, M, N, K, rng)
            except ConstraintError as e:
                print(f"@@ {name} {M}x{N}x{K}{label} REFUSED {e}", flush=True)
                continue
            err = float(np.linalg.norm(C - ref) / max(np.linalg.norm(ref), 1e-30))
            ok = bool(np.isfinite(C).all()) and err <= tol
            bad += not ok
            print(f"@@ {name} {M}x{N}x{K}{label} {'ok' if ok else 'WRONG'} rel.err {err:.2e} "
                  f"(tol {tol:.1e})", flush=True)
    return 2 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
