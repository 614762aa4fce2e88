"""``tidy`` in every form, ``keep`` and ``dispose``, as a type checker sees them."""

import asyncio
from collections.abc import Coroutine
from typing import Any

from typing_extensions import assert_type

import tidyjax
from tidyjax import Scope, Tensor, dispose, keep, tidy

x = tidyjax.tensor([1.0, 2.0, 3.0])

# Context managers: the scope comes back from `as`.
with tidy() as scope:
    assert_type(scope, Scope)
    y = scope.keep(x * 2.0)
    assert_type(y, Tensor)
    pair = scope.keep(x + 1.0, x - 1.0)
    assert_type(pair, tuple[Any, ...])
with tidy("step") as named:
    assert_type(named, Scope)
with tidy as bare:
    assert_type(bare, Scope)
assert_type(scope.num_freed, int)
assert_type(scope.peak_bytes, "int | None")


# Decorators keep the function's signature.
@tidy
def step(t: Tensor, lr: float) -> Tensor:
    return (t * lr).sum()


@tidy("loss")
def loss(t: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
    return t.mean(), {"max": t.max()}


@tidy()
def anonymous(t: Tensor) -> Tensor:
    return t.relu()


assert_type(step(x, 0.1), Tensor)
assert_type(loss(x), tuple[Tensor, dict[str, Tensor]])
assert_type(anonymous(x), Tensor)


@tidy
async def astep(t: Tensor) -> Tensor:
    async with tidy() as inner:
        assert_type(inner, Scope)
        return t.exp()


pending: Coroutine[Any, Any, Tensor] = astep(x)
assert_type(asyncio.run(pending), Tensor)


# tidy.run, as TensorFlow.js's tf.tidy: the function's result, with its arguments checked.
def double(t: Tensor, factor: float = 2.0) -> Tensor:
    return t * factor


assert_type(tidy.run(double, x), Tensor)
assert_type(tidy.run(double, x, factor=3.0), Tensor)
assert_type(tidy.run("double", double, x), Tensor)
assert_type(tidy.run(lambda: (x + 1.0).sum()), Tensor)
assert_type(tidy.run("sum", lambda: [x.sum(), x.mean()]), list[Tensor])

# keep returns its argument's own type.
kept = keep(x * 3.0)
assert_type(kept, Tensor)
params: dict[str, Tensor] = {"w": x * 1.0, "b": x + 1.0}
state = keep(params)
assert_type(state, dict[str, Tensor])
assert_type(dispose(kept), None)
dispose([state, y])
