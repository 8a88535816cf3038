"""Attention decompositions: every fused attention op of ATen as the math torch-mlir lowers.

- The "fast path" inference ops of ``nn.TransformerEncoderLayer`` and
  ``nn.MultiheadAttention`` in eval mode (``_transformer_encoder_layer_fwd``,
  ``_native_multi_head_attention``).
- Each fused variant ``scaled_dot_product_attention`` picks, and its backward:
  the CPU flash kernel (what aot graphs on the host hold), and the flash,
  memory-efficient, cuDNN and "overrideable" (PrivateUse1) kernels, which a graph
  holds when it calls them by name (their meta kernels trace on any device).
  One forward and one backward serve them all, with everything those kernels
  accept: grouped-query attention (fewer key/value heads than query heads, as
  ``enable_gqa``), ``is_causal`` with or without a mask (a top-left causal
  triangle when query and key lengths differ), boolean and additive masks of
  any broadcastable shape, ``scale``, value head sizes other than the query's,
  and half-precision inputs computed in float32 as the CPU kernel does.
  ``dropout_p > 0`` (random, so never eager's values) raises.

``_scaled_dot_product_attention_math`` needs nothing here: it is a composite of
ops that lower (``scaled_dot_product_attention`` picks it for dropout and for
inputs that are not 4-d).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

aten = torch.ops.aten


def _row_exponentials(scores: torch.Tensor, masked_rows_zero: bool,
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Softmax before its division: ``(exp(scores - top), their row sums, top)``, ``top`` the row maxima.

    Attention divides after its product with the values, as flash attention does: one
    exponential per score, and that product stays a plain batch matmul (IREE data-tiles it).
    Dividing first, or recomputing the probabilities from logsumexp, cost the transformer
    block of bench/compile.py 160 us more per call (iree-profile). With ``masked_rows_zero``
    a row of -inf gets weights and a sum of 0 (else NaN).
    """
    top = scores.amax(dim=-1, keepdim=True)
    if masked_rows_zero:
        top = torch.where(top == float("-inf"), 0.0, top)
    weights = torch.exp(scores - top)
    return weights, weights.sum(dim=-1, keepdim=True), top


# --- the fast path of nn.TransformerEncoderLayer / nn.MultiheadAttention -------------------------

def _additive_mask(mask: torch.Tensor | None, mask_type: int | None, batch: int,
                   dtype: torch.dtype) -> torch.Tensor | None:
    """The fast-path mask as an additive (B, H, L, S) bias; True in a bool mask means "masked out"."""
    if mask is None:
        return None
    if mask.dtype == torch.bool:
        mask = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(mask, float("-inf"))
    else:
        mask = mask.to(dtype)
    if mask_type == 1:  # key padding mask (B, S)
        return mask.view(batch, 1, 1, mask.shape[-1])
    return mask  # (L, S) or (B, H, L, S): broadcasts


def _packed_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int,
                      bias: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of (B, L, E) projections with ``heads`` heads: ``(output, weights)``."""
    batch, length, embed = q.shape
    head_dim = embed // heads

    def split(t: torch.Tensor) -> torch.Tensor:
        return t.view(batch, t.shape[1], heads, head_dim).transpose(1, 2)

    scores = split(q) @ split(k).transpose(-2, -1) * (head_dim ** -0.5)
    if bias is not None:
        scores = scores + bias
    # A row masked everywhere gives NaN, as eager's softmax does.
    weights, total, _ = _row_exponentials(scores, masked_rows_zero=False)
    out = ((weights @ split(v)) / total).transpose(1, 2).reshape(batch, length, embed)
    return out, weights / total


def transformer_encoder_layer_fwd(
    src, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias, use_gelu, norm_first,
    eps, norm_weight_1, norm_bias_1, norm_weight_2, norm_bias_2, ffn_weight_1, ffn_bias_1,
    ffn_weight_2, ffn_bias_2, mask=None, mask_type=None,
):
    """``aten._transformer_encoder_layer_fwd`` as the math ``nn.TransformerEncoderLayer`` does."""
    bias = _additive_mask(mask, mask_type, src.shape[0], src.dtype)

    def self_attention(x: torch.Tensor) -> torch.Tensor:
        q, k, v = F.linear(x, qkv_weight, qkv_bias).chunk(3, dim=-1)
        return F.linear(_packed_attention(q, k, v, num_heads, bias)[0], proj_weight, proj_bias)

    def feed_forward(x: torch.Tensor) -> torch.Tensor:
        hidden = F.linear(x, ffn_weight_1, ffn_bias_1)
        hidden = F.gelu(hidden) if use_gelu else F.relu(hidden)
        return F.linear(hidden, ffn_weight_2, ffn_bias_2)

    def norm1(x):
        return F.layer_norm(x, (embed_dim,), norm_weight_1, norm_bias_1, eps)

    def norm2(x):
        return F.layer_norm(x, (embed_dim,), norm_weight_2, norm_bias_2, eps)

    if norm_first:
        x = src + self_attention(norm1(src))
        return x + feed_forward(norm2(x))
    x = norm1(src + self_attention(src))
    return norm2(x + feed_forward(x))


def native_multi_head_attention(
    query, key, value, embed_dim, num_head, qkv_weight, qkv_bias, proj_weight, proj_bias,
    mask=None, need_weights=True, average_attn_weights=True, mask_type=None,
):
    """``aten._native_multi_head_attention`` (batch-first fast path of nn.MultiheadAttention)."""
    w_q, w_k, w_v = qkv_weight.chunk(3)
    b_q, b_k, b_v = qkv_bias.chunk(3)
    q, k, v = F.linear(query, w_q, b_q), F.linear(key, w_k, b_k), F.linear(value, w_v, b_v)
    bias = _additive_mask(mask, mask_type, query.shape[0], query.dtype)
    out, weights = _packed_attention(q, k, v, num_head, bias)
    out = F.linear(out, proj_weight, proj_bias)
    if not need_weights:
        return out, torch.empty(0, dtype=out.dtype, device=out.device)
    return out, weights.mean(dim=1) if average_attn_weights else weights


# --- scaled_dot_product_attention's fused kernels --------------------------------------------------

def _computation_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for half-precision inputs (the CPU kernel accumulates there), else the dtype itself."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _no_dropout(dropout_p: float) -> None:
    if not 0 <= dropout_p <= 1:
        raise RuntimeError(f"dropout probability has to be between 0 and 1, but got {dropout_p}")
    if dropout_p != 0.0:
        raise NotImplementedError("scaled_dot_product_attention with dropout_p > 0 in a compiled graph "
                                  "(a fused attention kernel's dropout has no decomposition)")


def _grouped(t: torch.Tensor, heads: int) -> torch.Tensor:
    """Keys or values of fewer heads than the query's, repeated to ``heads`` (query head h reads
    head h // (heads / kv heads), as ``enable_gqa`` and ``repeat_interleave`` do)."""
    if t.dim() < 3 or t.shape[-3] == heads:
        return t
    kv_heads = t.shape[-3]
    if heads % kv_heads:
        raise RuntimeError(f"scaled_dot_product_attention: {heads} query heads are not a multiple "
                           f"of {kv_heads} key/value heads")
    shape = (*t.shape[:-3], kv_heads, heads // kv_heads, *t.shape[-2:])
    return t.unsqueeze(-3).expand(shape).reshape(*t.shape[:-3], heads, *t.shape[-2:])


def _ungrouped(grad: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """The gradient of :func:`_grouped`: the heads sharing one key/value head summed."""
    if grad.dim() < 3 or grad.shape[-3] == like.shape[-3]:
        return grad
    return grad.unflatten(-3, (like.shape[-3], grad.shape[-3] // like.shape[-3])).sum(-3)


def _bias(length: int, source: int, is_causal: bool, attn_mask: torch.Tensor | None,
          dtype: torch.dtype, device: torch.device) -> torch.Tensor | None:
    """The additive bias of the scores: -inf above the (top-left) diagonal when causal, plus the
    mask (True in a boolean mask means "attend"; a float mask adds)."""
    bias = None
    if is_causal:
        keep = torch.ones(length, source, dtype=torch.bool, device=device).tril()
        bias = torch.zeros(length, source, dtype=dtype, device=device).masked_fill(keep.logical_not(), float("-inf"))
    if attn_mask is not None:
        extra = (torch.zeros(attn_mask.shape, dtype=dtype, device=device).masked_fill(
            attn_mask.logical_not(), float("-inf")) if attn_mask.dtype == torch.bool else attn_mask.to(dtype))
        bias = extra if bias is None else bias + extra
    return bias


def _scores(query: torch.Tensor, key: torch.Tensor, is_causal: bool, attn_mask: torch.Tensor | None,
            scale: float | None) -> tuple[torch.Tensor, float]:
    """``q k^T * scale + bias`` in the computation dtype (keys already grouped), and the scale."""
    scale = query.shape[-1] ** -0.5 if scale is None else scale
    scores = query @ key.transpose(-2, -1) * scale
    bias = _bias(query.shape[-2], key.shape[-2], is_causal, attn_mask, scores.dtype, scores.device)
    return (scores if bias is None else scores + bias), scale


def _upcast(*tensors: torch.Tensor) -> list[torch.Tensor]:
    return [t.to(_computation_dtype(t.dtype)) for t in tensors]


def _forward(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, is_causal: bool,
             attn_mask: torch.Tensor | None, scale: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(output, logsumexp)`` of attention; the logsumexp (..., L) in the computation dtype.

    A row masked everywhere gives zeros and a logsumexp of 0, as torch's CPU kernel does.
    """
    q, k, v = _upcast(query, key, value)
    heads = q.shape[-3] if q.dim() >= 3 else 1
    scores, _ = _scores(q, _grouped(k, heads), is_causal, attn_mask, scale)
    weights, total, top = _row_exponentials(scores, masked_rows_zero=True)
    out = (weights @ _grouped(v, heads)) / torch.where(total == 0, 1.0, total)
    logsumexp = torch.where(total == 0, 0.0, torch.log(total) + top).squeeze(-1)
    return out.to(query.dtype), logsumexp


def _backward(grad_out: torch.Tensor, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              out: torch.Tensor, logsumexp: torch.Tensor | None, is_causal: bool,
              attn_mask: torch.Tensor | None, scale: float | None,
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of :func:`_forward` for the query, key, value and the additive bias (the scores').

    The textbook attention backward, probabilities recomputed from the logsumexp (or from
    scratch where a kernel saved none): dV = P^T dO, dS = P * (dO V^T - rowsum(dO * O)).
    The bias gradient has the scores' shape; callers sum it to their bias's.
    """
    q, k, v, g, o = _upcast(query, key, value, grad_out, out)
    heads = q.shape[-3] if q.dim() >= 3 else 1
    k_all, v_all = _grouped(k, heads), _grouped(v, heads)
    scores, scale = _scores(q, k_all, is_causal, attn_mask, scale)
    if logsumexp is None:
        weights, total, top = _row_exponentials(scores, masked_rows_zero=True)
        logsumexp = torch.where(total == 0, 0.0, torch.log(total) + top).squeeze(-1)
    probs = torch.exp(scores - logsumexp.to(scores.dtype).unsqueeze(-1))
    grad_value = probs.transpose(-2, -1) @ g
    delta = (g * o).sum(dim=-1, keepdim=True)
    grad_scores = probs * (g @ v_all.transpose(-2, -1) - delta)
    grad_query = grad_scores @ k_all * scale
    grad_key = grad_scores.transpose(-2, -1) @ q * scale
    return (grad_query.to(query.dtype), _ungrouped(grad_key, key).to(key.dtype),
            _ungrouped(grad_value, value).to(value.dtype), grad_scores)


def _bias_grad(grad_scores: torch.Tensor, attn_bias: torch.Tensor | None, wanted: bool) -> torch.Tensor | None:
    """The gradient of an additive ``attn_bias`` that broadcast over the scores, or None."""
    if attn_bias is None or not wanted:
        return None
    return grad_scores.sum_to_size(attn_bias.shape).to(attn_bias.dtype)


def _philox(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Placeholders for a fused kernel's dropout seed and offset (no dropout runs)."""
    return torch.zeros((), dtype=torch.long, device=device), torch.zeros((), dtype=torch.long, device=device)


def flash_attention_for_cpu(query, key, value, dropout_p=0.0, is_causal=False, *, attn_mask=None,
                            scale=None):
    """``_scaled_dot_product_flash_attention_for_cpu``: ``(output, logsumexp)``; keys and values may
    have fewer heads than the query (``enable_gqa``)."""
    _no_dropout(dropout_p)
    return _forward(query, key, value, is_causal, attn_mask, scale)


def flash_attention_for_cpu_backward(grad_out, query, key, value, out, logsumexp, dropout_p, is_causal,
                                     *, attn_mask=None, scale=None):
    """Gradients of :func:`flash_attention_for_cpu` (nothing lowers the CPU kernel's backward)."""
    _no_dropout(dropout_p)
    return _backward(grad_out, query, key, value, out, logsumexp, is_causal, attn_mask, scale)[:3]


def flash_attention(query, key, value, dropout_p=0.0, is_causal=False, return_debug_mask=False, *, scale=None):
    """``_scaled_dot_product_flash_attention`` (the CUDA flash kernel's nine outputs)."""
    _no_dropout(dropout_p)
    out, logsumexp = _forward(query, key, value, is_causal, None, scale)
    seed, offset = _philox(query.device)
    return (out, logsumexp.float(), None, None, query.shape[-2], key.shape[-2], seed, offset,
            torch.empty(0, dtype=query.dtype, device=query.device))


def flash_attention_backward(grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k,
                             dropout_p, is_causal, philox_seed, philox_offset, *, scale=None):
    """Gradients of :func:`flash_attention`."""
    _no_dropout(dropout_p)
    return _backward(grad_out, query, key, value, out, logsumexp, is_causal, None, scale)[:3]


def efficient_attention(query, key, value, attn_bias, compute_log_sumexp, dropout_p=0.0, is_causal=False, *,
                        scale=None):
    """``_scaled_dot_product_efficient_attention``: its logsumexp padded to a multiple of 32 rows
    (empty unless asked for), as the kernel's."""
    _no_dropout(dropout_p)
    out, logsumexp = _forward(query, key, value, is_causal, attn_bias, scale)
    rows = math.ceil(query.shape[-2] / 32) * 32 if compute_log_sumexp else 0
    logsumexp = F.pad(logsumexp.float(), (0, rows - query.shape[-2]))
    return (out, logsumexp, *_philox(query.device))


def efficient_attention_backward(grad_out_, query, key, value, attn_bias, out, logsumexp, philox_seed,
                                 philox_offset, dropout_p, grad_input_mask, is_causal=False, *, scale=None):
    """Gradients of :func:`efficient_attention`, the bias's when ``grad_input_mask[3]``."""
    _no_dropout(dropout_p)
    saved = logsumexp[..., :query.shape[-2]] if logsumexp.shape[-1] >= query.shape[-2] else None
    *grads, grad_scores = _backward(grad_out_, query, key, value, out, saved, is_causal, attn_bias, scale)
    return (*grads, _bias_grad(grad_scores, attn_bias, grad_input_mask[3]))


def cudnn_attention(query, key, value, attn_bias, compute_log_sumexp, dropout_p=0.0, is_causal=False,
                    return_debug_mask=False, *, scale=None):
    """``_scaled_dot_product_cudnn_attention``: its logsumexp (B, H, L, 1)."""
    _no_dropout(dropout_p)
    out, logsumexp = _forward(query, key, value, is_causal, attn_bias, scale)
    seed, offset = _philox(query.device)
    return (out, logsumexp.float().unsqueeze(-1), None, None, query.shape[-2], key.shape[-2], seed, offset, None)


def cudnn_attention_backward(grad_out, query, key, value, out, logsumexp, philox_seed, philox_offset, attn_bias,
                             cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal, *, scale=None):
    """Gradients of :func:`cudnn_attention` (the kernel returns none for its bias)."""
    _no_dropout(dropout_p)
    return _backward(grad_out, query, key, value, out, logsumexp.squeeze(-1), is_causal, attn_bias, scale)[:3]


def fused_attention_overrideable(query, key, value, attn_bias=None, dropout_p=0.0, is_causal=False,
                                 return_debug_mask=False, *, scale=None):
    """``_scaled_dot_product_fused_attention_overrideable`` (the kernel a PrivateUse1 backend may provide)."""
    _no_dropout(dropout_p)
    out, logsumexp = _forward(query, key, value, is_causal, attn_bias, scale)
    seed, offset = _philox(query.device)
    return (out, logsumexp.float(), None, None, query.shape[-2], key.shape[-2], seed, offset, None)


def fused_attention_overrideable_backward(grad_out, query, key, value, attn_bias, grad_input_mask, out, logsumexp,
                                          cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal, philox_seed,
                                          philox_offset, *, scale=None):
    """Gradients of :func:`fused_attention_overrideable`, the bias's when ``grad_input_mask[3]``."""
    _no_dropout(dropout_p)
    *grads, grad_scores = _backward(grad_out, query, key, value, out, logsumexp, is_causal, attn_bias, scale)
    return (*grads, _bias_grad(grad_scores, attn_bias, grad_input_mask[3]))


def attention_math_for_mps(*args: object, **kwargs: object) -> Sequence[torch.Tensor]:
    """``_scaled_dot_product_attention_math_for_mps``: the composite math every device has."""
    return aten._scaled_dot_product_attention_math.default(*args, **kwargs)


DECOMPOSITIONS: dict[torch._ops.OpOverload, Callable] = {
    aten._transformer_encoder_layer_fwd.default: transformer_encoder_layer_fwd,
    aten._native_multi_head_attention.default: native_multi_head_attention,
    aten._scaled_dot_product_flash_attention_for_cpu.default: flash_attention_for_cpu,
    aten._scaled_dot_product_flash_attention_for_cpu_backward.default: flash_attention_for_cpu_backward,
    aten._scaled_dot_product_flash_attention.default: flash_attention,
    aten._scaled_dot_product_flash_attention_backward.default: flash_attention_backward,
    aten._scaled_dot_product_efficient_attention.default: efficient_attention,
    aten._scaled_dot_product_efficient_attention_backward.default: efficient_attention_backward,
    aten._scaled_dot_product_cudnn_attention.default: cudnn_attention,
    aten._scaled_dot_product_cudnn_attention_backward.default: cudnn_attention_backward,
    aten._scaled_dot_product_fused_attention_overrideable.default: fused_attention_overrideable,
    aten._scaled_dot_product_fused_attention_overrideable_backward.default: fused_attention_overrideable_backward,
    aten._scaled_dot_product_attention_math_for_mps.default: attention_math_for_mps,
}
