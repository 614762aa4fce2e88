"""Reliability: concurrency stress, faults mid-scope, and a table of bad input over the API."""

from __future__ import annotations

import asyncio
import random
import subprocess
import sys
import threading

import jax.numpy as jnp
import numpy as np
import pytest

import tidyjax as tj
import tidyjax.numpy as tnp
from tidyjax import DisposedError, ScopeError, TidyjaxTypeError, TidyjaxValueError, tidy

from .conftest import counts, run_threads

# -- concurrency stress (bounded in count and time) --------------------------------------------


def test_eight_threads_of_five_hundred_random_scopes():
    shared = tj.tensor(np.arange(4, dtype=np.float32))  # read by every thread, freed by none
    results: list[tj.Tensor] = []
    lock = threading.Lock()

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        for i in range(500):
            with tidy(f"t{seed}") as scope:
                x = tj.tensor([float(seed), float(i)])
                y = x * 2
                for _ in range(rng.randrange(4)):
                    y = rng.choice([lambda v: v + 1, lambda v: v.clone(), lambda v: v[...]])(y)
                z = (shared.sum() + y.sum()) * 1
                if rng.random() < 0.1:
                    with tidy("inner"):
                        w = tj.keep(z + 0)  # outlives every scope
                    with lock:
                        results.append(w)
                out = scope.keep(z)
            assert x.is_disposed and not out.is_disposed
            expected = 6.0 + 2 * (seed + i)
            assert out.item() >= expected  # + n_additions * 2
            out.dispose()

    run_threads(worker, 8)
    np.testing.assert_array_equal(shared.numpy(), [0.0, 1.0, 2.0, 3.0])
    assert counts()[0] == 1 + len(results)  # shared + the kept ones, exactly
    tj.dispose([shared, results])
    assert counts() == (0, 0, 0)


def test_two_hundred_asyncio_tasks_interleaving_awaits_in_scopes():
    async def task(i: int) -> tj.Tensor:
        async with tidy(f"task{i}") as scope:
            x = tj.tensor([float(i)] * 3)
            await asyncio.sleep(0)
            y = x * 2
            await asyncio.sleep(random.random() / 1000)
            async with tidy("inner") as inner:
                z = inner.keep(y + x)
                await asyncio.sleep(0)
            assert not x.is_disposed and not y.is_disposed  # no other task freed them
            np.testing.assert_array_equal(z.numpy(), [3.0 * i] * 3)
            out = scope.keep(z.sum())
        assert x.is_disposed and y.is_disposed and z.is_disposed
        return out

    async def main() -> list[tj.Tensor]:
        return await asyncio.gather(*(task(i) for i in range(200)))

    outs = asyncio.run(main())
    assert [o.item() for o in outs] == [9.0 * i for i in range(200)]
    assert counts()[0] == 200
    tj.dispose(outs)


# -- faults ------------------------------------------------------------------------------------


@pytest.mark.parametrize("exc", [RuntimeError("boom"), KeyboardInterrupt()])
def test_exception_or_keyboard_interrupt_mid_scope_frees_exactly(exc):
    outer = tj.tensor([1.0])
    before = counts()
    made = []
    with pytest.raises(type(exc)), tidy("interrupted"):
        made.append(outer + 1)
        with tidy("deeper"):
            made.append(outer * 3)
            raise exc
    assert all(t.is_disposed for t in made)
    assert counts() == before
    outer.dispose()


def test_jax_error_inside_a_lifted_op_leaves_exact_counts():
    a, b = tj.tensor([1.0, 2.0]), tj.tensor([1.0, 2.0, 3.0])
    before = counts()
    with pytest.raises((TypeError, ValueError), match=r"shape|broadcast|incompatible"):
        tnp.add(a, b)
    with pytest.raises((TypeError, ValueError)):
        a @ b
    assert counts() == before
    with pytest.raises((TypeError, ValueError)), tidy():
        c = a * 2
        tnp.concatenate([a, b.reshape(3, 1)])
    assert c.is_disposed and counts() == before
    tj.dispose([a, b])


def test_error_inside_tidy_async_function_frees_everything():
    @tidy("fails")
    async def fails(x):
        fails.made = [x + 1]
        await asyncio.sleep(0)
        fails.made.append(x * 2)
        raise LookupError("late")

    x = tj.tensor([1.0])
    with pytest.raises(LookupError):
        asyncio.run(fails(x))
    assert all(t.is_disposed for t in fails.made)
    assert counts()[0] == 1
    x.dispose()


def test_rejected_generator_leaves_no_trace():
    def gen():
        yield tj.tensor([1.0])

    before = counts()
    with pytest.raises(TidyjaxTypeError, match="generator"):
        tidy.run(lambda: gen())
    assert counts() == before


# -- bad input, table-driven: the right error, a message naming the problem, no state change ---


def _disposed():
    t = tj.tensor([1.0])
    t.dispose()
    return t


def _deleted_array():
    a = jnp.ones(2)
    a.delete()
    return a


def _exit_twice():
    s = tidy("twice")
    s.__enter__()
    s.__exit__(None, None, None)
    s.__exit__(None, None, None)


def _out_of_order():
    a, b = tidy("a"), tidy("b")
    a.__enter__()
    b.__enter__()
    try:
        a.__exit__(None, None, None)  # closes b, then a; then says b was left open
    finally:
        b.__exit__(None, None, None)  # b's own late exit does nothing


def _assign(value):
    v = tj.Variable(jnp.zeros((2, 2)), name="w")
    try:
        v.assign(value)
    finally:
        v.dispose()


def _setitem():
    t = tj.tensor([1.0])
    try:
        t[0] = 2.0
    finally:
        t.dispose()


BAD_INPUT = [
    ("tensor(str)", lambda: tj.tensor("abc"), TidyjaxTypeError, "array-like"),
    ("tensor(function)", lambda: tj.tensor(print), TidyjaxTypeError, "array-like"),
    ("tensor(object)", lambda: tj.tensor(object()), TidyjaxTypeError, "cannot make an array"),
    ("tensor(disposed)", lambda: tj.tensor(_disposed()), DisposedError, "disposed"),
    ("adopt(list)", lambda: tj.adopt([1.0]), TidyjaxTypeError, "jax.Array"),
    ("adopt(deleted)", lambda: tj.adopt(_deleted_array()), TidyjaxValueError, "deleted"),
    ("Variable(name=3)", lambda: tj.Variable([1.0], name=3), TidyjaxTypeError, "name"),
    ("Variable(disposed)", lambda: tj.Variable(_disposed()), DisposedError, "disposed"),
    ("assign wrong shape", lambda: _assign(jnp.zeros(3)), TidyjaxValueError, "shape"),
    ("assign wrong dtype", lambda: _assign(jnp.zeros((2, 2), int)), TidyjaxTypeError, "dtype"),
    ("assign disposed", lambda: _assign(_disposed()), DisposedError, "disposed"),
    ("assign str", lambda: _assign("x"), TidyjaxTypeError, "array-like"),
    ("tidy(42)", lambda: tidy(42), TidyjaxTypeError, "scope name"),
    ("tidy.run()", lambda: tidy.run(), TidyjaxTypeError, "needs a function"),
    ("tidy.run(name)", lambda: tidy.run("n"), TidyjaxTypeError, "no function"),
    ("tidy.run(4, fn)", lambda: tidy.run(4, print), TidyjaxTypeError, "function should be"),
    ("tidy.run(n, str)", lambda: tidy.run("n", "x"), TidyjaxTypeError, "function should be"),
    ("exit twice", _exit_twice, ScopeError, "already exited"),
    ("exit out of order", _out_of_order, ScopeError, "reverse order"),
    ("lift(5)", lambda: tj.lift(5), TidyjaxTypeError, "callable"),
    ("jit(5)", lambda: tj.jit(5), TidyjaxTypeError, "function"),
    ("grad(None)", lambda: tj.grad(None), TidyjaxTypeError, "function"),
    ("t[0] = 1", _setitem, TidyjaxTypeError, "immutable"),
    ("disposed + 1", lambda: _disposed() + 1, DisposedError, "disposed explicitly"),
    ("1 + disposed", lambda: 1 + _disposed(), DisposedError, "disposed explicitly"),
    ("op on disposed arg", lambda: tnp.sin(_disposed()), DisposedError, "disposed"),
    ("unknown tnp name", lambda: tnp.no_such_thing, AttributeError, "has none either"),
    ("keep scope closed", lambda: tidy().keep(1), ScopeError, "not open"),
]


@pytest.mark.parametrize(
    ("call", "exc", "match"), [row[1:] for row in BAD_INPUT], ids=[row[0] for row in BAD_INPUT]
)
def test_bad_input_raises_a_clear_error_and_changes_nothing(call, exc, match):
    keep_alive = tj.tensor([7.0])
    before = counts()
    with pytest.raises(exc, match=match):
        call()
    assert counts() == before
    assert keep_alive.item() == 7.0
    keep_alive.dispose()


_FINALIZER_UNDER_A_REGISTRY_LOCK = """
import sys, threading, numpy as np, tidyjax as tj
from tidyjax import _registry, _timeline
t = tj.tensor(np.ones(4, np.float32)) * 1
observer = tj.profile() if sys.argv[1] == "profile" else tj.timeline(sample=None)
with observer:
    lock = _registry.observers[-1].lock if sys.argv[1] == "profile" else _timeline._lock
    holding = threading.Event()

    def handler():  # an observer's handler asking the registry (a suspect's buffers)
        with lock:
            holding.set()
            _registry.index_hits({})

    with _registry._index_lock:  # a thread inside the registry's index...
        thread = threading.Thread(target=handler, daemon=True)
        thread.start()
        holding.wait(10)
        del t  # ...where a collection runs a Tensor's finalizer: it tells the observers
    thread.join(10)
    print("stuck" if thread.is_alive() else f"done: {tj.memory().num_tensors} tensors")
"""


@pytest.mark.parametrize("observer", ["profile", "timeline"])
def test_a_finalizer_telling_an_observer_never_waits_for_a_thread_waiting_for_the_registry(
    observer,
):
    """A Tensor collected in a thread that holds a lock of the registry tells the observers
    (a profile's count, a timeline); another thread handling an event under the observer's lock
    may be waiting for that registry lock (the allocation index, asked for a suspect's
    buffers). The finalizer's event waited for the observer's lock: both threads stuck for
    ever. After a short wait (20 ms) it is queued now, handled by the holder as it lets go."""
    code = _FINALIZER_UNDER_A_REGISTRY_LOCK
    try:
        out = subprocess.run(
            [sys.executable, "-c", code, observer], capture_output=True, text=True, timeout=60
        )
    except subprocess.TimeoutExpired:
        pytest.fail("the two threads deadlocked")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "done: 0 tensors", out.stdout + out.stderr
