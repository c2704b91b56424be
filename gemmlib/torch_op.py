"""gemmlib's product as a torch operator: one op that torch.compile and torch.export see,
with a fake kernel for shapes and dtypes and a backward made of gemmlib products.

    import torch, gemmlib.torch_op as gop
    y = gop.linear(x, layer.weight, layer.bias)       # F.linear, differentiable
    C = gop.matmul(A, B)                              # torch.matmul, differentiable

``torch.ops.gemmlib.matmul(A, B, bias, out_dtype)`` is the registered op (``torch.library``).
Its forward is :func:`gemmlib.matmul` on the tensors as torch holds them (a transposed view
is read in place where a rung reads that layout).  Its backward runs gemmlib too, in the
layouts the transposes give: dA = dC @ B^T (B read column-major), dB = A^T @ dC (A read
column-major), each summed over broadcast batch dimensions; the bias's gradient is dC
summed over every dimension but the last.  Under ``torch.autocast`` the op casts its
inputs as ``torch.matmul`` does (:func:`_autocast_rule`).  :func:`matmul` and :func:`linear`
call the op where torch traces; on plain tensors in eager mode they run the same casts,
products and gradients without the operator's dispatch (:func:`_product`), whose Python
layers cost more host time than the call itself.  Importing this module imports
torch; the rest of gemmlib never does.
"""

from __future__ import annotations

from typing import Optional

import torch

from gemmlib import api
from gemmlib.frontends.torch_tensors import tensor_types


@torch.library.custom_op("gemmlib::matmul", mutates_args=())
def _matmul_op(a: torch.Tensor, b: torch.Tensor, bias: Optional[torch.Tensor] = None,
               out_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    return _call(a, b, bias, out_dtype)   # (autograd is the op's own)


@_matmul_op.register_fake
def _(a, b, bias=None, out_dtype=None):
    # torch.matmul's shape rules, on fake tensors: no data is touched
    c = torch.matmul(a, b)
    if bias is not None:
        c = c + bias
    return c.to(out_dtype or a.dtype)


def _setup_context(ctx, inputs, output):
    a, b, bias, _ = inputs
    ctx.save_for_backward(a, b)
    ctx.bias_shape = None if bias is None else bias.shape


def _gradients(mm, needs, a, b, bias_shape, grad):
    """(dA, dB, dbias) of C = A @ B (+ bias), each where ``needs`` says, with the products
    ``mm(x, y)`` (the op, or under no autograd the call itself)."""
    g = grad.to(a.dtype)   # a float32 result of 16-bit inputs: its gradient in their type
    da = db = dbias = None
    if needs[0]:
        da = mm(g, b.mT).sum_to_size(a.shape)
    if needs[1]:
        if b.dim() == 2:   # one B for every row of every matrix of A
            a2, g2 = a.reshape(-1, a.shape[-1]), g.reshape(-1, g.shape[-1])
            if b.stride(0) == 1 and b.stride(1) != 1:
                # B is a transposed view (F.linear's weight.t()): dB in the same order, so
                # the weight's own gradient comes out row-major, as autograd stores it
                # (another order costs a transposing copy of every weight's gradient)
                db = mm(g2.mT, a2).mT
            else:
                db = mm(a2.mT, g2)
        else:
            db = mm(a.mT, g).sum_to_size(b.shape)
    if bias_shape is not None and needs[2]:
        dbias = grad.reshape(-1, grad.shape[-1]).sum(0).to(a.dtype).reshape(bias_shape)
    return da, db, dbias


def _backward(ctx, grad):
    a, b = ctx.saved_tensors
    return _gradients(_matmul_op, ctx.needs_input_grad, a, b, ctx.bias_shape, grad) + (None,)


_matmul_op.register_autograd(_backward, setup_context=_setup_context)


def _cast(t, dt):
    """``t`` as autocast casts a matmul's input: floating types but float64 to ``dt``."""
    if t is None or not t.is_floating_point() or t.dtype in (dt, torch.float64):
        return t
    return t.to(dt)


def _autocast_rule(device_type: str):
    """The op's kernel for ``device_type``'s autocast key: as ``torch.matmul`` under
    ``torch.autocast``, floating inputs other than float64 are cast to the autocast dtype
    of the moment (float16 or bfloat16: torch's own rule reads it at each call, which
    ``torch.library.register_autocast``'s fixed dtype cannot), then the op runs with
    autocast off for it."""
    key = "Autocast" + torch._C._dispatch_key_for_device(device_type)
    off = torch._C.DispatchKeySet(getattr(torch._C.DispatchKey, key))

    def kernel(_keyset, a, b, bias=None, out_dtype=None):
        dt = torch.get_autocast_dtype(device_type)
        with torch._C._ExcludeDispatchKeyGuard(off):
            return _matmul_op(_cast(a, dt), _cast(b, dt), _cast(bias, dt), out_dtype)

    return key, kernel


_LIB = torch.library.Library("gemmlib", "FRAGMENT")
for _device in ("cuda", "cpu"):
    _key, _kernel = _autocast_rule(_device)
    _LIB.impl("matmul", _kernel, _key, with_keyset=True)


class _Eager(torch.autograd.Function):
    """The op's autograd without the operator's dispatch, for eager calls on plain tensors:
    torch.library's Python layers around a custom op cost a training step's linear layer
    several times the call itself (results/tune-2026-11-27c/); the products and gradients
    are the same (:func:`_gradients`)."""

    @staticmethod
    def forward(ctx, a, b, bias, out_dtype):
        ctx.save_for_backward(a, b)
        ctx.bias_shape = None if bias is None else bias.shape
        return _call(a, b, bias, out_dtype)   # (autograd is off here)

    @staticmethod
    def backward(ctx, grad):
        a, b = ctx.saved_tensors
        # a graph of the backward itself (create_graph=True) needs the differentiable op
        mm = _matmul_op if torch.is_grad_enabled() else _call
        return _gradients(mm, ctx.needs_input_grad, a, b, ctx.bias_shape, grad) + (None,)


#: torch.Tensor and nn.Parameter: the types gemmlib.matmul's lean path takes as they are
_PLAIN = tuple(tensor_types())


def _product(a, b, bias, out_dtype):
    """The registered op where torch traces (torch.compile, export: fake or functional
    tensors); for plain tensors in eager mode, after autocast's casts (as the op's own
    rule), the same product through :class:`_Eager`, or the call itself where autograd has
    nothing to record."""
    if (type(a) in _PLAIN and type(b) in _PLAIN and (bias is None or type(bias) in _PLAIN)
            and not torch.compiler.is_compiling()):
        device = a.device.type
        if torch.is_autocast_enabled(device):
            dt = torch.get_autocast_dtype(device)
            a, b, bias = _cast(a, dt), _cast(b, dt), _cast(bias, dt)
        if not torch.is_grad_enabled() or not (
                a.requires_grad or b.requires_grad or (bias is not None and bias.requires_grad)):
            return _call(a, b, bias, out_dtype)   # nothing for autograd to record
        return _Eager.apply(a, b, bias, out_dtype)
    return _matmul_op(a, b, bias, out_dtype)


def _call(a, b, bias=None, out_dtype=None):
    """:func:`gemmlib.matmul` on tensors autograd does not record here (a host tensor that
    requires grad is detached: DLPack refuses it)."""
    if a.requires_grad:
        a = a.detach()
    if b.requires_grad:
        b = b.detach()
    if bias is not None and bias.requires_grad:
        bias = bias.detach()
    return api.matmul(a, b, bias=bias, out_dtype=out_dtype)


def matmul(A: torch.Tensor, B: torch.Tensor, *, bias: Optional[torch.Tensor] = None,
           out_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """``torch.matmul(A, B) (+ bias)`` on gemmlib's kernels, as a differentiable op that
    ``torch.compile(fullgraph=True)`` keeps in one graph."""
    return _product(A, B, bias, out_dtype)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
           *, out_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """``torch.nn.functional.linear`` on gemmlib's kernels: ``x @ weight.T + bias``, the
    weight as ``nn.Linear`` keeps it (read in place), differentiable."""
    return _product(x, weight.t(), bias, out_dtype)
