"""Eager ops run asynchronously on streams: they return at once, host reads wait, errors surface later."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
import threading
import time
import types

import pytest
import torch

import torch_neuronx  # noqa: F401
from torch_neuronx.device import choice, eager
from torch_neuronx.runtime import streams
from torch_neuronx.runtime.errors import NeuronRuntimeError
from torch_neuronx.runtime.tensor import NeuronTensor, PoisonedTensorError

WAIT = 60.0  # the longest a test waits for queued work


def _warm(*ops):
    for op in ops:
        op().cpu()  # compile each kernel before the gate closes: tracing is synchronous


def test_an_op_returns_its_outputs_before_its_kernel_runs(gated):
    x = torch.arange(6.0).reshape(2, 3).to("neuron")
    _warm(lambda: x * 2 + 1)
    gated.close()
    before = torch.neuron.memory_allocated()
    y = x * 2 + 1  # queued behind the gate: nothing ran yet
    assert type(y) is NeuronTensor and y.shape == (2, 3) and y.dtype == torch.float32
    assert not streams.default_stream().query()
    assert torch.neuron.memory_allocated() > before  # its memory was allocated up front
    gated.set()
    assert torch.equal(y.cpu(), torch.arange(6.0).reshape(2, 3) * 2 + 1)


@pytest.mark.parametrize("read", ["cpu", "item", "repr", "equal", "tolist", "synchronize"])
def test_host_reads_wait_for_the_queued_ops_that_write_their_tensor(gated, read):
    x = torch.arange(4.0).to("neuron")
    _warm(lambda: (x + 1).sum(), lambda: torch.tensor(10.0).to("neuron"))
    gated.close()
    total = (x + 1).sum()
    threading.Timer(0.05, gated.set).start()  # the read below must wait for the gate
    if read == "cpu":
        assert total.cpu().item() == 10.0
    elif read == "item":
        assert total.item() == 10.0
    elif read == "repr":
        assert "10." in repr(total)
    elif read == "equal":
        assert torch.equal(total, torch.tensor(10.0).to("neuron"))
    elif read == "tolist":
        assert total.tolist() == 10.0
    else:
        torch.neuron.synchronize()
        assert streams.default_stream().query()
        assert total._data.item() == 10.0


def test_in_place_ops_and_copies_on_the_device_keep_program_order(gated):
    x = torch.zeros(5).to("neuron")
    y = torch.ones(5).to("neuron")
    _warm(lambda: x.clone().add_(y), lambda: x.clone().mul_(3), lambda: y.to(torch.float64))
    gated.close()
    x.add_(y)
    x.mul_(3)
    y.copy_(x)
    y.add_(1)
    z = y.to(torch.float64)
    gated.set()
    assert torch.equal(x.cpu(), torch.full((5,), 3.0))
    assert torch.equal(z.cpu(), torch.full((5,), 4.0, dtype=torch.float64))


def test_an_op_reads_inputs_written_on_another_stream_after_they_are_written(gated):
    side = torch.neuron.Stream()
    x = torch.arange(3.0).to("neuron")
    _warm(lambda: x * 10, lambda: x + 1)
    gated.close(side)
    with torch.neuron.stream(side):
        produced = x * 10  # queued on the held-back side stream
    consumed = produced + 1  # on the default stream, which does not wait for the side stream
    threading.Timer(0.05, gated.set).start()
    assert torch.equal(consumed.cpu(), torch.tensor([1.0, 11.0, 21.0]))
    side.synchronize()


def test_errors_torch_raises_from_metadata_are_raised_where_the_op_is_called():
    x = torch.ones(3).to("neuron")
    wide = torch.ones(2, 3).to("neuron")
    with pytest.raises(RuntimeError, match=r"output with shape \[3\] doesn't match the broadcast shape \[2, 3\]"):
        x.mul_(wide)
    ints = torch.ones(3, dtype=torch.int64).to("neuron")
    with pytest.raises(RuntimeError, match="result type Float can't be cast to the desired output type Long"):
        ints.add_(torch.ones(3).to("neuron"))
    with pytest.raises(RuntimeError, match="must match the size"):
        x.copy_(torch.ones(4).to("neuron"))
    assert torch.equal(x.cpu(), torch.ones(3)) and torch.equal(ints.cpu(), torch.ones(3, dtype=torch.int64))


def _failing_kernel(key_op: str, shape: tuple, monkeypatch) -> None:
    """Make the compiled kernel of ``key_op`` at ``shape`` fail when it runs (fault injection at the
    runtime boundary: the device rejects the work), with execution errors not falling back."""
    # Every kernel that may serve the call (its own, its family's dynamic one): earlier tests in
    # the process leave others of the op, and the call takes whichever its route names.
    keys = [k for k in eager._kernels if (k[0] == key_op and k[1][0][1] == shape)
            or (k[0] == "dynamic" and k[1] == key_op and len(k[2][0][1]) == len(shape))]
    assert keys, f"no kernel of {key_op} at {shape}"

    class Failing:  # the device rejects the work
        def __call__(self, tensors, outputs=None):
            raise NeuronRuntimeError("injected device fault")

        run_into = __call__

    for key in keys:
        kernel = eager._kernels[key]
        monkeypatch.setitem(eager._kernels, key, types.SimpleNamespace(
            compiled=Failing(), out_spec=kernel.out_spec, metas=kernel.metas, name=kernel.name,
            shapes=kernel.shapes, dtypes=kernel.dtypes, orders=kernel.orders, copies=kernel.copies))
    monkeypatch.setenv("TORCH_NEURONX_FALLBACK_ONLY_FOR_UNIMPLEMENTED_OPS", "1")
    # a shape served by its family's dynamic kernel for 2 s gets its own kernel, not the failing one
    # (a loaded machine's full run took that long between the warm-up and the failing call)
    monkeypatch.setattr(choice, "PROMOTE_AFTER_S", float("inf"))


def test_a_failed_queued_op_surfaces_at_the_next_synchronization_and_poisons_what_it_wrote(monkeypatch):
    x = torch.full((7,), 2.0).to("neuron")
    (x - 0.5).cpu()
    (x * 4).cpu()
    _failing_kernel("aten.sub.Tensor", (7,), monkeypatch)
    bad = x - 0.5  # returns: the failure happens when the kernel runs
    later = bad * 4  # reads the failed op's output: fails too, without running
    fine = x * 4
    with pytest.raises(NeuronRuntimeError, match=r"aten.sub.Tensor failed on neuron:0: .*injected device fault"):
        torch.neuron.synchronize()
    torch.neuron.synchronize()  # reported once
    assert torch.equal(fine.cpu(), torch.full((7,), 8.0))  # unrelated work is unaffected
    with pytest.raises(PoisonedTensorError, match="aten.sub.Tensor failed"):
        bad.cpu()
    with pytest.raises(PoisonedTensorError, match="aten.mul.Tensor did not run: an input's producing op failed"):
        later.cpu()


def test_ops_behind_a_failed_op_name_the_first_failure_and_only_it_is_logged(monkeypatch, caplog):
    """A chain of ops behind one failure logged an ERROR each, each nesting the whole chain before
    it (60 ops: 137 KB of log): now the root is logged once, and each op that did not run names it."""
    x = torch.full((7,), 2.0).to("neuron")
    (x - 0.5).cpu()
    (x * 4).cpu()
    _failing_kernel("aten.sub.Tensor", (7,), monkeypatch)
    y = x - 0.5
    for _ in range(20):
        y = y * 4
    with caplog.at_level(logging.ERROR, logger="torch_neuronx"):
        with pytest.raises(NeuronRuntimeError, match="aten.sub.Tensor failed"):
            torch.neuron.synchronize()
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "aten.sub.Tensor failed" in errors[0].getMessage(), errors
    with pytest.raises(PoisonedTensorError) as info:
        y.cpu()
    message = str(info.value)
    assert "aten.mul.Tensor did not run: an input's producing op failed" in message
    assert message.count("did not run") == 1 and message.count("aten.sub.Tensor failed") == 1, message


_CHILD = """
import os, types, torch, torch_neuronx
from torch_neuronx.device import eager
from torch_neuronx.runtime.errors import NeuronRuntimeError
x = torch.full((9,), 2.0).to("neuron")
(x - 0.5).cpu()
key = next(k for k in eager._kernels if "aten.sub.Tensor" in k[:2])
kernel = eager._kernels[key]
class Failing:
    def __call__(self, tensors, outputs=None):
        raise NeuronRuntimeError("injected device fault")
    run_into = __call__
eager._kernels[key] = types.SimpleNamespace(compiled=Failing(), out_spec=kernel.out_spec, metas=kernel.metas,
                                            name=kernel.name, shapes=kernel.shapes, dtypes=kernel.dtypes,
                                            orders=kernel.orders, copies=kernel.copies)
def users_training_step():
    return x - 0.5  # THE FAILING LINE
try:
    out = users_training_step()
    print("RETURNED")
    out.cpu()
except NeuronRuntimeError as e:
    print("RAISED", type(e).__name__)
    print(e)
"""


def _child(script, env: dict[str, str]) -> str:
    full = {**os.environ, "TORCH_NEURONX_FALLBACK_ONLY_FOR_UNIMPLEMENTED_OPS": "1", **env}
    done = subprocess.run([sys.executable, str(script)], env=full, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_launch_blocking_raises_at_the_op_and_stack_traces_name_the_users_line(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(_CHILD))
    blocking = _child(script, {"NEURON_LAUNCH_BLOCKING": "1"})
    assert "RETURNED" not in blocking and "RAISED QueuedOpError" in blocking, blocking
    assert "NEURON_LAUNCH_BLOCKING=1 to raise" not in blocking  # it is set: no advice to set it
    queued = _child(script, {"TORCH_NEURONX_ENABLE_STACK_TRACE": "1"})
    assert "RETURNED" in queued and "injected device fault" in queued, queued
    assert "users_training_step" in queued and "THE FAILING LINE" in queued, queued
    plain = _child(script, {})
    assert "RETURNED" in plain and "THE FAILING LINE" not in plain
    assert "TORCH_NEURONX_ENABLE_STACK_TRACE=1" in plain  # says how to find the line


def test_a_training_loop_runs_ahead_of_its_kernels_and_matches_the_cpu():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    reference = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    reference.load_state_dict(model.state_dict())
    model.to("neuron")
    data, target = torch.randn(32, 8), torch.randn(32, 1)
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9) for m in (model, reference)]
    losses = []
    for _ in range(6):
        for m, opt, where in ((model, optimizers[0], "neuron"), (reference, optimizers[1], "cpu")):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(m(data.to(where)), target.to(where))
            loss.backward()
            opt.step()
            losses.append(loss)
    start = time.monotonic()
    pairs = [(a.item(), b.item()) for a, b in zip(losses[::2], losses[1::2])]
    assert time.monotonic() - start < WAIT
    for got, want in pairs:
        assert got == pytest.approx(want, rel=1e-4, abs=1e-5)
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.cpu(), q.detach(), rtol=1e-4, atol=1e-5)


def test_record_stream_keeps_a_freed_tensors_block_from_reuse_until_the_stream_passes(gated):
    import gc

    side = torch.neuron.Stream()
    x = torch.empty(4096, device="neuron")
    held = _span(x)
    gated.close(side)
    x.record_stream(side)
    del x
    gc.collect()
    while_held = torch.empty(4096, device="neuron")
    assert not _overlap(_span(while_held), held)  # the side stream may still read it
    gated.set()
    side.synchronize()
    del while_held
    gc.collect()
    # Once the stream passed, the block is free again. It may have merged with a free neighbour
    # left by earlier tests, and other free blocks may fit as well, so new tensors are taken until
    # one lies on it (the allocator never grows while a fitting free block exists).
    reused = []
    for _ in range(64):
        reused.append(torch.empty(4096, device="neuron"))
        if _overlap(_span(reused[-1]), held):
            break
    assert _overlap(_span(reused[-1]), held)
    with pytest.raises(TypeError, match="takes a torch.neuron.Stream"):
        reused[0].record_stream(object())


def _span(t: torch.Tensor) -> tuple[int, int]:
    return t._allocation.address, t._allocation.address + t._allocation.nbytes


def _overlap(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def test_a_forked_child_runs_eager_ops_after_the_parent_queued_some():
    import multiprocessing

    x = torch.arange(4.0).to("neuron")
    (x * 2).cpu()
    y = x * 2  # the parent's worker thread exists now (it idles for a few seconds)
    context = multiprocessing.get_context("fork")
    with context.Pool(1) as pool:
        result = pool.apply_async(_double_in_child)
        assert result.get(timeout=WAIT) == [0.0, 2.0, 4.0, 6.0]
    assert y.tolist() == [0.0, 2.0, 4.0, 6.0]


def test_a_forked_child_reads_the_values_of_kernels_the_parent_had_queued():
    """A child forked right after eager ops were queued (DataLoader workers over a dataset just
    made on the device) read their outputs as zeros or an earlier allocation's bytes, silently:
    the fork now waits for the queued work. Kernels on a side stream too."""
    import multiprocessing

    side = torch.neuron.Stream()
    for _ in range(3):  # the race is the parent's: one fork in two or more read stale memory
        a = torch.randn(1024, 1024, device="neuron") / 32
        a.cpu()
        outputs = [a @ a]  # the worker is busy with it while the small ops below queue behind it
        outputs += [torch.arange(40, device="neuron").float() * (i + 1) for i in range(8)]
        with torch.neuron.stream(side):
            outputs.append(a @ a + 1)
        _inherited[:] = outputs  # the child reads them from its copy of memory (not pickled over a pipe)
        context = multiprocessing.get_context("fork")
        with context.Pool(1) as pool:
            seen = pool.apply_async(_sums_in_child).get(timeout=WAIT)
        _inherited.clear()
        expected = [float(t.cpu().double().sum()) for t in outputs]
        assert seen == pytest.approx(expected, rel=1e-9), (seen, expected)


def test_a_script_that_ends_with_work_queued_exits_cleanly(tmp_path):
    """The interpreter's finalization tore down a stream worker inside the runtime's native code:
    the process aborted ("terminate called after throwing an instance of ''", exit 134). The
    queued work now runs first."""
    script = tmp_path / "ends_queued.py"
    script.write_text(textwrap.dedent("""
        import torch
        a = torch.randn(512, 512, device="neuron")
        side = torch.neuron.Stream()
        with torch.neuron.stream(side):
            for _ in range(6):
                q = a @ a
        for _ in range(6):
            r = a @ a
    """))
    for _ in range(2):
        done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0 and "terminate" not in done.stderr, done.stderr[-2000:]


_inherited: list[torch.Tensor] = []


def _sums_in_child() -> list[float]:
    # The child's view of the memory, read with numpy: torch's own CPU kernels in a child forked
    # after the parent ran parallel ones wait for OpenMP threads that are not there (plain torch too;
    # DataLoader workers set one thread for that).
    return [float(t._data.numpy().astype("float64").sum()) for t in _inherited]


def _double_in_child() -> list[float]:
    return (torch.arange(4.0).to("neuron") * 2).tolist()


def test_small_ops_on_an_idle_stream_complete_before_they_return_and_large_ones_are_queued():
    """A kernel whose inputs and outputs are small runs in the issuing thread when its stream is
    idle (handing it to the worker costs more than running it); one reading a tensor another
    stream still writes, or a large one, goes to the stream's worker."""
    from torch_neuronx.device import queued

    x = torch.arange(8.0).to("neuron")
    (x + 1).cpu()
    torch.neuron.synchronize()
    y = x + 1
    assert streams.default_stream().query() and y._allocation.writer is None
    assert torch.equal(y.cpu(), torch.arange(8.0) + 1)
    small, large = torch.empty(16, device="neuron"), torch.empty(queued.INLINE_BYTES // 4 + 1, device="neuron")
    queue = streams.default_stream()._queue
    assert queued._small([small], [small._allocation], queued._writers_elsewhere([small], queue))
    assert not queued._small([large], [large._allocation], queued._writers_elsewhere([large], queue))
    side = streams.Stream()
    gate = threading.Event()
    side.submit(gate.wait, WAIT)
    with torch.neuron.stream(side):
        written = x * 3  # queued on the side stream, behind the gate
    assert not queued._small([written], [small._allocation], queued._writers_elsewhere([written], queue))
    gate.set()
    torch.neuron.synchronize()


class _OnDevice(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 6

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.arange(4.0, device="neuron") + i, torch.tensor(i, device="neuron")


def test_a_dataloaders_workers_collate_neuron_tensors():
    """``DataLoader(num_workers=2)`` over a dataset of neuron tensors: the default collate, in a
    worker, stacked into shared memory through ``elem.new(storage)`` (PyTorch's "INTERNAL ASSERT
    FAILED ... python_dispatch.cpp"); batches are stacked on the device and come back as values."""
    loader = torch.utils.data.DataLoader(_OnDevice(), batch_size=2, num_workers=2,
                                         multiprocessing_context="fork", timeout=WAIT)
    batches = list(loader)
    assert [b[1].tolist() for b in batches] == [[0, 1], [2, 3], [4, 5]]
    for i, (values, _) in enumerate(batches):
        assert values.device.type == "neuron"
        assert values.tolist() == [[2.0 * i + j + k for k in range(4)] for j in range(2)]


def test_sharing_neuron_memory_between_processes_is_refused():
    """``share_memory_()`` / ``Module.share_memory()`` succeeded and ``is_shared()`` said True, but
    another process's updates never came back (a copy of the values crosses): Hogwild-style
    training silently trained copies. Refused with a message that says what to share instead."""
    t = torch.zeros(3, device="neuron")
    assert not t.is_shared()
    with pytest.raises(RuntimeError, match="cannot be shared between processes"):
        t.share_memory_()
    with pytest.raises(RuntimeError, match="cannot be shared between processes"):
        torch.nn.Linear(2, 1).to("neuron").share_memory()
    assert torch.nn.Linear(2, 1).share_memory().weight.is_shared()  # host tensors as before
