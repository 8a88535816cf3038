"""Index checks that decompositions would hide: :data:`BOUNDS` marks an index torch checks.

``index_add`` and ``index_copy`` reject negative indices in eager, but torch's
decompositions turn them into ``index_put``, which wraps them (and ``index_fill``, which
takes them, into ``index_copy``): a compiled
``x.index_add(0, torch.tensor([-1]), y)`` would add into the last row where eager
raises. Their decompositions here pass the index through :data:`BOUNDS` first, which
the ``index_bounds`` pass (``passes/index_bounds.py``) expands into a clamp and a host
check with the op's own error. Run eagerly, :data:`BOUNDS` checks and returns the index.
``put``, which torch-mlir cannot lower, is an ``index_put`` into the flattened tensor; ``one_hot``
checks its classes the same way, and ``repeat_interleave`` with ``output_size`` its repeats (a
size that was not their sum gave a shorter or longer result where eager raises). ``index_put``,
``index_add`` and ``index_copy`` raise eager's error for a source of another dtype (torch's meta
functions do not check it: the lowering failed deep in IREE).
"""

from __future__ import annotations

import torch
import torch._refs
from torch._decomp import decompositions as torch_decompositions

from torch_neuronx.compiler.errors import InvalidInputError

aten = torch.ops.aten


@torch.library.custom_op("neuron::index_bounds", mutates_args=())
def _index_bounds(index: torch.Tensor, size: int, negative: bool, op: str, message: str) -> torch.Tensor:
    """``index`` for a dimension of ``size``, wrapped when ``negative``; raises when out of range."""
    floor = -size if negative else 0
    if index.numel() and (int(index.min()) < floor or int(index.max()) >= size):
        bad = int(index.min()) if int(index.min()) < floor else int(index.max())
        raise IndexError(f"index {bad} is out of bounds for dimension 0 with size {size} ({op})")
    return torch.where(index < 0, index + size, index) if negative else index.clone()


@_index_bounds.register_fake
def _(index: torch.Tensor, size: int, negative: bool, op: str, message: str) -> torch.Tensor:
    return torch.empty_like(index)


#: The op a traced graph keeps for an index whose range torch checks (see the module docstring).
BOUNDS = torch.ops.neuron.index_bounds.default


def checked(value: torch.Tensor, code: torch.Tensor, op: str, tag: str) -> torch.Tensor:
    """``value``, with eager's check of a call made on ``code`` (integers: 0 when the call is valid,
    another value naming the op's error, which the index-bounds pass raises on the host after the
    call, by ``tag``): :data:`BOUNDS` for a size of 1, and ``value`` times its verdict, always 1
    (and with it for booleans), so that the check stays in the graph."""
    valid = (BOUNDS(code.reshape(-1), 1, False, op, tag) == 0).all()
    return value & valid if value.dtype == torch.bool else value * valid.to(value.dtype)


def _size(x: torch.Tensor, dim: int) -> int:
    return x.shape[dim] if x.dim() else 1


#: torch's C++ names of dtypes, as its kernels' messages print them.
_SCALAR_NAMES = {torch.float32: "Float", torch.float64: "Double", torch.float16: "Half", torch.bfloat16: "BFloat16",
                 torch.int64: "Long", torch.int32: "Int", torch.int16: "Short", torch.int8: "Char",
                 torch.uint8: "Byte", torch.bool: "Bool", torch.complex64: "ComplexFloat",
                 torch.complex128: "ComplexDouble"}


def scalar_type_name(dtype: torch.dtype) -> str:
    """``dtype`` as torch's kernels name it in their messages (``Float``, ``Long``)."""
    return _SCALAR_NAMES.get(dtype, str(dtype).removeprefix("torch."))


def check_index_put_dtypes(x: torch.Tensor, values: torch.Tensor) -> None:
    """``index_put`` (``x[i] = v``): eager's error for values of another dtype."""
    if values.dtype != x.dtype:
        raise InvalidInputError(f"Index put requires the source and destination dtypes match, got "
                                f"{scalar_type_name(x.dtype)} for the destination and "
                                f"{scalar_type_name(values.dtype)} for the source.")


def index_add(x: torch.Tensor, dim: int, index: torch.Tensor, source: torch.Tensor, *,
              alpha: float = 1) -> torch.Tensor:
    """``index_add`` with its index range checked (eager: RuntimeError for a negative index)."""
    if source.dtype != x.dtype:
        raise InvalidInputError(f"index_add_(): self ({scalar_type_name(x.dtype)}) and source "
                                f"({scalar_type_name(source.dtype)}) must have the same scalar type")
    index = BOUNDS(index, _size(x, dim), False, "index_add", "bounds")
    return torch_decompositions.index_add(x, dim, index, source, alpha=alpha)


def index_copy(x: torch.Tensor, dim: int, index: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
    """``index_copy`` with its index range checked (eager: IndexError for a negative index)."""
    if source.dtype != x.dtype:
        raise InvalidInputError("index_copy_(): self and source expected to have the same dtype, but got (self) "
                                f"{scalar_type_name(x.dtype)} and (source) {scalar_type_name(source.dtype)}")
    index = BOUNDS(index, _size(x, dim), False, "index_copy", "bounds")
    return torch_decompositions.index_copy(x, dim, index, source)


def index_fill(x: torch.Tensor, dim: int, index: torch.Tensor, value: torch.Tensor | float) -> torch.Tensor:
    """``index_fill`` with its index wrapped and checked (eager takes negative indices here); torch's
    decomposition goes through ``index_copy``, which would reject them."""
    index = BOUNDS(index, _size(x, dim), True, "index_fill", "bounds")
    return torch._refs.index_fill(x, dim, index, value)


def put(x: torch.Tensor, index: torch.Tensor, source: torch.Tensor, accumulate: bool = False) -> torch.Tensor:
    """``put`` (torch-mlir has no lowering): an ``index_put`` into ``x`` flattened, negative indices
    wrapping; a source of another length than the index raises torch's error (a 1-element source
    broadcast where eager raises)."""
    torch._check_index(source.numel() == index.numel(), lambda: (
        "put_(): Expected source and index to have the same number of elements, but got source.numel() = "
        f"{source.numel()}, index.numel() = {index.numel()}"))
    flat = x.reshape(-1).index_put((index.reshape(-1),), source.reshape(-1), accumulate=accumulate)
    return flat.view(x.shape)


def one_hot(x: torch.Tensor, num_classes: int = -1) -> torch.Tensor:
    """``F.one_hot`` with torch's class checks (its traced form, ``x.unsqueeze(-1) == arange``,
    gave an all-zero row for a class out of range, where eager raises); substituted for the
    functional call in the Dynamo graph (:mod:`.functional`: aot_autograd sees only the traced
    form). ``num_classes=-1`` needs the values (torch reads the maximum): left to torch."""
    if num_classes < 0 or x.dtype != torch.int64:
        return torch.nn.functional.one_hot(x, num_classes)
    checked = BOUNDS(x, num_classes, False, "one_hot", "one_hot") if x.numel() else x
    classes = torch.arange(num_classes, dtype=torch.int64, device=x.device)
    return (checked.unsqueeze(-1) == classes).to(torch.int64)


def repeat_interleave(repeats: torch.Tensor, output_size: int | None = None) -> torch.Tensor:
    """``repeat_interleave(repeats, output_size=n)``: the position of each of the ``n`` outputs
    among the cumulated repeats, with eager's checks (no negative repeat; ``n`` is their sum),
    made by :data:`BOUNDS` on a code (0 valid, 1 negative, 2 another sum). Without ``output_size``
    the size depends on the values: left to torch."""
    if output_size is None or type(output_size) is not int or repeats.dim() != 1:
        return NotImplemented
    if repeats.shape[0] == 0:  # eager's result whatever the size asked
        return repeats.new_empty((0,))
    negative = (repeats < 0).to(torch.int64).sum(0, keepdim=True).clamp(max=1)
    code = negative + 2 * (repeats.sum(0, keepdim=True) != output_size).to(torch.int64)
    repeats = checked(repeats, code, "repeat_interleave", "repeat_interleave")
    positions = torch.arange(output_size, dtype=repeats.dtype, device=repeats.device)
    found = torch.searchsorted(repeats.cumsum(0), positions, out_int32=repeats.dtype == torch.int32, right=True)
    return found.clamp(max=repeats.shape[0] - 1)


def gather_scalar(x: torch.Tensor, dim: int, index: torch.Tensor, sparse_grad: bool = False) -> torch.Tensor:
    """``aten.gather`` from a 0-d tensor (torch-mlir cannot lower it): a gather from its one element."""
    if x.dim():
        return NotImplemented
    return x.reshape(1).gather(0, index.reshape(-1)).reshape(index.shape)


def index_select_scalar(x: torch.Tensor, dim: int, index: torch.Tensor) -> torch.Tensor:
    """``aten.index_select`` with a 0-d index: a one-element index (the dimension stays, of size 1,
    as torch's; torch-mlir's lowering failed: "'stablehlo.convert' op requires the same shape");
    of a 0-d tensor: its one element in 1-d, the result of the index's shape (torch-mlir refused
    the rank)."""
    if not x.dim():
        return x.reshape(1).index_select(0, index.reshape(-1)).reshape(index.shape)
    if index.dim():
        return NotImplemented
    return x.index_select(dim, index.reshape(1))


def take(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``aten.take`` (torch-mlir has no lowering: the eager device ran it on the CPU): indexing of
    ``x`` flattened, negative indices wrapping, out-of-range ones an IndexError."""
    return x.reshape(-1)[index.reshape(-1)].reshape(index.shape)


def _checked_target(x: torch.Tensor, target: torch.Tensor, ignore_index: int) -> torch.Tensor:
    """``nll_loss``'s ``target`` with torch's class check ("Target 7 is out of bounds.", where
    the gather it decomposes to said "index 7 is out of bounds for dimension 1 with size 5");
    ``ignore_index`` entries pass as they are."""
    classes = x.shape[1] if x.dim() >= 2 else x.shape[0]  # symbolic in a dynamic-shape kernel
    if not target.numel():
        return target
    ignored = target == ignore_index
    checked = BOUNDS(torch.where(ignored, 0, target), classes, False, "nll_loss", "nll_loss")
    return torch.where(ignored, target, checked)


def nll_loss_forward(x: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None, reduction: int,
                     ignore_index: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``aten.nll_loss_forward``: torch's decomposition, its target checked as torch's kernel checks it."""
    target = _checked_target(x, target, ignore_index)
    return torch_decompositions.nll_loss_forward(x, target, weight, reduction, ignore_index)


def nll_loss2d_forward(x: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None, reduction: int,
                       ignore_index: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``aten.nll_loss2d_forward``: torch's decomposition, its target checked as torch's kernel checks it."""
    target = _checked_target(x, target, ignore_index)
    return torch_decompositions.nll_loss2d_forward(x, target, weight, reduction, ignore_index)


def binary_cross_entropy(x: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None = None,
                         reduction: int = 1) -> torch.Tensor:
    """``aten.binary_cross_entropy``: torch's decomposition, with its kernel's check that every input
    lies in [0, 1] (a NaN fails it, as there): a compiled loss of inputs out of range gave NaN or a
    value where eager raises."""
    if x.numel():
        code = ((x >= 0) & (x <= 1)).logical_not().any().to(torch.int64)
        x = checked(x, code, "binary_cross_entropy", "binary_cross_entropy")
    return torch_decompositions.binary_cross_entropy(x, target, weight, reduction)


DECOMPOSITIONS = {
    aten.binary_cross_entropy.default: binary_cross_entropy,
    aten.nll_loss_forward.default: nll_loss_forward,
    aten.nll_loss2d_forward.default: nll_loss2d_forward,
    aten.gather.default: gather_scalar,
    aten.index_select.default: index_select_scalar,
    aten.take.default: take,
    aten.repeat_interleave.Tensor: repeat_interleave,
    aten.put.default: put,
    aten.index_add.default: index_add,
    aten.index_copy.default: index_copy,
    aten.index_fill.int_Scalar: index_fill,
    aten.index_fill.int_Tensor: index_fill,
}
