"""Tensor's operators, indexing, ``.at`` and methods, as a type checker sees them.

They are installed on the class at run time (``_ops.install_tensor_methods()``); the
declarations at the end of ``class Tensor`` make them visible. ``tests/test_typing.py`` runs
mypy and pyright over this folder, and runs each file too, so every line is also true at run time.
"""

import jax
import jax.numpy as jnp
import numpy as np
from typing_extensions import assert_type

import tidyjax
from tidyjax import Tensor

a = tidyjax.tensor([1.0, 2.0, 3.0])
b = tidyjax.tensor([4.0, 5.0, 6.0])
assert_type(a, Tensor)
assert_type(tidyjax.Tensor([1.0]), Tensor)

# Arithmetic, with Tensors, JAX and NumPy arrays and scalars on either side.
assert_type(a + b, Tensor)
assert_type(a - 1, Tensor)
assert_type(a * 2.0, Tensor)
assert_type(2.0 * a, Tensor)
assert_type(1 - a, Tensor)
assert_type(1.0 / a, Tensor)
assert_type(a / b, Tensor)
assert_type(a // 2, Tensor)
assert_type(a % 2.0, Tensor)
assert_type(a**2, Tensor)
assert_type(2**a, Tensor)
assert_type(a + jnp.ones(3), Tensor)
# `jax_array + a` is a Tensor at run time too, but JAX 0.6's stubs type it Array: not asserted.
reflected = jnp.ones(3) + a
assert_type(a * np.ones(3, np.float32), Tensor)
half: np.float32 = np.float32(0.5)  # (numpy types the call itself as Any under mypy)
assert_type(a + half, Tensor)
assert_type(divmod(a, 2.0), tuple[Tensor, Tensor])
assert_type(-a, Tensor)
assert_type(+a, Tensor)
assert_type(abs(a), Tensor)
assert_type(round(a), Tensor)

m = tidyjax.tensor([[1.0, 2.0], [3.0, 4.0]])
assert_type(m @ m, Tensor)
assert_type(m @ jnp.eye(2), Tensor)

# Comparisons are elementwise: Tensors, not bools.
assert_type(a < b, Tensor)
assert_type(a <= 2.0, Tensor)
assert_type(a > b, Tensor)
assert_type(a >= 0, Tensor)
assert_type(a == b, Tensor)
assert_type(a != 1.0, Tensor)
mask = (a > 1.0) & (b < 6.0)
assert_type(mask, Tensor)
assert_type(mask | ~mask, Tensor)
assert_type(mask ^ mask, Tensor)

ints = tidyjax.tensor([1, 2, 3])
assert_type(ints << 1, Tensor)
assert_type(ints >> 1, Tensor)
assert_type(ints & 1, Tensor)
assert_type(~ints, Tensor)

# In-place operators rebind the name to a new Tensor.
c = tidyjax.tensor([1.0, 2.0, 3.0])
c += 1.0
c *= b
assert_type(c, Tensor)

# Indexing, iteration, functional updates.
assert_type(a[0], Tensor)
assert_type(a[1:], Tensor)
assert_type(m[:, None, 0], Tensor)
assert_type(a[ints - 1], Tensor)
assert_type(a.at[0].set(10.0), Tensor)
assert_type(a.at[1:].add(1.0), Tensor)
assert_type(a.at[0].mul(2.0), Tensor)
assert_type(a.at[0].multiply(2.0), Tensor)
assert_type(a.at[ints - 1].min(0.0), Tensor)
assert_type(a.at[2].max(5.0), Tensor)
assert_type(a.at[0].get(), Tensor)
assert_type(a.at[0].set(b[0], mode="drop"), Tensor)
for row in m:
    assert_type(row, Tensor)

# jax.Array's methods.
assert_type(a.sum(), Tensor)
assert_type(m.sum(axis=0), Tensor)
assert_type(m.mean(axis=(0, 1), keepdims=True), Tensor)
assert_type(m.max(axis=1), Tensor)
assert_type(m.min(), Tensor)
assert_type(m.prod(axis=(0,)), Tensor)
assert_type(m.std(ddof=1), Tensor)
assert_type(m.var(), Tensor)
assert_type(m.argmax(axis=1), Tensor)
assert_type(m.argmin(), Tensor)
assert_type(m.cumsum(axis=0), Tensor)
assert_type(m.cumprod(), Tensor)
assert_type(mask.all(), Tensor)
assert_type(mask.any(axis=0), Tensor)
assert_type(a.clip(0.0, 2.0), Tensor)
assert_type(a.clip(min=0.0), Tensor)
assert_type(a.astype(jnp.float16), Tensor)
assert_type(a.astype("int32"), Tensor)
assert_type(m.reshape(4), Tensor)
assert_type(m.reshape(1, 4), Tensor)
assert_type(m.reshape((4, 1)), Tensor)
assert_type(m.transpose(), Tensor)
assert_type(m.transpose(1, 0), Tensor)
assert_type(m.swapaxes(0, 1), Tensor)
assert_type(m.flatten(), Tensor)
assert_type(m.ravel(), Tensor)
assert_type(m.diagonal(), Tensor)
assert_type(m.trace(), Tensor)
assert_type(m[None].squeeze(0), Tensor)
assert_type(a.dot(b), Tensor)
assert_type(a.take(ints - 1), Tensor)
assert_type(a.repeat(2), Tensor)
assert_type(a.sort(), Tensor)
assert_type(a.argsort(), Tensor)


def _argpartition_typed_only() -> None:  # jax 0.6.2's own argpartition method fails at run time
    assert_type(a.argpartition(1), Tensor)


assert_type(a.searchsorted(2.0), Tensor)
assert_type(a.round(1), Tensor)
assert_type(a.ptp(), Tensor)
assert_type(a.conj(), Tensor)
assert_type(a.conjugate(), Tensor)
assert_type(a.copy(), Tensor)
assert_type(a.view(jnp.int32), Tensor)
assert_type(a.compress(mask), Tensor)
assert_type(ints.choose([a, b, a, b]), Tensor)
assert_type(a.nonzero(), tuple[Tensor, ...])

# TensorFlow.js-style names.
assert_type(a.add(b), Tensor)
assert_type(a.sub(1.0), Tensor)
assert_type(a.mul(b), Tensor)
assert_type(a.div(2.0), Tensor)
assert_type(m.matmul(m), Tensor)
assert_type(a.pow(2), Tensor)
assert_type(a.maximum(b), Tensor)
assert_type(a.minimum(0.0), Tensor)
for t in (a.square(), a.exp(), a.log(), a.sqrt(), a.abs(), a.neg(), a.sin(), a.cos()):
    assert_type(t, Tensor)
assert_type(a.tanh(), Tensor)
assert_type(a.sigmoid(), Tensor)
assert_type(a.relu(), Tensor)
assert_type(a.mul(2.0).relu().sum(), Tensor)

# What is defined on the class itself.
assert_type(a.shape, tuple[int, ...])
assert_type(a.ndim, int)
assert_type(a.size, int)
assert_type(a.nbytes, int)
assert_type(a.dtype, np.dtype)
assert_type(a.array, jax.Array)
assert_type(a.numpy(), np.ndarray)
assert_type(np.asarray(a), np.ndarray)
assert_type(float(a[0]), float)
assert_type(int(ints[0]), int)
assert_type(bool(mask[0]), bool)
assert_type(len(a), int)
assert_type(a.clone(), Tensor)
assert_type(m.T, Tensor)
assert_type(a.block_until_ready(), Tensor)
assert_type(a.is_disposed, bool)
assert_type(a.name, "str | None")
a.dispose()
