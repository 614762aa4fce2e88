"""``Variable``: a Tensor whose value can be replaced, as a type checker sees it."""

from typing_extensions import assert_type

import tidyjax
from tidyjax import Tensor, Variable

w = Variable(tidyjax.tensor([1.0, 2.0]), name="w")
b = Variable([0.0, 0.0], trainable=False)
assert_type(w, Variable)
assert_type(isinstance(w, Tensor), bool)
assert_type(w.name, "str | None")
assert_type(w.trainable, bool)

# Used in ops like a Tensor; results are plain Tensors.
x = tidyjax.tensor([3.0, 4.0])
y = w * x + b
assert_type(y, Tensor)
assert_type((w @ x).relu(), Tensor)


def sgd(params: list[Variable], grads: list[Tensor], lr: float) -> None:
    with tidyjax.tidy():
        for p, g in zip(params, grads, strict=True):
            p.assign(p - lr * g)


sgd([w, b], [x, x], 0.1)
assert_type(w.assign(x), Tensor)

# In place on a Variable assigns it: the name stays a Variable.
w -= 0.1 * x
assert_type(w, Variable)
w *= 2.0
assert_type(w, Variable)

assert_type(tidyjax.dispose_variables(), int)
