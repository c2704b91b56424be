"""Rung 3, shared-memory tiling: stage TILE x TILE blocks of A and B on chip.

The block walks along K one tile at a time ("phases").  In each phase every
thread copies one element of A's tile and one of B's into shared memory,
the block waits at a barrier, and then every thread reads a whole row of the
A tile and a column of the B tile from shared memory.  Each value loaded from
global memory is now used TILE times instead of once.

Edge tiles are filled with zeros where they hang over the matrix, so the
inner loop needs no bounds checks and the padding adds nothing to the sum:
any M, N, K works without the caller padding anything.
"""

from gemmlib.backend import cuda, float32
from gemmlib.spec import KernelSpec, cdiv


def build(TILE: int = 32) -> KernelSpec:
    def c_element(block_x, block_y, thread_x, thread_y):
        """The (row, col) of C computed by one thread (coalesced mapping)."""
        return block_y * TILE + thread_y, block_x * TILE + thread_x

    _c_element = cuda.jit(device=True)(c_element)

    @cuda.jit
    def shared_kernel(A, B, C):
        sA = cuda.shared.array((TILE, TILE), float32)
        sB = cuda.shared.array((TILE, TILE), float32)
        tx = cuda.threadIdx.x
        ty = cuda.threadIdx.y
        row, col = _c_element(cuda.blockIdx.x, cuda.blockIdx.y, tx, ty)
        M, K = A.shape
        N = B.shape[1]

        acc = float32(0.0)
        for k0 in range(0, K, TILE):  # one phase per TILE-wide slab of K
            # Each thread stages one element of each tile; outside the matrix -> 0.
            a_col = k0 + tx
            sA[ty, tx] = A[row, a_col] if row < M and a_col < K else float32(0.0)
            b_row = k0 + ty
            sB[ty, tx] = B[b_row, col] if b_row < K and col < N else float32(0.0)
            cuda.syncthreads()  # the tiles are complete before anyone reads them
            for kk in range(TILE):
                acc += sA[ty, kk] * sB[kk, tx]
            cuda.syncthreads()  # everyone is done reading before the next phase overwrites
        if row < M and col < N:
            C[row, col] = acc

    def grid(M, N, K):
        return (cdiv(N, TILE), cdiv(M, TILE), 1)

    return KernelSpec(
        name="shared" if TILE == 32 else f"shared_t{TILE}",
        chapter="05-shared-memory",
        idea="stage TILE x TILE tiles of A and B in shared memory; each global load is reused TILE times",
        kernel=shared_kernel,
        block=(TILE, TILE, 1),
        tile=(TILE, TILE),
        grid=grid,
        params={"TILE": TILE},
        shared_bytes=2 * TILE * TILE * 4,
        index={"c_element": c_element},
        module=__name__,
    )


SPEC = build()
