"""Ops that write into a copy of a tensor that other ops also read, against eager.

IREE 3.13 runs scatters, sorts and ``dynamic_update_slice`` in place, giving each one a copy of
its operand when that operand has other users. For an operand built from constants that IREE
does not hoist into a global (it hoists no bool tensor, nor one that would grow the module by
more than 1 MiB) the copies were lost (``_copy_shared_in_place_operands`` in
``torch_neuronx/compiler/stablehlo_scatter_fixups.py`` tells the story): two ``index_put`` into
``arange(6) == 0`` returned all False for the first and both updates in the second, and a
returned base came back with the updates in it. Each test compiles one function holding every
case for its dtype: ``index_put`` (also accumulating), ``scatter`` of a tensor and of a value,
``scatter_add``, ``scatter_reduce``, ``index_add``, ``index_copy``, ``index_fill``,
``masked_scatter``, ``slice_scatter``, ``select_scatter``, ``diagonal_scatter`` and a chain of
two writes whose middle is returned too, each applied to one base built from constants and one
computed from an input, both bases also returned; and a sort and two ``index_put`` of a small
base built from constants.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch_mlir import ir

from torch_neuronx.compiler import stablehlo_ir, stablehlo_scatter_fixups

aten = torch.ops.aten

#: Elements per base: a bool tensor is never hoisted (IREE hoists no sub-byte type); another is
#: not hoisted when it holds more than 1 MiB, which these sizes pass by 16 KiB.
_SIZES = {torch.bool: 4096, torch.int32: 266_240, torch.float32: 266_240, torch.int64: 135_168}
#: The value each case writes.
_VALUES: dict[torch.dtype, bool | int | float] = {
    torch.bool: True, torch.int32: -5, torch.float32: -1.5, torch.int64: 2**40}
_COLUMNS = 512
_SMALL = 6


def _constant_base(dtype: torch.dtype, n: int) -> torch.Tensor:
    """A base computed from constants alone (inside the graph, so not an input)."""
    ramp = torch.arange(n)
    if dtype == torch.bool:  # a comparison of the iota itself: ``ramp % 3 == 0`` hoists ``ramp % 3``
        return ramp < n // 3
    return ((ramp * 7) % 11).to(dtype) - 4


def _input_base(x: torch.Tensor) -> torch.Tensor:
    """A base computed from the input ``x``."""
    return ~x if x.dtype == torch.bool else x * 3


def _writes(base: torch.Tensor, i: torch.Tensor, j: torch.Tensor, value: bool | int | float) -> dict[str, torch.Tensor]:
    """Every write into a copy of ``base`` (each one reads ``base`` alongside the others), and ``base``."""
    n, dtype = base.shape[0], base.dtype
    scalar = torch.tensor(value, dtype=dtype)
    ramp = torch.arange(n)
    mask = ramp % 5 == 1
    chained = aten.index_put.default(base, [i], scalar)
    out = {
        "base": base,
        "index_put_i": aten.index_put.default(base, [i], scalar),
        "index_put_j": aten.index_put.default(base, [j], scalar),
        "chain_middle": chained,
        "chain_end": aten.index_put.default(chained, [j], ~scalar if dtype == torch.bool else scalar * 2),
        "scatter_src": base.scatter(0, i, torch.full(i.shape, value, dtype=dtype)),
        "scatter_value": base.scatter(0, j, value),
        "index_copy": base.index_copy(0, i, torch.full(i.shape, value, dtype=dtype)),
        "index_fill": base.index_fill(0, j, value),
        "masked_scatter": base.masked_scatter(mask, torch.full((n,), value, dtype=dtype)),
        "slice_scatter": base.slice_scatter(torch.full((8,), value, dtype=dtype), 0, 16, 24),
        "select_scatter": base.select_scatter(scalar, 0, 3),
        "diagonal_scatter": base.view(-1, _COLUMNS).diagonal_scatter(
            torch.full((min(n // _COLUMNS, _COLUMNS),), value, dtype=dtype)),
    }
    if dtype != torch.bool:
        ones = torch.ones(j.shape, dtype=dtype)
        out |= {
            "index_put_accumulate": aten.index_put.default(base, [j], scalar, True),
            "scatter_add": base.scatter_add(0, j, ones),
            "scatter_reduce": base.scatter_reduce(0, i, torch.full(i.shape, value, dtype=dtype), "amax"),
            "index_add": base.index_add(0, j, ones),
        }
    return out


def _program(value: bool | int | float) -> Callable[..., dict[str, torch.Tensor]]:
    """The compiled function's body: every write into a constant-built and an input-built base."""
    def program(x: torch.Tensor, i: torch.Tensor, j: torch.Tensor) -> dict[str, torch.Tensor]:
        constant = _writes(_constant_base(x.dtype, x.shape[0]), i, j, value)
        computed = _writes(_input_base(x), i, j, value)
        out = {f"constant_{k}": v for k, v in constant.items()} | {f"input_{k}": v for k, v in computed.items()}
        # A small base: IREE sorts in place too, but slowly (90 s for 266240 floats); for bool,
        # two index_put into it are the report's case.
        small = _constant_base(x.dtype, _SMALL)
        scalar = torch.tensor(value, dtype=x.dtype)
        out |= {"small": small, "small_sort": torch.sort(small).values,
                "small_a": aten.index_put.default(small, [i[:2] % _SMALL], scalar),
                "small_b": aten.index_put.default(small, [j[:1] % _SMALL], scalar)}
        return out
    return program


@pytest.mark.parametrize("dtype", list(_SIZES), ids=str)
def test_writes_into_a_shared_base_match_eager(dtype: torch.dtype) -> None:
    """Every case of :func:`_program` for ``dtype``, in one compiled graph, equals eager exactly."""
    n = _SIZES[dtype]
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 2, (n,), generator=g).bool() if dtype == torch.bool \
        else torch.randint(-50, 50, (n,), generator=g).to(dtype)
    i = torch.tensor([1, 2, n - 1, 700])
    j = torch.tensor([4, 2])
    program = _program(_VALUES[dtype])
    expected = program(x, i, j)
    got = torch.compile(program, backend="neuron")(x, i, j)
    wrong = [name for name in expected if not torch.equal(got[name], expected[name])]
    assert not wrong, f"differ from eager: {wrong}"


def _scatter(into: str) -> str:
    """A generic-form ``stablehlo.scatter`` of ``%u`` at ``%i`` into ``into``."""
    return ('"stablehlo.scatter"(' + into + ', %i, %u) ({\n'
            '    ^bb0(%p: tensor<f32>, %q: tensor<f32>):\n'
            '      "stablehlo.return"(%q) : (tensor<f32>) -> ()\n'
            '    }) {scatter_dimension_numbers = #stablehlo.scatter<inserted_window_dims = [0], '
            'scatter_dims_to_operand_dims = [0], index_vector_dim = 1>} '
            ': (tensor<6xf32>, tensor<1x1xi32>, tensor<1xf32>) -> tensor<6xf32>')


_SHARED = f"""
func.func @main(%x: tensor<6xf32>, %i: tensor<1x1xi32>, %u: tensor<1xf32>, %k: tensor<i32>)
    -> (tensor<6xf32>, tensor<6xf32>, tensor<6xf32>, tensor<6xf32>, tensor<6xf32>, tensor<6xf32>,
        tensor<6xf32>, tensor<6xf32>, tensor<6xf32>, tensor<6xf32>) {{
  %z = "stablehlo.constant"() {{value = dense<0.0> : tensor<6xf32>}} : () -> tensor<6xf32>
  %zs0 = {_scatter('%z')}
  %zs1 = {_scatter('%z')}
  %y = "stablehlo.add"(%x, %x) : (tensor<6xf32>, tensor<6xf32>) -> tensor<6xf32>
  %ys = {_scatter('%y')}
  %yd = "stablehlo.dynamic_update_slice"(%y, %u, %k) : (tensor<6xf32>, tensor<1xf32>, tensor<i32>) -> tensor<6xf32>
  %yo = "stablehlo.sort"(%y) ({{
    ^bb0(%p: tensor<f32>, %q: tensor<f32>):
      %c = "stablehlo.compare"(%p, %q) {{comparison_direction = #stablehlo<comparison_direction LT>}}
          : (tensor<f32>, tensor<f32>) -> tensor<i1>
      "stablehlo.return"(%c) : (tensor<i1>) -> ()
    }}) {{dimension = 0 : i64}} : (tensor<6xf32>) -> tensor<6xf32>
  %w = "stablehlo.multiply"(%x, %x) : (tensor<6xf32>, tensor<6xf32>) -> tensor<6xf32>
  %ws = {_scatter('%w')}
  %xs0 = {_scatter('%x')}
  %xs1 = {_scatter('%x')}
  return %zs0, %zs1, %ys, %yd, %yo, %y, %ws, %xs0, %xs1, %x : tensor<6xf32>, tensor<6xf32>, tensor<6xf32>,
      tensor<6xf32>, tensor<6xf32>, tensor<6xf32>, tensor<6xf32>, tensor<6xf32>, tensor<6xf32>, tensor<6xf32>
}}"""


def test_only_a_computed_tensor_with_other_users_goes_through_a_barrier() -> None:
    """The shared ``%y`` (scattered, updated, sorted, returned) gets one barrier that all its users
    read; the splat constant, the single-use ``%w`` and the argument ``%x`` get none."""
    context = ir.Context()
    context.allow_unregistered_dialects = True
    module = ir.Module.parse(_SHARED, context)
    stablehlo_scatter_fixups._copy_shared_in_place_operands(module)
    barriers = stablehlo_ir.ops_named(module, "stablehlo.optimization_barrier")
    assert len(barriers) == 1
    (barrier,) = barriers
    assert barrier.operands[0].owner.name == "stablehlo.add"
    assert len(list(barrier.operands[0].uses)) == 1  # the barrier; every other user reads its result
    assert sorted(use.owner.name for use in barrier.results[0].uses) == [
        "func.return", "stablehlo.dynamic_update_slice", "stablehlo.scatter", "stablehlo.sort"]


def _shift(x: torch.Tensor) -> torch.Tensor:
    y = x.clone()
    y[1:] = y[:-1].clone()
    return y


def _roll(x: torch.Tensor) -> torch.Tensor:
    y = x * 2
    last = y[-1].clone()
    y[1:] = y[:-1].clone()
    y[0] = last
    return y


_I = torch.tensor([1, 2, 3])


@pytest.mark.parametrize("fn", [
    _shift, _roll,
    lambda x: torch.slice_scatter(x, x[:-1], 0, 1),
    lambda x: x.index_copy(0, _I, x[:3]),
    lambda x: x.index_put((_I,), x[:3]),
    lambda x: x.index_put((_I,), x[:3] * 3, accumulate=True),
    lambda x: x.scatter(0, torch.tensor([4, 3, 2, 1, 0]), x),
    lambda x: x.scatter_add(0, torch.tensor([1, 2, 3, 4]), x[:4]),
    lambda x: x.index_add(0, _I, x[:3]),
], ids=["shift", "roll", "slice_scatter", "index_copy", "index_put", "index_put_accumulate", "scatter",
        "scatter_add", "index_add"])
def test_a_scatter_of_values_read_from_its_own_target_matches_eager(fn: Callable) -> None:
    """The updates are read from the tensor the scatter writes in place: they must be read first
    (fused into the scatter, the slice read elements already overwritten)."""
    x = torch.arange(1.0, 6.0)
    torch.testing.assert_close(torch.compile(fn, backend="neuron")(x), fn(x))
    rows = torch.arange(12.0).reshape(4, 3)
    torch.testing.assert_close(torch.compile(_shift, backend="neuron")(rows), _shift(rows))


def _own_elements(x: torch.Tensor, index: torch.Tensor) -> tuple[torch.Tensor, ...]:
    y = x * 10
    mask = y.cumsum(1) > 60  # HF's top-p filter: remove.scatter(1, sorted_indices, remove)
    return (y.scatter(1, index, y), y.scatter(1, index, y.clone()), y.scatter_add(1, index, y),
            y.index_copy(1, index[0], y), y.index_add(1, index[0], y.neg().neg()),
            y.scatter(1, index, y.view(torch.int32).view(torch.float32)), mask.scatter(1, index, mask))


def test_a_scatter_of_its_targets_own_elements_computed_in_the_graph_matches_eager() -> None:
    """``y.scatter(1, index, y)`` of a ``y`` computed in the graph: IREE folded the updates (an
    identity slice, a clone, a bitcast pair, a double negation) into ``y``'s buffer, which the
    scatter overwrote as it read it: [20, 30, 10, 10] for [20, 30, 40, 10], and transformers'
    top-p filter masked every token."""
    x = torch.tensor([[1.0, 2.0, 3.0, 4.0], [4.0, 3.0, 2.0, 1.0]])
    index = torch.tensor([[3, 0, 1, 2], [3, 0, 1, 2]])
    for got, expected in zip(torch.compile(_own_elements, backend="neuron")(x, index), _own_elements(x, index),
                             strict=True):
        assert torch.equal(got, expected), (got, expected)


_ELEMENT_TYPES = (torch.uint8, torch.int8, torch.int16, torch.int64, torch.bool, torch.bfloat16, torch.float16,
                  torch.float64)


def _own_elements_of_every_type(x: torch.Tensor, index: torch.Tensor) -> tuple[torch.Tensor, ...]:
    ys = [(x * 10).to(dtype) for dtype in _ELEMENT_TYPES]
    return tuple(y.scatter(1, index, y) for y in ys) + tuple(y.index_copy(1, index[0], y) for y in ys)


def test_a_scatter_of_its_targets_own_elements_compiles_for_every_element_type() -> None:
    """The copy that keeps a scatter's updates apart from its target must compile for every element
    type: IREE cannot reverse an unsigned tensor, so an in-place ``add_`` through a ``uint8`` view
    of an ``int16`` tensor failed to compile ("failed to legalize operation 'linalg.generic'")."""
    x = torch.tensor([[1.0, 2.0, 3.0, 4.0], [4.0, 3.0, 2.0, 1.0]])
    index = torch.tensor([[3, 0, 1, 2], [3, 0, 1, 2]])
    got = torch.compile(_own_elements_of_every_type, backend="neuron")(x, index)
    for g, expected in zip(got, _own_elements_of_every_type(x, index), strict=True):
        assert g.dtype == expected.dtype and torch.equal(g, expected), (g, expected)
