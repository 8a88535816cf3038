"""The fused LSTM and GRU cells that ``nn.LSTM``/``nn.GRU`` run on accelerator devices.

On any device but the CPU, ATen's recurrent layers compute each time step with
``_thnn_fused_lstm_cell`` / ``_thnn_fused_gru_cell`` (kernels that only CUDA
provides) and backpropagate through their ``_backward`` ops. Here they are
pointwise arithmetic, so each cell (and its gradient) compiles to one NEFF on the
``neuron`` device. The workspace is this module's own: the forward stores the
activated gates the backward reads, in the shapes ATen's meta functions give it
(``(B, 4H)`` for the LSTM, ``(B, 5H)`` for the GRU).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

aten = torch.ops.aten


def _with_bias(gates: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return gates if bias is None else gates + bias


def lstm_cell(input_gates: torch.Tensor, hidden_gates: torch.Tensor, cx: torch.Tensor,
              input_bias: torch.Tensor | None = None,
              hidden_bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``aten._thnn_fused_lstm_cell``: ``(hy, cy, workspace)``; gates in torch's order i, f, g, o."""
    gates = _with_bias(_with_bias(input_gates + hidden_gates, input_bias), hidden_bias)
    i, f, g, o = gates.chunk(4, 1)
    i, f, g, o = i.sigmoid(), f.sigmoid(), g.tanh(), o.sigmoid()
    cy = f * cx + i * g
    hy = o * cy.tanh()
    return hy, cy, torch.cat([i, f, g, o], 1)


def lstm_cell_backward(grad_hy: torch.Tensor | None, grad_cy: torch.Tensor | None, cx: torch.Tensor,
                       cy: torch.Tensor, workspace: torch.Tensor,
                       has_bias: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``aten._thnn_fused_lstm_cell_backward_impl``: ``(grad_gates, grad_cx, grad_bias)``."""
    i, f, g, o = workspace.chunk(4, 1)
    tanh_cy = cy.tanh()
    grad_c = torch.zeros_like(cy) if grad_cy is None else grad_cy
    if grad_hy is not None:
        grad_c = grad_c + grad_hy * o * (1 - tanh_cy * tanh_cy)
        grad_o = grad_hy * tanh_cy * o * (1 - o)
    else:
        grad_o = torch.zeros_like(o)
    grad_gates = torch.cat([grad_c * g * i * (1 - i), grad_c * cx * f * (1 - f),
                            grad_c * i * (1 - g * g), grad_o], 1)
    grad_bias = grad_gates.sum(0) if has_bias else grad_gates.new_zeros(grad_gates.shape[1])
    return grad_gates, grad_c * f, grad_bias


def gru_cell(input_gates: torch.Tensor, hidden_gates: torch.Tensor, hx: torch.Tensor,
             input_bias: torch.Tensor | None = None,
             hidden_bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``aten._thnn_fused_gru_cell``: ``(hy, workspace)``; gates in torch's order r, z, n."""
    i_r, i_z, i_n = _with_bias(input_gates, input_bias).chunk(3, 1)
    h_r, h_z, h_n = _with_bias(hidden_gates, hidden_bias).chunk(3, 1)
    r = (i_r + h_r).sigmoid()
    z = (i_z + h_z).sigmoid()
    n = (i_n + r * h_n).tanh()
    hy = n + z * (hx - n)
    return hy, torch.cat([r, z, n, h_n, hx], 1)


def gru_cell_backward(grad_hy: torch.Tensor, workspace: torch.Tensor,
                      has_bias: bool) -> tuple[torch.Tensor, ...]:
    """``aten._thnn_fused_gru_cell_backward``: gradients of the input gates, hidden gates,
    ``hx``, input bias and hidden bias."""
    r, z, n, h_n, hx = workspace.chunk(5, 1)
    grad_z = grad_hy * (hx - n) * z * (1 - z)
    grad_n = grad_hy * (1 - z) * (1 - n * n)
    grad_r = grad_n * h_n * r * (1 - r)
    grad_input = torch.cat([grad_r, grad_z, grad_n], 1)
    grad_hidden = torch.cat([grad_r, grad_z, grad_n * r], 1)
    if has_bias:
        return grad_input, grad_hidden, grad_hy * z, grad_input.sum(0), grad_hidden.sum(0)
    zeros = grad_input.new_zeros(grad_input.shape[1])
    return grad_input, grad_hidden, grad_hy * z, zeros, zeros


#: This module's decompositions, merged into the compile path's table.
DECOMPOSITIONS: dict[torch._ops.OpOverload, Callable] = {
    aten._thnn_fused_lstm_cell.default: lstm_cell,
    aten._thnn_fused_lstm_cell_backward_impl.default: lstm_cell_backward,
    aten._thnn_fused_gru_cell.default: gru_cell,
    aten._thnn_fused_gru_cell_backward.default: gru_cell_backward,
}
