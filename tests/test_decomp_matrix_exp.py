"""``linalg.matrix_exp``'s accuracy through the compile path (``decompositions/linalg.py``).

Eager's float32 matrix exponential is itself only accurate to about 1e-6 of a matrix's largest
entry (OpInfo's matrices, uniform in [-9, 9], have 1-norms near 27 and entries up to 1e5): its
small entries, formed by cancellation, can be off the exact exponential by more than 1e-4 of
themselves (2.4e-3 in OpInfo's second sample, where the compiled value is off by 1.2e-4), and
eager on the transposed matrix (``exp(A^T)^T``) misses eager's at rtol 1e-4 in 2% of such
matrices. Both are therefore compared with the float64 exponential, per matrix relative to its largest
entry. The compiled one scales to a 1-norm of 3.01 (float32) or 1.09 (float64), where the
degree-18 Taylor polynomial is exact to rounding, as eager does; scaling to 1 instead spent one
squaring more on these matrices, which doubled their error. Measured on the 128 matrices below:
median 3.7e-7, max 2.9e-6 (scaled to 1: median 6.8e-7; eager: median 6.3e-7, max 4.5e-6).
"""

from __future__ import annotations

import torch
from torch.testing import make_tensor


def _relative_errors(got: torch.Tensor, exact: torch.Tensor) -> torch.Tensor:
    """Each matrix's largest error relative to its largest entry."""
    return (got.double() - exact).abs().amax((-2, -1)) / exact.abs().amax((-2, -1))


def test_matrix_exp_is_as_accurate_as_eager_on_large_norms():
    torch.manual_seed(0)
    large = make_tensor((128, 5, 5), dtype=torch.float32, device="cpu")  # as OpInfo's samples
    small = torch.randn(16, 5, 5, generator=torch.Generator().manual_seed(1)) * 0.3
    a = torch.cat([large, small])
    got = torch.compile(torch.linalg.matrix_exp, backend="neuron")(a)
    exact = torch.linalg.matrix_exp(a.double())
    ours, eager = _relative_errors(got, exact), _relative_errors(torch.linalg.matrix_exp(a), exact)
    assert ours[:128].median() < 0.7 * eager[:128].median() and ours[:128].max() < eager[:128].max()
    assert ours[128:].max() < 1e-6
