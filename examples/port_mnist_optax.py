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

import itertools

import _ports
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


# --- measuring both (examples/_ports.py) ---------------------------------------------------


def main(steps: int = 200, size: int = 1, timing_steps: int | None = None) -> dict:
    """Train both versions for ``steps`` steps each (memory), then time them interleaved."""
    return _ports.compare(
        lambda n: train_plain(n, size), lambda n: train_tidyjax(n, size), steps, timing_steps
    )


if __name__ == "__main__":
    _ports.cli(__file__, __doc__, main, SIZE_HELP)
