"""``lift`` (the one wrapping mechanism), the operator and method tables, and ``.at``.

Eager operators dispatch through one cached ``jax.jit`` per operator: the jit C++ fast path
skips ``jnp``'s Python-level dispatch, which pays for the tracking. The traced function *is* the
``jax.numpy`` operator, so dtype promotion, weak types, broadcasting and errors are JAX's own.
Python ints (eager JAX checks their range against the other dtype), tracers and other operand
types take the plain eager path.

While a profile runs, ``_kernel_hook(name, fn, args, kwargs)`` runs each op and records it:
operators are swapped on the class for recording versions, so when no profile runs they cost
nothing; lifted calls check ``_kernel_hook`` once.
"""

from __future__ import annotations

import contextlib
import functools
import operator
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from ._arrays import CONCRETE, ArrayImpl
from ._context import on_jax_error
from ._decorating import check_callable
from ._registry import UNTRACKED
from ._tensor import TENSOR_TYPES, Tensor, disposed_error, wrap, wrap_foreign, wrap_transfer
from ._trees import unwrap, unwrap_args, wrap_tree

__all__ = ["install_tensor_methods", "lift", "set_kernel_hook"]

# Names of JAX functions that may return a new array object over an argument's buffer.
_TRANSFERS = frozenset({"device_put", "asarray", "array"})
# JAX's own functions whose result is a view over an argument's allocations (another dtype and
# shape): checked by allocation like a user function's results.
_VIEWS = frozenset({"key_data", "wrap_key_data"})
# Scalar argument types a lifted call passes through as they are.
_SCALARS = frozenset({int, float, bool, complex, str, type(None)})


def lift(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Make ``fn`` take and return Tensors: the one wrapping mechanism of tidyjax.

    The lifted function replaces every Tensor or Variable found anywhere in its arguments (any
    pytree) by its ``jax.Array``, calls ``fn``, and wraps every ``jax.Array`` in the result as a
    new Tensor tracked by the current scope. Other results pass through. A result that *is* one of
    the caller's own raw ``jax.Array`` arguments is tracked but never deleted by tidyjax.

    Return what ``fn`` computes: a ``jax.Array`` it returns that existed before the call and was
    not an argument (a global's, a closure's, a cache's) is taken for a new one, so the scope
    deletes it at exit. Pass such an array as an argument, or return a copy.

    Example:
        ```python
        softplus = tidyjax.lift(jax.nn.softplus)
        y = softplus(tidyjax.tensor([0.0, 1.0]))   # a Tensor
        ```

    Raises:
        TidyjaxTypeError: ``fn`` is not callable.
    """
    check_callable(fn, "lift()")
    return lift_named(fn, getattr(fn, "__name__", type(fn).__name__), foreign=True)


def lift_named(fn: Callable[..., Any], name: str, foreign: bool = False) -> Callable[..., Any]:
    """``lift(fn)``, reported to profiles as ``name``. ``foreign``: ``fn`` is the user's, so a
    committed array it returns may be a second object over a buffer tidyjax records (its own
    raw ``jax.device_put`` of an argument) and is checked as such (``wrap_foreign``); JAX's own
    functions (the lifted namespaces, Tensor methods) return new buffers or the very objects
    they were given, and a transfer (``_TRANSFERS``) is matched with its input."""
    transfer = name in _TRANSFERS
    foreign = foreign or name in _VIEWS
    wrap_one = wrap_foreign if foreign else wrap

    def call(*args: Any, **kwargs: Any) -> Any:
        raw: list[Any] = []
        args = tuple([unwrap(a, raw) for a in args])
        if kwargs:
            kwargs = {k: unwrap(v, raw) for k, v in kwargs.items()}
        try:
            out = fn(*args, **kwargs)
        except RuntimeError as e:  # out of memory: name the holders; else untouched
            on_jax_error(e, name, args)
            raise
        if transfer and type(out) in CONCRETE and not any(out is r for r in raw):
            return wrap_transfer(out, tuple(v for v in args if type(v) in CONCRETE))
        return wrap_tree(out, raw, foreign)

    def lifted(*args: Any, **kwargs: Any) -> Any:
        if _kernel_hook is not None:
            return _kernel_hook(name, call, args, kwargs)
        if kwargs or transfer:
            return call(*args, **kwargs)
        # The common call, f(t) or f(t, u, 2.0): Tensors and scalars only, no tree walk.
        vals = []
        for a in args:
            ta = type(a)
            if ta in TENSOR_TYPES:
                rec = a._r
                if rec is None or rec.dead is not None:
                    raise disposed_error(a)
                vals.append(a._array)
            elif ta in _SCALARS:
                vals.append(a)
            else:
                return call(*args)
        try:
            out = fn(*vals)
        except RuntimeError as e:
            on_jax_error(e, name, args)
            raise
        if type(out) is ArrayImpl:
            return wrap_one(out)
        return wrap_tree(out, None, foreign)

    with contextlib.suppress(AttributeError, TypeError):  # callables without metadata
        lifted = functools.wraps(fn)(lifted)
    return lifted


# -- profiling hooks ---------------------------------------------------------------------------

_kernel_hook: Callable[..., Any] | None = None
_OPERATORS: dict[str, tuple[Callable[..., Any], str]] = {}


def set_kernel_hook(hook: Callable[..., Any] | None) -> None:
    """Install ``hook`` on every op (None: restore the plain ops)."""
    global _kernel_hook
    _kernel_hook = hook
    for attr, (plain, name) in _OPERATORS.items():
        setattr(Tensor, attr, plain if hook is None else _hooked(plain, name, hook))


def _hooked(plain: Callable[..., Any], name: str, hook: Callable[..., Any]) -> Callable[..., Any]:
    def op(*args: Any) -> Any:
        return hook(name, plain, args, {})

    op.__name__ = plain.__name__
    return op


# -- operators ---------------------------------------------------------------------------------


def _binary(op: Callable[[Any, Any], Any], reflected: bool) -> Callable[[Tensor, Any], Any]:
    jitted = jax.jit((lambda a, b: op(b, a)) if reflected else op)
    plain = (lambda a, b: op(b, a)) if reflected else op

    def method(self: Tensor, other: Any) -> Any:
        rec = self._r
        if rec is None or rec.dead is not None:
            raise disposed_error(self)
        to = type(other)
        try:  # free while nothing is raised (CPython 3.11)
            if to in TENSOR_TYPES:
                orec = other._r
                if orec is None or orec.dead is not None:
                    raise disposed_error(other)
                if rec is not UNTRACKED and orec is not UNTRACKED:
                    return wrap(jitted(self._array, other._array))
                return wrap(plain(self._array, other._array))
            if to is float and rec is not UNTRACKED:
                return wrap(jitted(self._array, other))
            out = plain(self._array, other)
            return wrap(out) if type(out) is ArrayImpl else wrap_tree(out)  # one array: no walk
        except RuntimeError as e:
            on_jax_error(e, op.__name__, (other, self) if reflected else (self, other))
            raise

    return method


def _unary(op: Callable[[Any], Any], name: str = "") -> Callable[[Tensor], Any]:
    jitted = jax.jit(op)
    name = name or op.__name__

    def method(self: Tensor) -> Any:
        rec = self._r
        if rec is None or rec.dead is not None:
            raise disposed_error(self)
        try:
            if rec is UNTRACKED:
                return wrap(op(self._array))
            return wrap(jitted(self._array))
        except RuntimeError as e:
            on_jax_error(e, name, (self,))
            raise

    return method


def _getitem(self: Tensor, index: Any) -> Tensor:
    rec = self._r
    if rec is None or rec.dead is not None:
        raise disposed_error(self)
    try:
        return wrap(self._array[unwrap(index)])
    except RuntimeError as e:
        on_jax_error(e, "getitem", (self, index))
        raise


def _method(fn: Callable[..., Any], name: str, jit_plain: bool) -> Callable[..., Any]:
    lifted = lift_named(fn, name)
    # A call without arguments (t.exp(), t.sum()) has static shapes: it may run jitted.
    plain = jax.jit(fn) if jit_plain else fn

    def method(self: Tensor, *args: Any, **kwargs: Any) -> Any:
        if args or kwargs or _kernel_hook is not None:
            return lifted(self, *args, **kwargs)
        rec = self._r
        if rec is None or rec.dead is not None:
            raise disposed_error(self)
        try:
            out = fn(self._array) if rec is UNTRACKED else plain(self._array)
        except RuntimeError as e:
            on_jax_error(e, name, (self,))
            raise
        return wrap(out) if type(out) is ArrayImpl else wrap_tree(out)  # one array: no walk

    method.__name__ = method.__qualname__ = name
    method.__doc__ = f"Like ``{getattr(fn, '__module__', 'jax')}.{name}``; returns tracked Tensors."
    return method


_BINARY = {
    "add": operator.add, "sub": operator.sub, "mul": operator.mul, "truediv": operator.truediv,
    "floordiv": operator.floordiv, "mod": operator.mod, "pow": operator.pow,
    "matmul": operator.matmul, "and": operator.and_, "or": operator.or_, "xor": operator.xor,
    "lshift": operator.lshift, "rshift": operator.rshift,
}  # fmt: skip
_COMPARE = {
    "lt": operator.lt, "le": operator.le, "gt": operator.gt, "ge": operator.ge,
    "eq": operator.eq, "ne": operator.ne,
}  # fmt: skip
_UNARY: dict[str, Callable[[Any], Any]] = {
    "neg": operator.neg, "pos": operator.pos, "abs": operator.abs, "invert": operator.invert,
}  # fmt: skip

#: jax.Array methods exposed on Tensor, each returning tracked Tensors; the second set runs
#: jitted when called without arguments.
ARRAY_METHODS = [
    "all", "any", "argmax", "argmin", "argpartition", "argsort", "astype", "choose", "clip",
    "compress", "conj", "conjugate", "copy", "cumprod", "cumsum", "diagonal", "dot", "flatten",
    "max", "mean", "min", "nonzero", "prod", "ptp", "ravel", "repeat", "reshape", "round",
    "searchsorted", "sort", "squeeze", "std", "sum", "swapaxes", "take", "trace", "transpose",
    "var", "view",
]  # fmt: skip
_JIT_METHODS = frozenset(
    {"all", "any", "argmax", "argmin", "cumprod", "cumsum", "max", "mean", "min", "prod"}
    | {"std", "sum", "var", "conj", "conjugate", "ravel", "flatten", "round", "ptp", "sort"}
)
#: TF.js-style method names that take no argument (``t.exp()``), mapped to the jax.numpy /
#: jax.nn function they call: each one jitted call, as a unary operator.
_UNARY_FUNCTIONS: dict[str, Callable[[Any], Any]] = {
    "square": jnp.square, "exp": jnp.exp, "log": jnp.log, "sqrt": jnp.sqrt, "abs": jnp.abs,
    "neg": jnp.negative, "sin": jnp.sin, "cos": jnp.cos, "tanh": jnp.tanh,
    "sigmoid": jax.nn.sigmoid, "relu": jax.nn.relu,
}  # fmt: skip
#: TF.js-style method names, mapped to the jax.numpy / jax.nn function they call.
FUNCTION_METHODS: dict[str, Callable[..., Any]] = {
    "add": jnp.add, "sub": jnp.subtract, "mul": jnp.multiply, "div": jnp.divide,
    "matmul": jnp.matmul, "pow": jnp.power, "maximum": jnp.maximum, "minimum": jnp.minimum,
    **_UNARY_FUNCTIONS,
}  # fmt: skip


def _inplace(attr: str) -> Callable[..., Any]:
    """``t op= x``: a plain Tensor is immutable, like ``jax.Array``, so the name is rebound to
    the result; a Variable is assigned the result (``w -= lr * g`` updates ``w`` in place, and
    a shape or dtype change raises as `Variable.assign` does)."""

    def inplace(self: Tensor, other: Any) -> Any:
        result = getattr(self, attr)(other)
        if result is NotImplemented or getattr(self, "_var", None) is None:
            return result
        try:
            self.assign(result)
        finally:
            result.dispose()  # the Variable holds the buffer now; the temporary goes
        return self

    inplace.__name__ = inplace.__qualname__ = attr.replace("__", "__i", 1)
    return inplace


def _install(attr: str, method: Callable[..., Any], name: str) -> None:
    method.__name__ = attr
    setattr(Tensor, attr, method)
    _OPERATORS[attr] = (method, name)


def install_tensor_methods() -> None:
    """Put every operator and method on `Tensor`; called once, on import of tidyjax."""
    for name, op in _BINARY.items():
        _install(f"__{name}__", _binary(op, reflected=False), name)
        _install(f"__r{name}__", _binary(op, reflected=True), name)
    for name, op in _COMPARE.items():
        _install(f"__{name}__", _binary(op, reflected=False), name)
    for name, unary in _UNARY.items():
        _install(f"__{name}__", _unary(unary), name)
    for name in _BINARY:
        setattr(Tensor, f"__i{name}__", _inplace(f"__{name}__"))
    _install("__divmod__", _method(divmod, "divmod", jit_plain=False), "divmod")
    _install("__rdivmod__", _method(lambda a, b: divmod(b, a), "divmod", False), "divmod")
    _install("__getitem__", _getitem, "getitem")
    for name in ARRAY_METHODS:
        if hasattr(ArrayImpl, name):
            fn = getattr(ArrayImpl, name)
            setattr(Tensor, name, _method(fn, name, jit_plain=name in _JIT_METHODS))
    for name, fn in FUNCTION_METHODS.items():
        if name in _UNARY_FUNCTIONS:  # t.exp(): an operator's path, hooked while profiling
            unary = _unary(fn, name)
            unary.__doc__ = f"Like ``{fn.__module__}.{fn.__name__}``; returns a tracked Tensor."
            _install(name, unary, name)
        else:
            setattr(Tensor, name, _method(fn, name, jit_plain=False))
    # round(t), round(t, 2): as on jax.Array (an int dtype without ndigits, as for a float).
    # (Declared for type checkers at the end of class Tensor, hence the ignores.)
    Tensor.__round__ = _method(ArrayImpl.__round__, "round", jit_plain=True)  # type: ignore[method-assign]
    Tensor.at = property(lambda self: _At(self))  # type: ignore[method-assign, assignment]
    Tensor.at.__doc__ = (
        "Functional updates, as ``jax.Array.at``: ``t.at[0].set(5.0)`` returns a new Tensor."
    )


class _At:
    """``t.at[index]`` → an object whose ``set/add/multiply/…`` return tracked Tensors."""

    __slots__ = ("_t",)

    def __init__(self, t: Tensor) -> None:
        self._t = t

    def __getitem__(self, index: Any) -> _AtIndex:
        return _AtIndex(self._t.array.at[unwrap(index)])


class _AtIndex:
    __slots__ = ("_ref",)

    def __init__(self, ref: Any) -> None:
        self._ref = ref

    def __getattr__(self, name: str) -> Callable[..., Any]:
        fn = getattr(self._ref, name)

        def update(*args: Any, **kwargs: Any) -> Any:
            kwargs = {k: unwrap(v) for k, v in kwargs.items()}
            try:
                return wrap_tree(fn(*unwrap_args(args), **kwargs))
            except RuntimeError as e:
                on_jax_error(e, f"at[...].{name}", args)
                raise

        return update
