"""The torch.compile frontend: the ``neuron`` backend Dynamo calls, aot_autograd's hooks, warm starts."""
