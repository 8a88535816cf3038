"""Random ops as ``rand_like``/``randn_like`` draws, which the compile path makes per call on the host.

The ``random_ops_to_inputs`` pass turns ``rand``, ``randn``, ``randint`` and their
``*_like`` forms into NEFF inputs drawn from torch's generator at every call. The other
samplers are written here in those draws, so they too give fresh values per call
(torch-mlir lowered ``bernoulli`` with one baked-in state: stochastic depth and
``dropout2d`` kept one mask forever) or compile at all (``normal_``, ``torch.normal`` of tensors, ``uniform_``,
``exponential_``, ``multinomial``). The distributions are torch's; the streams are not
(an explicit ``generator=`` is not honored: draws use torch's default generator).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from torch_neuronx.compiler.decompositions.indexing import BOUNDS

aten = torch.ops.aten


def _floating(x: torch.Tensor) -> torch.dtype:
    return x.dtype if x.is_floating_point() else torch.get_default_dtype()


def bernoulli(x: torch.Tensor, p: float | torch.Tensor | None = None, *, generator=None) -> torch.Tensor:
    """``aten.bernoulli`` (probabilities ``x``, or ``p``): 1 where a uniform draw falls below them."""
    if isinstance(p, float | int) and not 0 <= p <= 1:  # (traced, it drew anyway: dropout_p=1.5 gave zeros)
        raise RuntimeError(f"bernoulli_ expects p to be in [0, 1], but got p={p}")
    probability = x if p is None else p
    return (torch.rand_like(x, dtype=_floating(x)) < probability).to(x.dtype)


def normal_functional(x: torch.Tensor, mean: float = 0.0, std: float = 1.0, *, generator=None) -> torch.Tensor:
    """``aten.normal_functional`` (``Tensor.normal_``)."""
    return torch.randn_like(x) * std + mean


def normal_tensors(mean: torch.Tensor | float, std: torch.Tensor | float = 1.0, *, generator=None) -> torch.Tensor:
    """``torch.normal`` with a tensor mean, std or both (``normal.Tensor_float``, ``float_Tensor``,
    ``Tensor_Tensor``; reparameterized noise in VAEs and diffusion models): a standard normal draw
    of the broadcast shape, scaled by ``std`` and shifted by ``mean``, as torch's kernel does."""
    tensors = [t for t in (mean, std) if isinstance(t, torch.Tensor)]
    shape = torch.broadcast_shapes(*(t.shape for t in tensors))
    like = tensors[0]
    draw = torch.randn(shape, dtype=like.dtype, device=like.device)
    return draw * std + mean


def uniform(x: torch.Tensor, low: float = 0.0, high: float = 1.0, *, generator=None) -> torch.Tensor:
    """``aten.uniform`` (``Tensor.uniform_``)."""
    return torch.rand_like(x) * (high - low) + low


def exponential(x: torch.Tensor, lambd: float = 1.0, *, generator=None) -> torch.Tensor:
    """``aten.exponential`` (``Tensor.exponential_``): -log(1 - u) / lambda."""
    return -torch.log1p(-torch.rand_like(x)) / lambd


def _checked_weights(weights: torch.Tensor) -> torch.Tensor:
    """``weights`` with torch's checks on the host after the call (a negative, infinite or NaN
    weight, or a row of zeros, gave a sample where torch raises): codes, 2 for a bad element and
    1 for a zero row (0 when valid), go through :data:`BOUNDS` for a size of 1 (the index-bounds
    pass clamps and checks them) and are added to the weights times 0, so the check stays."""
    if weights.numel() == 0:
        return weights
    bad = (~torch.isfinite(weights) | (weights < 0)).any()
    empty = (weights.sum(-1) <= 0).any()
    codes = torch.cat([bad.to(torch.int64).reshape(1) * 2, empty.to(torch.int64).reshape(1)])
    checked = BOUNDS(codes, 1, False, "multinomial", "multinomial")
    return weights + (checked.to(weights.dtype) * 0).sum()


def multinomial(x: torch.Tensor, num_samples: int, replacement: bool = False, *, generator=None) -> torch.Tensor:
    """``aten.multinomial``: with replacement by inverse CDF; without, by Gumbel top-k (exact
    sampling without replacement from the same weights)."""
    weights = _checked_weights(x.to(_floating(x)))
    if not replacement:
        gumbel = -torch.log(-torch.log(torch.rand_like(weights).clamp(min=torch.finfo(weights.dtype).tiny)))
        return (torch.log(weights) + gumbel).topk(num_samples, dim=-1).indices
    cdf = torch.cumsum(weights, -1)
    draws = torch.rand(*weights.shape[:-1], num_samples, dtype=weights.dtype, device=x.device) * cdf[..., -1:]
    picked = (cdf.unsqueeze(-2) <= draws.unsqueeze(-1)).sum(-1)
    return picked.clamp(max=weights.shape[-1] - 1).to(torch.int64)


def empty_permuted(size: list[int], physical_layout: list[int], *, dtype=None, layout=None, device=None,
                   pin_memory=None) -> torch.Tensor:
    """``aten.empty_permuted`` (``empty_like`` before ``normal_``): any values do; zeros lower."""
    return torch.zeros(size, dtype=dtype, device=device)


#: This module's decompositions, merged into the compile path's table.
DECOMPOSITIONS: dict[torch._ops.OpOverload, Callable] = {
    aten.bernoulli.default: bernoulli,
    aten.bernoulli.p: bernoulli,
    aten.bernoulli.Tensor: bernoulli,
    aten.normal_functional.default: normal_functional,
    aten.normal.Tensor_float: normal_tensors,
    aten.normal.float_Tensor: normal_tensors,
    aten.normal.Tensor_Tensor: normal_tensors,
    aten.uniform.default: uniform,
    aten.exponential.default: exponential,
    aten.multinomial.default: multinomial,
    aten.empty_permuted.default: empty_permuted,
}
