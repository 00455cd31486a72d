"""Static checks of kstore's module layout (issue 13): module sizes, private names used across
modules, module-level import cycles. Run as a script to list findings, or through test_layout.py."""
from __future__ import annotations

import ast
import os
import sys

PKG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "kstore")
MAX_LINES = 600
SELF_NAMES = {"self", "cls"}


def modules() -> dict[str, str]:
    """Dotted module name -> path, for every .py under kstore/."""
    out = {}
    for root, _dirs, files in os.walk(PKG):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(root, f)
                rel = os.path.relpath(path, os.path.dirname(PKG))[:-3].replace(os.sep, ".")
                out[rel[:-9] if rel.endswith(".__init__") else rel] = path
    return out


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def submodule_names() -> set[str]:
    """Base names of kstore's own modules, compiled ones included (`_core` from _core.pyx, .pyi or
    .so): a private *module* is the package's internals, so importing it or reaching it as an
    attribute (`kstore._core`) is no crossing; its underscored names are."""
    names: set[str] = set()
    for root, dirs, files in os.walk(PKG):
        names.update(d for d in dirs if os.path.exists(os.path.join(root, d, "__init__.py")))
        names.update(f.split(".", 1)[0] for f in files if f.endswith((".py", ".pyx", ".pyi", ".so")))
    return names


def _defined_privates(tree: ast.AST) -> set[str]:
    """Private names a module defines: functions, classes, attributes set on self/cls, globals."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.alias):
            names.add(node.asname or node.name)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
    return {n for n in names if _private(n)}


def _absolute(mod: str, path: str, node: ast.ImportFrom) -> str:
    """The absolute module an ImportFrom names (relative imports resolved against mod)."""
    base = node.module or ""
    if not node.level:
        return base
    pkg = mod if path.endswith("__init__.py") else mod.rpartition(".")[0]
    parts = pkg.split(".")
    return ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))


def _trees():
    for mod, path in sorted(modules().items()):
        with open(path) as f:
            yield mod, path, ast.parse(f.read(), path)


def private_imports() -> list[str]:
    """`from kstore.x import _y` (relative forms too): a module importing another's private name.
    Importing one of the package's own modules by its private name (`from kstore import _core`)
    is allowed."""
    found, subs = [], submodule_names()
    for mod, path, tree in _trees():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                target = _absolute(mod, path, node)
                if not (target == "kstore" or target.startswith("kstore.")):
                    continue
                for a in node.names:
                    if _private(a.name) and a.name not in subs:
                        found.append(f"{mod}:{node.lineno}: imports {target}.{a.name}")
    return found


def private_attribute_uses() -> list[str]:
    """`obj._y` where `_y` is defined nowhere in the module itself (and obj is not self/cls): a
    reach into another module's private state. A heuristic: a name defined in both modules
    passes, and `kstore._core` (a module of the package) is not a crossing."""
    found, subs = [], submodule_names()
    for mod, _path, tree in _trees():
        own = _defined_privates(tree) | subs
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and _private(node.attr) and node.attr not in own:
                if not (isinstance(node.value, ast.Name) and node.value.id in SELF_NAMES):
                    found.append(f"{mod}:{node.lineno}: uses .{node.attr} defined elsewhere")
    return found


def private_crossings() -> list[str]:
    """Both kinds of crossing: private names imported, private attributes used."""
    return private_imports() + private_attribute_uses()


def sources() -> dict[str, str]:
    """modules() plus the Cython sources (.pyx): the compiled core counts as modules too."""
    out = modules()
    for root, _dirs, files in os.walk(PKG):
        for f in files:
            if f.endswith(".pyx"):
                path = os.path.join(root, f)
                out[os.path.relpath(path, os.path.dirname(PKG)).replace(os.sep, ".")] = path
    return out


def oversized(limit: int = MAX_LINES) -> list[str]:
    """Modules (and .pyx sources) over limit lines."""
    out = []
    for mod, path in sorted(sources().items()):
        with open(path) as f:
            n = sum(1 for _ in f)
        if n > limit:
            out.append(f"{mod}: {n} lines")
    return out


def import_cycles() -> list[list[str]]:
    """Cycles among module-level imports (imports inside functions are deferred, so not counted)."""
    mods = modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path, tree in _trees():
        for node in tree.body:
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _absolute(mod, path, node)
                targets = [base] + [f"{base}.{a.name}" for a in node.names]
            for t in targets:
                while t and t not in mods:
                    t = t.rpartition(".")[0]
                if t and t != mod and not mod.startswith(t + "."):
                    graph[mod].add(t)
    cycles, seen = [], set()

    def visit(m: str, stack: list[str]) -> None:
        for n in sorted(graph[m]):
            if n in stack:
                cyc = stack[stack.index(n):]
                key = frozenset(cyc)
                if key not in seen:
                    seen.add(key)
                    cycles.append(cyc + [n])
            elif len(stack) < 40:
                visit(n, stack + [n])

    for m in sorted(graph):
        visit(m, [m])
    return cycles


if __name__ == "__main__":
    for line in oversized():
        print("oversized", line)
    for line in private_crossings():
        print("private", line)
    for c in import_cycles():
        print("cycle", " -> ".join(c))
    sys.exit(0)
