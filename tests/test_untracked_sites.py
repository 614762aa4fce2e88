"""Where untracked arrays were made: ``memory().untracked_sites``, ``live_tensors(untracked=True)``
and the untracked rows of ``snapshot()`` and ``compare_to``, each naming the user's line."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tidyjax as tj
from tidyjax._memory import TOP_SITES
from tidyjax._sites import library_frame
from tidyjax._watch import _watched

from .conftest import line_of

# Sites name files relative to the working directory when they lie under it.
HERE = os.path.relpath(__file__)
HERE = __file__ if HERE.startswith(os.pardir) else HERE


@pytest.fixture(autouse=True)
def _nothing_watched_after_each_test():
    yield
    _watched.clear()


def _at(info: tj.MemoryInfo, line: int) -> list[tj.SiteStat]:
    return [u for u in info.untracked_sites if u.site is not None and u.site.line == line]


def make_raw(n: int) -> list[jax.Array]:
    out = []
    for i in range(n):
        out.append(jnp.full((250,), float(i)))  # SITE:make_raw
    return out


def test_memory_names_the_untracked_arrays_sites_per_device_with_count_and_bytes():
    raw = make_raw(3)
    big = jnp.zeros((64, 64))  # SITE:big
    info = tj.memory()
    device = str(jax.devices()[0])
    (rows,) = [_at(info, line_of("SITE:make_raw"))]
    assert len(rows) == 1
    (row,) = rows
    assert (row.device, row.count, row.bytes) == (device, 3, 3 * 1000)
    assert row.site.file == __file__ and row.site.function == "make_raw"
    (big_row,) = _at(info, line_of("SITE:big"))
    assert (big_row.count, big_row.bytes) == (1, 64 * 64 * 4)
    assert big_row.site.function.startswith("test_memory_names")
    # largest first on each device; the rows are the largest of the untracked arrays
    on_device = [u for u in info.untracked_sites if u.device == device]
    assert [u.bytes for u in on_device] == sorted((u.bytes for u in on_device), reverse=True)
    assert on_device.index(big_row) < on_device.index(row)
    # text, repr and the page name the user's line
    text = str(info)
    assert f"    {device}: {HERE}:{line_of('SITE:big')} in test_memory_names" in text
    assert f"{HERE}:{line_of('SITE:make_raw')} in make_raw: 3 untracked arrays, 2.9 KiB" in text
    assert (row.kind, row.device, row.count, row.bytes) == ("untracked", device, 3, 3000)
    page = info._repr_html_()
    assert "untracked arrays made at" in page
    assert f"{HERE}:{line_of('SITE:make_raw')} in make_raw" in page
    # immutable data: frozen rows in a tuple
    assert isinstance(info.untracked_sites, tuple)
    with pytest.raises(AttributeError):
        row.count = 0  # type: ignore[misc]
    del raw, big
    after = tj.memory()
    assert _at(after, line_of("SITE:make_raw")) == [] and _at(after, line_of("SITE:big")) == []


def test_without_the_scan_no_sites_are_read():
    raw = make_raw(2)
    info = tj.memory(scan_untracked=False)
    assert info.untracked_arrays is None and info.untracked_bytes is None
    assert info.untracked_sites == ()
    assert "untracked" not in str(info) and "made at" not in info._repr_html_()
    del raw


def test_each_device_names_at_most_top_sites_the_largest():
    made = []
    for i in range(TOP_SITES + 2):  # one site per line of a file of its own; i-th holds (i+1) KiB
        ns = {"jnp": jnp}
        exec(compile("\n" * i + f"x = jnp.ones({256 * (i + 1)})", "made.py", "exec"), ns)
        made.append(ns["x"])
    info = tj.memory()
    ours = [u for u in info.untracked_sites if u.site is not None and u.site.file == "made.py"]
    others = [u for u in info.untracked_sites if u not in ours]
    assert len(ours) + len(others) <= TOP_SITES * len(jax.devices())
    largest = [u.bytes for u in ours]
    assert largest == [1024 * n for n in range(TOP_SITES + 2, 2, -1)][: len(ours)]
    assert largest[0] == 1024 * (TOP_SITES + 2)  # the largest is always named
    del made


def test_watched_and_tracked_arrays_are_no_untracked_site():
    t = tj.tensor(np.ones(300, np.float32))  # SITE:tensor
    params = tj.watch({"w": jnp.ones(500)}, "params")  # SITE:watched
    info = tj.memory()
    assert _at(info, line_of("SITE:tensor")) == [] and _at(info, line_of("SITE:watched")) == []
    records = tj.live_tensors(untracked=True)
    lines = {r.site.line for r in records if r.scope == "<untracked>" and r.site is not None}
    assert line_of("SITE:tensor") not in lines and line_of("SITE:watched") not in lines
    t.dispose()
    del params


def test_live_tensors_lists_untracked_arrays_only_when_asked():
    t = tj.tensor([1.0, 2.0])
    raw = make_raw(2)
    plain = tj.live_tensors()
    assert [r.id for r in plain] == [t.id]
    every = tj.live_tensors(untracked=True)
    assert every[0].id == t.id  # the Tensors first, then the untracked arrays
    ours = [r for r in every if r.site is not None and r.site.line == line_of("SITE:make_raw")]
    assert len(ours) == 2
    r = ours[0]
    assert (r.id, r.scope, r.shape, r.dtype, r.bytes) == (0, "<untracked>", (250,), "float32", 1000)
    assert r.devices == (str(jax.devices()[0]),) and not r.kept and not r.variable
    assert "untracked array" in tj._census.summary(every)
    assert "untracked array" not in tj._census.summary(plain)
    assert "&lt;untracked&gt;" in every._repr_html_()
    assert len([r for r in every if r.scope == "<untracked>"]) == tj.memory().untracked_arrays
    t.dispose()
    del raw


def test_a_diff_shows_the_plain_arrays_that_grew_at_a_user_line(tmp_path):
    before = tj.snapshot()
    grown = make_raw(4)  # SITE:grown
    t = tj.tensor([0.0] * 10)  # SITE:tensor_in_diff
    after = tj.snapshot()
    assert len(after.untracked) == len(before.untracked) + 4
    assert [r for r in after.records if r.scope == "<untracked>"] == []
    diffs = after.compare_to(before)
    # a row per chain of user frames (issue 41): this test's line, then make_raw's
    made = f"{HERE}:{line_of('SITE:make_raw')} in make_raw"
    test = "test_a_diff_shows_the_plain_arrays_that_grew_at_a_user_line"
    key = f"{HERE}:{line_of('SITE:grown')} in {test} → {made} (untracked)"
    (raw_diff,) = [d for d in diffs if d.label == key]
    assert raw_diff.untracked and (raw_diff.count, raw_diff.count_diff) == (4, 4)
    assert (raw_diff.bytes, raw_diff.bytes_diff) == (4000, 4000)
    assert "4 untracked arrays (+4)" in str(raw_diff)
    # the Tensors' sites first, apart from the untracked ones
    assert not diffs[0].untracked and diffs[0].bytes_diff == 40
    assert diffs.index(raw_diff) > 0
    page = diffs._repr_html_()
    assert "untracked: jax arrays tidyjax does not own" in page and "(untracked)" in page
    # the snapshot's text and page show them apart, marked
    text = str(after)
    head, rest = text.split("untracked (jax arrays tidyjax does not own), by creation site:")
    assert "in test_a_diff_shows" in head and "(untracked)" not in head
    site = key.removesuffix(" (untracked)")
    assert f"{site}: 4 untracked arrays, 3.9 KiB [float32[250] ×4]" in rest  # noqa: RUF001
    assert "untracked array" in repr(after) and "(untracked)" in after._repr_html_()
    stats = after.statistics()
    assert not stats[0].untracked and stats[-1].untracked
    # the file keeps them
    after.dump(tmp_path / "s.json")
    loaded = tj.Snapshot.load(tmp_path / "s.json")
    assert len(loaded.untracked) == len(after.untracked) and loaded.records == after.records
    assert [str(d) for d in loaded.compare_to(before)] == [str(d) for d in diffs]
    # freed: the diff shrinks by the same bytes
    del grown
    shrink = tj.snapshot().compare_to(after)
    (gone,) = [d for d in shrink if d.label == key]
    assert (gone.count, gone.count_diff, gone.bytes_diff) == (0, -4, -4000)
    t.dispose()


def test_snapshot_without_untracked_is_the_tensors_only():
    raw = make_raw(1)
    t = tj.tensor([1.0])
    snap = tj.snapshot(untracked=False)
    assert snap.untracked == () and [r.id for r in snap.records] == [t.id]
    assert "(untracked)" not in str(snap) and "untracked array" not in str(snap)
    t.dispose()
    del raw


def test_memory_over_all_processes_keeps_the_sites():
    raw = make_raw(2)
    local = tj.memory()
    everywhere = tj.memory(all_processes=True)
    assert everywhere.untracked_sites == local.untracked_sites
    (row,) = _at(everywhere, line_of("SITE:make_raw"))
    assert row.site.file == __file__ and row.bytes == 2000
    del raw


def test_arrays_flax_nnx_makes_name_the_users_line_with_the_library_as_detail():
    nnx = pytest.importorskip("flax.nnx")
    rngs = nnx.Rngs(0)
    layer = nnx.Linear(4, 8, rngs=rngs)  # SITE:nnx
    line = line_of("SITE:nnx")
    (row,) = _at(tj.memory(), line)
    assert row.site.file == __file__ and row.bytes >= (4 * 8 + 8) * 4
    assert row.site.detail is not None and "flax" in row.site.detail.file
    assert library_frame(row.site.detail).startswith("flax/")
    assert "flax/" in tj.memory()._repr_html_()  # the library frame, where there is room
    records = tj.live_tensors(untracked=True)
    (kernel,) = [r for r in records if r.scope == "<untracked>" and r.shape == (4, 8)]
    assert kernel.site.line == line and kernel.bytes == 128
    assert "flax/" not in str(kernel.site) and "site-packages" not in str(kernel.site)
    del layer, rngs
