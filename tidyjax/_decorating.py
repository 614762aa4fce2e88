"""The decorator forms every context manager of tidyjax shares: one check that a callable was
given, one sync-and-async wrapper that runs each call inside a fresh context manager.

In the manner of ``jax._src.config``: the object a user enters with ``with`` also decorates, and
its ``__call__(fn)`` wraps ``fn`` with ``functools.wraps``. Imports nothing of tidyjax but the
errors.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, TypeVar

from . import _format
from ._errors import TidyjaxTypeError

__all__ = ["check_callable", "decorate"]

F = TypeVar("F", bound=Callable[..., Any])
C = TypeVar("C")


def _is_generator_function(fn: Any) -> bool:
    return inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn)


def check_callable(fn: Any, what: str, *, decorator: bool = False, hint: str = "") -> None:
    """Raise unless ``fn`` is callable; with ``decorator``, unless it is a plain or async function.

    A decorator that runs each call inside a context manager cannot wrap a generator function,
    sync or async: its body runs after the call returned, outside the block.

    Args:
        fn: what was given.
        what: the API as the user wrote it (``"lift()"``, ``"@check_leaks"``).
        decorator: refuse generator and async generator functions too.
        hint: a sentence appended to the message (the other form to use).

    Raises:
        TidyjaxTypeError: ``"lift() takes a function or other callable, got int 3."``, or
            ``"@check_leaks decorates a plain or async function, got generator function 'gen'."``.
    """
    if callable(fn) and not (decorator and _is_generator_function(fn)):
        return
    if callable(fn):
        kind = "async generator" if inspect.isasyncgenfunction(fn) else "generator"
        got = f"{kind} function {getattr(fn, '__qualname__', fn)!r}"
    else:
        got = f"{type(fn).__name__} {_format.clip(fn)}"
    verb = (
        "decorates a plain or async function" if decorator else "takes a function or other callable"
    )
    raise TidyjaxTypeError(f"{what} {verb}, got {got}." + (f" {hint}" if hint else ""))


def decorate(
    fn: F,
    enter: Callable[[], AbstractContextManager[C]],
    what: str,
    on_result: Callable[[C, Any], None] | None = None,
) -> F:
    """``fn`` wrapped so that each call runs inside ``enter()`` (awaited inside it when ``fn``
    is async); ``on_result(entered, result)`` runs inside the block after the call returns.

    Raises:
        TidyjaxTypeError: ``fn`` is not a plain or async function (see `check_callable`).
    """
    check_callable(fn, what, decorator=True)

    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def run_async(*args: Any, **kwargs: Any) -> Any:
            __tracebackhide__ = True
            with enter() as entered:
                result = await fn(*args, **kwargs)
                if on_result is not None:
                    on_result(entered, result)
            return result

        return run_async  # type: ignore[return-value]

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True
        with enter() as entered:
            result = fn(*args, **kwargs)
            if on_result is not None:
                on_result(entered, result)
        return result

    return run  # type: ignore[return-value]
