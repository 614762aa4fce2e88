"""Out-of-memory errors that say what holds the memory: ``OutOfMemoryError``, ``oom_report``.

When JAX cannot allocate, it raises a ``JaxRuntimeError`` whose message starts with
``RESOURCE_EXHAUSTED`` (``INTERNAL: ... Out of memory`` when an op reads an array whose own
allocation failed). tidyjax's call sites (operators, lifted calls, ``tensor()``, the
transformations, the Tensor methods that wait for a value) catch it and call
``_context.on_jax_error``, which `install` (at package import) makes `raise_for`: it raises
`OutOfMemoryError` with an `OOMReport` (what was asked for, the largest live holders by
creation site and scope, tidyjax's and the untracked arrays' apart); any other error passes
through untouched, and the core never imports this module. The census and the timeline are
imported when a report is built.
"""

from __future__ import annotations

import contextvars
import dataclasses
import datetime
import itertools
import os
import pathlib
import re
import sys
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import jax
from jax.errors import JaxRuntimeError

from . import _html, _registry
from ._arrays import CONCRETE, describe, failed  # failed: re-exported (it lived here)
from ._context import set_jax_error_hook
from ._decorating import decorate
from ._errors import OutOfMemoryError, TidyjaxTypeError, donated
from ._format import count, esc, fmt_bytes
from ._memory import device_stats
from ._plan import call_figures, call_shapes
from ._tensor import disposed_error, held_array, record
from ._trees import tensors_in

if TYPE_CHECKING:
    from ._census import SiteStat, WatchedUsage

__all__ = ["OOMReport", "failed", "install", "oom_report", "raise_for"]

F = TypeVar("F", bound=Callable[..., Any])

#: How many holder rows of each kind (tidyjax's, untracked) a message lists.
TOP = 8
# Where JAX says how many bytes it wanted: CPU "allocating 400 bytes", GPU "while trying to
# allocate 400 bytes", the BFC allocator "8.00GiB (rounded to 8589934592)" and "(8589934592B)".
_REQUESTED = re.compile(r"(\d+) ?bytes|rounded to (\d+)|\((\d+)B\)")


def is_oom(err: BaseException) -> bool:
    """Whether ``err`` is JAX's out-of-memory error (not already tidyjax's)."""
    if not isinstance(err, JaxRuntimeError) or isinstance(err, OutOfMemoryError):
        return False
    text = str(err)
    return "RESOURCE_EXHAUSTED" in text or "Out of memory" in text


def install() -> None:
    """Make `raise_for` the core's handler of JAX's runtime errors (``_context.on_jax_error``).
    Called once, at package import."""
    set_jax_error_hook(raise_for)


def raise_for(
    err: BaseException,
    what: str,
    operands: tuple[Any, ...] = (),
    method: bool = False,
    call: tuple[Any, tuple[Any, ...], dict[str, Any]] | None = None,
) -> None:
    """Raise tidyjax's error for JAX's runtime error ``err`` in an op, else return (the caller
    re-raises it): out of memory, `OutOfMemoryError` (after a Tensor method waited, ``method``,
    naming the method, the Tensor and where it was computed); an operand Tensor whose buffer
    was deleted behind tidyjax's back (``t.array.delete()``), `DisposedError` saying so."""
    if is_oom(err):
        if method:
            _raise(err, _waited_text(operands[0], what), ())
        _raise(err, what, operands, call)
    if "deleted" in str(err):  # "Array has been deleted", "... on deleted or donated buffer"
        for t in tensors_in(operands):
            rec = record(t)
            if (
                rec is not None
                and rec.dead is None
                and getattr(held_array(t), "is_deleted", bool)()
            ):
                _registry.check(rec)
                raise disposed_error(t) from err


def _raise(
    err: BaseException,
    what: str,
    operands: tuple[Any, ...],
    call: tuple[Any, tuple[Any, ...], dict[str, Any]] | None = None,
) -> NoReturn:
    """Raise `OutOfMemoryError` with the report for ``err``; a report that itself fails still
    gives the request and says why. ``call``: the compiled call that failed, whose XLA figures
    the report states."""
    figures = _call_figures(call)  # before `_consumed`: a donated argument's shape is read
    donated = _consumed(operands, what)  # a transformation's `what`: its function's __qualname__
    what, called_at, message = _call_text(what, operands), _call_site(err), str(err)
    requested = requested_bytes(message)
    files, problems = _save_timeline(what, requested, called_at)
    token = _reporting.set(err)
    try:
        report = _holders_report()
    except Exception as e:  # a broken report must not hide the out-of-memory error
        report = OOMReport(what, requested)
        problems += (f"(The list of holders failed: {type(e).__name__}: {e}.)",)
    finally:
        _reporting.reset(token)
    report = dataclasses.replace(
        report, what=what, requested=requested, files=files, jax_message=message,
        problems=problems, called_at=called_at, donated=donated, call=figures,
    )  # fmt: skip
    raise OutOfMemoryError(str(report), report, getattr(err, "error_code", None)) from err


def _call_figures(
    call: tuple[Any, tuple[Any, ...], dict[str, Any]] | None,
) -> Mapping[str, int | None] | None:
    """XLA's figures of the failed call (`_plan.call_figures`, from its arguments' shapes:
    compiled, not run), or None; a failure to plan never hides the out-of-memory error."""
    if call is None:
        return None
    fn, args, kwargs = call
    try:
        shapes = call_shapes(args, kwargs)
        return dict(call_figures(fn, shapes[0], shapes[1], stacklevel=2, warn=False).figures)
    except Exception:
        return None


def _consumed(operands: tuple[Any, ...], name: str) -> tuple[str, ...]:
    """Mark donated as ``name``'s the operand Tensors whose buffers the failed call deleted
    (JAX deletes a donated buffer when the call starts, even one that then runs out of memory),
    and describe them."""
    out = []
    for t in tensors_in(operands):
        rec = record(t)
        arr = held_array(t)
        if (
            rec is not None
            and rec is not _registry.UNTRACKED
            and rec.dead is None
            and type(arr) in CONCRETE
            and arr.is_deleted()
        ):
            out.append(f"{describe(arr)} ({fmt_bytes(int(arr.nbytes))})")
            _registry.kill(rec, donated(name))
    return tuple(out)


def _call_site(err: BaseException) -> str | None:
    """The user's line that called into tidyjax, JAX or the failed block: the innermost calling
    frame outside tidyjax, JAX and installed code, at the line the error passed through when
    it is in the error's traceback too (the body of ``with oom_report()``)."""
    from ._sites import site_of_stack

    lines = {id(f): line for f, line in traceback.walk_tb(err.__traceback__)}
    site = site_of_stack(sys._getframe(1), lines)
    return None if site is None else str(site)


# -- the report --------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class OOMReport:
    """What an `OutOfMemoryError` knows: the request, and who holds the memory.

    ``str(report)`` is the error's message.

    Attributes:
        what: the op or block that ran out (``"add(Tensor float32[4096,1], ...)"``).
        requested: the bytes JAX could not allocate, read from its message (None if it gave none).
        tracked_bytes: bytes of the buffers of the live Tensors, each buffer once, as
            ``memory().num_bytes`` counts them (arrays whose computation failed hold nothing): the
            sum of the ``tracked`` holders' bytes. [`tensors`][tidyjax.OOMReport.tensors] is their
            count.
        untracked_bytes: bytes of the jax arrays alive that tidyjax neither tracks nor watches:
            the sum of the untracked holders' bytes.
        untracked_arrays: how many such arrays: the sum of the untracked holders' counts.
        device: the device with the most memory in use, where ``memory_stats()`` reports one
            (GPU, TPU); None on CPU.
        limit: that device's ``bytes_limit``, or None.
        in_use: that device's ``bytes_in_use`` (all of JAX), or None.
        holders: [`SiteStat`][tidyjax.SiteStat] rows by creation site and scope, largest
            first: tidyjax's Tensors (``tracked``), then the untracked arrays (each buffer once
            in the whole report, so that the rows of a kind add up to its total).
        failed: arrays alive whose computation failed (not counted), described.
        files: the open timeline's page and JSON, saved with the error (else empty).
        jax_message: JAX's own message.
        problems: what went wrong while reporting (a timeline not saved), one sentence each.
        watched: a ``WatchedUsage`` (``name``, ``arrays``, ``bytes``, ``tensors``,
            ``tensor_bytes``) per object registered with [`tidyjax.watch`][tidyjax.watch], as
            ``memory().watched`` and ``memory().watched_arrays`` count them (a watched raw array is
            neither a Tensor nor untracked); [`watched_bytes`][tidyjax.OOMReport.watched_bytes] and
            [`watched_arrays`][tidyjax.OOMReport.watched_arrays] are their sums.
        called_at: the user's line that made the request (``"train.py:40 in main"``,
            ``"In[3], line 2 in <module>"``), or None when no frame of the user's ran it.
        donated: the arguments donated to the failed call (``donate_argnums``) that it
            consumed anyway, described: JAX deletes a donated buffer when the call starts, so
            they are gone (their Tensors are disposed, naming the function).
        call: for a failed ``tidyjax.jit`` call, XLA's figures of it (compiled, not run):
            ``argument_bytes``, ``output_bytes``, ``temp_bytes``, ``alias_bytes`` (each None
            where XLA reports none); None for an eager op or when it could not be planned.
    """

    what: str
    requested: int | None
    tracked_bytes: int = 0
    untracked_bytes: int = 0
    untracked_arrays: int = 0
    device: str | None = None
    limit: int | None = None
    in_use: int | None = None
    holders: tuple[SiteStat, ...] = ()
    failed: tuple[str, ...] = ()
    files: tuple[str, ...] = ()
    jax_message: str = ""
    problems: tuple[str, ...] = ()
    watched: tuple[WatchedUsage, ...] = ()
    called_at: str | None = None
    donated: tuple[str, ...] = ()
    call: Mapping[str, int | None] | None = None

    @property
    def tensors(self) -> int:
        """How many live Tensors hold `tracked_bytes`: the tracked holders' counts."""
        return sum(h.count for h in self.holders if h.tracked)

    @property
    def watched_bytes(self) -> int:
        """The bytes of every watched object: the sum of `watched`'s."""
        return sum(w.bytes for w in self.watched)

    @property
    def watched_arrays(self) -> int:
        """How many arrays hold `watched_bytes`: the sum of `watched`'s."""
        return sum(w.arrays for w in self.watched)

    def __str__(self) -> str:
        at = f", called at {self.called_at}" if self.called_at else ""
        lines = [
            f"Out of memory: {self.what}{_asked(self)}{at}. JAX said: {self.jax_message.strip()}"
        ]
        lines += _device_line(self)
        lines += _call_line(self)
        lines += _section(
            f"tidyjax holds {_held(self.tracked_bytes, self.tensors, 'tensor')}",
            "; the largest, by creation site and scope:", [h for h in self.holders if h.tracked],
        )  # fmt: skip
        if self.watched:
            held = _held(self.watched_bytes, self.watched_arrays)
            lines.append(f"Watched (tidyjax.watch; tidyjax frees none of it): {held}:")
            lines += [f"  {w}" for w in self.watched]
        lines += _section(
            "Untracked (jax arrays tidyjax does not own): "
            + _held(self.untracked_bytes, self.untracked_arrays),
            "; the largest, by creation site:", [h for h in self.holders if not h.tracked],
        )  # fmt: skip
        lines += _notes(self)
        lines.append(
            "To fit: free the largest holders above (dispose them, or return less from the scope "
            "that holds them), wrap untracked arrays with tidyjax.adopt() so a scope frees them, "
            "or make this request smaller (a smaller batch or shape)."
        )
        return "\n".join(lines)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(str(self))

    @_html.never_raises
    def _repr_html_(self) -> str:
        """The report as a notebook shows it: the request, then a holders table with bars."""
        asked = esc(_asked(self))
        if self.requested is not None:  # the bytes in bold
            size = esc(fmt_bytes(self.requested))
            asked = asked.replace(size, f"<b>{size}</b>", 1)
        at = _html.dim(f" at {self.called_at}") if self.called_at else ""
        held = [f"tidyjax holds {_held(self.tracked_bytes, self.tensors, 'tensor')}",
                f"untracked: {_held(self.untracked_bytes, self.untracked_arrays)}"]  # fmt: skip
        held += [f"watched: {_held(self.watched_bytes, self.watched_arrays)}"] * bool(self.watched)
        after = [*(f"Watched {w}" for w in self.watched), *_notes(self)]
        return _html.box(
            _html.line(_html.bad("Out of memory"), f": <code>{esc(self.what)}</code>", asked, at),
            *(_html.line(esc(text)) for text in (*_device_line(self), *_call_line(self))),
            _html.line(esc("; ".join(held) + ".")),
            _holders_table(self.holders),
            *(_html.line(esc(text)) for text in after),
            _html.line(_html.dim("To fit: free the largest holders above, wrap untracked arrays "
                                 "with tidyjax.adopt(), or make this request smaller.")),
            _html.details(esc("JAX said"), f"<pre>{esc(self.jax_message.strip())}</pre>"),
        )  # fmt: skip


def _held(nbytes: int, n: int, noun: str = "array") -> str:
    """``4.0 KiB in 2 arrays``."""
    return f"{fmt_bytes(nbytes)} in {count(n, noun)}"


def _asked(r: OOMReport) -> str:
    asked = "" if r.requested is None else f" could not allocate {fmt_bytes(r.requested)}"
    if "RESOURCE_EXHAUSTED" not in r.jax_message:  # an op read an array that had failed
        asked += " (an earlier computation it depends on failed)"
    return asked


def _call_line(r: OOMReport) -> list[str]:
    """What the failed compiled call needs, as XLA figures it (none for an eager op)."""
    if r.call is None:
        return []

    def b(key: str) -> str:
        n = r.call.get(key) if r.call is not None else None
        return "unknown" if n is None else fmt_bytes(n)

    return [
        f"The call needs (XLA's figures, per device): arguments {b('argument_bytes')}, outputs "
        f"{b('output_bytes')}, temporaries {b('temp_bytes')}, donated and reused "
        f"{b('alias_bytes')}."
    ]


def _device_line(r: OOMReport) -> list[str]:
    use = f"{fmt_bytes(r.in_use or 0)} in use of {fmt_bytes(r.limit or 0)}"
    return [f"Device {r.device}: {use} (all of JAX)."] * (r.limit is not None)


def _section(head: str, more: str, rows: list[SiteStat]) -> list[str]:
    """A headline, the ``TOP`` largest rows under it, and how many more."""
    lines = [head + (more if rows else "."), *(f"  {h}" for h in rows[:TOP])]
    if len(rows) > TOP:
        lines.append(f"  ... and {count(len(rows) - TOP, 'more site')}")
    return lines


def _notes(r: OOMReport) -> list[str]:
    """What else the report says: arrays not counted, donated inputs consumed, files saved,
    what went wrong while reporting."""
    notes = []
    if r.failed:
        notes.append(
            f"Not counted: {count(len(r.failed), 'array')} whose computation failed, "
            f"holding no memory: {', '.join(r.failed[:TOP])}."
        )
    if r.donated:
        notes.append(
            "Donated and consumed although the call failed (JAX deletes a donated buffer when "
            f"the call starts): {', '.join(r.donated)}; their Tensors are disposed."
        )
    if r.files:
        notes.append(f"The open timeline was saved: {', '.join(r.files)}.")
    return notes + list(r.problems)


def _holders_table(holders: Sequence[SiteStat], top: int = TOP) -> str:
    """The ``top`` largest tracked and untracked rows as a table with bars, and how many more."""
    from ._census import site_table

    tracked = [h for h in holders if h.tracked][:top]
    shown = tracked + [h for h in holders if not h.tracked][:top]
    if not shown:
        return ""
    text = site_table(shown, bars=True)
    if len(holders) > len(shown):
        text += _html.line(_html.dim(f"... and {count(len(holders) - len(shown), 'more site')}"))
    return text


def requested_bytes(message: str) -> int | None:
    """The bytes JAX's out-of-memory message says it could not allocate, or None."""
    m = _REQUESTED.search(message)
    return None if m is None else int(next(g for g in m.groups() if g is not None))


#: The error whose report is being built: ``_holders_report`` leaves out what only its failed
#: call's own frames hold.
_reporting: contextvars.ContextVar[BaseException | None] = contextvars.ContextVar(
    "tidyjax_oom_reporting", default=None
)


def _holders_report() -> OOMReport:
    """The holders now, each list largest first; ``what`` and the message are filled in later."""
    from ._census import buffer_of, census, statistics, untracked_record

    temporaries = _call_temporaries(_reporting.get())  # before the census holds them too
    c = census()  # what memory() counts, read once: its sections agree
    broken = {r.buffer for r in c.rows if r.failed}
    # The Tensors only: a watched raw array is in the watched section, counted there.
    raws = ("<watched>", "<untracked>")
    tracked = [r for r in c.records() if r.scope not in raws and buffer_of(r) not in broken]
    untracked = [untracked_record(r.array) for r in c.of("untracked")
                 if id(r.array) not in temporaries]  # fmt: skip
    tensor_rows = statistics(tracked, ("scope", "site"))
    untracked_rows = statistics(untracked, ("scope", "site"))
    return OOMReport(
        "",
        None,
        tracked_bytes=sum(h.bytes for h in tensor_rows),
        untracked_bytes=sum(h.bytes for h in untracked_rows),
        untracked_arrays=sum(h.count for h in untracked_rows),
        holders=tuple(tensor_rows + untracked_rows),
        failed=_failed(c),
        watched=tuple(c.usage),
        **_fullest_device(),
    )


def _failed(c: Any) -> tuple[str, ...]:
    """The arrays alive whose computation failed (they hold nothing), described."""
    return tuple(
        f"{describe(r.array)} ({fmt_bytes(r.rec.size())})" for r in c.rows if r.failed and r.rec
    ) + tuple(
        f"{describe(a)} ({fmt_bytes(int(a.nbytes))})"
        for platform in {d.platform for d in jax.local_devices()}
        for a in jax.live_arrays(platform)
        if _registry.lookup(a) is None and failed(a)
    )


def _fullest_device() -> dict[str, Any]:
    """The device with the most memory in use, its limit and its use, where the backend says."""
    stats = [(dev, s) for dev, s in device_stats().items() if s.get("bytes_limit")]
    if not stats:
        return {}
    dev, s = max(stats, key=lambda ds: ds[1].get("bytes_in_use", 0))
    return {
        "device": str(dev),
        "limit": int(s["bytes_limit"]),
        "in_use": int(s.get("bytes_in_use", 0)),
    }


# -- what the failed call itself holds ---------------------------------------------------------

#: The most bytes of a temporary of the failed call that the report leaves out.
TINY = 1024


def _call_temporaries(err: BaseException | None) -> set[int]:
    """The ids of the tiny arrays that only ``err``'s failed call itself holds (exact reference
    counts, ``held_only_by``): what it made on the way (``jnp.zeros``'s fill value, a float32[]
    scalar) left in its traceback's frames; a large one held memory when the allocation failed."""
    from ._history import held_only_by  # the error path only: not loaded at import
    from ._sites import LIBRARY_FOLDERS as _SKIP  # JAX's, jaxlib's and tidyjax's folders

    frames: list[Any] = []  # the call's finished frames: JAX's and tidyjax's below the user's
    seen: set[int] = set()  # in each traceback of ``err`` and of the errors it was raised from
    while err is not None and id(err) not in seen and len(seen) < 8:
        seen.add(id(err))
        chain = [f for f, _ in traceback.walk_tb(err.__traceback__)]
        frames += itertools.takewhile(lambda f: f.f_code.co_filename.startswith(_SKIP), chain[::-1])
        err = err.__cause__ if err.__cause__ is not None else err.__context__
    alone = held_only_by(frames) if frames else {}
    return {k for k, a in alone.items() if type(a) in CONCRETE and int(a.nbytes) <= TINY}


# -- what was running --------------------------------------------------------------------------


def _call_text(what: str, operands: tuple[Any, ...]) -> str:
    if not operands:
        return what
    shown = ", ".join(_operand(x) for x in operands[:4])
    return f"{what}({shown}{', ...' if len(operands) > 4 else ''})"


def _operand(x: Any) -> str:
    """An argument as a message shows it: arrays (Tensors, jax, NumPy) by dtype and shape."""
    if (hasattr(x, "shape") and hasattr(x, "dtype")) or hasattr(x, "_array"):
        return describe(getattr(x, "_array", x))
    if isinstance(x, (int, float, complex, bool, str, type(None), tuple)):
        text = repr(x)
        return text if len(text) <= 40 else text[:37] + "..."
    return type(x).__name__


# -- the timeline ------------------------------------------------------------------------------


def _oom_label(what: str, called_at: str | None) -> str:
    """How the mark of the failed request on the timeline (and its saved page) is labelled."""
    return f"out of memory: {what or 'a request'}" + (f" at {called_at}" if called_at else "")


def _save_timeline(
    what: str = "", requested: int | None = None, called_at: str | None = None
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Mark the failed request on the open timeline (`Timeline.annotate`: its moment, its
    bytes) and save its page, showing what was alive at that mark, and its JSON; (the files,
    what went wrong)."""
    try:
        from ._timeline import active

        timeline = active()
    except Exception:  # no timeline module (yet): nothing is recorded
        timeline = None
    if timeline is None:
        return (), ()
    try:
        moment = timeline.annotate(_oom_label(what, called_at), requested).time
    except Exception:  # not a recording Timeline: the page is marked all the same
        moment = time.perf_counter()
    failure = {"time": moment, "what": what, "requested": requested, "called_at": called_at}
    folder = os.environ.get("TIDYJAX_OOM_DIR") or os.getcwd()
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S-%f")
    base = os.path.join(os.path.abspath(folder), f"tidyjax-oom-{stamp}")
    files: list[str] = []
    problems: list[str] = []
    for path, save in ((base + ".html", _save_page), (base + ".json", _save_json)):
        try:
            os.makedirs(folder, exist_ok=True)
            save(timeline, failure, path)
            files.append(path)
        except Exception as e:  # the out-of-memory error matters more than a file
            problems.append(f"The open timeline could not be saved to {path}: {e}.")
    return tuple(files), tuple(problems)


def _save_page(timeline: Any, failure: dict[str, Any], path: str) -> None:
    if hasattr(timeline, "_window"):
        pathlib.Path(path).write_text(oom_page(timeline, failure), encoding="utf-8")
    else:  # not a recorded Timeline: its own page
        timeline.save_html(path)


def _save_json(timeline: Any, failure: dict[str, Any], path: str) -> None:
    from . import _timeline_format

    if hasattr(timeline, "to_json"):
        # the failed request as "oom" too (`tidyjax view` shows it, load ignores it)
        _timeline_format.write({**timeline.to_json(), "oom": failure}, path)
    else:
        timeline.dump(path)


def oom_page(tl: Any, failure: Mapping[str, Any]) -> str:
    """The timeline page of ``tl`` marked with a failed request: a line at its moment (the
    timeline's own mark, or one made from ``failure``), and the table of what was alive then.

    Args:
        tl: the timeline (recorded or loaded).
        failure: ``{"time": perf_counter seconds, "what": ..., "requested": bytes or None,
            "called_at": ...}``, as the JSON saved with the error holds it under ``"oom"``.
    """
    from . import _timeline_html
    from ._timeline_format import Mark

    moment = float(failure["time"])
    label = _oom_label(str(failure.get("what") or ""), failure.get("called_at"))
    requested = failure.get("requested")
    mark = next(
        (m for m in getattr(tl, "_marks", ()) if m.time == moment and m.label == label),
        Mark(moment, label, None if requested is None else int(requested)),
    )
    return _timeline_html.page(tl, at=mark)


# -- waiting for a value -----------------------------------------------------------------------


def _waited_text(t: Any, name: str) -> str:
    """What ran out, for a Tensor method that waited for the value (where an allocation that
    failed asynchronously surfaces): the method, the Tensor and where it was computed."""
    from ._sites import creation_site

    arr = held_array(t)
    site = creation_site(arr)
    made = f", computed at {site}" if site is not None else ""
    return f"Tensor.{name}() on Tensor {describe(arr)} (id {t.id}{made})"


# -- oom_report --------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class _OOMReporting:
    """The object ``oom_report()`` returns: a context manager, and a decorator."""

    label: str | None

    def __enter__(self) -> _OOMReporting:
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        if exc is not None and is_oom(exc):
            _raise(exc, f"in oom_report({self.label!r})" if self.label else "in oom_report()", ())

    def __call__(self, fn: F) -> F:
        label = self.label or getattr(fn, "__qualname__", type(fn).__name__)
        return decorate(fn, lambda: _OOMReporting(label), "@oom_report")


def oom_report(label: str | Callable[..., Any] | None = None) -> Any:
    """Turn JAX's out-of-memory error inside into an `OutOfMemoryError` naming what holds
    memory, around any code, raw JAX included. Other errors pass through untouched.

    Forms:

    ```python
    with tidyjax.oom_report():
        y = jax.numpy.zeros((10**13,))

    with tidyjax.oom_report("load batch"):   # the message names the block
        ...

    @tidyjax.oom_report                      # or @tidyjax.oom_report("train step")
    def step(params, batch): ...
    ```

    Raises:
        OutOfMemoryError: from JAX's ``RESOURCE_EXHAUSTED`` error, with ``.report``.
        TidyjaxTypeError: ``label`` is neither a string nor a function.
    """
    if callable(label):
        return _OOMReporting(None)(label)
    if label is not None and not isinstance(label, str):
        raise TidyjaxTypeError(
            f"oom_report() takes a label (str) or a function, got {type(label).__name__}."
        )
    return _OOMReporting(label)
