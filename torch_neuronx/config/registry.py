"""The registry of configuration variables and the lookup of their effective values.

:class:`Var` describes one variable; :func:`register` adds entries (the table in
:mod:`torch_neuronx.config.table` does, at import). :func:`lookup` and :func:`get`
answer a variable's value: an :func:`override` frame of the calling thread first, then
the environment (parsed once per raw string), then the default. A malformed value logs
one warning naming the variable and what is accepted, and the default is used, except for a
``strict`` variable (one whose specification accepts only its listed values), which raises
:class:`~torch_neuronx.config.parsers.InvalidVariableError` where it is read.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

from torch_neuronx.config.parsers import ConfigValueError, InvalidVariableError

_log = logging.getLogger("torch_neuronx.config")


@dataclasses.dataclass(frozen=True)
class Var:
    """One environment variable: everything there is to know about it.

    The modules of torch_neuronx that read it are not listed here: they are derived
    from the source (:mod:`torch_neuronx.config.readers`). ``external_readers`` names
    readers outside the package, which scanning its source cannot find.
    """

    name: str
    type: str  # the documented type: bool, int, str, path
    default: Any  # a value, or a zero-argument callable for computed defaults
    doc: str
    section: str
    parse: Callable[[str], Any]
    default_doc: str = ""  # how the default reads in the specification, when not literal
    external_readers: tuple[str, ...] = ()  # readers outside torch_neuronx, e.g. "torch (PyTorch reads it itself)"
    status: str = "built"  # "built", or what is missing, e.g. "planned: issue 5 (eager device)"
    ours: bool = False  # an extension of torch_neuronx, not in the TorchNeuron specification
    strict: bool = False  # an invalid value raises InvalidVariableError instead of warning

    def default_value(self) -> Any:
        """The default, computed now when it is a callable."""
        return self.default() if callable(self.default) else self.default

    def documented_default(self) -> str:
        """The default as the specification and docs/environment.md write it."""
        if self.default_doc:
            return self.default_doc
        value = self.default_value()
        if isinstance(value, bool):
            return "1" if value else "0"
        return '""' if value == "" else str(value)


_REGISTRY: dict[str, Var] = {}


def register(*entries: Var) -> None:
    """Add ``entries`` to the registry, in order; a name may be registered once."""
    for entry in entries:
        assert entry.name not in _REGISTRY, entry.name
        _REGISTRY[entry.name] = entry


def variables() -> list[Var]:
    """Every registered variable, in specification order."""
    return list(_REGISTRY.values())


def var(name: str) -> Var:
    """The registry entry for ``name``; KeyError names the known variables."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"{name!r} is not a torch_neuronx configuration variable") from None


# -- programmatic overrides --------------------------------------------------


class _Overrides(threading.local):
    """Each thread's stack of :func:`override` frames (a missing attribute of a plain
    ``threading.local`` costs a caught AttributeError on every lookup)."""

    def __init__(self) -> None:
        self.stack: list[dict[str, Any]] = []


_overrides = _Overrides()


def overridden() -> bool:
    """Whether an :func:`override` block is active in this thread (cheap: callers on hot paths
    that cache decisions taken from variables check it before trusting them)."""
    return bool(_overrides.stack)


@contextlib.contextmanager
def override(**values: Any) -> Iterator[None]:
    """Set variables programmatically (they win over the environment) inside a block.

    ``None`` values are ignored so callers can pass optional options straight through.
    """
    for name in values:
        var(name)
    stack = _overrides.stack
    stack.append({k: v for k, v in values.items() if v is not None})
    try:
        yield
    finally:
        stack.pop()


# -- the environment ---------------------------------------------------------

_POSIX = os.name == "posix"
_environ_keys: dict[str, bytes] = {}
_FS_ENCODING = sys.getfilesystemencoding()


def _environ(name: str) -> str | None:
    """``os.environ.get(name)``, cheaper.

    Compiled calls read variables on every call. ``os.environ`` answers an unset name
    by raising and catching KeyError (0.8 us); on POSIX its underlying bytes mapping,
    which every write to ``os.environ`` updates, answers in 0.1 us.
    """
    environ = os.environ
    data = getattr(environ, "_data", None) if _POSIX else None
    if type(data) is not dict:  # not CPython's POSIX os._Environ: the plain lookup
        return environ.get(name)
    key = _environ_keys.get(name)
    if key is None:
        key = _environ_keys[name] = os.fsencode(name)
    value = data.get(key)
    return None if value is None else value.decode(_FS_ENCODING, "surrogateescape")


# -- lookup ------------------------------------------------------------------

_warned: set[tuple[str, str]] = set()
_parsed: dict[tuple[str, str], Any] = {}  # (name, raw) -> parsed value; parsing once keeps get() cheap


def lookup(name: str) -> tuple[Any, str]:
    """Return ``(value, source)`` where source is ``option``, ``environment`` or ``default``."""
    stack = _overrides.stack
    if stack:
        for frame in reversed(stack):
            if name in frame:
                return frame[name], "option"
    entry = _REGISTRY.get(name) or var(name)
    raw = _environ(name)
    if raw is None:
        return entry.default_value(), "default"
    cached = _parsed.get((name, raw), _parsed)
    if cached is not _parsed:
        return cached, "environment"
    try:
        value = _parsed[(name, raw)] = entry.parse(raw)
        return value, "environment"
    except ConfigValueError as exc:
        if entry.strict:
            raise InvalidVariableError(f"{name}={raw!r} is not valid: {exc}") from None
        _warn_invalid(entry, raw, exc)
        return entry.default_value(), "default (environment value invalid)"


def _warn_invalid(entry: Var, raw: str, exc: ConfigValueError) -> None:
    """Log, once per (variable, raw value), that the value is not valid."""
    if (entry.name, raw) not in _warned:
        _warned.add((entry.name, raw))
        _log.warning(
            "%s=%r is not valid: %s; using the default %s",
            entry.name, raw, exc, entry.documented_default(),
        )


#: name -> (its key in os.environ's bytes mapping, the raw value read, the value it gave): get() on a
#: hot path answers from here while the environment still holds that very raw object.
_answers: dict[str, tuple[bytes, bytes | None, Any]] = {}


def get(name: str) -> Any:
    """The effective value of a variable.

    Read on every call (hot paths call it per op): an unchanged environment entry is recognized
    by identity (every write to ``os.environ`` stores a new object), so a repeated read costs
    two dict lookups; anything else (an override, a changed value) goes through :func:`lookup`.
    """
    data = getattr(os.environ, "_data", None) if _POSIX else None
    if type(data) is not dict or _overrides.stack:
        return lookup(name)[0]
    answer = _answers.get(name)
    if answer is not None and data.get(answer[0]) is answer[1]:
        return answer[2]
    value, source = lookup(name)
    key = _environ_keys.get(name)
    entry = _REGISTRY.get(name)
    if key is not None and entry is not None and not (source == "default" and callable(entry.default)):
        _answers[name] = (key, data.get(key), value)  # (a default computed per call is never kept)
    return value
