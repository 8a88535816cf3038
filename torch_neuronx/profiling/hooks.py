"""Where the Neuron session hangs off torch.profiler (torch has no public start/stop hook).

:func:`install` (run once on ``import torch_neuronx``) wraps:

- ``_KinetoProfile.start_trace``/``stop_trace``: they fire when recording starts and ends (with
  ``schedule=``, around the active steps only) and see ``activities`` and
  ``experimental_config``. A session starts when ``ProfilerActivity.PrivateUse1`` is profiled and
  either a :class:`~.options.NeuronConfig` is given or TORCH_NEURONX_PROFILE_DEFAULT_SESSION is on,
  on the ranks TORCH_NEURONX_PROFILE_RANKS lists;
- ``_KinetoProfile.export_chrome_trace``: torch's C++ writes the file, then the session's
  events are merged into it (``export_chrome_trace`` and ``tensorboard_trace_handler``);
- ``torch.autograd.profiler.profile._ensure_function_events``: the session's device spans join
  ``events()``/``key_averages()`` as ``FunctionEvent``\\ s of device type PrivateUse1;
- ``torch.autograd.profiler.profile.__init__``: the legacy profiler with ``use_device="neuron"``
  defaults to ``use_kineto=False``, which fails in torch's C++ for a Python-only device: kineto
  is forced (no Neuron session is started for the legacy profiler).
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import torch
import torch.autograd.profiler as autograd_profiler
from torch.autograd import DeviceType
from torch.autograd.profiler_util import FunctionEvent
from torch.profiler import ProfilerActivity
from torch.profiler import profiler as torch_profiler

from torch_neuronx import config, process
from torch_neuronx.profiling import options
from torch_neuronx.profiling.session import Session

_log = logging.getLogger("torch_neuronx.profiling")
_installed = False
SESSION_ATTR = "_neuron_session"
#: Categories whose spans are device work, reported in torch's device-time columns.
DEVICE_CATEGORIES = ("transfer", "collective")
DEVICE_SPANS = ("runtime.launch",)


def wants_session(prof: Any) -> bool:
    """Whether ``prof`` (a ``_KinetoProfile``) records Neuron data on this rank."""
    if ProfilerActivity.PrivateUse1 not in getattr(prof, "activities", ()):
        return False
    if not isinstance(prof.experimental_config, options.NeuronConfig) and \
            not config.get("TORCH_NEURONX_PROFILE_DEFAULT_SESSION"):
        return False
    return options.captures_this_rank(process.rank())


def start_session(prof: Any) -> Session | None:
    """Start a session for ``prof`` when it wants one; it is kept on ``prof``."""
    setattr(prof, SESSION_ATTR, None)
    if not wants_session(prof):
        return None
    cfg = prof.experimental_config if isinstance(prof.experimental_config, options.NeuronConfig) else None
    session = Session(options.resolve(cfg))
    session.start()
    setattr(prof, SESSION_ATTR, session)
    return session


def _synchronize() -> None:
    """Let queued neuron work finish, so its events fall inside torch's window."""
    module = getattr(torch, "neuron", None)
    if module is not None and hasattr(module, "synchronize"):
        module.synchronize()


def stop_session(prof: Any) -> None:
    """Stop ``prof``'s running session (queued work finished first)."""
    session: Session | None = getattr(prof, SESSION_ATTR, None)
    if session is None or not session.running:
        return
    try:
        _synchronize()
    finally:
        session.stop()


def function_events(session: Session, trace_start_ns: int, use_device: str) -> list[FunctionEvent]:
    """The session's device spans as torch ``FunctionEvent``\\ s (µs from ``trace_start_ns``)."""
    from torch_neuronx.profiling.chrome import label

    out = []
    for i, r in enumerate(session.records()):
        if r.kind != "span" or not (r.name in DEVICE_SPANS or r.category in DEVICE_CATEGORIES):
            continue
        out.append(FunctionEvent(
            id=-(i + 1), name=label(r), thread=r.thread % 2**31, start_us=(r.start_ns - trace_start_ns) / 1000.0,
            end_us=(r.end_ns - trace_start_ns) / 1000.0, use_device=use_device, device_type=DeviceType.PrivateUse1,
            device_index=r.device or 0, device_resource_id=r.stream, stack=[], input_shapes=[], trace_name=r.name))
    return out


def _add_function_events(profile: Any) -> None:
    session: Session | None = getattr(profile, SESSION_ATTR, None)
    if session is None or profile._function_events is None or profile.kineto_results is None:
        return
    use_device = profile.use_device or torch._C._get_privateuse1_backend_name()
    for event in function_events(session, profile.kineto_results.trace_start_ns(), use_device):
        profile._function_events.append(event)


def install() -> None:
    """Wrap torch.profiler once (idempotent)."""
    global _installed
    if _installed:
        return
    kineto = torch_profiler._KinetoProfile
    legacy = autograd_profiler.profile
    start_trace, stop_trace, export = kineto.start_trace, kineto.stop_trace, kineto.export_chrome_trace
    ensure, legacy_init = legacy._ensure_function_events, legacy.__init__

    @functools.wraps(start_trace)
    def neuron_start_trace(self: Any) -> None:
        start_trace(self)
        try:
            start_session(self)
        except Exception as exc:  # the profiler must never break the user's program
            _log.warning("could not start the neuron profiling session: %s", exc)

    @functools.wraps(stop_trace)
    def neuron_stop_trace(self: Any) -> None:
        try:
            stop_session(self)
        except Exception as exc:
            _log.warning("could not stop the neuron profiling session: %s", exc)
        if self.profiler is not None:  # before torch's stop, which may build the function events
            setattr(self.profiler, SESSION_ATTR, getattr(self, SESSION_ATTR, None))
        stop_trace(self)

    @functools.wraps(export)
    def neuron_export_chrome_trace(self: Any, path: str, use_python_export: bool = False) -> Any:
        result = export(self, path, use_python_export=use_python_export)
        session: Session | None = getattr(self, SESSION_ATTR, None)
        if session is not None:
            from torch_neuronx.profiling import chrome

            chrome.merge_into(path, session.trace_events, session.metadata())
        return result

    @functools.wraps(ensure)
    def neuron_ensure_function_events(self: Any) -> None:
        fresh = self._function_events is None
        ensure(self)
        if fresh:
            _add_function_events(self)

    @functools.wraps(legacy_init)
    def neuron_legacy_init(self: Any, *args: Any, **kwargs: Any) -> None:
        if kwargs.get("use_device") == torch._C._get_privateuse1_backend_name() and not kwargs.get("use_kineto"):
            kwargs["use_kineto"] = True  # the fallback path asserts in C++ for a Python-only device
        legacy_init(self, *args, **kwargs)

    kineto.start_trace, kineto.stop_trace = neuron_start_trace, neuron_stop_trace
    kineto.export_chrome_trace = neuron_export_chrome_trace
    legacy._ensure_function_events, legacy.__init__ = neuron_ensure_function_events, neuron_legacy_init
    _installed = True
