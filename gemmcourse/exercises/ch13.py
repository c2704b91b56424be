"""Chapter 13's exercise answers (kernel choice and split-K): the values the checks compare
with, kept here so that the page's check cells do not spell them out."""

from __future__ import annotations


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def blocks(M: int, N: int, BM: int, BN: int, **_) -> int:
    """Blocks of a launch that gives each BM x BN tile of an M x N output one block."""
    return _cdiv(M, BM) * _cdiv(N, BN)


def busy_fraction(M: int, N: int, BM: int, BN: int, sms: int, **_) -> float:
    """Share of ``sms`` SMs that hold a block when each holds at most one (may exceed 1)."""
    return blocks(M, N, BM, BN) / sms


def fill_splits(M: int, N: int, BM: int, BN: int, sms: int, **_) -> int:
    """The smallest slice count S whose S x blocks give every SM at least one block."""
    return _cdiv(sms, blocks(M, N, BM, BN))


def workspace_bytes(S: int, M: int, N: int, **_) -> int:
    """Bytes of the float32 workspace: S partial M x N tiles."""
    return S * M * N * 4


def workspace_traffic(S: int, M: int, N: int, **_) -> int:
    """Bytes the workspace moves per call: written once by the main kernel, read once by the
    reduction."""
    return 2 * workspace_bytes(S, M, N)


def k_slice(K: int, BK: int, S: int, z: int) -> tuple[int, int]:
    """The k-tiles [t0, t1) block z of an S-slice launch sums: the kernel's own rule,
    as the chapter's figure draws it."""
    from gemmcourse.viz import split_k_slices

    return split_k_slices(K, BK, S)[z]


def packed_words(ptr: int, rows: int, cols: int, itemsize: int = 4) -> tuple:
    """The 9 parameter words ``gemmlib.runtime.launch._launch`` writes for one (rows, cols) array at
    ``ptr``, read back from the parameter block it hands the driver (nothing launches)."""
    import ctypes
    from unittest import mock

    from gemmlib.runtime import launch

    class RecordingDriver:
        def check(self, rc, what):
            pass

        def launch_kernel(self, fn, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
            self.params = params
            return 0

    drv = RecordingDriver()
    with mock.patch.object(launch, "driver", lambda: drv):
        launch._launch(0, (1, 1, 1), (32, 1, 1), 0, 0,
                       launch._array_words(ptr, rows, cols, itemsize))
    slot = lambda i: ctypes.c_void_p.from_address(drv.params + 8 * i).value  # noqa: E731
    return tuple(ctypes.c_int64.from_address(slot(i)).value for i in range(9))
