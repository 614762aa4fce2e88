"""Leak checks: ``check_leaks`` (a context manager and decorator), :class:`LeakReport` and
``leak_error``, also as a collective over the processes of a ``jax.distributed`` job.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from ._decorating import decorate
from ._errors import LeakError, TidyjaxTypeError
from ._format import count as _count
from ._format import fmt_bytes as _fmt_bytes
from ._processes import DEFAULT_TIMEOUT, gather
from ._records import TensorRecord, live_tensors
from ._snapshot import SiteStat, Snapshot, stats_html
from ._tensor import _ids
from ._trees import tensors_in

__all__ = ["LeakReport", "check_leaks", "leak_error"]

F = TypeVar("F", bound=Callable[..., Any])


class LeakReport:
    """Tensors found alive by a leak check, grouped by creation site."""

    __slots__ = ("records", "where")

    def __init__(self, records: Iterable[TensorRecord], where: str = "check_leaks()") -> None:
        self.records = tuple(records)
        self.where = where

    @property
    def groups(self) -> list[SiteStat]:
        return Snapshot(self.records).statistics()

    @property
    def num_bytes(self) -> int:
        return sum({r._buffer: r.bytes for r in self.records}.values())

    def __len__(self) -> int:
        return len(self.records)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(str(self))

    def _repr_html_(self) -> str:
        if not self.records:
            return stats_html(f"no leaks after {self.where}", [])
        return stats_html(
            f"leak: {_count(len(self.records), 'tensor')}, {_fmt_bytes(self.num_bytes)} still "
            f"alive after {self.where}",
            self.groups,
            bad=True,
            note=_LEAK_FIX,
        )

    def __str__(self) -> str:
        n = len(self.records)
        if not n:
            return f"no leaks: no Tensor created inside {self.where} is still alive."
        lines = [
            f"{_count(n, 'tensor')} ({_fmt_bytes(self.num_bytes)}) created inside "
            f"{self.where} {'is' if n == 1 else 'are'} still alive:"
        ]
        lines += [f"  {g}" for g in self.groups]
        lines.append(_LEAK_FIX)
        return "\n".join(lines)


_LEAK_FIX = (
    "Dispose them, create them inside a tidy scope that frees them, or allow them "
    "(check_leaks(allowance=N), checker.allow(t))."
)


def leak_error(
    leaked: list[TensorRecord],
    allowance: int,
    where: str,
    all_processes: bool = False,
    timeout: float = DEFAULT_TIMEOUT,
    checker: check_leaks | None = None,
) -> LeakError | None:
    """The :class:`LeakError` to raise if more than ``allowance`` Tensors leaked, or None.

    Returned, not raised, so that the frame raising it is the caller's: the fewer tidyjax
    frames in a traceback, the fewer IPython shows (it always shows the innermost one).
    """
    report = LeakReport(leaked, where)
    if checker is not None:
        checker.report = report
    if not all_processes:
        return LeakError(str(report), report) if len(leaked) > allowance else None
    payload = {"tensors": [r.to_json() for r in leaked]}
    per_process = [
        [TensorRecord.from_json(d) for d in got["tensors"]]
        for got in gather("check_leaks", payload, timeout)
    ]
    failing = [(i, recs) for i, recs in enumerate(per_process) if len(recs) > allowance]
    if not failing:
        return None
    names = ", ".join(str(i) for i, _ in failing)
    processes = "process" if len(failing) == 1 else "processes"
    report = LeakReport([r for _, recs in failing for r in recs], f"{where} on {processes} {names}")
    if checker is not None:
        checker.report = report
    message = "\n".join(str(LeakReport(recs, f"{where} on process {i}")) for i, recs in failing)
    return LeakError(message, report)


class check_leaks:  # noqa: N801 - used like a function, as a context manager and decorator
    """Fail when Tensors created inside are still alive at the end.

    Forms::

        with tidyjax.check_leaks() as checker:
            out = step()
            checker.allow(out)              # alive on purpose

        @tidyjax.check_leaks(allowance=2)   # each call checked; its return value is allowed
        def step(): ...

    Args:
        allowance: how many leaked Tensors to tolerate.
        allow_returned: in the decorator form, Tensors in the return value are not leaks.
        allow_kept: Tensors marked with :func:`tidyjax.keep` are not leaks.
        all_processes: a collective over every process of a ``jax.distributed`` job (each
            must run the check): a leak beyond ``allowance`` on any process fails every
            process, and the report names the process.
        timeout: seconds ``all_processes`` waits for every process.

    Raises:
        LeakError: with a :class:`LeakReport` (``err.report``) grouped by creation site. Not
            raised when the block itself raised. Tensors made by other threads meanwhile
            count too: check code that runs alone.
        CollectiveError: with ``all_processes``, a process did not check within ``timeout``.
    """

    def __init__(
        self,
        *,
        allowance: int = 0,
        allow_returned: bool = True,
        allow_kept: bool = False,
        all_processes: bool = False,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        if not isinstance(allowance, int) or allowance < 0:
            raise TidyjaxTypeError(f"allowance must be an int >= 0, got {allowance!r}.")
        self.allowance = allowance
        self.all_processes = all_processes
        self.timeout = timeout
        self.allow_returned = allow_returned
        self.allow_kept = allow_kept
        self._start: int | None = None
        self._allowed: set[int] = set()
        self.report: LeakReport | None = None

    def allow(self, *values: Any) -> None:
        """Do not count the Tensors in ``values`` (any pytrees) as leaks."""
        self._allowed.update(t._id for t in tensors_in(values))

    def __enter__(self) -> check_leaks:
        self._start = next(_ids)
        self._allowed = set()
        self.report = None
        return self

    def __exit__(self, exc_type: Any, *exc: object) -> None:
        __tracebackhide__ = True
        if exc_type is None and (error := self._error()) is not None:
            raise error

    def leaked(self) -> list[TensorRecord]:
        """The Tensors made since entering that are alive and not allowed."""
        if self._start is None:
            raise TidyjaxTypeError("check_leaks: enter it (with-block) before checking.")
        gc.collect()
        return [
            r
            for r in live_tensors()
            if r.id > self._start and r.id not in self._allowed and not (self.allow_kept and r.kept)
        ]

    def check(self) -> None:
        """Raise :class:`LeakError` if more than ``allowance`` Tensors leaked."""
        __tracebackhide__ = True
        if (error := self._error()) is not None:
            raise error

    def _error(self) -> LeakError | None:
        return leak_error(self.leaked(), self.allowance, "check_leaks()", self.all_processes,
                          self.timeout, self)  # fmt: skip

    def __call__(self, fn: F) -> F:
        settings: dict[str, Any] = {
            "allowance": self.allowance,
            "allow_returned": self.allow_returned,
            "allow_kept": self.allow_kept,
            "all_processes": self.all_processes,
            "timeout": self.timeout,
        }
        allow = _allow_result if self.allow_returned else None
        return decorate(fn, lambda: check_leaks(**settings), "@check_leaks", allow)


def _allow_result(checker: check_leaks, result: Any) -> None:
    checker.allow(result)
