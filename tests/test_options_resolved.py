"""A compilation resolves its options and the environment once, at the frontend, into one immutable value."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from torch_neuronx.compiler import CompileOptions, options, targets


def test_one_training_compile_resolves_target_and_flags_once(monkeypatch):
    calls = {"resolve": 0, "flags": 0}
    real_resolve, real_flags = targets.resolve, options.CompileOptions.compiler_flags

    def counting_resolve(*args, **kwargs):
        calls["resolve"] += 1
        return real_resolve(*args, **kwargs)

    def counting_flags(self, *args, **kwargs):
        calls["flags"] += 1
        return real_flags(self, *args, **kwargs)

    monkeypatch.setattr(targets, "resolve", counting_resolve)
    monkeypatch.setattr(options.CompileOptions, "compiler_flags", counting_flags)
    torch._dynamo.reset()
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 1))
    compiled = torch.compile(model, backend="neuron", options=CompileOptions(model_name="resolved_once"))
    x = torch.randn(3, 6)
    compiled(x).sum().backward()  # a forward and a (lazily compiled) backward graph
    expected = torch.autograd.grad(model(x).sum(), model[0].weight)[0]
    torch.testing.assert_close(model[0].weight.grad, expected, rtol=1e-5, atol=1e-6)
    assert calls == {"resolve": 1, "flags": 2}  # flags: with and without float64 kept


def test_resolved_options_are_immutable_and_carry_the_environment(monkeypatch):
    monkeypatch.setenv("TORCH_NEURONX_COMPILER_FLAGS", "--iree-llvmcpu-loop-unrolling=false")
    monkeypatch.setenv("TORCH_NEURONX_PRESERVE_COMPILATION_ARTIFACTS", "1")
    resolved = CompileOptions(fallback_execution=True).resolve()
    monkeypatch.delenv("TORCH_NEURONX_COMPILER_FLAGS")  # later changes do not reach a resolved value
    assert "--iree-llvmcpu-loop-unrolling=false" in resolved.compiler_flags()
    assert resolved.compiler_config()["flags"] == resolved.compiler_flags()
    assert resolved.preserve_artifacts and resolved.fallback
    with pytest.raises(dataclasses.FrozenInstanceError):
        resolved.fallback = False  # type: ignore[misc]


def test_an_unknown_target_fails_when_resolved():
    with pytest.raises(ValueError, match="unknown target"):
        CompileOptions(target="tpu").resolve()
