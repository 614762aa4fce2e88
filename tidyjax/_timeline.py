"""``timeline()``: every allocation, free and scope of device memory, in order.

A recording `Timeline` is one of ``_registry.observers`` (``_scope`` reports scopes only while
one listens): each buffer added, freed or collected and each scope entered or exited is one
`TimelineEvent`; replaying them (``live_at``) gives the tidyjax bytes ``memory()`` reports then.
Plain ``jax.Array`` objects are seen through an ``_newarrays.ArrayMark`` at each scope event,
``mark()`` and stop (nothing per op), as allocations of scope ``"<untracked>"`` freed by a weak
reference's callback (or found deleted at a look). While a timeline records with ``sample`` on
(the default), a `_Sampler` thread looks too, every few milliseconds, feeding the same books
(``Timeline._sampled``): a program that never calls ``mark()`` is seen all the same.

One device buffer is one allocation: the records over one buffer (a raw ``jax.device_put`` of a
Tensor to where it is) share one entry, decided before the next event (`Timeline._settle`;
addresses read only for the registry's suspects, ``_find``); raw objects no record knows are
views of an entry. A buffer deleted behind tidyjax's back (a raw ``jax.jit`` donation) is freed
at the next ``mark()``, stop or read.
"""

from __future__ import annotations

import atexit
import bisect
import collections
import contextlib
import functools
import itertools
import math
import numbers
import os
import pathlib
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar, overload

from . import _html, _registry, _tally, _timeline_format, _timeline_html, _variable, _watch
from ._arrays import CONCRETE, computing, failed, local_nbytes, may_wait, shard_bytes, wait_ready
from ._census import (
    UNTRACKED,
    WATCHED,
    Site,
    SiteStat,
    TensorRecord,
    books,
    buffer_of,
    collector_paused,
    creation_site,
    group_spread,
    holders,
    holds,
    released,
    same_buffer,
    scope_path,
    watched_ids,
)
from ._context import CURRENT
from ._decorating import check_callable, decorate
from ._errors import TidyjaxTypeError, TidyjaxValueError, check_flag
from ._format import fmt_bytes
from ._jaxdoors import base_array, buffer_addresses, shard_devices
from ._newarrays import ArrayMark
from ._registry import VARIABLE
from ._sites import LIBRARY_FOLDERS, chained_site
from ._snapshot import Snapshot
from ._tensor import record
from ._timeline_format import (
    ALLOC,
    FREE,
    SCOPE_ENTER,
    SCOPE_EXIT,
    TEMPORARIES,
    Codec,
    Mark,
    TimelineEvent,
    merge_temporaries,
    split_temporaries,
)
from ._watch import watched

__all__ = ["UNTRACKED", "Timeline", "TimelineEvent", "active", "timeline"]


F = TypeVar("F", bound=Callable[..., Any])

# One lock for every timeline: events arrive from any thread, and reentrantly when a collection
# runs a finalizer (a Tensor's __del__, a weak reference's callback) inside a handler. An event
# waits for it at most ``_tally.WAIT``, then goes to ``_inbox``, handled by the thread holding
# the lock as it lets go (`_pump`; a finalizer's thread may hold a lock of the registry that
# the holder waits for).
_lock = threading.RLock()
_acquire, _release = _lock.acquire, _lock.release  # bound once, called positionally: per event
_WAIT = _tally.WAIT
_inbox: collections.deque[tuple[Any, ...]] = collections.deque()


def _handle_inbox() -> None:
    """Handle the events told and queued, in order (under ``_lock``)."""
    while _inbox:
        tl, kind, obj, tensor = _inbox.popleft()
        tl._event(kind, obj, tensor)


def _pump() -> None:
    """Handle the events told, unless another thread holds ``_lock`` past ``_tally.WAIT`` (it
    does as it lets go)."""
    while _inbox:
        if not _acquire(True, _WAIT):
            return
        try:
            _handle_inbox()
        finally:
            _release()


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    """``_lock`` held, the events told before handled first and those told meanwhile as it is
    let go. The records just added that a look reads addresses of are waited for first."""
    if _registry.suspects:
        for tl in list(_recording):
            tl._ready_pending()
    with _lock:
        _handle_inbox()
        yield
    _pump()


_recording: list[Timeline] = []  # open timelines, in the order they started

#: The sampler's interval by default, in seconds (``timeline(sample=...)``).
SAMPLE = 0.005
#: The intervals ``sample`` may take (0 or None: off), in seconds.
_SAMPLE_RANGE = (1e-4, 60.0)
#: The sampler waits at least this many times as long as its last look took, so that it never
#: takes more than about 1/20 of the time (of the GIL) however many arrays live.
_DUTY = 20

#: The most frames of a site's stack: the first frames outside tidyjax and JAX, innermost first.
STACK_FRAMES = 4
#: A dtype's or a device's name, read once.
_name = functools.lru_cache(maxsize=4096)(str)
#: An equal value seen before: a million events share a few thousand shapes and placements.
_same = functools.lru_cache(maxsize=65536)(lambda value: value)


@functools.lru_cache(maxsize=65536)
def _site_and_stack(tb: Any) -> tuple[Site | None, tuple[Site, ...]]:
    """The site of a JAX creation traceback, with its chain of user frames (as
    ``creation_site`` gives it), and its short stack; read once per distinct traceback (equal
    tracebacks: the same code objects at the same instructions, so one chain of calls)."""
    if tb is None:
        return None, ()
    frames = list(tb.frames)
    return chained_site(frames), _stack(frames)


def _stack(frames: Iterable[Any]) -> tuple[Site, ...]:
    """The first ``STACK_FRAMES`` of ``frames`` (innermost first, as a traceback's) outside
    tidyjax and JAX, innermost first."""
    user = (f for f in frames if not f.file_name.startswith(LIBRARY_FOLDERS))
    return tuple(
        Site(f.file_name, f.line_num, f.function_name) for f in itertools.islice(user, STACK_FRAMES)
    )


def _traceback_stack(tb: Any) -> tuple[Site, ...]:
    """`_stack` of a traceback that cannot be hashed (or has no frames: no stack)."""
    try:
        return _stack(tb.frames)
    except Exception:  # a traceback without frames
        return ()


def _buffer_key(arr: Any) -> Any:
    """The allocations of ``arr``'s buffer, ``(device id, address)`` for each shard, or None
    while it is not ready, deleted or failed (that address would abort the process). The
    device counts: two devices' allocations may have one address (on CPU, an array moved to
    another device may keep its memory there). One device's is read directly: no shard view
    is made."""
    base = base_array(arr)
    if type(base) not in CONCRETE:
        return None
    try:
        if base.is_deleted() or not base.is_ready():
            return None
        base.block_until_ready()  # ready: returns at once, or raises for a failed allocation
        sharding = base.sharding
        if len(sharding.device_set) == 1:
            return ((_sole_id(sharding), base.unsafe_buffer_pointer()),)
        return tuple(zip(shard_devices(base), buffer_addresses(base), strict=True))
    except Exception:  # failed, or deleted meanwhile
        return None


@functools.lru_cache(maxsize=4096)
def _sole_id(sharding: Any) -> int:
    """The id of the one device of ``sharding``."""
    return int(next(iter(sharding.device_set)).id)


@functools.lru_cache(maxsize=4096)
def _sole_device(sharding: Any) -> str | None:
    """The name of the one local device of ``sharding``, or None."""
    devices = sharding.device_set
    if len(devices) == 1 and sharding.is_fully_addressable:
        return _name(next(iter(devices)))
    return None


def _placement(arr: Any, nbytes: int) -> tuple[str, tuple[tuple[str, int], ...] | None]:
    """The device label and the bytes on each device, from the sharding (no buffer is read):
    None when all are on that one device (see `_KIND`)."""
    try:
        name = _sole_device(arr.sharding)
        if name:
            return name, None
        pairs = tuple(sorted((_name(d), b) for d, b in shard_bytes(arr).items()))
    except Exception:  # an array kind without a sharding: no device to report
        return "", ()
    return ",".join(n for n, _ in pairs), pairs


#: In ``Timeline._pending`` in place of a Tensor id: the record's last Tensor went (`_let_go`).
_LET_GO = -1

#: ``TimelineEvent`` from a tuple of all its fields, without the Python-level ``__new__``.
_event = tuple.__new__

# A recorded event is a plain tuple of `TimelineEvent`'s fields, made a TimelineEvent when read
# (`_public`): the site as its index in ``Timeline._sites`` (0: none), ``tensors`` an int when
# one id (0: none), ``per_device`` None when all bytes are on ``device``. Python's collector
# stops tracking a tuple of numbers, strings and flat tuples at its first collection, so a long
# recording adds nothing to the program's later collections (a TimelineEvent holding a Site
# stays tracked; a nested tuple can be promoted still tracked).
_KIND, _TIME, _BYTES, _SCOPE, _BUFFER, _PER_DEVICE = 0, 1, 2, 5, 9, 11

#: What an allocation reports: its bytes, device, bytes per device, shape and dtype name.
_Layout = tuple[int, str, tuple[tuple[str, int], ...] | None, tuple[int, ...], str]
# (sharding, shape, dtype) of an array on one local device -> its layout: one lookup per
# allocation instead of five.
_layouts: dict[Any, _Layout] = {}


def _layout(rec: Any, arr: Any, key: Any) -> _Layout:
    """What an allocation of ``arr`` reports (not in ``_layouts``), cached under ``key`` when
    ``arr`` lies on one local device (its bytes then follow from its shape and dtype alone)."""
    nbytes = rec.size()
    device, per_device = _placement(arr, nbytes)
    layout = (nbytes, device, per_device, _same(tuple(arr.shape)), _name(arr.dtype))
    if key is not None and _sole_device(key[0]):
        if len(_layouts) > 65536:
            _layouts.clear()
        _layouts[key] = layout
    return layout


def _maybe_alias(rec: Any, window: int) -> bool:
    """Whether ``rec``, a record just added, may be one more object over a recorded buffer or a
    plain array's: it is among the registry's last ``window`` suspects, or the registry found it
    over a caller's array (not owned)."""
    return not rec.owned or any(s is rec for s in reversed(_registry.suspects[-window:]))


def _first(entry: list[Any]) -> Any:
    """The array object of a plain entry (``[weak reference, event]``) or of a live one."""
    return entry[0]() if len(entry) == 2 else entry[0].array()


def _holds(entry: list[Any], key: Any) -> bool:
    """Whether ``entry``'s arrays hold the allocations ``key`` (`_buffer_key`) still: a record
    over some of them may have left it (its allocations freed, their addresses reused), a plain
    array's view may hold a shard of it (`Timeline._plain_gone`). One record's entry always."""
    if len(entry) != 2 and not entry[3]:
        return True
    if len(entry) == 2:
        arrays = [a] if (a := entry[0]()) is not None else []
    else:
        arrays = [a for r in entry[3] if holds(r) and (a := r.array()) is not None]
    have: set[Any] = set()
    for arr in arrays:
        k = _buffer_key(arr)
        if k is None and not arr.is_deleted():
            return True  # not ready yet: it holds what it will hold
        have.update(k or ())
    return have.issuperset(key)


def _record(ev: TimelineEvent) -> TensorRecord:
    return TensorRecord(
        id=ev.tensors[0] if ev.tensors else 0,
        shape=ev.shape,
        dtype=ev.dtype,
        bytes=ev.bytes,
        devices=tuple(d for d, _ in ev.per_device),
        scope=ev.scope,
        site=ev.site,
        kept=ev.scope == "<kept>",
        variable=ev.scope == "<variable>",
        _buffer=ev.buffer,
    )


def _check_sample(sample: object, where: str) -> float | None:
    """``sample`` as an interval in seconds, or None for off (None or 0)."""
    if sample is None:
        return None
    if isinstance(sample, bool) or not isinstance(sample, numbers.Real):
        raise TidyjaxTypeError(
            f"{where}'s sample must be a number of seconds, or None (no sampling), got "
            f"{type(sample).__name__} {sample!r}."
        )
    seconds = float(sample)
    if seconds == 0:
        return None
    low, high = _SAMPLE_RANGE
    if not (low <= seconds <= high) or math.isnan(seconds):
        raise TidyjaxValueError(
            f"{where}'s sample must be an interval from {low} to {high:g} seconds, or 0 or None "
            f"(no sampling), got {sample!r}. The default, {SAMPLE}, sees every plain array "
            "alive for 10 ms."
        )
    return seconds


def _usable(arr: Any) -> bool | None:
    """Whether the sampler may record ``arr``: True when its buffer is ready and its allocation
    did not fail, None while it is being computed (ask again later), False when deleted,
    failed or not an array tidyjax reads. Never waits (a ready buffer's wait returns at once)."""
    base = base_array(arr)
    if type(base) not in CONCRETE:
        return False
    try:
        if base.is_deleted():
            return False
        if not base.is_ready():
            return None
    except Exception:  # deleted meanwhile
        return False
    return not failed(base)


#: The samplers running, stopped at interpreter exit (a timeline never exited: a daemon thread
#: must not call into JAX while the runtime shuts down).
_samplers: weakref.WeakSet[_Sampler] = weakref.WeakSet()


#: True until the interpreter exits: then a weak reference's callback records nothing (the
#: module may be torn down under it; None then too).
_running: bool | None = True


@atexit.register
def _stop_samplers() -> None:
    global _running
    _running = False
    for sampler in list(_samplers):
        sampler.stop.set()
        if sampler.thread.is_alive():
            sampler.thread.join(timeout=1.0)


class _Sampler:
    """The thread that looks at the plain jax.Arrays every ``interval`` seconds while its
    timeline records (``timeline(sample=...)``), so that no ``mark()`` is needed.

    Each look lists the arrays made since the last (its own `ArrayMark`, read outside the
    timeline's lock: the main thread may run JAX meanwhile, and a weak reference's callback on
    it takes that lock) and records, under the lock, those seen at the previous look that are
    still alive, ready and not failed (``Timeline._sampled``: the books ``mark()`` feeds). An
    array is recorded at its second sighting: a Tensor's array, which an op makes just before
    the registry hears of it, is the registry's by then (else the op's thread stalled, and
    the allocation becomes the Tensor's when the registry hears of it:
    ``Timeline._sampled_first``), and a temporary is gone. One that is
    still being computed waits for a later look; a failed one is never read.

    The thread holds no array while it waits, and drops those it holds outside the lock: a
    weak reference's callback it runs (the last reference dropped here) takes the lock itself.
    """

    def __init__(self, tl: Timeline, interval: float) -> None:
        self.tl = tl
        self.interval = interval
        self.stop = threading.Event()
        self.mark = ArrayMark()  # made now, on the caller's thread: arrays made from now on
        self.seen: list[weakref.ref[Any]] = []  # seen once, oldest first: recorded next look
        self.thread = threading.Thread(
            target=self._run, name=f"tidyjax timeline sampler {id(tl):#x}", daemon=True
        )
        _samplers.add(self)

    def _run(self) -> None:
        wait = self.interval
        try:
            while not self.stop.wait(wait):
                began = time.perf_counter()
                if not self._look():
                    return
                wait = max(self.interval, _DUTY * (time.perf_counter() - began))
        except Exception as e:  # a thread must not raise: the timeline says sampling stopped
            with _locked():
                self.tl._sample_error = f"{type(e).__name__}: {e}"

    def _look(self) -> bool:
        """One look; False once the timeline stopped (or resumed with another sampler)."""
        fresh = self.mark.advance()  # newest first
        ready: list[Any] = []
        later: list[weakref.ref[Any]] = []
        for ref in self.seen:
            arr = ref()
            if arr is None:
                continue
            usable = _usable(arr)
            if usable:
                ready.append(arr)
            elif usable is None:  # still being computed
                later.append(ref)
        # (jax.Arrays are weakly referenceable) Not the 0-d ones: JAX makes one of each Python
        # number an op takes, alive while the op compiles (a first call), a few bytes each.
        self.seen = later + [weakref.ref(a) for a in reversed(fresh) if a.ndim]
        del fresh
        while not _lock.acquire(timeout=0.05):  # never stuck while the timeline stops
            if self.stop.is_set():
                return False
        try:
            if self.stop.is_set() or self.tl._sampler is not self:
                return False
            _handle_inbox()
            later = self.tl._sampled(ready)
        finally:
            _lock.release()
            _pump()
        if later:  # over a record's buffer that this look could not settle yet: looked at next
            self.seen[:0] = [weakref.ref(a) for a in later]
        return True  # ``ready`` goes now, outside the lock


_SCOPE_KINDS = frozenset({SCOPE_ENTER, SCOPE_EXIT})


class Timeline:
    """Every allocation, free and scope of device memory while it recorded.

    Made by [`timeline`][tidyjax.timeline]. It records while entered (``with``, or a function it
    decorates); entering it again later continues it, reconciling what changed in between. Each
    event is a `TimelineEvent`; beyond ``max_events`` the oldest are dropped (``dropped`` counts
    them) and the replay starts from what they left alive.

    Plain ``jax.Array`` objects no Tensor holds (``arrays=True``, the default) are seen at the
    next scope event, [`mark`][tidyjax.Timeline.mark] or stop after they were made, and by a
    thread that samples them every ``sample`` seconds while it records, with the scope
    ``"<untracked>"`` (``"<watched>"`` when a watched object holds one); their frees are
    recorded when Python drops them. Where they could not be seen (``sample=None`` and no
    ``mark()``, or ``arrays=False``), [`unseen`][tidyjax.Timeline.unseen] says so, and so do the
    ``repr`` and the page.

    Attributes:
        max_events: the most events kept.
        arrays: whether plain jax.Arrays made while recording are recorded too.
        sample: the sampler's interval in seconds, or None when no thread samples them.
        dropped: how many older events were dropped.
        peak_bytes: the most tidyjax bytes alive at any moment while recording (all devices).
        peak_time: when that peak was first reached (``time.perf_counter()``'s clock).
        started_at: Unix time when recording first started; ``start_time``, ``stop_time``: on
            ``time.perf_counter()``'s clock (``stop_time`` is None while recording).
    """

    #: Whether ``active()`` lists it while it records (not a profile's recorder, ``_profile``).
    _listed = True

    def __init__(
        self, max_events: int = 1_000_000, arrays: bool = True, sample: float | None = SAMPLE
    ) -> None:
        self.max_events = max_events
        self.arrays = check_flag(arrays, "arrays", "Timeline()")
        self.sample = _check_sample(sample, "Timeline()")
        self._array_mark: ArrayMark | None = None  # while recording plain arrays
        self._sampler: _Sampler | None = None  # while recording plain arrays with ``sample``
        self._marked = False  # whether the user called mark() while recording
        self._sample_error: str | None = None  # why a sampler stopped early
        self._unseen_note: str | None = None  # a loaded timeline's `unseen`
        self._events: collections.deque[tuple[Any, ...]] = collections.deque()  # see _KIND
        self.dropped = 0
        self._base: dict[int, tuple[Any, ...]] = {}  # alive before the first kept event
        # id(rec) -> [rec, alloc event, Tensor ids, members]: one entry per device buffer, shared
        # by the records over it (a raw device_put's, see _settle) that ``members`` then lists
        self._live: dict[int, list[Any]] = {}
        # id(array) -> [weak reference to it, its alloc event]: the plain arrays seen alive
        self._plain: dict[int, list[Any]] = {}
        # id(entry) -> the plain entries the sampler recorded since anything else was recorded
        # or looked (see _sampled_first), and the events recorded (dropped ones counted) when
        # its last look ended
        self._sampled_plain: dict[int, list[Any]] = {}
        self._sampled_upto = -1
        # plain arrays a look (other than the sampler's) found still being computed: their
        # allocations unknown, they are looked at again first at the next look (`_feed`)
        self._unready: list[weakref.ref[Any]] = []
        # whether `_settle` left in ``_pending`` a record still being computed (a host
        # callback's look): a free of one is taken out of it (`_freed`)
        self._deferred = False
        self._stopping = False
        # the arrays alive when the recording (re)started, as weak references read at the first
        # need (see _made_before), then their buffers' addresses; those still computing then
        self._before: Iterator[weakref.ref[Any]] = iter(())
        self._before_addr: dict[Any, weakref.ref[Any]] | None = None
        self._before_todo: list[weakref.ref[Any]] = []
        # (record, time, Tensor id) of the committed buffers just added (an allocation, or one
        # more record over a recorded buffer: see _settle) and of those whose last Tensor went
        # (Tensor id _LET_GO)
        self._pending: list[tuple[Any, float, int]] = []
        # ``_pending`` as the sampler's last look left it, and how many it held then (`_sampled`)
        self._pending_seen: tuple[list[Any] | None, int] = (None, 0)
        # id(entry) -> [entry, [(id(view), weak reference)]]: array objects no record knows over
        # the buffer of a live or plain entry; id(view) -> (weak reference, entry): the same
        self._views: dict[int, list[Any]] = {}
        self._view_of: dict[int, tuple[Any, list[Any]]] = {}
        # allocations -> the plain entries over them (`_plain_over`; the registry's index finds
        # the records'); the ids of plain arrays whose allocations are not read yet
        self._addr: dict[Any, list[list[Any]]] = {}
        self._addr_todo: list[int] = []
        self._watch: dict[int, list[weakref.ref[Any]]] = {}  # our own collection callbacks
        self._scopes: dict[int, tuple[Any, int]] = {}  # id(scope) -> (open scope, its number)
        self._next = 0  # the last buffer or scope number given
        self._bytes = 0
        self._last = 0.0  # the latest event time: times never go back
        self._depth = 0
        self._loaded = False
        # each site's short user stacks (at most 3 distinct), and the ids of the stacks seen
        self._stacks: dict[Site, list[tuple[Site, ...]]] = {}
        self._stack_ids: set[int] = set()
        self._names: dict[int, str] = {}  # buffer number -> the name of the Variable holding it
        # the sites of the events kept (see _KIND): index -> site, and id(site) -> index
        self._sites: list[Site | None] = [None]
        self._site_index: dict[int, int] = {}
        # At the last lookup of the Variables (see _variables_moved): how many there were, the
        # last number given then, and whether a Variable's buffer was freed since.
        self._vars_seen, self._named_upto, self._vars_dirty = -1, 0, False
        self._marks: list[Mark] = []  # annotate()'s moments, in time order
        self.peak_bytes = 0
        self.peak_time = 0.0
        self._peak_seq = -1  # the event that reached the peak, counting dropped ones (-1: none)
        self._peak_live: list[Any] | None = None  # set when that event is dropped
        self._dropped_at = 0.0  # the time of the last event dropped
        # the most bytes alive at a dropped event: (bytes, time, sequence and buffer number),
        # found as events drop (``_base_bytes``: the bytes of ``_base``)
        self._dropped_best: tuple[int, float, int, int] | None = None
        self._base_bytes = 0
        # the device peak of the tidyjax.jit calls: (array bytes + temporaries, time, function,
        # temporaries) at the largest; None before any call (see `call`)
        self._call_peak: tuple[int, float, str, int] | None = None
        self.started_at: float | None = None
        self.start_time: float | None = None
        self.stop_time: float | None = None

    # -- what was recorded ------------------------------------------------------------------

    @property
    def events(self) -> list[TimelineEvent]:
        """The events kept, oldest first."""
        return self._window()[1]

    @property
    def annotations(self) -> list[Mark]:
        """The moments marked with [`annotate`][tidyjax.Timeline.annotate], oldest first: each
        a named tuple ``(time, label, bytes)``."""
        with _locked():
            return list(self._marks)

    @property
    def device_peak_bytes(self) -> int:
        """The peak counted with XLA's temporaries: the most, over the moments the
        [`tidyjax.jit`][tidyjax.jit] calls returned, of the bytes alive then plus that call's
        temporaries (a ``"temporaries"`` event each), and at least `peak_bytes` (the array
        peak). Raw ``jax.jit`` calls and eager ops are not seen per call, and a call whose
        figures XLA does not give records no event; on CPU, XLA:CPU's temporaries."""
        best = self._call_peak
        return self.peak_bytes if best is None else max(self.peak_bytes, best[0])

    @property
    def device_peak_time(self) -> float:
        """When `device_peak_bytes` was reached: the call's moment, or `peak_time`."""
        best = self._call_peak
        return best[1] if best is not None and best[0] > self.peak_bytes else self.peak_time

    @property
    def device_peak_call(self) -> str | None:
        """The function whose temporaries make `device_peak_bytes` (None: the array peak is
        the device peak)."""
        best = self._call_peak
        return best[2] if best is not None and best[0] > self.peak_bytes else None

    def _heard(self, total: int, when: float, name: str, temps: int | None) -> None:
        """A call's temporaries (None: unknown) at a moment with ``total`` bytes alive."""
        best = self._call_peak
        if temps is not None and (best is None or total + temps > best[0]):
            self._call_peak = (total + temps, when, name, temps)

    def call(self, name: str, figures: Any) -> None:
        """A ``tidyjax.jit`` call of ``name`` returned (the call event; ``figures``: its
        ``CallFigures``): its temporaries, an event of their own, weighed against what is
        alive now (its outputs settled first). Unknown figures record no event."""
        temps = figures.temporaries()
        total = sum(temps.values()) if temps else None  # None: unknown (or no device)
        with _locked():
            if not self._depth:
                return
            self._settle()
            now = max(time.perf_counter(), self._last)
            if temps and total is not None:
                device = ",".join(temps)
                per_device = None if len(temps) == 1 else tuple(sorted(temps.items()))
                scope = scope_path(CURRENT.get())
                ev = (TEMPORARIES, now, total, device, 0, scope, (), "", 0, 0, name, per_device)
                self._append(ev, 0)
            self._heard(self._bytes, now, name, total)

    @property
    def recording(self) -> bool:
        """Whether the timeline is recording now."""
        return self._depth > 0

    @property
    def unseen(self) -> str | None:
        """Why plain jax.Arrays may be missing from the recording, or None when they were
        sampled (or marked with [`mark`][tidyjax.Timeline.mark]): the ``repr`` and the page
        show it beside the peak, which then counts only the arrays seen.

        ``"plain arrays not sampled: sample=None and no tl.mark()"`` (seen only at scope
        events and the stop), ``"plain arrays not recorded: arrays=False"``, or the sampler's
        failure. Saved by `dump`.
        """
        if self._loaded:
            return self._unseen_note
        if not self.arrays:
            return "plain arrays not recorded: arrays=False"
        with _locked():
            if self._sample_error is not None:
                return f"plain arrays sampled until the sampler failed ({self._sample_error})"
            if self.sample is None and not self._marked:
                return "plain arrays not sampled: sample=None and no tl.mark()"
        return None

    def _window(self) -> tuple[list[TimelineEvent], list[TimelineEvent]]:
        """What dropped events left alive, and the events kept: together, the whole replay
        (while recording, caught up first)."""
        with _locked():
            if self._depth:
                self._settle()
                self._check_deleted_buffers()
                self._name_variables()
            self._forget_failed()
            return self._public(self._base.values()), self._public(self._events)

    def _public(self, events: Iterable[Any]) -> list[TimelineEvent]:
        """Recorded events (see `_KIND`) as TimelineEvents (so many new objects, which make no
        cycle, would start collections of the whole heap: the collector waits). A loaded
        timeline holds TimelineEvents: it records nothing."""
        if self._loaded:
            return list(events)
        sites = self._sites
        out = []
        with collector_paused():
            for k, t, b, d, s, sc, sh, dt, ts, bu, nm, pd in events:
                if type(ts) is not tuple:
                    ts = (ts,) if ts else ()
                if pd is None:
                    pd = ((d, b),)
                ev = (k, t, b, d, sites[s], sc, sh, dt, ts, bu, nm, pd)
                out.append(_event(TimelineEvent, ev))
        return out

    def _entries(self) -> list[list[Any]]:
        """The live entries, each once, in the order recorded."""
        return list({id(e): e for e in self._live.values()}.values())

    def _forget_failed(self) -> None:
        """Rewrite to 0 bytes the allocations of live buffers whose computation has failed by
        now, with the total and the peak: such a buffer never held memory. JAX tells only when
        the array is waited for (the per-op path never asks), so this runs at a read or a stop,
        waiting for nothing."""
        amended: dict[int, tuple[Any, ...]] = {}
        lost = []  # (bytes, buffer number) of each allocation rewritten
        for entry in [*self._entries(), *self._plain.values()]:
            ev = entry[1]
            if ev[_BYTES] and failed(_first(entry)):
                zeros = ev[-1] and tuple((d, 0) for d, _ in ev[-1])  # per_device
                entry[1] = amended[id(ev)] = (*ev[:_BYTES], 0, *ev[_BYTES + 1 : -1], zeros)
                self._bytes -= ev[_BYTES]
                lost.append((ev[_BYTES], ev[_BUFFER]))
        if not amended:
            return
        self._amend(amended)
        self._base_bytes = sum(e[_BYTES] for e in self._base.values())
        if (older := self._dropped_best) is not None:  # a live buffer made by then was alive then
            cut = sum(b for b, buffer in lost if buffer <= older[3])
            self._dropped_best = (older[0] - cut, *older[1:])
        self._repeak()

    def _repeak(self) -> None:
        """The peak again, after allocations were rewritten smaller: over the moments that can be
        replayed, the peak among the dropped events (``_peak_live``), and an older moment among
        them (``_dropped_best``: its bytes are known, what was alive then is not)."""
        base = list(self._base.values())
        best = self._base_bytes  # summed afresh by _forget_failed, the one caller
        # the moment the dropped events left (the start when none were), before the first kept
        at = self._dropped_at if self.dropped else (self.start_time or 0.0)
        seq, live = self.dropped - 1, (base if self.dropped else None)
        dropped_peak = sum(e[_BYTES] for e in self._peak_live or ())
        if self._peak_live is not None and dropped_peak >= best:
            best, at, seq, live = dropped_peak, self.peak_time, self._peak_seq, self._peak_live
        older = self._dropped_best
        if older is not None and older[0] > best:
            best, at, seq, live = older[0], older[1], older[2], None
        most, i = _timeline_format.replay_peak(self._events, self._base_bytes)
        if most > best:  # the kept events reach more, first at self._events[i]
            best, at, seq, live = most, self._events[i][_TIME], self.dropped + i, None
        self.peak_bytes, self.peak_time, self._peak_seq, self._peak_live = best, at, seq, live

    def live_at(self, time: float) -> list[TensorRecord]:
        """The buffers alive at ``time`` (``time.perf_counter()``'s clock), oldest first.

        One [`tidyjax.TensorRecord`][tidyjax.TensorRecord] per buffer (a shared buffer once): ``id``
        is the Tensor that created it (0 if unknown), ``scope`` its owner when allocated. Their
        bytes add up to what ``memory().num_bytes`` reported at that moment.

        Raises:
            TidyjaxValueError: ``time`` is before the events kept, and older ones were dropped.
        """
        base, events = self._window()
        if self.dropped and events and time < events[0].time:
            if time == self.peak_time and self._peak_live is not None:
                return [_record(ev) for ev in self._public(self._peak_live)]
            raise TidyjaxValueError(
                f"the timeline cannot replay {time!r}: the {self.dropped} oldest events were "
                f"dropped and the events kept start at {events[0].time!r}. Record with a larger "
                "tidyjax.timeline(max_events=...)."
            )
        before = bisect.bisect_right([ev.time for ev in events], time) - 1
        alive = _timeline_html.alive_after(base, events, [before])[0]
        return [_record(ev) for ev in sorted(alive, key=lambda ev: ev.buffer)]

    def top_sites(self, at: float | None = None, n: int = 10) -> list[SiteStat]:
        """The creation sites holding the most bytes at ``at`` (default: the peak), largest
        first, as [`tidyjax.SiteStat`][tidyjax.SiteStat] (count, bytes, shapes)."""
        moment = self.peak_time if at is None else at
        return Snapshot(self.live_at(moment)).statistics()[:n]

    def __repr__(self) -> str:
        with _locked():
            self._forget_failed()
        state = "loaded" if self._loaded else "recording" if self._depth else "stopped"
        at = ""
        if self.start_time is not None and self.peak_bytes:
            at = f" at {_timeline_html.elapsed(self.peak_time - self.start_time)}"
        unseen = self.unseen
        note = f" ({unseen})" if unseen else ""
        call = self.device_peak_call
        if call is not None and self.start_time is not None:
            when = _timeline_html.elapsed(self.device_peak_time - self.start_time)
            note += (
                f", device peak {fmt_bytes(self.device_peak_bytes)} at {when} with the XLA "
                f"temporaries of {call}"
            )
        return (
            f"<tidyjax.Timeline {len(self._events)} events ({self.dropped} dropped), "
            f"peak {fmt_bytes(self.peak_bytes)}{at}{note}, {state}>"
        )

    # -- the page ---------------------------------------------------------------------------

    def to_html(self, *, top: int = 10, at: str | None = None) -> str:
        """The self-contained HTML page: live bytes over time by creation site (the ``top``
        largest, the rest as "other"), scopes as bands, annotations as vertical lines, the peak
        and what was alive then; with ``at``, the label of an annotation, what was alive at
        that annotation (the latest of that label) instead.

        Raises:
            TidyjaxValueError: no annotation has the label ``at``.
        """
        with _locked():
            found = [m for m in self._marks if m.label == at]  # none for at=None
        if at is not None and not found:
            known = ", ".join(repr(m.label) for m in self._marks[:5]) or "none"
            raise TidyjaxValueError(
                f"this Timeline has no annotation {at!r} (its annotations: {known}); "
                "mark one with tl.annotate(label) while it records."
            )
        return _timeline_html.page(self, top=top, at=found[-1] if found else None)

    def save_html(
        self, path: str | os.PathLike[str], *, top: int = 10, at: str | None = None
    ) -> None:
        """Write [`to_html`][tidyjax.Timeline.to_html] to ``path`` (UTF-8)."""
        pathlib.Path(path).write_text(self.to_html(top=top, at=at), encoding="utf-8")

    @_html.never_raises
    def _repr_html_(self) -> str:
        return _timeline_html.fragment(self)

    # -- files ------------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        """The timeline as JSON data (format ``"tidyjax.timeline"``, version 2): its numbers,
        then its events as columns (kind, scope, time, bytes, ...) and the tables of strings,
        sites and their frames they index (each site with its chain of user frames)."""
        base, events = self._window()
        header = {k: getattr(self, k) for k in _timeline_format.HEADER}
        peak_live = None if self._peak_live is None else self._public(self._peak_live)
        events, temporaries = split_temporaries(events)
        data = _timeline_format.encode(
            header, base, events, peak_live, self._stacks, self._names, self.annotations
        )
        if temporaries:  # a table of its own: an older tidyjax reads the file without them
            data["temporaries"] = temporaries
        unseen = self.unseen
        if unseen is not None:
            data["unseen"] = unseen
        return data

    def dump(self, path: str | os.PathLike[str]) -> None:
        """Write the timeline as JSON (read it back with `load`, or draw it with
        ``python -m tidyjax view FILE``)."""
        _timeline_format.write(self.to_json(), path)

    def to_chrome_trace(self, path: str | os.PathLike[str], *, buffers: bool = True) -> None:
        """Write the timeline as Chrome trace-event JSON, which Perfetto's UI and
        ``chrome://tracing`` open: a bytes-in-use counter per device, each scope a slice,
        with ``buffers`` an instant per allocation and free. Gzipped when ``path`` ends in
        ``.gz``; missing folders are created."""
        buffers = check_flag(buffers, "buffers", "Timeline.to_chrome_trace()")
        _timeline_format.write_chrome_trace(self, path, buffers=buffers)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Timeline:
        """Read a timeline written by [`dump`][tidyjax.Timeline.dump].

        Raises:
            TidyjaxValueError: the file is not JSON, or not a tidyjax timeline of a format
                version this tidyjax reads; the message says which.
        """
        return cls.from_json(_timeline_format.read(path), where=str(path))

    @classmethod
    def from_json(cls, data: Any, where: str = "the data") -> Timeline:
        """A timeline from `to_json`'s data (see `load` for the errors)."""
        data = _timeline_format.check(data, where)
        try:
            with collector_paused():
                codec = Codec.read(data)
                tl = cls(int(data["max_events"]))
                tl._loaded = True  # its events are TimelineEvents (see _public)
                events = codec.decode(data["events"], where, "event")
                tl._events.extend(merge_temporaries(data, events, where))
                tl._base = {ev.buffer: ev for ev in codec.decode(data["base"], where, "base event")}
                tl._replay_calls()
                if data.get("peak_live") is not None:
                    tl._peak_live = codec.decode(data["peak_live"], where, "peak event")
                for key in _timeline_format.HEADER:
                    setattr(tl, key, data[key])
                tl.peak_time = float(tl.peak_time)
                tl._stacks, tl._names, tl._marks = _timeline_format.decode_extras(data, codec)
                tl._unseen_note = data.get("unseen")  # checked (`check`): a str or null
        except TidyjaxValueError:
            raise
        except KeyError as e:
            raise TidyjaxValueError(f"{where} is a tidyjax timeline without {e}.") from e
        except (TypeError, ValueError, IndexError, AttributeError) as e:
            raise TidyjaxValueError(f"{where} is a malformed tidyjax timeline ({e}).") from e
        return tl

    def _replay_calls(self) -> None:
        """A loaded timeline's device peak, from its ``"temporaries"`` events."""
        running = sum(ev.bytes for ev in self._public(self._base.values()))
        for _, ev, sign in _timeline_format.replay((), self._public(self._events)):
            running += sign * ev.bytes
            if ev.kind == TEMPORARIES:
                self._heard(running, ev.time, ev.name, ev.bytes)

    @classmethod
    def from_snapshot(cls, snapshot: Snapshot) -> Timeline:
        """A timeline of one moment: each buffer of ``snapshot`` allocated in Tensor id order,
        so a snapshot draws on the same page (``python -m tidyjax view snapshot.json``)."""
        if not isinstance(snapshot, Snapshot):
            raise TidyjaxTypeError(
                f"from_snapshot() takes a tidyjax.Snapshot, got {type(snapshot).__name__}."
            )
        tl = cls()
        tl._loaded = True  # its events are TimelineEvents (see _public)
        tl.started_at = snapshot.taken_at
        tl.start_time = tl.stop_time = 0.0
        seen: dict[int, tuple[TensorRecord, list[int]]] = {}
        for r in snapshot.records:
            seen.setdefault(buffer_of(r), (r, []))[1].append(r.id)
        for n, (r, ids) in enumerate(seen.values(), 1):
            devices = r.devices or ("",)
            share = r.bytes // len(devices)  # how a buffer on several devices splits is not saved
            tl._append(TimelineEvent(
                ALLOC, 0.0, r.bytes, ",".join(devices), r.site, r.scope, r.shape, r.dtype,
                tuple(ids), n, "", tuple((d, share) for d in devices),
            ), r.bytes)  # fmt: skip
        return tl

    # -- recording --------------------------------------------------------------------------

    def __enter__(self) -> Timeline:
        if self._loaded:
            raise TidyjaxTypeError(
                "this Timeline was loaded from a file or a snapshot and cannot record; "
                "record a new one with tidyjax.timeline()."
            )
        with _locked():
            self._depth += 1
            if self._depth > 1:
                return self
            if self.start_time is None:
                self.started_at = time.time()
                self.start_time = self.peak_time = self._last = time.perf_counter()
            self.stop_time = None
            before = list(self._live)
            sampler = None
            if self.arrays:
                self._array_mark = ArrayMark()
                self._before, self._before_addr = self._array_mark.alive_at_mark(), None
                self._check_deleted()  # the plain arrays dropped or deleted while stopped
                if self.sample is not None:
                    sampler = self._sampler = _Sampler(self, self.sample)
            if self._listed:
                _recording.append(self)
            _registry.observers.append(self)
            opened = []  # the scopes open here now: drawn from the start
            scope = CURRENT.get()
            while scope is not None:
                opened.append(scope)
                scope = scope.parent
            for scope in reversed(opened):
                if id(scope) not in self._scopes:
                    self.event(SCOPE_ENTER, scope)
        # What is alive now, read outside our lock: the registry's lock is taken there, and a
        # collection inside that lock may report to us.
        try:
            found = self._alive()
            with _locked():
                self._reconcile(before, found)
                self._forget_failed()  # a buffer that failed before: not counted from the start
                self._name_variables()
            if sampler is not None:
                sampler.thread.start()
        except BaseException:  # (a KeyboardInterrupt, a MemoryError) not left recording
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        sampler = None
        try:
            if self._depth == 1 and self._array_mark is not None and may_wait():
                self._look_when_ready(first=True)  # the last look below waits for nothing
            with _locked():
                sampler = self._exit()
        finally:
            # The sampler's thread ends: it sees the stop at its next wait or lock, and never
            # records after it (joined outside the lock, which it may be waiting for).
            thread = sampler.thread if sampler is not None else threading.current_thread()
            if thread.is_alive() and thread is not threading.current_thread():
                thread.join(timeout=10.0)

    def _exit(self) -> _Sampler | None:
        """`__exit__` under the lock; the sampler stopped, to be joined."""
        sampler = None
        if self._depth == 0:
            raise TidyjaxTypeError("this Timeline is not recording; exit it once per entry.")
        if self._depth == 1:  # scopes still open end with the recording (resuming reopens)
            sampler, self._sampler = self._sampler, None
            if sampler is not None:
                sampler.stop.set()
            self._stopping = True  # a last look: what is still being computed is recorded now
            try:
                self._look()
            finally:
                self._stopping = False
            self._unready = []
            self._array_mark = None
            self._before, self._before_addr, self._before_todo = iter(()), None, []
            self._name_variables()
            for scope, number in list(self._scopes.values()):
                self._mark(SCOPE_EXIT, scope.path, scope.name or "<tidy>", number)
            self._scopes.clear()
        self._depth -= 1
        if self._depth:
            return sampler
        if self in _recording:
            _recording.remove(self)
        if self in _registry.observers:
            _registry.observers.remove(self)
        self.stop_time = time.perf_counter()
        self._forget_failed()  # so that peak_bytes, read now, counts no failed allocation
        return sampler

    async def __aenter__(self) -> Timeline:
        return self.__enter__()

    async def __aexit__(self, *exc: object) -> None:
        self.__exit__()

    def __call__(self, fn: F) -> F:
        """Decorate ``fn``: each call records into this timeline (``fn.timeline``)."""
        check_callable(
            fn, "a Timeline", decorator=True,
            hint="Use `with tidyjax.timeline() as tl:` around other code.",
        )  # fmt: skip
        run = decorate(fn, lambda: self, "a Timeline")
        run.timeline = self  # type: ignore[attr-defined]
        return run

    @contextlib.contextmanager
    def section(self, label: str) -> Iterator[Timeline]:
        """Record into this timeline (resuming it) and draw what the block did as a band named
        ``label``, as a scope is drawn: for recording notebook cells one by one.

        Example:
            ```python
            tl = tidyjax.timeline()
            with tl.section("In[3]"):
                ...
            ```
        """
        if not isinstance(label, str):
            raise TidyjaxTypeError(f"section() takes a str label, got {type(label).__name__}.")
        with self:
            with _locked():
                self._settle()
                number = self._next = self._next + 1
                self._mark(SCOPE_ENTER, label, label, number)
            try:
                yield self
            finally:
                with _locked():
                    self._see_arrays()
                    self._mark(SCOPE_EXIT, label, label, number)

    def annotate(self, label: str, bytes: int | None = None) -> Mark:
        """Mark the current moment with ``label`` (and a number of ``bytes`` that goes with it,
        such as a request's): the page draws it as a vertical line with its label, and
        ``to_html(at=label)`` shows what was alive then. Saved by `dump`.

        Example:
            ```python
            with tidyjax.timeline() as tl:
                train()
                tl.annotate("evaluation")
                evaluate()
            tl.save_html("memory.html", at="evaluation")
            ```

        Returns:
            The mark: a named tuple ``(time, label, bytes)``.

        Raises:
            TidyjaxTypeError: ``label`` is not a str, ``bytes`` not an int or None, or the
                timeline is not recording.
        """
        if not isinstance(label, str):
            raise TidyjaxTypeError(f"annotate() takes a str label, got {type(label).__name__}.")
        if bytes is not None and (isinstance(bytes, bool) or not isinstance(bytes, int)):
            raise TidyjaxTypeError(
                f"annotate()'s bytes must be an int or None, got {type(bytes).__name__}."
            )
        if self._array_mark is not None:  # what was made before it shows before it
            self._look_when_ready(first=True)
        with _locked():
            if not self._depth:
                raise TidyjaxTypeError(
                    f"this Timeline is not recording, so it cannot mark {label!r}; call "
                    "annotate() inside `with tl:`."
                )
            self._see_arrays()
            mark = Mark(max(time.perf_counter(), self._last), label, bytes)
            self._marks.append(mark)
            return mark

    def mark(self) -> None:
        """Look now at the plain jax.Arrays: record those made since the last scope event or
        mark and still alive, and the frees of those found deleted. The sampler (``sample``)
        does this on its own every few milliseconds; with ``sample=None`` call it once per step
        of a loop without scopes. It costs O(arrays made since the last look), plus one check
        of each plain array alive; it waits for a plain array still being computed (until then
        its allocation is unknown: it may be a new object over a Tensor's buffer), except on a
        thread the runtime made (a host callback's). With ``arrays=False`` it only settles
        tidyjax's own buffers (records just added, buffers deleted behind tidyjax's back); while
        not recording it does nothing."""
        with _locked():
            if self._depth:
                self._marked = True
            self._look()
        self._look_when_ready()

    def _look_when_ready(self, first: bool = False) -> None:
        """Wait for the plain arrays the last look (``first``: one made now) found still being
        computed, outside the lock (a host callback of their computation may be waiting for
        it), then look again."""
        if first:
            with _locked():
                self._look()
        if not self._unready or not may_wait():
            return
        for ref in list(self._unready):
            wait_ready(ref())
        with _locked():
            self._look()

    def _look(self) -> None:
        """`mark`'s look (under ``_lock``)."""
        if self._depth:  # also the buffers just added or deleted behind tidyjax's back
            self._settle()
            self._check_deleted_buffers()
            if self._array_mark is not None:
                self._see_arrays()
                self._check_deleted()

    def _alive(self) -> list[tuple[Any, Any]]:
        """The records counted now, each with the Tensors holding it (their ids are recorded)."""
        return holders(books()[0])

    def _reconcile(self, before: list[int], found: list[tuple[Any, Any]]) -> None:
        """What changed while not recording: the buffers of ``before`` (ids of records) freed or
        collected since, and those alive now (``found``: record, its Tensors) not recorded."""
        now = time.perf_counter()
        alive = {id(rec) for rec, _ in found}
        for key in before:
            entry = self._live.get(key)
            if entry is None or (key in alive and holds(entry[0])):
                continue
            if not self._leave(entry, entry[0]):
                self._free(entry, now)
        for rec, ts in found:
            if id(rec) not in self._live and rec.dead is None:
                ids = tuple(sorted(t.id for t in ts))
                twin = self._twin(rec) if _registry.has_groups() else None
                if twin is not None and len(twin) != 2:  # records over one buffer (_settle)
                    self._share(twin, rec, ids)
                else:  # a plain array seen before (adopted meanwhile) moves over: counted once
                    self._added(rec, now, ids)

    # -- the observer (see _registry) ------------------------------------------------------

    def event(self, kind: str, obj: Any, tensor: int = 0) -> None:
        """A change to the registry's books, or a scope entered or exited. ``tensor`` is the id
        of the Tensor made on the record (``"buffer_added"``, ``"tensor_added"``), 0 if none."""
        if kind == "joined" or (kind == "tensor_removed" and not released(obj)):
            return  # records over one buffer (found through the registry's index), a holder fewer
        if self._pending and _registry.suspects:
            self._ready_pending()
        if not _inbox and _acquire(True, _WAIT):  # the usual case
            try:
                self._event(kind, obj, tensor)
            finally:
                _release()
            if self._unready and kind in _SCOPE_KINDS:  # a scope's look left some: as a mark
                self._look_when_ready()
            if not _inbox:
                return
        else:
            _inbox.append((self, kind, obj, tensor))
        _pump()

    def _event(self, kind: str, obj: Any, tensor: int) -> None:
        """`event`, under ``_lock``."""
        if not self._depth:
            return
        if self._pending:  # first what came before: the buffers just added
            if kind == "buffer_freed":
                self._adopt_pending(obj)
            self._settle()
        if kind == "buffer_added" and getattr(obj(), "committed", False):
            self._pending.append((obj, time.perf_counter(), tensor))  # over a recorded one?
        elif kind == "buffer_added":
            self._added(obj, time.perf_counter(), (tensor,) if tensor else ())
        elif kind == "tensor_removed":
            # The last Tensor on an array nothing of tidyjax frees (see _census.released):
            # the array is plain again if it outlives the Tensor (decided at the next event:
            # dropped together, the array is collected first).
            self._pending.append((obj, time.perf_counter(), _LET_GO))
        elif kind in ("buffer_freed", "buffer_collected"):
            self._freed(obj)
        elif kind == "tensor_added":  # one more holder, or a caller's array tidyjax's again
            entry = self._live.get(id(obj))
            if entry is not None:
                self._hold(entry, obj, (tensor,), obj.more)
            elif holds(obj):
                self._added(obj, time.perf_counter(), (tensor,) if tensor else ())
        elif kind in (SCOPE_ENTER, SCOPE_EXIT):
            self._scope(kind, obj)
        elif kind == "split":
            self._split(obj, time.perf_counter())

    def _freed(self, rec: Any) -> None:
        """``rec`` was freed or collected: its buffer's free, unless another record holds it."""
        entry = self._live.get(id(rec))
        if entry is None:
            if self._deferred:  # not recorded yet: never is
                self._pending = [p for p in self._pending if p[0] is not rec]
                self._deferred = bool(self._pending)
            return
        if entry[3] and self._leave(entry, rec):  # the test inlined: per free
            if not rec.owned:  # a caller's array lives on
                self._left(entry, rec, time.perf_counter())
            return
        a = entry[1]
        if a[_SCOPE] == "<variable>" or a[_BUFFER] in self._names:
            self._vars_dirty = True  # a Variable's buffer (an assign's old value)
        # a caller's array lives on, plain again (with the views of its buffer)
        self._free(entry, time.perf_counter(), rec.arrays() if not rec.owned else ())

    def _scope(self, kind: str, scope: Any) -> None:
        """``scope`` entered or exited: its event, after the plain arrays made before it."""
        self._see_arrays()
        if kind == SCOPE_ENTER:
            number = self._next = self._next + 1
            self._scopes[id(scope)] = (scope, number)
        else:
            if self._variables_moved():
                self._name_variables()
            opened, number = self._scopes.pop(id(scope), (None, 0))
            if opened is not scope:  # entered before the recording started
                number = self._next = self._next + 1
        self._mark(kind, scope.path, scope.name or "<tidy>", number)

    def _mark(self, kind: str, path: str, name: str, number: int) -> None:
        """Record a scope event now."""
        self._append((kind, time.perf_counter(), 0, "", 0, path, (), "", 0, number, name, ()), 0)

    def _alloc(
        self, rec: Any, now: float, ids: tuple[int, ...], plain: list[Any] | None = None
    ) -> list[Any] | None:
        """Record ``rec``'s allocation; its new entry (None: recorded already, or no array).
        ``plain``: a plain entry over its buffer that the sampler recorded first
        (`_sampled_first`): its allocation becomes ``rec``'s (`_take_over`), unless it differs
        in bytes or placement (then it is freed first)."""
        arr = rec()
        if arr is None:
            arr = rec.array()  # its first object is gone: an alias, if any
        if arr is None or id(rec) in self._live:
            if plain is not None:
                self._free_plain(id(_first(plain)), plain, now)
            return None
        try:  # the cache read here: a call per allocation is a measurable part of its cost
            key = (arr.sharding, arr.shape, arr.dtype)
            layout = _layouts.get(key)
        except Exception:  # an array kind without these: `_layout` describes it the long way
            key, layout = None, None
        nbytes, device, per_device, shape, dtype = layout or _layout(rec, arr, key)
        if rec.nbytes < 0:
            rec.nbytes = nbytes
        if plain is not None:
            a = plain[1]  # its bytes, device and bytes per device, as _add_plain read them
            if (a[_BYTES], a[3], a[-1]) != (nbytes, device, per_device):
                self._free_plain(id(_first(plain)), plain, now)  # not told as the same one
                plain = None
        if plain is None:
            self._next += 1
            at, number = now, self._next
        else:  # the sampler's allocation event, told as tidyjax's: its moment and buffer number
            at, number = plain[1][_TIME], plain[1][_BUFFER]
        ev = (
            ALLOC, at, nbytes, device, self._site(arr), scope_path(rec.scope), shape, dtype,
            ids[0] if len(ids) == 1 else ids or 0, number, "", per_device,
        )  # fmt: skip
        entry = self._live[id(rec)] = [rec, ev, list(ids), None]
        if rec.__callback__ is None or rec.more:
            self._watch_arrays(rec)
        if plain is None:
            self._append(ev, nbytes)
        else:
            self._take_over(plain, ev)
        return entry

    def _take_over(self, plain: list[Any], ev: tuple[Any, ...]) -> None:
        """``ev`` (the same bytes, moment and buffer number) replaces the allocation event of
        ``plain``, which goes without a free: the total and the peak stay as they are."""
        del self._plain[id(_first(plain))]
        self._sampled_plain.pop(id(plain), None)
        old, events = plain[1], self._events
        for i in range(len(events) - 1, -1, -1):  # near the end: only the sampler's came since
            if events[i] is old:
                events[i] = ev
                return
        self._amend({id(old): ev})  # dropped meanwhile (max_events): where it went

    def _site(self, arr: Any) -> int:
        """The number of the creation site of ``arr``, a chain of user frames (read once per
        distinct creation traceback, `_site_and_stack`; see `_KIND`); its short stack (a cached
        tuple: its id is seen once) kept among the site's, at most 3."""
        tb = getattr(arr, "traceback", None)
        try:
            site, stack = _site_and_stack(tb)
        except TypeError:  # a jaxlib whose tracebacks do not hash
            site, stack = creation_site(arr), _traceback_stack(tb)
        if stack and id(stack) not in self._stack_ids:
            self._stack_ids.add(id(stack))
            stacks = [] if site is None else self._stacks.setdefault(site, [])
            if len(stacks) < 3 and stack not in stacks:
                stacks.append(stack)
        if site is None:
            return 0
        # keyed by the object (one per traceback, `_site_and_stack`), which _sites keeps
        number = self._site_index.get(id(site))
        if number is None:
            number = self._site_index[id(site)] = len(self._sites)
            self._sites.append(site)
        return number

    def _variables_moved(self) -> bool:
        """Whether a Variable may hold a buffer not named yet: Variables made or dropped, one's
        buffer freed (an ``assign``), or a buffer recorded since is one's (O(those buffers))."""
        if self._vars_dirty or _variable.num_variables() != self._vars_seen:
            return True
        upto = self._named_upto
        for entry in reversed(self._live.values()):  # in the order recorded: newest first
            if entry[1][_BUFFER] <= upto:
                return False
            if entry[0].scope is VARIABLE:
                return True
        return False

    def _name_variables(self) -> None:
        """Note the name of each named Variable whose buffer is live: the page's label for it."""
        if not _variable.num_variables():
            return
        self._vars_seen, self._named_upto = _variable.num_variables(), self._next
        self._vars_dirty = False
        live, names = self._live, self._names
        for v in _variable.live_variables():
            var, entry = getattr(v, "_var", None), live.get(id(record(v)))  # None: no record's id
            if var is not None and var.name is not None and entry is not None:
                names[entry[1][_BUFFER]] = var.name

    def _free(self, entry: list[Any], now: float, survivors: Any = ()) -> None:
        """Record the free of ``entry``'s buffer; ``survivors``: its array objects that live on
        as a plain array (a caller's, see ``_census.released``), its views joining them."""
        rec, a, ids, members = entry
        if self._live.get(id(rec)) is not entry:
            return  # freed already
        for r in members or (rec,):
            self._unlive(r, entry)
        # a's fields by position (a NamedTuple's names cost a lookup each)
        ev = (
            FREE, now, a[2], a[3], a[4], scope_path(rec.scope), a[6], a[7],
            ids[0] if len(ids) == 1 else tuple(ids) or 0, a[9], "",
            a[11],
        )  # fmt: skip
        self._append(ev, -a[2])
        if self._views:  # raw objects over a buffer that lived on: plain arrays now
            survivors = [*survivors, *self._pop_views(entry)]
        self._plain_again(survivors, now)

    def _plain_again(self, survivors: list[Any], now: float) -> None:
        """Array objects over a buffer no record holds any more (a caller's): one plain array,
        the others its views; one over another entry's buffer (a shard view of a plain array
        whose shard a Tensor's buffer shared) is that entry's view."""
        plain = None
        for arr in survivors if self._array_mark is not None else ():
            if arr.is_deleted():
                continue
            key = _buffer_key(arr)
            other = self._find_key(key) if key else None
            if other is not None:
                self._add_view(other, arr)
            elif plain is None:
                plain = self._add_plain(arr, now)
            else:
                self._add_view(plain, arr)

    # -- records over one buffer (a raw device_put's: a suspect of _registry), raw views ------

    def _added(
        self, rec: Any, now: float, ids: tuple[int, ...], plain: list[Any] | None = None
    ) -> None:
        """A new record (held by the Tensors ``ids``): its allocation; a plain array seen
        before (or its view, or ``plain``: an entry over its buffer, ignored unless a plain
        array's) moves over, becoming the entry's views, freed, or, when the sampler recorded it
        just before (`_sampled_first`), its allocation told as the record's. Over a recorded
        buffer: one more record on it."""
        entries = [plain]
        for arr in rec.arrays() if self._plain or self._view_of else ():
            entry = self._plain_of(arr) or self._view_entry(arr)  # the plain array, or its view
            if entry is None and (words := base_array(arr)) is not arr:  # a typed key: its
                entry = self._plain_of(words) or self._view_entry(words)  # words were listed
            if entry is not None and len(entry) != 2:  # a view of a recorded buffer
                self._share(entry, rec, ids)
                return
            entries.append(entry)
        found = {}  # the plain entries over the buffer, each once
        for entry in filter(None, entries):
            first = entry[0]()
            if first is not None and self._plain.get(id(first)) is entry:
                found[id(entry)] = entry
        # decided before any free: a free is an event recorded since the sampler's
        taken = next((e for e in found.values() if self._sampled_first(e)), None)
        moved: list[Any] = []
        for entry in found.values():
            first = entry[0]()
            moved += [first, *self._pop_views(entry)]
            if entry is not taken:
                self._free_plain(id(first), entry, now)
        entry = self._alloc(rec, now, ids, taken)
        if entry is None or not moved:
            return
        own = rec.arrays()
        for obj in moved:
            if all(obj is not a for a in own) and _registry.lookup(obj) is None:
                self._add_view(entry, obj)

    def _plain_of(self, arr: Any) -> list[Any] | None:
        entry = self._plain.get(id(arr))
        return entry if entry is not None and entry[0]() is arr else None

    def _view_entry(self, arr: Any) -> list[Any] | None:
        got = self._view_of.get(id(arr))
        return got[1] if got is not None and got[0]() is arr else None

    def _ready_pending(self) -> None:
        """Wait, before taking ``_lock``, for the buffers of the records just added that may be
        new objects over a recorded buffer (`_twin` reads their addresses): a host callback of
        their computation may need the lock (a mark). Not on a thread the runtime made (that
        callback's): `_settle` leaves those still being computed to the next."""
        if not may_wait():
            return
        pending = list(self._pending)
        window = len(pending) + 16
        for rec, _, tensor in pending:
            if tensor != _LET_GO and rec.dead is None and _maybe_alias(rec, window):
                wait_ready(rec.array())

    def _settle(self, upto: int | None = None) -> None:
        """Record the committed buffers just added: each an allocation, or one more record on a
        recorded buffer's entry; over a plain array's, the buffer is tidyjax's now (memory()).
        ``upto``: only the oldest ``upto`` of them (the sampler's, see `_sampled`)."""
        if not self._pending or (upto is not None and upto <= 0):
            return
        if upto is None:
            pending, self._pending = self._pending, []
        else:
            pending, self._pending = self._pending[:upto], self._pending[upto:]
        window = len(pending) + 16
        later = []  # on a thread the runtime made: the suspects still being computed
        wait = may_wait()
        for item in pending:
            rec, now, tensor = item
            if tensor == _LET_GO:
                self._let_go(rec, now)
            elif id(rec) in self._live:  # adopted meanwhile (_adopt_pending)
                continue
            elif not wait and _maybe_alias(rec, window) and computing(rec.array()):
                later.append(item)
            elif (entry := self._twin(rec, window)) is not None and len(entry) != 2:
                self._share(entry, rec, (tensor,))
            else:  # a suspect's entry found is a plain array's: over its buffer
                suspect = entry is not None and _maybe_alias(rec, window)
                self._added(rec, now, (tensor,) if tensor else (), entry if suspect else None)
        if later:
            self._pending[:0] = later
            self._deferred = True

    def _let_go(self, rec: Any, now: float) -> None:
        """No Tensor holds ``rec`` any more and nothing of tidyjax frees it: if its array
        outlived the Tensor, the buffer is a plain array again (see ``_census.released``)."""
        entry = self._live.get(id(rec))
        if entry is None or not released(rec) or rec.array() is None:
            return  # held again, freed, or collected (that event frees it)
        if self._leave(entry, rec):
            self._left(entry, rec, now)
        else:
            self._free(entry, now, rec.arrays())

    def _left(self, entry: list[Any], rec: Any, now: float) -> None:
        """``rec``, a caller's array, left ``entry``, whose other records hold the buffer still:
        its arrays are views of the buffer now, or, when those records hold only some of their
        allocations, a plain array again, whole, as ``memory()`` counts it (a caller's
        replicated array and the sharded Tensor made from it, whose shard on one device starts
        where the array's copy there does)."""
        arrays = [arr for arr in rec.arrays() if not arr.is_deleted()]
        key = _buffer_key(arrays[0]) if arrays else None
        if key is None or _holds(entry, key):
            for arr in arrays:
                self._add_view(entry, arr)
        else:
            self._plain_again(arrays, now)

    def _twin(self, rec: Any, window: int = 16) -> list[Any] | None:
        """The live entry of another record over ``rec``'s buffer (the registry groups them, or
        its index finds one sharing an allocation), or the plain array's entry over it, or
        None. Reads addresses only for a suspect of the registry (or one it found over a
        caller's array: not owned) or a dead record whose buffer lives on."""
        for other in _registry.grouped(rec) or ():
            entry = self._live.get(id(other))
            if other is not rec and entry is not None:
                return entry
        if rec.dead is not None or _maybe_alias(rec, window):
            arr = rec.array()
            if may_wait():  # as the registry waits for a suspect's (``_registry.resolve``)
                wait_ready(arr)  # an alias of a buffer still being computed is not ready either
            key = _buffer_key(arr)
            entry = self._find_key(key, rec) if key else None
            if entry is not None and entry[0] is not rec:
                return entry
        return None

    def _recorded(self, key: Any, rec: Any = None) -> list[Any] | None:
        """The live entry whose records hold every allocation of ``key``, or with ``rec`` (a
        record joining) any of them: read from the registry's allocation index."""
        held: dict[int, tuple[list[Any], set[Any]]] = {}
        for x, keys, _ in _registry.index_hits(dict.fromkeys(key, ())):
            entry = self._live.get(id(x)) if x is not rec else None
            if entry is not None and self._entry_alive(entry):
                held.setdefault(id(entry), (entry, set()))[1].update(keys)
        if rec is None:
            return next((e for e, got in held.values() if got.issuperset(key)), None)
        return next((e for e, _ in held.values()), None)

    def _entry_alive(self, entry: list[Any]) -> bool:
        """Whether ``entry`` is recorded and its buffer held: by any of its records (its first
        may be freed already while the registry's event of it is on its way: the sampler's
        thread looked in between)."""
        if len(entry) == 2:  # a plain array's
            first = entry[0]()
            return first is not None and self._plain.get(id(first)) is entry
        if self._live.get(id(entry[0])) is not entry:
            return False
        return entry[0].dead is None or any(m.dead is None for m in entry[3] or ())

    def _find_key(self, key: Any, rec: Any = None) -> list[Any] | None:
        """The live or plain entry over the buffer at ``key`` (an array's allocations,
        `_buffer_key`; with ``rec``, a record joining, a live entry sharing any of them): a live
        entry before a plain one (a caller's array may share an allocation with a Tensor's)."""
        return self._recorded(key, rec) or self._plain_over(key)

    def _plain_over(self, key: Any) -> list[Any] | None:
        """The plain entry over the buffer at ``key``, from the plain arrays' own index (the
        registry knows no plain array). Each plain array's addresses are read once, when ready."""
        todo, self._addr_todo = self._addr_todo, []
        index = self._addr
        for aid in todo:
            entry = self._plain.get(aid)
            if entry is None or not self._entry_alive(entry):
                continue
            if computing(first := entry[0]()):  # asked first (see _registry._index_record)
                self._addr_todo.append(aid)  # not ready yet: read at a later look
            elif k := _buffer_key(first):
                for at in (k, *((p,) for p in k)):  # and its per-shard views
                    slot = index.setdefault(at, [])
                    if all(e is not entry for e in slot):
                        slot.append(entry)
        if len(index) > 4096 and len(index) > 4 * len(self._plain):
            self._addr = index = {
                k: alive for k, slot in index.items() if (alive := self._alive_in(slot, None))
            }
        found = index.get(key)
        if not found and len(key) > 1:  # a copy over fewer devices made of its shards
            slots = [index.get((p,), []) for p in key]
            found = [e for e in slots[0] if all(any(e is f for f in s) for s in slots[1:])]
        if not found:
            return None
        alive = self._alive_in(found, key)
        if len(alive) != len(found) and key in index:  # freed: its address may be reused
            if alive:
                index[key] = alive
            else:
                del index[key]
        return alive[0] if alive else None

    def _alive_in(self, slot: list[list[Any]], key: Any) -> list[list[Any]]:
        """The entries of an index slot still alive (holding ``key``, unless None)."""
        return [e for e in slot if self._entry_alive(e) and (key is None or _holds(e, key))]

    def _share(self, entry: list[Any], rec: Any, tensors: tuple[int, ...]) -> None:
        """``rec`` (Tensor ids ``tensors``) is one more record over ``entry``'s buffer: no alloc."""
        members = entry[3] = entry[3] or [entry[0]]  # None while the buffer had one record
        if all(m is not rec for m in members):
            members.append(rec)
        self._live[id(rec)] = entry
        self._relayout(entry)
        for arr in rec.arrays() if self._plain else ():  # a plain array before: a view now
            plain = self._plain_of(arr)
            if plain is not None:
                self._free_plain(id(arr), plain, time.perf_counter())
        self._hold(entry, rec, tensors, rec.__callback__ is None or rec.more)

    def _hold(self, entry: list[Any], rec: Any, tensors: Any, watch: Any) -> None:
        """``tensors`` (ids, 0 for none) hold ``entry``'s buffer too; ``watch``: follow the
        collection of ``rec``'s arrays (see `_watch_arrays`)."""
        entry[2].extend(t for t in dict.fromkeys(tensors) if t and t not in entry[2])
        if watch:
            self._watch_arrays(rec)

    def _leave(self, entry: list[Any], rec: Any) -> bool:
        """``rec`` leaves its entry (freed, dropped or collected); whether another record over the
        buffer still holds it (then nothing is freed)."""
        members = [m for m in entry[3] or () if m is not rec]
        alive = [m for m in members if holds(m)]
        if not alive:  # none, or no other record over it
            return False
        entry[3] = members
        self._unlive(rec, entry)
        if entry[0] is rec:
            entry[0] = alive[0]
        self._relayout(entry)
        return True

    def _split(self, rec: Any, now: float) -> None:
        """The registry split a group: ``rec``'s records (its group now) are a buffer of their
        own, no longer one with the others of ``rec``'s entry: an allocation event of their own
        now (counted apart from now on, as ``memory()`` counts them), and the entry's told again
        with what the others hold."""
        group = _registry.grouped(rec) or (rec,)
        entry = next((e for r in group if (e := self._live.get(id(r))) is not None), None)
        if entry is None or not entry[3]:
            return
        moving = [m for m in entry[3] if any(m is r for r in group)]
        staying = [m for m in entry[3] if all(m is not r for r in group)]
        if not moving or not [m for m in staying if holds(m)]:
            return
        for m in moving:
            self._unlive(m, entry)
        entry[3] = staying
        if all(entry[0] is not m for m in staying):
            entry[0] = next((m for m in staying if holds(m)), staying[0])
        self._relayout(entry)
        first, *others = [m for m in moving if holds(m)] or moving
        new = self._alloc(first, now, ())
        if new is not None:
            for other in others:
                self._share(new, other, ())

    def _relayout(self, entry: list[Any]) -> None:
        """The records over ``entry``'s buffer changed: when they hold it on other devices now
        (a replicated array made from a one-device one shares its shard there and adds the
        others; then it went), its allocation is told again with the bytes on each device they
        hold, as ``memory().bytes_per_device`` counts them: a free and an alloc of the same
        bytes at one moment (no peak). One record holds its sharding's layout, read from it;
        of several, their allocations are read (`group_spread`): two of one sharding may share
        only some (two copies replicated over four devices of one array on one of them share
        that one's allocation, and hold three each of their own)."""
        members = [m for m in entry[3] or (entry[0],) if holds(m)]
        arrays = [arr for m in members if (arr := m.array()) is not None]
        if not arrays:
            return
        a = entry[1]
        if len(arrays) == 1:
            device, per_device = _placement(arrays[0], a[_BYTES])
            spread = sorted(per_device or ((device, a[_BYTES]),))
        else:
            spread = sorted((_name(d), b) for d, b in group_spread(members).items())
        if not spread or spread == sorted(a[_PER_DEVICE] or ((a[3], a[_BYTES]),)):
            return
        now = time.perf_counter()
        rec, ids = entry[0], entry[2]
        free = (
            FREE, now, a[_BYTES], a[3], a[4], scope_path(rec.scope), a[6], a[7],
            ids[0] if len(ids) == 1 else tuple(ids) or 0, a[_BUFFER], "", a[_PER_DEVICE],
        )  # fmt: skip
        self._append(free, -a[_BYTES])
        self._next += 1
        if a[_BUFFER] in self._names:  # a Variable's buffer: the same name
            self._names[self._next] = self._names[a[_BUFFER]]
        one = len(spread) == 1
        device = spread[0][0] if one else ",".join(n for n, _ in spread)
        layout = None if one else tuple(spread)
        ev = (ALLOC, now, a[_BYTES], device, *a[4:_BUFFER], self._next, "", layout)
        entry[1] = ev
        self._append(ev, a[_BYTES])

    def _unlive(self, rec: Any, entry: list[Any]) -> None:
        if self._live.get(id(rec)) is entry:
            del self._live[id(rec)]
        if self._watch:
            self._watch.pop(id(rec), None)

    def _adopt_pending(self, rec: Any) -> None:
        """Before ``rec``'s free (under ``_lock``): a record just added over its buffer takes
        the buffer on (``rec`` dropped from its group while its buffer lives on)."""
        entry = self._live.get(id(rec))
        if entry is None:
            return
        added = {id(r): (r, t) for r, _, t in self._pending if t != _LET_GO}
        for other in same_buffer(rec.array(), [r for r, _ in added.values()]):
            self._share(entry, other, (added[id(other)][1],))

    def _add_view(self, entry: list[Any], arr: Any) -> None:
        """``arr`` is one more array object over ``entry``'s buffer (no allocation)."""
        if self._view_entry(arr) is not None:
            return  # a view already
        ref = weakref.ref(arr)
        self._views.setdefault(id(entry), [entry, []])[1].append((id(arr), ref))
        self._view_of[id(arr)] = (ref, entry)

    def _pop_views(self, entry: list[Any]) -> list[Any]:
        """Forget the views of ``entry`` (freed, or moved); those still alive."""
        views: list[tuple[int, Any]] = self._views.pop(id(entry), (entry, []))[1]
        for key, ref in views:
            if self._view_of.get(key, (None,))[0] is ref:
                del self._view_of[key]
        return [view for _, ref in views if (view := ref()) is not None]

    def _check_deleted_buffers(self) -> None:
        """Record the frees of recorded buffers deleted behind tidyjax's back (a raw ``jax.jit``
        donation, ``delete()``: the registry reports none): O(buffers alive)."""
        now = time.perf_counter()
        for entry in self._entries():
            arr = entry[0].array()
            if arr is not None and arr.is_deleted():
                self._free(entry, now)

    def _watch_arrays(self, rec: Any) -> None:
        _tally.follow(self._watch, rec, self._collected)

    def _collected(self, rec: Any, _ref: Any) -> None:
        if rec.dead is None and rec.array() is None:
            self.event("buffer_collected", rec)

    # -- plain jax.Arrays ------------------------------------------------------------------

    def _see_arrays(self) -> None:
        """Record the plain arrays made since the last look and still alive (a look other than
        the sampler's: what the sampler recorded is plain from now on, `_sampled_first`)."""
        self._settle()
        self._sampled_plain.clear()
        arrays = self._array_mark.advance() if self._array_mark is not None else None
        arrays = arrays[::-1] if arrays else []  # oldest first: buffer numbers in creation order
        if self._unready:  # older still
            unready, self._unready = self._unready, []
            arrays[:0] = [a for ref in unready if (a := ref()) is not None]
        if arrays:
            self._feed(arrays)

    def _sampled(self, arrays: list[Any]) -> list[Any]:
        """The sampler's look (under ``_lock``): ``arrays`` (oldest first, ready, not failed)
        recorded as a mark records what it finds, and the frees of plain arrays deleted; those
        left to its next look (over the buffer of a record still pending, `_feed`)."""
        if not self._depth or self._array_mark is None:
            return []
        # Only the records its last look saw pending: one just added may still be becoming a
        # suspect of the registry (published first, suspected next: `_tensor.wrap_foreign`),
        # and settled before that, a new object over a recorded buffer would be an allocation.
        # The thread adding it settles it at its next event, or this thread at its next look.
        seen, n = self._pending_seen
        self._settle(n if seen is self._pending else 0)
        if self.dropped + len(self._events) != self._sampled_upto:
            self._sampled_plain.clear()  # something else was recorded since its last look
        later = self._feed(arrays, sampled=True) if arrays else []
        self._check_deleted()
        self._sampled_upto = self.dropped + len(self._events)
        self._pending_seen = (self._pending, len(self._pending))
        return later

    def _sampled_first(self, entry: list[Any]) -> bool:
        """Whether the plain ``entry`` is the sampler's record of an array that nothing else has
        seen yet: nothing but the sampler's looks recorded since, and no other look (a mark, a
        scope event, the stop). If tidyjax takes the array on now, a run without the sampler
        could never have told it apart from a Tensor's made then (the sampler saw the array
        between JAX making it and tidyjax recording it: an op's thread that stalled), so its
        allocation is told as tidyjax's (its site and scope, from that moment) instead of a
        plain array's freed and a Tensor's allocated: the same record whichever came first."""
        return (
            self._sampled_plain.get(id(entry)) is entry
            and self.dropped + len(self._events) == self._sampled_upto
        )

    def _feed(self, arrays: list[Any], sampled: bool = False) -> list[Any]:
        """Record ``arrays`` (oldest first) unless known: each a plain array's allocation, or a
        view of a recorded buffer. ``sampled``: by the sampler (see `_sampled_first`), which
        leaves to its next look (returned) a new object over the buffer of a record it may not
        settle yet (`_sampled`): recorded now, it would count that buffer twice. Another look
        leaves an array still being computed to the next (`_unready`; a mark, an annotation, a
        scope event and the stop wait for it after letting the lock go, then look again): until
        it is, its allocation is unknown, and a new object over a recorded buffer would be
        counted as one of its own. The stop's last look records it as it is."""
        now = time.perf_counter()
        held = watched_ids(watched()) if _watch.any_watched() else ()  # a watched object's: apart
        named: dict[int, tuple[Any, ...]] = {}
        later: list[Any] = []
        defer = not sampled and self._array_mark is not None and not self._stopping
        for arr in arrays:
            # (a caller's array no Tensor holds any more, `released`, is a plain array again:
            # over a buffer other records hold, one of their views; seen late, its record may
            # have been let go since it was made)
            plain = (rec := _registry.lookup(arr)) is None or released(rec)
            if plain and defer and computing(arr):  # asked first (see _registry._index_record)
                self._unready.append(weakref.ref(arr))
                continue
            key = _buffer_key(arr) if plain else None
            entry = self._find_key(key) if key else None
            if entry is None and key and self._made_before(key):
                continue  # a new object over a buffer alive before the recording: not counted
            if entry is None and key and sampled and self._pending_over(key):
                later.append(arr)
                continue
            if entry is None or (len(entry) == 2 and entry[0]() is arr):  # or the array itself
                scope = WATCHED if id(arr) in held else UNTRACKED
                entry = self._add_plain(arr, now, scope, sampled)
                if entry is not None and entry[1][_SCOPE] != scope == WATCHED:
                    # Seen (sampled) before watch() named it: watched from its allocation, as
                    # a look after the watch would have recorded it (the same bytes).
                    a = entry[1]
                    entry[1] = named[id(a)] = (*a[:_SCOPE], WATCHED, *a[_SCOPE + 1 :])
            else:  # a raw object over a recorded buffer (a raw device_put, a cached shard view)
                self._add_view(entry, arr)
        if named:
            self._amend(named)
        return later

    def _pending_over(self, key: Any) -> bool:
        """Whether a record just added (not settled yet) holds an allocation of ``key``."""
        for rec, _, tensor in self._pending:
            arr = rec.array() if tensor != _LET_GO else None
            other = _buffer_key(arr) if arr is not None else None
            if other and not set(other).isdisjoint(key):
                return True
        return False

    def _made_before(self, key: Any) -> bool:
        """Whether the buffer at ``key`` (an array's addresses, `_buffer_key`) is that of a plain
        array alive when the recording started: a new object over it holds no new memory, and
        the buffer itself was never counted. JAX makes such an object when an array's value is
        read (a shard view it caches on the array: ``repr``, ``print``), and on JAX 0.6 when its
        address is read too (``memory()``'s census, an out-of-memory report): counted, the
        array made before the timeline would show as made in it. The addresses of the arrays
        alive at the start are read once, at the first need (O(those arrays))."""
        if self._before_addr is None:
            self._before_addr, self._before_todo = {}, list(self._before)
            self._before = iter(())
        index, todo = self._before_addr, self._before_todo
        if todo:
            self._before_todo = []
            for ref in todo:
                arr = ref()
                rec = _registry.lookup(arr) if arr is not None else None
                if arr is None or (rec is not None and not released(rec)):
                    continue  # gone, or a Tensor's: its entry knows the objects over it
                if computing(arr):  # asked first (see _registry._index_record)
                    self._before_todo.append(ref)  # still computing: read at a later need
                elif k := _buffer_key(arr):
                    index[k] = ref
                    for p in k:
                        index.setdefault((p,), ref)  # its per-shard views
        found = index.get(key)
        if found is None and len(key) > 1:  # over fewer devices, made of one array's shards
            refs = [index.get((p,)) for p in key]
            if all(r is refs[0] for r in refs):
                found = refs[0]
        old = found() if found is not None else None
        return old is not None and not old.is_deleted()  # (a freed one's address is reused)

    def _amend(self, amended: dict[int, tuple[Any, ...]]) -> None:
        """Replace recorded events: ``amended`` maps the id of each to its new version."""
        self._events = collections.deque(amended.get(id(e), e) for e in self._events)
        self._base = {k: amended.get(id(e), e) for k, e in self._base.items()}
        if self._peak_live is not None:
            self._peak_live = [amended.get(id(e), e) for e in self._peak_live]

    def _add_plain(
        self, arr: Any, now: float, scope: str = UNTRACKED, sampled: bool = False
    ) -> list[Any] | None:
        """Record ``arr``'s allocation unless it is known, deleted or a Tensor's; its entry, or
        None. ``scope``: ``<watched>`` for a watched object's array, else ``<untracked>``;
        ``sampled``: the sampler records it (see `_sampled_first`)."""
        key = id(arr)
        entry = self._plain.get(key)
        if entry is not None:
            if entry[0]() is arr:
                return entry
            self._free_plain(key, entry, now)  # a dead array whose id was reused
        try:
            rec = _registry.lookup(arr)
            if arr.is_deleted() or (rec is not None and not released(rec)):
                return None  # freed already, or a Tensor's: the registry reports it
            nbytes = 0 if failed(arr) else local_nbytes(arr)
            device, per_device = _placement(arr, nbytes)
            ev = (
                ALLOC, now, nbytes, device, self._site(arr), scope, _same(tuple(arr.shape)),
                _name(arr.dtype), (), self._next + 1, "", per_device,
            )  # fmt: skip
            ref = weakref.ref(arr, functools.partial(self._plain_collected, key))
        except Exception:  # not an array tidyjax can describe (no weak reference, no dtype)
            return None
        self._next += 1
        entry = self._plain[key] = [ref, ev]
        todo = self._addr_todo
        todo.append(key)
        if len(todo) > 4096 and len(todo) > 2 * len(self._plain):
            self._addr_todo = [k for k in todo if k in self._plain]
        self._append(ev, nbytes)
        if sampled:
            self._sampled_plain[id(entry)] = entry
        return entry

    def _check_deleted(self) -> None:
        """Record the frees of the plain arrays dropped or deleted (O(plain arrays alive))."""
        now = time.perf_counter()
        for key, entry in list(self._plain.items()):
            arr = entry[0]()
            if arr is None:
                self._plain_gone(key, entry, now)
            elif arr.is_deleted():
                self._free_plain(key, entry, now)

    def _plain_collected(self, key: int, ref: Any) -> None:
        """A plain array was dropped (while stopped: recorded when recording resumes; then
        the lock is not taken, nor at interpreter exit, when the module may be torn down)."""
        if not self._depth or _running is not True:
            return
        with _locked():
            entry = self._plain.get(key)
            if entry is not None and entry[0] is ref and self._depth:
                self._plain_gone(key, entry, time.perf_counter())

    def _plain_gone(self, key: int, entry: list[Any], now: float) -> None:
        """A plain array was dropped: its buffer is freed, unless a view of it lives on (then
        that view holds the buffer, under the same entry)."""
        views = [v for v in self._pop_views(entry) if not v.is_deleted()] if self._views else []
        if not views or self._plain.get(key) is not entry:
            return self._free_plain(key, entry, now)
        del self._plain[key]
        vkey = id(views[0])
        entry[0] = weakref.ref(views[0], functools.partial(self._plain_collected, vkey))
        if vkey in self._plain:  # a stale entry of a dead array under that id
            self._free_plain(vkey, self._plain[vkey], now)
        self._plain[vkey] = entry
        self._addr_todo.append(vkey)  # its key in the todo list was the dropped array's
        for view in views[1:]:
            self._add_view(entry, view)

    def _free_plain(self, key: int, entry: list[Any], now: float) -> None:
        if self._plain.get(key) is not entry:
            return  # recorded already (a collection ran a callback meanwhile)
        del self._plain[key]
        if self._views:
            self._pop_views(entry)
        a = entry[1]
        self._append((FREE, now, *a[_BYTES:]), -a[_BYTES])

    def _append(self, ev: tuple[Any, ...], delta: int) -> None:
        """Keep ``ev`` (see `_KIND`), moving the running total by ``delta``."""
        if ev[_TIME] < self._last:  # a handler ran inside another one (a collection)
            ev = (ev[0], self._last, *ev[_BYTES:])
        self._last = ev[_TIME]
        events = self._events
        if len(events) >= self.max_events:  # the oldest dropped: what it leaves goes to _base
            old = events.popleft()
            self.dropped += 1
            self._dropped_at = old[_TIME]
            if old[_KIND] == ALLOC:
                self._base[old[_BUFFER]] = old
                total = self._base_bytes = self._base_bytes + old[_BYTES]
                if self._dropped_best is None or total > self._dropped_best[0]:
                    self._dropped_best = (total, old[_TIME], self.dropped - 1, old[_BUFFER])
            elif old[_KIND] == FREE:
                gone = self._base.pop(old[_BUFFER], None)
                if gone is not None:
                    self._base_bytes -= gone[_BYTES]
            if self.dropped - 1 == self._peak_seq:  # the peak can no longer be replayed
                self._peak_live = list(self._base.values())
        events.append(ev)
        if delta:
            total = self._bytes = self._bytes + delta
            if total > self.peak_bytes:
                self.peak_bytes, self.peak_time, self._peak_live = total, ev[_TIME], None
                self._peak_seq = self.dropped + len(events) - 1


Timeline.__module__ = "tidyjax"


@overload
def timeline(
    fn: None = None,
    /,
    *,
    max_events: int = 1_000_000,
    arrays: bool = True,
    sample: float | None = SAMPLE,
) -> Timeline: ...
@overload
def timeline(
    fn: F, /, *, max_events: int = 1_000_000, arrays: bool = True, sample: float | None = SAMPLE
) -> F: ...


def timeline(
    fn: Any = None,
    /,
    *,
    max_events: int = 1_000_000,
    arrays: bool = True,
    sample: float | None = SAMPLE,
) -> Any:
    """Record every allocation, free and scope of device memory, with its time.

    Every form:

    ```python
    with tidyjax.timeline() as tl:       # tl fills while the block runs
        ...
    tl.save_html("memory.html")          # live bytes over time by creation site

    @tidyjax.timeline                    # each call records into step.timeline
    def step(x): ...

    tl = tidyjax.timeline(max_events=10_000)
    @tl                                  # the same, into tl
    def step(x): ...
    ```

    Records process-wide (every thread) while open; timelines nest. With no timeline open this
    costs nothing. Beyond ``max_events`` the oldest events are dropped (``tl.dropped``).

    Tidyjax's buffers are recorded as they are allocated and freed; with ``arrays`` (the
    default) also the plain jax.Arrays no Tensor holds (an NNX or Equinox program's), as
    `Timeline` describes. ``arrays=False`` records tidyjax's buffers only.

    JAX tells nobody when it makes an array, so while the timeline records, a thread looks at
    the live arrays every ``sample`` seconds (5 ms by default; None or 0: no thread), and an
    array alive for two intervals is seen without any [`mark`][tidyjax.Timeline.mark] call
    (only ready buffers, each once). With ``sample=None`` they are seen only at scope events,
    ``mark()`` and the stop, and ``tl.unseen``, the ``repr`` and the page say so.

    Raises:
        TidyjaxTypeError: ``max_events`` is not an int, ``arrays`` not a bool, ``sample`` not
            a number or None, or ``fn`` is not a function.
        TidyjaxValueError: ``max_events`` is below 1, or ``sample`` outside 0.0001 to 60
            seconds (and not 0).
    """
    if isinstance(max_events, bool) or not isinstance(max_events, int):
        raise TidyjaxTypeError(f"max_events must be an int, got {type(max_events).__name__}.")
    if max_events < 1:
        raise TidyjaxValueError(f"max_events must be at least 1, got {max_events}.")
    arrays = check_flag(arrays, "arrays", "timeline()")
    tl = Timeline(max_events, arrays, _check_sample(sample, "timeline()"))
    return tl if fn is None else tl(fn)


def active() -> Timeline | None:
    """The innermost open timeline (the one started last and still recording), or None."""
    with _locked():
        return _recording[-1] if _recording else None
