"""``memory()``: what tidyjax holds now, and whether that figure can be trusted."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import jax

from . import _html, _registry
from ._processes import DEFAULT_TIMEOUT, gather

__all__ = ["MemoryInfo", "memory"]


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"  # pragma: no cover


class MemoryInfo:
    """An immutable snapshot of tidyjax's accounting, as returned by :func:`memory`.

    Attributes:
        num_tensors: live Tensor objects, Variables included.
        num_data_buffers: distinct device buffers they hold (aliases share one).
        num_bytes: logical bytes of those buffers, each buffer counted once.
        bytes_per_device: bytes on each ``jax.Device``; a replicated buffer counts on every
            device that holds a copy, a sharded one counts each device's shard.
        unreliable: True when the figures above do not describe the process's device memory.
        reasons: why ``unreliable`` is True, one sentence each.
        untracked_arrays, untracked_bytes: jax arrays alive in the process that tidyjax does
            not own (``None`` when not scanned).
        device_stats: ``Device.memory_stats()`` per device where the backend reports it
            (GPU/TPU); empty on CPU.
        per_process: with ``memory(all_processes=True)``, each process's report in
            process-index order (the other figures are their sums); else None.
    """

    __slots__ = (
        "bytes_per_device",
        "device_stats",
        "num_bytes",
        "num_data_buffers",
        "num_tensors",
        "per_process",
        "reasons",
        "unreliable",
        "untracked_arrays",
        "untracked_bytes",
    )

    num_tensors: int
    num_data_buffers: int
    num_bytes: int
    bytes_per_device: Mapping[Any, int]
    unreliable: bool
    reasons: tuple[str, ...]
    untracked_arrays: int | None
    untracked_bytes: int | None
    device_stats: Mapping[Any, Mapping[str, int]]
    per_process: tuple[MemoryInfo, ...] | None

    def __init__(self, **fields: Any) -> None:
        fields.setdefault("per_process", None)
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

    def __repr__(self) -> str:
        per_device = {str(d): b for d, b in self.bytes_per_device.items()}
        return (
            f"MemoryInfo(num_tensors={self.num_tensors}, num_data_buffers="
            f"{self.num_data_buffers}, num_bytes={self.num_bytes}, bytes_per_device="
            f"{per_device}, unreliable={self.unreliable}, reasons={self.reasons})"
        )

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(str(self))

    def _repr_html_(self) -> str:
        return _memory_html(self)

    def __str__(self) -> str:
        lines = [
            f"{self.num_tensors} tensors, {self.num_data_buffers} buffers, "
            f"{_fmt_bytes(self.num_bytes)}"
        ]
        lines += [
            f"  {d}: {_fmt_bytes(b)}"
            for d, b in sorted(self.bytes_per_device.items(), key=lambda kv: str(kv[0]))
        ]
        if self.unreliable:
            lines += [f"  unreliable: {r}" for r in self.reasons]
        return "\n".join(lines)


@_html.never_raises
def _memory_html(m: MemoryInfo) -> str:
    head = (
        f"<b>tidyjax memory</b>: {m.num_tensors} tensors, {m.num_data_buffers} buffers, "
        f"{_html.esc(_fmt_bytes(m.num_bytes))}"
    )
    top = max(m.bytes_per_device.values(), default=0) or 1
    rows = [
        (_html.esc(d), _html.esc(_fmt_bytes(b)), _html.bar(b / top))
        for d, b in sorted(m.bytes_per_device.items(), key=lambda kv: str(kv[0]))
    ]
    for d, stats in m.device_stats.items():
        used, limit = stats.get("bytes_in_use", 0), stats.get("bytes_limit", 0)
        if limit:
            text = f"{_fmt_bytes(used)} of {_fmt_bytes(limit)}"
            rows.append((_html.esc(f"{d} (all of JAX)"), _html.esc(text), _html.bar(used / limit)))
    parts = [head, _html.table(["device", "bytes", ""], rows)]
    parts += [f"<div>{_html.bad('unreliable')}: {_html.esc(r)}</div>" for r in m.reasons]
    return _html.box(*parts)


def memory(
    *, scan_untracked: bool = True, all_processes: bool = False, timeout: float = DEFAULT_TIMEOUT
) -> MemoryInfo:
    """A snapshot of the Tensors, buffers and bytes tidyjax holds now, in this process.

    In a ``jax.distributed`` job each process reports its own: its Tensors, and the bytes of
    the shards on its own devices (a global array counts its local shards).

    Args:
        scan_untracked: also look through ``jax.live_arrays()`` for arrays tidyjax does not own
            and report them (costs milliseconds per ten thousand live arrays). With False,
            ``untracked_arrays`` is ``None``.
        all_processes: a collective over every process of the job (each must call it): the
            counts are the sums over processes, ``bytes_per_device`` covers every device, and
            ``per_process`` holds each process's report. On a single process, ``memory()``
            with a one-element ``per_process``.
        timeout: seconds ``all_processes`` waits for every process.

    Raises:
        CollectiveError: with ``all_processes``, a process did not call it within ``timeout``.

    Example::

        info = tidyjax.memory()
        print(info.num_tensors, info.num_bytes)
    """
    if all_processes:
        return _all_processes(scan_untracked, timeout)
    recs, deleted = _registry.live()
    num_tensors = sum(max(rec.n, 0) for rec in recs + deleted)
    num_bytes = 0
    per_device: dict[Any, int] = {}
    for rec in recs:
        num_bytes += rec.size()
        for dev, b in _registry.device_bytes(rec).items():
            per_device[dev] = per_device.get(dev, 0) + b
    deleted_outside = len(deleted)

    reasons: list[str] = []
    if deleted_outside:
        reasons.append(
            f"{deleted_outside} buffer(s) held by live Tensors were deleted outside tidyjax "
            "(jax.Array.delete() or donation through raw jax.jit); those Tensors are unusable."
        )
    untracked_arrays = untracked_bytes = None
    if scan_untracked:
        untracked_arrays, untracked_bytes = _scan_untracked(recs)
        if untracked_arrays:
            reasons.append(
                f"{untracked_arrays} jax array(s) ({_fmt_bytes(untracked_bytes or 0)}) alive in "
                "this process are not owned by tidyjax; wrap them with tidyjax.adopt() or "
                "delete them to make the figures complete."
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
        device_stats=MappingProxyType(device_stats),
    )


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
        device_stats=MappingProxyType(stats),
        per_process=tuple(reports),
    )


def _to_json(m: MemoryInfo) -> dict[str, Any]:
    return {
        "num_tensors": m.num_tensors,
        "num_data_buffers": m.num_data_buffers,
        "num_bytes": m.num_bytes,
        "bytes_per_device": {str(d.id): b for d, b in m.bytes_per_device.items()},
        "reasons": list(m.reasons),
        "untracked_arrays": m.untracked_arrays,
        "untracked_bytes": m.untracked_bytes,
        "device_stats": {str(d.id): dict(s) for d, s in m.device_stats.items()},
    }


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
        device_stats=MappingProxyType(
            {devices[int(k)]: MappingProxyType(s) for k, s in d["device_stats"].items()}
        ),
    )


def _scan_untracked(recs: list[_registry.Buffer]) -> tuple[int, int]:
    """Count jax arrays alive in the process whose buffers tidyjax does not record.

    An array object tidyjax never saw may still be a view of a recorded buffer (a shard from
    ``addressable_shards``, a raw ``device_put`` to the same device): those are recognised by
    address, read only from buffers that are ready.
    """
    candidates = []
    for platform in {d.platform for d in jax.local_devices()}:
        for arr in jax.live_arrays(platform):
            if _registry.lookup(arr) is None:
                candidates.append(arr)
    if not candidates:
        return 0, 0
    owned: set[Any] = set()
    for rec in recs:
        for a in rec.arrays():
            key = _registry.same_buffer_key(a)
            if key:
                owned.add(key)
                owned.update((p,) for p in key)  # its per-shard views
    count = nbytes = 0
    for arr in candidates:
        if _registry.same_buffer_key(arr) in owned:
            continue
        count += 1
        nbytes += int(arr.nbytes)
    return count, nbytes
