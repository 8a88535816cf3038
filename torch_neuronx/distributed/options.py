"""The distributed variables, read once per process group: streams, host collectives, split
algorithms, all_to_all_v and buckets (the specification's "Distributed" section)."""

from __future__ import annotations

import dataclasses

from torch_neuronx import config

#: Most bytes a split all-gather or reduce-scatter moves per step (each rank's slice of a chunk).
SPLIT_CHUNK_BYTES = 16 << 20


class DistributedConfigError(ValueError):
    """A distributed variable holds a value or combination that cannot work."""


@dataclasses.dataclass(frozen=True)
class Options:
    """What a ``neuron`` process group does, from the environment when it is created."""

    streams: bool  # TORCH_NEURONX_ENABLE_STREAMS
    host_cc: bool  # TORCH_NEURONX_ENABLE_HOST_CC: collectives on the current (non-default) stream
    split_allgather: bool | None  # NEURON_USE_SPLIT_ALLGATHER; None: on for the default stream only
    split_reduce_scatter: bool | None  # NEURON_USE_SPLIT_REDUCE_SCATTER; likewise
    native_alltoallv: bool  # NEURON_USE_NKI_ALLTOALLV
    bucket_bytes: int  # COLLECTIVE_BUCKETSIZE_IN_MB, in bytes

    @classmethod
    def from_environment(cls) -> Options:
        """Read the variables; an impossible combination raises :class:`DistributedConfigError`."""
        streams = bool(config.get("TORCH_NEURONX_ENABLE_STREAMS"))  # strict: neither 0 nor 1 raises
        host_cc = bool(config.get("TORCH_NEURONX_ENABLE_HOST_CC"))
        if host_cc and not streams:
            raise DistributedConfigError(
                "TORCH_NEURONX_ENABLE_HOST_CC=1 requires TORCH_NEURONX_ENABLE_STREAMS=1: collectives on "
                "non-default streams need streams; unset one of them")
        bucket_mb = config.get("COLLECTIVE_BUCKETSIZE_IN_MB")
        if bucket_mb == 0:
            raise DistributedConfigError("COLLECTIVE_BUCKETSIZE_IN_MB must be at least 1")
        return cls(streams=streams, host_cc=host_cc,
                   split_allgather=config.get("NEURON_USE_SPLIT_ALLGATHER"),
                   split_reduce_scatter=config.get("NEURON_USE_SPLIT_REDUCE_SCATTER"),
                   native_alltoallv=bool(config.get("NEURON_USE_NKI_ALLTOALLV")),
                   bucket_bytes=bucket_mb << 20)

    @staticmethod
    def split(setting: bool | None, on_default_stream: bool) -> bool:
        """The documented rule: unset, on for the default stream and off elsewhere; set, as set."""
        return on_default_stream if setting is None else setting
