"""Errors of neuron ops in a backward pass, which PyTorch loses, raised where the backward was called.

(Also here: a gradient given on another device than its output, which the engine does not
check for tensor subclasses, is refused with torch's own message: :func:`_check_devices`. And
with more than one neuron device visible, the engine runs the backward in the calling thread:
it keeps one ready queue per device of the largest count a registered device guard reports,
and the Python guard PyTorch offers reports 1 (``deviceCount`` is not overridable from
Python), so a backward of ``neuron:1`` tensors hit the engine's internal assert
``device_ready_queues_``; single-threaded, every node runs from the CPU ready queue.)

When a Python exception is raised while autograd runs a node on a PrivateUse1
device backed by Python (a neuron op failing in ``__torch_dispatch__``, a hook on
a neuron tensor raising), the engine's device bookkeeping calls back into the
Python device guard while that exception is pending, and the exception is gone:
``loss.backward()`` raises ``SystemError: <built-in method run_backward ...>
returned NULL without setting an exception``, and torch.compile's trace stage
reports only that (the failure behind issue 15's ``UnsafeIndexBackward0`` was a
device mismatch nobody could see). A plain subclass on a PrivateUse1 device does
the same; on ``cpu`` the exception arrives.

So :func:`note` keeps the first exception a neuron op or a user's backward hook (on a
tensor, after accumulation, on a module: their registrations wrap them) raises inside a
backward pass, and :func:`install` wraps autograd's one entry into the engine
(``_engine_run_backward``, which ``backward()`` and ``autograd.grad`` call): when
the engine fails with that SystemError and an exception was kept, the kept one is
raised instead.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

import torch

from torch_neuronx import process

_LOST = "returned NULL without setting an exception"
_lock = threading.Lock()
_open: list[list[Any]] = []  # [call, exception or None] per backward call under way, innermost last
_installed = False


def note(exc: BaseException) -> None:
    """Keep ``exc``, raised by a neuron op, if a backward pass is running (it would be lost)."""
    if torch._C._current_graph_task_id() == -1:
        return  # not in a backward pass: the exception reaches its caller
    with _lock:
        for entry in reversed(_open):  # the innermost call still without one (a reentrant backward's own)
            if entry[1] is None:
                entry[1] = exc
                return


def _run_backward(original: Callable[..., Any]) -> Callable[..., Any]:
    """``original`` (autograd's ``_engine_run_backward``), raising a kept exception instead of the
    engine's SystemError."""

    @functools.wraps(original)
    def run_backward(*args: Any, **kwargs: Any) -> Any:
        if len(args) > 1:
            _check_devices(args[0], args[1])
        entry: list[Any] = [object(), None]
        with _lock:
            _open.append(entry)
        threaded = process.device_count() > 1 and torch._C._is_multithreading_enabled()
        if threaded:
            torch._C._set_multithreading_enabled(False)
        try:
            return original(*args, **kwargs)
        except SystemError as err:
            lost = entry[1]
            if lost is None or _LOST not in str(err):
                raise
            lost.add_note("(raised in the backward pass of neuron tensors; PyTorch's engine had lost it)")
            raise lost from None
        finally:
            if threaded:
                torch._C._set_multithreading_enabled(True)
            with _lock:
                _open.remove(entry)

    return run_backward


def _check_devices(outputs: Any, grads: Any) -> None:
    """torch's error for a gradient on another device than its output, where one is ``neuron``.

    The engine checks devices in ``validate_outputs``, but skips tensor subclasses: a neuron
    cotangent for a CPU output reached an internal assert of the engine (``opt_ready_stream &&
    opt_parent_stream``), and a CPU cotangent for a neuron output was silently taken.
    """
    for i, (out, grad) in enumerate(zip(outputs, grads)):
        if not isinstance(out, torch.Tensor) or not isinstance(grad, torch.Tensor):
            continue
        have, want = grad.device, out.device
        if have != want and "neuron" in (have.type, want.type):
            raise RuntimeError(f"invalid gradient at index {i} - expected device {want} but got {have}")


def _kept(hook: Callable[..., Any]) -> Callable[..., Any]:
    """``hook`` (a user's backward hook), its exception kept by :func:`note` as it propagates."""
    if getattr(hook, "_neuron_kept", False):
        return hook

    @functools.wraps(hook)
    def kept(*args: Any, **kwargs: Any) -> Any:
        try:
            return hook(*args, **kwargs)
        except BaseException as exc:
            note(exc)
            raise

    kept._neuron_kept = True  # type: ignore[attr-defined]
    return kept


def _registering_kept(register: Callable[..., Any]) -> Callable[..., Any]:
    """``Tensor.register_hook`` (or its post-accumulate form) registering :func:`_kept` hooks."""
    @functools.wraps(register)
    def wrapper(self: torch.Tensor, hook: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return register(self, _kept(hook), *args, **kwargs)

    return wrapper


def _hooks_kept() -> None:
    """Hooks on tensors and modules' backward hooks keep their exceptions (see the module)."""
    import torch.utils.hooks

    for name in ("register_hook", "register_post_accumulate_grad_hook"):
        setattr(torch.Tensor, name, _registering_kept(getattr(torch.Tensor, name)))
    backward_hook = torch.utils.hooks.BackwardHook
    original_init = backward_hook.__init__

    @functools.wraps(original_init)
    def init(self: Any, module: Any, user_hooks: list, user_pre_hooks: list) -> None:
        original_init(self, module, [_kept(h) for h in user_hooks], [_kept(h) for h in user_pre_hooks])

    backward_hook.__init__ = init


def install() -> None:
    """Wrap autograd's entry into the engine (under both names it is called by) and the
    registration of backward hooks; idempotent."""
    global _installed
    if _installed:
        return
    import torch.autograd
    import torch.autograd.graph

    wrapped = torch._disable_dynamo(_run_backward(torch.autograd.graph._engine_run_backward))
    torch.autograd.graph._engine_run_backward = wrapped
    torch.autograd._engine_run_backward = wrapped
    _hooks_kept()
    _installed = True
