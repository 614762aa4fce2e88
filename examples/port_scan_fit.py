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

import _ports
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
            scope.keep(new_params, inner_losses)
        tidyjax.dispose(params)
        params = new_params
        # Read the losses last: the wait for the device comes after tidyjax's books are done,
        # so they overlap the computation (JAX's asynchronous dispatch), as in the plain loop.
        history.append(inner_losses.tolist())  # Python floats
        inner_losses.dispose()
        yield params, history[-1]
    tidyjax.dispose(params)


# --- measuring both (examples/_ports.py) ---------------------------------------------------


def main(steps: int = 200, size: int = 1, timing_steps: int | None = None) -> dict:
    """Train both versions for ``steps`` steps each (memory), then time them interleaved."""
    return _ports.compare(
        lambda n: train_plain(n, size), lambda n: train_tidyjax(n, size), steps, timing_steps
    )


if __name__ == "__main__":
    _ports.cli(__file__, __doc__, main, SIZE_HELP)
