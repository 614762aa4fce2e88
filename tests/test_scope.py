"""tidy in every form, keep, dispose, pytree results, errors, threads and asyncio tasks.

Also: nothing freed that a raw same-device ``device_put`` shares, generators (suspended, abandoned,
decorated, closed at interpreter exit), containers JAX does not know, TensorFlow.js's object
rule next to the buffer rule, and dispose of a raw array a scope handed out."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import gc
import os
import pickle
import subprocess
import sys
import textwrap
import threading
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tidyjax as tj
from tidyjax import (
    DisposedError,
    ScopeError,
    Tensor,
    TidyjaxTypeError,
    TidyjaxValueError,
    keep,
    tidy,
)
from tidyjax._context import CURRENT
from tidyjax._tensor import scope_path

from .conftest import counts

DEV = jax.devices()[0]


def test_nothing_is_freed_outside_every_scope():
    a = tj.tensor([1.0])
    b = a + 1
    assert counts()[0] == 2
    assert not a.is_disposed and not b.is_disposed
    tj.dispose([a, b])


def test_with_block_frees_everything_created_inside():
    with tidy() as scope:
        x = tj.tensor([1.0, 2.0])
        y = x * 2
        z = y + x
    assert all(t.is_disposed for t in (x, y, z))
    assert (scope.num_freed, scope.bytes_freed, scope.num_handed_out) == (3, 24, 0)
    assert counts() == (0, 0, 0)
    assert "exited" in repr(scope) and "freed 3 buffers" in repr(scope)


def test_scope_keep_hands_values_out_like_a_return():
    with tidy("outer"):
        with tidy("inner") as inner:
            a = tj.tensor([1.0])
            kept = inner.keep(a * 3)
            pair = inner.keep(a + 1, a + 2)
        assert a.is_disposed and not kept.is_disposed and len(pair) == 2
        assert inner.num_handed_out == 3
    # handed out one level only: the outer scope then frees them
    assert kept.is_disposed and all(p.is_disposed for p in pair)


def test_scope_keep_outside_the_block_is_an_error():
    with tidy() as scope:
        pass
    with pytest.raises(ScopeError, match="not open"):
        scope.keep(1)


def test_outer_tensors_used_inside_are_never_touched():
    a = tj.tensor([1.0, 2.0])
    with tidy():
        b = a + 1
        with tidy():
            c = a * b
    assert not a.is_disposed and b.is_disposed and c.is_disposed
    np.testing.assert_array_equal(a.numpy(), [1.0, 2.0])
    a.dispose()


def test_exception_inside_a_scope_frees_and_propagates():
    with pytest.raises(ZeroDivisionError), tidy():
        t = tj.tensor([1.0])
        1 / 0
    assert t.is_disposed and counts() == (0, 0, 0)

    @tidy
    def boom():
        boom.made = tj.tensor([2.0])
        raise ValueError("bad")

    with pytest.raises(ValueError, match="bad"):
        boom()
    assert boom.made.is_disposed and counts() == (0, 0, 0)


class Pair(NamedTuple):
    left: object
    right: object


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Params:
    w: object
    b: object


def test_deep_pytree_results_move_to_the_enclosing_scope_one_level_per_return():
    @tidy("make")
    def make():
        x = tj.tensor([1.0, 2.0])
        tmp = x * 10
        make.tmp = tmp
        return {
            "list": [x + 1, (x + 2, [x + 3])],
            "pair": Pair(x + 4, "label"),
            "params": Params(w=x + 5, b=None),
            "n": 7,
        }

    with tidy("outer") as outer:
        out = make()
        assert make.tmp.is_disposed
        leaves = [out["list"][0], out["list"][1][0], out["list"][1][1][0], out["pair"].left,
                  out["params"].w]  # fmt: skip
        assert all(isinstance(t, Tensor) and not t.is_disposed for t in leaves)
        assert out["n"] == 7 and out["pair"].right == "label" and out["params"].b is None
        assert counts()[0] == 5
    assert all(t.is_disposed for t in leaves)  # the outer scope did not return them
    assert outer.num_freed == 5


def test_returned_tensor_leaves_the_outermost_scope_untracked():
    r = tidy.run(lambda: tj.tensor([1.0]) + 1)
    with tidy():
        pass
    assert not r.is_disposed
    r.dispose()


def test_keep_protects_from_every_scope_until_disposed():
    with tidy(), tidy():
        k = keep(tj.tensor([1.0]))
        tree = keep({"a": tj.tensor([2.0]), "n": 3})
    assert not k.is_disposed and not tree["a"].is_disposed
    assert counts()[0] == 2
    tj.dispose([k, tree])
    assert counts() == (0, 0, 0)


def test_disposed_then_returned_stays_disposed_and_double_dispose_is_a_noop():
    def body():
        t = tj.tensor([1.0])
        t.dispose()
        t.dispose()
        return t

    t = tidy.run(body)
    assert t.is_disposed
    with pytest.raises(DisposedError):
        t.numpy()
    tj.dispose(t)


def test_dispose_ignores_non_tensor_leaves():
    a, b = tj.tensor([1.0]), tj.tensor([2.0])
    tj.dispose({"a": a, "rest": [b, 3, "x", None]})
    assert a.is_disposed and b.is_disposed


def test_decorator_forms_and_run_forms():
    @tidy
    def plain(x):
        plain.tmp = x * 2
        return plain.tmp + 1

    @tidy("named")
    def named(x):
        return x - 1

    @tidy()
    def called(x):
        return x + 0

    x = tj.tensor([1.0])
    outs = [plain(x), named(x), called(x), tidy.run(lambda v: v * 5, x),
            tidy.run("n", lambda v, k: v * k, x, k=3)]  # fmt: skip
    assert plain.tmp.is_disposed and plain.__name__ == "plain"
    np.testing.assert_array_equal([o.item() for o in outs], [3.0, 0.0, 1.0, 5.0, 3.0])
    tj.dispose([x, outs])


def test_bare_with_tidy_works_too():
    with tidy as scope:
        t = tj.tensor([1.0])
    assert t.is_disposed and scope.num_freed == 1


def test_scope_paths_nest():
    paths = []
    with tidy("train"):
        with tidy("step") as s:
            paths.append(s.path)
        with tidy() as anon:
            paths.append(anon.path)
    assert paths == ["train/step", "train/<tidy>"]


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: tidy.run("name"), "name but no function"),
        (lambda: tidy.run(4, print), "where the function should be"),
        (lambda: tidy.run("n", "x"), "where the function should be"),
        (lambda: tidy.run(), "needs a function"),
        (lambda: tidy(42), "scope name"),
        (lambda: tidy(3.5), "scope name"),
    ],
)
def test_bad_arguments_raise_type_errors(call, match):
    with pytest.raises(TypeError, match=match) as err:
        call()
    assert isinstance(err.value, TidyjaxTypeError)


def test_async_generators_and_run_now_of_a_generator_are_rejected_with_a_safe_fix():
    def gen():
        yield tj.tensor([1.0])

    async def agen():
        yield 1

    with pytest.raises(TidyjaxTypeError, match=r"s\.keep"):
        tidy("g")(agen)
    with pytest.raises(TidyjaxTypeError, match="Decorate it with @tidy"):
        tidy.run(gen)
    with pytest.raises(TidyjaxTypeError, match="Decorate the generator function"):
        tidy.run(lambda: gen())


def test_sync_scope_whose_function_returns_an_awaitable_raises():
    async def work():
        return tj.tensor([1.0])

    with pytest.raises(TidyjaxTypeError, match="async with tidy"):
        tidy.run(work)
    with pytest.raises(TidyjaxTypeError, match="async with tidy"):
        tidy.run(lambda: work())  # a plain function that returns a coroutine
    assert counts() == (0, 0, 0)


def test_exiting_twice_out_of_order_or_reentering_raises_scope_error():
    s = tidy("once")
    with s:
        pass
    with pytest.raises(ScopeError, match="already exited"):
        s.__exit__(None, None, None)
    with pytest.raises(ScopeError, match="already entered"):
        s.__enter__()
    with pytest.raises(ScopeError, match="has not been entered"):
        tidy("never").__exit__(None, None, None)

    outer, inner = tidy("outer"), tidy("inner")
    outer.__enter__()
    inner.__enter__()
    t = tj.tensor([1.0])
    with pytest.raises(ScopeError, match="reverse order"):
        outer.__exit__(None, None, None)
    # Both exited, innermost first, and the stack is consistent again.
    assert t.is_disposed and "outer/inner" in str(t)
    assert CURRENT.get() is None
    inner.__exit__(None, None, None)  # its own exit, late: nothing left to do
    after = tj.tensor([2.0])
    assert scope_path(after) is None  # owned by no scope: none was left open
    after.dispose()


def test_an_exception_leaving_a_scope_with_an_inner_one_open_propagates_unchanged():
    from contextlib import ExitStack

    kept = tj.tensor([1.0])
    with pytest.raises(KeyError, match="mine"), tidy("outer"):
        stack = ExitStack()
        stack.enter_context(tidy("inner"))  # never closed
        t = tj.tensor([2.0])
        raise KeyError("mine")
    assert t.is_disposed and not kept.is_disposed
    assert CURRENT.get() is None
    stack.close()  # the inner scope's late exit does nothing
    assert CURRENT.get() is None
    kept.dispose()


def test_decorating_with_a_used_scope_raises():
    s = tidy("x")
    with s, pytest.raises(ScopeError, match="already in use"):
        s(lambda: None)


def test_variables_built_from_scoped_tensors_survive_the_scope():
    with tidy():
        t = tj.tensor([1.0, 2.0])
        v = tj.Variable(t)
        w = tj.Variable(t * 2, name="w")
    assert t.is_disposed
    np.testing.assert_array_equal(v.numpy(), [1.0, 2.0])
    np.testing.assert_array_equal(w.numpy(), [2.0, 4.0])
    assert counts()[:2] == (2, 2)
    tj.dispose_variables()
    assert counts() == (0, 0, 0)


# -- concurrency -----------------------------------------------------------------------------


def test_threads_have_their_own_scope_stacks():
    errors, barrier = [], threading.Barrier(4)

    def worker(i):
        try:
            with tidy(f"w{i}"):
                mine = tj.tensor([float(i)] * 8)
                barrier.wait()  # all four scopes are open at once
                for _ in range(50):
                    mine = mine + 1
                barrier.wait()
                out = tj.keep(mine * 1)
            np.testing.assert_array_equal(out.numpy(), [i + 50.0] * 8)
            out.dispose()
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    with tidy("main"):
        threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    assert errors == []
    assert counts() == (0, 0, 0)


def test_asyncio_tasks_never_free_each_others_tensors():
    async def task(i, started):
        async with tidy(f"task{i}") as scope:
            x = tj.tensor([float(i)])
            started.set()
            await asyncio.sleep(0.01 * (3 - i))  # exit in the opposite order of entry
            y = scope.keep(x + 100)
            await asyncio.sleep(0)
            assert not x.is_disposed  # another task's exit did not free it
        assert x.is_disposed
        return y

    async def main():
        events = [asyncio.Event() for _ in range(3)]
        tasks = [asyncio.create_task(task(i, events[i])) for i in range(3)]
        return await asyncio.gather(*tasks)

    outs = asyncio.run(main())
    assert [float(o[0]) for o in outs] == [100.0, 101.0, 102.0]
    tj.dispose(outs)


def test_tidy_on_async_def_frees_after_the_awaits():
    @tidy("fetch")
    async def fetch(x):
        a = x * 2
        await asyncio.sleep(0)
        b = a + 1  # created after an await: still freed (TF.js leaks these)
        fetch.made = (a, b)
        return b * 10

    x = tj.tensor([1.0])
    out = asyncio.run(fetch(x))
    assert all(t.is_disposed for t in fetch.made)
    np.testing.assert_array_equal(out.numpy(), [30.0])
    tj.dispose([x, out])


def test_async_scope_error_inside_frees():
    async def main():
        with pytest.raises(KeyError):
            async with tidy():
                main.t = tj.tensor([1.0])
                await asyncio.sleep(0)
                raise KeyError("x")

    asyncio.run(main())
    assert main.t.is_disposed


def test_outer_keep_inside_an_inner_scope_hands_the_tensor_to_the_outer_scope():
    with tidy("top"):
        with tidy("outer") as outer:
            with tidy("inner"):
                t = tj.tensor([1.0, 2.0]) * 2
                clone = t.clone()
                outer.keep(t, clone)
            assert not t.is_disposed and not clone.is_disposed  # survived "inner"
        assert not t.is_disposed  # handed out of "outer", as a return value would be
        assert outer.num_handed_out == 1
    assert t.is_disposed and clone.is_disposed  # "top" owned it
    assert counts() == (0, 0, 0)


def test_tidy_run_of_a_generator_says_how_to_fix_it():
    with pytest.raises(TidyjaxTypeError, match=r"generator.*or return a list") as err:
        tidy.run(lambda: (x for x in range(3)))
    assert "coroutine" not in str(err.value)
    assert counts() == (0, 0, 0)


# -- TensorFlow.js parity on disposed values, and what a scope refuses ---------------------------


def test_keep_of_a_disposed_tensor_does_nothing_as_in_tfjs() -> None:
    t = tj.tensor([1.0])
    t.dispose()
    assert tj.keep(t) is t
    with tj.tidy() as s:
        assert s.keep(t) is t
    assert t.is_disposed and tj.memory().num_tensors == 0


def test_messages_never_cut_a_tensor_repr_mid_word() -> None:
    t = tj.tensor([1.0])
    t.dispose()
    with pytest.raises(tj.TidyjaxTypeError) as info:
        tj.tidy.run(t)  # type: ignore[call-overload]
    assert repr(t) in str(info.value)  # whole: "…disposed explicitly (dispose())>"
    with pytest.raises(tj.TidyjaxTypeError) as info:
        tj.tensor("x" * 200)
    assert "…" in str(info.value) and "xxxxx" in str(info.value)


class _HoldsScope:
    def __init__(self, scope: Any) -> None:
        self.scope = scope


@pytest.mark.parametrize("copier", [copy.copy, copy.deepcopy, pickle.dumps])
def test_a_scope_cannot_be_copied_or_pickled(copier: Any) -> None:
    with tj.tidy("train") as s:
        target = s if copier is copy.copy else _HoldsScope(s)
        with pytest.raises(tj.TidyjaxTypeError, match="scope 'train' cannot be copied"):
            copier(target)


def test_tidy_on_an_async_generator_names_it_so() -> None:
    async def stream() -> Any:
        yield 1

    with pytest.raises(tj.TidyjaxTypeError, match="cannot wrap async generator function"):
        tj.tidy(stream)


# -- a second array object over a buffer, made by raw JAX -----------------------------------------


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


# -- generators -----------------------------------------------------------------------------------


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


# -- containers JAX does not know -----------------------------------------------------------------


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


def test_keep_of_a_plain_array_tidyjax_never_made_does_nothing():
    """No scope frees a plain jax.Array tidyjax never made, so keeping one is a no-op (as a
    container of them is): the same object back, never deleted, nothing counted."""
    outer = jnp.arange(3.0)
    assert tj.keep(outer) is outer
    with tj.tidy() as s:
        inner = jnp.ones(2)
        assert s.keep(inner) is inner and tj.keep(inner) is inner
    assert not outer.is_deleted() and not inner.is_deleted()
    assert counts() == (0, 0, 0)


# -- TensorFlow.js's object rule and the buffer rule, together ------------------------------------


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


# -- dispose of a raw array a scope handed out ----------------------------------------------------


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


def test_a_long_loop_of_child_scopes_keeps_the_outer_scopes_books_bounded():
    # Each step hands its result to the outer scope (a record and a Tensor object to settle at
    # exit); the results of the steps before were dropped. The outer books must not grow with
    # the number of steps (host memory in a long training loop), and nothing alive is lost.
    @tj.tidy
    def step(x):
        return x + 1

    with tj.tidy() as outer:
        x = tj.tensor(np.zeros(4, np.float32))
        for _ in range(5000):
            x = step(x)
        assert len(outer._owned) < 2100 and len(outer._aliases) < 2100
        assert float(x.array[0]) == 5000.0
        kept = tj.keep(x)
    assert not kept.is_disposed and tj.memory().num_tensors == 1
    kept.dispose()
    assert tj.memory().num_tensors == 0
