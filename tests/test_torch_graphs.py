"""torch callers on a GPU: calls captured in CUDA graphs replay right with new data and
equal an eager call bit for bit, torch.compile keeps the op in one graph, and a torch
caller's process never imports CuPy."""

import os
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

import gemmlib  # noqa: E402
from gemmlib import backend  # noqa: E402

gpu = pytest.mark.gpu
needs_gpu = pytest.mark.skipif(not backend.gpu_present() or not torch.cuda.is_available(),
                               reason="needs a GPU")


def _fill(t, seed):
    g = torch.Generator(device=t.device).manual_seed(seed)
    if t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        t.copy_((torch.rand(t.shape, device=t.device, generator=g) * 2 - 1).to(t.dtype))
    else:
        t.copy_((torch.rand(t.shape, device=t.device, generator=g) * 2 - 1).to(t.dtype))


def _rel(C, R):
    C, R = C.double(), R.double()
    return ((C - R).norm() / R.norm().clamp_min(1e-30)).item()


#: every path "auto" takes from torch: (name, M, N, K, dtype, layout of B, bias, 3-D)
CASES = [
    ("decode fp16", 1, 4096, 4096, torch.float16, "NK", False, False),
    ("decode bf16 x16", 16, 3072, 4096, torch.bfloat16, "NK", True, False),
    ("decode KN", 8, 2048, 1024, torch.float16, "KN", False, False),
    ("split-K", 128, 256, 16384, torch.bfloat16, "KN", False, False),
    ("16-bit C", 1024, 1024, 1024, torch.float16, "KN", False, False),
    ("F.linear bias", 512, 1536, 768, torch.bfloat16, "NK", True, True),
    ("odd shape", 37, 29, 53, torch.float16, "KN", False, False),
    ("fp32", 256, 256, 256, torch.float32, "KN", False, False),
]


def _operands(M, N, K, dtype, layout, bias, nd):
    A = torch.empty((2, M // 2, K) if nd and M % 2 == 0 else (M, K), device="cuda", dtype=dtype)
    W = torch.empty((N, K) if layout == "NK" else (K, N), device="cuda", dtype=dtype)
    z = torch.empty(N, device="cuda", dtype=dtype) if bias else None
    return A, W, z


def _call(A, W, z, layout):
    B = W.t() if layout == "NK" else W
    return gemmlib.matmul(A, B, bias=z)


def _reference(A, W, z, layout):
    B = (W.t() if layout == "NK" else W).double()
    R = A.double() @ B
    return R if z is None else R + z.double()


@gpu
@needs_gpu
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_a_captured_call_replays_with_new_data(case):
    _, M, N, K, dtype, layout, bias, nd = case
    A, W, z = _operands(M, N, K, dtype, layout, bias, nd)
    for i, t in enumerate((A, W, z)):
        if t is not None:
            _fill(t, i)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):   # warm-up, as torch asks before a capture
        for _ in range(3):
            _call(A, W, z, layout)
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        C = _call(A, W, z, layout)
    for seed in (10, 20):
        for i, t in enumerate((A, W, z)):
            if t is not None:
                _fill(t, seed + i)
        g.replay()
        torch.cuda.synchronize()
        tol = 1e-5 if dtype == torch.float32 else 1e-2
        assert _rel(C, _reference(A, W, z, layout)) < tol, case[0]
        eager = _call(A, W, z, layout)
        assert torch.equal(eager, C), "a replay must equal an eager call bit for bit"


@gpu
@needs_gpu
def test_two_graphs_of_one_shape_and_eager_calls_interleave():
    """Graphs keep buffers and maps of their own: eager calls between replays (new maps,
    the same workspace key) cannot disturb them."""
    M, N, K = 64, 512, 8192   # split over K: a workspace, and TMA maps on Hopper
    A1, W1, _ = _operands(M, N, K, torch.bfloat16, "NK", False, False)
    A2, W2, _ = _operands(M, N, K, torch.bfloat16, "NK", False, False)
    for i, t in enumerate((A1, W1, A2, W2)):
        _fill(t, 30 + i)
    _call(A1, W1, None, "NK")
    torch.cuda.synchronize()
    graphs, outs = [], []
    for A, W in ((A1, W1), (A2, W2)):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            outs.append(_call(A, W, None, "NK"))
        graphs.append(g)
    others = [torch.empty_like(A1) for _ in range(4)]
    for step in range(3):
        for o in others:
            _fill(o, 100 + step)
            _call(o, W1, None, "NK")   # eager calls: new operands, new maps
        for (A, W), g, C in zip(((A1, W1), (A2, W2)), graphs, outs):
            _fill(A, 200 + step)
            g.replay()
            torch.cuda.synchronize()
            assert _rel(C, _reference(A, W, None, "NK")) < 1e-2


@gpu
@needs_gpu
def test_fp8_with_tensor_scales_under_a_graph():
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("FP8 products need Hopper")
    M, N, K = 256, 512, 1024
    A = torch.empty(M, K, device="cuda", dtype=torch.float8_e4m3fn)
    W = torch.empty(N, K, device="cuda", dtype=torch.float8_e4m3fn)
    sa = torch.tensor([0.5], device="cuda")
    sb = torch.tensor([2.0], device="cuda")
    _fill(A, 1), _fill(W, 2)
    for _ in range(2):
        gemmlib.matmul(A, W.t(), scale_a=sa, scale_b=sb)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        C = gemmlib.matmul(A, W.t(), scale_a=sa, scale_b=sb)
    _fill(A, 3), _fill(W, 4)
    sa.fill_(0.25)
    g.replay()
    torch.cuda.synchronize()
    R = 0.25 * 2.0 * (A.double() @ W.t().double())
    assert _rel(C, R) < 2e-2
    assert torch.equal(C, gemmlib.matmul(A, W.t(), scale_a=sa, scale_b=sb))


@gpu
@needs_gpu
@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
@pytest.mark.parametrize("tokens, features", [((4, 32), (256, 384)), ((8,), (4096, 4096))])
def test_compile_fullgraph_on_the_gpu(tokens, features, mode):
    """``torch.compile(fullgraph=True)`` of a function calling the op, compiled and run
    twice (replayed where graphed); (8,) x 4096: a decode batch, on Hopper ``wgmma_swap``
    with its tiles' tickets in a workspace."""
    import gemmlib.torch_op as gop

    lin = torch.nn.Linear(*features, device="cuda", dtype=torch.bfloat16)

    def f(x):
        return torch.relu(gop.linear(x, lin.weight, lin.bias)) * 2

    x = torch.randn(*tokens, features[0], device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        want = torch.relu(torch.nn.functional.linear(x.double(), lin.weight.double(),
                                                      lin.bias.double())) * 2
        torch._dynamo.reset()
        got = torch.compile(f, fullgraph=True, mode=mode)(x)
        got = torch.compile(f, fullgraph=True, mode=mode)(x)
        assert _rel(got, want) < 1e-2, mode


_NO_CUPY = textwrap.dedent("""
    import sys
    class NoCuPy:   # an import of CuPy fails here, with the importer's traceback
        def find_spec(self, name, path=None, target=None):
            if name == "cupy" or name.startswith("cupy."):
                raise ImportError("a torch caller's process imported CuPy")
    sys.meta_path.insert(0, NoCuPy())
    import torch
    import gemmlib, gemmlib.torch_op as gop
    dev = "cuda"
    def rnd(*s, dtype=torch.float16):
        return (torch.rand(*s, device=dev) * 2 - 1).to(dtype)
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for M, N, K in ((1, 4096, 4096), (16, 1024, 8192), (128, 256, 16384), (37, 29, 53),
                        (1024, 1024, 1024)):
            A, B = rnd(M, K, dtype=dtype), rnd(K, N, dtype=dtype)
            C = gemmlib.matmul(A, B)
            gemmlib.matmul(A, rnd(N, K, dtype=dtype).t(), bias=rnd(N, dtype=dtype))
            gemmlib.matmul(rnd(4, M, K, dtype=dtype), B)
    gemmlib.matmul(rnd(8, 64, 64), rnd(8, 64, 64))
    x = rnd(3, 5, 64, dtype=torch.bfloat16).requires_grad_()
    w = rnd(32, 64, dtype=torch.bfloat16).requires_grad_()
    gop.linear(x, w).float().sum().backward()
    if torch.cuda.get_device_capability() >= (9, 0):
        a8 = rnd(256, 512).to(torch.float8_e4m3fn)
        w8 = rnd(128, 512).to(torch.float8_e4m3fn)
        one = torch.ones(1, device=dev)
        gemmlib.matmul(a8, w8.t(), scale_a=one, scale_b=one)
    torch.cuda.synchronize()
    print("cupy imported:", "cupy" in sys.modules)
    assert "cupy" not in sys.modules
""")


@gpu
@needs_gpu
def test_a_torch_process_never_imports_cupy():
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "0"}
    r = subprocess.run([sys.executable, "-c", _NO_CUPY], capture_output=True, text=True,
                       env=env, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "cupy imported: False" in r.stdout
