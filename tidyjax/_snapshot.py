"""Snapshots of the live Tensors (and of the jax arrays tidyjax does not own), grouped by
creation site, and their diffs: ``snapshot()``, `Snapshot`, `SiteStat`,
`Snapshot.compare_to` and `SiteDiff`, in the manner of ``tracemalloc``; a
snapshot's JSON file (``dump``/``load``).
"""

from __future__ import annotations

import collections
import json
import os
import time
from collections.abc import Iterable
from typing import Any

from . import _html
from ._errors import TidyjaxTypeError, TidyjaxValueError, check_flag
from ._format import count as _count
from ._format import describe, esc, signed_bytes
from ._format import fmt_bytes as _fmt_bytes
from ._records import ESCAPED, UNTRACKED, WATCHED, TensorRecord, live_tensors, summary

__all__ = [
    "SiteDiff",
    "SiteDiffList",
    "SiteStat",
    "Snapshot",
    "group_by_site",
    "site_key",
    "site_text",
    "snapshot",
    "stats_html",
]


#: What a site's key ends with when its records are arrays only watched objects hold.
_WATCHED_SUFFIX = " (watched)"
#: What a site's key ends with when its records are jax arrays tidyjax does not own.
_UNTRACKED_SUFFIX = " (untracked)"
#: What a site's key ends with when its records are buffers of tidyjax's no Tensor holds.
_ESCAPED_SUFFIX = " (escaped)"


def site_text(r: TensorRecord) -> str:
    """The record's creation site as text, ``"<unknown site>"`` when JAX kept none."""
    return str(r.site) if r.site is not None else "<unknown site>"


def site_key(r: TensorRecord) -> str:
    """A site as the reports group by it; watched and untracked arrays apart from Tensors made
    there, their keys ending in ``" (watched)"`` and ``" (untracked)"``."""
    site = site_text(r)
    if r.scope == WATCHED:
        return site + _WATCHED_SUFFIX
    if r.scope == UNTRACKED:
        return site + _UNTRACKED_SUFFIX
    if r.scope == ESCAPED:
        return site + _ESCAPED_SUFFIX
    return site


def _noun(site: str) -> str:
    if site.endswith(_WATCHED_SUFFIX):
        return "watched array"
    if site.endswith(_ESCAPED_SUFFIX):
        return "escaped array"
    return "untracked array" if site.endswith(_UNTRACKED_SUFFIX) else "tensor"


def _kind(r: TensorRecord) -> str:
    """``"<watched>"``, ``"<untracked>"``, ``"<escaped>"``, or ``""`` for a Tensor: each counts
    its buffers apart."""
    return r.scope if r.scope in (WATCHED, UNTRACKED, ESCAPED) else ""


class SiteStat:
    """The live Tensors created at one site: how many, their bytes (shared buffers once).

    The arrays that only watched objects hold are a row of their own, their site ending in
    ``" (watched)"`` (``watched`` is True), counted as watched arrays, not Tensors; so are the
    jax arrays tidyjax does not own, their site ending in ``" (untracked)"`` (``untracked`` is
    True).
    """

    __slots__ = ("bytes", "count", "shapes", "site")

    def __init__(self, site: str, count: int, bytes: int, shapes: dict[str, int]) -> None:
        self.site, self.count, self.bytes, self.shapes = site, count, bytes, shapes

    @property
    def watched(self) -> bool:
        """Whether the row counts arrays only watched objects hold (not Tensors)."""
        return self.site.endswith(_WATCHED_SUFFIX)

    @property
    def untracked(self) -> bool:
        """Whether the row counts jax arrays tidyjax does not own (not Tensors)."""
        return self.site.endswith(_UNTRACKED_SUFFIX)

    def __str__(self) -> str:
        shapes = ", ".join(f"{s} ×{n}" if n > 1 else s for s, n in self.shapes.items())  # noqa: RUF001
        count = _count(self.count, _noun(self.site))
        return f"{self.site}: {count}, {_fmt_bytes(self.bytes)} [{shapes}]"

    def __repr__(self) -> str:
        return f"SiteStat({self.site!r}, count={self.count}, bytes={self.bytes})"


class SiteDiff:
    """A site's change between two snapshots, as ``tracemalloc.StatisticDiff``; its site ends in
    ``" (untracked)"`` (``untracked`` is True) for jax arrays tidyjax does not own, in
    ``" (watched)"`` for arrays only watched objects hold."""

    __slots__ = ("bytes", "bytes_diff", "count", "count_diff", "site")

    def __init__(self, site: str, count: int, count_diff: int, bytes: int, bytes_diff: int):
        self.site, self.count, self.count_diff = site, count, count_diff
        self.bytes, self.bytes_diff = bytes, bytes_diff

    @property
    def untracked(self) -> bool:
        """Whether the row counts jax arrays tidyjax does not own (not Tensors)."""
        return self.site.endswith(_UNTRACKED_SUFFIX)

    def __str__(self) -> str:
        sign = "+" if self.bytes_diff >= 0 else "-"
        return (
            f"{self.site}: {_fmt_bytes(self.bytes)} ({sign}{_fmt_bytes(abs(self.bytes_diff))}), "
            f"{_count(self.count, _noun(self.site))} ({self.count_diff:+d})"
        )

    def __repr__(self) -> str:
        return (
            f"SiteDiff({self.site!r}, count={self.count}, count_diff={self.count_diff}, "
            f"bytes={self.bytes}, bytes_diff={self.bytes_diff})"
        )


def group_by_site(records: Iterable[TensorRecord]) -> dict[str, SiteStat]:
    groups: dict[str, list[TensorRecord]] = collections.defaultdict(list)
    for r in records:
        groups[site_key(r)].append(r)
    out = {}
    claimed: set[tuple[str, int]] = set()  # a buffer counts once, in its first record's row
    for site, rs in groups.items():
        nbytes = 0
        for r in rs:
            key = (_kind(r), r._buffer)
            if key not in claimed:
                claimed.add(key)
                nbytes += r.bytes
        shapes = collections.Counter(describe(r) for r in rs)
        out[site] = SiteStat(site, len(rs), nbytes, dict(shapes))
    return out


class Snapshot:
    """The live Tensors at one moment, and the jax arrays tidyjax does not own then; compare two
    with [`compare_to`][tidyjax.Snapshot.compare_to].

    ``records`` holds the Tensors' records (and those of arrays only watched objects hold),
    ``untracked`` the untracked arrays' (scope ``"<untracked>"``, id 0): records given with
    that scope go there.

    Example:
        ```python
        before = tidyjax.snapshot()
        run_some_steps()
        for diff in tidyjax.snapshot().compare_to(before)[:5]:
            print(diff)
        ```
    """

    __slots__ = ("records", "taken_at", "untracked")

    records: tuple[TensorRecord, ...]
    untracked: tuple[TensorRecord, ...]

    def __init__(self, records: Iterable[TensorRecord], taken_at: float | None = None) -> None:
        every = tuple(records)
        self.records = tuple(r for r in every if r.scope != UNTRACKED)
        self.untracked = tuple(r for r in every if r.scope == UNTRACKED)
        self.taken_at = time.time() if taken_at is None else taken_at

    def __repr__(self) -> str:
        return f"<Snapshot of {summary(self.records + self.untracked)}>"

    def _repr_html_(self) -> str:
        stats = self.statistics()
        title = summary(self.records + self.untracked)
        return stats_html(title, [s for s in stats if not s.untracked]) + _untracked_html(
            [s for s in stats if s.untracked]
        )

    def __str__(self) -> str:
        stats = self.statistics()
        lines = [summary(self.records + self.untracked)]
        lines += [f"  {s}" for s in stats if not s.untracked]
        untracked = [s for s in stats if s.untracked]
        if untracked:
            lines.append("  untracked (jax arrays tidyjax does not own), by creation site:")
            lines += [f"    {s}" for s in untracked]
        return "\n".join(lines)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(str(self))

    def statistics(self) -> list[SiteStat]:
        """One `SiteStat` per creation site, largest first (the watched arrays made at
        a site a row apart), then the untracked arrays' sites (``untracked`` True), largest
        first. Their counts and bytes add up to the headline's, each buffer in the row of its
        first record."""
        return sorted(
            group_by_site(self.records + self.untracked).values(),
            key=lambda s: (s.untracked, -s.bytes, -s.count, s.site),
        )

    def compare_to(self, old: Snapshot) -> SiteDiffList:
        """Per-site differences from ``old``, the largest change in bytes first (a list): the
        Tensors' sites (and watched arrays'), then the untracked arrays' (``untracked`` True).
        A snapshot taken with ``snapshot(untracked=False)`` has no untracked arrays."""
        if not isinstance(old, Snapshot):
            raise TidyjaxTypeError(f"compare_to() takes a Snapshot, got {type(old).__name__}.")
        new_g = group_by_site(self.records + self.untracked)
        old_g = group_by_site(old.records + old.untracked)
        diffs = []
        for site in new_g.keys() | old_g.keys():
            n, o = new_g.get(site), old_g.get(site)
            count, nbytes = (n.count, n.bytes) if n else (0, 0)
            ocount, obytes = (o.count, o.bytes) if o else (0, 0)
            if (count, nbytes) != (ocount, obytes):
                diffs.append(SiteDiff(site, count, count - ocount, nbytes, nbytes - obytes))
        diffs.sort(key=lambda d: (d.untracked, -abs(d.bytes_diff), -abs(d.count_diff), d.site))
        return SiteDiffList(diffs)

    # -- export: JSON, schema in README ("Snapshot files") ----------------------------------

    def to_json(self) -> dict[str, Any]:
        return {
            "format": "tidyjax.snapshot",
            "version": 1,
            "taken_at": self.taken_at,
            "tensors": [r.to_json() for r in self.records + self.untracked],
        }

    def dump(self, path: str | os.PathLike[str]) -> None:
        """Write the snapshot as JSON (see the README for the schema)."""
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.to_json(), f, indent=1)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Snapshot:
        """Read a snapshot written by [`dump`][tidyjax.Snapshot.dump].

        Raises:
            TidyjaxValueError: the file is not JSON, not a tidyjax snapshot of format version
                1, or a malformed one (a field missing or of the wrong type); the message says
                which.
        """
        with open(path, encoding="utf-8") as f:
            try:
                data = json.load(f)
            except json.JSONDecodeError as e:
                raise TidyjaxValueError(f"{path} is not a JSON file ({e}).") from e
        if not isinstance(data, dict) or data.get("format") != "tidyjax.snapshot":
            raise TidyjaxValueError(
                f'{path} is not a tidyjax snapshot (no "format": "tidyjax.snapshot"); write one '
                "with tidyjax.snapshot().dump(path)."
            )
        if data.get("version") != 1:
            raise TidyjaxValueError(
                f"{path} is a tidyjax snapshot of format version {data.get('version')!r}; this "
                "tidyjax reads version 1. Upgrade tidyjax to read it."
            )
        where = "the file"
        try:
            taken_at = float(data["taken_at"])
            records = []
            for i, d in enumerate(data["tensors"]):
                where = f"tensors[{i}]"
                records.append(TensorRecord.from_json(d))
        except KeyError as e:
            raise TidyjaxValueError(
                f"{path} is a malformed tidyjax snapshot: {where} has no {e} field."
            ) from e
        except (TypeError, ValueError, AttributeError) as e:
            raise TidyjaxValueError(
                f"{path} is a malformed tidyjax snapshot: {where} is not as written by dump() "
                f"({e})."
            ) from e
        return cls(records, taken_at)


def snapshot(*, untracked: bool = True) -> Snapshot:
    """A `Snapshot` of the live Tensors now, and of the jax arrays tidyjax does not own
    (``Snapshot.untracked``, grouped by the user's line that made them).

    Args:
        untracked: False leaves the untracked arrays out (and the scan of
            ``jax.live_arrays()`` they cost).
    """
    untracked = check_flag(untracked, "untracked", "snapshot()")
    return Snapshot(live_tensors(untracked=untracked))


class SiteDiffList(list[SiteDiff]):
    """What `Snapshot.compare_to` returns: a list of `SiteDiff` that shows itself
    as a table in Jupyter."""

    def _repr_html_(self) -> str:
        return _diffs_html(self)


@_html.never_raises
def _diffs_html(diffs: list[SiteDiff]) -> str:
    if not diffs:
        return _html.box("<b>no change</b> between the snapshots")
    head = f"<b>{esc(_count(len(diffs), 'site'))} changed</b>, the largest change first"
    parts = [head]
    for untracked in (False, True):
        rows = [
            (esc(d.site), d.count, f"{d.count_diff:+d}", esc(_fmt_bytes(d.bytes)),
             esc(signed_bytes(d.bytes_diff)))
            for d in diffs if d.untracked == untracked
        ]  # fmt: skip
        if not rows:
            continue
        if untracked:
            parts.append(_html.line(_html.dim(_UNTRACKED_NOTE)))
        noun = "arrays" if untracked else "tensors"
        header = ["created at", noun, "change", "bytes", "change"]
        parts.append(_html.table(header, rows, numeric={1, 2, 3, 4}))
    return _html.box(*parts)


_UNTRACKED_NOTE = "untracked: jax arrays tidyjax does not own, by the line that made them"


@_html.never_raises
def _untracked_html(stats: list[SiteStat]) -> str:
    """The untracked arrays' sites, a table apart from the Tensors' (none if none)."""
    if not stats:
        return ""
    rows = [
        (esc(s.site), s.count, esc(_fmt_bytes(s.bytes)),
         esc(", ".join(f"{k} ×{n}" for k, n in s.shapes.items())))  # noqa: RUF001
        for s in stats
    ]  # fmt: skip
    table = _html.table(["created at", "arrays", "bytes", "shapes"], rows, numeric={1, 2})
    return _html.box(_html.line(_html.dim(_UNTRACKED_NOTE)), table)


def stats_html(title: str, stats: list[SiteStat], bad: bool = False, note: str = "") -> str:
    @_html.never_raises
    def build(_: object) -> str:
        rows = [
            (esc(s.site), s.count, esc(_fmt_bytes(s.bytes)),
             esc(", ".join(f"{k} ×{n}" for k, n in s.shapes.items())))  # noqa: RUF001
            for s in stats
        ]  # fmt: skip
        head = _html.bad(title) if bad else f"<b>{esc(title)}</b>"
        table = _html.table(["created at", "tensors", "bytes", "shapes"], rows, numeric={1, 2})
        return _html.box(head, table if rows else "", _html.line(_html.dim(note)) if note else "")

    return build(None)
