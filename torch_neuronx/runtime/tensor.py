"""``neuron`` tensors: device memory from the caching allocator, ops through a registered dispatcher.

A :class:`NeuronTensor` is a wrapper subclass whose ``device`` is ``neuron:N``.
Its values live in a block of the caching allocator (host memory on the cpu
target), viewed zero-copy as a CPU tensor, ``_data``. Views share the block
(``_allocation``), which goes back to the allocator when the last tensor over
it dies (:mod:`.allocation`). Factories (``torch.empty(..., device="neuron")``) and copies between
devices are registered for PrivateUse1 with ``torch.library`` (``device/``).

The type sits below every frontend: torch.compile traces through it (an op on
traced values runs on their inner tensors here) and the eager device registers
its dispatcher with :func:`register_dispatcher`, so neither imports the other.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import return_and_correct_aliasing

from torch_neuronx import memory, observe
from torch_neuronx.runtime.allocation import (  # noqa: F401  (re-exported: the tensor type's memory)
    Allocation,
    Memory,
    PoisonedTensorError,
    _allocate,
    _overlapping,
    _span_bytes,
    allocate,
    wait_for_host,
)

Dispatcher = Callable[[Any, Sequence[Any], dict[str, Any]], Any]
_dispatcher: Dispatcher | None = None
_on_error: Callable[[BaseException], None] | None = None
_host_read: Callable[[Any], None] = lambda t: None  # the eager device's wait before a host read


def register_dispatcher(dispatch: Dispatcher, on_error: Callable[[BaseException], None] | None = None,
                        host_read: Callable[[Any], None] | None = None) -> None:
    """Install the eager execution of ops on neuron tensors (``device/eager.py`` does, when registered).

    ``on_error`` sees every exception an op raises before it propagates; ``host_read(t)`` is
    called before ``t``'s memory is read on the host outside the dispatcher (printing), and
    waits for the queued work that writes it.
    """
    global _dispatcher, _on_error, _host_read
    _dispatcher, _on_error = dispatch, on_error
    if host_read is not None:
        _host_read = host_read


def has_neuron_kernel(op: Any) -> bool:
    """Whether ``op`` is a user's op (``torch.library``, outside ATen) with a kernel registered for
    the neuron device: ``register_kernel("neuron")``, ``custom_op(device_types="neuron")``,
    ``Library.impl(..., "PrivateUse1")``. (This package's own PrivateUse1 kernels are ATen
    factories, which never reach the dispatcher.)"""
    return isinstance(op, torch._ops.OpOverload) and op.namespace != "aten" \
        and op.has_kernel_for_dispatch_key(torch._C.DispatchKey.PrivateUse1)


def _no_dispatcher(func: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    raise RuntimeError(f"{func} on a neuron tensor: the eager neuron device is not registered "
                       "(import torch_neuronx, or call torch_neuronx.device.register())")


def new_tensor(size: Sequence[int], stride: Sequence[int], dtype: torch.dtype, nbytes: int,
               index: int, stream: int) -> NeuronTensor:
    """A new uninitialized neuron tensor on device ``index``, allocated for stream id ``stream``,
    whose metadata is known to be valid (``nbytes``: the span of ``size``/``stride``, as
    :func:`allocate` computes it): the hot path of an eager op's outputs."""
    data, allocation = _allocate(size, stride, dtype, nbytes, index, stream)
    return NeuronTensor(data, allocation, index=index)


def _view_from_base_metadata() -> tuple[Sequence[Any], Sequence[Any]] | None:
    """The ``sizes`` and ``strides`` of torch's ``view_from_base`` (torch/_subclasses/meta_utils.py)
    that is calling a view's replay, or None when it is not on the stack."""
    frame = sys._getframe(2)
    for _ in range(4):
        if frame is None:
            return None
        if frame.f_code.co_name == "view_from_base" and "sizes" in frame.f_locals:
            return frame.f_locals["sizes"], frame.f_locals["strides"]
        frame = frame.f_back
    return None


@functools.cache
def _device(index: int) -> torch.device:
    return torch.device("neuron", index)


def _with_device(text: str, dim: int, device: torch.device) -> str:
    """The host tensor's repr (less its closing parenthesis) with ``device=`` where torch puts it
    for any accelerator: right after the values, before ``size=`` and ``dtype=``."""
    end = text.rfind("]") + 1 if dim else 0  # (a tensor without values in its text: none)
    if not end:
        end = text.find(", ") % (len(text) + 1)
    return f"{text[:end]}, device='{device}'{text[end:]}"


class NeuronTensor(torch.Tensor):
    """A tensor on the ``neuron`` device (see the module docstring)."""

    _data: torch.Tensor
    _allocation: Allocation | None
    _index: int

    @staticmethod
    def __new__(cls, data: torch.Tensor, allocation: Allocation | None, requires_grad: bool = False,
                index: int = 0, outer: tuple[Sequence[int], Sequence[int], int] | None = None) -> NeuronTensor:
        # ``outer``: the size, strides and storage offset of a traced value whose inner tensor
        # has others (torch.compile decides an output's strides before its inner tensor exists,
        # and an inner tensor traced alone does not know it is a view of an input).
        size, stride, offset = outer if outer is not None else (data.shape, data.stride(), data.storage_offset())
        wrapper = torch.Tensor._make_wrapper_subclass(
            cls, size, strides=stride, storage_offset=offset, dtype=data.dtype,
            device=_device(index), requires_grad=requires_grad)
        wrapper._data = data
        wrapper._allocation = allocation
        wrapper._index = index  # what Dynamo's guards read through __tensor_flatten__ on every call
        if allocation is not None:
            allocation.track(data)
        return wrapper

    def __repr__(self, *, tensor_contents: Any = None) -> str:
        allocation = getattr(self, "_allocation", None)
        if allocation is not None and allocation.memory is None and self.numel():
            return (f"tensor(<storage resized to 0 bytes>, size={tuple(self.shape)}, dtype={self.dtype}, "
                    f"device='{self.device}')")
        _host_read(self)
        text = _with_device(f"{self._data!r}"[:-1], self._data.dim(), self.device)
        if self.grad_fn is not None:  # autograd's part of the text, as torch prints it for any device
            text += f", grad_fn=<{type(self.grad_fn).__name__}>"
        elif self.requires_grad:
            text += ", requires_grad=True"
        if isinstance(self, torch.nn.Parameter):  # (a parameter moved to neuron: a marked neuron tensor)
            return "Parameter containing:\n" + text + ")"
        return text + ")"

    def __format__(self, spec: str) -> str:
        """A 0-d tensor formats as its value (``f"{loss:.3f}"``), as torch does for its own tensors
        (``Tensor.__format__`` does so only for ``type(self) is Tensor``)."""
        if self.dim() == 0 and not self.is_meta:
            return self.item().__format__(spec)
        return object.__format__(self, spec)

    def share_memory_(self) -> NeuronTensor:
        """Refused: a neuron tensor reaches another process as a copy of its values (pickled), so the
        other process's updates would never come back; ``share_memory_()`` succeeded and
        ``is_shared()`` said True, and Hogwild-style training silently trained copies."""
        raise RuntimeError(
            "share_memory_(): neuron tensors cannot be shared between processes (another process gets a "
            "copy of their values, and its updates never reach this one); share CPU tensors instead "
            "(tensor.cpu().share_memory_(), model.cpu().share_memory())")

    def is_shared(self) -> bool:
        """False: no other process sees this tensor's memory (see :meth:`share_memory_`)."""
        return False

    def __dlpack__(self, *args: Any, dl_device: Any = None, **kwargs: Any) -> Any:
        """DLPack export: a host copy where ``dl_device`` asks for the CPU (``(1, 0)``); otherwise a
        ``BufferError`` (DLPack's refusal), since no DLPack device describes neuron memory (the
        capsule held a null pointer, and the tensor imported from it failed on every use)."""
        if dl_device is not None and tuple(dl_device)[0] == 1:  # kDLCPU
            return self.cpu().__dlpack__(*args, dl_device=dl_device, **kwargs)
        raise BufferError("a neuron tensor has no DLPack export of its device memory: export a host copy "
                          "(tensor.cpu(), or __dlpack__(dl_device=(1, 0)))")

    def __reduce_ex__(self, protocol: int) -> tuple[Any, tuple[Any, ...]]:
        """Pickled (``torch.save``, ``pickle``) as its values on the host and its device (:mod:`.serialization`)."""
        from torch_neuronx.runtime import serialization

        return serialization.reduce(self)

    def new_tensor(self, data: Any, **kwargs: Any) -> torch.Tensor:
        """A tensor of ``data`` on this tensor's device unless ``device=`` says otherwise (torch's
        constructor passed the device without its index: ``neuron:0`` for a ``neuron:1`` tensor)."""
        if kwargs.get("device") is None:
            kwargs["device"] = self.device
        return super().new_tensor(data, **kwargs)

    def new(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        """The legacy constructor (``x.new(sizes)``, ``x.new(data)``) on this tensor's device, as
        :meth:`new_tensor`."""
        if kwargs.get("device") is None:
            kwargs["device"] = self.device
        if not args:  # (torch's ignores the device then)
            return torch.empty(0, dtype=kwargs.get("dtype", self.dtype), device=kwargs["device"])
        return super().new(*args, **kwargs)

    def __copy__(self) -> torch.Tensor:
        """``copy.copy``: a new leaf over the same memory (writes through either show in both), as
        torch's rebuild of a CPU or CUDA tensor's storage gives; a parameter stays a parameter."""
        from torch_neuronx.runtime import serialization

        return serialization.shallow_copy(self)

    def __deepcopy__(self, memo: dict[int, Any]) -> torch.Tensor:
        """A device copy of the values (:mod:`.serialization`)."""
        from torch_neuronx.runtime import serialization

        return serialization.deepcopy(self, memo)

    @property
    def data(self) -> torch.Tensor:
        """A detached alias, as ``Tensor.data``."""
        return torch.Tensor.data.__get__(self, type(self))

    @data.setter
    def data(self, value: torch.Tensor) -> None:
        """``p.data = t``: ``p`` now holds ``t``'s device memory (torch swaps only the metadata)."""
        torch.Tensor.data.__set__(self, value)
        if isinstance(value, NeuronTensor):
            rebind(self, value._data, value._allocation)
            self._index = value._index

    def untyped_storage(self) -> torch.UntypedStorage:
        """The device memory as a ``torch.UntypedStorage`` on ``neuron:N``, one object shared by the
        tensor and its views: truthful ``size()``/``data_ptr()``, and ``resize_(0)`` / ``resize_(n)``
        free and allocate it again, as FSDP2's reshard does (:mod:`.storage`)."""
        allocation = getattr(self, "_allocation", None)
        if allocation is None:  # a traced value (or a bare wrapper)
            if not self.numel() and isinstance(getattr(self, "_data", None), torch.Tensor):
                # Tracing an empty tensor resizes its storage to 0 bytes (meta_utils), which a
                # neuron-device storage of a traced value cannot do: its inner tensor's can.
                return self._data.untyped_storage()
            return torch.Tensor.untyped_storage(self)
        from torch_neuronx.runtime import storage

        return storage.storage_of(allocation)

    def data_ptr(self) -> int:
        """The device address of the first element (0 for a tensor without memory), as on CUDA."""
        allocation = getattr(self, "_allocation", None)
        if allocation is None or not allocation.nbytes or type(self._data) is not torch.Tensor:
            return 0
        return self._data.data_ptr()

    def tolist(self) -> Any:
        """The values as nested Python lists, read from device memory (as ``Tensor.tolist`` on CUDA;
        torch refuses ``tolist`` for tensor subclasses)."""
        return self.cpu().tolist()

    def numpy(self, *, force: bool = False) -> Any:
        """As ``Tensor.numpy`` on CUDA: a device tensor is refused unless ``force=True``, which copies
        it to the host (torch refuses ``numpy`` for tensor subclasses with a less helpful message)."""
        if not force:
            raise TypeError(f"can't convert {self.device} device type tensor to numpy. Use Tensor.cpu() to copy "
                            "the tensor to host memory first.")
        return self.detach().cpu().numpy(force=True)

    def record_stream(self, stream: Any) -> None:
        """Mark this tensor's memory as used by ``stream`` (a ``torch.neuron.Stream``), as
        ``Tensor.record_stream`` on CUDA: once freed, it is not handed out again until the work
        queued on ``stream`` by then has run. (Queued eager work holds the memory it uses anyway.)"""
        from torch_neuronx.runtime import streams

        try:
            stream = streams.as_stream(stream)
        except TypeError:
            raise TypeError("record_stream of a neuron tensor takes a torch.neuron.Stream or a torch.Stream of "
                            f"a neuron device, got {type(stream).__name__}") from None
        if stream.device_index != self._index:
            raise RuntimeError(f"record_stream: the stream is on neuron:{stream.device_index}, "
                               f"the tensor on neuron:{self._index}")
        allocation = self._allocation
        if allocation is not None and allocation.nbytes:
            memory.record_stream(allocation.address, stream)

    # Ops reach __torch_dispatch__ directly: no Python __torch_function__ layer (faster eager
    # ops, and what Dynamo requires of a tensor subclass it traces through).
    __torch_function__ = torch._C._disabled_torch_function_impl

    def as_subclass(self, cls: type) -> torch.Tensor:
        """``Tensor.as_subclass``: a neuron tensor already is a Python subclass (this one), so another
        ``__torch_function__`` subclass cannot take it over; a clear error says what works instead."""
        try:
            return super().as_subclass(cls)
        except RuntimeError as exc:
            if "already associated" not in str(exc):
                raise
            raise TypeError(
                f"a neuron tensor cannot become a {cls.__name__}: neuron tensors are a Python tensor subclass "
                f"themselves (NeuronTensor), and torch gives a tensor one Python class. Keep a "
                f"__torch_function__ subclass ({cls.__name__}) on the CPU, or observe neuron tensors with a "
                "torch.overrides.TorchFunctionMode or a TorchDispatchMode, or wrap them in a wrapper "
                "subclass (torch.Tensor._make_wrapper_subclass) that holds the neuron tensor") from exc

    @property
    def _view_func_unsafe(self) -> Callable[..., torch.Tensor]:
        """How torch.compile's fake tensors rebuild this view from a fake base: ``as_strided`` with
        the size and strides Dynamo gave the view (its symbols under dynamic shapes), this view's
        offset, and its conjugate and negative bits, as torch rebuilds a plain tensor's views.

        torch replays a tensor subclass's recorded view op instead: a neuron tensor that is
        ``x.view(-1)`` of a ``(2, n)`` tensor (or ``logits[:, -1, :]``, ``repeat_interleave``'s
        result) got the size ``s0*s1`` of the base's symbols, and Dynamo then refused the input
        ("we only expect to bind basic symbols") under dynamic shapes. Only torch's fake-tensor
        conversion (``view_from_base``) reads this attribute; autograd keeps its own view function.
        """
        size, stride, offset = tuple(self.shape), tuple(self.stride()), self.storage_offset()
        conj, neg = self.is_conj(), self.is_neg()

        def replay(base: torch.Tensor, symint_visitor_fn: Any = None, tensor_visitor_fn: Any = None) -> torch.Tensor:
            # The symbolic size and strides torch's view_from_base computed for this view (what it
            # checks the replay against); our own numbers outside it
            outer = _view_from_base_metadata()
            sizes, strides = outer if outer is not None else (size, stride)
            # (the offset stays a number: a neuron tensor's offset is part of its metadata, one graph
            # per offset, and a symbol there has no source for Dynamo's guards)
            view = base.as_strided(sizes, strides, offset)
            if view.is_conj() != conj:  # (a view keeps its base's bits)
                view = view.conj()
            if view.is_neg() != neg:
                view = torch._neg_view(view)
            return view

        return replay

    def __tensor_flatten__(self) -> tuple[list[str], tuple[int, ...]]:
        """The inner tensor (the CPU view of the device memory); the device index and storage offset,
        and its conjugate and negative bits when it has one (:func:`math_bits`).

        With :meth:`__tensor_unflatten__` this makes ``neuron`` tensors traceable by
        ``torch.compile``: its graphs compute on the inner tensors. The storage offset
        travels with the trace (``__tensor_unflatten__`` gets no other way to know it):
        aot_autograd rebuilds an output that is a view of an input (``x[2:5]``) from the
        traced output's offset. Dynamo's guards compare this metadata, so a call with an
        input at another offset compiles again rather than rebuilding that view wrongly.
        """
        if self._allocation is not None and self._allocation.writer is not None:
            # aot_autograd's runtime hands compiled graphs the inner tensors it gets here: the
            # queued op that writes them must have run (a backward read autograd's zero tangent
            # before its fill ran: gradients 2.8 off on every other call).
            wait_for_host((self,))
        bits = math_bits(self)
        offset = self.storage_offset()
        if isinstance(offset, torch.SymInt):  # (a symbol in this metadata has no source to guard it
            offset = int(offset)  # by: Dynamo failed "sources must not be empty for symbol"); per offset
        return ["_data"], (self._index, offset, *((bits,) if bits else ()))

    def __coerce_same_metadata_as_tangent__(self, expected_metadata: Any, expected_type: type | None = None
                                            ) -> torch.Tensor | None:
        """This tangent as the compiled backward was traced to take it (aot_autograd asks).

        A tangent traced as a plain tensor (the gradient of an input the forward mutated:
        ``nn.Embedding(max_norm=...)`` renormalizes its weight in place) is handed over as the
        inner tensor, as every neuron input of a compiled graph is. A neuron tangent traced at
        another storage offset is handed over as a contiguous copy when that offset was 0.
        """
        if expected_type is torch.Tensor:
            self.__tensor_flatten__()  # waits for its queued writer, as for every input
            return self._data
        if expected_type not in (None, NeuronTensor) or not isinstance(expected_metadata, tuple):
            return None
        index, offset = expected_metadata[:2]
        if index != self._index:
            return None
        if offset == self.storage_offset():
            return self
        return self.clone(memory_format=torch.contiguous_format) if offset == 0 else None

    @staticmethod
    def __tensor_unflatten__(inner: dict[str, torch.Tensor], meta: tuple[int, ...], outer_size: Any,
                             outer_stride: Any) -> NeuronTensor:
        index, offset = meta[:2]
        data = inner["_data"]
        if type(data) is torch.Tensor and not data.is_meta:  # a compiled graph's output: into device memory
            placed = from_cpu(data, stride=outer_stride, index=index, upload=False)
            if offset != placed.storage_offset():
                # An output that is a view of an input: aot_autograd rebuilds it from the input
                # with this tensor's size, strides and offset (the values here are a copy).
                placed = NeuronTensor(placed._data, placed._allocation, index=index,
                                      outer=(placed.shape, placed.stride(), offset))
            placed._traced_bits = meta[2] if len(meta) > 2 else 0  # for a rebuilt view (dynamo/aliases.py)
            return placed
        traced = NeuronTensor(data, None, index=index, outer=(outer_size, outer_stride, offset))  # a traced value
        if len(meta) > 2:
            _set_math_bits(traced, meta[2])
        return traced

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Sequence[Any] = (), kwargs: dict | None = None) -> Any:
        # Never traced by Dynamo (see never_traced below).
        kwargs = kwargs or {}
        try:
            if _traced(args, kwargs):
                return _trace_op(func, args, kwargs)
            if func is _RESIZE_STORAGE_BYTES:  # torch.ops.inductor.resize_storage_bytes_(t, n)
                from torch_neuronx.runtime import storage

                return storage.resize_storage_bytes(args, kwargs)
            return (_dispatcher or _no_dispatcher)(func, args, kwargs)
        except BaseException as exc:  # in a backward pass PyTorch loses it: the hook keeps it
            if _on_error is not None:
                _on_error(exc)
            raise


_RESIZE_STORAGE_BYTES = torch.ops.inductor.resize_storage_bytes_.default


def never_traced(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Have Dynamo skip ``fn``'s frames and every frame they call, at no cost per call.

    Eager ops inside a compiled region (an op Dynamo leaves to eager, nn.GRU's) run the
    device's code while Dynamo's frame hook is installed; it must not compile that code.
    ``torch._disable_dynamo`` does this with two wrapper frames per call (about 1 µs on every
    eager op); a code execution strategy of SKIP, recursively, does it inside the hook.
    Returns ``fn`` itself (or, where the strategy API is missing, its ``_disable_dynamo`` wrapper).
    """
    code = getattr(fn, "__code__", None)
    try:
        from torch._C._dynamo.eval_frame import _FrameAction, _FrameExecStrategy, set_code_exec_strategy
    except ImportError:  # another torch: the wrapper
        return torch._disable_dynamo(fn)
    if code is None:
        return torch._disable_dynamo(fn)
    set_code_exec_strategy(code, _FrameExecStrategy(_FrameAction.SKIP, _FrameAction.SKIP))
    return fn


never_traced(NeuronTensor.__torch_dispatch__.__func__)


def _traced(args: Sequence[Any], kwargs: dict[str, Any]) -> bool:
    """Whether an op's neuron tensors hold traced values (torch.compile), not device memory."""
    for arg in args:
        if isinstance(arg, NeuronTensor):
            return type(arg._data) is not torch.Tensor
    leaf = next((a for a in pytree.tree_leaves((args, kwargs)) if isinstance(a, NeuronTensor)), None)
    return leaf is not None and type(leaf._data) is not torch.Tensor


def _inner(t: torch.Tensor) -> torch.Tensor:
    """The tensor a traced op computes on: a neuron tensor's inner tensor; a traced factory's
    result on ``neuron`` (a plain fake tensor) moved to the host like every inner tensor."""
    if isinstance(t, NeuronTensor):
        return t._data
    return t.to("cpu") if t.device.type == "neuron" else t


def _host_device(device: torch.device) -> torch.device:
    """``cpu`` for a neuron device (a device argument of an op on inner tensors); any other unchanged."""
    return torch.device("cpu") if device.type == "neuron" else device


def _leaves_device(device: Any) -> bool:
    return device is not None and torch.device(device).type != "neuron"


def _trace_op(func: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    """An op on traced neuron tensors: the same op on their inner tensors, which the trace records."""
    index = next(a for a in pytree.tree_leaves((args, kwargs)) if isinstance(a, NeuronTensor)).device.index or 0
    inner_args, inner_kwargs = pytree.tree_map_only(torch.Tensor, _inner, (args, kwargs))
    # The inner tensors live on the host: an op that names the neuron device (``m.to(x.device,
    # torch.bool)``, ``x.new_ones(..., device=x.device)``) makes its inner result there too, else
    # that result's fake tensor sits on ``neuron`` and the next op mixes it with host ones.
    inner_args, inner_kwargs = pytree.tree_map_only(torch.device, _host_device, (inner_args, inner_kwargs))
    out = func(*inner_args, **inner_kwargs)
    _write_back_plain(func, args, kwargs, inner_args, inner_kwargs)
    if func is torch.ops.aten._to_copy.default and _leaves_device(kwargs.get("device")):
        return out  # ``.cpu()`` inside a compiled graph: a host tensor, as in eager
    wrapped = pytree.tree_map_only(torch.Tensor, lambda t: _traced_value(t, index), out)
    return return_and_correct_aliasing(func, args, kwargs, wrapped)


CONJ, NEG = 1, 2  # math_bits()


def math_bits(t: torch.Tensor) -> int:
    """``t``'s conjugate (:data:`CONJ`) and negative (:data:`NEG`) bits."""
    return (CONJ if t.is_conj() else 0) | (NEG if t.is_neg() else 0)


def _traced_value(t: torch.Tensor, index: int) -> NeuronTensor:
    """A traced op's inner result as a neuron tensor, with its conjugate and negative bits (a
    compiled ``x.conj()`` returned as a view of its input: aot_autograd rebuilds that output from
    the input with what the traced wrapper says, and a wrapper without the bit gave ``x``)."""
    wrapped = NeuronTensor(t, None, index=index)
    _set_math_bits(wrapped, math_bits(t))
    return wrapped


def _set_math_bits(t: torch.Tensor, bits: int) -> None:
    if bits & CONJ:
        torch._C._set_conj(t, True)
    if bits & NEG:
        torch._C._set_neg(t, True)


def _write_back_plain(func: Any, args: Sequence[Any], kwargs: dict[str, Any], inner_args: Sequence[Any],
                      inner_kwargs: dict[str, Any]) -> None:
    """Writes of a traced op into a plain tensor on ``neuron`` (a factory's result inside the graph,
    ``torch.zeros(n, device=x.device)``): the op wrote the host copy :func:`_inner` made of it, so
    the copy's values go back into it (the written tensor itself, as in eager; the mutation was lost:
    ``out.add_(x); return out`` returned zeros)."""
    schema = getattr(func, "_schema", None)
    if schema is None or not schema.is_mutable:
        return
    for position, argument in enumerate(schema.arguments):
        if argument.alias_info is None or not argument.alias_info.is_write:
            continue
        if position < len(args) and not argument.kwarg_only:
            original, written = args[position], inner_args[position]
        elif argument.name in kwargs:
            original, written = kwargs[argument.name], inner_kwargs[argument.name]
        else:
            continue
        if (isinstance(original, torch.Tensor) and not isinstance(original, NeuronTensor)
                and original.device.type == "neuron" and written is not original):
            if original.shape != written.shape:  # an ``out=`` the op resized (``torch.empty(0)``)
                original.resize_(written.shape)
            original.copy_(written)


def _fill(data: torch.Tensor, t: torch.Tensor, stride: Sequence[int] | None) -> None:
    if stride is None or (t.is_contiguous() and tuple(stride) == t.stride()) or not _overlapping(t.shape, stride):
        data.copy_(t)
    else:
        _fill_overlapping(data, t)


def from_cpu(t: torch.Tensor, stride: Sequence[int] | None = None, index: int = 0,
             upload: bool = True) -> NeuronTensor:
    """A new neuron tensor holding a copy of the CPU tensor ``t``.

    Contiguous, or with ``stride`` when given: a compiled graph's output keeps the
    strides its trace decided (channels-last, transposed, or expanded, whose
    elements that share memory hold one value). ``upload``: whether this is the
    program's data going to the device (a ``transfer.host_to_device`` span); False for
    results a graph or kernel produced on the device, which the transfers table and the
    profiler's transfers must not count.
    """
    if t.is_quantized or t.layout != torch.strided:  # (their memory is no dense block: a crash)
        kind = "quantized" if t.is_quantized else f"{t.layout} (not strided)"
        raise NotImplementedError(f"the neuron device holds dense tensors only; this one is {kind}: "
                                  "keep quantized and sparse tensors on the CPU")
    data, allocation = allocate(t.shape, stride, t.dtype, index)
    if upload and observe.state.active:
        with observe.span("transfer.host_to_device", t.nbytes, device=index):
            _fill(data, t, stride)
    else:
        _fill(data, t, stride)
    return NeuronTensor(data, allocation, index=index)


def _fill_overlapping(data: torch.Tensor, t: torch.Tensor) -> None:
    """Write ``t`` into ``data``, a layout whose elements share memory (``copy_`` refuses one)."""
    span = _span_bytes(data.shape, data.stride(), data.dtype) // data.dtype.itemsize
    memory = data.as_strided((span,), (1,), data.storage_offset())
    positions = torch.arange(span).as_strided(data.shape, data.stride())
    memory.index_put_((positions.reshape(-1),), t.reshape(-1))


def alias(data: torch.Tensor, source: NeuronTensor) -> NeuronTensor:
    """A neuron tensor over ``data``, a view of ``source``'s memory, with ``data``'s conjugate and
    negative bits (``x.conj()``, ``torch._neg_view(x)``): torch resolves them above the backend
    only when the wrapper carries them (``device/math_bits.py``)."""
    if torch.is_inference_mode_enabled() and not source.is_inference():
        # A view of a tensor made outside inference mode is no inference tensor (autograd sets its
        # version counter to its base's next, which an inference tensor refuses): made as one outside.
        with torch.inference_mode(False):
            view = NeuronTensor(data, source._allocation, index=source._index)
    else:
        view = NeuronTensor(data, source._allocation, index=source._index)
    if data.is_conj():
        torch._C._set_conj(view, True)
    if data.is_neg():
        torch._C._set_neg(view, True)
    return view



def rebind(t: NeuronTensor, data: torch.Tensor, allocation: Allocation | None) -> None:
    """Make ``t`` a neuron tensor over ``data``, a CPU view of ``allocation``'s memory (``p.data = x``,
    ``resize_`` to a new size): a later storage resize of that allocation reaches ``t`` too."""
    t._data, t._allocation = data, allocation
    if allocation is not None:
        allocation.track(data)
