"""Port: JAX's MNIST classifier (examples/mnist_classifier*.py) with optax, plain and tidyjax.

Run:  pip install ".[examples]" && python examples/port_mnist_optax.py --steps 200 [--size 8]

A 784 -> 128 -> 10 MLP (``--size k`` multiplies the hidden width and the batch by k) trained
with ``jax.value_and_grad``, ``optax.adam`` and ``optax.apply_updates`` on synthetic
MNIST-shaped data (random images, labels from a fixed random linear teacher). The same loop
runs twice:

* ``train_plain``: the program as written for plain JAX, keeping each step's loss, a device
  array, in a list. Device memory grows with every step.
* ``train_tidyjax``: the port. The step is the same function under ``tidyjax.jit`` (the raw
  ``jax.value_and_grad`` and optax calls inside it are unchanged), the parameters are converted
  once with ``tidyjax.tensors``, and each step runs under ``tidyjax.tidy()``, keeping the new
  parameters and disposing the previous ones. Memory is flat.

``examples/PORTS.md`` shows the changed lines as a diff and the measured results.
"""

from __future__ import annotations

import argparse
import itertools
import pathlib
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.scipy.special import logsumexp

import tidyjax

SIZE_HELP = "multiplies the hidden width and the batch (128 each)"
STEP_SIZE = 1e-3
NUM_BATCHES = 4


def make_batches(batch_size: int, seed: int = 0) -> list[tuple[jax.Array, jax.Array]]:
    """Synthetic MNIST: 28x28 images in [0, 1], ten classes given by a random linear teacher."""
    rng = np.random.default_rng(seed)
    teacher = rng.normal(size=(784, 10)).astype(np.float32)
    batches = []
    for _ in range(NUM_BATCHES):
        images = rng.uniform(0.0, 1.0, size=(batch_size, 784)).astype(np.float32)
        labels = np.argmax((images - 0.5) @ teacher, axis=1)
        batches.append((jnp.asarray(images), jnp.asarray(np.eye(10, dtype=np.float32)[labels])))
    return batches


def init_random_params(scale: float, layer_sizes: list[int], seed: int = 0):
    rng = np.random.RandomState(seed)
    return [
        (
            jnp.asarray(scale * rng.randn(m, n), jnp.float32),
            jnp.asarray(scale * rng.randn(n), jnp.float32),
        )
        for m, n in itertools.pairwise(layer_sizes)
    ]


def predict(params, inputs):
    activations = inputs
    for w, b in params[:-1]:
        activations = jnp.tanh(jnp.dot(activations, w) + b)
    final_w, final_b = params[-1]
    logits = jnp.dot(activations, final_w) + final_b
    return logits - logsumexp(logits, axis=1, keepdims=True)


def loss(params, batch):
    inputs, targets = batch
    return -jnp.mean(jnp.sum(predict(params, inputs) * targets, axis=1))


opt = optax.adam(STEP_SIZE)


def update(params, opt_state, batch):
    value, grads = jax.value_and_grad(loss)(params, batch)
    updates, opt_state = opt.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, value


# --- the plain JAX program ------------------------------------------------------------------


def train_plain(steps: int, size: int = 1):
    """Yields ``(params, loss)`` after each step, so that a harness can measure between steps."""
    batches = make_batches(128 * size)
    params = init_random_params(0.1, [784, 128 * size, 10])
    opt_state = opt.init(params)
    step = jax.jit(update)
    losses = []
    for i in range(steps):
        params, opt_state, value = step(params, opt_state, batches[i % NUM_BATCHES])
        losses.append(value)  # one device array per step: memory grows with steps
        yield params, losses[-1]


# --- the tidyjax port -----------------------------------------------------------------------


def train_tidyjax(steps: int, size: int = 1):
    """Yields ``(params, loss)`` after each step, so that a harness can measure between steps."""
    batches = make_batches(128 * size)
    params = init_random_params(0.1, [784, 128 * size, 10])
    opt_state = opt.init(params)
    params, opt_state = tidyjax.tensors((params, opt_state))
    step = tidyjax.jit(update)
    losses = []
    for i in range(steps):
        with tidyjax.tidy() as scope:
            new_params, new_state, value = step(params, opt_state, batches[i % NUM_BATCHES])
            losses.append(float(value))  # a Python float; the Tensor is freed with the scope
            scope.keep(new_params, new_state)
        tidyjax.dispose((params, opt_state))
        params, opt_state = new_params, new_state
        yield params, losses[-1]
    tidyjax.dispose((params, opt_state))


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
