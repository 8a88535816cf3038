"""``F.linear_cross_entropy`` with chunking ``options`` through the compile path
(``decompositions/losses.py``) against eager.

torch-mlir lowers neither chunked custom op. One compiled function (a compile costs seconds)
covers the three reductions, a bias, class weights, ignored targets (the default -100 and an
explicit class), every target ignored (a NaN mean) and an unbatched input; one training step
checks the gradients the scalar op precomputes in its forward.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch.nn import LinearCrossEntropyOptions

_CHUNKED = LinearCrossEntropyOptions(batch_chunk_size=3, allow_retain_graph=True)


def _losses(x: torch.Tensor, lw: torch.Tensor, bias: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
            ignored: torch.Tensor) -> dict[str, torch.Tensor]:
    out = {}
    explicit = torch.where(target < 0, 4, target)  # ignore_index=2 leaves -100 out of range
    for reduction in ("mean", "sum", "none"):
        out[reduction] = F.linear_cross_entropy(x, lw, target, reduction=reduction, options=_CHUNKED)
        out[f"{reduction}_bias_weight"] = F.linear_cross_entropy(
            x, lw, explicit, linear_bias=bias, weight=weight, reduction=reduction, ignore_index=2, options=_CHUNKED)
    out["all_ignored"] = F.linear_cross_entropy(x, lw, ignored, options=_CHUNKED)
    out["unbatched"] = F.linear_cross_entropy(x[0], lw, target[1], weight=weight, reduction="sum", options=_CHUNKED)
    return out


def _inputs() -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    x, lw = torch.randn(7, 5, generator=g), torch.randn(6, 5, generator=g)
    bias, weight = torch.randn(6, generator=g), torch.rand(6, generator=g)
    target = torch.tensor([0, 5, -100, 2, 3, 2, 1])
    return x, lw, bias, weight, target, torch.full((7,), -100)


def test_linear_cross_entropy_chunked():
    args = _inputs()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's note that it forces allow_retain_graph when compiling
        expected = _losses(*args)
        got = torch.compile(_losses, backend="neuron")(*args)
    assert expected["all_ignored"].isnan()
    for name, e in expected.items():
        torch.testing.assert_close(got[name], e, equal_nan=True, msg=lambda m, n=name: f"{n}: {m}")


def _step(x: torch.Tensor, lw: torch.Tensor, bias: torch.Tensor, weight: torch.Tensor,
          target: torch.Tensor) -> torch.Tensor:
    return F.linear_cross_entropy(x, lw, target.clamp(min=0), linear_bias=bias, weight=weight, ignore_index=2,
                                  options=_CHUNKED)


def test_linear_cross_entropy_chunked_gradients():
    """The scalar op's forward returns the gradients its backward scales: those are ours."""
    x, lw, bias, weight, target, _ = _inputs()

    def grads(fn):
        leaves = [t.clone().requires_grad_() for t in (x, lw, bias)]
        loss = fn(*leaves, weight, target)
        return loss, torch.autograd.grad(loss * 3.0, leaves)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected, got = grads(_step), grads(torch.compile(_step, backend="neuron"))
    torch.testing.assert_close(got, expected)


def _cross_entropies(x, probs, index, weight, x1, index1):
    out = {}
    for reduction in ("mean", "sum", "none"):
        out[f"probabilities_{reduction}"] = F.cross_entropy(x, probs, weight=weight, reduction=reduction)
        out[f"smoothed_{reduction}"] = F.cross_entropy(x, index, weight=weight, label_smoothing=0.1,
                                                       reduction=reduction)
        out[f"unbatched_{reduction}"] = F.cross_entropy(x1, index1, weight=weight, label_smoothing=0.1,
                                                        reduction=reduction)
    out["unbatched_probabilities"] = F.cross_entropy(x1, probs[0], weight=weight, label_smoothing=0.2)
    out["weighted_rows"] = (x * weight[None]).sum()  # a full sum of a product with a broadcast row
    return out


def test_cross_entropy_with_class_weights_compiles_for_small_and_unbatched_inputs():
    """Class weights with probabilities as targets (IREE took the weighted full sum of a [6, 5]
    product for a contraction: "'vector.contract' op invalid accumulator/result vector shape"),
    and an unbatched input with weights and label smoothing (torch-mlir: "'chlo.broadcast_select'
    op inferred type(s) 'tensor<i64>' are incompatible with ... 'tensor<1xi64>'"), with gradients."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 5, generator=g)
    probs = torch.softmax(torch.randn(6, 5, generator=g), 1)
    index = torch.tensor([0, 4, 2, 1, 3, 4])
    weight = torch.rand(5, generator=g) + 0.5
    x1, index1 = torch.randn(5, generator=g), torch.tensor(3)

    def total(x, x1, *rest):
        losses = _cross_entropies(x, *rest[:3], x1, rest[3])
        return losses, sum(v.sum() for v in losses.values())

    expected_x, expected_x1 = x.clone().requires_grad_(), x1.clone().requires_grad_()
    expected, expected_total = total(expected_x, expected_x1, probs, index, weight, index1)
    expected_total.backward()
    got_x, got_x1 = x.to("neuron").requires_grad_(), x1.to("neuron").requires_grad_()
    compiled = torch.compile(total, backend="neuron")
    got, got_total = compiled(got_x, got_x1, *(t.to("neuron") for t in (probs, index, weight, index1)))
    got_total.backward()
    for name, value in expected.items():
        torch.testing.assert_close(got[name].detach().cpu(), value.detach(), msg=name)
    torch.testing.assert_close(got_x.grad.cpu(), expected_x.grad)
    torch.testing.assert_close(got_x1.grad.cpu(), expected_x1.grad)


@pytest.mark.parametrize("mode", ["eager", "compiled"])
def test_a_class_index_out_of_range_raises_torchs_error(mode):
    """A target past the classes (or negative, not ``ignore_index``) raised the gather's "index 7
    is out of bounds for dimension 1 with size 5"; torch says "Target 7 is out of bounds.", an
    IndexError, for 1-d and spatial targets alike."""
    torch.manual_seed(0)
    loss = torch.compile(F.cross_entropy, backend="neuron") if mode == "compiled" else F.cross_entropy
    x, spatial = torch.randn(3, 5), torch.randn(2, 5, 3, 3)
    for rows, classes in ((4, 6), (5, 7), (6, 8)):  # other sizes first: the eager op's dynamic kernel
        logits, target = torch.randn(rows, classes), torch.randint(0, classes, (rows,))
        got = loss(logits.to("neuron"), target.to("neuron")).cpu()
        torch.testing.assert_close(got, F.cross_entropy(logits, target))
    for logits, target, bad in ((x, torch.tensor([1, 7, 2]), 7), (x, torch.tensor([1, -2, 2]), -2),
                                (spatial, torch.full((2, 3, 3), 5), 5)):
        with pytest.raises(IndexError, match=f"^Target {bad} is out of bounds.$"):
            loss(logits.to("neuron"), target.to("neuron")).cpu()
    ignored = torch.tensor([1, -100, 2])
    torch.testing.assert_close(loss(x.to("neuron"), ignored.to("neuron")).cpu(), F.cross_entropy(x, ignored))


def test_ctc_loss_of_device_tensors_takes_lengths_on_the_host():
    """CUDA's ctc_loss takes its lengths as host tensors; on neuron they were refused ("Expected all
    tensors to be on the same device ... neuron:0 and cpu"): a tensor subclass took torch's tensor
    route, whose ``loss / target_lengths`` mixed the devices."""
    torch.manual_seed(0)
    log_probs = torch.randn(6, 2, 5).log_softmax(2)
    targets, input_lengths, target_lengths = torch.tensor([[1, 2], [3, 3]]), torch.tensor([6, 5]), torch.tensor([2, 2])
    reference = log_probs.clone().requires_grad_()
    want = F.ctc_loss(reference, targets, input_lengths, target_lengths)
    want.backward()
    for lengths in ((input_lengths, target_lengths), (input_lengths.to("neuron"), target_lengths.to("neuron"))):
        leaf = log_probs.to("neuron").requires_grad_()
        got = F.ctc_loss(leaf, targets.to("neuron"), *lengths)
        got.backward()
        torch.testing.assert_close(got.cpu(), want.detach())
        torch.testing.assert_close(leaf.grad.cpu(), reference.grad)
