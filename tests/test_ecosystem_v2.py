"""Ecosystem v2: any function that runs under ``jax.jit`` runs under ``tidyjax.jit`` with Tensors
passed in, with the same results; raw JAX transformations and libraries nested inside work.

Each test compares with the same program run by raw JAX on raw arrays.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tidyjax as tj
from tidyjax import Tensor, tidy
from tidyjax._lift import PRIMITIVES_TAKE_TENSORS

optax = pytest.importorskip("optax")
eqx = pytest.importorskip("equinox")
nnx = pytest.importorskip("flax.nnx")

needs_bind_hook = pytest.mark.skipif(
    not PRIMITIVES_TAKE_TENSORS,
    reason="JAX before 0.10.2 has no hook to convert a Tensor at a primitive bind",
)


def _close(got, want, rtol=1e-5):
    got_leaves, want_leaves = jax.tree.leaves(got), jax.tree.leaves(want)
    assert len(got_leaves) == len(want_leaves)
    for g, w in zip(got_leaves, want_leaves, strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=rtol, atol=1e-6)


def _params(seed=0):
    k1, k2 = jax.random.split(jax.random.key(seed))
    return {
        "w1": jax.random.normal(k1, (8, 16)) * 0.3,
        "b1": jnp.zeros(16),
        "w2": jax.random.normal(k2, (16, 2)) * 0.3,
    }


def _data():
    x = jax.random.normal(jax.random.key(1), (32, 8))
    return x, jnp.sin(x[:, :2])


def _mlp_loss(p, x, y):
    h = jax.nn.relu(x @ p["w1"] + p["b1"])
    return ((jax.nn.sigmoid(h @ p["w2"]) - y) ** 2).mean()


def _live_bytes():
    return sum(a.nbytes for a in jax.live_arrays())


# -- 1. the standard step ------------------------------------------------------------------------


@needs_bind_hook
def test_the_standard_value_and_grad_optax_step_runs_under_tidyjax_jit():
    opt = optax.adam(1e-2)

    def step(params, state, x, y):
        loss, grads = jax.value_and_grad(_mlp_loss)(params, x, y)
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state, loss

    x, y = _data()
    raw_p, raw_s = _params(), opt.init(_params())
    p, s = tj.tensors(_params()), opt.init(tj.tensors(_params()))
    raw_step, tj_step = jax.jit(step), tj.jit(step)
    raw_p, raw_s, raw_loss = raw_step(raw_p, raw_s, x, y)
    p, s, loss = tj_step(p, s, x, y)
    leaves = jax.tree.leaves((p, s, loss), is_leaf=tj.is_tensor)
    assert all(isinstance(leaf, Tensor) for leaf in leaves)
    _close((p, s, loss), (raw_p, raw_s, raw_loss))

    # A training loop in a scope: memory stays flat, results keep matching raw JAX.
    before = None
    for _ in range(20):
        with tidy():
            p, s, loss = tj.keep(tj_step(p, s, x, y))
            prev = (p, s, loss)
        raw_p, raw_s, raw_loss = raw_step(raw_p, raw_s, x, y)
        tj.dispose(prev[2])
        before = before or tj.memory().num_bytes
    assert tj.memory().num_bytes == before
    _close(p, raw_p)
    tj.dispose((p, s))


@needs_bind_hook
def test_jax_nn_custom_jvp_functions_differentiate_under_every_tidyjax_form():
    x, y = _data()
    raw_l, raw_g = jax.value_and_grad(_mlp_loss)(_params(), x, y)
    p = tj.tensors(_params())
    with tidy():
        _close(tj.grad(_mlp_loss)(p, x, y), raw_g)
        loss, grads = tj.value_and_grad(_mlp_loss)(p, x, y)
        _close((loss, grads), (raw_l, raw_g))
        _close(tj.jit(jax.grad(_mlp_loss))(p, x, y), raw_g)
        _close(jax.grad(_mlp_loss)(p, x, y), raw_g)  # raw grad of a tree of Tensors
        # Tensor-only methods still chain on what the function is given
        chain = tj.grad(lambda w, x: x.matmul(w).relu().square().mean())
        chained = chain(p["w1"], tj.tensor(x))
        want = jax.grad(lambda w, x: jnp.mean(jax.nn.relu(x @ w) ** 2))(_params()["w1"], x)
        _close(chained, want)
        assert isinstance(chained, Tensor)
    tj.dispose(p)


@needs_bind_hook
def test_raw_loops_take_a_tensor_carry_eagerly_and_inside_tidyjax_jit():
    xs = jnp.arange(12.0).reshape(4, 3) / 10

    def scan_body(c, x):
        return jnp.tanh(c + x), c.sum()

    def run(init):
        carry, ys = jax.lax.scan(scan_body, init, xs)
        looped = jax.lax.fori_loop(0, 3, lambda i, c: c * 2 + i, init)
        grown = jax.lax.while_loop(lambda c: c.sum() < 50.0, lambda c: c * 2 + 1, init)
        return carry, ys, looped, grown

    want = run(jnp.ones(3))
    with tidy():
        init = tj.tensor(np.ones(3, np.float32))
        _close(run(init), want)
        out = tj.jit(run)(init)
        assert all(isinstance(t, Tensor) for t in out)
        _close(out, want)


@needs_bind_hook
def test_equinox_filter_value_and_grad_step_and_vmap_of_a_model_of_tensors():
    key = jax.random.key(0)
    raw_model = eqx.nn.MLP(3, 2, 8, 2, key=key)
    x, y = jnp.ones((5, 3)), jnp.zeros((5, 2))
    opt = optax.adam(1e-2)

    def loss(m, x, y):
        return ((jax.vmap(m)(x) - y) ** 2).mean()

    @eqx.filter_jit
    def step(m, state, x, y):
        value, grads = eqx.filter_value_and_grad(loss)(m, x, y)
        updates, state = opt.update(grads, state, eqx.filter(m, eqx.is_array))
        return eqx.apply_updates(m, updates), state, value

    raw_out = step(raw_model, opt.init(eqx.filter(raw_model, eqx.is_array)), x, y)
    with tidy():
        model = tj.tensors(raw_model)
        out = step(model, opt.init(eqx.filter(model, eqx.is_array)), x, y)
        _close(eqx.filter(out, eqx.is_array), eqx.filter(raw_out, eqx.is_array))
        assert isinstance(out[0].layers[0].weight, Tensor)
        want = jax.vmap(raw_model)(x)
        _close(jax.vmap(model)(x), want)
        batched = tj.vmap(model)(tj.tensor(np.ones((5, 3), np.float32)))
        assert isinstance(batched, Tensor)
        _close(batched, want)


@needs_bind_hook
def test_nnx_value_and_grad_step_inside_tidyjax_jit():
    class Model(nnx.Module):
        def __init__(self, rngs):
            self.lin = nnx.Linear(3, 2, rngs=rngs)

        def __call__(self, x):
            return jax.nn.relu(self.lin(x))

    graphdef, raw_state = nnx.split(Model(nnx.Rngs(0)))
    x, y = jnp.ones((4, 3)), jnp.zeros((4, 2))

    def step(state, x, y):
        model = nnx.merge(graphdef, state)
        loss, grads = nnx.value_and_grad(lambda m: ((m(x) - y) ** 2).mean())(model)
        return loss, grads

    want = jax.jit(step)(raw_state, x, y)
    with tidy():
        loss, grads = tj.jit(step)(tj.tensors(raw_state), x, y)
        assert isinstance(loss, Tensor)
        _close((loss, grads), want)


@needs_bind_hook
def test_jacobians_and_hessians_of_tensors_match_raw_jax():
    def f(a):
        return jnp.sin(a) * a.sum()

    raw = jnp.array([0.1, 0.2, 0.3])
    with tidy():
        t = tj.tensor([0.1, 0.2, 0.3])
        for transform in (jax.jacfwd, jax.jacrev):
            _close(transform(f)(t), transform(f)(raw))
        _close(jax.hessian(lambda a: (a**3).sum())(t), jax.hessian(lambda a: (a**3).sum())(raw))


@needs_bind_hook
@pytest.mark.parametrize(
    "make",
    [
        lambda: optax.adam(1e-2),
        lambda: optax.adamw(1e-2),
        lambda: optax.lion(1e-3),
        lambda: optax.chain(
            optax.clip_by_global_norm(1.0), optax.adam(optax.exponential_decay(1e-2, 10, 0.9))
        ),
    ],
    ids=["adam", "adamw", "lion", "chain-clip-schedule"],
)
def test_optax_transformations_on_tensors_eager_and_jitted(make):
    opt = make()
    x, y = _data()

    def update(p, s):
        grads = jax.grad(_mlp_loss)(p, x, y)
        u, s = opt.update(grads, s, p)
        return optax.apply_updates(p, u), s

    raw_p, raw_s = _params(), opt.init(_params())
    for _ in range(3):
        raw_p, raw_s = update(raw_p, raw_s)
    jitted = tj.jit(update)
    for run in (update, jitted):  # eager on Tensors, then under tidyjax.jit
        p = tj.tensors(_params())
        s = opt.init(p)
        for _ in range(3):
            with tidy():
                p, s = tj.keep(run(p, s))
        assert all(isinstance(v, Tensor) for v in p.values())
        _close(p, raw_p)
        tj.dispose((p, s))


def test_tensors_of_a_callers_tree_never_deletes_the_callers_arrays():
    """optax's getting-started loop with the README's "dispose last step's values" line."""
    initial_params = {"w": jnp.ones((3, 2)), "b": jnp.zeros(2)}
    opt = optax.sgd(0.1)

    def loss(p):
        return ((p["w"].sum(0) + p["b"]) ** 2).sum()

    for _run in range(2):  # the second run starts again from the same module-level params
        params = tj.tensors(initial_params)
        state = opt.init(params)
        for _ in range(3):
            grads = tj.grad(loss)(params)
            updates, new_state = opt.update(grads, state, params)
            new_params = optax.apply_updates(params, updates)
            tj.dispose((params, grads, updates))  # the README's per-step line
            params, state = new_params, new_state
        tj.dispose((params, state))
        assert not initial_params["w"].is_deleted()
    np.testing.assert_array_equal(np.asarray(initial_params["w"]), np.ones((3, 2)))
    with tidy():
        inner = tj.tensors(initial_params)
    assert inner["w"].is_disposed and not initial_params["w"].is_deleted()
    # adopt() is the explicit hand-over
    mine = jnp.ones(4)
    with tidy():
        tj.adopt(mine)
    assert mine.is_deleted()


@needs_bind_hook
def test_a_tensor_node_meeting_a_raw_value_names_the_fix_under_tidyjax_jit():
    t = tj.tensor(np.ones((3, 2), np.float32))
    with pytest.raises(ValueError, match="structure") as info:
        tj.jit(lambda p: optax.apply_updates(p, jnp.ones((3, 2))))(t)
    assert any("tidyjax.tensors(raw)" in note for note in info.value.__notes__)
    # the fix the note names
    with tidy():
        out = tj.jit(lambda p: optax.apply_updates(tj.arrays(p), jnp.ones((3, 2))))(t)
        np.testing.assert_array_equal(out.numpy(), np.full((3, 2), 2.0))
        lifted = tj.lift(optax.apply_updates)(t, jnp.ones((3, 2)))
        np.testing.assert_array_equal(lifted.numpy(), np.full((3, 2), 2.0))
    t.dispose()


def test_debug_log_names_untracked_arrays_a_scope_made_from_tensors(caplog):
    kept = []
    t = tj.tensor(np.ones(3, np.float32))
    with caplog.at_level("DEBUG", logger="tidyjax"):
        with tidy("step"):
            kept.append(jnp.tanh(t))  # JAX's own array: the scope cannot free it
            _ = t * 2  # tracked: freed
        with tidy("clean"):
            float(jnp.tanh(t).sum())  # dropped at once: nothing outlives the scope
    step_line = next(r.getMessage() for r in caplog.records if "'step' exited" in r.getMessage())
    assert "1 jax.Arrays (12 bytes) made here by raw JAX calls are not tracked" in step_line
    assert "test_ecosystem_v2.py:" in step_line and "tidyjax.numpy" in step_line
    clean = next(r.getMessage() for r in caplog.records if "'clean' exited" in r.getMessage())
    assert "not tracked" not in clean
    t.dispose()
