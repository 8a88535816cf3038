"""``torch.autocast("neuron")`` against PyTorch's own autocast test lists (CUDA's policy,
``torch.testing._internal.autocast_test_lists``): each op's output dtype under float16 autocast,
and its values against the op run on inputs cast by hand, as PyTorch's ``test_autocast_*`` do.

Found by a new user: ``rms_norm`` and ``torch.norm`` stayed float16, a mixed ``vdot`` raised, and
``binary_cross_entropy`` ran where CUDA's autocast refuses it."""

from __future__ import annotations

import pytest
import torch
from torch.testing._internal.autocast_test_lists import AutocastTestLists

import torch_neuronx  # noqa: F401

_CUDA_ONLY = {"cudnn_convolution", "cudnn_convolution_transpose"}


def _cast(value, dtype):
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.to(dtype)
    if isinstance(value, list | tuple):
        return type(value)(_cast(v, dtype) for v in value)
    return value


def _function(name: str):
    for namespace in (torch, torch.nn.functional, torch._C._nn, torch.linalg):
        fn = getattr(namespace, name.removeprefix("linalg_") if namespace is torch.linalg else name, None)
        if fn is not None:
            return fn
    raise AssertionError(f"no function {name}")


def _cases():
    torch.manual_seed(0)
    lists = AutocastTestLists("neuron")
    for list_name, expected in (("torch_fp16", torch.float16), ("nn_fp16", torch.float16),
                                ("linalg_fp16", torch.float16), ("torch_fp32", torch.float32),
                                ("nn_fp32", torch.float32), ("torch_need_autocast_promote", torch.float32)):
        for entry in getattr(lists, list_name):
            name, args = entry[0], entry[1]
            kwargs = entry[2] if len(entry) > 2 and isinstance(entry[2], dict) else {}
            if name not in _CUDA_ONLY and not isinstance(args, str):  # (einsum's entry: an equation
                # for 4-d operands, with 2-d ones)
                yield pytest.param(name, args, kwargs, expected, id=f"{list_name}-{name}-{len(kwargs)}")


@pytest.mark.parametrize("name, args, kwargs, expected", list(_cases()))
def test_autocast_policy_matches_cudas(name, args, kwargs, expected):
    fn = _function(name)
    with torch.autocast("neuron", dtype=torch.float16):
        out = fn(*args, **kwargs)
    first = out[0] if isinstance(out, tuple) else out
    assert first.dtype == expected, (name, first.dtype)
    control = fn(*_cast(args, expected), **kwargs)
    control = control[0] if isinstance(control, tuple) else control
    torch.testing.assert_close(first.cpu().float(), control.cpu().float(), atol=1e-2, rtol=1e-2, equal_nan=True)


def test_binary_cross_entropy_is_refused_as_cuda_refuses_it():
    x, y = torch.rand(4, 4, device="neuron"), torch.rand(4, 4, device="neuron")
    with torch.autocast("neuron", dtype=torch.bfloat16), pytest.raises(RuntimeError, match="unsafe to autocast"):
        torch.nn.functional.binary_cross_entropy(x, y)
    with torch.autocast("neuron", dtype=torch.bfloat16):
        torch.nn.functional.binary_cross_entropy_with_logits(x, y)  # the safe form runs


def test_dynamo_never_traces_the_runtimes_own_frames_under_autocast():
    """A compiled module whose compile fell back to eager (an ``nn.LSTM``: Dynamo skips the wrapper
    frame every compiled module shares) left Dynamo's frame hook active over eager code: Dynamo then
    compiled the autocast kernels (and tried the allocator's frees) as the user's code, recompiled
    them per op, and compiled modules under autocast failed ("sources must not be empty")."""
    from torch._dynamo import convert_frame

    torch._dynamo.reset()
    lstm = torch.nn.LSTM(4, 8, batch_first=True).to("neuron")
    torch.compile(lstm, backend="neuron")(torch.randn(2, 3, 4, device="neuron"))
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8)).to("neuron")
    compiled = torch.compile(model, backend="neuron")
    x = torch.randn(2, 8, device="neuron")
    with torch.autocast("neuron", dtype=torch.bfloat16):
        for _ in range(3):
            out = compiled(x)
        del out
        out = compiled(x)
    assert out.dtype == torch.bfloat16
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = model.cpu()(x.cpu())
    torch.testing.assert_close(out.cpu().float(), want.float(), atol=2e-2, rtol=2e-2)
    from torch._dynamo import trace_rules

    def ours(codes):
        return [c for c in (code() for code in list(codes.seen)) if c is not None and "torch_neuronx" in c.co_filename]

    compiled = {f"{c.co_filename}:{c.co_name}" for c in ours(convert_frame.output_codes)}
    assert not compiled, compiled
    traced = {f"{c.co_filename}:{c.co_name}" for c in ours(convert_frame.input_codes) if not trace_rules.check(c)}
    assert not traced, traced  # (frames Dynamo met, each skipped before any tracing)
    torch._dynamo.reset()
