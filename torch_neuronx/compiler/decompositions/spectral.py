"""torch.fft through DFT matrix products (complex results are split into real parts downstream).

Every ``torch.fft`` function reaches ATen as ``_fft_r2c``, ``_fft_c2r`` or
``_fft_c2c`` (padding and trimming by ``n``/``s`` happen before, in the
wrappers; their autograd formulas call the same three ops). Each is rewritten
here into one real matrix product per transformed dimension, on the complex
values' real form ``(..., 2)`` (``torch.view_as_real``'s layout): the dimension
is moved next to the trailing 2, the two are flattened into one axis of
interleaved (real, imaginary) pairs, and a real ``(2n_in, 2n_out)`` matrix
holding the DFT's cosines and sines does the complex arithmetic in one
``dot_general``. The only complex ops left are ``view_as_real`` of a complex
input and ``view_as_complex`` of a complex result, both of which the
``complex_to_real`` pass turns into nothing.

The matrices are graph constants, computed by torch at trace time in float64
(the angle index ``(j * k) mod n`` in exact integers, the angle reduced to
``[-π, π]`` before its one rounding) and cast once to the signal's dtype; they
enter the graph as ``torch.tensor`` data does (``lift_fresh_copy`` of a
literal), so IREE compiles no dispatch to build them and has no float64
``sin``/``cos`` to link. A transform of ``n`` points costs ``O(n²)`` (a dense
``(2n)²`` float matrix and product per dimension): meant for the sizes models
use (a few hundred to a couple of thousand points), not as a fast FFT.

The normalization argument of the three ops is ``0`` (none), ``1``
(``1/sqrt(n)``) or ``2`` (``1/n``), ``n`` being the product of the signal sizes
along the transformed dimensions (the output sizes for ``_fft_c2r``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from torch_neuronx.compiler.decompositions.literals import literal

aten = torch.ops.aten


def _scale(normalization: int, sizes: Sequence[int]) -> float:
    """The factor the ATen ``normalization`` code applies for signal ``sizes``."""
    n = math.prod(sizes)
    if normalization == 0 or n == 0:
        return 1.0
    if normalization == 1:
        return 1.0 / math.sqrt(n)
    if normalization == 2:
        return 1.0 / n
    raise ValueError(f"unknown FFT normalization code {normalization}")


def _cos_sin(n_in: int, n_out: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 ``cos`` and ``sin`` of ``2π j k / n`` for ``j < n_in``, ``k < n_out``: two ``(n_in, n_out)`` tables.

    ``j k mod n`` is exact integer arithmetic, mapped to ``(-n/2, n/2]`` so that the angle lies
    in ``[-π, π]`` and its one rounding is in float64.
    """
    j = torch.arange(n_in, dtype=torch.int64).unsqueeze(1)
    k = torch.arange(n_out, dtype=torch.int64).unsqueeze(0)
    m = torch.remainder(j * k, n)
    m = torch.where(2 * m > n, m - n, m)
    angle = m.to(torch.float64) * (2 * math.pi / n)
    return torch.cos(angle), torch.sin(angle)


def _scaled_by_m(n: int, cos_scale: float, sin_scale: float) -> torch.Tensor:
    """``(2, n)`` float64: ``cos_scale·cos`` and ``sin_scale·sin`` of ``2π m / n`` for ``m < n``
    (the values :func:`_cos_sin`'s tables take, each rounded once)."""
    m = torch.arange(n, dtype=torch.int64)
    m = torch.where(2 * m > n, m - n, m)
    angle = m.to(torch.float64) * (2 * math.pi / n)
    return torch.stack([torch.cos(angle) * cos_scale, torch.sin(angle) * sin_scale])


def _c2c_assemble(cos: torch.Tensor, sin: torch.Tensor, n: int, forward: bool, scale: float) -> torch.Tensor:
    from_re = torch.stack([cos, -sin], -1)  # (n, n, 2): real input → (re, im) output
    from_im = torch.stack([sin, cos], -1)  # imaginary input → (re, im) output
    return torch.stack([from_re, from_im], 1).reshape(2 * n, 2 * n)


def _c2c_matrix(n: int, forward: bool, scale: float) -> torch.Tensor:
    """The real ``(2n, 2n)`` matrix of an ``n``-point complex DFT on interleaved (re, im) pairs.

    Forward: ``(xr + i xi)(C - i S) = (xr C + xi S) + i (xi C - xr S)``; inverse flips ``S``.
    """
    cos, sin = _cos_sin(n, n, n)
    return _c2c_assemble(cos * scale, sin * (scale if forward else -scale), n, forward, scale)


def _r2c_assemble(cos: torch.Tensor, sin: torch.Tensor, n: int, n_out: int, scale: float) -> torch.Tensor:
    return torch.stack([cos, sin], -1).reshape(n, 2 * n_out)


def _r2c_matrix(n: int, n_out: int, scale: float) -> torch.Tensor:
    """The real ``(n, 2 n_out)`` matrix of a forward DFT of a real ``n``-point signal, first ``n_out`` bins."""
    cos, sin = _cos_sin(n, n_out, n)
    return _r2c_assemble(cos * scale, sin * -scale, n, n_out, scale)


def _c2r_weights(m: int, n: int, device: Any = None) -> torch.Tensor:
    """``w_k`` of :func:`_c2r_matrix` as an ``(m, 1)`` column of 0, 1 and 2."""
    k = torch.arange(m, dtype=torch.int64, device=device).unsqueeze(1)
    return torch.where((k == 0) | (2 * k == n), 1, torch.where(2 * k < n, 2, 0))


def _c2r_assemble(cos: torch.Tensor, sin: torch.Tensor, m: int, n: int, scale: float) -> torch.Tensor:
    weight = _c2r_weights(m, n, cos.device).to(cos.dtype)  # (0, 1 and 2: exact in any dtype)
    return torch.stack([cos * weight, -sin * weight], 1).reshape(2 * m, n)


def _c2r_matrix(m: int, n: int, scale: float) -> torch.Tensor:
    """The real ``(2m, n)`` matrix of an ``n``-point inverse DFT from ``m`` Hermitian-half bins.

    ``out[t] = Σ_k w_k (re_k cos θ - im_k sin θ)``, ``θ = 2π k t / n``, with ``w_k = 2`` for the
    bins whose mirror ``n - k`` is absent, ``1`` for DC and Nyquist (whose imaginary parts meet
    ``sin θ = 0``, so they are ignored as by pocketfft and cuFFT), ``0`` past Nyquist.
    """
    cos, sin = _cos_sin(m, n, n)
    return _c2r_assemble(cos * scale, sin * scale, m, n, scale)


# Per table builder: its shape, and for :func:`_gathered` its sizes and scaled values by ``m``.
_SHAPES: dict[Callable[..., torch.Tensor], Callable[..., tuple[int, int]]] = {
    _c2c_matrix: lambda n, forward, scale: (2 * n, 2 * n),
    _r2c_matrix: lambda n, n_out, scale: (n, 2 * n_out),
    _c2r_matrix: lambda m, n, scale: (2 * m, n),
}
_TABLES = {
    _c2c_matrix: lambda n, forward, scale: (n, n, n, lambda: _scaled_by_m(n, scale, scale if forward else -scale)),
    _r2c_matrix: lambda n, n_out, scale: (n, n_out, n, lambda: _scaled_by_m(n, scale, -scale)),
    _c2r_matrix: lambda m, n, scale: (m, n, n, lambda: _scaled_by_m(n, scale, scale)),
}
_ASSEMBLE = {_c2c_matrix: _c2c_assemble, _r2c_matrix: _r2c_assemble, _c2r_matrix: _c2r_assemble}


def _constant(build: Callable[..., torch.Tensor], *args: Any, like: torch.Tensor) -> torch.Tensor:
    """The table ``build(*args)``, computed now in float64 by torch, as a constant of the traced
    graph in ``like``'s dtype (see :mod:`.literals`): IREE compiles no dispatch for it.

    A table of more than :data:`LITERAL_ELEMENTS` elements is built in the graph instead
    (:func:`_gathered`): as a literal, a 4096-point transform's 256 MB table went through the
    importer, the lowering and the compiler as text, and the process ran out of memory (a
    2048-point one peaked at 8.4 GB). Built in the graph, it costs a gather of its elements per
    call (a 2048-point complex transform of 4 rows: 130 ms against torch's 0.05), but a
    4096-point one compiles in 7 s within 4 GB."""
    shape = _SHAPES[build](*args)
    if shape[0] * shape[1] > LITERAL_ELEMENTS:
        return _gathered(build, *args, like=like)
    return literal(lambda: build(*args).to(like.dtype), like.device)


#: The most elements a DFT table enters the graph with as a literal (16 MiB of float32: a
#: 1024-point complex transform's, which compiled in 7 s at a 2.5 GB peak).
LITERAL_ELEMENTS = 1 << 22


def _gathered(build: Callable[..., torch.Tensor], *args: Any, like: torch.Tensor) -> torch.Tensor:
    """The table ``build(*args)`` built in the graph with the very values of the literal: its
    cosines and sines take ``n`` values, ``cos``/``sin`` of ``2π m / n`` (in float64, scaled,
    cast once: a literal of ``O(n)``), gathered at ``(j k) mod n`` (exact integer arithmetic in
    the graph). IREE 3.13 does not hoist this out of the call: the gather runs on every call (the
    cost :func:`_constant` states)."""
    n_in, n_out, n, tables = _TABLES[build](*args)
    values = literal(lambda: tables().to(like.dtype), like.device)  # (2, n): scaled cos, sin by m
    j = torch.arange(n_in, device=like.device).unsqueeze(1)
    k = torch.arange(n_out, device=like.device).unsqueeze(0)
    m = torch.remainder(j * k, n)
    return _ASSEMBLE[build](values[0][m], values[1][m], *args)


def _apply_pairs(z: torch.Tensor, dim: int, matrix: torch.Tensor) -> torch.Tensor:
    """Transform the real form ``z`` (``(..., 2)``) along complex dimension ``dim`` by a ``(2n, 2n_out)`` matrix."""
    z = torch.movedim(z, dim, -2)
    batch = z.shape[:-2]
    out = torch.matmul(z.reshape(*batch, z.shape[-2] * 2), matrix)
    return torch.movedim(out.reshape(*batch, matrix.shape[1] // 2, 2), -2, dim)


def _real_form(x: torch.Tensor) -> torch.Tensor:
    """The complex tensor ``x`` as a real ``(..., 2)`` tensor."""
    return torch.view_as_real(x.resolve_conj())


def _complex_form(z: torch.Tensor) -> torch.Tensor:
    """The real ``(..., 2)`` tensor ``z`` as a complex tensor."""
    return torch.view_as_complex(z.contiguous())


def _c2c_steps(z: torch.Tensor, dims: Sequence[int], forward: bool, scale: float) -> torch.Tensor:
    """Complex DFTs of the real form ``z`` along complex dims ``dims``, ``scale`` applied once."""
    rank = z.dim() - 1
    for i, d in enumerate(dims):
        n = z.shape[d % rank]
        matrix = _constant(_c2c_matrix, n, forward, scale if i == len(dims) - 1 else 1.0, like=z)
        z = _apply_pairs(z, d % rank, matrix)
    return z


def fft_c2c(self: torch.Tensor, dim: Sequence[int], normalization: int, forward: bool) -> torch.Tensor:
    """``aten._fft_c2c``: complex-to-complex DFT along ``dim`` (``forward`` for ``e^{-iθ}``)."""
    if not dim:
        return self.clone()
    rank = self.dim()
    dims = [d % rank for d in dim]
    scale = _scale(normalization, [self.shape[d] for d in dims])
    return _complex_form(_c2c_steps(_real_form(self), dims, forward, scale))


def fft_r2c(self: torch.Tensor, dim: Sequence[int], normalization: int, onesided: bool) -> torch.Tensor:
    """``aten._fft_r2c``: forward DFT of a real tensor along ``dim``, the last of them halved if ``onesided``."""
    rank = self.dim()
    dims = [d % rank for d in dim]
    scale = _scale(normalization, [self.shape[d] for d in dims])
    if not dims:
        return torch.complex(self, torch.zeros_like(self))
    last = dims[-1]
    n = self.shape[last]
    n_out = n // 2 + 1 if onesided else n
    matrix = _constant(_r2c_matrix, n, n_out, scale if len(dims) == 1 else 1.0, like=self)
    x = torch.movedim(self, last, -1)
    z = torch.matmul(x, matrix)
    z = torch.movedim(z.reshape(*x.shape[:-1], n_out, 2), -2, last)
    z = _c2c_steps(z, dims[:-1], True, scale)
    return _complex_form(z)


def fft_c2r(self: torch.Tensor, dim: Sequence[int], normalization: int, last_dim_size: int) -> torch.Tensor:
    """``aten._fft_c2r``: inverse DFT to a real tensor, the last of ``dim`` from Hermitian-half bins.

    The last dim of ``self`` holds bins ``0 .. m-1`` of a ``last_dim_size``-point spectrum; the
    imaginary parts of the DC and (for even sizes) Nyquist bins are ignored, as by torch.
    """
    rank = self.dim()
    dims = [d % rank for d in dim]
    last = dims[-1]
    sizes = [self.shape[d] for d in dims[:-1]] + [last_dim_size]
    scale = _scale(normalization, sizes)
    z = _c2c_steps(_real_form(self), dims[:-1], False, 1.0)
    m = z.shape[last]
    matrix = _constant(_c2r_matrix, m, last_dim_size, scale, like=z)
    z = torch.movedim(z, last, -2)
    out = torch.matmul(z.reshape(*z.shape[:-2], 2 * m), matrix)
    return torch.movedim(out, -1, last)


def fftfreq(n: int, d: float = 1.0, *, dtype=None, layout=None, device=None, pin_memory=None) -> torch.Tensor:
    """``aten.fft_fftfreq`` as ATen computes it: ``arange(n)``, its upper half less ``n``, times
    ``1 / (n d)`` (torch-mlir has no lowering of the factory)."""
    steps = torch.arange(n, dtype=dtype, device=device)
    steps = torch.where(torch.arange(n, device=device) >= (n + 1) // 2, steps - n, steps)
    return steps * (1.0 / (n * d))


def rfftfreq(n: int, d: float = 1.0, *, dtype=None, layout=None, device=None, pin_memory=None) -> torch.Tensor:
    """``aten.fft_rfftfreq`` as ATen computes it: ``arange(n // 2 + 1) * (1 / (n d))``."""
    return torch.arange(n // 2 + 1, dtype=dtype, device=device) * (1.0 / (n * d))


#: This module's decompositions, merged into the compile path's table.
DECOMPOSITIONS: dict[torch._ops.OpOverload, Callable] = {
    aten._fft_c2c.default: fft_c2c,
    aten._fft_r2c.default: fft_r2c,
    aten._fft_c2r.default: fft_c2r,
    aten.fft_fftfreq.default: fftfreq,
    aten.fft_rfftfreq.default: rfftfreq,
}
