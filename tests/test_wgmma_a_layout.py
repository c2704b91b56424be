"""A column-major A: the wgmma rungs built with ``A_LAYOUT="KM"``.

A weight gradient dW = dY^T X reads dY^T, a column-major A: the transposed view ``X.t()`` of a
row-major (K, M) matrix.  A KM build takes A as that (K, M) memory, copies each k-tile of it
by TMA as BM/64 panels of 64 k x 64 m (128-byte swizzled, MN-major, laid out as a (K, N) B's
panels) and reads it with wgmma's transpose-A immediate (fp16/bf16 only: tf32 and FP8 wgmma
read A K-major).  A consumer warpgroup's 64 rows of the tile are then one panel.

The simulator's twins read shared memory through the descriptors (MN-major for trans-a) and
the TMA swizzle, so a wrong panel, descriptor or slice gives a wrong product here.  Each
case: odd shapes (M a multiple of 8 -- the (K, M) memory's rows must be 16-byte multiples
-- and N, K prime or 1 where the B layout allows), fresh random data, a NaN-poisoned C, two
persistent blocks, against the float64 product; every element within the fp32
accumulation's bound plus the output's rounding.
"""

from __future__ import annotations

import numpy as np
import pytest

from _reliability import HOPPER, bits16, check_accumulated, launch_poisoned
from gemmlib import backend, dispatch
from gemmlib.kernels import wgmma_split_k, wgmma_store, wgmma_ws

sim_only = pytest.mark.skipif(not backend.SIMULATOR, reason="the simulator's twins")


def _random16(shape, precision, rng):
    """(uint16 bits, float64 values) of a fresh random 16-bit array."""
    x = backend.random_matrix(shape, "bfloat16" if precision == "bf16" else "float16", rng)
    return bits16(x).copy(), np.asarray(backend.to_host(x.astype(np.float32)), np.float64)


def operands(precision, M, N, K, b_layout, seed):
    """(A as (K, M), B as (K, N) or (N, K), bias (1, N)) as uint16 bits, and the float64
    A (M, K), B (K, N) and bias of the values the kernel reads."""
    rng = np.random.default_rng(seed)
    a_km, a64t = _random16((K, M), precision, rng)
    b, b64 = _random16((K, N), precision, rng)
    bias, bias64 = _random16((1, N), precision, rng)
    if b_layout == "NK":
        b = b.T.copy()
    return a_km, b, bias, a64t.T, b64, bias64


def run(spec, precision, M, N, K, seed, with_bias=True):
    a_km, b, bias, a64, b64, bias64 = operands(precision, M, N, K, spec.b_operand, seed)
    bias = bias if spec.bias_arg and with_bias else None
    C = launch_poisoned(spec, a_km, b, M, N, K, bias)
    return C, a64, b64, (bias64 if bias is not None else None)


check = check_accumulated


def build(kind, precision, out, b_layout, bias):
    kw = dict(A_LAYOUT="KM", B_LAYOUT=b_layout, BIAS=bias)
    if out != "fp32":
        kw["OUT"] = out
    if kind == "ws":
        return wgmma_ws.build(precision, BM=64, BN=64, STAGES=2, **kw)
    if kind == "ws128":   # two consumers: slice 1 is A's second panel
        return wgmma_ws.build(precision, BM=128, BN=64, STAGES=2, **kw)
    if kind == "split_k":
        return wgmma_split_k.build(precision, BM=64, BN=64, STAGES=2, SPLITS=3, **kw)
    return wgmma_store.build(precision, BN=64, STAGES=2, **kw)   # BM = 128: two consumers


# --------------------------------------------------------------------------- the builds


def test_km_builds():
    s = wgmma_ws.build("bf16", OUT="bf16", B_LAYOUT="NK", BIAS=True, A_LAYOUT="KM")
    assert s.name == "wgmma_ws_bf16_o16_km_nk_bias"
    assert s.params["A_LAYOUT"] == "KM" and s.params["B_LAYOUT"] == "NK"
    assert s.a_operand == "KM" and s.b_operand == "NK" and s.bias_arg
    assert not s.batched                                  # one product per launch
    assert s.tma_boxes == ((64, 64), (256, 64))           # A: 64 k x 64 m panels
    assert any("1, 1, 1, 0;" in p for p in s.ptx_must)    # trans-a, no trans-b
    k = wgmma_ws.build(A_LAYOUT="KM")
    assert k.name == "wgmma_ws_km" and k.b_operand == "KN" and not k.batched
    assert any("1, 1, 1, 1;" in p for p in k.ptx_must)
    assert k.tma_boxes == ((64, 64), (64, 64))
    assert wgmma_split_k.build("fp16", BM=64, A_LAYOUT="KM").name == \
        "wgmma_split_k_64x256_s3_km"
    st = wgmma_store.build("fp16", A_LAYOUT="KM", B_LAYOUT="NK")
    assert st.name == "wgmma_store_km_nk" and st.a_operand == "KM"
    # the defaults keep their names, params, fields and batched launch
    for mod in (wgmma_ws, wgmma_split_k, wgmma_store):
        d = mod.build()
        assert "A_LAYOUT" not in d.params and d.a_operand == "MK" and "_km" not in d.name
        assert not any(", 1, 1, 1," in p for p in d.ptx_must)
    assert wgmma_ws.build().batched and wgmma_ws.build().tma_boxes[0] == (128, 64)
    # rebuilding for another output keeps the layout
    s16 = dispatch.with_out(wgmma_split_k.build("fp16", A_LAYOUT="KM"), "fp16")
    assert s16.name == "wgmma_split_k_o16_km" and s16.a_operand == "KM"


def test_km_constraints():
    dev = backend.device_info()
    km, km_nk = wgmma_ws.build(A_LAYOUT="KM"), wgmma_ws.build(A_LAYOUT="KM", B_LAYOUT="NK")
    assert not km.failed_constraints(8, 16, 1, dev)       # K free with a (K, N) B
    assert km.failed_constraints(5, 16, 64, dev)          # M: the (K, M) rows
    assert km.failed_constraints(8, 19, 64, dev)          # N: B's rows
    assert not km_nk.failed_constraints(16, 19, 72, dev)  # N free with an (N, K) B
    assert km_nk.failed_constraints(16, 19, 70, dev)      # K: B's rows
    assert km_nk.failed_constraints(12, 19, 72, dev)
    assert "16-byte rows" in [c.name for c in km.constraints]


def test_km_refused_where_wgmma_reads_a_kmajor_only():
    for mod in (wgmma_ws, wgmma_split_k, wgmma_store):
        with pytest.raises(ValueError, match="A_LAYOUT='KM'.*16-bit"):
            mod.build("tf32", A_LAYOUT="KM")
        with pytest.raises(ValueError, match="A_LAYOUT='KM'.*16-bit"):
            mod.build("e4m3", A_LAYOUT="KM")
        with pytest.raises(ValueError, match="A_LAYOUT"):
            mod.build(A_LAYOUT="TN")


def test_dispatch_words_and_maps_of_a_km_a(monkeypatch):
    """A (K, M) A: its kernel-parameter words and its tensor map are over (K, M), with a row
    pitch of M elements (the GPU path, with the compile and the map encoding stubbed)."""
    from gemmlib.runtime import launch, maps

    spec = wgmma_ws.build("fp16", A_LAYOUT="KM", B_LAYOUT="NK")
    M, N, K = 24, 19, 40
    p = dispatch.plan(spec, M, N, K)

    class _Compiled:
        def function(self, ctx, shared):
            return 0

    monkeypatch.setattr(launch, "compiled_spec", lambda s: _Compiled())
    b = launch._Bound(p, 0)
    assert b.words[:len(launch._array_words(0, K, M, 2))] == launch._array_words(0, K, M, 2)
    seen = {}
    monkeypatch.setattr(maps, "operand_maps", lambda ops, stream, scales, graph=False:
                        seen.setdefault("ops", ops) and 0)
    launch._tensor_maps(p, 111, 222, 0)
    (a_ptr, a_shape, a_pitch, _, a_box, _), (_, b_shape, b_pitch, _, _, _) = seen["ops"]
    assert (a_ptr, a_shape, a_pitch, a_box) == (111, (K, M), M * 2, (64, 64))
    assert (b_shape, b_pitch) == ((N, K), K * 2)
    mk = dispatch.plan(wgmma_ws.build("fp16"), M, 24, K)
    seen.clear()
    launch._tensor_maps(mk, 111, 222, 0)
    assert seen["ops"][0][1:3] == ((M, K), K * 2)


# --------------------------------------------------------------------------- the simulator

#: (build, precision, OUT, B_LAYOUT, (M, N, K)); tiles of 64 x 64 (ws128, store: 128 x 64),
#: 2 stages; M a multiple of 8, K prime or 1 with a (K, N) B, N prime with an (N, K) B
CASES = [
    ("ws", "fp16", "fp32", "KN", (8, 16, 1)),
    ("ws", "bf16", "bf16", "NK", (72, 19, 136)),
    ("ws128", "fp16", "fp16", "KN", (136, 24, 67)),       # two consumers, two panels of A
    ("split_k", "bf16", "fp32", "NK", (72, 29, 200)),     # 3 slices: the bias added once
    ("split_k", "fp16", "fp16", "KN", (8, 16, 263)),
    ("store", "fp16", "fp32", "NK", (136, 72, 72)),       # C by TMA store
    ("store", "bf16", "bf16", "KN", (128, 40, 13)),       # C by TMA store, 16-bit
    ("store", "fp16", "fp16", "NK", (16, 41, 64)),        # N odd: C from registers
]


@sim_only
@pytest.mark.parametrize("kind, precision, out, b_layout, shape", CASES,
                         ids=[f"{c[0]}-{c[1]}-{c[2]}-{c[3]}" for c in CASES])
def test_km_product_with_bias(kind, precision, out, b_layout, shape):
    spec = build(kind, precision, out, b_layout, True)
    assert spec.bias_arg and spec.a_operand == "KM" and spec.b_operand == b_layout
    C, a64, b64, bias64 = run(spec, precision, *shape, seed=sum(shape) + 7)
    check(C, out, a64, b64, bias64, spec.name)


@sim_only
@pytest.mark.parametrize("kind, precision, out, b_layout, shape", [
    ("ws", "fp16", "fp32", "NK", (16, 7, 72)), ("split_k", "bf16", "bf16", "KN", (24, 8, 199)),
    ("store", "bf16", "fp32", "KN", (64, 16, 1))])
def test_km_without_bias(kind, precision, out, b_layout, shape):
    """A KM build with no bias, and a bias build given none: the same product, bit for bit."""
    plain = build(kind, precision, out, b_layout, False)
    C, a64, b64, _ = run(plain, precision, *shape, seed=sum(shape))
    check(C, out, a64, b64, None, plain.name)
    C0, *_ = run(build(kind, precision, out, b_layout, True), precision, *shape,
                 seed=sum(shape), with_bias=False)
    word = np.uint32 if out == "fp32" else np.uint16
    assert np.array_equal(C.view(word), C0.view(word))


# --------------------------------------------------------------------------- the GPU

#: the default tiles on shapes of a weight gradient (dW = dY^T X: M, N the layer's widths,
#: K the tokens) and odd ones
GPU_CASES = [
    (lambda: wgmma_ws.build("fp16", A_LAYOUT="KM"), (1024, 1000, 4099)),
    (lambda: wgmma_ws.build("bf16", OUT="bf16", A_LAYOUT="KM", B_LAYOUT="NK", BIAS=True),
     (520, 515, 1032)),
    (lambda: wgmma_split_k.build("bf16", BM=64, A_LAYOUT="KM", BIAS=True), (16, 4096, 4093)),
    (lambda: wgmma_split_k.build("fp16", SPLITS=5, OUT="fp16", A_LAYOUT="KM",
                                 B_LAYOUT="NK"), (136, 333, 2048)),
    (lambda: wgmma_store.build("fp16", A_LAYOUT="KM", BIAS=True), (264, 1000, 1031)),
    (lambda: wgmma_store.build("bf16", OUT="bf16", A_LAYOUT="KM", B_LAYOUT="NK"),
     (304, 1001, 1032)),
]


@pytest.mark.gpu
@pytest.mark.parametrize("make, shape", GPU_CASES)
def test_km_on_hopper_gpu(make, shape):
    if not HOPPER:
        pytest.skip("wgmma needs an H100/H200")
    spec = make()
    out = spec.params.get("OUT", "fp32")
    for with_bias in (True, False):
        C, a64, b64, bias64 = run(spec, spec.precision, *shape,
                                  seed=int(np.random.default_rng().integers(1 << 30)),
                                  with_bias=with_bias)
        check(C, out, a64, b64, bias64, (spec.name, with_bias))
