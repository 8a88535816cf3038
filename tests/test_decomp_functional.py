"""Functional calls rewritten before aot_autograd (grid_sample 4-d and 5-d, pdist), compiled vs eager."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from torch_neuronx.compiler.decompositions import functional


def _check_every_padding(x: torch.Tensor, grid: torch.Tensor, mode: str) -> None:
    """``F.grid_sample`` in every padding and corner alignment, compiled vs eager, with the
    gradients of input and grid."""
    def fn(x, grid):
        return torch.stack([F.grid_sample(x, grid, mode=mode, padding_mode=padding, align_corners=corners)
                            for padding in ("zeros", "border", "reflection") for corners in (False, True)])

    _check_every_padding_of(fn, x, grid)


# bicubic's 16 taps per point and 3-d bilinear's 8 take one to two minutes each on two cores.
_SLOW = pytest.mark.slow


@pytest.mark.parametrize("mode", ["bilinear", "nearest", pytest.param("bicubic", marks=_SLOW)])
def test_grid_sample_every_padding_mode_forward_and_backward(mode):
    """Grid points inside, on the border of and outside the input; gradients for input and grid."""
    torch.manual_seed(0)
    x = torch.randn(2, 3, 7, 8, requires_grad=True)
    grid = (torch.rand(2, 5, 6, 2) * 2.4 - 1.2).requires_grad_()
    _check_every_padding(x, grid, mode)


@pytest.mark.parametrize("mode", [pytest.param("bilinear", marks=_SLOW), "nearest"])
def test_volumetric_grid_sample_every_padding_mode_forward_and_backward(mode):
    """5-d inputs (N, C, D, H, W): trilinear and nearest, every padding, both corner alignments."""
    torch.manual_seed(1)
    x = torch.randn(2, 2, 4, 5, 6, requires_grad=True)
    grid = (torch.rand(2, 3, 2, 4, 3) * 2.6 - 1.3).requires_grad_()
    _check_every_padding(x, grid, mode)


def test_spatial_transformer_trains_like_eager():
    torch.manual_seed(1)

    class STN(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.loc = torch.nn.Linear(3 * 8 * 8, 6)
            torch.nn.init.zeros_(self.loc.weight)
            self.loc.bias.data = torch.tensor([1.0, 0.1, 0.0, -0.1, 1.0, 0.0])

        def forward(self, x):
            theta = self.loc(x.flatten(1)).view(-1, 2, 3)
            grid = F.affine_grid(theta, list(x.shape), align_corners=False)
            return F.grid_sample(x, grid, align_corners=False)

    eager, compiled_model = STN(), STN()
    compiled_model.load_state_dict(eager.state_dict())
    compiled = torch.compile(compiled_model, backend="neuron")
    x = torch.randn(4, 3, 8, 8)
    for model in (eager, compiled):
        model(x).square().mean().backward()
    for (name, p), q in zip(eager.named_parameters(), compiled_model.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_substitution_copies_the_graph_and_leaves_dynamos_alone():
    graphs = []

    def capture(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    grid = torch.rand(1, 2, 2, 2)
    torch.compile(lambda x: F.grid_sample(x, grid, align_corners=True), backend=capture)(torch.randn(1, 1, 3, 3))
    gm = graphs[0]
    replaced = functional.substitute(gm)
    assert replaced is not gm
    targets = {n.target for n in gm.graph.nodes if n.op == "call_function"}
    assert F.grid_sample in targets and functional.grid_sample not in targets
    assert functional.grid_sample in {n.target for n in replaced.graph.nodes if n.op == "call_function"}
    x = torch.randn(1, 1, 3, 3)
    out = replaced(x, grid)
    out = out[0] if isinstance(out, tuple) else out
    torch.testing.assert_close(out, F.grid_sample(x, grid, align_corners=True))


def test_pdist_every_p_forward_and_backward():
    torch.manual_seed(2)
    x = torch.randn(6, 3, requires_grad=True)

    def fn(x):
        return torch.stack([F.pdist(x, p) for p in (2.0, 1.0, 3.0, float("inf"), 0.0)])

    expected = fn(x)
    weights = torch.randn_like(expected)
    expected_grad, = torch.autograd.grad((expected * weights).sum(), x)
    got = torch.compile(fn, backend="neuron")(x)
    got_grad, = torch.autograd.grad((got * weights).sum(), x)
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(got_grad, expected_grad)


def _on_the_device_matches_cpu(fn, *leaves, rtol=1e-5, atol=2e-5):
    """``fn`` and its gradients on the eager device (no op falls back to the CPU) against the CPU."""
    import warnings

    expected = fn(*leaves)
    weights = torch.randn_like(expected)
    expected_grads = torch.autograd.grad((expected * weights).sum(), leaves)
    moved = [t.detach().to("neuron").requires_grad_() for t in leaves]
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no CPU fallback
        got = fn(*moved)
        got_grads = torch.autograd.grad((got * weights.to("neuron")).sum(), moved)
    torch.testing.assert_close(got.cpu(), expected, rtol=rtol, atol=atol)
    for g, e in zip(got_grads, expected_grads, strict=True):
        torch.testing.assert_close(g.cpu(), e, rtol=1e-4, atol=5e-5)


@pytest.mark.parametrize("mode, paddings", [
    ("bilinear", ("border", "reflection")),  # clamp's backward formula is in-place
    pytest.param("nearest", ("zeros", "border", "reflection"), marks=_SLOW),
    pytest.param("bicubic", ("zeros", "border", "reflection"), marks=_SLOW),
])
def test_grid_sample_backward_runs_on_the_eager_device(mode, paddings):
    """``grid_sampler_2d_backward`` fell back to the CPU on the eager device (its pullback now runs
    there, clamp's in-place backward formula included)."""
    torch.manual_seed(1)
    x = torch.randn(1, 2, 5, 6, requires_grad=True)
    grid = (torch.rand(1, 4, 3, 2) * 2.4 - 1.2).requires_grad_()

    def fn(x, grid):
        return torch.stack([F.grid_sample(x, grid, mode=mode, padding_mode=padding, align_corners=False)
                            for padding in paddings])

    _on_the_device_matches_cpu(fn, x, grid)


def test_pdist_forward_and_backward_run_on_the_eager_device():
    torch.manual_seed(2)
    points = torch.randn(6, 4, requires_grad=True)
    _on_the_device_matches_cpu(lambda p: torch.stack([torch.pdist(p, q) for q in (2, 3.5)]), points)


@_SLOW
def test_volumetric_grid_sample_backward_runs_on_the_eager_device():
    torch.manual_seed(2)
    x = torch.randn(1, 2, 3, 4, 5, requires_grad=True)
    grid = (torch.rand(1, 2, 3, 2, 3) * 2.4 - 1.2).requires_grad_()
    _on_the_device_matches_cpu(lambda x, g: F.grid_sample(x, g, padding_mode="reflection", align_corners=False),
                               x, grid)


@pytest.mark.slow  # CI time: the padding-mode sweep covers gradients
def test_grid_points_on_pixels_and_edges_get_eagers_gradients():
    """An identity ``affine_grid`` puts grid points exactly on pixels and edges, where the
    gradient is one-sided: which side, and the clamp's gradient on the edge (0 in torch's kernels,
    1 in autograd's clamp), made the grid's gradient up to 9 off there, compiled and on the
    eager device (inductor's too)."""
    torch.manual_seed(0)
    x = torch.randn(1, 2, 3, 4, requires_grad=True)
    grids = [torch.cat([F.affine_grid(torch.eye(2, 3)[None], (1, 2, 5, 7), align_corners=corners),
                        torch.full((1, 1, 7, 2), 1.0), torch.full((1, 1, 7, 2), -1.0)], 1)
             for corners in (False, True)]
    grid = torch.cat(grids).requires_grad_()  # a batch of two grids; x is expanded to match
    combos = [(padding, corners) for padding in ("zeros", "border", "reflection") for corners in (False, True)]

    def fn(x, grid):
        return torch.stack([F.grid_sample(x.expand(2, -1, -1, -1), grid, padding_mode=padding, align_corners=c)
                            for padding, c in combos])

    _check_every_padding_of(fn, x, grid)
    _on_the_device_matches_cpu(lambda x, g: F.grid_sample(x.expand(2, -1, -1, -1), g, padding_mode="border",
                                                           align_corners=True), x, grid)


def _check_every_padding_of(fn, x, grid):
    expected = fn(x, grid)
    weights = torch.randn_like(expected)
    expected_grads = torch.autograd.grad((expected * weights).sum(), [x, grid])
    got = torch.compile(fn, backend="neuron")(x, grid)
    got_grads = torch.autograd.grad((got * weights).sum(), [x, grid])
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    for g, e in zip(got_grads, expected_grads, strict=True):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=5e-5)


def _non_finite_grid(dims: int, huge: float = 1e30) -> torch.Tensor:
    """Every combination of NaN, infinite, huge and ordinary coordinates (one grid point each)."""
    import itertools

    values = [float("nan"), float("inf"), -float("inf"), huge, -huge, 0.3, -1.0, 3.0]
    points = torch.tensor(list(itertools.product(values, repeat=dims)), dtype=torch.float32)
    return points.view(1, *[len(values)] * dims, dims)


@pytest.mark.slow  # CI time: the padding-mode sweep covers grid_sample
def test_grid_sample_of_non_finite_coordinates_matches_the_cpu_kernels():
    """A NaN or infinite grid point (a diverging spatial transformer) gives what torch's CPU kernels
    give: NaN with zeros padding in 2-d, the clamped edge pixel with border and reflection (0 in 2-d,
    the last one in 3-d), 0 outside in 3-d; huge coordinates reflect as the vectorized kernel does.
    Both gave 0 everywhere, compiled and on the eager device. (3-d reflects by ``fmod``, exact here
    only for quotients below 2**53: its huge coordinates stay within that.)"""
    torch.manual_seed(3)
    x2, g2 = torch.randn(1, 2, 4, 5), _non_finite_grid(2)
    x3 = torch.randn(1, 2, 3, 4, 5)
    g3 = _non_finite_grid(3, huge=1e9)[:, ::4]  # every fourth row: all eight values still in each coordinate

    def fn(x2, g2, x3, g3):
        flat = [F.grid_sample(x2, g2, mode=mode, padding_mode=padding, align_corners=corners).flatten()
                for mode in ("bilinear", "nearest") for padding in ("zeros", "border", "reflection")
                for corners in (False, True)]
        flat += [F.grid_sample(x3, g3, mode="nearest", padding_mode=padding, align_corners=corners).flatten()
                 for padding in ("zeros", "border", "reflection") for corners in (False, True)]
        return torch.cat(flat)

    expected = fn(x2, g2, x3, g3)
    assert expected.isnan().any() and not expected.isnan().all()
    compiled = torch.compile(fn, backend="neuron")(x2, g2, x3, g3)
    torch.testing.assert_close(compiled, expected, equal_nan=True)
    on_device = fn(*(t.to("neuron") for t in (x2, g2, x3, g3)))
    torch.testing.assert_close(on_device.cpu(), expected, equal_nan=True)


@_SLOW
def test_volumetric_bilinear_grid_sample_of_non_finite_coordinates_matches_the_cpu_kernel():
    torch.manual_seed(4)
    x3, g3 = torch.randn(1, 1, 3, 4, 5), _non_finite_grid(3, huge=1e9)[:, ::3]

    def fn(x3, g3):
        return torch.cat([F.grid_sample(x3, g3, padding_mode=padding, align_corners=False).flatten()
                          for padding in ("zeros", "border", "reflection")])

    expected = fn(x3, g3)
    torch.testing.assert_close(torch.compile(fn, backend="neuron")(x3, g3), expected, equal_nan=True)
