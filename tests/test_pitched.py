"""Slices of wider matrices read where they lie by the rungs that read A and B by pointer
(issue 32): ``x[:, :k]``, ``big[:, 8:8 + k]`` and the transposes of such slices, on every
rung ``kernel="auto"`` runs off Hopper -- the fp32 CUDA-core rungs ``warptile`` and
``split_k``, ``mma_pipeline`` and ``mma_split_k`` (fp16, bf16, tf32, 3xtf32, with their
column-major "KM" / "NK" builds) and ``skinny`` -- in the simulator against float64, into a
NaN-poisoned C, the memory around each slice NaN too: no copy of either operand is made
(the copying functions refuse, and the kernel's arguments are the caller's memory).  Odd
shapes; rows whose pitch or first element breaks 16-byte alignment are copied, right all
the same; the launch writes the pitch into the kernel's argument words (the GPU path,
its driver stubbed); the simulator reads an argument as the GPU does (a kernel that
ignored the pitch would fail here); the views compile to global loads.  On a GPU (``-m
gpu``): torch slices through ``auto`` and each rung by name, with no copy.
"""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

import gemmlib
from gemmlib import backend
from gemmlib import precision as P
from gemmlib.runtime import launch, select
from _reliability import check_offline

sim_only = pytest.mark.skipif(not backend.SIMULATOR, reason="simulator sizes and NumPy inputs")

#: small tiles: the rungs' code at simulator speed
SMALL_WARPTILE = dict(BM=16, BN=32, BK=8, WM=16, WN=32, WNITER=1, TM=4, TN=4)
SMALL_SKINNY = dict(MT=4, CT=4, NT=8, U=2)


def _small_pipeline(precision: str) -> dict:
    return dict(precision=precision, BM=32, BN=32, BK=32 if precision in ("fp16", "bf16") else 16,
                WM=32, WN=32, STAGES=2)


#: (rung, build parameters, the call's precision)
RUNGS = ([("warptile", SMALL_WARPTILE, "fp32"),
          ("split_k", dict(SMALL_WARPTILE, SPLITS=2), "fp32")]
         + [("skinny", dict(SMALL_SKINNY, precision=p), p) for p in ("fp32", "fp16", "bf16")]
         + [("skinny", dict(SMALL_SKINNY, precision="fp32", SPLITS=2), "fp32")]
         + [("mma_pipeline", _small_pipeline(p), p) for p in ("fp16", "bf16", "tf32", "3xtf32")]
         + [("mma_split_k", dict(_small_pipeline(p), SPLITS=2), p)
            for p in ("fp16", "bf16", "tf32", "3xtf32")])
RUNG_IDS = [f"{r}-{p}" + ("-s2" if "SPLITS" in k else "") for r, k, p in RUNGS]

#: (M, N, K) per (A, B) order that each kind of rung reads in place, odd wherever it allows:
#: the fp32 CUDA-core rungs and skinny anything (skinny at decode sizes); the 16-byte-piece
#: rungs (mma) whole pieces along K and N, and along M for a column-major A (else
#: ``gemmlib.matmul`` pads them, as it pads packed operands)
IN_PLACE = {
    "cuda": {"CC": (37, 61, 29), "CF": (29, 37, 61), "FC": (61, 29, 37), "FF": (37, 29, 61)},
    "skinny": {"CC": (5, 37, 61), "CF": (3, 29, 37), "FC": (6, 29, 61), "FF": (4, 29, 37)},
    "mma": {"CC": (37, 24, 40), "CF": (61, 40, 24), "FC": (24, 16, 40), "FF": (16, 24, 40)}}
#: odd shapes for every rung (the mma rungs pad -- copy -- where the rows are not whole pieces)
ODD = [((1, 37, 61), "CF"), ((61, 1, 37), "FC"), ((37, 61, 1), "CC"), ((1, 1, 1), "FF"),
       ((13, 11, 29), "CC")]

NAN_BITS = {"float32": np.float32(np.nan), "float16": np.float16(np.nan), "uint16": 0x7FC0}


def _storage(precision: str) -> str:
    return {"fp16": "float16", "bf16": "uint16"}.get(precision, "float32")


def _aligned_empty(shape, dtype, offset_bytes: int = 0) -> np.ndarray:
    """An uninitialised array whose first element is ``offset_bytes`` past a 64-byte
    boundary."""
    dtype = np.dtype(dtype)
    n = int(np.prod(shape)) * dtype.itemsize
    raw = np.empty(n + 128, np.uint8)
    start = (-raw.ctypes.data) % 64 + offset_bytes
    return raw[start:start + n].view(dtype).reshape(shape)


def sliced(rows: int, cols: int, order: str, precision: str, rng, *, pitch_pad: int = 8,
           offset: int = 8, round_to: int = 8):
    """A (rows, cols) operand lying in a wider matrix of NaN: order "C" ``mem[:, offset:
    offset + cols]`` (its rows a pitch apart), "F" the transpose of such a slice of a
    (cols, rows) matrix.  The pitch: ``pitch_pad`` more elements than needed, rounded up to
    ``round_to``.  Returns (the operand as passed to matmul, its float64 values, the memory
    it lies in)."""
    x = rng.uniform(-1, 1, (rows, cols)).astype(np.float32)
    if precision == "fp16":
        vals = x.astype(np.float16)
        x64 = vals.astype(np.float64)
    elif precision == "bf16":
        vals = P.to_bf16_bits(x)
        x64 = P.bf16_bits_to_float32(vals).astype(np.float64)
    else:
        vals, x64 = x, x.astype(np.float64)
    dt = _storage(precision)
    inner = cols if order == "C" else rows
    ld = -(-(inner + offset + pitch_pad) // round_to) * round_to
    mem = _aligned_empty((rows if order == "C" else cols, ld), dt)
    mem[...] = NAN_BITS[dt]
    view = mem[:, offset:offset + cols] if order == "C" else mem[:, offset:offset + rows].T
    view[...] = vals
    return (P.BF16Array(view) if precision == "bf16" else view), x64, mem


def _operands(M, N, K, orders, precision, rng, **kw):
    A, a64, amem = sliced(M, K, orders[0], precision, rng, **kw)
    B, b64, bmem = sliced(K, N, orders[1], precision, rng, **kw)
    return A, B, a64 @ b64, amem, bmem


def _poisoned(M, N):
    return np.full((M, N), np.nan, np.float32)


def _check(C, ref, precision, K, what):
    assert np.isfinite(C).all(), f"{what}: NaN in C (an element unwritten, or read outside)"
    err = backend.relative_error(C, ref)
    assert err <= P.tolerance(precision, K), f"{what}: error {err:.3g}"


@pytest.fixture
def no_copies(monkeypatch):
    """The copying functions of the product path refuse; the kernel's A and B recorded."""
    from gemmlib.paths import product

    for name in ("reordered", "padded"):
        monkeypatch.setattr(product, name,
                            lambda *a, _n=name, **k: pytest.fail(f"{_n}: an operand copied"))
    return _spy_launches(monkeypatch)


def _spy_launches(monkeypatch):
    seen = []
    real = launch.launch

    def spy(plan, A, B, C, *args, **kw):
        seen.append((plan, A, B))
        return real(plan, A, B, C, *args, **kw)

    monkeypatch.setattr(launch, "launch", spy)
    return seen


def _assert_in_place(seen, amem, bmem, orders):
    """The kernel read the caller's memory, as its slices (not packed copies)."""
    plan, A, B = seen[0]
    spec = plan.spec
    assert spec.reads_pitched
    assert spec.a_operand == ("KM" if orders[0] == "F" else "MK"), spec.name
    assert spec.b_operand == ("NK" if orders[1] == "F" else "KN"), spec.name
    for arg, mem in ((A, amem), (B, bmem)):
        assert np.shares_memory(arg, mem) and not arg.flags.c_contiguous, spec.name


@sim_only
@pytest.mark.parametrize("orders", ["CC", "CF", "FC", "FF"])
@pytest.mark.parametrize("rung, params, precision", RUNGS, ids=RUNG_IDS)
def test_slices_are_read_in_place(rung, params, precision, orders, no_copies):
    """Row-major slices and transposes of slices, of A and B both: the rung (or its
    column-major build) reads the caller's memory, and C is right."""
    spec = select.build(rung, params)
    kind = "skinny" if rung == "skinny" else "mma" if rung.startswith("mma") else "cuda"
    M, N, K = IN_PLACE[kind][orders]
    rng = np.random.default_rng(M * N + K)
    A, B, ref, amem, bmem = _operands(M, N, K, orders, precision, rng)
    C = _poisoned(M, N)
    gemmlib.matmul(A, B, kernel=spec, out=C, precision=precision)
    _check(C, ref, precision, K, f"{spec.name} {orders} {M}x{N}x{K}")
    _assert_in_place(no_copies, amem, bmem, orders)
    if "SPLITS" in params and orders[1] == "C":   # K in two slices (a K-major B's build
        assert no_copies[0][0].grid[2] == 2           # of skinny takes its own tuning)


@sim_only
@pytest.mark.parametrize("shape, orders", ODD, ids=[f"{s[0]}x{s[1]}x{s[2]}-{o}" for s, o in ODD])
@pytest.mark.parametrize("rung, params, precision", RUNGS, ids=RUNG_IDS)
def test_odd_shapes_of_slices(rung, params, precision, shape, orders):
    """Ones and primes: right wherever the operands end up (the mma rungs copy rows that
    are not whole 16-byte pieces into padded ones, as for packed operands)."""
    spec = select.build(rung, params)
    M, N, K = shape
    A, B, ref, _, _ = _operands(M, N, K, orders, precision, np.random.default_rng(M + N + K))
    C = _poisoned(M, N)
    gemmlib.matmul(A, B, kernel=spec, out=C, precision=precision)
    _check(C, ref, precision, K, f"{spec.name} {orders} {shape}")


#: (precision, M, N, K): what ``auto`` runs in the simulator -- skinny at decode sizes (its
#: fp32 form for tf32), warptile for fp32, mma_pipeline for the tensor-core precisions
AUTO = [("fp32", 5, 29, 37), ("fp32", 24, 37, 29), ("fp16", 3, 40, 24), ("bf16", 24, 16, 40),
        ("tf32", 6, 24, 16), ("3xtf32", 24, 40, 16)]


@sim_only
@pytest.mark.parametrize("precision, M, N, K", AUTO)
@pytest.mark.parametrize("orders", ["CF", "FC"])
def test_auto_reads_slices_in_place(precision, M, N, K, orders, no_copies):
    """``kernel="auto"``: the rung it picks (skinny, warptile, mma_pipeline) reads both
    slices in place."""
    if orders == "FC" and M % 8:
        M = 8   # a column-major A: M whole 16-byte pieces for the mma rungs' KM build
    A, B, ref, amem, bmem = _operands(M, N, K, orders, precision, np.random.default_rng(M))
    C = _poisoned(M, N)
    gemmlib.matmul(A, B, out=C, precision=precision)
    _check(C, ref, precision, K, f"auto {precision} {orders}")
    _assert_in_place(no_copies, amem, bmem, orders)
    want = "skinny" if M <= select.skinny_limit(precision) else (
        "warptile" if precision == "fp32" else "mma_pipeline")
    assert select.rung_of(no_copies[0][0].spec) == want


#: (rung, params, precision, what breaks the alignment)
UNALIGNED = [("warptile", SMALL_WARPTILE, "fp32", "pitch"),
             ("warptile", SMALL_WARPTILE, "fp32", "start"),
             ("mma_pipeline", _small_pipeline("fp16"), "fp16", "pitch"),
             ("mma_split_k", dict(_small_pipeline("bf16"), SPLITS=2), "bf16", "start"),
             ("mma_pipeline", _small_pipeline("tf32"), "tf32", "pitch"),
             ("skinny", dict(SMALL_SKINNY, precision="bf16"), "bf16", "pitch"),
             ("skinny", dict(SMALL_SKINNY, precision="fp16"), "fp16", "start")]


@sim_only
@pytest.mark.parametrize("orders", ["CC", "FF"])
@pytest.mark.parametrize("rung, params, precision, broken", UNALIGNED,
                         ids=[f"{u[0]}-{u[2]}-{u[3]}" for u in UNALIGNED])
def test_unaligned_slices_are_copied(rung, params, precision, broken, orders, monkeypatch):
    """A pitch that is not a multiple of 16 bytes, or a slice whose first element is not
    16-byte aligned: each operand is copied into packed rows first, and C is right."""
    from gemmlib.paths import product

    copies = []
    real = product.reordered
    monkeypatch.setattr(product, "reordered",
                        lambda op, *a, **k: copies.append(op.shape) or real(op, *a, **k))
    seen = _spy_launches(monkeypatch)
    spec = select.build(rung, params)
    M, N, K = (3, 29, 40) if rung == "skinny" else (24, 16, 40)
    item = np.dtype(_storage(precision)).itemsize
    kw = (dict(pitch_pad=8 + 1, round_to=1) if broken == "pitch"
          else dict(offset=8 + 1, pitch_pad=7))
    rng = np.random.default_rng(7)
    A, B, ref, amem, bmem = _operands(M, N, K, orders, precision, rng, **kw)
    if broken == "pitch":
        assert all((m.strides[0] % 16) for m in (amem, bmem)), (amem.strides, item)
    C = _poisoned(M, N)
    gemmlib.matmul(A, B, kernel=spec, out=C, precision=precision)
    _check(C, ref, precision, K, f"{spec.name} {broken} {orders}")
    assert sorted(copies) == sorted([(M, K), (K, N)])
    _, Ak, Bk = seen[0]
    assert not np.shares_memory(Ak, amem) and not np.shares_memory(Bk, bmem)


@sim_only
def test_packed_column_major_a_runs_the_skinny_km_build(no_copies):
    """The decode rung's new column-major build reads a packed ``x.t()`` in place too."""
    rng = np.random.default_rng(3)
    X = rng.uniform(-1, 1, (37, 6)).astype(np.float32)    # (K, M): A = X.T
    W = rng.uniform(-1, 1, (29, 37)).astype(np.float32)   # (N, K): B = W.T
    C = _poisoned(6, 29)
    gemmlib.matmul(X.T, W.T, out=C)
    _check(C, X.T.astype(np.float64) @ W.T, "fp32", 37, "skinny km nk")
    plan, A, B = no_copies[0]
    assert plan.spec.name.endswith("_nk_km") and np.shares_memory(A, X) and np.shares_memory(B, W)
    assert select.with_layout(select.build("skinny", dict(SMALL_SKINNY, precision="fp16",
                                                          A_LAYOUT="KM")), "NK").a_operand == "KM"


# --------------------------------------------------------------------------- the simulator


@sim_only
def test_the_simulated_argument_reads_as_the_gpu_does():
    """A slice passed to a simulated kernel reads packed rows from its first element, as a
    GPU kernel indexing its C-contiguous argument does; ``pitched`` gives the slice."""
    from numba.cuda.simulator.cudadrv.devicearray import FakeWithinKernelCUDAArray

    from gemmlib.intrinsics.pitch import pitched_py, simulated_argument

    mem = np.arange(6 * 16, dtype=np.float32).reshape(6, 16)
    view = mem[:, 4:9]
    arg = FakeWithinKernelCUDAArray(simulated_argument(view))
    assert arg.shape == (6, 5) and arg.strides == view.strides
    assert arg[1, 0] == mem[0, 9] and arg[2, 3] == mem.ravel()[4 + 13]
    p = pitched_py(arg)
    assert p is view and p[2, 3] == mem[2, 7]
    with pytest.raises(IndexError):
        p[0, 5]
    packed = np.ones((3, 4), np.float32)
    assert pitched_py(packed) is packed


def test_the_twins_check_a_slices_true_addresses():
    """cp.async's and load4's simulator twins refuse a 16-byte access that a slice's pitch
    or first element would leave misaligned on the GPU."""
    from gemmlib.intrinsics import async_copy, vector

    mem = _aligned_empty((4, 48), np.uint16)
    dst = np.zeros(64, np.uint16)
    async_copy.cp_async16_py(dst, 0, mem[:, 8:40], 1, 8, 16)   # rows 96 bytes apart
    async_copy.cp_async_commit_py()
    async_copy.cp_async_wait_all_py()
    with pytest.raises(async_copy.AsyncCopyError, match="not a multiple of 16"):
        async_copy.cp_async16_py(dst, 0, mem[:, 1:33], 0, 0, 16)
    f32 = _aligned_empty((4, 22), np.float32)
    with pytest.raises(vector.MisalignedAccess):
        vector.load4_py(f32[:, 4:12], 1, 0)                     # rows 88 bytes apart


@sim_only
def test_a_kernel_that_ignores_the_pitch_fails_in_the_simulator(monkeypatch):
    """Were a rung's build for slices to index its arguments directly, the simulator would
    give what the GPU gives: rows of the wrong data (here the NaN around the slice)."""
    import gemmlib.kernels.warptile as warptile

    monkeypatch.setattr(warptile, "pitched", lambda arr: arr)
    spec = warptile.build(**SMALL_WARPTILE, PITCHED=True)   # (a fresh build: its view bound)
    rng = np.random.default_rng(1)
    A, B, ref, _, _ = _operands(9, 8, 12, "CC", "fp32", rng)
    C = _poisoned(9, 8)
    gemmlib.matmul(A, B, kernel=spec, out=C)
    assert not np.isfinite(C).all()


# --------------------------------------------------------------------------- the launch (GPU path)


class _Compiled:
    def function(self, ctx, shared=0):
        return 0


@pytest.fixture
def launches(monkeypatch):
    """The GPU path with its compile and driver stubbed: each launch's pointer array."""
    from gemmlib.runtime import memory

    seen = []

    class Driver:
        def launch_kernel(self, fn, gx, gy, gz, bx, by, bz, shared, stream, pointers, extra):
            seen.append(pointers)
            return 0

        def launch_kernel_ex(self, config, fn, pointers, extra):   # early launch, clusters
            seen.append(pointers)
            return 0

        def check(self, rc, what):
            assert not rc, what

    monkeypatch.setattr(launch, "driver", lambda: Driver())
    monkeypatch.setattr(launch, "compiled_spec", lambda s: _Compiled())
    monkeypatch.setattr(launch, "compiled_reduce", lambda s: _Compiled())
    monkeypatch.setattr(memory, "allocate", lambda nbytes, stream, zero=False:
                        type("Buffer", (), {"ptr": 1 << 40, "nbytes": nbytes})())
    monkeypatch.setattr(launch, "_SCRATCH", type(launch._SCRATCH)())
    return seen


def _bound(rung, params, M, N, K):
    from gemmlib import dispatch

    p = dispatch.plan(select.build(rung, params), M, N, K)
    return p, launch._Bound(p, 0)


def _block(b, which, launched):
    """The words of bound plan ``b``'s parameter block ``which``, which launch
    ``launched`` (its pointer array) must have used."""
    values, pointers = b.parameters(which)
    assert pointers == launched, which
    return list(values)


@pytest.mark.parametrize("rung, params", [
    ("warptile", {}), ("split_k", dict(SPLITS=3)), ("mma_pipeline", dict(precision="bf16")),
    ("mma_split_k", dict(precision="tf32", SPLITS=2, A_LAYOUT="KM")),
    ("skinny", dict(precision="fp16", MT=4, B_LAYOUT="NK"))])
def test_the_pitch_reaches_the_kernels_argument_words(rung, params, launches):
    """``lds`` becomes the strides words (bytes) of the kernel's A and B in a build for
    slices, a side given as packed (0) or a call without ``lds`` its packed stride; the
    packed build's words are never rewritten (it reads no strides)."""
    M, N, K = 64, 48, 256
    p, b = _bound(rung, dict(params, PITCHED=True), M, N, K)
    (ar, ac), (br, bc) = p.spec.kernel_operands(M, N, K)
    ia, ib = (np.dtype(d).itemsize for d in p.spec.kernel_dtypes[:2])
    A_STRIDE, B_STRIDE = launch._A_WORD + 3, launch._B_WORD + 3
    launch.run(p, 0x1000, 0x2000, 0x3000, 7, bound=b, lds=(ac + 8, bc + 24), graph=False)
    words = _block(b, "words", launches[0])
    assert words[launch._A_WORD] == 0x1000 and words[launch._B_WORD] == 0x2000
    assert words[launch._A_WORD + 1:launch._A_WORD + 3] == [ar, ac]   # the shape: its own
    assert (words[A_STRIDE], words[B_STRIDE]) == ((ac + 8) * ia, (bc + 24) * ib)
    n = len(launches)
    launch.run(p, 0x1000, 0x2000, 0x3000, 7, bound=b, lds=(0, bc + 8), graph=False)
    words = _block(b, "words", launches[n])
    assert (words[A_STRIDE], words[B_STRIDE]) == (ac * ia, (bc + 8) * ib)
    packed_words = launch._array_words(0x1100, ar, ac, ia) + launch._array_words(0x2100, br,
                                                                                bc, ib)
    n = len(launches)
    launch.run(p, 0x1100, 0x2100, 0x3100, 7, bound=b, graph=False)
    assert _block(b, "words", launches[n])[:2 * launch._WORDS] == packed_words
    p0, b0 = _bound(rung, params, M, N, K)   # the packed build
    assert not p0.spec.reads_pitched and b0.pitch_words is None
    n = len(launches)
    launch.run(p0, 0x1100, 0x2100, 0x3100, 7, bound=b0, lds=(ac + 8, 0), graph=False)
    assert _block(b0, "words", launches[n])[:2 * launch._WORDS] == packed_words


def test_launch_takes_row_pitches_from_the_array_interface():
    """``launch.launch`` on GPU arrays: their strides (bytes) as the rows' pitches."""
    class Arr:
        def __init__(self, strides, typestr):
            self.__cuda_array_interface__ = {"strides": strides, "typestr": typestr}

    assert launch._row_pitches(Arr((160, 4), "<f4"), Arr(None, "<u2")) == (40, 0)
    assert launch._row_pitches(Arr(None, "<f4"), Arr((144, 2), "<u2")) == (0, 72)


def test_each_rung_has_a_build_for_slices():
    """``with_pitch``: the ``PITCHED`` build of the rungs that read by pointer (name suffix
    ``_ld``, its layouts and tile kept), None for others; a packed build reads no strides."""
    for rung, params in [("warptile", dict(B_LAYOUT="NK")), ("split_k", dict(SPLITS=2)),
                         ("mma_pipeline", dict(precision="3xtf32", A_LAYOUT="KM")),
                         ("mma_split_k", dict(precision="bf16", SPLITS=3, B_LAYOUT="NK")),
                         ("skinny", dict(precision="bf16", MT=2, OUT="bf16", SPLITS=2))]:
        spec = select.build(rung, params)
        ld = select.with_pitch(spec)
        assert not spec.reads_pitched and ld.reads_pitched and "_ld" in ld.name, ld.name
        assert select.with_pitch(ld) is ld and select.with_pitch(spec) is ld
        assert {k: v for k, v in ld.params.items() if k != "PITCHED"} == dict(spec.params)
        assert (ld.a_operand, ld.b_operand) == (spec.a_operand, spec.b_operand)
    for rung, params in [("wgmma_ws", dict(precision="fp16")), ("double_buffer", {}),
                         ("mma_swizzle", dict(precision="fp16"))]:
        assert select.with_pitch(select.build(rung, params)) is None


def test_a_tma_rungs_strides_words_stay_packed(launches, monkeypatch):
    """The TMA rungs read a slice through its map: their words are never rewritten."""
    p, b = _bound("wgmma_ws", dict(precision="fp16"), 128, 256, 256)
    assert b.pitch_words is None
    monkeypatch.setattr(launch, "_maps_for_call", lambda *a, **k: (0x9000, a[2]))
    launch.run(p, 0x1000, 0x2000, 0x3000, 7, bound=b, lds=(264, 0), graph=False)
    words = _block(b, "words", launches[0])
    assert words[launch._A_WORD + 3] == 256 * 2 and words[b.maps_word] == 0x9000


def test_pitch_rule():
    """``_takes_pitch``: a pointer rung takes a pitch of whole 16-byte rows from a 16-byte
    aligned first element; not on the side of a pre-pass; the TMA rule as it was."""
    from gemmlib.frontends.describe import describe
    from gemmlib.paths.product import _pitch, _takes_pitch

    mem = _aligned_empty((8, 40), np.float32)
    warp = select.build("warptile", {})
    ok = describe(mem[:, 8:20], "A")
    assert _pitch(ok) == ("C", 40) and _takes_pitch(warp, ok, 40)
    assert not _takes_pitch(warp, ok, 41)                     # 164-byte rows
    off = describe(mem[:, 1:13], "A")
    assert not _takes_pitch(warp, off, 40)                    # first element 4 bytes in
    tma = select.build("wgmma_ws", dict(precision="fp16"))
    assert not tma.reads_pitched and _takes_pitch(tma, off, 40)   # TMA: its own rule
    tf32 = select.build("wgmma_tf32", {})
    assert tf32.b_prep is not None and not _takes_pitch(tf32, ok, 40, b_side=True)
    named = select.build("double_buffer", {})
    assert not named.reads_pitched and not _takes_pitch(named, ok, 40)


# --------------------------------------------------------------------------- the compiler


PTX_CHECK = textwrap.dedent('''
    from numba import types
    from gemmlib.backend import cuda, float32, uint16
    from gemmlib.intrinsics import async_copy, convert
    from gemmlib.intrinsics.pitch import pitched, read
    from gemmlib.intrinsics.vector import load4, store4
    from gemmlib.ptx import offline_device

    def k(A, H, C):
        s = cuda.shared.array(64, uint16)
        Ap, Hp = pitched(A), pitched(H)
        t = cuda.threadIdx.x
        a, b, c, d = load4(Ap, t, 4)
        x = read(Ap, t, 1)
        w0, w1, w2, w3 = convert.load16(Hp, t, 8)
        async_copy.cp_async16(s, 8 * t, Hp, t, 0, 16)
        async_copy.cp_async_commit()
        async_copy.cp_async_wait_all()
        store4(C, t, 0, a + x, b + float32(w0), c + float32(s[t]), d)

    sig = (types.float32[:, ::1], types.uint16[:, ::1], types.float32[:, ::1])
    with offline_device((9, 0)):
        ptx, _ = cuda.compile_ptx(k, sig, cc=(9, 0))
    for instr in ("ld.global.v4.f32", "ld.global.f32", "ld.global.v4.u32",
                  "cp.async.cg.shared.global"):
        assert instr in ptx, instr
    # rows by the strides words (ld.param of A's first stride), no generic loads
    import re
    assert not re.search(r"\\bld\\.(f32|v4\\.(f32|u32))\\b", ptx), "a generic load"
    print("ok")
''')


def test_builds_for_slices_compile_without_spills():
    """The ``PITCHED`` builds of the default tiles assemble (for sm_80 or sm_90) without
    spills and show their rungs' claims (16-byte global loads, cp.async, no local memory).
    (The packed builds compile to the PTX they did before: the views are compile-time.)"""
    from _reliability import compile_offline

    recs = compile_offline(
        "from gemmlib.runtime.select import build",
        "[(build(r, dict(p, PITCHED=True)), cc) for r, p, cc in ["
        " ('warptile', {}, (8, 0)), ('split_k', {'B_LAYOUT': 'NK'}, (9, 0)),"
        " ('mma_pipeline', {'precision': 'bf16', 'A_LAYOUT': 'KM'}, (8, 0)),"
        " ('mma_split_k', {'precision': '3xtf32'}, (9, 0)),"
        " ('skinny', {'precision': 'fp16'}, (9, 0)),"
        " ('skinny', {'precision': 'fp32', 'MT': 1, 'B_LAYOUT': 'NK'}, (8, 0))]]")
    assert len(recs) == 6
    for r in recs:
        assert "_ld" in r["kernel"] and not r["problems"] and r["spill_stores"] == 0, r


def test_pitched_views_compile_to_global_loads():
    """The real compiler (subprocess): a pitched view's 16-byte loads, scalar reads and
    cp.async stay global instructions."""
    check_offline(PTX_CHECK)


# --------------------------------------------------------------------------- on a GPU


def _torch_slices(torch, M, N, K, dtype, a_order, b_order, seed):
    """A and B as torch slices of wider matrices (8-element offsets, pitches of a row plus
    at least 72 elements, a multiple of 8), the memory around them NaN."""
    g = torch.Generator(device="cuda").manual_seed(seed)

    def one(rows, cols, order):
        inner, outer = (cols, rows) if order == "C" else (rows, cols)
        pitch = -(-(inner + 72) // 8) * 8   # whole 16-byte pieces
        mem = torch.full((outer, pitch), float("nan"), device="cuda", dtype=dtype)
        v = mem[:, 8:8 + inner]
        v.copy_((torch.rand(v.shape, generator=g, device="cuda") - 0.5).to(dtype))
        return v if order == "C" else v.t()

    return one(M, K, a_order), one(K, N, b_order)


def _gpu_calls(monkeypatch):
    """The operands the product path copies (their shapes) and each launch's (spec, lds)."""
    from gemmlib.paths import product
    from gemmlib.runtime import calls

    copies, seen = [], []
    for name in ("reordered", "padded"):
        real_copy = getattr(product, name)
        monkeypatch.setattr(product, name, lambda x, *a, _f=real_copy, **k:
                            copies.append(getattr(x, "shape", None)) or _f(x, *a, **k))
    real = calls.run

    def spy(call, *args, **kw):
        seen.append((call.plan.spec, kw.get("lds", ())))
        return real(call, *args, **kw)

    monkeypatch.setattr(calls, "run", spy)
    return copies, seen


GPU_CASES = [  # (precision, M, N, K): decode (skinny) and larger (warptile / split-K / mma)
    ("fp32", 8, 4096, 4096), ("fp32", 1000, 1536, 2048), ("fp32", 256, 256, 8192),
    ("tf32", 4, 3072, 1024), ("3xtf32", 1000, 1536, 1024), ("3xtf32", 128, 256, 8192),
    ("fp16", 1000, 1536, 1024), ("bf16", 256, 512, 8192), ("bf16", 4, 4096, 4096)]


@pytest.mark.gpu
@pytest.mark.parametrize("orders", ["CC", "CF", "FC", "FF"])
@pytest.mark.parametrize("precision, M, N, K", GPU_CASES)
def test_torch_slices_in_place_on_gpu(precision, M, N, K, orders, monkeypatch):
    """``x[:, 8:8+K] @ W[:, 8:8+K].t()`` and the other orders through ``auto``: right against
    float64, with no copy of either slice where the rung chosen reads pointers (on an
    H100/H200 fp16/bf16 go to the TMA rungs: tests/test_layouts.py)."""
    torch = pytest.importorskip("torch")
    if precision != "fp32" and tuple(backend.device_info().compute_capability) < (8, 0):
        pytest.skip("the tensor-core pipeline needs sm_80")
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(precision, torch.float32)
    A, B = _torch_slices(torch, M, N, K, dtype, orders[0], orders[1], M + N)
    copies, seen = _gpu_calls(monkeypatch)
    C = gemmlib.matmul(A, B, precision=None if precision in ("fp32", "fp16", "bf16")
                       else precision)
    torch.cuda.synchronize()
    ref = A.double() @ B.double()
    err = float((C.double() - ref).norm() / ref.norm())
    rounded = P.OUT16_ROUNDOFF.get(precision, 0.0) if C.dtype != torch.float32 else 0.0
    assert torch.isfinite(C).all() and err <= P.tolerance(precision, K) + rounded, err
    spec, lds = seen[-1]
    if spec.reads_pitched:   # (a TMA rung reads slices by its maps, where its builds can)
        assert any(lds) and not copies, (spec.name, copies)


GPU_RUNGS = [("warptile", {}, "fp32"), ("split_k", dict(SPLITS=4), "fp32"),
             ("skinny", dict(precision="fp32", MT=8), "fp32"),
             ("skinny", dict(precision="bf16", MT=4, OUT="bf16"), "bf16"),
             ("mma_pipeline", dict(precision="fp16"), "fp16"),
             ("mma_pipeline", dict(precision="tf32"), "tf32"),
             ("mma_split_k", dict(precision="bf16", SPLITS=4), "bf16"),
             ("mma_split_k", dict(precision="3xtf32", SPLITS=3), "3xtf32")]


@pytest.mark.gpu
@pytest.mark.parametrize("orders", ["CC", "CF", "FC", "FF"])
@pytest.mark.parametrize("rung, params, precision", GPU_RUNGS,
                         ids=[f"{r}-{p}" for r, _, p in GPU_RUNGS])
def test_each_rung_reads_torch_slices_in_place_on_gpu(rung, params, precision, orders,
                                                      monkeypatch):
    """Each pointer-reading rung by name on torch slices (odd M and N where the rung reads
    them in place): right, no copy, and the call's peak memory its C and less than a
    slice's copy."""
    torch = pytest.importorskip("torch")
    spec = select.build(rung, params)
    if tuple(backend.device_info().compute_capability) < tuple(spec.min_cc):
        pytest.skip(f"{spec.name} needs sm_{spec.min_cc[0]}{spec.min_cc[1]}")
    mma = rung.startswith("mma")   # (whole 16-byte pieces along N, and M for a KM A)
    M = 13 if rung == "skinny" else (1000 if mma and orders[0] == "F" else 997)
    N = 1536 if mma else 1531
    K = 2048
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(precision, torch.float32)
    A, B = _torch_slices(torch, M, N, K, dtype, orders[0], orders[1], 3)
    copies, seen = _gpu_calls(monkeypatch)
    C = gemmlib.matmul(A, B, kernel=spec, precision=precision)
    torch.cuda.synchronize()
    ref = A.double() @ B.double()
    rounded = P.OUT16_ROUNDOFF.get(precision, 0.0) if C.dtype != torch.float32 else 0.0
    bound = P.tolerance(precision, K) + rounded
    err = float((C.double() - ref).norm() / ref.norm())
    assert torch.isfinite(C).all() and err <= bound, err
    assert not copies and any(seen[-1][1]) and seen[-1][0].reads_pitched, copies
    del C
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    C = gemmlib.matmul(A, B, kernel=spec, precision=precision)
    torch.cuda.synchronize()
    grew = torch.cuda.max_memory_allocated() - base
    # C, and less than a copy of either slice (torch's allocator may round or keep a small
    # block of its own: 288 KiB once on an H200, mma_split_k 3xtf32 FF)
    copy = min(A.numel() * A.element_size(), B.numel() * B.element_size())
    assert grew < C.numel() * C.element_size() + copy // 4, (grew, C.numel() * C.element_size())
