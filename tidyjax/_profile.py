"""``profile()``: what a block of code allocated, its peak, and one record per op (kernel).

While at least one profile is open, an observer follows every change to the registry's books
(tensors added and removed, buffers added and freed, Tensors collected without a dispose) and
keeps running totals, starting from ``memory()`` when the first profile opened. The totals and
peaks are process-wide, like ``tf.profile``. Kernel records go to the profiles open in the
running thread or task (a ``ContextVar``).
"""

from __future__ import annotations

import contextvars
import dataclasses
import inspect
import threading
import time
from collections.abc import Callable
from typing import Any

import jax

from . import _html, _ops, _registry
from ._arrays import CONCRETE
from ._context import CURRENT
from ._errors import TidyjaxTypeError
from ._memory import _fmt_bytes, memory
from ._tensor import Tensor
from ._trees import tensors_in

__all__ = ["KernelRecord", "ProfileInfo", "profile"]

_OPEN: contextvars.ContextVar[tuple[ProfileInfo, ...]] = contextvars.ContextVar(
    "tidyjax_profiles", default=()
)


@dataclasses.dataclass(frozen=True, slots=True, repr=False, eq=False)
class KernelRecord:
    """One op run while profiling, as in ``tf.profile``'s ``kernels``.

    Attributes:
        name: the op (``"mul"``, ``"square"``, ``"sin"``, a lifted function's name).
        bytes_added: tidyjax bytes after the op minus before.
        total_bytes_snapshot: tidyjax bytes right after the op.
        tensors_added, total_tensors_snapshot: the same for the number of Tensors.
        input_shapes, output_shapes: shapes of the array arguments and the array results.
        wall_time_ms: wall time of the op, outputs waited for (``block_until_ready``).
    """

    name: str
    bytes_added: int
    total_bytes_snapshot: int
    tensors_added: int
    total_tensors_snapshot: int
    input_shapes: list[tuple[int, ...]]
    output_shapes: list[tuple[int, ...]]
    wall_time_ms: float

    def __repr__(self) -> str:
        return (
            f"KernelRecord(name={self.name!r}, bytes_added={self.bytes_added}, "
            f"total_bytes_snapshot={self.total_bytes_snapshot}, tensors_added="
            f"{self.tensors_added}, total_tensors_snapshot={self.total_tensors_snapshot}, "
            f"input_shapes={self.input_shapes}, output_shapes={self.output_shapes}, "
            f"wall_time_ms={self.wall_time_ms:.3f})"
        )


class ProfileInfo:
    """What ``profile()`` measured. A fresh object per call; final once the profile ends.

    Attributes:
        new_bytes, new_tensors: tidyjax bytes and Tensors at the end minus at the start.
        peak_bytes: the most tidyjax bytes at any moment of the profile, including its start
            (so correct even when no op ran).
        kernels: a ``KernelRecord`` per op, in order.
        kernel_names: the ops' names, unique, in first-seen order.
        result: what the profiled function returned (``None`` for the with-form).
    """

    __slots__ = (
        "_done",
        "_kernels",
        "_start_bytes",
        "_start_tensors",
        "new_bytes",
        "new_tensors",
        "peak_bytes",
        "result",
    )

    def __init__(self) -> None:
        self._kernels: list[KernelRecord] = []
        self._done = False
        self._start_bytes = self._start_tensors = 0
        self.new_bytes = self.new_tensors = self.peak_bytes = 0
        self.result: Any = None

    @property
    def kernels(self) -> list[KernelRecord]:
        return list(self._kernels)

    @property
    def kernel_names(self) -> list[str]:
        return list(dict.fromkeys(k.name for k in self._kernels))

    def __repr__(self) -> str:
        return (
            f"ProfileInfo(new_bytes={self.new_bytes}, new_tensors={self.new_tensors}, "
            f"peak_bytes={self.peak_bytes}, kernels={len(self._kernels)}, "
            f"kernel_names={self.kernel_names})"
        )

    def __str__(self) -> str:
        lines = [
            f"new {_fmt_bytes(self.new_bytes)} in {self.new_tensors} tensors, "
            f"peak {_fmt_bytes(self.peak_bytes)}, {len(self._kernels)} kernels"
        ]
        lines += [
            f"  {k.name:16s} +{k.bytes_added:>8d} B  total {k.total_bytes_snapshot:>8d} B  "
            f"{k.wall_time_ms:8.3f} ms  {k.input_shapes} -> {k.output_shapes}"
            for k in self._kernels
        ]
        return "\n".join(lines)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(str(self))

    def _repr_html_(self) -> str:
        return _profile_html(self)

    # -- with-form -------------------------------------------------------------------------

    def __enter__(self) -> ProfileInfo:
        if self._done or self in _OPEN.get():
            raise TidyjaxTypeError("a ProfileInfo is filled once; call profile() again.")
        _observer.open(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _observer.close(self)


@_html.never_raises
def _profile_html(p: ProfileInfo) -> str:
    head = (
        f"<b>profile</b>: new {_html.esc(_fmt_bytes(p.new_bytes))} in {p.new_tensors} tensors, "
        f"peak {_html.esc(_fmt_bytes(p.peak_bytes))}, {len(p._kernels)} kernels"
    )
    rows = [
        (_html.esc(k.name), k.bytes_added, k.total_bytes_snapshot, k.tensors_added,
         k.total_tensors_snapshot, _html.esc(k.input_shapes), _html.esc(k.output_shapes),
         f"{k.wall_time_ms:.3f}")
        for k in p._kernels
    ]  # fmt: skip
    header = ["kernel", "bytes added", "total bytes", "tensors added", "total tensors",
              "inputs", "outputs", "ms"]  # fmt: skip
    return _html.box(head, _html.table(header, rows) if rows else "")


# The context tokens of open profiles, by id (ProfileInfo keeps only its results).
_tokens: dict[int, contextvars.Token[tuple[ProfileInfo, ...]]] = {}


class _Observer:
    """Follows the registry while profiles are open; one per process."""

    def __init__(self) -> None:
        # Reentrant: a Tensor's __del__ may report to it during a collection inside the lock.
        self.lock = threading.RLock()
        self.open_profiles: list[ProfileInfo] = []
        self.bytes = self.tensors = 0

    # -- opening and closing --------------------------------------------------------------

    def open(self, p: ProfileInfo) -> None:
        with self.lock:
            if not self.open_profiles:
                m = memory(scan_untracked=False)
                self.bytes, self.tensors = m.num_bytes, m.num_tensors
                _registry.observers.append(self)
                _ops.set_kernel_hook(_run_kernel)
            self.open_profiles.append(p)
            p._start_bytes, p._start_tensors = self.bytes, self.tensors
            p.peak_bytes = self.bytes
        _tokens[id(p)] = _OPEN.set((*_OPEN.get(), p))

    def close(self, p: ProfileInfo) -> None:
        token = _tokens.pop(id(p), None)
        if token is not None:
            try:
                _OPEN.reset(token)
            except ValueError:  # closed from another context: just drop it there
                _OPEN.set(tuple(q for q in _OPEN.get() if q is not p))
        with self.lock:
            if p in self.open_profiles:
                self.open_profiles.remove(p)
            p.new_bytes = self.bytes - p._start_bytes
            p.new_tensors = self.tensors - p._start_tensors
            p._done = True
            if not self.open_profiles:
                _registry.observers.remove(self)
                _ops.set_kernel_hook(None)

    # -- registry events ------------------------------------------------------------------

    def _grow(self) -> None:
        b = self.bytes
        for p in self.open_profiles:
            if b > p.peak_bytes:
                p.peak_bytes = b
        scope = CURRENT.get()
        while scope is not None:
            if b > scope._peak:
                scope._peak = b
            scope = scope.parent

    def event(self, kind: str, rec: Any) -> None:
        """A change to the registry's books (see ``_registry``'s observers)."""
        with self.lock:
            if kind == "buffer_added":
                self.tensors += 1
                self.bytes += rec.size()
                self._grow()
            elif kind == "tensor_added":
                self.tensors += 1
            elif kind == "tensor_removed":
                self.tensors -= 1
            elif kind == "buffer_freed":  # its remaining holders are disposed with it
                self.tensors -= max(rec.n, 0)
                self.bytes -= rec.size()
            elif kind == "buffer_collected":
                self.bytes -= rec.size()


_observer = _Observer()


def _shapes(values: Any) -> list[tuple[int, ...]]:
    out = []
    for v in values:
        arr = v._array if isinstance(v, Tensor) else v
        shape = getattr(arr, "shape", None)
        if shape is not None and not isinstance(v, type):
            out.append(tuple(shape))
    return out


def _run_kernel(name: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: Any) -> Any:
    profiles = _OPEN.get()
    if not profiles:
        return fn(*args, **kwargs)
    obs = _observer
    bytes0, tensors0 = obs.bytes, obs.tensors
    t0 = time.perf_counter()
    out = fn(*args, **kwargs)
    results = tensors_in(out)
    jax.block_until_ready([t._array for t in results if type(t._array) in CONCRETE])
    elapsed = time.perf_counter() - t0
    record = KernelRecord(
        name=name,
        bytes_added=obs.bytes - bytes0,
        total_bytes_snapshot=obs.bytes,
        tensors_added=obs.tensors - tensors0,
        total_tensors_snapshot=obs.tensors,
        input_shapes=_shapes(list(args) + list(kwargs.values())),
        output_shapes=_shapes(results),
        wall_time_ms=elapsed * 1e3,
    )
    for p in profiles:
        p._kernels.append(record)
    return out


def profile(fn: Callable[..., Any] | None = None, /, *args: Any, **kwargs: Any) -> ProfileInfo:
    """Measure the memory a block of code allocates and the ops it runs.

    Two forms::

        info = tidyjax.profile(fn, *args, **kwargs)   # runs fn now; info.result is its result
        with tidyjax.profile() as info:               # info is filled when the block ends
            ...

    Profiles nest; each call returns a fresh :class:`ProfileInfo`. Nothing is freed by a profile.

    Raises:
        TidyjaxTypeError: ``fn`` is not callable, or returns an awaitable.
    """
    info = ProfileInfo()
    if fn is None:
        if args or kwargs:
            raise TidyjaxTypeError("profile() with arguments needs the function first.")
        return info
    if not callable(fn):
        raise TidyjaxTypeError(
            f"profile() takes a function to run, got {type(fn).__name__}; "
            "use `with tidyjax.profile() as info:` for a block."
        )
    with info:
        result = fn(*args, **kwargs)
        if inspect.isawaitable(result):
            if inspect.iscoroutine(result):
                result.close()
            raise TidyjaxTypeError(
                "profile() got an awaitable; use `with tidyjax.profile() as info:` "
                "inside the coroutine."
            )
    info.result = result
    return info
