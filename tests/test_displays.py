"""The displays' content, without a browser: what profile(), memory() and scopes say, in text
and HTML, checked against the bytes measured (how they render is in ``test_displays_browser.py``
and ``test_displays_hosts.py``)."""

from __future__ import annotations

import gc
import html
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tidyjax as tj
from tidyjax import _memory
from tidyjax._format import fmt_bytes

from .conftest import line_of

HERE = os.path.basename(__file__)


def _at(line: int, function: str) -> str:
    """A site in this file as displays name it (relative to the working directory)."""
    return str(tj.Site(__file__, line, function))


def _text(markup: str) -> str:
    """The visible text of a display (the style sheet and tags dropped, spaces squeezed)."""
    markup = re.sub(r"<style>.*?</style>", "", markup, flags=re.S)
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", markup)).split())


def _tables(markup: str) -> list[tuple[list[str], list[list[str]]]]:
    """Each table as (header cells, body rows), cells as visible text."""
    out = []
    for table in re.findall(r"<table>(.*?)</table>", markup, flags=re.S):
        rows = re.findall(r"<tr>(.*?)</tr>", table, flags=re.S)
        head = [_text(c) for c in re.findall(r"<th[^>]*>(.*?)</th>", rows[0])]
        body = [[_text(c) for c in re.findall(r"<td[^>]*>(.*?)</td>", r)] for r in rows[1:]]
        out.append((head, body))
    return out


# -- profile() ------------------------------------------------------------------------------------


def test_profile_names_columns_by_what_they_count_and_splits_the_peak():
    before = tj.tensor(np.zeros(100, np.float32))  # 400 B alive before the profile

    def body() -> tj.Tensor:
        x = tj.tensor(np.ones(10, np.float32))  # 40 B, not an op
        y = x * 2.0  # 40 B allocated, disposed below  SITE:profile-y
        y.dispose()
        z = x * 3.0  # 40 B allocated, still live at the end  SITE:profile-z
        x.dispose()
        return z

    sites = [line_of("SITE:profile-y"), line_of("SITE:profile-z")]

    info = tj.profile(body)
    assert info.bytes_before == 400 == before.nbytes
    assert info.peak_bytes == 400 + 40 + 40 and info.peak_bytes_during == 80
    assert info.bytes_allocated == 80 and info.bytes_live_at_end == 40
    assert (info.new_bytes, info.new_tensors) == (40, 1)  # old names still work
    assert [k.bytes_allocated for k in info.kernels] == [40, 40]

    text = str(info)
    shown = _text(info._repr_html_())
    for out in (text, shown):
        assert "peak 480 B = 400 B before + 80 B during" in out
        assert "2 ops of 1 kernel allocated 80 B in 2 buffers, 40 B of it still live" in out
        assert "net bytes" not in out and "net change +40 B, +1 tensor" in out

    summary, log = _tables(info._repr_html_())
    assert summary[0] == [
        "kernel", "calls", "first call (compile)", "other calls", "per other call",
        "allocated", "still live at end", "called at",
    ]  # fmt: skip
    (row,) = summary[1]
    assert row[0] == "mul" and row[1] == "2"
    assert row[5:7] == ["80 B", "40 B"]
    assert row[7] == f"{_at(sites[0], 'body')} (+1 other site)"
    assert log[0][2:4] == ["allocated", "still live at end"] and log[0][-1] == "called at"
    assert [r[2:4] for r in log[1]] == [["40 B", "0 B"], ["40 B", "40 B"]]
    assert [r[-1] for r in log[1]] == [_at(n, "body") for n in sites]

    for k, n in zip(info.kernels, sites, strict=True):
        assert k.site is not None and os.path.basename(k.site.file) == HERE
        assert (k.site.line, k.site.function) == (n, "body")
    tj.dispose([before, info.result])


def test_profile_of_a_loop_says_allocated_not_net():
    x = tj.tensor(np.ones(256, np.float32))  # 1.0 KiB

    def loop() -> tj.Tensor:
        for _ in range(50):
            y = x * 2.0  # each one replaces the last: 50 KiB allocated, 1 KiB left
        return y

    info = tj.profile(loop)
    (row,) = _tables(info._repr_html_())[0][1]
    assert row[0] == "mul" and row[1] == "50"
    assert row[5:7] == ["50.0 KiB", "1.0 KiB"]  # the review's "+15.6 MiB net" was this sum
    assert info.bytes_allocated == 50 * 1024 and info.bytes_live_at_end == 1024
    assert info.new_bytes == 1024
    assert "peak 3.0 KiB = 1.0 KiB before + 2.0 KiB during" in str(info)  # x; y and the next
    tj.dispose([x, info.result])


def test_profile_with_no_op_still_reads():
    info = tj.profile(lambda: None)
    assert str(info).startswith("0 ops of 0 kernels allocated 0 B in 0 buffers")
    assert "peak 0 B = 0 B before + 0 B during" in _text(info._repr_html_())


# -- memory() -------------------------------------------------------------------------------------


@pytest.fixture
def holders():
    """Tidyjax's, watched and untracked bytes at known lines, each larger than any stray."""
    big = tj.tensor(np.zeros(64 * 1024, np.float32))  # 256 KiB tracked  SITE:holder-big
    small = [tj.tensor(np.zeros(8 * 1024, np.float32)) for _ in range(2)]  # SITE:holder-small
    model = {"w": jnp.zeros(48 * 1024), "b": jnp.zeros(1024)}  # 196 KiB watched
    tj.watch(model, "model")
    raw = jnp.zeros(32 * 1024)  # 128 KiB untracked  SITE:holder-raw
    lines = {k: line_of(f"SITE:holder-{k}") for k in ("big", "small", "raw")}
    yield lines, (big, small, model, raw)
    tj.unwatch("model")
    tj.dispose([big, small])


def test_memory_totals_per_device_add_tracked_watched_and_untracked(holders):
    raw = holders[1][3]
    m = tj.memory()
    (dev,) = jax.devices()[:1]
    tracked, watched = m.bytes_per_device[dev], m.watched_per_device[dev]
    untracked = m.untracked_per_device[dev]
    assert tracked == m.num_bytes == 256 * 1024 + 2 * 32 * 1024
    assert watched == (48 * 1024 + 1024) * 4 == m.watched["model"]
    assert untracked == m.untracked_bytes and untracked >= raw.nbytes
    assert m.total_per_device[dev] == tracked + watched + untracked

    total = tracked + watched + untracked
    parts = (
        f"{fmt_bytes(tracked)} tidyjax + {fmt_bytes(watched)} watched + "
        f"{fmt_bytes(untracked)} untracked = {fmt_bytes(total)}"
    )
    assert f"{dev}: {parts}" in str(m)
    assert f"{fmt_bytes(total)} with watched and untracked arrays" in str(m).splitlines()[0]
    head, rows = _tables(m._repr_html_())[0]
    assert head[:6] == ["device", "tidyjax bytes", "", "+ watched", "+ untracked",
                        "= total on device"]  # fmt: skip
    (row,) = [r for r in rows if r[0] == str(dev)]
    assert [row[1], *row[3:6]] == [fmt_bytes(b) for b in (tracked, watched, untracked, total)]


def test_memory_names_the_three_largest_holders_per_device(holders):
    lines, _ = holders
    m = tj.memory()
    top = [t for t in m.top_sites if t.device == str(jax.devices()[0])]
    assert len(top) == 3
    assert [(t.kind, t.bytes, t.count) for t in top] == [
        ("tensor", 256 * 1024, 1),
        ("watched", 196 * 1024, 2),
        ("untracked", 128 * 1024, 1),
    ]  # the two 32 KiB Tensors of one line (64 KiB) come fourth: not shown
    assert top[1].name == "model" and top[1].label == "watched 'model'"
    for t, key in ((top[0], "big"), (top[2], "raw")):
        assert t.site is not None and os.path.basename(t.site.file) == HERE
        assert t.site.line == lines[key]
    text = str(m)
    assert f"1. {top[0].site}" in text and "2. watched 'model': 2 watched arrays" in text
    head, rows = _tables(m._repr_html_())[1]
    assert head == ["device", "largest holders (top 3)", "kind", "count", "bytes", "shapes"]
    assert [r[1:5] for r in rows] == [
        [str(top[0].site), "tensor", "1", "256.0 KiB"],
        ["watched 'model'", "watched", "2", "196.0 KiB"],
        [f"{top[2].site} (untracked)", "untracked", "1", "128.0 KiB"],
    ]
    assert HERE in rows[0][1] and HERE in rows[2][1]
    unscanned = tj.memory(scan_untracked=False)
    assert unscanned.top_sites == ()  # sites are read only when scanned
    dev = jax.devices()[0]
    tracked, watched = unscanned.bytes_per_device[dev], unscanned.watched_per_device[dev]
    assert f"{dev}: {fmt_bytes(tracked)} tidyjax + {fmt_bytes(watched)} watched = " in str(
        unscanned
    )
    (row,) = [r for r in _tables(unscanned._repr_html_())[0][1] if r[0] == str(dev)]
    assert row[4:6] == ["not scanned", fmt_bytes(tracked + watched)]  # no 0 B where none looked
    everywhere = tj.memory(all_processes=True)  # each process's report passes through JSON
    assert everywhere.top_sites == m.top_sites
    assert everywhere.total_per_device == m.total_per_device


def test_a_tiny_stray_is_a_note_but_a_large_one_an_alarm():
    t = tj.tensor(np.zeros(4, np.float32))
    stray = jnp.float32(1.0)  # 4 B nobody owns
    quiet = tj.memory()
    assert quiet.unreliable and quiet.untracked_bytes is not None
    assert quiet.untracked_bytes < 1024, quiet.untracked_sites  # no other stray in the process
    markup = quiet._repr_html_()
    assert 'class="r"' not in markup and "unreliable" not in _text(markup)
    assert "note: 1 jax array (4 B)" in _text(markup)
    assert "note: 1 jax array (4 B)" in str(quiet) and "unreliable:" not in str(quiet)

    big = jnp.zeros(1 << 19)  # 2 MiB: an alarm whatever else is alive
    loud = tj.memory()
    assert 'class="r">unreliable</span>: 2 jax arrays' in loud._repr_html_()
    assert "unreliable: 2 jax arrays" in str(loud)
    del big, stray
    t.dispose()


def test_alarm_threshold_is_a_share_of_the_total_and_an_absolute_size():
    dev = jax.devices()[0]

    def info(tracked: int, untracked: int) -> tj.MemoryInfo:
        return tj.MemoryInfo(
            num_tensors=1, num_data_buffers=1, num_bytes=tracked, bytes_per_device={dev: tracked},
            unreliable=True, reasons=("1 jax array alive in this process is not owned by tidyjax",),
            untracked_arrays=1, untracked_bytes=untracked, device_stats={},
            untracked_per_device={dev: untracked},
        )  # fmt: skip

    def alarm(m: tj.MemoryInfo) -> bool:
        return 'class="r"' in m._repr_html_()

    assert not alarm(info(0, 4))  # 4 B, nothing else: not worth red
    assert not alarm(info(100 << 20, 512 << 10))  # 0.5% of 100 MiB
    assert alarm(info(10 << 20, 512 << 10))  # 5% of 10 MiB
    assert alarm(info(0, _memory.ALARM_BYTES))  # 1 MiB: always


class _FakeGPU:
    """A device that reports memory stats, as a GPU does (CPU devices return None)."""

    platform = "cpu"  # where its arrays would be listed: no arrays live on it
    id = 0

    def __str__(self) -> str:
        return "cuda:0"

    def memory_stats(self) -> dict[str, int]:
        return {"bytes_in_use": 6 << 30, "bytes_limit": 16 << 30, "peak_bytes_in_use": 7 << 30}


def test_on_a_gpu_the_share_of_the_limit_and_jax_peak_show(monkeypatch):
    cpu = tj.memory(scan_untracked=False)
    assert cpu.device_stats == {} and "in use" not in str(cpu) and "limit" not in str(cpu)
    gpu = _FakeGPU()
    monkeypatch.setattr(jax, "local_devices", lambda *a, **k: [gpu])
    m = tj.memory(scan_untracked=False)
    assert dict(m.device_stats[gpu]) == gpu.memory_stats()
    assert (
        "cuda:0: 0 B\n    in use (all of JAX) 6.0 GiB = 37.5% of the limit 16.0 GiB; peak 7.0 GiB"
    ) in str(m)
    head, rows = _tables(m._repr_html_())[0]
    assert head == ["device", "tidyjax bytes", "", "in use (all of JAX)", "limit", "",
                    "peak (all of JAX)"]  # fmt: skip
    (row,) = rows
    assert row[0] == "cuda:0" and row[3:5] == ["6.0 GiB (37.5%)", "16.0 GiB"]
    assert row[6] == "7.0 GiB"
    assert '<div style="width:45px;' in m._repr_html_()  # 6/16 of the 120 px bar


# -- scopes ---------------------------------------------------------------------------------------


def test_an_open_scope_reads_as_open_and_an_exited_one_accounts_for_every_buffer():
    with tj.tidy("step") as scope:
        a = tj.tensor([1.0, 2.0])
        b = a + 1.0
        c = a * 2.0
        markup = scope._repr_html_()
        assert "open: 3 buffers so far, 0 of them collected early or disposed" in _text(markup)
        ((head, (row,)),) = _tables(markup)
        assert head == ["buffers so far", "collected early or disposed so far", "peak so far"]
        assert row[:2] == ["3", "0"] and all(row), row  # no blank column
        del b  # its last reference: Python frees it before the exit
        gc.collect()
        assert "3 buffers so far, 1 of them collected early" in _text(scope._repr_html_())
        out = scope.keep(c + 1.0)
    assert a.is_disposed and c.is_disposed and not out.is_disposed
    assert (scope.num_created, scope.num_freed, scope.num_handed_out) == (4, 2, 1)
    markup = scope._repr_html_()
    text = _text(markup)
    assert "exited" in text
    assert scope.num_collected == 1
    assert (
        "created 4 = freed 2 at exit + handed out 1 + collected early 1 + disposed or kept 0"
        in (text)
    )
    ((head, (row,)),) = _tables(markup)
    assert head[:6] == ["buffers created", "freed at exit", "bytes freed", "handed out",
                        "collected early", "disposed or kept"]  # fmt: skip
    assert row[:6] == ["4", "2", "16 B", "1", "1", "0"]
    out.dispose()


def test_an_exited_scope_counts_what_was_disposed_or_kept_before_its_exit():
    with tj.tidy("step") as scope:
        a = tj.tensor([1.0])
        a.dispose()
        kept = tj.keep(tj.tensor([2.0]))
        c = tj.tensor([3.0])  # freed at the exit
        assert "3 buffers so far, 1 of them collected early or disposed" in _text(
            scope._repr_html_()
        )  # the kept one is alive: not counted as gone
    row = _tables(scope._repr_html_())[0][1][0]
    assert row[:6] == ["3", "1", "4 B", "0", "0", "2"]
    assert scope.num_collected == 0
    assert c.is_disposed and not kept.is_disposed
    kept.dispose()


def test_collected_early_counts_records_compaction_dropped_too():
    with tj.tidy("loop") as scope:
        x = tj.tensor([1.0])
        for _ in range(3000):  # past the compaction threshold: collected records are dropped
            x + 1.0
    assert scope.num_collected == 3000
    assert scope.num_created == 3001 and scope.num_freed == 1
    assert "collected early 3000 + disposed or kept 0" in _text(scope._repr_html_())


def test_a_scope_peak_is_shown_when_a_profile_measured_it():
    with tj.profile(), tj.tidy("measured") as scope:
        tj.tensor([1.0, 2.0]) * 2.0
    row = _tables(scope._repr_html_())[0][1][0]
    assert row[-1] == "16 B"
    with tj.tidy("plain") as plain:
        pass
    assert "measured only inside tidyjax.profile()" in _text(plain._repr_html_())
