"""Our Neuron Runtime: device objects, neuron tensors, NEFF executables on IREE, streams."""
