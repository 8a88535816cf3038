"""The chunked ``linear_cross_entropy`` ops as the unchunked math: a matmul and a cross entropy.

``F.linear_cross_entropy`` with ``options`` calls two custom ops (``torch.nn.modules.
linear_cross_entropy``) that loop over batch chunks with ``out=`` matmuls and in-place updates;
torch-mlir lowers neither op. Here each is one ``(N, C)`` logits matmul and the loss as torch's
accumulator defines it: per row ``w (logsumexp(logits) - logits[target])``, ``w`` the class
weight of the target (1 without ``weight``), 0 where the target is ``ignore_index``; summed,
divided by the sum of ``w`` for ``mean`` (NaN when that is 0, as for no rows), per row for
``none``. The scalar op also returns the gradients it precomputes for its backward (when asked
for, else empty tensors of torch's placeholder shapes): with ``G = w / d (softmax - onehot)``,
``G @ linear_weight``, ``G.T @ input`` and ``G.sum(0)``. Computed in ``acc_dtype`` (torch's
accumulation dtype: float32 for half inputs), returned in the input's dtype.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

try:  # registers the torch_nn custom ops (torch imports the module lazily)
    import torch.nn.modules.linear_cross_entropy  # noqa: F401
except ImportError:  # a torch without linear_cross_entropy
    pass


def _row_losses(input: torch.Tensor, linear_weight: torch.Tensor, target: torch.Tensor,  # noqa: A002
                linear_bias: torch.Tensor | None, weight: torch.Tensor | None, ignore_index: int,
                acc_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(logits, target, w, loss per row): ignored targets made 0, ``w`` the weight of each row's
    target (0 if ignored), the loss ``w (logsumexp - target logit)``."""
    logits = input.to(acc_dtype) @ linear_weight.to(acc_dtype).T
    if linear_bias is not None:
        logits = logits + linear_bias.to(acc_dtype)
    ignored = target == ignore_index
    target = torch.where(ignored, 0, target)
    w = torch.ones_like(logits[:, 0]) if weight is None else weight.to(acc_dtype)[target]
    w = torch.where(ignored, 0.0, w)
    picked = logits.gather(1, target.unsqueeze(1)).squeeze(1)
    return logits, target, w, w * (torch.logsumexp(logits, 1) - picked)


def _gradients(input: torch.Tensor, linear_weight: torch.Tensor, target: torch.Tensor,  # noqa: A002
               logits: torch.Tensor, scale: torch.Tensor,
               wanted: tuple[bool, bool, bool]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The loss's gradients for input, linear_weight and linear_bias where ``wanted`` (else
    torch's empty placeholders), from ``G = scale (softmax - onehot)`` per row."""
    dtype = input.dtype
    classes = torch.arange(logits.shape[1], device=target.device)
    onehot = (classes == target.unsqueeze(1)).to(logits.dtype)
    g = scale.unsqueeze(1) * (torch.softmax(logits, 1) - onehot)
    grad_input = g @ linear_weight.to(g.dtype) if wanted[0] else input.new_empty((0, 0))
    grad_weight = g.T @ input.to(g.dtype) if wanted[1] else input.new_empty((0, 0))
    grad_bias = g.sum(0) if wanted[2] else input.new_empty((0,))
    return grad_input.to(dtype), grad_weight.to(dtype), grad_bias.to(dtype)


def linear_cross_entropy_chunked(input: torch.Tensor, linear_weight: torch.Tensor,  # noqa: A002
                                 target: torch.Tensor, linear_bias: torch.Tensor | None,
                                 weight: torch.Tensor | None, reduction: str, ignore_index: int,
                                 label_smoothing: float, batch_chunk_size: int, acc_policy: str,
                                 acc_dtype: torch.dtype, allow_retain_graph: bool, compute_input_grad: bool,
                                 compute_linear_weight_grad: bool, compute_linear_bias_grad: bool) -> tuple:
    """``torch_nn._linear_cross_entropy_batch_chunked``: (mean or sum loss, its gradients)."""
    if reduction not in ("mean", "sum") or label_smoothing != 0.0:
        return NotImplemented  # torch's op raises
    logits, target, w, losses = _row_losses(input, linear_weight, target, linear_bias, weight, ignore_index,
                                            acc_dtype)
    total = losses.sum()
    scale = w
    if reduction == "mean":
        total, scale = total / w.sum(), w / w.sum()
    wanted = (compute_input_grad, compute_linear_weight_grad, compute_linear_bias_grad)
    return (total.to(input.dtype), *_gradients(input, linear_weight, target, logits, scale, wanted))


def linear_cross_entropy_chunked_none(input: torch.Tensor, linear_weight: torch.Tensor,  # noqa: A002
                                      target: torch.Tensor, linear_bias: torch.Tensor | None,
                                      weight: torch.Tensor | None, ignore_index: int, batch_chunk_size: int,
                                      acc_policy: str, acc_dtype: torch.dtype) -> torch.Tensor:
    """``torch_nn._linear_cross_entropy_batch_chunked_no_reduction``: the loss per row."""
    losses = _row_losses(input, linear_weight, target, linear_bias, weight, ignore_index, acc_dtype)[3]
    return losses.to(input.dtype)


def _decompositions() -> dict[torch._ops.OpOverload, Callable]:
    """The ops' overloads and their decompositions, where this torch has the ops."""
    ops = getattr(torch.ops, "torch_nn", None)
    pairs = (("_linear_cross_entropy_batch_chunked", linear_cross_entropy_chunked),
             ("_linear_cross_entropy_batch_chunked_no_reduction", linear_cross_entropy_chunked_none))
    return {getattr(ops, name).default: fn for name, fn in pairs if ops is not None and hasattr(ops, name)}


#: This module's decompositions, merged into the compile path's table.
DECOMPOSITIONS: dict[torch._ops.OpOverload, Callable] = _decompositions()
