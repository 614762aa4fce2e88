"""Tensors as pytree nodes: what tree maps hand back, Variables as one node type with Tensors,
copies, mixed operands, the helpers, and the JAX internals tidyjax relies on (each guarded)."""

from __future__ import annotations

import copy
import importlib
import pickle

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tidyjax as tj
from tidyjax import DisposedError, Tensor, Variable, tidy
from tidyjax._arrays import CONCRETE, JAX_KEY_CHECKS, JAX_OPERATORS
from tidyjax._jaxdoors import BIND_CONVERSION

from .conftest import counts

# -- what a tree map hands back ----------------------------------------------------------------


def test_tree_maps_returning_data_give_plain_values():
    params = {"w": tj.tensor(np.ones((3, 2), np.float32)), "b": tj.tensor([0.5, 0.5])}
    assert jax.tree.map(lambda a: a.shape, params) == {"w": (3, 2), "b": (2,)}
    assert jax.tree.map(lambda a: a.size, params) == {"w": 6, "b": 2}
    host = jax.device_get(params)
    assert type(host["w"]) is np.ndarray and host["b"].tolist() == [0.5, 0.5]
    shapes = jax.eval_shape(lambda p: p, params)
    assert shapes["w"].shape == (3, 2) and shapes["w"].dtype == jnp.float32
    tj.dispose(params)


def test_masks_and_none_keep_the_tensor_node_so_trees_zip():
    params = {"w": tj.tensor([1.0, 2.0]), "b": tj.tensor([3.0])}
    mask = jax.tree.map(lambda a: a.ndim > 0 and a.shape[0] > 1, params)  # bools: masks
    kept = jax.tree.map(lambda m, p: p if m else None, mask, params)
    assert isinstance(mask["w"], Tensor) and bool(mask["w"]) and not bool(mask["b"])
    # None survives as an untracked node: the partitioned tree merges back with the original.
    merged = jax.tree.map(
        lambda a, b: b if a is None else a, kept, params, is_leaf=lambda x: x is None
    )
    np.testing.assert_array_equal(merged["b"].numpy(), [3.0])
    assert counts()[1] == 2  # no new buffer, and no shell is ever counted
    tj.dispose(params)
    del merged, kept


def test_tree_map_of_new_arrays_gives_tracked_tensors_in_the_current_scope():
    params = {"w": tj.tensor([1.0, 2.0])}
    with tidy():
        doubled = jax.tree.map(lambda a: a * 2, params)
        assert isinstance(doubled["w"], Tensor) and counts()[:2] == (2, 2)
    assert doubled["w"].is_disposed and not params["w"].is_disposed
    tj.dispose(params)


# -- Variables and Tensors: one node type --------------------------------------------------------


def test_variables_map_together_with_their_gradients():
    variables = {"w": Variable(tj.tensor([1.0, 2.0]), name="w"), "b": Variable(tj.tensor(0.5))}
    with tidy():
        grads = tj.grad(lambda p: (p["w"] ** 2).sum() + p["b"])(variables)
        assert jax.tree.structure(grads) == jax.tree.structure(variables)
        stepped = jax.tree.map(lambda v, g: v - 0.5 * g, variables, grads)
        np.testing.assert_array_equal(stepped["w"].numpy(), [0.0, 0.0])
        jax.tree.map(lambda v, s: v.assign(s), variables, stepped, is_leaf=tj.is_tensor)
    np.testing.assert_array_equal(variables["w"].numpy(), [0.0, 0.0])
    assert not variables["w"].is_disposed and stepped["w"].is_disposed
    tj.dispose(variables)


def test_a_variable_is_a_tensor_with_a_flag():
    v = Variable(tj.tensor([1.0]), name="w", trainable=False)
    t = tj.tensor([2.0])
    assert isinstance(v, Variable) and isinstance(v, Tensor) and not isinstance(t, Variable)
    assert (v.name, v.trainable, t.name, t.trainable) == ("w", False, None, False)
    assert repr(v).startswith("Variable(name='w'")
    v.trainable = True
    assert v.trainable
    with pytest.raises(tj.TidyjaxTypeError, match=r"not a Variable.*tidyjax\.Variable"):
        t.assign(tj.tensor([3.0]))
    with pytest.raises(tj.TidyjaxTypeError, match="not a Variable"):
        t.name = "x"
    with pytest.raises(tj.TidyjaxTypeError, match="must be a str"):
        v.name = 3  # type: ignore[assignment]
    v.dispose()
    with pytest.raises(DisposedError, match="Variable 'w'"):
        v + 1
    t.dispose()


def test_pickle_and_deepcopy_keep_a_variables_kind_name_and_flag():
    v = Variable(tj.tensor([1.0, 2.0]), name="w", trainable=False)
    state = {"v": v, "t": tj.tensor([3.0])}
    with tidy():
        back = pickle.loads(pickle.dumps(state))  # unpickled inside a scope
        deep = copy.deepcopy(state)
        shallow = copy.copy(v)
    for restored in (back, deep):
        assert isinstance(restored["v"], Variable) and restored["v"].name == "w"
        assert restored["v"].trainable is False
        assert not restored["v"].is_disposed  # a Variable: no scope frees it
        np.testing.assert_array_equal(restored["v"].numpy(), [1.0, 2.0])
        assert restored["t"].is_disposed and not isinstance(restored["t"], Variable)
    assert isinstance(shallow, Variable) and shallow.array is v.array  # shares the buffer
    tj.dispose([state, back["v"], deep["v"], shallow])


# -- mixed operands ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "op",
    [
        lambda a, b: a * b,
        lambda a, b: a + b,
        lambda a, b: a - b,
        lambda a, b: a / b,
        lambda a, b: a**b,
        lambda a, b: a < b,
        lambda a, b: a == b,
        lambda a, b: a @ b,
    ],
)
def test_raw_array_and_tensor_in_either_order_give_a_tracked_tensor(op):
    raw = jnp.array([1.0, 2.0])
    with tidy():
        t = tj.tensor([3.0, 4.0])
        left, right = op(raw, t), op(t, raw)
        assert isinstance(left, Tensor) and isinstance(right, Tensor)
        np.testing.assert_array_equal(left.numpy(), np.asarray(op(raw, t.array)))
        np.testing.assert_array_equal(right.numpy(), np.asarray(op(t.array, raw)))
        assert counts()[0] == 3
    assert left.is_disposed and not raw.is_deleted()


def test_jax_binary_operators_are_found():
    """Private to JAX: the operator code objects ``raw * t`` relies on (fails when they move)."""
    assert len(JAX_OPERATORS) >= 1
    assert jnp.ones(2).__mul__.__func__.__code__ in JAX_OPERATORS or any(
        c.co_name == "deferring_binary_op" for c in JAX_OPERATORS
    )


# -- raw JAX on Tensors: errors that name the fix ------------------------------------------------


@pytest.mark.skipif(BIND_CONVERSION, reason="this JAX converts Tensors at every bind")
def test_raw_lax_on_a_tensor_names_the_tidyjax_form_where_jax_refuses_it():
    t = tj.tensor([0.0, 1.0])
    with pytest.raises(tj.TidyjaxValueError, match=r"jax\.lax\.exp got a tidyjax Tensor"):
        jax.lax.exp(t)
    with pytest.raises(tj.TidyjaxValueError, match=r"Call tidyjax\.lax\.add instead"):
        jax.lax.add(t, t)
    t.dispose()


@pytest.mark.skipif(not BIND_CONVERSION, reason="JAX before 0.10.2 has no bind hook")
def test_raw_lax_takes_a_tensor_and_gives_jax_values():
    """Private to JAX: the bind-time conversion (fails loudly when it moves)."""
    t = tj.tensor([0.0, 1.0])
    out = jax.lax.exp(t)
    assert type(out) in CONCRETE  # JAX's own value, as jnp.exp(t) gives
    np.testing.assert_allclose(np.asarray(out), np.exp([0.0, 1.0]), rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(jax.lax.add(t, t)), [0.0, 2.0])
    t.dispose()
    with pytest.raises(tj.DisposedError):
        jax.lax.exp(t)


def test_raw_random_on_a_key_tensor_names_the_tidyjax_form():
    t = tj.tensor([0.0, 1.0])
    key = tj.random.key(0)  # a typed key Tensor: JAX checks it as raw key data
    with pytest.raises(tj.TidyjaxValueError, match=r"Call tidyjax\.random\.normal instead"):
        jax.random.normal(key, (2,))
    assert JAX_KEY_CHECKS, "JAX's PRNG key-data check moved: update _jaxdoors._jax_key_check_codes"
    assert tj.random.normal(key, (2,)).shape == (2,)
    key.dispose()
    np.testing.assert_allclose(tj.lax.exp(t).numpy(), np.exp([0.0, 1.0]), rtol=1e-6)
    t.dispose()


def test_jax_type_tables_hold_the_tensor_entry():
    """Private to JAX: the tables tidyjax registers Tensor in (fails loudly when they move)."""
    core = importlib.import_module("jax._src.core")
    assert Tensor in core.pytype_aval_mappings


def test_raw_jax_grad_and_while_loop_over_tensors():
    x = tj.tensor([1.0, 2.0, 3.0])
    g = jax.grad(lambda t: (t * t).sum())(x)
    np.testing.assert_array_equal(g.numpy(), [2.0, 4.0, 6.0])
    np.testing.assert_array_equal(np.asarray(jax.jit(jax.grad(lambda t: (t * t).sum()))(x)), g)
    limit = tj.tensor(100.0)
    out = jax.lax.while_loop(lambda c: (c * c).sum() < limit, lambda c: c * 2, x.array)
    np.testing.assert_array_equal(np.asarray(out), [4.0, 8.0, 12.0])
    with tidy():
        tracked = tj.lax.while_loop(lambda c: (c * c).sum() < limit, lambda c: c * 2, x)
        assert isinstance(tracked, Tensor)
    tj.dispose([x, g, limit])


# -- helpers and small things ----------------------------------------------------------------


def test_arrays_and_tensors_convert_a_tree_both_ways():
    state = {"w": tj.tensor([1.0]), "n": 3, "nested": [tj.tensor([2.0])]}
    plain = tj.arrays(state)
    assert type(plain["w"]) in CONCRETE and plain["n"] == 3 and plain["w"] is state["w"].array
    assert tj.is_tensor(state["w"]) and not tj.is_tensor(plain["w"])
    raw = jnp.array([5.0])
    with tidy():
        again = tj.tensors({"w": raw, "t": state["w"]})
        assert isinstance(again["w"], Tensor) and again["t"] is state["w"]
    # the scope lets go of the Tensor; the array stays the caller's (adopt() hands one over)
    assert again["w"].is_disposed and not raw.is_deleted()
    np.testing.assert_array_equal(np.asarray(raw), [5.0])
    tj.dispose(state)


def test_namespaces_need_no_separate_import():
    import tidyjax

    for name in ("numpy", "lax", "nn", "random"):
        assert getattr(tidyjax, name).__name__ == f"tidyjax.{name}"
    key = tidyjax.random.key(0)
    assert isinstance(key, Tensor)
    key.dispose()


def test_dispose_leaves_a_plain_array_alone_and_refuses_one_a_tensor_holds():
    raw = jnp.ones(3)  # tidyjax never made it: it is the caller's (README: never deleted)
    tj.dispose({"a": raw})
    assert not raw.is_deleted()
    t = tj.tensor([1.0])
    with pytest.raises(tj.TidyjaxValueError, match="dispose those"):
        tj.dispose([t.array])
    assert not t.is_disposed and not t.array.is_deleted()  # nothing was disposed
    tj.dispose(t)


def test_a_buffer_deleted_underneath_raises_disposed_error_saying_so():
    t = tj.tensor([1.0, 2.0])
    t.array.delete()
    for use in (lambda: t + 1, lambda: t * t, lambda: t.sum(), lambda: tj.numpy.sin(t),
                lambda: t.numpy(), lambda: tj.jit(lambda a: a * 2)(t)):  # fmt: skip
        with pytest.raises(DisposedError, match="deleted outside tidyjax"):
            use()
    assert t.is_disposed and t.shape == (2,)


def test_a_tensor_node_flattens_to_its_array_and_names_it_in_key_paths():
    t = tj.tensor([1.0, 2.0])
    ((path, leaf),) = jax.tree_util.tree_flatten_with_path({"w": t})[0]
    assert jax.tree_util.keystr(path) == "['w'].array"
    assert leaf is t.array
    rebuilt = jax.tree_util.tree_unflatten(jax.tree_util.tree_structure({"w": t}), [leaf])
    assert rebuilt["w"] is not t and rebuilt["w"].array is t.array  # one buffer, two holders
    before = tj.memory().num_tensors
    t.dispose()
    assert not leaf.is_deleted()  # the rebuilt node still holds it
    with pytest.raises(DisposedError, match="disposed explicitly"):
        jax.tree_util.tree_leaves([t])
    rebuilt["w"].dispose()
    assert leaf.is_deleted() and tj.memory().num_tensors == before - 2


def test_tensor_without_data_names_the_fix():
    with pytest.raises(tj.TidyjaxTypeError, match=r"needs data: tidyjax.Tensor\(\[1.0"):
        Tensor()
    with pytest.raises(tj.TidyjaxTypeError, match=r"takes nothing else.*tidyjax.adopt"):
        Tensor([1.0], array=jnp.ones(1))
    with pytest.raises(tj.TidyjaxTypeError, match="takes nothing else"):
        Tensor(array=jnp.ones(1), dtype=jnp.float16)
