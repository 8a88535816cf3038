"""Lowering an FX graph to StableHLO through the HLO cache, writing the artifact tree as it goes."""

from __future__ import annotations

import json
import logging

import torch

from torch_neuronx import config
from torch_neuronx.cache import store
from torch_neuronx.compiler import lower
from torch_neuronx.compiler.errors import NeuronCompileError
from torch_neuronx.compiler.hlo import graph_key
from torch_neuronx.pipeline.artifacts import GraphArtifacts

_log = logging.getLogger("torch_neuronx.pipeline.lowering")


def lower_cached(gm: torch.fx.GraphModule, *, use_cache: bool = True, dialect: str = "stablehlo") -> lower.Lowered:
    """``lower.lower(gm)``, served from TORCH_NEURONX_HLO_CACHE_DIR when this graph was lowered before
    (``dialect``: see :func:`~torch_neuronx.compiler.lower.lower`).

    ``use_cache=False`` (eager ops with TORCH_NEURONX_HLO_CACHE=0) and
    TORCH_NEURONX_NEFF_DISABLE_CACHE=1 bypass it: the graph is lowered, nothing is stored.
    """
    if not use_cache or config.get("TORCH_NEURONX_NEFF_DISABLE_CACHE"):
        return lower.lower(gm, dialect=dialect)
    cache = store.hlo_cache()
    key = graph_key(gm) if dialect == "stablehlo" else f"{graph_key(gm)}-{dialect}"
    text = cache.get(key)
    if text is not None:
        try:
            entry = json.loads(text)
            _log.debug("HLO cache hit for %s", key)
            return lower.Lowered(raw=entry["raw"], stablehlo=entry["stablehlo"], dialect=dialect)
        except (ValueError, KeyError):
            _log.warning("HLO cache entry for %s is malformed; lowering again", key)
    lowered = lower.lower(gm, dialect=dialect)
    cache.put(key, json.dumps({"raw": lowered.raw, "stablehlo": lowered.stablehlo}))
    return lowered


def lower_with_artifacts(gm: torch.fx.GraphModule, artifacts: GraphArtifacts, hlo_cache: bool,
                         dialect: str = "stablehlo") -> lower.Lowered:
    """:func:`lower_cached`, its raw and StableHLO (or linalg) modules written to the artifact tree
    (and, when torch-mlir fails, the graph it failed on)."""
    try:
        lowered = lower_cached(gm, use_cache=hlo_cache, dialect=dialect)
    except NeuronCompileError as err:
        raw = getattr(err, "raw_text", None) or gm.print_readable(print_output=False)
        header = "".join(f"// {line}\n" for line in str(err).splitlines())  # the module still parses
        artifacts.torch_mlir_error(header + raw)
        raise
    artifacts.raw(lowered.raw)
    if dialect == "stablehlo":
        artifacts.stablehlo(lowered.stablehlo)
    else:
        artifacts.linalg(lowered.stablehlo)
    return lowered
