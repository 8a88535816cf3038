"""Which installed wheel owns a source file, for the NKI trace cache key.

A trace is keyed on the kernel's own source, not on the code it calls. To
notice that called code changed, the key also holds the version of the wheel
each source file belongs to: upgrading the wheel busts the cache. A file
belongs to a distribution when the ``RECORD`` of one of its ``.dist-info``
directories lists it (as pip writes it at install time). Editable installs,
vendored copies and plain directories on ``sys.path`` belong to none: they get
a one-time warning, since edits there cannot be detected.
"""

from __future__ import annotations

import functools
import importlib.metadata
import logging
import os

_log = logging.getLogger("torch_neuronx.kernels")

_warned: set[str] = set()


@functools.cache
def _installed() -> tuple[tuple[str, importlib.metadata.Distribution], ...]:
    """Every distribution on ``sys.path`` with the real path of the directory its RECORD is relative to."""
    found = []
    for dist in importlib.metadata.distributions():
        try:
            root = os.path.realpath(str(dist.locate_file("")))
        except (OSError, NotImplementedError):
            continue
        found.append((root, dist))
    return tuple(found)


@functools.cache
def _record(dist: importlib.metadata.Distribution) -> str:
    """The distribution's RECORD as ``"\\n" + text`` ("" when it has none: not installed from a wheel)."""
    try:
        return "\n" + (dist.read_text("RECORD") or "")
    except OSError:
        return ""


@functools.cache
def owner(path: str) -> str | None:
    """``"name==version"`` of the installed distribution whose RECORD lists ``path``, else None."""
    real = os.path.realpath(path)
    for root, dist in _installed():
        if not real.startswith(root.rstrip(os.sep) + os.sep):
            continue
        relative = os.path.relpath(real, root).replace(os.sep, "/")
        record = _record(dist)
        if f"\n{relative}," in record or f'\n"{relative}",' in record:
            return f"{dist.metadata['Name']}=={dist.version}"
    return None


def versions(paths: list[str]) -> dict[str, str | None]:
    """The owning wheel of each source file; warns once per file that belongs to none."""
    found = {path: owner(path) for path in paths}
    for path, version in found.items():
        if version is None and path not in _warned:
            _warned.add(path)
            _log.warning(
                "kernel source file %s belongs to no installed wheel (no .dist-info RECORD lists it): "
                "the NKI trace cache keys kernels defined there on their own source only, so edits to "
                "code they call outside that source cannot be detected and may be served a stale trace. "
                "Install the code as a wheel, or clear the trace cache (NKI_TRACE_CACHE_URL) or set "
                "NKI_ENABLE_TRACE_CACHE=0 after such edits.", path)
    return found
