"""``profile()``: what a block of code allocated, its peak, and one record per op (kernel).

While at least one profile is open, one count runs: a `_tally.Tally` (`_Count`), an observer of
the registry's events started from what is alive when the first profile opened. Its running
total (``memory().num_bytes`` at every moment, each buffer once) is the profiles' bytes and lifts
their peaks and the open scopes'; the Tensors are counted beside it. The totals and peaks are
process-wide, like ``tf.profile``. Kernel records go to the profiles open in the running thread
or task (a ``ContextVar``).
"""

from __future__ import annotations

import collections
import contextvars
import dataclasses
import inspect
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import jax

from . import _html, _ops
from ._arrays import CONCRETE
from ._census import books
from ._context import CURRENT
from ._decorating import check_callable
from ._errors import TidyjaxTypeError
from ._format import count, esc, signed_bytes
from ._format import fmt_bytes as _fmt_bytes
from ._sites import Site, site_of_stack
from ._tally import Tally
from ._tensor import Tensor, held_array
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
        bytes_added: tidyjax bytes after the op minus before (the net change: buffers
            collected while the op ran count against it).
        total_bytes_snapshot: tidyjax bytes right after the op.
        tensors_added: Tensors after the op minus before.
        total_tensors_snapshot: Tensors right after the op.
        input_shapes: shapes of the array arguments.
        output_shapes: shapes of the array results.
        wall_time_ms: wall time of the op, outputs waited for (``block_until_ready``).
        bytes_allocated: bytes of the new device buffers the op made (its fresh outputs).
        buffers_allocated: how many new device buffers it made.
        site: the user's line that called the op (outside tidyjax, JAX and installed code),
            or None when no such frame exists.
    """

    name: str
    bytes_added: int
    total_bytes_snapshot: int
    tensors_added: int
    total_tensors_snapshot: int
    input_shapes: list[tuple[int, ...]]
    output_shapes: list[tuple[int, ...]]
    wall_time_ms: float
    bytes_allocated: int = 0
    buffers_allocated: int = 0
    site: Site | None = None

    def __repr__(self) -> str:
        return (
            f"KernelRecord(name={self.name!r}, bytes_added={self.bytes_added}, "
            f"total_bytes_snapshot={self.total_bytes_snapshot}, tensors_added="
            f"{self.tensors_added}, total_tensors_snapshot={self.total_tensors_snapshot}, "
            f"input_shapes={self.input_shapes}, output_shapes={self.output_shapes}, "
            f"wall_time_ms={self.wall_time_ms:.3f}, bytes_allocated={self.bytes_allocated}, "
            f"site={str(self.site) if self.site is not None else None!r})"
        )


class ProfileInfo:
    """What ``profile()`` measured. A fresh object per call; final once the profile ends.

    Attributes:
        new_bytes: tidyjax bytes at the end minus at the start (the net change: what the block
            left alive less what it freed of what was there).
        new_tensors: the same for the number of Tensors.
        device_peak_bytes: the device's peak counted with XLA's temporaries: the largest, over
            the [`tidyjax.jit`][tidyjax.jit] calls that ran, of the array bytes live when the
            call returned (its arguments and outputs among them) plus that call's temporaries
            (on all its devices), and at least ``peak_bytes``. None when XLA gave no figures
            for a call (``memory_analysis()`` is None, or reports no argument or output bytes
            for a call that has them). Raw ``jax.jit`` calls and eager ops are not seen per call:
            use [`tidyjax.plan`][tidyjax.plan] for those. On CPU, XLA:CPU's temporaries.
        temp_bytes: the largest XLA temporaries of one ``tidyjax.jit`` call (all its devices
            together; 0 when no call ran, and 0 is a real answer), None when unknown (as above).
        temp_call: the function name of that call, or None when no call ran.
        peak_bytes: the most tidyjax bytes at any moment of the profile, including its start
            (so correct even when no op ran): ``bytes_before + peak_bytes_during``. The array
            bytes only, as ``tf.profile`` means it (see ``device_peak_bytes``).
        bytes_before: tidyjax bytes alive when the profile started (the peak's baseline).
        peak_bytes_during: how far the peak rose above ``bytes_before``.
        bytes_allocated: bytes of the new device buffers the ops made, all ops together.
        bytes_live_at_end: of those, the bytes still alive when the profile ended.
        kernels: a ``KernelRecord`` per op, in order.
        kernel_names: the ops' names, unique, in first-seen order.
        result: what the profiled function returned (``None`` for the with-form).
    """

    __slots__ = (
        "_call_peak",
        "_kernels",
        "_live_end",
        "_outs",
        "_start_tensors",
        "_temp",
        "_temp_call",
        "_unknown_call",
        "bytes_before",
        "new_bytes",
        "new_tensors",
        "peak_bytes",
        "result",
    )

    def __init__(self) -> None:
        self._kernels: list[KernelRecord] = []
        self._outs: list[list[Any]] = []  # per op: its new buffers, until the end weighs them
        self._live_end: list[int] | None = None  # per op: its new bytes alive at the end
        self.bytes_before = self._start_tensors = 0
        self.new_bytes = self.new_tensors = self.peak_bytes = 0
        self.result: Any = None
        # the tidyjax.jit calls seen: the most array bytes + temporaries at one, the largest
        # temporaries and their call, the first call whose figures are unknown
        self._call_peak = self._temp = 0
        self._temp_call: str | None = None
        self._unknown_call: str | None = None

    def _heard_call(self, name: str, temps: int | None, live: int) -> None:
        """A ``tidyjax.jit`` call of ``name`` returned with ``live`` array bytes alive; its
        temporaries on all its devices (None: unknown)."""
        if temps is None:
            if self._unknown_call is None:
                self._unknown_call = name
            return
        self._call_peak = max(self._call_peak, live + temps)
        if temps > self._temp or self._temp_call is None:
            self._temp, self._temp_call = max(temps, self._temp), name

    @property
    def device_peak_bytes(self) -> int | None:
        if self._unknown_call is not None:
            return None
        return max(self.peak_bytes, self._call_peak)

    @property
    def temp_bytes(self) -> int | None:
        return None if self._unknown_call is not None else self._temp

    @property
    def temp_call(self) -> str | None:
        return self._unknown_call if self._unknown_call is not None else self._temp_call

    @property
    def kernels(self) -> list[KernelRecord]:
        return list(self._kernels)

    @property
    def kernel_names(self) -> list[str]:
        return list(dict.fromkeys(k.name for k in self._kernels))

    @property
    def peak_bytes_during(self) -> int:
        return self.peak_bytes - self.bytes_before

    @property
    def bytes_allocated(self) -> int:
        return sum(k.bytes_allocated for k in self._kernels)

    @property
    def bytes_live_at_end(self) -> int:
        return sum(_live_at_end(self))

    def __repr__(self) -> str:
        return (
            f"ProfileInfo(device_peak_bytes={self.device_peak_bytes}, temp_bytes="
            f"{self.temp_bytes}, temp_call={self.temp_call!r}, new_bytes={self.new_bytes}, "
            f"new_tensors={self.new_tensors}, peak_bytes={self.peak_bytes}, bytes_before="
            f"{self.bytes_before}, "
            f"bytes_allocated={self.bytes_allocated}, kernels={len(self._kernels)}, "
            f"kernel_names={self.kernel_names})"
        )

    def __str__(self) -> str:
        stats, lines = _per_kernel(self), [_headline(self)]
        if not stats:
            return lines[0]
        lines.append(f"  {'kernel':16s} {'calls':>6s} {'first call (compile)':>21s} "
                     f"{'other calls':>12s} {'allocated':>10s} {_END:>10s}  "
                     "called at")  # fmt: skip
        lines += [
            f"  {s.name:16s} {s.calls:>6d} {_ms(s.first_ms):>21s} "
            f"{_ms(s.rest_ms) if s.calls > 1 else '-':>12s} "
            f"{_fmt_bytes(s.allocated):>10s} {_fmt_bytes(s.live_end):>10s}  {s.sites}"
            for s in stats
        ]
        lines.append(f"  per op{_log_note(len(self._kernels))}:")
        for i, k, live in _log(self):
            if k is None:
                lines.append(f"    ... {count(i, 'op')} not shown ...")
                continue
            lines.append(
                f"    {i:>5d} {k.name:16s} allocated {_fmt_bytes(k.bytes_allocated):>10s}, "
                f"{_fmt_bytes(live)} live at end; total "
                f"{_fmt_bytes(k.total_bytes_snapshot):>10s} {_ms(k.wall_time_ms):>11s}  "
                f"{k.input_shapes} -> {k.output_shapes}  {_site(k.site)}"
            )
        return "\n".join(lines)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(str(self))

    @_html.never_raises
    def _repr_html_(self) -> str:
        """A summary per kernel; the per-op log folded, at most ``2 * LOG_EDGE`` rows."""
        first, *rest = _headline(self).split("\n")
        head = _html.line("<b>profile</b>: ", esc(first)) + "".join(
            _html.line(esc(r)) for r in rest
        )
        stats = _per_kernel(self)
        if not stats:
            return _html.box(head)
        summary = _html.table(
            ["kernel", "calls", "first call (compile)", "other calls", "per other call",
             "allocated", _END, "called at"],
            [(esc(s.name), s.calls, esc(_ms(s.first_ms)),
              esc(_ms(s.rest_ms)) if s.calls > 1 else "",
              esc(_ms(s.rest_ms / (s.calls - 1))) if s.calls > 1 else "",
              esc(_fmt_bytes(s.allocated)), esc(_fmt_bytes(s.live_end)), esc(s.sites))
             for s in stats],
            numeric=range(1, 7),
        )  # fmt: skip
        rows: list[tuple[object, ...]] = []
        for i, k, live in _log(self):
            if k is None:
                rows.append(("", _html.dim(f"... {count(i, 'op')} not shown ...")))
                continue
            rows.append((i, esc(k.name), esc(_fmt_bytes(k.bytes_allocated)),
                         esc(_fmt_bytes(live)), esc(_fmt_bytes(k.total_bytes_snapshot)),
                         k.total_tensors_snapshot, esc(k.input_shapes), esc(k.output_shapes),
                         f"{k.wall_time_ms:.3f}", esc(_site(k.site))))  # fmt: skip
        log = _html.table(
            ["#", "kernel", "allocated", _END, "total bytes after", "total tensors after",
             "inputs", "outputs", "ms", "called at"],
            rows,
            numeric={0, 2, 3, 4, 5, 8},
        )  # fmt: skip
        fold = _html.details(esc(f"per op{_log_note(len(self._kernels))}"), log)
        return _html.box(head, summary, fold)

    # -- with-form -------------------------------------------------------------------------

    def __enter__(self) -> ProfileInfo:
        if self._live_end is not None or self in _OPEN.get():
            raise TidyjaxTypeError("a ProfileInfo is filled once; call profile() again.")
        _start(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _stop(self)


#: The per-op log shows this many ops at each end of a longer run.
LOG_EDGE = 50


class _KernelStat(NamedTuple):
    name: str
    calls: int
    first_ms: float  # the first call: compiling happens there
    rest_ms: float  # every later call together
    allocated: int  # bytes of the new buffers its calls made
    live_end: int  # of those, the bytes still alive at the end
    sites: str  # its most frequent call site, and how many others it was called from


#: The column of bytes an op made that are still alive when the profile ends.
_END = "still live at end"


def _live_at_end(p: ProfileInfo) -> list[int]:
    """Per op, its new bytes still alive: fixed at the end, read now while still open."""
    if p._live_end is not None:
        return p._live_end
    return [
        sum(r.size() for r in recs if r.dead is None and (r() is not None or r.more))
        for recs in p._outs
    ]


def _per_kernel(p: ProfileInfo) -> list[_KernelStat]:
    """One row per kernel, the most time first."""
    calls: dict[str, list[tuple[KernelRecord, int]]] = {}
    for k, live in zip(p._kernels, _live_at_end(p), strict=False):
        calls.setdefault(k.name, []).append((k, live))
    stats = []
    for name, ks in calls.items():
        sites = collections.Counter(k.site for k, _ in ks)
        more = f" (+{count(len(sites) - 1, 'other site')})" if len(sites) > 1 else ""
        rest, nbytes = sum(k.wall_time_ms for k, _ in ks[1:]), sum(k.bytes_allocated for k, _ in ks)
        site = _site(sites.most_common(1)[0][0]) + more
        stats.append(
            _KernelStat(
                name, len(ks), ks[0][0].wall_time_ms, rest, nbytes, sum(n for _, n in ks), site
            )
        )
    return sorted(stats, key=lambda s: -(s.first_ms + s.rest_ms))


def _site(site: Site | None) -> str:
    return str(site) if site is not None else "?"


def _log(p: ProfileInfo) -> list[tuple[int, KernelRecord | None, int]]:
    """The ops to list, numbered from 1, with their bytes live at the end; ``(n, None, 0)``
    stands for ``n`` ops left out."""
    live = _live_at_end(p)
    rows: list[tuple[int, KernelRecord | None, int]]
    rows = [(i, k, live[i - 1]) for i, k in enumerate(p._kernels[: len(live)], 1)]
    if len(rows) <= 2 * LOG_EDGE:
        return rows
    return [*rows[:LOG_EDGE], (len(rows) - 2 * LOG_EDGE, None, 0), *rows[-LOG_EDGE:]]


def _log_note(n: int) -> str:
    if n <= 2 * LOG_EDGE:
        return f" ({count(n, 'op')})"
    return f" ({n} ops; the first and last {LOG_EDGE} shown)"


def _ms(ms: float) -> str:
    return f"{ms:.3f} ms"


def _device_peak(p: ProfileInfo) -> str:
    """The device peak's line: with XLA's temporaries, the largest call's named."""
    if p._unknown_call is not None:
        return (
            f"device peak unknown: XLA gave no memory figures for {p._unknown_call} "
            f"(array peak {_fmt_bytes(p.peak_bytes)})"
        )
    dp = p.device_peak_bytes or 0
    if p._temp_call is None:
        return f"device peak {_fmt_bytes(dp)}: no tidyjax.jit call ran, no XLA temporaries counted"
    return (
        f"device peak {_fmt_bytes(dp)} with XLA temporaries (the largest: "
        f"{_fmt_bytes(p._temp)} of {p._temp_call})"
    )


def _headline(p: ProfileInfo) -> str:
    """Three lines: what the ops allocated and kept; the device peak, with XLA's temporaries;
    the array peak as its baseline plus the rise."""
    ops = f"{count(len(p._kernels), 'op')} of {count(len(p.kernel_names), 'kernel')}"
    n_new = sum(k.buffers_allocated for k in p._kernels)
    return (
        f"{ops} allocated {_fmt_bytes(p.bytes_allocated)} in {count(n_new, 'buffer')}, "
        f"{_fmt_bytes(p.bytes_live_at_end)} of it still live at the end\n"
        f"{_device_peak(p)}\n"
        f"array peak {_fmt_bytes(p.peak_bytes)} = {_fmt_bytes(p.bytes_before)} before + "
        f"{_fmt_bytes(p.peak_bytes_during)} during; net change "
        f"{signed_bytes(p.new_bytes)}, {p.new_tensors:+d} "
        f"{'tensor' if abs(p.new_tensors) == 1 else 'tensors'}"
    )


# The context tokens of open profiles, by id (ProfileInfo keeps only its results).
_tokens: dict[int, contextvars.Token[tuple[ProfileInfo, ...]]] = {}


class _Count(Tally):
    """The one count of tidyjax bytes while profiles are open (``memory().num_bytes`` at every
    moment, each buffer once). Each rise feeds the open profiles' peaks and the open scopes'
    (``note_peak``); each new record goes to the op running in its thread."""

    def __init__(self) -> None:
        super().__init__()
        self.profiles: list[ProfileInfo] = []  # open, in the order they opened

    def made(self, rec: Any) -> None:
        out = getattr(_sink, "recs", None)
        if out is not None:
            out.append(rec)

    def rose(self, total: int) -> None:
        for p in self.profiles:
            p.peak_bytes = max(p.peak_bytes, total)
        scope = CURRENT.get()
        while scope is not None:
            scope.note_peak(total)
            scope = scope.parent

    def call(self, name: str, figures: Any) -> None:
        """A ``tidyjax.jit`` call returned (``_plan.observe_call``): each open profile weighs its
        temporaries (None: unknown) against the bytes alive now, its outputs counted."""
        temps = figures.temporaries()
        total = sum(temps.values()) if temps else None
        with self.lock:
            self.settle()
            for p in self.profiles:
                p._heard_call(name, total, self.total)


# The recorder while a profile is open (else None); the lock of opening and closing profiles.
_recorder: _Count | None = None
_guard = threading.RLock()
# per thread: the list collecting the buffers the running op makes
_sink = threading.local()


def _start(p: ProfileInfo) -> None:
    """Open ``p``; the first profile to open starts the count, from what is alive now."""
    global _recorder
    with _guard:
        rec = _recorder
        if rec is None:
            rec = _Count()
            rec.start()  # what is alive: its total is memory()'s
            _recorder = rec
            _ops.set_kernel_hook(_run_kernel)
        with rec.lock:
            rec.settle()  # the buffers just added count before the baseline
            rec.profiles.append(p)
            p.bytes_before = p.peak_bytes = rec.total
            p._start_tensors = rec.tensors
    _tokens[id(p)] = _OPEN.set((*_OPEN.get(), p))


def _stop(p: ProfileInfo) -> None:
    """Close ``p`` and fix its results; the last profile to close stops the count."""
    global _recorder
    token = _tokens.pop(id(p), None)
    if token is not None:
        try:
            _OPEN.reset(token)
        except ValueError:  # closed from another context: just drop it there
            _OPEN.set(tuple(q for q in _OPEN.get() if q is not p))
    # The books read again (buffers deleted behind tidyjax's back are noticed, suspects
    # resolved), and the Tensors from them: a Tensor on a buffer deleted behind tidyjax's back
    # (a raw jax.jit donation) is reported by no event.
    alive, deleted = books()
    tensors = sum(max(r.n, 0) for r in alive + deleted)
    with _guard:
        rec = _recorder
        if rec is None or p not in rec.profiles:
            return
        with rec.lock:
            rec.settle()
            rec.forget_failed()
            rec.tensors = tensors
            rec.profiles.remove(p)
            p.new_bytes = rec.total - p.bytes_before
            p.new_tensors = tensors - p._start_tensors
            p._live_end = _live_at_end(p)
            p._outs = []  # the records go: only their bytes were needed
        if not rec.profiles:
            rec.stop()
            _recorder = None
            _ops.set_kernel_hook(None)


def _shapes(values: Any) -> list[tuple[int, ...]]:
    arrays = (
        held_array(v) if isinstance(v, Tensor) else v for v in values if not isinstance(v, type)
    )
    return [tuple(a.shape) for a in arrays if getattr(a, "shape", None) is not None]


def _run_kernel(name: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: Any) -> Any:
    profiles, rec = _OPEN.get(), _recorder
    if not profiles or rec is None:
        return fn(*args, **kwargs)
    site = site_of_stack(sys._getframe(1))  # the user's frame calling the op
    made: list[Any] = []
    outer = getattr(_sink, "recs", None)  # an op inside an op: both get its buffers
    _sink.recs = made
    bytes0, tensors0 = rec.total, rec.tensors
    try:
        t0 = time.perf_counter()
        out = fn(*args, **kwargs)
        results = tensors_in(out)
        jax.block_until_ready([a for t in results if type(a := held_array(t)) in CONCRETE])
        elapsed = time.perf_counter() - t0
    finally:
        _sink.recs = outer
        if outer is not None:
            outer.extend(made)
    rec.settle()  # the buffers just added (the op's committed outputs): counted now
    record = KernelRecord(
        name=name,
        bytes_added=rec.total - bytes0,
        total_bytes_snapshot=rec.total,
        tensors_added=rec.tensors - tensors0,
        total_tensors_snapshot=rec.tensors,
        input_shapes=_shapes(list(args) + list(kwargs.values())),
        output_shapes=_shapes(results),
        wall_time_ms=elapsed * 1e3,
        bytes_allocated=sum(r.size() for r in made),
        buffers_allocated=len(made),
        site=site,
    )
    for p in profiles:
        p._kernels.append(record)
        p._outs.append(made)
    return out


def profile(fn: Callable[..., Any] | None = None, /, *args: Any, **kwargs: Any) -> ProfileInfo:
    """Measure the memory a block of code allocates and the ops it runs.

    Two forms:

    ```python
    info = tidyjax.profile(fn, *args, **kwargs)   # runs fn now; info.result is its result
    with tidyjax.profile() as info:               # info is filled when the block ends
        ...
    ```

    Profiles nest; each call returns a fresh [`ProfileInfo`][tidyjax.ProfileInfo]. Nothing is freed
    by a profile.

    Raises:
        TidyjaxTypeError: ``fn`` is not callable, or returns an awaitable.
    """
    info = ProfileInfo()
    if fn is None:
        if args or kwargs:
            raise TidyjaxTypeError("profile() with arguments needs the function first.")
        return info
    check_callable(fn, "profile()", hint="Use `with tidyjax.profile() as info:` for a block.")
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
