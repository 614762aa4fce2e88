"""tidyjax inside the code JAX users already write, with the real packages: Equinox, optax,
orbax, flax.serialization and Flax NNX (issue 12), and ``tidyjax.watch``. Any function that runs
under ``jax.jit`` (value_and_grad with optax, custom-JVP ``jax.nn`` functions, raw loops, Equinox
and NNX steps, jacobians) runs under ``tidyjax.jit`` with Tensors passed in, with the same results
as the same program run by raw JAX on raw arrays.

Skipped as a whole unless the optional test extra is installed (``pip install -e ".[test]"``).
"""

from __future__ import annotations

import copy
import gc
import pickle

import jax
import jax.numpy as jnp
import numpy as np
import pytest

eqx = pytest.importorskip("equinox")
optax = pytest.importorskip("optax")
nnx = pytest.importorskip("flax.nnx")
serialization = pytest.importorskip("flax.serialization")
ocp = pytest.importorskip("orbax.checkpoint")

import tidyjax as tj  # noqa: E402 - after the skips: the module needs every package above
from tidyjax import Tensor, tidy  # noqa: E402
from tidyjax._arrays import CONCRETE  # noqa: E402
from tidyjax._jaxdoors import BIND_CONVERSION  # noqa: E402
from tidyjax._watch import _watched  # noqa: E402

from .conftest import counts, needs_bind_hook  # noqa: E402

_FLAX = tuple(int(p) for p in pytest.importorskip("flax").__version__.split(".")[:2])


@pytest.fixture(autouse=True)
def _nothing_watched_after_each_test():
    """A failing test must not leave an object watched for the next one."""
    yield
    _watched.clear()


def _live_arrays() -> tuple[int, int]:
    """(count, bytes) of every jax array alive in the process."""
    gc.collect()
    arrays = jax.live_arrays()
    return len(arrays), sum(a.nbytes for a in arrays)


class MLP(eqx.Module):
    w1: Tensor
    b1: Tensor
    w2: Tensor

    def __call__(self, x):
        return jnp.tanh(x @ self.w1 + self.b1) @ self.w2


def _mlp(seed: int = 0) -> MLP:
    k1, k2 = jax.random.split(jax.random.key(seed))
    return MLP(
        tj.tensor(jax.random.normal(k1, (2, 16)) * 0.5),
        tj.tensor(jnp.zeros(16)),
        tj.tensor(jax.random.normal(k2, (16, 1)) * 0.5),
    )


def _data() -> tuple[jax.Array, jax.Array]:
    x = jnp.linspace(-1.0, 1.0, 64).reshape(32, 2)
    return x, jnp.sin(x[:, :1])


def _loss(model, x, y):
    return ((model(x) - y) ** 2).mean()


# -- 1. raw JAX transformations on functions of Tensors -------------------------------------


def test_raw_grad_jit_and_while_loop_on_functions_of_tensors():
    x = tj.tensor([1.0, 2.0, 3.0])
    with tidy():
        g = jax.grad(lambda t: (t * t).sum())(x)  # the input's structure: a tracked Tensor
        assert isinstance(g, Tensor)
        np.testing.assert_array_equal(g.numpy(), [2.0, 4.0, 6.0])
    assert g.is_disposed  # its scope freed it

    # jit of a gradient: the output has the input's structure, so it is a Tensor too
    # (where JAX primitives take Tensors; JAX's own array on older JAX)
    g_jit = jax.jit(jax.grad(lambda t: (t * t).sum()))(x)
    assert isinstance(g_jit, Tensor) == BIND_CONVERSION
    np.testing.assert_array_equal(np.asarray(g_jit), [2.0, 4.0, 6.0])
    tj.dispose(g_jit)

    # cond_fun and body_fun compute with Tensors (as closures); the carry stays JAX's.
    out = jax.lax.while_loop(lambda c: c < x.sum() * 2, lambda c: c + x.sum(), 0.0)
    assert float(out) == 12.0
    # A carry of Tensors: the body's JAX values match it (where JAX primitives take Tensors).
    zero = tj.tensor(0.0)
    if BIND_CONVERSION:
        raw_total, _ = jax.lax.while_loop(
            lambda c: c[0] < 10.0, lambda c: (c[0] + c[1].sum(), c[1]), (zero, x)
        )
        assert float(raw_total) == 12.0
        tj.dispose(_)
    else:
        with pytest.raises(TypeError, match="same pytree structure"):
            jax.lax.while_loop(
                lambda c: c[0] < 10.0, lambda c: (c[0] + c[1].sum(), c[1]), (zero, x)
            )
    with tidy():
        total, same = tj.lax.while_loop(
            lambda c: c[0] < 10.0, lambda c: (c[0] + c[1].sum(), c[1]), (tj.tensor(0.0), x)
        )
        assert isinstance(total, Tensor) and total.item() == 12.0 and isinstance(same, Tensor)
    assert total.is_disposed and not x.is_disposed
    tj.dispose((x, zero))


def test_the_readme_table_of_raw_jax_and_tidyjax_forms():
    """Each row of the README's table "Raw JAX, or the tidyjax form?" as it reads."""
    x = tj.tensor([1.0, 2.0, 3.0])
    seen = []
    with tidy():
        # jax.jit / jax.vmap: f sees what it was given (a Tensor around JAX's tracer where JAX
        # primitives take Tensors), new outputs are JAX's; the tidyjax forms track them.
        assert type(jax.jit(lambda t: seen.append(t) or t * 2)(x)) in CONCRETE
        given = seen[0].array if isinstance(seen[0], Tensor) else seen[0]
        assert isinstance(given, jax.core.Tracer)
        assert type(jax.vmap(lambda r: r * 2)(x)) in CONCRETE
        assert isinstance(tj.vmap(lambda r: r * 2)(x), Tensor)
        assert isinstance(tj.lift(jax.jit(lambda t: t * 2))(x), Tensor)
        assert isinstance(tj.tensors(jax.jit(lambda t: t * 2)(x)), Tensor)
        # jax.value_and_grad: the gradient has the input's structure, the value is new.
        value, grad = jax.value_and_grad(lambda t: (t * t).sum())(x)
        assert type(value) in CONCRETE and isinstance(grad, Tensor)
        # Control flow: Tensors as xs, operands and closures work.
        assert type(jax.lax.scan(lambda c, a: (c + a, a * x[0]), 0.0, x)[1]) in CONCRETE
        assert type(jax.lax.cond(True, lambda a: a * 2, lambda a: a * 1, x)) in CONCRETE
        raw_loops = (
            lambda: jax.lax.scan(lambda c, a: (c + a, a), x[0], x)[0],
            lambda: jax.lax.fori_loop(0, 3, lambda i, c: c + 1, x),
        )
        if BIND_CONVERSION:  # a carry of Tensors works; it comes back as JAX's value
            np.testing.assert_array_equal(np.asarray(raw_loops[0]()), 7.0)
            np.testing.assert_array_equal(np.asarray(raw_loops[1]()), [4.0, 5.0, 6.0])
            # a branch returning its Tensor operand unchanged keeps the Tensor node
            with pytest.raises(TypeError, match="same pytree structure"):
                jax.lax.cond(True, lambda a: a * 2, lambda a: a, x)
        else:
            for raw_loop in raw_loops:
                with pytest.raises(TypeError, match="same pytree structure"):
                    raw_loop()
        carry, ys = tj.lax.scan(lambda c, a: (c + a, a), x[0], x)
        looped = tj.lax.fori_loop(0, 3, lambda i, c: c + 1, x)
        branch = tj.lax.cond(True, lambda a: a * 2, lambda a: a, x)
        assert all(isinstance(t, Tensor) for t in (carry, ys, looped, branch))
        np.testing.assert_array_equal(looped.numpy(), [4.0, 5.0, 6.0])
        key = tj.random.key(0)
        if BIND_CONVERSION:  # eager jax.lax on a Tensor: JAX's own value
            assert type(jax.lax.exp(x)) in CONCRETE
        else:  # eager jax.lax / jax.random on a Tensor: an error that names the fix
            with pytest.raises(tj.TidyjaxValueError, match=r"tidyjax\.lax"):
                jax.lax.exp(x)
            with pytest.raises(tj.TidyjaxValueError, match=r"tidyjax\.random"):
                jax.random.normal(key, (2,))
        # jax.numpy converts through __jax_array__ and returns JAX's array.
        assert type(jnp.sin(x)) in CONCRETE
        # Tree maps: new arrays come back as tracked Tensors, is_leaf hands over the Tensors.
        doubled = jax.tree.map(lambda a: a * 2, {"x": x})
        assert isinstance(doubled["x"], Tensor)
        assert jax.tree.map(lambda t: t is x, {"x": x}, is_leaf=tj.is_tensor) == {"x": True}
        assert not isinstance(x, jax.Array) and tj.is_tensor(x)
    assert doubled["x"].is_disposed and carry.is_disposed and key.is_disposed
    x.dispose()


def test_eqx_filter_grad_and_value_and_grad_on_a_model_of_tensors():
    model = _mlp()
    x, y = _data()
    raw = jax.tree.map(lambda a: a, tj.arrays(model))  # the same model over raw arrays
    want_loss, want = eqx.filter_value_and_grad(_loss)(raw, x, y)
    with tidy():
        grads = eqx.filter_grad(_loss)(model, x, y)
        loss, grads2 = eqx.filter_value_and_grad(_loss)(model, x, y)
        for g in (grads, grads2):  # model-shaped: tracked Tensors, the right values
            assert all(isinstance(leaf, Tensor) for leaf in (g.w1, g.b1, g.w2))
            for got, exp in zip(jax.tree.leaves(g), jax.tree.leaves(want), strict=True):
                np.testing.assert_allclose(np.asarray(got), np.asarray(exp), rtol=1e-6)
        assert type(loss) in CONCRETE and float(loss) == pytest.approx(float(want_loss))
    assert grads.w1.is_disposed and grads2.w2.is_disposed
    assert not model.w1.is_disposed
    tj.dispose(model)


# -- Equinox: a whole training loop ---------------------------------------------------------


def test_equinox_training_loop_is_flat_in_memory_and_the_loss_falls():
    model = _mlp()
    x, y = (tj.tensor(a) for a in _data())
    opt = optax.adam(1e-2)
    opt_state = tj.lift(opt.init)(eqx.filter(model, eqx.is_array))  # every leaf tracked

    @tj.lift  # Tensors in, tracked Tensors out
    @eqx.filter_jit
    def step(model, opt_state, x, y):
        loss, grads = eqx.filter_value_and_grad(_loss)(model, x, y)
        updates, opt_state = opt.update(grads, opt_state, eqx.filter(model, eqx.is_array))
        return eqx.apply_updates(model, updates), opt_state, loss

    losses, seen = [], {}
    for i in range(1, 201):
        with tidy() as scope:
            new_model, new_state, loss = step(model, opt_state, x, y)
            losses.append(loss.item())
            scope.keep(new_model, new_state)
        assert loss.is_disposed  # the step's loss was freed with the scope
        tj.dispose((model, opt_state))
        model, opt_state = new_model, new_state
        if i in (10, 200):
            seen[i] = counts()
    assert seen[10] == seen[200]
    assert losses[-1] < losses[0] / 10
    leaves = jax.tree.leaves((model, opt_state), is_leaf=tj.is_tensor)
    assert all(isinstance(leaf, Tensor) and not leaf.is_disposed for leaf in leaves)
    assert seen[200][0] == len(leaves) + 2  # the model, the optimizer state, x and y
    tj.dispose((model, opt_state, x, y))


def test_eqx_partition_combine_filter_and_pickle_on_a_model_of_tensors():
    model = _mlp()
    assert not eqx.is_array(model.w1)  # a Tensor is no jax.Array (see the README)...
    params, static = eqx.partition(model, eqx.is_array)  # ...but the filters see its array
    assert all(isinstance(leaf, Tensor) for leaf in (params.w1, params.b1, params.w2))
    assert static.w1._array is None  # the filtered-out leaf: a shell around None
    back = eqx.combine(params, static)
    for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(model), strict=True):
        assert a is b  # the very arrays: nothing copied
    only = eqx.filter(model, eqx.is_array)
    assert only.w1.array is model.w1.array

    restored = pickle.loads(pickle.dumps(model))
    assert isinstance(restored.w2, Tensor) and restored.w2.array is not model.w2.array
    np.testing.assert_array_equal(restored.w2.numpy(), model.w2.numpy())
    tj.dispose((model, params, back, only, restored))


# -- 3. Variables map with gradient and update trees --------------------------------------


def test_variables_map_with_grads_and_optax_updates():
    variables = {"w": tj.Variable(tj.tensor([1.0, 2.0]), name="w"), "b": tj.Variable(0.5)}
    assert type(variables["w"]) is Tensor and isinstance(variables["w"], tj.Variable)

    def loss(p):
        return (p["w"] * p["w"]).sum() + p["b"]

    with tidy():
        grads = tj.grad(loss)(variables)
        stepped = jax.tree.map(lambda v, g: v - 0.1 * g, variables, grads)
        np.testing.assert_allclose(stepped["w"].numpy(), [0.8, 1.6])
        updates = jax.tree.map(lambda g: -g, grads)
        applied = optax.apply_updates(variables, updates)
        np.testing.assert_allclose(applied["b"].item(), -0.5)
        assert not isinstance(applied["b"], tj.Variable)  # plain Tensors come back
        for name, v in variables.items():  # write back: the Variables keep their identity
            v.assign(applied[name])
    assert stepped["w"].is_disposed and applied["w"].is_disposed
    np.testing.assert_allclose(variables["w"].numpy(), [-1.0, -2.0])
    assert variables["w"].name == "w" and not variables["w"].is_disposed
    tj.dispose_variables()


def test_eqx_filter_grad_on_a_model_of_variables():
    model = MLP(*(tj.Variable(leaf) for leaf in (jnp.ones((2, 4)), jnp.zeros(4), jnp.ones((4, 1)))))
    x, y = _data()
    with tidy():
        grads = eqx.filter_grad(_loss)(model, x, y)
        assert isinstance(grads.w1, Tensor) and not isinstance(grads.w1, tj.Variable)
        new = jax.tree.map(lambda v, g: v - 0.1 * g, model, grads)
        jax.tree.map(lambda v, n: v.assign(n), model, new, is_leaf=tj.is_tensor)
    assert grads.w1.is_disposed and not model.w1.is_disposed
    assert isinstance(model.w1, tj.Variable) and float(model.w1.numpy().mean()) < 1.0
    tj.dispose_variables()


# -- 4. pytree round trips ----------------------------------------------------------------


def test_tree_maps_give_plain_data_and_optax_masks_keep_their_structure():
    params = {"w": tj.tensor([[1.0, 2.0]]), "b": tj.tensor([1.0])}
    assert jax.tree.map(lambda a: a.shape, params) == {"w": (1, 2), "b": (1,)}
    host = jax.device_get(params)
    assert type(host["w"]) is np.ndarray
    np.testing.assert_array_equal(host["w"], [[1.0, 2.0]])

    grads = {"w": tj.tensor([[1.0, 1.0]]), "b": tj.tensor([1.0])}
    raw_params, raw_grads = tj.arrays(params), tj.arrays(grads)
    masks = (
        jax.tree.map(lambda p: p.ndim > 1, params),  # a tree of bools over Tensors
        lambda p: jax.tree.map(lambda a: a.ndim > 1, p),  # a callable mask
    )
    raw_mask = {"w": True, "b": False}
    want, _ = optax.masked(optax.sgd(1.0), raw_mask).update(
        raw_grads, optax.masked(optax.sgd(1.0), raw_mask).init(raw_params), raw_params
    )
    with tidy():
        for mask in masks:
            tx = optax.masked(optax.sgd(1.0), mask)
            updates, _ = tx.update(grads, tx.init(params), params)
            assert isinstance(updates["w"], Tensor)
            for k in ("w", "b"):
                np.testing.assert_array_equal(updates[k].numpy(), np.asarray(want[k]))
            new = optax.apply_updates(params, updates)
            np.testing.assert_array_equal(new["w"].numpy(), [[0.0, 1.0]])
    assert new["w"].is_disposed and not params["w"].is_disposed
    tj.dispose((params, grads))


def test_flax_serialization_round_trips_tensors_and_variables():
    state = {"w": tj.Variable(tj.tensor([1.0, 2.0]), name="w", trainable=False),
             "m": tj.tensor([[3.0]]), "step": 7}  # fmt: skip
    data = serialization.to_bytes(state)
    target = {"w": tj.Variable(tj.tensor([0.0, 0.0]), name="w", trainable=False),
              "m": tj.tensor([[0.0]]), "step": 0}  # fmt: skip
    with tidy():
        back = serialization.from_bytes(target, data)
        assert isinstance(back["w"], tj.Variable) and back["w"].name == "w"
        assert not back["w"].trainable
        assert isinstance(back["m"], Tensor) and not isinstance(back["m"], tj.Variable)
        np.testing.assert_array_equal(back["w"].numpy(), [1.0, 2.0])
        np.testing.assert_array_equal(back["m"].numpy(), [[3.0]])
        assert back["step"] == 7
    assert back["m"].is_disposed  # a restored Tensor belongs to the scope
    assert not back["w"].is_disposed  # a restored Variable is never freed by one
    tj.dispose((state, target))
    tj.dispose_variables()


def test_orbax_round_trip_through_plain_arrays(tmp_path):
    state = {"w": tj.tensor([[1.0, 2.0]]), "b": tj.tensor([0.5]), "step": 3}
    variables = {"v": tj.Variable(tj.tensor([4.0, 5.0]), name="v")}
    with ocp.StandardCheckpointer() as ckptr:
        with pytest.raises(AssertionError):  # orbax cannot take Tensors themselves
            ckptr.save(tmp_path / "direct", state)
        ckptr.save(tmp_path / "state", tj.arrays(state))
        ckptr.save(tmp_path / "variables", tj.arrays(variables))
        ckptr.wait_until_finished()
        with tidy():
            back = tj.tensors(ckptr.restore(tmp_path / "state", tj.arrays(state)))
            assert isinstance(back["w"], Tensor) and back["step"] == 3
            np.testing.assert_array_equal(back["w"].numpy(), [[1.0, 2.0]])
            # A target of shapes and dtypes needs no values.
            abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, state)
            assert isinstance(abstract["w"], jax.ShapeDtypeStruct)
            again = tj.tensors(ckptr.restore(tmp_path / "state", abstract))
            np.testing.assert_array_equal(again["b"].numpy(), [0.5])
            variables["v"].assign(tj.tensor([0.0, 0.0]))
            restored = ckptr.restore(tmp_path / "variables", tj.arrays(variables))
            jax.tree.map(lambda v, r: v.assign(r), variables, restored, is_leaf=tj.is_tensor)
    assert back["w"].is_disposed and again["b"].is_disposed
    np.testing.assert_array_equal(variables["v"].numpy(), [4.0, 5.0])
    assert variables["v"].name == "v" and not variables["v"].is_disposed
    tj.dispose(state)
    tj.dispose_variables()


# -- 5. copies keep what they copy --------------------------------------------------------


def test_pickled_training_state_comes_back_as_the_same_kinds():
    state = {"model": _mlp(), "scale": tj.Variable(tj.tensor(2.0), name="scale", trainable=False)}
    state["opt"] = tj.lift(optax.adam(1e-2).init)(eqx.filter(state["model"], eqx.is_array))
    blob = pickle.dumps(state)
    with tidy():
        back = pickle.loads(blob)
        deep = copy.deepcopy(state)
        for got in (back, deep):
            assert isinstance(got["model"], MLP) and isinstance(got["model"].w1, Tensor)
            scale = got["scale"]
            assert isinstance(scale, tj.Variable) and scale.name == "scale"
            assert not scale.trainable
            assert isinstance(got["opt"][0].mu.w1, Tensor)
            np.testing.assert_array_equal(got["model"].w2.numpy(), state["model"].w2.numpy())
    assert back["model"].w1.is_disposed and deep["opt"][0].mu.w1.is_disposed
    assert not back["scale"].is_disposed and not deep["scale"].is_disposed  # Variables stay
    tj.dispose(state)
    tj.dispose_variables()


# -- 7, 8. helpers, and a step through raw jax.jit --------------------------------------------


def test_a_raw_jit_step_returns_jax_arrays_and_the_helpers_make_them_tracked():
    params = {"w": tj.tensor([[0.1], [0.2]])}
    x, y = _data()
    opt = optax.sgd(0.1)
    opt_state = tj.tensors(opt.init(tj.arrays(params)))

    @jax.jit
    def step(params, opt_state):
        loss, grads = jax.value_and_grad(lambda p: ((x @ p["w"] - y) ** 2).mean())(params)
        updates, opt_state = opt.update(grads, opt_state)
        return optax.apply_updates(params, updates), opt_state, loss

    _, _, raw_loss = step(params, opt_state)
    assert type(raw_loss) in CONCRETE  # a new jit output: JAX's own, no scope frees it
    with tidy():
        loss = tj.tensors(step(params, opt_state)[2])  # tracked: freed with the scope
        lifted = tj.lift(step)(params, opt_state)  # every output tracked
        assert all(
            isinstance(leaf, Tensor) for leaf in jax.tree.leaves(lifted, is_leaf=tj.is_tensor)
        )
    assert loss.is_disposed and lifted[2].is_disposed
    assert tj.is_tensor(params["w"]) and not tj.is_tensor(raw_loss)
    assert not isinstance(params["w"], jax.Array)  # documented: jax.Array is a C++ type
    assert tj.random is __import__("tidyjax.random").random
    tj.dispose((params, opt_state))


# -- 2. Flax NNX: raw arrays in Params, and watch ------------------------------------------


class NNXMLP(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.hidden = nnx.Linear(2, 16, rngs=rngs)
        self.out = nnx.Linear(16, 1, rngs=rngs)

    def __call__(self, x):
        return self.out(jax.nn.relu(self.hidden(x)))


@nnx.jit
def nnx_train_step(model, optimizer, metrics, x, y):
    loss, grads = nnx.value_and_grad(lambda m: ((m(x) - y) ** 2).mean())(model)
    optimizer.update(model, grads)
    metrics.update(loss=loss)
    return loss


def _state_bytes(obj) -> int:
    return sum(a.nbytes for a in jax.tree.leaves(nnx.state(obj)))


def test_nnx_training_loop_under_tidy_with_watch():
    model = tj.watch(NNXMLP(nnx.Rngs(0)), "model")
    optimizer = tj.watch(nnx.Optimizer(model, optax.adamw(1e-2), wrt=nnx.Param), "optimizer")
    metrics = nnx.MultiMetric(loss=nnx.metrics.Average("loss"))
    x, y = _data()
    losses, per_step, seen = [], [], {}
    for i in range(1, 1001):
        with tidy():
            loss = tj.tensors(nnx_train_step(model, optimizer, metrics, x, y))
            if i == 1 or i % 100 == 0:
                losses.append(loss.item())
                per_step.append(loss)
        if i in (10, 1000):
            seen[i] = _live_arrays()
    assert seen[10] == seen[1000]  # flat: every jax array in the process counted
    assert all(t.is_disposed for t in per_step)  # the per-step values were freed
    assert losses[-1] < losses[0] / 10
    # Nothing of the model or the optimizer was freed: the model still runs.
    state = jax.tree.leaves(nnx.state(model)) + jax.tree.leaves(nnx.state(optimizer))
    assert not any(a.is_deleted() for a in state)
    assert model(x).shape == (32, 1) and int(optimizer.step[...]) == 1000
    assert float(metrics.compute()["loss"]) > 0.0

    info = tj.memory()
    assert dict(info.watched) == {
        "model": _state_bytes(model),
        "optimizer": _state_bytes(optimizer),
    }
    assert info.num_tensors == 0  # nothing tracked is left
    names = {r.name: r for r in tj.live_tensors()}
    kernel = names["model.hidden.kernel"]
    assert kernel.id == 0 and kernel.scope == "<watched>" and kernel.bytes == 2 * 16 * 4
    assert "optimizer.opt_state[0].mu.out.bias" in names
    assert "optimizer.step" in names
    tj.unwatch(model)
    tj.unwatch("optimizer")
    assert dict(tj.memory().watched) == {}


def test_tensors_as_nnx_params_work_until_nnx_writes_back_jax_arrays():
    """Documented in the README: keep raw arrays in Params and watch the model."""

    class Lin(nnx.Module):
        def __init__(self, w):
            self.w = nnx.Param(w)

        def __call__(self, x):
            return x @ self.w

    t = tj.tensor([[0.5], [0.5]])
    lin = Lin(t)  # a Tensor in a Param works...
    assert isinstance(lin.w[...], Tensor)
    if _FLAX >= (0, 12):  # ...but flax 0.12 writes into the value in place: a Tensor refuses
        with pytest.raises(tj.TidyjaxTypeError, match="immutable"):
            lin.w[...] = t
    optimizer = nnx.Optimizer(lin, optax.sgd(0.1), wrt=nnx.Param)

    @nnx.jit
    def step(model, optimizer, x, y):
        loss, grads = nnx.value_and_grad(lambda m: ((m(x) - y) ** 2).mean())(model)
        optimizer.update(model, grads)
        return loss

    x, y = jnp.ones((4, 2)), jnp.zeros((4, 1))
    with tidy():
        first = step(lin, optimizer, x, y)
        second = step(lin, optimizer, x, y)  # nothing of the model was freed meanwhile
    assert float(second) < float(first)
    assert not t.is_disposed
    if BIND_CONVERSION:
        # The updated value keeps the Param's Tensor node: a Tensor made inside the scope and
        # neither returned nor kept, so the scope freed it (TF.js's rule); hence raw Params.
        with pytest.raises(tj.DisposedError, match="scope '<tidy>' exited"):
            lin.w[...]
    else:  # NNX put JAX's updated arrays into the Params: tidyjax no longer sees them.
        assert type(lin.w[...]) in CONCRETE
    t.dispose()


# -- watch ---------------------------------------------------------------------------------


def test_watch_holds_objects_weakly_when_it_can_and_a_name_is_replaced():
    model = tj.watch(NNXMLP(nnx.Rngs(0)), "model")
    first = tj.memory().watched["model"]
    assert first == _state_bytes(model)
    model = tj.watch(NNXMLP(nnx.Rngs(1)), "model")  # a re-run cell: the name means the new one
    gc.collect()  # the old model had no other reference: gone
    assert dict(tj.memory().watched) == {"model": first}  # the same shapes, once
    (kernel,) = [r for r in tj.live_tensors() if r.name == "model.hidden.kernel"]
    assert kernel._buffer == id(model.hidden.kernel[...])  # the new model's array
    del model
    gc.collect()  # held weakly: the watch does not keep a model alive
    assert dict(tj.memory().watched) == {}

    tj.watch({"a": jnp.ones(2)}, "plain")  # a dict takes no weak reference: held until unwatch
    gc.collect()
    assert dict(tj.memory().watched) == {"plain": 8}
    tj.unwatch("plain")
    assert dict(tj.memory().watched) == {}
    with pytest.raises(tj.TidyjaxTypeError, match="non-empty str"):
        tj.watch({}, "")
    with pytest.raises(tj.TidyjaxTypeError, match="non-empty str"):
        tj.watch({}, 3)  # type: ignore[arg-type]


def test_watch_reads_nnx_objects_that_are_not_pytrees():
    # flax 0.12 makes Modules pytrees unless told not to; earlier Modules never are.
    class Legacy(nnx.Module, **({"pytree": False} if _FLAX >= (0, 12) else {})):
        def __init__(self, rngs: nnx.Rngs) -> None:
            self.blocks = [nnx.Linear(2, 3, rngs=rngs)]
            self.rngs = rngs

    legacy = tj.watch(Legacy(nnx.Rngs(0)), "legacy")
    names = {r.name for r in tj.live_tensors()}
    assert {"legacy.blocks[0].kernel", "legacy.blocks[0].bias", "legacy.rngs.default.key"} <= names
    assert tj.memory().watched["legacy"] == _state_bytes(legacy)
    tj.unwatch(legacy)


# -- any function that runs under jax.jit runs under tidyjax.jit, compared with raw JAX -----------


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


def _data_mlp():
    x = jax.random.normal(jax.random.key(1), (32, 8))
    return x, jnp.sin(x[:, :2])


def _mlp_loss(p, x, y):
    h = jax.nn.relu(x @ p["w1"] + p["b1"])
    return ((jax.nn.sigmoid(h @ p["w2"]) - y) ** 2).mean()


@needs_bind_hook
def test_the_standard_value_and_grad_optax_step_runs_under_tidyjax_jit():
    opt = optax.adam(1e-2)

    def step(params, state, x, y):
        loss, grads = jax.value_and_grad(_mlp_loss)(params, x, y)
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state, loss

    x, y = _data_mlp()
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
    x, y = _data_mlp()
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
    x, y = _data_mlp()

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
    assert "test_ecosystem.py:" in step_line and "tidyjax.numpy" in step_line
    clean = next(r.getMessage() for r in caplog.records if "'clean' exited" in r.getMessage())
    assert "not tracked" not in clean
    t.dispose()
