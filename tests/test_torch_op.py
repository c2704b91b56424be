"""gemmlib.torch_op: the product as a torch operator (CPU tensors, the simulator's kernels):
values and gradients against float64, shapes and dtypes of the fake kernel, one op under
torch.compile(fullgraph=True) and torch.export."""

import pytest

torch = pytest.importorskip("torch")
import gemmlib.torch_op as gop  # noqa: E402


def _f64(*xs):
    return [x.detach().double().requires_grad_(x.requires_grad) for x in xs]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_linear_values_and_gradients(dtype):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 7, generator=g).to(dtype).requires_grad_()
    w = torch.randn(5, 7, generator=g).to(dtype).requires_grad_()
    b = torch.randn(5, generator=g).to(dtype).requires_grad_()
    y = gop.linear(x, w, b)
    assert y.shape == (2, 3, 5) and y.dtype == dtype
    (y.float() * torch.arange(5.0)).sum().backward()
    x2, w2, b2 = _f64(x, w, b)
    (torch.nn.functional.linear(x2, w2, b2) * torch.arange(5.0).double()).sum().backward()
    tol = 1e-5 if dtype == torch.float32 else 5e-2
    for got, want in ((y, torch.nn.functional.linear(x2, w2, b2)), (x.grad, x2.grad),
                      (w.grad, w2.grad), (b.grad, b2.grad)):
        assert got.dtype == dtype
        assert (got.double() - want).abs().max().item() <= tol * (1 + want.abs().max().item())


def test_a_transposed_weight_gets_its_gradient_in_its_own_order():
    """dB of ``x @ W.t()`` comes back as a transposed view too, so the weight's gradient is
    row-major like the weight (autograd would otherwise copy it into that order)."""
    x = torch.randn(6, 7, requires_grad=True)
    w = torch.randn(5, 7, requires_grad=True)
    wt = w.t()
    (gwt,) = torch.autograd.grad((gop.matmul(x, wt) * torch.arange(5.0)).sum(), wt)
    assert gwt.t().is_contiguous()
    assert torch.allclose(gwt, x.detach().t() @ torch.arange(5.0).expand(6, 5), atol=1e-5)


def test_eager_calls_skip_the_operator_dispatch():
    """Eager calls on plain tensors record their own autograd node (no torch.library
    layers on the way); under no_grad they are the call itself."""
    x = torch.randn(4, 8, requires_grad=True)
    w = torch.randn(3, 8, requires_grad=True)
    assert type(gop.linear(x, w).grad_fn).__name__ == "_EagerBackward"
    with torch.no_grad():
        assert gop.linear(x, w).grad_fn is None
    assert gop.linear(x.detach(), w.detach()).grad_fn is None   # nothing requires grad


def test_batched_gradients_sum_over_broadcast_dimensions():
    A = torch.randn(3, 6, 4, requires_grad=True)
    B = torch.randn(1, 4, 2, requires_grad=True)   # broadcast over the batch
    gop.matmul(A, B).sum().backward()
    A2, B2 = _f64(A, B)
    (A2 @ B2).sum().backward()
    assert B.grad.shape == B.shape
    assert torch.allclose(A.grad.double(), A2.grad, atol=1e-5)
    assert torch.allclose(B.grad.double(), B2.grad, atol=1e-5)


def test_fp32_results_of_16_bit_inputs():
    a, b = torch.randn(4, 8).half().requires_grad_(), torch.randn(8, 3).half()
    c = gop.matmul(a, b, out_dtype=torch.float32)
    assert c.dtype == torch.float32
    c.sum().backward()
    assert a.grad.dtype == torch.float16


def test_the_op_checks_out():
    torch.library.opcheck(torch.ops.gemmlib.matmul.default,
                          (torch.randn(3, 4), torch.randn(4, 2), torch.randn(2), None))


def test_one_graph_under_compile_and_export():
    w = torch.nn.Parameter(torch.randn(6, 5))

    def f(x):
        return torch.relu(gop.linear(x, w))

    x = torch.randn(4, 5)
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    assert torch.allclose(compiled(x), f(x))

    class M(torch.nn.Module):
        def forward(self, x, w):
            return gop.matmul(x, w.t())

    graph = torch.export.export(M(), (x, w.detach())).graph
    assert [n.target for n in graph.nodes if n.op == "call_function"
            and "gemmlib" in str(n.target)] == [torch.ops.gemmlib.matmul.default]


@pytest.mark.parametrize("dt", [torch.bfloat16, torch.float16])
def test_autocast_casts_the_op_inputs_like_torch_matmul(dt):
    """Under torch.autocast the op computes in the autocast dtype of the moment, as
    torch.matmul does, gradients included."""
    g = torch.Generator().manual_seed(5)
    a = torch.randn(5, 9, generator=g, requires_grad=True)
    b = torch.randn(9, 4, generator=g)
    with torch.autocast("cpu", dtype=dt):
        y = torch.ops.gemmlib.matmul(a, b)
        want = torch.matmul(a, b)
    assert y.dtype == want.dtype == dt
    ref = a.detach().to(dt).double() @ b.to(dt).double()
    assert (y.double() - ref).abs().max().item() <= 1e-2 * (1 + ref.abs().max().item())
    y.float().sum().backward()
    assert a.grad.dtype == torch.float32 and a.grad.shape == a.shape
    assert torch.allclose(a.grad, b.sum(1).expand(5, 9).to(dt).float(), atol=5e-2)


def test_a_graph_of_the_backward_differentiates_again():
    """create_graph=True: the eager path's backward runs the differentiable op, so a
    gradient of the gradient is right (here d/dA of sum(dL/dB), L = sum(A @ B))."""
    A32, B32 = torch.randn(3, 4, requires_grad=True), torch.randn(4, 2, requires_grad=True)
    (gb,) = torch.autograd.grad(gop.matmul(A32, B32).sum(), B32, create_graph=True)
    (gga,) = torch.autograd.grad(gb.sum(), A32)
    # dL/dB = A^T @ ones(3, 2); its sum over B's elements is 2 * sum(A): d/dA = 2 everywhere
    assert torch.allclose(gga, torch.full_like(A32, 2.0))
