"""The tidyjax exception hierarchy.

Every error tidyjax raises derives from :class:`TidyjaxError` and, where callers would catch a
built-in, from that built-in too (a disposed Tensor is a ``RuntimeError`` like a deleted
``jax.Array``; a bad argument is a ``TypeError``).
"""

from __future__ import annotations

__all__ = [
    "DisposedError",
    "LeakError",
    "ScopeError",
    "TidyjaxError",
    "TidyjaxTypeError",
    "TidyjaxValueError",
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


class LeakError(TidyjaxError, AssertionError):
    """Tensors created inside a leak check were still alive when it ended.

    ``err.report`` is the :class:`tidyjax.LeakReport`, grouped by creation site.
    """

    def __init__(self, message: str, report: object = None) -> None:
        super().__init__(message)
        self.report = report


for _cls in (
    DisposedError,
    ScopeError,
    TidyjaxError,
    TidyjaxTypeError,
    TidyjaxValueError,
    LeakError,
):
    _cls.__module__ = "tidyjax"
del _cls
