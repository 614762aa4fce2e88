"""``Variable``: a mutable, named Tensor that no scope ever frees."""

from __future__ import annotations

import threading
import weakref
from typing import Any

from . import _registry
from ._arrays import CONCRETE
from ._context import CURRENT, Tracker
from ._errors import (
    VARIABLES_DISPOSED,
    TidyjaxTypeError,
    TidyjaxValueError,
    check_flag,
    variable_disposed,
)
from ._tensor import (
    Tensor,
    copy_in,
    dispose_tensor,
    note_holder,
    variable_info,
    variable_tensor,
)

__all__ = ["Variable", "dispose_variables"]

_variables: dict[int, weakref.ref[Tensor]] = {}
_variables_lock = threading.Lock()
_prune_at = [1024]  # collected Variables' entries are pruned when the dict doubles


class _VarInfo:
    """What makes a Tensor a Variable: its name and whether it is trainable."""

    __slots__ = ("name", "trainable")

    def __init__(self, name: str | None, trainable: bool) -> None:
        self.name = name
        self.trainable = trainable

    # What Tensor's Variable methods delegate to, so that _tensor never imports this module.

    def dispose(self, v: Tensor) -> None:
        dispose_variable(v)

    def assign(self, v: Tensor, value: Any) -> Tensor:
        return assign(v, value)

    def copy(self, v: Tensor) -> Tensor:
        """``copy.copy(v)``: a Variable sharing ``v``'s buffer."""
        return Variable(v, name=self.name, trainable=self.trainable)

    def reduce(self, data: Any) -> tuple[Any, ...]:
        """``v.__reduce__()`` with ``v``'s values ``data``: unpickles as a Variable."""
        return (restore_variable, (data, self.name, self.trainable))


class _VariableType(type):
    """``isinstance(x, Variable)``: x is a Tensor carrying a variable flag."""

    def __instancecheck__(cls, obj: Any) -> bool:
        return getattr(obj, "_var", None) is not None


class Variable(Tensor, metaclass=_VariableType):
    """A Tensor whose value can be replaced with `assign`; never freed by a scope.

    Built from a Tensor, it shares that Tensor's buffer (two tensors, one data buffer); from any
    other data (including a raw ``jax.Array``) it holds a copy. Use it in ops like a Tensor; the
    results are plain Tensors. Free it with [`dispose`][tidyjax.Tensor.dispose] or
    [`dispose_variables`][tidyjax.dispose_variables].

    A Variable *is* a [`Tensor`][tidyjax.Tensor] carrying a variable flag
    (``isinstance(v, Variable)`` is true, ``type(v)`` is ``Tensor``): JAX sees one pytree node type,
    so a tree of Variables maps together with its gradients and optax updates
    (``optax.apply_updates(variables, updates)``). ``pickle`` and ``copy.deepcopy`` give back a
    Variable with the same name and ``trainable``.

    Example:
        ```python
        w = tidyjax.Variable(tidyjax.tensor([1.0, 2.0]), name="w")
        with tidy():
            w.assign(w - 0.1 * grad)   # the old buffer is freed, the new one survives the scope
        ```
    """

    __slots__ = ()

    def __new__(cls, value: Any, *, trainable: bool = True, name: str | None = None) -> Variable:
        trainable = check_flag(trainable, "trainable", "Variable()")
        if name is not None and not isinstance(name, str):
            raise TidyjaxTypeError(f"Variable name must be a str, got {type(name).__name__}.")
        arr = _value_of(value, "Variable()")
        v = variable_tensor(
            arr, lambda tid: _hold(arr, value, tid), _VarInfo(name, bool(trainable))
        )
        with _variables_lock:
            if len(_variables) > _prune_at[0]:
                for key in [k for k, r in _variables.items() if r() is None]:
                    del _variables[key]
                _prune_at[0] = max(1024, 2 * len(_variables))
            _variables[v.id] = weakref.ref(v)
        return v  # type: ignore[return-value]


Variable.__module__ = "tidyjax"


def assign(self: Tensor, value: Any) -> Tensor:
    """Replace a Variable's value; shape and dtype must match. Returns the Variable.

    The old buffer is freed unless another live Tensor still uses it. A Tensor value is shared,
    not copied, so it may be a temporary of the current scope. A Variable whose buffer was
    donated to a jitted function may be assigned its new value.

    Raises:
        TidyjaxTypeError: this is a plain Tensor (Tensors are immutable), or the dtype differs.
        TidyjaxValueError: the shape differs.
        DisposedError: this Variable or ``value`` is disposed.
    """
    variable_info(self, "assign")
    if self._rec is None:  # disposed; a donated variable (rec.dead) may take a new value
        self._value()
    label = _label(self)
    old = self._array
    new = _value_of(value, f"{label}.assign()")
    if tuple(new.shape) != tuple(old.shape):
        raise TidyjaxValueError(
            f"{label}.assign() got shape {tuple(new.shape)}, but the variable has "
            f"shape {tuple(old.shape)}; a Variable's shape is fixed. Reshape the value or "
            "make a new Variable."
        )
    if new.dtype != old.dtype:
        raise TidyjaxTypeError(
            f"{label}.assign() got dtype {new.dtype}, but the variable has dtype "
            f"{old.dtype}; cast with value.astype({str(old.dtype)!r})."
        )
    old_rec = self._rec
    if old_rec is not None and old_rec.dead is None and old_rec is _registry.lookup(new):
        self._array = new  # the same buffer (v.assign(v), a clone, a same-dtype astype)
        return self
    rec = _hold(new, value, self._id)
    self._array = new
    self._rec = rec
    note_holder(rec, self)  # a suspect's Tensors are followed
    if old_rec is not None and old_rec.dead is None:
        _registry.let_go(old_rec)
        _registry.release(old_rec)  # freed unless another live Tensor holds it
    return self


def dispose_variable(v: Tensor) -> None:
    """Free a Variable now (its buffer too, unless a live Tensor shares it). Idempotent."""
    dispose_tensor(v, variable_disposed(_label(v)))
    with _variables_lock:
        _variables.pop(v.id, None)


def _label(v: Tensor) -> str:
    name = v.name
    return f"Variable {name!r}" if name else f"Variable (id {v.id})"


def restore_variable(data: Any, name: str | None, trainable: bool) -> Tensor:
    """Unpickling: a Variable again, owned by no scope."""
    return Variable(data, name=name, trainable=trainable)


def _hold(arr: Any, value: Any, tensor: int) -> _registry.Buffer:
    """The record of ``arr`` with one more holder (the Variable of id ``tensor``), owned by no
    scope from now on.

    When the buffer came from ``value``, a Tensor of some scope, that scope still disposes the
    Tensor object at its exit (as TensorFlow.js does); the buffer stays with the Variable.
    """
    rec = _registry.lookup(arr)
    if rec is None or rec.dead is not None:
        rec = _registry.new(arr, _registry.VARIABLE, tensor=tensor)
        rec.nvars = 1
        home = CURRENT.get()
        if home is not None:  # a copy made in a scope: the scope's once no Variable holds it
            rec.home = home
        return rec
    _registry.join(rec)
    if _registry.observers:  # one Tensor more on the buffer, as a clone reports it
        _registry.notify("tensor_added", rec, tensor)
    owner = rec.scope
    if owner is not _registry.VARIABLE:
        rec.home = owner  # the buffer is its again once no Variable holds it
    rec.nvars = getattr(rec, "nvars", 0) + 1
    if isinstance(owner, Tracker) and isinstance(value, Tensor) and not isinstance(value, Variable):
        owner.note_alias(value)
    rec.scope = _registry.VARIABLE
    return rec


def _value_of(value: Any, what: str) -> Any:
    """A jax.Array for a new variable value: a Tensor's own buffer, otherwise a copy."""
    if isinstance(value, Tensor):
        arr = value.array
        if type(arr) not in CONCRETE:
            raise TidyjaxTypeError(
                f"{what} got a traced Tensor (inside jit/grad/vmap); assign concrete values "
                "outside the transformed function."
            )
        return arr
    return copy_in(value, None, None)


def num_variables() -> int:
    """How many Variables are registered (live, or dropped and not yet collected)."""
    return len(_variables)


def live_variables() -> list[Tensor]:
    """The live Variables, in the order they were made."""
    return [v for ref in list(_variables.values()) if (v := ref()) is not None]


def dispose_variables() -> int:
    """Dispose every live Variable; returns how many were disposed."""
    with _variables_lock:
        refs = list(_variables.values())
        _variables.clear()
    n = 0
    for ref in refs:
        v = ref()
        if v is not None and not v.is_disposed:
            dispose_tensor(v, VARIABLES_DISPOSED)
            n += 1
    return n
