"""The NEFF container: our analog of Neuron's executable file format.

Layout (all integers little-endian)::

    offset 0   8 bytes  magic b"TNXNEFF\\0"
    offset 8   u32      format version (FORMAT_VERSION)
    offset 12  u32      header length H (bytes of JSON that follow)
    offset 16  H bytes  JSON header: target, compiler_version, key, payload_length,
                        payload_sha256, signature (inputs/outputs), extra metadata, and
                        header_sha256 (the checksum of the other fields, as written)
    padding to a multiple of PAYLOAD_ALIGNMENT
    payload    the compiled module (an IREE VM flatbuffer for IREE targets)

The payload starts on a 4 KiB boundary so the runtime can map the file and hand
the payload to IREE without a copy. Every load verifies magic, version, length
and both checksums (the header's own, so that a flipped byte in a signature or key is
never believed, and the payload's); a mismatch raises :class:`NeffFormatError` saying what is wrong.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import mmap
import os
import struct
from typing import Any

MAGIC = b"TNXNEFF\0"
FORMAT_VERSION = 2  # 2: the header carries its own checksum
PAYLOAD_ALIGNMENT = 4096
_PREFIX = struct.Struct("<8sII")


class NeffFormatError(ValueError):
    """A NEFF file that is not one, is of another format version, or is corrupt."""


@dataclasses.dataclass(frozen=True)
class NeffHeader:
    """What a NEFF says about itself."""

    target: str
    compiler_version: str
    key: str
    payload_length: int
    payload_sha256: str
    signature: dict[str, Any] = dataclasses.field(default_factory=dict)
    metadata: dict[str, Any] = dataclasses.field(default_factory=dict)
    format_version: int = FORMAT_VERSION


@dataclasses.dataclass(frozen=True)
class Neff:
    """A verified NEFF: its header and a zero-copy view of its payload."""

    header: NeffHeader
    payload: memoryview
    path: str | None = None


def encode(
    payload: bytes,
    *,
    target: str,
    compiler_version: str,
    key: str,
    signature: dict[str, Any] | None = None,
    metadata: dict[str, Any] | None = None,
) -> bytes:
    """Wrap a compiled payload in a NEFF container."""
    header = {
        "target": target,
        "compiler_version": compiler_version,
        "key": key,
        "payload_length": len(payload),
        "payload_sha256": hashlib.sha256(payload).hexdigest(),
        "signature": signature or {},
        "metadata": metadata or {},
    }
    header["header_sha256"] = header_digest(header)
    blob = json.dumps(header, sort_keys=True).encode()
    head = _PREFIX.pack(MAGIC, FORMAT_VERSION, len(blob)) + blob
    pad = (-len(head)) % PAYLOAD_ALIGNMENT
    return head + b"\0" * pad + payload


def decode(data: bytes | memoryview, *, path: str | None = None, verify: bool = True) -> Neff:
    """Parse and verify a NEFF held in memory; raise NeffFormatError when it is not valid."""
    where = f"NEFF file {path}" if path else "NEFF data"
    view = memoryview(data)
    if len(view) < _PREFIX.size:
        raise NeffFormatError(f"{where} is truncated: {len(view)} bytes, shorter than the header")
    magic, version, hlen = _PREFIX.unpack_from(view, 0)
    if magic != MAGIC:
        raise NeffFormatError(f"{where} has a wrong magic {bytes(magic)!r} (expected {MAGIC!r}): "
                              "not a torch_neuronx NEFF")
    if version != FORMAT_VERSION:
        raise NeffFormatError(f"{where} has format version {version}; this torch_neuronx reads "
                              f"version {FORMAT_VERSION}. Recompile it (clear the NEFF cache).")
    end = _PREFIX.size + hlen
    if len(view) < end:
        raise NeffFormatError(f"{where} is truncated inside its header")
    try:
        fields = json.loads(bytes(view[_PREFIX.size:end]))
        digest = fields.pop("header_sha256")
        header = NeffHeader(format_version=version, **fields)
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise NeffFormatError(f"{where} has a corrupt header: {type(exc).__name__}: {exc}") from None
    if digest != header_digest(fields):
        raise NeffFormatError(f"{where}: its header fails its checksum (the file is corrupt or was edited)")
    start = end + (-end) % PAYLOAD_ALIGNMENT
    payload = view[start:]
    if len(payload) != header.payload_length:
        raise NeffFormatError(f"{where} payload is {len(payload)} bytes, header says "
                              f"{header.payload_length}: the file is truncated or padded")
    if verify and hashlib.sha256(payload).hexdigest() != header.payload_sha256:
        raise NeffFormatError(f"{where} fails its checksum: the payload is corrupt")
    return Neff(header=header, payload=payload, path=path)


def header_digest(fields: dict[str, Any]) -> str:
    """The checksum of a container header's JSON fields (without the checksum itself), as written."""
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()


def load(path: str | os.PathLike[str], *, verify: bool = True) -> Neff:
    """Read a NEFF file into memory and verify it.

    Read, not mapped: the runtime reads a loaded payload on every call, and a mapped file
    rewritten in place afterwards (``cp`` or ``rsync --inplace`` onto a shared cache) gave a
    running model another model's results, and SIGBUS once truncated. The checksum checked
    here covers the bytes every later call uses.
    """
    path = os.fspath(path)
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            raise NeffFormatError(f"NEFF file {path} is empty")
        data = mmap.mmap(-1, size)  # private, page-aligned: the payload keeps its 4 KiB alignment
        got = f.readinto(data)
    if got != size:
        raise NeffFormatError(f"NEFF file {path} changed while it was read ({got} of {size} bytes)")
    return decode(data, path=path, verify=verify)


def read_header(path: str | os.PathLike[str]) -> NeffHeader:
    """Read only the header (no checksum pass, the payload mapped, not read), for listings."""
    path = os.fspath(path)
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            raise NeffFormatError(f"NEFF file {path} is empty")
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        return decode(mapped, path=path, verify=False).header
    finally:
        try:
            mapped.close()
        except BufferError:  # a view still exported (cannot happen: the header is copied)
            pass
