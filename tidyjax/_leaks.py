"""Leak checks: ``check_leaks`` (a context manager and decorator), `LeakReport` and
``leak_error``, also as a collective over the processes of a ``jax.distributed`` job.

A check counts two kinds of leak, apart: **Tensors** made inside and alive at the end (tracked),
and **plain jax.Arrays** made inside and alive at the end that tidyjax does not track
(untracked: the outputs of ``jnp``, a raw ``jax.jit``, NNX or Equinox): the arrays `ArrayMark`
finds, less those tidyjax records, those allowed, and those with no user frame in their creation
traceback (JAX's and installed libraries' own: compiled-function constants, caches, PRNG
internals; a cache filled on a first call *from the user's line* is what a warm-up step removes).

Two kinds of survivor are listed apart and not counted unless asked (`_Split`): a Tensor or
array whose only references are local names of the frame running a ``with check_leaks()``
block (the last ``labels`` of ``for x, labels in batches:``; module globals at top level), the
block's result as a decorated function's return value is; and an array only NumPy views hold
(``np.asarray`` of a CPU array shares its buffer). Both are decided by reference counts: the
references the frame's names and the views' buffer exports account for must be all there are.
"""

from __future__ import annotations

import collections
import copy
import functools
import gc
import inspect
import sys
import weakref
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import jax

from . import _html, _registry
from ._census import (
    UNTRACKED,
    SiteStat,
    TensorRecord,
    books,
    buffer_of,
    held,
    live_holders,
    one_per_buffer,
    released,
    site_table,
    statistics,
    tensor_records,
    untracked_record,
)
from ._decorating import decorate
from ._errors import LeakError, TidyjaxTypeError, check_count, check_flag, check_seconds
from ._format import count, esc, fmt_bytes
from ._jaxdoors import base_array
from ._newarrays import ArrayMark
from ._processes import DEFAULT_TIMEOUT, gather
from ._sites import LIBRARY_FOLDERS, Entry, Site, creation_site, is_user_file
from ._tensor import tensor_ids
from ._trees import gather_values

__all__ = ["UNTRACKED", "LeakReport", "check_leaks", "leak_error", "plain_leaks"]

F = TypeVar("F", bound=Callable[..., Any])


class LeakReport:
    """What a leak check found alive: Tensors (tracked) and plain jax.Arrays (untracked),
    each grouped by creation site: by the whole chain of user frames from the checked block's
    line inward (``site.chain``, shown ``train.py:9 in main → model.py:3 in step``), as
    ``tracemalloc`` groups by traceback, each chain with its own count, bytes and shapes.

    ``records`` holds both; a plain array's record has id 0 and scope ``"<untracked>"``.
    ``len(report)`` counts both, ``groups`` the Tensors' sites, ``array_groups`` the plain
    arrays' sites (`SiteStat` rows; a site's ``detail`` the library frame that made them).

    Listed apart, not in ``records`` and not counted: ``bound_locals``, the Tensors and arrays
    whose only references are local names of the function running the ``with check_leaks()``
    block (``bound_in``; module globals at top level), as ``(names, record)`` pairs (``names``
    like ``"labels"``, or ``"x, y"`` for one array under two names); ``numpy_views``, the
    arrays that only NumPy views of their buffer keep alive (``np.asarray(x)`` on CPU).
    """

    __slots__ = ("bound_in", "bound_locals", "numpy_views", "records", "where")

    def __init__(
        self,
        records: Iterable[TensorRecord],
        where: str = "check_leaks()",
        *,
        bound_locals: Iterable[tuple[str, TensorRecord]] = (),
        numpy_views: Iterable[TensorRecord] = (),
        bound_in: str = "",
    ) -> None:
        self.records = tuple(records)
        self.where = where
        self.bound_locals = tuple(bound_locals)
        self.numpy_views = tuple(numpy_views)
        self.bound_in = bound_in

    @property
    def tensors(self) -> tuple[TensorRecord, ...]:
        """The leaked Tensors' records (tracked)."""
        return tuple(r for r in self.records if r.scope != UNTRACKED)

    @property
    def arrays(self) -> tuple[TensorRecord, ...]:
        """The leaked plain jax.Arrays' records (untracked)."""
        return tuple(r for r in self.records if r.scope == UNTRACKED)

    @property
    def groups(self) -> list[SiteStat]:
        """The leaked Tensors by creation site, largest first."""
        return statistics(self.tensors)

    @property
    def array_groups(self) -> list[SiteStat]:
        """The leaked plain arrays by creation site, largest first."""
        return statistics(self.arrays)

    @property
    def num_bytes(self) -> int:
        """The bytes of everything leaked, each buffer once."""
        return _bytes(self.tensors) + _bytes(self.arrays)

    def __len__(self) -> int:
        return len(self.records)

    def _headline(self) -> str:
        tensors, arrays = self.tensors, self.arrays
        parts = []
        if tensors or not arrays:
            parts.append(f"{count(len(tensors), 'tensor')} ({fmt_bytes(_bytes(tensors))})")
        if arrays:
            parts.append(f"{count(len(arrays), 'untracked array')} ({fmt_bytes(_bytes(arrays))})")
        verb = "is" if len(self.records) == 1 else "are"
        return f"{' and '.join(parts)} created inside {self.where} {verb} still alive"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(str(self))

    def __repr__(self) -> str:
        apart = ""
        if self.bound_locals:
            apart += f", bound_locals={[names for names, _ in self.bound_locals]!r}"
        if self.numpy_views:
            apart += f", numpy_views={len(self.numpy_views)}"
        return (
            f"<LeakReport {self.where}: {count(len(self), 'leak')} "
            f"({fmt_bytes(self.num_bytes)}){apart}>"
        )

    @_html.never_raises
    def _repr_html_(self) -> str:
        apart = [_html.line(_html.dim(text)) for text in _apart_lines(self)]
        if not self.records:
            return _html.box(f"<b>{esc(f'no leaks after {self.where}')}</b>", *apart)
        return _html.box(
            _html.bad(f"leak: {self._headline()}"),
            site_table(self.groups + self.array_groups),
            _html.line(_html.dim(_advice(self))),
            *apart,
        )

    def __str__(self) -> str:
        if not self.records:
            none = f"no leaks: no Tensor or jax array created inside {self.where} is still alive."
            return "\n".join([none, *_apart_lines(self)])
        lines = [self._headline() + ":"]
        lines += [f"  {g}" for g in self.groups + self.array_groups]
        lines.append(_advice(self))
        return "\n".join(lines + _apart_lines(self))


#: The most names a report prints for the values bound to local names.
NAMES_SHOWN = 8


def _what(records: Iterable[TensorRecord]) -> str:
    """``1 tensor and 2 untracked arrays (1.2 KiB)``."""
    records = list(records)
    tensors = [r for r in records if r.scope != UNTRACKED]
    arrays = [r for r in records if r.scope == UNTRACKED]
    parts = [count(len(tensors), "tensor")] * bool(tensors)
    parts += [count(len(arrays), "untracked array")] * bool(arrays)
    return f"{' and '.join(parts)} ({fmt_bytes(_bytes(tensors) + _bytes(arrays))})"


def _apart_lines(report: LeakReport) -> list[str]:
    """The report's lines for what it lists apart and does not count."""
    lines = []
    if report.bound_locals:
        shown = [f"`{names}` {r.dtype}{list(r.shape)}"
                 for names, r in report.bound_locals[:NAMES_SHOWN]]  # fmt: skip
        if len(report.bound_locals) > NAMES_SHOWN:
            shown.append(f"and {len(report.bound_locals) - NAMES_SHOWN} more")
        where = f" in `{report.bound_in}`" if report.bound_in else ""
        lines.append(
            f"Not counted: {_what(r for _, r in report.bound_locals)} still bound to "
            f"{', '.join(shown)}{where}: the block's result, as a decorated function's return "
            "value is (check_leaks(count_locals=True) counts it)."
        )
    if report.numpy_views:
        lines.append(
            f"Not counted: {_what(report.numpy_views)} held by NumPy views: on CPU "
            "np.asarray(x) shares x's buffer and keeps x alive (on a GPU it copies). Keep a copy "
            "instead: np.array(x), float(x) or x.item() "
            "(check_leaks(count_numpy_views=True) counts them):"
        )
        lines += [f"  {g}" for g in statistics(report.numpy_views)]
    return lines


def _bytes(records: Iterable[TensorRecord]) -> int:
    return sum({buffer_of(r): r.bytes for r in records}.values())


def _advice(report: LeakReport) -> str:
    """What frees each kind of leak found: a scope frees Tensors, never a plain jax array."""
    parts = []
    if report.tensors:
        parts.append("Tensors: dispose them, or create them inside a tidy scope that frees them.")
    if report.arrays:
        parts.append(
            "Plain jax arrays (a tidy scope frees no plain jax array): drop the references "
            "to them, or make them tracked, and a tidy scope frees them: compute them with "
            "tidyjax (a function lifted with tidyjax.lift, tidyjax.numpy) or hand them over "
            "with tidyjax.adopt(x) (tidyjax.tensors(x) only borrows a caller's array)."
        )
    parts.append(
        "Or allow them (check_leaks(allowance=N), checker.allow(x)). A cache filled on a first "
        "call: run one step before the check."
    )
    return " ".join(parts)


def leak_error(
    leaked: list[TensorRecord],
    allowance: int,
    where: str,
    all_processes: bool = False,
    timeout: float = DEFAULT_TIMEOUT,
    checker: check_leaks | None = None,
) -> LeakError | None:
    """The `LeakError` to raise if more than ``allowance`` Tensors and plain arrays
    (together) leaked, or None: returned, so that the frame raising it is the caller's (IPython
    shows the innermost frame of a traceback). The report lists what ``checker`` set apart."""
    apart = checker._apart if checker is not None else None
    report = LeakReport(leaked, where, **(apart.report_fields() if apart is not None else {}))
    if checker is not None:
        checker.report = report
    if not all_processes:
        return LeakError(str(report), report) if len(leaked) > allowance else None
    payload = {"tensors": [r.to_json() for r in leaked]}
    per_process = [
        [TensorRecord.from_json(d) for d in got["tensors"]]
        for got in gather("check_leaks", payload, timeout)
    ]
    failing = [(i, recs) for i, recs in enumerate(per_process) if len(recs) > allowance]
    if not failing:
        return None
    names = ", ".join(str(i) for i, _ in failing)
    processes = "process" if len(failing) == 1 else "processes"
    report = LeakReport([r for _, recs in failing for r in recs], f"{where} on {processes} {names}")
    if checker is not None:
        checker.report = report
    message = "\n".join(str(LeakReport(recs, f"{where} on process {i}")) for i, recs in failing)
    return LeakError(message, report)


def _made_by_user(arr: Any) -> bool:
    """Whether ``arr``'s creation traceback has a user frame (not an array JAX, tidyjax or an
    installed library made for itself)."""
    site = creation_site(arr)
    return site is not None and is_user_file(site.file)


def plain_leaks(
    mark: ArrayMark,
    allowed: dict[int, Any] | None = None,
    site_of: Callable[[Any], Site | None] = creation_site,
    apart: _Split | None = None,
) -> list[TensorRecord]:
    """A record of each plain jax.Array made since ``mark``, alive, with a user frame in its
    traceback (see the module docstring), that no live Tensor's buffer and no array in
    ``allowed`` (ids to weak references) holds, largest first: one per device buffer (the
    oldest object over a buffer stands for it). Plain: not recorded by tidyjax, or a Tensor's
    array that outlived every Tensor on its buffer (``t.array`` kept, ``t`` dropped).
    ``site_of``: how a site is found (`check_leaks` names the outermost user frame inside it).
    ``apart``: what to list apart instead (local names, NumPy views): its lists get them; a
    buffer that one counted array holds counts, whatever else holds it.
    """
    # ``found`` is the only list holding them: `_Split.divide` counts references
    found = [a for a in _candidates(mark, allowed) if _made_by_user(a)]
    if not found:
        return []
    views: list[Any] = []
    bound: list[tuple[Any, str]] = []
    if apart is not None and (apart.frame is not None or apart.views):
        found, bound, views = apart.divide(found)
        if found and (bound or views):  # a view JAX cached on one of them is not a holder
            cached = _cached_views(found, [a for a, _ in bound] + views)
            if cached:
                found = [a for a in found if id(a) not in cached]
    taken = [r() for r in (allowed or {}).values()] + _held_arrays() + _older(mark)
    kept = one_per_buffer(found, taken, wait=True)
    if apart is not None and (views or bound):
        taken += found
        apart.numpy_views += _by_size(
            untracked_record(a, site_of) for a in one_per_buffer(views, taken, wait=True)
        )
        taken += views
        names = {id(a): n for a, n in bound}
        apart.bound_locals += [
            (names[id(a)], untracked_record(a, site_of))
            for a in one_per_buffer([a for a, _ in bound], taken, wait=True)
        ]  # fmt: skip
    return _by_size(untracked_record(a, site_of) for a in kept)


def _cached_views(found: list[Any], owners: list[Any]) -> set[int]:
    """The ids of the arrays in ``found`` that are the view JAX caches on one of ``owners``.

    Reading a CPU array's value (``print``, an f-string, ``repr``, ``tolist``) caches on it a
    view of its first shard (``addressable_data(0)``): a new ``jax.Array`` over its buffer,
    alive as long as it is, held by one reference the collector does not see. It holds nothing
    its owner does not, so it goes where its owner goes (listed apart), not counted. Only an
    array with that one reference besides ``found``'s, over an owner's first shard, is asked
    about (another such object, a raw ``device_put`` to where the owner is, makes the owner
    cache its view then: no memory). ``found`` must be the caller's only list holding them.
    """
    control = [object()]
    own = sys.getrefcount(control[0])  # its list's reference and the call's argument
    single = [found[i] for i in range(len(found)) if sys.getrefcount(found[i]) - own == 1]
    if not single:
        return set()
    first: dict[Any, Any] = {}  # the address of each owner's first shard -> the owner
    for owner in owners:
        key = _registry.same_buffer_key(owner)
        if key:
            first.setdefault(key[0], owner)
    out = set()
    for a in single:
        key = _registry.same_buffer_key(a)
        owner = first.get(key[0]) if key and len(key) == 1 else None
        if owner is not None and owner.addressable_data(0) is a:
            out.add(id(a))
    return out


def _by_size(records: Iterable[TensorRecord]) -> list[TensorRecord]:
    return sorted(records, key=lambda r: -r.bytes)


def _buffer_export_type() -> type | None:
    """The type of the object CPython keeps for a buffer export (``managedbuffer``: what a
    ``memoryview`` references, and so NumPy's ``np.asarray`` of a CPU jax.Array, whose
    ``.base`` is such a memoryview): it holds one reference to the exporting object."""
    kinds = {type(o) for o in gc.get_referents(memoryview(bytearray(1)))}
    return next((k for k in kinds if k.__name__ == "managedbuffer"), None)


_BUFFER_EXPORT = _buffer_export_type()


class _Split:
    """What a leak check lists apart instead of counting, and what it found.

    ``frame``: the frame running the ``with check_leaks()`` block, or None (the decorator, the
    pytest plugin, ``count_locals=True``): an object only its local names reference (a
    module's or ``exec``'s namespace at top level) goes to ``bound_locals``. ``views``: an
    array only buffer exports reference (NumPy views; a memoryview) goes to ``numpy_views``.

    Exact by reference counts: `divide` counts every reference to each object besides its own
    list's, and sets an object apart only when the frame's names (and the exports, each one
    reference) are all of them. A name holding a list of arrays holds the list, not an array:
    each array in it counts as before; so does one a closure's cell holds (a cell variable is
    not a local name here).
    """

    __slots__ = ("bound_in", "bound_locals", "frame", "numpy_views", "views")

    def __init__(self, frame: Any, views: bool) -> None:
        self.frame = frame
        self.views = views
        self.bound_in = frame.f_code.co_name if frame is not None else ""
        self.bound_locals: list[tuple[str, TensorRecord]] = []
        self.numpy_views: list[TensorRecord] = []

    def report_fields(self) -> dict[str, Any]:
        return {"bound_locals": self.bound_locals, "numpy_views": self.numpy_views,
                "bound_in": self.bound_in}  # fmt: skip

    def divide(
        self, objs: list[Any], views: bool = True
    ) -> tuple[list[Any], list[tuple[Any, str]], list[Any]]:
        """``objs`` as (counted, bound to local names with the names, held by views only;
        ``views=False``: none, as for Tensors, which no buffer export holds). ``objs`` must
        be the only thing of the caller's holding them."""
        names = _local_names(self.frame, objs) if self.frame is not None else {}
        control = [object()]
        own = sys.getrefcount(control[0])  # its list's reference and the call's argument
        others = [sys.getrefcount(objs[i]) - own for i in range(len(objs))]
        bound_refs = [len(names.get(id(o), ())) for o in objs]
        exports: dict[int, int] = {}
        if self.views and views:
            unexplained = [o for o, n, b in zip(objs, others, bound_refs, strict=True) if n > b]
            if unexplained:
                exports = _exports(unexplained)
            del unexplained
        counted: list[Any] = []
        bound: list[tuple[Any, str]] = []
        viewed: list[Any] = []
        for o, n, b in zip(objs, others, bound_refs, strict=True):
            e = exports.get(id(o), 0)
            if e and n == b + e:
                viewed.append(o)
            elif b and n == b:
                bound.append((o, ", ".join(names[id(o)])))
            else:
                counted.append(o)
        return counted, bound, viewed


def _local_names(frame: Any, objs: list[Any]) -> dict[int, list[str]]:
    """The names of ``frame``'s local variables bound to each of ``objs``, by id: in a function
    its fast locals, not its cell variables (a closure may see those); at top level the
    namespace (a module's globals)."""
    code = frame.f_code
    optimized = bool(code.co_flags & inspect.CO_OPTIMIZED)
    fast = set(code.co_varnames) - set(code.co_cellvars) if optimized else None
    wanted = {id(o) for o in objs}
    names: dict[int, list[str]] = {}
    namespace = frame.f_locals
    try:
        for name, value in namespace.items():
            if id(value) in wanted and (fast is None or name in fast):
                names.setdefault(id(value), []).append(name)
        value = None
    finally:
        if optimized and type(namespace) is dict:
            # Before Python 3.13 ``f_locals`` of a function is a snapshot dict the frame keeps,
            # refreshed by each reader (``locals()``, a trace function): left full, it would
            # hold these values after the function rebinds its names, and add references.
            namespace.clear()
        namespace = None
    return names


def _exports(objs: list[Any]) -> dict[int, int]:
    """How many buffer exports (NumPy views, memoryviews) reference each of ``objs``, by id:
    one walk of the objects the garbage collector tracks (``gc.get_referrers`` compares each
    reference with every one of ``objs``: for many, a scan of the exports is faster)."""
    if _BUFFER_EXPORT is None:  # not CPython's: nothing is taken for a view
        return {}
    wanted = {id(o) for o in objs}
    found: dict[int, int] = collections.Counter()
    holders = gc.get_referrers(*objs) if len(objs) <= 16 else gc.get_objects()
    for holder in holders:
        if type(holder) is _BUFFER_EXPORT:
            for o in gc.get_referents(holder):
                if id(o) in wanted:
                    found[id(o)] += 1
    return dict(found)


def _older(mark: ArrayMark) -> list[Any]:
    """The arrays alive now that were alive at ``mark``: a new object over one of their
    buffers (a shard view, a raw ``device_put`` to where it is) holds no new memory."""
    new = {id(a) for a in mark.new()}
    platforms = {d.platform for d in jax.local_devices()}
    return [a for p in platforms for a in jax.live_arrays(p) if id(a) not in new]


def _held_arrays() -> list[Any]:
    """The array objects over the buffers that live Tensors hold."""
    recs, _ = books(leaves=True)
    return [a for r in recs if held(r) for a in r.arrays()]


def _candidates(mark: ArrayMark, allowed: dict[int, Any] | None) -> list[Any]:
    """The arrays made since ``mark`` that no live Tensor holds and ``allowed`` lacks, oldest
    first: those tidyjax does not record, and recorded ones no Tensor holds any more (a
    caller's array is one even while a Tensor holds some of its shards: `one_per_buffer` drops
    it when they are all of them)."""
    allowed = allowed or {}
    out = []
    for a in reversed(mark.new()):
        ref = allowed.get(id(a))
        if ref is not None and ref() is a:
            continue
        rec = _registry.peek(a)
        if rec is None or released(rec) or (rec.dead is None and not held(rec)):
            out.append(a)
    if out:  # jax.live_arrays lists a recorded typed key as its words: that is the Tensor
        words = {id(w) for k in _held_arrays() if (w := base_array(k)) is not k}
        out = [a for a in out if id(a) not in words]
    return out


class check_leaks:  # noqa: N801 - used like a function, as a context manager and decorator
    """Fail when Tensors or plain jax.Arrays created inside are still alive at the end.

    Forms:

    ```python
    with tidyjax.check_leaks() as checker:
        out = step()
        checker.allow(out)              # alive on purpose

    @tidyjax.check_leaks(allowance=2)   # each call checked; its return value is allowed
    def step(): ...
    ```

    Plain jax.Arrays (``jnp``, raw ``jax.jit``, NNX, Equinox outputs) count by default, apart
    from Tensors; only those whose creation traceback has a user frame (JAX's and libraries'
    own caches have none). Run one step before the check so that caches a first call fills
    are full. ``arrays=False`` counts Tensors only.

    Listed apart and not counted: in the ``with`` form, a Tensor or array whose only
    references are local names of the function running the block (the last ``labels`` of
    ``for x, labels in batches:``; at top level, the module's globals): the block's result,
    as the decorator's return value is (``report.bound_locals``). One a list, a dict, a closure
    or anything else also holds counts. And an array only NumPy views hold
    (``losses.append(np.asarray(loss))`` on CPU: ``report.numpy_views``).

    Args:
        allowance: how many leaks (Tensors and plain arrays together) to tolerate.
        allow_returned: in the decorator form, Tensors and arrays in the return value are not
            leaks.
        allow_kept: Tensors marked with [`tidyjax.keep`][tidyjax.keep] are not leaks.
        arrays: also count plain jax.Arrays (default True).
        count_locals: also count what only the block's local names hold (the ``with`` form).
        count_numpy_views: also count the arrays only NumPy views hold.
        all_processes: a collective over every process of a ``jax.distributed`` job (each
            must run the check): a leak beyond ``allowance`` on any process fails every
            process, and the report names the process.
        timeout: seconds ``all_processes`` waits for every process.

    Raises:
        LeakError: with a [`LeakReport`][tidyjax.LeakReport] (``err.report``) grouped by the
            chain of your frames that led to each leak, from the outermost line of your code
            inside the checked block inward (``site.chain``: ``a.py:54 in f → b.py:154 in g``;
            a model called from two lines leaks in two groups, one line reached through two
            callers too). One device buffer counts once, whatever array objects view it.
            Not raised when the block itself raised. Tensors and arrays made by other threads
            meanwhile count too: check code that runs alone.
        CollectiveError: with ``all_processes``, a process did not check within ``timeout``.
    """

    def __init__(
        self,
        *,
        allowance: int = 0,
        allow_returned: bool = True,
        allow_kept: bool = False,
        arrays: bool = True,
        count_locals: bool = False,
        count_numpy_views: bool = False,
        all_processes: bool = False,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        self.allow_returned = check_flag(allow_returned, "allow_returned", "check_leaks()")
        self.allow_kept = check_flag(allow_kept, "allow_kept", "check_leaks()")
        self.arrays = check_flag(arrays, "arrays", "check_leaks()")
        self.count_locals = check_flag(count_locals, "count_locals", "check_leaks()")
        self.count_numpy_views = check_flag(count_numpy_views, "count_numpy_views", "check_leaks()")
        self.all_processes = check_flag(all_processes, "all_processes", "check_leaks()")
        self.allowance = check_count(allowance, "allowance", "check_leaks()")
        self.timeout = check_seconds(timeout, "timeout", "check_leaks()")
        self._start: int | None = None
        self._mark: ArrayMark | None = None
        self._allowed: set[int] = set()
        self._allowed_arrays: dict[int, Any] = {}
        self._entry: Entry | None = None
        self._frame: Any = None  # the frame running the block, held while it runs
        self._apart: _Split | None = None
        self.report: LeakReport | None = None

    def allow(self, *values: Any) -> None:
        """Do not count the Tensors and jax.Arrays in ``values`` (any pytrees, objects holding
        them) as leaks."""
        tensors: list[Any] = []
        raws: list[Any] = []
        gather_values(values, tensors, raws)
        self._allowed.update(t.id for t in tensors)
        for arr in raws:
            for a in (arr, base_array(arr)):  # jax.live_arrays lists a typed key's words
                self._allowed_arrays[id(a)] = weakref.ref(a)

    def __enter__(self) -> check_leaks:
        self._allowed = set()
        self._allowed_arrays = {}
        self.report = None
        self._mark = ArrayMark() if self.arrays else None
        frame = sys._getframe(1)  # the frame the block runs in
        self._entry = Entry(frame)  # (see sites)
        # tidyjax's own frames (the decorator's wrapper, the pytest plugin) have no user names
        user = not frame.f_code.co_filename.startswith(LIBRARY_FOLDERS)
        self._frame = frame if user and not self.count_locals else None
        self._start = next(tensor_ids)
        return self

    def __exit__(self, exc_type: Any, *exc: object) -> None:
        __tracebackhide__ = True
        try:
            if exc_type is None and (error := self._error()) is not None:
                raise error
        finally:
            self._frame = None  # held no longer: it holds this checker if a name does

    def leaked(self) -> list[TensorRecord]:
        """The Tensors, then the plain arrays, made since entering that are alive and not
        allowed (with none made, one walk of the newest arrays and no garbage collection).
        Each record's ``site`` is the outermost user frame inside the checked block, its
        ``site.stack`` the user frames further in. What is listed apart (local names of the
        block's frame while it runs, NumPy views) is not returned: the next report lists it.
        """
        if self._start is None:
            raise TidyjaxTypeError("check_leaks: enter it (with-block) before checking.")
        apart = self._apart = _Split(self._frame, views=not self.count_numpy_views)
        made_tensors = next(tensor_ids) > self._start + 1  # ids only grow: none made, none leaked
        mark = self._mark
        if not made_tensors and (mark is None or not _candidates(mark, self._allowed_arrays)):
            return []
        gc.collect()
        entry = self._entry
        site_of = creation_site if entry is None else functools.partial(entry.site, cache={})
        out: list[TensorRecord] = []
        if made_tensors:
            holding = self._holding()
            out = [
                r
                for r in tensor_records(self._start, site_of=site_of, holding=holding)
                if r.id not in self._allowed and not (self.allow_kept and r.kept)
            ]
            ids = {r.id for r in out} if apart.frame is not None else set()
            tensors = [t for _, ts in holding for t in ts if t.id in ids]
            del holding  # ``tensors`` the only list holding them: `_Split.divide` counts
            if tensors:
                _, bound, _ = apart.divide(tensors, views=False)
                del tensors
                names = {t.id: n for t, n in bound}
                del bound
                apart.bound_locals += [(names[r.id], r) for r in out if r.id in names]
                out = [r for r in out if r.id not in names]
        if mark is not None:
            out += plain_leaks(mark, self._allowed_arrays, site_of, apart)
        return out

    def _holding(self) -> list[tuple[Any, list[Any]]]:
        """The live records with their Tensors, less those sharing an allocation with an
        allowed array (``allow(raw)`` of a raw alias allows the Tensors over its buffer)."""
        holding = live_holders()
        allowed = [a for r in self._allowed_arrays.values() if (a := r()) is not None]
        keys: set[tuple[int, int]] = set()
        for a in allowed:
            keys.update(_registry.shards(a, wait=False) or ())
        if not keys:
            return holding
        return [
            (rec, ts)
            for rec, ts in holding
            if not any(
                keys.intersection(_registry.shards(a, wait=False) or ()) for a in rec.arrays()
            )
        ]

    def check(self) -> None:
        """Raise `LeakError` if more than ``allowance`` Tensors and arrays leaked."""
        __tracebackhide__ = True
        if (error := self._error()) is not None:
            raise error

    def _error(self) -> LeakError | None:
        return leak_error(self.leaked(), self.allowance, "check_leaks()", self.all_processes,
                          self.timeout, self)  # fmt: skip

    def __call__(self, fn: F) -> F:
        # each call a fresh checker with these settings (``__enter__`` resets all the rest)
        allow = check_leaks.allow if self.allow_returned else None
        return decorate(fn, lambda: copy.copy(self), "@check_leaks", allow)
