"""Issue 41's "Done when" on eight real programs: the leak guide's recipe on each, clean and
with a planted leak, and a timeline around the plain MNIST loop without ``mark()``.

Run:  python benchmarks/leak_programs.py                  (about four minutes on 2 CPU cores)
      python benchmarks/leak_programs.py --only nnx_mnist --repeat 3
      python benchmarks/leak_programs.py --only timeline --rounds 11

The programs are shortened ports of public ones, on synthetic data of the right shapes (no
download), a few steps each:

1. ``fromscratch``: JAX's ``examples/mnist_classifier_fromscratch.py`` (a 784-1024-1024-10
   tanh MLP, ``jax.grad``, SGD by hand, an epoch's accuracy printed);
2. ``stax``: JAX's ``examples/mnist_classifier.py`` (``jax.example_libraries.stax`` and
   ``optimizers.momentum``);
3. ``equinox_rnn``: Equinox's RNN example (an ``eqx.nn.GRUCell`` RNN, ``optax.adam``; the
   model from ``examples/port_equinox_rnn.py``);
4. ``nnx_vae``: Flax NNX's VAE example (the model from ``examples/port_nnx_vae.py``; the
   loop keeps ``np.asarray(loss)``, as the example does);
5. ``nnx_mnist``: Flax NNX's MNIST tutorial (a CNN, ``nnx.Optimizer``, ``nnx.MultiMetric``,
   ``@nnx.jit`` train and eval steps, the metrics history kept and printed);
6. ``optax_fit``: optax's getting-started ``fit`` loop with ``optax.adam``;
7. ``optax_accumulate``: optax's gradient-accumulation notebook (``optax.MultiSteps`` over a
   learning-rate schedule; the single-batch and accumulated fits agree);
8. ``optax_scan``: a ``jax.lax.scan`` training loop (``examples/port_scan_fit.py``'s model)
   with ``optax.chain(clip_by_global_norm, adamw(warmup_cosine_decay_schedule))``.

Each runs its training loop under the guide's recipe: one step before the check (the
warm-up), ``with tj.check_leaks() as checker:`` around the loop, ``checker.allow(...)`` of
the state the program keeps on purpose, ``except tj.LeakError``. First with no leak planted:
the check must be clean (loop variables and NumPy views are listed apart, not counted). Then
with a planted leak, ``CACHE.append(<an array made on that line>)`` once per step: the check
must find exactly one array per step, in one group whose chain of lines holds the append's
file and line.

Then a `tidyjax.timeline` (the default sampler, no ``mark()``) around the plain MNIST loop
(program 1, the leak planted into a list local to the run, a batch large enough that a step
lasts at least 20 sampling intervals): its peak against the true peak, that of a timeline
with ``tl.mark()`` after every step (and the live ``jax.Array`` bytes, each buffer once,
summed after every step), and the cost of the sampler: the loop's wall time with the sampler
and with ``sample=None``, interleaved.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import itertools
import os
import pathlib
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any, TypedDict

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import optax
from flax import nnx
from jax.example_libraries import optimizers, stax
from jax.scipy.special import logsumexp

ROOT = pathlib.Path(__file__).resolve().parent.parent
for folder in (ROOT / "examples", ROOT):  # the ports' models (they import their _ports.py),
    if str(folder) not in sys.path:  # and this checkout's tidyjax before an installed one
        sys.path.insert(0, str(folder))

import port_equinox_rnn as rnn  # noqa: E402
import port_nnx_vae as vae  # noqa: E402
import port_scan_fit as scan_fit  # noqa: E402

import tidyjax as tj  # noqa: E402

#: tidyjax.timeline()'s default sampling interval, seconds.
INTERVAL = 0.005

#: The planted leaks: each program appends one array a step here when asked to.
CACHE: list[Any] = []


class _Unchecked:
    """Stands for ``check_leaks()`` where a run is timed, not checked."""

    report = None

    def __enter__(self) -> _Unchecked:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def allow(self, *values: Any) -> None:
        pass


def _check(checked: bool) -> Any:
    return tj.check_leaks() if checked else _Unchecked()


def mnist_arrays(num_train: int, num_test: int, seed: int = 0):
    """What JAX's ``datasets.mnist()`` returns, synthetic: flat 28x28 images in [0, 1] as
    float32 and one-hot labels, ten classes given by a random linear teacher."""
    rng = np.random.RandomState(seed)
    teacher = rng.normal(size=(784, 10))

    def make(n: int) -> tuple[np.ndarray, np.ndarray]:
        images = rng.uniform(size=(n, 784)).astype(np.float32)
        labels = np.eye(10, dtype=np.float32)[np.argmax((images - 0.5) @ teacher, axis=1)]
        return images, labels

    return (*make(num_train), *make(num_test))


def data_stream(images: np.ndarray, labels: np.ndarray, batch_size: int):
    """The MNIST examples' batches: a fresh permutation each epoch, NumPy slices."""
    rng = np.random.RandomState(0)
    num_train = images.shape[0]
    num_batches = -(-num_train // batch_size)
    while True:
        perm = rng.permutation(num_train)
        for i in range(num_batches):
            batch_idx = perm[i * batch_size : (i + 1) * batch_size]
            yield images[batch_idx], labels[batch_idx]


# -- 1. JAX's examples/mnist_classifier_fromscratch.py -----------------------------------------


def init_random_params(scale: float, layer_sizes: list[int], rng=None):
    rng = np.random.RandomState(0) if rng is None else rng
    return [(scale * rng.randn(m, n), scale * rng.randn(n))
            for m, n in itertools.pairwise(layer_sizes)]  # fmt: skip


def predict(params, inputs):
    activations = inputs
    for w, b in params[:-1]:
        outputs = jnp.dot(activations, w) + b
        activations = jnp.tanh(outputs)
    final_w, final_b = params[-1]
    logits = jnp.dot(activations, final_w) + final_b
    return logits - logsumexp(logits, axis=1, keepdims=True)


def loss(params, batch):
    inputs, targets = batch
    preds = predict(params, inputs)
    return -jnp.mean(jnp.sum(preds * targets, axis=1))


def accuracy(params, batch):
    inputs, targets = batch
    target_class = jnp.argmax(targets, axis=1)
    predicted_class = jnp.argmax(predict(params, inputs), axis=1)
    return jnp.mean(predicted_class == target_class)


STEP_SIZE = 0.001


@jax.jit
def update(params, batch):
    grads = jax.grad(loss)(params, batch)
    return [(w - STEP_SIZE * dw, b - STEP_SIZE * db)
            for (w, b), (dw, db) in zip(params, grads, strict=True)]  # fmt: skip


def fromscratch(
    steps: int,
    leak: bool,
    *,
    batch_size: int = 128,
    hidden: int = 1024,
    epochs: int = 1,
    num_train: int | None = None,
    num_test: int = 256,
    checked: bool = True,
    cache: list[Any] | None = None,
    after_step: Callable[[Any], object] | None = None,
) -> tj.LeakReport | None:
    """``steps`` steps over ``epochs`` epochs; the planted leak goes to ``cache`` (``CACHE``);
    ``after_step(params)`` runs after each step (the timeline's ``mark``, a timer);
    ``checked=False``: no check (the timeline's runs)."""
    cache = CACHE if cache is None else cache
    layer_sizes = [784, hidden, hidden, 10]
    param_scale = 0.1
    num_epochs = epochs

    train_images, train_labels, test_images, test_labels = mnist_arrays(
        4 * batch_size if num_train is None else num_train, num_test
    )
    num_batches = steps // epochs
    batches = data_stream(train_images, train_labels, batch_size)

    params = init_random_params(param_scale, layer_sizes)
    params = update(params, next(batches))  # the warm-up step
    try:
        with _check(checked) as checker:
            for epoch in range(num_epochs):
                start_time = time.time()
                for _ in range(num_batches):
                    batch = next(batches)
                    params = update(params, batch)
                    if leak:
                        cache.append(predict(params, batch[0]))  # PLANTED:fromscratch
                    if after_step is not None:
                        after_step(params)
                epoch_time = time.time() - start_time

                train_acc = accuracy(params, (train_images, train_labels))
                test_acc = accuracy(params, (test_images, test_labels))
                print(f"Epoch {epoch} in {epoch_time:0.2f} sec")
                print(f"Training set accuracy {train_acc}")
                print(f"Test set accuracy {test_acc}")
            checker.allow(params)
    except tj.LeakError:
        pass
    return checker.report


# -- 2. JAX's examples/mnist_classifier.py (stax, optimizers) ----------------------------------


def stax_mnist(steps: int, leak: bool, *, batch_size: int = 128, hidden: int = 1024):
    init_random_params, predict = stax.serial(
        stax.Dense(hidden), stax.Relu, stax.Dense(hidden), stax.Relu, stax.Dense(10),
        stax.LogSoftmax,
    )  # fmt: skip

    def loss(params, batch):
        inputs, targets = batch
        preds = predict(params, inputs)
        return -jnp.mean(jnp.sum(preds * targets, axis=1))

    def accuracy(params, batch):
        inputs, targets = batch
        target_class = jnp.argmax(targets, axis=1)
        predicted_class = jnp.argmax(predict(params, inputs), axis=1)
        return jnp.mean(predicted_class == target_class)

    rng = jax.random.key(0)
    step_size = 0.001
    num_epochs = 1
    momentum_mass = 0.9
    train_images, train_labels, test_images, test_labels = mnist_arrays(4 * batch_size, 256)
    num_batches = steps
    batches = data_stream(train_images, train_labels, batch_size)

    opt_init, opt_update, get_params = optimizers.momentum(step_size, mass=momentum_mass)

    @jax.jit
    def update(i, opt_state, batch):
        params = get_params(opt_state)
        return opt_update(i, jax.grad(loss)(params, batch), opt_state)

    _, init_params = init_random_params(rng, (-1, 28 * 28))
    opt_state = opt_init(init_params)
    itercount = itertools.count()

    opt_state = update(next(itercount), opt_state, next(batches))  # the warm-up step
    print("\nStarting training...")
    try:
        with tj.check_leaks() as checker:
            for epoch in range(num_epochs):
                start_time = time.time()
                for _ in range(num_batches):
                    batch = next(batches)
                    opt_state = update(next(itercount), opt_state, batch)
                    if leak:
                        CACHE.append(loss(get_params(opt_state), batch))  # PLANTED:stax
                epoch_time = time.time() - start_time

                params = get_params(opt_state)
                train_acc = accuracy(params, (train_images, train_labels))
                test_acc = accuracy(params, (test_images, test_labels))
                print(f"Epoch {epoch} in {epoch_time:0.2f} sec")
                print(f"Training set accuracy {train_acc}")
                print(f"Test set accuracy {test_acc}")
            checker.allow(opt_state)
    except tj.LeakError:
        pass
    return checker.report


# -- 3. Equinox's RNN example (examples/port_equinox_rnn.py's model) ----------------------------


def numpy_dataloader(arrays, batch_size):
    """The Equinox example's loader: NumPy permutations, JAX arrays indexed by them."""
    dataset_size = arrays[0].shape[0]
    indices = np.arange(dataset_size)
    rng = np.random.RandomState(0)
    while True:
        perm = rng.permutation(indices)
        start = 0
        end = batch_size
        while end <= dataset_size:
            batch_perm = perm[start:end]
            yield tuple(array[batch_perm] for array in arrays)
            start = end
            end = start + batch_size


def equinox_rnn(
    steps: int,
    leak: bool,
    *,
    dataset_size: int = 1000,
    batch_size: int = 32,
    learning_rate: float = 3e-3,
    hidden_size: int = 16,
    seed: int = 5678,
):
    data_key, model_key = jr.split(jr.PRNGKey(seed), 2)
    xs, ys = rnn.get_data(dataset_size, key=data_key)
    iter_data = numpy_dataloader((xs, ys), batch_size)

    model = rnn.RNN(in_size=2, out_size=1, hidden_size=hidden_size, key=model_key)

    @eqx.filter_value_and_grad
    def compute_loss(model, x, y):
        pred_y = jax.vmap(model)(x)
        return -jnp.mean(y * jnp.log(pred_y) + (1 - y) * jnp.log(1 - pred_y))

    @eqx.filter_jit
    def make_step(model, x, y, opt_state):
        loss, grads = compute_loss(model, x, y)
        updates, opt_state = optim.update(grads, opt_state)
        model = eqx.apply_updates(model, updates)
        return loss, model, opt_state

    optim = optax.adam(learning_rate)
    opt_state = optim.init(model)
    x, y = next(iter_data)
    loss, model, opt_state = make_step(model, x, y, opt_state)  # the warm-up step
    try:
        with tj.check_leaks() as checker:
            for step, (x, y) in zip(range(steps), iter_data, strict=False):
                loss, model, opt_state = make_step(model, x, y, opt_state)
                if leak:
                    CACHE.append(jax.vmap(model)(x))  # PLANTED:equinox_rnn
                loss = loss.item()
                print(f"step={step}, loss={loss}")

            pred_ys = jax.vmap(model)(xs)
            num_correct = jnp.sum((pred_ys > 0.5) == ys)
            final_accuracy = (num_correct / dataset_size).item()
            print(f"final_accuracy={final_accuracy}")
            checker.allow(model, opt_state)
    except tj.LeakError:
        pass
    return checker.report


# -- 4. Flax NNX's VAE example (examples/port_nnx_vae.py's model) ------------------------------


def binary_images(n: int, seed: int) -> np.ndarray:
    """Binarized MNIST-shaped images, as the example makes them: noisy copies of ten random
    prototypes, float32 0/1, (n, 784)."""
    rng = np.random.default_rng(seed)
    prototypes = rng.uniform(size=(10, 784)) < 0.3
    flips = rng.uniform(size=(n, 784)) < 0.05
    return (prototypes[rng.integers(0, 10, n)] ^ flips).astype(np.float32)


def nnx_vae(
    steps: int, leak: bool, *, batch_size: int = 64, hidden_size: int = 256, epochs: int = 2
):
    np.random.seed(42)
    latent_size = 20
    steps_per_epoch = steps // epochs
    X_train = binary_images(8 * batch_size, 0)  # noqa: N806 - the example's names
    X_test = binary_images(64, 1)  # noqa: N806

    model = vae.VAE(din=784, hidden_size=hidden_size, latent_size=latent_size,
                    rngs=nnx.Rngs(0, noise=1))  # fmt: skip
    optimizer = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)

    @nnx.jit
    def train_step(model: vae.VAE, optimizer: nnx.Optimizer, x: jax.Array):
        def loss_fn(model: vae.VAE):
            logits, kl_loss = model(x)
            reconstruction_loss = jnp.mean(optax.sigmoid_binary_cross_entropy(logits, x))
            return reconstruction_loss + 0.1 * kl_loss

        loss, grads = nnx.value_and_grad(loss_fn)(model)
        optimizer.update(model, grads)
        return loss

    @nnx.jit
    def forward(model: vae.VAE, x: jax.Array) -> jax.Array:
        y_pred, _ = model(x)
        return jax.nn.sigmoid(y_pred)

    train_step(model, optimizer, X_train[:batch_size])  # the warm-up step
    try:
        with tj.check_leaks() as checker:
            for epoch in range(epochs):
                losses = []
                for _ in range(steps_per_epoch):
                    idxs = np.random.randint(0, len(X_train), size=(batch_size,))
                    x_batch = X_train[idxs]

                    loss = train_step(model, optimizer, x_batch)
                    losses.append(np.asarray(loss))
                    if leak:
                        CACHE.append(forward(model, x_batch))  # PLANTED:nnx_vae

                print(f"Epoch {epoch} loss: {np.mean(losses)}")

            idxs = np.random.randint(0, len(X_test), size=(5,))
            x_sample = X_test[idxs]
            y_pred = forward(model, x_sample)
            checker.allow(model, optimizer)
    except tj.LeakError:
        pass
    del y_pred  # the example plots it
    return checker.report


# -- 5. Flax NNX's MNIST tutorial ----------------------------------------------------------------


class CNN(nnx.Module):
    """The tutorial's CNN (its widths given: 32, 64 and 256 there)."""

    def __init__(self, widths: tuple[int, int, int] = (32, 64, 256), *, rngs: nnx.Rngs):
        c1, c2, dense = widths
        self.conv1 = nnx.Conv(1, c1, kernel_size=(3, 3), rngs=rngs)
        self.conv2 = nnx.Conv(c1, c2, kernel_size=(3, 3), rngs=rngs)
        self.avg_pool = functools.partial(nnx.avg_pool, window_shape=(2, 2), strides=(2, 2))
        self.linear1 = nnx.Linear(7 * 7 * c2, dense, rngs=rngs)
        self.linear2 = nnx.Linear(dense, 10, rngs=rngs)

    def __call__(self, x):
        x = self.avg_pool(nnx.relu(self.conv1(x)))
        x = self.avg_pool(nnx.relu(self.conv2(x)))
        x = x.reshape(x.shape[0], -1)  # flatten
        x = nnx.relu(self.linear1(x))
        x = self.linear2(x)
        return x


def cnn_loss_fn(model: CNN, batch):
    logits = model(batch["image"])
    loss = optax.softmax_cross_entropy_with_integer_labels(
        logits=logits, labels=batch["label"]
    ).mean()
    return loss, logits


@nnx.jit
def cnn_train_step(model: CNN, optimizer: nnx.Optimizer, metrics: nnx.MultiMetric, batch):
    """Train for a single step."""
    grad_fn = nnx.value_and_grad(cnn_loss_fn, has_aux=True)
    (loss, logits), grads = grad_fn(model, batch)
    metrics.update(loss=loss, logits=logits, labels=batch["label"])  # In-place updates.
    optimizer.update(model, grads)  # In-place updates.


@nnx.jit
def cnn_eval_step(model: CNN, metrics: nnx.MultiMetric, batch):
    loss, logits = cnn_loss_fn(model, batch)
    metrics.update(loss=loss, logits=logits, labels=batch["label"])  # In-place updates.


def mnist_batches(n: int, batch_size: int, seed: int):
    """What ``train_ds.as_numpy_iterator()`` yields, synthetic: NumPy dicts of float32 images
    (batch, 28, 28, 1) in [0, 1] and int32 labels."""
    rng = np.random.default_rng(seed)
    for _ in range(n):
        image = rng.uniform(size=(batch_size, 28, 28, 1)).astype(np.float32)
        label = (image.reshape(batch_size, -1)[:, :10].argmax(axis=1)).astype(np.int32)
        yield {"image": image, "label": label}


def nnx_mnist(
    steps: int,
    leak: bool,
    *,
    batch_size: int = 32,
    widths: tuple[int, int, int] = (32, 64, 256),
    eval_every: int = 5,
    test_batches: int = 2,
):
    train_steps = steps
    model = CNN(widths, rngs=nnx.Rngs(0))
    learning_rate = 0.005
    momentum = 0.9
    optimizer = nnx.Optimizer(model, optax.adamw(learning_rate, momentum), wrt=nnx.Param)
    metrics = nnx.MultiMetric(
        accuracy=nnx.metrics.Accuracy(),
        loss=nnx.metrics.Average("loss"),
    )
    metrics_history: dict[str, list[Any]] = {
        "train_loss": [],
        "train_accuracy": [],
        "test_loss": [],
        "test_accuracy": [],
    }
    (warm,) = mnist_batches(1, batch_size, seed=99)
    cnn_train_step(model, optimizer, metrics, warm)  # the warm-up step
    try:
        with tj.check_leaks() as checker:
            for step, batch in enumerate(mnist_batches(train_steps, batch_size, seed=0)):
                cnn_train_step(model, optimizer, metrics, batch)
                if leak:
                    CACHE.append(metrics.compute()["loss"])  # PLANTED:nnx_mnist

                if step > 0 and (step % eval_every == 0 or step == train_steps - 1):
                    for metric, value in metrics.compute().items():  # Compute the metrics.
                        metrics_history[f"train_{metric}"].append(value)  # Record the metrics.
                    metrics.reset()  # Reset the metrics for the test set.

                    for test_batch in mnist_batches(test_batches, batch_size, seed=1):
                        cnn_eval_step(model, metrics, test_batch)

                    for metric, value in metrics.compute().items():
                        metrics_history[f"test_{metric}"].append(value)
                    metrics.reset()  # Reset the metrics for the next training epoch.

                    print(
                        f"[train] step: {step}, "
                        f"loss: {metrics_history['train_loss'][-1]}, "
                        f"accuracy: {metrics_history['train_accuracy'][-1] * 100}"
                    )
                    print(
                        f"[test] step: {step}, "
                        f"loss: {metrics_history['test_loss'][-1]}, "
                        f"accuracy: {metrics_history['test_accuracy'][-1] * 100}"
                    )
            checker.allow(model, optimizer, metrics, metrics_history)
    except tj.LeakError:
        pass
    return checker.report


# -- 6. optax's getting started: the fit loop with optax.adam ------------------------------------


def net(x: jnp.ndarray, params: optax.Params) -> jnp.ndarray:
    x = jnp.dot(x, params["hidden"])
    x = jax.nn.relu(x)
    x = jnp.dot(x, params["output"])
    return x


def fit_loss(params: optax.Params, batch: jnp.ndarray, labels: jnp.ndarray) -> jnp.ndarray:
    y_hat = net(batch, params)
    # optax also provides a number of common loss functions.
    loss_value = optax.sigmoid_binary_cross_entropy(y_hat, labels).sum(axis=-1)
    return loss_value.mean()


def fit(params, optimizer, training_data, labels_data, leak: bool):
    """The notebook's ``fit``, the recipe around its loop."""
    opt_state = optimizer.init(params)

    @jax.jit
    def step(params, opt_state, batch, labels):
        loss_value, grads = jax.value_and_grad(fit_loss)(params, batch, labels)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        return params, opt_state, loss_value

    step(params, opt_state, training_data[0], labels_data[0])  # the warm-up step
    try:
        with tj.check_leaks() as checker:
            for i, (batch, labels) in enumerate(zip(training_data, labels_data, strict=True)):
                params, opt_state, loss_value = step(params, opt_state, batch, labels)
                if leak:
                    CACHE.append(fit_loss(params, batch, labels))  # PLANTED:optax_fit
                if i % 100 == 0:
                    print(f"step {i}, loss: {loss_value}")
            checker.allow(params, opt_state)
    except tj.LeakError:
        pass
    return params, checker.report


def optax_fit(steps: int, leak: bool, *, batch_size: int = 5):
    num_train_steps = steps
    raw_training_data = np.random.RandomState(0).randint(255, size=(num_train_steps, batch_size, 1))
    training_data = np.unpackbits(raw_training_data.astype(np.uint8), axis=-1)
    labels = (jax.nn.one_hot(raw_training_data % 2, 2).astype(jnp.float32)
              .reshape(num_train_steps, batch_size, 2))  # fmt: skip
    initial_params = {
        "hidden": jax.random.normal(shape=[8, 32], key=jax.random.PRNGKey(0)),
        "output": jax.random.normal(shape=[32, 2], key=jax.random.PRNGKey(1)),
    }
    optimizer = optax.adam(learning_rate=1e-2)
    _, report = fit(initial_params, optimizer, training_data, labels, leak)
    return report


# -- 7. optax's gradient accumulation notebook (optax.MultiSteps) --------------------------------


class MiniBatch(TypedDict):
    image: jnp.ndarray
    label: jnp.ndarray


def mlp_init(key: jax.Array, sizes: tuple[int, ...] = (784, 32, 32, 10)) -> dict[str, Any]:
    """The notebook's ``hk.nets.MLP([32, 32, 10])`` parameters, without Haiku."""
    keys = jax.random.split(key, len(sizes) - 1)
    return {
        f"mlp/~/linear_{i}": {
            "w": jax.random.truncated_normal(k, -2.0, 2.0, (m, n)) / np.sqrt(m),
            "b": jnp.zeros(n),
        }
        for i, (k, (m, n)) in enumerate(zip(keys, itertools.pairwise(sizes), strict=True))
    }


def mlp_net(params: dict[str, Any], image: jnp.ndarray) -> jnp.ndarray:
    features = image.reshape((image.shape[0], -1))
    layers = list(params.values())
    for layer in layers[:-1]:
        features = jax.nn.relu(features @ layer["w"] + layer["b"])
    return features @ layers[-1]["w"] + layers[-1]["b"]


def loss_fn(params, batch: MiniBatch) -> jnp.ndarray:
    """Computes softmax cross entropy for the net outputs batch."""
    logits = mlp_net(params, batch["image"])
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"]).mean()


def build_update_fn(optimizer: optax.GradientTransformation):
    """Builds a function for executing a single step in the optimization."""

    @jax.jit
    def update(params, opt_state, batch):
        _, grads = jax.value_and_grad(loss_fn)(params, batch)
        updates, opt_state = optimizer.update(grads, opt_state)
        params = optax.apply_updates(params, updates)
        return params, opt_state

    return update


def fit_batches(optimizer, params, batches: list[MiniBatch], leak: bool = False, check=False):
    """The notebook's ``fit``; with ``check``, under the recipe."""
    update_fn = build_update_fn(optimizer)
    opt_state = optimizer.init(params)
    if not check:
        for batch in batches:
            params, opt_state = update_fn(params, opt_state, batch)
        return params, None

    update_fn(params, opt_state, batches[0])  # the warm-up step
    try:
        with tj.check_leaks() as checker:
            for batch in batches:
                params, opt_state = update_fn(params, opt_state, batch)
                if leak:
                    CACHE.append(loss_fn(params, batch))  # PLANTED:optax_accumulate
            checker.allow(params, opt_state)
    except tj.LeakError:
        pass
    return params, checker.report


def optax_accumulate(steps: int, leak: bool, *, k: int = 3):
    examples = jax.random.uniform(jax.random.PRNGKey(0), (k * steps, 28, 28, 1))
    labels = jax.random.randint(jax.random.PRNGKey(0), (k * steps,), minval=0, maxval=10)
    learning_rate_schedule = optax.piecewise_constant_schedule(
        init_value=1.0, boundaries_and_scales={0: 1e-4, 1: 1e-1}
    )
    optimizer = optax.sgd(learning_rate_schedule)
    params = mlp_init(jax.random.PRNGKey(0))

    big = [MiniBatch(image=examples[i * k : (i + 1) * k], label=labels[i * k : (i + 1) * k])
           for i in range(steps)]  # fmt: skip
    small = [MiniBatch(image=examples[i : i + 1], label=labels[i : i + 1])
             for i in range(k * steps)]  # fmt: skip
    new_params_single_batch, _ = fit_batches(optimizer, params, big)
    new_params_accumulated, report = fit_batches(
        optax.MultiSteps(optimizer, every_k_schedule=k), params, small, leak, check=True
    )
    if not leak:  # the notebook's point: both fits agree
        for a, b in zip(jax.tree.leaves(new_params_single_batch),
                        jax.tree.leaves(new_params_accumulated), strict=True):  # fmt: skip
            np.testing.assert_allclose(a, b, atol=1e-6)
    return report


# -- 8. a lax.scan training loop, optax.chain(clip, adamw(schedule)) ----------------------------


def optax_scan(steps: int, leak: bool, *, size: int = 1):
    batches = scan_fit.make_batches(64 * size)
    params = scan_fit.init_params(64 * size)
    schedule = optax.warmup_cosine_decay_schedule(
        init_value=0.0, peak_value=1e-2, warmup_steps=2 * scan_fit.INNER_STEPS,
        decay_steps=steps * scan_fit.INNER_STEPS, end_value=1e-4,
    )  # fmt: skip
    optimizer = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(learning_rate=schedule))
    opt_state = optimizer.init(params)

    @jax.jit
    def fit_step(params, opt_state, xs, ys):
        def inner(carry, batch):
            params, opt_state = carry
            loss, grads = jax.value_and_grad(scan_fit.loss_fn)(params, *batch)
            updates, opt_state = optimizer.update(grads, opt_state, params)
            return (optax.apply_updates(params, updates), opt_state), loss

        (params, opt_state), losses = jax.lax.scan(inner, (params, opt_state), (xs, ys))
        return params, opt_state, losses

    history: list[float] = []
    params, opt_state, losses = fit_step(params, opt_state, *batches[0])  # the warm-up step
    try:
        with tj.check_leaks() as checker:
            for i in range(steps):
                xs, ys = batches[i % scan_fit.NUM_BATCHES]
                params, opt_state, losses = fit_step(params, opt_state, xs, ys)
                if leak:
                    CACHE.append(jnp.mean(losses))  # PLANTED:optax_scan
                history.extend(losses.tolist())
            print(f"loss {history[-1]:.4f} after {len(history)} inner steps")
            checker.allow(params, opt_state)
    except tj.LeakError:
        pass
    return checker.report


PROGRAMS: dict[str, Callable[..., tj.LeakReport | None]] = {
    "fromscratch": fromscratch,
    "stax": stax_mnist,
    "equinox_rnn": equinox_rnn,
    "nnx_vae": nnx_vae,
    "nnx_mnist": nnx_mnist,
    "optax_fit": optax_fit,
    "optax_accumulate": optax_accumulate,
    "optax_scan": optax_scan,
}


def planted_lines() -> dict[str, int]:
    """Each program's planted append, by its ``# PLANTED:name`` marker: its line in this file."""
    lines = pathlib.Path(__file__).read_text().splitlines()
    return {
        text.split("# PLANTED:")[1].strip(): number
        for number, text in enumerate(lines, 1)
        if "# PLANTED:" in text and "split" not in text
    }


def _is_here(file: str) -> bool:
    return os.path.abspath(file) == os.path.abspath(__file__)


def judge(name: str, steps: int, **options: Any) -> dict[str, Any]:
    """Run one program clean and with its leak planted; what each check said."""
    line = planted_lines()[name]
    program = PROGRAMS[name]
    CACHE.clear()
    with contextlib.redirect_stdout(io.StringIO()):
        t0 = time.perf_counter()
        clean = program(steps, False, **options)
        seconds = time.perf_counter() - t0
        leaky = program(steps, True, **options)
    planted = len(CACHE)
    CACHE.clear()
    assert clean is not None
    assert leaky is not None
    groups = leaky.groups + leaky.array_groups
    named = [
        g for g in groups
        if g.site is not None and any(_is_here(f.file) and f.line == line for f in g.site.frames)
    ]  # fmt: skip
    return {
        "name": name,
        "steps": steps,
        "seconds": seconds,
        "clean": len(clean) == 0,
        "clean_report": clean,
        "apart": _apart(clean),
        "planted": planted,
        "found": len(leaky),
        "named": len(groups) == 1 and len(named) == 1 and named[0].count == planted,
        "chain": named[0].site.label if named and named[0].site is not None else "",
        "leak_report": leaky,
    }


def _apart(report: tj.LeakReport) -> str:
    """What a clean report listed apart, shortly: ``x, y; 5 views``."""
    parts = []
    if report.bound_locals:
        parts.append(", ".join(f"`{names}`" for names, _ in report.bound_locals))
    if report.numpy_views:
        parts.append(f"{len(report.numpy_views)} NumPy views")
    return "; ".join(parts) or "nothing"


# -- the timeline around the plain MNIST loop ----------------------------------------------------


def _live_bytes(before: set[int]) -> int:
    """Bytes of the live jax.Arrays not in ``before`` (ids), each buffer once."""
    seen: dict[int, int] = {}
    for a in jax.live_arrays():
        if id(a) not in before and not a.is_deleted():
            seen[a.unsafe_buffer_pointer()] = a.nbytes
    return sum(seen.values())


def timeline_peak(steps: int, batch_size: int, rounds: int) -> dict[str, Any]:
    """Program 1 with its leak planted into a list of the run's own (it dies with the run, as a
    ``main()``'s locals do: the timeline's stop sees none of it), ``steps`` steps of
    ``batch_size``: the sampler's peak against the marked one, and the sampler's cost."""

    def run(sampled: bool = True) -> tj.Timeline:
        recorder = tj.timeline() if sampled else tj.timeline(sample=None)
        with recorder as tl, contextlib.redirect_stdout(io.StringIO()):
            fromscratch(steps, True, batch_size=batch_size, checked=False, cache=[])
        return tl

    run()  # compile, fill caches
    # How long a step computes: a run that waits for each step's parameters
    step_times: list[float] = []
    last = [0.0]

    def timed(params: Any) -> None:
        jax.block_until_ready(params)
        now = time.perf_counter()
        if last[0]:
            step_times.append(now - last[0])
        last[0] = now

    with contextlib.redirect_stdout(io.StringIO()):
        fromscratch(steps + 1, True, batch_size=batch_size, checked=False, cache=[],
                    after_step=timed)  # fmt: skip
    # The true peak: tl.mark() after every step, and the live arrays summed then
    before = {id(a) for a in jax.live_arrays()}
    true_live = [0]
    marked: list[tj.Timeline] = []

    def mark(params: Any) -> None:
        true_live[0] = max(true_live[0], _live_bytes(before))
        marked[0].mark()

    marked.append(tj.timeline(sample=None))
    with marked[0], contextlib.redirect_stdout(io.StringIO()):
        fromscratch(steps, True, batch_size=batch_size, checked=False, cache=[], after_step=mark)
    true_peak = marked[0].peak_bytes
    sampled_runs: list[float] = []
    bare_runs: list[float] = []
    ratios: list[float] = []
    at_stop: list[int] = []  # bytes the sampled timelines found alive at their stop
    for i in range(rounds):
        for with_sampler in (True, False) if i % 2 == 0 else (False, True):
            t0 = time.perf_counter()
            tl = run(with_sampler)
            (sampled_runs if with_sampler else bare_runs).append(time.perf_counter() - t0)
            if with_sampler:
                ratios.append(tl.peak_bytes / true_peak)
                at_stop.append(sum(r.bytes for r in tl.live_at(tl.stop_time)))
                assert tl.unseen is None
    costs = [s / b for s, b in zip(sampled_runs, bare_runs, strict=True)]
    return {
        "steps": steps,
        "batch_size": batch_size,
        "step_s": statistics.median(step_times),
        "step_range": (min(step_times), max(step_times)),
        "true_peak": true_peak,
        "true_live": true_live[0],
        "ratios": ratios,
        "at_stop": max(at_stop),
        "sampled_s": statistics.median(sampled_runs),
        "bare_s": statistics.median(bare_runs),
        "sampled_range": (min(sampled_runs), max(sampled_runs)),
        "bare_range": (min(bare_runs), max(bare_runs)),
        "cost": statistics.median(sampled_runs) / statistics.median(bare_runs),
        "cost_range": (min(costs), max(costs)),
        "rounds": rounds,
    }


def _mib(n: float) -> str:
    return f"{n / 2**20:.2f} MiB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=[*PROGRAMS, "timeline"], help="a program, or timeline")
    parser.add_argument("--steps", type=int, default=10, help="steps of each checked loop")
    parser.add_argument("--repeat", type=int, default=1, help="run each program so many times")
    parser.add_argument("--rounds", type=int, default=7, help="timed runs of each timeline side")
    parser.add_argument("--timeline-steps", type=int, default=10)
    parser.add_argument("--batch", type=int, default=1024, help="the timeline's MNIST batch")
    parser.add_argument("--verbose", action="store_true", help="print every report")
    args = parser.parse_args()
    print(f"jax {jax.__version__}, {jax.default_backend()}, {os.cpu_count()} CPU cores")
    names = list(PROGRAMS) if args.only is None else [n for n in PROGRAMS if n == args.only]
    failures = 0
    if names:
        print("\n| program | steps | clean | listed apart (clean run) | planted | found | "
              "named by its chain | chain | s (clean run) |")  # fmt: skip
        print("|---|---:|---|---|---:|---:|---|---|---:|")
    for name in names:
        for _ in range(args.repeat):
            r = judge(name, args.steps)
            ok = r["clean"] and r["found"] == r["planted"] and r["named"]
            failures += not ok
            print(
                f"| {name} | {r['steps']} | {'yes' if r['clean'] else 'NO'} | {r['apart']} | "
                f"{r['planted']} | {r['found']} | {'yes' if r['named'] else 'NO'} | "
                f"{r['chain']} | {r['seconds']:.1f} |"
            )
            if args.verbose or not ok:
                print(f"clean run:\n{r['clean_report']}\nwith the leak:\n{r['leak_report']}\n")
    if args.only in (None, "timeline"):
        t = timeline_peak(args.timeline_steps, args.batch, args.rounds)
        lo, hi = t["step_range"]
        ratios = t["ratios"]
        print(
            f"\ntimeline around fromscratch with its leak: {t['steps']} steps of batch "
            f"{t['batch_size']}; a step computes {t['step_s']:.3f} s (median; range "
            f"{lo:.3f}-{hi:.3f}), {t['step_s'] / INTERVAL:.0f} sampling intervals\n"
            f"  true peak: {_mib(t['true_peak'])} (tl.mark() after every step; the live "
            f"jax.Array bytes summed after every step: {_mib(t['true_live'])})\n"
            f"  sampler, no mark(): {statistics.median(ratios):.1%} of the true peak (median of "
            f"{len(ratios)} runs; range {min(ratios):.1%}-{max(ratios):.1%}; alive at the "
            f"timeline's stop: {t['at_stop']} B, so only the sampler saw the peak)\n"
            f"  cost: {t['sampled_s']:.2f} s a run with the sampler, {t['bare_s']:.2f} s with "
            f"sample=None (medians of {t['rounds']} interleaved runs; ranges "
            f"{t['sampled_range'][0]:.2f}-{t['sampled_range'][1]:.2f} and "
            f"{t['bare_range'][0]:.2f}-{t['bare_range'][1]:.2f}): {t['cost']:.3f}x "
            f"(pair by pair {t['cost_range'][0]:.3f}-{t['cost_range'][1]:.3f}x)"
        )
        failures += min(t["ratios"]) < 0.9
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
