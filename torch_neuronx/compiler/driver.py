"""The compiler driver: our neuronx-cc. Runs the compiler as a subprocess in a work dir.

Each compilation runs in ``{TORCH_NEURONX_DEBUG_DIR}/neuronx-cc/{hash}/`` (the
hash is the NEFF cache key, which covers the HLO, the target and the flags) and
leaves there, as neuronx-cc does:

    module.mlir        the StableHLO input
    compiler_args.txt  the full command line
    log-neuron-cc.txt  the compiler's stdout and stderr
    metadata.txt       target, compiler version, key, graph, timing
    module.neff        the NEFF container (header + compiled payload)

The directory is removed after a successful compile unless
TORCH_NEURONX_PRESERVE_COMPILATION_ARTIFACTS=1; after a failure it is kept and
the error gives its path. The compiler works in a private ``{hash}.partial-{pid}-{thread}``
directory, moved to ``{hash}`` when kept, so processes compiling one key at once (with the
cache off nothing serializes them) never share one.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import json
import logging
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

from torch_neuronx import config, observe
from torch_neuronx.compiler.errors import CompilerNotFoundError, NeuronCompileError, process_ended
from torch_neuronx.compiler.lower import op_from_message
from torch_neuronx.compiler.targets import Target
from torch_neuronx.config import directories
from torch_neuronx.format import neff

_log = logging.getLogger("torch_neuronx.compiler.driver")

#: Counts real compiler invocations in this process (the cache's tests and benches read it).
invocations = 0


@dataclasses.dataclass(frozen=True)
class CompileJob:
    """Everything the driver needs to produce one NEFF."""

    stablehlo: str
    target: Target
    flags: tuple[str, ...]
    key: str
    graph_name: str = "main"
    signature: dict[str, Any] = dataclasses.field(default_factory=dict)
    # Keep the work directory (TORCH_NEURONX_PRESERVE_COMPILATION_ARTIFACTS); None: read the variable.
    preserve: bool | None = None


def iree_compile_path() -> str:
    """The iree-compile executable: TORCH_NEURONX_IREE_COMPILE, else the one shipped with iree-base-compiler."""
    explicit = config.get("TORCH_NEURONX_IREE_COMPILE")
    if explicit:
        if not (os.path.isfile(explicit) and os.access(explicit, os.X_OK)):
            raise CompilerNotFoundError(explicit)
        return explicit
    try:
        from iree.compiler.tools.binaries import find_tool

        return find_tool("iree-compile")
    except Exception:
        found = shutil.which("iree-compile")
        if found is None:
            raise CompilerNotFoundError("iree-compile") from None
        return found


@functools.cache
def _iree_version() -> str:
    # From the installed distribution's metadata: importing iree.compiler to ask it loads the
    # MLIR bindings (~150 ms), which a warm start that compiles nothing must not pay.
    from importlib import metadata

    return f"iree-compile {metadata.version('iree-base-compiler')}"


@functools.cache
def _neuronx_cc_version() -> str:
    out = subprocess.run(["neuronx-cc", "--version"], capture_output=True, text=True, timeout=120)
    return f"neuronx-cc {(out.stdout or out.stderr).strip()}"


def compiler_version(target: Target) -> str:
    """The version string of the compiler that builds ``target`` (part of the cache key)."""
    if target.compiler != "iree":
        return _neuronx_cc_version()
    explicit = config.get("TORCH_NEURONX_IREE_COMPILE")
    if explicit:  # another binary than the package's: NEFFs of the package's compiler must not be served
        path = iree_compile_path()
        status = os.stat(path)
        return _binary_version(os.path.realpath(path), status.st_size, status.st_mtime_ns)
    return _iree_version()


@functools.cache
def _binary_version(path: str, size: int, mtime_ns: int) -> str:
    """What ``path --version`` says, with the binary's identity (rebuilt in place: another key)."""
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=120)
        said = " ".join((out.stdout or out.stderr).split())
    except (OSError, subprocess.TimeoutExpired) as exc:
        said = f"unknown ({type(exc).__name__})"
    return f"iree-compile {path} {size} {mtime_ns} {said}"


def work_dir(key: str) -> str:
    """The compiler work directory for a cache key."""
    return os.path.join(directories.directory("TORCH_NEURONX_DEBUG_DIR"), "neuronx-cc", key[:32])


_time_limit: contextvars.ContextVar[float | None] = contextvars.ContextVar("neuron_compile_time_limit", default=None)


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Compiles started inside this block stop after ``seconds`` (a NeuronCompileError of stage
    compile): for optional compiles with a fallback, such as an eager op's dynamic-shape kernel,
    whose IREE compile can take minutes where the static one takes one second (igamma)."""
    token = _time_limit.set(seconds)
    try:
        yield
    finally:
        _time_limit.reset(token)


def _command(job: CompileJob, flags: Sequence[str]) -> list[str]:
    if job.target.compiler == "iree":
        return [iree_compile_path(), *flags, "module.mlir", "-o", "payload.vmfb"]
    return ["neuronx-cc", "compile", "--framework=XLA", "module.mlir", "--output", "payload.vmfb", *flags]


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _attempt(job: CompileJob, flags: Sequence[str], workdir: str, *, append: bool) -> subprocess.CompletedProcess:
    """Run the compiler once with ``flags``; record the command line and its log in ``workdir``."""
    global invocations
    try:
        cmd = _command(job, flags)
    except CompilerNotFoundError as err:
        err.artifacts = workdir
        raise
    mode = "a" if append else "w"
    with open(os.path.join(workdir, "compiler_args.txt"), mode) as f:
        f.write(" ".join(cmd) + "\n")
    invocations += 1
    observe.count("compiler_invocations")
    limit = _time_limit.get()
    try:
        proc = subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, timeout=limit)
    except subprocess.TimeoutExpired as exc:
        raise NeuronCompileError("compile", f"{cmd[0]} took longer than {limit:g} s, the limit of this compile; "
                                 "it was stopped", artifacts=workdir, graph=job.graph_name) from exc
    except OSError as exc:
        raise NeuronCompileError("compile", f"could not run {cmd[0]}: {exc}", artifacts=workdir,
                                 graph=job.graph_name) from exc
    with open(os.path.join(workdir, "log-neuron-cc.txt"), mode) as f:
        f.write(proc.stdout + proc.stderr)
    return proc


def _failure(job: CompileJob, proc: subprocess.CompletedProcess, workdir: str) -> NeuronCompileError:
    log = (proc.stderr or proc.stdout).strip()
    first = "\n".join(log.splitlines()[:12])
    return NeuronCompileError(
        "compile", f"{job.target.compiler} {process_ended(proc.returncode)}:\n{first}",
        op=op_from_message(log), artifacts=workdir, graph=job.graph_name)


def compile_neff(job: CompileJob) -> bytes:
    """Compile ``job`` to a NEFF container and return its bytes; raise NeuronCompileError on failure.

    When the compiler rejects the module, it runs again with each of the target's fallback
    flag sets for ``job.flags`` (:attr:`Target.flag_fallbacks`) in turn, until one compiles;
    every attempt is in ``compiler_args.txt`` and ``log-neuron-cc.txt``.
    """
    final = work_dir(job.key)
    # A private directory while compiling: processes (or threads) compiling the same key at once,
    # as they do with the cache off, deleted each other's files in a shared one.
    workdir = f"{final}.partial-{os.getpid()}-{threading.get_ident()}"
    shutil.rmtree(workdir, ignore_errors=True)
    os.makedirs(workdir, exist_ok=True)
    try:
        data = _compile_in(job, workdir)
    except NeuronCompileError as err:
        published = _publish(workdir, final)
        if err.artifacts == workdir:
            err.artifacts = published
        raise
    except BaseException:
        _publish(workdir, final)
        raise
    preserve = job.preserve if job.preserve is not None else config.get("TORCH_NEURONX_PRESERVE_COMPILATION_ARTIFACTS")
    if not preserve or _publish(workdir, final) != final:
        # Not kept; or another process compiling this key published its (identical) artifacts
        # between our removal of the old ones and our move: a private directory left behind.
        shutil.rmtree(workdir, ignore_errors=True)
    return data


def _publish(workdir: str, final: str) -> str:
    """Move ``workdir`` to the key's documented place (replacing an older one); where it ends up."""
    shutil.rmtree(final, ignore_errors=True)
    try:
        os.rename(workdir, final)
    except OSError:  # another process published there in between: ours stays where it is
        return workdir
    return final


def _compile_in(job: CompileJob, workdir: str) -> bytes:
    """:func:`compile_neff`'s work in ``workdir``."""
    _write(os.path.join(workdir, "module.mlir"), job.stablehlo)
    version = compiler_version(job.target)
    started = time.perf_counter()
    _log.info("compiling %s for %s in %s", job.graph_name, job.target.name, workdir)
    flags = list(job.flags)
    proc = _attempt(job, flags, workdir, append=False)
    first = flags
    for retry in job.target.fallback_flags(first) if proc.returncode != 0 else ():
        _log.info("%s rejected %s; compiling again with %s", job.target.compiler, job.graph_name,
                  " ".join(f for f in retry if f not in first))
        flags, proc = retry, _attempt(job, retry, workdir, append=True)
        if proc.returncode == 0:
            break
    elapsed = time.perf_counter() - started
    if proc.returncode != 0:
        raise _failure(job, proc, workdir)
    with open(os.path.join(workdir, "payload.vmfb"), "rb") as f:
        payload = f.read()
    os.unlink(os.path.join(workdir, "payload.vmfb"))
    metadata = {"graph": job.graph_name, "compile_seconds": round(elapsed, 3), "flags": flags}
    data = neff.encode(payload, target=job.target.name, compiler_version=version, key=job.key,
                       signature=job.signature, metadata=metadata)
    with open(os.path.join(workdir, "module.neff"), "wb") as f:
        f.write(data)
    _write(os.path.join(workdir, "metadata.txt"), json.dumps(
        {"target": job.target.name, "compiler_version": version, "key": job.key, **metadata},
        indent=2) + "\n")
    _log.info("compiled %s in %.2f s (%d bytes)", job.graph_name, elapsed, len(data))
    return data
