"""A scope owns every buffer it creates: the five rules of ownership, one group of tests each.

1. A buffer tidyjax created in a scope is deleted at exit unless returned, kept, held by a
   Variable (or shared with one of those), whether or not its Tensor object is still alive.
2. A raw jax.Array of such a buffer, returned or passed to scope.keep, moves out like a Tensor.
3. Nothing else is deleted: outer Tensors, clones of them, adopted arrays of outer scopes, arrays
   made outside tidyjax (even at a reused address or id).
4. What nobody references is still freed early, by Python's GC, and memory() follows at once.
5. memory() stays exact: an escaped array counts as tracked while it lives, and stops at exit.
"""

from __future__ import annotations

import asyncio
import gc
import threading
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tidyjax as tj
import tidyjax.numpy as tnp
from tidyjax import tidy

from .conftest import counts

# -- rule 1: the scope frees buffers, not Tensor objects ---------------------------------------


def test_escaped_raw_arrays_in_a_loop_are_all_deleted():
    kept = []
    with tidy():
        x = tj.tensor(np.ones(8, np.float32))
        for _ in range(50):
            x = x + 1.0
            kept.append(x.array)  # the Tensor is rebound and collected; the array lives on
    assert len(kept) == 50
    assert all(a.is_deleted() for a in kept)
    assert x.is_disposed
    assert counts() == (0, 0, 0)


@pytest.mark.parametrize(
    "hold",
    [
        pytest.param(lambda arr, box: box.append(arr), id="logging list"),
        pytest.param(lambda arr, box: box.append(lambda: arr), id="closure"),
        pytest.param(lambda arr, box: box.append({"loss": arr}), id="dict"),
    ],
)
def test_collected_tensor_whose_array_is_held_elsewhere_is_freed_at_exit(hold):
    box: list = []
    with tidy("step"):
        loss = (tj.tensor([1.0, 2.0]) * 3).sum()
        hold(loss.array, box)
        arr = loss.array
        del loss
        gc.collect()
        assert counts() == (0, 1, 4)  # no Tensor, but the scope still owns the buffer
    assert arr.is_deleted()
    assert counts() == (0, 0, 0)


def test_buffer_shared_with_a_returned_tensor_survives():
    @tidy
    def f():
        t = tj.tensor([1.0, 2.0])
        alias = t[...]  # the same array object: one buffer
        del t
        return alias

    out = f()
    np.testing.assert_array_equal(out.numpy(), [1.0, 2.0])
    out.dispose()
    assert counts() == (0, 0, 0)


def test_variable_built_from_a_collected_temporary_survives_the_scope():
    with tidy():
        v = tj.Variable(tj.tensor([1.0, 2.0]) * 2)  # the temporary Tensor is collected at once
        w = tj.Variable(tj.tensor([0.0, 0.0]))
        w.assign(tj.tensor([5.0, 6.0]) + 1)
        gc.collect()
    np.testing.assert_array_equal(v.numpy(), [2.0, 4.0])
    np.testing.assert_array_equal(w.numpy(), [6.0, 7.0])
    assert counts() == (2, 2, 16)
    tj.dispose_variables()
    assert counts() == (0, 0, 0)


def test_kept_buffer_survives_even_through_a_raw_array():
    with tidy():
        arr = tj.keep(tj.tensor([1.0, 2.0]) + 1).array
        gc.collect()
    assert not arr.is_deleted()
    assert counts() == (0, 1, 8)
    with tidy():
        tj.adopt(arr).dispose()  # the kept buffer is tidyjax's: adopting joins its record
    assert arr.is_deleted()
    assert counts() == (0, 0, 0)


# -- rule 2: raw arrays move out like Tensors -------------------------------------------------


def test_returning_t_array_gives_a_live_array():
    @tidy
    def f():
        return (tj.tensor([1.0]) * 2).array

    arr = f()
    assert not arr.is_deleted()
    np.testing.assert_array_equal(np.asarray(arr), [2.0])
    assert counts() == (0, 1, 4)  # tracked, not a Tensor-less mystery
    info = tj.memory()
    assert not info.unreliable and info.untracked_arrays == 0
    del arr
    assert counts() == (0, 0, 0)


def test_a_returned_raw_array_moves_one_level_and_is_freed_by_the_next_scope():
    with tidy("outer"):
        arr = tidy.run("inner", lambda: (tj.tensor([1.0, 2.0]) + 1).array)
        assert not arr.is_deleted()
    assert arr.is_deleted()
    assert counts() == (0, 0, 0)


def test_scope_keep_takes_raw_arrays_in_any_pytree():
    with tidy("outer"):
        with tidy("inner") as inner:
            a = (tj.tensor([1.0]) + 1).array
            b = tj.tensor([2.0]) * 3
            inner.keep({"a": a, "b": [b.array]})
            del b
        assert not a.is_deleted()
        assert inner.num_handed_out == 2
    assert a.is_deleted()


# -- rule 3: nothing else is deleted ----------------------------------------------------------


def test_outer_tensor_and_its_clones_are_never_deleted_by_an_inner_scope():
    a = tj.tensor([1.0, 2.0])
    with tidy():
        c = a.clone()
        arr = c.array
        del a  # the outer Tensor is collected: its buffer still belongs to no inner scope
        gc.collect()
    assert c.is_disposed  # the Tensor object the inner scope made is disposed
    assert not arr.is_deleted()
    np.testing.assert_array_equal(np.asarray(arr), [1.0, 2.0])
    del arr
    assert counts() == (0, 0, 0)


def test_adopted_array_of_an_outer_scope_survives_inner_scopes():
    mine = jnp.arange(3.0)
    t = tj.adopt(mine)
    with tidy():
        u = t * 2
        del u
        assert tnp.asarray(mine).array is mine
    assert not mine.is_deleted()
    t.dispose()
    assert mine.is_deleted()  # adopt took ownership


def test_arrays_made_outside_tidyjax_at_a_reused_address_are_never_deleted():
    with tidy():
        for _ in range(20):
            t = tj.tensor(np.full(16, 1.0, np.float32)) * 2
            del t  # Tensor and array die: JAX reuses the address (and Python the id) at once
            gc.collect()
        outside = [jnp.full(16, float(i)) for i in range(50)]  # raw JAX, likely on reused memory
    assert not any(a.is_deleted() for a in outside)
    np.testing.assert_array_equal(np.asarray(outside[7]), np.full(16, 7.0))


def test_user_raw_array_passed_through_a_lifted_call_is_never_deleted():
    mine = jnp.arange(4.0)
    with tidy():
        same = tnp.asarray(mine)
        moved = tj.lift(jax.device_put)(mine, jax.devices()[0])  # new object, same buffer
        del same, moved
    assert not mine.is_deleted()


def test_to_the_same_device_shares_the_buffer_with_the_outer_tensor():
    a = tj.tensor([1.0, 2.0])
    with tidy():
        b = a.to(jax.devices()[0])
        assert b.array is not a.array
        assert counts()[1] == 1
    assert b.is_disposed and not a.is_disposed
    np.testing.assert_array_equal(a.numpy(), [1.0, 2.0])
    a.dispose()


# -- rule 4: early freeing stays --------------------------------------------------------------


def test_unreferenced_tensor_and_array_are_freed_before_the_exit():
    with tidy():
        t = tj.tensor(np.ones(1024, np.float32)) + 1
        ref = weakref.ref(t.array)
        assert counts() == (1, 1, 4096)
        del t  # no reference cycle: freed by reference counting, no gc.collect needed
        assert ref() is None
        m = tj.memory(scan_untracked=False)
        assert (m.num_tensors, m.num_data_buffers, m.num_bytes) == (0, 0, 0)


# -- rule 5: memory() stays exact -------------------------------------------------------------


def test_memory_counts_an_escaped_array_until_the_exit():
    with tidy():
        t = tj.tensor(np.ones(256, np.float32))
        arr = t.array
        del t
        m = tj.memory()
        assert (m.num_tensors, m.num_data_buffers, m.num_bytes) == (0, 1, 1024)
        assert not m.unreliable and m.untracked_arrays == 0
        assert sum(m.bytes_per_device.values()) == 1024
    m = tj.memory()
    assert (m.num_tensors, m.num_data_buffers, m.num_bytes) == (0, 0, 0)
    assert arr.is_deleted()


def test_profile_follows_an_escaped_buffer_freed_at_exit():
    with tj.profile() as info, tidy():
        arr = (tj.tensor(np.ones(8, np.float32)) * 2).array
        del arr
    assert info.new_bytes == 0 and info.new_tensors == 0
    assert info.peak_bytes == 64


# -- donation, threads, tasks -----------------------------------------------------------------


def test_donated_buffer_with_an_escaped_array_is_not_deleted_twice():
    double = tj.jit(lambda p: p * 2, donate_argnums=0)
    with tidy():
        w = tj.tensor(np.ones(4, np.float32))
        raw = w.array
        out = double(w)
        assert raw.is_deleted() and w.is_disposed
        kept = tj.keep(out)
    np.testing.assert_array_equal(kept.numpy(), [2.0] * 4)
    kept.dispose()
    assert counts() == (0, 0, 0)


def test_threads_doing_all_of_it_at_once():
    shared = tj.tensor(np.ones(8, np.float32))
    errors: list[BaseException] = []
    escaped: list[jax.Array] = []
    returned: list[jax.Array] = []
    lock = threading.Lock()

    def worker() -> None:
        try:
            for _ in range(40):
                with tidy("outer"):

                    @tidy
                    def inner():
                        c = shared.clone()
                        y = c * 2 + 1
                        with lock:
                            escaped.append(y.array)
                        return (y + 1).array

                    arr = inner()
                    assert not arr.is_deleted()
                    with lock:
                        returned.append(arr)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    assert len(escaped) == len(returned) == 320
    assert all(a.is_deleted() for a in escaped + returned)
    np.testing.assert_array_equal(shared.numpy(), np.ones(8))
    escaped.clear()
    returned.clear()
    assert counts() == (1, 1, 32)
    shared.dispose()


def test_asyncio_tasks_doing_all_of_it_at_once():
    shared = tj.tensor(np.ones(4, np.float32))

    async def task(i: int) -> jax.Array:
        async with tidy(f"task{i}"):
            c = shared.clone()
            await asyncio.sleep(0)
            held = (c + i).array
            await asyncio.sleep(0)
            return held

    async def main() -> list[jax.Array]:
        return await asyncio.gather(*(task(i) for i in range(100)))

    held = asyncio.run(main())
    assert all(a.is_deleted() for a in held)
    assert not shared.is_disposed
    shared.dispose()
    del held
    assert counts() == (0, 0, 0)
