"""Light HTML for Jupyter's rich display: plain tables and bars, one small style sheet, no script.

Each tidyjax object's ``_repr_html_`` calls one function here. None of them may raise: a
display that fails must still show something.

Colours follow the host. Inside JupyterLab its CSS variables (``--jp-content-font-color1``,
``--jp-layout-color2``, ...) decide; a host's dark- or light-theme marker (VS Code's body class,
PyData Sphinx's ``data-theme``, JupyterLab's ``data-jp-theme-light``) sets matching colours, as
xarray does; anywhere else the text takes the host's own colour (``currentColor``) on the host's
own background, so it reads on a white page under a dark OS as on a dark page. Tracks and
rules are translucent greys, dim and red text are mixed from the text colour, so they keep
their contrast in any theme. Numbers are right-aligned tabular figures that never wrap, text
left-aligned, by selectors that outrank JupyterLab's right-aligned table cells.

Byte counts and counted nouns are formatted by ``_format``.
"""

from __future__ import annotations

import functools
import html
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any

import numpy as np

from ._format import esc

_DARK = (
    "--tjx-fg:var(--jp-content-font-color1,#e8e8e8);"
    "--tjx-track:var(--jp-layout-color2,#424242);"
    "--tjx-line:var(--jp-border-color2,#4a4a4a);"
    "--tjx-fill:var(--jp-brand-color1,#64b5f6);"
    "--tjx-red:var(--jp-error-color1,#ef5350)"
)
_LIGHT = (
    "--tjx-fg:var(--jp-content-font-color1,#1a1a1a);"
    "--tjx-track:var(--jp-layout-color2,#e6e6e6);"
    "--tjx-line:var(--jp-border-color2,#d4d4d4);"
    "--tjx-fill:var(--jp-brand-color1,#1976d2);"
    "--tjx-red:var(--jp-error-color1,#d32f2f)"
)
# No host marker: the host's text colour on the host's background, greys that suit either.
_ANY = (
    "--tjx-fg:var(--jp-content-font-color1,currentColor);"
    "--tjx-track:var(--jp-layout-color2,rgba(128,128,128,.18));"
    "--tjx-line:var(--jp-border-color2,rgba(128,128,128,.4));"
    "--tjx-fill:var(--jp-brand-color1,#1976d2);"
    "--tjx-red:var(--jp-error-color1,#e5484d)"
)
_DARK_HOSTS = (
    "body.vscode-dark .tjx,html[data-theme=dark] .tjx,body[data-theme=dark] .tjx,"
    "body[data-jp-theme-light=false] .tjx"
)
_LIGHT_HOSTS = (
    "body.vscode-light .tjx,html[data-theme=light] .tjx,body[data-theme=light] .tjx,"
    "body[data-jp-theme-light=true] .tjx"
)
# Table cells: ``.tjx.tjx.tjx`` (0,3,1) outranks JupyterLab's right-aligning
# ``:not(.jp-RenderedMarkdown).jp-RenderedHTMLCommon td`` (0,2,1) wherever the sheets come.
_T = ".tjx.tjx.tjx"
# Inside JupyterLab the --jp-* variables decide; the fallbacks serve other hosts. Dim and red
# text mix the text colour in (a browser without color-mix() shows the plain text colour).
STYLE = (
    "<style>"
    f".tjx{{{_ANY};color:var(--tjx-fg);font-family:var(--jp-code-font-family,monospace);"
    "font-size:12px;line-height:1.4}"
    f"{_DARK_HOSTS}{{{_DARK}}}{_LIGHT_HOSTS}{{{_LIGHT}}}"
    f"{_T} table{{border-collapse:collapse;table-layout:auto;margin:2px 0;color:inherit;"
    "background:transparent;font-size:inherit}"
    f"{_T} th,{_T} td{{padding:1px 8px;border:0;border-bottom:1px solid var(--tjx-line);"
    "text-align:left;vertical-align:top;color:inherit;line-height:inherit;white-space:normal}"
    f"{_T} th{{font-weight:bold}}"
    f"{_T} .n{{text-align:right;white-space:nowrap;font-variant-numeric:tabular-nums}}"
    ".tjx .d{color:var(--tjx-fg);color:color-mix(in srgb,var(--tjx-fg) 72%,transparent)}"
    ".tjx .r{font-weight:bold;color:var(--tjx-fg);"
    "color:color-mix(in srgb,var(--tjx-red) 62%,var(--tjx-fg))}"
    ".tjx .bar{display:inline-block;height:10px;background:var(--tjx-track)!important;"
    "vertical-align:middle}"
    ".tjx .bar>div{height:10px;background:var(--tjx-fill)!important}"
    ".tjx pre{margin:2px 0;padding:0;background:transparent;color:inherit;"
    "font-size:inherit;line-height:inherit}"
    ".tjx summary{cursor:pointer}"
    "</style>"
)


# A bar's colours without the style sheet: a light grey track and a dark blue fill, 4:1 apart,
# which read on light and dark backgrounds alike.
_TRACK_PLAIN = "#d6d6d6"
_FILL_PLAIN = "#1565c0"


def never_raises(fn: Callable[..., str]) -> Callable[..., str]:
    """Fall back to the escaped plain repr when building the HTML fails."""

    @functools.wraps(fn)
    def safe(obj: Any) -> str:
        try:
            return fn(obj)
        except Exception:
            try:
                text = repr(obj)
            except Exception:
                text = f"<{type(obj).__name__}>"
            return f"<pre>{html.escape(text)}</pre>"

    return safe


# -- pieces ------------------------------------------------------------------------------------


def table(
    header: Sequence[str], rows: Iterable[Sequence[object]], numeric: Collection[int] = ()
) -> str:
    """A table of already-escaped cells; the columns in ``numeric`` are right-aligned numbers."""
    # Inline alignment too: an untrusted notebook's sanitizer drops the style sheet and keeps
    # inline styles, and JupyterLab's own rule would right-align every cell.
    cls = [
        ' class="n" style="text-align:right"' if i in numeric else ' style="text-align:left"'
        for i in range(len(header))
    ]
    head = "".join(f"<th{c}>{esc(h)}</th>" for c, h in zip(cls, header, strict=True))
    body = "".join(
        "<tr>" + "".join(f"<td{c}>{v}</td>" for c, v in zip(cls, row, strict=False)) + "</tr>"
        for row in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def bar(fraction: float, width: int = 120) -> str:
    """A horizontal bar ``fraction`` full; callers scale every bar of one column alike."""
    px = max(0, min(width, round(fraction * width)))
    # Inline height and plain colours: they survive an untrusted notebook's sanitizer (which
    # drops the style sheet and refuses var()); the sheet's themed colours win where it applies.
    return (
        f'<div class="bar" style="display:inline-block;vertical-align:middle;width:{width}px;'
        f'height:10px;background:{_TRACK_PLAIN}"><div style="width:{px}px;height:10px;'
        f'background:{_FILL_PLAIN}"></div></div>'
    )


def box(*parts: str) -> str:
    """The outer element of every display, with the style sheet."""
    return STYLE + '<div class="tjx">' + "".join(parts) + "</div>"


def line(*parts: str) -> str:
    return "<div>" + "".join(parts) + "</div>"


def dim(text: object) -> str:
    return f'<span class="d">{esc(text)}</span>'


def bad(text: object) -> str:
    return f'<span class="r">{esc(text)}</span>'


def details(summary: str, body: str) -> str:
    """A folded section: ``summary`` (escaped HTML) shows, ``body`` opens on a click."""
    return f"<details><summary>{summary}</summary>{body}</details>"


def values_preview(arr: Any) -> str:
    """A few of an array's values (NumPy's summarised print), escaped."""
    text = np.array2string(np.asarray(arr), threshold=24, edgeitems=3, precision=4)
    return f"<pre>{esc(text)}</pre>"
