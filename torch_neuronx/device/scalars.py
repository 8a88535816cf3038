"""Python scalars of eager ops as runtime inputs of their kernels, not constants baked into them.

An optimizer's step-dependent floats (AdamW's ``value=-step_size`` and bias
corrections, a scheduler's learning rate) would otherwise be part of each op's
dispatch key, so every step would compile new kernels. A float argument of an op
on float32/float64 tensors becomes a 0-d tensor input of the kernel instead:

- in an argument the schema types ``Tensor`` (``t / 0.05``) it is passed as is: a
  0-d tensor of the same dtype category never changes the result dtype of
  dimensioned tensors, as a Python number does not;
- in a ``Scalar`` argument (``addcdiv(..., value=s)``, ``add(..., alpha=s)``,
  ``lerp(..., weight=s)``, ``mul.Scalar``) the op is traced as the arithmetic it
  performs with that tensor (:data:`REWRITES`); other ``Scalar`` arguments stay
  constants of the kernel.

Python ints in those same places are data too (``x * step``, ``x + 1``) and become
runtime inputs the same way, converted to the tensors' float type as eager converts
them. On int32/int64 tensors (positions, lengths, counters: a generation loop's
``cache_position + 1`` and ``cur_len == max_length``, new every token) an int becomes
a 0-d tensor of the tensors' dtype when it fits that dtype; a float there stays a
constant (a 0-d float tensor would promote as a Python float does not). Comparisons
with a number (``eq``/``ne``/``lt``/``le``/``gt``/``ge``) and ``rsub`` take it at run
time too. On float16/bfloat16 tensors the numbers of :data:`NARROW_OPS` (arithmetic, ``lerp``,
comparisons) are float32 0-d tensors, rounded first to the tensors' dtype where torch rounds
them (:data:`ROUNDED_OPS`). Ints anywhere else (sizes, dimensions, an exponent, a fill value) and
booleans stay constants, and so does every scalar of an op on other dtypes. The 0-d tensors
are cached per value and dtype (TORCH_NEURONX_ENABLE_SCALAR_CACHE, default 1), so a
loop does not build them again.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch

from torch_neuronx import config
from torch_neuronx.compiler.decompositions import precision

aten = torch.ops.aten
_RUNTIME_DTYPES = (torch.float32, torch.float64)
_INT_RANGES = {torch.int32: (-(2**31), 2**31 - 1), torch.int64: (-(2**63), 2**63 - 1)}
_CACHE_ENTRIES = 4096


def _add(self: Any, other: Any, *, alpha: Any = 1) -> Any:
    return aten.add.Tensor(self, aten.mul.Tensor(other, alpha)) if isinstance(alpha, torch.Tensor) \
        else aten.add.Tensor(self, other, alpha=alpha)


def _sub(self: Any, other: Any, *, alpha: Any = 1) -> Any:
    return aten.sub.Tensor(self, aten.mul.Tensor(other, alpha)) if isinstance(alpha, torch.Tensor) \
        else aten.sub.Tensor(self, other, alpha=alpha)


def _addcdiv(self: Any, tensor1: Any, tensor2: Any, *, value: Any = 1) -> Any:
    # float32/float64: self + value * (tensor1 / tensor2). (torch's CPU kernel multiplies first; the
    # orders differ in the last bit, and a bucketed DDP AdamW run matched its CPU reference this way.)
    return aten.add.Tensor(self, aten.mul.Tensor(aten.div.Tensor(tensor1, tensor2), value))


def _addcdiv_left_to_right(self: Any, tensor1: Any, tensor2: Any, *, value: Any = 1) -> Any:
    # torch's float16/bfloat16 kernel: self + value * tensor1 / tensor2 in float32, left to right.
    return aten.add.Tensor(self, aten.div.Tensor(aten.mul.Tensor(tensor1, value), tensor2))


_addcdiv_narrow = precision.in_float32(aten.addcdiv.default, _addcdiv_left_to_right)


def _addcdiv_rewrite(self: Any, tensor1: Any, tensor2: Any, *, value: Any = 1) -> Any:
    if self.dtype in precision.NARROW:
        return _addcdiv_narrow(self, tensor1, tensor2, value=value)
    return _addcdiv(self, tensor1, tensor2, value=value)


def _addcmul(self: Any, tensor1: Any, tensor2: Any, *, value: Any = 1) -> Any:
    # Eager's kernel: self + value * tensor1 * tensor2, the product taken left to right.
    return aten.add.Tensor(self, aten.mul.Tensor(aten.mul.Tensor(tensor1, value), tensor2))


def _lerp(self: Any, end: Any, weight: Any) -> Any:
    if self.dtype in precision.NARROW:  # eager takes the weight in float32, unrounded (an EMA's 0.999)
        return precision.in_float32(aten.lerp.Tensor, None)(self, end, weight)
    return aten.lerp.Tensor(self, end, aten._to_copy.default(weight, dtype=self.dtype))


def _as_tensor_op(scalar_op: Any, tensor_op: Any) -> Callable[..., Any]:
    """``scalar_op`` called with its number as a runtime 0-d tensor: ``tensor_op`` (as it is otherwise),
    the number first rounded to a float16/bfloat16 ``self``'s dtype, as eager compares."""
    def call(self: Any, other: Any, **kwargs: Any) -> Any:
        if not isinstance(other, torch.Tensor):
            return scalar_op(self, other, **kwargs)
        if self.dtype in precision.NARROW and other.dtype != self.dtype:  # (rounded on the host already)
            other = aten._to_copy.default(other, dtype=self.dtype)
        return tensor_op(self, other, **kwargs)
    return call


#: Functional ops whose ``Scalar`` arguments may be runtime tensors, traced as this arithmetic (float16
#: and bfloat16 computed in float32 and rounded once, the compile path's rule: ``precision.in_float32``).
REWRITES: dict[Any, Callable[..., Any]] = {
    aten.add.Tensor: precision.in_float32(aten.add.Tensor, _add),
    aten.sub.Tensor: precision.in_float32(aten.sub.Tensor, _sub),
    aten.addcdiv.default: _addcdiv_rewrite,
    aten.addcmul.default: precision.in_float32(aten.addcmul.default, _addcmul),
    aten.lerp.Scalar: _lerp,
    aten.mul.Scalar: lambda self, other: aten.mul.Tensor(self, other),
    aten.div.Scalar: lambda self, other: aten.div.Tensor(self, other),
    aten.rsub.Scalar: _as_tensor_op(aten.rsub.Scalar, aten.rsub.Tensor),
    **{getattr(aten, name).Scalar: _as_tensor_op(getattr(aten, name).Scalar, getattr(aten, name).Tensor)
       for name in ("eq", "ne", "lt", "le", "gt", "ge")},
}


#: The ops whose numbers are runtime inputs of float16/bfloat16 kernels too: 0-d float32 tensors,
#: which each rewrite or ``precision.in_float32`` uses as eager does (mul, div, addcdiv, addcmul and
#: lerp compute with the number as it is; add, sub, rsub and comparisons round it to the tensors' dtype).
NARROW_OPS = frozenset((
    aten.add.Tensor, aten.sub.Tensor, aten.mul.Tensor, aten.div.Tensor, aten.rsub.Scalar,
    aten.addcdiv.default, aten.addcmul.default, aten.lerp.Scalar, aten.mul.Scalar, aten.div.Scalar,
    *(getattr(aten, name).Scalar for name in ("eq", "ne", "lt", "le", "gt", "ge")),
))


#: Those of :data:`NARROW_OPS` whose numbers torch rounds to the tensors' dtype: their runtime
#: scalars are rounded on the host when made (:func:`rounding`), since IREE folds the rounding of a
#: single element inside a kernel (``f32 -> bf16 -> f32`` into nothing).
ROUNDED_OPS = frozenset((aten.add.Tensor, aten.sub.Tensor, aten.rsub.Scalar,
                         *(getattr(aten, name).Scalar for name in ("eq", "ne", "lt", "le", "gt", "ge"))))


def rounding(func: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> torch.dtype | None:
    """The float16/bfloat16 dtype ``func``'s runtime numbers are rounded to before they become
    float32 0-d inputs (see :data:`ROUNDED_OPS`); None for other ops and dtypes."""
    if func not in ROUNDED_OPS:
        return None
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            inner = getattr(value, "_data", value)
            if inner.dtype in precision.NARROW and inner.dim():
                return inner.dtype
    return None


@functools.cache
def _slots(func: Any) -> tuple[frozenset[int], frozenset[str]]:
    """Positions and names of ``func``'s arguments that may take a runtime scalar."""
    positions, names = set(), set()
    rewritable = func in REWRITES
    for i, argument in enumerate(func._schema.arguments):
        kind = str(argument.type)
        if kind == "Tensor" or (kind in ("Scalar", "number") and rewritable):
            (names if argument.kwarg_only else positions).add(i)
            names.add(argument.name)
    return frozenset(positions), frozenset(names)


def _int_dtype(values: Sequence[Any], numbers: Sequence[Any]) -> torch.dtype | None:
    """The dtype of the 0-d tensors standing for the ints ``numbers`` among ``values``' integer
    tensors: theirs, when they all have one dtype (int32 or int64) and every number is an int
    that fits it; else None (constants)."""
    dtype = None
    for value in values:
        if isinstance(value, torch.Tensor):
            kind = getattr(value, "_data", value).dtype
            if kind not in _INT_RANGES or (dtype is not None and kind is not dtype):
                return None
            dtype = kind
    if dtype is None:
        return None
    low, high = _INT_RANGES[dtype]
    return dtype if all(type(n) is int and low <= n <= high for n in numbers) else None


def _runtime_dtype(values: Sequence[Any], narrow: bool) -> torch.dtype | None:
    """The dtype of the 0-d tensors standing for scalars among ``values``' tensors, or None to keep
    constants (a tensor that is not float32/float64, or 0-d operands only, which a 0-d tensor of
    another dtype would promote where a Python float does not). With ``narrow`` (an op of
    :data:`NARROW_OPS`), tensors of one float16/bfloat16 dtype take float32 0-d tensors."""
    dtype, dimensioned, zero_d = None, False, set()
    for value in values:
        if not isinstance(value, torch.Tensor):
            continue
        inner = getattr(value, "_data", value)  # a neuron tensor's metadata, without dispatch
        kind = inner.dtype
        if kind not in _RUNTIME_DTYPES and not (narrow and kind in precision.NARROW):
            return None
        if dtype is not None and kind is not dtype and (kind in precision.NARROW or dtype in precision.NARROW):
            return None  # a half type beside another floating type: constants, as before
        if dtype is not torch.float64:
            dtype = kind
        if inner.dim():
            dimensioned = True
        else:
            zero_d.add(kind)
    if dtype is None or (not dimensioned and (zero_d != {dtype} or dtype in precision.NARROW)):
        return None
    return torch.float32 if dtype in precision.NARROW else dtype


_NUMBERS = (float, int)  # (not bool: a flag)


def as_inputs(func: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> tuple[Sequence[Any], dict[str, Any]]:
    """``args`` and ``kwargs`` with each number that can be a runtime input replaced by a 0-d tensor."""
    floats = [i for i, a in enumerate(args) if type(a) in _NUMBERS]
    keys = [k for k, v in kwargs.items() if type(v) in _NUMBERS] if kwargs else ()
    if not floats and not keys:
        return args, kwargs
    positions, names = _slots(func)
    floats = [i for i in floats if i in positions]
    keys = [k for k in keys if k in names]
    if not floats and not keys:
        return args, kwargs
    values = (*args, *kwargs.values())
    dtype = _runtime_dtype(values, func in NARROW_OPS)
    if dtype is None:  # integer tensors: ints that fit their dtype
        dtype = _int_dtype(values, [args[i] for i in floats] + [kwargs[k] for k in keys])
    if dtype is None:
        return args, kwargs
    narrow = rounding(func, args, kwargs) if dtype is torch.float32 else None
    if floats:
        args = list(args)
        for i in floats:
            args[i] = scalar_tensor(args[i], dtype, narrow)
    if keys:
        kwargs = {k: scalar_tensor(v, dtype, narrow) if k in keys else v for k, v in kwargs.items()}
    return args, kwargs


def call(func: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    """``func(*args, **kwargs)`` as traced into a kernel: through its rewrite when it has one."""
    rewrite = REWRITES.get(func)
    return func(*args, **kwargs) if rewrite is None else rewrite(*args, **kwargs)


class _Cache:
    """0-d CPU tensors per (value, dtype); past :data:`_CACHE_ENTRIES` the oldest go first."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # for writers; a read is one dict lookup
        self._entries: dict[tuple[Any, torch.dtype], torch.Tensor] = {}

    def get(self, value: float, dtype: torch.dtype) -> torch.Tensor:
        # Zeros and NaN by their spelling: -0.0 is not 0.0, and NaN finds itself (an int, whose
        # value is its float's, shares the float's tensor).
        key = (value, dtype) if value == value and value != 0.0 else (float(value).hex(), dtype)
        found = self._entries.get(key)
        if found is None:
            found = torch.tensor(value, dtype=dtype)
            with self._lock:
                if len(self._entries) >= _CACHE_ENTRIES:
                    del self._entries[next(iter(self._entries))]
                self._entries[key] = found
        return found

    def __len__(self) -> int:
        return len(self._entries)


cache = _Cache()


def scalar_tensor(value: float, dtype: torch.dtype, narrow: torch.dtype | None = None) -> torch.Tensor:
    """The 0-d tensor of ``value`` (first rounded to ``narrow``, see :func:`rounding`) that a kernel
    takes: cached unless TORCH_NEURONX_ENABLE_SCALAR_CACHE=0."""
    if narrow is not None:
        value = precision.rounded_number(value, narrow)
    if not config.get("TORCH_NEURONX_ENABLE_SCALAR_CACHE"):
        return torch.tensor(value, dtype=dtype)
    return cache.get(value, dtype)
