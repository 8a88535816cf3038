"""Errors of the compile path, each naming the stage that failed and where its artifacts are."""

from __future__ import annotations

import signal

STAGES = ("trace", "import", "lowering", "compile", "load", "execute")


class NeuronCompileError(RuntimeError):
    """A graph could not be compiled for the neuron backend.

    Attributes:
        stage: one of ``trace`` (aot_autograd / decompositions / FX passes), ``import``
            (torch-mlir FX import), ``lowering`` (torch dialect to StableHLO), ``compile``
            (the compiler driver), ``load`` (the runtime rejected the NEFF), ``execute``.
        detail: what went wrong.
        op: the operator that failed, when it could be identified.
        graph: the graph's artifact name (``{model}_{forward|backward|inference}``).
        artifacts: the directory holding the failing graph's artifacts (kept on failure).

    The message is built from these attributes when printed, so layers that learn
    more (the graph name, the artifact path) fill them in as the error rises.
    """

    def __init__(self, stage: str, detail: str, *, op: str | None = None,
                 artifacts: str | None = None, graph: str | None = None) -> None:
        assert stage in STAGES, stage
        super().__init__(detail)
        self.stage, self.detail, self.op, self.artifacts, self.graph = stage, detail, op, artifacts, graph
        #: eager PyTorch's own error for the graph, when it raises one too (the program's bug, not ours)
        self.eager_error: str | None = None

    def __str__(self) -> str:
        head = f"neuron backend: {self.stage} stage failed"
        if self.graph:
            head += f" for graph {self.graph!r}"
        parts = [head]
        if self.eager_error:
            parts.append(f"eager PyTorch refuses this graph too: {self.eager_error}")
        if self.op:
            parts.append(f"op: {self.op}")
        parts.append(self.detail.strip())
        if self.artifacts:
            parts.append(f"artifacts kept at: {self.artifacts}")
        if self.stage != "execute" and not self.eager_error:
            parts.append("set TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION=0 (or CompileOptions("
                         "fallback_execution=True)) to run such graphs eagerly instead")
        return "\n  ".join(parts)


class DataDependentShapeError(NeuronCompileError):
    """A graph has a tensor whose shape depends on tensor values (``nonzero``, ``unique``,
    ``masked_select``): no NEFF can have it. The eager device runs such an op on the host as a
    synchronization (as CUDA synchronizes for it), not as a fallback."""

    data_dependent_shape = True


def data_dependent(exc: BaseException | None) -> bool:
    """Whether ``exc``'s chain of causes holds a :class:`DataDependentShapeError`."""
    return _in_chain(exc, "data_dependent_shape") is not None


def _in_chain(exc: BaseException | None, flag: str) -> BaseException | None:
    """The first exception in ``exc``'s chain of causes with a true attribute ``flag``, if any."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if getattr(exc, flag, False):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


class CompilerNotFoundError(NeuronCompileError):
    """The compiler executable (iree-compile / neuronx-cc) is not installed or not on PATH."""

    def __init__(self, executable: str, *, artifacts: str | None = None) -> None:
        super().__init__("compile", f"compiler executable {executable!r} was not found; install "
                         "iree-base-compiler==3.13.0 (pip) or set TORCH_NEURONX_IREE_COMPILE",
                         artifacts=artifacts)


class NotDynamic(Exception):
    """A dynamic-shape trace depends on concrete sizes (it guarded on one, or a pass cannot handle a
    symbolic size): the kernel must be compiled for its concrete shapes instead."""


class InvalidInputError(RuntimeError):
    """An op's input that torch's own kernel rejects (``max()`` of an empty tensor, ``topk`` with
    ``k`` past the dimension), found while tracing the op: the caller sees torch's error, and the
    eager device never falls back to the CPU for it nor marks the op unimplemented."""

    neuron_input_error = True


class InvalidIndexError(IndexError):
    """:class:`InvalidInputError`'s kind for an index torch rejects with an IndexError."""

    neuron_input_error = True


def input_error(exc: BaseException) -> BaseException | None:
    """The bad-input error (one with ``neuron_input_error``) in ``exc``'s chain of causes, if any."""
    return _in_chain(exc, "neuron_input_error")


def process_ended(code: int | None) -> str:
    """How a compiler or worker process that failed with exit status ``code`` ended, in words (a
    negative status: the signal that killed it; None: it closed its pipe without exiting)."""
    if code is None:
        return "closed its pipe"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"
