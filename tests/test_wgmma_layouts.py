"""B as torch holds a weight, and a bias epilogue: the wgmma rungs built with ``B_LAYOUT="NK"``
and ``BIAS=True``.

``F.linear(x, W, b) = x @ W.T + b`` with an ``nn.Linear`` weight W of shape (N, K), row-major:
B is K-major, wgmma's own layout, so an NK build reads W as it is (one BN x 64 TMA box per
k-tile, B's descriptor stepping as A's, no trans-b).  A bias build takes a (1, N) bias right
after C -- the inputs' element type, uint16 bits for fp16/bf16, float32 for tf32 -- or a
(0, N) one for none, and adds it in fp32 before the single rounding into C.

The simulator's twins read shared memory through the descriptors and the TMA swizzle, so a
wrong layout gives a wrong product here.  Each case: odd shapes (M, N not multiples of 8
where the rung allows: TMA needs K, and N for a (K, N) B, in multiples of 8), fresh random
non-integer data, a poisoned C, two persistent blocks (their tile walks interleave), against
the float64 product; every element within the fp32 accumulation's bound plus the output's
rounding.
"""

from __future__ import annotations

import numpy as np
import pytest

from _reliability import HOPPER, bits16, check_accumulated, launch_poisoned, operands16
from gemmlib import backend, dispatch
from gemmlib.kernels import (wgmma_cluster, wgmma_pingpong, wgmma_split_k, wgmma_store,
                             wgmma_tf32, wgmma_ws)

sim_only = pytest.mark.skipif(not backend.SIMULATOR, reason="the simulator's twins")


def _tf32(x: np.ndarray) -> np.ndarray:
    """What the tensor core reads of a float32: its top 19 bits."""
    return (x.view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32)


def operands(precision: str, M: int, N: int, K: int, layout: str, seed: int):
    """(A, B, bias) as the kernel takes them -- B (K, N) or (N, K), 16-bit inputs as their
    bits -- and the float64 A, B (K, N) and bias of the values the kernel reads."""
    rng = np.random.default_rng(seed)
    if precision == "tf32":
        A = rng.uniform(-1, 1, (M, K)).astype(np.float32)
        B = rng.uniform(-1, 1, (K, N)).astype(np.float32)
        bias = rng.uniform(-2, 2, (1, N)).astype(np.float32)
        a64, b64 = _tf32(A).astype(np.float64), _tf32(B).astype(np.float64)
        bias64 = bias.astype(np.float64)
    else:
        A, B, a64, b64 = operands16(precision, M, N, K, rng)
        A, B = bits16(A).copy(), bits16(B).copy()   # fresh: a 1-row view may have any row stride
        bias = backend.random_matrix((1, N), "bfloat16" if precision == "bf16" else "float16",
                                     rng)
        bias64 = np.asarray(backend.to_host(bias.astype(np.float32)), np.float64)
        bias = bits16(bias)
    if layout == "NK":
        B = B.T.copy()   # the weight as nn.Linear keeps it (a fresh (N, K) array)
    return A, B, bias, a64, b64, bias64


def run(spec, precision, M, N, K, layout, seed, with_bias=True):
    """C from ``spec`` into a poisoned C (float32 or 16-bit bits), and the float64
    operands."""
    A, B, bias, a64, b64, bias64 = operands(precision, M, N, K, layout, seed)
    bias = bias if spec.bias_arg and with_bias else None
    C = launch_poisoned(spec, A, B, M, N, K, bias)
    return C, a64, b64, (bias64 if bias is not None else None)


check = check_accumulated


# --------------------------------------------------------------------------- the builds


def test_default_builds_keep_their_names_and_arguments():
    for mod, name in ((wgmma_ws, "wgmma_ws"), (wgmma_split_k, "wgmma_split_k"),
                      (wgmma_store, "wgmma_store"), (wgmma_pingpong, "wgmma_pingpong"),
                      (wgmma_tf32, "wgmma_tf32")):
        s = mod.SPEC
        assert s.name == name and s.b_operand == "KN" and not s.bias_arg
        assert "B_LAYOUT" not in s.params and "BIAS" not in s.params
    assert wgmma_tf32.SPEC.b_prep is not None and wgmma_ws.SPEC.tma_boxes == ((128, 64), (64, 64))


def test_nk_and_bias_builds():
    s = wgmma_ws.build("bf16", OUT="bf16", B_LAYOUT="NK", BIAS=True)
    assert s.name == "wgmma_ws_bf16_o16_nk_bias"
    assert s.params["B_LAYOUT"] == "NK" and s.params["BIAS"] is True
    assert s.b_operand == "NK" and s.b_kmajor and s.bias_arg
    assert s.tma_boxes == ((128, 64), (256, 64))          # B's k-tile: one BN x 64 box
    assert any("1, 1, 0, 0;" in p for p in s.ptx_must)    # wgmma without trans-b
    assert wgmma_split_k.build("bf16", BM=64, B_LAYOUT="NK").name == \
        "wgmma_split_k_bf16_64x256_s3_nk"
    assert wgmma_pingpong.build(B_LAYOUT="NK", BIAS=True).name == "wgmma_pingpong_nk_bias"
    assert wgmma_cluster.build(B_LAYOUT="NK").tma_boxes == ((128, 64), (64, 64))   # panels
    t = wgmma_tf32.build(B_LAYOUT="NK", BIAS=True)
    assert t.name == "wgmma_tf32_nk_bias" and t.b_prep is None and t.b_kmajor
    # rebuilding for another output (dispatch.with_out) keeps the layout and the bias
    s16 = dispatch.with_out(wgmma_split_k.build("fp16", B_LAYOUT="NK", BIAS=True), "fp16")
    assert s16.name == "wgmma_split_k_o16_nk_bias" and s16.b_operand == "NK" and s16.bias_arg
    # an NK build needs K in multiples of 8, not N
    dev = backend.device_info()
    assert not wgmma_ws.build(B_LAYOUT="NK").failed_constraints(5, 19, 72, dev)
    assert wgmma_ws.build(B_LAYOUT="NK").failed_constraints(5, 19, 70, dev)
    with pytest.raises(ValueError, match="B_LAYOUT"):
        wgmma_ws.build(B_LAYOUT="TN")


def test_bias_source_adds_each_column_to_every_row_of_every_slice():
    from gemmlib.kernels.wgmma_async import bias_source

    src = bias_source(64, 2)
    assert "if bias.shape[0] > 0:" in src and src.count("+= b0") == 4
    assert "acc[33 + 4 * j] += b1" in src and "acc[35 + 4 * j] += b1" in src


# --------------------------------------------------------------------------- the simulator

#: (build, precision, OUT, B_LAYOUT, (M, N, K)); tiles of 64 x 64 (store: 128 x 64), 2
#: stages; N odd where B is (N, K)
CASES = [
    ("ws", "fp16", "fp32", "NK", (1, 1, 8)),
    ("ws", "bf16", "bf16", "NK", (37, 19, 136)),
    ("ws", "fp16", "fp32", "KN", (67, 24, 72)),
    ("split_k", "bf16", "fp32", "NK", (67, 29, 200)),      # 3 slices: the bias added once
    ("split_k", "fp16", "fp16", "KN", (5, 16, 264)),
    ("store", "fp16", "fp32", "NK", (130, 72, 72)),        # C by TMA store
    ("store", "bf16", "bf16", "NK", (129, 41, 64)),        # N odd: C from registers
    ("pingpong", "bf16", "fp32", "NK", (100, 29, 72)),
    ("pingpong128", "fp16", "fp16", "NK", (130, 33, 64)),  # two 64-row slices per consumer
    ("cluster", "fp16", "fp32", "NK", (70, 45, 72)),
    ("cluster", "bf16", "bf16", "KN", (70, 40, 72)),
    ("tf32", "tf32", "fp32", "NK", (37, 19, 36)),
    ("tf32", "tf32", "fp32", "KN", (20, 24, 68)),
]


def build(kind: str, precision: str, out: str, layout: str, bias: bool):
    kw = dict(B_LAYOUT=layout, BIAS=bias)
    if out != "fp32":
        kw["OUT"] = out
    if kind == "ws":
        return wgmma_ws.build(precision, BM=64, BN=64, STAGES=2, **kw)
    if kind == "split_k":
        return wgmma_split_k.build(precision, BM=64, BN=64, STAGES=2, SPLITS=3, **kw)
    if kind == "store":
        return wgmma_store.build(precision, BN=64, STAGES=2, **kw)
    if kind.startswith("pingpong"):
        return wgmma_pingpong.build(precision, BM=128 if kind.endswith("128") else 64,
                                    BN=64, STAGES=2, **kw)
    if kind == "cluster":
        return wgmma_cluster.build(precision, BM=64, BN=64, STAGES=2, CM=1, **kw)
    return wgmma_tf32.build(BM=64, BN=64, STAGES=2, **kw)


@sim_only
@pytest.mark.parametrize("kind, precision, out, layout, shape", CASES,
                         ids=[f"{c[0]}-{c[1]}-{c[2]}-{c[3]}" for c in CASES])
def test_product_with_bias(kind, precision, out, layout, shape):
    spec = build(kind, precision, out, layout, True)
    assert spec.bias_arg and spec.b_operand == layout
    C, a64, b64, bias64 = run(spec, precision, *shape, layout, seed=sum(shape))
    check(C, out, a64, b64, bias64, spec.name)


@sim_only
@pytest.mark.parametrize("kind, precision, out, shape", [
    ("ws", "fp16", "fp32", (37, 19, 72)), ("split_k", "fp16", "bf16", (9, 23, 136)),
    ("pingpong", "fp16", "fp32", (45, 29, 64)), ("tf32", "tf32", "fp32", (33, 7, 20))])
def test_nk_without_bias(kind, precision, out, shape):
    """An NK build with no bias, and a bias build given none (a (0, N) bias): the same
    product, bit for bit."""
    if out == "bf16":
        precision = "bf16"
    plain = build(kind, precision, out, "NK", False)
    C, a64, b64, _ = run(plain, precision, *shape, "NK", seed=sum(shape))
    check(C, out, a64, b64, None, plain.name)
    C0, *_ = run(build(kind, precision, out, "NK", True), precision, *shape, "NK",
                 seed=sum(shape), with_bias=False)
    assert np.array_equal(C.view(np.uint32 if out == "fp32" else np.uint16),
                          C0.view(np.uint32 if out == "fp32" else np.uint16))


# --------------------------------------------------------------------------- the GPU

#: the default tiles, shapes of a model's layers and odd ones (GPU: ``dispatch.launch``
#: passes the bias after C, as the simulator's launch does)
GPU_CASES = [
    (lambda: wgmma_ws.build("fp16", B_LAYOUT="NK", BIAS=True), "fp16", (37, 1001, 3000)),
    (lambda: wgmma_ws.build("bf16", OUT="bf16", B_LAYOUT="NK", BIAS=True), "bf16",
     (300, 515, 1032)),
    (lambda: wgmma_ws.build("fp16", BIAS=True), "fp16", (129, 264, 200)),
    (lambda: wgmma_split_k.build("bf16", BM=64, B_LAYOUT="NK", BIAS=True), "bf16",
     (9, 4100, 4096)),
    (lambda: wgmma_split_k.build("fp16", BM=64, SPLITS=5, OUT="fp16", B_LAYOUT="NK",
                                 BIAS=True), "fp16", (17, 333, 2048)),
    (lambda: wgmma_store.build("bf16", STAGES=4, PIECES=2, OUT="bf16", B_LAYOUT="NK",
                               BIAS=True), "bf16", (300, 1000, 1032)),
    (lambda: wgmma_store.build("fp16", B_LAYOUT="NK", BIAS=True), "fp16", (129, 333, 520)),
    (lambda: wgmma_pingpong.build("fp16", B_LAYOUT="NK", BIAS=True), "fp16", (300, 515, 1032)),
    (lambda: wgmma_cluster.build("fp16", B_LAYOUT="NK", BIAS=True), "fp16", (300, 515, 1032)),
    (lambda: wgmma_tf32.build(B_LAYOUT="NK", BIAS=True), "tf32", (130, 501, 1028)),
    (lambda: wgmma_tf32.build(BIAS=True), "tf32", (65, 264, 260)),
]


@pytest.mark.gpu
@pytest.mark.parametrize("make, precision, shape", GPU_CASES)
def test_nk_and_bias_on_hopper_gpu(make, precision, shape):
    if not HOPPER:
        pytest.skip("wgmma needs an H100/H200")
    spec = make()
    out = spec.params.get("OUT", "fp32")
    for with_bias in (True, False):
        C, a64, b64, bias64 = run(spec, precision, *shape, spec.b_operand,
                                  seed=int(np.random.default_rng().integers(1 << 30)),
                                  with_bias=with_bias)
        check(C, out, a64, b64, bias64, (spec.name, with_bias))
