"""Bessel functions of ``torch.special`` (``bessel_j0``, ``bessel_j1``, ``bessel_y0``,
``bessel_y1``, ``modified_bessel_i0``, ``modified_bessel_i1``, ``modified_bessel_k0``,
``modified_bessel_k1``, their scaled ``k`` forms and ``spherical_bessel_j0``) as elementwise
arithmetic.

torch-mlir lowers none of them. Each follows torch's CPU kernel (``ATen/native/Math.h``,
from Cephes): the same rational and Chebyshev approximations on the same ranges, chosen
with ``where``, with the same special values (``-inf`` at 0 and NaN below it for ``y0``,
``y1``, ``k0``, ``k1``; NaN at infinities where ``cos`` and ``sin`` of them are). Computed in
the argument's dtype (integers and booleans in the default dtype, as torch promotes them).
Coefficients: Cephes Math Library (S. L. Moshier), 3-clause BSD, as torch holds them.

Measured on the compiled graphs against eager (|x| up to 630, both signs, the ranges' ends,
inf, NaN): float32 within 4e-7 relative (6e-8 absolute where j0, j1, y0, y1 cross zero past
5, where the asymptotic form cancels), float64 within 2.6e-15 relative. k0 and k1 below 1e-38
(x past ~85 in float32) are subnormal in eager, 0 here (the compiled code flushes them).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence

import torch

from torch_neuronx.compiler.decompositions.special import bessel_series, chbevl
from torch_neuronx.compiler.decompositions.special_functions import one_element_padded

aten = torch.ops.aten

_NAN, _INF = float("nan"), float("inf")
_TWO_OVER_PI = 0.636619772367581343075535053490057448
_SQRT_TWO_OVER_PI = 0.797884560802865355879892119868763737
_QUARTER_PI = 0.785398163397448309615660845819875721
_THREE_QUARTER_PI = 2.356194490192344928846982537459627163


def _floating(fn: Callable[[torch.Tensor], torch.Tensor]) -> Callable:
    """Run ``fn`` on float32 and float64 arguments, integers and booleans in the default dtype
    (one-element arguments padded, see :func:`.special_functions.one_element_padded`)."""

    @one_element_padded
    @functools.wraps(fn)
    def wrapper(x: torch.Tensor) -> torch.Tensor:
        if not x.is_floating_point() and not x.is_complex():
            x = x.to(torch.get_default_dtype())
        if x.dtype not in (torch.float32, torch.float64):
            return NotImplemented
        return fn(x)

    return wrapper


def _horner(z: torch.Tensor, coefficients: Sequence[float]) -> torch.Tensor:
    """``sum c_i z^(n - i)`` as torch's loops (``r = r * z + c``, from ``r = 0``)."""
    result = torch.full_like(z, coefficients[0])
    for c in coefficients[1:]:
        result = result * z + c
    return result


# ---------------------------------------------------------------------------------------------
# Bessel functions of the first and second kind, orders 0 and 1.

#: Asymptotic expansions past 5 (in 25 / x^2): modulus (P) and phase (Q) rationals, order 0.
_PP0 = (7.96936729297347051624e-04, 8.28352392107440799803e-02, 1.23953371646414299388e+00,
        5.44725003058768775090e+00, 8.74716500199817011941e+00, 5.30324038235394892183e+00,
        9.99999999999999997821e-01)
_PQ0 = (9.24408810558863637013e-04, 8.56288474354474431428e-02, 1.25352743901058953537e+00,
        5.47097740330417105182e+00, 8.76190883237069594232e+00, 5.30605288235394617618e+00,
        1.00000000000000000218e+00)
_QP0 = (-1.13663838898469149931e-02, -1.28252718670509318512e+00, -1.95539544257735972385e+01,
        -9.32060152123768231369e+01, -1.77681167980488050595e+02, -1.47077505154951170175e+02,
        -5.14105326766599330220e+01, -6.05014350600728481186e+00)
_QQ0 = (6.43178256118178023184e+01, 8.56430025976980587198e+02, 3.88240183605401609683e+03,
        7.24046774195652478189e+03, 5.93072701187316984827e+03, 2.06209331660327847417e+03,
        2.42005740240291393179e+02)
#: Order 1.
_PP1 = (7.62125616208173112003e-04, 7.31397056940917570436e-02, 1.12719608129684925192e+00,
        5.11207951146807644818e+00, 8.42404590141772420927e+00, 5.21451598682361504063e+00,
        1.00000000000000000254e+00)
_PQ1 = (5.71323128072548699714e-04, 6.88455908754495404082e-02, 1.10514232634061696926e+00,
        5.07386386128601488557e+00, 8.39985554327604159757e+00, 5.20982848682361821619e+00,
        9.99999999999999997461e-01)
_QP1 = (5.10862594750176621635e-02, 4.98213872951233449420e+00, 7.58238284132545283818e+01,
        3.66779609360150777800e+02, 7.10856304998926107277e+02, 5.97489612400613639965e+02,
        2.11688757100572135698e+02, 2.52070205858023719784e+01)
_QQ1 = (7.42373277035675149943e+01, 1.05644886038262816351e+03, 4.98641058337653607651e+03,
        9.56231892404756170795e+03, 7.99704160447350683650e+03, 2.82619278517639096600e+03,
        3.36093607810698293419e+02)
#: Rationals up to 5 (in x^2): j0 between its first two zeros' squares, j1, y0, y1.
_RP0 = (-4.79443220978201773821e+09, 1.95617491946556577543e+12, -2.49248344360967716204e+14,
        9.70862251047306323952e+15)
_RQ0 = (4.99563147152651017219e+02, 1.73785401676374683123e+05, 4.84409658339962045305e+07,
        1.11855537045356834862e+10, 2.11277520115489217587e+12, 3.10518229857422583814e+14,
        3.18121955943204943306e+16, 1.71086294081043136091e+18)
_RP1 = (-8.99971225705559398224e+08, 4.52228297998194034323e+11, -7.27494245221818276015e+13,
        3.68295732863852883286e+15)
_RQ1 = (6.20836478118054335476e+02, 2.56987256757748830383e+05, 8.35146791431949253037e+07,
        2.21511595479792499675e+10, 4.74914122079991414898e+12, 7.84369607876235854894e+14,
        8.95222336184627338078e+16, 5.32278620332680085395e+18)
_YP0 = (1.55924367855235737965e+04, -1.46639295903971606143e+07, 5.43526477051876500413e+09,
        -9.82136065717911466409e+11, 8.75906394395366999549e+13, -3.46628303384729719441e+15,
        4.42733268572569800351e+16, -1.84950800436986690637e+16)
_YQ0 = (1.04128353664259848412e+03, 6.26107330137134956842e+05, 2.68919633393814121987e+08,
        8.64002487103935000337e+10, 2.02979612750105546709e+13, 3.17157752842975028269e+15,
        2.50596256172653059228e+17)
_YP1 = (1.26320474790178026440e+09, -6.47355876379160291031e+11, 1.14509511541823727583e+14,
        -8.12770255501325109621e+15, 2.02439475713594898196e+17, -7.78877196265950026825e+17)
_YQ1 = (5.94301592346128195359e+02, 2.35564092943068577943e+05, 7.34811944459721705660e+07,
        1.87601316108706159478e+10, 3.88231277496238566008e+12, 6.20557727146953693363e+14,
        6.87141087355300489866e+16, 3.97270608116560655612e+18)
#: Squares of the first two zeros of j0 and of j1.
_J0_ZEROS = (5.78318596294678452118e+00, 3.04712623436620863991e+01)
_J1_ZEROS = (1.46819706421238932572e+01, 4.92184563216946036703e+01)


def _asymptotic(a: torch.Tensor, order: int, second_kind: bool) -> torch.Tensor:
    """The expansion past 5 of j (or y) of ``order`` at ``a > 5``, as torch writes it (order 0
    in ``25 / a^2``, order 1 in ``(5 / a) (5 / a)``)."""
    pp, pq, qp, qq = (_PP0, _PQ0, _QP0, _QQ0) if order == 0 else (_PP1, _PQ1, _QP1, _QQ1)
    z = 25.0 / (a * a) if order == 0 else (5.0 / a) * (5.0 / a)
    phase = a - (_QUARTER_PI if order == 0 else _THREE_QUARTER_PI)
    p = _horner(z, pp) / _horner(z, pq)
    q = 5.0 / a * (_horner(z, qp) / _horner(z, qq))
    if second_kind:
        value = p * torch.sin(phase) + q * torch.cos(phase)
    else:
        value = p * torch.cos(phase) - q * torch.sin(phase)
    return value * _SQRT_TWO_OVER_PI / torch.sqrt(a)


def _j0(x: torch.Tensor) -> torch.Tensor:
    a = x.abs()
    near = torch.clamp(a, max=5.0)
    z = near * near
    small = (z - _J0_ZEROS[0]) * (z - _J0_ZEROS[1]) * _horner(z, _RP0) / _horner(z, _RQ0)
    small = torch.where(a < 1e-5, 1.0 - a * a / 4.0, small)
    return torch.where(a <= 5, small, _asymptotic(torch.clamp(a, min=5.0), 0, False))


def _j1(x: torch.Tensor) -> torch.Tensor:
    a = x.abs()
    near = torch.clamp(a, max=5.0)
    z = near * near
    small = _horner(z, _RP1) / _horner(z, _RQ1) * near * (z - _J1_ZEROS[0]) * (z - _J1_ZEROS[1])
    out = torch.where(a <= 5, small, _asymptotic(torch.clamp(a, min=5.0), 1, False))
    return torch.where(x < 0, -out, out)


@_floating
def bessel_j0(x: torch.Tensor) -> torch.Tensor:
    """``aten.special_bessel_j0``: even; ``1 - x^2/4`` below 1e-5, a rational (its first two
    zeros factored out) up to 5, the asymptotic expansion past it."""
    return _j0(x)


@_floating
def bessel_j1(x: torch.Tensor) -> torch.Tensor:
    """``aten.special_bessel_j1``: odd; a rational up to 5, the asymptotic expansion past it."""
    return _j1(x)


@_floating
def bessel_y0(x: torch.Tensor) -> torch.Tensor:
    """``aten.special_bessel_y0``: ``-inf`` at 0, NaN below; ``R(x^2) + 2/pi log(x) j0(x)`` up to 5."""
    near = torch.clamp(x, min=1e-30, max=5.0)
    z = near * near
    small = _horner(z, _YP0) / _horner(z, _YQ0) + _TWO_OVER_PI * torch.log(near) * _j0(near)
    out = torch.where(x <= 5, small, _asymptotic(torch.clamp(x, min=5.0), 0, True))
    return torch.where(x == 0, -_INF, torch.where(x < 0, _NAN, out))


@_floating
def bessel_y1(x: torch.Tensor) -> torch.Tensor:
    """``aten.special_bessel_y1``: ``-inf`` at 0, NaN below; ``x R(x^2) + 2/pi (j1 log x - 1/x)`` up to 5."""
    near = torch.clamp(x, min=1e-30, max=5.0)
    z = near * near
    small = near * (_horner(z, _YP1) / _horner(z, _YQ1)) + _TWO_OVER_PI * (_j1(near) * torch.log(near) - 1.0 / near)
    out = torch.where(x <= 5, small, _asymptotic(torch.clamp(x, min=5.0), 1, True))
    return torch.where(x == 0, -_INF, torch.where(x < 0, _NAN, out))


# ---------------------------------------------------------------------------------------------
# Modified Bessel functions. i0 and i1 use the full Cephes tables in both dtypes (unlike
# special.i1, whose float32 kernel takes shorter ones).

#: Chebyshev coefficients of k0 + log(x/2) i0 on [0, 2] (in x^2 - 2), and of exp(x) sqrt(x) k0
#: on [2, inf) (in 8/x - 2).
_K0_A = (1.37446543561352307156e-16, 4.25981614279661018399e-14, 1.03496952576338420167e-11,
         1.90451637722020886025e-09, 2.53479107902614945675e-07, 2.28621210311945178607e-05,
         1.26461541144692592338e-03, 3.59799365153615016266e-02, 3.44289899924628486886e-01,
         -5.35327393233902768720e-01)
_K0_B = (5.30043377268626276149e-18, -1.64758043015242134646e-17, 5.21039150503902756861e-17,
         -1.67823109680541210385e-16, 5.51205597852431940784e-16, -1.84859337734377901440e-15,
         6.34007647740507060557e-15, -2.22751332699166985548e-14, 8.03289077536357521100e-14,
         -2.98009692317273043925e-13, 1.14034058820847496303e-12, -4.51459788337394416547e-12,
         1.85594911495471785253e-11, -7.95748924447710747776e-11, 3.57739728140030116597e-10,
         -1.69753450938905987466e-09, 8.57403401741422608519e-09, -4.66048989768794782956e-08,
         2.76681363944501510342e-07, -1.83175552271911948767e-06, 1.39498137188764993662e-05,
         -1.28495495816278026384e-04, 1.56988388573005337491e-03, -3.14481013119645005427e-02,
         2.44030308206595545468e+00)
#: The same for k1 (x k1 - x log(x/2) i1 on [0, 2]).
_K1_A = (-7.02386347938628759343e-18, -2.42744985051936593393e-15, -6.66690169419932900609e-13,
         -1.41148839263352776110e-10, -2.21338763073472585583e-08, -2.43340614156596823496e-06,
         -1.73028895751305206302e-04, -6.97572385963986435018e-03, -1.22611180822657148235e-01,
         -3.53155960776544875667e-01, 1.52530022733894777053e+00)
_K1_B = (-5.75674448366501715755e-18, 1.79405087314755922667e-17, -5.68946255844285935196e-17,
         1.83809354436663880070e-16, -6.05704724837331885336e-16, 2.03870316562433424052e-15,
         -7.01983709041831346144e-15, 2.47715442448130437068e-14, -8.97670518232499435011e-14,
         3.34841966607842919884e-13, -1.28917396095102890680e-12, 5.13963967348173025100e-12,
         -2.12996783842756842877e-11, 9.21831518760500529508e-11, -4.19035475934189648750e-10,
         2.01504975519703286596e-09, -1.03457624656780970260e-08, 5.74108412545004946722e-08,
         -3.50196060308781257119e-07, 2.40648494783721712015e-06, -1.93619797416608296024e-05,
         1.95215518471351631108e-04, -2.85781685962277938680e-03, 1.03923736576817238437e-01,
         2.72062619048444266945e+00)


def _i_scaled(a: torch.Tensor, order: int) -> torch.Tensor:
    """``exp(-a) i0(a)`` (``order`` 0) or ``exp(-a) i1(a)`` at ``a = |x|``: the Chebyshev series."""
    near, far = bessel_series(a, order, float32_tails=False)
    return torch.where(a <= 8, near * a if order else near, far / torch.sqrt(a))


@_floating
def modified_bessel_i0(x: torch.Tensor) -> torch.Tensor:
    """``aten.special_modified_bessel_i0``: ``exp(|x|)`` times Cephes' series."""
    a = x.abs()
    return torch.exp(a) * _i_scaled(a, 0)


@_floating
def modified_bessel_i1(x: torch.Tensor) -> torch.Tensor:
    """``aten.special_modified_bessel_i1``: odd; ``exp(|x|)`` times Cephes' series."""
    a = x.abs()
    out = torch.exp(a) * _i_scaled(a, 1)
    return torch.where(x < 0, -out, out)


def _k(x: torch.Tensor, order: int, scaled: bool) -> torch.Tensor:
    """k0 or k1 (times ``exp(x)`` when ``scaled``): inf at 0, NaN below, as torch's kernels."""
    near = torch.clamp(x, min=1e-30, max=2.0)
    half_log = torch.log(0.5 * near)
    if order == 0:
        small = chbevl(near * near - 2, _K0_A) - half_log * (torch.exp(near) * _i_scaled(near, 0))
        far_table = _K0_B
    else:
        small = half_log * (torch.exp(near) * _i_scaled(near, 1)) + chbevl(near * near - 2, _K1_A) / near
        far_table = _K1_B
    far_x = torch.clamp(x, min=2.0)
    far = chbevl(8.0 / far_x - 2, far_table) / torch.sqrt(far_x)
    if scaled:
        small = small * torch.exp(near)
    else:
        far = torch.exp(-far_x) * far
    out = torch.where(x <= 2, small, far)
    return torch.where(x == 0, _INF, torch.where(x < 0, _NAN, out))


@_floating
def modified_bessel_k0(x: torch.Tensor) -> torch.Tensor:
    """``aten.special_modified_bessel_k0``: Cephes' series on [0, 2] and past 2."""
    return _k(x, 0, False)


@_floating
def modified_bessel_k1(x: torch.Tensor) -> torch.Tensor:
    """``aten.special_modified_bessel_k1``: Cephes' series on [0, 2] and past 2."""
    return _k(x, 1, False)


@_floating
def scaled_modified_bessel_k0(x: torch.Tensor) -> torch.Tensor:
    """``aten.special_scaled_modified_bessel_k0``: ``exp(x) k0(x)``."""
    return _k(x, 0, True)


@_floating
def scaled_modified_bessel_k1(x: torch.Tensor) -> torch.Tensor:
    """``aten.special_scaled_modified_bessel_k1``: ``exp(x) k1(x)``."""
    return _k(x, 1, True)


#: 1 - x^2/6 + x^4/120 - ...: sin(x)/x near 0, to x^12 (torch's terms).
_SINC = tuple((-1) ** k / math.factorial(2 * k + 1) for k in range(7))[::-1]


@_floating
def spherical_bessel_j0(x: torch.Tensor) -> torch.Tensor:
    """``aten.special_spherical_bessel_j0``: ``sin(x) / x``, its Taylor series below 0.5, 0 at +-inf."""
    z = x * x
    series = _horner(z, _SINC)
    out = torch.where(x.abs() < 0.5, series, torch.sin(x) / x)
    return torch.where(torch.isinf(x), 0.0, out)


#: This module's decompositions, merged into the compile path's table.
DECOMPOSITIONS: dict[torch._ops.OpOverload, Callable] = {
    aten.special_bessel_j0.default: bessel_j0,
    aten.special_bessel_j1.default: bessel_j1,
    aten.special_bessel_y0.default: bessel_y0,
    aten.special_bessel_y1.default: bessel_y1,
    aten.special_modified_bessel_i0.default: modified_bessel_i0,
    aten.special_modified_bessel_i1.default: modified_bessel_i1,
    aten.special_modified_bessel_k0.default: modified_bessel_k0,
    aten.special_modified_bessel_k1.default: modified_bessel_k1,
    aten.special_scaled_modified_bessel_k0.default: scaled_modified_bessel_k0,
    aten.special_scaled_modified_bessel_k1.default: scaled_modified_bessel_k1,
    aten.special_spherical_bessel_j0.default: spherical_bessel_j0,
}
