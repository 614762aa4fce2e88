"""Variables: never scope-freed, shared buffers on creation, checked assign, in-place operators
that assign, and a buffer a Variable lets go returning to the scope that made it."""

from __future__ import annotations

import gc

import jax.numpy as jnp
import numpy as np
import pytest

import tidyjax as tj
from tidyjax import DisposedError, TidyjaxTypeError, TidyjaxValueError, Variable, tidy

from .conftest import counts


def test_variable_from_tensor_shares_its_buffer():
    t = tj.tensor([1.0, 2.0])
    v = Variable(t, name="v")
    assert counts() == (2, 1, 8)  # two tensors, one data buffer
    t.dispose()
    np.testing.assert_array_equal(v.numpy(), [1.0, 2.0])
    v.dispose()
    assert counts() == (0, 0, 0)


def test_variable_from_raw_array_copies():
    raw = jnp.ones(3)
    v = Variable(raw, trainable=False)
    assert v.array is not raw and not v.trainable and v.name is None
    v.dispose()
    assert not raw.is_deleted()


def test_variable_created_in_a_scope_is_never_freed_by_it():
    with tidy():
        v = Variable([1.0, 2.0])
        tj.keep
    assert not v.is_disposed
    v.dispose()


def test_assign_frees_the_old_buffer_unless_shared():
    v = Variable([1.0, 2.0])
    old = v.array
    with tidy():
        v.assign(v * 3)  # the new value is a scope temporary: the variable keeps its buffer
    assert old.is_deleted()
    np.testing.assert_array_equal(v.numpy(), [3.0, 6.0])
    assert counts() == (1, 1, 8)

    keep_me = v.clone()
    v.assign([5.0, 6.0])
    np.testing.assert_array_equal(keep_me.numpy(), [3.0, 6.0])  # shared: not freed
    np.testing.assert_array_equal(v.numpy(), [5.0, 6.0])
    tj.dispose([keep_me, v])


def test_assign_checks_shape_and_dtype_and_leaves_state_unchanged():
    v = Variable(jnp.zeros((2, 3)), name="w")
    before = counts()
    with pytest.raises(TidyjaxValueError, match=r"shape \(3, 2\).*\(2, 3\)"):
        v.assign(jnp.zeros((3, 2)))
    with pytest.raises(TidyjaxTypeError, match=r"int32.*float32"):
        v.assign(jnp.zeros((2, 3), jnp.int32))
    assert counts() == before
    np.testing.assert_array_equal(v.numpy(), np.zeros((2, 3)))
    assert "Variable(name='w'" in repr(v)
    v.dispose()


def test_variable_in_ops_returns_plain_tensors():
    v = Variable([1.0, 2.0])
    out = v * 2 + v
    assert type(out) is tj.Tensor
    np.testing.assert_array_equal(out.numpy(), [3.0, 6.0])
    tj.dispose([v, out])


def test_dispose_variables_disposes_all_and_marks_them():
    vs = [Variable([float(i)]) for i in range(3)]
    t = tj.tensor([9.0])
    assert tj.dispose_variables() == 3
    assert all(v.is_disposed for v in vs)  # TF.js leaves isDisposed false; we don't
    with pytest.raises(DisposedError, match="dispose_variables"):
        vs[0].numpy()
    assert not t.is_disposed
    assert tj.dispose_variables() == 0
    t.dispose()


def test_variable_name_must_be_a_string():
    with pytest.raises(TidyjaxTypeError, match="name"):
        Variable([1.0], name=3)


@pytest.mark.parametrize(
    "value",
    [lambda v: v, lambda v: v.clone(), lambda v: v.astype(v.dtype)],
    ids=["v", "v.clone()", "v.astype(v.dtype)"],
)
def test_assigning_a_variable_its_own_buffer_adds_no_record(value):
    v = Variable(tj.tensor([1.0, 2.0]), name="w")
    with tj.check_leaks():
        for _ in range(3):
            v.assign(value(v))
    assert counts() == (1, 1, 8)
    assert [r.id for r in tj.live_tensors()] == [v.id]
    np.testing.assert_array_equal(v.numpy(), [1.0, 2.0])
    v.dispose()
    assert counts() == (0, 0, 0)


def test_variable_of_a_typed_prng_key():
    import tidyjax.random as tjr

    k = Variable(tjr.key(0), name="rng")
    k2 = tjr.split(k)
    assert k2.shape == (2,)
    assert counts()[:2] == (2, 2)
    tj.dispose([k, k2])


# -- in-place operators, and buffers a Variable lets go -------------------------------------------


def test_in_place_operators_assign_a_variable_and_keep_it_a_variable():
    w = tj.Variable(tj.tensor([1.0, 2.0]), name="w")
    original = w
    with tj.tidy():
        g = tj.tensor([1.0, 1.0])
        w -= 0.5 * g
        w *= 2.0
    assert w is original and isinstance(w, tj.Variable) and w.name == "w"
    np.testing.assert_array_equal(w.numpy(), [1.0, 3.0])
    with pytest.raises(TidyjaxValueError, match="shape"):
        w += tj.tensor([[1.0, 2.0]])  # broadcasting would change its shape
    np.testing.assert_array_equal(w.numpy(), [1.0, 3.0])
    assert counts()[:2] == (1, 1)
    w.dispose()


@pytest.mark.parametrize("let_go", ["assign", "dispose", "collected"])
def test_a_buffer_a_variable_lets_go_is_its_creating_scopes_again(let_go):
    with tj.tidy():
        t = tj.tensor([1.0, 2.0])
        raw = t.array
        v = tj.Variable(t)
        if let_go == "assign":
            v.assign(tj.tensor([3.0, 4.0]))
        elif let_go == "dispose":
            v.dispose()
        else:  # the garbage collector takes the Variable: it protects nothing any more
            del v
            gc.collect()
    assert raw.is_deleted()  # the scope made it and nothing kept it
    assert counts()[:2] == ((1, 1) if let_go == "assign" else (0, 0))
    if let_go != "collected":
        v.dispose()


@pytest.mark.parametrize("let_go", ["assign", "dispose", "collected"])
@pytest.mark.parametrize("returned", [False, True])
def test_a_tensor_a_scope_kept_survives_when_its_variable_lets_go_of_the_buffer(let_go, returned):
    """Found by the alias model (seed 41): ``scope.keep(t)`` while a Variable made from ``t``
    held its buffer handed out nothing (the scope did not own the buffer then); the Variable let
    go, the buffer came home to the scope, and the exit deleted it under the kept Tensor. A
    returned ``t`` (the exit walks the result) was handed out."""
    variables = []

    def body(scope=None):
        t = tj.tensor([1.0, 2.0]) * 1
        v = tj.Variable(t)
        if scope is not None:
            scope.keep(t)
        if let_go == "assign":
            v.assign(tj.tensor([3.0, 4.0]))
        elif let_go == "dispose":
            v.dispose()
        else:
            del v
            gc.collect()
        variables.extend([v] if let_go != "collected" else [])
        return t

    if returned:
        t = tj.tidy.run(body)
    else:
        with tj.tidy() as scope:
            t = body(scope)
    assert not t.is_disposed and not t.array.is_deleted(), "a kept Tensor was freed"
    np.testing.assert_array_equal(t.numpy(), [1.0, 2.0])
    tj.dispose([t, variables])
    assert counts()[:2] == (0, 0)
