"""Several array objects over one buffer: a buffer reachable from anything returned or kept
survives, whichever array object reaches it (ARCHITECTURE.md, "Who owns a buffer").

A raw ``jax.device_put`` to where a buffer already is gives a *new* ``jax.Array`` object over the
same buffer; deleting either deletes both. Each case below makes such an alias of a scope's own
Tensor inside the scope, hands the alias out (returned, ``scope.keep``, ``tidyjax.keep``, a
Variable), and checks that the buffer survives the exit while the scope's own Tensor object is
disposed (TensorFlow.js's rule: a scope disposes the Tensor objects it made that do not leave).
"""

from __future__ import annotations

import gc
import weakref
from typing import Any

import jax
import numpy as np
import pytest

import tidyjax as tj

DEV = jax.devices()[0]
VALUES = [1.0, 2.0, 3.0]


def _alive(x: Any) -> bool:
    arr = x.array if isinstance(x, tj.Tensor) else x
    return not arr.is_deleted()


def test_scope_keep_of_a_device_put_alias_keeps_the_buffer() -> None:
    with tj.tidy() as s:
        t = tj.tensor(VALUES)
        a = s.keep(jax.device_put(t, DEV))
    assert isinstance(a, tj.Tensor) and _alive(a)
    assert t.is_disposed  # the scope's own object: disposed, its buffer lives on in `a`
    np.testing.assert_array_equal(a.numpy(), VALUES)
    assert tj.memory().num_bytes == 12
    a.dispose()
    assert tj.memory().num_bytes == 0


def test_global_keep_of_a_device_put_alias_keeps_the_buffer() -> None:
    with tj.tidy():
        t = tj.tensor(VALUES)
        a = tj.keep(jax.device_put(t, DEV))
    assert _alive(a) and t.is_disposed
    np.testing.assert_array_equal(a.numpy(), VALUES)
    tj.dispose(a)
    assert a.is_disposed and tj.memory().num_tensors == 0


def test_returning_a_device_put_alias_keeps_the_buffer() -> None:
    made: list[tj.Tensor] = []

    def f() -> Any:
        t = tj.tensor(VALUES)
        made.append(t)  # still referenced when the scope exits
        return jax.device_put(t, DEV)

    a = tj.tidy.run(f)
    assert _alive(a) and made[0].is_disposed
    np.testing.assert_array_equal(a.numpy(), VALUES)
    a.dispose()
    assert tj.memory().num_bytes == 0


def test_a_variable_from_a_device_put_alias_keeps_the_buffer() -> None:
    with tj.tidy():
        t = tj.tensor(VALUES)
        v = tj.Variable(jax.device_put(t, DEV))
    assert not v.is_disposed
    np.testing.assert_array_equal(v.numpy(), VALUES)
    v.dispose()
    assert tj.memory().num_bytes == 0


@pytest.mark.parametrize(
    "make",
    [
        lambda t: tj.tensors(jax.device_put(t.array, DEV)),
        lambda t: jax.tree.map(lambda x: jax.device_put(x, DEV), {"w": t})["w"],
        lambda t: jax.device_put(t, t.array.sharding),
    ],
    ids=["tensors(device_put(t.array))", "tree.map(device_put)", "device_put(t, t.sharding)"],
)
def test_other_forms_of_the_alias_keep_the_buffer(make: Any) -> None:
    with tj.tidy() as s:
        t = tj.tensor(VALUES)
        a = s.keep(make(t))
    assert _alive(a) and t.is_disposed
    np.testing.assert_array_equal(np.asarray(a.array), VALUES)
    tj.dispose(a)


def test_raw_alias_of_params_kept_by_a_scope_survives() -> None:
    # The raw form: the scope's result holds plain arrays over the params' buffers.
    with tj.tidy() as s:
        params = {"w": tj.tensor([1.0, 2.0]), "b": tj.tensor([3.0])}
        out = s.keep(jax.device_put(tj.arrays(params), DEV))
    assert all(_alive(v) for v in out.values())
    np.testing.assert_array_equal(np.asarray(out["w"]), [1.0, 2.0])
    # The buffers are tidyjax's (the scope made them), counted once each, never twice.
    assert tj.memory().num_bytes == 12
    tj.dispose(out)
    assert all(v.is_deleted() for v in out.values())
    assert tj.memory().num_bytes == 0


def test_raw_alias_returned_from_a_scope_survives() -> None:
    held: list[tj.Tensor] = []

    def f() -> Any:
        t = tj.tensor(VALUES)
        held.append(t)
        return jax.device_put(t.array, DEV)  # a plain array over t's buffer

    a = tj.tidy.run(f)
    assert _alive(a) and held[0].is_disposed
    np.testing.assert_array_equal(np.asarray(a), VALUES)
    tj.dispose(a)
    assert a.is_deleted()


def test_an_alias_not_handed_out_goes_with_its_scope() -> None:
    # The rule's other half: the scope frees what it made when nothing returned reaches it.
    with tj.tidy():
        t = tj.tensor(VALUES)
        a = jax.device_put(t, DEV)
    assert t.is_disposed and a.is_disposed
    assert tj.memory().num_bytes == 0


def test_disposing_one_alias_keeps_the_other() -> None:
    t = tj.tensor(VALUES)
    a = jax.device_put(t, DEV)
    t.dispose()
    assert _alive(a)
    np.testing.assert_array_equal(a.numpy(), VALUES)
    a.dispose()
    assert tj.memory().num_bytes == 0


@pytest.mark.parametrize("result", ["one array", "in a tuple"])
def test_a_lifted_function_returning_an_alias_of_its_argument_leaves_the_argument(result) -> None:
    """``tidyjax.lift`` of the user's own function that ``device_put``s its argument to where it
    already is: the result is a second object over the argument's buffer, so the scope that made
    it must not delete that buffer at exit (the outer Tensor still holds it)."""
    a = tj.tensor(jax.device_put(np.arange(4.0, dtype=np.float32), DEV))  # committed
    if result == "one array":
        same = tj.lift(lambda x: jax.device_put(x, DEV))
    else:
        same = tj.lift(lambda x: (jax.device_put(x, DEV),))
    with tj.tidy():
        b = same(a)
        b = b if result == "one array" else b[0]
        assert b.array is not a.array  # a second array object over one buffer
    assert not a.is_disposed and _alive(a)
    np.testing.assert_array_equal(a.numpy(), [0.0, 1.0, 2.0, 3.0])
    info = tj.memory()
    assert (info.num_tensors, info.num_bytes) == (1, 16)
    a.dispose()
    assert tj.memory().num_bytes == 0


def test_a_lifted_function_returning_an_alias_of_a_raw_argument_leaves_the_callers_array() -> None:
    """The caller's own raw array through the user's lifted function that ``device_put``s it to
    where it already is: the result is a second object over the caller's buffer, which stays
    the caller's (never deleted); a new result of the same shape from a raw argument is still
    the scope's, deleted at its exit."""
    raw = jax.device_put(np.arange(3.0, dtype=np.float32), DEV)  # committed, no record
    same = tj.lift(lambda a: (jax.device_put(a, DEV),))
    doubled = tj.lift(lambda a: (a * 2,))
    with tj.tidy():
        (alias,) = same(raw)
        (fresh,) = doubled(raw)
        fresh_array = fresh.array
        assert alias.array is not raw
    assert not raw.is_deleted()
    np.testing.assert_array_equal(np.asarray(raw), [0.0, 1.0, 2.0])
    assert fresh_array.is_deleted()  # made in the scope: freed with it
    assert tj.memory().num_tensors == 0


_THREE = tj.jit(lambda a: (a + 1.0, a * 2.0, -a))


@pytest.mark.parametrize("in_scope", [False, True])
@pytest.mark.parametrize("origin", ["tensor", "jitted"])
def test_an_alias_outliving_its_collected_original_is_deleted_with_its_last_tensor(
    in_scope: bool, origin: str
) -> None:
    # Found by the model test: the original Tensor is garbage-collected (not disposed) while a
    # raw device_put alias, wrapped by tensors(), still holds the buffer. The buffer stays
    # tidyjax's: disposing the alias deletes it.
    import weakref

    dev = jax.devices()[0]
    scope = tj.tidy()
    if in_scope:
        scope.__enter__()
    a = tj.tensor(np.arange(3.0, dtype=np.float32))
    t = a if origin == "tensor" else _THREE(a)[2]
    alias = tj.tensors(jax.device_put(tj.arrays([t]), dev))[0]
    ref = weakref.ref(alias.array)
    del t
    gc.collect()
    np.testing.assert_array_equal(alias.numpy(), np.arange(3.0) * (1 if origin == "tensor" else -1))
    alias.dispose()
    kept = ref()
    assert kept is None or kept.is_deleted()
    del kept
    if in_scope:
        scope.__exit__(None, None, None)
    a.dispose()
    assert tj.memory().num_tensors == 0


def test_collected_originals_are_not_held_without_bound_while_suspects_wait() -> None:
    # A loop wrapping raw arrays by tensors() (suspects, resolved at the next deletion) while
    # tidyjax-made Tensors of the same kind are collected: their arrays are held only until a
    # bounded number wait, then resolved and let go.
    base = len(jax.live_arrays())
    x = tj.tensor(np.zeros(4, np.float32))
    for _ in range(200):
        y = tj.tensors(jax.device_put(jax.numpy.ones(4), jax.devices()[0]))
        z = x + y  # owned; the previous z is collected
    assert len(jax.live_arrays()) - base < 40
    tj.dispose([x, y, z])


def test_an_alias_no_tensor_holds_when_its_original_is_collected_is_the_callers_array() -> None:
    # The original is collected, then the alias's own Tensor too, before any alias check: the
    # buffer lives on only in the caller's raw array, a plain array again (counted by no report
    # as tidyjax's, never deleted by tidyjax).
    t = tj.tensor(np.arange(3.0, dtype=np.float32))
    raw = jax.device_put(tj.arrays([t])[0], jax.devices()[0])
    alias = tj.tensors(raw)
    del t, alias
    gc.collect()
    info = tj.memory(scan_untracked=False)
    assert (info.num_tensors, info.num_data_buffers, info.num_bytes) == (0, 0, 0)
    with tj.tidy():
        tj.tensor(np.ones(3, np.float32))  # a deletion: the alias check has run
    assert not raw.is_deleted()
    np.testing.assert_array_equal(np.asarray(raw), [0.0, 1.0, 2.0])


def test_an_alias_inheriting_a_collected_originals_buffer_inherits_its_scope() -> None:
    # The original, owned by a scope, is collected while a tensors() alias holds the buffer:
    # the alias takes its place, so the scope's exit deletes the buffer as it would have with
    # the original alive (and no report counts a tidyjax buffer that no Tensor holds).
    with tj.tidy():
        t = tj.tensor(np.arange(3.0, dtype=np.float32))
        raw = jax.device_put(tj.arrays([t])[0], jax.devices()[0])
        alias = tj.tensors(raw)
        del t
        gc.collect()
        assert tj.memory(scan_untracked=False).num_data_buffers == 1
    assert alias.is_disposed
    assert raw.is_deleted()
    info = tj.memory(scan_untracked=False)
    assert (info.num_tensors, info.num_data_buffers) == (0, 0)


def test_a_scopes_own_alias_of_a_collected_original_stays_the_scopes() -> None:
    # A lifted call's alias is a Tensor the scope made: when the original (made outside) is
    # collected, the alias keeps its own owner, so the scope's exit disposes it (TensorFlow.js)
    # and frees the buffer.
    put = tj.lift(lambda a: jax.device_put(a, jax.devices()[0]))
    t = tj.tensor(np.arange(3.0, dtype=np.float32))
    with tj.tidy():
        alias = put(t)
        del t
        gc.collect()
        assert tj.memory(scan_untracked=False).num_data_buffers == 1
    assert alias.is_disposed
    info = tj.memory(scan_untracked=False)
    assert (info.num_tensors, info.num_data_buffers) == (0, 0)


# -- an alias dropped at a scope's exit lets go of its array without a heap scan ---------------


@pytest.mark.parametrize("how", ["put", "tensors", "clone", "variable"])
def test_an_alias_of_an_outer_buffer_lets_go_of_its_array_at_the_exit_without_a_heap_scan(
    how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The scope's alias is dropped from the buffer's group at its exit (the buffer is the outer
    # Tensor's): its Tensors, the suspect's own and those made over it since, let go of the
    # array object, found without gc.get_referrers (10 ms a scope beside 5,000 live Tensors).
    x = tj.tensor(VALUES) * 1
    scans: list[int] = []
    referrers = gc.get_referrers
    monkeypatch.setattr(gc, "get_referrers", lambda *a: scans.append(len(a)) or referrers(*a))
    with tj.tidy():
        if how == "tensors":
            (a,) = tj.tensors([jax.device_put(x.array, DEV)])
        else:
            a = jax.device_put(x, DEV)
        more = a.clone() if how == "clone" else None
        var = tj.Variable(a) if how == "variable" else None
        ref = weakref.ref(a.array)
    assert scans == []
    assert a.is_disposed and _alive(x)
    if var is not None:  # the Variable holds the alias's buffer: it lives on, not dropped
        assert not var.is_disposed
        tj.dispose(var)
        del var
    del more
    gc.collect()
    assert ref() is None, "a disposed Tensor holds the alias's array object"
    np.testing.assert_array_equal(x.numpy(), np.array(VALUES) * 1)
    tj.dispose(x)
