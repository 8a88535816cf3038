"""From StableHLO to a verified NEFF: cache key, cache lookup, compiler driver on a miss.

This is the single entry point both the torch.compile path and (later) the
eager per-op path use to obtain NEFFs.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from torch_neuronx.compiler import driver, neff
from torch_neuronx.compiler.options import CompileOptions
from torch_neuronx.compiler.targets import Target


@dataclasses.dataclass(frozen=True)
class NeffRequest:
    """One graph to obtain a NEFF for."""

    stablehlo: str
    options: CompileOptions
    target: Target
    graph_name: str
    base_repr: str  # graph structure, for the in-memory base key (TORCH_NEURONX_NEFF_KEY_FROM_HLO=0)
    signature: dict[str, Any]
    keep_f64: bool = False  # the graph has float64 tensors (see targets.KEEP_F64_FLAGS)


def get_neff(request: NeffRequest) -> neff.Neff:
    """The NEFF for ``request``: from the cache when present, else compiled and stored."""
    from torch_neuronx.cache import keys, store

    compiler_config = request.options.compiler_config(request.target, keep_f64=request.keep_f64)
    version = driver.compiler_version(request.target)
    key = keys.cache_key(hlo=request.stablehlo, graph_repr=request.base_repr,
                         input_specs=request.signature["inputs"], compiler_config=compiler_config,
                         compiler_version=version, graph_id=request.graph_name)

    def compile_fn() -> bytes:
        job = driver.CompileJob(stablehlo=request.stablehlo, target=request.target,
                                flags=tuple(request.options.compiler_flags(request.target,
                                                                           keep_f64=request.keep_f64)),
                                key=key.digest, graph_name=request.graph_name,
                                signature=request.signature)
        return driver.compile_neff(job)

    return store.neff_cache().get_or_compile(key, compile_fn)
