"""XLA's temporaries of ``tidyjax.jit`` calls, counted by ``profile()`` and the timeline
(issue 42, item 1): the call event observers hear, read once per signature, and never while
nothing observes."""

from __future__ import annotations

import gc
from typing import Any

import jax
import jax.numpy as jnp
import pytest

import tidyjax as tj
from tidyjax import _plan, _registry

N = 512


@tj.jit
def step(x: Any) -> Any:
    y = jnp.sin(x) @ jnp.cos(x)
    return jnp.tanh(y @ jnp.sin(y)) + 1.0


@tj.jit
def cheap(x: Any) -> Any:
    return x * 2.0


@pytest.fixture(autouse=True)
def _clean():
    gc.collect()
    yield
    gc.collect()
    assert not _registry.observers, "a test left an observer registered"


@pytest.fixture
def x():
    t = tj.tensor(jnp.ones((N, N), jnp.float32))
    jax.block_until_ready(t.array)
    yield t
    t.dispose()


def test_profile_counts_the_temporaries_of_a_jitted_step(x):
    p = tj.plan(step, x)
    assert p.temp_bytes is not None and p.argument_bytes is not None
    with tj.profile() as info:
        out = step(x)
    assert info.temp_bytes == p.temp_bytes
    assert info.temp_call == "step"
    assert info.device_peak_bytes is not None
    assert info.device_peak_bytes >= p.argument_bytes + p.temp_bytes
    assert info.device_peak_bytes >= info.peak_bytes
    if p.temp_bytes > 0:
        assert info.device_peak_bytes > info.peak_bytes
    # the array peak is as before: the argument and the output
    assert info.peak_bytes == x.nbytes + out.nbytes
    text = str(info)
    assert text.splitlines()[1].startswith("device peak ")
    assert "of step" in text and "array peak " in text
    assert "device_peak_bytes=" in repr(info) and "temp_call='step'" in repr(info)
    assert "device peak" in info._repr_html_()
    out.dispose()


def test_a_profile_without_a_jit_call_reports_no_temporaries(x):
    with tj.profile() as info:
        y = x * 2.0
    assert info.temp_bytes == 0 and info.temp_call is None
    assert info.device_peak_bytes == info.peak_bytes
    assert "no tidyjax.jit call ran" in str(info)
    y.dispose()


def test_unknown_figures_are_none_never_zero(x, monkeypatch):
    def unknown(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("no analysis")

    monkeypatch.setattr(_plan, "call_figures", unknown)
    with tj.profile() as info:
        out = cheap(x)
    assert info.device_peak_bytes is None and info.temp_bytes is None
    assert info.temp_call == "cheap"
    assert "device peak unknown" in str(info)
    out.dispose()


def test_the_timeline_records_the_temporaries_and_the_device_peak(x, tmp_path):
    p = tj.plan(step, x)
    with tj.timeline(sample=None) as tl:
        out = step(x)
    temps = [ev for ev in tl.events if ev.kind == "temporaries"]
    assert [(ev.name, ev.bytes) for ev in temps] == [("step", p.temp_bytes)]
    assert tl.peak_bytes == x.nbytes + out.nbytes  # the arrays' replay is unchanged
    assert sum(r.bytes for r in tl.live_at(temps[0].time)) == tl.peak_bytes
    assert tl.device_peak_bytes == tl.peak_bytes + p.temp_bytes
    if p.temp_bytes:
        assert tl.device_peak_call == "step" and tl.device_peak_time == temps[0].time
        assert "device peak" in repr(tl) and "temporaries of step" in repr(tl)
        page = tl.to_html()
        assert "device peak" in page and "XLA temporaries of step" in page
    path = tmp_path / "t.json"
    tl.dump(path)
    back = tj.Timeline.load(path)
    assert [(ev.kind, ev.name, ev.bytes) for ev in back.events] == [
        (ev.kind, ev.name, ev.bytes) for ev in tl.events
    ]
    assert back.device_peak_bytes == tl.device_peak_bytes
    out.dispose()


def test_profile_and_timeline_agree(x):
    with tj.timeline(sample=None) as tl, tj.profile() as info:
        out = step(x)
    assert info.peak_bytes == tl.peak_bytes
    assert info.device_peak_bytes == tl.device_peak_bytes
    out.dispose()


def test_with_no_observer_no_figures_are_read(x, monkeypatch):
    def boom(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("figures read")

    monkeypatch.setattr(_plan, "call_figures", boom)
    monkeypatch.setattr(_plan, "observe_call", boom)
    f = tj.jit(lambda a: a + 1.0)
    g = tj.jit(lambda a: a * 3.0, donate_argnums=0)
    a = f(x)
    b = g(a)
    tj.dispose([a, b])


def test_the_figures_are_read_once_per_signature(x, monkeypatch):
    reads = []
    real = _plan.call_figures

    def counting(*args: Any, **kwargs: Any) -> Any:
        reads.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(_plan, "call_figures", counting)
    fn = tj.jit(lambda a, k: a * k, static_argnums=1)
    small = tj.tensor(jnp.ones((8,)))
    with tj.profile():
        outs = [fn(x, 2.0), fn(x, 2.0), fn(x, 2.0)]
        assert len(reads) == 1
        outs += [fn(small, 2.0), fn(x, 3.0), fn(small, 2.0)]
        assert len(reads) == 3  # a new shape, a new static value
    with tj.timeline(sample=None):
        outs.append(fn(x, 2.0))
    assert len(reads) == 3  # kept across observers
    tj.dispose([*outs, small])


def test_a_donating_call_is_heard_with_its_figures(x):
    donating = tj.jit(lambda a: jnp.sin(a) @ jnp.cos(a), donate_argnums=0)
    arg = x * 1.0
    p = tj.plan(donating, arg)
    with tj.profile() as info:
        out = donating(arg)
    assert info.temp_call.endswith("<lambda>") and info.temp_bytes == p.temp_bytes
    assert info.device_peak_bytes is not None and info.device_peak_bytes >= info.peak_bytes
    out.dispose()


def test_a_jit_call_inside_a_jit_call_is_heard_once(x):
    outer = tj.jit(lambda a: cheap(a) + 1.0)
    with tj.timeline(sample=None) as tl:
        out = outer(x)
    names = [ev.name for ev in tl.events if ev.kind == "temporaries"]
    assert len(names) == 1 and names[0].endswith("<lambda>")
    out.dispose()


def test_an_observed_first_call_traces_the_function_once(x):
    traces = []

    def fresh(a):
        traces.append(1)  # a Python side effect: runs once per trace
        return jnp.sin(a) @ jnp.cos(a)

    f = tj.jit(fresh)
    with tj.profile() as p:
        out = f(x)
        out.dispose()
    assert len(traces) == 1  # the figures came from JAX's caches, after the call
    assert p.temp_bytes is not None and p.temp_call.endswith("fresh")
