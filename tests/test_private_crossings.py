"""The check `.ci/run` makes on the package's private crossings (`.ci/private_crossings.py`):
reads of another module's private fields are an allow-list that only shrinks; a write of
another class's private field fails whatever the list says."""

from __future__ import annotations

import importlib.util
import pathlib

import pytest

SCRIPT = pathlib.Path(__file__).resolve().parent.parent / ".ci" / "private_crossings.py"

pytestmark = pytest.mark.skipif(not SCRIPT.exists(), reason="needs the repository's .ci folder")


def _check() -> object:
    spec = importlib.util.spec_from_file_location("private_crossings", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _package(tmp_path: pathlib.Path, user: str) -> pathlib.Path:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "_owner.py").write_text(
        "class Owner:\n    __slots__ = ('_n', '_items')\n"
        "    def __init__(self):\n        self._n = 0\n        self._items = []\n"
    )
    (pkg / "_user.py").write_text(user)
    return pkg


@pytest.mark.parametrize(
    "line",
    ["o._n = 1", "o._n += 1", "del o._n", "o._items.append(1)", "o._items.extend([1])"],
)
def test_every_form_of_writing_another_classs_private_field_is_a_write(tmp_path, line):
    check = _check()
    pkg = _package(tmp_path, f"def f(o):\n    {line}\n")
    writes: list[str] = []
    found = check.crossings(writes, package=pkg)  # type: ignore[attr-defined]
    assert found == {"_user.py: ._n" if "_n" in line else "_user.py: ._items"}
    assert writes == [f"_user.py:2: {'._n' if '_n' in line else '._items'}"]


def test_a_read_is_a_crossing_and_no_write(tmp_path):
    check = _check()
    pkg = _package(tmp_path, "def f(o):\n    return o._n + len(o._items)\n")
    writes: list[str] = []
    assert check.crossings(writes, package=pkg) == {"_user.py: ._n", "_user.py: ._items"}  # type: ignore[attr-defined]
    assert writes == []


def test_tidyjax_writes_no_other_classs_private_field():
    writes: list[str] = []
    _check().crossings(writes)  # type: ignore[attr-defined]
    assert writes == []
