"""One test per private JAX door (``tidyjax/_jaxdoors.py``): each fails loudly when JAX moves it."""

from __future__ import annotations

import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tidyjax as tj
from tidyjax import Tensor
from tidyjax._jaxdoors import (
    BIND_CONVERSION,
    JAX_KEY_CHECKS,
    JAX_OPERATORS,
    ArrayImpl,
    PRNGKeyArray,
    base_array,
    buffer_addresses,
    distributed_client,
    trace_of,
    trace_running,
)

_VERSION = tuple(int(p) for p in jax.__version__.split(".")[:3])


def test_array_impl():
    x = jnp.ones(2)
    assert type(x) is ArrayImpl and isinstance(x, jax.Array)


def test_prng_key_array():
    key = jax.random.key(0)
    assert PRNGKeyArray is not ArrayImpl, "JAX's typed key class moved: update _jaxdoors"
    assert type(key) is PRNGKeyArray
    assert jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key)


def test_base_array():
    key = jax.random.key(0)
    words = base_array(key)
    assert words is jax.random.key_data(key) and type(words) is ArrayImpl
    x = jnp.ones(2)
    assert base_array(x) is x


def test_jax_operators():
    """``raw * t`` is a tracked Tensor only while these are found."""
    assert JAX_OPERATORS
    assert jnp.ones(2).__mul__.__func__.__code__ in JAX_OPERATORS or any(
        c.co_name == "deferring_binary_op" for c in JAX_OPERATORS
    )
    t = tj.tensor([1.0, 2.0])
    out = jnp.ones(2) * t
    assert isinstance(out, Tensor)
    tj.dispose([t, out])


def test_jax_key_checks():
    assert JAX_KEY_CHECKS, "JAX's PRNG key-data check moved: update _jaxdoors._jax_key_check_codes"
    key = tj.random.key(0)
    with pytest.raises(tj.TidyjaxValueError, match=r"Call tidyjax\.random\.normal instead"):
        jax.random.normal(key, (2,))
    key.dispose()


def test_buffer_addresses():
    x = jnp.arange(4.0).block_until_ready()
    addresses = buffer_addresses(x)
    assert addresses == (x.unsafe_buffer_pointer(),)
    key = jax.random.key(0)
    assert buffer_addresses(base_array(key)) == (jax.random.key_data(key).unsafe_buffer_pointer(),)


def test_bind_conversion():
    """JAX 0.10.2 and later convert a Tensor at every primitive bind."""
    if _VERSION >= (0, 10, 2):
        assert BIND_CONVERSION, "JAX's bind-time conversion moved: update _jaxdoors"
    if not BIND_CONVERSION:
        pytest.skip("this JAX has no bind-time conversion")
    t = tj.tensor([0.0, 1.0])
    out = jax.lax.exp(t)
    assert type(out) is ArrayImpl
    np.testing.assert_allclose(np.asarray(out), np.exp([0.0, 1.0]), rtol=1e-6)
    t.dispose()


def test_type_tables():
    core = importlib.import_module("jax._src.core")
    assert Tensor in core.pytype_aval_mappings
    if BIND_CONVERSION:
        return
    t = tj.tensor([0.0, 1.0])
    with pytest.raises(tj.TidyjaxValueError, match=r"jax\.lax\.exp got a tidyjax Tensor"):
        jax.lax.exp(t)
    t.dispose()


def test_trace_running():
    seen = []

    def f(x):
        seen.append(trace_running())
        return x * 2

    assert not trace_running()
    jax.jit(f)(jnp.ones(2))
    jax.grad(lambda x: f(x).sum())(jnp.ones(2))
    assert seen == [True, True] and not trace_running()


def test_trace_of():
    seen = []

    def f(x, y):
        seen.append((trace_of(x), trace_of(y)))
        return x + y

    jax.jit(f)(jnp.ones(2), jnp.ones(2))
    ((a, b),) = seen
    assert a is not None and a is b


def test_distributed_client():
    """None before ``jax.distributed.initialize`` (tests/test_processes.py checks a real job)."""
    assert distributed_client() is None
