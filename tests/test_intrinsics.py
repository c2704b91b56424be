"""gemmlib.intrinsics.vector: the float4 intrinsics (GPU / PTX) and their simulator twins."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from gemmlib import backend
from gemmlib.intrinsics import vector
from _reliability import check_offline


def test_twins_load_and_store_four_floats():
    a = np.arange(32, dtype=np.float32).reshape(4, 8)
    assert vector.load4_py(a, 1, 4) == (12.0, 13.0, 14.0, 15.0)
    vector.store4_py(a, 2, 0, 1.0, 2.0, 3.0, 4.0)
    assert a[2, :4].tolist() == [1.0, 2.0, 3.0, 4.0]


def test_twin_rejects_a_misaligned_element():
    a = np.zeros((4, 8), np.float32)
    with pytest.raises(vector.MisalignedAccess, match="multiple of 16"):
        vector.load4_py(a, 0, 2)


def test_twin_rejects_rows_that_are_not_16_byte_multiples():
    a = np.zeros((4, 7), np.float32)  # row 1 starts 28 bytes in
    with pytest.raises(vector.MisalignedAccess):
        vector.load4_py(a, 1, 0)


def test_twin_rejects_a_float4_leaving_the_row():
    a = np.zeros((2, 6), np.float32)
    with pytest.raises(vector.MisalignedAccess, match="leave a row"):
        vector.store4_py(a, 0, 4, 0, 0, 0, 0)


def test_aligned16_twin():
    buf = np.zeros(16, np.float32)
    off = (-buf.ctypes.data % 16) // 4  # first element on a 16-byte boundary
    assert vector.aligned16_py(buf[off:off + 8]) is True
    assert vector.aligned16_py(buf[off + 1:off + 9]) is False


def test_shared_alignment_is_off_in_the_simulator():
    assert vector.SHARED_ALIGN == (None if backend.SIMULATOR else 16)


def test_simulator_uses_the_twins():
    if backend.SIMULATOR:
        assert vector.load4 is vector.load4_py and vector.store4 is vector.store4_py


PTX_CHECK = textwrap.dedent('''
    from gemmlib.backend import cuda, float32
    from gemmlib.intrinsics.vector import load4, store4, aligned16, SHARED_ALIGN
    from gemmlib.ptx import offline_device
    from numba import types

    def k(A, C):
        s = cuda.shared.array((2, 8), float32, alignment=SHARED_ALIGN)
        t = cuda.threadIdx.x
        if aligned16(A):
            a, b, c, d = load4(A, t, 0)
            store4(s, 0, 4, a, b, c, d)
        cuda.syncthreads()
        x, y, z, w = load4(s, 0, 4)
        store4(C, t, 0, x, y, z, w)

    sig = (types.float32[:, ::1], types.float32[:, ::1])
    with offline_device((9, 0)):
        ptx, _ = cuda.compile_ptx(k, sig, cc=(9, 0))
    for instr in ("ld.global.v4.f32", "st.shared.v4.f32", "ld.shared.v4.f32",
                  "st.global.v4.f32"):
        assert instr in ptx, instr
    assert "ld.local" not in ptx and "st.local" not in ptx
    print("ok")
''')


def test_intrinsics_compile_to_16_byte_instructions():
    """The real compiler (subprocess: this session runs the simulator) emits v4 accesses."""
    check_offline(PTX_CHECK)


def test_intrinsic_rejects_wrong_array_types():
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0")
    code = textwrap.dedent('''
        from gemmlib.backend import cuda
        from gemmlib.intrinsics.vector import load4
        from numba import types
        def k(A, C):
            a, b, c, d = load4(A, 0, 0)
            C[0] = a
        try:
            cuda.compile_ptx(k, (types.float64[:, ::1], types.float64[::1]), cc=(9, 0))
        except Exception as e:
            print("refused:", "float32" in str(e))
    ''')
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=300)
    assert "refused: True" in proc.stdout, proc.stdout + proc.stderr[-2000:]
