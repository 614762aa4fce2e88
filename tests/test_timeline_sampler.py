"""timeline()'s sampler: plain jax.Arrays seen without mark(), on a thread that stops with it."""

from __future__ import annotations

import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import tidyjax as tj
import tidyjax.random as tjr
from tidyjax import _registry, tidy
from tidyjax import _timeline as tlm

INTERVAL = 0.005  # the default
STEP = 20 * INTERVAL  # each step keeps its arrays alive for 20 sampling intervals
MB4 = (1024, 1024)  # float32: 4 MiB


@pytest.fixture(autouse=True)
def _no_timeline_left_open():
    yield
    assert tlm.active() is None
    assert not _registry.observers, "a test left an observer registered"
    assert not _samplers(), "a sampler thread outlived its timeline"


def _samplers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("tidyjax timeline sampler")]


@jax.jit
def _step(x):
    return jnp.tanh(x) * 2.0, x + 1.0


def _live_bytes(before: set[int]) -> int:
    """The bytes of the live jax.Arrays made since ``before`` (ids), each buffer once."""
    seen: dict[int, int] = {}
    for a in jax.live_arrays():
        if id(a) not in before and not a.is_deleted():
            seen[a.unsafe_buffer_pointer()] = a.nbytes
    return sum(seen.values())


def _plain_loop(steps: int = 3, before: set[int] | None = None) -> int:
    """Raw JAX steps, each making three 4 MiB arrays that die at the step's end; the true peak
    (live bytes at each step's peak, measured here)."""
    true = 0
    for i in range(steps):
        x = jnp.full(MB4, float(i), jnp.float32)
        y, z = _step(x)
        jax.block_until_ready((y, z))
        if before is not None:
            true = max(true, _live_bytes(before))
        time.sleep(STEP)  # alive for 20 intervals: the sampler sees them
        del x, y, z
    return true


def test_a_plain_loop_without_mark_shows_its_peak():
    _step(jnp.full(MB4, 0.5, jnp.float32))  # compiled before (its operands live meanwhile)
    before = {id(a) for a in jax.live_arrays()}
    with tj.timeline() as tl:
        true = _plain_loop(3, before)
    assert true >= 3 * 4 * 2**20
    assert tl.peak_bytes >= 0.9 * true, (tl.peak_bytes, true)
    assert tl.peak_bytes <= true  # each buffer once
    assert tl.unseen is None and "not sampled" not in repr(tl)
    assert tl.sample == INTERVAL
    plain = [e for e in tl.events if e.kind == "alloc" and e.shape == MB4]
    assert len(plain) == 3 * 3  # x, y, z of each step, each once
    assert all(e.scope == "<untracked>" for e in plain)
    assert all(e.site is not None and e.site.file == __file__ for e in plain)
    # every array died before the stop: all freed, through the weak references
    assert sum(r.bytes for r in tl.live_at(tl.stop_time)) == 0
    assert tl.live_at(tl.peak_time) and all(
        r.scope == "<untracked>" for r in tl.live_at(tl.peak_time)
    )


def test_the_decorator_form_around_main_reports_the_peak():
    @tj.timeline
    def main():
        _plain_loop(2)

    main()
    assert main.timeline.peak_bytes >= 3 * 4 * 2**20
    assert not _samplers()
    main()  # a second call resumes it, with a new sampler
    assert main.timeline.peak_bytes >= 3 * 4 * 2**20
    assert not _samplers()


def test_the_sampler_runs_only_while_recording_and_stops_on_an_exception():
    tl = tj.timeline()
    with tl:
        (thread,) = _samplers()
        assert thread.daemon
        with tl:  # nested: still one thread
            assert _samplers() == [thread]
    assert not thread.is_alive()
    with pytest.raises(KeyError), tl:
        assert len(_samplers()) == 1
        _plain_loop(1)
        raise KeyError("inside")
    assert not _samplers() and not tl.recording
    assert tl.peak_bytes >= 3 * 4 * 2**20
    with tl.section("In[1]"):  # a notebook cell: resumed, then stopped
        assert len(_samplers()) == 1
    assert not _samplers()


def test_no_sampling_says_so_in_the_repr_the_page_and_the_file(tmp_path):
    with tj.timeline(sample=None) as tl:
        assert not _samplers()
        _plain_loop(1)
    assert tl.peak_bytes == 0  # what today's timeline reports for the same loop
    note = "plain arrays not sampled: sample=None and no tl.mark()"
    assert tl.unseen == note
    assert f"peak 0 B ({note})" in repr(tl)
    assert note in tl.to_html()
    tl.dump(tmp_path / "t.json")
    back = tj.Timeline.load(tmp_path / "t.json")
    assert back.unseen == note and note in repr(back)
    with tj.timeline(sample=0) as off:
        off.mark()  # a mark: the user looks, no note
    assert off.sample is None and off.unseen is None
    with tj.timeline(arrays=False) as none:
        pass
    assert none.unseen == "plain arrays not recorded: arrays=False"
    assert "(plain arrays not recorded: arrays=False)" in repr(none)


@pytest.mark.parametrize(
    ("sample", "error", "match"),
    [
        ("5ms", tj.TidyjaxTypeError, "sample must be a number of seconds, or None"),
        (True, tj.TidyjaxTypeError, "sample must be a number of seconds"),
        (-0.01, tj.TidyjaxValueError, "sample must be an interval from 0.0001 to 60 seconds"),
        (float("nan"), tj.TidyjaxValueError, "got nan"),
        (float("inf"), tj.TidyjaxValueError, "got inf"),
        (1e-6, tj.TidyjaxValueError, "or 0 or None"),
    ],
)
def test_a_bad_sample_is_refused(sample, error, match):
    with pytest.raises(error, match=match):
        tj.timeline(sample=sample)
    with pytest.raises(error, match=match):
        tj.Timeline(sample=sample)


def test_tensors_replay_as_before_with_the_sampler_running():
    with tj.timeline() as tl:
        a = tj.tensor(np.ones((2, 3), np.float32))  # no plain array: NumPy's
        with tidy("outer"), tidy("inner"):
            b = a * 2
            time.sleep(4 * INTERVAL)  # the sampler looks meanwhile
            c = b.clone()
            time.sleep(4 * INTERVAL)
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
    assert tl.peak_bytes == 2 * 24
    assert set(tl.events[4].tensors) == {b.id, c.id}
    a.dispose()


def test_an_array_made_before_each_look_is_recorded_once():
    x = None
    with tj.timeline() as tl:
        x = jnp.ones(1000, jnp.float32)
        time.sleep(6 * INTERVAL)  # sampled a few times
        tl.mark()  # and marked
        time.sleep(6 * INTERVAL)
    allocs = [e for e in tl.events if e.kind == "alloc" and e.shape == (1000,)]
    assert [(e.bytes, e.scope) for e in allocs] == [(4000, "<untracked>")]
    assert 4000 <= tl.peak_bytes <= 4000 + 64  # (and a scalar jnp.ones may leave alive)
    del x


def test_an_array_sampled_before_watch_named_it_is_recorded_watched():
    with tj.timeline() as tl:
        params = {"w": jnp.ones((16, 16), jnp.float32)}
        time.sleep(6 * INTERVAL)  # sampled: untracked so far
        assert [e.scope for e in tl.events if e.kind == "alloc"] == ["<untracked>"]
        tj.watch(params, "model")
        tl.mark()  # the next look finds it watched: from its allocation on
        peak = tl.top_sites()
    assert [e.scope for e in tl.events if e.shape == (16, 16)] == ["<watched>"]
    assert [(s.kind, s.bytes) for s in peak] == [("watched", 1024)]
    tj.unwatch(params)
    del params


# -- the sampler and tidyjax over one array: the same record whichever comes first -------------


@pytest.fixture
def by_hand(monkeypatch):
    """The sampler's thread does nothing: the test runs its looks (`_Sampler._look`) itself, at
    the moments it chooses."""
    monkeypatch.setattr(tlm._Sampler, "_run", lambda self: None)


def _sampler_first(monkeypatch, tl: tj.Timeline) -> None:
    """Every array tidyjax records from now on was first seen by two looks of ``tl``'s sampler
    (listed, then recorded as a plain array): what a loaded machine does when the thread of an
    op stalls between JAX making the array and tidyjax recording it."""
    real = _registry.new

    def new(arr, *args, **kwargs):
        arr.block_until_ready()  # a look records only ready arrays
        tl._sampler._look()
        tl._sampler._look()
        return real(arr, *args, **kwargs)

    monkeypatch.setattr(_registry, "new", new)


def _tensors_only() -> tj.Tensor:
    """A program of Tensors only: conversions from NumPy (the second committed to its device:
    settled at the next event), a typed key (JAX lists its words, not the key), ops in a
    scope, a result kept."""
    a = tj.tensor(np.ones((32, 32), np.float32))
    with tidy("step"):
        b = a * 2.0
        c = tj.tensor(np.ones(32, np.float32), device=jax.devices()[0])
        key = tjr.key(0)
        kept = tj.keep(b + c)
        key.dispose()
    a.dispose()
    return kept


def _story(tl: tj.Timeline) -> list[tuple[object, ...]]:
    """The events as a run tells them: what, where (the line that made the array: the runs
    compared call it from different lines of a test, so their chains differ), how many bytes,
    how many Tensors."""
    return [(e.kind, e.scope, e.site and e.site.frames[-1], e.shape, e.bytes, len(e.tensors))
            for e in tl.events]  # fmt: skip


def test_an_array_sampled_before_tidyjax_records_it_is_tidyjax_from_its_allocation(
    monkeypatch, by_hand
):
    with tj.timeline(sample=None) as alone:
        kept = _tensors_only()
    kept.dispose()
    with tj.timeline() as tl:
        _sampler_first(monkeypatch, tl)
        kept = _tensors_only()
        monkeypatch.undo()
        assert tl.live_at(time.perf_counter())  # read while recording: settled
        at_stop = tj.memory(scan_untracked=False).num_bytes
    kept.dispose()
    # the sampler's plain record became tidyjax's: no "<untracked>" site, no free and new alloc
    assert _story(tl) == _story(alone)
    assert [e.kind for e in tl.events].count("alloc") == 5
    assert tl.peak_bytes == alone.peak_bytes == 3 * 4096 + 128 + 8
    assert [(s.site and s.site.frames[-1], s.kind, s.bytes) for s in tl.top_sites()] == [
        (s.site and s.site.frames[-1], s.kind, s.bytes) for s in alone.top_sites()
    ]
    assert sum(r.bytes for r in tl.live_at(tl.stop_time)) == at_stop == 4096


def test_an_array_sampled_after_tidyjax_recorded_it_is_not_recorded_again(by_hand):
    with tj.timeline(sample=None) as alone:
        kept = _tensors_only()
    kept.dispose()
    with tj.timeline() as tl:
        kept = _tensors_only()
        tl._sampler._look()  # lists the Tensors' arrays (alive: the kept one)
        tl._sampler._look()  # and finds the registry's: nothing recorded
    kept.dispose()
    assert _story(tl) == _story(alone)
    assert tl.peak_bytes == alone.peak_bytes


@pytest.mark.parametrize("marked", [False, True], ids=["unseen", "marked"])
def test_a_sampled_array_taken_on_later_is_recorded_as_without_the_sampler(by_hand, marked):
    stories = []
    for sample in (None, INTERVAL):
        with tj.timeline(sample=sample) as tl:
            x = jnp.ones((16, 16), jnp.float32)
            x.block_until_ready()
            if sample is not None:
                tl._sampler._look()
                tl._sampler._look()  # recorded: a plain array, for now
                assert [(e.kind, e.scope) for e in tl.events] == [("alloc", "<untracked>")]
            if marked:
                tl.mark()  # the program looked: a plain array until adopt(), either way
            t = tj.adopt(x)
            t.dispose()
        stories.append(_story(tl))
    plain = [("alloc", "<untracked>"), ("free", "<untracked>")] if marked else []
    assert [e[:2] for e in stories[0]] == [*plain, ("alloc", ""), ("free", "")]
    assert stories[1] == stories[0]


def test_a_sampled_array_stays_plain_once_anything_else_is_recorded(by_hand):
    with tj.timeline() as tl:
        x = jnp.ones((16, 16), jnp.float32)
        x.block_until_ready()
        tl._sampler._look()
        tl._sampler._look()
        u = tj.tensor(np.ones(4, np.float32))  # recorded since: x was plain meanwhile
        t = tj.adopt(x)
        tj.dispose([t, u])
    assert [(e.kind, e.scope, e.shape) for e in tl.events][:4] == [
        ("alloc", "<untracked>", (16, 16)),
        ("alloc", "", (4,)),
        ("free", "<untracked>", (16, 16)),
        ("alloc", "", (16, 16)),
    ]


def test_an_array_made_before_the_timeline_is_not_counted_when_read_in_it(by_hand):
    before = jnp.ones((3, 4), jnp.float32)
    before.block_until_ready()
    with tj.timeline() as tl:
        repr(before)  # JAX caches a new object over its buffer on it (a shard view)
        tj.memory(scan_untracked=True)  # reads every buffer's address (on JAX 0.6: a view too)
        made = jnp.ones(5, jnp.float32)
        made.block_until_ready()
        tl._sampler._look()
        tl._sampler._look()  # the sampler's look, then a mark's: neither counts `before`
        tl.mark()
    assert [(e.kind, e.scope, e.shape) for e in tl.events] == [("alloc", "<untracked>", (5,))]
    assert tl.peak_bytes == 20
    del made, before


def test_a_look_between_publishing_a_record_and_suspecting_it_leaves_it_to_a_later_look(
    monkeypatch, by_hand
):
    """``t.to(sharding)`` to where ``t``'s buffer is makes a new object over it, which the
    registry publishes first and suspects next (a second object over a recorded buffer, grouped
    later). A look of the sampler in between settles only what its last look saw pending: the
    new record waits, and is then one more record over the buffer. Before, the look told it as
    an allocation of its own, never undone (the replay above ``memory()`` from then on)."""
    one = NamedSharding(Mesh(np.array(jax.devices()[:1]), ("x",)), P())
    real = _registry.suspect
    between: list[object] = []

    def suspect(rec, raw=None):
        tl._sampler._look()  # the sampler's thread looks right then
        between.append(rec)
        real(rec, raw)

    with tj.timeline() as tl:
        t = tj.tensor(np.ones(256, np.float32))
        t.array.block_until_ready()
        monkeypatch.setattr(_registry, "suspect", suspect)
        alias = t.to(one)
        monkeypatch.setattr(_registry, "suspect", real)
        tl._sampler._look()  # its next look: the record is a suspect now
        replay = sum(r.bytes for r in tl.live_at(time.perf_counter()))
        info = tj.memory(scan_untracked=False)
        tj.dispose([t, alias])
    assert len(between) == 1  # the look came between
    assert (info.num_data_buffers, info.num_bytes) == (1, 1024) and replay == 1024
    assert [(e.kind, e.bytes) for e in tl.events] == [("alloc", 1024), ("free", 1024)]


def test_a_new_view_of_a_buffer_whose_first_holder_just_went_is_no_plain_array(
    monkeypatch, by_hand
):
    """Found by the cross-report test on a loaded machine (JAX 0.6.2, seed 12): a Variable's
    buffer that an alias Tensor holds too (one entry, two records); the Variable is disposed
    (its buffer lives on) and, after the registry marked its record dead but before the
    timeline heard of it, the sampler recorded a new raw object over the buffer (JAX 0.6 makes
    one when an address is read; here a raw device_put): a view of the alias's buffer, no
    plain allocation."""
    real = _registry.notify

    def notify(kind, rec, tensor=0):
        if kind == "buffer_freed" and rec.dead is not None:
            tl._sampler._look()  # the sampler's thread looks first
        real(kind, rec, tensor)

    with tj.timeline() as tl:
        v = tj.Variable(tj.tensor(np.full(64, 0.5, np.float32)))
        alias = tidy.run(lambda: jax.device_put(v, v.array.sharding))  # one buffer, two holders
        tl.mark()
        view = jax.device_put(v.array, v.array.sharding)  # a new raw object over the buffer
        tl._sampler._look()  # lists it
        monkeypatch.setattr(_registry, "notify", notify)
        v.dispose()  # the buffer lives on in the alias
        monkeypatch.undo()
        tl.mark()
        replay = tl.live_at(time.perf_counter())
        assert [r.bytes for r in replay if r.scope == "<untracked>"] == []
        assert sum(r.bytes for r in replay) == tj.memory().num_bytes == 256
        assert not view.is_deleted() and not alias.is_disposed
        alias.dispose()
        del view
    assert tl.live_at(tl.stop_time) == []


def test_a_view_listed_before_its_records_event_is_handled_is_no_plain_array(monkeypatch, by_hand):
    """Found while tracing the cross-report test's failure (JAX 0.6.2, seed 7): an op's result
    committed to its device was published, its event waited (queued while the sampler's thread
    held the timeline), and meanwhile a new object over its buffer was made (JAX 0.6 makes one
    when the address is read). The sampler listed that object, heard of the record only then
    (pending: settled at a later look), and at its next look recorded the object as a plain
    allocation: the buffer counted twice from then on. The look now leaves such an object to
    a later look, when the record is settled and the object is one of its views."""
    one = NamedSharding(Mesh(np.array(jax.devices()[:1]), ("x",)), P())
    views: list[jax.Array] = []
    with tj.timeline() as tl:
        tl.mark()
        real = tl.event

        def event(kind, obj, tensor=0):
            if kind == "buffer_added" and not views:
                arr = obj()
                views.append(jax.device_put(arr, one))  # a new object over its buffer
                tl._sampler._look()  # lists the object before the record's event is handled
            real(kind, obj, tensor)

        monkeypatch.setattr(tl, "event", event)
        t = tj.tensor(np.ones(64, np.float32), device=jax.devices()[0])  # committed
        monkeypatch.undo()
        assert views and views[0] is not t.array and not views[0].is_deleted()
        tl._sampler._look()  # the object is ready; the record was heard of after the last look
        tl._sampler._look()
        replay = tl.live_at(time.perf_counter())
        assert [r.bytes for r in replay if r.scope == "<untracked>"] == []
        assert sum(r.bytes for r in replay) == tj.memory().num_bytes == 256
        t.dispose()
        views.clear()
    assert tl.live_at(tl.stop_time) == []
