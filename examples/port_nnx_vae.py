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

import argparse
import pathlib
import statistics
import time

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
