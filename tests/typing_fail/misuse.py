"""Code a type checker must reject: ``tests/test_typing.py`` expects an error on each marked
line (``# E: <mypy error code>``) and on no other. If the declarations at the end of
``class Tensor`` or the signatures of ``tidy``/``jit`` were ``Any``, these would pass."""

import tidyjax
from tidyjax import Tensor, tidy

t = tidyjax.tensor([1.0, 2.0])
t.no_such_method()  # E: attr-defined
t + "text"  # E: operator
t.at[0].sett(1.0)  # E: attr-defined
t.sum(axis="0")  # E: arg-type
tidyjax.keep(t).shapes  # E: attr-defined
flag: bool = t > 1.0  # E: assignment


def double(x: Tensor, factor: float = 2.0) -> Tensor:
    return x * factor


tidy.run(double, "x")  # E: call-overload
tidy.run("name", double, t, factr=3.0)  # E: call-arg
tidyjax.jit(double)(t, "3")  # E: arg-type
tidy(double)(t, t)  # E: arg-type
tidyjax.value_and_grad(double)()  # E: call-arg
