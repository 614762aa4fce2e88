"""Scopes: ``tidy`` in all its forms, ``keep`` and ``dispose``.

A :class:`Scope` owns every device buffer created while it is the innermost open scope of the
running thread or task (``_tensor.wrap`` appends each new buffer's record). When it exits —
normally or by an exception — each buffer it owns is handed to the parent scope if the result or
``scope.keep`` reaches it (through a Tensor or a raw ``jax.Array``), and deleted otherwise,
whether or not its Tensor objects are still alive. Buffers kept, held by Variables or created in
outer scopes are never touched; Tensor objects the scope made on such buffers (clones) are
marked disposed without deleting anything.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable
from typing import Any, TypeVar, overload

from . import _html, _registry
from ._arrays import describe
from ._context import CURRENT, Tracker
from ._errors import DISPOSED, ScopeError, TidyjaxTypeError, TidyjaxValueError, scope_exited
from ._registry import KEPT, VARIABLE
from ._tensor import dispose_many, forget_array
from ._trees import _gather, records_in

__all__ = ["Scope", "dispose", "keep", "tidy"]

F = TypeVar("F", bound=Callable[..., Any])
_log = logging.getLogger("tidyjax")

_NEW, _OPEN, _CLOSED = 0, 1, 2
_GENERATOR_IN_SCOPE = (
    "{what} returned a generator: its body would run after the scope has ended, and the "
    "scope would free tensors it still needs. Return a list instead (`list(x for x in ...)` "
    "or a list comprehension), or put `with tidy():` inside the generator around each step."
)
_AWAITABLE_IN_SYNC = (
    "{what} returned {kind}: a synchronous tidy scope would end before it runs and could free "
    "tensors it still needs. Use `async with tidy():` inside the coroutine, or decorate the "
    "`async def` itself with @tidy."
)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


class Scope(Tracker):
    """One ``tidy`` scope: a context manager (sync and async) and a decorator.

    Made by :data:`tidy`; see its docstring for every form. After the scope exits, its report
    attributes tell what it did: ``num_freed`` and ``bytes_freed`` (buffers deleted),
    ``num_handed_out`` (buffers handed to the enclosing scope).
    """

    __slots__ = (
        "_bare",
        "_created",
        "_freed",
        "_handed",
        "_handed_tensors",
        "_moved_in",
        "_state",
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
        self._handed: set[int] = set()  # ids of records handed out by scope.keep
        self._handed_tensors: set[int] = set()  # ids of Tensor objects handed out likewise
        self._freed: list[Any] = []  # the deleted arrays (they still know their nbytes)
        self._bare = False
        self._moved_in = 0  # records handed in by inner scopes (not created here)
        self._created = 0
        self.num_freed = 0
        self.num_handed_out = 0

    def __repr__(self) -> str:
        state = ("new", "open", "exited")[self._state]
        extra = ""
        if self._state == _CLOSED:
            extra = f", freed {_count(self.num_freed, 'buffer')} "
            extra += f"({_html.fmt_bytes(self.bytes_freed)}), handed out {self.num_handed_out}"
        return f"<tidyjax.Scope {self.path!r} {state}{extra}>"

    def _repr_html_(self) -> str:
        return _scope_html(self)

    @property
    def num_created(self) -> int:
        """Buffers created while this was the innermost scope (collected ones included)."""
        if self._state == _CLOSED:
            return self._created
        return len(self._owned) + self._pruned - self._moved_in

    @property
    def peak_bytes(self) -> int | None:
        """The most tidyjax bytes alive while the scope was open; measured only while a
        :func:`tidyjax.profile` runs, else None."""
        return self._peak if self._peak >= 0 else None

    @property
    def bytes_freed(self) -> int:
        """Bytes of the device buffers this scope's exit deleted (shared buffers not included)."""
        return sum(int(arr.nbytes) for arr in self._freed)

    # -- entering and leaving ---------------------------------------------------------------

    def _open(self) -> Scope:
        if self._state != _NEW:
            raise ScopeError(
                f"scope {self.path!r} was already entered; a scope object is used once. "
                "Call tidy() again for a new scope."
            )
        parent = CURRENT.get()
        self.parent = parent
        if parent is not None:
            self.path = f"{parent.path}/{self.name or '<tidy>'}"
        self._token = CURRENT.set(self)
        self._state = _OPEN
        if _registry.observers:  # a timeline draws scopes as bands
            for observer in list(_registry.observers):
                observer.event("scope_enter", self)
        return self

    def _close(self, result: Any = None) -> None:
        if self._state != _OPEN:
            what = "has not been entered" if self._state == _NEW else "has already exited"
            raise ScopeError(f"cannot exit scope {self.path!r}: it {what}.")
        current = CURRENT.get()
        if current is not self:
            inner = "no scope" if current is None else f"scope {current.path!r}"
            raise ScopeError(
                f"cannot exit scope {self.path!r}: {inner} is the innermost open scope here. "
                "Scopes must exit in reverse order of entry, in the thread or task that entered "
                "them."
            )
        try:
            CURRENT.reset(self._token)
        except ValueError as e:
            raise ScopeError(
                f"cannot exit scope {self.path!r} from another thread, task or context than the "
                "one that entered it."
            ) from e
        self._state = _CLOSED
        self._token = None
        self._free(result)
        if _registry.observers:
            for observer in list(_registry.observers):
                observer.event("scope_exit", self)

    def _free(self, result: Any) -> None:
        recs, tensors = records_in(result)
        escaping = self._handed | {id(r) for r in recs}
        escaping_tensors = self._handed_tensors | {id(t) for t in tensors}
        parent = self.parent
        doomed: list[_registry.Buffer] = []
        handed = 0
        owned, self._owned = self._owned, []
        for rec in owned:
            if rec.scope is not self or rec.dead is not None:
                continue  # kept, held by a Variable, handed on, or already freed
            if id(rec) in escaping:
                rec.scope = parent
                if parent is not None:
                    parent._owned.append(rec)
                    if isinstance(parent, Scope):
                        parent._moved_in += 1
                handed += 1
            elif rec() is not None or rec.more:  # else Python collected it, and JAX freed it
                doomed.append(rec)
        why = scope_exited(self.path)
        self._freed = _registry.delete_many(doomed, why)
        # Tensor objects made here on buffers owned elsewhere: disposed, nothing deleted.
        for ref in self._aliases:
            t = ref()
            if (
                t is not None
                and t._rec is not None
                and id(t) not in escaping_tensors
                and not getattr(t, "_kept", False)
            ):
                rec = t._rec
                t._rec = None
                t._why = rec.dead if rec.dead is not None else why
                if rec.dead is None:
                    _registry.unhold(rec)
                    forget_array(t)
        self._aliases = []
        self._handed = set()
        self._handed_tensors = set()
        self._created = len(owned) + self._pruned - self._moved_in
        self.num_freed = len(self._freed)
        self.num_handed_out = handed
        if _log.isEnabledFor(logging.DEBUG):
            _log.debug(
                "scope %r exited: created %d, freed %d buffers (%d bytes), handed out %d",
                self.path, self._created, self.num_freed, self.bytes_freed, handed,
            )  # fmt: skip

    def keep(self, *values: Any) -> Any:
        """Hand ``values`` out of this scope exactly as returning them would; returns them.

        Works for Tensors and raw ``jax.Array`` objects in any pytree. Called while an inner
        scope is open, it also takes what that inner scope created: it survives every scope
        inside this one and belongs to this one.

        Example::

            with tidy() as scope:
                loss = scope.keep(compute_loss())
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
        recs, tensors = records_in(values)
        for rec in recs:
            owner = rec.scope
            if owner is not self and any(owner is s for s in inner):
                rec.scope = self
                self._owned.append(rec)
                self._moved_in += 1
                owner = self
            if owner is self:
                self._handed.add(id(rec))
        for scope in (*inner, self):
            if isinstance(scope, Scope):
                scope._handed_tensors.update(id(t) for t in tensors)
        return values[0] if len(values) == 1 else values

    def __enter__(self) -> Scope:
        return self._open()

    def __exit__(self, *exc: object) -> None:
        self._close(None)

    async def __aenter__(self) -> Scope:
        return self._open()

    async def __aexit__(self, *exc: object) -> None:
        self._close(None)

    # -- decorating -------------------------------------------------------------------------

    def __call__(self, fn: F) -> F:
        """Decorate ``fn`` so each call runs in a fresh scope named like this one."""
        if self._state != _NEW:
            raise ScopeError(f"scope {self.path!r} is already in use; decorate with tidy(name).")
        return _decorate(fn, self.name)


@_html.never_raises
def _scope_html(s: Scope) -> str:
    esc = _html.esc
    title = f"<b>Scope</b> {esc(repr(s.path))} "
    if s._state == _NEW:
        return _html.box(title, _html.dim("not entered yet"))
    peak = s.peak_bytes
    header = ["buffers created", "freed", "bytes freed", "handed out", "peak"]
    row = [
        s.num_created,
        s.num_freed if s._state == _CLOSED else "",
        esc(_html.fmt_bytes(s.bytes_freed)) if s._state == _CLOSED else "",
        s.num_handed_out if s._state == _CLOSED else "",
        esc(_html.fmt_bytes(peak)) if peak is not None else _html.dim("not measured"),
    ]
    state = "exited" if s._state == _CLOSED else "open"
    return _html.box(title, _html.dim(state), _html.table(header, [row], numeric=range(5)))


def _check_function(fn: Any, what: str) -> None:
    if not callable(fn):
        raise TidyjaxTypeError(f"{what} needs a function, got {type(fn).__name__} {fn!r:.60}.")
    if inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn):
        raise TidyjaxTypeError(
            f"{what} cannot wrap generator function {getattr(fn, '__qualname__', fn)!r}: its body "
            "runs after the scope has ended. Put `with tidy():` inside the generator (around each "
            "step's work) instead."
        )


def _decorate(fn: F, name: str | None) -> F:
    _check_function(fn, "@tidy")
    scope_name = name or getattr(fn, "__name__", None)

    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def run_async(*args: Any, **kwargs: Any) -> Any:
            scope = Scope(scope_name)._open()
            try:
                result = await fn(*args, **kwargs)
            except BaseException:
                scope._close(None)
                raise
            scope._close(result)
            return result

        return run_async  # type: ignore[return-value]

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        return _run(Scope(scope_name), fn, args, kwargs)

    return run  # type: ignore[return-value]


def _run(scope: Scope, fn: Callable[..., Any], args: Any, kwargs: Any) -> Any:
    scope._open()
    try:
        result = fn(*args, **kwargs)
    except BaseException:
        scope._close(None)
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

    Every form::

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

    Tensors returned (any pytree) move to the enclosing scope; :func:`keep`-ed ones and
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
            f"{type(arg).__name__} {arg!r:.60}. Use `with tidy('name'):` or `@tidy`."
        )

    def run(self, *args: Any, **kwargs: Any) -> Any:
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
                f"got {type(fn).__name__} {fn!r:.60} where the function should be."
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
        return scope._open()

    def __exit__(self, *exc: object) -> None:
        scope = CURRENT.get()
        if not isinstance(scope, Scope) or not scope._bare:
            raise ScopeError("`with tidy:` exited, but the innermost open scope is not its own.")
        scope._close(None)

    async def __aenter__(self) -> Scope:
        return self.__enter__()

    async def __aexit__(self, *exc: object) -> None:
        self.__exit__()

    def __repr__(self) -> str:
        return "tidyjax.tidy"


tidy = _Tidy()
"""Run code in a scope that frees every buffer it created, except what leaves it.

One object, every form: ``with tidy():``, ``with tidy("name") as scope:``,
``async with tidy():``, ``@tidy``, ``@tidy("name")`` (on ``async def`` too), and the
TensorFlow.js form ``tidy.run(fn, *args)`` / ``tidy.run("name", fn, *args)``. See
:class:`Scope` for what a scope reports after it exits.
"""


def keep(x: Any) -> Any:
    """Protect every buffer in the pytree ``x`` (its Tensors and raw arrays) from all scopes.

    Only an explicit :func:`dispose` frees a kept Tensor. Keeping a disposed Tensor does nothing.
    Returns ``x``.
    """
    recs, tensors = records_in(x)
    for rec in recs:
        if rec.scope is not VARIABLE:  # a Variable's buffer is never scope-freed anyway
            rec.scope = KEPT
    for t in tensors:  # a clone made in a scope on a buffer it does not own survives it too
        t._kept = True
    return x


def dispose(x: Any) -> None:
    """Dispose every Tensor and Variable in the pytree ``x``, and delete every raw
    ``jax.Array`` in it that no live Tensor holds; other leaves are ignored.

    Example::

        tidyjax.dispose([a, b, {"c": c}])

    Raises:
        TidyjaxValueError: ``x`` holds a raw ``jax.Array`` whose buffer a live Tensor or
            Variable holds (nothing is disposed): dispose that Tensor instead.
    """
    tensors: list[Any] = []
    raws: list[Any] = []
    _gather(x, tensors, raws)
    for arr in raws:
        if arr.is_deleted():
            continue
        rec = _registry.lookup(arr) or _registry.find_alias(arr)
        if rec is not None and rec.dead is None:
            raise TidyjaxValueError(
                f"dispose() got a raw jax.Array {describe(arr)} whose buffer a live Tensor "
                "holds; dispose that Tensor (its buffer is freed with its last holder), or "
                "tidyjax.adopt() the array first."
            )
    dispose_many(tensors, DISPOSED)
    for arr in raws:
        if not arr.is_deleted():
            arr.delete()
