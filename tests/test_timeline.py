"""timeline(): the events, the replay invariant (== memory() at every moment), files, the CLI."""

from __future__ import annotations

import asyncio
import base64
import collections
import gc
import json
import re
import subprocess
import sys
import threading
import time
import zlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import tidyjax as tj
from tidyjax import _registry, tidy
from tidyjax import _timeline as tlm
from tidyjax.__main__ import main as cli

from .conftest import computing_until_called_back, line_of, tensors_at_sites


@pytest.fixture(autouse=True)
def _no_timeline_left_open():
    yield
    assert tlm.active() is None
    assert not _registry.observers, "a test left an observer registered"


class Marks:
    """What memory() reported at moments of a recording, to hold the replay against."""

    def __init__(self) -> None:
        self.marks: list[tuple[float, int, dict[str, int]]] = []

    def __call__(self) -> None:
        m = tj.memory(scan_untracked=False)
        per = {str(d): b for d, b in m.bytes_per_device.items() if b}
        self.marks.append((time.perf_counter(), m.num_bytes, per))

    def check(self, tl: tj.Timeline) -> None:
        assert self.marks
        for t, nbytes, per in self.marks:
            live = tl.live_at(t)
            assert sum(r.bytes for r in live) == nbytes, (t, live)
            assert len({r._buffer for r in live}) == len(live)  # a shared buffer once
            assert _replay_per_device(tl, t) == per


def _replay_per_device(tl: tj.Timeline, t: float) -> dict[str, int]:
    """An independent replay of the events' per-device bytes up to ``t``."""
    base, events = tl._window()  # what dropped events left alive, then the events kept
    alive = {ev.buffer: ev for ev in base}
    for ev in events:
        if ev.time > t:
            break
        if ev.kind == "alloc":
            assert ev.buffer not in alive
            alive[ev.buffer] = ev
        elif ev.kind == "free":
            assert alive.pop(ev.buffer).bytes == ev.bytes
    per: dict[str, int] = collections.Counter()
    for ev in alive.values():
        for d, b in ev.per_device:
            per[d] += b
    return {d: b for d, b in per.items() if b}


def test_events_of_allocations_frees_and_scopes():
    with tj.timeline() as tl:
        a = tj.tensor(np.ones((2, 3), np.float32))  # site: a
        with tidy("outer"), tidy("inner"):
            b = a * 2  # site: b
            c = b.clone()
    assert tl.recording is False and tl.stop_time is not None
    kinds = [(e.kind, e.scope) for e in tl.events]
    assert kinds == [
        ("alloc", ""),
        ("scope_enter", "outer"),
        ("scope_enter", "outer/inner"),
        ("alloc", "outer/inner"),
        ("free", "outer/inner"),
        ("scope_exit", "outer/inner"),
        ("scope_exit", "outer"),
    ]
    alloc_a, enter, enter_inner, alloc_b, free_b, exit_inner, exit_outer = tl.events
    device = str(jax.devices()[0])
    assert (alloc_a.bytes, alloc_a.shape, alloc_a.dtype) == (24, (2, 3), "float32")
    assert alloc_a.device == device and alloc_a.per_device == ((device, 24),)
    assert alloc_a.site.file == __file__ and alloc_a.site.line == line_of("# site: a")
    assert alloc_a.tensors == (a.id,)
    assert alloc_b.site.line == line_of("# site: b") and alloc_b.tensors == (b.id,)
    # the free names every Tensor seen on the buffer: b and its clone
    assert free_b.buffer == alloc_b.buffer and set(free_b.tensors) == {b.id, c.id}
    assert (enter.name, enter_inner.name, exit_inner.name) == ("outer", "inner", "inner")
    assert enter.buffer == exit_outer.buffer and enter_inner.buffer == exit_inner.buffer
    assert all(x.time <= y.time for x, y in zip(tl.events, tl.events[1:], strict=False))
    with pytest.raises(AttributeError):
        alloc_a.bytes = 3  # immutable
    assert tl.peak_bytes == 48 and tl.peak_time == alloc_b.time
    assert b.is_disposed and c.is_disposed
    a.dispose()


def test_replay_equals_memory_at_every_moment():
    marks = Marks()
    before = tj.tensor(np.ones(100, np.float32))  # alive before: collected inside, unreported
    shared_before = before.clone()
    with tj.timeline() as tl:
        marks()
        a = tj.tensor(np.ones(1000, np.float32))
        marks()
        with tidy("outer"):
            b = a * 2
            marks()
            with tidy("inner") as inner:
                c = b + 1
                marks()
                c = c + 1  # the first c is collected without a dispose
                marks()
                kept = inner.keep(c * 3)
            marks()
            alias = a.clone()  # one buffer, two Tensors: counted once
            twin = a.to(jax.devices()[0])  # another array object over the same buffer
            marks()
        marks()
        del before
        gc.collect()
        marks()
        shared_before.dispose()
        marks()
        w = tj.Variable(a, name="w")
        marks()
        w.assign(a + 1)
        marks()
        g = tj.keep(a * 5)
        marks()
        step = tj.jit(lambda x: x * 2, donate_argnums=0)
        x = tj.tensor(np.ones(64, np.float32))
        marks()
        y = step(x)
        assert x.is_disposed
        marks()
        tj.dispose([a, w, g, y, kept, alias, twin])
        marks()
    marks.check(tl)
    assert sum(r.bytes for r in tl.live_at(time.perf_counter())) == 0


def test_replay_holds_under_threads():
    n_threads, rounds = 4, 6
    barrier = threading.Barrier(n_threads + 1)
    marks = Marks()
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            kept = []
            for r in range(rounds):
                with tidy(f"worker{i}"):
                    x = tj.tensor(np.full(10 + i, r, np.float32))
                    for _ in range(3):
                        x = x + 1  # each previous x collected without a dispose
                    with tidy("inner") as inner:
                        kept.append(inner.keep(x * 2))
                    kept.append(tj.keep(x.clone()))
                barrier.wait()  # every worker is quiet here: the main thread reads memory()
                barrier.wait()
            tj.dispose(kept)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)
            barrier.abort()

    with tj.timeline() as tl:
        threads = [threading.Thread(target=work, args=(i,)) for i in range(n_threads)]
        for t in threads:
            t.start()
        for _ in range(rounds):
            barrier.wait()
            marks()
            barrier.wait()
        for t in threads:
            t.join()
        marks()
    assert not errors, errors
    marks.check(tl)
    bands = {e.scope for e in tl.events if e.kind == "scope_enter"}
    assert bands == {f"worker{i}" for i in range(n_threads)} | {
        f"worker{i}/inner" for i in range(n_threads)
    }
    assert [e.time for e in tl.events] == sorted(e.time for e in tl.events)


def test_a_buffer_with_two_array_objects_is_freed_when_the_last_one_goes():
    marks = Marks()
    old = tj.tensor(np.ones(16, np.float32))
    old_twin = old.to(jax.devices()[0])  # aliased before the recording
    with tj.timeline() as tl:
        a = tj.tensor(np.ones(32, np.float32))
        twin = a.to(jax.devices()[0])  # a new array object over the same buffer
        marks()
        del a  # the first object goes; the buffer lives on in the twin
        gc.collect()
        marks()
        del twin
        gc.collect()
        marks()
        del old
        gc.collect()
        marks()
        del old_twin
        gc.collect()
        marks()
    marks.check(tl)
    assert [(e.kind, e.bytes) for e in tl.events] == [
        ("alloc", 64),
        ("alloc", 128),
        ("free", 128),
        ("free", 64),
    ]


def test_an_alias_of_a_buffer_still_being_computed_is_no_allocation_of_its_own():
    """``t.to(sharding)`` to the device ``t``'s buffer is on, while that buffer is still being
    computed: the new object's addresses are unknown until it is ready. The timeline waits for
    them, as the registry does, so the alias is one more record over the buffer: before, it was
    told as a second allocation, never undone (the replay above ``memory()`` from then on)."""
    one = NamedSharding(Mesh(np.array(jax.devices()[:1]), ("x",)), P())
    x = tj.tensor(np.ones((2000, 2000), np.float32))
    tj.dispose(x @ x)  # compiled
    with tj.timeline(sample=None) as tl:
        y = x @ x
        alias = y.to(one)
        computing = not alias.array.is_ready()
        tl.mark()  # settles the alias now
        replay = sum(r.bytes for r in tl.live_at(time.perf_counter()))
        info = tj.memory(scan_untracked=False)
    assert computing  # the case this test is about
    assert (info.num_data_buffers, info.num_bytes) == (2, 2 * 16_000_000)
    assert replay == info.num_bytes and tl.peak_bytes == info.num_bytes
    assert [e.kind for e in tl.events] == ["alloc", "alloc"]  # x (alive before), y
    tj.dispose([x, y, alias])


@pytest.mark.parametrize("look", ["mark", "scope exit, then mark", "stop"])
def test_a_raw_object_over_a_tensors_buffer_still_being_computed_is_a_view(look):
    """The same with a raw object (``jax.device_put`` of the Tensor's array to its device):
    ``mark()`` (any look but the sampler's) found its addresses unknown and recorded it as a
    plain allocation of its own, counted beside the Tensor's until the object died (the replay
    48 MB against ``memory()``'s 32 MB). A look (a mark, a scope event, the stop) waits for an
    array still being computed after letting the timeline's lock go, then finds it a view."""
    one = NamedSharding(Mesh(np.array(jax.devices()[:1]), ("x",)), P())
    x = tj.tensor(np.ones((2000, 2000), np.float32))
    tj.dispose(x @ x)  # compiled
    with tj.timeline(sample=None) as tl:
        y = x @ x
        view = jax.device_put(y.array, one)
        computing = not view.is_ready()
        if look == "scope exit, then mark":
            with tidy():
                pass
        if look != "stop":
            tl.mark()
    replay = tl.live_at(tl.stop_time)
    info = tj.memory(scan_untracked=False)
    del view
    assert computing  # the case this test is about
    assert [r.scope for r in replay if r.scope == tlm.UNTRACKED] == []
    assert sum(r.bytes for r in replay) == info.num_bytes == 2 * 16_000_000
    assert [e.kind for e in tl.events if e.kind in ("alloc", "free")] == ["alloc", "alloc"]
    tj.dispose([x, y])


@pytest.mark.parametrize("look", ["mark", "scope", "annotate"])
def test_a_look_waits_for_an_array_still_being_computed_outside_the_timelines_lock(
    monkeypatch, look
):
    """On GPU a host callback runs while the computation it is part of waits for it: one that
    calls ``tl.mark()`` needs the timeline's lock. A mark that waited for that computation's
    output while holding the lock would never end; it waits after letting the lock go, then
    looks again. Simulated: the array is ready only once another thread's mark returned."""
    target: list[Any] = [None]
    with tj.timeline(sample=None) as tl:
        arr = target[0] = (jnp.arange(16.0) + 1).block_until_ready()
        joined = computing_until_called_back(monkeypatch, lambda: target[0], tl.mark)
        if look == "mark":
            tl.mark()
        elif look == "scope":
            with tidy():
                pass
        else:
            tl.annotate("here")
        monkeypatch.undo()
        replay = [(r.scope, r.bytes) for r in tl.live_at(time.perf_counter())]
        del arr, target[0]
    assert joined == [True]
    assert replay == [(tlm.UNTRACKED, 64)]


def test_a_look_waits_for_a_suspect_still_being_computed_outside_the_timelines_lock(monkeypatch):
    """As above for a record just added that may be a new object over a recorded buffer (a
    suspect of the registry: ``tensors()`` of a raw view of a Tensor's buffer), whose address
    the look reads. It is waited for before the lock is taken; the callback's own look leaves
    it to the next instead of recording it as an allocation of its own."""
    with tj.timeline(sample=None) as tl:
        t = tj.tensor(np.ones(16, np.float32))
        raw = jax.device_put(t.array, jax.devices()[0]).block_until_ready()  # t's buffer
        joined = computing_until_called_back(monkeypatch, lambda: raw, tl.mark)
        s = tj.tensors([raw])[0]
        tl.mark()
        monkeypatch.undo()
        tl.mark()
        replay = [(r.scope, r.bytes) for r in tl.live_at(time.perf_counter())]
        tj.dispose([s, t])
    assert joined == [True]
    assert raw.is_deleted()  # a view of t's buffer: deleted with it
    assert replay == [("", 64)]  # one buffer (top level): the suspect is a second object over it


def test_a_callers_array_first_seen_after_its_tensor_went_is_a_view_of_its_aliases_buffer():
    """Cross-report seed 135 (``TIDYJAX_REPORT_SEEDS=128``): a caller's array wrapped by
    ``tensors()``, an alias Tensor made of that (``to`` its own device: the same buffer), the
    wrapper collected. A look that sees the array only now (the first since it was made: a
    sampler that lagged, or a mark) recorded it as a plain allocation: its record, let go, was
    skipped as a Tensor's before its buffer was looked up. It is a view of the alias's buffer."""
    one = NamedSharding(Mesh(np.array(jax.devices()[:1]), ("x",)), P())
    with tj.timeline(sample=None) as tl:
        raw = jax.device_put(np.full(256, 0.5, np.float32), one).block_until_ready()
        t = tj.tensors([raw])[0]
        alias = t.to(jax.devices()[0])
        del t
        gc.collect()
        tl.mark()  # the first look since ``raw`` was made
        replay = [(r.scope, r.bytes) for r in tl.live_at(time.perf_counter())]
        tj.dispose(alias)
    assert replay == [("", 1024)]
    assert not raw.is_deleted()  # the caller's


def test_recording_off_costs_nothing_and_nests():
    assert tlm.active() is None and not _registry.observers
    with tj.timeline() as outer:
        assert tlm.active() is outer
        a = tj.tensor([1.0])
        with tj.timeline() as inner:
            assert tlm.active() is inner and _registry.observers.count(inner) == 1
            b = a + 1
        assert tlm.active() is outer
        c = a + 2
    # closed: nothing observes the registry or the scopes any more
    assert tlm.active() is None and not _registry.observers
    with tidy("unseen"):
        d = a + 3
    assert [e.kind for e in inner.events] == ["alloc", "alloc"]  # a (alive at its start), b
    assert [e.kind for e in outer.events] == ["alloc", "alloc", "alloc"]
    assert all(e.scope != "unseen" for e in outer.events + inner.events)
    assert d.is_disposed
    tj.dispose([a, b, c])


def test_max_events_drops_the_oldest_and_the_replay_stays_exact():
    marks = Marks()
    x = tj.tensor(np.ones(10, np.float32))
    with tj.timeline(max_events=12) as tl:
        big = tj.tensor(np.ones(1000, np.float32))  # the peak, early
        marks()
        big.dispose()
        for _ in range(20):
            y = x * 2
            y.dispose()
        marks()
        z = x + 1
        marks()
    assert len(tl.events) == 12 and tl.dropped == 1 + 2 + 40 + 1 - 12
    assert tl.peak_bytes == 4040
    # the peak's moment was dropped, yet what was alive then is known
    assert sorted(r.bytes for r in tl.live_at(tl.peak_time)) == [40, 4000]
    with pytest.raises(tj.TidyjaxValueError, match="max_events"):
        tl.live_at(marks.marks[0][0])
    marks.marks = marks.marks[1:]
    marks.check(tl)
    tj.dispose([x, z])


def test_peak_live_at_and_top_sites():
    with tj.timeline() as tl:
        a = tj.tensor(np.ones(256, np.float32))  # 1 KiB
        bs = [a * i for i in range(3)]  # site: three
        tj.dispose(bs)
        c = a + 1
    assert tl.peak_bytes == 4 * 1024
    at_peak = tl.live_at(tl.peak_time)
    assert [r.bytes for r in at_peak] == [1024] * 4 and at_peak[0].id == a.id
    top = tl.top_sites()
    assert f"test_timeline.py:{line_of('# site: three')} in " in str(top[0].site)
    assert (top[0].count, top[0].bytes) == (3, 3072)
    assert [s.bytes for s in tl.top_sites(at=time.perf_counter())] == [1024, 1024]
    assert len(tl.top_sites(n=1)) == 1
    assert repr(tl).startswith("<tidyjax.Timeline 8 events (0 dropped), peak 4.0 KiB at +")
    tj.dispose([a, c])


def test_dump_and_load_round_trip(tmp_path):
    marks = Marks()
    with tj.timeline(max_events=6) as tl:
        a = tj.tensor(np.ones((4, 4), np.float32))
        with tidy("s"):
            for _ in range(4):
                b = a @ a
        marks()
        v = tj.Variable(a, name="v")
        marks()
    path = tmp_path / "t.json"
    tl.dump(path)
    data = json.loads(path.read_text())
    assert (data["format"], data["version"]) == ("tidyjax.timeline", 2)
    back = tj.Timeline.load(path)
    assert back.events == tl.events
    assert (back.dropped, back.peak_bytes, back.peak_time) == (tl.dropped, tl.peak_bytes,
                                                               tl.peak_time)  # fmt: skip
    assert back.max_events == 6 and "loaded" in repr(back)
    marks.check(back)
    assert back.live_at(back.peak_time) == tl.live_at(tl.peak_time)
    with pytest.raises(tj.TidyjaxTypeError, match="cannot record"), back:
        pass
    tj.dispose([a, v])
    assert b.is_disposed


def test_annotate_marks_a_moment_that_round_trips_and_the_page_shows(tmp_path):
    with tj.timeline() as tl:
        a = tj.tensor(np.ones((8, 8), np.float32))  # 256 B, alive at the mark
        with tidy("step"):
            b = tj.tensor(np.ones((16, 16), np.float32))  # 1 KiB, alive at the mark
            mark = tl.annotate("step started", bytes=1024)
            c = tj.tensor(np.ones((32, 32), np.float32))  # 4 KiB, made after it
            plain = jnp.ones((4,), jnp.float32)  # a plain array: seen when the next mark is made
            after = tl.annotate("done")
    assert tl.annotations == [mark, after] and after.time >= mark.time
    assert (mark.label, mark.bytes, after.bytes) == ("step started", 1024, None)
    assert sorted(r.bytes for r in tl.live_at(mark.time)) == [256, 1024]
    (seen,) = [e for e in tl.events if e.kind == "alloc" and e.scope == tlm.UNTRACKED]
    assert seen.bytes == 16 and mark.time < seen.time <= after.time
    path = tmp_path / "marked.json"
    tl.dump(path)
    data = json.loads(path.read_text())
    assert data["marks"] == [[mark.time, "step started", 1024], [after.time, "done", None]]
    back = tj.Timeline.load(path)
    assert back.annotations == tl.annotations
    page = back.to_html(at="step started")
    assert 'data-alive="1280"' in page and 'data-mark-bytes="1024"' in page
    assert "Alive at \u201cstep started (1.0 KiB)\u201d (+" in page
    assert "Alive at the peak" in back.to_html()  # without at: the peak, as before
    del data["marks"]  # an older file: no marks
    assert tj.Timeline.from_json(data).annotations == []
    with pytest.raises(tj.TidyjaxTypeError, match="not recording"):
        tl.annotate("late")
    with tj.timeline() as other, pytest.raises(tj.TidyjaxTypeError, match="str label"):
        other.annotate(3)  # type: ignore[arg-type]
    with other, pytest.raises(tj.TidyjaxTypeError, match="an int or None"):
        other.annotate("x", bytes=1.5)  # type: ignore[arg-type]
    assert other.annotations == []
    del plain
    tj.dispose(a)
    assert b.is_disposed and c.is_disposed


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("not json", "is not a JSON file"),
        ('{"format": "tidyjax.snapshot", "version": 1}', "is not a tidyjax timeline"),
        ('{"format": "tidyjax.timeline", "version": 99}', "version 99; this tidyjax reads"),
        ('{"format": "tidyjax.timeline", "version": 1}', "without 'strings'"),
    ],
)
def test_load_rejects_what_is_not_a_timeline(tmp_path, text, message):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(tj.TidyjaxValueError, match=re.escape(message)) as err:
        tj.Timeline.load(path)
    assert str(path) in str(err.value)


def test_decorator_forms_and_async():
    @tj.timeline
    def make():
        return tj.tensor([1.0, 2.0])

    tl = tj.timeline(max_events=100)

    @tl
    def double(x):
        return x * 2

    @tl
    async def triple(x):
        return x * 3

    a = make()
    b = double(a)
    c = asyncio.run(triple(a))
    assert isinstance(make.timeline, tj.Timeline) and double.timeline is tl
    assert [e.kind for e in make.timeline.events] == ["alloc"]
    assert make.timeline.events[0].tensors == (a.id,)
    # tl recorded both calls: resumed the second time, a was alive at both starts
    allocs = [e.tensors for e in tl.events if e.kind == "alloc"]
    assert allocs == [(a.id,), (b.id,), (c.id,)]
    with pytest.raises(tj.TidyjaxTypeError, match="decorates a plain or async function"):
        tl(5)
    with pytest.raises(tj.TidyjaxTypeError, match="max_events must be an int"):
        tj.timeline(max_events="many")
    with pytest.raises(tj.TidyjaxValueError, match="at least 1"):
        tj.timeline(max_events=0)
    with pytest.raises(tj.TidyjaxTypeError, match="not recording"):
        tl.__exit__(None, None, None)
    tj.dispose([a, b, c])


def test_resuming_reconciles_what_changed_in_between():
    marks = Marks()
    tl = tj.timeline()
    with tl:
        a = tj.tensor(np.ones(8, np.float32))
        b = tj.tensor(np.ones(16, np.float32))
        marks()
    b.dispose()  # unrecorded
    c = tj.tensor(np.ones(32, np.float32))  # unrecorded
    with tl.section("In[2]"):
        marks()
        d = a + 1
        marks()
    kinds = [(e.kind, e.bytes or e.name) for e in tl.events]
    assert kinds == [
        ("alloc", 32),
        ("alloc", 64),
        ("free", 64),  # found gone on resuming
        ("alloc", 128),  # found alive on resuming
        ("scope_enter", "In[2]"),
        ("alloc", 32),
        ("scope_exit", "In[2]"),
    ]
    marks.check(tl)
    tj.dispose([a, c, d])


def test_recording_starts_with_the_open_scopes():
    with tidy("cell"):
        x = tj.tensor([1.0])
        with tj.timeline() as tl:
            y = x + 1
    assert [(e.kind, e.scope) for e in tl.events] == [
        ("scope_enter", "cell"),  # open before the recording: drawn from its start
        ("alloc", "cell"),
        ("alloc", "cell"),
        ("scope_exit", "cell"),  # still open after it: drawn to its end
    ]
    assert x.is_disposed and y.is_disposed


def test_from_snapshot_draws_one_moment():
    a = tj.tensor(np.ones(4, np.float32))
    b = a.clone()
    c = a * 2
    tl = tj.Timeline.from_snapshot(tj.snapshot())
    assert [(e.kind, e.bytes) for e in tl.events] == [("alloc", 16), ("alloc", 16)]
    assert tl.events[0].tensors == (a.id, b.id) and tl.peak_bytes == 32
    assert "<svg" in _charts(tl.to_html())
    with pytest.raises(tj.TidyjaxTypeError, match="takes a tidyjax\\.Snapshot"):
        tj.Timeline.from_snapshot([])
    tj.dispose([a, b, c])


# -- the page, without a browser (tests/test_timeline_browser.py opens it in one) ---------------


def _charts(page: str) -> str:
    """``page`` followed by its charts' static SVG (each an ``<img>`` of a base64 data URI)."""
    found = re.findall(r'src="data:image/svg\+xml;base64,([^"]+)"', page)
    return page + "".join(base64.b64decode(b).decode("utf-8") for b in found)


def page_data(page: str) -> dict:
    """What the page's script draws from: its embedded, deflated JSON."""
    holder = re.search(r'<script type="application/json" class="tj-data">(.*?)</script>', page)
    packed = json.loads(holder.group(1))["deflated"]
    return json.loads(zlib.decompress(base64.b64decode(packed)))


def test_page_is_self_contained_with_areas_bands_peak_and_table(tmp_path):
    with tj.timeline() as tl:
        ts = tidy.run("load", tensors_at_sites, 12, "gen_sites.py")  # sites: twelve
        with tidy("release"):
            tj.dispose(ts[:6])
    page = _charts(tl.to_html(top=4))
    assert page.startswith("<!DOCTYPE html>") and "<svg" in page
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)  # nothing fetched
    assert "@import" not in page and "url(" not in page
    # the static image: one area, the peak (the chart the script draws: test_timeline_browser)
    assert page.count('<path class="tj-area"') == 1 and '<g class="tj-peak">' in page
    data = page_data(page)
    labels = [site["label"] for site in data["sites"]]
    assert len(labels) == 5 and labels[-1] == "other (8 sites)"
    # the 4 largest sites (stacked by how long they held bytes: test_timeline_explore.py),
    # each the chain of user frames from this test to the line, outer to inner
    here = f"test_timeline.py:{line_of('# sites: twelve')} in test_page_is_self_contained_"
    chains = [label.split(" → ") for label in labels[:-1]]
    assert all(len(c) == 3 and here in c[0] and "conftest.py:" in c[1] for c in chains), labels
    assert {c[2] for c in chains} == {f"gen_sites.py:{i} in <module>" for i in range(9, 13)}
    names = [data["strings"][i] for i in data["bands"][2::6]]
    assert names == ["load", "release"]
    table = re.search(r'<table class="tj-peak-table"[^>]*>.*?</table>', page, re.S).group(0)
    first = re.search(r"<tbody><tr>(.*?)</tr>", table).group(1)
    assert "12.0 KiB" in first and "gen_sites.py:12" in first and "float32[3072]" in first
    assert "peak 78.0 KiB" in page
    fragment = tl._repr_html_()
    assert fragment.startswith('<div class="tjtl"') and "<!DOCTYPE" not in fragment
    assert "--jp-layout-color0" in fragment and "prefers-color-scheme:dark" in fragment
    tl.save_html(tmp_path / "t.html")
    assert (tmp_path / "t.html").read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    tj.dispose(ts)


def test_page_of_nothing_and_display_never_raises(monkeypatch):
    with tj.timeline() as tl:
        pass
    assert "No tidyjax memory events were recorded" in tl.to_html()

    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(tlm._timeline_html, "fragment", broken)
    assert tl._repr_html_().startswith("<pre>&lt;tidyjax.Timeline")


def test_many_scopes_keep_the_page_small():
    tl = tlm.Timeline()
    tl._loaded = True  # made of TimelineEvents, as a loaded one
    t = 0.0
    for i in range(20_000):
        t += 1e-6
        kind = "scope_enter" if i % 2 == 0 else "scope_exit"
        tl._append(
            tlm.TimelineEvent(kind, t, 0, "", None, "step", (), "", (), i // 2, "step"),
            0,
        )
    ev = tlm.TimelineEvent("alloc", t, 4, "cpu:0", None, "", (1,), "float32", (), 10**6, "",
                           (("cpu:0", 4),))  # fmt: skip
    tl._append(ev, 4)
    page = tl.to_html()
    data = page_data(page)  # the script draws few bands of them: test_timeline_browser.py
    assert len(data["bands"]) // 6 <= 10_000 and len(page) < 200_000


# -- python -m tidyjax view ---------------------------------------------------------------------


def test_view_writes_the_page_of_a_timeline_or_a_snapshot(tmp_path, capsys):
    with tj.timeline() as tl:
        a = tj.tensor(np.ones(4, np.float32))
    tl.dump(tmp_path / "t.json")
    assert cli(["view", str(tmp_path / "t.json")]) == 0
    assert (tmp_path / "t.html").read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    assert f"wrote {tmp_path / 't.html'}" in capsys.readouterr().out
    tj.snapshot().dump(tmp_path / "s.json")
    assert cli(["view", str(tmp_path / "s.json"), "-o", str(tmp_path / "page.html")]) == 0
    assert "tj-area" in (tmp_path / "page.html").read_text(encoding="utf-8")
    a.dispose()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (None, "cannot read it"),
        ("{not json", "not a JSON file"),
        ('{"format": "something"}', "not a tidyjax timeline or snapshot"),
        ('{"format": "tidyjax.timeline", "version": 3}', "format version 3"),
        ('{"format": "tidyjax.snapshot", "version": 1}', "malformed tidyjax snapshot"),
    ],
)
def test_view_exits_2_naming_the_file_and_the_problem(tmp_path, capsys, text, message):
    path = tmp_path / "in.json"
    if text is not None:
        path.write_text(text)
    assert cli(["view", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"tidyjax view: {path}") and message in err
    assert not (tmp_path / "in.html").exists()


def test_python_dash_m_tidyjax_runs(tmp_path):
    (tmp_path / "bad.json").write_text("[]")
    proc = subprocess.run(
        [sys.executable, "-m", "tidyjax", "view", str(tmp_path / "bad.json")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "not a tidyjax timeline or snapshot" in proc.stderr


def test_variables_are_looked_up_only_at_scope_exits_after_they_changed(monkeypatch):
    calls = []
    real = tlm.Timeline._name_variables
    monkeypatch.setattr(
        tlm.Timeline, "_name_variables", lambda self: (calls.append(1), real(self))[1]
    )
    w = tj.Variable(np.zeros(4, np.float32), name="w")
    others = [tj.Variable(np.zeros(2, np.float32)) for _ in range(50)]  # unnamed
    with tj.timeline() as tl:
        at_start = len(calls)
        for _ in range(3):
            with tidy("step"):
                with tidy("forward"):  # no Variable changes here: no lookup at its exit
                    (w * 2.0).dispose()
                w.assign(w + 1.0)  # a value of this scope; the old one is freed
            calls.append("step")
        with tidy("idle"):
            pass
        calls.append("idle")
        held = tj.tensor(np.full(4, 7.0, np.float32))  # made before a lookup...
        with tidy("between"):
            w.assign(w + 1.0)  # looked up at this exit, after `held` was made
        calls.append("between")
        v = tj.Variable(held, name="v")  # ...a new Variable on it: looked up at the next exit
        with tidy("after"):
            pass
        calls.append("after")
    marks = calls[at_start:]
    # one lookup per step (at its exit, none at forward's), none at idle, one after v
    assert marks == [1, "step", 1, "step", 1, "step", "idle", 1, "between", 1, "after", 1]
    named = {ev.buffer for ev in tl.events if ev.kind == "alloc" and ev.shape == (4,)}
    names = {b: n for b, n in tl._names.items() if b in named}
    assert sorted(names.values()) == ["v"] + ["w"] * 5  # w's value at the start, then 4 assigned
    tj.dispose([held, v, w, *others])


def test_a_value_assigned_outside_scopes_is_named_at_the_next_scope_exit():
    w = tj.Variable(np.zeros(4, np.float32), name="w")
    with tj.timeline() as tl:
        for _ in range(4):
            with tidy("step"):  # looked up at its exit: the last assign freed w's old value
                new = tj.keep(w + 1.0)
            with tidy("log"):
                pass
            w.assign(new)  # a buffer made before the last lookup
            new.dispose()
    values = [ev.buffer for ev in tl.events if ev.kind == "alloc" and ev.shape == (4,)]
    assert len(values) == 5 and all(tl._names.get(b) == "w" for b in values)
    tj.dispose(w)


def test_jnp_zeros_via_lifted_namespace_are_recorded():
    import tidyjax.numpy as tnp

    with tj.timeline() as tl:
        z = tnp.zeros((3, 5), dtype=jnp.int32)
    assert [(e.kind, e.shape, e.dtype, e.bytes) for e in tl.events] == [
        ("alloc", (3, 5), "int32", 60)
    ]
    z.dispose()


def test_a_start_that_fails_midway_leaves_nothing_recording(monkeypatch):
    # The look at what is alive comes after the timeline joined the observers: an interrupt
    # there must not leave it recording (every later op would report to it).
    def interrupted(self):
        raise KeyboardInterrupt

    tl = tj.timeline()
    monkeypatch.setattr(tlm.Timeline, "_alive", interrupted)
    with pytest.raises(KeyboardInterrupt):
        tl.__enter__()
    assert not tl.recording and tl not in _registry.observers
    assert tlm.active() is None
    monkeypatch.undo()
    with tl:  # it can record afterwards
        t = tj.tensor([1.0, 2.0])
    t.dispose()
    assert tl.events


def _tracked_after_ops(n: int) -> tuple[int, list[tlm.TimelineEvent]]:
    """The objects the cyclic collector tracks after ``n`` ops recorded (a full collection
    first), less those before, and the events."""
    a = tj.tensor(jnp.ones(8))
    for _ in range(100):
        a + 1.0  # compiled, the caches filled
    with tj.timeline() as tl:
        a + 1.0
        gc.collect()
        before = len(gc.get_objects())
        for _ in range(n):
            a + 1.0  # each an alloc and a free
        gc.collect()
        grown = len(gc.get_objects()) - before
    a.dispose()
    return grown, tl.events


def test_a_long_recording_leaves_the_collector_nothing_per_event():
    # The events are plain tuples of numbers and strings: the collector stops tracking them, so
    # a recording does not make every full collection of the program longer (a TimelineEvent
    # per event stayed tracked: +2 objects per op).
    grown, events = _tracked_after_ops(5_000)
    assert len([e for e in events if e.kind == "alloc"]) >= 5_000
    assert grown < 200, grown
    ev = events[-1]  # read back as TimelineEvents, every field as recorded
    assert type(ev) is tlm.TimelineEvent and ev.kind == "free" and ev.tensors
    assert ev.per_device == ((ev.device, ev.bytes),) and ev.site.file == __file__


@pytest.mark.skipif(sys.version_info >= (3, 14), reason="CPython 3.14's collector has no gen 2")
def test_events_reach_the_oldest_generation_untracked():
    # A tuple is untracked when a collection finds its items untracked; one holding a tuple made
    # with it can be found first and promoted tracked. Events hold no such tuple: none reaches
    # the oldest generation, whose growth is what starts a full collection.
    a = tj.tensor(jnp.ones(8))
    threshold = gc.get_threshold()
    try:
        with tj.timeline() as tl:
            a + 1.0
            gc.collect()
            gc.set_threshold(threshold[0], threshold[1], 10**9)  # no full collection meanwhile
            old = {id(o) for o in gc.get_objects(generation=2)}
            for _ in range(20_000):
                a + 1.0
            new = [o for o in gc.get_objects(generation=2) if id(o) not in old]
    finally:
        gc.set_threshold(*threshold)
    a.dispose()
    assert len(tl._events) > 40_000
    assert len(new) < 200, collections.Counter(type(o).__name__ for o in new).most_common(3)


@pytest.mark.parametrize("stopped", [True, False])
def test_a_script_ending_with_a_plain_array_a_timeline_recorded_exits_quietly(stopped):
    """A plain array a timeline recorded, alive when the script ends (the recording stopped, or
    still on): its weak reference's callback ran as Python tore the module down and printed
    "Exception ignored ... 'NoneType' object is not callable" on every such exit. The callback
    does nothing now while stopped (its next start looks at the arrays again) or exiting."""
    script = (
        "import jax.numpy as jnp, tidyjax as tj\n"
        "tl = tj.timeline(sample=None).__enter__()\n"
        "a = jnp.ones(1024)\n"
        "tl.mark()\n"
        + ("tl.__exit__(None, None, None)\n" if stopped else "")
        + "assert [e.kind for e in tl.events] == ['alloc']\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert "Exception ignored" not in proc.stderr, proc.stderr
