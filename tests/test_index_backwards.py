"""Backwards of index-based ops on ``neuron`` tensors, eager and under torch.compile, against CPU eager.

Issue 15: training ``F.interpolate(mode="nearest")`` next to ConvTranspose2d and GroupNorm on neuron
tensors failed in aot_autograd with ``SystemError: <built-in method run_backward ...> returned NULL
without setting an exception``. Two faults: ``_unsafe_index``'s backward makes its zeros with
``grad.new_zeros(..., device=grad.device)``, and the traced inner op made that inner tensor on the
neuron device, so ``_unsafe_index_put`` then mixed devices (fixed in ``_trace_op``: device arguments
of inner ops name the host); and PyTorch loses a Python exception raised in a backward pass on a
PrivateUse1 device, which is what turned that error into the SystemError (device/backward_errors.py
raises the op's own exception instead). Scatters that sum (index_put with accumulate, the nearest
upsampling and embedding backwards) also put IREE's fused producers on the stack, past its limit for
bfloat16 updates at every fallback (fixed by materializing their operands before lowering).
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_neuronx  # noqa: F401  (the neuron device)

_G = torch.Generator().manual_seed(0)
_X4 = torch.randn(2, 3, 6, 6, generator=_G)
_X2 = torch.randn(5, 4, generator=_G)
_I = torch.tensor([4, 0, 2, 2])
_GI = torch.randint(0, 4, (5, 3), generator=_G)
_SRC = torch.randn(5, 3, generator=_G)
_GRID = torch.rand(2, 5, 5, 2, generator=_G) * 2.2 - 1.1
_MASK = torch.rand(5, 4, generator=_G) > 0.5
_W = torch.randn(10, 4, generator=_G)
_IDS = torch.tensor([[1, 2, 4, 5], [4, 3, 2, 9]])
_BAG, _OFFSETS = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9]), torch.tensor([0, 3, 5])


def _on(t: torch.Tensor, device: str) -> torch.Tensor:
    """An index tensor on ``device`` (the neuron runs index with neuron tensors, as a model does)."""
    return t.to(device)


# name -> (fn(device, *inputs), differentiable inputs)
CASES = {
    "index": (lambda d, x: x[_on(_I, d)], [_X2]),
    "index_two_dims": (lambda d, x: x[_on(_I, d), _on(_I % 4, d)], [_X2]),
    "index_columns": (lambda d, x: x[:, _on(_I % 4, d)], [_X2]),
    "index_select": (lambda d, x: x.index_select(0, _on(_I, d)), [_X2]),
    "gather": (lambda d, x: x.gather(1, _on(_GI, d)), [_X2]),
    "take": (lambda d, x: x.take(_on(_I * 3, d)), [_X2]),
    "embedding": (lambda d, w: F.embedding(_on(_IDS, d), w, padding_idx=2), [_W]),
    "index_add": (lambda d, x, s: x.index_add(0, _on(torch.tensor([0, 2, 2, 4, 1]), d), s), [_SRC * 2, _SRC]),
    "index_put_accumulate": (lambda d, x, v: x.index_put((_on(_I, d),), v, accumulate=True), [_X2, _X2[:4] + 1]),
    "index_copy": (lambda d, x, s: x.index_copy(0, _on(torch.tensor([4, 0]), d), s), [_X2, _X2[:2] - 1]),
    "put_accumulate": (lambda d, x, v: x.put(_on(torch.tensor([3, 7, 3]), d), v, accumulate=True), [_X2, _SRC[0]]),
    "scatter": (lambda d, x, s: x.scatter(1, _on(_GI[:, :1], d), s[:, :1]), [_X2, _SRC]),
    "scatter_add": (lambda d, x, s: x.scatter_add(1, _on(_GI, d), s), [_X2, _SRC]),
    "scatter_reduce_sum": (lambda d, x, s: x.scatter_reduce(1, _on(_GI, d), s, "sum"), [_X2, _SRC]),
    "scatter_reduce_prod": (lambda d, x, s: x.scatter_reduce(1, _on(_GI, d), s, "prod"), [_X2, _SRC]),
    "scatter_reduce_amax": (lambda d, x, s: x.scatter_reduce(1, _on(_GI, d), s, "amax"), [_X2, _SRC]),
    "scatter_reduce_amin": (lambda d, x, s: x.scatter_reduce(1, _on(_GI, d), s, "amin", include_self=False),
                            [_X2, _SRC]),
    "scatter_reduce_mean": (lambda d, x, s: x.scatter_reduce(1, _on(_GI, d), s, "mean"), [_X2, _SRC]),
    "masked_select": (lambda d, x: x.masked_select(_on(_MASK, d)), [_X2]),
    "interpolate_nearest": (lambda d, x: F.interpolate(x, scale_factor=2, mode="nearest"), [_X4]),
    "interpolate_nearest_exact": (lambda d, x: F.interpolate(x, size=(9, 7), mode="nearest-exact"), [_X4]),
    "interpolate_nearest_1d": (lambda d, x: F.interpolate(x.flatten(-2), scale_factor=1.5), [_X4]),
    "interpolate_nearest_3d": (lambda d, x: F.interpolate(x.unsqueeze(2), scale_factor=2), [_X4]),
    "interpolate_bilinear": (lambda d, x: F.interpolate(x, scale_factor=2, mode="bilinear"), [_X4]),
    "interpolate_bilinear_corners": (lambda d, x: F.interpolate(x, size=(9, 7), mode="bilinear", align_corners=True),
                                     [_X4]),
    "grid_sample_bilinear": (lambda d, x, g: F.grid_sample(x, g, align_corners=False), [_X4, _GRID]),
    "grid_sample_nearest": (lambda d, x, g: F.grid_sample(x, g, mode="nearest", padding_mode="border",
                                                           align_corners=False), [_X4, _GRID]),
    "max_pool_with_indices": (lambda d, x: F.max_pool2d(x, 3, 2, 1, return_indices=True)[0], [_X4]),
    "max_unpool": (lambda d, x: F.max_unpool2d(*F.max_pool2d(x, 2, return_indices=True), 2), [_X4]),
    "embedding_bag_sum": (lambda d, w: F.embedding_bag(_on(_BAG, d), w, _on(_OFFSETS, d), mode="sum"), [_W]),
    "embedding_bag_mean": (lambda d, w: F.embedding_bag(_on(_BAG, d), w, _on(_OFFSETS, d), mode="mean"), [_W]),
    "embedding_bag_max": (lambda d, w: F.embedding_bag(_on(_BAG, d), w, _on(_OFFSETS, d), mode="max"), [_W]),
    # int32 indices and offsets: the backward refused int64 bag outputs ("expected scalar type Int")
    "embedding_bag_int32": (lambda d, w: torch.cat([F.embedding_bag(_on(_BAG.int(), d), w, _on(_OFFSETS.int(), d),
                                                                    mode=mode) for mode in ("sum", "mean", "max")]),
                            [_W]),
}


def _grads(fn, inputs: list[torch.Tensor], device: str, run=None) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """``fn``'s output and the inputs' gradients of one fixed random weighting of it, on ``device``."""
    leaves = [t.detach().clone().to(device).requires_grad_() for t in inputs]
    out = (run or fn)(device, *leaves)
    weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=out.dtype).to(device)
    (out * weight).sum().backward()
    return out.detach().cpu(), [leaf.grad.cpu() for leaf in leaves]


@pytest.mark.parametrize("name", list(CASES))
def test_eager_neuron_gradients_match_cpu(name):
    fn, inputs = CASES[name]
    expected, expected_grads = _grads(fn, inputs, "cpu")
    got, got_grads = _grads(fn, inputs, "neuron")
    torch.testing.assert_close(got, expected)
    for i, (g, e) in enumerate(zip(got_grads, expected_grads)):
        torch.testing.assert_close(g, e, msg=lambda m, i=i: f"gradient of input {i}: {m}")


def _all_index_ops(d: str, x4, x2, w, src, grid):
    """Every case above that keeps a static shape, in one graph (so one forward and one backward compile)."""
    outs = []
    for name, (fn, inputs) in CASES.items():
        if name == "masked_select":  # a data-dependent shape: a graph break of its own
            continue
        args = {id(_X4): x4, id(_X2): x2, id(_W): w, id(_SRC): src, id(_GRID): grid}
        outs.append(fn(d, *[args.get(id(t), t) for t in inputs]).flatten())
    return torch.cat(outs)


def test_compiled_index_backwards_on_neuron_tensors_match_cpu():
    """All the index backwards above, compiled on neuron tensors (the inputs they do not
    differentiate, such as ``_SRC * 2``, enter as constants)."""
    inputs = [_X4, _X2, _W, _SRC, _GRID]
    fn = _all_index_ops
    expected, expected_grads = _grads(fn, inputs, "cpu")
    got, got_grads = _grads(fn, inputs, "neuron", run=torch.compile(fn, backend="neuron"))
    torch.testing.assert_close(got, expected)
    for i, (g, e) in enumerate(zip(got_grads, expected_grads)):
        torch.testing.assert_close(g, e, msg=lambda m, i=i: f"gradient of input {i}: {m}")


class _Decoder(nn.Module):
    """Issue 15's model: nearest upsampling next to a transposed convolution and GroupNorm."""

    def __init__(self) -> None:
        super().__init__()
        self.c0, self.gn = nn.Conv2d(3, 8, 3, padding=1), nn.GroupNorm(4, 8)
        self.up, self.out = nn.ConvTranspose2d(8, 8, 2, 2), nn.Conv2d(16, 3, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.silu(self.gn(self.c0(x)))
        return self.out(torch.cat([self.up(h), F.interpolate(h, scale_factor=2, mode="nearest")], 1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_nearest_upsampling_decoder_trains_on_neuron_tensors_as_on_cpu(retries, dtype):
    """One compiled training step of the issue's model on neuron tensors: loss, every gradient and
    the updated parameters as CPU eager's; in bfloat16 the upsampling backward's scatter (its updates
    summed in float32) compiled only once its operands were materialized."""
    torch.manual_seed(0)
    eager = _Decoder().to(dtype)
    model = copy.deepcopy(eager).to("neuron")
    x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(2)).to(dtype)
    target = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(3)).to(dtype)
    losses = []
    for net, run, device in ((eager, eager, "cpu"), (model, torch.compile(model, backend="neuron"), "neuron")):
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        loss = F.mse_loss(run(x.to(device)), target.to(device))
        loss.backward()
        opt.step()
        losses.append(loss.detach().cpu())
    tolerance = {"atol": 2e-2, "rtol": 2e-2} if dtype == torch.bfloat16 else {"atol": 1e-5, "rtol": 1e-4}
    torch.testing.assert_close(losses[1], losses[0], **tolerance)
    for (name, p), q in zip(eager.named_parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(q.grad.cpu(), p.grad, msg=lambda m, n=name: f"{n}.grad: {m}", **tolerance)
        torch.testing.assert_close(q.detach().cpu(), p.detach(), msg=lambda m, n=name: f"{n}: {m}", **tolerance)
    assert retries() == []


def test_an_error_in_a_neuron_backward_pass_is_raised_as_itself():
    """A neuron op failing in a backward pass (here in a hook) raises its own exception, as on CPU,
    not PyTorch's "returned NULL without setting an exception"."""
    for device in ("cpu", "neuron"):
        x = torch.randn(4, device=device, requires_grad=True)
        y = x.sin()
        y.register_hook(lambda g: g[torch.tensor([10], device=g.device)])
        with pytest.raises(IndexError, match="index 10 is out of bounds"):
            y.sum().backward()


class _HookFailed(Exception):
    pass


def _raise(*_):
    raise _HookFailed("raised by the user's hook")


@pytest.mark.parametrize("where", ["tensor", "non_leaf", "post_accumulate", "module", "module_pre"])
def test_an_exception_raised_by_a_backward_hook_arrives_as_itself(where):
    """A user's hook raising on neuron tensors gave "SystemError: ... returned NULL without setting an
    exception" (the engine's device bookkeeping ran Python with the exception pending)."""
    layer = torch.nn.Linear(3, 2).to("neuron")
    x = torch.randn(4, 3, device="neuron", requires_grad=True)
    if where == "tensor":
        x.register_hook(_raise)
    elif where == "post_accumulate":
        layer.weight.register_post_accumulate_grad_hook(_raise)
    elif where == "module":
        layer.register_full_backward_hook(_raise)
    elif where == "module_pre":
        layer.register_full_backward_pre_hook(_raise)
    y = layer(x)
    if where == "non_leaf":
        y.register_hook(_raise)
    with pytest.raises(_HookFailed, match="raised by the user's hook"):
        y.sum().backward()
    z = torch.randn(4, 3, device="neuron", requires_grad=True)
    handle = z.register_hook(lambda g: g * 2)  # a hook that returns still works, and is removable
    (z * 3).sum().backward()
    torch.testing.assert_close(z.grad.cpu(), torch.full((4, 3), 6.0))
    handle.remove()
    (z * 3).sum().backward()
    torch.testing.assert_close(z.grad.cpu(), torch.full((4, 3), 9.0))


def _checkpoint_recompute_differs(device):
    from torch.utils.checkpoint import checkpoint

    calls = [0]

    def f(x):
        calls[0] += 1
        return x[: 2 + calls[0] % 2].sin()

    checkpoint(f, torch.randn(4, device=device, requires_grad=True), use_reentrant=False).sum().backward()


def _checkpoint_recompute_raises(device):
    from torch.utils.checkpoint import checkpoint

    calls = [0]

    def f(x):
        calls[0] += 1
        if calls[0] > 1:
            raise _HookFailed("the recomputation failed")
        return x.sin()

    checkpoint(f, torch.randn(4, device=device, requires_grad=True), use_reentrant=False).sum().backward()


def _node_hook(device, kind, hook):
    y = torch.ones(3, device=device, requires_grad=True) * 2
    getattr(y.grad_fn, kind)(hook)
    y.sum().backward()


def _unpack_raises(device):
    x = torch.ones(3, device=device, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t, _raise):
        y = (x * x).sum()
    y.backward()


def _returns(register, value, device):
    x = torch.ones(3, device=device, requires_grad=True)
    y = x * 2
    if register == "post_accumulate":
        x.register_post_accumulate_grad_hook(lambda p: value)
    else:
        y.register_hook(lambda g: value)
    y.sum().backward()


def _module_hook_count(device, pre):
    m = torch.nn.Linear(3, 2).to(device)
    if pre:
        m.register_full_backward_pre_hook(lambda mod, go: (go[0], go[0]))
    else:
        m.register_full_backward_hook(lambda mod, gi, go: (gi[0], gi[0]))
    m(torch.ones(1, 3, device=device, requires_grad=True)).sum().backward()


@pytest.mark.parametrize("case", [
    _checkpoint_recompute_differs, _checkpoint_recompute_raises, _unpack_raises,
    lambda d: _node_hook(d, "register_hook", _raise), lambda d: _node_hook(d, "register_prehook", _raise),
    lambda d: _node_hook(d, "register_hook", lambda gi, go: 5),
    lambda d: _returns("tensor", 3, d), lambda d: _returns("tensor", (1,), d),
    lambda d: _returns("post_accumulate", (1, 2), d), lambda d: _returns("post_accumulate", torch.ones(3), d),
    lambda d: _module_hook_count(d, False), lambda d: _module_hook_count(d, True),
], ids=["checkpoint-differs", "checkpoint-raises", "unpack-hook", "node-hook", "node-prehook", "node-hook-result",
        "tensor-hook-int", "tensor-hook-tuple", "post-accumulate-tuple", "post-accumulate-tensor",
        "module-hook-count", "module-prehook-count"])
def test_every_error_of_a_backward_pass_arrives_as_torchs_own(case):
    """The errors a backward pass raises through autograd's hooks (on nodes, saved tensors'
    unpacking, checkpoint's recomputation) and torch's checks of what hooks return came as "SystemError:
    ... returned NULL without setting an exception" on neuron tensors: the same as on the CPU now."""
    errors = []
    for device in ("cpu", "neuron"):
        with pytest.raises(Exception) as caught:  # noqa: PT011 - compared with the CPU's below
            case(device)
        errors.append((type(caught.value), str(caught.value).splitlines()[0]))
    assert errors[1] == errors[0]


class _Scale(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, to_host):
        ctx.to_host = to_host
        return x * 3

    @staticmethod
    def backward(ctx, grad):
        grad = grad * 3
        return (grad.cpu() if ctx.to_host else grad), None


def test_a_custom_functions_gradient_on_another_device_is_torchs_error():
    """A custom Function whose backward returns a CPU gradient for a neuron input: the engine does
    not check subclasses' devices, and the neuron leaf got a CPU ``.grad`` (the failure came at
    ``optimizer.step()``); torch's error at the backward now, as on CUDA. Right devices still train,
    through two custom Functions in a row."""
    x = torch.ones(3, device="neuron", requires_grad=True)
    with pytest.raises(RuntimeError, match="invalid gradient at index 0 - expected device neuron:0 but got cpu"):
        _Scale.apply(x * 2, True).sum().backward()
    _Scale.apply(_Scale.apply(x * 2, False), False).sum().backward()
    assert x.grad.device.type == "neuron" and x.grad.cpu().tolist() == [18.0] * 3
