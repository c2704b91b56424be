"""The epilogue through shared memory and a TMA store: the consumers hand the tile to the copy engine.

In ``wgmma_ws`` the consumer warpgroups write each finished tile straight from their
registers to C, and only then start the next tile's wgmma. Every SM finishes a tile at
about the same moment, so the stores come in bursts at what the memory takes, and the
tensor cores wait for them: at 4096^3 on an H100 the same kernel with its store taken out
is 9-12% faster (``results/loopgap-2026-11-25/epilogue-h100.log``).

This rung changes only the epilogue:

* **Stage.** Each consumer writes its 64 rows of accumulators into a tile of shared memory
  (``st.shared``, 8 or 4 bytes per pair of columns), runs ``fence.proxy.async`` (the copy
  engine reads shared memory through another proxy, which must see these stores) and
  arrives on its *epi_full* mbarrier. Then it starts the next tile's wgmma.
* **TMA store.** One thread of the producer warpgroup per consumer waits on *epi_full* and
  starts ``cp.async.bulk.tensor`` stores of the staged boxes. It waits only until the copy
  engine has *read* them (``cp.async.bulk.wait_group.read``), then arrives on *epi_empty*,
  which the consumer waits on before it stages its next tile. The writes to C finish on
  their own while the tensor cores run the next tile. The copy engine drops what falls
  outside C, so a partial tile needs no predicates.
* **Boxes of 128 bytes, swizzled.** The stage is laid out as the copy engine reads a box
  with the 128-byte swizzle: 64 rows of 128 bytes (64 16-bit or 32 float32 columns), each
  16-byte chunk XOR-ed with the row's index mod 8. A consumer's pair stores from 8 rows
  and 4 lanes then land in 32 different banks; without the swizzle (plain rows of 512
  bytes) all 8 rows would share banks, an 8-way conflict.
* **Pieces.** A float32 tile (128 x 256 x 4 bytes) and a three-stage ring do not fit in
  shared memory together, so a float32 C is staged in two halves of 128 columns; the
  consumers wait for the first half to be read before they stage the second.
* **When C cannot take a TMA store** (a row of C not a multiple of 16 bytes, or C not
  16-byte aligned) the consumers store from registers as ``wgmma_ws`` does: the same test
  (``KernelSpec.c_map_ok``) on the host decides whether the call passes a map of C.

``B_LAYOUT="NK"``, ``A_LAYOUT="KM"`` and ``BIAS=True`` are ``wgmma_ws``'s options; the
bias is added to the accumulators before they are staged (or stored from registers).

**A batch of products in one launch** walks the tiles as ``wgmma_ws`` does
(``wgmma_ws.batched_walk``).  C's map is 3-D, (batch, M, N) -- one product for a single
product -- and a box is stored into its own product (``tma_store_3d``), so a tile that
hangs over a product's last row is cut there by the copy engine, not written into the next
product's first rows: any M batches.  A batched launch is where the asynchronous store
pays most: at K = 64 or 128 a tile is one or two k-tiles, and writing C is most of the work.
"""

from gemmlib.backend import SIMULATOR, cuda, float32, uint16, uint32, uint64
from gemmlib.intrinsics import hopper as H
from gemmlib.intrinsics import tma_store as T
from gemmlib.intrinsics.hopper import BAR_ALIGN   # a global: numba needs a literal
from gemmlib.intrinsics.vector import aligned16
from gemmlib.kernels.wgmma_async import (BK, SLICE_BYTES, bias_code, bias_entry, bias_fields,
                                         bias_params, bias_suffix, a_dims, compile_sources,
                                         layout_fields, layout_params, layout_ptx,
                                         layout_suffix, no_bias, out_fields,
                                         out_params, out_ptx, out_suffix, rung_name, spec_fields,
                                         tile_order, warpgroup_code)
from gemmlib.kernels.wgmma_tma import tma_boxes, tma_loader, wait
from gemmlib.kernels.wgmma_ws import (DEFAULT_REGS, as_accumulated, batched_walk, check_build,
                                      persistent_grid, register_roles, regs_suffix)
from gemmlib.kernels.ws_pipeline import acquire_maps, early_launch, ring_parts
from gemmlib.spec import KernelSpec

#: bytes of one staged row of a box (the 128-byte swizzle's span) and rows per box
BOX_ROW_BYTES = 128
BOX_ROWS = 64


def elem_bytes(out: str) -> int:
    """Bytes of one element of C: float32, or 16-bit bits."""
    return 4 if out == "fp32" else 2


def box_cols(out: str) -> int:
    """Columns of C in one 128-byte row of a box: 32 float32 or 64 16-bit elements."""
    return BOX_ROW_BYTES // elem_bytes(out)


def default_pieces(out: str) -> int:
    """A float32 C is staged in two halves (a whole tile and 3 stages do not fit), 16 bits whole."""
    return 2 if out == "fp32" else 1


def stage_shape(BN: int, out: str, pieces: int | None = None):
    """(pieces, columns per piece, bytes per element, columns per box, boxes per piece)."""
    pieces = pieces or default_pieces(out)
    if pieces not in (1, 2) or (BN // pieces) % box_cols(out):
        raise ValueError(f"PIECES must be 1 or 2, each a whole number of {box_cols(out)}-column "
                         f"boxes (BN={BN}, PIECES={pieces})")
    cols = BN // pieces
    return pieces, cols, elem_bytes(out), box_cols(out), cols // box_cols(out)


def stage_bytes(BN: int, out: str, pieces: int | None = None) -> int:
    """Shared memory of the stage: one piece of the tile's 128 rows."""
    _, cols, es, _, _ = stage_shape(BN, out, pieces)
    return 128 * cols * es


def c_box(out: str) -> tuple:
    """The box the tensor map of C stores: one consumer's 64 rows of 128 bytes."""
    return (BOX_ROWS, box_cols(out))


def stage_offset(out: str):
    """``offset(r, c)``: the byte offset in the stage of staged element (r, c) of one piece:
    row r of every box at ``r * 128`` bytes, boxes of the tile's 128 rows one after another,
    and in a row the 16-byte chunk XOR-ed with ``r % 8`` (the copy engine's 128-byte swizzle:
    ``gemmlib.tma.swizzled_offset``, which tests/test_wgmma_store.py holds it to for every
    element; written per chunk here, as the kernel ran on the GPU: compiled through
    ``swizzled_offset``'s XOR on the byte address, the PTX differs).  A plain function,
    compiled by :func:`stage_put`."""
    ES, BOX_COLS = elem_bytes(out), box_cols(out)
    PER16 = 16 // ES                  # elements in a 16-byte chunk
    BOX_BYTES = 128 * BOX_ROW_BYTES   # the 128 rows of one box column (both consumers)

    def offset(r, c):
        cc = c % BOX_COLS
        return ((c // BOX_COLS) * BOX_BYTES + r * BOX_ROW_BYTES
                + ((cc // PER16) ^ (r % 8)) * 16 + (cc % PER16) * ES)
    return offset


def stage_put(out: str):
    """``put(base, r, c, a, b)``: a consumer's pair of columns (c even) of staged row ``r``
    at ``base + offset(r, c)``; ``a, b``: float32 (one 8-byte store), or 16-bit bits packed
    into one 32-bit store.  A pair never straddles a 16-byte chunk (c is even, a chunk holds
    4 or 8 elements), so the swizzle keeps it together."""
    offset = cuda.jit(device=True)(stage_offset(out))

    if out == "fp32":
        @cuda.jit(device=True)
        def put(base, r, c, a, b):
            T.st_shared_v2_f32(base + offset(r, c), a, b)
    else:
        @cuda.jit(device=True)
        def put(base, r, c, a, b):
            T.st_shared_u32(base + offset(r, c), uint32(a) | (uint32(b) << uint32(16)))
    return put


def stage_source(span: tuple, convert: str = "") -> str:
    """Source of ``stage_p(base, acc, t, r0)``: thread ``t`` of a consumer puts its
    accumulators of column groups span[0] <= j < span[1] (8 columns each) into the stage at
    rows from ``r0`` (the accumulator layout of ``wgmma_async.store_source``: rows g and g + 8
    of the warp's 16, columns 2 * (lane % 4) + 8 j). One loop per row: NVVM unrolls each, so
    every index of ``acc`` is a constant. ``convert`` names a float32 -> 16-bit function."""
    j0, j1 = span

    def val(k):
        return f"{convert}(acc[4 * j + {k}])" if convert else f"acc[4 * j + {k}]"

    lines = ["def stage_p(base, acc, t, r0):",
             "    r = r0 + 16 * (t // 32) + (t % 32) // 4",
             "    c0 = 2 * (t % 4)"]
    for half in range(2):
        lines += [f"    for j in range({j0}, {j1}):",
                  f"        put(base, r + {8 * half}, c0 + 8 * (j - {j0}), {val(2 * half)}, "
                  f"{val(2 * half + 1)})"]
    return "\n".join(lines) + "\n"


def epilogue_code(precision: str, BN: int, out: str, pieces: int | None = None,
                  b_layout: str = "KN", a_layout: str = "MK"):
    """(k_tile, store_acc, stage_0, stage_1): the wgmma of one k-tile (B's tile laid out as
    ``b_layout`` says), ``wgmma_ws``'s store from registers (when C takes no TMA store), and
    the functions that stage pieces 0 and 1 (a 16-bit C has one piece: stage_1 is stage_0,
    never called)."""
    from gemmlib.intrinsics.convert import float_to_bf16, float_to_half

    k_tile, store_acc = warpgroup_code(precision, BN, 1, out, b_layout, a_layout)
    pieces, cols, _, _, _ = stage_shape(BN, out, pieces)
    env = {"put": stage_put(out), "to16": float_to_half if out == "fp16" else float_to_bf16}
    g = cols // 8
    srcs = [stage_source((p * g, (p + 1) * g), "" if out == "fp32" else "to16")
            .replace("def stage_p(", f"def stage_{p}(") for p in range(pieces)]
    stages = compile_sources(srcs, env)
    return k_tile, store_acc, stages[0], stages[-1]


def store_kernel(BM: int, BN: int, STAGES: int, REGS, out: str, k_tile, store_acc, stage_0,
                 stage_1, tile_origin, load_stage, A_BYTES: int, STAGE_BYTES: int,
                 pieces: int | None = None, add_bias=None, a_layout: str = "MK",
                 b_kmajor: bool = False):
    """``wgmma_ws``'s kernel with the epilogue through shared memory (module docstring);
    ``add_bias``, ``a_layout``, ``b_kmajor`` as ``wgmma_ws.ws_kernel``'s."""
    dims = a_dims(a_layout)
    walk, place = batched_walk(BM, BN, b_kmajor, tile_origin)
    BIAS = add_bias is not None
    add_bias = add_bias or no_bias
    PIECES, COLS, ES, BOX_COLS, BOXES = stage_shape(BN, out, pieces)
    VE = 16 // ES                             # elements of C in 16 bytes
    BOX_BYTES = 128 * BOX_ROW_BYTES
    CONSUMERS = BM // 64
    NT = 128 * (1 + CONSUMERS)
    ACC = BN // 2
    EPI_FULL = 2 * STAGES                     # + consumer: its tile is staged
    EPI_EMPTY = 2 * STAGES + CONSUMERS        # + consumer: the copy engine has read it
    NBARS = 2 * STAGES + 2 * CONSUMERS
    fill, mma, drain = ring_parts(STAGES, STAGE_BYTES, A_BYTES, load_stage, k_tile)
    fewer, more = register_roles(REGS)
    finish = as_accumulated
    jit_opts = {} if SIMULATOR else {"launch_bounds": (NT, 1)}

    @cuda.jit(**jit_opts)
    def wgmma_store_kernel(A, B, C, bias, maps):
        early_launch()                       # before any global memory
        sm = cuda.shared.array(0, uint16)
        bars = cuda.shared.array(NBARS, uint64, alignment=BAR_ALIGN)
        t = cuda.threadIdx.x
        wg = t // 128
        a_m, K = dims(A)                     # A given as (M, K) or (K, M)
        N = C.shape[1]
        b_rows, M, per, tiles = walk(a_m, K, N, B.shape[0])   # a batch: products stacked
        pad = ((1024 - H.smem_addr(sm, 0) % 1024) % 1024) // 2
        ring = H.smem_addr(sm, pad)
        stage = ring + STAGES * STAGE_BYTES   # 1024-byte aligned, as the swizzle needs
        num_k = (K + BK - 1) // BK
        to_tma = N % VE == 0 and aligned16(C)   # the host passes C's map on the same test
        if t == 0:
            for s in range(STAGES):
                H.mbarrier_init(H.smem_addr(bars, s), 1)             # full: the producer
                H.mbarrier_init(H.smem_addr(bars, STAGES + s), 128 * CONSUMERS)   # empty
            for c in range(CONSUMERS):
                H.mbarrier_init(H.smem_addr(bars, EPI_FULL + c), 128)  # a consumer staged
                H.mbarrier_init(H.smem_addr(bars, EPI_EMPTY + c), 1)   # its storer read it
            H.fence_mbarrier_init()
        cuda.syncthreads()                   # the last block-wide barrier
        if wg == 0:                          # ---- the producer warpgroup
            fewer()
            if t == 0:                       # warp 0: one thread issues the loads
                acquire_maps(maps)
                it = 0
                tile = cuda.blockIdx.x
                while tile < tiles:   # (range()'s trip count: a 64-bit division)
                    product, m0, n0 = place(tile, per, M, N)
                    it = fill(ring, bars, 0, it, 0, num_k, maps, product * M + m0, n0,
                              product * b_rows)
                    tile += cuda.gridDim.x
            elif to_tma and t % 32 == 0 and t // 32 <= CONSUMERS:   # warps 1, 2: storers
                c = t // 32 - 1              # the consumer this thread stores for
                cmap = maps + uint64(256)
                H.tensormap_acquire(cmap)
                rows = stage + c * BOX_ROWS * BOX_ROW_BYTES
                e = 0
                tile = cuda.blockIdx.x
                while tile < tiles:   # (range()'s trip count: a 64-bit division)
                    product, m0, n0 = place(tile, per, M, N)
                    y = m0 + BOX_ROWS * c
                    for piece in range(PIECES):
                        wait(H.smem_addr(bars, EPI_FULL + c), e % 2)
                        for b in range(BOXES):
                            x = n0 + piece * COLS + b * BOX_COLS
                            if x < N and y < M:   # (C's map is 3-D: product, row, column)
                                T.tma_store_3d(cmap, x, y, product, rows + b * BOX_BYTES)
                        T.bulk_commit()
                        T.bulk_wait_read()   # the stage is read: it may be refilled
                        H.mbarrier_arrive(H.smem_addr(bars, EPI_EMPTY + c))
                        e += 1
                    tile += cuda.gridDim.x
                T.bulk_wait_all()            # C written before the thread leaves
        else:                                # ---- consumer warpgroups
            more()
            acc = cuda.local.array(ACC, float32)
            c = wg - 1
            slice_ = c * SLICE_BYTES
            it = 0
            e = 0
            tile = cuda.blockIdx.x
            while tile < tiles:   # (range()'s trip count: a 64-bit division)
                product, m0, n0 = place(tile, per, M, N)
                for i in range(ACC):
                    acc[i] = float32(0.0)
                it, _ = mma(ring, bars, 0, acc, slice_, it, 0, 0, num_k, t, 0)
                drain(bars, it, 0, num_k, t, 0)
                finish(acc, maps)
                add_bias(acc, bias, t % 128, n0, N)
                if to_tma:                   # stage it once the storer has read the last
                    wait(H.smem_addr(bars, EPI_EMPTY + c), (e % 2) ^ 1)
                    stage_0(stage, acc, t % 128, BOX_ROWS * c)
                    H.fence_proxy_async()    # our stores, seen by the copy engine
                    H.mbarrier_arrive(H.smem_addr(bars, EPI_FULL + c))
                    e += 1
                    if PIECES == 2:
                        wait(H.smem_addr(bars, EPI_EMPTY + c), (e % 2) ^ 1)
                        stage_1(stage, acc, t % 128, BOX_ROWS * c)
                        H.fence_proxy_async()
                        H.mbarrier_arrive(H.smem_addr(bars, EPI_FULL + c))
                        e += 1
                else:
                    a_row = product * M
                    store_acc(C, acc, t % 128, a_row + m0 + 64 * c, n0, a_row + M, N)
                tile += cuda.gridDim.x

    return (bias_entry(wgmma_store_kernel, BIAS, jit_opts), NT,
            STAGES * STAGE_BYTES + 1024 + stage_bytes(BN, out, PIECES))


#: bytes of shared memory one block may have
SMEM_MAX = 227 * 1024


def build(precision: str = "fp16", BM: int = 128, BN: int = 256, STAGES: int = 3,
          GROUP_M: int = 8, REGS: tuple | None = DEFAULT_REGS, OUT: str = "fp32",
          PIECES: int | None = None, B_LAYOUT: str = "KN", BIAS: bool = False,
          A_LAYOUT: str = "MK") -> KernelSpec:
    """``OUT``: C as float32 (staged in two halves), or in the inputs' own 16-bit type.
    ``PIECES``: stage the tile in 1 or 2 pieces (default: 2 for float32, 1 for 16 bits); a
    16-bit C in two pieces leaves room for a fourth stage of the ring.  ``B_LAYOUT``,
    ``BIAS``: as ``wgmma_ws``'s (the bias is added before the tile is staged).  ``A_LAYOUT``:
    as ``wgmma_ws``'s ("KM": A given as (K, M), a column-major A)."""
    check_build(precision, BM, BN, STAGES, REGS, OUT, B_LAYOUT, A_LAYOUT)
    PIECES = stage_shape(BN, OUT, PIECES)[0]
    split = PIECES != default_pieces(OUT)
    if BM != 128:
        raise ValueError(f"one storer thread per consumer, the stage holds the two "
                         f"consumers' 128 rows: BM must be 128, got {BM}")
    load_stage, A_BYTES, STAGE_BYTES = tma_loader(BM, BN, B_LAYOUT, A_LAYOUT)
    epi = stage_bytes(BN, OUT, PIECES)
    if STAGES * STAGE_BYTES + 1024 + epi > SMEM_MAX:
        raise ValueError(f"{STAGES} stages of {STAGE_BYTES // 1024} KiB and a "
                         f"{epi // 1024} KiB epilogue stage need more "
                         f"than {SMEM_MAX // 1024} KiB of shared memory")
    k_tile, store_acc, stage_0, stage_1 = epilogue_code(precision, BN, OUT, PIECES, B_LAYOUT,
                                                        A_LAYOUT)
    kernel, NT, SHARED = store_kernel(BM, BN, STAGES, REGS, OUT, k_tile, store_acc, stage_0,
                                      stage_1, tile_order(BM, BN, GROUP_M), load_stage,
                                      A_BYTES, STAGE_BYTES, PIECES,
                                      bias_code(precision, BN, 1, True) if BIAS else None,
                                      A_LAYOUT, B_LAYOUT == "NK")
    default = (BM, BN, STAGES, GROUP_M, REGS) == (128, 256, 3, 8, DEFAULT_REGS)
    name = rung_name("wgmma_store", precision, default, BM, BN, STAGES, GROUP_M)
    name += regs_suffix(REGS) + out_suffix(OUT) + (f"_p{PIECES}" if split else "")
    name += layout_suffix(B_LAYOUT, A_LAYOUT) + bias_suffix(BIAS)
    return KernelSpec(
        early_launch=True,
        name=name,
        idea="wgmma_ws with the epilogue through shared memory: consumers stage each tile "
             "in swizzled boxes and go on; a producer thread TMA-stores them to C",
        kernel=kernel,
        block=(NT, 1, 1),
        tile=(BM, BN),
        grid=persistent_grid(BM, BN),
        params=dict(precision=precision, BM=BM, BN=BN, BK=BK, STAGES=STAGES, GROUP_M=GROUP_M,
                    REGS=REGS, **out_params(OUT), **({"PIECES": PIECES} if split else {}),
                    **layout_params(B_LAYOUT, A_LAYOUT), **bias_params(BIAS)),
        shared_bytes=SHARED,
        batched=A_LAYOUT == "MK",            # products one under the other: (M, K) As only
        tma_boxes=tma_boxes(BM, BN, B_LAYOUT, A_LAYOUT),
        tma_swizzle=128,
        tma_store_box=c_box(OUT),
        ptx_must=(r"wgmma\.mma_async\.sync\.aligned\.m64n\d+k16",
                  r"cp\.async\.bulk\.tensor\.2d\.shared", r"mbarrier\.arrive\.shared",
                  r"cp\.async\.bulk\.tensor\.3d\.global\.shared::cta\.bulk_group",
                  r"cp\.async\.bulk\.wait_group\.read 0", r"fence\.proxy\.async",
                  r"st\.shared\.(?:v2\.f32|b32)") + (
            (r"setmaxnreg\.inc",) if REGS else ()) + out_ptx(OUT)
            + layout_ptx(B_LAYOUT, A_LAYOUT),
        **{**spec_fields(precision, __name__), **out_fields(precision, OUT),
           **layout_fields(B_LAYOUT, A_LAYOUT), **bias_fields(BIAS),
           "chapter": "17f-tma-store"},
    )


SPEC = build()
