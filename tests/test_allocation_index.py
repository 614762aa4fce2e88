"""The registry's allocation index: what it finds over an allocation is what a scan of every
record finds, whatever was made, aliased, split out of a batch, disposed or collected since it
was last read; and the books of a Tensor aliased once a step stay the size of what lives."""

from __future__ import annotations

import gc
import time
from typing import Any

import jax
import jax.numpy as jnp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tidyjax as tj
from tidyjax import _registry

from .conftest import run_threads


def _everything() -> dict[int, frozenset[Any]]:
    """Every live record and batch leaf tidyjax books, by the id of the record (of the leaf's
    array), with its allocations: the full scan, written out here as the oracle."""
    out: dict[int, frozenset[Any]] = {}
    for x in list(_registry.by_array.values()):
        if type(x) is _registry.Batch:
            if x.dead is None:
                for _, a in x.held():
                    if (keys := _registry.shards(a, wait=True)) is not None:
                        out[id(a)] = keys
        elif x.dead is None and (arr := x.array()) is not None and not arr.is_deleted():
            keys = _registry.shards(arr, wait=True)
            if keys is not None:
                out[id(x)] = keys
    return out


def _found(keys: frozenset[Any]) -> set[int]:
    wanted = {k: [object()] for k in keys}
    hits = _registry.index_hits(wanted)
    return {id(x) if type(x) is not tuple else id(arr) for x, _, arr in hits}


def _check() -> None:
    books = _everything()
    for keys in books.values():
        expected = {who for who, theirs in books.items() if not theirs.isdisjoint(keys)}
        assert _found(keys) == expected


@jax.jit
def _three(x: Any) -> tuple[Any, Any, Any]:
    return x + 1, x * 2, x - 3


OPS = st.sampled_from(
    [
        "tensor",
        "batch",
        "alias",
        "raw",
        "keep",
        "split",
        "dispose",
        "drop",
        "drop_raw",
        "memory",
        "rebuild",
        "check",
    ]
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(st.tuples(OPS, st.integers(0, 1_000)), max_size=25))
def test_the_index_finds_what_a_scan_of_every_record_finds(ops: list[tuple[str, int]]) -> None:
    device = jax.devices()[0]
    three = tj.jit(_three)
    live: list[Any] = [tj.tensor(jnp.arange(4.0))]
    raw: list[Any] = []
    scope = tj.tidy("index")
    scope.__enter__()
    try:
        _check()
        for op, n in ops:
            pick = live[n % len(live)] if live else None
            if op == "tensor":
                live.append(tj.tensor(jnp.full(3, float(n))))
            elif op == "batch":
                live.extend(three(jnp.full(5, float(n))))
            elif op == "alias" and pick is not None and not pick.is_disposed:
                live.append(jax.device_put(pick, device))
            elif op == "raw" and pick is not None and not pick.is_disposed:
                raw.append(jax.device_put(pick.array, device))
                live.append(tj.tensors(raw[-1]))
            elif op == "keep" and pick is not None and not pick.is_disposed:
                # one more array object over the Tensor's record, which may outlive its first
                raw.append(tj.keep(jax.device_put(pick.array, device)))
            elif op == "split" and pick is not None and not pick.is_disposed:
                live.append(tj.tensors(pick.array))  # a second Tensor: a leaf splits out
            elif op == "dispose" and pick is not None:
                tj.dispose(live.pop(n % len(live)))
            elif op == "drop" and live:
                del live[n % len(live)]
                gc.collect()
            elif op == "drop_raw" and raw:
                del raw[n % len(raw)]
                gc.collect()
            elif op == "memory":
                tj.memory()
            elif op == "rebuild":  # the next read builds the index from every record
                _registry._index_built = False
            elif op == "check":  # what was made since is read now, whatever became of it
                _check()
    finally:
        scope.__exit__(None, None, None)
        tj.dispose(live)
    _check()


def test_a_tensor_aliased_once_a_step_keeps_books_the_size_of_what_lives() -> None:
    """A long-lived Tensor that a step aliases (``jax.device_put`` to where it is) and whose
    alias the step's log keeps: each alias joins the Tensor's record as one more array object
    over its buffer; those collected leave it (the list, and each lookup of the Tensor, grew
    by one a step without end)."""
    x = tj.tensor(jnp.ones(8))
    device = jax.devices()[0]
    log: list[Any] = []
    try:
        for _ in range(300):
            with tj.tidy():
                y = jax.device_put(x, device)
                (y + 1).block_until_ready()
            log = [*log[-4:], y]  # the last few steps' values, as a log keeps them
        rec = _registry.lookup(x.array)
        assert rec is not None
        assert len(rec.more or ()) <= 6
        assert not x.array.is_deleted()
        assert all(t.is_disposed for t in log)
    finally:
        x.dispose()
    assert tj.memory().num_tensors == 0


def test_a_record_read_into_the_index_whole_stays_found_through_its_last_array_object() -> None:
    """A record with two array objects (a Tensor's, and a raw alias of it kept), both read
    when the index is built: the Tensor's object collected and its id taken by a new array,
    the kept alias still holds the buffer and the index still finds it."""
    device = jax.devices()[0]
    t = tj.tensor(jnp.arange(4.0))
    kept = tj.keep(jax.device_put(t.array, device))
    rec = _registry.lookup(t.array)
    assert rec is not None and _registry.lookup(kept) is rec
    _registry._index_built = False  # the next read builds it from every record
    _check()
    del t
    gc.collect()
    assert rec.dead is None and rec.array() is kept
    others = [tj.tensor(jnp.full(3, float(i))) for i in range(50)]  # an id reused, likely
    try:
        _check()
        assert {id(rec)} <= _found(_registry.shards(kept, wait=True) or frozenset())
    finally:
        tj.dispose([others, kept])


def test_four_threads_aliasing_shared_tensors_lose_nothing_while_a_profile_listens() -> None:
    """Threads making aliases of shared top-level Tensors and of their own step outputs in
    scopes, while a profile counts from the registry's events (its handlers read the index
    too, from whichever thread a collection runs them in): no shared buffer is deleted, no
    thread blocks, and the books end with the shared Tensors alone."""
    device = jax.devices()[0]
    shared = [tj.tensor(jnp.full(4, float(i))) for i in range(3)]
    three = tj.jit(_three)

    def worker(seed: int) -> None:
        for i in range(150):
            with tj.tidy(f"w{seed}"):
                a = jax.device_put(shared[(seed + i) % 3], device)
                b = tj.tensors(jax.device_put(shared[i % 3].array, device))
                out = three(a + b)
                c = jax.device_put(out[i % 3], device)
                if i % 10 == 0:
                    gc.collect()
                assert float((c - out[i % 3]).sum()) == 0.0

    with tj.profile():
        run_threads(worker, 4)
    for i, t in enumerate(shared):
        assert not t.array.is_deleted()
        assert t.numpy().tolist() == [float(i)] * 4
    gc.collect()
    m = tj.memory(scan_untracked=False)
    assert (m.num_tensors, m.num_data_buffers) == (3, 3)
    tj.dispose(shared)


def test_four_threads_aliasing_while_a_profile_and_a_timeline_listen_agree_at_the_end() -> None:
    """The same threads with a profile and a sampling timeline open: an event a thread tells
    while another holds an observer's lock past a short wait is queued and handled by that
    thread (see test_reliability), so once the threads are done both observers count what
    ``memory()`` counts, each buffer once."""
    device = jax.devices()[0]
    shared = [tj.tensor(jnp.full(4, float(i))) for i in range(3)]
    three = tj.jit(_three)
    kept: list[Any] = []

    def worker(seed: int) -> None:
        for i in range(100):
            with tj.tidy(f"w{seed}") as scope:
                a = jax.device_put(shared[(seed + i) % 3], device)
                b = tj.tensors(jax.device_put(shared[i % 3].array, device))
                out = three(a + b)
                if i % 25 == 0:
                    kept.append(scope.keep(jax.device_put(out[0], device)))
                if i % 10 == 0:
                    gc.collect()

    with tj.profile(), tj.timeline(sample=0.001) as tl:
        run_threads(worker, 4)
        gc.collect()
        m = tj.memory(scan_untracked=False)
        assert (m.num_tensors, m.num_data_buffers) == (3 + len(kept), 3 + len(kept))
        with tj.profile() as inner:  # starts from the running count
            pass
        assert inner.bytes_before == m.num_bytes
        tl.mark()
        live = tl.live_at(time.perf_counter())
        tracked = [r for r in live if r.scope not in ("<untracked>", "<watched>")]
        assert len(tracked) == m.num_data_buffers
        assert sum(r.bytes for r in tracked) == m.num_bytes
    tj.dispose([shared, kept])


def test_a_buffer_ready_just_after_its_first_read_is_indexed_and_its_new_object_a_view(
    monkeypatch,
):
    """Found by the cross-report test on a loaded machine (JAX 0.6.2, seed 7): the index read
    an op's result while it was still being computed (no address yet), then asked whether it
    was still computing: it was ready by then, so it was neither read nor kept for the next
    update, and never indexed. A new object over its buffer (JAX 0.6 makes one when an address
    is read) was then a plain allocation for the timeline. The index asks first now."""
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    one = NamedSharding(Mesh(np.array(jax.devices()[:1]), ("x",)), P())
    real_shards, real_computing = _registry.shards, _registry.computing
    late: list[str] = []  # the first look at the buffer finds it computing; every later one ready

    def shards(arr: Any, wait: bool) -> Any:
        if arr is target and not wait and not late:
            late.append("read")
            return None
        return real_shards(arr, wait)

    def computing(arr: Any) -> bool:
        if arr is target and not late:
            late.append("asked")
            return True
        return real_computing(arr)

    with tj.timeline(sample=None) as tl:
        t = tj.numpy.sin(tj.tensor(jnp.ones(64)))
        target = t.array
        target.block_until_ready()
        monkeypatch.setattr(_registry, "shards", shards)
        monkeypatch.setattr(_registry, "computing", computing)
        _registry.index_hits({})  # an update of the index reads the new record
        monkeypatch.undo()
        view = jax.device_put(target, one)  # a new object over the buffer
        assert view is not target
        tl.mark()
        replay = tl.live_at(time.perf_counter())
        assert len(late) == 1
        assert [r.bytes for r in replay if r.scope == "<untracked>"] == []
        assert sum(r.bytes for r in replay) == tj.memory().num_bytes == 256
        t.dispose()
        del view
    assert tl.live_at(tl.stop_time) == []
