"""The tidyjax exception hierarchy.

Every error tidyjax raises derives from `TidyjaxError` and, where callers would catch a
built-in, from that built-in too (a disposed Tensor is a ``RuntimeError`` like a deleted
``jax.Array``; a bad argument is a ``TypeError``).
"""

from __future__ import annotations

import functools
import reprlib
from typing import Any, NamedTuple

import numpy as np
from jax.errors import JaxRuntimeError

__all__ = [
    "BudgetError",
    "CollectiveError",
    "Reason",
    "DisposedError",
    "LeakError",
    "OutOfMemoryError",
    "ScopeError",
    "TidyjaxError",
    "TidyjaxTypeError",
    "TidyjaxValueError",
    "check_flag",
]


class TidyjaxError(Exception):
    """Base class of every error raised by tidyjax."""


class DisposedError(TidyjaxError, RuntimeError):
    """A Tensor was used after its buffer was disposed, freed by a scope, or donated."""


class ScopeError(TidyjaxError, RuntimeError):
    """A scope was misused: exited twice, out of order, from another task, or re-entered."""


class TidyjaxTypeError(TidyjaxError, TypeError):
    """An argument of the wrong type was passed to tidyjax."""


class TidyjaxValueError(TidyjaxError, ValueError):
    """An argument had the right type but a wrong value (shape, dtype, name)."""


def check_flag(value: object, name: str, where: str) -> bool:
    """``value``, a flag argument, as a ``bool``: ``True`` or ``False``, or a NumPy bool (what
    comparing arrays gives). Anything else is refused rather than read as true or false by its
    truthiness (``all_processes="no"`` would be true, ``arrays=0`` false).

    Args:
        name: the argument's name.
        where: the function it was given to, as its errors name it (``"memory()"``).

    Raises:
        TidyjaxTypeError: naming ``where``, ``name`` and what it got (``memory()'s
            all_processes must be True or False, got str 'yes'.``).
    """
    if type(value) is bool:
        return value
    if isinstance(value, np.bool_):
        return bool(value)
    raise TidyjaxTypeError(
        f"{where}'s {name} must be True or False, got {type(value).__name__} {reprlib.repr(value)}."
    )


def check_count(value: object, name: str, where: str) -> int:
    """``value``, a count argument: an ``int`` >= 0 (a NumPy integer too); ``True``, a float,
    a negative number are refused.

    Raises:
        TidyjaxTypeError: naming ``where``, ``name`` and what it got.
    """
    if (
        isinstance(value, (int, np.integer))
        and not isinstance(value, (bool, np.bool_))
        and value >= 0
    ):
        return int(value)
    raise TidyjaxTypeError(
        f"{where}'s {name} must be an int >= 0, got {type(value).__name__} {reprlib.repr(value)}."
    )


def check_seconds(value: object, name: str, where: str) -> float:
    """``value``, a duration argument: a number of seconds > 0 (not a bool, not NaN).

    Raises:
        TidyjaxTypeError: naming ``where``, ``name`` and what it got.
    """
    if (
        isinstance(value, (int, float, np.integer, np.floating))
        and not isinstance(value, (bool, np.bool_))
        and value > 0  # False for NaN
    ):
        return float(value)
    raise TidyjaxTypeError(
        f"{where}'s {name} must be a number of seconds > 0, got {type(value).__name__} "
        f"{reprlib.repr(value)}."
    )


class CollectiveError(TidyjaxError, RuntimeError):
    """A report over all processes failed: not every process called it in time."""


class LeakError(TidyjaxError, AssertionError):
    """Tensors created inside a leak check were still alive when it ended.

    ``err.report`` is the [`tidyjax.LeakReport`][tidyjax.LeakReport], grouped by creation site.
    """

    def __init__(self, message: str, report: object = None) -> None:
        super().__init__(message)
        self.report = report


class OutOfMemoryError(TidyjaxError, MemoryError, JaxRuntimeError):
    """JAX could not allocate (``RESOURCE_EXHAUSTED``); raised from JAX's own error.

    The message says what was asked for and which live arrays hold the memory, by creation site and
    scope; ``err.report`` holds the same as data (a [`tidyjax.OOMReport`][tidyjax.OOMReport]). Still
    a ``jax.errors.JaxRuntimeError`` whose message holds JAX's, so code that caught JAX's error (a
    smaller batch on ``RESOURCE_EXHAUSTED``) catches this one.
    """

    def __init__(self, message: str, report: object = None, code: int | None = None) -> None:
        JaxRuntimeError.__init__(self, message, code)  # JAX 0.7+ keeps the code as error_code
        self.message = message
        self.report = report

    def __str__(self) -> str:  # before JAX 0.7, str() of the error shows its whole args tuple
        return self.message


class BudgetError(OutOfMemoryError):
    """A call tidyjax was about to make would cross a [`tidyjax.budget`][tidyjax.budget]: raised
    before the call ran, so nothing was allocated, donated or freed.

    The message names the call, the device, the budget, what is live there (what was made
    before the budget apart), what the call would add and how to make it fit. As data:

    Attributes:
        report: the call's [`tidyjax.MemoryPlan`][tidyjax.MemoryPlan] against the devices as
            they were (its ``holders``: the largest live holders by creation site).
        function: the call's function, by ``__qualname__``.
        device: the device over its budget (``"cpu:0"``), or ``"all devices"`` for a budget
            with ``per_device=False``.
        budget_bytes: the budget crossed, in bytes.
        live_bytes: what was live there, every ``jax.Array``, each buffer once.
        before_bytes: the part of ``live_bytes`` made before the budget was entered.
        new_bytes: what the call would add: its outputs + temporaries - donated (aliased)
            bytes, + its arguments not on the device yet.
        peak_bytes: ``live_bytes + new_bytes``, the peak the call would reach there.

    Pickles with its message and every attribute (a worker's error travels to its parent).
    """

    def __init__(
        self,
        message: str,
        report: object = None,
        *,
        function: str = "",
        device: str = "",
        budget_bytes: int = 0,
        live_bytes: int = 0,
        before_bytes: int = 0,
        new_bytes: int = 0,
    ) -> None:
        super().__init__(message, report)
        self.function = function
        self.device = device
        self.budget_bytes = budget_bytes
        self.live_bytes = live_bytes
        self.before_bytes = before_bytes
        self.new_bytes = new_bytes

    @property
    def peak_bytes(self) -> int:
        return self.live_bytes + self.new_bytes

    def __reduce__(self) -> tuple[Any, ...]:
        # the figures are keyword-only: they travel as the state, with any notes added
        return (BudgetError, (self.message, self.report), dict(self.__dict__))


class Reason(NamedTuple):
    """Why a Tensor is disposed, and how to avoid it: the closed set is built below."""

    text: str
    hint: str

    def __str__(self) -> str:
        return self.text


_KEEP_HINT = (
    "To use it after the scope, return it from the scope, or call scope.keep(t) / "
    "tidyjax.keep(t) before the scope exits."
)
_LATER_HINT = "Dispose a Tensor only after its last use, or use a clone() that you dispose."
_DONATE_HINT = "Use the function's output instead, or do not donate this argument (donate_argnums)."

DISPOSED = Reason("it was disposed explicitly (dispose())", _LATER_HINT)
RELEASED = Reason("its buffer was released", _LATER_HINT)
VARIABLES_DISPOSED = Reason("it was disposed by dispose_variables()", _LATER_HINT)
DELETED_OUTSIDE = Reason(
    "its buffer was deleted outside tidyjax (jax.Array.delete() or donation)",
    "Let tidyjax free Tensor buffers (dispose()); do not delete t.array yourself.",
)


@functools.lru_cache(maxsize=1024)  # one per scope path: a Reason is immutable
def scope_exited(path: str) -> Reason:
    return Reason(f"it was freed when scope {path!r} exited", _KEEP_HINT)


def donated(name: str) -> Reason:
    return Reason(f"its buffer was donated to jit-compiled function {name!r}", _DONATE_HINT)


def variable_disposed(label: str) -> Reason:
    return Reason(f"{label} was disposed", _LATER_HINT)


for _cls in (
    BudgetError,
    CollectiveError,
    DisposedError,
    ScopeError,
    TidyjaxError,
    TidyjaxTypeError,
    TidyjaxValueError,
    LeakError,
    OutOfMemoryError,
):
    _cls.__module__ = "tidyjax"
del _cls
