"""Port: a Flax NNX VAE (flax's examples/nnx_toy_examples/05_vae.py), plain and tidyjax.

Run:  pip install ".[examples]" && python examples/port_nnx_vae.py --steps 200

A small variational autoencoder on synthetic MNIST-shaped binary images (noisy copies of ten
random prototypes), trained with ``nnx.Optimizer``, ``nnx.value_and_grad`` and ``nnx.jit``.
The same loop runs twice:

* ``train_plain``: the program as written in a notebook, keeping each step's outputs (the loss
  and the batch of reconstructions, device arrays) in ``history``. Device memory grows with
  every step.
* ``train_tidyjax``: the port. The model keeps raw arrays in its ``nnx.Param``s, as NNX code
  does, and is named with ``tidyjax.watch`` for the reports; each step runs under
  ``tidyjax.tidy()``, with what it returns made Tensors by ``tidyjax.tensors``, so that the
  scope frees them; the loss is kept as a Python float. Memory is flat.
"""

from __future__ import annotations

import _ports
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

import tidyjax

SIZE_HELP = "multiplies the batch (64) and the hidden width (256)"
NUM_BATCHES = 4


def make_batches(batch_size: int, seed: int = 0) -> list[jax.Array]:
    """Binary 28x28 images: each a random one of ten prototypes with 5% of its pixels flipped."""
    rng = np.random.default_rng(seed)
    prototypes = rng.uniform(size=(10, 784)) < 0.3
    batches = []
    for _ in range(NUM_BATCHES):
        flips = rng.uniform(size=(batch_size, 784)) < 0.05
        images = prototypes[rng.integers(0, 10, batch_size)] ^ flips
        batches.append(jnp.asarray(images, jnp.float32))
    return batches


class Encoder(nnx.Module):
    def __init__(self, din: int, dmid: int, dout: int, *, rngs: nnx.Rngs):
        self.linear1 = nnx.Linear(din, dmid, rngs=rngs)
        self.linear_mean = nnx.Linear(dmid, dout, rngs=rngs)
        self.linear_std = nnx.Linear(dmid, dout, rngs=rngs)
        self.rngs = rngs

    def __call__(self, x):
        x = jax.nn.relu(self.linear1(x))
        mean = self.linear_mean(x)
        std = jnp.exp(self.linear_std(x))
        kl_loss = jnp.mean(0.5 * jnp.mean(-jnp.log(std**2) - 1.0 + std**2 + mean**2, axis=-1))
        z = mean + std * jax.random.normal(self.rngs.noise(), mean.shape)
        return z, kl_loss


class Decoder(nnx.Module):
    def __init__(self, din: int, dmid: int, dout: int, *, rngs: nnx.Rngs):
        self.linear1 = nnx.Linear(din, dmid, rngs=rngs)
        self.linear2 = nnx.Linear(dmid, dout, rngs=rngs)

    def __call__(self, z):
        return self.linear2(jax.nn.relu(self.linear1(z)))


class VAE(nnx.Module):
    def __init__(self, din: int, hidden_size: int, latent_size: int, *, rngs: nnx.Rngs):
        self.encoder = Encoder(din, hidden_size, latent_size, rngs=rngs)
        self.decoder = Decoder(latent_size, hidden_size, din, rngs=rngs)

    def __call__(self, x):
        z, kl_loss = self.encoder(x)
        return self.decoder(z), kl_loss


@nnx.jit
def train_step(model: VAE, optimizer: nnx.Optimizer, x: jax.Array):
    def loss_fn(model: VAE):
        logits, kl_loss = model(x)
        reconstruction_loss = jnp.mean(optax.sigmoid_binary_cross_entropy(logits, x))
        return reconstruction_loss + 0.1 * kl_loss, logits

    (loss, logits), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model)
    optimizer.update(model, grads)
    return loss, logits


def setup(size: int):
    batches = make_batches(64 * size)
    model = VAE(din=784, hidden_size=256 * size, latent_size=20, rngs=nnx.Rngs(0, noise=1))
    optimizer = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)
    return batches, model, optimizer


# --- the plain JAX program ------------------------------------------------------------------


def train_plain(steps: int, size: int = 1):
    """Yields ``(model, loss)`` after each step, so that a harness can measure between steps."""
    batches, model, optimizer = setup(size)
    history = []
    for i in range(steps):
        outputs = train_step(model, optimizer, batches[i % NUM_BATCHES])
        history.append(outputs)  # the loss and the reconstructions: memory grows with steps
        yield model, history[-1][0]


# --- the tidyjax port -----------------------------------------------------------------------


def train_tidyjax(steps: int, size: int = 1):
    """Yields ``(model, loss)`` after each step, so that a harness can measure between steps."""
    batches, model, optimizer = setup(size)
    tidyjax.watch(model, "model")
    tidyjax.watch(optimizer, "optimizer")
    history = []
    for i in range(steps):
        with tidyjax.tidy():
            outputs = tidyjax.tensors(train_step(model, optimizer, batches[i % NUM_BATCHES]))
            history.append(float(outputs[0]))  # the loss as a float; the scope frees the rest
        yield model, history[-1]
    tidyjax.unwatch(model)
    tidyjax.unwatch(optimizer)


# --- measuring both (examples/_ports.py) ---------------------------------------------------


def main(steps: int = 200, size: int = 1, timing_steps: int | None = None) -> dict:
    """Train both versions for ``steps`` steps each (memory), then time them interleaved."""
    return _ports.compare(
        lambda n: train_plain(n, size), lambda n: train_tidyjax(n, size), steps, timing_steps
    )


if __name__ == "__main__":
    _ports.cli(__file__, __doc__, main, SIZE_HELP)
