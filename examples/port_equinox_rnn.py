"""Port: Equinox's RNN example (docs/examples/train_rnn), plain and tidyjax.

Run:  pip install ".[examples]" && python examples/port_equinox_rnn.py --steps 200

A GRU-cell RNN (``eqx.nn.GRUCell`` run over the sequence with ``jax.lax.scan``, then a linear
head and a sigmoid) learns whether a spiral turns clockwise or anticlockwise, with
``eqx.filter_value_and_grad``, ``eqx.filter_jit`` and ``optax.adam``. The same loop runs twice:

* ``train_plain``: the program as written in a notebook, keeping each step's loss (a device
  array) in ``history`` to plot later. Device memory grows with every step.
* ``train_tidyjax``: the port. The model and optimizer state are converted once with
  ``tidyjax.tensors``; the ``eqx.filter_jit`` step stays as it is, wrapped in ``tidyjax.lift``
  so that what it returns is tracked; each step runs under ``tidyjax.tidy()``, keeping the new
  model and optimizer state and disposing the previous ones. Memory is flat.
"""

from __future__ import annotations

import itertools
import math

import _ports
import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import optax

import tidyjax

SIZE_HELP = "multiplies the batch (32) and the hidden size (16)"
LEARNING_RATE = 3e-3


def get_data(dataset_size, *, key):
    t = jnp.linspace(0, 2 * math.pi, 16)
    offset = jr.uniform(key, (dataset_size, 1), minval=0, maxval=2 * math.pi)
    x1 = jnp.sin(t + offset) / (1 + t)
    x2 = jnp.cos(t + offset) / (1 + t)
    y = jnp.ones((dataset_size, 1))
    half_dataset_size = dataset_size // 2
    x1 = x1.at[:half_dataset_size].multiply(-1)
    y = y.at[:half_dataset_size].set(0)
    x = jnp.stack([x1, x2], axis=-1)
    return x, y


def dataloader(arrays, batch_size, *, key):
    dataset_size = arrays[0].shape[0]
    indices = jnp.arange(dataset_size)
    while True:
        perm = jr.permutation(key, indices)
        (key,) = jr.split(key, 1)
        start, end = 0, batch_size
        while end <= dataset_size:
            batch_perm = perm[start:end]
            yield tuple(array[batch_perm] for array in arrays)
            start, end = end, end + batch_size


class RNN(eqx.Module):
    hidden_size: int = eqx.field(static=True)
    cell: eqx.nn.GRUCell
    linear: eqx.nn.Linear
    bias: jax.Array

    def __init__(self, in_size, out_size, hidden_size, *, key):
        ckey, lkey = jr.split(key)
        self.hidden_size = hidden_size
        self.cell = eqx.nn.GRUCell(in_size, hidden_size, key=ckey)
        self.linear = eqx.nn.Linear(hidden_size, out_size, use_bias=False, key=lkey)
        self.bias = jnp.zeros(out_size)

    def __call__(self, input):
        hidden = jnp.zeros((self.hidden_size,))

        def f(carry, inp):
            return self.cell(inp, carry), None

        out, _ = jax.lax.scan(f, hidden, input)
        return jax.nn.sigmoid(self.linear(out) + self.bias)


@eqx.filter_value_and_grad
def compute_loss(model, x, y):
    pred_y = jax.vmap(model)(x)
    return -jnp.mean(y * jnp.log(pred_y) + (1 - y) * jnp.log(1 - pred_y))


optim = optax.adam(LEARNING_RATE)


def make_step(model, x, y, opt_state):
    loss, grads = compute_loss(model, x, y)
    updates, opt_state = optim.update(grads, opt_state)
    model = eqx.apply_updates(model, updates)
    return loss, model, opt_state


def setup(size):
    data_key, loader_key, model_key = jr.split(jr.PRNGKey(5678), 3)
    xs, ys = get_data(10000, key=data_key)
    iter_data = dataloader((xs, ys), 32 * size, key=loader_key)
    model = RNN(in_size=2, out_size=1, hidden_size=16 * size, key=model_key)
    return iter_data, model


# --- the plain JAX program ------------------------------------------------------------------


def train_plain(steps: int, size: int = 1):
    """Yields ``(model, loss)`` after each step, so that a harness can measure between steps."""
    iter_data, model = setup(size)
    opt_state = optim.init(model)
    step_fn = eqx.filter_jit(make_step)
    history = []
    for x, y in itertools.islice(iter_data, steps):
        loss, model, opt_state = step_fn(model, x, y, opt_state)
        history.append(loss)  # one device array per step: memory grows with steps
        yield model, history[-1]


# --- the tidyjax port -----------------------------------------------------------------------


def train_tidyjax(steps: int, size: int = 1):
    """Yields ``(model, loss)`` after each step, so that a harness can measure between steps."""
    iter_data, model = setup(size)
    opt_state = optim.init(model)
    model, opt_state = tidyjax.tensors((model, opt_state))
    step_fn = tidyjax.lift(eqx.filter_jit(make_step))
    history = []
    for x, y in itertools.islice(iter_data, steps):
        with tidyjax.tidy() as scope:
            loss, new_model, new_state = step_fn(model, x, y, opt_state)
            scope.keep(loss, new_model, new_state)
        tidyjax.dispose((model, opt_state))
        model, opt_state = new_model, new_state
        # Read the loss last: the wait for the device comes after tidyjax's books are done, so
        # they overlap the computation (JAX's asynchronous dispatch), as in the plain loop.
        history.append(float(loss))  # a Python float
        loss.dispose()
        yield model, history[-1]
    tidyjax.dispose((model, opt_state))


# --- measuring both (examples/_ports.py) ---------------------------------------------------


def main(steps: int = 200, size: int = 1, timing_steps: int | None = None) -> dict:
    """Train both versions for ``steps`` steps each (memory), then time them interleaved."""
    return _ports.compare(
        lambda n: train_plain(n, size), lambda n: train_tidyjax(n, size), steps, timing_steps
    )


if __name__ == "__main__":
    _ports.cli(__file__, __doc__, main, SIZE_HELP)
