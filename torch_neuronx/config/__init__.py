"""The single registry of every environment variable torch_neuronx reads.

Each :class:`Var` entry holds a variable's whole behaviour: type, documented
default, description and whether its feature is built yet. Everything else in the
package reads configuration through :func:`get`; nothing calls ``os.environ`` for
these names directly. Which modules read a variable is derived from the source
(:mod:`~torch_neuronx.config.readers`), not written in the table.

Parsing is typed and forgiving, as the specification asks: a malformed value
logs one warning naming the variable, the bad value and what is accepted, and
the default is used (a ``strict`` variable, whose specification accepts only its listed
values, raises :class:`InvalidVariableError` instead). Values set programmatically (``CompileOptions``) take
precedence over the environment through :func:`override`.

The package's modules:

* :mod:`~torch_neuronx.config.parsers`: ``ConfigValueError`` and the ``parse_*`` functions;
* :mod:`~torch_neuronx.config.registry`: :class:`Var`, the override stack, :func:`lookup`, :func:`get`;
* :mod:`~torch_neuronx.config.table`: the variable table (registered on import);
* :mod:`~torch_neuronx.config.directories`: a path variable's directory, created, or its default;
* :mod:`~torch_neuronx.config.readers`: the modules reading each variable, found with :mod:`ast`;
* :mod:`~torch_neuronx.config.render`: the value table, ``docs/environment.md`` and :func:`main`.

``python -m torch_neuronx.config`` (``__main__.py``) prints every variable's effective value and
where it came from; ``python -m torch_neuronx.config --markdown`` renders
``docs/environment.md``.
"""

from __future__ import annotations

from torch_neuronx.config import table as _table  # noqa: F401  (registers every variable)
from torch_neuronx.config.parsers import (
    ConfigValueError,
    InvalidVariableError,
    parse_bool,
    parse_csv,
    parse_device_list,
    parse_int,
    parse_log_level,
    parse_non_negative_int,
    parse_only_one_enables,
    parse_path,
    parse_str,
    parse_strict_01,
)
from torch_neuronx.config.registry import (  # noqa: F401  (the private names: tests and tools use them)
    _REGISTRY,
    Var,
    _environ,
    _overrides,
    _parsed,
    _warned,
    get,
    lookup,
    overridden,
    override,
    register,
    var,
    variables,
)
from torch_neuronx.config.render import main, render_markdown, render_table

__all__ = [
    "ConfigValueError",
    "InvalidVariableError",
    "Var",
    "get",
    "lookup",
    "main",
    "overridden",
    "override",
    "parse_bool",
    "parse_csv",
    "parse_device_list",
    "parse_int",
    "parse_log_level",
    "parse_non_negative_int",
    "parse_only_one_enables",
    "parse_path",
    "parse_str",
    "parse_strict_01",
    "render_markdown",
    "render_table",
    "var",
    "variables",
]
