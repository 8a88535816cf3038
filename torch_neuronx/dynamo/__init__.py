"""The torch.compile frontend: the ``neuron`` backend Dynamo calls, aot_autograd's hooks, warm starts."""

from torch_neuronx.pipeline.graph import CompiledGraph

# Dynamo is imported with this frontend (never by the eager device's import): from now on it
# must not trace a compiled graph's call (a backward run inside a compiled function's graph break).
CompiledGraph.hide_from_dynamo()
