"""Half-precision accumulation: float16 and bfloat16 ops that torch accumulates in float32.

torch's CPU kernels sum, average, normalize and convolve float16 and bfloat16 tensors in float32
(their ``acc_type``) and round once, to the result. Lowered as they are, these ops accumulate in
the narrow type itself, every partial sum rounded: the sum of 131072 bfloat16 normals was off
by 46 (torch: 0.5), a bfloat16 ``cumsum`` of 2048 values by 8, a convolution over 512 input
channels by 13% of its largest output, layer norm by 2.6x torch's error, a bfloat16 scatter-add
by 37x. Each op of :data:`OPS`,
given inputs whose floating tensors are all of one narrow dtype, runs here on float32 copies and
its floating results are rounded back to that dtype: torch's values, to its rounding. With mixed
dtypes (a float32 weight), an explicit ``dtype=``, or wider inputs, the op is left as it is.
"""

from __future__ import annotations

import functools
import math
import struct
from collections.abc import Callable
from typing import Any

import torch
import torch.utils._pytree as pytree

aten = torch.ops.aten

NARROW = (torch.float16, torch.bfloat16)  # dtypes computed in float32 and rounded once


def _overloads(*names: str) -> tuple[Any, ...]:
    found = []
    for name in names:
        packet, _, overload = name.partition(".")
        op = getattr(getattr(aten, packet, None), overload or "default", None)
        if op is not None:
            found.append(op)
    return tuple(found)


#: The ops torch computes in float32 for narrow inputs (reductions, scans, moments,
#: normalizations, convolutions, bags, scatters, composite pointwise ops), forward and backward.
OPS = _overloads(
    "sum.default", "sum.dim_IntList", "nansum.default", "mean.default", "mean.dim",
    "prod.default", "prod.dim_int", "var.correction", "var_mean.correction", "std.correction",
    "std_mean.correction", "linalg_vector_norm.default",
    "native_layer_norm.default", "native_layer_norm_backward.default",
    "native_group_norm.default", "native_group_norm_backward.default",
    "native_batch_norm.default", "native_batch_norm_backward.default",
    "_native_batch_norm_legit.default", "_native_batch_norm_legit.no_stats",
    "_native_batch_norm_legit_functional.default", "_native_batch_norm_legit_no_training.default",
    "convolution.default", "convolution_backward.default", "addbmm.default",
    "_embedding_bag.default", "_embedding_bag_forward_only.default",
    "scatter_add.default", "scatter_reduce.two", "index_add.default", "index_put.default",
    "_unsafe_masked_index_put_accumulate.default",
    # log-softmax sums exponentials, average pooling its window: a bfloat16 log_softmax over 32000
    # logits was off by 0.94 (torch 0.06), a 64x64 bfloat16 average by 1.27 (torch 0.003)
    "_log_softmax.default", "_log_softmax_backward_data.default", "avg_pool1d.default", "avg_pool2d.default",
    "avg_pool3d.default",
    # composite pointwise ops, which torch's kernels compute in float32 ("opmath") and round once:
    # lowered as several float16 ops, each rounded (float16 pow of 3310 was off by 12, torch 0.06)
    "pow.Tensor_Scalar", "pow.Tensor_Tensor", "pow.Scalar", "exp2.default", "addcmul.default",
    "addcdiv.default", "lerp.Scalar", "lerp.Tensor", "gelu.default", "gelu_backward.default", "logit.default",
    "logit_backward.default", "xlogy.Tensor", "hypot.default", "logaddexp.default", "logaddexp2.default",
    "softplus.default", "softplus_backward.default", "mish.default", "silu.default", "silu_backward.default",
    "elu.default", "sinc.default", "erfinv.default",
    # float16 sigmoid was an ulp off in a quarter of the values (torch rounds its float32 result)
    "sigmoid.default", "sigmoid_backward.default", "erf.default",
    # arithmetic, which torch's kernels compute in float32 with a scalar operand's own value
    # ("original_scalar_value"): lowered as it is, the scalar was rounded to float16 first
    # (x * 1e5 gave inf for every x, x / 1e5 gave 0, x * (1/3) was off by an ulp in a third of cases)
    "add.Tensor", "add.Scalar", "sub.Tensor", "sub.Scalar", "rsub.Tensor", "rsub.Scalar", "mul.Tensor",
    "mul.Scalar", "div.Tensor", "div.Scalar", "div.Tensor_mode", "div.Scalar_mode",
)

#: Matrix products, computed in float32 only where they are dot products (a 1-row times a
#: 1-column operand: ``einsum("ij,ij->i")`` is such a ``bmm``), which IREE reduces in the narrow
#: type; larger products accumulate in float32 inside its matmul kernels already.
DOT_SHAPED = _overloads("mm.default", "bmm.default", "addmm.default", "baddbmm.default")


def _is_dot(args: tuple, kwargs: dict) -> bool:
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    return len(tensors) >= 2 and tensors[-2].shape[-2] == 1 and tensors[-1].shape[-1] == 1


def _narrow_dtype(leaves: list[Any]) -> torch.dtype | None:
    """The one narrow dtype of every floating tensor among ``leaves``; None if there is none,
    or if another floating dtype is among them. 0-d tensors count only where all are 0-d (type
    promotion takes them for scalars beside others: the eager device's runtime scalars are
    float32 0-d tensors)."""
    floating = [leaf for leaf in leaves if isinstance(leaf, torch.Tensor) and leaf.is_floating_point()]
    shaped = [t for t in floating if t.dim()] or floating
    dtypes = {t.dtype for t in shaped}
    if len(dtypes) != 1:
        return None
    (found,) = dtypes
    return found if found in NARROW else None


def rounded(value: float, dtype: torch.dtype) -> float:
    """``value`` rounded to float16 or bfloat16 (to nearest, ties to even), in Python: no tensor
    op, since decompositions call it while tracing."""
    try:
        if dtype == torch.float16:
            return struct.unpack("<e", struct.pack("<e", value))[0]
        bits = struct.unpack("<I", struct.pack("<f", value))[0]
    except OverflowError:
        return math.copysign(math.inf, value)
    if value != value:
        return value
    bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000) & 0xFFFFFFFF
    return struct.unpack("<f", struct.pack("<I", bits))[0]


#: Ops whose scalar operands torch rounds to the tensors' dtype before computing in float32: ``x +
#: 0.1`` adds bfloat16's 0.10009765625 (``x * 0.1`` multiplies by 0.1 itself), and so does a 0-d
#: float32 tensor operand (the eager device's runtime scalars) or ``alpha``; ``x ** 1e-8`` of float16
#: is ``x ** 0`` (1 for every x, where the unrounded exponent gave NaN for negative x).
ROUNDED_SCALARS = frozenset(_overloads("add.Tensor", "add.Scalar", "sub.Tensor", "sub.Scalar", "rsub.Tensor",
                                       "rsub.Scalar", "pow.Tensor_Scalar", "pow.Scalar"))


def _round_scalar(narrow: torch.dtype, leaf: Any) -> Any:
    """A number or 0-d tensor of another floating dtype, rounded to ``narrow``; anything else as it is."""
    if type(leaf) in (float, int):
        return rounded_number(leaf, narrow)
    if isinstance(leaf, torch.Tensor) and leaf.dim() == 0 and leaf.is_floating_point() and leaf.dtype != narrow:
        return leaf.to(narrow)  # (IREE may fold this for one element: the eager device rounds on the host)
    return leaf


def rounded_number(value: float | int, narrow: torch.dtype) -> float | int:
    """A Python number rounded to ``narrow`` (:func:`rounded`); an int beyond any float as it is
    (torch's own error comes from the op)."""
    try:
        return rounded(float(value), narrow)
    except OverflowError:
        return value


def in_float32(op: Any, previous: Callable | None, when: Callable[[tuple, dict], bool] | None = None) -> Callable:
    """The decomposition of ``op``: ``previous`` (or the op itself) as it is, except for inputs of
    one narrow dtype (see the module docstring), which it computes in float32 (only where
    ``when(args, kwargs)`` holds, if given)."""

    @functools.wraps(previous or op)
    def decomposition(*args: Any, **kwargs: Any) -> Any:
        narrow = None if kwargs.get("dtype") is not None else _narrow_dtype(pytree.tree_leaves((args, kwargs)))
        if narrow is not None and when is not None and not when(args, kwargs):
            narrow = None
        if narrow is None:
            return previous(*args, **kwargs) if previous is not None else NotImplemented

        def widen(leaf: Any) -> Any:
            return leaf.float() if isinstance(leaf, torch.Tensor) and leaf.dtype == narrow else leaf

        def round_back(leaf: Any) -> Any:
            return leaf.to(narrow) if isinstance(leaf, torch.Tensor) and leaf.dtype == torch.float32 else leaf

        if op in ROUNDED_SCALARS:
            args, kwargs = pytree.tree_map(functools.partial(_round_scalar, narrow), (args, kwargs))
        wide_args, wide_kwargs = pytree.tree_map(widen, (args, kwargs))
        result = previous(*wide_args, **wide_kwargs) if previous is not None else NotImplemented
        if result is NotImplemented:
            result = op(*wide_args, **wide_kwargs)
        return pytree.tree_map(round_back, result)

    return decomposition


#: Group norm forward and backward, with the positions of their results in the input's dtype.
_GROUP_NORMS = {aten.native_group_norm.default: (0,), aten.native_group_norm_backward.default: (0,)}


def _mixed_group_norm(op: Any, decomposition: Callable) -> Callable:
    """``decomposition`` of a group norm op, which also takes a narrow input with float32 weight
    and bias (what autocast hands it: torch's kernel computes in float32, its mean and rstd and the
    weight's gradients float32, the output and input gradient in the input's dtype). Lowered as
    it is, that mix failed in torch-mlir ("expects operand and result to have compatible element
    type")."""

    @functools.wraps(decomposition)
    def mixed(*args: Any, **kwargs: Any) -> Any:
        floating = {leaf.dtype for leaf in pytree.tree_leaves((args, kwargs))
                    if isinstance(leaf, torch.Tensor) and leaf.is_floating_point()}
        narrow = floating - {torch.float32}
        if len(narrow) != 1 or torch.float32 not in floating or not narrow <= set(NARROW):
            return decomposition(*args, **kwargs)
        (dtype,) = narrow
        wide_args, wide_kwargs = pytree.tree_map(
            lambda t: t.float() if isinstance(t, torch.Tensor) and t.dtype == dtype else t, (args, kwargs))
        results = decomposition(*wide_args, **wide_kwargs)
        if results is NotImplemented:
            results = op(*wide_args, **wide_kwargs)
        return tuple(r.to(dtype) if i in _GROUP_NORMS[op] and r is not None else r for i, r in enumerate(results))

    return mixed


def wrapped(table: dict) -> dict:
    """``table`` with each op of :data:`OPS` (and :data:`DOT_SHAPED`'s dot products) computing
    narrow inputs in float32, and group norms taking a narrow input with float32 parameters."""
    table = {**table, **{op: in_float32(op, table.get(op)) for op in OPS},
             **{op: in_float32(op, table.get(op), _is_dot) for op in DOT_SHAPED}}
    return {**table, **{op: _mixed_group_norm(op, table[op]) for op in _GROUP_NORMS}}
