"""``NeuronProfiler(config).export_trace``: torch.profiler's ``on_trace_ready`` handler for Neuron sessions.

It writes ``trace.json`` (torch's Chrome trace with the session's events merged in) into the
directory of the session that just ended, beside the session's mode files. On ranks that do not
capture (TORCH_NEURONX_PROFILE_RANKS), or when no session ran, it writes nothing.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from torch_neuronx.profiling.hooks import SESSION_ATTR
from torch_neuronx.profiling.options import NeuronConfig

_log = logging.getLogger("torch_neuronx.profiling")
TRACE_FILE = "trace.json"


class NeuronProfiler:
    """Exports each recording cycle of a profiler: ``on_trace_ready=NeuronProfiler(cfg).export_trace``."""

    def __init__(self, config: NeuronConfig | None = None) -> None:
        self.config = config
        self.exported: list[str] = []  # the trace files written, in order

    def export_trace(self, prof: Any) -> str | None:
        """Write ``trace.json`` of ``prof``'s last cycle into its session's directory; its path, or None."""
        session = getattr(prof, SESSION_ATTR, None)
        if session is None:
            _log.info("neuron profiler: no session recorded on this rank; no trace written")
            return None
        os.makedirs(session.directory, exist_ok=True)
        path = os.path.join(session.directory, TRACE_FILE)
        session.files["trace"] = TRACE_FILE
        prof.export_chrome_trace(path)  # torch's trace, our events merged in (hooks.py)
        self.exported.append(path)
        return path
