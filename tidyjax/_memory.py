"""``memory()``: what tidyjax holds now, and whether that figure can be trusted."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import jax

from . import _html, _registry

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
    """

    __slots__ = (
        "bytes_per_device",
        "device_stats",
        "num_bytes",
        "num_data_buffers",
        "num_tensors",
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

    def __init__(self, **fields: Any) -> None:
        for name in self.__slots__:
            object.__setattr__(self, name, fields[name])

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("MemoryInfo is immutable")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, MemoryInfo):
            return NotImplemented
        return all(getattr(self, n) == getattr(other, n) for n in self.__slots__)

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


def memory(*, scan_untracked: bool = True) -> MemoryInfo:
    """A snapshot of the Tensors, buffers and bytes tidyjax holds now.

    Args:
        scan_untracked: also look through ``jax.live_arrays()`` for arrays tidyjax does not own
            and report them (costs milliseconds per ten thousand live arrays). With False,
            ``untracked_arrays`` is ``None``.

    Example::

        info = tidyjax.memory()
        print(info.num_tensors, info.num_bytes)
    """
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
