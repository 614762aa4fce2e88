"""Timeline.to_chrome_trace: Chrome trace-event JSON (the JSON Object Format) for Perfetto.

The fields checked are the format's documented ones (Trace Event Format, Google, "JSON Object
Format"): every event has ``name``, ``ph``, ``pid``, ``tid`` and, but for metadata, ``ts`` in
microseconds; a complete event (``X``) has ``dur``; a counter (``C``) has ``args`` of numbers; a
metadata event (``M``) names a process or thread in ``args.name``; an instant (``i``) has a
scope ``s`` of ``g``, ``p`` or ``t``.
"""

from __future__ import annotations

import collections
import gzip
import json
import pathlib
import threading

import numpy as np
import pytest

import tidyjax as tj
from tidyjax import _timeline_format

PHASES = {"B", "E", "X", "i", "I", "C", "M"}


def check_format(data: dict) -> list[dict]:
    """The trace-event format's documented fields and rules; returns the events."""
    assert set(data) >= {"traceEvents", "displayTimeUnit"}
    assert data["displayTimeUnit"] in ("ms", "ns")
    events = data["traceEvents"]
    assert isinstance(events, list) and events
    last_ts: dict[tuple, float] = {}
    open_b: collections.Counter = collections.Counter()
    for ev in events:
        assert isinstance(ev["name"], str) and ev["name"], ev
        assert ev["ph"] in PHASES, ev
        assert isinstance(ev["pid"], int) and isinstance(ev["tid"], int), ev
        if ev["ph"] == "M":
            assert ev["name"] in {
                "process_name", "process_sort_index", "thread_name", "thread_sort_index",
            }, ev  # fmt: skip
            assert set(ev["args"]) & {"name", "sort_index"}, ev
            continue
        assert isinstance(ev["ts"], (int, float)) and ev["ts"] >= 0, ev
        track = (ev["pid"], ev["tid"], ev["name"]) if ev["ph"] == "C" else (ev["pid"], ev["tid"])
        assert ev["ts"] >= last_ts.get(track, 0.0), f"ts goes back on {track}: {ev}"
        last_ts[track] = ev["ts"]
        if ev["ph"] == "X":
            assert isinstance(ev["dur"], (int, float)) and ev["dur"] >= 0, ev
        elif ev["ph"] == "C":
            assert ev["args"] and all(isinstance(v, (int, float)) for v in ev["args"].values())
        elif ev["ph"] == "i":
            assert ev["s"] in ("g", "p", "t"), ev
        elif ev["ph"] == "B":
            open_b[(ev["pid"], ev["tid"])] += 1
        elif ev["ph"] == "E":
            open_b[(ev["pid"], ev["tid"])] -= 1
            assert open_b[(ev["pid"], ev["tid"])] >= 0, ev
    assert not +open_b, f"unbalanced B/E: {open_b}"
    return events


def check_nesting(events: list[dict]) -> None:
    """On each thread, complete slices nest: none ends inside another it started after."""
    by_thread: dict[tuple, list] = collections.defaultdict(list)
    for ev in events:
        if ev["ph"] == "X":
            by_thread[(ev["pid"], ev["tid"])].append((ev["ts"], ev["ts"] + ev["dur"]))
    for spans in by_thread.values():
        stack: list[float] = []
        for start, end in spans:
            while stack and stack[-1] <= start:
                stack.pop()
            assert not stack or end <= stack[-1] + 1e-6, spans
            stack.append(end)


def named(events, ph):
    return [e for e in events if e["ph"] == ph]


def thread_names(events) -> dict[int, str]:
    return {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"}


def counter(events, device: str) -> list[tuple[float, int]]:
    return [(e["ts"], e["args"]["bytes in use"]) for e in events
            if e["ph"] == "C" and e["name"] == device]  # fmt: skip


def record() -> tj.Timeline:
    with tj.timeline() as tl:
        with tj.tidy("train"):
            for _ in range(2):
                with tj.tidy("step"):
                    a = tj.tensor(np.ones(256, np.float32))  # 1 KiB
                    b = a * 2.0  # 1 KiB
                    del a, b
        kept = tj.keep(tj.tensor(np.ones(64, np.float32)))  # 256 B
    kept.dispose()
    return tl


def test_a_timeline_written_as_a_chrome_trace_has_the_documented_fields(tmp_path):
    tl = record()
    path = tmp_path / "trace.json"
    tl.to_chrome_trace(path)
    events = check_format(json.loads(path.read_text(encoding="utf-8")))
    check_nesting(events)
    meta = [e for e in events if e["name"] == "process_name"]
    assert meta == [{"name": "process_name", "ph": "M", "pid": 1, "tid": 0,
                     "args": {"name": "tidyjax memory"}}]  # fmt: skip
    assert set(thread_names(events).values()) == {"buffers", "scopes"}

    # scopes: one train slice around two step slices, on the scopes thread, in microseconds
    slices = named(events, "X")
    assert [(s["name"], s["args"]["path"]) for s in slices] == [
        ("train", "train"), ("step", "train/step"), ("step", "train/step")
    ]  # fmt: skip
    assert {thread_names(events)[s["tid"]] for s in slices} == {"scopes"}
    train = slices[0]
    for step in slices[1:]:
        assert train["ts"] <= step["ts"] and step["ts"] + step["dur"] <= train["ts"] + train["dur"]
    scope_events = [e for e in tl.events if e.kind.startswith("scope")]
    t0 = tl.start_time
    assert train["ts"] == pytest.approx((scope_events[0].time - t0) * 1e6, abs=0.01)

    # the counter: one track for the one device, its values replaying the events
    (device,) = {d for ev in tl.events for d, _ in ev.per_device}
    values = counter(events, device)
    assert values[0] == (0.0, 0)
    assert max(v for _, v in values) == tl.peak_bytes == 2048
    assert values[-1][1] == 256  # the kept Tensor, disposed after the recording
    assert [ts for ts, _ in values] == sorted({ts for ts, _ in values})  # one value per moment

    # buffers: an instant per alloc and free, with its metadata
    instants = [e for e in events if e["ph"] == "i" and e["s"] == "t"]
    allocs = [e for e in instants if e["cat"] == "alloc"]
    assert len(allocs) == 5 and len([e for e in instants if e["cat"] == "free"]) == 4
    assert {e["args"]["scope"] for e in allocs} == {"train/step", ""}  # owner when allocated
    assert allocs[0]["args"]["bytes"] == 1024 and allocs[0]["args"]["dtype"] == "float32"
    assert "test_chrome_trace.py" in allocs[0]["args"]["site"]
    (peak,) = [e for e in events if e.get("cat") == "peak"]
    assert peak["s"] == "g" and peak["args"]["bytes"] == 2048
    assert peak["ts"] == pytest.approx((tl.peak_time - t0) * 1e6, abs=0.01)


def test_annotations_are_global_instants_with_their_label_and_bytes():
    with tj.timeline() as tl:
        x = tj.tensor(np.ones(64, np.float32))
        mark = tl.annotate("evaluation starts", bytes=4096)
        tl.annotate("no bytes")
        x.dispose()
    events = _timeline_format.chrome_trace(tl)["traceEvents"]
    marks = [e for e in events if e.get("cat") == "annotation"]
    assert [(e["name"], e["ph"], e["s"], e["args"]) for e in marks] == [
        ("evaluation starts", "i", "g", {"bytes": 4096}),
        ("no bytes", "i", "g", {}),
    ]
    assert marks[0]["ts"] == pytest.approx((mark.time - tl.start_time) * 1e6, abs=0.01)


def test_gzip_str_paths_and_missing_folders(tmp_path):
    tl = record()
    target = tmp_path / "new" / "deeper" / "trace.json.gz"
    tl.to_chrome_trace(str(target))  # a str, folders that do not exist yet
    with gzip.open(target, "rt", encoding="utf-8") as f:
        zipped = json.load(f)
    check_format(zipped)
    plain = tmp_path / "plain.json"
    tl.to_chrome_trace(pathlib.PurePath(plain))  # any os.PathLike
    assert json.loads(plain.read_text(encoding="utf-8")) == zipped
    tl.to_chrome_trace(tmp_path / "small.json", buffers=False)
    small = check_format(json.loads((tmp_path / "small.json").read_text(encoding="utf-8")))
    assert not [e for e in small if e.get("cat") in ("alloc", "free")]
    assert "buffers" not in thread_names(small).values()


def test_scopes_that_overlap_without_nesting_go_on_separate_threads(tmp_path):
    """Two threads' scopes interleave (a enters, b enters, a exits, b exits): no one thread
    of the trace could nest them, so the second goes on a second scopes thread."""
    entered, exited = threading.Event(), threading.Event()

    def other() -> None:
        with tj.tidy("b"):
            entered.set()
            exited.wait(10)

    with tj.timeline() as tl:
        t = threading.Thread(target=other)
        with tj.tidy("a"):
            t.start()
            entered.wait(10)
        exited.set()
        t.join()
    data = _timeline_format.chrome_trace(tl)
    events = check_format(data)
    check_nesting(events)
    slices = {e["name"]: e for e in named(events, "X")}
    assert set(slices) == {"a", "b"}
    assert slices["a"]["tid"] != slices["b"]["tid"]
    names = thread_names(events)
    assert {names[slices["a"]["tid"]], names[slices["b"]["tid"]]} == {"scopes", "scopes 2"}


def test_several_devices_get_a_counter_each_and_a_sum():
    import jax

    devices = jax.devices()
    if len(devices) < 2:
        pytest.skip("one device (set XLA_FLAGS=--xla_force_host_platform_device_count=2)")
    with tj.timeline() as tl:
        x = tj.tensor(np.ones(128, np.float32), device=devices[0])
        y = tj.tensor(np.ones(64, np.float32), device=devices[1])
    events = check_format(_timeline_format.chrome_trace(tl))
    names = {e["name"] for e in events if e["ph"] == "C"}
    assert names == {str(devices[0]), str(devices[1]), "all devices"}
    assert counter(events, "all devices")[-1][1] == 768
    tj.dispose([x, y])


def test_a_timeline_with_dropped_events_starts_from_what_they_left_alive():
    with tj.timeline(max_events=3) as tl:
        a = tj.tensor(np.ones(100, np.float32))  # 400 B, its alloc dropped
        bs = [tj.tensor(np.ones(25, np.float32)) for _ in range(4)]  # 100 B each
    assert tl.dropped
    events = check_format(_timeline_format.chrome_trace(tl))
    (device,) = {d for ev in tl.events for d, _ in ev.per_device}
    values = counter(events, device)
    first_kept = (tl.events[0].time - tl.start_time) * 1e6
    assert values[0][0] == pytest.approx(first_kept, abs=0.01)
    assert values[-1][1] == 800
    tj.dispose([a, *bs])


def test_a_snapshot_view_is_one_moment(tmp_path):
    x = tj.tensor(np.ones(10, np.float32))
    tl = tj.Timeline.from_snapshot(tj.snapshot())
    events = check_format(_timeline_format.chrome_trace(tl))
    assert {e["ts"] for e in events if e["ph"] != "M"} == {0.0}
    assert [v for _, v in counter(events, str(x.array.devices().pop()))] == [40]
    x.dispose()


class _TwoDevices:
    """A recorded timeline's surface, with one buffer sharded over two devices."""

    start_time, stop_time, started_at, dropped = 10.0, 10.004, 1.7e9, 0
    peak_time, peak_bytes = 10.002, 600

    def _window(self):
        from tidyjax._timeline_format import TimelineEvent

        a = TimelineEvent("alloc", 10.001, 400, "gpu:0,gpu:1", None, "", (100,), "float32",
                          (1,), 1, "", (("gpu:0", 200), ("gpu:1", 200)))  # fmt: skip
        b = TimelineEvent("alloc", 10.002, 200, "gpu:1", None, "", (50,), "float32", (2,), 2,
                          "", (("gpu:1", 200),))  # fmt: skip
        return [], [a, b, a._replace(kind="free", time=10.003)]


def test_a_sharded_buffer_counts_its_shard_on_each_device():
    events = check_format(_timeline_format.chrome_trace(_TwoDevices()))
    assert counter(events, "gpu:0") == [(0.0, 0), (1000.0, 200), (3000.0, 0)]
    assert counter(events, "gpu:1") == [(0.0, 0), (1000.0, 200), (2000.0, 400), (3000.0, 200)]
    assert counter(events, "all devices") == [(0.0, 0), (1000.0, 400), (2000.0, 600),
                                              (3000.0, 200)]  # fmt: skip
