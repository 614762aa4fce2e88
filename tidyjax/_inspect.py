"""Looking at live Tensors: records with creation sites, snapshots and their diffs, leak checks.

Creation sites cost nothing per op: JAX records a creation traceback on every array (on by
default), and tidyjax reads it only when a report asks, keeping the first frame outside tidyjax
and JAX. Reports are small immutable value objects, in the manner of ``tracemalloc``.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import gc
import inspect
import json
import operator
import os
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import jax
import jaxlib

from . import _html, _registry
from ._arrays import failed, local_nbytes
from ._errors import LeakError, TidyjaxTypeError, TidyjaxValueError
from ._html import count as _count
from ._html import fmt_bytes as _fmt_bytes
from ._memory import buffer_id
from ._processes import DEFAULT_TIMEOUT, gather
from ._registry import KEPT
from ._tensor import Tensor, _ids
from ._trees import tensors_in
from ._watch import watched

__all__ = [
    "LeakReport",
    "Site",
    "SiteDiff",
    "SiteDiffList",
    "SiteStat",
    "Snapshot",
    "TensorRecord",
    "TensorRecordList",
    "check_leaks",
    "live_tensors",
    "snapshot",
]

F = TypeVar("F", bound=Callable[..., Any])
# Frames in these folders are not a user's creation site: tidyjax itself, jax and jaxlib.
_SKIP = (
    os.path.dirname(os.path.abspath(__file__)) + os.sep,
    *(os.path.dirname(f) + os.sep for m in (jax, jaxlib) if (f := getattr(m, "__file__", None))),
)


class Site:
    """Where a Tensor's array was created: the first frame outside tidyjax and JAX.

    ``file`` is the path as Python knows it; ``str(site)`` names a notebook cell as IPython's
    tracebacks do (``In[3], line 2 in <module>``) and a file by its path relative to the
    working directory (``train.py:12 in step``).
    """

    __slots__ = ("file", "function", "line")

    def __init__(self, file: str, line: int, function: str) -> None:
        self.file, self.line, self.function = file, line, function

    def __str__(self) -> str:
        cell = _cell_name(self.file)
        if cell is not None:
            return f"{cell}, line {self.line} in {self.function}"
        return f"{_short_path(self.file)}:{self.line} in {self.function}"

    def __repr__(self) -> str:
        return f"Site({self.file!r}, {self.line}, {self.function!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Site) and (self.file, self.line, self.function) == (
            other.file,
            other.line,
            other.function,
        )

    def __hash__(self) -> int:
        return hash((self.file, self.line, self.function))


def _cell_name(file: str) -> str | None:
    """``In[3]`` for the file IPython compiled cell 3 into; None for any other file.

    Asks the running shell's compiler (IPython's own mapping, also behind its tracebacks'
    ``Cell In[3]``). Without IPython imported there is no cell: nothing is imported here.
    """
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return None
    try:
        compiler = ipython.get_ipython().compile
        fmt = getattr(compiler, "format_code_name", None)  # IPython 8.0 and later
        if fmt is not None:
            named = fmt(file)
            return None if named is None else str(named[1])
        n = compiler._filename_map.get(file)
        return None if n is None else f"In[{n}]"
    except Exception:  # no shell, or a compiler of another kind
        return None


def _short_path(file: str) -> str:
    """``file`` relative to the working directory when it lies under it."""
    if not os.path.isabs(file):
        return file
    try:
        rel = os.path.relpath(file)
    except (OSError, ValueError):  # no working directory, or another drive
        return file
    return file if rel.startswith(os.pardir) else rel


def creation_site(arr: Any) -> Site | None:
    """The user frame that created ``arr``, from JAX's creation traceback."""
    tb = getattr(arr, "traceback", None)
    if tb is None:  # a typed PRNG key: its key data array has the traceback
        tb = getattr(getattr(arr, "_base_array", None), "traceback", None)
    if tb is None:
        return None
    for frame in tb.frames:
        if not frame.file_name.startswith(_SKIP):
            return Site(frame.file_name, frame.line_num, frame.function_name)
    return None


@dataclasses.dataclass(frozen=True, slots=True, repr=False)
class TensorRecord:
    """One live Tensor, as :func:`live_tensors` reports it.

    Attributes:
        id: the Tensor's id.
        shape: its shape.
        dtype: its dtype, as a string.
        bytes: its buffer's bytes (0 for one whose allocation failed: it holds nothing).
        devices: the devices holding it, as strings.
        scope: the scope path that will free it (``"train/step"``), ``""`` outside every scope,
            ``"<kept>"`` when kept, ``"<variable>"`` for a Variable, ``"<watched>"`` for an
            array that only a watched object holds (no Tensor: ``id`` is 0).
        site: a :class:`Site` or None.
        kept: whether it was kept.
        variable: whether it is a Variable.
        name: its path in an object registered with :func:`tidyjax.watch`
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
            f"TensorRecord(id={self.id}, {self.dtype}{list(self.shape)}, {_fmt_bytes(self.bytes)}, "
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
            "site": None
            if site is None
            else {"file": site.file, "line": site.line, "function": site.function},
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
            site=None if s is None else Site(s["file"], s["line"], s["function"]),
            name=d.get("name"),
        )  # fmt: skip


def holders(recs: list[_registry.Buffer]) -> list[tuple[_registry.Buffer, list[Tensor]]]:
    """Each record with the live Tensors holding it.

    The registry counts holders but keeps no reference to them (that would cost on every op),
    so a report finds them as the referrers of the records' arrays: one pass over the heap.
    """
    by_rec: dict[int, tuple[_registry.Buffer, list[Tensor]]] = {id(r): (r, []) for r in recs}
    arrays = [a for r in recs for a in r.arrays()]
    if arrays:
        for obj in gc.get_referrers(*arrays):
            if isinstance(obj, Tensor):
                rec = obj._rec
                if rec is not None and id(rec) in by_rec:
                    by_rec[id(rec)][1].append(obj)
    return list(by_rec.values())


def live_holders() -> list[tuple[_registry.Buffer, list[Tensor]]]:
    """Every live record with the live Tensors holding it."""
    recs, deleted = _registry.live()
    return holders(recs + deleted)


def _record(t: Tensor, rec: _registry.Buffer, names: dict[int, str]) -> TensorRecord:
    from ._variable import Variable

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
        dtype=str(arr.dtype),
        # a failed allocation holds nothing, nor a buffer deleted behind tidyjax's back
        bytes=0 if failed(arr) or _deleted(arr) else rec.size(),
        # from the sharding: ``devices()`` raises for a deleted array, the sharding never does
        devices=tuple(sorted(str(d) for d in arr.sharding.device_set)),
        scope=path,
        site=creation_site(arr),
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


WATCHED = "<watched>"


def summary(records: Iterable[TensorRecord]) -> str:
    """The one headline of a list of records: the Tensors with their bytes, then the arrays
    only watched objects hold with theirs (``3 live tensors, 12 B; 2 watched arrays, 4.0 MiB``),
    each buffer once. The watched part is left out when there is none."""
    tensors: dict[int, int] = {}
    raw: dict[int, int] = {}
    n_tensors = n_raw = 0
    for r in records:
        if r.scope == WATCHED:
            n_raw += 1
            raw[r._buffer] = r.bytes
        else:
            n_tensors += 1
            tensors[r._buffer] = r.bytes
    text = f"{_count(n_tensors, 'live tensor')}, {_fmt_bytes(sum(tensors.values()))}"
    if n_raw:
        text += f"; {_count(n_raw, 'watched array')}, {_fmt_bytes(sum(raw.values()))}"
    return text


class TensorRecordList(list[TensorRecord]):
    """A list of :class:`TensorRecord` that shows itself as a table in Jupyter."""

    def _repr_html_(self) -> str:
        return _records_html(self)


def live_tensors() -> TensorRecordList:
    """A record of every live Tensor and Variable, oldest first (a list).

    With objects registered by :func:`tidyjax.watch`, the arrays they hold come first (id 0,
    scope ``"<watched>"``, ``name`` their path), and a Tensor inside one carries its ``name``.
    The reports count those apart from the Tensors: ``3 live tensors, 12 B; 2 watched arrays,
    4.0 MiB``.
    """
    names: dict[int, str] = {}
    raw: list[TensorRecord] = []
    for found in watched().values():
        for path, arr in found:
            if id(arr) not in names:
                names[id(arr)] = path
                if _registry.lookup(arr) is None:
                    raw.append(_watched_record(arr, path))
    out = [_record(t, rec, names) for rec, ts in live_holders() for t in ts]
    out.sort(key=lambda r: r.id)
    return TensorRecordList(raw + out)


@_html.never_raises
def _records_html(records: list[TensorRecord]) -> str:
    esc = _html.esc
    head = f"<b>{esc(summary(records))}</b>"
    if not records:
        return _html.box(head)
    named = any(r.name for r in records)
    rows = [
        (r.id, esc(f"{r.dtype}{list(r.shape)}".replace(" ", "")), esc(_fmt_bytes(r.bytes)),
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


# -- grouping by site ------------------------------------------------------------------------


#: What a site's key ends with when its records are arrays only watched objects hold.
_WATCHED_SUFFIX = " (watched)"


def _site_key(r: TensorRecord) -> str:
    """A site as the reports group by it; watched arrays apart from Tensors made there."""
    site = str(r.site) if r.site is not None else "<unknown site>"
    return site + _WATCHED_SUFFIX if r.scope == WATCHED else site


def _noun(site: str) -> str:
    return "watched array" if site.endswith(_WATCHED_SUFFIX) else "tensor"


class SiteStat:
    """The live Tensors created at one site: how many, their bytes (shared buffers once).

    The arrays that only watched objects hold are a row of their own, their site ending in
    ``" (watched)"`` (``watched`` is True), counted as watched arrays, not Tensors.
    """

    __slots__ = ("bytes", "count", "shapes", "site")

    def __init__(self, site: str, count: int, bytes: int, shapes: dict[str, int]) -> None:
        self.site, self.count, self.bytes, self.shapes = site, count, bytes, shapes

    @property
    def watched(self) -> bool:
        """Whether the row counts arrays only watched objects hold (not Tensors)."""
        return self.site.endswith(_WATCHED_SUFFIX)

    def __str__(self) -> str:
        shapes = ", ".join(f"{s} ×{n}" if n > 1 else s for s, n in self.shapes.items())  # noqa: RUF001
        count = _count(self.count, _noun(self.site))
        return f"{self.site}: {count}, {_fmt_bytes(self.bytes)} [{shapes}]"

    def __repr__(self) -> str:
        return f"SiteStat({self.site!r}, count={self.count}, bytes={self.bytes})"


class SiteDiff:
    """A site's change between two snapshots, as ``tracemalloc.StatisticDiff``."""

    __slots__ = ("bytes", "bytes_diff", "count", "count_diff", "site")

    def __init__(self, site: str, count: int, count_diff: int, bytes: int, bytes_diff: int):
        self.site, self.count, self.count_diff = site, count, count_diff
        self.bytes, self.bytes_diff = bytes, bytes_diff

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


def _group(records: Iterable[TensorRecord]) -> dict[str, SiteStat]:
    groups: dict[str, list[TensorRecord]] = collections.defaultdict(list)
    for r in records:
        groups[_site_key(r)].append(r)
    out = {}
    claimed: set[tuple[bool, int]] = set()  # a buffer counts once, in its first record's row
    for site, rs in groups.items():
        nbytes = 0
        for r in rs:
            key = (r.scope == WATCHED, r._buffer)
            if key not in claimed:
                claimed.add(key)
                nbytes += r.bytes
        shapes = collections.Counter(f"{r.dtype}{list(r.shape)}".replace(" ", "") for r in rs)
        out[site] = SiteStat(site, len(rs), nbytes, dict(shapes))
    return out


class Snapshot:
    """The live Tensors at one moment; compare two with :meth:`compare_to`.

    Example::

        before = tidyjax.snapshot()
        run_some_steps()
        for diff in tidyjax.snapshot().compare_to(before)[:5]:
            print(diff)
    """

    __slots__ = ("records", "taken_at")

    def __init__(self, records: Iterable[TensorRecord], taken_at: float | None = None) -> None:
        self.records = tuple(records)
        self.taken_at = time.time() if taken_at is None else taken_at

    def __repr__(self) -> str:
        return f"<Snapshot of {summary(self.records)}>"

    def _repr_html_(self) -> str:
        return _stats_html(summary(self.records), self.statistics())

    def __str__(self) -> str:
        return "\n".join([summary(self.records)] + [f"  {s}" for s in self.statistics()])

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(str(self))

    def statistics(self) -> list[SiteStat]:
        """One :class:`SiteStat` per creation site, largest first (the watched arrays made at
        a site a row apart). Their counts and bytes add up to the headline's, each buffer in
        the row of its first record."""
        return sorted(_group(self.records).values(), key=lambda s: (-s.bytes, -s.count, s.site))

    def compare_to(self, old: Snapshot) -> SiteDiffList:
        """Per-site differences from ``old``, the largest change in bytes first (a list)."""
        if not isinstance(old, Snapshot):
            raise TidyjaxTypeError(f"compare_to() takes a Snapshot, got {type(old).__name__}.")
        new_g, old_g = _group(self.records), _group(old.records)
        diffs = []
        for site in new_g.keys() | old_g.keys():
            n, o = new_g.get(site), old_g.get(site)
            count, nbytes = (n.count, n.bytes) if n else (0, 0)
            ocount, obytes = (o.count, o.bytes) if o else (0, 0)
            if (count, nbytes) != (ocount, obytes):
                diffs.append(SiteDiff(site, count, count - ocount, nbytes, nbytes - obytes))
        diffs.sort(key=lambda d: (-abs(d.bytes_diff), -abs(d.count_diff), d.site))
        return SiteDiffList(diffs)

    # -- export: JSON, schema in README ("Snapshot files") ----------------------------------

    def to_json(self) -> dict[str, Any]:
        return {
            "format": "tidyjax.snapshot",
            "version": 1,
            "taken_at": self.taken_at,
            "tensors": [r.to_json() for r in self.records],
        }

    def dump(self, path: str | os.PathLike[str]) -> None:
        """Write the snapshot as JSON (see the README for the schema)."""
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.to_json(), f, indent=1)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Snapshot:
        """Read a snapshot written by :meth:`dump`.

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


def snapshot() -> Snapshot:
    """A :class:`Snapshot` of the live Tensors now."""
    return Snapshot(live_tensors())


class SiteDiffList(list[SiteDiff]):
    """What :meth:`Snapshot.compare_to` returns: a list of :class:`SiteDiff` that shows itself
    as a table in Jupyter."""

    def _repr_html_(self) -> str:
        return _diffs_html(self)


@_html.never_raises
def _diffs_html(diffs: list[SiteDiff]) -> str:
    esc = _html.esc
    if not diffs:
        return _html.box("<b>no change</b> between the snapshots")
    head = f"<b>{esc(_count(len(diffs), 'site'))} changed</b>, the largest change first"
    rows = [
        (esc(d.site), d.count, f"{d.count_diff:+d}", esc(_fmt_bytes(d.bytes)),
         esc(_html.signed_bytes(d.bytes_diff)))
        for d in diffs
    ]  # fmt: skip
    header = ["created at", "tensors", "change", "bytes", "change"]
    return _html.box(head, _html.table(header, rows, numeric={1, 2, 3, 4}))


def _stats_html(title: str, stats: list[SiteStat], bad: bool = False, note: str = "") -> str:
    @_html.never_raises
    def build(_: object) -> str:
        esc = _html.esc
        rows = [
            (esc(s.site), s.count, esc(_fmt_bytes(s.bytes)),
             esc(", ".join(f"{k} ×{n}" for k, n in s.shapes.items())))  # noqa: RUF001
            for s in stats
        ]  # fmt: skip
        head = _html.bad(title) if bad else f"<b>{esc(title)}</b>"
        table = _html.table(["created at", "tensors", "bytes", "shapes"], rows, numeric={1, 2})
        return _html.box(head, table if rows else "", _html.line(_html.dim(note)) if note else "")

    return build(None)


# -- leaks -----------------------------------------------------------------------------------


class LeakReport:
    """Tensors found alive by a leak check, grouped by creation site."""

    __slots__ = ("records", "where")

    def __init__(self, records: Iterable[TensorRecord], where: str = "check_leaks()") -> None:
        self.records = tuple(records)
        self.where = where

    @property
    def groups(self) -> list[SiteStat]:
        return Snapshot(self.records).statistics()

    @property
    def num_bytes(self) -> int:
        return sum({r._buffer: r.bytes for r in self.records}.values())

    def __len__(self) -> int:
        return len(self.records)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(str(self))

    def _repr_html_(self) -> str:
        if not self.records:
            return _stats_html(f"no leaks after {self.where}", [])
        return _stats_html(
            f"leak: {_count(len(self.records), 'tensor')}, {_fmt_bytes(self.num_bytes)} still "
            f"alive after {self.where}",
            self.groups,
            bad=True,
            note=_LEAK_FIX,
        )

    def __str__(self) -> str:
        n = len(self.records)
        if not n:
            return f"no leaks: no Tensor created inside {self.where} is still alive."
        lines = [
            f"{_count(n, 'tensor')} ({_fmt_bytes(self.num_bytes)}) created inside "
            f"{self.where} {'is' if n == 1 else 'are'} still alive:"
        ]
        lines += [f"  {g}" for g in self.groups]
        lines.append(_LEAK_FIX)
        return "\n".join(lines)


_LEAK_FIX = (
    "Dispose them, create them inside a tidy scope that frees them, or allow them "
    "(check_leaks(allowance=N), checker.allow(t))."
)


def leak_error(
    leaked: list[TensorRecord],
    allowance: int,
    where: str,
    all_processes: bool = False,
    timeout: float = DEFAULT_TIMEOUT,
    checker: check_leaks | None = None,
) -> LeakError | None:
    """The :class:`LeakError` to raise if more than ``allowance`` Tensors leaked, or None.

    Returned, not raised, so that the frame raising it is the caller's: the fewer tidyjax
    frames in a traceback, the fewer IPython shows (it always shows the innermost one).
    """
    report = LeakReport(leaked, where)
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


class check_leaks:  # noqa: N801 - used like a function, as a context manager and decorator
    """Fail when Tensors created inside are still alive at the end.

    Forms::

        with tidyjax.check_leaks() as checker:
            out = step()
            checker.allow(out)              # alive on purpose

        @tidyjax.check_leaks(allowance=2)   # each call checked; its return value is allowed
        def step(): ...

    Args:
        allowance: how many leaked Tensors to tolerate.
        allow_returned: in the decorator form, Tensors in the return value are not leaks.
        allow_kept: Tensors marked with :func:`tidyjax.keep` are not leaks.
        all_processes: a collective over every process of a ``jax.distributed`` job (each
            must run the check): a leak beyond ``allowance`` on any process fails every
            process, and the report names the process.
        timeout: seconds ``all_processes`` waits for every process.

    Raises:
        LeakError: with a :class:`LeakReport` (``err.report``) grouped by creation site. Not
            raised when the block itself raised. Tensors made by other threads meanwhile
            count too: check code that runs alone.
        CollectiveError: with ``all_processes``, a process did not check within ``timeout``.
    """

    def __init__(
        self,
        *,
        allowance: int = 0,
        allow_returned: bool = True,
        allow_kept: bool = False,
        all_processes: bool = False,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        if not isinstance(allowance, int) or allowance < 0:
            raise TidyjaxTypeError(f"allowance must be an int >= 0, got {allowance!r}.")
        self.allowance = allowance
        self.all_processes = all_processes
        self.timeout = timeout
        self.allow_returned = allow_returned
        self.allow_kept = allow_kept
        self._start: int | None = None
        self._allowed: set[int] = set()
        self.report: LeakReport | None = None

    def allow(self, *values: Any) -> None:
        """Do not count the Tensors in ``values`` (any pytrees) as leaks."""
        self._allowed.update(t._id for t in tensors_in(values))

    def __enter__(self) -> check_leaks:
        self._start = next(_ids)
        self._allowed = set()
        self.report = None
        return self

    def __exit__(self, exc_type: Any, *exc: object) -> None:
        __tracebackhide__ = True
        if exc_type is None and (error := self._error()) is not None:
            raise error

    def leaked(self) -> list[TensorRecord]:
        """The Tensors made since entering that are alive and not allowed."""
        if self._start is None:
            raise TidyjaxTypeError("check_leaks: enter it (with-block) before checking.")
        gc.collect()
        return [
            r
            for r in live_tensors()
            if r.id > self._start and r.id not in self._allowed and not (self.allow_kept and r.kept)
        ]

    def check(self) -> None:
        """Raise :class:`LeakError` if more than ``allowance`` Tensors leaked."""
        __tracebackhide__ = True
        if (error := self._error()) is not None:
            raise error

    def _error(self) -> LeakError | None:
        return leak_error(self.leaked(), self.allowance, "check_leaks()", self.all_processes,
                          self.timeout, self)  # fmt: skip

    def __call__(self, fn: F) -> F:
        if not callable(fn) or inspect.isgeneratorfunction(fn):
            raise TidyjaxTypeError("@check_leaks decorates a plain or async function.")
        settings: dict[str, Any] = {
            "allowance": self.allowance,
            "allow_returned": self.allow_returned,
            "allow_kept": self.allow_kept,
            "all_processes": self.all_processes,
            "timeout": self.timeout,
        }

        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def run_async(*args: Any, **kwargs: Any) -> Any:
                __tracebackhide__ = True
                with check_leaks(**settings) as checker:
                    result = await fn(*args, **kwargs)
                    if self.allow_returned:
                        checker.allow(result)
                return result

            return run_async  # type: ignore[return-value]

        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            __tracebackhide__ = True
            with check_leaks(**settings) as checker:
                result = fn(*args, **kwargs)
                if self.allow_returned:
                    checker.allow(result)
            return result

        return run  # type: ignore[return-value]
