"""The persistent, content-addressed NEFF and HLO caches.

* :mod:`~torch_neuronx.cache.keys`: cache keys from named components
  (HLO, compiler config, compiler version, NEFF format version).
* :mod:`~torch_neuronx.cache.store`: :class:`~torch_neuronx.cache.store.NeffCache`
  (memory LRU, verified disk entries, per-key locked compiles) and
  :class:`~torch_neuronx.cache.store.HloCache`; ``neff_cache()``/``hlo_cache()``.
* :mod:`~torch_neuronx.cache.locks`: per-key flock locks in the local cache dir.
* :mod:`~torch_neuronx.cache.explain`, :mod:`~torch_neuronx.cache.stats`: why
  lookups missed, and counters, both kept on disk for the CLI
  (``python -m torch_neuronx.cache``).

Typical use by the compiler driver::

    key = keys.neff_key(hlo_text, compiler_config, compiler_version, graph_id=name)
    neff_obj = store.neff_cache().get_or_compile(key, lambda: compile_to_neff_bytes(...))
"""

from torch_neuronx.cache import keys, locks, store

__all__ = ["keys", "locks", "store"]
