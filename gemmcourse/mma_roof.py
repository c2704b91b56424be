"""How fast can ``mma.sync`` go at all?  A kernel of nothing but tensor-core instructions.

The production rung (``mma_pipeline``) is compared with cuBLAS, which on a
Hopper GPU issues ``wgmma`` -- a different instruction that ``mma.sync``
cannot match.  This module measures the ceiling of the instruction the
course uses: every warp issues ``CHAINS`` independent ``mma.sync`` per
iteration on fragments that never leave the registers (no memory traffic,
no address math), enough independent chains that the latency of one never
stalls the next.  What it reaches is the most an ``mma.sync`` GEMM could
reach on this GPU; the gap between it and cuBLAS is the instruction's, the
gap between it and ``mma_pipeline`` is ours.

``python scripts/mma_roof.py`` writes ``results/mma-roof-<gpu>.json``.
"""

from __future__ import annotations

from gemmlib import backend
from gemmlib.backend import cuda, float32, uint32
from gemmlib.intrinsics import mma as I
from gemmlib.layout import jit as jit_source

#: flops of one instruction: 2 * M * N * K of its atom
FLOPS = {p: 2 * a["shape"][0] * a["shape"][1] * a["shape"][2] for p, a in I.ATOMS.items()}

#: register patterns of small finite inputs (no overflow over millions of adds)
_ONE_SMALL = {"fp16": 0x1C001C00,    # two halves of 2**-8
              "bf16": 0x3B803B80,    # two bfloat16 2**-8
              "tf32": 0x3B800000}    # float32 2**-8


def loop_source(chains: int) -> str:
    """``spin(a, b, iters, out)``: ``chains`` independent accumulators, straight-line."""
    regs = [f"c{j}_{v}" for j in range(chains) for v in range(4)]
    out = ["def spin(a, b, iters, out):"]
    out += [f"    {r} = float32(0.0)" for r in regs]
    out.append("    for _ in range(iters):")
    for j in range(chains):
        c = ", ".join(f"c{j}_{v}" for v in range(4))
        out.append(f"        {c} = mma(a, a, a, a, b, b, {c})")
    total = " + ".join(regs)
    out.append(f"    out[cuda.grid(1)] = {total}")  # keeps every chain alive
    return "\n".join(out) + "\n"


def build(precision: str = "fp16", chains: int = 8):
    """The spinning kernel for ``precision`` ("fp16", "bf16", "tf32")."""
    if precision not in FLOPS:
        raise ValueError(f"precision must be one of {', '.join(FLOPS)}, got {precision!r}")
    spin = jit_source(loop_source(chains), device=True,
                      env=dict(mma=I.MMA[precision], float32=float32, cuda=cuda))
    pattern = _ONE_SMALL[precision]

    @cuda.jit
    def mma_roof_kernel(iters, out):
        v = uint32(pattern + cuda.threadIdx.x % 2)   # data the compiler cannot fold
        spin(v, v, iters, out)

    return mma_roof_kernel


def measure(precision: str = "fp16", chains: int = 8, iters: int = 4096,
            warps_per_block: int = 4, blocks_per_sm: int = 8, reps: int = 10) -> dict:
    """TFLOP/s of back-to-back ``mma.sync`` on this GPU (median of ``reps`` timed runs)."""
    import numpy as np

    from gemmlib.bench import time_fn

    backend.require_device()
    dev = backend.device_info()
    kernel = build(precision, chains)
    blocks = dev.sm_count * blocks_per_sm
    threads = warps_per_block * 32
    out = cuda.device_array(blocks * threads, dtype=np.float32)
    launch = kernel[blocks, threads]

    def run():
        launch(iters, out)

    timing = time_fn(run, reps=reps, warmup=2, flush_l2=False)
    ms = timing.median
    flops = blocks * warps_per_block * iters * chains * FLOPS[precision]
    return dict(precision=precision, instruction=_instruction(precision), chains=chains,
                iters=iters, warps_per_block=warps_per_block, blocks=blocks,
                ms=round(ms, 4), tflops=round(flops / ms / 1e9, 1))


def _instruction(precision: str) -> str:
    m, n, k = I.ATOMS[precision]["shape"]
    t = {"fp16": "f16", "bf16": "bf16", "tf32": "tf32"}[precision]
    return f"mma.sync.aligned.m{m}n{n}k{k}.row.col.f32.{t}.{t}.f32"
