"""Which modules read each configuration variable, derived from the package's source.

The torch_neuronx sources are parsed with :mod:`ast` (never imported), so the answer
follows the code wherever its modules move. A module reads a variable when it has:

* ``config.get("NAME")``, ``config.lookup("NAME")`` or ``directories.directory("NAME")``,
  however the config package, its submodules or those functions are imported (``from torch_neuronx import config as c``,
  ``import torch_neuronx.config``, ``from torch_neuronx.config import get``, relative
  imports, imports inside functions);
* the name in a module-level string constant passed instead (``ENV = "NAME"`` then
  ``config.get(ENV)``, or ``other_module.ENV`` imported from another module);
* a call of a module-level helper function that passes one of its parameters on to a
  read (``def _flag(name): return config.get(name)`` then ``_flag("NAME")``);
* a direct environment read: ``os.environ.get("NAME")``, ``os.environ["NAME"]``,
  ``"NAME" in os.environ``, ``os.getenv("NAME")``.

The config package itself is not scanned. A read whose name cannot be resolved to a
string is reported with ``name=None`` so that tests can insist there are none.
"""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Iterable
from pathlib import Path

_CONFIG_PACKAGE = __package__ or "torch_neuronx.config"
_CONFIG_READS = frozenset({"get", "lookup", "directory"})
_ENVIRON = "os.environ"
_ENVIRON_READS = frozenset({"os.environ.get", "os.getenv"})


@dataclasses.dataclass(frozen=True)
class Read:
    """One read of a variable in the source."""

    name: str | None  # the variable; None when the argument is not a resolvable string
    module: str  # the reading module, relative to the package: "cache.store", "memory"
    path: Path
    line: int
    via: str  # "config" (config.get / config.lookup) or "environ" (os.environ)


def package_root() -> Path:
    """The directory of the torch_neuronx package (the parent of the config package)."""
    return Path(__file__).resolve().parent.parent


def module_name(path: Path, root: Path) -> str:
    """``root/cache/store.py`` -> ``cache.store``; a package's ``__init__.py`` -> the package."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts) or root.name


@dataclasses.dataclass
class _Module:
    """One parsed source file and the names its top level binds."""

    qualname: str  # "torch_neuronx.cache.store"
    short: str  # "cache.store"
    path: Path
    tree: ast.Module
    is_package: bool
    aliases: dict[str, str] = dataclasses.field(default_factory=dict)  # bound name -> qualified name
    toplevel: set[str] = dataclasses.field(default_factory=set)  # functions, classes, assigned names


def _load(path: Path, root: Path) -> _Module:
    short = module_name(path, root)
    qualname = root.name if short == root.name else f"{root.name}.{short}"
    tree = ast.parse(path.read_bytes(), filename=str(path))
    mod = _Module(qualname, short, path, tree, path.name == "__init__.py")
    _bind_imports(mod)
    _bind_toplevel(mod)
    return mod


def _import_base(mod: _Module, node: ast.ImportFrom) -> str:
    """The absolute module an ``ImportFrom`` imports from (relative imports resolved)."""
    if not node.level:
        return node.module or ""
    package = mod.qualname.split(".")
    if not mod.is_package:
        package.pop()
    base = package[: len(package) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def _bind_imports(mod: _Module) -> None:
    """Every import of the module, at any depth, as bound name -> qualified name."""
    for node in ast.walk(mod.tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    mod.aliases[alias.asname] = alias.name
                else:
                    head = alias.name.split(".")[0]
                    mod.aliases[head] = head
        elif isinstance(node, ast.ImportFrom):
            base = _import_base(mod, node)
            for alias in node.names:
                mod.aliases[alias.asname or alias.name] = f"{base}.{alias.name}"


def _bind_toplevel(mod: _Module) -> None:
    for node in mod.tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            mod.toplevel.add(node.name)
        for target in _assigned(node):
            mod.toplevel.add(target)


def _assigned(node: ast.stmt) -> Iterable[str]:
    """The plain names a top-level assignment binds."""
    if isinstance(node, ast.Assign):
        return [t.id for t in node.targets if isinstance(t, ast.Name)]
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
        return [node.target.id]
    return []


def _constants(mod: _Module) -> dict[str, str]:
    """The module's top-level string constants, by qualified name."""
    found = {}
    for node in mod.tree.body:
        value = getattr(node, "value", None)
        if isinstance(node, ast.Assign | ast.AnnAssign) and isinstance(value, ast.Constant):
            if isinstance(value.value, str):
                found.update({f"{mod.qualname}.{name}": value.value for name in _assigned(node)})
    return found


def _dotted(node: ast.expr, mod: _Module) -> str | None:
    """The qualified name an expression such as ``config.get`` stands for, if it is a name."""
    if isinstance(node, ast.Name):
        if node.id in mod.aliases:
            return mod.aliases[node.id]
        return f"{mod.qualname}.{node.id}" if node.id in mod.toplevel else node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value, mod)
        return None if base is None else f"{base}.{node.attr}"
    return None


def _is_config_read(qualname: str) -> bool:
    """``torch_neuronx.config.get``, ``torch_neuronx.config.registry.lookup``, ..."""
    owner, _, attr = qualname.rpartition(".")
    return attr in _CONFIG_READS and (owner == _CONFIG_PACKAGE or owner.startswith(_CONFIG_PACKAGE + "."))


_Param = tuple[int | None, str]  # position (None: keyword-only) and keyword of the argument naming the variable
_Reader = tuple[_Param, str]  # that argument, and how the read is made: "config" or "environ"


class _Visitor(ast.NodeVisitor):
    """Finds the reads of one module, and the helper functions that forward a parameter to one."""

    def __init__(self, mod: _Module, constants: dict[str, str], forwarders: dict[str, _Reader]) -> None:
        self.mod, self.constants, self.forwarders = mod, constants, forwarders
        self.scopes: list[ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda] = []
        self.reads: list[Read] = []
        self.found_forwarders: dict[str, _Reader] = {}

    def _reader(self, func: ast.expr) -> _Reader | None:
        """The argument naming the variable and the read's kind, when ``func`` reads one."""
        qualname = _dotted(func, self.mod)
        if qualname is None:
            return None
        if _is_config_read(qualname):
            return (0, "name"), "config"
        if qualname in _ENVIRON_READS:
            return (0, "key"), "environ"
        if qualname in self.forwarders:
            return self.forwarders[qualname]
        return None

    def _read(self, arg: ast.expr | None, node: ast.AST, via: str) -> None:
        if arg is None:
            return
        name = arg.value if isinstance(arg, ast.Constant) and isinstance(arg.value, str) else None
        if name is None:
            qualname = _dotted(arg, self.mod)
            name = self.constants.get(qualname) if qualname else None
        if name is None and self._forwards(arg, via):
            return
        self.reads.append(Read(name, self.mod.short, self.mod.path, node.lineno, via))

    def _forwards(self, arg: ast.expr, via: str) -> bool:
        """Whether ``arg`` is a parameter of the enclosing top-level function (a helper); record it."""
        func = self.scopes[-1] if self.scopes else None
        if not isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef) or func not in self.mod.tree.body:
            return False
        positional = [a.arg for a in (*func.args.posonlyargs, *func.args.args)]
        if not isinstance(arg, ast.Name):
            return False
        if arg.id in positional:
            param: _Param = (positional.index(arg.id), arg.id)
        elif arg.id in {a.arg for a in func.args.kwonlyargs}:
            param = (None, arg.id)
        else:
            return False
        self.found_forwarders[f"{self.mod.qualname}.{func.name}"] = (param, via)
        return True

    def _scoped(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> None:
        self.scopes.append(node)
        self.generic_visit(node)
        self.scopes.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _scoped

    def visit_Call(self, node: ast.Call) -> None:
        reader = self._reader(node.func)
        if reader is not None:
            (position, keyword), via = reader
            args = [a for a in node.args if not isinstance(a, ast.Starred)]
            by_keyword = {k.arg: k.value for k in node.keywords}
            arg = args[position] if position is not None and position < len(args) else by_keyword.get(keyword)
            self._read(arg, node, via)
        self.generic_visit(node)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        if isinstance(node.ctx, ast.Load) and _dotted(node.value, self.mod) == _ENVIRON:
            self._read(node.slice, node, "environ")
        self.generic_visit(node)

    def visit_Compare(self, node: ast.Compare) -> None:
        operands = [node.left, *node.comparators]
        for i, op in enumerate(node.ops):
            if isinstance(op, ast.In | ast.NotIn) and _dotted(operands[i + 1], self.mod) == _ENVIRON:
                self._read(operands[i], node, "environ")
        self.generic_visit(node)


def _sources(root: Path) -> list[Path]:
    """The package's Python files, the config package excluded."""
    config_dir = root.joinpath(*_CONFIG_PACKAGE.split(".")[1:])
    return sorted(p for p in root.rglob("*.py") if config_dir not in p.parents)


_scans: dict[Path, tuple[tuple[tuple[Path, int, int], ...], list[Read]]] = {}  # root -> (file stamps, reads)


def scan(root: Path | None = None) -> list[Read]:
    """Every read of a variable in the package at ``root`` (default: torch_neuronx itself).

    The answer is kept until a source file is added, removed or changed.
    """
    root = (root or package_root()).resolve()
    paths = _sources(root)
    stamps = tuple((p, p.stat().st_mtime_ns, p.stat().st_size) for p in paths)
    cached = _scans.get(root)
    if cached is None or cached[0] != stamps:
        cached = _scans[root] = stamps, _scan(root, paths)
    return list(cached[1])


def _scan(root: Path, paths: list[Path]) -> list[Read]:
    modules = [_load(path, root) for path in paths]
    constants = {k: v for mod in modules for k, v in _constants(mod).items()}
    forwarders: dict[str, _Reader] = {}
    while True:  # helpers of helpers: until no new forwarding function turns up
        visitors = [_Visitor(mod, constants, forwarders) for mod in modules]
        found: dict[str, _Reader] = {}
        for visitor in visitors:
            visitor.visit(visitor.mod.tree)
            found.update(visitor.found_forwarders)
        if found.keys() <= forwarders.keys():
            return [read for visitor in visitors for read in visitor.reads]
        forwarders.update(found)


def code_readers(reads: Iterable[Read] | None = None) -> dict[str, tuple[str, ...]]:
    """Variable name -> the modules that read it (sorted), from ``reads`` or a fresh :func:`scan`."""
    by_name: dict[str, set[str]] = {}
    for read in scan() if reads is None else reads:
        if read.name is not None:
            by_name.setdefault(read.name, set()).add(read.module)
    return {name: tuple(sorted(modules)) for name, modules in by_name.items()}
