"""Typed for the people who use it: mypy and pyright over realistic user code.

``tests/typing/*.py`` use ``assert_type`` on Tensor's operators and methods (installed at run
time, declared at the end of ``class Tensor``), every form of ``tidy``, ``keep``, ``Variable``,
``tidyjax.numpy`` and the transformations; both checkers must pass them, and each file must also
run, so the declarations say what the code does. ``tests/typing_fail/misuse.py`` is code a
checker must reject, line by line, so this test can fail.
"""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tidyjax import _ops

ROOT = Path(__file__).resolve().parent.parent
TYPING = ROOT / "tests" / "typing"
MISUSE = ROOT / "tests" / "typing_fail" / "misuse.py"
EXAMPLES = sorted(TYPING.glob("*.py"))


def _tool(name: str) -> list[str]:
    """The command running ``name`` from this environment, or skip saying how to get it."""
    if name == "mypy":
        pytest.importorskip("mypy", reason="mypy is not installed: pip install -e '.[test]'")
        return [sys.executable, "-m", "mypy"]
    exe = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    if exe is None:
        pytest.skip(f"{name} is not installed: pip install -e '.[test]' (it needs node)")
    return [exe, "--pythonpath", sys.executable]


def _run(cmd: list[str], *paths: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*cmd, *map(str, paths)], cwd=ROOT, capture_output=True, text=True, timeout=600
    )


def test_examples_exist() -> None:
    names = {p.stem for p in EXAMPLES}
    assert {"tensor_ops", "scopes", "variables", "numpy_and_transforms"} <= names


@pytest.mark.parametrize("checker", ["mypy", "pyright"])
def test_examples_type_check(checker: str) -> None:
    proc = _run(_tool(checker), TYPING)
    assert proc.returncode == 0, f"{checker} tests/typing:\n{proc.stdout}{proc.stderr}"


def _expected_errors() -> dict[int, str]:
    marks = {}
    for n, line in enumerate(MISUSE.read_text().splitlines(), 1):
        m = re.search(r"# E: ([a-z-]+)$", line)
        if m:
            marks[n] = m.group(1)
    return marks


def test_mypy_rejects_misuse() -> None:
    proc = _run([*_tool("mypy"), "--no-error-summary"], MISUSE)
    assert proc.returncode != 0, proc.stdout + proc.stderr
    found = {
        int(m.group(1)): m.group(2)
        for m in re.finditer(r"misuse\.py:(\d+): error: .*\[([a-z-]+)\]$", proc.stdout, re.M)
    }
    assert found == _expected_errors(), proc.stdout


def test_pyright_rejects_misuse() -> None:
    proc = _run(_tool("pyright"), MISUSE)
    assert proc.returncode != 0, proc.stdout + proc.stderr
    found = {int(m.group(1)) for m in re.finditer(r"misuse\.py:(\d+):\d+ - error", proc.stdout)}
    assert found == set(_expected_errors()), proc.stdout


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_examples_run(path: Path) -> None:
    """What the checkers are told is what happens: each file runs, its assert_types hold."""
    pytest.importorskip("typing_extensions")
    proc = subprocess.run(
        [sys.executable, "-W", "error", str(path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _declared() -> set[str]:
    """The names the `if TYPE_CHECKING:` block at the end of class Tensor declares."""
    tree = ast.parse((ROOT / "tidyjax" / "_tensor.py").read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Tensor")
    block = cls.body[-1]
    assert isinstance(block, ast.If) and ast.unparse(block.test) == "TYPE_CHECKING"
    return {n.name for n in block.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}


def test_every_installed_method_is_declared() -> None:
    """Each name `install_tensor_methods()` puts on Tensor has a declaration for checkers."""
    installed = {f"__{n}__" for n in (*_ops._BINARY, *_ops._COMPARE, *_ops._UNARY)}
    installed |= {f"__r{n}__" for n in _ops._BINARY} | {f"__i{n}__" for n in _ops._BINARY}
    installed |= {"__divmod__", "__rdivmod__", "__getitem__", "__round__", "at"}
    installed |= set(_ops.ARRAY_METHODS) | set(_ops.FUNCTION_METHODS)
    missing = installed - _declared()
    assert not missing, f"declare these at the end of class Tensor: {sorted(missing)}"


def test_every_public_attribute_is_visible_to_checkers() -> None:
    """Every public name on Tensor is defined in the class body or declared for checkers."""
    import tidyjax

    tree = ast.parse((ROOT / "tidyjax" / "_tensor.py").read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Tensor")
    static = {n.name for n in cls.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    public = {n for n in dir(tidyjax.Tensor) if not n.startswith("_")}
    assert not public - static - _declared()
