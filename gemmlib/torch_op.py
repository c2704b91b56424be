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
inputs as ``torch.matmul`` does (:func:`_autocast_rule`).  Importing this module imports torch; the rest
of gemmlib never does.
"""

from __future__ import annotations

from typing import Optional

import torch

from gemmlib import api


@torch.library.custom_op("gemmlib::matmul", mutates_args=())
def _matmul_op(a: torch.Tensor, b: torch.Tensor, bias: Optional[torch.Tensor] = None,
               out_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    # (autograd is this op's own: its inputs may still say requires_grad)
    return api.matmul(a.detach(), b.detach(), bias=None if bias is None else bias.detach(),
                      out_dtype=out_dtype)


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


def _backward(ctx, grad):
    a, b = ctx.saved_tensors
    g = grad.to(a.dtype)   # a float32 result of 16-bit inputs: its gradient in their type
    da = db = dbias = None
    if ctx.needs_input_grad[0]:
        da = _matmul_op(g, b.mT).sum_to_size(a.shape)
    if ctx.needs_input_grad[1]:
        if b.dim() == 2:   # one B for every row of every matrix of A
            a2, g2 = a.reshape(-1, a.shape[-1]), g.reshape(-1, g.shape[-1])
            if b.stride(0) == 1 and b.stride(1) != 1:
                # B is a transposed view (F.linear's weight.t()): dB in the same order, so
                # the weight's own gradient comes out row-major, as autograd stores it
                # (another order costs a transposing copy of every weight's gradient)
                db = _matmul_op(g2.mT, a2).mT
            else:
                db = _matmul_op(a2.mT, g2)
        else:
            db = _matmul_op(a.mT, g).sum_to_size(b.shape)
    if ctx.bias_shape is not None and ctx.needs_input_grad[2]:
        dbias = grad.reshape(-1, grad.shape[-1]).sum(0).to(a.dtype).reshape(ctx.bias_shape)
    return da, db, dbias, None


_matmul_op.register_autograd(_backward, setup_context=_setup_context)


def _autocast_rule(device_type: str):
    """The op's kernel for ``device_type``'s autocast key: as ``torch.matmul`` under
    ``torch.autocast``, floating inputs other than float64 are cast to the autocast dtype
    of the moment (float16 or bfloat16: torch's own rule reads it at each call, which
    ``torch.library.register_autocast``'s fixed dtype cannot), then the op runs with
    autocast off for it."""
    key = "Autocast" + torch._C._dispatch_key_for_device(device_type)
    off = torch._C.DispatchKeySet(getattr(torch._C.DispatchKey, key))

    def cast(t, dt):
        if t is None or not t.is_floating_point() or t.dtype in (dt, torch.float64):
            return t
        return t.to(dt)

    def kernel(_keyset, a, b, bias=None, out_dtype=None):
        dt = torch.get_autocast_dtype(device_type)
        with torch._C._ExcludeDispatchKeyGuard(off):
            return _matmul_op(cast(a, dt), cast(b, dt), cast(bias, dt), out_dtype)

    return key, kernel


_LIB = torch.library.Library("gemmlib", "FRAGMENT")
for _device in ("cuda", "cpu"):
    _key, _kernel = _autocast_rule(_device)
    _LIB.impl("matmul", _kernel, _key, with_keyset=True)


def matmul(A: torch.Tensor, B: torch.Tensor, *, bias: Optional[torch.Tensor] = None,
           out_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """``torch.matmul(A, B) (+ bias)`` on gemmlib's kernels, as a differentiable op that
    ``torch.compile(fullgraph=True)`` keeps in one graph."""
    return _matmul_op(A, B, bias, out_dtype)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
           *, out_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """``torch.nn.functional.linear`` on gemmlib's kernels: ``x @ weight.T + bias``, the
    weight as ``nn.Linear`` keeps it (read in place), differentiable."""
    return _matmul_op(x, weight.t(), bias, out_dtype)
