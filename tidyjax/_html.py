"""Light HTML for Jupyter's rich display: plain tables and bars, inline styles, no JavaScript.

Each tidyjax object's ``_repr_html_`` calls one function here. None of them may raise: a
display that fails must still show something.
"""

from __future__ import annotations

import functools
import html
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

_BOX = "font-family:monospace;font-size:12px;line-height:1.4"
_TABLE = "border-collapse:collapse;font-family:monospace;font-size:12px"
_CELL = "padding:1px 8px;border-bottom:1px solid #ddd;text-align:left"
_DIM = "color:#777"
_BAD = "color:#b00020"


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


def esc(x: object) -> str:
    return html.escape(str(x))


def table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    head = "".join(f'<th style="{_CELL}">{esc(h)}</th>' for h in header)
    body = "".join(
        "<tr>" + "".join(f'<td style="{_CELL}">{c}</td>' for c in row) + "</tr>" for row in rows
    )
    return f'<table style="{_TABLE}"><tr>{head}</tr>{body}</table>'


def bar(fraction: float, width: int = 160) -> str:
    px = max(0, min(width, round(fraction * width)))
    return (
        f'<div style="width:{width}px;height:10px;background:#eee;display:inline-block">'
        f'<div style="width:{px}px;height:10px;background:#4a7fd6"></div></div>'
    )


def box(*parts: str) -> str:
    return f'<div style="{_BOX}">' + "".join(parts) + "</div>"


def dim(text: object) -> str:
    return f'<span style="{_DIM}">{esc(text)}</span>'


def bad(text: object) -> str:
    return f'<span style="{_BAD}">{esc(text)}</span>'


def values_preview(arr: Any) -> str:
    """A few of an array's values (NumPy's summarised print), escaped."""
    text = np.array2string(np.asarray(arr), threshold=24, edgeitems=3, precision=4)
    return f'<pre style="margin:2px 0">{esc(text)}</pre>'
