"""The version of torch_neuronx (in every cache key that names the toolchain)."""

__version__ = "0.1.0"
