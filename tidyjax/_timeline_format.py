"""The timeline's file format: `TimelineEvent`, the event kinds, the JSON layout.

What a `tidyjax.Timeline` records and what ``Timeline.dump`` writes and ``load`` reads
(format ``"tidyjax.timeline"``, version 1). The recording itself is ``_timeline``'s.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
from collections.abc import Iterator
from typing import Any, NamedTuple

from ._errors import TidyjaxValueError
from ._records import Site

__all__ = [
    "ALLOC",
    "FORMAT",
    "FREE",
    "KINDS",
    "Mark",
    "SCOPE_ENTER",
    "SCOPE_EXIT",
    "UNTRACKED",
    "VERSION",
    "Codec",
    "TimelineEvent",
    "check",
    "collection_paused",
    "decode_extras",
    "decode_marks",
    "encode",
    "read",
    "write",
]

ALLOC, FREE, SCOPE_ENTER, SCOPE_EXIT = "alloc", "free", "scope_enter", "scope_exit"
#: The scope of a plain jax.Array's events: no Tensor holds it, tidyjax never frees it.
UNTRACKED = "<untracked>"
KINDS = (ALLOC, FREE, SCOPE_ENTER, SCOPE_EXIT)
FORMAT, VERSION = "tidyjax.timeline", 1


class TimelineEvent(NamedTuple):
    """One change to device memory, as a `Timeline` records it (immutable).

    Attributes:
        kind: ``"alloc"``, ``"free"``, ``"scope_enter"`` or ``"scope_exit"``.
        time: seconds on ``time.perf_counter()``'s clock (monotonic).
        bytes: the buffer's logical bytes, as ``memory().num_bytes`` counts them (0 for scopes,
            and for a buffer whose allocation failed: JAX says so only once the array is
            waited for, so a timeline rewrites such an allocation, and its peak, when read).
        device: the device holding the buffer (``str(device)``), several joined by ``","``.
        site: the `tidyjax.Site` that created its array, or None.
        scope: the owner's scope path (``"train/step"``; ``"<kept>"``, ``"<variable>"``, or
            ``""`` outside every scope): when allocated for ``"alloc"``, when freed for
            ``"free"``; ``"<untracked>"`` for a plain jax.Array no Tensor holds (its alloc
            timed when the timeline first saw it). For scope events, the scope's path.
        shape: the buffer's shape (``()`` for scopes).
        dtype: the buffer's dtype (``""`` for scopes).
        tensors: ids of the Tensors seen holding the buffer: the one that created it at
            ``"alloc"``, every one seen at ``"free"`` (none for a plain array).
        buffer: the buffer's number in this timeline, the same in its alloc and its free; for
            scope events, the scope's number, the same in its enter and its exit.
        name: for scope events, the scope's own name.
        per_device: ``(device, bytes)`` for each device holding a shard or copy, as
            ``memory().bytes_per_device`` counts them.
    """

    kind: str
    time: float
    bytes: int
    device: str
    site: Site | None
    scope: str
    shape: tuple[int, ...]
    dtype: str
    tensors: tuple[int, ...]
    buffer: int
    name: str = ""
    per_device: tuple[tuple[str, int], ...] = ()


class Mark(NamedTuple):
    """A moment a `Timeline` was marked at (``Timeline.annotate``): drawn as a vertical line
    with its label; the page's table can show what was alive then.

    Attributes:
        time: seconds on ``time.perf_counter()``'s clock, as the events' times.
        label: what happened then (``"out of memory: add(...)"``).
        bytes: a number of bytes that goes with it (a failed request's), or None.
    """

    time: float
    label: str
    bytes: int | None = None


@contextlib.contextmanager
def collection_paused() -> Iterator[None]:
    """Pause Python's cyclic collector while a million records are built at once: it would run
    full collections over the whole heap many times, for nothing (nothing built is garbage)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


_COLUMNS = ("kind", "time", "bytes", "meta", "scope", "tensors", "buffer", "name", "placement")


class Codec:
    """The JSON layout of events: a column per field, repeated values in tables.

    ``events``, ``base`` and ``peak_live`` each hold the columns ``kind``, ``scope``, ``name``
    (indexes into ``strings``), ``time``, ``bytes``, ``buffer``, ``tensors`` (ids joined by
    ``","``), ``meta`` (an index into ``metas``: ``[device, site, shape, dtype]``, the site an
    index into ``sites``: ``[file, line, function]``, followed by the library frame's
    ``file, line, function`` when the site has a ``detail``; or -1) and ``placement`` (-1 when all
    bytes are on ``device``, else an index into ``placements``: ``[[device, bytes], ...]``).
    Columns of numbers and strings keep the file small and quick to write and read.
    """

    def __init__(self) -> None:
        self.strings: dict[str, int] = {}
        # (site, its detail: equality ignores it) -> index
        self.sites: dict[tuple[Site, Site | None], int] = {}
        self.metas: dict[tuple[Any, ...], int] = {}
        self.placements: dict[tuple[tuple[str, int], ...], int] = {}
        self._keep: list[Any] = []  # the sites whose ids key `metas`
        # read side
        self.meta_list: list[tuple[str, Site | None, tuple[int, ...], str]] = []
        self.placement_list: list[tuple[tuple[str, int], ...]] = []
        self.string_list: list[str] = []
        self.site_list: list[Site] = []

    def _s(self, x: str) -> int:
        i = self.strings.get(x)
        if i is None:
            i = self.strings[x] = len(self.strings)
        return i

    def encode(self, events: list[TimelineEvent]) -> dict[str, list[Any]]:
        cols: dict[str, list[Any]] = {c: [] for c in _COLUMNS}
        kind, time_, nbytes, meta, scope, tensors, buffer, name, placement = cols.values()
        s, metas, placements = self._s, self.metas, self.placements
        for ev in events:
            key = (ev.device, id(ev.site), ev.shape, ev.dtype)
            m = metas.get(key)
            if m is None:
                site = ev.site
                si = -1
                if site is not None:
                    si = self.sites.setdefault((site, site.detail), len(self.sites))
                    self._keep.append(site)
                m = metas[key] = len(metas)
                self.meta_list.append((s(ev.device), si, list(ev.shape), s(ev.dtype)))  # type: ignore[arg-type]
            pd = ev.per_device
            if len(pd) == 1 and pd[0][0] == ev.device and pd[0][1] == ev.bytes:
                pl = -1
            else:
                pl = placements.get(pd, -1)
                if pl < 0:
                    pl = placements[pd] = len(placements)
            kind.append(s(ev.kind))
            time_.append(ev.time)
            nbytes.append(ev.bytes)
            meta.append(m)
            scope.append(s(ev.scope))
            tensors.append(",".join(map(str, ev.tensors)))
            buffer.append(ev.buffer)
            name.append(s(ev.name))
            placement.append(pl)
        return cols

    def site_index(self, site: Site) -> int:
        """``site``'s row in the ``sites`` table, added if new."""
        i = self.sites.setdefault((site, site.detail), len(self.sites))
        self._keep.append(site)
        return i

    def tables(self) -> dict[str, Any]:
        s = self._s
        placements = [[[s(d), b] for d, b in pd] for pd in self.placements]
        return {
            "strings": list(self.strings),
            "sites": [_site_row(x) for x, _ in self.sites],
            "metas": self.meta_list,
            "placements": placements,
        }

    @classmethod
    def read(cls, data: dict[str, Any]) -> Codec:
        codec = cls()
        strings = codec.string_list = [str(x) for x in data["strings"]]
        sites = codec.site_list = [_site(row) for row in data["sites"]]
        codec.meta_list = [
            (strings[d], None if si < 0 else sites[si], tuple(int(x) for x in shape), strings[dt])
            for d, si, shape, dt in data["metas"]
        ]
        codec.placement_list = [
            tuple((strings[d], int(b)) for d, b in pd) for pd in data["placements"]
        ]
        return codec

    def decode(self, cols: dict[str, list[Any]], where: str, what: str) -> list[TimelineEvent]:
        columns = [cols[c] for c in _COLUMNS]
        n = len(columns[0])
        if any(len(c) != n for c in columns):
            raise TidyjaxValueError(f"{where}: the {what} columns differ in length.")
        strings, metas, placements = self.string_list, self.meta_list, self.placement_list
        one: dict[tuple[str, int], tuple[tuple[str, int]]] = {}
        out = []
        i = 0
        try:
            for i, (k, t, b, m, sc, ids, buf, nm, pl) in enumerate(zip(*columns, strict=True)):  # noqa: B007 - i names the bad event
                kind = strings[k]
                if kind not in KINDS:
                    raise ValueError(f"unknown event kind {kind!r}")
                device, site, shape, dtype = metas[m]
                if pl < 0:
                    key = (device, b)
                    pd = one.get(key)
                    if pd is None:
                        pd = one[key] = (key,)
                else:
                    pd = placements[pl]
                if type(t) is not float or type(b) is not int or type(buf) is not int:
                    raise TypeError("time, bytes and buffer must be a float and ints")
                out.append(TimelineEvent(
                    kind, t, b, device, site, strings[sc], shape, dtype,
                    tuple(map(int, ids.split(","))) if ids else (), buf, strings[nm], pd,
                ))  # fmt: skip
        except (TypeError, ValueError, IndexError, AttributeError) as e:
            raise TidyjaxValueError(f"{where}: {what} {i} is malformed ({e}).") from e
        return out


def _site_row(site: Site) -> list[Any]:
    d = site.detail
    row: list[Any] = [site.file, site.line, site.function]
    return row if d is None else [*row, d.file, d.line, d.function]


def _site(row: list[Any]) -> Site:
    """A site from ``[file, line, function]``, with ``detail`` when three more follow."""
    detail = None
    if len(row) == 6:
        detail = Site(str(row[3]), int(row[4]), str(row[5]))
    elif len(row) != 3:
        raise ValueError(f"a site has 3 or 6 fields, not {len(row)}")
    return Site(str(row[0]), int(row[1]), str(row[2]), detail)


def encode(
    header: dict[str, Any],
    base: list[TimelineEvent],
    events: list[TimelineEvent],
    peak_live: list[TimelineEvent] | None,
    stacks: dict[Site, list[tuple[Site, ...]]] | None = None,
    names: dict[int, str] | None = None,
    marks: list[Mark] | None = None,
) -> dict[str, Any]:
    """The JSON data of a timeline: ``format`` and ``version``, then ``header`` (the timeline's
    own numbers, in order), then its events in columns and the tables they index (see
    `Codec`), each site's short stacks (``stacks``: ``[site index, [[file, line,
    function], ...], ...]``, innermost frame first) and the Variables' names of buffers
    (``names``: ``[buffer, name]``), and the marks (``marks``: ``[time, label, bytes or
    null]``, present only when there are some). Files without the last three load too (older
    ones)."""
    codec = Codec()
    with collection_paused():
        out: dict[str, Any] = {"format": FORMAT, "version": VERSION, **header}
        out["events"] = codec.encode(events)
        out["base"] = codec.encode(base)
        out["peak_live"] = None if peak_live is None else codec.encode(peak_live)
        out["stacks"] = [
            [codec.site_index(site), *([[f.file, f.line, f.function] for f in st] for st in sts)]
            for site, sts in (stacks or {}).items()
        ]
        out["names"] = [[b, n] for b, n in sorted((names or {}).items())]
        if marks:
            out["marks"] = [[m.time, m.label, m.bytes] for m in marks]
        out.update(codec.tables())
    return out


def decode_extras(
    data: dict[str, Any], codec: Codec
) -> tuple[dict[Site, list[tuple[Site, ...]]], dict[int, str]]:
    """The ``stacks`` and ``names`` of `encode`'s data (empty when the file has none)."""
    stacks: dict[Site, list[tuple[Site, ...]]] = {}
    for row in data.get("stacks") or ():
        site = codec.site_list[int(row[0])]
        stacks[site] = [tuple(Site(str(f), int(n), str(fn)) for f, n, fn in st) for st in row[1:]]
    names = {int(b): str(n) for b, n in data.get("names") or ()}
    return stacks, names


def decode_marks(data: dict[str, Any]) -> list[Mark]:
    """The ``marks`` of `encode`'s data, in time order (none when the file has none)."""
    marks = [
        Mark(float(t), str(label), None if b is None else int(b))
        for t, label, b in data.get("marks") or ()
    ]
    return sorted(marks, key=lambda m: m.time)


def check(data: Any, where: str) -> dict[str, Any]:
    """``data`` itself when it is a timeline of the version this tidyjax reads.

    Raises:
        TidyjaxValueError: it is not a tidyjax timeline, or of another format version.
    """
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise TidyjaxValueError(
            f'{where} is not a tidyjax timeline (no "format": {FORMAT!r}); write one with '
            "Timeline.dump(path)."
        )
    if data.get("version") != VERSION:
        raise TidyjaxValueError(
            f"{where} is a tidyjax timeline of format version {data.get('version')!r}; "
            f"this tidyjax reads version {VERSION}. Upgrade tidyjax to read it."
        )
    return data


def write(data: dict[str, Any], path: str | os.PathLike[str]) -> None:
    """Write ``data`` to ``path`` as compact JSON (UTF-8)."""
    text = json.dumps(data, separators=(",", ":"))
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def read(path: str | os.PathLike[str]) -> Any:
    """The JSON data in ``path``.

    Raises:
        TidyjaxValueError: the file is not JSON.
    """
    with open(path, encoding="utf-8") as f:
        try:
            return json.load(f)
        except json.JSONDecodeError as e:
            raise TidyjaxValueError(f"{path} is not a JSON file ({e}).") from e
