"""The variable table: every environment variable torch_neuronx reads, in specification order.

Importing this module registers each :class:`~torch_neuronx.config.registry.Var`, grouped
by the section of ``docs/environment.md`` it appears in. An entry lists no modules of
torch_neuronx that read it (those are derived from the source by
:mod:`torch_neuronx.config.readers`), only ``external_readers`` outside the package.
"""

from __future__ import annotations

import getpass
import os

from torch_neuronx.config.parsers import (
    IndexRanges,
    parse_bool,
    parse_device_list,
    parse_index_ranges,
    parse_log_level,
    parse_non_negative_int,
    parse_only_one_enables,
    parse_path,
    parse_positive_seconds,
    parse_seconds,
    parse_str,
    parse_strict_01,
)
from torch_neuronx.config.registry import Var, register


def _complex_decompose_default() -> bool:
    """On from PyTorch 2.13."""
    import torch

    major, minor = (int(p) for p in torch.__version__.split(".")[:2])
    return (major, minor) >= (2, 13)


def _inductor_cache_default() -> str:
    """PyTorch's own default of TORCHINDUCTOR_CACHE_DIR."""
    try:
        user = getpass.getuser()
    except Exception:  # no passwd entry in some containers
        user = str(os.getuid())
    return f"/tmp/torchinductor_{user}/"


def _user_cache_default() -> str:
    """The XDG default: ``~/.cache``."""
    return os.path.join(os.path.expanduser("~"), ".cache")


_BACKEND = "neuron backend for torch.compile"
_CACHE = "Persistent NEFF / HLO cache"
_EAGER = "General (eager execution)"
_METRICS = "Metrics"
_PROFILE = "Profiling"
_DIST = "Distributed"
_MEMORY = "Neuron memory allocator configuration"
_OURS = "torch_neuronx extensions"

_TORCH = "torch (PyTorch reads it itself)"

# neuron backend for torch.compile
register(
    Var("TORCH_NEURONX_DEBUG_DIR", "str", "/tmp/neuron_backend",
        "Directory where compilation artifacts (FX graphs, StableHLO IR, NEFF files) are saved.",
        _BACKEND, parse_path),
    Var("TORCH_NEURONX_PRESERVE_COMPILATION_ARTIFACTS", "bool", False,
        "When 1, keeps compilation artifacts after execution. Useful for debugging via IR inspection.",
        _BACKEND, parse_bool),
    Var("TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION", "bool", True,
        "When 1 (the default), a torch.compile(backend=\"neuron\") graph that fails to compile raises "
        "the error instead of falling back to eager execution of the original graph. Set to 0 to fall "
        "back to eager execution on a compile failure. Affects the torch.compile path only; the "
        "fallback_execution compile option overrides it.",
        _BACKEND, parse_bool),
    Var("TORCH_NEURONX_COMPLEX_DECOMPOSE", "bool", _complex_decompose_default,
        "Enables framework decomposition of complex operations before lowering. When disabled, "
        "verified native complex operations use compiler lowering and other operations follow the "
        "existing fallback policy.",
        _BACKEND, parse_bool, default_doc="PyTorch >= 2.13: True; otherwise False"),
    Var("TORCH_NEURONX_DYNAMO_DISABLE_CPU_AUTOCOPY", "bool", False,
        "When 1, raises an error if CPU tensors are passed as inputs instead of auto-copying to Neuron.",
        _BACKEND, parse_bool),
    Var("TORCH_NEURONX_DYNAMO_TENSOR_DUMPS", "bool", False,
        "When set, the inputs and outputs of every compiled graph execution are saved under the job's "
        "inputs/ and outputs/ artifact directories.",
        _BACKEND, parse_bool),
    Var("TORCH_NEURONX_COMPILE_ONLY", "bool", False,
        "When 1, compile to NEFF without device execution. Ops compile but never run; nrt_init failure "
        "is non-fatal. Also set by torch_neuronx.compiler.compile_only().",
        _BACKEND, parse_bool),
    Var("NEURON_PLATFORM_TARGET_OVERRIDE", "str", None,
        "Target platform (for example trn2, trn3) for cross-compilation on a device-less host. Also set "
        "via CompileOptions(target=...). Here: cpu (the live default), cuda, llvm-cpu triples, and "
        "trn2/trn3 through a real neuronx-cc on PATH.",
        _BACKEND, parse_str, default_doc="(query live instance)"),
)

# Persistent NEFF / HLO cache
register(
    Var("TORCH_NEURONX_NEFF_CACHE_DIR", "path", "/tmp/neff_cache",
        "Directory for persistent NEFF cache. Point at a shared mount (for example, FSx) to reuse "
        "compiled NEFFs across runs and instances.",
        _CACHE, parse_path),
    Var("TORCH_NEURONX_HLO_CACHE_DIR", "path", "/tmp/hlo_cache",
        "Directory for persistent HLO cache, shared by the eager and torch.compile entry points.",
        _CACHE, parse_path),
    Var("TORCH_NEURONX_HLO_CACHE", "bool", True,
        "When 1, eager ops cache their HLO lowering to disk, keyed by the dispatch key.",
        _CACHE, parse_bool),
    Var("TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR", "path", "/tmp/local_cache",
        "Local directory for filelocks and scratch. Must stay on a local POSIX filesystem (NFS/Lustre "
        "lock semantics are unreliable).",
        _CACHE, parse_path),
    Var("TORCH_NEURONX_NEFF_DISABLE_CACHE", "bool", False,
        "When 1, disables the persistent NEFF cache entirely. Every compile runs fresh.",
        _CACHE, parse_bool),
    Var("TORCH_NEURONX_NEFF_CACHE_LOCK_TIMEOUT", "int", 1200,
        "Seconds to wait for the per-key compile lock before giving up.",
        _CACHE, parse_seconds),
    Var("TORCH_NEURONX_NEFF_KEY_FROM_HLO", "bool", True,
        "When 1 (the default), the persistent NEFF key is derived from the lowered HLO bytes plus "
        "compiler config (instead of the in-memory base_key). Lets benign Python edits re-trace and "
        "re-lower without busting the on-disk cache. Set to 0 to use the in-memory base_key.",
        _CACHE, parse_bool),
    Var("NKI_ENABLE_TRACE_CACHE", "bool", True,
        "When 1, the NKI kernel compile cache is persisted across processes at "
        "/var/tmp/nki-trace-cache-uid<uid>/ (or NKI_TRACE_CACHE_URL if set). Only files under a "
        "site-packages/dist-packages tree that map to an installed wheel are version-tracked; the "
        "kernel is assumed to be a pure function of its declared arguments and its source.",
        _CACHE, parse_bool),
    Var("NKI_TRACE_CACHE_URL", "str", "",
        "Location of the NKI trace cache instead of /var/tmp/nki-trace-cache-uid<uid>/.",
        _CACHE, parse_str),
    Var("TORCH_CACHING_PRECOMPILE", "bool", False,
        "When 1, enables the PyTorch Dynamo precompile cache, which caches the backend result of the "
        "Dynamo trace of any torch.compile-ed modules or functions. Saved at TORCHINDUCTOR_CACHE_DIR, "
        "split by subdirectories per rank if applicable. For the neuron backend the HLO result is "
        "cached, separate from the HLO cache. Off by default.",
        _CACHE, parse_bool, external_readers=(_TORCH,)),
    Var("TORCHINDUCTOR_CACHE_DIR", "path", _inductor_cache_default,
        "Directory for the torch inductor cache. This is a PyTorch variable and affects the location "
        "of other caches as well.",
        _CACHE, parse_path, default_doc="/tmp/torchinductor_<username>/",
        external_readers=(_TORCH,)),
)

# Eager execution
register(
    Var("NEURON_LAUNCH_BLOCKING", "bool", False,
        "When 1, forces synchronous execution. Useful for debugging.",
        _EAGER, parse_bool),
    Var("TORCH_NEURONX_FALLBACK_ONLY_FOR_UNIMPLEMENTED_OPS", "bool", False,
        "When 1, only falls back to CPU for unimplemented ops, not execution errors.",
        _EAGER, parse_bool),
    Var("TORCH_NEURONX_ENABLE_STACK_TRACE", "bool", False,
        "When 1, captures Python stack traces per operation. Adds overhead.",
        _EAGER, parse_bool),
    Var("TORCH_NEURONX_LOG_LEVEL", "int", 1,
        "Log verbosity: 0 = ERROR, 1 = WARNING (the default), 2 = INFO, 3 = DEBUG.",
        _EAGER, parse_log_level),
    Var("TORCH_NEURONX_USE_PINNED_MALLOC", "bool", False,
        "(Experimental) When 1, uses driver-pinned host memory.",
        _EAGER, parse_bool),
)

# Metrics
register(
    Var("TORCH_NEURONX_ENABLED_METRIC_TABLES", "str", "",
        "Comma-separated metric tables to enable for CSV export.",
        _METRICS, parse_str),
    Var("TORCH_NEURONX_METRICS_DIR", "str", "/tmp",
        "Directory for metric CSV files.",
        _METRICS, parse_path),
)

# Profiling
register(
    Var("TORCH_NEURONX_PROFILE_DEFAULT_SESSION", "bool", True,
        "Set to 0 to disable the default session. Then ProfilerActivity.PrivateUse1 without a "
        "NeuronConfig records no Neuron data.",
        _PROFILE, parse_bool),
    Var("TORCH_NEURONX_PROFILE_MODES", "str", "runtime,cpu_util,host_memory",
        "Comma-separated profile modes. Add device for the device profile. The device profile "
        "reserves device memory for hardware notifications.",
        _PROFILE, parse_str),
    Var("TORCH_NEURONX_PROFILE_RANKS", "str", IndexRanges.of((0,)),
        "Comma-separated global ranks that capture a profile. The rank comes from the RANK "
        "environment variable.",
        _PROFILE, parse_index_ranges, default_doc="0"),
    Var("TORCH_NEURONX_PROFILE_MAX_EVENTS_PER_NC", "int", 10000000,
        "Maximum number of system trace events for each NeuronCore.",
        _PROFILE, parse_non_negative_int),
    Var("TORCH_NEURONX_PROFILE_CAPTURE_NC", "str", IndexRanges.of((0, 1)),
        "NeuronCore indices or ranges to capture, for example 0,1,2-5.",
        _PROFILE, parse_index_ranges, default_doc="0,1"),
    Var("TORCH_NEURONX_PROFILE_OUTPUT_DIR", "path", "neuron_profile",
        "Directory for the profile session output.",
        _PROFILE, parse_path),
)

# Distributed
register(
    Var("TORCH_NEURONX_ENABLE_STREAMS", "bool", True,
        "When 1 (the default), Neuron streams are enabled and work can be submitted to the default "
        "stream or non-default streams. When 0, all streams alias the default stream. Only 0 and 1 "
        "are accepted.",
        _DIST, parse_strict_01, strict=True),
    Var("TORCH_NEURONX_ENABLE_HOST_CC", "bool", False,
        "When 1, enables collectives to execute on non-default streams, allowing communication to "
        "overlap with computation. Requires TORCH_NEURONX_ENABLE_STREAMS=1 (the default).",
        _DIST, parse_bool),
    Var("NEURON_USE_SPLIT_ALLGATHER", "bool", None,
        "Enables split-based allgather for better memory efficiency. When unset, the default depends "
        "on the stream; when set, only 1 enables it and any other value disables it.",
        _DIST, parse_only_one_enables, default_doc="on (default stream)"),
    Var("NEURON_USE_SPLIT_REDUCE_SCATTER", "bool", None,
        "Enables split-based reduce_scatter. When unset, the default depends on the stream; when "
        "set, only 1 enables it and any other value disables it.",
        _DIST, parse_only_one_enables, default_doc="on (default stream)"),
    Var("NEURON_USE_NKI_ALLTOALLV", "bool", True,
        "Enables native NKI all_to_all_v. Set to 0 to use the compatibility padding fallback.",
        _DIST, parse_bool),
    Var("COLLECTIVE_BUCKETSIZE_IN_MB", "int", 512,
        "Maximum bucket size (MB) for collective operations.",
        _DIST, parse_non_negative_int),
    Var("RANK", "int", 0,
        "Global rank of this process (set by torchrun). Selects the rank{rank} artifact directory "
        "and the profiled ranks.",
        _DIST, parse_non_negative_int),
    Var("LOCAL_RANK", "int", 0,
        "Rank of this process among the processes of its host (set by torchrun).",
        _DIST, parse_non_negative_int, external_readers=("torchrun (sets it)",)),
    Var("WORLD_SIZE", "int", 1,
        "Number of processes in the job (set by torchrun); torch.distributed's value wins once it is "
        "initialized.",
        _DIST, parse_non_negative_int, external_readers=("torchrun (sets it)",)),
)

# Memory allocator
register(
    Var("TORCH_NEURONX_ENABLE_SCALAR_CACHE", "bool", True,
        "When 1 (the default), caches device-side scalar constants to avoid repeated host-to-device "
        "copies. (Here: the 0-d tensors that carry an eager op's Python floats into its kernel, per "
        "value and dtype.)",
        _MEMORY, parse_bool),
    Var("TORCH_NEURONX_SEGMENT_ALLOCATOR_CONFIG", "str", "",
        "Comma-separated key=value tuning knobs of the caching allocator's segment pool (kPoolBoundary, "
        "kSmallSegmentSize, kMediumSegmentSize, kMediumThreshold, kSegmentAlignment, kMinRoundedSize, "
        "kRoundupPower2Divisions, kSmallSplitThreshold, kLargeSplitThreshold, kMaxSplitSizeBytes, "
        "kMaxNonSplitRoundingBytes). Parsed and snapshotted on first allocator use; restart to change.",
        _MEMORY, parse_str),
)

# torch_neuronx extensions
register(
    Var("TORCH_NEURONX_DEVICE_MEMORY_BYTES", "int", 0,
        "Capacity of each neuron device's memory in bytes, for the caching allocator. 0 (the default) "
        "means the target's real memory (host RAM on the cpu target).",
        _OURS, parse_non_negative_int, ours=True),
    Var("TORCH_NEURONX_VISIBLE_DEVICES", "str", (),
        "The neuron devices this process sees: a count (4) or indices and ranges (0,1 or 0-3), as "
        "NEURON_RT_VISIBLE_CORES lists NeuronCores. The process numbers them from 0 "
        "(torch.neuron.device_count() is how many). Unset: one device.",
        _OURS, parse_device_list, default_doc="(one device)", ours=True),
    Var("TORCH_NEURONX_COMPILER_FLAGS", "str", "",
        "Extra flags appended to every compiler invocation (space separated). Part of the cache key.",
        _OURS, parse_str, ours=True),
    Var("TORCH_NEURONX_TARGET_CPU", "str", "host",
        "The LLVM CPU the cpu target compiles for: host (the default: every instruction this host has) "
        "or a CPU name such as x86-64-v3 (AVX2 and FMA, what bench/compile.py --isa avx2 uses to emulate "
        "an AVX2-only host on an AVX-512 one), znver3 or x86-64-v4. The cpu target's other flags stay "
        "the same (measured best on AVX2 and AVX-512 alike). Part of the cache key (the flags name "
        "the CPU), so NEFFs for two CPUs never mix.",
        _OURS, parse_str, ours=True),
    Var("TORCH_NEURONX_RESIDENT_PARAMETERS", "bool", True,
        "When 1 (the default), inference graphs keep their nn.Parameter inputs resident in the runtime: "
        "weights are bound (and packed for the matmuls) once, and bound again only when a parameter "
        "changes (another tensor, or an in-place update). Costs one packed copy of the weights. When 0, "
        "parameters are passed and packed on every call. Part of the NEFF (its signature changes).",
        _OURS, parse_bool, ours=True),
    Var("TORCH_NEURONX_RESIDENT_PARAMETERS_BYTES", "int", 0,
        "Budget, in bytes of parameters, for the resident parameters bound at once across all compiled "
        "graphs of the process. When a binding would exceed it, the graphs used least recently release "
        "theirs (they bind again on their next call). 0 (the default) means a quarter of the host's "
        "physical memory.",
        _OURS, parse_non_negative_int, default_doc="0 (a quarter of host memory)", ours=True),
    Var("TORCH_NEURONX_PIN_WORKERS", "bool", True,
        "When 1 (the default), each worker of the multi-threaded runtime driver (one per CPU this "
        "process may use) is pinned to its own CPU, so the kernel cannot stack two workers on one core "
        "after the calling thread was busy. 0 leaves them unpinned. Read when the runtime first starts.",
        _OURS, parse_bool, ours=True),
    Var("TORCH_NEURONX_PAUSE_OPENMP", "bool", True,
        "When 1 (the default), a call of a NEFF that runs on several runtime workers first ends the "
        "calling thread's idle OpenMP threads (omp_pause_resource_all), whose spin-wait after a parallel "
        "torch op would take cores from the workers; the next parallel torch op starts them again.",
        _OURS, parse_bool, ours=True),
    Var("TORCH_NEURONX_LOWER_IN_SUBPROCESS", "bool", True,
        "When 1 (the default), torch-mlir's lowering to StableHLO runs in a worker process (one per "
        "process, reused), so a graph that makes torch-mlir's C++ abort raises a NeuronCompileError of "
        "stage lowering instead of ending the program. 0 lowers in the calling process.",
        _OURS, parse_bool, ours=True),
    Var("TORCH_NEURONX_LOWERING_TIMEOUT", "int", 1200,
        "Seconds one graph's lowering may take in the worker process before it is stopped and the "
        "graph fails with a NeuronCompileError of stage lowering. A positive number.",
        _OURS, parse_positive_seconds, ours=True),
    Var("TORCH_NEURONX_DYNAMO_DYNAMIC_SHAPES", "bool", True,
        "When 1 (the default), a torch.compile inference graph whose dimensions Dynamo marks dynamic "
        "(a second batch size, mark_dynamic, dynamic=True) is traced once with those sizes symbolic "
        "and compiled to one NEFF for every size, checked once against eager on its first call; a "
        "graph that cannot (a training graph, a trace that depends on a size) compiles one NEFF per "
        "input signature and says why at INFO. 0 compiles one NEFF per input signature always "
        "(TorchNeuron's behaviour: static shapes only).",
        _OURS, parse_bool, ours=True),
    Var("TORCH_NEURONX_EAGER_DYNAMIC_SHAPES", "bool", True,
        "When 1 (the default), an eager op family compiles kernels for its first two shapes and, from "
        "its third shape on, one dynamic-shape kernel for every later shape: sizes of 2 and up are "
        "dynamic (only which of them are equal, and which are 0, 1 or an int argument's value, picks "
        "the kernel), so batch sizes and sequence lengths that change every step do not compile again; "
        "a shape that keeps coming back for 2 s gets its own (faster) kernel. Ops whose trace depends on a size "
        "(a reshape to given sizes, a convolution's spatial sizes) keep one kernel per shape. 0 "
        "compiles one kernel per shape for every op.",
        _OURS, parse_bool, ours=True),
    Var("TORCH_NEURONX_IREE_COMPILE", "path", "",
        "Path of the iree-compile executable. Empty (the default): the one shipped with "
        "iree-base-compiler.",
        _OURS, parse_path, default_doc="(from iree-base-compiler)", ours=True),
    Var("CXX", "str", "",
        "The C++ compiler that builds the backend's native PrivateUse1 hooks and device guard "
        "(pinned host memory, torch's generic streams and events) on first use. Empty (the default): "
        "c++, g++ or clang++ from PATH; none found, the Python hooks serve without those features.",
        _OURS, parse_str, default_doc="(c++ from PATH)", ours=True, external_readers=("build tools",)),
    Var("XDG_CACHE_HOME", "path", _user_cache_default,
        "Base directory of per-user caches (the XDG convention): the native hooks are built into "
        "<it>/torch_neuronx/native, named by a digest of their source and the torch version.",
        _OURS, parse_path, default_doc="~/.cache", ours=True, external_readers=("other programs",)),
)

