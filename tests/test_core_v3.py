"""Core v3: nothing freed under a live reference, TensorFlow.js's object rule, generators,
out-of-order exits, unregistered containers and in-place operators on Variables.

Each test here failed on the code before this change (issue 19)."""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import os
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

import tidyjax as tj
from tidyjax import DisposedError, TidyjaxTypeError, TidyjaxValueError
from tidyjax._context import CURRENT

from .conftest import counts

DEV = jax.devices()[0]


# -- 1.1 a second array object over a buffer, made by raw JAX ---------------------------------


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda x: jax.device_put(x, DEV), id="device_put(tensor)"),
        pytest.param(lambda x: tj.tensors(jax.device_put(tj.arrays([x]), DEV))[0], id="tensors"),
        pytest.param(
            lambda x: jax.tree.map(lambda a: jax.device_put(a, DEV), {"w": x})["w"],
            id="tree.map",
        ),
    ],
)
@pytest.mark.parametrize("holder", ["variable", "kept", "outer"])
def test_a_scope_never_deletes_a_buffer_a_raw_same_device_put_shares(make, holder):
    base = tj.tensor([1.0, 2.0])
    held = {"variable": lambda: tj.Variable(base), "kept": lambda: tj.keep(base.clone())}.get(
        holder, lambda: base
    )()
    with tj.tidy():
        alias = make(held)
        assert isinstance(alias, tj.Tensor)
        # One buffer, however many array objects are over it.
        assert counts()[1] == 1
    assert alias.is_disposed  # the scope's Tensor object goes...
    assert not held.is_disposed  # ...the buffer others hold stays
    np.testing.assert_array_equal(held.numpy(), [1.0, 2.0])
    tj.dispose([base, held])
    assert counts() == (0, 0, 0)


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


# -- 1.2 generators ------------------------------------------------------------------------------


def test_a_tensor_made_by_the_caller_is_never_owned_by_a_suspended_generators_scope():
    def batches():
        with tj.tidy("gen"):
            for i in range(3):
                yield tj.tensor([float(i)])

    gen = batches()
    first = next(gen)
    mine = tj.tensor([10.0])  # made while the generator is suspended inside its scope
    next(gen)
    gen.close()  # the generator's scope exits: it frees what it made, not what I made
    assert first.is_disposed
    np.testing.assert_array_equal(mine.numpy(), [10.0])
    assert CURRENT.get() is None
    mine.dispose()


def test_an_abandoned_generator_frees_its_own_buffers_when_collected():
    def gen():
        with tj.tidy():
            yield tj.tensor([1.0])
            yield tj.tensor([2.0])

    g = gen()
    item = next(g)
    mine = tj.tensor([5.0])
    del g
    gc.collect()
    assert item.is_disposed and not mine.is_disposed
    assert CURRENT.get() is None
    mine.dispose()


def test_an_outer_scope_exits_cleanly_around_a_suspended_generators_scope():
    def gen():
        with tj.tidy("gen"):
            yield tj.tensor([1.0])
            yield tj.tensor([2.0])

    g = gen()
    with tj.tidy("outer"):
        next(g)
        inside = tj.tensor([3.0])  # the outer scope's
    assert inside.is_disposed
    after = tj.tensor([4.0])  # top level: owned by no scope
    assert tj._tensor.scope_path(after) is None
    g.close()
    assert not after.is_disposed
    after.dispose()
    assert CURRENT.get() is None


def test_tidy_on_a_generator_function_runs_each_resume_in_its_own_scope():
    made = []

    @tj.tidy
    def squares(xs):
        for x in xs:
            tmp = x * 1.0  # a temporary of the generator's scope
            made.append(tmp)
            yield tmp * tmp

    xs = tj.tensor([1.0, 2.0, 3.0])
    with tj.tidy("caller") as caller:
        out = [caller.keep(y) for y in squares(xs)]  # each item is the caller's
    assert [float(y.numpy()) for y in out] == [1.0, 4.0, 9.0]
    assert all(t.is_disposed for t in made)  # freed when the generator finished
    tj.dispose([xs, out])
    assert counts() == (0, 0, 0)


def test_a_generator_driven_as_a_context_manager_wraps_the_with_block():
    @contextlib.contextmanager
    def scoped():
        with tj.tidy("cm"):
            yield

    with scoped():
        t = tj.tensor([1.0])
    assert t.is_disposed


def test_a_suspended_generator_at_interpreter_exit_prints_nothing():
    script = textwrap.dedent(
        """
        import tidyjax as tj
        def gen():
            with tj.tidy():
                yield tj.tensor([1.0])
        g = gen()
        x = next(g)
        y = tj.tensor([2.0])
        """
    )
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env
    )
    assert proc.returncode == 0, proc.stderr
    assert "Exception ignored" not in proc.stderr, proc.stderr


# -- 1.4 containers JAX does not know ------------------------------------------------------------


@dataclasses.dataclass
class Plain:  # not registered as a pytree
    w: tj.Tensor
    b: tj.Tensor


class Holder:
    def __init__(self, items):
        self.items = items


def test_an_unregistered_container_returned_or_kept_keeps_its_tensors():
    out = tj.tidy.run(lambda: Plain(tj.tensor([1.0]), tj.tensor([2.0])))
    assert not out.w.is_disposed and not out.b.is_disposed
    with tj.tidy() as s:
        held = s.keep(Holder([tj.tensor([3.0]), {"x": tj.tensor([4.0])}]))
    assert not held.items[0].is_disposed and not held.items[1]["x"].is_disposed
    tj.dispose([out, held])  # dispose finds them the same way
    assert held.items[0].is_disposed
    assert counts() == (0, 0, 0)


@pytest.mark.parametrize("value", ["x", object(), 3])
def test_keep_of_a_value_holding_nothing_raises(value):
    with pytest.raises(TidyjaxTypeError, match="nothing to keep"):
        tj.keep(value)
    with pytest.raises(TidyjaxTypeError, match="nothing to keep"), tj.tidy() as s:
        s.keep(value)
    assert tj.keep(None) is None and tj.keep([]) == []  # empty containers are fine


# -- 1.5 in-place operators on a Variable ------------------------------------------------------


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


def test_in_place_operators_on_a_plain_tensor_rebind_like_jax_array():
    t = tj.tensor([1.0])
    before = t
    t += 1.0
    assert t is not before
    np.testing.assert_array_equal(before.numpy(), [1.0])
    tj.dispose([t, before])


# -- 2: TensorFlow.js's object rule and the buffer rule, together ---------------------------------


def test_a_tensor_not_returned_is_disposed_though_its_buffer_leaves_through_a_clone():
    with tj.tidy() as s:
        a = tj.tensor([1.0, 2.0])
        b = s.keep(a.clone())
    assert a.is_disposed and not b.is_disposed
    assert counts()[:2] == (1, 1)  # TF.js: numTensors 1
    b.dispose()


def test_a_clone_handed_out_one_level_is_disposed_by_the_middle_scope():
    outer = tj.tensor([1.0, 2.0])
    with tj.tidy():
        with tj.tidy() as inner:
            t = inner.keep(outer.clone())
        assert not t.is_disposed
    assert t.is_disposed and not outer.is_disposed
    outer.dispose()


@pytest.mark.parametrize("let_go", ["assign", "dispose"])
def test_a_buffer_a_variable_lets_go_is_its_creating_scopes_again(let_go):
    with tj.tidy():
        t = tj.tensor([1.0, 2.0])
        raw = t.array
        v = tj.Variable(t)
        if let_go == "assign":
            v.assign(tj.tensor([3.0, 4.0]))
        else:
            v.dispose()
    assert raw.is_deleted()  # the scope made it and nothing kept it
    assert counts()[:2] == ((1, 1) if let_go == "assign" else (0, 0))
    v.dispose()


# -- 4: honest errors ----------------------------------------------------------------------------


def test_dispose_of_a_raw_array_returned_from_a_scope_deletes_it():
    raw = tj.tidy.run(lambda: (tj.tensor([1.0]) * 2).array)
    assert counts()[1] == 1  # the scope handed the buffer out
    tj.dispose(raw)
    assert raw.is_deleted() and counts() == (0, 0, 0)
    t = tj.tensor([1.0])
    with pytest.raises(TidyjaxValueError, match="1 live Tensor"):
        tj.dispose(t.array)
    t.dispose()
    with pytest.raises(DisposedError):
        t.numpy()
