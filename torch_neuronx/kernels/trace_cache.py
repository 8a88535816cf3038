"""The NKI trace cache: kernel traces persisted across processes (NKI_ENABLE_TRACE_CACHE).

Entries live at NKI_TRACE_CACHE_URL (a path or a ``file://`` URL), else at
``/var/tmp/nki-trace-cache-uid<uid>/``. Each entry is a :class:`Trace` as JSON
in the HLO cache's file format: written atomically, with a header holding the
key, length and SHA-256 of the text; a read verifies them and a corrupt entry
is removed (and the kernel traced again), never served. Cache I/O errors are
warnings, never failures of the user's program.

An entry is also what a hit needs to run without the Python function: the
compile plan of the kernel's graph and the structure of its result (see
:mod:`torch_neuronx.pipeline.trace`). The key (:func:`trace_key`) is built like the NEFF cache's keys, from named
components hashed one by one and logged at DEBUG, so two keys say which
component differs: the kernel's qualified name, its source, its declared
(non-tensor) arguments, its tensor specs, the wheel versions of its source
files and the toolchain that lowered it.
"""

from __future__ import annotations

import functools
import importlib.metadata
import logging
import os
import threading
import urllib.parse
from collections.abc import Sequence
from typing import Any

import torch

from torch_neuronx import config
from torch_neuronx.cache import atomic
from torch_neuronx.cache.keys import CacheKey, canonical_json, key_from_components
from torch_neuronx.cache.store import HloCache
from torch_neuronx.compiler import hlo
from torch_neuronx.pipeline import trace as trace_mod
from torch_neuronx.version import __version__

_log = logging.getLogger("torch_neuronx.kernels")

_warned_urls: set[str] = set()
_caches: dict[str, HloCache] = {}
_caches_lock = threading.Lock()


def enabled() -> bool:
    """Whether traces persist across processes (NKI_ENABLE_TRACE_CACHE, default 1)."""
    return bool(config.get("NKI_ENABLE_TRACE_CACHE"))


def default_directory() -> str:
    """``/var/tmp/nki-trace-cache-uid<uid>/``."""
    return f"/var/tmp/nki-trace-cache-uid{os.getuid()}/"


def directory() -> str:
    """Where entries live: NKI_TRACE_CACHE_URL as a path or ``file://`` URL, else the default.

    Any other URL scheme is not supported: one warning, and the default directory is used.
    """
    url = config.get("NKI_TRACE_CACHE_URL").strip()
    if not url:
        return default_directory()
    parsed = urllib.parse.urlparse(url)
    if not parsed.scheme:
        return os.path.expanduser(url)
    if parsed.scheme == "file" and parsed.netloc in ("", "localhost"):
        return urllib.parse.unquote(parsed.path)
    if url not in _warned_urls:
        _warned_urls.add(url)
        _log.warning("NKI_TRACE_CACHE_URL=%r is not supported: only a local path or a file:// URL is; "
                     "using %s", url, default_directory())
    return default_directory()


def _store() -> HloCache:
    root = directory()
    with _caches_lock:
        if root not in _caches:
            _caches[root] = HloCache(root, "trace")
        return _caches[root]


@functools.cache
def _toolchain() -> dict[str, Any]:
    try:
        torch_mlir = importlib.metadata.version("torch-mlir")
    except importlib.metadata.PackageNotFoundError:
        torch_mlir = "unknown"
    return {"torch": torch.__version__, "torch_mlir": torch_mlir, "torch_neuronx": __version__,
            "lowering": hlo.lowering_versions(),
            "trace_format": trace_mod.FORMAT}


def trace_key(*, kernel: str, source: str, declared: Any, tensors: Any,
              wheels: Sequence[str | None]) -> CacheKey:
    """The trace cache key of one kernel signature.

    Components, in order: ``kernel`` (module and qualified name), ``source``
    (``inspect.getsource`` of the function), ``declared_arguments`` (the
    argument structure and non-tensor values), ``tensor_specs`` (shapes and
    dtypes), ``wheels`` (``name==version`` owning each source file, or null),
    ``toolchain`` (torch, torch-mlir, torch_neuronx, lowering and trace format
    versions, and the lowering configuration).
    """
    parts: list[tuple[str, bytes]] = []
    details: dict[str, Any] = {}
    toolchain = {**_toolchain(), "complex_decompose": config.get("TORCH_NEURONX_COMPLEX_DECOMPOSE")}
    for name, value in (("kernel", kernel), ("source", source), ("declared_arguments", declared),
                        ("tensor_specs", tensors), ("wheels", list(wheels)), ("toolchain", toolchain)):
        text = value if isinstance(value, str) else canonical_json(value, name)
        parts.append((name, text.encode("utf-8")))
        if name != "source":
            details[name] = value
    return key_from_components(parts, details, kernel, "trace")


def get(key: CacheKey) -> trace_mod.Trace | None:
    """The verified trace of ``key``, or None (absent, unreadable or corrupt: then removed)."""
    store = _store()
    text = store.get(key.digest)
    if text is None:
        return None
    try:
        return trace_mod.Trace.from_json(text)
    except (ValueError, KeyError, TypeError) as exc:
        _log.warning("NKI trace cache entry %s of kernel %s is not a valid trace (%s); removing it",
                     store.path(key.digest), key.graph_id, exc)
        atomic.remove_quietly(store.path(key.digest))
        return None


def put(key: CacheKey, trace: trace_mod.Trace) -> str | None:
    """Store ``trace`` under ``key`` atomically; its path, or None when it was not written."""
    text = trace.to_json()
    if text is None:
        _log.info("the trace of kernel %s is not persisted: its result holds values without a JSON form",
                  key.graph_id)
        return None
    return _store().put(key.digest, text)
