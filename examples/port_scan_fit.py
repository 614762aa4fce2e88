"""Port: a fit loop with ``jax.lax.scan`` inside the jitted step, plain and tidyjax.

Run:  python examples/port_scan_fit.py --steps 200

A common pattern for fast training on small models: each jitted outer step runs several inner
SGD steps over a stack of minibatches with ``jax.lax.scan`` (the parameters are the carry) and
returns the new parameters and the loss of every inner step. Here a 16 -> 64 -> 1 tanh MLP
regresses a smooth synthetic target with 8 inner steps per outer step. The same loop runs
twice:

* ``train_plain``: the program as written for plain JAX, keeping each outer step's array of
  inner losses in ``history``. Device memory grows with every step.
* ``train_tidyjax``: the port. The outer step is the same function under ``tidyjax.jit`` (the
  ``jax.lax.scan``, ``jax.value_and_grad`` and ``jax.tree.map`` inside it unchanged), the
  parameters are converted once with ``tidyjax.tensors``, and each outer step runs under
  ``tidyjax.tidy()``, keeping the new parameters and disposing the previous ones; the losses
  are kept as Python floats. Memory is flat.
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

import tidyjax

SIZE_HELP = "multiplies the minibatch (64) and the hidden width (64)"
INNER_STEPS = 8
NUM_BATCHES = 4
LEARNING_RATE = 0.05


def make_batches(batch_size: int, seed: int = 0) -> list[tuple[jax.Array, jax.Array]]:
    """Stacks of INNER_STEPS minibatches: x in [-1, 1]^16, y = sin(x @ a) + 0.5 * cos(x @ b)."""
    rng = np.random.default_rng(seed)
    a, b = rng.normal(size=(2, 16, 1)).astype(np.float32)
    batches = []
    for _ in range(NUM_BATCHES):
        x = rng.uniform(-1.0, 1.0, size=(INNER_STEPS, batch_size, 16)).astype(np.float32)
        y = np.sin(x @ a) + 0.5 * np.cos(x @ b)
        batches.append((jnp.asarray(x), jnp.asarray(y)))
    return batches


def init_params(hidden: int, seed: int = 0) -> dict[str, jax.Array]:
    k1, k2 = jax.random.split(jax.random.key(seed))
    return {
        "w1": jax.random.normal(k1, (16, hidden)) / 4.0,
        "b1": jnp.zeros(hidden),
        "w2": jax.random.normal(k2, (hidden, 1)) / jnp.sqrt(hidden),
        "b2": jnp.zeros(1),
    }


def loss_fn(params, x, y):
    h = jnp.tanh(x @ params["w1"] + params["b1"])
    return jnp.mean((h @ params["w2"] + params["b2"] - y) ** 2)


def fit_step(params, xs, ys):
    """INNER_STEPS steps of SGD, one per minibatch of ``xs``/``ys``, in one ``jax.lax.scan``."""

    def inner(params, batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, *batch)
        params = jax.tree.map(lambda p, g: p - LEARNING_RATE * g, params, grads)
        return params, loss

    return jax.lax.scan(inner, params, (xs, ys))


# --- the plain JAX program ------------------------------------------------------------------


def train_plain(steps: int, size: int = 1):
    """Yields ``(params, losses)`` after each step, so that a harness can measure between steps."""
    batches = make_batches(64 * size)
    params = init_params(64 * size)
    step = jax.jit(fit_step)
    history = []
    for i in range(steps):
        params, inner_losses = step(params, *batches[i % NUM_BATCHES])
        history.append(inner_losses)  # one device array per step: memory grows with steps
        yield params, history[-1]


# --- the tidyjax port -----------------------------------------------------------------------


def train_tidyjax(steps: int, size: int = 1):
    """Yields ``(params, losses)`` after each step, so that a harness can measure between steps."""
    batches = make_batches(64 * size)
    params = tidyjax.tensors(init_params(64 * size))
    step = tidyjax.jit(fit_step)
    history = []
    for i in range(steps):
        with tidyjax.tidy() as scope:
            new_params, inner_losses = step(params, *batches[i % NUM_BATCHES])
            history.append(inner_losses.tolist())  # Python floats; the Tensor is freed
            scope.keep(new_params)
        tidyjax.dispose(params)
        params = new_params
        yield params, history[-1]
    tidyjax.dispose(params)


# --- measuring both -------------------------------------------------------------------------


def live_bytes() -> int:
    """Bytes held by every live ``jax.Array`` of this process (its device memory on CPU)."""
    return sum(a.nbytes for a in jax.live_arrays())


def run_alone(loop) -> tuple[int, float]:
    """Run a loop to its end; returns (live bytes after the last step minus after the first,
    the last loss)."""
    after = []
    for params, loss in loop:
        last = loss  # read only after the loop: float(jax.Array) makes an aliasing jax.Array
        jax.block_until_ready(params)
        after.append(live_bytes())
    del params, loss
    return after[-1] - after[0], float(np.ravel(last)[-1])


def time_interleaved(loops, steps: int, warmup: int = 3) -> tuple[float, float]:
    """Median step times (s) of ``loops[0]`` and ``loops[1]``: each a function making a loop of
    so many steps, the two stepped in alternation (which goes first alternates too), timed after
    ``warmup`` steps of each."""
    loops = [make(warmup + steps) for make in loops]
    times: dict[int, list[float]] = {0: [], 1: []}
    for i in range(warmup + steps):
        for k in (0, 1) if i % 2 == 0 else (1, 0):
            t0 = time.perf_counter()
            jax.block_until_ready(next(loops[k])[0])
            if i >= warmup:
                times[k].append(time.perf_counter() - t0)
    for loop in loops:
        for _ in loop:  # run each to its end: the port disposes its last parameters
            pass
    return statistics.median(times[0]), statistics.median(times[1])


def main(steps: int = 200, size: int = 1, timing_steps: int | None = None) -> dict:
    """Train both versions for ``steps`` steps each (memory), then time them interleaved."""
    plain_growth, plain_loss = run_alone(train_plain(steps, size))
    port_growth, port_loss = run_alone(train_tidyjax(steps, size))
    loops = (lambda n: train_plain(n, size), lambda n: train_tidyjax(n, size))
    plain_s, port_s = time_interleaved(loops, steps if timing_steps is None else timing_steps)
    return {
        "steps": steps,
        "plain_growth_bytes": plain_growth,
        "tidyjax_growth_bytes": port_growth,
        "ratio": port_s / plain_s,
        "final_loss_plain": plain_loss,
        "final_loss_tidyjax": port_loss,
        "plain_step_us": plain_s * 1e6,
        "tidyjax_step_us": port_s * 1e6,
    }


def report(r: dict) -> str:
    return (
        f"{pathlib.Path(__file__).stem}: {r['steps']} steps\n"
        f"  device memory growth after step 1: plain {r['plain_growth_bytes']:,} bytes, "
        f"tidyjax {r['tidyjax_growth_bytes']:,} bytes\n"
        f"  median step time tidyjax / plain: {r['ratio']:.3f} "
        f"({r['tidyjax_step_us']:,.0f} / {r['plain_step_us']:,.0f} µs)\n"
        f"  final loss: plain {r['final_loss_plain']:.6f}, tidyjax {r['final_loss_tidyjax']:.6f}"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--size", type=int, default=1, help=SIZE_HELP)
    args = parser.parse_args()
    print(report(main(steps=args.steps, size=args.size)))
