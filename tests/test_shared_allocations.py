"""Array objects that share device allocations in every form JAX makes them (issue 40's findings).

The unit of the books is one allocation on one device (a shard): a buffer is deleted only when
no protected holder (returned, kept, a Variable, an outer scope's, the caller's) shares any of
its shards, whatever the other object's shape, dtype, commitment or sharding. Each test here
failed before the shard-level ledger. The multi-device cases run again under eight host devices
in a subprocess (the last test).
"""

from __future__ import annotations

import collections
import contextlib
import functools
import gc
import time
import weakref
from typing import Any

import jax
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import tidyjax as tj
from tidyjax import _registry

from .conftest import UNDER_EIGHT, run_under_eight_devices

DEVS = jax.devices()
eight = pytest.mark.skipif(len(DEVS) < 8, reason="needs 8 devices (run under eight below)")


def _alive(x: Any) -> bool:
    arr = x.array if isinstance(x, tj.Tensor) else x
    return not arr.is_deleted()


def _mesh(n: int) -> Mesh:
    return Mesh(np.array(DEVS[:n]), ("x",))


def _empty() -> None:
    gc.collect()
    m = tj.memory(scan_untracked=False)
    assert (m.num_tensors, m.num_data_buffers) == (0, 0), m


# -- 1. `t.to(sharding)` where the target shares a shard with the source -----------------------


@pytest.mark.parametrize("holder", ["variable", "keep", "outer"])
def test_to_a_one_device_named_sharding_on_the_same_device_keeps_the_source(holder: str) -> None:
    base = tj.tensor(np.arange(4, dtype=np.float32))
    src = tj.Variable(base) if holder == "variable" else tj.keep(base) if holder == "keep" else base
    with tj.tidy():
        moved = src.to(NamedSharding(_mesh(1), P()))
        np.testing.assert_array_equal(moved.numpy(), np.arange(4))
    assert _alive(src), "the source's buffer was deleted with the scope's transfer"
    np.testing.assert_array_equal(src.numpy(), np.arange(4))
    tj.dispose([src, base])
    del src, base
    _empty()


@eight
def test_to_replicated_from_one_device_keeps_the_kept_source() -> None:
    src = tj.keep(tj.tensor(np.arange(8, dtype=np.float32)))
    with tj.tidy():
        src.to(NamedSharding(_mesh(8), P()))
    assert _alive(src)
    np.testing.assert_array_equal(src.numpy(), np.arange(8))
    tj.dispose(src)
    _empty()


@eight
@pytest.mark.parametrize("how", ["scope.keep", "returned"])
def test_a_replicated_copy_handed_to_its_sources_scope_is_deleted_whole_with_it(how: str) -> None:
    """``x.to(replicated)`` made in an inner scope over an outer scope's one-device ``x`` shares
    ``x``'s shard; kept or returned into the outer scope, both are that scope's, and its exit
    deletes every shard. It was taken for a view of ``x``'s buffer, never tidyjax's to delete:
    its seven other shards outlived the exit while a raw reference held them (found by the
    alias model under eight devices, seed 8)."""
    rep = NamedSharding(_mesh(8), P())
    with tj.tidy():
        x = tj.tensor(np.arange(4, dtype=np.float32)) * 1
        if how == "returned":

            def copy(src: tj.Tensor = x) -> tj.Tensor:
                return src.to(rep)

            r = tj.tidy.run(copy)
        else:
            with tj.tidy() as inner:
                r = x.to(rep)
                inner.keep(r)
        raw = r.array
        views = [s.data for s in raw.addressable_shards]
        np.testing.assert_array_equal(np.asarray(views[7]), np.arange(4))
    assert r.is_disposed and x.is_disposed
    assert [v.is_deleted() for v in views] == [True] * 8, "shards of the scope's copy were left"
    del x, r, raw, views
    _empty()


@eight
def test_a_scopes_replicated_copy_of_a_top_level_buffer_is_released_at_its_exit() -> None:
    """A raw alias made outside every scope over a top-level ``x`` lives on whatever a scope
    does with ``x``'s aliases (docs/semantics.md): here ``x.to(replicated)``, made in a scope,
    shares ``x``'s shard and holds seven of its own; ``x`` disposed, that copy held the buffer,
    and the scope's exit deleted it whole, the raw alias's shard with it (the alias model under
    eight devices, seed 4). The exit releases it now."""
    x = tj.tensor(np.arange(4, dtype=np.float32)) * 1
    raw = jax.device_put(x.array, DEVS[0])  # made outside every scope: a new object, one buffer
    with tj.tidy():
        r = x.to(NamedSharding(_mesh(8), P()))
        tj.dispose(x)
        views = [s.data for s in r.array.addressable_shards]
    assert r.is_disposed and x.is_disposed
    assert not raw.is_deleted(), "the raw alias made outside every scope was deleted"
    np.testing.assert_array_equal(np.asarray(raw), np.arange(4))
    assert not any(v.is_deleted() for v in views)  # released: JAX frees them with their objects
    del r, views
    gc.collect()
    assert not raw.is_deleted()
    del x, raw
    _empty()


@eight
@pytest.mark.parametrize("named", [True, False])
def test_a_replicated_copy_of_a_callers_shard_never_makes_that_shard_tidyjaxs(named: bool) -> None:
    """A replicated copy made from a Tensor over a caller's raw shard view shares that shard
    and holds seven of its own; released at its scope's exit (the view's Tensor is kept), it
    handed its buffer on to the view's record, which became its heir: disposing the view's
    last Tensor then deleted the caller's shard view, and JAX its whole replicated array with
    it (the alias model under eight devices, seed 6). What the copy shares is not its to hand
    on (``named``: its Tensor lives to the exit; else collected at once, an orphan the view
    inherited from): the view stays the caller's."""
    mine = jax.device_put(np.arange(4, dtype=np.float32), NamedSharding(_mesh(8), P()))
    view = mine.addressable_data(0)
    with tj.tidy():
        (t,) = tj.tensors([view])
        kept = t.clone()
        with tj.tidy():
            copy = kept.to(NamedSharding(_mesh(8), P()))
            if not named:
                del copy
            tj.keep(kept)
    tj.dispose(kept)
    assert not mine.is_deleted() and not view.is_deleted(), "the caller's array was deleted"
    np.testing.assert_array_equal(np.asarray(mine), np.arange(4))
    del t, kept
    _empty()


@eight
def test_a_released_replicated_array_counts_its_shared_shard_once() -> None:
    """``x.to(replicated)`` made in a scope shares its shard on ``x``'s device with ``x``: the
    exit releases it (a raw ``.array`` of it lives on). ``memory()`` counted that shard twice,
    as ``x``'s buffer and again as an untracked array's."""
    x = tj.tensor(np.arange(4, dtype=np.float32))
    with tj.tidy():
        raw = x.to(NamedSharding(_mesh(4), P())).array
    assert not raw.is_deleted() and _alive(x)
    m = tj.memory()
    assert {str(d): b for d, b in m.bytes_per_device.items()} == {str(DEVS[0]): 16}
    untracked = {str(d): b for d, b in m.untracked_per_device.items() if b}
    assert untracked == {str(d): 16 for d in DEVS[1:4]}
    assert sum(m.total_per_device.values()) == 16 * 4  # one copy on each of the four devices
    (note,) = m.reasons  # named as released, with why, not as an array to adopt
    assert "1 array tidyjax made (48 B, counted as untracked) was released, not deleted" in note
    assert "not owned by tidyjax" not in note and "released, not deleted" in str(m)
    other = jax.device_put(np.ones(4, np.float32), NamedSharding(_mesh(4), P()))  # the caller's
    reasons = tj.memory().reasons
    assert (
        len(reasons) == 2 and "1 jax array (16 B) alive in this process is not owned" in reasons[0]
    )
    del raw, other
    gc.collect()
    assert tj.memory().reasons == ()
    assert not _registry._released  # forgotten with the array
    tj.dispose(x)
    _empty()
    # The caller's own replicated array, its view let go while a Tensor over its first shard
    # lives: the caller's, not released by tidyjax.
    mine = jax.device_put(np.ones(4, np.float32), NamedSharding(_mesh(4), P()))
    (view,) = tj.tensors([mine])
    first = view.to(DEVS[0])
    tj.memory(scan_untracked=False)  # groups the two records (they share the first shard)
    tj.dispose(view)
    assert not _registry._released
    (note,) = tj.memory().reasons
    assert "not owned by tidyjax" in note and "released" not in note
    tj.dispose(first)
    del mine, view, first
    _empty()


@eight
def test_to_four_way_replicated_from_eight_way_keeps_the_variable() -> None:
    v = tj.Variable(tj.tensor(jax.device_put(np.arange(8.0), NamedSharding(_mesh(8), P()))))
    with tj.tidy():
        v.to(NamedSharding(_mesh(4), P()))
    assert _alive(v)
    np.testing.assert_array_equal(v.numpy(), np.arange(8))
    tj.dispose(v)
    _empty()


# -- 2. `jax.device_put(replicated, devices[0])` is shard 0 itself ------------------------------


@eight
def test_a_dropped_shard_alias_never_deletes_the_variables_shard() -> None:
    v = tj.Variable(tj.tensor(jax.device_put(np.arange(8.0), NamedSharding(_mesh(8), P()))))
    with tj.tidy():
        a = jax.device_put(v, DEVS[0])  # shard 0 of the Variable, as a Tensor of this scope
    assert a.is_disposed and _alive(v)
    np.testing.assert_array_equal(v.numpy(), np.arange(8))
    tj.dispose(v)
    _empty()


@eight
@pytest.mark.parametrize("how", ["return", "keep", "variable"])
def test_a_protected_shard_alias_of_a_scopes_buffer_survives(how: str) -> None:
    def body() -> Any:
        t = tj.tensor(jax.device_put(np.arange(8.0), NamedSharding(_mesh(8), P()))) * 1
        a = jax.device_put(t, DEVS[0])
        if how == "keep":
            return tj.keep(a), None
        if how == "variable":
            return None, tj.Variable(a)
        return a, None

    got, var = tj.tidy.run(body)
    held = got if got is not None else var
    assert _alive(held)
    np.testing.assert_array_equal(held.numpy(), np.arange(8))
    tj.dispose(held)
    _empty()


# -- 3. shard views and other-dtype views over a scope's buffer ---------------------------------


@pytest.mark.parametrize(
    "view",
    [
        lambda a: a.addressable_data(0),
        lambda a: a.addressable_shards[0].data,
    ],
    ids=["addressable_data", "addressable_shards"],
)
@pytest.mark.parametrize("how", ["return", "keep"])
def test_a_shard_view_of_a_scopes_buffer_survives_when_handed_out(view: Any, how: str) -> None:
    def body() -> Any:
        t = tj.tensor(np.arange(4, dtype=np.float32)) * 2
        v = view(t.array)
        return tj.keep(v) if how == "keep" else v

    out = tj.tidy.run(body)
    assert _alive(out)
    np.testing.assert_array_equal(np.asarray(out), np.arange(4) * 2)
    tj.dispose(out)
    del out
    _empty()


@pytest.mark.parametrize("how", ["return", "keep"])
def test_key_data_of_a_scopes_key_survives_when_handed_out(how: str) -> None:
    expected = np.asarray(jax.random.key_data(jax.random.split(jax.random.key(0))))

    def body() -> Any:
        k = tj.tensor(jax.random.split(jax.random.key(0)))
        data = jax.random.key_data(k.array)  # uint32[2, 2] over the key's buffer
        return tj.keep(data) if how == "keep" else data

    out = tj.tidy.run(body)
    assert _alive(out)
    np.testing.assert_array_equal(np.asarray(out), expected)
    tj.dispose(out)
    del out
    _empty()


@pytest.mark.parametrize(
    "view",
    [lambda a: a.addressable_data(0), lambda a: jax.random.key_data(a)],
    ids=["addressable_data", "key_data"],
)
@pytest.mark.parametrize("how", ["tj.keep", "scope.keep", "variable"])
def test_a_protected_tensors_view_of_a_scopes_buffer_survives(view: Any, how: str) -> None:
    key = view is not None and "key_data" in repr(view.__code__.co_names)
    with tj.tidy() as s:
        if key:
            t = tj.tensor(jax.random.split(jax.random.key(0)))
        else:
            t = tj.tensor(np.arange(4, dtype=np.float32)) * 2
        (v,) = tj.tensors([view(t.array)])  # another shape or dtype, or uncommitted
        expected = np.asarray(v.array).copy()
        out = tj.keep(v) if how == "tj.keep" else s.keep(v) if how == "scope.keep" else None
        if how == "variable":
            out = tj.Variable(v)
    assert _alive(out)
    np.testing.assert_array_equal(out.numpy(), expected)
    tj.dispose([out, v])
    del out, v, t
    _empty()


# -- 4. a kept `tensors()` alias of a Tensor dropped before the exit ----------------------------


@pytest.mark.parametrize("how", ["scope.keep", "tj.keep", "variable"])
def test_a_kept_tensors_alias_of_a_dropped_tensor_survives(how: str) -> None:
    dev = DEVS[0]
    with tj.tidy() as s:
        t = tj.tensor(np.arange(3, dtype=np.float32)) * 1
        (alias,) = tj.tensors([jax.device_put(t.array, dev)])
        del t
        gc.collect()
        if how == "scope.keep":
            kept = s.keep(alias)
        elif how == "tj.keep":
            kept = tj.keep(alias)
        else:
            kept = tj.Variable(alias)
    assert _alive(kept)
    np.testing.assert_array_equal(kept.numpy(), np.arange(3))
    tj.dispose(kept)
    del kept, alias
    _empty()


def test_outer_keep_of_a_tensors_alias_while_an_inner_scope_is_open() -> None:
    dev = DEVS[0]
    with tj.tidy() as outer:
        with tj.tidy():
            t = tj.tensor(np.arange(3, dtype=np.float32)) * 1
            (alias,) = tj.tensors([jax.device_put(t.array, dev)])
            del t
            gc.collect()
            kept = outer.keep(alias)
        assert _alive(kept)
    assert _alive(kept)
    np.testing.assert_array_equal(kept.numpy(), np.arange(3))
    tj.dispose(kept)
    del kept, alias
    _empty()


# -- 5. an orphan whose array is still referenced ------------------------------------------------


def test_an_orphan_still_referenced_is_one_buffer_and_its_kept_alias_survives() -> None:
    with tj.tidy():
        with tj.tidy():
            t = tj.tensor(np.arange(3, dtype=np.float32)) * 1
            refs = [t.array]  # the array outlives its Tensor
            a = jax.device_put(t, DEVS[0])  # a second object over the buffer, as a Tensor
            del t
            gc.collect()
            assert tj.memory(scan_untracked=False).num_data_buffers == 1  # one buffer
            kept = tj.keep(a)
        assert tj.memory(scan_untracked=False).num_data_buffers == 1
    assert _alive(kept) and not refs[0].is_deleted()
    np.testing.assert_array_equal(kept.numpy(), np.arange(3))
    tj.dispose(kept)
    assert refs[0].is_deleted()  # its last Tensor disposed: the buffer goes, every object over it
    del kept, a, refs
    _empty()


# -- 7. a raw array over a buffer made outside every scope ---------------------------------------


def test_a_scope_never_deletes_a_top_level_buffer_a_raw_alias_still_holds() -> None:
    x = tj.tensor(np.arange(3, dtype=np.float32))
    r = jax.device_put(x.array, DEVS[0])  # a raw alias tidyjax never sees
    with tj.tidy():
        y = jax.device_put(x, DEVS[0])  # an alias Tensor of this scope over x's buffer
        tj.dispose(x)
        assert _alive(y)  # another Tensor still holds the buffer
    assert y.is_disposed  # the scope's Tensor object, disposed as an object only
    assert not r.is_deleted()
    np.testing.assert_array_equal(np.asarray(r), np.arange(3))
    del r, x, y
    _empty()


@pytest.mark.parametrize("owner", ["top", "kept"])
def test_disposing_the_last_alias_deletes_a_buffer_whose_own_tensor_went_first(owner: str) -> None:
    # The ownership model's CI failure: the alias a scope made over a top-level (or kept)
    # buffer was left as an object the scope does not own, so disposing it, the buffer's last
    # Tensor, deleted nothing and the buffer outlived every holder.
    outer = tj.tidy()
    if owner == "kept":
        outer.__enter__()
    x = tj.tensor(np.arange(3, dtype=np.float32)) * 1
    if owner == "kept":
        tj.keep(x)
    with tj.tidy():
        a = jax.device_put(x, DEVS[0])  # this scope's Tensor over x's buffer
        first = x.array
        tj.dispose(x)
        assert not first.is_deleted()  # a still holds it
        tj.dispose(a)  # the last Tensor: the buffer goes, as for any buffer
        assert first.is_deleted()
        m = tj.memory(scan_untracked=False)
        assert (m.num_tensors, m.num_data_buffers, m.num_bytes) == (0, 0, 0), m
    if owner == "kept":
        outer.__exit__(None, None, None)
    del x, a, first
    _empty()


def test_a_scope_keeps_its_hands_off_a_top_level_buffer_its_alias_outlived() -> None:
    x = tj.tensor(np.arange(3, dtype=np.float32)) * 1
    r = jax.device_put(x.array, DEVS[0])  # a raw alias tidyjax never sees
    with tj.tidy():
        a = jax.device_put(x, DEVS[0])
        tj.dispose(x)
    assert a.is_disposed  # the scope's object, disposed at its exit (TensorFlow.js)
    assert not r.is_deleted()  # the buffer was not the scope's to delete
    np.testing.assert_array_equal(np.asarray(r), np.arange(3))
    del x, a, r
    _empty()


def test_disposing_the_alias_of_a_collected_top_level_tensor_deletes_the_buffer() -> None:
    # The ownership model (reports now and then): the alias was grouped with the original by a
    # report, the original's Tensor and array object were collected, then the alias, the
    # buffer's last Tensor, was disposed: the buffer outlived it, held by the disposed Tensor.
    x = tj.tensor(np.arange(3, dtype=np.float32)) * 1
    with tj.tidy():
        a = jax.device_put(x, DEVS[0])
        tj.memory()  # the alias check runs: one buffer, x's
        del x
        gc.collect()
        first = a.array
        tj.dispose(a)
        assert first.is_deleted()
    del a, first
    _empty()


def test_disposing_a_kept_alias_after_the_original_deletes_the_buffer() -> None:
    # The batch ownership model: a kept alias, its original disposed first, then the kept
    # alias, the buffer's last Tensor: the buffer outlived it (the hand-on skipped kept ones).
    x = tj.tensor(np.arange(3, dtype=np.float32)) * 1
    with tj.tidy():
        a = jax.device_put(x, DEVS[0])
        tj.memory()  # the alias check runs: one buffer, x's
        tj.keep(a)
        tj.dispose(x)
        first = a.array
        assert not first.is_deleted()  # the kept alias holds it
        tj.dispose(a)
        assert first.is_deleted()
    del a, x, first
    _empty()


def test_a_scope_keeps_its_hands_off_a_top_level_buffer_whose_tensor_was_collected() -> None:
    x = tj.tensor(np.arange(3, dtype=np.float32)) * 1
    r = jax.device_put(x.array, DEVS[0])  # a raw alias tidyjax never sees
    with tj.tidy():
        a = jax.device_put(x, DEVS[0])  # the scope's alias Tensor
        del x  # the buffer's own Tensor is collected: the alias inherits the buffer...
        gc.collect()
        assert _alive(a)
    assert a.is_disposed  # ...but not as the scope's: the exit disposes the object only
    assert not r.is_deleted()
    np.testing.assert_array_equal(np.asarray(r), np.arange(3))
    del a, r
    _empty()


@pytest.mark.parametrize("failing", [False, True])
def test_a_scopes_disposed_alias_of_a_collected_top_level_tensor_lets_go_of_the_buffer(
    failing: bool,
) -> None:
    """The scope's alias of a top-level buffer whose own Tensor was collected after a report
    grouped them: the exit disposes the alias as an object only (the buffer was not the
    scope's), and the disposed Tensor, still held by the caller, lets go of the array, so JAX
    frees the buffer. It held it for ever, uncounted (the batch model, an exception's exit)."""
    x = tj.tensor(np.arange(3, dtype=np.float32)) * 1
    held = []
    with pytest.raises(KeyError) if failing else contextlib.nullcontext(), tj.tidy():
        a = jax.device_put(x, DEVS[0])
        tj.memory(scan_untracked=False)  # groups a's record with x's
        held.append(a)
        ref = weakref.ref(a.array)
        del a, x
        gc.collect()
        if failing:
            raise KeyError("leaves the scope")
    gc.collect()
    assert held[0].is_disposed
    assert ref() is None, "a disposed Tensor keeps the array (and its buffer) alive"
    del held
    _empty()


@pytest.mark.parametrize("how", ["put", "to_mesh", "to_device", "clone"])
def test_a_scopes_alias_never_takes_a_top_level_tensors_view_of_the_buffer(how: str) -> None:
    x = tj.tensor(np.arange(3, dtype=np.float32)) * 1
    raw = jax.device_put(x.array, DEVS[0])
    (view,) = tj.tensors([raw])  # top level: a caller's view, checked later with the scope's
    with tj.tidy():
        if how == "put":
            jax.device_put(x, DEVS[0])
        elif how == "to_mesh":
            x.to(NamedSharding(_mesh(1), P()))
        elif how == "to_device":
            x.to(DEVS[0])
        else:
            x.clone()
    assert not view.is_disposed and not x.is_disposed and not raw.is_deleted()
    np.testing.assert_array_equal(view.numpy(), np.arange(3))
    tj.dispose([x, view])
    del x, raw, view
    _empty()


# -- 8. the other direction: a scope's buffer with a raw alias and a `tensors()` wrapper --------


def test_a_scopes_buffer_with_a_raw_alias_and_its_tensors_wrapper_is_deleted() -> None:
    with tj.tidy():
        t = tj.tensor(np.arange(3, dtype=np.float32)) * 1
        raw = jax.device_put(t.array, DEVS[0])
        (w,) = tj.tensors([raw])
    assert t.is_disposed and w.is_disposed
    assert raw.is_deleted()  # nothing returned or kept reached it
    del t, raw, w
    _empty()


def test_disposing_the_last_tensor_deletes_the_buffer_under_a_seen_raw_alias() -> None:
    x = tj.tensor(np.arange(3, dtype=np.float32)) * 1
    with tj.tidy():
        raw = jax.device_put(x.array, DEVS[0])  # outlives the scope, seen through tensors()
        (w,) = tj.tensors([raw])
    assert w.is_disposed and not raw.is_deleted()
    first = x.array
    tj.dispose(x)  # the buffer's last Tensor: the buffer goes, every object over it (JAX)
    assert first.is_deleted() and raw.is_deleted()
    m = tj.memory(scan_untracked=False)
    assert (m.num_data_buffers, m.num_bytes) == (0, 0), m
    del x, raw, w, first
    _empty()


def test_a_kept_raw_alias_outlives_a_dispose_of_the_last_tensor() -> None:
    x = tj.tensor(np.arange(1, dtype=np.float32)) * 1
    raw = jax.device_put(x.array, DEVS[0])
    with tj.tidy():
        tj.keep(raw)  # protects the buffer from every scope, and from a dispose of its Tensors
    tj.dispose(x)
    assert x.is_disposed and not raw.is_deleted()
    np.testing.assert_array_equal(np.asarray(raw), [0.0])
    assert tj.memory(scan_untracked=False).num_data_buffers == 1  # kept: tidyjax's books
    del raw
    gc.collect()
    _empty()
    t = tj.keep(tj.tensor([1.0]) * 1)  # TF.js: keep(t) then dispose(t) frees t
    first = t.array
    tj.dispose(t)
    assert first.is_deleted()
    del t, first, x
    _empty()


def test_an_alias_of_the_callers_array_leaves_it_the_callers() -> None:
    mine = jax.device_put(np.arange(3, dtype=np.float32), DEVS[0])
    (w,) = tj.tensors([mine])
    with tj.tidy():
        a = jax.device_put(w, DEVS[0])  # a second object over the caller's buffer
        np.testing.assert_array_equal(a.numpy(), np.arange(3))
    assert a.is_disposed and not mine.is_deleted()
    tj.dispose([mine, w])
    assert not mine.is_deleted(), "never deleted: it is yours"
    del a, w
    _empty()
    del mine


# -- donation takes every object over the allocation ---------------------------------------------


def test_donating_a_buffer_disposes_its_aliases_and_the_counts_follow() -> None:
    x = tj.tensor(np.arange(4, dtype=np.float32)) * 1
    a = jax.device_put(x, DEVS[0])  # a second Tensor over x's buffer
    step = tj.jit(lambda p: p + 1, donate_argnums=0)
    y = step(x)
    assert x.is_disposed and a.is_disposed
    with pytest.raises(tj.DisposedError, match="donat"):
        a.numpy()
    m = tj.memory(scan_untracked=False)
    assert (m.num_tensors, m.num_data_buffers, m.num_bytes) == (1, 1, 16), m
    assert not m.unreliable
    tj.dispose(y)
    del x, a, y
    _empty()


# -- a buffer deleted behind tidyjax's back --------------------------------------------------------


def test_a_buffer_deleted_outside_leaves_every_report_once_noticed() -> None:
    with tj.timeline() as tl, tj.profile() as prof:
        t = tj.tensor(np.arange(4, dtype=np.float32)) * 1
        t.array.delete()
        with pytest.raises(tj.DisposedError, match="deleted outside"):
            t.numpy()  # tidyjax notices here
        assert tj.memory(scan_untracked=False).num_bytes == 0
        del t
        gc.collect()
    assert prof.new_bytes == 0 and prof.new_tensors == 0
    assert tl.live_at(tl.events[-1].time) == []
    assert [e.kind for e in tl.events].count("free") == 2  # the intermediate and this one
    _empty()


# -- check_leaks and views -----------------------------------------------------------------------


def test_check_leaks_counts_no_view_of_a_pre_existing_array() -> None:
    pre = jax.device_put(np.arange(4, dtype=np.float32), DEVS[0])
    with tj.check_leaks() as check:
        view = pre.addressable_data(0)  # a new object, no new memory
    assert check.leaked() == []
    cache = []
    with pytest.raises(tj.LeakError, match="1 untracked array"), tj.check_leaks():
        cache.append(pre + 1)  # a real leak beside a view: still found
        view2 = pre.addressable_data(0)
    del pre, view, cache, view2


def test_check_leaks_allow_of_a_raw_alias_allows_the_tensor_over_its_buffer() -> None:
    x = tj.tensor(np.arange(3, dtype=np.float32))
    with tj.check_leaks() as check:
        y = x * 2
        raw = jax.device_put(y.array, DEVS[0])
        check.allow(raw)
        assert check.leaked() == []
    with pytest.raises(tj.LeakError), tj.check_leaks(count_locals=True):
        z = x * 3  # not allowed: still found
    tj.dispose([x, y, z])
    del raw
    _empty()


# -- 6. the walk: no size cap, cycles, partials -------------------------------------------------


def test_the_ten_thousand_and_first_returned_tensor_survives() -> None:
    class Bag:
        pass

    def bags() -> Any:
        out: Any = collections.deque()  # not a pytree: walked as a container
        for i in range(10_050):
            b = Bag()
            b.t = tj.tensor(np.float32(i)) if i >= 10_040 else None
            out.append(b)
        return out

    out = tj.tidy.run(bags)
    last = [b.t for b in list(out)[10_040:]]
    assert all(_alive(t) for t in last)
    with tj.tidy():
        kept = tj.keep(bags())
    kept_last = [b.t for b in list(kept)[10_040:]]
    assert all(_alive(t) for t in kept_last)
    tj.dispose([out, kept])  # dispose reaches them too
    assert all(t.is_disposed for t in last + kept_last)
    del out, last, kept, kept_last
    _empty()


def test_a_cyclic_result_and_keep_of_a_cycle() -> None:
    def body() -> Any:
        d: dict[str, Any] = {"t": tj.tensor([1.0])}
        d["self"] = d
        lst: list[Any] = [tj.tensor([2.0])]
        lst.append(lst)
        tj.keep(lst)
        return d, lst

    d, lst = tj.tidy.run(body)
    assert _alive(d["t"]) and _alive(lst[0])
    with tj.tidy() as s:
        c: list[Any] = [tj.tensor([3.0])]
        c.append(c)
        s.keep(c)
    assert _alive(c[0])
    tj.dispose([d, lst, c])
    assert d["t"].is_disposed and lst[0].is_disposed and c[0].is_disposed
    del d, lst, c
    _empty()


def test_a_returned_partial_and_bound_method_keep_their_tensors() -> None:
    class Model:
        def __init__(self) -> None:
            self.w = tj.tensor([2.0])

        def __call__(self, x: Any) -> Any:
            return self.w * x

    def body() -> Any:
        return functools.partial(lambda a, b: a + b, tj.tensor([1.0])), Model().__call__

    part, method = tj.tidy.run(body)
    assert _alive(part.args[0]) and _alive(method.__self__.w)
    np.testing.assert_array_equal(np.asarray(method(part(1.0)).array), [4.0])
    tj.dispose([part, method])
    del part, method
    _empty()


# -- the alias model's findings (fifth session) ---------------------------------------------------


def test_a_scope_keep_holds_its_tensor_weakly() -> None:
    with tj.tidy() as s:
        t = s.keep(tj.tensor(np.arange(3, dtype=np.float32)) * 1)
        before = tj.memory(scan_untracked=False).num_tensors
        ref = t.array  # the buffer leaves with its record even when the Tensor is gone
        del t
        gc.collect()
        assert tj.memory(scan_untracked=False).num_tensors == before - 1  # a kept Tensor dropped
    assert _alive(ref), "a kept buffer whose Tensor was dropped was deleted at the exit"
    del ref
    _empty()


def test_the_raw_array_of_an_alias_an_inner_scope_disposed_goes_with_the_outer_scope() -> None:
    with tj.tidy():
        t = tj.tensor(np.arange(3, dtype=np.float32)) * 1
        with tj.tidy():
            alias = jax.device_put(t, DEVS[0])  # an object of its own over t's buffer
            raw = alias.array  # read before the inner exit disposes the alias
        assert alias.is_disposed and _alive(raw)
        del t
        gc.collect()
    assert raw.is_deleted(), "the outer scope's buffer outlived it through a disposed alias"
    del alias, raw
    _empty()


@pytest.mark.parametrize("form", ["put", "tensors"])
def test_dispose_of_the_last_alias_deletes_a_kept_buffer_whose_tensor_was_collected(
    form: str,
) -> None:
    t = tj.keep(tj.tensor(np.arange(3, dtype=np.float32)) * 1)
    raw = t.array  # an unkept raw object over the buffer: the caller's, it keeps nothing
    with tj.tidy():
        if form == "put":
            alias = jax.device_put(t, DEVS[0])
        else:
            (alias,) = tj.tensors([jax.device_put(t.array, DEVS[0])])
        del t
        gc.collect()
        tj.keep(alias)
    assert _alive(alias)
    tj.dispose(alias)
    assert raw.is_deleted(), "the buffer's last Tensor was disposed and the buffer lived on"
    del alias, raw
    _empty()


def test_a_raw_alias_a_scope_keeps_outlives_the_alias_tensor_it_disposes() -> None:
    t = tj.tensor(np.arange(3, dtype=np.float32)) * 1
    raw = jax.device_put(t.array, DEVS[0])  # the caller's raw alias, made outside every scope
    with tj.tidy() as s:
        alias = jax.device_put(t, DEVS[0])
        tj.dispose(t)  # alias is the buffer's last Tensor now
        s.keep([raw])
    assert alias.is_disposed  # the scope's object, not handed out (TF.js)
    assert _alive(raw), "the exit deleted a buffer a raw array it handed out holds"
    np.testing.assert_array_equal(np.asarray(raw), np.arange(3))
    tj.dispose(raw)  # no live Tensor holds the buffer: the raw array goes
    assert raw.is_deleted()
    del t, raw, alias
    _empty()


def test_an_heir_hands_the_buffer_on_to_a_view_that_outlives_it() -> None:
    t = tj.keep(tj.tensor(np.arange(3, dtype=np.float32)) * 1)
    with tj.tidy() as s:
        alias = jax.device_put(t, DEVS[0])
        tj.dispose(t)  # alias, made in the scope over a kept buffer, is its heir now
        s.keep([alias])
    (view,) = tj.tensors([jax.device_put(alias.array, DEVS[0])])
    tj.dispose(alias)  # the view holds the buffer now: it inherits it
    assert _alive(view)
    raw = view.array
    tj.dispose(view)  # the buffer's last Tensor
    assert raw.is_deleted(), "the last Tensor over tidyjax's buffer was disposed; it lived on"
    del t, alias, view, raw
    _empty()


def test_a_transfer_of_a_view_of_the_callers_array_stays_the_callers() -> None:
    mine = jax.device_put(np.arange(3, dtype=np.float32), DEVS[0])
    (view,) = tj.tensors([mine])
    moved = view.to(NamedSharding(_mesh(1), P()))  # the same buffer: both are checked at once
    tj.dispose(view)
    tj.dispose(moved)
    assert not mine.is_deleted(), "the caller's own array was deleted (never: it is yours)"
    np.testing.assert_array_equal(np.asarray(mine), np.arange(3))
    del view, moved
    _empty()


def test_an_outer_keep_of_a_raw_alias_disposes_the_inner_scopes_tensor_object() -> None:
    with tj.tidy() as outer:
        with tj.tidy():
            t = tj.tensor(np.arange(3, dtype=np.float32)) * 1
            raw = jax.device_put(t.array, DEVS[0])  # a raw alias tidyjax has not met
            outer.keep(raw)  # the buffer is the outer scope's now
        assert t.is_disposed, "the inner scope's own Tensor object outlived it (TF.js)"
        assert _alive(raw)
    assert _alive(raw)  # handed out of the outer scope too
    tj.dispose(raw)
    assert raw.is_deleted()
    del t, raw
    _empty()


def test_an_heir_a_scope_exit_lets_go_of_hands_the_buffer_to_a_kept_view() -> None:
    t = tj.tensor(np.arange(3, dtype=np.float32)) * 1
    with tj.tidy() as s:
        moved = t.to(NamedSharding(_mesh(1), P()))  # over t's buffer, made in the scope
        tj.dispose(t)  # moved is the top-level buffer's heir now
        (view,) = tj.tensors([jax.device_put(moved.array, DEVS[0])])
        s.keep([view])  # the exit disposes moved (not handed out): view holds the buffer
    assert moved.is_disposed and _alive(view)
    raw = view.array
    tj.dispose(view)  # the buffer's last Tensor
    assert raw.is_deleted(), "the last Tensor over tidyjax's buffer was disposed; it lived on"
    del t, moved, view, raw
    _empty()


def test_a_variables_copy_made_in_a_scope_is_the_scopes_once_the_variable_goes() -> None:
    mine = jax.device_put(np.arange(3, dtype=np.float32), DEVS[0])
    with tj.tidy():
        v = tj.Variable(mine)  # a copy, made in the scope
        alias = jax.device_put(v, DEVS[0])  # the scope's Tensor over the Variable's buffer
        raw = alias.array
        tj.dispose(v)  # the buffer is the scope's again (docs/semantics.md)
    assert alias.is_disposed
    assert raw.is_deleted(), "the scope left the buffer the Variable it made let go of"
    assert not mine.is_deleted()  # the caller's own array: never deleted
    del v, alias, raw
    _empty()


@eight
def test_a_disposed_tensor_over_a_released_buffer_holds_its_array_no_more() -> None:
    """``t.to(sharded)`` of the caller's replicated array slices it without a copy on CPU: its
    Tensor is over the caller's buffer, so ``dispose`` releases it (deletes nothing). The
    disposed Tensor then drops its array: it held it, alive and counted, for as long as the
    disposed Tensor object lived."""
    raw = jax.device_put(np.ones(1024, np.float32), NamedSharding(_mesh(8), P()))
    (t,) = tj.tensors([raw])
    s = t.to(NamedSharding(_mesh(8), P("x")))
    held = weakref.ref(s.array)
    tj.dispose([t, s])
    gc.collect()
    assert s.is_disposed and not raw.is_deleted()  # the caller's array: never deleted
    assert held() is None, "a disposed Tensor kept its released array alive"
    del t, s, raw
    _empty()


@eight
def test_a_variable_over_a_scopes_buffer_and_shards_of_its_own_is_freed_by_its_dispose() -> None:
    """``t.to(replicated)`` of a one-device ``t`` keeps ``t``'s buffer as its shard on that
    device and adds seven: made in an inner scope over the outer scope's buffer, it was an
    alias that scope disposes as an object only. A Variable takes it; when the outer scope
    exits, ``t``'s buffer lives on in the Variable, which inherits it: disposing the Variable
    deletes it (it was left for ever, counted, once a report had grouped the two records).
    """
    with tj.tidy():
        t = tj.tensor(np.arange(8, dtype=np.float32)) * 1
        with tj.tidy():
            a = t.to(NamedSharding(_mesh(8), P()))
            tj.memory(scan_untracked=False)  # groups t's record and a's
            v = tj.Variable(a)
    assert t.is_disposed and a.is_disposed and _alive(v)
    raw = v.array
    np.testing.assert_array_equal(v.numpy(), np.arange(8))
    tj.dispose(v)
    assert raw.is_deleted(), "the Variable's last dispose left the buffer it inherited"
    del t, a, v, raw
    _empty()


@eight
@pytest.mark.parametrize("report", [True, False])
@pytest.mark.parametrize("held", [False, True])
def test_a_view_handed_to_tensors_inherits_a_buffer_whose_heir_was_collected(
    report: bool, held: bool
) -> None:
    """A kept one-device Tensor, ``t.to(replicated)`` kept out of a scope (its shard there is
    ``t``'s buffer), ``t`` disposed: the replicated Tensor is the buffer's heir. A view of that
    shard handed to ``tensors()`` joins it (checked by a report, or still a suspect: the
    collected heir's array is held until the check); when the replicated Tensor is collected,
    the view's Tensor inherits the buffer, and disposing it deletes it (nobody did). ``held``:
    the caller holds ``t.array`` (read before ``t`` was disposed) too: the replicated Tensor's
    record holds it then (one entry per buffer), an heir whose own Tensor is gone.
    """
    t = tj.keep(tj.tensor(np.arange(4, dtype=np.float32)) * 1)
    mine = t.array if held else None
    with tj.tidy() as s:
        r = t.to(NamedSharding(_mesh(8), P()))
        s.keep([r])
    tj.dispose(t)
    raw = jax.device_put(r.array, DEVS[0])  # shard 0 of r: t's buffer
    (view,) = tj.tensors([raw])
    if report:
        tj.memory(scan_untracked=False)  # the report groups view's record with r's
    del r
    gc.collect()
    tj.dispose(view)
    assert raw.is_deleted(), "the buffer's last Tensor was disposed; the buffer lived on"
    assert mine is None or mine.is_deleted()  # the same buffer
    del t, view, raw, mine
    _empty()


@pytest.mark.parametrize("report", [True, False])
def test_a_view_of_a_variables_buffer_goes_home_with_it(report: bool) -> None:
    """A Variable's copy made in a scope, a view of its buffer handed to ``tensors()`` in an
    inner one, the Variable disposed there: the buffer is the outer scope's again (its home),
    the view's with it, so the outer exit deletes it. The view stayed the caller's (no scope
    owns a view of a Variable's buffer) and the buffer was left for ever."""
    look = (lambda: tj.memory(scan_untracked=False)) if report else (lambda: None)
    t = tj.tensor(np.arange(3, dtype=np.float32)) * 1
    with tj.tidy():
        v = tj.Variable(t.array.addressable_data(0))  # a raw view: the Variable copies it
        look()
        with tj.tidy():
            raw = jax.device_put(v.array, DEVS[0])
            (view,) = tj.tensors([raw])
            look()
            tj.dispose(v)
            look()
        assert view.is_disposed and not raw.is_deleted()  # the outer scope's buffer now
    assert raw.is_deleted(), "the Variable's buffer, its home scope's again, was left"
    tj.dispose(t)
    del v, view, raw
    _empty()


def test_a_variable_over_an_alias_of_a_top_level_tensor_lets_go_of_nothing_else() -> None:
    """``t.to(one-device sharding)`` is an alias of the top-level ``t``'s buffer; a Variable
    over it, disposed in the scope: the alias goes back to the scope, never ``t``. (A first
    fix for views of a Variable's buffer took every record of the group without a scope back
    with it, ``t``'s too: the scope's exit deleted a live top-level Tensor's buffer.)"""
    one = NamedSharding(_mesh(1), P())
    t = tj.tensor(np.arange(3, dtype=np.float32)) * 1
    with tj.tidy():
        a = t.to(one)
        tj.memory(scan_untracked=False)  # groups a's record with t's
        v = tj.Variable(a)
        tj.memory(scan_untracked=False)
        tj.dispose(v)
    assert _alive(t), "a live top-level Tensor's buffer was deleted"
    np.testing.assert_array_equal(t.numpy(), np.arange(3))
    tj.dispose(t)
    del a, v
    _empty()


def test_a_raw_alias_a_scope_returns_of_a_variables_buffer_goes_home_with_it() -> None:
    """Found by the alias model (seed 22): a Variable made in an inner scope, a raw
    ``jax.device_put`` of its array returned from there, the Variable dropped: its buffer goes
    home to the outer scope, which must delete it at its exit. The exit compared the returned
    raw array only with the inner scope's own records, so it never joined the Variable's: once
    the Variable's array object was collected, nothing tidyjax knew held the buffer, and it
    outlived the outer scope uncounted."""
    holder: dict[str, Any] = {}

    def body() -> list[Any]:
        holder["v"] = tj.Variable(np.arange(3, dtype=np.float32))
        return [jax.device_put(holder["v"].array, DEVS[0])]

    with tj.tidy():
        raw = tj.tidy.run(body)[0]
        del holder["v"]
        gc.collect()
        assert not raw.is_deleted()  # the outer scope's buffer now
        np.testing.assert_array_equal(np.asarray(raw), np.arange(3))
    assert raw.is_deleted(), "the Variable's buffer, its outer scope's now, was left"
    del raw
    _empty()


@eight
@pytest.mark.parametrize("dispose_view", [True, False])
def test_a_view_of_an_heirs_shard_is_its_heir_in_turn(dispose_view: bool) -> None:
    """Found by the alias model under eight devices (seed 27): a scope's replicated copy of a
    kept top-level Tensor becomes the heir of its buffer when the Tensor is disposed (the
    copy's shard 0 is that buffer). A one-device view of that shard made then, and the copy
    disposed: the view is the last holder. Disposing it deletes the buffer; the scope's exit
    does not (a raw alias made outside every scope still holds it). The copy kept the shard
    as "lent" (shared with another's buffer, never handed on) after it became its heir, so
    the view's dispose only released it."""
    everywhere = NamedSharding(_mesh(8), P())
    x = tj.keep(tj.tensor(np.arange(1, dtype=np.float32)) * 1)
    outside = jax.device_put(x.array, DEVS[0])  # a raw alias made outside every scope
    with tj.tidy():
        with tj.tidy() as inner:
            copy = inner.keep(x.to(everywhere))
        tj.dispose(x)
        (view,) = tj.tensors([jax.device_put(copy.array, DEVS[0])])
        raw = view.array
        tj.dispose(copy)
        assert not raw.is_deleted()
        if dispose_view:
            tj.dispose(view)
            assert raw.is_deleted(), "the last Tensor over the buffer was disposed: it goes"
    if not dispose_view:
        assert not outside.is_deleted(), "the scope's exit deleted a top-level buffer"
        np.testing.assert_array_equal(np.asarray(outside), np.arange(1))
    del x, copy, view, raw, outside
    gc.collect()
    _empty()


@eight
def test_a_variables_let_go_never_takes_a_view_of_another_variables_buffer() -> None:
    """Found by the alias model under eight devices (seed 4): ``one``, the top-level shard 0 of
    a Variable's replicated buffer, and a scope's ``one.to(replicated)`` (its shard 0 is
    ``one``'s allocation) share an allocation, so their records are one group. A second
    Variable over the scope's buffer, disposed there: the scope's buffer goes home to the
    scope, and ``one`` (which follows the first Variable's buffer, not this one's) went with
    it: the scope's exit disposed the live top-level Tensor."""
    everywhere, first = NamedSharding(_mesh(8), P()), NamedSharding(_mesh(1), P())
    x = tj.tensor(np.arange(4, dtype=np.float32), device=everywhere) * 1
    v = tj.Variable(x)
    one = x.to(first)  # shard 0 of v's buffer
    with tj.tidy():
        r = one.to(everywhere)  # its shard 0 is one's allocation
        w = tj.Variable(r)
        tj.dispose(w)
    assert not one.is_disposed, "a live top-level Tensor was disposed by a scope's exit"
    np.testing.assert_array_equal(one.numpy(), np.arange(4))
    np.testing.assert_array_equal(v.numpy(), np.arange(4))
    assert r.is_disposed  # the scope's own Tensor object
    tj.dispose([x, v, one])
    del r, w
    _empty()


def test_a_tensors_view_made_while_the_buffers_tensor_is_collected_joins_its_raw_alias() -> None:
    """Found by the alias model (seed 60): a top-level Tensor's buffer with a raw alias the
    caller holds (the array of a ``device_put`` alias made in a scope) and a ``tensors()`` view
    of it not yet resolved when the Tensor is collected. The view took the buffer over as if
    the collected Tensor's array were its last object, while the raw alias kept that record
    alive: two records over one buffer, counted twice. It joins it now."""
    t = tj.tensor(np.arange(3, dtype=np.float32)) * 1
    with tj.tidy():
        held = jax.device_put(t, DEVS[0]).array  # the caller keeps the alias's array object
    view = tj.tensors([jax.device_put(t.array, DEVS[0])])[0]
    del t
    gc.collect()
    m = tj.memory(scan_untracked=False)
    assert (m.num_tensors, m.num_data_buffers, m.num_bytes) == (1, 1, 12), m
    np.testing.assert_array_equal(view.numpy(), [0.0, 1.0, 2.0])
    tj.dispose(view)  # the buffer's last Tensor: deleted under the raw alias tidyjax saw
    assert held.is_deleted()
    del held
    _empty()


@eight
@pytest.mark.parametrize("over", ["tensor", "plain", "plain made in"])
def test_a_raw_copy_over_fewer_devices_made_of_the_same_shards_is_no_new_memory(
    over: str,
) -> None:
    """``jax.device_put`` of an 8-way replicated array to 4 of its devices hands back an array
    over 4 of its shards: no new memory. ``memory()`` counted it as 4 KiB of untracked arrays
    and the timeline as an allocation of its own (each matched a whole set of shards or one
    shard, never a subset); now both count the shards once, as the ledger does. Over a plain
    array alive before the recording (never counted by it), the timeline counted the copy as
    new until the thirteenth session; it counts nothing now."""
    everywhere = NamedSharding(_mesh(8), P())
    if over == "tensor":
        base = tj.tensor(np.ones(1024, np.float32), device=everywhere) * 1
        held = base.array
    elif over == "plain":
        held = jax.device_put(np.ones(1024, np.float32), everywhere)
    with tj.timeline(sample=None) as tl:
        if over == "plain made in":
            held = jax.device_put(np.ones(1024, np.float32), everywhere)
            tl.mark()
        raw = jax.device_put(held, NamedSharding(_mesh(4), P()))
        assert _registry.shards(raw, wait=True) < _registry.shards(held, wait=True)
        tl.mark()
        m = tj.memory()
        assert m.untracked_bytes == (0 if over == "tensor" else 4096), m
        assert m.num_bytes == (4096 if over == "tensor" else 0), m
        live = tl.live_at(time.perf_counter())
        assert sum(r.bytes for r in live) == (0 if over == "plain" else 4096), live
    del raw, held
    if over == "tensor":
        tj.dispose(base)
    _empty()


# -- the same under eight devices ---------------------------------------------------------------


@eight
@pytest.mark.parametrize("how", ["dispose", "scope exit"])
def test_a_replicated_copy_of_a_callers_shard_view_never_deletes_the_callers_array(
    how: str,
) -> None:
    """Alias model seed 109 under eight devices (shrunk): the caller's replicated ``r``, seen
    through ``tensors()`` and a Variable (then disposed: ``r`` is the caller's plain array
    again, out of the books), a raw view of its shard 0, ``tensors()`` of that view, and
    ``w.to(replicated)``: a copy sharing ``r``'s shard 0, with seven shards of its own. Once
    ``w``'s record was gone (its scope disposed it as an object), nothing but the copy's own
    record knew the shard was the caller's: disposing the copy, or the exit of the scope it
    was kept into, deleted it, and with it ``r`` (deleting one shard deletes every array over
    it). JAX cannot delete the copy's own shards alone: it is released, not deleted."""
    rep = NamedSharding(_mesh(8), P())
    r = jax.device_put(np.arange(8, dtype=np.float32), rep)  # the caller's
    with tj.tidy():
        v = tj.Variable(tj.tensors([r])[0])
    view = v.array.addressable_data(0)
    tj.dispose(v)
    if how == "dispose":
        with tj.tidy() as inner:
            w = tj.tensors([view])[0]
            c = w.to(rep)
            inner.keep(c)
        raw = c.array
        tj.dispose(c)
    else:
        with tj.tidy():
            with tj.tidy() as inner:
                w = tj.tensors([view])[0]
                c = w.to(rep)
                inner.keep(c)
            raw = c.array
    assert c.is_disposed and w.is_disposed
    assert not r.is_deleted() and not view.is_deleted()
    np.testing.assert_array_equal(np.asarray(r), np.arange(8))
    assert _registry.is_released(raw)  # not deleted: JAX frees its own shards with it
    assert not raw.is_deleted()
    del raw
    gc.collect()
    m = tj.memory(scan_untracked=False)
    assert (m.num_tensors, m.num_data_buffers) == (0, 0)


@eight
def test_a_copy_of_a_callers_shard_made_while_its_variable_lives_leaves_no_heir() -> None:
    """Alias model seed 109 under eight devices, a second form: the copy of a shard view of the
    caller's ``r`` is made, and freed by its scope, while a Variable still holds ``r``. Freeing
    the copy handed it on to every record of its group as to heirs of a buffer of tidyjax's,
    ``r``'s record among them (over more than the one shard the copy shares, so it was taken
    for the copy's own buffer): disposing the Variable then deleted ``r``. A record over none
    of the copy's own shards inherits nothing (`_over_own`)."""
    rep = NamedSharding(_mesh(8), P())
    r = jax.device_put(np.arange(8, dtype=np.float32), rep)  # the caller's
    with tj.tidy():
        v = tj.Variable(tj.tensors([r])[0])
    view = v.array.addressable_data(0)
    with tj.tidy():
        w = tj.tensors([view])[0]
        c = w.to(rep)
    assert c.is_disposed and not r.is_deleted()
    tj.dispose(v)
    assert not r.is_deleted() and not view.is_deleted()
    np.testing.assert_array_equal(np.asarray(r), np.arange(8))
    gc.collect()
    m = tj.memory(scan_untracked=False)
    assert (m.num_tensors, m.num_data_buffers) == (0, 0)


@eight
def test_a_callers_view_of_the_shard_a_copy_shares_is_not_the_copys() -> None:
    """Alias model seed 109 under eight devices, a third form: beside the copy of the caller's
    shard (``tensors([view]).to(replicated)``, made while a Variable holds ``r``), a second
    ``tensors()`` view of that same shard of ``r`` was taken for a view of the copy's buffer
    (a scope's: the scope's, and owned), so its free at the scope's exit made ``r``'s record
    an heir, and disposing the Variable deleted ``r``. A view over none of the copy's own
    shards stays the caller's."""
    rep = NamedSharding(_mesh(8), P())
    r = jax.device_put(np.arange(8, dtype=np.float32), rep)  # the caller's
    with tj.tidy():
        v = tj.Variable(tj.tensors([r])[0])
    a, b = jax.device_put(r, DEVS[0]), jax.device_put(r, DEVS[0])  # r's shard 0, twice
    with tj.tidy():
        c = tj.tensors([a])[0].to(rep)
        u = tj.tensors([b])[0]
        assert tj.memory().num_tensors == 3  # v, c, u
    assert c.is_disposed and u.is_disposed and not r.is_deleted()
    tj.dispose(v)
    assert not r.is_deleted() and not a.is_deleted() and not b.is_deleted()
    np.testing.assert_array_equal(np.asarray(r), np.arange(8))
    gc.collect()
    m = tj.memory(scan_untracked=False)
    assert (m.num_tensors, m.num_data_buffers) == (0, 0)


@pytest.mark.skipif(len(DEVS) >= 8 or UNDER_EIGHT, reason="runs itself")
def test_under_eight_devices() -> None:
    out = run_under_eight_devices(__file__, "-x")
    assert "failed" not in out and ", 1 skipped" in out  # only this test
