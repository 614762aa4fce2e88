"""``budget(limit)``: a device-memory budget that stops a ``tidyjax.jit`` call before it runs
when its plan would cross the limit, and the check each such call makes.

The state is a tuple of the active budgets in a ``ContextVar`` (``BUDGETS``): ``None`` when
none is active, so a ``tidyjax.jit`` call outside every budget pays one ``.get()``. Each thread
starts with none; an asyncio task sees the budgets of the code that created it.

Inside a budget, each call of a ``tidyjax.jit`` object is planned first: XLA's figures of the
call (`_plan.call_figures`, a compile JAX caches) are kept per function and signature (the
tree, each array's shape, dtype, weak type and sharding, each other leaf's value:
`_plan.kept_call_figures`, whose cache the profile and timeline observers share), so a repeated
call neither lowers nor compiles again; what is live is counted by one census, which reads no
creation site. Only when the call would cross a budget does the error path read the full
``memory()`` and build the plan the error carries.
"""

from __future__ import annotations

import decimal
import re
import reprlib
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any, NamedTuple, TypeVar

import numpy as np

from ._census import (
    Census,
    SiteStat,
    census,
    holder_lines,
    holder_rows,
    site_key,
    summed,
    top_per_device,
)
from ._context import BUDGETS, budget_limit, set_budget_check
from ._decorating import decorate
from ._errors import (
    BudgetError,
    ScopeError,
    TidyjaxTypeError,
    TidyjaxValueError,
    check_flag,
)
from ._format import fmt_bytes
from ._memory import DEVICE_TOP, memory
from ._newarrays import ArrayMark
from ._plan import (
    CACHE_SIZE,
    TRACED,
    CallFigures,
    MemoryPlan,
    call_figures,
    kept_call_figures,
    new_per_device,
    plan_now,
)

__all__ = [
    "ALL_DEVICES", "BUDGETS", "CACHE_SIZE", "budget", "budget_limit", "check_call", "parse_limit",
]  # fmt: skip

F = TypeVar("F", bound=Callable[..., Any])

#: Bytes per unit a limit string may name (case is ignored): decimal and binary.
UNITS = {
    "b": 1, "byte": 1, "bytes": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}  # fmt: skip

_LIMIT = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-z]*)\s*", re.IGNORECASE)

FORMS = (
    "a number of bytes (an int >= 0, e.g. 2 * 2**30) or a string such as '2 GiB', '512 MiB', "
    "'2 GB' or '1.5GB' (B; KiB, MiB, GiB, TiB: powers of 1024; KB, MB, GB, TB: powers of 1000)"
)

#: The kinds of census rows that hold device memory: every live jax.Array, each buffer once.
_KINDS = ("tensor", "escaped", "watched", "untracked")

FIX = (
    "To fit: a smaller batch (tidyjax.largest_fitting finds the largest that fits this budget), "
    "donate the arguments the call replaces (tidyjax.jit(fn, donate_argnums=...)), free what is "
    "live (dispose(), tidy()), or size the call beforehand with tidyjax.plan(fn, *args); or "
    "raise the budget."
)


class _Entry(NamedTuple):
    """One active budget: its limit in bytes, whether per device, the `budget` entered, and
    the newest arrays when it was entered (what was made before it)."""

    limit: int
    per_device: bool
    owner: budget
    mark: ArrayMark


def parse_limit(value: object, what: str) -> int:
    """``value`` as bytes: an int >= 0 (a NumPy integer too) or a string such as ``"2 GiB"``,
    ``"512 MiB"``, ``"2 GB"``, ``"1.5GB"`` (a fraction of a byte is dropped). ``what`` names
    it in an error: ``"tidyjax.budget()'s limit"``.

    Raises:
        TidyjaxTypeError: neither an int nor a string (a float, a bool, None).
        TidyjaxValueError: a negative int, or a string not of that form.
    """
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        if value >= 0:
            return int(value)
        raise TidyjaxValueError(f"{what} must be {FORMS}; got {value}, below 0.")
    if isinstance(value, str):
        m = _LIMIT.fullmatch(value)
        unit = UNITS.get(m.group(2).lower() if m and m.group(2) else "b") if m else None
        if m is not None and unit is not None:
            return int(decimal.Decimal(m.group(1)) * unit)
        raise TidyjaxValueError(f"{what} must be {FORMS}; got {value!r}.")
    raise TidyjaxTypeError(
        f"{what} must be {FORMS}; got {type(value).__name__} {reprlib.repr(value)}."
    )


class budget:  # noqa: N801 - used like a function, as a context manager and decorator
    """A device-memory budget: inside it, a call of a [`tidyjax.jit`][tidyjax.jit] function
    that would take a device past ``limit`` raises [`BudgetError`][tidyjax.BudgetError]
    *before it runs* (nothing allocated, donated or freed).

    Forms:

    ```python
    with tidyjax.budget("2 GiB"):
        loss = train_step(params, batch)      # a tidyjax.jit function: planned, then run

    @tidyjax.budget("512 MiB")                # each call of evaluate runs inside the budget
    def evaluate(params, batch): ...
    ```

    What counts, on each device of the call: every live ``jax.Array`` there (Tensors, watched
    and plain arrays, each buffer once, those made before the budget too), plus what the call
    adds: its outputs and XLA's temporaries, less the donated bytes its outputs reuse, plus
    arguments not on the device yet. XLA's figures are read once per signature (the shapes,
    dtypes and shardings of the arrays, the values of the other arguments): the first call of
    each is traced and compiled once more to plan it, a repeated call is not. On CPU they are
    XLA:CPU's estimate of the program, which can differ from the same program's on a GPU.

    What is checked: each call of a ``tidyjax.jit`` object made inside the budget, from this
    thread (or an asyncio task it started). Eager Tensor operations, ``tidyjax.numpy`` and raw
    ``jax.jit`` calls are not checked per call (JAX has no per-call hook): for raw code, call
    [`tidyjax.plan`][tidyjax.plan] before running; a plan made inside a budget plans against
    it. A call whose figures XLA does not give is not checked. Under ``jax.distributed`` a
    budget is per process (its local devices).

    Nested budgets all hold: the tightest wins. Each thread starts with none.

    Args:
        limit: bytes (an int) or a string: ``"2 GiB"``, ``"512 MiB"`` (powers of 1024),
            ``"2 GB"``, ``"1.5GB"`` (powers of 1000).
        per_device: the limit holds on each device (default); with False, for the process's
            devices together.

    Raises:
        TidyjaxTypeError: ``limit`` is not an int or a string, ``per_device`` not a bool.
        TidyjaxValueError: ``limit`` is negative or a string of another form.
        BudgetError: from a call inside, which would cross the budget.
        ScopeError: budgets exited out of order.
    """

    def __init__(self, limit: int | str, *, per_device: bool = True) -> None:
        self.limit_bytes = parse_limit(limit, "tidyjax.budget()'s limit")
        self.per_device = check_flag(per_device, "per_device", "tidyjax.budget()")

    def __repr__(self) -> str:
        return f"tidyjax.budget({fmt_bytes(self.limit_bytes)}, per_device={self.per_device})"

    def __enter__(self) -> budget:
        entry = _Entry(self.limit_bytes, self.per_device, self, ArrayMark())
        BUDGETS.set((*(BUDGETS.get() or ()), entry))
        return self

    def __exit__(self, *exc: object) -> None:
        state = BUDGETS.get() or ()
        if not state or state[-1].owner is not self:
            raise ScopeError(
                f"{self!r} exited while it is not the innermost budget of this thread or task: "
                "exit budgets in the reverse order of entering them, in the thread or task that "
                "entered them (use `with`)."
            )
        BUDGETS.set(state[:-1] or None)

    def __call__(self, fn: F) -> F:
        # each call in a fresh budget of the same limit: a call in each thread is its own
        return decorate(fn, lambda: budget(self.limit_bytes, per_device=self.per_device),
                        "@tidyjax.budget")  # fmt: skip


# -- the check of one call ---------------------------------------------------------------------


def check_call(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Raise `BudgetError` if the call ``fn(*args, **kwargs)`` of a ``tidyjax.jit`` object
    would cross an active budget; return at once outside every budget.

    Raises:
        BudgetError: before the call, with its plan.
        OutOfMemoryError: XLA ran out of memory compiling the call.
    """
    state = BUDGETS.get()
    if not state:
        return
    call = kept_call_figures(fn, args, kwargs, call_figures)  # kept per signature
    if call is None or call is TRACED:  # cannot be planned, or in a trace: the outer is checked
        return
    new = new_per_device(call, args, kwargs)
    if any(b is None for b in new.values()):  # XLA gave no figures: nothing to check
        return
    c = census(untracked=True)
    live = c.per_device(*_KINDS)
    worst: tuple[_Entry, Any] | None = None
    for entry in state:  # the tightest budget crossed is the one to report
        device = _over(entry, live, new)
        if device is not None and (worst is None or entry.limit < worst[0].limit):
            worst = (entry, device)
    if worst is not None:
        raise _error(*worst, call, args, kwargs, c, live, new)


def _holders_together(c: Census) -> tuple[SiteStat, ...]:
    """The largest live holders on the devices together: `memory()`'s rows of each device
    merged by site (or watched name), a Tensor over several devices counted once with its
    bytes on all of them."""
    on_all: Counter[Any] = Counter()
    for r in holder_rows(c):
        on_all[r.kind, site_key(r.site), r.name] += r.bytes
    rows = [
        replace(r, bytes=on_all[r.kind, site_key(r.site), r.name])
        for r in holder_rows(c, per_device=False)
    ]
    return tuple(top_per_device(rows, DEVICE_TOP))


#: What `_over` returns for a budget of the devices together (``per_device=False``).
ALL_DEVICES = "all devices"


def _over(entry: _Entry, live: Mapping[Any, int], new: Mapping[Any, int | None]) -> Any:
    """The device the call would take over ``entry``'s limit (the most over), `ALL_DEVICES`
    for a budget of the devices together, or None when the call fits."""
    if not entry.per_device:
        total = sum(live.values()) + sum(b or 0 for b in new.values())
        return ALL_DEVICES if total > entry.limit else None
    over = {d: live.get(d, 0) + (b or 0) - entry.limit for d, b in new.items()}
    device = max(over, key=lambda d: over[d])
    return device if over[device] > 0 else None


def _error(
    entry: _Entry,
    device: Any,
    call: CallFigures,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    c: Census,
    live: Mapping[Any, int],
    new: Mapping[Any, int | None],
) -> BudgetError:
    made = {id(a) for a in entry.mark.new()}
    since = summed(dict(r.spread) for r in c.rows if id(r.array) in made)
    if device is ALL_DEVICES:
        live_b, new_b = sum(live.values()), sum(b or 0 for b in new.values())
        since_b = sum(since.values())
        where, name = "this process's devices together", ALL_DEVICES
    else:
        live_b, new_b, since_b = live.get(device, 0), new[device] or 0, since.get(device, 0)
        where = name = str(device)
    before = max(0, live_b - since_b)
    plan = plan_now(call, args, kwargs, memory(), budget_limit())
    holders = plan.holders if device is not ALL_DEVICES else _holders_together(c)
    message = _message(entry, call, plan, holders, where, device, live_b, before, new_b)
    return BudgetError(
        message,
        plan,
        function=call.name,
        device=name,
        budget_bytes=entry.limit,
        live_bytes=live_b,
        before_bytes=before,
        new_bytes=new_b,
    )


def _message(
    entry: _Entry,
    call: CallFigures,
    plan: MemoryPlan,
    holders: tuple[SiteStat, ...],
    where: str,
    device: Any,
    live: int,
    before: int,
    new: int,
) -> str:
    f = call.figures
    out, temp, alias = f["output_bytes"] or 0, f["temp_bytes"] or 0, f["alias_bytes"] or 0
    kind = "per device" if entry.per_device else "for the devices together"
    lines = [
        f"tidyjax.budget: calling {call.name} would take {where} to a peak of "
        f"{fmt_bytes(live + new)} ({fmt_bytes(live)} live + {fmt_bytes(new)} new), over the "
        f"budget of {fmt_bytes(entry.limit)} {kind} by {fmt_bytes(live + new - entry.limit)}. "
        "It did not run: nothing was allocated, donated or freed.",
        f"  live on {where}: {fmt_bytes(live)}, of it {fmt_bytes(before)} made before the "
        f"budget was entered and {fmt_bytes(live - before)} inside it",
    ]
    added = (
        f"outputs {fmt_bytes(out)} + XLA temporaries {fmt_bytes(temp)} - donated "
        f"{fmt_bytes(alias)} (reused by outputs)"
    )
    pending = new - (out + temp - alias) * (len(call.devices) if device is ALL_DEVICES else 1)
    if pending > 0:
        added += f" + arguments not on the device yet {fmt_bytes(pending)}"
    n = len(call.devices)
    each = f"on each of its {n} devices" if n > 1 else f"on {call.devices[0]}"
    lines.append(f"  {call.name} adds, {each}: {added}")
    shown = holder_lines(holders, None if device is ALL_DEVICES else str(device))
    if shown:
        lines.append(f"  largest live holders on {where}:")
        lines += shown
    lines.append(f"  {FIX}")
    return "\n".join(lines)


set_budget_check(check_call)  # every tidyjax.jit call inside a budget runs it
