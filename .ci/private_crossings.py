"""Fail when a module of tidyjax reads or writes another module's private names or another
class's private fields beyond the allow-list (issue 40: no module writes another's state).

A crossing is ``_mod._name`` (another module's private global), ``from ._mod import _name``,
or ``obj._field`` where no class of the reading module defines ``_field``. Each distinct
``module: name`` is listed once. The allow-list, ``.ci/private-crossings.txt``, is today's
debt: a crossing not in it fails, and so does an entry no longer found (delete the line), so
the list only shrinks. ``python .ci/private_crossings.py --write`` rewrites it.
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
           "_filename_map"}  # fmt: skip


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


def crossings() -> set[str]:
    """Each ``module: crossing`` found in the package."""
    files = sorted(PACKAGE.rglob("*.py"))
    modules = {p.stem for p in files}
    out: set[str] = set()
    for path in files:
        tree = ast.parse(path.read_text(), str(path))
        own = _own_fields(tree)
        where = path.relative_to(PACKAGE).as_posix()
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
    return out


def main() -> int:
    found = crossings()
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
    print(f"private crossings: {len(found)} (allowed {len(allowed)})")
    return 1 if new or gone else 0


if __name__ == "__main__":
    sys.exit(main())
