"""The ``torch_neuronx`` logger hierarchy, leveled by TORCH_NEURONX_LOG_LEVEL.

Every module logs through ``logging.getLogger("torch_neuronx.<module>")``; this
module sets the root of that hierarchy once, on import of the package:
0 = ERROR, 1 = WARNING (the default), 2 = INFO, 3 = DEBUG.
"""

from __future__ import annotations

import logging

from torch_neuronx import config

_LEVELS = {0: logging.ERROR, 1: logging.WARNING, 2: logging.INFO, 3: logging.DEBUG}
_HANDLER_NAME = "torch_neuronx"


def logger() -> logging.Logger:
    """The root ``torch_neuronx`` logger."""
    return logging.getLogger("torch_neuronx")


def configure() -> logging.Logger:
    """(Re)apply TORCH_NEURONX_LOG_LEVEL to the ``torch_neuronx`` logger; idempotent."""
    root = logger()
    root.setLevel(_LEVELS[config.get("TORCH_NEURONX_LOG_LEVEL")])
    if not any(h.get_name() == _HANDLER_NAME for h in root.handlers):
        handler = logging.StreamHandler()
        handler.set_name(_HANDLER_NAME)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        root.addHandler(handler)
    root.propagate = False
    return root
