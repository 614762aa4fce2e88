"""The timeline's file format: `TimelineEvent`, the event kinds, the JSON layout.

What a `tidyjax.Timeline` records and what ``Timeline.dump`` writes and ``load`` reads
(format ``"tidyjax.timeline"``, version 1). The recording itself is ``_timeline``'s.

Reading checks every value it uses: a file that is not as ``dump`` writes it (a value of the
wrong type, out of range, NaN or infinite; an index into a table without that row; event times
going back) is a `TidyjaxValueError` naming what is wrong, never another exception.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import time
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
    "COUNT_LIMIT",
    "TIME_LIMIT",
    "Codec",
    "TimelineEvent",
    "check",
    "check_version",
    "collection_paused",
    "is_clock",
    "is_count",
    "is_unix_time",
    "short",
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
#: Counts (bytes, buffer numbers, ids, line numbers) are ints from 0 below this (64 bits).
COUNT_LIMIT = 2**63
#: Times on ``time.perf_counter()``'s clock are from 0 up to this (31,000 years): a larger one is
#: no clock reading, and would overflow the arithmetic of the page and of the trace.
TIME_LIMIT = 1e12
#: What a JSON array is read as: a list from a file, a list or a tuple from `encode` itself.
_SEQ = (list, tuple)


def short(value: Any) -> str:
    """``value`` in a message, as JSON spells it: a number or a short string whole, a longer one
    clipped, anything else by its type (a container could be huge, or too deep to write)."""
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, float):
        return json.dumps(value)  # NaN, Infinity, -Infinity as JSON (and Python) reads them
    if isinstance(value, int):
        return str(value) if abs(value) < 10**30 else f"an int of {value.bit_length()} bits"
    if isinstance(value, str):
        return json.dumps(value) if len(value) <= 40 else json.dumps(value[:37])[:-1] + '…"'
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return f"a {type(value).__name__}"


def is_count(x: Any) -> bool:
    """``x`` is an int (not a bool) from 0 below `COUNT_LIMIT`."""
    return type(x) is int and 0 <= x < COUNT_LIMIT


def is_clock(x: Any) -> bool:
    """``x`` is a number (not a bool) from 0 below `TIME_LIMIT`, as ``perf_counter`` reads
    (NaN fails both comparisons)."""
    return type(x) in (float, int) and 0 <= x < TIME_LIMIT


def is_unix_time(x: Any) -> bool:
    """``x`` is a number (not a bool) from 0 that ``time.localtime`` takes (the page shows it)."""
    if not is_clock(x):
        return False
    try:
        time.localtime(x)
    except (OverflowError, OSError, ValueError):
        return False
    return True


def check_version(data: dict[str, Any], where: str, what: str, version: int, write: str) -> None:
    """Refuse ``data`` unless its ``"version"`` is ``version``: one with none, or with one that no
    tidyjax writes (not a positive int), is no tidyjax file; a newer one needs a newer tidyjax.

    Args:
        what: ``"timeline"`` or ``"snapshot"``.
        write: the call that writes one (``"Timeline.dump(path)"``).

    Raises:
        TidyjaxValueError: saying which.
    """
    if "version" not in data:
        raise TidyjaxValueError(
            f'{where} is not a tidyjax {what} file: it has no "version" (every file {write} '
            "writes has one)."
        )
    got = data["version"]
    if type(got) is not int or got < 1:
        raise TidyjaxValueError(
            f'{where} is not a tidyjax {what} file: its "version" is {short(got)}, not a format '
            f"version (a positive int); write one with {write}."
        )
    if got != version:
        raise TidyjaxValueError(
            f"{where} is a tidyjax {what} of format version {short(got)}; this tidyjax reads "
            f"version {version}. Upgrade tidyjax to read it."
        )


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
        """The tables of ``data`` (see the class), each value checked.

        Raises:
            KeyError: a table is missing.
            ValueError: a table or a row is not as `encode` writes it.
        """
        codec = cls()
        strings = codec.string_list = _rows(data, "strings")
        if not all(type(x) is str for x in strings):
            raise ValueError('"strings" holds something other than strings')
        sites = codec.site_list = [_site(row) for row in _rows(data, "sites")]
        metas = codec.meta_list
        for row in _rows(data, "metas"):
            if type(row) not in _SEQ or len(row) != 4:
                raise ValueError(
                    f'a row of "metas" is {short(row)}, not [device, site, shape, dtype]'
                )
            d, si, shape, dt = row
            if not (_index(d, strings) and _index(dt, strings)):
                raise ValueError('a row of "metas" names a device or dtype not in "strings"')
            if not (si == -1 or _index(si, sites)):
                raise ValueError(f'a row of "metas" names the site {short(si)}, not in "sites"')
            if type(shape) not in _SEQ or not all(is_count(n) for n in shape):
                raise ValueError(f'a row of "metas" has the shape {short(shape)}')
            metas.append((strings[d], None if si < 0 else sites[si], tuple(shape), strings[dt]))
        for pd in _rows(data, "placements"):
            if type(pd) not in _SEQ or not all(
                type(x) in _SEQ and len(x) == 2 and _index(x[0], strings) and is_count(x[1])
                for x in pd
            ):
                raise ValueError('a row of "placements" is not [[device, bytes], ...]')
            codec.placement_list.append(tuple((strings[d], b) for d, b in pd))
        return codec

    def decode(self, cols: dict[str, list[Any]], where: str, what: str) -> list[TimelineEvent]:
        """The events in the columns ``cols``, each value checked; the events kept (``what`` is
        ``"event"``; not the base or peak events) also in time order.

        Raises:
            KeyError: a column is missing.
            TidyjaxValueError: the columns are not lists of one length, or an event is malformed.
        """
        malformed = f"{where} is a malformed tidyjax timeline: its {what}"
        if type(cols) is not dict:
            raise TidyjaxValueError(f"{malformed}s are {short(cols)}, not an object of columns.")
        columns = [cols[c] for c in _COLUMNS]
        for c, column in zip(_COLUMNS, columns, strict=True):
            if type(column) not in _SEQ:
                raise TidyjaxValueError(f"{malformed} column {c!r} is {short(column)}, not a list.")
        n = len(columns[0])
        if any(len(c) != n for c in columns):
            raise TidyjaxValueError(f"{malformed} columns differ in length.")
        strings, metas, placements = self.string_list, self.meta_list, self.placement_list
        ns, nmetas, nplacements = len(strings), len(metas), len(placements)
        ordered = what == "event"  # recorded in time order; base and peak events by buffer
        last = 0.0
        one: dict[tuple[str, int], tuple[tuple[str, int], ...]] = {}
        out = []
        i = 0
        try:
            for i, (k, t, b, m, sc, ids, buf, nm, pl) in enumerate(zip(*columns, strict=True)):  # noqa: B007 - i names the bad event
                if not (
                    type(k) is int and 0 <= k < ns
                    and type(sc) is int and 0 <= sc < ns
                    and type(nm) is int and 0 <= nm < ns
                ):  # fmt: skip
                    raise ValueError(_not_indexes(("kind", k), ("scope", sc), ("name", nm), ns))
                kind = strings[k]
                if kind not in KINDS:
                    raise ValueError(f"unknown event kind {short(kind)}")
                if type(t) is not float or not 0.0 <= t < TIME_LIMIT:
                    raise ValueError(f"its time is {short(t)}, not a perf_counter reading")
                if ordered and t < last:
                    raise ValueError(f"its time {t!r} is before the event before it ({last!r})")
                last = t
                if not is_count(b):
                    raise ValueError(f"its bytes {short(b)} is not an int from 0")
                if not is_count(buf):
                    raise ValueError(f"its buffer {short(buf)} is not an int from 0")
                if type(m) is not int or not 0 <= m < nmetas:
                    raise ValueError(f'its meta {short(m)} is not an index into "metas"')
                if type(pl) is not int or not -1 <= pl < nplacements:
                    raise ValueError(f'its placement {short(pl)} is neither -1 nor in "placements"')
                tensors = _ids(ids)
                device, site, shape, dtype = metas[m]
                if pl < 0:
                    key = (device, b)
                    pd = one.get(key)
                    if pd is None:
                        pd = one[key] = (key,)
                else:
                    pd = placements[pl]
                out.append(TimelineEvent(
                    kind, t, b, device, site, strings[sc], shape, dtype, tensors, buf,
                    strings[nm], pd,
                ))  # fmt: skip
        except (TypeError, ValueError, IndexError, AttributeError) as e:
            raise TidyjaxValueError(f"{where}: {what} {i} is malformed ({e}).") from e
        return out


def _not_indexes(*fields: Any) -> str:
    """What is wrong with an event's indexes into the strings: ``(name, value)`` pairs, then
    the number of strings."""
    *pairs, n = fields
    bad = [f"{name} {short(i)}" for name, i in pairs if type(i) is not int or not 0 <= i < n]
    return f'its {" and ".join(bad)} {"is" if len(bad) == 1 else "are"} not in "strings"'


def _ids(ids: Any) -> tuple[int, ...]:
    """The Tensor ids of an event's ``tensors`` column: decimal ids joined by ``","``."""
    if type(ids) is not str:
        raise ValueError(f"its tensors are {short(ids)}, not ids joined by ','")
    if not ids:
        return ()
    parts = ids.split(",")
    if not all(p.isascii() and p.isdigit() and len(p) < 19 for p in parts):
        raise ValueError(f"its tensors are {short(ids)}, not ids joined by ','")
    return tuple(map(int, parts))


def _rows(data: dict[str, Any], key: str) -> list[Any]:
    """The table ``data[key]``, a list (KeyError when missing)."""
    rows = data[key]
    if type(rows) not in _SEQ:
        raise ValueError(f"{key!r} is {short(rows)}, not a list")
    return rows


def _index(i: Any, table: list[Any]) -> bool:
    """``i`` is the index of a row of ``table`` (a negative int is not)."""
    return type(i) is int and 0 <= i < len(table)


def _site_row(site: Site) -> list[Any]:
    d = site.detail
    row: list[Any] = [site.file, site.line, site.function]
    return row if d is None else [*row, d.file, d.line, d.function]


def _site(row: Any) -> Site:
    """A site from ``[file, line, function]``, with ``detail`` when three more follow."""
    if (
        type(row) not in _SEQ
        or len(row) not in (3, 6)
        or not all(_is_frame(row[j : j + 3]) for j in range(0, len(row), 3))
    ):
        raise ValueError(f"a site is [file, line, function] (3 or 6 fields), not {short(row)}")
    detail = Site(row[3], row[4], row[5]) if len(row) == 6 else None
    return Site(row[0], row[1], row[2], detail)


def _is_frame(row: Any) -> bool:
    """``row`` is ``[file, line, function]``."""
    return (
        type(row) in _SEQ and len(row) == 3
        and type(row[0]) is str and is_count(row[1]) and type(row[2]) is str
    )  # fmt: skip


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
    """The ``stacks`` and ``names`` of `encode`'s data (empty when the file has none).

    Raises:
        ValueError: a row is not as `encode` writes it.
    """
    stacks: dict[Site, list[tuple[Site, ...]]] = {}
    for row in _optional(data, "stacks"):
        if type(row) not in _SEQ or not row or not _index(row[0], codec.site_list):
            raise ValueError('a row of "stacks" does not start with an index into "sites"')
        if not all(type(st) in _SEQ and all(_is_frame(f) for f in st) for st in row[1:]):
            raise ValueError('a stack in "stacks" is not [[file, line, function], ...]')
        stacks[codec.site_list[row[0]]] = [tuple(Site(*f) for f in st) for st in row[1:]]
    names = {}
    for row in _optional(data, "names"):
        if not (type(row) in _SEQ and len(row) == 2 and is_count(row[0]) and type(row[1]) is str):
            raise ValueError(f'a row of "names" is {short(row)}, not [buffer, name]')
        names[row[0]] = row[1]
    return stacks, names


def decode_marks(data: dict[str, Any]) -> list[Mark]:
    """The ``marks`` of `encode`'s data, in time order (none when the file has none).

    Raises:
        ValueError: a mark is not ``[time, label, bytes or null]``.
    """
    marks = []
    for row in _optional(data, "marks"):
        if (
            type(row) not in _SEQ or len(row) != 3 or not is_clock(row[0])
            or type(row[1]) is not str or not (row[2] is None or is_count(row[2]))
        ):  # fmt: skip
            raise ValueError(f'a row of "marks" is {short(row)}, not [time, label, bytes or null]')
        marks.append(Mark(float(row[0]), row[1], row[2]))
    return sorted(marks, key=lambda m: m.time)


def _optional(data: dict[str, Any], key: str) -> list[Any]:
    """The table ``data[key]`` that older files lack: a list, or none when missing or null."""
    rows = data.get(key)
    if rows is None:
        return []
    if type(rows) not in _SEQ:
        raise ValueError(f"{key!r} is {short(rows)}, not a list")
    return rows


#: The header's fields, what each must be, and what that is in words. Each is checked when
#: present; a missing one is named when the timeline is decoded.
_HEADER: dict[str, tuple[Any, str]] = {
    "started_at": (lambda x: x is None or is_unix_time(x), "null or a Unix time"),
    "start_time": (lambda x: x is None or is_clock(x), "null or a perf_counter reading"),
    "stop_time": (lambda x: x is None or is_clock(x), "null or a perf_counter reading"),
    "peak_time": (is_clock, "a perf_counter reading"),
    "max_events": (lambda x: is_count(x) and x >= 1, "an int from 1"),
    "dropped": (is_count, "an int from 0"),
    "peak_bytes": (is_count, "an int from 0"),
    "events": (lambda x: type(x) is dict, "an object of columns"),
    "base": (lambda x: type(x) is dict, "an object of columns"),
    "peak_live": (lambda x: x is None or type(x) is dict, "null or an object of columns"),
}


def check(data: Any, where: str) -> dict[str, Any]:
    """``data`` itself when it is a timeline of the version this tidyjax reads, its header's
    fields of the right types and in range (the events and tables are checked as decoded).

    Raises:
        TidyjaxValueError: it is not a tidyjax timeline, has no version or one no tidyjax
            writes, is of a newer format version, or a field of its header is malformed.
    """
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise TidyjaxValueError(
            f'{where} is not a tidyjax timeline (no "format": {FORMAT!r}); write one with '
            "Timeline.dump(path)."
        )
    check_version(data, where, "timeline", VERSION, "Timeline.dump(path)")
    for key, (ok, expected) in _HEADER.items():
        if key in data and not ok(data[key]):
            raise TidyjaxValueError(
                f'{where} is a malformed tidyjax timeline: its "{key}" is {short(data[key])}, '
                f"not {expected}."
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
        TidyjaxValueError: the file is not JSON (or not UTF-8, or holds a number of more
            digits than Python converts), or its JSON nests too deeply for Python to read.
    """
    with open(path, encoding="utf-8") as f:
        try:
            return json.load(f)
        except RecursionError:
            raise TidyjaxValueError(
                f"{path} is not a tidyjax file: its JSON is nested too deeply to read."
            ) from None
        except ValueError as e:  # a JSONDecodeError, a UnicodeDecodeError, too many digits
            raise TidyjaxValueError(f"{path} is not a JSON file ({e}).") from e
