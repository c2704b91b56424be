"""Matrix multiplication on the CPU, for the "Loops on the CPU" chapter.

Three families, from slowest to fastest:

* :func:`matmul_python` -- the definition typed as three nested Python loops
  over lists.  Every ``+=`` is an interpreted bytecode sequence, so keep it to
  tiny sizes (a 64 x 64 product is already ~0.1 s).
* ``matmul_ijk``, ``matmul_ikj``, ``matmul_kij``, ``matmul_jki`` -- the same
  loops compiled to machine code by ``numba.njit``; only the nesting order
  differs, and with it the order in which memory is walked.  Plus
  :func:`matmul_tiled`, the ikj loop strip-mined into tiles that fit a cache.
* :func:`matmul_blas` -- NumPy's ``@``, which calls the BLAS library NumPy was
  built with (OpenBLAS, MKL or Accelerate): blocked, vectorised, multithreaded.

Every function returns a new float32 matrix ``C = A @ B``; A is (M, K), B is
(K, N).  Nothing here touches the GPU.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numba
import numpy as np


def gemm_flops(M: int, N: int, K: int) -> int:
    """Floating-point operations in C = A @ B: one multiply and one add per (i, j, k)."""
    return 2 * M * N * K


# --------------------------------------------------------------------------
# 1. The definition, in plain Python


def matmul_python(A, B):
    """C[i][j] = sum_k A[i][k] * B[k][j], with Python lists and three loops."""
    A_rows = np.asarray(A, dtype=np.float32).tolist()
    B_rows = np.asarray(B, dtype=np.float32).tolist()
    M, K = len(A_rows), len(A_rows[0]) if A_rows else 0
    N = len(B_rows[0]) if B_rows else 0
    C = [[0.0] * N for _ in range(M)]
    for i in range(M):
        for j in range(N):
            total = 0.0
            for k in range(K):
                total += A_rows[i][k] * B_rows[k][j]
            C[i][j] = total
    return np.array(C, dtype=np.float32).reshape(M, N)


# --------------------------------------------------------------------------
# 2. Compiled loops: the same arithmetic, four nesting orders
#
# Row-major storage puts A[i, k] and A[i, k+1] next to each other in memory,
# and likewise B[k, j] and B[k, j+1].  The innermost loop decides the stride
# of the memory walk:
#   ijk: inner k  -> A along a row (stride 1), B down a column (stride N)
#   ikj: inner j  -> B and C along rows (stride 1); A[i, k] stays in a register
#   kij: inner j  -> same inner loop as ikj, but C is swept K times in full
#   jki: inner i  -> A and C down columns (stride K and N): the worst order


@numba.njit(cache=False)
def matmul_ijk(A, B):
    M, K = A.shape
    N = B.shape[1]
    C = np.zeros((M, N), dtype=np.float32)
    for i in range(M):
        for j in range(N):
            acc = np.float32(0.0)
            for k in range(K):
                acc += A[i, k] * B[k, j]
            C[i, j] = acc
    return C


@numba.njit(cache=False)
def matmul_ikj(A, B):
    M, K = A.shape
    N = B.shape[1]
    C = np.zeros((M, N), dtype=np.float32)
    for i in range(M):
        for k in range(K):
            a = A[i, k]
            for j in range(N):
                C[i, j] += a * B[k, j]
    return C


@numba.njit(cache=False)
def matmul_kij(A, B):
    M, K = A.shape
    N = B.shape[1]
    C = np.zeros((M, N), dtype=np.float32)
    for k in range(K):
        for i in range(M):
            a = A[i, k]
            for j in range(N):
                C[i, j] += a * B[k, j]
    return C


@numba.njit(cache=False)
def matmul_jki(A, B):
    M, K = A.shape
    N = B.shape[1]
    C = np.zeros((M, N), dtype=np.float32)
    for j in range(N):
        for k in range(K):
            b = B[k, j]
            for i in range(M):
                C[i, j] += A[i, k] * b
    return C


@numba.njit(cache=False)
def matmul_tiled(A, B, tile=64):
    """ikj order, strip-mined: each loop is split into an outer loop over tiles
    and an inner loop within one tile, so a tile x tile block of B is reused for
    a whole tile of rows of A while it is still in cache."""
    M, K = A.shape
    N = B.shape[1]
    C = np.zeros((M, N), dtype=np.float32)
    for i0 in range(0, M, tile):
        i1 = min(i0 + tile, M)
        for k0 in range(0, K, tile):
            k1 = min(k0 + tile, K)
            for j0 in range(0, N, tile):
                j1 = min(j0 + tile, N)
                for i in range(i0, i1):          # the three loops inside one tile
                    for k in range(k0, k1):
                        a = A[i, k]
                        for j in range(j0, j1):
                            C[i, j] += a * B[k, j]
    return C


#: The compiled loop orders by name, as the chapter compares them.
LOOP_ORDERS = {
    "ijk": matmul_ijk,
    "ikj": matmul_ikj,
    "kij": matmul_kij,
    "jki": matmul_jki,
}


# --------------------------------------------------------------------------
# 3. BLAS


def matmul_blas(A, B):
    """NumPy's matmul: hands the work to the BLAS library (SGEMM for float32)."""
    return np.matmul(A, B)


def blas_name() -> str:
    """Which BLAS library NumPy uses, as far as NumPy reports it."""
    try:
        cfg = np.show_config(mode="dicts")
        blas = cfg.get("Build Dependencies", {}).get("blas", {})
        name = blas.get("name", "unknown")
        version = blas.get("version", "")
        return f"{name} {version}".strip()
    except Exception:  # pragma: no cover - depends on the NumPy build
        return "unknown"


# --------------------------------------------------------------------------
# Timing


@dataclass
class Timing:
    method: str
    size: int
    seconds: float

    @property
    def gflops(self) -> float:
        return gemm_flops(self.size, self.size, self.size) / self.seconds / 1e9


def best_time(fn, *args, repeat: int = 3, min_time: float = 0.05) -> float:
    """Best wall time of ``fn(*args)`` over ``repeat`` rounds (after one warm-up call).

    A round repeats the call until ``min_time`` has passed, so very fast calls
    are not lost in the timer's resolution.  The warm-up call also triggers
    numba's compilation, which is not counted.
    """
    fn(*args)
    best = float("inf")
    for _ in range(repeat):
        n, t0 = 0, time.perf_counter()
        while True:
            fn(*args)
            n += 1
            elapsed = time.perf_counter() - t0
            if elapsed >= min_time:
                break
        best = min(best, elapsed / n)
    return best


def random_pair(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    A = rng.uniform(-1, 1, (n, n)).astype(np.float32)
    B = rng.uniform(-1, 1, (n, n)).astype(np.float32)
    return A, B


def benchmark(methods: dict, sizes, *, repeat: int = 3, min_time: float = 0.05,
              python_max: int = 64) -> list[Timing]:
    """Time every method (name -> function) at every square size.

    The pure-Python loop is skipped above ``python_max`` (it would take minutes).
    """
    out = []
    for n in sizes:
        A, B = random_pair(n)
        for name, fn in methods.items():
            if fn is matmul_python and n > python_max:
                continue
            out.append(Timing(name, n, best_time(fn, A, B, repeat=repeat, min_time=min_time)))
    return out
