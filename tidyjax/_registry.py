"""The process-wide registry of device buffers held by tidyjax Tensors.

One :class:`Buffer` record exists per distinct device buffer, keyed by the buffer's address (not
by the Python object: many JAX operations hand back the same buffer under a new or the same
object). A record lists weak references to the Tensors holding it, so it never keeps a Tensor
alive. A buffer is deleted only when an explicit dispose (or a scope exit) releases the last
live Tensor holding it. A Tensor that Python collects without a dispose simply stops counting:
whatever else references its ``jax.Array`` keeps it, and JAX frees it with the last reference.

Concurrency: adding a record for a new buffer is one atomic ``dict.setdefault`` (the per-op
path takes no lock); sharing an existing record, releasing and sweeping happen under ``_lock``.
Records whose holders all died are removed by an amortized sweep and by every ``snapshot``.
"""

from __future__ import annotations

import threading
import weakref
from typing import TYPE_CHECKING, Any

import jax

if TYPE_CHECKING:
    from ._tensor import Tensor

__all__ = ["UNTRACKED", "Buffer"]

_lock = threading.Lock()
# Bound methods: `with _lock` costs over twice as much on the per-op path.
_acquire = _lock.acquire
_release_lock = _lock.release
_alloc = object.__new__
DELETED_OUTSIDE = "its buffer was deleted outside tidyjax (jax.Array.delete() or donation)"
_buffers: dict[Any, Buffer] = {}
_sweep_at = 4096
RELEASED = "its buffer was released"


class Buffer:
    """One device buffer (possibly sharded) and weak references to the Tensors holding it."""

    __slots__ = ("compact_at", "dead", "holders", "key", "nbytes", "owned")

    def __init__(self, key: Any, holder: weakref.ref[Tensor], owned: bool = True) -> None:
        self.key = key
        self.holders = [holder]
        self.owned = owned  # False: a caller's own array seen through an op; never deleted by us
        self.dead: str | None = None  # why every Tensor on this buffer is now unusable
        self.nbytes = -1  # computed lazily; the per-op path never pays for it
        self.compact_at = 8  # prune dead holder references when the list doubles

    def live(self) -> list[Tensor]:
        """The Tensors still holding this buffer (alive and not disposed)."""
        out = []
        for ref in self.holders:
            t = ref()
            if t is not None and t._rec is self:
                out.append(t)
        return out

    def first_live(self) -> Tensor | None:
        """Any Tensor still holding this buffer, or None; stops at the first one."""
        for ref in self.holders:
            t = ref()
            if t is not None and t._rec is self:
                return t
        return None

    def size(self, arr: jax.Array) -> int:
        """Logical bytes of the buffer, given an array on it (cached)."""
        n = self.nbytes
        if n < 0:
            n = self.nbytes = int(arr.nbytes)
        return n


# Stands in for a record on Tensors that wrap tracers or other non-concrete values: never
# counted, never deleted.
UNTRACKED = Buffer.__new__(Buffer)
UNTRACKED.key = None
UNTRACKED.holders = []
UNTRACKED.owned = False
UNTRACKED.dead = None
UNTRACKED.nbytes = 0
UNTRACKED.compact_at = 0


def buffer_key(arr: jax.Array) -> Any:
    """Identify the device buffer(s) behind ``arr``: an address, or a tuple of shard addresses."""
    try:
        p = arr.unsafe_buffer_pointer()
    except Exception:  # sharded arrays have no single pointer
        base = getattr(arr, "_base_array", arr)  # a typed PRNG key array's storage
        return tuple(s.unsafe_buffer_pointer() for s in base._arrays)
    # A zero-byte buffer may have no unique address; the object's id is unique while a Tensor
    # (which holds it strongly) is alive, and a record is only consulted through live Tensors.
    return p if p else ("object", id(arr))


def register(
    t: Tensor, arr: jax.Array, holder: weakref.ref[Tensor], owned: bool = True, new: bool = True
) -> None:
    """Record that ``t`` (whose weak reference is ``holder``) holds ``arr``'s buffer.

    Sets ``t._rec`` before the record becomes visible to other threads, so a half-built Tensor
    already counts as a live holder. ``new=False``: ``t`` is not a new Tensor (a Variable taking
    a new value), for the observers' counts.
    """
    try:
        key = arr.unsafe_buffer_pointer() or ("object", id(arr))
    except Exception:
        key = buffer_key(arr)
    got = _buffers.get(key)
    if got is None:
        rec = t._rec = _new_buffer(key, holder, owned)
        got = _buffers.setdefault(key, rec)
        if got is rec:
            if len(_buffers) > _sweep_at:
                _sweep()
            if observers:
                _notify_added(t, rec, arr, True, new)
            return
    # The address is known. Most often the record is stale: its Tensors were collected, JAX
    # freed the buffer and reused the address for this one. Sometimes it is a real alias.
    fresh = True
    _acquire()
    try:
        current = _buffers.get(key)
        if current is not None and current.dead is None:
            other = current.first_live()
            if other is not None:
                if not other._array.is_deleted():
                    if len(current.holders) >= current.compact_at:  # amortized O(1)
                        current.holders = [r for r in current.holders if _holds(r, current)]
                        current.compact_at = max(8, 2 * len(current.holders))
                    t._rec = current
                    current.holders.append(holder)
                    # Once a caller's own array is involved, tidyjax never deletes the buffer.
                    if not owned:
                        current.owned = False
                    rec, fresh = current, False
                else:
                    # Deleted outside tidyjax (jax.Array.delete(), raw donation); address reused.
                    current.dead = DELETED_OUTSIDE
        if fresh:
            rec = t._rec = _new_buffer(key, holder, owned)
            _buffers[key] = rec
    finally:
        _release_lock()
    if observers:
        _notify_added(t, rec, arr, fresh, new)


def _new_buffer(key: Any, holder: weakref.ref[Tensor], owned: bool) -> Buffer:
    rec = _alloc(Buffer)
    rec.key = key
    rec.holders = [holder]
    rec.dead = None
    rec.owned = owned
    rec.nbytes = -1
    rec.compact_at = 8
    return rec


def release(arr: jax.Array, rec: Buffer, t: Tensor | None = None) -> bool:
    """A holder of ``arr`` (already marked disposed) lets go of ``rec``.

    Deletes the buffer if no live Tensor holds it any more; returns True if it did. ``t`` is the
    disposed Tensor, or None when no Tensor goes away (a Variable's previous value).
    """
    _acquire()
    try:
        last = _unlink_locked(rec)
    finally:
        _release_lock()
    freed = last and rec.owned
    if freed:
        arr.delete()
    if observers:
        _notify_removed(t, rec, arr, last)
    return freed


def release_many(items: list[tuple[Tensor, Buffer]]) -> list[jax.Array]:
    """``release`` several disposed Tensors under one lock; returns the arrays deleted.

    (A deleted array still reports its ``nbytes``, so callers can size what was freed later.)
    """
    with _lock:
        lasts = [_unlink_locked(rec) for _, rec in items]
    freed = []
    for (t, rec), last in zip(items, lasts, strict=True):
        if last and rec.owned:
            arr = t._array
            arr.delete()
            freed.append(arr)
    if observers:
        for (t, rec), last in zip(items, lasts, strict=True):
            _notify_removed(t, rec, t._array, last)
    return freed


def _holds(ref: weakref.ref[Tensor], rec: Buffer) -> bool:
    t = ref()
    return t is not None and t._rec is rec


def _unlink_locked(rec: Buffer) -> bool:
    """Whether this release left no live Tensor on ``rec``; if so the record is retired."""
    if rec.dead is not None:
        return False
    for ref in rec.holders:
        if _holds(ref, rec):
            return False
    rec.dead = RELEASED  # exactly one release deletes the buffer
    if _buffers.get(rec.key) is rec:
        del _buffers[rec.key]
    return True


def kill(rec: Buffer, why: str) -> None:
    """Mark every Tensor on ``rec`` unusable (its buffer was consumed, e.g. donated)."""
    with _lock:
        if rec.dead is not None:
            return
        holders = rec.live()
        rec.dead = why
        if _buffers.get(rec.key) is rec:
            del _buffers[rec.key]
    if observers:
        for o in list(observers):
            o.killed(rec, holders)


# -- observers ---------------------------------------------------------------------------------
#
# While ``observers`` is non-empty (a profile is running), every change to the books is reported
# to each observer. Empty, the cost is one truthiness check on each path.

observers: list[Any] = []


def _notify_added(t: Tensor, rec: Buffer, arr: jax.Array, new_buffer: bool, new: bool) -> None:
    for o in list(observers):
        o.added(t, rec, arr, new_buffer, new)


def _notify_removed(t: Tensor | None, rec: Buffer, arr: jax.Array, last: bool) -> None:
    for o in list(observers):
        o.removed(t, rec, arr, last)


def _sweep() -> None:
    """Drop records no live Tensor holds; amortized O(1) per registration."""
    global _sweep_at
    with _lock:
        for key, rec in list(_buffers.items()):
            if rec.first_live() is None and _buffers.get(key) is rec:
                del _buffers[key]
        _sweep_at = max(4096, 2 * len(_buffers))


def snapshot() -> list[tuple[Buffer, list[Tensor]]]:
    """Each live record with the live Tensors holding it."""
    with _lock:
        out = []
        for key, rec in list(_buffers.items()):
            holders = rec.live()
            if holders:
                out.append((rec, holders))
            elif _buffers.get(key) is rec:
                del _buffers[key]
        return out
