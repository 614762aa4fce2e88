"""The timeline page: one self-contained HTML file, whose script draws the chart.

Python aggregates the events (two passes, no per-buffer output) into ``FINE_COLUMNS`` columns per
device, each at the moment of its largest total, so no peak is lost: a series per top site (by
largest live bytes, stacked bottom up from the one that held bytes longest; a named Variable's
buffers are a site of their own), the rest as "other", and on top a band per function whose
``tidyjax.jit`` calls' XLA temporaries were recorded ("XLA temporaries of step": in a column
whose moment is a call's, over the arrays alive then, so the column reaches the device peak).
The page embeds them, with the sites' hover text, the scopes and the marks, as deflated JSON for
its script (``_static/timeline.js``), which owns the chart: areas, axes, scope bands, peak,
marks, legend, zoom and pan.

Sanitizers (untrusted notebooks, nbviewer) drop ``<script>``, ``<style>`` and ``<svg>`` but keep
``<img>`` data URIs and inline styles: there the page shows its title, summary, sites, per device
an image (one area, the peak, the marks) and the table of what was alive at the peak. Reads a
timeline through its fields (``_window()``, ``_names``, ...); imports nothing of ``_timeline``."""

from __future__ import annotations

import base64
import bisect
import collections
import functools
import itertools
import json
import time
import zlib
from importlib import resources
from typing import Any

from ._census import UNTRACKED, WATCHED, site_label
from ._format import describe, esc, fmt_bytes
from ._timeline_format import ALLOC, FREE, TEMPORARIES, replay, replay_peak, shares

__all__ = ["alive_after", "elapsed", "fragment", "page"]

#: The columns per device the page embeds for its script to draw and zoom into.
FINE_COLUMNS = 20_000
TABLE_ROWS = 25
#: The functions whose temporaries are a band each (the largest); the rest share one.
TEMP_BANDS = 5
# The static image, in SVG user units (it scales to the page's width): a plot of _COLUMNS
# columns, the peak's label above it.
_W, _H, _X0, _Y0, _PW, _PH = 900, 200, 12, 30, 876, 160
_COLUMNS = 450
#: The scopes of a plain jax.Array's events, and of one a watched object holds: each kind drawn
#: as series apart from the Tensors made at the same site.
_KINDS = {UNTRACKED: "untracked", WATCHED: "watched"}
# Cells carry their alignment inline: an untrusted notebook's sanitizer drops the page's style
# sheet, and JupyterLab's own rule would right-align every cell.
_LEFT, _RIGHT = ' style="text-align:left"', ' style="text-align:right"'
_NOTHING = '<tr><td colspan="6">nothing was alive</td></tr>'


def elapsed(seconds: float) -> str:
    """``+12.3 ms``, ``+4.56 s``, ``+7.8 min``."""
    if seconds < 1:
        return f"+{seconds * 1e3:.1f} ms"
    return f"+{seconds:.2f} s" if seconds < 120 else f"+{seconds / 60:.1f} min"


def _top(counter: collections.Counter[str], n: int = 3) -> str:
    text = ", ".join(k if c == 1 else f"{k} ×{c}" for k, c in counter.most_common(n))  # noqa: RUF001
    return text + (f", … ({len(counter) - n} more)" if len(counter) > n else "")


class _Sites:
    """The sites seen (``keys``: (site, kind) to index), each with its live and largest bytes,
    what it allocated and how long it held bytes; compared by value once per object, then by id."""

    def __init__(self) -> None:
        # id(site) to index, for Tensors' and plain arrays' events (which keep their sites alive)
        self._ids: dict[str, dict[int, int]] = {"tensor": {}, "untracked": {}, "watched": {}}
        self.keys: dict[tuple[Any, str], int] = {}
        self.info: list[dict[tuple[str, tuple[int, ...], str], int]] = []
        self.cur: list[int] = []
        self.most: list[int] = []
        self.life: list[int] = []  # for how many events it held bytes
        self.since: list[int] = []  # the event since which it holds bytes

    def index(self, ev: Any) -> int:
        """The index of the site of ``ev``, an allocation or a free."""
        kind = _KINDS.get(ev.scope, "tensor")
        i = self._ids[kind].get(id(ev.site))
        if i is None:
            key = (ev.site, kind)
            i = self._ids[kind][id(ev.site)] = self.keys.setdefault(key, len(self.keys))
            if i == len(self.cur):
                self.info.append({})
                for numbers in (self.cur, self.most, self.life, self.since):
                    numbers.append(0)
        return i


class _Chart:
    """A timeline's events aggregated: top sites, columns and peak per device, scopes, marks."""

    def __init__(self, tl: Any, top: int, at: Any = None) -> None:
        names = getattr(tl, "_names", None) or {}
        named = {name: f"Variable {name!r}" for name in set(names.values())}  # a site each
        base, events = (
            [ev._replace(site=named[names[ev.buffer]])
             if ev.kind in (ALLOC, FREE) and ev.buffer in names else ev for ev in kept]
            for kept in tl._window()
        )  # fmt: skip
        self.window = base, events  # replayed: _scan, _fill, peak
        self.stacks: dict[Any, list[Any]] = getattr(tl, "_stacks", None) or {}
        self.n = n = len(events)
        # a snapshot (Timeline.from_snapshot): allocations only, all at its start and stop
        times = {tl.start_time, tl.stop_time, events[0].time, events[-1].time} if n else ()
        self.moment = len(times) == 1 and all(ev.kind == "alloc" for ev in events)
        self.fine = 1 if self.moment else max(1, min(n, FINE_COLUMNS))
        self.t0 = tl.start_time if tl.start_time is not None else (events[0].time if n else 0.0)
        self.end_time = (events[-1].time - self.t0) if n else 0.0
        sites = _Sites()
        self._scan(base, events, sites)
        slot = self._rank(sites, top)
        self._fill(base, events, sites, slot)
        self._place_marks(tl, base, events, at)

    def _scan(self, base: list[Any], events: list[Any], sites: _Sites) -> None:
        """Pass 1: each site's numbers, the devices, the scopes (``scopes``: start event, -1
        before the kept ones, end event, name, path, seconds)."""
        cur, most, life, since, info = sites.cur, sites.most, sites.life, sites.since, sites.info
        devices: set[str] = set()
        enters: dict[int, tuple[int, Any]] = {}
        self.scopes: list[tuple[int, int, str, str, float]] = []
        # per function whose XLA temporaries were recorded: its largest and its calls' scopes
        self.temp_most: dict[str, int] = {}
        self.temp_scopes: dict[str, collections.Counter[str]] = {}
        nb = len(base)
        for i, ev, sign in replay((), (*base, *events)):  # i from 0, the base's first
            if sign:
                s = sites.index(ev)
                for d, _ in ev.per_device or shares(ev):  # as in _fill
                    devices.add(d)
                if sign < 0:
                    if cur[s] - ev.bytes <= 0 < ev.bytes:
                        life[s] += i - since[s]
                    cur[s] -= ev.bytes
                    continue
                key = (ev.dtype, ev.shape, ev.scope)
                info[s][key] = info[s].get(key, 0) + 1
                since[s] = since[s] if cur[s] else i
                cur[s] += ev.bytes
                most[s] = max(most[s], cur[s])
            elif ev.kind == "scope_enter":
                enters[ev.buffer] = (i - nb, ev)
            elif ev.kind == "scope_exit":
                start, opened = enters.pop(ev.buffer, (-1, ev))
                self.scopes.append((start, i - nb, opened.name, opened.scope,
                                    ev.time - opened.time))  # fmt: skip
            elif ev.kind == TEMPORARIES and ev.bytes:  # none (0 B): no band
                self.temp_most[ev.name] = max(self.temp_most.get(ev.name, 0), ev.bytes)
                scopes = self.temp_scopes.setdefault(ev.name, collections.Counter())
                scopes[ev.scope or "(no scope)"] += 1
        end = nb + len(events)
        for s, v in enumerate(cur):  # holding bytes at the end
            if v > 0:
                life[s] += end - since[s]
        self.span = max(end, 1)
        for start, ev in enters.values():  # still open when the recording stopped
            end_time = events[-1].time if events else ev.time
            self.scopes.append((start, len(events), ev.name, ev.scope, end_time - ev.time))
        self.devices = sorted(devices)

    @functools.cached_property
    def peak(self) -> int:
        """The most bytes alive in the replay (the timeline's peak may be a dropped event's)."""
        return replay_peak(itertools.chain(*self.window))[0]

    def _rank(self, sites: _Sites, top: int) -> list[int]:
        """The ``top`` sites by largest live bytes, with hover text (``sites``), the rest one
        "other"; returns each site's slot, bottom up from the longest held (tenths of the run)."""
        site_list, most, info = [site for site, _ in sites.keys], sites.most, sites.info
        labels = [site_label(site, kind) for site, kind in sites.keys]
        ranked = sorted(range(len(site_list)), key=lambda s: (-most[s], labels[s]))
        lived = [int(10 * life / self.span) for life in sites.life]  # tenths of the run
        self.top = sorted(ranked[:top], key=lambda s: (-lived[s], -most[s], labels[s]))
        self.largest = [f"{labels[s]} ({fmt_bytes(most[s])})" for s in ranked[:top]]
        others = ranked[top:]
        slot = [len(self.top)] * len(site_list)  # "other" for all but the top sites
        for i, s in enumerate(self.top):
            slot[s] = i
        self.sites = [{**_describe(labels[s], [info[s]]), "stack": [str(f) for f in (
            self.stacks.get(site_list[s]) or [()])[0]]} for s in self.top]  # fmt: skip
        if others:
            other = _describe(f"other ({len(others)} sites)", [info[s] for s in others])
            self.sites.append({**other, "stack": [], "other": True})
            self.largest.append(other["label"])
        self.temp_slot = self._temp_bands()
        return slot

    def _temp_bands(self) -> dict[str, int]:
        """A series above the sites per function whose temporaries were recorded (the
        ``TEMP_BANDS`` largest, the rest one; ``temps`` marks it, ``allocs`` counts its calls,
        ``shapes`` names the functions of the shared one); returns each function's slot."""
        names = sorted(self.temp_most, key=lambda name: (-self.temp_most[name], name))
        first, rest = len(self.sites), names[TEMP_BANDS:]
        bands = [(f"XLA temporaries of {name}", [name]) for name in names[:TEMP_BANDS]]
        if rest:
            bands.append((f"XLA temporaries of {len(rest)} other function"
                          f"{'s' if len(rest) > 1 else ''}", rest))  # fmt: skip
        for label, group in bands:
            calls = collections.Counter({name: self.temp_scopes[name].total() for name in group})
            scopes = sum((self.temp_scopes[name] for name in group), collections.Counter[str]())
            self.sites.append({"label": label, "shapes": _top(calls) if group is rest else "",
                               "dtypes": "", "scopes": _top(scopes), "allocs": calls.total(),
                               "stack": [], "temps": True})  # fmt: skip
        return {name: first + min(i, TEMP_BANDS) for i, name in enumerate(names)}

    def _fill(self, base: list[Any], events: list[Any], sites: _Sites, slot: list[int]) -> None:
        """Pass 2: per device, each fine column's bytes per slot at the moment of its largest
        total, a call's temporaries counted (``cols``), each column's time (``times``), each
        device's peak of the arrays (``device_peak``, first reached after event ``peak_index``,
        -1: before the events, in ``peak_col``)."""
        c, n, nd = self.fine, self.n, len(self.devices)
        dindex = dict(zip(self.devices, range(nd), strict=True))
        vec, tot = [[0] * len(self.sites) for _ in range(nd)], [0] * nd
        self.cols: list[list[list[int]]] = [[] for _ in range(nd)]
        self.times = [(events[0].time if n else self.t0) - self.t0]
        best, best_vec, column = tot[:], [v[:] for v in vec], 0
        peak, peak_at = tot[:], [-1] * nd
        # each device's peak with the XLA temporaries of a call ("temporaries" events)
        self.call_peak, self.call_at = tot[:], [-1] * nd
        self.call_ev: list[Any] = [None] * nd
        # what the events dropped left alive first (``base``: allocations, at negative positions)
        for i, ev, sign in replay(base, events):
            if i > 0 and i * c // n != column:
                column = i * c // n
                for j in range(nd):
                    self.cols[j].append(best_vec[j])
                self.times.append(ev.time - self.t0)
                best, best_vec = tot[:], [v[:] for v in vec]
            if not sign:
                if ev.kind == TEMPORARIES and ev.bytes:
                    ts = self.temp_slot[ev.name]
                    for d, b in shares(ev):
                        k = dindex.get(d)
                        if k is None:
                            continue
                        if tot[k] + b > self.call_peak[k]:
                            self.call_peak[k], self.call_at[k] = tot[k] + b, i
                            self.call_ev[k] = ev
                        if tot[k] + b > best[k]:  # the arrays alive then, the temporaries above
                            best[k], best_vec[k] = tot[k] + b, vec[k][:]
                            best_vec[k][ts] += b
                continue
            s = slot[sites.index(ev)]
            for d, b in ev.per_device or shares(ev):  # shares(ev), called only when it differs
                j = dindex[d]
                v = vec[j]
                v[s] += sign * b
                t = tot[j] = tot[j] + sign * b
                if t > best[j]:
                    best[j], best_vec[j] = t, v[:]
                if t > peak[j]:  # not under the test above: a call's temporaries may raise best
                    peak[j], peak_at[j] = t, i
        for j in range(nd):
            self.cols[j].append(best_vec[j])
        self.device_peak, self.peak_index = peak, [max(i, -1) for i in peak_at]
        self.peak_col = [max(0, i) * c // max(n, 1) for i in peak_at]
        self.call_col = [max(0, i) * c // max(n, 1) for i in self.call_at]

    def _place_marks(self, tl: Any, base: list[Any], events: list[Any], at: Any) -> None:
        """The marks (``tl._marks``, and ``at``) in time order, each with how many events came at
        or before it; what was alive at each device's peak (``live``), or at ``at``."""
        marks = list(getattr(tl, "_marks", None) or ())
        if at is not None and at not in marks:
            marks.append(at)
        marks.sort(key=lambda m: m.time)
        times = [ev.time for ev in events]
        self.marks = [] if self.moment else [(bisect.bisect_right(times, m.time), m) for m in marks]
        self.at = None if self.moment else at
        self.peak_times = [events[i].time if i >= 0 else self.t0 for i in self.peak_index]
        # where a call's temporaries make the device's peak, what was alive then, and them
        self.temps = [ev if ev is not None and self.call_peak[j] > self.device_peak[j] else None
                      for j, ev in enumerate(self.call_ev)]  # fmt: skip
        if self.at is None:
            moments = [
                self.call_at[j] if ev is not None else i
                for j, (i, ev) in enumerate(zip(self.peak_index, self.temps, strict=True))
            ]
            self.live = alive_after(base, events, moments)  # fmt: skip
        else:
            before = bisect.bisect_right(times, at.time) - 1
            self.live = alive_after(base, events, [before]) * len(self.devices)

    def tallest(self, j: int) -> tuple[int, int, str]:
        """Device ``j``'s tallest column: its bytes, fine column and label, ``"peak …"``, or
        ``"device peak …"`` where a call's temporaries make it."""
        if self.temps[j] is None:
            return self.device_peak[j], self.peak_col[j], f"peak {fmt_bytes(self.device_peak[j])}"
        return self.call_peak[j], self.call_col[j], f"device peak {fmt_bytes(self.call_peak[j])}"

    def fpos(self, event: float) -> float:
        """An event position as a fine-column position."""
        return event * self.fine / max(self.n, 1)


def alive_after(base: list[Any], events: list[Any], indexes: list[int]) -> list[list[Any]]:
    """For each of ``indexes``, what was alive after ``events[index]`` (-1: before), one replay."""
    live = {ev.buffer: ev for ev in base}
    found, done, replayed = {-1: list(live.values())}, -1, replay((), events)
    for index in sorted({i for i in indexes if 0 <= i < len(events)}):
        for _, ev, sign in itertools.islice(replayed, index - done):  # up to events[index]
            if sign > 0:
                live[ev.buffer] = ev
            elif sign:
                live.pop(ev.buffer, None)
        found[index], done = list(live.values()), index
    return [found[i] for i in indexes]


def _describe(label: str, infos: list[dict[Any, int]]) -> dict[str, Any]:
    """What the hover says of a site (or of "other"): its shapes, dtypes and scopes."""
    shapes, scopes = collections.Counter[str](), collections.Counter[str]()
    dtypes: dict[str, None] = {}
    for counts in infos:
        for (dtype, shape, scope), k in counts.items():
            shapes[f"{dtype}{list(shape)}".replace(" ", "")] += k
            dtypes[dtype] = None
            scopes[scope or "(no scope)"] += k
    return {"label": label, "shapes": _top(shapes), "dtypes": ", ".join(dtypes),
            "scopes": _top(scopes), "allocs": sum(scopes.values())}  # fmt: skip


def _runs(ch: _Chart) -> list[list[Any]]:
    """The scopes as bands (start, end in fine columns, name, path, seconds, how many) by start:
    a row of one path and name within a fine column is one band (the script cannot zoom further),
    except a path's first (by its time the script tells a first step that took its compile)."""
    spans = sorted(
        ((ch.fpos(max(s, 0)), ch.fpos(max(e, s + 1)), name, path, dt)
         for s, e, name, path, dt in ch.scopes),
        key=lambda b: (b[0], -b[1]),
    )  # fmt: skip
    runs: list[list[Any]] = []
    open_run: dict[str, list[Any] | None] = {}
    for a, b, name, path, dt in spans:
        run = open_run.get(path)
        if run is not None and run[2] == name and run[1] <= a + 1e-9 and b - run[0] < 1.0:
            run[1], run[4], run[5] = b, run[4] + dt, run[5] + 1
            continue
        run = [a, b, name, path, dt, 1]
        runs.append(run)
        open_run[path] = run if path in open_run else None
    return runs


# -- the page ---------------------------------------------------------------------------------


def _mark_text(mark: Any) -> str:
    """A mark's label with its bytes, as the chart and the table say it."""
    return mark.label + ("" if mark.bytes is None else f" ({fmt_bytes(mark.bytes)})")


def _line(cls: str, x: float, label: str, y: float, right: bool, extra: str = "") -> str:
    """A vertical line over the image's plot, labelled at height ``y`` (to its left: ``right``)."""
    return (
        f'<g class="{cls}"><line x1="{x:.1f}" x2="{x:.1f}" y1="{_Y0}" y2="{_Y0 + _PH}"/><text '
        f'x="{x + (-5 if right else 5):.1f}" y="{y}" text-anchor="{"end" if right else "start"}">'
        f"{esc(label)}</text>{extra}</g>"
    )


def _image(ch: _Chart, j: int) -> str:
    """Device ``j``'s live bytes as an image that sanitizers keep (a standalone SVG with its
    own style sheet and background, in an ``<img>`` sized by inline styles): one area (the
    largest total of each column; the tallest column at least 12 wide), the XLA temporaries
    over it where a call's make a column's total, the peak and the marks."""
    totals = [sum(v) for v in ch.cols[j]]
    slots = sorted(set(ch.temp_slot.values()))
    temps = [sum(v[s] for s in slots) for v in ch.cols[j]]
    f, c, bottom, vmax = len(totals), min(len(totals), _COLUMNS), _Y0 + _PH, max(totals) or 1
    starts, wide = [g * f // c for g in range(c + 1)], 0 if ch.moment else max(0, 12 - _PW / c)
    gp = bisect.bisect_right(starts, ch.tallest(j)[1]) - 1

    def x(u: float) -> float:  # a column position
        return _X0 + u * (_PW - wide) / c + wide * min(max(u - gp, 0), 1)

    d, last, band = [f"M{_X0} {bottom}"], "", []
    for g in range(c):
        most = max(range(starts[g], starts[g + 1]), key=totals.__getitem__)
        y = f"{bottom - (totals[most] - temps[most]) * _PH / vmax:.1f}"
        if y != last:
            d.append(f"H{x(g):.1f}V{y}" if g else f"V{y}")
            last = y
        if temps[most]:
            band.append(f"M{x(g):.1f} {bottom - totals[most] * _PH / vmax:.1f}H{x(g + 1):.1f}"
                        f"V{y}H{x(g):.1f}Z")  # fmt: skip
    parts = [f'<rect class="tj-bg" width="{_W}" height="{_H}" rx="6"/><path class="tj-area" '
             f'd="{"".join(d)}H{_X0 + _PW}V{bottom}Z"/><line class="tj-axis" x1="{_X0}" '
             f'x2="{_X0 + _PW}" y1="{bottom}" y2="{bottom}"/>']  # fmt: skip
    if band:
        parts.append(f'<path class="tj-temp" d="{"".join(band)}"/>')
    if not ch.moment:
        px = x(gp + 0.5)
        parts.append(_line("tj-peak", px, ch.tallest(j)[2], _Y0 - 10, px > _X0 + _PW * 0.7))
    for i, (k, mark) in enumerate(ch.marks):
        px, text = x(ch.fpos(k) * c / f), _mark_text(mark)
        short = text if len(text) <= 40 else text[:39] + "…"  # all of it in its title
        parts.append(_line(f'tj-mark" data-label="{esc(mark.label)}', px, short,
                           _Y0 + 14 + 16 * (i % 3), px > _X0 + _PW * 0.6,
                           f"<title>{esc(text)}</title>"))  # fmt: skip
    svg = (
        f'<svg viewBox="0 0 {_W} {_H}" width="{_W}" height="{_H}" role="img" xmlns='
        f'"http://www.w3.org/2000/svg"><style>{_asset("timeline-svg.css")}</style>'
        f"{''.join(parts)}</svg>"
    )
    alt = f"live bytes over time on {ch.devices[j]}, {ch.tallest(j)[2]}"
    if (temps_ev := ch.temps[j]) is not None:
        alt += f" with the XLA temporaries of {temps_ev.name}"
    return (
        f'<img class="tj-static" alt="{esc(alt)}" src="data:image/svg+xml;base64,'
        f'{base64.b64encode(svg.encode("utf-8")).decode("ascii")}" '
        f'style="display:block;width:100%;max-width:{_W}px;height:auto">'
    )


def _num(x: object) -> str:
    return f'<td class="tj-num"{_RIGHT}>{esc(x)}</td>'


def _peak_table(ch: _Chart, j: int) -> str:
    """What was alive at device ``j``'s peak (or at the mark ``ch.at``) by site, shape, scope and
    device, largest first; with several devices, in bytes on ``j`` (each buffer's shard or copy)."""
    device, several = ch.devices[j], len(ch.devices) > 1
    groups: dict[tuple[str, str, str, str], list[int]] = {}
    for ev in ch.live[j]:
        nbytes = dict(shares(ev)).get(device, 0)
        if several and not nbytes:
            continue
        kind = _KINDS.get(ev.scope)  # a plain jax.Array: no scope frees it
        key = (site_label(ev.site, kind or "tensor"),
               describe(ev), kind or ev.scope or "(no scope)",
               device if several else ev.device)  # fmt: skip
        g = groups.setdefault(key, [0, 0])
        g[0], g[1] = g[0] + (nbytes if several else ev.bytes), g[1] + 1
    temps = ch.temps[j] if ch.at is None else None
    if temps is not None:  # the device peak falls in a call: its temporaries are alive too
        b = dict(shares(temps)).get(device, 0)
        key = (f"XLA temporaries of {temps.name}", "(while the call ran)",
               temps.scope or "(no scope)", device if several else temps.device)  # fmt: skip
        groups[key] = [b, 1]
    rows = sorted(groups.items(), key=lambda kv: (-kv[1][0], kv[0]))
    body = "".join(
        f"<tr>{_num(fmt_bytes(b))}{_num(n)}<td{_LEFT}>{esc(shape)}</td>"
        f'<td class="tj-site"{_LEFT}>{esc(site)}</td><td{_LEFT}>{esc(scope)}</td>'
        f"<td{_LEFT}>{esc(dev)}</td></tr>"
        for (site, shape, scope, dev), (b, n) in rows[:TABLE_ROWS]
    )
    if rest := [g for _, g in rows[TABLE_ROWS:]]:
        body += (f"<tr>{_num(fmt_bytes(sum(g[0] for g in rest)))}{_num(sum(g[1] for g in rest))}"
                 f'<td colspan="4"{_LEFT}>… {len(rest)} more groups</td></tr>')  # fmt: skip
    caption, attr = _caption(ch, j, list(groups.values()))
    attr += f' data-device="{j}"' if several else ""
    return (
        f'<table class="tj-peak-table"{attr}>'
        f'<caption>{caption}</caption><thead><tr><th class="tj-num"{_RIGHT}>'
        f'{"bytes on device" if several else "bytes"}</th><th class="tj-num"{_RIGHT}>buffers'
        f"</th><th{_LEFT}>shape</th><th{_LEFT}>created at</th><th{_LEFT}>scope</th><th{_LEFT}>"
        f"device</th></tr></thead><tbody>{body or _NOTHING}</tbody></table>"
    )


def _caption(ch: _Chart, j: int, groups: list[list[int]]) -> tuple[str, str]:
    """The table's caption (HTML) and attributes; ``groups``: [bytes, buffers] of each row."""
    device, at = ch.devices[j], ch.at
    if ch.moment:
        return "Alive in the snapshot, largest first", ""
    temps = ch.temps[j] if at is None else None
    if temps is not None:
        where = f" on {device}" if len(ch.devices) > 1 else ""
        return esc(
            f"Alive at the device peak{where} ({fmt_bytes(ch.call_peak[j])}: the arrays and the "
            f"XLA temporaries of {temps.name}, while it ran; the array peak "
            f"{fmt_bytes(ch.device_peak[j])}), largest first"
        ), ""
    if at is None and len(ch.devices) > 1:
        most = fmt_bytes(ch.device_peak[j])
        return esc(f"Alive at {device}'s peak ({most}), largest first, in bytes on {device}"), ""
    if at is None:
        return "Alive at the peak, largest first", ""
    total, buffers = sum(g[0] for g in groups), sum(g[1] for g in groups)
    caption = (
        f"Alive at \u201c{_mark_text(at)}\u201d ({elapsed(max(0.0, at.time - ch.t0))})"
        f"{f' on {device}' if len(ch.devices) > 1 else ''}: {fmt_bytes(total)} in "
        f"{buffers:,} buffer{'' if buffers == 1 else 's'}, largest first"
    )
    peak, when = ch.device_peak[j], ch.peak_times[j]
    if peak > total:
        caption += (f" (the peak, {fmt_bytes(peak)} at {elapsed(max(0.0, when - ch.t0))}, came "
                    f"{'later' if when > at.time else 'earlier'})")  # fmt: skip
    req = "" if at.bytes is None else str(at.bytes)
    return esc(caption), f' data-at="{at.time!r}" data-mark-bytes="{req}" data-alive="{total}"'


@functools.cache
def _asset(name: str) -> str:
    """A file of ``tidyjax/_static``, read once: inlined in each page, which opens offline."""
    return (resources.files("tidyjax") / "_static" / name).read_text(encoding="utf-8")


def _payload(ch: _Chart) -> str:
    """What the page's script draws from, as JSON deflated in base64 in JSON (the browser's own
    ``DecompressionStream`` inflates it): per device the fine columns (each slot's change from
    the column before), their times (µs, as changes), the sites, the scopes (``bands``: start,
    end, name, path, ms, how many), the marks (position, label, bytes); names index ``strings``."""
    k, strings = len(ch.sites), dict[str, int]()
    us = [round(t * 1e6) for t in ch.times]
    bands = [x for a, b, name, path, dt, n in _runs(ch) for x in (round(a, 2), round(b, 2),
             strings.setdefault(name, len(strings)), strings.setdefault(path, len(strings)),
             round(dt * 1e3, 3), n)]  # fmt: skip
    marks = [x for pos, m in ch.marks for x in (round(ch.fpos(pos), 2),
             strings.setdefault(m.label, len(strings)), m.bytes)]  # fmt: skip
    devices = [
        {"name": d, "peak": ch.tallest(j)[0], "peakCol": ch.tallest(j)[1],
         "label": f"{d} · {ch.tallest(j)[2]}",
         "cols": [x - p for prev, col in zip([[0] * k, *cols], cols, strict=False)
                  for p, x in zip(prev, col, strict=True)]}
        for j, (d, cols) in enumerate(zip(ch.devices, ch.cols, strict=True))
    ]  # fmt: skip
    for j, device in enumerate(devices):
        if ch.temps[j] is not None:  # the chart's peak line names it (else "peak …")
            device["peakText"] = ch.tallest(j)[2]
    data = {"events": ch.n, "fine": ch.fine, "moment": ch.moment, "sites": ch.sites,
            "times": [b - a for a, b in zip([0, *us], us, strict=False)], "devices": devices,
            "selected": max(range(len(devices)), key=lambda j: (devices[j]["peak"], -j)),
            "bands": bands, "marks": marks, "strings": list(strings)}  # fmt: skip
    raw = json.dumps(data, separators=(",", ":")).encode("utf-8")
    packed = base64.b64encode(zlib.compress(raw, 6)).decode("ascii")
    return json.dumps({"format": "tidyjax.timeline.page", "deflated": packed})  # no "</"


def _subtitle(tl: Any, ch: _Chart) -> str:
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(tl.started_at or 0))
    when = f" · started {started}" if tl.started_at else ""
    lo, hi = min(ch.device_peak, default=0), max(ch.device_peak, default=0)
    peak = fmt_bytes(tl.peak_bytes or ch.peak)
    sub = [f"{ch.n:,} events over {elapsed(ch.end_time)[1:]}",
           f"peak {peak} at {elapsed(max(0.0, tl.peak_time - ch.t0))}"]  # fmt: skip
    if ch.moment:
        sub = [f"a snapshot: {ch.n:,} buffer{'' if ch.n == 1 else 's'} at one moment",
               f"{fmt_bytes(ch.peak)} in all"]  # fmt: skip
    elif len(ch.devices) > 1:
        each = fmt_bytes(hi) if lo == hi else f"{fmt_bytes(lo)}\u2013{fmt_bytes(hi)}"
        sub[1] = f"peak per device {each} ({peak} over {len(ch.devices)} devices together)"
    call = getattr(tl, "device_peak_call", None)
    if call is not None and not ch.moment:  # beside the array peak
        at = elapsed(max(0.0, tl.device_peak_time - ch.t0))
        sub[1] = (f"device peak {fmt_bytes(tl.device_peak_bytes)} at {at} with the XLA "
                  f"temporaries of {call} · array {sub[1]}")  # fmt: skip
    unseen = getattr(tl, "unseen", None)  # plain arrays not sampled: never a bare peak
    if unseen and not ch.moment:
        sub[1] += f" ({unseen})"
    if tl.dropped:
        sub.append(f"{tl.dropped:,} older events dropped (max_events): the page starts after them")
    return f'<p class="tj-sub">{esc(" · ".join(sub))}{esc(when)}.</p>'


def fragment(tl: Any, *, top: int = 10, at: Any = None) -> str:
    """The page's ``<div>``, its style and script (for notebooks); ``at``: a mark
    (``_timeline_format.Mark``) at whose moment the table shows what was alive."""
    ch = _Chart(tl, top, at)
    head = f"<style>{_asset('timeline.css')}</style><h2>tidyjax timeline</h2>{_subtitle(tl, ch)}"
    if not ch.devices:
        return f'<div class="tjtl">{head}<p>No tidyjax memory events were recorded.</p></div>'
    several = len(ch.devices) > 1
    charts = "".join(
        f'<section class="tj-chart" data-device="{j}">'
        + (f'<div class="tj-dev">{esc(d)} · {esc(ch.tallest(j)[2])}</div>' if several else "")
        + f"{_image(ch, j)}</section>"
        for j, d in enumerate(ch.devices)
    )  # fmt: skip
    tables = "".join(_peak_table(ch, j) for j in range(len(ch.devices) if several else 1))
    largest = f'<p class="tj-sites">By site, largest first: {esc(" · ".join(ch.largest))}</p>'
    return (
        f'<div class="tjtl">{head}{charts}{largest}{tables}<script type="application/json" '
        f'class="tj-data">{_payload(ch)}</script>'
        f"<script>{_asset('timeline.js')}</script></div>"
    )


def page(tl: Any, *, top: int = 10, at: Any = None) -> str:
    """The whole page: `fragment` in a document that opens from disk, offline."""
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><meta name="color-scheme" '
        'content="light dark"><meta name="viewport" content="width=device-width, initial-scale=1">'
        "<title>tidyjax timeline</title><style>body{margin:0;padding:16px;background:Canvas;"
        f"color:CanvasText}}</style></head><body>{fragment(tl, top=top, at=at)}</body></html>"
    )
