"""The AOT package file: a compiled function's Dynamo state, plan and NEFFs in one verified file.

Layout (integers little-endian)::

    offset 0   8 bytes  magic b"TNXAOTPK"
    offset 8   u32      format version (FORMAT_VERSION)
    offset 12  u32      header length H
    offset 16  H bytes  JSON header: versions (torch_neuronx, torch, python), the target, its
                        compiler version and configuration, the callable's input specs, and one
                        {name, offset, length, sha256} per section
    sections   their bytes, back to back ("dynamo": PyTorch's serialized AOT function, whose
               backend state is our plan; "neff/<key>": each NEFF container)

A package is written atomically (:func:`torch_neuronx.cache.atomic.write_atomic`): a reader
sees the previous file or the whole new one. Reading verifies magic, format version, every
section's bounds and checksum, and that this process's versions and target are the package's;
each failure is a :class:`PackageError` naming the file and what differs.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import struct
from collections.abc import Mapping
from typing import Any

import torch

from torch_neuronx.cache import atomic
from torch_neuronx.compiler import driver
from torch_neuronx.compiler.options import ResolvedOptions
from torch_neuronx.format import neff
from torch_neuronx.version import __version__

MAGIC = b"TNXAOTPK"
FORMAT_VERSION = 2  # 2: the header carries its own checksum
_PREFIX = struct.Struct("<8sII")


class PackageError(RuntimeError):
    """A package that is not one, is truncated or corrupt, or was built for another version or target."""


class PackageSaveError(OSError):
    """A package that could not be written where asked (the message names that path)."""


def environment(options: ResolvedOptions) -> dict[str, Any]:
    """What a package's NEFFs and Dynamo state depend on, for ``options`` in this process."""
    return {"torch_neuronx": __version__, "torch": torch.__version__,
            "python": platform.python_version(),
            "compiler_version": driver.compiler_version(options.target),
            "compiler_config": options.compiler_config()}


def encode(sections: Mapping[str, bytes], header: dict[str, Any]) -> bytes:
    """The bytes of a package of ``sections`` with ``header`` (JSON fields)."""
    table, offset = [], 0
    for name, data in sections.items():
        table.append({"name": name, "offset": offset, "length": len(data),
                      "sha256": hashlib.sha256(data).hexdigest()})
        offset += len(data)
    fields = {**header, "sections": table}
    fields["header_sha256"] = neff.header_digest(fields)
    blob = json.dumps(fields, sort_keys=True).encode()
    return b"".join([_PREFIX.pack(MAGIC, FORMAT_VERSION, len(blob)), blob, *sections.values()])


def write(path: str | os.PathLike[str], sections: Mapping[str, bytes], header: dict[str, Any]) -> None:
    """Write a package of ``sections`` with ``header`` (JSON fields) to ``path`` atomically: to the
    file a symbolic link names (the link stays), never over anything but a regular file;
    :class:`PackageSaveError` (an ``OSError``) naming ``path`` when it cannot be written."""
    path = os.fspath(path)
    target = os.path.realpath(path)
    if os.path.lexists(target) and not os.path.isfile(target):
        raise PackageSaveError(f"cannot write AOT package {path}: it exists and is not a regular file")
    try:
        atomic.write_atomic(target, encode(sections, header))
    except OSError as exc:
        raise PackageSaveError(f"cannot write AOT package {path}: {exc.strerror or exc}") from exc


def read(path: str | os.PathLike[str]) -> tuple[dict[str, Any], dict[str, bytes]]:
    """The header and verified sections of the package at ``path``; :class:`PackageError` otherwise."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise PackageError(f"cannot read AOT package {path}: {exc}") from exc
    return decode(data, path)


def decode(data: bytes, path: str) -> tuple[dict[str, Any], dict[str, bytes]]:
    """The header and verified sections of a package's bytes (read from ``path``, for messages)."""
    where = f"AOT package {path}"
    problem = _prefix_problem(data)
    if problem:
        raise PackageError(f"{where} {problem}")
    start = _PREFIX.size + _PREFIX.unpack_from(data)[2]
    try:
        header = json.loads(data[_PREFIX.size:start])
        digest = header.pop("header_sha256")
        table = header["sections"]
        spans = [(entry["name"], start + int(entry["offset"]), int(entry["length"]), entry["sha256"])
                 for entry in table]
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise PackageError(f"{where} has a corrupt header: {type(exc).__name__}: {exc}") from None
    if digest != neff.header_digest(header):
        raise PackageError(f"{where}: its header fails its checksum (the file is corrupt or was edited)")
    sections = {}
    for name, lo, length, sha256 in spans:
        hi = lo + length
        if hi > len(data):
            raise PackageError(f"{where} is truncated: section {name!r} ends at byte {hi}, "
                               f"the file has {len(data)}")
        body = data[lo:hi]
        if hashlib.sha256(body).hexdigest() != sha256:
            raise PackageError(f"{where}: section {name!r} fails its checksum (the file is corrupt)")
        sections[name] = body
    end = start + sum(length for _, _, length, _ in spans)
    if len(data) != end:
        raise PackageError(f"{where} has {len(data) - end} bytes past its last section (corrupt)")
    return header, sections


def _prefix_problem(data: bytes) -> str | None:
    """What makes ``data`` unreadable as a package before its sections: a short or foreign
    prefix, another format version, a truncated header; None when it reads."""
    if len(data) < _PREFIX.size:
        return f"is truncated: {len(data)} bytes, shorter than its prefix"
    magic, version, length = _PREFIX.unpack_from(data)
    return (f"is not a torch_neuronx AOT package (magic {magic!r}, expected {MAGIC!r})" if magic != MAGIC else
            f"has package format version {version}; this torch_neuronx ({__version__}) reads version "
            f"{FORMAT_VERSION}: compile and save it again" if version != FORMAT_VERSION else
            f"is truncated inside its header ({len(data)} of at least {_PREFIX.size + length} bytes)"
            if len(data) < _PREFIX.size + length else None)


def check_environment(path: str | os.PathLike[str], saved: Mapping[str, Any], current: Mapping[str, Any]) -> None:
    """Raise :class:`PackageError` naming every field of ``current`` that differs from ``saved``."""
    differs = [f"{name}: package {saved.get(name)!r}, this process {value!r}"
               for name, value in current.items() if saved.get(name) != value]
    if differs:
        raise PackageError(f"AOT package {os.fspath(path)} was built for another version or target "
                           "(compile and save it again here):\n  " + "\n  ".join(differs))
