"""``tidyjax.numpy``: the public names of ``jax.numpy``, callables lifted.

Each callable takes and returns Tensors. The names are generated from JAX on first use
(see ``tidyjax.lift``); dtypes and constants pass through unchanged.
"""

from typing import TYPE_CHECKING

import jax.numpy as _source

from tidyjax._lift import lifted_namespace as _lifted_namespace

if TYPE_CHECKING:
    # For type checkers: what passes through unchanged is jax.numpy's own (constants, dtypes,
    # classes, the submodules); every other name is a lifted callable. Its result is `Any`, not
    # `Callable[..., Any]`: lifted ufuncs keep `.reduce`/`.outer`/`.at`, which a Callable lacks.
    from typing import Any

    from jax.numpy import bfloat16 as bfloat16
    from jax.numpy import bool_ as bool_
    from jax.numpy import c_ as c_
    from jax.numpy import complex64 as complex64
    from jax.numpy import complex128 as complex128
    from jax.numpy import dtype as dtype
    from jax.numpy import e as e
    from jax.numpy import euler_gamma as euler_gamma
    from jax.numpy import finfo as finfo
    from jax.numpy import float16 as float16
    from jax.numpy import float32 as float32
    from jax.numpy import float64 as float64
    from jax.numpy import iinfo as iinfo
    from jax.numpy import index_exp as index_exp
    from jax.numpy import inf as inf
    from jax.numpy import int8 as int8
    from jax.numpy import int16 as int16
    from jax.numpy import int32 as int32
    from jax.numpy import int64 as int64
    from jax.numpy import mgrid as mgrid
    from jax.numpy import nan as nan
    from jax.numpy import ndarray as ndarray
    from jax.numpy import newaxis as newaxis
    from jax.numpy import ogrid as ogrid
    from jax.numpy import pi as pi
    from jax.numpy import r_ as r_
    from jax.numpy import s_ as s_
    from jax.numpy import uint8 as uint8
    from jax.numpy import uint16 as uint16
    from jax.numpy import uint32 as uint32
    from jax.numpy import uint64 as uint64

    from . import fft as fft
    from . import linalg as linalg

    def __getattr__(name: str) -> Any: ...  # a lifted jax.numpy function: Tensors in and out
    def __dir__() -> list[str]: ...
else:
    __getattr__, __dir__ = _lifted_namespace(_source, __name__, ("linalg", "fft"))
