"""TF32 on wgmma: both operands K-major, so B is transposed before the kernel reads it.

``wgmma_ws`` reads B straight out of the caller's row-major (K, N) matrix: a
tile row of B is 64 consecutive n of one k (*MN-major*), and the
instruction's ``trans-b`` immediate says so.  That immediate exists for
16-bit inputs only.  For tf32 (and the 8-bit types) the PTX ISA allows one
layout: **both A and B K-major**, each row of a tile holding consecutive k
of one m (A) or one n (B).  A row-major A already is; B is not.  So this
rung changes one thing against ``wgmma_ws``, where B lives:

* **A pre-pass transposes B** into a (N, K) copy (:func:`transpose_kernel`:
  32 x 32 tiles through shared memory, a padded row against bank conflicts,
  the bank-conflicts chapter's fix).  ``gemmlib.dispatch`` runs it on the
  call's stream, into a buffer kept per plan and stream, before every launch
  -- B may change between calls -- so the call pays one read and one write of
  B: about 2 * 4KN bytes at DRAM speed.  The alternative, a producer that
  transposes each tile in shared memory, would add 64 KB of shared-memory
  traffic per k-tile to the 80 KB wgmma reads: the shared-memory port, not
  DRAM, would bound the kernel.
* **B's tile is then A's layout**: BN rows of 128 bytes (32 float32 of K),
  128-byte swizzled, one TMA box of BN x 32.  Both descriptors step 32
  bytes per k-step (m64nNk8: 8 tf32 = 32 bytes, the same bytes per step as
  m64nNk16 of 16-bit inputs) and 1024 bytes per 8 rows.
* **The rest is wgmma_ws**: producer warpgroup, consumer warpgroups, the
  full/empty mbarrier ring, persistent tiles (:func:`wgmma_ws.ws_kernel`).
* **A weight needs no pre-pass.**  ``nn.Linear`` keeps its weight as (N, K)
  row-major, already K-major: built with ``B_LAYOUT="NK"`` the rung takes B
  so (C = A @ B.T) and reads it as it is (``b_prep=None``).  ``BIAS=True`` adds
  a float32 (1, N) bias before the store (``wgmma_async.bias_code``).
* **A column-major A is transposed too.**  A weight gradient's ``dY.t()`` is
  (K, M) in memory, MN-major, which tf32 wgmma cannot read either: built with
  ``A_LAYOUT="KM"`` the rung runs the same pre-pass on A (``a_prep``) into an
  (M, K) buffer kept per plan and stream.  On an H100 the transposing copy the
  array library made before took about twice as long (torch's copy of a
  transposed 4096 x 4096 float32 view: 138 us; this pre-pass: 65 us).

TF32 keeps the float32 exponent and 10 of its 23 mantissa bits.  The tensor
core reads the top 19 bits of each float32 in shared memory and ignores the
other 13 (round toward zero; ``mma_pipeline``'s tf32 rounds to nearest with
``cvt.rna`` first, cuBLAS's TF32 kernels also read float32 as it is):
one input rounding of at most 2^-10 relative per factor.

Shapes: TMA needs rows that are multiples of 16 bytes (K a multiple of 4;
``gemmlib.matmul`` pads others).  Needs sm_90a (H100/H200).
"""

from gemmlib.backend import cuda, float32
from gemmlib.intrinsics import hopper as H
from gemmlib.intrinsics.index import uidx
from gemmlib.intrinsics.vector import aligned8, store2
from gemmlib.kernels.mma_atom import ARG_DTYPES
from gemmlib.kernels.wgmma_async import (GROUP_BYTES, HOPPER_ONLY, ROW_BYTES, SLICE_BYTES,
                                         bias_code, bias_fields, bias_params, bias_suffix,
                                         check_layout, compile_sources, layout_params,
                                         layout_suffix, rung_name, store_source, tile_order)
from gemmlib.kernels.wgmma_tma import tma_loader
from gemmlib.kernels.wgmma_ws import check_tile, persistent_grid, ws_kernel
from gemmlib.precision import INPUT_DTYPE
from gemmlib.spec import Constraint, KernelSpec, cdiv

#: what this rung computes: float32 inputs read as tf32
PRECISIONS = ("tf32",)
#: bytes of one element, and elements of K per k-tile (one 128-byte swizzled row)
ELEM_BYTES = 4
BK = ROW_BYTES // ELEM_BYTES
#: one k-step of wgmma reads 32 bytes of each row (8 tf32)
STEP_BYTES = 32
#: the transpose pre-pass: TILE x TILE elements per block of TILE x ROWS threads
TILE, ROWS = 32, 8
#: the shared tile's row: one extra column against bank conflicts
PADDED = TILE + 1


def transpose_kernel(dtype):
    """``transpose(B, Bt)``: Bt = B.T for a (K, N) ``B``.  Block (TILE, ROWS) reads a
    TILE x TILE tile along B's rows (coalesced), writes it along Bt's rows (coalesced);
    the shared tile has one extra column so that the column reads hit 32 different banks.
    Tiles along N are the grid's x (up to 2^31 - 1 blocks); along K its y, at most
    65535, so blocks stride over K's tiles."""
    @cuda.jit
    def transpose(B, Bt):
        tile = cuda.shared.array((TILE, PADDED), dtype)
        K, N = B.shape
        n0 = cuda.blockIdx.x * TILE
        tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
        for kb in range(cuda.blockIdx.y, (K + TILE - 1) // TILE, cuda.gridDim.y):
            k0 = kb * TILE
            for j in range(0, TILE, ROWS):
                if k0 + ty + j < K and n0 + tx < N:
                    tile[ty + j, tx] = B[uidx(k0 + ty + j), uidx(n0 + tx)]
            cuda.syncthreads()
            for j in range(0, TILE, ROWS):
                if n0 + ty + j < N and k0 + tx < K:
                    Bt[uidx(n0 + ty + j), uidx(k0 + tx)] = tile[tx, ty + j]
            cuda.syncthreads()            # the tile is read before the next k0 overwrites it

    return transpose


TRANSPOSE32 = transpose_kernel(float32)


def transpose_grid(K: int, N: int) -> tuple[int, int, int]:
    return (cdiv(N, TILE), min(cdiv(K, TILE), 65535), 1)


def mma_source(BN: int) -> str:
    """Source of ``k_tile(a, b, acc)``: the k-steps of one k-tile, A's 64-row slice at
    shared address ``a`` and B's BN rows at ``b``, both K-major and 128-byte swizzled; each
    wgmma updates the BN/2 accumulators of ``acc`` in place (``wgmma_async.mma_source``)."""
    lines = ["def k_tile(a, b, acc):", f"    da = desc(a, 16, {GROUP_BYTES}, 1)",
             f"    db = desc(b, 16, {GROUP_BYTES}, 1)"]
    for kk in range(ROW_BYTES // STEP_BYTES):   # a k-step moves both start addresses (>> 4)
        step = f" + u64({kk * STEP_BYTES // 16})" if kk else ""
        lines.append(f"    mma(da{step}, db{step}, one, acc, 0)")
    return "\n".join(lines) + "\n"


def kmajor_loader(BM: int, BN: int):
    """``load_stage(ring, s, bar, maps, k0, m0, n0, b_row)``: A's BM x BK box and B's BN x BK box
    (of the (N, K) copy) into stage ``s``, their bytes announced on ``bar``.  A K-major
    k-tile is rows of 128 bytes whatever the element type, so this is the 16-bit rungs'
    loader for an (N, K) B (``wgmma_tma.tma_loader``)."""
    return tma_loader(BM, BN, "NK")


def k_multiple(elements: int, what: str) -> Constraint:
    """TMA copies rows of a multiple of 16 bytes: K a multiple of ``elements`` (16 bytes)."""
    def holds(spec, M, N, K, dev):
        return K % elements == 0

    return Constraint("16-byte rows", holds,
                      f"TMA copies rows of a multiple of 16 bytes: K must be a multiple of "
                      f"{elements} {what} (gemmlib.matmul pads other shapes)")


SIXTEEN_BYTE_ROWS = k_multiple(4, "float32")


def build(precision: str = "tf32", BM: int = 128, BN: int = 256, STAGES: int = 3,
          GROUP_M: int = 8, REGS: tuple | None = (40, 232), B_LAYOUT: str = "KN",
          BIAS: bool = False, A_LAYOUT: str = "MK") -> KernelSpec:
    """``B_LAYOUT``: "KN", B given (K, N) and transposed by the pre-pass; "NK", B given
    (N, K) -- an ``nn.Linear`` weight, C = A @ B.T -- read as it is.  ``A_LAYOUT``: "MK",
    A given (M, K) and read as it is; "KM", A's (K, M) memory (a column-major A, such as
    a weight gradient's ``dY.t()``), transposed by the same pre-pass into an (M, K) buffer
    first.  ``BIAS``: the kernel takes a float32 (1, N) bias after C (a (0, N) one: none),
    added before the store."""
    if precision not in PRECISIONS:
        raise ValueError(f"wgmma_tf32 computes in {PRECISIONS}, got {precision!r}")
    check_tile(BM, BN, STAGES, REGS)
    check_layout(B_LAYOUT)
    if A_LAYOUT not in ("MK", "KM"):
        raise ValueError(f"A_LAYOUT must be 'MK' or 'KM', got {A_LAYOUT!r}")
    KM = A_LAYOUT == "KM"
    NK = B_LAYOUT == "NK"
    assert SLICE_BYTES == 64 * ROW_BYTES      # a consumer's 64 rows of A, as in wgmma_ws
    env = {"mma": H.wgmma_kmajor(BN, "tf32", in_place=True), "desc": H.smem_desc,
           "uidx": uidx, "u64": uidx, "store2": store2, "aligned8": aligned8}
    k_tile, store_acc = compile_sources((mma_source(BN), store_source(BN, 1)), env)
    load_stage, A_BYTES, STAGE_BYTES = kmajor_loader(BM, BN)
    kernel, NT, SHARED = ws_kernel(BM, BN, BK, STAGES, REGS, k_tile, store_acc,
                                   tile_order(BM, BN, GROUP_M), load_stage, A_BYTES, STAGE_BYTES,
                                   add_bias=bias_code(precision, BN, 1, True) if BIAS else None,
                                   b_kmajor=True)

    default = (BM, BN, STAGES, GROUP_M, REGS) == (128, 256, 3, 8, (40, 232))
    name = rung_name("wgmma_tf32", None, default, BM, BN, STAGES, GROUP_M)
    name += layout_suffix(B_LAYOUT, A_LAYOUT) + bias_suffix(BIAS)
    return KernelSpec(
        early_launch=True,
        name=name,
        chapter="17d-tf32-fp8",
        idea=("tf32 wgmma reads both operands K-major: B given as (N, K) is read as it is, "
              "then wgmma_ws's producer/consumer ring runs on (N, K) tiles" if NK else
              "tf32 wgmma reads both operands K-major: a pre-pass transposes B, then "
              "wgmma_ws's producer/consumer ring runs on (N, K) tiles")
             + ("; a (K, M) A is transposed by the same pre-pass first" if KM else ""),
        kernel=kernel,
        block=(NT, 1, 1),
        tile=(BM, BN),
        grid=persistent_grid(BM, BN),
        params=dict(precision=precision, BM=BM, BN=BN, BK=BK, STAGES=STAGES, GROUP_M=GROUP_M,
                    REGS=REGS, **layout_params(B_LAYOUT, A_LAYOUT), **bias_params(BIAS)),
        shared_bytes=SHARED,
        dynamic_shared=True,
        min_cc=H.MIN_CC,
        dtype=INPUT_DTYPE[precision],
        arg_dtypes=ARG_DTYPES[precision],
        precision=precision,
        operand_align=4,
        constraints=(HOPPER_ONLY, SIXTEEN_BYTE_ROWS),
        tma_boxes=((BM, BK), (BN, BK)),
        tma_swizzle=128,
        b_operand=B_LAYOUT,
        b_prep=None if NK else TRANSPOSE32,       # an (N, K) B is already K-major
        b_prep_block=(TILE, ROWS, 1),
        b_prep_grid=None if NK else transpose_grid,
        a_operand=A_LAYOUT,
        a_prep=TRANSPOSE32 if KM else None,        # the kernel reads A K-major: (M, K)
        a_prep_grid=transpose_grid if KM else None,
        module=__name__,
        **bias_fields(BIAS),
        ptx_must=(r"wgmma\.mma_async\.sync\.aligned\.m64n\d+k8\.f32\.tf32\.tf32",
                  r"cp\.async\.bulk\.tensor\.2d", r"mbarrier\.arrive\.shared") + (
            (r"setmaxnreg\.inc",) if REGS else ()),
    )


SPEC = build()
