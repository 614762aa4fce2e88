"""The core's tracking cost, as the targets of the core issue: tidyjax vs raw JAX, side by side.

Run:  python benchmarks/core.py            (a few minutes on 2 CPU cores)
      python benchmarks/core.py --quick    (fewer rounds)

Every ratio compares two things sampled in alternation in the same run (median of rounds), so
machine noise hits both sides. The same script runs on a GPU machine unchanged.
"""

from __future__ import annotations

import argparse
import contextvars
import gc
import itertools
import statistics
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from _timing import FullCollections, per_call, side_by_side

import tidyjax as tj
import tidyjax.numpy as tnp

ROWS: list[tuple[str, float, float]] = []
HEADER = (
    f"{'workload':58s} {'raw µs':>10s} {'tidyjax µs':>10s} {'ratio':>7s}"
    f" {'full GC/100 raw':>15s} {'tidyjax':>7s}"
)


def row(name: str, raw: Callable[[], object], tracked: Callable[[], object], number: int,
        rounds: int) -> float:  # fmt: skip
    """Time ``raw`` against ``tracked`` in alternation; print the row (with the full garbage
    collections per 100 calls of each side) and return the ratio."""
    gc.collect()
    full = FullCollections()
    r, w = side_by_side(raw, tracked, number, rounds, collections=full)
    return _print_row(name, r, w, full)


def row_in(
    name: str, raw: Callable[[], object], tracked: Callable[[], object], number: int,
    rounds: int, context: Callable[[], AbstractContextManager[object]],
) -> float:  # fmt: skip
    """`row`, with a fresh ``context()`` entered around each sample of ``tracked`` (its entry
    and exit outside the timing), which a plain alternation of two calls cannot do."""
    gc.collect()
    full = FullCollections()
    for _ in range(3):  # compile, allocate
        raw()
        with context():
            tracked()
    sr, sw = [], []
    gc.callbacks.append(full)
    try:
        for _ in range(rounds):
            full.side = 0
            full.calls[0] += number
            sr.append(per_call(raw, number))
            with context():
                full.side = 1
                full.calls[1] += number
                sw.append(per_call(tracked, number))
                full.side = -1
    finally:
        full.side = -1
        gc.callbacks.remove(full)
    return _print_row(name, statistics.median(sr), statistics.median(sw), full)


def _print_row(name: str, r: float, w: float, full: FullCollections) -> float:
    ROWS.append((name, r, w))
    print(
        f"{name:58s} {r * 1e6:10.1f} {w * 1e6:10.1f} {w / r:7.3f}"
        f" {full.per_100(0):15.2f} {full.per_100(1):7.2f}",
        flush=True,
    )
    return w / r


def floor_line(tidy: float, floor: float) -> None:
    """Print tidyjax's ratio (to raw JAX) over its floor's: the issue's target is 1.15 at most."""
    print(f"{'  tidyjax ratio / floor ratio':58s} {'':10s} {'':10s} {tidy / floor:7.3f}",
          flush=True)  # fmt: skip


# The floors: the cheapest tracking anyone could write in Python, each timed against the same
# raw JAX as the tidyjax row it bounds, in the same run.
_FLOOR_REGISTRY: dict[int, Any] = {}


class _Slot:
    """A floor's wrapper: one plain slot, no property, no check; its books are kept by hand."""

    __slots__ = ("array",)

    def __init__(self, array: jax.Array) -> None:
        self.array = array


class _Dropped:
    """A floor's wrapper with a registry entry (``id(array)`` -> the array) for as long as it
    lives: the entry goes in ``__del__``, as a dropped Tensor's books do."""

    __slots__ = ("array",)

    def __init__(self, array: jax.Array) -> None:
        self.array = array
        _FLOOR_REGISTRY[id(array)] = array

    def __del__(self) -> None:
        del _FLOOR_REGISTRY[id(self.array)]


def _track(registry: dict[int, _Slot], arrays: list[jax.Array]) -> None:
    """A floor's books for new arrays: a wrapper apiece, in a dict keyed by ``id(array)``."""
    for a in arrays:
        registry[id(a)] = _Slot(a)


def _free(registry: dict[int, _Slot], arrays: list[jax.Array]) -> None:
    """A floor's free: ``delete()`` each array and drop its registry entry."""
    for a in arrays:
        a.delete()
        del registry[id(a)]


class _FloorScope:
    """A floor's scope: ``__enter__`` sets a context variable, ``__exit__`` resets it and
    deletes every array in the list the arrays made inside were appended to."""

    __slots__ = ("arrays", "token")

    def __init__(self) -> None:
        self.arrays: list[jax.Array] = []

    def __enter__(self) -> _FloorScope:
        self.token = _FLOOR_SCOPE.set(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _FLOOR_SCOPE.reset(self.token)
        for a in self.arrays:
            a.delete()


_FLOOR_SCOPE: contextvars.ContextVar[_FloorScope | None] = contextvars.ContextVar(
    "floor_scope", default=None
)


def _beside_floor(
    name: str, call: str, raw: Callable[[], object], tracked: Callable[[], object],
    floor: Callable[[], object], number: int, rounds: int,
) -> None:  # fmt: skip
    """The row ``name`` (``tracked`` vs ``raw``), then its floor's (``floor``, the result of
    ``call`` in a slotted wrapper with a registry entry, vs ``raw``) and the ratio of the two."""
    ratio = row(name, raw, tracked, number, rounds)
    floor_line(ratio, row(f"floor: {call} + slotted wrapper with a registry entry", raw, floor,
                          number, rounds))  # fmt: skip


def eager(number: int, rounds: int) -> None:
    for shape in ((4,), (256,), (1024, 1024)):
        x = jnp.ones(shape, jnp.float32)
        y = x * 2
        t, u = tj.tensor(x), tj.tensor(y)
        n = number if shape != (1024, 1024) else max(1, number // 20)
        row(f"Tensor a + b, float32{list(shape)}", lambda x=x, y=y: x + y,
            lambda t=t, u=u: t + u, n, rounds)  # fmt: skip
        tj.dispose([t, u])
    x = jnp.linspace(0.0, 1.0, 256)
    y = x + 1.0
    t, u = tj.tensor(x), tj.tensor(y)
    # Each beside its floor: the raw call, its result in a slotted wrapper with a registry entry
    # (which goes with the wrapper).
    _beside_floor("lifted tnp.tanh(x) vs jnp.tanh, float32[256]", "jnp.tanh",
                  lambda: jnp.tanh(x), lambda: tnp.tanh(t), lambda: _Dropped(jnp.tanh(x)),
                  number, rounds)  # fmt: skip
    _beside_floor("lifted tnp.add(x, y) vs jnp.add", "jnp.add", lambda: jnp.add(x, y),
                  lambda: tnp.add(t, u), lambda: _Dropped(jnp.add(x, y)), number,
                  rounds)  # fmt: skip
    _beside_floor("t.exp() vs jnp.exp(x)", "jnp.exp", lambda: jnp.exp(x), lambda: t.exp(),
                  lambda: _Dropped(jnp.exp(x)), number, rounds)  # fmt: skip

    def raw_block() -> None:
        for _ in range(100):
            x + y

    def tidy_block() -> None:
        with tj.tidy():
            for _ in range(100):
                t + u

    row("100 x (a + b) in one tidy, freed at exit, vs raw loop", raw_block, tidy_block,
        max(1, number // 100), rounds)  # fmt: skip
    tj.dispose([t, u])


def jitted_leaves(n: int, number: int, rounds: int) -> float:
    """A jitted step over ``n`` parameter leaves (float32[64]): raw jax.jit vs tidyjax.jit in a
    scope that hands the new parameters out, then disposes the last step's; run to completion."""

    def update(p: dict[str, jax.Array]) -> dict[str, jax.Array]:
        return jax.tree.map(lambda w: w * 0.99 + 0.01, p)

    raw_step = jax.jit(update)
    tj_step = tj.jit(update)
    state = {"raw": {f"w{i}": jnp.full((64,), float(i)) for i in range(n)}}
    params = {"tj": {f"w{i}": tj.tensor(np.full((64,), float(i), np.float32)) for i in range(n)}}

    # Each step runs to completion (block_until_ready), as JAX benchmarks do.
    def raw() -> None:
        state["raw"] = jax.block_until_ready(raw_step(state["raw"]))

    def tracked() -> None:
        with tj.tidy() as scope:
            new = scope.keep(tj_step(params["tj"]))
        tj.dispose(params["tj"])
        params["tj"] = jax.block_until_ready(new)

    ratio = row(f"jitted step, {n} leaves, tidy vs raw jit", raw, tracked, number, rounds)
    tj.dispose(params["tj"])

    # The floor: the same raw jit, then a slotted wrapper per output leaf in a dict keyed by
    # id(array), and delete() of the last step's arrays (no scope, no context variable).
    floor_state = {"arrays": {f"w{i}": jnp.full((64,), float(i)) for i in range(n)}}
    registry: dict[int, _Slot] = {}
    last = {"leaves": jax.tree.leaves(floor_state["arrays"])}
    _track(registry, last["leaves"])

    def floor() -> None:
        new = raw_step(floor_state["arrays"])
        leaves = jax.tree.leaves(new)
        _track(registry, leaves)
        _free(registry, last["leaves"])
        floor_state["arrays"], last["leaves"] = new, leaves
        jax.block_until_ready(new)

    floor_line(ratio, row(f"floor: raw jit, {n} leaves, wrapper+dict entry+delete()", raw,
                          floor, number, rounds))  # fmt: skip
    _free(registry, last["leaves"])
    return ratio


def block_tree(n: int, number: int, rounds: int) -> None:
    """``jax.block_until_ready`` on a dict of ``n`` ready Tensors against the same arrays: JAX
    flattens the Tensor nodes (in C++, reading ``Tensor.array``)."""
    arrays = {f"w{i}": jnp.full((64,), float(i)) for i in range(n)}
    tensors = tj.tensors(arrays)
    jax.block_until_ready(arrays)
    row(f"block_until_ready, {n} Tensors vs the arrays", lambda: jax.block_until_ready(arrays),
        lambda: jax.block_until_ready(tensors), number, rounds)  # fmt: skip
    tj.dispose(tensors)
    # The floor of any pytree node around an array: a slotted dataclass node whose array is a
    # plain slot (no property, no liveness check), which JAX also flattens in C++.
    bare = {k: _Bare(a) for k, a in arrays.items()}
    row(f"the same, {n} bare slotted dataclass nodes (any node's floor)",
        lambda: jax.block_until_ready(arrays), lambda: jax.block_until_ready(bare), number,
        rounds)  # fmt: skip


class _Bare:
    __slots__ = ("array",)

    def __init__(self, array: jax.Array) -> None:
        self.array = array


jax.tree_util.register_dataclass(_Bare, data_fields=["array"], meta_fields=[])


def _tracked_objects() -> int:
    """The objects the cyclic garbage collector tracks now (after a full collection)."""
    gc.collect()
    return len(gc.get_objects())


def tracked_per_leaf(n: int) -> None:
    """The objects the garbage collector tracks per leaf of a jitted step's new state, raw
    jax.jit against tidyjax.jit in a scope that hands the state out: each tracked object alive
    is one more the cyclic collector traverses (and promotes) at every collection."""

    def update(p: dict[str, jax.Array]) -> dict[str, jax.Array]:
        return jax.tree.map(lambda w: w * 0.99 + 0.01, p)

    raw_step, tj_step = jax.jit(update), tj.jit(update)
    raw = {f"w{i}": jnp.full((64,), float(i)) for i in range(n)}
    params = {f"w{i}": tj.tensor(np.full((64,), float(i), np.float32)) for i in range(n)}
    jax.block_until_ready(raw_step(raw))  # compile both outside the count
    with tj.tidy():
        tj_step(params)
    before = _tracked_objects()
    new_raw = jax.block_until_ready(raw_step(raw))
    per_raw = (_tracked_objects() - before) / n
    before = _tracked_objects()
    with tj.tidy() as scope:
        new = scope.keep(tj_step(params))
    jax.block_until_ready(new)
    per_tj = (_tracked_objects() - before) / n
    print()
    print(f"objects the garbage collector tracks per leaf of a jitted step's state ({n} leaves)")
    print(f"  raw jax.jit {per_raw:6.2f}   tidyjax.jit {per_tj:6.2f}   "
          f"difference {per_tj - per_raw:+6.2f}")  # fmt: skip
    del new_raw
    tj.dispose([new, params])


def _mlp(n: int = 256, hidden: int = 32) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 2)).astype(np.float32)
    y = np.sin(x[:, :1]).astype(np.float32)
    params = {
        "w1": rng.normal(size=(2, hidden)).astype(np.float32) * 0.5,
        "b1": np.zeros(hidden, np.float32),
        "w2": rng.normal(size=(hidden, 1)).astype(np.float32) * 0.5,
        "b2": np.zeros(1, np.float32),
    }
    return params, x, y


def optax_row(
    name: str, loss: Callable[..., jax.Array], params: Any, x: np.ndarray, y: np.ndarray,
    opt: Any, number: int, rounds: int, wait_last: bool = False,
) -> None:  # fmt: skip
    """One row: a jitted ``value_and_grad`` + optax step of ``loss`` on ``params``, raw JAX
    against tidyjax in a ``tidy`` that keeps the new state and disposes the last step's.
    ``wait_last``: the tidyjax step waits for the loss after its books (keep, exit, dispose),
    which then overlap the computation, rather than inside the scope."""

    def update(p: Any, s: Any, x: jax.Array, y: jax.Array) -> tuple[Any, Any, jax.Array]:
        value, grads = jax.value_and_grad(loss)(p, x, y)
        updates, s = opt.update(grads, s, p)
        return optax.apply_updates(p, updates), s, value

    raw_step = jax.jit(update)
    xr, yr = jnp.asarray(x), jnp.asarray(y)
    raw_state = {"p": jax.tree.map(jnp.asarray, params)}
    raw_state["s"] = opt.init(raw_state["p"])

    def raw() -> None:
        raw_state["p"], raw_state["s"], value = raw_step(raw_state["p"], raw_state["s"], xr, yr)
        value.block_until_ready()

    tj_step = tj.jit(update)
    xt, yt = tj.tensor(x), tj.tensor(y)
    tj_state = {"p": jax.tree.map(tj.tensor, params)}
    tj_state["s"] = tj.lift(opt.init)(tj_state["p"])

    def tracked() -> None:
        with tj.tidy() as scope:
            p, s, value = tj_step(tj_state["p"], tj_state["s"], xt, yt)
            scope.keep(p, s)
            value.block_until_ready()
        tj.dispose((tj_state["p"], tj_state["s"]))
        tj_state["p"], tj_state["s"] = p, s

    def tracked_wait_last() -> None:
        with tj.tidy() as scope:
            p, s, value = scope.keep(tj_step(tj_state["p"], tj_state["s"], xt, yt))
        tj.dispose((tj_state["p"], tj_state["s"]))
        tj_state["p"], tj_state["s"] = p, s
        value.block_until_ready()
        value.dispose()

    ratio = row(name, raw, tracked_wait_last if wait_last else tracked, number, rounds)
    tj.dispose([tj_state, xt, yt])

    # The floor: the same raw jitted step, then the jitted step's floor over its output leaves
    # (a slotted wrapper apiece in a dict keyed by id(array), delete() of the last step's state
    # and of the loss once read), in the tidyjax side's order.
    floor_state = {"p": jax.tree.map(jnp.asarray, params)}
    floor_state["s"] = opt.init(floor_state["p"])
    registry: dict[int, _Slot] = {}
    last = {"leaves": jax.tree.leaves((floor_state["p"], floor_state["s"]))}
    _track(registry, last["leaves"])

    def floor() -> None:
        p, s, value = raw_step(floor_state["p"], floor_state["s"], xr, yr)
        leaves = jax.tree.leaves((p, s))
        _track(registry, leaves)
        registry[id(value)] = _Slot(value)
        if not wait_last:
            value.block_until_ready()
        _free(registry, last["leaves"])
        floor_state["p"], floor_state["s"], last["leaves"] = p, s, leaves
        if wait_last:
            value.block_until_ready()
        _free(registry, [value])

    floor_line(ratio, row("floor: raw step + wrapper, dict entry, delete() per leaf", raw,
                          floor, number, rounds))  # fmt: skip
    _free(registry, last["leaves"])


def adam_step(number: int, rounds: int) -> None:
    params, x, y = _mlp()

    def loss(p: dict[str, jax.Array], x: jax.Array, y: jax.Array) -> jax.Array:
        h = jnp.tanh(x @ p["w1"] + p["b1"])
        return jnp.mean((h @ p["w2"] + p["b2"] - y) ** 2)

    optax_row("adam MLP training step (optax, 14 state leaves), jitted", loss, params, x, y,
              optax.adam(1e-2), number, rounds)  # fmt: skip
    optax_row("the same, waiting for the loss after the books", loss, params, x, y,
              optax.adam(1e-2), number, rounds, wait_last=True)  # fmt: skip


def _gc_clock() -> tuple[list[float], Callable[[str, dict[str, int]], None]]:
    """A gc callback summing the cyclic collector's time into ``total[0]`` and counting its
    full (generation-2) collections in ``total[2]``."""
    total = [0.0, 0.0, 0.0]

    def callback(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            total[1] = time.perf_counter()
            if info["generation"] == 2:
                total[2] += 1
        else:
            total[0] += time.perf_counter() - total[1]

    return total, callback


def breakdown(n: int, rounds: int) -> None:
    """Where a jitted step's time goes, per leaf: each phase of the tidyjax step timed on its
    own, beside raw JAX's own phases, in alternation (median of rounds)."""
    from tidyjax._lift import _traced
    from tidyjax._trees import unwrap, wrap_arrays

    def update(p: dict[str, jax.Array]) -> dict[str, jax.Array]:
        return jax.tree.map(lambda w: w * 0.99 + 0.01, p)

    raw_step = jax.jit(update)
    inner = jax.jit(_traced(update))  # what tidyjax.jit calls, on plain arrays
    raw = {f"w{i}": jnp.full((64,), float(i)) for i in range(n)}
    params = {f"w{i}": tj.tensor(np.full((64,), float(i), np.float32)) for i in range(n)}
    gc_time, callback = _gc_clock()
    phases: dict[str, list[float]] = {}
    full = {"raw": 0.0, "tidyjax": 0.0}

    def note(name: str, seconds: float) -> None:
        phases.setdefault(name, []).append(seconds / n * 1e6)

    pc = time.perf_counter
    gc.callbacks.append(callback)
    try:
        for r in range(rounds + 3):
            gc_time[0] = gc_time[2] = 0.0
            t0 = pc()
            out = raw_step(raw)
            t1 = pc()
            jax.block_until_ready(out)
            t2 = pc()
            raw = out  # the last step's arrays go with their last reference
            t3 = pc()
            raw_gc, raw_full = gc_time[0], gc_time[2]
            if r >= 3:
                full["raw"] += raw_full
                note("raw: JAX call", t1 - t0)
                note("raw: wait (block_until_ready)", t2 - t1)
                note("raw: last step's arrays dropped", t3 - t2)
                note("raw: garbage collector", raw_gc)
            gc_time[0] = gc_time[2] = 0.0
            t0 = pc()
            scope = tj.tidy()
            scope.__enter__()
            args = unwrap(params)
            t1 = pc()
            result = inner(args)
            t2 = pc()
            new = wrap_arrays(result)
            t3 = pc()
            scope.keep(new)
            t4 = pc()
            scope.__exit__(None, None, None)
            t5 = pc()
            tj.dispose(params)
            t6 = pc()
            jax.block_until_ready(new)
            t7 = pc()
            params = new
            t8 = pc()
            if r >= 3:
                full["tidyjax"] += gc_time[2]
                note("tidyjax: scope enter + unwrap arguments", t1 - t0)
                note("tidyjax: JAX call", t2 - t1)
                note("tidyjax: wrap outputs as Tensors", t3 - t2)
                note("tidyjax: hand out (scope.keep)", t4 - t3)
                note("tidyjax: scope exit", t5 - t4)
                note("tidyjax: dispose last step's Tensors", t6 - t5)
                note("tidyjax: wait (block_until_ready)", t7 - t6)
                note("tidyjax: last step's Tensors dropped", t8 - t7)
                note("tidyjax: garbage collector (inside the phases above)", gc_time[0])
    finally:
        gc.callbacks.remove(callback)
    tj.dispose(params)
    print()
    print(f"per-leaf breakdown of the jitted step, {n} leaves (µs per leaf, median)")
    totals = {"raw": 0.0, "tidyjax": 0.0}
    for name, values in phases.items():
        cost = statistics.median(values)
        side = name.split(":")[0]
        if "garbage" not in name:
            totals[side] += cost
        print(f"  {name:58s} {cost:8.3f}")
    print(f"  {'raw: total':58s} {totals['raw']:8.3f}")
    print(f"  {'tidyjax: total':58s} {totals['tidyjax']:8.3f}")
    for side in ("raw", "tidyjax"):
        print(f"  {side + ': full GC collections per 100 steps':58s} "
              f"{100 * full[side] / rounds:8.2f}")  # fmt: skip


def realistic_step(number: int, rounds: int) -> None:
    """A 6-layer MLP (width 256, batch 1024) trained with optax adam: a raw step of 5-10 ms on
    this 2-core CPU (the issue's "realistic step"), where the per-leaf cost is a small share."""
    rng = np.random.default_rng(0)
    sizes = [64, 256, 256, 256, 256, 256, 10]
    params = [
        {"w": (rng.normal(size=(a, b)) / np.sqrt(a)).astype(np.float32),
         "b": np.zeros(b, np.float32)}
        for a, b in itertools.pairwise(sizes)
    ]  # fmt: skip
    x = rng.normal(size=(1024, 64)).astype(np.float32)
    y = rng.integers(0, 10, size=1024)

    def loss(p: list[dict[str, jax.Array]], x: jax.Array, y: jax.Array) -> jax.Array:
        h = x
        for layer in p[:-1]:
            h = jax.nn.relu(h @ layer["w"] + layer["b"])
        logits = h @ p[-1]["w"] + p[-1]["b"]
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    optax_row("realistic step: 6-layer MLP, adam, batch 1024, jitted", loss, params, x, y,
              optax.adam(1e-3), number, rounds)  # fmt: skip


def scope_exit(rounds: int) -> None:
    """A scope's exit with N buffers made in it, per buffer, beside raw delete() of N such
    arrays and beside the floor: a slotted scope that sets and resets a context variable and
    deletes the arrays appended to its list (sampled in alternation, medians)."""
    print()
    print("scope exit with N buffers made in it (Tensors collected, raw arrays alive), beside")
    print("raw delete() of N such arrays, and the floor's exit (a slotted contextvar scope")
    print("deleting the arrays in its list)")
    print(f"{'workload':44s} {'exit µs/buffer':>16s} {'delete µs/buffer':>18s} {'ratio':>7s}")
    x = tj.tensor(jnp.ones(4))
    raw_x = jnp.ones(4)
    for n in (10, 1000, 100_000):
        exits, floors, deletes = [], [], []
        for _ in range(max(3, rounds // (1 + n // 10_000))):
            pool = [raw_x * 2.0 for _ in range(n)]
            jax.block_until_ready(pool)
            t0 = time.perf_counter()
            for a in pool:
                a.delete()
            deletes.append(time.perf_counter() - t0)
            del pool
            scope = tj.tidy()
            scope.__enter__()
            # Each Tensor is collected at once, its raw array lives on in the list: the scope
            # still owns and deletes every buffer.
            pool = [(x * 2.0).array for _ in range(n)]
            jax.block_until_ready(pool)
            t0 = time.perf_counter()
            scope.__exit__(None, None, None)
            exits.append(time.perf_counter() - t0)
            assert all(a.is_deleted() for a in pool)
            del pool
            floor = _FloorScope()
            floor.__enter__()
            made = _FLOOR_SCOPE.get()
            assert made is not None
            for _ in range(n):
                made.arrays.append(raw_x * 2.0)
            jax.block_until_ready(made.arrays)
            t0 = time.perf_counter()
            floor.__exit__(None, None, None)
            floors.append(time.perf_counter() - t0)
            assert all(a.is_deleted() for a in floor.arrays)
            del floor, made
        e, f = statistics.median(exits) / n, statistics.median(floors) / n
        d = statistics.median(deletes) / n
        print(f"{f'tidy scope, {n:,} buffers':44s} {e * 1e6:16.3f} {d * 1e6:18.3f} {e / d:7.2f}")
        print(f"{f'floor: slotted contextvar scope, {n:,}':44s} {f * 1e6:16.3f} "
              f"{d * 1e6:18.3f} {f / d:7.2f}")  # fmt: skip
        print(f"{'  tidyjax ratio / floor ratio':44s} {'':16s} {'':18s} {e / f:7.2f}",
              flush=True)  # fmt: skip
    x.dispose()


def timeline_open(number: int, rounds: int) -> None:
    """Eager ``t + 1.0`` (float32[256]) with a timeline open against the same with none (a
    fresh timeline per sample, opened and closed outside the timing), and the floor of an op's
    record: raw ``a + 1.0`` plus one ``(time, id, bytes)`` tuple appended to a list."""
    a = jnp.linspace(0.0, 1.0, 256)
    t = tj.tensor(a)
    ratio = row_in("eager t + 1.0, float32[256]: timeline open vs none", lambda: t + 1.0,
                   lambda: t + 1.0, number, rounds,
                   lambda: tj.timeline(max_events=100_000))  # fmt: skip
    events: list[tuple[float, int, int]] = []
    clock = time.perf_counter

    def floor() -> None:
        out = a + 1.0
        events.append((clock(), id(out), out.nbytes))

    floor_line(ratio, row("floor: a + 1.0 + a (time, id, nbytes) tuple appended", lambda: a + 1.0,
                          floor, number, rounds))  # fmt: skip
    (_, off, on), (_, raw, low) = ROWS[-2:]
    print(f"{'  µs added per op: timeline open, floor':58s} {'':10s} {(on - off) * 1e6:10.2f} "
          f"{(low - raw) * 1e6:7.2f}", flush=True)  # fmt: skip
    t.dispose()


def timeline_sampler(number: int, rounds: int) -> None:
    """A timeline around a raw JAX loop of 1,000 small jitted steps (float32[64, 64] and [8, 64]
    replaced each step, about 25 sampling intervals on a 2-core CPU) with its sampler at the
    default 5 ms against the same timeline with ``sample=None``: each call opens a timeline,
    runs the loop and closes it (the thread's start and join included)."""

    @jax.jit
    def step(w: jax.Array, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        return w - 0.01 * jnp.tanh(x @ w).mean(), x + 1.0

    w0, x0 = jnp.ones((64, 64), jnp.float32), jnp.ones((8, 64), jnp.float32)

    def loop(sample: float | None) -> Callable[[], None]:
        def run() -> None:
            with tj.timeline(max_events=100_000, sample=sample):
                w, x = w0, x0
                for _ in range(1000):
                    w, x = step(w, x)
                jax.block_until_ready(w)

        return run

    # Twice the rounds: a sample is one 15-30 ms loop, and the difference sought is a few %.
    row("timeline around 1,000 jitted steps: sampler (5 ms) vs none", loop(None), loop(0.005),
        max(1, number // 500), rounds * 2 + 1)  # fmt: skip


def profiler_check(number: int, rounds: int) -> None:
    """A scope asks JAX whether a profiler trace runs (to name itself in it): the cost of that
    check, an empty scope with it against one with the check replaced by a constant."""
    from tidyjax import _scope

    def empty_scope() -> None:
        with tj.tidy():
            pass

    real = _scope._profiling

    def without_check() -> None:
        _scope._profiling = bool  # bool() is False: no call into JAX
        try:
            for _ in range(100):
                empty_scope()
        finally:
            _scope._profiling = real

    def with_check() -> None:
        for _ in range(100):
            empty_scope()

    row("empty tidy scope x100: profiler check vs none (no trace)", without_check, with_check,
        max(1, number // 100), rounds)  # fmt: skip


def alias_exit(number: int, rounds: int) -> None:
    """A scope whose op reads a raw ``jax.device_put`` alias of an outer Tensor (a new array
    object over the same buffer, grouped at the exit and dropped there), beside 5,000 live
    Tensors: raw JAX vs tidyjax. The exit finds the alias's Tensors without a heap scan."""
    live = [tj.tensor(np.ones(4, np.float32)) for _ in range(5000)]
    x = tj.tensor(np.ones(100, np.float32))
    xr = jnp.ones(100, jnp.float32)

    def raw() -> None:
        a = jax.device_put(xr, jax.devices()[0])
        jax.block_until_ready(a * 2)

    def tracked() -> None:
        with tj.tidy():
            a = jax.device_put(x, jax.devices()[0])
            jax.block_until_ready(a * 2)

    row("scope with a device_put alias, 5,000 Tensors alive", raw, tracked, number, rounds)
    tj.dispose([live, x])


SECTIONS = (
    "eager",
    "alias",
    "jit",
    "block",
    "adam",
    "realistic",
    "profiler",
    "breakdown",
    "objects",
    "exit",
    "timeline",
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer calls and rounds")
    parser.add_argument(
        "--only", default=",".join(SECTIONS), help=f"comma-separated, of {', '.join(SECTIONS)}"
    )
    args = parser.parse_args()
    only = set(args.only.split(","))
    number, rounds = (500, 7) if args.quick else (2000, 15)
    print(f"jax {jax.__version__} on {jax.default_backend()}, tidyjax {tj.__version__}")
    print(HEADER)
    if "eager" in only:
        eager(number, rounds)
    if "alias" in only:
        alias_exit(max(1, number // 20), max(5, rounds // 2))
    if "jit" in only:
        ratios = {n: jitted_leaves(n, max(1, 20_000 // n), max(5, rounds // 2))
                  for n in (100, 1000, 10_000)}  # fmt: skip
        print(f"{'ratio(1000) / ratio(100)':58s} {'':10s} {'':10s} "
              f"{ratios[1000] / ratios[100]:7.3f}")  # fmt: skip
    if "block" in only:
        block_tree(1000, max(1, number // 10), rounds)
    if "adam" in only:
        adam_step(max(1, number // 10), rounds)
    if "realistic" in only:
        realistic_step(max(1, number // 200), rounds)
    if "profiler" in only:
        profiler_check(number, rounds)
    if "breakdown" in only:
        breakdown(1000, rounds * 2)
    if "objects" in only:
        tracked_per_leaf(1000)
    if "exit" in only:
        scope_exit(rounds)
    if "timeline" in only:
        timeline_open(number, rounds)
        timeline_sampler(number, rounds)


if __name__ == "__main__":
    main()
