"""The shared text formats: every display and message says ``16.0 MiB``, ``1 tensor`` and
``float32[2,3]`` alike. Imports nothing of tidyjax (the bottom floor)."""

from __future__ import annotations

import html
from typing import Any


def fmt_bytes(n: float) -> str:
    """``512 B``, ``1.5 KiB``, ``16.0 MiB``: the one byte format of every display and message."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"  # pragma: no cover


def signed_bytes(n: float) -> str:
    """``+12 B``, ``-1.0 KiB``, ``0 B``: a change in bytes."""
    if n == 0:
        return "0 B"
    return ("+" if n > 0 else "-") + fmt_bytes(abs(n))


def count(n: int, noun: str, plural: str | None = None) -> str:
    """``1 tensor``, ``2 tensors``, ``0 tensors``."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


def esc(x: object) -> str:
    """``x``'s text, HTML-escaped."""
    return html.escape(str(x))


def describe(arr: Any) -> str:
    """``float32[2,3]``: dtype and shape, readable on deleted arrays too."""
    try:
        return f"{arr.dtype}{list(arr.shape)}".replace(" ", "")
    except Exception:
        return type(arr).__name__


def clip(x: object, limit: int = 60) -> str:
    """``repr(x)`` for a message, at most about ``limit`` characters: cut after a whole word (a
    Tensor's repr, ``<Tensor float32[3] id=4: disposed, it was disposed explicitly>``, is never
    cut), with ``…`` where something was left out."""
    text = repr(x)
    if len(text) <= limit or (text.startswith(("<Tensor", "<Variable"))):
        return text
    cut = text[:limit]
    space = max(cut.rfind(" "), cut.rfind(","))
    if space > limit // 2:
        cut = cut[:space]
    return cut.rstrip(" ,") + "…"
