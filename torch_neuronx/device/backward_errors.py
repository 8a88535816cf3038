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
tensor, after accumulation, on an autograd node, on a module, a saved tensor's unpack hook:
their registrations wrap them, and check what the hook returns as the engine would) raises
inside a backward pass, and :func:`install` wraps autograd's one entry into the engine
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
#: Exceptions torch raises and catches itself inside a backward pass (checkpoint's early stop of a
#: recomputation, from its pack hook), never the reason a backward failed.
_CONTROL_FLOW = frozenset({"_StopRecomputationError"})


def note(exc: BaseException) -> None:
    """Keep ``exc``, raised by a neuron op, if a backward pass is running (it would be lost)."""
    if torch._C._current_graph_task_id() == -1:
        return  # not in a backward pass: the exception reaches its caller
    if type(exc).__name__ in _CONTROL_FLOW:
        return
    with _lock:
        if _open:  # the innermost call's, the latest (an earlier one may have been handled)
            _open[-1][1] = exc


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


def _tensor_hook_result(result: Any) -> None:
    if result is not None and not isinstance(result, torch.Tensor):
        raise TypeError(f"expected Variable, but hook returned '{type(result).__name__}'")


def _post_accumulate_result(result: Any) -> None:
    if isinstance(result, torch.Tensor):
        raise RuntimeError("Tensor post accumulate grad hooks should return None.")
    _tensor_hook_result(result)


def _node_hook_result(result: Any) -> None:
    if result is not None and not isinstance(result, tuple | list):
        raise TypeError(f"expected tuple, but hook returned '{type(result).__name__}'")


def _kept(hook: Callable[..., Any], check: Callable[[Any], None] | None = None) -> Callable[..., Any]:
    """``hook`` (a user's backward hook), its exception kept by :func:`note` as it propagates; with
    ``check``, torch's own check of what it returns made here (the engine's error for a wrong
    result is lost too)."""
    if getattr(hook, "_neuron_kept", False) or not callable(hook):
        return hook

    @functools.wraps(hook)
    def kept(*args: Any, **kwargs: Any) -> Any:
        try:
            result = hook(*args, **kwargs)
            if check is not None:
                check(result)
            return result
        except BaseException as exc:
            note(exc)
            raise

    kept._neuron_kept = True  # type: ignore[attr-defined]
    return kept


def _registering_kept(register: Callable[..., Any], check: Callable[[Any], None]) -> Callable[..., Any]:
    """``Tensor.register_hook`` (or its post-accumulate form) registering :func:`_kept` hooks."""
    @functools.wraps(register)
    def wrapper(self: torch.Tensor, hook: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return register(self, _kept(hook, check), *args, **kwargs)

    return wrapper


def _hooks_kept() -> None:
    """Hooks on tensors, on autograd's nodes (``grad_fn.register_hook`` / ``register_prehook``,
    which register through ``Function._register_hook``), modules' backward hooks and the hooks
    of ``saved_tensors_hooks`` (``torch.utils.checkpoint``'s recomputation) keep their exceptions
    (see the module)."""
    import torch.autograd.function
    import torch.autograd.graph
    import torch.utils.hooks

    torch.Tensor.register_hook = _registering_kept(torch.Tensor.register_hook, _tensor_hook_result)
    torch.Tensor.register_post_accumulate_grad_hook = _registering_kept(
        torch.Tensor.register_post_accumulate_grad_hook, _post_accumulate_result)
    register_node_hook = torch.autograd.function.Function._register_hook  # a staticmethod

    def node_hook(backward_hooks: Any, hook: Callable[..., Any]) -> Any:
        return register_node_hook(backward_hooks, _kept(hook, _node_hook_result))

    torch.autograd.function.Function._register_hook = staticmethod(node_hook)
    backward_hook = torch.utils.hooks.BackwardHook
    original_init = backward_hook.__init__

    @functools.wraps(original_init)
    def init(self: Any, module: Any, user_hooks: list, user_pre_hooks: list) -> None:
        original_init(self, module, [_kept(h) for h in user_hooks], [_kept(h) for h in user_pre_hooks])

    backward_hook.__init__ = init
    saved_hooks = torch.autograd.graph.saved_tensors_hooks
    saved_init = saved_hooks.__init__

    @functools.wraps(saved_init)
    def saved_tensors_init(self: Any, pack_hook: Callable[..., Any], unpack_hook: Callable[..., Any]) -> None:
        saved_init(self, _kept(pack_hook), _kept(unpack_hook))

    saved_hooks.__init__ = saved_tensors_init
    _custom_gradients_checked()


def _custom_gradients_checked() -> None:
    """A custom ``autograd.Function``'s backward returning a gradient on another device than its
    input, one of them ``neuron``, raises torch's error there: the engine checks devices only for
    plain tensors, and a CPU gradient of a neuron parameter was accepted (its ``.grad`` a CPU
    tensor, the failure at ``optimizer.step()``)."""
    import torch.autograd.function

    backward = torch.autograd.function.BackwardCFunction
    for name in ("apply", "apply_boxed"):
        original = getattr(backward, name)

        def checked(self: Any, *args: Any, _original: Callable[..., Any] = original) -> Any:
            result = _original(self, *args)
            try:
                _check_custom_gradients(self, result)
            except BaseException as exc:
                note(exc)
                raise
            return result

        setattr(backward, name, functools.wraps(original)(checked))


def _check_custom_gradients(node: Any, result: Any) -> None:
    grads = result if isinstance(result, tuple | list) else (result,)
    for i, (grad, (parent, position)) in enumerate(zip(grads, node.next_functions)):
        if parent is None or not isinstance(grad, torch.Tensor):
            continue
        have, want = grad.device, parent._input_metadata[position].device
        if have != want and "neuron" in (have.type, want.type):
            raise RuntimeError(f"Function {type(node).__name__} returned an invalid gradient at index {i} - "
                               f"expected device {want} but got {have}")


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
