"""The timeline page: one self-contained HTML file, a static SVG image and a live chart.

Everything is aggregated here, in Python, into columns of events: the page holds one path per
creation site and device, never one per buffer, so it stays small and quick at a million events.
A column shows the moment of its largest total, so no peak is lost, and the peak's column is
drawn at least ``_MIN_PEAK`` wide, so a short phase that makes the peak shows at first sight.
The x axis is the order of events (compile pauses and idle time take no room); its ticks are
step numbers when the steps are scopes (the scope path entered most often), else the time, and
a first step that took its compile is marked "first call (compile)". Sites are stacked bottom
up from the one that held bytes longest; a named Variable's buffers are a site of their own.
A timeline of one moment (a snapshot) is drawn as one column.

Each chart is first a self-contained SVG image (``<img src="data:image/svg+xml;base64,...">``,
with its own colours and background), which HTML sanitizers keep: without JavaScript (an
untrusted notebook, a mail preview) the chart, the bands, the legend and the table still show,
and no text of the SVG spills out as loose text. Where scripts run, the script inflates the data
embedded in the page (``FINE_COLUMNS`` columns per device, the scopes, the steps, each site's
hover text and stack: deflated JSON the browser's own ``DecompressionStream`` opens) and draws the
live chart at the page's own pixels: zoom and pan re-aggregate those columns, a band click zooms
to its scope, a legend entry isolates its site, a click keeps the tooltip.

The style sheet and the script are package files (``_static/timeline.css``, ``timeline.js``),
inlined into each page. Colours are CSS variables with fallbacks, as xarray does: JupyterLab's
``--jp-*`` first, then light or dark by ``prefers-color-scheme`` (and VS Code's body classes).

Reads a timeline through ``_window()``, ``_names``, ``_stacks``, ``dropped``, ``peak_bytes``,
``peak_time``, ``start_time`` and ``started_at``; imports nothing of ``_timeline``.
"""

from __future__ import annotations

import base64
import bisect
import collections
import functools
import json
import os
import time
import zlib
from collections.abc import Sequence
from importlib import resources
from typing import Any

from ._format import esc, fmt_bytes

__all__ = ["elapsed", "fragment", "page"]

MAX_COLUMNS = 1000
#: The most columns the page embeds for its script to zoom into (every event below that).
FINE_COLUMNS = 20_000
MAX_LANES = 6
TABLE_ROWS = 25
# The static chart's geometry, in SVG user units (the image scales to the page's width; at
# 650 px its 14-unit text is 10 px). The script draws the live chart at the page's own pixels.
_X0, _PW, _Y0, _PH = 86, 800, 26, 260
_LANE, _WIDTH = 20, 900
_MIN_PEAK = 18  # the peak's column is at least this wide
_CHAR = 7.9  # the width of a character of band text, about
_COMPILED = "first call (compile)"  # the name of the first step's band when it compiled
_OTHER = "#8c959f"  # "other": a grey that reads on light and dark
_PALETTE = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
            "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#8cd17d")  # fmt: skip


#: The scope of a plain jax.Array's events (``_timeline_format.UNTRACKED``, a module of this
#: layer, so not imported): drawn as areas apart from the Tensors made at the same site.
_UNTRACKED = "<untracked>"
_UNTRACKED_SUFFIX = " (untracked)"


def _label(site: Any, untracked: bool = False) -> str:
    """A site as every tidyjax report names it (``train.py:12 in step``, ``In[3], line 2``),
    ``" (untracked)"`` added for plain jax.Arrays."""
    text = "<unknown site>" if site is None else str(site)
    return text + _UNTRACKED_SUFFIX if untracked else text


def elapsed(seconds: float) -> str:
    """``+12.3 ms``, ``+4.56 s``, ``+7.8 min``."""
    if seconds < 1:
        return f"+{seconds * 1e3:.1f} ms"
    if seconds < 120:
        return f"+{seconds:.2f} s"
    return f"+{seconds / 60:.1f} min"


def _top(counter: collections.Counter[str], n: int = 3) -> str:
    items = counter.most_common(n)
    text = ", ".join(k if c == 1 else f"{k} ×{c}" for k, c in items)  # noqa: RUF001
    if len(counter) > n:
        text += f", … ({len(counter) - n} more)"
    return text


class _Sites:
    """The creation sites seen, each with its running and largest live bytes and what it
    allocated. A site is compared by value once per distinct object, then found by ``id``.
    The plain jax.Arrays made at a site are a site of their own (``untracked``)."""

    def __init__(self) -> None:
        self.ids: dict[int, int] = {}  # id(Site object) -> site index, for Tensors' buffers
        self.uids: dict[int, int] = {}  # the same, for plain arrays
        self._by_value: dict[Any, int] = {}
        self.untracked: list[bool] = []
        self._keep_alive: list[Any] = []  # the Site objects whose ids are keys of `ids`
        self.sites: list[Any] = []
        self.cur: list[int] = []
        self.most: list[int] = []
        self.info: list[dict[tuple[str, tuple[int, ...], str], int]] = []
        self.life: list[int] = []  # for how many events it held bytes
        self.since: list[int] = []  # the event since which it holds bytes

    def add(self, site: Any, untracked: bool = False) -> int:
        """The index of ``site``, a Site object not seen before (its value may have been)."""
        i = self._by_value.get((site, untracked))
        if i is None:
            i = self._by_value[(site, untracked)] = len(self.sites)
            self.sites.append(site)
            self.untracked.append(untracked)
            self.cur.append(0)
            self.most.append(0)
            self.info.append({})
            self.life.append(0)
            self.since.append(0)
        (self.uids if untracked else self.ids)[id(site)] = i
        self._keep_alive.append(site)
        return i


class _VarSite:
    """A named Variable's buffers, drawn as a site of their own (not the line of ``assign``)."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __str__(self) -> str:
        return f"Variable {self.name!r}"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _VarSite) and other.name == self.name

    def __hash__(self) -> int:
        return hash(("tidyjax.Variable", self.name))


def _named(events: list[Any], names: dict[int, str], cache: dict[str, _VarSite]) -> list[Any]:
    """``events`` with the site of each named Variable's buffer replaced by its name."""
    out = []
    for ev in events:
        name = names.get(ev.buffer) if ev.kind == "alloc" or ev.kind == "free" else None
        if name is None:
            out.append(ev)
            continue
        site = cache.get(name)
        if site is None:
            site = cache[name] = _VarSite(name)
        out.append(ev._replace(site=site))
    return out


class _Chart:
    """The aggregated picture of a timeline's events (two passes over them, no per-buffer
    output): the top sites, each device's columns, the scopes, and what was alive at the peak.

    Columns come at two resolutions: ``fine`` columns (every event up to ``FINE_COLUMNS``; the
    page's script re-aggregates them when zoomed) and the static chart's ``columns``, each the
    fine column of the largest total in its group. A snapshot (``moment``: allocations only, all
    at one time) is one column."""

    def __init__(self, tl: Any, top: int, at: Any = None) -> None:
        base, events = tl._window()
        names = getattr(tl, "_names", None)
        if names:
            cache: dict[str, _VarSite] = {}
            base, events = _named(base, names, cache), _named(events, names, cache)
        self.stacks: dict[Any, list[Any]] = getattr(tl, "_stacks", None) or {}
        self.n = n = len(events)
        # a snapshot (Timeline.from_snapshot): allocations only, all at its start and stop
        self.moment = (
            bool(n)
            and tl.start_time == tl.stop_time == events[0].time == events[-1].time
            and all(ev.kind == "alloc" for ev in events)
        )
        self.fine = 1 if self.moment else max(1, min(n, FINE_COLUMNS))
        self.columns = max(1, min(self.fine, MAX_COLUMNS))
        self.t0 = tl.start_time if tl.start_time is not None else (events[0].time if n else 0.0)
        sites = _Sites()
        devices = self._scan(base, events, sites)
        slot = self._rank(sites, top)
        self.devices = sorted(devices)
        self._fill_columns(base, events, sites.ids, sites.uids, slot)
        self._columns()
        self._steps()
        self.lanes = _lanes(self)
        self.peak_live: list[Any] = _alive_after(base, events, [self.peak_index])[0]
        self.device_live = (
            _alive_after(base, events, self.device_peak_index)
            if len(self.devices) > 1
            else [self.peak_live]
        )
        self.end_time = (events[-1].time - self.t0) if n else 0.0
        self._place_marks(tl, base, events, at)

    def _place_marks(self, tl: Any, base: list[Any], events: list[Any], at: Any) -> None:
        """Each mark (``tl._marks``, and ``at`` if not one of them) as (event position: how
        many events came at or before it, mark), in time order; with ``at``, the table shows
        what was alive at it (``peak_live``, ``device_live``) instead of at the peak."""
        marks = list(getattr(tl, "_marks", None) or ())
        if at is not None and at not in marks:
            marks.append(at)
        marks.sort(key=lambda m: m.time)
        times = [ev.time for ev in events]
        self.marks: list[tuple[int, Any]] = [
            (bisect.bisect_right(times, m.time), m) for m in marks if not self.moment
        ]
        self.at = at
        # each device's peak moment (its first event reaching it; before the events: t0)
        self.peak_times = [events[i].time if i >= 0 else self.t0 for i in self.device_peak_index]
        if at is None or self.moment:
            return
        k = bisect.bisect_right(times, at.time)
        self.at_live = _alive_after(base, events, [k - 1])[0]
        self.peak_live = self.at_live
        self.device_live = [self.at_live] * len(self.devices)

    def _scan(self, base: list[Any], events: list[Any], sites: _Sites) -> set[str]:
        """Pass 1: each site's largest live bytes, what it allocated and how long its bytes
        lived, the scopes as bands, the peak (``peak``, ``peak_index``: the state after that
        event); returns the devices."""
        ids, uids, cur, most, info = sites.ids, sites.uids, sites.cur, sites.most, sites.info
        life, since = sites.life, sites.since
        devices: set[str] = set()
        total = peak = 0
        self.peak_index = -1  # -1: the peak is before any event kept
        enters: dict[int, tuple[int, Any]] = {}
        self.bands_raw: list[tuple[int, int, str, str, float]] = []
        nb = len(base)
        for i, ev in enumerate((*base, *events)):
            kind = ev.kind
            if kind == "alloc" or kind == "free":
                plain = ev.scope == _UNTRACKED
                s = (uids if plain else ids).get(id(ev.site))
                if s is None:
                    s = sites.add(ev.site, plain)
                for d, _ in ev.per_device or ((ev.device, ev.bytes),):
                    devices.add(d)
                if kind == "alloc":
                    key = (ev.dtype, ev.shape, ev.scope)
                    counts = info[s]
                    counts[key] = counts.get(key, 0) + 1
                    if not cur[s]:
                        since[s] = i
                    v = cur[s] = cur[s] + ev.bytes
                    if v > most[s]:
                        most[s] = v
                    total += ev.bytes
                    if total > peak:
                        peak, self.peak_index = total, i - nb
                else:
                    v = cur[s] = cur[s] - ev.bytes
                    total -= ev.bytes
                    if v <= 0 < ev.bytes:
                        life[s] += i - since[s]
            elif kind == "scope_enter":
                enters[ev.buffer] = (i - nb, ev)
            elif kind == "scope_exit":
                start, opened = enters.pop(ev.buffer, (-1, ev))
                self.bands_raw.append(
                    (start, i - nb, opened.name, opened.scope, ev.time - opened.time)
                )
        end = nb + len(events)
        for s, v in enumerate(cur):  # holding bytes at the end
            if v > 0:
                life[s] += end - since[s]
        self.span = max(end, 1)
        for start, ev in enters.values():  # still open when the recording stopped
            end_time = events[-1].time if events else ev.time
            self.bands_raw.append((start, len(events), ev.name, ev.scope, end_time - ev.time))
        self.peak = peak
        return devices

    def _rank(self, sites: _Sites, top: int) -> list[int]:
        """The ``top`` sites by their largest live bytes, each with its hover text (``sites``),
        the rest as one "other"; returns each site's stack slot. The slots go bottom up from
        the site that held bytes longest (in tenths of the run), then the largest."""
        site_list, most, info, plain = sites.sites, sites.most, sites.info, sites.untracked
        ranked = sorted(
            range(len(site_list)), key=lambda s: (-most[s], _label(site_list[s], plain[s]))
        )
        life, span = sites.life, self.span

        def lived(s: int) -> int:  # the share of the run it held bytes, in tenths
            return int(10 * life[s] / span)

        self.top = sorted(
            ranked[:top],
            key=lambda s: (-lived(s), -most[s], _label(site_list[s], plain[s])),
        )
        others = ranked[top:]
        self.other = bool(others)
        k = len(self.top) + (1 if self.other else 0)
        slot = [k - 1] * len(site_list)  # "other" for all but the top sites
        for i, s in enumerate(self.top):
            slot[s] = i
        self.sites = [_describe(_label(site_list[s], plain[s]), [info[s]]) for s in self.top]
        for d, s in zip(self.sites, self.top, strict=True):
            d["stack"] = [str(f) for f in (self.stacks.get(site_list[s]) or [()])[0]]
        if self.other:
            label = f"other ({len(others)} sites)"
            self.sites.append(_describe(label, [info[s] for s in others]))
            self.sites[-1]["stack"] = []
            self.sites[-1]["other"] = True
        return slot

    def _fill_columns(
        self,
        base: list[Any],
        events: list[Any],
        site_ids: dict[int, int],
        plain_ids: dict[int, int],
        slot: list[int],
    ) -> None:
        """Pass 2: per device, each fine column's stack of slots at the moment of its largest
        total (``fine_cols``), each fine column's time (``fine_times``), and each device's
        peak (``device_peak``, the event after which it is reached: ``device_peak_index``)."""
        c, n = self.fine, self.n
        dindex = {d: j for j, d in enumerate(self.devices)}
        nd = len(self.devices)
        vec, tot = _stacks(base, dindex, len(self.sites), site_ids, plain_ids, slot)
        cols: list[list[list[int]]] = [[] for _ in range(nd)]
        best = [0] * nd
        best_vec: list[list[int]] = [[] for _ in range(nd)]
        peak, peak_at = tot[:], [-1] * nd
        self.fine_times: list[float] = []
        column = -1
        for i, ev in enumerate(events):
            col = i * c // n
            if col != column:
                if column >= 0:
                    for j in range(nd):
                        cols[j].append(best_vec[j])
                column = col
                self.fine_times.append(ev.time - self.t0)
                for j in range(nd):
                    best[j] = tot[j]
                    best_vec[j] = vec[j][:]
            kind = ev.kind
            if kind == "alloc":
                ids = plain_ids if ev.scope == _UNTRACKED else site_ids
                s = slot[ids[id(ev.site)]]
                for d, b in ev.per_device or ((ev.device, ev.bytes),):
                    j = dindex[d]
                    v = vec[j]
                    v[s] += b
                    t = tot[j] = tot[j] + b
                    if t > best[j]:
                        best[j] = t
                        best_vec[j] = v[:]
                    if t > peak[j]:
                        peak[j], peak_at[j] = t, i
            elif kind == "free":
                ids = plain_ids if ev.scope == _UNTRACKED else site_ids
                s = slot[ids[id(ev.site)]]
                for d, b in ev.per_device or ((ev.device, ev.bytes),):
                    j = dindex[d]
                    vec[j][s] -= b
                    tot[j] -= b
        if n:
            for j in range(nd):
                cols[j].append(best_vec[j])
        else:
            self.fine_times.append(0.0)
            for j in range(nd):
                cols[j].append(vec[j][:])
        self.fine_cols = cols
        self.device_peak = peak
        self.device_peak_index = peak_at
        self.device_peak_fine = [max(0, a) * c // max(n, 1) for a in peak_at]

    def _columns(self) -> None:
        """The static chart's columns: per group of fine columns, the one of the largest total."""
        f, c = self.fine, self.columns
        self.cols: list[list[list[int]]] = []
        starts = [g * f // c for g in range(c + 1)]
        self.times = [self.fine_times[starts[g]] for g in range(c)]
        for fine in self.fine_cols:
            sums = [sum(v) for v in fine]
            out = []
            for g in range(c):
                lo, hi = starts[g], max(starts[g + 1], starts[g] + 1)
                best = max(range(lo, hi), key=sums.__getitem__)
                out.append(fine[best])
            self.cols.append(out)
        self.device_peak_col = [p * c // f for p in self.device_peak_fine]

    def _steps(self) -> None:
        """The steps, when they are scopes: the scope path entered most often (at least 3
        times) of the fewest levels; ``steps``: each step's (start event, end event, seconds).
        ``compiled``: the first step took over 5 times the others' median (its compile)."""
        paths = collections.Counter(path for _, _, _, path, _ in self.bands_raw)
        found = [p for p, k in paths.items() if k >= 3]
        self.step_path = min(found, key=lambda p: (p.count("/"), -paths[p], p)) if found else None
        self.steps = sorted(
            (max(s, 0), e, dt) for s, e, _, path, dt in self.bands_raw if path == self.step_path
        )
        self.compiled = False
        if len(self.steps) >= 3:
            rest = sorted(dt for _, _, dt in self.steps[1:])
            median = rest[len(rest) // 2]
            self.compiled = self.steps[0][2] > max(5 * median, 0.05)

    def fpos(self, event: float) -> float:
        """An event position as a fine-column position."""
        return event * self.fine / max(self.n, 1)


def _stacks(
    base: list[Any],
    dindex: dict[str, int],
    k: int,
    site_ids: dict[int, int],
    plain_ids: dict[int, int],
    slot: list[int],
) -> tuple[list[list[int]], list[int]]:
    """Per device, the bytes in each of the ``k`` slots and in all, of what ``base`` (the
    allocations dropped events left alive) holds."""
    vec = [[0] * k for _ in dindex]
    tot = [0] * len(dindex)
    for ev in base:
        s = slot[(plain_ids if ev.scope == _UNTRACKED else site_ids)[id(ev.site)]]
        for d, b in ev.per_device or ((ev.device, ev.bytes),):
            j = dindex[d]
            vec[j][s] += b
            tot[j] += b
    return vec, tot


def _alive_after(base: list[Any], events: list[Any], indexes: list[int]) -> list[list[Any]]:
    """For each of ``indexes``, the allocations alive after ``events[index]`` (-1: before the
    first), oldest first; one replay for them all."""
    live = {ev.buffer: ev for ev in base}
    want = sorted(set(indexes))
    found: dict[int, list[Any]] = {}
    k = 0
    while k < len(want) and want[k] < 0:
        found[want[k]] = list(live.values())
        k += 1
    for i, ev in enumerate(events):
        if k >= len(want):
            break
        kind = ev.kind
        if kind == "alloc":
            live[ev.buffer] = ev
        elif kind == "free":
            live.pop(ev.buffer, None)
        while k < len(want) and want[k] == i:
            found[i] = list(live.values())
            k += 1
    for w in want[k:]:
        found[w] = list(live.values())
    return [found[i] for i in indexes]


def _describe(
    label: str, infos: list[dict[tuple[str, tuple[int, ...], str], int]]
) -> dict[str, Any]:
    """What the hover says of a site (or of "other"): its shapes, dtypes and scopes."""
    shapes: collections.Counter[str] = collections.Counter()
    dtypes: dict[str, None] = {}
    scopes: collections.Counter[str] = collections.Counter()
    for counts in infos:
        for (dtype, shape, scope), k in counts.items():
            shapes[f"{dtype}{list(shape)}".replace(" ", "")] += k
            dtypes[dtype] = None
            scopes[scope or "(no scope)"] += k
    return {"label": label, "shapes": _top(shapes), "dtypes": ", ".join(dtypes),
            "scopes": _top(scopes), "allocs": sum(scopes.values())}  # fmt: skip


# -- drawing ---------------------------------------------------------------------------------


class _XMap:
    """Static columns to SVG x: equal columns, except the peak's, at least ``_MIN_PEAK`` wide
    so that the peak's contents show at first sight."""

    def __init__(self, columns: int, wide: int) -> None:
        self.columns = columns
        self.w = self.ww = _PW / columns
        self.wide = -1
        if columns > 1 and 0 <= wide < columns and self.w < _MIN_PEAK:
            self.w, self.ww, self.wide = (_PW - _MIN_PEAK) / (columns - 1), _MIN_PEAK, wide

    def __call__(self, pos: float) -> float:
        wide = self.wide
        if wide < 0 or pos <= wide:
            return _X0 + pos * self.w
        if pos >= wide + 1:
            return _X0 + (pos - 1) * self.w + self.ww
        return _X0 + wide * self.w + (pos - wide) * self.ww


def _nice(vmax: float) -> tuple[float, int]:
    """A round tick step (1, 2 or 5 times a power of two of bytes' units) and a tick count."""
    if vmax <= 0:
        return 1.0, 1
    unit = 1.0
    for u in (1024.0**3, 1024.0**2, 1024.0, 1.0):
        if vmax >= u:
            unit = u
            break
    raw = vmax / unit / 4
    mag = 10 ** int(f"{raw:e}".split("e")[1])
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    step *= unit
    return step, int(vmax // step) + 1


def _edge(ys: Sequence[float], x: _XMap, reverse: bool) -> str:
    """A step line through each column's value: left to right (``M`` first), or right to left
    continuing the path (the lower edge of an area)."""
    columns = x.columns
    last = columns - 1
    if not reverse:
        out = [f"M{x(0):.1f} {ys[0]:.1f}"]
        for c in range(1, columns):
            if ys[c] != ys[c - 1]:
                out.append(f"H{x(c):.1f}V{ys[c]:.1f}")
        out.append(f"H{x(columns):.1f}")
    else:
        out = [f"V{ys[last]:.1f}"]
        for c in range(last - 1, -1, -1):
            if ys[c] != ys[c + 1]:
                out.append(f"H{x(c + 1):.1f}V{ys[c]:.1f}")
        out.append(f"H{x(0):.1f}")
    return "".join(out)


def _areas(ch: _Chart, j: int, vmax: float, x: _XMap) -> str:
    cols = ch.cols[j]
    columns = len(cols)
    k = len(ch.sites)
    scale = _PH / vmax if vmax > 0 else 0.0
    bottom = _Y0 + _PH
    below = [0] * columns
    parts = []
    for s in range(k):
        above = [below[c] + cols[c][s] for c in range(columns)]
        top_y = [round(bottom - v * scale, 1) for v in above]
        low_y = [round(bottom - v * scale, 1) for v in below]
        d = _edge(top_y, x, False) + _edge(low_y, x, True) + "Z"
        cls = f"tj-area tj-s{s}" if s < len(ch.top) else "tj-area tj-other"
        label = ch.sites[s]["label"]
        parts.append(
            f'<path class="{cls}" data-site="{s}" data-label="{esc(label)}" d="{d}">'
            f"<title>{esc(label)}</title></path>"
        )
        below = above
    return "".join(parts)


def _nice_count(k: int, most: int) -> int:
    """The smallest of 1, 2, 5, 10, 20, 50, ... that cuts ``k`` items to ``most`` or fewer."""
    mag = 1
    while True:
        for m in (1, 2, 5):
            if k <= most * m * mag:
                return m * mag
        mag *= 10


def _x_ticks(ch: _Chart, most: int = 6) -> list[tuple[float, str]]:
    """The time axis: step numbers when the steps are scopes, else the time since the start
    (positions in fine columns)."""
    if ch.moment:
        return [(ch.fine / 2, "one moment (a snapshot)")]
    if ch.steps:
        stride = _nice_count(len(ch.steps), most)
        return [
            (ch.fpos(start), f"step {k}")
            for k, (start, _, _) in enumerate(ch.steps, 1)
            if k == 1 or k % stride == 0
        ]
    out = []
    fine = ch.fine
    for t in range(most):
        f = round(t * (fine - 1) / (most - 1)) if fine > 1 else 0
        if t and f == 0:
            break
        out.append((f + 0.5, elapsed(ch.fine_times[f])))
    return out


def _axes(ch: _Chart, vmax: float, x: _XMap) -> str:
    step, ticks = _nice(vmax)
    out = []
    bottom = _Y0 + _PH
    for t in range(ticks + 1):
        v = t * step
        if v > vmax * 1.0001 and t:
            break
        y = bottom - (v / vmax * _PH if vmax else 0)
        out.append(
            f'<line class="tj-grid" x1="{_X0}" x2="{_X0 + _PW}" y1="{y:.1f}" y2="{y:.1f}"/>'
            f'<text class="tj-tick" x="{_X0 - 6}" y="{y + 4:.1f}" text-anchor="end">'
            f"{esc(fmt_bytes(v))}</text>"
        )
    last = -1e9
    for pos, label in _x_ticks(ch):
        px = x(pos * ch.columns / ch.fine)
        if px - last < 70:
            continue
        last = px
        anchor = "start" if px < _X0 + 30 else "end" if px > _X0 + _PW - 30 else "middle"
        out.append(
            f'<text class="tj-tick" x="{px:.1f}" y="{bottom + 17}" text-anchor="{anchor}">'
            f"{esc(label)}</text>"
        )
    out.append(f'<line class="tj-axis" x1="{_X0}" x2="{_X0 + _PW}" y1="{bottom}" y2="{bottom}"/>')
    mid = _Y0 + _PH / 2
    out.append(
        f'<text class="tj-ytitle" x="12" y="{mid:.0f}" text-anchor="middle" '
        f'transform="rotate(-90 12 {mid:.0f})">live bytes</text>'
    )
    return "".join(out)


def _fits(label: str, width: float) -> bool:
    return len(label) * _CHAR + 6 <= width


def _groups(
    spans: list[tuple[float, float, str, str, float]], x: _XMap, lone: set[str]
) -> list[list[Any]]:
    """Runs of neighbouring scopes in one lane that are too narrow for their own label; a scope
    named in ``lone`` (rare ones, the compile) stays apart."""
    groups: list[list[Any]] = []
    for x0, x1, name, path, dt in spans:
        px0, px1 = x(x0), x(x1)
        member = (px0, max(px1, px0 + 1.0), name, path, dt)
        last = groups[-1] if groups else None
        narrow = not _fits(name, px1 - px0) and name not in lone
        if (
            last is not None
            and narrow
            and not _fits(last[-1][2], last[-1][1] - last[-1][0])
            and last[-1][2] not in lone
            and px0 - last[-1][1] < 8
        ):
            last.append(member)
            continue
        groups.append([member])
    return groups


def _band(group: list[Any], y: float) -> str:
    x0, x1 = group[0][0], max(m[1] for m in group)
    names = collections.Counter(m[2] for m in group)
    paths = collections.Counter(m[3] for m in group)
    seconds = sum(m[4] for m in group)
    if len(group) == 1:
        label = group[0][2]
        title = f"scope {group[0][3]}: {elapsed(seconds)[1:]}"
    else:
        label = _top(names, 2)
        title = f"{len(group)} scopes ({_top(paths, 3)}): {elapsed(seconds)[1:]} in all"
    h = _LANE - 3
    if len(group) == 1 or (x1 - x0) / len(group) < 3:
        rects = f'<rect x="{x0:.1f}" y="{y}" width="{x1 - x0:.1f}" height="{h}" rx="2"/>'
    else:
        rects = "".join(
            f'<rect x="{m[0]:.1f}" y="{y}" width="{m[1] - m[0]:.1f}" height="{h}" rx="2"/>'
            for m in group
        )
    width = x1 - x0
    text = label
    if not _fits(text, width):
        keep = int((width - 6) / _CHAR) - 1
        text = text[:keep] + "…" if keep >= 3 else ""
    label_svg = f'<text x="{x0 + 3:.1f}" y="{y + 13}">{esc(text)}</text>' if text else ""
    return (
        f'<g class="tj-band" data-name="{esc(label)}">{rects}{label_svg}'
        f"<title>{esc(title)}</title></g>"
    )


def _lanes(ch: _Chart) -> tuple[list[tuple[float, float, str, str, float, int]], int, int]:
    """Each scope as (start, end in fine columns, name, path, seconds, lane): nested or
    concurrent ones in lanes below; with how many lanes, and how many scopes found no lane.
    The first step, when it took its compile, is named "first call (compile)"."""
    n, fine = max(ch.n, 1), ch.fine
    first = ch.steps[0][:2] if ch.compiled else None
    spans = sorted(
        ((s * fine / n if s >= 0 else 0.0, max(e, s + 1) * fine / n,
          _COMPILED if first == (max(s, 0), e) and path == ch.step_path else name,
          path, dt)
         for s, e, name, path, dt in ch.bands_raw),
        key=lambda b: (b[0], -b[1]),
    )  # fmt: skip
    lanes: list[float] = []
    out = []
    hidden = 0
    for span in spans:
        for lane, end in enumerate(lanes):  # noqa: B007 - the lane found is used below
            if end <= span[0] + 1e-9:
                break
        else:
            if len(lanes) >= MAX_LANES:
                hidden += 1
                continue
            lanes.append(0.0)
            lane = len(lanes) - 1
        lanes[lane] = span[1]
        out.append((*span, lane))
    return out, len(lanes), hidden


def _bands(ch: _Chart, x: _XMap) -> tuple[str, int]:
    """Scopes as labelled bands under the chart, nested or concurrent ones in lanes below.

    Neighbours too narrow for their own label share one ("step x1000"), and when they are too
    narrow to tell apart they share one rectangle too: a loop of a million scopes draws a few
    hundred rectangles at most."""
    spans, lanes, hidden = ch.lanes
    scale = ch.columns / ch.fine
    placed: list[list[tuple[float, float, str, str, float]]] = [[] for _ in range(lanes)]
    for s, e, name, path, dt, lane in spans:
        placed[lane].append((s * scale, e * scale, name, path, dt))
    top = _Y0 + _PH + 26
    out = []
    names = collections.Counter(span[2] for span in spans)
    lone = {name for name, k in names.items() if k <= 2} | {_COMPILED}
    for lane, spans_in_lane in enumerate(placed):
        y = top + lane * _LANE
        for group in _groups(spans_in_lane, x, lone):
            out.append(_band(group, y))
    if hidden:
        y = top + lanes * _LANE
        out.append(f'<text class="tj-tick" x="{_X0}" y="{y + 13}">'
                   f"{hidden} more overlapping scopes not drawn</text>")  # fmt: skip
        return "".join(out), lanes + 1
    return "".join(out), lanes


def _chart_svg(ch: _Chart, j: int) -> str:
    """Device ``j``'s chart as a standalone SVG document: its own style sheet and background."""
    vmax = float(ch.device_peak[j]) or 1.0
    pc = ch.device_peak_col[j]
    x = _XMap(ch.columns, -1 if ch.moment else pc)
    bands, lanes = _bands(ch, x)
    height = _Y0 + _PH + 26 + lanes * _LANE + 6
    px = (x(pc) + x(pc + 1)) / 2
    peak = ch.device_peak[j]
    anchor = "end" if px > _X0 + _PW * 0.7 else "start"
    dx = -6 if anchor == "end" else 6
    marker = (
        ""
        if ch.moment
        else f'<g class="tj-peak"><line x1="{px:.1f}" x2="{px:.1f}" y1="{_Y0}" '
        f'y2="{_Y0 + _PH}"/><text x="{px + dx:.1f}" y="{_Y0 - 8}" text-anchor="{anchor}">'
        f"peak {esc(fmt_bytes(peak))}</text></g>"
    )
    return (
        f'<svg class="tj-svg" viewBox="0 0 {_WIDTH} {height}" width="{_WIDTH}" '
        f'height="{height}" role="img" '
        f'aria-label="live bytes over time on {esc(ch.devices[j])}" '
        f'xmlns="http://www.w3.org/2000/svg">'
        f"<style>{_asset('timeline-svg.css')}{_palette_css('', len(ch.top))}"
        f'</style><rect class="tj-bg" width="{_WIDTH}" height="{height}" rx="6"/>'
        f'{_axes(ch, vmax, x)}<g class="tj-areas">{_areas(ch, j, vmax, x)}</g>'
        f'{marker}{_marks_svg(ch, x)}<g class="tj-bands">{bands}</g></svg>'
    )


#: The most characters of a mark's label drawn on the static chart (all of it in its title).
_MARK_CHARS = 40


def _mark_text(mark: Any) -> str:
    """A mark's label with its bytes, as the chart's tooltip and the table say it."""
    return mark.label + ("" if mark.bytes is None else f" ({fmt_bytes(mark.bytes)})")


def _marks_svg(ch: _Chart, x: _XMap) -> str:
    """The marks as dashed vertical lines over the plot, each labelled at its top (staggered
    over three rows, so that neighbours do not write over each other)."""
    out = []
    for i, (k, mark) in enumerate(ch.marks):
        px = x(k * ch.columns / max(ch.n, 1))
        text = _mark_text(mark)
        short = text if len(text) <= _MARK_CHARS else text[: _MARK_CHARS - 1] + "…"
        end = px > _X0 + _PW * 0.6
        tx = px - 4 if end else px + 4
        y = _Y0 + 16 + 17 * (i % 3)
        out.append(
            f'<g class="tj-mark" data-label="{esc(mark.label)}"><line x1="{px:.1f}" '
            f'x2="{px:.1f}" y1="{_Y0}" y2="{_Y0 + _PH}"/><text x="{tx:.1f}" y="{y}" '
            f'text-anchor="{"end" if end else "start"}">{esc(short)}</text>'
            f"<title>{esc(text)} at {esc(elapsed(max(0.0, mark.time - ch.t0)))}</title></g>"
        )
    return f'<g class="tj-marks">{"".join(out)}</g>' if out else ""


def _chart_img(ch: _Chart, j: int) -> str:
    """Device ``j``'s chart as an image that sanitizers keep (a data URI in ``<img src>``,
    sized by inline styles they allow); the script draws the live chart over it."""
    svg = base64.b64encode(_chart_svg(ch, j).encode("utf-8")).decode("ascii")
    alt = f"live bytes over time on {ch.devices[j]}, peak {fmt_bytes(ch.device_peak[j])}"
    return (
        f'<img class="tj-static" alt="{esc(alt)}" src="data:image/svg+xml;base64,{svg}" '
        f'style="display:block;width:100%;max-width:{_WIDTH}px;height:auto">'
    )


def _legend(ch: _Chart) -> str:
    items = []
    for s, site in enumerate(ch.sites):
        cls = f"tj-s{s}" if s < len(ch.top) else "tj-other"
        colour = _PALETTE[s % len(_PALETTE)] if s < len(ch.top) else _OTHER
        # a plain span with inline styles, which sanitizers keep (an SVG swatch they drop)
        items.append(
            f'<li data-site="{s}"><span class="tj-sw {cls}" aria-hidden="true" style="display:'
            f"inline-block;width:12px;height:12px;border-radius:2px;vertical-align:middle;"
            f'background-color:{colour}"></span> {esc(site["label"])}</li>'
        )
    return f'<ul class="tj-legend">{"".join(items)}</ul>'


# Cells carry their alignment inline too: an untrusted notebook's sanitizer drops the page's
# style sheet, and JupyterLab's own rule would right-align every cell.
_LEFT = ' style="text-align:left"'
_RIGHT = ' style="text-align:right"'


def _peak_table(ch: _Chart, j: int) -> str:
    """What was alive at device ``j``'s peak, largest first; on a page of several devices, in
    the bytes each buffer holds on that device (its shard or copy)."""
    device = ch.devices[j] if ch.devices else ""
    several = len(ch.devices) > 1
    groups: dict[tuple[str, str, str, str], list[int]] = {}
    for ev in ch.device_live[j] if several else ch.peak_live:
        if several:
            nbytes = dict(ev.per_device or ((ev.device, ev.bytes),)).get(device, 0)
            if not nbytes:
                continue
        else:
            nbytes = ev.bytes
        plain = ev.scope == _UNTRACKED  # a plain jax.Array: untracked, no scope frees it
        key = (_label(ev.site, plain), f"{ev.dtype}{list(ev.shape)}".replace(" ", ""),
               "untracked" if plain else ev.scope or "(no scope)",
               device if several else ev.device)  # fmt: skip
        g = groups.setdefault(key, [0, 0])
        g[0] += nbytes
        g[1] += 1
    rows = sorted(groups.items(), key=lambda kv: (-kv[1][0], kv[0]))
    body = "".join(
        f'<tr><td class="tj-num"{_RIGHT}>{esc(fmt_bytes(b))}</td>'
        f'<td class="tj-num"{_RIGHT}>{n}</td><td{_LEFT}>{esc(shape)}</td>'
        f'<td class="tj-site"{_LEFT}>{esc(site)}</td><td{_LEFT}>{esc(scope)}</td>'
        f"<td{_LEFT}>{esc(dev)}</td></tr>"
        for (site, shape, scope, dev), (b, n) in rows[:TABLE_ROWS]
    )
    rest = rows[TABLE_ROWS:]
    if rest:
        more = sum(b for _, (b, _) in rest)
        body += (
            f'<tr><td class="tj-num"{_RIGHT}>{esc(fmt_bytes(more))}</td><td class="tj-num"{_RIGHT}>'
            f'{sum(n for _, (_, n) in rest)}</td><td colspan="4"{_LEFT}>… {len(rest)} more groups'
            "</td></tr>"
        )
    if not rows:
        body = '<tr><td colspan="6">nothing was alive</td></tr>'
    attr = ""
    if ch.moment:
        caption = "Alive in the snapshot, largest first"
    elif ch.at is not None:
        caption, attr = _at_caption(ch, j, groups)
    elif several:
        caption = (
            f"Alive at {esc(device)}'s peak ({esc(fmt_bytes(ch.device_peak[j]))}), largest "
            f"first, in bytes on {esc(device)}"
        )
    else:
        caption = "Alive at the peak, largest first"
    head = "bytes on device" if several else "bytes"
    attr += f' data-device="{j}"' if several else ""
    return (
        f'<table class="tj-peak-table"{attr}><caption>{caption}</caption>'
        f'<thead><tr><th class="tj-num"{_RIGHT}>{head}</th><th class="tj-num"{_RIGHT}>buffers</th>'
        f"<th{_LEFT}>shape</th><th{_LEFT}>created at</th>"
        f"<th{_LEFT}>scope</th><th{_LEFT}>device</th></tr></thead><tbody>{body}</tbody></table>"
    )


def _at_caption(
    ch: _Chart, j: int, groups: dict[tuple[str, str, str, str], list[int]]
) -> tuple[str, str]:
    """The table's caption when it shows what was alive at a mark (``ch.at``), and the
    table's data attributes (the mark's time and bytes, the bytes alive then)."""
    mark = ch.at
    total = sum(g[0] for g in groups.values())
    buffers = sum(g[1] for g in groups.values())
    when = elapsed(max(0.0, mark.time - ch.t0))
    where = f" on {ch.devices[j]}" if len(ch.devices) > 1 else ""
    caption = (
        f"Alive at \u201c{_mark_text(mark)}\u201d ({when}){where}: {fmt_bytes(total)} in "
        f"{buffers:,} buffer{'' if buffers == 1 else 's'}, largest first"
    )
    peak, peak_time = ch.device_peak[j], ch.peak_times[j]
    if peak > total:
        caption += (
            f" (the peak, {fmt_bytes(peak)} at {elapsed(max(0.0, peak_time - ch.t0))}, came "
            f"{'later' if peak_time > mark.time else 'earlier'})"
        )
    req = "" if mark.bytes is None else str(mark.bytes)
    attr = f' data-at="{mark.time!r}" data-mark-bytes="{req}" data-alive="{total}"'
    return esc(caption), attr


@functools.cache
def _asset(name: str) -> str:
    """A file of ``tidyjax/_static``, read once: the page's style sheet and script, inlined in
    each page so that it opens offline as one file."""
    return (resources.files("tidyjax") / "_static" / name).read_text(encoding="utf-8")


def _palette_css(uid: str, k: int) -> str:
    """The site colours, for the page (``uid``: its root's id) or for a standalone SVG (``""``)."""
    scope = f"#{uid} " if uid else ""
    return "".join(
        f"{scope}.tj-s{i}{{fill:var(--tj-c{i},{_PALETTE[i % len(_PALETTE)]})}}" for i in range(k)
    )


def _data(ch: _Chart, selected: int) -> dict[str, Any]:
    """What the page's script draws from: the fine columns (per device, each slot's change
    from the column before), their times (microseconds, as changes), the scopes (``bands``:
    start, end, lane, name, path, milliseconds, how many), the steps (``steps``: position,
    number)."""
    k = len(ch.sites)
    strings: dict[str, int] = {}

    def s(x: str) -> int:
        return strings.setdefault(x, len(strings))

    times, last = [], 0
    for t in ch.fine_times:
        us = round(t * 1e6)
        times.append(us - last)
        last = us
    devices = []
    for j, d in enumerate(ch.devices):
        flat: list[int] = []
        prev = [0] * k
        for col in ch.fine_cols[j]:
            flat.extend(col[i] - prev[i] for i in range(k))
            prev = col
        devices.append({
            "name": d, "peak": ch.device_peak[j], "peakCol": ch.device_peak_fine[j],
            "label": f"{d} · peak {fmt_bytes(ch.device_peak[j])}", "cols": flat,
        })  # fmt: skip
    spans, lanes, hidden = ch.lanes
    # Scopes in a row of one name, in one lane, shorter than a fine column together, are one
    # band (with their count): the script cannot zoom in further than a fine column.
    runs: list[list[Any]] = []
    open_run: dict[int, list[Any]] = {}
    for start, end, name, path, dt, lane in spans:
        run = open_run.get(lane)
        if run is not None and run[3] == name and run[4] == path and end - run[0] < 1.0:
            run[1], run[5], run[6] = end, run[5] + dt, run[6] + 1
            continue
        run = open_run[lane] = [start, end, lane, name, path, dt, 1]
        runs.append(run)
    bands: list[Any] = []
    for start, end, lane, name, path, dt, k in runs:
        bands.extend(
            (round(start, 2), round(end, 2), lane, s(name), s(path), round(dt * 1e3, 3), k)
        )
    steps: list[Any] = []  # [position, step number], the first step in each fine column
    last = -1
    for k, (start, _, _) in enumerate(ch.steps, 1):
        pos = ch.fpos(start)
        if int(pos) != last:
            last = int(pos)
            steps.extend((round(pos, 2), k))
    marks: list[Any] = []  # [fine position, label, bytes or null] per mark
    for k, mark in ch.marks:
        marks.extend((round(ch.fpos(k), 2), s(mark.label), mark.bytes))
    return {
        "marks": marks,
        "events": ch.n, "fine": ch.fine, "moment": ch.moment, "times": times,
        "sites": ch.sites, "devices": devices, "selected": selected, "bands": bands,
        "lanes": lanes, "hidden": hidden, "steps": steps, "stepPath": ch.step_path,
        "strings": list(strings),
    }  # fmt: skip


def _payload(data: dict[str, Any]) -> str:
    """``data`` as compact JSON, deflated and in base64, inside JSON (the page inflates it with
    the browser's own ``DecompressionStream``: no library, still one offline file)."""
    raw = json.dumps(data, separators=(",", ":")).encode("utf-8")
    packed = base64.b64encode(zlib.compress(raw, 6)).decode("ascii")
    return json.dumps({"format": "tidyjax.timeline.page", "deflated": packed})


def _subtitle(tl: Any, ch: _Chart) -> str:
    when = ""
    if tl.started_at:
        when = " · started " + time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(tl.started_at))
    if ch.moment:
        buffers = f"{ch.n:,} buffer" + ("" if ch.n == 1 else "s")
        sub = [f"a snapshot: {buffers} at one moment", f"{fmt_bytes(ch.peak)} in all"]
        return f'<p class="tj-sub">{esc(" · ".join(sub))}{esc(when)}.</p>'
    sub = [f"{ch.n:,} events over {elapsed(ch.end_time)[1:]}"]
    if len(ch.devices) > 1:
        lo, hi = min(ch.device_peak), max(ch.device_peak)
        each = fmt_bytes(hi) if lo == hi else f"{fmt_bytes(lo)}\u2013{fmt_bytes(hi)}"
        sub.append(
            f"peak per device {each} ({fmt_bytes(tl.peak_bytes or ch.peak)} over "
            f"{len(ch.devices)} devices together)"
        )
    else:
        sub.append(
            f"peak {fmt_bytes(tl.peak_bytes or ch.peak)} at "
            f"{elapsed(max(0.0, tl.peak_time - ch.t0))}"
        )
    if tl.dropped:
        sub.append(f"{tl.dropped:,} older events dropped (max_events): the page starts after them")
    if ch.steps:
        axis = f"x: events in order, ticks at steps (scope {ch.step_path})"
    else:
        axis = "x: events in order, ticks give the time since the start"
    if ch.compiled:
        rest = sorted(dt for _, _, dt in ch.steps[1:])
        axis += (
            f"; step 1 took {elapsed(ch.steps[0][2])[1:]}, the first call (compile), the "
            f"others {elapsed(rest[len(rest) // 2])[1:]} (median)"
        )
    return f'<p class="tj-sub">{esc(" · ".join(sub))}{esc(when)}. {esc(axis)}.</p>'


def fragment(tl: Any, *, top: int = 10, at: Any = None) -> str:
    """The chart, bands and table as one ``<div>`` with its style and script (for notebooks);
    ``at``: a mark (``_timeline_format.Mark``, drawn even if not one of the timeline's) at
    whose moment the table shows what was alive, instead of at the peak."""
    ch = _Chart(tl, top, at)
    uid = "tjtl-" + os.urandom(5).hex()
    head = f"<h2>tidyjax timeline</h2>{_subtitle(tl, ch)}"
    if not ch.devices:
        return (
            f'<div class="tjtl" id="{uid}"><style>{_asset("timeline.css")}</style>{head}'
            "<p>No tidyjax memory events were recorded.</p></div>"
        )
    default = max(range(len(ch.devices)), key=lambda j: (ch.device_peak[j], -j))
    # Without the script every device's chart shows, each under its name; the script shows one.
    names = len(ch.devices) > 1
    charts = "".join(
        f'<section class="tj-chart" data-device="{j}">'
        + (f'<div class="tj-dev">{esc(d)} · peak {esc(fmt_bytes(ch.device_peak[j]))}</div>'
           if names else "")
        + f"{_chart_img(ch, j)}</section>"
        for j, d in enumerate(ch.devices)
    )  # fmt: skip
    tables = "".join(_peak_table(ch, j) for j in range(len(ch.devices)) if names or j == 0)
    payload = _payload(_data(ch, default)).replace("</", "<\\/")
    return (
        f'<div class="tjtl" id="{uid}">'
        f"<style>{_asset('timeline.css')}{_palette_css(uid, len(ch.top))}</style>"
        f"{head}{charts}{_legend(ch)}{tables}"
        f'<script type="application/json" class="tj-data">{payload}</script>'
        f"<script>{_asset('timeline.js').replace('%ID%', uid)}</script></div>"
    )


def page(tl: Any, *, top: int = 10, at: Any = None) -> str:
    """The whole page: `fragment` in a document that opens from disk, offline."""
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="color-scheme" content="light dark">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        "<title>tidyjax timeline</title>"
        "<style>body{margin:0;padding:16px;background:Canvas;color:CanvasText}</style>"
        f"</head><body>{fragment(tl, top=top, at=at)}</body></html>"
    )
