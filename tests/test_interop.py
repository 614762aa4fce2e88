"""JAX interop: lifted namespaces, pytrees, jit/grad/vmap/scan, donation."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tidyjax as tj
import tidyjax.lax as tlax
import tidyjax.nn as tnn
import tidyjax.numpy as tnp
import tidyjax.random as trandom
from tidyjax import DisposedError, Tensor, tidy
from tidyjax._arrays import CONCRETE
from tidyjax._jaxdoors import BIND_CONVERSION

from .conftest import counts


def test_lift_unwraps_any_pytree_and_wraps_every_array_output():
    def f(tree, scale):
        return {"sum": tree["a"] + tree["b"][0], "n": 3, "pair": (tree["a"] * scale, "s")}

    lf = tj.lift(f)
    a, b = tj.tensor([1.0, 2.0]), tj.tensor([3.0, 4.0])
    out = lf({"a": a, "b": [b]}, scale=tj.tensor(2.0))
    assert isinstance(out["sum"], Tensor) and isinstance(out["pair"][0], Tensor)
    assert out["n"] == 3 and out["pair"][1] == "s"
    np.testing.assert_array_equal(out["sum"].numpy(), [4.0, 6.0])
    assert lf.__name__ == "f"
    with pytest.raises(tj.TidyjaxTypeError, match="callable"):
        tj.lift(5)


def test_lifted_identity_on_a_raw_array_never_deletes_the_callers_array():
    mine = jnp.arange(3.0)
    with tidy():
        same = tnp.asarray(mine)  # jax returns the very same object
        assert same.array is mine
    assert same.is_disposed
    assert not mine.is_deleted()
    np.testing.assert_array_equal(mine, [0.0, 1.0, 2.0])


def test_namespaces_are_generated_from_jax():
    public = [n for n in dir(jnp) if not n.startswith("_")]
    assert set(public) <= set(dir(tnp))
    x = tnp.arange(6.0).reshape(2, 3)
    checks = [
        (tnp.sin(x), jnp.sin(jnp.arange(6.0).reshape(2, 3))),
        (tnp.linalg.norm(x), jnp.linalg.norm(jnp.arange(6.0).reshape(2, 3))),
        (tnp.fft.fft(x).real, jnp.fft.fft(jnp.arange(6.0).reshape(2, 3)).real),
        (tlax.exp(x), jnp.exp(jnp.arange(6.0).reshape(2, 3))),
        (tnn.relu(x - 2), jax.nn.relu(jnp.arange(6.0).reshape(2, 3) - 2)),
        (tnp.add.reduce(x), jnp.add.reduce(jnp.arange(6.0).reshape(2, 3))),
    ]
    for got, want in checks:
        assert isinstance(got, Tensor)
        np.testing.assert_allclose(got.numpy(), np.asarray(want), rtol=1e-6)
    assert tnp.float32 is jnp.float32 and tnp.pi == jnp.pi  # non-callables pass through
    assert tnp.shape(x) == (2, 3)  # non-array results pass through
    with pytest.raises(AttributeError, match="has none either"):
        tnp.no_such_function


def test_random_keys_are_tracked_tensors():
    with tidy() as scope:
        key = trandom.key(0)
        k1, _k2 = trandom.split(key)
        sample = trandom.normal(k1, (4,))
        assert isinstance(key, Tensor) and sample.shape == (4,)
        assert counts()[0] == 4  # key, k1, k2 (rows of the collected split array), sample
    assert key.is_disposed and scope.num_freed >= 3


def test_raw_jax_transformations_see_plain_jax_values():
    w = tj.tensor([1.0, 2.0, 3.0])
    seen = []

    def loss(w):  # inside plain jax.grad, nothing is tracked: ops give JAX's own tracers
        seen.append(w)
        out = w * w
        seen.append(out)
        return out.sum()

    g = jax.grad(loss)(w)  # the gradient has the input's structure: a tracked Tensor
    # What JAX rebuilds keeps its Tensor node (an untracked shell around the tracer, where
    # primitives take Tensors; the tracer itself on older JAX); what an op gives is JAX's own.
    given = seen[0].array if isinstance(seen[0], Tensor) else seen[0]
    assert isinstance(given, jax.core.Tracer) and isinstance(seen[1], jax.core.Tracer)
    assert isinstance(seen[0], Tensor) == BIND_CONVERSION
    assert isinstance(g, Tensor) and not g.is_disposed
    np.testing.assert_array_equal(g.numpy(), [2.0, 4.0, 6.0])
    np.testing.assert_array_equal(np.asarray(jax.jit(jax.grad(loss))(w)), [2.0, 4.0, 6.0])
    doubled = jax.jit(lambda t: t * 2)(w)  # a new output is JAX's own array
    assert type(doubled) in CONCRETE
    np.testing.assert_array_equal(np.asarray(doubled), [2.0, 4.0, 6.0])
    ones = tj.tensor(np.ones((3, 2), np.float32))
    rows = jax.vmap(lambda r: r.sum())(ones)
    np.testing.assert_array_equal(np.asarray(rows), [2.0, 2.0, 2.0])
    assert jnp.sin(w).shape == (3,)  # __jax_array__
    tj.dispose([w, g, ones])


def test_tidyjax_transformations_take_and_return_tensors():
    w = tj.tensor([1.0, 2.0])

    def loss(w, x):
        return ((w * x).sum() - 1.0) ** 2

    x = tj.tensor([3.0, 4.0])
    value, grads = tj.value_and_grad(loss)(w, x)
    assert isinstance(value, Tensor) and isinstance(grads, Tensor)
    np.testing.assert_allclose(value.item(), 100.0)
    np.testing.assert_allclose(tj.grad(loss)(w, x).numpy(), [60.0, 80.0])
    np.testing.assert_allclose(tj.jit(loss)(w, x).item(), 100.0)
    per_row = tj.vmap(lambda r: r.sum())(tj.tensor(np.ones((3, 2), np.float32)))
    assert isinstance(per_row, Tensor)
    raw_out = tj.jit(lambda a: jnp.tanh(a.array))(w)  # lax/jnp on the tracer inside
    assert isinstance(raw_out, Tensor)
    with pytest.raises(tj.TidyjaxTypeError, match="function"):
        tj.jit(3)


def test_scan_over_tensors():
    def body(carry, x):
        return carry + x, carry * x

    xs = tj.tensor([1.0, 2.0, 3.0])
    carry, ys = jax.lax.scan(body, 0.0, xs)  # raw lax.scan: JAX's own arrays come back
    assert carry.item() == 6.0 and type(ys) in CONCRETE
    with tidy():
        carry, ys = tj.lax.scan(body, tj.tensor(0.0), xs)  # the tidyjax form: tracked Tensors
        assert isinstance(carry, Tensor) and isinstance(ys, Tensor)
        np.testing.assert_array_equal(ys.numpy(), [0.0, 2.0, 9.0])
    assert carry.is_disposed and ys.is_disposed
    xs.dispose()


def test_no_tracer_ever_enters_the_registry():
    seen = []

    @jax.jit
    def f(t):
        y = t * 2 + 1
        seen.append(y)
        return y

    with tidy():
        x = tj.tensor([1.0])
        y = f(x)  # raw jax.jit: a new output is JAX's own array, no Tensor
        assert counts()[0] == 1  # the input only: no tracer
    assert x.is_disposed and type(y) in CONCRETE
    assert isinstance(seen[0], jax.core.Tracer)

    @tj.jit
    def g(t):
        y = t.mul(2).add(1)  # inside a tidyjax transformation, results chain as Tensors
        seen.append(y)
        return y

    with tidy():
        x = tj.tensor([1.0])
        y = g(x)
        assert counts()[0] == 2
        assert isinstance(seen[1], Tensor) and isinstance(seen[1].array, jax.core.Tracer)
        assert seen[1]._rec is not None  # untracked, not disposed: never counted
    assert y.is_disposed


def test_tree_map_identity_shares_buffers_without_double_free():
    params = {"w": tj.tensor([1.0, 2.0]), "b": tj.tensor([0.5])}
    with tidy():
        same = jax.tree_util.tree_map(lambda a: a, params)
        assert same["w"] is not params["w"] and same["w"].array is params["w"].array
        assert counts()[:2] == (4, 2)
    assert same["w"].is_disposed and not params["w"].is_disposed
    np.testing.assert_array_equal(params["w"].numpy(), [1.0, 2.0])
    tj.dispose(params)


def test_disposed_tensor_cannot_enter_a_transformation():
    t = tj.tensor([1.0])
    t.dispose()
    with pytest.raises(DisposedError):
        jax.jit(lambda a: a + 1)(t)


# -- donation ------------------------------------------------------------------------------


def test_donated_tensors_and_their_aliases_are_disposed_with_the_function_name():
    def update(params, g):
        return params - 0.1 * g

    step = tj.jit(update, donate_argnums=0)
    p = tj.tensor([1.0, 2.0])
    alias = p.clone()
    g = tj.tensor([1.0, 1.0])
    new = step(p, g)
    np.testing.assert_allclose(new.numpy(), [0.9, 1.9])
    for t in (p, alias):
        with pytest.raises(DisposedError, match="donated to jit-compiled function 'test_donat"):
            t.numpy()
        assert t.is_disposed
    assert not g.is_disposed
    assert counts()[:2] == (2, 2)  # g and new; the donated buffer is gone from the books
    tj.dispose([p, alias, g, new])


def test_donation_by_name_marks_the_argument():
    step = tj.jit(lambda params, lr: params * lr, donate_argnames="params")
    p = tj.tensor([1.0, 2.0])
    out = step(p, 2.0)
    assert p.is_disposed and not out.is_disposed
    q = tj.tensor([1.0, 2.0])
    out2 = step(params=q, lr=3.0)
    assert q.is_disposed
    tj.dispose([out, out2])


def test_unusable_donation_leaves_the_input_alive_and_memory_exact():
    total = tj.jit(lambda x: x.sum(), donate_argnums=0)  # shape differs: XLA cannot reuse it
    x = tj.tensor([1.0, 2.0, 3.0])
    with pytest.warns(UserWarning, match="donated buffers were not usable"):
        s = total(x)
    assert not x.is_disposed
    np.testing.assert_array_equal(x.numpy(), [1.0, 2.0, 3.0])
    assert counts() == (2, 2, 16)
    tj.dispose([x, s])


def test_variable_can_be_reassigned_after_its_buffer_was_donated():
    v = tj.Variable([1.0, 2.0], name="w")
    step = tj.jit(lambda w: w * 2, donate_argnums=0)
    new = step(v)
    assert v.is_disposed
    v.assign(new)
    np.testing.assert_array_equal(v.numpy(), [2.0, 4.0])
    tj.dispose([v, new])


def test_raw_jax_random_on_a_typed_key_tensor_names_the_fix_and_a_raw_key_works() -> None:
    """The guide's table (guide-jax.md): a typed key Tensor raises, naming tidyjax.random; a
    Tensor of a raw uint32 key is converted at the primitive like any other (JAX 0.10.2+)."""
    k = tj.tensor(jax.random.key(0))
    with pytest.raises(tj.TidyjaxValueError, match=r"tidyjax\.random\.split"):
        jax.random.split(k)
    if BIND_CONVERSION:
        raw = tj.tensor(jax.random.PRNGKey(0))
        got = jax.random.normal(raw, (2,))
        np.testing.assert_array_equal(got, jax.random.normal(jax.random.PRNGKey(0), (2,)))
        raw.dispose()
    k.dispose()
