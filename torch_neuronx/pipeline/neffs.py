"""From StableHLO to a verified NEFF: cache key, cache lookup, compiler driver on a miss.

The single way every frontend (torch.compile graphs, eager ops, user kernels)
obtains a NEFF.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from torch_neuronx import observe
from torch_neuronx.cache import keys, store
from torch_neuronx.compiler import driver, targets
from torch_neuronx.compiler.options import ResolvedOptions
from torch_neuronx.format import neff


@dataclasses.dataclass(frozen=True)
class NeffRequest:
    """One graph to obtain a NEFF for."""

    stablehlo: str
    options: ResolvedOptions
    graph_name: str
    base_repr: str  # graph structure, for the in-memory base key (TORCH_NEURONX_NEFF_KEY_FROM_HLO=0)
    signature: dict[str, Any]
    keep_f64: bool = False  # the graph has float64 tensors (see targets.KEEP_F64_FLAGS)
    dialect: str = "stablehlo"  # of ``stablehlo``: linalg for dynamic-shape kernels


def get_neff(request: NeffRequest) -> neff.Neff:
    """The NEFF for ``request``: from the cache when present, else compiled and stored."""
    options, target = request.options, request.options.target
    version = driver.compiler_version(target)
    extra = targets.module_flags(request.stablehlo, target.compiler)
    compiler_config = options.compiler_config(keep_f64=request.keep_f64, dialect=request.dialect)
    if extra:
        compiler_config = {**compiler_config, "flags": [*compiler_config["flags"], *extra]}
    # The module's calling convention (output storage, resident parameters) is part of the key
    # that TORCH_NEURONX_NEFF_KEY_FROM_HLO=0 selects, as the HLO holds it for the default key: an
    # eager op's two NEFFs had one key, and the second call got the first's NEFF.
    convention = {k: v for k, v in request.signature.items() if k not in ("inputs", "outputs")}
    graph_repr = request.base_repr + (f"\n{json.dumps(convention, sort_keys=True)}" if convention else "")
    key = keys.cache_key(hlo=request.stablehlo, graph_repr=graph_repr,
                         input_specs=request.signature["inputs"],
                         compiler_config=compiler_config,
                         compiler_version=version, graph_id=request.graph_name)

    def compile_fn() -> bytes:
        job = driver.CompileJob(stablehlo=request.stablehlo, target=target,
                                flags=tuple(compiler_config["flags"]),  # the key's flags, extra ones included
                                key=key.digest, graph_name=request.graph_name,
                                signature=request.signature, preserve=options.preserve_artifacts)
        with observe.stage("compiler.compile", graph=request.graph_name):
            data = driver.compile_neff(job)
        observe.sample("neff.size", len(data))
        return data

    observe.note("neff_key", key.digest)
    with observe.stage("pipeline.neff", graph=request.graph_name):
        return store.neff_cache().get_or_compile(key, compile_fn)
