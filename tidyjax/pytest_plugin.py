"""pytest plugin: fail tests that leave Tensors or plain jax.Arrays alive, or cross a device
memory limit; a fresh-scope fixture.

Registered through the ``pytest11`` entry point, so it is active wherever tidyjax is installed.

* ``@pytest.mark.no_tensor_leaks`` (or ``no_tensor_leaks(allowance=N)``): the test fails, with a
  leak report grouped by creation site, if Tensors or plain jax.Arrays it created are alive
  when it ends (the rules of ``tidyjax.check_leaks``: plain arrays count apart from Tensors,
  only those made from a user's line; ``no_tensor_leaks(arrays=False)`` counts Tensors only).
* ``--tidyjax-leaks`` (ini: ``tidyjax_leaks = true``): the same for every test;
  ``--tidyjax-leak-allowance=N`` (ini: ``tidyjax_leak_allowance``) sets the default allowance.
  ``tidyjax_leak_arrays = false`` (ini) counts Tensors only, in every checked test.
  A bad value of any is one usage error at the start of the session.
* ``@pytest.mark.limit_device_memory("2 GiB")`` (bytes or a string as ``tidyjax.budget``
  takes): the test body runs inside ``tidyjax.budget(limit)``; a ``tidyjax.jit`` call that
  would take a device past it fails the test before it runs, saying the peak, the budget, the
  call and the largest holders. ``--tidyjax-device-memory-limit=LIMIT`` (ini:
  ``tidyjax_device_memory_limit = 2 GiB``) does it for every test; a marker overrides it.
* ``tidy_scope`` fixture: the test body runs in a fresh ``tidy("test")`` scope, exited (and its
  Tensors freed) at teardown.

tidyjax (and so JAX) is imported only when a test uses one of these.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest

_MARKER = "no_tensor_leaks"
_LIMIT_MARKER = "limit_device_memory"
_LIMIT_INI = "tidyjax_device_memory_limit"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("tidyjax", "tidyjax tensor leak checks")
    group.addoption(
        "--tidyjax-leaks",
        action="store_true",
        default=None,
        help="fail every test that leaves Tensors or plain jax arrays alive",
    )
    group.addoption(
        "--tidyjax-leak-allowance",
        type=int,
        default=None,
        help="number of leaked Tensors and jax arrays a test may leave (default 0)",
    )
    parser.addini(
        "tidyjax_leaks", "fail every test that leaves Tensors or jax arrays alive", "bool"
    )
    parser.addini("tidyjax_leak_allowance", "leaks a test may leave", default="0")
    parser.addini(
        "tidyjax_leak_arrays", "leak checks count plain jax arrays too", "bool", default=True
    )
    group.addoption(
        "--tidyjax-device-memory-limit",
        default=None,
        metavar="LIMIT",
        help="run every test inside tidyjax.budget(LIMIT): bytes, or e.g. '2 GiB', '512 MB'",
    )
    parser.addini(_LIMIT_INI, "run every test inside tidyjax.budget(this), e.g. 2 GiB", default="")


# (check every test, default allowance, count plain arrays), read once at session start.
_OPTIONS = pytest.StashKey[tuple[bool, int, bool]]()
# Every test's device memory limit, in bytes, with where it was set; None when unset.
_LIMIT = pytest.StashKey["tuple[int, str] | None"]()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{_MARKER}(allowance=0, arrays=True): fail the test if Tensors or plain jax arrays it "
        "created are still alive at its end",
    )
    config.addinivalue_line(
        "markers",
        f"{_LIMIT_MARKER}(limit): run the test inside tidyjax.budget(limit) ('2 GiB', bytes): "
        "fail it when a tidyjax.jit call would take a device past the limit",
    )
    config.stash[_OPTIONS] = _options(config)
    config.stash[_LIMIT] = _session_limit(config)


def _options(config: pytest.Config) -> tuple[bool, int, bool]:
    """The session's options, or one usage error naming the option and the values it takes."""
    name = "tidyjax_leaks"
    try:
        everywhere = bool(config.getoption("--tidyjax-leaks") or config.getini(name))
        name = "tidyjax_leak_arrays"
        arrays = bool(config.getini(name))
    except (ValueError, pytest.UsageError) as e:
        raise pytest.UsageError(
            f"tidyjax: ini option {name} takes true or false (also yes/no, on/off, 1/0); {e}."
        ) from None
    default = config.getoption("--tidyjax-leak-allowance")
    where = "--tidyjax-leak-allowance"
    if default is None:
        default = config.getini("tidyjax_leak_allowance") or 0
        where = "ini option tidyjax_leak_allowance"
    try:
        n = int(default)
    except (TypeError, ValueError):
        n = -1
    if n < 0:
        raise pytest.UsageError(
            f"tidyjax: {where} takes a number of Tensors a test may leave, a non-negative int; "
            f"got {default!r}."
        )
    return everywhere, n, arrays


def _settings(item: pytest.Item) -> tuple[int, bool] | None:
    """The allowance and whether plain arrays count, if the leak check applies to ``item``,
    else None."""
    config = item.config
    marker = item.get_closest_marker(_MARKER)
    everywhere, default, arrays = config.stash.get(_OPTIONS, None) or _options(config)
    if marker is None and not everywhere:
        return None
    if marker is not None:
        value = marker.args[0] if marker.args else marker.kwargs.get("allowance", default)
        arrays = marker.kwargs.get("arrays", arrays)
        if not isinstance(arrays, bool):
            pytest.fail(
                f"tidyjax: @pytest.mark.{_MARKER}(arrays=...) takes True or False; got {arrays!r}.",
                pytrace=False,
            )
        return _allowance(value, f"@pytest.mark.{_MARKER}(allowance=...)"), arrays
    return default, arrays


def _allowance(value: Any, where: str) -> int:
    """``value`` as a leak allowance, or fail the test saying what is wrong and where."""
    try:
        n = int(value)
    except (TypeError, ValueError):
        n = -1
    if n < 0 or isinstance(value, (bool, float)):
        pytest.fail(
            f"tidyjax: {where} takes a number of Tensors and arrays, a non-negative int; got "
            f"{value!r}. "
            f"Write e.g. @pytest.mark.{_MARKER}(allowance=2).",
            pytrace=False,
        )
    return n


def _session_limit(config: pytest.Config) -> tuple[int, str] | None:
    """Every test's limit, or one usage error naming the option and the forms it takes."""
    value, where = (
        config.getoption("--tidyjax-device-memory-limit"),
        "--tidyjax-device-memory-limit",
    )
    if value is None:
        value, where = config.getini(_LIMIT_INI), f"ini option {_LIMIT_INI}"
    if not value:
        return None
    from ._budget import parse_limit  # imports tidyjax, and JAX: only when a limit is set
    from ._errors import TidyjaxError

    try:
        return parse_limit(value, where), where
    except TidyjaxError as e:
        raise pytest.UsageError(f"tidyjax: {e}") from None


def _limit(item: pytest.Item) -> tuple[int, str] | None:
    """The limit ``item`` runs under, with where it was set, or None."""
    marker = item.get_closest_marker(_LIMIT_MARKER)
    if marker is None:
        return item.config.stash.get(_LIMIT, None)
    where = f"@pytest.mark.{_LIMIT_MARKER}"
    if len(marker.args) + len(marker.kwargs) != 1 or set(marker.kwargs) - {"limit"}:
        pytest.fail(
            f"tidyjax: {where} takes one limit, bytes or a string such as '2 GiB'; got "
            f"args {marker.args!r}, kwargs {marker.kwargs!r}.",
            pytrace=False,
        )
    value = marker.args[0] if marker.args else marker.kwargs["limit"]
    from ._budget import parse_limit
    from ._errors import TidyjaxError

    try:
        return parse_limit(value, f"{where}'s limit"), f"{where}({value!r})"
    except TidyjaxError as e:
        pytest.fail(f"tidyjax: {e}", pytrace=False)


@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> Generator[None, Any, Any]:
    found = _limit(pyfuncitem)
    if found is None:
        return (yield)
    limit, where = found
    from ._budget import budget
    from ._errors import BudgetError
    from ._format import fmt_bytes

    try:
        with budget(limit):  # around the test body, in the context it runs in
            return (yield)
    except BudgetError as e:
        error = e
    # failed outside the except block: the report is printed once, not chained to itself
    pytest.fail(
        f"tidyjax: test {pyfuncitem.name} would cross its device memory limit of "
        f"{fmt_bytes(limit)} ({where}):\n{error}",
        pytrace=False,
    )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, Any, Any]:
    settings = _settings(item)
    if settings is None:
        return (yield)
    allowance, arrays = settings
    from ._leaks import check_leaks

    checker = check_leaks(allowance=allowance, arrays=arrays).__enter__()
    result = yield  # a failing test raises here; its own failure is the one to report
    leaked = checker.leaked()
    scope = getattr(item, "funcargs", {}).get("tidy_scope")
    if scope is not None:  # the fixture's scope frees these at teardown
        from ._census import live_holders

        owned = {t.id for rec, ts in live_holders() for t in ts if rec.scope is scope}
        leaked = [r for r in leaked if r.id not in owned]
    import jax

    from ._leaks import leak_error

    # On a multi-process run, a leak on any process fails the test on every process.
    error = leak_error(leaked, allowance, f"test {item.name}", jax.process_count() > 1)
    if error is None:
        return result
    pytest.fail(str(error), pytrace=False)  # the report, printed once


@pytest.fixture
def tidy_scope() -> Generator[Any, None, None]:
    """The test runs inside a fresh ``tidy("test")`` scope; its Tensors are freed at teardown."""
    from ._scope import close_scope, open_scope

    scope = open_scope("test")  # around the test body, though entered in this generator
    try:
        yield scope
    finally:
        close_scope(scope)
