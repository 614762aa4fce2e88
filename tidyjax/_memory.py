"""``memory()``: what tidyjax holds now, and whether that figure can be trusted. Its figures are
sums over one census (`_census`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import jax

from . import _html, _registry
from ._census import (
    Census,
    SiteStat,
    census,
    holder_lines,
    holder_rows,
    site_table,
    statistics,
    summed,
    top_per_device,
)
from ._errors import check_flag, check_seconds
from ._format import count, esc, fmt_bytes
from ._processes import DEFAULT_TIMEOUT, gather

__all__ = [
    "ALARM_BYTES", "ALARM_SHARE", "DEVICE_TOP", "TOP_SITES", "MemoryInfo", "device_stats", "memory",
]  # fmt: skip

#: How many creation sites of untracked arrays ``memory()`` names per device, largest first.
TOP_SITES = 5

#: How many holders (sites of Tensors and of untracked arrays, watched objects) ``memory()``
#: names per device, largest first.
DEVICE_TOP = 3

#: Untracked bytes are shown as an alarm from this many bytes, or from this share of all the
#: bytes counted (once those reach ``ALARM_BYTES``); a smaller stray is a note.
ALARM_BYTES = 1 << 20
ALARM_SHARE = 0.01


def _empty() -> Any:
    return dataclasses.field(default_factory=lambda: MappingProxyType({}))


@dataclasses.dataclass(frozen=True)
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
            sites as [`SiteStat`][tidyjax.SiteStat] rows (``device``, ``site``, ``count``,
            ``bytes``), by device, then largest first; empty when not scanned.
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
        top_sites: on each device, its `DEVICE_TOP` largest holders as
            [`SiteStat`][tidyjax.SiteStat] rows (Tensors by creation site, watched objects by
            ``name``, untracked arrays by creation site), by device, then largest first; empty
            when not scanned.
    """

    num_tensors: int
    num_data_buffers: int
    num_bytes: int
    bytes_per_device: Mapping[Any, int]
    unreliable: bool
    reasons: tuple[str, ...]
    untracked_arrays: int | None
    untracked_bytes: int | None
    untracked_sites: tuple[SiteStat, ...] = ()
    device_stats: Mapping[Any, Mapping[str, int]] = _empty()
    per_process: tuple[MemoryInfo, ...] | None = dataclasses.field(default=None, compare=False)
    watched: Mapping[str, int] = _empty()
    watched_arrays: Mapping[str, int] = _empty()
    watched_per_device: Mapping[Any, int] = _empty()
    untracked_per_device: Mapping[Any, int] = _empty()
    top_sites: tuple[SiteStat, ...] = ()

    __hash__ = None  # type: ignore[assignment]

    @property
    def total_per_device(self) -> dict[Any, int]:
        return summed((self.bytes_per_device, self.watched_per_device, self.untracked_per_device))

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

    @_html.never_raises
    def _repr_html_(self) -> str:
        """The devices as rows (each column of bars on one scale: tidyjax's bytes against the
        largest, JAX's own totals against each device's limit), then the largest holders."""
        parts = [f"<b>tidyjax memory</b>: {esc(_headline(self))}"]
        if not self.bytes_per_device and not self.num_data_buffers:
            parts.append(_html.line("nothing tracked: no live tensors"))
        if _devices(self) or self.untracked_arrays or self.watched:
            header, rows = _device_table(self)
            numeric = {i for i, h in enumerate(header) if i and h}  # bars have no heading
            parts.append(_html.table(header, rows, numeric))
            if self.top_sites:  # what holds the memory, not only how much
                parts.append(site_table(self.top_sites, f"largest holders (top {DEVICE_TOP})"))
            if self.untracked_sites:
                parts.append(site_table(self.untracked_sites, "untracked arrays made at"))
        # why the figures are incomplete: an alarm, except for a small untracked stray
        parts += [
            _html.line(_html.dim("note: "), esc(r))
            if note
            else _html.line(_html.bad("unreliable"), ": ", esc(r))
            for note, r in _notes(self)
        ]
        return _html.box(*parts)

    def __str__(self) -> str:
        lines = [_headline(self)]
        for d in _devices(self):
            lines.append(f"  {d}: {_device_sum(self, d)}")
            lines += [f"    {stats}" for stats in [_limit_line(self.device_stats.get(d))] if stats]
            lines += holder_lines(self.top_sites, str(d))
        for name, b in self.watched.items():
            n = count(self.watched_arrays.get(name, 0), "array")
            lines.append(f"  watched {name!r}: {fmt_bytes(b)} in {n}")
        if self.untracked_arrays:
            made = "; made at (largest first):" if self.untracked_sites else ""
            lines.append(
                f"  untracked: {count(self.untracked_arrays, 'jax array')} not owned by tidyjax, "
                f"{fmt_bytes(self.untracked_bytes or 0)}{made}"
            )
            lines += [f"    {u.device}: {u}" for u in self.untracked_sites]
        lines += [f"  {'note' if note else 'unreliable'}: {r}" for note, r in _notes(self)]
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
        return fmt_bytes(b)
    parts = [(b, "tidyjax"), (w, "watched")]
    parts += [(u, "untracked")] * (m.untracked_arrays is not None)  # not scanned: no figure
    return " + ".join(f"{fmt_bytes(n)} {what}" for n, what in parts) + f" = {fmt_bytes(b + w + u)}"


def _limit_line(s: Mapping[str, int] | None) -> str:
    """All of JAX on a device against its limit, with its peak, where the backend says."""
    if not s or not s.get("bytes_limit"):
        return ""
    used, limit = s.get("bytes_in_use", 0), s["bytes_limit"]
    peak = f"; peak {fmt_bytes(s['peak_bytes_in_use'])}" if "peak_bytes_in_use" in s else ""
    share = f"{fmt_bytes(used)} = {_share(used, limit)}"
    return f"in use (all of JAX) {share} of the limit {fmt_bytes(limit)}{peak}"


def _share(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "-"


#: How a reason names the arrays tidyjax released rather than delete (a note, not an alarm).
RELEASED_NOTE = "released, not deleted"


def _notes(m: MemoryInfo) -> list[tuple[bool, str]]:
    """Each reason, and whether it is only a note: untracked arrays that are a small stray
    rather than a gap worth an alarm."""
    u = m.untracked_bytes or 0
    total = sum(m.total_per_device.values()) or m.num_bytes + u
    minor = u < ALARM_BYTES and (total < ALARM_BYTES or u < ALARM_SHARE * total)
    return [((minor and "not owned by tidyjax" in r) or RELEASED_NOTE in r, r) for r in m.reasons]


def _headline(m: MemoryInfo) -> str:
    text = (
        f"{count(m.num_tensors, 'tensor')}, {count(m.num_data_buffers, 'buffer')}, "
        f"{fmt_bytes(m.num_bytes)}"
    )
    w, u = sum(m.watched_per_device.values()), sum(m.untracked_per_device.values())
    if w or u:
        text += f"; {fmt_bytes(m.num_bytes + w + u)} with watched and untracked arrays"
    return text


def _device_table(m: MemoryInfo) -> tuple[list[str], list[list[str]]]:
    """The devices' rows, then a row per watched object and one for the untracked arrays."""
    stats = {d: s for d, s in m.device_stats.items() if s.get("bytes_limit")}
    top = max([*m.bytes_per_device.values(), *m.watched.values(), m.untracked_bytes or 0]) or 1
    parted = any(m.watched_per_device.values()) or any(m.untracked_per_device.values())
    peaks = any("peak_bytes_in_use" in s for s in stats.values())
    header = ["device", "tidyjax bytes", ""]
    header += ["+ watched", "+ untracked", "= total on device"] * parted
    header += (["in use (all of JAX)", "limit", ""] + ["peak (all of JAX)"] * peaks) * bool(stats)
    rows: list[list[str]] = []
    for d in _devices(m):
        b = m.bytes_per_device.get(d, 0)
        row = [esc(d), fmt_bytes(b), _html.bar(b / top)]
        if parted:
            w, u = m.watched_per_device.get(d, 0), m.untracked_per_device.get(d, 0)
            unscanned = _html.dim("not scanned") if m.untracked_arrays is None else None
            row += [fmt_bytes(w), unscanned or fmt_bytes(u), fmt_bytes(b + w + u)]
        if stats:
            row += _limit_cells(stats.get(d), peaks)
        rows.append(row)
    pad = [""] * (len(header) - 3)
    extra = [(f"watched {name!r} (tidyjax.watch): {count(m.watched_arrays.get(name, 0), 'array')}",
              b) for name, b in m.watched.items()]  # fmt: skip
    if m.untracked_arrays:
        extra.append((f"untracked: {count(m.untracked_arrays, 'jax array')} (not tidyjax)",
                      m.untracked_bytes or 0))  # fmt: skip
    rows += [[esc(label), fmt_bytes(b), _html.bar(b / top), *pad] for label, b in extra]
    return header, rows


def _limit_cells(s: Mapping[str, int] | None, peaks: bool) -> list[str]:
    """JAX's own use on a device against its limit (and its peak), or blanks."""
    if not s:
        return [""] * (3 + peaks)
    used, limit, peak = s.get("bytes_in_use", 0), s["bytes_limit"], s.get("peak_bytes_in_use")
    shown = "" if peak is None else fmt_bytes(peak)
    use = f"{fmt_bytes(used)} ({_share(used, limit)})"
    return [use, fmt_bytes(limit), _html.bar(used / limit)] + [shown] * peaks


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
            Tensors' creation sites too, about 3 ms more per thousand Tensors). An array not
            owned by tidyjax that is still being computed is waited for (until then it cannot
            be told from a new object over a Tensor's buffer), except in a host callback. With
            False, ``untracked_arrays`` is ``None``, ``untracked_sites``, ``top_sites`` and
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
    timeout = check_seconds(timeout, "timeout", "memory()")
    if all_processes:
        return _all_processes(scan_untracked, timeout)
    c = census(untracked=scan_untracked, leaves=True)  # counting only: no batch is split
    tracked = c.of("tensor", "escaped")
    reasons = _why_unreliable(len(c.deleted), c.of("untracked"))
    return MemoryInfo(
        num_tensors=sum(max(rec.n, 0) for rec in c.recs + c.deleted),
        num_data_buffers=len(tracked) + len(c.deleted),
        num_bytes=sum(r.bytes for r in tracked),
        bytes_per_device=MappingProxyType(c.per_device("tensor", "escaped")),
        unreliable=bool(reasons),
        reasons=reasons,
        **_scanned(c),
        device_stats=MappingProxyType(device_stats()),
        watched=MappingProxyType({u.name: u.bytes for u in c.usage}),
        watched_arrays=MappingProxyType({u.name: u.arrays for u in c.usage}),
        watched_per_device=MappingProxyType(c.per_device("watched")),
    )


def _scanned(c: Census) -> dict[str, Any]:
    """The figures of the untracked arrays, and the largest holders: None and empty unless
    the census scanned for them."""
    if not c.scanned:
        return {"untracked_arrays": None, "untracked_bytes": None}
    untracked = c.of("untracked")
    return {
        "untracked_arrays": len(untracked),
        "untracked_bytes": sum(r.bytes for r in untracked),
        "untracked_sites": tuple(statistics(untracked, ("device", "site"), TOP_SITES)),
        "untracked_per_device": MappingProxyType(c.per_device("untracked")),
        # on each device its largest holders: sites of Tensors and untracked arrays, watched
        # objects by name
        "top_sites": tuple(top_per_device(holder_rows(c), DEVICE_TOP)),
    }


def _why_unreliable(deleted: int, untracked: list[Any]) -> tuple[str, ...]:
    reasons = []
    if deleted:
        reasons.append(
            f"{count(deleted, 'buffer')} held by live Tensors "
            f"{'was' if deleted == 1 else 'were'} deleted outside tidyjax "
            "(jax.Array.delete() or donation through raw jax.jit); those Tensors are unusable."
        )
    released = [r for r in untracked if _registry.is_released(r.array)]
    untracked = [r for r in untracked if not _registry.is_released(r.array)]
    if untracked:
        n, b = len(untracked), sum(r.bytes for r in untracked)
        reasons.append(
            f"{count(n, 'jax array')} ({fmt_bytes(b)}) alive in this process "
            f"{'is' if n == 1 else 'are'} not owned by tidyjax; wrap them with tidyjax.adopt(), "
            "delete them, or tidyjax.watch() the object holding them (a model, an optimizer) to "
            "make the figures complete."
        )
    if released:
        n, b = len(released), sum(sum(dict(r.spread).values()) for r in released)
        reasons.append(
            f"{count(n, 'array')} tidyjax made ({fmt_bytes(b)}, counted as untracked) "
            f"{'was' if n == 1 else 'were'} {RELEASED_NOTE}: part of {'its' if n == 1 else 'each'}"
            " buffer is a live holder's (for example a copy over several devices of a one-device"
            " Tensor, which shares that Tensor's buffer), and deleting it would delete that "
            "holder's data. JAX "
            "frees the rest when the last reference to it goes: drop the raw arrays you kept "
            "(a disposed Tensor's .array)."
        )
    return tuple(reasons)


def device_stats() -> dict[Any, Mapping[str, int]]:
    """``Device.memory_stats()`` of each local device whose backend reports it."""
    out: dict[Any, Mapping[str, int]] = {}
    for dev in jax.local_devices():
        try:
            stats = dev.memory_stats()
        except Exception:  # some backends raise instead of returning None
            stats = None
        if stats:
            out[dev] = MappingProxyType(dict(stats))
    return out


# -- over the processes of a job: each one's report as JSON, summed ----------------------------

#: The fields keyed by device (by id in the JSON), and those holding `SiteStat` rows.
_BY_DEVICE = ("bytes_per_device", "device_stats", "watched_per_device", "untracked_per_device")
_ROWS = ("untracked_sites", "top_sites")


def _all_processes(scan_untracked: bool, timeout: float) -> MemoryInfo:
    local = _to_json(memory(scan_untracked=scan_untracked))
    reports = [_from_json(d) for d in gather("memory", local, timeout)]
    scanned = all(r.untracked_arrays is not None for r in reports)

    def total(field: str) -> int:
        return sum(getattr(r, field) or 0 for r in reports)

    merged: dict[str, Any] = {f: tuple(t for r in reports for t in getattr(r, f)) for f in _ROWS}
    merged.update({f: MappingProxyType(summed(getattr(r, f) for r in reports)) for f in _SUMMED})
    merged.update({f: total(f) for f in ("num_tensors", "num_data_buffers", "num_bytes")})
    return MemoryInfo(
        unreliable=any(r.unreliable for r in reports),
        reasons=reports[0].reasons
        if len(reports) == 1
        else tuple(f"process {i}: {why}" for i, r in enumerate(reports) for why in r.reasons),
        untracked_arrays=total("untracked_arrays") if scanned else None,
        untracked_bytes=total("untracked_bytes") if scanned else None,
        device_stats=MappingProxyType({d: s for r in reports for d, s in r.device_stats.items()}),
        per_process=tuple(reports),
        **merged,  # the rows of every process (their devices differ), the sums key by key
    )


#: The fields summed key by key over the processes.
_SUMMED = ("bytes_per_device", "watched", "watched_arrays", "watched_per_device",
           "untracked_per_device")  # fmt: skip


def _to_json(m: MemoryInfo) -> dict[str, Any]:
    out = {f.name: getattr(m, f.name) for f in dataclasses.fields(m) if f.name != "per_process"}
    for f in _BY_DEVICE:
        out[f] = {str(d.id): v if isinstance(v, int) else dict(v) for d, v in out[f].items()}
    for f in _ROWS:
        out[f] = [t.to_json() for t in out[f]]
    return {k: dict(v) if isinstance(v, Mapping) else v for k, v in out.items()}


def _from_json(d: dict[str, Any]) -> MemoryInfo:
    devices = {dev.id: dev for dev in jax.devices()}
    fields = {k: _frozen(v) for k, v in d.items()}
    for f in _BY_DEVICE:
        fields[f] = MappingProxyType({devices[int(k)]: _frozen(v) for k, v in d[f].items()})
    for f in _ROWS:
        fields[f] = tuple(SiteStat.from_json(t) for t in d[f])
    fields["reasons"] = tuple(d["reasons"])
    return MemoryInfo(**fields)


def _frozen(v: Any) -> Any:
    return MappingProxyType(v) if isinstance(v, dict) else v
