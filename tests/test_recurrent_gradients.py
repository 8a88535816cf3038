"""Recurrent layers' gradients on the eager device, the shapes where IREE miscompiled them.

IREE 3.13 at O3 miscompiled the GRU cell's backward at batch 1 (its two results are
concatenations sharing operands): the input gradient came back all zeros and the hidden
gradient held the input gradient's values, silently (a training step 2.1 off). Packed
sequences whose batch shrinks to 1 hit it at any batch size.
"""

from __future__ import annotations

import copy

import pytest
import torch

from torch_neuronx.compiler import targets


def _gradients(module: torch.nn.Module, *inputs: torch.Tensor) -> list[torch.Tensor]:
    out = module(*inputs)
    out = out[0] if isinstance(out, tuple) else out
    if isinstance(out, torch.nn.utils.rnn.PackedSequence):
        out = out.data
    (out * torch.linspace(-1, 1, out.shape[-1], device=out.device)).sum().backward()
    return [p.grad.cpu() for p in module.parameters()]


@pytest.mark.parametrize("layer, batch", [  # GRU at batch 3 in the slow lane (CI time): batch 1 stays
    ("GRU", 1), ("GRUCell", 1), ("LSTM", 1), pytest.param("GRU", 3, marks=pytest.mark.slow), ("GRUCell", 3),
    ("LSTM", 3)])
def test_recurrent_gradients_match_the_cpu_at_every_batch(layer, batch):
    torch.manual_seed(batch)
    cpu = getattr(torch.nn, layer)(4, 3)
    device = copy.deepcopy(cpu).to("neuron")
    x = torch.randn(batch, 4) if layer == "GRUCell" else torch.randn(5, batch, 4)
    for expected, got in zip(_gradients(cpu, x), _gradients(device, x.to("neuron"))):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


def test_a_packed_gru_whose_batch_shrinks_to_one_trains_as_on_the_cpu():
    torch.manual_seed(0)
    cpu = torch.nn.GRU(4, 3)
    device = copy.deepcopy(cpu).to("neuron")
    x, lengths = torch.randn(6, 3, 4), torch.tensor([6, 2, 4])
    packed = torch.nn.utils.rnn.pack_padded_sequence(x, lengths, enforce_sorted=False)
    packed_device = torch.nn.utils.rnn.pack_padded_sequence(x.to("neuron"), lengths, enforce_sorted=False)
    for expected, got in zip(_gradients(cpu, packed), _gradients(device, packed_device)):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


def test_only_modules_with_concatenations_sharing_an_operand_get_the_conservative_flag():
    shared = "%2 = stablehlo.concatenate %0, %1, dim = 1 : t\n%3 = stablehlo.concatenate %0, %9, dim = 1 : t"
    apart = "%2 = stablehlo.concatenate %0, %1, dim = 1 : t\n%3 = stablehlo.concatenate %4, %9, dim = 1 : t"
    assert targets.module_flags(shared, "iree") == targets.SHARED_CONCAT_FLAGS
    assert targets.module_flags(apart, "iree") == () and targets.module_flags(shared, "neuronx-cc") == ()
