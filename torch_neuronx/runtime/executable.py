"""Loading and executing NEFFs on the IREE runtime (our Neuron Runtime).

One IREE VM instance and one HAL device per driver live for the whole process;
each :class:`Executable` owns a VM context holding its module. Tensors cross in
both directions through DLPack, so no bytes are copied when the input is
contiguous and aligned; a misaligned or non-contiguous input is copied once.
A GPU driver's NEFFs (the ``cuda`` target) get copies in device memory instead
(``transfer.py``).
"""

from __future__ import annotations

import functools
import itertools
import logging
import os
import threading
import weakref
from collections.abc import Callable, Sequence

import torch

from torch_neuronx import config, memory, observe
from torch_neuronx.format import neff as neff_format
from torch_neuronx.format import parameters as resident
from torch_neuronx.observe.events import state as _observing
from torch_neuronx.runtime import aliases, forks, openmp, streams, transfer
from torch_neuronx.runtime.errors import NeffLoadError, NeuronRuntimeError
from torch_neuronx.runtime.streams import submitted as _streams_used

_log = logging.getLogger("torch_neuronx.runtime")

_ALIGNMENT = 64  # IREE's local HAL imports host memory only at this alignment
_KEPT_IMPORTS = 8192  # imported views a device keeps (Device.imported), dropped together when full
_KEPT_LISTS = 64  # argument lists a plan's direct run keeps (Executable.direct_into)
#: Bindings in a row, each serving one call, after which resident parameters count as volatile.
VOLATILE_BINDINGS = 3
_to_dlpack = torch._C._to_dlpack  # the builtins behind torch.utils.dlpack: no Python frame per call
_from_dlpack = torch._C._from_dlpack
_KDL_CPU = 1
_lock = threading.Lock()


class _Bindings:
    """Every executable holding bound resident parameters, within one process-wide byte budget.

    Binding beyond TORCH_NEURONX_RESIDENT_PARAMETERS_BYTES releases the bindings used least
    recently (a released executable binds again on its next call), so many graphs over the
    same or different weights (shape specializations, graph breaks) cannot pile up packed
    copies without bound.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[int, tuple[weakref.ref, int]] = {}  # id(executable) -> (ref, bytes)
        self.clock = itertools.count()  # executables stamp their calls with it (LRU order)

    @staticmethod
    def budget() -> int:
        explicit = config.get("TORCH_NEURONX_RESIDENT_PARAMETERS_BYTES")
        if explicit:
            return explicit
        from torch_neuronx.memory.segments import host_memory_bytes

        return host_memory_bytes() // 4

    def held_bytes(self) -> int:
        """Bytes of parameters bound right now."""
        with self._lock:
            return sum(size for ref, size in self._held.values() if ref() is not None)

    def add(self, executable: Executable, size: int) -> None:
        """Record ``executable``'s new binding of ``size`` bytes; release others to fit the budget."""
        budget = self.budget()
        with self._lock:
            self._held = {k: v for k, v in self._held.items() if v[0]() is not None and k != id(executable)}
            total = size + sum(v[1] for v in self._held.values())
            others = sorted((v[0]() for v in self._held.values()), key=lambda e: e._last_used)
            for other in others:
                if total <= budget:
                    break
                other.release()
                total -= self._held.pop(id(other))[1]
                observe.count("parameter_releases")
            self._held[id(executable)] = (weakref.ref(executable), size)


bindings = _Bindings()


@functools.cache
def _rt():  # imported lazily: iree.runtime loads native libraries
    import iree.runtime as rt
    from iree.runtime import _binding

    # Executables cached by Dynamo are still alive at interpreter exit; nanobind's
    # leak report about them is noise, not a leak of ours.
    _binding.disable_leak_checker()
    return rt


_MAX_WORKERS = 64  # IREE's topology tracks its worker groups in a 64-bit mask


def _topology_flag() -> str:
    """The task executor's topology: one worker per CPU this process may use.

    IREE's default topology counts physical cores from sysfs, which in a VM or container need
    not match the CPUs the process may run on. (One more worker made a transformer block ~6%
    faster but a 13 MFLOP MLP ~80% slower on 2 cores.) Pinned, each worker keeps its own CPU.
    Unpinned, calls made within tens of milliseconds after the calling thread had been busy
    ran at about half speed, as if both workers of the 2-core host shared one core: a
    transformer block called right after 20 eager and 20 inductor calls averaged 7.9 ms over
    its next ten calls unpinned, 5.9-6.3 ms pinned (bench/compile.py's block).
    """
    cpus = sorted(os.sched_getaffinity(0))[:_MAX_WORKERS]
    if config.get("TORCH_NEURONX_PIN_WORKERS"):
        return "--task_topology_cpu_ids=" + ",".join(map(str, cpus))
    return f"--task_topology_group_count={len(cpus)}"


_flags_set = False


def _set_runtime_flags(driver: str) -> None:
    global _flags_set
    if driver == "local-task" and not _flags_set:
        _rt().flags.parse_flags(_topology_flag())
        _flags_set = True


class Device:
    """One IREE HAL device of a driver, shared by every executable of this process."""

    def __init__(self, driver: str) -> None:
        rt = _rt()
        _set_runtime_flags(driver)
        self.driver = driver
        self.instance = rt.VmInstance()
        try:
            # A GPU driver's allocations (cuMemAlloc, pinned staging) cost 0.1-2 ms each, and every
            # call allocates its copies (transfer.py): IREE's caching allocator reuses freed ones.
            self.hal = rt.get_device(driver) if transfer.host_memory(driver) else \
                rt.get_driver(driver).create_device_by_uri(driver, allocators=["caching"])
        except Exception as exc:
            raise NeuronRuntimeError(f"cannot open the {driver!r} runtime device: {exc}") from exc
        self.hal_module = rt.create_hal_module(self.instance, self.hal)
        # Imported views of host memory by (address, shape, dtype) (:meth:`imported`).
        self.imports: dict[tuple, object] = {}
        forks.keep_forever(self, self.instance, self.hal, self.hal_module)
        forks.state.started = forks.state.started or driver == "local-task"

    def imported(self, t: torch.Tensor) -> object | None:
        """The buffer view of plain CPU tensor ``t`` for a call, kept for later calls; None when ``t``
        cannot be imported as it is (not dense and aligned, or a negated view: the caller imports it
        its own way).

        The view is made over an alias of ``t``'s memory that owns nothing: an import wraps memory,
        never copies or holds it, so whatever live contiguous tensor is at that address with that
        shape and dtype can use it, and a kept view keeps no tensor's memory allocated.
        """
        address = t.data_ptr()
        # (checked before the lookup: a transposed view has its base's address and maybe its shape)
        if type(t) is not torch.Tensor or not address or address % _ALIGNMENT or not t.is_contiguous() \
                or t.is_neg() or t.is_conj():
            return None
        key = (address, t.shape, t.dtype)
        view = self.imports.get(key)
        if view is not None:
            return view
        alias = memory.block_view(address, t.nbytes, dtype=t.dtype).view(t.shape)  # (no owner: holds nothing)
        if len(self.imports) >= _KEPT_IMPORTS:
            self.imports.clear()
        view = self.imports[key] = self.hal.from_dlpack_capsule(_to_dlpack(alias))
        return view


@functools.cache
def device(driver: str) -> Device:
    """The process-wide device for ``driver`` (created on first use)."""
    with _lock:
        return Device(driver)


def _aligned_contiguous(t: torch.Tensor) -> torch.Tensor:
    if type(t) not in (torch.Tensor, torch.nn.Parameter):
        # A subclass's data_ptr is not its values' address: exporting it would read wild memory.
        raise NeuronRuntimeError(f"NEFF inputs must be plain CPU tensors, got {type(t).__name__} "
                                 f"on {t.device}")
    if t.numel() == 0:  # any strides (an expanded empty tensor's are 0): IREE takes only dense ones
        return torch.empty(t.shape, dtype=t.dtype)
    if t.is_neg() or t.is_conj():  # (``torch._neg_view``): its memory holds the values' negations
        t = t.resolve_neg().resolve_conj()
    if t.is_contiguous() and t.data_ptr() % _ALIGNMENT == 0:
        return t
    out = torch.empty(t.shape, dtype=t.dtype)  # fresh allocations are 64-byte aligned
    out.copy_(t)
    return out


class Executable:
    """A loaded NEFF: call it with CPU tensors, get CPU tensors back.

    Inputs listed as ``resident`` in the NEFF's signature are module parameters
    (``compiler/resident.py``): they are bound into a VM context once, and bound
    again when the tensor at their position is another object, sits at another
    address, or was updated in place (its version counter moved), or when a
    parameter's ``.data`` was read since (:mod:`.aliases`: an alias writes without
    moving the counter; while one is alive, every call binds). When
    :data:`VOLATILE_BINDINGS` bindings in a row each served a single call (the
    weights change between every call, as when inference alternates with
    training steps), ``on_volatile`` is called once: its owner can switch to a
    NEFF that takes the parameters as arguments.
    """

    def __init__(self, module: neff_format.Neff, driver: str, function: str = "main",
                 on_volatile: Callable[[], None] | None = None) -> None:
        rt = _rt()
        self.neff = module
        self.device = device(driver)
        try:
            # wrap_buffer reads the payload in place (the NEFF is held in memory, page-aligned);
            # the payload starts 4 KiB-aligned in the container so IREE accepts it.
            vm_module = rt.VmModule.wrap_buffer(self.device.instance, module.payload)
        except Exception:
            vm_module = rt.VmModule.copy_buffer(self.device.instance, module.payload)
        self._module = vm_module
        signature = module.header.signature
        self._resident = tuple(signature.get("resident", ()))
        if self._resident:
            aliases.install()
        # Positions of the inputs passed as call arguments (None: all of them).
        self._arguments = tuple(i for i in range(len(signature.get("inputs", ())))
                                if i not in self._resident) if self._resident else None
        # (context, ((position, tensor, version, address), ...), index, ((start, end), ...), epoch)
        self._bound: tuple | None = None
        self._calls = 0  # calls of a module with resident parameters (counted for on_volatile)
        self._calls_at_bind = 0
        self._short_bindings = 0  # bindings in a row that served one call each
        self._on_volatile = on_volatile
        self._bind_lock = threading.Lock()
        self._last_used = 0
        try:
            self._function = vm_module.lookup_function(function)
            # Modules with parameters get their context when the parameters are first bound.
            self._context = None if self._resident else rt.VmContext(
                self.device.instance, [self.device.hal_module, vm_module])
        except Exception as exc:
            raise NeffLoadError(f"the runtime rejected the NEFF: {exc}", module.path) from exc
        if self._function is None:
            raise NeffLoadError(f"the NEFF has no function {function!r}", module.path)
        self._num_outputs = len(signature.get("outputs", [])) or None
        self._hal = self.device.hal
        # A GPU driver's memory is not the host's: its inputs and results are copied (transfer.py).
        self._host_memory = transfer.host_memory(driver)
        # Runs on the task executor's workers, which torch's spinning OpenMP threads would slow.
        self._multithreaded = driver == "local-task"
        self._from_capsule = self._hal.from_dlpack_capsule
        self._list = rt.VmVariantList
        self._view_type = rt.HalBufferView
        # Parameters come back every call as the same objects over the same memory: their
        # imported buffer views are kept (they alias the tensor, so in-place updates show).
        # Keyed by id and checked by address and layout, not by a weak reference, which would
        # make ``module.to(...)`` fail (``swap_tensors`` refuses a tensor that has one): the
        # view keeps its memory alive, so the same address and layout is the same memory.
        self._parameter_views: dict[int, tuple[tuple, object]] = {}

    def _view(self, t: torch.Tensor) -> object:
        """Import one input (the slow path: a new parameter, or a copy for misaligned memory)."""
        usable = _aligned_contiguous(t)
        view = self._hal.from_dlpack_capsule(_to_dlpack(usable))
        if type(t) is torch.nn.Parameter and usable is t:
            self._parameter_views[id(t)] = ((t.data_ptr(), t.shape, t.stride(), t.dtype), view)
        return view

    def bind(self, inputs: Sequence[torch.Tensor]) -> object:
        """Bind the resident inputs of ``inputs`` into a fresh VM context and return it.

        The module's initializer runs here: it reads the parameters (zero-copy from the
        tensors' memory where aligned) and packs what its matmuls need.
        """
        rt = _rt()
        self._note_binding()
        epoch = aliases.state.epoch
        index, checks = rt.ParameterIndex(), []
        specs = self.neff.header.signature.get("inputs", ())
        for position in self._resident:
            t = inputs[position]
            if position < len(specs):
                _check_resident(t, specs[position], position)
            usable = _aligned_contiguous(t).detach()
            index.add_buffer(resident.parameter_key(position), usable.reshape(-1).view(torch.uint8).numpy())
            checks.append((position, t, _version(t), t.data_ptr()))
        try:
            parameters = rt.create_io_parameters_module(
                self.device.instance, index.create_provider(scope=resident.SCOPE))
            context = rt.VmContext(self.device.instance, [self.device.hal_module, parameters, self._module])
        except Exception as exc:
            raise NeuronRuntimeError(f"binding the NEFF's parameters failed: {exc}") from exc
        spans = tuple((address, address + t.nbytes) for _, t, _, address in checks)
        if any(aliases.held(t) for _, t, _, _ in checks):
            epoch = -1  # an alias may write the values unseen: this binding serves one call
        self._bound = (context, tuple(checks), index, spans, epoch)
        bindings.add(self, sum(t.numel() * t.element_size() for _, t, _, _ in checks))
        observe.count("parameter_bindings")
        _log.debug("bound %d resident parameters of %s", len(checks), self.neff.header.key[:16])
        return context

    def release(self) -> None:
        """Drop the bound parameters (their packed copies go once no call uses them); rebound on demand."""
        self._bound = None

    def _note_binding(self) -> None:
        if self._bound is not None:
            served = self._calls - self._calls_at_bind
            self._short_bindings = self._short_bindings + 1 if served <= 1 else 0
        self._calls_at_bind = self._calls
        if self._short_bindings == VOLATILE_BINDINGS and self._on_volatile is not None:
            callback, self._on_volatile = self._on_volatile, None
            callback()

    @staticmethod
    def _still_bound(bound: tuple | None, inputs: Sequence[torch.Tensor]) -> bool:
        if bound is None or bound[4] != aliases.state.epoch:
            return False
        try:
            for position, t, version, address in bound[1]:
                u = inputs[position]
                if u is not t or u._version != version or u.data_ptr() != address:
                    return False
        except RuntimeError:  # inference tensors have no version counter
            return False
        return True

    def _resident_context(self, inputs: Sequence[torch.Tensor]) -> object:
        """The VM context bound to the resident inputs of ``inputs`` (binding them again if changed)."""
        self._calls += 1
        self._last_used = next(bindings.clock)
        bound = self._bound
        if self._still_bound(bound, inputs):
            return bound[0]
        with self._bind_lock:  # threads that find the same change bind once
            bound = self._bound
            return bound[0] if self._still_bound(bound, inputs) else self.bind(inputs)

    def __call__(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Run the NEFF on ``inputs`` (CPU tensors) on the current stream; its outputs as CPU tensors.

        Once work was queued on a stream, a launch runs after the work queued on the current
        stream before it (:meth:`Stream.run`); until then, and whenever that queue is empty,
        it runs at once in the calling thread.
        """
        if forks.state.forked and self._multithreaded:  # the inherited executor has no workers here
            forks.check()
        if _streams_used.any:
            return streams.launch(self._observed, inputs)
        if _observing.active:  # the one flag check when nothing listens
            return self._observed(inputs)
        return self._invoke(inputs)

    def _observed(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        if not _observing.active:
            return self._invoke(inputs)
        device, stream = streams.executing()
        with observe.span("runtime.launch", neff=self.neff.header.key[:16], driver=self.device.driver,
                          graph=self.neff.header.metadata.get("graph", ""),
                          device=device, stream=stream):
            return self._invoke(inputs)

    def _push(self, arguments: Sequence[torch.Tensor]) -> object:
        """The VM argument list of ``arguments``: each imported zero-copy where it can be."""
        from_capsule, parameter_views = self._from_capsule, self._parameter_views
        parameter, plain = torch.nn.Parameter, torch.Tensor
        args = self._list(len(arguments))
        for t in arguments:
            if type(t) is parameter:
                entry = parameter_views.get(id(t))
                if entry is not None and entry[0] == (t.data_ptr(), t.shape, t.stride(), t.dtype):
                    args.push_ref(entry[1])
                    continue
            elif type(t) is plain and t.is_contiguous() and not t.is_neg():  # (dlpack drops the bit)
                address = t.data_ptr()
                if address and address % _ALIGNMENT == 0:  # an empty tensor (address 0) takes _view
                    args.push_ref(from_capsule(_to_dlpack(t)))
                    continue
            args.push_ref(self._view(t))
        return args

    def run_into(self, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        """Run a NEFF compiled with output storage (``compiler/output_storage.py``): its results are
        written into ``outputs``, contiguous and aligned CPU tensors (device memory), on the current stream."""
        if _streams_used.any and not streams.in_worker():  # (a stream's own work is in order already)
            return streams.launch(self._observed_into, inputs, outputs)
        return self._observed_into(inputs, outputs)

    def direct_into(self) -> Callable[[Sequence[torch.Tensor], Sequence[torch.Tensor]], None] | None:
        """:meth:`run_into` without its per-call checks, for a caller that made them once (a launch
        plan, ``device/launch.py``): every input is a call argument, the outputs are contiguous
        aligned device memory, the call is made where it runs (a stream's work, or an idle stream's
        inline run) and nothing observes launches. None for an executable that needs more: copies
        to a GPU's memory, resident parameters, the task executor's threads."""
        if not self._host_memory or self._context is None or self._multithreaded or self._arguments is not None:
            return None
        context, function, new_list, imported, view = (self._context, self._function, self._list,
                                                       self.device.imported, self._view)
        # Argument lists by the arguments' addresses and bits: the plan fixed everything else of
        # each argument (shape, strides, dtype), and a list holds only views that own nothing.
        kept: dict[tuple, object] = {}
        data_ptr, is_neg, is_conj = torch.Tensor.data_ptr, torch.Tensor.is_neg, torch.Tensor.is_conj

        def run(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
            key = (*map(data_ptr, inputs), *map(is_neg, inputs), *map(is_conj, inputs), *map(data_ptr, outputs))
            args = kept.get(key)
            if args is None:
                args, keep = new_list(len(inputs) + len(outputs)), True
                for t in (*inputs, *outputs):
                    imported_view = imported(t)
                    if imported_view is None:  # (a misaligned or negated input: a copy, not kept)
                        imported_view, keep = view(t), False
                    args.push_ref(imported_view)
                if keep:
                    if len(kept) >= _KEPT_LISTS:
                        kept.clear()
                    kept[key] = args
            try:
                context.invoke(function, args, new_list(0))
            except Exception as exc:
                raise NeuronRuntimeError(f"executing the NEFF failed: {exc}") from exc

        return run

    def _observed_into(self, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        if not _observing.active:
            return self._invoke_into(inputs, outputs)
        device, stream = streams.executing()
        with observe.span("runtime.launch", neff=self.neff.header.key[:16], driver=self.device.driver,
                          graph=self.neff.header.metadata.get("graph", ""),
                          device=device, stream=stream):
            return self._invoke_into(inputs, outputs)

    def _invoke_into(self, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        if not self._host_memory:
            self._invoke_copying(inputs, outputs)
            return
        context = self._context
        if context is None:
            context = self._resident_context(inputs)
        arguments = list(inputs) if self._arguments is None else [inputs[i] for i in self._arguments]
        arguments.extend(map(_storage, outputs))
        args = self._push(arguments)
        if self._multithreaded:
            openmp.end_idle_threads()
        try:
            context.invoke(self._function, args, self._list(len(outputs)))
        except Exception as exc:
            raise NeuronRuntimeError(f"executing the NEFF failed: {exc}") from exc

    def _invoke(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        # The hot path of every compiled call: few Python frames, no per-call allocation
        # beyond IREE's argument lists and the DLPack capsules.
        if not self._host_memory:
            return self._invoke_copying(inputs)
        context = self._context
        if context is None:
            context = self._resident_context(inputs)
        arguments = inputs if self._arguments is None else [inputs[i] for i in self._arguments]
        args = self._push(arguments)
        results = self._list(self._num_outputs or 4)
        if self._multithreaded:
            openmp.end_idle_threads()
        try:
            context.invoke(self._function, args, results)
        except Exception as exc:
            raise NeuronRuntimeError(f"executing the NEFF failed: {exc}") from exc
        outputs = []
        get, view_type, to_capsule = results.get_as_object, self._view_type, self._hal.create_dlpack_capsule
        for i in range(results.size):
            outputs.append(_from_dlpack(to_capsule(get(i, view_type), _KDL_CPU, 0)))
        bound = self._bound
        return _unaliased(outputs, arguments, bound[3] if bound is not None and context is bound[0] else ())


    def _invoke_copying(self, inputs: Sequence[torch.Tensor],
                        outputs: Sequence[torch.Tensor] | None = None) -> list[torch.Tensor]:
        """A call on a GPU driver: each argument copied into device memory, each result back into
        ``outputs`` (a NEFF compiled with output storage) or into new CPU tensors."""
        context = self._context
        if context is None:
            context = self._resident_context(inputs)
        arguments = inputs if self._arguments is None else [inputs[i] for i in self._arguments]
        hal = self._hal
        storage = [transfer.empty_on_device(hal, tuple(_storage(t).shape), t.dtype) for t in outputs or ()]
        args = self._list(len(arguments) + len(storage))
        for view in (*transfer.to_device(hal, arguments), *storage):
            args.push_ref(view)
        results = self._list(0 if outputs is not None else self._num_outputs or 4)
        try:
            context.invoke(self._function, args, results)
        except Exception as exc:
            raise NeuronRuntimeError(f"executing the NEFF failed: {exc}") from exc
        if outputs is not None:
            return transfer.to_host(hal, storage, outputs)
        return transfer.to_host(hal, [results.get_as_object(i, self._view_type) for i in range(results.size)])


def _storage(t: torch.Tensor) -> torch.Tensor:
    if type(t) is not torch.Tensor or not t.is_contiguous() or t.data_ptr() % _ALIGNMENT:
        raise NeuronRuntimeError(f"output storage must be contiguous CPU memory aligned to {_ALIGNMENT} bytes, "
                                 f"got {type(t).__name__} of strides {t.stride()} at {t.data_ptr():#x}")
    return t


def _unaliased(outputs: list[torch.Tensor], arguments: Sequence[torch.Tensor],
               resident: Sequence[tuple[int, int]]) -> list[torch.Tensor]:
    """``outputs``, each copied where its memory lies in an input's (an argument, or a
    resident parameter's ``(start, end)`` span).

    IREE returns an input's own buffer for an output equal to it (``x.clone()`` compiled to
    nothing): the caller would get a tensor sharing memory with its input, and a later
    in-place update of one would change the other (an optimizer's momentum buffers followed
    the gradients they were cloned from).

    Of outputs whose memory overlaps, all but the lowest-addressed are copied too: IREE returns
    one buffer for two results it finds equal (a backward's gradients of ``x + a + b`` for ``a``
    and ``b``), and two parameters then shared one ``.grad``: accumulation and
    ``clip_grad_norm_`` hit it twice.
    """
    spans: list[tuple[int, int]] | None = None
    placed: list[tuple[int, int, int]] = []
    for i, out in enumerate(outputs):
        if not out.nbytes:
            continue
        if spans is None:  # each argument's span, read once (an empty tensor has none)
            spans = [(start, start + t.nbytes) for t in arguments if (start := t.data_ptr())]
            spans.extend(resident)
        address = out.data_ptr()
        for start, end in spans:
            if start <= address < end:
                outputs[i] = out.clone()
                break
        else:
            placed.append((address, address + out.nbytes, i))
    if len(placed) > 1:
        placed.sort()
        reach = placed[0][1]
        for start, end, i in placed[1:]:
            if start < reach:  # shares memory with an output before it
                outputs[i] = outputs[i].clone()
            else:
                reach = end
    return outputs


def _check_resident(t: torch.Tensor, spec: dict, position: int) -> None:
    """Refuse a parameter whose dtype or shape is not the compiled one (``model.double()`` after an
    AOT compile, which skips Dynamo's guards): its bytes would be read as the compiled dtype."""
    dtype, shape = str(t.dtype).removeprefix("torch."), list(t.shape)
    wanted = spec.get("shape")
    static = wanted is not None and all(isinstance(d, int) for d in wanted)
    if spec.get("dtype", dtype) != dtype or (static and wanted != shape):
        raise NeuronRuntimeError(
            f"the compiled graph's parameter input {position} is {spec.get('dtype')} {wanted}, the module's "
            f"parameter at that position is now {dtype} {shape} (the module changed after compiling: "
            "compile again, or convert it back)")


def _version(t: torch.Tensor) -> int:
    """The version counter of ``t``; -1 for inference tensors (which have none: bound on every call)."""
    try:
        return t._version
    except RuntimeError:
        return -1
