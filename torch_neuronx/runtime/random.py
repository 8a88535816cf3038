"""The neuron devices' random number generators, and drawing a random op's value from one.

Random ops on neuron tensors run on the host (their values land in device memory), drawing from
their device's generator: a host ``torch.Generator`` per device index, whose state is a byte
tensor and whose sequence is the CPU generator's from the same seed. The eager device draws its
random ops here and so do compiled graphs (their random ops become inputs drawn on every call,
``compiler/passes/random_inputs.py``), so ``torch.neuron.manual_seed``, ``get_rng_state`` /
``set_rng_state`` and ``fork_rng`` govern both, and neither advances the host's generator.
The seeding API torch asks an accelerator for is ``device/random.py``.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Sequence
from typing import Any

import torch

from torch_neuronx import process

DEFAULT_SEED = torch.Generator().initial_seed()  # what torch's CPU generator starts from
_generators: dict[int, torch.Generator] = {}
_lock = threading.Lock()  # serializes draws of ops that can only use the host's default generator


@torch._disable_dynamo
def generator(device: Any = None) -> torch.Generator:
    """The generator of neuron device ``device`` (the current one when None)."""
    index = process.device_index(device)
    found = _generators.get(index)
    if found is None:
        if not 0 <= index < process.device_count():
            raise ValueError(f"neuron device {index} does not exist; device_count() is {process.device_count()}")
        found = _generators.setdefault(index, torch.Generator().manual_seed(DEFAULT_SEED))
    return found


@functools.cache
def _generator_position(func: Any) -> int | None:
    """Where ``func``'s schema takes its generator: a position, -1 for keyword-only, None for none."""
    for position, argument in enumerate(func._schema.arguments):
        if argument.name == "generator":
            return position if not argument.kwarg_only else -1
    return None


@torch._disable_dynamo
def draw(func: Any, args: Sequence[Any], kwargs: dict[str, Any], device: Any) -> Any:
    """Run the random op ``func`` on host tensors, drawing from ``device``'s generator.

    The generator is passed as the op's ``generator`` argument when the caller gave none;
    ops without one (dropout, the fused attention ops) run with the host's default
    generator set to the device's state for the call, and the advanced state kept.
    """
    position = _generator_position(func)
    if position is not None:
        if position >= 0 and len(args) > position:
            if args[position] is not None:
                return func(*args, **kwargs)
            return func(*args[:position], generator(device), *args[position + 1:], **kwargs)
        if kwargs.get("generator") is not None:
            return func(*args, **kwargs)
        return func(*args, **{**kwargs, "generator": generator(device)})
    own = generator(device)
    with _lock:
        host = torch.random.default_generator.get_state()
        torch.random.default_generator.set_state(own.get_state())
        try:
            return func(*args, **kwargs)
        finally:
            own.set_state(torch.random.default_generator.get_state())
            torch.random.default_generator.set_state(host)
