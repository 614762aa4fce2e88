"""A timeline as Chrome trace-event JSON: ``Timeline.to_chrome_trace(path)``.

The trace-event format's "JSON Object Format" (``{"traceEvents": [...], "displayTimeUnit":
"ms"}``), which Perfetto's UI (ui.perfetto.dev, offline too) and ``chrome://tracing`` open:

* one process, ``tidyjax memory``, named by a metadata event (``"ph": "M"``, ``process_name``),
  its threads too (``thread_name``, ``thread_sort_index``);
* a counter track per device (``"ph": "C"``, named by the device, ``args: {"bytes in use":
  n}``): the bytes alive there, each shared buffer once, as ``memory().bytes_per_device``
  counts them; with several devices a track of their sum as well;
* each scope a complete slice (``"ph": "X"``, ``ts`` and ``dur`` in microseconds) on a
  ``scopes`` thread; scopes that overlap without nesting (threads, asyncio tasks) go on further
  ``scopes`` threads, so that slices on one thread always nest;
* optionally an instant event (``"ph": "i"``) per allocation and free on a ``buffers`` thread,
  with its bytes, site, scope, shape and dtype; a global instant at the peak and one per
  annotation (`Timeline.annotate`).

Times are microseconds since the timeline started. The timeline is read through its kept
events (``_window()``), so this module imports no timeline code.
"""

from __future__ import annotations

import gzip
import json
import os
import pathlib
from collections.abc import Iterable
from typing import Any

from ._format import fmt_bytes
from ._timeline_format import ALLOC, FREE, SCOPE_ENTER, SCOPE_EXIT, TimelineEvent

__all__ = ["PID", "chrome_trace", "write"]

#: The one process of the trace.
PID = 1
_TID_BUFFERS = 1
_TID_SCOPES = 2  # the first scopes thread; more follow where scopes overlap without nesting
#: The counter's one series: Perfetto names the track "<event name> <arg>" ("cpu:0 bytes in use").
_COUNTER = "bytes in use"


def _us(t: float, t0: float) -> float:
    """``t`` (seconds, ``perf_counter``'s clock) as microseconds since ``t0``, to 0.001 us."""
    return round((t - t0) * 1e6, 3)


def _shares(ev: TimelineEvent) -> Iterable[tuple[str, int]]:
    """The bytes ``ev``'s buffer has on each device (its own device when none is recorded)."""
    return ev.per_device or ((ev.device or "device", ev.bytes),)


def _meta(name: str, tid: int, value: Any) -> dict[str, Any]:
    return {"name": name, "ph": "M", "pid": PID, "tid": tid, "args": {"name": value}}


def _counters(
    base: list[TimelineEvent], events: list[TimelineEvent], t0: float, start: float
) -> list[dict[str, Any]]:
    """The counter events: each device's bytes after every change, one value per moment."""
    devices: dict[str, int] = {}
    for ev in [*base, *events]:
        if ev.kind in (ALLOC, FREE):
            for d, _ in _shares(ev):
                devices.setdefault(d, 0)
    total = "all devices" if len(devices) > 1 else None
    out: list[dict[str, Any]] = []
    last: dict[str, dict[str, Any]] = {}  # track -> its latest counter event

    def put(track: str, ts: float, value: int) -> None:
        prev = last.get(track)
        if prev is not None and prev["ts"] == ts:  # one value per moment: the latest
            prev["args"][_COUNTER] = value
            return
        ev = {"name": track, "cat": "memory", "ph": "C", "ts": ts, "pid": PID, "tid": 0,
              "args": {_COUNTER: value}}  # fmt: skip
        last[track] = ev
        out.append(ev)

    for ev in base:
        for d, b in _shares(ev):
            devices[d] += b
    ts0 = _us(start, t0)
    for d, b in devices.items():
        put(d, ts0, b)
    if total:
        put(total, ts0, sum(devices.values()))
    for ev in events:
        if ev.kind not in (ALLOC, FREE):
            continue
        sign = 1 if ev.kind == ALLOC else -1
        ts = _us(ev.time, t0)
        for d, b in _shares(ev):
            devices[d] += sign * b
            put(d, ts, devices[d])
        if total:
            put(total, ts, sum(devices.values()))
    return out


def _scope_slices(
    events: list[TimelineEvent], t0: float, start: float, end: float
) -> list[list[dict[str, Any]]]:
    """The scopes as complete slices, one list per thread, each sorted and properly nested."""
    spans: dict[int, list[Any]] = {}  # scope number -> [start, end, name, path]
    for ev in events:
        if ev.kind == SCOPE_ENTER:
            spans[ev.buffer] = [ev.time, None, ev.name or "<tidy>", ev.scope]
        elif ev.kind == SCOPE_EXIT:
            span = spans.get(ev.buffer)
            if span is None:  # entered before the events kept
                spans[ev.buffer] = [start, ev.time, ev.name or "<tidy>", ev.scope]
            else:
                span[1] = ev.time
    ordered = sorted(
        ((s, end if e is None else e, name, path) for s, e, name, path in spans.values()),
        key=lambda span: (span[0], -span[1]),
    )
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
            "pid": PID, "tid": _TID_SCOPES + i, "args": {"path": path},
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
    out = []
    for ev in events:
        if ev.kind not in (ALLOC, FREE):
            continue
        what = f"{ev.dtype}{list(ev.shape)}".replace(" ", "")
        out.append({
            "name": f"{ev.kind} {what} {fmt_bytes(ev.bytes)}", "cat": ev.kind, "ph": "i",
            "s": "t", "ts": _us(ev.time, t0), "pid": PID, "tid": _TID_BUFFERS,
            "args": {
                "bytes": ev.bytes, "device": ev.device, "site": str(ev.site or "<unknown site>"),
                "scope": ev.scope, "shape": list(ev.shape), "dtype": ev.dtype,
                "buffer": ev.buffer, "tensors": list(ev.tensors),
            },
        })  # fmt: skip
    return out


def chrome_trace(tl: Any, *, buffers: bool = True) -> dict[str, Any]:
    """``tl`` (a ``tidyjax.Timeline``) as trace-event JSON data (the JSON Object Format).

    Args:
        tl: the timeline.
        buffers: also an instant event per allocation and free (with its site, scope, shape).
    """
    base, events = tl._window()
    first = events[0].time if events else 0.0
    t0 = tl.start_time if tl.start_time is not None else first
    t0 = min(t0, first) if events else t0
    start = first if tl.dropped and events else t0  # before the kept events: unknown
    end = tl.stop_time if tl.stop_time is not None else (events[-1].time if events else t0)
    end = max(end, events[-1].time) if events else end
    threads = _scope_slices(events, t0, start, end)
    trace: list[dict[str, Any]] = [
        _meta("process_name", 0, "tidyjax memory"),
        {"name": "process_sort_index", "ph": "M", "pid": PID, "tid": 0, "args": {"sort_index": 0}},
    ]
    names = [(_TID_BUFFERS, "buffers")] if buffers else []
    names += [
        (_TID_SCOPES + i, "scopes" if i == 0 else f"scopes {i + 1}") for i in range(len(threads))
    ]
    for tid, name in names:
        trace.append(_meta("thread_name", tid, name))
        trace.append({"name": "thread_sort_index", "ph": "M", "pid": PID, "tid": tid,
                      "args": {"sort_index": tid}})  # fmt: skip
    trace += _counters(base, events, t0, start)
    for slices in threads:
        trace += slices
    if buffers:
        trace += _instants(events, t0)
    if tl.peak_bytes and (not events or tl.peak_time >= start):
        trace.append({
            "name": f"peak {fmt_bytes(tl.peak_bytes)}", "cat": "peak", "ph": "i", "s": "g",
            "ts": _us(tl.peak_time, t0), "pid": PID, "tid": 0,
            "args": {"bytes": tl.peak_bytes},
        })  # fmt: skip
    for mark in getattr(tl, "annotations", ()):  # Timeline.annotate: a global instant
        if events and mark.time < start:
            continue
        trace.append({
            "name": mark.label, "cat": "annotation", "ph": "i", "s": "g",
            "ts": _us(mark.time, t0), "pid": PID, "tid": 0,
            "args": {} if mark.bytes is None else {"bytes": mark.bytes},
        })  # fmt: skip
    return {
        "traceEvents": trace,
        "displayTimeUnit": "ms",
        "otherData": {
            "producer": "tidyjax",
            "started_at": tl.started_at,
            "peak_bytes": tl.peak_bytes,
            "dropped_events": tl.dropped,
        },
    }


def write(tl: Any, path: str | os.PathLike[str], *, buffers: bool = True) -> pathlib.Path:
    """Write `chrome_trace` of ``tl`` to ``path`` (gzip-compressed when it ends in
    ``.gz``), creating missing parent folders; returns the path written."""
    target = pathlib.Path(os.fspath(path))
    text = json.dumps(chrome_trace(tl, buffers=buffers), separators=(",", ":"))
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.name.endswith(".gz"):
        with gzip.open(target, "wt", encoding="utf-8") as f:
            f.write(text)
    else:
        target.write_text(text, encoding="utf-8")
    return target
