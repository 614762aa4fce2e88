"""``watch``: name the arrays held by objects tidyjax does not own, for the memory reports.

A Flax NNX model keeps raw ``jax.Array``s in its ``nnx.Param``s, an optimizer its state, a
dict its arrays: device memory that tidyjax never sees, so ``memory()`` counts it as untracked.
``watch(obj, name)`` registers such an object. At report time (``memory()``, ``live_tensors()``,
``snapshot()``), never per op, the arrays the object holds *then* are found and named by their
path in it: ``model.layers[0].kernel``. Nothing is tracked, kept or freed because of a watch.
"""

from __future__ import annotations

import itertools
import sys
import threading
import weakref
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import jax
import numpy as np

from . import _format
from ._arrays import CONCRETE
from ._errors import TidyjaxTypeError, TidyjaxValueError
from ._jaxdoors import base_array
from ._tensor import Tensor, held_array
from ._trees import is_tensor

__all__ = ["unwatch", "watch", "watched"]

T = TypeVar("T")

# name -> a function returning the watched object (None once a weakly held one is gone), in the
# order of the watch calls. Reports copy it under the lock and walk the objects outside it.
_watched: dict[str, Callable[[], Any]] = {}
# Every name ever watched: unwatching one again is no error, unwatching a typo is.
_names: set[str] = set()
# Values that never hold an array.
_SCALARS = (bool, int, float, complex, str, bytes, np.generic)
_lock = threading.Lock()


def watch(obj: T, name: str) -> T:
    """Report the arrays inside ``obj`` under ``name`` in ``memory()`` and ``live_tensors()``.

    ``obj`` is anything JAX can flatten (a dict or list of arrays, an Equinox module, an optax
    state) or a Flax NNX object (``nnx.Module``, ``nnx.Optimizer``, ``nnx.MultiMetric``), read
    through ``nnx.state``. It is held weakly when it allows that (NNX objects, modules, most class
    instances), else strongly (dicts, lists, tuples) until [`unwatch`][tidyjax.unwatch]. Watching
    again under a name in use replaces that entry (a re-run notebook cell makes a new object
    under the same name); watching an object again under its own name does nothing.

    An object is reported under one name: watching it under another raises rather than
    renaming it, since two names for one object are most often two variables that turned out
    to hold the same object (``ema = params`` where a copy was meant). To rename it, unwatch it
    first: ``tidyjax.unwatch("old"); tidyjax.watch(obj, "new")``.

    At each report, the arrays ``obj`` holds then are counted (each buffer once):
    ``memory().watched[name]`` is their bytes, ``memory().watched_arrays[name]`` their number,
    and they no longer count as untracked; an out-of-memory report lists them apart
    (``OOMReport.watched``). ``live_tensors()`` lists each under its path
    (``model.layers[0].kernel``) and counts them apart in its headline (``3 live tensors, 12 B;
    2 watched arrays, 4.0 MiB``). Tensors inside ``obj`` get that name too and stay counted as
    Tensors (in ``num_bytes``). Watching costs nothing per operation.

    Returns:
        ``obj``, so that ``model = tidyjax.watch(Model(...), "model")`` reads naturally.

    Raises:
        TidyjaxTypeError: ``name`` is not a non-empty string, or ``obj`` cannot hold arrays
            (None, a number, a string, an object JAX sees as a single non-array leaf).
        TidyjaxValueError: ``obj`` is already watched under another name; the message names
            it. Nothing changes then.

    Example:
        ```python
        model = tidyjax.watch(MLP(rngs=nnx.Rngs(0)), "model")
        print(tidyjax.memory().watched)          # {'model': 1184}
        print(tidyjax.memory().watched_arrays)   # {'model': 4}
        ```
    """
    _check_watch_args(obj, name)
    try:
        ref: Callable[[], Any] = weakref.ref(obj)
    except TypeError:  # dicts, lists, tuples: held until unwatch()
        ref = itertools.repeat(obj).__next__  # a strong reference, called as a weak one
    with _lock:
        for old, r in _watched.items():
            if r() is obj and old != name:
                raise TidyjaxValueError(
                    f"watch() got an object already watched as {old!r}: an object is reported "
                    f"under one name, so it cannot also be {name!r}. To rename it, call "
                    f"tidyjax.unwatch({old!r}) first; to watch another object as {name!r}, "
                    f"pass that object (this one is the object watched as {old!r})."
                )
        if name not in _watched or _watched[name]() is not obj:  # else: watched so already
            _watched.pop(name, None)
            _watched[name] = ref
            _names.add(name)
    return obj


def _check_watch_args(obj: Any, name: Any) -> None:
    """Raise `watch`'s TidyjaxTypeError for a bad name or an object that cannot hold arrays:
    None, a number, a string, an object JAX sees as one leaf that is neither an array nor a
    Flax NNX object (which need not be a pytree)."""
    if not isinstance(name, str) or not name:
        raise TidyjaxTypeError(
            f"watch() takes a name (a non-empty str) as its second argument, got {name!r}: "
            f'write tidyjax.watch(obj, "model").'
        )
    if obj is None or isinstance(obj, _SCALARS):
        why = "which holds none"
    elif (
        isinstance(obj, (Tensor, jax.Array, np.ndarray))
        or _is_nnx(obj)
        or not jax.tree_util.treedef_is_leaf(jax.tree_util.tree_structure(obj, is_leaf=is_tensor))
    ):
        return
    else:
        why = (
            "which JAX sees as one leaf: register its class as a pytree, or watch the dict or "
            "module holding its arrays"
        )
    raise TidyjaxTypeError(
        "watch() takes an object that holds arrays (a pytree such as a dict or list of "
        "arrays, an Equinox module or an optax state; a Flax NNX module or optimizer; a "
        f"jax.Array or Tensor), got {type(obj).__name__} {_format.clip(obj)}, {why}."
    )


def _is_nnx(obj: Any) -> bool:
    """Whether ``obj`` is a Flax NNX object (without importing Flax)."""
    nnx_graph = sys.modules.get("flax.nnx.graph")
    return nnx_graph is not None and bool(nnx_graph.is_graph_node(obj))


def unwatch(obj: Any) -> None:
    """Stop reporting ``obj`` (the watched object itself, or the name it was watched under).

    Unwatching an object or a name again does nothing (its object may also be gone already).

    Raises:
        TidyjaxValueError: ``obj`` is a name that was never watched (a typo?); the message
            lists the names watched now.
    """
    with _lock:
        names = [
            n for n, r in _watched.items() if r() is obj or (isinstance(obj, str) and n == obj)
        ]
        for name in names:
            del _watched[name]
        if isinstance(obj, str) and obj not in _names:
            now = [n for n, r in _watched.items() if r() is not None]
            raise TidyjaxValueError(
                f"unwatch() got {obj!r}, a name that was never watched; the watched names are "
                f"{', '.join(map(repr, now)) if now else 'none'}."
            )


def any_watched() -> bool:
    """Whether any object is registered with `watch`."""
    return bool(_watched)


def watched() -> dict[str, list[tuple[str, Any]]]:
    """Each watched name with the ``(path, array)`` pairs its object holds now, in order.

    Arrays are concrete and not deleted, each object once per name (a Tensor contributes its
    array). Entries whose weakly held object is gone are dropped. Called by reports only.
    """
    with _lock:
        for name in [n for n, ref in _watched.items() if ref() is None]:
            del _watched[name]
        objects = [(name, obj) for name, ref in _watched.items() if (obj := ref()) is not None]
    out: dict[str, list[tuple[str, Any]]] = {}
    for name, obj in objects:
        found: dict[int, tuple[str, Any]] = {}
        for path, leaf in _leaves(obj, name):
            arr = held_array(leaf) if isinstance(leaf, Tensor) else leaf
            if type(arr) in CONCRETE and not base_array(arr).is_deleted():
                found.setdefault(id(arr), (path, arr))
        out[name] = list(found.values())
    return out


def _leaves(obj: Any, name: str) -> Iterable[tuple[str, Any]]:
    """``(path, leaf)`` for every leaf of ``obj``, Tensors as leaves. An NNX object need not be
    a pytree (``pytree=False``): its state is the one view of every Variable, shared ones once,
    with paths as NNX prints them."""
    if not _is_nnx(obj):
        yield from _flat(obj, name)
        return
    from flax import nnx

    for path, var in nnx.to_flat_state(nnx.state(obj)):
        prefix = name + "".join(f".{k}" if _is_attr(k) else f"[{k!r}]" for k in path)
        if isinstance(var, nnx.Variable):  # get_value() from flax 0.12 (where .value warns)
            var = var.get_value() if hasattr(var, "get_value") else var.value
        yield from _flat(var, prefix)


def _is_attr(k: Any) -> bool:
    return isinstance(k, str) and k.isidentifier()


def _flat(obj: Any, prefix: str) -> Iterable[tuple[str, Any]]:
    leaves, _ = jax.tree_util.tree_flatten_with_path(obj, is_leaf=is_tensor)
    for path, leaf in leaves:
        yield prefix + jax.tree_util.keystr(path), leaf
