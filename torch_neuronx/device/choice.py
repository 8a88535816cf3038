"""Which kernel an eager call runs: its shapes' own, or its op family's dynamic-shape kernel.

An op family's first shapes (:data:`SHAPES_BEFORE_DYNAMIC`) get kernels of their own; the next
gets the family's dynamic-shape kernel (``device/kernels.py``), checked once against the CPU,
which serves every later new shape; a shape that runs on it and keeps coming back gets its own
kernel (:data:`PROMOTE_AFTER_S`). A call seen before finds its key from a cheap signature.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch

from torch_neuronx import config, observe
from torch_neuronx.device import kernels, queued
from torch_neuronx.runtime.tensor import NeuronTensor

#: (op, argument signature) -> the key whose kernel served it: a call seen before skips computing its
#: dynamic and dispatch keys. Holds keys, not kernels, so what ``_kernels`` says stays the truth.
_seen: dict[tuple, tuple] = {}
_SEEN_LIMIT = 1 << 16
_PLAIN = (int, float, bool, str, type(None))


def _signature(func: Any, args: Sequence[Any], dynamic: bool) -> tuple | None:
    """What a positional call's kernel depends on, cheaply: each tensor's class, shape, strides and
    dtype, each scalar's type and value; None when an argument is anything else (a list)."""
    sig: list[Any] = [func, dynamic]
    for a in args:
        if isinstance(a, NeuronTensor):
            sig += (NeuronTensor, a.shape, a.stride(), a.dtype)
        elif isinstance(a, torch.Tensor):  # a host (or meta) tensor: where it lives is part of the key
            sig += (a.device.type, a.shape, a.stride(), a.dtype)
        elif type(a) is float:  # by its spelling: -0.0 equals 0.0, and NaN is not itself
            sig += (float, a.hex())
        elif type(a) in _PLAIN:
            sig += (type(a), a)
        else:
            return None
    return tuple(sig)


def kernel_for(func: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    """The kernel a call runs: its op family's dynamic-shape kernel where the op has one
    (TORCH_NEURONX_EAGER_DYNAMIC_SHAPES) and this shape has no kernel of its own, else the
    kernel of its shapes and strides."""
    dynamic = config.get("TORCH_NEURONX_EAGER_DYNAMIC_SHAPES")
    if dynamic and func in _ROW_OPS and _longest(args) > LONG_ROW:
        dynamic = False
    sig = None if kwargs else _signature(func, args, dynamic)
    if sig is not None:
        key = _seen.get(sig)
        if key is not None:
            kernel = kernels.registry.get(key)
            if kernel is not None and kernel is not kernels.STATIC:
                if key[0] == "dynamic":
                    return _maybe_promote(func, args, kwargs, sig, kernel)
                return kernel
    key, kernel = _find_kernel(func, args, kwargs, dynamic)
    if sig is not None:
        if len(_seen) >= _SEEN_LIMIT:
            _seen.clear()
            _hot.clear()
        _seen[sig] = key
    return kernel


_aten = torch.ops.aten
#: Ops that reduce a row and use the result across it, whose dynamic-shape code took time quadratic
#: in a long row (a softmax of 2 x 1e4: 0.3 s, 2 x 1e5: 25 s, 2 x 1e6: not back in minutes; IREE
#: fuses the reduction into its consumer when the row is symbolic): past LONG_ROW, a kernel per shape.
_ROW_OPS = frozenset({_aten._softmax.default, _aten._log_softmax.default, _aten.logsumexp.default,
                      _aten._softmax_backward_data.default, _aten._log_softmax_backward_data.default,
                      _aten.native_layer_norm.default, _aten.native_layer_norm_backward.default})
LONG_ROW = 8192


def _longest(args: Sequence[Any]) -> int:
    """The longest dimension of the call's first tensor argument (0 without one)."""
    first = next((a for a in args if isinstance(a, torch.Tensor)), None)
    return max(first.shape, default=0) if first is not None else 0


#: Seconds a shape keeps being called on its family's dynamic kernel before it gets a kernel of its
#: own: a shape that keeps coming back (a fixed-shape loop's, a bucket's) then runs the faster
#: static code. Counting calls promoted every shape a training step uses twice (repeated layers,
#: forward and backward): with a new sequence length every step, every step compiled again.
PROMOTE_AFTER_S = 2.0
#: ... and only while it makes at least this share of its family's calls since its first one (over
#: at least PROMOTE_MIN_CALLS of them): with random sequence lengths every length came back after
#: 2 s and got kernels of its own, and a training run kept compiling for epochs.
PROMOTE_SHARE = 0.25
PROMOTE_MIN_CALLS = 8
_hot: dict[tuple, list] = {}  # signature -> [first call on the dynamic kernel (monotonic), family calls then, calls]
_family_calls: dict[int, int] = {}  # id of a dynamic kernel -> its calls so far


def _maybe_promote(func: Any, args: Sequence[Any], kwargs: dict[str, Any], sig: tuple, kernel: Any) -> Any:
    """``kernel`` (a dynamic one) for this call, or, once its shape is hot, the shape's own kernel."""
    now = time.monotonic()
    family = id(kernel)
    total = _family_calls[family] = _family_calls.get(family, 0) + 1
    entry = _hot.setdefault(sig, [now, total - 1, 0])
    entry[2] += 1
    since = total - entry[1]
    if now - entry[0] < PROMOTE_AFTER_S or since < PROMOTE_MIN_CALLS or entry[2] < PROMOTE_SHARE * since:
        return kernel
    key = kernels.dispatch_key(func, args, kwargs)
    own = kernels.registry.get(key) or kernels.compiled_kernel(func, key, args, kwargs, False)
    if not isinstance(own, kernels.Kernel):  # no kernel of its own (it would fall back): stay dynamic
        return kernel
    observe.count("eager_shapes_promoted")
    _seen[sig] = key
    return own


#: Dynamic key of an op family -> how many shapes got a kernel of their own so far.
_families: dict[tuple, int] = {}
#: Shapes of an op family that get kernels of their own before its dynamic-shape kernel is made.
SHAPES_BEFORE_DYNAMIC = 2


def _find_kernel(func: Any, args: Sequence[Any], kwargs: dict[str, Any], dynamic: bool) -> tuple[tuple, Any]:
    """The key and kernel of a call (compiled on the first call of its key).

    The first shapes of an op family (:data:`SHAPES_BEFORE_DYNAMIC`) get kernels of their own, as
    fast as the op can run; the next gets the family's dynamic-shape kernel (compiled then, or
    found in the HLO cache), which serves every later new shape. IREE's code for dynamic sizes is
    slower (a 64x1024 softmax: 4 ms against 0.15 ms), so fixed-shape programs, whose families
    rarely have three shapes, never make one, and a shape that comes back gets its own kernel.
    """
    key = kernels.dispatch_key(func, args, kwargs)
    kernel = kernels.registry.get(key)
    if kernel is not None:
        return key, kernel
    family = kernels.dynamic_key(func, args, kwargs) if dynamic else None
    if family is not None:
        kernel = kernels.registry.get(family)
        if kernel is None and (_families.get(family, 0) >= SHAPES_BEFORE_DYNAMIC or kernels.stored(family)):
            kernel = _dynamic_kernel(func, family, args, kwargs)
        if kernel is None:
            _families[family] = _families.get(family, 0) + 1
        elif kernel is not kernels.STATIC:
            return family, kernel
    return key, kernels.compiled_kernel(func, key, args, kwargs, False)


#: Ops whose dynamic-shape kernel is not even run to be checked: it crashed the process
#: (``native_batch_norm_backward``'s linalg lowering wrote out of bounds inside the runtime: a
#: BatchNorm2d training loop died of SIGSEGV at its epoch's last, smaller batch).
_PER_SHAPE = frozenset({torch.ops.aten.native_batch_norm_backward.default})


def _dynamic_kernel(func: Any, family: tuple, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    """The family's dynamic-shape kernel, checked against the CPU once; :data:`kernels.STATIC` when
    the op has none."""
    if func in _PER_SHAPE:
        kernels.registry[family] = kernels.STATIC
        return kernels.STATIC
    kernel = kernels.compiled_kernel(func, family, args, kwargs, True)
    if not isinstance(kernel, kernels.Kernel):
        return kernel
    verdict = queued.synchronized(args, kwargs, kernels.agrees_with_cpu, kernel, func, args, kwargs)
    if verdict is None:  # bad input: this call runs its shape's kernel (which raises), the next decides
        del kernels.registry[family]
        return kernels.STATIC
    if not verdict:
        kernel = kernels.registry[family] = kernels.STATIC
        kernels.mark_static(family)
    return kernel
