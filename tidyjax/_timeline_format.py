"""The timeline's events as files: `TimelineEvent`, the event kinds, the JSON layout that
``Timeline.dump`` writes and ``load`` reads (format ``"tidyjax.timeline"``, version 2; a file of
version 1, whose sites are one frame each, still loads), and the Chrome trace-event export. The
recording itself is ``_timeline``'s.

`chrome_trace` is the trace-event "JSON Object Format", which Perfetto's UI and
``chrome://tracing`` open: one process (``tidyjax memory``, named by metadata events, its
threads too); a counter track per device (``"ph": "C"``), the bytes alive there as
``memory().bytes_per_device`` counts them, with several devices their sum as well; each scope a
complete slice (``"ph": "X"``) on a ``scopes`` thread, scopes that overlap without nesting
(threads, asyncio tasks) on further ones, so that slices on one thread always nest; optionally
an instant (``"ph": "i"``) per allocation and free on a ``buffers`` thread; a global instant at
the peak and one per annotation. Times are microseconds since the timeline started. The
timeline is read through its kept events (``_window()``): no timeline code is imported.

Reading checks every value it uses: a file that is not as ``dump`` writes it (a value of the
wrong type, out of range, NaN or infinite; an index into a table without that row; event times
going back) is a `TidyjaxValueError` naming what is wrong, never another exception.
"""

from __future__ import annotations

import gzip
import itertools
import json
import operator
import os
import pathlib
import time
from collections.abc import Callable, Collection, Iterable, Iterator
from typing import Any, NamedTuple

from ._census import collector_paused, site_label
from ._errors import TidyjaxValueError
from ._format import describe, fmt_bytes
from ._sites import Site

__all__ = [
    "ALLOC", "FORMAT", "FREE", "HEADER", "SCOPE_ENTER", "SCOPE_EXIT", "TEMPORARIES", "VERSION",
    "VERSIONS", "Codec", "Mark", "TimelineEvent", "check", "check_file", "chrome_trace",
    "decode_extras", "encode",
    "is_clock", "is_count", "is_unix_time", "merge_temporaries", "read", "replay", "replay_peak",
    "shares", "short", "split_temporaries", "write", "write_chrome_trace",
]  # fmt: skip

ALLOC, FREE, SCOPE_ENTER, SCOPE_EXIT = "alloc", "free", "scope_enter", "scope_exit"
#: A ``tidyjax.jit`` call's XLA temporaries, held while it ran: no array (a replay skips it).
TEMPORARIES = "temporaries"
KINDS = (ALLOC, FREE, SCOPE_ENTER, SCOPE_EXIT)  # the kinds of the event columns
#: What an event does to the bytes alive, by kind (`replay`): others hold no array.
_SIGNS = {ALLOC: 1, FREE: -1}
#: The file format written: version 2 gives each site its chain of user frames (a ``frames``
#: table the ``sites`` rows index); version 1 (a site's own frame and its library frame) loads,
#: each site a chain of one frame.
FORMAT, VERSION = "tidyjax.timeline", 2
#: The format versions read.
VERSIONS = (1, 2)
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
    if value is None or isinstance(value, (bool, float)):  # NaN, Infinity as JSON reads them
        return json.dumps(value)
    if isinstance(value, int):
        return str(value) if abs(value) < 10**30 else f"an int of {value.bit_length()} bits"
    if isinstance(value, str):
        return json.dumps(value) if len(value) <= 40 else json.dumps(value[:37])[:-1] + '…"'
    if isinstance(value, (list, dict)):
        return "a list" if isinstance(value, list) else "an object"
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


def check_file(data: Any, where: str, what: str, version: int, write: str) -> dict[str, Any]:
    """``data`` itself when it is a tidyjax ``what`` file (``"timeline"`` or ``"snapshot"``: its
    ``"format"`` is ``"tidyjax.<what>"``) of format ``version``, else a `TidyjaxValueError` that
    says why: one with no version, or one no tidyjax writes (not a positive int), is no tidyjax
    file; a newer one needs a newer tidyjax. ``write``: the call that writes one
    (``"Timeline.dump(path)"``)."""
    if not isinstance(data, dict) or data.get("format") != f"tidyjax.{what}":
        raise TidyjaxValueError(
            f'{where} is not a tidyjax {what} (no "format": "tidyjax.{what}"); write one with '
            f"{write}."
        )
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
    return data


class TimelineEvent(NamedTuple):
    """One change to device memory, as a `Timeline` records it (immutable).

    Attributes:
        kind: ``"alloc"``, ``"free"``, ``"scope_enter"``, ``"scope_exit"`` or
            ``"temporaries"``: the XLA temporaries of a ``tidyjax.jit`` call, held while it ran
            (``name`` the function, ``bytes`` on all its devices, ``per_device`` each one's,
            ``scope`` the scope it ran in, at the moment the call returned); no array, so a
            replay of the arrays skips it.
        time: seconds on ``time.perf_counter()``'s clock (monotonic).
        bytes: the buffer's logical bytes, as ``memory().num_bytes`` counts them (0 for scopes,
            and for a buffer whose allocation failed: JAX says so only once the array is
            waited for, so a timeline rewrites such an allocation, and its peak, when read).
        device: the device holding the buffer (``str(device)``), several joined by ``","``.
        site: the `tidyjax.Site` that created its array, with its ``chain`` of user frames
            (one site per chain: one line reached through two callers is two sites), or None.
        scope: the owner's scope path (``"train/step"``; ``"<kept>"``, ``"<variable>"``, or
            ``""`` outside every scope): when allocated for ``"alloc"``, when freed for
            ``"free"``; ``"<untracked>"`` for a plain jax.Array no Tensor holds, ``"<watched>"``
            for one a watched object holds (its alloc timed when the timeline first saw it). For
            scope events, the scope's path.
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


def replay(base: Collection[Any], events: Collection[Any]) -> Iterator[tuple[int, Any, int]]:
    """``(position, event, sign)`` for each of ``base`` (what dropped events left alive) from
    position ``-len(base)``, then each of ``events`` from 0; ``sign``: 1 for an allocation, -1 for
    a free, 0 for an event of no array. Events: TimelineEvents or a recording's tuples of their
    fields. C iterators only: no Python call per event (a page replays 10^5 and more)."""
    kinds = map(operator.itemgetter(0), itertools.chain(base, events))
    return zip(itertools.count(-len(base)), itertools.chain(base, events),
               map(_SIGNS.get, kinds, itertools.repeat(0)))  # fmt: skip


def replay_peak(events: Iterable[Any], start: int = 0) -> tuple[int, int]:
    """The most bytes alive as ``events`` (as in `replay`) are replayed from ``start``, and the
    position of the first event at that many (-1: none rose above ``start``). Its own loop,
    not `replay`'s: it runs over a whole recording (up to a million events), and comparing the
    kind in place measured 1.5x faster than the iterators."""
    most, at, running = start, -1, start
    for i, ev in enumerate(events):
        if ev[0] == ALLOC:  # ev[0]: the kind, ev[2]: the bytes
            running += ev[2]
            if running > most:
                most, at = running, i
        elif ev[0] == FREE:
            running -= ev[2]
    return most, at


def shares(ev: TimelineEvent, unnamed: str = "") -> tuple[tuple[str, int], ...]:
    """The bytes ``ev``'s buffer has on each device: its ``per_device``, else all its ``bytes``
    on its ``device`` (``unnamed`` when that is ``""``)."""
    return ev.per_device or ((ev.device or unnamed, ev.bytes),)


_COLUMNS = ("kind", "time", "bytes", "meta", "scope", "tensors", "buffer", "name", "placement")


class Codec:
    """The JSON layout of events: a column per field, repeated values in tables.

    ``events``, ``base`` and ``peak_live`` each hold the columns ``kind``, ``scope``, ``name``
    (indexes into ``strings``), ``time``, ``bytes``, ``buffer``, ``tensors`` (ids joined by
    ``","``), ``meta`` (an index into ``metas``: ``[device, site, shape, dtype]``, the site an
    index into ``sites``, or -1) and ``placement`` (-1 when all bytes are on ``device``, else an
    index into ``placements``: ``[[device, bytes], ...]``). A row of ``sites`` is ``[frame,
    detail, chain]``, indexes into ``frames`` (``[file, line, function]`` each): the site's own
    frame, its library frame (``detail``; -1 for none) and its chain of user frames, outer to
    inner (``[]`` when the own frame is all of it). In version 1 a row of ``sites`` is ``[file,
    line, function]``, followed by the library frame's ``file, line, function`` when the site
    has a ``detail``, and there is no ``frames``. Columns of numbers and strings keep the file
    small and quick to write and read.
    """

    def __init__(self) -> None:
        self.strings: dict[str, int] = {}
        # (site, its detail: equality ignores it) -> index; a frame (a chain-less Site) -> index
        self.sites: dict[tuple[Site, Site | None], int] = {}
        self.frames: dict[Site, int] = {}
        self.metas: dict[tuple[Any, ...], int] = {}
        self.placements: dict[tuple[tuple[str, int], ...], int] = {}
        self._keep: list[Any] = []  # the sites whose ids key `metas`
        # the rows of ``metas`` (as written, or as read), and the read side's other tables
        self.meta_list: list[Any] = []
        self.placement_list: list[tuple[tuple[str, int], ...]] = []
        self.string_list: list[str] = []
        self.site_list: list[Site] = []

    def _s(self, x: str) -> int:
        return self.strings.setdefault(x, len(self.strings))

    def encode(self, events: list[TimelineEvent]) -> dict[str, list[Any]]:
        s, metas, p = self._s, self.metas, self.placements
        rows = []
        for ev in events:
            key = (ev.device, id(ev.site), ev.shape, ev.dtype)
            m = metas.get(key)
            if m is None:
                si = -1 if ev.site is None else self.site_index(ev.site)
                m = metas[key] = len(metas)
                self.meta_list.append((s(ev.device), si, list(ev.shape), s(ev.dtype)))
            pd, ids = ev.per_device, ",".join(map(str, ev.tensors))
            pl = -1 if pd == ((ev.device, ev.bytes),) else p.setdefault(pd, len(p))
            rows.append(
                (s(ev.kind), ev.time, ev.bytes, m, s(ev.scope), ids, ev.buffer, s(ev.name), pl)
            )
        columns = zip(*rows, strict=True) if rows else [()] * len(_COLUMNS)
        return {c: list(column) for c, column in zip(_COLUMNS, columns, strict=True)}

    def site_index(self, site: Site) -> int:
        """``site``'s row in the ``sites`` table, added if new."""
        self._keep.append(site)
        return self.sites.setdefault((site, site.detail), len(self.sites))

    def _frame(self, site: Site) -> int:
        """The row in ``frames`` of ``site``'s own frame, added if new."""
        frame = Site(site.file, site.line, site.function)
        return self.frames.setdefault(frame, len(self.frames))

    def tables(self) -> dict[str, Any]:
        placements = [[[self._s(d), b] for d, b in pd] for pd in self.placements]
        f = self._frame
        sites = [  # its own frame, its library frame (-1: none), its chain, outer to inner
            [f(site), -1 if site.detail is None else f(site.detail), [f(x) for x in site.chain]]
            for site, _ in self.sites
        ]
        frames = [[x.file, x.line, x.function] for x in self.frames]
        return {"strings": list(self.strings), "frames": frames, "sites": sites,
                "metas": self.meta_list, "placements": placements}  # fmt: skip

    @classmethod
    def read(cls, data: dict[str, Any]) -> Codec:
        """The tables of ``data`` (see the class), each value checked.

        Raises:
            KeyError: a table is missing.
            ValueError: a table or a row is not as `encode` writes it.
        """
        codec = cls()
        strings = codec.string_list = _table(data, "strings", _is_str, "a str")
        sites = codec.site_list = _sites(data)
        in_strings = _below(len(strings))
        meta = _row(in_strings, _below(len(sites), -1), _all(is_count), in_strings)
        metas = _table(
            data, "metas", meta, '[device, site, shape, dtype] (indexes into "strings", "sites")'
        )
        codec.meta_list = [
            (strings[d], None if si < 0 else sites[si], tuple(shape), strings[dt])
            for d, si, shape, dt in metas
        ]
        placements = _table(data, "placements", _all(_row(in_strings, is_count)),
                            '[[device, bytes], ...] (devices index "strings")')  # fmt: skip
        codec.placement_list = [tuple((strings[d], b) for d, b in pd) for pd in placements]
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
        n, times = len(columns[0]), cols["time"]
        if any(len(c) != n for c in columns):
            raise TidyjaxValueError(f"{malformed} columns differ in length.")
        checks = self._checks()
        i = min(_first(ok, cols[c]) for c, (ok, _) in checks.items())
        if i < n:  # the first check the event fails
            c, expected = next((c, x) for c, (ok, x) in checks.items() if not ok(cols[c][i]))
            bad = f"its {c} {short(cols[c][i])} is not {expected}"
        elif what == "event" and (i := _first(operator.le, [0.0, *times], times)) < n:
            bad = f"its time {times[i]!r} is before the event before it ({times[i - 1]!r})"
        if i < n:
            raise TidyjaxValueError(f"{where}: {what} {i} is malformed ({bad}).")
        strings, metas, placements = self.string_list, self.meta_list, self.placement_list
        one: dict[tuple[str, int], tuple[tuple[str, int], ...]] = {}
        out = []
        for k, t, b, m, sc, ids, buf, nm, pl in zip(*columns, strict=True):
            device, site, shape, dtype = metas[m]
            pd = placements[pl] if pl >= 0 else one.setdefault((device, b), ((device, b),))
            out.append(TimelineEvent(
                strings[k], t, b, device, site, strings[sc], shape, dtype,
                tuple(map(int, ids.split(","))) if ids else (), buf, strings[nm], pd,
            ))  # fmt: skip
        return out

    def _checks(self) -> dict[str, tuple[Callable[[Any], bool], str]]:
        """Each column's check, in the order an event's values are checked, and what it holds."""
        strings, ns = self.string_list, len(self.string_list)
        in_strings = (_below(ns), 'an index into "strings"')
        return {
            "kind": (
                lambda k: type(k) is int and 0 <= k < ns and strings[k] in KINDS,
                'an index into "strings" of an event kind',
            ),
            "scope": in_strings,
            "name": in_strings,
            "time": (
                lambda t: type(t) is float and 0.0 <= t < TIME_LIMIT,
                "a perf_counter reading",
            ),
            "bytes": (is_count, "an int from 0"),
            "buffer": (is_count, "an int from 0"),
            "meta": (_below(len(self.meta_list)), 'an index into "metas"'),
            "placement": (_below(len(self.placement_list), -1), '-1 or an index into "placements"'),
            "tensors": (_is_ids, "Tensor ids joined by ','"),
        }


def _first(ok: Callable[..., bool], *columns: list[Any]) -> int:
    """The first row where ``ok`` fails (``len(columns[-1])``: none)."""
    return next((i for i, good in enumerate(map(ok, *columns)) if not good), len(columns[-1]))


def _below(n: int, low: int = 0) -> Callable[[Any], bool]:
    """A check that a value is an int from ``low`` below ``n`` (an index into a table)."""
    return lambda i: type(i) is int and low <= i < n


def _is_ids(ids: Any) -> bool:
    """``ids`` is an event's ``tensors``: decimal Tensor ids joined by ``","``."""
    return type(ids) is str and (
        not ids or all(p.isascii() and p.isdigit() and len(p) < 19 for p in ids.split(","))
    )


def _table(
    data: dict[str, Any], key: str, ok: Callable[[Any], bool], expected: str, *, old: bool = False
) -> list[Any]:
    """The rows of the table ``data[key]``, each checked by ``ok`` (``expected``: what a row is,
    in words). ``old``: a table older files lack (none when missing or null).

    Raises:
        KeyError: the table is missing (and not ``old``).
        ValueError: it is not a list, or a row is not as `encode` writes it.
    """
    rows = [] if old and data.get(key) is None else data[key]
    if type(rows) not in _SEQ:
        raise ValueError(f"{key!r} is {short(rows)}, not a list")
    for row in rows:
        if not ok(row):
            raise ValueError(f'a row of "{key}" is {short(row)}, not {expected}')
    return rows


def _is_str(x: Any) -> bool:
    return type(x) is str


def _row(*checks: Callable[[Any], bool]) -> Callable[[Any], bool]:
    """A check that a value is a JSON array of one value per check, each passing its own."""
    return lambda r: (
        type(r) in _SEQ
        and len(r) == len(checks)
        and all(ok(x) for ok, x in zip(checks, r, strict=True))
    )


def _all(ok: Callable[[Any], bool]) -> Callable[[Any], bool]:
    """A check that a value is a JSON array of values that each pass ``ok``."""
    return lambda r: type(r) in _SEQ and all(map(ok, r))


def _or_none(ok: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda x: x is None or ok(x)


_FRAME = (_is_str, is_count, _is_str)
#: ``[file, line, function]``.
_is_frame = _row(*_FRAME)


def _is_site(row: Any) -> bool:
    """``row`` is a version-1 site: ``[file, line, function]``, followed by the library frame's
    when the site has a ``detail``."""
    return _is_frame(row) or _row(*_FRAME, *_FRAME)(row)


def _sites(data: dict[str, Any]) -> list[Site]:
    """The ``sites`` table of ``data`` (see `Codec`), each row checked: in version 2 each site
    with its chain, in version 1 a site of one frame.

    Raises:
        KeyError: a table is missing.
        ValueError: a row is not as `Codec` writes it.
    """
    if data["version"] == 1:
        return [
            Site(row[0], row[1], row[2], Site(row[3], row[4], row[5]) if len(row) == 6 else None)
            for row in _table(data, "sites", _is_site, "[file, line, function] (3 or 6 fields)")
        ]
    frames = [Site(*row) for row in _table(data, "frames", _is_frame, "[file, line, function]")]
    frame = _below(len(frames))
    rows = _table(data, "sites", _row(frame, _below(len(frames), -1), _all(frame)),
                  '[frame, detail, chain] (indexes into "frames", detail -1 for none)')  # fmt: skip
    out = []
    for own, detail, chain in rows:
        f, lib = frames[own], None if detail < 0 else frames[detail]
        frames_of = tuple(frames[i] for i in chain) if len(chain) > 1 else ()
        out.append(Site(f.file, f.line, f.function, lib, chain=frames_of))
    return out


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
    with collector_paused():
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
) -> tuple[dict[Site, list[tuple[Site, ...]]], dict[int, str], list[Mark]]:
    """The ``stacks``, ``names`` and ``marks`` (in time order) of `encode`'s data (empty when
    the file has none).

    Raises:
        ValueError: a row is not as `encode` writes it.
    """
    sites, stack = codec.site_list, _all(_is_frame)
    stacks = {
        sites[site]: [tuple(Site(*f) for f in st) for st in sts]
        for site, *sts in _table(data, "stacks", lambda r: (
            type(r) in _SEQ and len(r) > 0 and _below(len(sites))(r[0]) and all(map(stack, r[1:]))
        ), '[site, [[file, line, function], ...], ...] (site indexes "sites")', old=True)
    }  # fmt: skip
    names = _table(data, "names", _row(is_count, _is_str), "[buffer, name]", old=True)
    marks = _table(data, "marks", _row(is_clock, _is_str, _or_none(is_count)),
                   "[time, label, bytes or null]", old=True)  # fmt: skip
    marks = [Mark(float(t), label, b) for t, label, b in marks]
    return stacks, dict(names), sorted(marks, key=lambda m: m.time)


#: The header's fields, what each must be, and what that is in words. Each is checked when
#: present; a missing one is named when the timeline is decoded.
_HEADER: dict[str, tuple[Any, str]] = {
    "started_at": (_or_none(is_unix_time), "null or a Unix time"),
    "start_time": (_or_none(is_clock), "null or a perf_counter reading"),
    "stop_time": (_or_none(is_clock), "null or a perf_counter reading"),
    "max_events": (lambda x: is_count(x) and x >= 1, "an int from 1"),
    "dropped": (is_count, "an int from 0"),
    "peak_bytes": (is_count, "an int from 0"),
    "peak_time": (is_clock, "a perf_counter reading"),
    "events": (lambda x: type(x) is dict, "an object of columns"),
    "base": (lambda x: type(x) is dict, "an object of columns"),
    "peak_live": (_or_none(lambda x: type(x) is dict), "null or an object of columns"),
    "unseen": (_or_none(_is_str), "null or a str"),  # Timeline.unseen; older files lack it
}
#: The timeline's own numbers, which `encode` writes first, in this order.
HEADER = tuple(_HEADER)[:7]


def check(data: Any, where: str) -> dict[str, Any]:
    """``data`` itself when it is a timeline of the version this tidyjax reads, its header's
    fields of the right types and in range (the events and tables are checked as decoded).

    Raises:
        TidyjaxValueError: it is not a tidyjax timeline, has no version or one no tidyjax
            writes, is of a format version this tidyjax does not read (`VERSIONS`: a newer
            one), or a field of its header is malformed.
    """
    version = data.get("version") if isinstance(data, dict) else None
    version = version if type(version) is int and version in VERSIONS else VERSION
    check_file(data, where, "timeline", version, "Timeline.dump(path)")
    for key, (ok, expected) in _HEADER.items():
        if key in data and not ok(data[key]):
            raise TidyjaxValueError(
                f'{where} is a malformed tidyjax timeline: its "{key}" is {short(data[key])}, '
                f"not {expected}."
            )
    return data


def write(data: dict[str, Any], path: str | os.PathLike[str]) -> None:
    """Write ``data`` to ``path`` as compact JSON (UTF-8)."""
    pathlib.Path(path).write_text(json.dumps(data, separators=(",", ":")), encoding="utf-8")


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


# -- the timeline as Chrome trace-event JSON ----------------------------------------------------

#: The one process of the trace.
_PID = 1
_TID_BUFFERS = 1
_TID_SCOPES = 2  # the first scopes thread; more follow where scopes overlap without nesting
#: The counter's one series: Perfetto names the track "<event name> <arg>" ("cpu:0 bytes in use").
_COUNTER = "bytes in use"


def _us(t: float, t0: float) -> float:
    """``t`` (seconds, ``perf_counter``'s clock) as microseconds since ``t0``, to 0.001 us."""
    return round((t - t0) * 1e6, 3)


def _counters(
    base: list[TimelineEvent], events: list[TimelineEvent], t0: float, start: float
) -> list[dict[str, Any]]:
    """The counter events: each device's bytes after every change, one value per moment."""
    changes = [(start, 1, shares(ev, "device")) for ev in base]  # alive since dropped events
    changes += [(ev.time, sign, shares(ev, "device")) for _, ev, sign in replay((), events) if sign]
    devices = dict.fromkeys((d for _, _, pairs in changes for d, _ in pairs), 0)
    total = "all devices" if len(devices) > 1 else None
    # per track, its value at each moment (the latest); times only grow
    values = {track: {_us(start, t0): 0} for track in ([*devices, total] if total else devices)}
    for t, sign, pairs in changes:
        ts = _us(t, t0)
        for d, b in pairs:
            devices[d] = values[d][ts] = devices[d] + sign * b
        if total:
            values[total][ts] = sum(devices.values())
    return [
        {"name": track, "cat": "memory", "ph": "C", "ts": ts, "pid": _PID, "tid": 0,
         "args": {_COUNTER: value}}
        for track, by_time in values.items() for ts, value in by_time.items()
    ]  # fmt: skip


def _scope_slices(
    events: list[TimelineEvent], t0: float, start: float, end: float
) -> list[list[dict[str, Any]]]:
    """The scopes as complete slices, one list per thread, each sorted and properly nested."""
    spans: dict[int, list[Any]] = {}  # scope number -> [start, end, name, path]
    for ev in events:
        if ev.kind in (SCOPE_ENTER, SCOPE_EXIT):  # an exit alone: entered before the events kept
            span = spans.setdefault(ev.buffer, [start, end, ev.name or "<tidy>", ev.scope])
            span[ev.kind == SCOPE_EXIT] = ev.time
    ordered = sorted(spans.values(), key=lambda span: (span[0], -span[1]))
    lanes: list[list[float]] = []  # per thread: the ends of the slices open there
    threads: list[list[dict[str, Any]]] = []
    for s, e, name, path in ordered:
        i = _lane(lanes, s, e)
        if i == len(lanes):
            lanes.append([])
            threads.append([])
        lanes[i].append(e)
        ts = _us(s, t0)
        threads[i].append({
            "name": name, "cat": "scope", "ph": "X", "ts": ts, "dur": max(0.0, _us(e, t0) - ts),
            "pid": _PID, "tid": _TID_SCOPES + i, "args": {"path": path},
        })  # fmt: skip
    return threads


def _lane(lanes: list[list[float]], start: float, end: float) -> int:
    """The first thread where a slice from ``start`` to ``end`` nests (``len(lanes)``: none)."""
    for i, stack in enumerate(lanes):
        while stack and stack[-1] <= start:  # slices ended by now: the later ones start later
            stack.pop()
        if not stack or end <= stack[-1]:
            return i
    return len(lanes)


def _instants(events: list[TimelineEvent], t0: float) -> list[dict[str, Any]]:
    return [{
        "name": f"{ev.kind} {describe(ev)} {fmt_bytes(ev.bytes)}", "cat": ev.kind, "ph": "i",
        "s": "t", "ts": _us(ev.time, t0), "pid": _PID, "tid": _TID_BUFFERS,
        "args": {
            "bytes": ev.bytes, "device": ev.device, "site": site_label(ev.site),
            "scope": ev.scope, "shape": list(ev.shape), "dtype": ev.dtype,
            "buffer": ev.buffer, "tensors": list(ev.tensors),
        },
    } for ev in events if ev.kind in _SIGNS]  # fmt: skip


def _moments(tl: Any, t0: float, start: float | None) -> list[dict[str, Any]]:
    """Global instants: the peak and each annotation (`Timeline.annotate`), those from
    ``start`` on (``None``: all)."""
    moments = [(f"peak {fmt_bytes(tl.peak_bytes)}", "peak", tl.peak_time, tl.peak_bytes)]
    moments = moments if tl.peak_bytes else []
    moments += [(m.label, "annotation", m.time, m.bytes) for m in getattr(tl, "annotations", ())]
    return [
        {"name": name, "cat": cat, "ph": "i", "s": "g", "ts": _us(t, t0), "pid": _PID, "tid": 0,
         "args": {} if nbytes is None else {"bytes": nbytes}}
        for name, cat, t, nbytes in moments
        if start is None or t >= start
    ]  # fmt: skip


def chrome_trace(tl: Any, *, buffers: bool = True) -> dict[str, Any]:
    """``tl`` (a ``tidyjax.Timeline``) as trace-event JSON data (the JSON Object Format).

    Args:
        tl: the timeline.
        buffers: also an instant event per allocation and free (with its site, scope, shape).
    """
    base, events = tl._window()
    first, last = (events[0].time, events[-1].time) if events else (None, None)
    t0 = min((t for t in (tl.start_time, first) if t is not None), default=0.0)
    end = max((t for t in (tl.stop_time, last) if t is not None), default=t0)
    start = t0 if first is None or not tl.dropped else first  # before the kept events: unknown
    threads = _scope_slices(events, t0, start, end)
    names = [("process", 0, "tidyjax memory")]
    names += [("thread", _TID_BUFFERS, "buffers")] if buffers else []
    names += [
        ("thread", _TID_SCOPES + i, f"scopes {i + 1}" if i else "scopes")
        for i in range(len(threads))
    ]
    trace = [
        {"name": f"{what}_{key}", "ph": "M", "pid": _PID, "tid": tid, "args": {key: value}}
        for what, tid, name in names
        for key, value in (("name", name), ("sort_index", tid))
    ]
    trace += _counters(base, events, t0, start)
    trace += [s for slices in threads for s in slices]
    if buffers:
        trace += _instants(events, t0)
    trace += _moments(tl, t0, start if events else None)
    other = {"producer": "tidyjax", "started_at": tl.started_at, "peak_bytes": tl.peak_bytes,
             "dropped_events": tl.dropped}  # fmt: skip
    return {"traceEvents": trace, "displayTimeUnit": "ms", "otherData": other}


def write_chrome_trace(
    tl: Any, path: str | os.PathLike[str], *, buffers: bool = True
) -> pathlib.Path:
    """Write `chrome_trace` of ``tl`` to ``path`` (gzip-compressed when it ends in
    ``.gz``), creating missing parent folders; returns the path written."""
    target = pathlib.Path(os.fspath(path))
    data = json.dumps(chrome_trace(tl, buffers=buffers), separators=(",", ":")).encode("utf-8")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(gzip.compress(data) if target.name.endswith(".gz") else data)
    return target


# -- XLA temporaries: a table of their own -----------------------------------------------------
#
# A ``"temporaries"`` event is written apart from the event columns, in the optional table
# ``"temporaries"``: ``[position, time, bytes, device, scope, name, [[device, bytes], ...]]``,
# ``position`` how many events of the columns come before it. A file without the table (older)
# reads as before, and a tidyjax of the same format version that predates the table reads a
# newer file, without the temporaries (the table came within version 1).

_TEMP_ROW = "[position, time, bytes, device, scope, name, [[device, bytes], ...]]"


def split_temporaries(events: list[TimelineEvent]) -> tuple[list[TimelineEvent], list[Any]]:
    """The events of the columns, and the rows of the ``"temporaries"`` table."""
    kept: list[TimelineEvent] = []
    rows: list[Any] = []
    for ev in events:
        if ev.kind == TEMPORARIES:
            pairs = [[d, b] for d, b in ev.per_device]
            rows.append([len(kept), ev.time, ev.bytes, ev.device, ev.scope, ev.name, pairs])
        else:
            kept.append(ev)
    return kept, rows


def _is_temp_row(r: Any) -> bool:
    return (
        type(r) in _SEQ
        and len(r) == 7
        and is_count(r[0])
        and is_clock(r[1])
        and is_count(r[2])
        and all(type(x) is str for x in (r[3], r[4], r[5]))
        and type(r[6]) in _SEQ
        and all(type(p) in _SEQ and len(p) == 2 and type(p[0]) is str and is_count(p[1])
                for p in r[6])
    )  # fmt: skip


def merge_temporaries(data: Any, events: list[Any], where: str) -> list[Any]:
    """``events`` (decoded from the columns) with the ``"temporaries"`` table's events put
    back where they were recorded.

    Raises:
        TidyjaxValueError: the table is not a list of such rows.
    """
    rows = data.get("temporaries")
    if rows is None:
        return events
    if type(rows) not in _SEQ or not all(map(_is_temp_row, rows)):
        raise TidyjaxValueError(
            f'{where} is a malformed tidyjax timeline: its "temporaries" is not a list of '
            f"{_TEMP_ROW}."
        )
    out: list[Any] = []
    done = 0
    for pos, t, b, device, scope, name, pairs in sorted(rows, key=lambda r: r[0]):
        out += events[done:pos]
        done = max(done, pos)
        per = tuple((d, int(n)) for d, n in pairs)
        out.append(TimelineEvent(TEMPORARIES, float(t), b, device, None, scope, (), "", (), 0,
                                 name, per))  # fmt: skip
    return out + events[done:]
