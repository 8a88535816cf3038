"""The neuron devices' random number generators, and the RNG state API torch asks an accelerator for.

Each neuron device has its own generator, as each CUDA device has: ``torch.manual_seed``
seeds them all (through :func:`manual_seed_all`), ``torch.neuron.manual_seed`` the
current one, and ``torch.random.fork_rng``, ``torch.utils.checkpoint`` and Dynamo
save and restore them through :func:`get_rng_state` / :func:`set_rng_state`. Random
ops on neuron tensors, eager and compiled, draw from their device's generator
(``runtime/random.py``). Dynamo never traces these
functions (as it skips ``torch.cuda``'s): the RNG state it saves and restores around a
graph with random ops would otherwise be traced as tensor ops of the graph.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from torch_neuronx.runtime.random import draw, generator  # noqa: F401 - the device API names them


def _index(device: Any) -> int:
    from torch_neuronx.process import device_index

    return device_index(device)


def _count() -> int:
    from torch_neuronx.device import module

    return module.device_count()


@torch._disable_dynamo
def generators() -> tuple[torch.Generator, ...]:
    """One generator per neuron device, as ``torch.cuda.default_generators``."""
    return tuple(generator(i) for i in range(_count()))


@torch._disable_dynamo
def get_rng_state(device: Any = "neuron") -> torch.Tensor:
    """The state of a device's generator, as a ``torch.ByteTensor`` (on the host, as CUDA's)."""
    return generator(device).get_state()


@torch._disable_dynamo
def set_rng_state(new_state: torch.Tensor, device: Any = "neuron") -> None:
    """Set a device's generator to ``new_state`` (from :func:`get_rng_state`)."""
    if not isinstance(new_state, torch.Tensor) or new_state.dtype != torch.uint8:
        raise TypeError(f"set_rng_state expects a torch.ByteTensor from get_rng_state, got {type(new_state)!r}")
    generator(device).set_state(new_state.detach().cpu().contiguous())


@torch._disable_dynamo
def get_rng_state_all() -> list[torch.Tensor]:
    """The states of every device's generator."""
    return [get_rng_state(i) for i in range(_count())]


@torch._disable_dynamo
def set_rng_state_all(new_states: Iterable[torch.Tensor]) -> None:
    """Set every device's generator, in device order."""
    for index, state in enumerate(new_states):
        set_rng_state(state, index)


@torch._disable_dynamo
def manual_seed(seed: int) -> None:
    """Seed the current device's generator."""
    generator().manual_seed(int(seed))


@torch._disable_dynamo
def manual_seed_all(seed: int) -> None:
    """Seed every device's generator (``torch.manual_seed`` calls this)."""
    for index in range(_count()):
        generator(index).manual_seed(int(seed))


@torch._disable_dynamo
def seed() -> None:
    """Seed the current device's generator with a non-deterministic random number."""
    generator().seed()


@torch._disable_dynamo
def seed_all() -> None:
    """Seed every device's generator with one non-deterministic random number."""
    value = torch.Generator().seed()
    manual_seed_all(value)


@torch._disable_dynamo
def initial_seed() -> int:
    """The seed the current device's generator started from."""
    return generator().initial_seed()


# -- torch.Generator(device="neuron") --------------------------------------------------------

_HostGenerator = torch._C.Generator


class NeuronGenerator(_HostGenerator):
    """A generator of a neuron device, made by ``torch.Generator(device="neuron")``.

    Random ops on neuron tensors draw on the host, so it is a host generator underneath (the
    same sequence the CPU generator gives from the same seed) that reports its device as
    ``neuron:<index>``; ops given it (``torch.randn(..., generator=g, device="neuron")``) draw
    from it. Copied or pickled, it stays a neuron generator with its state.
    """

    _index = 0

    @property
    def device(self) -> torch.device:  # type: ignore[override]
        return torch.device("neuron", self._index)

    def __reduce__(self) -> tuple[Any, ...]:
        return _restore, (self._index, self.get_state())


def _restore(index: int, state: torch.Tensor) -> NeuronGenerator:
    made = _new_neuron_generator(index)
    made.set_state(state)
    return made


def _new_neuron_generator(index: int) -> NeuronGenerator:
    if not 0 <= index < _count():
        raise RuntimeError(f"neuron device {index} does not exist; device_count() is {_count()}")
    made = NeuronGenerator()
    made._index = index
    return made


class _GeneratorType(type(_HostGenerator)):
    """``isinstance(g, torch.Generator)`` holds for every generator, as before :func:`install`."""

    def __instancecheck__(cls, instance: Any) -> bool:
        return isinstance(instance, _HostGenerator)

    def __subclasscheck__(cls, subclass: type) -> bool:
        return issubclass(subclass, _HostGenerator)


class Generator(_HostGenerator, metaclass=_GeneratorType):
    """``torch.Generator``, which also makes the generators of neuron devices.

    torch 2.13 asks a PrivateUse1 backend for a new generator through a C++ hook its Python
    interface does not offer (``getNewGenerator``): ``torch.Generator(device="neuron")`` raised
    NotImplementedError. Every other device goes to torch's own constructor, unchanged.
    """

    def __new__(cls, device: Any = None) -> Any:  # noqa: D102
        if device is not None:
            parsed = torch.device(device) if not isinstance(device, int) else None
            if parsed is not None and parsed.type == "neuron":
                return _new_neuron_generator(_index(parsed))
            return _HostGenerator(device)
        return _HostGenerator()


def install() -> None:
    """Make ``torch.Generator`` the class above (idempotent)."""
    if torch.Generator is _HostGenerator:
        Generator.__module__, Generator.__qualname__ = "torch", "Generator"
        torch.Generator = Generator  # type: ignore[misc]
