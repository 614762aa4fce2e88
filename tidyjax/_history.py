"""What only IPython's output history holds: the reachability walk behind ``%%tidy``, auto mode
and ``%tidyjax free``, the placeholders that replace freed outputs, and the deletion of raw
arrays the history alone holds. The history is read from a shell's attributes, never from
IPython (not imported here: a test drives this module with a stand-in shell).

A walk of ``gc.get_referents`` from the history (skipping modules, module namespaces, classes,
the user namespace and IPython's own objects) finds the objects below it. One whose reference
count exceeds the references counted from the history and the other objects below it is held
from outside, and so is all it reaches; what the history reaches and nothing else holds is
freed. So a value any user name reaches is kept whatever the path (even through a NumPy object
array, which the cycle collector cannot see into), and an array that a jit cache, a module or a
C++ object also holds is never deleted.
"""

from __future__ import annotations

import gc
import re
import sys
import types
from collections.abc import Iterable, Iterator
from typing import Any, NoReturn

import jax
import numpy as np

from . import _registry
from ._arrays import ArrayImpl, describe, local_nbytes
from ._errors import DisposedError, Reason
from ._tensor import Tensor, record

__all__ = ["Decision", "FreedOutput", "Seen", "delete_unshared", "freed_reason", "held_only_by"]

# IPython's history names in a namespace (``_``, ``__``, ``_N``, ``_i``, ``_iN``): never a
# user's value. ``Out`` is walked whole; ``In``, ``_ih``, ``_oh``, ``_dh`` hold only IPython's
# books.
_HISTORY = re.compile(r"_+|_i+|_i?\d+")
# The most objects a walk of the history visits: beyond it, what is not yet counted counts as
# held (nothing is freed wrongly; some may be freed at a later cell). Keeps a cell's end fast
# when the history shows very large structures.
_MAX_NODES = 1_000_000

# ``%%tidy``'s part of the history: the ids of the values it may free, its ``Out`` keys.
Part = tuple[set[int], set[Any]]


def _referents(obj: Any) -> list[Any]:
    """The objects ``obj`` holds a reference to, one entry per reference; for a NumPy array
    (which the collector does not track) its base, or an object array's elements."""
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


def _slots(shell: Any) -> list[tuple[Any, str, Any]]:
    """Every single reference the history holds, as ``(where, name, value)``: ``where`` is
    ``"Out"`` (``name`` the entry's key), a namespace dict (``_``, ``__``, ``___``, ``_N``), an
    attribute's owner (the display hook, a traceback printer, ``sys``; read from its instance
    dict: only references that really exist count)."""
    out = shell.user_ns.get("Out")
    slots: list[tuple[Any, str, Any]] = []
    if isinstance(out, dict):
        slots += [("Out", n, v) for n, v in out.items()]
    for space in (shell.user_ns, shell.user_ns_hidden):
        slots += [(space, k, v) for k, v in space.items() if _HISTORY.fullmatch(k)]
    for owner, names in (
        (shell.displayhook, ("_", "__", "___")),
        (shell.InteractiveTB, ("tb",)),
        (shell.SyntaxTB, ("tb",)),
        (sys, ("last_value", "last_traceback", "last_exc")),
    ):
        attrs = getattr(owner, "__dict__", {})
        slots += [(owner, n, attrs[n]) for n in names if n in attrs]
    return slots


def _label(where: Any, name: Any) -> str:
    """A slot as the user would write it: ``Out[3]``, a name, else the stored traceback."""
    if where == "Out":
        return f"Out[{name}]"
    return name if isinstance(where, dict) else "the stored traceback"


class Seen:
    """What the history showed before a cell ran: ids of its values and ``Out``'s keys (ids
    only: holding the values would count as holding them). A value that is in the history
    after the cell and was nowhere in it before is the cell's own (a value an earlier cell
    showed only moves from ``_`` to ``__``)."""

    def __init__(self, shell: Any) -> None:
        self.ids = {id(v) for _, _, v in _slots(shell)}

    def own(self, shell: Any) -> Part:
        """The ids of the values the cell added to the history, and its ``Out`` keys."""
        slots = _slots(shell)
        ids = {id(v) for _, _, v in slots if id(v) not in self.ids}
        keys = {n for where, n, v in slots if where == "Out" and id(v) in ids}
        return ids, keys


def _history(
    shell: Any, results: Iterable[Any], part: Part | None
) -> tuple[list[Any], list[Any], set[int]]:
    """IPython's own references to values, which must not keep a value alive, as ``(roots,
    values, skip)``: ``roots`` are all history (``Out``, the cells' ``ExecutionResult``s), every
    reference they hold counted; ``values`` single references from a place that holds other
    things too (``_slots``); ``skip`` ids a walk never enters.

    ``part``: only ``%%tidy``'s part, ``(ids, keys)`` (see `Part`): then ``Out`` is no root, and
    only its entries under ``keys``, ``_N`` for those keys, and the other slots showing a value
    in ``ids`` count. A reference not counted is a holder: another cell's output is kept.
    """
    ns = shell.user_ns
    out = ns.get("Out")
    tops = (out, shell.last_execution_result) if part is None else ()
    # once each: a root counted twice would count its references twice
    roots = list({id(r): r for r in (*tops, *results) if r is not None}.values())
    values: list[Any] = []
    if part is None:
        values = [v for where, _, v in _slots(shell) if where != "Out"]
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
                values.append(value)
    hidden, hook, manager = shell.user_ns_hidden, shell.displayhook, shell.history_manager
    skip = {id(ns), id(hidden), id(shell), id(hook), id(manager), id(ns.get("In")), id(out)}
    skip |= {id(r) for r in roots} | _module_dicts()
    return roots, values, skip


def _module_dicts() -> set[int]:
    return {id(d) for m in list(sys.modules.values()) if (d := getattr(m, "__dict__", None))}


def _freeable(obj: Any) -> bool:
    """Whether ``obj`` is something a cell's end frees when only the history holds it: a raw
    array tidyjax does not record, or a Tensor outside every scope, neither kept nor a
    Variable. (The cell's own Tensors are decided with the cell's scope.)"""
    if type(obj) is ArrayImpl:
        return _registry.lookup(obj) is None and not obj.is_deleted()
    rec = record(obj) if isinstance(obj, Tensor) else None
    return (
        rec is not None
        and rec is not _registry.UNTRACKED
        and rec.dead is None
        and rec.scope is None
        and getattr(obj, "_var", None) is None
        and not getattr(obj, "_kept", False)
    )


class _Graph:
    """The objects below some roots (``nodes``, by id), walked with every reference counted
    exactly (see the module docstring); ``expanded``: the nodes whose referents were walked."""

    def __init__(self) -> None:
        self.nodes: dict[int, Any] = {}
        self.expanded: set[int] = set()
        self.roots: list[Any] = []

    def _below(self, value: Any) -> Iterator[Any]:
        """``value`` and every object the walked graph shows below it, once each."""
        seen: set[int] = set()
        stack = [value]
        while stack:
            obj = stack.pop()
            if id(obj) not in seen:
                seen.add(id(obj))
                yield obj
                if id(obj) in self.expanded:  # what was never walked holds nothing walked
                    stack.extend(_referents(obj))

    def _walk(
        self, history: tuple[list[Any], list[Any], set[int]], created: Any, frozen: set[int]
    ) -> dict[int, int]:
        """Fill ``self.nodes`` with what the history reaches; return, per node, how many
        references to it the history and the expanded nodes hold. A node is expanded (its
        referents walked) once every reference to it is counted: one held from elsewhere too
        needs no walk (a large structure that a user name also shows costs one step)."""
        nodes, expanded = self.nodes, self.expanded
        self.roots, values, skip = history
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

        for root in self.roots:
            _expand(root, count)
        while values:  # no name of ours refers to a value afterwards
            count(values.pop())
        while dirty := dirty - frozen:  # frozen: counted, never walked (nothing below to free)
            surplus = self._surplus(dirty - expanded, inner, created)
            dirty.clear()
            for key in [k for k, n in surplus.items() if n == 0]:  # every reference counted
                expanded.add(key)
                _expand(nodes[key], count)
        return inner

    def _surplus(self, keys: Iterable[int], inner: dict[int, int], created: Any) -> dict[int, int]:
        """Per node in ``keys``: its references beyond those counted in ``inner``, by
        ``created`` and by ourselves (calibrated on a probe that one name holds)."""
        nodes = self.nodes
        probe: list[Any] = []
        nodes[id(probe)] = probe
        refs: dict[int, int] = {}
        for key in [id(probe), *keys]:
            obj = nodes[key]
            refs[key] = sys.getrefcount(obj) - inner.get(key, 0) - (key in created)
        del obj, nodes[id(probe)]
        ours = refs.pop(id(probe)) - 1
        return {key: n - ours for key, n in refs.items()}

    def _held_outside(self, inner: dict[int, int], created: Any) -> set[int]:
        """Ids of the nodes that something outside the walked graph refers to (the references
        counted fall short of the reference count), and of all the nodes those reach."""
        nodes = self.nodes
        surplus = self._surplus(list(nodes), inner, created)
        held = {key for key, n in surplus.items() if n}  # fewer refs: play safe too
        stack = [nodes[k] for k in held]
        while stack:
            for ref in _referents(stack.pop()):
                if id(ref) in nodes and id(ref) not in held:
                    held.add(id(ref))
                    stack.append(ref)
        return held


def held_only_by(roots: list[Any]) -> dict[int, Any]:
    """The objects below ``roots`` (by id) that nothing else holds: what goes when the roots
    go (the finished frames of a failed call: its temporaries), found by the history's walk."""
    graph = _Graph()
    inner = graph._walk((roots, [], {id(r) for r in roots} | _module_dicts()), {}, set())
    held = graph._held_outside(inner, {})
    return {k: o for k, o in graph.nodes.items() if k not in held}


class Decision(_Graph):
    """What only IPython's history holds (``free``, ids of ``nodes``), and the graph below the
    history that showed it. ``created``: the cell's own Tensors (held only by this dict), by
    id. ``inert``: ``Out`` entries (key -> id of the value) known to hold nothing to free and
    nothing held elsewhere, not walked again; updated here. ``part``: see ``_history``."""

    def __init__(
        self,
        shell: Any,
        created: dict[int, Tensor],
        results: Iterable[Any],
        inert: dict[Any, int],
        part: Part | None = None,
    ) -> None:
        gc.collect(1)  # young unreachable cycles would count as holders
        super().__init__()
        self.shell = shell
        out = shell.user_ns.get("Out")
        out = out if isinstance(out, dict) else {}
        frozen = {id(v) for n, v in out.items() if inert.get(n) == id(v)}
        inner = self._walk(_history(shell, results, part), created, frozen)
        held = self._held_outside(inner, created)
        self.free = {
            key
            for key, obj in self.nodes.items()
            if key not in held and (key in created or _freeable(obj))
        }
        walked = out.keys() if part is None else part[1]  # the other entries: as they were
        for n in [n for n in inert if n not in out or n in walked]:
            del inert[n]
        for n, v in out.items():
            if n in walked and (id(v) in frozen or self._inert(v, held, created)):
                inert[n] = id(v)

    def _inert(self, value: Any, held: set[int], created: dict[int, Tensor]) -> bool:
        """Whether ``value`` and all below it were walked, are held by the history alone and
        hold nothing to free: nothing there can change but through the history itself."""
        nodes, expanded = self.nodes, self.expanded
        for obj in self._below(value):
            k = id(obj)
            if k in nodes and (k not in expanded or k in held or k in created or _freeable(obj)):
                return False
        return True

    def labels(self, targets: set[int]) -> dict[int, str]:
        """For each id in ``targets`` the history entry that showed it, as the user would
        write it: ``Out[3]`` first, else a name (``__``), else the stored traceback."""
        slots = sorted(_slots(self.shell), key=lambda s: s[0] != "Out")
        entries = [(_label(where, name), value) for where, name, value in slots]
        entries += [("the output history", ref) for r in self.roots for ref in _referents(r)]
        found: dict[int, str] = {}
        for label, value in entries:
            if len(found) == len(targets):
                break
            for obj in self._below(value):
                if id(obj) in targets:
                    found.setdefault(id(obj), label)
        return found

    def drop_history_of(self, freed: set[int], who: str) -> None:
        """Replace every history entry that reaches a deleted array (``Out[n]``, ``_``,
        ``_N``, a result) by a placeholder, so that showing it again never touches the array.
        ``who``: what freed it (``%%tidy at the end of In[3]``), for the placeholder's error."""
        if not freed:
            return
        hook = self.shell.displayhook
        slots = [s for s in _slots(self.shell) if s[0] in ("Out", hook) or isinstance(s[0], dict)]
        # a value's label: its Out entry, else its first name (the first written last wins)
        ordered = sorted(slots, key=lambda s: s[0] != "Out")
        named = {id(v): _label(w, n) for w, n, v in reversed(ordered) if w is not hook}
        slots += [(r, "result", r.result) for r in self.roots if hasattr(r, "result")]
        placeholders: dict[int, FreedOutput | None] = {}
        for where, name, value in slots:
            if value is None:
                continue
            if id(value) not in placeholders:
                stale = any(id(o) in freed for o in self._below(value))
                label = named.get(id(value), "an output")
                placeholders[id(value)] = FreedOutput(value, label, who) if stale else None
            if (placeholder := placeholders[id(value)]) is None:
                continue
            if where == "Out":
                self.shell.user_ns["Out"][name] = placeholder
            elif isinstance(where, dict):
                where[name] = placeholder
            else:
                setattr(where, name, placeholder)


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

    def _raise(self, *args: Any, **kwargs: Any) -> NoReturn:
        label = self.label
        if label.startswith("Out["):
            label += f" (_{label[4:-1]})"
        raise DisposedError(
            f"{label} ({self.what}) was freed by {self.who}, because only IPython's output "
            f"history held its jax arrays: they are deleted and {self.label} is a placeholder. "
            + _KEEP_SHOWN.format("")
        )

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # protocol probes (_repr_html_, __array_priority__): absent
            raise AttributeError(name)
        self._raise()

    __array__ = __getitem__ = __iter__ = __call__ = _raise
    __float__ = __int__ = __index__ = __complex__ = _raise
    __neg__ = __pos__ = __abs__ = __invert__ = _raise
    __lt__ = __le__ = __gt__ = __ge__ = _raise
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _raise
    __truediv__ = __rtruediv__ = __floordiv__ = __rfloordiv__ = __mod__ = __rmod__ = _raise
    __pow__ = __rpow__ = __matmul__ = __rmatmul__ = __divmod__ = __rdivmod__ = _raise
    __and__ = __rand__ = __or__ = __ror__ = __xor__ = __rxor__ = _raise
    __lshift__ = __rlshift__ = __rshift__ = __rrshift__ = _raise


# A JAX function given a placeholder flattens it (as a pytree) first: that raises its error.
jax.tree_util.register_pytree_node(FreedOutput, FreedOutput._raise, lambda *_: FreedOutput(None))


def delete_unshared(arrays: list[Any]) -> tuple[set[int], int]:
    """Delete the arrays whose buffers no other array in use shares; return their ids and bytes.

    Another array object over the same buffer (a transfer to where it already is, a shard view,
    a tracked Tensor's array) would lose its data too, so those are left alone, as are arrays
    whose computation failed; a view no Python object refers to (JAX's own) does not count."""
    ready = []
    for arr in arrays:
        try:
            arr.block_until_ready()
        except Exception:  # a failed computation: nothing of ours to free
            continue
        ready.append(arr)
    doomed = {id(a) for a in arrays}
    keys = {id(a): _registry.same_buffer_key(a) for a in ready}
    wanted = {address for key in keys.values() for address in key or ()}
    sharers: dict[Any, list[Any]] = {}  # address -> the other live arrays over it
    for platform in {d.platform for d in jax.local_devices()}:
        for other in jax.live_arrays(platform):
            if id(other) not in doomed and not other.is_deleted():
                for address in wanted.intersection(_registry.same_buffer_key(other) or ()):
                    sharers.setdefault(address, []).append(other)
    other = None  # no reference of ours outside the lists `_in_use` is told about
    busy = _in_use(sharers)
    deleted: set[int] = set()
    nbytes = 0
    for arr in ready:
        if keys[id(arr)] is not None and busy.isdisjoint(keys[id(arr)]):
            nbytes += local_nbytes(arr)
            arr.delete()
            deleted.add(id(arr))
    return deleted, nbytes


def _in_use(sharers: dict[Any, list[Any]]) -> set[Any]:
    """The addresses whose arrays tidyjax records or a Python object refers to."""
    views = {id(o): o for found in sharers.values() for o in found}
    if not views:
        return set()
    skip = {id(views), id(sharers), *map(id, sharers.values())}
    used = {k for k, v in views.items() if _registry.lookup(v) is not None}
    for ref in gc.get_referrers(*views.values()):
        if id(ref) not in skip:
            used.update(id(r) for r in gc.get_referents(ref) if id(r) in views)
    return {address for address, found in sharers.items() if any(id(o) in used for o in found)}
