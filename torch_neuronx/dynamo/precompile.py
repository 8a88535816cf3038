"""TORCH_CACHING_PRECOMPILE: our backend's result in PyTorch's Dynamo precompile cache.

With TORCH_CACHING_PRECOMPILE=1 PyTorch saves whole Dynamo frames (bytecode,
guards and each graph's backend result) under ``{TORCHINDUCTOR_CACHE_DIR}/dynamo``
and a later process installs them without tracing. The neuron backend's result
is the compiled graph's plan (its StableHLO and calling metadata, see
``plans.py``): restoring it only fetches the NEFF from the NEFF cache and loads it.
Entries are split per rank (``dynamo/rank{RANK}``) when RANK is set, and saved at
process exit. Graphs that need aot_autograd at run time (training graphs) are
not stored: PyTorch then traces their frame again.
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import logging
import os
from typing import Any

import torch
from torch._dynamo.precompile_context import BackendCacheArtifact, PrecompileContext

from torch_neuronx import observe, process
from torch_neuronx.compiler.options import CompileOptions
from torch_neuronx.dynamo import plans

_log = logging.getLogger("torch_neuronx.dynamo.precompile")
_save_registered = False


def enabled() -> bool:
    """Whether PyTorch's precompile cache is on (torch reads TORCH_CACHING_PRECOMPILE at import)."""
    return bool(torch._dynamo.config.caching_precompile)


@dataclasses.dataclass
class NeuronPrecompileArtifact(BackendCacheArtifact[Any]):
    """A plan (JSON) and the compile options it was built with, restored as a callable graph."""

    def after_deserialization(self) -> Any:
        from torch_neuronx.dynamo.graph import from_plan_unboxed

        payload = json.loads(self.content)
        options = CompileOptions.from_any(payload["options"]).resolve()
        plan = plans.Plan(**payload["plan"])
        observe.count("precompile_restores")
        return from_plan_unboxed(plan, options)


def _per_rank_store() -> None:
    """Point PyTorch's Dynamo cache at a rank{RANK} subdirectory when RANK is set."""
    if "RANK" not in os.environ:
        return
    from torch._dynamo.package import DynamoCache, cache_dir

    root = os.path.join(cache_dir(), "dynamo")
    DynamoCache.path_prefix = lambda: process.rank_dir(root)  # type: ignore[method-assign]


def _save_at_exit() -> None:
    try:
        PrecompileContext.save_to_dynamo_cache()
    except Exception as exc:  # a cache write must never fail the program at exit
        _log.warning("could not save the Dynamo precompile cache: %s", exc)


def record(gm: torch.fx.GraphModule, plan: plans.Plan, options: CompileOptions) -> None:
    """Offer ``plan`` as the backend result of ``gm`` to PyTorch's precompile cache."""
    global _save_registered
    backend_id = getattr(gm, "_backend_id", None)
    if not enabled() or backend_id is None:
        return
    options_fields = {k: v for k, v in dataclasses.asdict(options).items() if v not in (None, ())}
    content = json.dumps({"plan": dataclasses.asdict(plan), "options": options_fields})
    PrecompileContext.record_artifact(NeuronPrecompileArtifact(key=backend_id, content=content))
    if not _save_registered:
        _per_rank_store()
        atexit.register(_save_at_exit)
        _save_registered = True
