"""Rung 1, naive: one thread per element of C, rows along ``threadIdx.x``.

This is the source chapter's first mapping.  It is correct and simple, and
slow for a reason worth seeing: the 32 threads of a warp have consecutive
``threadIdx.x`` and so consecutive *rows* of C.  At every step k they read
``A[row, k]`` for 32 rows, addresses K floats apart: 32 separate memory
transactions where one would do.  (They all read the same ``B[k, col]``,
which is a broadcast.)  The next rung only swaps the two axes.
"""

from gemmlib.backend import cuda, float32
from gemmlib.spec import KernelSpec, cdiv

BLOCK = 32  # threads per block along x and along y: 32 x 32 = 1024


def c_element(block_x, block_y, thread_x, thread_y):
    """The (row, col) of C computed by one thread: x walks down rows."""
    row = block_x * BLOCK + thread_x
    col = block_y * BLOCK + thread_y
    return row, col


_c_element = cuda.jit(device=True)(c_element)


@cuda.jit
def naive_kernel(A, B, C):
    row, col = _c_element(cuda.blockIdx.x, cuda.blockIdx.y, cuda.threadIdx.x, cuda.threadIdx.y)
    M, K = A.shape
    N = B.shape[1]
    if row < M and col < N:  # the grid overhangs C when M or N is not a multiple of 32
        acc = float32(0.0)
        for k in range(K):
            acc += A[row, k] * B[k, col]
        C[row, col] = acc


def grid(M, N, K):
    return (cdiv(M, BLOCK), cdiv(N, BLOCK), 1)  # x covers rows, y covers columns


SPEC = KernelSpec(
    name="naive",
    chapter="03-naive",
    idea="one thread per element of C; threadIdx.x runs down the rows (uncoalesced)",
    kernel=naive_kernel,
    block=(BLOCK, BLOCK, 1),
    tile=(BLOCK, BLOCK),
    grid=grid,
    params={"BLOCK": BLOCK},
    index={"c_element": c_element},
    module=__name__,
)
