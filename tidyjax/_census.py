"""The census: one count of what is alive, read by every report.

`census` takes it once per report: one `Row` per live device buffer, tidyjax's (held by
Tensors, or ``<escaped>``: only raw arrays hold it), watched (an object given to
``tidyjax.watch`` holds it, no Tensor does) or untracked (any other jax array), with its bytes
per device and its creation site. ``memory()`` sums the rows; ``live_tensors()``,
``snapshot()`` and the OOM report read the same rows, a `TensorRecord` per Tensor where they
name Tensors; ``check_leaks`` builds its records with the same functions from the arrays made
inside it; the timeline and the profile start from the same books (`books`, `holders`,
`released`) and follow the registry's events. `statistics` groups rows or records into
`SiteStat`s by any of their fields, in the manner of ``tracemalloc.Snapshot.statistics``, and
`site_table` shows them.

Creation sites cost nothing per op: JAX records a creation traceback on every array, and a
report reads it only when asked, keeping the first frame outside tidyjax and JAX.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import operator
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from itertools import groupby, islice
from typing import Any

import jax

from . import _html, _registry
from ._arrays import failed, local_nbytes, may_wait, shard_bytes
from ._errors import check_flag
from ._format import count, describe, esc, fmt_bytes, signed_bytes
from ._jaxdoors import base_array
from ._registry import KEPT
from ._sites import LIBRARY_FOLDERS, Site, creation_site, library_frame
from ._tensor import Tensor, held_array, record
from ._variable import Variable
from ._watch import watched as _watched

__all__ = [
    "ESCAPED",
    "LIBRARY_FOLDERS",
    "NOUNS",
    "UNTRACKED",
    "WATCHED",
    "Census",
    "Row",
    "Site",
    "SiteStat",
    "TensorRecord",
    "TensorRecordList",
    "WatchedUsage",
    "books",
    "buffer_id",
    "census",
    "collector_paused",
    "creation_site",
    "find_untracked",
    "group_spread",
    "held",
    "holder_lines",
    "holder_rows",
    "holders",
    "live_holders",
    "live_tensors",
    "one_per_buffer",
    "released",
    "scope_path",
    "site_key",
    "site_label",
    "site_table",
    "statistics",
    "summary",
    "summed",
    "top_per_device",
    "tensor_records",
    "untracked_record",
    "watched_ids",
]

#: The scope of a record that is no Tensor: an array only a watched object holds, a jax array
#: tidyjax does not own, a buffer tidyjax owns that only raw jax arrays hold (an escaped
#: ``t.array``, a raw alias a scope handed out: tidyjax's bytes, freed by its scope or by
#: ``dispose`` of the raw array).
WATCHED, UNTRACKED, ESCAPED = "<watched>", "<untracked>", "<escaped>"
#: A row's kind from a record's scope, and each kind's noun.
_KINDS = {WATCHED: "watched", UNTRACKED: "untracked", ESCAPED: "escaped"}
NOUNS = {
    "tensor": "tensor",
    "escaped": "escaped array",
    "watched": "watched array",
    "untracked": "untracked array",
}


# -- the books: which records count ------------------------------------------------------------


def books(leaves: bool = False) -> tuple[list[_registry.Buffer], list[_registry.Buffer]]:
    """The records every report counts: ``_registry.live()`` (the live records, and those
    deleted behind tidyjax's back that live Tensors still hold) less a caller's own array no
    live Tensor holds any more (`released`: the caller's plain array again) and a deleted
    buffer whose owner scope has exited (that scope disposed its Tensors). Records over one
    buffer are all listed (``_registry.distinct`` keeps one). ``leaves``: a leaf a batch holds
    is read as a ``_registry.Leaf`` instead of split out (for a report that only counts)."""
    alive, deleted = _registry.live(leaves)
    if any(released(r) for r in alive):
        alive = [r for r in alive if not released(r)]
    deleted = [r for r in deleted if not getattr(r.scope, "exited", False)]
    return alive, deleted


def released(rec: _registry.Buffer) -> bool:
    """Whether ``rec`` is a caller's own array (never deleted by tidyjax) that no live Tensor
    holds: the reports count it as the plain array it is; a Tensor on it makes it counted
    again. A buffer tidyjax owns stays tidyjax's while only raw arrays hold it."""
    return rec.n <= 0 and not rec.owned and rec.dead is None


def buffer_id(rec: _registry.Buffer) -> int:
    """One id per device buffer: a group of records over one buffer shares its group's."""
    group = _registry.grouped(rec)
    return id(group if group is not None else rec)


def holds(rec: _registry.Buffer) -> bool:
    """Whether ``rec`` still holds its buffer: not freed, an array object of it alive."""
    return rec.dead is None and rec.array() is not None


def same_buffer(arr: Any, records: Iterable[Any], wait: bool = False) -> Iterator[Any]:
    """The records whose arrays share an allocation with ``arr`` (none for None): reads
    ``arr``'s allocations (waiting for them with ``wait``), then those of each record whose
    buffer is ready (``_registry.shards``: a failed one's is never read)."""
    keys = _registry.shards(arr, wait=wait) if arr is not None else None
    if not keys:
        return
    for other in records:
        a = other.array()
        if a is not None and not keys.isdisjoint(_registry.shards(a, wait=False) or ()):
            yield other


def held(rec: _registry.Buffer) -> bool:
    """Whether a live Tensor holds ``rec``'s buffer (on ``rec`` or another record over it)."""
    group = _registry.grouped(rec) or ()
    return rec.n > 0 or any(r.n > 0 and r.dead is None for r in group)


def watched_ids(found: Mapping[str, list[tuple[str, Any]]]) -> set[int]:
    """The ids of the watched arrays, as ``jax.live_arrays()`` lists them (a typed PRNG key
    appears there as its array of words)."""
    return {id(base_array(a)) for pairs in found.values() for _, a in pairs}


def _spread(arr: Any) -> tuple[tuple[Any, int], ...]:
    """``arr``'s bytes on each local device (a replicated array counts on each)."""
    if failed(arr):
        return ()
    devices = arr.sharding.device_set
    if len(devices) == 1 and arr.is_fully_addressable:
        return ((next(iter(devices)), int(arr.nbytes)),)
    return tuple(shard_bytes(arr).items())


def _unshared_spreads(
    raw: list[Any], recs: list[_registry.Buffer]
) -> list[tuple[tuple[Any, int], ...]]:
    """Each of ``raw``'s bytes per device (`_spread`), less its shards that a recorded buffer
    holds whole (counted there: a replicated array one of whose shards is a Tensor's
    one-device buffer, released by a scope). A recorded shard that is only a slice of the
    array's (a sharded Tensor sliced from a caller's replicated array) leaves it counted whole.
    The records' allocations are read only when an array of ``raw`` spans several devices."""
    spreads = [_spread(a) for a in raw]
    wide = [i for i, sp in enumerate(spreads) if len(sp) > 1]
    if not wide:
        return spreads
    held: dict[tuple[int, int], int] = {}  # (device id, address) -> the bytes recorded there
    for rec in recs:
        arr = rec.array()
        if arr is None or arr.is_deleted() or failed(arr):
            continue
        on = {d.id: b for d, b in shard_bytes(arr).items()}
        for key in getattr(rec, "keys", None) or _registry.shards(arr, wait=False) or ():
            held[key] = max(held.get(key, 0), on.get(key[0], 0))
    for i in wide:
        on = {d.id: b for d, b in spreads[i]}
        covered = {
            dev
            for dev, addr in _registry.shards(raw[i], wait=False) or ()
            if dev in on and held.get((dev, addr), -1) >= on[dev]
        }
        if covered:
            spreads[i] = tuple((d, b) for d, b in spreads[i] if d.id not in covered)
    return spreads


def group_spread(group: list[_registry.Buffer]) -> dict[Any, int]:
    """The bytes on each device of a group's buffer (records sharing allocations), each
    allocation once: its records may each hold some of them (a one-device array, and the
    replicated array made from it whose shard on that device it is: eight allocations, not
    one), or a part of one (an allocation's bytes: the most a record holds of it). Reads the
    records' allocations (cached since they were grouped). A caller's array no live Tensor
    holds (`released`) is no part of it: its allocations no other record holds are its own,
    counted untracked (a caller's replicated array whose Tensor went, and a Tensor moved from
    it to fewer devices: the group holds the shards of those)."""
    sizes: dict[tuple[int, int], tuple[Any, int]] = {}  # (device id, address) -> device, bytes
    for rec in group:
        arr = rec.array()
        if rec.dead is not None or arr is None or released(rec) or arr.is_deleted() or failed(arr):
            continue
        on = {d.id: (d, b) for d, b in shard_bytes(arr).items()}
        keys = getattr(rec, "keys", None) or _registry.shards(arr, wait=False)
        for key in keys or [(i, -1) for i in on]:  # unknown allocations: one per device
            if key[0] in on and (key not in sizes or sizes[key][1] < on[key[0]][1]):
                sizes[key] = on[key[0]]
    return summed({d: b} for d, b in sizes.values())


def one_per_buffer(candidates: list[Any], taken: Iterable[Any], wait: bool = False) -> list[Any]:
    """``candidates`` less those whose every allocation one of ``taken`` or an earlier
    candidate holds, one per buffer: the arrays with the most shards first (a shard view, or a
    copy replicated over fewer devices that JAX made of the same shards, after its whole
    array), then in order.
    Addresses are read from ready buffers that did not fail (a deleted array has none): each
    candidate's waited for (`may_wait`: one still being computed may be a new object over a
    buffer of ``taken``, which is then ready too), each of ``taken`` only with ``wait``."""

    def key(a: Any, wait: bool = wait) -> Any:
        try:
            if a.is_deleted() or failed(a, wait=wait):
                return None
        except Exception:  # not an array with a buffer
            return None
        # (device, address) pairs: a host buffer's replicated copies on CPU share one address
        return _registry.shards(a, wait=wait)

    seen: set[Any] = set()  # the allocations seen

    def new(k: Any) -> bool:  # whether ``k`` holds an allocation not seen yet; seen from now
        if seen.issuperset(k):  # a view of what is seen: a shard, a subset of the devices
            return False
        seen.update(k)
        return True

    waits = wait or may_wait()
    keys = [(a, key(a, waits)) for a in candidates]
    for a in taken if any(k for _, k in keys) else ():
        if a is not None and (k := key(a)) is not None:
            new(k)
    return [a for a, k in sorted(keys, key=lambda p: -len(p[1] or ())) if k is None or new(k)]


def find_untracked(recs: list[_registry.Buffer], watched: set[int]) -> list[Any]:
    """The jax arrays alive in the process whose buffers tidyjax does not record, less those a
    watched object holds (``watched``: their ids), one per buffer: an object tidyjax never saw
    over a recorded buffer (a shard view, a raw ``device_put`` to the same device) is
    recognised by address. Arrays whose computation failed hold nothing."""
    candidates: list[Any] = []
    kept: list[Any] = []
    for platform in {d.platform for d in jax.local_devices()}:
        for arr in jax.live_arrays(platform):
            rec = _registry.peek(arr)
            if (rec is None or released(rec)) and not failed(arr):
                (kept if id(arr) in watched else candidates).append(arr)
    if not candidates:
        return []
    return one_per_buffer(candidates, [a for rec in recs for a in rec.arrays()] + kept)


@dataclasses.dataclass(frozen=True, slots=True)
class WatchedUsage:
    """What one watched object holds now, as every report counts it: its arrays (each buffer
    once; none whose computation failed), their bytes, and how many of them are Tensors'
    (tracked, so counted among the Tensors too) with their bytes."""

    name: str
    arrays: int
    bytes: int
    tensors: int = 0
    tensor_bytes: int = 0

    def __str__(self) -> str:
        text = f"{self.name!r}: {fmt_bytes(self.bytes)} in {count(self.arrays, 'array')}"
        if self.tensors:
            text += (
                f" ({count(self.tensors, 'tensor')}, {fmt_bytes(self.tensor_bytes)}, of them "
                "also counted above)"
            )
        return text


# -- the census: a row per live buffer ---------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Row:
    """One live device buffer. ``kind``: ``"tensor"`` (held by ``tensors`` live Tensors),
    ``"escaped"`` (tidyjax's, only raw arrays hold it), ``"watched"`` (``name`` the watched
    object's) or ``"untracked"``; ``array`` one array object over it; ``rec`` its record
    (tidyjax's kinds); ``spread`` its bytes per device; ``failed`` a buffer whose computation
    failed (it holds nothing)."""

    kind: str
    array: Any
    rec: _registry.Buffer | None = None
    name: str | None = None
    tensors: int = 0
    spread: tuple[tuple[Any, int], ...] = ()
    failed: bool = False

    @property
    def bytes(self) -> int:
        if self.failed:
            return 0
        return self.rec.size() if self.rec is not None else local_nbytes(base_array(self.array))

    @property
    def site(self) -> Site | None:
        return creation_site(self.array)

    @property
    def scope(self) -> str:
        return scope_path(self.rec.scope) if self.rec is not None else f"<{self.kind}>"

    @property
    def buffer(self) -> int:
        return buffer_id(self.rec) if self.rec is not None else id(self.array)

    @property
    def shape(self) -> str:
        return describe(self.array)


class Census:
    """One census of what is alive now (see the module docstring), made by `census`: its rows,
    with what the reports read beside them: the records counted (``recs``, each buffer's
    records; ``deleted``, deleted behind tidyjax's back), the watched objects (``found``,
    ``usage``), and whether ``jax.live_arrays()`` was scanned for the untracked arrays."""

    __slots__ = ("deleted", "found", "recs", "rows", "scanned", "usage")

    def __init__(self, *, untracked: bool = True, leaves: bool = False) -> None:
        self.recs, self.deleted = books(leaves)
        self.found = _watched()
        self.usage: list[WatchedUsage] = []
        self.scanned = untracked
        self.rows: list[Row] = [self._tracked(rec) for rec in _registry.distinct(self.recs)]
        self.rows += self._watched()
        if untracked:
            raw = find_untracked(self.recs, watched_ids(self.found))
            spreads = _unshared_spreads(raw, self.recs)
            rows = zip(raw, spreads, strict=True)
            self.rows += [Row("untracked", a, spread=sp) for a, sp in rows]

    @staticmethod
    def _tracked(rec: _registry.Buffer) -> Row:
        arr = rec.array()
        group = _registry.grouped(rec)
        n = sum(max(r.n, 0) for r in group or [rec])
        bad = failed(arr)
        spread = {} if bad else group_spread(group) if group else _registry.device_bytes(rec)
        kind = "tensor" if held(rec) else "escaped"
        return Row(kind, arr, rec, tensors=n, spread=tuple(spread.items()), failed=bad)

    def _watched(self) -> list[Row]:
        """Each watched name's `WatchedUsage` (its buffers once each) into ``usage``, the one
        count behind ``memory().watched`` and the reports; a row per watched array no Tensor
        holds, each buffer once over all the names (the first name that holds it claims it)."""
        out, claimed = [], set()
        for name, pairs in self.found.items():
            sizes: dict[int, tuple[int, bool]] = {}  # buffer -> its bytes, whether a Tensor's
            for _, arr in pairs:
                rec = _registry.lookup(arr)  # released: the caller's plain array again
                rec = None if rec is None or released(rec) else rec
                key = buffer_id(rec) if rec is not None else id(arr)
                if failed(arr) or key in sizes:  # never allocated; two objects over one buffer
                    continue
                base = base_array(arr)
                sizes[key] = (local_nbytes(base), rec is not None)
                if rec is None and id(base) not in claimed:
                    claimed.add(id(base))
                    out.append(Row("watched", arr, name=name, spread=_spread(base)))
            tracked = [b for b, tensor in sizes.values() if tensor]
            total = sum(b for b, _ in sizes.values())
            self.usage.append(WatchedUsage(name, len(sizes), total, len(tracked), sum(tracked)))
        return out

    def of(self, *kinds: str) -> list[Row]:
        return [r for r in self.rows if r.kind in kinds]

    def per_device(self, *kinds: str) -> dict[Any, int]:
        return summed(dict(row.spread) for row in self.of(*kinds))

    def records(self) -> TensorRecordList:
        """A `TensorRecord` per live Tensor (oldest first), after the watched arrays' and
        before the escaped and untracked buffers' (largest first)."""
        names: dict[int, str] = {}  # the watched arrays' paths (the first name of each)
        for path, arr in (p for pairs in self.found.values() for p in pairs):
            names.setdefault(id(arr), path)
        out = tensor_records(names=names, holding=holders(self.recs + self.deleted))
        head = [_raw_record(r, names) for r in self.of("watched")]
        tail = [_raw_record(r, names) for r in self.of("escaped")]
        untracked = [_raw_record(r, {}) for r in self.of("untracked")]
        untracked.sort(key=lambda r: -r.bytes)
        return TensorRecordList(head + out + tail + untracked)


census = Census


def summed(parts: Iterable[Mapping[Any, int]]) -> dict[Any, int]:
    """The mappings' values added key by key (bytes by device, by name)."""
    out: dict[Any, int] = {}
    for part in parts:
        for k, b in part.items():
            out[k] = out.get(k, 0) + b
    return out


def scope_path(owner: Any) -> str:
    """A record's owner as reports name it: its scope's path, ``"<kept>"`` or ``"<variable>"``
    (``""`` outside every scope)."""
    if owner is KEPT:
        return "<kept>"
    if owner is _registry.VARIABLE:
        return "<variable>"
    return getattr(owner, "path", "")


# -- statistics: rows grouped by site ----------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class SiteStat:
    """Live arrays of one kind made at one site, as every report groups them (in the manner of
    ``tracemalloc.Statistic``); `statistics` makes them.

    Attributes:
        site: the user's line that made them (a [`Site`][tidyjax.Site]; its ``detail`` the
            library frame, such as ``flax/nnx/...``; its ``chain`` the user frames that led
            there, outer to inner: one row per chain), or None where JAX kept no traceback or
            the row is a watched object's.
        kind: ``"tensor"`` (Tensors), ``"escaped"`` (tidyjax's buffers only raw arrays hold),
            ``"watched"`` (arrays only a watched object holds) or ``"untracked"`` (jax arrays
            tidyjax does not own).
        count: how many (Tensors for ``"tensor"``, arrays otherwise).
        bytes: their bytes, each buffer once over the list it is in (in its first row).
        shapes: ``{"float32[1024,1024]": 2, ...}``.
        scope: the scope path that frees them, where the report splits by scope (``""``
            outside every scope, ``"<kept>"``, ``"<variable>"``), else None.
        device: the device, where the report splits by device (``memory()``), else None.
        name: the watched object's name, for a row of a watched object, else None.
    """

    site: Site | None
    kind: str
    count: int
    bytes: int
    shapes: Mapping[str, int] = dataclasses.field(default_factory=dict)
    scope: str | None = None
    device: str | None = None
    name: str | None = None

    @property
    def tracked(self) -> bool:
        """Whether tidyjax owns them (Tensors, or its escaped buffers)."""
        return self.kind in ("tensor", "escaped")

    @property
    def watched(self) -> bool:
        return self.kind == "watched"

    @property
    def untracked(self) -> bool:
        return self.kind == "untracked"

    @property
    def label(self) -> str:
        """What holds the bytes: the site (with the kind, unless Tensors), or the watched
        object's name."""
        if self.name is not None:
            return f"watched {self.name!r}"
        return site_label(self.site, self.kind)

    def __str__(self) -> str:
        shapes = _shapes(self.shapes)
        where = self.label if self.name is not None else site_label(self.site)  # noun: the kind
        text = f"{where}: {count(self.count, NOUNS[self.kind])}, {fmt_bytes(self.bytes)}"
        text += f" [{shapes}]" if shapes else ""
        if self.scope is not None and self.tracked:
            text += _SCOPES.get(self.scope, f", scope {self.scope!r}")
        if self.site is not None and self.site.detail is not None:
            text += f" (via {library_frame(self.site.detail)})"
        return text

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)  # a Site becomes a dict of its fields
        out["site"] = None if self.site is None else _site_json(self.site)
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> SiteStat:
        return cls(**{**d, "site": _site_from_json(d["site"])})


def site_label(site: Site | None, kind: str = "tensor") -> str:
    """``train.py:3 in step``, the site's chain of user frames, outer to inner (``train.py:9
    in main → train.py:3 in step``, `Site.label`), and `` (untracked)`` (or the row's other
    kind) unless Tensors."""
    text = site.label if isinstance(site, Site) else str(site)  # the timeline's: also a str
    if site is None:
        text = "<unknown site>"
    return text if kind == "tensor" else f"{text} ({kind})"


def site_key(site: Site | None) -> tuple[Any, ...] | None:
    """What the reports group by: the site's own frame and its whole chain of user frames,
    none elided (read from the fields: no path is shortened per row)."""
    if site is None:
        return None
    return (site.file, site.line, site.function, *((f.file, f.line) for f in site.chain))


_SCOPES = {"": ", outside every scope", "<kept>": ", kept", "<variable>": ", a Variable"}


#: How a table names a scope marker.
_SCOPE_NAMES = {"": "(no scope)", "<kept>": "kept", "<variable>": "Variable"}


def site_table(
    rows: Sequence[Any],
    site: str = "created at",
    bars: bool = False,
    more: Callable[[Any], str] | None = None,
) -> str:
    """`SiteStat` (or ``SiteDiff``) rows as the one table every report shows: the device, the
    kind and the scope where the rows have them, the site (its library frame dim beside it,
    and ``more(row)``), the count and the bytes (with their changes; a bar each with
    ``bars``), the shapes."""
    most = max((r.bytes for r in rows), default=0) or 1
    cols: list[tuple[str, Any, Callable[[Any], str]]] = [
        ("device", _has(rows, "device"), lambda r: esc(r.device)),
        (site, True, lambda r: esc(r.label) + _via(r.site) + (more(r) if more else "")),
        ("kind", len({r.kind for r in rows}) > 1, lambda r: esc(r.kind)),
        ("scope", _has(rows, "scope"), lambda r: esc(_SCOPE_NAMES.get(r.scope, r.scope or ""))),
        ("count", True, lambda r: str(r.count)),
        ("change", _has(rows, "count_diff"), lambda r: f"{r.count_diff:+d}"),
        ("bytes", True, lambda r: esc(fmt_bytes(r.bytes))),
        ("change", _has(rows, "bytes_diff"), lambda r: esc(signed_bytes(r.bytes_diff))),
        ("", bars, lambda r: _html.bar(r.bytes / most)),
        ("shapes", _has(rows, "shapes"), lambda r: esc(_shapes(r.shapes))),
    ]
    shown = [(h, cell) for h, present, cell in cols if present]
    numeric = {i for i, (h, _) in enumerate(shown) if h in ("count", "change", "bytes")}
    body = [[cell(r) for _, cell in shown] for r in rows]
    return _html.table([h for h, _ in shown], body, numeric)


def _has(rows: Sequence[Any], field: str) -> bool:
    return any(getattr(r, field, None) is not None for r in rows)


def _via(site: Site | None) -> str:
    lib = site.detail if site is not None else None
    return _html.dim(f" via {library_frame(lib)}") if lib is not None else ""


def _shapes(shapes: Mapping[str, int]) -> str:
    return ", ".join(f"{s} ×{n}" if n > 1 else s for s, n in shapes.items())  # noqa: RUF001


def statistics(
    items: Iterable[Any], by: tuple[str, ...] = ("site",), top: int | None = None
) -> list[SiteStat]:
    """``items`` (census `Row`s or `TensorRecord`s) grouped by their kind and the fields named
    in ``by`` (``"site"``, ``"scope"``, ``"name"``, ``"device"``: a row counts on each device
    that holds part of it, with that part), largest first (by device first when split by
    device, at most ``top`` rows per device). Each buffer's bytes count once per kind and
    device, in the first row that has it, so the rows add up to the total."""
    groups: dict[tuple[Any, ...], list[Any]] = {}
    claimed: set[tuple[Any, ...]] = set()
    for it in items:
        kind, row = _kind(it), isinstance(it, Row)
        buf, shape = (it.buffer, it.shape) if row else (it._buffer, describe(it))
        for dev, b in it.spread if "device" in by else ((None, it.bytes),):
            key = (kind, *(_field(it, f, dev) for f in by))
            g = groups.setdefault(key, [it.site if "site" in by else None, 0, 0, Counter()])
            g[1] += (it.tensors or 1) if row else 1
            if (kind, buf, dev) not in claimed:
                claimed.add((kind, buf, dev))
                g[2] += b
            g[3][shape] += 1
    out: list[SiteStat] = []
    for key, (site, n, b, shapes) in groups.items():
        fields = {f: v for f, v in zip(by, key[1:], strict=True) if f != "site"}
        out.append(SiteStat(site, key[0], n, b, dict(shapes), **fields))
    return top_per_device(out, len(out) if top is None else top)


def holder_rows(c: Census, per_device: bool = True) -> list[SiteStat]:
    """What holds the memory in census ``c``, as every holder list shows it: Tensors and
    untracked arrays by creation site, watched objects by name; split by device, or not."""
    split = ("device",) if per_device else ()
    return statistics(c.of("tensor", "escaped", "untracked"), (*split, "site")) + statistics(
        c.of("watched"), (*split, "name")
    )


def top_per_device(rows: list[SiteStat], n: int) -> list[SiteStat]:
    """``rows`` sorted by device, then largest first, at most ``n`` per device."""
    rows = sorted(rows, key=lambda s: (s.device or "", -s.bytes, -s.count, s.label))
    return [s for _, g in groupby(rows, key=lambda s: s.device or "") for s in islice(g, n)]


def holder_lines(rows: Iterable[SiteStat], device: str | None = None) -> list[str]:
    """The rows on ``device`` (every row with None) as the numbered list of every text report,
    largest first as given: ``    1. train.py:3 in step: 1 tensor, 4.0 MiB [float32[8,8]]``."""
    shown = [r for r in rows if device is None or r.device == device]
    return [f"    {i}. {r}" for i, r in enumerate(shown, 1)]


def _kind(it: Any) -> str:
    return it.kind if isinstance(it, Row) else _KINDS.get(it.scope, "tensor")


def _field(it: Any, field: str, device: Any) -> Any:
    if field == "site":
        return site_key(it.site)
    if field == "device":
        return str(device)
    return getattr(it, field)


# -- records: a Tensor each --------------------------------------------------------------------


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
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["shape"], out["devices"] = list(self.shape), list(self.devices)
        out["site"] = None if self.site is None else _site_json(self.site)
        out["buffer"] = out.pop("_buffer")
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> TensorRecord:
        index = operator.index  # a count given as anything but an int is a malformed file
        return cls(
            id=index(d["id"]), shape=tuple(index(n) for n in d["shape"]), dtype=d["dtype"],
            bytes=index(d["bytes"]), devices=tuple(d["devices"]), scope=d["scope"],
            kept=d["kept"], variable=d["variable"], _buffer=index(d.get("buffer", d["id"])),
            site=_site_from_json(d.get("site")), name=d.get("name"),
        )  # fmt: skip


def buffer_of(r: TensorRecord) -> int:
    """The device buffer ``r``'s Tensor is over: the records of Tensors over one buffer (aliases,
    a group) give the same number, so a sum over distinct numbers counts each buffer once."""
    return r._buffer


def _site_json(site: Site) -> dict[str, Any]:
    out: dict[str, Any] = {"file": site.file, "line": site.line, "function": site.function}
    if site.detail is not None:  # the library frame that made it
        out["detail"] = _site_json(site.detail)
    if site.stack:  # a leak site's user frames further in
        out["stack"] = [_site_json(f) for f in site.stack]
    if site.chain:  # the chain of user frames, outer to inner
        out["chain"] = [_site_json(f) for f in site.chain]
    return out


def _site_from_json(s: dict[str, Any] | None) -> Site | None:
    """A site from `_site_json`; one written before chains (snapshot format 1) is a chain of
    one frame."""
    if s is None:
        return None
    stack = tuple(Site(f["file"], f["line"], f["function"]) for f in s.get("stack", ()))
    chain = tuple(Site(f["file"], f["line"], f["function"]) for f in s.get("chain", ()))
    return Site(s["file"], s["line"], s["function"], _site_from_json(s.get("detail")), stack,
                chain if len(chain) > 1 else ())  # fmt: skip


def holders(recs: list[_registry.Buffer]) -> list[tuple[_registry.Buffer, list[Tensor]]]:
    """Each record with the live Tensors holding it, found among the objects the garbage
    collector tracks (the registry counts holders but keeps no reference to them: that would
    cost on every op). One pass over the heap."""
    by_rec: dict[int, tuple[_registry.Buffer, list[Tensor]]] = {id(r): (r, []) for r in recs}
    arrays = [a for r in recs for a in r.arrays()]  # held: their ids stay theirs meanwhile
    if arrays:
        ids = set(map(id, arrays))
        for obj in gc.get_objects():
            if isinstance(obj, Tensor):
                rec = record(obj)
                if rec is not None and id(rec) in by_rec and id(held_array(obj)) in ids:
                    by_rec[id(rec)][1].append(obj)
    return list(by_rec.values())


def live_holders() -> list[tuple[_registry.Buffer, list[Tensor]]]:
    """Every record the reports count (`books`) with the live Tensors holding it."""
    return holders([r for part in books() for r in part])


def _record(
    t: Tensor, rec: _registry.Buffer, names: dict[int, str], site_of: Callable[[Any], Any]
) -> TensorRecord:
    arr = held_array(t)
    variable = isinstance(t, Variable)
    return TensorRecord(
        id=t.id,
        shape=tuple(arr.shape),
        dtype=str(arr.dtype),
        # a failed allocation holds nothing, nor a buffer deleted behind tidyjax's back
        bytes=0 if failed(arr) or base_array(arr).is_deleted() else rec.size(),
        devices=_devices(arr),
        scope="<variable>" if variable else scope_path(rec.scope),
        site=site_of(arr),
        kept=rec.scope is KEPT,
        variable=variable,
        _buffer=buffer_id(rec),  # records over one buffer (a group) share it
        name=names.get(id(arr)),
    )


def _devices(arr: Any) -> tuple[str, ...]:
    """From the sharding: ``devices()`` raises for a deleted array, the sharding never does."""
    return tuple(sorted(str(d) for d in arr.sharding.device_set))


def _raw_record(
    row: Row, names: Mapping[int, str], site_of: Callable[[Any], Site | None] = creation_site
) -> TensorRecord:
    """A watched, escaped or untracked buffer's record: no Tensor, so id 0."""
    arr = row.array
    return TensorRecord(
        id=0, shape=tuple(arr.shape), dtype=str(arr.dtype), bytes=row.bytes,
        devices=_devices(arr), scope=f"<{row.kind}>", site=site_of(arr),
        kept=row.rec is not None and row.rec.scope is KEPT, variable=False, _buffer=row.buffer,
        name=names.get(id(arr)),
    )  # fmt: skip


def untracked_record(
    arr: Any, site_of: Callable[[Any], Site | None] = creation_site
) -> TensorRecord:
    """A jax array tidyjax does not own: no Tensor, so id 0 and scope ``<untracked>``.
    ``site_of``: how its site is found (a leak check names the outermost user frame)."""
    return _raw_record(Row("untracked", arr, failed=failed(arr)), {}, site_of)


def tensor_records(
    since: int = 0,
    names: dict[int, str] | None = None,
    holding: list[tuple[_registry.Buffer, list[Tensor]]] | None = None,
    site_of: Callable[[Any], Site | None] = creation_site,
) -> list[TensorRecord]:
    """A record of each live Tensor and Variable whose id is above ``since``, oldest first;
    only those are built, so a leak check's report costs its new Tensors. ``names``: the
    watched arrays' paths by the arrays' ids; ``holding``: `live_holders`, by default found
    now. ``site_of``: how a site is found (a leak check names the outermost user frame)."""
    with collector_paused():
        out = [
            _record(t, rec, names or {}, site_of)
            for rec, ts in (live_holders() if holding is None else holding)
            for t in ts
            if t.id > since
        ]
    out.sort(key=lambda r: r.id)
    return out


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """The garbage collector paused while a report builds its records: they make no cycles,
    and so many new objects would start collections of the whole heap."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def summary(records: Iterable[TensorRecord]) -> str:
    """The one headline of a list of records: the Tensors with their bytes, then the escaped,
    watched and untracked arrays, each with theirs, each buffer once, a part left out when
    there is none of it (``3 live tensors, 12 B; 2 watched arrays, 4.0 MiB``)."""
    n: Counter[str] = Counter()
    by_buffer: dict[tuple[str, int], int] = {}
    for r in records:
        n[kind := _KINDS.get(r.scope, "tensor")] += 1
        by_buffer[kind, r._buffer] = r.bytes
    nbytes = summed({kind: b} for (kind, _), b in by_buffer.items())
    parts = [f"{count(n['tensor'], 'live tensor')}, {fmt_bytes(nbytes.get('tensor', 0))}"]
    parts += [
        f"{count(n[k], NOUNS[k])}, {fmt_bytes(nbytes[k])}"
        for k in ("escaped", "watched", "untracked")
        if n[k]
    ]
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
    return census(untracked=untracked).records()


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
    header = ["id", "tensor", "bytes", "devices", "scope", "created at"]
    return _html.box(head, _html.table(header + ["name"] * named, rows, numeric={0, 2}))
