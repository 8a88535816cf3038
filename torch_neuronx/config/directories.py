"""Directories named by path variables, made before they are used.

:func:`directory` answers a path variable's directory, created if missing. A directory that
cannot be created or written (a path through a file, a read-only mount) is not an error where
the specification gives the variable a default: one warning names the variable, the path and
why, and the default directory is used instead, as for any other invalid value. When the
default cannot be used either (another user made ``/tmp/neuron_backend`` first), this user's
sibling of it (``/tmp/neuron_backend-<user>``) is; only when that fails too is it an error.
"""

from __future__ import annotations

import getpass
import logging
import os
import threading

from torch_neuronx.config.registry import get, var

__all__ = ["UnusableDirectoryError", "directory"]

_log = logging.getLogger("torch_neuronx.config")
_lock = threading.RLock()  # reentrant: see process.at_termination
_usable: dict[tuple[str, str], str] = {}  # (variable, configured path) -> the directory used


class UnusableDirectoryError(OSError):
    """Neither the directory a path variable names nor its default can be created and written."""


def _problem(path: str) -> str | None:
    """Why ``path`` cannot serve as a writable directory; None when it can (it is created)."""
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        return exc.strerror or str(exc)
    if not os.access(path, os.W_OK | os.X_OK):
        return "not writable"
    return None


def directory(name: str) -> str:
    """The directory of path variable ``name`` (created), or its default with one warning when
    the configured one is unusable; :class:`UnusableDirectoryError` when neither is usable."""
    configured = get(name)
    found = _usable.get((name, configured))
    if found is not None and os.path.isdir(found):
        return found
    with _lock:
        problem = _problem(configured)
        if problem is None:
            _usable[(name, configured)] = configured
            return configured
        default = var(name).default_value()
        fallback = _problem(default) if default != configured else problem
        if fallback is None:
            if (name, configured) not in _usable:
                _log.warning("%s=%r cannot be used as a directory (%s); using the default %s",
                             name, configured, problem, default)
            _usable[(name, configured)] = default
            return default
        own = _per_user(default)
        if _problem(own) is not None:
            raise UnusableDirectoryError(
                f"{name}={configured!r} cannot be used as a directory ({problem})"
                + ("" if default == configured else f", nor can its default {default!r} ({fallback})"))
        if (name, configured) not in _usable:
            _log.warning("%s=%r cannot be used as a directory (%s)%s; using %s (this user's)", name, configured,
                         problem, "" if default == configured else f", nor can its default {default} ({fallback})",
                         own)
        _usable[(name, configured)] = own
        return own


def _per_user(default: str) -> str:
    """This user's sibling of a shared default directory: another user made ``/tmp/neuron_backend``
    (mode 0755) first, and every compile of this user failed (inductor's is per user from the start)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (a container's arbitrary uid)
        user = f"uid{os.getuid()}"
    return f"{default.rstrip(os.sep)}-{user}"
