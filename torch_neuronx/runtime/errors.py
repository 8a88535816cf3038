"""The runtime's own error types: it reports failures without knowing the compiler above it."""

from __future__ import annotations


class NeuronRuntimeError(RuntimeError):
    """The runtime could not load or execute a NEFF."""


class NeffLoadError(NeuronRuntimeError):
    """The runtime rejected a NEFF when loading it (``path``: the NEFF file, when it has one).

    The compile pipeline reports it as a compile failure of stage ``load``.
    """

    def __init__(self, message: str, path: str | None = None) -> None:
        super().__init__(message)
        self.path = path
