"""scaled_dot_product_attention through the compile path (``decompositions/attention.py``) against eager.

Every argument torch accepts (grouped-query attention, ``is_causal`` with and without a
mask, boolean, additive and broadcast masks, ``scale``, query and key lengths that differ,
value head sizes other than the query's, 3-d inputs), on host tensors and on neuron
tensors, values and gradients; and the fused kernels a graph can name (CPU flash, flash,
memory-efficient, cuDNN, overrideable) with their backward ops. The decompositions are
checked directly against torch's CPU kernel in many cases (no compile); the compiled tests
batch every case into one function (a compile costs seconds).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from compare import forward_backward, weighted_backward

from torch_neuronx.compiler.decompositions import attention

aten = torch.ops.aten
B, H, L, S, E = 2, 4, 5, 7, 8


def _randn(*shape: int, generator: torch.Generator, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape, generator=generator, dtype=dtype)


def _masks(generator: torch.Generator) -> dict[str, torch.Tensor | None]:
    keep = torch.rand(L, S, generator=generator) > 0.3
    keep[0] = False  # a query that attends to nothing: zeros, as torch's CPU kernel gives
    return {"none": None, "bool": keep, "bool_b1": torch.rand(B, 1, L, S, generator=generator) > 0.3,
            "float_1h": _randn(1, H, 1, S, generator=generator), "float_b1": _randn(B, 1, L, S, generator=generator)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kv_heads", [H, 2, 1], ids=["mha", "gqa", "mqa"])
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_cpu_flash_kernel_and_its_backward_match_torchs(dtype, kv_heads, is_causal):
    """The decomposition of ``_scaled_dot_product_flash_attention_for_cpu`` and its backward, every
    mask (as given and as the additive mask scaled_dot_product_attention makes of a boolean one)."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (_randn(B, heads, n, E, generator=gen, dtype=dtype)
               for heads, n in ((H, L), (kv_heads, S), (kv_heads, S)))
    tolerance = {"rtol": 2e-2, "atol": 2e-2} if dtype == torch.bfloat16 else {"rtol": 1e-5, "atol": 1e-5}
    for name, mask in _masks(gen).items():
        additive = (torch.zeros(mask.shape, dtype=dtype).masked_fill(~mask, float("-inf"))
                    if mask is not None and mask.dtype == torch.bool else mask)
        out, lse = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, is_causal, attn_mask=additive,
                                                                     scale=0.3)
        grad_out = _randn(*out.shape, generator=gen, dtype=dtype)
        grads = aten._scaled_dot_product_flash_attention_for_cpu_backward(
            grad_out, q, k, v, out, lse, 0.0, is_causal, attn_mask=additive, scale=0.3)
        for given in (mask, additive):
            got = attention.flash_attention_for_cpu(q, k, v, 0.0, is_causal, attn_mask=given, scale=0.3)
            got_grads = attention.flash_attention_for_cpu_backward(grad_out, q, k, v, out, lse, 0.0, is_causal,
                                                                   attn_mask=given, scale=0.3)
            for label, g, e in zip(("out", "logsumexp", "grad_q", "grad_k", "grad_v"), (*got, *got_grads),
                                   (out, lse, *grads)):
                assert (g.shape, g.dtype) == (e.shape, e.dtype), f"{name}: {label}"
                torch.testing.assert_close(g, e, **tolerance, msg=lambda m, n=name, lb=label: f"{n} {lb}: {m}")


def _variants(q, k_gqa, v_gqa, k, v, v_wide, q3, k3, v3, bool_mask, float_mask, head_mask):
    """Every kind of call scaled_dot_product_attention takes, on one set of inputs."""
    sdpa = F.scaled_dot_product_attention
    return [
        sdpa(q, k_gqa, v_gqa, is_causal=True, enable_gqa=True),  # Llama's: GQA, causal, L != S
        sdpa(q, k_gqa, v_gqa, attn_mask=float_mask, enable_gqa=True, scale=0.25),
        sdpa(q, k, v, attn_mask=bool_mask),  # broadcast (B, 1, L, S), one row masked everywhere
        sdpa(q, k, v, attn_mask=head_mask, dropout_p=0.0),  # (1, H, 1, S)
        sdpa(q, k_gqa, v_wide, attn_mask=bool_mask, enable_gqa=True),  # value head size != query's: math
        sdpa(q3, k3, v3, is_causal=True),  # 3-d: math
    ]


def _variant_inputs(gen: torch.Generator) -> list[torch.Tensor]:
    keep = torch.rand(B, 1, L, S, generator=gen) > 0.3
    keep[0, 0, 1] = False
    return [_randn(B, H, L, E, generator=gen), _randn(B, 2, S, E, generator=gen), _randn(B, 2, S, E, generator=gen),
            _randn(B, H, S, E, generator=gen), _randn(B, H, S, E, generator=gen), _randn(B, 2, S, 6, generator=gen),
            _randn(B, L, E, generator=gen), _randn(B, S, E, generator=gen), _randn(B, S, E, generator=gen),
            keep, _randn(L, S, generator=gen), _randn(1, H, 1, S, generator=gen)]


def test_every_kind_of_call_trains_as_in_eager_on_the_host():
    """Grouped-query attention failed to trace ("Attempting to broadcast a dimension of length 2")."""
    gen = torch.Generator().manual_seed(1)
    inputs = _variant_inputs(gen)
    masks = inputs[9:]  # constants: a mask that takes no gradient lets torch pick the CPU flash kernel

    def fn(*tensors):
        return _variants(*tensors, *masks)

    expected, got, eager_grads, compiled_grads = forward_backward(fn, inputs[:9], gen)
    for i, (e, g) in enumerate(zip(expected, got)):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-5, msg=lambda m, i=i: f"output {i}: {m}")
    for i, (e, g) in enumerate(zip(eager_grads, compiled_grads)):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-5, msg=lambda m, i=i: f"grad of input {i}: {m}")


def _on_device(q, k_gqa, v_gqa, k, v, bool_mask):
    """Two of :func:`_variants`' calls (each eager op on the device compiles a kernel per shape)."""
    return [F.scaled_dot_product_attention(q, k_gqa, v_gqa, is_causal=True, enable_gqa=True),
            F.scaled_dot_product_attention(q, k, v, attn_mask=bool_mask, scale=0.25)]


def test_grouped_query_and_masked_calls_train_as_in_eager_on_neuron_tensors():
    """Calls on the ``neuron`` device, eagerly and compiled, against the host's values (the device
    takes the math path: ``is_causal`` with a mask raises there, as in torch's math)."""
    gen = torch.Generator().manual_seed(2)
    inputs = _variant_inputs(gen)
    inputs = [*inputs[:5], inputs[9]]
    host = [t.clone().requires_grad_(i < 5) for i, t in enumerate(inputs)]
    device = [t.to("neuron").requires_grad_(i < 5) for i, t in enumerate(inputs)]
    compiled_device = [t.to("neuron").requires_grad_(i < 5) for i, t in enumerate(inputs)]
    expected, eager = _on_device(*host), _on_device(*device)
    got = torch.compile(_on_device, backend="neuron")(*compiled_device)
    weights = [_randn(*e.shape, generator=gen) for e in expected]
    for outputs, place in ((expected, "cpu"), (eager, "neuron"), (got, "neuron")):
        sum((o * w.to(place)).sum() for o, w in zip(outputs, weights)).backward()
    for i, e in enumerate(expected):
        for label, g in (("eager", eager[i]), ("compiled", got[i])):
            assert g.device.type == "neuron"
            torch.testing.assert_close(g.cpu(), e.detach(), rtol=1e-4, atol=1e-5,
                                       msg=lambda m, i=i, lb=label: f"{lb} output {i}: {m}")
    for i, h in enumerate(host):
        if h.grad is not None:
            for label, d in (("eager", device[i]), ("compiled", compiled_device[i])):
                torch.testing.assert_close(d.grad.cpu(), h.grad, rtol=1e-4, atol=1e-5,
                                           msg=lambda m, i=i, lb=label: f"{lb} grad of input {i}: {m}")


def test_fused_kernels_named_in_a_graph_train_as_scaled_dot_product_attention():
    """The flash, memory-efficient, cuDNN and overrideable kernels (CUDA's and a PrivateUse1
    backend's; their meta kernels trace anywhere), forward and backward, the additive bias's
    gradient included, against eager's math on the host."""
    gen = torch.Generator().manual_seed(3)
    q, k, v, bias = (_randn(B, H, L, E, generator=gen), _randn(B, H, S, E, generator=gen),
                     _randn(B, H, S, E, generator=gen), _randn(B, 1, L, S, generator=gen))
    cudnn_bias = _randn(B, H, L, S, generator=gen)  # cuDNN's bias takes no gradient

    def fused(q, k, v, bias):
        return [aten._scaled_dot_product_flash_attention(q, k, v, 0.0, True, scale=0.3)[0],
                aten._scaled_dot_product_efficient_attention(q, k, v, bias, True, 0.0, False)[0],
                aten._scaled_dot_product_cudnn_attention(q, k, v, cudnn_bias, True, 0.0, True)[0],
                aten._scaled_dot_product_fused_attention_overrideable(q, k, v, bias, 0.0, True, scale=0.5)[0]]

    def math(q, k, v, bias):
        causal = torch.ones(L, S, dtype=torch.bool).tril()
        return [F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3),
                F.scaled_dot_product_attention(q, k, v, attn_mask=bias),
                F.scaled_dot_product_attention(q, k, v, attn_mask=cudnn_bias.masked_fill(~causal, float("-inf"))),
                F.scaled_dot_product_attention(q, k, v, attn_mask=bias.masked_fill(~causal, float("-inf")),
                                               scale=0.5)]

    eager_in = [t.clone().requires_grad_() for t in (q, k, v, bias)]
    compiled_in = [t.clone().requires_grad_() for t in (q, k, v, bias)]
    expected, got = math(*eager_in), torch.compile(fused, backend="neuron")(*compiled_in)
    weighted_backward(expected, got, range(len(expected)), gen)
    for i, (e, g) in enumerate(zip(expected, got)):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-5, msg=lambda m, i=i: f"kernel {i}: {m}")
    for name, e, g in zip("qkv", eager_in, compiled_in):
        torch.testing.assert_close(g.grad, e.grad, rtol=1e-4, atol=1e-5, msg=lambda m, n=name: f"grad {n}: {m}")
    torch.testing.assert_close(compiled_in[3].grad, eager_in[3].grad, rtol=1e-4, atol=1e-5)


def test_dropout_in_a_fused_kernel_is_refused():
    q = torch.randn(1, 1, 2, 4)
    with pytest.raises(NotImplementedError, match="dropout_p > 0"):
        attention.flash_attention_for_cpu(q, q, q, 0.5)


def test_a_dropout_probability_out_of_range_is_an_error_compiled():
    """Eager raises torch's error; compiled, SDPA's dropout_p=1.5 drew a mask and returned zeros
    (``bernoulli`` of a probability out of range, as ``F.dropout``'s path calls it, drew too)."""
    q, k, v = (torch.randn(1, 1, 4, 8) for _ in range(3))
    for p in (1.5, 2.0):  # (a negative one is no dropout in torch's math path, as on the CPU)
        for device in ("cpu", "neuron"):
            with pytest.raises(Exception, match="(dropout probability has to be between 0 and 1|expects p to be in)"):
                torch.compile(lambda a, b, c, p=p: F.scaled_dot_product_attention(a, b, c, dropout_p=p),
                              backend="neuron")(q.to(device), k.to(device), v.to(device))
