"""The runtime's own error types: it reports failures without knowing the compiler above it."""

from __future__ import annotations


class NeuronRuntimeError(RuntimeError):
    """The runtime could not load or execute a NEFF."""


class InputFailedError(NeuronRuntimeError):
    """Queued work did not run because work producing one of its inputs failed (``root``: that
    first failure). Its stream logs only the root, once: a long chain of ops behind one failure
    logged an error for each, each nesting the chain before it."""

    def __init__(self, message: str, root: BaseException) -> None:
        super().__init__(message)
        self.root = root


class NeffLoadError(NeuronRuntimeError):
    """The runtime rejected a NEFF when loading it (``path``: the NEFF file, when it has one).

    The compile pipeline reports it as a compile failure of stage ``load``.
    """

    def __init__(self, message: str, path: str | None = None) -> None:
        super().__init__(message)
        self.path = path
