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


def private_crossings() -> list[str]:
    """`from kstore.x import _y`, and `obj._y` where `_y` is not defined in the module itself.
    Compiled modules (kstore._core and friends) are the package's own internals: importing them
    is allowed, reaching for their underscored names is not."""
    found = []
    for mod, path in sorted(modules().items()):
        tree = ast.parse(open(path).read(), path)
        own = _defined_privates(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("kstore"):
                for a in node.names:
                    if _private(a.name) and not (node.module == "kstore" and a.name.startswith("_c")):
                        found.append(f"{mod}:{node.lineno}: imports {node.module}.{a.name}")
            elif isinstance(node, ast.Attribute) and _private(node.attr) and node.attr not in own:
                if not (isinstance(node.value, ast.Name) and node.value.id in SELF_NAMES):
                    found.append(f"{mod}:{node.lineno}: uses .{node.attr} defined elsewhere")
    return found


def oversized(limit: int = MAX_LINES) -> list[str]:
    out = []
    for mod, path in sorted(modules().items()):
        n = sum(1 for _ in open(path))
        if n > limit:
            out.append(f"{mod}: {n} lines")
    return out


def import_cycles() -> list[list[str]]:
    """Cycles among module-level imports (imports inside functions are deferred, so not counted)."""
    mods = modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        tree = ast.parse(open(path).read(), path)
        pkg = mod if path.endswith("__init__.py") else mod.rpartition(".")[0]
        for node in tree.body:
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = pkg.split(".")
                    base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
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
