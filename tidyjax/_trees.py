"""One pytree walker and everything built on it: unwrap, wrap_tree, tensors_in, records_in.

Plain containers (tuple, list, dict, namedtuples) are walked here: that is cheaper than
``jax.tree_util.tree_map`` with an ``is_leaf`` callback on every node. Anything else falls back to
``tree_map``, stopping at Tensors.
"""

from __future__ import annotations

import functools
import types
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from . import _registry
from ._arrays import CONCRETE, PLAIN, Tracer
from ._registry import Batch as _Batch
from ._tensor import (
    TENSOR_TYPES,
    Tensor,
    disposed_error,
    own_record,
    wrap,
    wrap_all,
    wrap_borrowed,
    wrap_foreign,
)

__all__ = [
    "arrays", "is_container", "is_tensor", "records_in", "tensors", "tensors_in", "unwrap",
    "unwrap_args", "wrap_arrays", "wrap_tree",
]  # fmt: skip

_NAMEDTUPLES: set[type] = set()
_SEQUENCES: set[type] = {list, tuple}  # and the namedtuples seen: walked in order


def _is_namedtuple(tx: type) -> bool:
    if issubclass(tx, tuple) and hasattr(tx, "_fields"):
        _NAMEDTUPLES.add(tx)
        _SEQUENCES.add(tx)
        return True
    return False


def is_tensor(x: Any) -> bool:
    """Whether ``x`` is a tidyjax Tensor (a Variable included).

    For tree functions that should stop at Tensors: ``jax.tree.map(f, tree, is_leaf=is_tensor)``
    hands ``f`` the Tensors themselves rather than their arrays.
    """
    return isinstance(x, Tensor)


def arrays(tree: Any) -> Any:
    """``tree`` with every Tensor (and Variable) replaced by its ``jax.Array``: for libraries
    that want plain arrays (checkpointing, serialization). The Tensors stay as they are.

    Raises:
        DisposedError: a Tensor in ``tree`` is disposed.
    """
    return unwrap(tree)


#: ``{type: fix}``: what `tensors` does more to a library state recording a tree structure
#: (``jax.example_libraries.optimizers``'s ``OptimizerState``), set by ``_interop`` when that
#: library is imported; empty (no cost) until then.
TENSORS_HOOKS: dict[type, Callable[[Any], Any]] = {}


def tensors(tree: Any) -> Any:
    """``tree`` with every ``jax.Array`` in it replaced by a Tensor; Tensors stay.

    The arrays stay the caller's: tidyjax counts them, and a scope exit or ``dispose`` lets go of
    the Tensor without deleting the array, so memory is freed as soon as nothing else holds it
    (``tensors(step(...))`` in a loop stays flat) and an array the caller still holds is never lost.
    [`tidyjax.adopt`][tidyjax.adopt] hands an array over to be deleted. The way back from
    [`arrays`][tidyjax.arrays]: ``state = tidyjax.tensors(restore(...))``.

    A library state that records the structure of the tree it was made for (the
    ``OptimizerState`` of ``jax.example_libraries.optimizers``) also gets that structure with
    Tensor nodes, so the gradient of the Tensors it gives back matches it (`TENSORS_HOOKS`).
    """
    out = walk(tree, _given_leaf)
    hooks = TENSORS_HOOKS
    if not hooks:
        return out

    def stop(v: Any) -> bool:
        return type(v) in hooks or type(v) in TENSOR_TYPES

    def fix(x: Any) -> Any:  # containers rebuilt as ``walk`` does (a dict keeps its order)
        tx = type(x)
        if tx in hooks:
            return hooks[tx](x)
        if tx in PLAIN or tx in TENSOR_TYPES:
            return x
        if tx is dict:
            return {k: fix(v) for k, v in x.items()}
        if tx is list or tx is tuple:
            return tx(fix(v) for v in x)
        if tx in _NAMEDTUPLES or _is_namedtuple(tx):
            return tx._make([fix(v) for v in x])
        if not any(type(v) in hooks for v in jax.tree_util.tree_leaves(x, is_leaf=stop)):
            return x
        return jax.tree_util.tree_map(fix, x, is_leaf=stop)

    return fix(out)


def _given_leaf(v: Any) -> Any:
    return wrap_borrowed(v) if type(v) in CONCRETE else _wrap_leaf(v)


def _is_value(x: Any) -> bool:
    """A leaf the walker hands to its ``leaf`` function: a Tensor, a jax.Array or a tracer."""
    tx = type(x)
    return tx in TENSOR_TYPES or tx in CONCRETE or isinstance(x, Tracer)


def walk(x: Any, leaf: Callable[[Any], Any]) -> Any:
    """``x`` with ``leaf(v)`` in place of every Tensor, jax.Array and tracer ``v`` in it."""
    tx = type(x)
    if tx in TENSOR_TYPES or tx in CONCRETE:
        return leaf(x)
    if tx in PLAIN:
        return x
    # Leaves are handled inline in the containers: a call per leaf is most of a walk's cost.
    if tx is dict:
        return {
            k: leaf(v) if type(v) in TENSOR_TYPES or type(v) in CONCRETE else walk(v, leaf)
            for k, v in x.items()
        }
    if tx is list or tx is tuple:
        out = [
            leaf(v) if type(v) in TENSOR_TYPES or type(v) in CONCRETE else walk(v, leaf) for v in x
        ]
        return out if tx is list else tuple(out)
    if tx in _NAMEDTUPLES or _is_namedtuple(tx):
        return tx._make([walk(v, leaf) for v in x])
    if isinstance(x, (Tensor, Tracer)):
        return leaf(x)
    return jax.tree_util.tree_map(lambda v: leaf(v) if _is_value(v) else v, x, is_leaf=is_tensor)


def unwrap(x: Any, raw: list[Any] | None = None) -> Any:
    """Replace every Tensor in the pytree ``x`` by its jax value (disposed ones raise).

    With ``raw``, also collect into it the caller's own concrete arrays found in ``x``.
    """
    tx = type(x)
    if tx in TENSOR_TYPES:
        return x.array
    if tx in CONCRETE:
        if raw is not None:
            raw.append(x)
        return x
    if tx in PLAIN:
        return x
    if tx is dict:
        out_dict = {}
        for k, v in x.items():  # the liveness test inlined: a call per leaf costs more
            if type(v) in TENSOR_TYPES:
                rec = v._r
                if rec is None or rec.dead is not None:
                    raise disposed_error(v)
                out_dict[k] = v._array
            else:
                out_dict[k] = unwrap(v, raw)
        return out_dict
    if tx in _SEQUENCES or _is_namedtuple(tx):
        out = []
        for v in x:
            if type(v) in TENSOR_TYPES:
                rec = v._r
                if rec is None or rec.dead is not None:
                    raise disposed_error(v)
                out.append(v._array)
            else:
                out.append(unwrap(v, raw))
        return out if tx is list else tuple(out) if tx is tuple else tx._make(out)

    def leaf(v: Any) -> Any:
        if isinstance(v, Tensor):
            return v.array
        if raw is not None and type(v) in CONCRETE:
            raw.append(v)
        return v

    return walk(x, leaf)


def unwrap_args(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """``unwrap`` each positional argument; returns ``args`` itself when nothing needs it."""
    for a in args:
        if type(a) not in PLAIN:
            return tuple([unwrap(a) for a in args])
    return args


def _wrap_leaf(v: Any) -> Any:
    """A leaf of JAX's own function's result: a new buffer, the very object given, or (a
    committed array) a transfer to where a buffer already is, checked by allocation."""
    if type(v) in CONCRETE:
        return wrap_foreign(v) if v.committed else wrap(v)
    if isinstance(v, Tracer):
        return wrap(v)
    return v


def _foreign_leaf(v: Any) -> Any:
    """A leaf made by user code (or a JAX function that returns a view, such as ``key_data``):
    any array may share an allocation with a recorded buffer."""
    return wrap_foreign(v) if type(v) in CONCRETE else _wrap_leaf(v)


def wrap_tree(out: Any, raw: list[Any] | None = None, foreign: bool = False) -> Any:
    """Wrap every jax array in the pytree ``out`` as a tracked Tensor; other leaves pass through.

    ``raw`` are the caller's own arrays that went into the call: a result that *is* one of them
    is the caller's, so tidyjax never deletes it unless it already owned it. ``foreign``: the
    call is user code, so any result may share an allocation with a recorded buffer.
    """
    one = _foreign_leaf if foreign else _wrap_leaf
    if not raw:
        return walk(out, one)

    def leaf(v: Any) -> Any:
        if type(v) not in CONCRETE:
            return one(v)
        if any(v is r for r in raw):
            return wrap_borrowed(v)
        if foreign or v.committed:
            return wrap_foreign(v, raw)  # a new object over one of them stays the caller's
        return wrap(v)

    return walk(out, leaf)


def wrap_arrays(out: Any) -> Any:
    """``wrap_tree`` for a pytree known to hold no Tensor (a jitted function's raw outputs)."""
    leaves, treedef = jax.tree_util.tree_flatten(out)
    return jax.tree_util.tree_unflatten(treedef, wrap_all(leaves))


def tensors_in(x: Any) -> list[Tensor]:
    """Every Tensor (and Variable) in the pytree ``x``, in order."""
    out: list[Tensor] = []
    gather_values(x, out, None)
    return out


def is_container(x: Any) -> bool:
    """Whether ``x`` is a pytree container (``None``, a list, tuple or dict, a registered node)
    rather than a single leaf."""
    tx = type(x)
    if x is None or tx is list or tx is tuple or tx is dict:
        return True
    if tx in TENSOR_TYPES or tx in CONCRETE or (tx in PLAIN and tx is not np.ndarray):
        return False
    if _items(x) is not None:
        return True
    return not jax.tree_util.treedef_is_leaf(jax.tree_util.tree_structure(x))


#: Leaves whose attributes are never searched for Tensors.
_OPAQUE = (
    str, bytes, int, float, complex, bool, type, np.ndarray, np.generic, types.FunctionType,
    types.BuiltinFunctionType, types.ModuleType, range, set, frozenset,
)  # fmt: skip


def gather_values(
    x: Any, tensors: list[Tensor], raws: list[Any] | None, seen: set[int] | None = None
) -> None:
    """Append the Tensors in ``x`` to ``tensors`` and, with ``raws``, its raw jax.Arrays.

    Pytrees, the containers JAX does not flatten (`_items`), bound methods and
    ``functools.partial`` objects, and the attributes of other objects (as TensorFlow.js searches
    plain objects) are walked without recursion and with no size cap: each container or object
    once, so a cycle or a shared sub-tree is walked once."""
    if seen is None:
        seen = set()
    stack = [x]
    pop, push = stack.pop, stack.extend
    while stack:
        x = pop()
        tx = type(x)
        if tx in TENSOR_TYPES:
            tensors.append(x)
        elif tx in CONCRETE:
            if raws is not None:
                raws.append(x)
        elif tx in PLAIN:
            if tx is np.ndarray and x.dtype == object and id(x) not in seen:
                seen.add(id(x))  # a NumPy array of Python objects
                push(reversed(x.ravel().tolist()))
        elif tx is dict or tx in _SEQUENCES or _is_namedtuple(tx):
            if id(x) in seen:
                continue
            seen.add(id(x))
            values = x.values() if tx is dict else x
            if all(type(v) in TENSOR_TYPES for v in values):  # most nodes of a parameter tree
                tensors += values
            else:
                push(reversed(list(values)))
        elif isinstance(x, Tensor):
            tensors.append(x)
        elif id(x) not in seen:
            seen.add(id(x))
            push(reversed(_children(x)))


def _children(x: Any) -> list[Any]:
    """What `gather_values` walks inside an object that is not a plain container: a registered
    pytree node's leaves, a container's items, a bound method's object, a partial's function and
    arguments, or an object's attributes."""
    if isinstance(x, types.MethodType):
        return [x.__self__]
    if isinstance(x, functools.partial):
        return [x.func, *x.args, *x.keywords.values()]
    leaves = jax.tree_util.tree_leaves(x, is_leaf=is_tensor)
    if len(leaves) != 1 or leaves[0] is not x:
        return [v for v in leaves if v is not None]
    items = _items(x)
    if items is not None:
        return items
    if isinstance(x, _OPAQUE):
        return []
    module = type(x).__module__ or ""
    if module.startswith(("jax", "numpy")):
        return []
    values = list(vars(x).values()) if isinstance(getattr(x, "__dict__", None), dict) else []
    for cls in type(x).__mro__:
        slots = cls.__dict__.get("__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            if name not in ("__dict__", "__weakref__"):
                values.append(getattr(x, name, None))
    return values


def _items(v: Any) -> Any:
    """The items of a container JAX does not flatten (a ``dict`` or ``list`` subclass, a
    ``deque``, any ``Mapping`` or ``Sequence``, a NumPy object array), or None for anything else.
    TensorFlow.js walks what a scope returns; so do `records_in` and `dispose`."""
    if isinstance(v, Mapping):
        return list(v.values())
    if isinstance(v, (str, bytes, bytearray, memoryview, range)):
        return None
    if isinstance(v, (Sequence, deque)):
        return list(v)
    if isinstance(v, np.ndarray):
        return list(v.flat) if v.dtype == object else None
    return None


def records_in(
    x: Any, among: Any = None, batched: list[Tensor] | None = None, raw: list[Any] | None = None
) -> tuple[list[_registry.Buffer], list[Tensor]]:
    """The live buffer records reached from ``x`` (its Tensors, and its raw jax.Arrays: those
    tidyjax records, and other array objects over a recorded buffer, looked for ``among`` the
    given records or else all), and the live Tensors among its leaves.

    A Tensor on a leaf a `Batch` holds goes to ``batched`` when given (the caller acts on
    whole batches), else its leaf gets a record of its own. ``raw``, when given, gets the raw
    arrays reached that the books know (a kept one protects its buffer from a dispose)."""
    if _registry.suspects:  # an alias found later would take a dropped Tensor's owner after
        _registry.resolve()  # this keep or return decided what leaves (it must decide last)
    tensors: list[Tensor] = []
    raws: list[Any] = []
    gather_values(x, tensors, raws)
    untracked = _registry.UNTRACKED
    recs = []
    live = []
    for t in tensors:
        rec = t._r
        if rec is None or rec.dead is not None or rec is untracked:
            continue
        if type(rec) is _Batch:
            if batched is not None and type(rec.arrays[t._i]) is not _registry.Buffer:
                batched.append(t)
                live.append(t)
                continue
            rec = own_record(rec, t)
            if rec.dead is not None:
                continue
        recs.append(rec)
        live.append(t)
    unknown = []
    for arr in raws:
        rec = _registry.lookup(arr)
        if rec is None:
            unknown.append(arr)
        elif rec.dead is None:
            recs.append(rec)
    if unknown:  # a raw device_put of a recorded buffer to where it is: the same buffer
        recs += _registry.aliases_of(unknown, among)
    if raw is not None:  # ``raw``: the raw arrays reached that the books know
        raw += [a for a in raws if _registry.lookup(a) is not None]
    return recs, live
