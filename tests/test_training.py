"""A real training loop: an optax MLP, each step under tidy; memory is flat and the loss falls."""

from __future__ import annotations

import importlib.util
import pathlib

import numpy as np
import pytest

import tidyjax as tj
from tidyjax import tidy

from .conftest import counts

optax = pytest.importorskip("optax")

EXAMPLE = pathlib.Path(__file__).resolve().parent.parent / "examples" / "train_mlp.py"


def _load_example():
    spec = importlib.util.spec_from_file_location("train_mlp", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_optax_mlp_loss_falls_and_memory_is_identical_after_step_10_and_200():
    log = _load_example().train(steps=200, log_every=10, verbose=False)
    by_step = {step: (loss, n, nbytes) for step, loss, n, nbytes in log}
    loss10, tensors10, bytes10 = by_step[10]
    loss200, tensors200, bytes200 = by_step[200]
    assert loss200 < loss10 * 0.1
    assert (tensors10, bytes10) == (tensors200, bytes200)
    assert {n for _, _, n, _ in log} == {tensors10}  # flat at every logged step
    assert counts() == (0, 0, 0)  # the example disposes everything at the end


def test_sgd_on_variables_inside_tidy():
    rng = np.random.default_rng(0)
    x = tj.tensor(rng.normal(size=(64, 3)).astype(np.float32))
    y = x @ tj.tensor([[1.0], [-2.0], [0.5]])
    w = tj.Variable(np.zeros((3, 1), np.float32), name="w")

    def loss(w):
        return ((x @ w - y) ** 2).mean()

    grad = tj.jit(tj.grad(loss))  # jitted: an eager grad retraces on every one of 100 steps
    with tidy():  # the eager grad computes the same step
        np.testing.assert_allclose(tj.grad(loss)(w).numpy(), grad(w).numpy(), rtol=1e-6)
    sizes = []
    for _ in range(100):
        with tidy("sgd"):
            w.assign(w - 0.1 * grad(w))
        # Without a collection: the scope's exit, not the garbage collector, frees each step.
        sizes.append(tj.memory(scan_untracked=False))
    np.testing.assert_allclose(w.numpy().ravel(), [1.0, -2.0, 0.5], atol=1e-3)
    counted = [(m.num_tensors, m.num_data_buffers, m.num_bytes) for m in sizes]
    assert len(set(counted)) == 1 and counted[0][0] == 3  # x, y, w: nothing accumulates
    assert counts() == counted[0]  # and a full collection finds nothing more to free
    tj.dispose([x, y])
    tj.dispose_variables()
