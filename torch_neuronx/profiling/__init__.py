"""The Neuron profiling session behind ``torch.profiler`` (TorchNeuron's ``torch_neuronx.profiling``).

``torch.profiler.profile(activities=[..., ProfilerActivity.PrivateUse1])`` starts a session
(:mod:`.hooks`), configured by a :class:`NeuronConfig` passed as ``experimental_config`` or by the
``TORCH_NEURONX_PROFILE_*`` variables (:mod:`.options`). The session listens to the
instrumentation layer (:mod:`.recorder`) and samples the host (:mod:`.samplers`), writes one
Chrome-trace file per mode (:mod:`.session`, :mod:`.chrome`, :mod:`.device`) and merges its
events into torch's own traces; ``on_trace_ready=NeuronProfiler(cfg).export_trace``
(:mod:`.profiler`) writes ``trace.json`` beside them. :mod:`.validate` checks trace files;
``python -m torch_neuronx.profiling summarize DIR`` (:mod:`.summary`) reports on them.

Nothing below imports this package: it is a listener of :mod:`torch_neuronx.observe`.
"""

from torch_neuronx.profiling.hooks import install
from torch_neuronx.profiling.options import NeuronConfig, ProfileMode
from torch_neuronx.profiling.profiler import NeuronProfiler

__all__ = ["NeuronConfig", "NeuronProfiler", "ProfileMode", "install"]
