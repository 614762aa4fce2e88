"""Fail when a module of tidyjax reads or writes another module's private names or another
class's private fields beyond the allow-list (issue 40: no module writes another's state).

A crossing is ``_mod._name`` (another module's private global), ``from ._mod import _name``,
or ``obj._field`` where no class of the reading module defines ``_field``. Each distinct
``module: name`` is listed once. The allow-list, ``.ci/private-crossings.txt``, is today's
debt: a crossing not in it fails, and so does an entry no longer found (delete the line), so
the list only shrinks. ``python .ci/private_crossings.py --write`` rewrites it.

Writes have no allow-list: a module assigning, deleting or mutating in place (``+=``,
``.append(...)``...) another class's private field fails the check whatever the list says.
"""

from __future__ import annotations

import ast
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "tidyjax"
ALLOWED = ROOT / ".ci" / "private-crossings.txt"
# Private names of the standard library and JAX that tidyjax may use (not tidyjax's own).
FOREIGN = {"_getframe", "_make", "_replace", "_asdict", "_fields", "_showtraceback",
           "_current_frames", "_arrays", "_base_array", "_trace", "_check_prng_key_data",
           "_filename_map", "_DummyThread"}  # fmt: skip


# Methods that change a container in place: ``obj._field.append(x)`` writes ``obj._field``.
MUTATORS = {"append", "extend", "insert", "pop", "remove", "clear", "add", "discard", "update",
            "setdefault", "popleft", "appendleft", "sort", "reverse"}  # fmt: skip


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _own_fields(tree: ast.AST) -> set[str]:
    """Private names a class of this module defines (self._x, slots, class body, methods)."""
    names: set[str] = set()
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        for item in ast.walk(cls):
            if isinstance(item, ast.Attribute) and isinstance(item.value, ast.Name):
                if item.value.id in ("self", "cls"):
                    names.add(item.attr)
            elif isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                names.add(item.name)
            elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                names.add(item.target.id)
            elif isinstance(item, ast.Assign):
                for t in item.targets:
                    if isinstance(t, ast.Name):
                        names.add(t.id)
                        if t.id == "__slots__" and isinstance(item.value, (ast.Tuple, ast.List)):
                            names.update(
                                e.value for e in item.value.elts if isinstance(e, ast.Constant)
                            )
    return {n for n in names if _private(n)}


def _written(tree: ast.AST) -> set[int]:
    """The ids of the attribute nodes ``tree`` writes: assigned, deleted, augmented, or the
    object of an in-place container method."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, (ast.Store, ast.Del)):
            out.add(id(node))
        elif isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Attribute):
            out.add(id(node.target))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in MUTATORS
            and isinstance(node.func.value, ast.Attribute)
        ):
            out.add(id(node.func.value))
    return out


def crossings(writes: list[str] | None = None, package: pathlib.Path = PACKAGE) -> set[str]:
    """Each ``module: crossing`` found in ``package``; each write of another class's private
    field is also added to ``writes`` as ``module:line: .field``."""
    files = sorted(package.rglob("*.py"))
    modules = {p.stem for p in files}
    out: set[str] = set()
    for path in files:
        tree = ast.parse(path.read_text(), str(path))
        own = _own_fields(tree)
        written = _written(tree)
        where = path.relative_to(package).as_posix()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level >= 1 and node.module:
                out.update(f"{where}: from .{node.module} import {a.name}"
                           for a in node.names if _private(a.name))  # fmt: skip
            elif isinstance(node, ast.Attribute) and _private(node.attr):
                value = node.value
                if isinstance(value, ast.Name) and value.id in ("self", "cls"):
                    continue
                if isinstance(value, ast.Name) and value.id in modules:
                    out.add(f"{where}: {value.id}.{node.attr}")
                elif node.attr not in own and node.attr not in FOREIGN:
                    out.add(f"{where}: .{node.attr}")
                    if id(node) in written and writes is not None:
                        writes.append(f"{where}:{node.lineno}: .{node.attr}")
    return out


def main() -> int:
    writes: list[str] = []
    found = crossings(writes)
    if "--write" in sys.argv:
        ALLOWED.write_text("\n".join(sorted(found)) + "\n")
        print(f"{ALLOWED.name}: {len(found)} crossings written")
        return 0
    allowed = {line for line in ALLOWED.read_text().splitlines() if line.strip()}
    new, gone = sorted(found - allowed), sorted(allowed - found)
    for line in new:
        print(f"new private crossing: {line} (use or add a public name of that module instead)")
    for line in gone:
        print(f"no longer found: {line} (delete the line from {ALLOWED.name})")
    for line in writes:
        print(f"writes another's private field: {line} (let the module defining it change it)")
    print(f"private crossings: {len(found)} (allowed {len(allowed)}), writes: {len(writes)}")
    return 1 if new or gone or writes else 0


if __name__ == "__main__":
    sys.exit(main())
