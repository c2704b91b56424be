"""A blocked GEMM written in Triton: the serving suite's third column.

``linear(x, w, out=None)`` computes ``x @ w.T`` for an ``nn.Linear`` weight ``w`` of shape
(N, K), read where it lies through its strides (no copy, no transpose);
``matmul(a, b, out=None)`` is the general ``a @ b`` for 2-D operands of any strides.  The
result has the inputs' dtype (float16 or bfloat16 in the suite), accumulated in float32.

The kernel is the textbook blocked GEMM: each program owns a BLOCK_M x BLOCK_N tile of C
and walks K in BLOCK_K steps, ``tl.dot`` of an A tile and a B tile into a float32
accumulator (Triton pipelines the loads over ``num_stages`` buffers and picks mma/wgmma).
Programs are numbered in groups of GROUP_M row tiles, so the programs running at once
share a band of A rows and a few B columns in L2.  Rows and columns past M and N read a
valid row (row 0 of the operand) instead of masking the loads, and their results are
never stored; the last K step is masked unless K is a multiple of BLOCK_K (``EVEN_K``).
There is no split-K: a decode-sized product (M <= 16) gets one tile row, and its
parallelism is N / BLOCK_N programs.

``CONFIGS`` are the autotuner's candidates, plain dicts (triton is not imported to read
them): small BLOCK_M (16, 32) for decode and small batches, 64 for medium batches, and
128/256-row tiles for prefill-sized products.  The autotuner times, per (M, N, K) and
dtype, the candidates :func:`block_m_choices` keeps for that M, each with Triton's
``do_bench`` for ``AUTOTUNE_REP_MS`` (shorter than Triton's default, to keep a sweep of
hundreds of shapes in minutes).  The first call of a new (M, N, K, dtype) pays for that and
launches the winner; the later ones launch the jit kernel with the winner's config
directly, without the autotuner's and the heuristics' Python in between (what a caller
that tuned once would do).

Triton is imported only when a product is first computed (:func:`build`); this module
imports without it, and :func:`available` says whether it can run here.
"""

from __future__ import annotations

import functools

#: the autotuner's candidates (Triton's Config fields: the tile's meta-parameters, warps
#: and pipeline stages)
CONFIGS = (
    # decode and small batches: one 16- or 32-row tile, W streamed in long K steps
    dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, GROUP_M=1, num_warps=4, num_stages=4),
    dict(BLOCK_M=16, BLOCK_N=128, BLOCK_K=128, GROUP_M=1, num_warps=4, num_stages=4),
    dict(BLOCK_M=16, BLOCK_N=256, BLOCK_K=64, GROUP_M=1, num_warps=4, num_stages=4),
    dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=256, GROUP_M=1, num_warps=4, num_stages=3),
    dict(BLOCK_M=32, BLOCK_N=64, BLOCK_K=128, GROUP_M=4, num_warps=4, num_stages=4),
    dict(BLOCK_M=32, BLOCK_N=128, BLOCK_K=64, GROUP_M=4, num_warps=4, num_stages=4),
    # medium batches
    dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=64, GROUP_M=8, num_warps=4, num_stages=4),
    dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, num_warps=4, num_stages=4),
    dict(BLOCK_M=64, BLOCK_N=256, BLOCK_K=64, GROUP_M=8, num_warps=8, num_stages=3),
    # prefill-sized products: large tiles, every K step in one program (no split)
    dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, num_warps=4, num_stages=4),
    dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, GROUP_M=8, num_warps=8, num_stages=3),
    dict(BLOCK_M=256, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, num_warps=8, num_stages=3),
)
#: the autotuner's timing of each candidate (Triton's do_bench: milliseconds of warm-up and
#: of repeats; its defaults are 25 and 100)
AUTOTUNE_WARMUP_MS = 3
AUTOTUNE_REP_MS = 12

_META = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M")


def block_m_choices(M: int) -> tuple[int, ...]:
    """The BLOCK_M values the autotuner tries for M rows (the others are pruned unseen)."""
    if M <= 16:
        return (16,)
    if M <= 32:
        return (16, 32)
    if M <= 64:
        return (32, 64)
    if M <= 128:
        return (64, 128)
    return (64, 128, 256)


def candidates(M: int, configs=CONFIGS) -> list[dict]:
    """The configs of ``configs`` tried for M rows (all of them if none fits)."""
    keep = [c for c in configs if c["BLOCK_M"] in block_m_choices(M)]
    return keep or list(configs)


def describe(config) -> str:
    """'16x64x128 g1 w4 s4' for a config dict or a triton.Config."""
    if config is None:
        return "-"
    if not isinstance(config, dict):
        config = as_dict(config)
    return (f"{config['BLOCK_M']}x{config['BLOCK_N']}x{config['BLOCK_K']} "
            f"g{config['GROUP_M']} w{config['num_warps']} s{config['num_stages']}")


def available() -> str | None:
    """None where Triton can run products here (triton importable, torch sees a CUDA GPU,
    or ``TRITON_INTERPRET=1``); else why not."""
    import os

    try:
        import triton  # noqa: F401
    except Exception as e:   # ImportError, or a broken install
        return f"triton is not importable: {type(e).__name__}: {e}"
    if os.environ.get("TRITON_INTERPRET") == "1":
        return None
    try:
        import torch

        if not torch.cuda.is_available():
            return "torch sees no CUDA GPU"
    except Exception as e:
        return f"torch is not importable: {type(e).__name__}: {e}"
    return None


def time_candidate(fn, quantiles):
    """The autotuner's timing of one candidate (milliseconds at ``quantiles``): Triton's
    ``do_bench`` for AUTOTUNE_REP_MS after AUTOTUNE_WARMUP_MS of warm-up."""
    from triton.testing import do_bench

    return do_bench(fn, warmup=AUTOTUNE_WARMUP_MS, rep=AUTOTUNE_REP_MS, quantiles=quantiles)


#: (M, N, K, dtype) -> the config the autotuner chose (a dict of CONFIGS' fields)
CHOSEN: dict = {}
_LAST = [None]


@functools.lru_cache(maxsize=None)
def build():
    """The kernels, built on first use: (the jit kernel, launched with an explicit config
    and EVEN_K, and the autotuned kernel, which sets EVEN_K by a heuristic).  Imports
    triton."""
    import inspect

    import triton
    import triton.language as tl

    @triton.jit(do_not_specialize=["M"])   # one build serves every token count
    def gemm_kernel(a_ptr, b_ptr, c_ptr, M, N, K,
                    stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    GROUP_M: tl.constexpr, EVEN_K: tl.constexpr):
        pid = tl.program_id(0)
        tiles_m = tl.cdiv(M, BLOCK_M)
        tiles_n = tl.cdiv(N, BLOCK_N)
        # Program numbers in groups of GROUP_M row tiles, column by column inside a group:
        # the programs resident together read the same few A rows and B columns.
        in_group = GROUP_M * tiles_n
        first_m = (pid // in_group) * GROUP_M
        rows_here = tl.minimum(tiles_m - first_m, GROUP_M)
        pid_m = first_m + (pid % in_group) % rows_here
        pid_n = (pid % in_group) // rows_here

        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        rk = tl.arange(0, BLOCK_K)
        # past the edge, read row/column 0 (always there) rather than mask every load
        am = tl.where(rm < M, rm, 0).to(tl.int64)
        bn = tl.where(rn < N, rn, 0).to(tl.int64)
        a_tile = a_ptr + am[:, None] * stride_am + rk[None, :] * stride_ak
        b_tile = b_ptr + rk[:, None] * stride_bk + bn[None, :] * stride_bn
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(0, tl.cdiv(K, BLOCK_K)):
            if EVEN_K:
                a = tl.load(a_tile)
                b = tl.load(b_tile)
            else:
                k_left = K - k * BLOCK_K
                a = tl.load(a_tile, mask=rk[None, :] < k_left, other=0.0)
                b = tl.load(b_tile, mask=rk[:, None] < k_left, other=0.0)
            acc += tl.dot(a, b)
            a_tile += BLOCK_K * stride_ak
            b_tile += BLOCK_K * stride_bk
        c = acc.to(c_ptr.dtype.element_ty)
        c_tile = (c_ptr + rm.to(tl.int64)[:, None] * stride_cm
                  + rn.to(tl.int64)[None, :] * stride_cn)
        tl.store(c_tile, c, mask=(rm[:, None] < M) & (rn[None, :] < N))

    kernel = triton.heuristics({"EVEN_K": lambda args: args["K"] % args["BLOCK_K"] == 0})(
        gemm_kernel)

    def prune(configs, named_args, **kwargs):
        keep = [c for c in configs if c.kwargs["BLOCK_M"] in block_m_choices(named_args["M"])]
        return keep or configs

    configs = [triton.Config({k: c[k] for k in _META}, num_warps=c["num_warps"],
                             num_stages=c["num_stages"]) for c in CONFIGS]
    bench = {}
    takes = inspect.signature(triton.autotune).parameters
    if "do_bench" in takes:      # Triton >= 3.2: the timing function itself
        bench["do_bench"] = lambda fn, quantiles: time_candidate(fn, quantiles)
    elif "rep" in takes:         # older: its warm-up and repeat times
        bench.update(warmup=AUTOTUNE_WARMUP_MS, rep=AUTOTUNE_REP_MS)
    tuned = triton.autotune(configs=configs, key=["M", "N", "K"],
                            prune_configs_by={"early_config_prune": prune}, **bench)(kernel)
    return gemm_kernel, tuned


def _check(a, b, out):
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"matmul of 2-D operands (M, K) @ (K, N); got {tuple(a.shape)} @ "
                         f"{tuple(b.shape)}")
    if a.dtype != b.dtype:
        raise TypeError(f"operands of one dtype; got {a.dtype} and {b.dtype}")
    M, N = a.shape[0], b.shape[1]
    if out is None:
        import torch

        out = torch.empty((M, N), dtype=a.dtype, device=a.device)
    elif tuple(out.shape) != (M, N) or out.dtype != a.dtype:
        raise ValueError(f"out must be ({M}, {N}) of {a.dtype}; got {tuple(out.shape)} of "
                         f"{out.dtype}")
    return out


def matmul(a, b, out=None, config: dict | None = None):
    """C = a @ b (torch tensors, 2-D, any strides) in the inputs' dtype, into ``out`` when
    given.  ``config``: launch that config (a dict of CONFIGS' fields) instead of the
    autotuned choice."""
    out = _check(a, b, out)
    M, K = a.shape
    N = b.shape[1]
    if M == 0 or N == 0:
        return out
    if K == 0:
        return out.zero_()
    kernel, tuned = build()
    args = (a, b, out, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
            out.stride(0), out.stride(1))
    if config is None:
        key = (M, N, K, a.dtype)
        config = CHOSEN.get(key)
        if config is None:   # the first product of its shape and dtype: tune, run the winner
            tuned[lambda meta: (-(-M // meta["BLOCK_M"]) * -(-N // meta["BLOCK_N"]),)](*args)
            config = CHOSEN[key] = as_dict(tuned.best_config)
            _LAST[0] = config
            return out
    _LAST[0] = config
    bm, bn, bk = config["BLOCK_M"], config["BLOCK_N"], config["BLOCK_K"]
    kernel[(-(-M // bm) * -(-N // bn),)](
        *args, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=config["GROUP_M"],
        EVEN_K=K % bk == 0, num_warps=config["num_warps"], num_stages=config["num_stages"])
    return out


def linear(x, w, out=None, config: dict | None = None):
    """``x @ w.T`` for an ``nn.Linear`` weight ``w`` (N, K), read as it lies."""
    return matmul(x, w.t(), out, config)


def as_dict(config) -> dict:
    """A triton.Config as a dict of CONFIGS' fields."""
    return dict({k: config.kwargs[k] for k in _META}, num_warps=config.num_warps,
                num_stages=config.num_stages)


def last_config() -> dict | None:
    """The config of the last product launched (a dict of CONFIGS' fields), or None."""
    return _LAST[0]
