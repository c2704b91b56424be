"""The epilogue through shared memory: consumers stage a tile, storer warps write it out.

In ``wgmma_ws`` the consumer warpgroups write each finished tile straight from their
registers to C. Every SM finishes its tile at about the same moment, so the writes come in
bursts. In a burst 132 SMs each write 128 KiB (float32) at once, at what the memory takes,
and the tensor cores wait for it. At 4096^3 on an H100 that costs 4-6 µs per tile (the store
taken out, the kernel is 9-12% faster: ``results/loopgap-2026-11-25/epilogue-h100.log``).

This rung hands the tile to other threads. It changes only the epilogue:

* **Staging.** A consumer writes its accumulators into a shared-memory tile (``STAGE``: 128
  rows, padded so that its pair stores hit distinct banks) and arrives on an *epi_full*
  mbarrier. Then it goes on to the next tile's wgmma.
* **Storer warps.** Warps 1-3 of the producer warpgroup sat idle in ``wgmma_ws`` (one
  thread issues every TMA copy). Here they wait on *epi_full* and copy the staged tile to C.
  They copy 16 bytes at a time (``copy16``), each warp along a row, so every store instruction
  writes four whole 128-byte lines. Then they arrive on *epi_empty*, which the consumers wait
  for before they stage the next tile.
* **Pieces.** A float32 tile (128 x 256 x 4 bytes) and a three-stage ring do not fit in
  shared memory together. So a float32 C is staged in two halves of 128 columns (``PIECES =
  2``), a 16-bit C in one piece. The consumers wait on the storers between the halves, so a
  float32 C overlaps less of its store than a 16-bit one.

The consumers no longer wait for the memory system. Instead, the storers must empty the
stage before the consumers finish the next tile, which takes a tile's whole mainloop.
"""

from gemmlib.backend import SIMULATOR, cuda, float32, uint16, uint64
from gemmlib.intrinsics import hopper as H
from gemmlib.intrinsics.hopper import BAR_ALIGN   # a global: numba needs a literal
from gemmlib.intrinsics.index import uidx
from gemmlib.intrinsics.vector import SHARED_ALIGN, aligned16, copy16
from gemmlib.kernels.wgmma_async import (BK, SLICE_BYTES, check_out, compile_sources,
                                         mma_source, out_fields, out_params, out_ptx,
                                         out_store, out_suffix, rung_name, spec_fields,
                                         tile_order)
from gemmlib.kernels.wgmma_tma import tma_boxes, tma_loader, wait
from gemmlib.kernels.wgmma_ws import (as_accumulated, check_tile, persistent_grid,
                                      register_roles, regs_suffix)
from gemmlib.spec import KernelSpec

#: threads of the producer warpgroup that copy staged tiles to C (warps 1-3)
STORERS = 96
#: setmaxnreg (producer warpgroup, consumers): the storers need more than wgmma_ws's 40
#: registers (at 40, 56 or 64 ptxas spilled their float32 copy loop; at 96 nothing spills)
STORE_REGS = (96, 200)


def stage_shape(BM: int, BN: int, out: str):
    """(pieces, rows, columns per piece, padded row length, element type) of the stage.
    Rows are padded by 8 float32 (32 bytes) or 8 halves (16 bytes): a consumer's pair
    stores (8 rows x 4 lanes) then land in distinct banks, and rows stay 16-byte aligned."""
    pieces = 2 if out == "fp32" else 1
    cols = BN // pieces
    return pieces, BM, cols, cols + 8, float32 if out == "fp32" else uint16


def epilogue_code(precision: str, BN: int, out: str):
    """(k_tile, stage_0, stage_1): the wgmma of one k-tile, and the functions that write
    pieces 0 and 1 of a consumer's accumulators into the stage (a 16-bit C has one piece:
    stage_1 is stage_0, never called)."""
    pieces, _, cols, _, _ = stage_shape(128, BN, out)
    mma = (H.wgmma_f16 if precision == "fp16" else H.wgmma_bf16)(BN, trans_b=True,
                                                                 in_place=True)
    from gemmlib.intrinsics.vector import aligned8, store2

    env = {"desc": H.smem_desc, "mma": mma, "uidx": uidx, "store2": store2,
           "aligned8": aligned8}
    g = cols // 8
    srcs = [mma_source(BN, 1, precision)]
    for p in range(pieces):
        srcs.append(out_store(BN, 1, precision, out, env, span=(p * g, (p + 1) * g))
                    .replace("def store_acc(", f"def stage_{p}("))
    fns = compile_sources(srcs, env)
    return fns[0], fns[1], fns[-1]


def store_kernel(BM: int, BN: int, STAGES: int, REGS, out: str, k_tile, stage_0, stage_1,
                 tile_origin, load_stage, A_BYTES: int, STAGE_BYTES: int):
    """``wgmma_ws``'s kernel with the epilogue through shared memory (module docstring)."""
    PIECES, ROWS, COLS, ROW_LEN, SDT = stage_shape(BM, BN, out)
    VE = 4 if out == "fp32" else 8            # elements in 16 bytes
    VPR = COLS // VE                          # 16-byte pieces per staged row
    CONSUMERS = BM // 64
    NT = 128 * (1 + CONSUMERS)
    ACC = BN // 2
    NBARS = 2 * STAGES + 2                    # full[s], empty[s], then epi_full, epi_empty
    EPI_FULL, EPI_EMPTY = 2 * STAGES, 2 * STAGES + 1
    wait0, wait1 = H.wgmma_wait(0), H.wgmma_wait(1)
    fewer, more = register_roles(REGS)
    finish = as_accumulated
    jit_opts = {} if SIMULATOR else {"launch_bounds": (NT, 1)}

    @cuda.jit(**jit_opts)
    def wgmma_store_kernel(A, B, C, maps):
        sm = cuda.shared.array(0, uint16)
        bars = cuda.shared.array(NBARS, uint64, alignment=BAR_ALIGN)
        stage = cuda.shared.array((ROWS, ROW_LEN), SDT, alignment=SHARED_ALIGN)
        t = cuda.threadIdx.x
        wg = t // 128
        M, K = A.shape
        N = C.shape[1]
        pad = ((1024 - H.smem_addr(sm, 0) % 1024) % 1024) // 2
        ring = H.smem_addr(sm, pad)
        tiles = ((M + BM - 1) // BM) * ((N + BN - 1) // BN)
        num_k = (K + BK - 1) // BK
        if t == 0:
            for s in range(STAGES):
                H.mbarrier_init(H.smem_addr(bars, s), 1)             # full: the producer
                H.mbarrier_init(H.smem_addr(bars, STAGES + s), 128 * CONSUMERS)   # empty
            H.mbarrier_init(H.smem_addr(bars, EPI_FULL), 128 * CONSUMERS)
            H.mbarrier_init(H.smem_addr(bars, EPI_EMPTY), STORERS)
            H.fence_mbarrier_init()
        cuda.syncthreads()                   # the last block-wide barrier
        if wg == 0:                          # ---- the producer warpgroup
            fewer()
            if t == 0:                       # warp 0: one thread issues the copies
                H.tensormap_acquire(maps)
                H.tensormap_acquire(maps + uint64(128))
                it = 0
                for tile in range(cuda.blockIdx.x, tiles, cuda.gridDim.x):
                    m0, n0 = tile_origin(tile, M, N)
                    for kt in range(num_k):
                        s = it % STAGES
                        wait(H.smem_addr(bars, STAGES + s), ((it // STAGES) % 2) ^ 1)
                        load_stage(ring, s, H.smem_addr(bars, s), maps, kt * BK, m0, n0)
                        it += 1
            elif t >= 32:                    # warps 1-3: the storers
                st = t - 32
                vec = N % VE == 0 and aligned16(C)   # every row of C starts 16-byte aligned
                e = 0
                for tile in range(cuda.blockIdx.x, tiles, cuda.gridDim.x):
                    m0, n0 = tile_origin(tile, M, N)
                    for piece in range(PIECES):
                        wait(H.smem_addr(bars, EPI_FULL), e % 2)
                        for v in range(st, ROWS * VPR, STORERS):
                            r = v // VPR
                            c = (v % VPR) * VE
                            row = m0 + r
                            col = n0 + piece * COLS + c
                            if row < M and col < N:
                                if vec and col + VE <= N:
                                    copy16(C, uidx(row), uidx(col), stage, r, c)
                                else:
                                    for q in range(VE):
                                        if col + q < N:
                                            C[uidx(row), uidx(col + q)] = stage[r, c + q]
                        H.mbarrier_arrive(H.smem_addr(bars, EPI_EMPTY))
                        e += 1
        else:                                # ---- consumer warpgroups
            more()
            acc = cuda.local.array(ACC, float32)
            slice_ = (wg - 1) * SLICE_BYTES
            it = 0
            e = 0
            for tile in range(cuda.blockIdx.x, tiles, cuda.gridDim.x):
                for i in range(ACC):
                    acc[i] = float32(0.0)
                for kt in range(num_k):
                    s = it % STAGES
                    wait(H.smem_addr(bars, s), (it // STAGES) % 2)
                    H.wgmma_fence()
                    k_tile(ring + s * STAGE_BYTES + slice_, ring + s * STAGE_BYTES + A_BYTES,
                           acc)
                    H.wgmma_commit()
                    wait1()                  # the previous k-tile's wgmma is done:
                    if kt > 0:               # its stage may be refilled
                        H.mbarrier_arrive(H.smem_addr(bars, STAGES + (it - 1) % STAGES))
                    it += 1
                wait0()
                if num_k > 0:
                    H.mbarrier_arrive(H.smem_addr(bars, STAGES + (it - 1) % STAGES))
                finish(acc, maps)
                # stage the tile (the rows of this consumer), piece by piece, once the
                # storers have emptied the stage; the stage's coordinates start at 0
                wait(H.smem_addr(bars, EPI_EMPTY), (e % 2) ^ 1)
                stage_0(stage, acc, t % 128, 64 * (wg - 1), 0, ROWS, COLS)
                H.mbarrier_arrive(H.smem_addr(bars, EPI_FULL))
                e += 1
                if PIECES == 2:
                    wait(H.smem_addr(bars, EPI_EMPTY), (e % 2) ^ 1)
                    stage_1(stage, acc, t % 128, 64 * (wg - 1), 0, ROWS, COLS)
                    H.mbarrier_arrive(H.smem_addr(bars, EPI_FULL))
                    e += 1

    return wgmma_store_kernel, NT, STAGES * STAGE_BYTES + 1024


#: bytes of shared memory one block may have (dynamic ring + the static stage)
SMEM_MAX = 227 * 1024


def stage_bytes(BM: int, BN: int, out: str) -> int:
    _, rows, _, row_len, dt = stage_shape(BM, BN, out)
    return rows * row_len * (4 if dt is float32 else 2)


def build(precision: str = "fp16", BM: int = 128, BN: int = 256, STAGES: int = 3,
          GROUP_M: int = 8, REGS: tuple | None = STORE_REGS, OUT: str = "fp32") -> KernelSpec:
    """``OUT``: C as float32 (staged in two halves), or in the inputs' own 16-bit type."""
    check_tile(BM, BN, STAGES, REGS)
    check_out(precision, OUT)
    if BM != 128:
        raise ValueError(f"the stage holds the two consumers' 128 rows: BM must be 128, "
                         f"got {BM}")
    load_stage, A_BYTES, STAGE_BYTES = tma_loader(BM, BN)
    if STAGES * STAGE_BYTES + 1024 + stage_bytes(BM, BN, OUT) > SMEM_MAX:
        raise ValueError(f"{STAGES} stages of {STAGE_BYTES // 1024} KiB and a "
                         f"{stage_bytes(BM, BN, OUT) // 1024} KiB epilogue stage need more "
                         f"than {SMEM_MAX // 1024} KiB of shared memory")
    k_tile, stage_0, stage_1 = epilogue_code(precision, BN, OUT)
    kernel, NT, SHARED = store_kernel(BM, BN, STAGES, REGS, OUT, k_tile, stage_0, stage_1,
                                      tile_order(BM, BN, GROUP_M), load_stage, A_BYTES,
                                      STAGE_BYTES)
    default = (BM, BN, STAGES, GROUP_M, REGS) == (128, 256, 3, 8, STORE_REGS)
    name = rung_name("wgmma_store", precision, default, BM, BN, STAGES, GROUP_M)
    if REGS != STORE_REGS:
        name += regs_suffix(REGS) or "_r" + "-".join(map(str, REGS))
    name += out_suffix(OUT)
    return KernelSpec(
        name=name,
        idea="wgmma_ws with the epilogue through shared memory: consumers stage each tile "
             "and go on; three storer warps copy it to C in 16-byte pieces",
        kernel=kernel,
        block=(NT, 1, 1),
        tile=(BM, BN),
        grid=persistent_grid(BM, BN),
        params=dict(precision=precision, BM=BM, BN=BN, BK=BK, STAGES=STAGES, GROUP_M=GROUP_M,
                    REGS=REGS, **out_params(OUT)),
        shared_bytes=SHARED,
        tma_boxes=tma_boxes(BM),
        tma_swizzle=128,
        ptx_must=(r"wgmma\.mma_async\.sync\.aligned\.m64n\d+k16",
                  r"cp\.async\.bulk\.tensor\.2d", r"mbarrier\.arrive\.shared",
                  r"st\.global\.v4\.(?:b32|u32)") + (
            (r"setmaxnreg\.inc",) if REGS else ()) + tuple(
            p for p in out_ptx(OUT) if "st\\.global" not in p),
        **{**spec_fields(precision, __name__), **out_fields(precision, OUT)},
    )


SPEC = build()
