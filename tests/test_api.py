"""The public surface: ``tidyjax.__all__`` is every public name, the API reference documents
exactly it, and the README's API table names nothing else; the exception hierarchy."""

from __future__ import annotations

import builtins
import inspect
import pathlib
import re

import tidyjax as tj

ROOT = pathlib.Path(__file__).resolve().parent.parent
NAMESPACES = {"lax", "nn", "numpy", "random"}  # lifted JAX modules: submodules, not in __all__


def _api_page() -> str:
    """The text of the page mkdocs.yml's nav calls the API reference."""
    (page,) = re.findall(r"^\s*- API reference: (\S+)$", (ROOT / "mkdocs.yml").read_text(), re.M)
    return (ROOT / "docs" / page).read_text()


def _readme_api_rows() -> list[list[str]]:
    """The README's API table (between its snippet markers), each row as its cells."""
    text = (ROOT / "README.md").read_text()
    table = text.split("<!-- --8<-- [start:api] -->")[1].split("<!-- --8<-- [end:api] -->")[0]
    rows = [line.strip().strip("|").split("|") for line in table.splitlines()]
    return [cells for cells in rows if len(cells) >= 2 and not set(cells[0]) <= set("-: ")][1:]


def test_all_is_every_public_name_and_each_exists():
    assert len(tj.__all__) == len(set(tj.__all__)), "a name is listed twice"
    public = {
        name
        for name in dir(tj)
        if not name.startswith("_") and not inspect.ismodule(getattr(tj, name))
    }
    assert set(tj.__all__) == public, (
        "list it in tidyjax.__all__ and docs/api.md, or make it _private"
    )


def test_star_import_gives_all_and_shadows_no_module():
    ns: dict[str, object] = {}
    exec("from tidyjax import *", ns)
    assert set(ns) - {"__builtins__"} == set(tj.__all__)
    assert not NAMESPACES & set(ns)  # `import *` must not replace numpy or random


def test_the_api_reference_documents_exactly_all():
    documented = re.findall(r"^::: tidyjax\.(\w+)$", _api_page(), re.M)
    assert len(documented) == len(set(documented)), "an entry is on the page twice"
    names = set(documented) - NAMESPACES
    assert set(tj.__all__) - names == set(), "public but missing from the API reference"
    assert names - set(tj.__all__) == set(), "documented but missing from tidyjax.__all__"
    assert set(documented) & NAMESPACES == NAMESPACES
    for name in NAMESPACES:
        assert getattr(tj, name).__name__ == f"tidyjax.{name}"


def test_the_readme_api_table_names_only_public_names_and_every_error():
    rows = _readme_api_rows()
    assert len(rows) >= 10
    named = set()
    for cells in rows[:-1]:  # first column: `name(...)`, `with name() as p:`, `Name.method`
        named |= set(re.findall(r"`(?:with )?([A-Za-z_]\w*)", cells[0]))
    assert named - set(tj.__all__) == set()
    errors_row = rows[-1]
    assert errors_row[0].strip() == "errors"
    errors = set(re.findall(r"`(\w+Error)`", errors_row[1])) - set(dir(builtins))
    public_errors = {n for n in tj.__all__ if isinstance(getattr(tj, n), type)}
    public_errors = {n for n in public_errors if issubclass(getattr(tj, n), BaseException)}
    assert errors == public_errors


def test_classes_print_as_tidyjax():
    classes = [getattr(tj, n) for n in tj.__all__ if isinstance(getattr(tj, n), type)]
    assert len(classes) >= 20
    for cls in classes:
        assert cls.__module__ == "tidyjax", cls
        assert getattr(tj, cls.__qualname__) is cls  # so pickle finds it there


def test_exceptions_mix_in_the_builtin():
    assert issubclass(tj.DisposedError, (tj.TidyjaxError, RuntimeError))
    assert issubclass(tj.ScopeError, RuntimeError)
    assert issubclass(tj.TidyjaxTypeError, TypeError)
    assert issubclass(tj.TidyjaxValueError, ValueError)
    assert issubclass(tj.CollectiveError, (tj.TidyjaxError, RuntimeError))
    assert issubclass(tj.OutOfMemoryError, (tj.TidyjaxError, MemoryError))
    assert issubclass(tj.LeakError, (tj.TidyjaxError, AssertionError))
    assert all(issubclass(e, tj.TidyjaxError) for e in (tj.DisposedError, tj.LeakError))


def test_version():
    assert tj.__version__ and tj.__version__[0].isdigit()
