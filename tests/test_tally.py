"""profile()'s count is an observer of the registry's events of its own (`_tally.Tally`), not a
Timeline: it hears "joined" when the registry groups records over one buffer and asks the
registry which records a suspect shares allocations with, and its total is ``memory()``'s at
every op. The multi-device cases run again under eight host devices (the last test)."""

from __future__ import annotations

import gc
from typing import Any

import jax
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import tidyjax as tj
from tidyjax import _registry, _tally, _tensor

from .conftest import UNDER_EIGHT, run_under_eight_devices

DEVS = jax.devices()
eight = pytest.mark.skipif(len(DEVS) < 8, reason="needs 8 devices (run under eight below)")


class _Heard:
    """An observer that writes down what it hears."""

    def __init__(self) -> None:
        self.heard: list[tuple[str, Any]] = []

    def event(self, kind: str, obj: Any, tensor: int = 0) -> None:
        self.heard.append((kind, obj))


def _empty() -> None:
    gc.collect()
    m = tj.memory(scan_untracked=False)
    assert (m.num_tensors, m.num_data_buffers) == (0, 0), m


def test_an_observer_hears_two_records_joined_over_one_buffer() -> None:
    t = tj.tensor(np.arange(100, dtype=np.float32))
    ear = _Heard()
    _registry.observers.append(ear)
    try:
        a = jax.device_put(t, DEVS[0])  # a second record over t's buffer (a suspect)
        assert not [k for k, _ in ear.heard if k == "joined"]  # not resolved yet
        tj.memory()  # resolves: one buffer, two records
    finally:
        _registry.observers.remove(ear)
    joined = [rec for k, rec in ear.heard if k == "joined"]
    assert len(joined) == 1
    group = _registry.grouped(joined[0])
    assert group is not None
    assert {id(r) for r in group} == {id(_tensor.record(t)), id(_tensor.record(a))}
    tj.dispose([t, a])
    _empty()


def test_the_profile_count_is_no_timeline() -> None:
    with tj.profile():
        count = tj._profile._recorder
        assert isinstance(count, _tally.Tally)
        assert not isinstance(count, tj.Timeline)
        assert count in _registry.observers
    assert tj._profile._recorder is None and count not in _registry.observers


def test_every_op_of_a_profile_counts_an_alias_once_as_memory_does() -> None:
    t = tj.tensor(np.arange(100, dtype=np.float32))  # 400 bytes before
    with tj.profile() as p:
        a = jax.device_put(t, DEVS[0])  # an alias: no new bytes
        b = a + 1  # the op reads the count with the alias unresolved
        (k,) = p.kernels
        assert (k.bytes_added, k.total_bytes_snapshot) == (400, 800)
        assert tj.memory().num_bytes == 800
        c = tj.tensors(jax.device_put(b.array, DEVS[0]))  # a raw view of b, wrapped
        d = c * 2
        assert p.kernels[-1].total_bytes_snapshot == tj.memory().num_bytes == 1200
        tj.dispose([t, b])  # their buffers live on in a and c
        e = d - 1
        assert p.kernels[-1].total_bytes_snapshot == tj.memory().num_bytes == 1600
    assert (p.bytes_before, p.peak_bytes, p.new_bytes) == (400, 1600, 1200)
    tj.dispose([a, c, d, e])
    _empty()


def test_a_collection_heard_while_an_event_is_handled_waits_for_it() -> None:
    # A record whose array is collected while the count handles another event (a collection
    # run by an allocation inside it) is counted off after that event, not in its middle.
    tally = _tally.Tally()
    tally.start()
    try:
        before = tally.total
        x = tj.tensor(np.ones(10, np.float32))
        rec = _tensor.record(x)
        tally._busy = True  # as if inside an event
        tally.event("buffer_collected", rec)
        assert tally.total == before + 40  # waits in the queue
        tally._busy = False
        tally.event("scope_enter", None)
        assert tally.total == before  # then handled
    finally:
        tally.stop()
    tj.dispose(x)
    _empty()


@eight
def test_a_replicated_copy_sharing_a_shard_counts_as_memory_does() -> None:
    rep = NamedSharding(Mesh(np.array(DEVS), ("x",)), P())
    with tj.profile() as p:
        x = tj.tensor(np.arange(256, dtype=np.float32)).to(DEVS[0])
        r = x.to(rep)  # shares x's shard on device 0, seven shards of its own
        y = r + 1
        assert p.kernels[-1].total_bytes_snapshot == tj.memory().num_bytes
        tj.dispose(x)
        z = y * 2
        assert p.kernels[-1].total_bytes_snapshot == tj.memory().num_bytes
    assert p.new_bytes == tj.memory().num_bytes
    tj.dispose([r, y, z])
    _empty()


@pytest.mark.skipif(UNDER_EIGHT, reason="runs the tests above under eight devices")
def test_under_eight_devices() -> None:
    out = run_under_eight_devices(__file__, "-x")
    assert "failed" not in out and ", 1 skipped" in out  # only this test
