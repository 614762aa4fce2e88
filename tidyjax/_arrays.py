"""The one definition of array kinds: which values are concrete arrays, tracers, or plain leaves.

Every other module asks here, so "is this a jax.Array tidyjax can own?" has one answer.
"""

from __future__ import annotations

import threading
from typing import Any

import jax
import numpy as np
from jax.errors import JaxRuntimeError

from ._format import describe as describe  # re-exported: it lived here
from ._jaxdoors import JAX_KEY_CHECKS as JAX_KEY_CHECKS  # re-exported: they lived here
from ._jaxdoors import JAX_OPERATORS as JAX_OPERATORS
from ._jaxdoors import ArrayImpl as ArrayImpl
from ._jaxdoors import PRNGKeyArray as PRNGKeyArray
from ._jaxdoors import base_array

__all__ = [
    "CONCRETE",
    "JAX_OPERATORS",
    "PLAIN",
    "ArrayImpl",
    "PRNGKeyArray",
    "Tracer",
    "computing",
    "describe",
    "failed",
    "is_concrete",
    "may_wait",
]

#: The concrete array classes a Tensor owns; anything else it wraps (a tracer) is untracked.
CONCRETE: frozenset[type] = frozenset({ArrayImpl, PRNGKeyArray})

#: Leaf types that never hold a Tensor: tree walks pass them through without looking inside.
PLAIN: frozenset[type] = frozenset(
    {ArrayImpl, PRNGKeyArray, int, float, bool, complex, str, bytes, type(None), np.ndarray}
    | {slice, type(Ellipsis)}
)

Tracer = jax.core.Tracer


def is_concrete(x: Any) -> bool:
    """Whether ``x`` is a concrete ``jax.Array`` (typed PRNG keys included), not a tracer."""
    return type(x) in CONCRETE


def failed(arr: Any, wait: bool = False) -> bool:
    """Whether ``arr``'s computation failed (out of memory, say): JAX raises such an error only
    when the array is waited for, and calls the buffer ready meanwhile. Reading its values or
    its address (``unsafe_buffer_pointer``, ``_arrays``) then aborts the process; its metadata
    (shape, dtype, sharding, nbytes), ``delete()`` and ``is_deleted()`` are safe.

    Never waits for an array still being computed (it counts as not failed), unless ``wait``:
    for a caller about to read the values, which waits anyway. Deleted arrays, tracers and
    other values are not failed.
    """
    base = base_array(arr)  # a typed PRNG key's array of words
    if type(base) not in CONCRETE:
        return False
    try:
        if base.is_deleted() or (not wait and not base.is_ready()):
            return False
        base.block_until_ready()
    except JaxRuntimeError:
        return True
    return False


def computing(arr: Any) -> bool:
    """Whether ``arr``'s buffer is still being computed (not deleted, not ready yet): its
    allocations are unknown until it is. Never waits."""
    base = base_array(arr)
    try:
        return type(base) in CONCRETE and not base.is_deleted() and not base.is_ready()
    except Exception:  # deleted meanwhile
        return False


def wait_ready(arr: Any) -> None:
    """Wait until ``arr``'s buffer is computed: until then its addresses are unknown (a new
    object over a recorded buffer would be told as an allocation of its own). Returns at once
    for None, a deleted or a failed buffer (whose address is never read), or a non-array."""
    base = base_array(arr)
    if type(base) not in CONCRETE:
        return
    try:
        if not base.is_deleted():
            base.block_until_ready()
    except Exception:  # failed, or deleted meanwhile
        return


def may_wait() -> bool:
    """Whether this thread may wait for a buffer still being computed: not a thread the runtime
    made (a host callback's, on GPU: the computation it is part of waits for it, so waiting
    there for that computation's outputs, which JAX lists already, would never end)."""
    return not isinstance(threading.current_thread(), threading._DummyThread)


def local_nbytes(arr: Any) -> int:
    """Logical bytes of ``arr`` held by this process: all of it, or for a global array of a
    multi-process job, the distinct shards on this process's devices (from metadata)."""
    if arr.is_fully_addressable:
        return int(arr.nbytes)
    shape = tuple(arr.shape)
    itemsize = arr.nbytes // arr.size if arr.size else 0
    distinct = set()
    for index in arr.sharding.addressable_devices_indices_map(shape).values():
        distinct.add(tuple(_bounds(sl, dim) for sl, dim in zip(index, shape, strict=False)))
    total = 0
    for bounds in distinct:
        n = 1
        for start, stop, step in bounds:
            n *= len(range(start, stop, step))
        total += n * itemsize
    return total


def _bounds(sl: Any, dim: int) -> tuple[int, int, int]:
    return sl.indices(dim) if isinstance(sl, slice) else (0, dim, 1)


def shard_bytes(arr: Any) -> dict[Any, int]:
    """Bytes ``arr`` holds on each of this process's devices, from its sharding alone.

    Reads no buffer, so it is safe on an array whose allocation failed or is still in flight.
    A replicated array counts on every device that holds a copy. Read once per sharding,
    shape and dtype (a report asks it of every buffer).
    """
    key = (arr.sharding, arr.shape, arr.dtype)
    layout = _LAYOUTS.get(key)
    if layout is None:
        if len(_LAYOUTS) >= 4096:
            _LAYOUTS.clear()
        layout = _LAYOUTS[key] = tuple(_shard_bytes(arr).items())
    return dict(layout)


_LAYOUTS: dict[tuple[Any, Any, Any], tuple[tuple[Any, int], ...]] = {}


def _shard_bytes(arr: Any) -> dict[Any, int]:
    sharding = arr.sharding
    shape = tuple(arr.shape)
    itemsize = arr.nbytes // arr.size if arr.size else 0
    out: dict[Any, int] = {}
    for dev, index in sharding.addressable_devices_indices_map(shape).items():
        n = 1
        for dim, sl in zip(shape, index, strict=False):
            start, stop, step = _bounds(sl, dim)
            n *= len(range(start, stop, step))
        out[dev] = out.get(dev, 0) + n * itemsize
    return out
