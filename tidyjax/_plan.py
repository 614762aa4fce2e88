"""``plan()``: what one call of a function would take on each device, read from XLA's
compile-only memory analysis and set against what is live there now, and ``largest_fitting()``,
the largest batch size that fits, by bisection over such plans. Nothing runs; arguments given as
``jax.ShapeDtypeStruct`` allocate nothing.

XLA's figures (``Compiled.memory_analysis()``) are per device: every device of a jitted call
runs the same partitioned program, so each device of the plan shows the same figures. What is
live, the limit and whether the call fits differ per device; the plan's top-level figures are
those of its tightest device (``MemoryPlan.device``).
"""

from __future__ import annotations

import collections
import dataclasses
import inspect
import math
import threading
import warnings
import weakref
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any

import jax
import numpy as np
from jax.errors import JaxRuntimeError

from . import _html, _lift, _registry
from ._arrays import Tracer, is_concrete, shard_bytes
from ._census import SiteStat, holder_lines, site_table
from ._context import budget_limit
from ._decorating import check_callable
from ._errors import (
    OutOfMemoryError,
    TidyjaxError,
    TidyjaxTypeError,
    TidyjaxValueError,
    check_count,
)
from ._format import count, describe, esc, fmt_bytes
from ._memory import MemoryInfo, memory
from ._trees import arrays, is_tensor

__all__ = [
    "CACHE_SIZE", "TRACED", "CallFigures", "MemoryPlan", "call_figures", "call_leaves",
    "kept_call_figures", "largest_fitting", "new_per_device", "observe_call", "plan", "plan_now",
]  # fmt: skip

#: How each kind of ``fn`` was compiled, as ``MemoryPlan.jitted`` names it and its text says.
JITTED = {
    "jax.jit": "a jax.jit object, with its donation and static arguments",
    "tidyjax.jit": "a tidyjax.jit object, with its donation and static arguments",
    "lower": "an object with its own .lower(), as it lowers itself",
    "whole": "a plain function, jitted whole by plan: nothing donated, a jit inside inlined",
}

#: ``memory_analysis()``'s fields, as the plan names them.
_XLA_FIELDS = {
    "argument_bytes": "argument_size_in_bytes",
    "output_bytes": "output_size_in_bytes",
    "temp_bytes": "temp_size_in_bytes",
    "alias_bytes": "alias_size_in_bytes",
    "generated_code_bytes": "generated_code_size_in_bytes",
}

#: The figures ``MemoryPlan.per_device`` holds for each device, in the order ``to_dict`` keeps.
PER_DEVICE = (*_XLA_FIELDS, "peak_bytes", "xla_peak_bytes", "new_bytes", "live_bytes",
              "limit_bytes", "fits")  # fmt: skip

_WHERE = "tidyjax.plan()"

LOWER_FAILED = (
    "{where} could not lower {name} with the arguments given: {error}\n"
    "Pass each array argument as a Tensor, a jax.Array or a jax.ShapeDtypeStruct(shape, dtype) "
    "(as for jax.eval_shape), and mark the other arguments static: "
    "plan(jax.jit(fn, static_argnums=...), ...)."
)

NO_SHARDING = (
    "{where}: {name} runs over {devices} devices, but {structs} given as jax.ShapeDtypeStruct "
    "{verb} no sharding ({shapes}), so XLA chose the placement and the per-device figures may "
    "not be those of the real call. Give each struct the sharding its array will have: "
    "jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, P(...)))."
)


def _empty() -> Any:
    return dataclasses.field(default_factory=lambda: MappingProxyType({}))


@dataclasses.dataclass(frozen=True)
class MemoryPlan:
    """What one call of a function would take, before it runs: [`tidyjax.plan`][tidyjax.plan]
    makes it.

    XLA's figures are per device and exactly as ``Compiled.memory_analysis()`` reports them;
    ``None`` means unknown (the backend gave no analysis, or reported no argument or output
    bytes for a call that has them), never 0.

    Attributes:
        function: the function's ``__qualname__``.
        jitted: how it was compiled: ``"jax.jit"`` or ``"tidyjax.jit"`` (the object given, with
            its ``donate_argnums`` and ``static_argnums``), ``"lower"`` (another object with a
            ``.lower()``, such as ``equinox.filter_jit``'s) or ``"whole"`` (a plain function,
            jitted whole by ``plan``: nothing donated).
        device: the device the top-level figures describe: the one with the least room left
            under its limit or, where no limit is known, the one that would hold the most.
        devices: every device the call runs on, by name (``str(device)``).
        argument_bytes: the arguments' bytes on a device, donated ones included.
        output_bytes: the outputs' bytes.
        temp_bytes: XLA's temporaries (0 is a real answer: none).
        alias_bytes: output bytes that reuse a donated argument's buffer.
        generated_code_bytes: the compiled code's bytes, where the backend counts them.
        peak_bytes: arguments + outputs + temporaries - aliases: an upper bound of the call's
            peak on a device.
        xla_peak_bytes: XLA's own ``peak_memory_in_bytes``, where this JAX reports it, else None.
        new_bytes: what the call would add to the device now: the arguments not yet allocated
            (given as ``ShapeDtypeStruct`` or Python values; a Tensor or ``jax.Array`` passed
            is live already) + outputs + temporaries - aliases.
        live_bytes: every live ``jax.Array`` on the device now, each buffer once (tidyjax's,
            watched and untracked: ``memory().total_per_device``).
        limit_bytes: the smallest of the device's ``memory_stats()["bytes_limit"]`` (none on
            CPU), the ``limit=`` given and every enclosing per-device
            [`budget`][tidyjax.budget]; None when none is known.
        fits: ``live_bytes + new_bytes <= limit_bytes`` on every device; None when a limit or
            a figure is unknown (and no device is known not to fit).
        per_device: each figure above on each device: ``plan.per_device["live_bytes"]`` is
            ``{"cpu:0": 4096, ...}`` (XLA's figures are the same on every device).
        holders: the largest live holders on the call's devices, by creation site, as
            [`SiteStat`][tidyjax.SiteStat] rows (``memory().top_sites``).
        notes: what makes a figure unknown or uncertain, one sentence each.
    """

    function: str
    jitted: str
    device: str
    devices: tuple[str, ...]
    argument_bytes: int | None
    output_bytes: int | None
    temp_bytes: int | None
    alias_bytes: int | None
    generated_code_bytes: int | None
    peak_bytes: int | None
    xla_peak_bytes: int | None
    new_bytes: int | None
    live_bytes: int
    limit_bytes: int | None
    fits: bool | None
    per_device: Mapping[str, Mapping[str, Any]] = _empty()
    holders: tuple[SiteStat, ...] = ()
    notes: tuple[str, ...] = ()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (
            f"MemoryPlan(function={self.function!r}, jitted={self.jitted!r}, device="
            f"{self.device!r}, devices={len(self.devices)}, peak_bytes={self.peak_bytes}, "
            f"new_bytes={self.new_bytes}, live_bytes={self.live_bytes}, limit_bytes="
            f"{self.limit_bytes}, fits={self.fits})"
        )

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(str(self))

    def __reduce__(self) -> tuple[Any, ...]:
        # A mappingproxy does not pickle: per_device travels as dicts (a BudgetError's report)
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        fields["per_device"] = {f: dict(v) for f, v in self.per_device.items()}
        return (_unpickle, (fields,))

    def __str__(self) -> str:
        lines = [_headline(self), f"  compiled: {JITTED.get(self.jitted, self.jitted)}"]
        lines.append(f"  XLA, per device: {_xla_line(self)}")
        for group, text in _alike(self):
            lines.append(f"  {_names(group)}: {text}")
            lines += holder_lines(self.holders, group[0])
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)

    @_html.never_raises
    def _repr_html_(self) -> str:
        """The headline, XLA's figures, a row per device (live + new against the limit, with a
        bar), the largest live holders, the notes."""
        parts = [f"<b>tidyjax memory plan</b>: {esc(_headline(self))}"]
        parts.append(_html.line(_html.dim("compiled: "), esc(JITTED.get(self.jitted, self.jitted))))
        xla = [(label, getattr(self, f)) for f, label in _LABELS]
        xla = [(label, b) for label, b in xla if b or label not in _OPTIONAL]
        rows = [[esc(label), esc(_bytes(b))] for label, b in xla]
        parts.append(_html.table(["XLA, per device", "bytes"], rows, {1}))
        header = ["device", "live now", "+ new", "= with the call", "limit", "", "fits"]
        rows = []
        for d in self.devices:
            fig = {f: self.per_device.get(f, {}).get(d) for f in PER_DEVICE}
            live, new, lim = fig["live_bytes"] or 0, fig["new_bytes"], fig["limit_bytes"]
            total = None if new is None else live + new
            share = _html.bar(total / lim) if total is not None and lim else ""
            rows.append([esc(d), esc(fmt_bytes(live)), esc(_bytes(new)), esc(_bytes(total)),
                         esc(_bytes(lim)), share, _fits_html(fig["fits"])])  # fmt: skip
        parts.append(_html.table(header, rows, {1, 2, 3, 4}))
        if self.holders:
            parts.append(site_table(self.holders, "largest live holders"))
        parts += [_html.line(_html.dim("note: "), esc(n)) for n in self.notes]
        return _html.box(*parts)

    def to_dict(self) -> dict[str, Any]:
        """Every field as JSON values: ``per_device`` as nested dicts, ``holders`` as
        [`SiteStat`][tidyjax.SiteStat]'s JSON."""
        out: dict[str, Any] = {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if f.name not in ("per_device", "holders")
        }
        out["devices"] = list(self.devices)
        out["notes"] = list(self.notes)
        out["per_device"] = {f: dict(v) for f, v in self.per_device.items()}
        out["holders"] = [h.to_json() for h in self.holders]
        return out


def _unpickle(fields: dict[str, Any]) -> MemoryPlan:
    per = fields["per_device"]
    fields["per_device"] = MappingProxyType({f: MappingProxyType(v) for f, v in per.items()})
    return MemoryPlan(**fields)


_LABELS = (
    ("argument_bytes", "arguments"),
    ("output_bytes", "+ outputs"),
    ("temp_bytes", "+ temporaries"),
    ("alias_bytes", "- aliases (donated)"),
    ("peak_bytes", "= peak (an upper bound)"),
    ("xla_peak_bytes", "XLA's own peak"),
    ("generated_code_bytes", "generated code"),
)
#: Rows shown only when known and not 0.
_OPTIONAL = ("XLA's own peak", "generated code")


def _bytes(b: int | None) -> str:
    return "unknown" if b is None else fmt_bytes(b)


def _headline(p: MemoryPlan) -> str:
    fits = {True: "fits", False: "does not fit", None: "fits: unknown"}[p.fits]
    return f"MemoryPlan of {p.function} on {count(len(p.devices), 'device')}: {fits}"


def _xla_line(p: MemoryPlan) -> str:
    text = (
        f"arguments {_bytes(p.argument_bytes)} + outputs {_bytes(p.output_bytes)} + "
        f"temporaries {_bytes(p.temp_bytes)} - aliases {_bytes(p.alias_bytes)} = peak "
        f"{_bytes(p.peak_bytes)} (an upper bound)"
    )
    if p.xla_peak_bytes is not None:
        text += f"; XLA's own peak {fmt_bytes(p.xla_peak_bytes)}"
    if p.generated_code_bytes:
        text += f"; code {fmt_bytes(p.generated_code_bytes)}"
    return text


def _device_line(p: MemoryPlan, d: str) -> str:
    fig = {f: p.per_device.get(f, {}).get(d) for f in PER_DEVICE}
    live, new, lim = fig["live_bytes"] or 0, fig["new_bytes"], fig["limit_bytes"]
    text = f"{fmt_bytes(live)} live + {_bytes(new)} new"
    if new is not None:
        text += f" = {fmt_bytes(live + new)}"
    if lim is None:
        return text + "; limit unknown"
    text += f" of the limit {fmt_bytes(lim)}: "
    if new is None:
        return text + "fits: unknown"
    room = lim - live - new
    return text + (f"fits, {fmt_bytes(room)} left" if room >= 0 else f"{fmt_bytes(-room)} over")


def _alike(p: MemoryPlan) -> list[tuple[list[str], str]]:
    """The devices in runs of the same line (and no holders), each run with its line: a call
    over many devices reads as one line per distinct state."""
    out: list[tuple[list[str], str]] = []
    held = {h.device for h in p.holders}
    for d in p.devices:
        text = _device_line(p, d)
        if out and out[-1][1] == text and d not in held and out[-1][0][-1] not in held:
            out[-1][0].append(d)
        else:
            out.append(([d], text))
    return out


def _names(devices: list[str]) -> str:
    if len(devices) < 3:
        return ", ".join(devices)
    return f"{devices[0]} … {devices[-1]} ({len(devices)} devices, each)"


def _fits_html(fits: bool | None) -> str:
    if fits is None:
        return _html.dim("unknown")
    return esc("yes") if fits else _html.bad("no")


# -- planning ----------------------------------------------------------------------------------


def plan(
    fn: Callable[..., Any], /, *args: Any, limit: int | None = None, **kwargs: Any
) -> MemoryPlan:
    """What one call ``fn(*args, **kwargs)`` would take on each device, without running it.

    Compiles the call (``jit(fn).lower(*args, **kwargs).compile()``) and reads XLA's
    ``memory_analysis()``; then sets what the call would add against what is live on each device
    now and the device's limit. Give array arguments as ``jax.ShapeDtypeStruct(shape, dtype)``
    (with ``sharding=`` for a call over several devices) to allocate nothing; Tensors and
    ``jax.Array``s are read for their shapes, dtypes and shardings.

    Args:
        fn: a ``jax.jit`` or ``tidyjax.jit`` object (its ``donate_argnums`` and
            ``static_argnums`` apply), or a plain function, which is jitted whole.
        *args: the call's positional arguments.
        **kwargs: its keyword arguments (``limit`` is this function's own: pass a keyword of
            ``fn`` named ``limit`` through ``functools.partial``).
        limit: bytes per device to plan against, where the backend reports no limit (CPU) or
            a smaller one is wanted; ``fits`` is None with no limit known. Inside a
            [`tidyjax.budget`][tidyjax.budget] (per device), the smaller of the two.

    Returns:
        A [`MemoryPlan`][tidyjax.MemoryPlan].

    Raises:
        TidyjaxTypeError: ``fn`` is not callable, ``limit`` is not a count of bytes, or the
            arguments cannot be lowered (an array that is not a Tensor, ``jax.Array`` or
            ``ShapeDtypeStruct``, a value that should be static, a tracer).
        OutOfMemoryError: XLA ran out of memory compiling the call (it does on TPU when the
            program cannot fit).

    Warns:
        UserWarning: the call runs over several devices but some ``ShapeDtypeStruct``
            arguments carry no sharding.

    Example:
        ```python
        x = jax.ShapeDtypeStruct((512, 512), jnp.float32)
        p = tidyjax.plan(jax.jit(step, donate_argnums=0), x, limit=2**30)
        print(p.peak_bytes, p.fits)
        ```
    """
    check_callable(fn, _WHERE)
    limit = _check_limit(limit, _WHERE)
    return _plan(fn, args, kwargs, limit, stacklevel=3)


def _check_limit(limit: object, where: str) -> int | None:
    """``limit=`` as given, or the tightest enclosing per-device budget where smaller."""
    given = None if limit is None else check_count(limit, "limit", where)
    known = [b for b in (given, budget_limit()) if b is not None]
    return min(known) if known else None


def _lowering(fn: Callable[..., Any]) -> tuple[str, Callable[..., Any]]:
    """How ``fn`` is compiled, and the ``lower`` that does it."""
    lower = getattr(fn, "lower", None)
    if not callable(lower):
        return "whole", jax.jit(fn).lower
    if isinstance(fn, _JIT_TYPE):
        return "jax.jit", lower
    owner = getattr(lower, "__self__", None)
    try:  # tidyjax.jit's wrapper carries the lower of a jax.jit of the same function
        same = isinstance(owner, _JIT_TYPE) and inspect.unwrap(owner) is inspect.unwrap(fn)
    except ValueError:  # a cycle of __wrapped__
        same = False
    return ("tidyjax.jit" if same else "lower"), lower


#: The type of what ``jax.jit`` returns (a C++ class JAX does not export by a public name).
_JIT_TYPE = type(jax.jit(lambda: None))


def _name(fn: Callable[..., Any]) -> str:
    try:
        name = getattr(inspect.unwrap(fn), "__qualname__", None)
    except ValueError:
        name = None
    return name if isinstance(name, str) else type(fn).__name__


def _compile(lower: Callable[..., Any], name: str, args: Any, kwargs: Any) -> tuple[Any, Any]:
    """The lowered and the compiled call; an out-of-memory compile raises `OutOfMemoryError`."""
    try:
        lowered = lower(*args, **kwargs)
    except TidyjaxError:
        raise
    except (TypeError, ValueError) as e:
        raise TidyjaxTypeError(LOWER_FAILED.format(where=_WHERE, name=name, error=e)) from e
    try:
        compiled = lowered.compile()
    except JaxRuntimeError as e:
        if not _out_of_memory(e):
            raise
        message = (
            f"{_WHERE}: XLA ran out of memory compiling {name}: the call cannot fit on its "
            f"devices as it is. Make it smaller (a smaller batch, sharding over more devices, "
            f"donating inputs, jax.checkpoint). XLA said: {e}"
        )
        raise OutOfMemoryError(message) from e
    return lowered, compiled


def _out_of_memory(e: BaseException) -> bool:
    text = str(e)
    return "RESOURCE_EXHAUSTED" in text or "out of memory" in text.lower()


def _analysis(compiled: Any) -> Any:
    """``memory_analysis()``, or None where the backend has none (some raise)."""
    try:
        stats = compiled.memory_analysis()
    except Exception:
        return None
    if isinstance(stats, (list, tuple)):  # one per device on some backends: the first
        stats = next((s for s in stats if s is not None), None)
    return stats


def _has_bytes(info: Any) -> bool:
    """Whether any array of a ``Lowered``'s ``args_info`` or ``out_info`` has an element."""
    return any(math.prod(getattr(x, "shape", ())) for x in jax.tree.leaves(info))


def _xla_figures(lowered: Any, compiled: Any) -> tuple[dict[str, int | None], list[str]]:
    """``memory_analysis()``'s figures, None where unknown, and why they are."""
    stats = _analysis(compiled)
    if stats is None:
        note = "XLA gave no memory analysis for this call on this backend: its figures are unknown."
        return dict.fromkeys((*_XLA_FIELDS, "peak_bytes", "xla_peak_bytes")), [note]
    figures: dict[str, int | None] = {f: int(getattr(stats, a)) for f, a in _XLA_FIELDS.items()}
    notes = []
    for field, info, what in (("argument_bytes", "args_info", "arguments"),
                              ("output_bytes", "out_info", "outputs")):  # fmt: skip
        if figures[field] == 0 and _has_bytes(getattr(lowered, info, None)):
            figures[field] = None
            notes.append(f"XLA reported no bytes for the call's {what}: their size is unknown.")
    parts = [figures[f] for f in ("argument_bytes", "output_bytes", "temp_bytes", "alias_bytes")]
    a, o, t, al = parts
    figures["peak_bytes"] = None if None in parts else a + o + t - al  # type: ignore[operator]
    peak = getattr(stats, "peak_memory_in_bytes", None)  # newer JAX only
    figures["xla_peak_bytes"] = None if peak is None else int(peak)
    return figures, notes


def _devices_of(compiled: Any) -> list[Any]:
    """The devices the compiled call runs on, by id."""
    found: set[Any] = set()
    for s in jax.tree.leaves((compiled.input_shardings, compiled.output_shardings)):
        found |= set(getattr(s, "device_set", ()))
    return sorted(found, key=lambda d: d.id) or [jax.devices()[0]]


def _plan(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    limit: int | None,
    stacklevel: int,
    warn: bool = True,
) -> MemoryPlan:
    call = call_figures(fn, args, kwargs, stacklevel=stacklevel + 1, warn=warn)
    return plan_now(call, args, kwargs, memory(), limit)


@dataclasses.dataclass(frozen=True)
class CallFigures:
    """What XLA says of one compiled call, the same at every call with the same signature (a
    budget keeps it per signature): the function's name, how it was compiled (``JITTED``'s
    key), its devices, ``memory_analysis()``'s figures (None where unknown) and the notes."""

    name: str
    jitted: str
    devices: tuple[Any, ...]
    figures: Mapping[str, int | None]
    notes: tuple[str, ...] = ()

    def temporaries(self) -> dict[str, int] | None:
        """XLA's temporaries on each of the call's devices (by ``str(device)``: the same
        figure on each); None where unknown: no analysis, or no argument or output bytes
        reported for a call that has them (then no figure of it is trusted). 0 is a real
        answer."""
        f = self.figures
        temp = f.get("temp_bytes")
        if temp is None or f.get("argument_bytes") is None or f.get("output_bytes") is None:
            return None
        return {str(d): temp for d in self.devices}


def call_figures(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    stacklevel: int,
    warn: bool = True,
) -> CallFigures:
    """Compile the call ``fn(*args, **kwargs)`` (JAX caches it) and read XLA's figures.

    Raises:
        TidyjaxTypeError: a tracer among the arguments, or the call cannot be lowered.
        OutOfMemoryError: XLA ran out of memory compiling it.
    """
    jitted, lower = _lowering(fn)
    name = _name(fn)
    leaves = call_leaves(args, kwargs)
    if any(isinstance(x, jax.core.Tracer) for x in leaves):
        raise TidyjaxTypeError(
            f"{_WHERE} got a traced value for {name}: it plans a call from outside any "
            "transformation. Call it outside jit/grad/vmap, with jax.ShapeDtypeStruct(shape, "
            "dtype) for the arrays."
        )
    lowered, compiled = _compile(lower, name, args, kwargs)
    figures, notes = _xla_figures(lowered, compiled)
    devices = _devices_of(compiled)
    notes += _sharding_notes(leaves, devices, name, warn, stacklevel + 1)
    return CallFigures(name, jitted, tuple(devices), MappingProxyType(figures), tuple(notes))


def call_leaves(args: Any, kwargs: Any) -> list[Any]:
    """The call's leaves, a Tensor as its array."""
    return [
        arrays(x) if is_tensor(x) else x for x in jax.tree.leaves((args, kwargs), is_leaf=is_tensor)
    ]


def new_per_device(call: CallFigures, args: Any, kwargs: Any) -> dict[Any, int | None]:
    """What the call would add on each of its devices now (`MemoryPlan.new_bytes`): the
    arguments not live there yet + outputs + temporaries - aliases; None where unknown."""
    live_args = _live_arguments(call_leaves(args, kwargs))
    return {dev: _new_bytes(call.figures, live_args.get(dev, 0)) for dev in call.devices}


def _new_bytes(figures: Mapping[str, int | None], live_args: int) -> int | None:
    a, o, t, al = (
        figures[f] for f in ("argument_bytes", "output_bytes", "temp_bytes", "alias_bytes")
    )
    if a is None or o is None or t is None or al is None:
        return None
    return max(0, a - live_args) + o + t - al


def plan_now(
    call: CallFigures, args: Any, kwargs: Any, info: MemoryInfo, limit: int | None
) -> MemoryPlan:
    """The plan of ``call`` against the devices as ``info`` saw them, under ``limit``."""
    live_args = _live_arguments(call_leaves(args, kwargs))
    figures = dict(call.figures)
    devices = list(call.devices)
    return _assemble(
        call.name, call.jitted, devices, figures, live_args, info, limit, list(call.notes)
    )


def _live_arguments(leaves: Iterable[Any]) -> dict[Any, int]:
    """The bytes on each device of the arrays passed: live already, so not new."""
    seen: dict[int, Any] = {id(x): x for x in leaves if is_concrete(x) and not x.is_deleted()}
    out: dict[Any, int] = {}
    for arr in seen.values():
        for dev, b in shard_bytes(arr).items():
            out[dev] = out.get(dev, 0) + b
    return out


def _sharding_notes(
    leaves: list[Any], devices: list[Any], name: str, warn: bool, stacklevel: int
) -> list[str]:
    """Warn when the call spans devices but some structs say nothing of where they live."""
    spread = set(devices)
    for x in leaves:
        sharding = getattr(x, "sharding", None)
        if isinstance(x, (jax.Array, jax.ShapeDtypeStruct)) and sharding is not None:
            spread |= set(sharding.device_set)
    bare = [x for x in leaves if isinstance(x, jax.ShapeDtypeStruct) and x.sharding is None]
    if len(spread) < 2 or not bare:
        return []
    shapes = ", ".join(describe(x) for x in bare[:4]) + (", …" if len(bare) > 4 else "")
    message = NO_SHARDING.format(
        where=_WHERE,
        name=name,
        devices=len(spread),
        structs=count(len(bare), "argument"),
        verb="carries" if len(bare) == 1 else "carry",
        shapes=shapes,
    )
    if warn:
        warnings.warn(message, UserWarning, stacklevel=stacklevel)
    return [message]


def _assemble(
    name: str,
    jitted: str,
    devices: list[Any],
    figures: dict[str, int | None],
    live_args: dict[Any, int],
    info: MemoryInfo,
    limit: int | None,
    notes: list[str],
) -> MemoryPlan:
    """The plan: XLA's figures on each device, and each device's state now."""
    total = info.total_per_device
    per: dict[str, dict[str, Any]] = {f: {} for f in PER_DEVICE}
    unknown_limits = []
    for dev in devices:
        d = str(dev)
        for f, v in figures.items():
            per[f][d] = v
        live = total.get(dev, 0)
        new = _new_bytes(figures, live_args.get(dev, 0))
        known = [b for b in (info.device_stats.get(dev, {}).get("bytes_limit"), limit) if b]
        lim = min(known) if known else None
        if lim is None:
            unknown_limits.append(d)
        per["new_bytes"][d], per["live_bytes"][d], per["limit_bytes"][d] = new, live, lim
        per["fits"][d] = None if lim is None or new is None else live + new <= lim
    if unknown_limits:
        notes.append(
            f"No memory limit is known for {', '.join(unknown_limits[:3])}"
            f"{', …' if len(unknown_limits) > 3 else ''} (the backend reports none, as on CPU): "
            "pass limit=BYTES (per device) to check whether the call fits."
        )
    names = [str(dev) for dev in devices]
    top = min(names, key=lambda d: _tightness(per, d))
    fits = list(per["fits"].values())
    return MemoryPlan(
        function=name,
        jitted=jitted,
        device=top,
        devices=tuple(names),
        **{f: per[f][top] for f in PER_DEVICE if f != "fits"},
        fits=False if False in fits else (None if None in fits else True),
        per_device=MappingProxyType({f: MappingProxyType(v) for f, v in per.items()}),
        holders=tuple(h for h in info.top_sites if h.device in names),
        notes=tuple(notes),
    )


def _tightness(per: Mapping[str, Mapping[str, Any]], d: str) -> tuple[int, int]:
    """A sort key, smallest first: the least room under a known limit, then the most use."""
    live, new, lim = per["live_bytes"][d], per["new_bytes"][d] or 0, per["limit_bytes"][d]
    if lim is None:
        return (1, -(live + new))
    return (0, lim - live - new)


# -- the largest batch that fits ---------------------------------------------------------------


def largest_fitting(
    fn: Callable[..., Any],
    make_args: Callable[[int], tuple[Any, ...]],
    *,
    lo: int,
    hi: int,
    limit: int | None = None,
) -> tuple[int, MemoryPlan, int]:
    """The largest ``n`` in ``[lo, hi]`` (a batch size) whose call ``fn(*make_args(n))`` fits,
    found by bisection over compile-only [`plan`][tidyjax.plan]s: nothing runs.

    Assumes that what the call takes grows with ``n``: ``lo`` must fit; ``hi`` is tried
    next, then the middle of what is left, so at most ``ceil(log2(hi - lo + 1)) + 2`` compiles.
    A compile that runs out of memory (TPU) counts as not fitting.

    Args:
        fn: as for `plan`.
        make_args: ``n`` -> the tuple of ``fn``'s positional arguments for batch size ``n``
            (``jax.ShapeDtypeStruct``s allocate nothing).
        lo: the smallest ``n`` to try; it must fit.
        hi: the largest ``n`` to try.
        limit: bytes per device, as for `plan`; needed where the backend reports no limit (CPU)
            and no [`budget`][tidyjax.budget] is active.

    Returns:
        ``(n, plan, compiles)``: the largest fitting ``n``, its plan, how many compiles it took.

    Raises:
        TidyjaxTypeError: ``fn`` or ``make_args`` is not callable, ``make_args`` returned no
            tuple, ``lo``/``hi``/``limit`` is not an int >= 0.
        TidyjaxValueError: ``lo > hi``; no limit is known (pass ``limit=``); nothing fits, not
            even ``lo`` (the message shows the plan at ``lo``).

    Example:
        ```python
        def make_args(n):
            return (jax.ShapeDtypeStruct((n, 784), jnp.float32),)

        n, p, compiles = tidyjax.largest_fitting(step, make_args, lo=1, hi=4096, limit=2**30)
        ```
    """
    where = "tidyjax.largest_fitting()"
    check_callable(fn, where)
    check_callable(make_args, f"{where}'s make_args")
    lo, hi = check_count(lo, "lo", where), check_count(hi, "hi", where)
    if lo > hi:
        raise TidyjaxValueError(
            f"{where}'s lo ({lo}) is larger than its hi ({hi}): give lo <= hi, the smallest and "
            "the largest batch size to try."
        )
    limit = _check_limit(limit, where)
    name = _name(fn)
    compiles = 0

    def at(n: int) -> MemoryPlan | OutOfMemoryError:
        nonlocal compiles
        args = make_args(n)
        if not isinstance(args, tuple):
            raise TidyjaxTypeError(
                f"{where}'s make_args({n}) must return the tuple of {name}'s positional "
                f"arguments, got {type(args).__name__}; return (x,) for a single argument."
            )
        compiles += 1
        try:
            return _plan(fn, args, {}, limit, stacklevel=4, warn=compiles == 1)
        except OutOfMemoryError as e:
            return e

    first = at(lo)
    if isinstance(first, OutOfMemoryError):
        raise TidyjaxValueError(
            f"{where}: nothing fits: compiling {name} at lo={lo} already ran out of memory. "
            f"Lower lo, or make the call smaller. {first}"
        ) from first
    if first.limit_bytes is None:
        raise TidyjaxValueError(
            f"{where}: no memory limit is known for {first.device} (the backend reports none, "
            "as on CPU), so nothing can be said to fit: pass limit=BYTES (per device), e.g. "
            "limit=8 * 2**30."
        )
    if first.fits is None:
        raise TidyjaxValueError(
            f"{where}: XLA gave no memory figures for {name} on this backend, so whether it "
            f"fits is unknown.\n{first}"
        )
    if not first.fits:
        raise TidyjaxValueError(
            f"{where}: nothing fits: already at lo={lo} the call of {name} needs more than the "
            f"limit. Lower lo, free what is live, or raise limit=. The plan at lo:\n{first}"
        )
    good, best = lo, first
    bad = hi + 1
    if hi > lo:  # the top first: when everything fits, two compiles
        top = at(hi)
        if isinstance(top, MemoryPlan) and top.fits:
            return hi, top, compiles
        bad = hi
    while bad - good > 1:
        mid = (good + bad) // 2
        p = at(mid)
        if isinstance(p, MemoryPlan) and p.fits:
            good, best = mid, p
        else:
            bad = mid
    return good, best, compiles


# -- XLA's figures kept per signature: budgets and observers share them ------------------------

#: How many signatures of one function the figures are kept for (the oldest goes first).
CACHE_SIZE = 64

_CACHE: weakref.WeakKeyDictionary[Any, collections.OrderedDict[Any, CallFigures]] = (
    weakref.WeakKeyDictionary()
)
_LOCK = threading.Lock()

#: What `kept_call_figures` returns for a call made inside a JAX trace (an outer call's
#: figures hold it): nothing to plan or report.
TRACED = CallFigures("<traced>", "traced", (), MappingProxyType({}))


def _signature(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """What decides the compiled call: the tree, each array's shape, dtype, weak type and
    sharding, each other leaf's type and value; `TRACED` inside a trace; None when a leaf is
    not hashable (the call is planned, not kept)."""
    leaves, tree = jax.tree.flatten((args, kwargs))
    parts: list[Any] = [tree]
    for x in leaves:
        if isinstance(x, Tracer):
            return TRACED
        if isinstance(x, jax.Array):
            parts.append((x.shape, x.dtype, x.weak_type, x.sharding))
        elif isinstance(x, np.ndarray):
            parts.append((np.ndarray, x.shape, x.dtype))
        else:
            parts.append((type(x), x))
    key = tuple(parts)
    try:
        hash(key)
    except TypeError:
        return None
    return key


def kept_call_figures(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    read: Callable[..., CallFigures] | None = None,
) -> CallFigures | None:
    """The `CallFigures` of the call ``fn(*args, **kwargs)`` of a ``tidyjax.jit`` object, read
    once per signature (``read``, `call_figures` by default, compiles it) and kept per function
    (`CACHE_SIZE` signatures); `TRACED` inside a trace; None where it cannot be planned
    (arguments the call itself refuses, a disposed Tensor).

    Raises:
        OutOfMemoryError: XLA ran out of memory compiling it (TPU): the call could not run.
    """
    try:
        key = _signature(args, kwargs)
    except Exception:  # a disposed Tensor, a deleted array: the call raises its own error
        return None
    if key is TRACED:
        return TRACED
    found = _kept(fn, key) if key is not None else None
    if found is not None:
        return found
    try:
        call = (read or call_figures)(fn, args, kwargs, stacklevel=2, warn=False)
    except OutOfMemoryError:
        raise
    except Exception:  # the call raises its own error, which is the one to see
        return None
    if key is not None:
        _keep(fn, key, call)
    return call


def _unknown(fn: Callable[..., Any]) -> CallFigures:
    """The figures of a call that could not be planned: every one unknown."""
    return CallFigures(_name(fn), "tidyjax.jit", (), MappingProxyType(dict.fromkeys(_XLA_FIELDS)))


def observe_call(
    fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], run: Callable[[], Any]
) -> Any:
    """A ``tidyjax.jit`` call (``run()``) while something observes (``_registry.observers``:
    a profile, a timeline): the call runs, then each observer with a ``call(name, figures)``
    method hears of its figures (kept per signature). A signature not seen yet is read after
    the call from the arguments' shapes taken before it (a donation may consume them): JAX's
    caches then hold the trace, so the user's function is not traced twice (its Python side
    effects run once). Reading never hides the call's own error (a failure to plan makes the
    figures unknown)."""
    try:
        key = _signature(args, kwargs)
    except Exception:  # a disposed Tensor, a deleted array: the call raises its own error
        key = None
    if key is TRACED:
        return run()
    call = _kept(fn, key) if key is not None else None
    shapes = None
    if call is None:
        try:
            shapes = call_shapes(args, kwargs)
        except Exception:
            shapes = None
    out = run()
    if call is None and shapes is not None:
        try:
            call = call_figures(fn, shapes[0], shapes[1], stacklevel=2, warn=False)
        except Exception:  # out of memory compiling, or not plannable: unknown
            call = None
        if call is not None and key is not None:
            _keep(fn, key, call)
    if call is None:
        call = _unknown(fn)
    for o in list(_registry.observers):
        hear = getattr(o, "call", None)
        if hear is not None:
            hear(call.name, call)
    return out


def _kept(fn: Callable[..., Any], key: Any) -> CallFigures | None:
    """The figures kept for ``fn``'s signature ``key``, or None."""
    with _LOCK:
        kept = _CACHE.get(fn)
        found = None if kept is None else kept.get(key)
        if found is not None:
            kept.move_to_end(key)  # type: ignore[union-attr]
        return found


def _keep(fn: Callable[..., Any], key: Any, call: CallFigures) -> None:
    """Keep ``call``, the figures of ``fn``'s signature ``key`` (`CACHE_SIZE` per function)."""
    with _LOCK:
        kept = _CACHE.setdefault(fn, collections.OrderedDict())
        kept[key] = call
        while len(kept) > CACHE_SIZE:
            kept.popitem(last=False)


def call_shapes(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any]:
    """``(args, kwargs)`` with each Tensor and array as its ``ShapeDtypeStruct`` (sharding and
    weak type kept): what lowering needs, readable after a donation."""

    def shape(x: Any) -> Any:
        a = x.array if is_tensor(x) else x
        if isinstance(a, jax.Array):
            return jax.ShapeDtypeStruct(
                a.shape, a.dtype, sharding=a.sharding, weak_type=a.weak_type
            )
        return x

    out: tuple[Any, Any] = jax.tree.map(shape, (args, kwargs), is_leaf=is_tensor)
    return out


_lift.set_call_observer(observe_call)  # every tidyjax.jit call while something observes
