"""Cache keys: one content hash built from named components, in a fixed order.

Like JAX's ``cache_key.py``, every component goes through one helper
(:func:`_hash_component`) that hashes it on its own and logs that hash at DEBUG,
and the key's digest is the hash of the ordered ``name=hash`` lines. A key
therefore knows *which* component made it differ from another one, which is
how cache misses are explained (see :mod:`torch_neuronx.cache.explain`).

Two kinds of key exist, chosen by TORCH_NEURONX_NEFF_KEY_FROM_HLO
(:func:`cache_key` does the choosing):

* :func:`neff_key` (the default): the lowered HLO text with debug locations
  stripped, the compiler configuration, the compiler version and the NEFF
  format version. Benign Python edits that re-trace to the same HLO hit.
* :func:`base_key`: the in-memory graph representation plus the input specs
  instead of the HLO.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import logging
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

from torch_neuronx import config
from torch_neuronx.format import neff

_log = logging.getLogger("torch_neuronx.cache")

# Bumped when the way components are hashed changes, so old entries stop matching.
KEY_SCHEMA = "torch_neuronx-cache-key-v1"
_MLIR_BYTECODE_MAGIC = b"ML\xefR"

# One token per match: a string literal (kept whole, so `loc(` or `//` inside it
# survive), a `//` comment, or the start of a location `loc(` that is not part
# of a longer identifier such as `@loc(` or `%myloc(`.
_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|//[^\n]*|(?<![\w.$#@%!-])loc\(')
_PAREN = re.compile(r'"(?:[^"\\]|\\.)*"|[()]')
_LOC_ALIAS = re.compile(r"^\s*#loc[\w.$-]*\s*=\s*$")


@dataclasses.dataclass(frozen=True)
class CacheKey:
    """A content-addressed cache key.

    ``digest`` is the hex SHA-256 naming the cache entry; ``components`` maps
    each component name, in key order, to that component's own hash;
    ``details`` holds small human-readable values of the components (compiler
    config, versions) used to explain misses; ``kind`` is ``"hlo"`` or
    ``"base"``.
    """

    digest: str
    components: dict[str, str]
    graph_id: str = ""
    kind: str = "hlo"
    details: dict[str, Any] = dataclasses.field(default_factory=dict, compare=False)

    def __str__(self) -> str:
        return self.digest

    def __hash__(self) -> int:  # the dict fields are not hashable; the digest says it all
        return hash(self.digest)

    @property
    def group(self) -> str:
        """What entries of "the same graph" share: the graph id, else the first component's hash.

        Misses are explained against the closest entry of the same group.
        """
        if self.graph_id:
            return f"graph:{self.graph_id}"
        first = next(iter(self.components))
        return f"{first}:{self.components[first]}"

    def label(self) -> str:
        """How messages name the graph this key belongs to."""
        return self.graph_id or f"key {self.digest[:16]}"


def strip_debug_info(hlo: str) -> str:
    """MLIR text without debug information, so that only semantics reach the key.

    Removes ``loc(...)`` locations (with nested parentheses and the whitespace
    before them), ``#loc`` alias definitions, ``//`` comments, trailing
    whitespace, blank lines and ``\\r``. String literals are kept verbatim.
    """
    text = hlo.replace("\r\n", "\n").replace("\r", "\n")
    out: list[str] = []
    pos = 0
    while True:
        match = _TOKEN.search(text, pos)
        if match is None:
            out.append(text[pos:])
            break
        token = match.group()
        if token.startswith('"'):
            out.append(text[pos:match.end()])
            pos = match.end()
        elif token.startswith("//"):
            out.append(text[pos:match.start()])
            pos = match.end()
        else:  # loc(
            out.append(text[pos:match.start()].rstrip(" \t"))
            pos = _skip_parens(text, match.end())
    lines = (line.rstrip() for line in "".join(out).split("\n"))
    return "\n".join(line for line in lines if line and not _LOC_ALIAS.match(line)) + "\n"


def _skip_parens(text: str, pos: int) -> int:
    """Index just past the `)` closing a `(` that ends right before ``pos``."""
    depth = 1
    while depth:
        match = _PAREN.search(text, pos)
        if match is None:  # unbalanced: drop the rest rather than fail on a debug detail
            return len(text)
        pos = match.end()
        token = match.group()
        if token == "(":
            depth += 1
        elif token == ")":
            depth -= 1
    return pos


def hlo_bytes(hlo: str | bytes) -> bytes:
    """The bytes of HLO that enter the key: text with debug info stripped.

    MLIR bytecode (or bytes that are not UTF-8) is hashed as given.
    """
    if isinstance(hlo, bytes | bytearray | memoryview):
        raw = bytes(hlo)
        if raw.startswith(_MLIR_BYTECODE_MAGIC):
            return raw
        try:
            hlo = raw.decode("utf-8")
        except UnicodeDecodeError:
            return raw
    return strip_debug_info(hlo).encode("utf-8")


def _jsonable(value: Any, where: str) -> Any:
    """A JSON value with one canonical form; refuses values without a stable text form."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, enum.Enum):
        return _jsonable(value.value, where)
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, set | frozenset):
        return sorted((_jsonable(v, where) for v in value), key=repr)
    if isinstance(value, list | tuple):
        return [_jsonable(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _jsonable({f.name: getattr(value, f.name) for f in dataclasses.fields(value)}, where)
    # torch.dtype, torch.Size, torch.device print the same in every process.
    if type(value).__module__.split(".")[0] == "torch":
        return str(value)
    raise TypeError(f"cache key component {where} has a value of type {type(value).__name__} "
                    "without a stable text form; pass str, numbers, lists or dicts")


def canonical_json(value: Any, where: str = "value") -> str:
    """One canonical JSON text for ``value`` (sorted keys, no spaces)."""
    return json.dumps(_jsonable(value, where), sort_keys=True, separators=(",", ":"),
                      ensure_ascii=True)


def _hash_component(name: str, data: bytes, components: dict[str, str]) -> None:
    """Hash one component on its own, record it and log its hash (JAX's ``_hash_accum`` idea)."""
    digest = hashlib.sha256(data).hexdigest()
    components[name] = digest
    _log.debug("cache key component %s: %s (%d bytes)", name, digest, len(data))


def _finish(components: dict[str, str], details: dict[str, Any], graph_id: str, kind: str) -> CacheKey:
    total = hashlib.sha256(KEY_SCHEMA.encode())
    for name, digest in components.items():
        total.update(f"\n{name}={digest}".encode())
    key = CacheKey(total.hexdigest(), components, graph_id, kind, details)
    _log.debug("cache key for %s: %s", key.label(), key.digest)
    return key


def key_from_components(parts: Sequence[tuple[str, bytes]], details: dict[str, Any], graph_id: str,
                        kind: str) -> CacheKey:
    """A key over named byte components, hashed in order (for caches beyond the NEFF cache)."""
    components: dict[str, str] = {}
    for name, data in parts:
        _hash_component(name, data, components)
    return _finish(components, details, graph_id, kind)


def _common_components(components: dict[str, str], details: dict[str, Any],
                       compiler_config: Mapping[str, Any], compiler_version: str) -> None:
    config_json = canonical_json(compiler_config, "compiler_config")
    _hash_component("compiler_config", config_json.encode(), components)
    _hash_component("compiler_version", compiler_version.encode(), components)
    _hash_component("neff_format_version", str(neff.FORMAT_VERSION).encode(), components)
    details["compiler_config"] = json.loads(config_json)
    details["compiler_version"] = compiler_version
    details["neff_format_version"] = neff.FORMAT_VERSION


def neff_key(hlo: str | bytes, compiler_config: Mapping[str, Any], compiler_version: str,
             *, graph_id: str = "") -> CacheKey:
    """The persistent key of a NEFF compiled from lowered HLO.

    Components, in order: ``hlo`` (debug info stripped, see
    :func:`strip_debug_info`), ``compiler_config`` (canonical JSON: target,
    flags, optimization level ...), ``compiler_version``,
    ``neff_format_version``. ``graph_id`` names the graph in messages and
    groups entries for miss explanations; it is not part of the digest.
    """
    components: dict[str, str] = {}
    details: dict[str, Any] = {}
    data = hlo_bytes(hlo)
    _hash_component("hlo", data, components)
    details["hlo"] = {"bytes": len(data)}
    _common_components(components, details, compiler_config, compiler_version)
    return _finish(components, details, graph_id, "hlo")


def base_key(graph_repr: str, input_specs: Sequence[Any], compiler_config: Mapping[str, Any],
             compiler_version: str, *, graph_id: str = "") -> CacheKey:
    """The in-memory key used when TORCH_NEURONX_NEFF_KEY_FROM_HLO=0.

    Components, in order: ``graph`` (the graph's text representation),
    ``input_specs`` (canonical JSON of shapes/dtypes/...), then the same
    ``compiler_config``, ``compiler_version`` and ``neff_format_version`` as
    :func:`neff_key`.
    """
    components: dict[str, str] = {}
    details: dict[str, Any] = {}
    _hash_component("graph", graph_repr.encode("utf-8"), components)
    specs_json = canonical_json(list(input_specs), "input_specs")
    _hash_component("input_specs", specs_json.encode(), components)
    details["input_specs"] = specs_json if len(specs_json) <= 512 else f"{specs_json[:509]}..."
    _common_components(components, details, compiler_config, compiler_version)
    return _finish(components, details, graph_id, "base")


def cache_key(*, hlo: str | bytes, graph_repr: str, input_specs: Sequence[Any],
              compiler_config: Mapping[str, Any], compiler_version: str,
              graph_id: str = "") -> CacheKey:
    """The key TORCH_NEURONX_NEFF_KEY_FROM_HLO selects: :func:`neff_key` (1) or :func:`base_key` (0)."""
    if config.get("TORCH_NEURONX_NEFF_KEY_FROM_HLO"):
        return neff_key(hlo, compiler_config, compiler_version, graph_id=graph_id)
    return base_key(graph_repr, input_specs, compiler_config, compiler_version, graph_id=graph_id)
