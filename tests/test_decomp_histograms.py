"""``torch.histogram`` and ``torch.histogramdd`` through the compile path
(``decompositions/histograms.py``) against eager.

torch-mlir lowers none of the histogram ops. One compiled function (a compile costs seconds)
covers bin counts and bin tensors, weights and density, the data's own extent, an explicit
``range`` with values outside it, on its edges and NaN, the last bin's closed right edge, an
empty extent (all values equal: widened by 0.5 each way) and histogramdd over two and three
dimensions. float32 is eager's bit for bit but for densities (a sum of weights, whose order in
eager depends on the host's vector width: two ulps); float64 bin edges of the data's extent round
twice (eager fuses each multiply-add): one ulp.
"""

from __future__ import annotations

import pytest
import torch

_NAN = float("nan")


def _histograms(x: torch.Tensor, w: torch.Tensor, same: torch.Tensor, edges: torch.Tensor, points: torch.Tensor,
                pw: torch.Tensor, e0: torch.Tensor, e1: torch.Tensor) -> dict[str, torch.Tensor]:
    out = {}
    out["own"], out["own_edges"] = torch.histogram(x[:-1], 7)  # the extent: min and max land in bins
    out["weighted_density"], _ = torch.histogram(x[:-1], 5, weight=w[:-1], density=True)
    out["range"], out["range_edges"] = torch.histogram(x, 4, range=(-1.0, 1.0), weight=w)  # NaN skipped
    out["same"], out["same_edges"] = torch.histogram(same, 3)
    out["tensor_bins"], _ = torch.histogram(x, edges, weight=w)
    out["tensor_density"], _ = torch.histogram(x, edges, density=True)
    dd = torch.histogramdd(points, [3, 4], weight=pw, density=True)
    out["dd"], out["dd_edge0"], out["dd_edge1"] = dd.hist, *dd.bin_edges
    out["dd_range"] = torch.histogramdd(points, [2, 5], range=[-1.0, 1.0, 0.0, 2.0]).hist
    out["dd_tensors"] = torch.histogramdd(points, [e0, e1], weight=pw).hist
    return out


def _inputs(dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    x = torch.cat([torch.randn(40, generator=g, dtype=torch.float64),
                   torch.tensor([-1.0, 1.0, 0.5, 0.0, -1.5, 3.0, _NAN], dtype=torch.float64)]).to(dtype)
    w = torch.rand(x.shape, generator=g, dtype=torch.float64).to(dtype)
    same = torch.full((6,), 2.5, dtype=dtype)
    edges = torch.tensor([-1.5, -0.5, 0.0, 0.25, 1.0], dtype=dtype)  # -1.5, 0 and 1.0 in x: edges
    points = torch.randn(3, 10, 2, generator=g, dtype=torch.float64).to(dtype)
    points[0, 0] = torch.tensor([1.0, 2.0])  # the range's right edges: the last bins
    pw = torch.rand(3, 10, generator=g, dtype=torch.float64).to(dtype)
    e0 = torch.tensor([-2.0, -0.3, 0.0, 1.0], dtype=dtype)
    e1 = torch.tensor([-1.0, 1.0], dtype=dtype)
    return x, w, same, edges, points, pw, e0, e1


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_histograms(dtype):
    args = _inputs(dtype)
    expected = _histograms(*args)
    got = torch.compile(_histograms, backend="neuron")(*args)
    exact = dtype == torch.float32
    for name, e in expected.items():
        ulp = not exact and "edge" in name
        # Densities divide by a sum of weights, which eager's kernels add in an order that depends on
        # the host's vector width (an AVX-512 host differs from an AVX2 one in the last bit): two ulps.
        summed = exact and (name == "dd" or "density" in name)
        torch.testing.assert_close(got[name], e, rtol=4e-16 if ulp else 2.4e-7 if summed else 0,
                                   atol=0 if exact else 1e-15, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize("mode", ["eager", "compiled"])
def test_histc_of_a_range_torch_refuses_raises(mode):
    """With the data's own range (``min == max``) an inf or NaN in the data made a histogram where
    torch raises ("range of [1, inf] is not finite"); a given range must be finite and ordered."""
    def histc(x, low=0.0, high=0.0):
        return torch.histc(x, bins=4, min=low, max=high)

    run = torch.compile(histc, backend="neuron") if mode == "compiled" else histc
    for bad in (float("inf"), float("nan"), -float("inf")):
        x = torch.tensor([1.0, bad, 2.0])
        with pytest.raises(RuntimeError, match="histc: range of .* not finite"):
            histc(x)  # torch's own
        with pytest.raises(RuntimeError, match="histc: range of .* not finite"):
            run(x.to("neuron")).cpu()
        # A given range counts the finite values inside it, as torch's does
        torch.testing.assert_close(run(x.to("neuron"), 0.0, 3.0).cpu(), histc(x, 0.0, 3.0))
    with pytest.raises(RuntimeError, match="max must be larger than min"):
        run(torch.ones(3, device="neuron"), 3.0, 1.0)
