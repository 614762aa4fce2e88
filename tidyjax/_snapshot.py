"""Snapshots of the live Tensors (and of the jax arrays tidyjax does not own), grouped by
creation site, and their diffs: ``snapshot()``, `Snapshot`, `Snapshot.compare_to` and
`SiteDiff`, in the manner of ``tracemalloc``; a snapshot's JSON file (``dump``/``load``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Iterable
from typing import Any

from . import _html
from ._census import (
    NOUNS,
    UNTRACKED,
    Site,
    SiteStat,
    TensorRecord,
    census,
    site_key,
    site_label,
    site_table,
    statistics,
    summary,
)
from ._errors import TidyjaxTypeError, TidyjaxValueError, check_flag
from ._format import count, esc, fmt_bytes
from ._timeline_format import check_file, is_count, is_unix_time, read, short

__all__ = ["VERSION", "SiteDiff", "SiteDiffList", "SiteStat", "Snapshot", "snapshot"]

#: The snapshot file format written: 2 adds each site's ``chain`` of user frames; a file of
#: format 1 still loads (its sites a chain of one frame).
VERSION = 2


@dataclasses.dataclass(frozen=True, slots=True)
class SiteDiff:
    """A site's change between two snapshots, as ``tracemalloc.StatisticDiff``: a
    [`SiteStat`][tidyjax.SiteStat]'s ``site`` and ``kind``, its ``count`` and ``bytes`` now,
    and their change."""

    site: Site | None
    kind: str
    count: int
    count_diff: int
    bytes: int
    bytes_diff: int

    @property
    def untracked(self) -> bool:
        """Whether the row counts jax arrays tidyjax does not own (not Tensors)."""
        return self.kind == "untracked"

    @property
    def label(self) -> str:
        return site_label(self.site, self.kind)

    def __str__(self) -> str:
        sign = "+" if self.bytes_diff >= 0 else "-"
        return (
            f"{self.label}: {fmt_bytes(self.bytes)} ({sign}{fmt_bytes(abs(self.bytes_diff))}), "
            f"{count(self.count, NOUNS[self.kind])} ({self.count_diff:+d})"
        )


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

    def __init__(self, records: Iterable[TensorRecord], taken_at: float | None = None) -> None:
        every = tuple(records)
        self.records = tuple(r for r in every if r.scope != UNTRACKED)
        self.untracked = tuple(r for r in every if r.scope == UNTRACKED)
        self.taken_at = time.time() if taken_at is None else taken_at

    def __repr__(self) -> str:
        return f"<Snapshot of {summary(self.records + self.untracked)}>"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(str(self))

    @_html.never_raises
    def _repr_html_(self) -> str:
        head = f"<b>{esc(summary(self.records + self.untracked))}</b>"
        return _html.box(head, *_tables(self.statistics()))

    def __str__(self) -> str:
        stats = self.statistics()
        lines = [summary(self.records + self.untracked)]
        lines += [f"  {s}" for s in stats if not s.untracked]
        untracked = [s for s in stats if s.untracked]
        if untracked:
            lines.append("  untracked (jax arrays tidyjax does not own), by creation site:")
            lines += [f"    {s}" for s in untracked]
        return "\n".join(lines)

    def statistics(self, by: tuple[str, ...] = ("site",)) -> list[SiteStat]:
        """One [`SiteStat`][tidyjax.SiteStat] per kind and creation site (``by``: also, or
        instead, ``"scope"`` or ``"name"``), largest first, the untracked arrays' last. Their
        counts and bytes add up to the headline's, each buffer in the row of its first record."""
        stats = statistics(self.records + self.untracked, by)
        return sorted(stats, key=lambda s: s.untracked)  # stable: largest first in each part

    def compare_to(self, old: Snapshot) -> SiteDiffList:
        """Per-site differences from ``old``, the largest change in bytes first (a list): the
        Tensors' sites (and watched arrays'), then the untracked arrays' (``untracked`` True).
        A site is its whole chain of user frames (``site.chain``): one line reached through two
        callers is two rows; a snapshot loaded from a format-1 file knows one frame per site.
        A snapshot taken with ``snapshot(untracked=False)`` has no untracked arrays."""
        if not isinstance(old, Snapshot):
            raise TidyjaxTypeError(f"compare_to() takes a Snapshot, got {type(old).__name__}.")
        new_g = {(s.kind, site_key(s.site), s.name): s for s in self.statistics()}
        old_g = {(s.kind, site_key(s.site), s.name): s for s in old.statistics()}
        diffs = []
        for key in new_g.keys() | old_g.keys():
            n, o = new_g.get(key), old_g.get(key)
            site = (n or o).site  # type: ignore[union-attr]
            num, nbytes = (n.count, n.bytes) if n else (0, 0)
            onum, obytes = (o.count, o.bytes) if o else (0, 0)
            if (num, nbytes) != (onum, obytes):
                diffs.append(SiteDiff(site, key[0], num, num - onum, nbytes, nbytes - obytes))
        diffs.sort(key=lambda d: (d.untracked, -abs(d.bytes_diff), -abs(d.count_diff), d.label))
        return SiteDiffList(diffs)

    # -- export: JSON, schema in README ("Snapshot files") ----------------------------------

    def to_json(self) -> dict[str, Any]:
        return {
            "format": "tidyjax.snapshot",
            "version": VERSION,
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
                1 or 2, or a malformed one (a field missing or of the wrong type); the message says
                which.
        """
        return cls.from_json(read(path), str(path))

    @classmethod
    def from_json(cls, data: Any, where: str = "the data") -> Snapshot:
        """The snapshot in ``data``, as ``to_json()`` gives it (``where``
        names it in errors, a file's path by `load`).

        Raises:
            TidyjaxValueError: as `load`, for data already read.
        """
        version = 1 if isinstance(data, dict) and data.get("version") == 1 else VERSION
        data = check_file(data, where, "snapshot", version, "tidyjax.snapshot().dump(path)")
        _check(data, where)
        try:
            records = [TensorRecord.from_json(d) for d in data["tensors"]]
        except (ArithmeticError, AttributeError, LookupError, RecursionError, TypeError,
                ValueError) as e:  # fmt: skip  # a part no check reads (a site's detail or stack)
            raise TidyjaxValueError(
                f"{where} is a malformed tidyjax snapshot ({str(e)[:200]})."
            ) from e
        return cls(records, float(data["taken_at"]))


def _is_site(x: Any) -> bool:
    return (
        type(x) is dict
        and type(x.get("file")) is str
        and is_count(x.get("line"))
        and type(x.get("function")) is str
        and all(_is_site(f) for f in _frames(x.get("chain", [])))
    )


def _frames(chain: Any) -> list[Any]:
    """A site's ``chain`` (format 2) as a list, or one entry no site passes when it is none."""
    return chain if type(chain) is list else [None]


#: A snapshot's record (``TensorRecord.to_json``): each field's check, what it must be, and
#: whether every record has it.
_RECORD: dict[str, tuple[Any, str, bool]] = {
    "id": (is_count, "an int from 0", True),
    "shape": (
        lambda x: type(x) is list and all(is_count(n) for n in x),
        "a list of ints from 0",
        True,
    ),
    "dtype": (lambda x: type(x) is str, "a str", True),
    "bytes": (is_count, "an int from 0", True),
    "devices": (
        lambda x: type(x) is list and all(type(d) is str for d in x),
        "a list of str",
        True,
    ),
    "scope": (lambda x: type(x) is str, "a str", True),
    "site": (
        lambda x: x is None or _is_site(x),
        'null or {"file": str, "line": int, "function": str, "chain"?: [site, ...]}',
        False,
    ),
    "kept": (lambda x: type(x) is bool, "true or false", True),
    "variable": (lambda x: type(x) is bool, "true or false", True),
    "buffer": (is_count, "an int from 0", False),
    "name": (lambda x: x is None or type(x) is str, "null or a str", False),
}


def _check(data: dict[str, Any], where: str) -> None:
    """Refuse a snapshot with a field missing, of the wrong type or out of range (a conversion
    alone would take ``tuple("cpu")`` and ``float(True)``)."""

    def malformed(what: str) -> TidyjaxValueError:
        return TidyjaxValueError(f"{where} is a malformed tidyjax snapshot: {what}.")

    for key in ("taken_at", "tensors"):
        if key not in data:
            raise malformed(f'it has no "{key}"')
    if not is_unix_time(data["taken_at"]):
        raise malformed(f'its "taken_at" is {short(data["taken_at"])}, not a Unix time')
    if type(data["tensors"]) is not list:
        raise malformed(f'its "tensors" is {short(data["tensors"])}, not a list')
    for i, record in enumerate(data["tensors"]):
        if type(record) is not dict:
            raise malformed(f"tensors[{i}] is {short(record)}, not an object")
        for key, (ok, expected, required) in _RECORD.items():
            if key not in record:
                if required:
                    raise malformed(f'tensors[{i}] has no "{key}"')
            elif not ok(record[key]):
                raise malformed(f'tensors[{i}]\'s "{key}" is {short(record[key])}, not {expected}')


def snapshot(*, untracked: bool = True) -> Snapshot:
    """A `Snapshot` of the live Tensors now, and of the jax arrays tidyjax does not own
    (``Snapshot.untracked``, grouped by the user's line that made them).

    Args:
        untracked: False leaves the untracked arrays out (and the scan of
            ``jax.live_arrays()`` they cost).
    """
    return Snapshot(census(untracked=check_flag(untracked, "untracked", "snapshot()")).records())


class SiteDiffList(list[SiteDiff]):
    """What `Snapshot.compare_to` returns: a list of `SiteDiff` that shows itself
    as a table in Jupyter."""

    @_html.never_raises
    def _repr_html_(self) -> str:
        if not self:
            return _html.box("<b>no change</b> between the snapshots")
        head = f"<b>{esc(count(len(self), 'site'))} changed</b>, the largest change first"
        return _html.box(head, *_tables(self))


def _tables(rows: list[Any]) -> list[str]:
    """`SiteStat` or `SiteDiff` rows as tables: the Tensors' (and watched arrays') sites, then
    the untracked arrays' under a note."""
    tracked, untracked = [r for r in rows if not r.untracked], [r for r in rows if r.untracked]
    parts = [site_table(tracked)] * bool(tracked)
    if untracked:
        note = "untracked: jax arrays tidyjax does not own, by the line that made them"
        parts += [_html.line(_html.dim(note)), site_table(untracked)]
    return parts
