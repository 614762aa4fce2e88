"""Every private JAX entry point tidyjax uses, in one place: the bottom floor (it imports nothing
of tidyjax). Each door is opened once, at import. Checked on JAX 0.6.2 and 0.10.2; each has a
test in tests/test_jaxdoors.py (the last column) that fails loudly when JAX moves it.

==================  =====================  ===================  ==================  ===============
door                what it buys           if JAX moves it      public alternative  test
==================  =====================  ===================  ==================  ===============
``ArrayImpl``       ``type(x) is           import fails         ``type()`` of an    array_impl
(``jax._src.        ArrayImpl``: a                              array; making one
array``)            concrete array, by                          at import starts
                    identity (per-op path)                      the backend
``PRNGKeyArray``    typed keys are         keys fall back to    ``type(jax.random.  prng_key_array
(``jax._src.        concrete arrays        ``ArrayImpl``: not   key(0))`` (same
random.prng``;      tidyjax owns           tracked              problem); per
``jax._src.prng``                                               value: ``jax.
before 0.7)                                                     dtypes.issubdtype
                                                                (d, prng_key)``
``base_array``      a key's words (ready,  the key itself       ``jax.random.       base_array
(``key.             deleted, address,      (``getattr``)        key_data`` (same
_base_array``)      bytes), no dispatch                         object; dispatches,
                                                                raises if deleted)
``JAX_OPERATORS``   ``raw * t`` calls the  empty: ``raw * t``   none                jax_operators
(``jax._src.numpy.  Tensor's reflected     is a raw array
array_methods``)    operator
``JAX_KEY_CHECKS``  a key Tensor given to  empty: JAX's own     none                jax_key_checks
(``_check_prng_     ``jax.random.*``       error, no fix named
key_data``)         names the fix
``buffer_           aliases of one buffer  ``None``: aliases    none (the shard     buffer_
addresses``         grouped, views of      not grouped, views   list is private;    addresses
(``arr._arrays``)   known buffers found    counted untracked    ``addressable_
                                                                shards`` allocates)
``register_bind_    a Tensor converts      the older path:      none                bind_conversion
conversion``        itself at every        errors naming the
(``jax._src.dtypes  primitive bind (JAX    tidyjax form
.register_...``)    0.10.2+)
``refuse_in_type_   a Tensor JAX refuses   JAX's "not a valid   none                type_tables
tables`` (``core.   raises an error        JAX type" error
pytype_aval_        naming the tidyjax
mappings``, ...)    form
``trace_running``   whether a JAX trace    import fails         none (``jax.core.   trace_running
(``jax._src.core.   runs (``_lift.                              trace_state_clean``
trace_ctx``,        _unflatten``)                               is deprecated)
``EvalTrace``)
``trace_of``        a tracer's trace       ``AttributeError``   none                trace_of
(``tracer.          (``_context.TRACING``  on the first tracer
_trace``)           in ``_tensor.wrap``)
``distributed_      the key-value store    ``gather`` over      none (``multihost_  distributed_
client``            of a ``jax.            processes fails      utils`` reads it    client
(``jax._src.        distributed`` job                           so too)
distributed``)
IPython's           a cell's name in       sites show the raw   none                (tests/test_
``compiler.         creation sites         ``<ipython-input>``                      inspect.py)
_filename_map``     (the code stays in
                    ``_census``)
==================  =====================  ===================  ==================  ===============
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable
from typing import Any

from jax._src.array import ArrayImpl

__all__ = [
    "BIND_CONVERSION",
    "JAX_KEY_CHECKS",
    "JAX_OPERATORS",
    "ArrayImpl",
    "PRNGKeyArray",
    "base_array",
    "buffer_addresses",
    "shard_devices",
    "distributed_client",
    "refuse_in_type_tables",
    "register_bind_conversion",
    "trace_of",
    "trace_running",
]

_PRNG_MODULES = ("jax._src.random.prng", "jax._src.prng")  # JAX 0.7+, before


def _key_array_class() -> type:
    """The class of typed PRNG key arrays (``jax.random.key``)."""
    for module in _PRNG_MODULES:
        try:
            cls = importlib.import_module(module).PRNGKeyArray
        except (ImportError, AttributeError):
            continue
        return cls
    return ArrayImpl  # pragma: no cover - a jax layout we do not know


#: The class of typed PRNG key arrays: concrete arrays of their own.
PRNGKeyArray: type = _key_array_class()


def base_array(arr: Any) -> Any:
    """A typed PRNG key's array of words (the same object ``jax.random.key_data`` gives, with
    no dispatch and on deleted keys too); any other value itself."""
    return getattr(arr, "_base_array", arr)


def _jax_operator_codes() -> frozenset[Any]:
    """The code objects of ``jax.Array``'s binary operators (see ``Tensor.__jax_array__``)."""
    try:
        methods = importlib.import_module("jax._src.numpy.array_methods")
    except ImportError:  # pragma: no cover - a jax layout we do not know
        return frozenset()
    codes = {
        fn.__code__
        for name, fn in vars(methods).items()
        if name.startswith("_operator_") and hasattr(fn, "__code__")
    }
    defer = getattr(methods, "_defer_to_unrecognized_arg", None)  # JAX before 0.7
    if defer is not None:
        codes.add(defer("+", lambda a, b: None).__code__)
    return frozenset(codes)


#: The code objects of ``jax.Array``'s binary operators.
JAX_OPERATORS: frozenset[Any] = _jax_operator_codes()


def _jax_key_check_codes() -> frozenset[Any]:
    """The code of JAX's check of raw PRNG key data (it moved in 0.7)."""
    codes = set()
    for module in _PRNG_MODULES:
        try:
            codes.add(importlib.import_module(module)._check_prng_key_data.__code__)
        except (ImportError, AttributeError):
            continue
    return frozenset(codes)


#: The code of JAX's check of raw PRNG key data, which reads ``.ndim`` of what it checks.
JAX_KEY_CHECKS: frozenset[Any] = _jax_key_check_codes()


def buffer_addresses(base: Any) -> tuple[int, ...]:
    """The device addresses of ``base``'s shards (an ``ArrayImpl``, a key's ``base_array``).

    The caller makes sure the buffer is ready and did not fail: reading the address of a failed
    allocation aborts the process. Raises if the array is deleted meanwhile.
    """
    return tuple(s.unsafe_buffer_pointer() for s in base._arrays)


def shard_devices(base: Any) -> list[int]:
    """The device id of each of ``base``'s shards, in the order of `buffer_addresses`."""
    return [next(iter(s.sharding.device_set)).id for s in base._arrays]


_dtypes = importlib.import_module("jax._src.dtypes")
_register_value: Callable[[type, Callable[[Any], Any]], None] | None = getattr(
    _dtypes, "register_canonicalize_value_handler", None
)

#: True where JAX lets a type convert itself at every primitive bind (JAX 0.10.2 and later):
#: there JAX primitives take Tensors (the one flag for it; ``register_bind_conversion``).
BIND_CONVERSION: bool = _register_value is not None


def register_bind_conversion(cls: type, convert: Callable[[Any], Any]) -> None:
    """Have JAX convert ``cls`` with ``convert`` at every primitive bind; nothing where this
    JAX has no such hook (``BIND_CONVERSION`` is False)."""
    if _register_value is not None:
        _register_value(cls, convert)


#: JAX's tables of abstract (and, before the bind hook, canonical) values, by module.
TYPE_TABLES: tuple[tuple[str, str], ...] = (
    ("jax._src.core", "pytype_aval_mappings"),
    ("jax._src.interpreters.xla", "canonicalize_dtype_handlers"),  # JAX before 0.7
) + (() if BIND_CONVERSION else (("jax._src.dtypes", "canonicalize_value_handlers"),))


def refuse_in_type_tables(cls: type, handler: Callable[[Any], Any]) -> None:
    """Put ``handler`` (which raises) for ``cls`` in each of JAX's type tables this JAX has."""
    for module, table in TYPE_TABLES:
        with contextlib.suppress(ImportError, AttributeError):
            getattr(importlib.import_module(module), table)[cls] = handler


_jax_core = importlib.import_module("jax._src.core")
_EvalTrace = _jax_core.EvalTrace


def trace_running() -> bool:
    """Whether a JAX trace (``jit``, ``grad``, ``vmap``, ...) is running in this thread."""
    return type(_jax_core.trace_ctx.trace) is not _EvalTrace


def trace_of(tracer: Any) -> Any:
    """The trace ``tracer`` belongs to."""
    return tracer._trace


def distributed_client() -> Any:
    """JAX's distributed client, or None before ``jax.distributed.initialize``."""
    from jax._src import distributed

    return distributed.global_state.client
