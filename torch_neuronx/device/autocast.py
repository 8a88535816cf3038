"""``torch.autocast("neuron")``: the autocast kernels of PrivateUse1, which torch registers for no backend.

Inside an autocast region every op on a neuron tensor passes the AutocastPrivateUse1
dispatch key. torch 2.13 registers kernels for it nowhere, so without these every op
raised ``NotImplementedError``. As CUDA's autocast does (``aten/src/ATen/autocast_mode.cpp``):
every op falls through unchanged, except three lists: ops that run in the autocast dtype
(matrix products, convolutions, recurrent cells, attention), ops that run in float32
(reductions, norms, losses, pointwise ops that lose range in half precision), and ops
whose floating inputs are promoted to their widest dtype; ``binary_cross_entropy`` is refused
with CUDA's message. Only floating tensors on the
neuron device other than float64 are cast, as CUDA casts only its eligible tensors.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.utils._pytree as pytree

_KEY = "AutocastPrivateUse1"

LOWER_PRECISION = (
    "_convolution.deprecated", "_convolution", "conv1d", "conv2d", "conv3d", "conv_tbc",
    "conv_transpose1d", "conv_transpose2d.input", "conv_transpose3d.input", "convolution", "prelu",
    "addmm", "addmv", "addr", "matmul", "einsum", "mm", "mv", "linalg_vecdot", "linear", "addbmm",
    "baddbmm", "bmm", "chain_matmul", "linalg_multi_dot", "_thnn_fused_lstm_cell", "_thnn_fused_gru_cell",
    "lstm_cell", "gru_cell", "rnn_tanh_cell", "rnn_relu_cell", "scaled_dot_product_attention",
)
FLOAT32 = (
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal",
    "rsqrt", "sinh", "tan", "pow.Tensor_Scalar", "pow.Tensor_Tensor", "pow.Scalar", "softplus",
    "layer_norm", "native_layer_norm", "group_norm", "frobenius_norm.dim", "nuclear_norm",
    "nuclear_norm.dim", "cosine_similarity", "poisson_nll_loss", "cosine_embedding_loss", "nll_loss",
    "nll_loss2d", "hinge_embedding_loss", "kl_div", "l1_loss", "smooth_l1_loss", "huber_loss",
    "mse_loss", "margin_ranking_loss", "multilabel_margin_loss", "soft_margin_loss",
    "triplet_margin_loss", "multi_margin_loss", "binary_cross_entropy_with_logits", "dist", "pdist",
    "cdist", "renorm", "logsumexp", "upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d",
    "upsample_linear1d", "upsample_bilinear2d", "upsample_trilinear3d", "upsample_bicubic2d",
    "cumprod", "cumsum", "prod", "prod.dim_int", "sum", "sum.dim_IntList", "softmax.int",
    "log_softmax.int", "norm.Scalar", "norm.ScalarOpt_dim", "cross_entropy_loss", "rms_norm",
    "linalg_vector_norm",
)
PROMOTE = (
    "addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "grid_sampler", "index_put",
    "tensordot", "scatter_add", "stack", "cat", "index_copy", "vdot",
)
#: Ops autocast refuses, with CUDA's message.
BANNED = {
    "binary_cross_entropy": (
        "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast.\n"
        "Many models use a sigmoid layer right before the binary cross entropy layer.\n"
        "In this case, combine the two layers using torch.nn.functional.binary_cross_entropy_with_logits\n"
        "or torch.nn.BCEWithLogitsLoss.  binary_cross_entropy_with_logits and BCEWithLogits are\n"
        "safe to autocast."),
}

_library: torch.library.Library | None = None


def _eligible(value: Any) -> bool:
    return (isinstance(value, torch.Tensor) and value.is_floating_point() and value.dtype != torch.float64
            and value.device.type == "neuron")


def _cast(values: Any, dtype: torch.dtype) -> Any:
    return pytree.tree_map(lambda v: v.to(dtype) if _eligible(v) and v.dtype != dtype else v, values)


def _redispatch(op: Any, args: Any, kwargs: Any) -> Any:
    with torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastPrivateUse1)):
        return op(*args, **kwargs)


def _kernel(op: Any, policy: str) -> Callable[..., Any]:
    def kernel(*args: Any, **kwargs: Any) -> Any:
        if policy == "lower":
            dtype = torch.get_autocast_dtype("neuron")
        elif policy == "float32":
            dtype = torch.float32
        else:  # promote: the widest floating dtype among the eligible inputs
            floats = [v.dtype for v in pytree.tree_leaves((args, kwargs)) if _eligible(v)]
            dtype = floats[0] if floats else None
            for other in floats[1:]:
                dtype = torch.promote_types(dtype, other)
        if dtype is not None:
            args, kwargs = _cast((args, kwargs), dtype)
        return _redispatch(op, args, kwargs)

    return kernel


def _never_traced(kernel: Callable[..., Any]) -> Callable[..., Any]:
    """``kernel`` run as it is where Dynamo's frame hook is active (a module whose compile fell back
    to eager, such as one holding an ``nn.LSTM``): Dynamo traced these kernels as the user's code,
    recompiled them per op, and compiled modules under autocast failed ("sources must not be
    empty for symbol ...")."""
    return torch._disable_dynamo(kernel)


def _overloads(name: str) -> list[Any]:
    packet_name, _, overload = name.partition(".")
    packet = getattr(torch.ops.aten, packet_name, None)
    if packet is None:
        return []
    found = getattr(packet, overload or "default", None)
    return [found] if found is not None else []


def register() -> None:
    """Register the fallthrough and the three cast policies for AutocastPrivateUse1; idempotent."""
    global _library
    if _library is not None:
        return
    library = torch.library.Library("aten", "IMPL")
    fallthrough = torch.library.Library("_", "IMPL")
    fallthrough.fallback(torch.library.fallthrough_kernel, _KEY)
    for names, policy in ((LOWER_PRECISION, "lower"), (FLOAT32, "float32"), (PROMOTE, "promote")):
        for name in names:
            for op in _overloads(name):
                library.impl(op._schema.name.split("::")[1] + (f".{op._overloadname}"
                             if op._overloadname != "default" else ""), _never_traced(_kernel(op, policy)), _KEY)
    for name, message in BANNED.items():
        for op in _overloads(name):
            library.impl(op._schema.name.split("::")[1], _never_traced(_refusal(message)), _KEY)
    _library = (library, fallthrough)  # type: ignore[assignment]


def _refusal(message: str) -> Callable[..., Any]:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(message)

    return refuse
