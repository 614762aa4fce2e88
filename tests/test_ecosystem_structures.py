"""Tree structures that hold Tensors: a Tensor never holds a Tensor, saved tree structures
(``jax.example_libraries.optimizers``) and partitions (``eqx.partition``/``combine``) rebuilt over
Tensors, and the note a structure error carries where no fix exists.

Each program is compared with the same program run by raw JAX on raw arrays.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.example_libraries import optimizers, stax

import tidyjax as tj
from tidyjax import Tensor, tidy
from tidyjax._lift import STRUCTURE_HINT

from .conftest import needs_bind_hook

optax = pytest.importorskip("optax")
eqx = pytest.importorskip("equinox")


def _close(got, want, rtol=1e-5):
    got_leaves, want_leaves = jax.tree.leaves(got), jax.tree.leaves(want)
    assert len(got_leaves) == len(want_leaves)
    for g, w in zip(got_leaves, want_leaves, strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=rtol, atol=1e-6)


def _no_tensor_in_a_tensor(tree):
    for t in jax.tree.leaves(tree, is_leaf=tj.is_tensor):
        if isinstance(t, Tensor):
            assert not isinstance(t._array, Tensor), "a Tensor holds a Tensor"


def _notes(e: BaseException) -> list[str]:
    return list(getattr(e, "__notes__", ()))


# -- 1. a Tensor never holds a Tensor -----------------------------------------------------------


@needs_bind_hook
def test_rebuilding_a_tensor_node_over_a_tensor_gives_that_tensor():
    params = tj.tensors({"w": jnp.ones(3), "b": jnp.zeros(2)})
    treedef = jax.tree.structure(params)  # Tensor nodes, each over one array leaf
    rebuilt = jax.tree.unflatten(treedef, [params["b"], params["w"]])
    assert rebuilt["w"] is params["w"] and rebuilt["b"] is params["b"]

    seen = []

    def rebuild(p):  # inside a raw jit: shells around tracers, rebuilt over themselves
        out = jax.tree.unflatten(treedef, jax.tree.leaves(p, is_leaf=tj.is_tensor))
        seen.append(out)
        _no_tensor_in_a_tensor(out)
        return out["w"] * 2

    out = jax.jit(rebuild)(params)
    assert seen[0]["w"]._array is not None and not isinstance(seen[0]["w"]._array, Tensor)
    np.testing.assert_array_equal(np.asarray(out), np.full(3, 2.0))
    seen.clear()
    tj.dispose(params)


def test_example_libraries_get_params_on_a_state_of_tensors_gives_tensors_not_nested_ones():
    params = tj.tensors({"w": jnp.ones((2, 3)), "b": jnp.zeros(3)})
    opt_init, _, get_params = optimizers.sgd(0.1)
    state = tj.tensors(opt_init(params))  # leaves Tensors, recorded structure with Tensor nodes
    got = get_params(state)
    assert isinstance(got["w"], Tensor)
    _no_tensor_in_a_tensor(got)
    np.testing.assert_array_equal(got["w"].numpy(), np.ones((2, 3)))
    assert (got["w"] + 1).shape == (2, 3)  # used as a Tensor: no "expected ArrayLike" far away
    tj.dispose((params, state, got))


# -- 2. jax.example_libraries.optimizers: the standard step -------------------------------------


def _stax_problem():
    init_fn, apply_fn = stax.serial(stax.Dense(8), stax.Relu, stax.Dense(2), stax.LogSoftmax)
    _, params = init_fn(jax.random.key(0), (-1, 4))
    x = jax.random.normal(jax.random.key(1), (16, 4))
    y = jax.nn.one_hot(jnp.arange(16) % 2, 2)

    def loss(p, batch):
        inputs, targets = batch
        return -(apply_fn(p, inputs) * targets).sum(-1).mean()

    return params, loss, (x, y)


@needs_bind_hook
@pytest.mark.parametrize("form", ["init_of_tensors", "tensors_of_init"])
@pytest.mark.parametrize("jit", [tj.jit, jax.jit], ids=["tidyjax.jit", "jax.jit"])
def test_example_libraries_optimizer_step_in_both_forms(form, jit):
    params, loss, batch = _stax_problem()
    opt_init, opt_update, get_params = optimizers.momentum(0.1, mass=0.9)

    def update(i, opt_state, batch):
        return opt_update(i, jax.grad(loss)(get_params(opt_state), batch), opt_state)

    # the last batch is smaller: a retrace, now on a state of Tensors
    batches = [batch, batch, jax.tree.map(lambda a: a[:8], batch)]
    raw_state = opt_init(params)
    for i, b in enumerate(batches):
        raw_state = jax.jit(update)(i, raw_state, b)
    want = loss(get_params(raw_state), batch)

    if form == "init_of_tensors":
        state = opt_init(tj.tensors(params))
    else:
        state = tj.tensors(opt_init(params))
    step = jit(update)
    for i, b in enumerate(batches):
        with tidy():
            state = tj.keep(step(i, state, b))
    got = get_params(state)
    leaves = jax.tree.leaves(got, is_leaf=tj.is_tensor)
    assert leaves and all(isinstance(leaf, Tensor) for leaf in leaves)
    _no_tensor_in_a_tensor(got)
    _close(got, get_params(raw_state))
    np.testing.assert_allclose(float(loss(got, batch)), float(want), rtol=1e-5)
    tj.dispose(got)  # first: under jax.jit the state holds raw arrays these Tensors share
    tj.dispose(state)


def test_tensors_of_an_optimizer_state_is_idempotent_and_finds_one_nested():
    params, _, _ = _stax_problem()
    opt_init, _, _ = optimizers.adam(1e-3)
    once = tj.tensors(opt_init(params))
    twice = tj.tensors(once)
    assert twice.tree_def == once.tree_def
    of_tensors = opt_init(tj.tensors(params))  # already Tensor nodes: left as they are
    assert tj.tensors(of_tensors).tree_def == of_tensors.tree_def == once.tree_def
    nested = tj.tensors({"opt": opt_init(params), "step": 0})
    assert nested["opt"].tree_def == once.tree_def and nested["step"] == 0
    tj.dispose((once, twice, nested))  # of_tensors holds the raw arrays: the caller's


# -- 3. eqx.partition / combine with Tensor params inside eqx.filter_jit ------------------------


def _eqx_run(params, static, x, y, steps=3):
    opt = optax.adam(1e-2)
    opt_state = opt.init(params)

    @eqx.filter_jit
    def step(params, opt_state, x, y):
        def loss_fn(params):
            model = eqx.combine(params, static)
            return ((jax.vmap(model)(x) - y) ** 2).mean()

        loss, grads = eqx.filter_value_and_grad(loss_fn)(params)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    losses = []
    for _ in range(steps):
        with tidy():
            params, opt_state, loss = tj.keep(step(params, opt_state, x, y))
        losses.append(float(loss))
    return params, opt_state, losses


@needs_bind_hook
def test_eqx_partition_then_tensors_then_combine_in_filter_jit_matches_raw():
    model = eqx.nn.MLP(4, 2, 8, 2, key=jax.random.key(0))
    x = jax.random.normal(jax.random.key(1), (16, 4))
    y = jnp.sin(x[:, :2])
    params, static = eqx.partition(model, eqx.is_array)
    raw_params, _, raw_losses = _eqx_run(params, static, x, y)

    t_params = tj.tensors(params)
    combined = eqx.combine(t_params, static)  # eagerly too
    assert isinstance(combined.layers[0].weight, Tensor)
    assert combined.layers[0].weight is t_params.layers[0].weight
    assert combined.activation is model.activation
    _close(jax.vmap(combined)(x), jax.vmap(model)(x))

    got, opt_state, losses = _eqx_run(t_params, static, x, y)
    np.testing.assert_allclose(losses, raw_losses, rtol=1e-5)
    assert all(isinstance(v, Tensor) for v in jax.tree.leaves(got, is_leaf=tj.is_tensor))
    _close(got, raw_params)
    # combine(static, params) and a partition of a model of Tensors still combine as before
    again = eqx.combine(static, t_params)
    assert again.layers[0].weight is t_params.layers[0].weight
    t_model = tj.tensors(model)
    p2, s2 = eqx.partition(t_model, eqx.is_array)
    back = eqx.combine(p2, s2)
    for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(t_model), strict=True):
        assert a is b
    tj.dispose((t_params, combined, got, opt_state, again, t_model, p2, back))


@needs_bind_hook
def test_eqx_combine_still_raises_for_trees_that_do_not_match():
    with pytest.raises(ValueError, match="structure"):
        eqx.combine(tj.tensors({"a": jnp.ones(2)}), {"b": None})


# -- 4. what has no fix carries a note naming it ------------------------------------------------


@needs_bind_hook
def test_a_structure_error_printing_tensor_nodes_as_custom_nodes_names_the_fix():
    """example_libraries prints the trees (``CustomNode(Tensor[None], [*])``), never the class."""
    params, loss, batch = _stax_problem()
    opt_init, opt_update, get_params = optimizers.sgd(0.1)
    raw_state = opt_init(params)  # raw: its recorded structure has no Tensor node

    def update(i, opt_state, batch):  # tidyjax.grad's gradient tree has Tensor nodes
        return opt_update(i, tj.grad(loss)(get_params(opt_state), batch), opt_state)

    with pytest.raises(TypeError, match="CustomNode") as info:
        tj.jit(update)(0, raw_state, batch)
    assert STRUCTURE_HINT in _notes(info.value)


@needs_bind_hook
def test_nested_tidyjax_transformations_add_the_note_once():
    t = tj.tensor(np.ones((3, 2), np.float32))

    def inner(p):
        return optax.apply_updates(p, jnp.ones((3, 2))).sum()

    with pytest.raises(ValueError, match="structure") as info:
        tj.jit(tj.grad(inner))(t)
    assert _notes(info.value).count(STRUCTURE_HINT) == 1
    t.dispose()


@needs_bind_hook
def test_cond_apply_updates_and_vjp_with_tensors_work_or_name_the_fix():
    t = tj.tensor(np.ones(3, np.float32))
    raw = jnp.ones(3)

    def cond(p, x):  # one branch returns its Tensor operand unchanged: no fix in raw lax.cond
        return jax.lax.cond(p, lambda v: v, lambda v: v * 2, x)

    with pytest.raises(TypeError, match="structure") as info:
        tj.jit(cond)(True, t)
    assert STRUCTURE_HINT in _notes(info.value)
    with tidy():  # the fix the note names
        out = tj.jit(lambda p, x: tj.lax.cond(p, lambda v: v, lambda v: v * 2, x))(False, t)
        np.testing.assert_array_equal(out.numpy(), np.full(3, 2.0))

    with pytest.raises(ValueError, match="structure") as info:
        tj.jit(optax.apply_updates)(t, raw)
    assert STRUCTURE_HINT in _notes(info.value)
    with tidy():
        out = tj.jit(lambda p, u: optax.apply_updates(p, tj.tensors(u)))(t, raw)
        np.testing.assert_array_equal(out.numpy(), np.full(3, 2.0))

    # jax.vjp: the cotangent must have the output's structure. A function of a Tensor computes
    # a raw value, so a raw cotangent works and a Tensor one is refused with the note.
    def pullback(x, ct):
        _, vjp = jax.vjp(lambda v: jnp.sin(v) * 2, x)
        return vjp(ct)

    want = jax.vjp(lambda v: jnp.sin(v) * 2, raw)[1](raw)
    with tidy():
        _close(tj.jit(pullback)(t, raw), want)
        _close(jax.jit(pullback)(t, raw), want)
        _close(pullback(t, raw), want)
        _close(tj.jit(pullback)(t, tj.arrays(tj.tensors(raw))), want)
    with pytest.raises(ValueError, match="structure") as info:
        tj.jit(pullback)(t, t)
    assert STRUCTURE_HINT in _notes(info.value)
    # a function returning its Tensor argument: the output has a Tensor node, so a raw
    # cotangent is the one refused
    with pytest.raises(ValueError, match="structure") as info:
        tj.jit(lambda x, ct: jax.vjp(lambda v: v, x)[1](ct))(t, raw)
    assert STRUCTURE_HINT in _notes(info.value)
    t.dispose()


@needs_bind_hook
def test_a_structure_error_from_raw_jax_in_a_scope_carries_the_fix() -> None:
    params = {"w": tj.tensor([1.0, 2.0])}
    raw_updates = {"w": jnp.ones(2)}
    with pytest.raises((TypeError, ValueError)) as info, tj.tidy():
        optax.apply_updates(params, raw_updates)  # raw optax: a Tensor node meets an array
    assert any("tidyjax.tensors(raw)" in n for n in getattr(info.value, "__notes__", []))


def test_shell_never_wraps_a_tensor() -> None:
    from tidyjax._tensor import shell

    t = tj.tensor([1.0])
    assert shell(t) is t
    t.dispose()
