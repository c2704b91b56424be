"""Operands as frameworks hold them: every layout of A and B (row- or column-major, a
leading dimension wider than the row, a step), stacks and batches, the bias, the result's
dtype -- in the simulator, against float64, into a poisoned C."""

import numpy as np
import pytest

import gemmlib
from gemmlib.frontends import checks
from gemmlib.frontends.describe import describe
from gemmlib.frontends.operand import Operand
from gemmlib import backend
from gemmlib.runtime import launch, select
from gemmlib.precision import BF16Array

RNG = np.random.default_rng(32)

#: (M, N, K): ones, primes, sizes that are not multiples of 8
SHAPES = [(1, 1, 1), (13, 11, 9)]
LAYOUTS = ["NN", "NT", "TN", "TT"]


def _data(shape, dtype):
    x = RNG.standard_normal(shape).astype(np.float32)
    if dtype == "bfloat16":   # values exactly representable in bfloat16
        bits = (x.view(np.uint32) >> 16).astype(np.uint16)
        return (bits.astype(np.uint32) << 16).view(np.float32), BF16Array(bits)
    x = x.astype(dtype)
    return x.astype(np.float32), x


def _laid_out(x, order):
    """``x`` (NumPy, or a BF16Array's bits) row-major ("N") or as the transpose of a
    row-major array ("T": column-major)."""
    if isinstance(x, BF16Array):
        return BF16Array(_laid_out(x.bits, order))
    return np.ascontiguousarray(x) if order == "N" else np.ascontiguousarray(x.T).T


def _values(C):
    if isinstance(C, BF16Array):
        return (C.bits.astype(np.uint32) << 16).view(np.float32)
    return np.asarray(C, dtype=np.float32)


def _poisoned(M, N, dtype):
    if dtype == "bfloat16":
        return BF16Array(np.full((M, N), 0x7FC0, np.uint16))
    return np.full((M, N), np.nan, dtype)


def _tolerance(dtype, K, out):
    if out == "float32":
        return 1e-5 * (K + 4) if dtype == "float32" else 1e-5 * (K + 4)
    return {"float16": 2e-3, "bfloat16": 1.6e-2}[out] * 4


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("M, N, K", SHAPES)
def test_every_layout(M, N, K, dtype, layout):
    a64, a = _data((M, K), dtype)
    b64, b = _data((K, N), dtype)
    A, B = _laid_out(a, layout[0]), _laid_out(b, layout[1])
    C = _poisoned(M, N, dtype)
    gemmlib.matmul(A, B, out=C)
    ref = a64.astype(np.float64) @ b64.astype(np.float64)
    scale = np.abs(a64).astype(np.float64) @ np.abs(b64).astype(np.float64) + 1
    err = np.max(np.abs(_values(C) - ref) / scale)
    assert err < _tolerance(dtype, K, dtype), (layout, err)


@pytest.mark.parametrize("precision", ["tf32", "3xtf32"])
@pytest.mark.parametrize("layout", ["NT", "TT"])
def test_layouts_tf32(precision, layout):
    M, N, K = 11, 13, 7
    a, b = RNG.standard_normal((M, K)).astype(np.float32), RNG.standard_normal((K, N)).astype(
        np.float32)
    C = gemmlib.matmul(_laid_out(a, layout[0]), _laid_out(b, layout[1]), precision=precision)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    assert np.max(np.abs(C - ref)) < (2e-3 if precision == "tf32" else 1e-5)


def test_leading_dimension_and_steps():
    """A slice of a wider matrix (rows further apart than their length) and views with
    a step: copied into row-major order, the result as for contiguous operands."""
    M, N, K = 9, 6, 5
    wide = RNG.standard_normal((M, K + 7)).astype(np.float32)
    A = wide[:, 2:2 + K]
    Bw = RNG.standard_normal((2 * K, N)).astype(np.float32)
    B = Bw[::2]
    assert describe(A, "A").layout == "" and describe(B, "B").layout == ""
    C = gemmlib.matmul(A, B)
    assert np.allclose(C, A.astype(np.float64) @ B.astype(np.float64), atol=1e-5)
    W = RNG.standard_normal((N, 3 * K)).astype(np.float32)[:, ::3]   # F.linear's W, strided
    C = gemmlib.linear(A, W)
    assert np.allclose(C, A.astype(np.float64) @ W.T.astype(np.float64), atol=1e-5)


@pytest.mark.parametrize("kernel", ["layout_nt", "double_buffer"])
def test_k_major_b_is_read_in_place(kernel, launched):
    """A column-major B (``W.T``) reaches a K-major rung as the caller's own memory."""
    seen = launched(lambda plan, A, B: B)
    M, N, K = 5, 8, 12
    A = RNG.standard_normal((M, K)).astype(np.float32)
    W = RNG.standard_normal((N, K)).astype(np.float32)
    C = gemmlib.matmul(A, W.T, kernel=kernel)
    assert np.allclose(C, A.astype(np.float64) @ W.T, atol=1e-5)
    assert seen and np.shares_memory(seen[0], W)


@pytest.mark.parametrize("kernel", ["warptile", "split_k", "auto"])
@pytest.mark.parametrize("M, N, K", [(1, 5, 7), (37, 29, 23), (130, 257, 33)])
@pytest.mark.parametrize("b_order", ["C", "F"])
def test_column_major_a_is_read_in_place_in_fp32(kernel, M, N, K, b_order, launched):
    """``A.T`` (a weight gradient's x^T) reaches the fp32 CUDA-core rungs as the caller's own
    (K, M) memory, with B either way round, into a poisoned C; odd shapes."""
    seen = launched(lambda plan, A, B: (plan.spec.a_operand if hasattr(plan, "spec")
                                        else plan.a_operand, A))
    At = RNG.standard_normal((K, M)).astype(np.float32)    # the memory: A is its transpose
    Bm = RNG.standard_normal((K, N) if b_order == "C" else (N, K)).astype(np.float32)
    B = Bm if b_order == "C" else Bm.T
    C = np.full((M, N), np.nan, np.float32)
    gemmlib.matmul(At.T, B, kernel=kernel, out=C)
    ref = At.T.astype(np.float64) @ B.astype(np.float64)
    assert np.linalg.norm(C - ref) <= 1e-5 * np.linalg.norm(ref)
    if M > 1:   # (one row is row-major too, and goes in as such)
        assert seen and seen[0][0] == "KM" and np.shares_memory(seen[0][1], At)


@pytest.mark.parametrize("M, N, K", [(12, 40, 36), (8, 20, 4), (20, 24, 68)])
@pytest.mark.parametrize("b_order", ["C", "F"])
def test_column_major_a_is_transposed_by_the_pre_pass_in_tf32(M, N, K, b_order, launched,
                                                              no_reorder):
    """tf32 wgmma reads A K-major only: ``A.T`` reaches ``wgmma_tf32``'s KM build as the
    caller's own (K, M) memory -- no copy by the array library -- and the rung's pre-pass
    transposes it; B either way round, a poisoned C."""
    from gemmlib.runtime import select

    seen = launched(lambda plan, A, B: (plan.spec.a_operand, A))
    spec = select.build("wgmma_tf32", dict(BN=64, STAGES=2))
    At = RNG.uniform(-1, 1, (K, M)).astype(np.float32)    # the memory: A is its transpose
    Bm = RNG.uniform(-1, 1, (K, N) if b_order == "C" else (N, K)).astype(np.float32)
    B = Bm if b_order == "C" else Bm.T
    C = np.full((M, N), np.nan, np.float32)
    gemmlib.matmul(At.T, B, kernel=spec, precision="tf32", out=C)
    ref = At.T.astype(np.float64) @ B.astype(np.float64)
    assert np.linalg.norm(C - ref) <= 2e-3 * np.linalg.norm(ref)
    assert seen and seen[0][0] == "KM" and np.shares_memory(seen[0][1], At)


def test_row_major_b_for_a_k_major_rung_is_copied():
    M, N, K = 4, 8, 8
    A = RNG.standard_normal((M, K)).astype(np.float32)
    B = RNG.standard_normal((K, N)).astype(np.float32)
    C = gemmlib.matmul(A, B, kernel="layout_nt")
    assert np.allclose(C, A.astype(np.float64) @ B, atol=1e-5)


def test_transpose_b_is_an_alias():
    M, N, K = 3, 5, 4
    A = RNG.standard_normal((M, K)).astype(np.float32)
    W = RNG.standard_normal((N, K)).astype(np.float32)
    assert np.array_equal(gemmlib.matmul(A, W, transpose_b=True), gemmlib.matmul(A, W.T))


# -------------------------------------------------------------------------- shapes


def test_leading_dimensions_flatten():
    X = RNG.standard_normal((2, 3, 4, 5)).astype(np.float32)
    B = RNG.standard_normal((5, 6)).astype(np.float32)
    C = gemmlib.matmul(X, B)
    assert C.shape == (2, 3, 4, 6)
    assert np.allclose(C, X.astype(np.float64) @ B, atol=1e-5)
    out = np.full((2, 3, 4, 6), np.nan, np.float32)
    assert gemmlib.matmul(X, B, out=out) is out and np.allclose(out, C)


@pytest.mark.parametrize("ashape, bshape", [
    ((3, 4, 5), (3, 5, 2)),       # bmm
    ((2, 1, 4, 5), (3, 5, 2)),    # broadcast batch dimensions
    ((4, 5), (3, 5, 2)),          # a matrix against a stack
    ((0, 4, 5), (5, 2)),          # an empty stack
    ((0, 4, 5), (0, 5, 2)),       # an empty batch
    ((3, 5, 17), (3, 17, 9)),     # odd everything: a loop over the products
    ((3, 67, 64), (3, 64, 136)),  # one launch; M, N not whole tiles
    ((3, 67, 64), (3, 64, 130)),  # rows not 16 bytes: a loop
])
def test_batches(ashape, bshape):
    X = RNG.standard_normal(ashape).astype(np.float16)
    Y = RNG.standard_normal(bshape).astype(np.float16)
    C = gemmlib.matmul(X, Y)
    ref = np.matmul(X.astype(np.float64), Y.astype(np.float64))
    assert C.shape == ref.shape and C.dtype == np.float16
    assert np.allclose(C.astype(np.float64), ref, atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("b_layout", ["KN", "NK"])
def test_a_batch_is_one_launch(b_layout, monkeypatch):
    """(b, M, K) @ (b, K, N): one launch of the batched rung, grid y the product; M not a
    whole tile (a box reads the next product's rows: never stored), a bias on top."""
    launches = []
    real = launch.launch

    def spy(p, *args, **kw):
        launches.append((p.spec.name, p.batch))
        return real(p, *args, **kw)

    monkeypatch.setattr(launch, "launch", spy)
    nb, M, N, K = 3, 70, 16, 64
    X = RNG.standard_normal((nb, M, K)).astype(np.float16)
    Y = (RNG.standard_normal((nb, K, N)) if b_layout == "KN" else
         np.swapaxes(RNG.standard_normal((nb, N, K)), -1, -2)).astype(np.float16)
    z = RNG.standard_normal(N).astype(np.float16)
    C = gemmlib.matmul(X, Y, bias=z)
    ref = np.matmul(X.astype(np.float64), Y.astype(np.float64)) + z
    assert launches == [(launches[0][0], nb)]
    assert launches[0][0].startswith(select.batched_row(N, K)[0])
    assert C.dtype == np.float16 and np.allclose(C.astype(np.float64), ref, atol=2e-2)


def test_a_torch_cpu_bfloat16_batch_comes_back_as_torch():
    """In the simulator, torch CPU stacks take the one launch too: a bfloat16 result comes
    back as a torch bfloat16 tensor, as a loop's products do."""
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(5)
    A = (torch.rand((2, 67, 64), generator=g) - 0.5).to(torch.bfloat16)
    W = (torch.rand((2, 72, 64), generator=g) - 0.5).to(torch.bfloat16)
    C = gemmlib.matmul(A, W.transpose(1, 2))
    ref = torch.bmm(A.double(), W.transpose(1, 2).double())
    assert isinstance(C, torch.Tensor) and C.dtype == torch.bfloat16 and C.shape == ref.shape
    assert float((C.double() - ref).norm() / ref.norm()) < 1e-2


def _bits16(x, precision):
    """(uint16 bits, the float64 values they hold) of float values in fp16 or bf16."""
    if precision == "fp16":
        h = x.astype(np.float16)
        return h.view(np.uint16), h.astype(np.float64)
    bits = (x.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    return bits, (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


#: (rung, tile, precision, OUT, B's layout, (batch, M, N, K), misaligned C): batched launches
#: of each batched rung on two persistent blocks (their walks interleave across products).
#: M odd: a tile hangs over each product's last row, and nothing of it may reach the next
#: product's rows (wgmma_store's boxes stop there: C's map is 3-D) -- with an odd number of
#: tiles per product (N = 136: three), the tile below is another block's, which the
#: simulator runs after, so rows written past a product would stay; N whole 16-byte rows
#: but not whole tiles; K not a whole k-tile where B is (N, K); a C 2 bytes off 16-byte
#: alignment takes no TMA map: wgmma_store's register store, batched
BATCHED_RUNGS = [
    ("wgmma_ws", dict(BN=64, STAGES=2), "fp16", "fp16", "KN", (3, 67, 136, 64), False),
    ("wgmma_store", dict(BN=64, STAGES=2), "fp16", "fp16", "KN", (3, 67, 136, 64), False),
    ("wgmma_store", dict(BN=64, STAGES=3), "bf16", "fp32", "NK", (3, 5, 136, 24), False),
    ("wgmma_store", dict(BN=64, STAGES=2), "bf16", "bf16", "NK", (2, 67, 136, 88), True),
    ("wgmma_pingpong", dict(BM=128, BN=64, STAGES=2), "bf16", "bf16", "KN", (3, 67, 136, 64),
     False),
    ("wgmma_pingpong", dict(BM=64, BN=64, STAGES=3), "fp16", "fp32", "NK", (3, 130, 16, 40),
     False),
]


@pytest.mark.skipif(not backend.SIMULATOR,
                    reason="the simulator's twins (GPU: scripts/batched_gpu.py)")
@pytest.mark.parametrize("rung, tile, precision, out, b_layout, shape, misaligned",
                         BATCHED_RUNGS)
def test_batched_launch_of_each_batched_rung(rung, tile, precision, out, b_layout, shape,
                                             misaligned):
    """Fresh random non-integer operands, C poisoned (and the memory around it), against
    float64: every element of every product written, within the precision's bound."""
    from _reliability import on_blocks
    from gemmlib.runtime import calls
    from gemmlib.verify import spec_tolerance

    nb, M, N, K = shape
    spec = on_blocks(select.build(rung, dict(tile, precision=precision, OUT=out,
                                             B_LAYOUT=b_layout)), 2)
    assert spec.batched
    rng = np.random.default_rng(sum(shape))
    a, a64 = _bits16(rng.uniform(-1, 1, (nb, M, K)), precision)
    b, b64 = _bits16(rng.uniform(-1, 1, (nb, K, N)), precision)
    B = b if b_layout == "KN" else np.ascontiguousarray(np.swapaxes(b, 1, 2))
    poison = np.uint16(0xFFFF) if out != "fp32" else np.float32(np.nan)
    buf = np.full(nb * M * N + 16, poison, np.uint16 if out != "fp32" else np.float32)
    at = (-buf.ctypes.data % 16) // buf.itemsize + misaligned
    C = buf[at:at + nb * M * N].reshape(nb * M, N)
    assert spec.c_map_ok(N, C.ctypes.data) != misaligned or rung != "wgmma_store"
    calls.run_arrays(calls.prepare(spec, M, N, K, batch=nb), a.reshape(nb * M, K),
                     B.reshape(-1, B.shape[-1]), C)
    if out == "fp16":
        got = C.view(np.float16).astype(np.float64)
    elif out == "bf16":
        got = (C.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    else:
        got = C.astype(np.float64)
    ref = np.matmul(a64, b64).reshape(nb * M, N)
    assert np.isfinite(got).all(), (spec.name, int((~np.isfinite(got)).sum()), "unwritten")
    err = np.abs(got - ref).max() / np.abs(ref).max()
    assert err <= spec_tolerance(spec, K), (spec.name, err)
    rest = np.r_[buf[:at], buf[at + nb * M * N:]]
    assert (rest.view(np.uint16 if out != "fp32" else np.uint32)
            == (0xFFFF if out != "fp32" else np.float32(np.nan).view(np.uint32))).all()


@pytest.mark.parametrize("out", ["fp16", "bf16", "fp32"])
@pytest.mark.parametrize("b_layout", ["KN", "NK"])
@pytest.mark.parametrize("N, K", [(8, 64), (64, 128), (72, 64), (128, 128), (136, 64),
                                  (4096, 64), (4096, 128)])
def test_the_batched_choice_builds_for_every_call(N, K, b_layout, out):
    """select_batched's table gives a batched build for every output type and layout (a
    float32 C whose stage does not fit the row's ring: the row's rung, its default ring)."""
    precision = "bf16" if out == "bf16" else "fp16"
    spec = select.select_batched(precision, 67, N, K, out, b_layout, bias=N == 72)
    rung, params = select.batched_row(N, K)
    assert spec.batched and spec.name.startswith(rung) and spec.b_operand == b_layout
    assert spec.params.get("OUT", "fp32") == out and spec.tile[1] == params["BN"]
    assert spec.bias_arg == (N == 72)
    assert spec.shared_bytes <= 227 * 1024


@pytest.mark.parametrize("ashape, bshape, match", [
    ((4,), (4, 2), r"matrices or stacks of matrices: A has shape \(4,\)"),
    ((2, 3, 4), (2, 5, 6), r"inner dimensions differ: A has shape \(2, 3, 4\)"),
    ((2, 3, 4), (3, 4, 6), r"batch dimensions do not broadcast"),
])
def test_bad_stacks(ashape, bshape, match):
    with pytest.raises(ValueError, match=match):
        gemmlib.matmul(np.ones(ashape, np.float32), np.ones(bshape, np.float32))


# -------------------------------------------------------------------------- bias, dtype


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("M, N, K", [(1, 5, 3), (6, 9, 13)])
def test_linear_with_bias(M, N, K, dtype):
    x64, x = _data((M, K), dtype)
    w64, w = _data((N, K), dtype)
    z64, z = _data((N,), dtype)
    C = gemmlib.linear(x, w, z)
    ref = x64.astype(np.float64) @ w64.T.astype(np.float64) + z64
    scale = np.abs(x64) @ np.abs(w64).T + np.abs(z64) + 1
    assert np.max(np.abs(_values(C) - ref) / scale) < _tolerance(dtype, K, dtype)
    if dtype != "float32":   # the fp32 accumulators plus the bias, unrounded
        C32 = gemmlib.linear(x, w, z, out_dtype="float32")
        assert C32.dtype == np.float32
        assert np.max(np.abs(C32 - ref) / scale) < 1e-5


def test_bias_refusals():
    A = np.ones((3, 4), np.float16)
    B = np.ones((4, 5), np.float16)
    with pytest.raises(ValueError, match=r"bias has shape \(4,\).*shape \(5,\)"):
        gemmlib.matmul(A, B, bias=np.ones(4, np.float16))
    with pytest.raises(TypeError, match=r"bias has dtype float32, but the inputs are float16"):
        gemmlib.matmul(A, B, bias=np.ones(5, np.float32))


def test_sixteen_bit_inputs_give_sixteen_bit_results():
    A = RNG.standard_normal((3, 4)).astype(np.float16)
    B = RNG.standard_normal((4, 5)).astype(np.float16)
    assert gemmlib.matmul(A, B).dtype == np.float16
    assert gemmlib.matmul(A, B, out_dtype=np.float32).dtype == np.float32
    out = np.empty((3, 5), np.float32)
    assert gemmlib.matmul(A, B, out=out) is out


def test_errors_in_the_callers_framework():
    t = Operand(None, (2, 2), np.dtype(np.float16), False, False, kind="torch")
    c = Operand(None, (2, 2), np.dtype(np.float16), False, False, kind="cupy")
    assert checks.contiguous_hint(t, "B") == "B.contiguous()"
    assert checks.contiguous_hint(c, "B") == "cupy.ascontiguousarray(B)"
    assert checks.astype_hint(t, "A", "float16") == "A.to(torch.float16)"
    assert "torch.cuda.device(1)" in checks.device_hint(t, 1)
    assert "cupy.cuda.Device(1)" in checks.device_hint(c, 1)


# -------------------------------------------------------------------------- on a GPU

GPU_SHAPES = [(1, 4096, 4096), (5, 1000, 777), (77, 3000, 1024), (1000, 777, 513),
              (2048, 4096, 4096)]


def _torch_operands(torch, layout, dtype, M, N, K, g):
    def make(rows, cols, t):
        x = torch.randn((cols, rows) if t else (rows, cols), generator=g, device="cuda")
        return (x.t() if t else x).to(dtype)

    return make(M, K, layout[0] == "T"), make(K, N, layout[1] == "T")


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", ["warptile", "split_k"])
def test_a_column_major_a_in_fp32_on_the_gpu(kernel):
    """The fp32 CUDA-core rungs' column-major-A build (``A_LAYOUT="KM"``) on a GPU: ``A.t()``
    with B either way round, odd and large shapes, C poisoned, against float64."""
    torch = pytest.importorskip("torch")
    g = torch.Generator(device="cuda").manual_seed(9)
    for M, N, K in GPU_SHAPES + [(67, 45, 37)]:
        At = torch.rand((K, M), generator=g, device="cuda").sub_(0.5)
        Bm = torch.rand((K, N), generator=g, device="cuda").sub_(0.5)
        for B in (Bm, Bm.t().contiguous().t()):
            C = torch.full((M, N), float("nan"), device="cuda")
            gemmlib.matmul(At.t(), B, kernel=kernel, out=C)
            ref = At.t().double() @ B.double()
            err = float((C.double() - ref).norm() / ref.norm())
            assert err < 1e-5, (kernel, M, N, K, B.stride(), err)


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp16", "bf16", "fp32", "tf32"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_layout_on_the_gpu(layout, precision):
    torch = pytest.importorskip("torch")
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(precision, torch.float32)
    g = torch.Generator(device="cuda").manual_seed(3)
    for M, N, K in GPU_SHAPES:
        A, B = _torch_operands(torch, layout, dtype, M, N, K, g)
        C = torch.full((M, N), float("nan"), dtype=dtype, device="cuda")
        gemmlib.matmul(A, B, out=C, precision="tf32" if precision == "tf32" else None)
        ref = A.double() @ B.double()
        err = float((C.double() - ref).norm() / ref.norm())
        tol = {"fp16": 2e-3, "bf16": 1e-2, "fp32": 1e-5, "tf32": 3e-3}[precision]
        assert err < tol, (layout, precision, M, N, K, err)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_the_weight_is_read_where_it_lies(dtype, monkeypatch):
    """F.linear's W.t() reaches the kernel as the weight's own address (no copy), at
    decode and prefill sizes, on the rungs ``auto`` picks that have a K-major build."""
    torch = pytest.importorskip("torch")
    seen = []
    for name in ("run", "run_rounded"):
        real = getattr(launch, name)

        def spy(p, a_ptr, b_ptr, *args, _real=real, **kw):
            seen.append((p.spec, b_ptr))
            return _real(p, a_ptr, b_ptr, *args, **kw)

        monkeypatch.setattr(launch, name, spy)
    dt = getattr(torch, dtype)
    W = torch.randn(4096, 4096, device="cuda", dtype=dt)
    for M in (1, 16, 512, 4096):
        seen.clear()
        x = torch.randn(M, 4096, device="cuda", dtype=dt)
        y = gemmlib.linear(x, W)
        ref = x.double() @ W.double().t()
        assert float((y.double() - ref).norm() / ref.norm()) < 1e-2
        spec, b_ptr = seen[-1]
        if spec.b_operand == "NK":
            assert b_ptr == W.data_ptr(), spec.name


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_linear_matches_torch(dtype):
    torch = pytest.importorskip("torch")
    dt = getattr(torch, dtype)
    lin = torch.nn.Linear(1000, 3000, device="cuda", dtype=dt)
    x = torch.randn(3, 7, 1000, device="cuda", dtype=dt)
    with torch.no_grad():
        y = gemmlib.linear(x, lin.weight, lin.bias)
        ref = x.double() @ lin.weight.double().t() + lin.bias.double()
    assert y.shape == (3, 7, 3000) and y.dtype == dt
    assert float((y.double() - ref).norm() / ref.norm()) < (1e-5 if dtype == "float32" else 1e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("b, M, K", [(32, 128, 64), (4, 1000, 77)])
def test_batched_matches_bmm(b, M, K):
    torch = pytest.importorskip("torch")
    A = torch.randn(b, M, K, device="cuda", dtype=torch.float16)
    B = torch.randn(b, K, M, device="cuda", dtype=torch.float16)
    C = gemmlib.matmul(A, B)
    ref = torch.bmm(A.double(), B.double())
    assert C.shape == (b, M, M) and float((C.double() - ref).norm() / ref.norm()) < 2e-3


#: (B's layout, C, (batch, M, N, K)): M not a whole tile (the real copy engine cuts each
#: box at its product's last row), N not a whole tile, K past one k-tile or not whole
BATCHED_GPU_CASES = [("KN", "16", (3, 1000, 1000, 64)), ("NK", "16", (5, 67, 136, 40)),
                     ("KN", "fp32", (2, 300, 264, 128)), ("NK", "16", (7, 129, 8, 1000))]


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("rung, tile", [("wgmma_ws", {}), ("wgmma_store", {"PIECES": 2}),
                                        ("wgmma_store", {"BN": 128, "STAGES": 6}),
                                        ("wgmma_pingpong", {})])
def test_batched_launch_of_each_batched_rung_gpu(rung, tile, precision):
    """Each batched rung's one launch on the GPU, C poisoned, against float64."""
    from _reliability import HOPPER
    from gemmlib.runtime import calls
    from gemmlib.verify import spec_tolerance

    if not HOPPER:
        pytest.skip("wgmma needs an H100/H200")
    torch = pytest.importorskip("torch")
    dt = torch.float16 if precision == "fp16" else torch.bfloat16
    g = torch.Generator(device="cuda").manual_seed(3)
    for b_layout, out, (nb, M, N, K) in BATCHED_GPU_CASES:
        out = precision if out == "16" else out
        spec = select.build(rung, dict(tile, precision=precision, OUT=out, B_LAYOUT=b_layout))
        A = torch.rand((nb, M, K), generator=g, device="cuda").sub_(0.5).to(dt)
        mem = torch.rand((nb, K, N) if b_layout == "KN" else (nb, N, K), generator=g,
                         device="cuda").sub_(0.5).to(dt)
        B = mem if b_layout == "KN" else mem.transpose(1, 2)
        C = torch.full((nb, M, N), float("nan"), device="cuda",
                       dtype=torch.float32 if out == "fp32" else dt)
        calls.run(calls.prepare(spec, M, N, K, batch=nb), A.data_ptr(), mem.data_ptr(),
                  C.data_ptr(), torch.cuda.current_stream().cuda_stream)
        ref = torch.bmm(A.double(), B.double())
        assert bool(torch.isfinite(C).all()), (spec.name, nb, M, N, K, "unwritten")
        err = float((C.double() - ref).abs().max() / ref.abs().max())
        assert err <= spec_tolerance(spec, K), (spec.name, nb, M, N, K, err)


def _lean_state(seed, A, B) -> str:
    """What the lean path holds, for a failure's message."""
    from gemmlib.paths import batched
    from gemmlib.paths.repeat import RECORD, TORCH_CALLS

    k = getattr(RECORD, "known", None)
    plans = [(key[2], key[4], key[5], bool(v)) for key, v in batched._BATCHED.items()]
    return (f"seed {seed}: RECORD.known {k and (k.plan.spec.name, k.plan.batch)}; "
            f"batched plans {plans}; torch calls {len(TORCH_CALLS)}; "
            f"A {tuple(A.shape)} {A.stride()} ptr%16 {A.data_ptr() % 16}, "
            f"B {tuple(B.shape)} {B.stride()} ptr%16 {B.data_ptr() % 16}")


@pytest.mark.gpu
@pytest.mark.parametrize("b_layout", ["KN", "NK"])
def test_a_repeated_batch_takes_the_lean_path(b_layout):
    """The second call of a batch described alike launches from the remembered plan
    (``torch_repeat``), on new data, with a bias, and is right."""
    from _reliability import HOPPER
    from gemmlib.paths.repeat import TORCH_CALLS, torch_key

    if not HOPPER:
        pytest.skip("one batched launch needs an H100/H200")
    torch = pytest.importorskip("torch")
    nb, M, N, K = 6, 200, 136, 64

    def operands(seed):
        g = torch.Generator(device="cuda").manual_seed(seed)
        A = torch.rand((nb, M, K), generator=g, device="cuda").sub_(0.5).half()
        mem = torch.rand((nb, K, N) if b_layout == "KN" else (nb, N, K), generator=g,
                         device="cuda").sub_(0.5).half()
        z = torch.rand(N, generator=g, device="cuda").half()
        return A, (mem if b_layout == "KN" else mem.transpose(1, 2)), z

    for seed in (1, 2, 3):
        A, B, z = operands(seed)
        C = gemmlib.matmul(A, B, bias=z)
        ref = torch.bmm(A.double(), B.double()) + z.double()
        assert C.shape == (nb, M, N) and C.dtype == torch.float16
        assert float((C.double() - ref).norm() / ref.norm()) < 2e-3, seed
        f = TORCH_CALLS.get(torch_key(A, B, None, z, False, None))
        assert f is not None and f.known.plan.batch == nb, _lean_state(seed, A, B)


@pytest.mark.gpu
def test_a_flattened_input_is_remembered_after_its_rows_were():
    """An (..., M, K) input whose flattened product is already remembered (another layer
    of the same sizes, or a 2-D call) is remembered itself on its first checked call, so
    its repeats take the lean path too (a model's decode steps)."""
    torch = pytest.importorskip("torch")
    from gemmlib.paths.repeat import TORCH_CALLS, torch_key

    M, N, K = 6, 136, 72
    g = torch.Generator(device="cuda").manual_seed(5)
    W = torch.nn.Parameter(torch.rand((N, K), generator=g, device="cuda").sub_(0.5).half())
    x = torch.rand((2, 3, K), generator=g, device="cuda").sub_(0.5).half()
    with torch.inference_mode():
        gemmlib.matmul(x.reshape(M, K), W.t())      # the rows' product, remembered
        for _ in range(2):
            y = gemmlib.linear(x, W)
    assert TORCH_CALLS.get(torch_key(x, W, None, None, True, None)) is not None
    ref = x.double() @ W.double().t()
    assert y.shape == (2, 3, N) and float((y.double() - ref).norm() / ref.norm()) < 2e-3


#: (rung, params, precision, A as "C"/"F", B as "C"/"F", (M, N, K), a bias): slices of wider
#: matrices -- ``x[:, k0:k1]``, ``W[:, :K].t()`` -- read in place through the tensor maps
#: (their row strides), on every TMA rung family auto takes on Hopper
PITCHED = [
    ("wgmma_ws", dict(BN=64, STAGES=2), "fp16", "C", "F", (70, 72, 40), False),
    ("wgmma_ws", dict(BN=64, STAGES=2), "bf16", "F", "C", (64, 72, 136), True),
    ("wgmma_store", dict(BN=64, STAGES=2), "bf16", "C", "C", (67, 48, 136), False),
    ("wgmma_split_k", dict(BM=64, BN=64, STAGES=2, SPLITS=2), "fp16", "C", "F",
     (33, 144, 72), True),
    ("wgmma_swap", dict(BN=16, STAGES=2), "bf16", "C", "F", (13, 200, 72), True),
    ("wgmma_pingpong", dict(BM=64, BN=64, STAGES=2), "fp16", "C", "F", (65, 72, 64), False),
]


@pytest.mark.skipif(not backend.SIMULATOR, reason="the simulator's twins (GPU: below)")
@pytest.mark.parametrize("rung, params, precision, a_order, b_order, shape, bias", PITCHED)
def test_slices_of_wider_matrices_are_read_in_place(rung, params, precision, a_order,
                                                    b_order, shape, bias, monkeypatch):
    """A and B as views into wider matrices (rows 16-byte multiples further apart than a
    row), C poisoned: no copy of either is made (``reordered`` and ``padded`` refuse here;
    the kernel's own A and B arguments are NaN stand-ins: only the maps read the data), the
    product within the precision's bound of float64."""
    from gemmlib.paths import product as P
    from gemmlib.precision import BF16Array, bf16_bits_to_float32, to_bf16
    from gemmlib.verify import spec_tolerance

    M, N, K = shape
    rng = np.random.default_rng(M + N + K)
    spec = select.build(rung, dict(params, precision=precision,
                                   B_LAYOUT="NK" if b_order == "F" else "KN"))

    def view(rows, cols, order, pad):
        """A (rows, cols) view whose memory rows are ``pad`` elements longer than needed."""
        x = rng.uniform(-1, 1, (rows, cols)).astype(np.float32)
        vals = x.astype(np.float16) if precision == "fp16" else to_bf16(x)
        mem = np.empty((rows, cols + pad) if order == "C" else (cols, rows + pad),
                       np.float16 if precision == "fp16" else np.uint16)
        v = mem[:, pad // 2:pad // 2 + cols] if order == "C" else mem[:, pad // 2:pad // 2 + rows].T
        if precision == "fp16":
            v[...] = vals
            return v, vals.astype(np.float64)
        v[...] = vals.bits
        return BF16Array(v), bf16_bits_to_float32(vals.bits).astype(np.float64)

    A, a64 = view(M, K, a_order, 24)
    B, b64 = view(K, N, b_order, 40)
    ref = a64 @ b64
    kw = {}
    if bias:
        z = rng.uniform(-1, 1, N)
        Z = z.astype(np.float16) if precision == "fp16" else to_bf16(z.astype(np.float32))
        kw["bias"] = Z
        ref = ref + (Z.astype(np.float64) if precision == "fp16"
                     else bf16_bits_to_float32(Z.bits).astype(np.float64))
    for name in ("reordered", "padded"):
        monkeypatch.setattr(P, name, lambda *a, _n=name, **k: pytest.fail(f"{_n}: a copy"))
    C = np.full((M, N), np.nan, np.float32)
    gemmlib.matmul(A, B, kernel=spec, out=C, precision=precision, **kw)
    err = np.abs(C - ref).max() / np.abs(ref).max()
    assert np.isfinite(C).all() and err <= spec_tolerance(spec, K), (spec.name, err)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("M", [8, 300])
def test_torch_slices_are_read_in_place_on_hopper_gpu(dtype, M):
    """``x[:, k0:k1] @ W[:, :K].t()`` with auto on an H100/H200 (swap-AB at 8 tokens, the
    wgmma split-K/store rungs at 300): right against float64, and the call's peak memory is
    its C alone -- no copy of either slice."""
    from _reliability import HOPPER

    if not HOPPER:
        pytest.skip("the TMA rungs need an H100/H200")
    torch = pytest.importorskip("torch")
    dt = getattr(torch, dtype)
    N, K = 1536, 1024
    g = torch.Generator(device="cuda").manual_seed(M)
    xs = (torch.rand(M, K + 64, generator=g, device="cuda") - 0.5).to(dt)
    ws = (torch.rand(N, K + 128, generator=g, device="cuda") - 0.5).to(dt)
    A, B = xs[:, 32:32 + K], ws[:, 64:64 + K].t()
    ref = A.double() @ B.double()
    C = gemmlib.matmul(A, B)   # the kernel compiled, its workspace and map slab made
    assert float((C.double() - ref).norm() / ref.norm()) < 5e-3
    del C
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    C = gemmlib.matmul(A, B)
    torch.cuda.synchronize()
    grew = torch.cuda.max_memory_allocated() - base
    assert grew <= C.numel() * C.element_size() + 1024, (grew, C.numel() * 2)
    assert float((C.double() - ref).norm() / ref.norm()) < 5e-3
