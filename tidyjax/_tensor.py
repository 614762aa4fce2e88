"""``Tensor``: a tracked owner of one ``jax.Array``, and the wrap/unwrap path every op goes through.

The per-op path (``wrap``) does the least possible work: one object with ``__slots__``, one buffer
lookup (an address and an atomic ``dict.setdefault``), one weak reference appended to the current
scope. No global scan, no lock unless the buffer is shared.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import operator
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax._src.array import ArrayImpl

try:  # typed PRNG key arrays (jax.random.key) are concrete arrays of their own class
    from jax._src.random.prng import PRNGKeyArray as _PRNGKeyArray
except ImportError:  # pragma: no cover - other jax layouts
    _PRNGKeyArray = ArrayImpl

from . import _html, _registry
from ._context import CURRENT
from ._errors import DisposedError, TidyjaxTypeError, TidyjaxValueError

__all__ = ["Tensor", "adopt", "tensor"]

_Tracer = jax.core.Tracer
_ids = itertools.count(1)
_new = object.__new__
_weak = weakref.ref
_register = _registry.register
_UNTRACKED = _registry.UNTRACKED

#: How to fix a use after dispose, by what disposed it.
_KEEP_HINT = (
    "To use it after the scope, return it from the scope, or call scope.keep(t) / "
    "tidyjax.keep(t) before the scope exits."
)
_DONATE_HINT = "Use the function's output instead, or do not donate this argument (donate_argnums)."


class Tensor:
    """A tracked owner of one ``jax.Array`` (on one device or sharded over several).

    Every operator and method returns a new tracked Tensor, created in the current :func:`tidy`
    scope. :meth:`dispose` deletes the device buffer at once unless another live Tensor or a
    :class:`Variable` shares it. ``Tensor(data)`` is the same as :func:`tidyjax.tensor`: it copies.

    Example::

        a = tidyjax.tensor([1.0, 2.0, 3.0])
        b = (a * 2).sum()
        b.dispose()
    """

    __slots__ = ("__weakref__", "_array", "_id", "_rec", "_scope", "_why")

    # numpy defers to our reflected operators (``np_array + t`` gives a Tensor), as with jax.Array.
    __array_priority__ = 100

    _array: Any
    _id: int
    _rec: _registry.Buffer | None
    _scope: Any
    _why: str

    def __new__(cls, data: Any, dtype: Any = None, *, device: Any = None) -> Tensor:
        return wrap(_copy_in(data, dtype, device))

    # -- state -----------------------------------------------------------------------------

    def _value(self) -> Any:
        """The live jax value, or raise :class:`DisposedError`."""
        rec = self._rec
        if rec is None or rec.dead is not None:
            raise _disposed_error(self)
        return self._array

    @property
    def array(self) -> jax.Array:
        """The ``jax.Array`` this Tensor owns; dispose the Tensor rather than deleting it."""
        return self._value()

    @property
    def id(self) -> int:
        """A process-unique, increasing number identifying this Tensor."""
        return self._id

    @property
    def is_disposed(self) -> bool:
        """True once the Tensor was disposed, freed by a scope, or its buffer was donated."""
        rec = self._rec
        return rec is None or rec.dead is not None

    def dispose(self) -> None:
        """Release this Tensor now; its buffer is deleted unless another live Tensor shares it.

        Idempotent: disposing twice does nothing.
        """
        _dispose(self, "it was disposed explicitly (dispose())")

    def clone(self) -> Tensor:
        """A new Tensor sharing this one's buffer (no copy); each must be disposed on its own."""
        return wrap(self._value())

    # -- shape and metadata (readable after dispose, for error messages) -------------------

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self._value().shape)

    @property
    def dtype(self) -> np.dtype[Any]:
        return self._value().dtype

    @property
    def ndim(self) -> int:
        return self._value().ndim

    @property
    def size(self) -> int:
        return int(self._value().size)

    @property
    def nbytes(self) -> int:
        return int(self._value().nbytes)

    @property
    def sharding(self) -> Any:
        return self._value().sharding

    def devices(self) -> set[Any]:
        """The devices holding this Tensor's buffer(s)."""
        return self._value().devices()

    @property
    def device(self) -> Any:
        return self._value().device

    @property
    def T(self) -> Tensor:  # noqa: N802 - numpy's name
        return wrap(self._value().T)

    @property
    def real(self) -> Tensor:
        return wrap(self._value().real)

    @property
    def imag(self) -> Tensor:
        return wrap(self._value().imag)

    @property
    def at(self) -> _At:
        """Functional updates, as ``jax.Array.at``: ``t.at[0].set(5.0)`` returns a new Tensor."""
        return _At(self)

    def to(self, target: Any) -> Tensor:
        """A Tensor on ``target`` (a ``jax.Device`` or ``jax.sharding.Sharding``).

        Moving to where the buffer already is may share the buffer, as ``jax.device_put`` does.
        """
        return wrap(jax.device_put(self._value(), target))

    # -- conversion to host ----------------------------------------------------------------

    def numpy(self) -> np.ndarray:
        """The values as a NumPy array (a copy; stays valid after dispose)."""
        return np.array(self._value())

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        if copy is False:
            raise ValueError("a Tensor cannot be converted to a NumPy array without a copy")
        return np.array(self._value(), dtype=dtype)

    def __jax_array__(self) -> jax.Array:
        return self._value()

    def item(self, *args: Any) -> Any:
        return self._value().item(*args)

    def tolist(self) -> Any:
        return self._value().tolist()

    def block_until_ready(self) -> Tensor:
        self._value().block_until_ready()
        return self

    def __bool__(self) -> bool:
        return bool(self._value())

    def __float__(self) -> float:
        return float(self._value())

    def __int__(self) -> int:
        return int(self._value())

    def __index__(self) -> int:
        return operator.index(self._value())

    def __complex__(self) -> complex:
        return complex(self._value())

    def __len__(self) -> int:
        return len(self._value())

    def __iter__(self) -> Iterator[Tensor]:
        for row in self._value():
            yield wrap(row)

    def __format__(self, spec: str) -> str:
        return format(self._value(), spec)

    def __repr__(self) -> str:
        name = type(self).__name__
        if self.is_disposed:
            return f"<{name} {_describe(self)} id={self._id}: disposed, {_reason(self)}>"
        text = repr(self._array)
        if text.startswith("Array("):
            text = text[len("Array(") : -1]
        return f"{name}({text})"

    def __str__(self) -> str:
        if self.is_disposed:
            return repr(self)
        return str(self._array)

    def _repr_html_(self) -> str:
        return _tensor_html(self)

    # -- indexing --------------------------------------------------------------------------

    def __getitem__(self, index: Any) -> Tensor:
        rec = self._rec
        if rec is None or rec.dead is not None:
            raise _disposed_error(self)
        return wrap(self._array[unwrap(index)])

    def __setitem__(self, index: Any, value: Any) -> None:
        raise TidyjaxTypeError(
            f"Tensor {_describe(self)} is immutable, like jax.Array; "
            f"use t = t.at[index].set(value) to get an updated Tensor."
        )

    # Tensors compare elementwise, so like jax.Array they are unhashable.
    __hash__ = None  # type: ignore[assignment]

    # -- copying and pickling (each copy is a Tensor the registry counts) -------------------

    def __copy__(self) -> Tensor:
        return self.clone()

    def __deepcopy__(self, memo: dict[int, Any]) -> Tensor:
        return Tensor(self._value())

    def __reduce__(self) -> tuple[Any, ...]:
        return (tensor, (np.array(self._value()),))


Tensor.__module__ = "tidyjax"

_TENSOR_TYPES: set[type] = {Tensor}
# Types that never hold a Tensor: unwrapping passes them through without a tree walk.
_PLAIN = frozenset(
    {ArrayImpl, _PRNGKeyArray, int, float, bool, complex, str, type(None), np.ndarray, slice}
    | {type(Ellipsis)}
)


# -- the per-op path ---------------------------------------------------------------------------


def wrap(arr: Any, borrowed: Any = None) -> Tensor:
    """A new Tensor holding ``arr``, counted in the registry and tracked by the current scope.

    Tracers (inside ``jit``/``grad``/``vmap``) get an untracked Tensor: no tracer is ever counted.
    ``borrowed`` is a collection of buffer keys belonging to a caller's own arrays: a result that
    *is* one of them is tracked but never deleted by tidyjax.
    """
    t = _new(Tensor)
    t._array = arr
    t._id = next(_ids)
    if type(arr) is ArrayImpl or type(arr) is _PRNGKeyArray:
        ref = _weak(t)
        if borrowed:
            _register(t, arr, ref, _registry.buffer_key(arr) not in borrowed)
        else:
            _register(t, arr, ref)
        scope = CURRENT.get()
        t._scope = scope
        if scope is not None:
            tracked = scope._tracked
            tracked.append(ref)
            if len(tracked) > scope._compact_at:
                scope._compact()
    else:
        t._rec = _UNTRACKED
        t._scope = None
    return t


def is_tensor(x: Any) -> bool:
    return isinstance(x, Tensor)


def unwrap(x: Any, raw: list[Any] | None = None) -> Any:
    """Replace every Tensor in the pytree ``x`` by its jax value (disposed ones raise).

    With ``raw``, also collect into it the caller's own concrete arrays found in ``x``.
    """
    tx = type(x)
    if tx in _TENSOR_TYPES:
        return x._value()
    if tx in CONCRETE:
        if raw is not None:
            raw.append(x)
        return x
    if tx in _PLAIN:
        return x
    if tx is tuple:
        return tuple([unwrap(v, raw) for v in x])
    if tx is list:
        return [unwrap(v, raw) for v in x]
    if tx is dict:
        return {k: unwrap(v, raw) for k, v in x.items()}
    if tx in _NAMEDTUPLES or _is_namedtuple(tx):
        return tx._make([unwrap(v, raw) for v in x])

    def leaf(v: Any) -> Any:
        if isinstance(v, Tensor):
            return v._value()
        if raw is not None and type(v) in CONCRETE:
            raw.append(v)
        return v

    return jax.tree_util.tree_map(leaf, x, is_leaf=is_tensor)


def unwrap_args(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """``unwrap`` each positional argument; returns ``args`` itself when nothing needs it."""
    for a in args:
        if type(a) not in _PLAIN:
            return tuple([unwrap(a) for a in args])
    return args


#: The concrete array classes a Tensor tracks; anything else it holds (a tracer) is untracked.
CONCRETE = frozenset({ArrayImpl, _PRNGKeyArray})


def _wrap_leaf(x: Any) -> Any:
    if type(x) in CONCRETE or isinstance(x, _Tracer):
        return wrap(x)
    return x


def _wrap_leaf_borrowed(borrowed: Any) -> Callable[[Any], Any]:
    def leaf(x: Any) -> Any:
        if type(x) in CONCRETE or isinstance(x, _Tracer):
            return wrap(x, borrowed)
        return x

    return leaf


def wrap_tree(out: Any, borrowed: Any = None) -> Any:
    """Wrap every jax array in the pytree ``out`` as a tracked Tensor; other leaves pass through."""
    tout = type(out)
    if tout is ArrayImpl or tout is _PRNGKeyArray:
        return wrap(out, borrowed)
    if tout in _PLAIN or tout in _TENSOR_TYPES:
        return out
    # Plain containers are walked here: cheaper than tree_map's is_leaf callback on every node.
    if tout is tuple:
        return tuple([wrap_tree(v, borrowed) for v in out])
    if tout is list:
        return [wrap_tree(v, borrowed) for v in out]
    if tout is dict:
        return {k: wrap_tree(v, borrowed) for k, v in out.items()}
    if tout in _NAMEDTUPLES or _is_namedtuple(tout):
        return tout._make([wrap_tree(v, borrowed) for v in out])
    if isinstance(out, _Tracer):
        return wrap(out)
    leaf = _wrap_leaf if borrowed is None else _wrap_leaf_borrowed(borrowed)
    return jax.tree_util.tree_map(leaf, out, is_leaf=is_tensor)


def wrap_arrays(out: Any) -> Any:
    """``wrap_tree`` for a pytree known to hold no Tensor (a jitted function's raw outputs)."""
    leaves, treedef = jax.tree_util.tree_flatten(out)
    return treedef.unflatten([_wrap_leaf(v) for v in leaves])


_NAMEDTUPLES: set[type] = set()


def _is_namedtuple(tx: type) -> bool:
    if issubclass(tx, tuple) and hasattr(tx, "_fields"):
        _NAMEDTUPLES.add(tx)
        return True
    return False


def tensors_in(x: Any) -> list[Tensor]:
    """Every Tensor (and Variable) in the pytree ``x``, in order."""
    out: list[Tensor] = []
    _collect(x, out)
    return out


def _collect(x: Any, out: list[Tensor]) -> None:
    tx = type(x)
    if tx in _TENSOR_TYPES:
        out.append(x)
    elif tx in _PLAIN:
        return
    elif tx is tuple or tx is list or (tx in _NAMEDTUPLES or _is_namedtuple(tx)):
        for v in x:
            _collect(v, out)
    elif tx is dict:
        for v in x.values():
            _collect(v, out)
    else:
        out.extend(v for v in jax.tree_util.tree_leaves(x, is_leaf=is_tensor) if is_tensor(v))


def _borrowed_keys(raw: list[Any]) -> set[Any]:
    keys = set()
    for arr in raw:
        with contextlib.suppress(Exception):  # a deleted array cannot come back out of the call
            keys.add(_registry.buffer_key(arr))
    return keys


def lift(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Make ``fn`` take and return Tensors: the one wrapping mechanism of tidyjax.

    The lifted function replaces every Tensor or Variable found anywhere in its arguments (any
    pytree) by its ``jax.Array``, calls ``fn``, and wraps every ``jax.Array`` in the result as a
    new Tensor tracked by the current scope. Other results pass through. A result that *is* one of
    the caller's own raw ``jax.Array`` arguments is tracked but never deleted by tidyjax.

    Example::

        softplus = tidyjax.lift(jax.nn.softplus)
        y = softplus(tidyjax.tensor([0.0, 1.0]))   # a Tensor

    Raises:
        TidyjaxTypeError: ``fn`` is not callable.
    """
    if not callable(fn):
        raise TidyjaxTypeError(f"lift() takes a callable, got {type(fn).__name__} {fn!r:.60}.")

    return _lift(fn, getattr(fn, "__name__", type(fn).__name__))


def _lift(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        raw: list[Any] = []
        args = tuple([unwrap(a, raw) for a in args])
        if kwargs:
            kwargs = {k: unwrap(v, raw) for k, v in kwargs.items()}
        out = fn(*args, **kwargs)
        return wrap_tree(out, _borrowed_keys(raw) if raw else None)

    def lifted(*args: Any, **kwargs: Any) -> Any:
        if _kernel_hook is not None:
            return _kernel_hook(name, call, args, kwargs)
        return call(*args, **kwargs)

    with contextlib.suppress(AttributeError, TypeError):  # callables without metadata
        lifted = functools.wraps(fn)(lifted)
    return lifted


# -- profiling hooks ---------------------------------------------------------------------------
#
# While a profile runs, ``_kernel_hook(name, fn, args, kwargs)`` runs each op and records it.
# Operators are swapped on the class for recording versions, so when no profile runs they cost
# nothing at all; lifted calls check ``_kernel_hook`` once.

_kernel_hook: Callable[..., Any] | None = None
_OPERATORS: dict[str, tuple[Callable[..., Any], str]] = {}


def set_kernel_hook(hook: Callable[..., Any] | None) -> None:
    """Install ``hook`` on every op (None: restore the plain ops)."""
    global _kernel_hook
    _kernel_hook = hook
    for attr, (plain, name) in _OPERATORS.items():
        setattr(Tensor, attr, plain if hook is None else _hooked(plain, name, hook))


def _hooked(plain: Callable[..., Any], name: str, hook: Callable[..., Any]) -> Callable[..., Any]:
    def op(*args: Any) -> Any:
        return hook(name, plain, args, {})

    op.__name__ = plain.__name__
    return op


def _install(attr: str, method: Callable[..., Any], name: str) -> None:
    method.__name__ = attr
    setattr(Tensor, attr, method)
    _OPERATORS[attr] = (method, name)


# -- disposal ----------------------------------------------------------------------------------


def _dispose(t: Tensor, why: str) -> bool:
    """Mark ``t`` disposed; delete its buffer if no other live Tensor holds it."""
    rec = t._rec
    if rec is None:
        return False
    t._rec = None
    t._why = rec.dead if rec.dead is not None else why
    if rec is _UNTRACKED:
        return False
    freed = _registry.release(t._array, rec, t)
    if not freed:
        forget_array(t)
    return freed


class _Meta:
    """What a disposed Tensor remembers of an array it no longer references."""

    __slots__ = ("dtype", "shape")

    def __init__(self, arr: Any) -> None:
        self.shape, self.dtype = arr.shape, arr.dtype


def forget_array(t: Tensor) -> None:
    """Drop a disposed Tensor's reference to a buffer that others still hold.

    A deleted array costs nothing to keep; a live one would stay alive through this disposed
    Tensor even after its other holders are collected.
    """
    arr = t._array
    if type(arr) in CONCRETE and not arr.is_deleted():
        t._array = _Meta(arr)


def _describe(t: Tensor) -> str:
    arr = t._array
    try:
        return f"{arr.dtype}{list(arr.shape)}".replace(" ", "")
    except Exception:
        return type(arr).__name__


def _reason(t: Tensor) -> str:
    rec = t._rec
    if rec is not None and rec.dead is not None:
        return rec.dead
    return getattr(t, "_why", "it was disposed")


def _disposed_error(t: Tensor) -> DisposedError:
    what = type(t).__name__
    reason = _reason(t)
    if "donated" in reason:
        hint = _DONATE_HINT
    elif "scope" in reason:
        hint = _KEEP_HINT
    else:
        hint = "Dispose a Tensor only after its last use, or use a clone() that you dispose."
    return DisposedError(f"{what} {_describe(t)} (id {t._id}) is disposed: {reason}. {hint}")


@_html.never_raises
def _tensor_html(t: Tensor) -> str:
    name = type(t).__name__
    label = getattr(t, "name", None)
    title = f"<b>{name}</b>" + (f" {_html.esc(repr(label))}" if label else "")
    if t.is_disposed:
        return _html.box(title, f" {_html.esc(_describe(t))} · ", _html.bad("disposed"),
                         _html.dim(f": {_reason(t)}"))  # fmt: skip
    arr = t._array
    if type(arr) not in CONCRETE:
        return _html.box(title, " ", _html.dim(f"wrapping {type(arr).__name__}: {arr!r}"))
    devices = ", ".join(sorted(str(d) for d in arr.devices()))
    path = getattr(t._scope, "path", None)
    where = f" · scope {path!r}" if path else " · kept" if t._scope is not None else ""
    info = f"{_describe(t)} · {devices} · {int(arr.nbytes)} B · id {t._id}{where}"
    return _html.box(title, " ", _html.dim(info), _html.values_preview(arr))


# -- construction ------------------------------------------------------------------------------


def _copy_in(data: Any, dtype: Any, device: Any) -> jax.Array:
    if isinstance(data, Tensor):
        data = data._value()
    if isinstance(data, (str, bytes)) or callable(data):
        raise TidyjaxTypeError(
            f"tensor() takes array-like data (a number, nested lists, a NumPy or jax array, a "
            f"Tensor), got {type(data).__name__} {data!r:.60}."
        )
    try:
        arr = jnp.array(data, dtype=dtype, copy=True)
    except TypeError as e:
        raise TidyjaxTypeError(
            f"tensor() cannot make an array from {type(data).__name__}: {e}"
        ) from e
    if device is not None:
        arr = jax.device_put(arr, device)
    return arr


def tensor(data: Any, dtype: Any = None, *, device: Any = None) -> Tensor:
    """A new tracked Tensor holding a copy of ``data``.

    Always copies into a buffer the Tensor owns, so disposing it never deletes a caller's own
    ``jax.Array``. To take over an existing ``jax.Array`` without a copy, use :func:`adopt`.

    Args:
        data: a number, nested sequences, a NumPy or jax array, or a Tensor.
        dtype: the dtype, as for ``jnp.array``.
        device: a ``jax.Device`` or ``jax.sharding.Sharding`` to place the copy on.

    Raises:
        TidyjaxTypeError: ``data`` is not array-like.
        DisposedError: ``data`` is a disposed Tensor.
    """
    return wrap(_copy_in(data, dtype, device))


def adopt(array: jax.Array) -> Tensor:
    """A Tensor that takes ownership of ``array`` without copying.

    Disposing the Tensor (or leaving the scope it was adopted in) deletes ``array`` itself.

    Raises:
        TidyjaxTypeError: ``array`` is not a ``jax.Array``.
        TidyjaxValueError: ``array`` was already deleted.
    """
    if isinstance(array, Tensor):
        raise TidyjaxTypeError(
            "adopt() takes a jax.Array, got a Tensor; use t.clone() to share its buffer."
        )
    if not isinstance(array, jax.Array):
        raise TidyjaxTypeError(
            f"adopt() takes a jax.Array, got {type(array).__name__}; use tidyjax.tensor(data) "
            "to copy other data into a new Tensor."
        )
    if type(array) is ArrayImpl and array.is_deleted():
        raise TidyjaxValueError(
            f"adopt() got a deleted jax.Array ({array.dtype}{list(array.shape)}); nothing to own."
        )
    return wrap(array)


# -- operators and methods, all through wrap/unwrap --------------------------------------------


def _binary(op: Callable[[Any, Any], Any]) -> Callable[[Tensor, Any], Any]:
    def method(self: Tensor, other: Any) -> Any:
        rec = self._rec
        if rec is None or rec.dead is not None:
            raise _disposed_error(self)
        if type(other) in _TENSOR_TYPES:
            other = other._value()
        return wrap(op(self._array, other))

    return method


def _reflected(op: Callable[[Any, Any], Any]) -> Callable[[Tensor, Any], Any]:
    def method(self: Tensor, other: Any) -> Any:
        rec = self._rec
        if rec is None or rec.dead is not None:
            raise _disposed_error(self)
        if type(other) in _TENSOR_TYPES:
            other = other._value()
        return wrap(op(other, self._array))

    return method


def _unary(op: Callable[[Any], Any]) -> Callable[[Tensor], Any]:
    def method(self: Tensor) -> Any:
        rec = self._rec
        if rec is None or rec.dead is not None:
            raise _disposed_error(self)
        return wrap(op(self._array))

    return method


def _method(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
    lifted = _lift(fn, name)

    def method(self: Tensor, *args: Any, **kwargs: Any) -> Any:
        if args or kwargs or _kernel_hook is not None:
            return lifted(self, *args, **kwargs)
        # The common call, t.exp() or t.sum(): the lifted path without its argument walk.
        rec = self._rec
        if rec is None or rec.dead is not None:
            raise _disposed_error(self)
        return wrap_tree(fn(self._array))

    method.__name__ = method.__qualname__ = name
    method.__doc__ = f"Like ``{getattr(fn, '__module__', 'jax')}.{name}``; returns tracked Tensors."
    return method


_BINARY = {
    "add": operator.add, "sub": operator.sub, "mul": operator.mul, "truediv": operator.truediv,
    "floordiv": operator.floordiv, "mod": operator.mod, "pow": operator.pow,
    "matmul": operator.matmul, "and": operator.and_, "or": operator.or_, "xor": operator.xor,
    "lshift": operator.lshift, "rshift": operator.rshift, "divmod": divmod,
}  # fmt: skip
for _name, _op in _BINARY.items():
    _install(f"__{_name}__", _binary(_op), _name)
    _install(f"__r{_name}__", _reflected(_op), _name)
for _name, _op in {
    "lt": operator.lt, "le": operator.le, "gt": operator.gt, "ge": operator.ge,
    "eq": operator.eq, "ne": operator.ne,
}.items():  # fmt: skip
    _install(f"__{_name}__", _binary(_op), _name)
for _name, _op in {
    "neg": operator.neg, "pos": operator.pos, "abs": operator.abs, "invert": operator.invert,
}.items():  # fmt: skip
    _install(f"__{_name}__", _unary(_op), _name)
_install("__getitem__", Tensor.__getitem__, "getitem")

#: jax.Array methods exposed on Tensor, each returning tracked Tensors.
ARRAY_METHODS = [
    "all",
    "any",
    "argmax",
    "argmin",
    "argpartition",
    "argsort",
    "astype",
    "choose",
    "clip",
    "compress",
    "conj",
    "conjugate",
    "copy",
    "cumprod",
    "cumsum",
    "diagonal",
    "dot",
    "flatten",
    "max",
    "mean",
    "min",
    "nonzero",
    "prod",
    "ptp",
    "ravel",
    "repeat",
    "reshape",
    "round",
    "searchsorted",
    "sort",
    "squeeze",
    "std",
    "sum",
    "swapaxes",
    "take",
    "trace",
    "transpose",
    "var",
    "view",
]
#: TF.js-style method names, mapped to the jax.numpy / jax.nn function they call.
FUNCTION_METHODS: dict[str, Callable[..., Any]] = {
    "add": jnp.add, "sub": jnp.subtract, "mul": jnp.multiply, "div": jnp.divide,
    "matmul": jnp.matmul, "pow": jnp.power, "maximum": jnp.maximum, "minimum": jnp.minimum,
    "square": jnp.square, "exp": jnp.exp, "log": jnp.log, "sqrt": jnp.sqrt, "abs": jnp.abs,
    "neg": jnp.negative, "sin": jnp.sin, "cos": jnp.cos, "tanh": jnp.tanh,
    "sigmoid": jax.nn.sigmoid, "relu": jax.nn.relu,
}  # fmt: skip
for _name in ARRAY_METHODS:
    if hasattr(ArrayImpl, _name):
        setattr(Tensor, _name, _method(getattr(ArrayImpl, _name), _name))
for _name, _fn in FUNCTION_METHODS.items():
    setattr(Tensor, _name, _method(_fn, _name))
del _name, _op, _fn


class _At:
    """``t.at[index]`` → an object whose ``set/add/multiply/…`` return tracked Tensors."""

    __slots__ = ("_t",)

    def __init__(self, t: Tensor) -> None:
        self._t = t

    def __getitem__(self, index: Any) -> _AtIndex:
        return _AtIndex(self._t._value().at[unwrap(index)])


class _AtIndex:
    __slots__ = ("_ref",)

    def __init__(self, ref: Any) -> None:
        self._ref = ref

    def __getattr__(self, name: str) -> Callable[..., Any]:
        fn = getattr(self._ref, name)

        def update(*args: Any, **kwargs: Any) -> Any:
            kwargs = {k: unwrap(v) for k, v in kwargs.items()}
            return wrap_tree(fn(*unwrap_args(args), **kwargs))

        return update
