"""FX graph → raw torch dialect → StableHLO, through torch-mlir's FX importer.

Each step returns text for the artifact tree. Failures become
:class:`NeuronCompileError` with stage ``import`` (the FX importer rejected the
graph) or ``lowering`` (torch dialect → StableHLO failed), naming the op when
the message identifies one.
"""

from __future__ import annotations

import dataclasses

import torch

from torch_neuronx.compiler import torch_to_stablehlo
from torch_neuronx.compiler.errors import NeuronCompileError


@dataclasses.dataclass
class Lowered:
    """The two textual forms of one graph; ``stablehlo`` is what the compiler consumes (in ``dialect``:
    StableHLO, or linalg-on-tensors for dynamic-shape kernels)."""

    raw: str
    stablehlo: str
    dialect: str = "stablehlo"


_asm = torch_to_stablehlo.asm
op_from_message = torch_to_stablehlo.op_from_message
parse_raw = torch_to_stablehlo.parse_raw


def import_raw(gm: torch.fx.GraphModule, func_name: str = "main") -> object:
    """Import a stateless FX graph (parameters already lifted to inputs) as the raw torch dialect."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch_mlir import fx as tmfx

    _sums_as_additions(gm)
    try:
        # aot_autograd calls compilers under its fake mode, but tensor constants are real: the
        # importer converts bool ones (.to(uint8)), which a fake mode refuses on real tensors.
        with unset_fake_temporarily():
            return tmfx.stateless_fx_import(gm, output_type="raw", model_name=func_name)
    except Exception as exc:  # torch-mlir raises many types; all mean "cannot import"
        message = f"{type(exc).__name__}: {exc}"
        op = op_from_message(message)
        higher_order = _higher_order_ops(gm)
        if op is None and higher_order:  # (a subgraph the importer cannot follow: "KeyError: 1401...")
            op = higher_order[0]
            message += (f" (the graph holds the higher-order op{'s' if len(higher_order) > 1 else ''} "
                        f"{', '.join(higher_order)}, which the neuron compiler cannot import)")
        raise NeuronCompileError("import", f"torch-mlir could not import the FX graph: {message}", op=op) from exc


def _sums_as_additions(gm: torch.fx.GraphModule) -> None:
    """Rewrite ``torch.sym_sum([a, b, ...])`` of symbolic sizes as ``a + b + ...``: torch-mlir's
    importer knows ``operator.add`` of sizes but not ``sym_sum`` ("Unimplemented call_function"),
    which a dynamic trace emits for ``torch.arange(k.shape[1])`` of a key-value cache grown by one
    token: such a decode step compiled one NEFF per token instead of one for all."""
    import operator

    changed = False
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not torch.sym_sum or len(node.args) != 1:
            continue
        terms = list(node.args[0])
        if not terms:
            continue
        with gm.graph.inserting_before(node):
            total = terms[0]
            for term in terms[1:]:
                total = gm.graph.call_function(operator.add, (total, term))
                total.meta.update(node.meta)
        node.replace_all_uses_with(total)
        gm.graph.erase_node(node)
        changed = True
    if changed:
        gm.recompile()


def _higher_order_ops(gm: torch.fx.GraphModule) -> list[str]:
    """The names of the higher-order ops ``gm`` calls (``flex_attention``, ``while_loop``), in order."""
    names = [node.target.name() for node in gm.graph.nodes
             if node.op == "call_function" and isinstance(node.target, torch._ops.HigherOrderOperator)]
    return list(dict.fromkeys(names))


def to_stablehlo(raw_module: object, dialect: str = "stablehlo") -> str:
    """Lower an imported raw torch-dialect module to StableHLO (or ``dialect``) text, in this process
    (mutates the module)."""
    try:
        return torch_to_stablehlo.to_stablehlo(raw_module, dialect)
    except torch_to_stablehlo.LoweringError as exc:
        raise NeuronCompileError("lowering", exc.detail, op=exc.op) from exc


def lower(gm: torch.fx.GraphModule, func_name: str = "main", dialect: str = "stablehlo") -> Lowered:
    """Import and lower ``gm`` (to StableHLO, or to ``dialect``); the raw text is captured before
    lowering mutates the module.

    The lowering runs in a worker process (``lowering_worker``), where an abort of
    torch-mlir's C++ becomes a NeuronCompileError instead of the end of this process.
    """
    from torch_neuronx import config
    from torch_neuronx.compiler import lowering_worker

    in_worker = config.get("TORCH_NEURONX_LOWER_IN_SUBPROCESS")
    if in_worker:  # a first worker starts while this process imports the graph
        lowering_worker.prestart()
    module = import_raw(gm, func_name)
    raw = _asm(module)
    try:
        if in_worker:
            stablehlo = lowering_worker.to_stablehlo(raw, dialect)
        else:
            stablehlo = to_stablehlo(module, dialect)
    except NeuronCompileError as err:
        err.raw_text = raw  # type: ignore[attr-defined]  # for the torch_mlir_error artifact
        raise
    return Lowered(raw=raw, stablehlo=stablehlo, dialect=dialect)
