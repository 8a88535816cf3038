"""FX tracing confined to the thread that traces.

While torch's FX tracer runs (aot_autograd traces every graph with ``record_module_stack=True``;
the dynamic-shape trace too), it patches ``torch.nn.Module.__call__`` and ``__getattr__`` for
the whole process. Another thread calling a module meanwhile went through the tracer's wrapper:
a server's warm compiled model raised "Detected that you are using FX to symbolically trace a
dynamo-optimized function", or Dynamo's internal errors, while one thread compiled a new model
(inductor shares the race; the longer traces of this backend's decompositions made it frequent).
Two process-wide states cause it, and :func:`install` confines both to the tracing thread:

- the tracer's module patches: wrapped so that every other thread calls what was there before
  (it also kept other threads' module calls out of the graph being traced);
- the "FX is tracing" flag Dynamo checks before running a compiled function
  (``is_fx_symbolic_tracing``, captured by every ``torch.compile`` wrapper when it is made): it
  now also asks whether this thread is inside ``Tracer.trace``.

Dynamo compiling in another thread meanwhile cannot be kept out that way: it reads
``nn.Module``'s methods from the class (``inspect.getattr_static``) and inlined the
thread-choosing wrapper ("Unsupported ... _thread.get_ident"; a graph break without
``fullgraph``). So a trace also holds Dynamo's own compile lock (``convert_frame.compile_lock``,
re-entrant: a trace inside a compile, this backend's, already holds it), as every Dynamo compile
does: no thread compiles while another's trace has nn.Module patched. (A thread that holds it
and waits for a trace it handed to another thread, an eager kernel's on the compile thread,
lends it: ``pipeline.trace.compile_lock_lent``.) An eager kernel's trace
in a thread that is not compiling waits for a compile under way in another thread. And the
tracer's "current patcher" is per thread (torch keeps one for the process: two threads tracing
at once reverted each other's patches and failed with "CURRENT_PATCHER is None in finally
block").
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Iterator
from typing import Any

import torch
from torch.fx import _symbolic_trace

from torch_neuronx.pipeline import trace as tracing

__all__ = ["install"]

_installed = False
_here = threading.local()  # depth: this thread's open Tracer.trace calls


def _traces_here() -> bool:
    return getattr(_here, "depth", 0) > 0


def _counted(trace: Any) -> Any:
    from torch._dynamo.convert_frame import compile_lock

    @functools.wraps(trace)
    def trace_counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        with contextlib.nullcontext() if tracing.compile_lock_is_lent() else compile_lock:
            _here.depth = getattr(_here, "depth", 0) + 1
            try:
                return trace(self, *args, **kwargs)
            finally:
                _here.depth -= 1

    return trace_counted


_patchers = threading.local()  # current: this thread's innermost FX patcher


@contextlib.contextmanager
def _new_patcher() -> Iterator[Any]:
    """torch.fx's ``_new_patcher``, its current patcher this thread's."""
    prior = getattr(_patchers, "current", None)
    patcher = _patchers.current = _symbolic_trace._Patcher()
    try:
        yield patcher
    finally:
        patcher.revert_all_patches()
        _patchers.current = prior


@contextlib.contextmanager
def _maybe_revert_all_patches() -> Iterator[None]:
    """torch.fx's ``_maybe_revert_all_patches`` (Dynamo compiling inside a trace): this thread's patches only."""
    current = getattr(_patchers, "current", None)
    if current is not None:
        current.revert_all_patches()
    try:
        yield
    finally:
        if current is not None:
            current.reapply_all_patches()


def _thread_aware_flag() -> bool:  # its code replaces is_fx_symbolic_tracing's (same globals)
    return _is_fx_tracing_flag and _neuron_traces_here() and not torch.compiler.is_compiling()  # noqa: F821


def _confined(patch_method: Any) -> Any:
    @functools.wraps(patch_method)
    def patch_method_in_this_thread(self: Any, cls: type, name: str, new_fn: Any, deduplicate: bool = True) -> Any:
        original = getattr(cls, name)
        if cls is not torch.nn.Module or getattr(original, "__fx_already_patched", False):
            return patch_method(self, cls, name, new_fn, deduplicate)
        owner = threading.get_ident()

        @functools.wraps(new_fn)
        def in_tracing_thread(*args: Any, **kwargs: Any) -> Any:
            if threading.get_ident() == owner:
                return new_fn(*args, **kwargs)
            return original(*args, **kwargs)

        return patch_method(self, cls, name, in_tracing_thread, deduplicate)

    return patch_method_in_this_thread


def install() -> None:
    """Confine FX's module patches to the tracing thread (once per process)."""
    global _installed
    if not _installed:
        _symbolic_trace._Patcher.patch_method = _confined(_symbolic_trace._Patcher.patch_method)
        _symbolic_trace._new_patcher = _new_patcher
        _symbolic_trace._maybe_revert_all_patches = _maybe_revert_all_patches
        _symbolic_trace.Tracer.trace = _counted(_symbolic_trace.Tracer.trace)
        # The function object itself changes: the wrappers made before hold it, not its name.
        _symbolic_trace._neuron_traces_here = _traces_here
        _symbolic_trace.is_fx_symbolic_tracing.__code__ = _thread_aware_flag.__code__
        _installed = True
