"""Resident parameters: inference graphs bind their weights once and rebind when they change."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest
import torch
import torch.nn as nn
from compare import last_compiled_graph

from torch_neuronx import metrics
from torch_neuronx.compiler import driver, resident, targets
from torch_neuronx.compiler.errors import NeuronCompileError

_MODULE = """module {
  func.func @main(%arg0: tensor<4x3xf32>, %arg1: tensor<4xf32>, %arg2: tensor<2x3xf32>) -> tensor<2x4xf32> {
    %0 = stablehlo.dot_general %arg2, %arg0, contracting_dims = [1] x [1]
      : (tensor<2x3xf32>, tensor<4x3xf32>) -> tensor<2x4xf32>
    return %0 : tensor<2x4xf32>
  }
}
"""


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8)).eval()


def test_rewrite_turns_chosen_arguments_into_parameter_globals():
    text = resident.bind_parameters(_MODULE, [0, 1])
    assert ('util.global private @__neuron_input0 = #stream.parameter.named<"neuron"::"input0"> '
            ": tensor<4x3xf32>") in text
    assert "@__neuron_input1" in text and "@__neuron_input2" not in text
    assert "func.func @main(%arg2: tensor<2x3xf32>) -> tensor<2x4xf32> {" in text
    assert "%arg0 = util.global.load @__neuron_input0 : tensor<4x3xf32>" in text
    assert text.index("util.global private") < text.index("func.func @main")


@pytest.mark.parametrize("text, indices", [
    (_MODULE.replace("%arg1: tensor<4xf32>", "%arg1: tensor<4xf32> {jax.arg = 1}"), [0]),  # attributes
    (_MODULE.replace("}\n}\n", "}\n  func.func @main(%arg0: tensor<f32>) -> tensor<f32> {\n  }\n}\n"), [0]),
    (_MODULE, [3]),  # no such input
    (_MODULE, []),
])
def test_rewrite_declines_modules_it_does_not_know(text, indices):
    assert resident.bind_parameters(text, indices) is None


def test_inference_graph_binds_parameters_once_and_matches_eager():
    model, x = _mlp(), torch.randn(4, 16)
    compiled = torch.compile(model, backend="neuron")
    with torch.no_grad():
        before = metrics.counter("parameter_bindings")
        for _ in range(3):
            torch.testing.assert_close(compiled(x), model(x))
        assert metrics.counter("parameter_bindings") == before + 1
    executable = last_compiled_graph()._executable
    signature = executable.neff.header.signature
    assert len(signature["resident"]) == 4  # two weights, two biases; x stays an argument
    assert [bool(spec.get("resident")) for spec in signature["inputs"]].count(False) == 1


def test_in_place_update_and_new_parameter_are_seen():
    model, x = _mlp(), torch.randn(4, 16)
    compiled = torch.compile(model, backend="neuron")
    with torch.no_grad():
        compiled(x)
        model[0].weight.mul_(-2.0)  # in place: the version counter moves
        torch.testing.assert_close(compiled(x), model(x))
        model[2].bias.copy_(torch.arange(8.0))
        torch.testing.assert_close(compiled(x), model(x))
        model[0].weight = nn.Parameter(torch.randn(32, 16))  # another tensor
        torch.testing.assert_close(compiled(x), model(x))
        model[0].weight.data = torch.randn(32, 16)  # other memory under the same Parameter
        torch.testing.assert_close(compiled(x), model(x))


@pytest.mark.parametrize("write", [
    lambda p: p.data.mul_(2.0),
    lambda p: p.data.copy_(torch.randn(p.shape)),
    lambda p: p.data[:1].fill_(3.0),
    lambda p: p.data.view(-1).add_(1.0),
], ids=["mul", "copy", "slice", "view"])
def test_writes_through_data_are_seen(write):
    """``p.data`` has a version counter of its own: ``p.data.mul_(2)`` (EMA updates, weight
    hot-swaps, older loaders) changed the weights unseen and the graph kept the old ones."""
    model, x = _mlp(), torch.randn(4, 16)
    compiled = torch.compile(model, backend="neuron")
    with torch.no_grad():
        compiled(x)
        for p in (model[0].weight, model[2].bias):
            write(p)
            torch.testing.assert_close(compiled(x), model(x))


def test_a_kept_data_alias_written_later_is_seen_and_temporary_ones_cost_one_binding():
    """An alias kept in a variable may be written at any call: while it lives, each call binds
    (then the graph takes its weights as arguments); one used and dropped (initialization,
    logging) costs one binding, and the graph stays resident."""
    model, x = _mlp(), torch.randn(4, 16)
    model[0].weight.data.normal_(0.0, 0.02)  # initialization code, before compiling
    compiled = torch.compile(model, backend="neuron")
    with torch.no_grad():
        compiled(x)
        before = metrics.counter("parameter_bindings")
        for _ in range(3):
            compiled(x)
        assert metrics.counter("parameter_bindings") == before  # compiling kept no alias
        float(model[2].weight.data.norm())  # logging: a temporary alias
        for _ in range(3):
            torch.testing.assert_close(compiled(x), model(x))
        assert metrics.counter("parameter_bindings") == before + 1
        kept = model[2].weight.data
        for step in range(6):
            kept.add_(0.5)
            torch.testing.assert_close(compiled(x), model(x), msg=f"step {step}")
        import copy
        import pickle
        pickle.dumps(model)  # the parameters carry nothing of this bookkeeping
        copy.deepcopy(model)


def test_training_step_then_eval_rebinds_updated_weights():
    model, x = _mlp(), torch.randn(4, 16)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    compiled = torch.compile(model, backend="neuron")
    for _ in range(2):
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), model(x))
        model.train()
        compiled(x).square().sum().backward()
        optimizer.step()
        optimizer.zero_grad()
        model.eval()
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))


def test_compiled_updates_of_neuron_parameters_are_seen():
    """Parameters on neuron updated in place by a compiled function (an optimizer step, a whole
    train step): aot_autograd copies the update back through a detached alias, whose inner tensor
    had a version counter of its own, so a compiled inference graph kept serving the old weights."""
    model = _mlp().to("neuron")
    x = torch.randn(4, 16).to("neuron")
    compiled = torch.compile(model, backend="neuron")

    @torch.compile(backend="neuron")
    def bump():
        for p in model.parameters():
            p.add_(0.25)

    for _ in range(3):
        with torch.no_grad():
            torch.testing.assert_close(compiled(x).cpu(), model(x).cpu())
            bump()


def test_parameters_made_in_inference_mode_stay_correct():
    with torch.inference_mode():
        model = _mlp()
    x = torch.randn(4, 16)
    compiled = torch.compile(model, backend="neuron")
    with torch.inference_mode():
        torch.testing.assert_close(compiled(x), model(x))
        model[0].weight.add_(1.0)  # inference tensors have no version counter: bound every call
        torch.testing.assert_close(compiled(x), model(x))


def test_disabled_by_variable(monkeypatch):
    monkeypatch.setenv("TORCH_NEURONX_RESIDENT_PARAMETERS", "0")
    model, x = _mlp(), torch.randn(4, 16)
    compiled = torch.compile(model, backend="neuron")
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
    assert "resident" not in last_compiled_graph()._executable.neff.header.signature


def test_misaligned_parameter_is_bound_from_an_aligned_copy():
    model, x = _mlp(), torch.randn(4, 16)
    storage = torch.empty(32 * 16 + 1)
    model[0].weight = nn.Parameter(storage[1:].view(32, 16))  # 4 bytes off the allocation's start
    model[0].weight.data.copy_(torch.randn(32, 16))
    compiled = torch.compile(model, backend="neuron")
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
        model[0].weight.mul_(3.0)
        torch.testing.assert_close(compiled(x), model(x))


def test_driver_retries_with_the_targets_fallback_flags(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_NEURONX_DEBUG_DIR", str(tmp_path))
    monkeypatch.setenv("TORCH_NEURONX_PRESERVE_COMPILATION_ARTIFACTS", "1")
    cpu = targets.resolve("cpu")
    target = dataclasses.replace(cpu, flag_fallbacks=(("--not-an-iree-flag", "--iree-opt-level=O1"),))
    flags = (*cpu.flags, "--not-an-iree-flag")
    job = driver.CompileJob(stablehlo=_MODULE, target=target, flags=flags, key="f" * 64, graph_name="retry")
    driver.compile_neff(job)
    workdir = driver.work_dir(job.key)
    with open(os.path.join(workdir, "compiler_args.txt")) as f:
        lines = f.read().splitlines()
    assert len(lines) == 2 and "--not-an-iree-flag" in lines[0] and "--not-an-iree-flag" not in lines[1]
    with open(os.path.join(workdir, "metadata.txt")) as f:
        assert "--iree-opt-level=O1" in json.load(f)["flags"]
    # Without a fallback for the rejected flag, the error is the compiler's.
    with pytest.raises(NeuronCompileError, match="compile stage"):
        driver.compile_neff(dataclasses.replace(job, target=cpu))


def test_weights_changing_between_every_call_switch_to_arguments():
    model, x = _mlp(), torch.randn(4, 16)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    compiled = torch.compile(model, backend="neuron")
    before = metrics.counter("volatile_parameter_graphs")
    for _ in range(6):  # inference between training steps: the weights differ at every call
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), model(x))
        optimizer.zero_grad()
        model(x).sum().backward()  # eager training step
        optimizer.step()
    assert metrics.counter("volatile_parameter_graphs") == before + 1
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
    assert "resident" not in last_compiled_graph()._executable.neff.header.signature


def test_weights_stable_over_several_calls_stay_resident():
    model, x = _mlp(), torch.randn(4, 16)
    compiled = torch.compile(model, backend="neuron")
    before = metrics.counter("volatile_parameter_graphs")
    with torch.no_grad():
        for _ in range(5):
            for _ in range(3):
                torch.testing.assert_close(compiled(x), model(x))
            model[0].bias.add_(0.5)
    assert metrics.counter("volatile_parameter_graphs") == before
    assert "resident" in last_compiled_graph()._executable.neff.header.signature


def test_threads_share_one_binding_and_see_updates():
    import threading

    model, x = _mlp(), torch.randn(4, 16)
    compiled = torch.compile(model, backend="neuron")
    errors: list[BaseException] = []
    barrier = threading.Barrier(4)

    def worker() -> None:
        try:
            barrier.wait()
            with torch.no_grad():
                for _ in range(20):
                    torch.testing.assert_close(compiled(x), expected)
        except BaseException as exc:  # noqa: BLE001 (reported by the main thread)
            errors.append(exc)

    with torch.no_grad():
        compiled(x)  # compiled and bound once, before the threads
    for step in range(2):
        with torch.no_grad():
            if step:
                model[0].weight.mul_(0.5)  # between rounds: every thread must see it
            expected = model(x)
        before = metrics.counter("parameter_bindings")
        threads = [threading.Thread(target=worker) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors[0]
        assert metrics.counter("parameter_bindings") == before + step  # round 1 binds once, for all threads
    assert "resident" in last_compiled_graph()._executable.neff.header.signature


def test_bindings_beyond_the_byte_budget_release_the_least_recently_used(monkeypatch):
    from torch_neuronx.runtime.executable import bindings

    torch.manual_seed(0)
    models = [nn.Sequential(nn.Linear(16, width), nn.ReLU(), nn.Linear(width, 8)).eval() for width in (30, 31, 32)]
    sizes = [sum(p.numel() * p.element_size() for p in m.parameters()) for m in models]
    budget = sizes[0] + sizes[1]  # any two bindings fit, never three
    monkeypatch.setenv("TORCH_NEURONX_RESIDENT_PARAMETERS_BYTES", str(budget))
    x = torch.randn(4, 16)
    compiled = [torch.compile(m, backend="neuron") for m in models]
    before = metrics.counter("parameter_releases")
    with torch.no_grad():
        for _ in range(2):
            for model, fn in zip(models, compiled):  # three graphs, room for two bindings
                torch.testing.assert_close(fn(x), model(x))
                assert bindings.held_bytes() <= budget
    assert metrics.counter("parameter_releases") - before >= 3
