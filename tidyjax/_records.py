"""Records of live Tensors: `TensorRecord`, creation sites, ``live_tensors()``, holders;
records of the arrays tidyjax does not own (``<untracked>``) and of those watched objects hold.

Creation sites cost nothing per op: JAX records a creation traceback on every array (on by
default), and tidyjax reads it only when a report asks, keeping the first frame outside tidyjax
and JAX. Records are small immutable value objects, in the manner of ``tracemalloc``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import operator
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from . import _html, _registry
from ._arrays import failed, local_nbytes
from ._errors import check_flag
from ._format import count, describe, esc, fmt_bytes
from ._jaxdoors import base_array
from ._memory import books, buffer_id, find_untracked, released, watched_ids
from ._registry import KEPT
from ._sites import LIBRARY_FOLDERS, Site, creation_site
from ._tensor import Tensor
from ._variable import Variable
from ._watch import watched

__all__ = [
    "LIBRARY_FOLDERS",
    "WATCHED",
    "Site",
    "TensorRecord",
    "TensorRecordList",
    "UNTRACKED",
    "ESCAPED",
    "creation_site",
    "holders",
    "live_holders",
    "live_tensors",
    "summary",
    "tensor_records",
    "untracked_record",
    "untracked_records",
]


@dataclasses.dataclass(frozen=True, slots=True, repr=False)
class TensorRecord:
    """One live Tensor, as [`live_tensors`][tidyjax.live_tensors] reports it.

    Attributes:
        id: the Tensor's id.
        shape: its shape.
        dtype: its dtype, as a string.
        bytes: its buffer's bytes (0 for one whose allocation failed: it holds nothing).
        devices: the devices holding it, as strings.
        scope: the scope path that will free it (``"train/step"``), ``""`` outside every scope,
            ``"<kept>"`` when kept, ``"<variable>"`` for a Variable, ``"<watched>"`` for an
            array that only a watched object holds, ``"<untracked>"`` for a jax array tidyjax
            does not own and no watched object holds, ``"<escaped>"`` for a buffer tidyjax owns
            that only raw jax arrays hold (none of those is a Tensor: ``id`` is 0).
        site: a [`Site`][tidyjax.Site] or None.
        kept: whether it was kept.
        variable: whether it is a Variable.
        name: its path in an object registered with [`tidyjax.watch`][tidyjax.watch]
            (``"model.layers[0].kernel"``), else None.
    """

    id: int
    shape: tuple[int, ...]
    dtype: str
    bytes: int
    devices: tuple[str, ...]
    scope: str
    site: Site | None
    kept: bool
    variable: bool
    _buffer: int  # tensors with equal values share one device buffer
    name: str | None = None

    def __repr__(self) -> str:
        return (
            f"TensorRecord(id={self.id}, {self.dtype}{list(self.shape)}, {fmt_bytes(self.bytes)}, "
            f"scope={self.scope!r}, site={str(self.site) if self.site else None!r}"
            f"{f', name={self.name!r}' if self.name else ''}"
            f"{', kept' if self.kept else ''}{', variable' if self.variable else ''})"
        )

    def to_json(self) -> dict[str, Any]:
        site = self.site
        return {
            "id": self.id,
            "shape": list(self.shape),
            "dtype": self.dtype,
            "bytes": self.bytes,
            "devices": list(self.devices),
            "scope": self.scope,
            "site": None if site is None else _site_json(site),
            "kept": self.kept,
            "variable": self.variable,
            "buffer": self._buffer,
            "name": self.name,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> TensorRecord:
        s = d.get("site")
        index = operator.index  # a count given as anything but an int is a malformed file
        return cls(
            id=index(d["id"]), shape=tuple(index(n) for n in d["shape"]), dtype=d["dtype"],
            bytes=index(d["bytes"]), devices=tuple(d["devices"]), scope=d["scope"],
            kept=d["kept"], variable=d["variable"], _buffer=index(d.get("buffer", d["id"])),
            site=None if s is None else Site(
                s["file"], s["line"], s["function"],
                stack=tuple(Site(f["file"], f["line"], f["function"]) for f in s.get("stack", ())),
            ),
            name=d.get("name"),
        )  # fmt: skip


def _site_json(site: Site) -> dict[str, Any]:
    out: dict[str, Any] = {"file": site.file, "line": site.line, "function": site.function}
    if site.stack:  # a leak site's user frames further in
        out["stack"] = [{"file": f.file, "line": f.line, "function": f.function}
                        for f in site.stack]  # fmt: skip
    return out


def holders(recs: list[_registry.Buffer]) -> list[tuple[_registry.Buffer, list[Tensor]]]:
    """Each record with the live Tensors holding it.

    The registry counts holders but keeps no reference to them (that would cost on every op),
    so a report finds them among the objects the garbage collector tracks: the Tensors whose
    array is one of the records' arrays, in the collector's order (``gc.get_referrers`` of the
    arrays finds the same, but looks through all the arrays for each reference on the heap).
    One pass over the heap.
    """
    by_rec: dict[int, tuple[_registry.Buffer, list[Tensor]]] = {id(r): (r, []) for r in recs}
    arrays = [a for r in recs for a in r.arrays()]  # held: their ids stay theirs meanwhile
    if arrays:
        ids = set(map(id, arrays))
        for obj in gc.get_objects():
            if isinstance(obj, Tensor):
                rec = obj._rec
                if rec is not None and id(rec) in by_rec and id(obj._array) in ids:
                    by_rec[id(rec)][1].append(obj)
    return list(by_rec.values())


def live_holders() -> list[tuple[_registry.Buffer, list[Tensor]]]:
    """Every live record with the live Tensors holding it (the records the reports count:
    ``_memory.books``)."""
    recs, deleted = books()
    return holders(recs + deleted)


class _Memo:
    """What one report computes once per distinct object rather than once per record: the
    name of each dtype, the devices of each sharding. Keyed by the object's id; the object is
    held meanwhile, so no id is taken by another."""

    __slots__ = ("dtypes", "shardings")

    def __init__(self) -> None:
        self.dtypes: dict[int, tuple[Any, str]] = {}
        self.shardings: dict[int, tuple[Any, tuple[str, ...]]] = {}

    def dtype(self, dtype: Any) -> str:
        got = self.dtypes.get(id(dtype))
        if got is None:
            got = self.dtypes[id(dtype)] = (dtype, str(dtype))
        return got[1]

    def devices(self, sharding: Any) -> tuple[str, ...]:
        """From the sharding: ``devices()`` raises for a deleted array, the sharding never does."""
        got = self.shardings.get(id(sharding))
        if got is None:
            names = tuple(sorted(str(d) for d in sharding.device_set))
            got = self.shardings[id(sharding)] = (sharding, names)
        return got[1]


def _record(
    t: Tensor,
    rec: _registry.Buffer,
    names: dict[int, str],
    memo: _Memo,
    site_of: Callable[[Any], Site | None] = creation_site,
) -> TensorRecord:
    arr = t._array
    owner = rec.scope
    variable = isinstance(t, Variable)
    if variable:
        path = "<variable>"
    elif owner is KEPT:
        path = "<kept>"
    else:
        path = getattr(owner, "path", "")
    return TensorRecord(
        id=t._id,
        shape=tuple(arr.shape),
        dtype=memo.dtype(arr.dtype),
        # a failed allocation holds nothing, nor a buffer deleted behind tidyjax's back
        bytes=0 if failed(arr) or _deleted(arr) else rec.size(),
        devices=memo.devices(arr.sharding),
        scope=path,
        site=site_of(arr),
        kept=owner is KEPT,
        variable=variable,
        _buffer=buffer_id(rec),  # records over one buffer (a group) share it
        name=names.get(id(arr)) if names else None,
    )


def _deleted(arr: Any) -> bool:
    is_deleted = getattr(getattr(arr, "_base_array", arr), "is_deleted", None)
    return bool(is_deleted()) if is_deleted is not None else False


def _watched_record(arr: Any, name: str) -> TensorRecord:
    """An array only a watched object holds: no Tensor, so id 0 and scope ``<watched>``."""
    return TensorRecord(
        id=0,
        shape=tuple(arr.shape),
        dtype=str(arr.dtype),
        bytes=0 if failed(arr) else local_nbytes(getattr(arr, "_base_array", arr)),
        devices=tuple(sorted(str(d) for d in arr.devices())),
        scope="<watched>",
        site=creation_site(arr),
        kept=False,
        variable=False,
        _buffer=id(arr),
        name=name,
    )


def untracked_record(
    arr: Any, site_of: Callable[[Any], Site | None] = creation_site
) -> TensorRecord:
    """A jax array tidyjax does not own: no Tensor, so id 0 and scope ``<untracked>``.
    ``site_of``: how its site is found (a leak check names the outermost user frame)."""
    return TensorRecord(
        id=0,
        shape=tuple(arr.shape),
        dtype=str(arr.dtype),
        bytes=0 if failed(arr) else local_nbytes(base_array(arr)),
        devices=tuple(sorted(str(d) for d in arr.sharding.device_set)),
        scope=UNTRACKED,
        site=site_of(arr),
        kept=False,
        variable=False,
        _buffer=id(arr),  # find_untracked lists each untracked buffer once
    )


def untracked_records(
    watched_ids: set[int] | None = None, recs: list[_registry.Buffer] | None = None
) -> list[TensorRecord]:
    """A record of each jax array alive that tidyjax neither tracks nor watches (the arrays
    ``memory().untracked_arrays`` counts), largest first. ``watched_ids``: the watched arrays'
    ids (``_memory.watched_ids``); ``recs``: the live records (``_memory.books()[0]``); each
    by default found now."""
    if recs is None:
        recs, _ = books()
    out = [untracked_record(a) for a in find_untracked(recs, watched_ids)]
    out.sort(key=lambda r: -r.bytes)
    return out


WATCHED = "<watched>"
UNTRACKED = "<untracked>"
#: The scope of a record of a buffer tidyjax owns that no live Tensor holds, only raw jax
#: arrays (an escaped ``t.array``, a raw alias a scope handed out): tidyjax's bytes, freed by
#: its scope or by ``dispose`` of the raw array.
ESCAPED = "<escaped>"
#: The kinds of record that hold no Tensor, each counted apart, with its noun.
_RAW_NOUNS = {ESCAPED: "escaped array", WATCHED: "watched array", UNTRACKED: "untracked array"}


def summary(records: Iterable[TensorRecord]) -> str:
    """The one headline of a list of records: the Tensors with their bytes, then the buffers of
    tidyjax's that only raw arrays hold, the arrays only watched objects hold, and the untracked
    arrays, each with theirs (``3 live tensors, 12 B; 2 watched arrays, 4.0 MiB; 1 untracked
    array, 8 B``), each buffer once. A part other than the Tensors' is left out when there is
    none of it."""
    n: dict[str, int] = {}
    by_buffer: dict[str, dict[int, int]] = {}
    for r in records:
        kind = r.scope if r.scope in _RAW_NOUNS else ""
        n[kind] = n.get(kind, 0) + 1
        by_buffer.setdefault(kind, {})[r._buffer] = r.bytes
    parts = []
    for kind, noun in (("", "live tensor"), *_RAW_NOUNS.items()):
        if n.get(kind) or not kind:
            nbytes = sum(by_buffer.get(kind, {}).values())
            parts.append(f"{count(n.get(kind, 0), noun)}, {fmt_bytes(nbytes)}")
    return "; ".join(parts)


class TensorRecordList(list[TensorRecord]):
    """A list of `TensorRecord` that shows itself as a table in Jupyter."""

    def _repr_html_(self) -> str:
        return _records_html(self)


def live_tensors(*, untracked: bool = False) -> TensorRecordList:
    """A record of every live Tensor and Variable, oldest first (a list).

    With objects registered by [`tidyjax.watch`][tidyjax.watch], the arrays they hold come first (id
    0, scope ``"<watched>"``, ``name`` their path), and a Tensor inside one carries its ``name``.
    The reports count those apart from the Tensors:
    ``3 live tensors, 12 B; 2 watched arrays, 4.0 MiB``. So are the buffers tidyjax owns that no
    live Tensor holds any more, only raw jax arrays (``t.array`` kept after ``t`` went, a raw
    alias a scope handed out): a record each after the Tensors (id 0, scope ``"<escaped>"``),
    counted in ``memory().num_bytes`` as tidyjax's.

    Args:
        untracked: also a record of each jax array alive that tidyjax does not own and no
            watched object holds (id 0, scope ``"<untracked>"``, ``site`` the user's line that
            made it), after the Tensors, largest first: the arrays ``memory()`` counts as
            untracked. Costs a scan of ``jax.live_arrays()``.

    Example:
        ```python
        for r in tidyjax.live_tensors(untracked=True):
            if r.scope == "<untracked>":
                print(r.site, r.bytes)
        ```
    """
    untracked = check_flag(untracked, "untracked", "live_tensors()")
    names: dict[int, str] = {}
    raw: list[TensorRecord] = []
    found_all = watched()
    for found in found_all.values():
        for path, arr in found:
            if id(arr) not in names:
                names[id(arr)] = path
                rec = _registry.lookup(arr)
                if rec is None or released(rec):  # no Tensor's: the watched object's
                    raw.append(_watched_record(arr, path))
    with _collector_paused():
        recs, deleted = books()
        holding = holders(recs + deleted)
        out = tensor_records(names=names, holding=holding)
        out += _escaped_records(holding, names)
        if untracked:
            out += untracked_records(watched_ids(found_all), recs)
    return TensorRecordList(raw + out)


def _escaped_records(
    holding: list[tuple[_registry.Buffer, list[Tensor]]], names: dict[int, str]
) -> list[TensorRecord]:
    """A record of each live buffer tidyjax owns that no live Tensor holds (see `ESCAPED`),
    each buffer once; its site the line that made the buffer."""
    held = {buffer_id(rec) for rec, ts in holding if ts or rec.n > 0}
    out: list[TensorRecord] = []
    for rec, _ in holding:
        key = buffer_id(rec)
        arr = rec.array()
        if key in held or rec.dead is not None or arr is None:
            continue
        held.add(key)  # once per buffer
        out.append(
            TensorRecord(
                id=0,
                shape=tuple(arr.shape),
                dtype=str(arr.dtype),
                bytes=0 if failed(arr) or _deleted(arr) else rec.size(),
                devices=tuple(sorted(str(d) for d in arr.sharding.device_set)),
                scope=ESCAPED,
                site=creation_site(arr),
                kept=rec.scope is KEPT,
                variable=False,
                _buffer=key,
                name=names.get(id(arr)) if names else None,
            )
        )
    return out


def tensor_records(
    since: int = 0,
    names: dict[int, str] | None = None,
    holding: list[tuple[_registry.Buffer, list[Tensor]]] | None = None,
    site_of: Callable[[Any], Site | None] = creation_site,
) -> list[TensorRecord]:
    """A record of each live Tensor and Variable whose id is above ``since``, oldest first, as
    `live_tensors` makes them; only those are built, so a leak check's report costs its
    new Tensors. ``names``: the watched arrays' paths by the arrays' ids; ``holding``:
    `live_holders`; each by default found now. ``site_of``: how a site is found (a leak
    check names the outermost user frame inside its block).
    """
    if names is None:
        names = {}
        for found in watched().values():
            for path, arr in found:
                names.setdefault(id(arr), path)
    memo = _Memo()
    with _collector_paused():
        out = [
            _record(t, rec, names, memo, site_of)
            for rec, ts in (live_holders() if holding is None else holding)
            for t in ts
            if t._id > since
        ]
    out.sort(key=lambda r: r.id)
    return out


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """The garbage collector paused while a report finds the holders and builds its records:
    they make no cycles, and so many new objects would start collections, of the whole heap
    among them."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@_html.never_raises
def _records_html(records: list[TensorRecord]) -> str:
    head = f"<b>{esc(summary(records))}</b>"
    if not records:
        return _html.box(head)
    named = any(r.name for r in records)
    rows = [
        (r.id, esc(describe(r)), esc(fmt_bytes(r.bytes)),
         esc(", ".join(r.devices)), esc(r.scope), esc(r.site) if r.site else _html.dim("unknown"),
         *([esc(r.name or "")] if named else []))
        for r in records
    ]  # fmt: skip
    header = [
        "id",
        "tensor",
        "bytes",
        "devices",
        "scope",
        "created at",
        *(["name"] if named else []),
    ]
    return _html.box(head, _html.table(header, rows, numeric={0, 2}))
