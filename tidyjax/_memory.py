"""``memory()``: what tidyjax holds now, and whether that figure can be trusted."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any

import jax

from . import _format, _html, _registry
from ._arrays import failed, local_nbytes, shard_bytes
from ._errors import check_flag
from ._format import count as _count
from ._format import fmt_bytes as _fmt_bytes
from ._jaxdoors import base_array
from ._processes import DEFAULT_TIMEOUT, gather
from ._sites import INSTALLED_FOLDERS, Site, creation_site
from ._watch import watched as _watched

__all__ = [
    "ALARM_BYTES",
    "ALARM_SHARE",
    "DEVICE_TOP",
    "TOP_SITES",
    "MemoryInfo",
    "TopSite",
    "UntrackedSite",
    "WatchedUsage",
    "buffer_id",
    "find_untracked",
    "memory",
    "untracked_sites",
    "watched_ids",
    "watched_usage",
]

#: How many creation sites of untracked arrays ``memory()`` names per device, largest first.
TOP_SITES = 5

#: How many holders (sites of Tensors and of untracked arrays, watched objects) ``memory()``
#: names per device, largest first.
DEVICE_TOP = 3

#: Untracked bytes are shown as an alarm from this many bytes, or from this share of all the
#: bytes counted (once those reach ``ALARM_BYTES``); a smaller stray is a note.
ALARM_BYTES = 1 << 20
ALARM_SHARE = 0.01


@dataclasses.dataclass(frozen=True, slots=True)
class TopSite:
    """One of the largest holders of memory on a device, as ``memory().top_sites`` lists them.

    Attributes:
        device: the device, as a string (``"cuda:0"``).
        kind: ``"tidyjax"`` (Tensors' buffers), ``"watched"`` (arrays of an object given to
            ``tidyjax.watch`` that no Tensor holds) or ``"untracked"`` (other jax arrays).
        site: where the arrays were made (the user's line), or None for a watched object or
            where JAX kept no traceback.
        name: the watched object's name, for ``kind == "watched"``; else None.
        count: how many buffers.
        bytes: their bytes on that device.
    """

    device: str
    kind: str
    site: Site | None
    name: str | None
    count: int
    bytes: int

    @property
    def label(self) -> str:
        """What holds the bytes: the site, or the watched object's name."""
        if self.name is not None:
            return f"watched {self.name!r}"
        return str(self.site) if self.site is not None else "<unknown site>"

    def __str__(self) -> str:
        held = f"{_fmt_bytes(self.bytes)} in {_count(self.count, 'buffer')}"
        return f"{self.label} ({self.kind}): {held}"


@dataclasses.dataclass(frozen=True, slots=True)
class UntrackedSite:
    """Untracked jax arrays made at one site and held on one device, as
    ``memory().untracked_sites`` lists them.

    Attributes:
        device: the device, as a string (``"cuda:0"``).
        site: the user's line that made them (a [`Site`][tidyjax.Site]; its ``detail`` the library
            frame, such as ``flax/nnx/...``), or None where JAX kept no traceback.
        count: how many arrays.
        bytes: their bytes on that device (a replicated array counts on each device).
    """

    device: str
    site: Site | None
    count: int
    bytes: int

    def __str__(self) -> str:
        where = str(self.site) if self.site is not None else "<unknown site>"
        return f"{where}: {_fmt_bytes(self.bytes)} in {_count(self.count, 'array')}"

    def __repr__(self) -> str:
        site = str(self.site) if self.site is not None else None
        return f"UntrackedSite({self.device!r}, {site!r}, count={self.count}, bytes={self.bytes})"


class MemoryInfo:
    """An immutable snapshot of tidyjax's accounting, as returned by [`memory`][tidyjax.memory].

    Attributes:
        num_tensors: live Tensor objects, Variables included.
        num_data_buffers: distinct device buffers they hold (aliases share one).
        num_bytes: logical bytes of those buffers, each buffer counted once; a buffer whose
            allocation (computation) failed holds none, once JAX has said so (an array
            still being computed counts in full: ``memory()`` never waits for one).
        bytes_per_device: bytes on each ``jax.Device``; a replicated buffer counts on every
            device that holds a copy, a sharded one counts each device's shard.
        unreliable: True when the figures above do not describe the process's device memory.
        reasons: why ``unreliable`` is True, one sentence each.
        untracked_arrays: jax arrays alive in the process that tidyjax does not own (``None``
            when not scanned).
        untracked_bytes: their bytes (``None`` when not scanned).
        untracked_sites: where those were made: on each device, its `TOP_SITES` largest creation
            sites as [`UntrackedSite`][tidyjax.UntrackedSite] rows (device, site, count, bytes), by
            device, then largest first; empty when not scanned.
        device_stats: ``Device.memory_stats()`` per device where the backend reports it
            (GPU/TPU); empty on CPU.
        per_process: with ``memory(all_processes=True)``, each process's report in
            process-index order (the other figures are their sums); else None.
        watched: bytes held by each object registered with [`tidyjax.watch`][tidyjax.watch], by name
            (each buffer once per name). Counted apart: not in ``untracked_*``; a Tensor inside
            a watched object also counts in ``num_bytes``.
        watched_arrays: how many arrays hold ``watched[name]``'s bytes, by name: the count
            beside each byte figure (a Tensor inside a watched object is one of them). Arrays
            whose computation failed hold nothing and are in neither.
        watched_per_device: bytes of watched arrays that no Tensor holds, on each device (each
            buffer once over all names): what the watched objects add to ``bytes_per_device``.
        untracked_per_device: the untracked arrays' bytes on each device (empty when not
            scanned).
        total_per_device: on each device, tidyjax's + watched + untracked bytes (property).
        top_sites: on each device, its `DEVICE_TOP` largest holders as ``TopSite`` rows
            (Tensors by creation site, watched objects by name, untracked arrays by creation
            site), by device, then largest first; empty when not scanned.
    """

    __slots__ = (
        "bytes_per_device",
        "device_stats",
        "num_bytes",
        "num_data_buffers",
        "num_tensors",
        "per_process",
        "reasons",
        "top_sites",
        "unreliable",
        "untracked_arrays",
        "untracked_bytes",
        "untracked_per_device",
        "untracked_sites",
        "watched",
        "watched_arrays",
        "watched_per_device",
    )

    num_tensors: int
    num_data_buffers: int
    num_bytes: int
    bytes_per_device: Mapping[Any, int]
    unreliable: bool
    reasons: tuple[str, ...]
    untracked_arrays: int | None
    untracked_bytes: int | None
    untracked_sites: tuple[UntrackedSite, ...]
    device_stats: Mapping[Any, Mapping[str, int]]
    per_process: tuple[MemoryInfo, ...] | None
    watched: Mapping[str, int]
    watched_arrays: Mapping[str, int]
    watched_per_device: Mapping[Any, int]
    untracked_per_device: Mapping[Any, int]
    top_sites: tuple[TopSite, ...]

    def __init__(self, **fields: Any) -> None:
        fields.setdefault("per_process", None)
        fields.setdefault("untracked_sites", ())
        fields.setdefault("watched", MappingProxyType({}))
        fields.setdefault("watched_arrays", MappingProxyType({}))
        fields.setdefault("watched_per_device", MappingProxyType({}))
        fields.setdefault("untracked_per_device", MappingProxyType({}))
        fields.setdefault("top_sites", ())
        for name in self.__slots__:
            object.__setattr__(self, name, fields[name])

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("MemoryInfo is immutable")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, MemoryInfo):
            return NotImplemented
        return all(
            getattr(self, n) == getattr(other, n) for n in self.__slots__ if n != "per_process"
        )

    __hash__ = None  # type: ignore[assignment]

    @property
    def total_per_device(self) -> dict[Any, int]:
        out: dict[Any, int] = {}
        for part in (self.bytes_per_device, self.watched_per_device, self.untracked_per_device):
            for d, b in part.items():
                out[d] = out.get(d, 0) + b
        return out

    def __repr__(self) -> str:
        per_device = {str(d): b for d, b in self.bytes_per_device.items()}
        return (
            f"MemoryInfo(num_tensors={self.num_tensors}, num_data_buffers="
            f"{self.num_data_buffers}, num_bytes={self.num_bytes}, bytes_per_device="
            f"{per_device}, watched={dict(self.watched)}, watched_arrays="
            f"{dict(self.watched_arrays)}, unreliable={self.unreliable}, reasons={self.reasons})"
        )

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(str(self))

    def _repr_html_(self) -> str:
        return _memory_html(self)

    def __str__(self) -> str:
        lines = [_headline(self)]
        for d in _devices(self):
            lines.append(f"  {d}: {_device_sum(self, d)}")
            stats = _limit_line(self.device_stats.get(d))
            if stats:
                lines.append(f"    {stats}")
            lines += [f"    {i}. {t}" for i, t in enumerate(_top_of(self, d), 1)]
        lines += [f"  {_watched_line(self, name)}" for name in self.watched]
        if self.untracked_arrays:
            lines.append(f"  untracked: {_untracked(self)}")
            if self.untracked_sites:
                lines[-1] += "; made at (largest first):"
            lines += [f"    {u.device}: {u}" for u in self.untracked_sites]
        minor = _minor(self)
        lines += [f"  {'note' if minor and _is_untracked(r) else 'unreliable'}: {r}"
                  for r in self.reasons]  # fmt: skip
        return "\n".join(lines)


def _devices(m: MemoryInfo) -> list[Any]:
    """Every device with something to say, by name."""
    stats = {d for d, s in m.device_stats.items() if s.get("bytes_limit")}
    return sorted(set(m.total_per_device) | stats, key=str)


def _device_sum(m: MemoryInfo, d: Any) -> str:
    """``45 B`` or ``45 B tidyjax + 1.0 KiB watched + 4 B untracked = 1.1 KiB``."""
    b = m.bytes_per_device.get(d, 0)
    w, u = m.watched_per_device.get(d, 0), m.untracked_per_device.get(d, 0)
    if not (w or u):
        return _fmt_bytes(b)
    if m.untracked_arrays is None:  # not scanned: no figure to add
        return f"{_fmt_bytes(b)} tidyjax + {_fmt_bytes(w)} watched = {_fmt_bytes(b + w)}"
    return (
        f"{_fmt_bytes(b)} tidyjax + {_fmt_bytes(w)} watched + {_fmt_bytes(u)} untracked = "
        f"{_fmt_bytes(b + w + u)}"
    )


def _limit_line(s: Mapping[str, int] | None) -> str:
    """All of JAX on a device against its limit, with its peak, where the backend says."""
    if not s or not s.get("bytes_limit"):
        return ""
    used, limit = s.get("bytes_in_use", 0), s["bytes_limit"]
    text = (
        f"in use (all of JAX) {_fmt_bytes(used)} = {_share(used, limit)} of the limit "
        f"{_fmt_bytes(limit)}"
    )
    if "peak_bytes_in_use" in s:
        text += f"; peak {_fmt_bytes(s['peak_bytes_in_use'])}"
    return text


def _share(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "-"


def _top_of(m: MemoryInfo, d: Any) -> list[TopSite]:
    return [t for t in m.top_sites if t.device == str(d)]


def _is_untracked(reason: str) -> bool:
    return "not owned by tidyjax" in reason


def _minor(m: MemoryInfo) -> bool:
    """Whether the untracked arrays are a small stray rather than a gap worth an alarm."""
    u = m.untracked_bytes or 0
    total = sum(m.total_per_device.values()) or m.num_bytes + u
    return u < ALARM_BYTES and (total < ALARM_BYTES or u < ALARM_SHARE * total)


def _headline(m: MemoryInfo) -> str:
    text = (
        f"{_count(m.num_tensors, 'tensor')}, {_count(m.num_data_buffers, 'buffer')}, "
        f"{_fmt_bytes(m.num_bytes)}"
    )
    w, u = sum(m.watched_per_device.values()), sum(m.untracked_per_device.values())
    if w or u:
        text += f"; {_fmt_bytes(m.num_bytes + w + u)} with watched and untracked arrays"
    return text


def _watched_line(m: MemoryInfo, name: str) -> str:
    """``watched 'model': 4.0 MiB in 2 arrays``: a watched object's bytes with their count."""
    n = m.watched_arrays.get(name, 0)
    return f"watched {name!r}: {_fmt_bytes(m.watched.get(name, 0))} in {_count(n, 'array')}"


def _untracked(m: MemoryInfo) -> str:
    return (
        f"{_count(m.untracked_arrays or 0, 'jax array')} not owned by tidyjax, "
        f"{_fmt_bytes(m.untracked_bytes or 0)}"
    )


@_html.never_raises
def _memory_html(m: MemoryInfo) -> str:
    """The devices as rows. Each column of bars has one scale: tidyjax's bytes (and the
    untracked arrays' row) against the largest of them; JAX's own totals against each
    device's limit. Where watched or untracked arrays add to a device, its total with each
    part; then the largest holders on each device."""
    head = f"<b>tidyjax memory</b>: {_format.esc(_headline(m))}"
    stats = {d: s for d, s in m.device_stats.items() if s.get("bytes_limit")}
    devices = _devices(m)
    untracked = m.untracked_arrays or 0
    parts = [head]
    if not m.bytes_per_device and not m.num_data_buffers:
        parts.append(_html.line("nothing tracked: no live tensors"))
    if not devices and not untracked and not m.watched:
        return _html.box(*parts, *_reasons(m))
    extra = [*m.watched.values(), (m.untracked_bytes or 0) if untracked else 0]
    top = max([*m.bytes_per_device.values(), *extra]) or 1
    parted = any(m.watched_per_device.values()) or any(m.untracked_per_device.values())
    peaks = any("peak_bytes_in_use" in s for s in stats.values())
    header = ["device", "tidyjax bytes", ""]
    if parted:
        header += ["+ watched", "+ untracked", "= total on device"]
    if stats:
        header += ["in use (all of JAX)", "limit", ""]
        if peaks:
            header.append("peak (all of JAX)")
    rows: list[list[str]] = []
    for d in devices:
        b = m.bytes_per_device.get(d, 0)
        row = [_format.esc(d), _format.esc(_fmt_bytes(b)), _html.bar(b / top)]
        if parted:
            w, u = m.watched_per_device.get(d, 0), m.untracked_per_device.get(d, 0)
            unscanned = _html.dim("not scanned") if m.untracked_arrays is None else None
            row += [_format.esc(_fmt_bytes(w)), unscanned or _format.esc(_fmt_bytes(u)),
                    _format.esc(_fmt_bytes(b + w + u))]  # fmt: skip
        if stats:
            s = stats.get(d)
            if s:
                used, limit = s.get("bytes_in_use", 0), s["bytes_limit"]
                row += [_format.esc(f"{_fmt_bytes(used)} ({_share(used, limit)})"),
                        _format.esc(_fmt_bytes(limit)), _html.bar(used / limit)]  # fmt: skip
                if peaks:
                    peak = s.get("peak_bytes_in_use")
                    row.append("" if peak is None else _format.esc(_fmt_bytes(peak)))
            else:
                row += [""] * (4 if peaks else 3)
        rows.append(row)
    pad = [""] * (len(header) - 3)
    for name, b in m.watched.items():
        n = m.watched_arrays.get(name, 0)
        label = f"watched {name!r} (tidyjax.watch): {_count(n, 'array')}"
        rows.append([_format.esc(label), _format.esc(_fmt_bytes(b)), _html.bar(b / top), *pad])
    if untracked:
        b = m.untracked_bytes or 0
        label = f"untracked: {_count(untracked, 'jax array')} (not tidyjax)"
        rows.append([_format.esc(label), _format.esc(_fmt_bytes(b)), _html.bar(b / top), *pad])
    numeric = {i for i, h in enumerate(header) if i and h}  # bars have no heading
    return _html.box(
        *parts, _html.table(header, rows, numeric), *_top_html(m), *_sites_html(m), *_reasons(m)
    )


def _top_html(m: MemoryInfo) -> list[str]:
    """The largest holders on each device: what holds the memory, not only how much."""
    if not m.top_sites:
        return []
    rows = [
        [_format.esc(t.device), _format.esc(t.label), _format.esc(t.kind), str(t.count),
         _format.esc(_fmt_bytes(t.bytes))]
        for t in m.top_sites
    ]  # fmt: skip
    header = ["device", f"largest holders (top {DEVICE_TOP})", "kind", "buffers", "bytes"]
    return [_html.table(header, rows, {3, 4})]


def _sites_html(m: MemoryInfo) -> list[str]:
    """The untracked arrays' largest creation sites per device, as a table (none if none)."""
    if not m.untracked_sites:
        return []
    detail = any(u.site is not None and u.site.detail is not None for u in m.untracked_sites)
    rows = []
    for u in m.untracked_sites:
        site = _format.esc(u.site) if u.site is not None else _html.dim("unknown")
        row = [site, _format.esc(u.device), str(u.count), _format.esc(_fmt_bytes(u.bytes))]
        if detail:
            lib = u.site.detail if u.site is not None else None
            row.append(_html.dim(_format.esc(library_frame(lib))) if lib is not None else "")
        rows.append(row)
    header = ["untracked arrays made at", "device", "arrays", "bytes"]
    if detail:
        header.append("in library")
    return [_html.table(header, rows, {2, 3})]


def library_frame(site: Site) -> str:
    """A library frame (``Site.detail``) named from its package: ``flax/nnx/rnglib.py:12 in
    __call__``, not the full path into site-packages."""
    file = site.file
    folders = [f for f in INSTALLED_FOLDERS if file.startswith(f)]
    if folders:
        file = file[len(max(folders, key=len)) :]  # the innermost: site-packages in a venv
    return f"{file}:{site.line} in {site.function}"


def _reasons(m: MemoryInfo) -> list[str]:
    """Why the figures are incomplete: an alarm, except for a small untracked stray."""
    minor = _minor(m)
    return [
        _html.line(_html.dim("note: "), _format.esc(r))
        if minor and _is_untracked(r)
        else _html.line(_html.bad("unreliable"), ": ", _format.esc(r))
        for r in m.reasons
    ]


def memory(
    *, scan_untracked: bool = True, all_processes: bool = False, timeout: float = DEFAULT_TIMEOUT
) -> MemoryInfo:
    """A snapshot of the Tensors, buffers and bytes tidyjax holds now, in this process.

    In a ``jax.distributed`` job each process reports its own: its Tensors, and the bytes of
    the shards on its own devices (a global array counts its local shards).

    Args:
        scan_untracked: also look through ``jax.live_arrays()`` for arrays tidyjax does not own
            and report them, with the user's lines that made them (``untracked_sites``, read
            from the creation tracebacks JAX keeps; costs tens of milliseconds per ten thousand
            live arrays), and name the largest holders on each device (``top_sites``: the
            Tensors' creation sites too, about 3 ms more per thousand Tensors). With False,
            ``untracked_arrays`` is ``None``, ``untracked_sites``, ``top_sites`` and
            ``untracked_per_device`` empty, and no array is looked at.
        all_processes: a collective over every process of the job (each must call it): the
            counts are the sums over processes, ``bytes_per_device`` covers every device, and
            ``per_process`` holds each process's report. On a single process, ``memory()``
            with a one-element ``per_process``.
        timeout: seconds ``all_processes`` waits for every process.

    Raises:
        CollectiveError: with ``all_processes``, a process did not call it within ``timeout``.

    Example:
        ```python
        info = tidyjax.memory()
        print(info.num_tensors, info.num_bytes)
        ```
    """
    scan_untracked = check_flag(scan_untracked, "scan_untracked", "memory()")
    all_processes = check_flag(all_processes, "all_processes", "memory()")
    if all_processes:
        return _all_processes(scan_untracked, timeout)
    recs, deleted = books()
    num_tensors = sum(max(rec.n, 0) for rec in recs + deleted)
    num_bytes = 0
    per_device: dict[Any, int] = {}
    recs = _registry.distinct(recs)  # records over one buffer count once
    holders = _Holders() if scan_untracked else None
    for rec in recs:
        if failed(rec.array()):  # never allocated (aliases share its state): holds nothing
            continue
        num_bytes += rec.size()
        spread = _registry.device_bytes(rec)
        for dev, b in spread.items():
            per_device[dev] = per_device.get(dev, 0) + b
        if holders is not None:
            holders.add("tidyjax", creation_site(rec.array()), None, spread.items())
    deleted_outside = len(deleted)
    watched = _watched()
    usage = watched_usage(watched)
    watched_devices = _watched_per_device(watched, holders)

    reasons: list[str] = []
    if deleted_outside:
        reasons.append(
            f"{_count(deleted_outside, 'buffer')} held by live Tensors "
            f"{'was' if deleted_outside == 1 else 'were'} deleted outside tidyjax "
            "(jax.Array.delete() or donation through raw jax.jit); those Tensors are unusable."
        )
    untracked_arrays = untracked_bytes = None
    sites: tuple[UntrackedSite, ...] = ()
    untracked_devices: dict[Any, int] = {}
    if holders is not None:
        untracked = find_untracked(recs, watched_ids(watched))
        untracked_arrays = len(untracked)
        untracked_bytes = sum(int(a.nbytes) for a in untracked)
        sites = untracked_sites(untracked)
        for arr in untracked:
            shares = tuple(_device_bytes(arr))
            for dev, b in shares:
                untracked_devices[dev] = untracked_devices.get(dev, 0) + b
            holders.add("untracked", creation_site(arr), None, shares)
        if untracked_arrays:
            reasons.append(
                f"{_count(untracked_arrays, 'jax array')} ({_fmt_bytes(untracked_bytes or 0)}) "
                f"alive in this process {'is' if untracked_arrays == 1 else 'are'} not owned by "
                "tidyjax; wrap them with tidyjax.adopt(), delete them, or tidyjax.watch() the "
                "object holding them (a model, an optimizer) to make the figures complete."
            )
    device_stats: dict[Any, Mapping[str, int]] = {}
    for dev in jax.local_devices():
        try:
            stats = dev.memory_stats()
        except Exception:  # some backends raise instead of returning None
            stats = None
        if stats:
            device_stats[dev] = MappingProxyType(dict(stats))
    return MemoryInfo(
        num_tensors=num_tensors,
        num_data_buffers=len(recs) + deleted_outside,
        num_bytes=num_bytes,
        bytes_per_device=MappingProxyType(per_device),
        unreliable=bool(reasons),
        reasons=tuple(reasons),
        untracked_arrays=untracked_arrays,
        untracked_bytes=untracked_bytes,
        untracked_sites=sites,
        device_stats=MappingProxyType(device_stats),
        watched=MappingProxyType({name: u.bytes for name, u in usage.items()}),
        watched_arrays=MappingProxyType({name: u.arrays for name, u in usage.items()}),
        watched_per_device=MappingProxyType(watched_devices),
        untracked_per_device=MappingProxyType(untracked_devices),
        top_sites=holders.top() if holders is not None else (),
    )


class _Holders:
    """Bytes per device by holder (kind, site, watched name), for ``top_sites``."""

    def __init__(self) -> None:
        # (device name, kind, site, name) -> [buffers, bytes]; a key keeps the first site seen
        self.groups: dict[tuple[str, str, Site | None, str | None], list[int]] = {}

    def add(
        self, kind: str, site: Site | None, name: str | None, spread: Iterable[tuple[Any, int]]
    ) -> None:
        for dev, b in spread:
            row = self.groups.setdefault((str(dev), kind, site, name), [0, 0])
            row[0] += 1
            row[1] += b

    def top(self, n: int = DEVICE_TOP) -> tuple[TopSite, ...]:
        by_device: dict[str, list[TopSite]] = {}
        for (dev, kind, site, name), (count, b) in self.groups.items():
            by_device.setdefault(dev, []).append(TopSite(dev, kind, site, name, count, b))
        out: list[TopSite] = []
        for dev in sorted(by_device):
            rows = by_device[dev]
            rows.sort(key=lambda t: (-t.bytes, -t.count, t.label))
            out += rows[:n]
        return tuple(out)


def _watched_per_device(
    found: Mapping[str, list[tuple[str, Any]]], holders: _Holders | None
) -> dict[Any, int]:
    """Bytes of the watched arrays no Tensor holds, per device, each buffer once over all the
    names (the first name that holds it claims it for ``holders``)."""
    out: dict[Any, int] = {}
    seen: set[int] = set()
    for name, pairs in found.items():
        for _, arr in pairs:
            rec = _registry.lookup(arr)
            if failed(arr) or (rec is not None and not released(rec)):  # nothing, or a Tensor's
                continue
            base = base_array(arr)
            if id(base) in seen:
                continue
            seen.add(id(base))
            spread = tuple(_device_bytes(base))
            for dev, b in spread:
                out[dev] = out.get(dev, 0) + b
            if holders is not None:
                holders.add("watched", None, name, spread)
    return out


class WatchedUsage:
    """What one watched object holds now, as every report counts it: its arrays (each buffer
    once; none whose computation failed) and their bytes, and how many of them are Tensors'
    (tidyjax tracks those, so they count among the Tensors too)."""

    __slots__ = ("arrays", "bytes", "tensor_bytes", "tensors")

    def __init__(self, arrays: int, bytes: int, tensors: int, tensor_bytes: int) -> None:
        self.arrays, self.bytes, self.tensors, self.tensor_bytes = (
            arrays,
            bytes,
            tensors,
            tensor_bytes,
        )

    def __repr__(self) -> str:
        return (
            f"WatchedUsage(arrays={self.arrays}, bytes={self.bytes}, tensors={self.tensors}, "
            f"tensor_bytes={self.tensor_bytes})"
        )


def watched_usage(
    found: Mapping[str, list[tuple[str, Any]]] | None = None,
) -> dict[str, WatchedUsage]:
    """Each watched name's `WatchedUsage`, from ``found`` (``_watch.watched()``; by
    default, read now): the one count behind ``memory().watched`` and the reports."""
    if found is None:
        found = _watched()
    out: dict[str, WatchedUsage] = {}
    for name, pairs in found.items():
        arrays = nbytes = tensors = tensor_bytes = 0
        seen: set[Any] = set()
        for _, arr in pairs:
            if failed(arr):  # never allocated: holds nothing
                continue
            rec = _registry.lookup(arr)
            if rec is not None and released(rec):  # the caller's plain array again
                rec = None
            key = buffer_id(rec) if rec is not None else id(arr)
            if key in seen:  # two objects over one recorded buffer: once
                continue
            seen.add(key)
            b = _own_bytes(arr)
            arrays += 1
            nbytes += b
            if rec is not None:
                tensors += 1
                tensor_bytes += b
        out[name] = WatchedUsage(arrays, nbytes, tensors, tensor_bytes)
    return out


def books() -> tuple[list[_registry.Buffer], list[_registry.Buffer]]:
    """The records every report counts: ``_registry.live()`` (the live records, and those
    deleted behind tidyjax's back that live Tensors still hold) less what is no longer
    tidyjax's to count:

    * a caller's own array (``owned`` False: handed to ``tensors()``, or a lifted call's input
      that came back) that no live Tensor holds any more: the caller's plain array again,
      untracked, as before tidyjax saw it (`released`);
    * a buffer deleted behind tidyjax's back (a raw ``jax.jit`` donation, ``delete()``) whose
      owner scope has exited: that scope would have disposed its Tensors, and a deleted buffer
      holds nothing.

    Records over one buffer are all listed (``_registry.distinct`` keeps one).
    """
    alive, deleted = _registry.live()
    if any(released(r) for r in alive):
        alive = [r for r in alive if not released(r)]
    deleted = [r for r in deleted if not getattr(r.scope, "exited", False)]
    return alive, deleted


def released(rec: _registry.Buffer) -> bool:
    """Whether ``rec`` is a caller's own array (never deleted by tidyjax) that no live Tensor
    holds: the reports count it as the plain array it is (see `books`); a Tensor on it makes
    it counted again. A buffer tidyjax owns stays tidyjax's while only raw arrays hold it (an
    escaped ``t.array``): its scope, or ``dispose`` of the raw array, frees it."""
    return rec.n <= 0 and not rec.owned and rec.dead is None


def buffer_id(rec: _registry.Buffer) -> int:
    """One id per device buffer: a group of records over one buffer shares its group's."""
    group = _registry._groups.get(id(rec)) if _registry._groups else None
    return id(rec) if group is None else id(group)


def _own_bytes(arr: Any) -> int:
    return 0 if failed(arr) else local_nbytes(base_array(arr))


def watched_ids(watched: Mapping[str, list[tuple[str, Any]]]) -> set[int]:
    """The ids of the watched arrays, as ``jax.live_arrays()`` lists them (a typed PRNG key
    appears there as its array of words)."""
    return {id(base_array(a)) for found in watched.values() for _, a in found}


def _all_processes(scan_untracked: bool, timeout: float) -> MemoryInfo:
    local = memory(scan_untracked=scan_untracked)
    reports = [_from_json(d) for d in gather("memory", _to_json(local), timeout)]
    per_device: dict[Any, int] = {}
    stats: dict[Any, Mapping[str, int]] = {}
    for r in reports:
        for d, b in r.bytes_per_device.items():
            per_device[d] = per_device.get(d, 0) + b
        stats.update(r.device_stats)
    untracked = [r.untracked_arrays for r in reports]
    return MemoryInfo(
        num_tensors=sum(r.num_tensors for r in reports),
        num_data_buffers=sum(r.num_data_buffers for r in reports),
        num_bytes=sum(r.num_bytes for r in reports),
        bytes_per_device=MappingProxyType(per_device),
        unreliable=any(r.unreliable for r in reports),
        reasons=tuple(
            reason if len(reports) == 1 else f"process {i}: {reason}"
            for i, r in enumerate(reports)
            for reason in r.reasons
        ),
        untracked_arrays=None if None in untracked else sum(u or 0 for u in untracked),
        untracked_bytes=None if None in untracked else sum(r.untracked_bytes or 0 for r in reports),
        untracked_sites=tuple(u for r in reports for u in r.untracked_sites),  # devices differ
        device_stats=MappingProxyType(stats),
        per_process=tuple(reports),
        watched=MappingProxyType(_sum_watched(reports, "watched")),
        watched_arrays=MappingProxyType(_sum_watched(reports, "watched_arrays")),
        watched_per_device=MappingProxyType(_merge(reports, "watched_per_device")),
        untracked_per_device=MappingProxyType(_merge(reports, "untracked_per_device")),
        top_sites=tuple(t for r in reports for t in r.top_sites),  # devices differ
    )


def _merge(reports: list[MemoryInfo], field: str) -> dict[Any, int]:
    out: dict[Any, int] = {}
    for r in reports:
        for d, b in getattr(r, field).items():
            out[d] = out.get(d, 0) + b
    return out


def _sum_watched(reports: list[MemoryInfo], field: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in reports:
        for name, b in getattr(r, field).items():
            out[name] = out.get(name, 0) + b
    return out


def _to_json(m: MemoryInfo) -> dict[str, Any]:
    return {
        "num_tensors": m.num_tensors,
        "num_data_buffers": m.num_data_buffers,
        "num_bytes": m.num_bytes,
        "bytes_per_device": {str(d.id): b for d, b in m.bytes_per_device.items()},
        "reasons": list(m.reasons),
        "untracked_arrays": m.untracked_arrays,
        "untracked_bytes": m.untracked_bytes,
        "untracked_sites": [_site_to_json(u) for u in m.untracked_sites],
        "device_stats": {str(d.id): dict(s) for d, s in m.device_stats.items()},
        "watched": dict(m.watched),
        "watched_arrays": dict(m.watched_arrays),
        "watched_per_device": {str(d.id): b for d, b in m.watched_per_device.items()},
        "untracked_per_device": {str(d.id): b for d, b in m.untracked_per_device.items()},
        "top_sites": [_top_to_json(t) for t in m.top_sites],
    }


def _frame_to_json(s: Site | None) -> dict[str, Any] | None:
    return None if s is None else {"file": s.file, "line": s.line, "function": s.function}


def _frame_from_json(f: dict[str, Any] | None, detail: Site | None = None) -> Site | None:
    return None if f is None else Site(f["file"], f["line"], f["function"], detail)


def _top_to_json(t: TopSite) -> dict[str, Any]:
    return {"device": t.device, "kind": t.kind, "site": _frame_to_json(t.site),
            "name": t.name, "count": t.count, "bytes": t.bytes}  # fmt: skip


def _top_from_json(d: dict[str, Any]) -> TopSite:
    site = _frame_from_json(d["site"])
    return TopSite(d["device"], d["kind"], site, d["name"], d["count"], d["bytes"])


def _site_to_json(u: UntrackedSite) -> dict[str, Any]:
    def frame(s: Site | None) -> dict[str, Any] | None:
        return None if s is None else {"file": s.file, "line": s.line, "function": s.function}

    site = u.site
    return {
        "device": u.device,
        "site": frame(site),
        "detail": frame(site.detail) if site is not None else None,
        "count": u.count,
        "bytes": u.bytes,
    }


def _site_from_json(d: dict[str, Any]) -> UntrackedSite:
    def frame(f: dict[str, Any] | None, detail: Site | None = None) -> Site | None:
        return None if f is None else Site(f["file"], f["line"], f["function"], detail)

    site = frame(d["site"], frame(d.get("detail")))
    return UntrackedSite(d["device"], site, d["count"], d["bytes"])


def _from_json(d: dict[str, Any]) -> MemoryInfo:
    devices = {dev.id: dev for dev in jax.devices()}
    return MemoryInfo(
        num_tensors=d["num_tensors"],
        num_data_buffers=d["num_data_buffers"],
        num_bytes=d["num_bytes"],
        bytes_per_device=MappingProxyType(
            {devices[int(k)]: b for k, b in d["bytes_per_device"].items()}
        ),
        unreliable=bool(d["reasons"]),
        reasons=tuple(d["reasons"]),
        untracked_arrays=d["untracked_arrays"],
        untracked_bytes=d["untracked_bytes"],
        untracked_sites=tuple(_site_from_json(u) for u in d.get("untracked_sites", ())),
        device_stats=MappingProxyType(
            {devices[int(k)]: MappingProxyType(s) for k, s in d["device_stats"].items()}
        ),
        watched=MappingProxyType(d.get("watched", {})),
        watched_arrays=MappingProxyType(d.get("watched_arrays", {})),
        watched_per_device=MappingProxyType(
            {devices[int(k)]: b for k, b in d.get("watched_per_device", {}).items()}
        ),
        untracked_per_device=MappingProxyType(
            {devices[int(k)]: b for k, b in d.get("untracked_per_device", {}).items()}
        ),
        top_sites=tuple(_top_from_json(t) for t in d.get("top_sites", ())),
    )


def _device_bytes(arr: Any) -> Iterable[tuple[Any, int]]:
    """``shard_bytes(arr)``'s items, with the common case of one device read at once."""
    devices = arr.sharding.device_set
    if len(devices) == 1 and arr.is_fully_addressable:
        return ((next(iter(devices)), int(arr.nbytes)),)
    return shard_bytes(arr).items()


def untracked_sites(arrays: list[Any], top: int = TOP_SITES) -> tuple[UntrackedSite, ...]:
    """The ``top`` largest creation sites of ``arrays`` on each device (count and bytes there),
    by device, then largest first. Reads each array's creation traceback: report time only."""
    # (device, site) -> [count, bytes]; a key keeps the first site seen, with its detail
    groups: dict[tuple[str, Site | None], list[int]] = {}
    for arr in arrays:
        site = creation_site(arr)
        for dev, nbytes in _device_bytes(arr):
            row = groups.setdefault((str(dev), site), [0, 0])
            row[0] += 1
            row[1] += nbytes
    by_device: dict[str, list[UntrackedSite]] = {}
    for (dev, site), (n, b) in groups.items():
        by_device.setdefault(dev, []).append(UntrackedSite(dev, site, n, b))
    out: list[UntrackedSite] = []
    for dev in sorted(by_device):
        rows = sorted(by_device[dev], key=lambda u: (-u.bytes, -u.count, str(u.site)))
        out += rows[:top]
    return tuple(out)


def find_untracked(recs: list[_registry.Buffer], watched: set[int] | None = None) -> list[Any]:
    """The jax arrays alive in the process whose buffers tidyjax does not record, less those
    a watched object holds (``watched``: their ids; by default, found now).

    An array object tidyjax never saw may still be a view of a recorded buffer (a shard from
    ``addressable_shards``, a raw ``device_put`` to the same device): those are recognised by
    address, read only from buffers that are ready. An array whose computation failed (out of
    memory) holds nothing and is skipped: JAX calls it ready, but reading its address aborts.
    """
    if watched is None:
        watched = watched_ids(_watched())
    candidates: list[Any] = []
    held: list[Any] = []
    for platform in {d.platform for d in jax.local_devices()}:
        for arr in jax.live_arrays(platform):
            rec = _registry.lookup(arr)
            if (rec is None or released(rec)) and not failed(arr):
                (held if id(arr) in watched else candidates).append(arr)
    if not candidates:
        return []
    owned: set[Any] = set()  # buffers tidyjax records or a watched object holds
    for a in [a for rec in recs for a in rec.arrays()] + held:
        key = None if failed(a) else _registry.same_buffer_key(a)
        if key:
            owned.add(key)
            owned.update((p,) for p in key)  # its per-shard views
    # Several objects over one untracked buffer (a shard view JAX made and keeps) count once:
    # the arrays with the most shards first, so a shard view comes after its whole array.
    keyed = sorted(
        ((arr, _registry.same_buffer_key(arr)) for arr in candidates),
        key=lambda pair: -len(pair[1] or ()),
    )
    out, seen = [], set()
    for arr, key in keyed:
        if key is not None and (key in owned or key in seen):
            continue
        out.append(arr)
        if key:
            seen.add(key)
            seen.update((p,) for p in key)
    return out
