"""`Tally`: the running count of tidyjax's device bytes, an observer of the registry's events.

Its ``total`` is ``memory().num_bytes`` whenever it is read (after `settle`): the bytes of the
buffers the books count, each buffer once. It keeps no address of its own: the records over one
buffer are those the registry groups (its ``joined`` and ``split`` events,
`_registry.grouped`) or, for a record the registry has not resolved yet (a suspect), those
`_registry.sharing` finds. A buffer's records form one *part*, counted with the bytes of its
oldest record, as ``memory()`` counts a group. `profile()` is built on it; the timeline keeps
its own events.
"""

from __future__ import annotations

import collections
import functools
import threading
import weakref
from typing import Any

from . import _registry
from ._arrays import failed
from ._census import books, holds, released

__all__ = ["WAIT", "Tally", "follow"]

#: How long (seconds) an event waits for an observer's lock that another thread holds before it
#: is queued for that thread: long enough for a handler or a sampler's look, short enough that
#: a thread holding a lock of the registry which that thread waits for is held up once, briefly.
WAIT = 0.02


def follow(watch: dict[int, list[weakref.ref[Any]]], rec: Any, collected: Any) -> None:
    """Hear of the collection of ``rec``'s array objects that the registry does not report
    (all of them for a record made while nobody observed, the extra objects of an alias):
    ``collected(rec, ref)`` is called for each, its weak references kept in ``watch``. For an
    observer (the tally, the timeline)."""
    refs = watch.setdefault(id(rec), [])
    seen = {id(r()) for r in refs}
    first = rec() if rec.__callback__ is not None else None
    for arr in rec.arrays():
        if arr is not first and id(arr) not in seen:
            refs.append(weakref.ref(arr, functools.partial(collected, rec)))


class _Part:
    """The counted records over one buffer: id -> (order counted, record); ``nbytes`` its
    count, the bytes of its oldest record still holding the buffer."""

    __slots__ = ("members", "nbytes")

    def __init__(self) -> None:
        self.members: dict[int, tuple[int, Any]] = {}
        self.nbytes = 0


class Tally:
    """The bytes and Tensors the books count, kept from the registry's events while started
    (`start` .. `stop`). `rose` hears each rise of ``total``; `made` each new record."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.total = 0
        self.tensors = 0
        self._parts: dict[int, _Part] = {}  # id(record) -> its part
        self._zero: set[int] = set()  # ids of counted records whose computation failed
        self._seq = 0
        self._pending: list[Any] = []  # committed records just added: over a counted buffer?
        # the events told and not handled yet: (kind, record, change in the Tensors counted)
        self._queue: collections.deque[tuple[str, Any, int]] = collections.deque()
        self._busy = False
        self._watch: dict[int, list[weakref.ref[Any]]] = {}

    # -- hooks -----------------------------------------------------------------------------

    def rose(self, total: int) -> None:
        """``total`` is higher than before the event that raised it."""

    def made(self, rec: Any) -> None:
        """``rec`` is a new record (in the thread that made it)."""

    # -- start and stop --------------------------------------------------------------------

    def start(self) -> None:
        """Count what the books count now, then listen to the registry."""
        alive, deleted = books()
        with self.lock:
            self.tensors = sum(max(r.n, 0) for r in alive + deleted)
            _registry.observers.append(self)
            for rec in alive:
                if id(rec) not in self._parts:
                    self._add(rec)
            self.forget_failed()
        self.pump()  # what another thread told meanwhile

    def stop(self) -> None:
        with self.lock:
            if self in _registry.observers:
                _registry.observers.remove(self)
            self._parts.clear()
            self._watch.clear()
            self._pending.clear()
            self._queue.clear()

    def settle(self) -> None:
        """Count the committed records just added (each a new buffer, or one more record over
        a counted one)."""
        with self.lock:
            if (self._pending or self._queue) and not self._busy:
                self._run(settle=True)
        self.pump()  # what another thread told meanwhile

    def forget_failed(self) -> None:
        """Count 0 bytes for each counted buffer whose computation has failed by now (it never
        held memory; JAX tells only when asked, so this runs at a start and a stop)."""
        with self.lock:
            for part in list({id(p): p for p in self._parts.values()}.values()):
                for _, rec in list(part.members.values()):
                    arr = rec.array()
                    if id(rec) not in self._zero and arr is not None and failed(arr):
                        self._zero.add(id(rec))
                        self._reweigh(part)

    # -- the observer ----------------------------------------------------------------------

    def event(self, kind: str, rec: Any, tensor: int = 0) -> None:
        """A change to the registry's books (see ``_registry.notify``): queued, then handled
        (`pump`)."""
        if kind == "buffer_added":
            self.made(rec)
        if kind in ("buffer_added", "tensor_added"):
            delta = 1
        elif kind == "tensor_removed":
            delta = -1
        else:  # a freed buffer's remaining holders are disposed with it
            delta = -max(rec.n, 0) if kind == "buffer_freed" else 0
        self._queue.append((kind, rec, delta))
        self.pump()

    def pump(self) -> None:
        """Handle the queued events, unless another thread holds ``lock`` past `WAIT` or this
        thread is handling one already (a collection inside a handler). The holder handles
        them as it lets go: an event a finalizer tells must not wait for it (it may be waiting
        for a lock of the registry that the finalizer's thread holds)."""
        while self._queue and not self._busy:
            if not self.lock.acquire(timeout=WAIT):
                return
            try:
                if not self._busy:
                    self._run(settle=False)
            finally:
                self.lock.release()

    def _run(self, settle: bool) -> None:
        """Handle the queued events (the pending records first, with ``settle``); a rise of the
        total is told once, after them."""
        before = self.total
        self._busy = True
        try:
            if settle:
                self._settle()
            self._drain()
        finally:
            self._busy = False
        if self.total > before:
            self.rose(self.total)

    def _drain(self) -> None:
        queue = self._queue
        while queue:
            kind, rec, delta = queue.popleft()
            self.tensors += delta
            if kind == "buffer_added":
                if getattr(rec(), "committed", False):
                    self._pending.append(rec)  # an alias of a counted buffer? (`_settle`)
                elif id(rec) not in self._parts and holds(rec):
                    self._add(rec)
                continue
            if self._pending:  # first the buffers just added
                self._settle()
            if kind == "tensor_added":
                if id(rec) not in self._parts and holds(rec) and not released(rec):
                    self._add(rec)
                elif rec.more:
                    self._follow(rec)
            elif kind == "tensor_removed":
                if released(rec):  # a caller's array again (``_census.released``)
                    self._remove(rec)
            elif kind in ("buffer_freed", "buffer_collected"):
                self._remove(rec)
            elif kind == "joined":  # the registry grouped records over one buffer
                self._join(rec, _registry.grouped(rec) or ())
            elif kind == "split":  # ``rec``'s group is a buffer of its own now
                self._split(rec, _registry.grouped(rec) or (rec,))

    # -- the parts -------------------------------------------------------------------------

    def _settle(self) -> None:
        pending, self._pending = self._pending, []
        found = _registry.sharing(pending)
        for rec in pending:
            if id(rec) not in self._parts and holds(rec) and not released(rec):
                self._add(rec, found.get(id(rec), ()))

    def _add(self, rec: Any, others: Any = ()) -> None:
        """Count ``rec``: a buffer of its own, or one more record over the parts of ``others``
        and of its group."""
        self._seq += 1
        part = self._parts[id(rec)] = _Part()
        part.members[id(rec)] = (self._seq, rec)
        part.nbytes = rec.size()
        self.total += part.nbytes
        if rec.__callback__ is None or rec.more:
            self._follow(rec)
        self._join(rec, [*(_registry.grouped(rec) or ()), *others])

    def _join(self, rec: Any, others: Any) -> None:
        """``rec`` and each counted record of ``others`` are over one buffer: one part."""
        part = self._parts.get(id(rec))
        if part is None:
            return
        for other in others:
            theirs = self._parts.get(id(other))
            if theirs is None or theirs is part:
                continue
            if len(theirs.members) > len(part.members):
                part, theirs = theirs, part
            self.total -= theirs.nbytes
            for key, member in theirs.members.items():
                part.members[key] = member
                self._parts[key] = part
            self._reweigh(part)

    def _split(self, rec: Any, group: Any) -> None:
        """The counted records of ``group`` (``rec``'s) leave their part: a buffer of their own."""
        part = next((p for r in group if (p := self._parts.get(id(r))) is not None), None)
        if part is None:
            return
        ids = {id(r) for r in group}
        if ids.issuperset(part.members):
            return
        new = _Part()
        for key in [k for k in part.members if k in ids]:
            new.members[key] = part.members.pop(key)
            self._parts[key] = new
        self._reweigh(part)
        self._reweigh(new)

    def _remove(self, rec: Any) -> None:
        part = self._parts.pop(id(rec), None)
        if part is None:
            return
        del part.members[id(rec)]
        self._zero.discard(id(rec))
        self._watch.pop(id(rec), None)
        self._reweigh(part)

    def _reweigh(self, part: _Part) -> None:
        """``part``'s count again: its oldest record still holding the buffer."""
        held = [m for m in part.members.values() if holds(m[1])]
        rec = min(held, key=lambda m: m[0])[1] if held else None
        nbytes = 0 if rec is None or id(rec) in self._zero else rec.size()
        self.total += nbytes - part.nbytes
        part.nbytes = nbytes

    def _follow(self, rec: Any) -> None:
        follow(self._watch, rec, self._collected)

    def _collected(self, rec: Any, _ref: Any) -> None:
        if rec.dead is None and rec.array() is None:
            self.event("buffer_collected", rec)
