"""Scopes: ``tidy`` in all its forms, ``keep`` and ``dispose``.

A `Scope` owns every device buffer created while it is the innermost open scope of the
running thread or task (``_tensor.wrap`` appends each new buffer's record). When it exits —
normally or by an exception — each buffer it owns is handed to the parent scope if the result or
``scope.keep`` reaches it (through a Tensor or a raw ``jax.Array``), and deleted otherwise,
whether or not its Tensor objects are still alive. Buffers kept, held by Variables or created in
outer scopes are never touched; Tensor objects the scope made on such buffers (clones) are
marked disposed without deleting anything.
"""

from __future__ import annotations

import collections
import contextvars
import functools
import gc
import inspect
import logging
import operator
import sys
import weakref
from collections.abc import Callable, Iterator
from typing import Any, ParamSpec, TypeVar, overload

import jax
import jax.profiler

from . import _format, _html, _registry
from ._arrays import CONCRETE, describe, failed
from ._context import CURRENT, Tracker
from ._errors import DISPOSED, ScopeError, TidyjaxTypeError, TidyjaxValueError, scope_exited
from ._format import count as _count
from ._lift import add_structure_hint
from ._newarrays import ArrayMark
from ._registry import KEPT, VARIABLE, Batch, Buffer
from ._sites import creation_site
from ._tensor import (
    Tensor,
    dispose_many,
    dispose_object,
    mark_kept,
    own_record,
    rebatch,
    record,
    tensor_ids,
)
from ._trees import gather_values, is_container, records_in

__all__ = [
    "Scope", "close_scope", "close_through", "dispose", "keep", "open_scope", "owned_records",
    "tidy",
]  # fmt: skip

F = TypeVar("F", bound=Callable[..., Any])
P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")
_record_of = operator.attrgetter("_r")
_log = logging.getLogger("tidyjax")
# While a jax.profiler trace runs (``jax.profiler.trace``, ``start_trace`` or a capture from
# TensorBoard), each scope is a named range in it, beside XLA's ops. ``is_enabled`` is one C++
# check, so a scope costs nothing more when no trace runs.
_profiling = jax.profiler.TraceAnnotation.is_enabled


def _annotate(path: str) -> Any:
    annotation = jax.profiler.TraceAnnotation(f"tidy {path}")
    annotation.__enter__()
    return annotation


_NEW, _OPEN, _CLOSED = 0, 1, 2
_GENERATOR_IN_SCOPE = (
    "{what} returned a generator: its body would run after the scope has ended, and the "
    "scope would free tensors it still needs. Decorate the generator function itself with "
    "@tidy (each resume runs in the generator's own scope and what it yields is handed to the "
    "caller), or return a list (`list(x for x in ...)`)."
)
_CO_GENERATOR = inspect.CO_GENERATOR | inspect.CO_ASYNC_GENERATOR
_finalizing = sys.is_finalizing
_AWAITABLE_IN_SYNC = (
    "{what} returned {kind}: a synchronous tidy scope would end before it runs and could free "
    "tensors it still needs. Use `async with tidy():` inside the coroutine, or decorate the "
    "`async def` itself with @tidy."
)


class Scope(Tracker):
    """One ``tidy`` scope: a context manager (sync and async) and a decorator.

    Made by [`tidy`][tidyjax.tidy]; see its docstring for every form. After the scope exits, its
    report attributes tell what it did: ``num_freed`` and ``bytes_freed`` (buffers deleted),
    ``num_handed_out`` (buffers handed to the enclosing scope).
    """

    __slots__ = (
        "_annotation",
        "_bare",
        "_created",
        "_first_id",
        "_forced",
        "_frame",
        "_freed",
        "_handed",
        "_handed_batched",
        "_handed_tensors",
        "_moved_in",
        "_state",
        "_taken",
        "_token",
        "name",
        "num_freed",
        "num_handed_out",
    )

    def __init__(self, name: str | None = None) -> None:
        super().__init__()
        self.name = name
        self.path = name or "<tidy>"
        self._state = _NEW
        self._token: Any = None
        # the records handed out by scope.keep, by id (held: an id is never another's meanwhile)
        self._handed: dict[int, Any] = {}
        # Tensor objects handed out likewise, by id, held weakly: a kept Tensor the caller
        # drops is collected as any other (its buffer still leaves with its record)
        self._handed_tensors: dict[int, weakref.ref[Any]] = {}
        self._handed_batched = False  # some of them are on leaves a batch holds
        self._freed: list[Any] = []  # the deleted arrays (they still know their nbytes)
        self._bare = False
        self._moved_in = 0  # records handed in by inner scopes (not created here)
        self._taken: list[Any] | None = None  # records an outer scope's keep took from it
        self._created = 0
        self._first_id = 0  # Tensors with this id or larger were made while it was open
        self._frame: Any = None  # the generator frame it was entered in, if any
        self._forced = False  # closed by an enclosing scope that exited first
        self._annotation: Any = None  # its range in a running jax.profiler trace
        self.num_freed = 0
        self.num_handed_out = 0

    def __repr__(self) -> str:
        state = ("new", "open", "exited")[self._state]
        extra = ""
        if self._state == _CLOSED:
            extra = f", freed {_count(self.num_freed, 'buffer')} "
            extra += f"({_format.fmt_bytes(self.bytes_freed)}), handed out {self.num_handed_out}"
        return f"<tidyjax.Scope {self.path!r} {state}{extra}>"

    def _repr_html_(self) -> str:
        return _scope_html(self)

    @property
    def exited(self) -> bool:
        """Whether the scope has exited."""
        return self._state == _CLOSED

    @property
    def num_collected(self) -> int:
        """Buffers made here that Python's garbage collector freed before the exit (their last
        reference went first)."""
        return self._collected

    def take(self, rec: Any) -> None:
        """``rec``, made elsewhere or split out of a batch listed here, is this scope's now."""
        self._owned.append(rec)
        self._moved_in += 1  # listed again, not made again: num_created stays

    @property
    def num_created(self) -> int:
        """Buffers created while this was the innermost scope (collected ones included)."""
        if self._state == _CLOSED:
            return self._created
        return len(self._owned) + self._pruned + self._extra - self._moved_in

    @property
    def peak_bytes(self) -> int | None:
        """The most tidyjax bytes alive while the scope was open; measured only while a
        [`tidyjax.profile`][tidyjax.profile] runs, else None."""
        return self._peak if self._peak >= 0 else None

    @property
    def bytes_freed(self) -> int:
        """Bytes of the device buffers this scope's exit deleted (shared buffers not included)."""
        return sum(int(arr.nbytes) for arr in self._freed)

    # -- entering and leaving ---------------------------------------------------------------

    def _open(self, entered_by_with: bool = False) -> Scope:
        if self._state != _NEW:
            raise ScopeError(
                f"scope {self.path!r} was already entered; a scope object is used once. "
                "Call tidy() again for a new scope."
            )
        parent = current()
        self.parent = parent
        if parent is not None:
            self.path = f"{parent.path}/{self.name or '<tidy>'}"
        if entered_by_with:
            frame = _user_frame()
            if frame is not None and frame.f_code.co_flags & _CO_GENERATOR and _iterated(frame):
                # A generator shares its caller's context, so this scope stays current in the
                # caller while the generator is suspended: what the caller makes then goes to
                # the caller's own scope (see _Redirect).
                self._frame = frame
                self._owned = _Redirect(self, "_owned")
                self._aliases = _Redirect(self, "_aliases")
        self._first_id = next(tensor_ids)
        if _log.isEnabledFor(logging.DEBUG):
            self._debug_mark = ArrayMark()
        self._token = CURRENT.set(self)
        self._state = _OPEN
        if _profiling():  # one C++ check when no trace runs
            self._annotation = _annotate(self.path)
        if _registry.observers:  # a timeline draws scopes as bands
            for observer in list(_registry.observers):
                observer.event("scope_enter", self)
        return self

    def _close(self, result: Any = None, failing: bool = False) -> None:
        """Exit: hand out what ``result`` and ``keep`` reach, free the rest.

        ``failing``: an exception is propagating through the scope. Inner scopes still open
        (entered by hand, an unclosed ``ExitStack``) are closed first; without an exception
        that is a ``ScopeError`` once everything is consistent, with one the exception wins.
        A suspended generator's scope inside this one is left open: its generator exits it.
        """
        if self._state != _OPEN:
            if self._forced:
                return  # already closed by an enclosing scope that exited first
            what = "has not been entered" if self._state == _NEW else "has already exited"
            raise ScopeError(f"cannot exit scope {self.path!r}: it {what}.")
        above, s = ([], self) if CURRENT.get() is self else self._inside()
        if s is None and self._frame is None:  # not on this context's stack
            raise ScopeError(
                f"cannot exit scope {self.path!r} from another thread, task or context than the "
                "one that entered it."
            )
        forced = [t for t in above if isinstance(t, Scope) and not t._transparent()]
        try:  # whatever arrives meanwhile (a KeyboardInterrupt), no scope is left open
            for inner in forced:  # innermost first
                inner._close_forced()
        finally:
            self._unlink(s is None, above[-1] if above and not forced else None)
        if self._annotation is not None:
            self._end_annotation()
        self._free(result)
        if _registry.observers:
            for observer in list(_registry.observers):
                observer.event("scope_exit", self)
        if forced and not failing:
            names = ", ".join(repr(t.path) for t in forced)
            raise ScopeError(
                f"scope {self.path!r} exited while scope(s) {names} inside it were still open; "
                "they were closed first and freed what they owned. Exit scopes in reverse order "
                "of entry (close an ExitStack, leave a with-block)."
            )

    def _inside(self) -> tuple[list[Tracker], Tracker | None]:
        """The scopes between the innermost one and this one (innermost first), and this scope
        if it is on this context's stack (else None)."""
        above: list[Tracker] = []
        s = CURRENT.get()
        while s is not None and s is not self:
            above.append(s)
            s = s.parent
        return above, s

    def _close_forced(self) -> None:
        """Close this scope because one around it exits first: free what it owns."""
        self._forced = True
        self._end_annotation()
        self._state = _CLOSED
        self._token = None
        self._frame = None
        self._free(None)

    def _unlink(self, off_stack: bool, suspended_inside: Tracker | None) -> None:
        """Take this scope off the context's stack and mark it closed. ``suspended_inside``: the
        scope just inside this one, when only suspended generators' scopes are inside."""
        if off_stack:
            pass  # a generator's scope its caller left: the stack here no longer holds it
        elif suspended_inside is not None:
            suspended_inside.parent = self.parent
        elif self._frame is not None:  # its token may predate a relink (see above)
            CURRENT.set(_effective(self.parent))
        else:
            try:
                CURRENT.reset(self._token)
            except ValueError:  # entered in another context (a generator resumed elsewhere)
                CURRENT.set(self.parent)
        self._state = _CLOSED
        self._token = None
        self._frame = None  # a generator's frame holds its locals: let them go

    def _end_annotation(self) -> None:
        annotation, self._annotation = self._annotation, None
        if annotation is not None:
            annotation.__exit__(None, None, None)

    def _transparent(self) -> bool:
        """A scope entered in a generator that is suspended now: its caller skips it."""
        frame = self._frame
        return frame is not None and frame.f_back is None and self._state == _OPEN

    def _free(self, result: Any) -> None:
        """The exit's books: what ``result`` and ``keep`` reach moves to the parent, the rest
        of what this scope owns is deleted, and its Tensor objects are settled."""
        if _registry.suspects:  # first: resolving splits batches, adding to the owned list
            _registry.resolve()
        handed_tensors: dict[int, Any]
        if result is None and not self._handed_tensors and not self._handed_batched:
            escaping, handed_tensors, only_batches = set(self._handed), {}, False  # none walked
        else:
            escaping, handed_tensors, only_batches = self._escaping(result)
        parent = _effective(self.parent)
        owned, self._owned = self._owned, []
        why: Any = scope_exited(self.path) if owned or self._aliases or handed_tensors else None
        freed, rest, collected = _registry.free_owned(owned, self, escaping, why)
        self._collected += collected
        if rest:
            doomed, survivors, handed, batches = self._sort_owned(rest, escaping, parent)
        else:  # each one freed or collected (the usual exit)
            doomed, survivors, handed, batches = [], [], 0, []
        if self._taken:  # their Tensor objects made here are settled as a survivor's
            survivors += self._taken
            self._taken = None
        settle = (handed_tensors and not only_batches) or self._aliases or survivors
        self._freed = freed + _registry.delete_many(doomed, why) if doomed else freed
        if settle:  # before the batches go: a stale leaf's Tensor is settled like any other
            self._settle_objects(handed_tensors, survivors, parent, why)
            self._aliases = []
        for b in batches:
            self._freed += _registry.delete_batch(b, why)
        if self._handed:
            self._handed = {}
        if parent is not None and _overgrown(parent):  # a long loop of child scopes inside
            parent._compact()
        self._count_exit(len(owned), handed)

    def _escaping(self, result: Any) -> tuple[set[int], dict[int, Any], bool]:
        """What leaves at exit: the ids of the records and batches ``result`` and ``keep``
        reach, the Tensors handed out (by id), and whether every one of them is on a batch
        handed out whole."""
        batched: list[Tensor] = []
        recs, tensors = self._walk_result(result, batched)
        handed_tensors = {}
        if self._handed_tensors:
            for key, ref in self._handed_tensors.items():
                if (t := ref()) is not None:
                    handed_tensors[key] = t
            self._handed_tensors = {}
        for t in tensors:
            handed_tensors[id(t)] = t
        escaping = self._handed.keys() | {id(r) for r in recs}
        only_batches = False
        if batched or self._handed_batched:
            whole, only_batches = self._reached_batches(handed_tensors)
            escaping = escaping | whole
        return escaping, handed_tensors, only_batches

    def _count_exit(self, owned: int, handed: int) -> None:
        """The exit's counts (``owned``: the entries of the owned list), logged at DEBUG."""
        self._created = owned + self._pruned + self._extra - self._moved_in
        self.num_freed = len(self._freed)
        self.num_handed_out = handed
        if _log.isEnabledFor(logging.DEBUG):
            _log.debug(
                "scope %r exited: created %d, freed %d buffers (%d bytes), handed out %d%s",
                self.path, self._created, self.num_freed, self.bytes_freed, handed,
                _untracked_note(self._debug_mark),
            )  # fmt: skip
        self._debug_mark = None

    def _walk_result(self, result: Any, batched: list[Tensor]) -> tuple[Any, Any]:
        """The records and Tensors ``result`` reaches (Tensors on leaves a batch holds also go
        to ``batched``); a walk that raises frees nothing."""
        if result is None:
            return (), ()
        try:
            return records_in(result, None, batched)  # a raw alias of any record joins it
        except BaseException as e:
            self._hand_everything_out()
            if not isinstance(e, Exception):  # KeyboardInterrupt, SystemExit: as they are
                raise
            raise TidyjaxTypeError(
                f"scope {self.path!r} could not walk the {type(result).__name__} it returns to "
                f"find its Tensors ({type(e).__name__}: {e}). Nothing was freed: what it made "
                "belongs to the enclosing scope now. Return Tensors in lists, tuples, dicts, "
                "other mappings and sequences, or registered pytrees."
            ) from e

    def _reached_batches(self, handed_tensors: dict[int, Any]) -> tuple[set[int], bool]:
        """The batches this scope owns whose every leaf is returned or kept (ids): each moves
        as one; and whether every Tensor handed out is on one of them. A batch of this scope's
        reached in part gives its reached leaves to a new batch, which moves whole (`rebatch`);
        another's, or one with stale leaves, has them split out, each with its Tensor (their
        records' ids are in the result too). Runs before the owned list is taken."""
        self._handed_batched = False
        # what each handed-out Tensor is on, counted per object in C (a loop per leaf in
        # Python was most of the exit)
        on = list(map(_record_of, handed_tensors.values()))
        first = on[0] if on else None
        if type(first) is Batch and on.count(first) == len(on):  # the usual case: one batch
            counts: dict[int, int] = {id(first): len(on)}  # (a Batch compares by identity)
            objects = {id(first): first}
        else:
            counts = collections.Counter(map(id, on))
            objects = dict(zip(map(id, on), on, strict=True))
        others = False  # a Tensor handed out is not on a batch this scope may move whole
        whole: set[int] = set()
        partial = []
        for key, n in counts.items():
            b = objects[key]
            if type(b) is not Batch or b.dead is not None:
                others = True
                continue
            if b.scope is not self or b.stale:
                partial.append(b)  # Tensors on its split leaves: their records escape
                others = True
                continue
            if n >= b.live and not b.nsplit:
                whole.add(id(b))
            else:
                partial.append(b)
        if not partial:
            return whole, not others
        split_out = self._part_batches(partial, handed_tensors, whole)
        return whole, not others and not split_out

    def _part_batches(
        self, partial: list[Batch], handed_tensors: dict[int, Any], whole: set[int]
    ) -> bool:
        """For `_reached_batches`: the leaves handed out of batches reached in part leave
        them, their ids added to ``whole``; whether any was split into a record of its own."""
        on_partial: dict[int, list[Any]] = {id(b): [] for b in partial}
        for t in handed_tensors.values():
            ts = on_partial.get(id(t._r))
            if ts is not None:
                ts.append(t)
        split_out = False
        for b in partial:
            ts = on_partial[id(b)]
            if b.scope is self and not b.stale and ts:
                # its reached leaves form a batch of their own, which moves whole
                moved = rebatch(b, ts)
                self._owned.append(moved)
                self._moved_in += 1  # listed again, not made again: num_created stays
                whole.add(id(moved))
                continue
            split_out = True
            for t in ts:
                if b.scope is self or type(b.arrays[t._i]) is Buffer:
                    whole.add(id(own_record(b, t)))
        return split_out

    def _sort_owned(
        self, owned: list[Any], escaping: set[int], parent: Any
    ) -> tuple[list[Any], list[Any], int, list[Batch]]:
        """Sort the records this scope owned: the doomed ones (to delete), the survivors made or
        handed here (moved to ``parent``, or kept or a Variable's), how many were handed out,
        and the doomed batches. Records Python already collected are counted in
        ``num_collected``."""
        doomed: list[_registry.Buffer] = []
        survivors: list[_registry.Buffer] = []  # made or handed here, and outliving the exit
        batches: list[Batch] = []
        handed = 0
        for rec in owned:
            if rec.dead is not None:
                continue
            batch = type(rec) is Batch
            if rec.scope is not self:
                if not batch and (rec.scope is KEPT or rec.scope is VARIABLE):
                    survivors.append(rec)  # its Tensor objects made here may still go
                continue  # handed on, or another scope's (a batch: kept whole, or handed on)
            if id(rec) in escaping:
                rec.scope = parent
                if parent is not None:
                    parent._owned.append(rec)
                    if isinstance(parent, Scope):
                        parent._moved_in += 1
                if batch:
                    handed += rec.live
                else:
                    handed += 1
                    survivors.append(rec)
            elif batch:
                if rec.live or rec.stale:
                    batches.append(rec)
            elif rec() is not None or rec.more:
                doomed.append(rec)
            else:  # Python collected it, and JAX freed it
                self._collected += 1
        return doomed, survivors, handed, batches

    def _hand_everything_out(self) -> None:
        """Give every buffer this scope owns, and its Tensor objects, to the enclosing scope
        (or to no scope): the exit could not tell what leaves it, so it frees nothing."""
        parent = _effective(self.parent)
        owned, self._owned = self._owned, []
        for rec in owned:
            if rec.dead is None and rec.scope is self:
                rec.scope = parent
                if parent is not None:
                    parent._owned.append(rec)
        if parent is not None:
            parent._aliases.extend(self._aliases)
        self._aliases = []
        self._handed_tensors = {}
        self._handed = {}
        self._taken = None
        self._freed = []

    def _settle_objects(
        self, handed_tensors: dict[int, Any], survivors: list[Any], parent: Any, why: Any
    ) -> None:
        """The Tensor objects of an exiting scope whose buffers live on (TensorFlow.js's rule):
        those made or handed here are disposed (objects only, nothing deleted) unless returned
        or kept; those returned become the parent's."""
        # Returned or kept holders (None: disposed meanwhile); a Variable is counted in nvars.
        held = [
            rec
            for t in handed_tensors.values()
            if type(rec := t._r) is not Batch and not _is_variable(t, rec)
        ]
        if parent is not None:
            self._hand_objects_to(parent, handed_tensors)
        held += self._dispose_aliases(handed_tensors, why)
        strays = _strays(survivors, held)
        if strays:
            self._dispose_strays(strays, handed_tensors, why)

    def _hand_objects_to(self, parent: Any, handed_tensors: dict[int, Any]) -> None:
        """The returned Tensor objects made here are the parent's objects now."""
        first = self._first_id
        parent._aliases.extend(
            weakref.ref(t)
            for t in handed_tensors.values()
            if t.id >= first
            and (rec := t._r) is not None
            and type(rec) is not Batch  # its batch went to the parent as one
            and not _is_flagged(t, rec)
        )

    def _dispose_aliases(self, handed_tensors: dict[int, Any], why: Any) -> list[Any]:
        """Dispose the listed Tensor objects (made on buffers others own, or handed in) that
        are neither returned nor kept; returns the records of the kept ones (holders)."""
        held = []
        counted: set[int] = set()  # kept Tensors (and Variables) on the list, seen once
        for ref in self._aliases:
            t = ref()
            if t is None or id(t) in handed_tensors or id(t) in counted:
                continue
            rec = record(t)
            if rec is None:
                continue
            if getattr(t, "_kept", False) or getattr(t, "_var", None) is not None:
                counted.add(id(t))
                if getattr(t, "_var", None) is None:  # a Variable is counted in nvars
                    held.append(rec)
                continue
            if rec.dead is None:
                dispose_object(t, why)
                _registry.unhold(rec)
            else:
                dispose_object(t, rec.dead)
        return held

    def _dispose_strays(self, strays: list[Any], handed: dict[int, Any], why: Any) -> None:
        """Dispose (object only) the Tensors made here that hold a buffer which outlives the
        exit through another holder: ``b = scope.keep(a.clone())`` disposes ``a``, as in
        TensorFlow.js. They are not on any list (a fresh buffer's first Tensor is not), so one
        pass of the garbage collector's referrers finds them; it runs only in this case."""
        targets = {id(r) for r in strays}
        arrays = [a for rec in strays for a in rec.arrays()]
        for obj in gc.get_referrers(*arrays):
            if type(obj) is not Tensor:
                continue
            rec = record(obj)
            if (
                rec is None
                or id(rec) not in targets
                or obj.id < self._first_id
                or id(obj) in handed
                or getattr(obj, "_kept", False)
                or getattr(obj, "_var", None) is not None
            ):
                continue
            dispose_object(obj, why)
            _registry.unhold(rec)

    @overload
    def keep(self, value: T, /) -> T: ...
    @overload
    def keep(self, first: Any, second: Any, /, *more: Any) -> tuple[Any, ...]: ...

    def keep(self, *values: Any) -> Any:
        """Hand ``values`` out of this scope exactly as returning them would; returns them.

        Works for Tensors and raw ``jax.Array`` objects in any pytree. Called while an inner
        scope is open, it also takes what that inner scope created: it survives every scope
        inside this one and belongs to this one.

        Example:
            ```python
            with tidy() as scope:
                loss = scope.keep(compute_loss())
            ```
        """
        if self._state != _OPEN:
            raise ScopeError(
                f"scope.keep() on scope {self.path!r}, which is not open; "
                "call it inside the with-block."
            )
        inner: list[Tracker] = []  # the open scopes inside this one, innermost first
        s = CURRENT.get()
        while s is not None and s is not self:
            inner.append(s)
            s = s.parent
        if s is None:
            inner = []
        batched: list[Tensor] = []
        recs, tensors = records_in(values, None, batched)
        if not recs and not tensors:
            for value in values:
                _check_found(value, [], [], f"scope {self.path!r}.keep()")
        if batched:
            recs += self._claim_batches(batched, inner)
        for rec in recs:
            owner = rec.scope
            if owner is not self and any(owner is s for s in inner):
                rec.scope = self
                self._owned.append(rec)
                self._moved_in += 1
                if isinstance(owner, Scope):  # its exit disposes the Tensors it made over it
                    if owner._taken is None:
                        owner._taken = []
                    owner._taken.append(rec)
                owner = self
            # Kept whoever owns it now: a buffer a Variable holds comes home to its scope
            # when the Variable lets go (`_registry.let_go`), and goes out then
            self._handed[id(rec)] = rec
        for scope in (*inner, self):
            if isinstance(scope, Scope):
                scope._handed_tensors.update((id(t), weakref.ref(t)) for t in tensors)
        return values[0] if len(values) == 1 else values

    def _claim_batches(self, batched: list[Tensor], inner: list[Tracker]) -> list[Any]:
        """`keep` of Tensors on leaves batches hold: a batch of a scope inside this one, kept
        whole, becomes this scope's as one; kept in part, its kept leaves are split out (their
        records returned, for `keep` to hand out). This scope's own batches are sorted at its
        exit (`_reached_batches`)."""
        self._handed_batched = True
        if not inner:
            return []
        out = []
        for b, ts, whole in _registry.by_batch(batched):
            if not any(b.scope is s for s in inner):
                continue
            if whole:
                b.scope = self
                self._owned.append(b)
                self._moved_in += 1
            else:
                out += [own_record(b, t) for t in ts]
        return out

    def __enter__(self) -> Scope:
        return self._open(entered_by_with=True)

    def __reduce__(self) -> Any:
        raise TidyjaxTypeError(
            f"scope {self.path!r} cannot be copied or pickled: it stands for buffers this process "
            "owns while it runs. Copy or save the Tensors it made (or keep), not the scope; "
            "leave the scope out of what you copy (e.g. a __getstate__ that drops it)."
        )

    def __copy__(self) -> Any:
        return self.__reduce__()

    def __deepcopy__(self, memo: Any) -> Any:
        return self.__reduce__()

    def __exit__(self, *exc: object) -> None:
        _exit(self, exc[0] is not None, exc[1])

    async def __aenter__(self) -> Scope:
        return self._open(entered_by_with=True)

    async def __aexit__(self, *exc: object) -> None:
        _exit(self, exc[0] is not None, exc[1])

    # -- decorating -------------------------------------------------------------------------

    def __call__(self, fn: F) -> F:
        """Decorate ``fn`` so each call runs in a fresh scope named like this one."""
        if self._state != _NEW:
            raise ScopeError(f"scope {self.path!r} is already in use; decorate with tidy(name).")
        return _decorate(fn, self.name)


# -- scopes opened and closed by code rather than a with-block (the notebook extension, the
# pytest plugin): the named doors, so that nothing outside this module calls a scope's steps.


def open_scope(name: str | None = None) -> Scope:
    """A new scope, entered now: the innermost scope of the running context until closed."""
    return Scope(name)._open()


def close_scope(scope: Scope, result: Any = None) -> None:
    """Exit ``scope`` as a with-block would, handing out what ``result`` reaches."""
    scope._close(result)


def close_through(scope: Scope) -> None:
    """Exit every scope of the running context down to ``scope`` (included), innermost first,
    without raising for the order: a caller cleaning up after code that left scopes open."""
    while isinstance(s := CURRENT.get(), Scope):
        s._close(None)
        if s is scope:
            return


def owned_records(scope: Scope) -> list[_registry.Buffer]:
    """The live records ``scope`` owns now (made in it, or handed to it)."""
    batches: list[Batch] = [r for r in scope._owned if type(r) is Batch and r.dead is None]
    for b in batches:
        _registry.split_all(b)
    return [r for r in scope._owned if type(r) is not Batch and r.scope is scope and r.dead is None]


def _strays(survivors: list[Any], held: list[Any]) -> list[Any]:
    """The surviving records with more live holders than those accounted for (returned, kept,
    Variables): Tensors made in the scope that nothing returned still hold them. The usual
    case, one holder that is returned, is settled by a set lookup."""
    accounted = {id(r) for r in held if r is not None}
    strays = [r for r in survivors if r.dead is None and (r.n > 1 or id(r) not in accounted)]
    if not strays:
        return []
    known: dict[int, int] = {}  # id(record) -> its live holders accounted for
    for r in held:
        if r is not None:
            known[id(r)] = known.get(id(r), 0) + 1
    strays = [r for r in strays if r.n > known.get(id(r), 0) + _variables_on(r)]
    return list({id(r): r for r in strays}.values())


# A Tensor's ``_var`` and ``_kept`` slots are unset on a plain Tensor, and reading an unset slot
# (``getattr(t, "_var", None)``) costs about 0.2 µs, ten times a set one: per leaf at a scope's
# exit that was half its cost. A live Variable's buffer is owned by ``VARIABLE``, a kept Tensor's
# by ``KEPT`` (or ``VARIABLE``, which keeps it as ``home``), so the owner test comes first.


def _is_variable(t: Tensor, rec: Any) -> bool:
    """Whether ``t`` (holding ``rec``, not None) is a Variable; a disposed Tensor (``rec`` None)
    counts as none."""
    return rec is not None and rec.scope is VARIABLE and getattr(t, "_var", None) is not None


def _is_flagged(t: Tensor, rec: Any) -> bool:
    """Whether ``t`` (holding ``rec``, not None) is kept (``tidyjax.keep``) or a Variable."""
    owner = rec.scope
    if owner is not KEPT and owner is not VARIABLE and rec.dead is None:
        return False
    return getattr(t, "_kept", False) or getattr(t, "_var", None) is not None


def _variables_on(rec: _registry.Buffer) -> int:
    return getattr(rec, "nvars", 0) if rec.scope is VARIABLE else 0


def current() -> Tracker | None:
    """The innermost open scope of the running code: scopes of suspended generators (which
    stay in their caller's context) are skipped."""
    return _effective(CURRENT.get())


def _effective(s: Tracker | None) -> Tracker | None:
    while isinstance(s, Scope) and (s._state == _CLOSED or s._transparent()):
        s = s.parent
    return s


def _overgrown(scope: Any) -> bool:
    """Whether ``scope``'s lists (plain lists: not redirected) are due a compaction."""
    owned, aliases = scope._owned, scope._aliases
    return (
        type(owned) is list
        and type(aliases) is list
        and max(len(owned), len(aliases)) > scope._compact_at
    )


class _Redirect(list):
    """The ``_owned``/``_aliases`` list of a scope entered in a generator. While the generator
    is suspended the scope is still the innermost one in its caller's context; what the caller
    makes then goes to the caller's own scope instead. Plain lists for every other scope, so
    the per-op path pays nothing for this."""

    __slots__ = ("attr", "scope")

    def __init__(self, scope: Scope, attr: str) -> None:
        super().__init__()
        self.scope = scope
        self.attr = attr

    def append(self, item: Any) -> None:
        scope = self.scope
        if not scope._transparent():
            list.append(self, item)
            return
        target = _effective(scope.parent)
        if self.attr == "_owned" and item.scope is scope:
            item.scope = target
        if target is not None:
            getattr(target, self.attr).append(item)


def _iterated(frame: Any) -> bool:
    """Whether the generator running ``frame`` is iterated by its caller, rather than being a
    context manager (``contextlib.contextmanager``, a pytest yield fixture), whose scope is
    meant to wrap the caller's with-block."""
    driver = frame.f_back
    name = driver.f_globals.get("__name__", "") if driver is not None else ""
    return not (name == "contextlib" or name.startswith("_pytest"))


def _user_frame() -> Any:
    """The frame of the code that entered a scope (outside tidyjax and contextlib)."""
    frame: Any = sys._getframe(2)
    while frame is not None and frame.f_globals.get("__name__") in (__name__, "contextlib"):
        frame = frame.f_back
    return frame


@_html.never_raises
def _scope_html(s: Scope) -> str:
    esc = _format.esc
    title = f"<b>Scope</b> {esc(repr(s.path))} "
    if s._state == _NEW:
        return _html.box(title, _html.dim("not entered yet"))
    peak = s.peak_bytes
    shown = esc(_format.fmt_bytes(peak)) if peak is not None else None
    unmeasured = _html.dim("measured only inside tidyjax.profile()")
    created = s.num_created
    if s._state != _CLOSED:
        # Records still listed: collected by Python or disposed already; those compaction
        # dropped (_pruned) went the same ways.
        gone = s._pruned + sum(
            (sum(a is None for a in r.arrays) if type(r) is Batch else 1)
            for r in s._owned
            if type(r) is Batch or r.dead is not None or (r() is None and not r.more)
        )
        summary = (
            f"open: {_count(created, 'buffer')} so far, {gone} of them collected early or "
            "disposed; the rest is freed or handed out when it exits"
        )
        header = ["buffers so far", "collected early or disposed so far", "peak so far"]
        row = [created, gone, shown or unmeasured]
        return _html.box(
            title, _html.dim("open"), _html.line(esc(summary)),
            _html.table(header, [row], numeric=range(3)),
        )  # fmt: skip
    # Created here and neither freed at the exit nor handed out: Python collected them when
    # their last reference went (JAX freed them), or they were disposed, kept (tidyjax.keep)
    # or made a Variable's before the exit.
    collected = s.num_collected
    gone = max(created - s.num_freed - s.num_handed_out - collected, 0)
    summary = (
        f"created {created} = freed {s.num_freed} at exit + handed out {s.num_handed_out} + "
        f"collected early {collected} + disposed or kept {gone}"
    )
    header = ["buffers created", "freed at exit", "bytes freed", "handed out",
              "collected early", "disposed or kept", "peak"]  # fmt: skip
    row = [created, s.num_freed, esc(_format.fmt_bytes(s.bytes_freed)), s.num_handed_out,
           collected, gone, shown or unmeasured]  # fmt: skip
    return _html.box(
        title, _html.dim("exited"), _html.line(esc(summary)),
        _html.table(header, [row], numeric=range(7)),
    )  # fmt: skip


def _exit(scope: Scope, failing: bool, error: object = None) -> None:
    _note_structure(error)
    try:
        scope._close(None, failing)
    except Exception:
        if _finalizing():  # a generator collected at interpreter exit: the process frees all
            return
        raise


def _note_structure(error: object) -> None:
    """A pytree structure error about a Tensor node leaving a scope (raised by raw JAX, which
    tidyjax does not call) gets the note that names the fix, as under tidyjax's transformations."""
    if isinstance(error, (TypeError, ValueError)):
        add_structure_hint(error)


def _check_found(x: Any, recs: list[Any], tensors: list[Any], what: str) -> None:
    """``keep`` of a value holding no Tensor or array is a mistake: say so. A disposed Tensor
    is kept as TensorFlow.js keeps it: nothing happens; so is a plain ``jax.Array`` tidyjax
    never made (no scope frees it), as a container of them is."""
    if recs or tensors or is_container(x) or type(x) in CONCRETE:
        return
    found: list[Any] = []
    gather_values(x, found, None)
    if not found:
        raise TidyjaxTypeError(
            f"{what} takes Tensors, jax.Arrays or pytrees holding them; got "
            f"{type(x).__name__} {_format.clip(x)}, which holds none, so there is nothing to keep."
        )


def _check_function(fn: Any, what: str, generators: bool = False) -> None:
    if not callable(fn):
        raise TidyjaxTypeError(
            f"{what} needs a function, got {type(fn).__name__} {_format.clip(fn)}."
        )
    gen = inspect.isgeneratorfunction(fn)
    if (gen and not generators) or inspect.isasyncgenfunction(fn):
        fix = (
            "Decorate it with @tidy instead: each resume runs in the generator's own scope."
            if gen
            else "Inside it, make each item in `async with tidy() as s:` and hand it out with "
            "`item = s.keep(...)`, then yield it after the block."
        )
        raise TidyjaxTypeError(
            f"{what} cannot wrap {'generator' if gen else 'async generator'} function "
            f"{getattr(fn, '__qualname__', fn)!r}: its body "
            f"runs after the scope has ended. {fix}"
        )


def _decorate(fn: F, name: str | None) -> F:
    _check_function(fn, "@tidy", generators=True)
    scope_name = name or getattr(fn, "__name__", None)

    if inspect.isgeneratorfunction(fn):
        return _decorate_generator(fn, scope_name)  # type: ignore[return-value]

    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def run_async(*args: Any, **kwargs: Any) -> Any:
            scope = Scope(scope_name)._open()
            try:
                result = await fn(*args, **kwargs)
            except BaseException as e:
                _note_structure(e)
                scope._close(None, failing=True)
                raise
            scope._close(result)
            return result

        return run_async  # type: ignore[return-value]

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        return _run(Scope(scope_name), fn, args, kwargs)

    return run  # type: ignore[return-value]


def _decorate_generator(fn: Callable[..., Any], name: str | None) -> Callable[..., Any]:
    """``@tidy`` on a generator function: the generator runs in a scope of its own, in a
    context of its own, so its scope is never current in the caller. What it yields (and
    returns) is handed to the caller's scope at that moment. The scope exits when the generator
    finishes, is closed, or is collected."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Iterator[Any]:
        ctx = contextvars.copy_context()
        scope = Scope(name)
        gen = ctx.run(_start_generator, scope, fn, args, kwargs)
        try:
            method: Any = gen.send
            value: Any = None
            while True:
                try:
                    item = ctx.run(method, value)
                except StopIteration as stop:
                    _hand_out(scope, stop.value)
                    return stop.value
                _hand_out(scope, item)
                try:
                    value = yield item
                    method = gen.send
                except GeneratorExit:
                    raise
                except BaseException as e:  # thrown in by the caller: passed on
                    method, value = gen.throw, e
        finally:
            ctx.run(_finish_generator, scope, gen)

    return run


def _start_generator(scope: Scope, fn: Callable[..., Any], args: Any, kwargs: Any) -> Any:
    scope._open()
    try:
        return fn(*args, **kwargs)
    except BaseException:
        scope._close(None, failing=True)
        raise


def _finish_generator(scope: Scope, gen: Any) -> None:
    try:
        gen.close()
    finally:
        if scope._state == _OPEN:
            _exit(scope, failing=sys.exc_info()[0] is not None)


def _hand_out(scope: Scope, value: Any) -> None:
    """Give what ``value`` reaches from ``scope`` to the caller's innermost scope now."""
    if value is None:
        return
    target = current()
    recs, tensors = records_in(value, scope._owned)
    for rec in recs:
        if rec.scope is scope:
            rec.scope = target
            if target is not None:
                target._owned.append(rec)
    for t in tensors:
        scope._handed_tensors[id(t)] = weakref.ref(t)
        if target is not None:
            target._aliases.append(weakref.ref(t))


def _run(scope: Scope, fn: Callable[..., Any], args: Any, kwargs: Any) -> Any:
    scope._open()
    try:
        result = fn(*args, **kwargs)
    except BaseException as e:
        _note_structure(e)
        scope._close(None, failing=True)
        raise
    what = f"function {getattr(fn, '__qualname__', fn)!r}"
    if inspect.isgenerator(result):
        scope._close(None)
        result.close()  # never run
        raise TidyjaxTypeError(_GENERATOR_IN_SCOPE.format(what=what))
    if inspect.isawaitable(result):
        scope._close(None)
        if inspect.iscoroutine(result):
            result.close()  # never run; avoids "never awaited"
        raise TidyjaxTypeError(_AWAITABLE_IN_SYNC.format(what=what, kind="an awaitable"))
    scope._close(result)
    return result


class _Tidy:
    """Run code in a scope that frees every Tensor it created, except what leaves it.

    Every form:

    ```python
    with tidy():                  # anonymous scope
        ...
    with tidy("step") as scope:   # named; scope.keep(t) hands t out; scope.num_freed after
        ...
    async with tidy():            # in async code
        ...

    @tidy                         # each call in a fresh scope named after the function
    def step(x): ...

    @tidy("step")                 # named; works on `async def` too
    async def step(x): ...

    y = tidy.run(fn, *args, **kwargs)          # TensorFlow.js's tf.tidy(fn)
    y = tidy.run("name", fn, *args, **kwargs)
    ```

    Tensors returned (any pytree) move to the enclosing scope; `keep`-ed ones and
    Variables are never freed by a scope; Tensors created in outer scopes are never touched.

    Raises:
        TidyjaxTypeError: a bad argument, a generator function, or a synchronous scope whose
            function returned an awaitable.
        ScopeError: a scope exited twice, out of order, or from another task.
    """

    @overload
    def __call__(self, arg: None = None, /) -> Scope: ...
    @overload
    def __call__(self, arg: str, /) -> Scope: ...
    @overload
    def __call__(self, arg: F, /) -> F: ...

    def __call__(self, arg: Any = None, /) -> Any:
        if arg is None:
            return Scope(None)
        if isinstance(arg, str):
            return Scope(arg)
        if callable(arg):
            return _decorate(arg, None)
        raise TidyjaxTypeError(
            f"tidy() takes a scope name (str) or a function to decorate, got "
            f"{type(arg).__name__} {_format.clip(arg)}. Use `with tidy('name'):` or `@tidy`."
        )

    @overload
    def run(self, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R: ...
    @overload
    def run(self, name: str, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R: ...

    # (mypy cannot match *args/**kwargs against P.args/P.kwargs overloads, hence the ignore.)
    def run(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[misc]
        """Run ``fn(*args, **kwargs)`` in a new scope now and return its result.

        ``tidy.run(fn, *args)`` or ``tidy.run("name", fn, *args)``.
        """
        if not args:
            raise TidyjaxTypeError(
                "tidy.run() needs a function: tidy.run(fn) or tidy.run(name, fn)."
            )
        name = None
        if isinstance(args[0], str):
            name, args = args[0], args[1:]
            if not args:
                raise TidyjaxTypeError(
                    f"tidy.run({name!r}) got a name but no function: tidy.run({name!r}, fn)."
                )
        fn, args = args[0], args[1:]
        if not callable(fn):
            raise TidyjaxTypeError(
                "tidy.run() takes (fn, *args) or (name, fn, *args); "
                f"got {type(fn).__name__} {_format.clip(fn)} where the function should be."
            )
        _check_function(fn, "tidy.run()")
        if inspect.iscoroutinefunction(fn):
            raise TidyjaxTypeError(
                _AWAITABLE_IN_SYNC.format(
                    what=f"async function {fn.__qualname__!r}", kind="a coroutine"
                )
            )
        return _run(Scope(name or getattr(fn, "__name__", None)), fn, args, kwargs)

    # `with tidy:` / `async with tidy:` without the call also work.
    def __enter__(self) -> Scope:
        scope = Scope(None)
        scope._bare = True
        return scope._open(entered_by_with=True)

    def __exit__(self, *exc: object) -> None:
        scope = current()
        if not isinstance(scope, Scope) or not scope._bare:
            raise ScopeError("`with tidy:` exited, but the innermost open scope is not its own.")
        _exit(scope, exc[0] is not None, exc[1])

    async def __aenter__(self) -> Scope:
        return self.__enter__()

    async def __aexit__(self, *exc: object) -> None:
        self.__exit__(*exc)

    def __repr__(self) -> str:
        return "tidyjax.tidy"


tidy = _Tidy()
"""Run code in a scope that frees every buffer it created, except what leaves it.

One object, every form:

```python
with tidy():                  # anonymous scope
    ...
with tidy("step") as scope:   # named; scope.keep(t) hands t out; scope.num_freed after
    ...
async with tidy():            # in async code
    ...

@tidy                         # each call in a fresh scope named after the function
def step(x): ...

@tidy("step")                 # named; works on `async def` too
async def step(x): ...

y = tidy.run(fn, *args, **kwargs)          # TensorFlow.js's tf.tidy(fn)
y = tidy.run("name", fn, *args, **kwargs)
```

Tensors returned (any pytree) move to the enclosing scope; [`keep`][tidyjax.keep]-ed ones and
Variables are never freed by a scope; Tensors created in outer scopes are never touched. See
[`Scope`][tidyjax.Scope] for what a scope reports after it exits.

Raises:
    TidyjaxTypeError: a bad argument, a generator function, or a synchronous scope whose
        function returned an awaitable.
    ScopeError: a scope exited twice, out of order, or from another task.
"""


def keep(x: T) -> T:
    """Protect every buffer in the pytree ``x`` (its Tensors and raw arrays) from all scopes.

    Only an explicit [`dispose`][tidyjax.dispose] frees a kept Tensor. Keeping a disposed Tensor
    does nothing. Returns ``x``.
    """
    batched: list[Tensor] = []
    raw: list[Any] = []
    recs, tensors = records_in(x, None, batched, raw)
    _check_found(x, recs, tensors, "keep()")
    if batched:
        recs += _keep_batches(batched)
    for arr in raw:  # a kept raw array holds its buffer against a dispose of its Tensors too
        _registry.keep_raw(arr)
    for rec in recs:
        if rec.scope is VARIABLE:  # a Variable's buffer is never scope-freed anyway...
            rec.home = KEPT  # ...and kept once no Variable holds it
        else:
            rec.scope = KEPT
    scope = current()
    for t in tensors:  # a clone made in a scope on a buffer it does not own survives it too
        mark_kept(t)
        if scope is not None and type(t._r) is not Batch:  # settled at the scope's exit
            scope._aliases.append(weakref.ref(t))
    return x


def _keep_batches(batched: list[Tensor]) -> list[Any]:
    """`keep` of Tensors on leaves batches hold: a batch kept whole is kept as one; kept in
    part, its kept leaves are split out (their records returned, for `keep` to mark)."""
    out = []
    for b, ts, whole in _registry.by_batch(batched):
        if whole:
            b.scope = KEPT
        else:
            out += [own_record(b, t) for t in ts]
    return out


def dispose(x: Any) -> None:
    """Dispose every Tensor and Variable in the pytree ``x``; other leaves are ignored.

    A raw ``jax.Array`` in ``x`` over a buffer tidyjax made (one that escaped from a Tensor, a
    raw ``device_put`` of one) is deleted when no live Tensor holds its buffer. A plain array
    tidyjax never made is never deleted: it is the caller's (``arr.delete()`` frees it, or
    [`adopt`][tidyjax.adopt] it first). Containers are walked as a scope walks its result.

    Example:
        ```python
        tidyjax.dispose([a, b, {"c": c}])
        ```

    Raises:
        TidyjaxValueError: ``x`` holds a raw ``jax.Array`` whose buffer a live Tensor or
            Variable not in ``x`` holds (nothing is disposed): dispose that Tensor instead.
    """
    tensors: list[Any] = []
    raws: list[Any] = []
    gather_values(x, tensors, raws)
    escaped: list[_registry.Buffer] = []  # recorded buffers no Tensor holds (returned raw)
    unknown = []
    for arr in raws:
        if arr.is_deleted():
            continue
        rec = _registry.lookup(arr)
        if rec is None:
            # An array whose computation failed shares no buffer (and waiting would raise).
            if not failed(arr, wait=True):
                unknown.append(arr)
            continue
        if rec.dead is None:
            escaped.append(rec)
    if unknown:
        escaped += _registry.aliases_of(unknown)
    disposing: dict[int, int] = {}  # id(record) -> its holders disposed by this very call
    if escaped:
        for t in tensors:
            if (rec := record(t)) is not None:
                disposing[id(rec)] = disposing.get(id(rec), 0) + 1
    for rec in escaped:
        others = rec.n - disposing.get(id(rec), 0)  # holders left after this call
        if others > 0 or (rec.scope is VARIABLE and id(rec) not in disposing):
            holders = "a Variable" if rec.scope is VARIABLE else f"{others} live Tensor(s)"
            arr = rec.array()
            raise TidyjaxValueError(
                f"dispose() got a raw jax.Array {describe(arr)} whose buffer {holders} "
                "hold; dispose those (the buffer is freed with its last holder), or "
                "tidyjax.adopt() the array first."
            )
    dispose_many(tensors, DISPOSED)
    if escaped:
        _registry.delete_many(list({id(r): r for r in escaped}.values()), DISPOSED)


def _untracked_note(mark: ArrayMark | None) -> str:
    """The debug summary's note on jax.Arrays made inside a scope that tidyjax does not track
    and that outlive it (``jnp.tanh(t)``, a raw ``jax.jit`` output): where they were made."""
    if mark is None:
        return ""
    sites: dict[str, int] = {}
    nbytes = 0
    for arr in mark.new():
        if _registry.lookup(arr) is not None:
            continue
        nbytes += arr.nbytes
        site = str(creation_site(arr) or "an unknown site")
        sites[site] = sites.get(site, 0) + 1
    if not sites:
        return ""
    top = sorted(sites.items(), key=lambda kv: -kv[1])[:3]
    where = ", ".join(f"{site} x{n}" for site, n in top)
    more = f" and {len(sites) - 3} more sites" if len(sites) > 3 else ""
    return (
        f"; {sum(sites.values())} jax.Arrays ({nbytes} bytes) made here by raw JAX calls are not "
        f"tracked and outlive it ({where}{more}): use the tidyjax form (tidyjax.numpy.*, "
        "tidyjax.lax.*), tidyjax.lift(fn), or tidyjax.tensors(result)"
    )
