"""One device object per index: neuron:N tensors, their own allocator, ops that stay on their device."""

from __future__ import annotations

import pytest
import torch

import torch_neuronx  # noqa: F401  (registers the neuron device)
from torch_neuronx import config
from torch_neuronx.runtime import device as devices


@pytest.fixture
def two_devices():
    with config.override(TORCH_NEURONX_VISIBLE_DEVICES=(0, 1)):
        yield
    torch.neuron.set_device(0)


def test_one_device_unless_told(monkeypatch):
    monkeypatch.delenv("TORCH_NEURONX_VISIBLE_DEVICES", raising=False)
    assert torch.neuron.device_count() == 1
    with pytest.raises(ValueError, match="does not exist"):
        torch.empty(2, device="neuron:1")


def test_device_objects_per_index(two_devices):
    first, second = devices.device(0), devices.device(torch.device("neuron", 1))
    assert first is devices.device("neuron:0") and second is devices.device(1)
    assert [d.index for d in devices.devices()] == [0, 1]
    assert first.allocator is not second.allocator
    assert second.default_stream.device_index == 1
    with pytest.raises(ValueError, match="device_count"):
        devices.device(2)


def test_tensors_and_ops_stay_on_their_device(two_devices):
    before = (torch.neuron.memory_allocated(0), torch.neuron.memory_allocated(1))
    a = torch.arange(4, dtype=torch.float32).to("neuron:1")
    b = a * 2 + 1
    assert a.device == b.device == torch.device("neuron", 1)
    torch.testing.assert_close(b.cpu(), torch.arange(4, dtype=torch.float32) * 2 + 1)
    assert torch.neuron.memory_allocated(1) > before[1]
    assert torch.neuron.memory_allocated(0) == before[0]
    moved = b.to("neuron:0")
    assert moved.device == torch.device("neuron", 0)
    torch.testing.assert_close(moved.cpu(), b.cpu())
    assert b[1:].device == torch.device("neuron", 1)  # views too
    linear = torch.nn.Linear(4, 3).to("neuron:1")
    assert linear(a).device == torch.device("neuron", 1)
    assert torch.randn(3, device="neuron:1").device == torch.device("neuron", 1)


def test_mixing_devices_is_an_error_naming_both(two_devices):
    a, b = torch.ones(3, device="neuron:0"), torch.ones(3, device="neuron:1")
    with pytest.raises(RuntimeError, match="neuron:0 and neuron:1"):
        a + b


def test_current_device_places_factories(two_devices):
    torch.neuron.set_device(1)
    assert torch.neuron.current_device() == 1
    assert torch.zeros(2, device="neuron").device == torch.device("neuron", 1)
    with torch.neuron.device(0):
        assert torch.zeros(2, device="neuron").device == torch.device("neuron", 0)
    assert torch.neuron.current_device() == 1
    with pytest.raises(ValueError, match="does not exist"):
        torch.neuron.set_device(2)


def test_like_and_new_ops_make_their_result_on_the_device_named(two_devices):
    """``zeros_like(x, device="cpu")`` and the other ``*_like`` / ``new_*`` ops with a ``device=``
    made their result on ``x``'s device (a neuron tensor where a CPU one was asked for, neuron:1
    where neuron:0 was)."""
    x = torch.arange(6.0, device="neuron:1").view(2, 3).t()
    calls = {"zeros_like": lambda d: torch.zeros_like(x, device=d), "ones_like": lambda d: torch.ones_like(x, device=d),
             "full_like": lambda d: torch.full_like(x, 2.5, device=d),
             "empty_like": lambda d: torch.empty_like(x, device=d).fill_(1),
             "new_zeros": lambda d: x.new_zeros((2, 2), device=d),
             "new_full": lambda d: x.new_full((2,), 3.0, device=d),
             "new_ones": lambda d: x.new_ones(3, device=d, dtype=torch.int64)}
    for name, call in calls.items():
        for device in ("cpu", "neuron:0", "neuron:1"):
            made = call(device)
            assert made.device == torch.device(device), (name, device, made.device)
            torch.testing.assert_close(made.cpu(), call("cpu"))
    assert torch.zeros_like(x, device="cpu").stride() == torch.zeros_like(x.cpu()).stride()
    assert torch.randn_like(x, device="cpu").device == torch.device("cpu")


def test_new_tensor_and_the_legacy_constructor_stay_on_the_tensors_device(two_devices):
    """``x1.new_tensor(data)`` and ``x1.new(data)`` of a neuron:1 tensor landed on neuron:0."""
    x = torch.ones(2, device="neuron:1")
    made = {"new_tensor": x.new_tensor([1.0, 2.0]), "new_tensor of a tensor": x.new_tensor(torch.ones(2)),
            "new of data": x.new([1.0, 2.0]), "new of sizes": x.new(2, 3), "new of nothing": x.new()}
    for name, tensor in made.items():
        assert tensor.device == x.device, (name, tensor.device)
    assert made["new_tensor"].tolist() == [1.0, 2.0] and made["new of sizes"].shape == (2, 3)
    assert x.new_tensor([1], device="neuron:0").device == torch.device("neuron:0")
    assert x.new_tensor([1], device="cpu").device == torch.device("cpu")
    typed = x.new_tensor([1, 2], dtype=torch.float16, requires_grad=True)
    assert typed.dtype == torch.float16 and typed.requires_grad and typed.device == x.device


def test_torch_accelerator_sets_and_reads_the_current_device(two_devices):
    """``torch.accelerator.set_device_index`` and ``device_index`` left neuron's current device
    unchanged, and ``current_device_index`` ignored ``torch.neuron.set_device``."""
    torch.accelerator.set_device_index(1)
    assert torch.accelerator.current_device_index() == 1 == torch.neuron.current_device()
    assert torch.empty(1, device="neuron").device == torch.device("neuron", 1)
    torch.neuron.set_device(0)
    assert torch.accelerator.current_device_index() == 0
    with torch.accelerator.device_index(1):
        assert torch.ones(1, device="neuron").device == torch.device("neuron", 1)
    assert torch.accelerator.current_device_index() == 0
    with torch.accelerator.device_index(None):
        assert torch.accelerator.current_device_index() == 0
