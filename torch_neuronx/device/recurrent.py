"""``nn.LSTM``/``nn.GRU``/``nn.RNN`` on the eager device: a whole layer stack per kernel.

ATen's recurrent layers are composites: per time step and layer a matrix product and a fused
cell (:mod:`torch_neuronx.compiler.decompositions.rnn`), each an eager dispatch, and as many
in the backward. Registered under ``AutogradPrivateUse1``, the ``.input`` overloads of
``aten.lstm``/``gru``/``rnn_tanh``/``rnn_relu`` on neuron tensors instead call
``neuron::recurrent_layers`` (one kernel for the forward of every layer and step; its
backward one more: :mod:`torch_neuronx.compiler.decompositions.recurrent_layers`).

A call keeps the composite when the whole-stack op cannot compute it the same way: dropout
between layers in training (a random draw per step), autocast on the device (the composite
casts each cell), a host tensor among its arguments, or a signature seen for the first time
(:data:`_REPEATS`): a whole-stack kernel is one trace per sequence length, worth it for a
length that comes back, as a training loop's does, and not for a length seen once; and stacks
longer than :data:`STEP_LIMIT` steps, whose unrolled kernel would compile for minutes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from torch_neuronx.compiler.decompositions import recurrent_layers  # noqa: F401 - registers the ops
from torch_neuronx.runtime.tensor import NeuronTensor

__all__ = ["register"]

#: Calls of one signature that take the composite before the whole-stack kernel serves it.
_REPEATS = 1
#: The most time steps (sequence length x layers x directions) a whole-stack kernel unrolls: its
#: compile time grows with them (one LSTM layer: 17 s at 50 steps, 39 s at 100, forward and
#: backward, 2-core host); longer stacks keep the composite.
STEP_LIMIT = 256
_LIMIT = 1 << 12
_seen: dict[tuple, int] = {}
aten = torch.ops.aten


def _signature(mode: str, input: torch.Tensor, hx: Sequence[torch.Tensor],  # noqa: A002
               params: Sequence[torch.Tensor], flags: tuple) -> tuple:
    return (mode, tuple(input.shape), input.dtype, tuple(tuple(h.shape) for h in hx),
            tuple(tuple(p.shape) for p in params), flags, torch.is_grad_enabled())


def _eligible(input: torch.Tensor, hx: Sequence[torch.Tensor], params: Sequence[torch.Tensor],  # noqa: A002
              dropout: float, train: bool, num_layers: int, bidirectional: bool, batch_first: bool) -> bool:
    if dropout > 0 and train and num_layers > 1:
        return False
    length = input.shape[1 if batch_first and input.dim() == 3 else 0]
    if length * num_layers * (2 if bidirectional else 1) > STEP_LIMIT:
        return False
    if torch.is_autocast_enabled("neuron"):
        return False
    tensors = [input, *hx, *params]
    if not all(isinstance(t, NeuronTensor) for t in tensors):
        return False
    return len({t.device for t in tensors}) == 1 and input.dtype.is_floating_point


def _repeated(key: tuple) -> bool:
    """Whether this signature was seen :data:`_REPEATS` times before (counting this call)."""
    count = _seen.get(key, 0)
    if count >= _REPEATS:
        return True
    if len(_seen) >= _LIMIT:
        _seen.clear()
    _seen[key] = count + 1
    return False


def _layers(mode: str, composite: Any) -> Callable[..., Any]:
    def run(input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first):  # noqa: A002, ANN001, ANN202
        hidden = list(hx) if mode == "lstm" else [hx]
        flags = (has_biases, num_layers, bidirectional, batch_first)
        if not (_eligible(input, hidden, params, dropout, train, num_layers, bidirectional, batch_first)
                and _repeated(_signature(mode, input, hidden, params, flags))):
            return composite.decompose(input, hx, params, has_biases, num_layers, dropout, train,
                                       bidirectional, batch_first)
        results = torch.ops.neuron.recurrent_layers(mode, input, hidden, list(params), *flags)
        return tuple(results)

    return torch._disable_dynamo(run)


def register(library: torch.library.Library) -> None:
    """Route the recurrent layers' ``.input`` overloads on neuron tensors through the whole-stack op."""
    for mode in ("lstm", "gru", "rnn_tanh", "rnn_relu"):
        composite = getattr(aten, mode).input
        library.impl(f"{mode}.input", _layers(mode, composite), "AutogradPrivateUse1")
