"""A model's linear layers on gemmlib's kernels: :class:`Linear`, :func:`patch`, :func:`unpatch`.

    import torch, gemmlib
    layer = gemmlib.nn.Linear(4096, 14336, bias=False, device="cuda", dtype=torch.bfloat16)
    y = layer(x)                                  # F.linear through torch.ops.gemmlib.matmul

    model = gemmlib.patch(model)                  # every nn.Linear now runs on gemmlib
    gemmlib.nn.patched(model)                     # the names of the layers it swapped
    model = gemmlib.unpatch(model)                # plain nn.Linear again, same Parameters

:class:`Linear` is ``torch.nn.Linear`` with another forward: the same constructor, the same
Parameters (``weight`` (out_features, in_features), ``bias``), the same state dict; its
forward is :func:`gemmlib.torch_op.linear` (the weight read where it lies, differentiable,
one op under ``torch.compile``), or under ``no_grad`` / ``inference_mode`` outside
``torch.compile`` :func:`gemmlib.linear` itself (the same kernels, without the operator's
dispatch: a decode step's host time is mostly calls).  It subclasses ``nn.Linear``, so code that asks
``isinstance(m, nn.Linear)`` (weight initialisation, parameter grouping) treats it as one.

:func:`patch` swaps layers in place, as torchao's ``quantize_`` does: each swapped layer is
a new module that holds the *same* Parameter objects, so an optimizer built before the swap
keeps its state, the state dict is unchanged and tied weights stay tied.  Only modules whose
type is exactly ``nn.Linear`` are swapped: a subclass has a forward of its own that gemmlib
cannot stand in for, and so has a layer whose ``forward`` was replaced on the instance (a
wrapper some other library installed).
"""

from __future__ import annotations

import fnmatch
from typing import Callable, Iterable, Optional, Union

import torch

from gemmlib import api, torch_op

Selector = Union[None, str, Iterable[str], Callable[[str, torch.nn.Module], bool]]

#: the model attribute where :func:`patch` keeps the names of the layers it swapped
_RECORD = "_gemmlib_patched"


class Linear(torch.nn.Linear):
    """``torch.nn.Linear`` whose product runs on gemmlib's kernels.

    >>> layer = gemmlib.nn.Linear(64, 32, dtype=torch.float16, device="cuda")
    >>> y = layer(torch.randn(8, 64, dtype=torch.float16, device="cuda"))
    >>> fast = gemmlib.nn.Linear.from_linear(torch_layer)   # shares torch_layer's Parameters

    Under ``torch.autocast`` the input, weight and bias are cast to the autocast dtype first,
    as ``F.linear`` is.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w, b = self.weight, self.bias
        device = x.device.type
        if torch.is_autocast_enabled(device):
            dt = torch.get_autocast_dtype(device)
            x, w = x.to(dt), w.to(dt)
            b = None if b is None else b.to(dt)
        if not torch.is_grad_enabled() and not torch.compiler.is_compiling():
            # inference: the call itself (its lean path), no operator dispatch on the way;
            # autograd and torch.compile go through the registered op
            return api.linear(x, w, b)
        if x.dim() == 2:
            return torch_op.linear(x, w, b)
        # one product of (tokens, in) rows, however many leading dimensions x has
        y = torch_op.linear(x.reshape(-1, x.shape[-1]), w, b)
        return y.view(*x.shape[:-1], y.shape[-1])

    def _get_name(self):
        return "gemmlib.nn.Linear"

    @classmethod
    def from_linear(cls, layer: torch.nn.Linear) -> "Linear":
        """A :class:`Linear` holding ``layer``'s own Parameters (nothing is copied), its
        hooks and its training mode."""
        return _rebuild(cls, layer)


def _rebuild(cls, layer: torch.nn.Module) -> torch.nn.Module:
    """An instance of ``cls`` that is ``layer`` in all but its class: the same Parameters,
    buffers, attributes and hooks (the hook dicts themselves, so a handle taken on ``layer``
    still removes its hook)."""
    new = cls.__new__(cls)
    new.__dict__.update(layer.__dict__)
    # its own containers, holding the same objects: registering on one leaves the other alone
    new._parameters = dict(layer._parameters)
    new._buffers = dict(layer._buffers)
    new._modules = dict(layer._modules)
    new._non_persistent_buffers_set = set(layer._non_persistent_buffers_set)
    # module.compile() keeps a compiled call of the old instance: it would run the old forward
    new.__dict__.pop("_compiled_call_impl", None)
    return new


def _swappable(m: torch.nn.Module, cls) -> bool:
    return type(m) is cls and "forward" not in m.__dict__


def _matches(name: str, module: torch.nn.Module, selector: Selector) -> bool:
    if callable(selector):
        return bool(selector(name, module))
    patterns = [selector] if isinstance(selector, str) else list(selector)
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def _swap(model: torch.nn.Module, old_cls, make, select) -> tuple[torch.nn.Module, list[str]]:
    """Replace every module of type ``old_cls`` that ``select(names, module)`` accepts by
    ``make(module)``, at every place it is reachable (a module shared by two parents stays
    shared); the model (or its replacement, when the model itself is swapped) and the
    names swapped."""
    if _swappable(model, old_cls):
        return (make(model), [""]) if select([""], model) else (model, [])
    sites: dict[int, tuple[torch.nn.Module, list]] = {}
    for parent_name, parent in model.named_modules(remove_duplicate=False):
        for attr, child in parent._modules.items():
            if child is not None and _swappable(child, old_cls):
                full = f"{parent_name}.{attr}" if parent_name else attr
                sites.setdefault(id(child), (child, []))[1].append((parent, attr, full))
    done = []
    for child, places in sites.values():
        names = list(dict.fromkeys(full for _, _, full in places))
        if not select(names, child):
            continue
        new = make(child)
        for parent, attr, _ in places:
            setattr(parent, attr, new)
        done += names
    return model, done


def patch(model: torch.nn.Module, *, include: Selector = None,
          exclude: Selector = None) -> torch.nn.Module:
    """Swap ``model``'s ``nn.Linear`` layers for :class:`Linear` in place; returns ``model``.

    >>> model = gemmlib.patch(model)                          # every linear layer
    >>> model = gemmlib.patch(model, exclude="lm_head")       # all but the output head
    >>> model = gemmlib.patch(model, include="*.mlp.*")       # the MLPs only

    ``include`` / ``exclude``: a glob (``fnmatch``, on the layer's qualified name as
    ``named_modules`` gives it), a list of globs, or ``f(name, module) -> bool``; a layer
    is swapped when included (everything, by default) and not excluded.  A layer reachable
    under several names is swapped everywhere if any of its names is selected.

    The swapped layers keep their Parameters (the same objects: optimizer state, the state
    dict and tied weights are untouched).  Patching again is harmless: layers already on
    gemmlib are left as they are.  The names swapped are kept on the model
    (:func:`patched`).  When ``model`` is itself an ``nn.Linear`` the swap cannot happen in
    place: use the returned module.
    """
    def select(names, module):
        return (any(include is None or _matches(n, module, include) for n in names)
                and not any(exclude is not None and _matches(n, module, exclude)
                            for n in names))

    model, names = _swap(model, torch.nn.Linear, Linear.from_linear, select)
    record = list(getattr(model, _RECORD, []))
    setattr(model, _RECORD, record + [n for n in names if n not in record])
    return model


def unpatch(model: torch.nn.Module) -> torch.nn.Module:
    """Put plain ``nn.Linear`` layers back wherever ``model`` holds a :class:`Linear`
    (patched or built that way), with the same Parameters; returns ``model`` (or, when the
    model itself is a :class:`Linear`, its plain twin).

    >>> model = gemmlib.unpatch(model)
    >>> assert not gemmlib.nn.patched(model)
    """
    model, _ = _swap(model, Linear, lambda m: _rebuild(torch.nn.Linear, m),
                     lambda names, m: True)
    if _RECORD in model.__dict__:
        del model.__dict__[_RECORD]
    return model


def patched(model: torch.nn.Module) -> list[str]:
    """The qualified names of the layers :func:`patch` swapped in ``model`` (``""``: the
    model itself), in the order it swapped them; empty after :func:`unpatch`."""
    return list(getattr(model, _RECORD, []))
