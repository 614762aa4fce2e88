"""JAX interop on top of ``lift``: pytree registration, lifted namespaces, transformations.

* ``Tensor`` is a pytree node with one child, its array (a Variable is a Tensor with a flag:
  the same node). JAX flattens it to its array, so ``jax.jit``, ``grad``, ``vmap``,
  ``tree_map`` and optax accept Tensors; ``_unflatten`` decides what a rebuilt node is (a tracked
  Tensor for a concrete array, JAX's own tracer inside a raw transformation, plain data as
  itself, a shell keeping the node for anything else).
* A Tensor given to a JAX function that takes only arrays (``jax.lax.*`` eagerly) raises an
  error naming the ``tidyjax`` form.
* ``tidyjax.numpy``/``lax``/``nn``/``random`` are generated from the JAX modules on first use of
  each name: every callable is lifted, every other attribute (dtypes, constants) passes through.
* ``jit``/``grad``/``value_and_grad``/``vmap`` wrap the JAX transformation so it takes Tensors and
  returns tracked Tensors; ``jit`` also marks donated Tensors disposed.
"""

from __future__ import annotations

import contextvars
import functools
import importlib
import inspect
import sys
import types
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ParamSpec, Protocol, TypeVar, overload

import jax
import jax.numpy as jnp
import numpy as np

from . import _context, _registry
from ._arrays import CONCRETE, Tracer
from ._context import BUDGETS, TRACING, on_jax_error
from ._decorating import check_callable
from ._errors import donated
from ._jaxdoors import (
    BIND_CONVERSION,
    refuse_in_type_tables,
    register_bind_conversion,
    trace_of,
    trace_running,
)
from ._ops import lift_named
from ._tensor import (
    REBUILD,
    TENSOR_TYPES,
    Tensor,
    held_array,
    record,
    refused_by_jax,
    shell,
    wrap,
    wrap_foreign,
)
from ._trees import is_tensor, tensors_in, unwrap, wrap_arrays

_leaves = jax.tree_util.tree_leaves
_ShapedArray = jax.core.ShapedArray

__all__ = [
    "grad", "jit", "lifted_namespace", "observe_call", "set_call_observer", "value_and_grad",
    "vmap",
]  # fmt: skip

P = ParamSpec("P")
R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)

if TYPE_CHECKING:

    class Jitted(Protocol[P, R_co]):
        """What `jit` returns: ``fn``'s signature, and ``lower`` as on ``jax.jit``."""

        __name__: str
        __qualname__: str

        def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R_co: ...
        def lower(self, *args: Any, **kwargs: Any) -> Any: ...


# -- pytrees ---------------------------------------------------------------------------------


def _unflatten(child: Any) -> Any:
    """A rebuilt Tensor node: what JAX put in place of the array decides what comes back.

    * a concrete array: a Tensor tracked by the current scope (a buffer a live Tensor holds is
      shared, ref-counted);
    * a tracer: an untracked Tensor shell around it, so the rebuilt tree has the structure JAX
      compares it with (``jax.jvp`` tangents, ``jacfwd``/``jacrev``, optax's updates); an op on
      the shell gives JAX's own tracer back (``_context.TRACING``), so what a function JAX
      transforms returns is plain. On JAX without the bind hook (``BIND_CONVERSION``)
      a library's ``lax`` call could not take a shell: there the tracer comes back as itself
      (a shell only for a tidyjax transformation's own trace);
    * data a tree map computed (a number, a shape tuple, a string, a NumPy array from
      ``jax.device_get``, a ``ShapeDtypeStruct``, an aval): the value itself, as for a plain
      array; inside a JAX trace a shell around it, since there such a tree is a spec a library
      compares structure with (axes, masks);
    * a Tensor (a saved structure rebuilt over Tensors: ``get_params`` of
      ``jax.example_libraries.optimizers`` unflattens the parameter structure it recorded, with
      its Tensor nodes, over the Tensors of a state): that Tensor itself. A Tensor never holds
      a Tensor;
    * anything else (``None`` from ``eqx.partition``, booleans of a mask or filter, a library's
      per-leaf objects): an untracked Tensor shell around it, so the tree keeps its structure
      and maps, merges and zips with the tree it came from.
    """
    if type(child) in CONCRETE:
        return wrap_foreign(child)
    if isinstance(child, Tracer):
        return shell(child) if BIND_CONVERSION else wrap(child)
    if isinstance(child, Tensor):  # a saved treedef rebuilt over Tensors: never nest one
        return child
    if type(child) is _ShapedArray:  # JAX compares a carry's types (scan, while_loop)
        return child
    if type(child) in _DATA:
        # Inside a JAX trace the tree is a spec a library compares with values it traced
        # (``eqx.filter_vmap``'s axes): the node stays. Outside, data is data.
        return shell(child) if trace_running() else child
    return shell(child)


#: Values a tree map hands back in place of a Tensor as themselves (exact types: ``bool`` and
#: named tuples are masks and library objects, which keep their Tensor node).
_DATA: frozenset[type] = frozenset(
    {int, float, complex, str, bytes, tuple, np.ndarray, jax.ShapeDtypeStruct, np.dtype}
    | {type(np.dtype("float32")), np.float32, np.float64, np.int32, np.int64}
)


# One node type for Tensors and Variables (a Variable is a Tensor with a flag), so a tree of
# Variables and the gradient tree computed for it map together. Rebuilding gives plain Tensors:
# a new variable is never made behind the user's back. A dataclass node: JAX flattens it in C++
# (reading ``Tensor.array``, which raises DisposedError) and rebuilds it as
# ``Tensor(array=child)``, which is ``_unflatten(child)``.
REBUILD.append(_unflatten)
jax.tree_util.register_dataclass(Tensor, data_fields=["array"], meta_fields=[])


def _as_jax_value(t: Tensor) -> Any:
    """What a JAX primitive is given for a Tensor: its array, or its tracer."""
    return t.array


# Where JAX lets a type convert itself at every primitive bind (JAX 0.10.2+), a Tensor is
# accepted by every JAX function as its array or tracer: ``jax.lax.exp(t)`` and a library's
# internal ``lax.select`` on a traced Tensor work and give JAX's own value, and a shell's tracer
# keeps its derivative. Older JAX has no such hook; there JAX looks a Tensor's type up in its type
# tables and ``refused_by_jax`` raises an error naming the ``tidyjax`` form. Both are doors into
# private JAX (``_jaxdoors``).
register_bind_conversion(Tensor, _as_jax_value)  # where JAX has the hook: BIND_CONVERSION
refuse_in_type_tables(Tensor, refused_by_jax)


# -- namespaces ------------------------------------------------------------------------------


class _LiftedUfunc:
    """A lifted ``jnp.ufunc``: callable, and its ``reduce``/``outer``/… are lifted too."""

    def __init__(self, ufunc: Any) -> None:
        self._ufunc = ufunc
        self.__name__ = getattr(ufunc, "__name__", "ufunc")
        self._call = lift_named(ufunc, self.__name__)
        self.__doc__ = getattr(ufunc, "__doc__", None)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._call(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._ufunc, name)
        return lift_named(attr, getattr(attr, "__name__", name)) if callable(attr) else attr

    def __repr__(self) -> str:
        return f"<lifted {self._ufunc!r}>"


def _lift_attr(obj: Any) -> Any:
    if isinstance(obj, (type, types.ModuleType)) or not callable(obj):
        return obj  # dtypes (jnp.float32), classes, constants, modules pass through
    if isinstance(obj, jnp.ufunc):
        return _LiftedUfunc(obj)
    return lift_named(obj, getattr(obj, "__name__", type(obj).__name__))  # JAX's own: trusted


def lifted_namespace(
    source: types.ModuleType, module_name: str, submodules: Sequence[str] = ()
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for a module mirroring ``source`` with lifted callables.

    Each name is looked up in ``source`` on first use, lifted, and cached in the module.
    """

    def __getattr__(name: str) -> Any:  # noqa: N807 - a module's __getattr__ (PEP 562)
        if name in submodules:
            return importlib.import_module(f"{module_name}.{name}")
        if name.startswith("__"):
            raise AttributeError(name)
        try:
            obj = getattr(source, name)
        except AttributeError:
            raise AttributeError(
                f"module {module_name!r} has no attribute {name!r}: "
                f"{source.__name__} has none either"
            ) from None
        value = _lift_attr(obj)
        setattr(sys.modules[module_name], name, value)
        return value

    def __dir__() -> list[str]:  # noqa: N807 - a module's __dir__ (PEP 562)
        return sorted({n for n in dir(source) if not n.startswith("_")} | set(submodules))

    return __getattr__, __dir__


# -- transformations -------------------------------------------------------------------------


# The arguments of the tidyjax transformation calls now running, as the caller passed them. A
# tidyjax transformation hands JAX plain arrays (JAX flattens those in C++; a Tensor costs a Python
# callback per leaf), and the traced function puts Tensors back where the caller had them.
_CALLER_ARGS: contextvars.ContextVar[tuple[Any, Any] | None] = contextvars.ContextVar(
    "tidyjax_transform_args", default=None
)


#: Node types whose Tensors a tidyjax transformation hands the traced function as JAX's own
#: values, as ``jax.jit`` would: a library state whose code compares the structure of what it
#: computes with a structure it recorded (``jax.example_libraries.optimizers``'s
#: ``OptimizerState``, registered by ``_interop``), which an op on a shell (giving a shell)
#: would not match. Its outputs still come back as tracked Tensors.
RAW_WHEN_TRACED: set[type] = set()


def _put_back(caller: Any, traced: Any) -> Any:
    if isinstance(caller, Tensor) and not isinstance(traced, Tensor):  # never nest a Tensor
        return caller if traced is caller._array else shell(traced)
    return traced  # not a Tensor, or a state of RAW_WHEN_TRACED: JAX's values


def _stop_at_raw_when_traced(x: Any) -> bool:
    return type(x) in TENSOR_TYPES or type(x) in RAW_WHEN_TRACED


def _traced(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` as a tidyjax transformation traces it: Tensors (wrapping tracers) where the caller
    passed Tensors, results chaining as Tensors, and plain jax values out (JAX needs arrays)."""

    @functools.wraps(fn)
    def inner(*args: Any, **kwargs: Any) -> Any:
        caller = _CALLER_ARGS.get()
        if caller is not None:
            args, kwargs = jax.tree_util.tree_map(
                _put_back,
                caller,
                (args, kwargs),
                is_leaf=_stop_at_raw_when_traced if RAW_WHEN_TRACED else is_tensor,
            )
        trace = next((trace_of(x) for x in _leaves((args, kwargs)) if isinstance(x, Tracer)), None)
        token = TRACING.set((*TRACING.get(), trace))
        try:
            return unwrap(fn(*args, **kwargs))
        finally:
            TRACING.reset(token)

    return inner


def _call(transformed: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Call a JAX transformation of ``_traced(fn)`` on plain arrays; ``fn`` gets Tensors back."""
    token = _CALLER_ARGS.set((args, kwargs))
    try:
        return transformed(*unwrap(args), **unwrap(kwargs))
    except RuntimeError as e:  # out of memory: name the holders; else untouched
        call = (transformed, args, kwargs) if hasattr(transformed, "lower") else None
        on_jax_error(e, _user_name(transformed), args, call=call)
        raise
    except (TypeError, ValueError) as e:
        add_structure_hint(e)
        raise
    finally:
        _CALLER_ARGS.reset(token)


def _user_name(transformed: Any) -> str:
    """The ``__qualname__`` of the user's function under JAX's wrappers (``Model.step``), as
    the error path names it; JAX's wrappers and ``_traced`` set ``__wrapped__``."""
    name = getattr(inspect.unwrap(transformed), "__qualname__", None)
    return name if isinstance(name, str) else getattr(transformed, "__name__", "function")


def add_structure_hint(e: BaseException) -> None:
    """Add `STRUCTURE_HINT` to ``e`` once if it is a tree-structure error about a Tensor node.

    JAX names a Tensor by its class (``<class 'tidyjax.Tensor'>``) or, printing a tree
    structure, as a custom node (``CustomNode(Tensor[None], [*])``, as in
    ``jax.example_libraries.optimizers``'s error). A no-op before Python 3.11 (no notes).
    """
    add_note = getattr(e, "add_note", None)  # Python 3.11+
    if add_note is None or STRUCTURE_HINT in getattr(e, "__notes__", ()):
        return
    message = str(e)
    if "structure" in message and ("tidyjax.Tensor" in message or "CustomNode(Tensor[" in message):
        add_note(STRUCTURE_HINT)


#: Added to JAX's tree-structure error when a Tensor node meets a raw value (a tree map over
#: Tensors and raw arrays, ``optax.apply_updates(params, raw_updates)``, a ``lax.cond`` branch
#: returning its Tensor operand unchanged).
STRUCTURE_HINT = (
    "tidyjax: a Tensor is a pytree node, so a tree of Tensors does not zip with the same tree "
    "of raw jax values. Make both sides Tensors (tidyjax.tensors(raw)) or both arrays "
    "(tidyjax.arrays(tree)), or call the tidyjax form (tidyjax.lax.cond, tidyjax.lift(fn)), "
    "which takes either. A jax.vjp cotangent takes the kind of the function's output (an "
    "operation on a Tensor gives a raw value inside a raw JAX transformation)."
)


def _check(fn: Any, what: str) -> None:
    check_callable(fn, f"tidyjax.{what}()")


@overload
def jit(fn: Callable[P, R], /, **jit_kwargs: Any) -> Jitted[P, R]: ...
@overload
def jit(fn: None = None, /, **jit_kwargs: Any) -> Callable[[Callable[P, R]], Jitted[P, R]]: ...


def jit(fn: Callable[..., Any] | None = None, /, **jit_kwargs: Any) -> Any:
    """``jax.jit`` that takes Tensors and returns tracked Tensors.

    Inside, ``fn`` sees what it was passed, with tracers in place of arrays (a Tensor argument is a
    Tensor wrapping a tracer; use ``t.array`` for ``jax.lax``). Its outputs come back as Tensors in
    the caller's scope. Donated arguments (``donate_argnums``/``donate_argnames``) whose buffers
    XLA consumed are marked disposed — and so is every other Tensor sharing those buffers; using
    one raises ``DisposedError`` naming the function. A donation XLA could not use leaves the
    argument alive (JAX warns).

    Inside a [`tidyjax.budget`][tidyjax.budget], each call is planned first and raises
    ``BudgetError``, before it runs, when it would cross the budget.

    Works as ``@tidyjax.jit``, ``@tidyjax.jit(static_argnums=…)`` or ``tidyjax.jit(fn, …)``.
    """
    if fn is None:
        return functools.partial(jit, **jit_kwargs)
    _check(fn, "jit")
    jitted = jax.jit(_traced(fn), **jit_kwargs)
    donate_nums = _as_tuple(jit_kwargs.get("donate_argnums"))
    donate_names = _as_tuple(jit_kwargs.get("donate_argnames"))
    if not (donate_nums or donate_names):

        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            if BUDGETS.get() is not None:  # outside every budget, this look-up is the cost
                _context.check_budget(call, args, kwargs)
            if _registry.observers:  # a profile or timeline hears of the call's XLA figures
                return observe_call(
                    call, args, kwargs, lambda: wrap_arrays(_call(jitted, args, kwargs))
                )
            return wrap_arrays(_call(jitted, args, kwargs))

        call.lower = jitted.lower  # type: ignore[attr-defined]
        return call

    name = getattr(fn, "__qualname__", repr(fn))
    signature = _signature(fn)
    positions = {p: i for i, p in enumerate(signature.parameters)} if signature else {}

    @functools.wraps(fn)
    def call_donating(*args: Any, **kwargs: Any) -> Any:
        if BUDGETS.get() is not None:
            _context.check_budget(call_donating, args, kwargs)
        donated = [args[i] for i in donate_nums if -len(args) <= i < len(args)]
        donated += [kwargs[n] for n in donate_names if n in kwargs]
        for n in donate_names:  # a donated name passed positionally
            i = positions.get(n, len(args))
            if n not in kwargs and i < len(args):
                donated.append(args[i])
        if _registry.suspects:  # an alias of a donated buffer is found while it is readable
            _registry.resolve()
        if _registry.observers:  # as in `call`; figures read before the donation
            return observe_call(
                call_donating,
                args,
                kwargs,
                lambda: _run_donating(jitted, args, kwargs, donated, name),
            )
        out = _call(jitted, args, kwargs)
        _mark_donated(donated, name)
        return wrap_arrays(out)

    call_donating.lower = jitted.lower  # type: ignore[attr-defined]
    return call_donating


def _run_donating(
    jitted: Any, args: tuple[Any, ...], kwargs: dict[str, Any], donated: list[Any], name: str
) -> Any:
    """A donating call's run, as ``call_donating`` makes it, for `observe_call`."""
    out = _call(jitted, args, kwargs)
    _mark_donated(donated, name)
    return wrap_arrays(out)


def _observe_nothing(
    fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any], run: Callable[[], Any]
) -> Any:
    """No report module installed: the call just runs."""
    return run()


#: Runs a ``tidyjax.jit`` call (``run()``, of ``fn`` with ``args``, ``kwargs``) while
#: ``_registry.observers`` is non-empty, and hands its XLA figures to the observers that take
#: them; installed by ``_plan`` (`set_call_observer`), so the core imports no report. With no
#: observer, a call pays one truthiness test of the list.
observe_call: Callable[[Any, tuple[Any, ...], dict[str, Any], Callable[[], Any]], Any] = (
    _observe_nothing
)


def set_call_observer(
    hook: Callable[[Any, tuple[Any, ...], dict[str, Any], Callable[[], Any]], Any],
) -> None:
    """Make ``hook`` what `observe_call` runs (``_plan`` at package import)."""
    global observe_call
    observe_call = hook


def _as_tuple(v: Any) -> tuple[Any, ...]:
    if v is None:
        return ()
    if isinstance(v, (int, str)):
        return (v,)
    return tuple(v)


def _signature(fn: Callable[..., Any]) -> inspect.Signature | None:
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):
        return None


def _mark_donated(args: list[Any], name: str) -> None:
    why = donated(name)
    for t in tensors_in(args):
        rec = t._r
        if rec is None or rec is _registry.UNTRACKED or not held_array(t).is_deleted():
            continue
        rec = record(t)  # a leaf a batch holds gets its own record: it dies alone
        if rec is not None:
            _registry.kill(rec, why)


def grad(fn: Callable[P, Any], /, **grad_kwargs: Any) -> Callable[P, Any]:
    """``jax.grad`` that takes Tensors and returns the gradient as tracked Tensors.

    ``fn`` may return a scalar Tensor or array. With ``has_aux=True`` the aux output comes back as
    Tensors too.
    """
    _check(fn, "grad")
    transformed = jax.grad(_traced(fn), **grad_kwargs)
    return _wrapping(transformed, fn)


def value_and_grad(fn: Callable[P, R], /, **grad_kwargs: Any) -> Callable[P, tuple[R, Any]]:
    """``jax.value_and_grad`` taking Tensors, returning ``(value, grad)`` as tracked Tensors."""
    _check(fn, "value_and_grad")
    transformed = jax.value_and_grad(_traced(fn), **grad_kwargs)
    return _wrapping(transformed, fn)


def vmap(fn: Callable[P, R], /, **vmap_kwargs: Any) -> Callable[P, R]:
    """``jax.vmap`` that takes Tensors and returns tracked Tensors."""
    _check(fn, "vmap")
    transformed = jax.vmap(_traced(fn), **vmap_kwargs)
    return _wrapping(transformed, fn)


def _wrapping(transformed: Callable[..., Any], fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        return wrap_arrays(_call(transformed, args, kwargs))

    return call
