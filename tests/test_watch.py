"""``tidyjax.watch`` on plain JAX pytrees: no optional library needed (the Equinox and Flax NNX
cases are in ``test_ecosystem.py``)."""

from __future__ import annotations

import jax.numpy as jnp
import pytest

import tidyjax as tj
from tidyjax._watch import _watched


@pytest.fixture(autouse=True)
def _nothing_watched_after_each_test():
    """A failing test must not leave an object watched for the next one."""
    yield
    _watched.clear()


def test_watch_names_the_arrays_of_any_pytree_and_counts_them_apart():
    raw = jnp.ones((4, 4))
    before = tj.memory()
    params = tj.watch({"w": raw, "nested": [jnp.zeros(3)], "t": tj.tensor([1.0, 2.0])}, "params")
    info = tj.memory()
    assert info.watched == {"params": 64 + 12 + 8}
    assert info.num_bytes == before.num_bytes + 8  # the Tensor stays tracked too
    tj.unwatch("params")
    unwatched = tj.memory()  # the same arrays, seen as untracked: the two raw ones
    assert unwatched.untracked_arrays == (info.untracked_arrays or 0) + 2
    assert unwatched.untracked_bytes == (info.untracked_bytes or 0) + 64 + 12
    tj.watch(params, "params")
    assert "watched 'params': 84 B" in str(tj.memory())  # shown in the text and the page
    assert "watched &#x27;params&#x27;" in tj.memory()._repr_html_()
    assert "watched={'params': 84}" in repr(tj.memory())
    live = tj.live_tensors()
    assert 'name="params[' in repr(live) and ">name<" in live._repr_html_()
    records = {r.name: r for r in live}
    assert records["params['w']"].scope == "<watched>" and records["params['w']"].id == 0
    assert records["params['nested'][0]"].bytes == 12
    t = params["t"]
    assert records["params['t']"].id == t.id  # a Tensor inside keeps its record, named
    snap = tj.snapshot()
    assert {r.name for r in snap.records} >= {"params['w']", "params['t']"}
    loaded = tj.Snapshot(tj.TensorRecord.from_json(r.to_json()) for r in snap.records)
    assert [r.name for r in loaded.records] == [r.name for r in snap.records]
    with tj.check_leaks():  # watched arrays are no leaks
        tj.unwatch("params")  # renamed: one name per object, so unwatched under the old first
        tj.watch(params, "renamed")
    assert list(tj.memory().watched) == ["renamed"]
    tj.unwatch(params)
    tj.unwatch(params)  # idempotent
    assert tj.memory().watched == {} and tj.memory() != info
    t.dispose()


# -- one object, one name ----------------------------------------------------------------------


def test_watching_a_watched_object_under_another_name_is_refused_and_names_the_fix():
    """An object is reported under one name: a second name for it is refused, saying the name
    it has and how to rename it, and nothing changes (the first name stays, the second name
    keeps what it held)."""
    params = {"w": jnp.ones(3)}
    other = {"b": jnp.zeros(2)}
    assert tj.watch(params, "a") is params
    tj.watch(other, "b")
    with pytest.raises(tj.TidyjaxValueError) as err:
        tj.watch(params, "b")
    message = str(err.value)
    assert "already watched as 'a'" in message
    assert "tidyjax.unwatch('a')" in message and "'b'" in message
    assert isinstance(err.value, ValueError)
    assert tj.memory().watched == {"a": 12, "b": 8}  # unchanged: "b" still the other object
    assert tj.watch(params, "a") is params  # the same name again: nothing to say
    assert list(tj.memory().watched) == ["a", "b"]
    tj.unwatch("a")  # the fix the message gives: then the new name is taken
    tj.watch(params, "c")
    assert tj.memory().watched == {"b": 8, "c": 12}
    assert {r.name for r in tj.live_tensors() if r.scope == "<watched>"} == {"b['b']", "c['w']"}


def test_a_tensor_or_an_array_watched_twice_is_refused_too():
    t = tj.tensor([1.0, 2.0])
    raw = jnp.ones(4)
    tj.watch(t, "t")
    tj.watch(raw, "raw")
    for obj, old in ((t, "t"), (raw, "raw")):
        with pytest.raises(tj.TidyjaxValueError, match=f"already watched as '{old}'"):
            tj.watch(obj, "again")
    assert set(tj.memory().watched) == {"t", "raw"}
    t.dispose()
