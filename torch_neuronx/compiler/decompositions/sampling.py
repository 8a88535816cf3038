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

import functools
from collections.abc import Callable

import torch

from torch_neuronx.compiler.decompositions.indexing import checked

aten = torch.ops.aten


def _floating(x: torch.Tensor) -> torch.dtype:
    return x.dtype if x.is_floating_point() else torch.get_default_dtype()


def draw_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype uniforms for ``x`` are drawn in: float32 for float16/bfloat16 ones, whose 8 or 11
    bits of uniform made ``dropout(p=0.001)`` of bfloat16 drop nothing and ``exponential_`` never
    exceed 5.5 (torch's kernels draw these in float32 too)."""
    return _wide(_floating(x))


def _wide(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def bernoulli(x: torch.Tensor, p: float | torch.Tensor | None = None, *, generator=None) -> torch.Tensor:
    """``aten.bernoulli`` (probabilities ``x``, or ``p``): 1 where a uniform draw falls below them."""
    if isinstance(p, float | int) and not 0 <= p <= 1:  # (traced, it drew anyway: dropout_p=1.5 gave zeros)
        raise RuntimeError(f"bernoulli_ expects p to be in [0, 1], but got p={p}")
    probability = x if p is None else p
    return (torch.rand_like(x, dtype=draw_dtype(x)) < probability).to(x.dtype)


def normal_functional(x: torch.Tensor, mean: float = 0.0, std: float = 1.0, *, generator=None) -> torch.Tensor:
    """``aten.normal_functional`` (``Tensor.normal_``)."""
    if not std >= 0:
        raise RuntimeError(f"normal expects std >= 0.0, but found std {std}")
    return (torch.randn_like(x, dtype=draw_dtype(x)) * std + mean).to(x.dtype)


def normal_tensors(mean: torch.Tensor | float, std: torch.Tensor | float = 1.0, *, generator=None) -> torch.Tensor:
    """``torch.normal`` with a tensor mean, std or both (``normal.Tensor_float``, ``float_Tensor``,
    ``Tensor_Tensor``; reparameterized noise in VAEs and diffusion models): a standard normal draw
    of the broadcast shape, scaled by ``std`` and shifted by ``mean``, as torch's kernel does."""
    tensors = [t for t in (mean, std) if isinstance(t, torch.Tensor)]
    shape = torch.broadcast_shapes(*(t.shape for t in tensors))
    like, dtype = tensors[0], functools.reduce(torch.promote_types, [t.dtype for t in tensors])
    draw = torch.randn(shape, dtype=_wide(dtype), device=like.device)
    return (draw * std + mean).to(dtype)


def uniform(x: torch.Tensor, low: float = 0.0, high: float = 1.0, *, generator=None) -> torch.Tensor:
    """``aten.uniform`` (``Tensor.uniform_``), with torch's checks of the bounds (traced, a reversed
    or NaN range drew values)."""
    dtype = _floating(x)
    for name, bound in (("from", low), ("to", high)):
        if not abs(bound) <= torch.finfo(dtype).max:
            kind = {torch.float64: "double", torch.float32: "float"}.get(dtype, str(dtype).removeprefix("torch."))
            raise RuntimeError(f"{name} is out of bounds for {kind}")
    if low > high:
        raise RuntimeError(f"uniform_ expects to return a [from, to) range, but found from={low} > to={high}")
    return (torch.rand_like(x, dtype=draw_dtype(x)) * (high - low) + low).to(x.dtype)


def exponential(x: torch.Tensor, lambd: float = 1.0, *, generator=None) -> torch.Tensor:
    """``aten.exponential`` (``Tensor.exponential_``): -log(1 - u) / lambda."""
    if not lambd > 0:
        raise RuntimeError(f"exponential_ expects lambda > 0.0, but found lambda={lambd}")
    return (-torch.log1p(-torch.rand_like(x, dtype=draw_dtype(x))) / lambd).to(x.dtype)


def _checked_weights(weights: torch.Tensor) -> torch.Tensor:
    """``weights`` with torch's checks on the host after the call (a negative, infinite or NaN
    weight, or a row of zeros, gave a sample where torch raises): codes, 2 for a bad element and
    1 for a zero row (0 when valid), checked as the index-bounds pass checks codes
    (:func:`~torch_neuronx.compiler.decompositions.indexing.checked`)."""
    if weights.numel() == 0:
        return weights
    bad = (~torch.isfinite(weights) | (weights < 0)).any()
    empty = (weights.sum(-1) <= 0).any()
    codes = torch.cat([bad.to(torch.int64).reshape(1) * 2, empty.to(torch.int64).reshape(1)])
    return checked(weights, codes, "multinomial", "multinomial")


def multinomial(x: torch.Tensor, num_samples: int, replacement: bool = False, *, generator=None) -> torch.Tensor:
    """``aten.multinomial``: with replacement by inverse CDF; without, by Gumbel top-k (exact
    sampling without replacement from the same weights)."""
    weights = _checked_weights(x.to(draw_dtype(x)))
    if not replacement:
        gumbel = -torch.log(-torch.log(torch.rand_like(weights).clamp(min=torch.finfo(weights.dtype).tiny)))
        keys = torch.log(weights) + gumbel
        if num_samples == 1:  # (a language model's next token: the largest key, without sorting the vocabulary)
            return keys.argmax(-1, keepdim=True)
        return keys.topk(num_samples, dim=-1).indices
    cdf = torch.cumsum(weights, -1)
    draws = torch.rand(*weights.shape[:-1], num_samples, dtype=weights.dtype, device=x.device) * cdf[..., -1:]
    # (the number of cumulative weights at or below each draw, by binary search: comparing every draw
    # with every class took 3 s a call for 256 draws of 50257 classes)
    picked = torch.searchsorted(cdf, draws.contiguous(), right=True)
    return picked.clamp(max=weights.shape[-1] - 1).to(torch.int64)


def rrelu_with_noise_functional(x: torch.Tensor, noise: torch.Tensor, lower: float = 0.125, upper: float = 1 / 3,
                                training: bool = False, generator=None) -> tuple[torch.Tensor, torch.Tensor]:
    """``F.rrelu`` (``aten.rrelu_with_noise``, functionalized): in training each element at or below
    zero times its own uniform slope in [lower, upper], the slopes (1 elsewhere) as the noise the
    backward reads, as torch's kernel does; torch-mlir's lowering drew the same slopes every call."""
    if not training:
        return aten.leaky_relu.default(x, (lower + upper) / 2), noise.clone()
    slopes = torch.rand_like(x, dtype=draw_dtype(x)) * (upper - lower) + lower
    negative = x <= 0
    out = torch.where(negative, (x.to(slopes.dtype) * slopes).to(x.dtype), x)
    return out, torch.where(negative, slopes, torch.ones_like(slopes)).to(noise.dtype)


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
    aten.rrelu_with_noise_functional.default: rrelu_with_noise_functional,
}
