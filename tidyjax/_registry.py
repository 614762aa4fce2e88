"""The process-wide registry of the device buffers tidyjax created or was handed.

One `Buffer` record exists per device buffer. The record *is* a weak reference to the
``jax.Array`` object holding the buffer, so it never keeps memory alive, and it is keyed by that
object's ``id()``: while the weak reference resolves to the same object the id cannot have been
reused, so a record is never confused with another array that reuses a freed address. JAX is
never asked for a buffer address on the per-op path (on an array whose allocation failed that
call aborts the process).

A record knows its owner (``scope``: the scope that created it, a parent it was handed to,
`KEPT`, `VARIABLE` or ``None`` outside every scope), how many live Tensors hold it
(``n``), and whether it is ``dead`` (deleted by tidyjax, donated, or deleted behind its back).
Owners free *buffers*, not Tensor objects: a scope deletes what it created whether or not the
Tensor objects are still alive, and whatever else references the raw array.

Concurrency: a new record is private to the thread that made it until it is published by one
``dict`` store, so the per-op path takes no lock. Joining an existing record, releasing, deleting
and sweeping take ``lock``. A Tensor's ``__del__`` decrements ``n`` without the lock (it may run
inside the lock's holder during garbage collection); under the GIL that update is not split by
another thread, and a decrement lost to a nested finalizer only delays a free, never causes one.
"""

from __future__ import annotations

import collections
import functools
import sys
import threading
import weakref
from collections.abc import Iterable
from typing import Any

from ._arrays import CONCRETE, computing, failed, local_nbytes, may_wait, shard_bytes, wait_ready
from ._errors import DELETED_OUTSIDE, DISPOSED, RELEASED, Reason
from ._jaxdoors import base_array, buffer_addresses, shard_devices

__all__ = ["KEPT", "UNTRACKED", "VARIABLE", "Batch", "Buffer"]


class _Marker:
    __slots__ = ("_name",)

    def __init__(self, name: str) -> None:
        self._name = name

    def __repr__(self) -> str:
        return self._name


#: Owner of a buffer protected by ``tidyjax.keep``: no scope frees it.
KEPT: Any = _Marker("KEPT")
#: Owner of a buffer a Variable holds: no scope frees it.
VARIABLE: Any = _Marker("VARIABLE")


class Buffer(weakref.ref):
    """One device buffer: a weak reference to the ``jax.Array`` holding it, plus its books."""

    __slots__ = (
        "dead", "follows", "heir", "home", "keys", "lent", "more", "n", "nbytes", "nvars",
        "owned", "scope",
    )  # fmt: skip

    dead: Reason | None  # why every Tensor on this buffer is unusable; None while usable
    more: list[weakref.ref[Any]] | None  # other jax.Array objects over the same buffer
    n: int  # live Tensors holding it (disposed ones excluded)
    nbytes: int  # logical bytes, computed lazily (-1)
    owned: bool  # False: a caller's own array seen through an op, never deleted by tidyjax
    scope: Any  # the owner
    # Set only once a Variable holds the buffer (read with getattr; unset on the per-op path):
    nvars: int  # live Variables holding it
    home: Any  # the owner before the first Variable took it; it owns the buffer again after
    # Set once its allocations were read (read with getattr; unset on the per-op path):
    keys: frozenset[tuple[int, int]]  # (device id, address) of each shard, for alias matching
    # Set once the buffer's own record left while this alias (made in a scope over it, owned
    # False) still held it (read with getattr): disposing its last Tensor deletes the buffer,
    # the scope's exit does not (it is not the scope's).
    heir: bool
    # Set on an alias made in a scope over another's buffer with allocations of its own (a
    # replicated copy of a one-device array, `_made_elsewhere`; read with getattr): the ones it
    # shares, which it never hands on (`_hand_on`).
    lent: frozenset[tuple[int, int]]
    # Set on a caller's view of a Variable's own buffer (`_made_elsewhere`, read with getattr):
    # that Variable's record; the view goes home with that buffer when the Variable lets go.
    follows: Buffer | None

    def arrays(self) -> list[Any]:
        """The live ``jax.Array`` objects over this buffer."""
        first = self()
        out = [] if first is None else [first]
        if self.more:
            out += [a for a in (r() for r in self.more) if a is not None]
        return out

    def array(self) -> Any:
        """Any live ``jax.Array`` object over this buffer, or None."""
        first = self()
        if first is not None or not self.more:
            return first
        for r in self.more:
            a = r()
            if a is not None:
                return a
        return None

    def size(self) -> int:
        """Logical bytes of the buffer (0 once no array object is left to ask)."""
        n = self.nbytes
        if n < 0:
            arr = self.array()
            if arr is None:
                return 0
            n = self.nbytes = local_nbytes(arr)
        return n


def _untracked() -> Buffer:
    # The record of Tensors that wrap tracers or other non-concrete values: never counted,
    # never deleted. A weak reference needs a referent; the marker class serves.
    rec = Buffer(_Marker)
    rec.dead, rec.more, rec.n, rec.nbytes, rec.owned, rec.scope = None, None, 0, 0, False, None
    return rec


UNTRACKED = _untracked()


class Batch:
    """The new buffers of one call (a jitted call's outputs) made in a scope, while they share
    one fate: one record for all of them, one registry entry per leaf (``id(array)`` → the
    batch), one entry in the scope's list.

    ``arrays[i]`` is leaf ``i``'s array while the batch holds it (held by exactly one Tensor,
    whose ``_i`` is ``i``), a `Buffer` once the leaf was split out (its fate differs: disposed
    alone, handed out or kept alone, joined by a second Tensor, read by a report), or None once
    it is gone (disposed, or its Tensor and array collected). ``live`` counts the arrays held.
    The batch holds its arrays strongly; a Tensor's ``__del__`` lets go of its own (or splits
    it out when something else still references the array). ``dead`` is set when the scope
    exit deletes the batch: every Tensor still on it is disposed then (the objects returned or
    kept were moved to records of their own). ``stale``: leaves split out without their Tensor
    at hand (a report, a second Tensor over the array), whose Tensor still points here.
    """

    __slots__ = ("arrays", "dead", "live", "nsplit", "pos", "scope", "stale")

    arrays: list[Any]
    dead: Reason | None
    live: int
    nsplit: int  # leaves split out so far
    pos: dict[int, int] | None  # id(array) -> leaf index, built on the first lookup by array
    scope: Any  # the owner of the leaves it holds: a scope, or KEPT
    stale: set[int] | None

    def __init__(self, scope: Any) -> None:
        self.arrays, self.dead, self.live, self.nsplit = [], None, 0, 0
        self.pos, self.scope, self.stale = None, scope, None

    def array(self) -> Any:
        """Any array the batch still holds, or None (for a scope's compaction)."""
        if self.live:
            for a in self.arrays:
                if a is not None and type(a) is not Buffer:
                    return a
        return None

    def held(self) -> list[tuple[int, Any]]:
        """``(index, array)`` of each leaf the batch holds."""
        return [
            (i, a) for i, a in enumerate(self.arrays) if a is not None and type(a) is not Buffer
        ]


def split(b: Batch, i: int, n: int, scope: Any = _Marker) -> Buffer:
    """Leaf ``i`` of ``b`` leaves the batch for a record of its own, held by ``n`` Tensors and
    owned by ``scope`` (default: the batch's owner, whose list it joins). Under ``lock`` or
    with the batch private to the caller."""
    arr = b.arrays[i]
    owner = b.scope if scope is _Marker else scope
    rec = fresh(arr, owner)
    rec.n = n
    b.arrays[i] = rec
    b.live -= 1
    b.nsplit += 1
    by_array[id(arr)] = rec
    if scope is _Marker and hasattr(owner, "take"):
        owner.take(rec)
    return rec


def rebatch(b: Batch, leaves: list[int]) -> Batch:
    """Move ``leaves`` (distinct indexes of leaves ``b`` holds) to a new batch of the same
    owner, in that order, which is returned; ``b`` keeps its other leaves. Cheaper than
    splitting each out (a record apiece) when a scope hands out most of a call's outputs: the
    new batch then moves whole and the rest goes with ``b``. The Tensors on those leaves are
    repointed by their module (``_tensor.rebatch``)."""
    out = Batch(b.scope)
    arrays = out.arrays
    with lock:
        held = b.arrays
        for i in leaves:
            arr = held[i]
            held[i] = None
            arrays.append(arr)
            by_array[id(arr)] = out
        made_all(map(id, arrays))
        out.live = len(arrays)
        b.live -= len(arrays)
    return out


def by_batch(tensors: list[Any]) -> list[tuple[Batch, list[Any], bool]]:
    """Tensors on leaves batches hold (as `records_in` gives them), grouped by batch:
    ``(batch, its Tensors, whether they are every leaf it holds)``."""
    groups: dict[int, tuple[Batch, list[Any]]] = {}
    for t in tensors:
        groups.setdefault(id(t._r), (t._r, []))[1].append(t)
    return [(b, ts, len({id(t) for t in ts}) >= b.live) for b, ts in groups.values()]


def leaf_of(b: Batch, arr: Any) -> int:
    """The index of ``arr`` among the leaves ``b`` holds, or -1."""
    pos = b.pos
    if pos is None:
        pos = b.pos = {id(a): i for i, a in enumerate(b.arrays) if a is not None}
    i = pos.get(id(arr), -1)
    return i if i >= 0 and b.arrays[i] is arr else -1


def split_stale(b: Batch, i: int) -> Buffer:
    """Split leaf ``i`` out without its Tensor at hand: the Tensor keeps pointing at the batch
    and finds its record there (``Tensor._rec``) until then."""
    with lock:
        x = b.arrays[i]
        if type(x) is Buffer:
            return x
        rec = split(b, i, 1)
        if b.stale is None:
            b.stale = set()
        b.stale.add(i)
    return rec


def leaf_record(b: Batch, i: int, arr: Any) -> Buffer:
    """The record of leaf ``i`` (array ``arr``) of batch ``b``: its own record (made now if the
    batch still holds it), or a dead record if the batch was deleted. The Tensor on the leaf
    points at it from then on (``_tensor.own_record``)."""
    if b.dead is not None:
        rec = fresh(arr, None) if _weakrefable(arr) else fresh(_Marker, None)
        rec.dead, rec.n = b.dead, 0
        return rec
    with lock:
        x = b.arrays[i]
        if type(x) is Buffer:
            if b.stale is not None:
                b.stale.discard(i)
            return x
        return split(b, i, 1)


def _weakrefable(arr: Any) -> bool:
    try:
        weakref.ref(arr)
    except TypeError:
        return False
    return True


def leave_batch(b: Batch, i: int) -> Buffer | None:
    """The Tensor on leaf ``i`` of batch ``b`` is being collected (``__del__``; no lock: it may
    run inside the lock's holder). The batch lets go of the leaf's array when nothing else
    references it (JAX frees it now), else the array gets a record of its own with no holder,
    as a Tensor's record does when the Tensor goes first. Returns the record the Tensor held
    when the leaf was split out already (its holder count drops), else None."""
    x = b.arrays[i]
    if type(x) is Buffer:
        if b.stale is not None and i in b.stale:
            b.stale.discard(i)
            return x
        return None  # split with its Tensor repointed: that Tensor was not on the batch then
    if x is None:
        return None
    if suspects:  # a suspect may be a second object over the buffer: `resolve` decides
        split(b, i, 0)
        orphan(x)
        return None
    # references: the batch's list, ``t._array``, ``x``, getrefcount's argument
    if sys.getrefcount(x) <= 4:
        b.arrays[i] = None
        b.live -= 1
        if by_array.get(id(x)) is b:
            del by_array[id(x)]
        if hasattr(b.scope, "collected_early"):
            b.scope.collected_early()  # its array goes with this Tensor
        return None
    split(b, i, 0)
    return None


def materialize_all() -> None:
    """Split every batch's leaves into records of their own (before an observer starts, or a
    report or alias check that reads records one by one)."""
    batches: list[Any] = [b for b in list(by_array.values()) if type(b) is Batch]
    for b in {id(b): b for b in batches}.values():
        split_all(b)


def split_all(b: Batch) -> None:
    """Split every leaf ``b`` still holds (stale: their Tensors are not at hand)."""
    if b.dead is None:
        for i, _ in b.held():
            split_stale(b, i)


def delete_batch(b: Batch, why: Reason) -> list[Any]:
    """Delete the arrays ``b`` holds and mark it dead: every Tensor still on it is disposed.
    Returns the deleted arrays. A stale Tensor's record loses that holder."""
    out = []
    buffers = by_array
    with lock:
        b.dead = why
        for i, a in enumerate(b.arrays):
            if a is None:
                continue
            if type(a) is Buffer:
                if b.stale and i in b.stale:
                    a.n -= 1  # its Tensor, still on the batch, is disposed with it
                continue
            key = id(a)
            if buffers.get(key) is b:
                del buffers[key]
            a.delete()
            out.append(a)
        b.arrays = []
        b.live = 0
        b.stale = None
    return out


lock = threading.Lock()
by_array: dict[int, Any] = {}  # a Buffer, or the Batch holding the array
sweep_at = 4096
#: The ids of the array objects put in `by_array` since the allocation index last read them
#: (`_update_index`), newest last: one per new record or batch leaf. More than _MADE_MAX
#: between two reads and the index is built again from every record.
_MADE_MAX = 1 << 14  # ids of ~40 bytes each: 640 kB at most
_made: collections.deque[int] = collections.deque(maxlen=_MADE_MAX)
made = _made.append
made_all = _made.extend


def fresh(arr: Any, scope: Any, callback: Any = None) -> Buffer:
    """The one constructor of a record: ``arr``'s new buffer, held by one Tensor, owned by
    ``scope``. Not yet published (``new`` publishes; the per-op path stores it itself)."""
    rec = Buffer(arr, callback) if callback is not None else Buffer(arr)
    rec.dead = rec.more = None
    rec.n = 1
    rec.nbytes = -1
    rec.owned = True
    rec.scope = scope
    return rec


def new(arr: Any, scope: Any, owned: bool = True, tensor: int = 0) -> Buffer:
    """A fresh record for ``arr`` held by one Tensor (id ``tensor``), published in the registry
    (and reported to the observers: while they watch, a record also reports its array's
    collection)."""
    watching = bool(observers)  # then the record reports its array's collection too
    rec = fresh(arr, scope, _collected if watching else None)
    rec.owned = owned
    by_array[id(arr)] = rec
    made(id(arr))
    if len(by_array) > sweep_at:
        sweep()
    if watching:
        for o in list(observers):
            o.event("buffer_added", rec, tensor)
    return rec


def suspect(rec: Buffer, raw: list[Any] | None = None) -> None:
    """``rec``'s array came from outside tidyjax's own operations and is committed to its device:
    it may be a second array object over a buffer another record holds (a raw ``device_put`` to
    where the buffer already is). Checked by `resolve` before the next deletion. ``raw``: the
    caller's own committed arrays of its shape and dtype (no record knows them) that went into
    the call making it; over one of their buffers, the record is the caller's (``owned`` False:
    never deleted)."""
    if raw:
        _twins[id(rec)] = (rec, [weakref.ref(a) for a in raw])
    suspects.append(rec)
    if len(orphans) > _MAX_ORPHANS:
        resolve()


def orphan(arr: Any) -> None:
    """The last Tensor on an owned record of ``arr`` is being collected (``__del__``: no lock)
    while suspects are pending: a suspect of its kind may be a second object over its buffer,
    so ``arr`` is held until the next `resolve` hands that suspect the buffer."""
    orphans.append(arr)


def _join_more(rec: Buffer, arrays: list[Any]) -> None:
    """``arrays`` are more objects over ``rec``'s buffer (under ``lock``). Those collected
    since leave ``more`` (a long-lived Tensor aliased once a step would grow it, and each
    lookup of it, without end); the list is replaced, never changed under a reader."""
    alive = [r for r in rec.more or () if r() is not None]
    for a in arrays:
        alive.append(weakref.ref(a))
        by_array[id(a)] = rec
        made(id(a))
    rec.more = alive


def lookup(arr: Any) -> Buffer | None:
    """The record of ``arr`` (this very object, or an alias object joined to it), or None."""
    rec = by_array.get(id(arr))
    if rec is None:
        return None
    if type(rec) is Batch:  # a leaf of a batch: it gets a record of its own
        i = leaf_of(rec, arr)
        return split_stale(rec, i) if i >= 0 else None
    if rec() is arr:
        return rec
    if rec.more and any(r() is arr for r in rec.more):
        return rec
    return None  # stale: the recorded object died and its id was reused


def peek(arr: Any) -> Any:
    """`lookup` for a report: a leaf a batch holds is read as a `Leaf`, not split out."""
    b = by_array.get(id(arr))
    if type(b) is Batch:
        return Leaf(arr, b.scope) if b.dead is None and leaf_of(b, arr) >= 0 else None
    return lookup(arr)


def join(rec: Buffer) -> None:
    """One more live Tensor holds ``rec``."""
    with lock:
        rec.n += 1


def add_alias(rec: Buffer, arr: Any) -> None:
    """``arr`` is another ``jax.Array`` object over ``rec``'s buffer (``device_put`` to where the
    buffer already is): deleting either deletes both, so they share one record."""
    other = lookup(arr)
    if other is not None and other is not rec and other.dead is None:
        _join_group(rec, other)  # ``arr`` has a live record of its own: one buffer, one group
        return
    with lock:
        _join_more(rec, [arr])


def unhold(rec: Buffer) -> None:
    """A Tensor on ``rec`` was disposed by a scope that does not own the buffer: one holder
    fewer, and nothing is deleted (the buffer's owner frees it). A caller's own array
    (``owned`` False, no owner) leaves the books with its last holder; a buffer of tidyjax's
    an heir holds (`_hand_on`) stays in them, held by its raw arrays, for a `dispose` to free."""
    if suspects:
        resolve()
    with lock:
        rec.n -= 1
        last = rec.n <= 0 and not rec.owned and rec.scope is None and rec.dead is None
        last = last and not getattr(rec, "heir", False)
        if last:
            rec.dead = RELEASED
    if observers and (rec.dead is None or last):
        notify("tensor_removed", rec)
    if last:
        free(rec)


def release(rec: Buffer) -> bool:
    """A Tensor on ``rec`` was disposed. Deletes the buffer if it was the last live holder and
    tidyjax owns it; returns whether it did."""
    if suspects:
        resolve()
    with lock:
        rec.n -= 1
        last = rec.n <= 0 and rec.dead is None
        if last:
            rec.dead = RELEASED
            if not rec.owned:
                disposed_alias(rec)
    if observers:
        notify("tensor_removed", rec)
    return last and free(rec) is not None


def mine(rec: Buffer) -> bool:
    """Whether tidyjax frees ``rec``'s buffer: it owns it, or ``rec`` is its heir (`_hand_on`)."""
    return rec.owned or getattr(rec, "heir", False)


def _callers_view(rec: Buffer) -> bool:
    """Whether ``rec`` is a caller's view of its own array (``tensors()``, no owner): tidyjax
    neither frees nor releases it."""
    return rec.scope is None and not mine(rec)


def disposed_alias(rec: Buffer) -> None:
    """The last Tensor on ``rec``, a record tidyjax does not own, was disposed by `dispose`
    (not by a scope's exit; under the lock): over a buffer of tidyjax's (a record of its group
    is owned, or its heir) it frees the buffer as any last Tensor does, unless a holder needs
    it (`free`)."""
    group = _groups.get(id(rec)) if _groups else None
    if group and any(mine(r) and _over_own(rec, r) for r in group):
        rec.heir = True


def _over_own(rec: Buffer, by: Buffer) -> bool:
    """Whether ``rec`` is over an allocation of ``by``'s own: any, unless ``by`` was made over
    allocations of another's buffer (``lent``); then one of the others, read (a caller's array
    one of whose shards ``by`` shares is not ``by``'s buffer; unknown: not, fail-safe)."""
    lent = getattr(by, "lent", None)
    if not lent:
        return True
    keys, theirs = _keys_of(rec), _keys_of(by)
    return bool(keys and theirs) and not keys.isdisjoint(theirs - lent)


def delete_many(recs: Iterable[Buffer], why: Reason) -> list[Any]:
    """Mark each record dead with ``why`` and delete the buffers tidyjax owns.

    Returns the deleted arrays (a deleted array holds no memory and still knows its nbytes).
    With no observer, group or suspect, each record is marked and freed in one pass under the
    lock (a second pass was a third of a scope exit's cost per buffer).
    """
    if suspects:
        resolve()  # before any record is dead: a dead record is never grouped
    if not (observers or _groups or suspects or _lent):
        aliased: list[Buffer] = []  # freed after the lock: `_free_aliased` may notify
        with lock:
            out = _free_plain(recs, why, aliased)
        return out + free_all(aliased) if aliased else out
    done = []
    with lock:
        for rec in recs:
            if rec.dead is None:
                rec.dead = why
                done.append(rec)
    return free_all(done)


def free_owned(
    recs: list[Any], owner: Any, escaping: set[int], why: Reason
) -> tuple[list[Any], list[Any], int]:
    """A scope exit's deletions in one pass, while no observer, group or suspect exists: each
    record ``owner`` owns with one array object that ``escaping`` (record ids) does not reach is
    marked dead with ``why`` and its buffer deleted if tidyjax owns it. Returns the deleted
    arrays, the records left for the general sort (batches, others', escaping, aliased), and
    how many records Python had collected (JAX freed those). With an observer, group or
    suspect, every record is left for the general path."""
    if not recs or observers or _groups or suspects or _lent:
        return [], recs, 0
    out: list[Any] = []
    rest: list[Any] = []
    collected = 0
    buffers = by_array
    with lock:
        for rec in recs:
            if rec.dead is not None:
                continue
            if type(rec) is Batch or rec.scope is not owner or rec.more or id(rec) in escaping:
                rest.append(rec)
                continue
            arr = rec()
            if arr is None:
                collected += 1
                continue
            if not rec.owned and getattr(rec, "heir", False):
                rest.append(rec)  # `free` lets its Tensors go of the array
                continue
            rec.dead = why
            key = id(arr)
            if buffers.get(key) is rec:
                del buffers[key]
            if rec.owned:
                arr.delete()
                out.append(arr)
    return out, rest, collected


def free_all(recs: list[Buffer]) -> list[Any]:
    """`free` each dead record; returns the deleted arrays. With no observer, no group and no
    suspect (the usual case), `free` of a record with one array object is inlined: a call per
    record was a third of a dispose."""
    if not (observers or _groups or suspects or _kept_raw or _lent):
        return _free_plain(recs, None)
    out = []
    for rec in recs:
        arr = free(rec)
        if arr is not None:
            out.append(arr)
    return out


def _free_plain(
    recs: Iterable[Buffer], why: Reason | None, aliased: list[Buffer] | None = None
) -> list[Any]:
    """`free` of each record, inlined, while no observer, group or suspect exists; with ``why``
    each record not dead yet is marked dead first (a dead one is skipped). Returns the deleted
    arrays. ``aliased``: records with several array objects go there instead of being freed."""
    out = []
    buffers = by_array
    for rec in recs:
        if why is not None:
            if rec.dead is not None:
                continue
            rec.dead = why
        if rec.more:
            if aliased is not None:
                aliased.append(rec)
            elif (arr := _free_aliased(rec)) is not None:
                out.append(arr)
            continue
        arr = rec()
        if arr is not None:
            key = id(arr)
            if buffers.get(key) is rec:
                del buffers[key]
            if rec.owned:
                arr.delete()
                out.append(arr)
            elif _free_unowned(rec, [arr]):
                out.append(arr)
    return out


def free(rec: Buffer) -> Any:
    """Delete a dead record's buffer if tidyjax owns it and drop it from the books; returns the
    deleted array, or None. A buffer another live record also holds is only dropped."""
    if suspects:
        resolve()
    others: list[Buffer] = []
    if rec.dead is RELEASED and _kept_raw and _kept_raw_alive(rec):
        rec.dead = None  # its last Tensor disposed: a kept raw array holds the buffer now
        if on_drop is not None:
            on_drop(rec, rec.arrays())  # the disposed Tensors let go of their array objects
        return None
    if _groups and id(rec) in _groups:
        _vanished(_groups[id(rec)], rec)
    if _groups and id(rec) in _groups:
        group = _groups[id(rec)]
        ours = mine(rec)
        if rec.dead is RELEASED and ours and not any(_protects(r, rec) for r in group):
            others = [r for r in group if r is not rec]  # the last Tensor disposed: it goes
            _leave_group(rec)
        elif _leave_group(rec):
            if ours:  # disposed, or its scope exited: an alias holds the buffer on
                _hand_on(group, rec.owned and hasattr(rec.scope, "take"), giver=rec)
            _pass_arrays(rec, group)
            _drop(rec)
            return None
    if _lent and _lent.get(id(rec)) is rec and mine(rec):
        _release(rec)  # some of its allocations are another's: JAX cannot delete the rest alone
        return None
    arr = rec()
    if rec.more:
        arr = _free_aliased(rec)  # it notifies the observers
    else:
        if arr is not None:
            key = id(arr)
            if by_array.get(key) is rec:
                del by_array[key]
            if rec.owned:
                arr.delete()
            elif not _free_unowned(rec, [arr]):
                arr = None
        if observers:
            notify("buffer_freed", rec)
    for other in others:  # raw objects over the deleted buffer: gone with it
        a = other.array()
        if other.dead is None and (a is None or a.is_deleted()):
            other.dead = RELEASED
            _leave_group(other)
            _drop(other)
    return arr


def _pass_arrays(rec: Buffer, group: list[Buffer]) -> None:
    """``rec`` leaves while another record of its group holds the buffer: its array objects
    still alive (a raw ``.array`` the caller read from its disposed Tensor) join a record whose
    allocations cover theirs, so that whoever frees the buffer deletes them too (one entry
    per buffer, whatever object it is reached by); with none covering them they are left."""
    arrays = rec.arrays()
    if not arrays:
        return
    keys = _keys_of(rec)
    for other in group:
        if other is rec or other.dead is not None or other.array() is None:
            continue
        theirs = _keys_of(other)
        if keys is None or theirs is None or not keys <= theirs:
            continue
        with lock:
            _join_more(other, arrays)
        return
    if not _callers_view(rec):  # released: deleting them would delete a holder's part of it
        _mark_released(arrays)


#: The array objects tidyjax made and left undeleted because another record holds part of
#: their buffer (`_pass_arrays`, `_release`), by id, weakly: the reports name them as released.
_released: dict[int, weakref.ref[Any]] = {}
#: The records made over allocations of a buffer tidyjax does not own (a caller's array's, an
#: alias's of another owner's) beside their own (``lent``), by id: while any is listed, every
#: free goes through `free`, which releases them (`sweep` prunes the dead).
_lent: dict[int, Buffer] = {}


def _release(rec: Buffer) -> None:
    """Stop owning ``rec``'s buffer without deleting it: some of its allocations (``lent``) are
    another's, a caller's array's say, which no record holds any more (deleting one shard view
    deletes the parent and every view). Its Tensors let go of its arrays; JAX frees the rest
    when the last object over it dies; the reports name the arrays left alive as released."""
    _lent.pop(id(rec), None)
    _mark_released(rec.arrays())
    _drop(rec)


def _mark_released(arrays: list[Any]) -> None:
    """Name ``arrays`` released in the reports while they live (`is_released`)."""
    for a in arrays:
        _released[id(a)] = weakref.ref(a, functools.partial(_unrelease, id(a)))


def _unrelease(key: int, _ref: Any) -> None:
    _released.pop(key, None)


def is_released(arr: Any) -> bool:
    """Whether tidyjax made ``arr`` and released it rather than delete it: part of its buffer
    is a live holder's (a one-device Tensor of which ``arr`` is a replicated copy)."""
    ref = _released.get(id(arr))
    return ref is not None and ref() is arr


def _hand_on(
    group: list[Buffer], scopes: bool, dying: Buffer | None = None, giver: Buffer | None = None
) -> None:
    """A buffer of tidyjax's lives on in aliases over it that tidyjax does not own (made in a
    scope over another's buffer, then perhaps kept) after its own last Tensor went. A scope's
    buffer (``scopes``) becomes the aliases' that a scope made: that scope deletes it unless it
    hands them out. Otherwise (a top-level, kept or Variable's buffer, or a kept alias) they
    are its heirs: no scope's exit deletes it (a raw alias made outside may still hold it), but
    disposing their last Tensor does, as for any buffer. ``dying``, a record `free` is freeing
    now, inherits too (as a RELEASED one does: the one being disposed). ``giver``, the record
    leaving: an alias made over another's buffer with allocations of its own (``lent``, those
    it shares) hands on only its own; a record over none of those (`_over_own`) is not its heir."""
    for r in group:
        if not (r.dead is None or r.dead is RELEASED or r is dying):
            continue
        if giver is not None and not _over_own(r, giver):
            continue  # over the allocations the giver shared, never tidyjax's through it
        if r.owned:
            if not scopes and hasattr(r.scope, "take") and getattr(r, "lent", None):
                # A scope's alias holding allocations of its own beside those it shares
                # (``lent``: a replicated copy of a one-device buffer) over a buffer from
                # outside every scope, which no scope's exit deletes: its exit releases the
                # alias, a dispose deletes it. (Over the same allocations only, an alias
                # made owned by its group stays its scope's: the model test's rules.)
                r.owned, r.heir = False, True
                if giver is not None and (theirs := _keys_of(giver)):  # its heir's own now
                    r.lent = r.lent - theirs
            continue
        if scopes and hasattr(r.scope, "take"):
            r.owned = True
        else:  # kept, a Variable's, or over a buffer from outside every scope
            r.heir = True


def _vanished(group: list[Buffer], dying: Buffer | None = None) -> None:
    """Take out of ``group`` its records whose array objects all died (collected, not
    disposed); one that owned the buffer (or was its heir) leaves it to the aliases still holding
    it (`_hand_on`), which would otherwise dispose them as objects only and never free it.
    ``dying``: the record `free` is freeing now (dead already); it inherits too."""
    for r in [r for r in group if r.array() is None]:
        if mine(r) and r.dead is None:
            _hand_on(group, hasattr(r.scope, "take"), dying, giver=r)
        _leave_group(r)  # takes the lock


def _free_unowned(rec: Buffer, arrays: list[Any]) -> bool:
    """The free of ``arrays``, the objects of a dead record tidyjax does not own: deleted when
    ``rec`` is the buffer's heir (`_hand_on`) and its last Tensor, or its raw array, was
    disposed (`dispose`); an heir's
    buffer is otherwise left, its disposed Tensors letting go of ``arrays`` (nobody else frees
    it); a caller's array is left alone. A scope's (or a kept or Variable's) alias over a
    buffer it did not own, neither owner nor heir, leaves the buffer to whoever holds it: its
    disposed Tensors let go of ``arrays`` (else they would hold it for ever, uncounted; a
    caller's plain view, made with no owner, is not searched for). Returns whether they were
    deleted."""
    if not getattr(rec, "heir", False):
        if not _callers_view(rec) and on_drop is not None:
            on_drop(rec, arrays)
        return False
    if rec.dead is RELEASED or rec.dead is DISPOSED:  # its last Tensor, or its raw array
        for a in arrays:
            a.delete()
        return True
    if on_drop is not None:
        on_drop(rec, arrays)
    return False


#: Raw array objects passed to `tidyjax.keep`, by id (weakly): a dispose of the last Tensor
#: over their buffer leaves it to them (TF.js's keep of the Tensor itself does not protect it).
_kept_raw: dict[int, weakref.ref[Any]] = {}


def keep_raw(arr: Any) -> None:
    """``arr``, a raw array the books know, was kept: its buffer outlives its Tensors."""
    key = id(arr)
    _kept_raw[key] = weakref.ref(arr, lambda _r: _kept_raw.pop(key, None))


def _kept_raw_alive(rec: Buffer) -> bool:
    """Whether a kept raw array over ``rec``'s buffer (its own object or a group's) lives."""
    if not _kept_raw:
        return False
    for r in grouped(rec) or [rec]:
        for a in r.arrays():
            ref = _kept_raw.get(id(a))
            if ref is not None and ref() is a and a is not None and not a.is_deleted():
                return True
    return False


def _protects(other: Buffer, rec: Buffer) -> bool:
    """Whether ``other``, over an allocation of ``rec``'s, still needs it when ``rec``'s last
    Tensor is disposed: a live Tensor holds it, it is a Variable's, or it is kept while a
    kept object lives (a kept Tensor's raw aliases the caller never kept do not protect it
    once that Tensor was collected)."""
    if other is rec or other.dead is not None or other.array() is None:
        return False
    if other.n > 0 or other.scope is VARIABLE:
        return True
    return other.scope is KEPT and _kept_raw_alive(other)


def _free_aliased(rec: Buffer) -> Any:
    """``free`` for a record with several array objects over its buffer."""
    arrays = rec.arrays()
    for alias in arrays:
        if by_array.get(id(alias)) is rec:
            del by_array[id(alias)]
    arr = None
    if rec.owned:
        for alias in arrays:
            alias.delete()
        arr = arrays[-1] if arrays else None
    elif arrays and _free_unowned(rec, arrays):
        arr = arrays[-1]
    if observers:
        notify("buffer_freed", rec)
    return arr


#: Set by ``_tensor``: makes the disposed Tensors of a dropped record let go of its array
#: objects (which would keep the shared buffer alive after the group's other records are gone).
on_drop: Any = None


def _drop(rec: Buffer) -> None:
    """Forget a dead record whose buffer lives on in another record of its group."""
    arrays = rec.arrays()
    for alias in arrays:
        if by_array.get(id(alias)) is rec:
            del by_array[id(alias)]
    if on_drop is not None and arrays:
        on_drop(rec, arrays)
    if observers:
        notify("buffer_freed", rec)


def kill(rec: Buffer, why: Reason) -> None:
    """Mark every Tensor on ``rec`` unusable: its buffer was consumed (donated) by JAX. Every
    record sharing an allocation with it goes the same way: JAX deleted its array with it, or
    one of its shards is the donated buffer (a replicated array made from a one-device one),
    an array no longer usable that JAX does not mark deleted."""
    if suspects:
        resolve()
    with lock:
        if rec.dead is not None:
            return
        rec.dead = why
        others = [r for r in _groups.get(id(rec), ()) if r is not rec and r.dead is None]
        donated = getattr(rec, "keys", None)  # cached when grouped: read before the call
    for other in others:
        arr = other.array()
        theirs = getattr(other, "keys", None)
        if arr is not None and (
            arr.is_deleted() or (donated and theirs and not donated.isdisjoint(theirs))
        ):
            with lock:
                other.dead = why
            free(other)
    free(rec)


def check(rec: Buffer) -> None:
    """Mark ``rec`` dead if its buffer was deleted behind tidyjax's back; the observers hear
    of the free when tidyjax notices it."""
    arr = rec.array()
    if arr is not None and rec.dead is None and arr.is_deleted():
        rec.dead = DELETED_OUTSIDE
        if observers:
            notify("buffer_freed", rec)


def sweep() -> None:
    """Drop records whose array objects are all gone; amortized O(1) per new record."""
    global sweep_at
    with lock:
        for key, rec in list(by_array.items()):
            if type(rec) is Batch:
                continue  # its entries leave with its leaves
            gone = (rec() is None and not rec.more) or (rec.dead is not None and _stale(rec))
            if gone and by_array.get(key) is rec:
                del by_array[key]
        sweep_at = max(4096, 2 * len(by_array))
        for key, rec in list(_lent.items()):
            if rec.dead is not None or rec.array() is None:
                del _lent[key]
    for group in list({id(g): g for g in _groups.values()}.values()):
        _vanished(group)


def _stale(rec: Buffer) -> bool:
    """Nothing left to account for: the array objects are gone, or the buffer is dead (except
    one deleted behind tidyjax's back while Tensors still hold it: reported until they go)."""
    if rec.array() is None:
        return True
    return rec.dead is not None and not (rec.dead is DELETED_OUTSIDE and rec.n > 0)


class Leaf:
    """A leaf a batch holds, as a report reads it (`live` with ``leaves``), left in its batch:
    what its record would say, read-only. One live Tensor holds it (a batch's leaf has exactly
    one), tidyjax owns it, the batch's owner owns it, no other record shares it (`resolve` splits
    out a leaf a suspect shares an allocation with)."""

    __slots__ = ("_arr", "scope")

    n = 1
    dead: Reason | None = None
    owned = True
    more: list[weakref.ref[Any]] | None = None

    def __init__(self, arr: Any, scope: Any) -> None:
        self._arr, self.scope = arr, scope

    def array(self) -> Any:
        return self._arr

    def arrays(self) -> list[Any]:
        return [self._arr]

    def size(self) -> int:
        return local_nbytes(self._arr)


def live(leaves: bool = False) -> tuple[list[Any], list[Buffer]]:
    """The records whose buffers are alive, and those deleted outside tidyjax that live
    Tensors still hold. Records over one buffer (see `distinct`) are all listed. A leaf a batch
    holds is split out into a record first, or with ``leaves`` listed as a `Leaf`: reading
    leaves the books as they are (unless the leaf was deleted behind tidyjax's back)."""
    if not leaves:
        materialize_all()
    resolve()
    sweep()
    seen: set[int] = set()
    alive: list[Any] = []
    deleted: list[Buffer] = []
    for rec in list(by_array.values()):
        if id(rec) in seen:
            continue
        seen.add(id(rec))
        if type(rec) is Batch:
            for i, a in rec.held() if rec.dead is None else ():
                if not a.is_deleted():
                    alive.append(Leaf(a, rec.scope))
                    continue
                out = split_stale(rec, i)  # deleted behind tidyjax's back: its record tells it
                check(out)
                if out.n > 0:
                    deleted.append(out)
            continue
        check(rec)
        if rec.array() is None:
            continue
        if rec.dead is None:
            alive.append(rec)
        elif rec.dead is DELETED_OUTSIDE and rec.n > 0:
            deleted.append(rec)
    return alive, deleted


def distinct(recs: list[Buffer]) -> list[Buffer]:
    """``recs`` with one record per device buffer (a group of records over one buffer counts
    once)."""
    if not _groups:
        return recs
    seen: set[int] = set()
    out = []
    for rec in recs:
        group = _groups.get(id(rec))
        if group is not None:
            if id(group) in seen:
                continue
            seen.add(id(group))
        out.append(rec)
    return out


# -- array objects over one buffer, made outside tidyjax ---------------------------------------
#
# JAX hands back a *new* array object over the same buffer for a ``device_put`` to where the
# buffer already is. Through tidyjax's own ``t.to()`` and ``adopt()`` such an object joins its
# buffer's record. Made by user code (a raw ``jax.device_put`` of a Tensor or its array, a tree
# map, a function lifted with ``tidyjax.lift``) it first gets a record of its own; the record is
# a *suspect* when its array is committed to a device (every such alias is). Before anything is
# deleted, and before a report, ``resolve`` compares each suspect's buffer address with those
# of the records of the same shape and dtype and puts records over one buffer in a *group*: a
# buffer is deleted only when every record of its group is dead. No address is read on the
# per-op path, and none of an array whose allocation failed.

suspects: list[Buffer] = []
_groups: dict[int, list[Buffer]] = {}  # id(record) -> the records over its buffer (2 or more)
# id(suspect) -> (the suspect, weak references to the caller's raw arrays it may be over)
_twins: dict[int, tuple[Buffer, list[weakref.ref[Any]]]] = {}
# The array objects of owned records whose last Tensor was collected while a suspect was
# pending: held until the next `resolve`, which may find the suspect over the same buffer and
# give it the buffer's ownership (else the buffer would outlive its owner as a caller's array
# that nothing deletes), then let go.
orphans: list[Any] = []
_resolve_lock = threading.RLock()  # held by the one thread resolving (`resolve`)
_resolving = False  # while it resolves
_MAX_ORPHANS = 16  # more, and the next suspect resolves at once (memory stays bounded)


def resolve() -> None:
    """Group each suspect record with the records that share any of its allocations (a shard
    on a device), whatever their shape, dtype, commitment or sharding. Waits for the suspects'
    buffers (an alias is ready exactly when the allocation is) before taking its lock: a host
    callback of that computation may resolve too (a ``memory()`` it calls). On a thread the
    runtime made (that callback's, `may_wait`) a suspect still being computed waits for the
    next resolve.

    One thread resolves at a time, and the suspects stay listed until they are matched: a
    thread that finds suspects pending waits for the one resolving them (else its scope exit
    could free a suspect not yet grouped with the buffer it shares, deleting that buffer)."""
    global _resolving
    if not suspects:
        return
    wait = may_wait()
    if wait:
        for rec in suspects[:]:
            wait_ready(rec.array())
            for ref in _twins.get(id(rec), (None, ()))[1]:  # the caller's arrays it may be over
                wait_ready(ref())
    with _resolve_lock:
        if _resolving or not suspects:  # called again inside this thread's own resolve
            return
        _resolving = True
        with lock:
            pending = suspects[:]
            held = len(orphans)
            twins = {k: _twins.pop(k) for k in [id(r) for r in pending] if k in _twins}
        later: list[Buffer] = []
        try:
            wanted = _wanted(pending, twins, later if not wait else None)
            if wanted:
                _match(wanted, {id(r): i for i, r in enumerate(pending)})
        finally:
            with lock:
                suspects[: len(pending)] = later  # those made meanwhile wait for the next
                for rec in later:  # their twins too
                    if id(rec) in twins:
                        _twins[id(rec)] = twins[id(rec)]
                if not later:  # grouped now, or over no suspect's buffer: JAX may free them
                    del orphans[:held]
            _resolving = False


def _wanted(
    pending: list[Buffer],
    twins: dict[int, tuple[Buffer, list[weakref.ref[Any]]]],
    later: list[Buffer] | None = None,
) -> dict[Any, list[Buffer]]:
    """The suspects by each allocation they hold; a suspect over one of the caller's own
    arrays (its ``twins``) becomes the caller's. With ``later``, nothing is waited for: a
    suspect still being computed goes there."""
    wanted: dict[Any, list[Buffer]] = {}
    for rec in pending:
        arr = rec.array()  # a suspect being freed right now is dead already: checked too
        if arr is None:
            continue
        if later is not None and computing(arr):
            later.append(rec)
            continue
        keys = shards(arr, wait=True)
        if not keys:
            continue
        rec.keys = keys
        for k in keys:
            wanted.setdefault(k, []).append(rec)
        got = twins.get(id(rec))
        if got is not None and got[0] is rec and _over_raw(keys, got[1]):
            rec.owned = False  # a new object over the caller's own array: the caller's buffer
    return wanted


def _match(wanted: dict[Any, list[Buffer]], order: dict[int, int]) -> None:
    """Each record sharing an allocation with a suspect joins the suspect's group, or, when
    only `orphans` holds it, leaves its place to the suspect (`_inherit`). Of two suspects
    (``order``: their places, oldest first) the older made the buffer."""
    held = {id(a) for a in orphans}
    new = order
    for other, keys in _sharing(None, wanted):
        arr = other.array()
        if arr is None:
            continue
        found = {id(r): r for k in keys for r in wanted.get(k, ()) if r is not other}
        # references to an orphan's array: `orphans`, ``arr``, getrefcount's argument; and
        # no other object of it alive (a raw alias the caller holds: its record lives on)
        only_orphans = (
            id(arr) in held
            and other.n <= 0
            and sys.getrefcount(arr) <= 3
            and not any(r() is not None for r in other.more or ())
        )
        for rec in found.values():
            if only_orphans:
                # Only `orphans` holds ``other``'s object (no group: it goes with it). A
                # suspect made after it is placed as if it lived, then takes its place.
                if rec.n <= 0:
                    continue
                if id(other) not in new and other.owned:
                    _made_elsewhere(rec, other, True)
                if not rec.owned:  # an owned one keeps its own owner
                    _inherit(rec, other)
            else:
                owned = other.owned
                _join_group(rec, other, merge=False)
                if id(other) not in new:
                    _made_elsewhere(rec, other, owned)
                elif order[id(other)] < order[id(rec)]:  # two suspects: the older one's buffer
                    _made_elsewhere(rec, other, owned)  # (a caller's stays the caller's)


def _made_elsewhere(alias: Buffer, rec: Buffer, owned: bool) -> None:
    """``alias``, a suspect, shares an allocation with ``rec`` (``owned`` before they were
    grouped), made before it. Over the same owner's buffer it is that buffer's; made in a
    scope over a buffer that scope does not own (an outer scope's, a kept one, a Variable's,
    a caller's), the scope disposes it as an object only and never deletes the buffer. Over
    none of ``rec``'s own allocations when ``rec`` was made over a buffer tidyjax does not own
    (`_lent`: a caller's view of the caller's shard a copy was made over) it is not ``rec``'s
    buffer: nothing changes."""
    if _lent and _lent.get(id(rec)) is rec and not _over_own(alias, rec):
        return
    owner = rec.scope
    if alias.scope is None and alias.n > 0 and hasattr(owner, "take"):
        alias.scope = owner  # a caller's view (`tensors()`) of a scope's buffer: the scope's
        owner.take(alias)
    elif alias.scope is None and alias.n > 0 and owner is VARIABLE and owned:
        alias.follows = rec  # of a Variable's own buffer: goes with it to its home (`let_go`)
    if alias.scope is owner or not hasattr(alias.scope, "take"):
        alias.owned = rec.owned = owned
    else:
        rec.owned = owned
        theirs, held = _keys_of(alias), _keys_of(rec)
        if theirs is None or held is None or theirs <= held:
            alias.owned = False
        else:  # allocations of its own (one device to replicated): its scope's, deleted with
            # them unless a protected holder shares one (`free` releases it then); those it
            # shares are not its to hand on (`_hand_on`), nor to delete (`free`)
            alias.lent = theirs & held
            if not owned:  # a caller's (or another owner's): never tidyjax's to delete
                _lent[id(alias)] = alias


def _inherit(heir: Buffer, gone: Buffer) -> None:
    """``gone``'s last array object is going (an orphan) while ``heir``, a second object over
    its buffer, is held by a Tensor: ``heir`` takes its place, owned by tidyjax and by
    ``gone``'s owner (else the caller's plain array: counted by no report), unless an owner
    took ``heir`` already (``keep``, a Variable, a scope's ``keep``): that one frees it. Made
    in a scope over a buffer from outside every scope, kept or a Variable's, ``heir`` does not
    make the buffer that scope's (a raw alias made outside may still hold it): disposing its
    last Tensor deletes it, the scope's exit does not (`_hand_on`'s rule). Over none of
    ``gone``'s own allocations (only those it shares with another's buffer, ``lent``, or none:
    `_over_own`), it takes nothing."""
    if not _over_own(heir, gone):
        return
    if hasattr(heir.scope, "take") and not hasattr(gone.scope, "take") and not heir.owned:
        heir.heir = True
        return
    heir.owned = True
    if heir.scope is not None:
        return
    owner = heir.scope = gone.scope
    if hasattr(owner, "take"):
        owner.take(heir)


def _sharing(pool: Iterable[Any] | None, wanted: dict[Any, Any]) -> list[tuple[Buffer, Any]]:
    """The live records of ``pool`` (None: every record) that hold an allocation in
    ``wanted``, each once, in the pool's order, with their allocations; a batch's leaf that
    does is split out of it first. A record's allocations are read once (`_keys_of`): after
    that, one set test per record. Every record: read from the allocation index when the
    order cannot matter (`_indexed`), else in `by_array`'s order."""
    if pool is None and (found := _indexed(wanted)) is not None:
        return found
    out: list[tuple[Buffer, Any]] = []
    seen: set[int] = set()
    disjoint = wanted.keys().isdisjoint
    for rec in list(by_array.values() if pool is None else pool):
        if type(rec) is Batch:
            if rec.dead is None and id(rec) not in seen:
                seen.add(id(rec))
                for i, a in rec.held():
                    keys = shards(a, wait=False)
                    if keys and not disjoint(keys):
                        out.append((split_stale(rec, i), keys))
            continue
        if id(rec) not in seen and (keys := _wanted_keys(rec, disjoint)):
            seen.add(id(rec))
            out.append((rec, keys))
    return out


def _wanted_keys(rec: Buffer, disjoint: Any) -> Any:
    """``rec``'s allocations when it is live and holds one that is wanted (``disjoint``:
    ``wanted.keys().isdisjoint``), read while an array of it is alive and undeleted (a freed
    address may be another's); else None."""
    if rec.dead is not None:
        return None
    keys = getattr(rec, "keys", None)
    if keys is None:  # read now: `_keys_of` read it from a live, undeleted array
        keys = _keys_of(rec)
        return keys if keys and not disjoint(keys) else None
    if disjoint(keys) or _keys_of(rec) is None:  # cached: still an array of it alive?
        return None
    return keys


# The allocation index: allocation -> {(id of a record, id of one of its array objects), or
# (id of a batch, leaf): that array id (the leaf's, with its index)}. What it lists is checked
# when read (a freed record's address may be another's now, a leaf may have left its batch);
# an entry whose array id no longer leads to its record or batch leaves it then.
_index: dict[Any, dict[Any, Any]] = {}
_index_size = 0  # the entries listed (a rebuild drops those of freed records)
_unread: list[Any] = []  # array ids (and (id, leaf)) not ready when read: read again next time
_index_built = False
# Its own lock, reentrant: a collection inside `_update_index` may run an observer's handler
# that looks it up again in this thread (the registry's ``lock`` is not held meanwhile).
_index_lock = threading.RLock()


def _update_index() -> None:
    """Read the allocations of what `by_array` gained since the last read (`_made`); build
    the index afresh the first time, after ``_made`` overflowed, or when freed records fill
    most of it. Under ``_index_lock``."""
    global _index_built, _index_size
    if not _index_built or len(_made) >= _MADE_MAX or _index_size > 4 * len(by_array) + 4096:
        _index.clear()
        _made.clear()
        _unread.clear()
        _index_size, _index_built = 0, True
        todo: list[Any] = list(by_array)
    else:  # taken one by one: another thread may queue meanwhile (its id stays for next time)
        todo = [*_unread, *[_made.popleft() for _ in range(len(_made))]]
        _unread.clear()
    batches: set[int] = set()
    for key in todo:
        if type(key) is tuple:  # a batch leaf not ready before
            aid, i = key
            x = by_array.get(aid)
            if type(x) is Batch:
                _index_leaf(x, aid, i)
            elif x is not None and x.dead is None:
                _index_record(x, aid)
            continue
        x = by_array.get(key)
        if x is None:
            continue
        if type(x) is Batch:
            if x.dead is None and id(x) not in batches:
                batches.add(id(x))
                for i, a in x.held():
                    _index_leaf(x, id(a), i)
        elif x.dead is None:
            _index_record(x, key)  # under each of its array objects: any one may outlive it


def _enter(keys: Any, who: Any, entry: Any) -> None:
    """List ``who`` (with ``entry``, see `_index`) under each allocation of ``keys``."""
    global _index_size
    for k in keys:
        slot = _index.setdefault(k, {})
        _index_size += who not in slot
        slot[who] = entry


# A buffer still being computed is read again at the next update. Whether it is computing is
# asked before the read: asked after a read that found it not ready, it may be ready by then,
# and the array would never be read (the index would miss it: a view of it counted apart).


def _index_record(rec: Buffer, aid: int) -> None:
    arr = rec.array()
    if arr is not None and getattr(rec, "keys", None) is None and computing(arr):
        _unread.append(aid)
        return
    keys = _keys_of(rec)
    if keys is not None:
        _enter(keys, (id(rec), aid), aid)


def _index_leaf(b: Batch, aid: int, i: int) -> None:
    if b.dead is not None or i >= len(b.arrays) or id(a := b.arrays[i]) != aid:
        return
    if computing(a):
        _unread.append((aid, i))
        return
    keys = shards(a, wait=False)
    if keys is not None:
        _enter(keys, (id(b), i), (aid, i))


def _indexed(wanted: dict[Any, Any]) -> list[tuple[Buffer, Any]] | None:
    """`_sharing` of every record, from the allocation index: the same records, or None when
    more than one of them shares an allocation with another entry of ``wanted`` than itself
    (then the order of `by_array` decides, as `_match` and `aliases_of` read it: the caller
    scans). Batch leaves found are split out only once the answer is known to stand."""
    hits = index_hits(wanted)
    busy = 0
    for x, keys, twin in hits:
        if any(v is not x and v is not twin for k in keys for v in wanted.get(k, ())):
            busy += 1
    if busy > 1:
        return None
    return [(split_stale(*x) if type(x) is tuple else x, keys) for x, keys, _ in hits]


def index_hits(wanted: dict[Any, Any]) -> list[tuple[Any, Any, Any]]:
    """What the allocation index finds over the allocations of ``wanted``, each once: a live
    record, or ``(batch, leaf)`` of a leaf a batch holds, with its allocations and its array."""
    global _index_size
    disjoint = wanted.keys().isdisjoint
    entries: dict[Any, Any] = {}
    with _index_lock:
        _update_index()
        for k in wanted:
            slot = _index.get(k)
            if slot is None:
                continue
            for who, entry in list(slot.items()):
                x = by_array.get(entry[0] if type(entry) is tuple else entry)
                if x is not None and id(x) == who[0]:
                    entries[who] = (x, entry)
                    continue
                del slot[who]  # freed, or its array id is another's now
                _index_size -= 1
                if type(x) is Buffer and type(entry) is tuple:  # the leaf left its batch
                    who = (id(x), entry[0])
                    _enter((k,), who, entry[0])
                    entries[who] = (x, entry[0])
            if not slot:
                del _index[k]
    hits: dict[int, tuple[Any, Any, Any]] = {}  # id -> (record or (batch, leaf), keys, twin)
    for x, entry in entries.values():
        if type(x) is Batch:
            if x.dead is not None or type(entry) is not tuple:
                continue
            aid, i = entry
            a = x.arrays[i] if i < len(x.arrays) else None
            if a is None or type(a) is Buffer or id(a) != aid:
                continue
            keys = shards(a, wait=False)
            if keys and not disjoint(keys):
                hits[aid] = ((x, i), keys, a)
            continue
        if id(x) not in hits and (keys := _wanted_keys(x, disjoint)):
            hits[id(x)] = (x, keys, x.array())
    return list(hits.values())


def _keys_of(rec: Buffer) -> Any:
    """The allocations of ``rec``'s buffer while an array object of it lives and is not
    deleted (a freed address is reused at once), read once and cached."""
    arr = rec.array()
    if arr is None or arr.is_deleted():
        return None
    keys = getattr(rec, "keys", None)
    if keys is None:
        keys = shards(arr, wait=False)
        if keys is not None:
            rec.keys = keys
    return keys


def _over_raw(keys: Any, raw: list[weakref.ref[Any]]) -> bool:
    """Whether the buffer with allocations ``keys`` shares one with a ``raw`` array's."""
    for ref in raw:
        a = ref()
        other = shards(a, wait=True) if a is not None else None
        if other and not other.isdisjoint(keys):
            return True
    return False


def aliases_of(arrays: list[Any], among: Iterable[Buffer] | None = None) -> list[Buffer]:
    """The live records sharing an allocation with ``arrays``, raw array objects no record
    knows (a raw ``jax.device_put`` of a Tensor's array, a shard view, ``key_data``, a tree map
    of them); each one found joins its record as one more array object over the buffer.
    ``among``: the records to compare with (an exiting scope's own), else every record.

    Each array is waited for (an alias is ready exactly when its allocation is) and compared
    by allocation with every record, whatever its shape, dtype or commitment. Runs for a
    scope's result, ``keep`` and ``dispose``, never per op."""
    wanted: dict[Any, list[Any]] = {}
    for arr in arrays:
        if type(arr) in CONCRETE and not arr.is_deleted():
            for k in shards(arr, wait=True) or ():
                wanted.setdefault(k, []).append(arr)
    if not wanted:
        return []
    found: list[Buffer] = []
    for rec, keys in _sharing(among, wanted):
        twin = rec.array()
        hits = {id(a): a for k in keys for a in wanted.get(k, ()) if a is not twin}
        for arr in hits.values():
            if lookup(arr) is None:
                add_alias(rec, arr)
            found.append(rec)
    return found


def sharing(recs: list[Buffer]) -> dict[int, list[Buffer]]:
    """For each of ``recs`` that awaits `resolve` (a suspect), by its id, the other live records
    sharing an allocation with it: what `resolve` will group, read now and changing nothing
    (an observer counting a buffer once, `_tally`). Waits for those of ``recs``."""
    waiting = {id(s) for s in suspects}
    wanted: dict[Any, list[Buffer]] = {}
    for rec in recs:
        arr = rec.array() if id(rec) in waiting else None
        for k in (shards(arr, wait=True) if arr is not None else None) or ():
            wanted.setdefault(k, []).append(rec)
    out: dict[int, list[Buffer]] = {}
    for other, keys in _sharing(None, wanted) if wanted else ():
        for rec in {id(r): r for k in keys for r in wanted.get(k, ())}.values():
            if rec is not other:
                out.setdefault(id(rec), []).append(other)
    return out


def _address(arr: Any, wait: bool) -> Any:
    """The device addresses of ``arr``'s buffer; None if it is deleted, its allocation failed,
    or (without ``wait``) it is not ready yet. A failed buffer is "ready" and raises when
    waited for; its address would abort the process, so ``failed`` waits for it first."""
    base = base_array(arr)
    try:
        if base.is_deleted() or (not wait and not base.is_ready()) or failed(base, wait=True):
            return None
        return buffer_addresses(base)
    except Exception:  # deleted meanwhile
        return None


def shards(arr: Any, wait: bool) -> frozenset[tuple[int, int]] | None:
    """``arr``'s allocations, one ``(device id, address)`` per shard (the ledger's unit: two
    array objects share a buffer when they share one); None as for `_address`. A buffer over
    several devices is waited for even without ``wait``: a shard view of it is ready before
    the whole is. Nothing but metadata is read before the buffer is known not to have failed."""
    base = base_array(arr)
    try:
        devices = base.sharding.device_set  # metadata: safe on a failed allocation
        addresses = _address(base, wait or len(devices) > 1)
        if addresses is None:
            return None
        ids = [d.id for d in devices] if len(devices) == 1 else shard_devices(base)
        return frozenset(zip(ids, addresses, strict=True))
    except Exception:  # deleted meanwhile
        return None


def grouped(rec: Buffer) -> list[Buffer] | None:
    """The records sharing an allocation with ``rec`` (``rec`` among them), or None."""
    return _groups.get(id(rec))


def has_groups() -> bool:
    """Whether any records share an allocation."""
    return bool(_groups)


def _join_group(a: Buffer, b: Buffer, merge: bool = True) -> None:
    """Put ``a`` and ``b`` in one group; ``merge``: every record of it is tidyjax's if one is
    (else `_made_elsewhere` decides, or each keeps its own)."""
    with lock:
        ga = _groups.get(id(a)) or [a]
        gb = _groups.get(id(b)) or [b]
        if ga is gb:
            return
        merged = ga + [r for r in gb if all(r is not x for x in ga)]
        owned = any(r.owned for r in merged)  # one buffer: tidyjax's if any object over it is
        for r in merged:
            _groups[id(r)] = merged
            if merge:
                r.owned = owned
    if observers:
        notify("joined", a)


def _leave_group(rec: Buffer) -> bool:
    """Take ``rec`` out of its group; whether another live record still holds the buffer."""
    with lock:
        group = _groups.pop(id(rec), None)
        if group is None:
            return False
        group[:] = [r for r in group if r is not rec]
        held = any(r.dead is None and r.array() is not None for r in group)
        if len(group) < 2:
            for r in group:
                _groups.pop(id(r), None)
            parts = []
        else:
            parts = _split(group)
    for part in parts if observers else ():
        notify("split", part[0])
    return held


def _split(group: list[Buffer]) -> list[list[Buffer]]:
    """``group`` after a record left it: records that shared allocations only through that
    one (two one-device copies of a replicated buffer's shards) are two buffers from now on,
    each its own group (or none). Returns those parts (none when it stays one buffer);
    ``group`` itself, the caller's, stays as it was. Fail-safe: while an allocation of a record
    is unknown (its array object gone, deleted, or still being computed) nothing is split.
    Under the lock."""
    keys = [getattr(r, "keys", None) or _keys_of(r) for r in group]
    if not all(keys):
        return []
    parts: list[tuple[set[Any], list[Buffer]]] = []
    for r, theirs in zip(group, keys, strict=True):
        part: tuple[set[Any], list[Buffer]] = (set(theirs), [r])
        for other in [p for p in parts if not p[0].isdisjoint(theirs)]:
            part[0].update(other[0])
            part[1][:0] = other[1]
            parts.remove(other)
        parts.append(part)
    if len(parts) < 2:
        return []
    order = {id(r): i for i, r in enumerate(group)}
    out = []
    for _, members in parts:
        members.sort(key=lambda r: order[id(r)])
        for r in members:
            if len(members) < 2:
                _groups.pop(id(r), None)
            else:
                _groups[id(r)] = members
        out.append(members)
    return out


def let_go(rec: Buffer) -> None:
    """A Variable stopped holding ``rec`` (assigned a new value, or disposed). When no Variable
    holds it any more, the buffer belongs again to its owner before the first Variable (the
    scope that made it, or the nearest open scope around it once that one exited; ``KEPT``)."""
    n = getattr(rec, "nvars", 1) - 1
    rec.nvars = n
    if n > 0 or rec.scope is not VARIABLE:
        return
    home = getattr(rec, "home", None)
    if home is None or home is KEPT:
        rec.scope = home
        return
    owner = home.reclaim(rec)  # its scope, or the nearest open one around it (a `Tracker`)
    if owner is not None and _groups and id(rec) in _groups:
        # A caller's view that joined the Variable's buffer (`_made_elsewhere`: no scope, as
        # a view of a scope's buffer is that scope's) goes back with it.
        for r in _groups[id(rec)]:
            # Only the views of this buffer: a group joins records sharing any allocation,
            # and a view of another Variable's buffer in it stays where it is.
            if r is not rec and r.scope is None and r.dead is None and _follows(r, rec):
                r.follows = None
                owner.reclaim(r)


def _follows(rec: Buffer, buffer: Buffer) -> bool:
    """Whether ``rec`` is a caller's view of ``buffer``, a Variable's own (`_made_elsewhere`)."""
    return getattr(rec, "follows", None) is buffer


def same_buffer_key(arr: Any) -> Any:
    """The device addresses behind ``arr``, or None while its buffer is not ready (or its
    allocation failed: JAX's address call would abort the process). Used by reports, never on
    the per-op path."""
    return _address(arr, wait=False)


def device_bytes(rec: Buffer) -> dict[Any, int]:
    """Bytes of ``rec``'s buffer on each local device (from metadata; no buffer is touched)."""
    arr = rec.array()
    if arr is None or type(arr) not in CONCRETE:
        return {}
    return shard_bytes(arr)


# -- observers ---------------------------------------------------------------------------------
#
# While ``observers`` is non-empty (a profile or timeline is open), every change to the books is
# reported to each observer as ``observer.event(kind, rec, tensor)``, ``tensor`` the id of the
# Tensor made on ``rec`` ("buffer_added", "tensor_added") or 0; "joined": ``rec`` and other
# records are one buffer now (`grouped`: one buffer, counted once); "split": the records that
# shared a buffer only through one that left are several buffers now, ``rec`` and its group
# (`grouped`, or ``rec`` alone) one of them. Scopes report themselves as
# ``observer.event("scope_enter" or "scope_exit", scope)``. Empty, the cost is one truthiness
# check on each path.


class _Observers(list[Any]):
    """The observers; adding one first splits every batch (observers follow records)."""

    def append(self, observer: Any) -> None:
        materialize_all()
        super().append(observer)


observers: list[Any] = _Observers()


def _collected(rec: Buffer) -> None:
    """A record made while observed lost its array object to the garbage collector (the
    weak reference's callback: its referent is gone; an alias in ``more`` may live on)."""
    if observers and rec.dead is None and (not rec.more or rec.array() is None):
        for o in list(observers):
            o.event("buffer_collected", rec, 0)


def notify(kind: str, rec: Buffer, tensor: int = 0) -> None:
    """Report ``kind`` on ``rec`` (and the Tensor id ``tensor``) to every observer."""
    for o in list(observers):
        o.event(kind, rec, tensor)
