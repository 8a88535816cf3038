"""Storage of neuron tensors shrinks to 0 bytes and grows back (FSDP2's reshard), views following."""

from __future__ import annotations

import gc
import warnings

import pytest
import torch
from torch import nn
from torch.distributed.fsdp._fully_shard import _fsdp_collectives  # noqa: F401  (defines torch.ops.fsdp.*)
from torch.distributed.fsdp._fully_shard._fsdp_param import alloc_storage, free_storage

import torch_neuronx  # noqa: F401
from torch_neuronx.memory import device_allocator


@pytest.fixture(autouse=True)
def _quiet_fallbacks():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # CPU fallbacks of out= ops (fsdp.split_with_sizes_copy)
        yield


def _allocated() -> int:
    gc.collect()
    torch.neuron.synchronize()
    return torch.neuron.memory_allocated()


def test_resize_to_zero_frees_and_resize_back_allocates_with_one_shared_storage():
    t = torch.arange(256.0, device="neuron")
    view = t.view(16, 16)[2:]
    storage = t.untyped_storage()
    assert storage is view.untyped_storage() and storage._cdata == view.untyped_storage()._cdata
    assert storage.device == torch.device("neuron", 0)
    assert storage.size() == storage.nbytes() == 1024
    assert storage.data_ptr() == t.data_ptr() != 0
    assert view.data_ptr() == t.data_ptr() + 32 * 4

    before = _allocated()
    assert storage.resize_(0) is storage
    assert before - _allocated() == 1024
    assert view.untyped_storage().size() == 0 and storage.data_ptr() == 0 and t.data_ptr() == 0
    assert t.shape == (256,) and view.shape == (14, 16)  # the tensors keep their metadata

    storage.resize_(1024)
    assert _allocated() == before
    assert storage.size() == 1024 and storage.data_ptr() == t.data_ptr() != 0
    assert view.data_ptr() == t.data_ptr() + 32 * 4


@pytest.mark.parametrize("how", ["copy_", "foreach", "fsdp.copy_", "from_host", "inductor"])
def test_values_written_after_regrowth_are_read_through_the_tensor_and_its_views(how):
    t = torch.zeros(4, 6, device="neuron")
    views = [t[1:], t.t(), t.view(-1)[5:17].view(3, 4), t.view(torch.int32)]
    if how == "inductor":
        torch.ops.inductor.resize_storage_bytes_(t, 0)
        assert t.untyped_storage().size() == 0
        torch.ops.inductor.resize_storage_bytes_(t, 96)
    else:
        t.untyped_storage().resize_(0)
        torch.empty(24, device="neuron").fill_(-7.0)  # may take the freed block: its values must not show
        t.untyped_storage().resize_(96)
    want = torch.arange(24.0).view(4, 6) * 3 + 1
    source = want.to("neuron")
    if how == "copy_":
        t.copy_(source)
    elif how == "foreach":
        torch._foreach_copy_([t], [source])
    elif how == "fsdp.copy_":
        assert torch.ops.fsdp.copy_(t, source) is None
    else:
        t.copy_(want)
    torch.testing.assert_close(t.cpu(), want)
    torch.testing.assert_close(views[0].cpu(), want[1:])
    torch.testing.assert_close(views[1].cpu(), want.t())
    torch.testing.assert_close(views[2].cpu(), want.view(-1)[5:17].view(3, 4))
    torch.testing.assert_close(views[3].cpu(), want.view(torch.int32))
    torch.testing.assert_close((views[1] * 2).cpu(), want.t() * 2)  # a compiled op on a view


def test_growing_keeps_the_leading_bytes_and_same_size_is_a_no_op():
    t = torch.arange(8.0, device="neuron")
    storage = t.untyped_storage()
    address = storage.data_ptr()
    storage.resize_(32)
    assert storage.data_ptr() == address
    storage.resize_(64)
    torch.testing.assert_close(t.cpu(), torch.arange(8.0))  # as CUDA's resize_: the old bytes first
    storage.resize_(16)  # too small for ``t``: it holds no values now
    assert t.untyped_storage().size() == 16


def test_queued_work_on_the_old_memory_finishes_before_its_block_is_freed(gated):
    x = torch.arange(4096.0, device="neuron")
    (x * 2).cpu()  # compiled before the gate closes: tracing is synchronous
    before = _allocated()
    gated.close()
    y = x * 2  # queued behind the gate: it reads x's memory later
    held = torch.neuron.memory_allocated()
    x.untyped_storage().resize_(0)
    assert torch.neuron.memory_allocated() == held  # the queued op still holds the block
    scribble = [torch.full((4096,), -1.0, device="neuron") for _ in range(2)]  # must not get x's block
    gated.set()
    torch.testing.assert_close(y.cpu(), torch.arange(4096.0) * 2)
    del y, scribble
    assert _allocated() == before - 16384  # given back once the op ran


def test_record_stream_keeps_a_resized_blocks_memory_until_the_stream_passes(gated):
    side = torch.neuron.Stream()
    x = torch.empty(4096, device="neuron")
    address = x.data_ptr()
    gated.close(side)
    x.record_stream(side)
    x.untyped_storage().resize_(0)
    gc.collect()
    while_held = torch.empty(4096, device="neuron")
    assert while_held.data_ptr() != address  # the side stream may still read it
    gated.set()
    side.synchronize()


def test_errors_are_clear():
    t = torch.ones(8, device="neuron")
    storage = t.untyped_storage()
    with pytest.raises(RuntimeError, match="at least 0 bytes"):
        storage.resize_(-1)
    with pytest.raises(TypeError, match="expects an int"):
        storage.resize_(1.5)
    t[2:].untyped_storage().resize_(0)  # a view's storage is the tensor's: allowed, as on CUDA
    assert storage.size() == 0
    with pytest.raises(RuntimeError, match="resized to 0 bytes"):
        t[2:].cpu()
    with pytest.raises(RuntimeError, match="resized to 0 bytes"):
        t.copy_(torch.zeros(8))
    assert "storage resized to 0 bytes" in repr(t)
    orphan = torch.ones(4, device="neuron").untyped_storage()
    torch.neuron.synchronize()
    gc.collect()
    with pytest.raises(RuntimeError, match="no longer exist"):
        orphan.resize_(0)


@pytest.mark.parametrize("how", ["eager", "compiled"])
def test_an_fsdp2_reshard_and_unshard_sequence_computes_the_right_values(how):
    """FSDP2's own ``free_storage`` / ``alloc_storage`` and all-gather copy-out on one rank. A
    compiled graph saves the parameter's inner tensor for its backward: the resizes moved that
    tensor's version counter ("modified by an inplace operation ... is at version 2")."""
    torch.manual_seed(0)
    w1, w2, x_cpu = torch.randn(3, 4), torch.randn(3, 4), torch.randn(2, 4)
    all_gather_output = torch.empty(12, device="neuron")

    def copy_out(values: torch.Tensor) -> None:  # foreach_all_gather_copy_out, world size 1
        alloc_storage(all_gather_output)
        with torch.autograd._unsafe_preserve_version_counter((all_gather_output,)):
            torch.ops.fsdp.split_with_sizes_copy(values.to("neuron").view(1, -1), [12], dim=1,
                                                 out=[all_gather_output.view(1, -1)])

    copy_out(w1)
    param = nn.Parameter(torch.as_strided(all_gather_output, (3, 4), (4, 1), storage_offset=0))
    x = x_cpu.to("neuron").requires_grad_()
    def forward(x: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
        return (x @ param.t()).sin().sum()  # autograd saves x and the parameter

    loss = (torch.compile(forward, backend="neuron") if how == "compiled" else forward)(x, param)
    before = _allocated()
    free_storage(all_gather_output)  # reshard after forward
    assert how == "compiled" or before - _allocated() == device_allocator(0).round_size(48)
    assert all_gather_output.untyped_storage().size() == 0
    torch.empty(12, device="neuron").fill_(99.0)  # reuses the freed block
    copy_out(w2)  # unshard before backward: other values, so that stale memory would show
    assert all_gather_output.untyped_storage().size() == 48
    loss.backward()

    cos = torch.cos(x_cpu @ w1.t())
    torch.testing.assert_close(x.grad.cpu(), cos @ w2, rtol=1e-5, atol=1e-5)  # read through the saved param
    torch.testing.assert_close(param.grad.cpu(), cos.t() @ x_cpu, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close((x @ param.t()).cpu(), x_cpu @ w2.t(), rtol=1e-5, atol=1e-5)


def test_parameters_moved_by_module_to_and_in_place_views_follow_a_resize():
    model = nn.Linear(4, 3).to("neuron")  # torch.utils.swap_tensors: our tensors carry no weak references
    weight = model.weight
    flipped = weight.detach()
    flipped.t_()  # an in-place view: a new inner tensor over the same memory
    with torch.inference_mode():
        frozen = torch.zeros(8, device="neuron")  # inner tensors of inference tensors are repointed too
    frozen.untyped_storage().resize_(0)
    frozen.untyped_storage().resize_(32)
    with torch.inference_mode():
        frozen.copy_(torch.arange(8.0))
    torch.testing.assert_close(frozen.cpu(), torch.arange(8.0))
    weight.untyped_storage().resize_(0)
    weight.untyped_storage().resize_(48)
    want = torch.arange(12.0).view(3, 4)
    with torch.no_grad():
        weight.copy_(want.to("neuron"))
    torch.testing.assert_close(flipped.cpu(), want.t())
    torch.testing.assert_close(model(torch.ones(1, 4, device="neuron")).cpu(),
                               want.sum(1).view(1, 3) + model.bias.detach().cpu())


def test_set_onto_a_neuron_storage_and_resize_as_work_as_on_cuda():
    """``t.set_(x.untyped_storage(), offset, size, stride)`` fell back to the CPU, which refused the
    device's storage; ``resize_as_`` failed with "Trying to resize storage that is not resizable"."""
    x = torch.arange(12.0, device="neuron").view(4, 3)
    y = torch.randn(2, 2, device="neuron")
    assert y.resize_as_(x) is y and y.shape == (4, 3)
    z = torch.empty(0, device="neuron")
    z.set_(x.untyped_storage(), 2, (2, 2), (3, 1))
    assert torch.equal(z.cpu(), torch.tensor([[2.0, 3.0], [5.0, 6.0]]))
    assert z.storage_offset() == 2 and z.stride() == (3, 1)
    z.add_(100)  # writes through to x, which shares the memory
    assert x.cpu()[0, 2] == 102 and x.cpu()[2, 0] == 106
    bits = torch.empty(0, dtype=torch.int32, device="neuron").set_(x.untyped_storage(), 0, (2,), (1,))
    assert torch.equal(bits.cpu(), torch.tensor([0.0, 1.0]).view(torch.int32))
    # past the storage's end: the storage grows, its bytes kept, as torch's CPU and CUDA storages do
    z.set_(x.untyped_storage(), 11, (2, 2), (3, 1))
    assert x.untyped_storage().nbytes() == 64 and z.cpu()[0, 0] == 11 and x.cpu()[2, 0] == 106
    z.fill_(-1)
    assert x.cpu()[3, 2] == -1 and x.shape == (4, 3)
    with pytest.raises(RuntimeError, match="devices must match"):
        torch.zeros(3).set_(x.untyped_storage())


@pytest.mark.parametrize("case", ["empty_to_channels_last", "channels_last_to_contiguous", "same_size_restride",
                                  "resize_as_channels_last", "resize_as_preserve", "resize_as_keeps_strides"])
def test_resize_takes_its_memory_format_as_torch_does(case):
    """``resize_(..., memory_format=torch.channels_last)`` (and ``resize_as_``'s) was ignored: the
    tensor stayed contiguous, its storage held the values in another order than the CPU's, and an
    NHWC ``view`` raised where the CPU's works."""
    cl = torch.channels_last

    def run(device: str) -> torch.Tensor:
        x = torch.zeros(2, 3, 4, 5, device=device)
        t = {"empty_to_channels_last": lambda: torch.empty(0, device=device).resize_(2, 3, 4, 5, memory_format=cl),
             "channels_last_to_contiguous": lambda: x.contiguous(memory_format=cl).resize_(
                 2, 3, 4, 5, memory_format=torch.contiguous_format),
             "same_size_restride": lambda: x.resize_(2, 3, 4, 5, memory_format=cl),
             "resize_as_channels_last": lambda: torch.zeros(3, device=device).resize_as_(x, memory_format=cl),
             "resize_as_preserve": lambda: torch.zeros(7, device=device).resize_as_(
                 x.contiguous(memory_format=cl), memory_format=torch.preserve_format),
             "resize_as_keeps_strides": lambda: x.transpose(0, 1).resize_as_(x.transpose(0, 1))}[case]()
        t.copy_(torch.arange(float(t.numel())).view(t.shape))
        flat = torch.empty(0, device=device).set_(t.untyped_storage(), 0, (t.numel(),), (1,))
        return t.stride(), flat.cpu()

    (cpu_stride, cpu_memory), (stride, memory) = run("cpu"), run("neuron")
    assert stride == cpu_stride
    assert torch.equal(memory, cpu_memory)


def test_a_compiled_inference_graph_reads_a_parameters_values_written_after_a_resize():
    """New memory may sit at the old address and an ``out=`` copy into it moves no version counter:
    an inference graph must still read the new values."""
    model = nn.Linear(4, 3, bias=False).to("neuron")
    compiled = torch.compile(model, backend="neuron")
    x = torch.randn(2, 4, device="neuron")
    with torch.no_grad():
        compiled(x)
        compiled(x)
        new = torch.randn(3, 4)
        free_storage(model.weight)
        alloc_storage(model.weight)
        torch.split_with_sizes_copy(new.to("neuron").view(1, -1), [12], dim=1, out=[model.weight.view(1, -1)])
        got = compiled(x)
    torch.testing.assert_close(got.cpu(), x.cpu() @ new.t(), rtol=1e-5, atol=1e-5)
