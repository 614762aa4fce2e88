"""Leak checks: ``check_leaks`` (a context manager and decorator), `LeakReport` and
``leak_error``, also as a collective over the processes of a ``jax.distributed`` job.

A check counts two kinds of leak, apart: **Tensors** made inside and alive at the end (tracked),
and **plain jax.Arrays** made inside and alive at the end that tidyjax does not track
(untracked: the outputs of ``jnp``, a raw ``jax.jit``, NNX or Equinox): the arrays `ArrayMark`
finds, less those tidyjax records, those allowed, and those with no user frame in their creation
traceback (JAX's and installed libraries' own: compiled-function constants, caches, PRNG
internals; a cache filled on a first call *from the user's line* is what a warm-up step removes).
"""

from __future__ import annotations

import collections
import copy
import functools
import gc
import sys
import weakref
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import jax

from . import _html, _registry
from ._census import (
    UNTRACKED,
    SiteStat,
    TensorRecord,
    books,
    held,
    live_holders,
    one_per_buffer,
    site_label,
    site_table,
    statistics,
    tensor_records,
    untracked_record,
)
from ._decorating import decorate
from ._errors import LeakError, TidyjaxTypeError, check_count, check_flag, check_seconds
from ._format import count, esc, fmt_bytes
from ._jaxdoors import base_array
from ._newarrays import ArrayMark
from ._processes import DEFAULT_TIMEOUT, gather
from ._sites import INSTALLED_FOLDERS, LIBRARY_FOLDERS, Entry, Site, creation_site
from ._tensor import _ids
from ._trees import _gather

__all__ = ["UNTRACKED", "LeakReport", "check_leaks", "leak_error", "plain_leaks"]

F = TypeVar("F", bound=Callable[..., Any])


class LeakReport:
    """What a leak check found alive: Tensors (tracked) and plain jax.Arrays (untracked),
    each grouped by creation site.

    ``records`` holds both; a plain array's record has id 0 and scope ``"<untracked>"``.
    ``len(report)`` counts both, ``groups`` the Tensors' sites, ``array_groups`` the plain
    arrays' sites (`SiteStat` rows; a site's ``detail`` the library frame that made them).
    """

    __slots__ = ("records", "where")

    def __init__(self, records: Iterable[TensorRecord], where: str = "check_leaks()") -> None:
        self.records = tuple(records)
        self.where = where

    @property
    def tensors(self) -> tuple[TensorRecord, ...]:
        """The leaked Tensors' records (tracked)."""
        return tuple(r for r in self.records if r.scope != UNTRACKED)

    @property
    def arrays(self) -> tuple[TensorRecord, ...]:
        """The leaked plain jax.Arrays' records (untracked)."""
        return tuple(r for r in self.records if r.scope == UNTRACKED)

    @property
    def groups(self) -> list[SiteStat]:
        """The leaked Tensors by creation site, largest first."""
        return statistics(self.tensors)

    @property
    def array_groups(self) -> list[SiteStat]:
        """The leaked plain arrays by creation site, largest first."""
        return statistics(self.arrays)

    @property
    def num_bytes(self) -> int:
        """The bytes of everything leaked, each buffer once."""
        return _bytes(self.tensors) + _bytes(self.arrays)

    def __len__(self) -> int:
        return len(self.records)

    def _headline(self) -> str:
        tensors, arrays = self.tensors, self.arrays
        parts = []
        if tensors or not arrays:
            parts.append(f"{count(len(tensors), 'tensor')} ({fmt_bytes(_bytes(tensors))})")
        if arrays:
            parts.append(f"{count(len(arrays), 'untracked array')} ({fmt_bytes(_bytes(arrays))})")
        verb = "is" if len(self.records) == 1 else "are"
        return f"{' and '.join(parts)} created inside {self.where} {verb} still alive"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(str(self))

    @_html.never_raises
    def _repr_html_(self) -> str:
        if not self.records:
            return _html.box(f"<b>{esc(f'no leaks after {self.where}')}</b>")
        chains = _chains_of(self)
        return _html.box(
            _html.bad(f"leak: {self._headline()}"),
            site_table(self.groups + self.array_groups,
                       more=lambda g: "".join(_html.dim(f" through {c}") for c in chains(g))),
            _html.line(_html.dim(_advice(self))),
        )  # fmt: skip

    def __str__(self) -> str:
        if not self.records:
            return f"no leaks: no Tensor or jax array created inside {self.where} is still alive."
        lines = [self._headline() + ":"]
        chains = _chains_of(self)
        for g in self.groups + self.array_groups:
            lines += [f"  {g}", *(f"    through {chain}" for chain in chains(g))]
        lines.append(_advice(self))
        return "\n".join(lines)


#: The most distinct stacks a leak report shows under one site.
STACKS_SHOWN = 3


def _chains_of(report: LeakReport) -> Callable[[SiteStat], list[str]]:
    """The distinct stacks under a row of the report (the user frames further in than its
    site, see ``_sites.Entry``), each from the site inward: ``model.py:8 in Model.__call__``."""
    stacks: dict[tuple[bool, str], dict[Any, None]] = collections.defaultdict(dict)
    for r in report.records:
        if r.site is not None and r.site.stack:
            stacks[r.scope == UNTRACKED, site_label(r.site)][r.site.stack] = None

    def chains(g: SiteStat) -> list[str]:
        found = stacks.get((g.untracked, site_label(g.site)), {})
        out = [" -> ".join(str(f) for f in reversed(st)) for st in found]
        more = [f"... and {len(out) - STACKS_SHOWN} more"] * (len(out) > STACKS_SHOWN)
        return out[:STACKS_SHOWN] + more

    return chains


def _bytes(records: Iterable[TensorRecord]) -> int:
    return sum({r._buffer: r.bytes for r in records}.values())


def _advice(report: LeakReport) -> str:
    """What frees each kind of leak found: a scope frees Tensors, never a plain jax array."""
    parts = []
    if report.tensors:
        parts.append("Tensors: dispose them, or create them inside a tidy scope that frees them.")
    if report.arrays:
        parts.append(
            "Plain jax arrays (a tidy scope frees no plain jax array): drop the references "
            "to them, or make them tracked, and a tidy scope frees them: compute them with "
            "tidyjax (a function lifted with tidyjax.lift, tidyjax.numpy) or hand them over "
            "with tidyjax.adopt(x) (tidyjax.tensors(x) only borrows a caller's array)."
        )
    parts.append(
        "Or allow them (check_leaks(allowance=N), checker.allow(x)). A cache filled on a first "
        "call: run one step before the check."
    )
    return " ".join(parts)


def leak_error(
    leaked: list[TensorRecord],
    allowance: int,
    where: str,
    all_processes: bool = False,
    timeout: float = DEFAULT_TIMEOUT,
    checker: check_leaks | None = None,
) -> LeakError | None:
    """The `LeakError` to raise if more than ``allowance`` Tensors and plain arrays
    (together) leaked, or None: returned, so that the frame raising it is the caller's (IPython
    shows the innermost frame of a traceback)."""
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


def _made_by_user(arr: Any) -> bool:
    """Whether ``arr``'s creation traceback has a user frame (not an array JAX, tidyjax or an
    installed library made for itself)."""
    site = creation_site(arr)
    return site is not None and not site.file.startswith(LIBRARY_FOLDERS + INSTALLED_FOLDERS)


def plain_leaks(
    mark: ArrayMark,
    allowed: dict[int, Any] | None = None,
    site_of: Callable[[Any], Site | None] = creation_site,
) -> list[TensorRecord]:
    """A record of each plain jax.Array made since ``mark``, alive, with a user frame in its
    traceback (see the module docstring), that no live Tensor's buffer and no array in
    ``allowed`` (ids to weak references) holds, largest first: one per device buffer (the
    oldest object over a buffer stands for it). Plain: not recorded by tidyjax, or a Tensor's
    array that outlived every Tensor on its buffer (``t.array`` kept, ``t`` dropped).
    ``site_of``: how a site is found (`check_leaks` names the outermost user frame inside it).
    """
    found = [a for a in _candidates(mark, allowed) if _made_by_user(a)]
    if not found:
        return []
    taken = [r() for r in (allowed or {}).values()] + _held_arrays() + _older(mark)
    kept = one_per_buffer(found, taken, wait=True)
    return sorted((untracked_record(a, site_of) for a in kept), key=lambda r: -r.bytes)


def _older(mark: ArrayMark) -> list[Any]:
    """The arrays alive now that were alive at ``mark``: a new object over one of their
    buffers (a shard view, a raw ``device_put`` to where it is) holds no new memory."""
    new = {id(a) for a in mark.new()}
    platforms = {d.platform for d in jax.local_devices()}
    return [a for p in platforms for a in jax.live_arrays(p) if id(a) not in new]


def _held_arrays() -> list[Any]:
    """The array objects over the buffers that live Tensors hold."""
    recs, _ = books()
    return [a for r in recs if held(r) for a in r.arrays()]


def _candidates(mark: ArrayMark, allowed: dict[int, Any] | None) -> list[Any]:
    """The arrays made since ``mark`` that no live Tensor holds and ``allowed`` lacks, oldest
    first: those tidyjax does not record, and recorded ones no Tensor holds any more."""
    allowed = allowed or {}
    out = []
    for a in reversed(mark.new()):
        ref = allowed.get(id(a))
        if ref is not None and ref() is a:
            continue
        rec = _registry.lookup(a)
        if rec is None or (rec.dead is None and not held(rec)):
            out.append(a)
    if out:  # jax.live_arrays lists a recorded typed key as its words: that is the Tensor
        words = {id(w) for k in _held_arrays() if (w := base_array(k)) is not k}
        out = [a for a in out if id(a) not in words]
    return out


class check_leaks:  # noqa: N801 - used like a function, as a context manager and decorator
    """Fail when Tensors or plain jax.Arrays created inside are still alive at the end.

    Forms:

    ```python
    with tidyjax.check_leaks() as checker:
        out = step()
        checker.allow(out)              # alive on purpose

    @tidyjax.check_leaks(allowance=2)   # each call checked; its return value is allowed
    def step(): ...
    ```

    Plain jax.Arrays (``jnp``, raw ``jax.jit``, NNX, Equinox outputs) count by default, apart
    from Tensors; only those whose creation traceback has a user frame (JAX's and libraries'
    own caches have none). Run one step before the check so that caches a first call fills
    are full. ``arrays=False`` counts Tensors only.

    Args:
        allowance: how many leaks (Tensors and plain arrays together) to tolerate.
        allow_returned: in the decorator form, Tensors and arrays in the return value are not
            leaks.
        allow_kept: Tensors marked with [`tidyjax.keep`][tidyjax.keep] are not leaks.
        arrays: also count plain jax.Arrays (default True).
        all_processes: a collective over every process of a ``jax.distributed`` job (each
            must run the check): a leak beyond ``allowance`` on any process fails every
            process, and the report names the process.
        timeout: seconds ``all_processes`` waits for every process.

    Raises:
        LeakError: with a [`LeakReport`][tidyjax.LeakReport] (``err.report``) grouped by site:
            the outermost line of your code inside the checked block that led to each leak (a
            model called from two lines leaks at two sites), your frames further in shown under
            it (``site.stack``). One device buffer counts once, whatever array objects view it.
            Not raised when the block itself raised. Tensors and arrays made by other threads
            meanwhile count too: check code that runs alone.
        CollectiveError: with ``all_processes``, a process did not check within ``timeout``.
    """

    def __init__(
        self,
        *,
        allowance: int = 0,
        allow_returned: bool = True,
        allow_kept: bool = False,
        arrays: bool = True,
        all_processes: bool = False,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        self.allow_returned = check_flag(allow_returned, "allow_returned", "check_leaks()")
        self.allow_kept = check_flag(allow_kept, "allow_kept", "check_leaks()")
        self.arrays = check_flag(arrays, "arrays", "check_leaks()")
        self.all_processes = check_flag(all_processes, "all_processes", "check_leaks()")
        self.allowance = check_count(allowance, "allowance", "check_leaks()")
        self.timeout = check_seconds(timeout, "timeout", "check_leaks()")
        self._start: int | None = None
        self._mark: ArrayMark | None = None
        self._allowed: set[int] = set()
        self._allowed_arrays: dict[int, Any] = {}
        self._entry: Entry | None = None
        self.report: LeakReport | None = None

    def allow(self, *values: Any) -> None:
        """Do not count the Tensors and jax.Arrays in ``values`` (any pytrees, objects holding
        them) as leaks."""
        tensors: list[Any] = []
        raws: list[Any] = []
        _gather(values, tensors, raws)
        self._allowed.update(t._id for t in tensors)
        for arr in raws:
            for a in (arr, base_array(arr)):  # jax.live_arrays lists a typed key's words
                self._allowed_arrays[id(a)] = weakref.ref(a)

    def __enter__(self) -> check_leaks:
        self._allowed = set()
        self._allowed_arrays = {}
        self.report = None
        self._mark = ArrayMark() if self.arrays else None
        self._entry = Entry(sys._getframe(1))  # the frame the block runs in (see sites)
        self._start = next(_ids)
        return self

    def __exit__(self, exc_type: Any, *exc: object) -> None:
        __tracebackhide__ = True
        if exc_type is None and (error := self._error()) is not None:
            raise error

    def leaked(self) -> list[TensorRecord]:
        """The Tensors, then the plain arrays, made since entering that are alive and not
        allowed (with none made, one walk of the newest arrays and no garbage collection).
        Each record's ``site`` is the outermost user frame inside the checked block, its
        ``site.stack`` the user frames further in.
        """
        if self._start is None:
            raise TidyjaxTypeError("check_leaks: enter it (with-block) before checking.")
        made_tensors = next(_ids) > self._start + 1  # ids only grow: none made, none leaked
        mark = self._mark
        if not made_tensors and (mark is None or not _candidates(mark, self._allowed_arrays)):
            return []
        gc.collect()
        entry = self._entry
        site_of = creation_site if entry is None else functools.partial(entry.site, cache={})
        out = [
            r
            for r in tensor_records(self._start, site_of=site_of, holding=self._holding())
            if r.id not in self._allowed and not (self.allow_kept and r.kept)
        ] if made_tensors else []  # fmt: skip
        if mark is not None:
            out += plain_leaks(mark, self._allowed_arrays, site_of)
        return out

    def _holding(self) -> list[tuple[Any, list[Any]]]:
        """The live records with their Tensors, less those sharing an allocation with an
        allowed array (``allow(raw)`` of a raw alias allows the Tensors over its buffer)."""
        holding = live_holders()
        allowed = [a for r in self._allowed_arrays.values() if (a := r()) is not None]
        keys: set[tuple[int, int]] = set()
        for a in allowed:
            keys.update(_registry.shards(a, wait=False) or ())
        if not keys:
            return holding
        return [
            (rec, ts)
            for rec, ts in holding
            if not any(
                keys.intersection(_registry.shards(a, wait=False) or ()) for a in rec.arrays()
            )
        ]

    def check(self) -> None:
        """Raise `LeakError` if more than ``allowance`` Tensors and arrays leaked."""
        __tracebackhide__ = True
        if (error := self._error()) is not None:
            raise error

    def _error(self) -> LeakError | None:
        return leak_error(self.leaked(), self.allowance, "check_leaks()", self.all_processes,
                          self.timeout, self)  # fmt: skip

    def __call__(self, fn: F) -> F:
        # each call a fresh checker with these settings (``__enter__`` resets all the rest)
        allow = check_leaks.allow if self.allow_returned else None
        return decorate(fn, lambda: copy.copy(self), "@check_leaks", allow)
