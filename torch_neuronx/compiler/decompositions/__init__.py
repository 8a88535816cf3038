"""The decomposition table the compile path traces with.

PyTorch's core ATen decompositions, a few more of PyTorch's own, and ours: ops
torch-mlir cannot lower (or lowers wrongly) rewritten in ops it lowers. Ours
live by subject in this package's modules, each exporting ``DECOMPOSITIONS``:

- :mod:`.general`: views and scatters torch-mlir does not lower, dropout, ``cdist``, and
  the decompositions taken from torch's own table.
- :mod:`.arithmetic`: ``remainder``, ``fmod``, rounding and bitwise ops, special values;
  :mod:`.shifts`: integer shifts.
- :mod:`.bools`: scatter-adds and clamps of bool tensors in int32 (torch saturates).
- :mod:`.clamps`: clamps of integers by float or int bounds (torch's conversions) and by tensor
  bounds of another dtype or shape.
- :mod:`.sorting`: sorts, ``topk``, medians and selections with torch's NaN and tie rules.
- :mod:`.moments`: ``var`` and ``std`` with any ``correction``.
- :mod:`.float64_exp_log`: float64 ``expm1``, ``log1p`` and the functions built on them, accurate near zero.
- :mod:`.batch_norm_sync`: ``nn.SyncBatchNorm``'s statistics kernels (CUDA-only in ATen).
- :mod:`.average_pooling`: 2-d average pooling and its backward.
- :mod:`.special`: ``lgamma``, ``digamma``, ``polygamma``, ``i0``/``i1`` and their scaled forms,
  ``frexp``, ``exp2``, ``kaiser_window``, and (written in :mod:`.erf`) ``erfc``, ``erfcx``,
  ``erfinv``; :mod:`.cephes` holds the polynomial helpers they share.
- :mod:`.spectral`: ``torch.fft`` as DFT matrix products; :mod:`.foreach`: the ``_foreach_*``
  ops; :mod:`.functional`: ``torch.nn.functional`` calls rewritten in the Dynamo graph
  (and the eager backwards of grid sampling and ``pdist`` as their pullbacks);
  :mod:`.sampling`: random ops as host draws; :mod:`.literals`: constants computed at trace time.
- :mod:`.attention`: the fast-path attention ops and every fused kernel of
  ``scaled_dot_product_attention`` (CPU flash, flash, memory-efficient, cuDNN,
  overrideable) with their backward ops, grouped-query attention included.
- :mod:`.convolution`: the backward of every convolution torch-mlir cannot train
  (grouped, dilated, 1-d, 3-d, transposed) and transposed convolutions with
  differing output paddings, in plain and transposed convolutions.
- :mod:`.pooling`: 3-d pooling, adaptive and 2-d max pooling (NaN and torch's indices
  kept); and :mod:`.max_pool_backward`: max pooling's backwards without a scatter (IREE's
  serial scatter dispatch put its fused producers on the stack).
- :mod:`.recurrent_layers`: whole LSTM/GRU/RNN layer stacks as one op each way (the eager
  device's route for ``nn.LSTM`` and its kin), traced through torch's decompositions.
- :mod:`.indexing`: ``index_add``, ``index_copy`` and ``index_fill`` with the index range
  checks of their eager kernels (torch's decompositions would change them), and ``put``.
- :mod:`.copies`: the ``*_copy`` view ops and ``new_empty_strided`` (torch's decompositions,
  which its core table leaves out), ``fmax`` and ``fmin``, ``as_strided_scatter``, ``unfold``.
- :mod:`.composites`: ``addmv``, ``dist``, ``_batch_norm_with_update``, real ``angle``, complex
  ``nan_to_num``, and the grid samplers called directly.
- :mod:`.quantization`: fake quantization per tensor and per channel (QAT), with its
  straight-through mask, as torch's CPU kernels compute it.
- :mod:`.histograms`: ``histogram`` and ``histogramdd`` (bin counts or bin tensors), as bin
  searches and an adding scatter.
- :mod:`.losses`: the chunked ``linear_cross_entropy`` custom ops, as a matmul and a cross entropy.
- :mod:`.segments`: ``segment_reduce`` over lengths or offsets, as a segmented scan.
- :mod:`.scans`: the cumulative ops as prefix scans, and ``logcumsumexp`` as a doubling scan
  of a stable ``logaddexp`` (torch-mlir's ``log(cumsum(exp(x)))`` overflows past 88.7 in float32).
- :mod:`.rnn`: the fused LSTM and GRU cells that recurrent layers run on the device.
- :mod:`.resampling`: bilinear and bicubic resizing (antialiased or not) and the 2-d
  backwards (nearest's too), as two matmuls with weights taken from torch's kernels at trace time.
- :mod:`.linalg`: LU, Cholesky and triangular solves, and ``inv``, ``solve``,
  ``det``, ``slogdet`` on them, unrolled over the matrix size; eager's error checks
  become host checks of extra outputs.
- :mod:`.orthogonal`: QR (Householder), ``eigh`` and SVD (Jacobi rotations).
- :mod:`.polynomials`: the orthogonal polynomials of ``torch.special`` (Chebyshev, Hermite, Laguerre, Legendre).
- :mod:`.bessel`: ``torch.special``'s Bessel functions (j0, j1, y0, y1, modified i0, i1, k0, k1, scaled, spherical).
- :mod:`.special_functions`: ``special.ndtri``, the Hurwitz ``special.zeta`` and ``nextafter``.
- :mod:`.incomplete_gamma`: ``igamma`` and ``igammac`` (``special.gammainc``, ``special.gammaincc``).
- :mod:`.summation`: ``sum``, ``mean`` and ``linalg_vector_norm`` over long dimensions as sums of
  short chunks (IREE accumulates along a dimension: a float32 sum of a million values was off by 1%).
- :mod:`.precision`: float16 and bfloat16 sums, means, scans, moments, normalizations,
  convolutions and bags computed in float32 and rounded once, as torch accumulates them
  (wraps every other decomposition of those ops).
- :mod:`.float64_math`: float64 sin, cos, tan, tanh, atan, asin, acos and atan2
  (IREE cannot link libm's), and float32 sin, cos and tan (IREE's lose accuracy with |x|);
  merged after general, so its atan2 wraps general's.
"""

from __future__ import annotations

import functools

import torch
from torch._decomp import core_aten_decompositions

from torch_neuronx.compiler.decompositions import (
    arithmetic,
    attention,
    average_pooling,
    batch_norm_sync,
    bessel,
    bools,
    clamps,
    composites,
    convolution,
    copies,
    float64_exp_log,
    float64_math,
    foreach,
    functional,
    general,
    histograms,
    incomplete_gamma,
    indexing,
    linalg,
    losses,
    max_pool_backward,
    moments,
    orthogonal,
    polynomials,
    pooling,
    precision,
    quantization,
    recurrent_layers,
    resampling,
    rnn,
    sampling,
    scans,
    scatter,
    segments,
    shifts,
    sorting,
    special,
    special_functions,
    spectral,
    summation,
)


def table() -> dict:
    """The decomposition table every compilation traces with."""
    # prims.fma exists only once torch._inductor is loaded (Dynamo loads it); its
    # decompositions then emit it.
    return _table(hasattr(torch.ops.prims, "fma"))


@functools.cache
def _table(with_fma: bool) -> dict:
    from torch._decomp import get_decompositions

    extra = {torch.ops.prims.fma.default: arithmetic.fma} if with_fma else {}
    ours = bools.wrapped({**core_aten_decompositions(), **get_decompositions(list(general.FROM_TORCH)),
            **general.DECOMPOSITIONS, **arithmetic.DECOMPOSITIONS, **shifts.DECOMPOSITIONS, **clamps.DECOMPOSITIONS,
            **sorting.DECOMPOSITIONS,
            **moments.DECOMPOSITIONS, **summation.DECOMPOSITIONS, **average_pooling.DECOMPOSITIONS,
            **batch_norm_sync.DECOMPOSITIONS,
            **attention.DECOMPOSITIONS,
            **special.DECOMPOSITIONS,
            **pooling.DECOMPOSITIONS,
            **max_pool_backward.DECOMPOSITIONS,
            **spectral.DECOMPOSITIONS, **scatter.DECOMPOSITIONS, **foreach.DECOMPOSITIONS,
            **sampling.DECOMPOSITIONS, **convolution.DECOMPOSITIONS, **resampling.DECOMPOSITIONS,
            **scans.DECOMPOSITIONS,
            **rnn.DECOMPOSITIONS, **recurrent_layers.DECOMPOSITIONS, **indexing.DECOMPOSITIONS, **copies.DECOMPOSITIONS,
            **composites.DECOMPOSITIONS, **functional.DECOMPOSITIONS, **quantization.DECOMPOSITIONS,
            **linalg.DECOMPOSITIONS,
            **segments.DECOMPOSITIONS, **histograms.DECOMPOSITIONS, **losses.DECOMPOSITIONS,
            **orthogonal.DECOMPOSITIONS, **polynomials.DECOMPOSITIONS, **bessel.DECOMPOSITIONS,
            **special_functions.DECOMPOSITIONS, **incomplete_gamma.DECOMPOSITIONS,
            **float64_math.DECOMPOSITIONS, **float64_exp_log.DECOMPOSITIONS, **extra})
    return precision.wrapped(ours)
