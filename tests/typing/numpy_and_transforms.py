"""``tidyjax.numpy`` and the transformations, as a type checker sees them."""

from typing_extensions import assert_type

import tidyjax
import tidyjax.numpy as tnp
from tidyjax import Tensor

x = tidyjax.tensor([0.5, 1.0, 2.0])

# tidyjax.numpy: lifted jax.numpy functions (their results are not typed), jax.numpy's own
# constants, dtypes and classes.
s = tnp.sin(x)
total = tnp.sum(tnp.exp(s) * x, axis=0)
assert_type(tnp.pi, float)
assert_type(tnp.pi * 2.0, float)
z = tnp.zeros((2, 3), dtype=tnp.float32)
n = tnp.linalg.norm(x)
f = tnp.fft.fft(x)
r = tnp.add.reduce(x)  # lifted ufuncs keep their methods
e = x[tnp.newaxis]
assert_type(e, Tensor)
raw: tnp.ndarray = x.array  # jax.numpy's classes and dtypes are themselves


# jit keeps the function's signature and result type, and has `.lower` as jax.jit.
@tidyjax.jit
def predict(w: Tensor, inputs: Tensor) -> Tensor:
    return (inputs * w).sum()


assert_type(predict(x, x), Tensor)
lowered = predict.lower(x, x)


@tidyjax.jit(static_argnames="scale")
def scaled(t: Tensor, scale: float) -> Tensor:
    return t * scale


assert_type(scaled(x, scale=2.0), Tensor)
donating = tidyjax.jit(lambda t: t + 1.0, donate_argnums=0)
nxt = donating(tidyjax.tensor([1.0]))


def loss(w: Tensor, inputs: Tensor) -> Tensor:
    return ((inputs * w).sum() - 1.0) ** 2


g = tidyjax.grad(loss)(x, x)
value, grads = tidyjax.value_and_grad(loss)(x, x)
assert_type(value, Tensor)
per_row = tidyjax.vmap(loss)(tidyjax.tensor([[1.0, 2.0, 3.0]]), tidyjax.tensor([[1.0, 1.0, 1.0]]))
assert_type(per_row, Tensor)


def loss_aux(w: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
    out = (w**2).sum()
    return out, {"out": out}


(val, aux), gw = tidyjax.value_and_grad(loss_aux, has_aux=True)(x)
assert_type(val, Tensor)
assert_type(aux, dict[str, Tensor])

# lift: any function, taking and returning Tensors.
softplus = tidyjax.lift(tnp.logaddexp)
assert_type(tidyjax.memory().num_tensors, int)
