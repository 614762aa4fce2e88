"""The core's tracking cost, as the targets of the core issue: tidyjax vs raw JAX, side by side.

Run:  python benchmarks/core.py            (a few minutes on 2 CPU cores)
      python benchmarks/core.py --quick    (fewer rounds)

Every ratio compares two things sampled in alternation in the same run (median of rounds), so
machine noise hits both sides. The same script runs on a GPU machine unchanged.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from _timing import side_by_side

import tidyjax as tj
import tidyjax.numpy as tnp

ROWS: list[tuple[str, float, float]] = []


def row(name: str, raw: Callable[[], object], tracked: Callable[[], object], number: int,
        rounds: int) -> None:  # fmt: skip
    gc.collect()
    r, w = side_by_side(raw, tracked, number, rounds)
    ROWS.append((name, r, w))
    print(f"{name:58s} {r * 1e6:10.1f} {w * 1e6:10.1f} {w / r:7.3f}", flush=True)


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
    row("lifted tnp.tanh(x) vs jnp.tanh, float32[256]", lambda: jnp.tanh(x),
        lambda: tnp.tanh(t), number, rounds)  # fmt: skip
    row("lifted tnp.add(x, y) vs jnp.add", lambda: jnp.add(x, y), lambda: tnp.add(t, u),
        number, rounds)  # fmt: skip
    row("t.exp() vs jnp.exp(x)", lambda: jnp.exp(x), lambda: t.exp(), number, rounds)

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

    name = f"jitted step, {n} leaves, tidy vs raw jit"
    gc.collect()
    r, w = side_by_side(raw, tracked, number, rounds)
    ROWS.append((name, r, w))
    print(f"{name:58s} {r * 1e6:10.1f} {w * 1e6:10.1f} {w / r:7.3f}", flush=True)
    tj.dispose(params["tj"])
    return w / r


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


def adam_step(number: int, rounds: int) -> None:
    params, x, y = _mlp()
    opt = optax.adam(1e-2)

    def loss(p: dict[str, jax.Array], x: jax.Array, y: jax.Array) -> jax.Array:
        h = jnp.tanh(x @ p["w1"] + p["b1"])
        return jnp.mean((h @ p["w2"] + p["b2"] - y) ** 2)

    def update(p: dict, s: object, x: jax.Array, y: jax.Array) -> tuple[dict, object, jax.Array]:
        value, grads = jax.value_and_grad(loss)(p, x, y)
        updates, s = opt.update(grads, s, p)
        return optax.apply_updates(p, updates), s, value

    raw_step = jax.jit(update)
    xr, yr = jnp.asarray(x), jnp.asarray(y)
    raw_state = {"p": jax.tree.map(jnp.asarray, params)}
    raw_state["s"] = opt.init(raw_state["p"])

    def raw() -> None:
        raw_state["p"], raw_state["s"], loss = raw_step(raw_state["p"], raw_state["s"], xr, yr)
        loss.block_until_ready()

    tj_step = tj.jit(update)
    xt, yt = tj.tensor(x), tj.tensor(y)
    tj_state = {"p": jax.tree.map(tj.tensor, params)}
    tj_state["s"] = tj.lift(opt.init)(tj_state["p"])

    def tracked() -> None:
        with tj.tidy() as scope:
            p, s, loss = tj_step(tj_state["p"], tj_state["s"], xt, yt)
            scope.keep(p, s)
            loss.block_until_ready()
        tj.dispose((tj_state["p"], tj_state["s"]))
        tj_state["p"], tj_state["s"] = p, s

    row("adam MLP training step (optax, 14 state leaves), jitted", raw, tracked, number,
        rounds)  # fmt: skip
    tj.dispose([tj_state, xt, yt])


def scope_exit(rounds: int) -> None:
    print()
    print(f"{'scope exit with N tensors made in it':44s} {'µs / scope':>12s} {'µs / tensor':>12s}")
    x = tj.tensor(jnp.ones(4))
    for n in (10, 1000, 100_000):
        samples = []
        for _ in range(max(3, rounds // (1 + n // 10_000))):
            scope = tj.tidy()
            scope.__enter__()
            # Each Tensor is collected at once, its raw array lives on in the list: the scope
            # still owns and deletes every buffer.
            pool = [(x * 2.0).array for _ in range(n)]
            t0 = time.perf_counter()
            scope.__exit__(None, None, None)
            samples.append(time.perf_counter() - t0)
            assert all(a.is_deleted() for a in pool)
        cost = statistics.median(samples)
        print(f"{n:44d} {cost * 1e6:12.1f} {cost / n * 1e6:12.3f}", flush=True)
    x.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer calls and rounds")
    args = parser.parse_args()
    number, rounds = (500, 7) if args.quick else (2000, 15)
    print(f"jax {jax.__version__} on {jax.default_backend()}, tidyjax {tj.__version__}")
    print(f"{'workload':58s} {'raw µs':>10s} {'tidyjax µs':>10s} {'ratio':>7s}")
    eager(number, rounds)
    ratios = {n: jitted_leaves(n, max(1, 20_000 // n), max(5, rounds // 2))
              for n in (100, 1000, 10_000)}  # fmt: skip
    print(f"{'ratio(1000) / ratio(100)':58s} {'':10s} {'':10s} {ratios[1000] / ratios[100]:7.3f}")
    adam_step(max(1, number // 10), rounds)
    scope_exit(rounds)


if __name__ == "__main__":
    main()
