"""Rung 2, coalesced: the naive kernel with the thread-to-element mapping swapped.

Now ``threadIdx.x`` walks along a *row* of C.  At every step k the 32 threads
of a warp read ``B[k, col .. col+31]``: 32 consecutive floats, 128 bytes, one
memory transaction; and all of them read the same ``A[row, k]`` (a
broadcast).  The arithmetic is identical to ``naive``; only ``c_element`` and
the grid changed.
"""

from gemmlib.backend import cuda, float32
from gemmlib.spec import KernelSpec, cdiv

BLOCK = 32  # threads per block along x and along y: 32 x 32 = 1024


def c_element(block_x, block_y, thread_x, thread_y):
    """The (row, col) of C computed by one thread: x walks along columns."""
    row = block_y * BLOCK + thread_y
    col = block_x * BLOCK + thread_x
    return row, col


_c_element = cuda.jit(device=True)(c_element)


@cuda.jit
def coalesced_kernel(A, B, C):
    row, col = _c_element(cuda.blockIdx.x, cuda.blockIdx.y, cuda.threadIdx.x, cuda.threadIdx.y)
    M, K = A.shape
    N = B.shape[1]
    if row < M and col < N:
        acc = float32(0.0)
        for k in range(K):
            acc += A[row, k] * B[k, col]
        C[row, col] = acc


def grid(M, N, K):
    return (cdiv(N, BLOCK), cdiv(M, BLOCK), 1)  # x covers columns, y covers rows


SPEC = KernelSpec(
    name="coalesced",
    chapter="04-coalescing",
    idea="threadIdx.x runs along a row of C, so a warp reads 32 consecutive floats of B",
    kernel=coalesced_kernel,
    block=(BLOCK, BLOCK, 1),
    tile=(BLOCK, BLOCK),
    grid=grid,
    params={"BLOCK": BLOCK},
    index={"c_element": c_element},
    module=__name__,
)
