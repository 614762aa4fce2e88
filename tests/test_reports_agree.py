"""Reports agree with themselves: one rule for watched memory everywhere.

The rule: a report's Tensor headline counts the live Tensors and their bytes (each buffer
once). The raw arrays of objects registered with ``tidyjax.watch`` are counted apart, always
as a count with its bytes: per name as ``memory().watched`` / ``memory().watched_arrays``
count them (in the out-of-memory report too), and as "watched arrays" in the headline of
``live_tensors()`` and snapshots. Every total is the sum of the rows beneath it.
"""

from __future__ import annotations

import gc
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tidyjax as tj
import tidyjax.numpy as tnp
from tidyjax import _oom
from tidyjax._oom import OOMWatched
from tidyjax._records import Site, TensorRecord, summary
from tidyjax._watch import _watched

HUGE = (10**13,)  # float32: 40 TB, more than any machine has
W_BYTES = 1024 * 1024 * 4
B_BYTES = 1024 * 4


@pytest.fixture(autouse=True)
def _nothing_watched_after_each_test():
    _watched.clear()
    yield
    _watched.clear()


def _params() -> dict[str, jax.Array]:
    params = {"w": jnp.ones((1024, 1024)), "b": jnp.ones((1024,))}
    jax.block_until_ready(params)
    return params


def _oom_report() -> _oom.OOMReport:
    with pytest.raises(tj.OutOfMemoryError) as info:
        tnp.zeros(HUGE)
    return info.value.report


# A count of tensors or arrays, in any report line.
_COUNT = re.compile(r"\b\d+ (?:live )?(?:watched )?(?:tensor|array)s?\b")
_BYTES = re.compile(r"\b\d+(?:\.\d+)? (?:B|KiB|MiB|GiB|TiB)\b")


def _every_count_has_its_bytes(text: str) -> None:
    for line in text.splitlines():
        if _COUNT.search(line) and not line.startswith("Not counted"):
            assert _BYTES.search(line), f"a count without its bytes: {line!r}"


def test_oom_headline_counts_the_tensors_and_their_bytes_and_watched_arrays_apart():
    params = tj.watch(_params(), "params")
    small = [tj.tensor([1.0]) for _ in range(3)]
    jax.block_until_ready(small)
    gc.collect()
    info = tj.memory()
    report = _oom_report()
    text = str(report)
    lines = text.splitlines()

    # The headline: the 3 Tensors and their 12 bytes, not the 2 watched arrays.
    assert lines[1] == "tidyjax holds 12 B in 3 tensors; the largest, by creation site and scope:"
    assert report.tensors == 3 == info.num_tensors
    assert report.tracked_bytes == 12 == info.num_bytes
    tracked = [h for h in report.holders if h.tracked]
    assert sum(h.count for h in tracked) == report.tensors
    assert sum(h.bytes for h in tracked) == report.tracked_bytes
    assert all(h.scope != "<watched>" for h in report.holders)  # no watched row among them

    # The watched section: the same figures as memory(), a count with its bytes.
    assert report.watched == (OOMWatched("params", 2, W_BYTES + B_BYTES, 0, 0),)
    assert report.watched_bytes == info.watched["params"] == W_BYTES + B_BYTES
    assert report.watched_arrays == info.watched_arrays["params"] == 2
    assert "Watched (tidyjax.watch; tidyjax frees none of it): 4.0 MiB in 2 arrays:" in lines
    assert "  'params': 4.0 MiB in 2 arrays" in lines

    # The untracked section: its totals are its rows' sums, and no watched array is in it.
    untracked = [h for h in report.holders if not h.tracked]
    assert report.untracked_bytes == sum(h.bytes for h in untracked)
    assert report.untracked_arrays == sum(h.count for h in untracked)
    assert all("float32[1024" not in str(h.shapes) for h in untracked)
    _every_count_has_its_bytes(text)

    tj.unwatch("params")  # the same arrays, no longer watched: now untracked
    gc.collect()
    after = _oom_report()
    assert after.watched == () and after.watched_bytes == 0 and after.watched_arrays == 0
    assert "Watched (" not in str(after)
    assert after.untracked_bytes == report.untracked_bytes + W_BYTES + B_BYTES
    assert after.untracked_arrays == report.untracked_arrays + 2
    assert (after.tensors, after.tracked_bytes) == (3, 12)
    tj.dispose(small)
    del params


def test_a_tensor_inside_a_watched_object_is_a_tensor_and_the_watched_row_says_so():
    t = tj.tensor([1.0, 2.0])
    params = tj.watch({"w": jnp.ones((4, 4)), "t": t}, "params")
    jax.block_until_ready(params)
    gc.collect()
    info = tj.memory()
    assert dict(info.watched) == {"params": 64 + 8}
    assert dict(info.watched_arrays) == {"params": 2}
    assert (info.num_tensors, info.num_bytes) == (1, 8)
    report = _oom_report()
    assert report.watched == (OOMWatched("params", 2, 72, 1, 8),)
    lines = str(report).splitlines()
    assert lines[1].startswith("tidyjax holds 8 B in 1 tensor;")
    assert "  'params': 72 B in 2 arrays (1 tensor, 8 B, of them also counted above)" in lines
    _every_count_has_its_bytes(str(report))
    t.dispose()


def test_memory_shows_each_watched_object_as_a_count_with_its_bytes():
    before = tj.memory(scan_untracked=False)
    assert dict(before.watched) == {} and dict(before.watched_arrays) == {}
    params = tj.watch(_params(), "params")
    info = tj.memory()
    assert dict(info.watched) == {"params": W_BYTES + B_BYTES}
    assert dict(info.watched_arrays) == {"params": 2}
    assert "  watched 'params': 4.0 MiB in 2 arrays" in str(info).splitlines()
    assert "watched &#x27;params&#x27; (tidyjax.watch): 2 arrays" in info._repr_html_()
    assert "watched_arrays={'params': 2}" in repr(info)
    _every_count_has_its_bytes(str(info))
    # the same buffer twice in one object counts once, in the count as in the bytes
    tj.watch({"a": params["b"], "again": params["b"]}, "twice")
    info2 = tj.memory(scan_untracked=False)
    assert (info2.watched["twice"], info2.watched_arrays["twice"]) == (B_BYTES, 1)
    # across processes (here one): the counts travel with the bytes
    everywhere = tj.memory(all_processes=True, scan_untracked=False)
    assert dict(everywhere.watched_arrays) == {"params": 2, "twice": 1}
    assert dict(everywhere.watched) == {"params": W_BYTES + B_BYTES, "twice": B_BYTES}
    tj.unwatch("params")
    tj.unwatch("twice")
    after = tj.memory(scan_untracked=False)
    assert dict(after.watched) == {} and dict(after.watched_arrays) == {}
    assert "watched" not in str(after)


def test_live_tensors_and_snapshots_count_watched_arrays_apart_with_their_bytes():
    small = [tj.tensor([1.0]) for _ in range(3)]
    assert summary(tj.live_tensors()) == "3 live tensors, 12 B"
    params = tj.watch(_params(), "params")
    records = tj.live_tensors()
    assert len(records) == 5  # the list still names every array
    head = "3 live tensors, 12 B; 2 watched arrays, 4.0 MiB"
    assert summary(records) == head
    assert f"<b>{head}</b>" in records._repr_html_()
    snap = tj.snapshot(untracked=False)  # plain arrays other tests left alive stay out
    assert repr(snap) == f"<Snapshot of {head}>"
    assert str(snap).splitlines()[0] == head
    assert head in snap._repr_html_()
    stats = snap.statistics()
    watched_rows = [s for s in stats if s.watched]
    tensor_rows = [s for s in stats if not s.watched]
    assert len(watched_rows) == 1 and watched_rows[0].site.endswith(" (watched)")
    assert (watched_rows[0].count, watched_rows[0].bytes) == (2, W_BYTES + B_BYTES)
    assert ": 2 watched arrays, 4.0 MiB [" in str(watched_rows[0])
    assert (sum(s.count for s in tensor_rows), sum(s.bytes for s in tensor_rows)) == (3, 12)
    assert all("watched array" not in str(s) for s in tensor_rows)
    # compared with a snapshot before the watch, the watched arrays are no Tensors either
    diffs = snap.compare_to(tj.Snapshot([r for r in snap.records if r.scope != "<watched>"]))
    assert len(diffs) == 1 and "2 watched arrays (+2)" in str(diffs[0])
    tj.unwatch(params)
    assert summary(tj.live_tensors()) == "3 live tensors, 12 B"
    tj.dispose(small)


def _rec(site_line: int, buffer: int, nbytes: int, scope: str = "s", rid: int = 1) -> TensorRecord:
    return TensorRecord(
        id=rid, shape=(nbytes // 4,), dtype="float32", bytes=nbytes, devices=("cpu:0",),
        scope=scope, site=Site("train.py", site_line, "step"), kept=False, variable=False,
        _buffer=buffer,
    )  # fmt: skip


def test_rows_add_up_to_their_totals_when_one_buffer_has_holders_at_two_sites():
    # One 400-byte buffer held by Tensors created at two sites (an alias made elsewhere), and a
    # 40-byte buffer: 440 bytes in all, which the rows must add up to.
    records = [_rec(1, 7, 400, rid=1), _rec(2, 7, 400, rid=2), _rec(2, 8, 40, rid=3)]
    snap = tj.Snapshot(records)
    stats = snap.statistics()
    assert sum(s.count for s in stats) == 3
    assert sum(s.bytes for s in stats) == 440
    assert str(snap).splitlines()[0] == "3 live tensors, 440 B"
    rows = _oom._rows(records, tracked=True)
    assert sum(h.count for h in rows) == 3 and sum(h.bytes for h in rows) == 440


def test_a_buffer_deleted_behind_tidyjax_holds_no_bytes_in_any_report():
    t = tj.tensor(np.ones(16, np.float32))
    t.array.delete()
    (record,) = [r for r in tj.live_tensors() if r.id == t.id]
    # read from the sharding: a deleted array has one (named as JAX names it: cpu:0 or TFRT_CPU_0)
    assert record.devices == (str(jax.devices()[0]),)
    info = tj.memory(scan_untracked=False)
    assert record.bytes == 0 == info.num_bytes and info.num_tensors == 1
    assert summary([record]) == "1 live tensor, 0 B"
    report = _oom_report()  # the report lists it (it raised before), with no bytes
    assert "holders failed" not in str(report)
    assert (report.tensors, report.tracked_bytes) == (1, 0)
    t.dispose()
    assert tj.memory(scan_untracked=False).num_tensors == 0
