"""How ``bench/opinfo_sweep.py`` decides that a compiled op's outputs are eager's.

- Deterministic ops: ``assert_close`` against eager (:func:`compare`), after putting the
  outputs that are defined only up to a choice (the signs of eigenvectors) in one canonical
  form (:func:`canonical`).
- Ops returning uninitialized memory (``empty*``): shapes, dtypes and strides (:func:`compare_uninitialized`).
- Random ops (:func:`compare_random`): with the same seed first (the compile path draws random
  graph inputs from torch's generator, so factories give eager's very numbers); where the draws
  differ (an op whose kernel samples differently), the compiled op must be reproducible under
  one seed and draw from eager's distribution: over :data:`DRAWS` seeds, the element means and
  spreads as eager's (pooled over the elements, within five standard errors), integer-valued
  where eager's is, finite where eager's always is.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._pytree import tree_leaves, tree_map

#: Seeds drawn per sample to compare a random op's distribution with eager's.
DRAWS = 128
#: Outputs holding eigenvectors (op key -> output position): each vector is defined up to its sign.
EIGENVECTORS = {"linalg.eigh": 1}


def first_line(text: str) -> str:
    """The first non-empty line of ``text``, at most 300 characters."""
    return next((line.strip() for line in str(text).splitlines() if line.strip()), "")[:300]


def max_difference(expected: Any, got: Any) -> float:
    """The largest absolute difference over tensor outputs of equal shapes (NaN against a
    number counts as inf; shapes that differ as NaN)."""
    worst = 0.0
    for a, b in zip(tree_leaves(expected), tree_leaves(got)):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            continue
        if a.shape != b.shape:
            return math.nan
        wide = torch.complex128 if a.is_complex() or b.is_complex() else torch.float64
        a, b = a.detach().to(wide), b.detach().to(wide)
        diff = (a - b).abs()
        diff = torch.where(a.isnan() & b.isnan(), 0.0, torch.where(a.isnan() | b.isnan(), math.inf, diff))
        diff = torch.where(a == b, 0.0, diff)  # equal infinities
        if diff.numel():
            worst = max(worst, diff.max().item())
    return worst


def compare(expected: Any, got: Any, rtol: float, atol: float) -> str | None:
    """None when ``got`` matches ``expected`` within the tolerances, else why not."""
    try:
        torch.testing.assert_close(got, expected, rtol=rtol, atol=atol, equal_nan=True)
    except AssertionError as e:
        return f"max diff {max_difference(expected, got):.3g}: {first_line(e)}"
    except (TypeError, ValueError):
        return None if got == expected else f"values differ: {str(got)[:150]} vs {str(expected)[:150]}"
    return None


def _meta(out: Any, strides: bool = False) -> Any:
    """Shapes and dtypes of ``out``'s tensors, with the strides that address memory if ``strides``
    (those of dimensions longer than 1, none of an empty tensor: torch's contiguity ignores the rest)."""
    def one(t: Any) -> Any:
        if not isinstance(t, torch.Tensor):
            return type(t).__name__
        if not strides:
            return tuple(t.shape), t.dtype
        steps = () if t.numel() == 0 else tuple(s for s, n in zip(t.stride(), t.shape) if n > 1)
        return tuple(t.shape), t.dtype, steps
    return tree_map(one, out)


def compare_uninitialized(expected: Any, got: Any) -> str | None:
    """None when ``got`` has ``expected``'s shapes, dtypes and strides (values are uninitialized)."""
    e, g = _meta(expected, strides=True), _meta(got, strides=True)
    return None if e == g else f"metadata differs: {str(g)[:150]} vs {str(e)[:150]}"


def _sign_fixed(vectors: torch.Tensor) -> torch.Tensor:
    """Eigenvectors (the columns of ``vectors``) each scaled so its largest-magnitude entry is positive."""
    if vectors.numel() == 0 or vectors.is_complex():
        return vectors
    big = vectors.abs().argmax(dim=-2, keepdim=True)
    sign = vectors.gather(-2, big).sign()
    return vectors * torch.where(sign == 0, 1.0, sign)


# Ops returning (values, indices) along a dimension, whose indices torch leaves open on ties:
# (position of the dim argument after the input, its default, position of keepdim or None).
TIED_INDICES = {"topk": (1, -1, None), "kthvalue": (1, -1, 2)}


# Sorts whose order of equal elements torch leaves open unless ``stable=True``.
UNSTABLE_SORTS = ("sort", "argsort")


def _same_sort(key: str, sample: Any, expected: Any, got: Any) -> bool:
    """Whether ``got`` sorts the input as ``expected`` does, up to the order of equal elements
    (a stable sort must match exactly)."""
    x, args, kwargs = sample
    if kwargs.get("stable") or x.dim() == 0:
        return False
    dim = args[0] if args and isinstance(args[0], int) else kwargs.get("dim", -1)
    if key == "sort":
        if not torch.equal(got[0], expected[0]):
            return False
        return torch.equal(x.gather(dim, got[1]), got[0])
    return torch.equal(x.gather(dim, got), x.gather(dim, expected))


def tie_broken_otherwise(key: str, sample: Any, expected: Any, got: Any) -> bool:
    """Whether ``got`` differs from ``expected`` only in which of tied elements its indices name:
    the values are equal and ``got``'s indices select them from the input."""
    if key in UNSTABLE_SORTS:
        return _same_sort(key, sample, expected, got)
    spec = TIED_INDICES.get(key)
    if spec is None or not isinstance(got, tuple | list) or len(got) != 2:
        return False
    if not torch.equal(got[0], expected[0]):
        return False
    x, args, kwargs = sample
    if x.dim() == 0:
        return torch.equal(got[0], x)
    at, default, keep_at = spec
    dim = args[at] if len(args) > at else kwargs.get("dim", default)
    keepdim = args[keep_at] if keep_at is not None and len(args) > keep_at else kwargs.get("keepdim", False)
    indices = got[1] if keep_at is None or keepdim else got[1].unsqueeze(dim)
    values = got[0] if keep_at is None or keepdim else got[0].unsqueeze(dim)
    return torch.equal(x.gather(dim, indices), values)


def canonical(key: str, out: Any) -> Any:
    """``out`` of op ``key`` with its eigenvectors' signs fixed (other outputs unchanged)."""
    positions = EIGENVECTORS.get(key)
    if positions is None or not isinstance(out, tuple | list):
        return out
    out = list(out)
    out[positions] = _sign_fixed(out[positions])
    return tuple(out)


def _seeded(run: Callable[[], Any], seed: int) -> list[torch.Tensor]:
    torch.manual_seed(seed)
    return [t.detach().to(torch.float64) for t in tree_leaves(run()) if isinstance(t, torch.Tensor)]


def _draws_differ(e: torch.Tensor, c: torch.Tensor) -> str | None:
    """Why the draws ``c`` (seeds x elements) do not follow ``e``'s distribution, or None.

    Elements constant across seeds must agree; over the others, the standardized differences of
    the element means (z) must average near 0 with a mean square near 1, and the log ratio of
    the element spreads must average near 0 (bounds of five standard errors)."""
    n = len(e)
    me, mc, se, sc = e.mean(0), c.mean(0), e.std(0), c.std(0)
    scale = 1e-6 * (1 + me.abs())
    variance = (se**2 + sc**2) / n
    fixed = variance.sqrt() <= scale
    if ((me - mc).abs() > scale)[fixed].any():
        return "elements constant over the seeds differ"
    if fixed.all():
        return None
    z = ((mc - me) / variance.sqrt())[~fixed]
    count = z.numel()
    if z.mean().abs() > 5 / count**0.5 or (z**2).mean() > 1.05 + 5 * (3 / count) ** 0.5:
        return f"element means differ (mean z {z.mean().item():.3g}, mean z^2 {(z**2).mean().item():.3g})"
    both = ~fixed & (se > 0) & (sc > 0)
    if (se[~fixed] == 0).any() or (sc[~fixed] == 0).any():
        return "an element varies over the seeds in one and not in the other"
    log_ratio = (sc[both] / se[both]).log()
    if log_ratio.mean().abs() > 5 / ((n - 1) * log_ratio.numel()) ** 0.5 + 0.02:
        return f"element spreads differ (mean ratio {log_ratio.mean().exp().item():.3g})"
    return None


def _distribution_mismatch(eager: list[list[torch.Tensor]], compiled: list[list[torch.Tensor]]) -> str | None:
    """Why ``compiled``'s draws (one list of leaves per seed) do not follow ``eager``'s, or None."""
    for i, (e, c) in enumerate(zip(zip(*eager), zip(*compiled))):
        e, c = torch.stack(e).flatten(1), torch.stack(c).flatten(1)
        if (e.isfinite().all(0) & ~c.isfinite().all(0)).any():
            return f"output {i}: non-finite values where eager's are always finite"
        e, c = e.where(e.isfinite(), 0.0), c.where(c.isfinite(), 0.0)
        if (e == e.round()).all() and not (c == c.round()).all():
            return f"output {i}: non-integer values where eager's are integers"
        why = _draws_differ(e, c)
        if why:
            return f"output {i}: {why} over {len(eager)} seeds"
    return None


def compare_random(run_eager: Callable[[], Any], run_compiled: Callable[[], Any]) -> str | None:
    """None when the compiled random op gives eager's draws under one seed, or else is
    reproducible and draws from eager's distribution; else why not. Each callable runs the op
    once on fresh copies of the sample."""
    torch.manual_seed(0)
    expected = run_eager()
    torch.manual_seed(0)
    got = run_compiled()
    if _meta(expected) != _meta(got):
        return f"metadata differs: {str(_meta(got))[:150]} vs {str(_meta(expected))[:150]}"
    if compare(expected, got, 0.0, 0.0) is None:
        return None  # the same numbers
    if compare(_seeded(run_compiled, 1), _seeded(run_compiled, 1), 0.0, 0.0) is not None:
        return "not reproducible: two runs under one seed differ"
    seeds = range(100, 100 + DRAWS)
    return _distribution_mismatch([_seeded(run_eager, s) for s in seeds], [_seeded(run_compiled, s) for s in seeds])


def widened(tree: Any) -> Any:
    """``tree`` with its float32, float16 and bfloat16 tensors in float64 (an op's sample, for a
    more precise reference)."""
    narrow = (torch.float32, torch.float16, torch.bfloat16)
    return tree_map(lambda t: t.to(torch.float64) if isinstance(t, torch.Tensor) and t.dtype in narrow
                    else t, tree)


def _worst_error(out: Any, reference: Any) -> float:
    """The largest absolute difference of ``out``'s floating tensors from ``reference``'s."""
    pairs = [(a, b) for a, b in zip(tree_leaves(out), tree_leaves(reference))
             if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.is_floating_point()]
    return max((max_difference(b, a) for a, b in pairs), default=math.inf)


def as_accurate_as_eager(expected: Any, got: Any, reference: Any) -> bool:
    """Whether ``got`` lies at least as near the float64 ``reference`` as eager's (float32,
    float16 or bfloat16) ``expected`` does (within a factor of two), where eager itself misses it: an op whose float32
    result eager computes no better than we do (``matrix_exp`` of large norms) is not wrong."""
    try:
        eager_error, our_error = _worst_error(expected, reference), _worst_error(got, reference)
    except (RuntimeError, TypeError):
        return False
    return math.isfinite(our_error) and our_error <= 2 * eager_error
