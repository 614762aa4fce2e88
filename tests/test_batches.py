"""A jitted call's new buffers made in a scope form one batch (one record for the call): every
ownership rule still holds leaf by leaf, whether the leaves share one fate (the batch acts as
one) or not (a leaf is split out into a record of its own)."""

from __future__ import annotations

import gc
import threading
import weakref

import jax
import numpy as np
import pytest

import tidyjax as tj
from tidyjax import DisposedError, tidy
from tidyjax._registry import Batch

THREE = tj.jit(lambda a: (a + 1.0, a * 2.0, -a))


def counts() -> tuple[int, int, int]:
    m = tj.memory(scan_untracked=False)
    return m.num_tensors, m.num_data_buffers, m.num_bytes


@pytest.fixture
def x():
    t = tj.tensor(np.array([1.0, 2.0], np.float32))
    yield t
    t.dispose()
    gc.collect()
    assert counts() == (0, 0, 0)


def test_outputs_made_in_a_scope_share_one_batch(x):
    with tidy():
        outs = THREE(x)
        assert {id(t._r) for t in outs} == {id(outs[0]._r)}
        assert type(outs[0]._r) is Batch
    # outside every scope each output has a record of its own, as before
    free = THREE(x)
    assert all(type(t._r) is not Batch for t in free)
    tj.dispose(free)


def test_a_batch_nothing_returns_is_deleted_at_exit(x):
    with tidy() as scope:
        outs = THREE(x)
        arrays = [t.array for t in outs]
    assert all(a.is_deleted() for a in arrays)
    assert all(t.is_disposed for t in outs)
    with pytest.raises(DisposedError, match="freed when scope"):
        outs[1] + 1
    assert scope.num_created == 3 and scope.num_freed == 3 and scope.num_handed_out == 0
    assert counts() == (1, 1, 8)


def test_a_batch_returned_whole_moves_as_one_and_is_freed_by_the_parent(x):
    with tidy() as outer:
        with tidy() as inner:
            outs = inner.keep(THREE(x))
        assert inner.num_handed_out == 3 and inner.num_freed == 0
        assert not any(t.is_disposed for t in outs)
        assert outs[0]._r.scope is outer
        np.testing.assert_array_equal(outs[2].numpy(), [-1.0, -2.0])
        arrays = [t.array for t in outs]
    assert outer.num_freed == 3
    assert all(a.is_deleted() for a in arrays) and all(t.is_disposed for t in outs)


def test_a_batch_returned_in_part_keeps_only_what_is_returned(x):
    @tidy
    def step(t):
        _a, b, _c = THREE(t)
        return {"b": b}

    with tidy() as outer:
        got = step(x)["b"]
        # a and c went with the function's frame (their batch let go of them), so b was all
        # the batch still held: the batch moved to the caller's scope as one
        np.testing.assert_array_equal(got.numpy(), [2.0, 4.0])
        assert counts() == (2, 2, 16)
        assert got._r.scope is outer
    assert got.is_disposed

    with tidy():
        a, _b, _c = THREE(x)
        with tidy() as inner:
            d, e, f = THREE(x)
            inner.keep(e)
        # its fate differed from d's and f's: it left their batch (for one of its own, which
        # moved to the outer scope whole)
        assert e._r is not d._r and e._r.scope is not inner and e._r.dead is None
        assert d.is_disposed and f.is_disposed and not e.is_disposed
        assert counts() == (5, 5, 40)
    assert e.is_disposed and a.is_disposed


def test_partial_hand_out_disposes_the_other_tensor_objects(x):
    with tidy():
        outs = THREE(x)
        kept = tj.keep(outs[0])
    assert not kept.is_disposed
    assert outs[1].is_disposed and outs[2].is_disposed
    assert counts() == (2, 2, 16)
    kept.dispose()


def test_keep_of_a_whole_batch_keeps_it_as_one(x):
    with tidy():
        outs = tj.keep(THREE(x))
        assert outs[0]._r.scope is tj._registry.KEPT
    assert not any(t.is_disposed for t in outs)
    assert counts() == (4, 4, 32)
    tj.dispose(outs)
    assert counts() == (1, 1, 8)


def test_disposing_one_leaf_deletes_only_its_buffer(x):
    with tidy():
        outs = THREE(x)
        arrays = [t.array for t in outs]
        outs[1].dispose()
        assert arrays[1].is_deleted() and not arrays[0].is_deleted()
        assert counts() == (3, 3, 24)
        outs[1].dispose()  # idempotent
    assert all(a.is_deleted() for a in arrays)


def test_an_unreferenced_leaf_is_freed_before_the_exit(x):
    with tidy() as scope:
        outs = list(THREE(x))
        ref = weakref.ref(outs[2].array)
        del outs[2]  # no reference cycle: freed at once, no gc.collect
        assert ref() is None
        assert counts() == (3, 3, 24)
    assert scope.num_collected == 1 and scope.num_freed == 2


def test_an_escaped_array_of_a_collected_leaf_is_counted_and_freed_at_exit(x):
    with tidy():
        outs = list(THREE(x))
        raw = outs[0].array
        del outs[0]
        assert counts() == (3, 4, 32)  # no Tensor holds it, tidyjax still counts it
    assert raw.is_deleted()
    assert counts() == (1, 1, 8)


def test_a_second_tensor_over_a_leaf_splits_it_and_the_first_is_disposed(x):
    # clone() gives a second Tensor over the same buffer; returning only the clone keeps the
    # buffer and disposes the first Tensor object (TensorFlow.js's rule).
    with tidy() as scope:
        outs = THREE(x)
        twin = scope.keep(outs[0].clone())
        assert counts() == (5, 4, 32)
    assert not twin.is_disposed and outs[0].is_disposed
    assert not twin.array.is_deleted()
    assert counts() == (2, 2, 16)
    twin.dispose()
    assert counts() == (1, 1, 8)


def test_a_report_in_the_middle_changes_nothing(x):
    with tidy() as scope:
        outs = THREE(x)
        assert counts() == (4, 4, 32)
        info = tj.memory()  # with the untracked scan: every live array looked up
        assert (info.num_tensors, info.untracked_arrays) == (4, 0)
        batch = outs[0]._r
        assert type(batch) is Batch and len(batch.held()) == 3  # counted in place: none split
        scope.keep(outs[0], outs[1])
    assert not outs[0].is_disposed and not outs[1].is_disposed and outs[2].is_disposed
    assert counts() == (3, 3, 24)
    tj.dispose(outs)
    assert counts() == (1, 1, 8)


def test_a_profile_started_over_live_batches_counts_them():
    t = tj.tensor(np.ones(4, np.float32))
    with tidy():
        outs = tj.keep(THREE(t))
        with tj.profile() as info:
            tj.dispose(outs[0])
        assert info.new_bytes == -16 and info.new_tensors == -1
    tj.dispose([outs, t])
    assert counts() == (0, 0, 0)


def test_a_variable_made_from_a_leaf_survives_and_the_leaf_object_goes(x):
    with tidy():
        outs = THREE(x)
        v = tj.Variable(outs[0])
    assert not v.is_disposed and outs[0].is_disposed and outs[2].is_disposed
    np.testing.assert_array_equal(v.numpy(), [2.0, 3.0])
    assert counts() == (2, 2, 16)
    v.dispose()


def test_a_leaf_object_disposed_at_exit_lets_go_of_a_buffer_a_variable_held(x):
    # The Variable splits the leaf out without its Tensor at hand (stale). The Variable goes
    # (collected, not disposed) and the exit disposes the leaf's Tensor (TensorFlow.js): the
    # Tensor object must drop its array, as a Tensor on a record of its own does; it kept the
    # buffer alive before, counted with no Tensor on it (TestBatchModel's failure).
    with tidy():
        outs = THREE(x)
        v = tj.Variable(outs[0])
        del v
        gc.collect()
    assert outs[0].is_disposed
    gc.collect()
    assert counts() == (1, 1, 8)


def test_a_leaf_object_disposed_at_exit_lets_go_of_its_kept_raw_array(x):
    # A report splits every leaf out (stale); the leaf's raw array is kept, its Tensor not:
    # the exit disposes the Tensor object, which lets go of the array once the caller does.
    with tidy() as scope:
        outs = THREE(x)
        assert counts() == (4, 4, 32)
        raw = scope.keep(outs[0].array)
    assert outs[0].is_disposed and not raw.is_deleted()
    assert counts() == (1, 2, 16)  # the raw array is still tidyjax's
    del raw
    gc.collect()
    assert counts() == (1, 1, 8)


def test_donated_leaves_are_disposed_with_the_call_named(x):
    double = tj.jit(lambda a, b: (a * 2, b * 2), donate_argnums=(0, 1))
    with tidy() as scope:
        a, b, c = THREE(x)
        new = scope.keep(double(a, b))
        assert a.is_disposed and b.is_disposed  # the CPU backend donates these buffers
        with pytest.raises(DisposedError, match="donated"):
            a + 1
        assert not c.is_disposed
    np.testing.assert_array_equal(new[0].numpy(), [4.0, 6.0])
    tj.dispose(new)


def test_threads_each_with_their_own_batches(x):
    errors = []

    def work():
        try:
            for _ in range(50):
                with tidy() as scope:
                    outs = THREE(x)
                    kept = scope.keep(outs[1])
                kept.dispose()
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors
    assert counts() == (1, 1, 8)


def test_a_training_loop_in_one_scope_stays_flat(x):
    step = tj.jit(lambda p: jax.tree.map(lambda w: w * 0.5 + 1.0, p))
    params = {"w": tj.tensor(np.ones(8, np.float32)), "b": tj.tensor(np.zeros(2, np.float32))}
    with tidy():
        for i in range(20):
            params = step(params)  # the last step's Tensors go: their batch lets go of them
            if i == 5:
                early = counts()
        assert counts() == early
        params = tj.keep(params)
    assert counts() == (3, 3, 48)
    tj.dispose(params)


def test_most_of_a_batch_kept_moves_as_one_batch_and_the_rest_is_freed(x):
    # A training step keeps the new state and lets the loss go: the kept leaves move to the
    # enclosing scope together (one batch), the other one is deleted with its Tensor disposed.
    with tidy() as outer:
        with tidy() as inner:
            a, b, c = THREE(x)
            inner.keep(a, c)
            raw_b = b.array
        assert b.is_disposed and raw_b.is_deleted()
        assert not a.is_disposed and not c.is_disposed
        assert a._r is c._r and a._r.scope is outer
        assert inner.num_handed_out == 2 and inner.num_freed == 1 and inner.num_created == 3
        assert counts() == (3, 3, 24)
        a.dispose()  # one leaf of the moved batch alone: the other lives on
        assert a.is_disposed and not c.is_disposed and counts() == (2, 2, 16)
        raw_c = c.array
        del c
        gc.collect()  # its Tensor collected: the raw array still refers to the buffer
        assert not raw_c.is_deleted()
    assert raw_c.is_deleted()  # the outer scope owned it
    assert counts() == (1, 1, 8)
