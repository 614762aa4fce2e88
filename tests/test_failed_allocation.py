"""After a failed allocation nothing aborts the process, and nothing counts the failed bytes.

JAX reports a failed allocation only when the array is waited for: until then the array object
exists, JAX calls its buffer ready, and reading its values or address aborts the process
(``Check failed: buffer_.IsConcrete()``). So every check that could abort runs in one
subprocess (``SCRIPT``), which prints a line per check; each test below asserts its own line, and
names the check the process died in when it aborted.

A real asynchronous failure on this machine: ``tnp.zeros((7_000_000_000,))`` (28 GB on a 24 GiB
machine) queued behind a 1 GiB copy still running, as in tests/test_oom.py. The tests at the end
run in this process: an allocation that fails at once (``jnp.zeros((10**13,))``), and failures
simulated by making ``block_until_ready`` raise for one array (reading it stays safe then).
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src.array import ArrayImpl
from jax.errors import JaxRuntimeError

import tidyjax as tj
import tidyjax.numpy as tnp
from tidyjax import _arrays, _oom

SCRIPT = textwrap.dedent(
    r"""
    import contextlib, io, sys, time
    import numpy as np
    import jax, jax.numpy as jnp
    import tidyjax as tj
    import tidyjax.numpy as tnp
    from tidyjax._oom import failed

    def check(name, fn):
        print("start", name, flush=True)
        try:
            problem = fn()
        except BaseException as e:
            problem = f"raised {type(e).__name__}: {e}"
        if problem:
            print("FAIL", name, "::", str(problem)[:600].replace("\n", " | "), flush=True)
        else:
            print("ok", name, flush=True)

    def expect(cond, got):
        return None if cond else f"got {got!r}"

    def queue_a_failure():
        # A 1 GiB copy still running, freed: the next huge request is queued behind it and
        # fails only when waited for (the array object comes back first).
        t = tj.tensor(np.ones(256 * 1024 * 1024, np.float32))
        t.dispose()
        return tnp.zeros((7_000_000_000,))  # 28 GB on a 24 GiB machine

    FAILED = "Tensor(float32[7000000000] · allocation failed (26.1 GiB))"
    small = tj.tensor(np.ones(1024, np.float32))  # 4 KiB the user holds
    raw_small = jnp.ones(3)  # 12 B the user holds, untracked
    small.block_until_ready(), raw_small.block_until_ready()
    # With the sampler: it looks meanwhile (raw_small, made before, is not counted when the
    # out-of-memory report reads its address, which on JAX 0.6 makes a new object over it).
    tl = tj.timeline()
    tl.__enter__()
    z = queue_a_failure()
    print("pending", not z.array.is_ready(), flush=True)

    # -- figures and errors (none of these aborted before; the failed bytes were counted) ------

    def oom_report():
        try:
            z.block_until_ready()
        except tj.OutOfMemoryError as e:
            text = str(e)
            if "Not counted: 1 array whose computation failed" not in text:
                return f"the failed array is not named apart: {text}"
            untracked = [h for h in e.report.holders if not h.tracked]
            if [dict(h.shapes) for h in untracked] != [{"float32[3]": 1}]:
                return f"untracked holders {untracked}"
            return expect(e.report.tracked_bytes == 4096, e.report.tracked_bytes)
        return "allocated"  # a machine with that much memory: nothing to test

    check("oom report names the user's holders, not the failed array", oom_report)
    if not failed(z.array):
        print("allocated", flush=True)
        sys.exit(0)
    check("memory() counts no failed bytes",
          lambda: expect(tj.memory().num_bytes == 4096, tj.memory()))
    check("memory() per device counts no failed bytes",
          lambda: expect(sum(tj.memory().bytes_per_device.values()) == 4096, tj.memory()))
    check("live_tensors() counts no failed bytes",
          lambda: expect(sorted(r.bytes for r in tj.live_tensors()) == [0, 4096],
                         tj.live_tensors()))

    def leaks():
        leaked = []
        try:
            with tj.check_leaks():
                leaked.append(z.clone())  # a leaked Tensor on the failed buffer
        except tj.LeakError as e:
            return expect(e.report.num_bytes == 0 and len(e.report) == 1, str(e))
        finally:
            tj.dispose(leaked)
        return "no leak reported"

    check("check_leaks() counts no failed bytes", leaks)

    def timeline():
        now = time.perf_counter()
        live = tl.live_at(now)
        if sorted(r.bytes for r in live) != [0, 4096]:
            return f"live_at: {live}"
        if tl.peak_bytes != 4096 + 2**30:  # the small Tensor and the 1 GiB one, not 26.1 GiB
            return f"peak {tl.peak_bytes}"
        return expect([e.bytes for e in tl.events if e.kind == "alloc"][-1] == 0, tl.events)

    check("timeline counts no failed bytes, nor its peak", timeline)

    derived = z.array * 2  # raw; fails at once: its input failed
    for _ in range(1000):
        if derived.is_ready():
            break
        time.sleep(0.01)

    def adopt():
        try:
            tj.adopt(derived)
        except tj.OutOfMemoryError as e:
            return expect("adopt()" in str(e) and not derived.is_deleted(), str(e))
        return "adopted"

    check("adopt() of a failed array raises OutOfMemoryError", adopt)

    def dispose_raw():
        tj.dispose(derived)  # not tidyjax's: left alone, and nothing aborts
        return expect(not derived.is_deleted(), derived.is_deleted())

    check("dispose() of a failed raw array leaves it to its owner", dispose_raw)

    # -- displays (each of these aborted the process before) ------------------------------

    check("repr", lambda: expect(repr(z) == FAILED, repr(z)))
    check("str", lambda: expect(str(z) == FAILED, str(z)))

    def printed():
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            print(z)
        return expect(out.getvalue() == FAILED + "\n", out.getvalue())

    check("print", printed)
    def formatted():  # a format reads the value: JAX's error, as tidyjax's (no abort)
        try:
            text = format(z)
        except tj.OutOfMemoryError:
            return None
        return f"no error: {text!r}"

    check("format raises OutOfMemoryError", formatted)

    def html():
        page = z._repr_html_()
        return expect("allocation failed (26.1 GiB)" in page and "<pre>" not in page, page)

    check("_repr_html_", html)

    def variable():
        v = tj.Variable(z, name="w")
        try:
            text, page = repr(v), v._repr_html_()
        finally:
            v.dispose()
        want = "Variable(name='w', float32[7000000000] · allocation failed (26.1 GiB))"
        return expect(text == want and "allocation failed" in page, (text, page))

    check("a named Variable's repr and html", variable)

    def reports():
        m = tj.memory()
        live = tj.live_tensors()
        snap = tj.snapshot()
        for x in (m, live, snap, snap.statistics()):
            repr(x), str(x), getattr(x, "_repr_html_", str)()
        leaked = []
        try:
            with tj.check_leaks():
                leaked.append(z.clone())
        except tj.LeakError as e:
            repr(e.report), str(e.report), e.report._repr_html_()
        finally:
            tj.dispose(leaked)
        repr(tl), tl._repr_html_(), tl.to_html(), tl.to_json()

    check("memory, live_tensors, snapshot, leak report and timeline displays", reports)
    tl.__exit__(None, None, None)
    check("timeline peak after it stopped", lambda: expect(tl.peak_bytes == 4096 + 2**30, tl))

    # -- a notebook cell ending in a Tensor still being computed (it fails meanwhile) ------

    def notebook():
        from IPython.core.interactiveshell import InteractiveShell

        shell = InteractiveShell.instance()
        shell.run_line_magic("load_ext", "tidyjax")
        shell.run_line_magic("tidyjax", "auto on")
        shell.user_ns["queue_a_failure"] = queue_a_failure
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            r1 = shell.run_cell("z2 = queue_a_failure()\nwas_pending = not z2.array.is_ready()\nz2")
            r2 = shell.run_cell("%tidyjax memory")
            r3 = shell.run_cell("%tidyjax live")
            r4 = shell.run_cell("print(z2)")
        text = out.getvalue()
        print("pending in the cell", shell.user_ns["was_pending"], flush=True)
        errors = [r.error_in_exec for r in (r1, r2, r3, r4) if r.error_in_exec is not None]
        shown = f"]: {FAILED}\n" in text and f"\n{FAILED}\n" in text  # Out[n]: , print()
        return expect(not errors and shown, (errors, text))

    check("a notebook cell displays a Tensor that fails while shown", notebook)
    print("alive", flush=True)
    """
)

CHECKS = [
    "oom report names the user's holders, not the failed array",
    "memory() counts no failed bytes",
    "memory() per device counts no failed bytes",
    "live_tensors() counts no failed bytes",
    "check_leaks() counts no failed bytes",
    "timeline counts no failed bytes, nor its peak",
    "adopt() of a failed array raises OutOfMemoryError",
    "dispose() of a failed raw array leaves it to its owner",
    "repr",
    "str",
    "print",
    "format raises OutOfMemoryError",
    "_repr_html_",
    "a named Variable's repr and html",
    "memory, live_tensors, snapshot, leak report and timeline displays",
    "timeline peak after it stopped",
    "a notebook cell displays a Tensor that fails while shown",
]


@functools.cache
def _run() -> subprocess.CompletedProcess[str]:
    # The OOM errors save the open timeline: into a folder of their own, not the working one.
    with tempfile.TemporaryDirectory() as folder:
        env = {**os.environ, "JAX_PLATFORMS": "cpu", "TIDYJAX_OOM_DIR": folder}
        return subprocess.run(
            [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=600, env=env
        )


def _died(proc: subprocess.CompletedProcess[str]) -> str:
    rc = proc.returncode
    how = f"killed by {signal.Signals(-rc).name}" if rc < 0 else f"exit {rc}"
    started = [
        line[len("start ") :] for line in proc.stdout.splitlines() if line.startswith("start ")
    ]
    last = started[-1] if started else "(before the first check)"
    return f"the process died ({how}) in check {last!r}\n{proc.stderr[-2000:]}"


@pytest.mark.parametrize("name", CHECKS)
def test_failed_allocation_in_a_subprocess(name):
    proc = _run()
    lines = proc.stdout.splitlines()
    if "allocated" in lines:
        pytest.skip("this machine had the memory: nothing failed")
    assert "pending True" in lines, f"the allocation did not fail asynchronously\n{proc.stdout}"
    if f"ok {name}" in lines:
        return
    failure = next((line for line in lines if line.startswith(f"FAIL {name} ::")), None)
    assert failure is None, failure
    pytest.fail(f"check {name!r} not reached: {_died(proc)}")


def test_the_subprocess_survives_to_the_end():
    proc = _run()
    assert proc.returncode == 0, _died(proc)
    if "allocated" in proc.stdout.splitlines():
        pytest.skip("this machine had the memory: nothing failed")
    assert "alive" in proc.stdout.splitlines(), proc.stdout


# -- in this process --------------------------------------------------------------------------

HUGE = (10**13,)  # float32: 40 TB, fails at once on a CPU
HERE = os.path.basename(__file__)


def _untracked_here(err: tj.OutOfMemoryError) -> list[dict[str, int]]:
    """The untracked holders the report names at sites of this file (other tests' arrays may
    be alive in this process), by shapes."""
    rows = [h for h in err.report.holders if not h.tracked and HERE in str(h.site)]
    return sorted((dict(h.shapes) for h in rows), key=str)


_OLD_JAX = pytest.mark.skipif(
    tuple(int(p) for p in jax.__version__.split(".")[:2]) < (0, 7),
    reason="JAX 0.6 drops the failed call's frames from the error's traceback, so the fill value "
    "they hold cannot be told from a user's array; the report lists it there",
)


@_OLD_JAX
def test_an_oom_report_leaves_out_the_scalar_jnp_zeros_made_in_the_failed_call():
    # jnp.zeros makes its fill value (a float32[] scalar) before the allocation fails; only the
    # failed call's frames hold it, and its creation site is the user's line.
    raw = jnp.ones(3).block_until_ready()
    with pytest.raises(tj.OutOfMemoryError) as info:
        tnp.zeros(HUGE)
    assert _untracked_here(info.value) == [{"float32[3]": 1}], str(info.value)
    with pytest.raises(tj.OutOfMemoryError) as info:
        tnp.ones(HUGE)
    assert _untracked_here(info.value) == [{"float32[3]": 1}], str(info.value)
    with pytest.raises(tj.OutOfMemoryError) as info, tj.oom_report():
        jnp.zeros(HUGE)
    assert _untracked_here(info.value) == [{"float32[3]": 1}], str(info.value)
    del raw


@_OLD_JAX
def test_an_oom_report_still_names_the_users_arrays_the_failed_call_was_given():
    x = jnp.ones(5).block_until_ready()  # passed in, and the user's
    fill = jnp.float32(2).block_until_ready()  # the user's own fill value
    with pytest.raises(tj.OutOfMemoryError) as info, tj.oom_report():
        jnp.add(x, jnp.zeros(HUGE))
    assert _untracked_here(info.value) == [{"float32[5]": 1}, {"float32[]": 1}]

    def step():
        tmp = jnp.ones(7)  # a local of the user's frame, which the error holds: the user's
        return jnp.zeros(HUGE) + tmp

    with pytest.raises(tj.OutOfMemoryError) as info, tj.oom_report():
        step()
    assert _untracked_here(info.value) == [{"float32[5]": 1}, {"float32[7]": 1}, {"float32[]": 1}]
    with pytest.raises(tj.OutOfMemoryError) as info, tj.oom_report():
        jnp.full(HUGE, fill)
    assert _untracked_here(info.value) == [{"float32[5]": 1}, {"float32[]": 1}]
    del x, fill


def _fail_on(monkeypatch, target):
    """Make waiting for ``target`` raise JAX's error, as an asynchronous failure does (its
    values stay readable: nothing aborts here)."""
    plain = ArrayImpl.block_until_ready

    def block_until_ready(self):
        if self is target:
            raise JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating 4096 bytes.")
        return plain(self)

    monkeypatch.setattr(ArrayImpl, "block_until_ready", block_until_ready)


def test_failed_never_waits_for_an_array_being_computed_unless_asked(monkeypatch):
    arr = jnp.ones(1024).block_until_ready()
    assert not _arrays.failed(arr) and _oom.failed is _arrays.failed
    _fail_on(monkeypatch, arr)
    assert _arrays.failed(arr)
    monkeypatch.setattr(ArrayImpl, "is_ready", lambda self: False)  # still being computed
    assert not _arrays.failed(arr)
    assert _arrays.failed(arr, wait=True)
    assert not _arrays.failed(tj.Tensor) and not _arrays.failed(np.ones(2))


def test_a_failure_found_while_a_timeline_records_is_rewritten_with_its_peak(monkeypatch):
    keep = tj.tensor(np.ones(16, np.float32))  # 64 B
    with tj.timeline(max_events=3) as tl:
        t = tj.tensor(np.ones(1024, np.float32))  # 4 KiB: the peak, until it is found failed
        u = tj.tensor(np.ones(32, np.float32))  # 128 B
        assert tl.peak_bytes == 64 + 4096 + 128
        _fail_on(monkeypatch, t.array)
        now = time.perf_counter()
        assert sorted(r.bytes for r in tl.live_at(now)) == [0, 64, 128]
        assert tl.peak_bytes == 64 + 128
        t.dispose()
        assert [e.bytes for e in tl.events if e.kind == "free"] == [0]
        u.dispose()
    assert tl.peak_bytes == 64 + 128
    assert sum(r.bytes for r in tl.live_at(time.perf_counter())) == 64
    keep.dispose()


def test_a_failure_rewritten_after_dropped_events_keeps_what_they_left_alive(monkeypatch):
    with tj.timeline(max_events=3) as tl:
        a = tj.tensor(np.ones(16, np.float32))  # 64 B, held throughout
        b = tj.tensor(np.ones(1024, np.float32))  # 4 KiB
        b.dispose()
        t = tj.tensor(np.ones(2048, np.float32))  # 8 KiB: the peak, until it is found failed
        u = tj.tensor(np.ones(32, np.float32))  # 128 B
        assert tl.dropped == 2 and tl.peak_bytes == 64 + 8192 + 128
        _fail_on(monkeypatch, t.array)
        assert [e.kind for e in tl.events] == ["free", "alloc", "alloc"]
        # the moment the dropped events left (a and b alive) is the largest one replayed
        assert tl.peak_bytes == 64 + 4096
        assert sorted(r.bytes for r in tl.live_at(tl.peak_time)) == [64, 4096]
        assert tl.peak_time < tl.events[0].time
    assert tl.peak_bytes == 64 + 4096
    tj.dispose([a, t, u])


def test_an_older_peak_among_dropped_events_counts_once_a_later_one_is_found_failed(
    monkeypatch,
):
    with tj.timeline(max_events=3) as tl:
        a = tj.tensor(np.ones(16, np.float32))  # 64 B, held throughout
        before = time.perf_counter()
        b = tj.tensor(np.ones(1024, np.float32))  # 4 KiB: 4160 B alive, the first peak
        after = time.perf_counter()
        b.dispose()
        c = tj.tensor(np.ones(32, np.float32))  # 128 B
        t = tj.tensor(np.ones(2048, np.float32))  # 8 KiB: the peak, until it is found failed
        u = tj.tensor(np.ones(4, np.float32))  # 16 B; b's alloc and free are dropped by now
        assert tl.dropped == 3 and tl.peak_bytes == 64 + 128 + 8192 + 16
        _fail_on(monkeypatch, t.array)
        assert sorted(r.bytes for r in tl.live_at(time.perf_counter())) == [0, 16, 64, 128]
        # the first peak, among the dropped events, is the largest moment again (it read 208 B,
        # the largest moment still replayable); what was alive then was dropped with it
        assert tl.peak_bytes == 64 + 4096 and before <= tl.peak_time <= after
        with pytest.raises(tj.TidyjaxValueError, match="cannot replay"):
            tl.live_at(tl.peak_time)
    assert tl.peak_bytes == 64 + 4096
    tj.dispose([a, c, t, u])


def test_displays_and_figures_of_a_simulated_failure(monkeypatch):
    t = tj.tensor(np.ones(1024, np.float32))
    keep = tj.tensor(np.ones(4, np.float32))
    _fail_on(monkeypatch, t.array)
    assert repr(t) == str(t) == "Tensor(float32[1024] · allocation failed (4.0 KiB))"
    assert "allocation failed (4.0 KiB)" in t._repr_html_()
    assert tj.memory().num_bytes == 16
    assert sorted(r.bytes for r in tj.live_tensors()) == [0, 16]
    assert repr(keep).startswith("Tensor([1., 1., 1., 1.]")
    with pytest.raises(tj.OutOfMemoryError, match=r"given to adopt\(\)"):
        tj.adopt(t.array)
    tj.dispose([t, keep])


def test_dispose_of_a_failed_raw_array_leaves_it_to_its_owner(monkeypatch):
    raw = jax.device_put(np.ones(8, np.float32), jax.devices()[0]).block_until_ready()
    _fail_on(monkeypatch, raw)
    tj.dispose({"raw": raw})  # tidyjax never made it: never deleted, and nothing aborts
    assert not raw.is_deleted()
