"""Streams, repeatability and threads.

* ``matmul(..., stream=s)`` runs on the caller's stream (CuPy or numba), in
  order with work already queued there -- checked on a *non-blocking*
  stream behind a long-running product, so a launch on any other stream
  would read inputs that are not written yet and give a wrong answer; the
  host-array path stages its copies on that stream too;
* the same inputs give bit-identical outputs, run after run, for every kernel;
* two Python threads calling matmul at once get correct results (and so does
  ``kernel="auto"``, with its tuning cache, once that rung is registered).
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

import gemmlib
from gemmlib import backend

from _reliability import (assert_close, host_operands, kernel_names, nk, ref64, run,
                          spec_or_skip)


def _cp():
    return backend.array_module()


def _f32(rng, *shape):
    return rng.uniform(-1, 1, shape).astype(np.float32)


def _close(C, ref, K, spec=None):
    assert_close(C, ref, K, spec)


# --------------------------------------------------------------------------- simulator


def test_repeatable_in_the_simulator(rng):
    name = "blocktile_2d" if "blocktile_2d" in kernel_names() else kernel_names()[0]
    spec = spec_or_skip(name)
    A, B = host_operands(spec, 19, 17, 13, rng)
    first = run(spec, A, B)
    again = run(spec, A, B, out=np.full_like(first, np.nan))
    assert first.tobytes() == again.tobytes()


# --------------------------------------------------------------------------- GPU


def _delay(cp, s, n=4096):
    """Queue a ~millisecond-long product on ``s`` so later work on ``s`` starts late."""
    with s:
        X = cp.ones((n, n), np.float32)
        for _ in range(3):
            X = X @ X * np.float32(1.0 / n)
    return X


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["cupy", "numba", "current"])
@pytest.mark.parametrize("name", kernel_names())
def test_runs_in_order_on_the_callers_stream_gpu(name, kind, rng):
    """Inputs written on a non-blocking stream behind slow work; matmul on that stream must
    see them, and a copy queued after it must see the result."""
    spec = spec_or_skip(name)
    cp = _cp()
    M, N, K = 300, 257, 129
    A_h, B_h = host_operands(spec, M, N, K, rng)
    s = cp.cuda.Stream(non_blocking=True)
    A_src, B_src = cp.asarray(A_h), cp.asarray(B_h)
    A = cp.zeros((M, K), A_h.dtype)
    B = cp.zeros(B_h.shape, B_h.dtype)
    cp.cuda.Device().synchronize()
    _delay(cp, s)
    with s:  # device-to-device copies, queued behind the slow product (the host does not wait)
        A[...] = A_src
        B[...] = B_src
    if kind == "cupy":
        C = run(spec, A, B, stream=s)
    elif kind == "numba":
        C = run(spec, A, B, stream=backend.cuda.external_stream(s.ptr))
    else:
        with s:  # no stream argument: CuPy's current stream
            C = run(spec, A, B)
    with s:
        C_copy = C.copy()  # queued after the kernel on the same stream
    s.synchronize()
    _close(C_copy, ref64(spec, A_h, B_h), K, spec)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["cupy", "numba"])
def test_host_arrays_on_a_non_blocking_stream_gpu(kind, rng):
    """Host in, host out on the caller's stream: the copies must be ordered with the kernel."""
    name = "naive" if "naive" in kernel_names() else kernel_names()[0]
    spec = spec_or_skip(name)
    cp = _cp()
    s = cp.cuda.Stream(non_blocking=True)
    stream = s if kind == "cupy" else backend.cuda.external_stream(s.ptr)
    for _ in range(3):  # fresh inputs each time: a stale result from the pool cannot pass
        A, B = host_operands(spec, 700, 600, 500, rng)
        _delay(cp, s)
        C = run(spec, A, B, stream=stream)
        _close(C, ref64(spec, A, B), 500, spec)


@pytest.mark.gpu
@pytest.mark.parametrize("name", kernel_names())
def test_bit_identical_run_after_run_gpu(name, rng):
    spec = spec_or_skip(name)
    cp = _cp()
    for M, N, K in ((1000, 999, 1001), (67, 45, 37)):
        A_h, B_h = host_operands(spec, M, N, K, rng)
        A, B = cp.asarray(A_h), cp.asarray(B_h)
        first = cp.asnumpy(run(spec, A, B))
        for i in range(4):
            out = cp.full((M, N), np.nan if i % 2 else 0.0, np.float32)
            again = cp.asnumpy(run(spec, A, B, out=out))
            assert first.tobytes() == again.tobytes(), f"{name} {M}x{N}x{K} run {i + 2} differs"
        _close(first, ref64(spec, A_h, B_h), K, spec)


def _threads(work, n=2):
    errors = []

    def body(i):
        try:
            work(i)
        except BaseException as e:  # noqa: BLE001 - report everything from the thread
            errors.append(f"thread {i}: {type(e).__name__}: {e}")

    ts = [threading.Thread(target=body, args=(i,)) for i in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in ts), "a thread hung"
    assert not errors, "\n".join(errors)


@pytest.mark.gpu
@pytest.mark.parametrize("name", kernel_names())
def test_two_threads_at_once_gpu(name):
    spec = spec_or_skip(name)
    cp = _cp()

    def work(i):
        rng = np.random.default_rng(100 + i)
        s = cp.cuda.Stream(non_blocking=True) if i % 2 else None
        for it in range(6):
            M, N, K = (int(x) for x in rng.integers(1, 700, size=3))
            A_h, B_h = host_operands(spec, M, N, K, rng)
            # the inputs made on the stream the call runs on (copies on the null stream
            # are not ordered with a non-blocking stream's kernels: the caller's to order)
            with s or cp.cuda.get_current_stream():
                A, B = cp.asarray(A_h), cp.asarray(B_h)
            C = run(spec, A, B, stream=s)
            (s or cp.cuda.get_current_stream()).synchronize()
            _close(C, ref64(spec, A_h, B_h), K, spec)

    _threads(work)


@pytest.mark.gpu
def test_two_threads_compile_a_fresh_kernel_at_once_gpu():
    """First use of a new configuration from two threads: one compilation, both right."""
    from gemmlib.kernels import module

    name = "shared" if "shared" in kernel_names() else None
    if name is None or not hasattr(module(name), "build"):
        pytest.skip("needs the shared rung's build()")
    spec = module(name).build(TILE=8)  # a configuration nothing else compiles
    barrier = threading.Barrier(2)

    def work(i):
        rng = np.random.default_rng(i)
        A, B = host_operands(spec, 37, 29, 23, rng)
        barrier.wait()
        C = run(spec, A, B)
        _close(C, ref64(spec, A, B), 23, spec)

    _threads(work)


@pytest.mark.gpu
def test_two_threads_with_kernel_auto_gpu():
    cp = _cp()

    def work(i):
        rng = np.random.default_rng(200 + i)
        for M, N, K in ((512, 512, 512), (333, 222, 111), (512, 512, 512), (1024, 64, 300)):
            A_h = _f32(rng, M, K)
            B_h = _f32(rng, K, N)
            C = gemmlib.matmul(cp.asarray(A_h), cp.asarray(B_h), kernel="auto")
            cp.cuda.get_current_stream().synchronize()
            _close(C, A_h.astype(np.float64) @ B_h, K)

    _threads(work)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, shape", [("float16", (8, 1024, 4096)),
                                          ("bfloat16", (16, 640, 2048)),
                                          ("float32", (24, 96, 16384))])
def test_two_threads_on_one_stream_gpu(dtype, shape):
    """Two threads calling on the same (torch's current) stream, their launches interleaved:
    decode-sized activations (copied into a staging buffer) and deep-K products (sliced
    sums in a second launch) stay each call's own.  Every result checked against float64."""
    torch = pytest.importorskip("torch")
    M, N, K = shape
    dt = getattr(torch, dtype)
    barrier = threading.Barrier(2)

    def work(i):
        g = torch.Generator(device="cuda").manual_seed(40 + i)
        W = (torch.rand((N, K), generator=g, device="cuda") - 0.5).to(dt)
        xs = [(torch.rand((M, K), generator=g, device="cuda") - 0.5).to(dt) for _ in range(8)]
        torch.cuda.synchronize()
        barrier.wait()
        outs = [gemmlib.linear(x, W) for x in xs for _ in range(4)]
        torch.cuda.synchronize()
        for j, C in enumerate(outs):
            x = xs[j // 4]
            ref = x.double() @ W.double().t()
            err = float((C.double() - ref).norm() / ref.norm())
            assert err < (1e-2 if dtype == "bfloat16" else 2e-3 if dtype == "float16" else 1e-5), (i, j, err)

    _threads(work)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_buffers_of_a_destroyed_stream_are_evicted_safely_gpu(dtype, monkeypatch):
    """A call on a stream the caller then destroys leaves buffers kept for that stream
    (split-K's partial sums, a staged A); evicting them later, with torch's CUDA up, must
    not touch the dead stream.  Every result checked against float64."""
    import gc

    torch = pytest.importorskip("torch")
    cp = _cp()
    from gemmlib.runtime import launch

    torch.zeros(1, device="cuda")   # torch's CUDA up: kept buffers come from the driver
    rng = np.random.default_rng(5)
    A_h = (rng.random((16, 8192)) - 0.5).astype(dtype)
    B_h = (rng.random((8192, 96)) - 0.5).astype(dtype)
    ref = A_h.astype(np.float64) @ B_h.astype(np.float64)

    def check(C):
        got = cp.asnumpy(C).astype(np.float64)
        assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < (1e-5 if dtype == "float32" else 2e-3)

    for _ in range(3):
        s = cp.cuda.Stream(non_blocking=True)
        with s:
            C = gemmlib.matmul(cp.asarray(A_h), cp.asarray(B_h), out_dtype=np.float32)
            check(C)
        s.synchronize()
        del s, C
        gc.collect()                                  # the stream is destroyed
    monkeypatch.setattr(launch, "SCRATCH_BYTES", 1)   # every earlier stream's buffers go
    check(gemmlib.matmul(cp.asarray(A_h), cp.asarray(B_h), out_dtype=np.float32))
    cp.cuda.Device().synchronize()


@pytest.mark.gpu
def test_a_call_keeping_buffers_past_the_budget_keeps_its_own_gpu(monkeypatch):
    """tf32 with A column-major and B row-major keeps a transposed B, then a transposed A: with
    a budget smaller than either, neither may go before the call's kernel has read them."""
    torch = pytest.importorskip("torch")
    from gemmlib.runtime import launch

    if tuple(backend.device_info().compute_capability) != (9, 0):
        pytest.skip("the tf32 wgmma rung's pre-passes: an H100/H200")
    monkeypatch.setattr(launch, "SCRATCH_BYTES", 1 << 16)
    g = torch.Generator(device="cuda").manual_seed(3)
    for M, N, K in ((640, 520, 1032), (256, 4104, 2048)):
        A = (torch.rand((K, M), generator=g, device="cuda") - 0.5).t()     # column-major
        B = torch.rand((K, N), generator=g, device="cuda") - 0.5           # row-major
        C = gemmlib.matmul(A, B, precision="tf32")
        ref = A.double() @ B.double()
        assert float((C.double() - ref).norm() / ref.norm()) < 2e-3, (M, N, K)
    torch.cuda.synchronize()
