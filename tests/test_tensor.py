"""Tensor: construction, operators, methods, disposal, errors, and buffer aliasing.

Also: errors that name what was wrong with tensor()'s data or device, assign on a plain Tensor,
in-place operators, jax.Array's read-only attributes on a Tensor, and buffers deleted behind
tidyjax's back (deleted outside, donated by raw JAX)."""

from __future__ import annotations

import copy
import gc
import operator
import pickle
import re
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tidyjax as tj
from tidyjax import DisposedError, Tensor, TidyjaxTypeError, tidy

from .conftest import counts

DEV = jax.devices()[0]


def test_tensor_copies_so_the_users_array_survives_dispose():
    mine = jnp.arange(4.0)
    t = tj.tensor(mine)
    t.dispose()
    assert not mine.is_deleted()
    np.testing.assert_array_equal(mine, [0, 1, 2, 3])


def test_constructor_forms_and_dtype():
    a = tj.tensor([1, 2], dtype=jnp.float32)
    b = Tensor(np.array([1.5, 2.5]))
    c = tj.tensor(3)
    d = tj.tensor(a)  # a Tensor is copied, not shared
    assert a.dtype == jnp.float32 and a.shape == (2,) and a.ndim == 1 and a.size == 2
    assert a.nbytes == 8
    assert isinstance(b, Tensor) and c.shape == ()
    assert counts()[:2] == (4, 4)
    tj.dispose([a, b, c, d])


def test_tensor_on_a_device():
    dev = jax.devices()[0]
    t = tj.tensor([1.0], device=dev)
    assert t.devices() == {dev}
    t.dispose()


@pytest.mark.parametrize("bad", ["text", b"bytes", print])
def test_tensor_rejects_non_array_data(bad):
    with pytest.raises(TidyjaxTypeError, match="array-like"):
        tj.tensor(bad)
    assert counts() == (0, 0, 0)


def test_adopt_takes_ownership_without_copy():
    arr = jnp.arange(3.0)
    t = tj.adopt(arr)
    assert t.array is arr
    t.dispose()
    assert arr.is_deleted()


def test_adopt_rejects_bad_input():
    with pytest.raises(TidyjaxTypeError, match=r"jax\.Array"):
        tj.adopt([1, 2])
    t = tj.tensor([1.0])
    with pytest.raises(TidyjaxTypeError, match="clone"):
        tj.adopt(t)
    gone = jnp.ones(2)
    gone.delete()
    with pytest.raises(tj.TidyjaxValueError, match="deleted"):
        tj.adopt(gone)
    t.dispose()


BINARY = [
    operator.add, operator.sub, operator.mul, operator.truediv, operator.floordiv,
    operator.mod, operator.pow, operator.lt, operator.le, operator.gt, operator.ge,
    operator.eq, operator.ne,
]  # fmt: skip


@pytest.mark.parametrize("op", BINARY, ids=lambda f: f.__name__)
def test_binary_operators_match_jax_and_return_tracked_tensors(op):
    x, y = jnp.array([1.0, 2.0, 3.0]), jnp.array([2.0, 2.0, 5.0])
    a, b = tj.tensor(x), tj.tensor(y)
    pairs = [
        (op(a, b), op(x, y)),
        (op(a, 2.0), op(x, 2.0)),
        (op(2.0, a), op(2.0, x)),
        (op(a, y), op(x, y)),
    ]
    for got, want in pairs:
        assert isinstance(got, Tensor)
        np.testing.assert_allclose(got.numpy(), np.asarray(want))
    assert counts()[0] == 6
    tj.dispose([a, b, pairs])
    assert counts()[0] == 0


def test_numpy_on_the_left_defers_to_tensor():
    t = tj.tensor([1.0, 2.0])
    out = np.array([1.0, 1.0]) + t
    assert isinstance(out, Tensor)
    np.testing.assert_array_equal(out.numpy(), [2.0, 3.0])


def test_matmul_unary_bitwise_and_indexing():
    m = tj.tensor([[1.0, 2.0], [3.0, 4.0]])
    i = tj.tensor([1, 2, 3])
    np.testing.assert_array_equal((m @ m).numpy(), np.array([[7, 10], [15, 22]]))
    np.testing.assert_array_equal((-m).numpy(), -np.array([[1, 2], [3, 4]]))
    np.testing.assert_array_equal(abs(-m).numpy(), [[1, 2], [3, 4]])
    np.testing.assert_array_equal((~i).numpy(), ~np.array([1, 2, 3]))
    np.testing.assert_array_equal((i & 1).numpy(), [1, 0, 1])
    np.testing.assert_array_equal(m[0].numpy(), [1, 2])
    np.testing.assert_array_equal(m[:, tj.tensor([1, 0])].numpy(), [[2, 1], [4, 3]])
    np.testing.assert_array_equal(m.T.numpy(), [[1, 3], [2, 4]])
    rows = list(m)
    assert len(rows) == len(m) == 2 and all(isinstance(r, Tensor) for r in rows)
    assert m.at[0, 0].set(9.0).numpy()[0, 0] == 9.0
    with pytest.raises(TidyjaxTypeError, match=r"\.at\[index\]\.set"):
        m[0] = 1.0


def test_methods_match_jax():
    x = jnp.array([[1.0, 4.0], [9.0, 16.0]])
    t = tj.tensor(x)
    cases = {
        "add": (t.add(1.0), x + 1), "sub": (t.sub(t), x - x), "mul": (t.mul(2.0), x * 2),
        "div": (t.div(2.0), x / 2), "matmul": (t.matmul(t), x @ x),
        "square": (t.square(), x**2), "sum": (t.sum(), x.sum()),
        "sum_axis": (t.sum(axis=0), x.sum(axis=0)), "mean": (t.mean(), x.mean()),
        "max": (t.max(), x.max()), "min": (t.min(), x.min()),
        "reshape": (t.reshape(4), x.reshape(4)), "astype": (t.astype(jnp.int32), x.astype(int)),
        "transpose": (t.transpose(), x.T), "exp": (t.exp(), jnp.exp(x)),
        "log": (t.log(), jnp.log(x)), "sqrt": (t.sqrt(), jnp.sqrt(x)), "abs": (t.abs(), abs(x)),
    }  # fmt: skip
    for name, (got, want) in cases.items():
        assert isinstance(got, Tensor), name
        np.testing.assert_allclose(got.numpy(), np.asarray(want), rtol=1e-6, err_msg=name)
    assert t.item(0) == 1.0 and t.tolist() == [[1.0, 4.0], [9.0, 16.0]]
    assert float(t.sum()) == 30.0 and int(t[0, 1]) == 4 and bool(t[0, 0])
    assert np.asarray(t).shape == (2, 2)


def test_every_result_is_tracked_in_the_current_scope():
    t = tj.tensor([1.0, 2.0])
    with tidy() as scope:
        results = [t + 1, t.sum(), t.exp(), t[0], t.reshape(2, 1), t.argmax()]
    assert all(r.is_disposed for r in results)
    assert scope.num_freed == len(results)
    assert not t.is_disposed


def test_dispose_deletes_the_buffer_and_is_idempotent():
    t = tj.tensor([1.0, 2.0, 3.0])
    arr = t.array
    t.dispose()
    t.dispose()
    assert t.is_disposed and arr.is_deleted()
    assert counts() == (0, 0, 0)


def test_use_after_dispose_raises_disposed_error_naming_the_tensor():
    t = tj.tensor(np.zeros((3, 4), np.float32))
    t.dispose()
    for use in (lambda: t + 1, lambda: t.sum(), lambda: t.numpy(), lambda: t.nbytes,
                lambda: t.array, lambda: t[0], lambda: float(t), lambda: 1 + t):  # fmt: skip
        with pytest.raises(DisposedError) as err:
            use()
        msg = str(err.value)
        assert "float32[3,4]" in msg and "disposed explicitly" in msg and "clone()" in msg
    assert isinstance(err.value, RuntimeError)
    # Only the data is gone: shape and dtype stay readable, as for a deleted jax.Array.
    assert (t.shape, t.dtype, t.ndim, t.size) == ((3, 4), np.float32, 2, 12)


def test_disposed_argument_raises_even_when_its_buffer_is_shared():
    # TF.js silently uses a disposed argument whose buffer is shared; tidyjax does not.
    a = tj.tensor([1.0, 2.0])
    b = a.clone()
    b.dispose()
    with pytest.raises(DisposedError):
        a + b
    np.testing.assert_array_equal((a + 1).numpy(), [2.0, 3.0])
    a.dispose()


def test_disposed_error_names_the_scope_that_freed_it():
    with tidy("train_step"):
        t = tj.tensor([1.0])
    with pytest.raises(DisposedError, match=r"scope 'train_step' exited.*scope\.keep"):
        t.numpy()


def test_repr_and_str_of_live_and_disposed_tensors():
    t = tj.tensor([1.0, 2.0])
    assert repr(t) == "Tensor([1., 2.], dtype=float32)"
    assert str(t) == "[1. 2.]"
    t.dispose()
    assert "disposed" in repr(t) and "float32[2]" in repr(t)
    assert "disposed" in str(t)
    assert f"{tj.tensor(1.5):.2f}" == "1.50"


def test_tensors_are_unhashable_like_jax_arrays():
    with pytest.raises(TypeError):
        hash(tj.tensor([1.0]))


def test_copy_deepcopy_and_pickle_count_as_new_tensors():
    t = tj.tensor([1.0, 2.0])
    shallow = copy.copy(t)
    deep = copy.deepcopy(t)
    loaded = pickle.loads(pickle.dumps(t))
    assert counts()[:2] == (4, 3)  # shallow shares t's buffer
    t.dispose()
    np.testing.assert_array_equal(shallow.numpy(), [1.0, 2.0])
    np.testing.assert_array_equal(deep.numpy(), [1.0, 2.0])
    np.testing.assert_array_equal(loaded.numpy(), [1.0, 2.0])
    tj.dispose([shallow, deep, loaded])


# -- aliasing: many jax operations hand back the same buffer ----------------------------------

ALIASING = {
    "clone": lambda t: t.clone(),
    "astype same dtype": lambda t: t.astype(t.dtype),
    "x[...]": lambda t: t[...],
    "x[:]": lambda t: t[:],
    "to(same device)": lambda t: t.to(jax.devices()[0]),
    "adopt(jnp.asarray)": lambda t: tj.adopt(jnp.asarray(t.array)),
    "adopt(device_put same device)": lambda t: tj.adopt(jax.device_put(t.array, jax.devices()[0])),
}


@pytest.mark.parametrize("make_alias", ALIASING.values(), ids=ALIASING.keys())
def test_disposing_one_alias_keeps_the_other_readable(make_alias):
    a = tj.tensor([1.0, 2.0, 3.0])
    b = make_alias(a)
    assert counts() == (2, 1, 12)  # two tensors, one buffer, its bytes counted once
    a.dispose()
    assert not b.array.is_deleted()
    np.testing.assert_array_equal(b.numpy(), [1.0, 2.0, 3.0])
    assert counts() == (1, 1, 12)
    b.dispose()
    assert counts() == (0, 0, 0)


def test_scope_freeing_an_alias_of_an_outer_tensor_keeps_the_buffer():
    a = tj.tensor([1.0, 2.0])
    with tidy():
        b = a[...]
        c = a.clone()
    assert b.is_disposed and c.is_disposed
    assert not a.array.is_deleted()
    np.testing.assert_array_equal(a.numpy(), [1.0, 2.0])
    a.dispose()


def test_collected_tensor_stops_counting_but_its_escaped_array_stays_tracked():
    before = tj.memory()  # earlier tests' libraries (JAX's caches) may hold raw arrays
    t = tj.tensor([1.0, 2.0])
    arr = t.array
    del t
    assert counts() == (0, 1, 8)  # no Tensor, but tidyjax made the buffer: still its bytes
    assert not arr.is_deleted()  # outside every scope, the user's reference keeps it
    info = tj.memory()
    assert info.untracked_arrays == before.untracked_arrays  # counted as tidyjax's, not raw
    assert info.unreliable == before.unreliable
    del arr
    assert counts() == (0, 0, 0)  # JAX freed it with the last reference; memory() follows


def test_buffer_deleted_outside_tidyjax_is_reported_not_reused():
    t = tj.tensor([1.0, 2.0])
    t.array.delete()
    info = tj.memory()
    assert info.unreliable and any("outside tidyjax" in r for r in info.reasons)
    u = tj.tensor([3.0, 4.0])  # may land at the same address: must get a record of its own
    np.testing.assert_array_equal(u.numpy(), [3.0, 4.0])
    tj.dispose([t, u])
    assert counts() == (0, 0, 0)


def test_many_buffers_trigger_the_sweep_without_losing_live_ones():
    keep_alive = [tj.tensor([float(i)]) for i in range(3000)]
    for i in range(3000):  # dropped at once: stale records for the sweep to remove
        tj.tensor([float(i)])
    more = [tj.tensor([float(i)]) for i in range(3000)]  # crosses the sweep threshold
    assert counts()[:2] == (6000, 6000)
    assert keep_alive[1234].item() == 1234.0 and more[2999].item() == 2999.0
    tj.dispose([keep_alive, more])
    assert counts() == (0, 0, 0)


def test_disposed_alias_does_not_keep_a_collected_holders_buffer_alive():
    # Found by the model-based test: b disposed while a lives, then a collected undisposed.
    a = tj.tensor([1.0, 2.0])
    b = a.clone()
    arr = weakref.ref(a.array)
    b.dispose()
    del a
    gc.collect()
    assert arr() is None  # nothing of tidyjax's keeps the buffer: JAX freed it
    assert "float32[2]" in repr(b)  # the disposed alias still describes itself
    with pytest.raises(DisposedError, match=r"float32\[2\]"):
        b.numpy()


@pytest.mark.parametrize(
    ("data", "error", "match"),
    [
        (None, TidyjaxTypeError, "array-like data"),
        ([[1, 2], [3]], tj.TidyjaxValueError, "ragged.*same length"),
    ],
    ids=["None", "ragged"],
)
def test_tensor_rejects_bad_data_with_a_tidyjax_error(data, error, match):
    with pytest.raises(error, match=match):
        tj.tensor(data)
    assert counts() == (0, 0, 0)


def test_adopt_of_a_deleted_typed_key_is_a_tidyjax_error():
    k = jax.random.key(0)
    k.delete()
    with pytest.raises(tj.TidyjaxValueError, match="deleted"):
        tj.adopt(k)


def _same(a, b):
    """Same values, dtype, weak type and shape as raw JAX."""
    a, b = jnp.asarray(a), jnp.asarray(b)
    assert a.dtype == b.dtype and a.shape == b.shape
    assert a.aval.weak_type == b.aval.weak_type
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def _same_outcome(tidy_call, raw_call):
    """The tidyjax call gives what raw JAX gives: the same result, or the same error type."""
    try:
        want = raw_call()
    except Exception as e:
        with pytest.raises(type(e)):
            tidy_call()
        return
    got = tidy_call()
    _same(got.array, want)
    got.dispose()


OPERANDS = {
    "f32": lambda: jnp.array([1.5, -2.0, 3.0], jnp.float32),
    "i32": lambda: jnp.array([7, -3, 2], jnp.int32),
    "i8": lambda: jnp.array([100, -3, 2], jnp.int8),
    "bf16": lambda: jnp.array([1.5, 2.0, -3.0], jnp.bfloat16),
    "weak f32 scalar": lambda: jnp.asarray(2.0),
    "f32 row": lambda: jnp.ones((2, 3), jnp.float32),
}
OTHERS = {  # made per test: a module-level jax array would count as untracked in other tests
    "py float": lambda: 2.5,
    "py int": lambda: 3,
    "big py int": lambda: 1000,
    "f32": lambda: jnp.array([0.5, 2.0, 4.0], jnp.float32),
    "column": lambda: jnp.ones((2, 1), jnp.float32),
}
JIT_OPS = [operator.add, operator.truediv, operator.floordiv, operator.mod, operator.pow,
           operator.lt]  # fmt: skip


@pytest.mark.parametrize("op", JIT_OPS, ids=lambda o: o.__name__)
@pytest.mark.parametrize("left", OPERANDS, ids=str)
@pytest.mark.parametrize("right", OTHERS, ids=str)
def test_jit_dispatched_operators_match_raw_jax(op, left, right):
    """Operators run through a cached jax.jit: results and errors are JAX's own."""
    a = OPERANDS[left]()
    b = OTHERS[right]()
    t = tj.tensor(a)
    other = tj.tensor(b) if isinstance(b, jax.Array) else b
    _same_outcome(lambda: op(t, other), lambda: op(a, b))
    _same_outcome(lambda: op(other, t), lambda: op(b, a))  # the reflected operator
    tj.dispose([t, other])


@pytest.mark.parametrize("fn", [operator.neg, operator.abs, operator.invert, operator.pos])
@pytest.mark.parametrize("left", OPERANDS, ids=str)
def test_jit_dispatched_unary_operators_match_raw_jax(fn, left):
    a = OPERANDS[left]()
    t = tj.tensor(a)
    _same_outcome(lambda: fn(t), lambda: fn(a))
    t.dispose()


@pytest.mark.parametrize(
    "method", ["sum", "mean", "max", "argmin", "cumsum", "ravel", "std", "sort", "all"]
)
def test_jit_dispatched_methods_match_raw_jax(method):
    a = jnp.array([[3, 1, 2], [6, 5, 4]], jnp.int32)
    t = tj.tensor(a)
    got = getattr(t, method)()
    _same(got.array, getattr(a, method)())
    tj.dispose([t, got])


@pytest.mark.parametrize(
    "index",
    [1, -1, slice(1, None), (0, 1), (Ellipsis, 0), None, np.array([1, 0]), (slice(None), None)],
    ids=str,
)
def test_indexing_forms_match_raw_jax(index):
    a = jnp.arange(6.0).reshape(2, 3)
    t = tj.tensor(a)
    got = t[index]
    _same(got.array, a[index])
    tj.dispose([t, got])


# -- a raw same-device device_put alias, and in-place operators -----------------------------------


def test_disposing_a_raw_device_put_alias_keeps_the_original_and_the_last_holder_frees():
    t = tj.tensor([3.0, 4.0])
    raw = t.array
    y = jax.device_put(t, DEV)
    assert counts()[:2] == (2, 1)
    y.dispose()
    np.testing.assert_array_equal(t.numpy(), [3.0, 4.0])
    t.dispose()
    assert raw.is_deleted()
    assert counts() == (0, 0, 0)


def test_in_place_operators_on_a_plain_tensor_rebind_like_jax_array():
    t = tj.tensor([1.0])
    before = t
    t += 1.0
    assert t is not before
    np.testing.assert_array_equal(before.numpy(), [1.0])
    tj.dispose([t, before])


# -- tensor(): what was wrong with the data or the device -----------------------------------------


def test_tensor_of_none_names_the_element_and_the_fix():
    with pytest.raises(tj.TidyjaxTypeError, match=r"None at data\[0\] .*None is not a number") as e:
        tj.tensor([None, 1.0])
    assert "float('nan')" in str(e.value) and "mask" in str(e.value)
    assert "ragged" not in str(e.value)
    with pytest.raises(tj.TidyjaxTypeError, match=r"None at data\[1\]\[0\] "):
        tj.tensor([[1.0, 2.0], [None]])
    with pytest.raises(tj.TidyjaxValueError, match="ragged nested sequence"):
        tj.tensor([[1, 2], [3]])  # really ragged: the message stays


def test_tensor_device_must_be_a_device_or_sharding():
    with pytest.raises(tj.TidyjaxTypeError) as e:
        tj.tensor([1.0], device="cpu")
    text = str(e.value)
    assert "jax.Device or a jax.sharding.Sharding" in text and "jax.devices('cpu')[0]" in text
    assert "got str 'cpu'" in text
    with pytest.raises(tj.TidyjaxTypeError, match=re.escape("jax.devices('cpu')[1]")):
        tj.tensor([1.0], device="cpu:1")
    with pytest.raises(tj.TidyjaxTypeError, match=r"jax\.Device or a jax\.sharding\.Sharding"):
        tj.tensor([1.0], device=object())
    t = tj.tensor([1.0], device=jax.devices("cpu")[0])
    assert t.device == jax.devices("cpu")[0]
    t.dispose()


# -- assign on a plain Tensor ---------------------------------------------------------------------


def test_assign_on_a_plain_tensor_says_tensors_are_immutable():
    t = tj.tensor([1.0, 2.0])
    expected = (
        f"Tensor float32[2] (id {t.id}) is not a Variable; Tensors are immutable, like "
        "jax.Array. Make a Variable with tidyjax.Variable(t) to assign to it, or use the new "
        "value directly."
    )
    with pytest.raises(tj.TidyjaxTypeError) as e:
        t.assign(t * 2.0)
    assert str(e.value) == expected
    with pytest.raises(tj.TidyjaxTypeError, match="has no name to set"):
        t.name = "w"  # the other messages are unchanged
    t.dispose()


# -- a Tensor reads like a jax.Array --------------------------------------------------------------


SAME = ["itemsize", "committed", "weak_type", "is_fully_addressable", "is_fully_replicated",
        "format", "dtype", "shape", "ndim", "size", "nbytes", "sharding"]  # fmt: skip


@pytest.mark.parametrize("data", [[1.0, -2.5, 3.25], 1.0])
def test_tensor_metadata_matches_its_array(data):
    t = tj.tensor(data)
    a = t.array
    for name in SAME:
        assert getattr(t, name) == getattr(a, name), name
    assert t.is_ready() is a.is_ready() is True
    assert t.on_device_size_in_bytes() == a.on_device_size_in_bytes()
    assert t.copy_to_host_async() is None
    assert t.tobytes() == a.tobytes()
    assert t.__dlpack_device__() == a.__dlpack_device__()
    np.testing.assert_array_equal(np.from_dlpack(t), np.asarray(a))
    shards, raw = t.addressable_shards, a.addressable_shards
    assert [(s.device, s.index) for s in shards] == [(s.device, s.index) for s in raw]
    np.testing.assert_array_equal(np.asarray(shards[0].data), np.asarray(a))
    assert [s.device for s in t.global_shards] == [s.device for s in a.global_shards]
    np.testing.assert_array_equal(np.asarray(t.addressable_data(0)), np.asarray(a))
    assert t.is_deleted() is False
    t.dispose()


def test_round_in_and_mt_give_what_jax_array_gives():
    t = tj.tensor([[1.26, -2.5], [3.75, 0.1]])
    a = t.array
    for got, want in [(round(t), round(a)), (round(t, 1), round(a, 1)), (t.mT, a.mT)]:
        assert isinstance(got, tj.Tensor) and not got.is_disposed
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got.numpy(), np.asarray(want))
        got.dispose()
    row = t[0]
    assert (-2.5 in row) is True and (7.0 in row) is False
    with tj.tidy():
        r = round(t)
    assert r.is_disposed  # tracked: freed by its scope like every op result
    row.dispose()
    t.dispose()


def test_array_attributes_of_a_disposed_tensor():
    t = tj.tensor([1.0, 2.0])
    t.dispose()
    assert (t.itemsize, t.shape, t.dtype) == (4, (2,), jnp.float32)  # metadata stays
    for read in [lambda: t.committed, lambda: t.weak_type, lambda: t.is_ready(),
                 lambda: t.addressable_shards, lambda: t.copy_to_host_async(),
                 lambda: t.is_fully_replicated, lambda: np.from_dlpack(t),
                 lambda: t.__dlpack_device__(), lambda: round(t), lambda: t.tobytes()]:  # fmt: skip
        with pytest.raises(tj.DisposedError, match="disposed explicitly"):
            read()
    assert t.is_deleted() is True


def test_delete_on_a_tensor_points_to_dispose():
    t = tj.tensor([1.0, 2.0])
    with pytest.raises(tj.TidyjaxTypeError, match=r"has no delete\(\).*t\.dispose\(\)"):
        t.delete()
    assert not t.is_disposed and t.numpy().tolist() == [1.0, 2.0]
    t.dispose()


# -- buffers deleted behind tidyjax's back --------------------------------------------------------


def test_is_disposed_notices_a_buffer_deleted_outside():
    t = tj.tensor([1.0, 2.0])
    t.array.delete()
    assert t.is_disposed  # before any use
    with pytest.raises(tj.DisposedError, match="deleted outside tidyjax"):
        t.numpy()
    t.dispose()


def test_is_disposed_notices_a_raw_donation():
    t = tj.tensor([1.0, 2.0])
    out = jax.jit(lambda x: x * 2, donate_argnums=0)(t.array)
    if not t._array.is_deleted():
        pytest.skip("this backend does not donate")
    assert t.is_disposed
    assert t.is_deleted()
    with pytest.raises(tj.DisposedError, match="deleted outside tidyjax"):
        t + 1.0
    np.testing.assert_array_equal(np.asarray(out), [2.0, 4.0])
    t.dispose()
