"""The ``neuron`` device name in PyTorch: PrivateUse1 renamed, and ``torch.neuron``.

:func:`register` (run on ``import torch_neuronx``) renames PyTorch's PrivateUse1
backend to ``neuron`` and registers :mod:`torch_neuronx.device.module` as
``torch.neuron``, whose names follow ``torch.cuda``'s (device count, streams,
the caching allocator's memory statistics). The eager execution of ``neuron``
tensors builds on this registration.
"""

from __future__ import annotations

import logging
from typing import Any

from torch_neuronx import imports

_log = logging.getLogger("torch_neuronx.device")
_registered = False


def register() -> bool:
    """Make ``neuron`` PyTorch's PrivateUse1 device and ``torch.neuron`` its module; idempotent."""
    global _registered
    if _registered:
        return True
    import torch

    from torch_neuronx.device import module

    current = torch._C._get_privateuse1_backend_name()
    if current not in ("privateuseone", "neuron"):
        _log.warning("PrivateUse1 is already registered as %r; torch.neuron is not available", current)
        return False
    if current == "neuron" and hasattr(torch, "neuron"):
        _registered = True  # registered by another copy of this module (e.g. a reload)
        return True
    native_hooks = _register_backend(module)
    _register_kernels()
    from torch_neuronx.device import (
        accelerator,
        autocast,
        backward_errors,
        copies,
        eager,
        index_less,
        lazy,
        linearize,
        module_moves,
        pinned,
        random,
        swap,
    )
    from torch_neuronx.runtime import hops, tensor, versions

    hops.install()
    versions.install()
    tensor.register_dispatcher(eager.dispatch, on_error=backward_errors.note, host_read=copies.host_read)

    autocast.register()
    imports.when_imported("torch._dynamo.trace_rules", _never_traced_by_dynamo)
    accelerator.install()
    if not native_hooks:  # (the native hooks pin memory themselves)
        pinned.install()
    backward_errors.install()
    from torch_neuronx import process

    if process.device_count() > 1:
        index_less.install()
    swap.install()
    lazy.install()
    module_moves.install()
    linearize.install()
    random.install()
    _register_serialization()
    _registered = True
    return True


def _register_backend(module: Any) -> bool:
    """Rename PrivateUse1 ``neuron`` and register its module, hooks and device guard (the steps of
    torch's ``_setup_privateuseone_for_python_backend``, in its order), with the native hooks
    (``device/native.py``) where they can be built; whether they were."""
    import torch

    from torch_neuronx.device import native
    from torch_neuronx.device.hooks import NeuronDeviceGuard, NeuronHooks

    torch.utils.rename_privateuse1_backend("neuron")
    torch.utils.generate_methods_for_privateuse1_backend()
    torch._register_device_module("neuron", module)
    native_hooks = native.register_hooks()
    if not native_hooks:
        torch._C._acc.register_python_privateuseone_hook(NeuronHooks())
        torch._C._acc.register_python_privateuseone_device_guard(NeuronDeviceGuard())
    else:
        from torch_neuronx.device import generic_streams

        generic_streams.install(native.library())
    return native_hooks


def _register_serialization() -> None:
    """``torch.load`` of neuron tensors: their rebuild is allowed in ``weights_only`` mode, and
    storages loaded with ``map_location="neuron"`` go into device memory (runtime/serialization.py);
    ``torch.UntypedStorage(n, device="neuron")`` makes device memory (runtime/storage.py)."""
    import torch

    from torch_neuronx.runtime import serialization, storage

    storage.install_constructor()
    serialization.register_for_processes()
    serialization.install_legacy_map_location()
    serialization.install_zip_save_marker()
    torch.UntypedStorage.neuron = serialization.storage_to_neuron
    torch.serialization.add_safe_globals([serialization.rebuild, serialization.rebuild_from_bytes])
    torch.serialization.register_package(9, lambda obj: None, serialization.restore_storage)


_library = None  # the torch.library registrations must stay alive for the process
_libraries: list = []


#: Runtime code that runs where the program never called it (a tensor's memory freed as the
#: garbage collector drops it): Dynamo, whose frame hook stays active in a compiled module that
#: fell back to eager, traced and compiled these frames as if they were the user's.
_RUNTIME_INTERNALS = ("torch_neuronx.memory", "torch_neuronx.runtime.allocation")


def _never_traced_by_dynamo(trace_rules: Any) -> None:
    for name in _RUNTIME_INTERNALS:
        trace_rules.add(name)


def _register_kernels() -> None:
    """Factories and cross-device copies for PrivateUse1, the entry points into neuron tensors."""
    global _library
    import torch

    from torch_neuronx.device import copies, recurrent
    from torch_neuronx.device.queued import on_host
    from torch_neuronx.runtime import serialization
    from torch_neuronx.runtime.tensor import NeuronTensor

    def empty_memory_format(size, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
        stride = None
        if memory_format not in (None, torch.contiguous_format):  # channels-last (preserve raises torch's error)
            stride = torch.empty(size, dtype=dtype, device="meta", memory_format=memory_format).stride()
        return copies.empty_on_device(size, stride, dtype, device)

    def empty_strided(size, stride, dtype=None, layout=None, device=None, pin_memory=None):
        return copies.empty_on_device(size, stride, dtype, device)

    def copy_from(src, dst, non_blocking=False):
        neuron = dst if isinstance(dst, NeuronTensor) else src
        if not isinstance(neuron, NeuronTensor):  # a storage a legacy-format torch.load restored
            holder = serialization.restored_holder(dst)
            return on_host(holder._index, [holder], serialization.write_restored, holder, src, dst)
        return on_host(neuron._index, [src, dst], copies.transfer, dst, src)

    # Never traced by Dynamo (as torch does for __torch_dispatch__): eager code inside a
    # compiled region, after a graph break (nn.LSTM's initial states), calls them too.
    _library = torch.library.Library("aten", "IMPL")
    _library.impl("empty.memory_format", torch._disable_dynamo(empty_memory_format), "PrivateUse1")
    _library.impl("empty_strided", torch._disable_dynamo(empty_strided), "PrivateUse1")
    _library.impl("_copy_from", torch._disable_dynamo(copy_from), "PrivateUse1")
    _library.impl("one_hot", torch._disable_dynamo(_one_hot), "AutogradPrivateUse1")
    _library.impl("ctc_loss.Tensor", torch._disable_dynamo(_ctc_loss_host_lengths), "AutogradPrivateUse1")
    recurrent.register(_library)
    _library.impl("_local_scalar_dense", torch._disable_dynamo(_local_scalar_dense), "PrivateUse1")
    _library.impl("scalar_tensor", torch._disable_dynamo(_scalar_tensor), "PrivateUse1")
    _fallback_library = torch.library.Library("_", "IMPL")  # a fallback lives in the global namespace
    _fallback_library.fallback(torch._disable_dynamo(_factory_fallback), "PrivateUse1")
    _fallback_library.fallback(torch._disable_dynamo(_sparse_refused), "SparsePrivateUse1")
    _libraries.append(_fallback_library)
    _collated_by_stacking(NeuronTensor)
    _multi_tensor_by_default(NeuronTensor)


def _multi_tensor_by_default(tensor_type: type) -> None:
    """Optimizers (``foreach=None``) and ``clip_grad_norm_`` take their multi-tensor (foreach)
    implementations on neuron, as on CUDA: torch picks them for the tensor types it lists, which
    DTensor extends the same way. (The per-tensor loop of an AdamW step issued about twice the ops.)"""
    from torch.optim import optimizer
    from torch.utils import _foreach_utils

    for types in (optimizer._foreach_supported_types, _foreach_utils._foreach_supported_types):
        if tensor_type not in types:
            types.append(tensor_type)


def _collated_by_stacking(tensor_type: type) -> None:
    """``DataLoader``'s default collate stacks neuron tensors on their device. Its tensor rule, in a
    worker process, stacks into a shared-memory storage through ``elem.new(storage)``, which a
    neuron tensor cannot take (PyTorch's "INTERNAL ASSERT FAILED ... python_dispatch.cpp"): a
    batch of neuron tensors is pickled back to the main process as its values instead."""
    import torch
    from torch.utils.data._utils.collate import default_collate_fn_map

    def collate(batch: Any, *, collate_fn_map: Any = None) -> Any:
        return torch.stack(batch, 0)

    default_collate_fn_map.setdefault(tensor_type, collate)


def _scalar_tensor(value, dtype=None, layout=None, device=None, pin_memory=None):
    """``torch.scalar_tensor`` (``torch.where(c, h, 1e10)`` makes one of its number) converts
    unchecked, as on the CPU (float16 1e10 is inf); torch's composite is ``empty().fill_()``, whose
    checked conversion raised."""
    import torch

    dtype = torch.get_default_dtype() if dtype is None else dtype
    held = torch.scalar_tensor(value, dtype=dtype).item()  # the CPU's unchecked conversion
    return torch.empty((), dtype=dtype, device=device).fill_(held)  # a fill kernel: no transfer, no wait


def _local_scalar_dense(x):
    """A neuron tensor's value read below the Python dispatch key: ``torch.tensor([a, b])`` of
    0-d neuron tensors reads each element with Python dispatch excluded, which reached the
    ``PrivateUse1`` fallback and failed there with an internal assertion of PyTorch's."""
    import torch

    from torch_neuronx.device import eager

    return eager.dispatch(torch.ops.aten._local_scalar_dense.default, (x,), {})


def _ctc_loss_host_lengths(log_probs, targets, input_lengths, target_lengths, blank=0, reduction=1,
                           zero_infinity=False):
    """``F.ctc_loss`` of neuron tensors with lengths given as host tensors, which CUDA takes (its
    kernels read lengths on the host): as lists, the form torch's plain-tensor route passes them in
    (a tensor subclass takes the tensor route, whose ``loss / target_lengths`` mixed the devices)."""
    import torch

    from torch_neuronx.runtime.tensor import NeuronTensor

    lengths = (input_lengths, target_lengths)
    if type(log_probs) is NeuronTensor and type(log_probs._data) is torch.Tensor \
            and all(type(t) is torch.Tensor and t.device.type == "cpu" for t in lengths):  # (not traced)
        return torch.ops.aten.ctc_loss.IntList(log_probs, targets, input_lengths.tolist(), target_lengths.tolist(),
                                               blank, reduction, zero_infinity)
    return torch.ops.aten.ctc_loss.Tensor.decompose(log_probs, targets, input_lengths, target_lengths, blank,
                                                    reduction, zero_infinity)


def _one_hot(x, num_classes=-1):
    """``F.one_hot`` of a neuron tensor with the CPU kernel's checks (which read the values, as a
    synchronization, as on the CPU): torch's composite form checks nothing on other devices, and
    a class out of range gave an all-zero row."""
    import torch

    from torch_neuronx.runtime.tensor import NeuronTensor

    if type(x) is not NeuronTensor:  # a fake tensor while tracing: torch's own form
        return torch.ops.aten.one_hot.default.decompose(x, num_classes)
    if x.dtype != torch.int64:
        raise RuntimeError("one_hot is only applicable to index tensor of type LongTensor.")
    if x.numel() == 0:
        if num_classes < 1:
            raise RuntimeError("Can not infer total number of classes from empty tensor.")
    else:
        if int(x.min()) < 0:
            raise RuntimeError("Class values must be non-negative.")
        high = int(x.max())
        if num_classes == -1:
            num_classes = high + 1
        elif high >= num_classes:
            raise RuntimeError("Class values must be smaller than num_classes.")
    classes = torch.arange(num_classes, device=x.device)
    return (x.unsqueeze(-1) == classes).to(torch.int64)


def _sparse_refused(op, *args, **kwargs):
    """Sparse tensors on the device (``nn.Embedding(sparse=True)``'s gradient): torch's raw
    "Could not run ... from the 'Sparseneuron' backend" said nothing of what to do."""
    raise NotImplementedError(
        f"{op}: the neuron device holds dense tensors only, no sparse ones (such as the gradient of "
        "nn.Embedding(sparse=True) or EmbeddingBag(sparse=True)): use sparse=False there (and a dense "
        "optimizer for it), or keep that module on the CPU")


def _factory_fallback(op, *args, **kwargs):
    """An op that reaches the ``neuron`` backend itself, with no neuron tensor among its inputs (those
    go to the eager dispatcher first): a factory without a kernel of its own (``tril_indices``,
    ``triu_indices``). It runs on the CPU and its tensors are placed on the device it names."""
    import torch
    import torch.utils._pytree as pytree

    from torch_neuronx.process import checked_device_index
    from torch_neuronx.runtime.device import current_index
    from torch_neuronx.runtime.tensor import NeuronTensor, from_cpu

    if any(isinstance(a, NeuronTensor) for a in pytree.tree_leaves((args, kwargs))):
        raise NotImplementedError(f"{op} reached the neuron backend with neuron tensors outside the eager dispatcher")
    device = kwargs.get("device")
    index = current_index() if device is None or torch.device(device).index is None else torch.device(device).index
    index = checked_device_index(index)
    out = op(*args, **{**kwargs, "device": torch.device("cpu")})
    return pytree.tree_map(lambda t: from_cpu(t, index=index) if type(t) is torch.Tensor else t, out)
