"""Whole recurrent layers as one op each way: ``neuron::recurrent_layers`` and its backward.

``nn.LSTM``/``nn.GRU``/``nn.RNN`` on an accelerator run ATen's composite: per time step and
layer a matrix product and a fused cell, and as many backward ops. On the eager ``neuron``
device each is a dispatch, so a 2-layer LSTM over 20 steps was some 500 kernel launches a
training step, 15-30x the CPU's time. These two ops take a whole stack of layers over the
whole sequence: the forward is torch's own decomposition of ``aten.lstm``/``gru``/``rnn_*``
(no dropout: the eager device routes only calls without it here), the backward its
vector-Jacobian product (the forward recomputed inside the same kernel), each traced into
one kernel per signature. Their CPU implementations are the same functions, so a fallback
and the first-call check against the CPU compute what the kernel computes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch._decomp import decompositions as torch_decompositions

__all__ = ["MODES", "recurrent_layers", "recurrent_layers_backward"]

#: The layer kinds: torch's decomposition of each (``aten.<mode>.input``).
MODES: dict[str, Callable] = {
    "lstm": torch_decompositions.lstm_impl,
    "gru": torch_decompositions.gru_impl,
    "rnn_tanh": torch_decompositions.rnn_tanh_input,
    "rnn_relu": torch_decompositions.rnn_relu_input,
}


def _run(mode: str, input: torch.Tensor, hx: Sequence[torch.Tensor], params: Sequence[torch.Tensor],  # noqa: A002
         has_biases: bool, num_layers: int, bidirectional: bool, batch_first: bool) -> list[torch.Tensor]:
    hidden = list(hx) if mode == "lstm" else hx[0]
    enabled = torch._C._get_mkldnn_enabled()
    torch._C._set_mkldnn_enabled(False)  # not torch's oneDNN layer op: the generic steps
    try:
        result = MODES[mode](input, hidden, list(params), has_biases, num_layers, 0.0, False, bidirectional,
                             batch_first)
    finally:
        torch._C._set_mkldnn_enabled(enabled)
    return list(result)


def _fresh(results: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """``results``, each copied where it shares memory with an input (a custom op's results must not)."""
    storages = {t.untyped_storage().data_ptr() for t in inputs if t.device.type != "meta" and t.numel()}
    return [r.clone() if r.numel() and r.device.type != "meta" and r.untyped_storage().data_ptr() in storages
            else r for r in results]


@torch.library.custom_op("neuron::recurrent_layers", mutates_args=())
def recurrent_layers(mode: str, input: torch.Tensor, hx: list[torch.Tensor], params: list[torch.Tensor],  # noqa: A002
                     has_biases: bool, num_layers: int, bidirectional: bool,
                     batch_first: bool) -> list[torch.Tensor]:
    """``[output, h_n]`` (``[output, h_n, c_n]`` for an LSTM) of ``aten.<mode>.input`` without dropout."""
    return _fresh(_run(mode, input, hx, params, has_biases, num_layers, bidirectional, batch_first),
                  [input, *hx, *params])


@recurrent_layers.register_fake
def _(mode, input, hx, params, has_biases, num_layers, bidirectional, batch_first):  # noqa: A002
    return _run(mode, input, hx, params, has_biases, num_layers, bidirectional, batch_first)


_AUTOGRAD_KEYS = (torch._C.DispatchKey.AutogradFunctionality, torch._C.DispatchKey.AutogradOther,
                  torch._C.DispatchKey.AutogradNestedTensor, torch._C.DispatchKey.ADInplaceOrView)


def autograd_dispatch() -> torch._C._ForceDispatchKeyGuard:
    """Autograd's dispatch keys back on: a custom op's implementation (and a decomposition traced in
    its place, or one run from a ``__torch_dispatch__``) runs below autograd, where
    ``torch.autograd.grad`` finds no graph."""
    exclude = torch._C._dispatch_tls_local_exclude_set()
    for key in _AUTOGRAD_KEYS:
        exclude = exclude.remove(key)
    return torch._C._ForceDispatchKeyGuard(torch._C._dispatch_tls_local_include_set(), exclude)


def pullback(forward: Callable, inputs: Sequence[torch.Tensor],
             grads: torch.Tensor | Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The gradients of ``forward(*inputs)`` (a tensor or a sequence of them) for ``grads`` (zeros
    for an input it does not use), computed with autograd while a kernel is traced (below
    autograd's dispatch keys)."""
    with autograd_dispatch(), torch.enable_grad():
        leaves = tuple(t.detach().requires_grad_() for t in inputs)
        outputs = forward(*leaves)
        found = torch.autograd.grad(outputs, leaves, grads if isinstance(grads, torch.Tensor) else list(grads),
                                    allow_unused=True)
    return [torch.zeros_like(t) if g is None else g for g, t in zip(found, inputs, strict=True)]


def _gradients(mode: str, grads: Sequence[torch.Tensor], input: torch.Tensor,  # noqa: A002
               hx: Sequence[torch.Tensor], params: Sequence[torch.Tensor], has_biases: bool,
               num_layers: int, bidirectional: bool, batch_first: bool) -> list[torch.Tensor]:
    count = len(hx)

    def forward(x: torch.Tensor, *rest: torch.Tensor) -> list[torch.Tensor]:
        return _run(mode, x, rest[:count], rest[count:], has_biases, num_layers, bidirectional, batch_first)

    return pullback(forward, (input, *hx, *params), grads)


@torch.library.custom_op("neuron::recurrent_layers_backward", mutates_args=())
def recurrent_layers_backward(mode: str, grads: list[torch.Tensor], input: torch.Tensor,  # noqa: A002
                              hx: list[torch.Tensor], params: list[torch.Tensor], has_biases: bool,
                              num_layers: int, bidirectional: bool, batch_first: bool) -> list[torch.Tensor]:
    """The gradients of :func:`recurrent_layers`'s inputs for its results' ``grads``: the input's,
    then each hidden state's, then each parameter's."""
    return _fresh(_gradients(mode, grads, input, hx, params, has_biases, num_layers, bidirectional, batch_first),
                  [*grads, input, *hx, *params])


@recurrent_layers_backward.register_fake
def _(mode, grads, input, hx, params, has_biases, num_layers, bidirectional, batch_first):  # noqa: A002
    return [torch.empty_like(input), *(torch.empty_like(h) for h in hx), *(torch.empty_like(p) for p in params)]


def _setup_context(ctx, inputs, output) -> None:  # noqa: ANN001
    mode, input, hx, params, has_biases, num_layers, bidirectional, batch_first = inputs  # noqa: A001
    ctx.save_for_backward(input, *hx, *params)
    ctx.layout = (mode, len(hx), has_biases, num_layers, bidirectional, batch_first)
    ctx.shapes = [(o.shape, o.dtype) for o in output]


def _backward(ctx, grads):  # noqa: ANN001, ANN202
    mode, count, has_biases, num_layers, bidirectional, batch_first = ctx.layout
    saved = ctx.saved_tensors
    input, hx, params = saved[0], list(saved[1:1 + count]), list(saved[1 + count:])  # noqa: A001
    grads = [g if g is not None else input.new_zeros(shape, dtype=dtype)
             for g, (shape, dtype) in zip(grads, ctx.shapes, strict=True)]
    result = torch.ops.neuron.recurrent_layers_backward(mode, grads, input, hx, params, has_biases, num_layers,
                                                        bidirectional, batch_first)
    return (None, result[0], list(result[1:1 + count]), list(result[1 + count:]), None, None, None, None)


recurrent_layers.register_autograd(_backward, setup_context=_setup_context)

#: This module's decompositions, merged into the compile path's table: the traced kernels.
DECOMPOSITIONS: dict[torch._ops.OpOverload, Callable] = {
    torch.ops.neuron.recurrent_layers.default: _run,
    torch.ops.neuron.recurrent_layers_backward.default: _gradients,
}
