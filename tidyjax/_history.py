"""What only IPython's output history holds: the reachability walk behind ``%%tidy``, auto mode
and ``%tidyjax free``, the placeholders that replace freed outputs, and the deletion of raw
arrays the history alone holds.

The history is read from a shell object's attributes (``user_ns``, ``user_ns_hidden``,
``displayhook``, ``InteractiveTB``, ``SyntaxTB``, ``last_execution_result``,
``history_manager``), never from IPython itself: this module does not import IPython, and a
test drives it with a stand-in shell.

How "only the history holds it" is decided: a walk of ``gc.get_referents`` from IPython's
history (bounded: it skips modules, module namespaces, classes, the user namespace and IPython's
own objects) finds the objects below it. An object is held from outside when its reference count
exceeds the references the walk counted from the history and from the other objects below it
(the test CPython's cycle collector makes); what such an object reaches is held too. What the
history reaches and nothing else holds is freed. So a value any user name reaches is kept
whatever the path (even through a NumPy object array, which the collector cannot see into), and
an array that a jit cache, a module or a C++ object also holds is never deleted.
"""

from __future__ import annotations

import gc
import re
import sys
import types
from collections.abc import Iterable
from typing import Any, NoReturn

import jax
import numpy as np

from . import _registry
from ._arrays import ArrayImpl, describe, local_nbytes
from ._errors import DisposedError, Reason
from ._tensor import Tensor

__all__ = ["Decision", "FreedOutput", "History", "Seen", "delete_unshared", "freed_reason"]

# IPython's names for its history and its own helpers: never a user's value.
_HISTORY = re.compile(r"^(_+|_\d+|_i+|_i\d+|_ih|_oh|_dh|In|Out|exit|quit|get_ipython)$")
# History names that are IPython's books, not outputs: ``Out`` is walked whole, the rest hold
# strings, paths and functions.
_BOOKS = frozenset({"In", "Out", "_ih", "_oh", "_dh", "exit", "quit", "get_ipython"})
# The most objects a walk of the history visits: beyond it, what is not yet counted counts as
# held (nothing is freed wrongly; some may be freed at a later cell). Keeps a cell's end fast
# when the history shows very large structures.
_MAX_NODES = 1_000_000


# -- what only IPython's history holds --------------------------------------------------------


def _referents(obj: Any) -> list[Any]:
    """The objects ``obj`` holds a reference to, one entry per reference.

    NumPy arrays are not tracked by the garbage collector, so their references are added here:
    a view holds its base, an object array its elements.
    """
    refs = gc.get_referents(obj)
    if isinstance(obj, np.ndarray):
        if obj.base is not None:
            refs.append(obj.base)
        elif obj.dtype == object:
            refs.extend(obj.ravel(order="K").tolist())
    return refs


def _walkable(obj: Any) -> bool:
    """Whether ``obj`` can hold a reference to a Tensor or an array (directly or not)."""
    if isinstance(obj, np.ndarray):
        return obj.base is not None or obj.dtype == object
    return gc.is_tracked(obj) and not isinstance(obj, (types.ModuleType, type))


def _module_dicts() -> set[int]:
    """Ids of every module's namespace: a walk stops there (functions lead to them)."""
    return {id(d) for m in list(sys.modules.values()) if (d := getattr(m, "__dict__", None))}


def _owners(shell: Any) -> tuple[tuple[Any, tuple[str, ...]], ...]:
    """The objects whose attributes are history (read from instance dicts: only references
    that really exist count)."""
    return (
        (shell.displayhook, ("_", "__", "___")),
        (shell.InteractiveTB, ("tb",)),
        (shell.SyntaxTB, ("tb",)),
        (sys, ("last_value", "last_traceback", "last_exc")),
    )


def _slots(shell: Any) -> list[tuple[Any, str, Any]]:
    """Every single reference the history holds, as ``(where, name, value)``: ``where`` is
    ``"Out"`` (``name`` the entry's key), a namespace dict (``_``, ``__``, ``___``, ``_N``), an
    attribute's owner (the display hook, a traceback printer, ``sys``)."""
    ns, hidden = shell.user_ns, shell.user_ns_hidden
    slots: list[tuple[Any, str, Any]] = []
    out = ns.get("Out")
    if isinstance(out, dict):
        slots.extend(("Out", n, v) for n, v in out.items())
    for space in (ns, hidden):
        slots.extend(
            (space, k, v) for k, v in space.items() if _HISTORY.match(k) and k not in _BOOKS
        )
    for owner, names in _owners(shell):
        attrs = getattr(owner, "__dict__", {})
        slots.extend((owner, n, attrs[n]) for n in names if n in attrs)
    return slots


class Seen:
    """What the history showed before a cell ran: ids of its values and ``Out``'s keys (ids
    only: holding the values would count as holding them). A value that is in the history
    after the cell and was nowhere in it before is the cell's own (a value an earlier cell
    showed only moves from ``_`` to ``__``)."""

    def __init__(self, shell: Any) -> None:
        slots = _slots(shell)
        self.ids = {id(v) for _, _, v in slots}
        self.keys = {n for where, n, _ in slots if where == "Out"}

    def own(self, shell: Any) -> tuple[set[int], set[Any]]:
        """The ids of the values the cell added to the history, and its ``Out`` keys."""
        slots = _slots(shell)
        ids = {id(v) for _, _, v in slots if id(v) not in self.ids}
        keys = {n for where, n, v in slots if where == "Out" and id(v) in ids}
        return ids, keys


class History:
    """IPython's own references to values: the ones that must not keep a value alive.

    ``roots`` are objects that are all history (``Out``, the cells' ``ExecutionResult``s): every
    reference they hold counts. ``values`` are single references from a place that also holds
    other things: one per ``_``/``__``/``___``/``_N`` entry of the user and hidden namespaces, per
    display-hook attribute, per ``sys.last_*`` and per stored traceback.

    ``part``: count only part of the history, as ``%%tidy`` does: ``(ids, keys)``, the ids of the
    values it may free and the ``Out`` keys that are its to free (its own cell's and earlier
    ``%%tidy`` cells'). Then ``Out`` is no root: only its entries under ``keys`` count, ``_N``
    only for those keys, ``sys.last_*`` and the tracebacks only when the cell made them (their
    ids are in ``ids``), ``_``/``__``/``___`` when they show one of those values. A reference the
    walk does not count is a holder: what another cell's output also shows is kept.
    """

    def __init__(
        self, shell: Any, results: Iterable[Any], part: tuple[set[int], set[Any]] | None = None
    ) -> None:
        ns, hidden = shell.user_ns, shell.user_ns_hidden
        out = ns.get("Out")
        roots: dict[int, Any] = {}
        tops = (out, shell.last_execution_result) if part is None else ()
        for root in (*tops, *results):
            if root is not None:
                roots[id(root)] = root  # once each: a root counted twice would count refs twice
        self.roots = list(roots.values())
        self.values: list[Any] = []
        if part is None:
            self.values.extend(v for where, _, v in _slots(shell) if where != "Out")
        else:
            ids, keys = part
            if isinstance(out, dict):
                ids = ids | {id(out[n]) for n in keys if n in out}
            for where, name, value in _slots(shell):
                if where == "Out":
                    wanted = name in keys
                elif isinstance(where, dict) and name[1:].isdigit():
                    wanted = int(name[1:]) in keys
                else:
                    wanted = id(value) in ids
                if wanted:
                    self.values.append(value)
        self.skip = {
            id(ns),
            id(hidden),
            id(shell),
            id(shell.displayhook),
            id(shell.history_manager),
            id(ns.get("In")),
            id(out),
            *roots,
        }


def _freeable(obj: Any) -> bool:
    """Whether ``obj`` is something a cell's end frees when only the history holds it: a raw
    array tidyjax does not record, or a Tensor outside every scope, neither kept nor a
    Variable. (The cell's own Tensors are decided with the cell's scope.)"""
    if type(obj) is ArrayImpl:
        return _registry.lookup(obj) is None and not obj.is_deleted()
    if isinstance(obj, Tensor):
        rec = obj._rec
        return (
            rec is not None
            and rec is not _registry.UNTRACKED
            and rec.dead is None
            and rec.scope is None
            and getattr(obj, "_var", None) is None
            and not getattr(obj, "_kept", False)
        )
    return False


class Decision:
    """What only IPython's history holds, and the graph below the history that showed it."""

    def __init__(
        self,
        shell: Any,
        created: dict[int, Tensor],
        results: Iterable[Any],
        inert: dict[Any, int],
        part: tuple[set[int], set[Any]] | None = None,
    ) -> None:
        """``created``: the cell's own Tensors (held only by this dict), by id. ``inert``:
        ``Out`` entries (key -> id of the value) known to hold nothing to free and nothing held
        elsewhere, which are not walked again; updated here. ``part``: the part of the history
        to count (see ``History``); None: all of it."""
        gc.collect(1)  # young unreachable cycles would count as holders
        history = History(shell, results, part)
        self.shell = shell
        self.roots = history.roots
        self.nodes: dict[int, Any] = {}
        self.expanded: set[int] = set()
        out = shell.user_ns.get("Out")
        out = out if isinstance(out, dict) else {}
        frozen = {id(v) for n, v in out.items() if inert.get(n) == id(v)}
        inner = self._walk(history, history.skip | _module_dicts(), created, frozen)
        held = self._held_outside(inner, created)
        self.free = {
            key
            for key, obj in self.nodes.items()
            if key not in held and (key in created or _freeable(obj))
        }
        walked = out.keys() if part is None else part[1]  # the other entries: as they were
        for n, v in out.items():
            if n in walked:
                if id(v) in frozen or self._inert(id(v), held, created):
                    inert[n] = id(v)
                else:
                    inert.pop(n, None)
        for n in [n for n in inert if n not in out]:
            del inert[n]

    def _inert(self, key: int, held: set[int], created: dict[int, Tensor]) -> bool:
        """Whether the node ``key`` and all below it were walked, are held by the history alone
        and hold nothing to free: nothing there can change but through the history itself."""
        nodes, expanded = self.nodes, self.expanded
        seen: set[int] = set()
        stack = [key]
        while stack:
            k = stack.pop()
            if k in seen:
                continue
            seen.add(k)
            if k not in nodes:
                continue  # not walkable: holds nothing
            obj = nodes[k]
            if k in held or k not in expanded or k in created or _freeable(obj):
                return False
            stack.extend(id(r) for r in _referents(obj))
        return True

    def _walk(
        self, history: History, skip: set[int], created: dict[int, Tensor], frozen: set[int]
    ) -> dict[int, int]:
        """Fill ``self.nodes`` with what the history reaches; return, per node, how many
        references to it the history and the expanded nodes hold.

        A node is expanded (its referents walked) once every reference to it is counted. One
        that something else also holds is held, and so is all it reaches, so its insides need
        no walk: a large structure that a user name and ``Out`` both show costs one step.
        """
        nodes = self.nodes
        inner: dict[int, int] = {}
        dirty: set[int] = set()  # nodes counted again since they were last looked at

        def count(obj: Any, new: bool = True) -> None:
            key = id(obj)
            if key not in nodes:
                if not new or key in skip or len(nodes) >= _MAX_NODES or not _walkable(obj):
                    return
                nodes[key] = obj
            inner[key] = inner.get(key, 0) + 1
            dirty.add(key)

        _count_history(history, count)
        expanded = self.expanded
        dirty -= frozen  # counted, never walked: nothing below them to free
        while dirty:
            ready = self._all_counted(dirty - expanded, inner, created)
            dirty.clear()
            for key in ready:
                expanded.add(key)
                _expand(nodes[key], count)
            dirty -= frozen
        return inner

    def _all_counted(
        self, keys: set[int], inner: dict[int, int], created: dict[int, Tensor]
    ) -> list[int]:
        """The nodes among ``keys`` whose every reference is counted in ``inner``."""
        nodes = self.nodes
        probe: list[Any] = []  # one reference (this name): calibrates our own references
        nodes[id(probe)] = probe
        ours = -1
        ready = []
        for key in [id(probe), *keys]:
            obj = nodes[key]
            n = sys.getrefcount(obj)
            if ours < 0:
                ours = n - 1
            elif n - ours - (key in created) == inner[key]:
                ready.append(key)
        del nodes[id(probe)]
        return ready

    def _held_outside(self, inner: dict[int, int], created: dict[int, Tensor]) -> set[int]:
        """Ids of the nodes that something outside the walked graph refers to, and of all the
        nodes those reach: the references counted fall short of the reference count."""
        nodes = self.nodes
        probe: list[Any] = []  # one known reference (this name): calibrates our own references
        nodes[id(probe)] = probe
        surplus: dict[int, int] = {}
        for key in list(nodes):
            obj = nodes[key]
            surplus[key] = sys.getrefcount(obj) - inner.get(key, 0) - (key in created)
        del obj
        ours = surplus.pop(id(probe)) - 1
        del nodes[id(probe)]
        held = {key for key, n in surplus.items() if n != ours}  # fewer refs: play safe too
        stack = [nodes[k] for k in held]
        while stack:
            for ref in _referents(stack.pop()):
                key = id(ref)
                if key in nodes and key not in held:
                    held.add(key)
                    stack.append(ref)
        return held

    def labels(self, targets: set[int]) -> dict[int, str]:
        """For each id in ``targets`` the history entry that showed it, as the user would
        write it: ``Out[3]`` first, else a name (``__``), else the stored traceback."""
        found: dict[int, str] = {}
        if not targets:
            return found
        seen: set[int] = set()

        def mark(value: Any, label: str) -> None:
            stack = [value]
            while stack:
                obj = stack.pop()
                key = id(obj)
                if key in seen:
                    continue
                seen.add(key)
                if key in targets:
                    found.setdefault(key, label)
                if key in self.expanded:
                    stack.extend(_referents(obj))

        slots = sorted(_slots(self.shell), key=lambda s: s[0] != "Out")
        for where, name, value in slots:
            if where == "Out":
                mark(value, f"Out[{name}]")
            elif isinstance(where, dict):
                mark(value, name)
            else:
                mark(value, "the stored traceback")
            seen.clear()  # another entry may reach what this one reached first
            if len(found) == len(targets):
                break
        for root in self.roots:
            for ref in _referents(root):
                mark(ref, "the output history")
        return found

    def drop_history_of(self, freed: set[int], who: str) -> None:
        """Replace every history entry that reaches a deleted array (``Out[n]``, ``_``,
        ``_N``, a result) by a placeholder, so that showing it again never touches the array.
        ``who``: what freed it (``%%tidy at the end of In[3]``), for the placeholder's error."""
        if not freed:
            return
        memo: dict[int, bool] = {}
        placeholders: dict[int, FreedOutput] = {}
        shell = self.shell
        ns, hidden = shell.user_ns, shell.user_ns_hidden
        out = ns.get("Out")
        out = out if isinstance(out, dict) else {}
        named: dict[int, str] = {}  # a value's label: its Out entry, else its first name
        for where, name, value in _slots(shell):
            if where == "Out":
                named.setdefault(id(value), f"Out[{name}]")
        for where, name, value in _slots(shell):
            if isinstance(where, dict):
                named.setdefault(id(value), name)

        def stale(value: Any) -> bool:
            key = id(value)
            if key not in memo:
                memo[key] = self._reaches(value, freed)
                if memo[key]:
                    label = named.get(key, "an output")
                    placeholders[key] = FreedOutput(value, label, who)
            return memo[key]

        for n, value in list(out.items()):
            if stale(value):
                out[n] = placeholders[id(value)]
        for space in (ns, hidden):
            for name, value in list(space.items()):
                if _HISTORY.match(name) and name not in _BOOKS and stale(value):
                    space[name] = placeholders[id(value)]
        hook = shell.displayhook
        for name in ("_", "__", "___"):
            value = hook.__dict__.get(name)
            if value is not None and stale(value):
                setattr(hook, name, placeholders[id(value)])
        for root in self.roots:
            value = getattr(root, "result", None)
            if value is not None and stale(value):
                root.result = placeholders[id(value)]

    def _reaches(self, value: Any, freed: set[int]) -> bool:
        """Whether ``value`` reaches a freed array through the walked graph."""
        seen: set[int] = set()
        stack = [value]
        while stack:
            obj = stack.pop()
            key = id(obj)
            if key in freed:
                return True
            if key in seen or key not in self.expanded:
                continue  # what was never walked holds nothing freed
            seen.add(key)
            stack.extend(_referents(obj))
        return False


def _count_history(history: History, count: Any) -> None:
    """Count each reference the history holds (in a function of its own: no name of ours
    still refers to one afterwards)."""
    for root in history.roots:
        for ref in _referents(root):
            count(ref)
    for value in history.values:
        count(value)
    history.values.clear()  # our own references


def _expand(obj: Any, count: Any) -> None:
    """Count each reference ``obj`` holds. A traceback's frame links to its caller, up the
    running stack: that link is counted when the caller is in the graph, never followed."""
    frame = type(obj) is types.FrameType
    for ref in _referents(obj):
        count(ref, new=not (frame and type(ref) is types.FrameType))


_KEEP_SHOWN = (
    "To keep what a cell shows, assign it to a name in that cell (y = ..., then y as its last "
    "line){}; %%tidy frees only what %%tidy cells showed, auto mode and %tidyjax free what "
    "any cell showed."
)


def freed_reason(who: str, label: str | None) -> Reason:
    """Why a Tensor that only IPython's history held is disposed, and how to keep one.
    ``label``: the history entry that showed it (``Out[3]``), when known."""
    where = f" ({label})" if label else ""
    return Reason(
        f"it was freed by {who}, because only IPython's output history held it{where}",
        _KEEP_SHOWN.format(" or pass it to tidyjax.keep()"),
    )


class FreedOutput:
    """What stays in ``Out[n]`` and ``_`` in place of an output whose arrays tidyjax deleted.

    Showing it never raises; using it (an operator, a JAX function, an attribute, an index)
    raises a ``DisposedError`` that names the entry, what freed it and how to keep one.
    """

    __slots__ = ("label", "what", "who")

    def __init__(self, value: Any, label: str = "an output", who: str = "tidyjax") -> None:
        self.what = describe(value) if isinstance(value, jax.Array) else type(value).__name__
        self.label = label
        self.who = who

    def __repr__(self) -> str:
        return f"<{self.what}: jax arrays deleted by tidyjax, held only by the output history>"

    def _error(self) -> DisposedError:
        label = self.label
        if label.startswith("Out["):
            label += f" (_{label[4:-1]})"
        return DisposedError(
            f"{label} ({self.what}) was freed by {self.who}, because only IPython's output "
            f"history held its jax arrays: they are deleted and {self.label} is a placeholder. "
            + _KEEP_SHOWN.format("")
        )

    def _raise(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise self._error()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # protocol probes (_repr_html_, __array_priority__): absent
            raise AttributeError(name)
        raise self._error()

    __array__ = __getitem__ = __iter__ = __call__ = _raise
    __float__ = __int__ = __index__ = __complex__ = _raise
    __neg__ = __pos__ = __abs__ = __invert__ = _raise
    __lt__ = __le__ = __gt__ = __ge__ = _raise
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _raise
    __truediv__ = __rtruediv__ = __floordiv__ = __rfloordiv__ = __mod__ = __rmod__ = _raise
    __pow__ = __rpow__ = __matmul__ = __rmatmul__ = __divmod__ = __rdivmod__ = _raise
    __and__ = __rand__ = __or__ = __ror__ = __xor__ = __rxor__ = _raise
    __lshift__ = __rlshift__ = __rshift__ = __rrshift__ = _raise


def _flatten_freed(placeholder: FreedOutput) -> NoReturn:
    raise placeholder._error()


def _unflatten_freed(aux: Any, children: Any) -> FreedOutput:
    return FreedOutput(None)  # never reached: flattening one raises


# A JAX function given a placeholder flattens it (as a pytree) first: that raises its error.
jax.tree_util.register_pytree_node(FreedOutput, _flatten_freed, _unflatten_freed)


# -- deleting raw arrays ----------------------------------------------------------------------


def _live_arrays() -> list[Any]:
    return [
        a
        for platform in {d.platform for d in jax.local_devices()}
        for a in jax.live_arrays(platform)
        if not a.is_deleted()
    ]


def delete_unshared(arrays: list[Any]) -> tuple[set[int], int]:
    """Delete the arrays whose buffers no other array in use shares; return their ids and bytes.

    Another array object over the same buffer (a transfer to where it already is, a shard view,
    a tracked Tensor's array) would lose its data too, so those are left alone, as are arrays
    whose computation failed. A view that no Python object refers to (JAX's own, such as the
    one showing an array makes, held by the array it views) does not count.
    """
    doomed = {id(a) for a in arrays}
    ready = []
    for arr in arrays:
        try:
            arr.block_until_ready()
        except Exception:  # a failed computation: nothing of ours to free
            continue
        ready.append(arr)
    sharers: dict[Any, list[Any]] = {}
    for other in _live_arrays():
        if id(other) not in doomed:
            for address in _registry.same_buffer_key(other) or ():
                sharers.setdefault(address, []).append(other)
    other = None  # no reference of ours outside the lists `_in_use` is told about
    keys = {id(a): _registry.same_buffer_key(a) for a in ready}
    shared = {k: [o for p in key or () for o in sharers.get(p, ())] for k, key in keys.items()}
    views = {id(o): o for found in shared.values() for o in found}
    used = _in_use(views, mine=[sharers, *sharers.values(), shared, *shared.values()])
    del sharers, views
    deleted: set[int] = set()
    nbytes = 0
    for arr in ready:
        if keys[id(arr)] is None or any(used[id(v)] for v in shared[id(arr)]):
            continue
        nbytes += local_nbytes(arr)
        arr.delete()
        deleted.add(id(arr))
    return deleted, nbytes


def _in_use(views: dict[int, Any], mine: list[Any]) -> dict[int, bool]:
    """For each view (by id): whether tidyjax records it or a Python object refers to it."""
    if not views:
        return {}
    skip = {id(views), *(id(m) for m in mine)}
    used = {k: _registry.lookup(v) is not None for k, v in views.items()}
    for ref in gc.get_referrers(*views.values()):
        if id(ref) not in skip:
            for r in gc.get_referents(ref):
                if id(r) in used:
                    used[id(r)] = True
    return used
