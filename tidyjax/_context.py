"""The innermost open scope of the running thread or asyncio task, and what a scope owns.

A ``ContextVar`` holds the innermost scope; each scope links to its parent, so the stack is an
immutable linked list. A new thread starts with no scope; an asyncio task starts with the scope
that was current where it was created (ordinary ``contextvars`` semantics) and its own
``async with tidy()`` never affects another task.

`Tracker` is the part of a scope the per-op path touches: the list of buffer records it
owns, appended to by ``_tensor.wrap``. It lives here so that the hot path imports no scope logic.

`on_jax_error` is where the core hands JAX's runtime errors to the reporting layer, which
installs its handler at package import (``_oom.install``): the core never imports a report.
"""

from __future__ import annotations

import contextvars
import weakref
from collections.abc import Callable
from typing import Any, Optional

from ._newarrays import ArrayMark
from ._registry import Batch, Buffer

__all__ = ["CURRENT", "TRACING", "Tracker", "on_jax_error", "set_jax_error_hook"]


class Tracker:
    """What a scope owns: the records it created (or was handed) and Tensor aliases it made."""

    __slots__ = (
        "__weakref__",
        "_aliases",
        "_collected",
        "_compact_at",
        "_debug_mark",
        "_extra",
        "_owned",
        "_peak",
        "_pruned",
        "parent",
        "path",
    )

    def __init__(self) -> None:
        self._owned: list[Any] = []  # Buffers and Batches
        self._aliases: list[weakref.ref[Any]] = []  # Tensors made here on others' buffers
        self._compact_at = 1024
        self._pruned = 0  # records dropped by _compact (collected or disposed meanwhile)
        self._extra = 0  # buffers made here beyond one per list entry (a batch is one entry)
        self._collected = 0  # of those, the ones whose arrays Python's collector freed
        self.parent: Tracker | None = None
        self.path = "<tidy>"
        self._peak = -1  # the most tidyjax bytes alive while open; set while a profile runs
        # the jax.Arrays made since entry, marked only while the "tidyjax" logger is at DEBUG:
        # the exit's summary names untracked ones that outlive it
        self._debug_mark: ArrayMark | None = None

    # The named doors other modules use to change what a scope owns (the per-op path in
    # ``_tensor.wrap`` appends to ``_owned`` inline instead: a call costs more there).

    @property
    def exited(self) -> bool:
        """Whether this scope has exited (a `Scope` says; a bare tracker never exits)."""
        return False

    def note_alias(self, t: Any) -> None:
        """The Tensor ``t`` was made (or handed) here on a buffer this scope may not own: its
        exit disposes the object unless it is returned or kept (TensorFlow.js)."""
        self._aliases.append(weakref.ref(t))

    def reclaim(self, rec: Buffer) -> Tracker | None:
        """``rec`` comes back to this scope (a Variable let go of it), or to the nearest open
        scope around it once this one has exited; returns the new owner (None: no scope)."""
        home: Tracker | None = self
        while home is not None and home.exited:
            home = home.parent
        rec.scope = home
        if home is not None:
            home._owned.append(rec)
        return home

    def take_batch(self, b: Batch, made: int) -> None:
        """``b``, the batch of the ``made`` new buffers of one jitted call made here, is this
        scope's: one entry in its list, ``made`` buffers created (``num_created``)."""
        owned = self._owned
        owned.append(b)
        self._extra += made - 1
        if len(owned) > self._compact_at:
            self._compact()

    def take(self, rec: Buffer) -> None:
        """``rec``, made elsewhere or split out of a batch listed here, is this scope's now
        (listed again, not made again: ``num_created`` stays)."""
        self._owned.append(rec)
        self._extra -= 1

    def collected_early(self) -> None:
        """A buffer made here went with its array to Python's collector before the exit."""
        self._collected += 1

    def note_peak(self, nbytes: int) -> None:
        """A profile saw ``nbytes`` of tidyjax buffers alive while this scope was open."""
        if nbytes > self._peak:
            self._peak = nbytes

    def _compact(self) -> None:
        """Forget records whose arrays Python already collected, and Tensor objects collected
        or disposed; amortized O(1) per op (and per record or object a child hands here)."""
        owned = self._owned
        before = len(owned)
        kept = []
        for r in owned:
            if r.dead is None:
                if r.array() is not None:
                    kept.append(r)
                elif type(r) is Batch:  # its collected leaves were counted as they went
                    if r.stale:
                        kept.append(r)  # its exit still disposes the Tensors pointing at it
                else:
                    self._collected += 1
        owned[:] = kept
        self._pruned += before - len(owned)
        # the Tensor objects to dispose at exit: those collected or disposed meanwhile go
        self._aliases[:] = [ref for ref in self._aliases if (t := ref()) is not None and t._r]
        self._compact_at = max(1024, 2 * len(owned), 2 * len(self._aliases))


CURRENT: contextvars.ContextVar[Optional[Tracker]] = contextvars.ContextVar(  # noqa: UP045
    "tidyjax_scope", default=None
)

#: The traces of the tidyjax transformations (``tidyjax.jit``/``grad``/``value_and_grad``/``vmap``)
#: now running the user's function. An op on a Tensor whose result is a tracer of one of them
#: gives a Tensor (an untracked shell), so Tensor-only methods (``t.relu()``, ``t.add(u)``) chain
#: on what the function was given. Any other tracer (inside a raw ``jax.grad``, ``lax.scan``, an
#: Equinox or Flax transformation, nested at any depth) comes back as JAX's own value: JAX needs
#: plain traced values out of a function it transforms.
TRACING: contextvars.ContextVar[tuple[Any, ...]] = contextvars.ContextVar(
    "tidyjax_tracing", default=()
)

#: The active device-memory budgets (``tidyjax.budget``), outermost first; None when there is
#: none, so a ``tidyjax.jit`` call outside every budget pays one ``.get()``. ``_budget`` owns
#: the entries and installs the check each call makes inside one (`set_budget_check`).
BUDGETS: contextvars.ContextVar[tuple[Any, ...] | None] = contextvars.ContextVar(
    "tidyjax_budgets", default=None
)


def budget_limit() -> int | None:
    """The tightest per-device budget active here, in bytes; None outside every budget."""
    state = BUDGETS.get()
    limits = [e.limit for e in state or () if e.per_device]
    return min(limits) if limits else None


def _no_budget_check(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """No budget module installed: nothing is checked."""


#: Called by a ``tidyjax.jit`` call (``fn`` with ``args``, ``kwargs``) while `BUDGETS` holds a
#: budget, before it runs; raises ``BudgetError`` when the call would cross one.
check_budget: Callable[[Any, tuple[Any, ...], dict[str, Any]], None] = _no_budget_check


def set_budget_check(check: Callable[[Any, tuple[Any, ...], dict[str, Any]], None]) -> None:
    """Make ``check`` what `check_budget` runs (``_budget`` at package import)."""
    global check_budget
    check_budget = check


# -- JAX's runtime errors ----------------------------------------------------------------------

JaxErrorHook = Callable[..., None]  # (err, what, operands, method=False, call=None) -> None


def _pass_through(
    err: BaseException,
    what: str,
    operands: tuple[Any, ...],
    method: bool = False,
    call: tuple[Any, tuple[Any, ...], dict[str, Any]] | None = None,
) -> None:
    """No handler installed: every error passes through untouched."""


_jax_error_hook: JaxErrorHook = _pass_through


def on_jax_error(
    err: BaseException,
    what: str,
    operands: tuple[Any, ...] = (),
    method: bool = False,
    call: tuple[Any, tuple[Any, ...], dict[str, Any]] | None = None,
) -> None:
    """Raise tidyjax's error for JAX's runtime error ``err``, raised by ``what`` (an op, a lifted
    function, ``tensor()``) on ``operands``; return for any other, and the caller re-raises it
    untouched:

    ```python
    try:
        out = fn(*args)
    except RuntimeError as e:
        on_jax_error(e, name, args)
        raise
    ```

    ``method``: ``what`` is the name of a Tensor method that waits for (or moves) the buffer of
    ``operands[0]``, the Tensor (``numpy``, ``item``, ``to``...). The handler is installed at
    package import (``_oom.install``: out of memory, a buffer deleted behind tidyjax's back);
    only the error path pays. ``call``: a compiled call that failed (``tidyjax.jit``'s jitted
    function, its arguments and keyword arguments): an out-of-memory report states its XLA
    figures.
    """
    _jax_error_hook(err, what, operands, method, call)


def set_jax_error_hook(hook: JaxErrorHook) -> None:
    """Make ``hook`` the handler `on_jax_error` calls."""
    global _jax_error_hook
    _jax_error_hook = hook
