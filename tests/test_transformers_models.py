"""Hugging Face ``transformers`` models: one training step under torch.compile(backend="neuron")
against eager, on host tensors and on ``neuron`` tensors.

Tiny configs, randomly initialised (nothing is downloaded), dropout off so the step is
deterministic, ``attn_implementation="sdpa"``: Llama with grouped-query attention (its SDPA
call has ``enable_gqa``, which failed to trace on the host), BERT with a padding mask
(transformers builds it from ``torch.arange`` on the input's device and ``mask.to(device,
torch.bool)``, which mixed cpu and neuron fake tensors in Dynamo), and GPT-2 (marked slow).
Each test compiles one model once (a forward and a backward graph) and checks the loss and
every gradient.
"""

from __future__ import annotations

import copy
import gc
from collections.abc import Callable

import pytest
import torch

import torch_neuronx  # noqa: F401  (the neuron device)

transformers = pytest.importorskip("transformers")

_BATCH, _LENGTH, _VOCAB = 2, 8, 128


@pytest.fixture(autouse=True)
def _collect_cycles():
    """Compiled frames hold neuron tensors in reference cycles: free them for the next test."""
    yield
    torch._dynamo.reset()
    gc.collect()


def _llama() -> torch.nn.Module:
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=_VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        attention_dropout=0.0, attn_implementation="sdpa"))


def _bert() -> torch.nn.Module:
    return transformers.BertForMaskedLM(transformers.BertConfig(
        vocab_size=_VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, max_position_embeddings=64, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0, attn_implementation="sdpa"))


def _gpt2() -> torch.nn.Module:
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=_VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64, resid_pdrop=0.0,
        embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0, attn_implementation="sdpa"))


def _batch() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, _VOCAB, (_BATCH, _LENGTH), generator=gen)
    mask = torch.ones(_BATCH, _LENGTH, dtype=torch.long)
    mask[1, 5:] = 0  # the second sequence is padded
    labels = ids.masked_fill(mask == 0, -100)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


_MODELS: dict[str, Callable[[], torch.nn.Module]] = {"llama_gqa": _llama, "bert": _bert, "gpt2": _gpt2}


_SLOW = pytest.mark.slow  # each compiles for one to two minutes on two cores: the fast cases cover both fixes


@pytest.mark.parametrize(("name", "device"), [
    pytest.param("llama_gqa", "cpu", marks=_SLOW),  # grouped-query attention on host tensors (CI time)
    ("bert", "neuron"),  # masks naming the device on neuron tensors
    pytest.param("llama_gqa", "neuron", marks=_SLOW),
    pytest.param("bert", "cpu", marks=_SLOW),
    # GPT-2 trained before these fixes; its graphs take IREE about a minute on two cores.
    pytest.param("gpt2", "cpu", marks=_SLOW),
    pytest.param("gpt2", "neuron", marks=_SLOW),
])
def test_a_training_step_matches_eager(name, device):
    torch.manual_seed(0)
    model = _MODELS[name]()
    model.train()
    compiled_model = copy.deepcopy(model).to(device)
    batch = _batch()

    expected = model(**batch).loss
    expected.backward()
    got = torch.compile(compiled_model, backend="neuron")(**{k: v.to(device) for k, v in batch.items()}).loss
    got.backward()

    assert got.device.type == device
    torch.testing.assert_close(got.detach().cpu(), expected.detach(), rtol=1e-4, atol=1e-5)
    compiled_params = dict(compiled_model.named_parameters())
    for param_name, p in model.named_parameters():
        q = compiled_params[param_name]
        if p.grad is None:
            assert q.grad is None, param_name
            continue
        assert q.grad.device.type == device, param_name
        torch.testing.assert_close(q.grad.cpu(), p.grad, rtol=1e-4, atol=1e-5,
                                   msg=lambda m, n=param_name: f"grad of {n}: {m}")
