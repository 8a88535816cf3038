"""The single registry of every environment variable torch_neuronx reads.

Each :class:`Var` entry holds a variable's whole behaviour: type, documented
default, description, the modules that read it and whether its feature is
built yet. Everything else in the package reads configuration through
:func:`get`; nothing calls ``os.environ`` for these names directly.

Parsing is typed and forgiving, as the specification asks: a malformed value
logs one warning naming the variable, the bad value and what is accepted, and
the default is used. Values set programmatically (``CompileOptions``) take
precedence over the environment through :func:`override`.

``python -m torch_neuronx.config`` (``__main__.py``) prints every variable's effective value and
where it came from; ``python -m torch_neuronx.config --markdown`` renders
``docs/environment.md``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import getpass
import logging
import os
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

_log = logging.getLogger("torch_neuronx.config")

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


class ConfigValueError(ValueError):
    """A raw environment string that a variable's parser does not accept."""


def parse_bool(raw: str) -> bool:
    """Parse 0/1/true/false/yes/no/on/off in any case."""
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ConfigValueError("expected one of 0, 1, true, false, yes, no (any case)")


def parse_strict_01(raw: str) -> bool:
    """Parse a bool that only accepts ``0`` and ``1`` (TORCH_NEURONX_ENABLE_STREAMS)."""
    value = raw.strip()
    if value in ("0", "1"):
        return value == "1"
    raise ConfigValueError("only 0 and 1 are accepted")


def parse_only_one_enables(raw: str) -> bool:
    """When set, only ``1`` enables the feature and any other value disables it."""
    return raw.strip() == "1"


def parse_int(raw: str) -> int:
    """Parse a decimal integer."""
    try:
        return int(raw.strip(), 10)
    except ValueError:
        raise ConfigValueError("expected a decimal integer") from None


def parse_non_negative_int(raw: str) -> int:
    """Parse a non-negative decimal integer."""
    value = parse_int(raw)
    if value < 0:
        raise ConfigValueError("expected a non-negative decimal integer")
    return value


def parse_log_level(raw: str) -> int:
    """Parse 0 (ERROR) .. 3 (DEBUG)."""
    value = parse_int(raw)
    if not 0 <= value <= 3:
        raise ConfigValueError("expected 0 (ERROR), 1 (WARNING), 2 (INFO) or 3 (DEBUG)")
    return value


def parse_str(raw: str) -> str:
    """Keep a string as given."""
    return raw


def parse_path(raw: str) -> str:
    """Expand ``~`` and environment references in a path; reject an empty one."""
    value = raw.strip()
    if not value:
        raise ConfigValueError("expected a non-empty path")
    return os.path.expanduser(os.path.expandvars(value))


def parse_csv(raw: str) -> tuple[str, ...]:
    """Split a comma-separated list, dropping blanks."""
    return tuple(part.strip() for part in raw.split(",") if part.strip())


def _complex_decompose_default() -> bool:
    import torch

    major, minor = (int(p) for p in torch.__version__.split(".")[:2])
    return (major, minor) >= (2, 13)


def _inductor_cache_default() -> str:
    try:
        user = getpass.getuser()
    except Exception:  # no passwd entry in some containers
        user = str(os.getuid())
    return f"/tmp/torchinductor_{user}/"


@dataclasses.dataclass(frozen=True)
class Var:
    """One environment variable: everything there is to know about it."""

    name: str
    type: str  # the documented type: bool, int, str, path
    default: Any  # a value, or a zero-argument callable for computed defaults
    doc: str
    section: str
    parse: Callable[[str], Any]
    default_doc: str = ""  # how the default reads in the specification, when not literal
    readers: tuple[str, ...] = ()  # modules that read it
    status: str = "built"  # "built", or what is missing, e.g. "planned: issue 5 (eager device)"
    ours: bool = False  # an extension of torch_neuronx, not in the TorchNeuron specification

    def default_value(self) -> Any:
        return self.default() if callable(self.default) else self.default

    def documented_default(self) -> str:
        if self.default_doc:
            return self.default_doc
        value = self.default_value()
        if isinstance(value, bool):
            return "1" if value else "0"
        return '""' if value == "" else str(value)


_REGISTRY: dict[str, Var] = {}


def _register(*variables: Var) -> None:
    for var in variables:
        assert var.name not in _REGISTRY, var.name
        _REGISTRY[var.name] = var


_BACKEND = "neuron backend for torch.compile"
_CACHE = "Persistent NEFF / HLO cache"
_EAGER = "General (eager execution)"
_METRICS = "Metrics"
_PROFILE = "Profiling"
_DIST = "Distributed"
_MEMORY = "Neuron memory allocator configuration"
_OURS = "torch_neuronx extensions"

_register(
    Var("TORCH_NEURONX_DEBUG_DIR", "str", "/tmp/neuron_backend",
        "Directory where compilation artifacts (FX graphs, StableHLO IR, NEFF files) are saved.",
        _BACKEND, parse_path, readers=("dynamo.artifacts", "compiler.driver")),
    Var("TORCH_NEURONX_PRESERVE_COMPILATION_ARTIFACTS", "bool", False,
        "When 1, keeps compilation artifacts after execution. Useful for debugging via IR inspection.",
        _BACKEND, parse_bool, readers=("dynamo.artifacts", "compiler.driver")),
    Var("TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION", "bool", True,
        "When 1 (the default), a torch.compile(backend=\"neuron\") graph that fails to compile raises "
        "the error instead of falling back to eager execution of the original graph. Set to 0 to fall "
        "back to eager execution on a compile failure. Affects the torch.compile path only; the "
        "fallback_execution compile option overrides it.",
        _BACKEND, parse_bool, readers=("dynamo.backend",)),
    Var("TORCH_NEURONX_COMPLEX_DECOMPOSE", "bool", _complex_decompose_default,
        "Enables framework decomposition of complex operations before lowering. When disabled, "
        "verified native complex operations use compiler lowering and other operations follow the "
        "existing fallback policy.",
        _BACKEND, parse_bool, default_doc="PyTorch >= 2.13: True; otherwise False",
        readers=("compiler.passes.complex_to_real",)),
    Var("TORCH_NEURONX_DYNAMO_DISABLE_CPU_AUTOCOPY", "bool", False,
        "When 1, raises an error if CPU tensors are passed as inputs instead of auto-copying to Neuron.",
        _BACKEND, parse_bool, status="planned: needs the eager neuron device (next issue)"),
    Var("TORCH_NEURONX_DYNAMO_TENSOR_DUMPS", "bool", False,
        "When set, the inputs and outputs of every compiled graph execution are saved under the job's "
        "inputs/ and outputs/ artifact directories.",
        _BACKEND, parse_bool, readers=("dynamo.artifacts",)),
    Var("TORCH_NEURONX_COMPILE_ONLY", "bool", False,
        "When 1, compile to NEFF without device execution. Ops compile but never run; nrt_init failure "
        "is non-fatal. Also set by torch_neuronx.compiler.compile_only().",
        _BACKEND, parse_bool, readers=("compiler.options", "dynamo.backend")),
    Var("NEURON_PLATFORM_TARGET_OVERRIDE", "str", None,
        "Target platform (for example trn2, trn3) for cross-compilation on a device-less host. Also set "
        "via CompileOptions(target=...). Here: cpu (the live default), cuda, llvm-cpu triples, and "
        "trn2/trn3 through a real neuronx-cc on PATH.",
        _BACKEND, parse_str, default_doc="(query live instance)", readers=("compiler.targets",)),
    # Persistent NEFF / HLO cache
    Var("TORCH_NEURONX_NEFF_CACHE_DIR", "path", "/tmp/neff_cache",
        "Directory for persistent NEFF cache. Point at a shared mount (for example, FSx) to reuse "
        "compiled NEFFs across runs and instances.",
        _CACHE, parse_path, readers=("cache.store",)),
    Var("TORCH_NEURONX_HLO_CACHE_DIR", "path", "/tmp/hlo_cache",
        "Directory for persistent HLO cache, shared by the eager and torch.compile entry points.",
        _CACHE, parse_path, readers=("cache.store", "compiler.hlo", "dynamo.plans", "kernels.trace_cache")),
    Var("TORCH_NEURONX_HLO_CACHE", "bool", True,
        "When 1, eager ops cache their HLO lowering to disk, keyed by the dispatch key.",
        _CACHE, parse_bool, readers=("device.eager",)),
    Var("TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR", "path", "/tmp/local_cache",
        "Local directory for filelocks and scratch. Must stay on a local POSIX filesystem (NFS/Lustre "
        "lock semantics are unreliable).",
        _CACHE, parse_path, readers=("cache.locks",)),
    Var("TORCH_NEURONX_NEFF_DISABLE_CACHE", "bool", False,
        "When 1, disables the persistent NEFF cache entirely. Every compile runs fresh.",
        _CACHE, parse_bool, readers=("cache.store", "compiler.hlo", "dynamo.plans")),
    Var("TORCH_NEURONX_NEFF_CACHE_LOCK_TIMEOUT", "int", 1200,
        "Seconds to wait for the per-key compile lock before giving up.",
        _CACHE, parse_non_negative_int, readers=("cache.locks",)),
    Var("TORCH_NEURONX_NEFF_KEY_FROM_HLO", "bool", True,
        "When 1 (the default), the persistent NEFF key is derived from the lowered HLO bytes plus "
        "compiler config (instead of the in-memory base_key). Lets benign Python edits re-trace and "
        "re-lower without busting the on-disk cache. Set to 0 to use the in-memory base_key.",
        _CACHE, parse_bool, readers=("cache.keys",)),
    Var("NKI_ENABLE_TRACE_CACHE", "bool", True,
        "When 1, the NKI kernel compile cache is persisted across processes at "
        "/var/tmp/nki-trace-cache-uid<uid>/ (or NKI_TRACE_CACHE_URL if set). Only files under a "
        "site-packages/dist-packages tree that map to an installed wheel are version-tracked; the "
        "kernel is assumed to be a pure function of its declared arguments and its source.",
        _CACHE, parse_bool, readers=("kernels.trace_cache",)),
    Var("NKI_TRACE_CACHE_URL", "str", "",
        "Location of the NKI trace cache instead of /var/tmp/nki-trace-cache-uid<uid>/.",
        _CACHE, parse_str, readers=("kernels.trace_cache",)),
    Var("TORCH_CACHING_PRECOMPILE", "bool", False,
        "When 1, enables the PyTorch Dynamo precompile cache, which caches the backend result of the "
        "Dynamo trace of any torch.compile-ed modules or functions. Saved at TORCHINDUCTOR_CACHE_DIR, "
        "split by subdirectories per rank if applicable. For the neuron backend the HLO result is "
        "cached, separate from the HLO cache. Off by default.",
        _CACHE, parse_bool, readers=("dynamo.backend", "dynamo.precompile")),
    Var("TORCHINDUCTOR_CACHE_DIR", "path", _inductor_cache_default,
        "Directory for the torch inductor cache. This is a PyTorch variable and affects the location "
        "of other caches as well.",
        _CACHE, parse_path, default_doc="/tmp/torchinductor_<username>/",
        readers=("torch (PyTorch reads it itself)", "dynamo.precompile")),
    # Eager execution
    Var("NEURON_LAUNCH_BLOCKING", "bool", False,
        "When 1, forces synchronous execution. Useful for debugging.",
        _EAGER, parse_bool, readers=("runtime.streams",)),
    Var("TORCH_NEURONX_FALLBACK_ONLY_FOR_UNIMPLEMENTED_OPS", "bool", False,
        "When 1, only falls back to CPU for unimplemented ops, not execution errors.",
        _EAGER, parse_bool, readers=("device.eager",)),
    Var("TORCH_NEURONX_ENABLE_STACK_TRACE", "bool", False,
        "When 1, captures Python stack traces per operation. Adds overhead.",
        _EAGER, parse_bool, status="planned: needs the eager neuron device"),
    Var("TORCH_NEURONX_LOG_LEVEL", "int", 1,
        "Log verbosity: 0 = ERROR, 1 = WARNING (the default), 2 = INFO, 3 = DEBUG.",
        _EAGER, parse_log_level, readers=("log",)),
    Var("TORCH_NEURONX_USE_PINNED_MALLOC", "bool", False,
        "(Experimental) When 1, uses driver-pinned host memory.",
        _EAGER, parse_bool, status="planned: needs the eager neuron device"),
    # Metrics
    Var("TORCH_NEURONX_ENABLED_METRIC_TABLES", "str", "",
        "Comma-separated metric tables to enable for CSV export.",
        _METRICS, parse_str, status="planned: metric tables issue"),
    Var("TORCH_NEURONX_METRICS_DIR", "str", "/tmp",
        "Directory for metric CSV files.",
        _METRICS, parse_str, status="planned: metric tables issue"),
    # Profiling
    Var("TORCH_NEURONX_PROFILE_DEFAULT_SESSION", "bool", True,
        "Set to 0 to disable the default session. Then ProfilerActivity.PrivateUse1 without a "
        "NeuronConfig records no Neuron data.",
        _PROFILE, parse_bool, status="planned: profiler issue"),
    Var("TORCH_NEURONX_PROFILE_MODES", "str", "runtime,cpu_util,host_memory",
        "Comma-separated profile modes. Add device for the device profile. The device profile "
        "reserves device memory for hardware notifications.",
        _PROFILE, parse_str, status="planned: profiler issue"),
    Var("TORCH_NEURONX_PROFILE_RANKS", "str", "0",
        "Comma-separated global ranks that capture a profile. The rank comes from the RANK "
        "environment variable.",
        _PROFILE, parse_str, status="planned: profiler issue"),
    Var("TORCH_NEURONX_PROFILE_MAX_EVENTS_PER_NC", "int", 10000000,
        "Maximum number of system trace events for each NeuronCore.",
        _PROFILE, parse_non_negative_int, status="planned: profiler issue"),
    Var("TORCH_NEURONX_PROFILE_CAPTURE_NC", "str", "0,1",
        "NeuronCore indices or ranges to capture, for example 0,1,2-5.",
        _PROFILE, parse_str, status="planned: profiler issue"),
    Var("TORCH_NEURONX_PROFILE_OUTPUT_DIR", "path", "neuron_profile",
        "Directory for the profile session output.",
        _PROFILE, parse_path, status="planned: profiler issue"),
    # Distributed
    Var("TORCH_NEURONX_ENABLE_STREAMS", "bool", True,
        "When 1 (the default), Neuron streams are enabled and work can be submitted to the default "
        "stream or non-default streams. When 0, all streams alias the default stream. Only 0 and 1 "
        "are accepted.",
        _DIST, parse_strict_01, readers=("runtime.streams",)),
    Var("TORCH_NEURONX_ENABLE_HOST_CC", "bool", False,
        "When 1, enables collectives to execute on non-default streams, allowing communication to "
        "overlap with computation. Requires TORCH_NEURONX_ENABLE_STREAMS=1 (the default).",
        _DIST, parse_bool, status="planned: c10d issue"),
    Var("NEURON_USE_SPLIT_ALLGATHER", "bool", None,
        "Enables split-based allgather for better memory efficiency. When unset, the default depends "
        "on the stream; when set, only 1 enables it and any other value disables it.",
        _DIST, parse_only_one_enables, default_doc="on (default stream)", status="planned: c10d issue"),
    Var("NEURON_USE_SPLIT_REDUCE_SCATTER", "bool", None,
        "Enables split-based reduce_scatter. When unset, the default depends on the stream; when "
        "set, only 1 enables it and any other value disables it.",
        _DIST, parse_only_one_enables, default_doc="on (default stream)", status="planned: c10d issue"),
    Var("NEURON_USE_NKI_ALLTOALLV", "bool", True,
        "Enables native NKI all_to_all_v. Set to 0 to use the compatibility padding fallback.",
        _DIST, parse_bool, status="planned: c10d issue"),
    Var("COLLECTIVE_BUCKETSIZE_IN_MB", "int", 512,
        "Maximum bucket size (MB) for collective operations.",
        _DIST, parse_non_negative_int, status="planned: c10d issue"),
    Var("RANK", "int", 0,
        "Global rank of this process (set by torchrun). Selects the rank{rank} artifact directory "
        "and the profiled ranks.",
        _DIST, parse_non_negative_int, readers=("dynamo.artifacts", "dynamo.precompile")),
    # Memory
    Var("TORCH_NEURONX_ENABLE_SCALAR_CACHE", "bool", True,
        "When 1 (the default), caches device-side scalar constants to avoid repeated host-to-device "
        "copies.",
        _MEMORY, parse_bool, status="planned: needs the eager neuron device"),
    Var("TORCH_NEURONX_SEGMENT_ALLOCATOR_CONFIG", "str", "",
        "Comma-separated key=value tuning knobs of the caching allocator's segment pool (kPoolBoundary, "
        "kSmallSegmentSize, kMediumSegmentSize, kMediumThreshold, kSegmentAlignment, kMinRoundedSize, "
        "kRoundupPower2Divisions, kSmallSplitThreshold, kLargeSplitThreshold, kMaxSplitSizeBytes, "
        "kMaxNonSplitRoundingBytes). Parsed and snapshotted on first allocator use; restart to change.",
        _MEMORY, parse_str, readers=("memory.allocator_config",)),
    # Ours
    Var("TORCH_NEURONX_DEVICE_MEMORY_BYTES", "int", 0,
        "Capacity of each neuron device's memory in bytes, for the caching allocator. 0 (the default) "
        "means the target's real memory (host RAM on the cpu target).",
        _OURS, parse_non_negative_int, readers=("memory",), ours=True),
    Var("TORCH_NEURONX_COMPILER_FLAGS", "str", "",
        "Extra flags appended to every compiler invocation (space separated). Part of the cache key.",
        _OURS, parse_str, readers=("compiler.options",), ours=True),
    Var("TORCH_NEURONX_RESIDENT_PARAMETERS", "bool", True,
        "When 1 (the default), inference graphs keep their nn.Parameter inputs resident in the runtime: "
        "weights are bound (and packed for the matmuls) once, and bound again only when a parameter "
        "changes (another tensor, or an in-place update). Costs one packed copy of the weights. When 0, "
        "parameters are passed and packed on every call. Part of the NEFF (its signature changes).",
        _OURS, parse_bool, readers=("dynamo.graph",), ours=True),
    Var("TORCH_NEURONX_RESIDENT_PARAMETERS_BYTES", "int", 0,
        "Budget, in bytes of parameters, for the resident parameters bound at once across all compiled "
        "graphs of the process. When a binding would exceed it, the graphs used least recently release "
        "theirs (they bind again on their next call). 0 (the default) means a quarter of the host's "
        "physical memory.",
        _OURS, parse_non_negative_int, default_doc="0 (a quarter of host memory)",
        readers=("runtime.executable",), ours=True),
    Var("TORCH_NEURONX_PIN_WORKERS", "bool", True,
        "When 1 (the default), each worker of the multi-threaded runtime driver (one per CPU this "
        "process may use) is pinned to its own CPU, so the kernel cannot stack two workers on one core "
        "after the calling thread was busy. 0 leaves them unpinned. Read when the runtime first starts.",
        _OURS, parse_bool, readers=("runtime.executable",), ours=True),
    Var("TORCH_NEURONX_PAUSE_OPENMP", "bool", True,
        "When 1 (the default), a call of a NEFF that runs on several runtime workers first ends the "
        "calling thread's idle OpenMP threads (omp_pause_resource_all), whose spin-wait after a parallel "
        "torch op would take cores from the workers; the next parallel torch op starts them again.",
        _OURS, parse_bool, readers=("runtime.openmp",), ours=True),
    Var("TORCH_NEURONX_LOWER_IN_SUBPROCESS", "bool", True,
        "When 1 (the default), torch-mlir's lowering to StableHLO runs in a worker process (one per "
        "process, reused), so a graph that makes torch-mlir's C++ abort raises a NeuronCompileError of "
        "stage lowering instead of ending the program. 0 lowers in the calling process.",
        _OURS, parse_bool, readers=("compiler.lower", "compiler.lowering_worker"), ours=True),
    Var("TORCH_NEURONX_LOWERING_TIMEOUT", "int", 1200,
        "Seconds one graph's lowering may take in the worker process before it is stopped and the "
        "graph fails with a NeuronCompileError of stage lowering.",
        _OURS, parse_non_negative_int, readers=("compiler.lowering_worker",), ours=True),
    Var("TORCH_NEURONX_IREE_COMPILE", "path", "",
        "Path of the iree-compile executable. Empty (the default): the one shipped with "
        "iree-base-compiler.",
        _OURS, parse_path, default_doc="(from iree-base-compiler)", readers=("compiler.driver",),
        ours=True),
)

# -- lookup -----------------------------------------------------------------

_warned: set[tuple[str, str]] = set()


class _Overrides(threading.local):
    """Each thread's stack of :func:`override` frames (a missing attribute of a plain
    ``threading.local`` costs a caught AttributeError on every lookup)."""

    def __init__(self) -> None:
        self.stack: list[dict[str, Any]] = []


_overrides = _Overrides()


def variables() -> list[Var]:
    """Every registered variable, in specification order."""
    return list(_REGISTRY.values())


def var(name: str) -> Var:
    """The registry entry for ``name``; KeyError names the known variables."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"{name!r} is not a torch_neuronx configuration variable") from None


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


_parsed: dict[tuple[str, str], Any] = {}  # (name, raw) -> parsed value; parsing once keeps get() cheap


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


_POSIX = os.name == "posix"
_environ_keys: dict[str, bytes] = {}
_FS_ENCODING = sys.getfilesystemencoding()


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
        if (name, raw) not in _warned:
            _warned.add((name, raw))
            _log.warning(
                "%s=%r is not valid: %s; using the default %s",
                name, raw, exc, entry.documented_default(),
            )
        return entry.default_value(), "default (environment value invalid)"


def get(name: str) -> Any:
    """The effective value of a variable."""
    return lookup(name)[0]


# -- rendering --------------------------------------------------------------


def _fmt(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if value is None:
        return "(unset)"
    if isinstance(value, str) and value == "":
        return '""'
    return str(value)


def render_table() -> str:
    """Every variable's effective value and where it came from, as plain text."""
    rows = [("VARIABLE", "VALUE", "SOURCE")]
    for entry in variables():
        value, source = lookup(entry.name)
        rows.append((entry.name, _fmt(value), source))
    width = [max(len(r[i]) for r in rows) for i in range(2)]
    return "\n".join(f"{a:<{width[0]}}  {b:<{width[1]}}  {c}" for a, b, c in rows)


def render_markdown() -> str:
    """``docs/environment.md``: the registry as the user-facing reference."""
    lines = [
        "# Environment variables",
        "",
        "Generated from `torch_neuronx/config.py` by `python -m torch_neuronx.config --markdown`;",
        "do not edit by hand (a test fails when this file is stale).",
        "",
        "Booleans accept 0/1/true/false/yes/no in any case unless the description says otherwise.",
        "A malformed value logs one warning naming the variable and the accepted values, and the",
        "default is used. `python -m torch_neuronx.config` prints the effective values.",
    ]
    section = None
    for entry in variables():
        if entry.section != section:
            section = entry.section
            lines += ["", f"## {section}", "", "| Variable | Type | Default | Status | Description |",
                      "| --- | --- | --- | --- | --- |"]
        doc = entry.doc.replace("|", "\\|")
        lines.append(f"| `{entry.name}` | {entry.type} | `{entry.documented_default()}` | "
                     f"{entry.status} | {doc} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m torch_neuronx.config``."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m torch_neuronx.config",
                                     description="Show torch_neuronx configuration.")
    parser.add_argument("--markdown", action="store_true",
                        help="print the docs/environment.md reference instead")
    args = parser.parse_args(argv)
    logging.basicConfig(format="%(levelname)s %(name)s: %(message)s")
    print(render_markdown() if args.markdown else render_table(), end="" if args.markdown else "\n")
    return 0

