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
        tj.watch(params, "renamed")  # the same object: renamed, held once
    assert list(tj.memory().watched) == ["renamed"]
    tj.unwatch(params)
    tj.unwatch(params)  # idempotent
    assert tj.memory().watched == {} and tj.memory() != info
    t.dispose()
