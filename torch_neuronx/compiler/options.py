"""Compile options: the programmatic face of the compiler's configuration.

``CompileOptions`` passed as ``torch.compile(model, backend="neuron",
options=CompileOptions(...))`` (or as a plain dict of the same fields)
overrides the environment variables for that compilation. Everything that
changes generated code ends up in :meth:`CompileOptions.compiler_config`,
which is part of the NEFF cache key.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shlex
import threading
from collections.abc import Iterator, Mapping
from typing import Any

from torch_neuronx import config
from torch_neuronx.compiler import targets


@dataclasses.dataclass(frozen=True)
class CompileOptions:
    """Options of one ``torch.compile(backend="neuron")`` call; ``None`` means "from the environment".

    Attributes:
        target: compilation target (NEURON_PLATFORM_TARGET_OVERRIDE): cpu, cuda, x86_64, aarch64,
            trn2/trn3 (with a real neuronx-cc).
        fallback_execution: run the original graph eagerly when compilation fails
            (the inverse of TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION).
        compile_only: compile to NEFF and never execute (TORCH_NEURONX_COMPILE_ONLY).
        preserve_artifacts: keep the artifact tree (TORCH_NEURONX_PRESERVE_COMPILATION_ARTIFACTS).
        optimization_level: compiler optimization level 0-3 (``--iree-opt-level=O<n>``); default: the
            target's measured best (3 on cpu, 2 elsewhere).
        extra_flags: extra compiler flags, appended after TORCH_NEURONX_COMPILER_FLAGS.
        complex_decompose: decompose complex arithmetic (TORCH_NEURONX_COMPLEX_DECOMPOSE).
        model_name: name used in artifact file names; default the Dynamo graph name.
    """

    target: str | None = None
    fallback_execution: bool | None = None
    compile_only: bool | None = None
    preserve_artifacts: bool | None = None
    optimization_level: int | None = None
    extra_flags: tuple[str, ...] = ()
    complex_decompose: bool | None = None
    model_name: str | None = None

    def __post_init__(self) -> None:
        if self.optimization_level is not None and self.optimization_level not in (0, 1, 2, 3):
            raise ValueError(f"CompileOptions.optimization_level must be 0-3, got {self.optimization_level!r}")
        if isinstance(self.extra_flags, str):
            object.__setattr__(self, "extra_flags", tuple(shlex.split(self.extra_flags)))

    @classmethod
    def from_any(cls, options: CompileOptions | Mapping[str, Any] | None) -> CompileOptions:
        """Accept ``None``, a ``CompileOptions`` or a dict of its fields (what torch.compile passes)."""
        if options is None:
            return cls()
        if isinstance(options, cls):
            return options
        if isinstance(options, Mapping):
            names = {f.name for f in dataclasses.fields(cls)}
            unknown = sorted(set(options) - names)
            if unknown:
                raise TypeError(f"unknown neuron compile option(s) {unknown}; known: {sorted(names)}")
            return cls(**options)
        raise TypeError(f"options must be a CompileOptions or a dict, got {type(options).__name__}")

    @contextlib.contextmanager
    def applied(self) -> Iterator[None]:
        """Make these options win over the environment (``config.get``) inside the block."""
        fallback = None if self.fallback_execution is None else not self.fallback_execution
        with config.override(
            NEURON_PLATFORM_TARGET_OVERRIDE=self.target,
            TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION=fallback,
            TORCH_NEURONX_COMPILE_ONLY=self.compile_only,
            TORCH_NEURONX_PRESERVE_COMPILATION_ARTIFACTS=self.preserve_artifacts,
            TORCH_NEURONX_COMPLEX_DECOMPOSE=self.complex_decompose,
        ):
            yield

    def resolve(self) -> ResolvedOptions:
        """These options over the environment, read once: the value a compile carries down the pipeline.

        Raises ``ValueError`` for an unknown target, before anything is traced.
        """
        with self.applied():
            target = targets.resolve(self.target)
            flags = (tuple(self.compiler_flags(target)), tuple(self.compiler_flags(target, keep_f64=True)))
            return ResolvedOptions(
                options=self, target=target, flags=flags,
                host_cpu=targets.host_cpu() if target.host_specific else None,
                fallback=not config.get("TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION"),
                preserve_artifacts=bool(config.get("TORCH_NEURONX_PRESERVE_COMPILATION_ARTIFACTS")),
                complex_decompose=bool(config.get("TORCH_NEURONX_COMPLEX_DECOMPOSE")))

    def resolved_target(self) -> targets.Target:
        """The target these options (or the environment) select."""
        return targets.resolve(self.target)

    def compiler_flags(self, target: targets.Target, *, keep_f64: bool = False) -> list[str]:
        """Every flag passed to the compiler for ``target``, in order.

        ``keep_f64``: the graph computes in float64, which must not be demoted to float32.
        """
        level = target.default_opt_level if self.optimization_level is None else self.optimization_level
        flags = list(target.flags)
        if keep_f64 and target.compiler == "iree":
            flags += targets.KEEP_F64_FLAGS
        if target.compiler == "iree":
            flags.append(f"--iree-opt-level=O{level}")
        flags += shlex.split(config.get("TORCH_NEURONX_COMPILER_FLAGS"))
        flags += list(self.extra_flags)
        return flags

    def compiler_config(self, target: targets.Target, *, keep_f64: bool = False) -> dict[str, Any]:
        """The cache-key component describing how code is generated."""
        config_ = {"target": target.name, "compiler": target.compiler,
                   "flags": self.compiler_flags(target, keep_f64=keep_f64)}
        if target.host_specific:
            config_["host_cpu"] = targets.host_cpu()
        return config_


@dataclasses.dataclass(frozen=True)
class ResolvedOptions:
    """One compilation's options and environment, resolved once at its frontend (immutable).

    Everything below the frontend reads its settings here: the target, the compiler flags
    (with and without float64 kept), the fallback and artifact policies. :meth:`applied`
    exposes the same values to the FX passes that read configuration.
    """

    options: CompileOptions
    target: targets.Target
    flags: tuple[tuple[str, ...], tuple[str, ...]]  # (flags, flags keeping float64)
    host_cpu: str | None
    fallback: bool
    preserve_artifacts: bool
    complex_decompose: bool

    def compiler_flags(self, *, keep_f64: bool = False, dialect: str = "stablehlo") -> list[str]:
        """Every flag passed to the compiler, in order (see :meth:`CompileOptions.compiler_flags`), for a
        module in ``dialect`` (StableHLO, or linalg-on-tensors for dynamic-shape kernels)."""
        return targets.with_input_dialect(self.flags[keep_f64], dialect)

    def compiler_config(self, *, keep_f64: bool = False, dialect: str = "stablehlo") -> dict[str, Any]:
        """The cache-key component describing how code is generated."""
        config_ = {"target": self.target.name, "compiler": self.target.compiler,
                   "flags": self.compiler_flags(keep_f64=keep_f64, dialect=dialect)}
        if self.host_cpu is not None:
            config_["host_cpu"] = self.host_cpu
        return config_

    @contextlib.contextmanager
    def applied(self) -> Iterator[None]:
        """These resolved values as configuration overrides (for the FX passes that read config)."""
        with config.override(
            NEURON_PLATFORM_TARGET_OVERRIDE=self.target.name,
            TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION=not self.fallback,
            TORCH_NEURONX_COMPILE_ONLY=self.options.compile_only,
            TORCH_NEURONX_PRESERVE_COMPILATION_ARTIFACTS=self.preserve_artifacts,
            TORCH_NEURONX_COMPLEX_DECOMPOSE=self.complex_decompose,
        ):
            yield


def compile_only_enabled() -> bool:
    """Whether compiled graphs are compiled but never executed right now, in this thread (on every
    call: keep it cheap). The variable a :func:`compile_only` block sets for the process does not
    count in other threads (a server's threads kept serving zeros while one precompiled)."""
    if not config.get(_COMPILE_ONLY):
        return False
    if _environment_holders and not getattr(_in_block, "depth", 0):
        return _environment_before_enabled  # set by another thread's block: the value before it
    return True


@contextlib.contextmanager
def compile_only() -> Iterator[None]:
    """Inside this block graphs compile to NEFF and never execute (TORCH_NEURONX_COMPILE_ONLY=1).

    Calls of compiled functions return tensors of the right shapes and dtypes filled
    with zeros, on the device of the inputs (so ``device="meta"`` inputs compile graphs
    too large for this host without allocating anything); the NEFFs land in the cache
    as usual.

    As the specification says, the block also sets ``TORCH_NEURONX_COMPILE_ONLY=1`` in the
    environment (for the processes it starts, as any variable), and restores the previous
    value when the last such block in the process ends. Only the thread in the block compiles
    without executing: other threads' compiled calls keep running (:func:`compile_only_enabled`).
    """
    global _environment_holders, _environment_before, _environment_before_enabled
    with _environment_lock:
        if _environment_holders == 0:
            _environment_before = os.environ.get(_COMPILE_ONLY)
            _environment_before_enabled = bool(config.get(_COMPILE_ONLY))
            os.environ[_COMPILE_ONLY] = "1"
        _environment_holders += 1
    _in_block.depth = getattr(_in_block, "depth", 0) + 1
    try:
        with config.override(TORCH_NEURONX_COMPILE_ONLY=True):
            yield
    finally:
        _in_block.depth -= 1
        with _environment_lock:
            _environment_holders -= 1
            if _environment_holders == 0:
                if _environment_before is None:
                    os.environ.pop(_COMPILE_ONLY, None)
                else:
                    os.environ[_COMPILE_ONLY] = _environment_before


_COMPILE_ONLY = "TORCH_NEURONX_COMPILE_ONLY"
_environment_lock = threading.Lock()
_environment_holders = 0  # compile_only() blocks open in this process
_environment_before: str | None = None  # the variable's value before the first of them
_environment_before_enabled = False  # whether that value enabled compile-only
_in_block = threading.local()  # depth: this thread's open compile_only() blocks
