"""Train a small MLP with optax on a synthetic regression task, each step under tidy.

Run:  pip install ".[examples]" && python examples/train_mlp.py

Parameters and optimizer state are pytrees of Tensors that each step returns; the loop disposes
the previous ones. Every intermediate of a step (activations, gradients, updates) is freed when
the step ends, so memory() is the same after step 10 and after step 200.
"""

from __future__ import annotations

import jax
import numpy as np
import optax

import tidyjax as tj
import tidyjax.numpy as tnp
from tidyjax import tidy


def make_data(n: int = 256, seed: int = 0) -> tuple[tj.Tensor, tj.Tensor]:
    rng = np.random.default_rng(seed)
    x = rng.uniform(-2.0, 2.0, size=(n, 2)).astype(np.float32)
    y = (np.sin(x[:, :1]) + 0.5 * x[:, 1:] ** 2).astype(np.float32)
    return tj.tensor(x), tj.tensor(y)


def init_params(hidden: int = 32, seed: int = 1) -> dict[str, tj.Tensor]:
    k1, k2 = jax.random.split(jax.random.key(seed))
    return {
        "w1": tj.tensor(jax.random.normal(k1, (2, hidden)) * 0.5),
        "b1": tj.tensor(np.zeros(hidden, np.float32)),
        "w2": tj.tensor(jax.random.normal(k2, (hidden, 1)) * 0.2),
        "b2": tj.tensor(np.zeros(1, np.float32)),
    }


def loss_fn(params, x, y):
    h = tnp.tanh(x @ params["w1"] + params["b1"])
    pred = h @ params["w2"] + params["b2"]
    return ((pred - y) ** 2).mean()


def train(steps: int = 200, log_every: int = 10, lr: float = 0.03, verbose: bool = True):
    """Returns [(step, loss, num_tensors, num_bytes)] every ``log_every`` steps."""
    x, y = make_data()
    params = init_params()
    opt = optax.adam(lr)
    # lift: any JAX library function takes Tensors and returns tracked Tensors
    opt_init, opt_update = tj.lift(opt.init), tj.lift(opt.update)
    apply_updates = tj.lift(optax.apply_updates)
    opt_state = opt_init(params)
    grad_fn = tj.value_and_grad(loss_fn)

    @tidy("step")
    def step(params, opt_state):
        loss, grads = grad_fn(params, x, y)
        updates, opt_state = opt_update(grads, opt_state, params)
        return apply_updates(params, updates), opt_state, loss

    log = []
    untracked = tj.memory().untracked_arrays  # raw arrays others in this process hold
    for i in range(1, steps + 1):
        new_params, new_state, loss = step(params, opt_state)
        tj.dispose((params, opt_state))  # the previous step's values are no longer needed
        params, opt_state = new_params, new_state
        if i % log_every == 0:
            m = tj.memory()
            assert m.untracked_arrays == untracked, m.reasons  # the loop's arrays are Tensors
            log.append((i, loss.item(), m.num_tensors, m.num_bytes))
            if verbose:
                print(f"step {i:4d}  loss {loss.item():.4f}  tensors {m.num_tensors}  "
                      f"bytes {m.num_bytes}")  # fmt: skip
        loss.dispose()
    tj.dispose([params, opt_state, x, y])
    return log


if __name__ == "__main__":
    train()
