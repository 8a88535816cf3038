"""nn.LSTM / nn.GRU / nn.RNN on the eager device as one kernel per layer stack, each way.

The composite ran one dispatch per time step, layer and gate op (a 2-layer LSTM over 20
steps: some 500 launches and 154 ms a training step against the CPU's 6 ms); from the second
call of a signature the stack runs as ``neuron::recurrent_layers`` and its backward.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode


class _Ops(TorchDispatchMode):
    """The names of the ops dispatched inside the block."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))


_CONFIGS = {
    "lstm 2 layers, initial states": ("LSTM", dict(num_layers=2), 3, True),
    "lstm bidirectional with projections": ("LSTM", dict(bidirectional=True, proj_size=2), 2, False),
    "gru 2 layers batch-first at batch 1": ("GRU", dict(num_layers=2, batch_first=True), 1, True),
    "rnn relu without bias": ("RNN", dict(nonlinearity="relu", bias=False), 2, False),
}


def _step(module, x, h0, opt):
    out, hidden = module(x) if h0 is None else module(x, h0)
    hidden = hidden if isinstance(hidden, tuple) else (hidden,)
    loss = (out * torch.linspace(-1, 1, out.shape[-1], device=out.device)).sum() + sum(h.square().sum() for h in hidden)
    opt.zero_grad()
    loss.backward()
    grads = [p.grad.cpu() for p in module.parameters()]
    opt.step()
    return [out.detach().cpu(), *(h.detach().cpu() for h in hidden)], grads


# Bidirectional LSTM with projections and the batch-first GRU in the slow lane (CI time): the
# 2-layer LSTM with initial states and the bias-free RNN stay, as do GRU gradients
# (test_recurrent_gradients.py) and recurrent layers trained compiled (test_compile_neuron_tensors.py).
_SLOW_CONFIGS = ("lstm bidirectional with projections", "gru 2 layers batch-first at batch 1")


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in _SLOW_CONFIGS else n
                                  for n in _CONFIGS])
def test_training_steps_match_the_cpu_and_run_as_one_op_each_way(name):
    layer, options, batch, with_states = _CONFIGS[name]
    torch.manual_seed(0)
    cpu = getattr(torch.nn, layer)(4, 3, **options)
    device = copy.deepcopy(cpu).to("neuron")
    shape = (batch, 5, 4) if options.get("batch_first") else (5, batch, 4)
    directions = 2 if options.get("bidirectional") else 1
    out_size = options.get("proj_size") or 3
    h0 = [torch.randn(options.get("num_layers", 1) * directions, batch, out_size)] if with_states else None
    if h0 is not None and layer == "LSTM":
        h0.append(torch.randn(options.get("num_layers", 1) * directions, batch, 3))
    cpu_opt = torch.optim.SGD(cpu.parameters(), lr=0.1)
    device_opt = torch.optim.SGD(device.parameters(), lr=0.1)
    for step in range(3):
        x = torch.randn(shape)
        state = None if h0 is None else (tuple(h0) if layer == "LSTM" else h0[0])
        device_state = None if h0 is None else (tuple(h.to("neuron") for h in h0) if layer == "LSTM"
                                                else h0[0].to("neuron"))
        expected = _step(cpu, x, state, cpu_opt)
        with _Ops() as ops:
            got = _step(device, x.to("neuron"), device_state, device_opt)
        for g, e in zip([*got[0], *got[1]], [*expected[0], *expected[1]], strict=True):
            torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)
        fused = "neuron.recurrent_layers.default" in ops.names
        assert fused == (step > 0), ops.names[:20]  # the first call of a signature takes the composite
        if fused:
            assert "neuron.recurrent_layers_backward.default" in ops.names
            assert not any("mm" in n for n in ops.names), ops.names  # no per-step products


def test_dropout_between_layers_in_training_keeps_the_composite():
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(4, 3, num_layers=2, dropout=0.5).to("neuron")
    x = torch.randn(5, 2, 4).to("neuron")
    for _ in range(2):
        with _Ops() as ops:
            out, _ = lstm(x)
        assert "neuron.recurrent_layers.default" not in ops.names
    lstm.eval()  # no dropout in evaluation: the whole-stack op
    with torch.no_grad():
        expected = copy.deepcopy(lstm).cpu()(x.cpu())[0]
        for _ in range(2):
            with _Ops() as ops:
                out, _ = lstm(x)
    assert "neuron.recurrent_layers.default" in ops.names
    torch.testing.assert_close(out.cpu(), expected, rtol=1e-5, atol=1e-6)
