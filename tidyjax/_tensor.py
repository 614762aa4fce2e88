"""``Tensor``: a tracked owner of one ``jax.Array``; ``wrap``, the path every result takes.

Read top-down: the Tensor's state and accessors, then ``wrap`` (the per-op path), disposal, and
the two constructors ``tensor()`` and ``adopt()``. Operators and methods are installed on the
class by ``_ops.install_tensor_methods()``.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import math
import operator
import sys
import weakref
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any, NoReturn

import jax
import jax.numpy as jnp
import numpy as np

from . import _format, _html, _registry
from ._arrays import (
    CONCRETE,
    JAX_KEY_CHECKS,
    JAX_OPERATORS,
    ArrayImpl,
    PRNGKeyArray,
    Tracer,
    describe,
    failed,
)
from ._context import CURRENT, TRACING, on_jax_error
from ._errors import (
    DISPOSED,
    RELEASED,
    DisposedError,
    Reason,
    TidyjaxTypeError,
    TidyjaxValueError,
    check_flag,
)
from ._jaxdoors import BIND_CONVERSION, base_array, trace_of

if TYPE_CHECKING:  # for the declarations at the end of class Tensor
    from collections.abc import Callable, Sequence
    from typing import TypeAlias

    from jax.typing import ArrayLike
    from typing_extensions import Self

    _Operand: TypeAlias = "Tensor | ArrayLike"  # what an operator takes
    _Axis: TypeAlias = "int | Sequence[int] | None"

__all__ = ["Tensor", "adopt", "tensor"]

tensor_ids = itertools.count(1)
_ABSENT: Any = object()
#: ``[rebuild]``: what ``Tensor(array=child)`` returns, the Tensor node JAX rebuilds over
#: ``child`` in ``tree_unflatten`` (``_lift._unflatten``, set at import).
REBUILD: list[Callable[[Any], Any]] = []
_new = object.__new__
_buffers = _registry.by_array
_UNTRACKED = _registry.UNTRACKED
_fresh = _registry.fresh
_made = _registry.made
_made_all = _registry.made_all
_Batch = _registry.Batch
VARIABLE = _registry.VARIABLE


class Tensor:
    """A tracked owner of one ``jax.Array`` (on one device or sharded over several).

    Every operator and method returns a new tracked Tensor, created in the current
    [`tidy`][tidyjax.tidy] scope. [`dispose`][tidyjax.Tensor.dispose] deletes the device buffer at
    once unless another live Tensor or a [`Variable`][tidyjax.Variable] shares it. ``Tensor(data)``
    is the same as [`tidyjax.tensor`][tidyjax.tensor]: it copies. ``Tensor(array=x)`` is how JAX
    rebuilds a Tensor node (``tree_unflatten``): it takes ``x`` over, as
    [`tidyjax.adopt`][tidyjax.adopt] does; in your own code call ``tensor`` or ``adopt``.

    Example:
        ```python
        a = tidyjax.tensor([1.0, 2.0, 3.0])
        b = (a * 2).sum()
        b.dispose()
        ```
    """

    __slots__ = ("__weakref__", "_array", "_i", "_id", "_kept", "_r", "_var", "_why")

    # numpy defers to our reflected operators (``np_array + t`` gives a Tensor), as with jax.Array.
    __array_priority__ = 100

    _array: Any
    _id: int
    _r: Any  # the record (a Buffer), or a Batch holding leaf `_i`; None once disposed
    _i: int  # the leaf index in a Batch (unset otherwise)
    _why: Reason
    _kept: bool  # set by tidyjax.keep: no scope disposes this object (unset: False)
    _var: Any  # a Variable's name and trainable flag (see _variable.py; unset: a plain Tensor)

    def __new__(
        cls, data: Any = _ABSENT, dtype: Any = None, *, device: Any = None, array: Any = _ABSENT
    ) -> Tensor:
        if array is not _ABSENT:  # JAX rebuilding a Tensor node (``tree_unflatten``)
            if data is not _ABSENT or dtype is not None or device is not None:
                raise TidyjaxTypeError(
                    "Tensor(array=x) is how JAX rebuilds a Tensor node and takes nothing else; "
                    "to make a Tensor call tidyjax.tensor(data, dtype, device=...) (a copy) or "
                    "tidyjax.adopt(array)."
                )
            return REBUILD[0](array)
        if data is _ABSENT:
            raise TidyjaxTypeError("Tensor() needs data: tidyjax.Tensor([1.0, 2.0])")
        return tensor(data, dtype, device=device)

    def __del__(
        self,
        _registry: Any = _registry,
        _UNTRACKED: Any = _UNTRACKED,  # noqa: N803
        _Batch: Any = _Batch,  # noqa: N803
        _VARIABLE: Any = VARIABLE,  # noqa: N803
        _suppress: Any = contextlib.suppress,
    ) -> None:
        # The one place a collected Tensor is noticed: its record has one holder fewer. The
        # buffer is not freed here; its owner (or JAX, when the last array reference goes) does.
        # The modules are bound as defaults: at interpreter exit their globals are already None.
        try:
            rec = self._r
        except AttributeError:  # a half-built Tensor
            return
        if type(rec) is _Batch:
            if rec.dead is not None:
                return
            try:
                rec = _registry.leave_batch(rec, self._i)
            except Exception:  # at interpreter exit, with the module's globals gone
                return
            if rec is None:
                return
        if rec is not None and rec is not _UNTRACKED:
            rec.n -= 1
            if rec.scope is _VARIABLE and rec.dead is None and getattr(self, "_var", None):
                with _suppress(Exception):  # at interpreter exit the globals are gone
                    _registry.let_go(rec)  # a collected Variable holds its buffer no more
            if _registry.suspects and rec.n <= 0 and rec.dead is None and _registry.mine(rec):
                _registry.orphan(self._array)  # a suspect may be its buffer's next holder
            if _registry.observers and rec.dead is None:
                _registry.notify("tensor_removed", rec)

    @property
    def _rec(self) -> Any:
        """This Tensor's record (a `Buffer`; None once disposed). A leaf a `Batch` holds gets a
        record of its own first: the batch's fast paths read ``_r``."""
        rec = self._r
        if type(rec) is _Batch:
            return own_record(rec, self)
        return rec

    @_rec.setter
    def _rec(self, rec: Any) -> None:
        self._r = rec

    # -- state -----------------------------------------------------------------------------
    # The liveness test `rec is None or rec.dead is not None` is inlined on the hot paths
    # (`_value`, `__getitem__`, the operators in `_ops.py`): a call would cost more than it.

    def _value(self) -> Any:
        """The live jax value, or raise `DisposedError`."""
        rec = self._r
        if rec is None or rec.dead is not None:
            raise disposed_error(self)
        return self._array

    @property
    def array(self) -> jax.Array:
        """The ``jax.Array`` this Tensor owns; dispose the Tensor rather than deleting it.

        Also the Tensor's one pytree child: JAX reads it in C++ when it flattens a tree
        (``jax.tree_util.keystr`` names the leaf ``….array``)."""
        rec = self._r  # `_value`, inlined: JAX calls this once per Tensor in every flatten
        if rec is None or rec.dead is not None:
            raise disposed_error(self)
        return self._array

    @property
    def id(self) -> int:
        """A process-unique, increasing number identifying this Tensor."""
        return self._id

    @property
    def is_disposed(self) -> bool:
        """True once the Tensor was disposed, freed by a scope, or its buffer was donated.

        Also true once its buffer was deleted behind tidyjax's back (``t.array.delete()``, a
        raw ``jax.jit(..., donate_argnums=...)`` call): the buffer's record is marked dead then.
        """
        rec = self._r
        if rec is None or rec.dead is not None:
            return True
        if type(rec) is _Batch:
            if type(self._array) in CONCRETE and self._array.is_deleted():
                rec = self._rec  # deleted outside tidyjax: the leaf's own record says so
            else:
                return False
        if rec is not _UNTRACKED and type(self._array) in CONCRETE and self._array.is_deleted():
            _registry.check(rec)  # deleted outside tidyjax: the record is dead from now on
            return rec.dead is not None
        return False

    def dispose(self) -> None:
        """Release this Tensor now; its buffer is deleted unless another live Tensor shares it.

        Idempotent: disposing twice does nothing.
        """
        var = getattr(self, "_var", None)
        if var is None:
            dispose_tensor(self, DISPOSED)
        else:
            var.dispose(self)

    # -- Variables (a Variable is a Tensor carrying ``_var``; see _variable.py) -------------

    @property
    def name(self) -> str | None:
        """A Variable's name; None for a plain Tensor or an unnamed Variable."""
        var = getattr(self, "_var", None)
        return var.name if var is not None else None

    @name.setter
    def name(self, value: str | None) -> None:
        if value is not None and not isinstance(value, str):
            raise TidyjaxTypeError(f"Variable name must be a str, got {type(value).__name__}.")
        variable_info(self, "name").name = value

    @property
    def trainable(self) -> bool:
        """Whether a Variable is trainable; False for a plain Tensor."""
        var = getattr(self, "_var", None)
        return var.trainable if var is not None else False

    @trainable.setter
    def trainable(self, value: bool) -> None:
        variable_info(self, "trainable").trainable = check_flag(value, "trainable", "Variable")

    def assign(self, value: Any) -> Tensor:
        """Replace a Variable's value (see `Variable`); plain Tensors are immutable."""
        return variable_info(self, "assign").assign(self, value)

    def clone(self) -> Tensor:
        """A new Tensor sharing this one's buffer (no copy); each must be disposed on its own."""
        return wrap(self._value())

    # -- shape and metadata ----------------------------------------------------------------

    # Shape and dtype stay readable after dispose: only the data is gone.

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self._array.shape)

    @property
    def dtype(self) -> np.dtype[Any]:
        return self._array.dtype

    @property
    def ndim(self) -> int:
        if type(self._array) is PRNGKeyArray and sys._getframe(1).f_code in JAX_KEY_CHECKS:
            refused_by_jax(self)  # jax.random.* got a key Tensor: name the fix
        return len(self._array.shape)

    @property
    def size(self) -> int:
        return math.prod(self._array.shape)

    @property
    def nbytes(self) -> int:
        return int(self._value().nbytes)

    @property
    def sharding(self) -> Any:
        return self._value().sharding

    def devices(self) -> set[Any]:
        """The devices holding this Tensor's buffer(s)."""
        return set(self._value().devices())

    @property
    def device(self) -> Any:
        return self._value().device

    # What else a jax.Array tells about itself, so that a Tensor stands in for one wherever a
    # user reads it. Each reads the live array (DisposedError once disposed), except itemsize,
    # which like shape and dtype is metadata that stays readable.

    @property
    def itemsize(self) -> int:
        """Bytes per element, as ``jax.Array.itemsize``; readable after dispose."""
        return int(self._array.dtype.itemsize)

    @property
    def weak_type(self) -> bool:
        """Whether the dtype is weak (from a Python scalar), as ``jax.Array.weak_type``."""
        return bool(self._value().weak_type)

    @property
    def committed(self) -> bool:
        """Whether the buffer is committed to its device(s), as ``jax.Array.committed``."""
        return bool(self._value().committed)

    @property
    def is_fully_addressable(self) -> bool:
        """Whether this process holds every shard, as ``jax.Array.is_fully_addressable``."""
        return bool(self._value().is_fully_addressable)

    @property
    def is_fully_replicated(self) -> bool:
        """Whether every device holds all the data, as ``jax.Array.is_fully_replicated``."""
        return bool(self._value().is_fully_replicated)

    @property
    def format(self) -> Any:
        """The layout and sharding of the buffer, as ``jax.Array.format``."""
        return self._value().format

    def on_device_size_in_bytes(self) -> int:
        """Bytes the buffer takes on its device(s), padding included (as ``jax.Array``'s)."""
        return int(self._value().on_device_size_in_bytes())

    @property
    def addressable_shards(self) -> list[Any]:
        """This process's shards, as ``jax.Array.addressable_shards``.

        JAX's own ``Shard`` objects, whose ``.data`` are raw ``jax.Array`` objects over this
        Tensor's buffer: tidyjax does not track them, and they are gone when the Tensor is
        disposed. Waits for the value first, so that a failed computation raises instead of
        aborting.
        """
        return list(self.block_until_ready()._array.addressable_shards)

    @property
    def global_shards(self) -> list[Any]:
        """Every shard, as ``jax.Array.global_shards`` (raw, untracked; see
        [`addressable_shards`][tidyjax.Tensor.addressable_shards])."""
        return list(self.block_until_ready()._array.global_shards)

    def addressable_data(self, index: int) -> Any:
        """The ``index``-th local shard as a raw ``jax.Array`` (untracked; see
        [`addressable_shards`][tidyjax.Tensor.addressable_shards])."""
        return self.block_until_ready()._array.addressable_data(index)

    def is_ready(self) -> bool:
        """Whether the value is computed, without waiting (as ``jax.Array.is_ready``)."""
        return bool(self._value().is_ready())

    def is_deleted(self) -> bool:
        """Whether the buffer is gone: the same as `is_disposed` (a Tensor's buffer is
        freed by disposing it, never by deleting it)."""
        return self.is_disposed

    def delete(self) -> None:
        """Not for Tensors: tidyjax frees a Tensor's buffer; call `dispose`."""
        raise TidyjaxTypeError(
            f"{kind(self)} {describe(self._array)} (id {self._id}) has no delete(): tidyjax "
            "frees its buffer. Call t.dispose() (the buffer is deleted unless another live "
            "Tensor shares it), or let its tidy() scope free it."
        )

    @property
    def mT(self) -> Tensor:  # noqa: N802 - the array API's name
        """The transpose of the last two axes, as ``jax.Array.mT``."""
        return wrap(self._value().mT)

    def to_device(self, device: Any, *, stream: Any = None) -> Tensor:
        """A Tensor on ``device``, as ``jax.Array.to_device`` (the array API's `to`)."""
        arr = self._value()
        return wrap_transfer(arr.to_device(device, stream=stream), (arr,))

    @property
    def T(self) -> Tensor:  # noqa: N802 - numpy's name
        return wrap(self._value().T)

    @property
    def real(self) -> Tensor:
        return wrap(self._value().real)

    @property
    def imag(self) -> Tensor:
        return wrap(self._value().imag)

    def to(self, target: Any) -> Tensor:
        """A Tensor on ``target`` (a ``jax.Device`` or ``jax.sharding.Sharding``).

        Moving to where the buffer already is shares the buffer, as ``jax.device_put`` does.
        """
        arr = self._value()
        return wrap_transfer(jax.device_put(arr, target), (arr,))

    # -- conversion to host ----------------------------------------------------------------

    def numpy(self) -> np.ndarray:
        """The values as a NumPy array (a copy; stays valid after dispose)."""
        return np.array(self._value())

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        if copy is False:
            raise TidyjaxValueError(
                "a Tensor cannot be converted to a NumPy array without a copy; use t.numpy()."
            )
        return np.array(self._value(), dtype=dtype)

    def __jax_array__(self) -> Any:
        if sys._getframe(1).f_code in JAX_OPERATORS:
            # A jax.Array's operator (``raw * t``) asks first: answering with the Tensor makes it
            # return NotImplemented, so Python calls our reflected operator: a tracked result.
            return self
        return self._value()

    def item(self, *args: Any) -> Any:
        return self._value().item(*args)

    def tolist(self) -> Any:
        return self._value().tolist()

    def block_until_ready(self) -> Tensor:
        self._value().block_until_ready()
        return self

    def copy_to_host_async(self) -> None:
        """Start copying the values to the host without waiting (as ``jax.Array``'s), so that a
        later [`numpy`][tidyjax.Tensor.numpy] is quicker."""
        self._value().copy_to_host_async()

    def tobytes(self, order: str = "C") -> bytes:
        """The values as raw bytes, as ``jax.Array.tobytes``."""
        return bytes(self.block_until_ready()._array.tobytes(order))

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:
        """The DLPack capsule of the array (``np.from_dlpack(t)``, ``torch.from_dlpack(t)``).

        The consumer shares this Tensor's buffer: it is valid until the Tensor is disposed.
        """
        return self.block_until_ready()._array.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self) -> Any:
        return self._value().__dlpack_device__()

    @property
    def __cuda_array_interface__(self) -> Any:  # GPU buffers only, as on jax.Array
        return self.block_until_ready()._array.__cuda_array_interface__

    def __contains__(self, value: Any) -> bool:
        """``x in t``: whether any element of the 1-D Tensor ``t`` equals the scalar ``x``."""
        if isinstance(value, Tensor):
            value = value._value()
        return bool(value in self._value())

    def __bool__(self) -> bool:
        return bool(self._value())

    def __float__(self) -> float:
        return float(self._value())

    def __int__(self) -> int:
        return int(self._value())

    def __index__(self) -> int:
        return operator.index(self._value())

    def __complex__(self) -> complex:
        return complex(self._value())

    def __len__(self) -> int:
        return len(self._value())

    def __iter__(self) -> Iterator[Tensor]:
        for row in self._value():
            yield wrap(row)

    def __format__(self, spec: str) -> str:
        return format(self._value(), spec)

    def __repr__(self) -> str:
        name = kind(self)
        if self.is_disposed:
            return f"<{name} {describe(self._array)} id={self._id}: disposed, {reason(self)}>"
        if type(self._array) in CONCRETE and failed(self._array, wait=True):
            # JAX's repr waits for the values too, and then reading them aborts the process
            label = self.name
            named = f"name={label!r}, " if label else ""
            return f"{name}({named}{_failed_note(self._array)})"
        text = repr(self._array)
        if text.startswith("Array(") and text.endswith(")"):
            text = text[len("Array(") : -1]
        elif text.startswith("Array("):  # a PRNG key: "Array((), dtype=key<fry>) overlaying:\n…"
            return f"{name}{text[len('Array') :]}"
        label = self.name
        return f"{name}(name={label!r}, {text})" if label else f"{name}({text})"

    def __str__(self) -> str:
        if self.is_disposed or (type(self._array) in CONCRETE and failed(self._array, wait=True)):
            return repr(self)
        return str(self._array)

    def _repr_html_(self) -> str:
        return _tensor_html(self)

    def __setitem__(self, index: Any, value: Any) -> None:
        raise TidyjaxTypeError(
            f"Tensor {describe(self._array)} is immutable, like jax.Array; "
            f"use t = t.at[index].set(value) to get an updated Tensor."
        )

    # Tensors compare elementwise, so like jax.Array they are unhashable.
    __hash__ = None  # type: ignore[assignment]

    # -- copying and pickling (each copy is a Tensor the registry counts) -------------------

    def __copy__(self) -> Tensor:
        var = getattr(self, "_var", None)
        if var is None:
            return self.clone()
        return var.copy(self)  # a Variable sharing the buffer

    def __deepcopy__(self, memo: dict[int, Any]) -> Tensor:
        fn, args = self.__reduce__()
        return fn(*args)

    def __reduce__(self) -> tuple[Any, ...]:
        var = getattr(self, "_var", None)
        if var is None:
            return (tensor, (np.array(self._value()),))
        return var.reduce(np.array(self._value()))

    # -- declarations for type checkers ------------------------------------------------------
    # `_ops.install_tensor_methods()` installs the operators, `.at`, and the methods below at
    # run time; this block (never executed) declares them, as jax's `basearray.pyi` does for
    # jax.Array. Keep it in step with `_ops.py`'s tables; `tests/typing/` checks it.
    if TYPE_CHECKING:

        def __getitem__(self, index: Any, /) -> Tensor: ...
        def __round__(self, ndigits: int | None = None) -> Tensor: ...

        # Comparisons are elementwise, as on jax.Array (so not `bool`).
        def __lt__(self, other: _Operand, /) -> Tensor: ...
        def __le__(self, other: _Operand, /) -> Tensor: ...
        def __gt__(self, other: _Operand, /) -> Tensor: ...
        def __ge__(self, other: _Operand, /) -> Tensor: ...
        def __eq__(self, other: _Operand, /) -> Tensor: ...  # type: ignore[override]
        def __ne__(self, other: _Operand, /) -> Tensor: ...  # type: ignore[override]

        def __neg__(self) -> Tensor: ...
        def __pos__(self) -> Tensor: ...
        def __abs__(self) -> Tensor: ...
        def __invert__(self) -> Tensor: ...

        def __add__(self, other: _Operand, /) -> Tensor: ...
        def __sub__(self, other: _Operand, /) -> Tensor: ...
        def __mul__(self, other: _Operand, /) -> Tensor: ...
        def __truediv__(self, other: _Operand, /) -> Tensor: ...
        def __floordiv__(self, other: _Operand, /) -> Tensor: ...
        def __mod__(self, other: _Operand, /) -> Tensor: ...
        def __pow__(self, other: _Operand, /) -> Tensor: ...
        def __matmul__(self, other: _Operand, /) -> Tensor: ...
        def __and__(self, other: _Operand, /) -> Tensor: ...
        def __or__(self, other: _Operand, /) -> Tensor: ...
        def __xor__(self, other: _Operand, /) -> Tensor: ...
        def __lshift__(self, other: _Operand, /) -> Tensor: ...
        def __rshift__(self, other: _Operand, /) -> Tensor: ...
        def __divmod__(self, other: _Operand, /) -> tuple[Tensor, Tensor]: ...

        def __radd__(self, other: _Operand, /) -> Tensor: ...
        def __rsub__(self, other: _Operand, /) -> Tensor: ...
        def __rmul__(self, other: _Operand, /) -> Tensor: ...
        def __rtruediv__(self, other: _Operand, /) -> Tensor: ...
        def __rfloordiv__(self, other: _Operand, /) -> Tensor: ...
        def __rmod__(self, other: _Operand, /) -> Tensor: ...
        def __rpow__(self, other: _Operand, /) -> Tensor: ...
        def __rmatmul__(self, other: _Operand, /) -> Tensor: ...
        def __rand__(self, other: _Operand, /) -> Tensor: ...
        def __ror__(self, other: _Operand, /) -> Tensor: ...
        def __rxor__(self, other: _Operand, /) -> Tensor: ...
        def __rlshift__(self, other: _Operand, /) -> Tensor: ...
        def __rrshift__(self, other: _Operand, /) -> Tensor: ...
        def __rdivmod__(self, other: _Operand, /) -> tuple[Tensor, Tensor]: ...

        # In place: a Tensor rebinds the name to the result; a Variable assigns it to itself.
        def __iadd__(self, other: _Operand, /) -> Self: ...
        def __isub__(self, other: _Operand, /) -> Self: ...
        def __imul__(self, other: _Operand, /) -> Self: ...
        def __itruediv__(self, other: _Operand, /) -> Self: ...
        def __ifloordiv__(self, other: _Operand, /) -> Self: ...
        def __imod__(self, other: _Operand, /) -> Self: ...
        def __ipow__(self, other: _Operand, /) -> Self: ...
        def __imatmul__(self, other: _Operand, /) -> Self: ...
        def __iand__(self, other: _Operand, /) -> Self: ...
        def __ior__(self, other: _Operand, /) -> Self: ...
        def __ixor__(self, other: _Operand, /) -> Self: ...
        def __ilshift__(self, other: _Operand, /) -> Self: ...
        def __irshift__(self, other: _Operand, /) -> Self: ...

        class _AtRef:
            """``t.at[index]``: each update returns a new tracked Tensor."""

            def get(self, **kwargs: Any) -> Tensor: ...
            def set(self, values: Any, /, **kwargs: Any) -> Tensor: ...
            def add(self, values: Any, /, **kwargs: Any) -> Tensor: ...
            def subtract(self, values: Any, /, **kwargs: Any) -> Tensor: ...
            def mul(self, values: Any, /, **kwargs: Any) -> Tensor: ...
            def multiply(self, values: Any, /, **kwargs: Any) -> Tensor: ...
            def divide(self, values: Any, /, **kwargs: Any) -> Tensor: ...
            def power(self, values: Any, /, **kwargs: Any) -> Tensor: ...
            def min(self, values: Any, /, **kwargs: Any) -> Tensor: ...
            def max(self, values: Any, /, **kwargs: Any) -> Tensor: ...
            def apply(self, func: Callable[[Any], Any], /, **kwargs: Any) -> Tensor: ...

        class _At:
            def __getitem__(self, index: Any, /) -> Tensor._AtRef: ...

        @property
        def at(self) -> Tensor._At: ...

        # `_ops.ARRAY_METHODS`: jax.Array's methods, returning tracked Tensors. Arguments named
        # as on jax.Array; the ones newer JAX versions added go through **kwargs.
        def all(
            self, axis: _Axis = None, out: None = None, keepdims: bool = False, **kwargs: Any
        ) -> Tensor: ...
        def any(
            self, axis: _Axis = None, out: None = None, keepdims: bool = False, **kwargs: Any
        ) -> Tensor: ...
        def argmax(
            self, axis: int | None = None, out: None = None, keepdims: bool | None = None
        ) -> Tensor: ...
        def argmin(
            self, axis: int | None = None, out: None = None, keepdims: bool | None = None
        ) -> Tensor: ...
        def argpartition(self, kth: int, axis: int = -1) -> Tensor: ...
        def argsort(self, axis: int | None = -1, **kwargs: Any) -> Tensor: ...
        def astype(self, dtype: Any = None, copy: bool = False, device: Any = None) -> Tensor: ...
        def choose(
            self, choices: Sequence[Any], out: None = None, mode: str = "raise"
        ) -> Tensor: ...
        def clip(self, min: Any = None, max: Any = None, **kwargs: Any) -> Tensor: ...
        def compress(self, condition: Any, axis: int | None = None, **kwargs: Any) -> Tensor: ...
        def conj(self) -> Tensor: ...
        def conjugate(self) -> Tensor: ...
        def copy(self) -> Tensor: ...
        def cumprod(self, axis: _Axis = None, dtype: Any = None, out: None = None) -> Tensor: ...
        def cumsum(self, axis: _Axis = None, dtype: Any = None, out: None = None) -> Tensor: ...
        def diagonal(self, offset: int = 0, axis1: int = 0, axis2: int = 1) -> Tensor: ...
        def dot(self, b: Any, /, **kwargs: Any) -> Tensor: ...
        def flatten(self, order: str = "C") -> Tensor: ...
        def max(
            self, axis: _Axis = None, out: None = None, keepdims: bool = False, **kwargs: Any
        ) -> Tensor: ...
        def mean(
            self, axis: _Axis = None, dtype: Any = None, out: None = None, keepdims: bool = False,
            **kwargs: Any,
        ) -> Tensor: ...  # fmt: skip
        def min(
            self, axis: _Axis = None, out: None = None, keepdims: bool = False, **kwargs: Any
        ) -> Tensor: ...
        def nonzero(self, **kwargs: Any) -> tuple[Tensor, ...]: ...
        def prod(
            self, axis: _Axis = None, dtype: Any = None, out: None = None, keepdims: bool = False,
            **kwargs: Any,
        ) -> Tensor: ...  # fmt: skip
        def ptp(self, axis: _Axis = None, out: None = None, keepdims: bool = False) -> Tensor: ...
        def ravel(self, order: str = "C", **kwargs: Any) -> Tensor: ...
        def repeat(self, repeats: Any, axis: int | None = None, **kwargs: Any) -> Tensor: ...
        def reshape(self, *shape: Any, **kwargs: Any) -> Tensor: ...
        def round(self, decimals: int = 0, out: None = None) -> Tensor: ...
        def searchsorted(self, v: Any, side: str = "left", **kwargs: Any) -> Tensor: ...
        def sort(self, axis: int | None = -1, **kwargs: Any) -> Tensor: ...
        def squeeze(self, axis: _Axis = None) -> Tensor: ...
        def std(
            self, axis: _Axis = None, dtype: Any = None, out: None = None, ddof: int = 0,
            keepdims: bool = False, **kwargs: Any,
        ) -> Tensor: ...  # fmt: skip
        def sum(
            self, axis: _Axis = None, dtype: Any = None, out: None = None, keepdims: bool = False,
            **kwargs: Any,
        ) -> Tensor: ...  # fmt: skip
        def swapaxes(self, axis1: int, axis2: int) -> Tensor: ...
        def take(self, indices: Any, axis: int | None = None, **kwargs: Any) -> Tensor: ...
        def trace(
            self, offset: Any = 0, axis1: int = 0, axis2: int = 1, dtype: Any = None,
            out: None = None,
        ) -> Tensor: ...  # fmt: skip
        def transpose(self, *axes: Any) -> Tensor: ...
        def var(
            self, axis: _Axis = None, dtype: Any = None, out: None = None, ddof: int = 0,
            keepdims: bool = False, **kwargs: Any,
        ) -> Tensor: ...  # fmt: skip
        def view(self, dtype: Any = None, type: None = None) -> Tensor: ...

        # `_ops.FUNCTION_METHODS`: the TensorFlow.js names.
        def add(self, other: _Operand, /) -> Tensor: ...
        def sub(self, other: _Operand, /) -> Tensor: ...
        def mul(self, other: _Operand, /) -> Tensor: ...
        def div(self, other: _Operand, /) -> Tensor: ...
        def matmul(self, other: _Operand, /) -> Tensor: ...
        def pow(self, exponent: _Operand, /) -> Tensor: ...
        def maximum(self, other: _Operand, /) -> Tensor: ...
        def minimum(self, other: _Operand, /) -> Tensor: ...
        def square(self) -> Tensor: ...
        def exp(self) -> Tensor: ...
        def log(self) -> Tensor: ...
        def sqrt(self) -> Tensor: ...
        def abs(self) -> Tensor: ...
        def neg(self) -> Tensor: ...
        def sin(self) -> Tensor: ...
        def cos(self) -> Tensor: ...
        def tanh(self) -> Tensor: ...
        def sigmoid(self) -> Tensor: ...
        def relu(self) -> Tensor: ...


Tensor.__module__ = "tidyjax"


def _waiting(method: Any, wait: bool) -> Any:
    """``method`` first waiting for the buffer (``wait``), with JAX's runtime errors handed to
    ``on_jax_error`` as this method's: JAX calls a failed buffer ready, and reading its values
    would abort the process; waiting first raises its error instead."""
    name = method.__name__

    @functools.wraps(method)
    def waiting(self: Tensor, *args: Any, **kwargs: Any) -> Any:
        try:
            if wait:
                rec = self._r
                if rec is not None and rec.dead is None and type(self._array) in CONCRETE:
                    self._array.block_until_ready()
            return method(self, *args, **kwargs)
        except RuntimeError as e:
            on_jax_error(e, name, (self,), method=True)
            raise

    return waiting


#: Tensor's methods that wait for the buffer (they read its values), and ``to``, which moves it.
WAITS = (
    "block_until_ready", "numpy", "item", "tolist", "__array__", "__bool__", "__float__",
    "__int__", "__index__", "__complex__", "__format__",
)  # fmt: skip
for _name in (*WAITS, "to"):
    setattr(Tensor, _name, _waiting(Tensor.__dict__[_name], wait=_name in WAITS))
del _name

#: The Tensor type, for exact-type checks on hot paths (a Variable is a Tensor with a flag).
TENSOR_TYPES: frozenset[type] = frozenset({Tensor})


def kind(t: Tensor) -> str:
    """``"Variable"`` or ``"Tensor"``, for messages."""
    return "Variable" if getattr(t, "_var", None) is not None else "Tensor"


# -- the per-op path ---------------------------------------------------------------------------


def wrap(arr: Any) -> Any:
    """A new Tensor holding ``arr``: the buffer is recorded and owned by the current scope.

    ``arr`` is a new buffer (the usual op result: a fresh record, owned by the innermost scope)
    or an array object tidyjax already records (an alias: the record gains a holder). A tracer is
    never counted: a tracer of a tidyjax transformation's own trace comes back as an untracked
    Tensor shell, any other as it is (see ``_context.TRACING``).
    """
    if type(arr) is ArrayImpl or type(arr) is PRNGKeyArray:
        t = _new(Tensor)
        t._array = arr
        t._id = next(tensor_ids)
        rec = _buffers.get(id(arr))
        if rec is not None:
            if type(rec) is _Batch:  # an array a batch holds: its leaf gets a record of its own
                rec = _registry.lookup(arr)
            elif (first := rec()) is not arr:  # a stale entry (usual in a loop), or an alias
                rec = None if first is None and not rec.more else _registry.lookup(arr)
        scope = CURRENT.get()
        if rec is None or rec.dead is not None:
            if _registry.observers:
                rec = _registry.new(arr, scope, tensor=t._id)
            else:  # `_registry.new` without the observers
                rec = _fresh(arr, scope)
                _buffers[key := id(arr)] = rec
                _made(key)
                if len(_buffers) > _registry.sweep_at:
                    _registry.sweep()
            t._r = rec
            if scope is not None:
                owned = scope._owned
                owned.append(rec)
                if len(owned) > scope._compact_at:
                    scope._compact()
        else:
            t._r = rec
            _join(t, rec, scope)
        return t
    if isinstance(arr, Tracer):
        tracing = TRACING.get()
        # JAX without the bind-time conversion refuses a shell in a nested transformation's
        # primitives anyway: there every tracer is shelled while a tidyjax transformation runs,
        # so nested tree maps keep their Tensor nodes (the behaviour before JAX 0.10.2).
        if not tracing or (BIND_CONVERSION and trace_of(arr) not in tracing):
            return arr
    return shell(arr)


def shell(value: Any) -> Tensor:
    """An untracked Tensor around a value tidyjax never counts: a tracer, or a placeholder
    (``None``) where a pytree's structure must keep a Tensor node. A Tensor never holds a
    Tensor: given one, it is returned as it is."""
    if type(value) in TENSOR_TYPES:
        return value
    t = _new(Tensor)
    t._array = value
    t._id = next(tensor_ids)
    t._r = _UNTRACKED
    return t


def _join(t: Tensor, rec: _registry.Buffer, scope: Any) -> None:
    """``t`` is one more holder of an existing record (clone, same-dtype astype, x[...])."""
    _registry.join(rec)
    if _holders:
        note_holder(rec, t)
    if scope is not None:
        # This Tensor object was made here: the scope disposes the object at exit unless it is
        # returned or kept (TensorFlow.js), and leaves the buffer to its owner.
        scope.note_alias(t)
    if _registry.observers:
        _registry.notify("tensor_added", rec, t._id)


def wrap_foreign(arr: Any, raw: list[Any] | None = None) -> Any:
    """``wrap`` for an array made outside tidyjax's own operations (a pytree rebuilt by JAX,
    ``tensors()``, a lifted function's result): a new record may share an allocation with a
    buffer another record holds (any shard, any shape or dtype), so it is checked before the
    next deletion (``_registry.resolve``). ``raw``: the caller's own arrays that went into the
    call, which it may share an allocation with too (then the buffer stays the caller's)."""
    t = wrap(arr)
    if type(t) is Tensor:
        rec = t._r
        fresh = rec is not None and rec is not _UNTRACKED and rec.n == 1 and rec.more is None
        if fresh:
            _registry.suspect(rec, [r for r in raw or () if type(r) in CONCRETE])
            _watch_holders(rec, t)
    return t


def wrap_all(arrays: list[Any]) -> list[Any]:
    """``wrap`` for every leaf of a jitted call's outputs, the per-call work done once. In a
    scope, the new buffers form one `Batch`: one record and one entry in the scope's list;
    outside every scope each gets a record of its own, owned by no scope."""
    scope = CURRENT.get()
    if _registry.observers:
        return [wrap(a) for a in arrays]
    buffers = _buffers
    get = buffers.get
    ids = tensor_ids
    Buffer = _registry.Buffer  # noqa: N806
    b = _Batch(scope) if scope is not None else None
    held = b.arrays if b is not None else []
    out: list[Any] = []
    for arr in arrays:
        ta = type(arr)
        if ta is not ArrayImpl and ta is not PRNGKeyArray:
            out.append(wrap(arr) if isinstance(arr, Tracer) else arr)
            continue
        key = id(arr)
        rec = get(key)
        if rec is not None and (type(rec) is _Batch or rec() is not None):  # recorded already
            out.append(wrap(arr))
            continue
        t = _new(Tensor)
        t._array = arr
        t._id = next(ids)
        if b is not None:
            t._r = b
            t._i = len(held)
            held.append(arr)
            b.live += 1  # counted as it goes: a second object over a leaf splits it meanwhile
            buffers[key] = b
        else:
            # `_registry.fresh`, inlined: a call per leaf was a sixth of this loop
            rec = Buffer(arr)
            rec.dead = rec.more = None
            rec.n = 1
            rec.nbytes = -1
            rec.owned = True
            rec.scope = None
            buffers[key] = t._r = rec
            _made(key)
        out.append(t)
    if scope is not None and b is not None and held:  # the scope's batch
        _made_all(map(id, held))  # each leaf's: any one may be split out or let go first
        scope.take_batch(b, len(held))
    if len(buffers) > _registry.sweep_at:
        _registry.sweep()
    return out


def wrap_borrowed(arr: Any) -> Any:
    """A Tensor on a caller's own raw array: one handed to ``tensors()``, or one that came back
    out of a lifted call.

    If tidyjax records the array (it escaped from a Tensor), this is an ordinary alias. If not,
    the array stays the caller's: counted, never deleted (a scope disposes only the Tensor, and
    the buffer goes when its last reference does; ``adopt`` hands one over). Such an array may
    share an allocation with a recorded buffer (a raw ``device_put``, a shard view), so it is
    checked before the next deletion (``_registry.resolve``).
    """
    if type(arr) not in CONCRETE:
        return wrap(arr)
    rec = _registry.lookup(arr)
    if rec is not None and rec.dead is None:
        return wrap(arr)
    t = _wrap_unowned(arr)
    _registry.suspect(t._r)
    _watch_holders(t._r, t)
    return t


def _wrap_unowned(arr: Any) -> Tensor:
    """A Tensor on an array tidyjax must never delete; a scope disposes only the object."""
    t = _new(Tensor)
    t._array = arr
    t._id = next(tensor_ids)
    t._r = _registry.new(arr, None, owned=False, tensor=t._id)
    scope = CURRENT.get()
    if scope is not None:
        scope.note_alias(t)
    return t


def wrap_transfer(out: Any, inputs: tuple[Any, ...]) -> Tensor:
    """Wrap the result of a transfer (``device_put``) of one of ``inputs``.

    JAX hands back a new array object over the *same* buffer when the target is where the
    buffer already is; deleting either object deletes both, so the result joins the input's
    record. Same sharding, shape and dtype is exactly that case: no buffer is inspected. Another
    sharding over some of the same devices may share some shards (one device to replicated, a
    one-device `NamedSharding`, eight-way to four-way): the result is checked by allocation.
    """
    if type(out) in CONCRETE and _registry.lookup(out) is None:
        for arr in inputs:
            if (
                out is not arr
                and type(arr) in CONCRETE
                and out.shape == arr.shape
                and out.dtype == arr.dtype
                and out.sharding == arr.sharding
            ):
                rec = _registry.lookup(arr)
                if rec is None:  # the caller's own array, moved to where it already is
                    return _wrap_unowned(out)
                if rec.dead is None:
                    _registry.add_alias(rec, out)
                break
        else:
            if any(
                type(arr) in CONCRETE and not out.sharding.device_set.isdisjoint(arr.devices())
                for arr in inputs
            ):  # another sharding over shared devices: it may share some shards (`resolve`)
                return wrap_foreign(out, [a for a in inputs if _registry.lookup(a) is None])
    return wrap(out)


# -- disposal ----------------------------------------------------------------------------------


def dispose_tensor(t: Tensor, why: Reason) -> bool:
    """Mark ``t`` disposed; delete its buffer if no other live Tensor holds it.

    Returns whether a buffer was deleted.
    """
    return bool(dispose_many((t,), why))


def dispose_many(tensors: Iterable[Tensor], why: Reason) -> list[Any]:
    """Mark each Tensor disposed, under one lock; delete each buffer whose last live holder it
    was (and that tidyjax owns). Returns the deleted arrays."""
    if _registry.suspects:
        _registry.resolve()  # before any record is dead: a dead record is never grouped
    doomed: list[_registry.Buffer] = []
    survivors: list[Tensor] = []
    released: list[_registry.Buffer] | None = [] if _registry.observers else None
    batched: list[Any] = []  # arrays batches held, deleted after the lock
    pop = _buffers.pop
    with _registry.lock:
        for t in tensors:
            rec = t._r
            if rec is None:
                continue
            if type(rec) is _Batch:
                if rec.dead is None:  # inline: the usual case, a leaf the batch holds
                    i = t._i
                    x = rec.arrays[i]
                    if type(x) is not _registry.Buffer:
                        t._r = None
                        t._why = why
                        rec.arrays[i] = None
                        rec.live -= 1
                        pop(id(x), None)  # its entry is the batch's while the batch holds it
                        batched.append(x)
                        continue
                rec = _dispose_leaf(t, rec)
                if rec is None:
                    continue
            t._r = None
            dead = rec.dead
            t._why = why if dead is None else dead
            if rec is _UNTRACKED:
                continue
            rec.n -= 1
            if dead is None:
                if rec.scope is VARIABLE and getattr(t, "_var", None) is not None:
                    _registry.let_go(rec)
                if released is not None:
                    released.append(rec)
                if rec.n <= 0:
                    rec.dead = RELEASED
                    if not rec.owned:
                        _registry.disposed_alias(rec)
                    doomed.append(rec)
                survivors.append(t)  # its array dropped unless deleted (a released buffer's)
    return _after_dispose(released, doomed, batched, survivors)


def _after_dispose(
    released: list[Any] | None, doomed: list[Any], batched: list[Any], survivors: list[Tensor]
) -> list[Any]:
    """`dispose_many`'s work after the lock: notify the observers, free the ``doomed`` records
    and the arrays batches held, let the ``survivors`` (their buffers live on: another holder's,
    or released, not deleted) drop their arrays. Returns the deleted arrays."""
    if released:
        for rec in released:
            _registry.notify("tensor_removed", rec)
    freed = _registry.free_all(doomed)
    for arr in batched:
        arr.delete()
    for t in survivors:
        forget_array(t)
    return freed + batched if batched else freed


def _dispose_leaf(t: Tensor, b: Any) -> Any:
    """For `dispose_many` (under the lock), ``t`` being on batch ``b`` whose leaf is not held
    (that case is inlined there): the leaf's own record when it was split out (the caller
    disposes ``t`` from it), else None, ``t`` marked disposed with the batch's reason."""
    if b.dead is not None:
        t._r = None
        t._why = b.dead
        return None
    i = t._i
    if b.stale is not None:
        b.stale.discard(i)
    return b.arrays[i]


class _Meta:
    """What a disposed Tensor remembers of an array it no longer references."""

    __slots__ = ("dtype", "shape")

    def __init__(self, arr: Any) -> None:
        self.shape, self.dtype = arr.shape, arr.dtype


def forget_array(t: Tensor) -> None:
    """Drop a disposed Tensor's reference to a buffer that others still hold.

    A deleted array costs nothing to keep; a live one would stay alive through this disposed
    Tensor even after its other holders are gone.
    """
    arr = t._array
    if type(arr) in CONCRETE and not arr.is_deleted():
        t._array = _Meta(arr)


def held_array(t: Tensor) -> Any:
    """The value ``t`` holds now, disposed or not (never raises): its ``jax.Array``; once a
    dispose let go of the array, a placeholder with its shape and dtype; a tracer or ``None``
    in a shell. For reports and checks that must not raise on a disposed Tensor."""
    return t._array


# The Tensors over each suspect record (`_registry.suspect`: it may be dropped from a group
# whose buffer lives on), weakly, by the record's id: its creator's and each one joined since
# (`_join`, a Variable). Dropped, its Tensors let go of its arrays without a heap scan.
_holders: dict[int, tuple[_registry.Buffer, list[Any]]] = {}
_holders_at = 1024  # more entries, and those whose arrays are all gone are forgotten


def _watch_holders(rec: _registry.Buffer, t: Tensor) -> None:
    """Follow the Tensors over ``rec``, a suspect, from ``t``, its first."""
    global _holders_at
    if len(_holders) > _holders_at:
        for key, (r, _) in list(_holders.items()):
            if r.array() is None:
                del _holders[key]
        _holders_at = max(1024, 2 * len(_holders))
    _holders[id(rec)] = (rec, [weakref.ref(t)])


def note_holder(rec: _registry.Buffer, t: Tensor) -> None:
    """``t`` is one more Tensor over ``rec``: followed if ``rec`` is."""
    got = _holders.get(id(rec)) if _holders else None
    if got is not None and got[0] is rec:
        got[1].append(weakref.ref(t))


def _forget_dropped(rec: _registry.Buffer, arrays: list[Any]) -> None:
    """The Tensors on ``rec``, a record dropped because another record over its buffer lives
    on, drop their array objects: a suspect's are followed (`_holders`: every Tensor made over
    it, `wrap_foreign`, `wrap_borrowed`, `_join`, a Variable's); another's are found by one
    referrer pass over the heap (a buffer's first record dropped while an alias lives on)."""
    got = _holders.pop(id(rec), None)
    if got is not None and got[0] is rec:
        for ref in got[1]:
            t = ref()
            if t is not None and t._r is rec:  # disposed with it (one with no record let go)
                forget_array(t)
        return
    import gc

    for obj in gc.get_referrers(*arrays):
        if type(obj) is Tensor and (obj._rec is rec or obj._rec is None):  # disposed
            forget_array(obj)


_registry.on_drop = _forget_dropped


def variable_tensor(arr: Any, hold: Callable[[int], Any], info: Any) -> Tensor:
    """A Tensor over ``arr`` that is a Variable (``info``, its name and trainable flag): its
    record is ``hold(its id)``."""
    v = _new(Tensor)
    v._array = arr
    v._id = next(tensor_ids)
    v._r = hold(v._id)
    v._var = info
    if _holders:
        note_holder(v._r, v)
    return v


def own_record(b: _Batch, t: Tensor) -> Any:
    """Tensor ``t``'s record, ``t`` being on batch ``b`` (`_registry.leaf_record`): ``t``
    points at it from now on."""
    rec = t._r = _registry.leaf_record(b, t._i, t._array)
    return rec


def rebatch(b: _Batch, tensors: list[Tensor]) -> _Batch:
    """Move the leaves of ``tensors`` (distinct Tensors on leaves ``b`` holds) to a new batch
    of the same owner (`_registry.rebatch`), which is returned, and point them at it."""
    out = _registry.rebatch(b, [t._i for t in tensors])
    for j, t in enumerate(tensors):
        t._i = j
        t._r = out
    return out


def mark_kept(t: Tensor) -> None:
    """``tidyjax.keep(t)``: no scope disposes this object."""
    t._kept = True


def dispose_object(t: Tensor, why: Reason) -> None:
    """Mark ``t`` disposed with ``why`` (TensorFlow.js's object disposal: its record is left to
    its other holders, the caller unholds it) and drop its array."""
    t._r = None
    t._why = why
    forget_array(t)


def record(t: Tensor) -> Any:
    """``t``'s record in the registry (a `_registry.Buffer`; a leaf a batch holds gets its own
    first), or None once disposed: how other modules read it."""
    return t._rec


def reason(t: Tensor) -> Reason | str:
    """Why ``t`` is disposed."""
    rec = t._rec
    if rec is not None and rec.dead is not None:
        return rec.dead
    return getattr(t, "_why", "it was disposed")


def disposed_error(t: Tensor) -> DisposedError:
    """The error for using ``t`` after it was disposed: what, why, and how to avoid it."""
    why = reason(t)
    hint = why.hint if isinstance(why, Reason) else DISPOSED.hint
    return DisposedError(f"{kind(t)} {describe(t._array)} (id {t._id}) is disposed: {why}. {hint}")


def refused_by_jax(t: Tensor) -> Any:
    """The error for a Tensor given to a JAX function that takes only jax.Arrays (``jax.lax.*``
    and ``jax.random.*`` called eagerly): what happened and what to call instead.

    A ValueError, as JAX's own error there is: JAX rewraps a TypeError in a message of its own.
    """
    fn = _jax_caller()
    form = f"tidyjax{fn[3:]}" if fn.startswith(("jax.lax.", "jax.random.")) else "tidyjax.lift(fn)"
    raise TidyjaxValueError(
        f"{fn} got a tidyjax {kind(t)} {describe(t._array)}, but it takes jax.Arrays only. "
        f"Call {form} instead (a tracked Tensor comes back), or pass t.array."
    )


def _jax_caller() -> str:
    """The JAX function the user called, from the stack (e.g. ``jax.lax.exp``)."""
    frame: Any = sys._getframe(2)
    name = "a JAX function"
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if module.startswith("jax."):
            parts = module.split(".")
            package = parts[2] if parts[1] == "_src" and len(parts) > 2 else parts[1]
            name = f"jax.{package}.{frame.f_code.co_name}"
        elif name != "a JAX function":
            break
        frame = frame.f_back
    return name


def scope_path(t: Tensor) -> str | None:
    """The path of the scope that owns ``t``'s buffer, or None (kept, variable, no scope)."""
    rec = t._rec
    return getattr(rec.scope, "path", None) if rec is not None else None


def variable_info(t: Tensor, what: str) -> Any:
    """``t``'s variable flag (``_variable._VarInfo``), or a clear error for a plain Tensor."""
    var = getattr(t, "_var", None)
    if var is None and what == "assign":
        raise TidyjaxTypeError(
            f"Tensor {describe(t._array)} (id {t._id}) is not a Variable; Tensors are immutable, "
            "like jax.Array. Make a Variable with tidyjax.Variable(t) to assign to it, or use "
            "the new value directly."
        )
    if var is None:
        raise TidyjaxTypeError(
            f"Tensor {describe(t._array)} (id {t._id}) is not a Variable, so it has no {what} "
            f"to set; make one with tidyjax.Variable(t, {what}=...)."
        )
    return var


def _failed_note(arr: Any) -> str:
    """``float32[7000000000] · allocation failed (26.1 GiB)``: a repr that reads no value."""
    return f"{describe(arr)} · allocation failed ({_format.fmt_bytes(int(arr.nbytes))})"


@_html.never_raises
def _tensor_html(t: Tensor) -> str:
    name = kind(t)
    label = getattr(t, "name", None)
    title = f"<b>{name}</b>" + (f" {_format.esc(repr(label))}" if label else "")
    if t.is_disposed:
        return _html.box(title, f" {_format.esc(describe(t._array))} · ", _html.bad("disposed"),
                         _html.dim(f": {reason(t)}"))  # fmt: skip
    arr = t._array
    if type(arr) not in CONCRETE:
        return _html.box(title, " ", _html.dim(f"wrapping {type(arr).__name__}: {arr!r}"))
    rec = t._rec
    path = scope_path(t)
    owner = rec.scope if rec is not None else None
    where = f" · scope {path!r}" if path else " · kept" if owner is _registry.KEPT else ""
    if failed(arr, wait=True):  # its values are never read: that would abort the process
        return _html.box(title, f" {_format.esc(describe(arr))} · ",
                         _html.bad(f"allocation failed ({_format.fmt_bytes(int(arr.nbytes))})"),
                         _html.dim(f": holds no memory · id {t._id}{where}"))  # fmt: skip
    info = (
        f"{describe(arr)} · {_format.fmt_bytes(int(arr.nbytes))} · {_placement(arr)} · "
        f"id {t._id}{where}"
    )
    devices = ", ".join(sorted(str(d) for d in arr.devices()))
    line = f'<span class="d" title="{_format.esc(devices)}">{_format.esc(info)}</span>'
    if jax.dtypes.issubdtype(arr.dtype, jax.dtypes.prng_key):  # its values are the key data
        values = _html.line(_html.dim("key data")) + _html.values_preview(jax.random.key_data(arr))
    else:
        values = _html.values_preview(arr)
    return _html.box(title, " ", line, values)


def _placement(arr: Any) -> str:
    """Where the buffer lives: one device, or how it is split over a mesh and the bytes that
    each device holds (``sharded P('x') over mesh x=8 · 32 B per device on 8 devices``)."""
    from ._arrays import shard_bytes

    devices = arr.devices()
    if len(devices) == 1:
        return str(next(iter(devices)))
    sharding = arr.sharding
    spec = getattr(sharding, "spec", None)
    if sharding.is_fully_replicated:
        how = "replicated"
    elif spec is not None:
        how = "sharded P(" + ", ".join(repr(p) for p in spec) + ")"
    else:
        how = f"sharded ({type(sharding).__name__})"
    shape = getattr(getattr(sharding, "mesh", None), "shape", None)
    if shape:
        how += " over mesh " + " × ".join(f"{axis}={n}" for axis, n in shape.items())  # noqa: RUF001
    sizes = sorted(set(shard_bytes(arr).values()))
    each = _format.fmt_bytes(sizes[0])
    if len(sizes) > 1:
        each += f" to {_format.fmt_bytes(sizes[-1])}"
    return f"{how} · {each} per device on {_format.count(len(devices), 'device')}"


# -- construction ------------------------------------------------------------------------------


def copy_in(data: Any, dtype: Any, device: Any) -> Any:
    """A new jax.Array holding a copy of ``data``, or a tidyjax error that says what was wrong."""
    if isinstance(data, Tensor):
        data = data._value()
    if data is None or isinstance(data, (str, bytes)) or callable(data):
        raise TidyjaxTypeError(
            f"tensor() takes array-like data (a number, nested lists, a NumPy or jax array, a "
            f"Tensor), got {type(data).__name__} {_format.clip(data)}."
        )
    try:
        arr = jnp.array(data, dtype=dtype, copy=True)
    except TypeError as e:
        raise TidyjaxTypeError(
            f"tensor() cannot make an array from {type(data).__name__}: {e}"
        ) from e
    except ValueError as e:
        where = _none_in(data)
        if where is not None:
            raise TidyjaxTypeError(
                f"tensor() got None at {where} ({_format.clip(data)}): None is not a number. Use "
                "float('nan') for a missing value, or keep a boolean mask beside the data."
            ) from e
        if isinstance(data, (list, tuple)):
            raise TidyjaxValueError(
                f"tensor() got a ragged nested sequence ({_format.clip(data)}): every row must "
                "have the same length. Pad the rows, or make one Tensor per row."
            ) from e
        raise TidyjaxValueError(
            f"tensor() cannot make an array from {_format.clip(data)}: {e}"
        ) from e
    except RuntimeError as e:  # out of memory: name the holders; else untouched
        on_jax_error(e, "tensor", (data,))
        raise
    if device is not None:
        if isinstance(device, (str, bytes, int)):
            raise _device_error(device, None)
        try:
            arr = jax.device_put(arr, device)
        except ValueError as e:
            raise _device_error(device, e) from e
        except RuntimeError as e:
            on_jax_error(e, "tensor", (data,))
            raise
    return arr


def _none_in(data: Any) -> str | None:
    """Where the first ``None`` is in nested lists and tuples (``data[1][0]``), or None.

    Only on the error path: it walks the whole sequence.
    """
    stack: list[tuple[Any, str]] = [(data, "data")]
    while stack:
        item, path = stack.pop()
        if item is None:
            return path
        if isinstance(item, (list, tuple)):
            stack.extend((x, f"{path}[{i}]") for i, x in reversed(list(enumerate(item))))
    return None


def _device_error(device: Any, error: ValueError | None) -> Exception:
    """The error for a ``device=`` that JAX cannot place on, naming the forms it takes."""
    example = "jax.devices('cpu')[0]"
    if isinstance(device, str):  # "cpu", "gpu:1": name the expression that gives that device
        platform, _, index = device.partition(":")
        example = f"jax.devices({platform!r})[{index if index.isdigit() else 0}]"
    text = (
        f"tensor() takes device= as a jax.Device or a jax.sharding.Sharding, e.g. {example}; "
        f"got {type(device).__name__} {_format.clip(device)}."
    )
    if error is None:
        return TidyjaxTypeError(text)
    if isinstance(device, (jax.Device, jax.sharding.Sharding)):  # the right kind, refused
        return TidyjaxValueError(
            f"tensor() cannot place the data on {_format.clip(device, 80)}: {error}"
        )
    return TidyjaxTypeError(f"{text} JAX said: {error}")


def tensor(data: Any, dtype: Any = None, *, device: Any = None) -> Tensor:
    """A new tracked Tensor holding a copy of ``data``.

    Always copies into a buffer the Tensor owns, so disposing it never deletes a caller's own
    ``jax.Array``. To take over an existing ``jax.Array`` without a copy, use
    [`adopt`][tidyjax.adopt].

    Args:
        data: a number, nested sequences, a NumPy or jax array, or a Tensor.
        dtype: the dtype, as for ``jnp.array``.
        device: a ``jax.Device`` or ``jax.sharding.Sharding`` to place the copy on
            (``jax.devices('cpu')[0]``; a device name such as ``"cpu"`` is not accepted).

    Raises:
        TidyjaxTypeError: ``data`` is not array-like or holds ``None`` (use ``float('nan')``
            or a mask), or ``device`` is not a device or sharding.
        TidyjaxValueError: ``data`` is a ragged nested sequence, or JAX cannot place it on
            ``device``.
        DisposedError: ``data`` is a disposed Tensor.
    """
    arr = copy_in(data, dtype, device)
    return wrap(arr) if type(arr) in CONCRETE else shell(arr)  # a traced copy: an untracked shell


def adopt(array: jax.Array) -> Tensor:
    """A Tensor that takes ownership of ``array`` without copying.

    Disposing the Tensor (or leaving the scope it was adopted in) deletes ``array`` itself.

    Raises:
        TidyjaxTypeError: ``array`` is not a concrete ``jax.Array``.
        TidyjaxValueError: ``array`` was already deleted, or its computation failed.
        OutOfMemoryError: ``array``'s allocation failed (JAX says so when an array is waited
            for; an array still being computed is not waited for, unless it was moved to a
            device, which ``adopt`` compares with the buffers it records).
    """
    if isinstance(array, Tensor):
        raise TidyjaxTypeError(
            "adopt() takes a jax.Array, got a Tensor; use t.clone() to share its buffer."
        )
    if type(array) not in CONCRETE:
        raise TidyjaxTypeError(
            f"adopt() takes a concrete jax.Array, got {type(array).__name__}; use "
            "tidyjax.tensor(data) to copy other data into a new Tensor."
        )
    if array.is_deleted():
        raise TidyjaxValueError(
            f"adopt() got a deleted jax.Array ({describe(array)}); nothing to own."
        )
    if failed(array):
        _adopt_failed(array)
    if _registry.lookup(array) is None:
        # A new object over a recorded buffer (a transfer, a shard view, key_data) is found by
        # its allocations, whatever its commitment, shape or dtype.
        try:
            base_array(array).block_until_ready()  # a failed allocation raises JAX's error here
        except jax.errors.JaxRuntimeError:
            _adopt_failed(array)
        # another object over a buffer tidyjax records: it joins that record
        _registry.aliases_of([array])
    return wrap(array)


def _adopt_failed(array: Any) -> NoReturn:
    """Raise for an array whose computation failed: it holds no buffer to own."""
    try:
        base_array(array).block_until_ready()
    except jax.errors.JaxRuntimeError as e:
        what = f"the computation of the {describe(array)} array given to adopt()"
        on_jax_error(e, what)
        raise TidyjaxValueError(
            f"adopt() got a jax.Array ({describe(array)}) whose computation failed, so it holds "
            f"no buffer to own. JAX said: {str(e).strip()}"
        ) from e
    raise TidyjaxValueError(
        f"adopt() got a jax.Array ({describe(array)}) whose computation failed."
    )
