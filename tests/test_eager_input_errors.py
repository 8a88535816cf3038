"""Inputs torch's CPU kernels reject, on the eager device: the same errors, never a value.

Each case was found by trying the device as a new user would (a value came back where the
CPU raises, or an internal error where the CPU gives a clean one).
"""

from __future__ import annotations

import re
import warnings

import pytest
import torch


def _cpu_error(fn, *tensors):
    with pytest.raises(Exception) as info:
        fn(*tensors)
    return info.value


@pytest.mark.parametrize("fn", [
    lambda x: x.max(), lambda x: x.min(),
    lambda x: torch.topk(x, 5), lambda x: torch.topk(x.view(1, -1), 5, dim=1),
], ids=["max", "min", "topk", "topk_dim"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_reductions_and_topk_of_too_few_values_raise_torchs_error(fn, dtype):
    """``max()``/``min()`` of an empty tensor gave -inf/inf (or int64's extremes), and a ``topk``
    past its dimension an index error about index_select; and no CPU fallback warning."""
    for x in (torch.zeros(0, dtype=dtype), torch.arange(3).to(dtype)):
        try:
            want = fn(x)
        except RuntimeError as expected:
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                with pytest.raises(RuntimeError, match=re.escape(str(expected)[:40])):
                    fn(x.to("neuron"))
            with pytest.raises(Exception, match="range|numel"):  # Dynamo's fake run or ours: torch's words
                torch.compile(fn, backend="neuron")(x)
        else:
            got = fn(x.to("neuron"))
            torch.testing.assert_close(pytree_cpu(got), want)


def pytree_cpu(value):
    return torch.utils._pytree.tree_map(lambda t: t.cpu() if isinstance(t, torch.Tensor) else t, value)


_FILLS = {
    "full": lambda x, m: torch.full((2,), 300, dtype=x.dtype, device=x.device),
    "new_full": lambda x, m: x.new_full((2,), 300),
    "fill_": lambda x, m: x.clone().fill_(300),
    "setitem": lambda x, m: x.clone().__setitem__(0, 300),
    "masked_fill": lambda x, m: x.masked_fill(m, 200),
    "index_fill": lambda x, m: x.index_fill(0, torch.tensor([0], device=x.device), 300),
    "where": lambda x, m: torch.where(m, x, 300),
    "clamp": lambda x, m: x.clamp(max=300),
    "clamp_min": lambda x, m: x.clamp(min=-300),
    "addcmul": lambda x, m: x.addcmul(x, x, value=300),
    "uint8 fill -1": lambda x, m: x.to(torch.uint8).fill_(-1),
    "float16 fill": lambda x, m: x.half().fill_(1e6),
    "float16 inf fill": lambda x, m: x.half().fill_(float("inf")),
    "small": lambda x, m: x.masked_fill(m, -100),
}


@pytest.mark.parametrize("name", list(_FILLS))
def test_scalars_a_dtype_cannot_hold_raise_torchs_overflow_error(name):
    """``full((2,), 300, dtype=int8)`` and its kin wrapped to 44 on the device; torch raises."""
    fn = _FILLS[name]
    x, m = torch.tensor([1, 2], dtype=torch.int8), torch.tensor([True, False])
    try:
        want = fn(x, m)
    except RuntimeError as expected:
        with pytest.raises(RuntimeError, match=re.escape(str(expected))):
            fn(x.to("neuron"), m.to("neuron"))
    else:
        got = fn(x.to("neuron"), m.to("neuron"))
        if want is not None:
            torch.testing.assert_close(got.cpu(), want)


_OVERLAPS = {
    "assign shifted": lambda y: y[1:].copy_(y[:-1]),
    "add shifted": lambda y: y[1:].add_(y[:-1]),
    "add transposed": lambda y: y.view(2, 3)[:, :2].reshape(4).view(2, 2).add_(y[:4].view(2, 2).t()),
    "mul by own row": lambda y: y.view(2, 3).mul_(y.view(2, 3)[0]),
    "add itself": lambda y: y.add_(y),
    "same elements, other tensor": lambda y: y[:3].add_(y[:3]),
    "strided copy": lambda y: y.view(2, 3)[:, 0].copy_(y.view(2, 3)[:, 1]),
    "copysign_ shifted": lambda y: y[1:].copysign_(y[:-1]),  # (an in-place op without the pointwise tag)
    # index ops refuse any overlap with their source, the same elements included (assert_no_overlap)
    "index_copy_ from a slice": lambda y: y.index_copy_(0, _at(y, [1, 2, 3]), y[0:3]),
    "index_add_ from itself": lambda y: y.index_add_(0, _at(y, range(6)), y),
    "index_reduce_ from a slice": lambda y: y.index_reduce_(0, _at(y, [1, 2]), y[3:5], "prod"),
    "scatter_ from a slice": lambda y: y.scatter_(0, _at(y, [1, 2, 3]), y[0:3]),
    "scatter_add_ from a slice": lambda y: y.scatter_add_(0, _at(y, [1, 2, 3]), y[2:5]),
    "scatter_reduce_ from a slice": lambda y: y.scatter_reduce_(0, _at(y, [4, 5]), y[0:2], "amax"),
    "setitem from a slice": lambda y: y.__setitem__(_at(y, [1, 2, 3]), y[0:3]),
    "index_put_ accumulating a slice": lambda y: y.index_put_((_at(y, [0, 1]),), y[4:6], accumulate=True),
    "put_ from a slice": lambda y: y.put_(_at(y, [1, 2, 3]), y[0:3]),
    "sort into its input": lambda y: torch.sort(y[:4], out=(y[2:6], torch.empty(4, dtype=torch.long,
                                                                                 device=y.device))),
    # allowed: a strided source torch does not judge, another tensor's memory, masked ops
    "index_add_ from a strided view": lambda y: y.index_add_(0, _at(y, [0, 1, 2]), y[::2]),
    "index_copy_ from a clone": lambda y: y.index_copy_(0, _at(y, [1, 2, 3]), y[0:3].clone()),
    "masked_scatter_ from a slice": lambda y: y[:3].masked_scatter_(y[:3] > 0, y[2:5]),
}


def _at(y: torch.Tensor, positions) -> torch.Tensor:
    return torch.tensor(list(positions), device=y.device)


@pytest.mark.parametrize("name", list(_OVERLAPS))
def test_writes_from_partly_overlapping_memory_raise_at_the_call(name):
    """``y[1:] = y[:-1]`` raised only at the next host read and left ``y`` poisoned; ``y[1:] += y[:-1]``
    computed as if its input were cloned. torch raises at the call and leaves ``y`` as it was;
    the same elements, or strided views torch does not judge, are allowed."""
    fn = _OVERLAPS[name]
    host, device = torch.arange(6.0), torch.arange(6.0, device="neuron")
    try:
        fn(host)
    except RuntimeError as expected:
        with pytest.raises(RuntimeError, match=re.escape(str(expected)[:60])):
            fn(device)
        assert device.tolist() == list(range(6))  # untouched, readable
    else:
        fn(device)
        assert device.tolist() == host.tolist()


def test_a_host_tensor_written_with_a_neuron_operand_is_torchs_device_error():
    """``cpu.add_(neuron)`` raised AttributeError '_data' from inside the device."""
    host, device = torch.zeros(3), torch.ones(3, device="neuron")
    for write in (lambda: host.add_(device), lambda: host.mul_(device), lambda: host.masked_fill_(device > 0, 1.0)):
        with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device.*neuron:0 and cpu"):
            write()
    assert host.tolist() == [0.0, 0.0, 0.0]



@pytest.mark.parametrize("fn", [
    lambda x, c: x + c, lambda x, c: c * x, lambda x, c: torch.mm(x.view(3, 1), c.view(1, 3)),
    lambda x, c: torch.where(x > 0, x, c), lambda x, c: torch.cat([x, c]), lambda x, c: x.add_(c),
    # composites whose CUDA path checks in the ops they decompose into, or in their in-place kernels
    lambda x, c: torch.nn.functional.embedding(c.long(), x.view(3, 1)), lambda x, c: torch.stack([x, c]),
    lambda x, c: torch.stack([x[0], c[0]]), lambda x, c: torch.allclose(x, c),
], ids=["add", "rmul", "mm", "where", "cat", "add_", "embedding", "stack", "stack_0d", "allclose"])
def test_a_cpu_operand_beside_neuron_tensors_is_torchs_device_error(fn):
    """A CPU tensor of one or more dimensions as an operand: computed silently with the host
    tensor (CUDA refuses it: code that fails on an accelerator ran here). 0-d CPU tensors
    (scalars) and CPU indices stay accepted, as on CUDA."""
    x = torch.arange(3, dtype=torch.float32, device="neuron")
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device.*neuron:0 and cpu"):
        fn(x, torch.ones(3))
    assert torch.equal((x + torch.tensor(2.0)).cpu(), torch.tensor([2.0, 3.0, 4.0]))
    assert torch.equal(x[torch.tensor([2, 0])].cpu(), torch.tensor([2.0, 0.0]))
    x[torch.tensor([1])] = torch.tensor([7.0])
    assert torch.equal(x.cpu(), torch.tensor([0.0, 7.0, 2.0]))
    x.copy_(torch.ones(3))
    assert torch.equal(x.cpu(), torch.ones(3))


def test_composites_reaching_the_device_whole_check_devices_as_their_decompositions_do():
    """Under ``inference_mode`` composite ops reach the device whole: ``cpu_x @ neuron_w`` and
    ``F.linear(cpu_x, neuron_w)`` ran on neuron where ``no_grad`` (and CUDA) refuse them. They run as
    torch's decomposition, whose ops check: packing a sequence still takes its lengths on the CPU."""
    x, w = torch.randn(2, 4), torch.randn(3, 4, device="neuron")
    with torch.inference_mode():
        for fn in (lambda: x @ w.t(), lambda: torch.nn.functional.linear(x, w),
                   lambda: torch.einsum("ij,kj->ik", x, w)):
            with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
                fn()
        padded = torch.randn(3, 2, 4)
        packed = torch.nn.utils.rnn.pack_padded_sequence(padded.to("neuron"), torch.tensor([3, 2]))
        expected = torch.nn.utils.rnn.pack_padded_sequence(padded, torch.tensor([3, 2]))
        torch.testing.assert_close(packed.data.cpu(), expected.data)
        torch.testing.assert_close((x.to("neuron") @ w.t()).cpu(), x @ w.cpu().t())


def test_a_host_tensor_indexed_by_neuron_indices_is_torchs_device_error():
    """``cpu_tensor[neuron_mask]`` returned a neuron tensor (CUDA refuses device indices of a host tensor)."""
    host, device = torch.arange(6.0), torch.arange(6.0, device="neuron")
    for index in (device > 2, torch.tensor([1, 0], device="neuron")):
        with pytest.raises(RuntimeError, match="indices should be either on cpu or on the same device"):
            host[index]
    assert torch.equal(device[torch.tensor([1, 0])].cpu(), torch.tensor([1.0, 0.0]))


def test_clamping_integers_with_float_bounds_promotes_instead_of_raising():
    """``uint8.clamp(-2.5, 4.5)`` computes in float (torch's type promotion); the overflow check of
    scalars converted to the tensor's dtype raised "cannot be converted to type uint8_t"."""
    x = torch.tensor([0, 3, 200], dtype=torch.uint8)
    for fn in (lambda t: t.clamp(-2.5, 4.5), lambda t: torch.clamp_max(t, 300.5),
               lambda t: torch.where(t > 1, t, -1.5)):
        expected = fn(x)
        got = fn(x.to("neuron")).cpu()
        assert got.dtype == expected.dtype and torch.equal(got, expected)
    with pytest.raises(RuntimeError, match="overflow"):
        torch.full((2,), 300, dtype=torch.int8, device="neuron")


_TENSOR_BOUNDS = {
    "float16 by a float32 min": (torch.tensor([1.0, 2.0, 3.0], dtype=torch.float16),
                                 {"min": torch.tensor([1.5, 0.5, 5.0])}),
    "bfloat16 by float32 bounds, one 0-d": (torch.tensor([1.0, 2.0, 3.0], dtype=torch.bfloat16),
                                            {"min": torch.tensor([1.5, 0.5, 5.0]), "max": torch.tensor(2.5)}),
    "broadcast bounds": (torch.arange(6.0).view(2, 3) - 2,
                         {"min": torch.tensor([[-0.5, 0.0, 0.5]]), "max": torch.tensor([[0.5], [1.0]])}),
    "NaN and min above max": (torch.tensor([float("nan"), 1.0, 5.0]),
                              {"min": torch.tensor([0.0, float("nan"), 6.0]), "max": torch.tensor([1.0, 2.0, 3.0])}),
    "integers by float bounds": (torch.tensor([1, 5, 9]), {"min": torch.tensor([2.5, 0.5, 0.5])}),
}


@pytest.mark.parametrize("name", list(_TENSOR_BOUNDS))
def test_compiled_clamps_by_tensor_bounds_promote_and_broadcast_as_torchs(name):
    """StableHLO's clamp wants one dtype and shape: a float16 tensor clamped by a float32 one
    failed to lower."""
    x, bounds = _TENSOR_BOUNDS[name]
    for fn in (lambda t, b: t.clamp(**b), lambda t, b: torch.clamp_min(t, b["min"])):
        expected, got = fn(x, bounds), torch.compile(fn, backend="neuron")(x, bounds)
        assert got.dtype == expected.dtype and torch.equal(got.nan_to_num(7.0), expected.nan_to_num(7.0)), name


_SHAPE_ERRORS = {
    "reflect pad wider than the input": lambda x: torch.nn.functional.pad(x[:, :3], (5, 5), mode="reflect"),
    "reflect pad of an empty dim": lambda x: torch.nn.functional.pad(x[:, :0].unsqueeze(0), (1, 1), mode="reflect"),
    "replicate pad of an empty dim": lambda x: torch.nn.functional.pad(x[:0].unsqueeze(0), (1, 1), mode="replicate"),
    "reflect pad 2d past the input": lambda x: torch.nn.functional.pad(x[None, None], (1, 1, 4, 4), mode="reflect"),
    "index_reduce sum": lambda x: x.index_reduce(0, torch.tensor([0, 1], device=x.device), x[:2], "sum"),
    "abs of bool": lambda x: torch.abs(x > 0),
    "max_pool window past the input": lambda x: torch.nn.functional.max_pool2d(x[None, None], 5),
    "matmul of mismatched sizes": lambda x: x @ x[:2],
    "cat of mismatched sizes": lambda x: torch.cat([x, x[:, :2]]),
    "unfold past the size": lambda x: x.unfold(1, 6, 1),
    # torch's decompositions check these with ``assert`` (an AssertionError reached the caller)
    "nll_loss weight of the wrong size": lambda x: torch.nn.functional.nll_loss(
        x, torch.tensor([0, 1, 2, 3], device=x.device), weight=torch.ones(3, device=x.device)),
    "cross_entropy of a 2-d class target": lambda x: torch.nn.functional.cross_entropy(
        x, torch.zeros(4, 2, dtype=torch.long, device=x.device)),
}


@pytest.mark.parametrize("name", list(_SHAPE_ERRORS))
def test_calls_torch_rejects_for_their_shapes_raise_torchs_error(name):
    """The kernel is traced through the compile path's decompositions, which replaced the op before
    its meta kernel could check the call: a reflection pad wider than its input read clamped
    positions and returned a value where the CPU raises."""
    fn, x = _SHAPE_ERRORS[name], torch.randn(4, 4)
    expected = _cpu_error(fn, x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch's error at the call, not a fallback to the CPU
        with pytest.raises(type(expected), match=re.escape(str(expected).splitlines()[0][:40])):
            fn(x.to("neuron"))


_WITH_KERNELS = {
    "uint8 abs": lambda d: torch.tensor([0, 5, 250], dtype=torch.uint8, device=d).abs(),
    "uint8 gcd": lambda d: torch.gcd(torch.tensor([0, 5, 250], dtype=torch.uint8, device=d),
                                     torch.tensor([3, 10, 25], dtype=torch.uint8, device=d)),
    "gather of a 0-d tensor": lambda d: torch.gather(torch.tensor(3.0, device=d), 0, torch.tensor(0, device=d)),
    "searchsorted of a scalar": lambda d: torch.searchsorted(torch.tensor([1.0, 2.0, 3.0], device=d), 2.5),
}


@pytest.mark.parametrize("name", list(_WITH_KERNELS))
def test_ops_that_fell_back_to_the_cpu_run_on_the_device(name):
    fn = _WITH_KERNELS[name]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "runs on the CPU" warning
        got = fn("neuron")
    assert torch.equal(got.cpu(), fn("cpu"))


_OUT_OVERLAPS = {
    "neg into a shifted window": lambda x: torch.neg(x[:4], out=x[2:6]),
    "add into a shifted window": lambda x: torch.add(x[:4], 1, out=x[2:6]),
    "mul into a shifted window": lambda x: torch.mul(x[:4], x[1:5], out=x[2:6]),
    "into an expanded out": lambda x: torch.add(x[:4], 1, out=x[:1].expand(4)),
    "into itself (allowed)": lambda x: torch.exp(x[:4], out=x[:4]),
    "into a disjoint window (allowed)": lambda x: torch.add(x[:4], 1, out=x[4:8]),
    # ops that are not pointwise, each with its kernel's own rule (an out of a functional result hid them)
    "index_select into its input": lambda x: torch.index_select(
        x[:4], 0, torch.tensor([3, 2, 1, 0], device=x.device), out=x[2:6]),
    "cat into its inputs": lambda x: torch.cat([x[:2], x[2:4]], out=x[1:5]),
    "cat into exactly its inputs": lambda x: torch.cat([x[:2], x[2:4]], out=x[:4]),
    "cumsum into its input": lambda x: torch.cumsum(x[:4], 0, out=x[1:5]),
    "gather into its input": lambda x: torch.gather(x[:4], 0, torch.tensor([3, 2, 1, 0], device=x.device),
                                                   out=x[1:5]),
    "mm into its input (allowed)": lambda x: torch.mm(x[:4].view(2, 2), x[:4].view(2, 2), out=x[2:6].view(2, 2)),
    "mm into interleaved memory (allowed)": lambda x: torch.mm(
        x[0::2][:4].view(2, 2), x[0::2][:4].view(2, 2), out=x[1::2][:4].view(2, 2)),
}


@pytest.mark.parametrize("name", list(_OUT_OVERLAPS))
def test_out_variants_refuse_an_out_partly_overlapping_an_input(name):
    """An op's ``out`` overlapping its input computed a value where the CPU raises (a pointwise op's
    partial overlap; any overlap for ``cat``, ``index_select``, ``gather``, ``cumsum``); where the
    CPU allows it (``mm``), the CPU's values."""
    fn = _OUT_OVERLAPS[name]
    x = torch.arange(8.0)
    try:
        fn(x)
    except RuntimeError as expected:
        with pytest.raises(RuntimeError, match=re.escape(str(expected)[:40])):
            fn(torch.arange(8.0).to("neuron"))
    else:
        y = torch.arange(8.0).to("neuron")
        fn(y)
        torch.testing.assert_close(y.cpu(), x)


_X = torch.arange(10.0)
_INDEXING = {
    "index_select": lambda x, i: x.index_select(0, i),
    "index_add": lambda x, i: x.index_add(0, i, torch.ones(2, device=x.device)),
    "index_copy": lambda x, i: x.index_copy(0, i, torch.ones(2, device=x.device)),
    "index_fill": lambda x, i: x.index_fill(0, i, 5.0),
    "index_reduce": lambda x, i: x.index_reduce(0, i, torch.full((2,), 7.0, device=x.device), "amax"),
    "index_put": lambda x, i: x.index_put((i,), torch.tensor(1.0, device=x.device)),
    "index_put_accumulate": lambda x, i: x.index_put((i,), torch.tensor(1.0, device=x.device), accumulate=True),
    "nll_loss": lambda x, i: torch.nn.functional.nll_loss(x.view(1, 10).expand(2, 10), i),
    "gather": lambda x, i: x.gather(0, i),
    "embedding": lambda x, i: torch.nn.functional.embedding(i, x.view(10, 1)),
}


@pytest.mark.parametrize("dtype", [torch.int8, torch.int16, torch.int32, torch.uint8, torch.bool])
@pytest.mark.parametrize("name", sorted(_INDEXING))
def test_indices_of_a_dtype_the_cpu_refuses_raise_torchs_error(name, dtype):
    """An int8/int16/int32/uint8/bool index, target or mask that the CPU's kernel refuses (or, for
    uint8 and bool, reads as a mask of the wrong shape) raised nothing on the device: the kernel read
    or wrote at the values (``index_put(accumulate=True)`` with a 2-element bool mask wrote element
    0), or gave an error about index 128. Meta kernels skip these rules; the device now takes the
    CPU's. Dtypes the CPU accepts give its values."""
    fn = _INDEXING[name]
    index = torch.tensor([True, False]) if dtype is torch.bool else torch.tensor([1, 3], dtype=dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's uint8-index deprecation
        try:
            want = fn(_X, index)
        except (RuntimeError, IndexError) as expected:
            with pytest.raises(type(expected), match=re.escape(str(expected).splitlines()[0][:40])):
                fn(_X.to("neuron"), index.to("neuron"))
        else:
            torch.testing.assert_close(fn(_X.to("neuron"), index.to("neuron")).cpu(), want)


def test_a_gradient_on_another_device_than_its_output_is_torchs_error():
    """The engine checks a cotangent's device in validate_outputs, which skips tensor subclasses:
    a neuron cotangent for a CPU output hit the engine's internal assert (``opt_ready_stream &&
    opt_parent_stream``), and a CPU one for a neuron output was taken silently. Both are torch's
    "invalid gradient" error now, for backward() and autograd.grad alike; same-device ones work."""
    host = torch.randn(3, requires_grad=True)
    device = torch.randn(3, device="neuron", requires_grad=True)
    cases = [(host * 2, torch.ones(3, device="neuron"), "expected device cpu but got neuron:0"),
             (device * 2, torch.ones(3), "expected device neuron:0 but got cpu")]
    for out, grad, message in cases:
        with pytest.raises(RuntimeError, match=f"invalid gradient at index 0 - {message}"):
            out.backward(grad, retain_graph=True)
        with pytest.raises(RuntimeError, match=f"invalid gradient at index 0 - {message}"):
            torch.autograd.grad([out], [host if out.device.type == "cpu" else device], [grad])
    (device * 2).backward(torch.ones(3, device="neuron"))
    torch.testing.assert_close(device.grad.cpu(), torch.full((3,), 2.0))


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.int8])
def test_integers_to_negative_integer_powers_raise_torchs_error(dtype):
    """``int_tensor ** -1`` returned [1, 0, 0, 0] where torch raises; tensor exponents and
    non-negative ones keep their values."""
    x = torch.tensor([1, -2, 3, 0], dtype=dtype)
    message = "Integers to negative integer powers are not allowed"
    for run in (lambda: (x.to("neuron") ** -1).cpu(), lambda: x.to("neuron").pow_(-2).cpu(),
                lambda: torch.compile(lambda t: t ** -1, backend="neuron")(x)):
        with pytest.raises(Exception, match=message):
            run()
    assert torch.equal((x.to("neuron") ** 2).cpu(), x ** 2)
    exponents = torch.tensor([2, -1, 0, 1], dtype=dtype)
    assert torch.equal((x.to("neuron") ** exponents.to("neuron")).cpu(), x ** exponents)


def test_ops_whose_results_are_quantized_or_sparse_are_refused_by_name():
    """A quantized or sparse result of an op that ran on the host for neuron tensors: the device
    holds dense tensors only (copying a quantized result into device memory killed the process)."""
    x = torch.randn(4).to("neuron")
    with pytest.raises(NotImplementedError, match="quantize_per_tensor.*quantized tensor"):
        torch.quantize_per_tensor(x, 0.1, 0, torch.qint8)
    with pytest.raises(NotImplementedError, match="_to_sparse.*sparse_coo tensor"):
        x.to_sparse()
    with pytest.raises(NotImplementedError, match="sparse_coo"):
        torch.randn(2, 3).to_sparse().to("neuron")
    assert torch.equal(x.cpu(), x.cpu())  # the device goes on


def test_a_torch_function_subclass_of_a_neuron_tensor_is_a_clear_error():
    """``as_subclass`` (and ``.to("neuron")`` of a CPU subclass, which calls it) raised torch's
    "raw Tensor object is already associated to a python object of type NeuronTensor"."""

    class Logged(torch.Tensor):
        pass

    x = torch.randn(2, 2)
    assert x.to("neuron").as_subclass(torch.Tensor).device.type == "neuron"  # its own superclass: itself
    for make in (lambda: x.to("neuron").as_subclass(Logged), lambda: x.as_subclass(Logged).to("neuron")):
        with pytest.raises(TypeError, match="cannot become a Logged.*TorchFunctionMode"):
            make()


def test_dlpack_exports_a_host_copy_or_refuses():
    """``n.__dlpack__()`` made a capsule with a null pointer: the tensor imported from it failed on
    every use with internal errors. DLPack's refusal (``BufferError``), or a host copy when asked."""
    from torch.utils.dlpack import from_dlpack

    n = torch.arange(6.0, device="neuron")
    with pytest.raises(BufferError, match="no DLPack export"):
        n.__dlpack__()
    assert torch.equal(from_dlpack(n.__dlpack__(dl_device=(1, 0))), torch.arange(6.0))


def test_a_kernel_compile_failure_warns_with_the_compilers_error_line():
    """The CPU-fallback warning of an op whose kernel failed to compile ended at "iree exited with
    status 1:", leaving out why (only TORCH_NEURONX_LOG_LEVEL=3 showed it)."""
    from torch_neuronx.compiler.errors import NeuronCompileError
    from torch_neuronx.device import kernels

    err = NeuronCompileError("compile", "iree exited with status 1:\n  module.mlir:3:5: note: called from\n"
                             "  module.mlir:9:10: error: undefined symbol: __truncsfbf2\n", graph="eager_nll_loss")
    assert kernels._first_reason(err) == ("compile stage failed for graph 'eager_nll_loss': iree exited with "
                                          "status 1: module.mlir:9:10: error: undefined symbol: __truncsfbf2")
    err = NeuronCompileError("lowering", "torch-mlir could not lower: failed to legalize", graph="g")
    assert kernels._first_reason(err) == ("lowering stage failed for graph 'g': "
                                          "torch-mlir could not lower: failed to legalize")


_BOOL_PRODUCTS = {
    "mm": lambda a, b, v: a @ b,
    "bmm": lambda a, b, v: torch.bmm(a[None], b[None]),
    "mv": lambda a, b, v: a @ v,
    "dot": lambda a, b, v: torch.dot(v, v),
    "addmm": lambda a, b, v: torch.addmm(a, a, b),
}


@pytest.mark.parametrize("name", list(_BOOL_PRODUCTS))
def test_matrix_products_of_bools_raise_as_on_the_cpu(name):
    """Torch's CPU (and CUDA) kernels implement no bool matrix product ("addmm_impl_cpu_" not
    implemented for 'Bool'); the compiled kernel computed one. Integers still multiply."""
    product = _BOOL_PRODUCTS[name]
    a, b, v = torch.eye(3, dtype=torch.bool), torch.ones(3, 3, dtype=torch.bool), torch.ones(3, dtype=torch.bool)
    with pytest.raises(RuntimeError) as cpu:
        product(a, b, v)
    with pytest.raises(type(cpu.value), match="not implemented for 'Bool'"):
        product(a.to("neuron"), b.to("neuron"), v.to("neuron"))
    ints = [t.to(torch.int64) for t in (a, b, v)]
    assert torch.equal(product(*[t.to("neuron") for t in ints]).cpu(), product(*ints))
