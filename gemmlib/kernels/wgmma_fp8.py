"""FP8 on wgmma: 8-bit inputs with per-tensor scales, fp32 accumulation, bf16 or fp32 out.

The K-major layout of ``wgmma_tf32`` is all FP8 needs from shared memory: a
tile row is still 128 bytes, now 128 values of K, and one k-step is still
32 bytes of each row (``m64nNk32``).  What changes is around the numbers:

* **Two 8-bit formats** (the OCP FP8 formats Hopper's tensor cores read):
  ``e4m3`` (4 exponent bits, 3 mantissa bits, largest 448, no Inf: what
  weights and activations use) and ``e5m2`` (5 and 2, largest 57344, with
  Inf: gradients).  A product of two FP8 values is exact in fp32, and the
  tensor core adds them into fp32 accumulators: twice the fp16 rate, half
  the bytes per operand.
* **Scales.**  So few bits cover little range, so a tensor is stored as
  ``x / s`` with a float32 scale s per tensor, and the product is
  ``C = (s_a * s_b) * (A_8 @ B_8)``.  The kernel multiplies each tile's
  accumulators by ``s_a * s_b`` before the store (``finish``).  The scales
  are float32 tensors on the GPU, as in ``torch._scaled_mm``: their
  addresses ride in the tensor-map block, in the 16 bytes after B's map,
  and every consumer thread reads them once per tile (four loads, L1 hits
  after the first warp).
* **bf16 or fp32 out.**  bf16 (the default, what the next layer of a model
  takes) is rounded to nearest even from the scaled fp32 value; a thread's two
  adjacent columns leave as one 4-byte store.
* **B's layout.**  ``torch._scaled_mm`` wants B column-major: a (K, N) view
  of a row-major (N, K) weight (``w.t()``), which is exactly K-major, so the
  kernel reads it with no pre-pass (``B_LAYOUT="NK"``).  A row-major (K, N)
  B is transposed first (``B_LAYOUT="KN"``, ``wgmma_tf32``'s pre-pass on bytes).

Shapes: rows of 16 bytes, so K a multiple of 16 (``gemmlib.matmul`` pads).
Needs sm_90a (H100/H200).
"""

from gemmlib.backend import cuda, uint8, uint16
from gemmlib.intrinsics import hopper as H
from gemmlib.intrinsics.index import uidx
from gemmlib.intrinsics.mma import as_bits
from gemmlib.intrinsics.vector import aligned4, aligned8, store2, store2_u16
from gemmlib.kernels.wgmma_async import (HOPPER_ONLY, ROW_BYTES, compile_sources, rung_name,
                                         store_source, tile_order)
from gemmlib.kernels.wgmma_tf32 import (k_multiple, kmajor_loader, mma_source, transpose_grid,
                                        transpose_kernel)
from gemmlib.kernels.wgmma_ws import check_tile, persistent_grid, ws_kernel
from gemmlib.spec import KernelSpec

#: the two FP8 formats, by gemmlib's precision name
PRECISIONS = ("e4m3", "e5m2")
#: torch's dtype names of each format (what ``gemmlib.matmul`` recognises)
TORCH_NAME = {"e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2"}
OUTPUTS = ("bf16", "fp32")
BK = ROW_BYTES                      # one byte per value: 128 values of K per k-tile
#: where the scales' addresses sit in the maps block (after A's and B's 128-byte maps)
SCALE_WORDS = 256

TRANSPOSE8 = transpose_kernel(uint8)


def scale_code(BN: int):
    """``finish(acc, maps)``: multiply a thread's BN/2 accumulators by s_a * s_b."""
    ACC = BN // 2

    @cuda.jit(device=True)
    def scale(acc, maps):
        s = (H.ld_global_f32(H.ld_global_u64(maps + SCALE_WORDS))
             * H.ld_global_f32(H.ld_global_u64(maps + SCALE_WORDS + 8)))
        for e in range(ACC):
            acc[e] = acc[e] * s

    return scale


@cuda.jit(device=True)
def bf16_bits(x):
    """float32 -> bfloat16 bits, round to nearest even (a NaN stays a quiet NaN)."""
    u = as_bits(x)
    if (u & 0x7FFFFFFF) > 0x7F800000:
        return uint16((u >> 16) | 0x40)
    return uint16((u + 0x7FFF + ((u >> 16) & 1)) >> 16)


SIXTEEN_BYTE_ROWS = k_multiple(16, "FP8 values")


def build(precision: str = "e4m3", OUT: str = "bf16", B_LAYOUT: str = "NK", BM: int = 128,
          BN: int = 256, STAGES: int = 4, GROUP_M: int = 8,
          REGS: tuple | None = (40, 232)) -> KernelSpec:
    if precision not in PRECISIONS or OUT not in OUTPUTS or B_LAYOUT not in ("KN", "NK"):
        raise ValueError(f"wgmma_fp8 computes in {PRECISIONS} with output {OUTPUTS} and B "
                         f"given as KN or NK; got {precision!r}, {OUT!r}, {B_LAYOUT!r}")
    check_tile(BM, BN, STAGES, REGS)
    env = {"mma": H.wgmma_kmajor(BN, precision, in_place=True), "desc": H.smem_desc,
           "uidx": uidx, "u64": uidx, "store2": store2, "aligned8": aligned8, "bf16": bf16_bits,
           "store2_u16": store2_u16, "aligned4": aligned4}
    store = (store_source(BN, 1, "bf16", "store2_u16", "aligned4") if OUT == "bf16"
             else store_source(BN, 1))
    k_tile, store_acc = compile_sources((mma_source(BN), store), env)
    load_stage, A_BYTES, STAGE_BYTES = kmajor_loader(BM, BN)
    kernel, NT, SHARED = ws_kernel(BM, BN, BK, STAGES, REGS, k_tile, store_acc,
                                   tile_order(BM, BN, GROUP_M), load_stage, A_BYTES, STAGE_BYTES,
                                   finish=scale_code(BN), b_kmajor=True)

    default = (BM, BN, STAGES, GROUP_M, REGS) == (128, 256, 4, 8, (40, 232))
    name = rung_name("wgmma_fp8", None, default, BM, BN, STAGES, GROUP_M)
    name += f"_{precision}_{OUT}" + ("_kn" if B_LAYOUT == "KN" else "")
    out_dtype = "uint16" if OUT == "bf16" else "float32"
    return KernelSpec(
        early_launch=True,
        name=name,
        chapter="17d-tf32-fp8",
        idea="FP8 (e4m3/e5m2) on wgmma m64nNk32, K-major tiles, the tile's accumulators "
             "scaled by s_a * s_b before a bf16 or fp32 store",
        kernel=kernel,
        block=(NT, 1, 1),
        tile=(BM, BN),
        grid=persistent_grid(BM, BN),
        params=dict(precision=precision, OUT=OUT, B_LAYOUT=B_LAYOUT, BM=BM, BN=BN, BK=BK,
                    STAGES=STAGES, GROUP_M=GROUP_M, REGS=REGS),
        launch_only=("B_LAYOUT",),
        shared_bytes=SHARED,
        dynamic_shared=True,
        min_cc=H.MIN_CC,
        dtype=TORCH_NAME[precision],
        arg_dtypes=("uint8", "uint8", out_dtype),
        precision=precision,
        operand_align=16,
        b_operand=B_LAYOUT,
        constraints=(HOPPER_ONLY, SIXTEEN_BYTE_ROWS),
        tma_boxes=((BM, BK), (BN, BK)),
        tma_swizzle=128,
        b_prep=TRANSPOSE8 if B_LAYOUT == "KN" else None,
        b_prep_block=(32, 8, 1),
        b_prep_grid=transpose_grid if B_LAYOUT == "KN" else None,
        scale_words=True,
        module=__name__,
        ptx_must=(rf"wgmma\.mma_async\.sync\.aligned\.m64n\d+k32\.f32\.{precision}\.{precision}",
                  r"cp\.async\.bulk\.tensor\.2d", r"ld\.global\.u64") + (
            (r"setmaxnreg\.inc",) if REGS else ()) + (
            (r"st\.global\.v2\.u16",) if OUT == "bf16" else ()),
    )


SPEC = build()
