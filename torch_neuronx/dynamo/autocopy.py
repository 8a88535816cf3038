"""CPU inputs of a graph on the ``neuron`` device: copied there, or refused.

A Dynamo graph whose inputs include neuron tensors (a model moved with
``model.to("neuron")``: with inlined modules its parameters are graph inputs)
may be called with CPU tensors, ``compiled(x_cpu)``. As TorchNeuron does, the
backend copies such inputs to the device of the graph's neuron inputs before
the graph runs, so the graph computes as if it had been called with
``x_cpu.to("neuron")``: every output computed from them is a neuron tensor.
With ``TORCH_NEURONX_DYNAMO_DISABLE_CPU_AUTOCOPY=1`` the call raises
:class:`CpuInputError` instead, naming each CPU input.

What is left alone: graphs without neuron inputs (host graphs compile and run
on host tensors, the variable does not apply), and 0-dim CPU tensors, which
eager PyTorch lets join an op on any device as a scalar (an optimizer's
``step`` count).

The graph is traced with the copies' types: each CPU input is replaced by a
traced neuron tensor over Dynamo's own fake value (so its symbolic sizes are
Dynamo's), and the graph's output metadata is propagated again with them, so
the backend places every output the copies make on the device. At run time
:func:`copying_inputs` makes the copies (with the traced strides), lets
gradients flow back to a CPU input that requires them, and writes an input
the graph mutated back into the caller's CPU tensor.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch

from torch_neuronx import config, process
from torch_neuronx.runtime.tensor import NeuronTensor, from_cpu

VARIABLE = "TORCH_NEURONX_DYNAMO_DISABLE_CPU_AUTOCOPY"

_log = logging.getLogger("torch_neuronx.dynamo.autocopy")

__all__ = ["VARIABLE", "CpuInputError", "autocopy_disabled", "copying_inputs", "cpu_inputs",
           "refusing_inputs", "traced_as_neuron"]


class CpuInputError(RuntimeError):
    """A CPU tensor was passed to a compiled graph on the ``neuron`` device with autocopy disabled."""


def autocopy_disabled() -> bool:
    """Whether ``TORCH_NEURONX_DYNAMO_DISABLE_CPU_AUTOCOPY`` refuses CPU inputs (read per compilation)."""
    return bool(config.get(VARIABLE))


def cpu_inputs(example_inputs: Sequence[Any]) -> tuple[list[int], int]:
    """Positions of the CPU inputs to copy, and the neuron device index they go to.

    Empty when no input is a neuron tensor (a host graph). 0-dim CPU tensors are
    not listed: they join device ops as scalars, as in eager PyTorch.
    """
    device = next((a.device for a in example_inputs if isinstance(a, NeuronTensor)), None)
    if device is None:
        return [], 0
    positions = [i for i, a in enumerate(example_inputs)
                 if isinstance(a, torch.Tensor) and not isinstance(a, NeuronTensor)
                 and a.device.type == "cpu" and a.dim() > 0]
    return positions, device.index or 0


def _input_names(gm: torch.fx.GraphModule) -> list[str]:
    """The user-facing name of each graph input: Dynamo's source (``L['x']``), else the placeholder."""
    names = []
    for node in gm.graph.find_nodes(op="placeholder"):
        source = getattr(node.meta.get("grapharg"), "source", None)
        names.append(source.name if source is not None else node.name)
    return names


def _describe(name: str, position: int, t: torch.Tensor) -> str:
    return (f"{name} (graph input {position}: shape {tuple(t.shape)}, dtype {t.dtype}, "
            f"device {t.device})")


def refusing_inputs(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], positions: Sequence[int],
                    index: int) -> Callable[..., Any]:
    """What the backend returns with autocopy disabled: a graph that raises :class:`CpuInputError`.

    Dynamo guards each input's device, so every call that reaches this graph passes
    the same inputs on the CPU; none of it is compiled.
    """
    names = _input_names(gm)
    described = "; ".join(_describe(names[i], i, example_inputs[i]) for i in positions)
    some = "it" if len(positions) == 1 else "them"
    message = (
        f"a torch.compile(backend=\"neuron\") graph on neuron:{index} (its other inputs, such as the "
        f"model's parameters, are neuron tensors) was called with CPU tensor input(s): {described}. "
        f"{VARIABLE}=1 forbids copying CPU inputs to the device; move {some} there first "
        f"(x.to(\"neuron\")), or unset {VARIABLE} to have them copied on every call.")

    def refuse(*args: Any) -> Any:
        raise CpuInputError(message)

    return refuse


def traced_as_neuron(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], positions: Sequence[int],
                     index: int) -> list[Any]:
    """``example_inputs`` with the CPU inputs at ``positions`` as traced neuron tensors.

    Each is a neuron tensor (storage offset 0, as the copy will have) over the fake
    tensor aot_autograd would make of that input in the backend's fake mode, with
    Dynamo's symbolic sizes. ``gm``'s ``example_value`` metadata is propagated again
    with them, so the backend sees which outputs are now on the device.
    """
    from torch._dynamo.utils import to_fake_tensor
    from torch._subclasses.fake_tensor import FakeTensor

    fake_mode = torch._guards.TracingContext.get().fake_mode
    placeholders = list(gm.graph.find_nodes(op="placeholder"))
    inputs = list(example_inputs)
    values = []
    for i, (node, value) in enumerate(zip(placeholders, example_inputs, strict=True)):
        if isinstance(value, torch.Tensor):
            if not (isinstance(value, FakeTensor) and value.fake_mode is fake_mode):
                value = to_fake_tensor(value, fake_mode)  # memoized: aot_autograd gets the same fakes
            if i in positions:
                value = inputs[i] = NeuronTensor(value, None, value.requires_grad, index,
                                                 outer=(value.shape, value.stride(), 0))
        else:
            value = node.meta.get("example_value", value)  # a SymInt of the shared shape env
        values.append(value)
    _propagate(gm, values, fake_mode)
    return inputs


def _propagate(gm: torch.fx.GraphModule, values: Sequence[Any], fake_mode: Any) -> None:
    """Run ``gm`` on fake ``values`` and make each node's result its ``example_value``.

    Grad mode is restored afterwards (a graph may toggle it). Should the graph not run
    on the new values, its metadata is left as it was: the outputs computed from CPU
    inputs alone then stay on the host, everything else still works.
    """
    interpreter = torch.fx.Interpreter(gm, garbage_collect_values=False)
    try:
        with fake_mode, torch.set_grad_enabled(torch.is_grad_enabled()):
            interpreter.run(*values)
    except Exception as exc:
        _log.debug("could not propagate neuron inputs through %s (%s: %s); its outputs computed from "
                   "CPU inputs alone stay on the host", gm.__class__.__name__, type(exc).__name__, exc)
        return
    for node, value in interpreter.env.items():
        if node.op != "output":
            node.meta["example_value"] = value


class _ToDevice(torch.autograd.Function):
    """A CPU input's copy on the device; its gradient goes back to the CPU input."""

    @staticmethod
    def forward(ctx: Any, t: torch.Tensor, index: int) -> NeuronTensor:  # type: ignore[override]
        return from_cpu(t, stride=t.stride(), index=index)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        return grad.to("cpu"), None


def copying_inputs(fn: Callable[..., Any], positions: Sequence[int], index: int) -> Callable[..., Any]:
    """``fn`` called with its CPU inputs at ``positions`` copied to ``neuron:index``.

    A copy keeps the input's strides (the graph was traced with them). An input
    that requires grad is copied differentiably; an input the graph mutated is
    written back into the caller's tensor.
    """

    def call(*args: Any) -> Any:
        args = list(args)
        originals = []
        for i in positions:
            t = args[i]
            if t.requires_grad and torch.is_grad_enabled():
                copy = _ToDevice.apply(t, index)
            elif torch.is_inference_mode_enabled():
                # an inference tensor has no version counter to tell whether the graph wrote into it
                with torch.inference_mode(False):
                    copy = from_cpu(t, stride=t.stride(), index=index)
            else:
                copy = from_cpu(t, stride=t.stride(), index=index)
            originals.append((t, copy, copy._version))
            args[i] = copy
        results = fn(*args)
        for t, copy, version in originals:
            if copy._version != version:  # the graph wrote into the input
                with torch.no_grad():
                    t.copy_(copy)
        return results

    return call


def call_device(args: Sequence[Any]) -> int:
    """The device index of a compiled graph's call: its neuron inputs' (the current device's when
    it has none). Inputs of two neuron devices get eager's error: the graph ran on such a mix and
    put its outputs on device 0 (``neuron:1`` inputs gave ``neuron:0`` outputs)."""
    index = -1
    for a in args:
        if isinstance(a, NeuronTensor) and a._index != index:
            if index >= 0:
                raise RuntimeError("Expected all tensors to be on the same device, but found at least two "
                                   f"devices, neuron:{index} and neuron:{a._index}! (when checking the "
                                   "inputs of a graph compiled with backend='neuron')")
            index = a._index
    return index if index >= 0 else process.current_device()


def run_on(index: int, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` with ``neuron:index`` the current device (a compiled graph's call, on its
    inputs' device: its launch ran on the current device's stream, and the profiler put a graph of
    ``neuron:1`` inputs on ``neuron:0``'s track)."""
    previous = process.current_device()
    if previous == index:
        return fn(*args)
    process.set_current_device(index)
    try:
        return fn(*args)
    finally:
        process.set_current_device(previous)
