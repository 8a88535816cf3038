"""Rendering of the registry: the effective-values table and ``docs/environment.md``.

:func:`main` is ``python -m torch_neuronx.config`` (``__main__.py``); with ``--markdown`` it
prints the reference that ``make docs`` writes to ``docs/environment.md``. The modules
listed as reading each variable are derived from the source when the document is rendered
(:mod:`torch_neuronx.config.readers`).
"""

from __future__ import annotations

import logging
from typing import Any

from torch_neuronx.config.parsers import InvalidVariableError
from torch_neuronx.config.registry import Var, lookup, variables

_HEADER = [
    "# Environment variables",
    "",
    "Generated from `torch_neuronx/config/` by `python -m torch_neuronx.config --markdown`;",
    "do not edit by hand (a test fails when this file is stale). The modules that read each",
    "variable are found in the source, so moving a module makes this file stale too.",
    "",
    "Booleans accept 0/1/true/false/yes/no in any case unless the description says otherwise.",
    "A malformed value logs one warning naming the variable and the accepted values, and the",
    "default is used. `python -m torch_neuronx.config` prints the effective values.",
]
_COLUMNS = ["| Variable | Type | Default | Status | Read by | Description |", "| --- | --- | --- | --- | --- | --- |"]


def _fmt(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if value is None:
        return "(unset)"
    if isinstance(value, str) and value == "":
        return '""'
    return str(value)


def render_table() -> str:
    """Every variable's effective value and where it came from, as plain text."""
    rows = [("VARIABLE", "VALUE", "SOURCE")]
    for entry in variables():
        try:
            value, source = lookup(entry.name)
        except InvalidVariableError as exc:  # a strict variable's bad value: shown, not a traceback
            rows.append((entry.name, "INVALID", str(exc)))
            continue
        rows.append((entry.name, _fmt(value), source))
    width = [max(len(r[i]) for r in rows) for i in range(2)]
    return "\n".join(f"{a:<{width[0]}}  {b:<{width[1]}}  {c}" for a, b, c in rows)


def _read_by(entry: Var, code: dict[str, tuple[str, ...]]) -> str:
    """The "Read by" cell: the package's modules that read ``entry``, then readers outside it."""
    names = [f"`{module}`" for module in code.get(entry.name, ())] + list(entry.external_readers)
    return ", ".join(names) or "(none)"


def _row(entry: Var, code: dict[str, tuple[str, ...]]) -> str:
    doc = entry.doc.replace("|", "\\|")
    return (f"| `{entry.name}` | {entry.type} | `{entry.documented_default()}` | {entry.status} | "
            f"{_read_by(entry, code)} | {doc} |")


def render_markdown() -> str:
    """``docs/environment.md``: the registry as the user-facing reference."""
    from torch_neuronx.config import readers  # parses the package's source: only when rendering

    code = readers.code_readers()
    lines = list(_HEADER)
    section = None
    for entry in variables():
        if entry.section != section:
            section = entry.section
            lines += ["", f"## {section}", "", *_COLUMNS]
        lines.append(_row(entry, code))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m torch_neuronx.config``."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m torch_neuronx.config",
                                     description="Show torch_neuronx configuration.")
    parser.add_argument("--markdown", action="store_true",
                        help="print the docs/environment.md reference instead")
    args = parser.parse_args(argv)
    logging.basicConfig(format="%(levelname)s %(name)s: %(message)s")
    if args.markdown:
        print(render_markdown(), end="")
        return 0
    table = render_table()
    print(table)
    return 1 if "  INVALID  " in table else 0  # a variable whose value is refused: shown, and a failure
